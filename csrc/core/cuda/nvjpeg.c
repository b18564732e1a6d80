/* fastload core: see nvjpeg.h. */
#define _GNU_SOURCE
#include "core/cuda/nvjpeg.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/cuda/library.h"

/* Opened once: `attempted` and the results are guarded by `lock` and never
 * change after the first attempt, so readers after it need no lock beyond
 * the one that publishes them. */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int attempted;
static fl_nvjpeg library;
static const fl_nvjpeg *loaded;
static char failure[1400];

typedef struct {
    const char *name;
    size_t offset;
} entry_point;

static const entry_point required[] = {
    {"nvjpegGetProperty", offsetof(fl_nvjpeg, get_property)},
    {"nvjpegCreateEx", offsetof(fl_nvjpeg, create_ex)},
    {"nvjpegDestroy", offsetof(fl_nvjpeg, destroy)},
    {"nvjpegJpegStateCreate", offsetof(fl_nvjpeg, state_create)},
    {"nvjpegJpegStateDestroy", offsetof(fl_nvjpeg, state_destroy)},
    {"nvjpegGetImageInfo", offsetof(fl_nvjpeg, get_image_info)},
    {"nvjpegDecodeBatchedInitialize", offsetof(fl_nvjpeg, decode_batched_initialize)},
    {"nvjpegDecodeBatched", offsetof(fl_nvjpeg, decode_batched)},
    {"nvjpegJpegStreamCreate", offsetof(fl_nvjpeg, stream_create)},
    {"nvjpegJpegStreamParse", offsetof(fl_nvjpeg, stream_parse)},
    {"nvjpegJpegStreamDestroy", offsetof(fl_nvjpeg, stream_destroy)},
    {"nvjpegDecodeBatchedSupported", offsetof(fl_nvjpeg, decode_batched_supported)},
};

static const entry_point optional[] = {
    {"nvjpegCreateExV2", offsetof(fl_nvjpeg, create_ex_v2)},
    {"nvjpegDecodeParamsCreate", offsetof(fl_nvjpeg, params_create)},
    {"nvjpegDecodeParamsSetROI", offsetof(fl_nvjpeg, params_set_roi)},
    {"nvjpegDecodeParamsSetOutputFormat", offsetof(fl_nvjpeg, params_set_output_format)},
    {"nvjpegDecodeParamsDestroy", offsetof(fl_nvjpeg, params_destroy)},
    {"nvjpegDecodeBatchedEx", offsetof(fl_nvjpeg, decode_batched_ex)},
};

/* CUDA 13's library first: a process with both wheels gets the newer. */
static const char *const sonames[] = {"libnvjpeg.so.13", "libnvjpeg.so.12", "libnvjpeg.so",
                                      NULL};

static void load(const char *const *folders)
{
    char why[1200];
    void *lib = fl__cuda_library_open("FASTLOAD_LIBNVJPEG", sonames, folders, "nvjpegCreateEx",
                                      library.path, sizeof library.path, why, sizeof why);
    if (!lib) {
        snprintf(failure, sizeof failure, "nvJPEG is not available: %s", why);
        return;
    }
    for (size_t i = 0; i < sizeof required / sizeof required[0]; i++) {
        void *fn = dlsym(lib, required[i].name);
        if (!fn) {
            snprintf(failure, sizeof failure, "nvJPEG %s has no %s: too old", library.path,
                     required[i].name);
            dlclose(lib);
            return;
        }
        *(void **)((char *)&library + required[i].offset) = fn;
    }
    int roi = 1;
    for (size_t i = 0; i < sizeof optional / sizeof optional[0]; i++) {
        void *fn = dlsym(lib, optional[i].name);
        *(void **)((char *)&library + optional[i].offset) = fn;
        roi &= fn != NULL || i == 0;
    }
    if (!roi) { /* the region-of-interest calls are used together */
        library.params_create = NULL;
        library.params_set_roi = NULL;
        library.params_set_output_format = NULL;
        library.params_destroy = NULL;
        library.decode_batched_ex = NULL;
    }
    for (int i = 0; i < 3; i++)
        if (library.get_property(FL_LIBRARY_MAJOR_VERSION + i, &library.version[i]) != 0)
            library.version[i] = -1;
    loaded = &library;
}

const fl_nvjpeg *fl_nvjpeg_get(const char *const *folders, const char **why)
{
    pthread_mutex_lock(&lock);
    if (!attempted) {
        attempted = 1;
        load(folders);
    }
    const fl_nvjpeg *result = loaded;
    pthread_mutex_unlock(&lock);
    if (!result && why)
        *why = failure;
    return result;
}

