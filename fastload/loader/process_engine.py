"""Process workers: the user's dataset in worker processes, as torch runs it.

A worker process owns a copy of the dataset, its own global random state
(seeded as torch seeds it), and its own thread-bound objects, exactly as
torch's worker does; it fetches batches with the same code the thread
workers run (``_worker.Worker``).  What differs from torch is the hand-off.
torch's worker collates into a fresh shared-memory file per tensor per
batch, pickles its handle, and the parent maps it again for every batch.
fastload's worker collates (C collation or a native dataset's batch
function) into slots of its own ``SlotPool(memory="shared")``: each slot is
a region of a memfd (an arena: small slots share one, a large slot has its
own; csrc/core/memory/shm.h) the parent maps once, when it first sees it, and wraps
as NumPy or torch without a copy.  The batch's arrays keep their slot as the
thread engine's arrays keep theirs: their NumPy base is a C owner
(``_C.MappedSlotOwner``, the sibling of ``SlotOwner`` in
csrc/bind/memory/slot_pool.c) whose dealloc, when the parent drops the last
of them, puts the slot's id on its channel's C return list
(``_C.SlotReturns``); the id goes back to its worker with the next request,
and the worker reuses it.  No Python code runs per slot.  So batches the loop
keeps alive cost memory, and descriptors only per arena.

Messages, per worker, over one duplex pipe (a Unix socket pair):

* parent -> worker: ``(task, (epoch, index, batch number), freed_slot_ids)``, or None to
  stop;
* worker -> parent: ``(task, outcome, new_arenas, dropped_arena_ids,
  report, times, payload)``, then the descriptors of the new arenas
  (SCM_RIGHTS; ``new_arenas`` lists ``(arena id, bytes)``).
  ``report`` is what the worker's dataset copy recorded that the user reads
  on the loader's dataset (fastload's image datasets: skipped files), from
  ``dataset._worker_report()``, merged there by ``_merge_worker_report``.
  ``payload`` is the batch pickled with each shared-slot array replaced by a
  reference (arena id, slot id, the slot's offset and size in the arena,
  the array's offset in the slot, dtype, shape, strides); arrays and tensors
  outside slots travel as torch's workers send them (ForkingPickler).

The parent's scheduling is torch's: round-robin over the live workers, at
most ``num_workers * prefetch_factor`` tasks out, one new task per result,
and an iterable worker that reports its end gets no more tasks.  Like the
thread engine, only workers ``[0, active)`` get new tasks (the autotuner
moves that bound); a worker process starts when it first becomes active, so
workers the autotuner never uses cost nothing.  The parent waits on one
long-lived ``select.poll`` object holding the pipe and the process sentinel
of each worker with tasks out, so a dead worker is seen as soon as the loop
waits for it, and nothing is built per wait.

With ``pin_memory=True`` and fastload's CUDA driver, the parent page-locks
each arena mapping in place, whole, when it first maps it (``PageLocking``),
so batches need no pinned copy; a released slot goes back to its worker only
once the copies queued from it before its release are done (its own fence).
"""

import array
import collections
import copyreg
import ctypes
import errno
import importlib
import io
import math
import multiprocessing
import os
import pickle
import random
import select
import signal
import mmap
import socket
import sys
import time
import warnings
import weakref
from multiprocessing.reduction import ForkingPickler, sendfds

import numpy as np

from .. import _C
from ..observe import stats
from .._torch import torch
from .worker import (
    ExceptionWrapper,
    StopFlag,
    Worker,
    get_worker_info,
    numpy_worker_seed,
)
from .torch_compat import route_torch_worker_info

# How long a worker waits for a request before checking that its parent is
# still alive (a parent killed by SIGKILL cannot tell it to stop).
_PARENT_CHECK_SECONDS = 1.0
# Freed heap memory a worker process keeps for its next batches.
_KEPT_FREE_BYTES = 128 << 20
# How long shutdown waits for the workers to exit by themselves (after
# their current batch) before the rest are terminated.
_JOIN_SECONDS = 5.0

# A mapping page-locked in place by the CUDA driver (csrc/bind/cuda/host_register.c).
HostRegistration = _C.host_registration_type()


