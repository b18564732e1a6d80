/* fastload._C: reading a compiled transform plan (fastload.transforms.Plan)
 * into the core's fl_image_plan; transform_image(), which runs one on an
 * image in memory; and the calling thread's image worker, which every
 * binding that decodes shares.
 *
 * The plan is read by attribute name from a table, so a field added or
 * renamed on one side fails loudly (AttributeError naming it) instead of
 * shifting every field after it.
 */
#include "bind/fastload.h"

#include "core/image/pipeline.h"
#include "core/image/resample.h"
#include "core/status.h"

#include <math.h>
#include <stddef.h>
#include <string.h>

typedef enum {
    F_INT,
    F_BOOL,
    F_DOUBLE,
    F_INT_PAIR,
    F_DOUBLE_PAIR,
    F_FLOAT3,
    F_DTYPE,
    F_LAYOUT,
    F_ORDER, /* None, or a permutation of 0..3 */
    F_PAD_MODE,
    F_FILL, /* three ints in 0..255, as bytes */
} field_kind;

typedef struct plan_field {
    const char *name;
    field_kind kind;
    size_t offset; /* in fl_image_plan; pairs fill two fields from here on */
    size_t offset2;
} plan_field;

#define FIELD(name, kind, member) {name, kind, offsetof(fl_image_plan, member), 0}
#define PAIR(name, kind, first, second) \
    {name, kind, offsetof(fl_image_plan, first), offsetof(fl_image_plan, second)}

static const plan_field PLAN_FIELDS[] = {
    FIELD("crop", F_INT, crop),
    FIELD("out_h", F_INT, out_h),
    FIELD("out_w", F_INT, out_w),
    PAIR("scale", F_DOUBLE_PAIR, scale_lo, scale_hi),
    PAIR("ratio", F_DOUBLE_PAIR, ratio_lo, ratio_hi),
    FIELD("resize", F_INT, resize),
    PAIR("resize_hw", F_INT_PAIR, resize_h, resize_w),
    FIELD("max_size", F_INT, max_size),
    PAIR("crop_hw", F_INT_PAIR, crop_h, crop_w),
    FIELD("filter", F_INT, filter),
    FIELD("antialias", F_BOOL, antialias),
    FIELD("flip_p", F_DOUBLE, flip_p),
    FIELD("dtype", F_DTYPE, dtype),
    FIELD("layout", F_LAYOUT, layout),
    FIELD("channels", F_INT, channels),
    FIELD("gray_at_decode", F_BOOL, gray_at_decode),
    PAIR("brightness", F_DOUBLE_PAIR, color.lo[FL_BRIGHTNESS], color.hi[FL_BRIGHTNESS]),
    PAIR("contrast", F_DOUBLE_PAIR, color.lo[FL_CONTRAST], color.hi[FL_CONTRAST]),
    PAIR("saturation", F_DOUBLE_PAIR, color.lo[FL_SATURATION], color.hi[FL_SATURATION]),
    PAIR("hue", F_DOUBLE_PAIR, color.lo[FL_HUE], color.hi[FL_HUE]),
    FIELD("jitter_order", F_ORDER, color.order),
    FIELD("gray_p", F_DOUBLE, color.gray_p),
    FIELD("gray_first", F_BOOL, color.gray_first),
    FIELD("color_uint8", F_BOOL, color.uint8),
    FIELD("mul", F_FLOAT3, mul),
    FIELD("add", F_FLOAT3, add),
    /* RandomCrop's padding, GaussianBlur, RandomApply */
    PAIR("pad_left_right", F_INT_PAIR, pad.left, pad.right),
    PAIR("pad_top_bottom", F_INT_PAIR, pad.top, pad.bottom),
    FIELD("pad_if_needed", F_BOOL, pad.if_needed),
    FIELD("pad_once", F_BOOL, pad.once),
    FIELD("pad_mode", F_PAD_MODE, pad.mode),
    FIELD("pad_fill", F_FILL, pad.fill),
    FIELD("jitter_p", F_DOUBLE, color.jitter_p),
    PAIR("blur_kernel", F_INT_PAIR, blur.kernel_w, blur.kernel_h),
    PAIR("blur_sigma", F_DOUBLE_PAIR, blur.sigma_lo, blur.sigma_hi),
    FIELD("blur_p", F_DOUBLE, blur.p),
    FIELD("erase_p", F_DOUBLE, erase.p),
    PAIR("erase_scale", F_DOUBLE_PAIR, erase.scale_lo, erase.scale_hi),
    PAIR("erase_ratio", F_DOUBLE_PAIR, erase.ratio_lo, erase.ratio_hi),
    FIELD("erase_value", F_FLOAT3, erase.value),
    FIELD("erase_random", F_BOOL, erase.random),
    FIELD("augment", F_INT, augment.policy),
    FIELD("augment_num_ops", F_INT, augment.num_ops),
    FIELD("augment_magnitude", F_INT, augment.magnitude),
    FIELD("augment_bins", F_INT, augment.num_bins),
    FIELD("augment_table", F_INT, augment.table),
    FIELD("augment_interpolation", F_INT, augment.interpolation),
    FIELD("augment_fill", F_FLOAT3, augment.fill),
    FIELD("warp", F_INT, warp.kind),
    PAIR("warp_degrees", F_DOUBLE_PAIR, warp.degrees_lo, warp.degrees_hi),
    PAIR("warp_translate", F_DOUBLE_PAIR, warp.translate_x, warp.translate_y),
    PAIR("warp_scale", F_DOUBLE_PAIR, warp.scale_lo, warp.scale_hi),
    PAIR("warp_shear_x", F_DOUBLE_PAIR, warp.shear_x_lo, warp.shear_x_hi),
    PAIR("warp_shear_y", F_DOUBLE_PAIR, warp.shear_y_lo, warp.shear_y_hi),
    FIELD("warp_interpolation", F_INT, warp.interpolation),
    FIELD("warp_fill", F_FLOAT3, warp.fill),
    FIELD("warp_has_center", F_BOOL, warp.center),
    PAIR("warp_center", F_DOUBLE_PAIR, warp.center_x, warp.center_y),
    FIELD("color_pil", F_BOOL, color_pil),
    FIELD("augment_solarize_v2", F_BOOL, augment.solarize_v2),
    FIELD("warp_v2", F_BOOL, warp.v2),
};

