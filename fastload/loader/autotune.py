"""The controller behind ``DataLoader(num_workers="auto")``.

A search over two knobs, in the manner of tf.data's autotuner: how many
workers get new batches (the *active* ones; the pool holds the maximum) and
how many batches each may have in flight (the prefetch).  It is pure: the
iterator feeds it one observation per delivered batch -- the time, how long
the consumer waited in ``next()``, the batch's bytes -- and applies the
setting it answers.  Nothing here reads a clock or touches a thread, so the
tests drive it with a simulated pipeline.

The algorithm (docs/design.md, "Autotune"):

* Start with every worker (the usable cores) at prefetch 2: the first
  epoch runs as fast as the usual fixed choice, even when it is too short to
  finish a search.
* Measure a *window*: at least ``window_batches`` deliveries spanning at
  least ``window_seconds``, after skipping the deliveries that fill the
  pipeline (as many as the setting keeps in flight) at each start and after
  each change.  A window gives the throughput (batches per second, as the
  consumer sees them), the share of the time the consumer spent waiting,
  and the relative standard error of the throughput, from the spread of the
  rates of its eight consecutive blocks (so a bursty pipeline is judged by
  its average over the bursts).  The window grows until that error is under
  a quarter of the change the pending decision looks for, or it reaches
  ``max_window_batches`` or ``max_window_seconds``.  A window spans epochs:
  the last deliveries of an epoch (the drain) and the first of the next
  (the fill) are left out, the rest counts.
* The workers: if the consumer hardly waited (under ``min_wait_share``) the
  loader keeps up, and fewer workers may too (leaving cores to the training
  step): bisect between the most workers known too few (0 at first) and the
  fewest known to keep up, keeping a count that keeps up without losing
  throughput beyond the noise.  If the consumer waits while the workers
  wait for the GIL (over ``max_gil_share`` of their busy time: thread
  workers running Python take turns), fewer workers may deliver as much or
  more: bisect down the same way, by throughput.  If the consumer waits with
  workers held back, try more (doubling, or at most to a count known to keep
  up), kept when the throughput rises by more than the noise and
  ``min_gain``.
* Then, while the consumer still waits, the prefetch: doubled while that
  pays as much (a deeper buffer absorbs a bursty consumer).
* Settled, it keeps measuring.  Two windows in a row that contradict the
  choice -- the consumer now waits where it kept up, or hardly waits where
  it waited, or the throughput moved by more than twice ``min_gain`` and the
  noise -- reopen the search from the current setting, at most
  ``max_reopens`` times.  Every search step narrows a bracket, raises a
  bounded knob or ends a knob's search, so each search ends after a bounded
  number of windows (``max_windows`` at the latest): it cannot oscillate.
* Bounds: workers <= ``max_workers`` (this rank's usable cores), prefetch
  <= ``max_prefetch``, and batches in flight <= ``max_bytes`` / the largest
  batch seen (at least 1).  The in-flight target is workers x prefetch
  within that.
"""

import math
from collections import namedtuple

from ..observe.stats import GIL_BOUND
from . import node as _node

# What the iterator applies: `workers` active, and `in_flight` batches kept
# submitted (workers x prefetch within the byte budget).
Setting = namedtuple("Setting", "workers prefetch in_flight")

DEFAULT_MAX_PREFETCH = 8
START_PREFETCH = 2
# Windows in a row that must contradict a settled choice to reopen it.
_CONTRADICTIONS = 2


# The usable cores and the default memory bound are the node's to say
# (fastload/loader/node.py): the loader bounds "auto" by this rank's share.
usable_cores = _node.usable_cores
default_max_bytes = _node.default_max_bytes


def batch_nbytes(batch, _depth=0):
    """The bytes of the arrays and tensors in a batch (nested dicts, lists,
    tuples); other objects count 0."""
    nbytes = getattr(batch, "nbytes", None)
    if isinstance(nbytes, int):
        return nbytes
    if _depth > 8:
        return 0
    if isinstance(batch, dict):
        return sum(batch_nbytes(v, _depth + 1) for v in batch.values())
    if isinstance(batch, (list, tuple)):
        return sum(batch_nbytes(v, _depth + 1) for v in batch)
    return 0


_BLOCKS = 8


