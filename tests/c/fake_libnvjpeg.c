/* A stand-in for libnvjpeg, so the tests can exercise fastload's run-time
 * nvJPEG loading and batched decoding (csrc/core/cuda/nvjpeg.c) without a
 * GPU.  It decodes with the system's libjpeg (libjpeg-turbo, as the
 * extension links it) straight into the destinations the caller gives:
 * under the fake driver (tests/c/fake_libcuda.c) device memory is host
 * memory.  Only interleaved RGB (NVJPEG_OUTPUT_RGBI) is produced.
 *
 * As the real library: the hardware backend is refused on a GPU without
 * JPEG engines (NVJPEG_STATUS_ARCH_MISMATCH, FAKE_NVJPEG_HARDWARE=0) and
 * refuses progressive JPEGs (nvjpegDecodeBatchedSupported says "not
 * supported", a batched decode says JPEG_NOT_SUPPORTED); corrupt data is
 * NVJPEG_STATUS_BAD_JPEG.  FAKE_NVJPEG_FAIL injects failures: "create"
 * (handle creation: ALLOCATOR_FAILURE), "initialize" (batched initialise:
 * ALLOCATOR_FAILURE), "execute" (batched decode: EXECUTION_FAILED).
 * fake_nvjpeg_counters() tells the tests what was asked.  Regions of
 * interest (nvjpegDecodeBatchedEx) are taken by the hardware backend only.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>

typedef int nvjpegStatus_t;
enum {
    SUCCESS = 0,
    INVALID_PARAMETER = 2,
    BAD_JPEG = 3,
    JPEG_NOT_SUPPORTED = 4,
    ALLOCATOR_FAILURE = 5,
    EXECUTION_FAILED = 6,
    ARCH_MISMATCH = 7,
};
enum { BACKEND_DEFAULT = 0, BACKEND_HARDWARE = 3, OUTPUT_RGBI = 5 };

typedef struct {
    unsigned char *channel[4];
    size_t pitch[4];
} nvjpegImage_t;

enum {
    LIVE_HANDLES,
    LIVE_STATES,
    LIVE_STREAMS,
    CREATE_CALLS,      /* successful handle creations */
    LAST_BACKEND,      /* the backend of the last handle made */
    INITIALIZE_CALLS,  /* nvjpegDecodeBatchedInitialize */
    DECODE_CALLS,      /* nvjpegDecodeBatched */
    IMAGES_DECODED,
    SUPPORTED_CALLS,   /* nvjpegDecodeBatchedSupported */
    LIVE_PARAMS,       /* nvjpegDecodeParams_t alive */
    N_COUNTERS
};
static long long counters[N_COUNTERS];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static void count(int which, long long delta)
{
    pthread_mutex_lock(&lock);
    counters[which] += delta;
    pthread_mutex_unlock(&lock);
}

void fake_nvjpeg_counters(long long *out, int n)
{
    if (n > N_COUNTERS)
        n = N_COUNTERS;
    pthread_mutex_lock(&lock);
    memcpy(out, counters, sizeof counters[0] * (size_t)(n > 0 ? n : 0));
    pthread_mutex_unlock(&lock);
}

static int failing(const char *what)
{
    const char *v = getenv("FAKE_NVJPEG_FAIL");
    return v && strcmp(v, what) == 0;
}

/* nvjpegDevAllocatorV2_t, as nvjpegCreateExV2 takes it. */
typedef struct {
    int (*dev_malloc)(void *ctx, void **ptr, size_t size, void *stream);
    int (*dev_free)(void *ctx, void *ptr, size_t size, void *stream);
    void *dev_ctx;
} dev_allocator_v2;

typedef struct {
    int backend;
    int has_allocator;
    dev_allocator_v2 allocator; /* CreateExV2's, when given */
} handle;
/* With a V2 device allocator, a state's batched initialise takes its
 * scratch memory from it (4 KiB an image) and gives it back when the state
 * goes or is initialised again: the calls, their order of arguments and
 * their pairing are what the tests check. */
typedef struct {
    int batch_size;
    int format;
    handle *owner;
    void *scratch;
    size_t scratch_bytes;
} state;
typedef struct {
    int parsed;
    int progressive;
} stream;

nvjpegStatus_t nvjpegGetProperty(int type, int *value)
{
    static const int version[3] = {12, 3, 1};
    if (type < 0 || type > 2)
        return INVALID_PARAMETER;
    *value = version[type];
    return SUCCESS;
}

