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

/* ------------------------------------------------------------------ colour */

/* The value at which each adjustment leaves the image as it is. */
static const double IDENTITY[FL_COLOR_OPS] = {1.0, 1.0, 1.0, 0.0};

static int op_on(const fl_color_plan *plan, int op)
{
    return !(plan->lo[op] == IDENTITY[op] && plan->hi[op] == IDENTITY[op]);
}

int fl_color_active(const fl_color_plan *plan)
{
    for (int op = 0; op < FL_COLOR_OPS; op++)
        if (op_on(plan, op))
            return 1;
    return plan->gray_p > 0.0;
}

void fl_color_draw_for(const fl_color_plan *plan, fl_rng *rng, fl_color_draw *out)
{
    /* Fisher-Yates: each of the 24 orders equally likely. */
    for (int i = 0; i < FL_COLOR_OPS; i++)
        out->order[i] = i;
    for (int i = FL_COLOR_OPS - 1; i > 0; i--) {
        int j = (int)fl_rng_below(rng, i + 1);
        int t = out->order[i];
        out->order[i] = out->order[j];
        out->order[j] = t;
    }
    if (plan->order[0] >= 0)
        for (int i = 0; i < FL_COLOR_OPS; i++)
            out->order[i] = plan->order[i];
    for (int op = 0; op < FL_COLOR_OPS; op++) {
        out->on[op] = op_on(plan, op);
        out->factor[op] = IDENTITY[op];
        if (out->on[op])
            out->factor[op] = plan->lo[op] + (plan->hi[op] - plan->lo[op]) * fl_rng_uniform(rng);
    }
    /* torch.rand(1) < p: p = 1 always, p = 0 never. */
    out->gray = plan->gray_p > 0.0 && fl_rng_uniform(rng) < plan->gray_p;
    out->gray_first = plan->gray_first;
}

/* F.rgb_to_grayscale's weights for tensors (Pillow's "L" uses 0.299). */
#define GRAY_R 0.2989f
#define GRAY_G 0.587f
#define GRAY_B 0.114f

static inline float clamp255(float v)
{
    return v < 0.0f ? 0.0f : v > 255.0f ? 255.0f : v;
}

static inline float gray_of(const float *px)
{
    return GRAY_R * px[0] + GRAY_G * px[1] + GRAY_B * px[2];
}

/* torchvision's _blend: ratio * image + (1 - ratio) * other, clamped. */
static void blend_constant(float *rgb, size_t n, float ratio, float other)
{
    float rest = (1.0f - ratio) * other;
    for (size_t i = 0; i < 3 * n; i++)
        rgb[i] = clamp255(ratio * rgb[i] + rest);
}

static void blend_gray(float *rgb, size_t n, float ratio)
{
    float rest = 1.0f - ratio;
    for (size_t i = 0; i < n; i++) {
        float *px = rgb + 3 * i;
        float g = rest * gray_of(px);
        px[0] = clamp255(ratio * px[0] + g);
        px[1] = clamp255(ratio * px[1] + g);
        px[2] = clamp255(ratio * px[2] + g);
    }
}

static void to_gray(float *rgb, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float *px = rgb + 3 * i;
        px[0] = px[1] = px[2] = gray_of(px);
    }
}

static float mean_gray(const float *rgb, size_t n)
{
    double sum = 0.0;
    for (size_t i = 0; i < n; i++)
        sum += gray_of(rgb + 3 * i);
    return (float)(sum / (double)n);
}

/* F.adjust_hue for tensors: _rgb2hsv, h shifted modulo 1, _hsv2rgb.  The
 * value channel is in [0, 255] here rather than [0, 1]; hue and saturation
 * are ratios, so only the clamps of _hsv2rgb scale. */
static void shift_hue(float *rgb, size_t n, float shift)
{
    for (size_t i = 0; i < n; i++) {
        float *px = rgb + 3 * i;
        float r = px[0], g = px[1], b = px[2];
        float maxc = fmaxf(r, fmaxf(g, b)), minc = fminf(r, fminf(g, b));
        if (maxc == minc)
            continue; /* gray: s = 0, every h gives the pixel back */
        float cr = maxc - minc;
        float s = cr / maxc;
        float rc = (maxc - r) / cr, gc = (maxc - g) / cr, bc = (maxc - b) / cr;
        float h;
        if (maxc == r)
            h = bc - gc;
        else if (maxc == g)
            h = 2.0f + rc - bc;
        else
            h = 4.0f + gc - rc;
        h = fmodf(h / 6.0f + 1.0f, 1.0f);
        h += shift;
        h -= floorf(h); /* Python's %: the result takes the divisor's sign */
        float h6 = h * 6.0f;
        float sector = floorf(h6);
        float f = h6 - sector;
        int k = (int)sector % 6;
        float v = maxc;
        float p = clamp255(v * (1.0f - s));
        float q = clamp255(v * (1.0f - s * f));
        float t = clamp255(v * (1.0f - s * (1.0f - f)));
        switch (k) {
        case 0: px[0] = v, px[1] = t, px[2] = p; break;
        case 1: px[0] = q, px[1] = v, px[2] = p; break;
        case 2: px[0] = p, px[1] = v, px[2] = t; break;
        case 3: px[0] = p, px[1] = q, px[2] = v; break;
        case 4: px[0] = t, px[1] = p, px[2] = v; break;
        default: px[0] = v, px[1] = p, px[2] = q; break;
        }
    }
}

static void jitter(const fl_color_draw *draw, float *rgb, size_t n)
{
    for (int i = 0; i < FL_COLOR_OPS; i++) {
        int op = draw->order[i];
        if (!draw->on[op])
            continue;
        float factor = (float)draw->factor[op];
        switch (op) {
        case FL_BRIGHTNESS:
            blend_constant(rgb, n, factor, 0.0f);
            break;
        case FL_CONTRAST:
            blend_constant(rgb, n, factor, mean_gray(rgb, n));
            break;
        case FL_SATURATION:
            blend_gray(rgb, n, factor);
            break;
        default:
            shift_hue(rgb, n, factor);
            break;
        }
    }
}

void fl_color_apply(const fl_color_draw *draw, float *rgb, size_t n)
{
    if (draw->gray && draw->gray_first)
        to_gray(rgb, n);
    jitter(draw, rgb, n);
    if (draw->gray && !draw->gray_first)
        to_gray(rgb, n);
}
