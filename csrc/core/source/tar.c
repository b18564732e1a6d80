/* fastload core: see tar.h. */
#define _GNU_SOURCE
#include "core/source/tar.h"
#include "core/status.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* After skipping a member larger than a window, the next header is read with
 * this much: a full window there would mostly be the next large member's
 * data, which nobody asked for. */
#define SEEK_READ (64u << 10)
/* How much of a name an error message quotes. */
#define QUOTED_NAME 160

/* --------------------------------------------------------------- errors */

static int fail(fl_tar_error *error, int status, int err, int64_t offset, const char *format, ...)
    __attribute__((format(printf, 5, 6)));

static int fail(fl_tar_error *error, int status, int err, int64_t offset, const char *format, ...)
{
    error->err = err;
    error->offset = offset;
    va_list args;
    va_start(args, format);
    vsnprintf(error->msg, sizeof error->msg, format, args);
    va_end(args);
    return status;
}

/* `name` as an error message quotes it: at most QUOTED_NAME bytes. */
typedef struct quoted {
    char text[QUOTED_NAME + 4];
} quoted;

static quoted quote(const char *name, size_t length)
{
    quoted q;
    size_t n = length > QUOTED_NAME ? QUOTED_NAME : length;
    memcpy(q.text, name, n);
    strcpy(q.text + n, length > n ? "..." : "");
    /* A NUL inside the name (a refused pax path) would cut the message. */
    for (size_t i = 0; i < n; i++)
        if (q.text[i] == '\0')
            q.text[i] = '?';
    return q;
}

/* --------------------------------------------------------------- reading
 *
 * A reader serves header blocks from a window of the file, refilled with one
 * large pread when a header lies outside it, and copies extension data
 * (long names, pax records) out.  Member data is never read. */

typedef struct reader {
    int fd;                        /* -1: the file is `memory` */
    const unsigned char *memory;
    int64_t size;                  /* bytes in the file */
    unsigned char *window;         /* fd only; owned */
    size_t window_capacity;        /* a whole number of blocks */
    int64_t window_start;
    size_t window_length;          /* bytes of the file held, from window_start */
} reader;

/* Reads up to `n` bytes at `offset`, fewer only at the end of the file.
 * Returns the bytes read, or -1 with errno set. */
static ssize_t pread_full(int fd, unsigned char *buf, size_t n, int64_t offset)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = pread(fd, buf + got, n - got, (off_t)(offset + (int64_t)got));
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        if (r == 0)
            break;
        got += (size_t)r;
    }
    return (ssize_t)got;
}

static int read_failed(const reader *r, fl_tar_error *error, int err, int64_t offset, ssize_t got)
{
    if (got < 0)
        return fail(error, FL_ERR_IO, err, offset, "reading at offset %lld failed: %s",
                    (long long)offset, strerror(err));
    return fail(error, FL_ERR_IO, 0, offset,
                "the file ended at offset %lld while reading it, though it had %lld bytes "
                "(was it changed while being read?)",
                (long long)(offset + got), (long long)r->size);
}

/* The header block at `offset` (a block boundary with a whole block left in
 * the file), or NULL with `error` filled. */
static const unsigned char *header_at(reader *r, int64_t offset, fl_tar_error *error)
{
    if (r->fd < 0)
        return r->memory + offset;
    int64_t window_end = r->window_start + (int64_t)r->window_length;
    if (offset >= r->window_start && offset + FL_TAR_BLOCK <= window_end)
        return r->window + (offset - r->window_start);
    /* Past the window by less than a window: reading on through the file. */
    size_t want = offset >= window_end && offset - window_end < (int64_t)r->window_capacity
                      ? r->window_capacity
                      : (r->window_capacity < SEEK_READ ? r->window_capacity : SEEK_READ);
    if ((int64_t)want > r->size - offset)
        want = (size_t)(r->size - offset);
    ssize_t got = pread_full(r->fd, r->window, want, offset);
    if (got < FL_TAR_BLOCK) {
        read_failed(r, error, errno, offset, got);
        return NULL;
    }
    r->window_start = offset;
    r->window_length = (size_t)got;
    return r->window;
}

/* Copies bytes [offset, offset + n) of the file (inside it) to `dst`.
 * Returns FL_OK or FL_ERR_IO. */
