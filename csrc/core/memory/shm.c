/* fastload core: shared slots (see shm.h).
 *
 * The registry is two small arrays searched linearly: the arenas, and the
 * regions handed out as slots.  A worker has a few slots per batch in flight
 * (more only while its parent holds batches), and the registry is consulted
 * once per batch array and on a pool miss.  It is process-wide state guarded
 * by one mutex, never held across a system call that can block: arenas are
 * created, punched and unmapped outside it.
 *
 * A shared arena is carved at page granularity with a bitmap (a bit per
 * page, set while a region covers it) and first fit.  A freed region's pages
 * are not punched out of the memfd: the slot may be freed here (the worker
 * exits, its pool goes) while the parent still holds the batch in it.  They
 * are reused by the next region carved there, and go with the arena.
 */
#define _GNU_SOURCE
#include "core/memory/shm.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/status.h"

typedef struct shm_arena {
    int fd;              /* owned; closed with the arena */
    unsigned char *data; /* the arena's mapping, `bytes` long */
    size_t bytes;
    uint64_t id;
    size_t pages;        /* carved arenas: pages in all; 0 for a one-slot arena */
    uint64_t *bitmap;    /* carved arenas: a bit per page, set = in use */
    size_t used;         /* regions live in it; the arena goes with the last */
} shm_arena;

typedef struct shm_region {
    unsigned char *data;
    size_t bytes;
    uint64_t id;
    shm_arena *arena;    /* borrowed: lives while this region does */
} shm_region;

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
/* Everything below is guarded by registry_lock. */
static shm_arena **arenas;       /* live arenas */
static size_t arena_count, arena_capacity;
static shm_region *regions;      /* live slots */
static size_t region_count, region_capacity;
static uint64_t *freed;          /* ids of arenas freed and not yet taken */
static size_t freed_count, freed_capacity;
static uint64_t next_id = 1;

/* Makes room for one more item in a growable array; returns 0, or -1 when
 * out of memory. */
static int grow(void **array, size_t *capacity, size_t count, size_t item)
{
    if (count < *capacity)
        return 0;
    size_t wanted = *capacity ? 2 * *capacity : 16;
    void *bigger = realloc(*array, wanted * item);
    if (!bigger)
        return -1;
    *array = bigger;
    *capacity = wanted;
    return 0;
}

static size_t page_size(void)
{
    return (size_t)sysconf(_SC_PAGESIZE);
}

/* Frees an arena no longer in the registry; keeps errno. */
static void arena_destroy(shm_arena *arena)
{
    int saved = errno;
    munmap(arena->data, arena->bytes);
    close(arena->fd);
    free(arena->bitmap);
    free(arena);
    errno = saved;
}

/* A new arena of `bytes` (carved into pages when `carved`), not yet in the
 * registry; NULL with errno set when the kernel or malloc refuses. */
static shm_arena *arena_create(size_t bytes, int carved)
{
    shm_arena *arena = calloc(1, sizeof *arena);
    if (!arena) {
        errno = ENOMEM;
        return NULL;
    }
    arena->fd = -1;
    arena->data = MAP_FAILED;
    arena->bytes = bytes;
    if (carved) {
        arena->pages = bytes / page_size();
        arena->bitmap = calloc((arena->pages + 63) / 64, sizeof *arena->bitmap);
        if (!arena->bitmap) {
            errno = ENOMEM;
            goto fail;
        }
    }
    arena->fd = memfd_create("fastload-slot", MFD_CLOEXEC);
    if (arena->fd < 0)
        goto fail;
    if (ftruncate(arena->fd, (off_t)bytes) != 0)
        goto fail;
    arena->data = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, arena->fd, 0);
    if (arena->data == MAP_FAILED)
        goto fail;
    return arena;

fail:;
    int saved = errno;
    if (arena->data != MAP_FAILED)
        munmap(arena->data, bytes);
    if (arena->fd >= 0)
        close(arena->fd);
    free(arena->bitmap);
    free(arena);
    errno = saved;
    return NULL;
}

static int page_used(const shm_arena *arena, size_t page)
{
    return (int)((arena->bitmap[page / 64] >> (page % 64)) & 1);
}

static void mark_pages(shm_arena *arena, size_t first, size_t count, int used)
{
    for (size_t p = first; p < first + count; p++) {
        if (used)
            arena->bitmap[p / 64] |= (uint64_t)1 << (p % 64);
        else
            arena->bitmap[p / 64] &= ~((uint64_t)1 << (p % 64));
    }
}

/* First fit: the first run of `count` free pages, or (size_t)-1. */
static size_t find_run(const shm_arena *arena, size_t count)
{
    size_t run = 0;
    for (size_t p = 0; p < arena->pages; p++) {
        if (arena->bitmap[p / 64] == UINT64_MAX && p % 64 == 0) {
            run = 0;
            p += 63;
            continue;
        }
        run = page_used(arena, p) ? 0 : run + 1;
        if (run == count)
            return p + 1 - count;
    }
    return (size_t)-1;
}

/* Records a region of `arena` at page `first` (carved arenas) or the whole
 * arena; returns its memory, or NULL (ENOMEM) when the registry cannot
 * grow.  Called with registry_lock held. */
static void *add_region(shm_arena *arena, size_t first, size_t bytes)
{
    if (grow((void **)&regions, &region_capacity, region_count, sizeof *regions) != 0) {
        errno = ENOMEM;
        return NULL;
    }
    unsigned char *data = arena->data + first * page_size();
    if (arena->bitmap)
        mark_pages(arena, first, bytes / page_size(), 1);
    arena->used++;
    regions[region_count++] = (shm_region){data, bytes, next_id++, arena};
    return data;
}

