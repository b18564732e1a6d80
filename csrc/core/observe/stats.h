/* fastload core: where a loader's time goes — per-stage and per-worker
 * timers, cheap enough to stay on.
 *
 * A loader owns one fl_stats: a row per worker (and one for work done on the
 * consumer's thread), plus the consumer's side.  Code doing the work finds
 * its row through a thread-local binding (fl_stats_bind), so the pipeline
 * needs no extra argument: an engine worker binds its row as it starts, the
 * consumer binds the extra row around a batch it makes itself.  Unbound
 * threads, and every thread while timing is switched off, record nothing
 * and read no clock.
 *
 * Each row has one writer at a time (the thread bound to it); readers take
 * snapshots while it writes.  Counters are relaxed atomics, so a snapshot is
 * a consistent value per counter, not across counters — fine for totals.
 *
 * Lifetime: reference-counted, because engine threads may outlive the
 * Python object that made them (a detached worker keeps its row).
 *
 * Stages are bracketed by an fl_stage_clock, which also feeds a profiler
 * while one listens: the trace (fl_trace_start, events with start and end
 * times per thread, merged into torch.profiler's trace by fastload/profiler)
 * and NVTX ranges (nvtx.h).
 */
#ifndef FL_STATS_H
#define FL_STATS_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h> /* clockid_t */

/* What a worker spends its time on.  READ, DECODE and TRANSFORM are the
 * native image pipeline's; COLLATE is default collation (or an array
 * gather, which reads rows straight into the batch); DATASET is the
 * Python dataset's own code; UPLOAD the host-to-device copy. */
typedef enum fl_stage {
    FL_STAGE_READ,
    FL_STAGE_DECODE,
    FL_STAGE_TRANSFORM,
    FL_STAGE_COLLATE,
    FL_STAGE_DATASET,
    FL_STAGE_UPLOAD,
    FL_STAGES
} fl_stage;

/* A worker's whole time is BUSY (running a job) or IDLE (waiting for one);
 * GIL is the part of BUSY spent waiting for the interpreter lock, CPU the
 * processor time its thread used (an idle worker sleeps, so that is CPU
 * while BUSY; the rest of BUSY it waited: for I/O, a sleep, a lock).  CPU
 * is read from the thread's CPU clock when the row is read, not per job. */
typedef enum fl_activity { FL_BUSY, FL_IDLE, FL_GIL, FL_CPU, FL_ACTIVITIES } fl_activity;

/* The consumer's wait per batch: a log-linear histogram, 8 buckets per
 * power of two (each under 12.5 % wide), from 1 ns to 2^64 ns. */
#define FL_STATS_SUB_BUCKETS 8
#define FL_STATS_BUCKETS (64 * FL_STATS_SUB_BUCKETS)

typedef struct fl_stats_row {
    _Atomic uint64_t stage_ns[FL_STAGES];
    _Atomic uint64_t stage_calls[FL_STAGES];
    _Atomic uint64_t activity_ns[FL_ACTIVITIES]; /* CPU: of threads no longer bound */
    _Atomic uint64_t jobs;
    /* The worker thread bound now (fl_stats_bind_worker), guarded by the
     * block's cpu_lock: its CPU clock, and that clock when it was bound. */
    int cpu_live;
    clockid_t cpu_clock;
    uint64_t cpu_at_bind;
} fl_stats_row;

typedef struct fl_stats_consumer {
    uint64_t batches;
    uint64_t wait_ns;        /* in next(), waiting for a batch */
    uint64_t period_ns;      /* from one batch handed over to the next */
    uint64_t depth_samples;  /* times the queue was looked at as the loop asked */
    uint64_t in_flight_sum;  /* batches in flight then */
    uint64_t ready_sum;      /* of them, finished and waiting */
    uint64_t empty_asks;     /* asks that found no batch to deliver at once */
    uint64_t idle_at_cap_asks; /* of them, with a worker idle only because the
                                  in-flight cap was reached (prefetch_factor) */
    uint64_t starved_wait_ns; /* the wait of batches asked for when none was
                                 deliverable: waiting for a worker, not the hand-off */
    int starved;             /* the batch being asked for found none deliverable */
    uint64_t wait_hist[FL_STATS_BUCKETS];
} fl_stats_consumer;

typedef struct fl_stats {
    atomic_int refs;
    int num_rows;
    pthread_mutex_t cpu_lock; /* the rows' cpu_* fields */
    fl_stats_consumer consumer;  /* the consumer's thread only (the GIL) */
    fl_stats_row rows[];
} fl_stats;

/* A block of `num_rows` zeroed rows, one reference held.  NULL: no memory. */
fl_stats *fl_stats_new(int num_rows);
void fl_stats_retain(fl_stats *stats);
void fl_stats_release(fl_stats *stats);

/* Zeroes one row's counters. */
void fl_stats_row_zero(fl_stats_row *row);

