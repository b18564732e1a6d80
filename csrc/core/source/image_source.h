/* fastload core: an image source — the files of an image dataset and the
 * plan that turns any of them into a batch row.
 *
 * A source is plain memory the binding fills once (the paths, labels and
 * plan of fastload.ImageFiles) and never changes, so any number of threads
 * read batches from it at once.  fl_image_source_batch runs a whole batch:
 * each sample is read, decoded and transformed straight into its row.  The
 * format is told by the file's first bytes: JPEG, PNG and WebP are decoded
 * here; any other file goes to the source's fallback decoder (the binding's
 * Pillow call, which takes the GIL itself), so the loop never needs the
 * caller to hold it.
 *
 * Errors follow the dataset's on_error policy.  "raise": the first failing
 * sample stops the batch and is reported.  "skip": the sample is replaced by
 * the next index (i + 1, i + 2, ... modulo the length), each failure is
 * recorded, and after FL_IMAGE_MAX_SKIPS failures for one row (or running
 * out of memory) the batch fails with the last error.
 */
#ifndef FL_IMAGE_SOURCE_H
#define FL_IMAGE_SOURCE_H

#include "core/cuda/gpu_batch.h"
#include "core/image/pipeline.h"

#include <stddef.h>
#include <stdint.h>

#define FL_IMAGE_MSG_SIZE 256
#define FL_IMAGE_MAX_SKIPS 64

/* Decodes the bytes of a file the core cannot (not a JPEG, PNG or WebP;
 * `size` bytes at `data`, already read) and runs the plan on its pixels into `dst` (NULL:
 * only fills *geometry).  Returns FL_OK, FL_ERR_DECODE or FL_ERR_NOMEM with
 * a message in msg.  Called on the thread running the batch, without the GIL
 * held by the core. */
typedef int (*fl_image_fallback_fn)(void *ctx, fl_image_worker *w, const fl_image_plan *plan,
                                    const unsigned char *data, size_t size,
                                    const fl_sample_key *key, void *dst,
                                    fl_sample_geometry *geometry, char *msg, size_t msg_size);

typedef struct fl_image_source {
    const char *paths;       /* NUL-terminated paths back to back */
    const int64_t *offsets;  /* where path i starts in `paths` */
    const int64_t *labels;
    const int64_t *ranges;   /* NULL, or (offset, size) of sample i within its
                                file: a member of an archive */
    int64_t length;          /* number of samples */
    fl_image_plan plan;
    int skip;                /* on_error == "skip" */
    fl_image_fallback_fn fallback; /* NULL: files of other formats fail */
    void *fallback_ctx;
    int fallback_all;        /* 1: PNG and WebP go to the fallback too (to
                                compare decoders) */
    struct fl_sample_cache *cache; /* NULL, or the samples' bytes kept for
                                      later reads (sample_cache.h); owned by
                                      the binding; with read_bytes, only
                                      their pixels (cache_pixels) */
    int cache_pixels;        /* 1: the cache keeps each image decoded whole
                                (its RGB pixels), so a cached sample is not
                                decoded again; the plan is then run as
                                decode="exact" always, so every epoch gives
                                the same output */
    int cache_restart;       /* 1: JPEGs go into the cache rewritten with
                                restart markers (jpeg_transcode.h), so later
                                reads decode a crop from the intervals that
                                cover it; the pixels are the same */
    /* NULL: sample i is read from its file.  Else it gives sample i's bytes,
     * valid at least until w's next read, as a file's are: copied into
     * w's read buffer (an LMDB value, bytes lying in a table in memory:
     * memory_source.h), never left in a mapping another process could cut
     * short under the decoder; `paths` then only names the store in
     * messages.  FL_ERR_CHANGED: the mapping's file shrank. */
    int (*read_bytes)(const void *ctx, fl_image_worker *w, int64_t index,
                      const unsigned char **data, size_t *size, char *msg, size_t msg_size);
    const void *bytes_ctx;
    /* NULL, or (taking the place of read_bytes and the file read) sample
     * i's bytes and its label together, from a record that holds both (a
     * TFRecord's Example: tfrecord_source.h), valid as read_bytes' are;
     * the label replaces labels[i].  FL_ERR_IO sets *err (errno, or 0).
     * A source with read_sample has no cache. */
    int (*read_sample)(const void *ctx, fl_image_worker *w, int64_t index,
                       const unsigned char **data, size_t *size, int64_t *label, int *err,
                       char *msg, size_t msg_size);
    const void *sample_ctx;
} fl_image_source;

