"""Files that change under the loader, and indices or sizes too large for
int64.

A memory-mapped file truncated while a loader reads it (a job re-running
np.save on the file it trains from) raises SIGBUS on the next read past its
new end.  fastload turns that into an OSError naming the file and the sample
index, the process goes on, and the loader stays usable; a SIGBUS anywhere
else still ends the process as before.
"""

import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import fastload

pytestmark = pytest.mark.skipif(
    bool(getattr(fastload, "__torch_shim__", False)), reason="fastload's native datasets"
)

ROWS, ROW = 4096, 256  # float32 rows of 1 KiB; 16 batches of 256
BATCH = 256
PAGE = os.sysconf("SC_PAGESIZE")


def features():
    return np.arange(ROWS * ROW, dtype=np.float32).reshape(ROWS, ROW)


def tokens():
    return (np.arange(ROWS * ROW) % 50257).astype(np.uint16)


def windows(t, block, starts):
    x = np.stack([t[s:s + block] for s in starts]).astype(np.int64)
    y = np.stack([t[s + 1:s + block + 1] for s in starts]).astype(np.int64)
    return x, y


def open_dataset(kind, tmp_path):
    """(dataset, its file, expected batch k) for a .npy ArrayDataset or a raw
    token file's TokenDataset."""
    if kind == "npy":
        path = tmp_path / "x.npy"
        np.save(path, features())
        data = features()
        return fastload.ArrayDataset(path), path, lambda k: [data[k * BATCH:(k + 1) * BATCH]]
    path = tmp_path / "train.bin"
    t = tokens()
    t.tofile(path)
    block = 255  # windows of 256 tokens: stride 255, so they overlap by one
    ds = fastload.TokenDataset(path, block)
    return ds, path, lambda k: list(
        windows(t, block, [i * block for i in range(k * BATCH, min((k + 1) * BATCH, len(ds)))]))


def check_batch(batch, expected):
    assert len(batch) == len(expected)
    for got, want in zip(batch, expected):
        np.testing.assert_array_equal(np.asarray(got), want)


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("kind", ["npy", "tokens"])
def test_file_truncated_mid_epoch_raises_oserror(tmp_path, kind, num_workers):
    ds, path, expected = open_dataset(kind, tmp_path)
    loader = fastload.DataLoader(ds, batch_size=BATCH, num_workers=num_workers,
                                 output="numpy")
    it = iter(loader)
    check_batch(next(it), expected(0))
    # One page left: every later row lies wholly past the end.  With
    # workers, up to num_workers * prefetch_factor batches were read before
    # the truncation; they are whole and correct.  16 batches are more than
    # that, so a later one always reads the truncated file.
    os.truncate(path, PAGE)
    delivered = 1
    with pytest.raises(OSError) as info:
        for batch in it:
            check_batch(batch, expected(delivered))
            delivered += 1
    message = str(info.value)
    assert f"file changed under the loader: {str(path)!r} is shorter than when it was opened" \
        in message
    assert f"{PAGE} now" in message
    index = int(re.search(r"sample index (\d+)", message).group(1))
    # The failing batch is the one after the last delivered; every row of it
    # lies past the end, so with no workers the first row fails.  A worker
    # may have been part way through that batch when the file shrank.
    if num_workers == 0:
        assert info.value.errno == 5  # EIO; a worker's error is re-raised from its message
        assert index == BATCH
    else:
        assert "Caught OSError in DataLoader worker" in message
        assert delivered * BATCH <= index < (delivered + 1) * BATCH
    del it  # joins its workers

    # The process goes on; the same loader works again once the file is
    # whole, and so does a new loader over another file.
    if kind == "npy":
        np.save(path, features())
    else:
        tokens().tofile(path)
    for k, batch in enumerate(loader):
        check_batch(batch, expected(k))
    (tmp_path / "other").mkdir()
    other, _, other_expected = open_dataset(kind, tmp_path / "other")
    for k, batch in enumerate(fastload.DataLoader(other, batch_size=BATCH,
                                                  num_workers=num_workers, output="numpy")):
        check_batch(batch, other_expected(k))


