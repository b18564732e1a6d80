"""Pre-processed data on disk, and the torch datasets a user would write for
it: the workloads of ``arrays_bench.py`` (and its CI smoke test).

Two files, made once and reused: ``rows.npy``, float32 rows of 4 KiB (1024
values) whose content is a function of (row, column), and ``tokens.bin``, a
flat uint16 token file in nanoGPT's ``train.bin`` layout.  Because the
content is a formula, every delivered batch is checked against the indices
its loader drew, cheaply: wrong rows fail loudly.
"""

import os
import time

import numpy as np

try:
    import torch
except ImportError:  # fastload alone can still be measured
    torch = None

ROW_VALUES = 1024            # 4 KiB of float32 a row
BLOCK = 1024                 # token windows of 1024 + 1
VOCAB = 50257                # GPT-2's vocabulary, as in nanoGPT
CHUNK = 1 << 24              # bytes written per step while generating


def row_value(rows, cols):
    """The value at (row, column) of rows.npy: exact in float32."""
    return ((rows * 131 + cols) % 4093).astype(np.float32)


def token_value(positions):
    return ((positions * 2654435761) >> 7) % VOCAB


def make_rows(path, n_rows):
    """rows.npy with n_rows rows, unless it already exists with that shape."""
    if os.path.exists(path):
        existing = np.load(path, mmap_mode="r")
        if existing.shape == (n_rows, ROW_VALUES) and existing.dtype == np.float32:
            return path
    tmp = f"{path}.partial"
    out = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float32, shape=(n_rows, ROW_VALUES))
    step = max(1, CHUNK // (ROW_VALUES * 4))
    cols = np.arange(ROW_VALUES)[None, :]
    for start in range(0, n_rows, step):
        stop = min(n_rows, start + step)
        out[start:stop] = row_value(np.arange(start, stop)[:, None], cols)
    out.flush()
    del out
    os.replace(tmp, path)
    return path


def make_tokens(path, n_tokens):
    """tokens.bin with n_tokens uint16 tokens, unless it already exists."""
    if os.path.exists(path) and os.path.getsize(path) == 2 * n_tokens:
        return path
    tmp = f"{path}.partial"
    with open(tmp, "wb") as f:
        step = CHUNK // 2
        for start in range(0, n_tokens, step):
            stop = min(n_tokens, start + step)
            token_value(np.arange(start, stop, dtype=np.uint64)).astype(np.uint16).tofile(f)
    os.replace(tmp, path)
    return path


def warm_page_cache(path):
    """Reads a file once so the benchmark measures a warm page cache."""
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(CHUNK)
        while f.readinto(buf):
            pass


def memcpy_bandwidth(nbytes=512 << 20, repeats=5):
    """This machine's single-thread memcpy bandwidth in bytes/s (best of
    `repeats` copies of `nbytes`; NumPy's contiguous copy is one memcpy)."""
    src = np.ones(nbytes, np.uint8)
    dst = np.zeros(nbytes, np.uint8)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - start)
    return nbytes / best


# ----------------------------------------------------------- the checks


def _as_numpy(x):
    return x.numpy() if hasattr(x, "numpy") else np.asarray(x)


# The checks compare the first and last value of every row (and, for
# tokens, the shift between x and y) with values precomputed from the
# indices, so they cost a few microseconds a batch: the benchmark measures
# the loaders, not the check.

def expected_rows(indices):
    """What check_rows_batch compares for a batch of rows `indices`."""
    return row_value(np.asarray(indices)[:, None], np.array([[0, ROW_VALUES - 1]]))


def check_rows_batch(batch, expected):
    """A batch of rows.npy (a [rows] list, or the rows tensor itself)."""
    rows = _as_numpy(batch[0] if isinstance(batch, (list, tuple)) else batch)
    if rows.shape != (len(expected), ROW_VALUES):
        raise AssertionError(f"batch shape {rows.shape}")
    if not np.array_equal(rows[:, [0, -1]], expected):
        raise AssertionError("a batch holds the wrong rows")


def expected_tokens(starts):
    """What check_tokens_batch compares for windows starting at `starts`."""
    s = np.asarray(starts, dtype=np.uint64)[:, None]
    return token_value(s + np.array([[0, BLOCK - 1]], dtype=np.uint64)).astype(np.int64)


def check_tokens_batch(batch, expected):
    """An [x, y] batch of windows."""
    x, y = (_as_numpy(t) for t in batch)
    if x.dtype != np.int64 or x.shape != (len(expected), BLOCK) or y.shape != x.shape:
        raise AssertionError(f"batch {x.dtype} {x.shape} / {y.shape}")
    if not np.array_equal(x[:, [0, -1]], expected) or not np.array_equal(x[:, 1], y[:, 0]):
        raise AssertionError("a batch holds the wrong windows")


# -------------------------------------------- what a torch user would write


class TorchRows:
    """(a) One row per __getitem__, as a map-style dataset is usually
    written: a tensor copy of row i of the memory-mapped file."""

    def __init__(self, path):
        self.path = path
        self.rows = None  # opened lazily, in each worker process
        self.n = np.load(path, mmap_mode="r").shape[0]

    def __len__(self):
        return self.n

    def _open(self):
        if self.rows is None:
            self.rows = np.load(self.path, mmap_mode="r")
        return self.rows

    def __getitem__(self, i):
        return torch.from_numpy(np.array(self._open()[i]))

    def __getstate__(self):
        return {"path": self.path, "rows": None, "n": self.n}


class TorchRowBatches(TorchRows):
    """(b) The careful user's version: the sampler hands over a whole batch
    of indices and one fancy-indexing call gathers it (batch_size=None with
    a BatchSampler as the sampler)."""

    def __getitem__(self, indices):
        return torch.from_numpy(self._open()[np.asarray(indices)])


class TorchWindows:
    """(a) nanoGPT-style windows, one per __getitem__: (x, y) as int64."""

    def __init__(self, path, block=BLOCK):
        self.path = path
        self.block = block
        self.tokens = None
        self.n = (os.path.getsize(path) // 2 - 1 - block) // block + 1

    def __len__(self):
        return self.n

    def _open(self):
        if self.tokens is None:
            self.tokens = np.memmap(self.path, dtype=np.uint16, mode="r")
        return self.tokens

    def __getitem__(self, i):
        s = i * self.block
        w = torch.from_numpy(self._open()[s:s + self.block + 1].astype(np.int64))
        return w[:-1], w[1:]

    def __getstate__(self):
        return {"path": self.path, "block": self.block, "tokens": None, "n": self.n}


class TorchWindowBatches(TorchWindows):
    """(b) A whole batch of windows with one 2-d fancy index and one
    widening conversion."""

    def __getitem__(self, indices):
        starts = np.asarray(indices, dtype=np.int64)[:, None] * self.block
        w = torch.from_numpy(self._open()[starts + np.arange(self.block + 1)].astype(np.int64))
        return w[:, :-1], w[:, 1:]
