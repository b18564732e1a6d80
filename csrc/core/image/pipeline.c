/* fastload core: see pipeline.h. */
#define _GNU_SOURCE
#include "core/image/pipeline.h"

#include "core/image/pil_color.h"

#include "core/image/jpeg.h"
#include "core/image/png.h"
#include "core/image/resample.h"
#include "core/image/webp.h"
#include "core/observe/stats.h"
#include "core/status.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct fl_image_worker {
    fl_jpeg *jpeg;
    fl_png *png;   /* made on the first PNG */
    fl_webp *webp; /* made on the first WebP */
    fl_resample_scratch *scratch;
    unsigned char *buf;     /* the last file read */
    size_t capacity;
    /* Buffers of the later stages, grown on first use (grow()); capacities
     * in elements. */
    float *color;           /* the resampled image as float RGB planes, when colour ops run */
    size_t color_capacity;
    unsigned char *aug;     /* the uint8 image an augmentation policy works on */
    size_t aug_capacity;
    unsigned char *aug_spare; /* and its second buffer, for the warps */
    size_t aug_spare_capacity;
    unsigned char *window;  /* RandomCrop's window with padding, RGB */
    size_t window_capacity;
    int *columns;           /* its source column per output column */
    size_t columns_capacity;
    float *blur;            /* GaussianBlur's kernels and intermediate plane */
    size_t blur_capacity;
    void *rgb_row;          /* a 1-channel plan's row, stored as 3 channels first */
    size_t rgb_row_capacity; /* bytes */
    unsigned char *gray;    /* the decoded pixels made gray (gray_at_decode), RGB */
    size_t gray_capacity;
};

/* ------------------------------------------------------ per-thread state */

static pthread_key_t worker_key;
static pthread_once_t worker_key_once = PTHREAD_ONCE_INIT;
static int worker_key_ok;

static void worker_free(void *p)
{
    fl_image_worker *w = p;
    if (!w)
        return;
    fl_jpeg_free(w->jpeg);
    fl_png_free(w->png);
    fl_webp_free(w->webp);
    fl_resample_scratch_free(w->scratch);
    free(w->color);
    free(w->aug);
    free(w->aug_spare);
    free(w->buf);
    free(w->window);
    free(w->columns);
    free(w->blur);
    free(w->rgb_row);
    free(w->gray);
    free(w);
}

static void make_worker_key(void)
{
    worker_key_ok = pthread_key_create(&worker_key, worker_free) == 0;
}

int fl_image_worker_get(fl_image_worker **out, char *msg, size_t msg_size)
{
    *out = NULL;
    pthread_once(&worker_key_once, make_worker_key);
    if (!worker_key_ok) {
        snprintf(msg, msg_size, "no thread-local key for the decoders (pthread_key_create)");
        return FL_ERR_NOMEM;
    }
    fl_image_worker *w = pthread_getspecific(worker_key);
    if (w) {
        *out = w;
        return FL_OK;
    }
    w = calloc(1, sizeof *w);
    if (!w) {
        snprintf(msg, msg_size, "no memory for this thread's decoder");
        return FL_ERR_NOMEM;
    }
    int rc = fl_jpeg_new(&w->jpeg, msg, msg_size);
    if (rc == FL_OK) {
        w->scratch = fl_resample_scratch_new();
        if (!w->scratch || pthread_setspecific(worker_key, w) != 0) {
            snprintf(msg, msg_size, "no memory for this thread's decoder");
            rc = FL_ERR_NOMEM;
        }
    }
    if (rc != FL_OK) {
        worker_free(w);
        return rc;
    }
    *out = w; /* owned by the thread: worker_free runs at its exit */
    return FL_OK;
}

/* ------------------------------------------- read buffer, format sniffing */

unsigned char *fl_image_worker_file_buffer(fl_image_worker *w, size_t size)
{
    if (size + 1 > w->capacity) {
        unsigned char *grown = realloc(w->buf, size + 1);
        if (!grown)
            return NULL;
        w->buf = grown;
        w->capacity = size + 1;
    }
    return w->buf;
}

int fl_is_jpeg(const unsigned char *data, size_t size)
{
    return size >= 3 && data[0] == 0xFF && data[1] == 0xD8 && data[2] == 0xFF;
}

fl_image_format fl_image_format_of(const unsigned char *data, size_t size)
{
    if (fl_is_jpeg(data, size))
        return FL_FORMAT_JPEG;
    if (fl_is_png(data, size))
        return FL_FORMAT_PNG;
    if (fl_is_webp(data, size))
        return FL_FORMAT_WEBP;
    return FL_FORMAT_OTHER;
}

