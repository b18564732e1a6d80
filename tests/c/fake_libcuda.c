/* A stand-in for libcuda.so.1, so the tests can exercise fastload's run-time
 * driver loading (csrc/core/cuda/cuda.c) on machines without a GPU.
 *
 * FAKE_CUDA_INIT: the CUresult cuInit returns (default 0);
 * FAKE_CUDA_DEVICES: the device count (default 1);
 * FAKE_CUDA_MEMORY: bytes of "device memory" (default 1 GiB);
 * FAKE_CUDA_REGISTER_ERROR: the CUresult cuMemHostRegister returns (default
 * 0); FAKE_CUDA_CAPABILITY: the compute capability, "major.minor" (default
 * "9.0"); FAKE_CUDA_SMS: the multiprocessor count (default 4);
 * FAKE_CUDA_MODULE_ERROR: the CUresult cuModuleLoadData returns (default 0);
 * FAKE_CUDA_PCI: the devices' PCI addresses, comma-separated (default
 * "0000:0N:00.0" for device N, in the driver's upper case).
 * Built with -DFAKE_CUDA_TOO_OLD it lacks cuMemHostAlloc, like a driver too
 * old for fastload; with -DFAKE_CUDA_NO_REGISTER, cuMemHostRegister.
 *
 * Kernels: cuModuleLoadData takes the text the fake NVRTC
 * (tests/c/fake_libnvrtc.c) writes, whose ".entry NAME" lines name the
 * module's kernels; cuModuleGetFunction finds NAME in the module and in
 * host_kernels below, and cuLaunchKernel runs that host function once per
 * thread of the grid, on the calling thread.
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
#include <stdio.h>
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
    LIVE_MODULES,         /* loaded modules */
    KERNEL_LAUNCHES,      /* cuLaunchKernel calls that ran */
    MEMSETS,              /* cuMemsetD8Async calls */
    DTOH_COPIES,          /* cuMemcpyDtoHAsync calls */
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

/* Every batch of events takes FAKE_CUDA_EVENT_US microseconds (default
 * 100): the GPU time fastload's decode stage measures. */
