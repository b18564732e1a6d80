/* fastload core: see erase.h. */
#include "core/image/erase.h"

#include "core/image/resample.h"

#include <math.h>
#include <stdint.h>

void fl_erase_draw_for(const fl_erase_plan *plan, fl_rng *rng, int width, int height,
                       fl_erase_draw *out)
{
    out->on = 0;
    out->top = out->left = 0;
    out->h = height;
    out->w = width;
    if (!(plan->p > 0.0) || fl_rng_uniform(rng) >= plan->p)
        return;
    double area = (double)width * height;
    double log_lo = log(plan->ratio_lo), log_hi = log(plan->ratio_hi);
    for (int attempt = 0; attempt < 10; attempt++) {
        double erase_area =
            area * (plan->scale_lo + (plan->scale_hi - plan->scale_lo) * fl_rng_uniform(rng));
        double ratio = exp(log_lo + (log_hi - log_lo) * fl_rng_uniform(rng));
        double h = nearbyint(sqrt(erase_area * ratio)), w = nearbyint(sqrt(erase_area / ratio));
        if (!(h < height && w < width))
            continue;
        out->h = (int)h;
        out->w = (int)w;
        out->top = (int)fl_rng_below(rng, height - out->h + 1);
        out->left = (int)fl_rng_below(rng, width - out->w + 1);
        out->on = 1;
        out->values = *rng;
        return;
    }
}

/* A float as torch stores it into an element of `dtype`. */
static void store(void *row, size_t at, int dtype, float value)
{
    if (dtype == FL_DTYPE_FLOAT32) {
        ((float *)row)[at] = value;
    } else if (dtype == FL_DTYPE_FLOAT16) {
        ((uint16_t *)row)[at] = fl_float_to_half(value);
    } else {
        float v = value < 0.0f ? 0.0f : value > 255.0f ? 255.0f : value;
        ((unsigned char *)row)[at] = (unsigned char)v;
    }
}

void fl_erase_apply(const fl_erase_plan *plan, const fl_erase_draw *draw, void *row, int dtype,
                    int layout, int width, int height)
{
    if (!draw->on)
        return;
    fl_rng rng = draw->values;
    for (int c = 0; c < 3; c++)
        for (int y = draw->top; y < draw->top + draw->h; y++)
            for (int x = draw->left; x < draw->left + draw->w; x++) {
                size_t at = layout == FL_LAYOUT_CHW
                                ? ((size_t)c * height + (size_t)y) * width + (size_t)x
                                : ((size_t)y * width + (size_t)x) * 3 + (size_t)c;
                float value = plan->random ? (float)fl_rng_normal(&rng) : plan->value[c];
                store(row, at, dtype, value);
            }
}