nvjpegStatus_t nvjpegCreateEx(int backend, void *dev, void *pinned, unsigned int flags,
                              void **out)
{
    (void)dev;
    (void)pinned;
    (void)flags;
    if (!out)
        return INVALID_PARAMETER;
    if (failing("create"))
        return ALLOCATOR_FAILURE;
    const char *hardware = getenv("FAKE_NVJPEG_HARDWARE");
    if (backend == BACKEND_HARDWARE && hardware && strcmp(hardware, "0") == 0)
        return ARCH_MISMATCH;
    handle *h = calloc(1, sizeof *h);
    if (!h)
        return ALLOCATOR_FAILURE;
    h->backend = backend;
    *out = h;
    count(LIVE_HANDLES, 1);
    count(CREATE_CALLS, 1);
    pthread_mutex_lock(&lock);
    counters[LAST_BACKEND] = backend;
    pthread_mutex_unlock(&lock);
    return SUCCESS;
}

nvjpegStatus_t nvjpegCreateExV2(int backend, dev_allocator_v2 *dev, void *pinned,
                                unsigned int flags, void **out)
{
    if (dev && (!dev->dev_malloc || !dev->dev_free))
        return INVALID_PARAMETER;
    nvjpegStatus_t rc = nvjpegCreateEx(backend, NULL, pinned, flags, out);
    if (rc == SUCCESS && dev) {
        ((handle *)*out)->has_allocator = 1;
        ((handle *)*out)->allocator = *dev;
    }
    return rc;
}

nvjpegStatus_t nvjpegDestroy(void *h)
{
    if (!h)
        return INVALID_PARAMETER;
    free(h);
    count(LIVE_HANDLES, -1);
    return SUCCESS;
}

nvjpegStatus_t nvjpegJpegStateCreate(void *h, void **out)
{
    state *s = calloc(1, sizeof *s);
    if (!s)
        return ALLOCATOR_FAILURE;
    s->owner = h;
    *out = s;
    count(LIVE_STATES, 1);
    return SUCCESS;
}

static void free_scratch(state *s)
{
    if (s->scratch)
        s->owner->allocator.dev_free(s->owner->allocator.dev_ctx, s->scratch, s->scratch_bytes,
                                     NULL);
    s->scratch = NULL;
    s->scratch_bytes = 0;
}

nvjpegStatus_t nvjpegJpegStateDestroy(void *s)
{
    free_scratch(s);
    free(s);
    count(LIVE_STATES, -1);
    return SUCCESS;
}

/* ---- libjpeg, with errors as a status ---------------------------------- */

typedef struct {
    struct jpeg_error_mgr base;
    jmp_buf escape;
} error_manager;

static void on_error(j_common_ptr cinfo)
{
    longjmp(((error_manager *)cinfo->err)->escape, 1);
}

/* Quiet; a warning (corrupt data libjpeg got past) is counted, as the
 * default handler counts it. */
static void on_message(j_common_ptr cinfo, int level)
{
    if (level < 0)
        cinfo->err->num_warnings++;
}

/* Reads the header (and with `out`, decodes as RGB into out's row pitch).
 * Returns BAD_JPEG for anything libjpeg refuses; a warning (data it had
 * to make up) is BAD_JPEG too, as nvJPEG does not conceal errors. */
static nvjpegStatus_t run_libjpeg(const unsigned char *data, size_t length, int *components,
                                  int *widths, int *heights, int *progressive,
                                  const nvjpegImage_t *out)
{
    struct jpeg_decompress_struct cinfo;
    error_manager errors;
    JSAMPROW row = NULL;
    cinfo.err = jpeg_std_error(&errors.base);
    errors.base.error_exit = on_error;
    errors.base.emit_message = on_message;
    if (setjmp(errors.escape)) {
        jpeg_destroy_decompress(&cinfo);
        return BAD_JPEG;
    }
    jpeg_create_decompress(&cinfo);
    if (!data || length == 0)
        longjmp(errors.escape, 1);
    jpeg_mem_src(&cinfo, data, (unsigned long)length);
    jpeg_read_header(&cinfo, TRUE);
    if (components)
        *components = cinfo.num_components;
    if (progressive)
        *progressive = cinfo.progressive_mode;
    if (widths && heights) {
        int hmax = cinfo.max_h_samp_factor, vmax = cinfo.max_v_samp_factor;
        for (int c = 0; c < 4; c++) {
            widths[c] = heights[c] = 0;
            if (c < cinfo.num_components) {
                jpeg_component_info *info = &cinfo.comp_info[c];
                widths[c] = (int)((cinfo.image_width * (unsigned)info->h_samp_factor +
                                   (unsigned)hmax - 1) / (unsigned)hmax);
                heights[c] = (int)((cinfo.image_height * (unsigned)info->v_samp_factor +
                                    (unsigned)vmax - 1) / (unsigned)vmax);
            }
        }
    }
    if (out) {
        cinfo.out_color_space = JCS_RGB;
        jpeg_start_decompress(&cinfo);
        while (cinfo.output_scanline < cinfo.output_height) {
            row = out->channel[0] + out->pitch[0] * cinfo.output_scanline;
            jpeg_read_scanlines(&cinfo, &row, 1);
        }
        jpeg_finish_decompress(&cinfo);
        if (errors.base.num_warnings > 0)
            longjmp(errors.escape, 1);
    }
    jpeg_destroy_decompress(&cinfo);
    return SUCCESS;
}

