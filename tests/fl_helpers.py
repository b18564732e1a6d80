"""Shared helpers and datasets for the fastload test suite.

Imported by the test modules as ``import fl_helpers`` (conftest.py puts this
directory on ``sys.path``, so this works with any pytest import mode).

Everything here needs torch; test modules call ``pytest.importorskip("torch")``
before importing this module.
"""

import collections
import collections.abc
import contextlib
import copy
import gc
import os
import re
import time
import warnings

import numpy as np
import pytest
import torch
import torch.utils.data as tud

import fastload
from proc_info import native_thread_count, native_thread_names, rss_bytes  # noqa: F401 (re-exported)

# The suite can also run with torch standing in for fastload (a package that
# re-exports torch's objects and sets __torch_shim__): that checks that the
# tests themselves encode torch's behaviour.  Tests of what only fastload
# offers are marked fastload_only and skipped then.
IS_SHIM = bool(getattr(fastload, "__torch_shim__", False))
fastload_only = pytest.mark.skipif(
    IS_SHIM, reason="fastload-only feature (suite is running against the torch shim)"
)

TORCH = tud  # "lib" namespace used for the reference run
FL = fastload  # "lib" namespace used for the run under test
LIBS = [pytest.param(tud, id="torch"), pytest.param(fastload, id="fastload")]

# torch warns (and -W error turns it into an exception) when num_workers exceeds
# the CPU count; it is irrelevant to what we test.
WORKER_COUNT_WARNING = r"This DataLoader will create \d+ worker processes"

N = 23  # default map-style dataset length (odd and prime: exercises drop_last)

Point = collections.namedtuple("Point", ["x", "y"])
Triple = collections.namedtuple("Triple", ["a", "b", "c"])


# --------------------------------------------------------------------------
# comparison helpers
# --------------------------------------------------------------------------

def _short(x, n=200):
    r = repr(x)
    return r if len(r) <= n else r[:n] + "..."


def assert_same(actual, expected, path="out"):
    """Recursively assert that ``actual`` (fastload) equals ``expected`` (torch).

    Container types must match exactly (list vs tuple, namedtuple class, dict
    subclass, key order), tensors must match in type, dtype, shape, device and
    values (torch.equal), numpy arrays in dtype, shape and values, scalars in
    exact Python type and value.
    """
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), (
            f"{path}: expected torch.Tensor, got {type(actual).__name__}: {_short(actual)}")
        assert type(actual) is type(expected), f"{path}: {type(actual)} != {type(expected)}"
        assert actual.dtype == expected.dtype, f"{path}: dtype {actual.dtype} != {expected.dtype}"
        assert tuple(actual.shape) == tuple(expected.shape), (
            f"{path}: shape {tuple(actual.shape)} != {tuple(expected.shape)}")
        assert actual.device == expected.device, f"{path}: device {actual.device} != {expected.device}"
        assert torch.equal(actual, expected), (
            f"{path}: values differ:\n  got      {_short(actual)}\n  expected {_short(expected)}")
    elif isinstance(expected, np.ndarray):
        assert isinstance(actual, np.ndarray), (
            f"{path}: expected numpy.ndarray, got {type(actual).__name__}: {_short(actual)}")
        assert actual.dtype == expected.dtype, f"{path}: dtype {actual.dtype} != {expected.dtype}"
        assert actual.shape == expected.shape, f"{path}: shape {actual.shape} != {expected.shape}"
        if expected.dtype.kind in "OUSV":
            assert actual.tolist() == expected.tolist(), f"{path}: values differ"
        else:
            assert np.array_equal(actual, expected), (
                f"{path}: values differ:\n  got      {_short(actual)}\n  expected {_short(expected)}")
    elif isinstance(expected, np.generic):
        assert type(actual) is type(expected), (
            f"{path}: type {type(actual).__name__} != {type(expected).__name__}")
        assert actual == expected, f"{path}: {actual!r} != {expected!r}"
    elif isinstance(expected, tuple) and hasattr(expected, "_fields"):
        assert type(actual) is type(expected), f"{path}: type {type(actual)} != {type(expected)}"
        for f in expected._fields:
            assert_same(getattr(actual, f), getattr(expected, f), f"{path}.{f}")
    elif isinstance(expected, (list, tuple)):
        assert type(actual) is type(expected), (
            f"{path}: type {type(actual).__name__} != {type(expected).__name__}")
        assert len(actual) == len(expected), f"{path}: len {len(actual)} != {len(expected)}"
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_same(a, e, f"{path}[{i}]")
    elif isinstance(expected, collections.abc.Mapping):
        assert type(actual) is type(expected), f"{path}: type {type(actual)} != {type(expected)}"
        assert list(actual.keys()) == list(expected.keys()), (
            f"{path}: keys {list(actual.keys())} != {list(expected.keys())}")
        for k in expected:
            assert_same(actual[k], expected[k], f"{path}[{k!r}]")
    else:
        assert type(actual) is type(expected), (
            f"{path}: type {type(actual).__name__} != {type(expected).__name__} "
            f"({_short(actual)} vs {_short(expected)})")
        assert actual == expected, f"{path}: {_short(actual)} != {_short(expected)}"


