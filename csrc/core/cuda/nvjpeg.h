/* fastload core: nvJPEG, opened at run time.
 *
 * Like the driver (cuda.h), nvJPEG is never linked: libnvjpeg is found by
 * library.h's order ($FASTLOAD_LIBNVJPEG, a copy already loaded, the
 * folders fastload's Python side passes, the sonames) and its entry points
 * are resolved by name.  No CUDA header is used: the types below are
 * declared as nvjpeg.h defines them (CUDA 12/13; the enum values and struct
 * layouts are part of the library's ABI).
 *
 * Threads: the library handle may be shared; a decoder (its JPEG state) is
 * used by one thread at a time.  Every call that touches the GPU must run
 * with the device's context current (fl_cuda_enter): nvJPEG's runtime uses
 * the current context, which is the primary context fastload retains.
 */
#ifndef FL_CUDA_NVJPEG_H
#define FL_CUDA_NVJPEG_H

#include <stddef.h>

#include "core/cuda/cuda.h"

typedef int fl_nvjpeg_status; /* nvjpegStatus_t */
enum {
    FL_NVJPEG_STATUS_SUCCESS = 0,
    FL_NVJPEG_STATUS_NOT_INITIALIZED = 1,
    FL_NVJPEG_STATUS_INVALID_PARAMETER = 2,
    FL_NVJPEG_STATUS_BAD_JPEG = 3,
    FL_NVJPEG_STATUS_JPEG_NOT_SUPPORTED = 4,
    FL_NVJPEG_STATUS_ALLOCATOR_FAILURE = 5,
    FL_NVJPEG_STATUS_EXECUTION_FAILED = 6,
    FL_NVJPEG_STATUS_ARCH_MISMATCH = 7,
    FL_NVJPEG_STATUS_INTERNAL_ERROR = 8,
    FL_NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED = 9,
    FL_NVJPEG_STATUS_INCOMPLETE_BITSTREAM = 10,
};

typedef int fl_nvjpeg_backend; /* nvjpegBackend_t */
enum {
    FL_NVJPEG_BACKEND_DEFAULT = 0,
    FL_NVJPEG_BACKEND_HYBRID = 1,
    FL_NVJPEG_BACKEND_GPU_HYBRID = 2,
    FL_NVJPEG_BACKEND_HARDWARE = 3,
    FL_NVJPEG_BACKEND_GPU_HYBRID_DEVICE = 4,
    FL_NVJPEG_BACKEND_HARDWARE_DEVICE = 5,
    FL_NVJPEG_BACKEND_LOSSLESS_JPEG = 6,
};

typedef int fl_nvjpeg_output_format; /* nvjpegOutputFormat_t */
enum {
    FL_NVJPEG_OUTPUT_UNCHANGED = 0,
    FL_NVJPEG_OUTPUT_YUV = 1,
    FL_NVJPEG_OUTPUT_Y = 2,
    FL_NVJPEG_OUTPUT_RGB = 3,  /* planar: channel[0..2] */
    FL_NVJPEG_OUTPUT_BGR = 4,
    FL_NVJPEG_OUTPUT_RGBI = 5, /* interleaved: channel[0], pitch[0] */
    FL_NVJPEG_OUTPUT_BGRI = 6,
};

typedef int fl_nvjpeg_subsampling; /* nvjpegChromaSubsampling_t */
enum {
    FL_NVJPEG_CSS_444 = 0,
    FL_NVJPEG_CSS_422 = 1,
    FL_NVJPEG_CSS_420 = 2,
    FL_NVJPEG_CSS_440 = 3,
    FL_NVJPEG_CSS_411 = 4,
    FL_NVJPEG_CSS_410 = 5,
    FL_NVJPEG_CSS_GRAY = 6,
    FL_NVJPEG_CSS_410V = 7,
    FL_NVJPEG_CSS_UNKNOWN = -1,
};

#define FL_NVJPEG_MAX_COMPONENT 4

/* nvjpegImage_t: one plane per channel; interleaved formats use plane 0. */
typedef struct fl_nvjpeg_image {
    unsigned char *channel[FL_NVJPEG_MAX_COMPONENT];
    size_t pitch[FL_NVJPEG_MAX_COMPONENT];
} fl_nvjpeg_image;

/* nvjpegDevAllocator_t / nvjpegPinnedAllocator_t: 0 is success. */
typedef struct fl_nvjpeg_dev_allocator {
    int (*dev_malloc)(void **ptr, size_t bytes);
    int (*dev_free)(void *ptr);
} fl_nvjpeg_dev_allocator;
typedef struct fl_nvjpeg_pinned_allocator {
    int (*pinned_malloc)(void **ptr, size_t bytes, unsigned int flags);
    int (*pinned_free)(void *ptr);
} fl_nvjpeg_pinned_allocator;

/* nvjpegDevAllocatorV2_t / nvjpegPinnedAllocatorV2_t (nvjpegCreateExV2):
 * stream-ordered, with a context pointer, so the memory can come from a
 * pool the caller owns. */
