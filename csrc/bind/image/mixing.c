/* fastload._C: batch transforms (MixUp / CutMix, csrc/core/image/mix.h) on
 * arrays, for batches collated outside the native path; the mix plan reader
 * the native jobs share; and the array checks and the apply step the test
 * probes (testing.c) use as well.
 */
#include "bind/fastload.h"

#include "core/image/resample.h"
#include "core/status.h"

#include <string.h>

/* --------------------------------------------------------------- the plan */

static int read_vector(PyObject *plan, const char *name, int n, double *out, int *count)
{
    PyObject *value = PyObject_GetAttrString(plan, name);
    if (!value)
        return -1;
    PyObject *seq = PySequence_Fast(value, "a sequence of numbers");
    Py_DECREF(value);
    if (!seq)
        return -1;
    Py_ssize_t len = PySequence_Fast_GET_SIZE(seq);
    int rc = 0;
    if (len < 1 || len > n) {
        PyErr_Format(PyExc_ValueError, "mix plan: %s must hold 1 to %d values", name, n);
        rc = -1;
    }
    for (Py_ssize_t i = 0; rc == 0 && i < len; i++) {
        out[i] = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(seq, i));
        if (out[i] == -1.0 && PyErr_Occurred())
            rc = -1;
    }
    *count = (int)len;
    Py_DECREF(seq);
    return rc;
}

int fl__parse_mix_plan(PyObject *plan, fl_mix_plan *out)
{
    memset(out, 0, sizeof *out);
    if (plan == Py_None)
        return 0;
    double kinds[FL_MIX_MAX_CHOICES], probs[FL_MIX_MAX_CHOICES];
    int n_kinds, n_alphas, n_probs;
    if (read_vector(plan, "kinds", FL_MIX_MAX_CHOICES, kinds, &n_kinds) < 0 ||
        read_vector(plan, "alphas", FL_MIX_MAX_CHOICES, out->alpha, &n_alphas) < 0 ||
        read_vector(plan, "probs", FL_MIX_MAX_CHOICES, probs, &n_probs) < 0)
        return -1;
    PyObject *classes = PyObject_GetAttrString(plan, "num_classes");
    if (!classes)
        return -1;
    long k = PyLong_AsLong(classes);
    Py_DECREF(classes);
    if (k == -1 && PyErr_Occurred())
        return -1;
    if (n_kinds != n_alphas || n_kinds != n_probs || k < 1 || k > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "malformed mix plan");
        return -1;
    }
    double total = 0.0;
    for (int i = 0; i < n_kinds; i++) {
        if ((kinds[i] != FL_MIX_MIXUP && kinds[i] != FL_MIX_CUTMIX) || !(out->alpha[i] > 0.0) ||
            !(probs[i] >= 0.0)) {
            PyErr_SetString(PyExc_ValueError, "malformed mix plan");
            return -1;
        }
        out->kind[i] = (int)kinds[i];
        total += probs[i];
    }
    if (!(total > 0.0)) {
        PyErr_SetString(PyExc_ValueError, "malformed mix plan: probabilities");
        return -1;
    }
    double sum = 0.0;
    for (int i = 0; i < n_kinds; i++) {
        sum += probs[i] / total;
        out->cum_p[i] = sum;
    }
    out->cum_p[n_kinds - 1] = 1.0;
    out->n = n_kinds;
    out->num_classes = (int)k;
    return 0;
}

/* ------------------------------------------------------------ on arrays */

