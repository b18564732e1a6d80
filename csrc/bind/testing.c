/* fastload._C: the test probes — module functions that only the tests
 * call, to check the core's random draws and single ops against
 * torchvision's: a sample's colour, augmentation, warp and erasing draws, a
 * batch's mixing draws, CutMix's box, MixUp/CutMix with given parameters,
 * and one Pillow op.  They keep their names in fastload._C (module.c's exec
 * adds fl__testing_methods beside its own table), so the tests call them as
 * before; nothing in the package does.
 */
#include "bind/fastload.h"

#include "core/cuda/resample_kernel.h"
#include "core/cuda/gpu_batch.h"
#include "core/cuda/gpu_decode.h"
#include "core/image/jpeg.h"
#include "core/image/pipeline.h"
#include "core/image/resample.h"
#include "core/source/crc32c.h"
#include "core/status.h"

/* The arguments `(plan, seed, epoch, index, ...)` of the probes that report a
 * sample's draws: checks there are `expected` (else TypeError with `usage`),
 * parses the plan and the key.  -1 with an exception set. */
static int parse_draw_args(PyObject *const *args, Py_ssize_t nargs, Py_ssize_t expected,
                           const char *usage, fl_image_plan *plan, fl_sample_key *key)
{
    if (nargs != expected) {
        PyErr_Format(PyExc_TypeError, "%s takes %zd arguments", usage, expected);
        return -1;
    }
    if (fl__parse_plan(args[0], plan) < 0)
        return -1;
    key->seed = PyLong_AsUnsignedLongLongMask(args[1]);
    key->epoch = PyLong_AsUnsignedLongLongMask(args[2]);
    key->index = PyLong_AsUnsignedLongLongMask(args[3]);
    return PyErr_Occurred() ? -1 : 0;
}

static PyObject *color_draws(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    fl_image_plan plan;
    fl_sample_key key;
    if (parse_draw_args(args, nargs, 4, "color_draws(plan, seed, epoch, index)", &plan, &key) < 0)
        return NULL;
    fl_sample_geometry g;
    fl_plan_geometry(&plan, &key, 1, 1, &g);
    const fl_color_draw *d = &g.color;
    PyObject *factors[FL_COLOR_OPS] = {NULL};
    PyObject *result = NULL;
    for (int op = 0; op < FL_COLOR_OPS; op++) {
        factors[op] = d->on[op] ? PyFloat_FromDouble(d->factor[op]) : Py_NewRef(Py_None);
        if (!factors[op])
            goto out;
    }
    result = Py_BuildValue("(iiii)(OOOO)O", d->order[0], d->order[1], d->order[2], d->order[3],
                           factors[0], factors[1], factors[2], factors[3],
                           d->gray ? Py_True : Py_False);
out:
    for (int op = 0; op < FL_COLOR_OPS; op++)
        Py_XDECREF(factors[op]);
    return result;
}

/* The op named `name` (torchvision's spelling), or -1. */
static int op_by_name(PyObject *name)
{
    for (int op = 0; op < FL_PIL_OPS; op++)
        if (PyUnicode_Check(name) &&
            PyUnicode_CompareWithASCIIString(name, fl_pil_op_names[op]) == 0)
            return op;
    return -1;
}

