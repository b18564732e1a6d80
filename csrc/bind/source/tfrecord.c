/* fastload._C: TFRecord files — TFRecordSource, tfrecord_index() and
 * parse_example() over the core's framing, index and Example parser
 * (csrc/core/source/tfrecord.h, example.h, tfrecord_source.h).
 *
 * A TFRecordSource holds what the core's fl_tfrecord_source points at
 * (the paths blob, the path offsets, each record's range and number, the
 * feature names), all fixed at construction; an ImageSource made with
 * records=<TFRecordSource> reads its samples through it in the worker
 * threads, without the GIL (image_source.h, read_sample).  example(i)
 * gives one record's Example bytes for the per-sample Python path, read
 * and checked with the GIL released.
 *
 * Errors: OSError for a file that cannot be read; fastload.DecodeError for
 * framing, CRC or Example errors, naming the file and the record (and the
 * feature, where one is at fault).
 */
#include "bind/fastload.h"

#include "core/image/pipeline.h"
#include "core/source/example.h"
#include "core/source/tfrecord.h"
#include "core/source/tfrecord_source.h"
#include "core/status.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

typedef struct TFRecordSourceObject {
    PyObject_HEAD
    fl_tfrecord_source core;
    PyObject *paths;   /* bytes, backs core.paths */
    PyObject *offsets; /* int64 ndarray, backs core.offsets */
    PyObject *ranges;  /* int64 (n, 2) ndarray, backs core.ranges */
    PyObject *records; /* int64 ndarray, backs core.records */
    PyObject *image;   /* bytes, backs core.image */
    PyObject *label;   /* bytes or None, backs core.label */
    int64_t length;
} TFRecordSourceObject;

static void TFRecordSource_dealloc(TFRecordSourceObject *self);

const struct fl_tfrecord_source *fl__tfrecord_core(PyObject *obj, int64_t length)
{
    if (Py_TYPE(obj)->tp_dealloc != (destructor)TFRecordSource_dealloc) {
        PyErr_Format(PyExc_TypeError, "records must be a TFRecordSource, not %.100s",
                     Py_TYPE(obj)->tp_name);
        return NULL;
    }
    TFRecordSourceObject *self = (TFRecordSourceObject *)obj;
    if (self->length != length) {
        PyErr_SetString(PyExc_ValueError, "records: the source has another number of samples");
        return NULL;
    }
    return &self->core;
}

static int check_int64(PyObject *obj, int ndim, int64_t rows, const char *what)
{
    PyArrayObject *a = (PyArrayObject *)obj;
    if (PyArray_Check(obj) && PyArray_TYPE(a) == NPY_INT64 && PyArray_NDIM(a) == ndim &&
        PyArray_IS_C_CONTIGUOUS(a) && (rows < 0 || PyArray_DIM(a, 0) == rows) &&
        (ndim == 1 || PyArray_DIM(a, 1) == 2))
        return 0;
    PyErr_Format(PyExc_TypeError, "TFRecordSource: %s must be a contiguous int64 array of %s",
                 what, ndim == 1 ? "one value a record" : "(offset, size) rows, one a record");
    return -1;
}

