/* fastload core: see cuda_memory.h. */
#include "core/cuda/cuda_memory.h"

#include <stdint.h>
#include <stdlib.h>

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
    if (pthread_mutex_init(&range->lock, NULL) != 0)
        return FL_CU_ERROR_OUT_OF_MEMORY;
    fl_cu_result rc = fl_cuda_enter(cuda, ordinal);
    if (rc == 0) {
        rc = cuda->mem_host_register(data, bytes, FL_CU_MEMHOSTREGISTER_PORTABLE);
        fl_cuda_leave(cuda);
    }
    if (rc != 0)
        pthread_mutex_destroy(&range->lock);
    else
        range->lock_ready = 1;
    return rc;
}

/* The pending (or waited) fence of `key`, or NULL.  Holds range->lock. */
static fl_cuda_host_event *fence_of(fl_cuda_host_range *range, uint64_t key)
{
    for (size_t i = 0; i < range->count; i++)
        if (range->fences[i].state != FL_HOST_FENCE_FREE && range->fences[i].key == key)
            return &range->fences[i];
    return NULL;
}

/* A fence of the pool that is free, or pending but complete; grows the pool
 * when every one is still pending.  NULL when out of memory.  Holds
 * range->lock, in the range's context. */
static fl_cuda_host_event *free_fence_of(const fl_cuda *cuda, fl_cuda_host_range *range)
{
    for (size_t i = 0; i < range->count; i++) {
        fl_cuda_host_event *fence = &range->fences[i];
        if (fence->state == FL_HOST_FENCE_FREE ||
            (fence->state == FL_HOST_FENCE_PENDING && cuda->event_query(fence->event) == 0))
            return fence;
    }
    if (range->count == range->capacity) {
        size_t capacity = range->capacity ? 2 * range->capacity : 4;
        fl_cuda_host_event *grown = realloc(range->fences, capacity * sizeof *grown);
        if (!grown)
            return NULL;
        range->fences = grown;
        range->capacity = capacity;
    }
    fl_cuda_host_event *fence = &range->fences[range->count++];
    *fence = (fl_cuda_host_event){.state = FL_HOST_FENCE_FREE};
    return fence;
}

/* The reasoning of pinned_fence_on_release holds here too: the legacy
 * default stream follows every copy queued on it and on blocking streams. */
void fl_cuda_host_fence(const fl_cuda *cuda, fl_cuda_host_range *range, uint64_t key)
{
    if (fl_cuda_enter(cuda, range->ordinal) != 0)
        return; /* no context, so nothing of ours can be queued in it */
    fl_cu_result rc = FL_CU_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&range->lock);
    fl_cuda_host_event *fence = fence_of(range, key);
    if (fence && fence->state == FL_HOST_FENCE_WAITED)
        fence = NULL; /* (a slot released twice: cannot be; wait below) */
    else if (!fence)
        fence = free_fence_of(cuda, range);
    if (fence) {
        rc = fence->event ? 0 : cuda->event_create(&fence->event, FL_CU_EVENT_DISABLE_TIMING);
        if (rc == 0)
            rc = cuda->event_record(fence->event, FL_CU_STREAM_LEGACY);
        if (rc == 0) {
            fence->key = key;
            fence->state = FL_HOST_FENCE_PENDING;
        } else {
            fence->state = FL_HOST_FENCE_FREE;
        }
    }
    pthread_mutex_unlock(&range->lock);
    if (rc != 0)
        cuda->stream_synchronize(FL_CU_STREAM_LEGACY); /* no fence: wait here */
    fl_cuda_leave(cuda);
}

fl_cu_result fl_cuda_host_fence_query(const fl_cuda *cuda, fl_cuda_host_range *range,
                                      uint64_t key)
{
    fl_cu_result rc = fl_cuda_enter(cuda, range->ordinal);
    if (rc != 0)
        return rc;
    pthread_mutex_lock(&range->lock);
    fl_cuda_host_event *fence = fence_of(range, key);
    if (fence && fence->state == FL_HOST_FENCE_WAITED)
        rc = FL_CU_ERROR_NOT_READY; /* another thread waits for it */
    else if (fence) {
        rc = cuda->event_query(fence->event);
        if (rc == 0)
            fence->state = FL_HOST_FENCE_FREE;
    }
    pthread_mutex_unlock(&range->lock);
    fl_cuda_leave(cuda);
    return rc;
}

fl_cu_result fl_cuda_host_fence_wait(const fl_cuda *cuda, fl_cuda_host_range *range,
                                     uint64_t key)
{
    fl_cu_result rc = fl_cuda_enter(cuda, range->ordinal);
    if (rc != 0)
        return rc;
    /* Waited for outside the lock: the fence, marked WAITED, is neither
     * reused nor destroyed meanwhile (the pool may move: keep its index). */
    pthread_mutex_lock(&range->lock);
    fl_cuda_host_event *fence = fence_of(range, key);
    fl_cu_event event = NULL;
    size_t index = 0;
    if (fence && fence->state == FL_HOST_FENCE_PENDING) {
        fence->state = FL_HOST_FENCE_WAITED;
        event = fence->event;
        index = (size_t)(fence - range->fences);
    }
    pthread_mutex_unlock(&range->lock);
    if (event) {
        rc = cuda->event_synchronize(event);
        pthread_mutex_lock(&range->lock);
        range->fences[index].state = FL_HOST_FENCE_FREE;
        pthread_mutex_unlock(&range->lock);
    }
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
    for (size_t i = 0; i < range->count; i++) {
        fl_cuda_host_event *fence = &range->fences[i];
        if (fence->state != FL_HOST_FENCE_FREE) {
            fl_cu_result synced = cuda->event_synchronize(fence->event);
            if (rc == 0)
                rc = synced;
        }
        if (fence->event)
            cuda->event_destroy(fence->event);
    }
    free(range->fences);
    range->fences = NULL;
    range->count = range->capacity = 0;
    if (range->lock_ready) {
        pthread_mutex_destroy(&range->lock);
        range->lock_ready = 0;
    }
    fl_cu_result unregistered = cuda->mem_host_unregister(range->data);
    fl_cuda_leave(cuda);
    return rc != 0 ? rc : unregistered;
}
