/* fastload._C: ImageSource — the native source of the image datasets.
 *
 * The object embeds the core's fl_image_source (csrc/core/source/image_source.h):
 * the file paths (one bytes blob of NUL-terminated paths and an int64 array
 * of where each starts, so 1.28 M files cost two objects), the labels and
 * the compiled plan, all read as plain C by the batch code.  The Python
 * objects behind that memory are held here and never change, but for rows
 * of ranges and labels a dataset fills once, before it hands out any of
 * their indices (a WebDataset loading a shard: datasets/native.py, _ready).
 *
 * Files that are not JPEGs, PNGs or WebPs go to the Python fallback decoder
 * (Pillow; with fallback_all, PNGs and WebPs too, to compare), with
 * the bytes already read: the core calls pillow_fallback(), which takes the
 * GIL for the call itself, so a batch needs the GIL on its worker only for
 * such files.  With `ranges`, sample i is bytes [offset, offset + size) of
 * its file: a member of a tar shard.
 *
 * With a SampleCache (`cache`), samples are read through it
 * (csrc/core/source/sample_cache.h); the object is held here so the mapping
 * outlives every batch.
 *
 * Errors name the file and the sample index: OSError (the errno's subclass)
 * for a file that cannot be read, MemoryError, else fastload.DecodeError.
 * A thread whose decoders cannot be made names no file: MemoryError, or
 * RuntimeError with libjpeg's own message (a library of another ABI).
 */
#include "bind/fastload.h"

#include "core/image/resample.h"
#include "core/observe/stats.h"
#include "core/source/image_source.h"
#include "core/source/memory_source.h"
#include "core/source/tfrecord_source.h"
#include "core/status.h"

#include <errno.h>
#include <math.h>
#include <stdatomic.h>
#include <string.h>

/* A source made with gpu_split= gives a third output a batch: the part
 * of it the GPU decode stage decodes (core/cuda/gpu_batch.h), sized from
 * per-image budgets times the batch size.  `share` is the GPU's share of a
 * batch's JPEGs, set by the loader's controller at any time and read by
 * the batch jobs on any thread. */
typedef struct image_split {
    int on;
    uint64_t bytes, entries, pixels; /* a part's budgets per image */
    int explore;                     /* every explore-th batch gives each side one image
                                        (0: never): the controller keeps both measured */
    _Atomic uint32_t share;          /* in units of 1 / SHARE_ONE */
    _Atomic uint64_t batches;        /* batches run */
} image_split;

#define SHARE_ONE (1u << 24)

typedef struct ImageSourceObject {
    fl__native_source head;
    fl_image_source core;
    PyObject *paths;       /* bytes: NUL-terminated paths back to back */
    PyObject *offsets;     /* int64 ndarray: start of path i in `paths` */
    PyObject *labels;      /* int64 ndarray */
    PyObject *fallback;    /* callable(bytes) -> HWC uint8 ndarray, or None */
    PyObject *ranges;      /* int64 (n, 2) ndarray, or None */
    PyObject *cache;       /* SampleCache backing core.cache, or None */
    PyObject *lmdb;        /* LMDBSource the samples are read from, or None */
    PyObject *memory;      /* (buffers, which) the samples lie in, or None */
    PyObject *records;     /* TFRecordSource the samples are read from, or NULL */
    Py_buffer *views;      /* the buffers, held while the source lives */
    Py_ssize_t n_views;
    const unsigned char **bases;
    fl_memory_source memory_core;
    PyObject *decode_error;
    int has_shape;         /* the plan fixes the output size: batches stack */
    int channels_first;    /* a tensor in HWC memory: batches are NCHW views */
    image_split split;     /* gpu_split=: batches leave JPEGs to the GPU stage */
} ImageSourceObject;

/* A path or message as str: paths as the file system encodes them, text
 * (which may have been cut mid-character) with replacement. */
static PyObject *path_object(const fl_image_source *src, int64_t index)
{
    return PyUnicode_DecodeFSDefault(fl_image_source_path(src, index));
}

static PyObject *msg_object(const char *msg)
{
    return PyUnicode_DecodeUTF8(msg, (Py_ssize_t)strlen(msg), "replace");
}

/* ------------------------------------------------------------- fallback */

/* The core's fallback decoder (fl_image_fallback_fn): the Python decoder's
 * HWC uint8 image, then the plan's ops on it.  Takes the GIL for the call
 * (the calling thread may or may not hold it). */
