"""Shutdown with a worker stuck in the dataset.

A worker thread cannot be killed.  Shutdown waits for each worker's current
sample with a bound; one still inside its sample then is detached, left
running with what it uses, and named in a RuntimeWarning, so that dropping
the iterator or loader, Ctrl-C and interpreter exit all finish.

The scenarios whose worker never returns run in a child interpreter: a
thread stuck forever would otherwise stay in the test process.  The child's
time limit only detects a hang; no test measures how fast anything is.
"""

import gc
import os
import select
import signal
import subprocess
import sys
import textwrap
import threading
import time
import warnings
import weakref

import pytest

import fastload
from fastload import _C
from fl_helpers import fastload_only, native_thread_count, wait_until

pytestmark = fastload_only

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HANG_LIMIT = 60.0   # a child still running after this long is hung
JOIN_TIMEOUT = 15.0  # generous bound for threads to disappear; never a speed check

BLOCKS = {
    "event": "threading.Event().wait()",
    "sleep": "time.sleep(10**6)",
    # Wakes every 0.5 ms, so the detached thread asks for the GIL all through
    # interpreter finalization.
    "poll": "while True: time.sleep(0.0005)",
}

# Every print below writes one string: with PYTHONUNBUFFERED a print of
# several arguments is several writes, and a worker's "stuck" may land between.
PRELUDE = """
import os, sys, threading, time
import fastload

entered = threading.Event()  # set once a worker is stuck

class Stuck(fastload.Dataset):
    # Sample STUCK_AT blocks forever; the others are their index.
    def __init__(self, n=8):
        self.n = n
    def __len__(self):
        return self.n
    def __getitem__(self, i):
        if i == STUCK_AT:
            entered.set()
            os.write(1, b"stuck\\n")
            BLOCK
        return i
"""


def child_env():
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("PYTHONWARNINGS", None)
    return env


def script(body, stuck_at=3, block="event"):
    prelude = PRELUDE.replace("STUCK_AT", str(stuck_at)).replace("BLOCK", BLOCKS[block])
    return prelude + textwrap.dedent(body)


def run_child(code):
    """Runs `code` in a child interpreter; fails the test if it hangs."""
    try:
        return subprocess.run([sys.executable, "-W", "default", "-c", code], cwd=ROOT,
                              env=child_env(), capture_output=True, text=True,
                              timeout=HANG_LIMIT)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the child hung; stdout: {e.stdout!r}, stderr: {e.stderr!r}")


def assert_clean_exit(result):
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    assert "Fatal Python error" not in result.stderr, result.stderr


# ------------------------------------------------------ stuck __getitem__


@pytest.mark.parametrize("block", sorted(BLOCKS))
@pytest.mark.parametrize("drop", ["del it", "exit"])
def test_stuck_getitem_after_timeout_exits(block, drop):
    result = run_child(script(f"""
        loader = fastload.DataLoader(Stuck(), batch_size=1, num_workers=2, worker_mode="thread",
                                     timeout=1, output="numpy")
        it = iter(loader)
        got = []
        try:
            for batch in it:
                got.append(int(batch[0]))
        except RuntimeError as e:
            print(e)
        entered.wait()  # on a busy machine the timeout may come before sample 3 starts
        print("got " + str(got))
        {"del it" if drop == "del it" else "pass"}
        print("end of script", flush=True)
    """, block=block))
    assert_clean_exit(result)
    assert "DataLoader timed out after 1 seconds" in result.stdout
    assert "got [0, 1, 2]" in result.stdout
    assert "end of script" in result.stdout
    # Worker 1 runs samples 1, 3, 5, 7 (round-robin): it is the stuck one.
    assert "RuntimeWarning: DataLoader worker 1 (stuck at sample index 3) did not stop" \
        in result.stderr
    assert "worker 0" not in result.stderr
    if drop == "del it":  # warned when dropped, before the script ended
        assert result.stdout.index("got") < result.stdout.index("end of script")


def test_stuck_worker_init_fn_exits():
    result = run_child(script("""
        def init(worker_id):
            if worker_id == 1:
                threading.Event().wait()

        loader = fastload.DataLoader(Stuck(), batch_size=1, num_workers=2, worker_mode="thread",
                                     timeout=1, worker_init_fn=init, output="numpy")
        it = iter(loader)
        print("first " + str(int(next(it)[0])))
        try:
            next(it)
        except RuntimeError as e:
            print(e)
        del it, loader
        print("end of script", flush=True)
    """, stuck_at=-1))
    assert_clean_exit(result)
    assert "first 0" in result.stdout
    assert "DataLoader timed out after 1 seconds" in result.stdout
    assert "end of script" in result.stdout
    assert "DataLoader worker 1 (stuck while starting (worker_init_fn)) did not stop" \
        in result.stderr


