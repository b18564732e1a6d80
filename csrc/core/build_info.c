/* fastload core: build and run-time facts about libjpeg and the CPU. */
#define _GNU_SOURCE /* dladdr */
#include "build_info.h"

#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h> /* jpeglib.h needs FILE and size_t */

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

const char *fl_libjpeg_path(void)
{
    /* Any exported libjpeg function will do: the loader resolved it in the
     * library that every other jpeg_* call of this extension goes to. */
    Dl_info info;
    if (!dladdr((void *)jpeg_std_error, &info) || !info.dli_fname || !info.dli_fname[0])
        return NULL;
    return info.dli_fname;
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
