/* fastload._C: DeviceArray, an uploaded batch array in device memory, and
 * its exports: DLPack (__dlpack__, for torch.from_dlpack, CuPy, JAX) and
 * __cuda_array_interface__ (Numba, CuPy).
 *
 * The memory is a device slot shared, through a small reference-counted
 * block, by the DeviceArray and every DLPack tensor exported from it; the
 * DLPack deleter may run on any thread without the GIL, so the block is
 * plain C.  When the last holder lets go, a fence is recorded on the stream
 * of the last consumer and the slot returns to its pool (cuda_memory.h):
 * the next upload into it waits for the consumer's kernels on the GPU.
 *
 * The layout is the host array's: C order, or any dense permutation of it
 * (a channels_last image batch is an NCHW view of NHWC memory), exported
 * with its strides, so the consumer's tensor has the host's memory format.
 *
 * Readiness: the copy into the slot is done when the batch's upload event
 * completes.  __dlpack__(stream=s) makes s wait for that event (GPU-side)
 * as the DLPack protocol asks of a producer; __cuda_array_interface__
 * names the upload stream, on which consumers synchronise.
 */
#include "bind/fastload.h"

#include "core/cuda/cuda_memory.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>

/* The DLPack ABI (dlpack.h, version 0.8), declared here as its header
 * defines it: fastload builds without it. */
typedef struct {
    int32_t device_type;
    int32_t device_id;
} DLDevice;

typedef struct {
    uint8_t code;
    uint8_t bits;
    uint16_t lanes;
} DLDataType;

typedef struct {
    void *data;
    DLDevice device;
    int32_t ndim;
    DLDataType dtype;
    int64_t *shape;
    int64_t *strides;
    uint64_t byte_offset;
} DLTensor;

typedef struct DLManagedTensor {
    DLTensor dl_tensor;
    void *manager_ctx;
    void (*deleter)(struct DLManagedTensor *self);
} DLManagedTensor;

enum { kDLCUDA = 2 };
enum { kDLInt = 0, kDLUInt = 1, kDLFloat = 2, kDLComplex = 5, kDLBool = 6 };

/* The shared memory of one array. */
typedef struct fl_device_block {
    atomic_int refs;
    fl_slot *slot;
    int device;
    /* Where readers last were: the fence goes there.  Written with the GIL
     * at export; read by whoever drops the last reference. */
    _Atomic(fl_cu_stream) reader;
} fl_device_block;

static void block_unref(fl_device_block *block)
{
    if (atomic_fetch_sub(&block->refs, 1) != 1)
        return;
    fl_cu_stream reader = atomic_load(&block->reader);
    const fl_cuda *cuda = fl_cuda_get(NULL); /* NULL in a forked child */
    if (cuda && reader && fl_cuda_enter(cuda, block->device) == 0) {
        if (fl_cuda_fence(cuda, block->slot, reader) != 0)
            cuda->stream_synchronize(reader); /* no fence: wait for the readers here */
        fl_cuda_leave(cuda);
    }
    fl_slot_release(block->slot);
    free(block);
}

/* The exported tensor and its shape and strides, freed together. */
typedef struct exported {
    DLManagedTensor managed;
    int64_t dims[2 * NPY_MAXDIMS];
} exported;

static void exported_delete(DLManagedTensor *managed)
{
    block_unref(managed->manager_ctx);
    free(managed);
}

static void capsule_destructor(PyObject *capsule)
{
    /* A capsule a consumer took is renamed "used_dltensor"; one nobody took
     * still owns its tensor. */
    if (!PyCapsule_IsValid(capsule, "dltensor"))
        return;
    PyObject *saved = fl__take_exception();
    DLManagedTensor *managed = PyCapsule_GetPointer(capsule, "dltensor");
    if (managed)
        managed->deleter(managed);
    else
        PyErr_WriteUnraisable(capsule);
    fl__raise_exception(saved);
}

/* --------------------------------------------------------------- DeviceArray */