def assert_same_epochs(actual, expected):
    assert len(actual) == len(expected), f"epochs: {len(actual)} != {len(expected)}"
    for e, (a_ep, e_ep) in enumerate(zip(actual, expected)):
        assert len(a_ep) == len(e_ep), (
            f"epoch {e}: fastload yielded {len(a_ep)} batches, torch {len(e_ep)}\n"
            f"  fastload: {[canonical(b) for b in a_ep][:8]}\n  torch:    {[canonical(b) for b in e_ep][:8]}")
        for i, (a, b) in enumerate(zip(a_ep, e_ep)):
            assert_same(a, b, f"epoch{e}.batch{i}")


def canonical(x):
    """Hashable, orderable, type-preserving description of a (nested) batch."""
    if isinstance(x, torch.Tensor):
        return ("tensor", str(x.dtype), tuple(x.shape), repr(x.flatten().tolist()))
    if isinstance(x, np.ndarray):
        return ("ndarray", str(x.dtype), x.shape, repr(x.ravel().tolist()))
    if isinstance(x, collections.abc.Mapping):
        return (type(x).__name__, tuple((repr(k), canonical(v)) for k, v in x.items()))
    if isinstance(x, (list, tuple)):
        return (type(x).__name__, tuple(canonical(v) for v in x))
    return (type(x).__name__, repr(x))


def assert_same_multiset(actual_batches, expected_batches):
    a = sorted(repr(canonical(b)) for b in actual_batches)
    e = sorted(repr(canonical(b)) for b in expected_batches)
    assert len(a) == len(e), f"fastload yielded {len(a)} batches, torch {len(e)}"
    assert a == e, "the multisets of batches differ"


def to_numpy_tree(x):
    """torch result -> what output='numpy' must produce (tensors -> .numpy())."""
    if isinstance(x, torch.Tensor):
        return x.numpy()
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return type(x)(*(to_numpy_tree(v) for v in x))
    if isinstance(x, (list, tuple)):
        return type(x)(to_numpy_tree(v) for v in x)
    if isinstance(x, collections.abc.Mapping):
        out = copy.copy(x)  # keeps dict subclasses / OrderedDict / defaultdict
        for k, v in x.items():
            out[k] = to_numpy_tree(v)
        return out
    return x


def contains_tensor(x):
    if isinstance(x, torch.Tensor):
        return True
    if isinstance(x, collections.abc.Mapping):
        return any(contains_tensor(v) for v in x.values())
    if isinstance(x, (list, tuple)):
        return any(contains_tensor(v) for v in x)
    return False


# --------------------------------------------------------------------------
# running loaders
# --------------------------------------------------------------------------

@contextlib.contextmanager
def no_worker_count_warning():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=WORKER_COUNT_WARNING)
        yield


# fastload's worker_mode for check_parity/run_loader runs with workers (None:
# the loader's default); tests/test_parity.py runs every case in each mode.
WORKER_MODE = None