def test_persistent_reset_with_stuck_worker_times_out():
    result = run_child(script("""
        loader = fastload.DataLoader(Stuck(), batch_size=1, num_workers=2, worker_mode="thread",
                                     timeout=1, persistent_workers=True, output="numpy")
        it = iter(loader)
        print("epoch 0 %d %d" % (int(next(it)[0]), int(next(it)[0])))
        entered.wait()  # sample 3 is running: the reset must wait for it
        for attempt in range(2):
            try:
                iter(loader)
            except RuntimeError as e:
                print("reset %d %s" % (attempt, e))
        del it, loader
        print("end of script", flush=True)
    """))
    assert_clean_exit(result)
    assert "epoch 0 0 1" in result.stdout
    assert "reset 0 DataLoader timed out after 1 seconds" in result.stdout
    assert "reset 1 DataLoader timed out after 1 seconds" in result.stdout
    assert "end of script" in result.stdout
    assert "DataLoader worker 1 (stuck at sample index 3) did not stop" in result.stderr


def test_stuck_worker_without_timeout_is_left_at_exit():
    # No timeout: interpreter exit waits the full grace period, then leaves it.
    result = run_child(script("""
        loader = fastload.DataLoader(Stuck(), batch_size=1, num_workers=2, worker_mode="thread",
                                     output="numpy")
        it = iter(loader)
        print("got " + str([int(next(it)[0]) for _ in range(3)]), flush=True)
        entered.wait()  # worker 1 has sample 3 queued: exit only once it is stuck there
    """))
    assert_clean_exit(result)
    assert "got [0, 1, 2]" in result.stdout
    grace = fastload.loader.iterators._SHUTDOWN_GRACE_SECONDS
    assert (f"DataLoader worker 1 (stuck at sample index 3) did not stop within {grace:g} "
            "seconds of shutdown") in result.stderr


# ---------------------------------------------------------------- Ctrl-C


def read_until(proc, marker, limit):
    """Reads the child's stdout until `marker`; returns what was read."""
    out = b""
    deadline = time.monotonic() + limit
    while marker not in out:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([proc.stdout], [], [], left)[0]:
            proc.kill()
            pytest.fail(f"the child never printed {marker!r}; stdout so far: {out!r}")
        chunk = os.read(proc.stdout.fileno(), 4096)
        if not chunk:
            pytest.fail(f"the child exited before printing {marker!r}: {out!r}")
        out += chunk
    return out