# ------------------------------------------------------------ worker side


class _SlotPickler(ForkingPickler):
    """Pickles a batch with every shared-slot array as a reference to its
    slot; records the slots the parent has not seen and keeps each slot's
    arrays alive in ``held`` until the parent frees it."""

    def __init__(self, file, announced, new, held):
        super().__init__(file, pickle.HIGHEST_PROTOCOL)
        self.announced = announced
        self.new = new
        self.held = held

    def persistent_id(self, obj):
        if type(obj) is not np.ndarray:
            return None
        info = _C.shared_slot(obj)
        if info is None:
            return None
        fd, arena_id, arena_bytes, slot_id, slot_offset, slot_bytes, offset = info
        if arena_id not in self.announced:
            self.announced.add(arena_id)
            self.new.append((arena_id, fd, arena_bytes))
        self.held[slot_id].append(obj)
        return (arena_id, slot_id, slot_offset, slot_bytes, offset, obj.dtype, obj.shape,
                obj.strides)


def _keep_freed_memory():
    """A worker frees and reallocates batch-sized memory over and over (its
    samples live until they are collated).  glibc hands large freed blocks
    back to the kernel at once, so every batch would fault them in again;
    a worker keeps up to _KEPT_FREE_BYTES of them instead.  (Not done in the
    user's process, whose memory is the user's business.)"""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc
        return
    m_trim_threshold, m_mmap_threshold = -1, -3  # glibc's <malloc.h>
    mallopt(m_mmap_threshold, 32 << 20)  # glibc's largest; also ends its sliding threshold
    mallopt(m_trim_threshold, _KEPT_FREE_BYTES)


def _seed_globals(base_seed, worker_id):
    """Seeds the process's global generators as torch seeds its workers'."""
    seed = base_seed + worker_id
    random.seed(seed)
    if torch is not None:
        torch.manual_seed(seed)
    np.random.seed(numpy_worker_seed(base_seed, worker_id))


def _set_torch_worker_info(worker_id, plan, dataset):
    """torch's own get_worker_info() answers too, even when a dataset bound
    it before fastload could route it."""
    if torch is None:
        return
    import torch.utils.data._utils.worker as torch_worker

    torch_worker._worker_info = torch_worker.WorkerInfo(
        id=worker_id, num_workers=plan.num_workers, seed=plan.base_seed + worker_id,
        dataset=dataset)


def worker_main(conn, plan, worker_id, parent_pid, max_free_slots):
    """The body of worker process ``worker_id``: ``plan`` (a FetchPlan)
    bound to its own shared slots, at most ``max_free_slots`` kept free."""
    # Ctrl-C reaches the whole process group: the parent handles it and
    # stops the workers, which must not die half-way through a message.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _keep_freed_memory()
    if torch is not None:
        # torch's tensor reductions for ForkingPickler, as its workers use.
        importlib.import_module("torch.multiprocessing")
        torch.set_num_threads(1)
    _seed_globals(plan.base_seed, worker_id)
    _set_torch_worker_info(worker_id, plan, plan.dataset)
    route_torch_worker_info(get_worker_info)
    pool = _C.SlotPool(max_free=max_free_slots, memory="shared")
    try:
        # Batches land in this worker's shared slots, unconverted: the
        # parent converts them.
        worker = Worker(worker_id, plan.bind(pool, converts=False), StopFlag(),
                        method="process")
    except Exception:
        # The dataset's source cannot be opened here (a file replaced since
        # a spawned worker's plan was made, say): each job raises it.
        error = ExceptionWrapper(sys.exc_info(), f"in DataLoader worker {worker_id}")
        worker = _FailedWorker(error)
    report = getattr(plan.dataset, "_worker_report", None)
    sock = socket.socket(fileno=os.dup(conn.fileno()))
    announced = set()
    held = collections.defaultdict(list)
    timers = _C.Timers(1)  # this process's work, sent to the parent with each batch
    timers.bind(0)
    try:
        worker.start()
        idle_since = time.perf_counter_ns()
        while True:
            if not conn.poll(_PARENT_CHECK_SECONDS):
                if os.getppid() != parent_pid:
                    return
                continue
            message = conn.recv()
            if message is None:
                return
            task, request, freed = message
            for slot_id in freed:
                held.pop(slot_id, None)
            started, cpu = time.perf_counter_ns(), time.thread_time_ns()
            outcome, value = worker.fetch(request)
            times = _job_times(timers, started - idle_since, started, cpu)
            _send_result(conn, sock, task, outcome, value, report() if report else None,
                         times, announced, held)
            idle_since = time.perf_counter_ns()
            del value
    except (EOFError, BrokenPipeError, ConnectionResetError, KeyboardInterrupt):
        return  # the parent is gone or stopping: exit quietly, as torch's workers do
    finally:
        timers.unbind()
        worker.stop()
        sock.close()


