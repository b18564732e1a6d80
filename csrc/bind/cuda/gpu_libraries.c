/* fastload._C: the GPU decode stage's libraries (nvJPEG and NVRTC, opened
 * at run time by csrc/core/cuda/nvjpeg.c and nvrtc.c): what was loaded, and
 * two probes that drive them end to end (a batched decode into device
 * buffers read back; a compiled kernel launched), for the tests.  The
 * candidate folders come from fastload/cuda.py (the nvidia-* wheels, the
 * CUDA toolkit); the first call of each library decides which is loaded.
 */
#include "bind/fastload.h"

#include <limits.h>
#include <string.h>

#include "core/cuda/nvjpeg.h"
#include "core/cuda/nvrtc.h"

/* ---- Arguments ---------------------------------------------------------- */

/* A NULL-terminated array over the UTF-8 of `folders` (a list or tuple of
 * str, or None: no folders).  The strings belong to `folders`, which must
 * outlive the array; free the array with PyMem_Free.  Returns 0 or -1 with
 * an exception set. */
static int folder_list(PyObject *folders, const char ***out)
{
    *out = NULL;
    if (folders == Py_None)
        return 0;
    if (!PyList_Check(folders) && !PyTuple_Check(folders)) {
        PyErr_SetString(PyExc_TypeError, "folders must be a list of str or None");
        return -1;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(folders);
    const char **list = PyMem_Calloc((size_t)n + 1, sizeof *list);
    if (!list) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(folders, i);
        if (!PyUnicode_Check(item) || !(list[i] = PyUnicode_AsUTF8(item))) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "folders must be a list of str or None");
            PyMem_Free(list);
            return -1;
        }
    }
    *out = list;
    return 0;
}

/* An int argument; -1 with an exception (check PyErr_Occurred). */
static int as_int(PyObject *value)
{
    long v = PyLong_AsLong(value);
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (v < INT_MIN || v > INT_MAX) {
        PyErr_SetString(PyExc_OverflowError, "argument out of int range");
        return -1;
    }
    return (int)v;
}

const fl_nvjpeg *fl__open_nvjpeg(PyObject *folders, const char **why)
{
    const char **list;
    if (folder_list(folders, &list) < 0)
        return NULL;
    const fl_nvjpeg *lib;
    Py_BEGIN_ALLOW_THREADS /* dlopen of a large library */
    lib = fl_nvjpeg_get(list, why);
    Py_END_ALLOW_THREADS
    PyMem_Free(list);
    return lib;
}

const fl_nvrtc *fl__open_nvrtc(PyObject *folders, const char **why)
{
    const char **list;
    if (folder_list(folders, &list) < 0)
        return NULL;
    const fl_nvrtc *lib;
    Py_BEGIN_ALLOW_THREADS
    lib = fl_nvrtc_get(list, why);
    Py_END_ALLOW_THREADS
    PyMem_Free(list);
    return lib;
}

static const char *backend_name(fl_nvjpeg_backend backend)
{
    return backend == FL_NVJPEG_BACKEND_HARDWARE ? "hardware" : "default";
}

/* ---- nvjpeg_info, nvrtc_info --------------------------------------------- */

static PyObject *nvjpeg_info(PyObject *module, PyObject *folders)
{
    (void)module;
    const char *why = NULL;
    const fl_nvjpeg *lib = fl__open_nvjpeg(folders, &why);
    if (!lib)
        return PyErr_Occurred() ? NULL
                                : Py_BuildValue("{sOszsOss}", "available", Py_False, "path",
                                                NULL, "version", Py_None, "error", why);
    return Py_BuildValue("{sOsss(iii)sO}", "available", Py_True, "path", lib->path, "version",
                         lib->version[0], lib->version[1], lib->version[2], "error", Py_None);
}

static PyObject *nvrtc_info(PyObject *module, PyObject *folders)
{
    (void)module;
    const char *why = NULL;
    const fl_nvrtc *lib = fl__open_nvrtc(folders, &why);
    if (!lib)
        return PyErr_Occurred() ? NULL
                                : Py_BuildValue("{sOszsOss}", "available", Py_False, "path",
                                                NULL, "version", Py_None, "error", why);
    return Py_BuildValue("{sOsss(ii)sO}", "available", Py_True, "path", lib->path, "version",
                         lib->version_major, lib->version_minor, "error", Py_None);
}

/* ---- nvjpeg_decode_probe ---------------------------------------------- */

