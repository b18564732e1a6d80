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
 * process worker's shared slot.  It is registered once and reused batch
 * after batch, like a pinned slot, and carries the same release fence: an
 * event on the legacy default stream, recorded when the batch over it is
 * released and completed before the memory is written again. */
typedef struct fl_cuda_host_range {
    void *data;        /* page-aligned start of the registered range */
    size_t bytes;
    int ordinal;       /* the device whose primary context registered it */
    fl_cu_event fence; /* owned; NULL until the first release */
} fl_cuda_host_range;

/* Registers [data, data + bytes) in device `ordinal`'s primary context and
 * fills *range.  Returns 0, or the driver's error; FL_CU_ERROR_NOT_SUPPORTED
 * when the driver lacks cuMemHostRegister. */
fl_cu_result fl_cuda_host_register(const fl_cuda *cuda, fl_cuda_host_range *range, void *data,
                                   size_t bytes, int ordinal);

/* Records the range's fence on the legacy default stream (creating its event
 * on first use); when that fails, waits for that stream here instead, so the
 * range is safe to reuse either way.  Call as the last reader lets go. */
void fl_cuda_host_fence(const fl_cuda *cuda, fl_cuda_host_range *range);

/* 0 when the fence has completed (or was never recorded),
 * FL_CU_ERROR_NOT_READY while it is pending, else the driver's error. */
fl_cu_result fl_cuda_host_fence_query(const fl_cuda *cuda, const fl_cuda_host_range *range);

/* Blocks until the fence has completed (0, or the driver's error). */
fl_cu_result fl_cuda_host_fence_wait(const fl_cuda *cuda, const fl_cuda_host_range *range);

/* Waits for the fence and destroys it, then unregisters the range, which
 * must still be mapped.  Returns 0 or the first error; call once. */
fl_cu_result fl_cuda_host_unregister(const fl_cuda *cuda, fl_cuda_host_range *range);

#endif /* FL_CUDA_MEMORY_H */
