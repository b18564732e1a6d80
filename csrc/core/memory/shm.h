/* fastload core: shared slots — batch memory a parent process can map.
 *
 * A process worker collates each batch into a slot whose memory comes from
 * this allocator, mapped MAP_SHARED from a memfd, so the parent maps the
 * same pages (it receives the descriptor once per memfd) and wraps the batch
 * without a copy.
 *
 * Descriptors are the scarce resource, not memory: a process may have only
 * RLIMIT_NOFILE of them (often 1024, sometimes 100), and a loop that keeps
 * its batches alive keeps their slots.  So a slot is a *region* of an
 * *arena*, one memfd:
 *
 *  - a small slot (capacity up to FL_SHM_SMALL_BYTES) is carved, at page
 *    granularity, from a shared arena of FL_SHM_ARENA_BYTES (sparse: only
 *    pages a region has used hold memory, unless a process page-locks the
 *    mapping: the parent's pin_memory registration faults in and locks the
 *    whole arena, FL_SHM_ARENA_BYTES per arena), so thousands of small held
 *    batches cost one descriptor;
 *  - a larger slot is an arena of its own.
 *
 * An arena lives while any region of it does.  Regions and arenas each get
 * an id unique within the process, never reused: the parent keys its
 * mappings by arena id and returns freed slots by region id.  The registry
 * maps a region's address back to both, and remembers the ids of arenas
 * freed since it was last asked, so the parent can unmap them.  All calls are
 * thread-safe.
 */
#ifndef FL_SHM_H
#define FL_SHM_H

#include <stddef.h>
#include <stdint.h>

#include "core/memory/slots.h"

/* Slots up to this capacity share arenas; larger ones get their own. */
#define FL_SHM_SMALL_BYTES ((size_t)1 << 20)
/* The size of a shared arena (virtual: its pages are allocated on use, or
 * all at once where a process page-locks its mapping). */
#define FL_SHM_ARENA_BYTES ((size_t)32 << 20)

typedef struct fl_shm_info {
    int fd;               /* the arena's memfd; stays owned by the allocator */
    size_t arena_bytes;   /* the arena's size (what the parent maps) */
    uint64_t arena_id;    /* unique within this process, never reused */
    uint64_t slot_id;     /* the region's id: unique, never reused */
    size_t slot_offset;   /* where the region starts in the arena */
    size_t slot_bytes;    /* the region's size (the slot's capacity) */
} fl_shm_info;

/* The allocator for fl_slot_pool_new.  Its alloc fails (NULL) when the
 * kernel refuses a memfd or a mapping, leaving errno as the kernel set it
 * (EMFILE or ENFILE: out of descriptors; ENOMEM) or ENOMEM. */
fl_slot_allocator fl_shm_allocator(void);

/* Fills *out for the shared slot whose memory starts at `data`.  Returns
 * FL_OK, or FL_ERR_INVALID when `data` is not such a slot. */
int fl_shm_lookup(const void *data, fl_shm_info *out);

/* Moves up to `max` ids of arenas freed since the last call into `ids`;
 * returns how many (call again while it returns `max`). */
size_t fl_shm_take_freed(uint64_t *ids, size_t max);

/* The arenas (each one open descriptor) and the slots live in this process
 * now (either pointer may be NULL). */
void fl_shm_counts(size_t *arenas, size_t *slots);

#endif /* FL_SHM_H */
