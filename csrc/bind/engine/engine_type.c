/* fastload._C: the Engine type — core engine threads that run Python.
 *
 * Each worker thread owns a Python thread state for its whole life (made by
 * PyGILState_Ensure when it starts), so thread-local data such as
 * get_worker_info() survives between jobs.  It holds the GIL only inside a
 * hook: worker.start() once, worker.fetch(request) per job, worker.stop()
 * once.  Engine locks are never held while a hook runs (the core guarantees
 * it), and the owner always waits for workers with the GIL released, so a
 * worker waiting for the GIL can always get it.
 *
 * Two kinds of job.  A Python job calls worker.fetch(request) with the GIL.
 * A native job (an engine made with a native `source`: the loader's dataset
 * is fastload's own and collates by default) runs the source's batch in
 * plain C without the GIL (native_batch.c): the request's indices are
 * checked when it is submitted, and the slot is wrapped, or the recorded
 * error raised, in next() on the consumer's thread.  Such a batch crosses
 * into Python only there (and for files only Pillow can decode).
 *
 * Ownership: a worker's Python objects (worker_ctx.worker, .fetch) belong to
 * its thread while it runs — it drops them itself, with the GIL, as it exits.
 * Once the threads are joined, anything left (a forked child never ran them)
 * belongs to the Engine object again.  Job payloads belong to the core from
 * submit until delivery, then to whoever takes them.
 *
 * Shutdown waits for workers with a bound (close(timeout)): a worker stuck in
 * the dataset is detached instead of joined.  Such a thread still runs
 * Python, so it keeps everything it uses — the core engine, engine_shared,
 * its own Python objects (and through them the dataset and batch slots) and
 * the job it runs: all deliberately leaked.  If its call ever returns, it
 * exits as usual and drops its Python objects itself.  If the interpreter is
 * finalizing by then, CPython ends (or parks) the thread when it asks for
 * the GIL; it holds no fastload lock at that point, since no hook takes the
 * GIL while holding one.
 */
#include "bind/fastload.h"

#include <sched.h>
#include <stdatomic.h>
#include <string.h>
#include <structmember.h>
#include <time.h>

#include "core/engine/engine.h"
#include "core/observe/stats.h"
#include "core/status.h"

/* The GIL-free wait in next() wakes this often to let signal handlers run
 * (Ctrl-C must interrupt a wait for a slow batch). */
#define SIGNAL_CHECK_SECONDS 0.1

/* How long dealloc waits for the workers of an engine nobody closed (the
 * loader always closes its engines, with its own bound). */
#define DEALLOC_GRACE_SECONDS 5.0

#define MAX_WORKERS 1024

/* next()'s outcome for a native job that failed: the value is the
 * exception (the core's outcomes are all >= 0). */
#define JOB_FAILED (-1)

/* ------------------------------------------------------- hand-off priority
 *
 * A consumer returning from next() with a batch needs the GIL back.  A
 * worker running Python would keep it until the interpreter's switch
 * interval (5 ms) forces a hand-over: a stall on every batch, and a delay of
 * the first.  So while a consumer of an engine that runs Python jobs waits
 * for the GIL, that engine's workers step aside at their yield points --
 * before each job, and between samples through yield_to_consumer() -- for at
 * most YIELD_LIMIT_NS, so that a consumer stuck behind some other thread
 * cannot stall them for long.  Native jobs need no GIL: their consumers do
 * not ask. */
#define YIELD_LIMIT_NS 2000000L

static int64_t monotonic_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000L + ts.tv_nsec;
}

/* Called without the GIL. */
static void step_aside_for_consumers(atomic_int *consumers_waiting)
{
    if (atomic_load_explicit(consumers_waiting, memory_order_relaxed) == 0)
        return;
    int64_t deadline = monotonic_ns() + YIELD_LIMIT_NS;
    while (atomic_load(consumers_waiting) > 0 && monotonic_ns() < deadline)
        sched_yield();
}

typedef struct worker_ctx {
    PyObject *worker;         /* see the ownership note above */
    PyObject *fetch;          /* bound worker.fetch */
    PyObject *init_error;     /* what worker.start() returned when not None */
    PyThreadState *tstate;    /* this thread's state while it lacks the GIL */
    PyGILState_STATE gilstate;
} worker_ctx;