static int pillow_fallback(void *ctx, fl_image_worker *w, const fl_image_plan *plan,
                           const unsigned char *data, size_t size, const fl_sample_key *key,
                           void *dst, fl_sample_geometry *geometry, char *msg, size_t msg_size)
{
    fl_stats_row *timers = fl_stats_current();
    uint64_t t = timers ? fl_stats_now() : 0;
    PyGILState_STATE gil = PyGILState_Ensure();
    if (timers)
        fl_stats_add_gil_wait(timers, t, fl_stats_now());
    PyObject *fallback = ctx;
    int rc = FL_ERR_DECODE;
    if (fallback == Py_None) {
        snprintf(msg, msg_size, "not a JPEG, PNG or WebP, and Pillow is not installed to decode it");
        goto done;
    }
    /* A copy: the worker's buffer is reused by its next read. */
    PyObject *bytes = PyBytes_FromStringAndSize((const char *)data, (Py_ssize_t)size);
    PyObject *img = bytes ? PyObject_CallOneArg(fallback, bytes) : NULL;
    Py_XDECREF(bytes);
    if (!img) {
        PyObject *exc = fl__take_exception();
        PyObject *text = exc ? PyObject_Str(exc) : NULL;
        const char *utf8 = text ? PyUnicode_AsUTF8(text) : NULL;
        snprintf(msg, msg_size, "%s", utf8 ? utf8 : "decoding failed");
        PyErr_Clear();
        Py_XDECREF(text);
        Py_XDECREF(exc);
        goto done;
    }
    PyArrayObject *a = (PyArrayObject *)img;
    if (!PyArray_Check(img) || PyArray_NDIM(a) != 3 || PyArray_DIM(a, 2) != 3 ||
        PyArray_TYPE(a) != NPY_UINT8 || PyArray_STRIDE(a, 2) != 1 || PyArray_STRIDE(a, 1) != 3) {
        snprintf(msg, msg_size, "the fallback decoder did not return an HWC uint8 RGB array");
    } else {
        const unsigned char *rgb = PyArray_DATA(a);
        int width = (int)PyArray_DIM(a, 1), height = (int)PyArray_DIM(a, 0);
        size_t stride = (size_t)PyArray_STRIDE(a, 0);
        /* `img` is held until the ops are done. */
        Py_BEGIN_ALLOW_THREADS
        rc = fl_pipeline_pixels(w, plan, key, rgb, width, height, stride, dst, geometry, msg,
                                msg_size);
        Py_END_ALLOW_THREADS
    }
    Py_DECREF(img);
done:
    PyGILState_Release(gil);
    return rc;
}

/* ---------------------------------------------------------------- errors */

/* The exception for a failed sample, naming the file and index. */
static PyObject *sample_error(ImageSourceObject *self, const fl_image_failure *f)
{
    PyObject *path = path_object(&self->core, f->index);
    if (!path)
        return NULL;
    PyObject *exc = NULL;
    if (f->status == FL_ERR_CHANGED) {
        /* A mapping whose file shrank: the message names that file (a
         * cache's, an LMDB's, a table's) and the sample, as the array
         * datasets' does. */
        exc = PyObject_CallFunction(PyExc_OSError, "iN", EIO, msg_object(f->msg));
    } else if (f->status == FL_ERR_IO && f->err != 0) {
        /* OSError(errno, strerror, filename): the subclass for the errno
         * (FileNotFoundError, ...), and str() names the file. */
        PyObject *args = Py_BuildValue("(iNO)", f->err,
                                       PyUnicode_FromFormat("%s (sample index %lld)", f->msg,
                                                            (long long)f->index),
                                       path);
        if (args) {
            exc = PyObject_Call(PyExc_OSError, args, NULL);
            Py_DECREF(args);
        }
    } else if (f->status == FL_ERR_NOMEM) {
        exc = PyObject_CallFunction(PyExc_MemoryError, "N",
                                    PyUnicode_FromFormat("%U (sample index %lld): %s", path,
                                                         (long long)f->index, f->msg));
    } else {
        exc = PyObject_CallFunction(self->decode_error, "N",
                                    PyUnicode_FromFormat("cannot decode %U (sample index %lld): "
                                                         "%s",
                                                         path, (long long)f->index, f->msg));
    }
    Py_DECREF(path);
    return exc;
}

static void raise_sample_error(ImageSourceObject *self, const fl_image_failure *f)
{
    PyObject *exc = sample_error(self, f);
    if (exc)
        fl__raise_exception(exc);
}

/* ----------------------------------------------------------- native ops */

static int image_plan(PyObject *source, fl__native_job *job)
{
    ImageSourceObject *self = (ImageSourceObject *)source;
    if (!self->has_shape) {
        PyErr_SetString(PyExc_TypeError, "batch(): the transform does not fix the output size");
        return -1;
    }
    const fl_image_plan *plan = &self->core.plan;
    job->n_out = 2;
    job->descrs[0] = fl__plan_descr(plan);
    job->descrs[1] = PyArray_DescrFromType(NPY_INT64);
    job->ndims[0] = 4;
    job->ndims[1] = 1;
    job->dims[0][0] = job->dims[1][0] = (npy_intp)job->n;
    fl__image_dims(plan, plan->out_w, plan->out_h, &job->dims[0][1]);
    job->channels_first[0] = self->channels_first;
    job->images_nhwc = plan->layout == FL_LAYOUT_HWC;
    if (self->core.skip) {
        /* Room for a few skips a row; n_skips counts any beyond. */
        job->records = PyMem_RawCalloc(job->n * 4 + 1, sizeof(fl_image_failure));
        if (!job->records) {
            PyErr_NoMemory();
            return -1;
        }
    }
    return 0;
}

