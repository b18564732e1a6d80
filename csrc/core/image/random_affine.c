/* fastload core: see random_affine.h. */
#include "core/image/random_affine.h"

#include "core/image/pil_ops.h"

#include <math.h>
#include <string.h>

/* torch's uniform_(lo, hi): lo + (hi - lo) * u. */
static double uniform(fl_rng *rng, double lo, double hi)
{
    return lo + (hi - lo) * fl_rng_uniform(rng);
}

void fl_warp_draw_for(const fl_warp_plan *plan, fl_rng *rng, int w, int h, fl_warp_draw *out)
{
    memset(out, 0, sizeof *out);
    out->scale = 1.0;
    if (plan->kind == FL_RANDOM_WARP_NONE)
        return;
    out->angle = uniform(rng, plan->degrees_lo, plan->degrees_hi);
    if (plan->kind != FL_RANDOM_AFFINE)
        return;
    double max_dx = plan->translate_x * w, max_dy = plan->translate_y * h;
    /* nearbyint in the default rounding mode: Python's round, half to even */
    out->tx = (int)nearbyint(uniform(rng, -max_dx, max_dx));
    out->ty = (int)nearbyint(uniform(rng, -max_dy, max_dy));
    out->scale = uniform(rng, plan->scale_lo, plan->scale_hi);
    out->shear_x = uniform(rng, plan->shear_x_lo, plan->shear_x_hi);
    out->shear_y = uniform(rng, plan->shear_y_lo, plan->shear_y_hi);
}

/* Whether the matrix keeps every output pixel's source position within
 * 2**30 pixels: then the warp's float-to-int conversions are defined (an
 * affine map's extremes are at the corners). */
static int tame(const double m[6], int w, int h)
{
    const double xs[2] = {0.0, w}, ys[2] = {0.0, h};
    for (int i = 0; i < 2; i++) {
        for (int j = 0; j < 2; j++) {
            double x = m[0] * xs[i] + m[1] * ys[j] + m[2];
            double y = m[3] * xs[i] + m[4] * ys[j] + m[5];
            if (!(fabs(x) < 0x1p30 && fabs(y) < 0x1p30))
                return 0;
        }
    }
    return 1;
}

/* torchvision.transforms.v2's _get_inverse_affine_matrix: v1's matrix
 * (fl_pil_inverse_affine) with its terms cached and grouped otherwise, so
 * its last bits, and now and then a pixel, differ. */
static void inverse_affine_v2(double cx, double cy, double angle, double tx, double ty,
                              double scale, double shear_x, double shear_y, double m[6])
{
    const double to_radians = 3.14159265358979323846 / 180.0; /* math.radians */
    double rot = angle * to_radians, sx = shear_x * to_radians, sy = shear_y * to_radians;
    double cos_sy = cos(sy), tan_sx = tan(sx), rot_minus_sy = rot - sy;
    double cx_plus_tx = cx + tx, cy_plus_ty = cy + ty;
    double a = cos(rot_minus_sy) / cos_sy;
    double b = -(a * tan_sx + sin(rot));
    double c = sin(rot_minus_sy) / cos_sy;
    double d = cos(rot) - c * tan_sx;
    m[0] = d / scale;
    m[1] = -b / scale;
    m[2] = 0.0;
    m[3] = -c / scale;
    m[4] = a / scale;
    m[5] = 0.0;
    m[2] += cx - m[0] * cx_plus_tx - m[1] * cy_plus_ty;
    m[5] += cy - m[3] * cx_plus_tx - m[4] * cy_plus_ty;
}

void fl_warp_apply(const fl_warp_plan *plan, const fl_warp_draw *draw, const unsigned char *src,
                   unsigned char *dst, int w, int h)
{
    unsigned char fill[3];
    for (int c = 0; c < 3; c++)
        fill[c] = (unsigned char)(int)plan->fill[c];
    if (plan->kind == FL_RANDOM_ROTATION) {
        fl_pil_rotate(src, dst, w, h, draw->angle, plan->interpolation, fill, plan->center,
                      plan->center_x, plan->center_y);
        return;
    }
    /* F.affine on a PIL image: the centre defaults to (w / 2, h / 2). */
    double cx = plan->center ? plan->center_x : w * 0.5;
    double cy = plan->center ? plan->center_y : h * 0.5;
    double m[6];
    if (plan->v2)
        inverse_affine_v2(cx, cy, draw->angle, draw->tx, draw->ty, draw->scale, draw->shear_x,
                          draw->shear_y, m);
    else
        fl_pil_inverse_affine(cx, cy, draw->angle, draw->tx, draw->ty, draw->scale,
                              draw->shear_x, draw->shear_y, m);
    if (!tame(m, w, h)) {
        /* A scale near 0 or a shear near 90 degrees: the image shrinks to
         * (or stretches beyond) nothing Pillow could sample with defined
         * arithmetic; the output is the fill. */
        for (size_t i = 0; i < (size_t)w * h; i++)
            memcpy(dst + 3 * i, fill, 3);
        return;
    }
    fl_pil_affine(src, dst, w, h, m, plan->interpolation, fill);
}