typedef struct engine_shared {
    atomic_int consumers_waiting; /* see "hand-off priority" */
    fl_stats *stats;              /* one reference, or NULL: worker w times into row w */
    int num_workers;
    worker_ctx workers[];
} engine_shared;

static void shared_free(engine_shared *shared)
{
    fl_stats_release(shared->stats);
    PyMem_RawFree(shared);
}

/* The engine whose worker this thread is, for yield_to_consumer(). */
static _Thread_local engine_shared *current_engine;

PyObject *fl__yield_to_consumer(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    engine_shared *shared = current_engine;
    if (shared && atomic_load_explicit(&shared->consumers_waiting, memory_order_relaxed) > 0) {
        Py_BEGIN_ALLOW_THREADS
        step_aside_for_consumers(&shared->consumers_waiting);
        Py_END_ALLOW_THREADS
    }
    Py_RETURN_NONE;
}

typedef struct job {
    PyObject *request;        /* owned; a Python job's */
    fl__native_job *native;   /* a native job's */
    PyObject *result;         /* owned; the value fetch returned */
    PyObject *error;          /* owned; the exception fetch (or submit) raised */
} job;

typedef struct EngineObject {
    PyObject_HEAD
    fl_engine *engine;        /* NULL once freed */
    engine_shared *shared;    /* the hooks' context; freed with the engine */
    int num_workers;
    int closed;
    int abandoned;            /* workers were detached: engine and shared leak */
    /* Native jobs (source is NULL for an engine of Python jobs): */
    PyObject *source;         /* the native source */
    PyObject *pool;           /* SlotPool the batches go to */
    PyObject *convert;        /* applied to each batch array, or None */
    PyObject *report;         /* called with the skipped-sample records, or None */
    uint64_t seed;
    fl_mix_plan mix;          /* the batch transform run on native batches (n 0: none) */
    PyObject *weakreflist;
} EngineObject;

/* ------------------------------------------------------ worker-thread hooks */

static void call_hook(PyObject *worker, const char *name)
{
    PyObject *r = PyObject_CallMethod(worker, name, NULL);
    if (!r)
        PyErr_WriteUnraisable(worker); /* the Python side catches its own errors */
    Py_XDECREF(r);
}

static void hook_worker_start(void *ctx, int w)
{
    engine_shared *shared = ctx;
    worker_ctx *wc = &shared->workers[w];
    current_engine = ctx;
    if (shared->stats)
        fl_stats_bind_worker(shared->stats, w);
    wc->gilstate = PyGILState_Ensure();
    PyObject *r = PyObject_CallMethod(wc->worker, "start", NULL);
    if (!r)
        PyErr_WriteUnraisable(wc->worker); /* the Python side catches its own errors */
    else if (r != Py_None)
        wc->init_error = Py_NewRef(r); /* delivered by the first native job */
    Py_XDECREF(r);
    wc->tstate = PyEval_SaveThread();
}

static int hook_run(void *ctx, int w, void *payload)
{
    worker_ctx *wc = &((engine_shared *)ctx)->workers[w];
    job *j = payload;
    int outcome = FL_JOB_DONE;

    if (j->native || j->error) {
        /* Native: no GIL.  The references move between the worker and the
         * job without a count change, so that needs none either. */
        if (wc->init_error) {
            j->result = wc->init_error;
            wc->init_error = NULL;
        } else if (j->native) {
            fl__native_job_run(j->native);
        }
        return outcome;
    }
    fl_stats_row *timers = fl_stats_current();
    uint64_t t = timers ? fl_stats_now() : 0;
    step_aside_for_consumers(&((engine_shared *)ctx)->consumers_waiting);
    PyEval_RestoreThread(wc->tstate);
    if (timers)
        fl_stats_add_gil_wait(timers, t, fl_stats_now());
    PyObject *res = PyObject_CallOneArg(wc->fetch, j->request);
    if (!res) {
        j->error = fl__take_exception();
    } else if (PyTuple_Check(res) && PyTuple_GET_SIZE(res) == 2) {
        long code = PyLong_AsLong(PyTuple_GET_ITEM(res, 0));
        if (code == FL_JOB_SKIPPED || code == FL_JOB_RETIRE)
            outcome = (int)code;
        else if (code == -1 && PyErr_Occurred())
            j->error = fl__take_exception();
        j->result = PyTuple_GET_ITEM(res, 1);
        Py_INCREF(j->result);
        Py_DECREF(res);
    } else {
        PyErr_SetString(PyExc_TypeError, "fastload: worker.fetch must return (code, value)");
        j->error = fl__take_exception();
        Py_DECREF(res);
    }
    wc->tstate = PyEval_SaveThread();
    return outcome;
}

