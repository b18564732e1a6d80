/* fastload._C: module definition, state and exec.
 *
 * The one file that names every other: exec registers each file's types
 * and this table holds their module functions (the test probes come from
 * testing.c's own table).  No other file calls into this one; module state
 * is reached through fastload.h's fl__state_of_module/_type. */
#define FASTLOAD_MODULE_C
#include "bind/fastload.h"

static PyMethodDef module_methods[] = {
    {"collate", (PyCFunction)(void (*)(void))fl__collate, METH_FASTCALL,
     "collate(samples, pool, convert, /)\n--\n\n"
     "Stacks a list of samples made of NumPy arrays, NumPy scalars, Python\n"
     "numbers, str/bytes and torch tensors, nested in tuples, lists and dicts,\n"
     "into one batch slot taken from `pool`, copying with the GIL released.\n"
     "Leaves become arrays over the slot, passed through `convert` when it is\n"
     "not None.  Returns NotImplemented when the samples are outside those\n"
     "rules (the caller then collates in Python)."},
    {"transform_image", (PyCFunction)(void (*)(void))fl__transform_image, METH_FASTCALL,
     "transform_image(plan, image, seed, max_pixels, /)\n--\n\n"
     "Runs a compiled transform plan (fastload.transforms) on an HWC uint8 RGB\n"
     "array, its random draws keyed by `seed`; returns a fresh array."},
    {"add_restart_markers", (PyCFunction)(void (*)(void))fl__add_restart_markers, METH_FASTCALL,
     "add_restart_markers(data, max_interval, optimize, max_pixels, /)\n--\n\n"
     "The JPEG `data` rewritten losslessly with a restart marker every k MCUs\n"
     "(k the largest divisor of a row's MCUs up to max_interval, 0: 4), its\n"
     "Huffman tables optimised when `optimize` is true; returns (bytes, k)."},
    {"mix_batch", (PyCFunction)(void (*)(void))fl__mix_batch, METH_FASTCALL,
     "mix_batch(images, labels, plan, seed, epoch, batch, nhwc, /)\n--\n\n"
     "MixUp/CutMix (a mix plan) on a contiguous 4-D batch, in place, with the\n"
     "draws keyed by (seed, epoch, batch); returns the float32 soft labels."},
    {"cuda_driver", (PyCFunction)fl__cuda_driver, METH_NOARGS,
     "cuda_driver()\n--\n\n"
     "Loads the CUDA driver once (libcuda.so.1, or $FASTLOAD_LIBCUDA) and\n"
     "returns {'available': bool, 'device_count': int, 'error': str or None}."},
    {"cuda_pci_bus_id", (PyCFunction)fl__cuda_pci_bus_id, METH_O,
     "cuda_pci_bus_id(ordinal, /)\n--\n\n"
     "Device `ordinal`'s PCI address as sysfs names it ('0000:3b:00.0'), from\n"
     "the CUDA driver's cuDeviceGetPCIBusId; RuntimeError when it has none."},
    {"host_registration_type", (PyCFunction)fl__host_registration_type, METH_NOARGS,
     "host_registration_type()\n--\n\n"
     "Makes the HostRegistration type: a buffer page-locked in place by the\n"
     "CUDA driver (see its doc)."},
    {"yield_to_consumer", (PyCFunction)fl__yield_to_consumer, METH_NOARGS,
     "yield_to_consumer()\n--\n\n"
     "On a worker: lets a consumer that waits for the GIL with a batch in hand\n"
     "take it first (briefly releases the GIL; free when nobody waits)."},
    {"shared_slot", (PyCFunction)fl__shared_slot, METH_O,
     "shared_slot(array, /)\n--\n\n"
     "For an array over a slot of a SlotPool(memory='shared'): the tuple\n"
     "(fd, arena id, arena bytes, slot id, slot offset in the arena, slot bytes,\n"
     "byte offset of the array's data in the slot); else None.  Small slots\n"
     "share an arena (one memfd); the descriptor stays owned by the arena."},
    {"too_many_files_message", (PyCFunction)(void (*)(void))fl__too_many_files_message,
     METH_FASTCALL,
     "too_many_files_message(doing, held, /)\n--\n\n"
     "The out-of-descriptors message: no descriptor left `doing`, this process's\n"
     "RLIMIT_NOFILE, `held` (what holds descriptors), and what to do."},
    {"take_freed_shared_slots", (PyCFunction)fl__take_freed_shared_slots, METH_NOARGS,
     "take_freed_shared_slots()\n--\n\n"
     "The ids of shared arenas freed since the last call (their mappings in\n"
     "another process can go)."},
    {"stage_begin", (PyCFunction)fl__stage_begin, METH_O,
     "stage_begin(stage, /)\n--\n\n"
     "Python code on this thread starts stage `stage` (an index into STAGES);\n"
     "returns the token stage_end() takes (0: nothing timed, no row bound)."},
    {"stage_switch", (PyCFunction)(void (*)(void))fl__stage_switch, METH_FASTCALL,
     "stage_switch(ended, token, next, /)\n--\n\n"
     "stage_end(ended, token), then stage_begin(next): its token."},
    {"stage_end", (PyCFunction)(void (*)(void))fl__stage_end, METH_FASTCALL,
     "stage_end(stage, token, /)\n--\n\n"
     "Ends a stage begun with `token`, timed into the row bound to the thread\n"
     "now, if any."},
    {"clock_ns", (PyCFunction)fl__clock_ns, METH_NOARGS,
     "clock_ns()\n--\n\nThe clock of every timer and trace event (monotonic ns)."},
    {"trace_start", (PyCFunction)fl__trace_start, METH_O,
     "trace_start(capacity, /)\n--\n\n"
     "Records every worker job, stage and GIL wait of every loader (at most\n"
     "`capacity` events until taken) for a profiler's timeline."},
    {"trace_take", (PyCFunction)fl__trace_take, METH_O,
     "trace_take(max, /)\n--\n\n"
     "Stops recording; returns (bytes of up to `max` 24-byte events: start and\n"
     "end ns as uint64, kind and thread id as int32; the number dropped)."},
    {"trace_stop", (PyCFunction)fl__trace_stop, METH_NOARGS,
     "trace_stop()\n--\n\nStops recording; what was recorded waits for trace_take()."},
    {"trace_on", (PyCFunction)fl__trace_on, METH_NOARGS,
     "trace_on()\n--\n\nWhether events are being recorded."},
    {"nvtx_start", (PyCFunction)(void (*)(void))fl__nvtx_start, METH_FASTCALL,
     "nvtx_start(path=None, /)\n--\n\n"
     "Loads the NVTX library (libnvToolsExt.so.1, or `path`) and marks every\n"
     "worker job and stage as an NVTX range.  Raises OSError when it cannot."},
    {"nvtx_stop", (PyCFunction)fl__nvtx_stop, METH_NOARGS,
     "nvtx_stop()\n--\n\nNo more NVTX ranges."},
    {"nvtx_on", (PyCFunction)fl__nvtx_on, METH_NOARGS,
     "nvtx_on()\n--\n\nWhether NVTX ranges are on."},
    {"set_stats_enabled", (PyCFunction)fl__set_stats_enabled, METH_O,
     "set_stats_enabled(on, /)\n--\n\n"
     "Switches every loader's timers on (the default) or off, process-wide:\n"
     "only to measure what they cost."},
    {"squashfs_split", (PyCFunction)fl__squashfs_split, METH_O, FL__SQUASHFS_SPLIT_DOC},
    {"squashfs_stat", (PyCFunction)fl__squashfs_stat, METH_O, FL__SQUASHFS_STAT_DOC},
    {"squashfs_listdir", (PyCFunction)fl__squashfs_listdir, METH_O, FL__SQUASHFS_LISTDIR_DOC},
    {"squashfs_read", (PyCFunction)(void (*)(void))fl__squashfs_read, METH_FASTCALL,
     FL__SQUASHFS_READ_DOC},
    {"tar_index", (PyCFunction)(void (*)(void))fl__tar_index, METH_FASTCALL, FL__TAR_INDEX_DOC},
    {"tfrecord_index", (PyCFunction)(void (*)(void))fl__tfrecord_index, METH_FASTCALL,
     FL__TFRECORD_INDEX_DOC},
    {"parse_example", (PyCFunction)(void (*)(void))fl__parse_example, METH_FASTCALL,
     FL__PARSE_EXAMPLE_DOC},
    {"tar_read", (PyCFunction)(void (*)(void))fl__tar_read, METH_FASTCALL, FL__TAR_READ_DOC},
    {"dir_scan", (PyCFunction)(void (*)(void))fl__dir_scan, METH_FASTCALL, FL__DIR_SCAN_DOC},
    {"dir_check", (PyCFunction)(void (*)(void))fl__dir_check, METH_FASTCALL, FL__DIR_CHECK_DOC},
    {"dir_checksum", (PyCFunction)fl__dir_checksum, METH_O, FL__DIR_CHECKSUM_DOC},
    {"dir_samples", (PyCFunction)(void (*)(void))fl__dir_samples, METH_FASTCALL,
     FL__DIR_SAMPLES_DOC},
    {"copy_mapped", (PyCFunction)(void (*)(void))fl__copy_mapped, METH_FASTCALL,
     FL__COPY_MAPPED_DOC},
    {"file_changed", (PyCFunction)(void (*)(void))fl__file_changed, METH_FASTCALL,
     FL__FILE_CHANGED_DOC},
    {"sample_cache_key", (PyCFunction)(void (*)(void))fl__sample_cache_key, METH_FASTCALL,
     FL__SAMPLE_CACHE_KEY_DOC},
    {"build_info", (PyCFunction)fl__build_info, METH_NOARGS,
     "build_info()\n--\n\n"
     "What fastload was built with and runs on: {'jpeg_lib_version',\n"
     "'libjpeg_turbo_version' (e.g. 2001005, 0 if not libjpeg-turbo),\n"
     "'libjpeg_with_simd', 'libjpeg_path' (the loaded library, or None),\n"
     "'cpu_simd_features' (tuple of str)}."},
    {NULL, NULL, 0, NULL},
};