const char *fl_nvjpeg_status_string(fl_nvjpeg_status status)
{
    static const char *const names[] = {
        "NVJPEG_STATUS_SUCCESS",
        "NVJPEG_STATUS_NOT_INITIALIZED",
        "NVJPEG_STATUS_INVALID_PARAMETER",
        "NVJPEG_STATUS_BAD_JPEG",
        "NVJPEG_STATUS_JPEG_NOT_SUPPORTED",
        "NVJPEG_STATUS_ALLOCATOR_FAILURE",
        "NVJPEG_STATUS_EXECUTION_FAILED",
        "NVJPEG_STATUS_ARCH_MISMATCH",
        "NVJPEG_STATUS_INTERNAL_ERROR",
        "NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED",
        "NVJPEG_STATUS_INCOMPLETE_BITSTREAM",
    };
    if (status >= 0 && (size_t)status < sizeof names / sizeof names[0])
        return names[status];
    return "NVJPEG_STATUS_UNKNOWN";
}

static fl_nvjpeg_status fail(fl_nvjpeg_status status, const char *call, char *error,
                             size_t error_size)
{
    snprintf(error, error_size, "%s failed: %s (%d)", call, fl_nvjpeg_status_string(status),
             status);
    return status;
}

/* Makes the handle with `backend`, through CreateExV2 when the caller
 * brought allocators (the docs' current interface: stream-ordered, with a
 * context), else CreateEx with the library's own. */
static fl_nvjpeg_status create_handle(const fl_nvjpeg *lib, fl_nvjpeg_backend backend,
                                      fl_nvjpeg_dev_allocator_v2 *dev,
                                      fl_nvjpeg_pinned_allocator_v2 *pinned,
                                      fl_nvjpeg_handle *handle)
{
    if (dev || pinned) {
        if (!lib->create_ex_v2)
            return FL_NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED;
        return lib->create_ex_v2(backend, dev, pinned, 0, handle);
    }
    return lib->create_ex(backend, NULL, NULL, 0, handle);
}

fl_nvjpeg_status fl_nvjpeg_decoder_create(const fl_nvjpeg *lib, int use_hardware,
                                          fl_nvjpeg_dev_allocator_v2 *dev,
                                          fl_nvjpeg_pinned_allocator_v2 *pinned,
                                          fl_nvjpeg_decoder **out, char *error,
                                          size_t error_size)
{
    *out = NULL;
    fl_nvjpeg_decoder *decoder = calloc(1, sizeof *decoder);
    if (!decoder) {
        snprintf(error, error_size, "fl_nvjpeg_decoder_create: out of memory");
        return FL_NVJPEG_STATUS_ALLOCATOR_FAILURE;
    }
    decoder->lib = lib;
    if (dev) {
        decoder->dev = *dev;
        dev = &decoder->dev;
    }
    if (pinned) {
        decoder->pinned = *pinned;
        pinned = &decoder->pinned;
    }
    fl_nvjpeg_status rc = FL_NVJPEG_STATUS_NOT_INITIALIZED;
    if (use_hardware) {
        /* Without JPEG engines the library refuses this backend (its docs:
         * the handle creation fails); that is the test, not an error. */
        rc = create_handle(lib, FL_NVJPEG_BACKEND_HARDWARE, dev, pinned, &decoder->handle);
        decoder->backend = FL_NVJPEG_BACKEND_HARDWARE;
    }
    if (rc != 0) {
        decoder->handle = NULL;
        /* The batched API's GPU path is the default backend: GPU_HYBRID
         * serves the decoupled single-image calls, which fastload does not use. */
        rc = create_handle(lib, FL_NVJPEG_BACKEND_DEFAULT, dev, pinned, &decoder->handle);
        decoder->backend = FL_NVJPEG_BACKEND_DEFAULT;
        if (rc != 0) {
            fail(rc, (dev || pinned) ? "nvjpegCreateExV2" : "nvjpegCreateEx", error,
                 error_size);
            decoder->handle = NULL;
            goto bailout;
        }
    }
    rc = lib->state_create(decoder->handle, &decoder->state);
    if (rc != 0) {
        fail(rc, "nvjpegJpegStateCreate", error, error_size);
        decoder->state = NULL;
        goto bailout;
    }
    if (decoder->backend == FL_NVJPEG_BACKEND_HARDWARE) {
        rc = lib->stream_create(decoder->handle, &decoder->parsed);
        if (rc != 0) {
            fail(rc, "nvjpegJpegStreamCreate", error, error_size);
            decoder->parsed = NULL;
            goto bailout;
        }
    }
    decoder->format = FL_NVJPEG_OUTPUT_RGBI;
    *out = decoder;
    return 0;
bailout:
    fl_nvjpeg_decoder_destroy(decoder);
    return rc;
}

void fl_nvjpeg_decoder_destroy(fl_nvjpeg_decoder *decoder)
{
    if (!decoder)
        return;
    /* Children before the handle that made them. */
    for (int i = 0; i < decoder->params_count; i++)
        decoder->lib->params_destroy(decoder->params[i]);
    free(decoder->params);
    if (decoder->parsed)
        decoder->lib->stream_destroy(decoder->parsed);
    if (decoder->state)
        decoder->lib->state_destroy(decoder->state);
    if (decoder->handle)
        decoder->lib->destroy(decoder->handle);
    free(decoder);
}