PyObject *fl__DeviceArray_new(fastload_state *state, fl_slot *slot, int device,
                              PyArray_Descr *descr, int ndim, const npy_intp *dims,
                              const npy_intp *strides, PyObject *ready, PyObject *stream)
{
    fl_device_block *block = malloc(sizeof *block);
    if (!block) {
        fl_slot_release(slot);
        return PyErr_NoMemory();
    }
    atomic_init(&block->refs, 1);
    block->slot = slot;
    block->device = device;
    atomic_init(&block->reader, NULL);
    DeviceArrayObject *self = PyObject_GC_New(DeviceArrayObject, state->DeviceArray_type);
    if (!self) { /* on success it holds a reference to its (heap) type */
        block_unref(block);
        return NULL;
    }
    self->block = block;
    Py_INCREF(descr);
    self->descr = descr;
    self->ndim = ndim;
    self->c_order = 1;
    npy_intp step = 1; /* the C-order stride of dimension i */
    for (int i = ndim - 1; i >= 0; i--) {
        self->dims[i] = dims[i];
        self->strides[i] = strides ? strides[i] : step;
        if (dims[i] > 1 && self->strides[i] != step)
            self->c_order = 0;
        step *= dims[i] > 0 ? dims[i] : 1;
    }
    Py_INCREF(ready);
    self->ready = ready;
    Py_INCREF(stream);
    self->stream = stream;
    PyObject_GC_Track(self);
    return (PyObject *)self;
}

static int DeviceArray_traverse(DeviceArrayObject *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->descr);
    Py_VISIT(self->ready);
    Py_VISIT(self->stream);
    return 0;
}

/* Drops the Python references; the memory (the block) stays until dealloc,
 * so DLPack tensors already exported keep working. */
static int DeviceArray_clear(DeviceArrayObject *self)
{
    Py_CLEAR(self->descr);
    Py_CLEAR(self->ready);
    Py_CLEAR(self->stream);
    return 0;
}

static void DeviceArray_dealloc(DeviceArrayObject *self)
{
    PyTypeObject *type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    DeviceArray_clear(self);
    block_unref(self->block);
    type->tp_free(self);
    Py_DECREF(type);
}

/* A DeviceArray the garbage collector cleared (while breaking a cycle) can
 * still be reached from a finalizer; it then raises instead of crashing. */
static int cleared(DeviceArrayObject *self)
{
    if (self->descr && self->ready && self->stream)
        return 0;
    PyErr_SetString(PyExc_ReferenceError, "DeviceArray was cleared by the garbage collector");
    return 1;
}

static int dl_dtype(PyArray_Descr *descr, DLDataType *out)
{
    out->bits = (uint8_t)(8 * PyDataType_ELSIZE(descr));
    out->lanes = 1;
    switch (descr->kind) {
    case 'f': out->code = kDLFloat; return 0;
    case 'i': out->code = kDLInt; return 0;
    case 'u': out->code = kDLUInt; return 0;
    case 'b': out->code = kDLBool; return 0;
    case 'c': out->code = kDLComplex; return 0;
    default:
        PyErr_Format(PyExc_BufferError, "DLPack cannot describe dtype %R", (PyObject *)descr);
        return -1;
    }
}

/* DLPack's stream argument for CUDA: None or 1 is the legacy default
 * stream, 2 the per-thread default stream, -1 "do not synchronise", any
 * other value a CUstream; 0 is ambiguous and refused. */
static int parse_stream(PyObject *obj, fl_cu_stream *out, int *sync)
{
    *sync = 1;
    if (obj == Py_None) {
        *out = FL_CU_STREAM_LEGACY;
        return 0;
    }
    long long value = PyLong_AsLongLong(obj);
    if (value == -1 && PyErr_Occurred())
        return -1;
    if (value == 0) {
        PyErr_SetString(PyExc_ValueError, "__dlpack__: stream=0 is ambiguous for CUDA; "
                                          "use 1 (legacy default stream) or 2 (per-thread)");
        return -1;
    }
    if (value == -1) {
        *sync = 0;
        *out = FL_CU_STREAM_LEGACY; /* the fence's best guess */
        return 0;
    }
    *out = (fl_cu_stream)(uintptr_t)value;
    return 0;
}

