/* fastload._C: ImageSource — the native path of the image datasets.
 *
 * An ImageSource holds what a worker needs to turn sample indices into a
 * batch: the file paths (one bytes blob of NUL-terminated paths and an int64
 * array of where each starts, so 1.28 M files cost two objects), the labels,
 * and the compiled transform plan.  batch() decodes every sample with the
 * GIL released, each straight into its row of the batch slot; files that are
 * not JPEGs are decoded afterwards by a Python fallback (Pillow), with the
 * GIL, and run through the same ops.
 *
 * Errors: with on_error="raise" the first failing sample stops the batch and
 * raises (OSError for a file that cannot be read, the dataset's decode error
 * type otherwise), naming the file and the sample index.  With "skip" the
 * sample is replaced by the next index (i + 1, i + 2, ... modulo the length)
 * and reported in the second item batch() returns.
 */
#include "fastload.h"

#include "core/pipeline.h"
#include "core/resample.h"
#include "core/status.h"

#include <string.h>

#define MSG_SIZE 256
#define MAX_SKIPS_PER_SAMPLE 64 /* then the last error is raised */

typedef struct ImageSourceObject {
    PyObject_HEAD
    PyObject *paths;       /* bytes: NUL-terminated paths back to back */
    PyObject *offsets;     /* int64 ndarray: start of path i in `paths` */
    PyObject *labels;      /* int64 ndarray */
    PyObject *fallback;    /* callable(path) -> HWC uint8 ndarray, or None */
    PyObject *error_type;  /* exception type for undecodable samples */
    fl_image_plan plan;
    int has_shape;         /* the plan fixes the output size: batches stack */
    int skip;              /* on_error == "skip" */
    int64_t length;
} ImageSourceObject;

/* One sample's outcome, filled without the GIL. */
typedef struct sample_result {
    int64_t index;         /* the index finally used (after skips) */
    int status;            /* FL_OK, FL_ERR_*, or NEEDS_FALLBACK */
    int err;               /* errno for FL_ERR_IO */
    char msg[MSG_SIZE];
} sample_result;

#define NEEDS_FALLBACK 1

typedef struct skip_record {
    int64_t index;
    int status;
    char msg[MSG_SIZE];
} skip_record;

static const char *path_of(ImageSourceObject *self, int64_t index)
{
    const int64_t *offsets = PyArray_DATA((PyArrayObject *)self->offsets);
    return PyBytes_AS_STRING(self->paths) + offsets[index];
}

/* ------------------------------------------------------------ construction */

static int parse_plan(PyObject *t, fl_image_plan *p)
{
    /* The order of fastload.transforms.Plan.as_tuple(). */
    double mul[3], add[3];
    if (!PyArg_ParseTuple(t, "iiiddddiiiiiiiidiidddddd", &p->crop, &p->out_h, &p->out_w,
                          &p->scale_lo, &p->scale_hi, &p->ratio_lo, &p->ratio_hi, &p->resize,
                          &p->resize_h, &p->resize_w, &p->max_size, &p->crop_h, &p->crop_w,
                          &p->filter, &p->antialias, &p->flip_p, &p->dtype, &p->layout, &mul[0],
                          &mul[1], &mul[2], &add[0], &add[1], &add[2]))
        return -1;
    for (int c = 0; c < 3; c++) {
        p->mul[c] = (float)mul[c];
        p->add[c] = (float)add[c];
    }
    if (p->dtype < FL_DTYPE_UINT8 || p->dtype > FL_DTYPE_FLOAT16 || p->layout < 0 ||
        p->layout > 1 || p->filter < 0 || p->filter > 2 || p->crop < 0 || p->crop > 2) {
        PyErr_SetString(PyExc_ValueError, "ImageSource: malformed plan");
        return -1;
    }
    return 0;
}

