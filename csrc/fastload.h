/* fastload._C: the private header of the binding layer.
 *
 * The binding converts between Python objects and the core (csrc/core/),
 * which never sees a PyObject.  Files: module.c (module init and state),
 * slot_pool.c (SlotPool and SlotOwner types: batch memory and its lifetime),
 * image_source.c (ImageSource: the native decode path of the image datasets),
 * collate.c (GIL-free collation of NumPy-compatible samples into a slot),
 * gather.c (GIL-free row and token-window gathers for the array datasets),
 * cuda.c (what the run-time-loaded CUDA driver reports),
 * host_register.c (HostRegistration: mapped memory page-locked in place),
 * upload.c (CudaStream and CudaEvent: host-to-device copies of batches),
 * device_array.c (DeviceArray: uploaded memory, exported through DLPack),
 * engine_type.c (the Engine type: worker threads that run a Python fetch).
 */
#ifndef FASTLOAD_H
#define FASTLOAD_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#define PY_ARRAY_UNIQUE_SYMBOL fastload_ARRAY_API
#ifndef FASTLOAD_MODULE_C
#define NO_IMPORT_ARRAY
#endif
#include <numpy/arrayobject.h>

#include "core/cuda.h"
#include "core/slots.h"

/* Per-module state (multi-phase init); every field is a strong reference
 * owned by the module and released by its clear/free. */
typedef struct fastload_state {
    PyTypeObject *SlotPool_type;
    PyTypeObject *SlotOwner_type;
    PyTypeObject *Engine_type;
    PyTypeObject *ImageSource_type;
    PyTypeObject *CudaStream_type;
    PyTypeObject *CudaEvent_type;
    PyTypeObject *DeviceArray_type;
    PyObject *tensor_type; /* torch.Tensor once registered, else NULL */
} fastload_state;

fastload_state *fl__state_of_module(PyObject *module);
fastload_state *fl__state_of_type(PyTypeObject *type);

/* slot_pool.c */
typedef struct SlotPoolObject {
    PyObject_HEAD
    fl_slot_pool *pool; /* owns one pool reference */
} SlotPoolObject;

typedef struct SlotOwnerObject {
    PyObject_HEAD
    fl_slot *slot; /* owned; released in dealloc */
} SlotOwnerObject;

extern PyType_Spec fl__SlotPool_spec;
extern PyType_Spec fl__SlotOwner_spec;

/* Takes a slot of at least `bytes` from `pool` (a SlotPool) with the GIL
 * released.  Returns 0, or -1 with MemoryError set. */
int fl__acquire_slot(PyObject *pool, size_t bytes, fl_slot **out);

/* Wraps an acquired slot in a new SlotOwner, which releases it when the last
 * array over it dies.  Takes ownership of `slot` (released here on failure). */
PyObject *fl__SlotOwner_new(fastload_state *state, fl_slot *slot);

/* A C-contiguous array of `descr` (a reference stolen, even on failure)
 * and shape `dims` over the slot of `owner` at byte `offset`, with `owner`
 * as its base; passed through `convert` (e.g. torch.from_numpy) unless that
 * is None.  Returns a new reference or NULL with an exception set. */
PyObject *fl__slot_array(PyObject *owner, size_t offset, PyArray_Descr *descr, int ndim,
                         const npy_intp *dims, PyObject *convert);

/* For an array over a shared slot (SlotPool(memory="shared")): the tuple
 * (fd, slot id, slot bytes, byte offset of the array's data); else None. */
PyObject *fl__shared_slot(PyObject *module, PyObject *array);
/* The ids of shared slots freed since the last call, as a list. */
PyObject *fl__take_freed_shared_slots(PyObject *module, PyObject *unused);

