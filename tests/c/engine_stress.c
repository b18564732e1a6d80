/* A stress test of the core alone (no Python), meant to run under
 * ThreadSanitizer as well as plainly: the engine with many short jobs of
 * uneven run times, in order and out of order, with retirement,
 * cancellation, reset and stop; a bounded stop that leaves a stuck worker
 * behind; and the slot pool shared by several threads.
 * Exits 0 when every check holds; prints the first failure otherwise. */
#define _POSIX_C_SOURCE 200809L
#include "core/engine/engine.h"
#include "core/memory/slots.h"
#include "core/status.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define CHECK(cond)                                                                  \
    do {                                                                             \
        if (!(cond)) {                                                               \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
            exit(1);                                                                 \
        }                                                                            \
    } while (0)

typedef struct job {
    long id;
    int ran_on;
} job;

typedef struct ctx {
    atomic_int started, stopped, ran;
    long retire_worker_after; /* worker 0 retires after this many jobs; <0: never */
    atomic_long worker0_jobs;
} ctx;

static void start(void *arg, int w)
{
    (void)w;
    atomic_fetch_add(&((ctx *)arg)->started, 1);
}

static void stop(void *arg, int w)
{
    (void)w;
    atomic_fetch_add(&((ctx *)arg)->stopped, 1);
}

static int run(void *arg, int w, void *payload)
{
    ctx *c = arg;
    job *j = payload;
    if (w == 0 && c->retire_worker_after >= 0 &&
        atomic_fetch_add(&c->worker0_jobs, 1) >= c->retire_worker_after)
        return FL_JOB_RETIRE;
    /* Uneven work: a few microseconds, sometimes ~100. */
    struct timespec ts = {0, (j->id % 7 == 0) ? 100000 : 2000};
    nanosleep(&ts, NULL);
    j->ran_on = w;
    atomic_fetch_add(&c->ran, 1);
    return FL_JOB_DONE;
}

static void run_epochs(int workers, int in_order, int capacity, long jobs_per_epoch, long retire)
{
    ctx c = {0};
    c.retire_worker_after = retire;
    fl_engine_config config = {.num_workers = workers, .max_in_flight = capacity, .in_order = in_order,
                               .name = "fl-stress"};
    fl_engine_hooks hooks = {&c, start, run, stop};
    fl_engine *e = NULL;
    CHECK(fl_engine_create(&config, &hooks, &e, NULL, 0) == FL_OK);

    for (int epoch = 0; epoch < 3; epoch++) {
        atomic_store(&c.worker0_jobs, 0);
        job *all = calloc((size_t)jobs_per_epoch, sizeof *all);
        char *seen = calloc((size_t)jobs_per_epoch, 1);
        CHECK(all && seen);
        long submitted = 0, delivered = 0, expected_next = 0;
        while (submitted < capacity && submitted < jobs_per_epoch) {
            all[submitted].id = submitted;
            CHECK(fl_engine_submit(e, &all[submitted], NULL, NULL) == FL_OK);
            submitted++;
        }
        for (;;) {
            fl_delivery d;
            int rc = fl_engine_next(e, 5.0, &d);
            if (rc == FL_ERR_EMPTY)
                break;
            CHECK(rc == FL_OK);
            job *j = d.payload;
            CHECK(!seen[j->id]);
            seen[j->id] = 1;
            if (in_order) {
                CHECK(j->id == expected_next);
                expected_next++;
            }
            if (d.outcome == FL_JOB_DONE)
                CHECK(j->ran_on == d.worker);
            if (d.outcome == FL_JOB_RETIRE)
                CHECK(d.worker == 0);
            delivered++;
            if (submitted < jobs_per_epoch) {
                all[submitted].id = submitted;
                int src = fl_engine_submit(e, &all[submitted], NULL, NULL);
                CHECK(src == FL_OK || src == FL_ERR_NO_WORKER);
                submitted += src == FL_OK;
                if (src != FL_OK)
                    break;
            }
        }
        /* Cancel what is left (nothing, or all after every worker retired). */
        CHECK(fl_engine_cancel_pending(e) >= 0);
        fl_delivery d;
        while (fl_engine_next(e, 5.0, &d) == FL_OK)
            delivered++;
        CHECK(delivered == submitted);
        CHECK(fl_engine_in_flight(e) == 0);
        CHECK(fl_engine_reset(e) == FL_OK);
        free(all);
        free(seen);
    }

    /* Stop with work still queued: nothing may run after stop returns. */
    job extra[64];
    int queued = 0;
    for (int i = 0; i < 64 && queued < capacity; i++) {
        extra[i].id = i;
        if (fl_engine_submit(e, &extra[i], NULL, NULL) == FL_OK)
            queued++;
    }
    fl_engine_stop(e);
    int ran_at_stop = atomic_load(&c.ran);
    void *leftover;
    int leftovers = 0;
    while (fl_engine_take_leftover(e, &leftover) == FL_OK)
        leftovers++;
    CHECK(leftovers <= queued);
    CHECK(atomic_load(&c.ran) == ran_at_stop);
    CHECK(atomic_load(&c.started) == workers && atomic_load(&c.stopped) == workers);
    fl_engine_free(e);
}