def run_loader(DataLoader, dataset, kwargs, epochs=1, global_seed=None, before_epoch=None):
    """Build one loader and return [list(batches) for each epoch]."""
    if (DataLoader is fastload.DataLoader and WORKER_MODE is not None and not IS_SHIM
            and kwargs.get("num_workers", 0) > 0 and "worker_mode" not in kwargs):
        kwargs = dict(kwargs, worker_mode=WORKER_MODE)
    with no_worker_count_warning():
        loader = DataLoader(dataset, **kwargs)
        if global_seed is not None:
            torch.manual_seed(global_seed)
        out = []
        for e in range(epochs):
            if before_epoch is not None:
                before_epoch(kwargs, e)
            out.append(list(loader))
        del loader
    return out


_WORKER_ONLY_KWARGS = ("prefetch_factor", "persistent_workers", "in_order", "timeout",
                       "worker_init_fn", "multiprocessing_context")


def torch_reference_kwargs(dataset, kwargs):
    """Kwargs for the torch reference run.

    For map-style datasets torch's output (values, order, RNG consumption) does
    not depend on num_workers unless workers are persistent (then torch skips the
    base-seed draw on later epochs), so the reference runs in-process: forking
    torch worker processes is slow. test_parity.py::test_torch_reference_shortcut
    checks that premise.
    """
    if (isinstance(dataset, tud.IterableDataset) or kwargs.get("persistent_workers")
            or not kwargs.get("num_workers")):
        return kwargs
    out = {k: v for k, v in kwargs.items() if k not in _WORKER_ONLY_KWARGS}
    out["num_workers"] = 0
    return out


def check_parity(dataset, kwargs_factory=None, *, fl_dataset=None, epochs=1, global_seed=None,
                 before_epoch=None, ordered=True, fl_extra=None, torch_workers="auto"):
    """Run the same configuration through torch's and fastload's DataLoader.

    ``kwargs_factory(lib)`` builds the DataLoader kwargs; it is called once per
    library so that generators / samplers are separate but equally seeded objects.
    ``fl_dataset`` optionally gives the fastload run its own (equivalent) dataset.
    ``torch_workers="auto"`` lets the torch reference run in-process when that
    cannot change its output (see torch_reference_kwargs); "same" forces the
    reference to use the same num_workers.
    Returns (fastload_epochs, torch_epochs).
    """
    kwargs_factory = kwargs_factory or (lambda lib: {})
    t_kwargs = kwargs_factory(TORCH)
    if torch_workers == "auto":
        t_kwargs = torch_reference_kwargs(dataset, t_kwargs)
    f_kwargs = kwargs_factory(FL)
    if fl_extra:
        f_kwargs.update(fl_extra)
    expected = run_loader(tud.DataLoader, dataset, t_kwargs, epochs, global_seed, before_epoch)
    t_rng = torch.get_rng_state() if global_seed is not None else None
    actual = run_loader(fastload.DataLoader, dataset if fl_dataset is None else fl_dataset,
                        f_kwargs, epochs, global_seed, before_epoch)
    if ordered:
        assert_same_epochs(actual, expected)
    else:
        assert len(actual) == len(expected)
        for a_ep, e_ep in zip(actual, expected):
            assert_same_multiset(a_ep, e_ep)
    if global_seed is not None:
        # both loaders must have consumed the global RNG identically
        assert torch.equal(torch.get_rng_state(), t_rng), "global torch RNG consumed differently"
    g_t, g_f = t_kwargs.get("generator"), f_kwargs.get("generator")
    if isinstance(g_t, torch.Generator) and isinstance(g_f, torch.Generator):
        assert torch.equal(g_f.get_state(), g_t.get_state()), "generator consumed differently"
    return actual, expected