static int read_choice(PyObject *obj, const char *const *names, int count, int *out)
{
    for (int i = 0; i < count; i++) {
        if (PyUnicode_Check(obj) && PyUnicode_CompareWithASCIIString(obj, names[i]) == 0) {
            *out = i;
            return 0;
        }
    }
    PyErr_Format(PyExc_ValueError, "unknown value %R", obj);
    return -1;
}

static int read_field(PyObject *value, const plan_field *f, fl_image_plan *p)
{
    static const char *const dtypes[] = {"uint8", "float32", "float16"}; /* FL_DTYPE_* order */
    static const char *const layouts[] = {"CHW", "HWC"};                 /* FL_LAYOUT_* order */
    static const char *const pad_modes[] = {"constant", "edge", "reflect", "symmetric"};
    char *base = (char *)p;
    double v[3], v4[FL_COLOR_OPS];
    switch (f->kind) {
    case F_INT:
        return fl__as_int(value, (int *)(base + f->offset));
    case F_BOOL: {
        int truth = PyObject_IsTrue(value);
        *(int *)(base + f->offset) = truth;
        return truth < 0 ? -1 : 0;
    }
    case F_DOUBLE:
        *(double *)(base + f->offset) = PyFloat_AsDouble(value);
        return PyErr_Occurred() ? -1 : 0;
    case F_INT_PAIR:
        if (fl__read_numbers(value, 2, 1, v) < 0)
            return -1;
        *(int *)(base + f->offset) = (int)v[0];
        *(int *)(base + f->offset2) = (int)v[1];
        return 0;
    case F_DOUBLE_PAIR:
        if (fl__read_numbers(value, 2, 0, v) < 0)
            return -1;
        *(double *)(base + f->offset) = v[0];
        *(double *)(base + f->offset2) = v[1];
        return 0;
    case F_FLOAT3:
        if (fl__read_numbers(value, 3, 0, v) < 0)
            return -1;
        for (int c = 0; c < 3; c++)
            ((float *)(base + f->offset))[c] = (float)v[c];
        return 0;
    case F_DTYPE:
        return read_choice(value, dtypes, 3, (int *)(base + f->offset));
    case F_LAYOUT:
        return read_choice(value, layouts, 2, (int *)(base + f->offset));
    case F_PAD_MODE:
        return read_choice(value, pad_modes, 4, (int *)(base + f->offset));
    case F_FILL:
        if (fl__read_numbers(value, 3, 1, v) < 0)
            return -1;
        for (int c = 0; c < 3; c++) {
            if (v[c] < 0 || v[c] > 255) {
                PyErr_SetString(PyExc_ValueError, "fill values must be in 0..255");
                return -1;
            }
            ((unsigned char *)(base + f->offset))[c] = (unsigned char)v[c];
        }
        return 0;
    case F_ORDER: {
        int *order = (int *)(base + f->offset);
        if (value == Py_None) {
            order[0] = -1;
            return 0;
        }
        if (fl__read_numbers(value, FL_COLOR_OPS, 1, v4) < 0)
            return -1;
        int seen = 0;
        for (int i = 0; i < FL_COLOR_OPS; i++) {
            if (v4[i] < 0 || v4[i] >= FL_COLOR_OPS || (seen & (1 << (int)v4[i]))) {
                PyErr_SetString(PyExc_ValueError, "not a permutation of 0..3");
                return -1;
            }
            seen |= 1 << (int)v4[i];
            order[i] = (int)v4[i];
        }
        return 0;
    }
    }
    return -1;
}

