"""Process workers when the system says no: a worker killed half-way
through a result, descriptors run out, torch's handle on the worker
processes.  Every failure is a RuntimeError that names what happened."""

import os
import pickle
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.utils.data as tud  # noqa: E402

import fastload  # noqa: E402
from fastload import _C
from fastload.loader import process_engine as _process  # noqa: E402
from fl_helpers import fastload_only  # noqa: E402

pytestmark = fastload_only

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(fastload.__file__)))


class Rows(tud.Dataset):
    def __len__(self):
        return 16

    def __getitem__(self, i):
        return np.full(4, i, np.int64)


def _die(sock, fds):
    os.kill(os.getpid(), signal.SIGKILL)


def test_worker_killed_between_a_result_and_its_descriptors_is_named(monkeypatch):
    # The forked worker inherits the patch: it sends its first result's
    # message, then dies before the descriptors of its slots follow.
    monkeypatch.setattr(_process, "_send_fds", _die)
    loader = fastload.DataLoader(Rows(), batch_size=4, num_workers=1, worker_mode="process",
                                 multiprocessing_context="fork")
    with pytest.raises(RuntimeError,
                       match=r"DataLoader worker \(pid \d+\) is killed by signal: SIGKILL"):
        next(iter(loader))


def _run(script):
    """Runs `script` in a child interpreter (its own descriptor limit);
    returns its stdout, or fails with its stderr."""
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], cwd=ROOT,
                            capture_output=True, text=True, timeout=300,
                            env=dict(os.environ, PYTHONPATH=ROOT))
    assert result.returncode == 0, result.stderr[-4000:]
    return result.stdout


# torch's test_fd_limit_exceeded, with fastload's loader.
FD_LIMIT_SCRIPT = """
import resource, torch
import fastload
from torch.utils.data import IterableDataset

class RandomDataset(IterableDataset):
    def __init__(self, len, size):
        self.len, self.size = len, size

    def __iter__(self):
        return self

    def __next__(self):
        if self.len <= 0:
            raise StopIteration
        self.len -= 1
        return torch.randn(self.size)

keep_fds_alive = []
resource.setrlimit(resource.RLIMIT_NOFILE, ({limit}, {limit}))
try:
    for random_t in fastload.DataLoader(RandomDataset({count}, {size}), num_workers=1,
                                        multiprocessing_context="fork",
                                        worker_mode="process"):
        random_t.max(dim=0)
        keep_fds_alive.append(random_t)
except RuntimeError as e:
    print("RuntimeError", len(keep_fds_alive), e)
except MemoryError as e:
    print("MemoryError", len(keep_fds_alive), e)
else:
    print("held", len(keep_fds_alive))
"""


def test_torch_fd_limit_scenario_holds_every_small_batch():
    out = _run(FD_LIMIT_SCRIPT.format(limit=100, count=200, size=(2, 2)))
    assert out.split() == ["held", "200"], out


def test_held_large_batches_beyond_the_fd_limit_raise_a_named_runtime_error():
    # Each 1.5 MiB batch needs a memfd of its own: 200 of them held cannot
    # fit in 100 descriptors, in the worker or in this process.
    out = _run(FD_LIMIT_SCRIPT.format(limit=100, count=200, size=(3 << 17,)))
    kind, held, message = out.split(" ", 2)
    assert kind == "RuntimeError", out
    assert 10 < int(held) < 100
    for words in ("too many open files", "RLIMIT_NOFILE", "limit is 100", "ulimit -n",
                  "batch slots", "release the batches", "set_sharing_strategy"):
        assert words in message, (words, message)


