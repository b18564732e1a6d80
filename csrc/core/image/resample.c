/* fastload core: see resample.h.
 *
 * A call builds one coefficient table per axis (in double, as Pillow does,
 * stored as float), then produces the output row by row, in one of the two
 * orders Pillow uses (see vertical_first):
 *
 * - Horizontal first.  Each output row needs a window of source rows; every
 *   source row entering a window is filtered horizontally once, into a ring
 *   of float rows that holds exactly one window, so the intermediate image
 *   never exists in full and the ring stays in cache whatever the image
 *   size.  The vertical filter over the ring gives the output row.
 * - Vertical first.  Each output row's window of source rows is filtered
 *   vertically into one float row, which the horizontal filter turns into
 *   the output row.
 *
 * Either way one last loop clips, scales, offsets, converts and stores the
 * row in the requested layout.  Intermediate values stay in float: only the
 * clipping of Pillow's 8-bit intermediate image is reproduced, not its
 * rounding, hence results within one level of Pillow's.
 *
 * Every window of an axis has the same number of taps (short windows at the
 * image edges are moved inwards and padded with zero weights), so the inner
 * loops have no per-pixel branches, and the hot loops are compiled once per
 * tap count so that gcc unrolls and vectorises them: a horizontal tap is
 * one 4-float SSE/NEON operation on R, G, B and a spare lane, a vertical
 * one runs over contiguous floats or bytes.
 */
#include "core/image/resample.h"

#include "core/image/simd.h"
#include "core/status.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

/* ------------------------------------------------------------------------ */
/* Scratch                                                                  */

typedef struct fl_buf {
    void *data;
    size_t cap; /* bytes */
} fl_buf;

enum {
    BUF_XFIRST, /* int[out_w]: first source column of each window */
    BUF_XW,     /* float[out_w * taps_x] */
    BUF_XW4,    /* float[out_w * taps_x * 4]: BUF_XW with each weight four times */
    BUF_YFIRST, /* int[out_h] */
    BUF_YW,     /* float[out_h * taps_y] */
    BUF_PIXELS, /* float[3 * src_w + 1]: one source row */
    BUF_RING,   /* float[taps_y * 4 * out_w]: horizontally filtered rows, RGB0 */
    BUF_ACC,    /* float[4 * out_w]: one output row before conversion */
    BUF_ROWS,   /* taps_y pointers: the rows of one vertical window */
    BUF_BYTES,  /* unsigned char[4 * out_w]: one output row as RGB0 bytes */
    BUF_COUNT
};

struct fl_resample_scratch {
    fl_buf bufs[BUF_COUNT];
};

fl_resample_scratch *fl_resample_scratch_new(void)
{
    return calloc(1, sizeof(fl_resample_scratch));
}

void fl_resample_scratch_free(fl_resample_scratch *scratch)
{
    if (!scratch)
        return;
    for (int i = 0; i < BUF_COUNT; i++)
        free(scratch->bufs[i].data);
    free(scratch);
}

/* Grows a buffer to at least `bytes`; the contents are not kept (every
 * buffer is rewritten by each call).  Sizes are rounded up to 64 bytes and
 * aligned to 64 so rows start on a cache line. */
static int reserve(fl_buf *buf, size_t bytes)
{
    if (bytes <= buf->cap)
        return FL_OK;
    if (bytes > SIZE_MAX / 2)
        return FL_ERR_NOMEM;
    size_t want = bytes + bytes / 4;
    want = (want + 63) & ~(size_t)63;
    void *data = aligned_alloc(64, want);
    if (!data)
        return FL_ERR_NOMEM;
    free(buf->data);
    buf->data = data;
    buf->cap = want;
    return FL_OK;
}

/* ------------------------------------------------------------------------ */
/* Coefficients                                                             */

static double bilinear(double x)
{
    x = fabs(x);
    return x < 1.0 ? 1.0 - x : 0.0;
}

static double bicubic(double x)
{
    /* Keys' cubic convolution with a = -0.5, as in Pillow. */
    const double a = -0.5;
    x = fabs(x);
    if (x < 1.0)
        return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
    if (x < 2.0)
        return (((x - 5.0) * x + 8.0) * x - 4.0) * a;
    return 0.0;
}

/* What one axis of a resize needs to place its windows. */
typedef struct fl_axis {
    int in_size, out_size, filter;
    double b0, scale;       /* box origin; box length / out_size */
    double support, inv;    /* half-width of a window; 1 / filter scale */
    int copy;               /* same size at an integer offset: a plain copy */
} fl_axis;

static fl_axis plan_axis(int in_size, double b0, double blen, int out_size, int filter,
                         int antialias)
{
    fl_axis a;
    a.in_size = in_size;
    a.out_size = out_size;
    a.filter = filter;
    a.b0 = b0;
    a.scale = blen / out_size;
    double filterscale = (antialias && a.scale > 1.0) ? a.scale : 1.0;
    a.support = (filter == FL_FILTER_BICUBIC ? 2.0 : 1.0) * filterscale;
    a.inv = 1.0 / filterscale;
    /* Every filter's weights are then 1 at the pixel and 0 elsewhere. */
    a.copy = blen == (double)out_size && b0 == floor(b0);
    return a;
}

/* The source samples lo .. hi - 1 that output i reads, as Pillow bounds
 * them (it truncates toward zero; values below zero clamp anyway). */
