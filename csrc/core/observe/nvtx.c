/* fastload core: NVTX ranges (see nvtx.h). */
#define _GNU_SOURCE /* gettid */
#include "core/observe/nvtx.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

/* NVTX's C API (nvToolsExt.h, version 2 and later). */
typedef int (*range_push_fn)(const char *message);
typedef int (*range_pop_fn)(void);
typedef void (*name_thread_fn)(uint32_t thread_id, const char *name);

static pthread_mutex_t load_lock = PTHREAD_MUTEX_INITIALIZER;
static range_push_fn range_push;
static range_pop_fn range_pop;
static name_thread_fn name_thread;
static atomic_int on;

int fl_nvtx_start(const char *path, char *msg, size_t msg_size)
{
    if (!path || !*path)
        path = "libnvToolsExt.so.1";
    pthread_mutex_lock(&load_lock);
    int rc = 0;
    if (!range_push) {
        /* The copy already loaded (torch's CUDA build loads one) first. */
        void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
        if (!lib)
            lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        if (!lib) {
            snprintf(msg, msg_size, "cannot load the NVTX library (%s)", dlerror());
            rc = -1;
            goto out;
        }
        range_push_fn push = (range_push_fn)dlsym(lib, "nvtxRangePushA");
        range_pop_fn pop = (range_pop_fn)dlsym(lib, "nvtxRangePop");
        name_thread = (name_thread_fn)dlsym(lib, "nvtxNameOsThreadA");
        if (!push || !pop) {
            snprintf(msg, msg_size, "%s has no nvtxRangePushA/nvtxRangePop", path);
            dlclose(lib);
            name_thread = NULL;
            rc = -1;
            goto out;
        }
        range_pop = pop;
        range_push = push; /* last: on is set only once both are */
    }
    atomic_store(&on, 1);
out:
    pthread_mutex_unlock(&load_lock);
    return rc;
}

void fl_nvtx_stop(void)
{
    atomic_store(&on, 0);
}

void fl_nvtx_auto(void)
{
    const char *tool = getenv("NVTX_INJECTION64_PATH");
    char msg[256];
    if (tool && *tool)
        (void)fl_nvtx_start(getenv("FASTLOAD_LIBNVTX"), msg, sizeof msg);
}

int fl_nvtx_on(void)
{
    return atomic_load_explicit(&on, memory_order_acquire); /* the pointers are set before */
}

void fl_nvtx_push(const char *name)
{
    range_push(name);
}

void fl_nvtx_pop(void)
{
    range_pop();
}

void fl_nvtx_name_thread(const char *name)
{
    if (fl_nvtx_on() && name_thread)
        name_thread((uint32_t)gettid(), name);
}
