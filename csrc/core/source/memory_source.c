/* fastload core: samples whose bytes lie in memory (see memory_source.h). */
#include "core/source/memory_source.h"

#include "core/image/pipeline.h"
#include "core/memory/bus_guard.h"
#include "core/status.h"

#include <stdio.h>

int fl_memory_read(const void *ctx, struct fl_image_worker *w, int64_t index,
                   const unsigned char **data, size_t *size, char *msg, size_t msg_size)
{
    const fl_memory_source *src = ctx;
    if (index < 0 || index >= src->length) {
        snprintf(msg, msg_size, "sample index %lld is out of range", (long long)index);
        return FL_ERR_INVALID;
    }
    const int64_t *range = src->ranges + 2 * index;
    const unsigned char *at = src->bases[src->which[index]] + range[0];
    size_t bytes = (size_t)range[1];
    /* The buffer may map a file another process can cut short: copy the
     * bytes out under the bus-error guard, so the decoders (which must not
     * be jumped out of) read only the copy. */
    unsigned char *copy = fl_image_worker_file_buffer(w, bytes);
    if (!copy) {
        snprintf(msg, msg_size, "out of memory for a %zu-byte sample", bytes);
        return FL_ERR_NOMEM;
    }
    const void *fault = NULL;
    if (fl_guarded_copy(copy, at, bytes, &fault) != FL_OK) {
        char what[48];
        snprintf(what, sizeof what, "sample index %lld", (long long)index);
        fl_bus_fault_msg(msg, msg_size, NULL, -1, -1, fault, what);
        return FL_ERR_CHANGED;
    }
    *data = copy;
    *size = bytes;
    return FL_OK;
}
