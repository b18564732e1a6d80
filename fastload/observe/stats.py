"""``loader.stats()``: where a DataLoader's time goes, and what would help.

Every loader keeps timers (``_C.Timers``, always on): per stage (read,
decode, transform, collate, the Python dataset's own code, the
host-to-device upload), per worker (busy, idle, the part of busy spent
waiting for the GIL, and the CPU time used) and, on the consumer's side,
how long the training loop waited in ``next()`` for each batch.  The C
pipeline times itself without the GIL; Python code brackets its stages with
``_C.stage_begin``/``stage_next``/``stage_end``; a worker process sends its
times with each batch.  The same brackets feed a profiler's timeline
(fastload.profiler).
``loader.stats()`` turns a snapshot of them into a ``LoaderStats``:
``print()`` it for a table, ``as_dict()`` for a logger.

Rows of the timers: one per worker, then one for work done on the
consumer's own thread (``num_workers=0``), then one for the upload thread.
"""

import os

from .. import _C

__all__ = ["LoaderStats"]

STAGES = _C.STAGES
DATASET = STAGES.index("dataset")
COLLATE = STAGES.index("collate")
UPLOAD = STAGES.index("upload")
# A row tuple (``Timers.take``/``snapshot``): ns per stage, calls per
# stage, then busy, idle, GIL-wait and CPU ns, then jobs.
_S = len(STAGES)
BUSY, IDLE, GIL, CPU, JOBS = range(2 * _S, 2 * _S + 5)
ROW_FIELDS = 2 * _S + 5

# Below this share of its time spent waiting, a loop is compute-bound.
_INPUT_BOUND_WAIT = 0.10
# Workers busier than this have no time to spare.
_SATURATED = 0.80
# A GIL wait above this share of worker time is the bottleneck (the
# autotuner then tries fewer thread workers).
GIL_BOUND = 0.30
# Workers using a CPU less than this share of their busy time mostly wait.
_MOSTLY_WAITING = 0.50
# Thread workers running Python that use about one CPU together (this range),
# each computing less than this share of its busy time, take turns with the GIL.
_ONE_CPU = (0.6, 1.4)
_TAKING_TURNS = 0.75
# Threads waiting for a CPU more than this share of the time: the machine is
# oversubscribed, and a waiting worker waits for a CPU, not for I/O.
_CONTENDED = 0.50
# Below this share of the loop's wait spent on batches it found none of
# ready, the wait is the hand-off (taking a finished batch), not the workers.
_STARVED = 0.50
# At least this share of the loop's empty asks found a worker idle only
# because the in-flight cap was reached: a larger prefetch_factor would help.
_CAP_BOUND = 0.50

clock_ns = _C.clock_ns  # the clock of every timer and trace event


def cpu_contention():
    """The share of the last 10 s in which some thread of the machine
    waited for a CPU (Linux's pressure stall information), else the
    1-minute load average over the CPUs (capped at 1), else None."""
    try:
        with open("/proc/pressure/cpu") as f:
            some = f.readline().split()
        return float(dict(field.split("=") for field in some[1:])["avg10"]) / 100
    except (OSError, KeyError, ValueError, IndexError):
        pass
    try:
        from ..loader import node  # the load is the machine's: over its usable CPUs
        return min(1.0, os.getloadavg()[0] / node.usable_cores())
    except OSError:
        return None


def usable_cpus():
    """This rank's CPUs: its share of the node (fastload/loader/node.py)."""
    from ..loader import node
    return node.rank_cores()


class LoaderTimers:
    """A loader's ``_C.Timers``, sized for its workers (``num_workers`` may
    change between iterators; the timers then start again)."""

    def __init__(self):
        self.timers = _C.Timers(2)
        self.num_workers = 0

    def for_workers(self, num_workers):
        if num_workers != self.num_workers:
            self.timers = _C.Timers(num_workers + 2)
            self.num_workers = num_workers
        return self.timers

    def gil_clock(self):
        """The workers' running totals, in seconds: (waiting for the GIL,
        busy).  The autotuner reads it at the ends of its windows."""
        rows = self.timers.snapshot()["rows"][:self.num_workers]
        return sum(r[GIL] for r in rows) / 1e9, sum(r[BUSY] for r in rows) / 1e9

    @property
    def consumer_row(self):
        return self.num_workers

    @property
    def upload_row(self):
        return self.num_workers + 1


