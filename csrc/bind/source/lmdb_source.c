/* fastload._C: LMDBSource — an LMDB database opened read-only with liblmdb
 * (csrc/core/source/lmdb_source.h), read without the GIL — and LMDBRows, the
 * native source of an LMDBDataset of raw records.
 *
 * gather() copies fixed-size records straight into a batch; get() returns
 * one value as bytes (the Python-callable decode path); an ImageSource made
 * with lmdb=<LMDBSource> decodes its samples straight from the map; an
 * LMDBRows gives (records, labels) batches on the native batch path (see
 * native_batch.c), no Python per batch.  The environment is not pickled: a
 * worker process makes its own source.
 */
#include "bind/fastload.h"

#include "core/image/pipeline.h"
#include "core/observe/stats.h"
#include "core/source/lmdb_source.h"
#include "core/status.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

typedef struct LMDBSourceObject {
    PyObject_HEAD
    fl_lmdb_source core;
    PyObject *path;        /* bytes, backs core.path */
    PyObject *keys;        /* bytes or None, backs core.keys */
    PyObject *key_offsets; /* int64 ndarray or None */
} LMDBSourceObject;

static void LMDBSource_dealloc(LMDBSourceObject *self);

const struct fl_lmdb_source *fl__lmdb_core(PyObject *obj)
{
    if (Py_TYPE(obj)->tp_dealloc != (destructor)LMDBSource_dealloc) {
        PyErr_Format(PyExc_TypeError, "lmdb must be an LMDBSource, not %.100s",
                     Py_TYPE(obj)->tp_name);
        return NULL;
    }
    return &((LMDBSourceObject *)obj)->core;
}

static unsigned char *worker_room(void *w, size_t size)
{
    return fl_image_worker_file_buffer(w, size);
}

int fl__lmdb_read_bytes(const void *ctx, struct fl_image_worker *w, int64_t index,
                        const unsigned char **data, size_t *size, char *msg, size_t msg_size)
{
    return fl_lmdb_read(ctx, index, worker_room, w, data, size, msg, msg_size);
}

/* The exception type of a failed read: OSError for a missing store or key,
 * DecodeError (an OSError) for corrupt data or a value of the wrong size,
 * MemoryError when out of memory. */
static PyObject *status_type(PyTypeObject *type, int status)
{
    return status == FL_ERR_DECODE  ? fl__state_of_type(type)->DecodeError
           : status == FL_ERR_NOMEM ? PyExc_MemoryError
                                    : PyExc_OSError;
}

/* The exception of a failed read; a data file that shrank under the read
 * is OSError(EIO, message naming it), as the array datasets raise. */
static PyObject *status_error(PyTypeObject *type, int status, const char *msg)
{
    if (status == FL_ERR_CHANGED)
        return PyObject_CallFunction(PyExc_OSError, "is", EIO, msg);
    return PyObject_CallFunction(status_type(type, status), "s", msg);
}

static void raise_status(PyTypeObject *type, int status, const char *msg)
{
    PyObject *exc = status_error(type, status, msg);
    if (exc) {
        PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
        Py_DECREF(exc);
    }
}

static PyObject *LMDBSource_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"path", "db", "keys", "key_offsets", "value_size", NULL};
    PyObject *path, *keys = Py_None, *key_offsets = Py_None;
    const char *db = NULL;
    Py_ssize_t value_size = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O&|z$OOn:LMDBSource", kwlist,
                                     PyUnicode_FSConverter, &path, &db, &keys, &key_offsets,
                                     &value_size))
        return NULL;
    int64_t n_keys = -1;
    if (keys != Py_None) {
        PyArrayObject *o = (PyArrayObject *)key_offsets;
        if (!PyBytes_Check(keys) || !PyArray_Check(key_offsets) ||
            PyArray_TYPE(o) != NPY_INT64 || PyArray_NDIM(o) != 1 || PyArray_DIM(o, 0) < 1 ||
            !PyArray_IS_C_CONTIGUOUS(o)) {
            PyErr_SetString(PyExc_TypeError, "LMDBSource: keys must be bytes and key_offsets "
                                             "a contiguous int64 vector of len(keys) + 1");
            Py_DECREF(path);
            return NULL;
        }
        const int64_t *off = PyArray_DATA(o);
        n_keys = PyArray_DIM(o, 0) - 1;
        for (int64_t i = 0; i < n_keys; i++)
            if (off[i] < 0 || off[i] > off[i + 1] || off[i + 1] > PyBytes_GET_SIZE(keys) ||
                off[i + 1] - off[i] > 511) {
                PyErr_SetString(PyExc_ValueError, "LMDBSource: a key offset is out of order "
                                                  "or a key is longer than 511 bytes");
                Py_DECREF(path);
                return NULL;
            }
    }
    if (value_size < 0) {
        PyErr_SetString(PyExc_ValueError, "LMDBSource: value_size is negative");
        Py_DECREF(path);
        return NULL;
    }
    LMDBSourceObject *self = (LMDBSourceObject *)type->tp_alloc(type, 0);
    if (!self) {
        Py_DECREF(path);
        return NULL;
    }
    self->path = path;
    self->keys = Py_NewRef(keys);
    self->key_offsets = Py_NewRef(key_offsets);
    char msg[512];
    const char *path_text = PyBytes_AS_STRING(path);
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = fl_lmdb_open(&self->core, path_text, db, msg, sizeof msg);
    Py_END_ALLOW_THREADS
    if (rc != FL_OK) {
        raise_status(type, rc, msg);
        Py_DECREF(self);
        return NULL;
    }
    if (keys != Py_None) {
        self->core.keys = PyBytes_AS_STRING(keys);
        self->core.key_offsets = PyArray_DATA((PyArrayObject *)key_offsets);
    }
    self->core.length = n_keys;
    self->core.value_size = (size_t)value_size;
    return (PyObject *)self;
}

