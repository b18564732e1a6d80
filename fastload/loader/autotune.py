"""The controller behind ``DataLoader(num_workers="auto")``.

A hill climber, in the manner of tf.data's autotuner, over two knobs: how
many workers get new batches (the *active* ones; the pool holds the maximum)
and how many batches each may have in flight (the prefetch).  It is pure:
the iterator feeds it one observation per delivered batch -- the time, how
long the consumer waited in ``next()``, the batch's bytes -- and applies the
setting it answers.  Nothing here reads a clock or touches a thread, so the
tests drive it with a simulated pipeline.

The algorithm (docs/design.md, "Autotune"):

* Measure a *window*: at least ``window_batches`` deliveries spanning at
  least ``window_seconds``, after skipping the deliveries that drain the
  pipeline of the previous setting (as many as the setting keeps in flight).
  A window gives the throughput (batches per second, as the consumer sees
  them), the share of the time the consumer spent waiting, and the relative
  standard error of the throughput, from the spread of the rates of its
  eight consecutive blocks (a block spans several deliveries, so a pipeline
  that delivers in bursts -- a bursty consumer, uneven samples -- is judged
  by its average over the bursts, not by single intervals).  The window
  grows until that error is under a quarter of the gain the next decision
  looks for (a quarter of s / w for a worker step from w to w + s, which
  gains up to s / w; ``min_gain`` for a prefetch step), or it reaches ``max_window_batches`` or
  ``max_window_seconds``: large steps are judged quickly, small ones
  precisely.
* If the consumer hardly waited (under ``min_wait_share``), the loader keeps
  up: settle.  Else *try* a step: more workers first, then a deeper prefetch
  (deeper buffers absorb a bursty consumer when more workers do not help).
* Keep a step when the throughput rose by more than the noise (twice the
  combined standard error) and by at least ``min_gain``; else go back to the
  kept setting.  Worker steps grow exponentially while a step pays off nearly
  in proportion (1, 2, 4, ... more workers) and halve after a step that did
  not, down to 1; a rejected single worker ends the worker search, a
  rejected prefetch doubling ends the prefetch search, and then the
  controller settles.  Every trial either raises a bounded knob or shrinks a
  step, so it settles after a bounded number of windows (and at
  ``max_windows`` at the latest): it cannot oscillate.
* Bounds: workers <= ``max_workers`` (the usable cores), prefetch <=
  ``max_prefetch``, and batches in flight <= ``max_bytes`` / the largest
  batch seen (at least 1).  The in-flight target is workers x prefetch
  within that.

The loader stops adapting at the end of the first epoch (``end_epoch``):
a trial still running then is undone, and later epochs keep the setting.
"""

import math
from collections import namedtuple

from . import node as _node

# What the iterator applies: `workers` active, and `in_flight` batches kept
# submitted (workers x prefetch within the byte budget).
Setting = namedtuple("Setting", "workers prefetch in_flight")

