/* fastload core: the engine (see engine.h for the contract).
 *
 * State lives in one struct guarded by one mutex, `lock`.  Jobs sit in
 * max_in_flight records: a record is FREE, QUEUED on one worker's FIFO,
 * RUNNING, or DONE and waiting for delivery.  In order, job `seq` uses record
 * seq % capacity: deliveries go by seq, so the undelivered seqs always span
 * fewer than `capacity` numbers and never share a record.  Out of order, an
 * old job may still run while newer ones are delivered, so records come from
 * a free list instead.
 *
 * Condition variables: each worker sleeps on its own `wake` (so a submit wakes
 * exactly the worker it queued for); the owner sleeps on `done` in
 * fl_engine_next and, waiting for workers to exit, in fl_engine_stop_within.  Run hooks are called with `lock` released; the lock is
 * never held across anything that can block on another lock (the GIL
 * included).
 */
#define _GNU_SOURCE /* pthread_setname_np, pthread_setaffinity_np, cpu_set_t */
#include "core/engine/engine.h"

#include "core/engine/forksafe.h"
#include "core/observe/nvtx.h"
#include "core/observe/stats.h"
#include "core/status.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum job_state { JOB_FREE, JOB_QUEUED, JOB_RUNNING, JOB_DONE };

typedef struct job {
    void *payload;   /* owned by the engine's owner; the engine only carries it */
    uint64_t seq;
    int worker;
    int outcome;     /* an fl_job_outcome, valid once DONE */
    int state;       /* enum job_state */
    int next;        /* next record in a worker FIFO or in the done list; -1 ends */
} job;

typedef struct worker {
    fl_engine *engine;
    int id;
    pthread_t thread;
    int started;     /* thread created and not yet joined or detached; owner only */
    int exited;      /* the thread is past its last use of the engine; guarded by lock */
    pthread_cond_t wake;
    int head, tail;  /* FIFO of queued records; guarded by lock */
    int assigned;    /* queued, running or done-undelivered jobs; guarded by lock */
    int retired;     /* input exhausted: no new jobs; guarded by lock */
} worker;

struct fl_engine {
    pthread_mutex_t lock;
    pthread_cond_t done;       /* signalled when a job becomes deliverable or a
                                  worker exits */
    fl__fork_entry fork_entry; /* keeps `lock` usable in a forked child */

    fl_engine_hooks hooks;
    int num_workers;
    int capacity;              /* == max_in_flight: ring size */
    int in_order;
    char name[16];

    /* Everything below is guarded by lock. */
    job *jobs;                 /* ring of `capacity` records */
    worker *workers;
    uint64_t next_seq;         /* seq of the next submission */
    uint64_t deliver_seq;      /* in_order: seq of the next delivery */
    int done_head, done_tail;  /* !in_order: completed records, oldest first */
    int free_head, free_tail;  /* !in_order: FREE records */
    int in_flight;             /* submitted, not yet delivered */
    int rr_cursor;             /* next worker the round-robin considers */
    int active;                /* only workers [0, active) get new jobs */
    int stopping;              /* workers must exit */
    int stopped;               /* workers joined (or gone with a fork) */
    int forked;                /* this is a child's copy: no threads */
};

static _Thread_local const fl_engine *current_engine; /* set on worker threads */

/* ---------------------------------------------------------------- helpers */

static void abs_deadline(double timeout_s, struct timespec *ts)
{
    clock_gettime(CLOCK_MONOTONIC, ts);
    time_t whole = (time_t)timeout_s;
    long nanos = (long)((timeout_s - (double)whole) * 1e9);
    ts->tv_sec += whole;
    ts->tv_nsec += nanos;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec += 1;
        ts->tv_nsec -= 1000000000L;
    }
}

static int init_cond_monotonic(pthread_cond_t *cond)
{
    pthread_condattr_t attr;
    if (pthread_condattr_init(&attr) != 0)
        return -1;
    int rc = pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    if (rc == 0)
        rc = pthread_cond_init(cond, &attr);
    pthread_condattr_destroy(&attr);
    return rc == 0 ? 0 : -1;
}

static void fifo_push(fl_engine *e, int *head, int *tail, int rec)
{
    e->jobs[rec].next = -1;
    if (*tail < 0)
        *head = rec;
    else
        e->jobs[*tail].next = rec;
    *tail = rec;
}

