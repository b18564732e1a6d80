/* fastload core: see nvrtc.h. */
#define _GNU_SOURCE
#include "core/cuda/nvrtc.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/cuda/library.h"

/* ---- Loading ------------------------------------------------------------ */

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER; /* guards all below */
static int attempted;
static fl_nvrtc library;
static const fl_nvrtc *loaded;
static char failure[1400];

static const struct {
    const char *name;
    size_t offset;
} entry_points[] = {
    {"nvrtcGetErrorString", offsetof(fl_nvrtc, get_error_string)},
    {"nvrtcVersion", offsetof(fl_nvrtc, version)},
    {"nvrtcCreateProgram", offsetof(fl_nvrtc, create_program)},
    {"nvrtcDestroyProgram", offsetof(fl_nvrtc, destroy_program)},
    {"nvrtcCompileProgram", offsetof(fl_nvrtc, compile_program)},
    {"nvrtcGetPTXSize", offsetof(fl_nvrtc, get_ptx_size)},
    {"nvrtcGetPTX", offsetof(fl_nvrtc, get_ptx)},
    {"nvrtcGetProgramLogSize", offsetof(fl_nvrtc, get_program_log_size)},
    {"nvrtcGetProgramLog", offsetof(fl_nvrtc, get_program_log)},
};

static const char *const sonames[] = {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so", NULL};

static void load(const char *const *folders)
{
    char why[1200];
    void *lib = fl__cuda_library_open("FASTLOAD_LIBNVRTC", sonames, folders,
                                      "nvrtcCompileProgram", library.path, sizeof library.path,
                                      why, sizeof why);
    if (!lib) {
        snprintf(failure, sizeof failure, "NVRTC is not available: %s", why);
        return;
    }
    for (size_t i = 0; i < sizeof entry_points / sizeof entry_points[0]; i++) {
        void *fn = dlsym(lib, entry_points[i].name);
        if (!fn) {
            snprintf(failure, sizeof failure, "NVRTC %s has no %s", library.path,
                     entry_points[i].name);
            dlclose(lib);
            return;
        }
        *(void **)((char *)&library + entry_points[i].offset) = fn;
    }
    if (library.version(&library.version_major, &library.version_minor) != 0)
        library.version_major = library.version_minor = -1;
    loaded = &library;
}

const fl_nvrtc *fl_nvrtc_get(const char *const *folders, const char **why)
{
    pthread_mutex_lock(&lock);
    if (!attempted) {
        attempted = 1;
        load(folders);
    }
    const fl_nvrtc *result = loaded;
    pthread_mutex_unlock(&lock);
    if (!result && why)
        *why = failure;
    return result;
}

const char *fl_nvrtc_result_string(const fl_nvrtc *lib, fl_nvrtc_result result)
{
    const char *text = lib ? lib->get_error_string(result) : NULL;
    return text ? text : "NVRTC_ERROR_UNKNOWN";
}

/* ---- Compiling ---------------------------------------------------------- */

/* A malloc'd message (NULL when out of memory). */
static char *message(const char *format, ...)
{
    va_list args;
    va_start(args, format);
    int n = vsnprintf(NULL, 0, format, args);
    va_end(args);
    char *text = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (text) {
        va_start(args, format);
        vsnprintf(text, (size_t)n + 1, format, args);
        va_end(args);
    }
    return text;
}

int fl_nvrtc_options(int major, int minor, char *architecture, size_t architecture_size,
                     const char **options, int count)
{
    if (count < FL_NVRTC_MAX_OPTIONS)
        return 0;
    snprintf(architecture, architecture_size, "--gpu-architecture=compute_%d%d", major, minor);
    options[0] = architecture;
    options[1] = "--fmad=false";
    return 2;
}

int fl_nvrtc_compile_ptx(const fl_nvrtc *lib, const char *source, const char *name, int major,
                         int minor, char **ptx, char **error)
{
    *ptx = NULL;
    *error = NULL;
    fl_nvrtc_program program = NULL;
    char *log = NULL;
    int status = -1;
    char architecture[64];
    const char *options[FL_NVRTC_MAX_OPTIONS];
    int option_count = fl_nvrtc_options(major, minor, architecture, sizeof architecture,
                                        options, FL_NVRTC_MAX_OPTIONS);

    fl_nvrtc_result rc = lib->create_program(&program, source, name, 0, NULL, NULL);
    if (rc != 0) {
        program = NULL;
        *error = message("nvrtcCreateProgram(%s) failed: %s", name,
                         fl_nvrtc_result_string(lib, rc));
        goto bailout;
    }
    rc = lib->compile_program(program, option_count, options);
    if (rc != 0) {
        size_t log_size = 0;
        if (lib->get_program_log_size(program, &log_size) == 0 && log_size > 0 &&
            (log = malloc(log_size + 1)) != NULL) {
            if (lib->get_program_log(program, log) != 0)
                log[0] = '\0';
            log[log_size] = '\0';
        }
        *error = message("nvrtcCompileProgram(%s, %s) failed: %s%s%s", name, architecture,
                         fl_nvrtc_result_string(lib, rc), log && *log ? "\n" : "",
                         log ? log : "");
        goto bailout;
    }
    size_t size = 0;
    rc = lib->get_ptx_size(program, &size);
    if (rc == 0 && (*ptx = malloc(size + 1)) == NULL) {
        *error = message("fl_nvrtc_compile_ptx: out of memory (%zu bytes of PTX)", size);
        goto bailout;
    }
    if (rc == 0)
        rc = lib->get_ptx(program, *ptx);
    if (rc != 0) {
        *error = message("nvrtcGetPTX(%s) failed: %s", name, fl_nvrtc_result_string(lib, rc));
        goto bailout;
    }
    (*ptx)[size] = '\0'; /* the size counts NVRTC's terminator; keep one regardless */
    status = 0;
bailout:
    if (status != 0) {
        free(*ptx);
        *ptx = NULL;
    }
    free(log);
    if (program)
        lib->destroy_program(&program);
    return status;
}

/* ---- Loaded modules ----------------------------------------------------- */

/* One module per (device, source), kept for the life of the process: a
 * kernel's CUfunction stays valid while its module is loaded, and callers
 * hold functions without references.  Guarded by modules_lock, held across
 * the compile so two threads never compile the same source twice. */
#define MAX_MODULES 32
static pthread_mutex_t modules_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    int ordinal;
    uint64_t hash;       /* FNV-1a of the source */
    size_t source_bytes;
    fl_cu_module module;
} modules[MAX_MODULES];
static int module_count;

