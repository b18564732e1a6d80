/* fastload core: files inside SquashFS images (see squashfs_read.h). */
#define _GNU_SOURCE
#include "core/source/squashfs_read.h"

#include "core/status.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ------------------------------------------------------- recognising paths */

/* Whether the file at `image` (a NUL-terminated path) is a regular file that
 * starts with SquashFS's magic.  O_NONBLOCK: a FIFO must not block open(). */
static int has_magic(const char *image)
{
    int fd = open(image, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0)
        return 0;
    struct stat st;
    unsigned char head[4];
    int yes = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
              pread(fd, head, sizeof head, 0) == (ssize_t)sizeof head &&
              memcmp(head, "hsqs", 4) == 0;
    close(fd);
    return yes;
}

/* Whether the first `len` bytes of path name an image already open. */
static int is_open_image(const char *path, size_t len);

size_t fl_sqfs_image_part(const char *path)
{
    char prefix[PATH_MAX];
    for (const char *at = strstr(path, ":/"); at; at = strstr(at + 1, ":/")) {
        size_t len = (size_t)(at - path);
        if (len == 0 || len >= sizeof prefix)
            continue;
        if (is_open_image(path, len))
            return len;
        memcpy(prefix, path, len);
        prefix[len] = '\0';
        if (has_magic(prefix))
            return len;
    }
    return 0;
}

#ifndef FL_HAVE_SQUASHFS

/* ------------------------------------------------- built without libsquashfs */

static int is_open_image(const char *path, size_t len)
{
    (void)path;
    (void)len;
    return 0;
}

int fl_sqfs_available(void)
{
    return 0;
}

static int unsupported(int *err, char *msg, size_t msg_size)
{
    *err = ENOTSUP;
    fl_set_msg(msg, msg_size, "fastload was built without SquashFS support (libsquashfs was "
               "not found when it was built)");
    return FL_ERR_IO;
}

int fl_sqfs_read_range(const char *path, size_t image_len, uint64_t offset, uint64_t length,
                       size_t max_bytes, fl_room_fn room, void *room_ctx,
                       const unsigned char **data, size_t *size, int *err, char *msg,
                       size_t msg_size)
{
    (void)path, (void)image_len, (void)offset, (void)length, (void)max_bytes, (void)room;
    (void)room_ctx, (void)data, (void)size;
    return unsupported(err, msg, msg_size);
}

int fl_sqfs_stat_path(const char *path, size_t image_len, fl_sqfs_stat *st, int *err, char *msg,
                      size_t msg_size)
{
    (void)path, (void)image_len, (void)st;
    return unsupported(err, msg, msg_size);
}

int fl_sqfs_list(const char *path, size_t image_len, fl_sqfs_listing *out, int *err, char *msg,
                 size_t msg_size)
{
    (void)path, (void)image_len;
    memset(out, 0, sizeof *out);
    return unsupported(err, msg, msg_size);
}

void fl_sqfs_listing_free(fl_sqfs_listing *listing)
{
    (void)listing;
}

#else /* FL_HAVE_SQUASHFS */

#include "core/engine/forksafe.h"

#include <pthread.h>
#include <sqfs/compressor.h>
#include <sqfs/data_reader.h>
#include <sqfs/dir.h>
#include <sqfs/dir_reader.h>
#include <sqfs/error.h>
#include <sqfs/inode.h>
#include <sqfs/io.h>
#include <sqfs/super.h>

int fl_sqfs_available(void)
{
    return 1;
}

/* ------------------------------------------------------------ the image file */

/* libsquashfs reads the image through this sqfs_file_t: pread on one
 * descriptor, so every reader of the image shares it, from any thread, and a
 * forked child reads on without a shared file offset.  It is never written,
 * copied or destroyed through libsquashfs (the registry owns it). */
typedef struct image_file {
    sqfs_file_t base; /* first: libsquashfs sees a sqfs_file_t */
    int fd;           /* O_RDONLY | O_CLOEXEC; owned */
    uint64_t size;    /* bytes in the image when it was opened */
} image_file;

