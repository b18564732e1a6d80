/* fastload core: see gather.h. */
#define _GNU_SOURCE
#include "gather.h"
#include "status.h"

#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

static uintptr_t page_mask(void)
{
    static long page; /* benign race: every thread computes the same value */
    if (page <= 0)
        page = sysconf(_SC_PAGESIZE);
    return ~(uintptr_t)((page > 0 ? page : 4096) - 1);
}

/* One madvise per byte range, page-aligned.  The advice is a hint: failure
 * (say, memory that is not a file mapping after all) changes nothing. */
static void advise_range(const char *start, size_t bytes)
{
    uintptr_t first = (uintptr_t)start & page_mask();
    uintptr_t end = (uintptr_t)start + bytes;
    (void)madvise((void *)first, end - first, MADV_WILLNEED);
}

/* ------------------------------------------------------- adaptive prefetch
 *
 * Advising every row costs a system call a row: three times the copy itself
 * when the pages are already in the page cache.  So each thread advises
 * only while its data is cold, which it learns from its own major page
 * faults (faults that waited for a read): a gather that faulted turns
 * prefetching on for the thread, and COOL_GATHERS gathers in a row without a
 * major fault turn it off again.  Costs two getrusage calls a batch. */

#define COOL_GATHERS 8

static _Thread_local int advise_on;     /* this thread's data looks cold */
static _Thread_local int quiet_gathers; /* fault-free gathers since */

static long major_faults(void)
{
#ifdef RUSAGE_THREAD
    struct rusage usage;
    if (getrusage(RUSAGE_THREAD, &usage) == 0)
        return usage.ru_majflt;
#endif
    return -1; /* unknown: stay in the mode we are in */
}

static long prefetch_begin(int file_backed)
{
    return file_backed ? major_faults() : 0;
}

static void prefetch_end(int file_backed, long faults_before)
{
    if (!file_backed)
        return;
    long faults = major_faults();
    if (faults < 0 || faults_before < 0)
        return;
    if (faults > faults_before) {
        advise_on = 1;
        quiet_gathers = 0;
    } else if (advise_on && ++quiet_gathers >= COOL_GATHERS) {
        advise_on = 0;
    }
}

/* ------------------------------------------------------------ bus errors
 *
 * A read of a mapped page past the end of its file raises SIGBUS, whose
 * default action ends the process: a training job that rewrites the file it
 * trains from would lose the whole interpreter.  So each copy loop runs
 * guarded: the thread publishes where to jump back to (bus_guard), and the
 * handler, finding the faulting thread guarded, records the fault address
 * and jumps there instead of returning to the faulting read.  The jump
 * leaves only the copy loop, which holds no lock, no GIL and no allocation.
 *
 * Every other SIGBUS (another thread, other code, a signal sent with kill)
 * goes to the handler installed before ours, or to the default action, so
 * other users of SIGBUS (faulthandler, ASan, torch) keep their behaviour.
 * The handler looks at its thread-locals only while some thread is guarded:
 * the first use of a dlopen'd module's thread-local in a thread may
 * allocate, which a handler for a fault in unrelated code should not do. */

static pthread_once_t bus_handler_once = PTHREAD_ONCE_INIT;
static int bus_handler_installed;             /* written once, under bus_handler_once */
static struct sigaction previous_bus_action;  /* likewise; read by the handler */
static atomic_int guarded_threads;            /* threads inside a guarded copy */
static _Thread_local sigjmp_buf *bus_guard;   /* this thread's return point, or NULL */
static _Thread_local const char *bus_address; /* where this thread's guarded fault hit */

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
        bus_guard = NULL;
        bus_address = info->si_addr;
        /* The kernel blocked SIGBUS while the handler runs, and the guard
         * does not save the signal mask (that would cost a system call on
         * every gather): unblock it, or the next fault would end the
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

/* Arms `guard` for this thread.  Returns 0 when no handler could be
 * installed: the copy then runs unguarded, as it would without this. */
static int guard_begin(sigjmp_buf *guard)
{
    pthread_once(&bus_handler_once, install_bus_handler);
    if (!bus_handler_installed)
        return 0;
    atomic_fetch_add_explicit(&guarded_threads, 1, memory_order_relaxed);
    bus_guard = guard;
    /* The handler runs on this thread: only the compiler must not move
     * the copy's reads above the arming or below the disarming. */
    atomic_signal_fence(memory_order_seq_cst);
    return 1;
}

static void guard_end(int armed)
{
    if (!armed)
        return;
    atomic_signal_fence(memory_order_seq_cst);
    bus_guard = NULL;
    atomic_fetch_sub_explicit(&guarded_threads, 1, memory_order_relaxed);
}

/* Runs copy(job) under this thread's guard.  Returns FL_OK, or FL_ERR_IO
 * when the copy hit a bus error (bus_address says where).  The jump comes
 * back to this frame, which changes nothing after sigsetjmp that it reads
 * after the jump; noinline keeps it so. */
