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

#include "cuda.h"
#include "slots.h"

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

#endif /* FL_CUDA_MEMORY_H */