static int image_read_at(sqfs_file_t *file, sqfs_u64 offset, void *buffer, size_t size)
{
    image_file *f = (image_file *)file;
    /* A truncated image: what lies past its end is out of bounds. */
    if (offset > f->size || size > f->size - offset)
        return SQFS_ERROR_OUT_OF_BOUNDS;
    size_t done = 0;
    while (done < size) {
        ssize_t got = pread(f->fd, (char *)buffer + done, size - done, (off_t)(offset + done));
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            return got < 0 ? SQFS_ERROR_IO : SQFS_ERROR_OUT_OF_BOUNDS;
        done += (size_t)got;
    }
    return 0;
}

static int image_write_at(sqfs_file_t *file, sqfs_u64 offset, const void *buffer, size_t size)
{
    (void)file, (void)offset, (void)buffer, (void)size;
    return SQFS_ERROR_UNSUPPORTED;
}

static sqfs_u64 image_get_size(const sqfs_file_t *file)
{
    return ((const image_file *)file)->size;
}

static int image_truncate(sqfs_file_t *file, sqfs_u64 size)
{
    (void)file, (void)size;
    return SQFS_ERROR_UNSUPPORTED;
}

/* ------------------------------------------------------------- the registry */

/* One thread's tools for reading an image: libsquashfs's decompressor (with
 * its own decompression state), and the directory and data readers that use
 * it, each with its block cache.  Used by one thread at a time. */
typedef struct reader {
    sqfs_compressor_t *cmp;   /* owned */
    sqfs_dir_reader_t *dir;   /* owned */
    sqfs_data_reader_t *data; /* owned */
    struct reader *next;      /* the idle list; guarded by registry_lock */
} reader;

/* A folder's inode, found once: a lookup then starts from the folder
 * instead of walking from the root (each step of a walk decompresses a
 * metadata block or two: some 60 us a folder). */
typedef struct dir_entry {
    char *path;                   /* the inner path, owned */
    size_t len;
    sqfs_inode_generic_t *inode;  /* owned; never changed or freed once linked */
    struct dir_entry *next;       /* the bucket's chain */
} dir_entry;

#define DIR_BUCKETS 4096
#define DIR_MAX ((size_t)1 << 20) /* folders remembered per image, at most */

typedef struct image {
    char *path;        /* owned; the key */
    size_t path_len;
    image_file file;   /* the shared descriptor */
    sqfs_super_t super;
    reader *idle;      /* readers not in use; guarded by registry_lock */
    dir_entry **dirs;  /* DIR_BUCKETS chains, allocated on first use; guarded by registry_lock */
    size_t n_dirs;     /* guarded by registry_lock */
    struct image *next; /* registry links; guarded by registry_lock */
} image;

/* The open images (never closed: a process reads a handful of images, and a
 * thread may hold one's reader at any time).  registry_lock guards the list
 * and every image's idle list; it is held only to link or unlink, never
 * around I/O or decompression, and is registered with forksafe so a forked
 * child finds it unlocked.  A reader in use in another thread at fork() is
 * not on an idle list in the child: lost, not shared. */
static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static image *registry;
static fl__fork_entry fork_entry = {&registry_lock, NULL, NULL, NULL, NULL};
static pthread_once_t fork_once = PTHREAD_ONCE_INIT;

static void register_fork(void)
{
    /* Failing, fork() may copy the lock held: the loader's process workers
     * would notice as a hang, so say nothing here and let forksafe's other
     * users fail first (they check); there is no caller to report to. */
    (void)fl__fork_register(&fork_entry);
}

static image *find_image(const char *path, size_t len)
{
    for (image *img = registry; img; img = img->next)
        if (img->path_len == len && memcmp(img->path, path, len) == 0)
            return img;
    return NULL;
}

static int is_open_image(const char *path, size_t len)
{
    /* Registered before its first use: a fork must never copy it locked. */
    pthread_once(&fork_once, register_fork);
    pthread_mutex_lock(&registry_lock);
    int yes = find_image(path, len) != NULL;
    pthread_mutex_unlock(&registry_lock);
    return yes;
}

/* ------------------------------------------------------------------ errors */

