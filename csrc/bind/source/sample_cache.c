/* fastload._C: SampleCache — a shared, size-bounded cache of samples' bytes
 * (csrc/core/source/sample_cache.h), given to an ImageSource; and
 * sample_cache_key(), the key naming a dataset's files.
 *
 * The object owns the core cache (mapped and open until dealloc); the
 * sources given it hold a reference, so it outlives their batches.
 */
#include "bind/fastload.h"

#include "core/source/sample_cache.h"
#include "core/status.h"

typedef struct SampleCacheObject {
    PyObject_HEAD
    fl_sample_cache *cache;
} SampleCacheObject;

fl_sample_cache *fl__sample_cache_of(PyObject *obj)
{
    fastload_state *state = fl__state_of_type(Py_TYPE(obj));
    if (!state || !PyObject_TypeCheck(obj, state->SampleCache_type)) {
        PyErr_Format(PyExc_TypeError, "cache must be a SampleCache, not %s",
                     Py_TYPE(obj)->tp_name);
        return NULL;
    }
    return ((SampleCacheObject *)obj)->cache;
}

static PyObject *SampleCache_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"path", "key", "samples", "capacity", NULL};
    PyObject *path = Py_None, *encoded = NULL;
    unsigned long long key, capacity;
    long long samples;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OKLK:SampleCache", kwlist, &path, &key,
                                     &samples, &capacity))
        return NULL;
    if (path != Py_None && !PyUnicode_FSConverter(path, &encoded))
        return NULL;
    const char *c_path = encoded ? PyBytes_AS_STRING(encoded) : NULL;
    fl_sample_cache *cache = NULL;
    char msg[256];
    int err = 0, rc;
    Py_BEGIN_ALLOW_THREADS
    rc = fl_sample_cache_open(c_path, key, samples, capacity, &cache, &err, msg, sizeof msg);
    Py_END_ALLOW_THREADS
    if (rc != FL_OK) {
        if (rc == FL_ERR_IO) {
            /* OSError(errno, message, path): the errno's subclass
             * (PermissionError, ...), naming the file. */
            PyObject *exc = PyObject_CallFunction(PyExc_OSError, "isO", err ? err : EIO, msg,
                                                  path);
            if (exc) {
                PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
                Py_DECREF(exc);
            }
        } else if (rc == FL_ERR_NOMEM) {
            PyErr_NoMemory();
        } else {
            PyErr_Format(PyExc_ValueError, "cache: %s", msg);
        }
        Py_XDECREF(encoded);
        return NULL;
    }
    Py_XDECREF(encoded);
    SampleCacheObject *self = (SampleCacheObject *)type->tp_alloc(type, 0);
    if (!self) {
        fl_sample_cache_close(cache);
        return NULL;
    }
    self->cache = cache;
    return (PyObject *)self;
}

static void SampleCache_dealloc(SampleCacheObject *self)
{
    PyTypeObject *type = Py_TYPE(self);
    fl_sample_cache_close(self->cache);
    type->tp_free(self);
    Py_DECREF(type);
}

PyDoc_STRVAR(stats_doc, "stats()\n--\n\n"
                        "The cache's shared counters: a dict of capacity, data_bytes, used,\n"
                        "stored, hits, rejected (no room) and corrupt (entries dropped); and\n"
                        "broken: the file was cut short under this process, which reads\n"
                        "every sample from its source since (the counters are then 0).");

static PyObject *SampleCache_stats(SampleCacheObject *self, PyObject *unused)
{
    (void)unused;
    fl_cache_stats s;
    fl_sample_cache_stats(self->cache, &s);
    return Py_BuildValue("{sKsKsKsKsKsKsKsN}", "capacity", (unsigned long long)s.capacity,
                         "data_bytes", (unsigned long long)s.data_bytes, "used",
                         (unsigned long long)s.used, "stored", (unsigned long long)s.stored,
                         "hits", (unsigned long long)s.hits, "rejected",
                         (unsigned long long)s.rejected, "corrupt",
                         (unsigned long long)s.corrupt, "broken", PyBool_FromLong((long)s.broken));
}

PyDoc_STRVAR(file_offset_doc, "file_offset(index, /)\n--\n\n"
                              "Where sample `index`'s bytes lie in the cache file, or None when\n"
                              "it is not stored.");

static PyObject *SampleCache_file_offset(SampleCacheObject *self, PyObject *arg)
{
    long long index = PyLong_AsLongLong(arg);
    if (index == -1 && PyErr_Occurred())
        return NULL;
    int64_t offset = fl_sample_cache_file_offset(self->cache, index);
    if (offset < 0)
        Py_RETURN_NONE;
    return PyLong_FromLongLong(offset);
}

