/* fastload core: TFRecord files — the record framing, and the index of
 * where each record lies.
 *
 * A TFRecord file is records back to back, each
 *
 *     uint64 length | uint32 masked CRC-32C of length | data | uint32 masked CRC-32C of data
 *
 * (little-endian; the mask is fl_crc32c_mask).  The index is what DALI's
 * tfrecord2idx writes: for record k, its offset in the file and its size
 * with the framing (16 + length).  Records are then read by range, any
 * number of threads at once (file_read.h), and checked with
 * fl_tfrecord_payload.  Nothing here takes a lock or needs the GIL.
 */
#ifndef FL_TFRECORD_H
#define FL_TFRECORD_H

#include <stddef.h>
#include <stdint.h>

#define FL_TFRECORD_HEADER 12 /* length and its CRC */
#define FL_TFRECORD_FRAMING 16 /* header and the data's CRC */

/* The data of one whole record (`size` bytes at `rec`, its framing
 * included, as the index gives it): *payload and *length set.  With
 * `verify`, both CRCs are checked.  Returns FL_OK, or FL_ERR_DECODE with
 * msg saying which check failed: "truncated record" (fewer than 16 bytes,
 * or fewer than the length field says), "corrupt length" (the length's CRC
 * differs, or the length disagrees with the index), "bad data CRC". */
int fl_tfrecord_payload(const unsigned char *rec, size_t size, int verify,
                        const unsigned char **payload, size_t *length, char *msg,
                        size_t msg_size);

/* Where the records of a file lie (arrays malloc'ed; count entries each). */
typedef struct fl_tfrecord_index {
    int64_t *offsets; /* of each record's framing in the file */
    int64_t *sizes;   /* 16 + its length */
    size_t count;
    size_t capacity;
} fl_tfrecord_index;

void fl_tfrecord_index_init(fl_tfrecord_index *index);
void fl_tfrecord_index_free(fl_tfrecord_index *index);

/* Reads `n` bytes at `offset` into buf: returns the bytes read (fewer only
 * at the end of the input) or -1 with *err set (errno). */
typedef long long (*fl_read_at_fn)(void *ctx, uint64_t offset, void *buf, size_t n, int *err);

/* Indexes the records of an input read through read_at, reading each
 * header only: a record's length must fit in the input and, with
 * `verify_length`, its length CRC must check out.  Returns FL_OK, or
 * FL_ERR_IO (errno in *err), FL_ERR_DECODE ("record K at offset O: ...":
 * "truncated record", "corrupt length"), FL_ERR_NOMEM, with msg.  *index
 * keeps the records found before the error. */
int fl_tfrecord_scan(fl_read_at_fn read_at, void *ctx, uint64_t input_size, int verify_length,
                     fl_tfrecord_index *index, int *err, char *msg, size_t msg_size);

/* fl_tfrecord_scan over an open file descriptor (its size from fstat). */
int fl_tfrecord_scan_fd(int fd, int verify_length, fl_tfrecord_index *index, int *err, char *msg,
                        size_t msg_size);

/* fl_tfrecord_scan over bytes in memory. */
int fl_tfrecord_scan_memory(const unsigned char *data, size_t size, int verify_length,
                            fl_tfrecord_index *index, char *msg, size_t msg_size);

#endif /* FL_TFRECORD_H */