static void window_of(const fl_axis *a, int i, double *center, int *lo, int *hi)
{
    double c = a->b0 + (i + 0.5) * a->scale;
    double lo_d = c - a->support + 0.5;
    double hi_d = c + a->support + 0.5;
    *center = c;
    *lo = lo_d > 0.0 ? (int)lo_d : 0;
    *hi = hi_d < (double)a->in_size ? (int)hi_d : a->in_size;
    if (*hi <= *lo) {
        /* Cannot happen for a box inside the image; be safe anyway. */
        *lo = (int)fmin(fmax(floor(c), 0.0), (double)(a->in_size - 1));
        *hi = *lo + 1;
    }
}

/* The number of taps every window of the axis gets: the widest window.
 * (Pillow's bound, 2 * ceil(support) + 1, is often one or two more.) */
static int axis_taps(const fl_axis *a)
{
    if (a->filter == FL_FILTER_NEAREST || a->copy)
        return 1;
    int taps = 1;
    for (int i = 0; i < a->out_size; i++) {
        double c;
        int lo, hi;
        window_of(a, i, &c, &lo, &hi);
        if (hi - lo > taps)
            taps = hi - lo;
    }
    return taps;
}

/* Fills first[out_size] and weights[out_size * taps] for one axis, taps
 * from axis_taps.  Output i reads source samples first[i] .. first[i] +
 * taps - 1, all inside 0 .. in_size - 1. */
static void build_axis(const fl_axis *a, int taps, int *first, float *weights)
{
    if (a->copy && a->filter != FL_FILTER_NEAREST) {
        for (int i = 0; i < a->out_size; i++) {
            first[i] = (int)a->b0 + i;
            weights[i] = 1.0f;
        }
        return;
    }
    if (a->filter == FL_FILTER_NEAREST) {
        /* Pillow resizes with NEAREST through its affine transform, which
         * steps the sample position by repeated addition; doing the same
         * picks the same pixel when a position lands on an integer. */
        double pos = a->b0 + a->scale * 0.5;
        for (int i = 0; i < a->out_size; i++) {
            int x = pos < 0.0 ? 0 : (int)pos;
            first[i] = x < a->in_size ? x : a->in_size - 1;
            weights[i] = 1.0f;
            pos += a->scale;
        }
        return;
    }

    double (*kernel)(double) = a->filter == FL_FILTER_BICUBIC ? bicubic : bilinear;
    for (int i = 0; i < a->out_size; i++) {
        double center;
        int lo, hi;
        window_of(a, i, &center, &lo, &hi);
        /* Move the window inwards so all `taps` reads stay in the image. */
        int start = lo <= a->in_size - taps ? lo : a->in_size - taps;
        float *out = weights + (size_t)i * taps;
        for (int j = 0; j < taps; j++)
            out[j] = 0.0f;
        /* The kernel is evaluated twice rather than stored: no temporary
         * sized by the scale is needed. */
        double sum = 0.0;
        for (int x = lo; x < hi; x++)
            sum += kernel((x - center + 0.5) * a->inv);
        double norm = sum != 0.0 ? 1.0 / sum : 1.0;
        for (int x = lo; x < hi; x++)
            out[x - start] = (float)(kernel((x - center + 0.5) * a->inv) * norm);
        first[i] = start;
    }
}

/* Reverses the order of a table's windows: output column i then reads what
 * column n - 1 - i would have, which is the horizontal flip. */
static void mirror_axis(int n, int taps, int *first, float *weights)
{
    for (int i = 0, j = n - 1; i < j; i++, j--) {
        int f = first[i];
        first[i] = first[j];
        first[j] = f;
        float *a = weights + (size_t)i * taps, *b = weights + (size_t)j * taps;
        for (int t = 0; t < taps; t++) {
            float v = a[t];
            a[t] = b[t];
            b[t] = v;
        }
    }
}

/* ------------------------------------------------------------------------ */
/* Passes                                                                   */

static inline float clip255(float v)
{
    v = v > 0.0f ? v : 0.0f;
    return v < 255.0f ? v : 255.0f;
}

/* gcc and clang inline this when asked; elsewhere it is only slower. */
#if defined(__GNUC__)
#define FL_INLINE static inline __attribute__((always_inline))
#else
#define FL_INLINE static inline
#endif

/* Source columns lo .. hi - 1 of one RGB row as floats, indexed by absolute
 * sample (3 * column + channel), followed by one zero. */
static void widen_row(const unsigned char *restrict row, int lo, int hi, float *restrict px)
{
    size_t end = 3 * (size_t)hi;
    for (size_t j = 3 * (size_t)lo; j < end; j++)
        px[j] = row[j];
    px[end] = 0.0f;
}

/* Horizontal filter of one widened row into n RGB0 pixels (4 floats each).
 * Each tap reads four consecutive floats (R, G, B and the next pixel's R,
 * which the zero after the row keeps in bounds) and four copies of its
 * weight, so the four sums are one SSE/NEON vector; the fourth sum is
 * stored and never used.  With `taps` a constant the tap loop unrolls and
 * the vectoriser pairs the lanes.  `clip` (for filters with negative lobes)
 * clips to 0..255 as Pillow's 8-bit intermediate image does; with
 * non-negative weights the sums cannot leave that range. */