static PyObject *ImageSource_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"paths", "offsets", "labels", "plan", "exact", "max_pixels",
                             "skip", "fallback", "error_type", NULL};
    PyObject *paths, *offsets, *labels, *plan, *fallback, *error_type;
    int exact, skip;
    unsigned long long max_pixels;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "SOOOpKpOO", kwlist, &paths, &offsets, &labels,
                                     &plan, &exact, &max_pixels, &skip, &fallback, &error_type))
        return NULL;
    if (!PyArray_Check(offsets) || PyArray_TYPE((PyArrayObject *)offsets) != NPY_INT64 ||
        PyArray_NDIM((PyArrayObject *)offsets) != 1 ||
        !PyArray_IS_C_CONTIGUOUS((PyArrayObject *)offsets) || !PyArray_Check(labels) ||
        PyArray_TYPE((PyArrayObject *)labels) != NPY_INT64 ||
        PyArray_NDIM((PyArrayObject *)labels) != 1 ||
        !PyArray_IS_C_CONTIGUOUS((PyArrayObject *)labels) ||
        PyArray_DIM((PyArrayObject *)labels, 0) != PyArray_DIM((PyArrayObject *)offsets, 0)) {
        PyErr_SetString(PyExc_TypeError,
                        "ImageSource: offsets and labels must be int64 vectors of one length");
        return NULL;
    }
    /* Every offset must point at a NUL-terminated path inside the blob. */
    int64_t n = PyArray_DIM((PyArrayObject *)offsets, 0);
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

    ImageSourceObject *self = (ImageSourceObject *)type->tp_alloc(type, 0);
    if (!self)
        return NULL;
    if (plan == Py_None) {
        self->plan.crop = FL_CROP_NONE;
        self->plan.filter = FL_FILTER_BILINEAR;
        self->plan.dtype = FL_DTYPE_UINT8;
        self->plan.layout = FL_LAYOUT_HWC;
        for (int c = 0; c < 3; c++)
            self->plan.mul[c] = 1.0f;
    } else if (parse_plan(plan, &self->plan) < 0) {
        Py_DECREF(self);
        return NULL;
    }
    self->plan.exact = exact;
    self->plan.max_pixels = max_pixels;
    self->has_shape = self->plan.out_w > 0 && self->plan.out_h > 0;
    self->skip = skip;
    self->length = n;
    self->paths = Py_NewRef(paths);
    self->offsets = Py_NewRef(offsets);
    self->labels = Py_NewRef(labels);
    self->fallback = Py_NewRef(fallback);
    self->error_type = Py_NewRef(error_type);
    return (PyObject *)self;
}

static int ImageSource_traverse(ImageSourceObject *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->fallback);
    Py_VISIT(self->error_type);
    return 0;
}

static int ImageSource_clear(ImageSourceObject *self)
{
    Py_CLEAR(self->paths);
    Py_CLEAR(self->offsets);
    Py_CLEAR(self->labels);
    Py_CLEAR(self->fallback);
    Py_CLEAR(self->error_type);
    return 0;
}

static void ImageSource_dealloc(ImageSourceObject *self)
{
    PyTypeObject *type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    ImageSource_clear(self);
    type->tp_free(self);
    Py_DECREF(type);
}

/* ------------------------------------------------------------- one sample */

/* The raised exception, taken (cleared); NULL when none. */
static PyObject *fl__take_exception(void)
{
#if PY_VERSION_HEX >= 0x030C0000
    return PyErr_GetRaisedException();
#else
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    Py_XDECREF(type);
    Py_XDECREF(tb);
    return value;
#endif
}

/* The JPEG path, callable without the GIL. */
static int run_jpeg(const ImageSourceObject *self, fl_image_worker *w, const char *path,
                    const fl_sample_key *key, void *dst, fl_sample_geometry *geometry,
                    sample_result *r)
{
    const unsigned char *data;
    size_t size;
    int rc = fl_read_file(w, path, &data, &size, &r->err, r->msg, MSG_SIZE);
    if (rc != FL_OK)
        return rc;
    if (size > 0 && !fl_is_jpeg(data, size))
        return NEEDS_FALLBACK;
    return fl_pipeline_jpeg(w, &self->plan, key, data, size, dst, geometry, r->msg, MSG_SIZE);
}

/* The fallback path, with the GIL: the Python decoder's HWC uint8 image
 * through the same ops.  Returns a status; a Python exception raised by the
 * fallback is turned into FL_ERR_DECODE with its message (and cleared). */
