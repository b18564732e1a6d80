/* A stand-in for libcuda.so.1, so the tests can exercise fastload's run-time
 * driver loading (csrc/core/cuda.c) on machines without a GPU.
 *
 * FAKE_CUDA_INIT: the CUresult cuInit returns (default 0);
 * FAKE_CUDA_DEVICES: the device count (default 1);
 * FAKE_CUDA_MEMORY: bytes of "device memory" (default 1 GiB).  Built with
 * -DFAKE_CUDA_TOO_OLD it lacks cuMemHostAlloc, like a driver too old for
 * fastload.
 *
 * Device memory is host memory here, copies are memcpy done at once, and
 * streams and events are tokens whose work is always complete; so the tests
 * can read "device" buffers back through the pointers fastload exports, and
 * fake_cuda_counters() tells them what fastload asked of the driver.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

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
    N_COUNTERS
};
static long long counters[N_COUNTERS];

static void count(int which, long long delta)
{
    pthread_mutex_lock(&lock);
    counters[which] += delta;
    pthread_mutex_unlock(&lock);
}

void fake_cuda_counters(long long *out)
{
    pthread_mutex_lock(&lock);
    memcpy(out, counters, sizeof counters);
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

CUresult cuEventCreate(void **event, unsigned int flags)
{
    (void)flags;
    return new_token(event, LIVE_EVENTS);
}

CUresult cuEventDestroy_v2(void *event)
{
    return free_token(event, LIVE_EVENTS);
}

CUresult cuEventRecord(void *event, void *stream)
{
    (void)event;
    count_on_stream(EVENT_RECORDS, LAST_RECORD_STREAM, stream);
    return 0;
}

CUresult cuEventQuery(void *event)
{
    (void)event;
    return 0;
}

CUresult cuEventSynchronize(void *event)
{
    (void)event;
    return 0;
}