static int copy_at(reader *r, int64_t offset, size_t n, unsigned char *dst, fl_tar_error *error)
{
    if (r->fd < 0) {
        memcpy(dst, r->memory + offset, n);
        return FL_OK;
    }
    if (offset >= r->window_start &&
        offset + (int64_t)n <= r->window_start + (int64_t)r->window_length) {
        memcpy(dst, r->window + (offset - r->window_start), n);
        return FL_OK;
    }
    ssize_t got = pread_full(r->fd, dst, n, offset);
    if (got < 0 || (size_t)got < n)
        return read_failed(r, error, errno, offset, got);
    return FL_OK;
}

/* ------------------------------------------------------------- headers */

static int is_space(unsigned char c)
{
    /* What Python's str.strip() removes from an ASCII field. */
    return c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1c && c <= 0x1f);
}

/* A numeric header field as tarfile's nti() reads it: base-256 when the
 * first byte is 0x80 (0xff, a negative number, is refused), else octal
 * digits up to the first NUL, whitespace around them allowed, empty meaning
 * 0.  Returns 0, or -1 when malformed or past INT64_MAX. */
static int parse_number(const unsigned char *field, size_t length, int64_t *out)
{
    uint64_t value = 0;
    if (field[0] == 0x80 || field[0] == 0xff) {
        if (field[0] == 0xff)
            return -1;
        for (size_t i = 1; i < length; i++) {
            if (value > (uint64_t)(INT64_MAX >> 8))
                return -1;
            value = value << 8 | field[i];
        }
        *out = (int64_t)value;
        return 0;
    }
    size_t end = 0;
    while (end < length && field[end] != '\0')
        end++;
    size_t begin = 0;
    while (begin < end && is_space(field[begin]))
        begin++;
    while (end > begin && is_space(field[end - 1]))
        end--;
    for (size_t i = begin; i < end; i++) {
        if (field[i] < '0' || field[i] > '7' || value > (uint64_t)(INT64_MAX >> 3))
            return -1;
        value = value * 8 + (uint64_t)(field[i] - '0');
    }
    *out = (int64_t)value;
    return 0;
}

/* The stored checksum matches the unsigned or the signed byte sum, the
 * checksum field counted as spaces (old tars summed signed chars). */
static int checksum_ok(const unsigned char *h)
{
    int64_t stored;
    if (parse_number(h + 148, 8, &stored) < 0)
        return 0;
    int64_t unsigned_sum = 8 * ' ', signed_sum = 8 * ' ';
    for (int i = 0; i < FL_TAR_BLOCK; i++) {
        if (i >= 148 && i < 156)
            continue;
        unsigned_sum += h[i];
        signed_sum += (signed char)h[i];
    }
    return stored == unsigned_sum || stored == signed_sum;
}

static int is_zero_block(const unsigned char *h)
{
    for (int i = 0; i < FL_TAR_BLOCK; i++)
        if (h[i])
            return 0;
    return 1;
}

static size_t field_length(const unsigned char *field, size_t size)
{
    const unsigned char *nul = memchr(field, '\0', size);
    return nul ? (size_t)(nul - field) : size;
}

static int64_t padded(int64_t size)
{
    return (size + FL_TAR_BLOCK - 1) & ~(int64_t)(FL_TAR_BLOCK - 1);
}

/* Why a regular member's name is refused, or NULL. */
static const char *name_fault(const char *name, size_t length)
{
    if (length == 0)
        return "its name is empty";
    if (memchr(name, '\0', length))
        return "its name holds a NUL byte";
    if (name[0] == '/')
        return "its name is an absolute path";
    for (size_t start = 0; start <= length;) {
        const char *slash = memchr(name + start, '/', length - start);
        size_t end = slash ? (size_t)(slash - name) : length;
        if (end - start == 2 && name[start] == '.' && name[start + 1] == '.')
            return "its name has a '..' component (a path outside the archive)";
        start = end + 1;
    }
    return NULL;
}

/* The first bytes of a file that is not a tar, for a message saying what
 * it is instead. */
static const char *compression_of(const unsigned char *data, size_t n)
{
    if (n >= 2 && data[0] == 0x1f && data[1] == 0x8b)
        return "gzip";
    if (n >= 3 && memcmp(data, "BZh", 3) == 0)
        return "bzip2";
    if (n >= 6 && memcmp(data, "\xfd" "7zXZ\0", 6) == 0)
        return "xz";
    if (n >= 4 && memcmp(data, "\x28\xb5\x2f\xfd", 4) == 0)
        return "zstd";
    return NULL;
}

