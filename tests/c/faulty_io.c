/* An LD_PRELOAD shim that makes file reads fail on purpose, for the
 * fault-injection tests (tests/test_faults.py).
 *
 * For paths containing "fault-eio" read() fails with EIO; "fault-eacces"
 * makes open() fail with EACCES (root ignores permission bits, so chmod
 * cannot test this); "fault-short" makes every read() return at most 7
 * bytes and then 0 halfway through the file, a short read.  Other paths are
 * untouched.  Descriptors are matched by remembering which fds open()
 * returned for a faulty path.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#define MAX_FD 4096

static int kind_of_fd[MAX_FD]; /* 0 none, 1 eio, 2 short; benign races between tests */
static off_t served[MAX_FD];

static int (*real_open)(const char *, int, ...);
static ssize_t (*real_read)(int, void *, size_t);
static int (*real_close)(int);

static void resolve(void)
{
    if (!real_open) {
        real_open = (int (*)(const char *, int, ...))dlsym(RTLD_NEXT, "open");
        real_read = (ssize_t(*)(int, void *, size_t))dlsym(RTLD_NEXT, "read");
        real_close = (int (*)(int))dlsym(RTLD_NEXT, "close");
    }
}

static int faulty_open(const char *path, int flags, mode_t mode)
{
    resolve();
    if (strstr(path, "fault-eacces")) {
        errno = EACCES;
        return -1;
    }
    int fd = real_open(path, flags, mode);
    if (fd >= 0 && fd < MAX_FD) {
        kind_of_fd[fd] = strstr(path, "fault-eio") ? 1 : strstr(path, "fault-short") ? 2 : 0;
        served[fd] = 0;
    }
    return fd;
}

/* open and open64 (what _FILE_OFFSET_BITS=64 builds call) take a mode only
 * with O_CREAT. */
#define OPEN_WRAPPER(name)                                                  \
    int name(const char *path, int flags, ...)                             \
    {                                                                       \
        mode_t mode = 0;                                                    \
        if (flags & O_CREAT) {                                              \
            va_list ap;                                                     \
            va_start(ap, flags);                                            \
            mode = (mode_t)va_arg(ap, int);                                 \
            va_end(ap);                                                     \
        }                                                                   \
        return faulty_open(path, flags, mode);                              \
    }

OPEN_WRAPPER(open)
OPEN_WRAPPER(open64)

ssize_t read(int fd, void *buf, size_t count)
{
    resolve();
    if (fd >= 0 && fd < MAX_FD && kind_of_fd[fd] == 1) {
        errno = EIO;
        return -1;
    }
    if (fd >= 0 && fd < MAX_FD && kind_of_fd[fd] == 2) {
        if (served[fd] >= 512)
            return 0; /* the file "ends" early */
        ssize_t got = real_read(fd, buf, count < 7 ? count : 7);
        if (got > 0)
            served[fd] += got;
        return got;
    }
    return real_read(fd, buf, count);
}

int close(int fd)
{
    resolve();
    if (fd >= 0 && fd < MAX_FD)
        kind_of_fd[fd] = 0;
    return real_close(fd);
}
