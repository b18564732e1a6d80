/* fastload core: the index of a tar file's regular members, and their
 * grouping into WebDataset samples.
 *
 * Reading.  Headers are read through a window of large sequential pread()s
 * (FL_TAR_WINDOW bytes; a smaller read after skipping a large member), never
 * a system call per 512-byte block; member data is never read.  Accepted:
 * ustar names (prefix + "/" + name), GNU long names ('L'; long links 'K' are
 * skipped), pax extended headers ('x', and Solaris 'X': path= and size=
 * override the next member; global 'g' headers are skipped), v7, ustar and
 * old-GNU magic alike (the magic is not checked, as in Python's tarfile; the
 * ustar prefix is not read from old-GNU headers, whose bytes there are
 * times), octal and base-256 numbers.  Directories, links, devices and FIFOs
 * are skipped; headers of unknown types are skipped with their data, as
 * tarfile does.  GNU sparse members are refused.
 *
 * Validation.  Every header's checksum (the unsigned or the signed sum, as
 * tarfile accepts); every member's data lying inside the file; names of
 * regular members (refused when empty, absolute, holding a ".." component or
 * a NUL byte); extended headers at most FL_TAR_MAX_EXTENDED bytes.  The
 * archive ends at a zero block (what follows is ignored) or at the end of the
 * file on a block boundary; unlike tarfile, a damaged header after the first
 * is an error rather than a silent end.
 *
 * Memory.  The index is grown geometrically; every member takes a header
 * block of the file and a name no longer than the bytes it came from, so the
 * index never grows past a small multiple of the file's size.
 *
 * Nothing here is shared: one index per call, any number of calls at once.
 */
#ifndef FL_TAR_H
#define FL_TAR_H

#include <stddef.h>
#include <stdint.h>

#define FL_TAR_BLOCK 512
#define FL_TAR_WINDOW (1u << 20)          /* bytes a sequential read asks for */
#define FL_TAR_MAX_EXTENDED (1u << 20)    /* longest GNU long name or pax header */
#define FL_TAR_MSG_SIZE 512

/* The regular members of a tar file, in archive order.  All memory is owned
 * by the index and released by fl_tar_index_free. */
typedef struct fl_tar_index {
    char *names;            /* NUL-terminated names back to back */
    size_t names_size;      /* bytes of `names` in use */
    size_t names_capacity;
    int64_t *name_offsets;  /* where member i's name starts in `names` */
    int64_t *data_offsets;  /* byte offset of member i's data in the file */
    int64_t *sizes;         /* bytes of member i's data */
    size_t count;           /* members */
    size_t capacity;        /* entries allocated in each per-member array */
} fl_tar_index;

/* Why a read failed. */
typedef struct fl_tar_error {
    int err;                /* errno for FL_ERR_IO (0 when none applies), else 0 */
    int64_t offset;         /* file offset of the header or data concerned; -1 if none */
    char msg[FL_TAR_MSG_SIZE]; /* names the member (when known), offset and fault */
} fl_tar_error;

void fl_tar_index_init(fl_tar_index *index);
void fl_tar_index_free(fl_tar_index *index);

static inline const char *fl_tar_name(const fl_tar_index *index, size_t i)
{
    return index->names + index->name_offsets[i];
}

/* Indexes the tar file open on `fd` (a regular file, read with pread from
 * offset 0; the descriptor's position is left alone).  `window` is the read
 * size in bytes, rounded up to a whole block; 0 means FL_TAR_WINDOW.
 * `index` must be freshly initialised; on failure it holds the members read
 * so far and must still be freed.
 * Returns FL_OK; FL_ERR_IO (reading failed, or the file is not a regular
 * file); FL_ERR_DECODE (not a tar archive, a bad header, a truncated or
 * refused member); FL_ERR_TOO_BIG (an extended header over
 * FL_TAR_MAX_EXTENDED); FL_ERR_NOMEM.  `error` says what and where. */
int fl_tar_index_fd(int fd, size_t window, fl_tar_index *index, fl_tar_error *error);

/* The same for a tar file held in memory (`size` bytes at `data`). */
int fl_tar_index_memory(const void *data, size_t size, fl_tar_index *index, fl_tar_error *error);

/* ------------------------------------------------------------ WebDataset
 *
 * Grouping as the `webdataset` package (1.0.2) does it: members named like
 * "__name__" or "__name__/..." are metadata and skipped; a member's key is
 * its name up to the first "." of its last path component and its extension
 * the rest ("a/b.c.jpg": key "a/b", extension "c.jpg"), as base_plus_ext's
 * regular expression splits it; a member with no such split is skipped;
 * consecutive members (skipped ones aside) with the same key form one
 * sample.  Two members of a sample with the same extension, compared without
 * ASCII case (webdataset lower-cases extensions), or an extension "__key__"
 * or "__url__" (fields webdataset reserves), are an error. */

typedef struct fl_tar_samples {
    int64_t *key_lengths;   /* per member: bytes of its key; -1 if in no sample */
    int64_t *members;       /* the members in samples, sample after sample */
    int64_t *starts;        /* sample s is members[starts[s] .. starts[s + 1]) */
    size_t n_samples;
    size_t n_members;       /* entries used in `members` (= starts[n_samples]) */
} fl_tar_samples;

void fl_tar_samples_init(fl_tar_samples *samples);
void fl_tar_samples_free(fl_tar_samples *samples);

/* Bytes of the key of `name` (`length` bytes) as webdataset's base_plus_ext
 * splits it (the extension starts at name + key length + 1), or -1 when it
 * has none. */
int64_t fl_tar_key_length(const char *name, size_t length);

/* Whether webdataset skips `name` as metadata. */
int fl_tar_is_meta(const char *name, size_t length);

/* Groups the members of `index` into samples.  `samples` must be freshly
 * initialised, and freed after, whatever the result.  Returns FL_OK,
 * FL_ERR_DECODE (a duplicate or reserved extension; `error` names the
 * member) or FL_ERR_NOMEM. */
int fl_tar_group(const fl_tar_index *index, fl_tar_samples *samples, fl_tar_error *error);

#endif /* FL_TAR_H */
