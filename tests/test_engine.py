"""The C engine through its binding, with plain Python worker objects."""

import os
import threading
import time

import pytest

from fastload import _C
from proc_info import native_thread_names as thread_names


class Recorder:
    """A worker that records what ran where and returns (JOB_DONE, request)."""

    def __init__(self, log, delay=0.0, retire_after=None):
        self.log = log
        self.delay = delay
        self.retire_after = retire_after
        self.done = 0

    def start(self):
        self.log.append(("start", threading.get_ident()))

    def fetch(self, request):
        if self.delay:
            time.sleep(self.delay(request) if callable(self.delay) else self.delay)
        if self.retire_after is not None and self.done >= self.retire_after:
            return _C.JOB_RETIRE, None
        self.done += 1
        return _C.JOB_DONE, (request, threading.get_ident())

    def stop(self):
        self.log.append(("stop", threading.get_ident()))


def drain(engine):
    out = []
    while True:
        d = engine.next(5.0)
        if d is None:
            return out
        out.append(d)


def test_in_order_delivery_round_robin_and_named_threads():
    log = []
    delays = {0: 0.05, 1: 0.0, 2: 0.02, 3: 0.0}
    engine = _C.Engine([Recorder(log, delay=lambda r: delays.get(r, 0)) for _ in range(2)], 4)
    assert {"fastload-w0", "fastload-w1"} <= set(thread_names())  # others may still be exiting
    for i in range(4):
        assert engine.submit(i) is True
    with pytest.raises(RuntimeError):
        engine.submit(99)  # the in-flight bound is reached
    got = drain(engine)
    assert [value[0] for _, _, value in got] == [0, 1, 2, 3]
    assert [worker for _, worker, _ in got] == [0, 1, 0, 1]
    engine.close()
    assert sum(1 for kind, _ in log if kind == "start") == 2
    assert sum(1 for kind, _ in log if kind == "stop") == 2


def test_out_of_order_delivers_by_completion():
    engine = _C.Engine([Recorder([], delay=lambda r: 0.3 if r == 0 else 0.0) for _ in range(2)], 4,
                       in_order=False)
    for i in range(4):
        engine.submit(i)  # round-robin: worker 0 gets 0 (slow) then 2; worker 1 gets 1, 3
    got = [value[0] for _, _, value in drain(engine)]
    assert got == [1, 3, 0, 2]
    engine.close()


def test_retired_worker_gets_no_more_jobs():
    engine = _C.Engine([Recorder([], retire_after=1), Recorder([])], 2)
    assert engine.submit("a") is True  # worker 0
    assert engine.submit("b") is True  # worker 1
    results = [engine.next(5.0), engine.next(5.0)]
    assert [r[0] for r in results] == [_C.JOB_DONE, _C.JOB_DONE]
    assert engine.submit("c") is True  # worker 0, which now retires
    assert engine.next(5.0)[0] == _C.JOB_RETIRE
    for request in "def":
        assert engine.submit(request) is True
        outcome, worker, _ = engine.next(5.0)
        assert (outcome, worker) == (_C.JOB_DONE, 1)
    engine.reset()  # a new epoch revives every worker
    engine.submit("g")
    assert engine.next(5.0)[1] == 0
    engine.close()


def test_every_worker_retired_refuses_jobs():
    engine = _C.Engine([Recorder([], retire_after=0)], 1)
    engine.submit(0)
    assert engine.next(5.0)[0] == _C.JOB_RETIRE
    assert engine.submit(1) is False
    assert engine.next(5.0) is None
    engine.close()


def test_cancel_pending_and_reset():
    engine = _C.Engine([Recorder([], delay=0.2)], 3)
    for i in range(3):
        engine.submit(i)
    time.sleep(0.05)  # the first job is running by now
    assert engine.cancel_pending() == 2
    outcomes = [d[0] for d in drain(engine)]
    assert outcomes == [_C.JOB_DONE, _C.JOB_CANCELLED, _C.JOB_CANCELLED]
    engine.reset()
    engine.submit("again")
    assert engine.next(5.0)[2][0] == "again"
    engine.close()


def test_reset_with_jobs_in_flight_is_refused():
    engine = _C.Engine([Recorder([], delay=0.1)], 2)
    engine.submit(0)
    with pytest.raises(RuntimeError, match="in flight"):
        engine.reset()
    engine.close()