FL_INLINE void filter_row_body(const float *restrict px, const int *restrict first,
                               const float *restrict weights4, int taps, int n, int clip,
                               float *restrict out)
{
    for (int i = 0; i < n; i++) {
        const float *p = px + 3 * (size_t)first[i];
        const float *k = weights4 + 4 * (size_t)i * taps;
        float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
        for (int t = 0; t < taps; t++) {
            s0 += k[4 * t + 0] * p[3 * t + 0];
            s1 += k[4 * t + 1] * p[3 * t + 1];
            s2 += k[4 * t + 2] * p[3 * t + 2];
            s3 += k[4 * t + 3] * p[3 * t + 3];
        }
        if (clip) {
            s0 = clip255(s0);
            s1 = clip255(s1);
            s2 = clip255(s2);
            s3 = clip255(s3);
        }
        out[4 * i + 0] = s0;
        out[4 * i + 1] = s1;
        out[4 * i + 2] = s2;
        out[4 * i + 3] = s3;
    }
}

/* One copy of the body per tap count up to 16 (a bilinear shrink by up to
 * 7.5 or a bicubic one by up to 3.75) and per clip; larger counts take the
 * generic loop, which gcc vectorises less well. */
FL_SIMD_CLONES
static void filter_row(const float *px, const int *first, const float *weights4, int taps,
                       int n, int clip, float *out)
{
    switch (taps * 2 + !!clip) {
#define FL_TAPS_CASE(k)                                                                        \
    case 2 * k: filter_row_body(px, first, weights4, k, n, 0, out); break;                     \
    case 2 * k + 1: filter_row_body(px, first, weights4, k, n, 1, out); break;
    FL_TAPS_CASE(1) FL_TAPS_CASE(2) FL_TAPS_CASE(3) FL_TAPS_CASE(4)
    FL_TAPS_CASE(5) FL_TAPS_CASE(6) FL_TAPS_CASE(7) FL_TAPS_CASE(8)
    FL_TAPS_CASE(9) FL_TAPS_CASE(10) FL_TAPS_CASE(11) FL_TAPS_CASE(12)
    FL_TAPS_CASE(13) FL_TAPS_CASE(14) FL_TAPS_CASE(15) FL_TAPS_CASE(16)
#undef FL_TAPS_CASE
    default: filter_row_body(px, first, weights4, taps, n, clip, out); break;
    }
}

/* The horizontal pass when it is a pure selection of pixels (NEAREST, or
 * the same size at an integer offset): no widening, no arithmetic. */
static void pick_row(const unsigned char *restrict row, const int *restrict first, int n,
                     float *restrict out)
{
    for (int i = 0; i < n; i++) {
        const unsigned char *p = row + 3 * (size_t)first[i];
        out[4 * i + 0] = p[0];
        out[4 * i + 1] = p[1];
        out[4 * i + 2] = p[2];
        out[4 * i + 3] = 0.0f;
    }
}

/* acc = sum over t of weights[t] * rows[t], for n floats; one pass over
 * acc whatever the tap count when `taps` is a constant. */
FL_INLINE void filter_column_body(const float *const *restrict rows,
                                  const float *restrict weights, int taps, int n,
                                  float *restrict acc)
{
    for (int x = 0; x < n; x++) {
        float s = 0.0f;
        for (int t = 0; t < taps; t++)
            s += weights[t] * rows[t][x];
        acc[x] = s;
    }
}

FL_SIMD_CLONES
static void filter_column(const float *const *rows, const float *weights, int taps, int n,
                          float *acc)
{
    switch (taps) {
#define FL_TAPS_CASE(k)                                                                        \
    case k: filter_column_body(rows, weights, k, n, acc); break;
    FL_TAPS_CASE(1) FL_TAPS_CASE(2) FL_TAPS_CASE(3) FL_TAPS_CASE(4)
    FL_TAPS_CASE(5) FL_TAPS_CASE(6) FL_TAPS_CASE(7) FL_TAPS_CASE(8)
#undef FL_TAPS_CASE
    default: {
        /* Accumulate in passes of up to eight rows. */
        filter_column_body(rows, weights, 8, n, acc);
        for (int t = 8; t < taps; t++) {
            const float *restrict r = rows[t];
            float k = weights[t];
            for (int x = 0; x < n; x++)
                acc[x] += k * r[x];
        }
        break;
    }
    }
}

/* The vertical pass straight from the source (the vertical-first order):
 * px[j] = sum over t of weights[t] * rows[t][j] for samples j = lo .. hi - 1,
 * clipped like an 8-bit intermediate when `clip`, then the zero after the
 * row that filter_row expects. */
FL_INLINE void vertical_row_body(const unsigned char *const *restrict rows,
                                 const float *restrict weights, int taps, size_t lo, size_t hi,
                                 int clip, float *restrict px)
{
    for (size_t j = lo; j < hi; j++) {
        float s = 0.0f;
        for (int t = 0; t < taps; t++)
            s += weights[t] * rows[t][j];
        px[j] = clip ? clip255(s) : s;
    }
    px[hi] = 0.0f;
}

FL_SIMD_CLONES
static void vertical_row(const unsigned char *const *rows, const float *weights, int taps,
                         size_t lo, size_t hi, int clip, float *px)
{
    switch (taps * 2 + !!clip) {
#define FL_TAPS_CASE(k)                                                                        \
    case 2 * k: vertical_row_body(rows, weights, k, lo, hi, 0, px); break;                     \
    case 2 * k + 1: vertical_row_body(rows, weights, k, lo, hi, 1, px); break;
    FL_TAPS_CASE(1) FL_TAPS_CASE(2) FL_TAPS_CASE(3) FL_TAPS_CASE(4)
    FL_TAPS_CASE(5) FL_TAPS_CASE(6) FL_TAPS_CASE(7) FL_TAPS_CASE(8)
#undef FL_TAPS_CASE
    default: vertical_row_body(rows, weights, taps, lo, hi, clip, px); break;
    }
}

