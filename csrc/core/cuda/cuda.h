/* fastload core: the CUDA driver API, opened at run time.
 *
 * fastload builds and runs without CUDA: libcuda.so.1 (or the library named
 * by FASTLOAD_LIBCUDA, for tests) is opened with dlopen on first use and
 * the few driver entry points fastload needs are resolved by name.  No CUDA
 * header is used; the handful of types are declared here as the driver ABI
 * defines them.
 */
#ifndef FL_CUDA_H
#define FL_CUDA_H

#include <stddef.h>

typedef int fl_cu_result;   /* CUresult: 0 is CUDA_SUCCESS */
typedef int fl_cu_device;   /* CUdevice */
typedef void *fl_cu_context; /* CUcontext */
typedef unsigned long long fl_cu_deviceptr; /* CUdeviceptr */
typedef void *fl_cu_stream; /* CUstream */
typedef void *fl_cu_event;  /* CUevent */
typedef void *fl_cu_module;   /* CUmodule */
typedef void *fl_cu_function; /* CUfunction */

#define FL_CU_ERROR_NOT_READY 600
#define FL_CU_ERROR_OUT_OF_MEMORY 2
#define FL_CU_MEMHOSTALLOC_PORTABLE 0x01 /* pinned for every context */
#define FL_CU_MEMHOSTREGISTER_PORTABLE 0x01 /* the same, for registered memory */
#define FL_CU_STREAM_NON_BLOCKING 0x1    /* no implicit sync with stream 0 */
#define FL_CU_EVENT_DISABLE_TIMING 0x2
/* CUdevice_attribute values fastload asks for (cuDeviceGetAttribute). */
#define FL_CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT 16
#define FL_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR 75
#define FL_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR 76
/* The special stream handles of the driver API (and of DLPack's stream=). */
#define FL_CU_STREAM_LEGACY ((fl_cu_stream)0x1)
#define FL_CU_STREAM_PER_THREAD ((fl_cu_stream)0x2)

/* The resolved driver: function pointers with the driver's signatures. */
typedef struct fl_cuda {
    fl_cu_result (*init)(unsigned int flags);
    fl_cu_result (*device_get_count)(int *count);
    fl_cu_result (*device_get)(fl_cu_device *device, int ordinal);
    fl_cu_result (*get_error_string)(fl_cu_result error, const char **text);
    fl_cu_result (*primary_ctx_retain)(fl_cu_context *ctx, fl_cu_device device);
    fl_cu_result (*primary_ctx_release)(fl_cu_device device);
    fl_cu_result (*ctx_push_current)(fl_cu_context ctx);
    fl_cu_result (*ctx_pop_current)(fl_cu_context *ctx);
    fl_cu_result (*mem_host_alloc)(void **ptr, size_t bytes, unsigned int flags);
    fl_cu_result (*mem_free_host)(void *ptr);
    /* Optional (NULL when the driver lacks them): page-lock memory that
     * someone else allocated, and undo it. */
    fl_cu_result (*mem_host_register)(void *ptr, size_t bytes, unsigned int flags);
    fl_cu_result (*mem_host_unregister)(void *ptr);
    /* Optional: the device's PCI address ("0000:3b:00.0"), for its NUMA node. */
    fl_cu_result (*device_get_pci_bus_id)(char *pci_bus_id, int len, fl_cu_device device);
    fl_cu_result (*mem_alloc)(fl_cu_deviceptr *ptr, size_t bytes);
    fl_cu_result (*mem_free)(fl_cu_deviceptr ptr);
    fl_cu_result (*mem_get_info)(size_t *free_bytes, size_t *total_bytes);
    fl_cu_result (*memcpy_htod_async)(fl_cu_deviceptr dst, const void *src, size_t bytes,
                                      fl_cu_stream stream);
    fl_cu_result (*stream_create)(fl_cu_stream *stream, unsigned int flags);
    fl_cu_result (*stream_destroy)(fl_cu_stream stream);
    fl_cu_result (*stream_synchronize)(fl_cu_stream stream);
    fl_cu_result (*stream_wait_event)(fl_cu_stream stream, fl_cu_event event, unsigned int flags);
    fl_cu_result (*event_create)(fl_cu_event *event, unsigned int flags);
    fl_cu_result (*event_destroy)(fl_cu_event event);
    fl_cu_result (*event_record)(fl_cu_event event, fl_cu_stream stream);
    fl_cu_result (*event_query)(fl_cu_event event);
    fl_cu_result (*event_synchronize)(fl_cu_event event);
    /* Optional: running kernels (the GPU decode stage).  NULL when the driver
     * lacks one; fl_cuda_kernels_missing() names the first missing. */
    fl_cu_result (*module_load_data)(fl_cu_module *module, const void *image);
    fl_cu_result (*module_unload)(fl_cu_module module);
    fl_cu_result (*module_get_function)(fl_cu_function *function, fl_cu_module module,
                                        const char *name);
    fl_cu_result (*launch_kernel)(fl_cu_function function, unsigned int grid_x,
                                  unsigned int grid_y, unsigned int grid_z,
                                  unsigned int block_x, unsigned int block_y,
                                  unsigned int block_z, unsigned int shared_bytes,
                                  fl_cu_stream stream, void **params, void **extra);
    fl_cu_result (*device_get_attribute)(int *value, int attribute, fl_cu_device device);
    fl_cu_result (*memset_d8_async)(fl_cu_deviceptr dst, unsigned char value, size_t bytes,
                                    fl_cu_stream stream);
    fl_cu_result (*memcpy_dtoh_async)(void *dst, fl_cu_deviceptr src, size_t bytes,
                                      fl_cu_stream stream);
    /* Optional: milliseconds between two completed timing events. */
    fl_cu_result (*event_elapsed_time)(float *ms, fl_cu_event start, fl_cu_event end);
} fl_cuda;

