"""Fault injection: failing reads (EIO, EACCES, short reads, a file deleted
mid-epoch), a batch buffer that cannot be allocated, and Python code
raising inside the pipeline.  Every case must give a clear exception naming
the file (or skip it), never hang (each test runs under a timeout), leave
no worker thread or batch buffer behind, and leave the loader usable for
the next epoch.  (Errors from worker_init_fn, collate_fn, IterableDataset
iterators, Ctrl-C and dropped loaders are covered in test_workers.py.)"""

import gc
import os
import pathlib
import re
import shutil
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("PIL")

import fastload  # noqa: E402
from c_shims import compile_shim  # noqa: E402
from fastload import transforms as T  # noqa: E402
from fl_helpers import fastload_only, wait_until  # noqa: E402
from proc_info import native_thread_count  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "benchmarks"))
import imagenet_like  # noqa: E402

pytestmark = fastload_only

ROOT = pathlib.Path(__file__).resolve().parent.parent


def transform():
    return T.Compose([T.RandomResizedCrop(32), T.ToTensor()])


@pytest.fixture(scope="module")
def good_jpeg(tmp_path_factory):
    root = tmp_path_factory.mktemp("faults")
    return next(p for p, d in imagenet_like.make_test_images(str(root))
                if d.startswith("641x479 baseline 4:2:0"))


@pytest.fixture(scope="module")
def faulty_io(tmp_path_factory):
    return compile_shim("faulty_io", tmp_path_factory)


SCRIPT = textwrap.dedent("""
    import os, sys
    import fastload
    from fastload import transforms as T
    from proc_info import native_thread_count
    good, bad = sys.argv[1], sys.argv[2]
    tf = T.Compose([T.RandomResizedCrop(32), T.ToTensor()])
    threads = native_thread_count()
    for workers in (0, 2):
        ds = fastload.ImageFiles([good, bad, good], transform=tf)
        loader = fastload.DataLoader(ds, batch_size=3, num_workers=workers)
        try:
            next(iter(loader))
        except OSError as e:
            text = str(e).replace("\\n", " | ")
            print(f"raised {type(e).__name__}: {text}")
        else:
            print("no error")
        skip = fastload.ImageFiles([good, bad, good], transform=tf, on_error="skip")
        (images, labels), = list(fastload.DataLoader(skip, batch_size=3, num_workers=workers))
        print(f"skip: {len(labels)} samples, {skip.skipped_count} skipped")
        del loader
    # the next epoch on good data works, and no worker is left behind
    ok = fastload.ImageFiles([good] * 4, transform=tf)
    assert sum(len(y) for _, y in fastload.DataLoader(ok, batch_size=2, num_workers=2)) == 4
    import gc, time
    gc.collect()
    deadline = time.monotonic() + 10  # threads are joined, but exit asynchronously
    while native_thread_count() > threads and time.monotonic() < deadline:
        time.sleep(0.02)
    print(f"threads {threads} -> {native_thread_count()}")
""")