static int fifo_pop(fl_engine *e, int *head, int *tail)
{
    int rec = *head;
    if (rec >= 0) {
        *head = e->jobs[rec].next;
        if (*head < 0)
            *tail = -1;
    }
    return rec;
}

/* Marks a record deliverable and wakes the owner.  Called with lock held. */
static void complete_locked(fl_engine *e, int rec, int outcome)
{
    job *j = &e->jobs[rec];
    j->outcome = outcome;
    j->state = JOB_DONE;
    if (!e->in_order)
        fifo_push(e, &e->done_head, &e->done_tail, rec);
    pthread_cond_signal(&e->done);
}

/* Returns a delivered (or discarded) record to FREE.  Lock held. */
static void release_record_locked(fl_engine *e, int rec)
{
    e->jobs[rec].payload = NULL;
    e->jobs[rec].state = JOB_FREE;
    if (!e->in_order)
        fifo_push(e, &e->free_head, &e->free_tail, rec);
}

/* ---------------------------------------------------------------- workers */

/* Names the worker's thread in NVTX timelines.  A function of its own, not
 * inlined: worker_main's frame must hold no array, because a worker that
 * CPython ends with pthread_exit (it asked for the GIL during finalization)
 * never returns from it, and AddressSanitizer would find that frame's
 * redzones still poisoned as the thread's stack is torn down. */
static __attribute__((noinline)) void name_in_nvtx(const fl_engine *e, int id)
{
    char name[32];
    snprintf(name, sizeof name, "%s%d", e->name, id);
    fl_nvtx_name_thread(name);
}

static void *worker_main(void *arg)
{
    worker *w = arg;
    fl_engine *e = w->engine;
    current_engine = e;

    if (e->hooks.worker_start)
        e->hooks.worker_start(e->hooks.ctx, w->id);
    /* The start hook may bind this thread's timers (stats.h). */
    fl_stats_row *timers = fl_stats_current();
    uint64_t t = timers ? fl_stats_now() : 0;
    if (fl_nvtx_on())
        name_in_nvtx(e, w->id);

    pthread_mutex_lock(&e->lock);
    for (;;) {
        while (!e->stopping && w->head < 0)
            pthread_cond_wait(&w->wake, &e->lock);
        if (e->stopping)
            break;
        int rec = fifo_pop(e, &w->head, &w->tail);
        job *j = &e->jobs[rec];
        j->state = JOB_RUNNING;
        void *payload = j->payload;
        pthread_mutex_unlock(&e->lock);

        if (timers) {
            uint64_t now = fl_stats_now();
            fl_stats_add_activity(timers, FL_IDLE, now - t);
            t = now;
        }
        int ranged = timers && fl_nvtx_on();
        if (ranged)
            fl_nvtx_push("fastload batch");
        int outcome = e->hooks.run(e->hooks.ctx, w->id, payload);
        if (ranged)
            fl_nvtx_pop();
        if (timers) {
            uint64_t now = fl_stats_now();
            fl_stats_add_job(timers, t, now);
            t = now;
        }

        pthread_mutex_lock(&e->lock);
        if (outcome == FL_JOB_RETIRE)
            w->retired = 1;
        complete_locked(e, rec, outcome);
    }
    pthread_mutex_unlock(&e->lock);

    if (e->hooks.worker_stop)
        e->hooks.worker_stop(e->hooks.ctx, w->id);
    current_engine = NULL;

    /* Last touch of the engine: after this the owner may join and free it. */
    pthread_mutex_lock(&e->lock);
    w->exited = 1;
    pthread_cond_broadcast(&e->done);
    pthread_mutex_unlock(&e->lock);
    return NULL;
}

static void after_fork_child(void *arg)
{
    fl_engine *e = arg;
    /* The workers do not exist in the child.  Condition variables may record
     * waiters from the parent, so they are made anew. */
    e->forked = 1;
    e->stopping = 1;
    e->stopped = 1;
    pthread_cond_init(&e->done, NULL);
    for (int i = 0; i < e->num_workers; i++) {
        pthread_cond_init(&e->workers[i].wake, NULL);
        e->workers[i].started = 0;
    }
}

/* ------------------------------------------------------------- lifecycle */

