/* fastload core: GaussianBlur on the float stage (after the colour ops).
 *
 * torchvision's F.gaussian_blur: a kernel_x x kernel_y Gaussian with one
 * sigma for both axes, its 1-D kernels built as _get_gaussian_kernel1d
 * builds them in float32 (exp(-x^2 / (2 sigma^2)) at integer offsets,
 * normalised to sum 1), the image reflect-padded by half the kernel.  Here
 * the 2-D kernel runs as its two 1-D passes, which is the same sum in
 * another order: float rounding, not 8-bit, is the difference.
 */
#ifndef FL_BLUR_H
#define FL_BLUR_H

#include "core/image/rng.h"

#include <stddef.h>

#define FL_BLUR_MAX_KERNEL 1023 /* larger kernels are refused by the plan */

typedef struct fl_blur_plan {
    int kernel_w, kernel_h;     /* odd, >= 1; 0: no blur */
    double sigma_lo, sigma_hi;  /* sigma uniform in [lo, hi], lo > 0 */
    double p;                   /* probability the blur runs (RandomApply) */
} fl_blur_plan;

typedef struct fl_blur_draw {
    int on;       /* 1: this sample is blurred */
    int kernel_w, kernel_h;
    double sigma;
} fl_blur_draw;

/* Nonzero when the plan blurs at all. */
static inline int fl_blur_active(const fl_blur_plan *plan)
{
    return plan->kernel_w > 0 && plan->p > 0.0;
}

/* RandomApply's coin (only when p < 1), then GaussianBlur.get_params'
 * sigma, from `rng` (the blur's own stream). */
void fl_blur_draw_for(const fl_blur_plan *plan, fl_rng *rng, fl_blur_draw *out);

/* _get_gaussian_kernel1d(size, sigma) in float32 into kernel[size]. */
void fl_blur_kernel(int size, double sigma, float *kernel);

/* Floats of scratch fl_blur_apply needs for a width x height image. */
size_t fl_blur_scratch_floats(const fl_blur_draw *draw, int width, int height);

/* Blurs three float planes (R, G, B, width * height values each, one after
 * the other) in place, with reflect padding (reflections repeat past an
 * axis shorter than half the kernel, where torch would refuse).  `scratch`
 * holds fl_blur_scratch_floats() floats.  Does nothing unless draw->on. */
void fl_blur_apply(const fl_blur_draw *draw, float *planes, int width, int height,
                   float *scratch);

#endif /* FL_BLUR_H */
