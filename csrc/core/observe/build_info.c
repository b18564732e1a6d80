/* fastload core: build and run-time facts about libjpeg and the CPU. */
#define _GNU_SOURCE /* dladdr */
#include "core/observe/build_info.h"

#include "core/image/jpeg.h"
#include "core/image/png.h"
#include "core/image/webp.h"
#include "core/status.h"

#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h> /* jpeglib.h needs FILE and size_t */
#include <stdlib.h>

#include <jpeglib.h>
#include <png.h>
#include <webp/decode.h>

int fl_jpeg_lib_version(void)
{
    return JPEG_LIB_VERSION;
}

long fl_libjpeg_turbo_version(void)
{
#ifdef LIBJPEG_TURBO_VERSION_NUMBER
    return LIBJPEG_TURBO_VERSION_NUMBER;
#else
    return 0;
#endif
}

int fl_libjpeg_with_simd(void)
{
#ifdef WITH_SIMD
    return 1;
#else
    return 0;
#endif
}

/* The shared object that holds `fn`: any exported function of a library
 * will do, for the loader resolved it in the library that every other call
 * of this extension into it goes to. */
static const char *object_of(void *fn)
{
    Dl_info info;
    if (!dladdr(fn, &info) || !info.dli_fname || !info.dli_fname[0])
        return NULL;
    return info.dli_fname;
}

const char *fl_libjpeg_path(void)
{
    return object_of((void *)jpeg_std_error);
}

/* One library's refusal, worded for an ImportError: which file was loaded,
 * what the headers were, what to do. */
static void refusal(char *msg, size_t msg_size, const char *library, const char *path,
                    const char *why, const char *headers)
{
    char *real = path ? realpath(path, NULL) : NULL;
    fl_set_msg(msg, msg_size,
               "fastload cannot use the %s it loaded (%s): %s.  fastload was compiled against "
               "%s, and the dynamic loader found a %s of another ABI: rebuild fastload "
               "against the headers of the %s it loads (its development package), or make the "
               "%s those headers belong to the one found first (LD_LIBRARY_PATH)",
               library, real ? real : path ? path : "path unknown", why, headers, library,
               library, library);
    free(real);
}

int fl_check_image_libraries(char *msg, size_t msg_size)
{
    char why[512], headers[160];
    fl_jpeg *dec = NULL;
    int rc = fl_jpeg_new(&dec, why, sizeof why);
    fl_jpeg_free(dec);
    if (rc == FL_ERR_INVALID) {
        long turbo = fl_libjpeg_turbo_version();
        if (turbo)
            snprintf(headers, sizeof headers,
                     "the jpeglib.h of libjpeg-turbo %ld.%ld.%ld (JPEG_LIB_VERSION %d)",
                     turbo / 1000000, turbo / 1000 % 1000, turbo % 1000, JPEG_LIB_VERSION);
        else
            snprintf(headers, sizeof headers, "a jpeglib.h of JPEG_LIB_VERSION %d",
                     JPEG_LIB_VERSION);
        refusal(msg, msg_size, "libjpeg", fl_libjpeg_path(), why, headers);
        return rc;
    }
    if (rc == FL_OK) {
        rc = fl_png_check_library(why, sizeof why);
        if (rc == FL_ERR_INVALID)
            refusal(msg, msg_size, "libpng", object_of((void *)png_get_libpng_ver), why,
                    "the png.h of libpng " PNG_LIBPNG_VER_STRING);
    }
    if (rc == FL_OK) {
        rc = fl_webp_check_library(why, sizeof why);
        snprintf(headers, sizeof headers, "the webp/decode.h of decoder ABI 0x%04x",
                 WEBP_DECODER_ABI_VERSION);
        if (rc == FL_ERR_INVALID)
            refusal(msg, msg_size, "libwebp", object_of((void *)WebPGetDecoderVersion), why,
                    headers);
    }
    if (rc == FL_ERR_NOMEM)
        fl_set_msg(msg, msg_size, "%s", why);
    return rc;
}

int fl_cpu_simd_features(const char **names, int max)
{
    int count = 0;
#define FL_ADD(name)                                                                               \
    do {                                                                                           \
        if (count < max)                                                                           \
            names[count++] = (name);                                                               \
    } while (0)
#if defined(__x86_64__) || defined(__i386__)
    /* The instruction sets libjpeg-turbo's x86 SIMD code has kernels for. */
    __builtin_cpu_init();
    if (__builtin_cpu_supports("mmx"))
        FL_ADD("mmx");
    if (__builtin_cpu_supports("sse"))
        FL_ADD("sse");
    if (__builtin_cpu_supports("sse2"))
        FL_ADD("sse2");
    if (__builtin_cpu_supports("avx2"))
        FL_ADD("avx2");
#elif defined(__aarch64__)
    FL_ADD("neon"); /* part of every AArch64 CPU */
#endif
#undef FL_ADD
    return count;
}

const char *fl_libpng_version(void)
{
    return png_get_libpng_ver(NULL);
}

const char *fl_libpng_built_version(void)
{
    return PNG_LIBPNG_VER_STRING;
}

int fl_libwebp_version(void)
{
    return WebPGetDecoderVersion();
}