/* ------------------------------------------------------------------------ */
/* Output conversion                                                        */

typedef union fl_bits {
    float f;
    uint32_t u;
} fl_bits;

/* Rounding to nearest even is left to the FPU: adding 2^(E + 13) to |value|,
 * where 2^E is the value's binade (at least 2^-14, the smallest normal
 * half), gives a float whose ulp is the half's ulp at that binade, so the
 * float addition rounds exactly as the conversion must, and the sum's 23
 * mantissa bits are the half's significand, implicit bit included: adding
 * them to the exponent field lets a carry move to the next binade (or to
 * infinity).  Subnormal halves are the E = -14 case.  Magnitudes of 65536
 * and up (infinity and NaN included) are first lowered to just below 65536,
 * which rounds to infinity; NaN then gets its quiet bit and payload ORed
 * in.  The float sum is used by every lane: gcc will not vectorise a loop
 * whose float operation only one arm of a selection needs. */
static inline uint16_t to_half(float value)
{
    fl_bits in = {.f = value};
    /* Magnitudes compare as signed integers: SSE2 has no unsigned compare. */
    int32_t mag = (int32_t)(in.u & 0x7fffffffu);
    int32_t nan = -(int32_t)(mag > 0x7f800000);
    int32_t clamped = mag < 0x477fffff ? mag : 0x477fffff;
    int32_t e = clamped >> 23; /* biased float exponent, at most 142 (2^15) */
    e = e > 113 ? e : 113;     /* 2^-14 */
    fl_bits a = {.u = (uint32_t)clamped}, c = {.u = (uint32_t)(e + 13) << 23};
    fl_bits sum = {.f = a.f + c.f};
    uint32_t h = ((uint32_t)(e - 113) << 10) + (sum.u & 0x7fffffu);
    h |= (uint32_t)nan & (0x0200u | (((uint32_t)mag >> 13) & 0x3ffu));
    return (uint16_t)(h | ((in.u >> 16) & 0x8000u));
}

/* Round half up, then clamp.  Adding before clamping (rather than after)
 * is what lets gcc if-convert and vectorise the loops. */
static inline unsigned char to_byte(float v)
{
    return (unsigned char)(int32_t)clip255(v + 0.5f);
}

/* to_byte for a value a resize filter made from bytes: at most 255 times
 * the sum of its weights' magnitudes, so the conversion is defined, and
 * clamping the integer gives to_byte's result.  gcc vectorises the float
 * clamp of to_byte into compares and blends per byte lane, three times
 * slower than this. */
static inline unsigned char filtered_byte(float v)
{
    int32_t i = (int32_t)(v + 0.5f);
    i = i < 0 ? 0 : i;
    return (unsigned char)(i > 255 ? 255 : i);
}

unsigned short fl_float_to_half(float value)
{
    return to_half(value);
}

/* Writes output row y from three channels of `width` values, element x of
 * channel c at c_x[step * x].  One loop per dtype and layout so that each
 * vectorises on its own; inlined for each constant step. */
static inline void store_channels(const fl_resample_target *t, int y, const float *restrict a0,
                                  const float *restrict a1, const float *restrict a2, int step)
{
    size_t n = (size_t)t->width;
    size_t plane = (size_t)t->width * t->height;
    size_t row = (size_t)y * n;
    const float s0 = t->scale[0], s1 = t->scale[1], s2 = t->scale[2];
    const float o0 = t->offset[0], o1 = t->offset[1], o2 = t->offset[2];

    switch (t->dtype * 2 + t->layout) {
    case FL_DTYPE_FLOAT32 * 2 + FL_LAYOUT_CHW: {
        float *restrict d0 = (float *)t->dst + row;
        float *restrict d1 = d0 + plane;
        float *restrict d2 = d1 + plane;
        for (size_t x = 0; x < n; x++) {
            d0[x] = clip255(a0[step * x]) * s0 + o0;
            d1[x] = clip255(a1[step * x]) * s1 + o1;
            d2[x] = clip255(a2[step * x]) * s2 + o2;
        }
        break;
    }
    case FL_DTYPE_FLOAT32 * 2 + FL_LAYOUT_HWC: {
        float *restrict d = (float *)t->dst + 3 * row;
        for (size_t x = 0; x < n; x++) {
            d[3 * x + 0] = clip255(a0[step * x]) * s0 + o0;
            d[3 * x + 1] = clip255(a1[step * x]) * s1 + o1;
            d[3 * x + 2] = clip255(a2[step * x]) * s2 + o2;
        }
        break;
    }
    case FL_DTYPE_UINT8 * 2 + FL_LAYOUT_CHW: {
        unsigned char *restrict d0 = (unsigned char *)t->dst + row;
        unsigned char *restrict d1 = d0 + plane;
        unsigned char *restrict d2 = d1 + plane;
        for (size_t x = 0; x < n; x++) {
            d0[x] = to_byte(clip255(a0[step * x]) * s0 + o0);
            d1[x] = to_byte(clip255(a1[step * x]) * s1 + o1);
            d2[x] = to_byte(clip255(a2[step * x]) * s2 + o2);
        }
        break;
    }
    case FL_DTYPE_UINT8 * 2 + FL_LAYOUT_HWC: {
        unsigned char *restrict d = (unsigned char *)t->dst + 3 * row;
        for (size_t x = 0; x < n; x++) {
            d[3 * x + 0] = to_byte(clip255(a0[step * x]) * s0 + o0);
            d[3 * x + 1] = to_byte(clip255(a1[step * x]) * s1 + o1);
            d[3 * x + 2] = to_byte(clip255(a2[step * x]) * s2 + o2);
        }
        break;
    }
    case FL_DTYPE_FLOAT16 * 2 + FL_LAYOUT_CHW: {
        uint16_t *restrict d0 = (uint16_t *)t->dst + row;
        uint16_t *restrict d1 = d0 + plane;
        uint16_t *restrict d2 = d1 + plane;
        for (size_t x = 0; x < n; x++) {
            d0[x] = to_half(clip255(a0[step * x]) * s0 + o0);
            d1[x] = to_half(clip255(a1[step * x]) * s1 + o1);
            d2[x] = to_half(clip255(a2[step * x]) * s2 + o2);
        }
        break;
    }
    default: { /* FL_DTYPE_FLOAT16, FL_LAYOUT_HWC */
        uint16_t *restrict d = (uint16_t *)t->dst + 3 * row;
        for (size_t x = 0; x < n; x++) {
            d[3 * x + 0] = to_half(clip255(a0[step * x]) * s0 + o0);
            d[3 * x + 1] = to_half(clip255(a1[step * x]) * s1 + o1);
            d[3 * x + 2] = to_half(clip255(a2[step * x]) * s2 + o2);
        }
        break;
    }
    }
}