class _Window:
    """Deliveries at one setting: their intervals and the consumer's waits."""

    def __init__(self):
        self.intervals = []
        self.waited = 0.0

    def add(self, interval, waited):
        self.intervals.append(interval)
        self.waited += waited

    @property
    def seconds(self):
        return sum(self.intervals)

    def error(self):
        """The relative standard error of the window's throughput, from the
        rates of _BLOCKS consecutive blocks of deliveries."""
        n = len(self.intervals)
        if n < _BLOCKS:
            return math.inf
        rates = []
        for b in range(_BLOCKS):
            block = self.intervals[b * n // _BLOCKS:(b + 1) * n // _BLOCKS]
            seconds = sum(block)
            if seconds <= 0:
                return math.inf
            rates.append(len(block) / seconds)
        mean = sum(rates) / _BLOCKS
        variance = sum((r - mean) ** 2 for r in rates) / (_BLOCKS - 1)
        return math.sqrt(variance / _BLOCKS) / mean

    def stats(self):
        total = self.seconds
        return {
            "batches_per_s": len(self.intervals) / total,
            "wait_share": min(1.0, self.waited / total),
            "error": self.error(),
        }


class Autotuner:
    """Chooses (active workers, prefetch) for one loader; see the module
    doc.  ``observe`` per delivered batch, ``begin`` when an iterator or
    epoch starts."""

    def __init__(self, max_workers, max_prefetch=DEFAULT_MAX_PREFETCH, max_bytes=None,
                 start_workers=None, start_prefetch=START_PREFETCH, window_batches=16,
                 window_seconds=0.1, max_window_batches=512, max_window_seconds=3.0,
                 min_gain=0.05, min_wait_share=0.05, max_windows=64, max_reopens=4,
                 max_gil_share=GIL_BOUND, gil_clock=None):
        if max_workers < 1 or max_prefetch < 1:
            raise ValueError("max_workers and max_prefetch must be at least 1")
        self.max_workers = max_workers
        self.max_prefetch = max_prefetch
        self.max_bytes = default_max_bytes() if max_bytes is None else max_bytes
        if start_workers is None:
            start_workers = max_workers
        self.workers = max(1, min(start_workers, max_workers))
        self.prefetch = max(1, min(start_prefetch, max_prefetch))
        self.window_batches = window_batches
        self.window_seconds = window_seconds
        self.max_window_batches = max_window_batches
        self.max_window_seconds = max_window_seconds
        self.min_gain = min_gain
        self.min_wait_share = min_wait_share
        self.max_windows = max_windows
        self.max_reopens = max_reopens
        self.max_gil_share = max_gil_share
        # () -> (seconds the workers waited for the GIL, seconds they were
        # busy), both running totals; None: no GIL (processes, C workers).
        self.gil_clock = gil_clock
        self.adapting = True     # False once it holds its setting for good
        self.settled = False     # no search running (it still watches)
        self.reason = None       # why it settled
        self.reopened = 0        # searches reopened by a contradicted choice
        self.steps = []          # one entry per decision
        self.batch_bytes = 0     # the largest batch seen
        self._observed = 0
        self._start_search(None)
        self.begin()

    @classmethod
    def fixed(cls, workers, prefetch, reason):
        """A controller that never adapts (an iterable dataset's)."""
        tuner = cls(workers, prefetch, start_workers=workers, start_prefetch=prefetch)
        tuner.max_bytes = None  # not applied: see DataLoader's num_workers="auto"
        tuner._settle(reason)
        tuner.adapting = False
        return tuner

    # -- the setting --------------------------------------------------------

    def _in_flight_cap(self):
        if self.batch_bytes <= 0 or self.max_bytes is None:
            return self.max_workers * self.max_prefetch
        return max(1, int(self.max_bytes // self.batch_bytes))

    @property
    def setting(self):
        in_flight = min(self.workers * self.prefetch, self._in_flight_cap())
        return Setting(self.workers, self.prefetch, in_flight)

    def begin(self):
        """A new iterator or epoch: the time between epochs is not measured,
        and the deliveries that fill the pipeline are skipped."""
        self._last = None
        self._skip = self.setting.in_flight
        return self.setting

    def _new_window(self, skip):
        self._window = _Window()
        self._skip = skip
        self._gil_at = None  # the GIL clock when the window's first delivery counted

    def _window_stats(self):
        stats = self._window.stats()
        stats["gil_share"] = 0.0
        if self._gil_at is not None:
            (gil0, busy0), (gil1, busy1) = self._gil_at, self.gil_clock()
            if busy1 > busy0:
                stats["gil_share"] = min(1.0, max(0.0, (gil1 - gil0) / (busy1 - busy0)))
        return stats

    def _start_search(self, baseline):
        """A search from the current setting, `baseline` its measure."""
        self.settled = False
        self.reason = None
        self._kept = (self.workers, self.prefetch)  # the setting trials start from
        self._trial = None       # "workers" or "prefetch" while a step is measured
        self._too_few = 0        # the most workers known not to keep up
        self._enough = None      # the fewest workers known to keep up
        self._floor = 0          # the most workers known slower than the kept (GIL descent)
        self._descended = False  # fewer workers were kept: no climbing back
        self._searching = ["workers", "prefetch"]
        self._windows = 0        # windows this search measured
        self._baseline = None
        if baseline is not None:
            self._set_baseline(baseline)
        self._new_window(0)

    def _settle(self, reason):
        self.settled = True
        self.reason = reason
        self._trial = None
        self._contradicted = 0   # watching windows in a row that contradict the choice
        self._new_window(0)

    # -- observations -------------------------------------------------------

    def observe(self, now, waited, nbytes):
        """One delivered batch: `now` (seconds, any monotonic origin), the
        seconds the consumer waited for it, its bytes.  Returns the setting
        to apply."""
        self._observed += 1
        if nbytes > self.batch_bytes:
            self.batch_bytes = nbytes
        if not self.adapting:
            return self.setting
        last, self._last = self._last, now
        if last is None or self._skip > 0:
            self._skip = max(0, self._skip - 1)
            return self.setting
        window = self._window
        if not window.intervals and self.gil_clock is not None:
            self._gil_at = self.gil_clock()
        window.add(max(0.0, now - last), waited)
        n, seconds = len(window.intervals), window.seconds
        if n < self.window_batches or seconds < self.window_seconds:
            return self.setting
        # The error costs a pass over the window: check every _BLOCKS batches.
        if (n >= self.max_window_batches or seconds >= self.max_window_seconds
                or (n % _BLOCKS == 0 and window.error() <= self._wanted_error())):
            if self.settled:
                self._watch(self._window_stats())
            else:
                self._conclude(self._window_stats())
        return self.setting

    def _keeps_up(self, stats):
        return stats["wait_share"] < self.min_wait_share

    def _wanted_error(self):
        """How precise the window must be: a quarter of the change the
        pending decision looks for -- a worker step's proportional change,
        discounted four times (a step near the bottleneck changes less) --
        or of min_gain.  A search's first window, which the next step will
        be judged against, looks ahead: a worker step halves or doubles."""
        change = 0.0
        kept = self._kept[0]
        if self._trial == "workers":
            change = abs(self.workers - kept) / min(self.workers, kept)
        elif self._trial is None and not self.settled and "workers" in self._searching:
            so_far = self._window_stats()
            fewer = self._keeps_up(so_far) or so_far["gil_share"] > self.max_gil_share
            if (kept > 1) if fewer else (kept < self.max_workers and not self._descended):
                change = 1.0
        return max(self.min_gain, change / 4) / 4

    def _record(self, stats, decision):
        self.steps.append({
            "batch": self._observed,
            "workers": self.workers,
            "prefetch": self.prefetch,
            "batches_per_s": stats["batches_per_s"],
            "wait_share": stats["wait_share"],
            "decision": decision,
        })

    def _noise(self, stats):
        return 2.0 * math.hypot(stats["error"], self._baseline["error"])

    def _better(self, trial, stats):
        """Whether the step just measured is kept."""
        ratio = stats["batches_per_s"] / self._baseline["batches_per_s"]
        if trial == "workers" and self.workers < self._kept[0]:
            # Fewer workers: kept while they deliver as much, within the
            # noise, and keep up if the kept count did.
            return ((self._keeps_up(stats) or not self._keeps_up(self._baseline))
                    and ratio >= 1.0 - max(self.min_gain / 2, self._noise(stats)))
        return ratio - 1.0 > max(self.min_gain, self._noise(stats))

    def _conclude(self, stats):
        self._windows += 1
        trial, self._trial = self._trial, None
        if trial is None:
            self._record(stats, "measured")
            self._set_baseline(stats)
        elif self._better(trial, stats):
            self._record(stats, "kept")
            self._descended |= self.workers < self._kept[0]
            self._kept = (self.workers, self.prefetch)
            self._set_baseline(stats)
        else:
            self._record(stats, "undone")
            tried = self.workers
            self.workers, self.prefetch = self._kept
            if trial == "prefetch":
                self._searching.remove("prefetch")
            elif tried < self.workers:
                if self._keeps_up(self._baseline):
                    self._too_few = max(self._too_few, tried)
                else:
                    self._floor = max(self._floor, tried)
            else:  # more workers did not pay: fewer between would pay less
                self._searching.remove("workers")
        self._next_trial()

    def _set_baseline(self, stats):
        """`stats` measures the kept setting: it narrows the bracket."""
        self._baseline = stats
        kept = self._kept[0]
        if self._keeps_up(stats):
            self._enough = kept if self._enough is None else min(self._enough, kept)
            if self._too_few >= self._enough:  # more workers waited: the GIL's doing
                self._too_few = self._floor
        elif self._enough is None or kept < self._enough:
            self._too_few = max(self._too_few, kept)

    def _next_workers(self):
        """The worker count to try next from the kept setting, or None: a
        bisection down while the kept count keeps up or the workers take
        turns with the GIL, doubling up while the consumer waits."""
        if "workers" not in self._searching:
            return None
        kept = self._kept[0]
        if self._keeps_up(self._baseline):
            if self._enough - self._too_few > 1:
                return self._too_few + (self._enough - self._too_few) // 2
            return None
        if self._baseline["gil_share"] > self.max_gil_share:
            return self._floor + (kept - self._floor) // 2 if kept - self._floor > 1 else None
        room = min(self.max_workers, self._in_flight_cap())
        if self._enough is not None:
            room = min(room, self._enough)
        if self._descended or kept >= room:
            return None
        return min(2 * kept, room)

    def _next_trial(self):
        if self._windows >= self.max_windows:
            return self._settle(f"{self.max_windows} windows measured")
        trial = None
        workers = self._next_workers()
        if workers is not None:
            self.workers = workers
            trial = "workers"
        elif "workers" in self._searching:
            self._searching.remove("workers")
        if trial is None and "prefetch" in self._searching:
            cap = self._in_flight_cap()
            deeper = min(self.prefetch * 2, self.max_prefetch)
            if (not self._keeps_up(self._baseline)
                    and min(self.workers * deeper, cap) > min(self.workers * self.prefetch, cap)):
                self.prefetch = deeper
                trial = "prefetch"
            else:
                self._searching.remove("prefetch")
        if trial is None:
            return self._settle("the consumer hardly waits" if self._keeps_up(self._baseline)
                                else "no step raised the throughput")
        self._trial = trial
        self._new_window(self.setting.in_flight)

    def _watch(self, stats):
        """A window measured after settling: two in a row that contradict
        the choice reopen the search."""
        base = self._baseline
        if self._keeps_up(base):
            contradicted = stats["wait_share"] >= 2 * self.min_wait_share
        else:
            moved = abs(stats["batches_per_s"] / base["batches_per_s"] - 1.0)
            contradicted = (stats["wait_share"] < self.min_wait_share / 2
                            or moved > 2 * max(self.min_gain, self._noise(stats)))
        self._contradicted = self._contradicted + 1 if contradicted else 0
        self._new_window(0)
        if self._contradicted < _CONTRADICTIONS:
            return
        if self.reopened >= self.max_reopens:
            self.adapting = False
            self.reason = f"held after {self.reopened} searches reopened"
            return
        self.reopened += 1
        self._record(stats, "reopened")
        self._start_search(stats)
        self._next_trial()

    def report(self):
        """A plain dict: the chosen setting, the bounds and the history."""
        setting = self.setting
        return {
            "workers": setting.workers,
            "prefetch": setting.prefetch,
            "in_flight": setting.in_flight,
            "settled": self.settled,
            "adapting": self.adapting,
            "reason": self.reason,
            "reopened": self.reopened,
            "max_workers": self.max_workers,
            "max_prefetch": self.max_prefetch,
            "max_prefetch_bytes": self.max_bytes,
            "batch_bytes": self.batch_bytes,
            "steps": [dict(step) for step in self.steps],
        }
