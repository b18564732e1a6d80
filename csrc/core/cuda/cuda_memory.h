/* fastload core: CUDA memory behind the slot pool.
 *
 * Pinned slots are page-locked host memory from cuMemHostAlloc (portable: a
 * copy from them is a DMA in any context), allocated once and recycled by
 * the pool like any slot, never pinned per batch.  Device slots are
 * cuMemAlloc buffers an upload copies a batch into.
 *
 * Either kind may be released while the GPU still reads it.  A device slot
 * may have kernels queued on the consumer's stream: fl_cuda_fence records an
 * event there (the slot's fence) before the release, and the next upload
 * into the slot waits for it on the GPU (fl_cuda_after_fence), so the host
 * never blocks.  A pinned slot may have a non-blocking copy queued: the
 * allocator fences it on release and the next writer waits on the host.
 *
 * Allocators keep working after fork() in the sense that matters: a child
 * cannot use CUDA, so they fail to allocate and never call the driver to
 * free (the child's copy of the memory is simply dropped with it).
 */
#ifndef FL_CUDA_MEMORY_H
#define FL_CUDA_MEMORY_H

#include <pthread.h>
#include <stdint.h>

#include "core/cuda/cuda.h"
#include "core/memory/slots.h"

#define FL_CU_ERROR_NOT_SUPPORTED 801

/* Allocators for fl_slot_pool_new, bound to device `ordinal`'s primary
 * context; they fail (NULL) when the driver is not loaded.  Pinned slots are
 * `fenced` when they are handed to user code, which may copy from them
 * asynchronously; slots only fastload's upload stage reads (it releases them
 * once its copy is done) need no fence, and one on the default stream would
 * make workers wait for the training step queued there. */
fl_slot_allocator fl_cuda_pinned_allocator(int ordinal, int fenced);
fl_slot_allocator fl_cuda_device_allocator(int ordinal);

/* The driver's error behind this thread's last failed CUDA allocation
 * (0 when the failure was not the driver's, e.g. no driver). */
fl_cu_result fl_cuda_alloc_error(void);

/* Device address of a device slot's memory. */
static inline fl_cu_deviceptr fl_cuda_slot_address(const fl_slot *slot)
{
    return (fl_cu_deviceptr)(unsigned long long)(size_t)slot->data;
}

/* Records `slot`'s fence on `stream` (creating its event on first use); to
 * be called, with device `ordinal`'s context current, just before the slot
 * is released by its last reader. */
fl_cu_result fl_cuda_fence(const fl_cuda *cuda, fl_slot *slot, fl_cu_stream stream);

/* Makes `stream` wait for `slot`'s fence, if it has one; call before
 * writing into a reused slot (context current). */
fl_cu_result fl_cuda_after_fence(const fl_cuda *cuda, const fl_slot *slot, fl_cu_stream stream);

/* Host memory page-locked where it lies (cuMemHostRegister, portable), for
 * memory fastload maps but did not allocate: the parent's mapping of a
 * process worker's shared arena.  It is registered once and reused batch
 * after batch, like a pinned slot.  Many slots (regions) of one arena share
 * the registration, and each released one needs its own release fence: an
 * event on the legacy default stream, recorded when the batch over that slot
 * is released, completed before that slot is written again.  One event per
 * range would make every slot wait for the newest release, so the range
 * keeps a small pool of events keyed by slot id, each reused once complete
 * (the pool grows to the slots whose fences are pending at once). */
enum { FL_HOST_FENCE_FREE, FL_HOST_FENCE_PENDING, FL_HOST_FENCE_WAITED };

typedef struct fl_cuda_host_event {
    uint64_t key;       /* the slot whose release it fences, while pending */
    fl_cu_event event;  /* owned; created on first use */
    int state;          /* FL_HOST_FENCE_FREE, _PENDING or _WAITED (being synchronized) */
} fl_cuda_host_event;

typedef struct fl_cuda_host_range {
    void *data;        /* page-aligned start of the registered range */
    size_t bytes;
    int ordinal;       /* the device whose primary context registered it */
    pthread_mutex_t lock;        /* guards fences, count, capacity */
    int lock_ready;              /* lock was initialized (registered) */
    fl_cuda_host_event *fences;  /* owned (malloc); count used of capacity */
    size_t count, capacity;
} fl_cuda_host_range;

/* Registers [data, data + bytes) in device `ordinal`'s primary context and
 * fills *range.  Returns 0, or the driver's error; FL_CU_ERROR_NOT_SUPPORTED
 * when the driver lacks cuMemHostRegister. */
fl_cu_result fl_cuda_host_register(const fl_cuda *cuda, fl_cuda_host_range *range, void *data,
                                   size_t bytes, int ordinal);

/* Records the fence of the slot `key` (the last array over it is gone) on
 * the legacy default stream, with an event of the range's pool that is free
 * or complete; when no event can be had or recorded, waits for that stream
 * here instead, so the slot is safe to reuse either way.  Thread-safe. */
void fl_cuda_host_fence(const fl_cuda *cuda, fl_cuda_host_range *range, uint64_t key);

/* 0 when the fence of slot `key` has completed (or none is pending),
 * FL_CU_ERROR_NOT_READY while it is pending, else the driver's error.
 * A completed fence's event goes back to the pool.  Thread-safe. */
fl_cu_result fl_cuda_host_fence_query(const fl_cuda *cuda, fl_cuda_host_range *range,
                                      uint64_t key);

/* Blocks until the fence of slot `key` has completed (0, or the driver's
 * error); its event goes back to the pool.  Thread-safe. */
fl_cu_result fl_cuda_host_fence_wait(const fl_cuda *cuda, fl_cuda_host_range *range,
                                     uint64_t key);

/* Waits for every pending fence and destroys the events, then unregisters
 * the range, which must still be mapped.  Returns 0 or the first error; call
 * once, when no other thread can use the range. */
fl_cu_result fl_cuda_host_unregister(const fl_cuda *cuda, fl_cuda_host_range *range);

#endif /* FL_CUDA_MEMORY_H */
