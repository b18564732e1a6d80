/* fastload core: see cuda_memory.h. */
#include "cuda_memory.h"

#include <stdint.h>

static _Thread_local fl_cu_result alloc_error;

fl_cu_result fl_cuda_alloc_error(void)
{
    return alloc_error;
}

static int ordinal_of(void *ctx)
{
    return (int)(intptr_t)ctx;
}

/* The driver, entered into the context of `ctx`'s device; NULL (with
 * alloc_error set) when that is impossible, e.g. in a forked child. */
static const fl_cuda *enter(void *ctx)
{
    const fl_cuda *cuda = fl_cuda_get(NULL);
    if (!cuda) {
        alloc_error = 0;
        return NULL;
    }
    fl_cu_result rc = fl_cuda_enter(cuda, ordinal_of(ctx));
    if (rc != 0) {
        alloc_error = rc;
        return NULL;
    }
    return cuda;
}

static void *pinned_alloc(size_t bytes, void *ctx)
{
    const fl_cuda *cuda = enter(ctx);
    if (!cuda)
        return NULL;
    void *p = NULL;
    alloc_error = cuda->mem_host_alloc(&p, bytes, FL_CU_MEMHOSTALLOC_PORTABLE);
    fl_cuda_leave(cuda);
    return alloc_error == 0 ? p : NULL;
}

static void pinned_free(void *data, size_t bytes, void *ctx)
{
    (void)bytes;
    const fl_cuda *cuda = enter(ctx);
    if (!cuda)
        return;
    cuda->mem_free_host(data);
    fl_cuda_leave(cuda);
}

/* A pinned batch may be freed while a non-blocking copy from it is still
 * queued (`batch.to("cuda", non_blocking=True)`, then the loop moves on):
 * torch guards only its own pinned memory.  So a released pinned slot gets
 * a fence on the legacy default stream, which follows all work queued
 * before it on the default and other blocking streams, and a worker waits
 * for it before writing the slot again (at once, in the usual case). */
static void pinned_fence_on_release(fl_slot *slot, void *ctx)
{
    const fl_cuda *cuda = enter(ctx);
    if (!cuda)
        return;
    if (fl_cuda_fence(cuda, slot, FL_CU_STREAM_LEGACY) != 0)
        cuda->stream_synchronize(FL_CU_STREAM_LEGACY); /* no fence: wait here */
    fl_cuda_leave(cuda);
}

static void pinned_fence_before_reuse(fl_slot *slot, void *ctx)
{
    const fl_cuda *cuda = enter(ctx);
    if (!cuda)
        return;
    cuda->event_synchronize(slot->fence);
    fl_cuda_leave(cuda);
}

static void free_fence(void *fence, void *ctx)
{
    const fl_cuda *cuda = enter(ctx);
    if (!cuda)
        return;
    cuda->event_destroy(fence);
    fl_cuda_leave(cuda);
}

static void *device_alloc(size_t bytes, void *ctx)
{
    const fl_cuda *cuda = enter(ctx);
    if (!cuda)
        return NULL;
    fl_cu_deviceptr p = 0;
    alloc_error = cuda->mem_alloc(&p, bytes);
    fl_cuda_leave(cuda);
    return alloc_error == 0 ? (void *)(size_t)p : NULL;
}

static void device_free(void *data, size_t bytes, void *ctx)
{
    (void)bytes;
    const fl_cuda *cuda = enter(ctx);
    if (!cuda)
        return;
    cuda->mem_free((fl_cu_deviceptr)(size_t)data);
    fl_cuda_leave(cuda);
}

fl_slot_allocator fl_cuda_pinned_allocator(int ordinal, int fenced)
{
    fl_slot_allocator a = {.alloc = pinned_alloc, .free = pinned_free,
                           .free_fence = free_fence, .ctx = (void *)(intptr_t)ordinal};
    if (fenced) {
        a.fence_on_release = pinned_fence_on_release;
        a.fence_before_reuse = pinned_fence_before_reuse;
    }
    return a;
}

