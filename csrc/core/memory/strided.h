/* fastload core: copying an n-dimensional strided array into contiguous
 * memory — how a sample lands in its row of a batch slot. */
#ifndef FL_STRIDED_H
#define FL_STRIDED_H

#include <stddef.h>
#include <stdint.h>

#define FL_MAX_DIMS 32

typedef struct fl_strided {
    const char *data;                /* first element */
    int ndim;                        /* 0 ..FL_MAX_DIMS */
    int64_t shape[FL_MAX_DIMS];
    int64_t strides[FL_MAX_DIMS];    /* in bytes; may be negative or zero */
    size_t itemsize;
} fl_strided;

/* Copies every element of `src`, in C order, to `dst` (which holds
 * product(shape) * itemsize bytes).  Contiguous runs are copied with one
 * memcpy each. */
void fl_copy_strided(char *dst, const fl_strided *src);

/* product(shape) * itemsize, or SIZE_MAX when it overflows. */
size_t fl_strided_nbytes(int ndim, const int64_t *shape, size_t itemsize);

#endif /* FL_STRIDED_H */