static int run_fallback(ImageSourceObject *self, fl_image_worker *w, const char *path,
                        const fl_sample_key *key, void *dst, fl_sample_geometry *geometry,
                        sample_result *r)
{
    if (self->fallback == Py_None) {
        snprintf(r->msg, MSG_SIZE, "not a JPEG, and Pillow is not installed to decode it");
        return FL_ERR_DECODE;
    }
    PyObject *img = PyObject_CallFunction(self->fallback, "s", path);
    if (!img) {
        PyObject *exc = fl__take_exception();
        PyObject *text = exc ? PyObject_Str(exc) : NULL;
        const char *utf8 = text ? PyUnicode_AsUTF8(text) : NULL;
        snprintf(r->msg, MSG_SIZE, "%s", utf8 ? utf8 : "decoding failed");
        PyErr_Clear();
        Py_XDECREF(text);
        Py_XDECREF(exc);
        return FL_ERR_DECODE;
    }
    int rc;
    PyArrayObject *a = (PyArrayObject *)img;
    if (!PyArray_Check(img) || PyArray_NDIM(a) != 3 || PyArray_DIM(a, 2) != 3 ||
        PyArray_TYPE(a) != NPY_UINT8 || PyArray_STRIDE(a, 2) != 1 || PyArray_STRIDE(a, 1) != 3) {
        snprintf(r->msg, MSG_SIZE, "the fallback decoder did not return an HWC uint8 RGB array");
        rc = FL_ERR_DECODE;
    } else {
        const unsigned char *rgb = PyArray_DATA(a);
        int width = (int)PyArray_DIM(a, 1), height = (int)PyArray_DIM(a, 0);
        size_t stride = (size_t)PyArray_STRIDE(a, 0);
        rc = fl_pipeline_pixels(w, &self->plan, key, rgb, width, height, stride, dst, geometry,
                                r->msg, MSG_SIZE);
    }
    Py_DECREF(img);
    return rc;
}

/* Raises the error of a failed sample, naming the file and index. */
static void raise_sample_error(ImageSourceObject *self, const sample_result *r)
{
    const char *path = path_of(self, r->index);
    if (r->status == FL_ERR_IO && r->err != 0) {
        /* OSError(errno, strerror, filename): the subclass for the errno
         * (FileNotFoundError, ...), and str() names the file. */
        char text[MSG_SIZE + 48];
        snprintf(text, sizeof text, "%s (sample index %lld)", r->msg, (long long)r->index);
        PyObject *args = Py_BuildValue("(iss)", r->err, text, path);
        if (args) {
            PyErr_SetObject(PyExc_OSError, args);
            Py_DECREF(args);
        }
        return;
    }
    if (r->status == FL_ERR_NOMEM) {
        PyErr_Format(PyExc_MemoryError, "%s (sample index %lld): %s", path, (long long)r->index,
                     r->msg);
        return;
    }
    PyErr_Format(self->error_type, "cannot decode %s (sample index %lld): %s", path,
                 (long long)r->index, r->msg);
}

/* ----------------------------------------------------------------- batch */

/* After a failed sample: with on_error="skip" (and tries left), records the
 * failure and moves r to the next index, returning 1; else returns 0 and the
 * batch fails with r's error.  Plain C: called with or without the GIL. */
static int skip_to_next(const ImageSourceObject *self, sample_result *r, int tries,
                        skip_record *skips, Py_ssize_t *n_skips, Py_ssize_t capacity)
{
    if (!self->skip || tries + 1 >= MAX_SKIPS_PER_SAMPLE || r->status == FL_ERR_NOMEM)
        return 0;
    if (*n_skips < capacity) {
        skip_record *s = &skips[(*n_skips)++];
        s->index = r->index;
        s->status = r->status;
        memcpy(s->msg, r->msg, MSG_SIZE);
    }
    r->index = (r->index + 1) % self->length;
    return 1;
}

static PyObject *skipped_list(ImageSourceObject *self, const skip_record *skips, Py_ssize_t n)
{
    PyObject *list = PyList_New(n);
    if (!list)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = Py_BuildValue("(Lss)", (long long)skips[i].index,
                                       path_of(self, skips[i].index), skips[i].msg);
        if (!item) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, i, item);
    }
    return list;
}

static PyArray_Descr *plan_descr(const fl_image_plan *plan)
{
    int type = plan->dtype == FL_DTYPE_FLOAT32   ? NPY_FLOAT32
               : plan->dtype == FL_DTYPE_FLOAT16 ? NPY_FLOAT16
                                                 : NPY_UINT8;
    return PyArray_DescrFromType(type);
}

