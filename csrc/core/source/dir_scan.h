/* fastload core: an image folder's tree listed in parallel, as torchvision's
 * ImageFolder lists it with sorted(os.walk(top, followlinks=True)).
 *
 * fl_dir_scan reads every folder under each top with getdents64 (readdir
 * elsewhere) on a few threads, following symbolic links: an entry is a
 * folder when d_type says so, or, for a link or DT_UNKNOWN, when stat()
 * says so; anything else (a broken link, a FIFO) is a file, as os.walk has
 * it.  Each folder (st_dev, st_ino) is read once however many paths reach
 * it.  Then, one top at a time, the walk is replayed in memory in os.walk's
 * order, with fastload's one rule beyond torchvision's: a folder reached
 * again within a top (a symlink loop, two links to one folder) is walked
 * once, at the path found first (children marked when their parent is
 * listed, in sorted order).  The result is each top's folders sorted by
 * path, each folder's files sorted, in Python's str order (code points, the
 * bytes decoded as UTF-8 with surrogateescape).
 *
 * The scan also gives the checks an index file keeps: every path at which
 * a folder was reached, with the folder's (dev, ino, mtime_ns, ctime_ns,
 * size) and a hash of its listing (names and which are folders).
 * fl_dir_check tells later whether those still hold.
 *
 * Nothing here takes the GIL or knows Python; the caller owns every output
 * and frees it with fl_dir_walk_free.
 */
#ifndef FL_DIR_SCAN_H
#define FL_DIR_SCAN_H

#include <stddef.h>
#include <stdint.h>

/* Fields of each check record, in this order. */
enum {
    FL_CHECK_DEV,
    FL_CHECK_INO,
    FL_CHECK_MTIME_NS,
    FL_CHECK_CTIME_NS,
    FL_CHECK_SIZE,
    FL_CHECK_HASH,  /* fl_dir_listing_hash of the folder's entries */
    FL_CHECK_RACY,  /* 1: changed too close to the scan for its times to tell */
    FL_CHECK_FIELDS
};

/* A walk: arrays, each owned by the struct when it came from fl_dir_scan
 * (views into someone else's memory otherwise, never freed then).  Paths
 * are relative to the prefix the scan was given, NUL-terminated, back to
 * back. */
typedef struct fl_dir_walk {
    size_t n_tops;
    int64_t *top_folders;    /* n_tops + 1: top t's folders are [top_folders[t], [t + 1]) */
    char *folder_paths;      /* each folder's path (the top's: the top itself) */
    size_t folder_paths_size;
    int64_t *folder_offsets; /* n_folders: where each path starts in folder_paths */
    size_t n_folders;
    int64_t *folder_files;   /* n_folders + 1: folder f's files are [folder_files[f], [f + 1]) */
    char *names;             /* file names, NUL-terminated, folder after folder, each
                                folder's sorted */
    size_t names_size;
    size_t n_names;
    /* The checks: every path a folder was reached at (kept or not). */
    char *check_paths;
    size_t check_paths_size;
    int64_t *check_offsets;  /* n_checks */
    int64_t *checks;         /* n_checks * FL_CHECK_FIELDS */
    size_t n_checks;
    int complete;            /* 1: every folder was read (nothing failed): fit for an index */
    size_t dirs_read;        /* folders read (each once) */
    int owned;               /* 1: the arrays are malloc'ed here and freed by fl_dir_walk_free */
} fl_dir_walk;

/* Lists the trees at prefix + tops[i] (prefix: "" or a path ending in '/';
 * tops: names, NUL-terminated) on `threads` threads (at least 1).  A
 * folder whose ctime_ns is at or after `racy_after_ns` is flagged racy in
 * its checks.  A top or folder that cannot be read lists nothing, as in
 * os.walk, and leaves out->complete 0.  Returns FL_OK, FL_ERR_NOMEM or
 * FL_ERR_THREAD (a message in msg); on error *out holds nothing to free. */
int fl_dir_scan(const char *prefix, const char *const *tops, size_t n_tops, int threads,
                int64_t racy_after_ns, fl_dir_walk *out, char *msg, size_t msg_size);

/* Frees what an owned walk holds and zeroes it. */
void fl_dir_walk_free(fl_dir_walk *walk);

/* Checks, on `threads` threads, that the folder at prefix + the i-th path
 * (paths/offsets as in a walk) still has the recorded checks[i * FL_CHECK_FIELDS..]:
 * the same (dev, ino, mtime_ns, ctime_ns, size); for a racy record, also
 * the same listing hash (the folder is read again).  Sets *changed to the
 * index of a record that no longer holds, or -1; *reread counts the folders
 * read.  Returns FL_OK, or FL_ERR_NOMEM / FL_ERR_THREAD (message in msg). */
int fl_dir_check(const char *prefix, const char *paths, const int64_t *offsets,
                 const int64_t *checks, size_t n, int threads, int64_t *changed, size_t *reread,
                 char *msg, size_t msg_size);

/* Checks that the arrays of `walk` hold together (ranges ascending inside
 * their arrays, offsets inside their blobs, blobs NUL-terminated, n_names
 * names) and sets *room to the bytes of all its paths, prefix (prefix_len
 * bytes) + folder + "/" + name + NUL.  Returns FL_OK or FL_ERR_INVALID. */
int fl_dir_samples_room(size_t prefix_len, const fl_dir_walk *walk, size_t *room, char *msg,
                        size_t msg_size);

/* A walk's samples (the walk checked by fl_dir_samples_room): for each top,
 * in order, prefix + folder + "/" + name of every file that passes the
 * filter, NUL-terminated, back to back into `out` (`room` bytes, as
 * fl_dir_samples_room counted), each path's start in offsets[] (room for
 * n_names).  `exts` (n_exts suffixes,
 * NULL for no filter): a file passes when the ASCII-lowercased path ends
 * with one of them.  Where Python's str.lower() could decide otherwise
 * (non-ASCII bytes near the end of the path), the file is kept and its
 * sample index listed in *undecided (malloc'ed: the caller frees it) for
 * the caller to decide.  Sets *out_size, *n_samples and counts[t] (samples
 * of top t).  Returns FL_OK, FL_ERR_NOMEM, or FL_ERR_INVALID when the names
 * blob holds fewer names than the folders list. */
int fl_dir_samples(const char *prefix, const fl_dir_walk *walk, const char *const *exts,
                   const size_t *ext_lens, size_t n_exts, char *out, size_t room, size_t *out_size,
                   int64_t *offsets, size_t *n_samples, int64_t *counts, int64_t **undecided,
                   size_t *n_undecided, char *msg, size_t msg_size);

/* A 64-bit checksum of size bytes: what an index file keeps of its body. */
uint64_t fl_dir_checksum(const void *data, size_t size);

/* Python's order of two fs-encoded names (str comparison after decoding
 * with UTF-8 and surrogateescape): <0, 0, >0. */
int fl_fsname_cmp(const char *a, const char *b);

#endif /* FL_DIR_SCAN_H */