/* A batch into job's outputs; with `gpu`, `gpu_wanted` of its JPEGs left
 * to the GPU stage there.  A failure is recorded in the job. */
static void run_batch(const fl_image_source *src, fl__native_job *job, size_t gpu_wanted,
                      fl_gpu_batch *gpu)
{
    fl_image_worker *w;
    int status = fl_image_worker_get(&w, job->msg, sizeof job->msg);
    if (status != FL_OK) {
        job->status = status; /* job->sample stays -1: no sample failed */
        return;
    }
    fl_image_batch_report report = {
        .skips = job->records,
        .capacity = job->records ? job->n * 4 + 1 : 0,
    };
    int rc = fl_image_source_batch_split(src, w, job->indices, job->n, job->seed, job->epoch,
                                         job->data[0], (int64_t *)job->data[1], gpu_wanted,
                                         gpu, &report);
    job->n_records = report.n_skips < report.capacity ? report.n_skips : report.capacity;
    if (rc != FL_OK) {
        job->status = rc;
        job->sample = report.error.index;
        job->err = report.error.err;
        memcpy(job->msg, report.error.msg, sizeof job->msg);
    }
}

static void image_run(const void *core, fl__native_job *job)
{
    run_batch(core, job, 0, NULL);
}

static PyObject *image_failure(PyObject *source, const fl__native_job *job)
{
    if (job->sample < 0)
        return fl__image_worker_error(job->status, job->msg);
    fl_image_failure f = {.index = job->sample, .status = job->status, .err = job->err};
    memcpy(f.msg, job->msg, sizeof f.msg);
    return sample_error((ImageSourceObject *)source, &f);
}

static PyObject *image_skipped(PyObject *source, const fl__native_job *job)
{
    ImageSourceObject *self = (ImageSourceObject *)source;
    const fl_image_failure *skips = job->records;
    PyObject *list = PyList_New((Py_ssize_t)job->n_records);
    for (size_t i = 0; list && i < job->n_records; i++) {
        PyObject *item = Py_BuildValue("(LNN)", (long long)skips[i].index,
                                       path_object(&self->core, skips[i].index),
                                       msg_object(skips[i].msg));
        if (!item)
            Py_CLEAR(list);
        else
            PyList_SET_ITEM(list, (Py_ssize_t)i, item);
    }
    return list;
}

static const fl__native_ops image_ops = {
    .plan = image_plan,
    .run = image_run,
    .failure = image_failure,
    .skipped = image_skipped,
};

/* The source object around `core` (run() is handed the core only). */
static const ImageSourceObject *object_of(const void *core)
{
    return (const ImageSourceObject *)((const char *)core - offsetof(ImageSourceObject, core));
}

static fl_gpu_batch_shape split_shape(const image_split *split, size_t n)
{
    return (fl_gpu_batch_shape){
        .capacity = (uint32_t)n,
        .first_capacity = split->entries * n,
        .weight_capacity = split->entries * n,
        .encoded_capacity = split->bytes * n,
        .pixel_capacity = split->pixels * n,
    };
}

static int split_plan(PyObject *source, fl__native_job *job)
{
    ImageSourceObject *self = (ImageSourceObject *)source;
    if (image_plan(source, job) < 0)
        return -1;
    fl_gpu_batch_shape shape = split_shape(&self->split, job->n);
    size_t bytes = fl_gpu_batch_bytes(&shape);
    if (job->n > UINT32_MAX || bytes == 0) {
        PyErr_SetString(PyExc_OverflowError, "batch(): the GPU part of the batch is too large");
        return -1;
    }
    job->n_out = 3;
    job->descrs[2] = PyArray_DescrFromType(NPY_UINT8);
    job->ndims[2] = 1;
    job->dims[2][0] = (npy_intp)bytes;
    return 0;
}

/* How many of the n JPEGs go to the GPU: the share, and with exploring,
 * one image at least on each side every explore-th batch. */
static size_t split_wanted(image_split *split, size_t n)
{
    double share = (double)atomic_load_explicit(&split->share, memory_order_relaxed) / SHARE_ONE;
    size_t wanted = (size_t)llround(share * (double)n);
    uint64_t number = atomic_fetch_add_explicit(&split->batches, 1, memory_order_relaxed);
    if (split->explore > 0 && number % (uint64_t)split->explore == 0 && n >= 2) {
        if (wanted < 1)
            wanted = 1;
        if (wanted > n - 1)
            wanted = n - 1;
    }
    return wanted;
}

