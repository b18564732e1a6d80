/* fastload._C: the private header of the binding layer.
 *
 * The binding converts between Python objects and the core (csrc/core/),
 * which never sees a PyObject.  Its folders mirror the core's:
 *
 *   module.c        the module: definition, state, exec (registers every type
 *                   and function below)
 *   errors.c        raising and carrying exceptions  } the generic helpers,
 *   convert.c       Python objects to C values       } which call no feature file
 *   testing.c       the test probes (functions only the tests call)
 *   engine/         engine_type.c (the Engine type: worker threads running a
 *                   Python fetch or a native job), native_batch.c (a native
 *                   source's batch as a job: checked with the GIL, run without
 *                   it on any thread, wrapped or raised with it), collate.c
 *                   (GIL-free collation of NumPy-compatible samples into a slot)
 *   memory/         slot_pool.c (SlotPool and SlotOwner: batch memory and its
 *                   lifetime; shared slots; SlotReturns and MappedSlotOwner:
 *                   a worker process's slots in the parent)
 *   image/          image_plan.c (reading a transform plan; transform_image();
 *                   the calling thread's image worker), mixing.c (MixUp/CutMix
 *                   plans and batches), jpeg_rewrite.c (add_restart_markers())
 *   source/         image_source.c (ImageSource), gather.c (RowSource and
 *                   WindowSource), lmdb_source.c (LMDBSource and LMDBRows),
 *                   sample_cache.c (SampleCache), tar_index.c (tar_index()),
 *                   dir_scan.c (dir_scan(), dir_check(), dir_samples(),
 *                   dir_checksum()), squashfs.c (squashfs_*())
 *   cuda/           cuda.c (the run-time-loaded driver and the helpers the
 *                   files below share), upload.c (CudaStream and CudaEvent),
 *                   device_array.c (DeviceArray, exported through DLPack),
 *                   host_register.c (HostRegistration), gpu_libraries.c
 *                   (nvJPEG and NVRTC: nvjpeg_info(), nvrtc_info(), probes)
 *   observe/        stats_type.c (Timers, stages, traces, NVTX), build_info.c
 *                   (what the extension was built with and runs on)
 *
 * Calls between binding files go one way only (tests/test_c_layout.py): the
 * sources (source/) call the native batch path (engine/), which calls
 * memory/ and image/; nothing calls back up, errors.c and convert.c call no
 * feature file, and no file calls into module.c.
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

#include "core/cuda/cuda.h"
#include "core/image/mix.h"
#include "core/memory/slots.h"

/* Per-module state (multi-phase init); every field is a strong reference
 * owned by the module and released by its clear/free. */
typedef struct fastload_state {
    PyTypeObject *SlotPool_type;
    PyTypeObject *SlotOwner_type;
    PyTypeObject *SlotReturns_type;
    PyTypeObject *MappedSlotOwner_type;
    PyTypeObject *Engine_type;
    PyTypeObject *Timers_type;
    PyTypeObject *ImageSource_type;
    PyTypeObject *RowSource_type;
    PyTypeObject *WindowSource_type;
    PyObject *DecodeError;  /* fastload.DecodeError */
    PyTypeObject *CudaStream_type;
    PyTypeObject *CudaEvent_type;
    PyTypeObject *DeviceArray_type;
    PyObject *tensor_type; /* torch.Tensor once a collate has found torch imported, else NULL */
    PyTypeObject *SampleCache_type;
    PyTypeObject *LMDBRows_type;
    PyTypeObject *GpuDecoder_type;
} fastload_state;

static inline fastload_state *fl__state_of_module(PyObject *module)
{
    return (fastload_state *)PyModule_GetState(module);
}

static inline fastload_state *fl__state_of_type(PyTypeObject *type)
{
    return (fastload_state *)PyType_GetModuleState(type);
}

/* errors.c */

/* The raised exception, with its traceback, taken out of the thread state
 * (NULL when none); and raising one again (the reference is stolen; NULL
 * raises nothing). */
