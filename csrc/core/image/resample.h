/* fastload core: resampling an RGB image into a training sample — resize,
 * horizontal flip, per-channel normalisation, layout and dtype in one pass.
 *
 * The resize has the semantics of Pillow's Image.resize(size, resample,
 * box=box) on an RGB image: the same filters, the same coefficients (support
 * widened by the scale when shrinking with antialias, centres at
 * box_origin + (i + 0.5) * scale, weights normalised), source pixels outside
 * the box but inside the image take part in the filter, and intermediate and
 * final values are clipped to 0..255.  The arithmetic is float rather than
 * Pillow's 8-bit fixed point, so uint8 results may differ from Pillow's by 1.
 *
 * To get crop-then-resize semantics (torchvision's resized_crop), pass only
 * the pixels the box touches: src at (floor(box_x), floor(box_y)), size
 * ceil(box end) - floor(box origin), and the box relative to that.
 *
 * Calls are thread-safe as long as each thread uses its own scratch.  No
 * call allocates when its scratch is already large enough.
 */
#ifndef FL_RESAMPLE_H
#define FL_RESAMPLE_H

#include <stddef.h>

enum { FL_FILTER_NEAREST, FL_FILTER_BILINEAR, FL_FILTER_BICUBIC };
enum { FL_LAYOUT_CHW, FL_LAYOUT_HWC };
enum { FL_DTYPE_UINT8, FL_DTYPE_FLOAT32, FL_DTYPE_FLOAT16 };

/* The bytes of one element of FL_DTYPE_* `dtype`. */
size_t fl_dtype_size(int dtype);

/* Coefficient tables and row buffers, reused and grown across calls.  One
 * per worker thread. */
typedef struct fl_resample_scratch fl_resample_scratch;

/* Returns an empty scratch, or NULL when out of memory. */
fl_resample_scratch *fl_resample_scratch_new(void);

/* Frees a scratch and its buffers.  NULL is allowed. */
void fl_resample_scratch_free(fl_resample_scratch *scratch);

typedef struct fl_resample_target {
    int width, height;         /* output size, >= 1 each */
    int filter;                /* FL_FILTER_*; NEAREST ignores antialias */
    int antialias;             /* 1: when shrinking, widen the filter support by the
                                  scale (Pillow's resize); 0: plain interpolation */
    int flip;                  /* nonzero: mirror the output horizontally */
    int layout;                /* FL_LAYOUT_*: C*H*W planes or H*W*C pixels */
    int dtype;                 /* FL_DTYPE_*: element type of dst */
    float scale[3], offset[3]; /* per channel: out = v * scale + offset, where v is the
                                  resampled value, 0..255, float and not rounded;
                                  must be finite */
    void *dst;                 /* 3 * width * height contiguous elements of dtype;
                                  owned by the caller, written and never read */
} fl_resample_target;

/* Resamples the box (box_x, box_y, box_w, box_h) of the RGB uint8 image src
 * (src_w x src_h pixels, rows src_stride bytes apart) into target.  The box
 * is in source pixel coordinates and may be fractional; it must lie inside
 * the image and have a positive size.  For FL_DTYPE_UINT8 the value is
 * rounded (half up) and clamped to 0..255 after scale and offset; float16 is
 * rounded to nearest even.
 *
 * Returns FL_OK, FL_ERR_INVALID (a bad argument: nothing is written) or
 * FL_ERR_NOMEM (the scratch could not grow: nothing is written). */
int fl_resample(const unsigned char *src, int src_w, int src_h, size_t src_stride,
                double box_x, double box_y, double box_w, double box_h,
                const fl_resample_target *target, fl_resample_scratch *scratch);

/* One axis of a resize as fl_resample computes it: output sample i is
 * sum over t < taps of weights[i * taps + t] * source[first[i] + t], with
 * every read inside the image (short windows at the edges are moved inwards
 * and padded with zero weights).  The horizontal axis has the flip folded
 * in (output column i reads what column width - 1 - i would have). */
typedef struct fl_resample_axis {
    int taps;             /* >= 1; 1 means a pure pick of first[i] (see clip) */
    int lo, hi;           /* source samples some output reads: lo .. hi - 1 */
    const int *first;     /* [out size], owned by the scratch */
    const float *weights; /* [out size * taps], owned by the scratch */
} fl_resample_axis;

/* Everything the resampling of one image needs beyond the pixels: the two
 * axes and the order of the passes.  With taps 1 on both axes the output is
 * the picked pixel itself (the weights are not applied).  Otherwise:
 *
 * - vertical_first 0: h_t = sum over x taps (weights times bytes as float),
 *   clipped to 0..255 when `clip` (or the byte itself when taps_x is 1),
 *   for each of the taps_y rows, then v = sum over y taps of weight * h_t;
 * - vertical_first 1: c_t = sum over y taps, clipped when `clip`, for each
 *   of the taps_x columns, then v = sum over x taps of weight * c_t.
 *
 * Sums start at 0.0f and add one product at a time in tap order, in float,
 * without fused multiply-add; v is then clipped to 0..255, scaled, offset
 * and converted as fl_resample stores it. */
typedef struct fl_resample_coeffs {
    fl_resample_axis x, y; /* x: target->width entries; y: target->height */
    int vertical_first;    /* 1: the vertical pass runs first */
    int clip;              /* 1: the first pass's sums are clipped (BICUBIC) */
} fl_resample_coeffs;

/* Computes into *out the tables fl_resample uses for the box (box_x, box_y,
 * box_w, box_h) of a src_w x src_h image and target (its width, height,
 * filter, antialias and flip; dst, layout, dtype, scale and offset are
 * checked as fl_resample checks them, except that dst may be NULL, and
 * otherwise not read).  out's arrays live in scratch until the next call on
 * it.  Returns FL_OK, FL_ERR_INVALID (a bad argument, as fl_resample) or
 * FL_ERR_NOMEM; *out is set only on FL_OK. */
int fl_resample_tables(int src_w, int src_h, double box_x, double box_y, double box_w,
                       double box_h, const fl_resample_target *target,
                       fl_resample_scratch *scratch, fl_resample_coeffs *out);

/* Converts an image already resampled to target's size — three float
 * planes (R, G, B) of width * height values in [0, 255] (others are
 * clipped) — into target: scale, offset, dtype and layout as fl_resample
 * applies them; filter, antialias and flip are ignored.  Returns FL_OK, or
 * FL_ERR_INVALID (a bad argument: nothing is written). */
int fl_resample_store(const float *planes, const fl_resample_target *target);

/* float32 to IEEE binary16 bits, round to nearest even; NaN stays NaN and
 * overflow becomes infinity.  Exposed for tests. */
unsigned short fl_float_to_half(float value);

#endif /* FL_RESAMPLE_H */