/* Ranges the random crop, the padding and the blur rely on (the Python
 * classes check them with torchvision's messages). */
static int check_crop_and_blur(const fl_image_plan *p)
{
    enum { MOST = 1 << 16 }; /* padded sizes stay far from int overflow */
    const fl_pad_plan *pad = &p->pad;
    const char *bad = NULL;
    if (pad->left < 0 || pad->top < 0 || pad->right < 0 || pad->bottom < 0 ||
        pad->left > MOST || pad->top > MOST || pad->right > MOST || pad->bottom > MOST)
        bad = "padding";
    else if (p->crop == FL_CROP_RANDOM &&
             (p->crop_w < 1 || p->crop_h < 1 || p->crop_w > MOST || p->crop_h > MOST))
        bad = "random crop size";
    else if (p->crop == FL_CROP_RANDOM && (p->resize > 0 || p->resize_w > 0) &&
             (pad->left || pad->top || pad->right || pad->bottom || pad->if_needed))
        bad = "padding after a resize";
    else if (!(p->color.jitter_p >= 0.0 && p->color.jitter_p <= 1.0))
        bad = "jitter_p";
    else if (p->color.uint8 && (p->color_pil || p->blur.kernel_w || p->blur.kernel_h))
        bad = "color_uint8 (with Pillow's colour ops or a blur)";
    else if (!(p->blur.p >= 0.0 && p->blur.p <= 1.0))
        bad = "blur_p";
    else if (p->blur.kernel_w != 0 || p->blur.kernel_h != 0) {
        const fl_blur_plan *b = &p->blur;
        if (b->kernel_w < 1 || b->kernel_h < 1 || b->kernel_w % 2 == 0 || b->kernel_h % 2 == 0 ||
            b->kernel_w > FL_BLUR_MAX_KERNEL || b->kernel_h > FL_BLUR_MAX_KERNEL)
            bad = "blur_kernel";
        else if (!(b->sigma_lo > 0.0 && b->sigma_lo <= b->sigma_hi && isfinite(b->sigma_hi)))
            bad = "blur_sigma";
    }
    if (bad) {
        PyErr_Format(PyExc_ValueError, "malformed transform plan: %s", bad);
        return -1;
    }
    return 0;
}

/* What is wrong with an augmentation policy's fields, or NULL (the Python
 * classes check them first, with torchvision's messages). */
static const char *augment_plan_error(const fl_augment_plan *a)
{
    if (a->policy < FL_AUGMENT_NONE || a->policy > FL_AUGMENT_AUTO)
        return "augment";
    if (a->policy == FL_AUGMENT_NONE)
        return NULL;
    if (a->policy == FL_AUGMENT_RAND && (a->num_ops < 0 || a->num_ops > FL_AUGMENT_MAX_OPS))
        return "augment_num_ops";
    if ((a->policy == FL_AUGMENT_RAND || a->policy == FL_AUGMENT_TRIVIAL) && a->num_bins < 2)
        return "augment_bins";
    if (a->policy == FL_AUGMENT_RAND && (a->magnitude < 0 || a->magnitude >= a->num_bins))
        return "augment_magnitude";
    if (a->table < FL_AUTO_IMAGENET || a->table > FL_AUTO_SVHN)
        return "augment_table";
    if (a->interpolation != FL_WARP_NEAREST && a->interpolation != FL_WARP_BILINEAR)
        return "augment_interpolation";
    for (int c = 0; c < 3; c++)
        if (!(a->fill[c] >= 0.0f && a->fill[c] < 256.0f))
            return "augment_fill";
    return NULL;
}

