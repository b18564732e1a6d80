/* fastload core: augmentation.
 *
 * Where to crop — torchvision's geometric rules as boxes in source-image
 * pixels, so that decode can read only the box and resample it straight to
 * the output size.  Boxes are doubles: Resize followed by CenterCrop is one
 * box in the source whose edges need not fall on pixel boundaries.
 *
 * Colour — ColorJitter's four adjustments and grayscale, with the formulas
 * of torchvision's tensor functions (F.adjust_* on a float image), on the
 * resampled image held as float RGB planes in [0, 255].
 */
#ifndef FL_AUGMENT_H
#define FL_AUGMENT_H

#include "core/image/rng.h"

#include <stddef.h>

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

/* ------------------------------------------------------------------ colour */

/* ColorJitter's adjustments, in torchvision's numbering (fn_idx). */
enum { FL_BRIGHTNESS = 0, FL_CONTRAST = 1, FL_SATURATION = 2, FL_HUE = 3, FL_COLOR_OPS = 4 };

/* The colour ops of a chain: ColorJitter's factor ranges and a grayscale. */
typedef struct fl_color_plan {
    int on[FL_COLOR_OPS];                      /* 1: the adjustment runs; all 0 (a zeroed
                                                  plan): no colour ops */
    double lo[FL_COLOR_OPS], hi[FL_COLOR_OPS]; /* factor ranges of those on */
    int order[FL_COLOR_OPS];                   /* a fixed order (a permutation of 0..3), or
                                                  order[0] < 0: drawn per sample */
    double gray_p;                             /* probability of grayscale; 0: none */
    int gray_first;                            /* 1: grayscale comes before the jitter */
    double jitter_p;                           /* probability the jitter runs
                                                  (RandomApply); drawn only when < 1 */
    int uint8;                                 /* 1: on a uint8 tensor, as torchvision
                                                  after PILToTensor: each step's result
                                                  truncated, grays floored */
} fl_color_plan;

/* What one sample gets. */
typedef struct fl_color_draw {
    int order[FL_COLOR_OPS];     /* the order the adjustments run in */
    int on[FL_COLOR_OPS];        /* 1: the adjustment runs */
    double factor[FL_COLOR_OPS]; /* its factor, uniform in [lo, hi] */
    int gray;                    /* 1: the image becomes grayscale */
    int gray_first;
    int uint8;                   /* the plan's */
} fl_color_draw;

/* Sets plan->on from the ranges: an adjustment whose range is its identity,
 * (1, 1) or, for hue, (0, 0), is off, as torchvision's None is. */
void fl_color_plan_from_ranges(fl_color_plan *plan);

/* Nonzero when the plan changes colours at all. */
int fl_color_active(const fl_color_plan *plan);

/* ColorJitter.get_params and RandomGrayscale's coin, drawn from `rng`: a
 * uniform permutation of the four adjustments, a uniform factor for each
 * that is on, then grayscale with probability gray_p, then (when jitter_p
 * < 1) RandomApply's coin, which turns every adjustment off when it fails.  The numbers differ
 * from torch's generator; the distributions are the same. */
void fl_color_draw_for(const fl_color_plan *plan, fl_rng *rng, fl_color_draw *out);

/* Applies a draw to an image of `n` pixels held as three float planes (R,
 * G, B, n values each, one after the other, in [0, 255]), in place; values
 * stay in [0, 255].  Contrast needs the mean gray level of the whole image,
 * so each contrast step reads the image twice.  With draw->uint8 the planes
 * hold whole numbers (a uint8 image) and every step leaves whole numbers, as
 * torchvision's tensor functions do on a uint8 tensor. */
void fl_color_apply(const fl_color_draw *draw, float *planes, size_t n);

#endif /* FL_AUGMENT_H */