static PyObject *pil_op(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError,
                        "pil_op(name, image, magnitude, interpolation, fill) takes 5 arguments");
        return NULL;
    }
    int op = op_by_name(args[0]);
    if (op < 0) {
        PyErr_Format(PyExc_ValueError, "pil_op: unknown op %R", args[0]);
        return NULL;
    }
    PyArrayObject *image = (PyArrayObject *)args[1];
    if (!PyArray_Check(args[1]) || PyArray_NDIM(image) != 3 || PyArray_DIM(image, 2) != 3 ||
        PyArray_TYPE(image) != NPY_UINT8 || !PyArray_IS_C_CONTIGUOUS(image) ||
        PyArray_DIM(image, 0) < 1 || PyArray_DIM(image, 1) < 1) {
        PyErr_SetString(PyExc_TypeError, "pil_op: image must be a C-contiguous HWC uint8 RGB "
                                         "array, not empty");
        return NULL;
    }
    double magnitude = PyFloat_AsDouble(args[2]);
    int interpolation = 0;
    double fill[3];
    if ((magnitude == -1.0 && PyErr_Occurred()) || fl__as_int(args[3], &interpolation) < 0 ||
        fl__read_numbers(args[4], 3, 1, fill) < 0)
        return NULL;
    unsigned char fill8[3];
    for (int c = 0; c < 3; c++) {
        if (fill[c] < 0 || fill[c] > 255) {
            PyErr_SetString(PyExc_ValueError, "pil_op: fill values must be in 0..255");
            return NULL;
        }
        fill8[c] = (unsigned char)fill[c];
    }
    if (interpolation != FL_WARP_NEAREST && interpolation != FL_WARP_BILINEAR) {
        PyErr_SetString(PyExc_ValueError, "pil_op: interpolation must be 0 (nearest) or 1 "
                                          "(bilinear)");
        return NULL;
    }
    int h = (int)PyArray_DIM(image, 0), w = (int)PyArray_DIM(image, 1);
    npy_intp dims[3] = {h, w, 3};
    PyObject *out = PyArray_SimpleNew(3, dims, NPY_UINT8);
    if (!out)
        return NULL;
    int rc = fl_pil_apply(op, magnitude, interpolation, fill8, PyArray_DATA(image),
                          PyArray_DATA((PyArrayObject *)out), w, h);
    if (rc != FL_OK) {
        Py_DECREF(out);
        PyErr_Format(PyExc_ValueError, "pil_op: %s refuses magnitude %R", fl_pil_op_names[op],
                     args[2]);
        return NULL;
    }
    return out;
}

static PyObject *augment_draws(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    fl_image_plan plan;
    fl_sample_key key;
    int width = 0, height = 0;
    if (parse_draw_args(args, nargs, 6, "augment_draws(plan, seed, epoch, index, width, height)",
                        &plan, &key) < 0 ||
        fl__as_int(args[4], &width) < 0 || fl__as_int(args[5], &height) < 0)
        return NULL;
    fl_sample_geometry g;
    fl_plan_geometry(&plan, &key, 1, 1, &g);
    PyObject *result = PyList_New(g.augment.count);
    if (!result)
        return NULL;
    for (int i = 0; i < g.augment.count; i++) {
        double m = fl_augment_magnitude(&plan.augment, &g.augment, i, width, height);
        PyObject *item = Py_BuildValue("(sid)", fl_pil_op_names[g.augment.op[i]],
                                       g.augment.bin[i], m);
        if (!item) {
            Py_DECREF(result);
            return NULL;
        }
        PyList_SET_ITEM(result, i, item);
    }
    return result;
}

static PyObject *warp_draws(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    fl_image_plan plan;
    fl_sample_key key;
    int width = 0, height = 0;
    if (parse_draw_args(args, nargs, 6, "warp_draws(plan, seed, epoch, index, width, height)",
                        &plan, &key) < 0 ||
        fl__as_int(args[4], &width) < 0 || fl__as_int(args[5], &height) < 0)
        return NULL;
    if (width < 1 || height < 1) {
        PyErr_SetString(PyExc_ValueError, "warp_draws: width and height must be >= 1");
        return NULL;
    }
    if (plan.warp.kind == FL_RANDOM_WARP_NONE)
        Py_RETURN_NONE;
    fl_sample_geometry g;
    fl_plan_geometry(&plan, &key, width, height, &g);
    const fl_warp_draw *d = &g.warp;
    return Py_BuildValue("(d(ii)d(dd))", d->angle, d->tx, d->ty, d->scale, d->shear_x,
                         d->shear_y);
}
static PyObject *mix_apply(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
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
    if (fl__mix_array_batch(args[0], args[1], nhwc, &b) < 0)
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
    return fl__mix_on_arrays(&params, num_classes, &b, -1);
}

