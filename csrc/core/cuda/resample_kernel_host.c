/* fastload core: see resample_kernel.h.  The host side of the resample
 * kernel: the packing of the tables and the CPU run of the kernel's
 * per-pixel function. */
#include "core/cuda/resample_kernel.h"

#include "core/status.h"

#include <stdint.h>
#include <string.h>

/* The struct layout is the contract with the device: no padding, the same
 * sizes on both sides; and the kernel's constants are the core's. */
_Static_assert(sizeof(fl_rk_image) == 64, "fl_rk_image is 64 bytes");
_Static_assert(sizeof(fl_rk_batch) == 72, "fl_rk_batch is 72 bytes");
_Static_assert(FL_RK_UINT8 == FL_DTYPE_UINT8 && FL_RK_FLOAT32 == FL_DTYPE_FLOAT32 &&
                   FL_RK_FLOAT16 == FL_DTYPE_FLOAT16,
               "the kernel's dtypes are FL_DTYPE_*");
_Static_assert(FL_RK_CHW == FL_LAYOUT_CHW && FL_RK_HWC == FL_LAYOUT_HWC,
               "the kernel's layouts are FL_LAYOUT_*");

void fl_resample_kernel_table_size(const fl_resample_coeffs *coeffs, int out_w, int out_h,
                                   size_t *firsts, size_t *weights)
{
    *firsts = (size_t)out_w + (size_t)out_h;
    *weights = (size_t)out_w * coeffs->x.taps + (size_t)out_h * coeffs->y.taps;
}

int fl_resample_kernel_pack(const fl_resample_coeffs *coeffs, int out_w, int out_h, int *first,
                            size_t first_at, float *weights, size_t weights_at,
                            fl_rk_image *image)
{
    size_t nfirst, nweights;
    fl_resample_kernel_table_size(coeffs, out_w, out_h, &nfirst, &nweights);
    /* The kernel indexes the arrays with int offsets plus x * taps. */
    if (first_at > (size_t)INT32_MAX - nfirst || weights_at > (size_t)INT32_MAX - nweights)
        return FL_ERR_INVALID;
    size_t nx = (size_t)out_w * coeffs->x.taps, ny = (size_t)out_h * coeffs->y.taps;
    memcpy(first + first_at, coeffs->x.first, sizeof(int) * (size_t)out_w);
    memcpy(first + first_at + out_w, coeffs->y.first, sizeof(int) * (size_t)out_h);
    memcpy(weights + weights_at, coeffs->x.weights, sizeof(float) * nx);
    memcpy(weights + weights_at + nx, coeffs->y.weights, sizeof(float) * ny);
    image->taps_x = coeffs->x.taps;
    image->taps_y = coeffs->y.taps;
    image->x_first = (int)first_at;
    image->y_first = (int)(first_at + (size_t)out_w);
    image->x_weights = (int)weights_at;
    image->y_weights = (int)(weights_at + nx);
    image->vertical_first = coeffs->vertical_first;
    image->clip = coeffs->clip;
    image->reserved = 0;
    return FL_OK;
}

void fl_resample_kernel_host(const fl_rk_batch *batch)
{
    /* The grid's order: images, rows, columns. */
    for (int i = 0; i < batch->count; i++)
        for (int y = 0; y < batch->out_h; y++)
            for (int x = 0; x < batch->out_w; x++)
                fl_rk_pixel(batch, i, x, y);
}