CUresult cuEventElapsedTime(float *ms, void *start, void *end)
{
    (void)start;
    (void)end;
    *ms = (float)env_int("FAKE_CUDA_EVENT_US", 100) / 1000.0f;
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

/* ---- Kernels --------------------------------------------------------- */

typedef struct {
    unsigned int x, y, z;
} dim3;

/* One CUDA thread of a kernel, in host code: its indices, the launch
 * shape, and cuLaunchKernel's params (each a pointer to an argument). */
typedef void host_kernel(dim3 block_idx, dim3 thread_idx, dim3 grid, dim3 block, void **params);

/* fill_pattern(unsigned char *dst, int n, int seed): dst[i] = (i * seed +
 * 1) & 255 for every i < n of a 1-D grid; a test kernel whose output shows
 * that every thread of the grid ran with the right index. */
static void fill_pattern(dim3 block_idx, dim3 thread_idx, dim3 grid, dim3 block, void **params)
{
    (void)grid;
    unsigned char *dst = *(unsigned char **)params[0];
    int n = *(int *)params[1], seed = *(int *)params[2];
    long long i = (long long)block_idx.x * block.x + thread_idx.x;
    if (i < n)
        dst[i] = (unsigned char)((i * seed + 1) & 255);
}

/* fastload's resample kernel, the very per-pixel function the GPU runs
 * (compiled here as C, as the extension's host reference is). */
#include "core/cuda/kernels/host_shim.h" /* built with -I csrc */
#include "core/cuda/kernels/resample.cu"

/* fl_resample_batch(fl_rk_batch batch): its grid maps (x, y) to output
 * pixels and z to images, each z-block taking images z, z + grid.z, ... */
static void resample_batch(dim3 block_idx, dim3 thread_idx, dim3 grid, dim3 block,
                           void **params)
{
    const fl_rk_batch *b = (const fl_rk_batch *)params[0];
    int x = (int)(block_idx.x * block.x + thread_idx.x);
    int y = (int)(block_idx.y * block.y + thread_idx.y);
    if (x >= b->out_w || y >= b->out_h)
        return;
    for (int i = (int)block_idx.z; i < b->count; i += (int)grid.z)
        fl_rk_pixel(b, i, x, y);
}

/* The kernels a launch can run, by the name the PTX gives: one line each. */
static const struct {
    const char *name;
    host_kernel *run;
} host_kernels[] = {
    {"fill_pattern", fill_pattern},
    {"fl_resample_batch", resample_batch},
};

#define MAX_MODULE_KERNELS 16
typedef struct {
    int count;
    char names[MAX_MODULE_KERNELS][64];
} module;

CUresult cuModuleLoadData(void **out, const void *image)
{
    CUresult forced = env_int("FAKE_CUDA_MODULE_ERROR", 0);
    if (forced)
        return forced;
    const char *text = image;
    if (strncmp(text, "// fake PTX", 11) != 0)
        return 218; /* CUDA_ERROR_INVALID_PTX */
    module *m = calloc(1, sizeof *m);
    if (!m)
        return 2;
    for (const char *p = strstr(text, ".entry "); p && m->count < MAX_MODULE_KERNELS;
         p = strstr(p + 1, ".entry ")) {
        p += 7;
        size_t len = strcspn(p, "( \n");
        if (len == 0 || len >= sizeof m->names[0])
            continue;
        memcpy(m->names[m->count], p, len);
        m->names[m->count++][len] = '\0';
    }
    *out = m;
    count(LIVE_MODULES, 1);
    return 0;
}

CUresult cuModuleUnload(void *m)
{
    free(m);
    count(LIVE_MODULES, -1);
    return 0;
}

CUresult cuModuleGetFunction(void **function, void *handle, const char *name)
{
    module *m = handle;
    for (int i = 0; i < m->count; i++) {
        if (strcmp(m->names[i], name) != 0)
            continue;
        for (size_t k = 0; k < sizeof host_kernels / sizeof host_kernels[0]; k++)
            if (strcmp(host_kernels[k].name, name) == 0) {
                *function = (void *)&host_kernels[k];
                return 0;
            }
    }
    return 500; /* CUDA_ERROR_NOT_FOUND */
}

CUresult cuLaunchKernel(void *function, unsigned int gx, unsigned int gy, unsigned int gz,
                        unsigned int bx, unsigned int by, unsigned int bz, unsigned int shared,
                        void *stream, void **params, void **extra)
{
    (void)shared;
    (void)stream;
    if (!function || extra || !params)
        return 1; /* CUDA_ERROR_INVALID_VALUE: fastload never uses `extra` */
    if (!gx || !gy || !gz || !bx || !by || !bz || (unsigned long long)bx * by * bz > 1024)
        return 1;
    host_kernel *run = host_kernels[(size_t)((char *)function - (char *)host_kernels) /
                                    sizeof host_kernels[0]].run;
    dim3 grid = {gx, gy, gz}, block = {bx, by, bz};
    for (unsigned int z = 0; z < gz; z++)
        for (unsigned int y = 0; y < gy; y++)
            for (unsigned int x = 0; x < gx; x++)
                for (unsigned int tz = 0; tz < bz; tz++)
                    for (unsigned int ty = 0; ty < by; ty++)
                        for (unsigned int tx = 0; tx < bx; tx++)
                            run((dim3){x, y, z}, (dim3){tx, ty, tz}, grid, block, params);
    count(KERNEL_LAUNCHES, 1);
    return 0;
}

CUresult cuDeviceGetPCIBusId(char *pci_bus_id, int len, int device)
{
    if (!pci_bus_id || len < 1 || device < 0 || device >= env_int("FAKE_CUDA_DEVICES", 1))
        return 1; /* CUDA_ERROR_INVALID_VALUE */
    const char *list = getenv("FAKE_CUDA_PCI");
    if (!list || !*list) {
        snprintf(pci_bus_id, (size_t)len, "0000:%02X:00.0", device);
        return 0;
    }
    for (int i = 0; i < device && list; i++) {
        list = strchr(list, ',');
        if (list)
            list++;
    }
    if (!list)
        return 1;
    size_t n = strcspn(list, ",");
    if (n >= (size_t)len)
        return 1;
    memcpy(pci_bus_id, list, n);
    pci_bus_id[n] = '\0';
    return 0;
}

CUresult cuDeviceGetAttribute(int *value, int attribute, int device)
{
    (void)device;
    int major = 9, minor = 0;
    const char *capability = getenv("FAKE_CUDA_CAPABILITY");
    if (capability && *capability && sscanf(capability, "%d.%d", &major, &minor) != 2)
        return 1;
    switch (attribute) {
    case 16: /* CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT */
        *value = env_int("FAKE_CUDA_SMS", 4);
        return 0;
    case 75: /* CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR */
        *value = major;
        return 0;
    case 76: /* CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR */
        *value = minor;
        return 0;
    default:
        return 1; /* CUDA_ERROR_INVALID_VALUE */
    }
}

CUresult cuMemsetD8Async(unsigned long long dst, unsigned char value, size_t bytes, void *stream)
{
    (void)stream;
    memset((void *)(size_t)dst, value, bytes);
    count(MEMSETS, 1);
    return 0;
}

CUresult cuMemcpyDtoHAsync_v2(void *dst, unsigned long long src, size_t bytes, void *stream)
{
    (void)stream;
    memcpy(dst, (const void *)(size_t)src, bytes);
    count(DTOH_COPIES, 1);
    return 0;
}
