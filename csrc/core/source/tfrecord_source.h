/* fastload core: a TFRecord dataset's samples for the image source — each
 * record read by its index range, its framing checked, its Example parsed,
 * and the image feature's bytes and the label feature's value handed to
 * the image pipeline (image_source.h, read_sample).
 *
 * Plain memory the binding fills once and never changes: any number of
 * worker threads read at once, each into its own buffer.
 */
#ifndef FL_TFRECORD_SOURCE_H
#define FL_TFRECORD_SOURCE_H

#include <stddef.h>
#include <stdint.h>

struct fl_image_worker;

typedef struct fl_tfrecord_source {
    const char *paths;          /* NUL-terminated file paths back to back */
    const int64_t *offsets;     /* where sample i's file path starts in `paths` */
    const int64_t *ranges;      /* (offset, size) of record i, framing included */
    const int64_t *records;     /* record i's number in its file, for messages */
    int verify;                 /* check both CRCs of each record */
    const char *image;          /* the image feature's name (`image_size` bytes) */
    size_t image_size;
    const char *label;          /* the label feature's name, or NULL: labels stay 0 */
    size_t label_size;
} fl_tfrecord_source;

/* The image source's read_sample over a fl_tfrecord_source (`ctx`): record
 * `index` into w's read buffer, *data and *size the image feature's first
 * (only) value, *label the label feature's.  Returns FL_OK; FL_ERR_IO
 * (*err the errno) when the file cannot be read; FL_ERR_DECODE when the
 * record or its Example does not check out, or a feature is missing or
 * not of its kind (the image a bytes_list of one value, the label an
 * int64_list of one value); FL_ERR_TOO_BIG, FL_ERR_NOMEM.  msg names the
 * record ("record K at offset O") and, where one is at fault, the feature. */
int fl_tfrecord_read_sample(const void *ctx, struct fl_image_worker *w, int64_t index,
                            const unsigned char **data, size_t *size, int64_t *label, int *err,
                            char *msg, size_t msg_size);

/* Record `index` into the worker's buffer and checked: its Example's bytes.
 * Errors as fl_tfrecord_read_sample's, msg naming the record. */
int fl_tfrecord_read_example(const fl_tfrecord_source *src, struct fl_image_worker *w,
                             int64_t index, const unsigned char **data, size_t *size, int *err,
                             char *msg, size_t msg_size);

#endif /* FL_TFRECORD_SOURCE_H */
