/* fastload core: see blur.h. */
#include "core/image/blur.h"

#include <math.h>
#include <string.h>

void fl_blur_draw_for(const fl_blur_plan *plan, fl_rng *rng, fl_blur_draw *out)
{
    memset(out, 0, sizeof *out);
    if (!fl_blur_active(plan))
        return;
    /* RandomApply: `if p < torch.rand(1): skip`; the coin only where it can
     * come up either way, so p = 1 draws just the sigma. */
    out->on = plan->p >= 1.0 || fl_rng_uniform(rng) < plan->p;
    if (!out->on)
        return;
    out->kernel_w = plan->kernel_w;
    out->kernel_h = plan->kernel_h;
    out->sigma = plan->sigma_lo + (plan->sigma_hi - plan->sigma_lo) * fl_rng_uniform(rng);
}

void fl_blur_kernel(int size, double sigma, float *kernel)
{
    /* torch.linspace(-half, half, size): whole or half-whole offsets, exact
     * in float32; the pdf and its sum in float32 as torch computes them. */
    float half = (float)(size - 1) * 0.5f, s = (float)sigma, sum = 0.0f;
    for (int i = 0; i < size; i++) {
        float x = ((float)i - half) / s;
        kernel[i] = expf(-0.5f * (x * x));
        sum += kernel[i];
    }
    for (int i = 0; i < size; i++)
        kernel[i] /= sum;
}

/* Reflection without the edge pixel repeated, periodic past the ends. */
static int reflect(int i, int n)
{
    if (i >= 0 && i < n)
        return i;
    if (n == 1)
        return 0;
    int period = 2 * (n - 1), k = i % period;
    k += k < 0 ? period : 0;
    return k < n ? k : period - k;
}

size_t fl_blur_scratch_floats(const fl_blur_draw *draw, int width, int height)
{
    if (!draw->on)
        return 0;
    /* the two kernels, one padded row, and one plane between the passes */
    return (size_t)draw->kernel_w + (size_t)draw->kernel_h + (size_t)width + (size_t)draw->kernel_w +
           (size_t)width * (size_t)height;
}

void fl_blur_apply(const fl_blur_draw *draw, float *planes, int width, int height,
                   float *scratch)
{
    if (!draw->on)
        return;
    int kw = draw->kernel_w, kh = draw->kernel_h, hw = kw / 2, hh = kh / 2;
    float *kx = scratch, *ky = kx + kw, *line = ky + kh, *mid = line + width + kw;
    fl_blur_kernel(kw, draw->sigma, kx);
    fl_blur_kernel(kh, draw->sigma, ky);
    size_t n = (size_t)width * (size_t)height;
    for (int c = 0; c < 3; c++) {
        float *plane = planes + (size_t)c * n;
        /* Rows: each padded into `line`, then a dot product per pixel. */
        for (int y = 0; y < height; y++) {
            const float *row = plane + (size_t)y * width;
            for (int i = 0; i < width + 2 * hw; i++)
                line[i] = row[reflect(i - hw, width)];
            float *out = mid + (size_t)y * width;
            for (int x = 0; x < width; x++) {
                float acc = 0.0f;
                for (int k = 0; k < kw; k++)
                    acc += kx[k] * line[x + k];
                out[x] = acc;
            }
        }
        /* Columns: whole rows at a time, so the inner loop runs along
         * contiguous memory and vectorises. */
        for (int y = 0; y < height; y++) {
            float *out = plane + (size_t)y * width;
            for (int x = 0; x < width; x++)
                out[x] = 0.0f;
            for (int k = 0; k < kh; k++) {
                const float *src = mid + (size_t)reflect(y + k - hh, height) * width;
                float weight = ky[k];
                for (int x = 0; x < width; x++)
                    out[x] += weight * src[x];
            }
        }
    }
}