@pytest.mark.parametrize("kind", ["npy", "tokens"])
def test_truncated_file_outside_a_loader(tmp_path, kind):
    ds, path, _ = open_dataset(kind, tmp_path)
    ds[[0, 1]]
    os.truncate(path, PAGE)
    with pytest.raises(OSError, match=r"is shorter than when it was opened \(sample index 4000;"):
        ds[[1, 4000, 2]]
    ds[[0]]  # the first page is still there


def test_truncated_file_single_samples_and_slices(tmp_path):
    """ds[i] and ds[a:b] read through the guarded gather too (a DataLoader
    with batch_size=None reads ds[i]); NumPy indexing the mapping would end
    the process, so the check runs in a child."""
    from fl_helpers import assert_child_ok, run_in_child

    result = run_in_child(f"""
        import os, numpy as np, fastload
        path = {str(tmp_path / "x.npy")!r}
        data = np.arange({ROWS * ROW}, dtype=np.float32).reshape({ROWS}, {ROW})
        np.save(path, data)
        ds = fastload.ArrayDataset(path)
        np.testing.assert_array_equal(ds[5][0], data[5])
        np.testing.assert_array_equal(ds[3:9:2][0], data[3:9:2])
        os.truncate(path, {PAGE})
        loader = fastload.DataLoader(ds, batch_size=None, sampler=[1, 4000], output="numpy")
        for read in (lambda: ds[4000], lambda: ds[3999:4001], lambda: list(loader)):
            try:
                read()
            except OSError as e:
                print("raised:", e)
        print("done")
    """)
    assert_child_ok(result)
    for index in (4000, 3999, 4000):
        assert f"is shorter than when it was opened (sample index {index};" in result.stdout
    assert result.stdout.count("raised:") == 3, result.stdout


def test_truncated_memmap_passed_in(tmp_path):
    path = tmp_path / "x.bin"
    features().tofile(path)
    mm = np.memmap(path, dtype=np.float32, mode="r", shape=(ROWS, ROW))
    labels = np.arange(ROWS)
    ds = fastload.ArrayDataset(labels, mm)  # the mapped array second
    os.truncate(path, PAGE)
    with pytest.raises(OSError, match=re.escape(f"{str(path)!r} is shorter") +
                       r".*sample index 100;"):
        ds[[100]]


def test_mapping_numpy_does_not_know_about(tmp_path):
    """Memory that is a mapping NumPy does not know as one: reported
    without a file name."""
    import mmap

    path = tmp_path / "x.bin"
    features().tofile(path)
    with open(path, "rb") as f:
        buffer = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    array = np.frombuffer(buffer, dtype=np.float32).reshape(ROWS, ROW)
    ds = fastload.ArrayDataset(array)
    os.truncate(path, PAGE)
    with pytest.raises(OSError, match=r"memory changed under the loader: a bus error reading "
                                      r"sample index 17 "):
        ds[[17]]
    del ds, array