def capture_exception(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001
        return e
    return None


def wait_until(predicate, timeout=10.0, interval=0.01):
    """Poll ``predicate`` until true or ``timeout`` seconds passed (collecting
    garbage about once a second: gc.collect() is slow with torch loaded)."""
    start = time.monotonic()
    deadline, next_gc = start + timeout, start + 1.0
    while True:
        if predicate():
            return True
        now = time.monotonic()
        if now > deadline:
            return False
        if now > next_gc:
            gc.collect()
            next_gc = now + 1.0
        time.sleep(interval)


def draw_base_seed(generator=None):
    """How torch draws the per-iterator base seed."""
    return torch.empty((), dtype=torch.int64).random_(generator=generator).item()


# --------------------------------------------------------------------------
# map-style datasets
# --------------------------------------------------------------------------
# Each dataset body is a mixin so the same logic can be combined with
# torch.utils.data.Dataset or fastload.Dataset (see make_map_dataset(base=...)).

class _ArrayMixin:
    """Fixed-size float32 ndarray per sample."""

    def __init__(self, n=N, shape=(2, 3), dtype=np.float32):
        self.n, self.shape, self.dtype = n, shape, dtype

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        size = int(np.prod(self.shape))
        return (np.arange(size) + i * size).astype(self.dtype).reshape(self.shape)


class _TupleMixin:
    """(ndarray, int label)."""

    def __init__(self, n=N):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return np.arange(4, dtype=np.int64) * i, i % 5


class _DictMixin:
    """dict of arrays / python floats / ints / nested dict with numpy scalars."""

    def __init__(self, n=N):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {
            "image": np.full((2, 2), i, dtype=np.float32) + np.eye(2, dtype=np.float32),
            "score": i / 4.0,
            "idx": i,
            "meta": {"flag": i % 2 == 0, "code": np.int16(i * 3), "weight": np.float64(i) / 3},
        }


class _NamedTupleMixin:
    def __init__(self, n=N):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return Point(x=np.linspace(0, i, 3), y=i)


class _NestedListMixin:
    def __init__(self, n=N):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return [[i, i + 1], [float(i), np.float32(i) / 2], (np.arange(2, dtype=np.uint8) + i, f"n{i}")]


class _TorchTensorMixin:
    def __init__(self, n=N):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return (
            torch.arange(6, dtype=torch.float32).reshape(2, 3) + i,
            torch.tensor(i),
            torch.tensor(i % 3 == 0),
            torch.full((2,), i, dtype=torch.int16),
            torch.tensor([i, -i], dtype=torch.float64),
        )


NP_SCALAR_DTYPES = ["f2", "f4", "f8", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "b1", "c8", "c16"]


class _NumpyScalarMixin:
    """A tuple of numpy scalars, one per dtype in NP_SCALAR_DTYPES."""

    def __init__(self, n=N):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        out = []
        for dt in NP_SCALAR_DTYPES:
            v = (i % 2) if dt == "b1" else (i % 7) + (0.5 if dt[0] in "fc" else 0)
            out.append(np.dtype(dt).type(v))
        return tuple(out)


class _PyScalarMixin:
    def __init__(self, n=N):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i * 0.5, i, i % 3 == 0


class _StrBytesMixin:
    def __init__(self, n=N):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"name": f"item{i}", "raw": bytes([65 + i % 26]) * 2, "label": i}


class _MemmapMixin:
    """Rows of a numpy memmap (writable mode so torch does not warn)."""

    def __init__(self, path, n=N, cols=5):
        self.n = n
        mm = np.memmap(path, dtype=np.float32, mode="w+", shape=(n, cols))
        mm[:] = np.arange(n * cols, dtype=np.float32).reshape(n, cols)
        mm.flush()
        del mm
        self.mm = np.memmap(path, dtype=np.float32, mode="r+", shape=(n, cols))

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return self.mm[i]


class _GetItemsMixin:
    """Has __getitems__; its samples are tagged so parity shows which path was used."""

    def __init__(self, n=N):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"v": np.array([i, 2 * i], dtype=np.int32), "via": "getitem"}

    def __getitems__(self, indices):
        return [{"v": np.array([i, 2 * i], dtype=np.int32), "via": "getitems"} for i in indices]


_MAP_MIXINS = {
    "array": _ArrayMixin,
    "tuple": _TupleMixin,
    "dict": _DictMixin,
    "namedtuple": _NamedTupleMixin,
    "nested_list": _NestedListMixin,
    "torch_tensors": _TorchTensorMixin,
    "np_scalars": _NumpyScalarMixin,
    "py_scalars": _PyScalarMixin,
    "str_bytes": _StrBytesMixin,
    "memmap": _MemmapMixin,
    "getitems": _GetItemsMixin,
}

MAP_DATASET_NAMES = list(_MAP_MIXINS) + ["tensor_dataset", "subset_concat"]

_class_cache = {}


