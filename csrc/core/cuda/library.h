/* fastload core: finding and opening a CUDA library (nvJPEG, NVRTC) at run
 * time, in one order for all of them.
 *
 * 1. $<env> when set (the tests' stand-ins): that file only.
 * 2. A copy already loaded in the process (dlopen RTLD_NOLOAD of each
 *    soname): torchvision loads libnvjpeg, torch loads libnvrtc; a second
 *    copy of the same library would double its start-up and memory.
 * 3. Each candidate folder fastload's Python side found (the nvidia-*
 *    wheels' lib folders, the CUDA toolkit's), each soname in it.
 * 4. Each soname through the dynamic linker's own search.
 */
#ifndef FL_CUDA_LIBRARY_H
#define FL_CUDA_LIBRARY_H

#include <stddef.h>

/* Opens the library (RTLD_NOW | RTLD_LOCAL).  `sonames` and `folders` are
 * NULL-terminated lists (`folders` may be NULL).  On success returns the
 * dlopen handle, with the file it came from in `path` (from dladdr of
 * `probe_symbol`, else the name that was opened).  On failure returns NULL
 * with the reason in `why` (every place tried and the last dlerror). */
void *fl__cuda_library_open(const char *env, const char *const *sonames,
                            const char *const *folders, const char *probe_symbol, char *path,
                            size_t path_size, char *why, size_t why_size);

#endif /* FL_CUDA_LIBRARY_H */
