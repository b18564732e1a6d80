/* fastload core: JPEG decoding of a region, optionally scaled down in the
 * DCT domain, with libjpeg-turbo.
 *
 * A decoder decodes only the rows and iMCU columns that cover the requested
 * box, at 1/1, 1/2, 1/4 or 1/8 size, and hands back RGB pixels plus where
 * the box lies in them; fl_resample (resample.h) takes it from there.
 * Grayscale becomes RGB, and CMYK/YCCK becomes RGB the way Pillow's
 * Image.open(f).convert("RGB") does (Adobe-inverted CMYK, as Pillow
 * assumes for every CMYK JPEG).
 *
 * Threads: a decoder is not thread-safe; give each worker thread its own.
 * Nothing here takes a lock, prints, or needs the GIL; libjpeg's errors are
 * caught inside each call and returned as a status and a message.
 *
 * Trust: the input bytes may be anything.  Declared sizes are checked
 * against max_pixels before any pixel memory is allocated, libjpeg's own
 * working memory is capped in proportion, and progressive files with an
 * absurd number of scans are refused.  Data that libjpeg would patch over
 * with a warning (truncation, corrupt entropy-coded data) is an error.
 * Only the data a region needs is examined: a baseline file damaged below
 * the requested rows (or, in a file with restart markers, outside the
 * intervals that cover the box) decodes without complaint.
 *
 * Files with restart markers every k MCUs, k dividing the MCUs of a row
 * (fastload.add_restart_markers writes them; jpeg_restart.h), decode a
 * region from the intervals that cover it only, cut out as a JPEG of their
 * own: the pixels are the same, the rows above and the columns beside the
 * box are not entropy-decoded.
 */
#ifndef FL_JPEG_H
#define FL_JPEG_H

#include <stddef.h>
#include <stdint.h>

/* One per worker thread; not thread-safe. */
typedef struct fl_jpeg fl_jpeg;

/* Makes a new decoder in *out.  Returns FL_OK, or with *out NULL and a
 * one-line message in msg:
 *   FL_ERR_NOMEM    out of memory
 *   FL_ERR_INVALID  libjpeg refused to make one: the library loaded is not of
 *                   the ABI of the jpeglib.h fastload was compiled with (the
 *                   message is libjpeg's own, "Wrong JPEG library version:
 *                   library is 80, caller expects 62", or its struct-size
 *                   twin). */
int fl_jpeg_new(fl_jpeg **out, char *msg, size_t msg_size);

/* Frees a decoder and its pixel buffer.  NULL is allowed. */
void fl_jpeg_free(fl_jpeg *dec);

typedef struct fl_jpeg_header {
    int width, height; /* full-resolution pixels */
    int components;    /* 1 (gray), 3 (YCbCr or RGB), 4 (CMYK or YCCK) */
    int progressive;   /* nonzero for a progressive (multi-scan) file */
} fl_jpeg_header;

/* Reads only the header of the JPEG in data[0 .. size).  Returns FL_OK and
 * fills *out, or FL_ERR_DECODE with a one-line message in msg (which may be
 * NULL when msg_size is 0; the message is always NUL-terminated). */
int fl_jpeg_read_header(fl_jpeg *dec, const unsigned char *data, size_t size,
                        fl_jpeg_header *out, char *msg, size_t msg_size);

typedef struct fl_jpeg_region {
    int x, y, width, height; /* crop box in full-resolution pixels: inside the
                                image, width and height >= 1 */
    int scale_denom;         /* 1, 2, 4 or 8: decode at 1/scale_denom size
                                (DCT-domain scaling) */
} fl_jpeg_region;            /* a NULL region means the whole image at full size */

typedef struct fl_pixels {
    const unsigned char *data; /* RGB, 3 bytes a pixel; owned by the decoder and
                                  valid until its next decode or free */
    int width, height;         /* of the decoded buffer */
    size_t stride;             /* bytes from one row to the next */
    double box_x, box_y;       /* the requested crop box in this buffer's (scaled)
                                  pixel coordinates: the box divided by */
    double box_w, box_h;       /* scale_denom, shifted by the buffer's origin */
} fl_pixels;

/* Decodes the part of the JPEG in data[0 .. size) that covers `region`, at
 * 1/scale_denom size.  The buffer spans the box's rows exactly (at the
 * scaled size: floor(y / d) to ceil((y + height) / d)) and its columns
 * widened to iMCU boundaries plus a little, so that chroma upsampling at
 * the box's edges sees real neighbours; the box is reported relative to it.
 * At scale 1/d the whole image would be ceil(W / d) x ceil(H / d) pixels.
 *
 * Images of more than max_pixels pixels (width * height at full size) are
 * refused before any pixel buffer is allocated.  The pixel buffer is kept
 * and only grows.
 *
 * Returns FL_OK and fills *out, or, with a one-line message in msg:
 *   FL_ERR_DECODE   not a JPEG, corrupt or truncated data, unsupported kind
 *   FL_ERR_TOO_BIG  more than max_pixels pixels
 *   FL_ERR_INVALID  region outside the image, or scale_denom not 1, 2, 4, 8
 *   FL_ERR_NOMEM    out of memory */
int fl_jpeg_decode(fl_jpeg *dec, const unsigned char *data, size_t size,
                   const fl_jpeg_region *region, uint64_t max_pixels, fl_pixels *out,
                   char *msg, size_t msg_size);

/* Nonzero when the JPEG in data[0 .. size) has an end-of-image marker after
 * its first scan.  A region decode stops reading after the box's last row,
 * so a truncated file would otherwise pass whenever the box lies above the
 * cut; this finds the truncation in O(1) for complete files (the marker is
 * at the end) without decoding anything.  Segments before the scan are
 * skipped by their lengths, so an EXIF thumbnail's marker does not count. */
int fl_jpeg_complete(const unsigned char *data, size_t size);

/* The largest d in {8, 4, 2, 1} with crop_w / d >= out_w and crop_h / d >=
 * out_h, checked exactly (crop_w >= out_w * d): the most DCT-domain
 * shrinking that still leaves the resize shrinking, never enlarging.
 * Returns 1 for sizes below 1. */
int fl_jpeg_pick_scale(int crop_w, int crop_h, int out_w, int out_h);

#endif /* FL_JPEG_H */