typedef struct fl_nvjpeg_dev_allocator_v2 {
    int (*dev_malloc)(void *ctx, void **ptr, size_t bytes, fl_cu_stream stream);
    int (*dev_free)(void *ctx, void *ptr, size_t bytes, fl_cu_stream stream);
    void *dev_ctx;
} fl_nvjpeg_dev_allocator_v2;
typedef struct fl_nvjpeg_pinned_allocator_v2 {
    int (*pinned_malloc)(void *ctx, void **ptr, size_t bytes, fl_cu_stream stream);
    int (*pinned_free)(void *ctx, void *ptr, size_t bytes, fl_cu_stream stream);
    void *pinned_ctx;
} fl_nvjpeg_pinned_allocator_v2;

typedef void *fl_nvjpeg_handle;        /* nvjpegHandle_t */
typedef void *fl_nvjpeg_state;         /* nvjpegJpegState_t */
typedef void *fl_nvjpeg_stream;        /* nvjpegJpegStream_t */
typedef void *fl_nvjpeg_decode_params; /* nvjpegDecodeParams_t */

/* libraryPropertyType (library_types.h) for nvjpegGetProperty. */
enum { FL_LIBRARY_MAJOR_VERSION = 0, FL_LIBRARY_MINOR_VERSION = 1, FL_LIBRARY_PATCH_LEVEL = 2 };

/* The resolved library.  Required entry points are never NULL; the
 * optional ones (marked) are NULL when this libnvjpeg lacks them. */
typedef struct fl_nvjpeg {
    fl_nvjpeg_status (*get_property)(int type, int *value);
    fl_nvjpeg_status (*create_ex)(fl_nvjpeg_backend backend, fl_nvjpeg_dev_allocator *dev,
                                  fl_nvjpeg_pinned_allocator *pinned, unsigned int flags,
                                  fl_nvjpeg_handle *handle);
    fl_nvjpeg_status (*destroy)(fl_nvjpeg_handle handle);
    fl_nvjpeg_status (*state_create)(fl_nvjpeg_handle handle, fl_nvjpeg_state *state);
    fl_nvjpeg_status (*state_destroy)(fl_nvjpeg_state state);
    fl_nvjpeg_status (*get_image_info)(fl_nvjpeg_handle handle, const unsigned char *data,
                                       size_t length, int *components,
                                       fl_nvjpeg_subsampling *subsampling, int *widths,
                                       int *heights);
    fl_nvjpeg_status (*decode_batched_initialize)(fl_nvjpeg_handle handle,
                                                  fl_nvjpeg_state state, int batch_size,
                                                  int max_cpu_threads,
                                                  fl_nvjpeg_output_format format);
    fl_nvjpeg_status (*decode_batched)(fl_nvjpeg_handle handle, fl_nvjpeg_state state,
                                       const unsigned char *const *data, const size_t *lengths,
                                       fl_nvjpeg_image *destinations, fl_cu_stream stream);
    fl_nvjpeg_status (*stream_create)(fl_nvjpeg_handle handle, fl_nvjpeg_stream *stream);
    fl_nvjpeg_status (*stream_parse)(fl_nvjpeg_handle handle, const unsigned char *data,
                                     size_t length, int save_metadata, int save_stream,
                                     fl_nvjpeg_stream stream);
    fl_nvjpeg_status (*stream_destroy)(fl_nvjpeg_stream stream);
    /* *supported is 0 when the hardware backend can decode the parsed
     * stream (the library's convention: nonzero means "not supported"). */
    fl_nvjpeg_status (*decode_batched_supported)(fl_nvjpeg_handle handle,
                                                 fl_nvjpeg_stream stream, int *supported);
    /* Optional: stream-ordered allocators (nvjpegCreateExV2). */
    fl_nvjpeg_status (*create_ex_v2)(fl_nvjpeg_backend backend,
                                     fl_nvjpeg_dev_allocator_v2 *dev,
                                     fl_nvjpeg_pinned_allocator_v2 *pinned, unsigned int flags,
                                     fl_nvjpeg_handle *handle);
    /* Optional, all or none: regions of interest (nvjpegDecodeBatchedEx). */
    fl_nvjpeg_status (*params_create)(fl_nvjpeg_handle handle, fl_nvjpeg_decode_params *params);
    fl_nvjpeg_status (*params_set_roi)(fl_nvjpeg_decode_params params, int x, int y, int width,
                                       int height);
    fl_nvjpeg_status (*params_set_output_format)(fl_nvjpeg_decode_params params,
                                                 fl_nvjpeg_output_format format);
    fl_nvjpeg_status (*params_destroy)(fl_nvjpeg_decode_params params);
    fl_nvjpeg_status (*decode_batched_ex)(fl_nvjpeg_handle handle, fl_nvjpeg_state state,
                                          const unsigned char *const *data,
                                          const size_t *lengths, fl_nvjpeg_image *destinations,
                                          fl_nvjpeg_decode_params *params, fl_cu_stream stream);
    char path[1024];  /* the file loaded */
    int version[3];   /* major, minor, patch (nvjpegGetProperty) */
} fl_nvjpeg;

