/* fastload core: see augment.h. */
#include "core/image/augment.h"

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

void fl_color_plan_from_ranges(fl_color_plan *plan)
{
    for (int op = 0; op < FL_COLOR_OPS; op++)
        plan->on[op] = !(plan->lo[op] == IDENTITY[op] && plan->hi[op] == IDENTITY[op]);
}

int fl_color_active(const fl_color_plan *plan)
{
    for (int op = 0; op < FL_COLOR_OPS; op++)
        if (plan->on[op])
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
        out->on[op] = plan->on[op];
        out->factor[op] = IDENTITY[op];
        if (out->on[op])
            out->factor[op] = plan->lo[op] + (plan->hi[op] - plan->lo[op]) * fl_rng_uniform(rng);
    }
    /* torch.rand(1) < p: p = 1 always, p = 0 never. */
    out->gray = plan->gray_p > 0.0 && fl_rng_uniform(rng) < plan->gray_p;
    out->gray_first = plan->gray_first;
    out->uint8 = plan->uint8;
    /* Drawn last, so chains without RandomApply keep their numbers. */
    if (plan->jitter_p < 1.0 && !(fl_rng_uniform(rng) < plan->jitter_p))
        for (int op = 0; op < FL_COLOR_OPS; op++)
            out->on[op] = 0;
}

/* F.rgb_to_grayscale's weights for tensors (Pillow's "L" uses 0.299). */
#define GRAY_R 0.2989f
#define GRAY_G 0.587f
#define GRAY_B 0.114f

/* gcc if-converts a select between computed floats (and so vectorises the
 * loop) only when it may evaluate both arms, that is without
 * -ftrapping-math.  The values are the same either way, and nothing here
 * reads the floating-point exception flags.  The option covers this whole
 * section, helpers included: gcc does not inline a function compiled with
 * other options into these loops. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC optimize("no-trapping-math")
#endif

static inline float clamp255(float v)
{
    return v < 0.0f ? 0.0f : v > 255.0f ? 255.0f : v;
}

static inline float gray_of(float r, float g, float b)
{
    return GRAY_R * r + GRAY_G * g + GRAY_B * b;
}

/* A value's integer part, for values of at least 0: what torchvision's
 * .to(torch.uint8) and floor_() make of them.  A conversion, not floorf, a
 * library call without SSE4.1 that would keep the loops scalar. */
static inline float whole(float v)
{
    return (float)(int)v;
}

/* torchvision's _blend: ratio * image + (1 - ratio) * other, clamped (and
 * truncated, on a uint8 image).  torch takes each Python number to float:
 * ratio and 1 - ratio, the latter computed in double first (the float
 * difference can differ from it by an ulp, which a uint8 result shows where
 * the exact blend is a whole number). */
static void blend_constant(float *restrict v, size_t count, float ratio, float ratio_rest,
                           float other, int uint8)
{
    float rest = ratio_rest * other;
    if (uint8) {
        for (size_t i = 0; i < count; i++)
            v[i] = whole(clamp255(ratio * v[i] + rest));
        return;
    }
    for (size_t i = 0; i < count; i++)
        v[i] = clamp255(ratio * v[i] + rest);
}

/* adjust_saturation: the blend with the image's gray, which a uint8 image
 * has floored (v2 floors it; v1's rgb_to_grayscale truncates to uint8). */
static void blend_gray(float *restrict r, float *restrict g, float *restrict b, size_t n,
                       float ratio, float rest, int uint8)
{
    if (uint8) {
        for (size_t i = 0; i < n; i++) {
            float gray = rest * whole(gray_of(r[i], g[i], b[i]));
            r[i] = whole(clamp255(ratio * r[i] + gray));
            g[i] = whole(clamp255(ratio * g[i] + gray));
            b[i] = whole(clamp255(ratio * b[i] + gray));
        }
        return;
    }
    for (size_t i = 0; i < n; i++) {
        float gray = rest * gray_of(r[i], g[i], b[i]);
        r[i] = clamp255(ratio * r[i] + gray);
        g[i] = clamp255(ratio * g[i] + gray);
        b[i] = clamp255(ratio * b[i] + gray);
    }
}

static void to_gray(float *restrict r, float *restrict g, float *restrict b, size_t n, int uint8)
{
    if (uint8) {
        for (size_t i = 0; i < n; i++)
            r[i] = g[i] = b[i] = whole(gray_of(r[i], g[i], b[i]));
        return;
    }
    for (size_t i = 0; i < n; i++)
        r[i] = g[i] = b[i] = gray_of(r[i], g[i], b[i]);
}

/* The mean in double, a row of floats at a time: the sum stays exact
 * enough for any image size, and the inner loop vectorises.  A uint8
 * image's grays are floored first, as torchvision's are. */
static float mean_gray(const float *r, const float *g, const float *b, size_t n, int uint8)
{
    enum { CHUNK = 256 };
    double sum = 0.0;
    for (size_t start = 0; start < n; start += CHUNK) {
        size_t end = n - start < CHUNK ? n : start + CHUNK;
        float partial = 0.0f;
        if (uint8)
            for (size_t i = start; i < end; i++)
                partial += whole(gray_of(r[i], g[i], b[i]));
        else
            for (size_t i = start; i < end; i++)
                partial += gray_of(r[i], g[i], b[i]);
        sum += partial;
    }
    return (float)(sum / (double)n);
}