/* --------------------------------------------------------------- geometry */

/* Grows *buf to hold `count` items of `size` bytes (*capacity counts
 * items).  Returns FL_OK or FL_ERR_NOMEM (the buffer is left as it was). */
static int grow(void **buf, size_t *capacity, size_t count, size_t size)
{
    if (count <= *capacity)
        return FL_OK;
    void *grown = count > SIZE_MAX / size ? NULL : realloc(*buf, count * size);
    if (!grown)
        return FL_ERR_NOMEM;
    *buf = grown;
    *capacity = count;
    return FL_OK;
}

/* RandomCrop: offsets drawn on the padded image (or on the resized one,
 * mapped back as a box like Resize + CenterCrop's). */
static void random_crop_geometry(const fl_image_plan *plan, fl_rng *rng, int width, int height,
                                 fl_sample_geometry *out)
{
    int cw = plan->crop_w, ch = plan->crop_h, left, top;
    out->out_w = cw;
    out->out_h = ch;
    if (plan->resize > 0 || plan->resize_w > 0) {
        int rw = plan->resize_w, rh = plan->resize_h;
        if (plan->resize > 0)
            fl_resize_short_side(width, height, plan->resize, plan->max_size, &rw, &rh);
        fl_pad_plan none = {0};
        fl_pad_axes(&none, rw, rh, cw, ch, &out->pad_x, &out->pad_y);
        out->from_w = rw;
        out->from_h = rh;
        out->crop_error = fl_random_crop_offsets(rng, &out->pad_x, &out->pad_y, cw, ch, &left,
                                                 &top) != 0;
        out->crop_x = left;
        out->crop_y = top;
        fl_box in_resized = {left, top, cw, ch};
        if (!out->crop_error)
            fl_box_unscale(&in_resized, width, height, rw, rh, &out->box);
        return;
    }
    fl_pad_axes(&plan->pad, width, height, cw, ch, &out->pad_x, &out->pad_y);
    out->from_w = fl_pad_extent(&out->pad_x);
    out->from_h = fl_pad_extent(&out->pad_y);
    out->crop_error =
        fl_random_crop_offsets(rng, &out->pad_x, &out->pad_y, cw, ch, &left, &top) != 0;
    out->crop_x = left;
    out->crop_y = top;
    out->hard_crop = 1;
    fl_box box = {left - out->pad_x.before1 - out->pad_x.before2,
                  top - out->pad_y.before1 - out->pad_y.before2, cw, ch};
    out->box = box;
    out->padded = box.x < 0 || box.y < 0 || box.x + cw > width || box.y + ch > height;
    if (out->crop_error || out->padded) {
        /* Nothing to resample in source coordinates. */
        fl_box whole = {0, 0, width, height};
        out->box = out->crop_error ? whole : box;
    }
}

