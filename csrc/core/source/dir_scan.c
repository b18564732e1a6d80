/* fastload core: an image folder's tree listed in parallel (dir_scan.h).
 *
 * Reading: each folder is a node, one per (st_dev, st_ino), kept in the
 * order found; the nodes not yet read are the queue (next..n_nodes), so
 * nothing is queued twice and the threads stop when the queue is empty and
 * no thread is reading (a read may add nodes).  A folder is opened, fstat'ed
 * (its times recorded before its entries are read, so a change during the
 * read leaves a later time than the one recorded), read with getdents64,
 * and its entries sorted, all without the lock; the lock is taken once a
 * folder, to find or add its sub-folders' nodes.
 *
 * Walking: once everything is read, each top's walk is replayed on one
 * thread from the nodes, as os.walk would have listed it: no file-system
 * call, so the threads' order of reading cannot change the result.
 */
#define _GNU_SOURCE
#include "core/source/dir_scan.h"

#include "core/status.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#ifdef __linux__
#include <sys/syscall.h>
#endif

#define READ_BUFFER (256 * 1024) /* getdents64 room: fewer calls on network file systems */
#define MAX_THREADS 64

/* ------------------------------------------------------------ small buffers */

typedef struct bytes {
    char *p;
    size_t len, cap;
} bytes;

typedef struct ints {
    int64_t *p;
    size_t len, cap;
} ints;

static int bytes_reserve(bytes *b, size_t more)
{
    if (b->cap - b->len >= more)
        return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap - b->len < more) {
        if (cap > SIZE_MAX / 2)
            return -1;
        cap *= 2;
    }
    char *p = realloc(b->p, cap);
    if (!p)
        return -1;
    b->p = p;
    b->cap = cap;
    return 0;
}

/* Appends s (n bytes) and a NUL. */
static int bytes_put(bytes *b, const char *s, size_t n)
{
    if (n == SIZE_MAX || bytes_reserve(b, n + 1) < 0)
        return -1;
    memcpy(b->p + b->len, s, n);
    b->p[b->len + n] = '\0';
    b->len += n + 1;
    return 0;
}

/* Appends the string at b->p + at, '/', name and a NUL; *start gets its offset. */
static int bytes_join(bytes *b, size_t at, const char *name, size_t *start)
{
    size_t head = strlen(b->p + at), tail = strlen(name);
    if (bytes_reserve(b, head + tail + 2) < 0)
        return -1;
    char *out = b->p + b->len; /* after the reserve: b->p may have moved */
    memcpy(out, b->p + at, head);
    out[head] = '/';
    memcpy(out + head + 1, name, tail + 1);
    *start = b->len;
    b->len += head + tail + 2;
    return 0;
}

static int ints_put(ints *v, int64_t x)
{
    if (v->len == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 64;
        if (cap > SIZE_MAX / sizeof(int64_t))
            return -1;
        int64_t *p = realloc(v->p, cap * sizeof(int64_t));
        if (!p)
            return -1;
        v->p = p;
        v->cap = cap;
    }
    v->p[v->len++] = x;
    return 0;
}

/* ------------------------------------------------------ Python's str order */

/* The code point at *p (a NUL-terminated fs-encoded name), as Python's
 * UTF-8 decoder with surrogateescape gives it: a byte that starts no valid
 * sequence is U+DC00 + byte.  Advances *p. */
static uint32_t next_code_point(const unsigned char **p)
{
    const unsigned char *s = *p;
    unsigned b0 = s[0];
    if (b0 < 0x80) {
        *p = s + 1;
        return b0;
    }
    unsigned lo = 0x80, hi = 0xBF; /* range of the second byte */
    size_t n;
    uint32_t cp;
    if (b0 >= 0xC2 && b0 <= 0xDF) {
        n = 2, cp = b0 & 0x1F;
    } else if (b0 >= 0xE0 && b0 <= 0xEF) {
        n = 3, cp = b0 & 0x0F;
        if (b0 == 0xE0)
            lo = 0xA0;
        else if (b0 == 0xED)
            hi = 0x9F; /* no encoded surrogates */
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
        n = 4, cp = b0 & 0x07;
        if (b0 == 0xF0)
            lo = 0x90;
        else if (b0 == 0xF4)
            hi = 0x8F;
    } else {
        *p = s + 1;
        return 0xDC00 + b0;
    }
    for (size_t i = 1; i < n; i++) {
        unsigned c = s[i];
        if (c < (i == 1 ? lo : 0x80) || c > (i == 1 ? hi : 0xBF)) {
            *p = s + 1;
            return 0xDC00 + b0;
        }
        cp = (cp << 6) | (c & 0x3F);
    }
    *p = s + n;
    return cp;
}

