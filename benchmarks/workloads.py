"""Workloads shared by the demo (demo.py), the comparison script (compare.py)
and the pytest-benchmark suite (test_loader_bench.py).

Map-style datasets generated deterministically from the index (no files),
plus the small harness every entry point uses to build a loader and
consume an epoch while checking that every sample arrived intact:

* ``FixedArrays``: a ``(3, 64, 64)`` float32 image and an int label per
  sample, made with one vectorised add.  The dataset costs almost nothing,
  so an epoch measures the loader itself: fetching, collation and getting
  batches to the consumer.
* ``Indices``: a one-element array and a label; nothing to load, for
  measuring a loader's start-up alone (time to first batch).
* ``NumpyWork``: each ``__getitem__`` spends about 1 ms in NumPy code that
  releases the GIL (small matrix products), then returns a ``(64, 64)``
  float32 array and a label.  The case where workers overlap dataset work.

Checksums: a batch's checksum is the exact sum of its array values plus the
sum of its labels.  Every workload produces integer-valued float32 arrays, so
float64 sums are exact whatever the grouping (per sample or per batch) and a
checksum can be compared with ``==``.  ``expected_checksum`` computes the
value for a set of indices without any loader.

torch is optional: without it the datasets are plain classes and only
fastload can be benchmarked (with NumPy output).
"""

import gc
import platform
import threading
import time

import numpy as np

try:
    import torch
    from torch.utils.data import Dataset as _DatasetBase
except ImportError:  # the demo runs fastload alone when torch is missing
    torch = None
    _DatasetBase = object

__all__ = [
    "BATCH_SIZE",
    "FixedArrays",
    "Indices",
    "NumpyWork",
    "batch_checksum",
    "consume",
    "make_loader",
    "loader_kinds",
    "seconds_per_item",
    "torch",
    "warm_up",
]

BATCH_SIZE = 64


def seconds_per_item(dataset, calls):
    """Median seconds per ``dataset[i]`` call on this machine (5 rounds of
    `calls`, after one warm-up call)."""
    dataset[0]
    times = []
    for _ in range(5):
        start = time.perf_counter()
        for i in range(calls):
            dataset[i % len(dataset)]
        times.append((time.perf_counter() - start) / calls)
    return float(np.median(times))


class FixedArrays(_DatasetBase):
    """``n`` samples ``(image, label)``: ``image`` is a fresh float32 array of
    shape ``(3, 64, 64)`` equal to a fixed pattern plus ``index % 256``, and
    ``label = index % 10``."""

    SHAPE = (3, 64, 64)
    NUM_CLASSES = 10

    def __init__(self, n):
        self.n = int(n)
        size = int(np.prod(self.SHAPE))
        # Integer values 0..250: every element and every sum stays exact.
        self._pattern = (np.arange(size, dtype=np.int64) % 251).astype(np.float32).reshape(self.SHAPE)
        self._pattern_sum = int(self._pattern.sum(dtype=np.float64))
        self._size = size

    def __len__(self):
        return self.n

    def __getitem__(self, index):
        if not 0 <= index < self.n:
            raise IndexError(f"index {index} out of range for {self.n} samples")
        image = self._pattern + np.float32(index % 256)  # a new array per sample
        return image, index % self.NUM_CLASSES

    def expected_checksum(self, indices):
        """The checksum of these samples, computed in closed form."""
        idx = np.asarray(indices, dtype=np.int64)
        return int(
            self._pattern_sum * idx.size
            + self._size * int((idx % 256).sum())
            + int((idx % self.NUM_CLASSES).sum())
        )

    def __repr__(self):
        return f"FixedArrays(n={self.n})"