static void LMDBSource_dealloc(LMDBSourceObject *self)
{
    PyTypeObject *type = Py_TYPE(self);
    fl_lmdb_close(&self->core);
    Py_CLEAR(self->path);
    Py_CLEAR(self->keys);
    Py_CLEAR(self->key_offsets);
    type->tp_free(self);
    Py_DECREF(type);
}

PyDoc_STRVAR(entries_doc, "entries()\n--\n\nThe number of entries of the database.");

static PyObject *LMDBSource_entries(LMDBSourceObject *self, PyObject *Py_UNUSED(arg))
{
    char msg[512];
    int64_t n;
    int status = FL_OK;
    Py_BEGIN_ALLOW_THREADS
    n = fl_lmdb_entries(&self->core, &status, msg, sizeof msg);
    Py_END_ALLOW_THREADS
    if (n < 0) {
        raise_status(Py_TYPE(self), status, msg);
        return NULL;
    }
    return PyLong_FromLongLong(n);
}

PyDoc_STRVAR(gather_doc,
             "gather(indices, out, /)\n--\n\n"
             "Copies the values of samples `indices` (int64, each in range) into\n"
             "consecutive value_size-byte rows of the writable contiguous array `out`,\n"
             "one read transaction, GIL released.");

static PyObject *LMDBSource_gather(LMDBSourceObject *self, PyObject *const *args,
                                   Py_ssize_t nargs)
{
    if (nargs != 2 || !PyArray_Check(args[0]) || !PyArray_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "gather(indices, out): two arrays");
        return NULL;
    }
    PyArrayObject *idx = (PyArrayObject *)args[0], *out = (PyArrayObject *)args[1];
    if (PyArray_TYPE(idx) != NPY_INT64 || PyArray_NDIM(idx) != 1 ||
        !PyArray_IS_C_CONTIGUOUS(idx) || !PyArray_IS_C_CONTIGUOUS(out) ||
        !PyArray_ISWRITEABLE(out) || self->core.value_size == 0 ||
        (size_t)PyArray_NBYTES(out) != (size_t)PyArray_DIM(idx, 0) * self->core.value_size) {
        PyErr_SetString(PyExc_ValueError, "gather(): indices must be a contiguous int64 vector "
                                          "and out a writable array of one record per index");
        return NULL;
    }
    const int64_t *iv = PyArray_DATA(idx);
    size_t n = (size_t)PyArray_DIM(idx, 0);
    for (size_t i = 0; i < n; i++)
        if (iv[i] < 0 || (self->core.length >= 0 && iv[i] >= self->core.length)) {
            PyErr_Format(PyExc_IndexError, "index %lld is out of range", (long long)iv[i]);
            return NULL;
        }
    char msg[512];
    int64_t failed = -1;
    void *rows = PyArray_DATA(out);
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = fl_lmdb_gather(&self->core, iv, n, rows, &failed, msg, sizeof msg);
    Py_END_ALLOW_THREADS
    if (rc != FL_OK) {
        raise_status(Py_TYPE(self), rc, msg);
        return NULL;
    }
    Py_RETURN_NONE;
}

/* Room for LMDBSource.get's copy: malloc'ed into *(unsigned char **)slot,
 * which the caller frees. */
static unsigned char *malloc_room(void *slot, size_t size)
{
    unsigned char **out = slot;
    *out = malloc(size ? size : 1);
    return *out;
}

