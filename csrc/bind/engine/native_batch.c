/* fastload._C: the native batch path (see fastload.h).
 *
 * A job lives in three steps on up to three threads: fl__native_job_new
 * with the GIL where the batch is requested (index checks, output shapes,
 * memory without a pool), fl__native_job_run without it on whichever thread
 * does the work (the slot, then the source's plain-C batch function), and
 * fl__native_job_finish with the GIL where the batch is consumed (the arrays
 * over the slot, or the recorded error raised).  The engine runs the middle
 * step on its worker threads; a source's batch() method runs all three on
 * the calling thread.  Both are the same code, so a batch is the same
 * whichever thread made it.
 */
#include "bind/fastload.h"

#include "core/image/resample.h"
#include "core/status.h"

#include <string.h>

#define BATCH_ALIGN 64 /* each output array starts on a cache line */

/* ----------------------------------------------------------------- jobs */

int fl__is_native_source(fastload_state *state, PyObject *obj)
{
    PyTypeObject *t = Py_TYPE(obj);
    return t == state->ImageSource_type || t == state->RowSource_type ||
           t == state->WindowSource_type || t == state->LMDBRows_type;
}

void fl__native_job_free(fl__native_job *job)
{
    if (!job)
        return;
    for (int i = 0; i < job->n_out; i++) {
        Py_XDECREF(job->descrs[i]);
        Py_XDECREF(job->arrays[i]);
    }
    if (job->slot)
        fl_slot_release(job->slot);
    PyMem_RawFree(job->indices);
    PyMem_RawFree(job->records);
    PyMem_RawFree(job->hard_labels);
    PyMem_RawFree(job);
}

static size_t output_bytes(const fl__native_job *job, int i)
{
    size_t bytes = (size_t)PyDataType_ELSIZE(job->descrs[i]);
    for (int d = 0; d < job->ndims[i]; d++)
        bytes *= (size_t)job->dims[i][d];
    return bytes;
}

/* With a batch transform: checks the source's outputs are (images,
 * labels) and turns the labels output into soft labels, the source's own
 * labels going to a scratch vector. */
static int plan_mixing(fl__native_job *job, const fl_mix_plan *mix, uint64_t batch)
{
    if (job->n_out != 2 || job->ndims[0] != 4 || job->ndims[1] != 1 ||
        job->descrs[1]->type_num != NPY_INT64) {
        PyErr_SetString(PyExc_TypeError, "batch_transform: MixUp and CutMix need batches of "
                                         "(images (N, C, H, W), int64 class labels (N,))");
        return -1;
    }
    int type = job->descrs[0]->type_num;
    if (type != NPY_FLOAT32 && type != NPY_FLOAT16 && type != NPY_UINT8) {
        PyErr_SetString(PyExc_TypeError, "batch_transform: MixUp and CutMix need float32, "
                                         "float16 or uint8 images");
        return -1;
    }
    for (int i = 0; i < mix->n; i++)
        if (mix->kind[i] == FL_MIX_MIXUP && type == NPY_UINT8) {
            PyErr_SetString(PyExc_TypeError, "batch_transform: MixUp needs float images (end "
                                             "the transform with ToTensor or "
                                             "ConvertImageDtype); these are uint8");
            return -1;
        }
    job->hard_labels = PyMem_RawMalloc(sizeof(int64_t) * (job->n ? job->n : 1));
    if (!job->hard_labels) {
        PyErr_NoMemory();
        return -1;
    }
    Py_SETREF(job->descrs[1], PyArray_DescrFromType(NPY_FLOAT32));
    job->ndims[1] = 2;
    job->dims[1][1] = mix->num_classes;
    job->mix = *mix;
    job->mixing = 1;
    job->batch_number = batch;
    return 0;
}

fl__native_job *fl__native_job_new(fastload_state *state, PyObject *source, PyObject *indices,
                                   PyObject *pool, uint64_t seed, uint64_t epoch)
{
    return fl__native_job_new_mixed(state, source, indices, pool, seed, epoch, NULL, 0);
}

