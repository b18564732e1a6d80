/* fastload core: see mix.h. */
#include "core/image/mix.h"

#include "core/image/resample.h"
#include "core/image/simd.h"
#include "core/status.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ draws */

double fl_rng_gamma(fl_rng *rng, double shape)
{
    if (shape < 1.0) {
        double u = 1.0 - fl_rng_uniform(rng);
        return fl_rng_gamma(rng, shape + 1.0) * pow(u, 1.0 / shape);
    }
    double d = shape - 1.0 / 3.0, c = 1.0 / sqrt(9.0 * d);
    for (;;) {
        double x, v;
        do {
            x = fl_rng_normal(rng);
            v = 1.0 + c * x;
        } while (v <= 0.0);
        v = v * v * v;
        double u = 1.0 - fl_rng_uniform(rng);
        if (u < 1.0 - 0.0331 * (x * x) * (x * x))
            return d * v;
        if (log(u) < 0.5 * x * x + d * (1.0 - v + log(v)))
            return d * v;
    }
}

double fl_rng_beta(fl_rng *rng, double a, double b)
{
    double x = fl_rng_gamma(rng, a), y = fl_rng_gamma(rng, b);
    if (x + y == 0.0) /* both underflowed (tiny shapes): the mass sits at 0 and 1 */
        return fl_rng_uniform(rng) < a / (a + b) ? 1.0 : 0.0;
    return x / (x + y);
}

void fl_cutmix_box(double lam, int cx, int cy, int height, int width, fl_mix_params *out)
{
    double r = 0.5 * sqrt(1.0 - lam);
    int half_w = (int)(r * width), half_h = (int)(r * height);
    out->x1 = cx - half_w > 0 ? cx - half_w : 0;
    out->y1 = cy - half_h > 0 ? cy - half_h : 0;
    out->x2 = cx + half_w < width ? cx + half_w : width;
    out->y2 = cy + half_h < height ? cy + half_h : height;
    out->weight = 1.0 - (double)(out->x2 - out->x1) * (out->y2 - out->y1) /
                            ((double)width * height);
}

void fl_mix_draw(const fl_mix_plan *plan, uint64_t seed, uint64_t epoch, uint64_t batch,
                 int height, int width, fl_mix_params *out)
{
    fl_rng rng;
    fl_rng_init_stream(&rng, seed, epoch, batch, FL_STREAM_MIX);
    int pick = 0;
    if (plan->n > 1) {
        double u = fl_rng_uniform(&rng);
        while (pick < plan->n - 1 && u >= plan->cum_p[pick])
            pick++;
    }
    memset(out, 0, sizeof *out);
    out->kind = plan->kind[pick];
    double alpha = plan->alpha[pick];
    out->lam = fl_rng_beta(&rng, alpha, alpha);
    out->weight = out->lam;
    if (out->kind == FL_MIX_CUTMIX) {
        int cx = (int)fl_rng_below(&rng, width > 0 ? width : 1);
        int cy = (int)fl_rng_below(&rng, height > 0 ? height : 1);
        fl_cutmix_box(out->lam, cx, cy, height, width, out);
    }
}

/* ------------------------------------------------------------------ apply */

