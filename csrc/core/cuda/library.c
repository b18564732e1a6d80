/* fastload core: see library.h. */
#define _GNU_SOURCE
#include "core/cuda/library.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

/* Where the handle's code lives: dladdr of one of its symbols names the
 * file the dynamic linker actually mapped (after symlinks and searches). */
static void describe(void *lib, const char *probe_symbol, const char *opened, char *path,
                     size_t path_size)
{
    Dl_info info;
    void *symbol = probe_symbol ? dlsym(lib, probe_symbol) : NULL;
    if (symbol && dladdr(symbol, &info) && info.dli_fname && *info.dli_fname)
        opened = info.dli_fname;
    snprintf(path, path_size, "%s", opened);
}

void *fl__cuda_library_open(const char *env, const char *const *sonames,
                            const char *const *folders, const char *probe_symbol, char *path,
                            size_t path_size, char *why, size_t why_size)
{
    const char *named = env ? getenv(env) : NULL;
    if (named && *named) {
        void *lib = dlopen(named, RTLD_NOW | RTLD_LOCAL);
        if (!lib) {
            snprintf(why, why_size, "cannot load %s=%s (%s)", env, named, dlerror());
            return NULL;
        }
        describe(lib, probe_symbol, named, path, path_size);
        return lib;
    }
    for (size_t i = 0; sonames[i]; i++) {
        void *lib = dlopen(sonames[i], RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
        if (lib) {
            describe(lib, probe_symbol, sonames[i], path, path_size);
            return lib;
        }
    }
    char file[4096];
    for (size_t f = 0; folders && folders[f]; f++) {
        for (size_t i = 0; sonames[i]; i++) {
            int n = snprintf(file, sizeof file, "%s/%s", folders[f], sonames[i]);
            if (n < 0 || (size_t)n >= sizeof file)
                continue;
            void *lib = dlopen(file, RTLD_NOW | RTLD_LOCAL);
            if (lib) {
                describe(lib, probe_symbol, file, path, path_size);
                return lib;
            }
        }
    }
    const char *last = "";
    for (size_t i = 0; sonames[i]; i++) {
        void *lib = dlopen(sonames[i], RTLD_NOW | RTLD_LOCAL);
        if (lib) {
            describe(lib, probe_symbol, sonames[i], path, path_size);
            return lib;
        }
        const char *e = dlerror();
        if (e)
            last = e;
    }
    size_t folder_count = 0;
    while (folders && folders[folder_count])
        folder_count++;
    char names[256] = "";
    for (size_t i = 0, used = 0; sonames[i] && used < sizeof names; i++) {
        int n = snprintf(names + used, sizeof names - used, "%s%s", i ? ", " : "", sonames[i]);
        if (n < 0)
            break;
        used += (size_t)n;
    }
    snprintf(why, why_size, "none of %s found (a loaded copy, %zu candidate folder(s), the "
             "linker's search; last error: %s)", names, folder_count, last);
    return NULL;
}