static PyObject *cutmix_box(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
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

static PyObject *mix_draws(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
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

static PyObject *erase_draws(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    fl_image_plan plan;
    fl_sample_key key;
    if (parse_draw_args(args, nargs, 6, "erase_draws(plan, seed, epoch, index, width, height)",
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

/* resample_kernel's images, one (box, flip) each, resampled into rows of
 * `out` by fl_resample, or (kernel true) by the resample kernel's host run
 * over tables from fl_resample_tables.  The kernel reads each image from a
 * copy of only the region its tables read, with a padded pitch, as it
 * would read a region decode.  0, or -1 with an exception set. */
static int resample_kernel_run(PyObject *images, PyObject *boxes, PyObject *flips,
                               fl_resample_target *t, int kernel, unsigned char *out)
{
    Py_ssize_t n = PyList_GET_SIZE(images);
    size_t row = 3 * (size_t)t->width * t->height * fl_dtype_size(t->dtype);
    fl_resample_scratch *scratch = fl_resample_scratch_new();
    fl_rk_image *rk = PyMem_Calloc((size_t)n + 1, sizeof(fl_rk_image));
    unsigned char **regions = PyMem_Calloc((size_t)n + 1, sizeof(unsigned char *));
    int *first = NULL;
    float *weights = NULL;
    size_t nfirst = 0, nweights = 0;
    int result = -1;
    if (!scratch || !rk || !regions) {
        PyErr_NoMemory();
        goto out;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyArrayObject *image = (PyArrayObject *)PyList_GET_ITEM(images, i);
        double box[4];
        int flip = PyObject_IsTrue(PyList_GET_ITEM(flips, i));
        if (!PyArray_Check(image) || PyArray_NDIM(image) != 3 || PyArray_DIM(image, 2) != 3 ||
            PyArray_TYPE(image) != NPY_UINT8 || !PyArray_IS_C_CONTIGUOUS(image)) {
            PyErr_SetString(PyExc_TypeError, "resample_kernel: images must be C-contiguous "
                                             "HWC uint8 RGB arrays");
            goto out;
        }
        if (flip < 0 || fl__read_numbers(PyList_GET_ITEM(boxes, i), 4, 0, box) < 0)
            goto out;
        int h = (int)PyArray_DIM(image, 0), w = (int)PyArray_DIM(image, 1);
        const unsigned char *src = PyArray_DATA(image);
        fl_resample_target one = *t;
        one.flip = flip;
        one.dst = out + (size_t)i * row;
        int rc;
        if (!kernel) {
            rc = fl_resample(src, w, h, 3 * (size_t)w, box[0], box[1], box[2], box[3], &one,
                             scratch);
        } else {
            fl_resample_coeffs c;
            rc = fl_resample_tables(w, h, box[0], box[1], box[2], box[3], &one, scratch, &c);
            size_t add_first = 0, add_weights = 0;
            if (rc == FL_OK) {
                fl_resample_kernel_table_size(&c, t->width, t->height, &add_first, &add_weights);
                int *f = PyMem_Realloc(first, sizeof(int) * (nfirst + add_first));
                if (f)
                    first = f;
                float *wt = f ? PyMem_Realloc(weights, sizeof(float) * (nweights + add_weights))
                              : NULL;
                if (wt)
                    weights = wt;
                size_t pitch = 3 * (size_t)(c.x.hi - c.x.lo) + 5;
                regions[i] = wt ? PyMem_Malloc(pitch * (size_t)(c.y.hi - c.y.lo)) : NULL;
                if (!regions[i]) {
                    PyErr_NoMemory();
                    goto out;
                }
                for (int y = c.y.lo; y < c.y.hi; y++)
                    memcpy(regions[i] + (size_t)(y - c.y.lo) * pitch,
                           src + ((size_t)y * w + (size_t)c.x.lo) * 3,
                           3 * (size_t)(c.x.hi - c.x.lo));
                rk[i].src = (unsigned long long)(uintptr_t)regions[i];
                rk[i].dst = (unsigned long long)(uintptr_t)one.dst;
                rk[i].src_pitch = (int)pitch;
                rk[i].src_x = c.x.lo;
                rk[i].src_y = c.y.lo;
                rc = fl_resample_kernel_pack(&c, t->width, t->height, first, nfirst, weights,
                                             nweights, &rk[i]);
                nfirst += add_first;
                nweights += add_weights;
            }
        }
        if (rc != FL_OK) {
            PyErr_Format(rc == FL_ERR_NOMEM ? PyExc_MemoryError : PyExc_ValueError,
                         "resample_kernel: image %zd refused (status %d)", i, rc);
            goto out;
        }
    }
    if (kernel) {
        fl_rk_batch batch = {
            .images = (unsigned long long)(uintptr_t)rk,
            .first = (unsigned long long)(uintptr_t)first,
            .weights = (unsigned long long)(uintptr_t)weights,
            .count = (int)n,
            .out_w = t->width,
            .out_h = t->height,
            .dtype = t->dtype,
            .layout = t->layout,
        };
        for (int ch = 0; ch < 3; ch++) {
            batch.scale[ch] = t->scale[ch];
            batch.offset[ch] = t->offset[ch];
        }
        fl_resample_kernel_host(&batch);
    }
    result = 0;
out:
    if (regions)
        for (Py_ssize_t i = 0; i < n; i++)
            PyMem_Free(regions[i]);
    PyMem_Free(regions);
    PyMem_Free(rk);
    PyMem_Free(first);
    PyMem_Free(weights);
    fl_resample_scratch_free(scratch);
    return result;
}

static PyObject *resample_kernel(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 11) {
        PyErr_SetString(PyExc_TypeError, "resample_kernel(images, boxes, flips, size, filter, "
                                         "antialias, dtype, layout, scale, offset, kernel) "
                                         "takes 11 arguments");
        return NULL;
    }
    if (!PyList_Check(args[0]) || !PyList_Check(args[1]) || !PyList_Check(args[2]) ||
        PyList_GET_SIZE(args[1]) != PyList_GET_SIZE(args[0]) ||
        PyList_GET_SIZE(args[2]) != PyList_GET_SIZE(args[0]) || PyList_GET_SIZE(args[0]) < 1) {
        PyErr_SetString(PyExc_TypeError, "resample_kernel: images, boxes and flips must be "
                                         "lists of one length, not empty");
        return NULL;
    }
    fl_resample_target t = {0};
    double size[2], scale[3], offset[3];
    int kernel = PyObject_IsTrue(args[10]);
    if (fl__read_numbers(args[3], 2, 1, size) < 0 || fl__as_int(args[4], &t.filter) < 0 ||
        fl__as_int(args[5], &t.antialias) < 0 || fl__as_int(args[6], &t.dtype) < 0 ||
        fl__as_int(args[7], &t.layout) < 0 || fl__read_numbers(args[8], 3, 0, scale) < 0 ||
        fl__read_numbers(args[9], 3, 0, offset) < 0 || kernel < 0)
        return NULL;
    if (size[0] < 1 || size[1] < 1 || size[0] > 1 << 14 || size[1] > 1 << 14 ||
        (t.dtype != FL_DTYPE_UINT8 && t.dtype != FL_DTYPE_FLOAT32 &&
         t.dtype != FL_DTYPE_FLOAT16) ||
        (t.layout != FL_LAYOUT_CHW && t.layout != FL_LAYOUT_HWC)) {
        PyErr_SetString(PyExc_ValueError, "resample_kernel: bad size, dtype or layout");
        return NULL;
    }
    t.width = (int)size[0];
    t.height = (int)size[1];
    for (int c = 0; c < 3; c++) {
        t.scale[c] = (float)scale[c];
        t.offset[c] = (float)offset[c];
    }
    static const int types[] = {NPY_UINT8, NPY_FLOAT32, NPY_FLOAT16};
    npy_intp dims[4] = {PyList_GET_SIZE(args[0]), 3, t.height, t.width};
    if (t.layout == FL_LAYOUT_HWC) {
        dims[1] = t.height;
        dims[2] = t.width;
        dims[3] = 3;
    }
    PyObject *out = PyArray_SimpleNew(4, dims, types[t.dtype]);
    if (!out)
        return NULL;
    if (resample_kernel_run(args[0], args[1], args[2], &t, kernel,
                            PyArray_DATA((PyArrayObject *)out)) < 0) {
        Py_DECREF(out);
        return NULL;
    }
    return out;
}

static PyObject *resample_kernel_source(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    return PyUnicode_FromString(fl_resample_kernel_source);
}

/* A GPU part (a gpu_split source's third output) viewed; -1 with an
 * exception set when it is not one. */
static int view_gpu_part(PyObject *obj, fl_gpu_batch *gpu)
{
    PyArrayObject *a = (PyArrayObject *)obj;
    if (!PyArray_Check(obj) || PyArray_TYPE(a) != NPY_UINT8 || !PyArray_IS_C_CONTIGUOUS(a) ||
        fl_gpu_batch_view(gpu, PyArray_DATA(a), (size_t)PyArray_NBYTES(a)) != FL_OK) {
        PyErr_SetString(PyExc_ValueError, "not a GPU part of a batch");
        return -1;
    }
    return 0;
}

static PyObject *gpu_part_items(PyObject *module, PyObject *part)
{
    (void)module;
    fl_gpu_batch gpu;
    if (view_gpu_part(part, &gpu) < 0)
        return NULL;
    const fl_gpu_batch_head *h = gpu.head;
    PyObject *items = PyList_New(h->count);
    for (uint32_t i = 0; items && i < h->count; i++) {
        const fl_gpu_item *it = &gpu.items[i];
        PyObject *item = Py_BuildValue(
            "{sLsLsisisKsKsisisisi}", "row", (long long)it->row, "sample", (long long)it->sample,
            "width", it->width, "height", it->height, "offset",
            (unsigned long long)it->offset, "size", (unsigned long long)it->size, "origin_x",
            it->origin_x, "origin_y", it->origin_y, "taps_x", gpu.kernel[i].taps_x, "taps_y",
            gpu.kernel[i].taps_y);
        if (!item)
            Py_CLEAR(items);
        else
            PyList_SET_ITEM(items, i, item);
    }
    if (!items)
        return NULL;
    return Py_BuildValue("{sIsIsKsKsN}", "count", h->count, "cpu_count", h->cpu_count,
                         "encoded_used", (unsigned long long)h->encoded_used, "pixels_used",
                         (unsigned long long)h->pixels_used, "items", items);
}

/* The GPU decode stage's work done on the CPU: each image of the part
 * decoded whole by libjpeg and resampled by the GPU kernel's host run into
 * its row of `images` (the batch's first output). */
static PyObject *gpu_part_finish_on_host(PyObject *module, PyObject *const *args,
                                         Py_ssize_t nargs)
{
    (void)module;
    fl_image_plan plan;
    fl_gpu_batch gpu;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "gpu_part_finish_on_host(plan, part, images)");
        return NULL;
    }
    if (fl__parse_plan(args[0], &plan) < 0 || view_gpu_part(args[1], &gpu) < 0)
        return NULL;
    PyArrayObject *images = (PyArrayObject *)args[2];
    if (!PyArray_Check(args[2]) || PyArray_NDIM(images) < 1 ||
        !PyArray_ISWRITEABLE(images)) {
        PyErr_SetString(PyExc_TypeError, "images must be a writable batch array");
        return NULL;
    }
    npy_intp rows = PyArray_DIM(images, 0);
    size_t row_bytes = rows ? (size_t)PyArray_NBYTES(images) / (size_t)rows : 0;
    char msg[256] = "";
    fl_jpeg *dec;
    if (fl_jpeg_new(&dec, msg, sizeof msg) != FL_OK) {
        PyErr_SetString(PyExc_MemoryError, msg);
        return NULL;
    }
    int rc = FL_OK;
    for (uint32_t i = 0; rc == FL_OK && i < gpu.head->count; i++) {
        const fl_gpu_item *it = &gpu.items[i];
        fl_pixels px;
        rc = fl_jpeg_decode(dec, gpu.encoded + it->offset, it->size, NULL, UINT64_MAX, &px, msg,
                            sizeof msg);
        if (rc != FL_OK || it->row < 0 || it->row >= rows)
            break;
        fl_rk_image image = gpu.kernel[i];
        image.src = (unsigned long long)(uintptr_t)(px.data + (size_t)it->origin_y * px.stride +
                                                    3 * (size_t)it->origin_x);
        image.src_pitch = (int)px.stride;
        image.dst = (unsigned long long)(uintptr_t)(PyArray_BYTES(images) +
                                                    (size_t)it->row * row_bytes);
        fl_rk_batch batch;
        fl_gpu_decode_kernel_batch(&plan, &batch); /* the stage's parameters */
        batch.images = (unsigned long long)(uintptr_t)&image;
        batch.first = (unsigned long long)(uintptr_t)gpu.first;
        batch.weights = (unsigned long long)(uintptr_t)gpu.weights;
        batch.count = 1;
        fl_resample_kernel_host(&batch);
    }
    fl_jpeg_free(dec);
    if (rc != FL_OK) {
        PyErr_Format(PyExc_ValueError, "cannot decode a GPU image: %s", msg);
        return NULL;
    }
    Py_RETURN_NONE;
}

/* Added to fastload._C by module.c's exec (PyModule_AddFunctions). */
/* crc32c(data, impl): the core's CRC-32C of a buffer by one implementation
 * ("auto", "table", "hw"); None for "hw" when the CPU lacks SSE4.2. */
static PyObject *crc32c_probe(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    const char *impl;
    if (nargs != 2 || !(impl = PyUnicode_Check(args[1]) ? PyUnicode_AsUTF8(args[1]) : NULL)) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "crc32c(data, impl) takes a buffer and a str");
        return NULL;
    }
    int which = strcmp(impl, "auto") == 0 ? 0 : strcmp(impl, "table") == 0 ? 1
                : strcmp(impl, "hw") == 0 ? 2 : -1;
    if (which < 0) {
        PyErr_Format(PyExc_ValueError, "crc32c: impl must be auto, table or hw, not %s", impl);
        return NULL;
    }
    if (which == 2 && !fl_crc32c_hw_available())
        Py_RETURN_NONE;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    uint32_t crc;
    Py_BEGIN_ALLOW_THREADS
    crc = which == 0   ? fl_crc32c(0, view.buf, (size_t)view.len)
          : which == 1 ? fl_crc32c_table(0, view.buf, (size_t)view.len)
                       : fl_crc32c_hw(0, view.buf, (size_t)view.len);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(crc);
}

