/* fastload core: the sample cache (see sample_cache.h).
 *
 * Every shared field is a C11 atomic in the mapping; the static asserts
 * below make sure 64-bit atomics are lock-free, hence address-free, which
 * is what lets two processes use them through their own mappings.
 *
 * An entry moves EMPTY -> WRITING (one writer claimed it, by CAS) -> READY
 * (published with a release store after its bytes, offset, size and
 * checksum are written); a reader acquires READY before it reads the rest.
 * A corrupt entry goes back READY -> EMPTY.  A writer that dies between
 * WRITING and READY leaves the sample uncached, never half-published.
 *
 * Opening a file at a path is serialised by flock() on the file: a file of
 * size 0 (just created) is set up in place; one that does not match (stale)
 * is replaced by a new file made beside it and renamed over the path, so a
 * process still mapping the old file keeps a consistent one.  A process
 * that waited for the lock on a file renamed away meanwhile opens the path
 * again.
 */
#define _GNU_SOURCE
#include "core/source/sample_cache.h"

#include "core/memory/bus_guard.h"
#include "core/source/squashfs_read.h"
#include "core/status.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2, "the cache needs lock-free 64-bit atomics");

#define CACHE_MAGIC 0x314548434143464cULL /* "LFCACHE1" little-endian */
#define CACHE_VERSION 1u
#define HEADER_BYTES 4096u
#define PAGE_ROUND(x) (((x) + 4095u) & ~(uint64_t)4095u)
#define OPEN_TRIES 16 /* replaced files raced with before giving up */

enum { ENTRY_EMPTY = 0, ENTRY_WRITING = 1, ENTRY_READY = 2 };

/* The header, at the start of the file.  The layout fields are written
 * once, before `magic` is published, and only compared afterwards. */
typedef struct cache_header {
    _Atomic uint64_t magic;
    uint32_t version;
    uint32_t entry_bytes;
    uint64_t key;
    int64_t samples;
    uint64_t capacity;
    uint64_t data_offset;
    uint64_t data_bytes;
    _Atomic uint64_t used; /* bytes of the data region reserved */
    _Atomic uint64_t stored, hits, rejected, corrupt;
} cache_header;

typedef struct cache_entry {
    _Atomic uint64_t offset;
    _Atomic uint64_t size;
    _Atomic uint64_t checksum;
    _Atomic uint64_t state;
} cache_entry;

_Static_assert(sizeof(cache_header) <= HEADER_BYTES, "the header fits its page");

struct fl_sample_cache {
    int fd;
    unsigned char *map;   /* the whole file, MAP_SHARED */
    size_t map_bytes;
    cache_header *header;
    cache_entry *entries;
    unsigned char *data;
    uint64_t data_bytes;  /* our own copy: the header's is not trusted after open */
    int64_t samples;
    atomic_int broken;    /* a read or write of the mapping faulted: the file
                             was cut short; never touched again (this process) */
};

/* ----------------------------------------------------------- bus errors
 *
 * The file may be written, or cut short, by anyone who can open it: every
 * access to the mapping after open runs under the bus-error guard
 * (bus_guard.h).  The guarded functions below only read and write the
 * mapping and their own arguments: no lock (the cache has none), no
 * allocation.  The first fault marks the cache broken: from then on it
 * finds nothing and stores nothing, so every sample is read from its
 * source, as for a cache that is full — a damaged cache costs speed, never
 * a sample or the process. */

static int guarded(fl_sample_cache *c, void (*fn)(void *), void *arg)
{
    if (atomic_load_explicit(&c->broken, memory_order_relaxed))
        return FL_ERR_IO;
    if (fl_guarded(fn, arg, NULL) == FL_OK)
        return FL_OK;
    atomic_store_explicit(&c->broken, 1, memory_order_relaxed);
    return FL_ERR_IO;
}

/* ------------------------------------------------------------- checksum */

#define P1 0x9E3779B185EBCA87ULL
#define P2 0xC2B2AE3D27D4EB4FULL
#define P3 0x165667B19E3779F9ULL

static inline uint64_t rotl64(uint64_t x, int r)
{
    return (x << r) | (x >> (64 - r));
}

