#include "memory_source.h"

#include "status.h"

#include <stdio.h>

int fl_memory_read(const void *ctx, struct fl_image_worker *w, int64_t index,
                   const unsigned char **data, size_t *size, char *msg, size_t msg_size)
{
    const fl_memory_source *src = ctx;
    (void)w; /* the bytes are read where they lie: no room is needed */
    if (index < 0 || index >= src->length) {
        snprintf(msg, msg_size, "sample index %lld is out of range", (long long)index);
        return FL_ERR_INVALID;
    }
    const int64_t *range = src->ranges + 2 * index;
    *data = src->bases[src->which[index]] + range[0];
    *size = (size_t)range[1];
    return FL_OK;
}