@pytest.mark.parametrize("fault, error", [
    ("fault-eio", "OSError: \\[Errno 5\\] Input/output error \\(sample index 1\\): "
                  "'.*fault-eio.jpg'"),
    ("fault-eacces", "PermissionError: \\[Errno 13\\] Permission denied \\(sample index 1\\): "
                     "'.*fault-eacces.jpg'"),
    ("fault-short", "DecodeError: cannot decode .*fault-short.jpg \\(sample index 1\\): "
                    "premature end"),
])
def test_failing_reads(tmp_path, good_jpeg, faulty_io, fault, error):
    bad = tmp_path / f"{fault}.jpg"
    shutil.copy(good_jpeg, bad)
    env = dict(os.environ)
    env["LD_PRELOAD"] = ":".join(filter(None, [env.get("LD_PRELOAD"), str(faulty_io)]))
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "tests")])
    result = subprocess.run([sys.executable, "-c", SCRIPT, good_jpeg, str(bad)], env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    raised = [line for line in lines if line.startswith("raised")]
    assert len(raised) == 2 and all(re.search(error, line) for line in raised), lines
    assert lines.count("skip: 3 samples, 1 skipped") == 2, lines
    before, after = re.search(r"threads (\d+) -> (\d+)", result.stdout).groups()
    assert int(after) <= int(before), lines


def test_file_deleted_mid_epoch(tmp_path, good_jpeg, thread_baseline):
    base = thread_baseline()
    paths = []
    for i in range(12):
        p = tmp_path / f"img_{i}.jpg"
        shutil.copy(good_jpeg, p)
        paths.append(str(p))
    ds = fastload.ImageFiles(paths, transform=transform())
    loader = fastload.DataLoader(ds, batch_size=2, num_workers=2, prefetch_factor=1)
    it = iter(loader)
    next(it)  # batches 1-2 are already in flight; the last ones are not
    os.unlink(paths[-1])
    with pytest.raises(FileNotFoundError, match="img_11.jpg"):
        for _ in it:
            pass
    del it
    assert wait_until(lambda: native_thread_count() <= base, 10)
    shutil.copy(good_jpeg, paths[-1])
    assert sum(len(y) for _, y in loader) == 12  # the next epoch works


def test_batch_buffer_that_cannot_be_allocated(good_jpeg, thread_baseline):
    base = thread_baseline()
    # 64 x 3 x 60000 x 60000 float32: no machine grants that.
    huge = fastload.ImageFiles([good_jpeg] * 4, transform=T.Compose(
        [T.Resize((60000, 60000)), T.ToTensor()]))
    loader = fastload.DataLoader(huge, batch_size=4, num_workers=1)
    with pytest.raises(MemoryError, match="cannot allocate a .*-byte batch buffer"):
        next(iter(loader))
    assert wait_until(lambda: native_thread_count() <= base, 10)
    small = fastload.ImageFiles([good_jpeg] * 4, transform=transform())
    assert sum(len(y) for _, y in fastload.DataLoader(small, batch_size=2, num_workers=1)) == 4


def test_python_transform_raising(good_jpeg, thread_baseline):
    base = thread_baseline()
    calls = []

    def flaky(image):
        calls.append(1)
        if len(calls) == 3:
            raise ValueError("bad augmentation")
        return image[:8, :8].copy()

    ds = fastload.ImageFiles([good_jpeg] * 6, transform=flaky)
    # Threads share `calls` (each worker process would count its own).
    loader = fastload.DataLoader(ds, batch_size=2, num_workers=2, output="numpy",
                                 worker_mode="thread")
    it = iter(loader)
    results = []
    for _ in range(3):
        try:
            results.append(next(it))
        except ValueError as e:
            assert "bad augmentation" in str(e) and "sample index" in str(e)
            results.append(None)
    assert results.count(None) == 1 and len([r for r in results if r is not None]) == 2
    del it
    assert wait_until(lambda: native_thread_count() <= base, 10)
    assert sum(len(y) for _, y in loader) == 6  # the next epoch (no more failures)


def test_slots_are_returned_after_errors(good_jpeg, tmp_path):
    bad = tmp_path / "bad.jpg"
    bad.write_bytes(b"\xff\xd8\xff" + bytes(100))
    ds = fastload.ImageFiles([good_jpeg, str(bad)] * 4, transform=transform())
    loader = fastload.DataLoader(ds, batch_size=2, num_workers=2)
    for _ in range(3):
        it = iter(loader)
        raised = False
        try:
            for batch in it:
                del batch  # not held: its slot goes back
        except fastload.DecodeError:
            raised = True  # (an exception kept alive would keep the iterator alive)
        assert raised
        del it
    gc.collect()
    live, free = loader._slot_pool.counts()
    assert live == free  # every allocated slot is back on the free list


def test_keyboard_interrupt_at_random_points(good_jpeg):
    """SIGINT lands wherever the main thread is (waiting for a batch, in the
    loop body, in the collate of num_workers=0): KeyboardInterrupt, workers
    joined, the loader fine for the next epoch."""
    import random
    import signal
    import threading
    import time

    ds = fastload.ImageFiles([good_jpeg] * 64, transform=transform())
    rng = random.Random(0)
    base = None
    for trial in range(8):
        workers = trial % 3
        loader = fastload.DataLoader(ds, batch_size=4, num_workers=workers)
        if base is None:
            list(loader)  # warm up lazy thread pools before counting threads
            gc.collect()
            base = native_thread_count()
        delay = rng.uniform(0.0, 0.05)
        timer = threading.Timer(delay, signal.pthread_kill,
                                (threading.main_thread().ident, signal.SIGINT))
        interrupted = False
        try:
            timer.start()
            for _ in range(100):  # several epochs: the signal lands inside one
                for batch in loader:
                    del batch
        except KeyboardInterrupt:
            interrupted = True
        finally:
            timer.join()
        assert interrupted
        assert sum(len(y) for _, y in loader) == 64  # the next epoch works
        del loader
        gc.collect()
        assert wait_until(lambda: native_thread_count() <= base, 10), trial


def test_loader_dropped_while_batches_are_held(good_jpeg):
    ds = fastload.ImageFiles([good_jpeg] * 16, transform=transform())
    loader = fastload.DataLoader(ds, batch_size=4, num_workers=2)
    it = iter(loader)
    held = [next(it), next(it)]
    expected = [b[0].clone() for b in held]
    del it, loader
    gc.collect()
    # the held batches' buffers are still theirs: nothing overwrote them
    more = list(fastload.DataLoader(ds, batch_size=4, num_workers=2))
    assert len(more) == 4
    for batch, copy in zip(held, expected):
        assert batch[0].shape == (4, 3, 32, 32)
        assert (batch[0] == copy).all()