int fl_fsname_cmp(const char *a, const char *b)
{
    const unsigned char *x = (const unsigned char *)a, *y = (const unsigned char *)b;
    size_t i = 0;
    while (x[i] == y[i] && x[i])
        i++;
    /* Two ASCII bytes (or an end) where they differ: no sequence before
     * them reaches them, so the prefixes decode alike and these bytes are
     * the code points that decide. */
    if (x[i] < 0x80 && y[i] < 0x80)
        return (int)x[i] - (int)y[i];
    for (;;) {
        if (!*x || !*y)
            return (int)(*x != 0) - (int)(*y != 0);
        uint32_t cx = next_code_point(&x), cy = next_code_point(&y);
        if (cx != cy)
            return cx < cy ? -1 : 1;
    }
}

static int cmp_names(const void *a, const void *b)
{
    return fl_fsname_cmp(*(const char *const *)a, *(const char *const *)b);
}

/* For names all ASCII: their bytes' order is Python's, and strcmp compares
 * them a word at a time (sorting a folder's names was a fifth of a scan). */
static int cmp_ascii_names(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Whether the n bytes at p are all ASCII. */
static int all_ascii(const char *p, size_t n)
{
    unsigned char any = 0;
    for (size_t i = 0; i < n; i++)
        any |= (unsigned char)p[i];
    return any < 0x80;
}

/* ---------------------------------------------------------- one folder read */

/* An entry that is a folder. */
typedef struct subdir {
    const char *name;  /* into the listing's names (set once the read is done) */
    size_t name_at;    /* offset of the name while reading */
    int has_key;       /* 0: stat() failed: os.walk would list nothing there */
    uint64_t dev, ino;
    int64_t node;      /* the node read for it, -1 for none */
} subdir;

/* A folder's entries as read. */
typedef struct listing {
    bytes names;           /* every entry's name, NUL-terminated */
    ints files;            /* offsets into names of the files (not folders) */
    subdir *dirs;
    size_t n_dirs, dirs_cap;
    const char **sorted;   /* the files' names, sorted (after the read) */
    uint64_t hash;         /* listing_hash */
} listing;

static void listing_free(listing *l)
{
    free(l->names.p);
    free(l->files.p);
    free(l->dirs);
    free(l->sorted);
    memset(l, 0, sizeof(*l));
}

static uint64_t mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

static uint64_t name_hash(const char *s, uint64_t kind)
{
    uint64_t h = 0xcbf29ce484222325ULL ^ kind;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 0x100000001b3ULL;
    return mix64(h);
}

/* Entries' hashes summed: the same for any order of reading. */
static uint64_t listing_hash(const listing *l)
{
    uint64_t h = 0;
    for (size_t i = 0; i < l->files.len; i++)
        h += name_hash(l->names.p + l->files.p[i], 1);
    for (size_t i = 0; i < l->n_dirs; i++)
        h += name_hash(l->names.p + l->dirs[i].name_at, 2);
    return h;
}

/* Adds entry `name` of the folder open at fd, classified as os.walk does:
 * a folder when d_type says so, or (a link, DT_UNKNOWN) when stat() says so.
 * Returns 0 or ENOMEM. */
static int add_entry(listing *l, int fd, const char *name, unsigned char type)
{
    if (name[0] == '.' && (!name[1] || (name[1] == '.' && !name[2])))
        return 0;
    int is_dir = 0, has_key = 0;
    struct stat st;
    if (type == DT_DIR || type == DT_LNK || type == DT_UNKNOWN) {
        int ok = fstatat(fd, name, &st, 0) == 0;
        if (type == DT_DIR) {
            is_dir = 1;
            has_key = ok && S_ISDIR(st.st_mode);
        } else {
            is_dir = has_key = ok && S_ISDIR(st.st_mode);
        }
    }
    size_t at = l->names.len;
    if (bytes_put(&l->names, name, strlen(name)) < 0)
        return ENOMEM;
    if (!is_dir)
        return ints_put(&l->files, (int64_t)at) < 0 ? ENOMEM : 0;
    if (l->n_dirs == l->dirs_cap) {
        size_t cap = l->dirs_cap ? l->dirs_cap * 2 : 16;
        subdir *p = realloc(l->dirs, cap * sizeof(*p));
        if (!p)
            return ENOMEM;
        l->dirs = p;
        l->dirs_cap = cap;
    }
    subdir *d = &l->dirs[l->n_dirs++];
    memset(d, 0, sizeof(*d));
    d->name_at = at;
    d->has_key = has_key;
    d->dev = has_key ? (uint64_t)st.st_dev : 0;
    d->ino = has_key ? (uint64_t)st.st_ino : 0;
    d->node = -1;
    return 0;
}

/* Reads the entries of the open folder fd.  Returns 0 or an errno. */
static int read_entries(int fd, listing *l, char *buf, size_t size)
{
#ifdef __linux__
    /* getdents64's records, as the kernel lays them out (8-byte aligned). */
    struct dirent64_record {
        uint64_t d_ino;
        int64_t d_off;
        unsigned short d_reclen;
        unsigned char d_type;
        char d_name[];
    };
    for (;;) {
        long got = syscall(SYS_getdents64, fd, buf, size);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0)
            return errno;
        if (got == 0)
            return 0;
        for (long at = 0; at < got;) {
            struct dirent64_record *r = (struct dirent64_record *)(void *)(buf + at);
            int err = add_entry(l, fd, r->d_name, r->d_type);
            if (err)
                return err;
            at += r->d_reclen;
        }
    }
#else
    (void)buf;
    (void)size;
    int dup_fd = dup(fd); /* closedir closes it: fd stays the caller's */
    if (dup_fd < 0)
        return errno;
    DIR *dir = fdopendir(dup_fd);
    if (!dir) {
        int err = errno;
        close(dup_fd);
        return err;
    }
    int err = 0;
    for (;;) {
        errno = 0;
        struct dirent *e = readdir(dir);
        if (!e) {
            err = errno;
            break;
        }
#ifdef _DIRENT_HAVE_D_TYPE
        err = add_entry(l, fd, e->d_name, e->d_type);
#else
        err = add_entry(l, fd, e->d_name, DT_UNKNOWN);
#endif
        if (err)
            break;
    }
    closedir(dir);
    return err;
#endif
}