#define MAX_PROBE_IMAGES 64

/* A stream-ordered device allocator (nvJPEG's V2 interface) over
 * cuMemAlloc, counting what nvJPEG asked of it: the shape the decode
 * stage's pool takes.  One thread at a time (the probe's). */
typedef struct {
    const fl_cuda *cuda;
    long long calls;      /* successful allocations */
    long long live_bytes; /* allocated, not yet freed */
} probe_allocator;

static int probe_malloc(void *ctx, void **ptr, size_t bytes, fl_cu_stream stream)
{
    (void)stream;
    probe_allocator *a = ctx;
    fl_cu_deviceptr p = 0;
    if (a->cuda->mem_alloc(&p, bytes ? bytes : 1) != 0)
        return 1;
    *ptr = (void *)(size_t)p;
    a->calls++;
    a->live_bytes += (long long)bytes;
    return 0;
}

static int probe_free(void *ctx, void *ptr, size_t bytes, fl_cu_stream stream)
{
    (void)stream;
    probe_allocator *a = ctx;
    if (a->cuda->mem_free((fl_cu_deviceptr)(size_t)ptr) != 0)
        return 1;
    a->live_bytes -= (long long)bytes;
    return 0;
}

/* Everything the GIL-free part of the decode probe uses, released at one
 * place. */
typedef struct {
    const fl_cuda *cuda;
    const fl_nvjpeg *lib;
    int device;
    int use_hardware;
    int decode;
    int use_allocator;
    int use_rois;
    int rois[MAX_PROBE_IMAGES][4]; /* x, y, width, height when use_rois */
    probe_allocator allocator;
    int count;
    const unsigned char *data[MAX_PROBE_IMAGES];
    size_t lengths[MAX_PROBE_IMAGES];
    int widths[MAX_PROBE_IMAGES], heights[MAX_PROBE_IMAGES];
    int supported[MAX_PROBE_IMAGES];
    fl_cu_deviceptr buffers[MAX_PROBE_IMAGES];
    unsigned char *host[MAX_PROBE_IMAGES]; /* the result arrays' data */
    fl_nvjpeg_backend backend;
    char error[512];
} decode_job;

/* Stage 1, without the GIL: a decoder, the images' sizes and whether the
 * backend takes them.  Returns 0 or -1 with job->error. */
static int probe_sizes(decode_job *job, fl_nvjpeg_decoder **decoder)
{
    fl_nvjpeg_dev_allocator_v2 dev = {probe_malloc, probe_free, &job->allocator};
    job->allocator.cuda = job->cuda;
    fl_nvjpeg_status rc =
        fl_nvjpeg_decoder_create(job->lib, job->use_hardware, job->use_allocator ? &dev : NULL,
                                 NULL, decoder, job->error, sizeof job->error);
    if (rc != 0)
        return -1;
    job->backend = (*decoder)->backend;
    for (int i = 0; i < job->count; i++) {
        int components = 0, widths[4], heights[4];
        fl_nvjpeg_subsampling subsampling;
        const char *call = "nvjpegGetImageInfo";
        rc = job->lib->get_image_info((*decoder)->handle, job->data[i], job->lengths[i],
                                      &components, &subsampling, widths, heights);
        if (rc == 0) {
            call = "nvjpegJpegStreamParse";
            rc = fl_nvjpeg_decoder_supported(*decoder, job->data[i], job->lengths[i],
                                             &job->supported[i]);
        }
        if (rc != 0) {
            snprintf(job->error, sizeof job->error, "image %d: %s failed: %s (%d)", i, call,
                     fl_nvjpeg_status_string(rc), rc);
            return -1;
        }
        job->widths[i] = widths[0];
        job->heights[i] = heights[0];
        if (job->use_rois) { /* the output is the region (0: the whole width or height) */
            const int *roi = job->rois[i];
            if (roi[0] < 0 || roi[1] < 0 || roi[2] < 0 || roi[3] < 0 ||
                roi[0] + (roi[2] ? roi[2] : widths[0]) > widths[0] ||
                roi[1] + (roi[3] ? roi[3] : heights[0]) > heights[0]) {
                snprintf(job->error, sizeof job->error, "image %d: region outside the image", i);
                return -1;
            }
            job->widths[i] = roi[2] ? roi[2] : widths[0];
            job->heights[i] = roi[3] ? roi[3] : heights[0];
        }
    }
    return 0;
}