/* Adds `arena` to the registry; 0, or -1 (ENOMEM).  Lock held. */
static int add_arena(shm_arena *arena)
{
    if (grow((void **)&arenas, &arena_capacity, arena_count, sizeof *arenas) != 0) {
        errno = ENOMEM;
        return -1;
    }
    arena->id = next_id++;
    arenas[arena_count++] = arena;
    return 0;
}

/* Removes `arena` from the registry and records its id for the parent.
 * Lock held. */
static void drop_arena(shm_arena *arena)
{
    for (size_t i = 0; i < arena_count; i++) {
        if (arenas[i] == arena) {
            arenas[i] = arenas[--arena_count];
            break;
        }
    }
    /* A failed append only costs the parent a stale mapping until it
     * exits; the arena itself is freed either way. */
    if (grow((void **)&freed, &freed_capacity, freed_count, sizeof *freed) == 0)
        freed[freed_count++] = arena->id;
}

static void *alloc_carved(size_t bytes)
{
    size_t count = bytes / page_size();
    void *data = NULL;
    pthread_mutex_lock(&registry_lock);
    for (size_t i = 0; i < arena_count && !data; i++) {
        if (!arenas[i]->bitmap)
            continue;
        size_t first = find_run(arenas[i], count);
        if (first != (size_t)-1)
            data = add_region(arenas[i], first, bytes);
        if (!data && first != (size_t)-1) {
            pthread_mutex_unlock(&registry_lock);
            return NULL; /* the registry could not grow */
        }
    }
    pthread_mutex_unlock(&registry_lock);
    if (data)
        return data;

    /* No room: a new arena, made without the lock. */
    shm_arena *arena = arena_create(FL_SHM_ARENA_BYTES, 1);
    if (!arena)
        return NULL;
    pthread_mutex_lock(&registry_lock);
    if (add_arena(arena) == 0) {
        data = add_region(arena, 0, bytes);
        if (!data)
            arena_count--; /* just added, last: nothing else refers to it */
    }
    pthread_mutex_unlock(&registry_lock);
    if (!data)
        arena_destroy(arena);
    return data;
}

static void *alloc_alone(size_t bytes)
{
    shm_arena *arena = arena_create(bytes, 0);
    if (!arena)
        return NULL;
    void *data = NULL;
    pthread_mutex_lock(&registry_lock);
    if (add_arena(arena) == 0) {
        data = add_region(arena, 0, bytes);
        if (!data)
            arena_count--;
    }
    pthread_mutex_unlock(&registry_lock);
    if (!data)
        arena_destroy(arena);
    return data;
}

static void *shm_alloc(size_t bytes, void *ctx)
{
    (void)ctx;
    size_t page = page_size();
    if (bytes == 0)
        bytes = page;
    bytes = (bytes + page - 1) / page * page;
    return bytes <= FL_SHM_SMALL_BYTES ? alloc_carved(bytes) : alloc_alone(bytes);
}

static void shm_free(void *data, size_t bytes, void *ctx)
{
    (void)ctx;
    (void)bytes;
    shm_arena *dead = NULL;
    pthread_mutex_lock(&registry_lock);
    for (size_t i = 0; i < region_count; i++) {
        if (regions[i].data != data)
            continue;
        shm_region region = regions[i];
        regions[i] = regions[--region_count];
        shm_arena *arena = region.arena;
        if (arena->bitmap)
            mark_pages(arena, (size_t)(region.data - arena->data) / page_size(),
                       region.bytes / page_size(), 0);
        if (--arena->used == 0) {
            drop_arena(arena);
            dead = arena;
        }
        break;
    }
    pthread_mutex_unlock(&registry_lock);
    if (dead)
        arena_destroy(dead); /* unmapped and closed without the lock */
}

fl_slot_allocator fl_shm_allocator(void)
{
    return (fl_slot_allocator){.alloc = shm_alloc, .free = shm_free};
}

int fl_shm_lookup(const void *data, fl_shm_info *out)
{
    int status = FL_ERR_INVALID;
    pthread_mutex_lock(&registry_lock);
    for (size_t i = 0; i < region_count; i++) {
        if (regions[i].data == data) {
            shm_arena *arena = regions[i].arena;
            *out = (fl_shm_info){
                .fd = arena->fd,
                .arena_bytes = arena->bytes,
                .arena_id = arena->id,
                .slot_id = regions[i].id,
                .slot_offset = (size_t)(regions[i].data - arena->data),
                .slot_bytes = regions[i].bytes,
            };
            status = FL_OK;
            break;
        }
    }
    pthread_mutex_unlock(&registry_lock);
    return status;
}

size_t fl_shm_take_freed(uint64_t *ids, size_t max)
{
    pthread_mutex_lock(&registry_lock);
    size_t n = freed_count < max ? freed_count : max;
    for (size_t i = 0; i < n; i++)
        ids[i] = freed[freed_count - n + i];
    freed_count -= n;
    pthread_mutex_unlock(&registry_lock);
    return n;
}

void fl_shm_counts(size_t *arena_out, size_t *slot_out)
{
    pthread_mutex_lock(&registry_lock);
    if (arena_out)
        *arena_out = arena_count;
    if (slot_out)
        *slot_out = region_count;
    pthread_mutex_unlock(&registry_lock);
}
