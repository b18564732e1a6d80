/* fastload core: a region of a JPEG with restart markers, cut out as a
 * smaller JPEG of its own (no libjpeg, bytes only).
 *
 * Huffman-coded data has no random access: a region decode still
 * entropy-decodes every row above the region, across the whole width.  But
 * in a single-scan (baseline or extended sequential) file whose restart
 * interval k divides the MCUs of a row, every interval is self-contained:
 * the DC predictors reset at it and it starts on a byte.  A region then
 * needs only the intervals that cover it; those intervals, renumbered, after
 * the file's own tables and a frame header declaring the covering rectangle,
 * make a JPEG that decodes to exactly the pixels of the whole image there —
 * except near the rectangle's edges inside the image, where chroma
 * upsampling would blend with neighbours the cut file lacks.  The caller
 * asks for a margin around the box for that.  fastload.add_restart_markers
 * (jpeg_transcode.h) writes such files losslessly.
 *
 * Threads: a state is not thread-safe; one per decoder.
 * Trust: the input bytes may be anything; this only reads inside them and
 * declines (returns 0) whatever it does not recognise, leaving the file to
 * the ordinary decode, which reports errors as usual.
 */
#ifndef FL_JPEG_RESTART_H
#define FL_JPEG_RESTART_H

#include <stddef.h>

/* Reused buffers: the interval offsets and the cut-out JPEG.  Zero it to
 * start; fl_jpeg_restart_release frees what it holds. */
typedef struct fl_jpeg_restart {
    size_t *starts;        /* owned: where each interval's data starts */
    size_t starts_cap;     /* entries */
    unsigned char *buf;    /* owned: the cut-out JPEG */
    size_t buf_cap;        /* bytes */
} fl_jpeg_restart;

void fl_jpeg_restart_release(fl_jpeg_restart *st);

typedef struct fl_jpeg_cut {
    const unsigned char *data; /* the cut-out JPEG, in st->buf: valid until the
                                  next call on st */
    size_t size;
    int x, y;                  /* its origin in the image, full-size pixels
                                  (multiples of the MCU size) */
    int width, height;         /* its size */
    int image_width, image_height; /* the whole image's */
} fl_jpeg_cut;

/* Cuts out of the JPEG in data[0 .. size) the restart intervals that cover
 * the box (x, y, w, h) widened by `margin` full-size pixels on each side
 * (clipped to the image).  Returns
 *   1             *out describes the cut-out JPEG;
 *   0             no usable layout (not single-scan Huffman, no restart
 *                 interval or one that does not divide the MCUs of a row,
 *                 markers not where the layout says, no end-of-image
 *                 marker, the box not inside the image), or cutting would
 *                 save under a tenth of the entropy decoding: decode the
 *                 original;
 *   FL_ERR_NOMEM  out of memory (nothing in *out). */
int fl_jpeg_restart_cut(fl_jpeg_restart *st, const unsigned char *data, size_t size, int x,
                        int y, int w, int h, int margin, fl_jpeg_cut *out);

#endif /* FL_JPEG_RESTART_H */
