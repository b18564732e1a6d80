/* fastload._C: gather() and gather_windows() — the batch paths of
 * ArrayDataset and TokenDataset.
 *
 * Everything Python is done first, with the GIL: the indices are converted
 * to int64 and checked, the batch memory is taken (a slot, or fresh NumPy
 * arrays), and references to the sources are held.  The copies then run in
 * the core with the GIL released, and the output arrays are built over the
 * memory.  The sources are validated by the Python classes (fastload/
 * arrays.py): C-contiguous rows of a native-order plain dtype.  A source's
 * `file` is None for memory that is no file mapping, else (path, the file's
 * size in bytes when it was opened): the path names it in errors, and the
 * size tells a truncated file from a failing one.
 *
 * The index conversion and the batch memory (fl__convert_indices,
 * fl__batch_out_*) serve every native dataset; fastload.h declares them.
 */
#include "fastload.h"

#include "core/gather.h"
#include "core/slots.h"
#include "core/status.h"

#include <errno.h>
#include <string.h>
#include <sys/stat.h>

#define BATCH_ALIGN 64 /* each output array starts on a cache line */
#define MAX_ARRAYS FL__MAX_BATCH_ARRAYS

/* ----------------------------------------------------------------- indices */

int fl__index_error(long long index, int64_t count)
{
    PyErr_Format(PyExc_IndexError, "index %lld is out of range for a dataset of %lld samples",
                 index, (long long)count);
    return -1;
}

int fl__convert_indices(PyObject *obj, int64_t count, int64_t **out, Py_ssize_t *n_out)
{
    PyObject *seq = NULL;
    int64_t *idx = NULL;
    Py_ssize_t n;
    int wide_unsigned = 0; /* values past INT64_MAX arrive wrapped to negative */

    if (PyArray_Check(obj)) {
        PyArrayObject *a = (PyArrayObject *)obj;
        if (PyArray_NDIM(a) != 1 || !PyArray_ISINTEGER(a)) {
            PyErr_SetString(PyExc_TypeError,
                            "indices must be a one-dimensional array of integers");
            return -1;
        }
        wide_unsigned = PyArray_ISUNSIGNED(a) && PyArray_ITEMSIZE(a) >= 8;
        seq = PyArray_FROMANY(obj, NPY_INT64, 1, 1, NPY_ARRAY_CARRAY_RO | NPY_ARRAY_FORCECAST);
        if (!seq)
            return -1;
        n = PyArray_DIM((PyArrayObject *)seq, 0);
        idx = PyMem_RawMalloc(sizeof *idx * (size_t)(n > 0 ? n : 1));
        if (!idx)
            goto nomem;
        memcpy(idx, PyArray_DATA((PyArrayObject *)seq), sizeof *idx * (size_t)n);
    } else {
        seq = PySequence_Fast(obj, "indices must be a sequence of integers");
        if (!seq)
            return -1;
        n = PySequence_Fast_GET_SIZE(seq);
        idx = PyMem_RawMalloc(sizeof *idx * (size_t)(n > 0 ? n : 1));
        if (!idx)
            goto nomem;
        PyObject **items = PySequence_Fast_ITEMS(seq);
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *item = items[i];
            long long v;
            if (PyLong_CheckExact(item)) {
                v = PyLong_AsLongLong(item);
            } else {
                PyObject *as_int = PyNumber_Index(item); /* NumPy integers, bool is refused */
                if (!as_int || PyBool_Check(item)) {
                    Py_XDECREF(as_int);
                    if (!PyErr_Occurred() || PyErr_ExceptionMatches(PyExc_TypeError)) {
                        PyErr_Clear();
                        PyErr_Format(PyExc_TypeError, "indices must be integers, not %.100s",
                                     Py_TYPE(item)->tp_name);
                    }
                    goto fail;
                }
                v = PyLong_AsLongLong(as_int);
                Py_DECREF(as_int);
            }
            if (v == -1 && PyErr_Occurred()) {
                if (PyErr_ExceptionMatches(PyExc_OverflowError)) {
                    PyErr_Clear();
                    PyErr_Format(PyExc_IndexError,
                                 "index %S is out of range for a dataset of %lld samples", item,
                                 (long long)count);
                }
                goto fail;
            }
            idx[i] = v;
        }
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t v = idx[i];
        if (v < 0 && wide_unsigned) {
            PyErr_Format(PyExc_IndexError,
                         "index %llu is out of range for a dataset of %lld samples",
                         (unsigned long long)(uint64_t)v, (long long)count);
            goto fail;
        }
        if (v < 0)
            v += count;
        if (v < 0 || v >= count) {
            fl__index_error((long long)idx[i], count);
            goto fail;
        }
        idx[i] = v;
    }
    Py_DECREF(seq);
    *out = idx;
    *n_out = n;
    return 0;