static PyObject *SampleCache_fd(SampleCacheObject *self, void *closure)
{
    (void)closure;
    return PyLong_FromLong(fl_sample_cache_fd(self->cache));
}

PyDoc_STRVAR(overhead_doc, "overhead(samples, /)\n--\n\n"
                           "Bytes the header and index of a cache of `samples` samples take.");

static PyObject *SampleCache_overhead(PyObject *unused, PyObject *arg)
{
    (void)unused;
    long long samples = PyLong_AsLongLong(arg);
    if (samples == -1 && PyErr_Occurred())
        return NULL;
    if (samples < 0) {
        PyErr_SetString(PyExc_ValueError, "overhead(): samples must not be negative");
        return NULL;
    }
    return PyLong_FromUnsignedLongLong(fl_sample_cache_overhead(samples));
}

/* Parses (first, indices, rows) of read_rows() and write_rows(): entries
 * first + indices[k] hold rows[k], all rows `*row_bytes` bytes.  Returns 0,
 * or -1 with an exception set (*idx is then NULL). */
static int parse_rows(SampleCacheObject *self, PyObject *const *args, Py_ssize_t nargs,
                      const char *name, int writable, int64_t *first, int64_t **idx,
                      Py_ssize_t *n, unsigned char **rows, size_t *row_bytes)
{
    *idx = NULL;
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "%s() takes 3 arguments", name);
        return -1;
    }
    long long start = PyLong_AsLongLong(args[0]);
    if (start == -1 && PyErr_Occurred())
        return -1;
    int64_t samples = fl_sample_cache_samples(self->cache);
    if (start < 0 || start > samples) {
        PyErr_Format(PyExc_ValueError, "%s(): first entry %lld is outside the cache's %lld", name,
                     start, (long long)samples);
        return -1;
    }
    PyArrayObject *a = (PyArrayObject *)args[2];
    if (!PyArray_Check(args[2]) || !PyArray_IS_C_CONTIGUOUS(a) || PyArray_NDIM(a) < 1 ||
        (writable && !PyArray_ISWRITEABLE(a))) {
        PyErr_Format(PyExc_TypeError, "%s(): rows must be a C-contiguous%s array", name,
                     writable ? ", writable" : "");
        return -1;
    }
    if (fl__convert_indices(args[1], samples - start, idx, n) < 0)
        return -1;
    if (PyArray_DIM(a, 0) != *n) {
        PyErr_Format(PyExc_ValueError, "%s(): %zd indices but %zd rows", name, *n,
                     (Py_ssize_t)PyArray_DIM(a, 0));
        PyMem_RawFree(*idx);
        *idx = NULL;
        return -1;
    }
    *first = start;
    *rows = PyArray_DATA(a);
    *row_bytes = *n ? (size_t)PyArray_NBYTES(a) / (size_t)*n : 0;
    return 0;
}

PyDoc_STRVAR(read_rows_doc,
             "read_rows(first, indices, rows, /)\n--\n\n"
             "Copies the stored entries first + indices[k] into rows[k] (a C-contiguous\n"
             "array, each row as many bytes as an entry), checked as every read is.\n"
             "Returns a bool array: which rows were found (the others are untouched).");

static PyObject *SampleCache_read_rows(SampleCacheObject *self, PyObject *const *args,
                                       Py_ssize_t nargs)
{
    int64_t first, *idx;
    Py_ssize_t n;
    unsigned char *rows;
    size_t row_bytes;
    if (parse_rows(self, args, nargs, "read_rows", 1, &first, &idx, &n, &rows, &row_bytes) < 0)
        return NULL;
    npy_intp dims[1] = {n};
    PyObject *found = PyArray_ZEROS(1, dims, NPY_BOOL, 0);
    if (!found) {
        PyMem_RawFree(idx);
        return NULL;
    }
    npy_bool *hit = PyArray_DATA((PyArrayObject *)found);
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t k = 0; k < n; k++) {
        fl_cache_ref ref;
        int64_t entry = first + idx[k];
        hit[k] = fl_sample_cache_find(self->cache, entry, &ref) && ref.size == row_bytes &&
                 fl_sample_cache_copy(self->cache, entry, &ref, rows + k * row_bytes) == FL_OK;
    }
    Py_END_ALLOW_THREADS
    PyMem_RawFree(idx);
    return found;
}

PyDoc_STRVAR(write_rows_doc, "write_rows(first, indices, rows, /)\n--\n\n"
                             "Stores rows[k] as entry first + indices[k] (unless stored, or no\n"
                             "room is left).  Returns how many were stored.");