static PyObject *DeviceArray_dlpack(DeviceArrayObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"stream", "max_version", "dl_device", "copy", NULL};
    PyObject *stream_obj = Py_None, *max_version = Py_None, *dl_device = Py_None,
             *copy = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|$OOOO:__dlpack__", kwlist, &stream_obj,
                                     &max_version, &dl_device, &copy))
        return NULL;
    if (cleared(self))
        return NULL;
    (void)max_version; /* an unversioned capsule is valid for every requested version */
    if (copy == Py_True) {
        PyErr_SetString(PyExc_BufferError, "__dlpack__: copy=True is not supported");
        return NULL;
    }
    if (dl_device != Py_None) {
        PyObject *mine = Py_BuildValue("(ii)", kDLCUDA, self->block->device);
        int same = mine ? PyObject_RichCompareBool(dl_device, mine, Py_EQ) : -1;
        Py_XDECREF(mine);
        if (same < 0)
            return NULL;
        if (!same) {
            PyErr_Format(PyExc_BufferError, "__dlpack__: the array lives on cuda:%d, not %R",
                         self->block->device, dl_device);
            return NULL;
        }
    }
    fl_cu_stream stream;
    int sync;
    if (parse_stream(stream_obj, &stream, &sync) < 0)
        return NULL;
    DLDataType dtype;
    if (dl_dtype(self->descr, &dtype) < 0)
        return NULL;
    CudaEventObject *ready = (CudaEventObject *)self->ready;
    if (sync && fl__cuda_wait_event(ready->event, ready->device, stream) < 0)
        return NULL;

    exported *ex = calloc(1, sizeof *ex);
    if (!ex)
        return PyErr_NoMemory();
    DLTensor *t = &ex->managed.dl_tensor;
    t->data = self->block->slot->data;
    t->device = (DLDevice){kDLCUDA, self->block->device};
    t->ndim = self->ndim;
    t->dtype = dtype;
    t->shape = ex->dims;
    t->strides = ex->dims + NPY_MAXDIMS;
    for (int i = 0; i < self->ndim; i++) {
        t->shape[i] = self->dims[i];
        t->strides[i] = self->strides[i]; /* in elements */
    }
    ex->managed.manager_ctx = self->block;
    ex->managed.deleter = exported_delete;
    atomic_fetch_add(&self->block->refs, 1);
    atomic_store(&self->block->reader, stream);
    PyObject *capsule = PyCapsule_New(&ex->managed, "dltensor", capsule_destructor);
    if (!capsule)
        exported_delete(&ex->managed);
    return capsule;
}

static PyObject *DeviceArray_dlpack_device(DeviceArrayObject *self, PyObject *unused)
{
    (void)unused;
    return Py_BuildValue("(ii)", kDLCUDA, self->block->device);
}

/* The dims (or, `bytes` set, the strides in bytes) as a tuple. */
static PyObject *dims_tuple(DeviceArrayObject *self, const npy_intp *dims, npy_intp bytes)
{
    PyObject *out = PyTuple_New(self->ndim);
    for (int i = 0; out && i < self->ndim; i++) {
        PyObject *d = PyLong_FromSsize_t(dims[i] * (bytes ? bytes : 1));
        if (!d) {
            Py_CLEAR(out);
            break;
        }
        PyTuple_SET_ITEM(out, i, d);
    }
    return out;
}

static PyObject *shape_tuple(DeviceArrayObject *self)
{
    return dims_tuple(self, self->dims, 0);
}

static PyObject *DeviceArray_get_cai(DeviceArrayObject *self, void *closure)
{
    (void)closure;
    if (cleared(self))
        return NULL;
    PyObject *typestr = PyObject_GetAttrString((PyObject *)self->descr, "str");
    PyObject *shape = shape_tuple(self);
    PyObject *stream = PyObject_GetAttrString(self->stream, "handle");
    PyObject *strides = self->c_order
                            ? Py_NewRef(Py_None)
                            : dims_tuple(self, self->strides, PyDataType_ELSIZE(self->descr));
    PyObject *out = NULL;
    if (typestr && shape && stream && strides) {
        /* Numba and CuPy consumers wait on the upload stream, so the
         * fence goes on the default stream they most often read from. */
        atomic_store(&self->block->reader, FL_CU_STREAM_LEGACY);
        out = Py_BuildValue("{sOsOs(KO)sisOsO}", "shape", shape, "typestr", typestr, "data",
                            (unsigned long long)fl_cuda_slot_address(self->block->slot), Py_False,
                            "version", 3, "strides", strides, "stream", stream);
    }
    Py_XDECREF(typestr);
    Py_XDECREF(shape);
    Py_XDECREF(stream);
    Py_XDECREF(strides);
    return out;
}