/* Stage 2, without the GIL: device buffers, the batched decode, the copies
 * back into job->host.  Returns 0 or -1 with job->error. */
static int probe_decode(decode_job *job, fl_nvjpeg_decoder *decoder)
{
    const fl_cuda *cuda = job->cuda;
    fl_nvjpeg_image images[MAX_PROBE_IMAGES];
    memset(images, 0, sizeof images);
    for (int i = 0; i < job->count; i++) {
        size_t bytes = (size_t)job->widths[i] * (size_t)job->heights[i] * 3;
        fl_cu_result rc = cuda->mem_alloc(&job->buffers[i], bytes ? bytes : 1);
        if (rc == 0)
            rc = cuda->memset_d8_async(job->buffers[i], 0, bytes, NULL);
        if (rc != 0) {
            job->buffers[i] = 0;
            snprintf(job->error, sizeof job->error, "cuMemAlloc for image %d failed: %s", i,
                     fl_cuda_error_string(cuda, rc));
            return -1;
        }
        images[i].channel[0] = (unsigned char *)(size_t)job->buffers[i];
        images[i].pitch[0] = (size_t)job->widths[i] * 3;
    }
    fl_nvjpeg_status status =
        job->use_rois
            ? fl_nvjpeg_decode_batch_roi(decoder, job->count, job->data, job->lengths,
                                         (const int(*)[4])job->rois, images, NULL, job->error,
                                         sizeof job->error)
            : fl_nvjpeg_decode_batch(decoder, job->count, job->data, job->lengths, images, NULL,
                                     job->error, sizeof job->error);
    if (status != 0)
        return -1;
    fl_cu_result rc = 0;
    for (int i = 0; i < job->count && rc == 0; i++)
        rc = cuda->memcpy_dtoh_async(job->host[i], job->buffers[i],
                                     (size_t)job->widths[i] * (size_t)job->heights[i] * 3, NULL);
    if (rc == 0)
        rc = cuda->stream_synchronize(NULL);
    if (rc != 0) {
        snprintf(job->error, sizeof job->error, "copying the decoded images back failed: %s",
                 fl_cuda_error_string(cuda, rc));
        return -1;
    }
    return 0;
}

static void free_buffers(decode_job *job)
{
    for (int i = 0; i < job->count; i++)
        if (job->buffers[i]) {
            job->cuda->mem_free(job->buffers[i]);
            job->buffers[i] = 0;
        }
}

