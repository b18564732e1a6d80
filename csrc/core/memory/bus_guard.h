/* fastload core: the bus-error guard — reads of memory-mapped files that
 * another process may shrink under us.
 *
 * A read of a mapped page past the end of its file (the file was truncated
 * or rewritten after it was mapped, or its storage failed) raises SIGBUS,
 * whose default action ends the process.  Every core read of mapped memory
 * that another process can shrink (the array gathers, LMDB lookups, the
 * sample cache, encoded images lying in a mapped Arrow table) runs inside
 * fl_guarded: a per-thread guard turns that signal into an FL_ERR_IO return
 * and the fault's address.
 *
 * The first guarded call installs a process-wide SIGBUS handler.  It acts
 * only on a fault raised by the kernel in a thread that is inside a guarded
 * region, and passes every other SIGBUS (another thread's, a signal sent
 * with kill, any fault outside a guard) to the handler installed before it,
 * or to the default action, which ends the process as before.  Where no
 * handler can be installed (a sanitizer keeping SIGBUS), the region runs
 * unguarded.
 *
 * The contract for a guarded function: the handler leaves it with a
 * siglongjmp, so it must hold nothing that the jump would leak or leave
 * locked — no mutex, no lock in shared memory, no GIL state, no allocation
 * it has not handed to its caller, no library call that does (so never a
 * decoder, never malloc).  Copy the mapped bytes out under the guard, then
 * work on the copy.  Guarded regions may nest; a fault returns to the
 * innermost.
 */
#ifndef FL_BUS_GUARD_H
#define FL_BUS_GUARD_H

#include <stddef.h>
#include <stdint.h>

/* Runs fn(arg) under this thread's guard.  Returns FL_OK, or FL_ERR_IO
 * when it raised a bus error: fn was then left at the faulting read, and
 * *fault_address (when not NULL) is the address read. */
int fl_guarded(void (*fn)(void *arg), void *arg, const void **fault_address);

/* memcpy(dst, src, n) under the guard: FL_OK, or FL_ERR_IO with
 * *fault_address set as fl_guarded does (dst then holds a partial copy). */
int fl_guarded_copy(void *dst, const void *src, size_t n, const void **fault_address);

/* The file mapped at `address` in this process (from /proc/self/maps):
 * 1 with its path in `path` (cut to path_size) and *mapped_to, the byte of
 * the file the mapping reaches to (its size when mapped, rounded up to a
 * page), else 0 (anonymous memory, or no mapping there any more). */
int fl_mapped_file(const void *address, char *path, size_t path_size, int64_t *mapped_to);

/* The message for a bus error at `address` while reading `what` (e.g.
 * "sample index 7", "dataset 'x'"): the file is `path` (NULL: the file
 * mapped at `address`, if any; with `address` NULL too, none), whose size
 * was `opened` bytes when opened (-1: not known); its size now is read
 * from `fd`, a descriptor of the mapped file itself (-1: by its path,
 * which may name another file by now).  Every "changed under the loader"
 * message, C's and Python's, is written here.  One of
 *   file changed under the loader: '<file>' is shorter than when it was
 *     opened (<what>; N bytes then, M now)
 *   file changed under the loader: '<file>' could not be read (<what>; a
 *     bus error: ...)
 *   memory changed under the loader: a bus error reading <what> (...)
 */
void fl_bus_fault_msg(char *msg, size_t msg_size, const char *path, int fd, int64_t opened,
                      const void *address, const char *what);

#endif /* FL_BUS_GUARD_H */