/* The shape of one image in the plan's layout. */
static void image_dims(const fl_image_plan *plan, int width, int height, npy_intp *dims)
{
    if (plan->layout == FL_LAYOUT_CHW) {
        dims[0] = 3, dims[1] = height, dims[2] = width;
    } else {
        dims[0] = height, dims[1] = width, dims[2] = 3;
    }
}

static size_t plan_sample_bytes(const fl_image_plan *plan)
{
    size_t item = plan->dtype == FL_DTYPE_FLOAT32 ? 4 : plan->dtype == FL_DTYPE_FLOAT16 ? 2 : 1;
    return (size_t)plan->out_w * (size_t)plan->out_h * 3 * item;
}

PyDoc_STRVAR(batch_doc,
             "batch(indices, pool, convert, seed, epoch, /)\n--\n\n"
             "Decodes and transforms the samples `indices` into one batch: returns\n"
             "([images, labels], skipped), images (B, C, H, W) or (B, H, W, C) in\n"
             "the plan's dtype, labels int64, both in a slot of `pool` (or fresh\n"
             "arrays when it is None) passed through `convert`; skipped is a list\n"
             "of (index, path, message) for samples replaced (on_error='skip').");

static PyObject *ImageSource_batch(ImageSourceObject *self, PyObject *const *args,
                                   Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "batch() takes 5 arguments");
        return NULL;
    }
    if (!self->has_shape) {
        PyErr_SetString(PyExc_TypeError, "batch(): the transform does not fix the output size");
        return NULL;
    }
    unsigned long long seed = PyLong_AsUnsignedLongLongMask(args[3]);
    unsigned long long epoch = PyLong_AsUnsignedLongLongMask(args[4]);
    if (PyErr_Occurred())
        return NULL;
    fastload_state *state = fl__state_of_type(Py_TYPE(self));
    int64_t *idx = NULL;
    Py_ssize_t n = 0, n_skips = 0;
    sample_result *results = NULL;
    skip_record *skips = NULL;
    fl__batch_out out = {0};
    PyObject *batch = NULL, *skipped = NULL, *result = NULL;
    PyArray_Descr *descrs[2] = {plan_descr(&self->plan), PyArray_DescrFromType(NPY_INT64)};
    int ndims[2] = {4, 1};
    npy_intp dims[2][NPY_MAXDIMS];

    if (fl__convert_indices(args[0], self->length, &idx, &n) < 0)
        goto done;
    results = PyMem_RawCalloc((size_t)(n > 0 ? n : 1), sizeof *results);
    skips = PyMem_RawCalloc((size_t)(n > 0 ? n : 1) * 4, sizeof *skips);
    if (!results || !skips) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t skip_capacity = (n > 0 ? n : 1) * 4;
    dims[0][0] = dims[1][0] = n;
    image_dims(&self->plan, self->plan.out_w, self->plan.out_h, &dims[0][1]);
    if (fl__batch_out_alloc(&out, state, args[1], 2, descrs, ndims, dims) < 0)
        goto done;

    size_t row_bytes = plan_sample_bytes(&self->plan);
    const int64_t *labels = PyArray_DATA((PyArrayObject *)self->labels);
    int64_t *label_out = (int64_t *)out.data[1];
    int failed = 0, nomem = 0;
    Py_BEGIN_ALLOW_THREADS
    fl_image_worker *w = fl_image_worker_get();
    if (!w)
        nomem = 1;
    for (Py_ssize_t p = 0; w && p < n && !failed; p++) {
        sample_result *r = &results[p];
        r->index = idx[p];
        for (int tries = 0;; tries++) {
            fl_sample_key key = {seed, epoch, (uint64_t)r->index};
            r->err = 0;
            r->status = run_jpeg(self, w, path_of(self, r->index), &key,
                                 out.data[0] + (size_t)p * row_bytes, NULL, r);
            if (r->status == FL_OK || r->status == NEEDS_FALLBACK)
                break;
            if (!skip_to_next(self, r, tries, skips, &n_skips, skip_capacity)) {
                failed = 1;
                break;
            }
        }
        label_out[p] = labels[r->index];
    }
    Py_END_ALLOW_THREADS
    if (nomem) {
        PyErr_NoMemory();
        goto done;
    }

    /* Files that were not JPEGs, with the GIL: the same retry rule. */
    fl_image_worker *w = fl_image_worker_get();
    for (Py_ssize_t p = 0; !failed && p < n; p++) {
        sample_result *r = &results[p];
        if (r->status != NEEDS_FALLBACK)
            continue;
        for (int tries = 0;; tries++) {
            fl_sample_key key = {seed, epoch, (uint64_t)r->index};
            void *dst = out.data[0] + (size_t)p * row_bytes;
            r->status = run_jpeg(self, w, path_of(self, r->index), &key, dst, NULL, r);
            if (r->status == NEEDS_FALLBACK)
                r->status = run_fallback(self, w, path_of(self, r->index), &key, dst, NULL, r);
            if (r->status == FL_OK)
                break;
            if (!skip_to_next(self, r, tries, skips, &n_skips, skip_capacity)) {
                failed = 1;
                break;
            }
        }
        label_out[p] = labels[r->index];
    }
    if (failed) {
        for (Py_ssize_t p = 0; p < n; p++)
            if (results[p].status != FL_OK && results[p].status != NEEDS_FALLBACK) {
                raise_sample_error(self, &results[p]);
                break;
            }
        goto done;
    }

    batch = fl__batch_out_finish(&out, descrs, ndims, dims, args[2]);
    if (!batch)
        goto done;
    skipped = skipped_list(self, skips, n_skips);
    if (!skipped)
        goto done;
    result = PyTuple_Pack(2, batch, skipped);
