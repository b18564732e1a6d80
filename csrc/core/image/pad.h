/* fastload core: RandomCrop with padding — a window of whole pixels that
 * may reach past the image's edges, filled as torchvision's F.pad fills
 * them (a constant, the edge pixel, a reflection without or with the edge
 * pixel repeated).
 *
 * Every mode but constant maps each coordinate of the padded image back to
 * one source pixel, separately per axis, so the window is built straight
 * from the decoded pixels: no padded image is ever made.  torchvision's
 * RandomCrop (v1) pads twice when both `padding` and `pad_if_needed` apply
 * (the second pad reflects the first one's result); v2 pads once by the
 * summed amounts.  Both are expressed as up to two stages per axis.
 */
#ifndef FL_PAD_H
#define FL_PAD_H

#include "core/image/rng.h"

#include <stddef.h>

/* torchvision's padding_mode names, in this order. */
enum { FL_PAD_CONSTANT = 0, FL_PAD_EDGE = 1, FL_PAD_REFLECT = 2, FL_PAD_SYMMETRIC = 3 };

/* RandomCrop's parameters. */
typedef struct fl_pad_plan {
    int left, top, right, bottom; /* `padding`, each >= 0 */
    int if_needed;                /* 1: pad a side shorter than the crop up to it */
    int once;                     /* 1: one pad by the summed amounts (v2); 0: the
                                     padding, then the pad_if_needed pad (v1) */
    int mode;                     /* FL_PAD_* */
    unsigned char fill[3];        /* RGB of FL_PAD_CONSTANT */
} fl_pad_plan;

/* One axis of the padded image: stage 1 pads `before1`/`after1`, stage 2
 * pads `before2`/`after2` around stage 1's result. */
typedef struct fl_pad_axis {
    int n;                  /* source pixels */
    int before1, after1;    /* stage 1 */
    int before2, after2;    /* stage 2 (0 when there is none) */
} fl_pad_axis;

/* The axes of a width x height image under `plan`, for a crop of
 * crop_w x crop_h. */
void fl_pad_axes(const fl_pad_plan *plan, int width, int height, int crop_w, int crop_h,
                 fl_pad_axis *x, fl_pad_axis *y);

/* The padded size of an axis. */
static inline int fl_pad_extent(const fl_pad_axis *a)
{
    return a->n + a->before1 + a->after1 + a->before2 + a->after2;
}

/* The source pixel that coordinate `i` of the padded axis shows (0 is the
 * padded image's first pixel), or -1 for the fill of FL_PAD_CONSTANT.
 * Reflections farther than the image is long repeat as np.pad's do. */
int fl_pad_source(const fl_pad_axis *a, int mode, int i);

/* RandomCrop.get_params on the padded image: the crop's top-left corner in
 * padded coordinates, each offset uniform over the positions (top drawn
 * first, none when the crop is the whole image).  Returns 0, or -1 when the
 * crop is larger than the padded image (torchvision raises then). */
int fl_random_crop_offsets(fl_rng *rng, const fl_pad_axis *x, const fl_pad_axis *y, int crop_w,
                           int crop_h, int *left, int *top);

/* The source pixels [*lo, *hi) that padded coordinates [start, start + len)
 * read; at least one pixel (a window all of constant fill still names one,
 * so the file is decoded and checked). */
void fl_pad_source_range(const fl_pad_axis *a, int mode, int start, int len, int *lo, int *hi);

/* Builds the crop_w x crop_h window at (left, top) of the padded image into
 * `dst` (RGB, 3 * crop_w bytes a row, contiguous), from `src`, the source
 * pixels [src_x, src_x + src_w) x [src_y, src_y + src_h) that
 * fl_pad_source_range named (rows src_stride bytes apart).  `columns` is
 * scratch of crop_w ints.  Returns 0, or -1 if a needed pixel lies outside
 * `src` (a caller's error). */
int fl_pad_window(const fl_pad_plan *plan, const fl_pad_axis *x, const fl_pad_axis *y, int left,
                  int top, int crop_w, int crop_h, const unsigned char *src, int src_x, int src_y,
                  int src_w, int src_h, size_t src_stride, int *columns, unsigned char *dst);

#endif /* FL_PAD_H */