/* Opens libnvjpeg once per process (thread-safe: the first caller's
 * `folders`, a NULL-terminated list or NULL, are the candidates; later
 * calls get the same answer).  Returns the library, or NULL with the reason
 * in *why (static text).  Needs no GPU and no CUDA context. */
const fl_nvjpeg *fl_nvjpeg_get(const char *const *folders, const char **why);

/* The status's name ("NVJPEG_STATUS_BAD_JPEG"), for any value. */
const char *fl_nvjpeg_status_string(fl_nvjpeg_status status);

/* A batched decoder: a handle and a JPEG state, on one device. */
typedef struct fl_nvjpeg_decoder {
    const fl_nvjpeg *lib;
    fl_nvjpeg_handle handle;  /* owned */
    fl_nvjpeg_state state;    /* owned; one thread at a time */
    fl_nvjpeg_stream parsed;  /* owned; for fl_nvjpeg_decoder_supported */
    fl_nvjpeg_backend backend; /* the backend it got */
    int batch_size;           /* what the state was initialised for (0: not yet) */
    fl_nvjpeg_output_format format;
    fl_nvjpeg_decode_params *params; /* owned, params_count of them (ROI decodes) */
    int params_count;
    /* The caller's allocators, copied: the library may keep the pointers
     * it was given for the handle's life. */
    fl_nvjpeg_dev_allocator_v2 dev;
    fl_nvjpeg_pinned_allocator_v2 pinned;
} fl_nvjpeg_decoder;

/* Makes a decoder on the current context's device.  With `use_hardware`,
 * asks for NVJPEG_BACKEND_HARDWARE first (A100, H100, H200: the JPEG
 * engines); creating that handle fails on a GPU without them, and then the
 * default backend (the batched API's GPU path) is used.  `dev` and
 * `pinned` (either may be NULL: the library's cudaMalloc/cudaHostAlloc) are
 * passed to nvjpegCreateExV2, so device memory can come from fastload's
 * pool; a library without CreateExV2 is refused when an allocator is
 * given.  Returns 0 and *out (free with fl_nvjpeg_decoder_destroy), or the
 * failing status with its call named in `error`. */
fl_nvjpeg_status fl_nvjpeg_decoder_create(const fl_nvjpeg *lib, int use_hardware,
                                          fl_nvjpeg_dev_allocator_v2 *dev,
                                          fl_nvjpeg_pinned_allocator_v2 *pinned,
                                          fl_nvjpeg_decoder **out, char *error,
                                          size_t error_size);
void fl_nvjpeg_decoder_destroy(fl_nvjpeg_decoder *decoder);

/* Whether the decoder's backend takes this JPEG in a batch: always 1 for
 * the default backend; for the hardware backend, nvjpegDecodeBatchedSupported
 * after parsing (progressive and some layouts are not).  Returns 0 with
 * *supported set, or the status (BAD_JPEG for a stream that does not
 * parse). */
fl_nvjpeg_status fl_nvjpeg_decoder_supported(fl_nvjpeg_decoder *decoder,
                                             const unsigned char *data, size_t length,
                                             int *supported);

/* Decodes `count` JPEGs into `destinations` (device memory; for RGBI,
 * channel[0] of width*3 bytes per row at pitch[0]) as interleaved RGB,
 * queued on `stream`.  Initialises the batched state when `count` changes.
 * Returns 0, or the status with the call named in `error`; the output is
 * ready once `stream` is. */
fl_nvjpeg_status fl_nvjpeg_decode_batch(fl_nvjpeg_decoder *decoder, int count,
                                        const unsigned char *const *data,
                                        const size_t *lengths,
                                        fl_nvjpeg_image *destinations, fl_cu_stream stream,
                                        char *error, size_t error_size);

/* Whether fl_nvjpeg_decode_batch_roi can run on this decoder: the library
 * has nvjpegDecodeBatchedEx and its parameter calls, and the decoder has
 * the hardware backend (the one nvJPEG documents regions of interest for
 * in batched decoding). */
int fl_nvjpeg_decoder_has_roi(const fl_nvjpeg_decoder *decoder);

/* As fl_nvjpeg_decode_batch, decoding only a region of each image:
 * rois[i] = {x, y, width, height} in the image's pixels, written from the
 * top-left of destinations[i] (width*3 bytes a row, RGBI).  Returns
 * NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED when
 * fl_nvjpeg_decoder_has_roi() is 0. */
fl_nvjpeg_status fl_nvjpeg_decode_batch_roi(fl_nvjpeg_decoder *decoder, int count,
                                            const unsigned char *const *data,
                                            const size_t *lengths, const int (*rois)[4],
                                            fl_nvjpeg_image *destinations, fl_cu_stream stream,
                                            char *error, size_t error_size);

#endif /* FL_CUDA_NVJPEG_H */