class _FailedWorker:
    """A worker whose fetch plan could not be made: every job delivers that
    error, with the worker's traceback, as a failed batch."""

    def __init__(self, error):
        self.error = error

    def start(self):
        return self.error

    def fetch(self, request):
        return _C.JOB_DONE, self.error

    def stop(self):
        pass


def _job_times(timers, idle_ns, started, cpu):
    """This process's times for the job that started at `started` (with
    `cpu` ns of CPU used by then), after idle_ns waiting for it: a row
    tuple for the parent's ``Timers.add``."""
    times = list(timers.take(0))
    times[stats.BUSY] += time.perf_counter_ns() - started
    times[stats.CPU] += time.thread_time_ns() - cpu
    times[stats.IDLE] += idle_ns
    times[stats.JOBS] += 1
    return tuple(times)


def _send_result(conn, sock, task, outcome, value, report, times, announced, held):
    new = []
    buffer = io.BytesIO()
    try:
        _SlotPickler(buffer, announced, new, held).dump(value)
    except Exception:
        for arena_id, _fd, _bytes in new:
            announced.discard(arena_id)
        new.clear()
        buffer = io.BytesIO()
        error = ExceptionWrapper(sys.exc_info(), "while sending a batch from a DataLoader worker")
        ForkingPickler(buffer, pickle.HIGHEST_PROTOCOL).dump(error)
    dropped = _C.take_freed_shared_slots()
    for arena_id in dropped:
        announced.discard(arena_id)
    arenas = [(arena_id, nbytes) for arena_id, _fd, nbytes in new]
    conn.send((task, outcome, arenas, dropped, report, times, buffer.getvalue()))
    if new:
        _send_fds(sock, [fd for _arena_id, fd, _bytes in new])


def _send_fds(sock, fds):
    """Sends the descriptors of a result's new slots, right after its
    message.  A module-level function so that a test can make a forked
    worker die at exactly this point (tests/test_worker_isolation.py)."""
    sendfds(sock, fds)


# ------------------------------------------------------------ parent side


class PageLocking:
    """How the parent page-locks the slots it maps when the loader pins
    (pin_memory=True with fastload's CUDA driver).

    Each mapping (an arena) is registered with the driver once, when it is
    first mapped, and stays registered while its worker reuses its slots.
    The whole mapping is registered, so the driver faults in and locks all of
    it: a small-slot arena costs its full 32 MiB of page-locked shared memory
    (docs/design.md, "Pinned batches", says why not per slot).  The
    registration (a ``HostRegistration``) holds the mapping and the batch
    arrays hold the registration, so it is unregistered exactly when the
    parent has let the mapping go (the worker dropped the slot, the worker
    stopped) and no array is left over it, and just before it is unmapped.

    A batch the loop drops may still be read by a non-blocking copy queued on
    the GPU, so its slot's owner records the slot's fence as it dies (an
    event of its own, from the registration's pool, in C) and the slot is
    returned to its worker only once that fence is done (``_Channel.send``).  A mapping the driver refuses
    stays pageable, and the first refusal is reported once.
    """

    def __init__(self, device, max_waiting):
        self.device = device            # whose primary context registers (portable)
        self.max_waiting = max_waiting  # per worker: released slots waiting on fences
        self.failure = None             # the first refusal, until reported
        self.reported = False

    def register(self, mapping, worker_id):
        """A HostRegistration of `mapping`, or `mapping` itself when the driver
        refuses it."""
        try:
            return HostRegistration(mapping, self.device)
        except (RuntimeError, MemoryError) as error:
            if self.failure is None:
                self.failure = f"a batch slot of worker {worker_id}: {error}"
            return mapping

    def report(self):
        if self.failure is not None and not self.reported:
            self.reported = True
            warnings.warn(
                f"pin_memory=True: fastload could not page-lock {self.failure}; batches in "
                "such slots stay in pageable memory (torch pins them, when it has an "
                "accelerator)", RuntimeWarning, stacklevel=4)


