/* fastload core: WebP decoding to RGB with libwebp, pixel for pixel what
 * Pillow's Image.open(f).convert("RGB") gives.
 *
 * Lossy and lossless files, with or without alpha: the alpha channel is
 * dropped, never composited (as convert("RGB") drops it).  Of an animated
 * file, the first frame is decoded as Pillow shows it: on the canvas, which
 * is transparent black where the frame does not cover it.
 *
 * Threads: a decoder is not thread-safe; give each worker thread its own.
 * Nothing here takes a lock, prints, or needs the GIL.
 *
 * Trust: the input bytes may be anything.  The canvas size is checked
 * against max_pixels before any pixel memory is allocated.
 */
#ifndef FL_WEBP_H
#define FL_WEBP_H

#include <stddef.h>
#include <stdint.h>

/* One per worker thread; not thread-safe. */
typedef struct fl_webp fl_webp;

/* Returns a new decoder, or NULL when out of memory. */
fl_webp *fl_webp_new(void);

/* Frees a decoder and its buffer.  NULL is allowed. */
void fl_webp_free(fl_webp *dec);

/* FL_OK when the libwebp loaded takes the decoder ABI of the headers
 * fastload was built with (WebPInitDecoderConfig accepts it); else
 * FL_ERR_INVALID with a message, as it then refuses every image. */
int fl_webp_check_library(char *msg, size_t msg_size);

/* Nonzero when the bytes start like a WebP file ("RIFF", size, "WEBP"). */
int fl_is_webp(const unsigned char *data, size_t size);

/* Reads the headers of the WebP in data[0 .. size) and sets *width and
 * *height (the canvas).  Returns FL_OK, or FL_ERR_DECODE with a one-line
 * message in msg (always NUL-terminated when msg_size > 0). */
int fl_webp_read_header(const unsigned char *data, size_t size, int *width, int *height,
                        char *msg, size_t msg_size);

/* Decodes the WebP (its first frame) into the decoder's RGB buffer (3 bytes
 * a pixel, rows `*stride` bytes apart; valid until the decoder's next decode
 * or free; it is kept and only grows).  Returns FL_OK, or with a message:
 *   FL_ERR_DECODE   not a WebP, corrupt or truncated data, unsupported
 *   FL_ERR_INVALID  libwebp refuses our decoder ABI (fl_webp_check_library)
 *   FL_ERR_TOO_BIG  more than max_pixels pixels (refused before allocating)
 *   FL_ERR_NOMEM    out of memory */
int fl_webp_decode(fl_webp *dec, const unsigned char *data, size_t size, uint64_t max_pixels,
                   const unsigned char **rgb, int *width, int *height, size_t *stride, char *msg,
                   size_t msg_size);

#endif /* FL_WEBP_H */