static PyObject *nvjpeg_decode_probe(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "nvjpeg_decode_probe(folders, device, jpegs, "
                                         "use_hardware, decode, use_allocator, rois)");
        return NULL;
    }
    decode_job *job = NULL;
    PyObject *jpegs = NULL, *arrays = NULL, *supported = NULL, *result = NULL;
    fl_nvjpeg_decoder *decoder = NULL;
    int entered = 0, failed = 0;
    const char *why = NULL;

    job = PyMem_Calloc(1, sizeof *job);
    if (!job) {
        PyErr_NoMemory();
        goto bailout;
    }
    job->device = as_int(args[1]);
    job->use_hardware = PyObject_IsTrue(args[3]);
    job->decode = PyObject_IsTrue(args[4]);
    job->use_allocator = PyObject_IsTrue(args[5]);
    if (PyErr_Occurred() || job->use_hardware < 0 || job->decode < 0 || job->use_allocator < 0)
        goto bailout;
    jpegs = PySequence_Tuple(args[2]); /* holds the bytes while the GIL is released */
    if (!jpegs)
        goto bailout;
    job->count = (int)Py_MIN(PyTuple_GET_SIZE(jpegs), MAX_PROBE_IMAGES + 1);
    if (job->count == 0 || job->count > MAX_PROBE_IMAGES) {
        PyErr_Format(PyExc_ValueError, "between 1 and %d JPEGs", MAX_PROBE_IMAGES);
        goto bailout;
    }
    for (int i = 0; i < job->count; i++) {
        PyObject *item = PyTuple_GET_ITEM(jpegs, i);
        if (!PyBytes_Check(item)) {
            PyErr_SetString(PyExc_TypeError, "jpegs must be bytes");
            goto bailout;
        }
        job->data[i] = (const unsigned char *)PyBytes_AS_STRING(item);
        job->lengths[i] = (size_t)PyBytes_GET_SIZE(item);
    }
    if (args[6] != Py_None) {
        job->use_rois = 1;
        if (!PyList_Check(args[6]) || PyList_GET_SIZE(args[6]) != job->count) {
            PyErr_SetString(PyExc_TypeError, "rois: a list of (x, y, width, height), one an image");
            goto bailout;
        }
        for (int i = 0; i < job->count; i++) {
            PyObject *roi = PyList_GET_ITEM(args[6], i);
            if (!PyArg_ParseTuple(roi, "iiii;rois: (x, y, width, height) each", &job->rois[i][0],
                                  &job->rois[i][1], &job->rois[i][2], &job->rois[i][3]))
                goto bailout;
        }
    }
    if (!(job->cuda = fl__cuda_driver_or_raise()))
        goto bailout;
    const char *missing = fl_cuda_kernels_missing(job->cuda);
    if (missing) {
        PyErr_Format(PyExc_RuntimeError, "the CUDA driver has no %s", missing);
        goto bailout;
    }
    if (!(job->lib = fl__open_nvjpeg(args[0], &why))) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_RuntimeError, why);
        goto bailout;
    }
    fl_cu_result rc;
    Py_BEGIN_ALLOW_THREADS
    rc = fl_cuda_enter(job->cuda, job->device);
    if (rc == 0) {
        entered = 1;
        failed = probe_sizes(job, &decoder);
    }
    Py_END_ALLOW_THREADS
    if (rc != 0) {
        fl__cuda_raise(job->cuda, rc, "entering the context", job->device);
        goto bailout;
    }
    if (failed) {
        PyErr_SetString(PyExc_RuntimeError, job->error);
        goto bailout;
    }
    if (!(supported = PyList_New(job->count)))
        goto bailout;
    for (int i = 0; i < job->count; i++)
        PyList_SET_ITEM(supported, i, PyBool_FromLong(job->supported[i]));
    if (job->decode) {
        if (!(arrays = PyList_New(job->count)))
            goto bailout;
        for (int i = 0; i < job->count; i++) {
            npy_intp shape[3] = {job->heights[i], job->widths[i], 3};
            PyObject *a = PyArray_SimpleNew(3, shape, NPY_UINT8);
            if (!a)
                goto bailout;
            PyList_SET_ITEM(arrays, i, a);
            job->host[i] = PyArray_DATA((PyArrayObject *)a);
        }
        Py_BEGIN_ALLOW_THREADS
        failed = probe_decode(job, decoder);
        Py_END_ALLOW_THREADS
        if (failed) {
            PyErr_SetString(PyExc_RuntimeError, job->error);
            goto bailout;
        }
    }
    /* The decoder goes first, so the allocator's account is complete. */
    Py_BEGIN_ALLOW_THREADS
    fl_nvjpeg_decoder_destroy(decoder);
    Py_END_ALLOW_THREADS
    decoder = NULL;
    result = Py_BuildValue("{sssOsOs(LL)}", "backend", backend_name(job->backend), "supported",
                           supported, "images", arrays ? arrays : Py_None, "allocator",
                           job->allocator.calls, job->allocator.live_bytes);
bailout:
    if (job && entered) {
        Py_BEGIN_ALLOW_THREADS
        free_buffers(job);
        fl_nvjpeg_decoder_destroy(decoder);
        fl_cuda_leave(job->cuda);
        Py_END_ALLOW_THREADS
    }
    PyMem_Free(job);
    Py_XDECREF(jpegs);
    Py_XDECREF(arrays);
    Py_XDECREF(supported);
    return result;
}

/* ---- nvrtc_launch_probe ------------------------------------------------ */

