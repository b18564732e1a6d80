/* fastload core: the part of a batch the GPU decodes — what a CPU worker
 * leaves for the GPU decode stage beside the rows it decoded itself.
 *
 * A batch that shares its JPEGs between the CPU and the GPU is its usual
 * outputs (the images, of which the GPU's rows are left unwritten, and the
 * labels) plus one more region of its slot, laid out here:
 *
 *     fl_gpu_batch_head
 *     fl_rk_image     kernel[capacity]       the kernel's view of each image
 *     fl_gpu_item     items[capacity]        the rest of what the stage needs
 *     int             first[first_capacity]  the resize's tables, packed by
 *     float           weights[weight_capacity]   fl_resample_kernel_pack
 *     unsigned char   encoded[encoded_capacity]  the images' JPEG bytes
 *
 * Each array starts on a 64-byte boundary.  The worker fills it in order
 * (fl_gpu_batch_add), the stage reads it: it sets the kernel structs'
 * addresses, copies everything before `encoded` to the device as it is
 * (fl_gpu_batch_table_bytes), decodes the encoded bytes, and launches the
 * kernel.  Capacities are fixed when the batch is planned; an image that
 * would not fit is decoded on the CPU instead, so memory stays bounded.
 */
#ifndef FL_GPU_BATCH_H
#define FL_GPU_BATCH_H

#include "core/cuda/resample_kernel.h"

#include <stddef.h>
#include <stdint.h>

/* The sizes of a part: set when the batch is planned. */
typedef struct fl_gpu_batch_shape {
    uint32_t capacity;          /* items: the batch size */
    uint64_t first_capacity;    /* int entries of the tables */
    uint64_t weight_capacity;   /* float entries */
    uint64_t encoded_capacity;  /* bytes */
    uint64_t pixel_capacity;    /* the decoded images' pixels (width * height) the
                                   stage's device pool holds for one batch */
} fl_gpu_batch_shape;

typedef struct fl_gpu_batch_head {
    fl_gpu_batch_shape shape;
    uint32_t count;             /* items used */
    uint32_t cpu_count;         /* images the worker decoded itself */
    uint64_t first_used, weights_used, encoded_used, pixels_used;
    uint64_t cpu_ns;            /* worker time on the CPU images */
    uint64_t prep_ns;           /* worker time preparing the GPU's */
} fl_gpu_batch_head;

/* One image the GPU decodes, beside its kernel struct (whose tables the
 * worker sets, and src, src_pitch and dst the stage; src_x, src_y stay 0:
 * the tables count from the origin). */
typedef struct fl_gpu_item {
    int32_t origin_x, origin_y; /* the image pixel the tables' column and row 0 are (a
                                   hard crop's corner, else 0, 0) */
    int64_t row;                /* its row of the batch */
    int64_t sample;             /* the dataset index (after skips): for messages and
                                   the CPU fallback */
    uint64_t offset, size;      /* its JPEG bytes in `encoded` */
    int32_t width, height;      /* the whole image, as nvJPEG decodes it */
    uint64_t key_seed, key_epoch; /* the sample key, for the CPU fallback */
} fl_gpu_item;

/* The region's bytes for `shape`, each array 64-byte aligned; 0 when that
 * overflows. */
size_t fl_gpu_batch_bytes(const fl_gpu_batch_shape *shape);

/* The bytes before `encoded`: the head, the kernel structs, the items and
 * the tables (what the stage copies to the device); 0 on overflow. */
size_t fl_gpu_batch_table_bytes(const fl_gpu_batch_shape *shape);

/* The region's arrays, for a region of fl_gpu_batch_bytes(shape) bytes at
 * `base` (64-byte aligned). */
typedef struct fl_gpu_batch {
    fl_gpu_batch_head *head;
    fl_rk_image *kernel;
    fl_gpu_item *items;
    int *first;
    float *weights;
    unsigned char *encoded;
} fl_gpu_batch;

/* Lays out and empties the region at `base`. */
void fl_gpu_batch_init(fl_gpu_batch *batch, void *base, const fl_gpu_batch_shape *shape);

/* Views a region laid out by fl_gpu_batch_init.  Returns FL_OK, or
 * FL_ERR_INVALID when its head does not fit its `bytes` (nothing set). */
int fl_gpu_batch_view(fl_gpu_batch *batch, void *base, size_t bytes);

/* Appends an image: its JPEG bytes and its tables (coeffs, for an out_w x
 * out_h output), with the item's other fields from `item` (origin, row,
 * sample, width, height, key).  Returns 1 when it was
 * added, 0 when it does not fit (the caller decodes it on the CPU; nothing
 * changed). */
int fl_gpu_batch_add(fl_gpu_batch *batch, const fl_gpu_item *item,
                     const unsigned char *data, size_t size,
                     const fl_resample_coeffs *coeffs, int out_w, int out_h);

#endif /* FL_GPU_BATCH_H */
