/* fastload._C: converting Python objects to C values — the conversions
 * every binding file may use (declared in fastload.h).  They call nothing
 * else of the binding but its error helpers (errors.c). */
#include "bind/fastload.h"

#include <limits.h>
#include <string.h>

int fl__as_int(PyObject *obj, int *out)
{
    long v = PyLong_AsLong(obj);
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (v < INT_MIN || v > INT_MAX) {
        PyErr_SetString(PyExc_OverflowError, "out of range");
        return -1;
    }
    *out = (int)v;
    return 0;
}

int fl__read_numbers(PyObject *obj, int n, int ints, double *out)
{
    PyObject *seq = PySequence_Fast(obj, "a tuple of numbers");
    if (!seq)
        return -1;
    int rc = 0;
    if (PySequence_Fast_GET_SIZE(seq) != n) {
        PyErr_Format(PyExc_ValueError, "%d numbers expected", n);
        rc = -1;
    }
    for (int i = 0; rc == 0 && i < n; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
        if (ints) {
            int v = 0;
            rc = fl__as_int(item, &v);
            out[i] = v;
        } else {
            out[i] = PyFloat_AsDouble(item);
            rc = out[i] == -1.0 && PyErr_Occurred() ? -1 : 0;
        }
    }
    Py_DECREF(seq);
    return rc;
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

PyObject *fl__tensor_type(fastload_state *state)
{
    if (state->tensor_type)
        return state->tensor_type;
    PyObject *torch = PyDict_GetItemString(PyImport_GetModuleDict(), "torch"); /* borrowed */
    if (!torch || torch == Py_None)
        return NULL;
    PyObject *type = PyObject_GetAttrString(torch, "Tensor");
    if (type && PyType_Check(type)) {
        state->tensor_type = type; /* takes the reference */
        return type;
    }
    /* torch half-way through its own import: no Tensor yet, nor any tensor. */
    Py_XDECREF(type);
    PyErr_Clear();
    return NULL;
}