/* Reads the folder at `path`: *st (taken before the entries), the entries
 * in *l (files sorted, folders sorted by name, the hash).  Returns 0 or an
 * errno (ENOMEM when out of memory); *l is emptied on error. */
static int read_folder(const char *path, struct stat *st, listing *l, char *buf, size_t size)
{
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOCTTY);
    if (fd < 0)
        return errno;
    int err = fstat(fd, st) < 0 ? errno : read_entries(fd, l, buf, size);
    close(fd);
    if (!err) {
        l->hash = listing_hash(l);
        if (l->files.len && !(l->sorted = malloc(l->files.len * sizeof(char *))))
            err = ENOMEM;
    }
    if (err) {
        listing_free(l);
        return err;
    }
    for (size_t i = 0; i < l->files.len; i++)
        l->sorted[i] = l->names.p + l->files.p[i];
    int (*cmp)(const void *, const void *) =
        all_ascii(l->names.p, l->names.len) ? cmp_ascii_names : cmp_names;
    if (l->files.len > 1)
        qsort(l->sorted, l->files.len, sizeof(char *), cmp);
    for (size_t i = 0; i < l->n_dirs; i++)
        l->dirs[i].name = l->names.p + l->dirs[i].name_at;
    /* subdir's first field is its name: cmp_names orders them by it */
    if (l->n_dirs > 1)
        qsort(l->dirs, l->n_dirs, sizeof(subdir), cmp);
    return 0;
}

/* ------------------------------------------------------- the parallel read */

typedef struct node {
    char *path;       /* owned: prefix + the path it was first reached at */
    uint64_t dev, ino;
    int64_t mtime_ns, ctime_ns, size;
    int err;          /* 0, or the errno that kept it from being read */
    listing list;
} node;

typedef struct scan {
    pthread_mutex_t lock;
    pthread_cond_t cond;   /* nodes added, a read finished, an error */
    /* Guarded by lock: */
    node **nodes;          /* owned, in the order found */
    size_t n_nodes, cap;
    int64_t *table;        /* open addressing on (dev, ino): node index + 1, 0 free */
    size_t table_cap;      /* a power of two, at most half full */
    size_t next;           /* nodes[next..n_nodes) wait to be read */
    size_t busy;           /* reads under way */
    int status;            /* FL_OK or FL_ERR_NOMEM: the threads stop */
} scan;

static size_t key_slot(const scan *s, uint64_t dev, uint64_t ino)
{
    return (size_t)mix64(dev * 0x9e3779b97f4a7c15ULL ^ ino) & (s->table_cap - 1);
}

static int table_grow(scan *s)
{
    size_t cap = s->table_cap ? s->table_cap * 2 : 1024;
    int64_t *old = s->table;
    size_t old_cap = s->table_cap;
    s->table = calloc(cap, sizeof(int64_t));
    if (!s->table) {
        s->table = old;
        return -1;
    }
    s->table_cap = cap;
    for (size_t i = 0; i < old_cap; i++) {
        if (!old[i])
            continue;
        const node *n = s->nodes[old[i] - 1];
        size_t at = key_slot(s, n->dev, n->ino);
        while (s->table[at])
            at = (at + 1) & (cap - 1);
        s->table[at] = old[i];
    }
    free(old);
    return 0;
}

/* The node of (dev, ino), added (to be read at `path`, a copy of which it
 * takes) when new.  Called with the lock held.  Returns its index or -1
 * when out of memory. */
static int64_t find_or_add(scan *s, uint64_t dev, uint64_t ino, const char *path)
{
    if ((s->n_nodes + 1) * 2 > s->table_cap && table_grow(s) < 0)
        return -1;
    size_t at = key_slot(s, dev, ino);
    while (s->table[at]) {
        const node *n = s->nodes[s->table[at] - 1];
        if (n->dev == dev && n->ino == ino)
            return s->table[at] - 1;
        at = (at + 1) & (s->table_cap - 1);
    }
    if (s->n_nodes == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 256;
        node **p = realloc(s->nodes, cap * sizeof(*p));
        if (!p)
            return -1;
        s->nodes = p;
        s->cap = cap;
    }
    node *n = calloc(1, sizeof(*n));
    if (!n || !(n->path = strdup(path))) {
        free(n);
        return -1;
    }
    n->dev = dev;
    n->ino = ino;
    s->nodes[s->n_nodes] = n;
    s->table[at] = (int64_t)s->n_nodes + 1;
    return (int64_t)s->n_nodes++;
}