/* libsquashfs's error as an errno and words. */
static int sqfs_errno(int code)
{
    switch (code) {
    case SQFS_ERROR_ALLOC: return ENOMEM;
    case SQFS_ERROR_NO_ENTRY: return ENOENT;
    case SQFS_ERROR_NOT_DIR: return ENOTDIR;
    case SQFS_ERROR_NOT_FILE: return EISDIR;
    case SQFS_ERROR_UNSUPPORTED: return ENOTSUP;
    case SQFS_ERROR_LINK_LOOP: return ELOOP;
    default: return EIO;
    }
}

static const char *sqfs_words(int code)
{
    switch (code) {
    case SQFS_ERROR_ALLOC: return "out of memory";
    case SQFS_ERROR_IO: return "the image could not be read";
    case SQFS_ERROR_COMPRESSOR: return "a compressed block of the image does not decompress: "
                                       "the image is damaged";
    case SQFS_ERROR_INTERNAL: return "libsquashfs failed";
    case SQFS_ERROR_CORRUPTED: return "the image is damaged";
    case SQFS_ERROR_UNSUPPORTED: return "the image uses a feature libsquashfs does not support";
    case SQFS_ERROR_OVERFLOW: return "the image is damaged (a size overflows)";
    case SQFS_ERROR_OUT_OF_BOUNDS: return "the image is damaged or truncated (a read past its "
                                          "end)";
    case SQFS_ERROR_SUPER_BLOCK_SIZE: return "the superblock's block size is invalid";
    case SQFS_ERROR_NOT_DIR: return "not a directory";
    case SQFS_ERROR_NO_ENTRY: return "no such file or directory in the image";
    case SQFS_ERROR_LINK_LOOP: return "a loop of links";
    case SQFS_ERROR_NOT_FILE: return "not a regular file";
    default: return "libsquashfs failed";
    }
}

/* "SquashFS image '<image>', '<inner>': <what>" into msg; returns FL_ERR_IO
 * (FL_ERR_NOMEM for an allocation) with *err set. */
static int fail(const char *path, size_t image_len, int code, const char *what, int *err,
                char *msg, size_t msg_size)
{
    *err = sqfs_errno(code);
    fl_set_msg(msg, msg_size, "SquashFS image '%.*s', '%s': %s", (int)image_len, path,
               path + image_len + 1, what ? what : sqfs_words(code));
    return code == SQFS_ERROR_ALLOC ? FL_ERR_NOMEM : FL_ERR_IO;
}

/* ----------------------------------------------------------- opening images */

static void free_reader(reader *r)
{
    if (!r)
        return;
    if (r->data)
        sqfs_destroy(r->data);
    if (r->dir)
        sqfs_destroy(r->dir);
    if (r->cmp)
        sqfs_destroy(r->cmp);
    free(r);
}

/* A new reader of `img`, or NULL with *code set. */
static reader *new_reader(image *img, int *code)
{
    sqfs_compressor_config_t cfg;
    reader *r = calloc(1, sizeof *r);
    if (!r) {
        *code = SQFS_ERROR_ALLOC;
        return NULL;
    }
    int rc = sqfs_compressor_config_init(&cfg, (SQFS_COMPRESSOR)img->super.compression_id,
                                         img->super.block_size, SQFS_COMP_FLAG_UNCOMPRESS);
    if (rc == 0)
        rc = sqfs_compressor_create(&cfg, &r->cmp);
    /* The options matter for compressing only, but must parse. */
    if (rc == 0 && (img->super.flags & SQFS_FLAG_COMPRESSOR_OPTIONS))
        rc = r->cmp->read_options(r->cmp, &img->file.base);
    if (rc == 0) {
        r->dir = sqfs_dir_reader_create(&img->super, r->cmp, &img->file.base, 0);
        r->data = sqfs_data_reader_create(&img->file.base, img->super.block_size, r->cmp, 0);
        if (!r->dir || !r->data)
            rc = SQFS_ERROR_ALLOC;
    }
    if (rc == 0)
        rc = sqfs_data_reader_load_fragment_table(r->data, &img->super);
    if (rc != 0) {
        free_reader(r);
        *code = rc;
        return NULL;
    }
    return r;
}

