/* fastload core: see pad.h. */
#include "core/image/pad.h"

#include <string.h>

void fl_pad_axes(const fl_pad_plan *plan, int width, int height, int crop_w, int crop_h,
                 fl_pad_axis *x, fl_pad_axis *y)
{
    memset(x, 0, sizeof *x);
    memset(y, 0, sizeof *y);
    x->n = width;
    y->n = height;
    x->before1 = plan->left;
    x->after1 = plan->right;
    y->before1 = plan->top;
    y->after1 = plan->bottom;
    if (!plan->if_needed)
        return;
    /* pad_if_needed pads both sides by the whole shortfall, as torchvision
     * does (the padded side ends up longer than the crop). */
    int short_w = crop_w - fl_pad_extent(x), short_h = crop_h - fl_pad_extent(y);
    if (short_w > 0) {
        if (plan->once) {
            x->before1 += short_w;
            x->after1 += short_w;
        } else {
            x->before2 = x->after2 = short_w;
        }
    }
    if (short_h > 0) {
        if (plan->once) {
            y->before1 += short_h;
            y->after1 += short_h;
        } else {
            y->before2 = y->after2 = short_h;
        }
    }
}

/* One stage: the pixel of an n-pixel axis at coordinate j (relative to its
 * first pixel; any integer), or -1 for constant fill.  A reflection farther
 * than the axis is long reflects the reflection: the pattern is periodic,
 * as np.pad's repeated padding makes it. */
static int stage_source(int n, int mode, int j)
{
    if (j >= 0 && j < n)
        return j;
    switch (mode) {
    case FL_PAD_CONSTANT:
        return -1;
    case FL_PAD_EDGE:
        return j < 0 ? 0 : n - 1;
    case FL_PAD_REFLECT: {
        if (n == 1)
            return 0;
        int period = 2 * (n - 1), k = j % period;
        k += k < 0 ? period : 0;
        return k < n ? k : period - k;
    }
    default: { /* FL_PAD_SYMMETRIC */
        int period = 2 * n, k = j % period;
        k += k < 0 ? period : 0;
        return k < n ? k : period - 1 - k;
    }
    }
}

int fl_pad_source(const fl_pad_axis *a, int mode, int i)
{
    int n1 = a->n + a->before1 + a->after1;
    int j = stage_source(n1, mode, i - a->before2);
    return j < 0 ? -1 : stage_source(a->n, mode, j - a->before1);
}

int fl_random_crop_offsets(fl_rng *rng, const fl_pad_axis *x, const fl_pad_axis *y, int crop_w,
                           int crop_h, int *left, int *top)
{
    int w = fl_pad_extent(x), h = fl_pad_extent(y);
    *left = *top = 0;
    if (w < crop_w || h < crop_h)
        return -1;
    if (w == crop_w && h == crop_h)
        return 0;
    *top = (int)fl_rng_below(rng, (int64_t)(h - crop_h) + 1);
    *left = (int)fl_rng_below(rng, (int64_t)(w - crop_w) + 1);
    return 0;
}

void fl_pad_source_range(const fl_pad_axis *a, int mode, int start, int len, int *lo, int *hi)
{
    /* Constant fill reads nothing; the edge mapping gives the same pixels
     * for the rest of the window, and one pixel when it is all fill.  The
     * other modes map a run of coordinates onto a run of pixels (each step
     * moves by at most one pixel), so the extremes bound it.  A window is at
     * most the padded size, so this walk is cheap next to the copy. */
    int m = mode == FL_PAD_CONSTANT ? FL_PAD_EDGE : mode;
    int least = a->n, most = -1;
    for (int i = start; i < start + len; i++) {
        int s = fl_pad_source(a, m, i);
        least = s < least ? s : least;
        most = s > most ? s : most;
    }
    *lo = least;
    *hi = most + 1;
}

int fl_pad_window(const fl_pad_plan *plan, const fl_pad_axis *x, const fl_pad_axis *y, int left,
                  int top, int crop_w, int crop_h, const unsigned char *src, int src_x, int src_y,
                  int src_w, int src_h, size_t src_stride, int *columns, unsigned char *dst)
{
    for (int i = 0; i < crop_w; i++) {
        int s = fl_pad_source(x, plan->mode, left + i);
        if (s >= 0 && (s < src_x || s >= src_x + src_w))
            return -1;
        columns[i] = s < 0 ? -1 : s - src_x;
    }
    size_t row_bytes = 3 * (size_t)crop_w;
    for (int r = 0; r < crop_h; r++) {
        unsigned char *out = dst + (size_t)r * row_bytes;
        int s = fl_pad_source(y, plan->mode, top + r);
        if (s >= 0 && (s < src_y || s >= src_y + src_h))
            return -1;
        if (s < 0) {
            for (int i = 0; i < crop_w; i++)
                memcpy(out + 3 * (size_t)i, plan->fill, 3);
            continue;
        }
        const unsigned char *row = src + (size_t)(s - src_y) * src_stride;
        int i = 0;
        while (i < crop_w) {
            /* Runs of consecutive source pixels (the image itself, most of
             * a window) are one copy. */
            int c = columns[i];
            if (c < 0) {
                memcpy(out + 3 * (size_t)i, plan->fill, 3);
                i++;
                continue;
            }
            int run = 1;
            while (i + run < crop_w && columns[i + run] == c + run)
                run++;
            memcpy(out + 3 * (size_t)i, row + 3 * (size_t)c, 3 * (size_t)run);
            i += run;
        }
    }
    return 0;
}