nvjpegStatus_t nvjpegGetImageInfo(void *h, const unsigned char *data, size_t length,
                                  int *components, int *subsampling, int *widths, int *heights)
{
    (void)h;
    nvjpegStatus_t rc = run_libjpeg(data, length, components, widths, heights, NULL, NULL);
    if (rc == SUCCESS) {
        /* 4:2:0 when the chroma planes are half size both ways, 4:4:4 when
         * full, gray for one component; enough for the tests. */
        if (*components == 1)
            *subsampling = 6;
        else if (widths[1] == widths[0] && heights[1] == heights[0])
            *subsampling = 0;
        else if (heights[1] == heights[0])
            *subsampling = 1;
        else
            *subsampling = 2;
    }
    return rc;
}

nvjpegStatus_t nvjpegDecodeBatchedInitialize(void *h, void *sp, int batch_size,
                                             int max_cpu_threads, int format)
{
    (void)max_cpu_threads;
    state *s = sp;
    count(INITIALIZE_CALLS, 1);
    if (failing("initialize"))
        return ALLOCATOR_FAILURE;
    if (batch_size <= 0 || format != OUTPUT_RGBI)
        return INVALID_PARAMETER;
    free_scratch(s);
    if (((handle *)h)->has_allocator) {
        size_t bytes = 4096 * (size_t)batch_size;
        dev_allocator_v2 *a = &((handle *)h)->allocator;
        if (a->dev_malloc(a->dev_ctx, &s->scratch, bytes, NULL) != 0) {
            s->scratch = NULL;
            return ALLOCATOR_FAILURE;
        }
        s->scratch_bytes = bytes;
    }
    s->batch_size = batch_size;
    s->format = format;
    return SUCCESS;
}

nvjpegStatus_t nvjpegDecodeBatched(void *hp, void *sp, const unsigned char *const *data,
                                   const size_t *lengths, nvjpegImage_t *destinations,
                                   void *cuda_stream)
{
    (void)cuda_stream;
    handle *h = hp;
    state *s = sp;
    count(DECODE_CALLS, 1);
    if (s->batch_size <= 0)
        return 1; /* NVJPEG_STATUS_NOT_INITIALIZED */
    if (failing("execute"))
        return EXECUTION_FAILED;
    for (int i = 0; i < s->batch_size; i++) {
        if (!destinations[i].channel[0] || destinations[i].pitch[0] == 0)
            return INVALID_PARAMETER;
        int progressive = 0;
        nvjpegStatus_t rc = run_libjpeg(data[i], lengths[i], NULL, NULL, NULL, &progressive,
                                        NULL);
        if (rc == SUCCESS && progressive && h->backend == BACKEND_HARDWARE)
            return JPEG_NOT_SUPPORTED;
        if (rc == SUCCESS)
            rc = run_libjpeg(data[i], lengths[i], NULL, NULL, NULL, NULL, &destinations[i]);
        if (rc != SUCCESS)
            return rc;
        count(IMAGES_DECODED, 1);
    }
    return SUCCESS;
}

nvjpegStatus_t nvjpegJpegStreamCreate(void *h, void **out)
{
    (void)h;
    stream *st = calloc(1, sizeof *st);
    if (!st)
        return ALLOCATOR_FAILURE;
    *out = st;
    count(LIVE_STREAMS, 1);
    return SUCCESS;
}