PyDoc_STRVAR(get_doc, "get(index, /)\n--\n\nSample `index`'s value as bytes.");

static PyObject *LMDBSource_get(LMDBSourceObject *self, PyObject *arg)
{
    long long index = PyLong_AsLongLong(arg);
    if (index == -1 && PyErr_Occurred())
        return NULL;
    if (index < 0 || (self->core.length >= 0 && index >= self->core.length)) {
        PyErr_Format(PyExc_IndexError, "index %lld is out of range", index);
        return NULL;
    }
    char msg[512];
    const unsigned char *data = NULL;
    size_t size = 0;
    unsigned char *copy = NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = fl_lmdb_read(&self->core, index, malloc_room, &copy, &data, &size, msg, sizeof msg);
    Py_END_ALLOW_THREADS
    if (rc != FL_OK) {
        free(copy);
        if (rc == FL_ERR_NOMEM)
            return PyErr_NoMemory();
        raise_status(Py_TYPE(self), rc, msg);
        return NULL;
    }
    PyObject *value = PyBytes_FromStringAndSize((const char *)data, (Py_ssize_t)size);
    free(copy);
    return value;
}

static PyObject *LMDBSource_no_lock(LMDBSourceObject *self, void *Py_UNUSED(closure))
{
    return PyBool_FromLong(self->core.no_lock);
}

static PyMethodDef LMDBSource_methods[] = {
    {"entries", (PyCFunction)LMDBSource_entries, METH_NOARGS, entries_doc},
    {"gather", (PyCFunction)(void (*)(void))LMDBSource_gather, METH_FASTCALL, gather_doc},
    {"get", (PyCFunction)LMDBSource_get, METH_O, get_doc},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef LMDBSource_getset[] = {
    {"no_lock", (getter)LMDBSource_no_lock, NULL,
     "True when opened without the lock file (it could not be created).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot LMDBSource_slots[] = {
    {Py_tp_doc, "LMDBSource(path, db=None, *, keys=None, key_offsets=None, value_size=0)\n"
                "--\n\nAn LMDB database opened read-only (see fastload.LMDBDataset)."},
    {Py_tp_new, LMDBSource_new},
    {Py_tp_dealloc, LMDBSource_dealloc},
    {Py_tp_methods, LMDBSource_methods},
    {Py_tp_getset, LMDBSource_getset},
    {0, NULL},
};

static PyType_Spec LMDBSource_spec = {
    .name = "fastload._C.LMDBSource",
    .basicsize = sizeof(LMDBSourceObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = LMDBSource_slots,
};

/* --------------------------------------------------------------- LMDBRows */

typedef struct lmdb_rows {
    const fl_lmdb_source *src;
    const int64_t *labels;
} lmdb_rows;

typedef struct LMDBRowsObject {
    fl__native_source head;
    lmdb_rows core;
    PyObject *source;      /* the LMDBSource read */
    PyObject *labels;      /* int64 ndarray, one label a sample */
    PyArray_Descr *descr;  /* the records' dtype */
    int ndim;              /* of a record */
    npy_intp shape[NPY_MAXDIMS - 1];
} LMDBRowsObject;

static int lmdb_rows_plan(PyObject *source, fl__native_job *job)
{
    LMDBRowsObject *self = (LMDBRowsObject *)source;
    job->n_out = 2;
    job->descrs[0] = (PyArray_Descr *)Py_NewRef(self->descr);
    job->ndims[0] = 1 + self->ndim;
    job->dims[0][0] = (npy_intp)job->n;
    memcpy(job->dims[0] + 1, self->shape, sizeof(npy_intp) * (size_t)self->ndim);
    job->descrs[1] = PyArray_DescrFromType(NPY_INT64);
    job->ndims[1] = 1;
    job->dims[1][0] = (npy_intp)job->n;
    return 0;
}

static void lmdb_rows_run(const void *core, fl__native_job *job)
{
    const lmdb_rows *rows = core;
    fl_stage_clock clock;
    fl_stage_begin(&clock, FL_STAGE_READ);
    int64_t failed = -1;
    int rc = fl_lmdb_gather(rows->src, job->indices, job->n, job->data[0], &failed, job->msg,
                            sizeof job->msg);
    if (rc != FL_OK) {
        job->status = rc;
        job->sample = failed;
    } else {
        int64_t *labels = (int64_t *)job->data[1];
        for (size_t i = 0; i < job->n; i++)
            labels[i] = rows->labels[job->indices[i]];
    }
    fl_stage_end(&clock);
}

static PyObject *lmdb_rows_failure(PyObject *source, const fl__native_job *job)
{
    return status_error(Py_TYPE(source), job->status, job->msg);
}

static const fl__native_ops lmdb_rows_ops = {
    .plan = lmdb_rows_plan,
    .run = lmdb_rows_run,
    .failure = lmdb_rows_failure,
};

static PyObject *LMDBRows_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"source", "labels", "dtype", "shape", NULL};
    PyObject *source, *labels, *shape;
    PyArray_Descr *descr;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOO&O!:LMDBRows", kwlist, &source, &labels,
                                     PyArray_DescrConverter, &descr, &PyTuple_Type, &shape))
        return NULL;
    const fl_lmdb_source *src = fl__lmdb_core(source);
    PyArrayObject *l = (PyArrayObject *)labels;
    Py_ssize_t ndim = PyTuple_GET_SIZE(shape);
    if (!src || !PyArray_Check(labels) || PyArray_TYPE(l) != NPY_INT64 ||
        PyArray_NDIM(l) != 1 || !PyArray_IS_C_CONTIGUOUS(l) || ndim >= NPY_MAXDIMS) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "LMDBRows(source, labels, dtype, shape): labels "
                                             "must be a contiguous int64 vector and shape a "
                                             "short tuple");
        Py_DECREF(descr);
        return NULL;
    }
    npy_intp dims[NPY_MAXDIMS];
    size_t bytes = (size_t)PyDataType_ELSIZE(descr);
    for (Py_ssize_t d = 0; d < ndim; d++) {
        dims[d] = PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, d));
        if (dims[d] < 0) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "LMDBRows: a dimension is negative");
            Py_DECREF(descr);
            return NULL;
        }
        bytes *= (size_t)dims[d];
    }
    int64_t n = PyArray_DIM(l, 0);
    if (bytes == 0 || bytes != src->value_size || (src->length >= 0 && n > src->length)) {
        PyErr_SetString(PyExc_ValueError, "LMDBRows: a record's dtype and shape must make the "
                                          "source's value_size, and labels not outnumber its "
                                          "keys");
        Py_DECREF(descr);
        return NULL;
    }
    LMDBRowsObject *self = (LMDBRowsObject *)type->tp_alloc(type, 0);
    if (!self) {
        Py_DECREF(descr);
        return NULL;
    }
    self->source = Py_NewRef(source);
    self->labels = Py_NewRef(labels);
    self->descr = descr;
    self->ndim = (int)ndim;
    memcpy(self->shape, dims, sizeof(npy_intp) * (size_t)ndim);
    self->core = (lmdb_rows){src, PyArray_DATA(l)};
    self->head.ops = &lmdb_rows_ops;
    self->head.core = &self->core;
    self->head.length = n;
    return (PyObject *)self;
}