static void hook_worker_stop(void *ctx, int w)
{
    worker_ctx *wc = &((engine_shared *)ctx)->workers[w];
    PyEval_RestoreThread(wc->tstate);
    call_hook(wc->worker, "stop");
    Py_CLEAR(wc->fetch);
    Py_CLEAR(wc->worker);
    Py_CLEAR(wc->init_error);
    wc->tstate = NULL;
    current_engine = NULL;
    if (((engine_shared *)ctx)->stats)
        fl_stats_unbind_worker(((engine_shared *)ctx)->stats, w);
    PyGILState_Release(wc->gilstate);
}

/* -------------------------------------------------------------- jobs */

static void job_free(job *j)
{
    if (!j)
        return;
    Py_XDECREF(j->request);
    fl__native_job_free(j->native);
    Py_XDECREF(j->result);
    Py_XDECREF(j->error);
    PyMem_RawFree(j);
}

static PyObject *closed_error(void)
{
    PyErr_SetString(PyExc_RuntimeError,
                    "fastload: this loader iterator was shut down, or created before fork(); "
                    "create a new iterator");
    return NULL;
}

static int engine_usable(EngineObject *self)
{
    if (!self->engine || self->closed) {
        closed_error();
        return 0;
    }
    return 1;
}

/* Stops the workers, waiting at most timeout_s seconds (< 0: no limit) for
 * each to finish its current job, and drops every undelivered job.  Workers
 * still running at the deadline are detached (see the top of the file) and
 * flagged in left[0..num_workers); returns their number.  Safe to call
 * repeatedly (later calls return 0); the core engine itself is freed only in
 * dealloc, because another thread may still be returning from next(). */
static int engine_close(EngineObject *self, double timeout_s, char *left)
{
    memset(left, 0, (size_t)self->num_workers);
    if (!self->engine || self->closed)
        return 0;
    self->closed = 1;
    fl_engine *e = self->engine;
    int running;
    Py_BEGIN_ALLOW_THREADS
    running = fl_engine_stop_within(e, timeout_s);
    Py_END_ALLOW_THREADS
    if (running > 0) {
        for (int i = 0; i < self->num_workers; i++)
            left[i] = (char)fl_engine_worker_running(e, i);
        fl_engine_abandon(e);
        self->abandoned = 1;
    }
    void *payload;
    while (fl_engine_take_leftover(e, &payload) == FL_OK)
        job_free(payload);
    /* Joined workers cleared their own objects as they exited; a forked
     * child's inherited engine never ran them, so clear what is left.  A
     * detached worker's objects stay with it. */
    for (int i = 0; i < self->shared->num_workers; i++) {
        if (left[i])
            continue;
        Py_CLEAR(self->shared->workers[i].fetch);
        Py_CLEAR(self->shared->workers[i].worker);
        Py_CLEAR(self->shared->workers[i].init_error);
    }
    return running;
}

/* Warns that dealloc left workers running; never raises. */
static void warn_left_running(const char *left, int num_workers)
{
    PyObject *saved = fl__take_exception();
    for (int i = 0; i < num_workers; i++) {
        if (left[i] && PyErr_WarnFormat(PyExc_RuntimeWarning, 1,
                                        "fastload: worker thread %d did not stop within %g "
                                        "seconds; it is left running, detached",
                                        i, DEALLOC_GRACE_SECONDS) < 0)
            PyErr_WriteUnraisable(NULL);
    }
    fl__raise_exception(saved);
}

/* -------------------------------------------------------------- methods */

/* The most CPU ids an Engine takes (glibc's cpu_set_t holds 1024). */
#define CPU_IDS_MAX 1024

/* `cpus` (None, or a sequence of CPU ids 0..1023) into ids[].  Returns the
 * count (0 for None) or -1 with an exception set. */