/* Reads node n (no lock held).  Returns FL_OK or FL_ERR_NOMEM. */
static int read_node(node *n, char *buf)
{
    struct stat st;
    int err = read_folder(n->path, &st, &n->list, buf, READ_BUFFER);
    if (err == ENOMEM)
        return FL_ERR_NOMEM;
    if (err) {
        n->err = err;
        return FL_OK;
    }
    if ((uint64_t)st.st_dev != n->dev || (uint64_t)st.st_ino != n->ino)
        n->err = ESTALE; /* replaced since it was found: its listing is kept, no index */
    n->mtime_ns = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
    n->ctime_ns = (int64_t)st.st_ctim.tv_sec * 1000000000 + st.st_ctim.tv_nsec;
    n->size = (int64_t)st.st_size;
    return FL_OK;
}

/* Finds or adds the nodes of n's sub-folders; the lock is held. */
static int link_children(scan *s, node *n)
{
    bytes path = {0};
    int status = FL_OK;
    for (size_t i = 0; i < n->list.n_dirs && status == FL_OK; i++) {
        subdir *d = &n->list.dirs[i];
        if (!d->has_key)
            continue;
        path.len = 0;
        size_t at;
        if (bytes_put(&path, n->path, strlen(n->path)) < 0 ||
            bytes_join(&path, 0, d->name, &at) < 0 ||
            (d->node = find_or_add(s, d->dev, d->ino, path.p + at)) < 0)
            status = FL_ERR_NOMEM;
    }
    free(path.p);
    return status;
}

static void *scan_thread(void *arg)
{
    scan *s = arg;
    char *buf = malloc(READ_BUFFER);
    pthread_mutex_lock(&s->lock);
    if (!buf)
        s->status = FL_ERR_NOMEM;
    for (;;) {
        while (s->status == FL_OK && s->next == s->n_nodes && s->busy > 0)
            pthread_cond_wait(&s->cond, &s->lock);
        if (s->status != FL_OK || s->next == s->n_nodes)
            break; /* an error, or nothing queued and nothing being read: done */
        node *n = s->nodes[s->next++];
        s->busy++;
        pthread_mutex_unlock(&s->lock);
        int status = read_node(n, buf);
        pthread_mutex_lock(&s->lock);
        if (status == FL_OK && !n->err)
            status = link_children(s, n);
        if (status != FL_OK)
            s->status = status;
        s->busy--;
        pthread_cond_broadcast(&s->cond);
    }
    pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->lock);
    free(buf);
    return NULL;
}

/* A scan thread started here: named, so it shows in top -H and gdb. */
static void *scan_thread_named(void *arg)
{
#ifdef __linux__
    pthread_setname_np(pthread_self(), "fastload-scan");
#endif
    return scan_thread(arg);
}

static void scan_free(scan *s)
{
    for (size_t i = 0; i < s->n_nodes; i++) {
        listing_free(&s->nodes[i]->list);
        free(s->nodes[i]->path);
        free(s->nodes[i]);
    }
    free(s->nodes);
    free(s->table);
}

/* ------------------------------------------------------------- the replay */

typedef struct folder_ref {
    const char *path; /* first field: cmp_names sorts by it */
    size_t path_at;
    int64_t node;
} folder_ref;

typedef struct walk_out {
    bytes folder_paths, names, check_paths;
    ints top_folders, folder_offsets, folder_files, check_offsets, checks;
    size_t n_names;
} walk_out;

static int add_check(walk_out *w, const char *path, const node *n, int64_t racy_after_ns)
{
    int64_t racy = n->ctime_ns >= racy_after_ns || n->mtime_ns >= racy_after_ns;
    if (ints_put(&w->check_offsets, (int64_t)w->check_paths.len) < 0 ||
        bytes_put(&w->check_paths, path, strlen(path)) < 0)
        return -1;
    const int64_t fields[FL_CHECK_FIELDS] = {
        [FL_CHECK_DEV] = (int64_t)n->dev,         [FL_CHECK_INO] = (int64_t)n->ino,
        [FL_CHECK_MTIME_NS] = n->mtime_ns,        [FL_CHECK_CTIME_NS] = n->ctime_ns,
        [FL_CHECK_SIZE] = n->size,                [FL_CHECK_HASH] = (int64_t)n->list.hash,
        [FL_CHECK_RACY] = racy,
    };
    for (int i = 0; i < FL_CHECK_FIELDS; i++)
        if (ints_put(&w->checks, fields[i]) < 0)
            return -1;
    return 0;
}

/* Replays top t's walk (rel: its path relative to the prefix; root: its
 * node or -1) into w.  mark[i] == t: node i was reached in this top.
 * Returns 0, -1 when out of memory; *complete is cleared when a folder was
 * not read. */