static void free_memory(fl_engine *e)
{
    if (e->workers) {
        for (int i = 0; i < e->num_workers; i++)
            pthread_cond_destroy(&e->workers[i].wake);
    }
    free(e->workers);
    free(e->jobs);
    pthread_cond_destroy(&e->done);
    pthread_mutex_destroy(&e->lock);
    free(e);
}

/* Writes the CPU list "0-3,8" of cpus into buf (cut short when it does not
 * fit); for messages. */
static void format_cpus(const int *cpus, int n, char *buf, size_t size)
{
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < n && used + 1 < size; i++) {
        int first = cpus[i];
        while (i + 1 < n && cpus[i + 1] == cpus[i] + 1)
            i++;
        int w = first == cpus[i] ? snprintf(buf + used, size - used, "%s%d", used ? "," : "", first)
                                 : snprintf(buf + used, size - used, "%s%d-%d", used ? "," : "",
                                            first, cpus[i]);
        if (w < 0)
            break;
        used += (size_t)w;
    }
}

/* Puts the started worker thread on the configured CPUs.  Returns FL_OK or
 * FL_ERR_AFFINITY with msg naming the CPUs and the kernel's reason. */
static int set_affinity(const fl_engine_config *config, pthread_t thread, int id, char *msg,
                        size_t msg_size)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int k = 0; k < config->num_cpus; k++)
        CPU_SET((size_t)config->cpus[k], &set);
    int err = pthread_setaffinity_np(thread, sizeof set, &set);
    if (err == 0)
        return FL_OK;
    char list[256];
    format_cpus(config->cpus, config->num_cpus, list, sizeof list);
    fl_set_msg(msg, msg_size, "fl_engine_create: cannot run worker thread %d on CPUs %s: %s", id,
               list, strerror(err));
    return FL_ERR_AFFINITY;
}

int fl_engine_create(const fl_engine_config *config, const fl_engine_hooks *hooks,
                     fl_engine **out, char *msg, size_t msg_size)
{
    if (!config || !hooks || !hooks->run || !out || config->num_workers < 1 ||
        config->max_in_flight < 1 || (config->cpus && config->num_cpus < 1))
        return FL_ERR_INVALID;
    for (int k = 0; config->cpus && k < config->num_cpus; k++)
        if (config->cpus[k] < 0 || config->cpus[k] >= CPU_SETSIZE)
            return FL_ERR_INVALID;

    fl_engine *e = calloc(1, sizeof *e);
    if (!e)
        return FL_ERR_NOMEM;
    e->hooks = *hooks;
    e->num_workers = config->num_workers;
    e->active = config->num_workers;
    e->capacity = config->max_in_flight;
    e->in_order = config->in_order != 0;
    snprintf(e->name, sizeof e->name, "%s", config->name ? config->name : "fastload-w");
    e->done_head = e->done_tail = -1;
    e->free_head = e->free_tail = -1;

    /* Each init below is undone by free_memory, which tolerates a partly
     * built engine only in the order used here: so build in that order. */
    if (pthread_mutex_init(&e->lock, NULL) != 0) {
        free(e);
        return FL_ERR_NOMEM;
    }
    if (init_cond_monotonic(&e->done) != 0) {
        pthread_mutex_destroy(&e->lock);
        free(e);
        return FL_ERR_NOMEM;
    }
    e->jobs = calloc((size_t)e->capacity, sizeof *e->jobs);
    e->workers = calloc((size_t)e->num_workers, sizeof *e->workers);
    if (!e->jobs || !e->workers) {
        free(e->jobs);
        free(e->workers);
        e->jobs = NULL;
        e->workers = NULL;
        free_memory(e);
        return FL_ERR_NOMEM;
    }
    if (!e->in_order) {
        for (int i = 0; i < e->capacity; i++)
            fifo_push(e, &e->free_head, &e->free_tail, i);
    }
    for (int i = 0; i < e->num_workers; i++) {
        worker *w = &e->workers[i];
        w->engine = e;
        w->id = i;
        w->head = w->tail = -1;
        if (init_cond_monotonic(&w->wake) != 0) {
            for (int k = 0; k < i; k++)
                pthread_cond_destroy(&e->workers[k].wake);
            free(e->workers);
            e->workers = NULL;
            free_memory(e);
            return FL_ERR_NOMEM;
        }
    }

    e->fork_entry.mutex = &e->lock;
    e->fork_entry.after_fork_child = after_fork_child;
    e->fork_entry.arg = e;
    if (fl__fork_register(&e->fork_entry) != 0) {
        free_memory(e);
        return FL_ERR_THREAD;
    }

    /* Workers must never take a signal meant for the main thread (Ctrl-C is
     * handled there), so they start with every signal blocked, except those
     * a fault raises in the faulting thread itself: blocked, these end the
     * process without running any handler (the gather's bus-error guard,
     * faulthandler). */
    sigset_t all, saved;
    sigfillset(&all);
    sigdelset(&all, SIGBUS);
    sigdelset(&all, SIGSEGV);
    sigdelset(&all, SIGFPE);
    sigdelset(&all, SIGILL);
    pthread_sigmask(SIG_SETMASK, &all, &saved);
    int failed = 0;
    for (int i = 0; i < e->num_workers && !failed; i++) {
        worker *w = &e->workers[i];
        failed = pthread_create(&w->thread, NULL, worker_main, w) != 0 ? FL_ERR_THREAD : 0;
        w->started = !failed;
        /* Set from here, not by the thread itself, so a refusal is known
         * before create returns; the thread may run its start hook on the
         * inherited CPUs first, never a job (none is submitted yet). */
        if (!failed && config->cpus)
            failed = set_affinity(config, w->thread, i, msg, msg_size);
        if (w->started) {
            /* Named here rather than by the thread itself, so the name is in
             * place before create returns.  Linux keeps 15 characters; the
             * label is best effort. */
            char name[32];
            snprintf(name, sizeof name, "%s%d", e->name, i);
            name[15] = '\0';
            pthread_setname_np(w->thread, name);
        }
    }
    pthread_sigmask(SIG_SETMASK, &saved, NULL);

    if (failed) {
        fl_engine_stop(e);
        fl_engine_free(e);
        return failed;
    }
    *out = e;
    return FL_OK;
}