static PyObject *SampleCache_write_rows(SampleCacheObject *self, PyObject *const *args,
                                        Py_ssize_t nargs)
{
    int64_t first, *idx;
    Py_ssize_t n, stored = 0;
    unsigned char *rows;
    size_t row_bytes;
    if (parse_rows(self, args, nargs, "write_rows", 0, &first, &idx, &n, &rows, &row_bytes) < 0)
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t k = 0; k < n; k++)
        stored += fl_sample_cache_put(self->cache, first + idx[k], rows + k * row_bytes,
                                      row_bytes);
    Py_END_ALLOW_THREADS
    PyMem_RawFree(idx);
    return PyLong_FromSsize_t(stored);
}

static PyMethodDef SampleCache_methods[] = {
    {"overhead", (PyCFunction)SampleCache_overhead, METH_O | METH_STATIC, overhead_doc},
    {"read_rows", (PyCFunction)(void (*)(void))SampleCache_read_rows, METH_FASTCALL,
     read_rows_doc},
    {"write_rows", (PyCFunction)(void (*)(void))SampleCache_write_rows, METH_FASTCALL,
     write_rows_doc},
    {"stats", (PyCFunction)SampleCache_stats, METH_NOARGS, stats_doc},
    {"file_offset", (PyCFunction)SampleCache_file_offset, METH_O, file_offset_doc},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef SampleCache_getset[] = {
    {"fd", (getter)SampleCache_fd, NULL, "The cache file's descriptor.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot SampleCache_slots[] = {
    {Py_tp_doc, "SampleCache(path, key, samples, capacity)\n--\n\n"
                "A shared, size-bounded cache of `samples` samples' bytes, `capacity`\n"
                "bytes in all, for the dataset `key` (sample_cache_key()): the file at\n"
                "`path` (opened, created, or replaced when made for other data), or an\n"
                "anonymous one in memory when `path` is None."},
    {Py_tp_new, SampleCache_new},
    {Py_tp_dealloc, SampleCache_dealloc},
    {Py_tp_methods, SampleCache_methods},
    {Py_tp_getset, SampleCache_getset},
    {0, NULL},
};

PyType_Spec fl__SampleCache_spec = {
    .name = "fastload._C.SampleCache",
    .basicsize = sizeof(SampleCacheObject),
    .flags = Py_TPFLAGS_DEFAULT,
    .slots = SampleCache_slots,
};

PyObject *fl__sample_cache_key(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "sample_cache_key() takes 3 arguments");
        return NULL;
    }
    PyObject *paths = args[0];
    PyArrayObject *offsets = (PyArrayObject *)args[1], *ranges = (PyArrayObject *)args[2];
    if (!PyBytes_Check(paths) || !PyArray_Check(args[1]) || PyArray_TYPE(offsets) != NPY_INT64 ||
        PyArray_NDIM(offsets) != 1 || !PyArray_IS_C_CONTIGUOUS(offsets)) {
        PyErr_SetString(PyExc_TypeError,
                        "sample_cache_key(): paths must be bytes and offsets a contiguous int64 "
                        "vector");
        return NULL;
    }
    int64_t n = PyArray_DIM(offsets, 0);
    if (args[2] != Py_None &&
        (!PyArray_Check(args[2]) || PyArray_TYPE(ranges) != NPY_INT64 ||
         PyArray_NDIM(ranges) != 2 || PyArray_DIM(ranges, 0) != n ||
         PyArray_DIM(ranges, 1) != 2 || !PyArray_IS_C_CONTIGUOUS(ranges))) {
        PyErr_SetString(PyExc_TypeError,
                        "sample_cache_key(): ranges must be None or a contiguous int64 array "
                        "(samples, 2)");
        return NULL;
    }
    /* Every offset must name a NUL-terminated path inside the blob. */
    Py_ssize_t blob = PyBytes_GET_SIZE(paths);
    const int64_t *off = PyArray_DATA(offsets);
    if (n > 0 && (blob == 0 || PyBytes_AS_STRING(paths)[blob - 1] != '\0')) {
        PyErr_SetString(PyExc_ValueError, "sample_cache_key(): paths must end with a NUL");
        return NULL;
    }
    for (int64_t i = 0; i < n; i++)
        if (off[i] < 0 || off[i] >= blob) {
            PyErr_SetString(PyExc_ValueError, "sample_cache_key(): an offset is outside the paths");
            return NULL;
        }
    const char *blob_data = PyBytes_AS_STRING(paths);
    const int64_t *range_data = args[2] != Py_None ? PyArray_DATA(ranges) : NULL;
    uint64_t key, total;
    Py_BEGIN_ALLOW_THREADS
    fl_sample_cache_key(blob_data, off, range_data, n, &key, &total);
    Py_END_ALLOW_THREADS
    return Py_BuildValue("(KK)", (unsigned long long)key, (unsigned long long)total);
}
