/* fastload core: TFRecord framing and indexing (see tfrecord.h). */
#define _GNU_SOURCE
#include "core/source/tfrecord.h"

#include "core/source/crc32c.h"
#include "core/status.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static uint64_t load_u64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static uint32_t load_u32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Whether the header's length CRC checks out. */
static int length_ok(const unsigned char *header)
{
    return fl_crc32c_mask(fl_crc32c(0, header, 8)) == load_u32(header + 8);
}

int fl_tfrecord_payload(const unsigned char *rec, size_t size, int verify,
                        const unsigned char **payload, size_t *length, char *msg,
                        size_t msg_size)
{
    if (size < FL_TFRECORD_FRAMING) {
        fl_set_msg(msg, msg_size, "truncated record (%zu bytes, less than its framing)", size);
        return FL_ERR_DECODE;
    }
    uint64_t n = load_u64(rec);
    if (verify && !length_ok(rec)) {
        fl_set_msg(msg, msg_size, "corrupt length (its CRC does not match)");
        return FL_ERR_DECODE;
    }
    if (n > size - FL_TFRECORD_FRAMING) {
        fl_set_msg(msg, msg_size, "truncated record (the length says %llu bytes, %zu are there)",
                   (unsigned long long)n, size - FL_TFRECORD_FRAMING);
        return FL_ERR_DECODE;
    }
    if (n != size - FL_TFRECORD_FRAMING) {
        fl_set_msg(msg, msg_size,
                   "corrupt length (the length says %llu bytes, the index %zu: a stale index?)",
                   (unsigned long long)n, size - FL_TFRECORD_FRAMING);
        return FL_ERR_DECODE;
    }
    const unsigned char *data = rec + FL_TFRECORD_HEADER;
    if (verify && fl_crc32c_mask(fl_crc32c(0, data, (size_t)n)) != load_u32(data + n)) {
        fl_set_msg(msg, msg_size, "bad data CRC");
        return FL_ERR_DECODE;
    }
    *payload = data;
    *length = (size_t)n;
    return FL_OK;
}

void fl_tfrecord_index_init(fl_tfrecord_index *index)
{
    memset(index, 0, sizeof *index);
}

void fl_tfrecord_index_free(fl_tfrecord_index *index)
{
    free(index->offsets);
    free(index->sizes);
    fl_tfrecord_index_init(index);
}

static int append(fl_tfrecord_index *index, int64_t offset, int64_t size)
{
    if (index->count == index->capacity) {
        size_t cap = index->capacity ? index->capacity * 2 : 1024;
        int64_t *o = realloc(index->offsets, cap * sizeof *o);
        if (!o)
            return FL_ERR_NOMEM;
        index->offsets = o;
        int64_t *s = realloc(index->sizes, cap * sizeof *s);
        if (!s)
            return FL_ERR_NOMEM;
        index->sizes = s;
        index->capacity = cap;
    }
    index->offsets[index->count] = offset;
    index->sizes[index->count] = size;
    index->count++;
    return FL_OK;
}

int fl_tfrecord_scan(fl_read_at_fn read_at, void *ctx, uint64_t input_size, int verify_length,
                     fl_tfrecord_index *index, int *err, char *msg, size_t msg_size)
{
    *err = 0;
    uint64_t at = 0;
    unsigned char header[FL_TFRECORD_HEADER];
    while (at < input_size) {
        size_t k = index->count;
        uint64_t left = input_size - at;
        long long got = read_at(ctx, at, header, sizeof header, err);
        if (got < 0) {
            fl_set_msg(msg, msg_size, "record %zu at offset %llu: %s", k,
                       (unsigned long long)at, strerror(*err));
            return FL_ERR_IO;
        }
        if ((uint64_t)got < sizeof header) {
            fl_set_msg(msg, msg_size,
                       "record %zu at offset %llu: truncated record (%llu bytes left, less "
                       "than its header)",
                       k, (unsigned long long)at, (unsigned long long)left);
            return FL_ERR_DECODE;
        }
        if (verify_length && !length_ok(header)) {
            fl_set_msg(msg, msg_size,
                       "record %zu at offset %llu: corrupt length (its CRC does not match)", k,
                       (unsigned long long)at);
            return FL_ERR_DECODE;
        }
        uint64_t n = load_u64(header);
        if (n > left - FL_TFRECORD_HEADER || left - FL_TFRECORD_HEADER - n < 4) {
            fl_set_msg(msg, msg_size,
                       "record %zu at offset %llu: truncated record (the length says %llu "
                       "bytes, %llu are left)",
                       k, (unsigned long long)at, (unsigned long long)n,
                       (unsigned long long)(left - FL_TFRECORD_HEADER));
            return FL_ERR_DECODE;
        }
        if (n > (uint64_t)INT64_MAX - FL_TFRECORD_FRAMING)
            return FL_ERR_DECODE; /* unreachable: n fits in the input */
        if (append(index, (int64_t)at, (int64_t)(n + FL_TFRECORD_FRAMING)) != FL_OK) {
            fl_set_msg(msg, msg_size, "out of memory indexing record %zu", k);
            return FL_ERR_NOMEM;
        }
        at += n + FL_TFRECORD_FRAMING;
    }
    return FL_OK;
}

static long long fd_read_at(void *ctx, uint64_t offset, void *buf, size_t n, int *err)
{
    int fd = *(int *)ctx;
    size_t done = 0;
    while (done < n) {
        ssize_t r = pread(fd, (char *)buf + done, n - done, (off_t)(offset + done));
        if (r < 0) {
            if (errno == EINTR)
                continue;
            *err = errno;
            return -1;
        }
        if (r == 0)
            break;
        done += (size_t)r;
    }
    return (long long)done;
}

int fl_tfrecord_scan_fd(int fd, int verify_length, fl_tfrecord_index *index, int *err, char *msg,
                        size_t msg_size)
{
    struct stat st;
    if (fstat(fd, &st) != 0) {
        *err = errno;
        fl_set_msg(msg, msg_size, "%s", strerror(errno));
        return FL_ERR_IO;
    }
    if (!S_ISREG(st.st_mode)) {
        *err = S_ISDIR(st.st_mode) ? EISDIR : EINVAL;
        fl_set_msg(msg, msg_size, "not a regular file");
        return FL_ERR_IO;
    }
    return fl_tfrecord_scan(fd_read_at, &fd, (uint64_t)st.st_size, verify_length, index, err,
                            msg, msg_size);
}

typedef struct memory_input {
    const unsigned char *data;
    size_t size;
} memory_input;

static long long memory_read_at(void *ctx, uint64_t offset, void *buf, size_t n, int *err)
{
    const memory_input *in = ctx;
    (void)err;
    if (offset >= in->size)
        return 0;
    size_t left = in->size - (size_t)offset;
    size_t take = n < left ? n : left;
    memcpy(buf, in->data + offset, take);
    return (long long)take;
}

int fl_tfrecord_scan_memory(const unsigned char *data, size_t size, int verify_length,
                            fl_tfrecord_index *index, char *msg, size_t msg_size)
{
    memory_input in = {data, size};
    int err;
    return fl_tfrecord_scan(memory_read_at, &in, size, verify_length, index, &err, msg,
                            msg_size);
}
