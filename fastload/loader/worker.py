"""What runs on a worker thread: fetching a batch from a Python dataset.

A ``Worker`` belongs to one engine thread.  The engine calls ``start()`` on
that thread once, ``fetch(request)`` once per batch, and ``stop()`` as the
thread exits; each holds the GIL only while it runs.  ``fetch`` never raises:
it returns ``(outcome, value)`` with an outcome code of the engine
(``_C.JOB_DONE`` etc.), and an error travels as an ``ExceptionWrapper`` that
the main thread re-raises, as torch's workers do.
"""

import copy
import os
import random
import sys
import threading
import traceback
import weakref

import numpy as np

from .. import _C
from ..datasets.native import NativeBatches, readier, skip_reporter, source_of
from . import torch_compat as _torch_compat
from .node import format_cpus
from .collate import Convert, SlotCollate, StepIntoSlots, backend_for, output_converter
from .._torch import torch

_local = threading.local()

# The stages Python code runs, timed here (C times its own: fastload.stats).
_DATASET = _C.STAGES.index("dataset")
_COLLATE = _C.STAGES.index("collate")


class WorkerRNG:
    """A worker's own random generators, seeded as torch seeds a worker
    process's global ones.

    torch re-seeds ``random``, ``torch`` and ``numpy.random`` in each worker
    process; threads share those globals, so fastload gives each worker these
    instead: ``random_generator.random()`` here draws what ``random.random()``
    draws in torch's worker with the same id and base seed, and likewise
    ``torch_generator`` (``torch.manual_seed(seed)``) and ``numpy_generator``
    (a ``RandomState`` seeded as torch seeds ``numpy.random``).
    """

    __slots__ = ("random_generator", "torch_generator", "numpy_generator")

    def __init__(self, base_seed, worker_id):
        seed = base_seed + worker_id
        self.random_generator = random.Random(seed)
        self.torch_generator = torch.Generator().manual_seed(seed) if torch is not None else None
        self.numpy_generator = np.random.RandomState(numpy_worker_seed(base_seed, worker_id))


def numpy_worker_seed(base_seed, worker_id):
    """The 4-word seed torch gives ``numpy.random`` in worker ``worker_id``:
    a SeedSequence-style hash of (worker_id, base_seed) into 128 bits."""
    mask = 0xFFFFFFFF
    entropy = [worker_id, base_seed & mask, base_seed >> 32, 0]
    multiplier = [0x43B0D7E5]  # the hash constant evolves with every use

    def hash32(value):
        value = (value ^ multiplier[0]) & mask
        multiplier[0] = (multiplier[0] * 0x931E8875) & mask
        value = (value * multiplier[0]) & mask
        return (value ^ (value >> 16)) & mask

    def mix(x, y):
        r = ((0xCA01F9DD * x) & mask) - ((0x4973F715 * y) & mask) & mask
        return (r ^ (r >> 16)) & mask

    pool = [hash32(word) for word in entropy]
    for src in range(4):
        for dst in range(4):
            if src != dst:
                pool[dst] = mix(pool[dst], hash32(pool[src]))
    out_multiplier = 0x8B51F9DD
    state = []
    for word in pool:
        word = (word ^ out_multiplier) & mask
        out_multiplier = (out_multiplier * 0x58F38DED) & mask
        word = (word * out_multiplier) & mask
        state.append((word ^ (word >> 16)) & mask)
    return state


def _run_on(cpus, worker_id):
    """Puts this worker process on ``cpus``; OSError naming them when the
    kernel refuses."""
    try:
        os.sched_setaffinity(0, cpus)
    except OSError as e:
        raise OSError(e.errno, f"fastload: cannot run worker process {worker_id} on CPUs "
                               f"{format_cpus(cpus)}: {e.strerror}") from None