void fl_plan_geometry(const fl_image_plan *plan, const fl_sample_key *key, int width, int height,
                      fl_sample_geometry *out)
{
    fl_rng rng;
    fl_rng_init(&rng, key->seed, key->epoch, key->index);
    memset(out, 0, sizeof *out);
    out->src_w = width;
    out->src_h = height;
    out->scale_denom = 1;
    fl_box whole = {0, 0, width, height};
    out->box = whole;
    out->out_w = width;
    out->out_h = height;
    if (plan->crop == FL_CROP_RANDOM_RESIZED) {
        fl_random_resized_crop(&rng, width, height, plan->scale_lo, plan->scale_hi,
                               plan->ratio_lo, plan->ratio_hi, &out->box);
        out->hard_crop = 1; /* torchvision crops, then resizes the crop alone */
        out->out_w = plan->out_w;
        out->out_h = plan->out_h;
    } else if (plan->crop == FL_CROP_RESIZE_CENTER) {
        int rw = width, rh = height;
        if (plan->resize > 0) {
            fl_resize_short_side(width, height, plan->resize, plan->max_size, &rw, &rh);
        } else if (plan->resize_w > 0) {
            rw = plan->resize_w;
            rh = plan->resize_h;
        }
        fl_box in_resized = {0, 0, rw, rh};
        if (plan->crop_w > 0) {
            /* CenterCrop of an image smaller than the crop: torchvision pads
             * with zeros; here the image is stretched to the crop instead
             * (documented), which keeps every output pixel real. */
            int cw = plan->crop_w < rw ? plan->crop_w : rw;
            int ch = plan->crop_h < rh ? plan->crop_h : rh;
            fl_center_crop(rw, rh, cw, ch, &in_resized);
        }
        fl_box_unscale(&in_resized, width, height, rw, rh, &out->box);
        out->out_w = plan->crop_w > 0 ? plan->crop_w : rw;
        out->out_h = plan->crop_h > 0 ? plan->crop_h : rh;
        /* Without resize, a center crop cuts pixels, as torchvision's does. */
        out->hard_crop = plan->resize == 0 && plan->resize_w == 0;
    } else if (plan->crop == FL_CROP_RANDOM) {
        random_crop_geometry(plan, &rng, width, height, out);
    }
    out->flip = plan->flip_p > 0 && fl_rng_uniform(&rng) < plan->flip_p;
    if (fl_color_active(&plan->color)) {
        fl_rng color_rng;
        fl_rng_init_stream(&color_rng, key->seed, key->epoch, key->index, FL_STREAM_COLOR);
        fl_color_draw_for(&plan->color, &color_rng, &out->color);
    }
    if (fl_blur_active(&plan->blur)) {
        fl_rng blur_rng;
        fl_rng_init_stream(&blur_rng, key->seed, key->epoch, key->index, FL_STREAM_BLUR);
        fl_blur_draw_for(&plan->blur, &blur_rng, &out->blur);
    }
    if (plan->erase.p > 0.0) {
        fl_rng erase_rng;
        fl_rng_init_stream(&erase_rng, key->seed, key->epoch, key->index, FL_STREAM_ERASE);
        fl_erase_draw_for(&plan->erase, &erase_rng, out->out_w, out->out_h, &out->erase);
    }
    if (plan->augment.policy != FL_AUGMENT_NONE) {
        fl_rng augment_rng;
        fl_rng_init_stream(&augment_rng, key->seed, key->epoch, key->index, FL_STREAM_AUGMENT);
        fl_augment_draw_for(&plan->augment, &augment_rng, &out->augment);
    }
    if (plan->warp.kind != FL_RANDOM_WARP_NONE) {
        fl_rng warp_rng;
        fl_rng_init_stream(&warp_rng, key->seed, key->epoch, key->index, FL_STREAM_AFFINE);
        fl_warp_draw_for(&plan->warp, &warp_rng, out->out_w, out->out_h, &out->warp);
    }
    if (!plan->exact && plan->filter != FL_FILTER_NEAREST && !out->crop_error)
        out->scale_denom = fl_jpeg_pick_scale((int)out->box.w, (int)out->box.h, out->out_w,
                                              out->out_h);
}

/* How far beyond the box the filter reaches, in source pixels. */
static double support_margin(const fl_image_plan *plan, const fl_sample_geometry *g)
{
    double radius = plan->filter == FL_FILTER_BICUBIC ? 2.0 : 1.0;
    double sx = g->box.w / g->out_w, sy = g->box.h / g->out_h;
    double s = sx > sy ? sx : sy;
    if (plan->antialias && s > 1.0)
        radius *= s;
    return radius + 1.0;
}

/* ------------------------------------------------------------------- ops */

/* Whether the colour ops run in the uint8 stage (else on floats). */
static int has_pil_color(const fl_image_plan *plan)
{
    return plan->color_pil && fl_color_active(&plan->color);
}

/* Whether the plan has a uint8 stage: a rotation / affine, a policy,
 * Pillow's colour ops, or colour ops on a uint8 tensor (which start from
 * the resampled image rounded to uint8, as torchvision's tensor is). */
static int has_uint8_stage(const fl_image_plan *plan)
{
    return plan->warp.kind != FL_RANDOM_WARP_NONE || plan->augment.policy != FL_AUGMENT_NONE ||
           has_pil_color(plan) || (plan->color.uint8 && fl_color_active(&plan->color));
}

/* The uint8 stage of a plan with a rotation / affine, an augmentation
 * policy or Pillow's colour ops: the box resampled (and flipped) to the
 * output size as an HWC uint8 image, the image Pillow holds after
 * torchvision's geometry, then the drawn warp, policy ops and colour ops
 * on it.  *out is the result, in one of the worker's two buffers. */