def test_descriptors_truncated_in_transit_are_detected():
    # The worker has sent its first result; this process then has no
    # descriptor free, so the kernel drops the one that comes with it
    # (MSG_CTRUNC): an error, never a batch over the wrong memory.
    out = _run("""
        import os, resource
        import numpy as np
        import fastload
        import torch.utils.data as tud

        class Rows(tud.Dataset):
            def __len__(self):
                return 8

            def __getitem__(self, i):
                return np.full(4, i, np.int64)

        resource.setrlimit(resource.RLIMIT_NOFILE, (200, 200))
        loader = fastload.DataLoader(Rows(), batch_size=4, num_workers=1,
                                     worker_mode="process", multiprocessing_context="fork")
        # What an epoch imports or opens lazily, done: the one call left to
        # fail for want of a descriptor is the result's receipt.
        assert len(list(loader)) == 2
        it = iter(loader)
        filler = []
        try:
            while True:
                filler.append(os.dup(0))
        except OSError:
            pass
        try:
            next(it)
        except RuntimeError as e:
            print(e)
        else:
            print("no error")
    """)
    assert "too many open files" in out and "MSG_CTRUNC" in out and "limit is 200" in out, out


def test_no_descriptor_to_start_a_worker_is_named():
    out = _run("""
        import os, resource
        import fastload
        import torch.utils.data as tud

        class Items(tud.Dataset):
            def __len__(self):
                return 8

            def __getitem__(self, i):
                return i

        resource.setrlimit(resource.RLIMIT_NOFILE, (200, 200))
        loader = fastload.DataLoader(Items(), batch_size=4, num_workers=1,
                                     worker_mode="process", multiprocessing_context="fork")
        assert len(list(loader)) == 2  # what an epoch imports lazily, imported
        filler = []
        try:
            while True:
                filler.append(os.dup(0))
        except OSError:
            pass
        try:
            iter(loader)
        except RuntimeError as e:
            print(e)
        else:
            print("no error")
    """)
    assert "too many open files" in out and "to start DataLoader worker process 0" in out, out
    assert "limit is 200" in out and "ulimit -n" in out, out


def test_one_text_for_descriptors_run_out_in_either_process():
    # The worker's slot pool (C) and the parent (_process) raise the same
    # text, formatted in one place.
    import resource

    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    limit = "unlimited" if soft == resource.RLIM_INFINITY else str(soft)
    text = _C.too_many_files_message("to do X", "3 things are held")
    assert text.startswith("fastload: too many open files: no file descriptor left to do X.  "
                           f"This process's limit is {limit} descriptors (RLIMIT_NOFILE soft "
                           "limit); 3 things are held.  Raise the limit (`ulimit -n`"), text
    for words in ("release the batches", "set_sharing_strategy", "1048576 bytes share"):
        assert words in text, (words, text)
    error = _process._too_many_files("to map a batch", 7)
    assert isinstance(error, RuntimeError)
    assert str(error) == _C.too_many_files_message(
        "to map a batch", "7 batch slots from the workers are held here (batches the loop "
        "keeps alive, or in flight)")


class _FailsOnce:
    """Stands in for `real` (a callable) and raises `error` on its first call."""

    def __init__(self, real, error):
        self.real, self.error, self.calls = real, error, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        if self.calls == 1:
            raise self.error
        return self.real(*args, **kwargs)


def _fail_mapping_once(monkeypatch):
    import errno as errno_module
    import mmap as mmap_module

    class Mmap:  # the module, as _process sees it: its mmap() fails once (ENOMEM)
        mmap = _FailsOnce(mmap_module.mmap, OSError(errno_module.ENOMEM, "Cannot allocate memory"))

    monkeypatch.setattr(_process, "mmap", Mmap)


def _fail_unpickling_once(monkeypatch):
    real = _process._SlotUnpickler.load
    failing = _FailsOnce(real, pickle.UnpicklingError("a broken batch"))
    monkeypatch.setattr(_process._SlotUnpickler, "load", lambda self: failing(self))


FAILS_ONCE = {"mapping": (_fail_mapping_once, OSError, "Cannot allocate memory"),
              "unpickling": (_fail_unpickling_once, pickle.UnpicklingError, "a broken batch")}


