"""ZarrDataset: batches equal to what zarr reads for the same rows, for
v2 and v3 stores read chunk by chunk, mapped (one plain chunk) or through
zarr (sharded), with thread and process workers and the usual samplers;
bad stores and chunks fail with messages naming them.  ChunkShuffleSampler:
a permutation each epoch, drawn from (seed, epoch), whose batches touch few
chunks, split between replicas."""

import os
import pickle
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
zarr = pytest.importorskip("zarr")

import numpy as np  # noqa: E402
import torch.utils.data as tud  # noqa: E402

import fastload  # noqa: E402
from fl_helpers import (assert_truncation_is_named, check_parity,  # noqa: E402
                        fastload_only, row_dataset_configs)

pytestmark = [fastload_only,
              pytest.mark.filterwarnings("ignore:This process .* is multi-threaded, use of fork")]

N = 37


def write_store(path, zarr_format):
    rng = np.random.default_rng(zarr_format)
    images = rng.integers(0, 255, (N, 3, 4, 5), dtype=np.uint8)
    g = zarr.open_group(path, mode="w", zarr_format=zarr_format)
    g.create_array("images", data=images, chunks=(4, 3, 4, 5))  # zarr's default: zstd
    g.create_array("labels", data=rng.integers(0, 10, N), chunks=(8,))
    g.create_array("raw", data=rng.standard_normal((N, 6)).astype(np.float32), chunks=(N, 6),
                   compressors=None)
    blosc = (zarr.codecs.BloscCodec(cname="lz4") if zarr_format == 3
             else __import__("numcodecs").Blosc(cname="lz4"))
    g.create_array("big_endian", data=np.arange(N * 2, dtype=">i4").reshape(N, 2),
                   chunks=(5, 2), compressors=blosc)
    sparse = np.zeros((N, 3), np.float64)
    sparse[20:] = 1.5  # chunks 0-3 hold only the fill value: zarr writes no file for them
    g.create_array("sparse", data=sparse, chunks=(5, 3), fill_value=0.0)
    if zarr_format == 3:
        g.create_array("sharded", data=rng.standard_normal((N, 2)), chunks=(2, 2), shards=(8, 2))
        g.create_array("group/flags", data=np.arange(N) % 3 == 0, chunks=(10,))
        g.create_array("names", shape=(N,), dtype=str)
        g.create_array("short", data=np.arange(N - 1), chunks=(N - 1,))
        g.create_array("scalar", shape=(), dtype="f8")
    return path


class ZarrRows(tud.Dataset):
    """What a user writes without fastload: zarr per sample."""

    def __init__(self, path, keys):
        self.path, self.keys, self.arrays = path, keys, None

    def __len__(self):
        return zarr.open_group(self.path, mode="r")[self.keys[0]].shape[0]

    def __getitem__(self, i):
        if self.arrays is None:
            group = zarr.open_group(self.path, mode="r")
            self.arrays = [group[k] for k in self.keys]
        return tuple(np.asarray(a[i]).astype(a.dtype.newbyteorder("=")) for a in self.arrays)


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    root = tmp_path_factory.mktemp("zarr")
    return {3: write_store(str(root / "v3.zarr"), 3), 2: write_store(str(root / "v2.zarr"), 2)}


KEYSETS = {
    "v3-chunks": (3, ("images", "labels", "big_endian", "sparse", "group/flags")),
    "v3-mapped-and-sharded": (3, ("raw", "sharded", "labels")),
    "v2": (2, ("images", "labels", "raw", "big_endian", "sparse")),
}

CONFIGS = {
    **row_dataset_configs(N),
    "chunk-shuffled": (lambda lib: dict(batch_size=6, sampler=fastload.ChunkShuffleSampler(
        N, 4, block=2, seed=3)), None),
}


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("keys", list(KEYSETS))
def test_batches_match_zarr(stores, keys, config):
    version, names = KEYSETS[keys]
    ds = fastload.ZarrDataset(stores[version], names)
    make, extra = CONFIGS[config]
    check_parity(ZarrRows(stores[version], names), make, fl_dataset=ds, epochs=2,
                 fl_extra=extra)


def test_storage_is_told_apart(stores):
    ds = fastload.ZarrDataset(stores[3], ("raw", "images", "sharded"))
    assert ds.mapped_keys == ("raw",)
    assert "raw: float32[6] mapped, images: uint8[3, 4, 5] chunks, sharded: float64[2] read" \
        in repr(ds)
    assert ds._native_source() is None  # a batch needs Python: the dataset path
    mapped = fastload.ZarrDataset(stores[2], ("raw",))
    assert mapped._native_source() is not None  # every key mapped: C worker threads
    # Chunk reads release the GIL: thread workers by default, unless zarr's
    # pipeline (one event-loop thread a process) reads a key.
    modes = {keys: fastload.loader.iterators.worker_mode(fastload.DataLoader(
        fastload.ZarrDataset(stores[3], keys), batch_size=4, num_workers=2))
        for keys in (("raw", "images"), ("images", "sharded"))}
    assert modes == {("raw", "images"): "thread", ("images", "sharded"): "process"}


