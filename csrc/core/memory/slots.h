/* fastload core: batch slots — page-aligned buffers a batch is written into,
 * recycled through a pool.
 *
 * A slot belongs to whoever acquired it until fl_slot_release; the batch
 * arrays the user holds keep it acquired, so a held batch is never
 * overwritten: the pool simply grows.  Released slots wait on a free list for
 * reuse, so steady-state loading allocates nothing and touches warm pages.
 * The free list is bounded in count (`max_free`) and in bytes
 * (`max_free_bytes`, summed capacities); past either bound the slots released
 * longest ago are freed, so the list follows the sizes in use now and a pool
 * that shrinks gives its memory back.
 *
 * Sizes are rounded up to classes (eighth steps between powers of two, at
 * least a page; at least a huge page from 2 MiB on), so batches whose sizes
 * differ a little share slots.
 *
 * The pool is reference counted: its owner holds one reference and every
 * acquired slot another, so slots may outlive the loader that made them.  All
 * calls are thread-safe.
 */
#ifndef FL_SLOTS_H
#define FL_SLOTS_H

#include <stddef.h>

typedef struct fl_slot_pool fl_slot_pool;
typedef struct fl_slot fl_slot;

/* Where slot memory comes from.  The default maps each slot with mmap
 * (page-aligned; 2 MiB-aligned from 2 MiB on), so freeing a slot returns its
 * pages to the system; CUDA's page-locked host memory or device memory can
 * be plugged in instead (cuda_memory.h). */
typedef struct fl_slot_allocator {
    void *(*alloc)(size_t bytes, void *ctx); /* page-aligned memory or NULL */
    void (*free)(void *data, size_t bytes, void *ctx);
    /* Optional (NULL: none) fence hooks, see fl_slot.fence: run on a slot
     * as it is released, before it is handed out again, and when it is
     * freed.  The first two run without the pool's lock. */
    void (*fence_on_release)(fl_slot *slot, void *ctx);
    void (*fence_before_reuse)(fl_slot *slot, void *ctx);
    void (*free_fence)(void *fence, void *ctx);
    void *ctx;
} fl_slot_allocator;

struct fl_slot {
    void *data;           /* page-aligned, `capacity` bytes */
    size_t capacity;      /* the size class the slot was allocated for */
    /* Allocator-specific, owned by the slot and kept across reuse: a CUDA
     * event recorded when the last reader let go, which the next writer
     * waits for (a copy from pinned memory or a kernel reading device memory
     * may still be queued when the batch is freed).  NULL until set. */
    void *fence;
    fl_slot_pool *pool;   /* holds a reference while the slot is acquired */
    /* Free-list links: `next` the neighbour released before this slot,
     * `prev` the one released after; guarded by the pool's lock and
     * meaningful only while the slot is on the list. */
    struct fl_slot *next, *prev;
};

/* Creates a pool holding one reference for the caller: at most `max_free`
 * idle slots of at most `max_free_bytes` bytes together are kept (SIZE_MAX:
 * no byte bound).  `allocator` may be NULL for ordinary page-aligned memory.
 * Returns NULL when out of memory. */
fl_slot_pool *fl_slot_pool_new(size_t max_free, size_t max_free_bytes,
                               const fl_slot_allocator *allocator);

/* Drops the caller's reference; the pool is freed with its last slot. */
void fl_slot_pool_release(fl_slot_pool *pool);

/* The capacity a slot for `bytes` bytes gets (its size class), or 0 when
 * that would overflow. */
size_t fl_slot_class(size_t bytes);

/* Hands out a slot of at least `bytes` bytes (0 is allowed and gives a
 * page).  Reuses the smallest free slot that fits without wasting more than
 * half of it (the most recently released among equals), or allocates one of
 * fl_slot_class(bytes).  Returns FL_OK and sets *out, FL_ERR_FDS when the
 * allocator ran out of file descriptors (shared slots), or FL_ERR_NOMEM. */
int fl_slot_acquire(fl_slot_pool *pool, size_t bytes, fl_slot **out);

/* Returns a slot to its pool's free list, then frees the oldest free slots
 * while the list is over its bounds (which may be this one). */
void fl_slot_release(fl_slot *slot);

/* Frees every slot on the free list: the retry after an allocation failed. */
void fl_slot_pool_trim(fl_slot_pool *pool);

typedef struct fl_slot_pool_stats {
    size_t live;        /* slots whose memory is allocated (in use or free) */
    size_t free;        /* slots on the free list */
    size_t free_bytes;  /* their capacities together */
    size_t allocations; /* slots allocated over the pool's life */
} fl_slot_pool_stats;

/* Counters for tests and stats. */
void fl_slot_pool_stats_get(fl_slot_pool *pool, fl_slot_pool_stats *out);

/* The first two counters alone (either pointer may be NULL). */
void fl_slot_pool_counts(fl_slot_pool *pool, size_t *live, size_t *free_listed);

#endif /* FL_SLOTS_H */