/* Opens and initialises the driver once (thread-safe); later calls return
 * the same answer.  Returns the driver, or NULL with the reason in *why (a
 * static string: no library, a missing entry point, or cuInit's error).  In
 * a child forked after the driver was initialised it returns NULL: CUDA
 * state does not survive fork(). */
const fl_cuda *fl_cuda_get(const char **why);

/* Makes device `ordinal`'s primary context (retained on first use and kept
 * for the life of the process: the context torch, CuPy and JAX use) current
 * on this thread.  Returns 0, or the driver's error.  Pair with
 * fl_cuda_leave. */
fl_cu_result fl_cuda_enter(const fl_cuda *cuda, int ordinal);
void fl_cuda_leave(const fl_cuda *cuda);

/* NULL when the driver has every entry point kernels need (module loading,
 * cuLaunchKernel, cuDeviceGetAttribute, cuMemsetD8Async,
 * cuMemcpyDtoHAsync), else the driver's name of the first one missing. */
const char *fl_cuda_kernels_missing(const fl_cuda *cuda);

/* Device `ordinal`'s compute capability (major, minor) and multiprocessor
 * count (any of the outputs may be NULL).  Returns 0 or the driver's error
 * (CUDA_ERROR_NOT_SUPPORTED, 801, when the driver lacks
 * cuDeviceGetAttribute). */
fl_cu_result fl_cuda_device_info(const fl_cuda *cuda, int ordinal, int *major, int *minor,
                                 int *multiprocessors);

/* Device `ordinal`'s PCI address, "domain:bus:device.function" as sysfs
 * names it (lower case), into out[size].  Returns 0 or the driver's error
 * (CUDA_ERROR_NOT_SUPPORTED, 801, when the driver lacks cuDeviceGetPCIBusId). */
fl_cu_result fl_cuda_pci_bus_id(const fl_cuda *cuda, int ordinal, char *out, int size);

/* The driver's name for an error code ("CUDA_ERROR_OUT_OF_MEMORY: out of
 * memory" style), or a generic text when the driver cannot say. */
const char *fl_cuda_error_string(const fl_cuda *cuda, fl_cu_result error);

#endif /* FL_CUDA_H */