def _out_of_files(error):
    """Whether `error` (an OSError) means the descriptors ran out."""
    return isinstance(error, OSError) and error.errno in (errno.EMFILE, errno.ENFILE)


def _too_many_files(doing, held):
    """The RuntimeError for descriptors run out in this process while
    `doing`, with `held` batch slots of the workers alive here (the text is
    the worker's too: _C.too_many_files_message)."""
    return RuntimeError(_C.too_many_files_message(
        doing, f"{held} batch slots from the workers are held here (batches the loop keeps "
        "alive, or in flight)"))


_FD_BYTES = array.array("i").itemsize


def _receive_fds(sock, count, worker_id):
    """The `count` descriptors that follow a result's message
    (multiprocessing's sendfds: one byte, count % 256, with SCM_RIGHTS).
    A control message the kernel truncated (MSG_CTRUNC: this process is
    out of descriptors) or a wrong count raises instead of giving a batch
    over the wrong memory.  EOFError: the worker is gone."""
    msg, ancdata, flags, _addr = sock.recvmsg(1, socket.CMSG_SPACE(count * _FD_BYTES))
    if not msg and not ancdata:
        raise EOFError
    fds = array.array("i")
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[:len(data) - len(data) % _FD_BYTES])
    if flags & socket.MSG_CTRUNC or len(fds) != count or msg[0] != count % 256:
        for fd in fds:
            os.close(fd)
        if flags & socket.MSG_CTRUNC:
            return None
        raise RuntimeError(f"fastload: DataLoader worker {worker_id} sent {len(fds)} slot "
                           f"descriptors with a batch that needs {count}")
    return list(fds)


