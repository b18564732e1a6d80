/* A stand-in for libcuda.so.1, so the tests can exercise fastload's run-time
 * driver loading (csrc/core/cuda/cuda.c) on machines without a GPU.
 *
 * FAKE_CUDA_INIT: the CUresult cuInit returns (default 0);
 * FAKE_CUDA_DEVICES: the device count (default 1);
 * FAKE_CUDA_MEMORY: bytes of "device memory" (default 1 GiB);
 * FAKE_CUDA_REGISTER_ERROR: the CUresult cuMemHostRegister returns (default
 * 0).  Built with -DFAKE_CUDA_TOO_OLD it lacks cuMemHostAlloc, like a driver
 * too old for fastload; with -DFAKE_CUDA_NO_REGISTER, cuMemHostRegister.
 *
 * Device memory is host memory here, copies are memcpy done at once, and
 * streams and events are tokens whose work is complete, unless a test holds
 * events (fake_cuda_hold_events): then an event recorded meanwhile stays
 * pending until it is synchronized or the hold ends.  So the tests can read "device" buffers
 * back through the pointers fastload exports, and fake_cuda_counters() tells
 * them what fastload asked of the driver.  Registered host ranges are
 * checked as the driver would (mapped, not registered twice) and their
 * unregistration must come while they are still mapped.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

typedef int CUresult;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

/* What fastload did, for the tests (read with fake_cuda_counters). */
enum {
    DEVICE_BYTES,     /* live device allocations, bytes */
    DEVICE_BUFFERS,   /* live device allocations */
    PINNED_BUFFERS,   /* live page-locked host allocations */
    COPIES,           /* cuMemcpyHtoDAsync calls */
    STREAM_WAITS,     /* cuStreamWaitEvent calls */
    LAST_WAIT_STREAM, /* the stream of the last cuStreamWaitEvent */
    EVENT_RECORDS,    /* cuEventRecord calls */
    LAST_RECORD_STREAM,
    LIVE_STREAMS,
    LIVE_EVENTS,
    HOST_REGISTERED,      /* live cuMemHostRegister ranges */
    REGISTER_CALLS,       /* successful cuMemHostRegister calls */
    UNREGISTER_CALLS,     /* successful cuMemHostUnregister calls */
    BAD_REGISTRATIONS,    /* calls refused: unmapped, twice, unknown, unmapped before */
    LAST_REGISTER_FLAGS,
    EVENT_QUERIES,        /* cuEventQuery calls */
    PENDING_QUERIES,      /* of which answered "not ready" */
    EVENT_SYNCS,          /* cuEventSynchronize calls */
    N_COUNTERS
};
static long long counters[N_COUNTERS];

static void count(int which, long long delta)
{
    pthread_mutex_lock(&lock);
    counters[which] += delta;
    pthread_mutex_unlock(&lock);
}

/* Copies the first `n` counters (at most N_COUNTERS) into `out`. */
void fake_cuda_counters(long long *out, int n)
{
    if (n > N_COUNTERS)
        n = N_COUNTERS;
    pthread_mutex_lock(&lock);
    memcpy(out, counters, sizeof counters[0] * (size_t)(n > 0 ? n : 0));
    pthread_mutex_unlock(&lock);
}

/* While `hold` is nonzero, events recorded stay pending until synchronized
 * (as if the GPU were still busy with the work before them); ending the hold
 * completes them all. */
static int hold_events;

void fake_cuda_hold_events(int hold)
{
    pthread_mutex_lock(&lock);
    hold_events = hold;
    pthread_mutex_unlock(&lock);
}

static int env_int(const char *name, int fallback)
{
    const char *v = getenv(name);
    return v && *v ? atoi(v) : fallback;
}

CUresult cuInit(unsigned int flags)
{
    (void)flags;
    return env_int("FAKE_CUDA_INIT", 0);
}

CUresult cuDeviceGetCount(int *count)
{
    *count = env_int("FAKE_CUDA_DEVICES", 1);
    return 0;
}

CUresult cuDeviceGet(int *device, int ordinal)
{
    *device = ordinal;
    return 0;
}

