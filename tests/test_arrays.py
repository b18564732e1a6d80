"""ArrayDataset and TokenDataset: the native gather path yields what torch's
DataLoader yields for the equivalent TensorDataset / Python dataset, for
every sampler and batching mode, and bad input fails at construction with
a message naming what is wrong."""

import pytest

torch = pytest.importorskip("torch")

import gc  # noqa: E402
import os  # noqa: E402

import numpy as np  # noqa: E402
import torch.utils.data as tud  # noqa: E402

import fastload  # noqa: E402
from fl_helpers import check_parity, fastload_only  # noqa: E402
from proc_info import anon_rss_bytes  # noqa: E402

pytestmark = fastload_only

N = 37


def make_arrays(n=N):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, 3, 5)).astype(np.float32)
    y = rng.integers(0, 10, n)
    m = rng.integers(0, 255, (n, 4), dtype=np.uint8)
    return x, y, m


def tensor_dataset(*arrays):
    return tud.TensorDataset(*(torch.from_numpy(np.ascontiguousarray(a)) for a in arrays))


class NumpyRows(tud.Dataset):
    """What a user writes without fastload: rows of NumPy arrays."""

    def __init__(self, *arrays):
        self.arrays = arrays

    def __len__(self):
        return len(self.arrays[0])

    def __getitem__(self, i):
        return tuple(np.array(a[i]) for a in self.arrays)


class TokenWindows(tud.Dataset):
    """The Python token dataset TokenDataset stands in for."""

    def __init__(self, tokens, block, stride):
        self.tokens, self.block, self.stride = tokens, block, stride

    def __len__(self):
        return (len(self.tokens) - 1 - self.block) // self.stride + 1

    def __getitem__(self, i):
        s = i * self.stride
        w = self.tokens[s:s + self.block + 1].astype(np.int64)
        return w[:-1], w[1:]


CONFIGS = {
    "seq-bs4": lambda lib: dict(batch_size=4),
    "seq-bs4-drop": lambda lib: dict(batch_size=4, drop_last=True),
    "shuffle-bs5": lambda lib: dict(batch_size=5, shuffle=True, generator=torch.Generator().manual_seed(7)),
    "shuffle-bs5-w2": lambda lib: dict(batch_size=5, shuffle=True, num_workers=2,
                                       generator=torch.Generator().manual_seed(7)),
    "bs1-w1": lambda lib: dict(batch_size=1, num_workers=1),
    "bsNone": lambda lib: dict(batch_size=None),
    "bsNone-w2": lambda lib: dict(batch_size=None, num_workers=2),
    "subset-random": lambda lib: dict(batch_size=6, sampler=lib.SubsetRandomSampler(
        list(range(0, N, 2)), generator=torch.Generator().manual_seed(1))),
    "weighted": lambda lib: dict(batch_size=4, sampler=lib.WeightedRandomSampler(
        [1.0 + i % 3 for i in range(N)], 50, generator=torch.Generator().manual_seed(2))),
    "distributed": lambda lib: dict(batch_size=4, sampler=lib.DistributedSampler(
        range(N), num_replicas=3, rank=1, shuffle=True, seed=5)),
    "batch-sampler": lambda lib: dict(batch_sampler=lib.BatchSampler(
        lib.RandomSampler(range(N), generator=torch.Generator().manual_seed(4)), 8, False)),
    # The vectorised torch idiom: the batch sampler as sampler, one
    # __getitem__ per batch.
    "batches-as-samples": lambda lib: dict(batch_size=None, sampler=lib.BatchSampler(
        lib.RandomSampler(range(N), generator=torch.Generator().manual_seed(4)), 8, False)),
    "custom-collate-w2": lambda lib: dict(batch_size=4, num_workers=2, collate_fn=lambda b: b),
}


@pytest.mark.parametrize("config", list(CONFIGS))
def test_array_dataset_matches_tensor_dataset(config):
    x, y, m = make_arrays()
    # With its own collate_fn the loader hands over samples, which are NumPy
    # rows; otherwise batches are what a TensorDataset gives.
    reference = NumpyRows(x, y, m) if config.startswith("custom") else tensor_dataset(x, y, m)
    check_parity(reference, CONFIGS[config], fl_dataset=fastload.ArrayDataset(x, y, m), epochs=2)


