/* fastload core: see augment.h. */
#include "augment.h"

#include <math.h>

void fl_random_resized_crop(fl_rng *rng, int width, int height, double scale_lo, double scale_hi,
                            double ratio_lo, double ratio_hi, fl_box *out)
{
    double area = (double)width * height;
    double log_lo = log(ratio_lo), log_hi = log(ratio_hi);
    for (int attempt = 0; attempt < 10; attempt++) {
        double target = area * (scale_lo + (scale_hi - scale_lo) * fl_rng_uniform(rng));
        double ratio = exp(log_lo + (log_hi - log_lo) * fl_rng_uniform(rng));
        /* torchvision rounds half to even (Python's round) */
        int w = (int)nearbyint(sqrt(target * ratio));
        int h = (int)nearbyint(sqrt(target / ratio));
        if (0 < w && w <= width && 0 < h && h <= height) {
            out->y = (double)fl_rng_below(rng, height - h + 1);
            out->x = (double)fl_rng_below(rng, width - w + 1);
            out->w = w;
            out->h = h;
            return;
        }
    }
    /* Fallback: the whole image, trimmed to the nearest allowed ratio. */
    double in_ratio = (double)width / height;
    int w = width, h = height;
    if (in_ratio < ratio_lo) {
        h = (int)nearbyint(width / ratio_lo);
    } else if (in_ratio > ratio_hi) {
        w = (int)nearbyint(height * ratio_hi);
    }
    if (w < 1)
        w = 1;
    if (h < 1)
        h = 1;
    out->w = w;
    out->h = h;
    out->y = (double)((height - h) / 2);
    out->x = (double)((width - w) / 2);
}

void fl_resize_short_side(int width, int height, int size, int max_size, int *out_w, int *out_h)
{
    int short_side = width <= height ? width : height;
    int long_side = width <= height ? height : width;
    int new_short = size;
    int new_long = (int)((long long)size * long_side / short_side);
    if (max_size > 0 && new_long > max_size) {
        new_short = (int)((long long)max_size * new_short / new_long);
        new_long = max_size;
    }
    /* An extreme aspect ratio can round a side to nothing; keep a pixel
     * (torchvision would fail to resize to zero). */
    if (new_short < 1)
        new_short = 1;
    if (new_long < 1)
        new_long = 1;
    if (width <= height) {
        *out_w = new_short;
        *out_h = new_long;
    } else {
        *out_w = new_long;
        *out_h = new_short;
    }
}

void fl_center_crop(int width, int height, int crop_w, int crop_h, fl_box *out)
{
    out->y = nearbyint((height - crop_h) / 2.0);
    out->x = nearbyint((width - crop_w) / 2.0);
    out->w = crop_w;
    out->h = crop_h;
}

void fl_box_unscale(const fl_box *box, int width, int height, int resized_w, int resized_h,
                    fl_box *out)
{
    double sx = (double)width / resized_w, sy = (double)height / resized_h;
    out->x = box->x * sx;
    out->y = box->y * sy;
    out->w = box->w * sx;
    out->h = box->h * sy;
}
