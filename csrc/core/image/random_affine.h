/* fastload core: RandomRotation and RandomAffine on the uint8 image.
 *
 * torchvision's v1 classes on a PIL image: an angle (and, for RandomAffine,
 * a whole-pixel translation, a scale and shears) drawn from the ranges its
 * get_params draws from, then F.rotate (Image.rotate, expand=False) or
 * F.affine (Image.transform with _get_inverse_affine_matrix), both with
 * Pillow's arithmetic (pil_ops.h): the same bytes as torchvision for the
 * same parameters.  The draws come from a fl_rng (other numbers than
 * torch's generator, the same distributions and rounding).
 */
#ifndef FL_RANDOM_AFFINE_H
#define FL_RANDOM_AFFINE_H

#include "core/image/rng.h"

enum { FL_RANDOM_WARP_NONE = 0, FL_RANDOM_ROTATION = 1, FL_RANDOM_AFFINE = 2 };

typedef struct fl_warp_plan {
    int kind;                        /* FL_RANDOM_*; 0 (a zeroed plan): none */
    double degrees_lo, degrees_hi;   /* the angle's range, lo <= hi */
    double translate_x, translate_y; /* affine: largest shift, a fraction of width / height */
    double scale_lo, scale_hi;       /* affine: (1, 1) when not given */
    double shear_x_lo, shear_x_hi;   /* affine: degrees; (0, 0) when not given */
    double shear_y_lo, shear_y_hi;
    int interpolation;               /* FL_WARP_NEAREST or FL_WARP_BILINEAR */
    float fill[3];                   /* 0..255, truncated to integers as for PIL */
    int center;                      /* 1: about (center_x, center_y), else the image centre */
    double center_x, center_y;
    int v2;                          /* affine: torchvision.transforms.v2's matrix (the same
                                        formulas grouped otherwise: last bits differ) */
} fl_warp_plan;

/* One sample's parameters, as get_params returns them. */
typedef struct fl_warp_draw {
    double angle;
    int tx, ty;
    double scale, shear_x, shear_y;
} fl_warp_draw;

/* Draws the parameters for a w x h image: the angle uniform in degrees,
 * then (affine) tx = round(uniform(-translate_x * w, translate_x * w)) and
 * ty likewise (Python's round, half to even), the scale and the two shears
 * uniform in their ranges. */
void fl_warp_draw_for(const fl_warp_plan *plan, fl_rng *rng, int w, int h, fl_warp_draw *out);

/* Applies the draw: src (w x h) into dst, a different buffer of the same
 * size.  An affine matrix that sends a corner of the output more than 2**30
 * pixels away (a scale near 0, a shear near 90 degrees) gives the fill
 * everywhere: Pillow's result there rests on undefined float-to-int
 * conversions. */
void fl_warp_apply(const fl_warp_plan *plan, const fl_warp_draw *draw, const unsigned char *src,
                   unsigned char *dst, int w, int h);

#endif /* FL_RANDOM_AFFINE_H */