@pytest.mark.parametrize("source", ["memmap", "npy-path", "tensors", "strided"])
def test_array_sources(tmp_path, source):
    x, y, _ = make_arrays()
    if source == "memmap":
        mx = np.memmap(tmp_path / "x.bin", dtype=x.dtype, mode="w+", shape=x.shape)
        mx[:] = x
        mx.flush()
        ds = fastload.ArrayDataset(np.memmap(tmp_path / "x.bin", dtype=x.dtype, mode="r",
                                             shape=x.shape), y)
    elif source == "npy-path":
        np.save(tmp_path / "x.npy", x)
        np.save(tmp_path / "y.npy", y)
        ds = fastload.ArrayDataset(tmp_path / "x.npy", str(tmp_path / "y.npy"))
        assert isinstance(ds.arrays[0], np.memmap)
    elif source == "tensors":
        ds = fastload.ArrayDataset(torch.from_numpy(x), torch.from_numpy(y))
    else:
        # Every other row of a bigger array: strided rows, each contiguous.
        big = np.repeat(x, 2, axis=0)
        ds = fastload.ArrayDataset(big[::2], y)
        assert ds.arrays[0].base is not None  # used in place, not copied
    check_parity(tensor_dataset(x, y),
                 lambda lib: dict(batch_size=6, shuffle=True, num_workers=2,
                                  generator=torch.Generator().manual_seed(9)),
                 fl_dataset=ds)


def test_noncontiguous_rows_are_copied_once():
    x = np.arange(N * 6, dtype=np.float64).reshape(N, 6)[:, ::2]  # strided within rows
    ds = fastload.ArrayDataset(x)
    assert ds.arrays[0].flags.c_contiguous
    np.testing.assert_array_equal(ds[[4, 1]][0], x[[4, 1]])


def test_noncontiguous_memmap_rows_are_refused(tmp_path):
    np.save(tmp_path / "x.npy", np.zeros((10, 6), np.float32))
    mm = np.load(tmp_path / "x.npy", mmap_mode="r")
    with pytest.raises(ValueError, match="memory-mapped and its rows are not contiguous"):
        fastload.ArrayDataset(mm[:, ::2])


def test_indexing_outside_a_loader():
    x, y, _ = make_arrays()
    ds = fastload.ArrayDataset(x, y)
    assert len(ds) == N
    row = ds[5]
    assert isinstance(row, tuple) and len(row) == 2
    np.testing.assert_array_equal(row[0], x[5])
    assert row[0].flags.writeable and row[0].base is None or row[0].base is not x
    np.testing.assert_array_equal(ds[-1][1], y[-1])
    np.testing.assert_array_equal(ds[np.int64(3)][0], x[3])
    batch = ds[[3, 0, -2]]
    np.testing.assert_array_equal(batch[0], x[[3, 0, -2]])
    np.testing.assert_array_equal(ds[np.array([2, 2], np.int32)][1], y[[2, 2]])
    np.testing.assert_array_equal(ds[torch.tensor([1, 4])][0], x[[1, 4]])
    np.testing.assert_array_equal(ds[2:5][0], x[2:5])
    items = ds.__getitems__([7, 8])
    assert len(items) == 2 and all(len(s) == 2 for s in items)
    np.testing.assert_array_equal(items[1][0], x[8])
    # A row of a 1-D array is a 0-d array, as np.array(y[i]) is: torch.from_numpy takes it.
    label = ds[5][1]
    assert isinstance(label, np.ndarray) and label.shape == () and label == y[5]
    assert torch.from_numpy(label).item() == y[5]


@pytest.mark.parametrize("bad", [N, -N - 1, 10**30])
def test_index_out_of_range_names_the_index(bad):
    ds = fastload.ArrayDataset(*make_arrays())
    with pytest.raises(IndexError, match=f"index {bad} is out of range for a dataset of {N}"):
        ds[[0, bad]]
    if abs(bad) < 2**63:
        with pytest.raises(IndexError, match=f"index {bad} is out of range"):
            ds[bad]


def test_bad_index_from_a_sampler_surfaces_in_the_loop():
    ds = fastload.ArrayDataset(*make_arrays())
    for workers in (0, 2):
        loader = fastload.DataLoader(ds, batch_size=3, sampler=[0, 1, 2, 3, N + 5, 4],
                                     num_workers=workers)
        it = iter(loader)
        assert next(it)[0].shape[0] == 3
        with pytest.raises(IndexError, match=f"index {N + 5} is out of range"):
            next(it)


def test_non_integer_indices_are_refused():
    ds = fastload.ArrayDataset(*make_arrays())
    with pytest.raises(TypeError, match="indices must be integers, not float"):
        ds[[1, 2.0]]
    with pytest.raises(TypeError, match="indices must be integers, not bool"):
        ds[[True]]
    with pytest.raises(TypeError, match="integers"):
        ds[np.array([1.0, 2.0])]


