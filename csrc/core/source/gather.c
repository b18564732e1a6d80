/* fastload core: see gather.h. */
#define _GNU_SOURCE
#include "core/source/gather.h"
#include "core/memory/bus_guard.h"
#include "core/status.h"

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
 * Each copy loop runs under the bus-error guard (bus_guard.h): a read past
 * the end of a truncated file returns FL_ERR_IO and the fault's address,
 * which tells the row being read.  The loops hold no lock and allocate
 * nothing, as the guard requires. */

/* The first of n byte ranges [base + starts[i] * scale, + bytes) that holds
 * the fault address, or n. */
static size_t faulting_position(const void *fault, const char *base, const int64_t *starts,
                                size_t n, int64_t scale, size_t bytes)
{
    uintptr_t address = (uintptr_t)fault;
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

static void copy_rows(void *arg)
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
    const void *fault = NULL;
    if (fl_guarded(copy_rows, &job, &fault) != FL_OK) {
        *failed = faulting_position(fault, src->base, idx, n, src->stride, row);
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

static void copy_windows(void *arg)
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
    const void *fault = NULL;
    if (fl_guarded(copy_windows, &job, &fault) != FL_OK) {
        *failed = faulting_position(fault, tokens, starts, n, token_size, window_bytes);
        return FL_ERR_IO;
    }
    prefetch_end(file_backed, faults);
    return FL_OK;
}
