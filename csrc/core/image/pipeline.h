/* fastload core: the image pipeline — one sample from its encoded bytes to
 * its batch row.
 *
 * the bytes (read by the source layer into the worker's buffer) → pick the
 * crop box (the plan's rules, counter-based draws) → decode only the box,
 * DCT-scaled when the output is much smaller (a JPEG; a PNG or WebP is
 * decoded whole) → resample, flip, convert and normalise into the sample's
 * row — through a float image, adjusted in colour, when the plan has colour
 * ops.  Each thread keeps its own decoder, resampling scratch and read
 * buffer (fl_image_worker), so samples run in parallel with no shared state.
 */
#ifndef FL_PIPELINE_H
#define FL_PIPELINE_H

#include "core/image/augment.h"
#include "core/image/blur.h"
#include "core/image/erase.h"
#include "core/image/pad.h"
#include "core/image/pil_ops.h"
#include "core/image/random_affine.h"
#include "core/image/resample.h"

#include <stddef.h>
#include <stdint.h>

enum { FL_CROP_NONE = 0, FL_CROP_RANDOM_RESIZED = 1, FL_CROP_RESIZE_CENTER = 2 };
/* RandomCrop: whole pixels at random offsets, of the padded image (pad) or,
 * after a Resize (then with no padding), of the resized one. */
enum { FL_CROP_RANDOM = 3 };

/* A compiled transform chain (fastload/transforms/plan.py, Plan). */
typedef struct fl_image_plan {
    int crop;                   /* FL_CROP_* */
    int out_w, out_h;           /* output size; 0: the size depends on the image */
    double scale_lo, scale_hi;  /* random-resized: area fraction */
    double ratio_lo, ratio_hi;  /* random-resized: aspect ratio */
    int resize;                 /* resize-center: short side, or 0 */
    int resize_w, resize_h;     /* resize-center: exact size, or 0 */
    int max_size;               /* resize-center: cap on the long side, or 0 */
    int crop_w, crop_h;         /* resize-center: center crop, or 0; random: the crop */
    int filter, antialias;      /* FL_FILTER_*, and Pillow's antialiasing */
    double flip_p;              /* probability of a horizontal flip */
    int dtype, layout;          /* FL_DTYPE_*, FL_LAYOUT_* */
    int channels;               /* stored: 3, or 1 after Grayscale(1) (gray_p 1 or
                                   gray_at_decode: the three channels are equal, the
                                   first is kept) */
    int gray_at_decode;         /* 1: Pillow's convert("L") on the decoded pixels, before
                                   the geometry (a leading Grayscale, as on the PIL image) */
    fl_color_plan color;        /* colour ops on the resampled image, before mul/add */
    float mul[3], add[3];       /* per channel: out = value_0_255 * mul + add */
    int exact;                  /* 1: never DCT-scale (decode="exact") */
    uint64_t max_pixels;        /* larger images are refused */
    fl_pad_plan pad;            /* random: padding (none after a Resize) */
    fl_blur_plan blur;          /* GaussianBlur after the colour ops */
    fl_erase_plan erase;        /* RandomErasing on the stored row (p 0: off) */
    fl_augment_plan augment;    /* RandAugment & co. on the resampled uint8 image */
    fl_warp_plan warp;          /* RandomRotation / RandomAffine, before the policy */
    int color_pil;              /* 1: the colour ops run after the policy on the uint8
                                   image, with Pillow's arithmetic (pil_color.h) */
} fl_image_plan;

/* Where a sample's random numbers come from. */
typedef struct fl_sample_key {
    uint64_t seed, epoch, index;
} fl_sample_key;

/* The geometry decided for one sample (also reported to tests). */
typedef struct fl_sample_geometry {
    int src_w, src_h;           /* the image */
    fl_box box;                 /* source pixels resampled to the output */
    int hard_crop;              /* 1: pixels outside the box take no part */
    int out_w, out_h;
    int flip;
    int scale_denom;            /* DCT scaling used */
    fl_color_draw color;        /* the colour ops drawn (when the plan has any) */
    int crop_error;             /* 1: RandomCrop's crop is larger than the image it cuts
                                   (from_w x from_h): torchvision raises */
    int from_w, from_h;         /* random: the padded (or resized) image cut */
    int padded;                 /* 1: the crop reaches into the padding, so the window
                                   is built by fl_pad_window (box.x, box.y may be < 0) */
    fl_pad_axis pad_x, pad_y;   /* random: the padding per axis */
    int crop_x, crop_y;         /* random: the crop's corner in the padded (or resized) image */
    fl_blur_draw blur;          /* the blur drawn (when the plan has one) */
    fl_erase_draw erase;        /* RandomErasing's box (on 0: none) */
    fl_augment_draw augment;    /* the augmentation ops drawn (when the plan has a policy) */
    fl_warp_draw warp;          /* the rotation / affine drawn (when the plan has one) */
} fl_sample_geometry;

typedef struct fl_image_worker fl_image_worker;

/* The calling thread's worker state in *out, created on first use and freed
 * when the thread exits.  Returns FL_OK, or with *out NULL and a one-line
 * message in msg: FL_ERR_NOMEM (out of memory, or no thread-local key), or
 * FL_ERR_INVALID when libjpeg refuses to make a decoder (a library of
 * another ABI than the headers built with: fl_jpeg_new).  A later call
 * tries again. */