done:
    Py_XDECREF(batch);
    Py_XDECREF(skipped);
    fl__batch_out_clear(&out);
    Py_DECREF(descrs[0]);
    Py_DECREF(descrs[1]);
    PyMem_RawFree(results);
    PyMem_RawFree(skips);
    PyMem_RawFree(idx);
    return result;
}

/* --------------------------------------------------------- single samples */

PyDoc_STRVAR(sample_doc,
             "sample(index, seed, epoch, /)\n--\n\n"
             "One transformed sample as a fresh array (its shape may depend on the\n"
             "image when the plan does not fix it).");

/* Parses (index, seed, epoch) for sample() and geometry(). */
static int sample_key(ImageSourceObject *self, PyObject *const *args, Py_ssize_t nargs,
                      const char *name, fl_sample_key *key)
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
    if (index < 0 || index >= self->length)
        return fl__index_error(index, self->length);
    key->index = (uint64_t)index;
    return 0;
}

/* One sample's file and geometry (its crop, flip and output size).  Reads
 * the file and header without the GIL; the bytes stay in this thread's
 * buffer (data, size) until its next read, so the decode can follow without
 * reading again.  *jpeg is 0 when the Pillow fallback decoded it instead.
 * Returns 0, or -1 with the sample's error raised. */
static int prepare_sample(ImageSourceObject *self, fl_image_worker *w, const fl_sample_key *key,
                          fl_sample_geometry *g, const unsigned char **data, size_t *size,
                          int *jpeg, sample_result *r)
{
    const char *path = path_of(self, (int64_t)key->index);
    r->index = (int64_t)key->index;
    Py_BEGIN_ALLOW_THREADS
    r->status = fl_read_file(w, path, data, size, &r->err, r->msg, MSG_SIZE);
    if (r->status == FL_OK && *size > 0 && !fl_is_jpeg(*data, *size))
        r->status = NEEDS_FALLBACK;
    else if (r->status == FL_OK)
        r->status = fl_pipeline_jpeg(w, &self->plan, key, *data, *size, NULL, g, r->msg,
                                     MSG_SIZE);
    Py_END_ALLOW_THREADS
    *jpeg = r->status != NEEDS_FALLBACK;
    if (!*jpeg)
        r->status = run_fallback(self, w, path, key, NULL, g, r);
    if (r->status != FL_OK) {
        raise_sample_error(self, r);
        return -1;
    }
    return 0;
}