/* `start`: the first `n` bytes of a file of `size` bytes. */
static int not_a_tar(const unsigned char *start, size_t n, int64_t size, fl_tar_error *error)
{
    const char *compression = compression_of(start, n);
    if (compression)
        return fail(error, FL_ERR_DECODE, 0, 0,
                    "not a tar archive: the file is %s-compressed (fastload reads "
                    "uncompressed tar shards)",
                    compression);
    if (size < FL_TAR_BLOCK)
        return fail(error, FL_ERR_DECODE, 0, 0,
                    "not a tar archive: the file has %lld bytes, less than one header block",
                    (long long)size);
    return fail(error, FL_ERR_DECODE, 0, 0,
                "not a tar archive: the first header block has a bad checksum");
}

/* --------------------------------------------------------------- the index */

void fl_tar_index_init(fl_tar_index *index)
{
    memset(index, 0, sizeof *index);
}

void fl_tar_index_free(fl_tar_index *index)
{
    free(index->names);
    free(index->name_offsets);
    free(index->data_offsets);
    free(index->sizes);
    fl_tar_index_init(index);
}

static int grow(void **array, size_t count, size_t element)
{
    void *grown = realloc(*array, count * element);
    if (!grown)
        return -1;
    *array = grown;
    return 0;
}

static int index_append(fl_tar_index *index, const char *name, size_t length, int64_t data,
                        int64_t size)
{
    if (index->count == index->capacity) {
        if (index->capacity > SIZE_MAX / 2 / sizeof(int64_t))
            return -1;
        size_t capacity = index->capacity ? 2 * index->capacity : 256;
        /* Each array is at least `capacity` long once all three grew; until
         * then the old capacity still holds for all of them. */
        if (grow((void **)&index->name_offsets, capacity, sizeof(int64_t)) < 0 ||
            grow((void **)&index->data_offsets, capacity, sizeof(int64_t)) < 0 ||
            grow((void **)&index->sizes, capacity, sizeof(int64_t)) < 0)
            return -1;
        index->capacity = capacity;
    }
    if (length + 1 > index->names_capacity - index->names_size) {
        size_t need = index->names_size + length + 1;
        if (need < length || index->names_capacity > SIZE_MAX / 2)
            return -1;
        size_t capacity = index->names_capacity ? 2 * index->names_capacity : 16384;
        if (capacity < need)
            capacity = need;
        if (grow((void **)&index->names, capacity, 1) < 0)
            return -1;
        index->names_capacity = capacity;
    }
    size_t i = index->count++;
    index->name_offsets[i] = (int64_t)index->names_size;
    index->data_offsets[i] = data;
    index->sizes[i] = size;
    memcpy(index->names + index->names_size, name, length);
    index->names[index->names_size + length] = '\0';
    index->names_size += length + 1;
    return 0;
}

/* What GNU long-name and pax headers say about the member after them.
 * tarfile applies a header's overrides after those of the headers that
 * follow it, so the first value read wins. */
typedef struct pending {
    int64_t first_header;          /* offset of the first extension header; -1: none */
    int have_name, have_size;
    char *name;                    /* owned, grown to the longest name */
    size_t name_length, name_capacity;
    int64_t size;
    unsigned char *data;           /* extension data being read; owned */
    size_t data_capacity;
} pending;

static int reserve(void *buffer, size_t *capacity, size_t n)
{
    if (n <= *capacity)
        return 0;
    if (grow((void **)buffer, n, 1) < 0)
        return -1;
    *capacity = n;
    return 0;
}

static int set_pending_name(pending *p, const char *name, size_t length)
{
    if (p->have_name)
        return 0;
    if (reserve(&p->name, &p->name_capacity, length + 1) < 0)
        return -1;
    memcpy(p->name, name, length);
    p->name_length = length;
    p->have_name = 1;
    return 0;
}

/* Parses pax records ("<length> <keyword>=<value>\n") and keeps path= and
 * size=.  Stricter than tarfile, which stops at the first record it cannot
 * parse and reads a bad size as 0: here both are errors. */