def map_dataset_class(name, base=tud.Dataset):
    key = (name, base)
    if key not in _class_cache:
        mixin = _MAP_MIXINS[name]
        _class_cache[key] = type(f"{mixin.__name__.strip('_')}_{base.__module__.split('.')[0]}",
                                 (mixin, base), {})
    return _class_cache[key]


def make_map_dataset(name, tmp_dir=None, base=tud.Dataset):
    if name == "tensor_dataset":
        return tud.TensorDataset(torch.arange(N * 2, dtype=torch.float32).reshape(N, 2),
                                 torch.arange(N))
    if name == "subset_concat":
        cat = tud.ConcatDataset([map_dataset_class("array", base)(10),
                                 map_dataset_class("tuple", base)(13)])
        # elements of the two parts differ in structure, keep the subset within one part
        return tud.Subset(cat, [12, 10, 22, 15, 11, 20, 13, 21, 18, 14, 16])
    cls = map_dataset_class(name, base)
    if name == "memmap":
        assert tmp_dir is not None
        return cls(os.path.join(str(tmp_dir), f"memmap_{id(cls)}.bin"))
    return cls()


# --------------------------------------------------------------------------
# iterable datasets
# --------------------------------------------------------------------------

def uneven_bounds(n, num_workers, worker_id):
    """Contiguous shard of range(n) for ``worker_id``; shard sizes grow as (w+1)**2."""
    weights = [(w + 1) ** 2 for w in range(num_workers)]
    total = sum(weights)
    cum = [0]
    for w in weights:
        cum.append(cum[-1] + w)
    lo = round(n * cum[worker_id] / total)
    hi = round(n * cum[worker_id + 1] / total)
    return lo, hi


class _RangeIterableMixin:
    """Yields (int32 array, int) pairs.

    shard: "none"   - every worker yields the whole range (torch duplicates data)
           "uneven" - contiguous shards of different sizes (workers end at different times)
           "stride" - range(id, n, num_workers)
    get_info: the get_worker_info function used for sharding (torch's or fastload's).
    """

    def __init__(self, n=17, shard="uneven", get_info=None):
        self.n, self.shard = n, shard
        self.get_info = get_info or tud.get_worker_info

    def __iter__(self):
        info = self.get_info() if self.shard != "none" else None
        if info is None:
            lo, hi, step = 0, self.n, 1
        elif self.shard == "uneven":
            lo, hi = uneven_bounds(self.n, info.num_workers, info.id)
            step = 1
        else:
            lo, hi, step = info.id, self.n, info.num_workers
        for i in range(lo, hi, step):
            yield np.full(3, i, dtype=np.int32), i


class _DictIterableMixin:
    """Yields dicts, sharded with stride; no __len__."""

    def __init__(self, n=11, get_info=None):
        self.n = n
        self.get_info = get_info or tud.get_worker_info

    def __iter__(self):
        info = self.get_info()
        wid, nw = (0, 1) if info is None else (info.id, info.num_workers)
        for i in range(wid, self.n, nw):
            yield {"x": np.float64(i) * 1.5, "tag": f"t{i}", "arr": np.arange(2) + i}


def iterable_dataset(kind="range", base=tud.IterableDataset, **kwargs):
    mixin = {"range": _RangeIterableMixin, "dict": _DictIterableMixin}[kind]
    key = ("iter", kind, base)
    if key not in _class_cache:
        _class_cache[key] = type(f"{mixin.__name__.strip('_')}_{base.__module__.split('.')[0]}",
                                 (mixin, base), {})
    return _class_cache[key](**kwargs)


class SizedIterable(tud.IterableDataset):
    """IterableDataset that reports ``length`` but yields ``actual`` items."""

    def __init__(self, length, actual):
        self.length, self.actual = length, actual

    def __len__(self):
        return self.length

    def __iter__(self):
        return iter(range(self.actual))


# --------------------------------------------------------------------------
# samplers that are not torch Sampler subclasses
# --------------------------------------------------------------------------

class IterableIndices:
    """A generator-like iterable of indices (no __len__); re-iterable."""

    def __init__(self, indices):
        self.indices = list(indices)

    def __iter__(self):
        for i in self.indices:
            yield i


