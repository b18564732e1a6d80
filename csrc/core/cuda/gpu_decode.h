/* fastload core: the GPU decode stage — the device half of a batch whose
 * JPEGs are shared between the CPU workers and the GPU.
 *
 * A worker leaves a batch's GPU images in its GPU part (gpu_batch.h): their
 * JPEG bytes and the tables of their resize.  On the upload stream, after
 * the batch's rows were queued for copying, the stage
 *
 *   1. decodes the images with nvJPEG's batched API (the hardware JPEG
 *      engines where the GPU has them) into a device pool of decoded pixels
 *      that was sized at start, as interleaved RGB;
 *   2. sets each item's addresses (its decoded pixels, its row of the
 *      device batch) and copies the items and tables to the device;
 *   3. launches the resample kernel (kernels/resample.cu), which writes each
 *      image's row: crop, resize, flip, normalisation, dtype and layout, as
 *      the CPU path computes them.
 *
 * An image the decoder's backend does not take (nvjpegDecodeBatchedSupported
 * under the hardware engines), and every image of a batch nvJPEG refuses,
 * is decoded on the calling thread by the CPU pipeline from the bytes in
 * the part, with its own key (so the same crop and flip), and its row
 * copied up: the batch is whole either way.
 *
 * Memory: the decoded-pixel pool (3 bytes a pixel of `pixel_capacity`) and
 * the table buffer are allocated when the stage is made and never grow, so
 * device memory stays flat over any number of epochs; the worker's budgets
 * (gpu_split) keep every part within them.  One stage is used by one thread
 * (the upload thread) at a time.
 */
#ifndef FL_GPU_DECODE_H
#define FL_GPU_DECODE_H

#include "core/cuda/cuda.h"
#include "core/cuda/gpu_batch.h"
#include "core/cuda/nvjpeg.h"
#include "core/cuda/nvrtc.h"
#include "core/image/pipeline.h"

#include <stddef.h>
#include <stdint.h>

typedef struct fl_gpu_decode fl_gpu_decode;

/* What the stage writes: rows of `row_bytes` at device address `images`,
 * as the plan's dtype and layout (out_w x out_h, 3 channels). */
typedef struct fl_gpu_decode_target {
    fl_cu_deviceptr images;
    size_t row_bytes;
    size_t rows;
} fl_gpu_decode_target;

/* What a run did: the images the GPU decoded, those decoded on the CPU
 * instead, and (on a failure) which sample failed and why. */
typedef struct fl_gpu_decode_report {
    uint32_t gpu_images, cpu_images;
    int64_t failed_sample; /* -1 unless a CPU fallback failed */
    char msg[256];
} fl_gpu_decode_report;

/* Makes a stage for device `ordinal` and `plan` (fl_plan_gpu_capable):
 * an nvJPEG decoder (the hardware backend first when `use_hardware`), the
 * resample kernel (NVRTC, once per process and device), the pixel pool of
 * `pixel_capacity` pixels in up to `max_images` images (each aligned) and a
 * table buffer of `table_bytes` (a GPU part
 * without its encoded bytes, fl_gpu_batch_table_bytes).  Call with the
 * device's context current.  Returns FL_OK, or an error with the reason in
 * `error` (the library or driver call that failed). */
int fl_gpu_decode_new(const fl_cuda *cuda, const fl_nvjpeg *nvjpeg, const fl_nvrtc *nvrtc,
                      int ordinal, const fl_image_plan *plan, uint64_t pixel_capacity,
                      uint32_t max_images, size_t table_bytes, int use_hardware,
                      fl_gpu_decode **out, char *error, size_t error_size);

/* Frees the stage's device memory and decoder (with the context current;
 * after its stream's work is done). */
void fl_gpu_decode_free(fl_gpu_decode *stage);

/* The backend the decoder got: "hardware" or "default". */
const char *fl_gpu_decode_backend(const fl_gpu_decode *stage);

/* Queues the decode and resampling of `part`'s images into target's rows
 * on `stream` (call with the context current, after the rows' upload was
 * queued on that stream).  `part`'s items are updated (their addresses)
 * and must stay unchanged until the stream has run.  Returns FL_OK, a
 * driver error as FL_ERR_IO with the call in report->msg, FL_ERR_INVALID
 * for a part that does not fit the stage, or the status of a CPU fallback
 * that failed (report->failed_sample names the sample). */
int fl_gpu_decode_run(fl_gpu_decode *stage, fl_gpu_batch *part,
                      const fl_gpu_decode_target *target, fl_cu_stream stream,
                      fl_gpu_decode_report *report);

/* The kernel's batch parameters that come from the plan (output size,
 * dtype, layout, per-channel scale and offset); the addresses and count
 * are the caller's to set. */
void fl_gpu_decode_kernel_batch(const fl_image_plan *plan, fl_rk_batch *batch);

/* The GPU images decoded, and the GPU seconds they took (from the decode's
 * start to the kernel's end, as the stream's timing events measured them),
 * over the batches completed since the last call; both 0 when the driver
 * cannot time events.  For the CPU/GPU split's controller. */
void fl_gpu_decode_take_timing(fl_gpu_decode *stage, uint64_t *images, double *seconds);

#endif /* FL_GPU_DECODE_H */
