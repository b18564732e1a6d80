/* fastload core: see status.h. */
#include "core/status.h"

#include <stdarg.h>
#include <stdio.h>

const char *fl_status_str(int status)
{
    switch (status) {
    case FL_OK: return "ok";
    case FL_ERR_NOMEM: return "out of memory";
    case FL_ERR_INVALID: return "invalid argument";
    case FL_ERR_THREAD: return "could not start a thread";
    case FL_ERR_TIMEOUT: return "timed out";
    case FL_ERR_FULL: return "too many batches in flight";
    case FL_ERR_EMPTY: return "nothing in flight";
    case FL_ERR_NO_WORKER: return "every worker has finished";
    case FL_ERR_CLOSED: return "the loader was shut down, or created before fork()";
    case FL_ERR_IO: return "input/output error";
    case FL_ERR_DECODE: return "malformed input";
    case FL_ERR_TOO_BIG: return "size limit exceeded";
    case FL_ERR_CHANGED: return "a mapped file changed under the loader";
    case FL_ERR_FDS: return "too many open files";
    case FL_ERR_AFFINITY: return "the CPU affinity was refused";
    default: return "unknown error";
    }
}

void fl_set_msg(char *msg, size_t size, const char *fmt, ...)
{
    if (!msg || size == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, size, fmt, ap);
    va_end(ap);
}
