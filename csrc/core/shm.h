/* fastload core: shared slots — batch memory a parent process can map.
 *
 * A process worker collates each batch into a slot whose memory comes from
 * this allocator: every slot is its own memfd, mapped MAP_SHARED, so the
 * parent maps the same pages (it receives the descriptor once per slot) and
 * wraps the batch without a copy.  Slots are recycled by the pool as usual;
 * a registry maps a slot's address back to its descriptor and to an id
 * unique within the process, which keys the parent's mapping, and remembers
 * the ids of slots freed since it was last asked, so the parent can unmap
 * them.  All calls are thread-safe.
 */
#ifndef FL_SHM_H
#define FL_SHM_H

#include <stddef.h>
#include <stdint.h>

#include "slots.h"

typedef struct fl_shm_info {
    int fd;         /* the slot's memfd; stays owned by the allocator */
    size_t bytes;   /* its size (the slot's capacity) */
    uint64_t id;    /* unique within this process, never reused */
} fl_shm_info;

/* The allocator for fl_slot_pool_new.  Its alloc fails (NULL) when the
 * kernel refuses a memfd or a mapping. */
fl_slot_allocator fl_shm_allocator(void);

/* Fills *out for the shared slot whose memory starts at `data`.  Returns
 * FL_OK, or FL_ERR_INVALID when `data` is not such a slot. */
int fl_shm_lookup(const void *data, fl_shm_info *out);

/* Moves up to `max` ids of slots freed since the last call into `ids`;
 * returns how many (call again while it returns `max`). */
size_t fl_shm_take_freed(uint64_t *ids, size_t max);

#endif /* FL_SHM_H */
