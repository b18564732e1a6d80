/* fastload core: an image source's batches (see image_source.h). */
#include "core/source/image_source.h"

#include "core/image/jpeg_transcode.h"
#include "core/image/resample.h"
#include "core/observe/stats.h"
#include "core/source/file_read.h"
#include "core/source/sample_cache.h"
#include "core/status.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

size_t fl_image_source_row_bytes(const fl_image_source *src)
{
    const fl_image_plan *p = &src->plan;
    return (size_t)p->out_w * (size_t)p->out_h * (size_t)p->channels * fl_dtype_size(p->dtype);
}

/* How a cache keeping pixels stores an image: this header, then the RGB
 * rows packed (3 * width bytes each). */
typedef struct cached_pixels {
    uint32_t magic, width, height, reserved;
} cached_pixels;

#define CACHED_PIXELS_MAGIC 0x58504c46u /* "FLPX" */

/* Sample `index` from the cache into the worker's file buffer: 1 when it
 * was there and its bytes checked out, else 0 (read the file instead). */
static int read_cached(struct fl_sample_cache *cache, fl_image_worker *w, int64_t index,
                       fl_image_file *file)
{
    fl_cache_ref ref;
    if (!fl_sample_cache_find(cache, index, &ref))
        return 0;
    unsigned char *buf = fl_image_worker_file_buffer(w, (size_t)ref.size);
    if (!buf || fl_sample_cache_copy(cache, index, &ref, buf) != FL_OK)
        return 0;
    file->data = buf;
    file->size = (size_t)ref.size;
    return 1;
}

/* Puts a file's bytes into the cache: with cache_restart, a JPEG rewritten
 * with restart markers when the rewrite succeeds and fits (this read still
 * decodes the bytes as read); else the bytes as read, which a broken file
 * keeps so that its decode fails as it would have.  The cache is a
 * speed-up: a failed put is not an error. */
static void cache_file(const fl_image_source *src, int64_t index, const unsigned char *data,
                       size_t size)
{
    if (src->cache_restart && fl_image_format_of(data, size) == FL_FORMAT_JPEG) {
        unsigned char *rewritten = NULL; /* ours until freed below */
        size_t n = 0;
        /* Tables not optimised: half the cost, on the first read. */
        if (fl_jpeg_add_restarts(data, size, 0, 0, src->plan.max_pixels, &rewritten, &n, NULL,
                                 NULL, 0) == FL_OK) {
            int stored = fl_sample_cache_put(src->cache, index, rewritten, n);
            free(rewritten);
            if (stored || n <= size)
                return; /* stored, stored by another reader, or the original fits no better */
        }
    }
    fl_sample_cache_put(src->cache, index, data, size);
}

/* fl_read_range's room: the worker's read buffer. */
static unsigned char *worker_room(void *w, size_t size)
{
    return fl_image_worker_file_buffer(w, size);
}

int fl_image_source_read(const fl_image_source *src, fl_image_worker *w, int64_t index,
                         fl_image_file *file, fl_image_failure *failure)
{
    failure->index = file->index = index;
    failure->err = 0;
    fl_stage_clock clock;
    fl_stage_begin(&clock, FL_STAGE_READ);
    uint64_t offset = 0, length = FL_TO_END;
    if (src->ranges) {
        offset = (uint64_t)src->ranges[2 * index];
        length = (uint64_t)src->ranges[2 * index + 1];
    }
    int rc;
    file->label = src->labels[index];
    if (src->read_sample) {
        rc = src->read_sample(src->sample_ctx, w, index, &file->data, &file->size, &file->label,
                              &failure->err, failure->msg, sizeof failure->msg);
    } else if (src->cache && read_cached(src->cache, w, index, file)) {
        rc = FL_OK;
        if (src->cache_pixels) {
            file->format = FL_FORMAT_PIXELS;
            failure->status = rc;
            fl_stage_end(&clock);
            return rc;
        }
    } else if (src->read_bytes) {
        rc = src->read_bytes(src->bytes_ctx, w, index, &file->data, &file->size, failure->msg,
                             sizeof failure->msg);
    } else {
        rc = fl_read_range(fl_image_source_path(src, index), offset, length, worker_room, w,
                           &file->data, &file->size, &failure->err, failure->msg,
                           sizeof failure->msg);
        if (rc == FL_OK && src->cache && !src->cache_pixels)
            cache_file(src, index, file->data, file->size);
    }
    /* An empty file goes to the JPEG decoder, which names the problem. */
    if (rc != FL_OK || file->size == 0)
        file->format = FL_FORMAT_JPEG;
    else
        file->format = fl_image_format_of(file->data, file->size);
    if (src->fallback_all && file->format != FL_FORMAT_JPEG)
        file->format = FL_FORMAT_OTHER;
    failure->status = rc;
    fl_stage_end(&clock);
    return rc;
}