static int parse_pax(pending *p, const unsigned char *data, size_t n, int64_t offset,
                     fl_tar_error *error)
{
    const unsigned char *path = NULL;
    size_t path_length = 0;
    int have_size = 0;
    int64_t size = 0;
    size_t at = 0;
    while (at < n && data[at] != '\0') { /* NUL padding ends the records */
        size_t i = at, length = 0;
        while (i < n && data[i] >= '0' && data[i] <= '9' && length <= n)
            length = length * 10 + (size_t)(data[i++] - '0');
        const unsigned char *eq = i < n ? memchr(data + i, '=', n - i) : NULL;
        if (i == at || i >= n || data[i] != ' ' || length > n - at || !eq ||
            (size_t)(eq - data) >= at + length || (size_t)(eq - data) == i + 1 ||
            data[at + length - 1] != '\n')
            return fail(error, FL_ERR_DECODE, 0, offset,
                        "malformed pax extended header at offset %lld (record at byte %zu)",
                        (long long)offset, at);
        const unsigned char *keyword = data + i + 1;
        size_t keyword_length = (size_t)(eq - keyword);
        const unsigned char *value = eq + 1;
        size_t value_length = (size_t)(data + at + length - 1 - value);
        if (keyword_length == 4 && memcmp(keyword, "path", 4) == 0) {
            path = value;
            path_length = value_length;
        } else if (keyword_length == 4 && memcmp(keyword, "size", 4) == 0) {
            size = 0;
            for (size_t k = 0; k < value_length; k++) {
                if (value[k] < '0' || value[k] > '9' || size > (INT64_MAX - 9) / 10)
                    return fail(error, FL_ERR_DECODE, 0, offset,
                                "pax extended header at offset %lld: invalid size '%.*s'",
                                (long long)offset, (int)(value_length < 40 ? value_length : 40),
                                (const char *)value);
                size = size * 10 + (value[k] - '0');
            }
            if (value_length == 0)
                return fail(error, FL_ERR_DECODE, 0, offset,
                            "pax extended header at offset %lld: empty size", (long long)offset);
            have_size = 1;
        } else if (keyword_length > 11 && memcmp(keyword, "GNU.sparse.", 11) == 0) {
            return fail(error, FL_ERR_DECODE, 0, offset,
                        "pax extended header at offset %lld describes a GNU sparse member, "
                        "which fastload does not read",
                        (long long)offset);
        }
        at += length;
    }
    if (path) {
        while (path_length > 0 && path[path_length - 1] == '/') /* as tarfile strips it */
            path_length--;
        if (set_pending_name(p, (const char *)path, path_length) < 0)
            return fail(error, FL_ERR_NOMEM, 0, offset, "out of memory for a member name");
    }
    if (have_size && !p->have_size) {
        p->size = size;
        p->have_size = 1;
    }
    return FL_OK;
}

/* Reads an extension header's data (GNU long name 'L', pax 'x'/'X') into the
 * pending overrides. */
static int read_extension(reader *r, pending *p, int type, int64_t offset, int64_t size,
                          fl_tar_error *error)
{
    if (reserve(&p->data, &p->data_capacity, (size_t)size + 1) < 0)
        return fail(error, FL_ERR_NOMEM, 0, offset, "out of memory for an extended header");
    int status = copy_at(r, offset + FL_TAR_BLOCK, (size_t)size, p->data, error);
    if (status != FL_OK)
        return status;
    if (type != 'L')
        return parse_pax(p, p->data, (size_t)size, offset, error);
    size_t length = field_length(p->data, (size_t)size);
    if (set_pending_name(p, (const char *)p->data, length) < 0)
        return fail(error, FL_ERR_NOMEM, 0, offset, "out of memory for a member name");
    return FL_OK;
}

/* The name of the regular member whose header is `h`: the pending
 * override, else the ustar prefix (not in old-GNU headers, which keep
 * times there), "/", and the name field.  Points into `p` or `buffer`. */
static const char *member_name(const unsigned char *h, const pending *p, char *buffer,
                               size_t *length)
{
    if (p->have_name) {
        *length = p->name_length;
        return p->name;
    }
    size_t name_length = field_length(h, 100);
    int old_gnu = memcmp(h + 257, "ustar  \0", 8) == 0;
    size_t prefix_length = old_gnu ? 0 : field_length(h + 345, 155);
    size_t n = 0;
    if (prefix_length) {
        memcpy(buffer, h + 345, prefix_length);
        buffer[prefix_length] = '/';
        n = prefix_length + 1;
    }
    memcpy(buffer + n, h, name_length);
    *length = n + name_length;
    return buffer;
}

/* The last member indexed, quoted for a message (the index is not empty). */
static quoted last_member(const fl_tar_index *index)
{
    const char *name = fl_tar_name(index, index->count - 1);
    return quote(name, strlen(name));
}

