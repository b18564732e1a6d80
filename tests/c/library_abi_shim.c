/* An LD_PRELOAD shim that makes the image libraries in use look like ones
 * of another ABI, for tests/test_library_mismatch.py.
 *
 * Each library checks, when a decoder is made, the version of the headers
 * its caller was compiled with, which the caller passes in:
 * jpeg_CreateDecompress (what jpeg_create_decompress expands to) gets
 * JPEG_LIB_VERSION, png_create_read_struct PNG_LIBPNG_VER_STRING, and
 * WebPInitDecoderConfigInternal (behind the inline WebPInitDecoderConfig)
 * WEBP_DECODER_ABI_VERSION.  While FL_TEST_JPEG_VERSION, FL_TEST_PNG_VERSION
 * or FL_TEST_WEBP_ABI is set in the environment (read at each call, so a
 * process can turn it on after import), the shim forwards the call to the
 * real library with that version instead, and the library refuses with its
 * own error ("Wrong JPEG library version: library is 62, caller expects
 * 80"): what a build against one library's headers meets when the dynamic
 * loader finds another.  Otherwise calls are forwarded unchanged.
 * fl_test_calls_<function> counts the calls of each, so a test can tell
 * whether the shim interposed at all.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stddef.h>
#include <stdlib.h>

#define EXPORT __attribute__((visibility("default")))

EXPORT int fl_test_calls_jpeg_CreateDecompress;
EXPORT int fl_test_calls_png_create_read_struct;
EXPORT int fl_test_calls_WebPInitDecoderConfigInternal;

typedef struct lookup {
    const char *name;
    void *self; /* the shim's own function of that name, to skip */
    void *found;
} lookup;

/* RTLD_NEXT searches only the global scope, and Python loads extensions
 * with RTLD_LOCAL, so libraries that came in with the extension (a wheel's,
 * under mangled names) are found by asking each loaded object in turn. */
static int find_in(struct dl_phdr_info *info, size_t size, void *arg)
{
    (void)size;
    lookup *l = arg;
    void *handle = dlopen(info->dlpi_name && info->dlpi_name[0] ? info->dlpi_name : NULL,
                          RTLD_LAZY | RTLD_NOLOAD);
    if (!handle)
        return 0;
    void *fn = dlsym(handle, l->name);
    dlclose(handle);
    if (!fn || fn == l->self)
        return 0;
    l->found = fn;
    return 1;
}

/* The real function `name`, resolved once into *cache (worker threads may
 * race here, hence the atomics), counting the call in *calls; aborts when
 * there is none. */
static void *real(void **cache, const char *name, void *self, int *calls)
{
    __atomic_fetch_add(calls, 1, __ATOMIC_RELAXED);
    void *fn = __atomic_load_n(cache, __ATOMIC_ACQUIRE);
    if (fn)
        return fn;
    fn = dlsym(RTLD_NEXT, name);
    if (!fn || fn == self) {
        lookup l = {name, self, NULL};
        dl_iterate_phdr(find_in, &l);
        fn = l.found;
    }
    if (!fn)
        abort(); /* nothing to forward to */
    __atomic_store_n(cache, fn, __ATOMIC_RELEASE);
    return fn;
}

static const char *fake(const char *variable)
{
    const char *value = getenv(variable);
    return value && *value ? value : NULL;
}

typedef void (*jpeg_create_fn)(void *cinfo, int version, size_t structsize);
typedef void *(*png_create_fn)(const char *user_png_ver, void *error_ptr, void *error_fn,
                               void *warn_fn);
typedef int (*webp_init_fn)(void *config, int version);

EXPORT void jpeg_CreateDecompress(void *cinfo, int version, size_t structsize)
{
    static void *cache;
    jpeg_create_fn fn = (jpeg_create_fn)real(&cache, __func__, (void *)jpeg_CreateDecompress,
                                             &fl_test_calls_jpeg_CreateDecompress);
    const char *version_text = fake("FL_TEST_JPEG_VERSION");
    fn(cinfo, version_text ? atoi(version_text) : version, structsize);
}

EXPORT void *png_create_read_struct(const char *user_png_ver, void *error_ptr, void *error_fn,
                                    void *warn_fn)
{
    static void *cache;
    png_create_fn fn = (png_create_fn)real(&cache, __func__, (void *)png_create_read_struct,
                                           &fl_test_calls_png_create_read_struct);
    const char *version_text = fake("FL_TEST_PNG_VERSION");
    return fn(version_text ? version_text : user_png_ver, error_ptr, error_fn, warn_fn);
}

EXPORT int WebPInitDecoderConfigInternal(void *config, int version)
{
    static void *cache;
    webp_init_fn fn = (webp_init_fn)real(&cache, __func__, (void *)WebPInitDecoderConfigInternal,
                                         &fl_test_calls_WebPInitDecoderConfigInternal);
    const char *version_text = fake("FL_TEST_WEBP_ABI");
    return fn(config, version_text ? (int)strtol(version_text, NULL, 0) : version);
}
