/* fastload core: a loader's timers (see stats.h). */
#define _GNU_SOURCE /* gettid */
#include "core/observe/stats.h"

#include "core/observe/nvtx.h"
#include "core/status.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static atomic_int enabled = 1;
static _Thread_local fl_stats_row *bound_row;

fl_stats *fl_stats_new(int num_rows)
{
    if (num_rows < 0)
        return NULL;
    fl_stats *stats = calloc(1, sizeof *stats + (size_t)num_rows * sizeof(fl_stats_row));
    if (!stats)
        return NULL;
    if (pthread_mutex_init(&stats->cpu_lock, NULL) != 0) {
        free(stats);
        return NULL;
    }
    atomic_init(&stats->refs, 1);
    stats->num_rows = num_rows;
    return stats;
}

void fl_stats_retain(fl_stats *stats)
{
    atomic_fetch_add_explicit(&stats->refs, 1, memory_order_relaxed);
}

void fl_stats_release(fl_stats *stats)
{
    if (stats && atomic_fetch_sub_explicit(&stats->refs, 1, memory_order_acq_rel) == 1) {
        pthread_mutex_destroy(&stats->cpu_lock);
        free(stats);
    }
}

static void zero(_Atomic uint64_t *counters, int n)
{
    for (int i = 0; i < n; i++)
        atomic_store_explicit(&counters[i], 0, memory_order_relaxed);
}

void fl_stats_row_zero(fl_stats_row *row)
{
    zero(row->stage_ns, FL_STAGES);
    zero(row->stage_calls, FL_STAGES);
    zero(row->activity_ns, FL_ACTIVITIES);
    zero(&row->jobs, 1);
}

void fl_stats_reset(fl_stats *stats)
{
    pthread_mutex_lock(&stats->cpu_lock);
    for (int r = 0; r < stats->num_rows; r++) {
        fl_stats_row *row = &stats->rows[r];
        fl_stats_row_zero(row);
        if (row->cpu_live) { /* the window restarts for the thread bound now too */
            struct timespec ts;
            if (clock_gettime(row->cpu_clock, &ts) == 0)
                row->cpu_at_bind = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
        }
    }
    pthread_mutex_unlock(&stats->cpu_lock);
    memset(&stats->consumer, 0, sizeof stats->consumer);
}

void fl_stats_set_enabled(int on)
{
    atomic_store_explicit(&enabled, on != 0, memory_order_relaxed);
}

fl_stats_row *fl_stats_bind(fl_stats_row *row)
{
    fl_stats_row *previous = bound_row;
    bound_row = row;
    return previous;
}

int fl_stats_current_enabled(void)
{
    return atomic_load_explicit(&enabled, memory_order_relaxed);
}

fl_stats_row *fl_stats_current(void)
{
    return atomic_load_explicit(&enabled, memory_order_relaxed) ? bound_row : NULL;
}