void fl_engine_stop(fl_engine *e)
{
    (void)fl_engine_stop_within(e, -1.0);
}

/* Workers started and not yet past their last use of the engine.  Lock held. */
static int count_running_locked(const fl_engine *e)
{
    int running = 0;
    for (int i = 0; i < e->num_workers; i++)
        running += e->workers[i].started && !e->workers[i].exited;
    return running;
}

int fl_engine_stop_within(fl_engine *e, double timeout_s)
{
    struct timespec deadline;
    if (timeout_s >= 0)
        abs_deadline(timeout_s, &deadline);

    pthread_mutex_lock(&e->lock);
    if (e->stopped) {
        pthread_mutex_unlock(&e->lock);
        return 0;
    }
    e->stopping = 1;
    for (int i = 0; i < e->num_workers; i++)
        pthread_cond_signal(&e->workers[i].wake);
    pthread_cond_broadcast(&e->done); /* an owner thread waiting in next() */
    /* A worker inside a job exits when the job returns; one stuck there may
     * never do so, hence the bound. */
    while (count_running_locked(e) > 0) {
        int wrc = timeout_s >= 0 ? pthread_cond_timedwait(&e->done, &e->lock, &deadline)
                                 : pthread_cond_wait(&e->done, &e->lock);
        if (wrc == ETIMEDOUT)
            break;
    }
    pthread_mutex_unlock(&e->lock);

    /* Join the exited workers (quick: they are past their last lock). */
    int running = 0;
    for (int i = 0; i < e->num_workers; i++) {
        worker *w = &e->workers[i];
        if (!w->started)
            continue;
        pthread_mutex_lock(&e->lock);
        int exited = w->exited;
        pthread_mutex_unlock(&e->lock);
        if (exited) {
            pthread_join(w->thread, NULL);
            w->started = 0;
        } else {
            running++;
        }
    }

    if (running == 0) {
        pthread_mutex_lock(&e->lock);
        e->stopped = 1;
        pthread_mutex_unlock(&e->lock);
    }
    return running;
}

int fl_engine_worker_running(const fl_engine *e, int worker)
{
    return worker >= 0 && worker < e->num_workers && e->workers[worker].started;
}

void fl_engine_abandon(fl_engine *e)
{
    pthread_mutex_lock(&e->lock);
    e->stopping = 1;
    for (int i = 0; i < e->num_workers; i++) {
        pthread_cond_signal(&e->workers[i].wake);
        if (e->workers[i].started)
            pthread_detach(e->workers[i].thread);
        e->workers[i].started = 0;
    }
    pthread_mutex_unlock(&e->lock);
    fl__fork_unregister(&e->fork_entry);
}