/* Whether lo <= hi, both finite. */
static int is_range(double lo, double hi)
{
    return isfinite(lo) && isfinite(hi) && lo <= hi;
}

/* What is wrong with a rotation / affine's fields, or NULL (the Python
 * classes check them first, with torchvision's messages). */
static const char *warp_plan_error(const fl_warp_plan *a)
{
    if (a->kind < FL_RANDOM_WARP_NONE || a->kind > FL_RANDOM_AFFINE)
        return "warp";
    if (a->kind == FL_RANDOM_WARP_NONE)
        return NULL;
    if (!is_range(a->degrees_lo, a->degrees_hi))
        return "warp_degrees";
    if (!(a->translate_x >= 0.0 && a->translate_x <= 1.0 && a->translate_y >= 0.0 &&
          a->translate_y <= 1.0))
        return "warp_translate";
    if (!is_range(a->scale_lo, a->scale_hi) || !(a->scale_lo > 0.0))
        return "warp_scale";
    if (!is_range(a->shear_x_lo, a->shear_x_hi))
        return "warp_shear_x";
    if (!is_range(a->shear_y_lo, a->shear_y_hi))
        return "warp_shear_y";
    if (a->interpolation != FL_WARP_NEAREST && a->interpolation != FL_WARP_BILINEAR)
        return "warp_interpolation";
    for (int c = 0; c < 3; c++)
        if (!(a->fill[c] >= 0.0f && a->fill[c] < 256.0f))
            return "warp_fill";
    /* a centre within 2**24 pixels keeps Image.rotate's positions defined */
    if (a->center && !(fabs(a->center_x) <= 0x1p24 && fabs(a->center_y) <= 0x1p24))
        return "warp_center";
    return NULL;
}

int fl__parse_plan(PyObject *plan, fl_image_plan *out)
{
    fl_image_plan p = {0};
    for (size_t i = 0; i < sizeof PLAN_FIELDS / sizeof PLAN_FIELDS[0]; i++) {
        const plan_field *f = &PLAN_FIELDS[i];
        PyObject *value = PyObject_GetAttrString(plan, f->name);
        if (!value)
            return -1;
        int rc = read_field(value, f, &p);
        Py_DECREF(value);
        if (rc < 0) {
            PyObject *cause = fl__take_exception();
            PyErr_Format(PyExc_ValueError, "malformed transform plan: field %s: %S", f->name,
                         cause ? cause : Py_None);
            Py_XDECREF(cause);
            return -1;
        }
    }
    if (p.crop < FL_CROP_NONE || p.crop > FL_CROP_RANDOM || p.filter < FL_FILTER_NEAREST ||
        p.filter > FL_FILTER_BICUBIC || p.out_w < 0 || p.out_h < 0) {
        PyErr_SetString(PyExc_ValueError, "malformed transform plan");
        return -1;
    }
    /* The C side relies on these ranges (factors >= 0, hue in
     * [-0.5, 0.5]); the Python classes check them with torchvision's
     * messages. */
    for (int op = 0; op < FL_COLOR_OPS; op++) {
        double lo = p.color.lo[op], hi = p.color.hi[op];
        double least = op == FL_HUE ? -0.5 : 0.0, most = op == FL_HUE ? 0.5 : HUGE_VAL;
        if (!(least <= lo && lo <= hi && hi <= most) || !isfinite(hi)) {
            PyErr_SetString(PyExc_ValueError, "malformed transform plan: colour factor range");
            return -1;
        }
    }
    if (!(p.color.gray_p >= 0.0 && p.color.gray_p <= 1.0)) {
        PyErr_SetString(PyExc_ValueError, "malformed transform plan: gray_p");
        return -1;
    }
    if (p.channels != 3 && !(p.channels == 1 && (p.color.gray_p == 1.0 || p.gray_at_decode))) {
        PyErr_SetString(PyExc_ValueError, "malformed transform plan: channels (1 only after "
                                          "a grayscale conversion)");
        return -1;
    }
    if (check_crop_and_blur(&p) < 0)
        return -1;
    const fl_erase_plan *e = &p.erase;
    if (!(e->p >= 0.0 && e->p <= 1.0) ||
        (e->p > 0.0 && !(0.0 <= e->scale_lo && e->scale_lo <= e->scale_hi &&
                         e->scale_hi <= 1.0 && 0.0 < e->ratio_lo &&
                         e->ratio_lo <= e->ratio_hi && isfinite(e->ratio_hi)))) {
        PyErr_SetString(PyExc_ValueError, "malformed transform plan: erase");
        return -1;
    }
    if (augment_plan_error(&p.augment)) {
        PyErr_Format(PyExc_ValueError, "malformed transform plan: %s",
                     augment_plan_error(&p.augment));
        return -1;
    }
    if (warp_plan_error(&p.warp)) {
        PyErr_Format(PyExc_ValueError, "malformed transform plan: %s", warp_plan_error(&p.warp));
        return -1;
    }
    fl_color_plan_from_ranges(&p.color);
    *out = p;
    return 0;
}

