/* fastload core: batch slots — page-aligned buffers a batch is written into,
 * recycled through a pool.
 *
 * A slot belongs to whoever acquired it until fl_slot_release; the batch
 * arrays the user holds keep it acquired, so a held batch is never
 * overwritten: the pool simply grows.  Released slots wait on a free list (at
 * most `max_free` of them) for reuse, so steady-state loading allocates
 * nothing and touches warm pages.
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

/* Where slot memory comes from.  The default is posix_memalign at page size;
 * CUDA's page-locked host memory or device memory can be plugged in instead
 * (cuda_memory.h). */
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
    size_t capacity;
    /* Allocator-specific, owned by the slot and kept across reuse: a CUDA
     * event recorded when the last reader let go, which the next writer
     * waits for (a copy from pinned memory or a kernel reading device memory
     * may still be queued when the batch is freed).  NULL until set. */
    void *fence;
    fl_slot_pool *pool;   /* holds a reference while the slot is acquired */
    struct fl_slot *next; /* free-list link; guarded by the pool's lock */
};

/* Creates a pool holding one reference for the caller.  `allocator` may be
 * NULL for ordinary page-aligned memory.  Returns NULL when out of memory. */
fl_slot_pool *fl_slot_pool_new(size_t max_free, const fl_slot_allocator *allocator);

/* Drops the caller's reference; the pool is freed with its last slot. */
void fl_slot_pool_release(fl_slot_pool *pool);

/* Hands out a slot of at least `bytes` bytes (0 is allowed and gives a
 * page).  Reuses the smallest free slot that fits without wasting more than
 * half of it, or allocates.  Returns FL_OK and sets *out, or FL_ERR_NOMEM. */
int fl_slot_acquire(fl_slot_pool *pool, size_t bytes, fl_slot **out);

/* Returns a slot to its pool (or frees it when the free list is full). */
void fl_slot_release(fl_slot *slot);

/* Frees every slot on the free list: the retry after an allocation failed. */
void fl_slot_pool_trim(fl_slot_pool *pool);

/* Counters for tests and stats: slots allocated and not freed (in use or
 * free-listed), and those on the free list. */
void fl_slot_pool_counts(fl_slot_pool *pool, size_t *live, size_t *free_listed);

#endif /* FL_SLOTS_H */
