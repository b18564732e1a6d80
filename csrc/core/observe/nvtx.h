/* fastload core: NVTX ranges for Nsight Systems, through the NVTX library
 * loaded at run time (libnvToolsExt.so.1), so fastload builds and runs
 * without it.
 *
 * While on, every worker job and every stage (stats.h) is a range on the
 * thread that runs it, named "fastload <stage>", and worker threads carry
 * their names into the timeline.  Off (the default, unless an NVTX tool
 * is attached, see fl_nvtx_auto), each call is one relaxed atomic load.
 */
#ifndef FL_NVTX_H
#define FL_NVTX_H

#include <stddef.h>

/* Loads the library (`path`, or libnvToolsExt.so.1 when NULL or empty)
 * and turns ranges on.  Returns 0, or -1 with the reason in msg. */
int fl_nvtx_start(const char *path, char *msg, size_t msg_size);

/* Turns ranges off (the library stays loaded). */
void fl_nvtx_stop(void);

/* Turns ranges on when a tool asks for NVTX (NVTX_INJECTION64_PATH is
 * set, as Nsight Systems does) and the library loads; else leaves them. */
void fl_nvtx_auto(void);

int fl_nvtx_on(void);
void fl_nvtx_push(const char *name);
void fl_nvtx_pop(void);
/* Names the calling thread in the timeline. */
void fl_nvtx_name_thread(const char *name);

#endif /* FL_NVTX_H */
