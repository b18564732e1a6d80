"""HDF5Dataset: batches equal to what h5py reads for the same rows, for
contiguous (memory-mapped, gathered in C), byte-swapped and chunked /
compressed (read through h5py) datasets, with thread and process workers
and the usual samplers; bad files and keys fail with messages naming them."""

import gc
import os
import pickle
import re
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
h5py = pytest.importorskip("h5py")

import numpy as np  # noqa: E402
import torch.utils.data as tud  # noqa: E402

import fastload  # noqa: E402
from fl_helpers import (assert_truncation_is_named, check_parity,  # noqa: E402
                        fastload_only, row_dataset_configs)

pytestmark = fastload_only

N = 37
PAGE = os.sysconf("SC_PAGESIZE")


def write_file(path, n=N):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 255, (n, 3, 4, 5), dtype=np.uint8)
    with h5py.File(path, "w") as f:
        f["images"] = images
        f["labels"] = rng.integers(0, 10, n)
        f["features"] = rng.standard_normal((n, 6)).astype(np.float32)
        f.create_dataset("packed", data=images, chunks=(4, 3, 4, 5), compression="gzip",
                         shuffle=True)
        f.create_dataset("chunked", data=rng.standard_normal((n, 7)), chunks=(5, 7))
        f.create_dataset("big_endian", data=np.arange(n * 2, dtype=">i4").reshape(n, 2))
        f.create_dataset("lz_labels", data=np.arange(n, dtype=np.int16), chunks=(8,),
                         compression="lzf")
        f["group/flags"] = np.arange(n) % 3 == 0
        f["names"] = np.array([b"x%d" % i for i in range(n)])
        f["short"] = np.arange(n - 1)
        f["scalar"] = 1.0
    return path


class H5Rows(tud.Dataset):
    """What a user writes without fastload: h5py per sample, the file
    opened on first use in each worker."""

    def __init__(self, path, keys):
        self.path, self.keys, self.file = path, keys, None

    def __len__(self):
        with h5py.File(self.path, "r") as f:
            return len(f[self.keys[0]])

    def __getitem__(self, i):
        if self.file is None:
            self.file = h5py.File(self.path, "r")
        return tuple(np.array(self.file[k][i]).astype(self.file[k].dtype.newbyteorder("="))
                     for k in self.keys)


@pytest.fixture(scope="module")
def h5file(tmp_path_factory):
    return write_file(tmp_path_factory.mktemp("h5") / "data.h5")


KEYSETS = {
    "contiguous": ("images", "labels", "features"),
    "chunked": ("packed", "labels", "chunked", "lz_labels"),
    "byte-swapped": ("big_endian", "group/flags"),
}

CONFIGS = {
    "seq-bs4": (lambda lib: dict(batch_size=4), None),
    **row_dataset_configs(N),
    "bsNone": (lambda lib: dict(batch_size=None), None),
}


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("keys", list(KEYSETS))
def test_batches_match_h5py(h5file, keys, config):
    ds = fastload.HDF5Dataset(h5file, KEYSETS[keys])
    make, extra = CONFIGS[config]
    check_parity(H5Rows(h5file, KEYSETS[keys]), make, fl_dataset=ds, epochs=2, fl_extra=extra)


def test_storage_is_told_apart(h5file):
    assert fastload.HDF5Dataset(h5file, KEYSETS["contiguous"])._native_source() is not None
    ds = fastload.HDF5Dataset(h5file, ("images", "packed", "big_endian"))
    assert ds.mapped_keys == ("images", "big_endian")
    assert ds._native_source() is None  # a batch needs h5py: the Python dataset path
    assert "packed: uint8[3, 4, 5] read" in repr(ds)


