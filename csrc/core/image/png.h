/* fastload core: PNG decoding to RGB with libpng, pixel for pixel what
 * Pillow's Image.open(f).convert("RGB") gives.
 *
 * Every colour type and bit depth becomes 8-bit RGB by Pillow's rules
 * (png.c lists them); transparency (an alpha channel or a tRNS chunk) is
 * dropped, never composited, and gamma, colour profiles and the other
 * ancillary chunks are not applied, as Pillow's convert does not apply them.
 * Interlaced (Adam7) files are supported; of an animated PNG (APNG), the
 * default image is decoded, which is the first frame Pillow shows.
 *
 * Threads: a decoder is not thread-safe; give each worker thread its own.
 * Nothing here takes a lock, prints, or needs the GIL; libpng's errors are
 * caught inside each call and returned as a status and a message.
 *
 * Trust: the input bytes may be anything.  The declared size is checked
 * against max_pixels before any pixel memory is allocated.  Ancillary chunks
 * are skipped unread (no text or profile is decompressed); a CRC error in a
 * critical chunk, truncated or corrupt image data are errors.
 */
#ifndef FL_PNG_H
#define FL_PNG_H

#include <stddef.h>
#include <stdint.h>

/* One per worker thread; not thread-safe. */
typedef struct fl_png fl_png;

/* Returns a new decoder, or NULL when out of memory. */
fl_png *fl_png_new(void);

/* Frees a decoder and its buffers.  NULL is allowed. */
void fl_png_free(fl_png *dec);

/* Makes libpng's structs once and frees them: FL_OK when the libpng loaded
 * takes the version of the headers fastload was built with; FL_ERR_INVALID
 * with libpng's words in msg ("libpng cannot make a decoder: Application
 * built with libpng-1.5.30 but running with 1.6.39") when it refuses, as it
 * then refuses every image; FL_ERR_NOMEM when out of memory. */
int fl_png_check_library(char *msg, size_t msg_size);

/* Nonzero when the bytes start with the PNG signature. */
int fl_is_png(const unsigned char *data, size_t size);

/* Reads the chunks before the image data of the PNG in data[0 .. size) and
 * sets *width and *height.  Returns FL_OK, or FL_ERR_DECODE with a one-line
 * message in msg (always NUL-terminated when msg_size > 0). */
int fl_png_read_header(fl_png *dec, const unsigned char *data, size_t size, int *width,
                       int *height, char *msg, size_t msg_size);

/* Decodes the whole PNG into the decoder's RGB buffer (3 bytes a pixel,
 * rows `*stride` bytes apart; valid until the decoder's next decode or
 * free; it is kept and only grows).  Returns FL_OK, or with a message:
 *   FL_ERR_DECODE   not a PNG, corrupt or truncated data
 *   FL_ERR_INVALID  libpng refused to make a decoder (fl_png_check_library)
 *   FL_ERR_TOO_BIG  more than max_pixels pixels (refused before allocating)
 *   FL_ERR_NOMEM    out of memory */
int fl_png_decode(fl_png *dec, const unsigned char *data, size_t size, uint64_t max_pixels,
                  const unsigned char **rgb, int *width, int *height, size_t *stride, char *msg,
                  size_t msg_size);

#endif /* FL_PNG_H */