/* Zeroes every counter (the readers' window restarts).  A worker adding at
 * that instant may keep its own previous total: a window is approximate. */
void fl_stats_reset(fl_stats *stats);

/* Process-wide switch, on by default (off only to measure what it costs). */
void fl_stats_set_enabled(int enabled);

/* Binds `row` (or NULL) to the calling thread; returns the previous one. */
fl_stats_row *fl_stats_bind(fl_stats_row *row);

/* For a worker thread's whole life: binds row `r` of `stats` and counts the
 * thread's CPU time into it from now; unbind_worker, on the same thread,
 * adds what it used and unbinds. */
void fl_stats_bind_worker(fl_stats *stats, int r);
void fl_stats_unbind_worker(fl_stats *stats, int r);

/* Row r's CPU time: that of the threads it had, and of the one bound now. */
uint64_t fl_stats_row_cpu(fl_stats *stats, int r);

/* The calling thread's row, or NULL when none is bound or timing is off. */
fl_stats_row *fl_stats_current(void);

/* Whether timing is on (fl_stats_set_enabled). */
int fl_stats_current_enabled(void);

/* CLOCK_MONOTONIC, in nanoseconds. */
uint64_t fl_stats_now(void);

/* Adds ns to a stage (one call) or an activity of a row. */
void fl_stats_add_stage(fl_stats_row *row, fl_stage stage, uint64_t ns);
void fl_stats_add_activity(fl_stats_row *row, fl_activity activity, uint64_t ns);
/* One job ran from start_ns to end_ns. */
void fl_stats_add_job(fl_stats_row *row, uint64_t start_ns, uint64_t end_ns);

/* The thread waited for the GIL from start_ns to end_ns. */
void fl_stats_add_gil_wait(fl_stats_row *row, uint64_t start_ns, uint64_t end_ns);

/* Brackets the stages of a piece of work on one thread:
 *     fl_stage_clock c;
 *     fl_stage_begin(&c, FL_STAGE_DECODE);
 *     ... fl_stage_next(&c, FL_STAGE_TRANSFORM); ...
 *     fl_stage_end(&c);          (also on every early return)
 * One clock read per boundary; nothing at all on a thread with no row. */
typedef struct fl_stage_clock {
    fl_stats_row *row; /* NULL: not timing */
    uint64_t since;    /* when the open stage began */
    int stage;         /* the open stage, or -1 */
    int pushed;        /* an NVTX range is open for it */
} fl_stage_clock;

void fl_stage_begin(fl_stage_clock *clock, fl_stage stage);
/* Pushes the NVTX range of a stage or trace kind ("fastload <name>"). */
void fl_stats_nvtx_push(int kind);
void fl_stage_next(fl_stage_clock *clock, fl_stage stage);
void fl_stage_end(fl_stage_clock *clock);

/* ------------------------------------------------------------ the trace */

/* Trace events beyond the stages. */
enum { FL_EVENT_JOB = FL_STAGES, FL_EVENT_GIL, FL_EVENT_KINDS };

typedef struct fl_trace_event {
    uint64_t start_ns, end_ns; /* fl_stats_now() */
    int32_t kind;              /* an fl_stage or FL_EVENT_* */
    int32_t tid;               /* the thread's id (gettid) */
} fl_trace_event;

/* Starts recording events (at most `capacity` until taken; more are
 * dropped and counted).  Returns FL_OK or FL_ERR_NOMEM. */
int fl_trace_start(size_t capacity);

/* Stops recording; the events recorded stay until taken or restarted. */
void fl_trace_stop(void);

/* Stops recording and moves up to `max` recorded events to `out`; returns
 * how many, and in *dropped how many did not fit since the last take.
 * The rest is discarded. */
size_t fl_trace_take(fl_trace_event *out, size_t max, uint64_t *dropped);

/* Nonzero while recording. */
int fl_trace_on(void);

/* Records an event of the calling thread, if recording. */
void fl_trace_record(int kind, uint64_t start_ns, uint64_t end_ns);

/* The consumer got a batch: it waited wait_ns, period_ns after the one
 * before.  The consumer's thread only. */
void fl_stats_record_batch(fl_stats *stats, uint64_t wait_ns, uint64_t period_ns);

/* As the consumer asked for a batch, in_flight batches were in flight, of
 * which `ready` were done; `deliverable` is nonzero when the next one to
 * deliver was among them (in order, a finished later batch is not), and
 * `idle_at_cap` when, with none deliverable, a worker had nothing to do
 * because the in-flight cap was reached.  The batch's wait then counts as
 * starved (fl_stats_record_batch).  The consumer's thread only. */
void fl_stats_note_depth(fl_stats *stats, uint64_t in_flight, uint64_t ready, int deliverable,
                         int idle_at_cap);

/* The histogram bucket of a value and the value range of a bucket. */
int fl_stats_bucket(uint64_t ns);
void fl_stats_bucket_range(int bucket, uint64_t *lo, uint64_t *hi);

#endif /* FL_STATS_H */