class WorkerInfo:
    """Who this worker is, as torch's ``get_worker_info()`` reports it.

    ``id`` in ``range(num_workers)``, ``seed`` = the iterator's base seed +
    ``id`` (torch's value), ``dataset`` = this worker's dataset (a process
    worker's own copy; for thread workers, a copy of an IterableDataset and
    the loader's own map-style dataset), ``rng`` = this worker's
    ``WorkerRNG``, and ``worker_method`` = "thread" or "process".
    """

    __slots__ = ("id", "num_workers", "seed", "_dataset", "rng", "worker_method")

    def __init__(self, id, num_workers, seed, dataset, rng=None, worker_method="thread"):
        object.__setattr__(self, "id", id)
        object.__setattr__(self, "num_workers", num_workers)
        object.__setattr__(self, "seed", seed)
        # A worker thread keeps its info in a thread-local, where the
        # collector cannot see it: held weakly (the loader holds the
        # dataset), it does not keep a cycle through the dataset alive.
        try:
            dataset = weakref.ref(dataset)
        except TypeError:
            dataset = _Strong(dataset)
        object.__setattr__(self, "_dataset", dataset)
        object.__setattr__(self, "rng", rng)
        object.__setattr__(self, "worker_method", worker_method)

    @property
    def dataset(self):
        return self._dataset()

    def __setattr__(self, key, value):
        raise RuntimeError(f"Cannot assign attributes to {self.__class__.__name__} objects")

    def __repr__(self):
        return (
            f"WorkerInfo(id={self.id}, num_workers={self.num_workers}, seed={self.seed}, "
            f"dataset={self.dataset!r})"
        )


class _Strong:
    """A strong reference that reads like a weak one."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value

    def __call__(self):
        return self.value


def get_worker_info():
    """The ``WorkerInfo`` of the calling worker thread, or None elsewhere."""
    return getattr(_local, "info", None)


def current_loader_token():
    """The token of the loader whose worker is running this code, or None."""
    return getattr(_local, "loader_token", None)


class KeyErrorMessage(str):
    """A KeyError's message printed as is (KeyError would repr() it)."""

    def __repr__(self):
        return str(self)


class ExceptionWrapper:
    """An exception caught in a worker, re-raised in the main thread as the
    same type with the worker's traceback in its message."""

    def __init__(self, exc_info, where):
        self.exc_type = exc_info[0]
        self.exc_msg = "".join(traceback.format_exception(*exc_info))
        self.where = where

    def reraise(self):
        if not issubclass(self.exc_type, Exception):
            # KeyboardInterrupt or SystemExit from dataset code ends a torch
            # worker *process*, which the main process reports as a failed
            # worker; it must not stop the main program in its place.
            raise RuntimeError(
                f"DataLoader worker exited unexpectedly: {self.exc_type.__name__} raised "
                f"{self.where}.\nOriginal {self.exc_msg}")
        msg = f"Caught {self.exc_type.__name__} {self.where}.\nOriginal {self.exc_msg}"
        if self.exc_type is KeyError:
            msg = KeyErrorMessage(msg)
        elif getattr(self.exc_type, "message", None):
            # Exceptions whose first argument is keyword-only "message".
            raise self.exc_type(message=msg)
        try:
            exception = self.exc_type(msg)
        except Exception:
            # The type cannot be built from a message alone.
            raise RuntimeError(msg) from None
        raise exception


class _MapFetcher:
    def __init__(self, dataset, auto_collation, collate_fn, stop_flag, native_batch, epoch,
                 batch_step=None, seed=0):
        self.batch_step = batch_step  # DataLoader(batch_transform=...) on collated batches
        self.seed = seed
        self.dataset = dataset
        self.auto_collation = auto_collation
        self.collate_fn = collate_fn
        self.stop_flag = stop_flag
        self.native_batch = native_batch
        self.epoch = epoch  # keys the random augmentation of native datasets
        self.position = None  # the sample index being read, for error messages

    def fetch(self, index, number=0):
        if self.native_batch is not None and self.auto_collation:
            # A native dataset reads and collates the whole batch in C.
            self.position = index
            batch = self.native_batch(index, epoch=self.epoch, number=number)
            self.position = None
            return batch
        stage, token = _DATASET, _C.stage_begin(_DATASET)
        try:
            data = self._samples(index)
            stage, token = _COLLATE, _C.stage_switch(_DATASET, token, _COLLATE)
            batch = self.collate_fn(data)
        finally:
            _C.stage_end(stage, token)
        if self.batch_step is not None and self.auto_collation:
            batch = self.batch_step(batch, self.seed, self.epoch, number)
        return batch

    def _samples(self, index):
        if not self.auto_collation:
            self.position = index
            return self.dataset[index]
        getitems = getattr(self.dataset, "__getitems__", None)
        if getitems:
            self.position = index
            data = getitems(index)
        else:
            data = []
            for i in index:
                if self.stop_flag.stopped:
                    raise _Stopped
                _C.yield_to_consumer()
                self.position = i
                data.append(self.dataset[i])
        self.position = None
        return data