static int replay_top(const scan *s, size_t t, const char *rel, int64_t root, int64_t *mark,
                      int64_t racy_after_ns, walk_out *w, int *complete)
{
    bytes paths = {0};                  /* this top's folder paths (relative) */
    ints stack = {0}, refs_at = {0};    /* (path offset, node) pairs */
    folder_ref *refs = NULL;
    int rc = -1;
    size_t at;
    if (ints_put(&w->top_folders, (int64_t)w->folder_offsets.len) < 0)
        goto done;
    if (root < 0) {
        *complete = 0;
        rc = 0;
        goto done;
    }
    if (bytes_put(&paths, rel, strlen(rel)) < 0 ||
        add_check(w, rel, s->nodes[root], racy_after_ns) < 0 || ints_put(&stack, 0) < 0 ||
        ints_put(&stack, root) < 0)
        goto done;
    mark[root] = (int64_t)t;
    while (stack.len) {
        int64_t idx = stack.p[--stack.len];
        size_t path_at = (size_t)stack.p[--stack.len];
        const node *n = s->nodes[idx];
        if (n->err) {
            *complete = 0;
            if (n->err != ESTALE)
                continue; /* os.walk lists nothing where scandir() fails */
        }
        if (ints_put(&refs_at, (int64_t)path_at) < 0 || ints_put(&refs_at, idx) < 0)
            goto done;
        size_t kept_from = stack.len;
        for (size_t i = 0; i < n->list.n_dirs; i++) {
            const subdir *d = &n->list.dirs[i];
            if (d->node < 0) {
                *complete = 0; /* stat() failed: os.walk's scandir() would too */
                continue;
            }
            if (bytes_join(&paths, path_at, d->name, &at) < 0 ||
                add_check(w, paths.p + at, s->nodes[d->node], racy_after_ns) < 0)
                goto done;
            if (mark[d->node] == (int64_t)t)
                continue; /* reached before in this top: walked once */
            mark[d->node] = (int64_t)t;
            if (ints_put(&stack, (int64_t)at) < 0 || ints_put(&stack, d->node) < 0)
                goto done;
        }
        /* os.walk visits the kept sub-folders in order: reverse them on the stack */
        for (size_t lo = kept_from, hi = stack.len; lo + 2 < hi; lo += 2) {
            hi -= 2;
            int64_t p0 = stack.p[lo], p1 = stack.p[lo + 1];
            stack.p[lo] = stack.p[hi];
            stack.p[lo + 1] = stack.p[hi + 1];
            stack.p[hi] = p0;
            stack.p[hi + 1] = p1;
        }
    }
    size_t n_refs = refs_at.len / 2;
    if (n_refs && !(refs = malloc(n_refs * sizeof(*refs))))
        goto done;
    for (size_t i = 0; i < n_refs; i++) {
        refs[i].path_at = (size_t)refs_at.p[2 * i];
        refs[i].path = paths.p + refs[i].path_at;
        refs[i].node = refs_at.p[2 * i + 1];
    }
    if (n_refs > 1)
        qsort(refs, n_refs, sizeof(*refs), cmp_names); /* sorted(os.walk(...)): by path */
    for (size_t i = 0; i < n_refs; i++) {
        const listing *l = &s->nodes[refs[i].node]->list;
        if (ints_put(&w->folder_offsets, (int64_t)w->folder_paths.len) < 0 ||
            bytes_put(&w->folder_paths, refs[i].path, strlen(refs[i].path)) < 0 ||
            ints_put(&w->folder_files, (int64_t)w->n_names) < 0)
            goto done;
        for (size_t f = 0; f < l->files.len; f++)
            if (bytes_put(&w->names, l->sorted[f], strlen(l->sorted[f])) < 0)
                goto done;
        w->n_names += l->files.len;
    }
    rc = 0;
done:
    free(refs);
    free(paths.p);
    free(stack.p);
    free(refs_at.p);
    return rc;
}

/* ------------------------------------------------------------------ API */

void fl_dir_walk_free(fl_dir_walk *w)
{
    if (w->owned) {
        free(w->top_folders);
        free(w->folder_paths);
        free(w->folder_offsets);
        free(w->folder_files);
        free(w->names);
        free(w->check_paths);
        free(w->check_offsets);
        free(w->checks);
    }
    memset(w, 0, sizeof(*w));
}

static void walk_out_free(walk_out *w)
{
    free(w->folder_paths.p);
    free(w->names.p);
    free(w->check_paths.p);
    free(w->top_folders.p);
    free(w->folder_offsets.p);
    free(w->folder_files.p);
    free(w->check_offsets.p);
    free(w->checks.p);
}

static int clamp_threads(int threads)
{
    return threads < 1 ? 1 : threads > MAX_THREADS ? MAX_THREADS : threads;
}