static PyObject *ImageSource_sample(ImageSourceObject *self, PyObject *const *args,
                                    Py_ssize_t nargs)
{
    fl_sample_key key;
    if (sample_key(self, args, nargs, "sample", &key) < 0)
        return NULL;
    fl_image_worker *w = fl_image_worker_get();
    if (!w)
        return PyErr_NoMemory();
    sample_result r = {0};
    fl_sample_geometry g;
    const unsigned char *data = NULL;
    size_t size = 0;
    int jpeg;
    if (prepare_sample(self, w, &key, &g, &data, &size, &jpeg, &r) < 0)
        return NULL;
    npy_intp dims[3];
    image_dims(&self->plan, g.out_w, g.out_h, dims);
    PyObject *arr = PyArray_NewFromDescr(&PyArray_Type, plan_descr(&self->plan), 3, dims, NULL,
                                         NULL, 0, NULL);
    if (!arr)
        return NULL;
    void *dst = PyArray_DATA((PyArrayObject *)arr);
    if (jpeg) {
        Py_BEGIN_ALLOW_THREADS
        r.status = fl_pipeline_jpeg(w, &self->plan, &key, data, size, dst, &g, r.msg, MSG_SIZE);
        Py_END_ALLOW_THREADS
    } else {
        r.status = run_fallback(self, w, path_of(self, r.index), &key, dst, &g, &r);
    }
    if (r.status != FL_OK) {
        Py_DECREF(arr);
        raise_sample_error(self, &r);
        return NULL;
    }
    return arr;
}

PyDoc_STRVAR(geometry_doc,
             "geometry(index, seed, epoch, /)\n--\n\n"
             "The crop decided for a sample: a dict with box (x, y, w, h in source\n"
             "pixels), flip, scale_denom, hard_crop, size (w, h) and out (w, h).");

static PyObject *ImageSource_geometry(ImageSourceObject *self, PyObject *const *args,
                                      Py_ssize_t nargs)
{
    fl_sample_key key;
    if (sample_key(self, args, nargs, "geometry", &key) < 0)
        return NULL;
    fl_image_worker *w = fl_image_worker_get();
    if (!w)
        return PyErr_NoMemory();
    sample_result r = {0};
    fl_sample_geometry g;
    const unsigned char *data;
    size_t size;
    int jpeg;
    if (prepare_sample(self, w, &key, &g, &data, &size, &jpeg, &r) < 0)
        return NULL;
    return Py_BuildValue("{s(dddd)sNsisis(ii)s(ii)}", "box", g.box.x, g.box.y, g.box.w,
                         g.box.h, "flip", PyBool_FromLong(g.flip), "scale_denom", g.scale_denom,
                         "hard_crop", g.hard_crop, "size", g.src_w, g.src_h, "out", g.out_w,
                         g.out_h);
}

/* ------------------------------------------------------------ decode only */

PyDoc_STRVAR(decode_only_doc,
             "decode_only(indices, /)\n--\n\n"
             "Reads and fully decodes the JPEGs `indices` into this thread's reused\n"
             "decoder buffer and nothing else (no crop, resize or copy out), with\n"
             "the GIL released: the decode ceiling the pipeline is measured\n"
             "against.  Returns the number of images decoded; raises for the first\n"
             "that fails.");

static PyObject *ImageSource_decode_only(ImageSourceObject *self, PyObject *indices)
{
    int64_t *idx = NULL;
    Py_ssize_t n;
    if (fl__convert_indices(indices, self->length, &idx, &n) < 0)
        return NULL;
    fl_image_worker *w = fl_image_worker_get();
    if (!w) {
        PyMem_RawFree(idx);
        return PyErr_NoMemory();
    }
    sample_result r = {0};
    Py_ssize_t done = 0;
    Py_BEGIN_ALLOW_THREADS
    for (; done < n; done++) {
        const unsigned char *data, *rgb;
        size_t size, stride;
        int width, height;
        r.index = idx[done];
        r.status = fl_read_file(w, path_of(self, r.index), &data, &size, &r.err, r.msg,
                                MSG_SIZE);
        if (r.status == FL_OK)
            r.status = fl_decode_full(w, data, size, self->plan.max_pixels, &rgb, &width,
                                      &height, &stride, r.msg, MSG_SIZE);
        if (r.status != FL_OK)
            break;
    }
    Py_END_ALLOW_THREADS
    PyMem_RawFree(idx);
    if (r.status != FL_OK) {
        raise_sample_error(self, &r);
        return NULL;
    }
    return PyLong_FromSsize_t(done);
}