class _IterableFetcher:
    def __init__(self, dataset, auto_collation, collate_fn, drop_last, batch_step=None, seed=0,
                 epoch=0):
        self.batch_step = batch_step
        self.seed = seed
        self.epoch = epoch
        self.dataset_iter = iter(dataset)
        self.auto_collation = auto_collation
        self.collate_fn = collate_fn
        self.drop_last = drop_last
        self.ended = False     # the dataset iterator is exhausted
        self.retired = False   # the worker has reported that (once)
        self.position = None

    def fetch(self, index, number=0):
        if self.ended:
            raise StopIteration
        stage, token = _DATASET, _C.stage_begin(_DATASET)
        try:
            data = self._samples(index)
            stage, token = _COLLATE, _C.stage_switch(_DATASET, token, _COLLATE)
            batch = self.collate_fn(data)
        finally:
            _C.stage_end(stage, token)
        if self.batch_step is not None and self.auto_collation:
            batch = self.batch_step(batch, self.seed, self.epoch, number)
        return batch

    def _samples(self, index):
        if self.auto_collation:
            data = []
            for _ in index:
                try:
                    data.append(next(self.dataset_iter))
                except StopIteration:
                    self.ended = True
                    break
            if len(data) == 0 or (self.drop_last and len(data) < len(index)):
                raise StopIteration
            return data
        return next(self.dataset_iter)


def make_fetcher(plan, stop_flag, epoch=0):
    if plan.iterable:
        return _IterableFetcher(plan.dataset, plan.auto_collation, plan.collate_fn, plan.drop_last,
                                plan.batch_transform, plan.base_seed, epoch)
    return _MapFetcher(plan.dataset, plan.auto_collation, plan.collate_fn, stop_flag,
                       plan.native_batch, epoch, plan.batch_transform, plan.base_seed)


class _Stopped(Exception):
    """The iterator is shutting down: abandon the batch."""


class StopFlag:
    """Set by the main thread on shutdown; workers check it between samples
    so a long batch does not delay the join."""

    __slots__ = ("stopped",)

    def __init__(self):
        self.stopped = False


class FetchPlan:
    """What a worker needs to fetch batches, thread or process alike:
    read-only, and picklable, so a worker process gets it as it is (forked,
    spawned or from a forkserver).  What writes into memory -- the
    collation into slots, a native source's batch function -- is made by
    ``bind`` where the worker runs, over that side's slot pool."""

    def __init__(self, dataset, iterable, auto_collation, collation, output, drop_last,
                 worker_init_fn, num_workers, base_seed, native=False, mix=None,
                 loader_token=None, batch_transform=None, datapipe=None, datapipe_seed=None,
                 world=(1, 0), cpus=None):
        self.cpus = cpus  # the CPU ids a worker process runs on (worker_affinity), or None
        self.datapipe = datapipe  # torch DataPipe: "iter" or "map" (fastload.loader.torch_compat)
        self.datapipe_seed = datapipe_seed  # an IterDataPipe's shared seed, first epoch
        self.world = world  # the loader's (world_size, rank) in torch.distributed
        self.dataset = dataset
        self.loader_token = loader_token  # marks the loader's own workers
        self.iterable = iterable
        self.auto_collation = auto_collation
        self.collation = collation  # "default", "convert" (collate.collation), or a collate_fn
        self.output = output        # "torch" or "numpy"
        self.native = native        # the dataset's native source makes whole batches
        self.mix = mix              # the MixUp/CutMix plan a native batch runs, or None
        self.batch_transform = batch_transform  # a step for Python-collated batches, or None
        self.drop_last = drop_last
        self.worker_init_fn = worker_init_fn
        self.num_workers = num_workers
        self.base_seed = base_seed
        # Made by bind():
        self.collate_fn = None    # samples -> batch
        self.native_batch = None  # (indices, epoch, number) -> batch (fastload.datasets.native)

    def bind(self, pool, converts=True, source=None):
        """A copy that collates, and makes native batches, into ``pool``.
        ``converts``: this side turns slot arrays into the output type (a
        worker process leaves that to its parent, a loader that uploads to
        the upload stage).  ``source``: the native
        source, when not the dataset's own (the device-normalised one)."""
        bound = copy.copy(self)
        backend = backend_for(self.output)
        to_output = output_converter(self.output) if converts else None
        fast = self.collation if isinstance(self.collation, str) else None
        if fast == "default":
            bound.collate_fn = SlotCollate(pool, backend, to_output)
        elif fast == "convert":
            bound.collate_fn = Convert(backend)
        else:
            bound.collate_fn = self.collation
        if self.batch_transform is not None and not converts and fast is not None:
            bound.batch_transform = StepIntoSlots(self.batch_transform, pool)
        if self.native:
            source = source if source is not None else source_of(self.dataset)
            bound.native_batch = NativeBatches(source, pool, to_output, self.base_seed,
                                               skip_reporter(self.dataset), self.mix,
                                               readier(self.dataset))
        return bound