static int add_type(PyObject *module, PyType_Spec *spec, PyObject *base, PyTypeObject **slot)
{
    PyObject *type = PyType_FromModuleAndSpec(module, spec, base);
    if (!type)
        return -1;
    *slot = (PyTypeObject *)type; /* the state owns this reference */
    Py_INCREF(type);
    if (PyModule_AddObject(module, strrchr(spec->name, '.') + 1, type) < 0) {
        Py_DECREF(type);
        return -1;
    }
    return 0;
}

static int module_exec(PyObject *module)
{
    if (_import_array() < 0)
        return -1;
    /* A library that refuses every image is refused here, once, in its own words. */
    if (fl__check_image_libraries() < 0)
        return -1;
    /* The test probes, beside the production functions of module_methods. */
    if (PyModule_AddFunctions(module, fl__testing_methods) < 0)
        return -1;
    if (PyModule_AddFunctions(module, fl__gpu_library_methods) < 0)
        return -1;
    fastload_state *state = fl__state_of_module(module);
    if (add_type(module, &fl__SlotPool_spec, NULL, &state->SlotPool_type) < 0 ||
        add_type(module, &fl__SlotOwner_spec, NULL, &state->SlotOwner_type) < 0 ||
        add_type(module, &fl__SlotReturns_spec, NULL, &state->SlotReturns_type) < 0 ||
        add_type(module, &fl__MappedSlotOwner_spec, NULL, &state->MappedSlotOwner_type) < 0 ||
        add_type(module, &fl__Engine_spec, NULL, &state->Engine_type) < 0 ||
        add_type(module, &fl__Timers_spec, NULL, &state->Timers_type) < 0 ||
        add_type(module, &fl__ImageSource_spec, NULL, &state->ImageSource_type) < 0 ||
        add_type(module, &fl__RowSource_spec, NULL, &state->RowSource_type) < 0 ||
        add_type(module, &fl__WindowSource_spec, NULL, &state->WindowSource_type) < 0 ||
        add_type(module, &fl__CudaStream_spec, NULL, &state->CudaStream_type) < 0 ||
        add_type(module, &fl__CudaEvent_spec, NULL, &state->CudaEvent_type) < 0 ||
        add_type(module, &fl__DeviceArray_spec, NULL, &state->DeviceArray_type) < 0 ||
        add_type(module, &fl__SampleCache_spec, NULL, &state->SampleCache_type) < 0 ||
        add_type(module, &fl__LMDBRows_spec, NULL, &state->LMDBRows_type) < 0 ||
        add_type(module, &fl__GpuDecoder_spec, NULL, &state->GpuDecoder_type) < 0)
        return -1;
    if (fl__add_lmdb_type(module) < 0)
        return -1;
    if (fl__add_tfrecord_type(module) < 0)
        return -1;
    state->DecodeError = PyErr_NewExceptionWithDoc(
        "fastload.DecodeError",
        "A sample's file is not an image fastload can decode (corrupt,\n"
        "truncated, not an image, too large); the message names it.",
        PyExc_OSError, NULL);
    if (!state->DecodeError || PyModule_AddObjectRef(module, "DecodeError", state->DecodeError) < 0)
        return -1;
    if (fl__stats_module_exec(module) < 0)
        return -1;
    return fl__engine_module_exec(module);
}