/* ------------------------------------------------- transforms on an image */

PyObject *fl__transform_image(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "transform_image(plan, image, seed, max_pixels) "
                                         "takes 4 arguments");
        return NULL;
    }
    fl_image_plan plan = {0};
    if (parse_plan(args[0], &plan) < 0)
        return NULL;
    PyArrayObject *image = (PyArrayObject *)args[1];
    if (!PyArray_Check(args[1]) || PyArray_NDIM(image) != 3 || PyArray_DIM(image, 2) != 3 ||
        PyArray_TYPE(image) != NPY_UINT8 || PyArray_STRIDE(image, 2) != 1 ||
        PyArray_STRIDE(image, 1) != 3 || PyArray_STRIDE(image, 0) < 3 * PyArray_DIM(image, 1)) {
        PyErr_SetString(PyExc_TypeError, "transform_image: image must be an HWC uint8 RGB array "
                                         "with contiguous rows");
        return NULL;
    }
    fl_sample_key key = {PyLong_AsUnsignedLongLongMask(args[2]), 0, 0};
    plan.max_pixels = PyLong_AsUnsignedLongLong(args[3]);
    if (PyErr_Occurred())
        return NULL;
    fl_image_worker *w = fl_image_worker_get();
    if (!w)
        return PyErr_NoMemory();
    const unsigned char *rgb = PyArray_DATA(image);
    int width = (int)PyArray_DIM(image, 1), height = (int)PyArray_DIM(image, 0);
    size_t stride = (size_t)PyArray_STRIDE(image, 0);
    char msg[MSG_SIZE];
    fl_sample_geometry g;
    if (width < 1 || height < 1) {
        PyErr_SetString(PyExc_ValueError, "transform_image: the image is empty");
        return NULL;
    }
    int rc = fl_pipeline_pixels(w, &plan, &key, rgb, width, height, stride, NULL, &g, msg,
                                MSG_SIZE);
    if (rc != FL_OK) {
        PyErr_Format(PyExc_ValueError, "cannot transform the image: %s", msg);
        return NULL;
    }
    npy_intp dims[3];
    image_dims(&plan, g.out_w, g.out_h, dims);
    PyObject *out = PyArray_NewFromDescr(&PyArray_Type, plan_descr(&plan), 3, dims, NULL, NULL, 0,
                                         NULL);
    if (!out)
        return NULL;
    void *dst = PyArray_DATA((PyArrayObject *)out);
    /* `image` is held by the caller for the call. */
    Py_BEGIN_ALLOW_THREADS
    rc = fl_pipeline_pixels(w, &plan, &key, rgb, width, height, stride, dst, &g, msg, MSG_SIZE);
    Py_END_ALLOW_THREADS
    if (rc != FL_OK) {
        Py_DECREF(out);
        PyErr_Format(PyExc_ValueError, "cannot transform the image: %s", msg);
        return NULL;
    }
    return out;
}

static PyMethodDef ImageSource_methods[] = {
    {"batch", (PyCFunction)(void (*)(void))ImageSource_batch, METH_FASTCALL, batch_doc},
    {"sample", (PyCFunction)(void (*)(void))ImageSource_sample, METH_FASTCALL, sample_doc},
    {"geometry", (PyCFunction)(void (*)(void))ImageSource_geometry, METH_FASTCALL,
     geometry_doc},
    {"decode_only", (PyCFunction)ImageSource_decode_only, METH_O, decode_only_doc},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot ImageSource_slots[] = {
    {Py_tp_doc, "ImageSource(paths, offsets, labels, plan, exact, max_pixels, skip, fallback, "
                "error_type)\n--\n\nThe native decode path of fastload's image datasets."},
    {Py_tp_new, ImageSource_new},
    {Py_tp_dealloc, ImageSource_dealloc},
    {Py_tp_traverse, ImageSource_traverse},
    {Py_tp_clear, ImageSource_clear},
    {Py_tp_methods, ImageSource_methods},
    {0, NULL},
};

PyType_Spec fl__ImageSource_spec = {
    .name = "fastload._C.ImageSource",
    .basicsize = sizeof(ImageSourceObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .slots = ImageSource_slots,
};
