/* fastload core: see gpu_decode.h. */
#include "core/cuda/gpu_decode.h"

#include "core/status.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define POOL_ALIGN 256 /* each decoded image starts on a 256-byte boundary */
#define TIMINGS 8      /* batches timed at once (more in flight go untimed) */

/* A batch's GPU work bracketed by two timing events. */
typedef struct timing {
    fl_cu_event start, end;
    uint32_t images;
    int pending;
} timing;

struct fl_gpu_decode {
    const fl_cuda *cuda;
    fl_nvjpeg_decoder *decoder;
    fl_cu_function kernel;
    fl_image_plan plan;
    fl_cu_deviceptr pixels;     /* the decoded-pixel pool */
    size_t pixel_bytes;
    fl_cu_deviceptr tables;     /* a part's head .. tables, copied up */
    size_t table_bytes;
    /* Host scratch, grown to the largest part seen (a part's count). */
    const unsigned char **data;
    size_t *lengths;
    fl_nvjpeg_image *destinations;
    uint32_t *gpu_items;        /* which items the GPU decodes */
    size_t scratch_count;
    unsigned char *row;         /* a CPU fallback's row */
    size_t row_capacity;
    timing timings[TIMINGS];    /* start/end events of the batches being timed */
    int timing_on;              /* the driver has cuEventElapsedTime, events made */
    uint64_t timed_images;      /* completed since fl_gpu_decode_take_timing */
    double timed_seconds;
};

static int driver_error(const fl_cuda *cuda, fl_cu_result rc, const char *call, char *msg,
                        size_t msg_size)
{
    snprintf(msg, msg_size, "%s failed: %s", call, fl_cuda_error_string(cuda, rc));
    return rc == FL_CU_ERROR_OUT_OF_MEMORY ? FL_ERR_NOMEM : FL_ERR_IO;
}

int fl_gpu_decode_new(const fl_cuda *cuda, const fl_nvjpeg *nvjpeg, const fl_nvrtc *nvrtc,
                      int ordinal, const fl_image_plan *plan, uint64_t pixel_capacity,
                      uint32_t max_images, size_t table_bytes, int use_hardware,
                      fl_gpu_decode **out, char *error, size_t error_size)
{
    *out = NULL;
    const char *why;
    if (!fl_plan_gpu_capable(plan, &why)) {
        snprintf(error, error_size, "the GPU cannot run this transform (%s)", why);
        return FL_ERR_INVALID;
    }
    const char *missing = fl_cuda_kernels_missing(cuda);
    if (missing) {
        snprintf(error, error_size, "the CUDA driver lacks %s", missing);
        return FL_ERR_INVALID;
    }
    /* A uint32 count of aligned starts cannot overflow the rest of size_t. */
    if (pixel_capacity > (SIZE_MAX / 2) / 3 || table_bytes == 0) {
        snprintf(error, error_size, "the GPU decode pool is too large");
        return FL_ERR_INVALID;
    }
    fl_gpu_decode *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(error, error_size, "out of memory for the GPU decode stage");
        return FL_ERR_NOMEM;
    }
    s->cuda = cuda;
    s->plan = *plan;
    char *compile_error = NULL;
    if (fl_nvrtc_kernel(cuda, nvrtc, ordinal, fl_resample_kernel_source, "resample.cu",
                        FL_RESAMPLE_KERNEL_NAME, &s->kernel, &compile_error) != 0) {
        snprintf(error, error_size, "the resample kernel: %s",
                 compile_error ? compile_error : "out of memory");
        free(compile_error);
        free(s);
        return FL_ERR_INVALID;
    }
    if (fl_nvjpeg_decoder_create(nvjpeg, use_hardware, NULL, NULL, &s->decoder, error,
                                 error_size) != FL_NVJPEG_STATUS_SUCCESS) {
        free(s);
        return FL_ERR_INVALID;
    }
    /* 3 bytes a pixel, and each image's start aligned. */
    s->pixel_bytes = (size_t)pixel_capacity * 3 + (size_t)max_images * POOL_ALIGN;
    s->table_bytes = table_bytes;
    fl_cu_result rc = cuda->mem_alloc(&s->pixels, s->pixel_bytes);
    if (rc == 0)
        rc = cuda->mem_alloc(&s->tables, s->table_bytes);
    if (rc != 0) {
        int status = driver_error(cuda, rc, "cuMemAlloc (the GPU decode pool)", error,
                                  error_size);
        fl_gpu_decode_free(s);
        return status;
    }
    s->timing_on = cuda->event_elapsed_time != NULL;
    for (int t = 0; t < TIMINGS && s->timing_on; t++)
        if (cuda->event_create(&s->timings[t].start, 0) != 0 ||
            cuda->event_create(&s->timings[t].end, 0) != 0)
            s->timing_on = 0; /* untimed: the split then has no GPU cost */
    *out = s;
    return FL_OK;
}

