/* fastload core: see slots.h.
 *
 * One mutex guards the free list and the counters; memory is allocated and
 * freed outside it.  The reference count is guarded by the same mutex: it
 * changes once per batch, far too rarely for contention to matter.
 *
 * Allocation strategy.  Every default slot is its own anonymous mapping, not
 * heap memory: the heap keeps what it frees (a pool that once held thousands
 * of small batches would stay that large), while munmap gives the pages back
 * at once, and a mapping is page-aligned by construction.  A mapping costs a
 * system call and a page fault per page touched, which is why released slots
 * are reused first: mmap and munmap run only when the pool grows or shrinks,
 * never per batch in a steady state.  The free list is ordered by release,
 * newest first: reuse prefers warm slots, and when it is over its bounds the
 * oldest go, so slots of a size no longer asked for do not stay for ever.
 */
#define _GNU_SOURCE
#include "core/memory/slots.h"

#include "core/engine/forksafe.h"
#include "core/status.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

struct fl_slot_pool {
    pthread_mutex_t lock;
    fl__fork_entry fork_entry;
    fl_slot_allocator allocator;
    size_t max_free;        /* idle slots kept, at most */
    size_t max_free_bytes;  /* their capacities together, at most */
    /* guarded by lock: */
    size_t refs;        /* owner + acquired slots */
    size_t live;        /* slots whose memory is allocated */
    size_t n_free;      /* slots on the free list */
    size_t free_bytes;  /* their capacities together */
    size_t allocations; /* slots ever allocated */
    fl_slot *newest, *oldest; /* the free list, linked newest to oldest */
};

static size_t page_size(void)
{
    long p = sysconf(_SC_PAGESIZE);
    return p > 0 ? (size_t)p : 4096;
}

/* Slots of HUGE_PAGE bytes or more are 2 MiB-aligned and offered to
 * transparent huge pages: a fresh 3 MiB batch then costs two page faults
 * instead of ~770, and copies into it miss the TLB less. */
#define HUGE_PAGE ((size_t)2 << 20)

static void *default_alloc(size_t bytes, void *ctx)
{
    (void)ctx;
    if (bytes < HUGE_PAGE) {
        void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        return p == MAP_FAILED ? NULL : p;
    }
    /* Over-map by one huge page, then trim to an aligned run. */
    if (bytes > SIZE_MAX - HUGE_PAGE)
        return NULL;
    char *raw = mmap(NULL, bytes + HUGE_PAGE, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED)
        return NULL;
    uintptr_t start = ((uintptr_t)raw + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1);
    size_t head = start - (uintptr_t)raw;
    if (head)
        munmap(raw, head);
    if (HUGE_PAGE - head)
        munmap((char *)start + bytes, HUGE_PAGE - head);
    madvise((void *)start, bytes, MADV_HUGEPAGE); /* best effort: a hint */
    return (void *)start;
}

static void default_free(void *data, size_t bytes, void *ctx)
{
    (void)ctx;
    munmap(data, bytes);
}

size_t fl_slot_class(size_t bytes)
{
    size_t unit = bytes >= HUGE_PAGE ? HUGE_PAGE : page_size();
    if (bytes <= unit)
        return unit;
    /* Eighth steps of the power of two below: at most 12.5% is rounded on,
     * which for the default memory is address space only (pages never
     * touched are never backed), and a batch a little larger than the last
     * still fits its slot. */
    int top = 63 - __builtin_clzll((unsigned long long)bytes);
    size_t step = top >= 3 ? (size_t)1 << (top - 3) : 1;
    if (step < unit)
        step = unit;
    if (bytes > SIZE_MAX - (step - 1))
        return 0;
    return (bytes + step - 1) / step * step;
}

fl_slot_pool *fl_slot_pool_new(size_t max_free, size_t max_free_bytes,
                               const fl_slot_allocator *allocator)
{
    fl_slot_pool *pool = calloc(1, sizeof *pool);
    if (!pool)
        return NULL;
    if (pthread_mutex_init(&pool->lock, NULL) != 0) {
        free(pool);
        return NULL;
    }
    if (allocator) {
        pool->allocator = *allocator;
    } else {
        pool->allocator.alloc = default_alloc;
        pool->allocator.free = default_free;
    }
    pool->max_free = max_free;
    pool->max_free_bytes = max_free_bytes;
    pool->refs = 1;
    pool->fork_entry.mutex = &pool->lock;
    if (fl__fork_register(&pool->fork_entry) != 0) {
        pthread_mutex_destroy(&pool->lock);
        free(pool);
        return NULL;
    }
    return pool;
}

static void destroy_slot(fl_slot_pool *pool, fl_slot *slot)
{
    if (slot->fence && pool->allocator.free_fence)
        pool->allocator.free_fence(slot->fence, pool->allocator.ctx);
    pool->allocator.free(slot->data, slot->capacity, pool->allocator.ctx);
    free(slot);
}