static PyObject *TFRecordSource_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"paths", "offsets", "ranges", "records", "image", "label",
                             "verify", NULL};
    PyObject *paths, *offsets, *ranges, *records, *image, *label = Py_None;
    int verify = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "SOOOS|O$p:TFRecordSource", kwlist, &paths,
                                     &offsets, &ranges, &records, &image, &label, &verify))
        return NULL;
    if (label != Py_None && !PyBytes_Check(label)) {
        PyErr_SetString(PyExc_TypeError, "TFRecordSource: label must be bytes or None");
        return NULL;
    }
    if (check_int64(offsets, 1, -1, "offsets") < 0)
        return NULL;
    int64_t n = PyArray_DIM((PyArrayObject *)offsets, 0);
    if (check_int64(ranges, 2, n, "ranges") < 0 || check_int64(records, 1, n, "records") < 0)
        return NULL;
    const int64_t *off = PyArray_DATA((PyArrayObject *)offsets);
    const int64_t *rv = PyArray_DATA((PyArrayObject *)ranges);
    Py_ssize_t blob = PyBytes_GET_SIZE(paths);
    if (blob == 0 || PyBytes_AS_STRING(paths)[blob - 1] != '\0') {
        PyErr_SetString(PyExc_ValueError, "TFRecordSource: paths must end with a NUL");
        return NULL;
    }
    for (int64_t i = 0; i < n; i++) {
        if (off[i] < 0 || off[i] >= blob || rv[2 * i] < 0 || rv[2 * i + 1] < 0) {
            PyErr_SetString(PyExc_ValueError,
                            "TFRecordSource: an offset is outside the paths, or a range negative");
            return NULL;
        }
    }
    TFRecordSourceObject *self = (TFRecordSourceObject *)type->tp_alloc(type, 0);
    if (!self)
        return NULL;
    self->paths = Py_NewRef(paths);
    self->offsets = Py_NewRef(offsets);
    self->ranges = Py_NewRef(ranges);
    self->records = Py_NewRef(records);
    self->image = Py_NewRef(image);
    self->label = Py_NewRef(label);
    self->length = n;
    self->core = (fl_tfrecord_source){
        .paths = PyBytes_AS_STRING(paths),
        .offsets = off,
        .ranges = rv,
        .records = PyArray_DATA((PyArrayObject *)records),
        .verify = verify,
        .image = PyBytes_AS_STRING(image),
        .image_size = (size_t)PyBytes_GET_SIZE(image),
        .label = label != Py_None ? PyBytes_AS_STRING(label) : NULL,
        .label_size = label != Py_None ? (size_t)PyBytes_GET_SIZE(label) : 0,
    };
    return (PyObject *)self;
}

static void TFRecordSource_dealloc(TFRecordSourceObject *self)
{
    PyTypeObject *type = Py_TYPE(self);
    Py_CLEAR(self->paths);
    Py_CLEAR(self->offsets);
    Py_CLEAR(self->ranges);
    Py_CLEAR(self->records);
    Py_CLEAR(self->image);
    Py_CLEAR(self->label);
    type->tp_free(self);
    Py_DECREF(type);
}

/* The exception for a failed read of `index`: OSError (the errno's
 * subclass) naming the file, MemoryError, else DecodeError. */
static PyObject *raise_record_error(TFRecordSourceObject *self, int64_t index, int status,
                                    int err, const char *msg)
{
    PyObject *path = PyUnicode_DecodeFSDefault(self->core.paths + self->core.offsets[index]);
    if (!path)
        return NULL;
    if (status == FL_ERR_IO && err != 0) {
        PyObject *args = Py_BuildValue("(isO)", err, msg, path);
        if (args) {
            PyErr_SetObject(PyExc_OSError, args);
            Py_DECREF(args);
        }
    } else if (status == FL_ERR_NOMEM) {
        PyErr_Format(PyExc_MemoryError, "%U: %s", path, msg);
    } else {
        PyErr_Format(fl__state_of_type(Py_TYPE(self))->DecodeError, "%U: %s", path, msg);
    }
    Py_DECREF(path);
    return NULL;
}

PyDoc_STRVAR(example_doc, "example(index, /)\n--\n\n"
                          "The Example bytes of record `index`, read and checked (its CRCs\n"
                          "when the source verifies) with the GIL released.");

static PyObject *TFRecordSource_example(TFRecordSourceObject *self, PyObject *arg)
{
    long long index = PyLong_AsLongLong(arg);
    if (index == -1 && PyErr_Occurred())
        return NULL;
    if (index < 0 || index >= self->length) {
        fl__index_error(index, self->length);
        return NULL;
    }
    struct fl_image_worker *w = fl__image_worker();
    if (!w)
        return NULL;
    const unsigned char *data = NULL;
    size_t size = 0;
    int err = 0, rc;
    char msg[512];
    Py_BEGIN_ALLOW_THREADS
    rc = fl_tfrecord_read_example(&self->core, w, (int64_t)index, &data, &size, &err, msg,
                                  sizeof msg);
    Py_END_ALLOW_THREADS
    if (rc != FL_OK)
        return raise_record_error(self, (int64_t)index, rc, err, msg);
    return PyBytes_FromStringAndSize((const char *)data, (Py_ssize_t)size);
}