/* One sample that failed. */
typedef struct fl_image_failure {
    int64_t index;           /* the sample (after earlier skips) */
    int status;              /* FL_ERR_IO, FL_ERR_DECODE, FL_ERR_TOO_BIG, FL_ERR_NOMEM,
                                FL_ERR_CHANGED (msg is the whole message) */
    int err;                 /* errno for FL_ERR_IO, else 0 */
    char msg[FL_IMAGE_MSG_SIZE];
} fl_image_failure;

/* What a batch reports beyond its pixels: the samples skipped (up to
 * `capacity` records kept, `n_skips` counts them all) and, when the batch
 * failed, its error. */
typedef struct fl_image_batch_report {
    fl_image_failure *skips; /* caller's array of `capacity` records */
    size_t capacity;
    size_t n_skips;
    fl_image_failure error;  /* status FL_OK unless the batch failed */
} fl_image_batch_report;

/* The file sample `index` is read from (for an archive member, the archive). */
static inline const char *fl_image_source_path(const fl_image_source *src, int64_t index)
{
    return src->paths + src->offsets[index];
}

/* Bytes one sample takes in a batch (the plan fixes the output size). */
size_t fl_image_source_row_bytes(const fl_image_source *src);

/* Reads samples idx[0..n) (each in [0, length)) into consecutive rows of
 * `images` and their labels into `labels`, keyed by (seed, epoch, index).
 * The plan must fix the output size.  Returns FL_OK, or the failing
 * status with report->error filled; `images` then holds a partial batch. */
int fl_image_source_batch(const fl_image_source *src, fl_image_worker *w, const int64_t *idx,
                          size_t n, uint64_t seed, uint64_t epoch, void *images, int64_t *labels,
                          fl_image_batch_report *report);

/* fl_image_source_batch, with `gpu_wanted` of the n JPEGs (spread evenly
 * over the rows) left to the GPU decode stage: each is read, prepared
 * (fl_pipeline_gpu_prepare) and added to `gpu` (its bytes and tables), its
 * row left unwritten, its label written.  An image the GPU cannot take (not
 * a baseline gray or YCbCr JPEG, or no room left in `gpu`) is decoded here
 * as usual, and a later row goes to the GPU in its place.  gpu's head
 * counts the images decoded here and the time spent on each kind (for the
 * split's controller).  With gpu NULL this is fl_image_source_batch. */
int fl_image_source_batch_split(const fl_image_source *src, fl_image_worker *w,
                                const int64_t *idx, size_t n, uint64_t seed, uint64_t epoch,
                                void *images, int64_t *labels, size_t gpu_wanted,
                                fl_gpu_batch *gpu, fl_image_batch_report *report);

/* A sample's file as read into the worker's buffer (valid until the
 * worker's next read). */
typedef struct fl_image_file {
    int64_t index;
    const unsigned char *data;
    size_t size;
    fl_image_format format;  /* FL_FORMAT_OTHER: the fallback decodes it */
    int64_t label;           /* the sample's label (labels[index], or read_sample's) */
} fl_image_file;

/* Reads sample `index` (from the source's cache when it holds the sample,
 * else from its file, then storing it in the cache unless the cache keeps
 * pixels: the decode stores those).  Returns FL_OK, or FL_ERR_IO with
 * *failure filled. */
int fl_image_source_read(const fl_image_source *src, fl_image_worker *w, int64_t index,
                         fl_image_file *file, fl_image_failure *failure);

/* Decides the geometry of a file read by fl_image_source_read and, when
 * `dst` is not NULL, decodes it there (so a caller may first learn the
 * output size with dst NULL, then decode the same bytes).  Returns FL_OK or
 * the status with *failure filled. */
int fl_image_source_decode(const fl_image_source *src, fl_image_worker *w,
                           const fl_image_file *file, const fl_sample_key *key, void *dst,
                           fl_sample_geometry *geometry, fl_image_failure *failure);

/* The pixels of a file read as FL_FORMAT_PIXELS (from a cache keeping
 * them): RGB rows `stride` bytes apart, valid as the file's bytes are.
 * Returns FL_OK, or FL_ERR_DECODE with msg when the entry is malformed. */
int fl_image_source_pixels(const fl_image_file *file, const unsigned char **rgb, int *width,
                           int *height, size_t *stride, char *msg, size_t msg_size);

#endif /* FL_IMAGE_SOURCE_H */
