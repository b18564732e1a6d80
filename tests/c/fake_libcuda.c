/* A stand-in for libcuda.so.1, so the tests can exercise fastload's run-time
 * driver loading (csrc/core/cuda.c) on machines without a GPU.
 *
 * FAKE_CUDA_INIT: the CUresult cuInit returns (default 0);
 * FAKE_CUDA_DEVICES: the device count (default 1).  Built with
 * -DFAKE_CUDA_TOO_OLD it lacks cuMemHostAlloc, like a driver too old for
 * fastload.  Memory and contexts are plain malloc and dummies: enough for
 * loading and error paths, not for real work.
 */
#include <stdlib.h>

typedef int CUresult;

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
    return *ptr ? 0 : 2; /* CUDA_ERROR_OUT_OF_MEMORY */
}
#endif

CUresult cuMemFreeHost(void *ptr)
{
    free(ptr);
    return 0;
}
