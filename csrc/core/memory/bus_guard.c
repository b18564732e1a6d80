/* fastload core: the bus-error guard (see bus_guard.h).
 *
 * Each guarded region publishes where to jump back to (bus_guard, a
 * thread-local); the handler, finding the faulting thread guarded, records
 * the fault address and jumps there instead of returning to the faulting
 * read.  The jump leaves only the guarded function, which by contract holds
 * nothing.
 *
 * The handler looks at its thread-locals only while some thread is guarded,
 * and they are initial-exec (see below), so that reading them never
 * allocates.
 */
#define _GNU_SOURCE
#include "core/memory/bus_guard.h"

#include "core/status.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static pthread_once_t bus_handler_once = PTHREAD_ONCE_INIT;
static int bus_handler_installed;             /* written once, under bus_handler_once */
static struct sigaction previous_bus_action;  /* likewise; read by the handler */
static atomic_int guarded_threads;            /* guarded regions entered, all threads */
/* The handler reads these thread-locals, possibly on a thread that never
 * armed a guard.  With the default (global-dynamic) model in a dlopen'd
 * module, a thread's first access goes through __tls_get_addr, which may
 * allocate that thread's block for the module: malloc in a signal handler.
 * initial-exec puts them in the static TLS block instead, reached by a
 * fixed offset from the thread pointer, with nothing allocated on access.
 * For a module loaded by dlopen, glibc places initial-exec variables in the
 * static TLS surplus it reserves for this (glibc.rtld.optional_static_tls,
 * 512 bytes by default), which these two pointers (16 bytes) fit; were the
 * surplus ever spent, dlopen itself would fail ("cannot allocate memory in
 * static TLS block"), never a read here. */
#define FL_TLS _Thread_local __attribute__((tls_model("initial-exec")))
static FL_TLS sigjmp_buf *bus_guard;   /* this thread's innermost return point */
static FL_TLS const void *bus_address; /* where this thread's guarded fault hit */

static void pass_on_bus_error(int sig, siginfo_t *info, void *context)
{
    const struct sigaction *previous = &previous_bus_action;
    if (previous->sa_flags & SA_SIGINFO) {
        previous->sa_sigaction(sig, info, context);
        return;
    }
    if (previous->sa_handler == SIG_IGN && info->si_code <= 0)
        return; /* a SIGBUS sent by a process, ignored as before */
    if (previous->sa_handler == SIG_DFL || previous->sa_handler == SIG_IGN) {
        /* The default action.  SIGBUS is blocked until this handler
         * returns; then the raised one ends the process with the signal,
         * as it would have without fastload. */
        struct sigaction fallback;
        memset(&fallback, 0, sizeof fallback);
        fallback.sa_handler = SIG_DFL;
        sigemptyset(&fallback.sa_mask);
        sigaction(SIGBUS, &fallback, NULL);
        raise(SIGBUS);
        return;
    }
    previous->sa_handler(sig);
}

static void on_bus_error(int sig, siginfo_t *info, void *context)
{
    /* si_code > 0: raised by the kernel for this thread's own access. */
    if (info && info->si_code > 0 &&
        atomic_load_explicit(&guarded_threads, memory_order_relaxed) > 0 && bus_guard) {
        sigjmp_buf *guard = bus_guard;
        bus_guard = NULL; /* the region's own exit restores the outer one */
        bus_address = info->si_addr;
        /* The kernel blocked SIGBUS while the handler runs, and the guard
         * does not save the signal mask (that would cost a system call on
         * every region): unblock it, or the next fault would end the
         * process. */
        sigset_t bus;
        sigemptyset(&bus);
        sigaddset(&bus, SIGBUS);
        pthread_sigmask(SIG_UNBLOCK, &bus, NULL);
        siglongjmp(*guard, 1);
    }
    pass_on_bus_error(sig, info, context);
}

static void install_bus_handler(void)
{
    /* The previous action is read before ours is in place, so the handler
     * never runs with it unset. */
    if (sigaction(SIGBUS, NULL, &previous_bus_action) != 0)
        return;
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_sigaction = on_bus_error;
    action.sa_flags = SA_SIGINFO | SA_ONSTACK; /* ONSTACK: a chained handler may want it */
    sigemptyset(&action.sa_mask);
    if (sigaction(SIGBUS, &action, NULL) != 0)
        return;
    /* A sanitizer that keeps SIGBUS to itself (ASan's handle_sigbus=2)
     * reports success without installing: look. */
    struct sigaction now;
    bus_handler_installed = sigaction(SIGBUS, NULL, &now) == 0 &&
                            (now.sa_flags & SA_SIGINFO) && now.sa_sigaction == on_bus_error;
}

/* Arms `guard` for this thread, keeping the outer one in *outer.  Returns 0
 * when no handler could be installed: the region then runs unguarded. */
