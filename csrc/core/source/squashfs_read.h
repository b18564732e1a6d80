/* fastload core: files inside SquashFS images, read without mounting.
 *
 * A path "<image>:/<inner>" names the file or folder <inner> inside the
 * SquashFS image <image>, where <image> is an existing regular file whose
 * first four bytes are SquashFS's magic "hsqs".  Any other path (one with a
 * ':' whose left part is a folder, is missing, or is not an image) is an
 * ordinary path.  Of several ":/" in a path, the leftmost whose left part
 * is an image counts; images inside images are not looked into.
 *
 * Images are opened once per process, by libsquashfs (squashfs-tools-ng),
 * into a registry keyed by the image's path that lives until the process
 * ends; reads, lookups and listings then run in any number of threads at
 * once.  Each read borrows a reader (a decompressor with its directory and
 * data readers and their block caches: libsquashfs's objects are not safe
 * to share between threads) from the image's idle readers, creating one when
 * all are busy, and gives it back: as many readers as reads ever ran at
 * once.  The image's file descriptor is shared by them and read with pread
 * only, so a forked child reads on through it (forksafe.h).  An image
 * replaced on disk after it was opened is read as it was when opened (the
 * descriptor holds the old file) until the process ends.
 *
 * Built without libsquashfs (setup.py finds none), paths are still
 * recognised, and every call on one fails with "fastload was built without
 * SquashFS support" (FL_ERR_IO, ENOTSUP).
 *
 * Errors: FL_ERR_IO with *err an errno (ENOENT: no such inner path; EISDIR,
 * ENOTDIR; EIO: a damaged or truncated image, a block that does not
 * decompress; ENOTSUP: an unknown compressor) and a message that names the
 * image and the inner path; FL_ERR_TOO_BIG past max_bytes; FL_ERR_NOMEM.
 * Nothing here needs the GIL.
 */
#ifndef FL_SQUASHFS_READ_H
#define FL_SQUASHFS_READ_H

#include "core/source/file_read.h"

#include <stddef.h>
#include <stdint.h>

/* 1 when fastload was built with libsquashfs, else 0. */
int fl_sqfs_available(void);

/* The length of the image part of `path` when it names something inside a
 * SquashFS image (path[len] is the ':'), else 0.  An image already open costs
 * no system call; another candidate costs an open and a 4-byte read. */
size_t fl_sqfs_image_part(const char *path);

/* Reads `length` bytes at `offset` of the file inside an image (FL_TO_END:
 * to its end) into room(room_ctx, size), as fl_read_range does; image_len
 * is fl_sqfs_image_part(path).  More than max_bytes: FL_ERR_TOO_BIG. */
int fl_sqfs_read_range(const char *path, size_t image_len, uint64_t offset, uint64_t length,
                       size_t max_bytes, fl_room_fn room, void *room_ctx,
                       const unsigned char **data, size_t *size, int *err, char *msg,
                       size_t msg_size);

/* What an inner path is. */
enum { FL_SQFS_FILE = 1, FL_SQFS_DIR = 2, FL_SQFS_LINK = 3, FL_SQFS_OTHER = 4 };

typedef struct fl_sqfs_stat {
    int kind;      /* FL_SQFS_FILE, ... */
    uint32_t mode; /* permission bits and file type, as st_mode */
    uint64_t size; /* bytes of a file; 0 for the rest */
    int64_t mtime; /* seconds since the epoch (SquashFS keeps whole seconds) */
} fl_sqfs_stat;

/* What the inner path of `path` is.  Returns FL_OK or an error as above. */
int fl_sqfs_stat_path(const char *path, size_t image_len, fl_sqfs_stat *st, int *err, char *msg,
                      size_t msg_size);

/* A folder's entries in the image's order (SquashFS sorts them by name,
 * bytewise), without "." and "..". */
typedef struct fl_sqfs_listing {
    char *names;          /* NUL-terminated names back to back; owned, free()d by _free */
    size_t names_size;    /* bytes in names */
    unsigned char *kinds; /* per entry: FL_SQFS_FILE, ...; owned */
    size_t count;         /* entries */
} fl_sqfs_listing;

/* Lists the folder at the inner path of `path` into *out (zeroed first;
 * release with fl_sqfs_listing_free, also after a failure). */
int fl_sqfs_list(const char *path, size_t image_len, fl_sqfs_listing *out, int *err, char *msg,
                 size_t msg_size);
void fl_sqfs_listing_free(fl_sqfs_listing *listing);

#endif /* FL_SQUASHFS_READ_H */