/* Whether the target's scale and offset leave values as they are. */
static int plain_bytes(const fl_resample_target *t)
{
    return t->dtype == FL_DTYPE_UINT8 && t->layout == FL_LAYOUT_HWC && t->scale[0] == 1.0f &&
           t->scale[1] == 1.0f && t->scale[2] == 1.0f && t->offset[0] == 0.0f &&
           t->offset[1] == 0.0f && t->offset[2] == 0.0f;
}

/* store_channels' float32 planes from an RGB0 row, four pixels at a time:
 * the four pixels' vectors transposed into R, G, B (and spare) vectors,
 * so every load and store is a whole vector, where the strided loop gcc
 * makes of store_channels shuffles lane by lane.  The same operations on
 * each value: max(v, 0) and min(v, 255) select exactly as clip255's
 * comparisons do (NaN included), then one multiply and one add, each
 * rounded (no FMA), so the values are store_channels' bit for bit. */
static void store_rgb0_planes(const float *restrict acc, size_t n, const float *scale,
                              const float *offset, float *restrict d0, float *restrict d1,
                              float *restrict d2)
{
    size_t x = 0;
#if defined(__SSE2__)
    const __m128 zero = _mm_setzero_ps(), top = _mm_set1_ps(255.0f);
    const __m128 s0 = _mm_set1_ps(scale[0]), s1 = _mm_set1_ps(scale[1]),
                 s2 = _mm_set1_ps(scale[2]);
    const __m128 o0 = _mm_set1_ps(offset[0]), o1 = _mm_set1_ps(offset[1]),
                 o2 = _mm_set1_ps(offset[2]);
    for (; x + 4 <= n; x += 4) {
        __m128 r = _mm_loadu_ps(acc + 4 * x), g = _mm_loadu_ps(acc + 4 * x + 4);
        __m128 b = _mm_loadu_ps(acc + 4 * x + 8), z = _mm_loadu_ps(acc + 4 * x + 12);
        _MM_TRANSPOSE4_PS(r, g, b, z);
        (void)z;
        r = _mm_min_ps(_mm_max_ps(r, zero), top);
        g = _mm_min_ps(_mm_max_ps(g, zero), top);
        b = _mm_min_ps(_mm_max_ps(b, zero), top);
        _mm_storeu_ps(d0 + x, _mm_add_ps(_mm_mul_ps(r, s0), o0));
        _mm_storeu_ps(d1 + x, _mm_add_ps(_mm_mul_ps(g, s1), o1));
        _mm_storeu_ps(d2 + x, _mm_add_ps(_mm_mul_ps(b, s2), o2));
    }
#endif
    for (; x < n; x++) {
        d0[x] = clip255(acc[4 * x + 0]) * scale[0] + offset[0];
        d1[x] = clip255(acc[4 * x + 1]) * scale[1] + offset[1];
        d2[x] = clip255(acc[4 * x + 2]) * scale[2] + offset[2];
    }
}

/* Output row y from acc (width RGB0 pixels). */
FL_SIMD_CLONES
static void store_row(const fl_resample_target *t, int y, const float *acc,
                      unsigned char *restrict bytes)
{
    if (plain_bytes(t)) {
        /* The uint8 HWC image of the augmentation stage.  With scale 1 and
         * offset 0, to_byte(clip255(v) * 1 + 0) is to_byte(v) (to_byte
         * clamps), which is filtered_byte(v): each byte a function of its
         * own float, converted over the contiguous RGB0 row (a loop gcc
         * vectorises, where the interleaved one stays scalar), then the
         * spare lanes dropped. */
        size_t n = (size_t)t->width;
        for (size_t i = 0; i < 4 * n; i++)
            bytes[i] = filtered_byte(acc[i]);
        unsigned char *restrict d = (unsigned char *)t->dst + 3 * (size_t)y * n;
        for (size_t x = 0; x < n; x++) {
            d[3 * x + 0] = bytes[4 * x + 0];
            d[3 * x + 1] = bytes[4 * x + 1];
            d[3 * x + 2] = bytes[4 * x + 2];
        }
        return;
    }
    if (t->dtype == FL_DTYPE_FLOAT32 && t->layout == FL_LAYOUT_CHW) {
        /* ToTensor (+ Normalize): the training pipeline's output. */
        size_t plane = (size_t)t->width * t->height;
        float *d0 = (float *)t->dst + (size_t)y * t->width;
        store_rgb0_planes(acc, (size_t)t->width, t->scale, t->offset, d0, d0 + plane,
                          d0 + 2 * plane);
        return;
    }
    store_channels(t, y, acc, acc + 1, acc + 2, 4);
}