/* ------------------------------------------------- a worker stuck in a job */

typedef struct gate_ctx {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int entered;          /* the gated job has started */
    int open;             /* the gated job may return */
    atomic_int stopped;   /* workers past their stop hook */
    job *written;         /* the gated job's payload, written after the gate */
} gate_ctx;

static void gate_stop(void *arg, int w)
{
    (void)w;
    atomic_fetch_add(&((gate_ctx *)arg)->stopped, 1);
}

static int gate_run(void *arg, int w, void *payload)
{
    gate_ctx *g = arg;
    job *j = payload;
    if (j->id == 0) { /* the stuck one: waits until the gate opens */
        pthread_mutex_lock(&g->lock);
        g->entered = 1;
        pthread_cond_broadcast(&g->cond);
        while (!g->open)
            pthread_cond_wait(&g->cond, &g->lock);
        pthread_mutex_unlock(&g->lock);
    }
    j->ran_on = w; /* the payload is still the worker's to write */
    return FL_JOB_DONE;
}

/* fl_engine_stop_within gives up on a worker stuck in its job, joins the
 * others, keeps the stuck job's payload out of the leftovers; abandoned, the
 * worker exits on its own once its job returns.  The engine is leaked, as
 * the contract requires. */
static void stop_with_stuck_worker(int workers)
{
    gate_ctx g = {.lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};
    fl_engine_config config = {.num_workers = workers, .max_in_flight = 4 * workers, .in_order = 1,
                               .name = "fl-stuck"};
    fl_engine_hooks hooks = {&g, NULL, gate_run, gate_stop};
    fl_engine *e = NULL;
    CHECK(fl_engine_create(&config, &hooks, &e, NULL, 0) == FL_OK);
    job jobs[64];
    int submitted = 0;
    for (int i = 0; i < 4 * workers; i++) {
        jobs[i].id = i;
        jobs[i].ran_on = -1;
        CHECK(fl_engine_submit(e, &jobs[i], NULL, NULL) == FL_OK);
        submitted++;
    }
    pthread_mutex_lock(&g.lock);
    while (!g.entered)
        pthread_cond_wait(&g.cond, &g.lock);
    pthread_mutex_unlock(&g.lock);

    CHECK(fl_engine_stop_within(e, 0.05) == 1);
    CHECK(fl_engine_worker_running(e, 0));
    for (int w = 1; w < workers; w++)
        CHECK(!fl_engine_worker_running(e, w));
    CHECK(atomic_load(&g.stopped) == workers - 1);
    fl_engine_abandon(e);
    void *leftover;
    int leftovers = 0;
    while (fl_engine_take_leftover(e, &leftover) == FL_OK) {
        CHECK(leftover != &jobs[0]);
        leftovers++;
    }
    CHECK(leftovers < submitted);

    pthread_mutex_lock(&g.lock);
    g.open = 1;
    pthread_cond_broadcast(&g.cond);
    pthread_mutex_unlock(&g.lock);
    while (atomic_load(&g.stopped) < workers) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    CHECK(jobs[0].ran_on == 0);
    /* The detached thread may still be returning: the engine stays. */
}

/* A slow job that finishes within the bound is waited for and joined. */
static void stop_within_joins_slow_job(void)
{
    ctx c = {0};
    c.retire_worker_after = -1;
    fl_engine_config config = {.num_workers = 2, .max_in_flight = 4, .in_order = 1, .name = "fl-slow"};
    fl_engine_hooks hooks = {&c, start, run, stop};
    fl_engine *e = NULL;
    CHECK(fl_engine_create(&config, &hooks, &e, NULL, 0) == FL_OK);
    job jobs[4];
    for (int i = 0; i < 4; i++) {
        jobs[i].id = 7 * i; /* the slow kind of job */
        CHECK(fl_engine_submit(e, &jobs[i], NULL, NULL) == FL_OK);
    }
    CHECK(fl_engine_stop_within(e, 30.0) == 0);
    CHECK(!fl_engine_worker_running(e, 0) && !fl_engine_worker_running(e, 1));
    CHECK(atomic_load(&c.stopped) == 2);
    void *leftover;
    while (fl_engine_take_leftover(e, &leftover) == FL_OK)
        ;
    fl_engine_free(e);
}

