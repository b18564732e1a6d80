"""fastload in a profiler's timeline: torch.profiler traces show the
workers' batches and stages on their own threads, and NVTX ranges mark the
same for Nsight."""

import ctypes
import json
import os
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest

import fastload
from fastload import _C, transforms as T

from test_cuda_driver import CC, ROOT
from test_stats import write_jpegs

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    folder = tmp_path_factory.mktemp("profiled")
    write_jpegs(folder, 24)
    return fastload.ImageFolder(str(folder), transform=T.Compose(
        [T.RandomResizedCrop(32), T.RandomHorizontalFlip(), T.ToTensor()]))


def profile(loader, path):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in loader:
            torch.mm(torch.ones(8, 8), torch.ones(8, 8))
    fastload.profiler.export_chrome_trace(prof, path)
    with open(path) as f:
        return json.load(f)["traceEvents"]


def test_native_workers_appear_on_their_own_threads(images, tmp_path):
    loader = fastload.DataLoader(images, batch_size=6, num_workers=2)
    events = profile(loader, tmp_path / "trace.json")
    ours = [e for e in events if e.get("cat") == "fastload"]
    by_name = Counter(e["name"] for e in ours)
    assert by_name["fastload batch"] == 4
    for stage in ("read", "decode", "transform"):
        assert by_name[f"fastload {stage}"] == 24, by_name
    main = os.getpid()  # the loop's thread id is the process id
    worker_tids = {e["tid"] for e in ours}
    assert len(worker_tids) == 2 and main not in worker_tids
    named = {e["tid"] for e in events if e.get("name") == "thread_name"}
    assert worker_tids <= named
    # Each stage lies inside its thread's batch.
    batches = [e for e in ours if e["name"] == "fastload batch"]
    for e in ours:
        if e["name"] != "fastload batch":
            assert any(b["tid"] == e["tid"] and b["ts"] - 1 <= e["ts"]
                       and e["ts"] + e["dur"] <= b["ts"] + b["dur"] + 1 for b in batches), e
    # The loop's side, under torch's own name for it.
    nexts = [e for e in events if e.get("name") == "enumerate(DataLoader)#_ThreadedIter.__next__"]
    assert len(nexts) == 5  # four batches and the StopIteration
    assert all(e["tid"] == main for e in nexts)


def test_python_datasets_show_their_dataset_and_collate_stages(tmp_path):
    class Slow:
        def __len__(self):
            return 8

        def __getitem__(self, i):
            return np.full(3, i)

    loader = fastload.DataLoader(Slow(), batch_size=2, num_workers=2, worker_mode="thread")
    events = profile(loader, tmp_path / "trace.json")
    by_name = Counter(e["name"] for e in events if e.get("cat") == "fastload")
    assert by_name["fastload dataset"] == 4 and by_name["fastload collate"] == 4
    assert by_name["fastload batch"] == 4


def test_nothing_is_recorded_without_a_profiler(images):
    fastload.profiler.take_events()  # whatever an earlier test left
    loader = fastload.DataLoader(images, batch_size=6, num_workers=2)
    for _ in loader:
        pass
    assert not _C.trace_on()
    assert fastload.profiler.take_events() == ([], 0)


def test_a_full_trace_buffer_drops_and_counts(images, monkeypatch):
    monkeypatch.setattr(fastload.profiler, "TRACE_CAPACITY", 5)
    loader = fastload.DataLoader(images, batch_size=6, num_workers=2)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        for _ in loader:
            pass
        events, dropped = fastload.profiler.take_events()
    assert len(events) == 5 and dropped == 4 + 3 * 24 - 5
    assert not _C.trace_on()


@pytest.fixture(scope="module")
def fake_nvtx(tmp_path_factory):
    if CC is None:
        pytest.skip("needs a C compiler")
    lib = tmp_path_factory.mktemp("fakenvtx") / "libnvToolsExt-fake.so"
    subprocess.run([CC, "-shared", "-fPIC", "-O1", "-Wall", "-Wextra", "-Werror", "-o",
                    str(lib), str(ROOT / "tests" / "c" / "fake_nvtx.c")], check=True)
    return str(lib)


def test_nvtx_ranges_mark_batches_and_stages(images, fake_nvtx):
    fake = ctypes.CDLL(fake_nvtx)
    fake.fake_nvtx_count.restype = ctypes.c_long
    fake.fake_nvtx_unbalanced.restype = ctypes.c_long
    fastload.profiler.nvtx(True, library=fake_nvtx)
    try:
        assert _C.nvtx_on()
        loader = fastload.DataLoader(images, batch_size=6, num_workers=2)
        for _ in loader:
            pass
    finally:
        fastload.profiler.nvtx(False)
    assert fake.fake_nvtx_count(b"fastload batch") == 4
    for stage in (b"read", b"decode", b"transform"):
        assert fake.fake_nvtx_count(b"fastload " + stage) == 24
    assert fake.fake_nvtx_unbalanced() == 0  # every range pushed was popped, on its thread
    assert fake.fake_nvtx_thread_named(b"fastload-w0") and fake.fake_nvtx_thread_named(
        b"fastload-w1")


def test_nvtx_without_the_library_says_so():
    # In a fresh process: once loaded, a library stays loaded.
    script = (
        "import fastload, pytest\n"
        "with pytest.raises(OSError, match='cannot load the NVTX library'):\n"
        "    fastload.profiler.nvtx(True, library='libnvToolsExt-that-does-not-exist.so.1')\n"
        "assert not fastload._C.nvtx_on()\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("NVTX_INJECTION64_PATH", None)
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