def test_indexing_outside_a_loader_and_zarr_objects(stores):
    group = zarr.open_group(stores[3], mode="r")
    ds = fastload.ZarrDataset(group, ("images", "big_endian"))
    images, swapped = group["images"][:], group["big_endian"][:]
    order = [30, 2, 30, -1, 0]
    for got, want in zip(ds[order], (images, swapped)):
        np.testing.assert_array_equal(got, want[order])
    assert ds[0][1].dtype == np.dtype("=i4")
    np.testing.assert_array_equal(ds[np.arange(3, 9)][0], images[3:9])  # a run
    np.testing.assert_array_equal(ds[2:9:3][0], images[2:9:3])
    assert ds[[]][0].shape == (0, 3, 4, 5)
    with pytest.raises(IndexError, match=f"index {N} is out of range for a dataset of {N}"):
        ds[[0, N]]
    copy = pickle.loads(pickle.dumps(ds))  # a zarr object pickles as zarr pickles it
    np.testing.assert_array_equal(copy[[5]][0], images[[5]])
    # One array (a path or a zarr.Array) is a dataset of one column.
    for single in (os.path.join(stores[3], "labels"), group["labels"]):
        one = fastload.ZarrDataset(single)
        assert one.keys == ("labels",) and len(one[3]) == 1
        np.testing.assert_array_equal(one[[4, 1]][0], group["labels"][[4, 1]])
    with pytest.raises(ValueError, match="is an array, not a group"):
        fastload.ZarrDataset(group["labels"], keys=("labels",))


def test_a_store_path_pickles_as_the_path(stores):
    """What a spawned worker process receives: the path and the layout; it
    opens the store itself."""
    ds = fastload.ZarrDataset(stores[3], ("images", "raw"))
    state = pickle.dumps(ds)
    assert len(state) < 4096  # no data, no zarr object
    copy = pickle.loads(state)
    assert copy._zarr[0] is not ds._zarr[0]
    for got, want in zip(copy[[9, 1]], ds[[9, 1]]):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("keys, error, message", [
    (("images", "missing"), KeyError, r"v3.zarr' has no array 'missing' \(its arrays: .*'images'"),
    (("group",), ValueError, r"v3.zarr': 'group' is a group, not an array"),
    (("names",), TypeError, r"v3.zarr': array 'names' has dtype .*ZarrDataset serves numeric"),
    (("images", "short"), ValueError, r"arrays differ in length \('images': 37, 'short': 36\)"),
    (("scalar",), ValueError, "array 'scalar' is a scalar"),
    ((), ValueError, "at least one key"),
    (("images", "images"), ValueError, "keys repeat"),
])
def test_bad_keys_name_the_store_and_key(stores, keys, error, message):
    with pytest.raises(error, match=message):
        fastload.ZarrDataset(stores[3], keys)


def test_not_a_store(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"cannot open .*empty' as a Zarr group or array"):
        fastload.ZarrDataset(tmp_path / "empty")
    with pytest.raises(ValueError, match=r"cannot open .*missing.zarr': no such file"):
        fastload.ZarrDataset(tmp_path / "missing.zarr")
    with pytest.raises(TypeError, match="takes a path, a zarr.Group or a zarr.Array"):
        fastload.ZarrDataset(3)


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_corrupt_chunk_names_the_store_key_and_rows(tmp_path, zarr_format):
    path = str(tmp_path / "c.zarr")
    g = zarr.open_group(path, mode="w", zarr_format=zarr_format)
    g.create_array("x", data=np.arange(64 * 16).reshape(64, 16), chunks=(8, 16))
    chunk = os.path.join(path, "x", *g["x"].metadata.encode_chunk_key((1, 0)).split("/"))
    with open(chunk, "wb") as f:
        f.write(b"\xff" * 100)
    ds = fastload.ZarrDataset(path, "x")
    np.testing.assert_array_equal(ds[3][0], np.arange(48, 64))  # chunk 0 is whole
    with pytest.raises(OSError, match=r"cannot read array 'x' of .*c.zarr' \(rows 2 to 9\)"):
        ds[[9, 2]]
    loader = fastload.DataLoader(ds, batch_size=8, num_workers=2, worker_mode="thread")
    with pytest.raises(OSError, match="cannot read array 'x'"):
        list(loader)