@pytest.mark.parametrize("arrays, error, message", [
    (lambda: (), ValueError, "at least one array"),
    (lambda: (np.zeros(3), np.zeros(4)), ValueError, r"differ in length \(array 0: 3, array 1: 4\)"),
    (lambda: (np.array([object()] * 3),), TypeError, "array 0 has dtype object"),
    (lambda: (np.zeros(3), np.array(["a", "b", "c"])), TypeError, "array 1 has dtype <U1"),
    (lambda: (np.zeros(3, dtype=[("a", "i4")]),), TypeError, "dtype"),
    (lambda: (np.float64(1.0),), TypeError, "expected a NumPy array"),
    (lambda: (np.array(1.0),), ValueError, "scalar"),
    (lambda: (np.zeros(3, ">f8"),), ValueError, "non-native byte order"),
    (lambda: ([1, 2, 3],), TypeError, "got list"),
])
def test_array_dataset_construction_errors(arrays, error, message):
    with pytest.raises(error, match=message):
        fastload.ArrayDataset(*arrays())


def test_not_a_npy_file(tmp_path):
    (tmp_path / "x.npy").write_bytes(b"PK\x03\x04 this is a zip")
    with pytest.raises(ValueError, match=r"x.npy' is not a .npy file"):
        fastload.ArrayDataset(tmp_path / "x.npy")
    np.save(tmp_path / "o.npy", np.array([{}, {}], dtype=object))
    with pytest.raises(ValueError, match=r"cannot memory-map .*o.npy"):
        fastload.ArrayDataset(tmp_path / "o.npy")
    with pytest.raises(ValueError, match="cannot open .*missing.npy"):
        fastload.ArrayDataset(tmp_path / "missing.npy")


# ------------------------------------------------------------------ tokens


def write_tokens(path, n, dtype=np.uint16, seed=0):
    tokens = np.random.default_rng(seed).integers(0, np.iinfo(dtype).max, n).astype(dtype)
    tokens.tofile(path)
    return tokens


@pytest.mark.parametrize("dtype", [np.uint16, np.uint32, np.int32, np.int64, np.uint8])
@pytest.mark.parametrize("stride", [None, 1, 7])
def test_token_windows_match_python(tmp_path, dtype, stride):
    tokens = write_tokens(tmp_path / "train.bin", 1000, dtype)
    block = 16
    ds = fastload.TokenDataset(tmp_path / "train.bin", block, dtype=dtype, stride=stride)
    ref = TokenWindows(tokens, block, stride or block)
    assert len(ds) == len(ref)
    check_parity(ref, lambda lib: dict(batch_size=8, shuffle=True, num_workers=2,
                                       generator=torch.Generator().manual_seed(1)),
                 fl_dataset=ds)


def test_token_dataset_len_counts_complete_windows():
    tokens = np.arange(100, dtype=np.uint16)
    assert len(fastload.TokenDataset(tokens, 99)) == 1
    assert len(fastload.TokenDataset(tokens, 9)) == 11  # the last starts at 90, ends at 99
    assert len(fastload.TokenDataset(tokens, 10)) == 9  # a 10th would need token 100
    ds = fastload.TokenDataset(tokens, 10, stride=1)
    assert len(ds) == 90
    x, y = ds[89]
    np.testing.assert_array_equal(x, np.arange(89, 99))
    np.testing.assert_array_equal(y, np.arange(90, 100))
    assert x.dtype == np.int64
    with pytest.raises(IndexError, match="index 90 is out of range for a dataset of 90"):
        ds[90]


def test_token_dataset_from_npy_and_arrays(tmp_path):
    tokens = np.arange(500, dtype=np.uint32)
    np.save(tmp_path / "t.npy", tokens)
    a = fastload.TokenDataset(tmp_path / "t.npy", 32)
    b = fastload.TokenDataset(tokens, 32)
    np.testing.assert_array_equal(a[[3, 1]][1], b[[3, 1]][1])
    with pytest.raises(ValueError, match="dtype=uint16 but .*t.npy' holds uint32"):
        fastload.TokenDataset(tmp_path / "t.npy", 32, dtype=np.uint16)


