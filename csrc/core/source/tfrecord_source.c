/* fastload core: a TFRecord dataset's samples (see tfrecord_source.h). */
#include "core/source/tfrecord_source.h"

#include "core/image/pipeline.h"
#include "core/source/example.h"
#include "core/source/file_read.h"
#include "core/source/tfrecord.h"
#include "core/status.h"

#include <stdio.h>
#include <string.h>

static unsigned char *worker_room(void *w, size_t size)
{
    return fl_image_worker_file_buffer(w, size);
}

/* Prefixes msg (which holds the reason) with the record's place. */
static void name_record(const fl_tfrecord_source *src, int64_t index, char *msg,
                        size_t msg_size)
{
    char reason[256];
    snprintf(reason, sizeof reason, "%s", msg);
    snprintf(msg, msg_size, "record %lld at offset %lld: %s", (long long)src->records[index],
             (long long)src->ranges[2 * index], reason);
}

int fl_tfrecord_read_example(const fl_tfrecord_source *src, struct fl_image_worker *w,
                             int64_t index, const unsigned char **data, size_t *size, int *err,
                             char *msg, size_t msg_size)
{
    const unsigned char *rec;
    size_t got;
    const char *path = src->paths + src->offsets[index];
    uint64_t offset = (uint64_t)src->ranges[2 * index];
    uint64_t length = (uint64_t)src->ranges[2 * index + 1];
    int rc = fl_read_range(path, offset, length, worker_room, w, &rec, &got, err, msg, msg_size);
    if (rc == FL_OK)
        rc = fl_tfrecord_payload(rec, got, src->verify, data, size, msg, msg_size);
    if (rc != FL_OK)
        name_record(src, index, msg, msg_size);
    return rc;
}

/* Feature `name` of the Example, required to be of `kind` with exactly one
 * value, stored in `out`. */
static int one_value(const fl_tfrecord_source *src, int64_t index, const unsigned char *example,
                     size_t size, const char *name, size_t name_size, int kind, void *out,
                     char *msg, size_t msg_size)
{
    int found;
    fl_feature f;
    size_t count;
    int rc = fl_example_find(example, size, name, name_size, &found, &f, msg, msg_size);
    if (rc == FL_OK && !found) {
        fl_set_msg(msg, msg_size, "feature '%.*s' is missing", (int)name_size, name);
        rc = FL_ERR_DECODE;
    } else if (rc == FL_OK && f.kind != kind) {
        fl_set_msg(msg, msg_size, "feature '%.*s' is a %s, expected %s", (int)name_size, name,
                   fl_feature_kind_name(f.kind), fl_feature_kind_name(kind));
        rc = FL_ERR_DECODE;
    } else if (rc == FL_OK) {
        char why[200] = "";
        rc = fl_feature_values(&f, out, 1, &count, why, sizeof why);
        if (rc != FL_OK)
            fl_set_msg(msg, msg_size, "feature '%.*s': %s", (int)name_size, name, why);
        else if (count != 1) {
            fl_set_msg(msg, msg_size, "feature '%.*s' has %zu values, not 1", (int)name_size,
                       name, count);
            rc = FL_ERR_DECODE;
        }
    }
    if (rc != FL_OK)
        name_record(src, index, msg, msg_size);
    return rc;
}

int fl_tfrecord_read_sample(const void *ctx, struct fl_image_worker *w, int64_t index,
                            const unsigned char **data, size_t *size, int64_t *label, int *err,
                            char *msg, size_t msg_size)
{
    const fl_tfrecord_source *src = ctx;
    const unsigned char *example;
    size_t example_size;
    *err = 0;
    int rc = fl_tfrecord_read_example(src, w, index, &example, &example_size, err, msg, msg_size);
    if (rc != FL_OK)
        return rc;
    fl_bytes_ref image;
    rc = one_value(src, index, example, example_size, src->image, src->image_size,
                   FL_FEATURE_BYTES, &image, msg, msg_size);
    if (rc == FL_OK && src->label)
        rc = one_value(src, index, example, example_size, src->label, src->label_size,
                       FL_FEATURE_INT64, label, msg, msg_size);
    if (rc != FL_OK)
        return rc;
    /* The image lies inside the record, in the worker's buffer. */
    *data = image.data;
    *size = image.size;
    return FL_OK;
}
