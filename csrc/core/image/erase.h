/* fastload core: RandomErasing on a sample's row after the store, with
 * torchvision's semantics (transforms.RandomErasing, v1 and v2).
 *
 * With probability p a box of the output image is overwritten: up to ten
 * tries of an area fraction uniform in [scale_lo, scale_hi] and a
 * log-uniform aspect ratio (h / w) in [ratio_lo, ratio_hi], each side
 * round(sqrt(...)) (half to even); the first box strictly smaller than
 * the image on both sides is placed uniformly; after ten misses nothing is
 * erased.  The value is a constant per channel or, "random", a standard
 * normal draw per element.  The draws come from FL_STREAM_ERASE keyed by
 * (seed, epoch, sample index); the numbers differ from torch's generator,
 * the distributions are the same.
 */
#ifndef FL_ERASE_H
#define FL_ERASE_H

#include "core/image/rng.h"

typedef struct fl_erase_plan {
    double p;                   /* probability of erasing; 0: off */
    double scale_lo, scale_hi;  /* area fraction */
    double ratio_lo, ratio_hi;  /* aspect ratio h / w */
    float value[3];             /* per channel, in the row's units (after Normalize) */
    int random;                 /* 1: standard normal values instead */
} fl_erase_plan;

/* What one sample gets. */
typedef struct fl_erase_draw {
    int on;                     /* 1: the box is erased */
    int top, left, h, w;        /* torchvision's (i, j, h, w) */
    fl_rng values;              /* "random": where the values are drawn from */
} fl_erase_draw;

/* Draws a sample's coin and box for an output of width x height from
 * `rng` (the sample's FL_STREAM_ERASE generator). */
void fl_erase_draw_for(const fl_erase_plan *plan, fl_rng *rng, int width, int height,
                       fl_erase_draw *out);

/* Erases the drawn box of a row of 3 x height x width elements of `dtype`
 * (FL_DTYPE_*) in `layout` (FL_LAYOUT_*).  A value is converted as torch
 * assigns a float into the row: rounded to float16, or truncated toward
 * zero (after clamping to 0..255) for uint8.  "random" values are drawn
 * channel by channel, row by row (torchvision's [C, h, w] order). */
void fl_erase_apply(const fl_erase_plan *plan, const fl_erase_draw *draw, void *row, int dtype,
                    int layout, int width, int height);

#endif /* FL_ERASE_H */