static PyMethodDef TFRecordSource_methods[] = {
    {"example", (PyCFunction)TFRecordSource_example, METH_O, example_doc},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot TFRecordSource_slots[] = {
    {Py_tp_doc, "TFRecordSource(paths, offsets, ranges, records, image, label=None, *, "
                "verify=True)\n--\n\n"
                "The records of a TFRecord dataset: record i is bytes ranges[i] (offset,\n"
                "size, framing included) of the file named at offsets[i] in `paths`, number\n"
                "records[i] in it; `image` and `label` name the features an ImageSource made\n"
                "with records= reads (the label an int64_list of one value)."},
    {Py_tp_new, TFRecordSource_new},
    {Py_tp_dealloc, TFRecordSource_dealloc},
    {Py_tp_methods, TFRecordSource_methods},
    {0, NULL},
};

static PyType_Spec TFRecordSource_spec = {
    .name = "fastload._C.TFRecordSource",
    .basicsize = sizeof(TFRecordSourceObject),
    .flags = Py_TPFLAGS_DEFAULT,
    .slots = TFRecordSource_slots,
};

int fl__add_tfrecord_type(PyObject *module)
{
    PyObject *type = PyType_FromModuleAndSpec(module, &TFRecordSource_spec, NULL);
    if (!type)
        return -1;
    int rc = PyModule_AddObjectRef(module, "TFRecordSource", type);
    Py_DECREF(type);
    return rc;
}

/* ------------------------------------------------------------ tfrecord_index */

PyObject *fl__tfrecord_index(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 1 || nargs > 2) {
        PyErr_Format(PyExc_TypeError, "tfrecord_index() takes 1 or 2 arguments (%zd given)",
                     nargs);
        return NULL;
    }
    int verify = 1;
    if (nargs == 2 && (verify = PyObject_IsTrue(args[1])) < 0)
        return NULL;
    PyObject *encoded = NULL, *path = NULL, *result = NULL;
    if (!PyUnicode_FSConverter(args[0], &encoded) || !PyUnicode_FSDecoder(args[0], &path))
        goto done;
    const char *file = PyBytes_AS_STRING(encoded);
    fl_tfrecord_index index;
    fl_tfrecord_index_init(&index);
    int status = FL_OK, err = 0;
    char msg[512] = "";
    Py_BEGIN_ALLOW_THREADS
    int fd = open(file, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        err = errno;
        status = FL_ERR_IO;
        snprintf(msg, sizeof msg, "%s", strerror(err));
    } else {
        status = fl_tfrecord_scan_fd(fd, verify, &index, &err, msg, sizeof msg);
        close(fd);
    }
    Py_END_ALLOW_THREADS
    if (status == FL_ERR_IO && err != 0) {
        PyObject *exc_args = Py_BuildValue("(isO)", err, msg, path);
        if (exc_args) {
            PyErr_SetObject(PyExc_OSError, exc_args);
            Py_DECREF(exc_args);
        }
    } else if (status == FL_ERR_NOMEM) {
        PyErr_Format(PyExc_MemoryError, "%U: %s", path, msg);
    } else if (status != FL_OK) {
        PyErr_Format(fl__state_of_module(module)->DecodeError, "%U: %s", path, msg);
    } else {
        npy_intp dims[2] = {(npy_intp)index.count, 2};
        result = PyArray_SimpleNew(2, dims, NPY_INT64);
        if (result) {
            int64_t *out = PyArray_DATA((PyArrayObject *)result);
            for (size_t i = 0; i < index.count; i++) {
                out[2 * i] = index.offsets[i];
                out[2 * i + 1] = index.sizes[i];
            }
        }
    }
    fl_tfrecord_index_free(&index);
done:
    Py_XDECREF(encoded);
    Py_XDECREF(path);
    return result;
}

