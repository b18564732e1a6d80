/* fastload core: status codes shared by every core component.
 *
 * Core calls return FL_OK (0) or a negative fl_status.  They never print; a
 * caller that needs words gets them from fl_status_str() or from the message
 * buffer of the job that failed.  This header, like all of csrc/core/, never
 * includes Python.h.
 */
#ifndef FL_STATUS_H
#define FL_STATUS_H

#include <stddef.h>

typedef enum fl_status {
    FL_OK = 0,
    FL_ERR_NOMEM = -1,       /* an allocation failed */
    FL_ERR_INVALID = -2,     /* a caller broke a documented precondition */
    FL_ERR_THREAD = -3,      /* a thread could not be created */
    FL_ERR_TIMEOUT = -4,     /* a bounded wait ran out */
    FL_ERR_FULL = -5,        /* no room: the in-flight bound is reached */
    FL_ERR_EMPTY = -6,       /* nothing to deliver and nothing in flight */
    FL_ERR_NO_WORKER = -7,   /* every worker has retired */
    FL_ERR_CLOSED = -8,      /* the engine was stopped, or belongs to the parent of a fork */
    FL_ERR_IO = -9,          /* reading input failed */
    FL_ERR_DECODE = -10,     /* input bytes are malformed */
    FL_ERR_TOO_BIG = -11,    /* a size limit was exceeded */
    FL_ERR_CHANGED = -12,    /* a mapped file shrank under the read (a bus
                                error, bus_guard.h); the message names it */
    FL_ERR_FDS = -13,        /* out of file descriptors (EMFILE, ENFILE) */
    FL_ERR_AFFINITY = -14,   /* the kernel refused a thread's CPU affinity mask */
} fl_status;

/* A short, static English description of a status. */
const char *fl_status_str(int status);

/* printf into a caller's message buffer (nothing when msg is NULL or size 0). */
void fl_set_msg(char *msg, size_t size, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif /* FL_STATUS_H */
