"""The controller behind ``decode_device="auto"``: how many of each batch's
JPEGs the GPU decodes, the CPU workers decoding the rest.

Pure, as the autotuner is: the loader feeds it one observation per batch --
how many images each side took and the time each side spent on them -- and
applies the share it answers.  Nothing here reads a clock, so the tests drive
it with simulated costs.

The model.  With ``W`` worker threads, a batch of ``n`` images of which
``g`` go to the GPU costs the workers

    cpu(g) = (n - g) * c + g * p      seconds of worker time

(``c``: an image read, decoded and transformed on the CPU; ``p``: an image
prepared for the GPU -- read, its header parsed, its geometry drawn, its
bytes copied into the batch), spread over ``W`` threads, and it costs the GPU
stage, which runs the batches one after another on its stream,

    gpu(g) = g * d                    seconds

(``d``: an image decoded and resampled on the GPU, as the stage's events
time it, so a GPU busy with training shows as a larger ``d``).  Batches come
at the pace of the slower side, ``max(cpu(g) / W, gpu(g))`` a batch, which is
least where the two are equal:

    g* = n * c / (c - p + W * d)

Each cost is the median of its last ``window`` measurements (one a batch
that had such images), so a change of images or of load on the GPU moves the
split within a few batches, and one slow batch (a page fault storm, a
preempted worker) does not.  While ``auto``, each side keeps at least
``explore`` of the batch (one image at least) so that its cost stays
measured; until both sides have been measured the share is one half.
"""

import collections
import math
import statistics

__all__ = ["DecodeSplit", "MODES"]

MODES = ("cpu", "cuda", "auto")


class DecodeSplit:
    """The GPU's share of each batch's JPEGs for ``mode`` ("cpu": none,
    "cuda": all, "auto": adapted to the measured costs, see the module).

    ``workers``: the CPU worker threads making batches (``set_workers`` when
    the loader's autotuner changes them)."""

    def __init__(self, mode, workers, window=5, explore=16):
        if mode not in MODES:
            raise ValueError(f"decode_device must be one of {', '.join(map(repr, MODES))}, "
                             f"got {mode!r}")
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.mode = mode
        self.workers = workers
        self.explore = explore
        # Per image, seconds: CPU decode c, GPU preparation p, GPU stage d.
        self._costs = {side: collections.deque(maxlen=window) for side in ("cpu", "prep", "gpu")}
        self._share = {"cpu": 0.0, "cuda": 1.0, "auto": 0.5}[mode]
        self._batches = 0

    @property
    def share(self):
        """The fraction of a batch's JPEGs the GPU decodes, in [0, 1]."""
        return self._share

    def gpu_images(self, n):
        """How many of a batch of ``n`` images go to the GPU."""
        if self.mode != "auto":
            return n if self.mode == "cuda" else 0
        # The batch jobs apply this rule in C (image_source.c, split_wanted).
        g = math.floor(self._share * n + 0.5)  # half away from zero, as C's llround
        self._batches += 1
        if self._batches % self.explore == 1 and n >= 2:
            g = min(max(g, 1), n - 1)
        return g

    def set_workers(self, workers):
        self.workers = max(1, int(workers))
        self._update()

    def observe(self, cpu_images, cpu_seconds, gpu_images, prep_seconds, gpu_seconds):
        """One batch: ``cpu_images`` decoded by a worker in ``cpu_seconds``,
        ``gpu_images`` prepared in ``prep_seconds`` and decoded by the GPU
        stage in ``gpu_seconds``.  Returns the new share."""
        if cpu_images > 0:
            self._costs["cpu"].append(max(0.0, cpu_seconds / cpu_images))
        if gpu_images > 0:
            self._costs["prep"].append(max(0.0, prep_seconds / gpu_images))
            self._costs["gpu"].append(max(0.0, gpu_seconds / gpu_images))
        self._update()
        return self._share

    def _cost(self, side):
        costs = self._costs[side]
        return statistics.median(costs) if costs else None

    cpu_cost = property(lambda self: self._cost("cpu"), doc="c: seconds a CPU image")
    prep_cost = property(lambda self: self._cost("prep"), doc="p: seconds a GPU image's prep")
    gpu_cost = property(lambda self: self._cost("gpu"), doc="d: seconds a GPU image on the GPU")

    def _update(self):
        if self.mode != "auto" or None in (self.cpu_cost, self.prep_cost, self.gpu_cost):
            return
        c, p, d = self.cpu_cost, self.prep_cost, self.gpu_cost
        denominator = c - p + self.workers * d
        # A GPU image costing the workers as much as a CPU one, and the GPU
        # nothing, leaves nothing to balance: all on the GPU.
        share = c / denominator if denominator > 0 else 1.0
        self._share = min(1.0, max(0.0, share))

    def rate(self, n, g=None):
        """Batches a second the model predicts for batches of ``n`` images,
        ``g`` of them on the GPU (default: this split's); None before both
        sides were measured."""
        if None in (self.cpu_cost, self.prep_cost, self.gpu_cost):
            return None
        g = self.gpu_images(n) if g is None else g
        seconds = max(((n - g) * self.cpu_cost + g * self.prep_cost) / self.workers,
                      g * self.gpu_cost)
        return math.inf if seconds == 0 else 1.0 / seconds

    def as_dict(self):
        """For ``loader.stats()``: the mode, the share and the measured costs
        (seconds an image; None when not measured)."""
        return {"mode": self.mode, "gpu_share": self._share, "cpu_seconds": self.cpu_cost,
                "prep_seconds": self.prep_cost, "gpu_seconds": self.gpu_cost}