static int augment_stage(fl_image_worker *w, const fl_image_plan *plan,
                         const fl_sample_geometry *g, const unsigned char *rgb, int width,
                         int height, size_t stride, double bx, double by, double bw, double bh,
                         unsigned char **out)
{
    size_t bytes = (size_t)g->out_w * (size_t)g->out_h * 3;
    if (grow((void **)&w->aug, &w->aug_capacity, bytes, 1) != FL_OK ||
        grow((void **)&w->aug_spare, &w->aug_spare_capacity, bytes, 1) != FL_OK)
        return FL_ERR_NOMEM;
    fl_resample_target image = {
        .width = g->out_w,
        .height = g->out_h,
        .filter = plan->filter,
        .antialias = plan->antialias,
        .flip = g->flip,
        .layout = FL_LAYOUT_HWC,
        .dtype = FL_DTYPE_UINT8,
        .scale = {1.0f, 1.0f, 1.0f},
        .dst = w->aug,
    };
    int rc = fl_resample(rgb, width, height, stride, bx, by, bw, bh, &image, w->scratch);
    if (rc != FL_OK)
        return rc;
    unsigned char *result = w->aug, *spare = w->aug_spare;
    if (plan->warp.kind != FL_RANDOM_WARP_NONE) {
        fl_warp_apply(&plan->warp, &g->warp, result, spare, g->out_w, g->out_h);
        unsigned char *t = result;
        result = spare;
        spare = t;
    }
    rc = fl_augment_apply(&plan->augment, &g->augment, &result, &spare, g->out_w, g->out_h);
    if (rc == FL_OK && has_pil_color(plan))
        rc = fl_pil_color_apply(&g->color, &result, &spare, g->out_w, g->out_h);
    *out = result;
    return rc;
}

/* The first channel of a 3-channel row of `pixels` elements of `item` bytes. */
static void first_channel(const void *row, void *dst, int layout, size_t pixels, size_t item)
{
    if (layout == FL_LAYOUT_CHW) {
        memcpy(dst, row, pixels * item);
        return;
    }
    const unsigned char *src = row;
    unsigned char *out = dst;
    for (size_t i = 0; i < pixels; i++)
        memcpy(out + i * item, src + 3 * i * item, item);
}

/* Resamples box (bx, by, bw, bh; in the coordinates of `rgb`) into dst,
 * honouring a hard crop by hiding the pixels outside it. */
/* A hard crop (crop, then resize): only the pixels the box touches take
 * part, as torchvision's resized_crop gives them to the resize.  Narrows
 * the width x height image to them: *x0, *y0 is their corner, the box made
 * relative to it. */
static void hard_crop(int *width, int *height, double *bx, double *by, double *bw, double *bh,
                      int *x0_out, int *y0_out)
{
    int x0 = (int)floor(*bx), y0 = (int)floor(*by);
    int x1 = (int)ceil(*bx + *bw), y1 = (int)ceil(*by + *bh);
    if (x0 < 0)
        x0 = 0;
    if (y0 < 0)
        y0 = 0;
    if (x1 > *width)
        x1 = *width;
    if (y1 > *height)
        y1 = *height;
    *width = x1 - x0;
    *height = y1 - y0;
    *bx -= x0;
    *by -= y0;
    if (*bw > *width - *bx)
        *bw = *width - *bx;
    if (*bh > *height - *by)
        *bh = *height - *by;
    *x0_out = x0;
    *y0_out = y0;
}

/* The resize's target for the plan and geometry: into `dst`. */
static fl_resample_target resample_target(const fl_image_plan *plan, const fl_sample_geometry *g,
                                          int filter, int flip, void *dst)
{
    fl_resample_target target = {
        .width = g->out_w,
        .height = g->out_h,
        .filter = filter,
        .antialias = plan->antialias,
        .flip = flip,
        .layout = plan->layout,
        .dtype = plan->dtype,
        .dst = dst,
    };
    for (int c = 0; c < 3; c++) {
        target.scale[c] = plan->mul[c];
        target.offset[c] = plan->add[c];
    }
    return target;
}