class ConsumerClock:
    """The training loop's side of one iterator: how long each ``next()``
    waited, and how long after the batch before it.  On the path of every
    batch, so it stays two calls into C."""

    __slots__ = ("record", "note_depth", "last")

    def __init__(self, timers):
        self.record = timers.record_next
        self.note_depth = timers.note_depth
        self.last = 0  # when the previous batch was handed over; 0: none this epoch

    def handed_over(self, called_at):
        """Records a batch that ``next()``, called at ``called_at``, returns now."""
        self.last = self.record(called_at, self.last)


class LoaderStats:
    """A snapshot of a loader's timers: ``print()`` shows a table and a
    verdict, ``as_dict()`` gives plain numbers (seconds) for a logger."""

    def __init__(self, snapshot, num_workers, worker_mode, prefetch_factor, cpus=None,
                 autotune=None, contention=None, sources=None, gpu_decode=None):
        rows = snapshot["rows"]
        consumer = snapshot["consumer"]
        self.num_workers = num_workers
        self.worker_mode = worker_mode if num_workers else None
        self.prefetch_factor = prefetch_factor
        self.cpus = cpus if cpus is not None else usable_cpus()
        # Read only when the verdict turns on it (see _advice).
        self._contention = contention
        self.autotune = autotune
        # {source: samples handed out this epoch} for a MixSampler, else None.
        self.sources = sources
        # The GPU decode stage (decode_device="cuda"/"auto"): its backend, the
        # GPU's share of the JPEGs and the images each side decoded; else None.
        self.gpu_decode = gpu_decode
        self.batches = consumer["batches"]
        self.elapsed_s = consumer["period_ns"] / 1e9
        self.wait_s = consumer["wait_ns"] / 1e9
        self.wait_fraction = self.wait_s / self.elapsed_s if self.elapsed_s > 0 else 0.0
        n = max(self.batches, 1)
        self.asks = consumer["depth_samples"]
        looks = max(self.asks, 1)
        self.mean_in_flight = consumer["in_flight_sum"] / looks
        self.mean_done = consumer["ready_sum"] / looks
        # What the loop found as it asked: no batch to deliver at once (and
        # then, a worker idle only because the in-flight cap was reached),
        # and how much of its wait went to such batches.
        self.empty_asks = consumer["empty_asks"]
        self.idle_at_cap_asks = consumer["idle_at_cap_asks"]
        self.starved_wait_s = consumer["starved_wait_ns"] / 1e9
        hist = consumer["wait_hist"]
        self.wait_ms = {
            "mean": self.wait_s * 1e3 / n,
            "p50": _percentile(hist, 0.50) / 1e6,
            "p95": _percentile(hist, 0.95) / 1e6,
            "max": (hist[-1][1] if hist else 0) / 1e6,
        }
        self.stages = {
            name: {"seconds": sum(r[i] for r in rows) / 1e9,
                   "calls": sum(r[_S + i] for r in rows)}
            for i, name in enumerate(STAGES)
        }
        self.workers = [
            {"id": w, "busy_s": r[BUSY] / 1e9, "idle_s": r[IDLE] / 1e9, "gil_s": r[GIL] / 1e9,
             "cpu_s": r[CPU] / 1e9, "batches": r[JOBS]}
            for w, r in enumerate(rows[:num_workers])
        ]
        busy = sum(w["busy_s"] for w in self.workers)
        # The time spent making batches: the workers', or, without workers,
        # the loop's own wait (it makes them itself).
        self.worker_s = busy if num_workers else self.wait_s
        for stage in self.stages.values():
            stage["share"] = stage["seconds"] / self.worker_s if self.worker_s > 0 else 0.0
        total = sum(w["busy_s"] + w["idle_s"] for w in self.workers)
        self.busy_fraction = busy / total if total > 0 else 0.0
        self.gil_fraction = sum(w["gil_s"] for w in self.workers) / busy if busy > 0 else 0.0
        self.cpu_fraction = sum(w["cpu_s"] for w in self.workers) / busy if busy > 0 else 0.0
        self.verdict = self._verdict()

    # -- the verdict ----------------------------------------------------------

    def _verdict(self):
        if self.batches == 0:
            return "no batches yet"
        waited = f"the loop waited {self.wait_fraction:.0%} of the time"
        if self.wait_fraction < _INPUT_BOUND_WAIT:
            return (f"compute-bound: data was ready {1 - self.wait_fraction:.0%} of the time "
                    f"({waited})")
        parts = [f"input-bound: {waited}"]
        top = max(self.stages.items(), key=lambda item: item[1]["seconds"])
        if top[1]["seconds"] > 0:
            where = "worker time" if self.num_workers else "loading time"
            parts.append(f"{top[0]} is {top[1]['share']:.0%} of {where}")
        parts.append(self._advice())
        return "; ".join(parts)

    def _advice(self):
        if self.num_workers == 0:
            return "workers would help (num_workers > 0)"
        if self.gil_fraction > GIL_BOUND:
            return (f"thread workers wait for the GIL {self.gil_fraction:.0%} of their busy time: "
                    "worker_mode='process' would help")
        together = self._python_threads_in_turn()
        if together is not None:
            return (f"the thread workers run Python one at a time (the GIL): busy, they used "
                    f"{together:.1f} CPUs together: worker_mode='process' would help")
        # Advice on workers or prefetch needs evidence that the loop waited
        # for them: that it found no batch ready as it asked.
        if self.asks and self.starved_wait_s < _STARVED * self.wait_s:
            ready = 1 - self.empty_asks / self.asks
            return (f"a batch was ready at {ready:.0%} of the loop's asks, yet it waited "
                    f"{self.wait_ms['mean']:.2f} ms a batch: that is handing batches over, not "
                    "making them; adding workers or raising prefetch_factor would not shorten "
                    "it (larger batches would spread the cost)")
        held = self._held_by_autotune()
        if held:
            return held
        if self.empty_asks and self.idle_at_cap_asks >= _CAP_BOUND * self.empty_asks:
            return (f"at {self.idle_at_cap_asks / self.empty_asks:.0%} of the loop's asks that "
                    "found no batch ready, a worker sat idle because num_workers x "
                    f"prefetch_factor = {self.num_workers * (self.prefetch_factor or 1)} batches "
                    "were already in flight: a larger prefetch_factor would help")
        if self.busy_fraction < _SATURATED and not self.asks:
            return (f"the workers are idle {1 - self.busy_fraction:.0%} of the time while the "
                    "loop waits, with no record of what the loop found as it asked")
        # Saturated, or the loop found no batch ready with every worker busy:
        # the workers are too slow for the loop.  Busy but mostly off a CPU,
        # they wait for I/O or sleep, and more of them help beyond the cores.
        if self.cpu_fraction < _MOSTLY_WAITING:
            contention = self._contention
            if contention is None:
                contention = self._contention = cpu_contention()
            if contention is not None and contention > _CONTENDED:
                return (f"the workers use a CPU only {self.cpu_fraction:.0%} of their busy "
                        f"time, and threads waited for a CPU {contention:.0%} of the last "
                        "seconds: the machine is oversubscribed, so fewer competing "
                        "processes would help, not more workers")
            return (f"the workers use a CPU only {self.cpu_fraction:.0%} of their busy time "
                    "(they wait for I/O or sleep): more workers would help, even beyond "
                    "the core count")
        if self.num_workers < self.cpus:
            return "more workers would help"
        if self.busy_fraction >= _SATURATED:
            return ("the workers keep every core busy: cheaper transforms, smaller stored "
                    "images or a cache would help")
        return ("there are as many workers as cores, all busy when the loop found no batch "
                "ready: cheaper transforms, smaller stored images or a cache would help")

    def _held_by_autotune(self):
        """With num_workers="auto" holding workers back while the loop
        waited: what the autotuner decided, in place of advice on prefetch
        or worker counts (its knobs) that the held workers would belie."""
        tuned = self.autotune
        if not tuned or tuned["workers"] >= tuned["max_workers"]:
            return None
        state = f"settled: {tuned['reason']}" if tuned["settled"] else "still measuring"
        return (f"num_workers='auto' keeps {tuned['workers']} of {tuned['max_workers']} workers "
                f"active ({state}); it searches again when later batches contradict that, and "
                f"a fixed num_workers={tuned['max_workers']} shows what the others add")

    def _python_threads_in_turn(self):
        """The CPUs thread workers running Python used together while the
        busiest was busy, when that says they took turns with the GIL (about
        one CPU between them, each busy but computing part of the time; a
        wait inside Python code is not timed as a GIL wait); else None."""
        if (self.worker_mode != "thread" or self.stages["dataset"]["calls"] == 0
                or len(self.workers) < 2 or self.cpus < 2):
            return None
        busiest = max(w["busy_s"] for w in self.workers)
        if busiest <= 0:
            return None
        together = sum(w["cpu_s"] for w in self.workers) / busiest
        if _ONE_CPU[0] <= together <= _ONE_CPU[1] and self.cpu_fraction < _TAKING_TURNS:
            return together
        return None

    # -- output -----------------------------------------------------------------

    def as_dict(self):
        """Plain numbers (seconds, fractions) for a logger such as TensorBoard
        or W&B; nested dicts per stage and a list per worker."""
        return {
            "batches": self.batches,
            "elapsed_s": self.elapsed_s,
            "wait_s": self.wait_s,
            "wait_fraction": self.wait_fraction,
            "wait_ms": dict(self.wait_ms),
            "mean_in_flight": self.mean_in_flight,
            "mean_ready": self.mean_done,
            "asks": self.asks,
            "empty_asks": self.empty_asks,
            "idle_at_cap_asks": self.idle_at_cap_asks,
            "starved_wait_s": self.starved_wait_s,
            "stages": {name: dict(stage) for name, stage in self.stages.items()},
            "workers": [dict(w) for w in self.workers],
            "busy_fraction": self.busy_fraction,
            "gil_fraction": self.gil_fraction,
            "cpu_fraction": self.cpu_fraction,
            "num_workers": self.num_workers,
            "worker_mode": self.worker_mode,
            "prefetch_factor": self.prefetch_factor,
            "cpus": self.cpus,
            "autotune": self.autotune,
            "sources": dict(self.sources) if self.sources is not None else None,
            "gpu_decode": dict(self.gpu_decode) if self.gpu_decode is not None else None,
            "verdict": self.verdict,
        }

    def __str__(self):
        if self.num_workers:
            workers = (f"{self.num_workers} {self.worker_mode} workers, prefetch_factor "
                       f"{self.prefetch_factor}")
        else:
            workers = "no workers (the loop makes each batch)"
        lines = [
            f"fastload DataLoader: {self.batches} batches in {self.elapsed_s:.2f} s; {workers}; "
            f"{self.cpus} CPUs",
            self.verdict,
            "",
            f"{'stage':<10} {'seconds':>9} {'share':>6} {'ms/call':>8} {'calls':>9}",
        ]
        for name, stage in self.stages.items():
            if stage["calls"] == 0:
                continue
            per_call = stage["seconds"] * 1e3 / stage["calls"]
            lines.append(f"{name:<10} {stage['seconds']:>9.3f} {stage['share']:>6.0%} "
                         f"{per_call:>8.3f} {stage['calls']:>9}")
        if self.workers:
            lines += ["", f"{'worker':<10} {'busy':>6} {'idle':>6} {'GIL wait':>9} {'CPU':>6} "
                          f"{'batches':>8}"]
            for w in self.workers:
                total = w["busy_s"] + w["idle_s"]
                share = {k: w[k] / total if total > 0 else 0.0
                         for k in ("busy_s", "idle_s", "gil_s", "cpu_s")}
                lines.append(f"{w['id']:<10} {share['busy_s']:>6.0%} {share['idle_s']:>6.0%} "
                             f"{share['gil_s']:>9.0%} {share['cpu_s']:>6.0%} {w['batches']:>8}")
        wait = self.wait_ms
        lines += [
            "",
            f"loop wait per batch: mean {wait['mean']:.2f} ms, p50 {wait['p50']:.2f} ms, "
            f"p95 {wait['p95']:.2f} ms",
        ]
        if self.num_workers:
            lines.append(f"when the loop asked: {self.mean_in_flight:.1f} batches in flight, "
                         f"{self.mean_done:.1f} of them ready")
        if self.autotune:
            tuned = self.autotune
            state = "settled" if tuned["settled"] else "still measuring"
            why = f"; {tuned['reason']}" if tuned["reason"] else ""
            lines.append(f"autotune ({state}): {tuned['workers']} of {tuned['max_workers']} "
                         f"workers active, prefetch {tuned['prefetch']}{why}")
        if self.sources:
            total = max(sum(self.sources.values()), 1)
            lines.append("sources this epoch: " + ", ".join(
                f"{name} {count} ({count / total:.0%})" for name, count in self.sources.items()))
        if self.gpu_decode:
            g = self.gpu_decode
            lines.append(f"GPU decode ({g['mode']}, nvJPEG {g['backend']}): share "
                         f"{g['gpu_share']:.0%}; {g['gpu_images']} images on the GPU, "
                         f"{g['cpu_images']} on the CPU")
        return "\n".join(lines)

    def __repr__(self):
        return f"<LoaderStats {self.batches} batches: {self.verdict}>"


def _percentile(hist, q):
    """The q-quantile of a (lo, hi, count) histogram: the middle of the
    bucket it falls in (under 6.25 % off)."""
    total = sum(count for _lo, _hi, count in hist)
    if total == 0:
        return 0.0
    rank = q * total
    seen = 0
    for lo, hi, count in hist:
        seen += count
        if seen >= rank:
            return (lo + hi) / 2
    return float(hist[-1][1])