static void split_run(const void *core, fl__native_job *job)
{
    /* The counters are atomics: writing them through a const path is the
     * one mutation a batch makes of its source. */
    image_split *split = (image_split *)&object_of(core)->split;
    fl_gpu_batch_shape shape = split_shape(split, job->n);
    fl_gpu_batch gpu;
    fl_gpu_batch_init(&gpu, job->data[2], &shape);
    run_batch(core, job, split_wanted(split, job->n), &gpu);
}

static const fl__native_ops split_ops = {
    .plan = split_plan,
    .run = split_run,
    .failure = image_failure,
    .skipped = image_skipped,
};

/* ------------------------------------------------------------ construction */

static int check_vector(PyObject *obj, const char *what)
{
    PyArrayObject *a = (PyArrayObject *)obj;
    if (PyArray_Check(obj) && PyArray_TYPE(a) == NPY_INT64 && PyArray_NDIM(a) == 1 &&
        PyArray_IS_C_CONTIGUOUS(a))
        return 0;
    PyErr_Format(PyExc_TypeError, "ImageSource: %s must be a contiguous int64 vector", what);
    return -1;
}

static void release_memory(ImageSourceObject *self)
{
    for (Py_ssize_t b = 0; b < self->n_views; b++)
        PyBuffer_Release(&self->views[b]);
    PyMem_Free(self->views);
    PyMem_Free(self->bases);
    self->views = NULL;
    self->bases = NULL;
    self->n_views = 0;
}

/* memory=(buffers, which): sample i is bytes ranges[i] of buffers[which[i]].
 * Each buffer is held (so it neither moves nor goes away) until dealloc, and
 * every range is checked against its buffer here, once. */
static int attach_memory(ImageSourceObject *self, PyObject *memory, PyArrayObject *ranges)
{
    PyObject *buffers, *which;
    if (!PyTuple_Check(memory) || !PyArg_ParseTuple(memory, "O!O", &PyTuple_Type, &buffers,
                                                    &which)) {
        PyErr_Clear();
        PyErr_SetString(PyExc_TypeError, "ImageSource: memory must be (tuple of buffers, which)");
        return -1;
    }
    int64_t n = self->core.length;
    if (check_vector(which, "memory's which") < 0)
        return -1;
    if ((PyObject *)ranges == Py_None || PyArray_DIM((PyArrayObject *)which, 0) != n) {
        PyErr_SetString(PyExc_ValueError,
                        "ImageSource: memory needs ranges, and a buffer index per sample");
        return -1;
    }
    if (self->core.read_bytes) {
        PyErr_SetString(PyExc_ValueError, "ImageSource: memory excludes lmdb");
        return -1;
    }
    Py_ssize_t n_buffers = PyTuple_GET_SIZE(buffers);
    self->views = PyMem_Calloc((size_t)n_buffers + 1, sizeof *self->views);
    self->bases = PyMem_Calloc((size_t)n_buffers + 1, sizeof *self->bases);
    if (!self->views || !self->bases) {
        PyErr_NoMemory();
        return -1;
    }
    for (; self->n_views < n_buffers; self->n_views++) {
        Py_ssize_t b = self->n_views;
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(buffers, b), &self->views[b], PyBUF_SIMPLE) < 0)
            return -1;
        self->bases[b] = self->views[b].buf;
    }
    const int64_t *w = PyArray_DATA((PyArrayObject *)which);
    const int64_t *rv = PyArray_DATA(ranges);
    for (int64_t i = 0; i < n; i++) {
        if (w[i] < 0 || w[i] >= n_buffers) {
            PyErr_Format(PyExc_ValueError, "ImageSource: sample %lld names buffer %lld of %zd",
                         (long long)i, (long long)w[i], n_buffers);
            return -1;
        }
        /* ranges are non-negative (checked by the caller) */
        int64_t length = (int64_t)self->views[w[i]].len, offset = rv[2 * i];
        if (offset > length || rv[2 * i + 1] > length - offset) {
            PyErr_Format(PyExc_ValueError,
                         "ImageSource: sample %lld's bytes run past the end of its buffer",
                         (long long)i);
            return -1;
        }
    }
    self->memory_core = (fl_memory_source){
        .bases = self->bases, .which = w, .ranges = rv, .length = n};
    self->core.read_bytes = fl_memory_read;
    self->core.bytes_ctx = &self->memory_core;
    return 0;
}