/* Whether the last member indexed has its header at `offset`. */
static int last_member_at(const fl_tar_index *index, int64_t offset)
{
    return index->count && index->data_offsets[index->count - 1] == offset + FL_TAR_BLOCK;
}

static int read_archive(reader *r, fl_tar_index *index, pending *p, fl_tar_error *error)
{
    char short_name[256 + 1];
    int64_t pos = 0, previous = -1; /* this header's offset, and the one before */
    for (;;) {
        if (pos > r->size && last_member_at(index, previous))
            return fail(error, FL_ERR_DECODE, 0, previous,
                        "the file ends at offset %lld, inside the padding after member '%s' "
                        "(header at offset %lld; truncated shard)",
                        (long long)r->size, last_member(index).text, (long long)previous);
        if (pos > r->size)
            return fail(error, FL_ERR_DECODE, 0, previous,
                        "the file ends at offset %lld, inside the padding after the data of "
                        "the header at offset %lld (truncated shard)",
                        (long long)r->size, (long long)previous);
        if (pos == r->size) {
            if (pos == 0)
                return fail(error, FL_ERR_DECODE, 0, 0, "the file is empty, not a tar archive");
            break;
        }
        if (r->size - pos < FL_TAR_BLOCK) {
            if (pos == 0)
                return not_a_tar(r->memory, (size_t)r->size, r->size, error);
            return fail(error, FL_ERR_DECODE, 0, pos,
                        "the file ends inside the header block at offset %lld (truncated "
                        "shard)",
                        (long long)pos);
        }
        const unsigned char *h = header_at(r, pos, error);
        if (!h)
            return FL_ERR_IO;
        if (is_zero_block(h))
            break; /* the end-of-archive marker; what follows is ignored */
        if (!checksum_ok(h)) {
            if (pos == 0)
                return not_a_tar(h, FL_TAR_BLOCK, r->size, error);
            if (index->count)
                return fail(error, FL_ERR_DECODE, 0, pos,
                            "bad header checksum at offset %lld, after member '%s' (corrupt "
                            "or truncated shard)",
                            (long long)pos, last_member(index).text);
            return fail(error, FL_ERR_DECODE, 0, pos,
                        "bad header checksum at offset %lld (corrupt or truncated shard)",
                        (long long)pos);
        }
        int type = h[156];
        int64_t size, data = pos + FL_TAR_BLOCK;
        previous = pos;
        if (parse_number(h + 124, 12, &size) < 0)
            return fail(error, FL_ERR_DECODE, 0, pos,
                        "invalid or out-of-range size field in the header at offset %lld",
                        (long long)pos);

        if (type == 'L' || type == 'K' || type == 'x' || type == 'X' || type == 'g') {
            if (size > r->size - data)
                return fail(error, FL_ERR_DECODE, 0, pos,
                            "the extended header at offset %lld declares %lld bytes of data, "
                            "past the end of the file at %lld (truncated shard)",
                            (long long)pos, (long long)size, (long long)r->size);
            if (type != 'K' && type != 'g') {
                if (size > FL_TAR_MAX_EXTENDED)
                    return fail(error, FL_ERR_TOO_BIG, 0, pos,
                                "the extended header at offset %lld has %lld bytes, more than "
                                "the %u fastload reads",
                                (long long)pos, (long long)size, FL_TAR_MAX_EXTENDED);
                int status = read_extension(r, p, type, pos, size, error);
                if (status != FL_OK)
                    return status;
            }
            if (p->first_header < 0)
                p->first_header = pos;
            pos = data + padded(size);
            continue;
        }
        if (type == 'S')
            return fail(error, FL_ERR_DECODE, 0, pos,
                        "the header at offset %lld is a GNU sparse member, which fastload "
                        "does not read",
                        (long long)pos);

        int regular = type == '0' || type == '\0' || type == '7';
        int special = type >= '1' && type <= '6'; /* links, devices, directories, FIFOs */
        size_t short_length = field_length(h, 100);
        if (type == '\0' && short_length && h[short_length - 1] == '/') {
            regular = 0; /* a v7 directory */
            special = 1;
        }
        if (p->have_size)
            size = p->size;
        if (regular) {
            size_t length;
            const char *name = member_name(h, p, short_name, &length);
            quoted q = quote(name, length);
            const char *fault = name_fault(name, length);
            if (fault)
                return fail(error, FL_ERR_DECODE, 0, pos,
                            "member '%s' (header at offset %lld) is refused: %s", q.text,
                            (long long)pos, fault);
            /* No allocation depends on `size`: a huge one is only out of the file. */
            if (size > r->size - data)
                return fail(error, FL_ERR_DECODE, 0, pos,
                            "member '%s' (header at offset %lld) is cut: its %lld bytes of "
                            "data would end past the end of the file at offset %lld "
                            "(truncated shard, or a corrupt size)",
                            q.text, (long long)pos, (long long)size, (long long)r->size);
            if (index_append(index, name, length, data, size) < 0)
                return fail(error, FL_ERR_NOMEM, 0, pos, "out of memory indexing member '%s'",
                            q.text);
        } else if (!special && size > r->size - data) {
            return fail(error, FL_ERR_DECODE, 0, pos,
                        "the header at offset %lld (type '%c') declares %lld bytes of data, "
                        "past the end of the file at %lld (truncated shard)",
                        (long long)pos, type >= ' ' && type < 127 ? type : '?',
                        (long long)size, (long long)r->size);
        }
        /* tarfile skips the data of regular members and of unknown types,
         * and takes the size of the other known types to be zero. */
        pos = special ? data : data + padded(size);
        p->first_header = -1;
        p->have_name = p->have_size = 0;
    }
    if (p->first_header >= 0)
        return fail(error, FL_ERR_DECODE, 0, p->first_header,
                    "the extended header at offset %lld is not followed by a member "
                    "(truncated shard)",
                    (long long)p->first_header);
    return FL_OK;
}