static int resample_box(fl_image_worker *w, const fl_image_plan *plan,
                        const fl_sample_geometry *g, const unsigned char *rgb, int width,
                        int height, size_t stride, double bx, double by, double bw, double bh,
                        void *dst, char *msg, size_t msg_size)
{
    if (g->hard_crop) {
        int x0, y0;
        hard_crop(&width, &height, &bx, &by, &bw, &bh, &x0, &y0);
        rgb += (size_t)y0 * stride + (size_t)x0 * 3;
    }
    if (plan->gray_at_decode) {
        /* A leading Grayscale: the pixels the geometry reads, as Pillow's "L"
         * image in three equal channels (resampling each gives the "L" one's). */
        if (grow((void **)&w->gray, &w->gray_capacity, (size_t)width * (size_t)height, 3) !=
            FL_OK) {
            snprintf(msg, msg_size, "cannot allocate the %d x %d gray image", width, height);
            return FL_ERR_NOMEM;
        }
        for (int y = 0; y < height; y++)
            fl_pil_grayscale(rgb + (size_t)y * stride, w->gray + (size_t)y * width * 3,
                             (size_t)width);
        rgb = w->gray;
        stride = (size_t)width * 3;
    }
    /* One channel: the row is made as three equal ones, then the first kept. */
    void *row = dst;
    size_t pixels = (size_t)g->out_w * (size_t)g->out_h, item = fl_dtype_size(plan->dtype);
    if (plan->channels == 1) {
        /* In bytes: plans of other dtypes share the buffer. */
        if (grow(&w->rgb_row, &w->rgb_row_capacity, 3 * pixels * item, 1) != FL_OK) {
            snprintf(msg, msg_size, "cannot allocate the %d x %d image", g->out_w, g->out_h);
            return FL_ERR_NOMEM;
        }
        row = w->rgb_row;
    }
    int filter = plan->filter, flip = g->flip;
    if (has_uint8_stage(plan)) {
        /* What follows then stores the augmented image: a 1:1 copy. */
        unsigned char *augmented = NULL;
        int rc = augment_stage(w, plan, g, rgb, width, height, stride, bx, by, bw, bh,
                               &augmented);
        if (rc != FL_OK) {
            snprintf(msg, msg_size, "augmentation failed: %s", fl_status_str(rc));
            return rc;
        }
        rgb = augmented;
        width = g->out_w;
        height = g->out_h;
        stride = (size_t)width * 3;
        bx = by = 0.0;
        bw = width;
        bh = height;
        filter = FL_FILTER_NEAREST;
        flip = 0;
    }
    fl_resample_target target = resample_target(plan, g, filter, flip, row);
    int rc;
    int float_color = fl_color_active(&plan->color) && !plan->color_pil;
    if (!float_color && !g->blur.on) {
        rc = fl_resample(rgb, width, height, stride, bx, by, bw, bh, &target, w->scratch);
    } else {
        /* Colour ops work on the resampled values before conversion: resample
         * to float RGB planes in [0, 255], adjust, then convert into the row. */
        rc = grow((void **)&w->color, &w->color_capacity, 3 * pixels, sizeof(float));
        fl_resample_target floats = target;
        floats.layout = FL_LAYOUT_CHW;
        floats.dtype = FL_DTYPE_FLOAT32;
        floats.dst = w->color;
        for (int c = 0; c < 3; c++) {
            floats.scale[c] = 1.0f;
            floats.offset[c] = 0.0f;
        }
        if (rc == FL_OK)
            rc = fl_resample(rgb, width, height, stride, bx, by, bw, bh, &floats, w->scratch);
        if (rc == FL_OK)
            rc = grow((void **)&w->blur, &w->blur_capacity,
                      fl_blur_scratch_floats(&g->blur, g->out_w, g->out_h), sizeof(float));
        if (rc == FL_OK) {
            if (float_color)
                fl_color_apply(&g->color, w->color, pixels);
            fl_blur_apply(&g->blur, w->color, g->out_w, g->out_h, w->blur);
            rc = fl_resample_store(w->color, &target);
        }
    }
    if (rc != FL_OK) {
        snprintf(msg, msg_size, "resampling failed: %s", fl_status_str(rc));
        return rc;
    }
    /* Erased with three channels too: the first gets what one channel would
     * (the same value, or the first plane's draws). */
    if (g->erase.on)
        fl_erase_apply(&plan->erase, &g->erase, row, plan->dtype, plan->layout, g->out_w,
                       g->out_h);
    if (row != dst)
        first_channel(row, dst, plan->layout, pixels, item);
    return FL_OK;
}

/* RandomCrop's window where it reaches into the padding: built from the
 * source pixels [src_x, src_x + src_w) x [src_y, src_y + src_h) at `src`,
 * then stored as an image of the output's size (a 1:1 copy). */
static int padded_to_row(fl_image_worker *w, const fl_image_plan *plan,
                         const fl_sample_geometry *g, const unsigned char *src, int src_x,
                         int src_y, int src_w, int src_h, size_t stride, void *dst, char *msg,
                         size_t msg_size)
{
    size_t row = 3 * (size_t)g->out_w;
    if (grow((void **)&w->window, &w->window_capacity, row * (size_t)g->out_h, 1) != FL_OK ||
        grow((void **)&w->columns, &w->columns_capacity, (size_t)g->out_w, sizeof(int)) !=
            FL_OK) {
        snprintf(msg, msg_size, "cannot allocate the %d x %d crop", g->out_w, g->out_h);
        return FL_ERR_NOMEM;
    }
    if (fl_pad_window(&plan->pad, &g->pad_x, &g->pad_y, g->crop_x, g->crop_y, g->out_w,
                      g->out_h, src, src_x, src_y, src_w, src_h, stride, w->columns,
                      w->window) != 0) {
        snprintf(msg, msg_size, "padded crop outside the decoded pixels");
        return FL_ERR_INVALID;
    }
    return resample_box(w, plan, g, w->window, g->out_w, g->out_h, row, 0, 0, g->out_w,
                        g->out_h, dst, msg, msg_size);
}

