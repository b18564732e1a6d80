/* fastload core: see gpu_batch.h. */
#include "core/cuda/gpu_batch.h"

#include "core/status.h"

#include <string.h>

#define ALIGN 64

static int add_aligned(size_t *at, size_t bytes)
{
    size_t start = (*at + ALIGN - 1) / ALIGN * ALIGN;
    if (start < *at || bytes > SIZE_MAX - start)
        return -1;
    *at = start + bytes;
    return 0;
}

enum { KERNEL, ITEMS, FIRST, WEIGHTS, ENCODED, ARRAYS };

/* The offsets of the arrays after the head, and the total; -1 on overflow. */
static int layout(const fl_gpu_batch_shape *s, size_t offsets[ARRAYS], size_t *total)
{
    size_t at = sizeof(fl_gpu_batch_head);
    const uint64_t counts[ARRAYS] = {s->capacity, s->capacity, s->first_capacity,
                                     s->weight_capacity, s->encoded_capacity};
    const size_t sizes[ARRAYS] = {sizeof(fl_rk_image), sizeof(fl_gpu_item), sizeof(int),
                                  sizeof(float), 1};
    for (int i = 0; i < ARRAYS; i++) {
        if (counts[i] > SIZE_MAX / sizes[i])
            return -1;
        size_t start = (at + ALIGN - 1) / ALIGN * ALIGN;
        offsets[i] = start;
        if (add_aligned(&at, (size_t)counts[i] * sizes[i]) < 0)
            return -1;
    }
    *total = at;
    return 0;
}

size_t fl_gpu_batch_bytes(const fl_gpu_batch_shape *shape)
{
    size_t offsets[ARRAYS], total;
    return layout(shape, offsets, &total) < 0 ? 0 : total;
}

size_t fl_gpu_batch_table_bytes(const fl_gpu_batch_shape *shape)
{
    size_t offsets[ARRAYS], total;
    return layout(shape, offsets, &total) < 0 ? 0 : offsets[ENCODED];
}

static void point(fl_gpu_batch *b, void *base, const size_t offsets[ARRAYS])
{
    char *p = base;
    b->head = base;
    b->kernel = (fl_rk_image *)(p + offsets[KERNEL]);
    b->items = (fl_gpu_item *)(p + offsets[ITEMS]);
    b->first = (int *)(p + offsets[FIRST]);
    b->weights = (float *)(p + offsets[WEIGHTS]);
    b->encoded = (unsigned char *)(p + offsets[ENCODED]);
}

void fl_gpu_batch_init(fl_gpu_batch *batch, void *base, const fl_gpu_batch_shape *shape)
{
    size_t offsets[ARRAYS], total;
    (void)layout(shape, offsets, &total); /* the caller sized it with fl_gpu_batch_bytes */
    memset(base, 0, sizeof(fl_gpu_batch_head));
    point(batch, base, offsets);
    batch->head->shape = *shape;
}

int fl_gpu_batch_view(fl_gpu_batch *batch, void *base, size_t bytes)
{
    const fl_gpu_batch_head *head = base;
    size_t offsets[ARRAYS], total;
    if (bytes < sizeof *head || layout(&head->shape, offsets, &total) < 0 || total > bytes ||
        head->count > head->shape.capacity ||
        head->first_used > head->shape.first_capacity ||
        head->weights_used > head->shape.weight_capacity ||
        head->encoded_used > head->shape.encoded_capacity)
        return FL_ERR_INVALID;
    point(batch, base, offsets);
    return FL_OK;
}

int fl_gpu_batch_add(fl_gpu_batch *batch, const fl_gpu_item *item,
                     const unsigned char *data, size_t size,
                     const fl_resample_coeffs *coeffs, int out_w, int out_h)
{
    fl_gpu_batch_head *h = batch->head;
    const fl_gpu_batch_shape *s = &h->shape;
    size_t firsts, weights;
    fl_resample_kernel_table_size(coeffs, out_w, out_h, &firsts, &weights);
    uint64_t pixels = (uint64_t)item->width * (uint64_t)item->height;
    if (h->count >= s->capacity || size > s->encoded_capacity - h->encoded_used ||
        firsts > s->first_capacity - h->first_used ||
        weights > s->weight_capacity - h->weights_used ||
        pixels > s->pixel_capacity - h->pixels_used)
        return 0;
    fl_gpu_item *out = &batch->items[h->count];
    fl_rk_image *kernel = &batch->kernel[h->count];
    memset(kernel, 0, sizeof *kernel);
    if (fl_resample_kernel_pack(coeffs, out_w, out_h, batch->first, h->first_used,
                                batch->weights, h->weights_used, kernel) != FL_OK)
        return 0;
    *out = *item;
    out->offset = h->encoded_used;
    out->size = size;
    memcpy(batch->encoded + h->encoded_used, data, size);
    h->encoded_used += size;
    h->first_used += firsts;
    h->weights_used += weights;
    h->pixels_used += pixels;
    h->count++;
    return 1;
}