fl__native_job *fl__native_job_new_mixed(fastload_state *state, PyObject *source,
                                         PyObject *indices, PyObject *pool, uint64_t seed,
                                         uint64_t epoch, const fl_mix_plan *mix, uint64_t batch)
{
    if (!fl__is_native_source(state, source)) {
        PyErr_SetString(PyExc_TypeError, "not a native source");
        return NULL;
    }
    if (pool != Py_None && !PyObject_TypeCheck(pool, state->SlotPool_type)) {
        PyErr_SetString(PyExc_TypeError, "pool must be a SlotPool or None");
        return NULL;
    }
    fl__native_source *src = (fl__native_source *)source;
    fl__native_job *job = PyMem_RawCalloc(1, sizeof *job);
    if (!job)
        return (fl__native_job *)PyErr_NoMemory();
    job->source = src;
    job->seed = seed;
    job->epoch = epoch;
    job->sample = -1;
    Py_ssize_t n;
    if (fl__convert_indices(indices, src->length, &job->indices, &n) < 0)
        goto fail;
    job->n = (size_t)n;
    if (src->ops->plan(source, job) < 0)
        goto fail;
    if (mix && mix->n > 0 && plan_mixing(job, mix, batch) < 0)
        goto fail;

    if (pool == Py_None) {
        for (int i = 0; i < job->n_out; i++) {
            Py_INCREF(job->descrs[i]);
            job->arrays[i] = PyArray_NewFromDescr(&PyArray_Type, job->descrs[i], job->ndims[i],
                                                  job->dims[i], NULL, NULL, 0, NULL);
            if (!job->arrays[i])
                goto fail;
            job->data[i] = PyArray_BYTES((PyArrayObject *)job->arrays[i]);
        }
    } else {
        job->pool = ((SlotPoolObject *)pool)->pool;
        for (int i = 0; i < job->n_out; i++) {
            job->offsets[i] = job->bytes;
            job->bytes += (output_bytes(job, i) + BATCH_ALIGN - 1) / BATCH_ALIGN * BATCH_ALIGN;
        }
    }
    return job;

fail:
    fl__native_job_free(job);
    return NULL;
}

void fl__native_job_run(fl__native_job *job)
{
    if (job->pool) {
        int status = fl_slot_acquire(job->pool, job->bytes, &job->slot);
        if (status != FL_OK) {
            job->status = status;
            job->no_slot = 1;
            return;
        }
        for (int i = 0; i < job->n_out; i++)
            job->data[i] = (char *)job->slot->data + job->offsets[i];
    }
    if (!job->mixing) {
        job->source->ops->run(job->source->core, job);
        return;
    }
    /* The source writes its int64 labels to the scratch vector; the soft
     * labels go where it would have written them. */
    char *soft = job->data[1];
    job->data[1] = (char *)job->hard_labels;
    job->source->ops->run(job->source->core, job);
    job->data[1] = soft;
    if (job->status != FL_OK)
        return;
    npy_intp *d = job->dims[0];
    fl_mix_batch b = {
        .images = job->data[0],
        .dtype = job->descrs[0]->type_num == NPY_FLOAT32   ? FL_DTYPE_FLOAT32
                 : job->descrs[0]->type_num == NPY_FLOAT16 ? FL_DTYPE_FLOAT16
                                                           : FL_DTYPE_UINT8,
        .nhwc = job->images_nhwc,
        .n = job->n,
        .channels = (int)(job->images_nhwc ? d[3] : d[1]),
        .height = (int)(job->images_nhwc ? d[1] : d[2]),
        .width = (int)(job->images_nhwc ? d[2] : d[3]),
        .labels = job->hard_labels,
        .soft = (float *)soft,
    };
    fl_mix_params params;
    fl_mix_draw(&job->mix, job->seed, job->epoch, job->batch_number, b.height, b.width, &params);
    size_t bad = 0;
    int rc = fl_mix_apply(&params, job->mix.num_classes, &b, &bad);
    if (rc == FL_OK)
        return;
    job->status = rc;
    job->mix_failed = 1;
    if (rc == FL_ERR_NOMEM)
        snprintf(job->msg, sizeof job->msg, "batch %llu: no memory to mix the batch",
                 (unsigned long long)job->batch_number);
    else
        snprintf(job->msg, sizeof job->msg, "batch %llu: sample index %lld has label %lld, "
                 "outside [0, num_classes=%d)",
                 (unsigned long long)job->batch_number, (long long)job->indices[bad],
                 (long long)job->hard_labels[bad], job->mix.num_classes);
}