static int parse_cpus(PyObject *cpus, int ids[CPU_IDS_MAX])
{
    if (cpus == Py_None)
        return 0;
    PyObject *seq = PySequence_Fast(cpus, "Engine: cpus must be a sequence of CPU ids or None");
    if (!seq)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n < 1 || n > CPU_IDS_MAX) {
        Py_DECREF(seq);
        PyErr_SetString(PyExc_ValueError, "Engine: cpus needs 1..1024 CPU ids");
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        long id = PyLong_AsLong(PySequence_Fast_GET_ITEM(seq, i));
        if (id == -1 && PyErr_Occurred()) {
            Py_DECREF(seq);
            return -1;
        }
        if (id < 0 || id >= CPU_IDS_MAX) {
            Py_DECREF(seq);
            PyErr_Format(PyExc_ValueError, "Engine: CPU id %ld is outside 0..1023", id);
            return -1;
        }
        ids[i] = (int)id;
    }
    Py_DECREF(seq);
    return (int)n;
}

static PyObject *Engine_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"workers", "max_in_flight", "in_order", "name", "source", "pool",
                             "convert", "seed", "report", "stats", "mix", "cpus", NULL};
    PyObject *workers, *source = Py_None, *pool = Py_None, *convert = Py_None;
    PyObject *report = Py_None, *stats = Py_None, *mix = Py_None, *cpus = Py_None;
    int max_in_flight, in_order = 1;
    unsigned long long seed = 0;
    const char *name = "fastload-w";
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "Oi|ps$OOOKOOOO:Engine", kwlist, &workers,
                                     &max_in_flight, &in_order, &name, &source, &pool, &convert,
                                     &seed, &report, &stats, &mix, &cpus))
        return NULL;
    int cpu_ids[CPU_IDS_MAX];
    int num_cpus = parse_cpus(cpus, cpu_ids);
    if (num_cpus < 0)
        return NULL;
    fl_mix_plan mix_plan;
    if (fl__parse_mix_plan(mix, &mix_plan) < 0)
        return NULL;
    fastload_state *state = fl__state_of_type(type);
    if (stats != Py_None && !PyObject_TypeCheck(stats, state->Timers_type)) {
        PyErr_SetString(PyExc_TypeError, "Engine: stats must be a Timers or None");
        return NULL;
    }
    if (source != Py_None &&
        (!fl__is_native_source(state, source) || !PyObject_TypeCheck(pool, state->SlotPool_type))) {
        PyErr_SetString(PyExc_TypeError, "Engine: source must be a native source, with a "
                                         "SlotPool as pool");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(workers, "Engine: workers must be a sequence");
    if (!seq)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n < 1 || n > MAX_WORKERS || max_in_flight < 1) {
        Py_DECREF(seq);
        PyErr_SetString(PyExc_ValueError,
                        "Engine: need 1..1024 workers and max_in_flight >= 1");
        return NULL;
    }
    if (stats != Py_None && fl__stats_of(stats)->num_rows < n) {
        Py_DECREF(seq);
        PyErr_SetString(PyExc_ValueError, "Engine: stats needs a row per worker");
        return NULL;
    }

    EngineObject *self = (EngineObject *)type->tp_alloc(type, 0);
    engine_shared *shared = NULL;
    if (!self)
        goto fail;
    shared = PyMem_RawCalloc(1, sizeof *shared + (size_t)n * sizeof(worker_ctx));
    if (!shared) {
        PyErr_NoMemory();
        goto fail;
    }
    shared->num_workers = (int)n;
    if (stats != Py_None) {
        shared->stats = fl__stats_of(stats);
        fl_stats_retain(shared->stats);
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        worker_ctx *wc = &shared->workers[i];
        wc->worker = PySequence_Fast_GET_ITEM(seq, i);
        Py_INCREF(wc->worker);
        wc->fetch = PyObject_GetAttrString(wc->worker, "fetch");
        if (!wc->fetch)
            goto fail;
    }

    fl_engine_config config = {
        .num_workers = (int)n,
        .max_in_flight = max_in_flight,
        .in_order = in_order,
        .name = name,
        .cpus = num_cpus ? cpu_ids : NULL,
        .num_cpus = num_cpus,
    };
    fl_engine_hooks hooks = {
        .ctx = shared,
        .worker_start = hook_worker_start,
        .run = hook_run,
        .worker_stop = hook_worker_stop,
    };
    /* Threads start now and run worker.start(), which needs the GIL.  Create
     * them with the GIL released: if a later thread fails to start, create
     * joins the earlier ones, which must be able to finish start() first. */
    int rc;
    char msg[320] = "";
    Py_BEGIN_ALLOW_THREADS
    rc = fl_engine_create(&config, &hooks, &self->engine, msg, sizeof msg);
    Py_END_ALLOW_THREADS
    if (rc == FL_ERR_AFFINITY) {
        PyErr_Format(PyExc_OSError, "fastload: %s", msg);
        goto fail;
    }
    if (rc != FL_OK) {
        PyErr_Format(rc == FL_ERR_NOMEM ? PyExc_MemoryError : PyExc_RuntimeError,
                     "fastload: cannot start %zd worker threads: %s", n, fl_status_str(rc));
        goto fail;
    }
    self->shared = shared;
    self->num_workers = (int)n;
    if (source != Py_None) {
        self->source = Py_NewRef(source);
        self->pool = Py_NewRef(pool);
        self->convert = Py_NewRef(convert);
        self->report = Py_NewRef(report);
        self->seed = seed;
        self->mix = mix_plan;
    }
    Py_DECREF(seq);
    return (PyObject *)self;