uint64_t fl_stats_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static uint64_t clock_ns(clockid_t clock)
{
    struct timespec ts;
    if (clock_gettime(clock, &ts) != 0)
        return 0;
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void fl_stats_bind_worker(fl_stats *stats, int r)
{
    fl_stats_row *row = &stats->rows[r];
    clockid_t clock;
    pthread_mutex_lock(&stats->cpu_lock);
    if (pthread_getcpuclockid(pthread_self(), &clock) == 0) {
        row->cpu_clock = clock;
        row->cpu_at_bind = clock_ns(CLOCK_THREAD_CPUTIME_ID);
        row->cpu_live = 1;
    }
    pthread_mutex_unlock(&stats->cpu_lock);
    fl_stats_bind(row);
}

void fl_stats_unbind_worker(fl_stats *stats, int r)
{
    fl_stats_row *row = &stats->rows[r];
    fl_stats_bind(NULL);
    pthread_mutex_lock(&stats->cpu_lock);
    if (row->cpu_live) {
        uint64_t used = clock_ns(CLOCK_THREAD_CPUTIME_ID) - row->cpu_at_bind;
        atomic_fetch_add_explicit(&row->activity_ns[FL_CPU], used, memory_order_relaxed);
        row->cpu_live = 0;
    }
    pthread_mutex_unlock(&stats->cpu_lock);
}

uint64_t fl_stats_row_cpu(fl_stats *stats, int r)
{
    fl_stats_row *row = &stats->rows[r];
    pthread_mutex_lock(&stats->cpu_lock);
    uint64_t cpu = atomic_load_explicit(&row->activity_ns[FL_CPU], memory_order_relaxed);
    if (row->cpu_live) {
        uint64_t now = clock_ns(row->cpu_clock);
        if (now > row->cpu_at_bind)
            cpu += now - row->cpu_at_bind;
    }
    pthread_mutex_unlock(&stats->cpu_lock);
    return cpu;
}

/* A row has one writer: a load and a store add without a locked
 * instruction, and readers still see whole values. */
static void add(_Atomic uint64_t *counter, uint64_t value)
{
    uint64_t old = atomic_load_explicit(counter, memory_order_relaxed);
    atomic_store_explicit(counter, old + value, memory_order_relaxed);
}

void fl_stats_add_stage(fl_stats_row *row, fl_stage stage, uint64_t ns)
{
    add(&row->stage_ns[stage], ns);
    add(&row->stage_calls[stage], 1);
}

void fl_stats_add_activity(fl_stats_row *row, fl_activity activity, uint64_t ns)
{
    add(&row->activity_ns[activity], ns);
}

void fl_stats_add_gil_wait(fl_stats_row *row, uint64_t start_ns, uint64_t end_ns)
{
    add(&row->activity_ns[FL_GIL], end_ns - start_ns);
    fl_trace_record(FL_EVENT_GIL, start_ns, end_ns);
}

void fl_stats_add_job(fl_stats_row *row, uint64_t start_ns, uint64_t end_ns)
{
    fl_trace_record(FL_EVENT_JOB, start_ns, end_ns);
    add(&row->activity_ns[FL_BUSY], end_ns - start_ns);
    add(&row->jobs, 1);
}

int fl_stats_bucket(uint64_t ns)
{
    if (ns < FL_STATS_SUB_BUCKETS)
        return (int)ns; /* exact below 8 ns */
    int msb = 63 - __builtin_clzll(ns);
    int sub = (int)((ns >> (msb - 3)) & (FL_STATS_SUB_BUCKETS - 1));
    return (msb - 2) * FL_STATS_SUB_BUCKETS + sub;
}

void fl_stats_bucket_range(int bucket, uint64_t *lo, uint64_t *hi)
{
    if (bucket < 2 * FL_STATS_SUB_BUCKETS) {
        /* Buckets 0..15 hold 0..15 ns exactly (msb 3 maps to 8..15). */
        *lo = (uint64_t)bucket;
        *hi = (uint64_t)bucket + 1;
        return;
    }
    int msb = bucket / FL_STATS_SUB_BUCKETS + 2;
    uint64_t sub = (uint64_t)(bucket % FL_STATS_SUB_BUCKETS);
    uint64_t width = (uint64_t)1 << (msb - 3);
    *lo = ((uint64_t)FL_STATS_SUB_BUCKETS + sub) * width;
    *hi = msb == 63 && sub == FL_STATS_SUB_BUCKETS - 1 ? UINT64_MAX : *lo + width;
}

void fl_stats_record_batch(fl_stats *stats, uint64_t wait_ns, uint64_t period_ns)
{
    fl_stats_consumer *c = &stats->consumer;
    c->batches++;
    c->wait_ns += wait_ns;
    c->period_ns += period_ns;
    c->wait_hist[fl_stats_bucket(wait_ns)]++;
    if (c->starved)
        c->starved_wait_ns += wait_ns;
    c->starved = 0;
}

void fl_stats_note_depth(fl_stats *stats, uint64_t in_flight, uint64_t ready, int deliverable,
                         int idle_at_cap)
{
    fl_stats_consumer *c = &stats->consumer;
    c->depth_samples++;
    c->in_flight_sum += in_flight;
    c->ready_sum += ready;
    if (!deliverable) {
        /* One next() may ask more than once (skipped batches): any empty ask
         * makes its wait a wait for the workers. */
        c->empty_asks++;
        c->idle_at_cap_asks += idle_at_cap != 0;
        c->starved = 1;
    }
}

/* ------------------------------------------------------------ stage clock */

static const char *const nvtx_names[FL_EVENT_KINDS] = {
    [FL_STAGE_READ] = "fastload read",       [FL_STAGE_DECODE] = "fastload decode",
    [FL_STAGE_TRANSFORM] = "fastload transform", [FL_STAGE_COLLATE] = "fastload collate",
    [FL_STAGE_DATASET] = "fastload dataset", [FL_STAGE_UPLOAD] = "fastload upload",
    [FL_EVENT_JOB] = "fastload batch",       [FL_EVENT_GIL] = "fastload GIL wait",
};

void fl_stats_nvtx_push(int kind)
{
    fl_nvtx_push(nvtx_names[kind]);
}

static void open_stage(fl_stage_clock *c, fl_stage stage, uint64_t now)
{
    c->since = now;
    c->stage = (int)stage;
    c->pushed = fl_nvtx_on();
    if (c->pushed)
        fl_nvtx_push(nvtx_names[stage]);
}

/* Closes the open stage at `now`. */
static void close_stage(fl_stage_clock *c, uint64_t now)
{
    fl_stats_add_stage(c->row, (fl_stage)c->stage, now - c->since);
    fl_trace_record(c->stage, c->since, now);
    if (c->pushed)
        fl_nvtx_pop();
    c->stage = -1;
}

void fl_stage_begin(fl_stage_clock *c, fl_stage stage)
{
    c->row = fl_stats_current();
    c->stage = -1;
    if (c->row)
        open_stage(c, stage, fl_stats_now());
}

void fl_stage_next(fl_stage_clock *c, fl_stage stage)
{
    if (!c->row)
        return;
    uint64_t now = fl_stats_now();
    if (c->stage >= 0)
        close_stage(c, now);
    open_stage(c, stage, now);
}

void fl_stage_end(fl_stage_clock *c)
{
    if (c->row && c->stage >= 0)
        close_stage(c, fl_stats_now());
}

/* ------------------------------------------------------------ the trace
 *
 * One process-wide buffer of events.  A writer announces itself in
 * `writers`, checks `tracing` again and claims a record; fl_trace_take turns
 * `tracing` off and waits for the announced writers before it reads, so it
 * never reads (or resets) a record being written.  The buffer is allocated
 * once and only grows while no writer can be in it. */

static atomic_int tracing;
static atomic_int writers;
static atomic_size_t claimed;
static atomic_ullong dropped_events;
static fl_trace_event *events;
static size_t events_capacity; /* allocated */
static size_t events_limit;    /* kept until taken (<= events_capacity) */

static void wait_for_writers(void)
{
    while (atomic_load(&writers) > 0)
        ; /* a writer stores one record: a few nanoseconds */
}

int fl_trace_start(size_t capacity)
{
    atomic_store(&tracing, 0);
    wait_for_writers();
    if (capacity > events_capacity) {
        fl_trace_event *grown = realloc(events, capacity * sizeof *grown);
        if (!grown)
            return FL_ERR_NOMEM;
        events = grown;
        events_capacity = capacity;
    }
    events_limit = capacity;
    atomic_store(&claimed, 0);
    atomic_store(&dropped_events, 0);
    atomic_store(&tracing, events_limit > 0);
    return FL_OK;
}

void fl_trace_stop(void)
{
    atomic_store(&tracing, 0);
    wait_for_writers();
}

int fl_trace_on(void)
{
    return atomic_load_explicit(&tracing, memory_order_relaxed);
}

void fl_trace_record(int kind, uint64_t start_ns, uint64_t end_ns)
{
    if (!atomic_load_explicit(&tracing, memory_order_relaxed))
        return;
    atomic_fetch_add(&writers, 1);
    if (atomic_load(&tracing)) {
        size_t i = atomic_fetch_add(&claimed, 1);
        if (i < events_limit)
            events[i] = (fl_trace_event){start_ns, end_ns, kind, (int32_t)gettid()};
        else
            atomic_fetch_add(&dropped_events, 1);
    }
    atomic_fetch_sub(&writers, 1);
}

size_t fl_trace_take(fl_trace_event *out, size_t max, uint64_t *dropped)
{
    atomic_store(&tracing, 0);
    wait_for_writers();
    size_t n = atomic_load(&claimed);
    if (n > events_limit)
        n = events_limit;
    size_t copied = n < max ? n : max;
    if (copied)
        memcpy(out, events, copied * sizeof *out);
    *dropped = atomic_load(&dropped_events) + (n - copied);
    atomic_store(&claimed, 0);
    atomic_store(&dropped_events, 0);
    return copied;
}