class NumpyWork(_DatasetBase):
    """``n`` samples ``(features, label)`` that each cost about 1 ms of
    GIL-releasing NumPy work.

    ``__getitem__`` pushes a fixed stack of 256 float32 32x32 matrices
    through ``PASSES`` products with a 32x32 weight matrix (one of
    ``VARIANTS``, chosen by the index) and returns
    ``floor(16 * result)`` for the first four matrices as a float32
    ``(64, 64)`` array, with ``label = index % 10``.

    Why this shape of work:

    * each pass is one ``np.matmul`` call, which releases the GIL for its
      whole loop; the Python around the calls is ~2% of the time;
    * results go to per-thread scratch buffers (``out=``), so the work
      allocates nothing large.  Fresh arrays above glibc's mmap threshold
      (128 KiB) are mmap'ed and page-faulted on every call; on this VM that
      made an FFT-based version 3-7x slower than its arithmetic, and the
      page-fault cost, not NumPy, was what got measured;
    * 32x32 products stay below OpenBLAS's threading threshold, so BLAS
      never starts threads of its own (a single large product would, and
      would oversubscribe the cores the loaders' workers need).

    Calibration: 1.07 ms per sample, single-threaded (CPU time / wall time
    0.97), median of 3 x 200 calls on the 2-core AMD EPYC the docs were
    measured on; ``time_per_item()`` measures it wherever you run.
    """

    STACK, DIM = 256, 32
    OUT_SHAPE = (64, 64)
    VARIANTS = 8
    PASSES = 5
    NUM_CLASSES = 10

    def __init__(self, n, seed=0):
        self.n = int(n)
        rng = np.random.default_rng(seed)
        self._stack = rng.random((self.STACK, self.DIM, self.DIM), dtype=np.float32)
        # Scaled so repeated products keep values of order 1.
        scale = np.float32(1.0 / np.sqrt(self.DIM))
        self._weights = [
            rng.standard_normal((self.DIM, self.DIM), dtype=np.float32) * scale
            for _ in range(self.VARIANTS)
        ]
        self._local = threading.local()  # scratch buffers, one pair per thread
        self._variant_sums = None  # filled lazily by expected_checksum

    def __getstate__(self):
        # Picklable for spawned worker processes: scratch is per thread.
        state = self.__dict__.copy()
        del state["_local"]
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._local = threading.local()

    def _scratch(self):
        bufs = getattr(self._local, "bufs", None)
        if bufs is None:
            shape = (self.STACK, self.DIM, self.DIM)
            bufs = self._local.bufs = (np.empty(shape, np.float32), np.empty(shape, np.float32))
        return bufs

    def __len__(self):
        return self.n

    def __getitem__(self, index):
        if not 0 <= index < self.n:
            raise IndexError(f"index {index} out of range for {self.n} samples")
        weights = self._weights[index % self.VARIANTS]
        a, b = self._scratch()
        np.matmul(self._stack, weights, out=a)  # the GIL is released inside
        for _ in range(self.PASSES - 1):
            np.matmul(a, weights, out=b)
            a, b = b, a
        # A new small array (the scratch is reused), integer-valued so that
        # checksums are exact.
        features = np.floor(a[:4].reshape(self.OUT_SHAPE) * np.float32(16))
        return features, index % self.NUM_CLASSES

    def expected_checksum(self, indices):
        """The checksum of these samples, from the dataset called directly
        (once per input variant: the output depends on index % VARIANTS)."""
        if self._variant_sums is None:
            self._variant_sums = [
                int(self[v][0].sum(dtype=np.float64)) for v in range(min(self.VARIANTS, self.n))
            ]
        idx = np.asarray(indices, dtype=np.int64)
        counts = np.bincount(idx % self.VARIANTS, minlength=self.VARIANTS)
        arrays = sum(int(c) * s for c, s in zip(counts, self._variant_sums))
        return arrays + int((idx % self.NUM_CLASSES).sum())

    def time_per_item(self, calls=200):
        """Median seconds per ``__getitem__`` call on this machine."""
        return seconds_per_item(self, calls)

    def __repr__(self):
        return f"NumpyWork(n={self.n})"


class Indices(_DatasetBase):
    """``n`` samples ``(array([index], float32), index)``: nothing to load,
    so the time to a first batch is the loader's start-up alone."""

    def __init__(self, n):
        self.n = int(n)

    def __len__(self):
        return self.n

    def __getitem__(self, index):
        if not 0 <= index < self.n:
            raise IndexError(f"index {index} out of range for {self.n} samples")
        return np.array([index], dtype=np.float32), index

    def expected_checksum(self, indices):
        return 2 * int(np.asarray(indices, dtype=np.int64).sum())

    def __repr__(self):
        return f"Indices(n={self.n})"


# ------------------------------------------------------------------ harness


def loader_kinds():
    """The loaders that can run here: torch's (when installed) and fastload's."""
    return ["torch", "fastload"] if torch is not None else ["fastload"]


def make_loader(kind, dataset, num_workers, batch_size=BATCH_SIZE):
    """The same configuration for either loader: sequential order, default
    collation, no pinning; ``prefetch_factor`` etc. left at their defaults."""
    if kind == "torch":
        return torch.utils.data.DataLoader(dataset, batch_size=batch_size, num_workers=num_workers)
    if kind == "fastload":
        import fastload

        return fastload.DataLoader(dataset, batch_size=batch_size, num_workers=num_workers)
    raise ValueError(f"unknown loader {kind!r}")


def _as_numpy(x):
    # torch tensors (from either loader) are viewed without a copy.
    return x.numpy() if hasattr(x, "numpy") else np.asarray(x)


def batch_checksum(batch):
    """``(samples, checksum)`` of one ``[arrays, labels]`` batch; reads every
    value, as a training step would."""
    arrays, labels = batch
    arrays, labels = _as_numpy(arrays), _as_numpy(labels)
    if arrays.shape[0] != labels.shape[0]:
        raise AssertionError(f"{arrays.shape[0]} arrays but {labels.shape[0]} labels in a batch")
    return labels.shape[0], int(arrays.sum(dtype=np.float64)) + int(labels.sum(dtype=np.int64))


def warm_up(loader, batches=8):
    """A partial epoch, untimed: imports, thread pools, the loader's buffers."""
    it = iter(loader)
    for _, batch in zip(range(batches), it):
        batch_checksum(batch)
    del it
    gc.collect()


def consume(batches, on_batch=None):
    """Reads every batch of an iterable; returns ``(samples, checksum)``.
    ``on_batch(samples_so_far)`` is called after each batch (progress)."""
    samples = checksum = 0
    for batch in batches:
        n, c = batch_checksum(batch)
        samples += n
        checksum += c
        if on_batch is not None:
            on_batch(samples)
    return samples, checksum


def cpu_model():
    """The CPU's model name, for the reports."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"
