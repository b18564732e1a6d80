/* fastload core: keeping locks usable across fork().
 *
 * A forked child has only the thread that called fork(); a mutex some other
 * thread held at that moment would stay locked forever in the child.  Each
 * component registers its mutex here: before fork() every registered mutex is
 * locked (so none is mid-critical-section), and both parent and child unlock
 * them afterwards; the child then runs the component's after_fork_child hook
 * (with the mutex held, so the hook can reset state such as "threads alive").
 *
 * Lock order: the registry lock, then the registered mutexes, one after the
 * other.  So no code may hold two registered mutexes at once, nor call
 * fl__fork_register/_unregister while holding one.
 */
#ifndef FL_FORKSAFE_H
#define FL_FORKSAFE_H

#include <pthread.h>

typedef struct fl__fork_entry {
    pthread_mutex_t *mutex;             /* locked around fork() */
    void (*after_fork_child)(void *arg);  /* may be NULL; runs in the child */
    void *arg;
    struct fl__fork_entry *prev, *next; /* registry links; guarded by the registry lock */
} fl__fork_entry;

/* Adds `entry` (owned by the caller, alive until unregistered).  Returns 0,
 * or -1 when the fork handlers could not be installed. */
int fl__fork_register(fl__fork_entry *entry);
void fl__fork_unregister(fl__fork_entry *entry);

#endif /* FL_FORKSAFE_H */