int fl_engine_take_leftover(fl_engine *e, void **payload)
{
    pthread_mutex_lock(&e->lock);
    for (int i = 0; i < e->capacity; i++) {
        job *j = &e->jobs[i];
        /* RUNNING only on a detached worker (a joined one finished its job):
         * that worker still uses the payload. */
        if (j->state != JOB_FREE && j->state != JOB_RUNNING) {
            *payload = j->payload;
            release_record_locked(e, i);
            e->in_flight--;
            pthread_mutex_unlock(&e->lock);
            return FL_OK;
        }
    }
    pthread_mutex_unlock(&e->lock);
    return FL_ERR_EMPTY;
}

void fl_engine_free(fl_engine *e)
{
    if (!e)
        return;
    fl__fork_unregister(&e->fork_entry);
    free_memory(e);
}

/* ------------------------------------------------------------------ owner */

/* Picks the worker for the next job: the next live one among the active
 * ones in round-robin order; out of order, also one with room (torch's rule:
 * fewer than max_in_flight / live workers jobs).  Returns -1 when none
 * qualifies.  Called with lock held. */
static int pick_worker_locked(fl_engine *e)
{
    int live = 0;
    for (int i = 0; i < e->active; i++)
        live += !e->workers[i].retired;
    if (live == 0)
        return -1;
    if (e->rr_cursor >= e->active) /* the bound shrank below the cursor */
        e->rr_cursor = 0;
    for (int tries = 0; tries < e->active; tries++) {
        int w = e->rr_cursor;
        e->rr_cursor = (e->rr_cursor + 1) % e->active;
        if (e->workers[w].retired)
            continue;
        if (e->in_order || e->workers[w].assigned < e->capacity / live)
            return w;
    }
    return -1;
}

int fl_engine_set_active(fl_engine *e, int active)
{
    if (active < 1 || active > e->num_workers)
        return FL_ERR_INVALID;
    pthread_mutex_lock(&e->lock);
    int rc = FL_OK;
    if (e->stopping || e->forked)
        rc = FL_ERR_CLOSED;
    else
        e->active = active;
    pthread_mutex_unlock(&e->lock);
    return rc;
}

int fl_engine_active(fl_engine *e)
{
    pthread_mutex_lock(&e->lock);
    int active = e->active;
    pthread_mutex_unlock(&e->lock);
    return active;
}

int fl_engine_submit(fl_engine *e, void *payload, uint64_t *seq, int *worker_out)
{
    pthread_mutex_lock(&e->lock);
    int rc = FL_OK;
    if (e->stopping || e->forked) {
        rc = FL_ERR_CLOSED;
        goto out;
    }
    if (e->in_flight >= e->capacity) {
        rc = FL_ERR_FULL;
        goto out;
    }
    int w = pick_worker_locked(e);
    if (w < 0) {
        rc = FL_ERR_NO_WORKER;
        goto out;
    }
    uint64_t s = e->next_seq++;
    /* The in-flight bound guarantees a free record (see the top). */
    int rec = e->in_order ? (int)(s % (uint64_t)e->capacity)
                          : fifo_pop(e, &e->free_head, &e->free_tail);
    job *j = &e->jobs[rec];
    j->payload = payload;
    j->seq = s;
    j->worker = w;
    j->outcome = FL_JOB_DONE;
    j->state = JOB_QUEUED;
    e->in_flight++;
    e->workers[w].assigned++;
    fifo_push(e, &e->workers[w].head, &e->workers[w].tail, rec);
    pthread_cond_signal(&e->workers[w].wake);
    if (seq)
        *seq = s;
    if (worker_out)
        *worker_out = w;
out:
    pthread_mutex_unlock(&e->lock);
    return rc;
}

/* The record to deliver next, or -1 when it is not ready.  Lock held. */
static int deliverable_locked(fl_engine *e)
{
    if (e->in_order) {
        int rec = (int)(e->deliver_seq % (uint64_t)e->capacity);
        return e->jobs[rec].state == JOB_DONE && e->jobs[rec].seq == e->deliver_seq
                   ? rec
                   : -1;
    }
    return e->done_head;
}

