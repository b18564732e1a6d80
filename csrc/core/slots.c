/* fastload core: see slots.h.
 *
 * One mutex guards the free list and the counters; memory is allocated and
 * freed outside it.  The reference count is guarded by the same mutex: it
 * changes once per batch, far too rarely for contention to matter.
 */
#define _GNU_SOURCE
#include "slots.h"

#include "forksafe.h"
#include "status.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

struct fl_slot_pool {
    pthread_mutex_t lock;
    fl__fork_entry fork_entry;
    fl_slot_allocator allocator;
    size_t max_free;
    /* guarded by lock: */
    size_t refs;      /* owner + acquired slots */
    size_t live;      /* slots whose memory is allocated */
    size_t n_free;    /* slots on the free list */
    fl_slot *free_list;
};

static size_t page_size(void)
{
    long p = sysconf(_SC_PAGESIZE);
    return p > 0 ? (size_t)p : 4096;
}

/* Slots of HUGE_PAGE bytes or more are mapped on their own, 2 MiB-aligned,
 * and offered to transparent huge pages: a fresh 3 MiB batch then costs two
 * page faults instead of ~770, and copies into it miss the TLB less.  Smaller
 * slots come from the heap, page-aligned.  fl_slot_acquire rounds sizes so
 * that a slot's capacity says which kind it is. */
#define HUGE_PAGE ((size_t)2 << 20)

static void *default_alloc(size_t bytes, void *ctx)
{
    (void)ctx;
    if (bytes < HUGE_PAGE) {
        void *p = NULL;
        return posix_memalign(&p, page_size(), bytes) == 0 ? p : NULL;
    }
    /* Over-map by one huge page, then trim to an aligned run. */
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
    if (bytes < HUGE_PAGE)
        free(data);
    else
        munmap(data, bytes);
}

fl_slot_pool *fl_slot_pool_new(size_t max_free, const fl_slot_allocator *allocator)
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
    fl_slot *s = pool->free_list;
    while (s) {
        fl_slot *next = s->next;
        destroy_slot(pool, s);
        s = next;
    }
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
    size_t unit = bytes >= HUGE_PAGE ? HUGE_PAGE : page_size();
    if (bytes > SIZE_MAX - unit)
        return FL_ERR_NOMEM;
    size_t want = bytes == 0 ? unit : (bytes + unit - 1) / unit * unit;

    pthread_mutex_lock(&pool->lock);
    fl_slot *best = NULL, **best_link = NULL;
    for (fl_slot **link = &pool->free_list; *link; link = &(*link)->next) {
        fl_slot *s = *link;
        if (s->capacity >= want && s->capacity / 2 <= want &&
            (!best || s->capacity < best->capacity)) {
            best = s;
            best_link = link;
        }
    }
    if (best) {
        *best_link = best->next;
        pool->n_free--;
    }
    pool->refs++;
    pthread_mutex_unlock(&pool->lock);
    if (best && best->fence && pool->allocator.fence_before_reuse)
        pool->allocator.fence_before_reuse(best, pool->allocator.ctx);

    if (!best) {
        best = calloc(1, sizeof *best);
        void *data = best ? pool->allocator.alloc(want, pool->allocator.ctx) : NULL;
        if (!data) {
            free(best);
            unref(pool);
            return FL_ERR_NOMEM;
        }
        best->data = data;
        best->capacity = want;
        best->pool = pool;
        pthread_mutex_lock(&pool->lock);
        pool->live++;
        pthread_mutex_unlock(&pool->lock);
    }
    best->next = NULL;
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
    int keep = pool->n_free < pool->max_free;
    if (keep) {
        slot->next = pool->free_list;
        pool->free_list = slot;
        pool->n_free++;
    } else {
        pool->live--;
    }
    pthread_mutex_unlock(&pool->lock);
    if (!keep)
        destroy_slot(pool, slot);
    unref(pool);
}

void fl_slot_pool_trim(fl_slot_pool *pool)
{
    pthread_mutex_lock(&pool->lock);
    fl_slot *s = pool->free_list;
    pool->live -= pool->n_free;
    pool->free_list = NULL;
    pool->n_free = 0;
    pthread_mutex_unlock(&pool->lock);
    while (s) {
        fl_slot *next = s->next;
        destroy_slot(pool, s);
        s = next;
    }
}

void fl_slot_pool_counts(fl_slot_pool *pool, size_t *live, size_t *free_listed)
{
    pthread_mutex_lock(&pool->lock);
    if (live)
        *live = pool->live;
    if (free_listed)
        *free_listed = pool->n_free;
    pthread_mutex_unlock(&pool->lock);
}