static uint64_t fnv1a(const char *text, size_t bytes)
{
    uint64_t hash = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < bytes; i++)
        hash = (hash ^ (unsigned char)text[i]) * 0x100000001b3ULL;
    return hash;
}

/* ---- The PTX cache on disk -------------------------------------------- */

/* A compile costs NVRTC's start-up and the compile itself (hundreds of
 * milliseconds) in every process; the PTX is kept in
 * $FASTLOAD_KERNEL_CACHE (default ~/.cache/fastload/kernels; "off"
 * disables it), one file per source, architecture and NVRTC version, named
 * by all three (and the source's length and a format number that changes
 * with the options).  The cache is only a shortcut: a file that cannot be
 * read, written or loaded means a compile, never an error. */
#define PTX_CACHE_FORMAT 1

static char *cache_path(const fl_nvrtc *lib, uint64_t hash, size_t bytes, int major, int minor,
                        int create)
{
    const char *folder = getenv("FASTLOAD_KERNEL_CACHE");
    char *made = NULL;
    if (folder && strcmp(folder, "off") == 0)
        return NULL;
    if (!folder || !*folder) {
        const char *home = getenv("HOME");
        if (!home || !*home)
            return NULL;
        made = message("%s/.cache/fastload/kernels", home);
        if (!made)
            return NULL;
        if (create) { /* each level; an existing one is fine */
            char *cache = message("%s/.cache", home);
            char *fastload = message("%s/.cache/fastload", home);
            if (cache)
                mkdir(cache, 0755);
            if (fastload)
                mkdir(fastload, 0755);
            free(cache);
            free(fastload);
        }
        folder = made;
    }
    if (create)
        mkdir(folder, 0755);
    char *path = message("%s/v%d-%016llx-%zu-compute_%d%d-nvrtc%d.%d.ptx", folder,
                         PTX_CACHE_FORMAT, (unsigned long long)hash, bytes, major, minor,
                         lib->version_major, lib->version_minor);
    free(made);
    return path;
}