int fl_dir_scan(const char *prefix, const char *const *tops, size_t n_tops, int threads,
                int64_t racy_after_ns, fl_dir_walk *out, char *msg, size_t msg_size)
{
    memset(out, 0, sizeof(*out));
    scan s;
    memset(&s, 0, sizeof(s));
    walk_out w;
    memset(&w, 0, sizeof(w));
    int64_t *roots = NULL, *mark = NULL;
    bytes path = {0};
    pthread_t ids[MAX_THREADS];
    int started = 0, status = FL_ERR_NOMEM, complete = 1;
    if (pthread_mutex_init(&s.lock, NULL) != 0) {
        fl_set_msg(msg, msg_size, "fl_dir_scan: pthread_mutex_init failed");
        return FL_ERR_THREAD;
    }
    if (pthread_cond_init(&s.cond, NULL) != 0) {
        pthread_mutex_destroy(&s.lock);
        fl_set_msg(msg, msg_size, "fl_dir_scan: pthread_cond_init failed");
        return FL_ERR_THREAD;
    }
    if (!(roots = malloc((n_tops ? n_tops : 1) * sizeof(int64_t))))
        goto done;
    /* The tops, found before any thread starts (no lock needed yet). */
    for (size_t t = 0; t < n_tops; t++) {
        struct stat st;
        path.len = 0;
        if (bytes_put(&path, prefix, strlen(prefix)) < 0)
            goto done;
        path.len--; /* drop the NUL: the top's name follows */
        if (bytes_put(&path, tops[t], strlen(tops[t])) < 0)
            goto done;
        roots[t] = -1;
        if (stat(path.p, &st) == 0 && S_ISDIR(st.st_mode) &&
            (roots[t] = find_or_add(&s, (uint64_t)st.st_dev, (uint64_t)st.st_ino, path.p)) < 0)
            goto done;
    }
    threads = clamp_threads(threads);
    for (int i = 1; i < threads; i++) {
        if (pthread_create(&ids[started], NULL, scan_thread_named, &s) != 0)
            break; /* fewer threads: this one reads too */
        started++;
    }
    scan_thread(&s);
    for (int i = 0; i < started; i++)
        pthread_join(ids[i], NULL);
    if (s.status != FL_OK)
        goto done;

    if (s.n_nodes && !(mark = malloc(s.n_nodes * sizeof(int64_t))))
        goto done;
    for (size_t i = 0; i < s.n_nodes; i++)
        mark[i] = -1;
    for (size_t t = 0; t < n_tops; t++)
        if (replay_top(&s, t, tops[t], roots[t], mark, racy_after_ns, &w, &complete) < 0)
            goto done;
    if (ints_put(&w.top_folders, (int64_t)w.folder_offsets.len) < 0 ||
        ints_put(&w.folder_files, (int64_t)w.n_names) < 0)
        goto done;

    out->n_tops = n_tops;
    out->top_folders = w.top_folders.p;
    out->folder_paths = w.folder_paths.p;
    out->folder_paths_size = w.folder_paths.len;
    out->folder_offsets = w.folder_offsets.p;
    out->n_folders = w.folder_offsets.len;
    out->folder_files = w.folder_files.p;
    out->names = w.names.p;
    out->names_size = w.names.len;
    out->n_names = w.n_names;
    out->check_paths = w.check_paths.p;
    out->check_paths_size = w.check_paths.len;
    out->check_offsets = w.check_offsets.p;
    out->checks = w.checks.p;
    out->n_checks = w.check_offsets.len;
    out->complete = complete;
    out->dirs_read = s.n_nodes;
    out->owned = 1;
    memset(&w, 0, sizeof(w)); /* out owns the arrays now */
    status = FL_OK;
done:
    if (status == FL_ERR_NOMEM)
        fl_set_msg(msg, msg_size, "fl_dir_scan: out of memory");
    walk_out_free(&w);
    scan_free(&s);
    free(roots);
    free(mark);
    free(path.p);
    pthread_cond_destroy(&s.cond);
    pthread_mutex_destroy(&s.lock);
    return status;
}

/* ---------------------------------------------------------------- checks */

typedef struct check_job {
    const char *prefix, *paths;
    const int64_t *offsets, *checks;
    size_t n;
    atomic_size_t next;
    atomic_llong changed;  /* the first changed record found, or -1 */
    atomic_size_t reread;
    atomic_int status;     /* FL_OK or FL_ERR_NOMEM */
} check_job;