static void free_image(image *img)
{
    if (!img)
        return;
    while (img->idle) {
        reader *r = img->idle;
        img->idle = r->next;
        free_reader(r);
    }
    if (img->dirs) {
        for (size_t b = 0; b < DIR_BUCKETS; b++)
            while (img->dirs[b]) {
                dir_entry *e = img->dirs[b];
                img->dirs[b] = e->next;
                free(e->inode);
                free(e->path);
                free(e);
            }
        free(img->dirs);
    }
    if (img->file.fd >= 0)
        close(img->file.fd);
    free(img->path);
    free(img);
}

/* Opens the image named by path[0, len): its superblock checked, one reader
 * made (which proves the compressor and the fragment table).  Returns it,
 * or NULL with the error in msg. */
static image *open_image(const char *path, size_t len, int *status, int *err, char *msg,
                         size_t msg_size)
{
    const char *what = NULL;
    int code = 0;
    struct stat st;
    image *img = calloc(1, sizeof *img);
    if (!img || !(img->path = strndup(path, len))) {
        free(img);
        *status = fail(path, len, SQFS_ERROR_ALLOC, NULL, err, msg, msg_size);
        return NULL;
    }
    img->path_len = len;
    img->file.fd = open(img->path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (img->file.fd < 0 || fstat(img->file.fd, &st) != 0) {
        *err = errno;
        fl_set_msg(msg, msg_size, "SquashFS image '%s': %s", img->path, strerror(errno));
        *status = FL_ERR_IO;
        free_image(img);
        return NULL;
    }
    img->file.size = (uint64_t)st.st_size;
    img->file.base.read_at = image_read_at;
    img->file.base.write_at = image_write_at;
    img->file.base.get_size = image_get_size;
    img->file.base.truncate = image_truncate;
    code = sqfs_super_read(&img->super, &img->file.base);
    if (code == SQFS_ERROR_OUT_OF_BOUNDS)
        what = "the image is truncated: shorter than its superblock";
    else if (code == SQFS_ERROR_CORRUPTED || code == SQFS_ERROR_SUPER_BLOCK_SIZE)
        what = "the superblock is damaged";
    else if (code == SQFS_ERROR_UNSUPPORTED)
        what = "the superblock names a SquashFS version other than 4.0";
    if (code == 0 && img->super.bytes_used > img->file.size) {
        code = SQFS_ERROR_OUT_OF_BOUNDS;
        what = "the image is truncated: shorter than its superblock says";
    }
    if (code == 0) {
        reader *r = new_reader(img, &code);
        if (r)
            img->idle = r;
        else if (code == SQFS_ERROR_UNSUPPORTED)
            what = "the image's compressor is not supported by this libsquashfs";
    }
    if (code != 0) {
        *err = sqfs_errno(code);
        fl_set_msg(msg, msg_size, "SquashFS image '%s': %s", img->path,
                   what ? what : sqfs_words(code));
        *status = code == SQFS_ERROR_ALLOC ? FL_ERR_NOMEM : FL_ERR_IO;
        free_image(img);
        return NULL;
    }
    return img;
}

/* A reader of the image at path[0, image_len), opened on first use: the
 * caller gives it back with give_back.  NULL with the error set. */
static reader *borrow(const char *path, size_t image_len, image **out, int *status, int *err,
                      char *msg, size_t msg_size)
{
    pthread_once(&fork_once, register_fork);
    pthread_mutex_lock(&registry_lock);
    image *img = find_image(path, image_len);
    reader *r = NULL;
    if (img && img->idle) {
        r = img->idle;
        img->idle = r->next;
    }
    pthread_mutex_unlock(&registry_lock);
    if (!img) {
        /* Opened outside the lock; when two threads race, one image stays. */
        image *opened = open_image(path, image_len, status, err, msg, msg_size);
        if (!opened)
            return NULL;
        pthread_mutex_lock(&registry_lock);
        img = find_image(path, image_len);
        if (!img) {
            img = opened;
            img->next = registry;
            registry = img;
            opened = NULL;
        }
        if (img->idle) {
            r = img->idle;
            img->idle = r->next;
        }
        pthread_mutex_unlock(&registry_lock);
        free_image(opened);
    }
    if (!r) {
        int code = 0;
        /* img is never freed once registered: safe to use unlocked. */
        r = new_reader(img, &code);
        if (!r) {
            *status = fail(path, image_len, code, NULL, err, msg, msg_size);
            return NULL;
        }
    }
    r->next = NULL;
    *out = img;
    return r;
}

static void give_back(image *img, reader *r)
{
    pthread_mutex_lock(&registry_lock);
    r->next = img->idle;
    img->idle = r;
    pthread_mutex_unlock(&registry_lock);
}

/* --------------------------------------------------------------- reading */

static int kind_of(const sqfs_inode_generic_t *inode)
{
    switch (inode->base.type) {
    case SQFS_INODE_FILE:
    case SQFS_INODE_EXT_FILE: return FL_SQFS_FILE;
    case SQFS_INODE_DIR:
    case SQFS_INODE_EXT_DIR: return FL_SQFS_DIR;
    case SQFS_INODE_SLINK:
    case SQFS_INODE_EXT_SLINK: return FL_SQFS_LINK;
    default: return FL_SQFS_OTHER;
    }
}

static size_t dir_hash(const char *s, size_t len)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < len; i++)
        h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return (size_t)(h % DIR_BUCKETS);
}