def sum_collate(batch):
    """A custom collate_fn: returns numpy / python objects (must NOT be converted)."""
    xs = np.stack([np.asarray(b[0]) for b in batch])
    return {"sum": xs.sum(axis=0), "labels": tuple(b[1] for b in batch), "n": len(batch)}


def identity(x):
    return x


def synthesized_images(seed):
    """Real-content HWC uint8 pictures of several shapes (odd sizes, a square
    one, tiny ones for filters' borders), the same for the same seed."""
    import imagenet_like  # benchmarks/, on sys.path from the test module

    bank = imagenet_like.texture_bank(0)
    out = []
    for i, (w, h) in enumerate(((160, 120), (97, 131), (64, 64), (2, 5), (1, 1))):
        rng = np.random.default_rng([seed, i])
        out.append(np.ascontiguousarray(
            np.asarray(imagenet_like.synthesize(rng, w, h, bank).convert("RGB"))))
    return out


def assert_truncation_is_named(dataset, path, rows, num_workers):
    """A file cut to one page after the first batch of 256 rows: the next
    batch raises an OSError naming it, with or without workers."""
    loader = fastload.DataLoader(dataset, batch_size=256, num_workers=num_workers,
                                 output="numpy")
    it = iter(loader)
    np.testing.assert_array_equal(next(it)[0], rows[:256])
    os.truncate(path, os.sysconf("SC_PAGESIZE"))
    with pytest.raises(OSError, match=re.escape(f"{str(path)!r} is shorter than when it was "
                                                "opened")):
        for _ in it:
            pass
    del it


def row_dataset_configs(n):
    """The loader configurations a dataset of `n` rows read from a file is
    checked with against torch (check_parity's (kwargs factory, fastload
    extra) pairs): shuffled with 0 workers, with 2 thread and 2 process
    workers, and under DistributedSampler with 2 workers."""
    def shuffled(**kwargs):
        return lambda lib: dict(batch_size=5, shuffle=True,
                                generator=torch.Generator().manual_seed(7), **kwargs)
    return {
        "shuffle-bs5": (shuffled(), None),
        "shuffle-w2-threads": (shuffled(num_workers=2), {"worker_mode": "thread"}),
        "shuffle-w2-processes": (shuffled(num_workers=2), {"worker_mode": "process"}),
        "distributed-w2": (lambda lib: dict(batch_size=4, num_workers=2,
                                            sampler=lib.DistributedSampler(
                                                range(n), num_replicas=3, rank=1,
                                                shuffle=True, seed=5)), None),
    }


def torchvision_colour(F, image, op, factor):
    """torchvision's functional colour op `op` (0 brightness, 1 contrast,
    2 saturation, 3 hue) on `image`, a PIL image or a tensor."""
    fn = (F.adjust_brightness, F.adjust_contrast, F.adjust_saturation, F.adjust_hue)[op]
    return fn(image, factor)


def torchvision_colour_chain(F, image, order, factors, gray_first):
    """What ColorJitter with fixed `factors`, applied in `order`, and a
    grayscale to 3 channels (before the jitter or after it) give in
    torchvision's functional ops."""
    if gray_first:
        image = F.rgb_to_grayscale(image, num_output_channels=3)
    for op in order:
        image = torchvision_colour(F, image, op, factors[op])
    if not gray_first:
        image = F.rgb_to_grayscale(image, num_output_channels=3)
    return image


def run_in_child(code, timeout=300):
    """Runs `code` (dedented) in a child interpreter importing this checkout's
    fastload, so a SIGBUS or abort there ends the child, not pytest.  Returns
    the subprocess.CompletedProcess (text output)."""
    import subprocess
    import sys
    import textwrap

    root = os.path.dirname(os.path.dirname(os.path.abspath(fastload.__file__)))
    env = dict(os.environ)
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("PYTHONWARNINGS", None)
    return subprocess.run([sys.executable, "-X", "faulthandler", "-c", textwrap.dedent(code)],
                          cwd=root, env=env, capture_output=True, text=True, timeout=timeout)


def assert_child_ok(result):
    """The child of run_in_child ran to its end (printed "done") and exited 0."""
    output = f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert "Fatal Python error" not in result.stderr, output
    assert result.returncode == 0, output
    assert result.stdout.rstrip().endswith("done"), output
