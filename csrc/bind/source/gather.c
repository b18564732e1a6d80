/* fastload._C: RowSource and WindowSource — the native sources of
 * ArrayDataset and TokenDataset (see native_batch.c for how a batch runs).
 *
 * A RowSource serves rows of a tuple of arrays, a WindowSource windows of a
 * token array.  Each reads its arrays once, at creation, into the core's
 * plain-C descriptions (csrc/core/source/gather.h) and holds them, so the memory
 * stays valid for every batch.  The arrays are validated by the Python
 * classes (fastload/datasets/arrays.py): C-contiguous rows of a native-order plain
 * dtype.  A source's `file` is None for memory that is no file mapping, else
 * (path, the file's size in bytes when it was opened[, a descriptor of
 * it]): the path names it in errors, and the size tells a truncated file
 * from a failing one, against its size now, read from the descriptor where
 * one is given (the caller keeps it open while the source lives: the file
 * mapped, whatever lies at the path now), else from the path.
 */
#include "bind/fastload.h"

#include "core/memory/bus_guard.h"
#include "core/observe/stats.h"
#include "core/source/gather.h"
#include "core/status.h"

#include <errno.h>
#include <string.h>
#include <limits.h>
#include <stdio.h>

#define MAX_ARRAYS FL__MAX_BATCH_ARRAYS

/* ------------------------------------------------------------- bad files */

static int check_file(PyObject *file)
{
    Py_ssize_t n = PyTuple_Check(file) ? PyTuple_GET_SIZE(file) : 0;
    if (file == Py_None ||
        ((n == 2 || n == 3) && PyUnicode_Check(PyTuple_GET_ITEM(file, 0)) &&
         PyLong_Check(PyTuple_GET_ITEM(file, 1)) &&
         (n == 2 || PyLong_Check(PyTuple_GET_ITEM(file, 2)))))
        return 0;
    PyErr_SetString(PyExc_TypeError, "a file must be None, (path, size) or (path, size, fd)");
    return -1;
}

/* An int of a file tuple, -1 when it does not fit. */
static long long file_number(PyObject *file, Py_ssize_t i)
{
    if (PyTuple_GET_SIZE(file) <= i)
        return -1;
    long long v = PyLong_AsLongLong(PyTuple_GET_ITEM(file, i));
    if (v == -1 && PyErr_Occurred())
        PyErr_Clear();
    return v;
}

/* The OSError (EIO) for a bus error while reading `what` of `file` (as
 * check_file() takes it), with fl_bus_fault_msg's message: the size now is
 * the fstat of the file's descriptor where the tuple gives one (the very
 * file mapped), else the stat of its path.  NULL with an exception set when
 * it cannot be built. */
static PyObject *file_changed_error(PyObject *file, const char *what)
{
    char msg[FL__MSG_SIZE * 2];
    if (file == Py_None) {
        fl_bus_fault_msg(msg, sizeof msg, NULL, -1, -1, NULL, what);
    } else {
        PyObject *encoded = NULL;
        if (!PyUnicode_FSConverter(PyTuple_GET_ITEM(file, 0), &encoded))
            return NULL;
        const char *path = PyBytes_AS_STRING(encoded); /* valid while `encoded` is held */
        long long opened = file_number(file, 1);
        long long fd = file_number(file, 2);
        Py_BEGIN_ALLOW_THREADS
        fl_bus_fault_msg(msg, sizeof msg, path, fd >= 0 && fd <= INT_MAX ? (int)fd : -1,
                         (int64_t)opened, NULL, what);
        Py_END_ALLOW_THREADS
        Py_DECREF(encoded);
    }
    PyObject *text = PyUnicode_DecodeFSDefault(msg);
    if (!text)
        return NULL;
    PyObject *args = Py_BuildValue("(iN)", EIO, text);
    if (!args)
        return NULL;
    PyObject *exc = PyObject_Call(PyExc_OSError, args, NULL);
    Py_DECREF(args);
    return exc;
}

/* The OSError for a gather stopped by a bus error while reading sample
 * `index` (-1: not known) of a source whose `file` passed check_file(). */
static PyObject *source_changed(PyObject *file, long long index)
{
    char what[48] = "sample index not known";
    if (index >= 0)
        snprintf(what, sizeof what, "sample index %lld", index);
    return file_changed_error(file, what);
}