def test_timeout_and_exception_passthrough():
    class Slow(Recorder):
        def fetch(self, request):
            if request == "boom":
                raise ZeroDivisionError("from fetch")
            time.sleep(0.5)
            return _C.JOB_DONE, request

    engine = _C.Engine([Slow([])], 2)
    engine.submit("slow")
    with pytest.raises(TimeoutError):
        engine.next(0.05)
    assert engine.next(5.0)[2] == "slow"
    engine.submit("boom")
    with pytest.raises(ZeroDivisionError, match="from fetch"):
        engine.next(5.0)
    engine.close()


def own_threads(prefix):
    """This test's engine threads, by their name: threads of earlier tests
    may still be exiting, so a plain count could move under the test."""
    return sum(name.startswith(prefix) for name in thread_names())


def test_close_joins_threads_and_is_idempotent():
    engine = _C.Engine([Recorder([], delay=0.05) for _ in range(3)], 6, name="fl-close")
    assert own_threads("fl-close") == 3
    for i in range(6):
        engine.submit(i)
    engine.close()
    engine.close()
    assert own_threads("fl-close") == 0
    assert engine.closed
    with pytest.raises(RuntimeError):
        engine.submit(0)
    with pytest.raises(RuntimeError):
        engine.next()


def test_dropping_the_engine_joins_threads():
    engine = _C.Engine([Recorder([], delay=0.05) for _ in range(2)], 4, name="fl-drop")
    assert own_threads("fl-drop") == 2
    for i in range(4):
        engine.submit(i)
    del engine
    assert own_threads("fl-drop") == 0


def test_worker_state_is_thread_local_and_persistent():
    local = threading.local()

    class Counter:
        def start(self):
            local.count = 0

        def fetch(self, request):
            local.count += 1
            return _C.JOB_DONE, local.count

        def stop(self):
            pass

    engine = _C.Engine([Counter()], 1)
    counts = []
    for i in range(5):
        engine.submit(i)
        counts.append(engine.next(5.0)[2])
    assert counts == [1, 2, 3, 4, 5]
    engine.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_forked_child_gets_a_clear_error_not_a_hang():
    engine = _C.Engine([Recorder([])], 2)
    engine.submit(1)
    engine.next(5.0)
    pid = os.fork()
    if pid == 0:  # child: the engine has no threads here
        code = 1
        try:
            engine.submit(2)
        except RuntimeError as e:
            code = 0 if "fork" in str(e) else 2
        except BaseException:
            code = 3
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0
    engine.submit(3)  # the parent's engine is untouched
    assert engine.next(5.0)[2][0] == 3
    engine.close()


def test_out_of_order_recycles_records_while_old_jobs_run():
    # A long first job keeps its record while many later ones are delivered;
    # every job must come back exactly once with its own payload.
    engine = _C.Engine([Recorder([], delay=lambda r: 0.3 if r == 0 else 0.001) for _ in range(2)],
                       4, in_order=False)
    submitted, seen = 0, []
    for _ in range(4):
        engine.submit(submitted)
        submitted += 1
    while len(seen) < 40:
        outcome, _, value = engine.next(5.0)
        seen.append(value[0])
        if submitted < 40:
            engine.submit(submitted)
            submitted += 1
    assert sorted(seen) == list(range(40))
    assert engine.next(1.0) is None
    engine.close()


def test_closing_from_its_own_worker_stops_without_joining():
    """The collector may finalise an iterator on one of its own workers (a
    cycle collected while that worker runs Python): close() there cannot
    join the calling thread, so it stops the workers and returns."""
    holder = {}
    closed_on_worker = []

    class Closer(Recorder):
        def fetch(self, request):
            closed_on_worker.append(holder["engine"].close(5.0))
            return _C.JOB_DONE, request

    engine = holder["engine"] = _C.Engine([Closer([])], 2, name="fl-self")
    engine.submit(0)
    with pytest.raises(RuntimeError, match="shut down"):
        while engine.next(5.0) is not None:
            pass
    assert closed_on_worker == [()] and engine.closed
    assert engine.close() == ()
    del holder["engine"], engine
    deadline = time.monotonic() + 10  # the worker exits on its own
    while sum(n.startswith("fl-self") for n in thread_names()) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sum(n.startswith("fl-self") for n in thread_names()) == 0