class Worker:
    """The Python half of one engine worker thread."""

    def __init__(self, worker_id, plan, stop_flag, method="thread"):
        self.id = worker_id
        self.plan = plan
        self.stop_flag = stop_flag
        self.method = method
        self.where = f"in DataLoader worker {worker_id}"
        self.fetcher = None
        self.epoch = 0
        self.init_error = None

    def start(self):
        """Runs on the worker's thread before any job.  Returns the
        worker_init_fn's error (also delivered by the first fetch), or None:
        the engine hands it to the first native job, which calls no fetch."""
        plan = self.plan
        if plan.iterable and self.method == "thread":
            # A worker process iterates its own copy of the dataset; so does
            # a thread (worker_init_fn may narrow it, __iter__ may return it).
            plan = self.plan = own_copy(plan)
        _local.info = WorkerInfo(self.id, plan.num_workers, plan.base_seed + self.id, plan.dataset,
                                 WorkerRNG(plan.base_seed, self.id), self.method)
        _local.loader_token = plan.loader_token
        try:
            if plan.cpus is not None and self.method == "process":
                # A worker thread is put on them by the engine as it starts.
                _run_on(plan.cpus, self.id)
            # torch's DataPipes: an IterDataPipe's random datapipes seeded by
            # the epoch's shared seed, then this worker's shard taken, before
            # worker_init_fn runs -- where the dataset is the worker's own (a
            # thread's map-style dataset is shared by all).
            if plan.datapipe == "iter":
                _torch_compat.seed_datapipe(plan.dataset, plan.datapipe_seed)
            if plan.datapipe is not None and (plan.iterable or self.method == "process"):
                _torch_compat.shard_datapipe(plan.dataset, plan.num_workers, self.id,
                                             plan.world)
            if plan.worker_init_fn is not None:
                plan.worker_init_fn(self.id)
            self.fetcher = make_fetcher(plan, self.stop_flag)
        except BaseException:
            self.init_error = ExceptionWrapper(sys.exc_info(), self.where)
        return self.init_error

    def fetch(self, request):
        epoch, index = request[0], request[1]
        number = request[2] if len(request) > 2 else 0  # the batch's place in its epoch
        if self.init_error is not None:
            error, self.init_error = self.init_error, None
            return _C.JOB_DONE, error
        try:
            if epoch != self.epoch or self.fetcher is None:
                # A new epoch on persistent workers: a fresh pass over the data,
                # an IterDataPipe's seeded by the request's shared seed.
                self.epoch = epoch
                if self.plan.datapipe == "iter" and len(request) > 3:
                    _torch_compat.seed_datapipe(self.plan.dataset, request[3])
                self.fetcher = make_fetcher(self.plan, self.stop_flag, epoch)
            return _C.JOB_DONE, self.fetcher.fetch(index, number)
        except _Stopped:
            return _C.JOB_SKIPPED, None
        except StopIteration:
            if not self.plan.iterable:
                return _C.JOB_DONE, ExceptionWrapper(sys.exc_info(), self.where)
            # The first StopIteration retires this worker; later jobs queued
            # to it produce nothing, like torch's worker after iteration end.
            if self.fetcher.retired:
                return _C.JOB_SKIPPED, None
            self.fetcher.retired = True
            return _C.JOB_RETIRE, None
        except BaseException:
            position = getattr(self.fetcher, "position", None)
            if hasattr(position, "tolist"):  # a native batch's index array
                position = position.tolist()
            where = self.where if position is None else f"{self.where} (sample index {position!r})"
            return _C.JOB_DONE, ExceptionWrapper(sys.exc_info(), where)

    def stop(self):
        self.fetcher = None
        _local.info = None
        _local.loader_token = None


def own_copy(plan):
    """The plan with a deep copy of its dataset, as a forked worker has.
    A dataset that cannot be deep-copied (it holds a lock or an open file)
    is copied shallowly: its attributes are then its own, their contents
    shared."""
    dataset = _torch_compat.copy_datapipe(plan.dataset)
    if dataset is None:
        try:
            dataset = copy.deepcopy(plan.dataset)
        except Exception:
            dataset = copy.copy(plan.dataset)
    mine = copy.copy(plan)
    mine.dataset = dataset
    return mine
