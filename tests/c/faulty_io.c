/* An LD_PRELOAD shim that makes file reads fail on purpose, for the
 * fault-injection tests (tests/test_faults.py).
 *
 * For paths containing "fault-eio" read() and pread() fail with EIO;
 * "fault-eacces" makes open() fail with EACCES (root ignores permission
 * bits, so chmod cannot test this); "fault-short" makes every read() or
 * pread() return at most 7 bytes and then 0 after 512 bytes, a short read.  Other paths are
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
static ssize_t (*real_pread)(int, void *, size_t, off_t);
static int (*real_close)(int);

static void resolve(void)
{
    if (!real_open) {
        real_open = (int (*)(const char *, int, ...))dlsym(RTLD_NEXT, "open");
        real_read = (ssize_t(*)(int, void *, size_t))dlsym(RTLD_NEXT, "read");
        real_pread = (ssize_t(*)(int, void *, size_t, off_t))dlsym(RTLD_NEXT, "pread");
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

/* The fault for a read of up to `count` bytes on `fd`: 1 when the read
 * proceeds (with *count possibly cut), 0 when it returns *result now. */
static int fault(int fd, size_t *count, ssize_t *result)
{
    resolve();
    if (fd < 0 || fd >= MAX_FD || kind_of_fd[fd] == 0)
        return 1;
    if (kind_of_fd[fd] == 1) {
        errno = EIO;
        *result = -1;
        return 0;
    }
    if (served[fd] >= 512) {
        *result = 0; /* the file "ends" early */
        return 0;
    }
    if (*count > 7)
        *count = 7;
    return 1;
}

ssize_t read(int fd, void *buf, size_t count)
{
    ssize_t got;
    if (!fault(fd, &count, &got))
        return got;
    got = real_read(fd, buf, count);
    if (got > 0 && fd < MAX_FD)
        served[fd] += got;
    return got;
}

#define PREAD_WRAPPER(name)                                                 \
    ssize_t name(int fd, void *buf, size_t count, off_t offset)            \
    {                                                                       \
        ssize_t got;                                                        \
        if (!fault(fd, &count, &got))                                       \
            return got;                                                     \
        got = real_pread(fd, buf, count, offset);                           \
        if (got > 0 && fd < MAX_FD)                                         \
            served[fd] += got;                                              \
        return got;                                                         \
    }

PREAD_WRAPPER(pread)
PREAD_WRAPPER(pread64)

int close(int fd)
{
    resolve();
    if (fd >= 0 && fd < MAX_FD)
        kind_of_fd[fd] = 0;
    return real_close(fd);
}
