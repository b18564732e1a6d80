/* fastload core: see forksafe.h. */
#include "core/engine/forksafe.h"

#include <stddef.h>

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static fl__fork_entry *registry_head; /* guarded by registry_lock */
static pthread_once_t handlers_once = PTHREAD_ONCE_INIT;
static int handlers_installed;

static void before_fork(void)
{
    pthread_mutex_lock(&registry_lock);
    for (fl__fork_entry *e = registry_head; e; e = e->next)
        pthread_mutex_lock(e->mutex);
}

static void after_fork_parent(void)
{
    for (fl__fork_entry *e = registry_head; e; e = e->next)
        pthread_mutex_unlock(e->mutex);
    pthread_mutex_unlock(&registry_lock);
}

static void after_fork_child(void)
{
    /* The child's only thread is the one that locked everything in
     * before_fork, so unlocking here is well defined. */
    for (fl__fork_entry *e = registry_head; e; e = e->next) {
        if (e->after_fork_child)
            e->after_fork_child(e->arg);
        pthread_mutex_unlock(e->mutex);
    }
    pthread_mutex_unlock(&registry_lock);
}

static void install_handlers(void)
{
    handlers_installed =
        pthread_atfork(before_fork, after_fork_parent, after_fork_child) == 0;
}

int fl__fork_register(fl__fork_entry *entry)
{
    pthread_once(&handlers_once, install_handlers);
    if (!handlers_installed)
        return -1;
    pthread_mutex_lock(&registry_lock);
    entry->prev = NULL;
    entry->next = registry_head;
    if (registry_head)
        registry_head->prev = entry;
    registry_head = entry;
    pthread_mutex_unlock(&registry_lock);
    return 0;
}

void fl__fork_unregister(fl__fork_entry *entry)
{
    pthread_mutex_lock(&registry_lock);
    if (entry->prev)
        entry->prev->next = entry->next;
    else if (registry_head == entry)
        registry_head = entry->next;
    if (entry->next)
        entry->next->prev = entry->prev;
    entry->prev = entry->next = NULL;
    pthread_mutex_unlock(&registry_lock);
}