static PyObject *ImageSource_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"paths", "offsets", "labels", "plan", "exact", "max_pixels",
                             "skip", "fallback", "ranges", "fallback_all", "cache", "lmdb",
                             "memory", "cache_pixels", "gpu_split", "cache_restart",
                             "records", NULL};
    PyObject *paths, *offsets, *labels, *plan = Py_None, *fallback = Py_None, *ranges = Py_None;
    PyObject *cache = Py_None, *lmdb = Py_None, *memory = Py_None, *gpu_split = Py_None;
    PyObject *records = Py_None;
    int exact = 0, skip = 0, fallback_all = 0, cache_pixels = 0, cache_restart = 0;
    unsigned long long max_pixels = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "SOO|O$pKpOOpOOOpOpO:ImageSource", kwlist,
                                     &paths, &offsets, &labels, &plan, &exact, &max_pixels,
                                     &skip, &fallback, &ranges, &fallback_all, &cache, &lmdb,
                                     &memory, &cache_pixels, &gpu_split, &cache_restart,
                                     &records))
        return NULL;
    image_split split = {0};
    if (gpu_split != Py_None) {
        unsigned long long bytes, entries, pixels;
        if (!PyArg_ParseTuple(gpu_split, "KKKi:gpu_split", &bytes, &entries, &pixels,
                              &split.explore))
            return NULL;
        split.on = 1;
        split.bytes = bytes;
        split.entries = entries;
        split.pixels = pixels;
    }
    struct fl_sample_cache *core_cache = NULL;
    if (cache != Py_None && !(core_cache = fl__sample_cache_of(cache)))
        return NULL;
    if (cache_pixels && !core_cache) {
        PyErr_SetString(PyExc_ValueError, "ImageSource: cache_pixels needs a cache");
        return NULL;
    }
    if (core_cache && !cache_pixels && (lmdb != Py_None || memory != Py_None)) {
        /* The bytes lie in memory (an LMDB map, a table) already. */
        PyErr_SetString(PyExc_ValueError,
                        "ImageSource: a source in memory (lmdb, memory) caches pixels only");
        return NULL;
    }
    if (records != Py_None && (core_cache || lmdb != Py_None || memory != Py_None)) {
        /* A record's label is read with its image: a cache would lose it. */
        PyErr_SetString(PyExc_ValueError, "ImageSource: records excludes cache, lmdb, memory");
        return NULL;
    }
    const struct fl_lmdb_source *lmdb_core = NULL;
    if (lmdb != Py_None && !(lmdb_core = fl__lmdb_core(lmdb)))
        return NULL;
    if (check_vector(offsets, "offsets") < 0 || check_vector(labels, "labels") < 0)
        return NULL;
    if (PyArray_DIM((PyArrayObject *)labels, 0) != PyArray_DIM((PyArrayObject *)offsets, 0)) {
        PyErr_SetString(PyExc_ValueError, "ImageSource: offsets and labels differ in length");
        return NULL;
    }
    /* Every offset must point at a NUL-terminated path inside the blob. */
    int64_t n = PyArray_DIM((PyArrayObject *)offsets, 0);
    PyArrayObject *r = (PyArrayObject *)ranges;
    if (ranges != Py_None &&
        (!PyArray_Check(ranges) || PyArray_TYPE(r) != NPY_INT64 || PyArray_NDIM(r) != 2 ||
         PyArray_DIM(r, 0) != n || PyArray_DIM(r, 1) != 2 || !PyArray_IS_C_CONTIGUOUS(r))) {
        PyErr_SetString(PyExc_TypeError,
                        "ImageSource: ranges must be a contiguous int64 array (samples, 2)");
        return NULL;
    }
    if (ranges != Py_None) {
        const int64_t *rv = PyArray_DATA(r);
        for (int64_t i = 0; i < 2 * n; i++)
            if (rv[i] < 0) {
                PyErr_SetString(PyExc_ValueError, "ImageSource: a range is negative");
                return NULL;
            }
    }
    const int64_t *off = PyArray_DATA((PyArrayObject *)offsets);
    Py_ssize_t blob = PyBytes_GET_SIZE(paths);
    if (blob == 0 || PyBytes_AS_STRING(paths)[blob - 1] != '\0') {
        PyErr_SetString(PyExc_ValueError, "ImageSource: paths must end with a NUL");
        return NULL;
    }
    for (int64_t i = 0; i < n; i++)
        if (off[i] < 0 || off[i] >= blob) {
            PyErr_SetString(PyExc_ValueError, "ImageSource: an offset is outside the paths");
            return NULL;
        }

    fl_image_plan p = {
        .crop = FL_CROP_NONE,
        .filter = FL_FILTER_BILINEAR,
        .dtype = FL_DTYPE_UINT8,
        .layout = FL_LAYOUT_HWC,
        .channels = 3,
        .mul = {1.0f, 1.0f, 1.0f},
    };
    int tensor_output = 0;
    if (plan != Py_None) {
        if (fl__parse_plan(plan, &p) < 0)
            return NULL;
        PyObject *flag = PyObject_GetAttrString(plan, "tensor_output");
        tensor_output = flag ? PyObject_IsTrue(flag) : -1;
        Py_XDECREF(flag);
        if (tensor_output < 0)
            return NULL;
    }
    p.exact = exact || cache_pixels; /* pixels are decoded whole: no DCT scaling */
    p.max_pixels = max_pixels ? max_pixels : UINT64_MAX; /* 0: no limit */

    ImageSourceObject *self = (ImageSourceObject *)type->tp_alloc(type, 0);
    if (!self)
        return NULL;
    self->paths = Py_NewRef(paths);
    self->offsets = Py_NewRef(offsets);
    self->labels = Py_NewRef(labels);
    self->fallback = Py_NewRef(fallback);
    self->ranges = Py_NewRef(ranges);
    self->cache = Py_NewRef(cache);
    self->lmdb = Py_NewRef(lmdb);
    self->memory = Py_NewRef(memory);
    self->decode_error = Py_NewRef(fl__state_of_type(type)->DecodeError);
    self->core = (fl_image_source){
        .paths = PyBytes_AS_STRING(paths),
        .offsets = off,
        .labels = PyArray_DATA((PyArrayObject *)labels),
        .ranges = ranges != Py_None ? PyArray_DATA(r) : NULL,
        .length = n,
        .plan = p,
        .skip = skip,
        .fallback = pillow_fallback,
        .fallback_ctx = self->fallback,
        .fallback_all = fallback_all,
        .cache = core_cache,
        .cache_pixels = cache_pixels,
        .cache_restart = cache_restart && core_cache && !cache_pixels,
    };
    if (lmdb_core) {
        self->core.read_bytes = fl__lmdb_read_bytes;
        self->core.bytes_ctx = lmdb_core;
    }
    if (records != Py_None) {
        const struct fl_tfrecord_source *records_core = fl__tfrecord_core(records, n);
        if (!records_core) {
            Py_DECREF(self);
            return NULL;
        }
        self->records = Py_NewRef(records);
        self->core.read_sample = fl_tfrecord_read_sample;
        self->core.sample_ctx = records_core;
    }
    if (memory != Py_None && attach_memory(self, memory, r) < 0) {
        Py_DECREF(self);
        return NULL;
    }
    self->has_shape = p.out_w > 0 && p.out_h > 0;
    self->channels_first = tensor_output && p.layout == FL_LAYOUT_HWC;
    if (split.on) {
        const char *why;
        if (!fl_plan_gpu_capable(&p, &why)) {
            Py_DECREF(self);
            PyErr_Format(PyExc_ValueError, "ImageSource: the GPU cannot run this transform (%s)",
                         why);
            return NULL;
        }
    }
    self->split.on = split.on;
    self->split.bytes = split.bytes;
    self->split.entries = split.entries;
    self->split.pixels = split.pixels;
    self->split.explore = split.explore;
    atomic_init(&self->split.share, 0);
    atomic_init(&self->split.batches, 0);
    self->head.ops = split.on ? &split_ops : &image_ops;
    self->head.core = &self->core;
    self->head.length = n;
    return (PyObject *)self;
}

