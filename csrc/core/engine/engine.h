/* fastload core: the engine — a pool of named worker threads that run batch
 * jobs and hand them back in order.
 *
 * The engine knows nothing about what a job does.  The owner submits opaque
 * payloads; each is assigned round-robin to one worker's FIFO (the same rule
 * torch's DataLoader uses for its worker processes, so per-worker state such as
 * an iterable dataset's shard sees the same jobs), run by fl_engine_hooks.run
 * on that worker's thread, and delivered back by fl_engine_next either by
 * submission order (in_order) or by completion order.
 *
 * Active bound: only workers [0, active) receive new jobs (fl_engine_set_active;
 * all of them by default).  Jobs already queued on a worker beyond the bound
 * still run there and are delivered in their turn, so changing it never
 * changes what is delivered or in which order, only which thread does the
 * work.  Retiring (an iterable's end) is per worker, so an owner whose
 * workers retire keeps every worker active.
 *
 * Bounds: at most max_in_flight jobs are submitted and not yet delivered.
 * With in_order == 0 a worker also holds at most max_in_flight / live active
 * workers of them, so one slow worker cannot collect every job.
 *
 * Threads: fl_engine_submit, _set_active, _next, _cancel_pending, _reset, _stop
 * and _free belong to the owner (one thread at a time).  The hooks run on worker
 * threads with no engine lock held.  No call blocks except fl_engine_next
 * (bounded by its timeout), fl_engine_stop (joins the workers) and
 * fl_engine_stop_within (bounded by its timeout).
 *
 * Fork: a child process inherits engines without their threads.  Every call
 * on such an engine returns FL_ERR_CLOSED; fl_engine_stop and fl_engine_free
 * still work.
 */
#ifndef FL_ENGINE_H
#define FL_ENGINE_H

#include <stddef.h>
#include <stdint.h>

typedef struct fl_engine fl_engine;

/* What a job's run hook reports; fl_engine_next hands it back as
 * fl_delivery.outcome. */
typedef enum fl_job_outcome {
    FL_JOB_DONE = 0,      /* ran; the payload holds its result (data or error) */
    FL_JOB_SKIPPED = 1,   /* ran; produced nothing (its worker already retired) */
    FL_JOB_RETIRE = 2,    /* ran; produced nothing, and its worker's input is
                             exhausted: no further job is assigned to it */
    FL_JOB_CANCELLED = 3, /* never ran: cancelled while still queued */
} fl_job_outcome;

typedef struct fl_engine_hooks {
    void *ctx; /* passed to every hook; owned by the engine's owner */
    /* On the worker's own thread, once, before its first job.  May be NULL. */
    void (*worker_start)(void *ctx, int worker);
    /* On the worker's thread, once per job, without any engine lock held.
     * Returns an fl_job_outcome.  Required. */
    int (*run)(void *ctx, int worker, void *payload);
    /* On the worker's thread, once, after its last job.  May be NULL. */
    void (*worker_stop)(void *ctx, int worker);
} fl_engine_hooks;

typedef struct fl_engine_config {
    int num_workers;      /* >= 1 */
    int max_in_flight;    /* >= 1: submitted and not yet delivered */
    int in_order;         /* 1: deliver by submission order; 0: by completion */
    const char *name;     /* thread name prefix ("fastload-w" gives "fastload-w0", ...) */
    const int *cpus;      /* CPU ids every worker thread may run on (its affinity
                             mask, set as it starts); NULL: left as inherited.
                             Borrowed: read during create only */
    int num_cpus;         /* entries in cpus; >= 1 when cpus is set */
} fl_engine_config;

typedef struct fl_delivery {
    void *payload;        /* as submitted; ownership returns to the caller */
    uint64_t seq;         /* submission number, from 0 after create or reset */
    int worker;           /* the worker it was assigned to */
    int outcome;          /* an fl_job_outcome */
} fl_delivery;

/* Starts the workers, each on config->cpus when set (pthread_setaffinity_np
 * before create returns).  Returns FL_OK and sets *out, or FL_ERR_INVALID
 * (also a CPU id outside 0..CPU_SETSIZE-1), FL_ERR_NOMEM, FL_ERR_THREAD, or
 * FL_ERR_AFFINITY when the kernel refused the CPUs (none of them online or
 * allowed to this process); `msg` (may be NULL) then says why.  Nothing is
 * left running on failure. */
int fl_engine_create(const fl_engine_config *config, const fl_engine_hooks *hooks,
                     fl_engine **out, char *msg, size_t msg_size);