int fl__mix_array_batch(PyObject *images, PyObject *labels, int nhwc, fl_mix_batch *b)
{
    PyArrayObject *im = (PyArrayObject *)images, *lb = (PyArrayObject *)labels;
    if (!PyArray_Check(images) || PyArray_NDIM(im) != 4 || !PyArray_IS_C_CONTIGUOUS(im) ||
        !PyArray_ISWRITEABLE(im)) {
        PyErr_SetString(PyExc_TypeError, "MixUp/CutMix: the images must be a writable, "
                                         "contiguous 4-D batch (N, C, H, W)");
        return -1;
    }
    int type = PyArray_TYPE(im);
    if (type != NPY_FLOAT32 && type != NPY_FLOAT16 && type != NPY_UINT8) {
        PyErr_SetString(PyExc_TypeError, "MixUp/CutMix: the images must be float32, float16 "
                                         "or uint8");
        return -1;
    }
    if (!PyArray_Check(labels) || PyArray_NDIM(lb) != 1 || PyArray_TYPE(lb) != NPY_INT64 ||
        !PyArray_IS_C_CONTIGUOUS(lb) || PyArray_DIM(lb, 0) != PyArray_DIM(im, 0)) {
        PyErr_SetString(PyExc_ValueError, "MixUp/CutMix: the labels must be class indices, "
                                          "an int64 vector with one label per image");
        return -1;
    }
    npy_intp *d = PyArray_DIMS(im);
    if (d[1] > INT32_MAX || d[2] > INT32_MAX || d[3] > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "MixUp/CutMix: the images are too large");
        return -1;
    }
    b->images = PyArray_DATA(im);
    b->dtype = type == NPY_FLOAT32 ? FL_DTYPE_FLOAT32
               : type == NPY_FLOAT16 ? FL_DTYPE_FLOAT16
                                     : FL_DTYPE_UINT8;
    b->nhwc = nhwc;
    b->n = (size_t)d[0];
    b->channels = (int)(nhwc ? d[3] : d[1]);
    b->height = (int)(nhwc ? d[1] : d[2]);
    b->width = (int)(nhwc ? d[2] : d[3]);
    b->labels = PyArray_DATA(lb);
    b->soft = NULL;
    return 0;
}

PyObject *fl__mix_on_arrays(const fl_mix_params *params, int num_classes, fl_mix_batch *b,
                            long long batch)
{
    npy_intp dims[2] = {(npy_intp)b->n, num_classes};
    PyObject *soft = PyArray_SimpleNew(2, dims, NPY_FLOAT32);
    if (!soft)
        return NULL;
    b->soft = PyArray_DATA((PyArrayObject *)soft);
    size_t bad = 0;
    int rc;
    /* The caller holds the arrays for the call. */
    Py_BEGIN_ALLOW_THREADS
    rc = fl_mix_apply(params, num_classes, b, &bad);
    Py_END_ALLOW_THREADS
    if (rc == FL_OK)
        return soft;
    Py_DECREF(soft);
    if (rc == FL_ERR_NOMEM)
        return PyErr_NoMemory();
    char where[64] = "";
    if (batch >= 0)
        snprintf(where, sizeof where, "batch %lld: ", batch);
    if (params->kind == FL_MIX_MIXUP && b->dtype == FL_DTYPE_UINT8 &&
        !(b->labels[bad] < 0 || b->labels[bad] >= num_classes))
        PyErr_Format(PyExc_TypeError, "%sMixUp needs float images (ToTensor or "
                     "ConvertImageDtype); this batch is uint8", where);
    else
        PyErr_Format(PyExc_ValueError, "%slabel %lld of the sample at position %zu of the "
                     "batch is outside [0, num_classes=%d)", where,
                     (long long)b->labels[bad], bad, num_classes);
    return NULL;
}

PyObject *fl__mix_batch(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "mix_batch(images, labels, plan, seed, epoch, batch, "
                                         "nhwc) takes 7 arguments");
        return NULL;
    }
    fl_mix_plan plan;
    if (fl__parse_mix_plan(args[2], &plan) < 0)
        return NULL;
    if (plan.n == 0) {
        PyErr_SetString(PyExc_ValueError, "mix_batch: no mix plan");
        return NULL;
    }
    unsigned long long seed = PyLong_AsUnsignedLongLongMask(args[3]);
    unsigned long long epoch = PyLong_AsUnsignedLongLongMask(args[4]);
    long long batch = PyLong_AsLongLong(args[5]);
    int nhwc = PyObject_IsTrue(args[6]);
    if (PyErr_Occurred() || nhwc < 0)
        return NULL;
    fl_mix_batch b;
    if (fl__mix_array_batch(args[0], args[1], nhwc, &b) < 0)
        return NULL;
    fl_mix_params params;
    fl_mix_draw(&plan, seed, epoch, (uint64_t)batch, b.height, b.width, &params);
    return fl__mix_on_arrays(&params, plan.num_classes, &b, batch);
}
