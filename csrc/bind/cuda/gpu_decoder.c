/* fastload._C: GpuDecoder — the GPU decode stage of one device
 * (csrc/core/cuda/gpu_decode.h), made once by the upload stage and run by
 * CudaStream.upload on each batch's GPU part.
 *
 * GpuDecoder(device, plan, exact, max_pixels, batch_size, entries, pixels,
 * use_hardware, nvjpeg_folders, nvrtc_folders), for the parts of batches of
 * batch_size from a source of gpu_split budgets `entries` and `pixels` per
 * image (the encoded bytes stay on the host), opens libnvjpeg and libnvrtc
 * (fastload.cuda finds the folders), compiles the resample kernel, makes
 * the nvJPEG decoder and allocates the device pool.  Any failure is a
 * RuntimeError saying which part (no library, no kernel support in the
 * driver, a compile error with NVRTC's log), so the loader can report why
 * decode_device="cuda" is not available.
 */
#include "bind/fastload.h"

#include "core/cuda/gpu_decode.h"
#include "core/status.h"

static PyObject *GpuDecoder_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"device",         "plan",          "exact",
                             "max_pixels",     "batch_size",    "entries",
                             "pixels",         "use_hardware",  "nvjpeg_folders",
                             "nvrtc_folders",  NULL};
    int device, exact, use_hardware;
    unsigned long long max_pixels, batch_size, entries, pixels;
    PyObject *plan_obj, *nvjpeg_folders, *nvrtc_folders;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "iOpKKKKpOO:GpuDecoder", kwlist, &device,
                                     &plan_obj, &exact, &max_pixels, &batch_size, &entries,
                                     &pixels, &use_hardware, &nvjpeg_folders, &nvrtc_folders))
        return NULL;
    /* The device buffers hold the largest part a source with these budgets
     * per image (gpu_split) makes for batches of batch_size. */
    fl_gpu_batch_shape shape = {.capacity = (uint32_t)batch_size};
    int overflow = batch_size == 0 || batch_size > UINT32_MAX ||
                   (entries && batch_size > UINT64_MAX / entries) ||
                   (pixels && batch_size > UINT64_MAX / pixels);
    if (!overflow) {
        shape.first_capacity = shape.weight_capacity = entries * batch_size;
        shape.pixel_capacity = pixels * batch_size;
    }
    size_t table_bytes = overflow ? 0 : fl_gpu_batch_table_bytes(&shape);
    if (table_bytes == 0) {
        PyErr_SetString(PyExc_ValueError, "GpuDecoder: the batch's budgets are out of range");
        return NULL;
    }
    fl_image_plan plan;
    if (fl__parse_plan(plan_obj, &plan) < 0)
        return NULL;
    plan.exact = exact;
    plan.max_pixels = max_pixels ? max_pixels : UINT64_MAX;
    const fl_cuda *cuda = fl__cuda_driver_or_raise();
    if (!cuda)
        return NULL;
    const char *why = NULL;
    const fl_nvjpeg *nvjpeg = fl__open_nvjpeg(nvjpeg_folders, &why);
    if (!nvjpeg) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_RuntimeError, "GPU decoding needs nvJPEG: %s", why);
        return NULL;
    }
    const fl_nvrtc *nvrtc = fl__open_nvrtc(nvrtc_folders, &why);
    if (!nvrtc) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_RuntimeError, "GPU decoding needs NVRTC: %s", why);
        return NULL;
    }
    GpuDecoderObject *self = (GpuDecoderObject *)type->tp_alloc(type, 0);
    if (!self)
        return NULL;
    self->device = device;
    char error[1024] = "";
    int rc;
    fl_cu_result entered;
    Py_BEGIN_ALLOW_THREADS /* compiling the kernel, creating the decoder */
    entered = fl_cuda_enter(cuda, device);
    rc = entered != 0 ? FL_ERR_IO
                      : fl_gpu_decode_new(cuda, nvjpeg, nvrtc, device, &plan,
                                          shape.pixel_capacity, shape.capacity, table_bytes,
                                          use_hardware, &self->stage, error, sizeof error);
    if (entered == 0)
        fl_cuda_leave(cuda);
    Py_END_ALLOW_THREADS
    if (entered != 0) {
        fl__cuda_raise(cuda, entered, "making the GPU decode stage", device);
        Py_DECREF(self);
        return NULL;
    }
    if (rc != FL_OK) {
        PyErr_Format(rc == FL_ERR_NOMEM ? PyExc_MemoryError : PyExc_RuntimeError,
                     "GPU decoding on cuda:%d is not available: %s", device, error);
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static void GpuDecoder_dealloc(GpuDecoderObject *self)
{
    PyTypeObject *type = Py_TYPE(self);
    const fl_cuda *cuda = fl_cuda_get(NULL); /* NULL in a forked child: nothing to free */
    if (cuda && self->stage && fl_cuda_enter(cuda, self->device) == 0) {
        fl_gpu_decode_free(self->stage);
        fl_cuda_leave(cuda);
    }
    type->tp_free(self);
    Py_DECREF(type);
}

static PyObject *GpuDecoder_get_backend(GpuDecoderObject *self, void *closure)
{
    (void)closure;
    return PyUnicode_FromString(fl_gpu_decode_backend(self->stage));
}

static PyObject *GpuDecoder_get_last(GpuDecoderObject *self, void *closure)
{
    (void)closure;
    return Py_BuildValue("{sKsKsKsKsdsd}", "gpu_images", self->gpu_images, "cpu_fallbacks",
                         self->cpu_images, "worker_cpu_images", self->worker_cpu_images,
                         "worker_gpu_images", self->worker_gpu_images, "worker_cpu_seconds",
                         (double)self->worker_cpu_ns / 1e9, "worker_prep_seconds",
                         (double)self->worker_prep_ns / 1e9);
}

static PyObject *GpuDecoder_take_timing(GpuDecoderObject *self, PyObject *unused)
{
    (void)unused;
    const fl_cuda *cuda = fl__cuda_driver_or_raise();
    if (!cuda)
        return NULL;
    uint64_t images = 0;
    double seconds = 0.0;
    fl_cu_result rc = fl_cuda_enter(cuda, self->device);
    if (rc != 0)
        return fl__cuda_raise(cuda, rc, "timing the GPU decode stage", self->device), NULL;
    fl_gpu_decode_take_timing(self->stage, &images, &seconds);
    fl_cuda_leave(cuda);
    return Py_BuildValue("(Kd)", (unsigned long long)images, seconds);
}

static PyMethodDef GpuDecoder_methods[] = {
    {"take_timing", (PyCFunction)GpuDecoder_take_timing, METH_NOARGS,
     "take_timing()\n--\n\n"
     "(GPU images, GPU seconds) of the batches completed since the last call, as\n"
     "the stream's timing events measured them ((0, 0.0) when the driver cannot)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef GpuDecoder_getset[] = {
    {"backend", (getter)GpuDecoder_get_backend, NULL,
     "nvJPEG's backend: 'hardware' (the JPEG engines) or 'default'.", NULL},
    {"last_batch", (getter)GpuDecoder_get_last, NULL,
     "The last batch: images the stage decoded and handed back to the CPU, and the\n"
     "workers' images decoded on the CPU and prepared for the GPU, with their time.",
     NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot GpuDecoder_slots[] = {
    {Py_tp_doc, "GpuDecoder(device, plan, exact, max_pixels, batch_size, entries, pixels, "
                "use_hardware, nvjpeg_folders, nvrtc_folders)\n--\n\n"
                "The GPU decode stage of one device: nvJPEG, the resample kernel and a\n"
                "device pool for batches of batch_size from a gpu_split source of\n"
                "budgets `entries` and `pixels` per image; CudaStream.upload(batch,\n"
                "pool, decoder) runs it on a batch's GPU part."},
    {Py_tp_new, GpuDecoder_new},
    {Py_tp_dealloc, GpuDecoder_dealloc},
    {Py_tp_getset, GpuDecoder_getset},
    {Py_tp_methods, GpuDecoder_methods},
    {0, NULL},
};

PyType_Spec fl__GpuDecoder_spec = {
    .name = "fastload._C.GpuDecoder",
    .basicsize = sizeof(GpuDecoderObject),
    .flags = Py_TPFLAGS_DEFAULT,
    .slots = GpuDecoder_slots,
};