@pytest.mark.parametrize("make, error, message", [
    (lambda p: (p("odd.bin", b"\x01\x02\x03"), 1), ValueError,
     r"odd.bin' has 3 bytes, not a whole number of uint16 tokens"),
    (lambda p: (p("empty.bin", b""), 1), ValueError, "is empty"),
    (lambda p: (p("short.bin", b"\x00" * 20), 10), ValueError,
     r"block_size=10 needs at least 11 tokens, but .*short.bin' has 10"),
    (lambda p: (np.zeros(5, np.float32), 2), TypeError, "holds float32"),
    (lambda p: (np.zeros(5, np.uint64), 2), TypeError, "holds uint64"),
    (lambda p: (np.zeros((5, 2), np.uint16), 2), ValueError, "must be 1-d"),
    (lambda p: (np.zeros(50, np.uint16), 0), ValueError, "block_size must be a positive integer"),
    (lambda p: (np.zeros(50, np.uint16), 2.5), ValueError, "block_size must be a positive integer"),
])
def test_token_dataset_errors(tmp_path, make, error, message):
    def put(name, data):
        (tmp_path / name).write_bytes(data)
        return tmp_path / name
    source, block = make(put)
    with pytest.raises(error, match=message):
        fastload.TokenDataset(source, block)


def test_token_dataset_stride_error():
    with pytest.raises(ValueError, match="stride must be a positive integer"):
        fastload.TokenDataset(np.zeros(50, np.uint16), 4, stride=0)


# ------------------------------------------------------------------ memory


def test_memory_does_not_grow_with_length_or_workers(tmp_path):
    """The dataset object holds the mapping, not per-sample Python objects,
    and workers share it: private memory after building a dataset over
    256 MiB of rows and loading from it with 0-2 workers grows by a few
    batch buffers, not with the file.  (Mapped file pages are page cache,
    shared with the system, and not counted.)"""
    rows, width = 1 << 16, 1024
    mm = np.lib.format.open_memmap(tmp_path / "big.npy", mode="w+", dtype=np.float32,
                                   shape=(rows, width))
    mm[::4096] = 1.0
    mm.flush()
    del mm
    gc.collect()
    before = anon_rss_bytes()
    ds = fastload.ArrayDataset(tmp_path / "big.npy")
    for workers in (0, 1, 2):
        loader = fastload.DataLoader(ds, batch_size=64, num_workers=workers,
                                     sampler=range(0, rows, rows // 256))
        for (batch,) in loader:
            assert batch.shape == (64, width)
    grown = anon_rss_bytes() - before
    assert grown < 32 << 20, f"private memory grew by {grown >> 20} MiB"
    assert os.path.getsize(tmp_path / "big.npy") > 256 << 20


# ------------------------------------------------------- index arrays


@pytest.mark.parametrize("make_sampler", [
    lambda g: fastload.RandomSampler(range(100), generator=g),
    lambda g: fastload.RandomSampler(range(100), num_samples=250, generator=g),
    lambda g: fastload.RandomSampler(range(100), replacement=True, num_samples=77, generator=g),
    lambda g: fastload.SequentialSampler(range(100)),
], ids=["perm", "perm-repeat", "replacement", "sequential"])
@pytest.mark.parametrize("batch_size, drop_last", [(1, False), (7, False), (7, True), (64, False)])
@pytest.mark.parametrize("rng", ["torch", "numpy"])
def test_array_batches_equal_the_batch_sampler(make_sampler, batch_size, drop_last, rng):
    """Native datasets take a BatchSampler's batches as arrays; they must be
    the same batches, drawn with the same consumption of the generator."""
    def generator():
        return torch.Generator().manual_seed(5) if rng == "torch" else np.random.default_rng(5)
    g1, g2 = generator(), generator()
    expected = list(fastload.BatchSampler(make_sampler(g1), batch_size, drop_last))
    arrays = list(fastload.BatchSampler(make_sampler(g2), batch_size, drop_last)._array_batches())
    assert [a.tolist() for a in arrays] == expected
    assert all(a.dtype == np.int64 for a in arrays)
    if rng == "torch":
        assert torch.equal(g1.get_state(), g2.get_state())
    else:
        assert g1.integers(1 << 30) == g2.integers(1 << 30)


def test_custom_samplers_are_iterated_as_they_are():
    class Reversed(fastload.SequentialSampler):
        def __iter__(self):
            return iter(range(len(self.data_source) - 1, -1, -1))

    assert fastload.BatchSampler(Reversed(range(5)), 2, False)._array_batches() is None
    ds = fastload.ArrayDataset(np.arange(5))
    batches = list(fastload.DataLoader(ds, batch_size=2, sampler=Reversed(range(5))))
    assert [b[0].tolist() for b in batches] == [[4, 3], [2, 1], [0]]