/* The remembered inode of folder dir[0, len), or NULL.  Locks. */
static const sqfs_inode_generic_t *dir_get(image *img, const char *dir, size_t len)
{
    const sqfs_inode_generic_t *found = NULL;
    pthread_mutex_lock(&registry_lock);
    if (img->dirs)
        for (dir_entry *e = img->dirs[dir_hash(dir, len)]; e; e = e->next)
            if (e->len == len && memcmp(e->path, dir, len) == 0) {
                found = e->inode;
                break;
            }
    pthread_mutex_unlock(&registry_lock);
    return found;
}

/* Remembers folder dir[0, len) at *inode (taken: the caller keeps using
 * *inode, which may be replaced by the one already remembered, and must not
 * free it).  Returns 0, or -1 when it could not be remembered (*inode is
 * then still the caller's to free). */
static int dir_put(image *img, const char *dir, size_t len, sqfs_inode_generic_t **inode)
{
    dir_entry *e = malloc(sizeof *e);
    char *copy = e ? strndup(dir, len) : NULL;
    if (!copy) {
        free(e);
        return -1;
    }
    int rc = 0;
    pthread_mutex_lock(&registry_lock);
    if (!img->dirs)
        img->dirs = calloc(DIR_BUCKETS, sizeof *img->dirs);
    size_t b = dir_hash(dir, len);
    dir_entry *had = NULL;
    if (img->dirs)
        for (had = img->dirs[b]; had; had = had->next)
            if (had->len == len && memcmp(had->path, dir, len) == 0)
                break;
    if (!img->dirs || (!had && img->n_dirs >= DIR_MAX)) {
        rc = -1;
    } else if (had) {
        /* Another thread remembered it first: use that one. */
        free(*inode);
        *inode = had->inode;
    } else {
        *e = (dir_entry){copy, len, *inode, img->dirs[b]};
        img->dirs[b] = e;
        img->n_dirs++;
        e = NULL;
        copy = NULL;
    }
    pthread_mutex_unlock(&registry_lock);
    free(copy);
    free(e);
    return rc;
}

/* The inode at the inner path (path + image_len + 1), found with r: from
 * its folder's remembered inode when the path has a folder part.  *inode is
 * the caller's to free. */
static int lookup(image *img, reader *r, const char *path, size_t image_len,
                  sqfs_inode_generic_t **inode, int *err, char *msg, size_t msg_size)
{
    const char *inner = path + image_len + 1;
    const char *slash = strrchr(inner, '/');
    int code;
    *inode = NULL;
    if (!slash || slash == inner || slash[1] == '\0') {
        /* At the root, or a path ending in '/': walk it. */
        code = sqfs_dir_reader_find_by_path(r->dir, NULL, inner, inode);
    } else {
        size_t len = (size_t)(slash - inner);
        const sqfs_inode_generic_t *dir = dir_get(img, inner, len);
        if (!dir) {
            char *folder = strndup(inner, len);
            sqfs_inode_generic_t *found = NULL;
            code = folder ? sqfs_dir_reader_find_by_path(r->dir, NULL, folder, &found)
                          : SQFS_ERROR_ALLOC;
            free(folder);
            if (code == 0 && kind_of(found) != FL_SQFS_DIR)
                code = SQFS_ERROR_NOT_DIR;
            if (code != 0) {
                free(found);
                return fail(path, image_len, code, NULL, err, msg, msg_size);
            }
            if (dir_put(img, inner, len, &found) != 0) {
                /* Not remembered: walk from it this once. */
                code = sqfs_dir_reader_find_by_path(r->dir, found, slash + 1, inode);
                free(found);
                goto done;
            }
            dir = found;
        }
        code = sqfs_dir_reader_find_by_path(r->dir, dir, slash + 1, inode);
    }
done:
    if (code != 0) {
        free(*inode);
        *inode = NULL;
        return fail(path, image_len, code, NULL, err, msg, msg_size);
    }
    return FL_OK;
}