/* The cached PTX (malloc'd), or NULL. */
static char *cache_read(const char *path)
{
    FILE *file = path ? fopen(path, "rb") : NULL;
    char *ptx = NULL;
    long size = -1;
    if (file && fseek(file, 0, SEEK_END) == 0)
        size = ftell(file);
    if (size > 0 && size < (64L << 20) && fseek(file, 0, SEEK_SET) == 0 &&
        (ptx = malloc((size_t)size + 1)) != NULL) {
        if (fread(ptx, 1, (size_t)size, file) != (size_t)size || memchr(ptx, 0, (size_t)size)) {
            free(ptx);
            ptx = NULL;
        } else {
            ptx[size] = '\0';
        }
    }
    if (file)
        fclose(file);
    return ptx;
}

/* Writes `ptx` to `path` through a temporary file renamed into place, so a
 * reader never sees half a file. */
static void cache_write(const char *path, const char *ptx)
{
    char *temporary = path ? message("%s.%ld.tmp", path, (long)getpid()) : NULL;
    FILE *file = temporary ? fopen(temporary, "wb") : NULL;
    if (file) {
        size_t size = strlen(ptx);
        int ok = fwrite(ptx, 1, size, file) == size;
        ok &= fclose(file) == 0;
        if (!ok || rename(temporary, path) != 0)
            unlink(temporary);
    }
    free(temporary);
}

static fl_cu_module find_or_load(const fl_cuda *cuda, const fl_nvrtc *lib, int ordinal,
                                 const char *source, const char *name, char **error)
{
    size_t bytes = strlen(source);
    uint64_t hash = fnv1a(source, bytes);
    for (int i = 0; i < module_count; i++)
        if (modules[i].ordinal == ordinal && modules[i].hash == hash &&
            modules[i].source_bytes == bytes)
            return modules[i].module;
    if (module_count == MAX_MODULES) {
        *error = message("fl_nvrtc_kernel: more than %d kernel sources", MAX_MODULES);
        return NULL;
    }
    int major = 0, minor = 0;
    fl_cu_result rc = fl_cuda_device_info(cuda, ordinal, &major, &minor, NULL);
    if (rc != 0) {
        *error = message("cuDeviceGetAttribute (compute capability) on cuda:%d failed: %s",
                         ordinal, fl_cuda_error_string(cuda, rc));
        return NULL;
    }
    fl_cu_module module = NULL;
    char *path = cache_path(lib, hash, bytes, major, minor, 0);
    char *ptx = cache_read(path);
    if (ptx && cuda->module_load_data(&module, ptx) != 0)
        module = NULL; /* stale or damaged: compile again, and replace it */
    free(ptx);
    ptx = NULL;
    if (!module) {
        if (fl_nvrtc_compile_ptx(lib, source, name, major, minor, &ptx, error) != 0) {
            free(path);
            return NULL;
        }
        rc = cuda->module_load_data(&module, ptx);
        if (rc == 0 && path) {
            free(path);
            path = cache_path(lib, hash, bytes, major, minor, 1);
            cache_write(path, ptx);
        }
        free(ptx);
    }
    free(path);
    if (rc != 0) {
        /* CUDA_ERROR_UNSUPPORTED_PTX_VERSION (222): NVRTC newer than the driver. */
        *error = message("cuModuleLoadData(%s) on cuda:%d failed: %s (NVRTC %d.%d)", name,
                         ordinal, fl_cuda_error_string(cuda, rc), lib->version_major,
                         lib->version_minor);
        return NULL;
    }
    modules[module_count].ordinal = ordinal;
    modules[module_count].hash = hash;
    modules[module_count].source_bytes = bytes;
    modules[module_count].module = module;
    module_count++;
    return module;
}

int fl_nvrtc_kernel(const fl_cuda *cuda, const fl_nvrtc *lib, int ordinal, const char *source,
                    const char *name, const char *kernel, fl_cu_function *function,
                    char **error)
{
    *function = NULL;
    *error = NULL;
    const char *missing = fl_cuda_kernels_missing(cuda);
    if (missing) {
        *error = message("the CUDA driver has no %s: too old to run kernels", missing);
        return -1;
    }
    pthread_mutex_lock(&modules_lock);
    fl_cu_module module = find_or_load(cuda, lib, ordinal, source, name, error);
    pthread_mutex_unlock(&modules_lock);
    if (!module)
        return -1;
    fl_cu_result rc = cuda->module_get_function(function, module, kernel);
    if (rc != 0) {
        *function = NULL;
        *error = message("cuModuleGetFunction(%s) failed: %s", kernel,
                         fl_cuda_error_string(cuda, rc));
        return -1;
    }
    return 0;
}