@pytest.mark.parametrize("step", sorted(FAILS_ONCE))
def test_a_batch_lost_after_its_message_was_read_raises_again_not_hangs(monkeypatch, step):
    # The result's message was read, then mapping its memory or unpickling
    # it failed: its task can never be answered.  The next next() says so
    # at once (before: it waited forever, which the loader's timeout shows,
    # or read a later batch over an arena never mapped: KeyError).
    patch, kind, words = FAILS_ONCE[step]
    patch(monkeypatch)
    loader = fastload.DataLoader(Rows(), batch_size=4, num_workers=1, worker_mode="process",
                                 multiprocessing_context="fork", timeout=30)
    it = iter(loader)
    with pytest.raises(kind, match=words):
        next(it)
    with pytest.raises(RuntimeError, match="cannot deliver the rest of this epoch after an "
                                           "earlier error: .*" + words) as caught:
        next(it)
    assert "timed out" not in str(caught.value)
    del it


@pytest.mark.parametrize("step", sorted(FAILS_ONCE))
def test_a_persistent_loader_starts_afresh_after_a_lost_batch(monkeypatch, step):
    patch, kind, words = FAILS_ONCE[step]
    patch(monkeypatch)
    loader = fastload.DataLoader(Rows(), batch_size=4, num_workers=2, worker_mode="process",
                                 multiprocessing_context="fork", persistent_workers=True,
                                 timeout=30)
    with pytest.raises(kind, match=words):
        list(loader)
    # The next epoch on fresh workers (before: it waited for the lost batch
    # and timed out).
    assert [int(b[0, 0]) for b in loader] == [0, 4, 8, 12]
    assert [int(b[0, 0]) for b in loader] == [0, 4, 8, 12]


def test_truncated_descriptor_message_is_refused():
    import socket

    left, right = socket.socketpair()
    with left, right:
        r, w = os.pipe()
        try:
            # One descriptor sent; the message says two.
            left.sendmsg([bytes([2])], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                         np.array([r], np.int32).tobytes())])
            with pytest.raises(RuntimeError, match="sent 1 slot descriptors with a batch "
                                                   "that needs 2"):
                _process._receive_fds(right, 2, 0)
        finally:
            os.close(r)
            os.close(w)


def test_many_small_slots_share_one_descriptor():
    # In a child interpreter: the arenas and the list of freed ones are the
    # process's, so a shared slot another test left alive here could host
    # these slots or keep their arena.
    out = _run("""
        import numpy as np
        from fastload import _C

        assert _C.take_freed_shared_slots() == [] and _C.shared_slot(np.zeros(1)) is None
        pool = _C.SlotPool(max_free=0, memory="shared")
        batches = [_C.collate([np.full(4, i, np.int64)], pool, None) for i in range(300)]
        infos = [_C.shared_slot(b) for b in batches]
        arenas = {info[1] for info in infos}
        slots = {info[3] for info in infos}
        assert len(slots) == 300 and len(arenas) == 1, (len(slots), arenas)
        # Regions do not overlap: every batch kept its own values.
        assert [int(b[0, 0]) for b in batches] == list(range(300))
        big = _C.collate([np.zeros(1 << 20, np.uint8), np.zeros(1 << 20, np.uint8)], pool, None)
        big_arena = _C.shared_slot(big)[1]
        assert big_arena not in arenas  # a large slot has its own memfd
        del batches, infos
        # The arena went with its last slot; the large one lives on.
        assert _C.take_freed_shared_slots() == list(arenas)
        del big
        assert _C.take_freed_shared_slots() == [big_arena]
        print("ok")
    """)
    assert out.split() == ["ok"], out


class Sleepy(tud.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        return i


@pytest.mark.parametrize("exhaust", [False, True])
def test_partial_workers_exit(exhaust):
    # torch's test_partial_workers: the iterator's _workers exit once it is
    # dropped (or, not persistent, exhausted).
    it = iter(fastload.DataLoader(Sleepy(), batch_size=2, num_workers=2,
                                  worker_mode="process"))
    workers = it._workers
    assert len(workers) == 2 and all(w.is_alive() and w.pid for w in workers)
    for i, _ in enumerate(it):
        if i == 10 and not exhaust:
            break
    del it
    for w in workers:
        w.join(60)
        assert not w.is_alive(), "worker process not terminated"