PyObject *fl__file_changed(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 2 || check_file(args[0]) < 0 || !PyUnicode_Check(args[1])) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "file_changed(file, what): what must be a str");
        return NULL;
    }
    const char *what = PyUnicode_AsUTF8(args[1]);
    if (!what)
        return NULL;
    return file_changed_error(args[0], what);
}

/* ------------------------------------------------------------ RowSource */

typedef struct row_table {
    int n_arrays;
    fl_rows rows[MAX_ARRAYS];
} row_table;

typedef struct RowSourceObject {
    fl__native_source head;
    row_table core;
    PyObject *arrays; /* tuple of the arrays read by core */
    PyObject *files;  /* tuple: None, (path, size) or (path, size, fd) each */
} RowSourceObject;

static int rows_plan(PyObject *source, fl__native_job *job)
{
    RowSourceObject *self = (RowSourceObject *)source;
    job->n_out = self->core.n_arrays;
    for (int i = 0; i < job->n_out; i++) {
        PyArrayObject *a = (PyArrayObject *)PyTuple_GET_ITEM(self->arrays, i);
        job->descrs[i] = PyArray_DESCR(a);
        Py_INCREF(job->descrs[i]);
        job->ndims[i] = PyArray_NDIM(a);
        memcpy(job->dims[i], PyArray_DIMS(a), sizeof(npy_intp) * (size_t)job->ndims[i]);
        job->dims[i][0] = (npy_intp)job->n;
    }
    return 0;
}

static void rows_run(const void *core, fl__native_job *job)
{
    const row_table *t = core;
    fl_stage_clock clock;
    fl_stage_begin(&clock, FL_STAGE_COLLATE);
    for (int i = 0; i < t->n_arrays; i++) {
        size_t failed = 0;
        if (fl_gather_rows(&t->rows[i], job->indices, job->n, job->data[i], &failed) != FL_OK) {
            job->status = FL_ERR_IO;
            job->part = i;
            job->sample = failed < job->n ? job->indices[failed] : -1;
            break;
        }
    }
    fl_stage_end(&clock);
}

static PyObject *rows_failure(PyObject *source, const fl__native_job *job)
{
    RowSourceObject *self = (RowSourceObject *)source;
    return source_changed(PyTuple_GET_ITEM(self->files, job->part), (long long)job->sample);
}

static const fl__native_ops row_ops = {
    .plan = rows_plan,
    .run = rows_run,
    .failure = rows_failure,
};

static PyObject *RowSource_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"arrays", "files", NULL};
    PyObject *arrays, *files;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!O!:RowSource", kwlist, &PyTuple_Type,
                                     &arrays, &PyTuple_Type, &files))
        return NULL;
    Py_ssize_t n_arrays = PyTuple_GET_SIZE(arrays);
    if (PyTuple_GET_SIZE(files) != n_arrays || n_arrays < 1 || n_arrays > MAX_ARRAYS) {
        PyErr_SetString(PyExc_TypeError,
                        "RowSource: arrays and files must be tuples of one length (1 to 32)");
        return NULL;
    }
    row_table t = {.n_arrays = (int)n_arrays};
    for (int i = 0; i < t.n_arrays; i++) {
        PyObject *obj = PyTuple_GET_ITEM(arrays, i);
        PyArrayObject *a = (PyArrayObject *)obj;
        if (!PyArray_Check(obj) || PyArray_NDIM(a) < 1) {
            PyErr_SetString(PyExc_TypeError, "RowSource: arrays must be NumPy arrays with rows");
            return NULL;
        }
        fl_rows *r = &t.rows[i];
        r->base = PyArray_BYTES(a);
        r->count = PyArray_DIM(a, 0);
        r->stride = PyArray_STRIDE(a, 0);
        r->row_bytes = (size_t)PyArray_ITEMSIZE(a);
        for (int d = 1; d < PyArray_NDIM(a); d++)
            r->row_bytes *= (size_t)PyArray_DIM(a, d);
        if (check_file(PyTuple_GET_ITEM(files, i)) < 0)
            return NULL;
        r->file_backed = PyTuple_GET_ITEM(files, i) != Py_None;
        if (r->count != t.rows[0].count) {
            PyErr_SetString(PyExc_ValueError, "RowSource: arrays differ in length");
            return NULL;
        }
    }
    RowSourceObject *self = (RowSourceObject *)type->tp_alloc(type, 0);
    if (!self)
        return NULL;
    self->core = t;
    self->arrays = Py_NewRef(arrays);
    self->files = Py_NewRef(files);
    self->head.ops = &row_ops;
    self->head.core = &self->core;
    self->head.length = t.rows[0].count;
    return (PyObject *)self;
}