/* The stored value of each byte value in each channel: store_channels'
 * expression on (float)v, so a pixel picked from the source (NEAREST, or a
 * same-size copy) is stored with three table reads. */
typedef union fl_store_lut {
    float f32[3][256];
    uint16_t f16[3][256];
    unsigned char u8[3][256];
} fl_store_lut;

static void build_store_lut(const fl_resample_target *t, fl_store_lut *lut)
{
    for (int c = 0; c < 3; c++) {
        for (int v = 0; v < 256; v++) {
            float value = clip255((float)v) * t->scale[c] + t->offset[c];
            if (t->dtype == FL_DTYPE_FLOAT32)
                lut->f32[c][v] = value;
            else if (t->dtype == FL_DTYPE_FLOAT16)
                lut->f16[c][v] = to_half(value);
            else
                lut->u8[c][v] = to_byte(value);
        }
    }
}

#define FL_STORE_PICKED(type, table)                                                           \
    do {                                                                                       \
        type *restrict d = (type *)t->dst;                                                     \
        if (t->layout == FL_LAYOUT_CHW) {                                                      \
            type *restrict d0 = d + (size_t)y * n, *restrict d1 = d0 + plane,                  \
                           *restrict d2 = d1 + plane;                                          \
            for (int x = 0; x < n; x++) {                                                      \
                const unsigned char *p = row + 3 * (size_t)first[x];                           \
                d0[x] = (table)[0][p[0]];                                                      \
                d1[x] = (table)[1][p[1]];                                                      \
                d2[x] = (table)[2][p[2]];                                                      \
            }                                                                                  \
        } else {                                                                               \
            d += 3 * (size_t)y * n;                                                            \
            for (int x = 0; x < n; x++) {                                                      \
                const unsigned char *p = row + 3 * (size_t)first[x];                           \
                d[3 * x + 0] = (table)[0][p[0]];                                               \
                d[3 * x + 1] = (table)[1][p[1]];                                               \
                d[3 * x + 2] = (table)[2][p[2]];                                               \
            }                                                                                  \
        }                                                                                      \
    } while (0)

/* Output row y picked from source row `row` at columns first[0 .. width). */
static void store_picked(const fl_resample_target *t, int y, const unsigned char *restrict row,
                         const int *restrict first, const fl_store_lut *lut)
{
    int n = t->width;
    size_t plane = (size_t)t->width * t->height;
    if (t->dtype == FL_DTYPE_FLOAT32)
        FL_STORE_PICKED(float, lut->f32);
    else if (t->dtype == FL_DTYPE_FLOAT16)
        FL_STORE_PICKED(uint16_t, lut->f16);
    else
        FL_STORE_PICKED(unsigned char, lut->u8);
}
#undef FL_STORE_PICKED

/* Stores n consecutive RGB pixels from p into three planes as floats:
 * v * scale + offset, the store table's expression computed in place. */
FL_INLINE void store_run_planes(const unsigned char *restrict p, size_t n, const float *scale,
                                const float *offset, float *restrict d0, float *restrict d1,
                                float *restrict d2)
{
    const float s0 = scale[0], s1 = scale[1], s2 = scale[2];
    const float o0 = offset[0], o1 = offset[1], o2 = offset[2];
    for (size_t x = 0; x < n; x++) {
        d0[x] = (float)p[3 * x + 0] * s0 + o0;
        d1[x] = (float)p[3 * x + 1] * s1 + o1;
        d2[x] = (float)p[3 * x + 2] * s2 + o2;
    }
}

/* The same into interleaved pixels. */
FL_INLINE void store_run_pixels(const unsigned char *restrict p, size_t n, const float *scale,
                                const float *offset, float *restrict d)
{
    const float s0 = scale[0], s1 = scale[1], s2 = scale[2];
    const float o0 = offset[0], o1 = offset[1], o2 = offset[2];
    for (size_t x = 0; x < n; x++) {
        d[3 * x + 0] = (float)p[3 * x + 0] * s0 + o0;
        d[3 * x + 1] = (float)p[3 * x + 1] * s1 + o1;
        d[3 * x + 2] = (float)p[3 * x + 2] * s2 + o2;
    }
}

/* Output row y copied 1:1 from consecutive RGB pixels at p into float32:
 * the values store_picked's table gives, computed in loops that vectorise,
 * where the table reads (gathers) do not. */
FL_SIMD_CLONES
static void store_run(const fl_resample_target *t, int y, const unsigned char *p)
{
    size_t n = (size_t)t->width;
    float *d = (float *)t->dst;
    if (t->layout == FL_LAYOUT_CHW) {
        size_t plane = (size_t)t->width * t->height;
        d += (size_t)y * n;
        store_run_planes(p, n, t->scale, t->offset, d, d + plane, d + 2 * plane);
    } else {
        store_run_pixels(p, n, t->scale, t->offset, d + 3 * (size_t)y * n);
    }
}

/* Whether first[0 .. n) are consecutive columns. */
static int consecutive(const int *first, int n)
{
    for (int i = 1; i < n; i++)
        if (first[i] != first[0] + i)
            return 0;
    return 1;
}