class _Channel:
    """The parent's end of one worker: its process, pipe, the arenas it has
    mapped from that worker, and the return list of their slots
    (``_C.SlotReturns``: the ids of slots whose last array died, handed back
    with the next request)."""

    def __init__(self, context, worker_id, plan, max_free_slots, page_locking=None):
        self.id = worker_id
        self.page_locking = page_locking  # PageLocking, or None
        doing = f"to start DataLoader worker process {worker_id}"
        try:
            parent_end, child_end = context.Pipe(duplex=True)
        except OSError as error:
            if _out_of_files(error):
                raise _too_many_files(doing, 0) from error
            raise
        self.conn = parent_end
        self.process = context.Process(
            target=worker_main, args=(child_end, plan, worker_id, os.getpid(), max_free_slots),
            name=f"fastload-p{worker_id}", daemon=True)
        try:
            self.process.start()
            self.sock = socket.socket(fileno=os.dup(parent_end.fileno()))
            self.fd = parent_end.fileno()        # the pipe, as ProcessWorkers polls it
            self.sentinel = self.process.sentinel  # ready once the worker has exited
        except Exception as error:
            if self.process.pid is not None:
                self.process.kill()
                self.process.join()
            parent_end.close()
            if _out_of_files(error):
                raise _too_many_files(doing, 0) from error
            if hasattr(error, "add_note"):
                error.add_note(_unpicklable_parts(plan, context))
            raise
        finally:
            child_end.close()
        self.maps = {}                       # arena id -> mmap (or HostRegistration of it)
        self.locked = {}                     # arena id -> (start, end) of page-locked ones
        self.returns = _C.SlotReturns()      # the slots released here, for the worker
        # Page-locked slots whose fence is pending that may wait for a later
        # request (_returnable).
        self.max_waiting = sys.maxsize if page_locking is None else page_locking.max_waiting
        self.outstanding = 0                 # tasks sent and not answered
        self.live = True                     # False once its iterable ended
        self.closed = False                  # close() ran: slots go back to no one
        self._buffer = io.BytesIO()          # the requests' pickler and its buffer,
        self._pickler = None                 # kept (_pickle)
        self._reducers = None                # the reducer tables the pickler copied

    @property
    def held(self):
        """Slots with live arrays here (for messages)."""
        return self.returns.held

    @property
    def freed(self):
        """Ids of the slots released since the last request, oldest first."""
        return self.returns.freed

    @property
    def fenced(self):
        """Ids of released page-locked slots kept at the last request: their
        fence was pending."""
        return self.returns.fenced

    @property
    def fence_of(self):
        """{slot id: its HostRegistration} of the released page-locked slots
        not yet handed back."""
        return self.returns.fence_of

    def send(self, task, request):
        data = self._pickle((task, request, self._returnable()))
        try:
            self.conn.send_bytes(data)
        except OSError:
            self.process.join(_JOIN_SECONDS)
            raise RuntimeError(self.death()) from None
        self.outstanding += 1

    def _pickle(self, message):
        """`message` pickled as ``Connection.send`` pickles it (ForkingPickler,
        default protocol), by one pickler kept for the channel: making a
        ForkingPickler copies the reducer tables, most of a request's cost.
        It is made again when reducers were registered since (torch registers
        its own as torch.multiprocessing is imported)."""
        reducers = len(ForkingPickler._extra_reducers) + len(copyreg.dispatch_table)
        if reducers != self._reducers:
            self._pickler = ForkingPickler(self._buffer)
            self._reducers = reducers
        buffer, pickler = self._buffer, self._pickler
        buffer.seek(0)
        buffer.truncate()
        try:
            pickler.dump(message)
        finally:
            pickler.clear_memo()  # keeps nothing of the message alive
        return buffer.getvalue()

    def _returnable(self):
        """The released slot ids to hand back with the next request, taken
        off the return list.  A page-locked slot whose fence is pending may
        still be read by a queued copy: its id waits for a later request, and
        the worker fills another slot meanwhile.  Only past `max_waiting`
        such ids is the oldest waited for here, so a GPU far behind cannot
        grow the worker's pool without bound (SlotReturns.take)."""
        return self.returns.take(self.max_waiting)

    def death(self):
        return (f"DataLoader worker (pid {self.process.pid}) {_describe_exit(self.process)}. "
                "See the worker's output above for its error, if any.")

    def receive(self, to_output, on_report, on_times):
        # Every read of the channel, the descriptors' included: a worker that
        # dies between a result's message and its descriptors (SIGKILL, the
        # OOM killer) is reported as dead, by pid and signal.
        try:
            task, outcome, arenas, dropped, report, times, payload = self.conn.recv()
            fds = _receive_fds(self.sock, len(arenas), self.id) if arenas else []
        except (EOFError, OSError):
            self.process.join(_JOIN_SECONDS)
            raise RuntimeError(self.death()) from None
        if fds is None:
            raise _too_many_files(f"to receive a batch's shared memory from DataLoader worker "
                                  f"{self.id} (its descriptor was dropped: MSG_CTRUNC)",
                                  self.held)
        self.outstanding -= 1
        for arena_id in dropped:
            # Arrays over it, if any, keep the mapping (and its registration).
            self.maps.pop(arena_id, None)
            self.locked.pop(arena_id, None)
        for index, ((arena_id, nbytes), fd) in enumerate(zip(arenas, fds)):
            try:
                mapping = mmap.mmap(fd, nbytes)
            except OSError as error:
                for other in fds[index + 1:]:
                    os.close(other)
                if _out_of_files(error):
                    raise _too_many_files(f"to map a batch's shared memory from DataLoader "
                                          f"worker {self.id}", self.held) from error
                raise
            finally:
                os.close(fd)
            if self.page_locking is not None:
                mapping = self.page_locking.register(mapping, self.id)
                if type(mapping) is HostRegistration:
                    self.locked[arena_id] = (mapping.address, mapping.address + nbytes)
            self.maps[arena_id] = mapping
        if report is not None:
            on_report(report)
        if on_times is not None:
            on_times(self.id, times)
        value = _SlotUnpickler(io.BytesIO(payload), self, to_output).load()
        return task, outcome, value

    def ask_to_stop(self):
        try:
            self.conn.send(None)
        except (OSError, ValueError):
            pass  # already gone

    def close(self, deadline):
        """Waits for the worker until `deadline` (it was asked to stop), then
        terminates it: a worker stuck in dataset code must not hold up the
        program's exit."""
        self.process.join(max(0.0, deadline - time.monotonic()))
        if self.process.is_alive():
            self.process.terminate()
            self.process.join()
        self.conn.close()
        self.sock.close()
        # Live batches keep their own mappings (their slots' owners hold
        # them); the others are unregistered (after their fences) and
        # unmapped here.  Live batches' owners keep the return list, closed
        # now: their slots go back to no one.
        self.closed = True
        self.locked.clear()
        self.returns.close()
        self.maps.clear()