/* Adds the completed timed batches, oldest first, to the totals. */
static void collect_timings(fl_gpu_decode *s)
{
    for (int t = 0; t < TIMINGS; t++) {
        timing *tm = &s->timings[t];
        float ms;
        if (!tm->pending || s->cuda->event_query(tm->end) != 0)
            continue;
        if (s->cuda->event_elapsed_time(&ms, tm->start, tm->end) == 0 && ms >= 0.0f) {
            s->timed_images += tm->images;
            s->timed_seconds += ms / 1e3;
        }
        tm->pending = 0;
    }
}

void fl_gpu_decode_take_timing(fl_gpu_decode *s, uint64_t *images, double *seconds)
{
    if (s->timing_on)
        collect_timings(s);
    *images = s->timed_images;
    *seconds = s->timed_seconds;
    s->timed_images = 0;
    s->timed_seconds = 0.0;
}

void fl_gpu_decode_free(fl_gpu_decode *s)
{
    if (!s)
        return;
    for (int t = 0; t < TIMINGS; t++) {
        if (s->timings[t].start)
            s->cuda->event_destroy(s->timings[t].start);
        if (s->timings[t].end)
            s->cuda->event_destroy(s->timings[t].end);
    }
    if (s->pixels)
        s->cuda->mem_free(s->pixels);
    if (s->tables)
        s->cuda->mem_free(s->tables);
    fl_nvjpeg_decoder_destroy(s->decoder);
    free(s->data);
    free(s->lengths);
    free(s->destinations);
    free(s->gpu_items);
    free(s->row);
    free(s);
}

const char *fl_gpu_decode_backend(const fl_gpu_decode *s)
{
    return s->decoder->backend == FL_NVJPEG_BACKEND_HARDWARE ? "hardware" : "default";
}

void fl_gpu_decode_kernel_batch(const fl_image_plan *plan, fl_rk_batch *batch)
{
    *batch = (fl_rk_batch){
        .out_w = plan->out_w,
        .out_h = plan->out_h,
        .dtype = plan->dtype,
        .layout = plan->layout,
    };
    for (int c = 0; c < 3; c++) {
        batch->scale[c] = plan->mul[c];
        batch->offset[c] = plan->add[c];
    }
}

static int reserve_scratch(fl_gpu_decode *s, size_t count)
{
    if (count <= s->scratch_count)
        return FL_OK;
    const unsigned char **data = realloc(s->data, count * sizeof *data);
    if (data)
        s->data = data;
    size_t *lengths = realloc(s->lengths, count * sizeof *lengths);
    if (lengths)
        s->lengths = lengths;
    fl_nvjpeg_image *destinations = realloc(s->destinations, count * sizeof *destinations);
    if (destinations)
        s->destinations = destinations;
    uint32_t *gpu_items = realloc(s->gpu_items, count * sizeof *gpu_items);
    if (gpu_items)
        s->gpu_items = gpu_items;
    if (!data || !lengths || !destinations || !gpu_items)
        return FL_ERR_NOMEM;
    s->scratch_count = count;
    return FL_OK;
}

/* Item i decoded and resampled on this thread by the CPU pipeline, with
 * its own key, and its row copied up. */
static int decode_on_cpu(fl_gpu_decode *s, const fl_gpu_batch *part, uint32_t i,
                         const fl_gpu_decode_target *target, fl_cu_stream stream,
                         fl_gpu_decode_report *report)
{
    const fl_gpu_item *it = &part->items[i];
    report->failed_sample = it->sample;
    if (target->row_bytes > s->row_capacity) {
        unsigned char *row = realloc(s->row, target->row_bytes);
        if (!row) {
            snprintf(report->msg, sizeof report->msg, "out of memory for a row");
            return FL_ERR_NOMEM;
        }
        s->row = row;
        s->row_capacity = target->row_bytes;
    }
    fl_image_worker *w;
    int rc = fl_image_worker_get(&w, report->msg, sizeof report->msg);
    fl_sample_key key = {it->key_seed, it->key_epoch, (uint64_t)it->sample};
    if (rc == FL_OK)
        rc = fl_pipeline_jpeg(w, &s->plan, &key, part->encoded + it->offset, it->size, s->row,
                              NULL, report->msg, sizeof report->msg);
    if (rc != FL_OK)
        return rc;
    /* From pageable memory the copy is staged before the call returns, so
     * the row can be reused by the next fallback. */
    fl_cu_result cu = s->cuda->memcpy_htod_async(
        target->images + (fl_cu_deviceptr)((size_t)it->row * target->row_bytes), s->row,
        target->row_bytes, stream);
    if (cu != 0)
        return driver_error(s->cuda, cu, "cuMemcpyHtoDAsync (a fallback row)", report->msg,
                            sizeof report->msg);
    report->failed_sample = -1;
    report->cpu_images++;
    return FL_OK;
}