fail:
    if (shared) {
        for (Py_ssize_t i = 0; i < n; i++) {
            Py_XDECREF(shared->workers[i].worker);
            Py_XDECREF(shared->workers[i].fetch);
        }
        shared_free(shared);
    }
    Py_XDECREF(self);
    Py_DECREF(seq);
    return NULL;
}

/* Stops the workers (within DEALLOC_GRACE_SECONDS) and drops every Python
 * object the engine holds, except what detached workers still use. */
static void engine_release(EngineObject *self)
{
    if (self->engine) {
        if (fl_engine_is_own_thread(self->engine)) {
            /* Dropped by code running on one of its own workers: that thread
             * cannot join itself.  Let the workers exit on their own; the
             * engine and its context stay allocated for them (a bounded,
             * deliberate leak in a rare case). */
            fl_engine_abandon(self->engine);
            self->abandoned = 1;
        } else {
            char left[MAX_WORKERS];
            if (engine_close(self, DEALLOC_GRACE_SECONDS, left) > 0)
                warn_left_running(left, self->num_workers);
            if (!self->abandoned) {
                fl_engine_free(self->engine);
                shared_free(self->shared);
            }
        }
        self->engine = NULL;
        self->shared = NULL;
    }
    if (!self->abandoned) {
        /* Detached workers may still run native jobs of this source. */
        Py_CLEAR(self->source);
        Py_CLEAR(self->pool);
        Py_CLEAR(self->convert);
        Py_CLEAR(self->report);
    }
}

static int Engine_traverse(EngineObject *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    /* A detached worker's objects are its own: not visited, so a cycle
     * through them is never collected under it. */
    if (self->abandoned)
        return 0;
    Py_VISIT(self->source);
    Py_VISIT(self->pool);
    Py_VISIT(self->convert);
    Py_VISIT(self->report);
    for (int i = 0; self->shared && i < self->shared->num_workers; i++) {
        Py_VISIT(self->shared->workers[i].worker);
        Py_VISIT(self->shared->workers[i].fetch);
        Py_VISIT(self->shared->workers[i].init_error);
    }
    return 0;
}

/* A cycle through the engine (a dataset holding its loader, whose
 * persistent iterator holds the engine) is broken here: the workers stop
 * first, so none of them runs on with what is cleared. */
static int Engine_clear(EngineObject *self)
{
    engine_release(self);
    return 0;
}

static void Engine_dealloc(EngineObject *self)
{
    PyTypeObject *type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    if (self->weakreflist)
        PyObject_ClearWeakRefs((PyObject *)self);
    engine_release(self);
    type->tp_free(self);
    Py_DECREF(type);
}

