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