class _SlotUnpickler(pickle.Unpickler):
    """Rebuilds a batch: each slot reference becomes an array over the
    parent's mapping of that slot (through ``to_output``), and the slot goes
    back to the worker when the last array over it is gone."""

    def __init__(self, file, channel, to_output):
        super().__init__(file)
        self.returns = channel.returns
        self.maps = channel.maps
        self.to_output = to_output
        self.owners = {}

    def persistent_load(self, pid):
        arena_id, slot_id, slot_offset, slot_bytes, offset, dtype, shape, strides = pid
        owner = self.owners.get(slot_id)
        if owner is None:
            # One owner per slot per batch, the NumPy base of every array of
            # the batch over that slot (its region of the arena the worker
            # carved it from): it dies with the last of them, and its dealloc
            # hands the slot back (fenced first when page-locked).
            owner = self.owners[slot_id] = self.returns.own(
                self.maps[arena_id], slot_id, slot_offset, slot_bytes)
        array = owner.array(offset, dtype, shape, strides)
        return array if self.to_output is None else self.to_output(array)


def _unpicklable_parts(plan, context):
    """Says which part of the loader a spawned worker could not receive."""
    collate_fn = None if isinstance(plan.collation, str) else plan.collation
    parts = [("the dataset", plan.dataset), ("collate_fn", collate_fn),
             ("worker_init_fn", plan.worker_init_fn)]
    parts += [(f"dataset attribute {name!r}", value)
              for name, value in getattr(plan.dataset, "__dict__", {}).items()]
    bad = []
    for what, value in parts:
        try:
            ForkingPickler.dumps(value)
        except Exception:
            bad.append(what)
    method = context.get_start_method()
    found = ", ".join(bad) if bad else "an argument"
    return (f"fastload: a '{method}' worker process receives the loader's dataset, collate_fn "
            f"and worker_init_fn by pickling; {found} cannot be pickled.  Define them at module "
            "level, or use the 'fork' start method or worker_mode='thread'.")


def _describe_exit(process):
    code = process.exitcode
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = str(-code)
        return f"is killed by signal: {name}"
    return f"exited unexpectedly with exit code {code}"


