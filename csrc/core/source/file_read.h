/* fastload core: reading a sample's bytes from a file — the whole file, or
 * the range an archive member takes in it.
 *
 * The reader owns no memory: it asks the caller for room (fl_room_fn), so
 * the bytes land in whatever buffer the caller reads into (an image
 * worker's read buffer: fl_image_worker_file_buffer), and it knows nothing
 * of what the bytes are.  The source layer reads (image_source.c); the
 * image layer decodes what was read.
 *
 * A path "<image>:/<inner>" naming a file inside a SquashFS image is read
 * from the image (squashfs_read.h), with the same contract.
 *
 * Anything but a regular file (a FIFO, a directory, a device, a socket) is
 * refused without blocking in open().  Nothing here takes a lock or needs
 * the GIL; any number of threads read at once, each into its own room.
 */
#ifndef FL_FILE_READ_H
#define FL_FILE_READ_H

#include <stddef.h>
#include <stdint.h>

/* A length meaning "to the end of the file". */
#define FL_TO_END UINT64_MAX

/* No sample's file (or member) is bigger: past it, FL_ERR_TOO_BIG. */
#define FL_MAX_FILE_BYTES ((size_t)1 << 30)

/* Gives room for at least `size` bytes, valid until the caller's next
 * read, or NULL when out of memory. */
typedef unsigned char *(*fl_room_fn)(void *ctx, size_t size);

/* Reads the whole file at `path` into room(room_ctx, size).  Returns FL_OK
 * (setting *data and *size) or FL_ERR_IO with strerror in msg and the errno
 * in *err; FL_ERR_TOO_BIG past FL_MAX_FILE_BYTES; FL_ERR_NOMEM when room
 * gives none.  Anything but a regular file is refused with "not a regular
 * file (<kind>)" (EISDIR or EINVAL). */
int fl_read_file(const char *path, fl_room_fn room, void *room_ctx, const unsigned char **data,
                 size_t *size, int *err, char *msg, size_t msg_size);

/* Reads `length` bytes at `offset` of the file at `path` (a member of an
 * archive; FL_TO_END: the rest of the file), as fl_read_file does.  A range
 * past the end of the file (one truncated since it was indexed) is
 * FL_ERR_IO with EIO and a message saying so.  A file that shrinks during
 * the read gives fewer bytes (*size), which the decoder reports as
 * truncated. */
int fl_read_range(const char *path, uint64_t offset, uint64_t length, fl_room_fn room,
                  void *room_ctx, const unsigned char **data, size_t *size, int *err, char *msg,
                  size_t msg_size);

#endif /* FL_FILE_READ_H */