def test_indexing_outside_a_loader(h5file):
    ds = fastload.HDF5Dataset(h5file, ("images", "chunked", "big_endian"))
    with h5py.File(h5file, "r") as f:
        images, chunked, swapped = f["images"][:], f["chunked"][:], f["big_endian"][:]
    assert len(ds) == N
    row = ds[5]
    assert isinstance(row, tuple) and len(row) == 3
    np.testing.assert_array_equal(row[0], images[5])
    np.testing.assert_array_equal(row[1], chunked[5])
    np.testing.assert_array_equal(ds[-1][2], swapped[-1])
    assert ds[0][2].dtype == np.dtype("=i4")
    order = [30, 2, 30, -1, 0]
    batch = ds[order]
    for got, want in zip(batch, (images, chunked, swapped)):
        np.testing.assert_array_equal(got, want[order])
    np.testing.assert_array_equal(ds[np.array([3, 4, 5])][1], chunked[3:6])  # a run: one slice
    np.testing.assert_array_equal(ds[2:9:3][0], images[2:9:3])
    assert ds[[]][1].shape == (0, 7)
    with pytest.raises(IndexError, match=f"index {N} is out of range for a dataset of {N}"):
        ds[[0, N]]
    with pytest.raises(IndexError, match="out of range"):
        ds[-N - 1]


def test_process_workers_open_the_file_themselves(h5file):
    """An h5py file open in the parent is not used by forked workers, and a
    spawned worker gets the dataset pickled without it."""
    ds = fastload.HDF5Dataset(h5file, ("packed", "labels"))
    ds[[1, 2]]  # opens the file in this process
    state = pickle.dumps(ds)
    assert len(state) < 4096  # the path and layout, no data, no open file
    copy = pickle.loads(state)
    for got, want in zip(copy[[4, 0]], ds[[4, 0]]):
        np.testing.assert_array_equal(got, want)
    for context in ("fork", "spawn"):
        loader = fastload.DataLoader(ds, batch_size=8, num_workers=2, worker_mode="process",
                                     multiprocessing_context=context, output="numpy")
        batches = list(loader)
        np.testing.assert_array_equal(np.concatenate([b[0] for b in batches]),
                                      ds[list(range(N))][0])


def test_chunk_cache_size_is_the_users(h5file):
    ds = fastload.HDF5Dataset(h5file, ("packed",), chunk_cache_bytes=1 << 20)
    ds[[0]]
    cache = ds._dataset("packed").id.get_access_plist().get_chunk_cache()
    assert cache[1] == 1 << 20 and cache[2] == 0.0  # bytes, then LRU preemption
    with pytest.raises(ValueError, match="chunk_cache_bytes must be a non-negative integer"):
        fastload.HDF5Dataset(h5file, ("packed",), chunk_cache_bytes=-1)


@pytest.mark.parametrize("keys, error, message", [
    (("images", "missing"), KeyError,
     r"data.h5' has no dataset 'missing' \(its datasets: .*'images'"),
    (("group",), ValueError, r"data.h5': 'group' is a group, not a dataset"),
    (("names",), TypeError,
     r"data.h5': dataset 'names' has dtype \|S3; HDF5Dataset serves numeric"),
    (("images", "short"), ValueError, r"datasets differ in length \('images': 37, 'short': 36\)"),
    (("scalar",), ValueError, "dataset 'scalar' is a scalar"),
    ((), ValueError, "at least one key"),
    (("images", "images"), ValueError, "keys repeat"),
    ((3,), TypeError, "keys must be strings"),
])
def test_bad_keys_name_the_file_and_key(h5file, keys, error, message):
    with pytest.raises(error, match=message):
        fastload.HDF5Dataset(h5file, keys)


def test_not_an_hdf5_file(tmp_path):
    (tmp_path / "x.h5").write_bytes(b"not an hdf5 file" * 100)
    with pytest.raises(ValueError, match=r"cannot open .*x.h5' as an HDF5 file"):
        fastload.HDF5Dataset(tmp_path / "x.h5")
    with pytest.raises(ValueError, match=r"cannot open .*missing.h5': no such file"):
        fastload.HDF5Dataset(tmp_path / "missing.h5")


def test_file_truncated_before_opening(tmp_path):
    path = tmp_path / "t.h5"
    with h5py.File(path, "w") as f:
        f["x"] = np.ones((64, 1024), np.float32)
        offset = f["x"].id.get_offset()
    os.truncate(path, offset + 1000)
    # HDF5 itself sees that the file ends before its recorded end.
    with pytest.raises(ValueError, match=r"t.h5' .*truncated"):
        fastload.HDF5Dataset(path, "x")


