/* fastload core: see cuda.h. */
#define _GNU_SOURCE
#include "cuda.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

static fl_cuda driver;
static const fl_cuda *loaded;
static const char *failure;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static char failure_text[512];

/* The driver exports some entry points under versioned names (_v2): those
 * are the current ABI, and the plain names are kept for old binaries. */
static const struct {
    const char *name;
    size_t offset;
} entry_points[] = {
    {"cuInit", offsetof(fl_cuda, init)},
    {"cuDeviceGetCount", offsetof(fl_cuda, device_get_count)},
    {"cuDeviceGet", offsetof(fl_cuda, device_get)},
    {"cuGetErrorString", offsetof(fl_cuda, get_error_string)},
    {"cuDevicePrimaryCtxRetain", offsetof(fl_cuda, primary_ctx_retain)},
    {"cuDevicePrimaryCtxRelease_v2", offsetof(fl_cuda, primary_ctx_release)},
    {"cuCtxPushCurrent_v2", offsetof(fl_cuda, ctx_push_current)},
    {"cuCtxPopCurrent_v2", offsetof(fl_cuda, ctx_pop_current)},
    {"cuMemHostAlloc", offsetof(fl_cuda, mem_host_alloc)},
    {"cuMemFreeHost", offsetof(fl_cuda, mem_free_host)},
};

static void load(void)
{
    const char *path = getenv("FASTLOAD_LIBCUDA");
    if (!path || !*path)
        path = "libcuda.so.1";
    /* RTLD_LOCAL: the driver's symbols stay out of the global namespace,
     * where torch's or CuPy's own loading of it could meet them. */
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        snprintf(failure_text, sizeof failure_text, "cannot load the CUDA driver (%s)",
                 dlerror());
        failure = failure_text;
        return;
    }
    for (size_t i = 0; i < sizeof entry_points / sizeof entry_points[0]; i++) {
        void *fn = dlsym(lib, entry_points[i].name);
        if (!fn) {
            snprintf(failure_text, sizeof failure_text,
                     "the CUDA driver %s has no %s: too old", path, entry_points[i].name);
            failure = failure_text;
            dlclose(lib);
            return;
        }
        /* Function pointers are stored through the struct's layout: POSIX
         * guarantees dlsym's result converts to a function pointer. */
        *(void **)((char *)&driver + entry_points[i].offset) = fn;
    }
    fl_cu_result rc = driver.init(0);
    if (rc != 0) {
        snprintf(failure_text, sizeof failure_text, "cuInit failed: %s",
                 fl_cuda_error_string(&driver, rc));
        failure = failure_text;
        /* The library stays open: a failed cuInit is sticky, and the
         * pointers are never used again. */
        return;
    }
    loaded = &driver;
}

const fl_cuda *fl_cuda_get(const char **why)
{
    pthread_once(&once, load);
    if (!loaded && why)
        *why = failure;
    return loaded;
}

const char *fl_cuda_error_string(const fl_cuda *cuda, fl_cu_result error)
{
    static _Thread_local char text[96];
    const char *name = NULL;
    if (cuda && cuda->get_error_string && cuda->get_error_string(error, &name) == 0 && name)
        return name;
    snprintf(text, sizeof text, "CUDA error %d", error);
    return text;
}
