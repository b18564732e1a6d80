/* fastload core: where to crop — torchvision's geometric rules as boxes in
 * source-image pixels, so that decode can read only the box and resample it
 * straight to the output size.
 *
 * Boxes are doubles: Resize followed by CenterCrop is one box in the source
 * whose edges need not fall on pixel boundaries.
 */
#ifndef FL_AUGMENT_H
#define FL_AUGMENT_H

#include "rng.h"

typedef struct fl_box {
    double x, y, w, h; /* left, top, width, height in source pixels */
} fl_box;

/* RandomResizedCrop.get_params: up to ten tries of an area fraction drawn
 * from [scale_lo, scale_hi] and a log-uniform aspect ratio from
 * [ratio_lo, ratio_hi], rounded to whole pixels and placed uniformly; else
 * the centred crop of the clamped ratio.  Draws come from `rng`, so the
 * numbers differ from torch's generator but the distribution is the same.
 * The box is whole pixels. */
void fl_random_resized_crop(fl_rng *rng, int width, int height, double scale_lo, double scale_hi,
                            double ratio_lo, double ratio_hi, fl_box *out);

/* Resize(size) for an int size: the short side becomes `size` and the long
 * side int(size * long / short) (truncated, as torchvision does), capped by
 * `max_size` when it is > 0 (then the long side is max_size and the short
 * side scales down).  Writes the resized width and height, each at least 1. */
void fl_resize_short_side(int width, int height, int size, int max_size, int *out_w, int *out_h);

/* CenterCrop(crop_w x crop_h) of a width x height image: torchvision's
 * offsets int(round((height - crop_h) / 2.0)) (round half to even). The
 * crop must fit. */
void fl_center_crop(int width, int height, int crop_w, int crop_h, fl_box *out);

/* The box of a `resized_w` x `resized_h` image that `box` (in resized
 * pixels) covers, mapped back to the width x height source. */
void fl_box_unscale(const fl_box *box, int width, int height, int resized_w, int resized_h,
                    fl_box *out);

#endif /* FL_AUGMENT_H */