@pytest.mark.parametrize("num_workers", [0, 2])
def test_file_truncated_under_the_mapping(tmp_path, num_workers):
    path = tmp_path / "t.h5"
    rows = np.arange(4096 * 256, dtype=np.float32).reshape(4096, 256)
    with h5py.File(path, "w") as f:
        f["x"] = rows
    assert_truncation_is_named(fastload.HDF5Dataset(path, "x"), path, rows, num_workers)


def test_byte_swapped_file_truncated_raises(tmp_path):
    """Byte-swapped rows are read by NumPy, outside the gather's guard: a
    file cut short is refused before the read instead of a SIGBUS."""
    path = tmp_path / "be.h5"
    with h5py.File(path, "w") as f:
        f["x"] = np.arange(4096 * 256, dtype=">f4").reshape(4096, 256)
    ds = fastload.HDF5Dataset(path, "x")
    assert ds[[1]][0][0, 0] == 256
    size = os.path.getsize(path)
    os.truncate(path, PAGE)
    with pytest.raises(OSError, match=re.escape(f"{str(path)!r} is shorter than when it was "
                                                f"opened (dataset 'x'; {size} bytes then, "
                                                f"{PAGE} now)")):
        ds[[4000]]


def test_a_cut_file_is_measured_through_its_descriptor_not_its_path(tmp_path):
    """The mapped file cut short after another file was put at its path: the
    message gives the size now of the file mapped (read through the
    dataset's kept descriptor), not of whatever lies at the path."""
    path = tmp_path / "x.h5"
    with h5py.File(path, "w") as f:
        f["x"] = np.arange(4096 * 256, dtype="=f4").reshape(4096, 256)
    ds = fastload.HDF5Dataset(path, "x")
    assert ds.mapped_keys == ("x",)
    size = os.path.getsize(path)
    with open(path, "r+b") as original:
        bigger = tmp_path / "new.h5"
        with open(bigger, "wb") as f:
            f.truncate(2 * size)
        os.replace(bigger, path)
        original.truncate(PAGE)
    with pytest.raises(OSError, match=re.escape(
            f"file changed under the loader: {str(path)!r} is shorter than when it was opened "
            f"(sample index 4000; {size} bytes then, {PAGE} now)")):
        ds[[4000]]


def test_byte_swapped_file_cut_after_the_size_check_raises(tmp_path):
    """A byte-swapped file cut short after the size check (simulated: the
    check sees the old size) is read by the guarded C gather, not NumPy: an
    OSError naming the file and the sample instead of a SIGBUS."""
    from fl_helpers import assert_child_ok, run_in_child

    path = tmp_path / "be.h5"
    with h5py.File(path, "w") as f:
        f["x"] = np.arange(4096 * 256, dtype=">f4").reshape(4096, 256)
    result = run_in_child(f"""
        import os, fastload
        import fastload.datasets.formats.hdf5 as hdf5
        ds = fastload.HDF5Dataset({str(path)!r}, "x")
        size = os.path.getsize({str(path)!r})
        hdf5._KeptFile.size = lambda self: size  # the check sees the file whole
        os.truncate({str(path)!r}, {PAGE})
        try:
            ds[[4000]]
        except OSError as e:
            print("raised:", e)
        print("done")
    """)
    assert_child_ok(result)
    assert (f"file changed under the loader: {str(path)!r} is shorter than when it was opened "
            "(sample index 4000;") in result.stdout, result.stdout


def test_corrupt_chunk_names_the_key(tmp_path):
    path = tmp_path / "c.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=np.arange(64 * 16).reshape(64, 16), chunks=(8, 16),
                         compression="gzip")
        info = f["x"].id.get_chunk_info(1)
    with open(path, "r+b") as f:
        f.seek(info.byte_offset)
        f.write(b"\xff" * info.size)
    ds = fastload.HDF5Dataset(path, "x")
    np.testing.assert_array_equal(ds[3][0], np.arange(48, 64))  # chunk 0 is whole
    with pytest.raises(OSError, match=r"cannot read dataset 'x' of .*c.h5' \(rows 2 to 9\)"):
        ds[[9, 2]]
    loader = fastload.DataLoader(ds, batch_size=8, num_workers=2, worker_mode="thread")
    with pytest.raises(OSError, match="cannot read dataset 'x'"):
        list(loader)