/* Destroys a chain of slots linked through `next`.  Called without the lock. */
static void destroy_chain(fl_slot_pool *pool, fl_slot *s)
{
    while (s) {
        fl_slot *next = s->next;
        destroy_slot(pool, s);
        s = next;
    }
}

/* Takes `s` off the free list.  Called with the lock held. */
static void unlink_free(fl_slot_pool *pool, fl_slot *s)
{
    if (s->prev)
        s->prev->next = s->next;
    else
        pool->newest = s->next;
    if (s->next)
        s->next->prev = s->prev;
    else
        pool->oldest = s->prev;
    s->next = s->prev = NULL;
    pool->n_free--;
    pool->free_bytes -= s->capacity;
}

/* Drops one reference; frees the pool and its free list with the last.
 * Called without the lock. */
static void unref(fl_slot_pool *pool)
{
    pthread_mutex_lock(&pool->lock);
    int last = --pool->refs == 0;
    pthread_mutex_unlock(&pool->lock);
    if (!last)
        return;
    fl__fork_unregister(&pool->fork_entry);
    destroy_chain(pool, pool->newest);
    pthread_mutex_destroy(&pool->lock);
    free(pool);
}

void fl_slot_pool_release(fl_slot_pool *pool)
{
    if (pool)
        unref(pool);
}

int fl_slot_acquire(fl_slot_pool *pool, size_t bytes, fl_slot **out)
{
    size_t want = fl_slot_class(bytes);
    if (want == 0)
        return FL_ERR_NOMEM;

    pthread_mutex_lock(&pool->lock);
    fl_slot *best = NULL;
    for (fl_slot *s = pool->newest; s; s = s->next) {
        if (s->capacity >= want && s->capacity / 2 <= want &&
            (!best || s->capacity < best->capacity))
            best = s;
    }
    if (best)
        unlink_free(pool, best);
    pool->refs++;
    pthread_mutex_unlock(&pool->lock);
    if (best && best->fence && pool->allocator.fence_before_reuse)
        pool->allocator.fence_before_reuse(best, pool->allocator.ctx);

    if (!best) {
        best = calloc(1, sizeof *best);
        /* errno cleared: an allocator that does not set it (a CUDA one)
         * must not be reported with a stale EMFILE from earlier. */
        errno = 0;
        void *data = best ? pool->allocator.alloc(want, pool->allocator.ctx) : NULL;
        if (!data) {
            /* An allocator that needs a descriptor (shm.c) says so in errno. */
            int fds = best && (errno == EMFILE || errno == ENFILE);
            free(best);
            unref(pool);
            return fds ? FL_ERR_FDS : FL_ERR_NOMEM;
        }
        best->data = data;
        best->capacity = want;
        best->pool = pool;
        pthread_mutex_lock(&pool->lock);
        pool->live++;
        pool->allocations++;
        pthread_mutex_unlock(&pool->lock);
    }
    *out = best;
    return FL_OK;
}

void fl_slot_release(fl_slot *slot)
{
    if (!slot)
        return;
    fl_slot_pool *pool = slot->pool;
    if (pool->allocator.fence_on_release)
        pool->allocator.fence_on_release(slot, pool->allocator.ctx);
    pthread_mutex_lock(&pool->lock);
    slot->prev = NULL;
    slot->next = pool->newest;
    if (pool->newest)
        pool->newest->prev = slot;
    else
        pool->oldest = slot;
    pool->newest = slot;
    pool->n_free++;
    pool->free_bytes += slot->capacity;
    /* Over a bound: the oldest go, collected through `next` for freeing
     * after the lock is let go. */
    fl_slot *evicted = NULL;
    while (pool->n_free > pool->max_free || pool->free_bytes > pool->max_free_bytes) {
        fl_slot *old = pool->oldest;
        unlink_free(pool, old);
        pool->live--;
        old->next = evicted;
        evicted = old;
    }
    pthread_mutex_unlock(&pool->lock);
    destroy_chain(pool, evicted);
    unref(pool);
}

void fl_slot_pool_trim(fl_slot_pool *pool)
{
    pthread_mutex_lock(&pool->lock);
    fl_slot *s = pool->newest;
    pool->live -= pool->n_free;
    pool->newest = pool->oldest = NULL;
    pool->n_free = 0;
    pool->free_bytes = 0;
    pthread_mutex_unlock(&pool->lock);
    destroy_chain(pool, s);
}

void fl_slot_pool_stats_get(fl_slot_pool *pool, fl_slot_pool_stats *out)
{
    pthread_mutex_lock(&pool->lock);
    out->live = pool->live;
    out->free = pool->n_free;
    out->free_bytes = pool->free_bytes;
    out->allocations = pool->allocations;
    pthread_mutex_unlock(&pool->lock);
}

void fl_slot_pool_counts(fl_slot_pool *pool, size_t *live, size_t *free_listed)
{
    fl_slot_pool_stats stats;
    fl_slot_pool_stats_get(pool, &stats);
    if (live)
        *live = stats.live;
    if (free_listed)
        *free_listed = stats.free;
}