DEFAULT_MAX_PREFETCH = 8
START_PREFETCH = 2


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
    epoch starts, ``end_epoch`` when the first epoch ends."""

    def __init__(self, max_workers, max_prefetch=DEFAULT_MAX_PREFETCH, max_bytes=None,
                 start_workers=1, start_prefetch=START_PREFETCH, window_batches=16,
                 window_seconds=0.1, max_window_batches=512, max_window_seconds=3.0,
                 min_gain=0.05, min_wait_share=0.05, max_windows=64):
        if max_workers < 1 or max_prefetch < 1:
            raise ValueError("max_workers and max_prefetch must be at least 1")
        self.max_workers = max_workers
        self.max_prefetch = max_prefetch
        self.max_bytes = default_max_bytes() if max_bytes is None else max_bytes
        self.workers = max(1, min(start_workers, max_workers))
        self.prefetch = max(1, min(start_prefetch, max_prefetch))
        self.window_batches = window_batches
        self.window_seconds = window_seconds
        self.max_window_batches = max_window_batches
        self.max_window_seconds = max_window_seconds
        self.min_gain = min_gain
        self.min_wait_share = min_wait_share
        self.max_windows = max_windows
        self.settled = False
        self.reason = None       # why it settled
        self.steps = []          # one entry per measured window
        self.batch_bytes = 0     # the largest batch seen
        self._kept = (self.workers, self.prefetch)  # the setting trials start from
        self._baseline = None    # the kept setting's window stats
        self._trial = None       # "workers" or "prefetch" while a step is measured
        self._worker_step = 1
        self._searching = ["workers", "prefetch"]
        self._observed = 0
        self.begin()

    @classmethod
    def fixed(cls, workers, prefetch, reason):
        """A controller that never adapts (an iterable dataset's)."""
        tuner = cls(workers, prefetch, start_workers=workers, start_prefetch=prefetch)
        tuner.max_bytes = None  # not applied: see DataLoader's num_workers="auto"
        tuner._settle(reason)
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
        """A new iterator or epoch: time between them is not measured."""
        self._last = None
        self._window = _Window()
        self._skip = self.setting.in_flight
        return self.setting

    def end_epoch(self):
        """The first epoch is over: undo a trial still running and hold."""
        if not self.settled:
            if self._trial is not None:
                self.workers, self.prefetch = self._kept
            self._settle("the first epoch ended")
        return self.setting

    def _settle(self, reason):
        self.settled = True
        self.reason = reason
        self._trial = None

    # -- observations -------------------------------------------------------

    def observe(self, now, waited, nbytes):
        """One delivered batch: `now` (seconds, any monotonic origin), the
        seconds the consumer waited for it, its bytes.  Returns the setting
        to apply."""
        self._observed += 1
        if nbytes > self.batch_bytes:
            self.batch_bytes = nbytes
        if self.settled:
            return self.setting
        last, self._last = self._last, now
        if last is None or self._skip > 0:
            self._skip = max(0, self._skip - 1)
            return self.setting
        window = self._window
        window.add(max(0.0, now - last), waited)
        n, seconds = len(window.intervals), window.seconds
        if n < self.window_batches or seconds < self.window_seconds:
            return self.setting
        # The error costs a pass over the window: check every _BLOCKS batches.
        if (n >= self.max_window_batches or seconds >= self.max_window_seconds
                or (n % _BLOCKS == 0 and window.error() <= self._wanted_error())):
            self._conclude(window.stats())
        return self.setting

    def _wanted_error(self):
        """How precise the window must be: a quarter of the gain the next
        decision looks for, which is a step's proportional gain discounted
        four times (a step near the bottleneck gains less), or min_gain."""
        kept_workers = self._kept[0]
        if self._trial == "workers":
            gain = self.workers / kept_workers - 1.0
        elif self._trial is None and "workers" in self._searching:
            gain = min(self._worker_step, self.max_workers - kept_workers) / kept_workers
        else:
            gain = 0.0
        return max(self.min_gain, gain / 4) / 4

    def _record(self, stats, decision):
        self.steps.append({
            "batch": self._observed,
            "workers": self.workers,
            "prefetch": self.prefetch,
            "batches_per_s": stats["batches_per_s"],
            "wait_share": stats["wait_share"],
            "decision": decision,
        })

    def _conclude(self, stats):
        trial, self._trial = self._trial, None
        if trial is None:
            self._record(stats, "measured")
            self._baseline = stats
        else:
            base = self._baseline
            gain = stats["batches_per_s"] / base["batches_per_s"] - 1.0
            noise = 2.0 * math.hypot(stats["error"], base["error"])
            if gain > max(self.min_gain, noise):
                self._record(stats, "kept")
                if trial == "workers":
                    ideal = self.workers / self._kept[0] - 1.0
                    # Nearly proportional: still far from the bottleneck.
                    self._worker_step = (self._worker_step * 2 if gain >= 0.5 * ideal
                                         else max(1, self._worker_step // 2))
                self._kept = (self.workers, self.prefetch)
                self._baseline = stats
            else:
                self._record(stats, "undone")
                self.workers, self.prefetch = self._kept
                if trial == "workers" and self._worker_step > 1:
                    self._worker_step //= 2
                else:
                    self._searching.remove(trial)
        self._next_trial()

    def _next_trial(self):
        if len(self.steps) >= self.max_windows:
            return self._settle(f"{self.max_windows} windows measured")
        if self._baseline["wait_share"] < self.min_wait_share:
            return self._settle("the consumer hardly waits")
        cap = self._in_flight_cap()
        trial = None
        if "workers" in self._searching:
            room = min(self.max_workers, cap) - self.workers
            if room > 0:
                self.workers += min(self._worker_step, room)
                trial = "workers"
            else:
                self._searching.remove("workers")
        if trial is None and "prefetch" in self._searching:
            deeper = min(self.prefetch * 2, self.max_prefetch)
            if min(self.workers * deeper, cap) > min(self.workers * self.prefetch, cap):
                self.prefetch = deeper
                trial = "prefetch"
            else:
                self._searching.remove("prefetch")
        if trial is None:
            return self._settle("no step raised the throughput" if self.steps[1:]
                                else "at its bounds")
        self._trial = trial
        self._window = _Window()
        self._skip = self.setting.in_flight

    def report(self):
        """A plain dict: the chosen setting, the bounds and the history."""
        setting = self.setting
        return {
            "workers": setting.workers,
            "prefetch": setting.prefetch,
            "in_flight": setting.in_flight,
            "settled": self.settled,
            "reason": self.reason,
            "max_workers": self.max_workers,
            "max_prefetch": self.max_prefetch,
            "max_prefetch_bytes": self.max_bytes,
            "batch_bytes": self.batch_bytes,
            "steps": [dict(step) for step in self.steps],
        }