/* ------------------------------------------------- transforms on an image */

/* A worker that cannot be made is not a sample's fault: no file is named. */
PyObject *fl__image_worker_error(int status, const char *msg)
{
    return PyObject_CallFunction(status == FL_ERR_NOMEM ? PyExc_MemoryError : PyExc_RuntimeError,
                                 "N", PyUnicode_DecodeUTF8(msg, (Py_ssize_t)strlen(msg),
                                                           "replace"));
}

fl_image_worker *fl__image_worker(void)
{
    fl_image_worker *w;
    char msg[FL__MSG_SIZE];
    int rc = fl_image_worker_get(&w, msg, sizeof msg);
    if (rc != FL_OK) {
        PyObject *exc = fl__image_worker_error(rc, msg);
        if (exc)
            fl__raise_exception(exc);
        return NULL;
    }
    return w;
}

PyArray_Descr *fl__plan_descr(const fl_image_plan *plan)
{
    int type = plan->dtype == FL_DTYPE_FLOAT32   ? NPY_FLOAT32
               : plan->dtype == FL_DTYPE_FLOAT16 ? NPY_FLOAT16
                                                 : NPY_UINT8;
    return PyArray_DescrFromType(type);
}

void fl__image_dims(const fl_image_plan *plan, int width, int height, npy_intp *dims)
{
    if (plan->layout == FL_LAYOUT_CHW) {
        dims[0] = plan->channels, dims[1] = height, dims[2] = width;
    } else {
        dims[0] = height, dims[1] = width, dims[2] = plan->channels;
    }
}

PyObject *fl__transform_image(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "transform_image(plan, image, seed, max_pixels) "
                                         "takes 4 arguments");
        return NULL;
    }
    fl_image_plan plan;
    if (fl__parse_plan(args[0], &plan) < 0)
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
    fl_image_worker *w = fl__image_worker();
    if (!w)
        return NULL;
    const unsigned char *rgb = PyArray_DATA(image);
    int width = (int)PyArray_DIM(image, 1), height = (int)PyArray_DIM(image, 0);
    size_t stride = (size_t)PyArray_STRIDE(image, 0);
    char msg[FL__MSG_SIZE];
    fl_sample_geometry g;
    if (width < 1 || height < 1) {
        PyErr_SetString(PyExc_ValueError, "transform_image: the image is empty");
        return NULL;
    }
    int rc = fl_pipeline_pixels(w, &plan, &key, rgb, width, height, stride, NULL, &g, msg,
                                sizeof msg);
    if (rc != FL_OK) {
        PyErr_Format(PyExc_ValueError, "cannot transform the image: %s", msg);
        return NULL;
    }
    npy_intp dims[3];
    fl__image_dims(&plan, g.out_w, g.out_h, dims);
    PyObject *out = PyArray_NewFromDescr(&PyArray_Type, fl__plan_descr(&plan), 3, dims, NULL, NULL,
                                         0, NULL);
    if (!out)
        return NULL;
    void *dst = PyArray_DATA((PyArrayObject *)out);
    /* `image` is held by the caller for the call. */
    Py_BEGIN_ALLOW_THREADS
    rc = fl_pipeline_pixels(w, &plan, &key, rgb, width, height, stride, dst, &g, msg, sizeof msg);
    Py_END_ALLOW_THREADS
    if (rc != FL_OK) {
        Py_DECREF(out);
        PyErr_Format(PyExc_ValueError, "cannot transform the image: %s", msg);
        return NULL;
    }
    return out;
}