fl_nvjpeg_status fl_nvjpeg_decoder_supported(fl_nvjpeg_decoder *decoder,
                                             const unsigned char *data, size_t length,
                                             int *supported)
{
    *supported = 1;
    if (decoder->backend != FL_NVJPEG_BACKEND_HARDWARE)
        return 0;
    /* Headers only: no metadata, no copy of the stream. */
    fl_nvjpeg_status rc =
        decoder->lib->stream_parse(decoder->handle, data, length, 0, 0, decoder->parsed);
    int answer = 1;
    if (rc == 0)
        rc = decoder->lib->decode_batched_supported(decoder->handle, decoder->parsed, &answer);
    *supported = rc == 0 && answer == 0;
    return rc;
}

/* Initialises the batched state for `count` images unless it already is. */
static fl_nvjpeg_status initialize(fl_nvjpeg_decoder *decoder, int count, char *error,
                                   size_t error_size)
{
    if (count <= 0)
        return fail(FL_NVJPEG_STATUS_INVALID_PARAMETER, "fl_nvjpeg_decode_batch", error,
                    error_size);
    if (decoder->batch_size == count)
        return 0;
    /* max_cpu_threads is ignored by current libraries; 1 is valid for
     * every version. */
    fl_nvjpeg_status rc = decoder->lib->decode_batched_initialize(
        decoder->handle, decoder->state, count, 1, decoder->format);
    if (rc != 0) {
        decoder->batch_size = 0;
        return fail(rc, "nvjpegDecodeBatchedInitialize", error, error_size);
    }
    decoder->batch_size = count;
    return 0;
}

fl_nvjpeg_status fl_nvjpeg_decode_batch(fl_nvjpeg_decoder *decoder, int count,
                                        const unsigned char *const *data,
                                        const size_t *lengths,
                                        fl_nvjpeg_image *destinations, fl_cu_stream stream,
                                        char *error, size_t error_size)
{
    fl_nvjpeg_status rc = initialize(decoder, count, error, error_size);
    if (rc != 0)
        return rc;
    rc = decoder->lib->decode_batched(decoder->handle, decoder->state, data, lengths,
                                      destinations, stream);
    if (rc != 0)
        return fail(rc, "nvjpegDecodeBatched", error, error_size);
    return 0;
}

int fl_nvjpeg_decoder_has_roi(const fl_nvjpeg_decoder *decoder)
{
    return decoder->lib->decode_batched_ex != NULL &&
           decoder->backend == FL_NVJPEG_BACKEND_HARDWARE;
}

fl_nvjpeg_status fl_nvjpeg_decode_batch_roi(fl_nvjpeg_decoder *decoder, int count,
                                            const unsigned char *const *data,
                                            const size_t *lengths, const int (*rois)[4],
                                            fl_nvjpeg_image *destinations, fl_cu_stream stream,
                                            char *error, size_t error_size)
{
    const fl_nvjpeg *lib = decoder->lib;
    if (!fl_nvjpeg_decoder_has_roi(decoder))
        return fail(FL_NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED, "nvjpegDecodeBatchedEx",
                    error, error_size);
    fl_nvjpeg_status rc = initialize(decoder, count, error, error_size);
    if (rc != 0)
        return rc;
    if (decoder->params_count < count) { /* grown once to the largest batch */
        fl_nvjpeg_decode_params *grown =
            realloc(decoder->params, sizeof *grown * (size_t)count);
        if (!grown)
            return fail(FL_NVJPEG_STATUS_ALLOCATOR_FAILURE, "fl_nvjpeg_decode_batch_roi", error,
                        error_size);
        decoder->params = grown;
        for (; decoder->params_count < count; decoder->params_count++) {
            rc = lib->params_create(decoder->handle, &grown[decoder->params_count]);
            if (rc != 0)
                return fail(rc, "nvjpegDecodeParamsCreate", error, error_size);
        }
    }
    for (int i = 0; i < count; i++) {
        rc = lib->params_set_output_format(decoder->params[i], decoder->format);
        if (rc != 0)
            return fail(rc, "nvjpegDecodeParamsSetOutputFormat", error, error_size);
        rc = lib->params_set_roi(decoder->params[i], rois[i][0], rois[i][1], rois[i][2],
                                 rois[i][3]);
        if (rc != 0)
            return fail(rc, "nvjpegDecodeParamsSetROI", error, error_size);
    }
    rc = lib->decode_batched_ex(decoder->handle, decoder->state, data, lengths, destinations,
                                decoder->params, stream);
    if (rc != 0)
        return fail(rc, "nvjpegDecodeBatchedEx", error, error_size);
    return 0;
}