def run_python(code):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)


def test_importing_fastload_imports_neither_library():
    run = run_python("import sys, fastload; print(sorted(m for m in ('h5py', 'pyarrow', 'lmdb', "
                     "'datasets') if m in sys.modules))")
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]"


def test_missing_h5py_says_what_to_install(h5file):
    run = run_python("import sys; sys.modules['h5py'] = None\n"
                     "import fastload\n"
                     f"fastload.HDF5Dataset({str(h5file)!r})")
    assert run.returncode != 0
    assert "ImportError: HDF5Dataset needs the h5py package: pip install h5py" in run.stderr


# ------------------------------------------------- a file replaced by rename


def write_version(path, version, n=256):
    """x contiguous (memory-mapped), y gzip-compressed (read through h5py):
    row i of both is 10 * i + version."""
    rows = np.arange(n, dtype=np.int64) * 10 + version
    with h5py.File(path, "w") as f:
        f["x"] = rows
        f.create_dataset("y", data=rows, chunks=(16,), compression="gzip")


def replace_by_rename(path, version):
    new = path.with_name("new.h5")
    write_version(new, version)
    os.replace(new, path)


@pytest.mark.parametrize("num_workers,mode", [(0, "thread"), (2, "thread"), (2, "process")])
@pytest.mark.parametrize("read_before", [False, True])
def test_a_file_replaced_by_rename_is_read_as_opened(tmp_path, num_workers, mode, read_before):
    path = tmp_path / "data.h5"
    write_version(path, 1)
    ds = fastload.HDF5Dataset(path, ("x", "y"))
    assert ds.mapped_keys == ("x",)
    if read_before:
        ds[[0, 1]]  # h5py opened here, before the rename
    replace_by_rename(path, 2)
    loader = fastload.DataLoader(ds, batch_size=32, shuffle=True, num_workers=num_workers,
                                 worker_mode=mode, output="numpy")
    x = np.concatenate([b[0] for b in loader])
    y = np.concatenate([b[1] for b in loader])
    np.testing.assert_array_equal(np.sort(x), np.arange(256) * 10 + 1)  # the old file's
    np.testing.assert_array_equal(np.sort(y), np.arange(256) * 10 + 1)
    again = pickle.loads(pickle.dumps(ds))  # in this process: the same open file
    np.testing.assert_array_equal(again[[5, 200]][1], [51, 2001])


def test_a_spawned_worker_refuses_a_file_replaced_since(tmp_path):
    path = tmp_path / "data.h5"
    write_version(path, 1)
    ds = fastload.HDF5Dataset(path, ("x", "y"))
    replace_by_rename(path, 2)
    loader = fastload.DataLoader(ds, batch_size=32, num_workers=1, worker_mode="process",
                                 multiprocessing_context="spawn", output="numpy")
    with pytest.raises(OSError, match=re.escape(f"{str(path)!r} was replaced since the "
                                                "dataset was made")):
        next(iter(loader))


def test_a_spawned_worker_of_mapped_keys_refuses_a_file_replaced_since(tmp_path):
    """Every key mapped: the worker fails while it builds its native
    source, before its first batch; the error still reaches the loop, with
    the worker's traceback, not as a worker that exited."""
    path = tmp_path / "data.h5"
    write_version(path, 1)
    ds = fastload.HDF5Dataset(path, "x")
    replace_by_rename(path, 2)
    loader = fastload.DataLoader(ds, batch_size=32, num_workers=1, worker_mode="process",
                                 multiprocessing_context="spawn", output="numpy")
    for _ in range(2):  # each epoch's workers name it
        with pytest.raises(OSError, match=re.escape(f"{str(path)!r} was replaced since the "
                                                    "dataset was made")):
            next(iter(loader))


def test_the_kept_file_is_closed_with_the_dataset(tmp_path):
    path = tmp_path / "data.h5"
    write_version(path, 1)
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(20):
        ds = fastload.HDF5Dataset(path, ("x", "y"))
        ds[[1, 2]]
        pickle.loads(pickle.dumps(ds))[[3]]
        del ds
    gc.collect()
    assert len(os.listdir("/proc/self/fd")) <= before + 2  # not one a dataset