/* torchvision's error for a RandomCrop larger than the (padded) image. */
static int crop_error(const fl_sample_geometry *g, char *msg, size_t msg_size)
{
    snprintf(msg, msg_size, "Required crop size (%d, %d) is larger than input image size (%d, %d)",
             g->out_h, g->out_w, g->from_h, g->from_w);
    return FL_ERR_INVALID;
}

/* fl_pipeline_jpeg, its stages timed on `clock` (decode open on entry). */
static int jpeg_to_row(fl_image_worker *w, const fl_image_plan *plan, const fl_sample_key *key,
                       const unsigned char *data, size_t size, void *dst,
                       fl_sample_geometry *geometry, char *msg, size_t msg_size,
                       fl_stage_clock *clock)
{
    fl_jpeg_header header;
    fl_sample_geometry local;
    fl_sample_geometry *g = geometry ? geometry : &local;
    if (size == 0) {
        snprintf(msg, msg_size, "empty file");
        return FL_ERR_DECODE;
    }
    int rc = fl_jpeg_read_header(w->jpeg, data, size, &header, msg, msg_size);
    if (rc != FL_OK)
        return rc;
    if ((uint64_t)header.width * (uint64_t)header.height > plan->max_pixels) {
        snprintf(msg, msg_size, "image of %d x %d pixels exceeds max_pixels=%llu", header.width,
                 header.height, (unsigned long long)plan->max_pixels);
        return FL_ERR_TOO_BIG;
    }
    fl_plan_geometry(plan, key, header.width, header.height, g);
    if (g->crop_error)
        return crop_error(g, msg, msg_size);
    if (!dst)
        return FL_OK;
    if (!fl_jpeg_complete(data, size)) {
        snprintf(msg, msg_size, "premature end of JPEG data (no end-of-image marker)");
        return FL_ERR_DECODE;
    }

    /* The region to decode: the box, plus the filter's reach unless the
     * crop is hard; whole pixels inside the image. */
    double margin = g->hard_crop ? 0.0 : support_margin(plan, g);
    int x0 = (int)floor(g->box.x - margin), y0 = (int)floor(g->box.y - margin);
    int x1 = (int)ceil(g->box.x + g->box.w + margin), y1 = (int)ceil(g->box.y + g->box.h + margin);
    if (x0 < 0)
        x0 = 0;
    if (y0 < 0)
        y0 = 0;
    if (x1 > header.width)
        x1 = header.width;
    if (y1 > header.height)
        y1 = header.height;
    if (g->padded) {
        /* Only the pixels the window shows, padding aside. */
        fl_pad_source_range(&g->pad_x, plan->pad.mode, g->crop_x, g->out_w, &x0, &x1);
        fl_pad_source_range(&g->pad_y, plan->pad.mode, g->crop_y, g->out_h, &y0, &y1);
    }
    fl_jpeg_region region = {x0, y0, x1 - x0, y1 - y0, g->scale_denom};
    fl_pixels px;
    rc = fl_jpeg_decode(w->jpeg, data, size, &region, plan->max_pixels, &px, msg, msg_size);
    if (rc != FL_OK)
        return rc;
    fl_stage_next(clock, FL_STAGE_TRANSFORM);
    if (g->padded) {
        /* scale_denom is 1: a random crop's filter is nearest */
        const unsigned char *origin = px.data + (size_t)px.box_y * px.stride + (size_t)px.box_x * 3;
        return padded_to_row(w, plan, g, origin, x0, y0, x1 - x0, y1 - y0, px.stride, dst, msg,
                             msg_size);
    }
    double d = g->scale_denom;
    double bx = px.box_x + (g->box.x - x0) / d, by = px.box_y + (g->box.y - y0) / d;
    double bw = g->box.w / d, bh = g->box.h / d;
    /* Rounding at the scaled buffer's edges must not push the box out. */
    if (bx + bw > px.width)
        bw = px.width - bx;
    if (by + bh > px.height)
        bh = px.height - by;
    return resample_box(w, plan, g, px.data, px.width, px.height, px.stride, bx, by, bw, bh, dst,
                        msg, msg_size);
}