static int ImageSource_traverse(ImageSourceObject *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->fallback);
    Py_VISIT(self->decode_error);
    return 0;
}

static int ImageSource_clear(ImageSourceObject *self)
{
    /* paths, offsets and labels back self->core: they stay until dealloc. */
    Py_CLEAR(self->decode_error);
    return 0;
}

static void ImageSource_dealloc(ImageSourceObject *self)
{
    PyTypeObject *type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    ImageSource_clear(self);
    Py_CLEAR(self->paths);
    Py_CLEAR(self->offsets);
    Py_CLEAR(self->labels);
    Py_CLEAR(self->fallback);
    Py_CLEAR(self->ranges);
    Py_CLEAR(self->cache);
    Py_CLEAR(self->lmdb);
    Py_CLEAR(self->records);
    release_memory(self);
    Py_CLEAR(self->memory);
    type->tp_free(self);
    Py_DECREF(type);
}

/* --------------------------------------------------------- single samples */

/* The prologue of sample() and geometry(): parses (index, seed, epoch),
 * then reads the sample's file and decides its geometry (crop, flip, output
 * size) without the GIL.  The bytes stay in this thread's buffer (*w), so
 * the decode can follow without reading again.  Returns 0, or -1 with the
 * error raised (the sample's, naming its file). */