fl_slot_allocator fl_cuda_device_allocator(int ordinal)
{
    return (fl_slot_allocator){.alloc = device_alloc, .free = device_free,
                               .free_fence = free_fence,
                               .ctx = (void *)(intptr_t)ordinal};
}

fl_cu_result fl_cuda_fence(const fl_cuda *cuda, fl_slot *slot, fl_cu_stream stream)
{
    if (!slot->fence) {
        fl_cu_event event = NULL;
        fl_cu_result rc = cuda->event_create(&event, FL_CU_EVENT_DISABLE_TIMING);
        if (rc != 0)
            return rc;
        slot->fence = event;
    }
    return cuda->event_record(slot->fence, stream);
}

fl_cu_result fl_cuda_after_fence(const fl_cuda *cuda, const fl_slot *slot, fl_cu_stream stream)
{
    return slot->fence ? cuda->stream_wait_event(stream, slot->fence, 0) : 0;
}

/* ------------------------------------------------------ registered memory */

fl_cu_result fl_cuda_host_register(const fl_cuda *cuda, fl_cuda_host_range *range, void *data,
                                   size_t bytes, int ordinal)
{
    *range = (fl_cuda_host_range){.data = data, .bytes = bytes, .ordinal = ordinal};
    if (!cuda->mem_host_register)
        return FL_CU_ERROR_NOT_SUPPORTED;
    fl_cu_result rc = fl_cuda_enter(cuda, ordinal);
    if (rc != 0)
        return rc;
    rc = cuda->mem_host_register(data, bytes, FL_CU_MEMHOSTREGISTER_PORTABLE);
    fl_cuda_leave(cuda);
    return rc;
}

/* The reasoning of pinned_fence_on_release holds here too: the legacy
 * default stream follows every copy queued on it and on blocking streams. */
void fl_cuda_host_fence(const fl_cuda *cuda, fl_cuda_host_range *range)
{
    if (fl_cuda_enter(cuda, range->ordinal) != 0)
        return; /* no context, so nothing of ours can be queued in it */
    fl_cu_result rc = 0;
    if (!range->fence)
        rc = cuda->event_create(&range->fence, FL_CU_EVENT_DISABLE_TIMING);
    if (rc == 0)
        rc = cuda->event_record(range->fence, FL_CU_STREAM_LEGACY);
    if (rc != 0)
        cuda->stream_synchronize(FL_CU_STREAM_LEGACY); /* no fence: wait here */
    fl_cuda_leave(cuda);
}

fl_cu_result fl_cuda_host_fence_query(const fl_cuda *cuda, const fl_cuda_host_range *range)
{
    if (!range->fence)
        return 0;
    fl_cu_result rc = fl_cuda_enter(cuda, range->ordinal);
    if (rc != 0)
        return rc;
    rc = cuda->event_query(range->fence);
    fl_cuda_leave(cuda);
    return rc;
}

fl_cu_result fl_cuda_host_fence_wait(const fl_cuda *cuda, const fl_cuda_host_range *range)
{
    if (!range->fence)
        return 0;
    fl_cu_result rc = fl_cuda_enter(cuda, range->ordinal);
    if (rc != 0)
        return rc;
    rc = cuda->event_synchronize(range->fence);
    fl_cuda_leave(cuda);
    return rc;
}

fl_cu_result fl_cuda_host_unregister(const fl_cuda *cuda, fl_cuda_host_range *range)
{
    fl_cu_result rc = fl_cuda_enter(cuda, range->ordinal);
    if (rc != 0)
        return rc;
    /* A copy still queued from the range would read memory that is about
     * to be unmapped: let it finish first. */
    if (range->fence) {
        rc = cuda->event_synchronize(range->fence);
        cuda->event_destroy(range->fence);
        range->fence = NULL;
    }
    fl_cu_result unregistered = cuda->mem_host_unregister(range->data);
    fl_cuda_leave(cuda);
    return rc != 0 ? rc : unregistered;
}