/* Whether record i still holds; -1 when out of memory. */
static int check_one(check_job *job, size_t i, bytes *path, char *buf)
{
    const int64_t *c = job->checks + i * FL_CHECK_FIELDS;
    path->len = 0;
    if (bytes_put(path, job->prefix, strlen(job->prefix)) < 0)
        return -1;
    path->len--;
    if (bytes_put(path, job->paths + job->offsets[i], strlen(job->paths + job->offsets[i])) < 0)
        return -1;
    struct stat st;
    if (stat(path->p, &st) != 0)
        return 0;
    if ((int64_t)(uint64_t)st.st_dev != c[FL_CHECK_DEV] ||
        (int64_t)(uint64_t)st.st_ino != c[FL_CHECK_INO] ||
        (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec != c[FL_CHECK_MTIME_NS] ||
        (int64_t)st.st_ctim.tv_sec * 1000000000 + st.st_ctim.tv_nsec != c[FL_CHECK_CTIME_NS] ||
        (int64_t)st.st_size != c[FL_CHECK_SIZE])
        return 0;
    if (!c[FL_CHECK_RACY])
        return 1;
    /* Its times were too close to the scan to tell a later change in the
     * same clock tick: read it again. */
    listing l;
    memset(&l, 0, sizeof(l));
    int err = read_folder(path->p, &st, &l, buf, READ_BUFFER);
    atomic_fetch_add(&job->reread, 1);
    uint64_t hash = l.hash;
    listing_free(&l);
    if (err == ENOMEM)
        return -1;
    return !err && (int64_t)hash == c[FL_CHECK_HASH];
}

static void *check_thread(void *arg)
{
    check_job *job = arg;
    bytes path = {0};
    char *buf = malloc(READ_BUFFER);
    if (!buf) {
        atomic_store(&job->status, FL_ERR_NOMEM);
        return NULL;
    }
    for (;;) {
        if (atomic_load(&job->changed) >= 0 || atomic_load(&job->status) != FL_OK)
            break;
        size_t i = atomic_fetch_add(&job->next, 1);
        if (i >= job->n)
            break;
        int ok = check_one(job, i, &path, buf);
        if (ok < 0) {
            atomic_store(&job->status, FL_ERR_NOMEM);
        } else if (!ok) {
            long long none = -1;
            atomic_compare_exchange_strong(&job->changed, &none, (long long)i);
        }
    }
    free(buf);
    free(path.p);
    return NULL;
}

static void *check_thread_named(void *arg)
{
#ifdef __linux__
    pthread_setname_np(pthread_self(), "fastload-check");
#endif
    return check_thread(arg);
}

int fl_dir_check(const char *prefix, const char *paths, const int64_t *offsets,
                 const int64_t *checks, size_t n, int threads, int64_t *changed, size_t *reread,
                 char *msg, size_t msg_size)
{
    check_job job;
    job.prefix = prefix;
    job.paths = paths;
    job.offsets = offsets;
    job.checks = checks;
    job.n = n;
    atomic_init(&job.next, 0);
    atomic_init(&job.changed, -1);
    atomic_init(&job.reread, 0);
    atomic_init(&job.status, FL_OK);
    pthread_t ids[MAX_THREADS];
    int started = 0;
    threads = clamp_threads(threads);
    if ((size_t)threads > n)
        threads = n ? (int)n : 1;
    for (int i = 1; i < threads; i++) {
        if (pthread_create(&ids[started], NULL, check_thread_named, &job) != 0)
            break;
        started++;
    }
    check_thread(&job);
    for (int i = 0; i < started; i++)
        pthread_join(ids[i], NULL);
    *changed = (int64_t)atomic_load(&job.changed);
    *reread = atomic_load(&job.reread);
    if (atomic_load(&job.status) != FL_OK) {
        fl_set_msg(msg, msg_size, "fl_dir_check: out of memory");
        return FL_ERR_NOMEM;
    }
    return FL_OK;
}

/* --------------------------------------------------------------- samples */

static int ascii_lower(int c)
{
    return c >= 'A' && c <= 'Z' ? c + ('a' - 'A') : c;
}

/* Whether path (len bytes), ASCII-lowercased, ends with ext. */
static int ends_with_lower(const char *path, size_t len, const char *ext, size_t ext_len)
{
    if (ext_len > len)
        return 0;
    const char *tail = path + len - ext_len;
    for (size_t i = 0; i < ext_len; i++)
        if (ascii_lower((unsigned char)tail[i]) != (unsigned char)ext[i])
            return 0;
    return 1;
}

/* Asks for huge pages where `size` bytes at p cover whole 2 MiB pages: a
 * path blob of a million files is tens of megabytes, written once, and
 * faulting it in 4 KiB pages costs more than writing it. */
static void hint_huge_pages(void *p, size_t size)
{
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    const uintptr_t huge = (uintptr_t)2 << 20;
    uintptr_t start = ((uintptr_t)p + huge - 1) & ~(huge - 1), end = ((uintptr_t)p + size) & ~(huge - 1);
    if (end > start)
        (void)madvise((void *)start, (size_t)(end - start), MADV_HUGEPAGE); /* only a hint */
#else
    (void)p;
    (void)size;
#endif
}

int fl_dir_samples_room(size_t prefix_len, const fl_dir_walk *walk, size_t *room, char *msg,
                        size_t msg_size)
{
    /* The arrays hold together (they may come from an index file): the
     * ranges ascend, the offsets stay inside their blobs, which end with a
     * NUL.  Whether the names blob holds n_names names, fl_dir_samples sees
     * as it goes; the room counts names_size for them, all it can take. */
    int ok = walk->top_folders[0] == 0 &&
             (size_t)walk->top_folders[walk->n_tops] == walk->n_folders &&
             walk->folder_files[0] == 0 &&
             (size_t)walk->folder_files[walk->n_folders] == walk->n_names &&
             (!walk->folder_paths_size || walk->folder_paths[walk->folder_paths_size - 1] == '\0') &&
             (walk->names_size ? walk->names[walk->names_size - 1] == '\0' : walk->n_names == 0);
    for (size_t t = 0; ok && t < walk->n_tops; t++)
        ok = walk->top_folders[t] <= walk->top_folders[t + 1];
    size_t total = walk->names_size;
    for (size_t f = 0; ok && f < walk->n_folders; f++) {
        ok = walk->folder_files[f] <= walk->folder_files[f + 1] && walk->folder_offsets[f] >= 0 &&
             (size_t)walk->folder_offsets[f] < walk->folder_paths_size;
        if (ok) {
            size_t each = prefix_len + strlen(walk->folder_paths + walk->folder_offsets[f]) + 1;
            size_t n = (size_t)(walk->folder_files[f + 1] - walk->folder_files[f]);
            ok = n == 0 || each <= (SIZE_MAX - total) / n;
            total += ok ? each * n : 0;
        }
    }
    if (!ok) {
        fl_set_msg(msg, msg_size, "fl_dir_samples_room: the walk's arrays do not hold together");
        return FL_ERR_INVALID;
    }
    *room = total;
    return FL_OK;
}

int fl_dir_samples(const char *prefix, const fl_dir_walk *walk, const char *const *exts,
                   const size_t *ext_lens, size_t n_exts, char *out, size_t room, size_t *out_size,
                   int64_t *offsets, size_t *n_samples, int64_t *counts, int64_t **undecided_out,
                   size_t *n_undecided, char *msg, size_t msg_size)
{
    ints undecided = {0};
    size_t prefix_len = strlen(prefix), window = 0, used = 0, n = 0;
    int exts_ascii = 1;
    for (size_t e = 0; exts && e < n_exts; e++) {
        if (ext_lens[e] > window)
            window = ext_lens[e];
        for (size_t i = 0; i < ext_lens[e]; i++)
            exts_ascii &= (unsigned char)exts[e][i] < 0x80;
    }
    /* Python lowercases code point by code point, so only the last k code
     * points (at most 4k bytes) meet an extension of k code points. */
    window = window > SIZE_MAX / 4 ? SIZE_MAX : window * 4;
    const char *name = walk->names, *names_end = walk->names + walk->names_size;
    hint_huge_pages(out, room);
    hint_huge_pages(offsets, walk->n_names * sizeof(int64_t));
    for (size_t t = 0; t < walk->n_tops; t++) {
        size_t before = n;
        for (int64_t f = walk->top_folders[t]; f < walk->top_folders[t + 1]; f++) {
            const char *folder = walk->folder_paths + walk->folder_offsets[f];
            size_t folder_len = strlen(folder), head = prefix_len + folder_len + 1;
            for (int64_t i = walk->folder_files[f]; i < walk->folder_files[f + 1]; i++) {
                const char *name_end = memchr(name, '\0', (size_t)(names_end - name));
                if (!name_end) {
                    free(undecided.p);
                    fl_set_msg(msg, msg_size, "fl_dir_samples: the walk has fewer names than "
                                              "its folders list");
                    return FL_ERR_INVALID;
                }
                /* fl_dir_samples_room counted room for every path that fits
                 * in names_size: no check of `out` here */
                size_t name_len = (size_t)(name_end - name), len = head + name_len;
                char *p = out + used;
                memcpy(p, prefix, prefix_len);
                memcpy(p + prefix_len, folder, folder_len);
                p[head - 1] = '/';
                memcpy(p + head, name, name_len + 1);
                name += name_len + 1;
                int keep = 1, decide = 0;
                if (exts) {
                    keep = 0;
                    for (size_t e = 0; e < n_exts && !keep; e++)
                        keep = ends_with_lower(p, len, exts[e], ext_lens[e]);
                    if (!keep || !exts_ascii) {
                        size_t from = len > window ? len - window : 0;
                        for (size_t k = from; k < len && !decide; k++)
                            decide = (unsigned char)p[k] >= 0x80;
                    }
                }
                if (!keep && !decide)
                    continue;
                if (decide && ints_put(&undecided, (int64_t)n) < 0) {
                    free(undecided.p);
                    fl_set_msg(msg, msg_size, "fl_dir_samples: out of memory");
                    return FL_ERR_NOMEM;
                }
                offsets[n++] = (int64_t)used;
                used += len + 1;
            }
        }
        counts[t] = (int64_t)(n - before);
    }
    *out_size = used;
    *n_samples = n;
    *undecided_out = undecided.p;
    *n_undecided = undecided.len;
    return FL_OK;
}

uint64_t fl_dir_checksum(const void *data, size_t size)
{
    /* Fletcher-style sums of 64-bit words: a changed, lost or moved word
     * changes them, at the speed of memory (an index file is read whole at
     * every construction; zlib's CRC-32 would cost more than the rest). */
    const unsigned char *p = data;
    uint64_t a = 0x243f6a8885a308d3ULL, b = size;
    size_t i = 0;
    for (; i + 8 <= size; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        a += w;
        b += a;
    }
    uint64_t w = 0;
    if (size > i)
        memcpy(&w, p + i, size - i);
    a += w;
    b += a;
    return mix64(a) ^ mix64(b + 0x9e3779b97f4a7c15ULL);
}
