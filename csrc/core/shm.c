/* fastload core: shared slots (see shm.h).
 *
 * The registry is a small array searched linearly: a worker has a few
 * slots per batch in flight, and it is consulted once per batch array.  It
 * is process-wide state guarded by one mutex, never held across a system
 * call that can block.
 */
#define _GNU_SOURCE
#include "shm.h"

#include <pthread.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "status.h"

typedef struct shm_entry {
    void *data;
    fl_shm_info info;
} shm_entry;

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static shm_entry *entries;       /* live slots; guarded by registry_lock */
static size_t entry_count, entry_capacity;
static uint64_t *freed;          /* ids freed and not yet taken; same lock */
static size_t freed_count, freed_capacity;
static uint64_t next_id = 1;

/* Appends to a growable array; returns 0, or -1 when out of memory. */
static int grow(void **array, size_t *capacity, size_t count, size_t item)
{
    if (count < *capacity)
        return 0;
    size_t wanted = *capacity ? 2 * *capacity : 16;
    void *bigger = realloc(*array, wanted * item);
    if (!bigger)
        return -1;
    *array = bigger;
    *capacity = wanted;
    return 0;
}

static void *shm_alloc(size_t bytes, void *ctx)
{
    (void)ctx;
    if (bytes == 0)
        bytes = (size_t)sysconf(_SC_PAGESIZE);
    int fd = memfd_create("fastload-slot", MFD_CLOEXEC);
    if (fd < 0)
        return NULL;
    void *data = MAP_FAILED;
    if (ftruncate(fd, (off_t)bytes) == 0)
        data = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (data == MAP_FAILED) {
        close(fd);
        return NULL;
    }
    pthread_mutex_lock(&registry_lock);
    int ok = grow((void **)&entries, &entry_capacity, entry_count, sizeof *entries) == 0;
    if (ok)
        entries[entry_count++] = (shm_entry){data, {fd, bytes, next_id++}};
    pthread_mutex_unlock(&registry_lock);
    if (!ok) {
        munmap(data, bytes);
        close(fd);
        return NULL;
    }
    return data;
}

static void shm_free(void *data, size_t bytes, void *ctx)
{
    (void)ctx;
    int fd = -1;
    pthread_mutex_lock(&registry_lock);
    for (size_t i = 0; i < entry_count; i++) {
        if (entries[i].data != data)
            continue;
        fd = entries[i].info.fd;
        /* A failed append only costs the parent a stale mapping until it
         * exits; the slot itself is freed either way. */
        if (grow((void **)&freed, &freed_capacity, freed_count, sizeof *freed) == 0)
            freed[freed_count++] = entries[i].info.id;
        entries[i] = entries[--entry_count];
        break;
    }
    pthread_mutex_unlock(&registry_lock);
    munmap(data, bytes);
    if (fd >= 0)
        close(fd);
}

fl_slot_allocator fl_shm_allocator(void)
{
    return (fl_slot_allocator){.alloc = shm_alloc, .free = shm_free};
}

int fl_shm_lookup(const void *data, fl_shm_info *out)
{
    int status = FL_ERR_INVALID;
    pthread_mutex_lock(&registry_lock);
    for (size_t i = 0; i < entry_count; i++) {
        if (entries[i].data == data) {
            *out = entries[i].info;
            status = FL_OK;
            break;
        }
    }
    pthread_mutex_unlock(&registry_lock);
    return status;
}

size_t fl_shm_take_freed(uint64_t *ids, size_t max)
{
    pthread_mutex_lock(&registry_lock);
    size_t n = freed_count < max ? freed_count : max;
    for (size_t i = 0; i < n; i++)
        ids[i] = freed[freed_count - n + i];
    freed_count -= n;
    pthread_mutex_unlock(&registry_lock);
    return n;
}