static int index_with(reader *r, fl_tar_index *index, fl_tar_error *error)
{
    pending p;
    memset(&p, 0, sizeof p);
    p.first_header = -1;
    error->err = 0;
    error->offset = -1;
    error->msg[0] = '\0';
    int status = read_archive(r, index, &p, error);
    free(p.name);
    free(p.data);
    return status;
}

int fl_tar_index_memory(const void *data, size_t size, fl_tar_index *index, fl_tar_error *error)
{
    if (size > (size_t)INT64_MAX)
        return fail(error, FL_ERR_INVALID, 0, -1, "fl_tar_index_memory: size out of range");
    reader r = {.fd = -1, .memory = data, .size = (int64_t)size};
    return index_with(&r, index, error);
}

int fl_tar_index_fd(int fd, size_t window, fl_tar_index *index, fl_tar_error *error)
{
    struct stat st;
    if (fstat(fd, &st) != 0)
        return fail(error, FL_ERR_IO, errno, -1, "fl_tar_index_fd: %s", strerror(errno));
    if (S_ISDIR(st.st_mode))
        return fail(error, FL_ERR_IO, EISDIR, -1, "%s", strerror(EISDIR));
    if (!S_ISREG(st.st_mode))
        return fail(error, FL_ERR_IO, 0, -1, "not a regular file");
    if (window == 0)
        window = FL_TAR_WINDOW;
    if (window > SIZE_MAX / 2)
        return fail(error, FL_ERR_INVALID, 0, -1, "fl_tar_index_fd: window out of range");
    window = (window + FL_TAR_BLOCK - 1) / FL_TAR_BLOCK * FL_TAR_BLOCK;
    /* A small file needs no larger window than itself. */
    if ((int64_t)window > st.st_size)
        window = (size_t)padded(st.st_size > 0 ? st.st_size : 1);
    reader r = {.fd = fd, .size = st.st_size, .window_capacity = window};
    r.window = malloc(window);
    if (!r.window)
        return fail(error, FL_ERR_NOMEM, 0, -1, "out of memory for a %zu-byte read buffer",
                    window);
    /* pos 0 needs the file's first bytes for a not-a-tar message. */
    int status;
    if (st.st_size > 0 && st.st_size < FL_TAR_BLOCK) {
        ssize_t got = pread_full(fd, r.window, (size_t)st.st_size, 0);
        status = got == st.st_size ? not_a_tar(r.window, (size_t)got, st.st_size, error)
                                   : read_failed(&r, error, errno, 0, got);
    } else {
        status = index_with(&r, index, error);
    }
    free(r.window);
    return status;
}

/* ------------------------------------------------------------ WebDataset */

void fl_tar_samples_init(fl_tar_samples *samples)
{
    memset(samples, 0, sizeof *samples);
}

void fl_tar_samples_free(fl_tar_samples *samples)
{
    free(samples->key_lengths);
    free(samples->members);
    free(samples->starts);
    fl_tar_samples_init(samples);
}