PyObject *fl__take_exception(void);
void fl__raise_exception(PyObject *exc);

/* Raises IndexError: "index I is out of range for a dataset of N samples".
 * Returns -1. */
int fl__index_error(long long index, int64_t count);

/* convert.c */

/* Converts a sequence of integers (or an integer array) into a PyMem_Raw
 * array of int64 in [0, count), wrapping negative indices once, as NumPy and
 * torch do.  Returns 0, or -1 with IndexError naming the first bad index. */
int fl__convert_indices(PyObject *obj, int64_t count, int64_t **out, Py_ssize_t *n_out);

/* A Python int as a C int: 0, or -1 with OverflowError (out of range) or
 * the conversion's error. */
int fl__as_int(PyObject *obj, int *out);

/* Reads `obj`, a sequence of exactly `n` numbers, into out: as C ints (then
 * stored as doubles) when `ints`, else as doubles.  0, or -1 with an
 * exception set. */
int fl__read_numbers(PyObject *obj, int n, int ints, double *out);

/* torch.Tensor (borrowed), taken from torch the first time it is found
 * imported and kept in the module state; NULL while torch is not imported.
 * fastload does not import torch until it needs it (fastload/_torch.py), and
 * no tensor exists before something has, so an object is never a tensor
 * while this is NULL.  It only reads sys.modules: it never imports. */
PyObject *fl__tensor_type(fastload_state *state);

/* testing.c: the test probes, added to the module by its exec. */
extern PyMethodDef fl__testing_methods[];

/* cuda/gpu_libraries.c: nvJPEG and NVRTC, what was loaded and their probes. */
extern PyMethodDef fl__gpu_library_methods[];

/* memory/slot_pool.c */
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
/* The parent's side of process workers: a channel's return list and the
 * owner of a worker's slot as the parent maps it (see slot_pool.c). */
extern PyType_Spec fl__SlotReturns_spec;
extern PyType_Spec fl__MappedSlotOwner_spec;

/* Takes a slot of at least `bytes` from `pool` (a SlotPool) with the GIL
 * released.  Returns 0, or -1 with an exception set (fl__raise_slot_error). */
int fl__acquire_slot(PyObject *pool, size_t bytes, fl_slot **out);

/* Raises what fl_slot_acquire's `status` means for a `bytes`-byte slot:
 * RuntimeError naming the descriptor limit for FL_ERR_FDS, else MemoryError.
 * Returns NULL. */
PyObject *fl__raise_slot_error(int status, size_t bytes);
/* too_many_files_message(doing, held): the out-of-descriptors text both
 * processes raise (fl__raise_slot_error's). */
