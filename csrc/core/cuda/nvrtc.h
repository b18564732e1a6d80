/* fastload core: NVRTC, opened at run time, and kernels compiled by it.
 *
 * libnvrtc is found by library.h's order ($FASTLOAD_LIBNVRTC, a copy
 * already loaded, the folders fastload's Python side passes, the sonames)
 * and resolved by name; no CUDA header is used.  Kernels are compiled to
 * PTX for the device's own virtual architecture (compute_XY, from the
 * driver) and loaded with cuModuleLoadData, which JIT-compiles the PTX for
 * the GPU.  `--fmad=false` keeps each a*b+c two rounded operations, as the
 * CPU path computes them, so the GPU's pixels match the CPU's.
 */
#ifndef FL_CUDA_NVRTC_H
#define FL_CUDA_NVRTC_H

#include <stddef.h>

#include "core/cuda/cuda.h"

typedef int fl_nvrtc_result;  /* nvrtcResult: 0 is NVRTC_SUCCESS */
typedef void *fl_nvrtc_program; /* nvrtcProgram */
#define FL_NVRTC_ERROR_COMPILATION 6

typedef struct fl_nvrtc {
    const char *(*get_error_string)(fl_nvrtc_result result);
    fl_nvrtc_result (*version)(int *major, int *minor);
    fl_nvrtc_result (*create_program)(fl_nvrtc_program *program, const char *source,
                                      const char *name, int header_count,
                                      const char *const *headers,
                                      const char *const *include_names);
    fl_nvrtc_result (*destroy_program)(fl_nvrtc_program *program);
    fl_nvrtc_result (*compile_program)(fl_nvrtc_program program, int option_count,
                                       const char *const *options);
    fl_nvrtc_result (*get_ptx_size)(fl_nvrtc_program program, size_t *bytes);
    fl_nvrtc_result (*get_ptx)(fl_nvrtc_program program, char *ptx);
    fl_nvrtc_result (*get_program_log_size)(fl_nvrtc_program program, size_t *bytes);
    fl_nvrtc_result (*get_program_log)(fl_nvrtc_program program, char *log);
    char path[1024]; /* the file loaded */
    int version_major, version_minor;
} fl_nvrtc;

/* Opens libnvrtc once per process (thread-safe; the first caller's
 * `folders`, NULL-terminated or NULL, are the candidates).  Returns it, or
 * NULL with the reason in *why (static text). */
const fl_nvrtc *fl_nvrtc_get(const char *const *folders, const char **why);

/* NVRTC's name for a result ("NVRTC_ERROR_COMPILATION"). */
const char *fl_nvrtc_result_string(const fl_nvrtc *lib, fl_nvrtc_result result);

/* The options fl_nvrtc_compile_ptx passes for compute capability
 * major.minor, written into `options` (`count` slots, at least
 * FL_NVRTC_MAX_OPTIONS) with their text in `architecture`.  Returns how
 * many. */
#define FL_NVRTC_MAX_OPTIONS 4
int fl_nvrtc_options(int major, int minor, char *architecture, size_t architecture_size,
                     const char **options, int count);

/* Compiles `source` (named `name` in messages) to PTX for compute
 * capability major.minor.  Returns 0 with *ptx (malloc'd, NUL-terminated;
 * the caller frees), or -1 with *error (malloc'd, or NULL when out of
 * memory): NVRTC's result and, for a compilation error, the program log. */
int fl_nvrtc_compile_ptx(const fl_nvrtc *lib, const char *source, const char *name, int major,
                         int minor, char **ptx, char **error);

/* The kernel `kernel` (an extern "C" __global__ function) of `source` on
 * device `ordinal`: compiled and loaded once per process, source and device
 * (a table of modules, guarded by a mutex; the module lives until exit, as
 * the primary context does), then looked up.  The PTX is kept on disk in
 * $FASTLOAD_KERNEL_CACHE (default ~/.cache/fastload/kernels, "off" for
 * none), keyed by the source, the architecture and NVRTC's version, so a
 * later process loads it without compiling.  Call with the device's
 * context current.  Returns 0 with *function, or -1 with *error
 * (malloc'd, or NULL when out of memory; the caller frees). */
int fl_nvrtc_kernel(const fl_cuda *cuda, const fl_nvrtc *lib, int ordinal, const char *source,
                    const char *name, const char *kernel, fl_cu_function *function,
                    char **error);

#endif /* FL_CUDA_NVRTC_H */