int fl_sqfs_read_range(const char *path, size_t image_len, uint64_t offset, uint64_t length,
                       size_t max_bytes, fl_room_fn room, void *room_ctx,
                       const unsigned char **data, size_t *size, int *err, char *msg,
                       size_t msg_size)
{
    image *img = NULL;
    sqfs_inode_generic_t *inode = NULL; /* ours: free()d at out */
    int status = FL_ERR_IO;
    *err = 0;
    reader *r = borrow(path, image_len, &img, &status, err, msg, msg_size);
    if (!r)
        return status;
    status = lookup(img, r, path, image_len, &inode, err, msg, msg_size);
    if (status != FL_OK)
        goto out;
    if (kind_of(inode) != FL_SQFS_FILE) {
        status = fail(path, image_len, kind_of(inode) == FL_SQFS_DIR ? SQFS_ERROR_NOT_FILE
                                                                     : SQFS_ERROR_ARG_INVALID,
                      kind_of(inode) == FL_SQFS_DIR ? "not a regular file (a directory)"
                                                    : "not a regular file",
                      err, msg, msg_size);
        if (kind_of(inode) != FL_SQFS_DIR)
            *err = EINVAL;
        goto out;
    }
    sqfs_u64 file_size = 0;
    sqfs_inode_get_file_size(inode, &file_size);
    if (length == FL_TO_END) {
        if (offset > file_size) {
            status = fail(path, image_len, SQFS_ERROR_IO, "the offset lies past the end of the "
                          "file", err, msg, msg_size);
            goto out;
        }
        length = file_size - offset;
    } else if (offset > file_size || length > file_size - offset) {
        char what[160];
        snprintf(what, sizeof what, "bytes %llu-%llu lie past the end of the file (%llu bytes)",
                 (unsigned long long)offset, (unsigned long long)(offset + length),
                 (unsigned long long)file_size);
        status = fail(path, image_len, SQFS_ERROR_IO, what, err, msg, msg_size);
        goto out;
    }
    if (length > max_bytes) {
        status = FL_ERR_TOO_BIG;
        fl_set_msg(msg, msg_size, "SquashFS image '%.*s', '%s': %llu bytes are too many",
                   (int)image_len, path, path + image_len + 1, (unsigned long long)length);
        goto out;
    }
    size_t want = (size_t)length;
    unsigned char *buf = room(room_ctx, want);
    if (!buf) {
        status = FL_ERR_NOMEM;
        fl_set_msg(msg, msg_size, "cannot allocate %zu bytes to read the file", want);
        goto out;
    }
    /* sqfs_data_reader_read takes at most 2^31 - 1 bytes a call. */
    size_t done = 0;
    while (done < want) {
        size_t chunk = want - done < ((size_t)1 << 30) ? want - done : ((size_t)1 << 30);
        sqfs_s32 got = sqfs_data_reader_read(r->data, inode, offset + done, buf + done,
                                             (sqfs_u32)chunk);
        if (got < 0) {
            status = fail(path, image_len, got, NULL, err, msg, msg_size);
            goto out;
        }
        if (got == 0)
            break;
        done += (size_t)got;
    }
    *data = buf;
    *size = done;
    status = FL_OK;
out:
    free(inode);
    give_back(img, r);
    return status;
}