int fl_image_source_pixels(const fl_image_file *file, const unsigned char **rgb, int *width,
                           int *height, size_t *stride, char *msg, size_t msg_size)
{
    cached_pixels head;
    if (file->size >= sizeof head)
        memcpy(&head, file->data, sizeof head);
    if (file->size < sizeof head || head.magic != CACHED_PIXELS_MAGIC || head.width == 0 ||
        head.height == 0 || head.width > INT32_MAX / 3 || head.height > INT32_MAX ||
        (uint64_t)head.width * 3 * head.height != file->size - sizeof head) {
        snprintf(msg, msg_size, "the cache's entry is not an image's pixels (%zu bytes)",
                 file->size);
        return FL_ERR_DECODE;
    }
    *rgb = file->data + sizeof head;
    *width = (int)head.width;
    *height = (int)head.height;
    *stride = (size_t)head.width * 3;
    return FL_OK;
}

typedef struct pixels_to_keep {
    const unsigned char *rgb;
    int width, height;
    size_t stride;
} pixels_to_keep;

/* Writes the entry into the cache's mapping (fl_sample_cache_store's fill:
 * under the bus-error guard, so copies only). */
static void fill_pixels(void *arg, unsigned char *at)
{
    const pixels_to_keep *p = arg;
    size_t row = (size_t)p->width * 3;
    cached_pixels head = {CACHED_PIXELS_MAGIC, (uint32_t)p->width, (uint32_t)p->height, 0};
    memcpy(at, &head, sizeof head);
    for (int y = 0; y < p->height; y++)
        memcpy(at + sizeof head + (size_t)y * row, p->rgb + (size_t)y * p->stride, row);
}

/* Keeps an image's pixels in the cache, unless it holds them already or
 * has no room. */
static void keep_pixels(struct fl_sample_cache *cache, int64_t index, const unsigned char *rgb,
                        int width, int height, size_t stride)
{
    size_t size = sizeof(cached_pixels) + (size_t)width * 3 * (size_t)height;
    pixels_to_keep p = {rgb, width, height, stride};
    fl_sample_cache_store(cache, index, size, fill_pixels, &p);
}

/* fl_image_source_decode for a source whose cache keeps pixels: pixels
 * from the cache are transformed; a file's image is decoded whole and kept
 * first (when `dst` is NULL the header's size is all that is needed, and
 * the plan is exact, so its geometry is the pixels' one). */
static int pixels_to_row(const fl_image_source *src, fl_image_worker *w,
                         const fl_image_file *file, const fl_sample_key *key, void *dst,
                         fl_sample_geometry *geometry, fl_image_failure *failure)
{
    const unsigned char *rgb;
    int width, height;
    size_t stride;
    char *msg = failure->msg;
    size_t msg_size = sizeof failure->msg;
    if (file->format != FL_FORMAT_PIXELS && !dst)
        return fl_pipeline_image(w, file->format, &src->plan, key, file->data, file->size,
                                 NULL, geometry, msg, msg_size);
    fl_stage_clock clock;
    int rc;
    if (file->format == FL_FORMAT_PIXELS) {
        fl_stage_begin(&clock, FL_STAGE_TRANSFORM);
        rc = fl_image_source_pixels(file, &rgb, &width, &height, &stride, msg, msg_size);
    } else {
        fl_stage_begin(&clock, FL_STAGE_DECODE);
        rc = fl_decode_full(w, file->data, file->size, src->plan.max_pixels, &rgb, &width,
                            &height, &stride, msg, msg_size);
        if (rc == FL_OK)
            keep_pixels(src->cache, file->index, rgb, width, height, stride);
        fl_stage_next(&clock, FL_STAGE_TRANSFORM);
    }
    if (rc == FL_OK)
        rc = fl_pipeline_pixels(w, &src->plan, key, rgb, width, height, stride, dst, geometry,
                                msg, msg_size);
    fl_stage_end(&clock);
    return rc;
}