__attribute__((noinline)) static int run_guarded(void (*copy)(const void *job), const void *job)
{
    sigjmp_buf guard;
    if (sigsetjmp(guard, 0) != 0) {
        guard_end(1);
        return FL_ERR_IO;
    }
    int armed = guard_begin(&guard);
    copy(job);
    guard_end(armed);
    return FL_OK;
}

/* The first of n byte ranges [base + starts[i] * scale, + bytes) that holds
 * the fault address, or n. */
static size_t faulting_position(const char *base, const int64_t *starts, size_t n, int64_t scale,
                                size_t bytes)
{
    uintptr_t address = (uintptr_t)bus_address;
    for (size_t i = 0; i < n; i++) {
        uintptr_t start = (uintptr_t)(base + starts[i] * scale);
        if (address >= start && address - start < bytes)
            return i;
    }
    return n;
}

/* ---------------------------------------------------------------- gathers */

/* Random rows defeat the hardware prefetcher, which stops at page edges:
 * each row would start with a TLB miss and a cold cache line.  Touching the
 * head of the row two ahead overlaps that latency with the current copy;
 * the streaming within a row is then the hardware's job.  (About 1.3x on
 * 4 KiB rows of a 2 GiB file, measured against the plain loop.) */
#define PREFETCH_AHEAD 2
#define PREFETCH_BYTES 256

typedef struct rows_job {
    const fl_rows *src;
    const int64_t *idx;
    size_t n;
    char *dst;
} rows_job;

static void copy_rows(const void *arg)
{
    const rows_job *job = arg;
    const fl_rows *src = job->src;
    const int64_t *idx = job->idx;
    size_t n = job->n, row = src->row_bytes;
    for (size_t i = 0; i < n; i++) {
        if (i + PREFETCH_AHEAD < n) {
            const char *next = src->base + idx[i + PREFETCH_AHEAD] * src->stride;
            for (size_t b = 0; b < row && b < PREFETCH_BYTES; b += 64)
                __builtin_prefetch(next + b);
        }
        memcpy(job->dst + i * row, src->base + idx[i] * src->stride, row);
    }
}

int fl_gather_rows(const fl_rows *src, const int64_t *idx, size_t n, char *dst, size_t *failed)
{
    size_t row = src->row_bytes;
    long faults = prefetch_begin(src->file_backed);
    if (src->file_backed && advise_on)
        for (size_t i = 0; i < n; i++)
            advise_range(src->base + idx[i] * src->stride, row);
    rows_job job = {src, idx, n, dst};
    if (run_guarded(copy_rows, &job) != FL_OK) {
        *failed = faulting_position(src->base, idx, n, src->stride, row);
        return FL_ERR_IO;
    }
    prefetch_end(src->file_backed, faults);
    return FL_OK;
}

/* The widening loops are written per token type so the compiler vectorises
 * each; `y` is the same window shifted by one token. */
#define WIDEN(type)                                                        \
    for (size_t i = 0; i < n; i++) {                                       \
        const type *t = (const type *)tokens + starts[i];                  \
        int64_t *xr = x + i * len, *yr = y + i * len;                      \
        for (size_t j = 0; j < len; j++)                                   \
            xr[j] = (int64_t)t[j];                                         \
        for (size_t j = 0; j < len; j++)                                   \
            yr[j] = (int64_t)t[j + 1];                                     \
    }

typedef struct windows_job {
    const void *tokens;
    int token_size, is_signed;
    const int64_t *starts;
    size_t n, len;
    int64_t *x, *y;
} windows_job;

static void copy_windows(const void *arg)
{
    const windows_job *job = arg;
    const void *tokens = job->tokens;
    const int64_t *starts = job->starts;
    size_t n = job->n, len = job->len;
    int64_t *x = job->x, *y = job->y;
    switch (job->token_size * (job->is_signed ? -1 : 1)) {
    case 1:
        WIDEN(uint8_t)
        break;
    case -1:
        WIDEN(int8_t)
        break;
    case 2:
        WIDEN(uint16_t)
        break;
    case -2:
        WIDEN(int16_t)
        break;
    case 4:
        WIDEN(uint32_t)
        break;
    case -4:
        WIDEN(int32_t)
        break;
    default: /* 8 bytes: int64 (uint64 tokens beyond 2**63 do not exist) */
        WIDEN(int64_t)
        break;
    }
}

int fl_gather_windows(const void *tokens, int token_size, int is_signed, int file_backed,
                      const int64_t *starts, size_t n, size_t len, int64_t *x, int64_t *y,
                      size_t *failed)
{
    size_t window_bytes = (len + 1) * (size_t)token_size;
    long faults = prefetch_begin(file_backed);
    if (file_backed && advise_on)
        for (size_t i = 0; i < n; i++)
            advise_range((const char *)tokens + starts[i] * token_size, window_bytes);
    windows_job job = {tokens, token_size, is_signed, starts, n, len, x, y};
    if (run_guarded(copy_windows, &job) != FL_OK) {
        *failed = faulting_position(tokens, starts, n, token_size, window_bytes);
        return FL_ERR_IO;
    }
    prefetch_end(file_backed, faults);
    return FL_OK;
}