static PyObject *Engine_submit(EngineObject *self, PyObject *request)
{
    if (!engine_usable(self))
        return NULL;
    job *j = PyMem_RawCalloc(1, sizeof *j);
    if (!j)
        return PyErr_NoMemory();
    if (self->source) {
        /* (epoch, indices[, batch number]).  A bad index fails this batch,
         * in its turn, as the dataset's own error would in a worker. */
        unsigned long long epoch, number = 0;
        PyObject *indices;
        if (!PyArg_ParseTuple(request, "KO|K:submit", &epoch, &indices, &number)) {
            PyMem_RawFree(j);
            return NULL;
        }
        j->native = fl__native_job_new_mixed(fl__state_of_type(Py_TYPE(self)), self->source,
                                             indices, self->pool, self->seed, epoch, &self->mix,
                                             number);
        if (!j->native)
            j->error = fl__take_exception();
    } else {
        j->request = Py_NewRef(request);
    }
    int rc = fl_engine_submit(self->engine, j, NULL, NULL);
    if (rc == FL_OK)
        Py_RETURN_TRUE;
    job_free(j);
    if (rc == FL_ERR_NO_WORKER)
        Py_RETURN_FALSE;
    if (rc == FL_ERR_CLOSED)
        return closed_error();
    PyErr_Format(PyExc_RuntimeError, "fastload: cannot submit a batch: %s", fl_status_str(rc));
    return NULL;
}

/* A finished native job on the consumer's thread: (JOB_DONE, worker,
 * batch), with the skipped-sample records passed to `report`; or
 * (JOB_FAILED, worker, the exception) when the batch failed. */
static PyObject *native_result(EngineObject *self, job *j, int worker)
{
    PyObject *skipped;
    PyObject *batch = fl__native_job_finish(fl__state_of_type(Py_TYPE(self)), j->native,
                                            self->convert, &skipped);
    if (batch && skipped && self->report != Py_None) {
        PyObject *r = PyObject_CallOneArg(self->report, skipped);
        if (!r)
            Py_CLEAR(batch);
        Py_XDECREF(r);
    }
    Py_XDECREF(skipped);
    if (batch)
        return Py_BuildValue("(iiN)", FL_JOB_DONE, worker, batch);
    PyObject *exc = fl__take_exception();
    return exc ? Py_BuildValue("(iiN)", JOB_FAILED, worker, exc) : NULL;
}

static PyObject *Engine_next(EngineObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    double timeout = -1.0;
    if (nargs > 1) {
        PyErr_SetString(PyExc_TypeError, "next(timeout=None) takes at most 1 argument");
        return NULL;
    }
    if (nargs == 1 && args[0] != Py_None) {
        timeout = PyFloat_AsDouble(args[0]);
        if (timeout == -1.0 && PyErr_Occurred())
            return NULL;
    }
    if (!engine_usable(self))
        return NULL;

    fl_engine *e = self->engine;
    if (self->shared->stats && fl_stats_current_enabled()) {
        /* The queue as the loop asks (loader.stats()). */
        fl_engine_depth_info depth;
        fl_engine_depth(e, &depth);
        fl_stats_note_depth(self->shared->stats, (uint64_t)depth.in_flight,
                            (uint64_t)depth.done, depth.deliverable, depth.idle_at_cap);
    }
    fl_delivery d;
    double waited = 0.0;
    /* Always wait with the GIL released, even when a batch is ready: the
     * release is this thread's yield point, where a worker waiting for the
     * GIL gets to run (measured: keeping the GIL for ready batches starves
     * the workers and loses a third of the throughput). */
    int rc = FL_ERR_TIMEOUT;
    while (rc == FL_ERR_TIMEOUT) {
        double slice = SIGNAL_CHECK_SECONDS;
        if (timeout > 0 && timeout - waited < slice)
            slice = timeout - waited;
        /* Workers of Python jobs step aside while this thread takes the
         * GIL back (see "hand-off priority"). */
        atomic_int *waiting = self->source ? NULL : &self->shared->consumers_waiting;
        Py_BEGIN_ALLOW_THREADS
        rc = fl_engine_next(e, slice, &d);
        if (rc != FL_ERR_TIMEOUT && waiting)
            atomic_fetch_add(waiting, 1);
        Py_END_ALLOW_THREADS
        if (rc != FL_ERR_TIMEOUT) {
            if (waiting)
                atomic_fetch_sub(waiting, 1);
            break;
        }
        if (PyErr_CheckSignals() < 0)
            return NULL; /* KeyboardInterrupt: the batch stays in flight */
        waited += slice;
        if (timeout > 0 && waited >= timeout) {
            PyErr_SetString(PyExc_TimeoutError, "fastload: timed out waiting for a batch");
            return NULL;
        }
    }
    if (rc == FL_ERR_EMPTY)
        Py_RETURN_NONE;
    if (rc != FL_OK)
        return closed_error();

    job *j = d.payload;
    PyObject *out = NULL;
    int native_done = self->source && d.outcome == FL_JOB_DONE && !j->result;
    if (native_done && j->error) {
        out = Py_BuildValue("(iiO)", JOB_FAILED, d.worker, j->error);
    } else if (native_done) {
        out = native_result(self, j, d.worker);
    } else if (j->error && !self->source) {
        fl__raise_exception(j->error);
        j->error = NULL;
    } else {
        PyObject *result = j->result ? j->result : Py_None;
        out = Py_BuildValue("(iiO)", d.outcome, d.worker, result);
    }
    job_free(j);
    return out;
}