nomem:
    PyErr_NoMemory();
fail:
    PyMem_RawFree(idx);
    Py_XDECREF(seq);
    return -1;
}

/* ----------------------------------------------------------------- output */

void fl__batch_out_clear(fl__batch_out *b)
{
    Py_CLEAR(b->owner);
    for (int i = 0; i < b->n; i++)
        Py_CLEAR(b->arrays[i]);
}

int fl__batch_out_alloc(fl__batch_out *b, fastload_state *state, PyObject *pool, int n,
                           PyArray_Descr **descrs, const int *ndims, npy_intp dims[][NPY_MAXDIMS])
{
    b->n = n;
    if (pool == Py_None) {
        for (int i = 0; i < n; i++) {
            Py_INCREF(descrs[i]);
            b->arrays[i] = PyArray_NewFromDescr(&PyArray_Type, descrs[i], ndims[i], dims[i], NULL,
                                                NULL, 0, NULL);
            if (!b->arrays[i])
                return -1;
            b->data[i] = PyArray_BYTES((PyArrayObject *)b->arrays[i]);
        }
        return 0;
    }
    if (!PyObject_TypeCheck(pool, state->SlotPool_type)) {
        PyErr_SetString(PyExc_TypeError, "pool must be a SlotPool or None");
        return -1;
    }
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        size_t bytes = (size_t)PyDataType_ELSIZE(descrs[i]);
        for (int d = 0; d < ndims[i]; d++)
            bytes *= (size_t)dims[i][d];
        b->offsets[i] = total;
        total += (bytes + BATCH_ALIGN - 1) / BATCH_ALIGN * BATCH_ALIGN;
    }
    fl_slot *slot;
    if (fl__acquire_slot(pool, total, &slot) < 0)
        return -1;
    b->owner = fl__SlotOwner_new(state, slot);
    if (!b->owner)
        return -1;
    for (int i = 0; i < n; i++)
        b->data[i] = (char *)slot->data + b->offsets[i];
    return 0;
}

PyObject *fl__batch_out_finish(fl__batch_out *b, PyArray_Descr **descrs, const int *ndims,
                                  npy_intp dims[][NPY_MAXDIMS], PyObject *convert)
{
    PyObject *list = PyList_New(b->n);
    if (!list)
        return NULL;
    for (int i = 0; i < b->n; i++) {
        PyObject *item;
        if (b->owner) {
            Py_INCREF(descrs[i]);
            item = fl__slot_array(b->owner, b->offsets[i], descrs[i], ndims[i], dims[i], convert);
        } else if (convert != Py_None) {
            item = PyObject_CallOneArg(convert, b->arrays[i]);
        } else {
            item = Py_NewRef(b->arrays[i]);
        }
        if (!item) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, i, item);
    }
    return list;
}

/* ------------------------------------------------------------- bad files */

static int check_file(PyObject *file)
{
    if (file == Py_None ||
        (PyTuple_Check(file) && PyTuple_GET_SIZE(file) == 2 &&
         PyUnicode_Check(PyTuple_GET_ITEM(file, 0)) && PyLong_Check(PyTuple_GET_ITEM(file, 1))))
        return 0;
    PyErr_SetString(PyExc_TypeError, "gather: a file must be None or (path, size)");
    return -1;
}

/* The file's size now, or -1 when it cannot be told. */
static long long size_now(PyObject *path)
{
    PyObject *encoded = NULL;
    if (!PyUnicode_FSConverter(path, &encoded)) {
        PyErr_Clear();
        return -1;
    }
    const char *name = PyBytes_AS_STRING(encoded); /* valid while `encoded` is held */
    struct stat st;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = stat(name, &st);
    Py_END_ALLOW_THREADS
    Py_DECREF(encoded);
    return rc == 0 ? (long long)st.st_size : -1;
}

/* Raises OSError (EIO) for a gather stopped by a bus error while reading
 * sample `index` (-1: not known) of a source whose `file` passed
 * check_file().  Returns NULL. */