static void RowSource_dealloc(RowSourceObject *self)
{
    PyTypeObject *type = Py_TYPE(self);
    Py_XDECREF(self->arrays);
    Py_XDECREF(self->files);
    type->tp_free(self);
    Py_DECREF(type);
}

PyDoc_STRVAR(rows_batch_doc,
             "batch(indices, pool, convert, seed, epoch, /)\n--\n\n"
             "Copies rows `indices` of every array into one batch array each, with\n"
             "the GIL released, in a slot of `pool` (fresh arrays when it is None);\n"
             "returns (list of arrays passed through `convert`, []).  Negative\n"
             "indices count from the end; others out of range raise IndexError; a\n"
             "mapped file that shrank under the copy raises OSError (EIO) naming it\n"
             "and the sample index.  seed and epoch are unused: rows are rows.");

static PyMethodDef RowSource_methods[] = {
    {"batch", (PyCFunction)(void (*)(void))fl__native_batch_method, METH_FASTCALL,
     rows_batch_doc},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot RowSource_slots[] = {
    {Py_tp_doc, "RowSource(arrays, files)\n--\n\n"
                "Rows of a tuple of arrays (C-contiguous rows): ArrayDataset's native source."},
    {Py_tp_new, RowSource_new},
    {Py_tp_dealloc, RowSource_dealloc},
    {Py_tp_methods, RowSource_methods},
    {0, NULL},
};

PyType_Spec fl__RowSource_spec = {
    .name = "fastload._C.RowSource",
    .basicsize = sizeof(RowSourceObject),
    .flags = Py_TPFLAGS_DEFAULT,
    .slots = RowSource_slots,
};

/* --------------------------------------------------------- WindowSource */

typedef struct window_table {
    const void *tokens;
    int token_size;    /* 1, 2, 4 or 8 bytes */
    int is_signed;
    int file_backed;
    int64_t stride;    /* tokens from one window to the next */
    size_t block;      /* tokens a window */
} window_table;

typedef struct WindowSourceObject {
    fl__native_source head;
    window_table core;
    PyObject *tokens;
    PyObject *file;
} WindowSourceObject;

static int windows_plan(PyObject *source, fl__native_job *job)
{
    WindowSourceObject *self = (WindowSourceObject *)source;
    job->n_out = 2;
    for (int i = 0; i < 2; i++) {
        job->descrs[i] = PyArray_DescrFromType(NPY_INT64);
        job->ndims[i] = 2;
        job->dims[i][0] = (npy_intp)job->n;
        job->dims[i][1] = (npy_intp)self->core.block;
    }
    for (size_t i = 0; i < job->n; i++)
        job->indices[i] *= self->core.stride; /* window index -> first token */
    return 0;
}

static void windows_run(const void *core, fl__native_job *job)
{
    const window_table *t = core;
    fl_stage_clock clock;
    fl_stage_begin(&clock, FL_STAGE_COLLATE);
    size_t failed = 0;
    if (fl_gather_windows(t->tokens, t->token_size, t->is_signed, t->file_backed, job->indices,
                          job->n, t->block, (int64_t *)job->data[0], (int64_t *)job->data[1],
                          &failed) != FL_OK) {
        job->status = FL_ERR_IO;
        job->sample = failed < job->n ? job->indices[failed] / t->stride : -1;
    }
    fl_stage_end(&clock);
}

static PyObject *windows_failure(PyObject *source, const fl__native_job *job)
{
    return source_changed(((WindowSourceObject *)source)->file, (long long)job->sample);
}

static const fl__native_ops window_ops = {
    .plan = windows_plan,
    .run = windows_run,
    .failure = windows_failure,
};

static PyObject *WindowSource_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"tokens", "file", "stride", "block", NULL};
    PyObject *tokens_obj, *file;
    long long stride, block;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOLL:WindowSource", kwlist, &tokens_obj, &file,
                                     &stride, &block))
        return NULL;
    if (!PyArray_Check(tokens_obj) || PyArray_NDIM((PyArrayObject *)tokens_obj) != 1 ||
        !PyArray_IS_C_CONTIGUOUS((PyArrayObject *)tokens_obj)) {
        PyErr_SetString(PyExc_TypeError, "WindowSource: tokens must be a contiguous 1-d array");
        return NULL;
    }
    if (check_file(file) < 0)
        return NULL;
    PyArrayObject *tokens = (PyArrayObject *)tokens_obj;
    int token_size = (int)PyArray_ITEMSIZE(tokens);
    int64_t n_tokens = PyArray_DIM(tokens, 0);
    if (stride < 1 || block < 1 || block >= n_tokens ||
        !(token_size == 1 || token_size == 2 || token_size == 4 || token_size == 8)) {
        PyErr_SetString(PyExc_ValueError, "WindowSource: bad stride, block or token size");
        return NULL;
    }
    WindowSourceObject *self = (WindowSourceObject *)type->tp_alloc(type, 0);
    if (!self)
        return NULL;
    self->core = (window_table){
        .tokens = PyArray_DATA(tokens),
        .token_size = token_size,
        .is_signed = PyArray_ISSIGNED(tokens),
        .file_backed = file != Py_None,
        .stride = stride,
        .block = (size_t)block,
    };
    self->tokens = Py_NewRef(tokens_obj);
    self->file = Py_NewRef(file);
    self->head.ops = &window_ops;
    self->head.core = &self->core;
    self->head.length = (n_tokens - 1 - block) / stride + 1;
    return (PyObject *)self;
}

