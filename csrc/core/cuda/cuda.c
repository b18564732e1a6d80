/* fastload core: see cuda.h. */
#define _GNU_SOURCE
#include "core/cuda/cuda.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static fl_cuda driver;
static const fl_cuda *loaded;
static const char *failure;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static char failure_text[512];
static pid_t loaded_by; /* the process that ran cuInit */

/* Primary contexts, retained once per device and never released: pointers
 * into them (pinned slots, device buffers) may live until exit. */
#define MAX_DEVICES 64
static pthread_mutex_t contexts_lock = PTHREAD_MUTEX_INITIALIZER;
static fl_cu_context contexts[MAX_DEVICES];

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
    {"cuMemAlloc_v2", offsetof(fl_cuda, mem_alloc)},
    {"cuMemFree_v2", offsetof(fl_cuda, mem_free)},
    {"cuMemGetInfo_v2", offsetof(fl_cuda, mem_get_info)},
    {"cuMemcpyHtoDAsync_v2", offsetof(fl_cuda, memcpy_htod_async)},
    {"cuStreamCreate", offsetof(fl_cuda, stream_create)},
    {"cuStreamDestroy_v2", offsetof(fl_cuda, stream_destroy)},
    {"cuStreamSynchronize", offsetof(fl_cuda, stream_synchronize)},
    {"cuStreamWaitEvent", offsetof(fl_cuda, stream_wait_event)},
    {"cuEventCreate", offsetof(fl_cuda, event_create)},
    {"cuEventDestroy_v2", offsetof(fl_cuda, event_destroy)},
    {"cuEventRecord", offsetof(fl_cuda, event_record)},
    {"cuEventQuery", offsetof(fl_cuda, event_query)},
    {"cuEventSynchronize", offsetof(fl_cuda, event_synchronize)},
};

/* Entry points only some features need; a driver without them keeps the
 * rest (they stay NULL, and the caller that needs them says so). */
static const struct {
    const char *name;
    size_t offset;
} optional_entry_points[] = {
    {"cuMemHostRegister_v2", offsetof(fl_cuda, mem_host_register)},
    {"cuMemHostUnregister", offsetof(fl_cuda, mem_host_unregister)},
    {"cuDeviceGetPCIBusId", offsetof(fl_cuda, device_get_pci_bus_id)},
    /* Kernels: names checked against the driver API's cuda.h, where only
     * the copy has a _v2 ABI (cuMemcpyDtoHAsync_v2); cuMemsetD8Async,
     * cuModule*, cuLaunchKernel and cuDeviceGetAttribute keep their names. */
    {"cuModuleLoadData", offsetof(fl_cuda, module_load_data)},
    {"cuModuleUnload", offsetof(fl_cuda, module_unload)},
    {"cuModuleGetFunction", offsetof(fl_cuda, module_get_function)},
    {"cuLaunchKernel", offsetof(fl_cuda, launch_kernel)},
    {"cuDeviceGetAttribute", offsetof(fl_cuda, device_get_attribute)},
    {"cuMemsetD8Async", offsetof(fl_cuda, memset_d8_async)},
    {"cuMemcpyDtoHAsync_v2", offsetof(fl_cuda, memcpy_dtoh_async)},
    /* Timing the GPU decode stage's batches (events made without
     * CU_EVENT_DISABLE_TIMING). */
    {"cuEventElapsedTime", offsetof(fl_cuda, event_elapsed_time)},
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
    for (size_t i = 0; i < sizeof optional_entry_points / sizeof optional_entry_points[0]; i++)
        *(void **)((char *)&driver + optional_entry_points[i].offset) =
            dlsym(lib, optional_entry_points[i].name);
    if (!driver.mem_host_register || !driver.mem_host_unregister) {
        driver.mem_host_register = NULL; /* one is no use without the other */
        driver.mem_host_unregister = NULL;
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
    loaded_by = getpid();
    loaded = &driver;
}

const fl_cuda *fl_cuda_get(const char **why)
{
    pthread_once(&once, load);
    if (loaded && getpid() != loaded_by) {
        if (why)
            *why = "CUDA was initialised before this process was forked; "
                   "a forked child cannot use it";
        return NULL;
    }
    if (!loaded && why)
        *why = failure;
    return loaded;
}

fl_cu_result fl_cuda_enter(const fl_cuda *cuda, int ordinal)
{
    if (ordinal < 0 || ordinal >= MAX_DEVICES)
        return 101; /* CUDA_ERROR_INVALID_DEVICE */
    pthread_mutex_lock(&contexts_lock);
    fl_cu_result rc = 0;
    if (!contexts[ordinal]) {
        fl_cu_device device;
        rc = cuda->device_get(&device, ordinal);
        if (rc == 0)
            rc = cuda->primary_ctx_retain(&contexts[ordinal], device);
    }
    fl_cu_context ctx = contexts[ordinal];
    pthread_mutex_unlock(&contexts_lock);
    return rc != 0 ? rc : cuda->ctx_push_current(ctx);
}

void fl_cuda_leave(const fl_cuda *cuda)
{
    fl_cu_context popped;
    cuda->ctx_pop_current(&popped);
}

const char *fl_cuda_kernels_missing(const fl_cuda *cuda)
{
    /* The kernel entry points are the optional table's tail, from
     * cuModuleLoadData on. */
    size_t n = sizeof optional_entry_points / sizeof optional_entry_points[0];
    for (size_t i = 0; i < n; i++) {
        if (optional_entry_points[i].offset < offsetof(fl_cuda, module_load_data))
            continue;
        if (!*(void *const *)((const char *)cuda + optional_entry_points[i].offset))
            return optional_entry_points[i].name;
    }
    return NULL;
}

fl_cu_result fl_cuda_device_info(const fl_cuda *cuda, int ordinal, int *major, int *minor,
                                 int *multiprocessors)
{
    if (!cuda->device_get_attribute)
        return 801; /* CUDA_ERROR_NOT_SUPPORTED */
    fl_cu_device device;
    fl_cu_result rc = cuda->device_get(&device, ordinal);
    if (rc == 0 && major)
        rc = cuda->device_get_attribute(major, FL_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                                        device);
    if (rc == 0 && minor)
        rc = cuda->device_get_attribute(minor, FL_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
                                        device);
    if (rc == 0 && multiprocessors)
        rc = cuda->device_get_attribute(multiprocessors,
                                        FL_CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device);
    return rc;
}

fl_cu_result fl_cuda_pci_bus_id(const fl_cuda *cuda, int ordinal, char *out, int size)
{
    if (!cuda->device_get_pci_bus_id)
        return 801; /* CUDA_ERROR_NOT_SUPPORTED */
    if (size < 1)
        return 1; /* CUDA_ERROR_INVALID_VALUE */
    fl_cu_device device;
    fl_cu_result rc = cuda->device_get(&device, ordinal);
    if (rc == 0)
        rc = cuda->device_get_pci_bus_id(out, size, device);
    if (rc != 0)
        return rc;
    out[size - 1] = '\0';
    /* The driver writes hex digits in upper case; sysfs names them in lower. */
    for (char *c = out; *c; c++)
        if (*c >= 'A' && *c <= 'F')
            *c = (char)(*c - 'A' + 'a');
    return 0;
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