static inline uint64_t load64(const unsigned char *p)
{
    uint64_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline uint64_t lane(uint64_t acc, uint64_t in)
{
    return rotl64(acc + in * P2, 31) * P1;
}

/* The final mix: every input bit reaches every output bit. */
static inline uint64_t avalanche(uint64_t h)
{
    h ^= h >> 33;
    h *= P2;
    h ^= h >> 29;
    h *= P3;
    h ^= h >> 32;
    return h;
}

uint64_t fl_cache_checksum(const void *data, size_t size)
{
    const unsigned char *p = data, *end = p + size;
    uint64_t h;
    if (size >= 32) {
        /* Four independent lanes keep the multipliers busy. */
        uint64_t a = P1 + P2, b = P2, c = 0, d = (uint64_t)0 - P1;
        for (; end - p >= 32; p += 32) {
            a = lane(a, load64(p));
            b = lane(b, load64(p + 8));
            c = lane(c, load64(p + 16));
            d = lane(d, load64(p + 24));
        }
        h = rotl64(a, 1) + rotl64(b, 7) + rotl64(c, 12) + rotl64(d, 18);
    } else {
        h = P3;
    }
    h += (uint64_t)size;
    for (; end - p >= 8; p += 8)
        h = rotl64(h ^ lane(0, load64(p)), 27) * P1 + P3;
    for (; p < end; p++)
        h = rotl64(h ^ (*p * P3), 11) * P1;
    return avalanche(h);
}

/* ------------------------------------------------------------------ key */

static inline uint64_t fold(uint64_t h, uint64_t v)
{
    return rotl64(h ^ lane(0, v), 27) * P1 + P3;
}

int fl_sample_cache_key(const char *paths, const int64_t *offsets, const int64_t *ranges,
                        int64_t n, uint64_t *key, uint64_t *total_bytes)
{
    uint64_t h = fold(P3, (uint64_t)n), total = 0, file = 0;
    int64_t previous = -1;
    struct stat st;
    int found = 0;
    for (int64_t i = 0; i < n; i++) {
        if (offsets[i] != previous) {
            const char *path = paths + offsets[i];
            previous = offsets[i];
            found = stat(path, &st) == 0 && S_ISREG(st.st_mode);
            file = fl_cache_checksum(path, strlen(path));
            size_t image_len = found ? 0 : fl_sqfs_image_part(path);
            fl_sqfs_stat inner;
            int inner_err;
            char inner_msg[8];
            if (image_len && fl_sqfs_stat_path(path, image_len, &inner, &inner_err, inner_msg,
                                               sizeof inner_msg) == FL_OK &&
                inner.kind == FL_SQFS_FILE) {
                /* A file inside a SquashFS image: its size and whole seconds. */
                found = 1;
                memset(&st, 0, sizeof st);
                st.st_size = (off_t)inner.size;
                st.st_mtim.tv_sec = (time_t)inner.mtime;
            }
            if (found) {
                file = fold(file, (uint64_t)st.st_size);
                file = fold(file, (uint64_t)st.st_mtim.tv_sec);
                file = fold(file, (uint64_t)st.st_mtim.tv_nsec);
            }
        }
        h = fold(h, file);
        if (ranges) {
            h = fold(fold(h, (uint64_t)ranges[2 * i]), (uint64_t)ranges[2 * i + 1]);
            total += (uint64_t)ranges[2 * i + 1];
        } else if (found) {
            total += (uint64_t)st.st_size;
        }
    }
    *key = avalanche(h);
    *total_bytes = total;
    return FL_OK;
}

/* ---------------------------------------------------------------- open */

uint64_t fl_sample_cache_overhead(int64_t samples)
{
    return PAGE_ROUND(HEADER_BYTES + (uint64_t)samples * sizeof(cache_entry));
}

/* What the header of a cache for these arguments holds. */
typedef struct cache_layout {
    uint64_t key;
    int64_t samples;
    uint64_t capacity;
    uint64_t data_offset;
    uint64_t data_bytes;
} cache_layout;

static int io_error(int *err, char *msg, size_t msg_size, const char *what)
{
    *err = errno;
    fl_set_msg(msg, msg_size, "%s: %s", what, strerror(errno));
    return FL_ERR_IO;
}

/* Maps the whole file; NULL with errno on failure. */
static unsigned char *map_file(int fd, const cache_layout *layout)
{
    void *map = mmap(NULL, (size_t)layout->capacity, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    return map == MAP_FAILED ? NULL : map;
}

typedef struct header_job {
    cache_header *h;
    const cache_layout *layout;
    int matches;
} header_job;

static void write_header(void *arg)
{
    header_job *job = arg;
    cache_header *h = job->h;
    const cache_layout *layout = job->layout;
    h->version = CACHE_VERSION;
    h->entry_bytes = sizeof(cache_entry);
    h->key = layout->key;
    h->samples = layout->samples;
    h->capacity = layout->capacity;
    h->data_offset = layout->data_offset;
    h->data_bytes = layout->data_bytes;
    atomic_store_explicit(&h->magic, CACHE_MAGIC, memory_order_release);
}

static void check_header(void *arg)
{
    header_job *job = arg;
    const cache_header *h = job->h;
    const cache_layout *layout = job->layout;
    job->matches = atomic_load_explicit(&h->magic, memory_order_acquire) == CACHE_MAGIC &&
                   h->version == CACHE_VERSION && h->entry_bytes == sizeof(cache_entry) &&
                   h->key == layout->key && h->samples == layout->samples &&
                   h->capacity == layout->capacity && h->data_offset == layout->data_offset &&
                   h->data_bytes == layout->data_bytes;
}

/* Sets up an empty file `fd`: reserves its space, maps it and writes the
 * header, magic last.  Returns FL_OK with *map set. */
static int init_file(int fd, const cache_layout *layout, unsigned char **map, int *err,
                     char *msg, size_t msg_size)
{
    int rc = posix_fallocate(fd, 0, (off_t)layout->capacity);
    if (rc != 0) {
        errno = rc;
        return io_error(err, msg, msg_size, "cannot reserve the cache's space");
    }
    *map = map_file(fd, layout);
    if (!*map)
        return io_error(err, msg, msg_size, "cannot map the cache");
    header_job job = {(cache_header *)*map, layout, 0};
    if (fl_guarded(write_header, &job, NULL) != FL_OK) {
        errno = EIO;
        return io_error(err, msg, msg_size, "the cache file was cut short while being set up");
    }
    return FL_OK;
}

/* The header's check, under the guard: a file cut short below its header
 * is as stale as one made for other data (it is replaced). */
static int header_matches(cache_header *h, const cache_layout *layout)
{
    header_job job = {h, layout, 0};
    return fl_guarded(check_header, &job, NULL) == FL_OK && job.matches;
}

/* Makes a new cache file beside `path` and renames it over it.  Returns
 * FL_OK with *fd and *map set. */
static int replace_file(const char *path, const cache_layout *layout, int *fd,
                        unsigned char **map, int *err, char *msg, size_t msg_size)
{
    size_t len = strlen(path);
    char *temp = malloc(len + 8);
    if (!temp) {
        fl_set_msg(msg, msg_size, "no memory for the cache's path");
        return FL_ERR_NOMEM;
    }
    memcpy(temp, path, len);
    memcpy(temp + len, ".XXXXXX", 8);
    int rc = FL_OK;
    *fd = mkostemp(temp, O_CLOEXEC);
    if (*fd < 0) {
        rc = io_error(err, msg, msg_size, "cannot create a new cache file beside the stale one");
        goto out;
    }
    rc = init_file(*fd, layout, map, err, msg, msg_size);
    if (rc == FL_OK && rename(temp, path) != 0)
        rc = io_error(err, msg, msg_size, "cannot replace the stale cache file");
    if (rc != FL_OK) {
        unlink(temp);
        if (*map)
            munmap(*map, (size_t)layout->capacity);
        *map = NULL;
        close(*fd);
        *fd = -1;
    }
out:
    free(temp);
    return rc;
}

/* Opens the cache file at `path` as the comment at the top says.
 * Returns FL_OK with *fd and *map set. */
static int open_path(const char *path, const cache_layout *layout, int *fd, unsigned char **map,
                     int *err, char *msg, size_t msg_size)
{
    for (int tries = 0; tries < OPEN_TRIES; tries++) {
        int rc = FL_OK, created = 1;
        struct stat fs, ps;
        *map = NULL;
        /* Whether this attempt made the file: only then may a failure
         * remove it. */
        *fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOCTTY | O_NONBLOCK, 0600);
        if (*fd < 0 && errno == EEXIST) {
            created = 0;
            *fd = open(path, O_RDWR | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
            if (*fd < 0 && errno == ENOENT)
                continue; /* removed since: make it */
        }
        if (*fd < 0)
            return io_error(err, msg, msg_size, "cannot open the cache file");
        if (fstat(*fd, &fs) != 0) {
            rc = io_error(err, msg, msg_size, "cannot stat the cache file");
            close(*fd);
            return rc;
        }
        if (!S_ISREG(fs.st_mode)) {
            close(*fd);
            *err = EINVAL;
            fl_set_msg(msg, msg_size, "the cache path is not a regular file");
            return FL_ERR_IO;
        }
        while ((rc = flock(*fd, LOCK_EX)) != 0 && errno == EINTR)
            ;
        if (rc != 0 || fstat(*fd, &fs) != 0) {
            rc = io_error(err, msg, msg_size, "cannot lock the cache file");
            close(*fd);
            return rc;
        }
        if (stat(path, &ps) != 0 || ps.st_dev != fs.st_dev || ps.st_ino != fs.st_ino) {
            close(*fd); /* replaced while we waited: open the new one */
            continue;
        }
        if (fs.st_size == 0) {
            rc = init_file(*fd, layout, map, err, msg, msg_size);
            if (rc != FL_OK) {
                /* A file this attempt made goes (a process that opened it
                 * meanwhile finds it gone when it gets the lock, and makes
                 * its own); one it found empty is left empty. */
                if (created)
                    unlink(path);
                else if (ftruncate(*fd, 0) != 0) {
                    /* The next opener finds a bad header and replaces it. */
                }
            }
        } else {
            if ((uint64_t)fs.st_size == layout->capacity) {
                *map = map_file(*fd, layout);
                if (!*map) {
                    rc = io_error(err, msg, msg_size, "cannot map the cache");
                } else if (!header_matches((cache_header *)*map, layout)) {
                    munmap(*map, (size_t)layout->capacity);
                    *map = NULL;
                }
            }
            if (rc == FL_OK && !*map) {
                /* Stale or foreign: a new file in its place; the old lock
                 * goes with the old descriptor. */
                int old = *fd;
                rc = replace_file(path, layout, fd, map, err, msg, msg_size);
                close(old);
                if (rc != FL_OK)
                    return rc;
            }
        }
        if (rc != FL_OK) {
            if (*map)
                munmap(*map, (size_t)layout->capacity);
            *map = NULL;
            close(*fd);
            return rc;
        }
        flock(*fd, LOCK_UN);
        return FL_OK;
    }
    *err = EBUSY;
    fl_set_msg(msg, msg_size, "the cache file kept being replaced while opening it");
    return FL_ERR_IO;
}

int fl_sample_cache_open(const char *path, uint64_t key, int64_t samples, uint64_t capacity,
                         fl_sample_cache **out, int *err, char *msg, size_t msg_size)
{
    *out = NULL;
    *err = 0;
    if (samples < 0 || (uint64_t)samples > (UINT64_MAX - 2 * HEADER_BYTES) / sizeof(cache_entry)) {
        fl_set_msg(msg, msg_size, "bad sample count %lld", (long long)samples);
        return FL_ERR_INVALID;
    }
    uint64_t overhead = fl_sample_cache_overhead(samples);
    if (capacity <= overhead || capacity > (uint64_t)INT64_MAX || capacity > SIZE_MAX) {
        fl_set_msg(msg, msg_size,
                   "a cache of %lld samples needs more than %llu bytes (its header and index); "
                   "got %llu",
                   (long long)samples, (unsigned long long)overhead,
                   (unsigned long long)capacity);
        return FL_ERR_INVALID;
    }
    cache_layout layout = {key, samples, capacity, overhead, capacity - overhead};
    fl_sample_cache *c = calloc(1, sizeof *c);
    if (!c) {
        fl_set_msg(msg, msg_size, "no memory for the cache");
        return FL_ERR_NOMEM;
    }
    int rc;
    unsigned char *map = NULL;
    int fd = -1;
    if (!path) {
        fd = memfd_create("fastload-cache", MFD_CLOEXEC);
        if (fd < 0) {
            rc = io_error(err, msg, msg_size, "cannot create the cache in memory");
        } else {
            rc = init_file(fd, &layout, &map, err, msg, msg_size);
            if (rc != FL_OK)
                close(fd);
        }
    } else {
        rc = open_path(path, &layout, &fd, &map, err, msg, msg_size);
    }
    if (rc != FL_OK) {
        free(c);
        return rc;
    }
    c->fd = fd;
    c->map = map;
    c->map_bytes = (size_t)capacity;
    c->header = (cache_header *)map;
    c->entries = (cache_entry *)(map + HEADER_BYTES);
    c->data = map + overhead;
    c->data_bytes = layout.data_bytes;
    c->samples = samples;
    *out = c;
    return FL_OK;
}

void fl_sample_cache_close(fl_sample_cache *cache)
{
    if (!cache)
        return;
    munmap(cache->map, cache->map_bytes);
    close(cache->fd);
    free(cache);
}

int64_t fl_sample_cache_samples(const fl_sample_cache *cache)
{
    return cache->samples;
}

int fl_sample_cache_fd(const fl_sample_cache *cache)
{
    return cache->fd;
}

/* ------------------------------------------------------------- entries
 *
 * Each public call below does its work on the mapping in one guarded
 * function (see "bus errors" above). */

typedef struct entry_job {
    fl_sample_cache *c;
    int64_t index;
    fl_cache_ref *ref;
    int found;
} entry_job;

static void find_entry(void *arg)
{
    entry_job *job = arg;
    fl_sample_cache *c = job->c;
    cache_entry *e = &c->entries[job->index];
    fl_cache_ref *ref = job->ref;
    if (atomic_load_explicit(&e->state, memory_order_acquire) != ENTRY_READY)
        return;
    ref->offset = atomic_load_explicit(&e->offset, memory_order_relaxed);
    ref->size = atomic_load_explicit(&e->size, memory_order_relaxed);
    ref->checksum = atomic_load_explicit(&e->checksum, memory_order_relaxed);
    /* The index is in a file anyone may have written: check before use. */
    job->found = ref->size <= c->data_bytes && ref->offset <= c->data_bytes - ref->size;
}

int fl_sample_cache_find(fl_sample_cache *c, int64_t index, fl_cache_ref *ref)
{
    if (index < 0 || index >= c->samples)
        return 0;
    entry_job job = {c, index, ref, 0};
    return guarded(c, find_entry, &job) == FL_OK && job.found;
}

typedef struct copy_job {
    fl_sample_cache *c;
    int64_t index;
    const fl_cache_ref *ref;
    unsigned char *dst;
    int good; /* in: the copy checked out; for count_copy */
} copy_job;

static void copy_entry(void *arg)
{
    copy_job *job = arg;
    memcpy(job->dst, job->c->data + job->ref->offset, (size_t)job->ref->size);
}

static void count_copy(void *arg)
{
    copy_job *job = arg;
    fl_sample_cache *c = job->c;
    if (job->good) {
        atomic_fetch_add_explicit(&c->header->hits, 1, memory_order_relaxed);
        return;
    }
    /* Drop the entry unless another thread already did and stored the
     * sample again elsewhere (then its offset differs).  Losing that race
     * only drops a good entry, which the next fill stores again. */
    cache_entry *e = &c->entries[job->index];
    uint64_t ready = ENTRY_READY;
    if (atomic_load_explicit(&e->offset, memory_order_relaxed) == job->ref->offset)
        atomic_compare_exchange_strong_explicit(&e->state, &ready, ENTRY_EMPTY,
                                                memory_order_acq_rel, memory_order_relaxed);
    atomic_fetch_add_explicit(&c->header->corrupt, 1, memory_order_relaxed);
}

int fl_sample_cache_copy(fl_sample_cache *c, int64_t index, const fl_cache_ref *ref,
                         unsigned char *dst)
{
    copy_job job = {c, index, ref, dst, 0};
    if (guarded(c, copy_entry, &job) != FL_OK)
        return FL_ERR_IO;
    /* The checksum reads our copy: no guard needed. */
    job.good = fl_cache_checksum(dst, (size_t)ref->size) == ref->checksum;
    if (guarded(c, count_copy, &job) != FL_OK)
        return FL_ERR_IO;
    return job.good ? FL_OK : FL_ERR_DECODE;
}

typedef struct store_job {
    fl_sample_cache *c;
    int64_t index;
    size_t size;
    void (*fill)(void *arg, unsigned char *at);
    void *fill_arg;
    int stored;
} store_job;

/* Reserves room for the entry, has fill() write it, and publishes it. */
static void store_entry(void *arg)
{
    store_job *job = arg;
    fl_sample_cache *c = job->c;
    cache_entry *e = &c->entries[job->index];
    cache_header *h = c->header;
    if (atomic_load_explicit(&e->state, memory_order_relaxed) != ENTRY_EMPTY)
        return;
    uint64_t need = ((uint64_t)job->size + 7) & ~(uint64_t)7; /* keeps entries 8-byte aligned */
    uint64_t used = atomic_load_explicit(&h->used, memory_order_relaxed);
    if (need > c->data_bytes || used > c->data_bytes - need) {
        atomic_fetch_add_explicit(&h->rejected, 1, memory_order_relaxed);
        return;
    }
    uint64_t empty = ENTRY_EMPTY;
    if (!atomic_compare_exchange_strong_explicit(&e->state, &empty, ENTRY_WRITING,
                                                 memory_order_acquire, memory_order_relaxed))
        return; /* another writer has it */
    /* Reserve [used, used + need) without ever passing the region's end. */
    do {
        if (used > c->data_bytes || need > c->data_bytes - used) {
            atomic_store_explicit(&e->state, ENTRY_EMPTY, memory_order_release);
            atomic_fetch_add_explicit(&h->rejected, 1, memory_order_relaxed);
            return;
        }
    } while (!atomic_compare_exchange_weak_explicit(&h->used, &used, used + need,
                                                    memory_order_relaxed, memory_order_relaxed));
    unsigned char *at = c->data + used;
    job->fill(job->fill_arg, at);
    atomic_store_explicit(&e->offset, used, memory_order_relaxed);
    atomic_store_explicit(&e->size, (uint64_t)job->size, memory_order_relaxed);
    atomic_store_explicit(&e->checksum, fl_cache_checksum(at, job->size), memory_order_relaxed);
    atomic_store_explicit(&e->state, ENTRY_READY, memory_order_release);
    atomic_fetch_add_explicit(&h->stored, 1, memory_order_relaxed);
    job->stored = 1;
}

int fl_sample_cache_store(fl_sample_cache *c, int64_t index, size_t size,
                          void (*fill)(void *arg, unsigned char *at), void *fill_arg)
{
    if (index < 0 || index >= c->samples)
        return 0;
    store_job job = {c, index, size, fill, fill_arg, 0};
    return guarded(c, store_entry, &job) == FL_OK && job.stored;
}

typedef struct bytes {
    const unsigned char *data;
    size_t size;
} bytes;

static void fill_bytes(void *arg, unsigned char *at)
{
    const bytes *b = arg;
    memcpy(at, b->data, b->size);
}

int fl_sample_cache_put(fl_sample_cache *c, int64_t index, const unsigned char *data,
                        size_t size)
{
    bytes b = {data, size};
    return fl_sample_cache_store(c, index, size, fill_bytes, &b);
}

typedef struct stats_job {
    fl_sample_cache *c;
    fl_cache_stats *out;
} stats_job;

static void read_stats(void *arg)
{
    stats_job *job = arg;
    cache_header *h = job->c->header;
    fl_cache_stats *out = job->out;
    out->used = atomic_load_explicit(&h->used, memory_order_relaxed);
    out->stored = atomic_load_explicit(&h->stored, memory_order_relaxed);
    out->hits = atomic_load_explicit(&h->hits, memory_order_relaxed);
    out->rejected = atomic_load_explicit(&h->rejected, memory_order_relaxed);
    out->corrupt = atomic_load_explicit(&h->corrupt, memory_order_relaxed);
}

void fl_sample_cache_stats(fl_sample_cache *c, fl_cache_stats *out)
{
    memset(out, 0, sizeof *out);
    out->capacity = c->map_bytes;
    out->data_bytes = c->data_bytes;
    stats_job job = {c, out};
    if (guarded(c, read_stats, &job) != FL_OK) {
        /* The shared counters are gone with the file. */
        out->used = out->stored = out->hits = out->rejected = out->corrupt = 0;
        out->broken = 1;
    }
}

int fl_sample_cache_broken(fl_sample_cache *c)
{
    return atomic_load_explicit(&c->broken, memory_order_relaxed);
}

int64_t fl_sample_cache_file_offset(fl_sample_cache *c, int64_t index)
{
    fl_cache_ref ref;
    if (!fl_sample_cache_find(c, index, &ref))
        return -1;
    return (int64_t)((uint64_t)(c->data - c->map) + ref.offset);
}