/* ------------------------------------------------------------------------ */
/* Entry point                                                              */

/* The target's checks, all but dst (which the tables do not need). */
static int valid_target_shape(const fl_resample_target *t)
{
    if (!t || t->width < 1 || t->height < 1)
        return 0;
    if (t->filter != FL_FILTER_NEAREST && t->filter != FL_FILTER_BILINEAR &&
        t->filter != FL_FILTER_BICUBIC)
        return 0;
    if (t->layout != FL_LAYOUT_CHW && t->layout != FL_LAYOUT_HWC)
        return 0;
    if (t->dtype != FL_DTYPE_UINT8 && t->dtype != FL_DTYPE_FLOAT32 &&
        t->dtype != FL_DTYPE_FLOAT16)
        return 0;
    /* The output index arithmetic is done in size_t, but the per-row loops
     * count in int. */
    if ((size_t)t->width > (size_t)INT32_MAX / 4 ||
        (size_t)t->width * (size_t)t->height > SIZE_MAX / 16)
        return 0;
    for (int c = 0; c < 3; c++)
        if (!isfinite(t->scale[c]) || !isfinite(t->offset[c]))
            return 0;
    return 1;
}

static int valid_target(const fl_resample_target *t)
{
    return valid_target_shape(t) && t->dst;
}

/* Which pass runs first.  The order matters only through the clipping of
 * the intermediate values (filters with negative lobes) and, in Pillow,
 * their rounding to 8 bits; following Pillow keeps bicubic results within
 * one level of it.  Pillow 13 resizes vertically first when the height
 * shrinks by more than twice what the width does (python-pillow/Pillow
 * #9549); earlier versions always go horizontally first.  The rule looks at
 * the source image's size, not the box's, as Pillow's does. */
static int vertical_first(int src_w, int src_h, int out_w, int out_h)
{
    return out_h < src_h && (long long)src_h - out_h > 2 * ((long long)src_w - out_w);
}

size_t fl_dtype_size(int dtype)
{
    return dtype == FL_DTYPE_FLOAT32 ? 4 : dtype == FL_DTYPE_FLOAT16 ? 2 : 1;
}

/* The box may overshoot the image by a rounding error; a real overshoot is
 * refused, as Pillow refuses it. */
#define BOX_SLACK 1e-6

/* The source samples lo .. hi - 1 that some output of an axis reads. */
static void axis_span(const int *first, int n, int taps, int *lo, int *hi)
{
    *lo = first[0];
    *hi = first[0] + taps;
    for (int i = 1; i < n; i++) {
        if (first[i] < *lo)
            *lo = first[i];
        if (first[i] + taps > *hi)
            *hi = first[i] + taps;
    }
}

int fl_resample_tables(int src_w, int src_h, double box_x, double box_y, double box_w,
                       double box_h, const fl_resample_target *target,
                       fl_resample_scratch *scratch, fl_resample_coeffs *out)
{
    if (!scratch || !out || !valid_target_shape(target) || src_w < 1 || src_h < 1 ||
        src_w > INT32_MAX / 4)
        return FL_ERR_INVALID;
    if (!(isfinite(box_x) && isfinite(box_y) && isfinite(box_w) && isfinite(box_h)) ||
        box_x < 0.0 || box_y < 0.0 || !(box_w > 0.0) || !(box_h > 0.0) ||
        box_x + box_w > src_w + BOX_SLACK || box_y + box_h > src_h + BOX_SLACK)
        return FL_ERR_INVALID;

    const fl_resample_target *t = target;
    int out_w = t->width, out_h = t->height;
    fl_axis ax = plan_axis(src_w, box_x, box_w, out_w, t->filter, t->antialias);
    fl_axis ay = plan_axis(src_h, box_y, box_h, out_h, t->filter, t->antialias);
    int taps_x = axis_taps(&ax), taps_y = axis_taps(&ay);
    fl_buf *b = scratch->bufs;
    int rc;
    if ((rc = reserve(&b[BUF_XFIRST], sizeof(int) * (size_t)out_w)) != FL_OK ||
        (rc = reserve(&b[BUF_XW], sizeof(float) * (size_t)out_w * taps_x)) != FL_OK ||
        (rc = reserve(&b[BUF_YFIRST], sizeof(int) * (size_t)out_h)) != FL_OK ||
        (rc = reserve(&b[BUF_YW], sizeof(float) * (size_t)out_h * taps_y)) != FL_OK)
        return rc;

    int *xfirst = b[BUF_XFIRST].data, *yfirst = b[BUF_YFIRST].data;
    float *xw = b[BUF_XW].data, *yw = b[BUF_YW].data;
    build_axis(&ax, taps_x, xfirst, xw);
    build_axis(&ay, taps_y, yfirst, yw);
    if (t->flip)
        mirror_axis(out_w, taps_x, xfirst, xw);

    out->x.taps = taps_x;
    out->x.first = xfirst;
    out->x.weights = xw;
    axis_span(xfirst, out_w, taps_x, &out->x.lo, &out->x.hi);
    out->y.taps = taps_y;
    out->y.first = yfirst;
    out->y.weights = yw;
    axis_span(yfirst, out_h, taps_y, &out->y.lo, &out->y.hi);
    out->vertical_first = vertical_first(src_w, src_h, out_w, out_h);
    out->clip = t->filter == FL_FILTER_BICUBIC;
    return FL_OK;
}