int fl_image_source_decode(const fl_image_source *src, fl_image_worker *w,
                           const fl_image_file *file, const fl_sample_key *key, void *dst,
                           fl_sample_geometry *geometry, fl_image_failure *failure)
{
    int rc;
    failure->index = file->index;
    failure->err = 0;
    if (src->cache_pixels && file->format != FL_FORMAT_OTHER) {
        rc = pixels_to_row(src, w, file, key, dst, geometry, failure);
    } else if (file->format != FL_FORMAT_OTHER) {
        rc = fl_pipeline_image(w, file->format, &src->plan, key, file->data, file->size, dst,
                               geometry, failure->msg, sizeof failure->msg);
    } else if (src->fallback) {
        /* Decoded and transformed together, by another library. */
        fl_stage_clock clock;
        fl_stage_begin(&clock, FL_STAGE_DECODE);
        rc = src->fallback(src->fallback_ctx, w, &src->plan, file->data, file->size, key, dst,
                           geometry, failure->msg, sizeof failure->msg);
        fl_stage_end(&clock);
    } else {
        snprintf(failure->msg, sizeof failure->msg,
                 "not a JPEG, PNG or WebP, and no other decoder is set");
        rc = FL_ERR_DECODE;
    }
    failure->status = rc;
    return rc;
}

/* After a failed sample: with on_error="skip" (and tries left), records the
 * failure and returns the next index to try; else returns -1. */
static int64_t skip_to_next(const fl_image_source *src, const fl_image_failure *f, int tries,
                            fl_image_batch_report *report)
{
    if (!src->skip || tries + 1 >= FL_IMAGE_MAX_SKIPS || f->status == FL_ERR_NOMEM)
        return -1;
    if (report->n_skips < report->capacity)
        report->skips[report->n_skips] = *f;
    report->n_skips++;
    return (f->index + 1) % src->length;
}

int fl_image_source_batch(const fl_image_source *src, fl_image_worker *w, const int64_t *idx,
                          size_t n, uint64_t seed, uint64_t epoch, void *images, int64_t *labels,
                          fl_image_batch_report *report)
{
    return fl_image_source_batch_split(src, w, idx, n, seed, epoch, images, labels, 0, NULL,
                                       report);
}

/* Whether row p (of n) should go to the GPU, `sent` having gone there so
 * far and `wanted` wanted in all: spread evenly, catching up after rows
 * the GPU could not take. */
static int gpu_turn(size_t p, size_t n, size_t sent, size_t wanted)
{
    return sent < wanted && sent * n < (p + 1) * wanted;
}

/* Prepares the JPEG in `file` for the GPU and adds it to `gpu` as row p:
 * 1 when it was added, 0 when the CPU path must take it. */
static int add_to_gpu(const fl_image_source *src, fl_image_worker *w, const fl_image_file *file,
                      const fl_sample_key *key, size_t p, fl_gpu_batch *gpu)
{
    fl_gpu_prepared prep;
    if (file->format != FL_FORMAT_JPEG || src->cache_pixels ||
        !fl_pipeline_gpu_prepare(w, &src->plan, key, file->data, file->size, &prep))
        return 0;
    fl_gpu_item item = {
        .origin_x = prep.origin_x,
        .origin_y = prep.origin_y,
        .row = (int64_t)p,
        .sample = file->index,
        .width = prep.width,
        .height = prep.height,
        .key_seed = key->seed,
        .key_epoch = key->epoch,
    };
    return fl_gpu_batch_add(gpu, &item, file->data, file->size, &prep.coeffs, prep.out_w,
                            prep.out_h);
}

int fl_image_source_batch_split(const fl_image_source *src, fl_image_worker *w,
                                const int64_t *idx, size_t n, uint64_t seed, uint64_t epoch,
                                void *images, int64_t *labels, size_t gpu_wanted,
                                fl_gpu_batch *gpu, fl_image_batch_report *report)
{
    size_t row_bytes = fl_image_source_row_bytes(src);
    fl_image_failure *f = &report->error;
    report->n_skips = 0;
    f->status = FL_OK;
    for (size_t p = 0; p < n; p++) {
        void *dst = (char *)images + p * row_bytes;
        int64_t index = idx[p];
        int want_gpu = gpu && gpu_turn(p, n, gpu->head->count, gpu_wanted);
        fl_image_file file;
        for (int tries = 0;; tries++) {
            fl_sample_key key = {seed, epoch, (uint64_t)index};
            uint64_t start = gpu ? fl_stats_now() : 0;
            int rc = fl_image_source_read(src, w, index, &file, f);
            if (rc == FL_OK && want_gpu && add_to_gpu(src, w, &file, &key, p, gpu)) {
                gpu->head->prep_ns += fl_stats_now() - start;
                break;
            }
            if (rc == FL_OK)
                rc = fl_image_source_decode(src, w, &file, &key, dst, NULL, f);
            if (gpu) {
                gpu->head->cpu_ns += fl_stats_now() - start;
                gpu->head->cpu_count += rc == FL_OK;
            }
            if (rc == FL_OK)
                break;
            index = skip_to_next(src, f, tries, report);
            if (index < 0)
                return f->status;
        }
        labels[p] = file.label;
    }
    f->status = FL_OK;
    return FL_OK;
}