/* base_plus_ext's r"^((?:.*\/|)[^.]+)[.]([^/]*)$" without a regex engine.
 * The split is at the first dot q of the last component.  Python's regex
 * finds it when the key's last run of non-dots, [^.]+, can start at the
 * beginning of the name (no dot before q) or just after a slash that lies
 * after the last dot before q, short of q - 1 (a non-empty run), and with
 * no newline before it (the regex's "." matches none). */
int64_t fl_tar_key_length(const char *name, size_t length)
{
    const char *slash = memrchr(name, '/', length);
    size_t last = slash ? (size_t)(slash - name) + 1 : 0; /* the last component */
    const char *dot = memchr(name + last, '.', length - last);
    if (!dot)
        return -1;
    size_t q = (size_t)(dot - name);
    const char *before = memrchr(name, '.', q);
    if (!before && q > 0)
        return (int64_t)q;
    size_t t = before ? (size_t)(before - name) : 0; /* slashes must lie after t */
    const char *newline = memchr(name, '\n', length);
    size_t limit = q > 0 ? q - 1 : 0;
    if (newline && (size_t)(newline - name) < limit)
        limit = (size_t)(newline - name);
    const char *s = limit > 0 ? memrchr(name, '/', limit) : NULL;
    return s && (!before || (size_t)(s - name) > t) ? (int64_t)q : -1;
}

/* tar_file_iterator skips a name with no "/" that starts and ends with
 * "__", and any name matching r"__[^/]*__($|/)" from its start ("$" also
 * matching before a final newline). */
int fl_tar_is_meta(const char *name, size_t length)
{
    if (length < 2 || name[0] != '_' || name[1] != '_')
        return 0;
    const char *slash = memchr(name, '/', length);
    if (!slash) {
        if (name[length - 2] == '_' && name[length - 1] == '_')
            return 1;
        return length >= 5 && name[length - 1] == '\n' && name[length - 3] == '_' &&
               name[length - 2] == '_';
    }
    size_t c = (size_t)(slash - name);
    return c >= 4 && name[c - 2] == '_' && name[c - 1] == '_';
}

static unsigned char lower(unsigned char c)
{
    return c >= 'A' && c <= 'Z' ? (unsigned char)(c + ('a' - 'A')) : c;
}

static int same_extension(const char *a, size_t a_length, const char *b, size_t b_length)
{
    if (a_length != b_length)
        return 0;
    for (size_t i = 0; i < a_length; i++)
        if (lower((unsigned char)a[i]) != lower((unsigned char)b[i]))
            return 0;
    return 1;
}

static uint64_t extension_hash(const char *ext, size_t length)
{
    uint64_t h = 1469598103934665603u; /* FNV-1a */
    for (size_t i = 0; i < length; i++)
        h = (h ^ lower((unsigned char)ext[i])) * 1099511628211u;
    return h;
}

static size_t name_length(const fl_tar_index *index, size_t i)
{
    size_t end = i + 1 < index->count ? (size_t)index->name_offsets[i + 1] : index->names_size;
    return end - (size_t)index->name_offsets[i] - 1;
}

/* The extensions of the sample being grouped: an open-addressing set of
 * member indices, emptied for the next sample by bumping `generation`
 * rather than clearing, so a sample costs time in its own size only. */
typedef struct extension_set {
    uint32_t *stamps;     /* slot i is in use when stamps[i] == generation */
    int64_t *members;
    size_t capacity;      /* a power of two */
    uint32_t generation;
} extension_set;

typedef struct grouping {
    const fl_tar_index *index;
    const fl_tar_samples *samples;
    extension_set set;
} grouping;

static void extension_of(const grouping *g, int64_t member, const char **ext, size_t *length)
{
    size_t key = (size_t)g->samples->key_lengths[member];
    *ext = fl_tar_name(g->index, (size_t)member) + key + 1;
    *length = name_length(g->index, (size_t)member) - key - 1;
}

/* Adds `member`; returns -1 with nothing added when an earlier member of the
 * sample has its extension (its index in *clash). */
static int set_add(grouping *g, int64_t member, int64_t *clash)
{
    const char *ext;
    size_t length;
    extension_of(g, member, &ext, &length);
    size_t mask = g->set.capacity - 1;
    for (size_t i = extension_hash(ext, length) & mask;; i = (i + 1) & mask) {
        if (g->set.stamps[i] != g->set.generation) {
            g->set.stamps[i] = g->set.generation;
            g->set.members[i] = member;
            return 0;
        }
        const char *other;
        size_t other_length;
        extension_of(g, g->set.members[i], &other, &other_length);
        if (same_extension(ext, length, other, other_length)) {
            *clash = g->set.members[i];
            return -1;
        }
    }
}