FL_SIMD_CLONES
int fl_resample(const unsigned char *src, int src_w, int src_h, size_t src_stride,
                double box_x, double box_y, double box_w, double box_h,
                const fl_resample_target *target, fl_resample_scratch *scratch)
{
    if (!src || !valid_target(target) || src_w < 1 || src_w > INT32_MAX / 4 ||
        src_stride < (size_t)src_w * 3)
        return FL_ERR_INVALID;
    fl_resample_coeffs tables;
    int rc = fl_resample_tables(src_w, src_h, box_x, box_y, box_w, box_h, target, scratch,
                                &tables);
    if (rc != FL_OK)
        return rc;

    const fl_resample_target *t = target;
    int out_w = t->width, out_h = t->height;
    int taps_x = tables.x.taps, taps_y = tables.y.taps;
    int vfirst = tables.vertical_first, clip = tables.clip;
    const int *xfirst = tables.x.first, *yfirst = tables.y.first;
    const float *xw = tables.x.weights, *yw = tables.y.weights;
    /* Only the source columns some window reads are widened. */
    int col_lo = tables.x.lo, col_hi = tables.x.hi;

    fl_buf *b = scratch->bufs;
    size_t ring_row = (size_t)4 * out_w; /* floats in one output-width row */
    if ((rc = reserve(&b[BUF_XW4], sizeof(float) * 4 * (size_t)out_w * taps_x)) != FL_OK ||
        (rc = reserve(&b[BUF_PIXELS], sizeof(float) * (3 * (size_t)src_w + 1))) != FL_OK ||
        (rc = reserve(&b[BUF_RING], vfirst ? 0 : sizeof(float) * ring_row * taps_y)) != FL_OK ||
        (rc = reserve(&b[BUF_ACC], sizeof(float) * ring_row)) != FL_OK ||
        (rc = reserve(&b[BUF_ROWS], sizeof(void *) * (size_t)taps_y)) != FL_OK ||
        (rc = reserve(&b[BUF_BYTES], 4 * (size_t)out_w)) != FL_OK)
        return rc;

    float *xw4 = b[BUF_XW4].data;
    float *px = b[BUF_PIXELS].data, *ring = b[BUF_RING].data, *acc = b[BUF_ACC].data;
    unsigned char *bytes = b[BUF_BYTES].data;
    for (size_t i = 0; i < (size_t)out_w * taps_x; i++)
        xw4[4 * i + 0] = xw4[4 * i + 1] = xw4[4 * i + 2] = xw4[4 * i + 3] = xw[i];

    if (taps_x == 1 && taps_y == 1) {
        /* NEAREST or a plain copy: a gather per output row. */
        if (t->dtype == FL_DTYPE_FLOAT32 && consecutive(xfirst, out_w)) {
            const unsigned char *start = src + 3 * (size_t)xfirst[0];
            for (int y = 0; y < out_h; y++)
                store_run(t, y, start + (size_t)yfirst[y] * src_stride);
            return FL_OK;
        }
        fl_store_lut lut;
        build_store_lut(t, &lut);
        for (int y = 0; y < out_h; y++)
            store_picked(t, y, src + (size_t)yfirst[y] * src_stride, xfirst, &lut);
        return FL_OK;
    }
    if (vfirst) {
        /* Each output row: its vertical window straight from the source
         * rows into one float row, then the horizontal filter. */
        const unsigned char **rows = b[BUF_ROWS].data;
        for (int y = 0; y < out_h; y++) {
            for (int j = 0; j < taps_y; j++)
                rows[j] = src + (size_t)(yfirst[y] + j) * src_stride;
            vertical_row(rows, yw + (size_t)y * taps_y, taps_y, 3 * (size_t)col_lo,
                         3 * (size_t)col_hi, clip, px);
            filter_row(px, xfirst, xw4, taps_x, out_w, 0, acc);
            store_row(t, y, acc, bytes);
        }
        return FL_OK;
    }

    /* Horizontal first.  Source row r lives in ring slot r % taps_y while
     * it is in a window.  Windows only move down, so each row is filtered
     * once, and the row a new one overwrites (r - taps_y) is above the
     * current window. */
    const float **rows = b[BUF_ROWS].data;
    int next_row = yfirst[0]; /* first source row not yet filtered */
    for (int y = 0; y < out_h; y++) {
        int top = yfirst[y];
        if (next_row < top)
            next_row = top;
        for (; next_row < top + taps_y; next_row++) {
            const unsigned char *row = src + (size_t)next_row * src_stride;
            float *slot = ring + (size_t)(next_row % taps_y) * ring_row;
            if (taps_x == 1) {
                pick_row(row, xfirst, out_w, slot);
            } else {
                widen_row(row, col_lo, col_hi, px);
                filter_row(px, xfirst, xw4, taps_x, out_w, clip, slot);
            }
        }
        for (int j = 0; j < taps_y; j++)
            rows[j] = ring + (size_t)((top + j) % taps_y) * ring_row;
        filter_column(rows, yw + (size_t)y * taps_y, taps_y, (int)ring_row, acc);
        store_row(t, y, acc, bytes);
    }
    return FL_OK;
}

int fl_resample_store(const float *planes, const fl_resample_target *target)
{
    if (!planes || !valid_target(target))
        return FL_ERR_INVALID;
    const fl_resample_target *t = target;
    size_t plane = (size_t)t->width * t->height;
    for (int y = 0; y < t->height; y++) {
        const float *r = planes + (size_t)t->width * y;
        store_channels(t, y, r, r + plane, r + 2 * plane, 1);
    }
    return FL_OK;
}
