/* fastload core: see strided.h. */
#include "core/memory/strided.h"

#include <string.h>

size_t fl_strided_nbytes(int ndim, const int64_t *shape, size_t itemsize)
{
    size_t n = itemsize;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return SIZE_MAX;
        if (shape[i] != 0 && n > SIZE_MAX / (size_t)shape[i])
            return SIZE_MAX;
        n *= (size_t)shape[i];
    }
    return n;
}

void fl_copy_strided(char *dst, const fl_strided *src)
{
    /* Fold the innermost dimensions that are contiguous into one run, so the
     * common cases (a C-contiguous array, or rows of one) are single or few
     * memcpy calls. */
    int inner = src->ndim;
    size_t run = src->itemsize;
    while (inner > 0 && src->strides[inner - 1] == (int64_t)run) {
        run *= (size_t)src->shape[inner - 1];
        inner--;
    }
    size_t total = fl_strided_nbytes(src->ndim, src->shape, src->itemsize);
    if (total == 0)
        return;
    if (inner == 0) {
        memcpy(dst, src->data, run);
        return;
    }

    /* Odometer over the outer `inner` dimensions. */
    int64_t index[FL_MAX_DIMS] = {0};
    const char *p = src->data;
    size_t runs = total / run;
    for (size_t r = 0; r < runs; r++) {
        memcpy(dst, p, run);
        dst += run;
        for (int d = inner - 1; d >= 0; d--) {
            p += src->strides[d];
            if (++index[d] < src->shape[d])
                break;
            p -= src->strides[d] * src->shape[d];
            index[d] = 0;
        }
    }
}
