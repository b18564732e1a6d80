"""The engine protocol: what the loader's iterator drives, whatever runs the
workers.

An engine takes batch requests and hands back their results; the iterator
(``iterators.WorkerIter``) holds torch's scheduling policy on top (which
indices, how many in flight, when to retire).  Two engines implement it:

* ``ThreadEngine``: the C engine's worker threads (``_C.Engine``,
  csrc/core/engine/engine.h), the per-batch calls going straight to C;
* ``process_engine.ProcessWorkers``: worker processes, with the same rules
  over pipes.

Both apply the same rules: requests go round-robin to the active workers
(``[0, active)``), at most ``max_in_flight`` are out, results come back in
request order when ``in_order`` (else as they finish), and a worker whose
iterable shard has ended gets no more.
"""

from typing import Protocol

__all__ = ["Engine", "ThreadEngine"]


class Engine(Protocol):
    """What an iterator calls.  Outcomes are ``_C.JOB_*``."""

    #: The workers that get new requests: ``[0, active)``; settable.
    active: int

    @property
    def in_flight(self) -> int:
        """Requests submitted and not yet delivered."""

    @property
    def closed(self) -> bool:
        """``close()`` has run."""

    @property
    def broken(self) -> bool:
        """A worker died or a result was lost: no further epoch on these
        workers (the iterator starts new ones)."""

    @property
    def workers(self) -> list:
        """The workers started: thread ``Worker`` objects, or processes."""

    def submit(self, request) -> bool:
        """Queues ``request`` for the next active worker: True; False when
        every worker has retired (the request is dropped, as torch does)."""

    def next(self, timeout=None):
        """``(outcome, worker id, value)`` for the next result, or None when
        nothing is in flight and no worker can take more; TimeoutError
        after ``timeout`` seconds."""

    def discard_in_flight(self, timeout=None) -> None:
        """Drops every request out: cancels what no worker started, waits
        (up to ``timeout`` seconds per result; TimeoutError) for the rest."""

    def reset(self) -> None:
        """A new epoch on the same workers: retired workers take requests
        again."""

    def close(self, grace) -> list:
        """Stops the workers, waiting up to ``grace`` seconds; returns those
        left running (stuck threads), if any."""

    def note_depth(self, timers) -> None:
        """Notes into ``timers`` (``_C.Timers``) the results in flight and
        ready, as the loop asks for one (``loader.stats()``)."""

    def pinned(self, address) -> bool:
        """Whether ``address`` is in memory this engine page-locked."""


class ThreadEngine:
    """``_C.Engine`` behind the protocol: the calls made per batch are the C
    engine's own methods; the rest is what C leaves to Python (the stop
    flag that interrupts a running batch between samples)."""

    broken = False  # a thread that raises delivers the error; it never dies

    def __init__(self, engine, workers, stop_flag):
        self._engine = engine
        self._stop_flag = stop_flag
        self.workers = workers
        self.submit = engine.submit
        self.next = engine.next
        self.reset = engine.reset

    @property
    def active(self):
        return self._engine.active

    @active.setter
    def active(self, value):
        self._engine.active = value

    @property
    def in_flight(self):
        return self._engine.in_flight

    @property
    def closed(self):
        return self._engine.closed

    def discard_in_flight(self, timeout=None):
        # Queued batches are cancelled; running ones stop between samples
        # (the stop flag) and are dropped.
        self._stop_flag.stopped = True
        self._engine.cancel_pending()
        while self._engine.next(timeout) is not None:
            pass
        self._stop_flag.stopped = False

    def close(self, grace):
        self._stop_flag.stopped = True
        return self._engine.close(grace)

    def note_depth(self, timers):
        """The C engine notes its depth itself, in ``next()``."""

    def pinned(self, address):
        return False  # its slots are page-locked at allocation; torch sees so