int fl_pipeline_jpeg(fl_image_worker *w, const fl_image_plan *plan, const fl_sample_key *key,
                     const unsigned char *data, size_t size, void *dst,
                     fl_sample_geometry *geometry, char *msg, size_t msg_size)
{
    fl_stage_clock clock;
    fl_stage_begin(&clock, FL_STAGE_DECODE);
    int rc = jpeg_to_row(w, plan, key, data, size, dst, geometry, msg, msg_size, &clock);
    fl_stage_end(&clock);
    return rc;
}

int fl_plan_gpu_capable(const fl_image_plan *plan, const char **why)
{
    const char *no = NULL;
    if (plan->out_w <= 0 || plan->out_h <= 0)
        no = "the output size depends on the image";
    else if (plan->channels != 3 || plan->gray_at_decode)
        no = "Grayscale";
    else if (fl_color_active(&plan->color))
        no = "colour ops";
    else if (fl_blur_active(&plan->blur))
        no = "GaussianBlur";
    else if (plan->augment.policy != FL_AUGMENT_NONE)
        no = "an augmentation policy";
    else if (plan->warp.kind != FL_RANDOM_WARP_NONE)
        no = "a rotation or affine warp";
    else if (plan->erase.p > 0.0)
        no = "RandomErasing";
    else if (plan->crop == FL_CROP_RANDOM &&
             (plan->pad.left || plan->pad.top || plan->pad.right || plan->pad.bottom ||
              plan->pad.if_needed))
        no = "RandomCrop's padding";
    if (why)
        *why = no;
    return no == NULL;
}

int fl_pipeline_gpu_prepare(fl_image_worker *w, const fl_image_plan *plan,
                            const fl_sample_key *key, const unsigned char *data, size_t size,
                            fl_gpu_prepared *out)
{
    fl_jpeg_header header;
    if (size == 0 || fl_jpeg_read_header(w->jpeg, data, size, &header, NULL, 0) != FL_OK)
        return 0;
    if (header.progressive || (header.components != 1 && header.components != 3) ||
        (uint64_t)header.width * (uint64_t)header.height > plan->max_pixels ||
        !fl_jpeg_complete(data, size))
        return 0;
    fl_sample_geometry g;
    fl_plan_geometry(plan, key, header.width, header.height, &g);
    if (g.crop_error || g.padded)
        return 0;
    int width = header.width, height = header.height, x0 = 0, y0 = 0;
    double bx = g.box.x, by = g.box.y, bw = g.box.w, bh = g.box.h;
    if (g.hard_crop)
        hard_crop(&width, &height, &bx, &by, &bw, &bh, &x0, &y0);
    fl_resample_target target = resample_target(plan, &g, plan->filter, g.flip, NULL);
    if (fl_resample_tables(width, height, bx, by, bw, bh, &target, w->scratch, &out->coeffs) !=
        FL_OK)
        return 0;
    out->width = header.width;
    out->height = header.height;
    out->origin_x = x0;
    out->origin_y = y0;
    out->out_w = g.out_w;
    out->out_h = g.out_h;
    return 1;
}

int fl_pipeline_pixels(fl_image_worker *w, const fl_image_plan *plan, const fl_sample_key *key,
                       const unsigned char *rgb, int width, int height, size_t stride, void *dst,
                       fl_sample_geometry *geometry, char *msg, size_t msg_size)
{
    fl_sample_geometry local;
    fl_sample_geometry *g = geometry ? geometry : &local;
    if ((uint64_t)width * (uint64_t)height > plan->max_pixels) {
        snprintf(msg, msg_size, "image of %d x %d pixels exceeds max_pixels=%llu", width, height,
                 (unsigned long long)plan->max_pixels);
        return FL_ERR_TOO_BIG;
    }
    fl_plan_geometry(plan, key, width, height, g);
    g->scale_denom = 1;
    if (g->crop_error)
        return crop_error(g, msg, msg_size);
    if (!dst)
        return FL_OK;
    if (g->padded)
        return padded_to_row(w, plan, g, rgb, 0, 0, width, height, stride, dst, msg, msg_size);
    return resample_box(w, plan, g, rgb, width, height, stride, g->box.x, g->box.y, g->box.w,
                        g->box.h, dst, msg, msg_size);
}

/* The worker's PNG or WebP decoder, made on first use; NULL when out of
 * memory (with msg set). */