int fl_image_worker_get(fl_image_worker **out, char *msg, size_t msg_size);

/* The worker's read buffer, grown to at least `size` bytes (and one spare):
 * where a sample's encoded bytes are put before decoding, by the source
 * layer (a file read by fl_read_range, file_read.h; a cache entry; an LMDB
 * value).  Valid until the next read on this thread.  NULL when out of
 * memory. */
unsigned char *fl_image_worker_file_buffer(fl_image_worker *w, size_t size);

/* Nonzero when the bytes start like a JPEG (SOI marker). */
int fl_is_jpeg(const unsigned char *data, size_t size);

/* The formats decoded here; any other goes to a fallback decoder. */
typedef enum fl_image_format {
    FL_FORMAT_OTHER = 0,
    FL_FORMAT_JPEG,
    FL_FORMAT_PNG,
    FL_FORMAT_WEBP,
    FL_FORMAT_PIXELS,  /* pixels decoded earlier, kept by a source's cache
                          (image_source.h); never told by the bytes */
} fl_image_format;

/* The format of a file by its first bytes (magic numbers, not the name). */
fl_image_format fl_image_format_of(const unsigned char *data, size_t size);

/* Decides the geometry for an image of width x height, and draws the colour
 * ops (from their own stream: the geometry's draws do not depend on them). */
void fl_plan_geometry(const fl_image_plan *plan, const fl_sample_key *key, int width, int height,
                      fl_sample_geometry *out);

/* JPEG bytes → the sample in `dst` (channels * out_w * out_h elements of the
 * plan's dtype; out_w/out_h from the plan, or from *geometry when the plan
 * leaves them to the image: call with dst NULL first to learn them).
 * Returns FL_OK, FL_ERR_DECODE, FL_ERR_TOO_BIG, FL_ERR_NOMEM with msg. */
int fl_pipeline_jpeg(fl_image_worker *w, const fl_image_plan *plan, const fl_sample_key *key,
                     const unsigned char *data, size_t size, void *dst,
                     fl_sample_geometry *geometry, char *msg, size_t msg_size);

/* The same for a file of any format decoded here: a JPEG goes to
 * fl_pipeline_jpeg; a PNG or WebP is decoded whole into the worker's
 * decoder (with dst NULL, only its header is read), then goes through
 * fl_pipeline_pixels.  FL_FORMAT_OTHER is FL_ERR_INVALID. */
int fl_pipeline_image(fl_image_worker *w, fl_image_format format, const fl_image_plan *plan,
                      const fl_sample_key *key, const unsigned char *data, size_t size,
                      void *dst, fl_sample_geometry *geometry, char *msg, size_t msg_size);

/* The same ops on pixels decoded elsewhere (RGB, rows `stride` bytes). */
int fl_pipeline_pixels(fl_image_worker *w, const fl_image_plan *plan, const fl_sample_key *key,
                       const unsigned char *rgb, int width, int height, size_t stride, void *dst,
                       fl_sample_geometry *geometry, char *msg, size_t msg_size);

/* Whether the plan's ops all run in the GPU decode stage: a fixed output
 * size, any crop but one that pads, the resize, flip, normalisation, dtype
 * and layout; no colour ops, blur, policy, warp, erasing or grayscale.
 * Returns 1, or 0 with *why naming the first op that does not (static). */
int fl_plan_gpu_capable(const fl_image_plan *plan, const char **why);

/* A JPEG made ready for the GPU decode stage: the whole image as nvJPEG
 * decodes it, and the tables its resize reads, which count from the pixel
 * (origin_x, origin_y): a hard crop's corner, else 0, 0. */
typedef struct fl_gpu_prepared {
    int width, height;         /* the whole image */
    int origin_x, origin_y;
    int out_w, out_h;
    fl_resample_coeffs coeffs; /* in the worker's scratch until its next resample */
} fl_gpu_prepared;

/* The first half of fl_pipeline_jpeg for an image the GPU decodes, for a
 * plan fl_plan_gpu_capable takes: the header read, the geometry drawn from
 * `key` as the CPU path draws it, and the resize's tables built by the CPU
 * path's own code for the whole, undecoded image (so the GPU's row is the
 * CPU path's with decode="exact", decoders aside).  Returns 1 with *out
 * set; 0 when the CPU path should take the image instead: not a baseline
 * 8-bit gray or YCbCr JPEG (progressive, CMYK), too large, truncated,
 * damaged or out of memory, the CPU path then reporting any error as it
 * always does. */
int fl_pipeline_gpu_prepare(fl_image_worker *w, const fl_image_plan *plan,
                            const fl_sample_key *key, const unsigned char *data, size_t size,
                            fl_gpu_prepared *out);

/* Full decode of a JPEG, PNG or WebP to RGB HWC (for transforms written in
 * Python): the pixels stay in the worker's decoder until its next decode. */
int fl_decode_full(fl_image_worker *w, const unsigned char *data, size_t size,
                   uint64_t max_pixels, const unsigned char **rgb, int *width, int *height,
                   size_t *stride, char *msg, size_t msg_size);

#endif /* FL_PIPELINE_H */