/* collate.c */
PyObject *fl__collate(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *fl__set_tensor_type(PyObject *module, PyObject *type);

/* gather.c: indices and batch outputs, shared by the native datasets */

/* Converts a sequence of integers (or an integer array) into a PyMem_Raw
 * array of int64 in [0, count), wrapping negative indices once, as NumPy and
 * torch do.  Returns 0, or -1 with IndexError naming the first bad index. */
int fl__convert_indices(PyObject *obj, int64_t count, int64_t **out, Py_ssize_t *n_out);

/* Raises IndexError: "index I is out of range for a dataset of N samples".
 * Returns -1. */
int fl__index_error(long long index, int64_t count);

#define FL__MAX_BATCH_ARRAYS 32

/* Where a batch goes: either one slot from a pool holding every output
 * array, or (pool None) one fresh NumPy array each. */
typedef struct fl__batch_out {
    int n;                                   /* output arrays */
    PyObject *owner;                         /* SlotOwner, or NULL */
    size_t offsets[FL__MAX_BATCH_ARRAYS];    /* of each array in the slot */
    PyObject *arrays[FL__MAX_BATCH_ARRAYS];  /* no pool: owned, uninitialised arrays */
    char *data[FL__MAX_BATCH_ARRAYS];        /* where each array's bytes go */
} fl__batch_out;

/* Takes the memory for n arrays of shapes dims[i] (ndims[i] dimensions) and
 * dtypes descrs[i] (borrowed) from `pool` (a SlotPool, or None). */
int fl__batch_out_alloc(fl__batch_out *b, fastload_state *state, PyObject *pool, int n,
                        PyArray_Descr **descrs, const int *ndims,
                        npy_intp dims[][NPY_MAXDIMS]);
/* The output list; arrays over the slot are passed through `convert`. */
PyObject *fl__batch_out_finish(fl__batch_out *b, PyArray_Descr **descrs, const int *ndims,
                               npy_intp dims[][NPY_MAXDIMS], PyObject *convert);
void fl__batch_out_clear(fl__batch_out *b);

PyObject *fl__gather(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *fl__gather_windows(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

/* image_source.c */
extern PyType_Spec fl__ImageSource_spec;
PyObject *fl__transform_image(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

/* cuda.c */
PyObject *fl__cuda_driver(PyObject *module, PyObject *unused);

/* host_register.c: makes the HostRegistration type (fastload._process keeps
 * it; only process workers with pin_memory=True need it). */
PyObject *fl__host_registration_type(PyObject *module, PyObject *unused);

/* upload.c */
typedef struct CudaStreamObject {
    PyObject_HEAD
    fl_cu_stream stream; /* owned: destroyed with the object */
    int device;
} CudaStreamObject;

typedef struct CudaEventObject {
    PyObject_HEAD
    fl_cu_event event; /* owned */
    int device;
} CudaEventObject;

extern PyType_Spec fl__CudaStream_spec;
extern PyType_Spec fl__CudaEvent_spec;

/* Raises RuntimeError "<what> on cuda:<device> failed: <driver's text>";
 * returns -1. */
int fl__cuda_raise(const fl_cuda *cuda, fl_cu_result rc, const char *what, int device);
/* Makes `stream` wait for `event` on the GPU; -1 with an exception set. */
int fl__cuda_wait_event(CudaEventObject *event, fl_cu_stream stream);

/* device_array.c */
struct fl_device_block;

typedef struct DeviceArrayObject {
    PyObject_HEAD
    struct fl_device_block *block; /* one reference: the memory */
    PyArray_Descr *descr;
    int ndim;
    npy_intp dims[NPY_MAXDIMS];
    PyObject *ready;  /* CudaEvent: the upload is done */
    PyObject *stream; /* CudaStream that uploaded it */
} DeviceArrayObject;

extern PyType_Spec fl__DeviceArray_spec;

/* A DeviceArray owning `slot` (released here on failure). */
PyObject *fl__DeviceArray_new(fastload_state *state, fl_slot *slot, int device,
                              PyArray_Descr *descr, int ndim, const npy_intp *dims,
                              PyObject *ready, PyObject *stream);

/* engine_type.c */
extern PyType_Spec fl__Engine_spec;
PyObject *fl__yield_to_consumer(PyObject *module, PyObject *unused);
int fl__engine_module_exec(PyObject *module);

#endif /* FASTLOAD_H */