static void LMDBRows_dealloc(LMDBRowsObject *self)
{
    PyTypeObject *type = Py_TYPE(self);
    Py_XDECREF(self->source);
    Py_XDECREF(self->labels);
    Py_XDECREF(self->descr);
    type->tp_free(self);
    Py_DECREF(type);
}

PyDoc_STRVAR(rows_batch_doc,
             "batch(indices, pool, convert, seed, epoch, /)\n--\n\n"
             "The records of samples `indices` and their labels, copied with the GIL\n"
             "released into one batch (a slot of `pool`, or fresh arrays when it is\n"
             "None): returns ([records, labels] passed through `convert`, []).  A\n"
             "missing key raises OSError, a value of the wrong size DecodeError, each\n"
             "naming the key; seed and epoch are unused.");

static PyMethodDef LMDBRows_methods[] = {
    {"batch", (PyCFunction)(void (*)(void))fl__native_batch_method, METH_FASTCALL,
     rows_batch_doc},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot LMDBRows_slots[] = {
    {Py_tp_doc, "LMDBRows(source, labels, dtype, shape)\n--\n\n"
                "The raw records of an LMDBSource (value_size bytes each, read as `dtype`\n"
                "of `shape`) with their labels: LMDBDataset(decode='raw')'s native source."},
    {Py_tp_new, LMDBRows_new},
    {Py_tp_dealloc, LMDBRows_dealloc},
    {Py_tp_methods, LMDBRows_methods},
    {0, NULL},
};

PyType_Spec fl__LMDBRows_spec = {
    .name = "fastload._C.LMDBRows",
    .basicsize = sizeof(LMDBRowsObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = LMDBRows_slots,
};

int fl__add_lmdb_type(PyObject *module)
{
    PyObject *type = PyType_FromModuleAndSpec(module, &LMDBSource_spec, NULL);
    if (!type)
        return -1;
    int rc = PyModule_AddObjectRef(module, "LMDBSource", type);
    Py_DECREF(type);
    return rc;
}
