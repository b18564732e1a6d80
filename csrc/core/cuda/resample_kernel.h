/* fastload core: the GPU resample kernel from the host's side — its
 * source text for NVRTC, the structs a launch fills, the packing of
 * fl_resample_tables' output into a batch's tables, and a CPU run of the
 * kernel's own per-pixel function (the reference the tests compare with
 * fl_resample).
 *
 * The kernel (core/cuda/kernels/resample.cu, included below as C) is
 * fl_resample on the GPU: for each image of a batch, its decoded RGB
 * pixels (3 bytes a pixel, rows src_pitch bytes apart) and its tables give
 * the image's row of the batch, equal to what fl_resample writes for the
 * same pixels, box and target (the same float operations in the same
 * order).
 *
 * A launch, on the host:
 *   1. per image, fl_resample_tables(); fl_resample_kernel_table_size()
 *      says how many int and float entries its tables take, and
 *      fl_resample_kernel_pack() copies them into the batch's arrays and
 *      fills the image's table fields (the caller sets src, src_pitch,
 *      src_x, src_y and dst);
 *   2. the images, first and weights arrays copied to the device, their
 *      device addresses in an fl_rk_batch with count, out_w, out_h, dtype,
 *      layout, scale and offset;
 *   3. fl_resample_kernel_source compiled with NVRTC (no options needed;
 *      not --use_fast_math or -ftz=true), the function named
 *      FL_RESAMPLE_KERNEL_NAME looked up, and launched with grid
 *      (ceil(out_w / 32), ceil(out_h / 8), min(count, 65535)), block
 *      (32, 8, 1), no shared memory, and the fl_rk_batch as its one
 *      parameter (kernelParams[0] points to it).
 */
#ifndef FL_RESAMPLE_KERNEL_H
#define FL_RESAMPLE_KERNEL_H

#include <stddef.h>

#include "core/image/resample.h"

/* The kernel source as C: fl_rk_image, fl_rk_batch and fl_rk_pixel(). */
#include "core/cuda/kernels/host_shim.h"
#include "core/cuda/kernels/resample.cu"

/* The text of core/cuda/kernels/resample.cu, NUL-terminated, for NVRTC.
 * Generated into the build folder by setup.py. */
extern const char fl_resample_kernel_source[];

/* The kernel's name in the compiled module (cuModuleGetFunction). */
#define FL_RESAMPLE_KERNEL_NAME "fl_resample_batch"

/* The entries one image's tables take in a batch's arrays: *firsts ints
 * (out_w + out_h) and *weights floats (out_w * taps_x + out_h * taps_y). */
void fl_resample_kernel_table_size(const fl_resample_coeffs *coeffs, int out_w, int out_h,
                                   size_t *firsts, size_t *weights);

/* Copies coeffs' tables into first[first_at ..] and weights[weights_at ..]
 * (room for fl_resample_kernel_table_size's counts) and sets image's
 * taps_x, taps_y, x_first, y_first, x_weights, y_weights, vertical_first,
 * clip and reserved; the other fields are left as they are.  out_w and
 * out_h are the target's.  Returns FL_OK, or FL_ERR_INVALID when an offset
 * would not fit the struct's int fields (nothing is written). */
int fl_resample_kernel_pack(const fl_resample_coeffs *coeffs, int out_w, int out_h, int *first,
                            size_t first_at, float *weights, size_t weights_at,
                            fl_rk_image *image);

/* Runs the kernel's per-pixel function over every pixel of every image of
 * batch on the CPU: batch's addresses (images, first, weights, and each
 * image's src and dst) are host pointers.  The arguments are trusted as
 * the kernel trusts them. */
void fl_resample_kernel_host(const fl_rk_batch *batch);

#endif /* FL_RESAMPLE_KERNEL_H */
