/* fastload core: reading samples' files (see file_read.h). */
#define _GNU_SOURCE
#include "core/source/file_read.h"

#include "core/source/squashfs_read.h"
#include "core/status.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* What a path that is not a regular file is, for the error message. */
static const char *file_kind(mode_t mode)
{
    return S_ISDIR(mode)    ? "a directory"
           : S_ISFIFO(mode) ? "a FIFO"
           : S_ISSOCK(mode) ? "a socket"
           : S_ISCHR(mode)  ? "a character device"
           : S_ISBLK(mode)  ? "a block device"
                            : "of an unknown kind";
}

int fl_read_file(const char *path, fl_room_fn room, void *room_ctx, const unsigned char **data,
                 size_t *size, int *err, char *msg, size_t msg_size)
{
    return fl_read_range(path, 0, FL_TO_END, room, room_ctx, data, size, err, msg, msg_size);
}

int fl_read_range(const char *path, uint64_t offset, uint64_t length, fl_room_fn room,
                  void *room_ctx, const unsigned char **data, size_t *size, int *err, char *msg,
                  size_t msg_size)
{
    int fd = -1, status = FL_ERR_IO;
    struct stat st;
    size_t done = 0;
    *err = 0;

    /* "<image>:/<inner>": a file inside a SquashFS image. */
    size_t image_len = fl_sqfs_image_part(path);
    if (image_len)
        return fl_sqfs_read_range(path, image_len, offset, length, FL_MAX_FILE_BYTES, room,
                                  room_ctx, data, size, err, msg, msg_size);

    /* O_NONBLOCK: opening a FIFO (or a device) must not wait for a writer;
     * whatever it opened, fstat then refuses all but regular files.  A
     * socket cannot be opened at all (ENXIO); stat says what it is. */
    fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) {
        *err = errno;
        if (*err == ENXIO && stat(path, &st) == 0 && !S_ISREG(st.st_mode)) {
            *err = EINVAL;
            snprintf(msg, msg_size, "not a regular file (%s)", file_kind(st.st_mode));
        } else {
            snprintf(msg, msg_size, "%s", strerror(*err));
        }
        goto out;
    }
    if (fstat(fd, &st) != 0) {
        *err = errno;
        snprintf(msg, msg_size, "%s", strerror(errno));
        goto out;
    }
    if (!S_ISREG(st.st_mode)) {
        *err = S_ISDIR(st.st_mode) ? EISDIR : EINVAL;
        snprintf(msg, msg_size, "not a regular file (%s)", file_kind(st.st_mode));
        goto out;
    }
    /* Regular files ignore O_NONBLOCK on Linux, but not every filesystem
     * elsewhere promises it: reads below block as usual. */
    if (fcntl(fd, F_SETFL, 0) != 0) {
        *err = errno;
        snprintf(msg, msg_size, "%s", strerror(errno));
        goto out;
    }
    uint64_t file_size = (uint64_t)st.st_size;
    if (length == FL_TO_END) {
        if (offset > file_size) {
            *err = EIO;
            snprintf(msg, msg_size, "offset %llu lies past the end of the file",
                     (unsigned long long)offset);
            goto out;
        }
        length = file_size - offset;
    } else if (offset > file_size || length > file_size - offset) {
        /* A member of an archive that is shorter now than when indexed. */
        *err = EIO;
        snprintf(msg, msg_size, "bytes %llu-%llu lie past the end of the file (%llu bytes): "
                 "it was truncated",
                 (unsigned long long)offset, (unsigned long long)(offset + length),
                 (unsigned long long)file_size);
        goto out;
    }
    if (length > FL_MAX_FILE_BYTES) {
        status = FL_ERR_TOO_BIG;
        snprintf(msg, msg_size, "%llu bytes are too many for an image",
                 (unsigned long long)length);
        goto out;
    }
    size_t want = (size_t)length;
    unsigned char *buf = room(room_ctx, want);
    if (!buf) {
        status = FL_ERR_NOMEM;
        snprintf(msg, msg_size, "cannot allocate %zu bytes to read the file", want);
        goto out;
    }
    /* Read what fstat promised; a file that shrank meanwhile gives fewer
     * bytes, which the decoder then reports as truncated. */
    while (done < want) {
        ssize_t got = pread(fd, buf + done, want - done, (off_t)(offset + done));
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0) {
            *err = errno;
            snprintf(msg, msg_size, "%s", strerror(errno));
            goto out;
        }
        if (got == 0)
            break;
        done += (size_t)got;
    }
    *data = buf;
    *size = done;
    status = FL_OK;
out:
    if (fd >= 0)
        close(fd);
    return status;
}