static void WindowSource_dealloc(WindowSourceObject *self)
{
    PyTypeObject *type = Py_TYPE(self);
    Py_XDECREF(self->tokens);
    Py_XDECREF(self->file);
    type->tp_free(self);
    Py_DECREF(type);
}

PyDoc_STRVAR(windows_batch_doc,
             "batch(indices, pool, convert, seed, epoch, /)\n--\n\n"
             "For window i (starting at token i * stride), the inputs\n"
             "tokens[s:s+block] and targets tokens[s+1:s+block+1], widened to int64:\n"
             "returns ([x, y], []), each (len(indices), block), as RowSource.batch.");

static PyMethodDef WindowSource_methods[] = {
    {"batch", (PyCFunction)(void (*)(void))fl__native_batch_method, METH_FASTCALL,
     windows_batch_doc},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot WindowSource_slots[] = {
    {Py_tp_doc, "WindowSource(tokens, file, stride, block)\n--\n\n"
                "Token windows of a 1-d array: TokenDataset's native source."},
    {Py_tp_new, WindowSource_new},
    {Py_tp_dealloc, WindowSource_dealloc},
    {Py_tp_methods, WindowSource_methods},
    {0, NULL},
};

PyType_Spec fl__WindowSource_spec = {
    .name = "fastload._C.WindowSource",
    .basicsize = sizeof(WindowSourceObject),
    .flags = Py_TPFLAGS_DEFAULT,
    .slots = WindowSource_slots,
};

/* ---------------------------------------------------------- copy_mapped */

PyObject *fl__copy_mapped(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 3 || !PyUnicode_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "copy_mapped(src, dst, what): what must be a str");
        return NULL;
    }
    const char *what = PyUnicode_AsUTF8(args[2]);
    if (!what)
        return NULL;
    Py_buffer src, dst;
    if (PyObject_GetBuffer(args[0], &src, PyBUF_SIMPLE) < 0)
        return NULL;
    if (PyObject_GetBuffer(args[1], &dst, PyBUF_SIMPLE | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&src);
        return NULL;
    }
    PyObject *result = NULL;
    if (src.len != dst.len) {
        PyErr_Format(PyExc_ValueError, "copy_mapped(): %zd bytes into %zd", src.len, dst.len);
        goto done;
    }
    char msg[FL__MSG_SIZE * 2];
    int rc;
    Py_BEGIN_ALLOW_THREADS
    const void *fault = NULL;
    rc = fl_guarded_copy(dst.buf, src.buf, (size_t)src.len, &fault);
    if (rc != FL_OK)
        fl_bus_fault_msg(msg, sizeof msg, NULL, -1, -1, fault, what);
    Py_END_ALLOW_THREADS
    if (rc != FL_OK) {
        PyObject *exc = PyObject_CallFunction(PyExc_OSError, "is", EIO, msg);
        if (exc) {
            PyErr_SetObject(PyExc_OSError, exc);
            Py_DECREF(exc);
        }
        goto done;
    }
    result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    return result;
}