static int guard_begin(sigjmp_buf *guard, sigjmp_buf **outer)
{
    pthread_once(&bus_handler_once, install_bus_handler);
    if (!bus_handler_installed)
        return 0;
    atomic_fetch_add_explicit(&guarded_threads, 1, memory_order_relaxed);
    *outer = bus_guard;
    bus_guard = guard;
    /* The handler runs on this thread: only the compiler must not move
     * the region's reads above the arming or below the disarming. */
    atomic_signal_fence(memory_order_seq_cst);
    return 1;
}

static void guard_end(sigjmp_buf *outer)
{
    atomic_signal_fence(memory_order_seq_cst);
    bus_guard = outer;
    atomic_fetch_sub_explicit(&guarded_threads, 1, memory_order_relaxed);
}

/* The jump comes back to this frame, which reads nothing after sigsetjmp
 * that it changed before the jump but `outer`, written before the fn call
 * and kept in memory (volatile); noinline keeps the frame. */
__attribute__((noinline)) int fl_guarded(void (*fn)(void *arg), void *arg,
                                         const void **fault_address)
{
    sigjmp_buf guard;
    sigjmp_buf *volatile outer = NULL;
    if (sigsetjmp(guard, 0) != 0) {
        guard_end(outer);
        if (fault_address)
            *fault_address = bus_address;
        return FL_ERR_IO;
    }
    sigjmp_buf *saved = NULL;
    int armed = guard_begin(&guard, &saved);
    outer = saved;
    fn(arg);
    if (armed)
        guard_end(outer);
    return FL_OK;
}

typedef struct copy_job {
    void *dst;
    const void *src;
    size_t n;
} copy_job;

static void copy_bytes(void *arg)
{
    const copy_job *job = arg;
    memcpy(job->dst, job->src, job->n);
}

int fl_guarded_copy(void *dst, const void *src, size_t n, const void **fault_address)
{
    if (n == 0)
        return FL_OK;
    copy_job job = {dst, src, n};
    return fl_guarded(copy_bytes, &job, fault_address);
}

/* ------------------------------------------------------------- messages */

int fl_mapped_file(const void *address, char *path, size_t path_size, int64_t *mapped_to)
{
    FILE *maps = fopen("/proc/self/maps", "re");
    if (!maps)
        return 0;
    uintptr_t at = (uintptr_t)address;
    char line[4096 + 128];
    int found = 0;
    while (!found && fgets(line, sizeof line, maps)) {
        uintmax_t start, end, offset;
        int name_at = 0;
        /* start-end perms offset dev inode   path */
        if (sscanf(line, "%jx-%jx %*s %jx %*s %*s %n", &start, &end, &offset, &name_at) < 3)
            continue;
        if (at < start || at >= end || name_at <= 0 || line[name_at] != '/')
            continue;
        size_t len = strcspn(line + name_at, "\n");
        const char *deleted = " (deleted)";
        size_t tail = strlen(deleted);
        if (len > tail && memcmp(line + name_at + len - tail, deleted, tail) == 0)
            len -= tail;
        if (len >= path_size)
            len = path_size - 1;
        memcpy(path, line + name_at, len);
        path[len] = '\0';
        *mapped_to = (int64_t)(offset + (end - start));
        found = 1;
    }
    fclose(maps);
    return found;
}

void fl_bus_fault_msg(char *msg, size_t msg_size, const char *path, int fd, int64_t opened,
                      const void *address, const char *what)
{
    char found[1024];
    int64_t mapped_to = -1;
    int rounded = 0; /* `opened` is the mapping's reach, page-rounded */
    if (!path && address && fl_mapped_file(address, found, sizeof found, &mapped_to)) {
        path = found;
        opened = mapped_to;
        rounded = 1;
    }
    if (!path) {
        fl_set_msg(msg, msg_size,
                   "memory changed under the loader: a bus error reading %s (the memory is a "
                   "file mapping whose file was truncated, or could not be read)",
                   what);
        return;
    }
    struct stat st;
    int64_t now = -1;
    if ((fd >= 0 ? fstat(fd, &st) : stat(path, &st)) == 0)
        now = (int64_t)st.st_size;
    if (now >= 0 && opened >= 0 && now < opened && rounded)
        fl_set_msg(msg, msg_size,
                   "file changed under the loader: '%s' is shorter than when it was opened "
                   "(%s; mapped to byte %" PRId64 ", %" PRId64 " bytes now)",
                   path, what, opened, now);
    else if (now >= 0 && opened >= 0 && now < opened)
        fl_set_msg(msg, msg_size,
                   "file changed under the loader: '%s' is shorter than when it was opened "
                   "(%s; %" PRId64 " bytes then, %" PRId64 " now)",
                   path, what, opened, now);
    else
        fl_set_msg(msg, msg_size,
                   "file changed under the loader: '%s' could not be read (%s; a bus error: "
                   "the file was truncated or rewritten while in use, or its storage failed)",
                   path, what);
}