/* ------------------------------------------------------------- parse_example */

/* The values of one feature as Python: a list of bytes, or a float32 or
 * int64 array. */
static PyObject *feature_object(const fl_feature *f, char *msg, size_t msg_size)
{
    size_t count;
    if (fl_feature_values(f, NULL, 0, &count, msg, msg_size) != FL_OK)
        return NULL;
    if (f->kind == FL_FEATURE_BYTES) {
        fl_bytes_ref *refs = PyMem_Malloc((count ? count : 1) * sizeof *refs);
        if (!refs)
            return PyErr_NoMemory();
        fl_feature_values(f, refs, count, &count, msg, msg_size); /* checked above */
        PyObject *list = PyList_New((Py_ssize_t)count);
        for (size_t i = 0; list && i < count; i++) {
            PyObject *b = PyBytes_FromStringAndSize((const char *)refs[i].data,
                                                    (Py_ssize_t)refs[i].size);
            if (!b)
                Py_CLEAR(list);
            else
                PyList_SET_ITEM(list, (Py_ssize_t)i, b);
        }
        PyMem_Free(refs);
        return list;
    }
    npy_intp dims[1] = {(npy_intp)count};
    PyObject *arr = PyArray_SimpleNew(1, dims, f->kind == FL_FEATURE_FLOAT ? NPY_FLOAT32
                                                                            : NPY_INT64);
    if (arr)
        fl_feature_values(f, PyArray_DATA((PyArrayObject *)arr), count, &count, msg, msg_size);
    return arr;
}

static int kind_of(PyObject *name)
{
    const char *s = PyUnicode_Check(name) ? PyUnicode_AsUTF8(name) : NULL;
    if (!s)
        return -1;
    return strcmp(s, "bytes") == 0   ? FL_FEATURE_BYTES
           : strcmp(s, "float") == 0 ? FL_FEATURE_FLOAT
           : strcmp(s, "int64") == 0 ? FL_FEATURE_INT64
                                     : -1;
}

PyObject *fl__parse_example(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "parse_example() takes 2 arguments (%zd given)", nargs);
        return NULL;
    }
    PyObject *features = args[1];
    if (!PyTuple_Check(features)) {
        PyErr_SetString(PyExc_TypeError, "parse_example(): features must be a tuple of "
                                         "(name, kind) pairs");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    PyObject *decode_error = fl__state_of_module(module)->DecodeError;
    PyObject *result = PyDict_New();
    char msg[512];
    for (Py_ssize_t i = 0; result && i < PyTuple_GET_SIZE(features); i++) {
        PyObject *name, *kind_name;
        Py_ssize_t name_size;
        const char *utf8;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(features, i), "UU", &name, &kind_name) ||
            !(utf8 = PyUnicode_AsUTF8AndSize(name, &name_size))) {
            Py_CLEAR(result);
            break;
        }
        int kind = kind_of(kind_name);
        if (kind < 0) {
            PyErr_Format(PyExc_ValueError, "feature '%U': kind must be 'bytes', 'float' or "
                                           "'int64', not %R", name, kind_name);
            Py_CLEAR(result);
            break;
        }
        int found;
        fl_feature f;
        PyObject *value = NULL;
        if (fl_example_find(view.buf, (size_t)view.len, utf8, (size_t)name_size, &found, &f, msg,
                            sizeof msg) != FL_OK) {
            PyErr_SetString(decode_error, msg);
        } else if (!found) {
            PyErr_Format(decode_error, "feature '%U' is missing", name);
        } else if (f.kind != kind) {
            PyErr_Format(decode_error, "feature '%U' is a %s, expected %s", name,
                         fl_feature_kind_name(f.kind), fl_feature_kind_name(kind));
        } else if (!(value = feature_object(&f, msg, sizeof msg)) && !PyErr_Occurred()) {
            PyErr_Format(decode_error, "feature '%U': %s", name, msg);
        }
        if (!value || PyDict_SetItem(result, name, value) < 0)
            Py_CLEAR(result);
        Py_XDECREF(value);
    }
    PyBuffer_Release(&view);
    return result;
}