/* Queues `payload` on the next live active worker in round-robin order.
 * Returns FL_OK (setting *seq and *worker when not NULL), FL_ERR_FULL when the
 * in-flight bound is reached (nothing queued), FL_ERR_NO_WORKER when every
 * active worker has retired, or FL_ERR_CLOSED. */
int fl_engine_submit(fl_engine *engine, void *payload, uint64_t *seq, int *worker);

/* Lets only workers [0, active) receive new jobs (see the top); takes effect
 * from the next submit, and the round-robin carries on from where it was
 * (from worker 0 when that is now beyond the bound).  Returns FL_OK,
 * FL_ERR_INVALID unless 1 <= active <= num_workers, or FL_ERR_CLOSED. */
int fl_engine_set_active(fl_engine *engine, int active);

/* The current active bound (num_workers unless set). */
int fl_engine_active(fl_engine *engine);

/* Waits up to timeout_s seconds (< 0: forever) for the next delivery.
 * Returns FL_OK and fills *out, FL_ERR_EMPTY when nothing is in flight,
 * FL_ERR_TIMEOUT, or FL_ERR_CLOSED. */
int fl_engine_next(fl_engine *engine, double timeout_s, fl_delivery *out);

/* Marks every job that no worker has started as FL_JOB_CANCELLED, ready for
 * delivery.  Jobs already running finish normally.  Returns the number
 * cancelled, or FL_ERR_CLOSED. */
int fl_engine_cancel_pending(fl_engine *engine);

/* Starts a new epoch on the same threads: sequence numbers restart at 0, the
 * round-robin restarts at worker 0 and retired workers are live again.
 * Requires nothing in flight (FL_ERR_INVALID otherwise). */
int fl_engine_reset(fl_engine *engine);

/* Number of jobs submitted and not yet delivered. */
int fl_engine_in_flight(fl_engine *engine);

/* The queue as the consumer asks for a job, read together (loader.stats()). */
typedef struct fl_engine_depth_info {
    int in_flight;   /* fl_engine_in_flight */
    int done;        /* of those, finished (or cancelled) and waiting for delivery */
    int deliverable; /* the next delivery is among them (in order, only the oldest is) */
    int idle_at_cap; /* a live worker has nothing to do while in_flight is at the
                        capacity (max_in_flight): only the cap keeps it idle */
} fl_engine_depth_info;

void fl_engine_depth(fl_engine *engine, fl_engine_depth_info *out);

/* Nonzero when called on one of this engine's worker threads. */
int fl_engine_is_own_thread(const fl_engine *engine);

/* Asks the workers to exit after their current job and joins them.  Queued
 * jobs are not run.  Idempotent.  Must not be called on a worker thread of
 * the same engine (see fl_engine_abandon). */
void fl_engine_stop(fl_engine *engine);

/* fl_engine_stop with a bound: waits at most timeout_s seconds (< 0: no
 * limit) for the workers to finish their current job, and joins those that
 * did.  Returns 0 when every worker is joined (the engine is then stopped),
 * else the number still running: fl_engine_worker_running names them, and
 * the owner may call this again or let them go with fl_engine_abandon. */
int fl_engine_stop_within(fl_engine *engine, double timeout_s);

/* Nonzero while worker `worker`'s thread is started and neither joined nor
 * detached.  Owner only. */
int fl_engine_worker_running(const fl_engine *engine, int worker);

/* After fl_engine_stop or fl_engine_abandon: hands back, one per call, every
 * payload that was submitted and not delivered, except those a detached
 * worker is still running (it still uses them; they are never handed back).
 * Returns FL_OK or FL_ERR_EMPTY when none is left. */
int fl_engine_take_leftover(fl_engine *engine, void **payload);

/* Frees a stopped engine (one that fl_engine_stop joined, or one inherited
 * by a forked child).  Leftover payloads not taken are the caller's loss. */
void fl_engine_free(fl_engine *engine);

/* For the cases where the owner cannot join the workers: it runs on one of
 * the engine's own worker threads, or fl_engine_stop_within left workers
 * running (stuck in a job).  Asks the workers to exit and detaches those not
 * yet joined.  The engine must then never be freed, because the detached
 * workers still use it (a deliberate leak); payloads are left with the
 * caller (see fl_engine_take_leftover). */
void fl_engine_abandon(fl_engine *engine);

#endif /* FL_ENGINE_H */