int fl_sqfs_stat_path(const char *path, size_t image_len, fl_sqfs_stat *st, int *err, char *msg,
                      size_t msg_size)
{
    image *img = NULL;
    sqfs_inode_generic_t *inode = NULL;
    int status = FL_ERR_IO;
    *err = 0;
    memset(st, 0, sizeof *st);
    reader *r = borrow(path, image_len, &img, &status, err, msg, msg_size);
    if (!r)
        return status;
    status = lookup(img, r, path, image_len, &inode, err, msg, msg_size);
    if (status == FL_OK) {
        sqfs_u64 file_size = 0;
        st->kind = kind_of(inode);
        if (st->kind == FL_SQFS_FILE)
            sqfs_inode_get_file_size(inode, &file_size);
        st->size = file_size;
        st->mode = inode->base.mode;
        st->mtime = (int64_t)inode->base.mod_time;
    }
    free(inode);
    give_back(img, r);
    return status;
}

void fl_sqfs_listing_free(fl_sqfs_listing *listing)
{
    free(listing->names);
    free(listing->kinds);
    memset(listing, 0, sizeof *listing);
}

/* Appends an entry; 0, or -1 out of memory. */
static int add_entry(fl_sqfs_listing *out, size_t *names_cap, size_t *kinds_cap,
                     const char *name, size_t len, int kind)
{
    if (out->names_size + len + 1 > *names_cap) {
        size_t cap = *names_cap ? *names_cap : 1024;
        while (cap < out->names_size + len + 1)
            cap *= 2;
        char *names = realloc(out->names, cap);
        if (!names)
            return -1;
        out->names = names;
        *names_cap = cap;
    }
    if (out->count == *kinds_cap) {
        size_t cap = *kinds_cap ? *kinds_cap * 2 : 64;
        unsigned char *kinds = realloc(out->kinds, cap);
        if (!kinds)
            return -1;
        out->kinds = kinds;
        *kinds_cap = cap;
    }
    memcpy(out->names + out->names_size, name, len);
    out->names[out->names_size + len] = '\0';
    out->names_size += len + 1;
    out->kinds[out->count++] = (unsigned char)kind;
    return 0;
}

int fl_sqfs_list(const char *path, size_t image_len, fl_sqfs_listing *out, int *err, char *msg,
                 size_t msg_size)
{
    image *img = NULL;
    sqfs_inode_generic_t *inode = NULL;
    sqfs_dir_entry_t *entry = NULL;
    size_t names_cap = 0, kinds_cap = 0;
    int status = FL_ERR_IO, code;
    *err = 0;
    memset(out, 0, sizeof *out);
    reader *r = borrow(path, image_len, &img, &status, err, msg, msg_size);
    if (!r)
        return status;
    status = lookup(img, r, path, image_len, &inode, err, msg, msg_size);
    if (status != FL_OK)
        goto out;
    if (kind_of(inode) != FL_SQFS_DIR) {
        status = fail(path, image_len, SQFS_ERROR_NOT_DIR, NULL, err, msg, msg_size);
        goto out;
    }
    code = sqfs_dir_reader_open_dir(r->dir, inode, 0);
    while (code == 0 && (code = sqfs_dir_reader_read(r->dir, &entry)) == 0) {
        int kind = entry->type == SQFS_INODE_FILE || entry->type == SQFS_INODE_EXT_FILE
                       ? FL_SQFS_FILE
                   : entry->type == SQFS_INODE_DIR || entry->type == SQFS_INODE_EXT_DIR
                       ? FL_SQFS_DIR
                   : entry->type == SQFS_INODE_SLINK || entry->type == SQFS_INODE_EXT_SLINK
                       ? FL_SQFS_LINK
                       : FL_SQFS_OTHER;
        /* The name is entry->size + 1 bytes, not promised NUL-terminated. */
        size_t len = strnlen((const char *)entry->name, (size_t)entry->size + 1);
        if (add_entry(out, &names_cap, &kinds_cap, (const char *)entry->name, len, kind) != 0)
            code = SQFS_ERROR_ALLOC;
        free(entry);
        entry = NULL;
    }
    if (code < 0) {
        status = fail(path, image_len, code, NULL, err, msg, msg_size);
        fl_sqfs_listing_free(out);
        goto out;
    }
    status = FL_OK;
out:
    free(inode);
    give_back(img, r);
    return status;
}

#endif /* FL_HAVE_SQUASHFS */