static PyObject *DeviceArray_get_shape(DeviceArrayObject *self, void *closure)
{
    (void)closure;
    return shape_tuple(self);
}

static PyObject *DeviceArray_get_dtype(DeviceArrayObject *self, void *closure)
{
    (void)closure;
    if (cleared(self))
        return NULL;
    Py_INCREF(self->descr);
    return (PyObject *)self->descr;
}

static PyObject *DeviceArray_get_device(DeviceArrayObject *self, void *closure)
{
    (void)closure;
    return PyLong_FromLong(self->block->device);
}

static PyObject *DeviceArray_get_ready(DeviceArrayObject *self, void *closure)
{
    (void)closure;
    if (cleared(self))
        return NULL;
    Py_INCREF(self->ready);
    return self->ready;
}

static PyObject *DeviceArray_get_nbytes(DeviceArrayObject *self, void *closure)
{
    (void)closure;
    if (cleared(self))
        return NULL;
    npy_intp n = PyDataType_ELSIZE(self->descr);
    for (int i = 0; i < self->ndim; i++)
        n *= self->dims[i];
    return PyLong_FromSsize_t(n);
}

static PyObject *DeviceArray_repr(DeviceArrayObject *self)
{
    if (cleared(self))
        return PyUnicode_FromFormat("DeviceArray(<cleared>, device='cuda:%d')",
                                    self->block->device);
    PyObject *shape = shape_tuple(self);
    if (!shape)
        return NULL;
    PyObject *r = PyUnicode_FromFormat("DeviceArray(shape=%R, dtype=%R, device='cuda:%d')",
                                       shape, (PyObject *)self->descr, self->block->device);
    Py_DECREF(shape);
    return r;
}

static PyMethodDef DeviceArray_methods[] = {
    {"__dlpack__", (PyCFunction)(void (*)(void))DeviceArray_dlpack,
     METH_VARARGS | METH_KEYWORDS,
     "__dlpack__(*, stream=None, max_version=None, dl_device=None, copy=None)\n--\n\n"
     "A DLPack capsule over the device memory; `stream` (the consumer's)\n"
     "first waits for the upload on the GPU."},
    {"__dlpack_device__", (PyCFunction)DeviceArray_dlpack_device, METH_NOARGS,
     "__dlpack_device__()\n--\n\n(2, device): a CUDA device."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef DeviceArray_getset[] = {
    {"__cuda_array_interface__", (getter)DeviceArray_get_cai, NULL,
     "CUDA Array Interface v3; consumers synchronise on the upload stream", NULL},
    {"shape", (getter)DeviceArray_get_shape, NULL, "shape", NULL},
    {"dtype", (getter)DeviceArray_get_dtype, NULL, "NumPy dtype", NULL},
    {"device", (getter)DeviceArray_get_device, NULL, "CUDA device ordinal", NULL},
    {"nbytes", (getter)DeviceArray_get_nbytes, NULL, "size in bytes", NULL},
    {"ready", (getter)DeviceArray_get_ready, NULL, "CudaEvent: the upload is done", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot DeviceArray_slots[] = {
    {Py_tp_doc, "An uploaded batch array in CUDA device memory: C-contiguous, or the\n"
                "dense layout of its host array (a channels_last batch stays one).\n\n"
                "Exports DLPack and the CUDA Array Interface; the memory returns to\n"
                "fastload's device pool when this and every export are gone."},
    {Py_tp_dealloc, DeviceArray_dealloc},
    {Py_tp_traverse, DeviceArray_traverse},
    {Py_tp_clear, DeviceArray_clear},
    {Py_tp_repr, DeviceArray_repr},
    {Py_tp_methods, DeviceArray_methods},
    {Py_tp_getset, DeviceArray_getset},
    {0, NULL},
};

PyType_Spec fl__DeviceArray_spec = {
    .name = "fastload._C.DeviceArray",
    .basicsize = sizeof(DeviceArrayObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = DeviceArray_slots,
};
