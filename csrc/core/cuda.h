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
} fl_cuda;

/* Opens and initialises the driver once (thread-safe); later calls return
 * the same answer.  Returns the driver, or NULL with the reason in *why (a
 * static string: no library, a missing entry point, or cuInit's error). */
const fl_cuda *fl_cuda_get(const char **why);

/* The driver's name for an error code ("CUDA_ERROR_OUT_OF_MEMORY: out of
 * memory" style), or a generic text when the driver cannot say. */
const char *fl_cuda_error_string(const fl_cuda *cuda, fl_cu_result error);

#endif /* FL_CUDA_H */
