/* A stand-in for the NVTX library (libnvToolsExt), for tests: counts the
 * ranges pushed by name, checks that every thread pops only what it pushed,
 * and remembers thread names. */
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#define MAX_NAMES 32

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static char names[MAX_NAMES][64];
static long counts[MAX_NAMES];
static long unbalanced;
static long open_ranges; /* pushed, not yet popped, over all threads */
static char thread_names[MAX_NAMES][64];
static int n_threads;
static _Thread_local int depth;

int nvtxRangePushA(const char *message)
{
    pthread_mutex_lock(&lock);
    int i = 0;
    while (i < MAX_NAMES && names[i][0] && strcmp(names[i], message) != 0)
        i++;
    if (i < MAX_NAMES) {
        if (!names[i][0])
            strncpy(names[i], message, sizeof names[i] - 1);
        counts[i]++;
    }
    open_ranges++;
    pthread_mutex_unlock(&lock);
    return depth++;
}

int nvtxRangePop(void)
{
    if (depth == 0) {
        pthread_mutex_lock(&lock);
        unbalanced++;
        pthread_mutex_unlock(&lock);
        return -1;
    }
    pthread_mutex_lock(&lock);
    open_ranges--;
    pthread_mutex_unlock(&lock);
    return --depth;
}

void nvtxNameOsThreadA(uint32_t thread_id, const char *name)
{
    (void)thread_id;
    pthread_mutex_lock(&lock);
    if (n_threads < MAX_NAMES)
        strncpy(thread_names[n_threads++], name, sizeof thread_names[0] - 1);
    pthread_mutex_unlock(&lock);
}

/* ---------------------------------------------------------- test queries */

long fake_nvtx_count(const char *name)
{
    long n = 0;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAX_NAMES; i++)
        if (strcmp(names[i], name) == 0)
            n = counts[i];
    pthread_mutex_unlock(&lock);
    return n;
}

long fake_nvtx_unbalanced(void)
{
    pthread_mutex_lock(&lock);
    long n = unbalanced + open_ranges;
    pthread_mutex_unlock(&lock);
    return n;
}

int fake_nvtx_thread_named(const char *name)
{
    int found = 0;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < n_threads; i++)
        found |= strcmp(thread_names[i], name) == 0;
    pthread_mutex_unlock(&lock);
    return found;
}