CUresult cuGetErrorString(CUresult error, const char **text)
{
    switch (error) {
    case 100:
        *text = "no CUDA-capable device is detected";
        return 0;
    case 999:
        *text = "unknown error";
        return 0;
    default:
        return 1; /* CUDA_ERROR_INVALID_VALUE */
    }
}

static int dummy_context;

CUresult cuDevicePrimaryCtxRetain(void **ctx, int device)
{
    (void)device;
    *ctx = &dummy_context;
    return 0;
}

CUresult cuDevicePrimaryCtxRelease_v2(int device)
{
    (void)device;
    return 0;
}

CUresult cuCtxPushCurrent_v2(void *ctx)
{
    (void)ctx;
    return 0;
}

CUresult cuCtxPopCurrent_v2(void **ctx)
{
    *ctx = &dummy_context;
    return 0;
}

#ifndef FAKE_CUDA_TOO_OLD
CUresult cuMemHostAlloc(void **ptr, size_t bytes, unsigned int flags)
{
    (void)flags;
    *ptr = malloc(bytes);
    if (!*ptr)
        return 2; /* CUDA_ERROR_OUT_OF_MEMORY */
    count(PINNED_BUFFERS, 1);
    return 0;
}
#endif

CUresult cuMemFreeHost(void *ptr)
{
    free(ptr);
    count(PINNED_BUFFERS, -1);
    return 0;
}

/* Registered ranges, as the driver tracks them (guarded by `lock`). */
#define MAX_RANGES 4096
static struct {
    char *start;
    size_t bytes;
} ranges[MAX_RANGES];
static int range_count;

/* Whether every page of [start, start + bytes) is mapped in this process. */
static int mapped(void *start, size_t bytes)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t pages = (bytes + page - 1) / page;
    unsigned char *residency = malloc(pages ? pages : 1);
    int ok = residency && (size_t)start % page == 0 && mincore(start, bytes, residency) == 0;
    free(residency);
    return ok;
}

static CUresult refuse(CUresult error)
{
    counters[BAD_REGISTRATIONS]++;
    pthread_mutex_unlock(&lock);
    return error;
}

#ifndef FAKE_CUDA_NO_REGISTER
CUresult cuMemHostRegister_v2(void *ptr, size_t bytes, unsigned int flags)
{
    CUresult forced = env_int("FAKE_CUDA_REGISTER_ERROR", 0);
    if (forced)
        return forced;
    pthread_mutex_lock(&lock);
    char *start = ptr;
    if (bytes == 0 || !mapped(ptr, bytes) || range_count == MAX_RANGES)
        return refuse(1); /* CUDA_ERROR_INVALID_VALUE */
    for (int i = 0; i < range_count; i++)
        if (start < ranges[i].start + ranges[i].bytes && ranges[i].start < start + bytes)
            return refuse(712); /* CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED */
    ranges[range_count].start = start;
    ranges[range_count].bytes = bytes;
    range_count++;
    counters[HOST_REGISTERED]++;
    counters[REGISTER_CALLS]++;
    counters[LAST_REGISTER_FLAGS] = flags;
    pthread_mutex_unlock(&lock);
    return 0;
}
#endif

CUresult cuMemHostUnregister(void *ptr)
{
    pthread_mutex_lock(&lock);
    for (int i = 0; i < range_count; i++) {
        if (ranges[i].start != ptr)
            continue;
        int still_mapped = mapped(ptr, ranges[i].bytes);
        ranges[i] = ranges[--range_count];
        if (!still_mapped)
            return refuse(1); /* unmapped under the driver: a bug in the caller */
        counters[HOST_REGISTERED]--;
        counters[UNREGISTER_CALLS]++;
        pthread_mutex_unlock(&lock);
        return 0;
    }
    return refuse(713); /* CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED */
}

static long long device_memory(void)
{
    const char *v = getenv("FAKE_CUDA_MEMORY");
    return v && *v ? atoll(v) : 1LL << 30;
}