static PyObject *raise_source_changed(PyObject *file, long long index)
{
    PyObject *sample = index >= 0 ? PyUnicode_FromFormat("sample index %lld", index)
                                  : PyUnicode_FromString("sample index not known");
    if (!sample)
        return NULL;
    PyObject *msg;
    if (file == Py_None) {
        msg = PyUnicode_FromFormat("memory changed under the loader: a bus error reading %U "
                                   "(the array is a file mapping whose file was truncated, or "
                                   "could not be read)",
                                   sample);
    } else {
        PyObject *path = PyTuple_GET_ITEM(file, 0);
        long long opened = PyLong_AsLongLong(PyTuple_GET_ITEM(file, 1));
        if (opened == -1 && PyErr_Occurred())
            PyErr_Clear();
        long long now = size_now(path);
        if (now >= 0 && now < opened)
            msg = PyUnicode_FromFormat("file changed under the loader: %R is shorter than when "
                                       "it was opened (%U; %lld bytes then, %lld now)",
                                       path, sample, opened, now);
        else
            msg = PyUnicode_FromFormat("file changed under the loader: %R could not be read "
                                       "(%U; a bus error: the file was truncated or rewritten "
                                       "while in use, or its storage failed)",
                                       path, sample);
    }
    Py_DECREF(sample);
    if (!msg)
        return NULL;
    PyObject *args = Py_BuildValue("(iN)", EIO, msg);
    if (args) {
        PyErr_SetObject(PyExc_OSError, args);
        Py_DECREF(args);
    }
    return NULL;
}

/* ----------------------------------------------------------------- gather */

PyObject *fl__gather(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    fastload_state *state = fl__state_of_module(module);
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError,
                        "gather(arrays, files, indices, pool, convert) takes 5 arguments");
        return NULL;
    }
    PyObject *arrays = args[0], *files = args[1], *pool = args[3], *convert = args[4];
    if (!PyTuple_Check(arrays) || !PyTuple_Check(files) ||
        PyTuple_GET_SIZE(arrays) != PyTuple_GET_SIZE(files) || PyTuple_GET_SIZE(arrays) < 1 ||
        PyTuple_GET_SIZE(arrays) > MAX_ARRAYS) {
        PyErr_SetString(PyExc_TypeError, "gather: arrays and files must be tuples of one length");
        return NULL;
    }
    int n_arrays = (int)PyTuple_GET_SIZE(arrays);
    PyArray_Descr *descrs[MAX_ARRAYS];
    int ndims[MAX_ARRAYS];
    npy_intp dims[MAX_ARRAYS][NPY_MAXDIMS];
    fl_rows rows[MAX_ARRAYS];
    int64_t count = -1;
    for (int i = 0; i < n_arrays; i++) {
        PyObject *obj = PyTuple_GET_ITEM(arrays, i);
        if (!PyArray_Check(obj) || PyArray_NDIM((PyArrayObject *)obj) < 1) {
            PyErr_SetString(PyExc_TypeError, "gather: arrays must be NumPy arrays with rows");
            return NULL;
        }
        PyArrayObject *a = (PyArrayObject *)obj;
        descrs[i] = PyArray_DESCR(a);
        ndims[i] = PyArray_NDIM(a);
        memcpy(dims[i], PyArray_DIMS(a), sizeof(npy_intp) * (size_t)ndims[i]);
        rows[i].base = PyArray_BYTES(a);
        rows[i].count = PyArray_DIM(a, 0);
        rows[i].stride = PyArray_STRIDE(a, 0);
        rows[i].row_bytes = (size_t)PyArray_ITEMSIZE(a);
        for (int d = 1; d < ndims[i]; d++)
            rows[i].row_bytes *= (size_t)PyArray_DIM(a, d);
        if (check_file(PyTuple_GET_ITEM(files, i)) < 0)
            return NULL;
        rows[i].file_backed = PyTuple_GET_ITEM(files, i) != Py_None;
        if (count >= 0 && rows[i].count != count) {
            PyErr_SetString(PyExc_ValueError, "gather: arrays differ in length");
            return NULL;
        }
        count = rows[i].count;
    }

    int64_t *idx = NULL;
    Py_ssize_t n;
    fl__batch_out out = {0};
    PyObject *result = NULL;
    if (fl__convert_indices(args[2], count, &idx, &n) < 0)
        return NULL;
    for (int i = 0; i < n_arrays; i++)
        dims[i][0] = n;
    if (fl__batch_out_alloc(&out, state, pool, n_arrays, descrs, ndims, dims) < 0)
        goto done;

    /* `arrays` (held by the caller for the whole call) keeps every source
     * alive; only core code runs here. */
    int status = FL_OK, failed_array = 0;
    size_t failed = 0;
    Py_BEGIN_ALLOW_THREADS
    for (int i = 0; i < n_arrays && status == FL_OK; i++) {
        status = fl_gather_rows(&rows[i], idx, (size_t)n, out.data[i], &failed);
        failed_array = i;
    }
    Py_END_ALLOW_THREADS
    if (status != FL_OK) {
        raise_source_changed(PyTuple_GET_ITEM(files, failed_array),
                             failed < (size_t)n ? (long long)idx[failed] : -1);
        goto done;
    }

    result = fl__batch_out_finish(&out, descrs, ndims, dims, convert);