class ProcessWorkers:
    """A loader iterator's worker processes and torch's scheduling over them.

    An ``engine.Engine``: the iterator drives it as it drives the thread
    engine.
    """

    def __init__(self, plan, num_workers, max_in_flight, in_order, context, to_output,
                 on_report=None, page_locking=None, active=None, on_times=None):
        self.on_report = on_report  # takes a worker's report (see the module doc)
        self.on_times = on_times    # takes (worker id, a job's times), see fastload.stats
        self.page_locking = page_locking  # PageLocking, or None
        self.max_in_flight = max_in_flight
        self.in_order = in_order
        self.to_output = to_output
        self.num_workers = num_workers
        self._plan = plan
        self._context = context
        self.channels = []  # the workers started so far: ids 0..len-1
        # The pipes and sentinels of the workers with tasks out, polled by
        # one long-lived poll object (registered as a worker's first task
        # goes out, unregistered as its last answer comes in).
        self._poller = select.poll()
        self._watched = {}  # fd -> (channel, whether it is the pipe, not the sentinel)
        self._active = 0
        self.closed = False
        self.broken = False  # a worker died or a result was lost: no other epoch here
        self.failure = None  # what broke them while receiving, for the next next()
        self._creator_pid = os.getpid()  # a forked child's copy must not stop them
        self._finalizer = weakref.finalize(self, _close_channels, self.channels,
                                           self._creator_pid)
        self.reset()
        try:
            self.active = num_workers if active is None else active
        except BaseException:
            self.close()
            raise

    @property
    def active(self):
        """Only workers ``[0, active)`` get new tasks (the thread engine's
        rule); tasks already sent to a worker beyond it are still answered
        and delivered in their turn."""
        return self._active

    @active.setter
    def active(self, active):
        if not 1 <= active <= self.num_workers:
            raise ValueError(f"active must be in 1..{self.num_workers} (num_workers), "
                             f"got {active}")
        # Started on first activation (the plan's worker count, which
        # get_worker_info() reports, is the full num_workers).
        while len(self.channels) < active:
            self.channels.append(
                _Channel(self._context, len(self.channels), self._plan,
                         self.max_in_flight + 2, self.page_locking))
        self._active = active

    def reset(self):
        """A new epoch: the round-robin restarts at worker 0 and every
        worker is live again.  Nothing may be in flight."""
        self.sent = 0          # tasks sent this epoch
        self.delivered = 0     # in order: the next task to deliver
        self.results = {}      # task -> (worker id, outcome, value), received early
        self.owner = {}        # task -> worker id, for tasks not yet answered
        self.cursor = 0        # the next worker the round-robin considers
        for channel in self.channels:
            channel.live = True

    @property
    def in_flight(self):
        return sum(channel.outstanding for channel in self.channels) + len(self.results)

    def depth(self):
        """(in_flight, ready, deliverable, idle_at_cap) as the loop asks
        (loader.stats(); fl_engine_depth is the thread Engine's twin): the
        results received, whether the next one to deliver is among them or
        waits unread in its worker's pipe, and, when it is not, whether a
        live worker has nothing to do only because max_in_flight tasks are
        out."""
        in_flight = self.in_flight
        # A result the loop has not pulled from its pipe yet (it finished
        # while the loop was busy) is as deliverable as one pulled.
        if self.in_order:
            deliverable = self.delivered in self.results
            if not deliverable and self.delivered in self.owner:
                deliverable = self.channels[self.owner[self.delivered]] in self._pipes_ready()
        else:
            deliverable = bool(self.results) or bool(self._pipes_ready())
        idle_at_cap = (not deliverable and in_flight >= self.max_in_flight
                       and any(c.live and c.outstanding == 0
                               for c in self.channels[:self._active]))
        return in_flight, len(self.results), deliverable, idle_at_cap

    def submit(self, request):
        """Sends `request` to the next live active worker; False when none is."""
        candidates = self.channels[:self._active]
        live = sum(channel.live for channel in candidates)
        if live == 0:
            return False
        for _ in range(len(candidates)):
            if self.cursor >= len(candidates):  # the bound shrank below the cursor
                self.cursor = 0
            channel = candidates[self.cursor]
            self.cursor += 1
            if not channel.live:
                continue
            if self.in_order or channel.outstanding < self.max_in_flight // live:
                break
        else:
            return False
        try:
            channel.send(self.sent, request)
        except RuntimeError:
            self.broken = True
            raise
        if channel.outstanding == 1:
            self._watch(channel)
        self.owner[self.sent] = channel.id
        self.sent += 1
        return True

    def next(self, timeout=None):
        """The next result as ``(outcome, worker id, value)``, or None when
        nothing is in flight.  Raises TimeoutError after `timeout` seconds,
        RuntimeError when a worker died."""
        if self.failure is not None:
            raise RuntimeError(
                "fastload: the DataLoader's worker processes cannot deliver the rest of this "
                f"epoch after an earlier error: {self.failure}")
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self.in_order:
                if self.delivered in self.results:
                    result = self.results.pop(self.delivered)
                    self.delivered += 1
                    return result
            elif self.results:
                return self.results.pop(next(iter(self.results)))
            if not self.owner:
                return None
            self._receive(deadline)

    def _watch(self, channel):
        for fd, pipe in ((channel.fd, True), (channel.sentinel, False)):
            self._poller.register(fd, select.POLLIN)
            self._watched[fd] = (channel, pipe)

    def _unwatch(self, channel):
        for fd in (channel.fd, channel.sentinel):
            self._poller.unregister(fd)
            del self._watched[fd]

    def _pipes_ready(self):
        """The channels with tasks out whose pipe holds a result (or the
        worker's end) now."""
        watched = self._watched
        return [watched[fd][0] for fd, _ in self._poller.poll(0) if watched[fd][1]]

    def _receive(self, deadline):
        if deadline is None:
            events = self._poller.poll()
        else:
            while True:  # in ms, rounded up as multiprocessing.connection.wait rounds it
                events = self._poller.poll(
                    math.ceil(max(0.0, deadline - time.monotonic()) * 1e3))
                if events:
                    break
                if time.monotonic() >= deadline:
                    raise TimeoutError
        try:
            self._take(events)
        except BaseException as error:
            # Whatever failed (a dead worker, a mapping or an unpickling
            # refused), a message may have been read whose task is still
            # owned: waiting for its answer again would wait forever.  The
            # workers are broken: next() raises, and a new epoch starts
            # fresh ones.
            self.broken = True
            self.failure = f"{type(error).__name__}: {error}"
            raise
        if self.page_locking is not None:
            self.page_locking.report()  # after _take: a warning turned error loses nothing

    def _take(self, events):
        ready = {}  # channel id -> whether its pipe is readable (else its worker ended)
        for fd, _ in events:
            channel, pipe = self._watched[fd]
            ready[channel.id] = ready.get(channel.id, False) or pipe
        for channel in self.channels:  # in worker order
            if channel.id not in ready:
                continue
            # A worker that ended may have written a result first.
            if ready[channel.id] or _readable(channel):
                task, outcome, value = channel.receive(self.to_output, self.on_report,
                                                       self.on_times)
                del self.owner[task]
                if channel.outstanding == 0:
                    self._unwatch(channel)
                if outcome == _C.JOB_RETIRE:
                    channel.live = False
                self.results[task] = (outcome, channel.id, value)
            else:
                channel.process.join()
                raise RuntimeError(channel.death())

    @property
    def workers(self):
        """The worker processes started (torch's ``_workers``)."""
        return [channel.process for channel in self.channels]

    def note_depth(self, timers):
        timers.note_depth(*self.depth())

    def pinned(self, address):
        """Whether `address` lies in a slot mapping page-locked by this parent."""
        for channel in self.channels:
            for start, end in channel.locked.values():
                if start <= address < end:
                    return True
        return False

    def discard_in_flight(self, timeout=None):
        """Waits for every task still out and drops its result."""
        while self.next(timeout) is not None:
            pass

    def close(self, grace=_JOIN_SECONDS):
        """Stops the workers: each finishes its batch, or is terminated after
        `grace` seconds.  Returns the workers left running: none (the thread
        engine's close returns its stuck threads)."""
        self.closed = True
        self._poller = select.poll()  # the channels' descriptors close below
        self._watched = {}
        finalizer = getattr(self, "_finalizer", None)
        if finalizer is not None and finalizer.alive:
            finalizer.detach()
        _close_channels(self.channels, getattr(self, "_creator_pid", os.getpid()), grace)
        return ()


def _close_channels(channels, creator_pid, grace=_JOIN_SECONDS):
    if os.getpid() != creator_pid:
        # A forked child's copy: the workers are its parent's, not to be
        # stopped from here.  Only the inherited descriptors go.
        for channel in channels:
            channel.conn.close()
            channel.sock.close()
        channels.clear()
        return
    for channel in channels:
        channel.ask_to_stop()
    deadline = time.monotonic() + grace
    for channel in channels:
        channel.close(deadline)
    channels.clear()


def _readable(channel):
    """Whether a result (or the worker's end) waits in `channel`'s pipe."""
    try:
        return channel.conn.poll()
    except (OSError, ValueError):
        return False


def default_context():
    """torch's default: the multiprocessing module's default start method."""
    return multiprocessing.get_context()