def test_removed_chunk_reads_as_the_fill_value_as_in_zarr(stores, tmp_path):
    """zarr defines an absent chunk as the fill value (it writes none for
    chunks that hold only it): the dataset reads what zarr reads."""
    group = zarr.open_group(stores[3], mode="r")
    assert not os.path.exists(os.path.join(stores[3], "sparse", "c", "0", "0"))
    ds = fastload.ZarrDataset(stores[3], ("sparse",))
    np.testing.assert_array_equal(ds[list(range(N))][0], group["sparse"][:])


# ChunkShuffleSampler

def chunks_of(batch, chunk_rows):
    return len(set(int(i) // chunk_rows for i in batch))


@pytest.mark.parametrize("n, chunk_rows, block", [(100, 8, 3), (96, 8, 4), (7, 10, 2), (0, 4, 1)])
def test_chunk_shuffle_is_a_permutation_with_few_chunks_a_batch(n, chunk_rows, block):
    sampler = fastload.ChunkShuffleSampler(n, chunk_rows, block=block, seed=11)
    order = list(sampler)
    assert sorted(order) == list(range(n)) and len(sampler) == n
    batch = block * chunk_rows
    for start in range(0, n, batch):
        assert chunks_of(order[start:start + batch], chunk_rows) <= 2 * block
    if n > 2 * batch:
        assert order != sorted(order)
    if n % chunk_rows == 0:
        # Every chunk is whole: the blocks are aligned, each of `block` chunks.
        for start in range(0, n - n % batch, batch):
            assert chunks_of(order[start:start + batch], chunk_rows) == block


def test_chunk_shuffle_is_drawn_from_seed_and_epoch():
    a = fastload.ChunkShuffleSampler(range(50), 5, block=2, seed=1)
    b = fastload.ChunkShuffleSampler(range(50), 5, block=2, seed=1)
    assert list(a) == list(b)
    first = list(a)
    a.set_epoch(1)
    assert list(a) != first and sorted(a) == list(range(50))
    b.set_epoch(1)
    assert list(a) == list(b)
    assert list(fastload.ChunkShuffleSampler(50, 5, block=2, seed=2)) != first
    assert list(fastload.ChunkShuffleSampler(50, 5, shuffle=False)) == list(range(50))


@pytest.mark.parametrize("drop_last", [False, True])
def test_chunk_shuffle_replicas_share_the_order(drop_last):
    n, replicas = 53, 3
    shares = [list(fastload.ChunkShuffleSampler(n, 4, block=2, seed=9, drop_last=drop_last,
                                                num_replicas=replicas, rank=r))
              for r in range(replicas)]
    size = n // replicas if drop_last else -(-n // replicas)
    assert all(len(s) == size for s in shares)
    together = sum(shares, [])
    whole = fastload.ChunkShuffleSampler(n, 4, block=2, seed=9).order().tolist()
    if drop_last:
        assert together == whole[:size * replicas]  # contiguous shares, trimmed
    else:
        assert together == whole + whole[:size * replicas - n]  # padded from the start
    with pytest.raises(ValueError, match=r"Invalid rank 3, rank should be in the interval"):
        fastload.ChunkShuffleSampler(n, 4, num_replicas=3, rank=3)
    with pytest.raises(ValueError, match="chunk_rows should be a positive integer"):
        fastload.ChunkShuffleSampler(n, 0)


def test_chunk_shuffled_loader_resumes(stores):
    ds = fastload.ZarrDataset(stores[3], ("images", "labels"))

    def loader():
        sampler = fastload.ChunkShuffleSampler(ds, 4, block=2, seed=5)
        sampler.set_epoch(3)
        return fastload.DataLoader(ds, batch_size=4, sampler=sampler, output="numpy")

    full = [b[1] for b in loader()]
    first = loader()
    it = iter(first)
    next(it), next(it)
    state = first.state_dict()
    resumed = loader()
    resumed.load_state_dict(state)
    rest = [b[1] for b in resumed]
    assert len(rest) == len(full) - 2
    for got, want in zip(rest, full[2:]):
        np.testing.assert_array_equal(got, want)


def test_importing_fastload_does_not_import_zarr():
    run = subprocess.run([sys.executable, "-c", "import sys, fastload; "
                          "print(sorted(m for m in ('zarr', 'numcodecs') if m in sys.modules))"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]"


@pytest.mark.parametrize("num_workers", [0, 2])
def test_mapped_chunk_truncated_under_the_loader(tmp_path, num_workers):
    path = str(tmp_path / "t.zarr")
    rows = np.arange(4096 * 256, dtype=np.float32).reshape(4096, 256)
    zarr.open_group(path, mode="w").create_array("x", data=rows, chunks=rows.shape,
                                                 compressors=None)
    ds = fastload.ZarrDataset(path, "x")
    assert ds.mapped_keys == ("x",)
    assert_truncation_is_named(ds, os.path.join(path, "x", "c", "0", "0"), rows, num_workers)