/* Makes room for a sample of `size` members (the set at most half full),
 * re-adding those of the sample so far (members[first .. first + size - 1)). */
static int set_reserve(grouping *g, size_t size, const int64_t *sample)
{
    if (2 * size <= g->set.capacity)
        return 0;
    size_t capacity = g->set.capacity ? 2 * g->set.capacity : 16;
    while (capacity < 2 * size)
        capacity *= 2;
    uint32_t *stamps = calloc(capacity, sizeof *stamps);
    int64_t *members = malloc(capacity * sizeof *members);
    if (!stamps || !members) {
        free(stamps);
        free(members);
        return -1;
    }
    free(g->set.stamps);
    free(g->set.members);
    g->set.stamps = stamps;
    g->set.members = members;
    g->set.capacity = capacity;
    g->set.generation = 1;
    int64_t unused;
    for (size_t i = 0; i + 1 < size; i++)
        set_add(g, sample[i], &unused); /* distinct already */
    return 0;
}

static void set_clear(grouping *g)
{
    if (++g->set.generation == 0 && g->set.stamps) {
        memset(g->set.stamps, 0, g->set.capacity * sizeof *g->set.stamps);
        g->set.generation = 1;
    }
}

static int group_members(grouping *g, fl_tar_samples *s, fl_tar_error *error)
{
    const fl_tar_index *index = g->index;
    int64_t current = -1; /* the first member of the sample being grouped */
    size_t start = 0;
    for (size_t i = 0; i < index->count; i++) {
        const char *name = fl_tar_name(index, i);
        size_t length = name_length(index, i);
        int64_t key = fl_tar_is_meta(name, length) ? -1 : fl_tar_key_length(name, length);
        s->key_lengths[i] = key;
        if (key < 0)
            continue;
        if (current < 0 || key != s->key_lengths[current] ||
            memcmp(name, fl_tar_name(index, (size_t)current), (size_t)key) != 0) {
            current = (int64_t)i;
            start = s->n_members;
            s->starts[s->n_samples++] = (int64_t)start;
            set_clear(g);
        }
        const char *ext = name + key + 1;
        size_t ext_length = length - (size_t)key - 1;
        quoted q = quote(name, length);
        if (same_extension(ext, ext_length, "__key__", 7) ||
            same_extension(ext, ext_length, "__url__", 7))
            return fail(error, FL_ERR_DECODE, 0, index->data_offsets[i] - FL_TAR_BLOCK,
                        "member '%s': its extension names a field webdataset reserves "
                        "for every sample",
                        q.text);
        s->members[s->n_members++] = (int64_t)i;
        int64_t clash;
        if (set_reserve(g, s->n_members - start, s->members + start) < 0)
            return fail(error, FL_ERR_NOMEM, 0, -1, "out of memory grouping samples");
        if (set_add(g, (int64_t)i, &clash) < 0) {
            const char *other = fl_tar_name(index, (size_t)clash);
            quoted o = quote(other, strlen(other));
            return fail(error, FL_ERR_DECODE, 0, index->data_offsets[i] - FL_TAR_BLOCK,
                        "member '%s' repeats the extension of member '%s' in the same sample "
                        "(webdataset refuses duplicate file names in a sample)",
                        q.text, o.text);
        }
    }
    s->starts[s->n_samples] = (int64_t)s->n_members;
    return FL_OK;
}

int fl_tar_group(const fl_tar_index *index, fl_tar_samples *samples, fl_tar_error *error)
{
    error->err = 0;
    error->offset = -1;
    error->msg[0] = '\0';
    size_t n = index->count;
    if (n > SIZE_MAX / sizeof(int64_t) - 1)
        return fail(error, FL_ERR_NOMEM, 0, -1, "out of memory grouping samples");
    samples->key_lengths = malloc((n ? n : 1) * sizeof(int64_t));
    samples->members = malloc((n ? n : 1) * sizeof(int64_t));
    samples->starts = malloc((n + 1) * sizeof(int64_t));
    if (!samples->key_lengths || !samples->members || !samples->starts)
        return fail(error, FL_ERR_NOMEM, 0, -1, "out of memory grouping samples");
    grouping g = {.index = index, .samples = samples};
    int status = group_members(&g, samples, error);
    free(g.set.stamps);
    free(g.set.members);
    return status;
}