static int whole_decoder(fl_image_worker *w, fl_image_format format, char *msg, size_t msg_size)
{
    if (format == FL_FORMAT_PNG && !w->png)
        w->png = fl_png_new();
    else if (format == FL_FORMAT_WEBP && !w->webp)
        w->webp = fl_webp_new();
    if (format == FL_FORMAT_PNG ? w->png != NULL : w->webp != NULL)
        return FL_OK;
    snprintf(msg, msg_size, "out of memory for this thread's decoder");
    return FL_ERR_NOMEM;
}

/* A PNG or WebP decoded whole into the worker's decoder. */
static int decode_whole(fl_image_worker *w, fl_image_format format, const unsigned char *data,
                        size_t size, uint64_t max_pixels, const unsigned char **rgb, int *width,
                        int *height, size_t *stride, char *msg, size_t msg_size)
{
    int rc = whole_decoder(w, format, msg, msg_size);
    if (rc != FL_OK)
        return rc;
    if (format == FL_FORMAT_PNG)
        return fl_png_decode(w->png, data, size, max_pixels, rgb, width, height, stride, msg,
                             msg_size);
    return fl_webp_decode(w->webp, data, size, max_pixels, rgb, width, height, stride, msg,
                          msg_size);
}

/* fl_pipeline_image for a PNG or WebP, its stages timed on `clock` (decode
 * open on entry). */
static int whole_to_row(fl_image_worker *w, fl_image_format format, const fl_image_plan *plan,
                        const fl_sample_key *key, const unsigned char *data, size_t size,
                        void *dst, fl_sample_geometry *geometry, char *msg, size_t msg_size,
                        fl_stage_clock *clock)
{
    int width, height, rc;
    if (!dst) {
        /* The geometry only: the header is enough. */
        rc = whole_decoder(w, format, msg, msg_size);
        if (rc != FL_OK)
            return rc;
        if (format == FL_FORMAT_PNG)
            rc = fl_png_read_header(w->png, data, size, &width, &height, msg, msg_size);
        else
            rc = fl_webp_read_header(data, size, &width, &height, msg, msg_size);
        if (rc != FL_OK)
            return rc;
        return fl_pipeline_pixels(w, plan, key, NULL, width, height, 0, NULL, geometry, msg,
                                  msg_size);
    }
    const unsigned char *rgb;
    size_t stride;
    rc = decode_whole(w, format, data, size, plan->max_pixels, &rgb, &width, &height, &stride,
                      msg, msg_size);
    if (rc != FL_OK)
        return rc;
    fl_stage_next(clock, FL_STAGE_TRANSFORM);
    return fl_pipeline_pixels(w, plan, key, rgb, width, height, stride, dst, geometry, msg,
                              msg_size);
}

int fl_pipeline_image(fl_image_worker *w, fl_image_format format, const fl_image_plan *plan,
                      const fl_sample_key *key, const unsigned char *data, size_t size,
                      void *dst, fl_sample_geometry *geometry, char *msg, size_t msg_size)
{
    if (format == FL_FORMAT_JPEG)
        return fl_pipeline_jpeg(w, plan, key, data, size, dst, geometry, msg, msg_size);
    if (format != FL_FORMAT_PNG && format != FL_FORMAT_WEBP) {
        snprintf(msg, msg_size, "not a format decoded here");
        return FL_ERR_INVALID;
    }
    fl_stage_clock clock;
    fl_stage_begin(&clock, FL_STAGE_DECODE);
    int rc = whole_to_row(w, format, plan, key, data, size, dst, geometry, msg, msg_size,
                          &clock);
    fl_stage_end(&clock);
    return rc;
}

int fl_decode_full(fl_image_worker *w, const unsigned char *data, size_t size,
                   uint64_t max_pixels, const unsigned char **rgb, int *width, int *height,
                   size_t *stride, char *msg, size_t msg_size)
{
    if (size == 0) {
        snprintf(msg, msg_size, "empty file");
        return FL_ERR_DECODE;
    }
    fl_image_format format = fl_image_format_of(data, size);
    if (format == FL_FORMAT_PNG || format == FL_FORMAT_WEBP)
        return decode_whole(w, format, data, size, max_pixels, rgb, width, height, stride, msg,
                            msg_size);
    fl_pixels px;
    int rc = fl_jpeg_decode(w->jpeg, data, size, NULL, max_pixels, &px, msg, msg_size);
    if (rc != FL_OK)
        return rc;
    *rgb = px.data;
    *width = px.width;
    *height = px.height;
    *stride = px.stride;
    return FL_OK;
}