static float half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    uint32_t bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112u) << 23) | (man << 13);
    } else if (man == 0) {
        bits = sign;
    } else { /* subnormal: value man * 2^-24 */
        float f = (float)man * 0x1p-24f;
        return sign ? -f : f;
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* dst = src_other * (1 - lam) + dst * lam, rounded as torch rounds
 * `rolled.mul_(1 - lam).add_(image.mul(lam))`: each product to the dtype,
 * then their sum. */
FL_SIMD_CLONES
static void blend(void *dst, const void *other, size_t count, int dtype, float keep, float take)
{
    if (dtype == FL_DTYPE_FLOAT32) {
        float *d = dst;
        const float *o = other;
        for (size_t k = 0; k < count; k++) {
            float from_other = o[k] * take;
            float own = d[k] * keep;
            d[k] = from_other + own;
        }
    } else {
        uint16_t *d = dst;
        const uint16_t *o = other;
        for (size_t k = 0; k < count; k++) {
            float from_other = half_to_float(fl_float_to_half(half_to_float(o[k]) * take));
            float own = half_to_float(fl_float_to_half(half_to_float(d[k]) * keep));
            d[k] = fl_float_to_half(from_other + own);
        }
    }
}

/* Copies the box of `other` into `dst` (one image each). */
static void paste_box(char *dst, const char *other, const fl_mix_batch *b,
                      const fl_mix_params *p, size_t elem)
{
    size_t row = (size_t)b->width * elem, pixel = elem;
    size_t box_w = (size_t)(p->x2 - p->x1);
    if (b->nhwc) {
        row *= (size_t)b->channels;
        pixel *= (size_t)b->channels;
        for (int y = p->y1; y < p->y2; y++) {
            size_t at = (size_t)y * row + (size_t)p->x1 * pixel;
            memcpy(dst + at, other + at, box_w * pixel);
        }
        return;
    }
    size_t plane = row * (size_t)b->height;
    for (int c = 0; c < b->channels; c++)
        for (int y = p->y1; y < p->y2; y++) {
            size_t at = (size_t)c * plane + (size_t)y * row + (size_t)p->x1 * pixel;
            memcpy(dst + at, other + at, box_w * pixel);
        }
}

int fl_mix_apply(const fl_mix_params *params, int num_classes, fl_mix_batch *batch,
                 size_t *bad_position)
{
    size_t n = batch->n;
    for (size_t i = 0; i < n; i++)
        if (batch->labels[i] < 0 || batch->labels[i] >= num_classes) {
            *bad_position = i;
            return FL_ERR_INVALID;
        }
    if (params->kind == FL_MIX_MIXUP && batch->dtype == FL_DTYPE_UINT8)
        return FL_ERR_INVALID;
    if (n == 0)
        return FL_OK;

    /* Labels: torch's label.roll(1, 0).mul_(1 - w).add_(label.mul(w)) on
     * one-hot rows, in float32. */
    float keep = (float)params->weight, take = (float)(1.0 - params->weight);
    for (size_t i = 0; i < n; i++) {
        int64_t own = batch->labels[i], other = batch->labels[i == 0 ? n - 1 : i - 1];
        float *row = batch->soft + i * (size_t)num_classes;
        for (int k = 0; k < num_classes; k++) {
            float from_other = other == k ? take : 0.0f;
            float from_own = own == k ? keep : 0.0f;
            row[k] = from_other + from_own;
        }
    }

    /* Images: i takes from i - 1, so go down from the last and keep the
     * last's original for image 0. */
    size_t elem = fl_dtype_size(batch->dtype);
    size_t count = (size_t)batch->channels * (size_t)batch->height * (size_t)batch->width;
    size_t bytes = count * elem;
    if (params->kind == FL_MIX_CUTMIX && (params->x2 <= params->x1 || params->y2 <= params->y1))
        return FL_OK; /* an empty box changes no pixel */
    char *images = batch->images;
    char *last = malloc(bytes ? bytes : 1);
    if (!last)
        return FL_ERR_NOMEM;
    memcpy(last, images + (n - 1) * bytes, bytes);
    /* MixUp's image weights: lam for the image itself, as torchvision's
     * (the label weight equals it). */
    float own_w = (float)params->lam, other_w = (float)(1.0 - params->lam);
    for (size_t i = n; i-- > 0;) {
        char *dst = images + i * bytes;
        const char *other = i == 0 ? last : images + (i - 1) * bytes;
        if (params->kind == FL_MIX_MIXUP)
            blend(dst, other, count, batch->dtype, own_w, other_w);
        else
            paste_box(dst, other, batch, params, elem);
    }
    free(last);
    return FL_OK;
}