def test_other_bus_errors_still_end_the_process(tmp_path):
    """The handler recovers only faults inside a gather: NumPy reading the
    truncated mapping still gets SIGBUS's usual end, through the handler
    installed before fastload's (faulthandler here)."""
    script = textwrap.dedent(f"""
        import os, numpy as np, fastload
        np.save({str(tmp_path / 'x.npy')!r}, np.ones((4096, 256), np.float32))
        ds = fastload.ArrayDataset({str(tmp_path / 'x.npy')!r})
        os.truncate({str(tmp_path / 'x.npy')!r}, {PAGE})
        try:
            ds[[4000]]
        except OSError as e:
            print("recovered:", e, flush=True)
        print(float(ds.arrays[0][-1].sum()))
        print("not reached", flush=True)
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.dirname(os.path.dirname(os.path.abspath(fastload.__file__)))]
        + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])))
    run = subprocess.run([sys.executable, "-X", "faulthandler", "-c", script],
                         capture_output=True, text=True, timeout=300, env=env)
    assert "recovered: [Errno 5] file changed under the loader" in run.stdout
    assert "not reached" not in run.stdout
    assert "Fatal Python error: Bus error" in run.stderr
    assert run.returncode != 0


# ------------------------------------------------------------ large values


@pytest.mark.parametrize("value", [2**63, 2**64 - 1])
def test_uint64_indices_past_int64_are_refused(value):
    ds = fastload.ArrayDataset(np.arange(10), np.arange(10) * 2)
    tokens_ds = fastload.TokenDataset(np.arange(100, dtype=np.uint16), 4)
    for d in (ds, tokens_ds):
        with pytest.raises(IndexError, match=f"index {value} is out of range"):
            d[np.array([0, value], dtype=np.uint64)]
        with pytest.raises(IndexError, match=f"index {value} is out of range"):
            d[[0, np.uint64(value)]]
        with pytest.raises(IndexError, match=f"index {value} is out of range"):
            d[np.uint64(value)]
    # Values that fit still work as indices.
    np.testing.assert_array_equal(ds[np.array([9, 2], dtype=np.uint64)][1], [18, 4])


@pytest.mark.parametrize("num_workers", [0, 2])
def test_sampler_yielding_uint64_past_int64(num_workers):
    ds = fastload.ArrayDataset(np.arange(10))
    sampler = [np.uint64(1), np.uint64(2**64 - 1)]
    loader = fastload.DataLoader(ds, batch_size=2, sampler=sampler, num_workers=num_workers)
    with pytest.raises(IndexError, match=f"index {2**64 - 1} is out of range"):
        list(loader)


@pytest.mark.parametrize("stride", [2**63, 2**64, np.uint64(2**64 - 1)])
def test_token_stride_too_large(stride):
    with pytest.raises(ValueError, match=f"stride={int(stride)} is too large"):
        fastload.TokenDataset(np.arange(100, dtype=np.uint16), 4, stride=stride)


@pytest.mark.parametrize("block_size", [2**63, 2**64, np.uint64(2**64 - 1)])
def test_token_block_size_too_large(block_size):
    with pytest.raises(ValueError, match=f"block_size={int(block_size)} is too large"):
        fastload.TokenDataset(np.arange(100, dtype=np.uint16), block_size)


def test_token_stride_at_the_int64_limit():
    ds = fastload.TokenDataset(np.arange(100, dtype=np.uint16), 4, stride=2**63 - 1)
    assert len(ds) == 1
    np.testing.assert_array_equal(ds[0][0], [0, 1, 2, 3])


def test_the_bus_handlers_thread_locals_need_no_allocation(tmp_path):
    """The SIGBUS handler reads the guard's thread-locals on whatever thread
    faulted.  In a dlopen'd module the default TLS model reaches them
    through __tls_get_addr, whose first call on a thread may allocate: in a
    signal handler.  They are initial-exec, so bus_guard.c, compiled as the
    extension is (-fPIC), calls no __tls_get_addr."""
    import pathlib
    import shutil

    cc, nm = shutil.which(os.environ.get("CC", "gcc")) or shutil.which("cc"), shutil.which("nm")
    if cc is None or nm is None:
        pytest.skip("needs a C compiler and nm")
    root = pathlib.Path(__file__).resolve().parent.parent
    obj = tmp_path / "bus_guard.o"
    subprocess.run([cc, "-std=c11", "-O2", "-fPIC", "-Icsrc", "-c", "csrc/core/memory/bus_guard.c",
                    "-o", str(obj)], cwd=root, check=True)
    undefined = subprocess.run([nm, "-u", str(obj)], capture_output=True, text=True,
                               check=True).stdout.split()
    assert "__tls_get_addr" not in undefined, undefined