done:
    fl__batch_out_clear(&out);
    PyMem_RawFree(idx);
    return result;
}

PyObject *fl__gather_windows(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    fastload_state *state = fl__state_of_module(module);
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "gather_windows(tokens, file, stride, block, "
                                         "indices, pool, convert) takes 7 arguments");
        return NULL;
    }
    PyObject *tokens_obj = args[0], *file = args[1], *pool = args[5], *convert = args[6];
    if (!PyArray_Check(tokens_obj) || PyArray_NDIM((PyArrayObject *)tokens_obj) != 1 ||
        !PyArray_IS_C_CONTIGUOUS((PyArrayObject *)tokens_obj)) {
        PyErr_SetString(PyExc_TypeError, "gather_windows: tokens must be a contiguous 1-d array");
        return NULL;
    }
    PyArrayObject *tokens = (PyArrayObject *)tokens_obj;
    int token_size = (int)PyArray_ITEMSIZE(tokens);
    if (check_file(file) < 0)
        return NULL;
    int mapped = file != Py_None;
    long long stride = PyLong_AsLongLong(args[2]);
    long long block = PyLong_AsLongLong(args[3]);
    if (PyErr_Occurred())
        return NULL;
    int64_t n_tokens = PyArray_DIM(tokens, 0);
    if (stride < 1 || block < 1 || block >= n_tokens ||
        !(token_size == 1 || token_size == 2 || token_size == 4 || token_size == 8)) {
        PyErr_SetString(PyExc_ValueError, "gather_windows: bad stride, block or token size");
        return NULL;
    }
    int64_t windows = (n_tokens - 1 - block) / stride + 1;

    int64_t *idx = NULL;
    Py_ssize_t n;
    fl__batch_out out = {0};
    PyObject *result = NULL;
    PyArray_Descr *int64 = PyArray_DescrFromType(NPY_INT64);
    PyArray_Descr *descrs[2] = {int64, int64};
    int ndims[2] = {2, 2};
    npy_intp dims[2][NPY_MAXDIMS];
    if (fl__convert_indices(args[4], windows, &idx, &n) < 0)
        goto done;
    for (Py_ssize_t i = 0; i < n; i++)
        idx[i] *= stride; /* window index -> first token */
    dims[0][0] = dims[1][0] = n;
    dims[0][1] = dims[1][1] = (npy_intp)block;
    if (fl__batch_out_alloc(&out, state, pool, 2, descrs, ndims, dims) < 0)
        goto done;

    const void *data = PyArray_DATA(tokens);
    int is_signed = PyArray_ISSIGNED(tokens);
    int status;
    size_t failed = 0;
    Py_BEGIN_ALLOW_THREADS
    status = fl_gather_windows(data, token_size, is_signed, mapped, idx, (size_t)n,
                               (size_t)block, (int64_t *)out.data[0], (int64_t *)out.data[1],
                               &failed);
    Py_END_ALLOW_THREADS
    if (status != FL_OK) {
        raise_source_changed(file, failed < (size_t)n ? (long long)(idx[failed] / stride) : -1);
        goto done;
    }

    result = fl__batch_out_finish(&out, descrs, ndims, dims, convert);
done:
    fl__batch_out_clear(&out);
    PyMem_RawFree(idx);
    Py_DECREF(int64);
    return result;
}