/* Output i over the job's slot (or its own array): shape dims[i], or for a
 * channels_first output its (N, H, W, C) memory seen as (N, C, H, W). */
static PyObject *wrap_output(fl__native_job *job, int i, PyObject *owner)
{
    PyArrayObject *a;
    if (owner) {
        Py_INCREF(job->descrs[i]);
        a = (PyArrayObject *)PyArray_NewFromDescr(&PyArray_Type, job->descrs[i], job->ndims[i],
                                                  job->dims[i], NULL,
                                                  (char *)((SlotOwnerObject *)owner)->slot->data +
                                                      job->offsets[i],
                                                  NPY_ARRAY_CARRAY, NULL);
        if (!a)
            return NULL;
        Py_INCREF(owner);
        if (PyArray_SetBaseObject(a, owner) < 0) {
            Py_DECREF(owner);
            Py_DECREF(a);
            return NULL;
        }
    } else {
        a = (PyArrayObject *)Py_NewRef(job->arrays[i]);
    }
    if (!job->channels_first[i])
        return (PyObject *)a;
    PyArray_Dims order = {(npy_intp[]){0, 3, 1, 2}, 4};
    PyObject *view = PyArray_Transpose(a, &order);
    Py_DECREF(a);
    return view;
}

PyObject *fl__native_job_finish(fastload_state *state, fl__native_job *job, PyObject *convert,
                                PyObject **skipped)
{
    *skipped = NULL;
    if (job->status != FL_OK) {
        if (job->mix_failed) {
            PyErr_SetString(job->status == FL_ERR_NOMEM ? PyExc_MemoryError : PyExc_ValueError,
                            job->msg);
        } else if (job->no_slot) {
            fl__raise_slot_error(job->status, job->bytes);
        } else {
            PyObject *exc = job->source->ops->failure((PyObject *)job->source, job);
            if (exc)
                fl__raise_exception(exc);
        }
        return NULL;
    }
    PyObject *owner = NULL;
    if (job->slot) {
        owner = fl__SlotOwner_new(state, job->slot);
        job->slot = NULL; /* the owner releases it now */
        if (!owner)
            return NULL;
    }
    PyObject *list = PyList_New(job->n_out);
    for (int i = 0; list && i < job->n_out; i++) {
        PyObject *item = wrap_output(job, i, owner);
        if (item && convert != Py_None)
            Py_SETREF(item, PyObject_CallOneArg(convert, item));
        if (!item)
            Py_CLEAR(list);
        else
            PyList_SET_ITEM(list, i, item);
    }
    Py_XDECREF(owner);
    if (list && job->source->ops->skipped && job->n_records > 0) {
        *skipped = job->source->ops->skipped((PyObject *)job->source, job);
        if (!*skipped)
            Py_CLEAR(list);
    }
    return list;
}

PyObject *fl__native_batch_method(PyObject *source, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5 && nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "batch(indices, pool, convert, seed, epoch[, mix, "
                                         "batch]) takes 5 or 7 arguments");
        return NULL;
    }
    unsigned long long seed = PyLong_AsUnsignedLongLongMask(args[3]);
    unsigned long long epoch = PyLong_AsUnsignedLongLongMask(args[4]);
    unsigned long long number = nargs == 7 ? PyLong_AsUnsignedLongLongMask(args[6]) : 0;
    if (PyErr_Occurred())
        return NULL;
    fl_mix_plan mix = {0};
    if (nargs == 7 && fl__parse_mix_plan(args[5], &mix) < 0)
        return NULL;
    fastload_state *state = fl__state_of_type(Py_TYPE(source));
    fl__native_job *job = fl__native_job_new_mixed(state, source, args[0], args[1], seed, epoch,
                                                   &mix, number);
    if (!job)
        return NULL;
    /* `source` and `pool` are held by the caller for the whole call. */
    Py_BEGIN_ALLOW_THREADS
    fl__native_job_run(job);
    Py_END_ALLOW_THREADS
    PyObject *skipped;
    PyObject *batch = fl__native_job_finish(state, job, args[2], &skipped);
    fl__native_job_free(job);
    if (!batch)
        return NULL;
    if (!skipped) {
        skipped = PyList_New(0);
        if (!skipped) {
            Py_DECREF(batch);
            return NULL;
        }
    }
    return Py_BuildValue("(NN)", batch, skipped);
}