int fl_gpu_decode_run(fl_gpu_decode *s, fl_gpu_batch *part, const fl_gpu_decode_target *target,
                      fl_cu_stream stream, fl_gpu_decode_report *report)
{
    const fl_cuda *cuda = s->cuda;
    fl_gpu_batch_head *h = part->head;
    uint32_t count = h->count;
    memset(report, 0, sizeof *report);
    report->failed_sample = -1;
    if (count == 0)
        return FL_OK;
    size_t table_bytes = fl_gpu_batch_table_bytes(&h->shape);
    if (table_bytes == 0 || table_bytes > s->table_bytes) {
        snprintf(report->msg, sizeof report->msg,
                 "a GPU part of %zu table bytes does not fit the stage's %zu", table_bytes,
                 s->table_bytes);
        return FL_ERR_INVALID;
    }
    if (reserve_scratch(s, count) != FL_OK) {
        snprintf(report->msg, sizeof report->msg, "out of memory for a batch of %u", count);
        return FL_ERR_NOMEM;
    }

    /* Which images the decoder takes, and where each one's pixels go. */
    uint32_t n = 0;
    size_t at = 0;
    for (uint32_t i = 0; i < count; i++) {
        const fl_gpu_item *it = &part->items[i];
        size_t bytes = (size_t)it->width * (size_t)it->height * 3;
        int supported = 1;
        if (it->row < 0 || (size_t)it->row >= target->rows)
            return snprintf(report->msg, sizeof report->msg, "a GPU item's row is outside the "
                            "batch"), FL_ERR_INVALID;
        if (fl_nvjpeg_decoder_supported(s->decoder, part->encoded + it->offset, it->size,
                                        &supported) != FL_NVJPEG_STATUS_SUCCESS)
            supported = 0;
        if (!supported || bytes > s->pixel_bytes - at) {
            int rc = decode_on_cpu(s, part, i, target, stream, report);
            if (rc != FL_OK)
                return rc;
            continue;
        }
        fl_rk_image *k = &part->kernel[n];
        if (n != i) { /* compact: the kernel reads the first n */
            *k = part->kernel[i];
        }
        k->src = s->pixels + at + (size_t)it->origin_y * (size_t)it->width * 3 +
                 (size_t)it->origin_x * 3;
        k->src_pitch = it->width * 3;
        k->src_x = k->src_y = 0;
        k->dst = target->images + (fl_cu_deviceptr)((size_t)it->row * target->row_bytes);
        s->data[n] = part->encoded + it->offset;
        s->lengths[n] = it->size;
        memset(&s->destinations[n], 0, sizeof s->destinations[n]);
        s->destinations[n].channel[0] = (unsigned char *)(uintptr_t)(s->pixels + at);
        s->destinations[n].pitch[0] = (size_t)it->width * 3;
        s->gpu_items[n] = i;
        at += (bytes + POOL_ALIGN - 1) / POOL_ALIGN * POOL_ALIGN;
        n++;
    }
    if (n == 0)
        return FL_OK;

    /* Timed from the decode's start to the kernel's end, when a timing
     * pair is free (a batch behind many in flight goes untimed). */
    timing *tm = NULL;
    if (s->timing_on) {
        collect_timings(s);
        for (int t = 0; t < TIMINGS && !tm; t++)
            if (!s->timings[t].pending)
                tm = &s->timings[t];
        if (tm && cuda->event_record(tm->start, stream) != 0)
            tm = NULL;
    }
    char nvjpeg_error[200];
    if (fl_nvjpeg_decode_batch(s->decoder, (int)n, s->data, s->lengths, s->destinations, stream,
                               nvjpeg_error, sizeof nvjpeg_error) != FL_NVJPEG_STATUS_SUCCESS) {
        /* The batch is refused as a whole: every image the CPU way, which
         * names a damaged one as the CPU path does. */
        for (uint32_t j = 0; j < n; j++) {
            int rc = decode_on_cpu(s, part, s->gpu_items[j], target, stream, report);
            if (rc != FL_OK)
                return rc;
        }
        return FL_OK;
    }
    /* The kernel structs and tables, as the part lays them out; the kernel
     * reads the first n structs (compacted above). */
    fl_cu_result rc = cuda->memcpy_htod_async(s->tables, part->head, table_bytes, stream);
    if (rc != 0)
        return driver_error(cuda, rc, "cuMemcpyHtoDAsync (the GPU part)", report->msg,
                            sizeof report->msg);
    const char *base = (const char *)part->head;
    fl_rk_batch batch;
    fl_gpu_decode_kernel_batch(&s->plan, &batch);
    batch.images = s->tables + (fl_cu_deviceptr)((const char *)part->kernel - base);
    batch.first = s->tables + (fl_cu_deviceptr)((const char *)part->first - base);
    batch.weights = s->tables + (fl_cu_deviceptr)((const char *)part->weights - base);
    batch.count = (int)n;
    void *params[] = {&batch};
    unsigned int grid_z = n < 65535 ? n : 65535;
    rc = cuda->launch_kernel(s->kernel, (unsigned int)(s->plan.out_w + 31) / 32,
                             (unsigned int)(s->plan.out_h + 7) / 8, grid_z, 32, 8, 1, 0, stream,
                             params, NULL);
    if (rc != 0)
        return driver_error(cuda, rc, "cuLaunchKernel (the resample kernel)", report->msg,
                            sizeof report->msg);
    if (tm && cuda->event_record(tm->end, stream) == 0) {
        tm->images = n;
        tm->pending = 1;
    }
    report->gpu_images = n;
    return FL_OK;
}
