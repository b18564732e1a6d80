/* fastload._C: batch transforms (MixUp / CutMix, csrc/core/image/mix.h) on
 * arrays, for batches collated outside the native path and for tests; the
 * mix plan reader the native jobs share; and the draws of RandomErasing
 * and of the mixing, exposed so tests can check their distributions.
 */
#include "bind/fastload.h"

#include "core/image/pipeline.h"
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

/* Checks (images, labels) and describes them in *b (soft left NULL). */
static int array_batch(PyObject *images, PyObject *labels, int nhwc, fl_mix_batch *b)
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

/* Runs params on the arrays; returns the soft labels or NULL with an error
 * naming the batch (`batch` < 0: none). */
static PyObject *apply_on_arrays(const fl_mix_params *params, int num_classes, fl_mix_batch *b,
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
    if (array_batch(args[0], args[1], nhwc, &b) < 0)
        return NULL;
    fl_mix_params params;
    fl_mix_draw(&plan, seed, epoch, (uint64_t)batch, b.height, b.width, &params);
    return apply_on_arrays(&params, plan.num_classes, &b, batch);
}

PyObject *fl__mix_apply(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "mix_apply(images, labels, kind, lam, box, "
                                         "num_classes, nhwc) takes 7 arguments");
        return NULL;
    }
    fl_mix_params params = {0};
    params.kind = PyLong_AsLong(args[2]);
    params.lam = PyFloat_AsDouble(args[3]);
    int num_classes = PyLong_AsLong(args[5]);
    int nhwc = PyObject_IsTrue(args[6]);
    if (PyErr_Occurred() || nhwc < 0)
        return NULL;
    if ((params.kind != FL_MIX_MIXUP && params.kind != FL_MIX_CUTMIX) || num_classes < 1) {
        PyErr_SetString(PyExc_ValueError, "mix_apply: bad kind or num_classes");
        return NULL;
    }
    fl_mix_batch b;
    if (array_batch(args[0], args[1], nhwc, &b) < 0)
        return NULL;
    params.weight = params.lam;
    if (params.kind == FL_MIX_CUTMIX) {
        if (!PyArg_ParseTuple(args[4], "iiii", &params.x1, &params.y1, &params.x2, &params.y2))
            return NULL;
        if (params.x1 < 0 || params.y1 < 0 || params.x2 > b.width || params.y2 > b.height) {
            PyErr_SetString(PyExc_ValueError, "mix_apply: the box is outside the images");
            return NULL;
        }
        double area = params.x2 > params.x1 && params.y2 > params.y1
                          ? (double)(params.x2 - params.x1) * (params.y2 - params.y1)
                          : 0.0;
        params.weight = 1.0 - area / ((double)b.width * b.height);
    }
    return apply_on_arrays(&params, num_classes, &b, -1);
}

PyObject *fl__cutmix_box(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "cutmix_box(lam, cx, cy, height, width) takes 5 "
                                         "arguments");
        return NULL;
    }
    double lam = PyFloat_AsDouble(args[0]);
    long cx = PyLong_AsLong(args[1]), cy = PyLong_AsLong(args[2]);
    long height = PyLong_AsLong(args[3]), width = PyLong_AsLong(args[4]);
    if (PyErr_Occurred())
        return NULL;
    if (height < 1 || width < 1 || height > INT32_MAX || width > INT32_MAX || cx < 0 ||
        cy < 0 || cx >= width || cy >= height || !(lam >= 0.0 && lam <= 1.0)) {
        PyErr_SetString(PyExc_ValueError, "cutmix_box: out of range");
        return NULL;
    }
    fl_mix_params p;
    fl_cutmix_box(lam, (int)cx, (int)cy, (int)height, (int)width, &p);
    return Py_BuildValue("(iiii)d", p.x1, p.y1, p.x2, p.y2, p.weight);
}

PyObject *fl__mix_draws(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "mix_draws(plan, seed, epoch, batch, height, width) "
                                         "takes 6 arguments");
        return NULL;
    }
    fl_mix_plan plan;
    if (fl__parse_mix_plan(args[0], &plan) < 0)
        return NULL;
    unsigned long long seed = PyLong_AsUnsignedLongLongMask(args[1]);
    unsigned long long epoch = PyLong_AsUnsignedLongLongMask(args[2]);
    unsigned long long batch = PyLong_AsUnsignedLongLongMask(args[3]);
    long height = PyLong_AsLong(args[4]), width = PyLong_AsLong(args[5]);
    if (PyErr_Occurred())
        return NULL;
    if (plan.n == 0 || height < 1 || width < 1 || height > INT32_MAX || width > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "mix_draws: no plan, or an empty image");
        return NULL;
    }
    fl_mix_params p;
    fl_mix_draw(&plan, seed, epoch, batch, (int)height, (int)width, &p);
    return Py_BuildValue("id(iiii)d", p.kind, p.lam, p.x1, p.y1, p.x2, p.y2, p.weight);
}

/* ------------------------------------------------------------- erasing */

PyObject *fl__erase_draws(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    fl_image_plan plan;
    fl_sample_key key;
    if (fl__parse_draw_args(args, nargs, 6, "erase_draws(plan, seed, epoch, index, width, height)",
                            &plan, &key) < 0)
        return NULL;
    long width = PyLong_AsLong(args[4]), height = PyLong_AsLong(args[5]);
    if (PyErr_Occurred())
        return NULL;
    if (width < 1 || height < 1 || width > INT32_MAX || height > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "erase_draws: empty image");
        return NULL;
    }
    fl_rng rng;
    fl_rng_init_stream(&rng, key.seed, key.epoch, key.index, FL_STREAM_ERASE);
    fl_erase_draw d;
    fl_erase_draw_for(&plan.erase, &rng, (int)width, (int)height, &d);
    if (!d.on)
        Py_RETURN_NONE;
    return Py_BuildValue("(iiii)", d.top, d.left, d.h, d.w);
}