static PyObject *nvrtc_launch_probe(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError,
                        "nvrtc_launch_probe(folders, device, source, kernel, n, arg)");
        return NULL;
    }
    int device = as_int(args[1]);
    int n = as_int(args[4]);
    int arg = as_int(args[5]);
    const char *source = PyUnicode_AsUTF8(args[2]);
    const char *kernel = PyUnicode_AsUTF8(args[3]);
    if (PyErr_Occurred() || !source || !kernel)
        return NULL;
    if (n <= 0) {
        PyErr_SetString(PyExc_ValueError, "n must be positive");
        return NULL;
    }
    const fl_cuda *cuda = fl__cuda_driver_or_raise();
    if (!cuda)
        return NULL;
    const char *why = NULL;
    const fl_nvrtc *lib = fl__open_nvrtc(args[0], &why);
    if (!lib) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_RuntimeError, why);
        return NULL;
    }
    const char *missing = fl_cuda_kernels_missing(cuda);
    if (missing) {
        PyErr_Format(PyExc_RuntimeError, "the CUDA driver has no %s", missing);
        return NULL;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, n);
    if (!out)
        return NULL;
    char *host = PyBytes_AS_STRING(out);
    char *error = NULL;
    const char *failed_call = NULL;
    fl_cu_result rc;
    int status = 0;
    Py_BEGIN_ALLOW_THREADS
    rc = fl_cuda_enter(cuda, device);
    if (rc != 0) {
        failed_call = "entering the context";
    } else {
        fl_cu_function function = NULL;
        fl_cu_deviceptr buffer = 0;
        status = fl_nvrtc_kernel(cuda, lib, device, source, "fastload_probe.cu", kernel,
                                 &function, &error);
        if (status == 0 && (rc = cuda->mem_alloc(&buffer, (size_t)n)) != 0)
            failed_call = "cuMemAlloc";
        if (status == 0 && rc == 0) {
            void *params[] = {&buffer, &n, &arg};
            unsigned int block = 128, grid = (unsigned int)((n + 127) / 128);
            rc = cuda->launch_kernel(function, grid, 1, 1, block, 1, 1, 0, NULL, params, NULL);
            failed_call = "cuLaunchKernel";
            if (rc == 0) {
                rc = cuda->memcpy_dtoh_async(host, buffer, (size_t)n, NULL);
                failed_call = "cuMemcpyDtoHAsync";
            }
            if (rc == 0) {
                rc = cuda->stream_synchronize(NULL);
                failed_call = "cuStreamSynchronize";
            }
            cuda->mem_free(buffer);
        }
        fl_cuda_leave(cuda);
    }
    Py_END_ALLOW_THREADS
    if (status != 0) {
        PyErr_SetString(PyExc_RuntimeError, error ? error : "fl_nvrtc_kernel: out of memory");
        free(error);
        Py_DECREF(out);
        return NULL;
    }
    if (rc != 0) {
        fl__cuda_raise(cuda, rc, failed_call, device);
        Py_DECREF(out);
        return NULL;
    }
    return out;
}

PyMethodDef fl__gpu_library_methods[] = {
    {"nvjpeg_info", (PyCFunction)nvjpeg_info, METH_O,
     "nvjpeg_info(folders, /)\n--\n\n"
     "Opens nvJPEG once per process ($FASTLOAD_LIBNVJPEG, a copy already loaded,\n"
     "libnvjpeg in each of `folders` (list of str or None), the sonames) and\n"
     "returns {'available', 'path', 'version': (major, minor, patch), 'error'}."},
    {"nvrtc_info", (PyCFunction)nvrtc_info, METH_O,
     "nvrtc_info(folders, /)\n--\n\n"
     "Opens NVRTC once per process (as nvjpeg_info) and returns {'available',\n"
     "'path', 'version': (major, minor), 'error'}."},
    {"nvjpeg_decode_probe", (PyCFunction)(void (*)(void))nvjpeg_decode_probe, METH_FASTCALL,
     "nvjpeg_decode_probe(folders, device, jpegs, use_hardware, decode, use_allocator,\n"
     "                    rois, /)\n--\n\n"
     "For tests: makes an nvJPEG decoder on cuda:`device` (the hardware backend\n"
     "first when `use_hardware`; with `use_allocator`, nvjpegCreateExV2 with a\n"
     "counting device allocator), asks whether it takes each JPEG, and with\n"
     "`decode` decodes them all in one batch into device buffers copied back\n"
     "(only rois[i] = (x, y, width, height) of each, through nvjpegDecodeBatchedEx,\n"
     "when `rois` is not None).  Returns {'backend': 'hardware' or 'default',\n"
     "'supported': [bool], 'images': [HxWx3 uint8 arrays] or None,\n"
     "'allocator': (allocations, bytes still held after the decoder is gone)};\n"
     "RuntimeError naming the call and status on failure."},
    {"nvrtc_launch_probe", (PyCFunction)(void (*)(void))nvrtc_launch_probe, METH_FASTCALL,
     "nvrtc_launch_probe(folders, device, source, kernel, n, arg, /)\n--\n\n"
     "For tests: compiles `source` with NVRTC for cuda:`device` (once per\n"
     "process), launches kernel(unsigned char *dst, int n, int arg) over n\n"
     "threads in blocks of 128 on an n-byte device buffer and returns it as\n"
     "bytes; RuntimeError with the compile log or the driver's error."},
    {NULL, NULL, 0, NULL},
};