/* Device buffers carry their size in a header, for the byte count. */
CUresult cuMemAlloc_v2(unsigned long long *ptr, size_t bytes)
{
    long long total = device_memory();
    pthread_mutex_lock(&lock);
    int fits = counters[DEVICE_BYTES] + (long long)bytes <= total;
    if (fits) {
        counters[DEVICE_BYTES] += (long long)bytes;
        counters[DEVICE_BUFFERS]++;
    }
    pthread_mutex_unlock(&lock);
    size_t *block = fits ? malloc(sizeof(size_t) * 2 + bytes) : NULL;
    if (!block) {
        if (fits) {
            count(DEVICE_BYTES, -(long long)bytes);
            count(DEVICE_BUFFERS, -1);
        }
        return 2; /* CUDA_ERROR_OUT_OF_MEMORY */
    }
    block[0] = bytes;
    *ptr = (unsigned long long)(size_t)(block + 2);
    return 0;
}

CUresult cuMemFree_v2(unsigned long long ptr)
{
    size_t *block = (size_t *)(size_t)ptr - 2;
    count(DEVICE_BYTES, -(long long)block[0]);
    count(DEVICE_BUFFERS, -1);
    free(block);
    return 0;
}

CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes)
{
    long long total = device_memory();
    pthread_mutex_lock(&lock);
    *free_bytes = (size_t)(total - counters[DEVICE_BYTES]);
    pthread_mutex_unlock(&lock);
    *total_bytes = (size_t)total;
    return 0;
}

CUresult cuMemcpyHtoDAsync_v2(unsigned long long dst, const void *src, size_t bytes,
                              void *stream)
{
    (void)stream;
    memcpy((void *)(size_t)dst, src, bytes);
    count(COPIES, 1);
    return 0;
}

/* Streams and events are tokens: a byte of heap, counted while alive. */
static CUresult new_token(void **token, int live_counter)
{
    *token = malloc(1);
    if (!*token)
        return 2; /* CUDA_ERROR_OUT_OF_MEMORY */
    count(live_counter, 1);
    return 0;
}

static CUresult free_token(void *token, int live_counter)
{
    free(token);
    count(live_counter, -1);
    return 0;
}

/* Counts a call made on `stream` and remembers that stream. */
static void count_on_stream(int calls, int last_stream, void *stream)
{
    pthread_mutex_lock(&lock);
    counters[calls]++;
    counters[last_stream] = (long long)(size_t)stream;
    pthread_mutex_unlock(&lock);
}

CUresult cuStreamCreate(void **stream, unsigned int flags)
{
    (void)flags;
    return new_token(stream, LIVE_STREAMS);
}

CUresult cuStreamDestroy_v2(void *stream)
{
    return free_token(stream, LIVE_STREAMS);
}

CUresult cuStreamSynchronize(void *stream)
{
    (void)stream;
    return 0;
}

CUresult cuStreamWaitEvent(void *stream, void *event, unsigned int flags)
{
    (void)event;
    (void)flags;
    count_on_stream(STREAM_WAITS, LAST_WAIT_STREAM, stream);
    return 0;
}

/* An event's one byte says whether it is pending. */
CUresult cuEventCreate(void **event, unsigned int flags)
{
    (void)flags;
    CUresult rc = new_token(event, LIVE_EVENTS);
    if (rc == 0)
        *(char *)*event = 0;
    return rc;
}

CUresult cuEventDestroy_v2(void *event)
{
    return free_token(event, LIVE_EVENTS);
}

CUresult cuEventRecord(void *event, void *stream)
{
    count_on_stream(EVENT_RECORDS, LAST_RECORD_STREAM, stream);
    pthread_mutex_lock(&lock);
    *(char *)event = (char)(hold_events != 0);
    pthread_mutex_unlock(&lock);
    return 0;
}

CUresult cuEventQuery(void *event)
{
    pthread_mutex_lock(&lock);
    int pending = *(char *)event && hold_events;
    counters[EVENT_QUERIES]++;
    counters[PENDING_QUERIES] += pending;
    pthread_mutex_unlock(&lock);
    return pending ? 600 : 0; /* CUDA_ERROR_NOT_READY */
}

CUresult cuEventSynchronize(void *event)
{
    pthread_mutex_lock(&lock);
    *(char *)event = 0;
    counters[EVENT_SYNCS]++;
    pthread_mutex_unlock(&lock);
    return 0;
}