static int prepare_sample(ImageSourceObject *self, PyObject *const *args, Py_ssize_t nargs,
                          const char *name, fl_sample_key *key, fl_image_worker **w,
                          fl_image_file *file, fl_sample_geometry *g)
{
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "%s() takes 3 arguments", name);
        return -1;
    }
    long long index = PyLong_AsLongLong(args[0]);
    key->seed = PyLong_AsUnsignedLongLongMask(args[1]);
    key->epoch = PyLong_AsUnsignedLongLongMask(args[2]);
    if (PyErr_Occurred())
        return -1;
    if (index < 0 || index >= self->core.length)
        return fl__index_error(index, self->core.length);
    key->index = (uint64_t)index;
    if (!(*w = fl__image_worker()))
        return -1;
    fl_image_failure f;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = fl_image_source_read(&self->core, *w, (int64_t)key->index, file, &f);
    if (rc == FL_OK)
        rc = fl_image_source_decode(&self->core, *w, file, key, NULL, g, &f);
    Py_END_ALLOW_THREADS
    if (rc != FL_OK) {
        raise_sample_error(self, &f);
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(sample_doc,
             "sample(index, seed, epoch, /)\n--\n\n"
             "One transformed sample as a fresh array (its shape may depend on the\n"
             "image when the plan does not fix it).");

static PyObject *ImageSource_sample(ImageSourceObject *self, PyObject *const *args,
                                    Py_ssize_t nargs)
{
    fl_sample_key key;
    fl_image_worker *w;
    fl_image_file file;
    fl_sample_geometry g;
    if (prepare_sample(self, args, nargs, "sample", &key, &w, &file, &g) < 0)
        return NULL;
    npy_intp dims[3];
    fl__image_dims(&self->core.plan, g.out_w, g.out_h, dims);
    PyObject *arr = PyArray_NewFromDescr(&PyArray_Type, fl__plan_descr(&self->core.plan), 3,
                                         dims, NULL, NULL, 0, NULL);
    if (!arr)
        return NULL;
    void *dst = PyArray_DATA((PyArrayObject *)arr);
    fl_image_failure f;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = fl_image_source_decode(&self->core, w, &file, &key, dst, &g, &f);
    Py_END_ALLOW_THREADS
    if (rc != FL_OK) {
        Py_DECREF(arr);
        raise_sample_error(self, &f);
        return NULL;
    }
    return arr;
}

PyDoc_STRVAR(geometry_doc,
             "geometry(index, seed, epoch, /)\n--\n\n"
             "The crop decided for a sample: a dict with box (x, y, w, h in source\n"
             "pixels), flip, scale_denom, hard_crop, size (w, h), out (w, h),\n"
             "crop_at (RandomCrop's top, left in the padded or resized image) and\n"
             "blur_sigma (None: no blur).");

static PyObject *ImageSource_geometry(ImageSourceObject *self, PyObject *const *args,
                                      Py_ssize_t nargs)
{
    fl_sample_key key;
    fl_image_worker *w;
    fl_image_file file;
    fl_sample_geometry g;
    if (prepare_sample(self, args, nargs, "geometry", &key, &w, &file, &g) < 0)
        return NULL;
    return Py_BuildValue("{s(dddd)sNsisis(ii)s(ii)s(ii)sN}", "box", g.box.x, g.box.y, g.box.w,
                         g.box.h, "flip", PyBool_FromLong(g.flip), "scale_denom", g.scale_denom,
                         "hard_crop", g.hard_crop, "size", g.src_w, g.src_h, "out", g.out_w,
                         g.out_h, "crop_at", g.crop_y, g.crop_x, "blur_sigma",
                         g.blur.on ? PyFloat_FromDouble(g.blur.sigma) : Py_NewRef(Py_None));
}

PyDoc_STRVAR(decode_only_doc,
             "decode_only(indices, /)\n--\n\n"
             "Reads and fully decodes the images (JPEG, PNG, WebP) `indices` into\n"
             "this thread's reused decoder buffer and nothing else (no crop, resize\n"
             "or copy out), with\n"
             "the GIL released: the decode ceiling the pipeline is measured\n"
             "against.  Returns the number of images decoded; raises for the first\n"
             "that fails.");

static PyObject *ImageSource_decode_only(ImageSourceObject *self, PyObject *indices)
{
    int64_t *idx = NULL;
    Py_ssize_t n;
    if (fl__convert_indices(indices, self->core.length, &idx, &n) < 0)
        return NULL;
    fl_image_worker *w = fl__image_worker();
    if (!w) {
        PyMem_RawFree(idx);
        return NULL;
    }
    fl_image_failure f = {.status = FL_OK};
    Py_ssize_t done = 0;
    Py_BEGIN_ALLOW_THREADS
    for (; done < n; done++) {
        const unsigned char *rgb;
        size_t stride;
        int width, height;
        fl_image_file file;
        if (fl_image_source_read(&self->core, w, idx[done], &file, &f) != FL_OK)
            break;
        if (file.format == FL_FORMAT_PIXELS) /* decoded already */
            f.status = fl_image_source_pixels(&file, &rgb, &width, &height, &stride, f.msg,
                                              sizeof f.msg);
        else
            f.status = fl_decode_full(w, file.data, file.size, self->core.plan.max_pixels,
                                      &rgb, &width, &height, &stride, f.msg, sizeof f.msg);
        if (f.status != FL_OK)
            break;
    }
    Py_END_ALLOW_THREADS
    PyMem_RawFree(idx);
    if (f.status != FL_OK) {
        raise_sample_error(self, &f);
        return NULL;
    }
    return PyLong_FromSsize_t(done);
}

PyDoc_STRVAR(batch_doc,
             "batch(indices, pool, convert, seed, epoch, mix=None, batch=0, /)\n--\n\n"
             "Decodes and transforms the samples `indices` into one batch: returns\n"
             "([images, labels], skipped), images (B, C, H, W) or (B, H, W, C) in\n"
             "the plan's dtype, labels int64, both in a slot of `pool` (or fresh\n"
             "arrays when it is None) passed through `convert`; skipped is a list\n"
             "of (index, path, message) for samples replaced (on_error='skip').\n"
             "With a mix plan (MixUp / CutMix) the batch is mixed in place, keyed by\n"
             "(seed, epoch, batch), and labels are float32 (B, num_classes).");

static PyMethodDef ImageSource_methods[] = {
    {"batch", (PyCFunction)(void (*)(void))fl__native_batch_method, METH_FASTCALL, batch_doc},
    {"sample", (PyCFunction)(void (*)(void))ImageSource_sample, METH_FASTCALL, sample_doc},
    {"geometry", (PyCFunction)(void (*)(void))ImageSource_geometry, METH_FASTCALL,
     geometry_doc},
    {"decode_only", (PyCFunction)ImageSource_decode_only, METH_O, decode_only_doc},
    {NULL, NULL, 0, NULL},
};

static PyObject *ImageSource_get_gpu_share(ImageSourceObject *self, void *closure)
{
    (void)closure;
    if (!self->split.on)
        Py_RETURN_NONE;
    return PyFloat_FromDouble((double)atomic_load(&self->split.share) / SHARE_ONE);
}

static int ImageSource_set_gpu_share(ImageSourceObject *self, PyObject *value, void *closure)
{
    (void)closure;
    if (!self->split.on) {
        PyErr_SetString(PyExc_AttributeError, "gpu_share: the source was made without gpu_split");
        return -1;
    }
    double share = value ? PyFloat_AsDouble(value) : -1.0;
    if (share == -1.0 && PyErr_Occurred())
        return -1;
    if (!(share >= 0.0 && share <= 1.0)) {
        PyErr_SetString(PyExc_ValueError, "gpu_share must be in [0, 1]");
        return -1;
    }
    atomic_store(&self->split.share, (uint32_t)llround(share * SHARE_ONE));
    return 0;
}

static PyGetSetDef ImageSource_getset[] = {
    {"gpu_share", (getter)ImageSource_get_gpu_share, (setter)ImageSource_set_gpu_share,
     "The GPU's share of each batch's JPEGs (gpu_split sources; else None).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot ImageSource_slots[] = {
    {Py_tp_doc, "ImageSource(paths, offsets, labels, plan=None, *, exact=False, max_pixels=0, "
                "skip=False, fallback=None, ranges=None, fallback_all=False, cache=None, "
                "cache_pixels=False, gpu_split=None, cache_restart=False, records=None)\n--\n\n"
                "The native source of fastload's image datasets (max_pixels=0: no limit;\n"
                "ranges: (offset, size) of each sample inside its file; fallback_all: PNG\n"
                "and WebP files go to the fallback decoder too; cache: a SampleCache\n"
                "of the samples' bytes, or with cache_pixels of their decoded pixels;\n"
                "cache_restart: JPEGs cached rewritten with restart markers;\n"
                "gpu_split=(bytes, entries, pixels, explore): batches leave gpu_share of\n"
                "their JPEGs to the GPU decode stage, as a third output, the GPU's part,\n"
                "of those budgets per image; every explore-th batch gives each side one;\n"
                "records: a TFRecordSource the samples and their labels are read from)."},
    {Py_tp_new, ImageSource_new},
    {Py_tp_dealloc, ImageSource_dealloc},
    {Py_tp_traverse, ImageSource_traverse},
    {Py_tp_clear, ImageSource_clear},
    {Py_tp_methods, ImageSource_methods},
    {Py_tp_getset, ImageSource_getset},
    {0, NULL},
};

PyType_Spec fl__ImageSource_spec = {
    .name = "fastload._C.ImageSource",
    .basicsize = sizeof(ImageSourceObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .slots = ImageSource_slots,
};