PyObject *fl__too_many_files_message(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

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
 * (fd, arena id, arena bytes, slot id, slot offset in the arena, slot bytes,
 * byte offset of the array's data in the slot); else None (core/memory/shm.h). */
PyObject *fl__shared_slot(PyObject *module, PyObject *array);
/* The ids of shared arenas freed since the last call, as a list. */
PyObject *fl__take_freed_shared_slots(PyObject *module, PyObject *unused);

/* engine/native_batch.c: the native batch path.  A native source (ImageSource,
 * RowSource, WindowSource) turns an index array into a collated batch in
 * plain C, so a worker thread runs the whole batch without the GIL: the
 * Python work (checking the request, wrapping the slot as arrays, raising a
 * recorded error) happens before and after, on the threads that submit and
 * consume it. */

#define FL__MAX_BATCH_ARRAYS 32
#define FL__MSG_SIZE 256

typedef struct fl__native_job fl__native_job;

typedef struct fl__native_ops {
    /* With the GIL, at submission: describes the outputs (n_out, descrs,
     * ndims, dims; dims[i][0] is the batch size) and allocates what run()
     * needs.  Returns 0, or -1 with an exception set. */
    int (*plan)(PyObject *source, fl__native_job *job);
    /* Without the GIL, on any thread: fills job->data[] from `core` (the
     * source's plain-C part).  A failure is recorded in the job. */
    void (*run)(const void *core, fl__native_job *job);
    /* With the GIL: the recorded failure as a new exception instance. */
    PyObject *(*failure)(PyObject *source, const fl__native_job *job);
    /* With the GIL, optional: the samples replaced (on_error="skip") as a
     * list of (index, path, message), or NULL with an exception set. */
    PyObject *(*skipped)(PyObject *source, const fl__native_job *job);
} fl__native_ops;

/* The head every native source object starts with. */
typedef struct fl__native_source {
    PyObject_HEAD
    const fl__native_ops *ops;
    const void *core;  /* what run() reads: plain C, fixed at creation */
    int64_t length;    /* number of samples */
} fl__native_source;

struct fl__native_job {
    fl__native_source *source;  /* borrowed: the submitter keeps it alive */
    int64_t *indices;           /* checked, in [0, length) */
    size_t n;
    uint64_t seed, epoch;       /* key the random augmentation */
    /* outputs */
    int n_out;
    PyArray_Descr *descrs[FL__MAX_BATCH_ARRAYS];
    int ndims[FL__MAX_BATCH_ARRAYS];
    npy_intp dims[FL__MAX_BATCH_ARRAYS][NPY_MAXDIMS];
    int channels_first[FL__MAX_BATCH_ARRAYS]; /* see (N, H, W, C) memory as (N, C, H, W) */
    size_t offsets[FL__MAX_BATCH_ARRAYS];     /* of each output in the slot */
    size_t bytes;                             /* the slot's size */
    fl_slot_pool *pool;                       /* borrowed; NULL: fresh arrays */
    fl_slot *slot;                            /* taken by run() */
    PyObject *arrays[FL__MAX_BATCH_ARRAYS];   /* without a pool */
    char *data[FL__MAX_BATCH_ARRAYS];         /* where each output's bytes go */
    /* outcome, recorded by run() */
    int status;                               /* FL_OK or an fl_status */
    int no_slot;                              /* the slot could not be allocated */
    int64_t sample;                           /* the failing sample, or -1 */
    int part;                                 /* the source's part that failed */
    int err;                                  /* errno for FL_ERR_IO */
    char msg[FL__MSG_SIZE];
    void *records;                            /* the source's own (PyMem_Raw) */
    size_t n_records;
    /* batch transform (MixUp / CutMix): output 1 becomes soft labels */
    int images_nhwc;                          /* set by plan(): output 0 is N*H*W*C memory */
    int mixing;                               /* 1: `mix` runs after the source */
    fl_mix_plan mix;
    uint64_t batch_number;                    /* keys the mixing draws */
    int64_t *hard_labels;                     /* the source's labels (PyMem_Raw) */
    int mix_failed;                           /* the failure is the mixing's: msg says it */
};

/* Whether `obj` is a native source of this module. */
int fl__is_native_source(fastload_state *state, PyObject *obj);

/* A job for the samples `indices` of `source`, its memory a slot of `pool`
 * (a SlotPool, or None for fresh arrays).  With the GIL; NULL with an
 * exception set (a bad index raises IndexError). */
fl__native_job *fl__native_job_new(fastload_state *state, PyObject *source, PyObject *indices,
                                   PyObject *pool, uint64_t seed, uint64_t epoch);
/* The same with a batch transform (NULL: none) keyed by batch number
 * `batch`: the source's outputs must be (images (N, ...4-D), labels int64
 * (N,)); labels become float32 (N, num_classes). */
fl__native_job *fl__native_job_new_mixed(fastload_state *state, PyObject *source,
                                         PyObject *indices, PyObject *pool, uint64_t seed,
                                         uint64_t epoch, const fl_mix_plan *mix, uint64_t batch);
/* Runs the job; without the GIL, on any thread. */
void fl__native_job_run(fl__native_job *job);
/* With the GIL: the batch (a list of arrays, each passed through `convert`
 * unless it is None), or NULL with the job's failure raised.  *skipped gets
 * a new list of replaced samples, or NULL when there were none. */
PyObject *fl__native_job_finish(fastload_state *state, fl__native_job *job, PyObject *convert,
                                PyObject **skipped);
/* With the GIL. */
void fl__native_job_free(fl__native_job *job);

/* The batch(indices, pool, convert, seed, epoch) method every native
 * source shares: the same job run on the calling thread, returning
 * (batch, skipped list). */
PyObject *fl__native_batch_method(PyObject *source, PyObject *const *args, Py_ssize_t nargs);

/* engine/collate.c */
PyObject *fl__collate(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

/* engine/engine_type.c */
extern PyType_Spec fl__Engine_spec;

PyObject *fl__yield_to_consumer(PyObject *module, PyObject *unused);
int fl__engine_module_exec(PyObject *module);

/* image/image_plan.c: reading a fastload.transforms Plan; transform_image();
 * the calling thread's image worker */
struct fl_image_plan;
/* 0, or -1 with ValueError naming the malformed field. */
int fl__parse_plan(PyObject *plan, struct fl_image_plan *out);
/* The NumPy dtype of the plan's output, and one image's shape in its layout. */
PyArray_Descr *fl__plan_descr(const struct fl_image_plan *plan);
void fl__image_dims(const struct fl_image_plan *plan, int width, int height, npy_intp *dims);
PyObject *fl__transform_image(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
/* image/jpeg_rewrite.c: add_restart_markers(data, max_interval, optimize,
 * max_pixels) -> (bytes, interval); DecodeError for input it cannot rewrite. */
PyObject *fl__add_restart_markers(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
/* The calling thread's image worker (fl_image_worker_get), or NULL with
 * MemoryError (out of memory) or RuntimeError (libjpeg refused to make a
 * decoder) set, carrying the core's message.  Needs the GIL. */
struct fl_image_worker *fl__image_worker(void);
/* That exception, as a new instance (NULL if it could not be made), for a
 * worker that failed with `status` and `msg`. */
PyObject *fl__image_worker_error(int status, const char *msg);

/* image/mixing.c */
/* Reads a fastload.transforms mix plan (kinds, alphas, probs, num_classes),
 * or None (out->n = 0).  0, or -1 with ValueError. */
int fl__parse_mix_plan(PyObject *plan, fl_mix_plan *out);
PyObject *fl__mix_batch(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
/* Checks (images, labels), a writable contiguous 4-D batch and its int64
 * labels, and describes them in *b (soft left NULL).  0, or -1 with
 * TypeError / ValueError. */
int fl__mix_array_batch(PyObject *images, PyObject *labels, int nhwc, fl_mix_batch *b);
/* Runs `params` on the arrays of *b with the GIL released; returns the
 * float32 soft labels, or NULL with an error naming the batch (`batch` < 0:
 * none). */
PyObject *fl__mix_on_arrays(const fl_mix_params *params, int num_classes, fl_mix_batch *b,
                            long long batch);

/* source/image_source.c: ImageSource, the native source of the image datasets */
extern PyType_Spec fl__ImageSource_spec;

/* source/gather.c: RowSource and WindowSource, the native sources of ArrayDataset
 * and TokenDataset */
extern PyType_Spec fl__RowSource_spec;
extern PyType_Spec fl__WindowSource_spec;
/* source/gather.c: copy_mapped(), a copy out of memory that may map a file another
 * process cuts short (csrc/core/memory/bus_guard.h) */
PyObject *fl__copy_mapped(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
#define FL__COPY_MAPPED_DOC                                                                 \
    "copy_mapped(src, dst, what, /)\n--\n\n"                                                \
    "Copies the buffer `src` into the writable buffer `dst` of the same size\n"             \
    "with the GIL released, under the bus-error guard: memory mapping a file\n"             \
    "that was cut short raises OSError (EIO) naming the file and `what` (a str\n"          \
    "saying what was read), where NumPy would end the process with SIGBUS."

/* source/gather.c: file_changed(), the OSError for a mapped file found cut short */
PyObject *fl__file_changed(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
#define FL__FILE_CHANGED_DOC                                                                \
    "file_changed(file, what, /)\n--\n\n"                                                \
    "The OSError (EIO) for a mapped file that changed under the loader while\n"           \
    "reading `what` (a str): `file` is (path, size when opened[, descriptor])\n"          \
    "or None, as RowSource takes it; the message is the one a guarded gather\n"         \
    "gives (csrc/core/memory/bus_guard.h: fl_bus_fault_msg)."

/* source/lmdb_source.c: LMDBSource and LMDBRows.  LMDBSource is added to the
 * module by fl__add_lmdb_type, LMDBRows (a native source) as the others;
 * fl__lmdb_core gives an LMDBSource's core source (NULL with TypeError for
 * any other object), and fl__lmdb_read_bytes is the image source byte
 * provider over it. */
struct fl_lmdb_source;
int fl__add_lmdb_type(PyObject *module);
extern PyType_Spec fl__LMDBRows_spec;
const struct fl_lmdb_source *fl__lmdb_core(PyObject *obj);
struct fl_image_worker;
int fl__lmdb_read_bytes(const void *ctx, struct fl_image_worker *w, int64_t index,
                        const unsigned char **data, size_t *size, char *msg, size_t msg_size);

/* source/sample_cache.c: SampleCache (csrc/core/source/sample_cache.h) and sample_cache_key() */
extern PyType_Spec fl__SampleCache_spec;
struct fl_sample_cache;
/* The core cache of a SampleCache; NULL with TypeError for anything else. */
struct fl_sample_cache *fl__sample_cache_of(PyObject *obj);
PyObject *fl__sample_cache_key(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
#define FL__SAMPLE_CACHE_KEY_DOC                                                            \
    "sample_cache_key(paths, offsets, ranges, /)\n--\n\n"                                    \
    "(key, total_bytes) of the samples (paths and offsets as ImageSource takes\n"            \
    "them; ranges None or (offset, size) rows): a hash of each sample's path,\n"             \
    "range, and its file's size and modification time, and the bytes of all\n"              \
    "the samples.  Stats the files with the GIL released."

/* source/tar_index.c: tar_index(), the member index of a tar shard (csrc/core/source/tar.h) */
PyObject *fl__tar_index(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
#define FL__TAR_INDEX_DOC                                                                   \
    "tar_index(path, group=True, /)\n--\n\n"                                               \
    "Indexes the regular members of an uncompressed tar file, reading it with\n"           \
    "the GIL released.  Returns a dict: 'names' (bytes: NUL-terminated names\n"            \
    "back to back), and int64 arrays 'name_offsets', 'offsets' (of each member's\n"       \
    "data in the file) and 'sizes'; with `group`, also WebDataset samples:\n"             \
    "'key_lengths' (bytes of each member's key, -1 if in no sample),\n"                   \
    "'sample_members' and 'sample_starts' (sample s is the members\n"                      \
    "sample_members[sample_starts[s]:sample_starts[s + 1]]).  Raises OSError\n"           \
    "when the file cannot be read, fastload.DecodeError when it is not a tar\n"           \
    "archive fastload accepts (the message names the member and offset)."

/* source/tar_index.c: tar_read(), small members' bytes (labels) in one call */
PyObject *fl__tar_read(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
#define FL__TAR_READ_DOC                                                                    \
    "tar_read(path, offsets, sizes, /)\n--\n\n"                                            \
    "The bytes of the members at `offsets` (int64 array) of `sizes` bytes each\n"         \
    "(each at most 4096), back to back: one open and one pread a member, with\n"           \
    "the GIL released.  Raises OSError naming the file when it cannot be read,\n"         \
    "and OSError(EIO) when a member lies past its end (the file was cut since\n"           \
    "it was indexed)."

/* source/tfrecord.c: TFRecordSource (the records an ImageSource made with
 * records= reads: csrc/core/source/tfrecord_source.h), tfrecord_index() and
 * parse_example().  fl__tfrecord_core gives a TFRecordSource's core source
 * when it has `length` records (NULL with TypeError or ValueError). */
struct fl_tfrecord_source;
int fl__add_tfrecord_type(PyObject *module);
const struct fl_tfrecord_source *fl__tfrecord_core(PyObject *obj, int64_t length);
PyObject *fl__tfrecord_index(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
#define FL__TFRECORD_INDEX_DOC                                                              \
    "tfrecord_index(path, verify=True, /)\n--\n\n"                                          \
    "The records of a TFRecord file as an int64 array of (offset, size) rows,\n"           \
    "size with the framing (DALI's tfrecord2idx): each header read with the GIL\n"          \
    "released and, with `verify`, its length CRC checked.  OSError when the file\n"        \
    "cannot be read; fastload.DecodeError naming the record for a corrupt length\n"        \
    "or a truncated record."
PyObject *fl__parse_example(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
#define FL__PARSE_EXAMPLE_DOC                                                               \
    "parse_example(data, features, /)\n--\n\n"                                              \
    "The features of a serialized tf.train.Example: `features` a tuple of\n"               \
    "(name, kind) pairs, kind 'bytes', 'float' or 'int64'; returns a dict name ->\n"       \
    "list of bytes, float32 array or int64 array.  fastload.DecodeError for a\n"           \
    "malformed Example, or a feature missing or of another kind (naming it)."
/* source/dir_scan.c: an image folder's tree listed in C (csrc/core/source/dir_scan.h) */
PyObject *fl__dir_scan(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
#define FL__DIR_SCAN_DOC                                                                    \
    "dir_scan(prefix, tops, threads, racy_after_ns, /)\n--\n\n"                              \
    "Lists the trees at prefix + top (bytes) for each of `tops` as\n"                         \
    "sorted(os.walk(top, followlinks=True)) does (a folder reached twice in a\n"             \
    "top walked once), on `threads` threads with the GIL released.  Returns the\n"          \
    "walk as a dict: bytes 'folder_paths', 'names', 'check_paths' (NUL-terminated,\n"        \
    "relative to prefix) and int64 arrays 'top_folders', 'folder_offsets',\n"                \
    "'folder_files', 'check_offsets', 'checks' (rows of dev, ino,\n"         \
    "mtime_ns, ctime_ns, size, listing hash, racy: ctime or mtime at or after\n"             \
    "racy_after_ns); 'complete' (every folder read) and 'dirs_read'."
PyObject *fl__dir_samples(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
#define FL__DIR_SAMPLES_DOC                                                                 \
    "dir_samples(prefix, walk, extensions, /)\n--\n\n"                                       \
    "The samples of a walk (dir_scan's dict): (paths: bytes of prefix + folder\n"            \
    "+ '/' + name, NUL-terminated; offsets; counts a top; undecided), keeping the\n"        \
    "files whose ASCII-lowercased path ends with one of `extensions` (tuple of\n"           \
    "bytes; None: every file).  `undecided`: indices of kept samples whose\n"               \
    "non-ASCII tail Python's str.lower() may judge otherwise."
PyObject *fl__dir_checksum(PyObject *module, PyObject *arg);
#define FL__DIR_CHECKSUM_DOC                                                                \
    "dir_checksum(buffer, /)\n--\n\n"                                                        \
    "A 64-bit checksum of the buffer's bytes (an index file's body), computed\n"            \
    "with the GIL released at the speed of memory."
PyObject *fl__dir_check(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
#define FL__DIR_CHECK_DOC                                                                   \
    "dir_check(prefix, walk, threads, /)\n--\n\n"                                            \
    "Whether a walk's folders are as it recorded them: stat() of each check\n"              \
    "path (and a new read of the racy ones), on `threads` threads with the GIL\n"          \
    "released.  Returns (index of a check that no longer holds or -1, folders\n"           \
    "read again)."
/* source/squashfs.c: paths inside SquashFS images (csrc/core/source/squashfs_read.h) */
PyObject *fl__squashfs_split(PyObject *module, PyObject *arg);
PyObject *fl__squashfs_stat(PyObject *module, PyObject *arg);
PyObject *fl__squashfs_listdir(PyObject *module, PyObject *arg);
PyObject *fl__squashfs_read(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
#define FL__SQUASHFS_SPLIT_DOC                                                              \
    "squashfs_split(path, /)\n--\n\n"                                                        \
    "(image, inner path) when `path` is '<image>:/<inner>' with <image> an\n"               \
    "existing regular file that starts with SquashFS's magic; else None."
#define FL__SQUASHFS_STAT_DOC                                                               \
    "squashfs_stat(path, /)\n--\n\n"                                                         \
    "(kind, mode, size, mtime) of a path inside an image: kind 1 file, 2 folder,\n"         \
    "3 symbolic link, 4 other; mtime in whole seconds.  OSError naming the image\n"        \
    "and the inner path when it cannot."
#define FL__SQUASHFS_LISTDIR_DOC                                                            \
    "squashfs_listdir(path, /)\n--\n\n"                                                      \
    "(names, kinds) of a folder inside an image: a list of bytes, in the image's\n"         \
    "order (sorted bytewise), and bytes of kinds as squashfs_stat's.  OSError\n"           \
    "naming the image and the inner path when it cannot."
#define FL__SQUASHFS_READ_DOC                                                               \
    "squashfs_read(path, offset=0, length=-1, /)\n--\n\n"                                    \
    "The bytes of a file inside an image (`length` -1: to its end), read with\n"            \
    "the GIL released.  OSError naming the image and the inner path when it\n"             \
    "cannot."

/* cuda/cuda.c */
PyObject *fl__cuda_driver(PyObject *module, PyObject *unused);
/* cuda_pci_bus_id(ordinal): the device's PCI address (str), or RuntimeError. */
PyObject *fl__cuda_pci_bus_id(PyObject *module, PyObject *arg);


/* The loaded driver, or NULL with RuntimeError "CUDA is not available: ..."
 * set. */
const fl_cuda *fl__cuda_driver_or_raise(void);

/* Raises RuntimeError "<what> on cuda:<device> failed: <driver's text>";
 * returns -1. */
int fl__cuda_raise(const fl_cuda *cuda, fl_cu_result rc, const char *what, int device);

/* Makes `stream` wait for `event` (recorded on `device`) on the GPU; returns
 * 0, or -1 with an exception set. */
int fl__cuda_wait_event(fl_cu_event event, int device, fl_cu_stream stream);

/* cuda/upload.c */
/* GC-tracked: it keeps each uploaded host batch until its copies are done. */
typedef struct CudaStreamObject {
    PyObject_HEAD
    fl_cu_stream stream; /* owned: destroyed with the object */
    int device;
    PyObject *in_flight; /* list of (CudaEvent, host batch), oldest first */
} CudaStreamObject;

typedef struct CudaEventObject {
    PyObject_HEAD
    fl_cu_event event; /* owned */
    int device;
} CudaEventObject;

extern PyType_Spec fl__CudaStream_spec;
extern PyType_Spec fl__CudaEvent_spec;

/* cuda/gpu_decoder.c: the GPU decode stage of one device, which
 * CudaStream.upload runs on a batch's GPU part. */
struct fl_gpu_decode;
typedef struct GpuDecoderObject {
    PyObject_HEAD
    struct fl_gpu_decode *stage; /* owned */
    int device;
    /* The last batch's, for the split's controller: the images the stage
     * decoded and those it handed back to the CPU; the workers' images
     * decoded on the CPU and prepared for the GPU, and their time. */
    unsigned long long gpu_images, cpu_images;
    unsigned long long worker_cpu_images, worker_gpu_images, worker_cpu_ns, worker_prep_ns;
} GpuDecoderObject;

extern PyType_Spec fl__GpuDecoder_spec;

/* cuda/gpu_libraries.c: libnvjpeg and libnvrtc, opened once (the first
 * caller's `folders`, a list of str or None, are the candidates); NULL with
 * *why set (static text), or with an exception set for bad folders. */
struct fl_nvjpeg;
struct fl_nvrtc;
const struct fl_nvjpeg *fl__open_nvjpeg(PyObject *folders, const char **why);
const struct fl_nvrtc *fl__open_nvrtc(PyObject *folders, const char **why);

/* cuda/device_array.c */
struct fl_device_block;

/* GC-tracked: the three object fields are strong references, NULL once the
 * collector has cleared them; the block lives until dealloc. */
typedef struct DeviceArrayObject {
    PyObject_HEAD
    struct fl_device_block *block; /* one reference: the memory */
    PyArray_Descr *descr;
    int ndim;
    npy_intp dims[NPY_MAXDIMS];
    npy_intp strides[NPY_MAXDIMS]; /* in elements: C order, or the host's dense layout */
    int c_order;                   /* strides are C order */
    PyObject *ready;  /* CudaEvent: the upload is done */
    PyObject *stream; /* CudaStream that uploaded it */
} DeviceArrayObject;

extern PyType_Spec fl__DeviceArray_spec;

/* A DeviceArray owning `slot` (released here on failure).  `strides` (in
 * elements) lay the array out in the slot; NULL: C order. */
PyObject *fl__DeviceArray_new(fastload_state *state, fl_slot *slot, int device,
                              PyArray_Descr *descr, int ndim, const npy_intp *dims,
                              const npy_intp *strides, PyObject *ready, PyObject *stream);

/* cuda/host_register.c: makes the HostRegistration type (fastload.loader.process_engine keeps
 * it; only process workers with pin_memory=True need it). */
PyObject *fl__host_registration_type(PyObject *module, PyObject *unused);
/* Whether `obj` is a HostRegistration (of any type host_registration_type made). */
int fl__is_host_registration(PyObject *obj);
/* The release fence of slot `key` of `registration` (a HostRegistration):
 * records it on the legacy default stream (GIL released; waits for that
 * stream when no event can be recorded); reports whether the work queued
 * before it is done (1, 0, or -1 with an exception set); waits for it (GIL
 * released; 0, or -1 with an exception set).  With no driver (a forked
 * child) nothing can be queued: done at once. */
void fl__host_registration_fence(PyObject *registration, uint64_t key);
int fl__host_registration_fence_done(PyObject *registration, uint64_t key);
int fl__host_registration_wait_fence(PyObject *registration, uint64_t key);

/* observe/stats_type.c */
struct fl_stats;
extern PyType_Spec fl__Timers_spec;
struct fl_stats *fl__stats_of(PyObject *loader_stats); /* borrowed */
PyObject *fl__stage_begin(PyObject *module, PyObject *stage);
PyObject *fl__stage_switch(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *fl__stage_end(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *fl__clock_ns(PyObject *module, PyObject *unused);
PyObject *fl__trace_start(PyObject *module, PyObject *capacity);
PyObject *fl__trace_take(PyObject *module, PyObject *max);
PyObject *fl__trace_stop(PyObject *module, PyObject *unused);
PyObject *fl__trace_on(PyObject *module, PyObject *unused);
PyObject *fl__nvtx_start(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *fl__nvtx_stop(PyObject *module, PyObject *unused);
PyObject *fl__nvtx_on(PyObject *module, PyObject *unused);
PyObject *fl__set_stats_enabled(PyObject *module, PyObject *arg);
int fl__stats_module_exec(PyObject *module);

/* observe/build_info.c: the libjpeg fastload was built with and loaded, and the
 * CPU's SIMD features, as a dict (python -m fastload prints it). */
PyObject *fl__build_info(PyObject *module, PyObject *unused);
/* At import: 0 when libjpeg, libpng and libwebp take the ABI of the headers
 * built with; else -1 with ImportError set (fl_check_image_libraries says
 * why: which library, the file loaded, what to do), or MemoryError. */
int fl__check_image_libraries(void);

#endif /* FASTLOAD_H */