/* One channel of HSV -> RGB in closed form: v - v * s * clamp(min(k, 4 - k),
 * 0, 1) with k = (n + 6h) mod 6, n = 5, 3, 1 for R, G, B.  It equals the
 * six-sector table of torchvision's _hsv2rgb (whose clamps never bind for v,
 * s and f in range) and has no branches. */
static inline float hsv_channel(float n, float h6, float v, float vs)
{
    float k = n + h6; /* in [1, 11] */
    k -= k >= 6.0f ? 6.0f : 0.0f;
    float w = k < 4.0f - k ? k : 4.0f - k;
    w = w < 1.0f ? w : 1.0f;
    w = w > 0.0f ? w : 0.0f;
    return v - vs * w;
}

/* F.adjust_hue for tensors: _rgb2hsv, h shifted modulo 1, back to RGB.  The
 * value channel is in [0, 255] here rather than [0, 1]; hue and saturation
 * are ratios, so nothing else scales.  Every candidate is computed and the
 * right one selected (and there is no fmodf or floorf, library calls without
 * SSE4.1), so that the loop vectorises. */
static void shift_hue(float *restrict r, float *restrict g, float *restrict b, size_t n,
                      float shift)
{
    for (size_t i = 0; i < n; i++) {
        float red = r[i], green = g[i], blue = b[i];
        float maxc = red > green ? red : green, minc = red < green ? red : green;
        maxc = maxc > blue ? maxc : blue;
        minc = minc < blue ? minc : blue;
        float cr = maxc - minc;
        /* A gray pixel (max == min) has s = 0: any h gives it back.  As in
         * torchvision, its divisors become 1 so nothing divides by zero. */
        int gray = cr == 0.0f;
        float s = cr / (gray ? 1.0f : maxc);
        /* One reciprocal for three divisions, and 1/6 folded in: the hue moves
         * by a few float ulps, far below what 8 bits can show. */
        float inv = (1.0f / 6.0f) / (gray ? 1.0f : cr);
        float rc = (maxc - red) * inv, gc = (maxc - green) * inv, bc = (maxc - blue) * inv;
        float hr = bc - gc, hg = (2.0f / 6.0f) + rc - bc, hb = (4.0f / 6.0f) + gc - rc;
        float h = maxc == red ? hr : maxc == green ? hg : hb;
        h += 1.0f; /* in [5/6, 11/6]: fmod(h, 1) is one subtraction */
        h -= h >= 1.0f ? 1.0f : 0.0f;
        h += shift; /* in [-0.5, 1.5): Python's % 1 */
        h += h < 0.0f ? 1.0f : 0.0f;
        h -= h >= 1.0f ? 1.0f : 0.0f;
        float h6 = h * 6.0f, vs = maxc * s;
        r[i] = hsv_channel(5.0f, h6, maxc, vs);
        g[i] = hsv_channel(3.0f, h6, maxc, vs);
        b[i] = hsv_channel(1.0f, h6, maxc, vs);
    }
}

/* adjust_hue on a uint8 image converts it to float in [0, 1] and back with
 * torchvision's to_dtype: x * (255 + 1 - 1e-3), truncated.  Here the
 * values stay in [0, 255], so the factor is divided by 255. */
static void hue_to_uint8(float *restrict v, size_t count)
{
    const float to_uint8 = (255.0f + 1.0f - 1e-3f) / 255.0f;
    for (size_t i = 0; i < count; i++)
        v[i] = whole(v[i] * to_uint8);
}

static void jitter(const fl_color_draw *draw, float *r, float *g, float *b, size_t n)
{
    int uint8 = draw->uint8;
    for (int i = 0; i < FL_COLOR_OPS; i++) {
        int op = draw->order[i];
        if (!draw->on[op])
            continue;
        float factor = (float)draw->factor[op], rest = (float)(1.0 - draw->factor[op]);
        switch (op) {
        case FL_BRIGHTNESS: /* the three planes are contiguous */
            blend_constant(r, 3 * n, factor, rest, 0.0f, uint8);
            break;
        case FL_CONTRAST:
            blend_constant(r, 3 * n, factor, rest, mean_gray(r, g, b, n, uint8), uint8);
            break;
        case FL_SATURATION:
            blend_gray(r, g, b, n, factor, rest, uint8);
            break;
        default:
            shift_hue(r, g, b, n, factor);
            if (uint8)
                hue_to_uint8(r, 3 * n);
            break;
        }
    }
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif

void fl_color_apply(const fl_color_draw *draw, float *planes, size_t n)
{
    float *r = planes, *g = planes + n, *b = planes + 2 * n;
    if (draw->gray && draw->gray_first)
        to_gray(r, g, b, n, draw->uint8);
    jitter(draw, r, g, b, n);
    if (draw->gray && !draw->gray_first)
        to_gray(r, g, b, n, draw->uint8);
}