int fl_engine_next(fl_engine *e, double timeout_s, fl_delivery *out)
{
    struct timespec deadline;
    if (timeout_s >= 0)
        abs_deadline(timeout_s, &deadline);

    pthread_mutex_lock(&e->lock);
    int rc = FL_OK;
    int rec;
    for (;;) {
        if (e->forked) {
            rc = FL_ERR_CLOSED;
            goto out;
        }
        if (e->in_flight == 0) {
            rc = FL_ERR_EMPTY;
            goto out;
        }
        rec = deliverable_locked(e);
        if (rec >= 0)
            break;
        if (e->stopping) { /* nothing more will complete */
            rc = FL_ERR_CLOSED;
            goto out;
        }
        int wrc = timeout_s >= 0 ? pthread_cond_timedwait(&e->done, &e->lock, &deadline)
                                 : pthread_cond_wait(&e->done, &e->lock);
        if (wrc == ETIMEDOUT && deliverable_locked(e) < 0) {
            rc = FL_ERR_TIMEOUT;
            goto out;
        }
    }

    job *j = &e->jobs[rec];
    if (e->in_order)
        e->deliver_seq++;
    else
        fifo_pop(e, &e->done_head, &e->done_tail);
    out->payload = j->payload;
    out->seq = j->seq;
    out->worker = j->worker;
    out->outcome = j->outcome;
    release_record_locked(e, rec);
    e->in_flight--;
    e->workers[j->worker].assigned--;
out:
    pthread_mutex_unlock(&e->lock);
    return rc;
}

int fl_engine_cancel_pending(fl_engine *e)
{
    pthread_mutex_lock(&e->lock);
    int cancelled = 0;
    if (e->forked) {
        pthread_mutex_unlock(&e->lock);
        return FL_ERR_CLOSED;
    }
    for (int i = 0; i < e->num_workers; i++) {
        worker *w = &e->workers[i];
        int rec;
        while ((rec = fifo_pop(e, &w->head, &w->tail)) >= 0) {
            complete_locked(e, rec, FL_JOB_CANCELLED);
            cancelled++;
        }
    }
    pthread_mutex_unlock(&e->lock);
    return cancelled;
}

int fl_engine_reset(fl_engine *e)
{
    pthread_mutex_lock(&e->lock);
    int rc = FL_OK;
    if (e->forked || e->stopping)
        rc = FL_ERR_CLOSED;
    else if (e->in_flight != 0)
        rc = FL_ERR_INVALID;
    else {
        e->next_seq = e->deliver_seq = 0;
        e->done_head = e->done_tail = -1;
        e->rr_cursor = 0;
        for (int i = 0; i < e->num_workers; i++)
            e->workers[i].retired = 0;
    }
    pthread_mutex_unlock(&e->lock);
    return rc;
}

int fl_engine_in_flight(fl_engine *e)
{
    pthread_mutex_lock(&e->lock);
    int n = e->in_flight;
    pthread_mutex_unlock(&e->lock);
    return n;
}

/* Whether live worker `w` has nothing queued and nothing running.  Lock held. */
static int idle_locked(const fl_engine *e, int w)
{
    const worker *wk = &e->workers[w];
    if (wk->retired || !wk->started || wk->exited || wk->head >= 0)
        return 0;
    for (int i = 0; i < e->capacity; i++)
        if (e->jobs[i].state == JOB_RUNNING && e->jobs[i].worker == w)
            return 0;
    return 1;
}

void fl_engine_depth(fl_engine *e, fl_engine_depth_info *out)
{
    pthread_mutex_lock(&e->lock);
    int n = 0;
    for (int i = 0; i < e->capacity; i++)
        n += e->jobs[i].state == JOB_DONE;
    out->in_flight = e->in_flight;
    out->done = n;
    out->deliverable = !e->forked && deliverable_locked(e) >= 0;
    /* Only when the consumer must wait: the scan is per worker and record. */
    out->idle_at_cap = 0;
    if (!out->deliverable && e->in_flight >= e->capacity)
        for (int w = 0; w < e->active && !out->idle_at_cap; w++)
            out->idle_at_cap = idle_locked(e, w);
    pthread_mutex_unlock(&e->lock);
}

int fl_engine_is_own_thread(const fl_engine *e)
{
    return current_engine == e;
}