/* CPUs the kernel refuses (none of them exists) fail the create, naming
 * them, and leave nothing running; a CPU id beyond cpu_set_t is invalid. */
static void refused_affinity(void)
{
    ctx c = {0};
    c.retire_worker_after = -1;
    int cpus[] = {1000, 1001, 1002, 1010};
    fl_engine_config config = {.num_workers = 2, .max_in_flight = 4, .in_order = 1,
                               .name = "fl-cpus", .cpus = cpus, .num_cpus = 4};
    fl_engine_hooks hooks = {&c, start, run, stop};
    fl_engine *e = NULL;
    char msg[200] = "";
    CHECK(fl_engine_create(&config, &hooks, &e, msg, sizeof msg) == FL_ERR_AFFINITY);
    CHECK(e == NULL);
    CHECK(strstr(msg, "worker thread 0 on CPUs 1000-1002,1010: ") != NULL);
    CHECK(atomic_load(&c.stopped) == atomic_load(&c.started));
    int beyond[] = {0, 1 << 20};
    config.cpus = beyond;
    config.num_cpus = 2;
    CHECK(fl_engine_create(&config, &hooks, &e, msg, sizeof msg) == FL_ERR_INVALID);
}

static void *slot_churn(void *arg)
{
    fl_slot_pool *pool = arg;
    fl_slot *held[8] = {0};
    unsigned seed = (unsigned)(uintptr_t)&held;
    for (int i = 0; i < 2000; i++) {
        int k = (int)(rand_r(&seed) % 8);
        if (held[k]) {
            fl_slot_release(held[k]);
            held[k] = NULL;
        } else {
            /* 0 bytes, heap-sized, or huge-page-sized (2 MiB and more). */
            static const size_t sizes[] = {0, 1, 100000, 2500000, 4194304};
            size_t bytes = sizes[rand_r(&seed) % 5];
            CHECK(fl_slot_acquire(pool, bytes, &held[k]) == FL_OK);
            CHECK(held[k]->capacity >= bytes && held[k]->capacity > 0);
            /* Both ends are ours: another thread's slot would race here. */
            char *data = held[k]->data;
            size_t edge = held[k]->capacity < 64 ? held[k]->capacity : 64;
            memset(data, k, edge);
            memset(data + held[k]->capacity - edge, k, edge);
        }
    }
    for (int k = 0; k < 8; k++)
        fl_slot_release(held[k]);
    return NULL;
}

static void churn_slots(void)
{
    fl_slot_pool *pool = fl_slot_pool_new(4, SIZE_MAX, NULL);
    CHECK(pool);
    pthread_t threads[4];
    for (int i = 0; i < 4; i++)
        CHECK(pthread_create(&threads[i], NULL, slot_churn, pool) == 0);
    for (int i = 0; i < 4; i++)
        pthread_join(threads[i], NULL);
    size_t live = 0, free_listed = 0;
    fl_slot_pool_counts(pool, &live, &free_listed);
    CHECK(live == free_listed && free_listed <= 4);
    fl_slot_pool_release(pool);
}

/* An allocator that fails without setting errno (as a CUDA one does). */
static void *failing_alloc(size_t bytes, void *ctx)
{
    (void)bytes;
    (void)ctx;
    return NULL;
}

static void no_free(void *data, size_t bytes, void *ctx)
{
    (void)data;
    (void)bytes;
    (void)ctx;
}

/* Its failure is out of memory, not "too many open files" read from a
 * stale errno left by an earlier call. */
static void allocator_failure_without_errno(void)
{
    fl_slot_allocator failing = {.alloc = failing_alloc, .free = no_free};
    fl_slot_pool *pool = fl_slot_pool_new(4, SIZE_MAX, &failing);
    CHECK(pool);
    fl_slot *slot = NULL;
    errno = EMFILE;
    CHECK(fl_slot_acquire(pool, 4096, &slot) == FL_ERR_NOMEM);
    fl_slot_pool_release(pool);
}

int main(void)
{
    allocator_failure_without_errno();
    churn_slots();
    for (int workers = 1; workers <= 4; workers++) {
        run_epochs(workers, 1, 2 * workers, 2000, -1);
        run_epochs(workers, 0, 2 * workers, 2000, -1);
        run_epochs(workers, 1, 3 * workers, 500, 50);
        run_epochs(workers, 0, 3 * workers, 500, 50);
    }
    for (int workers = 1; workers <= 3; workers++)
        stop_with_stuck_worker(workers);
    stop_within_joins_slow_job();
    refused_affinity();
    puts("engine stress: ok");
    return 0;
}