def test_ctrl_c_while_waiting_for_a_stuck_worker():
    code = script("""
        loader = fastload.DataLoader(Stuck(), batch_size=1, num_workers=2, worker_mode="thread",
                                     output="numpy")
        it = iter(loader)
        got = [int(next(it)[0]) for _ in range(3)]
        print("waiting " + str(got), flush=True)
        try:
            next(it)  # sample 3 never comes
        except KeyboardInterrupt:
            print("interrupted", flush=True)
            raise
    """)
    proc = subprocess.Popen([sys.executable, "-W", "default", "-c", code], cwd=ROOT,
                            env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out = read_until(proc, b"waiting", HANG_LIMIT)
        out += read_until(proc, b"stuck", HANG_LIMIT) if b"stuck" not in out else b""
        time.sleep(0.3)  # most likely inside next() by now; either way it must end
        proc.send_signal(signal.SIGINT)
        try:
            rest, err = proc.communicate(timeout=HANG_LIMIT)
        except subprocess.TimeoutExpired:
            pytest.fail("the child hung after Ctrl-C")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    out += rest
    err = err.decode()
    assert b"waiting [0, 1, 2]" in out
    assert b"interrupted" in out, (out, err)
    assert "KeyboardInterrupt" in err
    assert "Fatal Python error" not in err, err
    # An uncaught KeyboardInterrupt ends the interpreter by SIGINT.
    assert proc.returncode in (-signal.SIGINT, 128 + signal.SIGINT), (proc.returncode, err)
    assert "DataLoader worker 1 (stuck at sample index 3) did not stop" in err


# ----------------------------------------------- in process, then released


class Gated(fastload.Dataset):
    """Sample `gate_at` waits until `release` is set."""

    def __init__(self, gate_at, n=8):
        self.gate_at = gate_at
        self.n = n
        self.entered = threading.Event()
        self.release = threading.Event()

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i == self.gate_at:
            self.entered.set()
            self.release.wait()
        return i


def next_error(it):
    """next(it) must raise RuntimeError; returns its message (no traceback,
    which would keep the iterator alive)."""
    try:
        next(it)
    except RuntimeError as e:
        return str(e)
    pytest.fail("next() did not raise")


def test_detached_worker_keeps_dataset_and_exits_when_released():
    base = native_thread_count()
    dataset = Gated(gate_at=3)
    alive = weakref.ref(dataset)
    release = dataset.release
    it = iter(fastload.DataLoader(dataset, batch_size=1, num_workers=2, worker_mode="thread",
                                  timeout=0.1, output="numpy"))
    del dataset
    try:
        assert [int(next(it)[0]) for _ in range(3)] == [0, 1, 2]
        assert next_error(it) == "DataLoader timed out after 0.1 seconds"
        # After a timeout the wait is the timeout, but 1 s at least, so the
        # idle worker 0 exits in time and only worker 1 is named.
        with pytest.warns(RuntimeWarning, match=r"^DataLoader worker 1 \(stuck at sample "
                                                r"index 3\) did not stop within 1 seconds"):
            del it
            gc.collect()
        # The detached thread still runs __getitem__: its dataset is alive.
        assert alive() is not None
    finally:
        release.set()
    # Released, the worker finishes, exits by itself and drops what it held.
    assert wait_until(lambda: native_thread_count() <= base, JOIN_TIMEOUT), \
        (native_thread_count(), base)
    assert wait_until(lambda: alive() is None, JOIN_TIMEOUT)


def test_slow_finite_sample_is_joined_without_warning():
    base = native_thread_count()

    class Slow(fastload.Dataset):
        entered = threading.Event()

        def __len__(self):
            return 8

        def __getitem__(self, i):
            if i == 3:
                self.entered.set()
                time.sleep(0.5)  # slow, well inside the shutdown grace period
            return i

    dataset = Slow()
    it = iter(fastload.DataLoader(dataset, batch_size=1, num_workers=2, worker_mode="thread",
                                  output="numpy"))
    next(it)
    assert dataset.entered.wait(JOIN_TIMEOUT)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del it  # worker 1 is inside sample 3
        gc.collect()
    assert not [w for w in caught if issubclass(w.category, RuntimeWarning)], \
        [str(w.message) for w in caught]
    assert wait_until(lambda: native_thread_count() <= base, JOIN_TIMEOUT), \
        (native_thread_count(), base)


def test_persistent_loader_usable_after_reset_timeout_once_worker_returns():
    dataset = Gated(gate_at=3)
    loader = fastload.DataLoader(dataset, batch_size=1, num_workers=2, worker_mode="thread",
                                 timeout=0.5, persistent_workers=True, output="numpy")
    it = iter(loader)
    assert [int(next(it)[0]) for _ in range(2)] == [0, 1]
    assert dataset.entered.wait(JOIN_TIMEOUT)
    with pytest.raises(RuntimeError, match=r"^DataLoader timed out after 0.5 seconds$"):
        iter(loader)
    dataset.release.set()
    # The worker came back: the next epoch starts from the beginning.
    assert [int(b[0]) for b in iter(loader)] == list(range(8))
    del it, loader


# ---------------------------------------------------------- the binding


class GateWorker:
    """An engine worker whose fetch blocks until `release` is set."""

    def __init__(self, release):
        self.release = release
        self.entered = threading.Event()

    def start(self):
        pass

    def fetch(self, request):
        self.entered.set()
        self.release.wait()
        return _C.JOB_DONE, request

    def stop(self):
        pass


def test_engine_close_with_bound_returns_the_workers_left_running():
    base = native_thread_count()
    release = threading.Event()
    stuck = GateWorker(release)
    idle = GateWorker(threading.Event())
    engine = _C.Engine([stuck, idle], 4)
    try:
        assert engine.submit("job") is True
        assert stuck.entered.wait(JOIN_TIMEOUT)
        assert engine.close(2.0) == (stuck,)
        assert engine.closed and engine.close(2.0) == ()
    finally:
        release.set()
    assert wait_until(lambda: native_thread_count() <= base, JOIN_TIMEOUT), \
        (native_thread_count(), base)
    with pytest.raises(ValueError):
        _C.Engine([GateWorker(release)], 1).close(-1)


def test_engine_dropped_unclosed_with_a_stuck_worker_warns():
    base = native_thread_count()
    release = threading.Event()
    worker = GateWorker(release)
    engine = _C.Engine([worker], 1)
    try:
        assert engine.submit("job") is True
        assert worker.entered.wait(JOIN_TIMEOUT)
        with pytest.warns(RuntimeWarning, match="worker thread 0 did not stop"):
            del engine
    finally:
        release.set()
    assert wait_until(lambda: native_thread_count() <= base, JOIN_TIMEOUT), \
        (native_thread_count(), base)
