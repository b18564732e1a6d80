/* fastload core: what the extension was built against and what it runs on,
 * for `python -m fastload` (the first thing to paste into a bug report). */
#ifndef FL_BUILD_INFO_H
#define FL_BUILD_INFO_H

#include <stddef.h>

/* JPEG_LIB_VERSION of the jpeglib.h fastload was compiled with: the libjpeg
 * API it speaks (62 for libjpeg 6b, 80 for libjpeg 8). */
int fl_jpeg_lib_version(void);

/* LIBJPEG_TURBO_VERSION_NUMBER of that header (2001005 for 2.1.5), or 0 when
 * the header is not libjpeg-turbo's. */
long fl_libjpeg_turbo_version(void);

/* 1 when that libjpeg-turbo was configured with SIMD (WITH_SIMD), else 0. */
int fl_libjpeg_with_simd(void);

/* Path of the shared object that holds the libjpeg in use (as the dynamic
 * loader found it), or NULL when it cannot be told (linked statically).  The
 * string belongs to the loader and lives as long as the library stays
 * loaded. */
const char *fl_libjpeg_path(void);

/* Makes (and frees) a JPEG decoder, a libpng read struct and a WebP decoder
 * configuration, as every image will: FL_OK when each library loaded takes
 * the ABI of the headers fastload was compiled with.  FL_ERR_INVALID when
 * one refuses, with a message for an ImportError in msg: the library's own
 * words ("Wrong JPEG library version: library is 80, caller expects 62"),
 * the file the dynamic loader found, the headers built with and what to do.
 * FL_ERR_NOMEM when out of memory. */
int fl_check_image_libraries(char *msg, size_t msg_size);

/* The libpng fastload runs with ("1.6.39"; the string is libpng's), and
 * the one it was built with. */
const char *fl_libpng_version(void);
const char *fl_libpng_built_version(void);

/* The libwebp decoder fastload runs with, as 0xMMmmrr (WebPGetDecoderVersion). */
int fl_libwebp_version(void);

/* Fills `names` with up to `max` static names of the SIMD instruction sets
 * this CPU supports that libjpeg-turbo can use ("sse2", "avx2", "neon");
 * returns how many. */
int fl_cpu_simd_features(const char **names, int max);

#endif /* FL_BUILD_INFO_H */
