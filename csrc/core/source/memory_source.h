/* fastload core: samples whose encoded bytes already lie in memory (the
 * binary column of an Arrow table, a Parquet file read into memory, a
 * Hugging Face dataset), handed to the image pipeline where they lie.
 *
 * The buffers belong to the binding, which keeps them alive and unmoved for
 * the source's lifetime and checks every range against its buffer once, at
 * construction; reads are then a lookup and a copy into the worker's read
 * buffer, without the GIL.  The copy runs under the bus-error guard
 * (bus_guard.h): a table memory-mapped from a file that another process
 * cuts short gives FL_ERR_CHANGED naming the file, never a SIGBUS inside a
 * decoder.  (A memcpy costs microseconds next to a decode.)
 */
#ifndef FL_MEMORY_SOURCE_H
#define FL_MEMORY_SOURCE_H

#include <stddef.h>
#include <stdint.h>

struct fl_image_worker;

typedef struct fl_memory_source {
    const unsigned char *const *bases; /* buffer b starts at bases[b] */
    const int64_t *which;              /* sample i lies in buffer which[i] */
    const int64_t *ranges;             /* (offset, size) of sample i there */
    int64_t length;                    /* number of samples */
} fl_memory_source;

/* The image source's byte provider (fl_image_source.read_bytes): sample
 * `index`'s bytes copied into w's read buffer.  Returns FL_OK,
 * FL_ERR_INVALID for an index out of range, FL_ERR_NOMEM, or
 * FL_ERR_CHANGED (the memory is a mapping whose file shrank; msg names the
 * file). */
int fl_memory_read(const void *ctx, struct fl_image_worker *w, int64_t index,
                   const unsigned char **data, size_t *size, char *msg, size_t msg_size);

#endif
