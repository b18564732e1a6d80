/* fastload core: the sample cache — the bytes of a dataset's samples, kept
 * in one shared, size-bounded file that every loader and process on the node
 * reads instead of the source.
 *
 * The cache is one file (a path, e.g. under /dev/shm, or an anonymous memfd
 * for "memory") mapped MAP_SHARED by every process using it:
 *
 *   header  (one page)  magic, version, the dataset key, the layout, and the
 *                       shared counters (bytes used, entries stored, ...)
 *   index   one fl_cache_entry per sample: offset, size, checksum, state
 *   data    the samples' bytes, placed one after the other
 *
 * Policy when full: first come, no eviction.  A writer reserves room with a
 * compare-and-swap on the header's `used` counter and never past the data
 * region's end, so the file never grows: the cache holds the samples first
 * read (about the first `capacity` bytes of epoch 1) and the rest are read
 * from the source every epoch.  No eviction means no lock anywhere, across
 * threads or processes, and a stored entry's bytes never move.
 *
 * Nothing read back is trusted: an entry's offset and size are checked
 * against the region, and its bytes are copied out and checked against the
 * stored size and 64-bit checksum.  A mismatch (the file was changed under
 * us) drops the entry, the caller reads the source, and the next fill
 * stores the sample again in fresh space.  A cache made for another dataset
 * (its key differs: files added, removed, resized or touched) or of another
 * size is replaced by a new file at the same path at open; processes still
 * mapping the old one keep reading it unharmed.
 *
 * All calls but open and close are lock-free and safe from any thread of
 * any process mapping the cache.
 *
 * The file may also be cut short by anyone who can open it, which would
 * make any access to the mapping raise SIGBUS.  Every access runs under the
 * bus-error guard (bus_guard.h); the first fault marks the cache broken in
 * this process, which from then on finds and stores nothing: every sample
 * is read from its source (as when the cache is full), and stats report
 * `broken`.  A cache costs speed then, never a sample or the process.  (It
 * is not reopened: a new loader's dataset opens a fresh one.)
 */
#ifndef FL_SAMPLE_CACHE_H
#define FL_SAMPLE_CACHE_H

#include <stddef.h>
#include <stdint.h>

typedef struct fl_sample_cache fl_sample_cache;

/* Where a stored sample lies (a snapshot of its index entry). */
typedef struct fl_cache_ref {
    uint64_t offset;   /* in the data region */
    uint64_t size;
    uint64_t checksum;
} fl_cache_ref;

/* The counters a cache keeps in its header (shared by every process). */
typedef struct fl_cache_stats {
    uint64_t capacity;     /* bytes of the whole file */
    uint64_t data_bytes;   /* bytes of its data region */
    uint64_t used;         /* bytes of the data region reserved so far */
    uint64_t stored;       /* samples stored */
    uint64_t hits;         /* samples served from the cache */
    uint64_t rejected;     /* samples not stored: no room left */
    uint64_t corrupt;      /* entries whose bytes did not match (dropped) */
    uint64_t broken;       /* 1: the file was cut short under this process,
                              which uses it no more (the counters are 0) */
} fl_cache_stats;

/* The checksum the cache stores with each sample: a 64-bit multiply-rotate
 * hash, four lanes over 32-byte stripes (several GB/s, well below a
 * decode's cost). */
uint64_t fl_cache_checksum(const void *data, size_t size);

/* The key naming a dataset's contents: a hash of each sample's path and
 * range (`ranges`: NULL, or (offset, size) pairs of samples inside their
 * file) and of its file's size and modification time.  Samples sharing a
 * file (consecutive equal `offsets`) stat it once.  *total_bytes gets the
 * samples' bytes (what a cache holding all of them needs); a file that
 * cannot be stat'ed counts as missing (0 bytes), so the read reports it.
 * Returns FL_OK. */
int fl_sample_cache_key(const char *paths, const int64_t *offsets, const int64_t *ranges,
                        int64_t n, uint64_t *key, uint64_t *total_bytes);

/* Bytes the header and index of a cache of `samples` samples take (the
 * smallest capacity that can hold anything is a little above it). */
uint64_t fl_sample_cache_overhead(int64_t samples);

/* Opens (or creates) the cache at `path`, or a fresh anonymous one when
 * `path` is NULL, for `samples` samples of the dataset `key`, `capacity`
 * bytes in all.  A file at `path` made for another key, sample count or
 * capacity, or not a cache at all (bad magic or version), is replaced.  The
 * space is reserved when the file is made (posix_fallocate), so a full
 * /dev/shm is an error here, never a SIGBUS later.  Returns FL_OK with
 * *out set, FL_ERR_INVALID (capacity below the overhead), FL_ERR_IO (errno
 * in *err) or FL_ERR_NOMEM, with a message. */
int fl_sample_cache_open(const char *path, uint64_t key, int64_t samples, uint64_t capacity,
                         fl_sample_cache **out, int *err, char *msg, size_t msg_size);

/* Unmaps and closes the cache (the file stays). */
void fl_sample_cache_close(fl_sample_cache *cache);

/* The cache's file descriptor (an anonymous cache is reopened by another
 * process through /proc/<pid>/fd/<fd>). */
int fl_sample_cache_fd(const fl_sample_cache *cache);

/* The number of samples (index entries) the cache was opened for. */
int64_t fl_sample_cache_samples(const fl_sample_cache *cache);

/* 1 with *ref filled when sample `index` (in [0, samples)) is stored and
 * its entry lies inside the data region, else 0 (also when the cache is
 * broken). */
int fl_sample_cache_find(fl_sample_cache *cache, int64_t index, fl_cache_ref *ref);

/* Copies the bytes *ref names (ref->size of them) into `dst` and checks
 * them.  Returns FL_OK (a hit, counted), FL_ERR_DECODE when they do not
 * match the checksum (the entry is dropped, so the next fill stores the
 * sample again), or FL_ERR_IO when the file was cut short (the cache is
 * broken now); on failure `dst` must not be used. */
int fl_sample_cache_copy(fl_sample_cache *cache, int64_t index, const fl_cache_ref *ref,
                         unsigned char *dst);

/* Stores sample `index`'s bytes unless it is stored or being stored, or
 * there is no room left (or the cache is broken).  Returns 1 when stored,
 * else 0. */
int fl_sample_cache_put(fl_sample_cache *cache, int64_t index, const unsigned char *data,
                        size_t size);

/* fl_sample_cache_put for bytes made in place (decoded pixels): reserves
 * `size` bytes for sample `index`, calls fill(fill_arg, at) to write exactly
 * `size` bytes at `at`, and publishes the entry.  fill runs under the
 * bus-error guard, writing into the mapping: it must hold no lock and
 * allocate nothing (bus_guard.h).  Returns 1 when stored, else 0 (stored or
 * being stored, no room, broken; fill is then not called, or the file was
 * cut short under it). */
int fl_sample_cache_store(fl_sample_cache *cache, int64_t index, size_t size,
                          void (*fill)(void *fill_arg, unsigned char *at), void *fill_arg);

/* The shared counters, read now (all 0 with `broken` set once the file was
 * cut short). */
void fl_sample_cache_stats(fl_sample_cache *cache, fl_cache_stats *out);

/* Nonzero once the cache's file was found cut short (see above). */
int fl_sample_cache_broken(fl_sample_cache *cache);

/* Where sample `index`'s bytes lie in the file (from its start), or -1 when
 * it is not stored (for tests that damage entries). */
int64_t fl_sample_cache_file_offset(fl_sample_cache *cache, int64_t index);

#endif /* FL_SAMPLE_CACHE_H */