PyMethodDef fl__testing_methods[] = {
    {"crc32c", (PyCFunction)(void (*)(void))crc32c_probe, METH_FASTCALL,
     "crc32c(data, impl, /)\n--\n\n"
     "The CRC-32C of a buffer by 'auto' (what TFRecord reads use), 'table' or\n"
     "'hw' (SSE4.2; None when this CPU lacks it), for tests."},
    {"color_draws", (PyCFunction)(void (*)(void))color_draws, METH_FASTCALL,
     "color_draws(plan, seed, epoch, index, /)\n--\n\n"
     "The colour ops a plan draws for one sample, for tests: (order, factors\n"
     "(None where off), grayscale)."},
    {"augment_draws", (PyCFunction)(void (*)(void))augment_draws, METH_FASTCALL,
     "augment_draws(plan, seed, epoch, index, width, height, /)\n--\n\n"
     "The augmentation ops a plan draws for one sample of width x height, for\n"
     "tests: a list of (op name, magnitude bin, signed magnitude)."},
    {"warp_draws", (PyCFunction)(void (*)(void))warp_draws, METH_FASTCALL,
     "warp_draws(plan, seed, epoch, index, width, height, /)\n--\n\n"
     "The RandomRotation / RandomAffine parameters a plan draws for one sample of\n"
     "a width x height image, for tests: (angle, (tx, ty), scale, (shear_x,\n"
     "shear_y)), or None without either."},
    {"erase_draws", (PyCFunction)(void (*)(void))erase_draws, METH_FASTCALL,
     "erase_draws(plan, seed, epoch, index, width, height, /)\n--\n\n"
     "RandomErasing's box (i, j, h, w) for one sample, or None, for tests."},
    {"pil_op", (PyCFunction)(void (*)(void))pil_op, METH_FASTCALL,
     "pil_op(name, image, magnitude, interpolation, fill, /)\n--\n\n"
     "torchvision's autoaugment op `name` with Pillow's semantics on a C-contiguous\n"
     "HWC uint8 RGB array (interpolation 0 nearest, 1 bilinear; fill 3 ints);\n"
     "returns a new array.  For tests."},
    {"mix_draws", (PyCFunction)(void (*)(void))mix_draws, METH_FASTCALL,
     "mix_draws(plan, seed, epoch, batch, height, width, /)\n--\n\n"
     "A batch's mixing draws, for tests: (kind, lam, box, label weight)."},
    {"cutmix_box", (PyCFunction)(void (*)(void))cutmix_box, METH_FASTCALL,
     "cutmix_box(lam, cx, cy, height, width, /)\n--\n\n"
     "CutMix's box and label weight for lam and a centre, for tests."},
    {"mix_apply", (PyCFunction)(void (*)(void))mix_apply, METH_FASTCALL,
     "mix_apply(images, labels, kind, lam, box, num_classes, nhwc, /)\n--\n\n"
     "MixUp (kind 0, lam) or CutMix (kind 1, box (x1, y1, x2, y2)) with the\n"
     "given parameters, for tests; returns the soft labels."},
    {"resample_kernel", (PyCFunction)(void (*)(void))resample_kernel, METH_FASTCALL,
     "resample_kernel(images, boxes, flips, size, filter, antialias, dtype, layout,\n"
     "scale, offset, kernel, /)\n--\n\n"
     "Resamples HWC uint8 images, each with its box (x, y, w, h) and flip, into\n"
     "a batch of size (w, h) (filter, antialias, dtype and layout as FL_*, scale and\n"
     "offset 3 numbers): by fl_resample, or (kernel true) by the GPU resample\n"
     "kernel's host run.  For tests."},
    {"resample_kernel_source", (PyCFunction)resample_kernel_source, METH_NOARGS,
     "resample_kernel_source()\n--\n\n"
     "The resample kernel's source text as the extension carries it, for tests."},
    {"gpu_part_items", (PyCFunction)gpu_part_items, METH_O,
     "gpu_part_items(part, /)\n--\n\n"
     "What a batch's GPU part holds, for tests: its counts and its items."},
    {"gpu_part_finish_on_host", (PyCFunction)(void (*)(void))gpu_part_finish_on_host,
     METH_FASTCALL,
     "gpu_part_finish_on_host(plan, part, images, /)\n--\n\n"
     "The GPU decode stage's work on the CPU, for tests: each image of the part\n"
     "decoded whole (libjpeg) and resampled by the kernel's host run into its\n"
     "row of images."},
    {NULL, NULL, 0, NULL},
};