static PyObject *Engine_cancel_pending(EngineObject *self, PyObject *unused)
{
    (void)unused;
    if (!engine_usable(self))
        return NULL;
    int n = fl_engine_cancel_pending(self->engine);
    if (n < 0)
        return closed_error();
    return PyLong_FromLong(n);
}

static PyObject *Engine_reset(EngineObject *self, PyObject *unused)
{
    (void)unused;
    if (!engine_usable(self))
        return NULL;
    int rc = fl_engine_reset(self->engine);
    if (rc == FL_ERR_INVALID) {
        PyErr_SetString(PyExc_RuntimeError, "fastload: reset() with batches in flight");
        return NULL;
    }
    if (rc != FL_OK)
        return closed_error();
    Py_RETURN_NONE;
}

static PyObject *Engine_close(EngineObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    double timeout = -1.0;
    if (nargs > 1) {
        PyErr_SetString(PyExc_TypeError, "close(timeout=None) takes at most 1 argument");
        return NULL;
    }
    if (nargs == 1 && args[0] != Py_None) {
        timeout = PyFloat_AsDouble(args[0]);
        if (timeout == -1.0 && PyErr_Occurred())
            return NULL;
        if (timeout < 0) {
            PyErr_SetString(PyExc_ValueError, "close: timeout must be >= 0 or None");
            return NULL;
        }
    }
    if (self->engine && fl_engine_is_own_thread(self->engine)) {
        /* On one of its own workers (the collector finalised the iterator
         * there, or dataset code dropped it): that thread cannot join
         * itself.  The workers are told to stop and exit on their own, as
         * in dealloc; the engine stays allocated for them. */
        if (!self->closed) {
            self->closed = 1;
            fl_engine_abandon(self->engine);
            self->abandoned = 1;
        }
        return PyTuple_New(0);
    }
    char left[MAX_WORKERS];
    int running = engine_close(self, timeout, left);
    PyObject *out = PyTuple_New(running);
    if (!out)
        return NULL;
    /* The worker objects themselves, so the caller can say what each was
     * doing; the detached thread keeps its own reference. */
    for (int i = 0, k = 0; i < self->num_workers && k < running; i++) {
        if (left[i]) {
            PyObject *worker = self->shared->workers[i].worker;
            Py_INCREF(worker);
            PyTuple_SET_ITEM(out, k++, worker);
        }
    }
    return out;
}

static PyObject *Engine_get_in_flight(EngineObject *self, void *closure)
{
    (void)closure;
    return PyLong_FromLong(self->engine && !self->closed ? fl_engine_in_flight(self->engine) : 0);
}


static PyObject *Engine_get_closed(EngineObject *self, void *closure)
{
    (void)closure;
    return PyBool_FromLong(!self->engine || self->closed);
}

static PyObject *Engine_get_active(EngineObject *self, void *closure)
{
    (void)closure;
    if (!engine_usable(self))
        return NULL;
    return PyLong_FromLong(fl_engine_active(self->engine));
}

static int Engine_set_active(EngineObject *self, PyObject *value, void *closure)
{
    (void)closure;
    if (!value) {
        PyErr_SetString(PyExc_AttributeError, "cannot delete Engine.active");
        return -1;
    }
    long active = PyLong_AsLong(value);
    if (active == -1 && PyErr_Occurred())
        return -1;
    if (!engine_usable(self))
        return -1;
    if (active < 1 || active > self->num_workers) {
        PyErr_Format(PyExc_ValueError, "Engine.active must be in 1..%d (num_workers), got %ld",
                     self->num_workers, active);
        return -1;
    }
    if (fl_engine_set_active(self->engine, (int)active) != FL_OK) {
        closed_error();
        return -1;
    }
    return 0;
}

