"""cache= of HDF5Dataset and ZarrDataset: the rows read (decompressed)
kept in a SampleCache, so batches equal the library's in every worker mode
while later epochs read the cache; stale files get a new cache, corrupt
entries are read again, and a dataset with nothing to cache is refused."""

import gc
import os
import pickle

import pytest

torch = pytest.importorskip("torch")
h5py = pytest.importorskip("h5py")
zarr = pytest.importorskip("zarr")

import numpy as np  # noqa: E402

import fastload  # noqa: E402
from fl_helpers import check_parity, fastload_only, row_dataset_configs  # noqa: E402
from test_hdf5 import H5Rows, write_file  # noqa: E402
from test_zarr import ZarrRows, write_store  # noqa: E402

pytestmark = [fastload_only,
              pytest.mark.filterwarnings("ignore:This process .* is multi-threaded, use of fork")]

N = 37
H5_KEYS = ("packed", "labels", "chunked", "big_endian")  # read: packed, chunked, big_endian
ZARR_KEYS = ("images", "labels", "raw", "sparse")  # read: images, labels, sparse


@pytest.fixture(scope="module")
def h5file(tmp_path_factory):
    return write_file(tmp_path_factory.mktemp("h5") / "data.h5", N)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return write_store(str(tmp_path_factory.mktemp("zarr") / "v3.zarr"), 3)


def read_bytes(ds):
    """Bytes of every row of the keys a cache keeps."""
    layouts = [ds._layouts[p] for p in ds._cache_first]
    return sum(x.dtype.itemsize * int(np.prod(x.shape[1:])) for x in layouts) * len(ds)


@pytest.mark.parametrize("config", list(row_dataset_configs(N)))
def test_hdf5_batches_match_h5py_from_the_cache(h5file, config):
    ds = fastload.HDF5Dataset(h5file, H5_KEYS, cache="memory")
    make, extra = row_dataset_configs(N)[config]
    check_parity(H5Rows(h5file, H5_KEYS), make, fl_dataset=ds, epochs=2, fl_extra=extra)
    stats = ds.cache.stats()
    assert stats["stored"] > 0 and stats["hits"] > 0
    assert stats["corrupt"] == stats["rejected"] == 0


@pytest.mark.parametrize("config", list(row_dataset_configs(N)))
def test_zarr_batches_match_zarr_from_the_cache(store, config):
    ds = fastload.ZarrDataset(store, ZARR_KEYS, cache="memory")
    make, extra = row_dataset_configs(N)[config]
    check_parity(ZarrRows(store, ZARR_KEYS), make, fl_dataset=ds, epochs=2, fl_extra=extra)
    assert ds.cache.stats()["hits"] > 0


def test_every_row_is_stored_once_then_read_from_the_cache(h5file, tmp_path):
    ds = fastload.HDF5Dataset(h5file, H5_KEYS, cache=str(tmp_path / "rows.cache"))
    reads = []
    original = ds._read_rows
    ds._read_rows = lambda position, indices: reads.append(len(indices)) or original(
        position, indices)
    first = ds[np.arange(N)]
    assert sum(reads) == 3 * N  # three keys read, every row once
    assert ds.cache.stats()["stored"] == 3 * N
    assert read_bytes(ds) <= ds.cache.stats()["used"] < read_bytes(ds) + 8 * 3 * N  # aligned
    again = ds[np.arange(N)[::-1]]
    assert sum(reads) == 3 * N  # nothing read from the file
    assert ds.cache.stats()["hits"] == 3 * N
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a[::-1], b)
    # Another dataset naming the same file uses the stored rows.
    other = fastload.HDF5Dataset(h5file, H5_KEYS, cache=str(tmp_path / "rows.cache"))
    assert other.cache.stats()["stored"] == 3 * N
    for a, b in zip(first, other[np.arange(N)]):
        np.testing.assert_array_equal(a, b)


def test_a_pickled_dataset_shares_the_memory_cache(h5file):
    ds = fastload.HDF5Dataset(h5file, H5_KEYS, cache="memory")
    copy = pickle.loads(pickle.dumps(ds))  # what a spawned worker gets
    copy[[3, 4]]
    assert ds.cache.stats()["stored"] == 6
    ds[[4]]
    assert ds.cache.stats()["hits"] == 3


def test_the_bound_is_kept(h5file):
    size = fastload._C.SampleCache.overhead(3 * N) + read_bytes(
        fastload.HDF5Dataset(h5file, H5_KEYS)) // 2
    ds = fastload.HDF5Dataset(h5file, H5_KEYS, cache="memory", cache_size=size)
    with h5py.File(h5file, "r") as f:
        expected = f["packed"][:]
    for _ in range(2):
        np.testing.assert_array_equal(ds[np.arange(N)][0], expected)
    stats = ds.cache.stats()
    assert 0 < stats["stored"] < 3 * N and stats["rejected"] > 0
    assert stats["used"] <= stats["data_bytes"]


def test_a_changed_file_gets_a_new_cache(tmp_path):
    path = write_file(tmp_path / "d.h5", N)
    cache = str(tmp_path / "rows.cache")
    ds = fastload.HDF5Dataset(path, H5_KEYS, cache=cache)
    ds[np.arange(N)]
    del ds  # closes the file h5py opened for it
    gc.collect()
    with h5py.File(path, "r+") as f:
        f["packed"][0] = 7
    os.utime(path, ns=(os.stat(path).st_atime_ns, os.stat(path).st_mtime_ns + 10**9))
    new = fastload.HDF5Dataset(path, H5_KEYS, cache=cache)
    assert new.cache.stats()["stored"] == 0
    assert (new[0][0] == 7).all()


def test_a_changed_zarr_chunk_gets_a_new_cache(tmp_path):
    path = write_store(str(tmp_path / "s.zarr"), 3)
    cache = str(tmp_path / "rows.cache")
    fastload.ZarrDataset(path, ZARR_KEYS, cache=cache)[np.arange(N)]
    group = zarr.open_group(path, mode="r+")
    group["images"][0] = 9  # rewrites one chunk file
    new = fastload.ZarrDataset(path, ZARR_KEYS, cache=cache)
    assert new.cache.stats()["stored"] == 0
    assert (new[0][0] == 9).all()


def test_a_corrupt_entry_is_read_again(h5file, tmp_path):
    path = tmp_path / "rows.cache"
    ds = fastload.HDF5Dataset(h5file, H5_KEYS, cache=str(path))
    expected = ds[5][0]
    where = ds.cache.file_offset(ds._cache_first[0] + 5)
    with open(path, "r+b") as f:
        f.seek(where)
        f.write(bytes(b ^ 0xFF for b in expected.tobytes()[:8]))
    np.testing.assert_array_equal(ds[5][0], expected)
    assert ds.cache.stats()["corrupt"] == 1


def test_nothing_to_cache_and_bad_arguments_are_refused(h5file, store):
    with pytest.raises(ValueError, match="every key .* is memory-mapped"):
        fastload.HDF5Dataset(h5file, ("images", "labels"), cache="memory")
    with pytest.raises(ValueError, match="every key .* is memory-mapped"):
        fastload.ZarrDataset(store, ("raw",), cache="memory")
    with pytest.raises(ValueError, match="cache is None"):
        fastload.HDF5Dataset(h5file, H5_KEYS, cache_size=1 << 20)
    with pytest.raises(TypeError, match="cache must be"):
        fastload.ZarrDataset(store, ZARR_KEYS, cache=3)