static int module_traverse(PyObject *module, visitproc visit, void *arg)
{
    fastload_state *state = fl__state_of_module(module);
    Py_VISIT(state->SlotPool_type);
    Py_VISIT(state->SlotOwner_type);
    Py_VISIT(state->SlotReturns_type);
    Py_VISIT(state->MappedSlotOwner_type);
    Py_VISIT(state->Engine_type);
    Py_VISIT(state->Timers_type);
    Py_VISIT(state->ImageSource_type);
    Py_VISIT(state->RowSource_type);
    Py_VISIT(state->WindowSource_type);
    Py_VISIT(state->DecodeError);
    Py_VISIT(state->CudaStream_type);
    Py_VISIT(state->CudaEvent_type);
    Py_VISIT(state->DeviceArray_type);
    Py_VISIT(state->tensor_type);
    Py_VISIT(state->SampleCache_type);
    Py_VISIT(state->LMDBRows_type);
    Py_VISIT(state->GpuDecoder_type);
    return 0;
}

static int module_clear(PyObject *module)
{
    fastload_state *state = fl__state_of_module(module);
    Py_CLEAR(state->SlotPool_type);
    Py_CLEAR(state->SlotOwner_type);
    Py_CLEAR(state->SlotReturns_type);
    Py_CLEAR(state->MappedSlotOwner_type);
    Py_CLEAR(state->Engine_type);
    Py_CLEAR(state->Timers_type);
    Py_CLEAR(state->ImageSource_type);
    Py_CLEAR(state->RowSource_type);
    Py_CLEAR(state->WindowSource_type);
    Py_CLEAR(state->DecodeError);
    Py_CLEAR(state->CudaStream_type);
    Py_CLEAR(state->CudaEvent_type);
    Py_CLEAR(state->DeviceArray_type);
    Py_CLEAR(state->tensor_type);
    Py_CLEAR(state->SampleCache_type);
    Py_CLEAR(state->LMDBRows_type);
    Py_CLEAR(state->GpuDecoder_type);
    return 0;
}

static void module_free(void *module)
{
    module_clear((PyObject *)module);
}

static PyModuleDef_Slot module_slots[] = {
    {Py_mod_exec, (void *)module_exec},
    {0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "fastload._C",
    .m_doc = "fastload's native engine (private: use the fastload package).",
    .m_size = sizeof(fastload_state),
    .m_methods = module_methods,
    .m_slots = module_slots,
    .m_traverse = module_traverse,
    .m_clear = module_clear,
    .m_free = module_free,
};

PyMODINIT_FUNC PyInit__C(void)
{
    return PyModuleDef_Init(&module_def);
}