static PyMethodDef Engine_methods[] = {
    {"submit", (PyCFunction)Engine_submit, METH_O,
     "submit(request, /)\n--\n\n"
     "Queues worker.fetch(request) on the next live active worker, round-robin; with\n"
     "a native source, request is (epoch, indices[, batch number]) and the batch\n"
     "runs in C (the number keys the `mix` batch transform's draws).\n"
     "Returns True, or False when every worker has retired (nothing queued)."},
    {"next", (PyCFunction)(void (*)(void))Engine_next, METH_FASTCALL,
     "next(timeout=None, /)\n--\n\n"
     "Waits (GIL released) for the next finished job and returns\n"
     "(outcome, worker, result), or None when nothing is in flight; a native\n"
     "batch that failed is (JOB_FAILED, worker, the exception).  Raises\n"
     "TimeoutError after `timeout` seconds, and whatever fetch raised."},
    {"cancel_pending", (PyCFunction)Engine_cancel_pending, METH_NOARGS,
     "cancel_pending()\n--\n\nDelivers every job no worker has started as cancelled."},
    {"reset", (PyCFunction)Engine_reset, METH_NOARGS,
     "reset()\n--\n\nStarts a new epoch on the same threads (nothing may be in flight)."},
    {"close", (PyCFunction)(void (*)(void))Engine_close, METH_FASTCALL,
     "close(timeout=None, /)\n--\n\n"
     "Stops the worker threads and joins them, waiting at most `timeout`\n"
     "seconds (None: no limit) for each to finish its current job.  Returns\n"
     "the worker objects whose threads were still running then: they are\n"
     "left running, detached.  Idempotent (later calls return ())."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Engine_getset[] = {
    {"in_flight", (getter)Engine_get_in_flight, NULL, "jobs submitted, not yet delivered", NULL},
    {"closed", (getter)Engine_get_closed, NULL, "whether close() has run", NULL},
    {"active", (getter)Engine_get_active, (setter)Engine_set_active,
     "workers that get new jobs: 0..active-1 (jobs queued beyond it still run)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef Engine_members[] = {
    {"__weaklistoffset__", T_PYSSIZET, offsetof(EngineObject, weakreflist), READONLY, NULL},
    {"num_workers", T_INT, offsetof(EngineObject, num_workers), READONLY, "worker threads"},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot Engine_slots[] = {
    {Py_tp_doc, "Engine(workers, max_in_flight, in_order=True, name='fastload-w', *,\n"
                "       source=None, pool=None, convert=None, seed=0, report=None, stats=None,\n"
                "       mix=None, cpus=None)\n--\n\n"
                "Worker threads, one per object in `workers`; each runs that object's\n"
                "start(), fetch(request) per job and stop() on its own thread.  With a\n"
                "native `source`, jobs are its batches instead, made in C into slots\n"
                "of `pool` and wrapped (through `convert`) by next(); `report` gets\n"
                "the skipped-sample records.  `cpus`: the CPU ids every worker thread\n"
                "runs on (OSError naming them when the kernel refuses)."},
    {Py_tp_new, Engine_new},
    {Py_tp_dealloc, Engine_dealloc},
    {Py_tp_traverse, Engine_traverse},
    {Py_tp_clear, Engine_clear},
    {Py_tp_methods, Engine_methods},
    {Py_tp_getset, Engine_getset},
    {Py_tp_members, Engine_members},
    {0, NULL},
};

PyType_Spec fl__Engine_spec = {
    .name = "fastload._C.Engine",
    .basicsize = sizeof(EngineObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .slots = Engine_slots,
};

int fl__engine_module_exec(PyObject *module)
{
    if (PyModule_AddIntConstant(module, "JOB_DONE", FL_JOB_DONE) < 0 ||
        PyModule_AddIntConstant(module, "JOB_SKIPPED", FL_JOB_SKIPPED) < 0 ||
        PyModule_AddIntConstant(module, "JOB_RETIRE", FL_JOB_RETIRE) < 0 ||
        PyModule_AddIntConstant(module, "JOB_CANCELLED", FL_JOB_CANCELLED) < 0 ||
        PyModule_AddIntConstant(module, "JOB_FAILED", JOB_FAILED) < 0)
        return -1;
    return 0;
}