nvjpegStatus_t nvjpegJpegStreamParse(void *h, const unsigned char *data, size_t length,
                                     int save_metadata, int save_stream, void *sp)
{
    (void)h;
    (void)save_metadata;
    (void)save_stream;
    stream *st = sp;
    st->parsed = 0;
    nvjpegStatus_t rc = run_libjpeg(data, length, NULL, NULL, NULL, &st->progressive, NULL);
    st->parsed = rc == SUCCESS;
    return rc;
}

nvjpegStatus_t nvjpegJpegStreamDestroy(void *st)
{
    free(st);
    count(LIVE_STREAMS, -1);
    return SUCCESS;
}

nvjpegStatus_t nvjpegDecodeBatchedSupported(void *hp, void *sp, int *is_supported)
{
    handle *h = hp;
    stream *st = sp;
    count(SUPPORTED_CALLS, 1);
    if (!st->parsed)
        return INVALID_PARAMETER;
    /* 0 means supported, as in the library. */
    *is_supported = h->backend == BACKEND_HARDWARE && st->progressive;
    return SUCCESS;
}

/* ---- Regions of interest (nvjpegDecodeBatchedEx) ------------------------ */

typedef struct {
    int format;
    int x, y, width, height; /* width 0: the whole image */
} params;

nvjpegStatus_t nvjpegDecodeParamsCreate(void *h, void **out)
{
    (void)h;
    params *p = calloc(1, sizeof *p);
    if (!p)
        return ALLOCATOR_FAILURE;
    p->format = OUTPUT_RGBI;
    *out = p;
    count(LIVE_PARAMS, 1);
    return SUCCESS;
}

nvjpegStatus_t nvjpegDecodeParamsDestroy(void *p)
{
    free(p);
    count(LIVE_PARAMS, -1);
    return SUCCESS;
}

nvjpegStatus_t nvjpegDecodeParamsSetOutputFormat(void *p, int format)
{
    ((params *)p)->format = format;
    return SUCCESS;
}

nvjpegStatus_t nvjpegDecodeParamsSetROI(void *pp, int x, int y, int width, int height)
{
    params *p = pp;
    if (x < 0 || y < 0 || width < 0 || height < 0)
        return INVALID_PARAMETER;
    p->x = x;
    p->y = y;
    p->width = width;
    p->height = height;
    return SUCCESS;
}

/* Decodes the whole image into a scratch buffer, then copies the region:
 * the pixels of a region are the whole decode's, as nvJPEG's are. */
nvjpegStatus_t nvjpegDecodeBatchedEx(void *hp, void *sp, const unsigned char *const *data,
                                     const size_t *lengths, nvjpegImage_t *destinations,
                                     void **decode_params, void *cuda_stream)
{
    (void)cuda_stream;
    handle *h = hp;
    state *s = sp;
    count(DECODE_CALLS, 1);
    if (s->batch_size <= 0)
        return 1; /* NVJPEG_STATUS_NOT_INITIALIZED */
    if (h->backend != BACKEND_HARDWARE)
        return 9; /* NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED */
    if (failing("execute"))
        return EXECUTION_FAILED;
    for (int i = 0; i < s->batch_size; i++) {
        params *p = decode_params[i];
        int components = 0, widths[4], heights[4], progressive = 0;
        nvjpegStatus_t rc =
            run_libjpeg(data[i], lengths[i], &components, widths, heights, &progressive, NULL);
        if (rc != SUCCESS)
            return rc;
        if (progressive)
            return JPEG_NOT_SUPPORTED;
        int w = p->width ? p->width : widths[0], hgt = p->height ? p->height : heights[0];
        if (p->format != OUTPUT_RGBI || p->x + w > widths[0] || p->y + hgt > heights[0])
            return INVALID_PARAMETER;
        size_t pitch = (size_t)widths[0] * 3;
        nvjpegImage_t whole = {{malloc(pitch * (size_t)heights[0])}, {pitch}};
        if (!whole.channel[0])
            return ALLOCATOR_FAILURE;
        rc = run_libjpeg(data[i], lengths[i], NULL, NULL, NULL, NULL, &whole);
        for (int row = 0; rc == SUCCESS && row < hgt; row++)
            memcpy(destinations[i].channel[0] + destinations[i].pitch[0] * (size_t)row,
                   whole.channel[0] + pitch * (size_t)(p->y + row) + (size_t)p->x * 3,
                   (size_t)w * 3);
        free(whole.channel[0]);
        if (rc != SUCCESS)
            return rc;
        count(IMAGES_DECODED, 1);
    }
    return SUCCESS;
}
