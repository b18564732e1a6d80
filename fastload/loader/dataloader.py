"""fastload.DataLoader: torch's DataLoader interface over fastload's engine.

Arguments, validation, length rules, sampling, collation and error
reporting follow torch 2.13; what differs is the engine.  Workers are C
threads (``_C.Engine``) that take the GIL only to call the dataset and the
collate function, or worker processes (``_process.ProcessWorkers``) that
collate into shared slots; default collation stacks NumPy-compatible samples
into reusable page-aligned buffers with the GIL released (``_C.collate``).

The main-thread scheduling mirrors torch's multi-process iterator: batches
go to workers round-robin, at most ``num_workers * prefetch_factor`` are in
flight, one new batch is requested per batch delivered, and a worker whose
iterable shard ends stops receiving work.  So the same samplers and
generators give the same batches in the same order.
"""

import atexit
import collections
import multiprocessing
import os
import re
import threading
import time
import uuid
import warnings
import weakref
from typing import Generic, TypeVar

from .. import _C, cuda
from ..datasets import native as _native
from ..observe import profiler
from ..transforms import batch as _batch_transform
from . import autotune as _autotune, process_engine as _process, resume as _resume
from ..observe.stats import ConsumerClock, LoaderStats, LoaderTimers, clock_ns
from .._random import draw_seed
from .upload import DeviceIter, Pump
from .._torch import torch
from .worker import (
    ExceptionWrapper,
    FetchPlan,
    StopFlag,
    Worker,
    current_loader_token,
    make_fetcher,
)
from .collate import (
    TORCH,
    backend_for,
    collate,
    convert,
    default_collate,
    default_convert,
)
from ..datasets.base import is_iterable_dataset
from .sampler import BatchSampler, RandomSampler, SequentialSampler
from . import torch_compat as _torch_compat

__all__ = ["DataLoader"]

_OUTPUTS = ("auto", "torch", "numpy")
_WORKER_MODES = ("auto", "thread", "process")
# The thread engine's limit, which process workers share (one scheduling).
_MAX_WORKERS = 1024
_INT32_MAX = 2**31 - 1
_FROZEN_ATTRS = ("batch_size", "batch_sampler", "sampler", "drop_last", "dataset", "persistent_workers")

T_co = TypeVar("T_co", covariant=True)


class _InfiniteConstantSampler:
    """An IterableDataset's index stream: None forever (the dataset decides)."""

    def __iter__(self):
        while True:
            yield None


class DataLoader(Generic[T_co]):
    """Loads batches from a dataset, like ``torch.utils.data.DataLoader``;
    generic in the sample type as torch's (``DataLoader[list[Tensor]]``).

    Takes torch's arguments with torch's meaning, plus:

    * ``device``: None or "cpu" (batches on the host), or "cuda" / "cuda:N":
      batches arrive on that GPU, uploaded on fastload's own stream from
      page-locked slots (torch CUDA tensors; ``fastload._C.DeviceArray``
      objects, which export DLPack and ``__cuda_array_interface__``, with
      ``output="numpy"``).
    * ``normalize_on_device``: with ``device="cuda"`` and an image dataset
      whose transform ends in ToTensor/Normalize, upload uint8 images (4x
      fewer bytes) and convert and normalize them on the GPU.
    * ``output``: "auto" (torch tensors when torch is installed, NumPy arrays
      otherwise), "torch" or "numpy".

    With ``pin_memory=True`` (or a CUDA ``device``) and a CUDA driver, batch
    slots are page-locked once by the driver and reused.

    * ``worker_mode``: how ``num_workers`` workers run.  "process": worker
      processes, as torch's (each with its own copy of the dataset and its
      own global random state), handing batches over through shared slots
      without a copy; ``multiprocessing_context`` picks the start method.
      "thread": C worker threads that share the dataset (an IterableDataset
      is copied per worker) and the interpreter's global state, and take
      the GIL only around dataset and collate calls.  "auto" (default):
      threads for fastload's native datasets (their batches are read in C
      without the GIL), processes for every other dataset.
    * ``num_workers="auto"``: a pool of as many workers as usable cores;
      during the first epoch the loader grows the *active* workers and the
      prefetch depth while that raises the throughput the loop sees, then
      holds them (``autotune_report()``).  Batches and their order are those
      of a fixed ``num_workers``.  ``loader.num_workers`` is then the pool
      size and ``loader.autotune`` True; ``prefetch_factor`` is the largest
      prefetch it may choose (default 8).  An IterableDataset gets a fixed
      pool (its shards follow the worker count).
    * ``max_prefetch_bytes``: with ``num_workers="auto"``, the most bytes of
      batches kept in flight (default: 1 GiB or an eighth of RAM, the
      lesser).
    * ``batch_transform``: applied to each collated ``(images, labels)``
      batch in the worker that made it.  fastload's or torchvision v2's
      ``MixUp``, ``CutMix`` or ``RandomChoice`` of them runs in C (inside
      the native batch job for fastload's datasets), its draws keyed by
      (seed, epoch, batch number), so batches do not depend on
      ``num_workers``; labels become float32 ``(N, num_classes)``.  Any
      other callable ``(images, labels) -> (images, labels)`` is called
      in the worker (fastload's datasets then build their batches in
      Python).  This replaces torchvision's
      ``collate_fn=lambda b: mix(*default_collate(b))``.
    """

    _initialized = False

    def __init__(self, dataset, batch_size=1, shuffle=None, sampler=None, batch_sampler=None,
                 num_workers=0, collate_fn=None, pin_memory=False, drop_last=False, timeout=0,
                 worker_init_fn=None, multiprocessing_context=None, generator=None, *,
                 prefetch_factor=None, persistent_workers=False, pin_memory_device="",
                 in_order=True, device=None, output="auto", normalize_on_device=False,
                 worker_mode="auto", max_prefetch_bytes=None, batch_transform=None):
        self.autotune = isinstance(num_workers, str)
        self._autotune = None  # the autotuner, shared by this loader's iterators
        if self.autotune:
            self._autotune = _plan_autotune(num_workers, dataset, prefetch_factor,
                                            max_prefetch_bytes)
            num_workers = self._autotune.max_workers
            prefetch_factor = self._autotune.max_prefetch
        elif max_prefetch_bytes is not None:
            raise ValueError("max_prefetch_bytes needs num_workers='auto' (a fixed num_workers "
                             "keeps num_workers * prefetch_factor batches in flight)")
        if num_workers < 0:
            raise ValueError(
                "num_workers option should be non-negative; use num_workers=0 to disable "
                "multiprocessing."
            )
        if num_workers > _MAX_WORKERS:
            raise ValueError(
                f"num_workers={num_workers} is more than fastload supports ({_MAX_WORKERS})")
        if worker_mode not in _WORKER_MODES:
            raise ValueError(
                f"worker_mode should be one of {_WORKER_MODES}, but got worker_mode={worker_mode!r}")
        if timeout < 0:
            raise ValueError("timeout option should be non-negative")
        if num_workers == 0 and prefetch_factor is not None:
            raise ValueError(
                "prefetch_factor option could only be specified in multiprocessing."
                "let num_workers > 0 to enable multiprocessing, otherwise set prefetch_factor "
                "to None."
            )
        elif num_workers > 0 and prefetch_factor is None:
            prefetch_factor = 2
        elif prefetch_factor is not None and prefetch_factor < 0:
            raise ValueError("prefetch_factor option should be non-negative")
        if prefetch_factor is not None and num_workers * prefetch_factor > _INT32_MAX:
            raise ValueError(
                f"prefetch_factor={prefetch_factor} is too large: num_workers * prefetch_factor "
                f"batches in flight must be at most {_INT32_MAX}")
        if persistent_workers and num_workers == 0:
            raise ValueError("persistent_workers option needs num_workers > 0")
        if output not in _OUTPUTS:
            raise ValueError(f"output should be one of {_OUTPUTS}, but got output={output!r}")
        if output == "torch" and torch is None:
            raise ValueError("output='torch' needs torch installed; use output='numpy'")
        device_index = None
        if not (device is None or str(device) == "cpu"):
            if not str(device).startswith("cuda"):
                raise ValueError(f"device={device!r} is not supported: use None, 'cpu', "
                                 "'cuda' or 'cuda:N'")
            device_index = cuda.check_device(device)  # RuntimeError without a driver or device

        # A torch DataPipe is kept in torch's wrapper, as torch's loader
        # keeps it; an IterDataPipe's Shufflers follow `shuffle` (torch's
        # DataPipe protocol: fastload.loader.torch_compat).
        datapipe = _torch_compat.datapipe_kind(dataset)
        self.dataset = _torch_compat.wrap_datapipe(dataset)
        if datapipe == "iter" and shuffle is not None:
            # As torch 2.13: a graph without a Shuffler gets torch's warning
            # that one is appended, but the loader keeps the datapipe it was
            # given -- unshuffled, the batches torch's loader yields.
            _torch_compat.apply_datapipe_shuffle(dataset, shuffle)
        self.num_workers = num_workers
        self.prefetch_factor = prefetch_factor
        self.pin_memory = pin_memory
        self.pin_memory_device = pin_memory_device
        self.timeout = timeout
        self.worker_init_fn = worker_init_fn
        self.multiprocessing_context = multiprocessing_context
        self.in_order = in_order
        self.device = device
        self.output = ("torch" if torch is not None else "numpy") if output == "auto" else output
        self.normalize_on_device = normalize_on_device
        self.worker_mode = worker_mode
        # Marks this loader's own workers, which must not iterate it again.
        self._token = uuid.uuid4().hex
        if normalize_on_device and device_index is None:
            raise ValueError("normalize_on_device=True needs device='cuda'")
        if normalize_on_device and self.output != "torch":
            raise ValueError("normalize_on_device=True needs torch (output='torch')")
        self.batch_transform = batch_transform
        self._batch_step = _batch_transform.resolve(batch_transform)
        if normalize_on_device and self._batch_step is not None:
            raise ValueError("normalize_on_device=True cannot be combined with batch_transform "
                             "(the batch is mixed before it is normalised)")

        if is_iterable_dataset(dataset):
            self._dataset_kind = "iterable"
            # An IterDataPipe takes shuffle (above); other iterables cannot.
            if datapipe != "iter" and shuffle not in {False, None}:
                raise ValueError(
                    "DataLoader with IterableDataset: expected unspecified shuffle option, "
                    f"but got shuffle={shuffle}"
                )
            if sampler is not None:
                raise ValueError(
                    "DataLoader with IterableDataset: expected unspecified sampler option, "
                    f"but got sampler={sampler}"
                )
            elif batch_sampler is not None:
                raise ValueError(
                    "DataLoader with IterableDataset: expected unspecified batch_sampler "
                    f"option, but got batch_sampler={batch_sampler}"
                )
        else:
            shuffle = bool(shuffle)
            self._dataset_kind = "map"

        if sampler is not None and shuffle:
            raise ValueError("sampler option is mutually exclusive with shuffle")
        if batch_sampler is not None:
            if batch_size != 1 or shuffle or sampler is not None or drop_last:
                raise ValueError(
                    "batch_sampler option is mutually exclusive with batch_size, shuffle, "
                    "sampler, and drop_last"
                )
            batch_size = None
            drop_last = False
        elif batch_size is None and drop_last:
            raise ValueError(
                "batch_size=None option disables auto-batching and is mutually exclusive "
                "with drop_last"
            )

        if sampler is None:
            if self._dataset_kind == "iterable":
                sampler = _InfiniteConstantSampler()
            elif shuffle:
                sampler = RandomSampler(dataset, generator=generator)
            else:
                sampler = SequentialSampler(dataset)
        if batch_size is not None and batch_sampler is None:
            batch_sampler = BatchSampler(sampler, batch_size, drop_last)

        self.batch_size = batch_size
        self.drop_last = drop_last
        self.sampler = sampler
        self.batch_sampler = batch_sampler
        self.generator = generator
        if collate_fn is None:
            collate_fn = default_collate if self._auto_collation else default_convert
        self.collate_fn = collate_fn
        self.persistent_workers = persistent_workers
        # Batch buffers outlive iterators (epochs reuse warm pages) and even
        # the loader (a held batch keeps its slot).  Autotuned: sized as a
        # fixed loader with the whole pool at the usual prefetch.
        in_flight = max(1, num_workers * (prefetch_factor or 0))
        if self.autotune:
            in_flight = num_workers * min(prefetch_factor, _autotune.START_PREFETCH)
        # Uploads read slots through fastload's own stream, which tracks its
        # copies; batches handed to the loop are fenced against theirs.
        if device_index is not None:
            memory = "staging"
        else:
            memory = "pinned" if pin_memory and cuda.is_available() else "host"
        self._slot_pool = _C.SlotPool(
            max_free=2 * in_flight + 2, memory=memory,
            device=device_index if device_index is not None else _pin_device(pin_memory_device))
        self._upload = _Upload(self, device_index, in_flight) if device_index is not None else None
        self._timers = LoaderTimers()  # loader.stats()
        self._IterableDataset_len_called = None
        self._iterator = None
        self._last_iter = None  # weakref to the latest iterator, for state_dict()
        # Where the latest iterator stood when it was dropped mid-epoch (a
        # loop left by break): [position] once dropped (_BaseIter._leave).
        self._last_left = []
        self._resume = None     # state for the next iter(), from load_state_dict()
        self._epoch_thread = None  # the thread iterating persistent workers
        # Held while a thread claims persistent workers and starts its epoch
        # on them; the pid it was made in (a forked child makes its own).
        self._claim_lock = (os.getpid(), threading.Lock())
        self._initialized = True
        if self.num_workers > 0 and _worker_mode(self) == "process":
            _warn_about_worker_count(self.num_workers)  # here and per iterator, as torch

    # -- attributes ---------------------------------------------------------

    @property
    def multiprocessing_context(self):
        return self._multiprocessing_context

    @multiprocessing_context.setter
    def multiprocessing_context(self, context):
        if context is not None:
            if self.num_workers > 0:
                if isinstance(context, str):
                    valid = multiprocessing.get_all_start_methods()
                    if context not in valid:
                        raise ValueError(
                            "multiprocessing_context option should specify a valid start "
                            f"method in {valid!r}, but got multiprocessing_context={context!r}"
                        )
                    context = multiprocessing.get_context(context)
                if not isinstance(context, multiprocessing.context.BaseContext):
                    raise TypeError(
                        "multiprocessing_context option should be a valid context object or "
                        "a string specifying the start method, but got "
                        f"multiprocessing_context={context}"
                    )
            else:
                raise ValueError(
                    "multiprocessing_context can only be used with multi-process loading "
                    f"(num_workers > 0), but got num_workers={self.num_workers}"
                )
        self._multiprocessing_context = context

    def __setattr__(self, attr, value):
        if self._initialized and attr in _FROZEN_ATTRS:
            raise ValueError(
                f"{attr} attribute should not be set after {self.__class__.__name__} is initialized"
            )
        super().__setattr__(attr, value)

    @property
    def _auto_collation(self):
        return self.batch_sampler is not None

    @property
    def _index_sampler(self):
        return self.batch_sampler if self._auto_collation else self.sampler

    def autotune_report(self):
        """With ``num_workers="auto"``: a plain dict of what the autotuner
        chose and why -- ``workers`` (active), ``prefetch``, ``in_flight``,
        ``settled``, ``reason``, the bounds (``max_workers``,
        ``max_prefetch``, ``max_prefetch_bytes``), ``batch_bytes`` and
        ``steps`` (one dict per measured window).  None otherwise."""
        return self._autotune.report() if self._autotune is not None else None

    # -- iteration ----------------------------------------------------------

    def __iter__(self):
        if current_loader_token() == self._token:
            raise RuntimeError(
                "a DataLoader cannot be iterated from inside one of its own workers (its "
                "dataset or collate_fn iterates the loader that calls it): each batch would "
                "start the loader again, without end.  Iterate a separate DataLoader there.")
        if not (self.persistent_workers and self.num_workers > 0):
            return self._start_iter()
        # The claim and the start of the epoch are one step: a thread that
        # found the last epoch finished must not start its own while another
        # thread, which found it finished too, is starting one on the same
        # workers (both would take the other's batches: short epochs, or a
        # wait that times out).
        pid, lock = self._claim_lock
        if pid != os.getpid():
            lock = threading.Lock()
            self._claim_lock = (os.getpid(), lock)
        if not lock.acquire(blocking=False):
            raise RuntimeError(
                "this DataLoader's persistent workers are starting an epoch of another thread: "
                "finish (or drop) that thread's loop first, or give each thread its own "
                "DataLoader")
        try:
            self._claim_persistent_workers()
            return self._start_iter()
        finally:
            lock.release()

    def _start_iter(self):
        if self._upload is None:
            return self._host_iter()
        if self.persistent_workers and self.num_workers > 0:
            self._upload.stop()  # the host iterator is shared: stop its reader first
        host_iter = self._host_iter()
        return self._upload.start(host_iter, self._timers)

    def _claim_persistent_workers(self):
        """Persistent workers serve one epoch at a time: refuse a second
        thread's epoch while another live thread's is unfinished (torch's
        iterator would silently mix the two).  Called with _claim_lock
        held, which covers the start of the epoch too."""
        current = threading.current_thread()
        owner = self._epoch_thread
        if (owner is not None and owner is not current and owner.is_alive()
                and self._iterator is not None and not self._iterator._finished):
            raise RuntimeError(
                f"this DataLoader's persistent workers are serving an epoch of thread "
                f"{owner.name!r}: finish (or drop) that loop first, or give each thread its "
                "own DataLoader")
        self._epoch_thread = current

    def _host_iter(self):
        resume, self._resume = self._resume, None
        if resume is not None:
            return self._resumed_iter(resume)
        if self.num_workers == 0:
            it = _SingleThreadIter(self)
            self._remember(it)
            return it
        workers = _ProcessIter if _worker_mode(self) == "process" else _ThreadedIter
        if self.persistent_workers:
            previous = self._iterator
            if previous is not None and previous._pid != os.getpid():
                # Forked after the workers started: they are the parent's.
                # The child starts its own, as a fresh loader would.
                previous._shutdown()
                previous = self._iterator = None
            if previous is None or type(previous) is not workers:
                if previous is not None:
                    previous._shutdown()
                self._iterator = workers(self)
            else:
                self._iterator._reset(self)
            return self._iterator
        it = workers(self)
        self._remember(it)
        return it

    def _remember(self, it):
        """``it`` is the iterator state_dict() describes, even once dropped."""
        self._last_iter = weakref.ref(it)
        self._last_left = it._left = []

    def _resumed_iter(self, state):
        if self._iterator is not None:
            self._iterator._shutdown()
            self._iterator = None
        if self.num_workers == 0:
            it = _SingleThreadIter(self, state)
        else:
            workers = _ProcessIter if _worker_mode(self) == "process" else _ThreadedIter
            it = workers(self, state)
            if self.persistent_workers:
                self._iterator = it
        self._remember(it)
        if it._iterable and state["in_epoch"] and not _resume.dataset_restored(state):
            # No indices to skip: the batches handed out are loaded again.
            for _ in range(state["num_yielded"]):
                next(it)
        return it

    # -- resumable state ----------------------------------------------------

    def state_dict(self):
        """Where the loader stands, for ``load_state_dict`` (torchdata's
        StatefulDataLoader names): mid-epoch, the batches still to come in
        this epoch; between epochs, the next epoch.  A dict of plain Python
        values (``torch.save``/``torch.load`` with its defaults, ``pickle``
        and ``json`` all carry it).  See fastload.loader.resume."""
        if self._upload is not None:
            raise NotImplementedError(
                "state_dict() is not available with device= (the upload stage reads ahead of "
                "the loop); resume the host loader and upload its batches instead")
        it = self._iterator if self.persistent_workers and self.num_workers > 0 else None
        if it is None and self._last_iter is not None:
            it = self._last_iter()
        if it is not None and not it._finished and it._pid_ok():
            state = it._position()
        elif it is None and self._last_left:
            state = dict(self._last_left[0])  # the loop that left it mid-epoch
        else:
            persistent = it is not None and self.persistent_workers and self.num_workers > 0
            state = {
                "in_epoch": False,
                "num_yielded": 0,
                "samples_yielded": 0,
                "batching": _resume.batching(self),
                # A persistent loader's next epoch keeps its base seed.
                "epoch": it._epoch + 1 if persistent else 0,
                "base_seed": it._base_seed if persistent else None,
            }
        if state.pop("out_of_order", False):
            raise ValueError(
                "state_dict() mid-epoch needs in_order=True: with in_order=False the batches "
                "handed out are not the first of the epoch, so no count of them resumes it")
        state["generators"] = _resume.generator_states(self)
        state["fastload_state"] = _resume.STATE_VERSION
        dataset_state = getattr(self.dataset, "state_dict", None)
        if callable(dataset_state):
            state["dataset"] = dataset_state()
        return state

    def load_state_dict(self, state):
        """Makes the next ``iter(loader)`` continue from ``state`` (from
        ``state_dict()`` of a loader built with the same arguments): the
        batches the recorded run would have yielded next, bit for bit.  A
        loader batching its sampler's indices (``batch_size=``) may have
        another ``batch_size``, ``drop_last`` or ``num_workers``: it yields
        the samples the recorded run had still to yield, in its own batches.
        ValueError, naming what changed, where the loader cannot continue
        the recorded epoch exactly."""
        state = _resume.check(state)
        if state["in_epoch"]:
            _resume.skip_plan(state, self, starting=False)  # ValueError now, naming what changed
        if "dataset" in state:
            load = getattr(self.dataset, "load_state_dict", None)
            if not callable(load):
                raise ValueError("load_state_dict: the state holds a dataset state, but the "
                                 "dataset has no load_state_dict()")
            load(state["dataset"])
        self._resume = state

    # -- where the time goes -------------------------------------------------

    def stats(self, reset=False):
        """Where this loader's time went since it was made (or since the last
        ``stats(reset=True)``): per stage, per worker, and the training
        loop's wait per batch, with a verdict.  ``print()`` the result for
        a table; ``.as_dict()`` for a logger.  See fastload.stats."""
        timers = self._timers
        report = LoaderStats(
            timers.timers.snapshot(), timers.num_workers,
            _worker_mode(self) if timers.num_workers else None, self.prefetch_factor,
            autotune=self.autotune_report())
        if reset:
            timers.timers.reset()
        return report

    def __len__(self):
        if self._dataset_kind == "iterable":
            length = self._IterableDataset_len_called = len(self.dataset)
            if self.batch_size is not None:
                if self.drop_last:
                    length = length // self.batch_size
                else:
                    length = -(-length // self.batch_size)
            return length
        return len(self._index_sampler)


def _plan_autotune(num_workers, dataset, prefetch_factor, max_prefetch_bytes):
    """The autotuner for ``num_workers="auto"``, after checking the
    arguments that go with it."""
    if num_workers != "auto":
        raise ValueError(
            f"num_workers option should be a non-negative integer or 'auto', but got "
            f"num_workers={num_workers!r}; use num_workers=0 to disable multiprocessing.")
    if prefetch_factor is not None and (not isinstance(prefetch_factor, int)
                                        or prefetch_factor < 1):
        raise ValueError(f"prefetch_factor option should be a positive integer with "
                         f"num_workers='auto' (the largest prefetch), but got "
                         f"prefetch_factor={prefetch_factor!r}")
    if max_prefetch_bytes is not None and (not isinstance(max_prefetch_bytes, int)
                                           or max_prefetch_bytes < 1):
        raise ValueError(f"max_prefetch_bytes should be a positive integer, but got "
                         f"max_prefetch_bytes={max_prefetch_bytes!r}")
    max_prefetch = prefetch_factor or _autotune.DEFAULT_MAX_PREFETCH
    workers = min(_autotune.usable_cores(), _MAX_WORKERS)
    if is_iterable_dataset(dataset):
        # Each worker reads its own shard: a worker left idle would drop its
        # data, so the count is fixed.
        return _autotune.Autotuner.fixed(
            workers, prefetch_factor or _autotune.START_PREFETCH,
            "an IterableDataset's shards follow the worker count: fixed at the usable cores")
    return _autotune.Autotuner(workers, max_prefetch, max_prefetch_bytes)


def _pin_device(pin_memory_device):
    """The device whose context page-locks the slots (any: they are portable)."""
    match = re.fullmatch(r"cuda:(\d+)", str(pin_memory_device or ""))
    return int(match.group(1)) if match else 0


class _Upload:
    """A loader's upload stage: its stream and device pool, shared by epochs,
    and the latest upload thread (with persistent workers, the one that reads
    the shared host iterator: a new epoch stops it first)."""

    def __init__(self, loader, device_index, in_flight):
        self.stream = _C.CudaStream(device_index)
        self.depth = max(2, in_flight)
        self.pool = _C.SlotPool(max_free=self.depth + 2, memory="device", device=device_index)
        self.to_torch = loader.output == "torch"
        self.normalize = None     # (mul, add, dtype) applied on the device
        self.native_source = None  # the dataset's uint8 source, with normalize
        if loader.normalize_on_device:
            source = _native.source_of(loader.dataset, uint8=True)
            if source is None:
                raise ValueError(
                    "normalize_on_device=True needs a fastload image dataset whose transform "
                    "is a fastload.transforms.Compose ending in ToTensor (and Normalize)")
            self.native_source = source
            self.normalize = loader.dataset._device_normalization()
        self._pump = None

    def stop(self):
        if self._pump is not None:
            self._pump.close()
            self._pump = None

    def start(self, host_iter, timers):
        self._pump = Pump(host_iter, self.stream, self.pool, self.depth, timers.timers,
                          timers.upload_row)
        return DeviceIter(self._pump, self.to_torch, self.normalize,
                          ConsumerClock(timers.timers))


# --------------------------------------------------------------- collation


class _SlotCollate:
    """default_collate for a loader: stacks in C into the loader's slots
    when the samples allow it, else applies the same rules in Python.
    ``convert`` turns slot arrays into the output type (torch.from_numpy for
    torch output); a process worker passes None and its parent converts."""

    _BY_BACKEND = object()

    def __init__(self, pool, backend, convert=_BY_BACKEND):
        self.pool = pool
        self.backend = backend
        if convert is _SlotCollate._BY_BACKEND:
            convert = torch.from_numpy if backend is TORCH else None
        self.to_output = convert

    def __call__(self, samples):
        if type(samples) is list:
            batch = _C.collate(samples, self.pool, self.to_output)
            if batch is not NotImplemented:
                return batch
        return collate(samples, self.backend)


class _Convert:
    def __init__(self, backend):
        self.backend = backend

    def __call__(self, sample):
        return convert(sample, self.backend)


def _effective_collate(loader):
    """The collate function workers call: fastload's fast paths stand in for
    the default functions (torch's included), which they reproduce."""
    backend = backend_for(loader.output)
    fn = loader.collate_fn
    if fn is default_collate or fn is _torch_compat.torch_default_collate():
        return _SlotCollate(loader._slot_pool, backend)
    if fn is default_convert or fn is _torch_compat.torch_default_convert():
        return _Convert(backend)
    return fn


def _pin(data, pinned=None):
    """Page-locks the tensors in a batch (only reached with an accelerator),
    except those `pinned(tensor)` says fastload page-locked already."""
    if pinned is not None and isinstance(data, torch.Tensor) and pinned(data):
        return data
    if hasattr(data, "pin_memory"):  # tensors, and custom batch types that opt in
        return data.pin_memory()
    if isinstance(data, dict):
        return type(data)({k: _pin(v, pinned) for k, v in data.items()})
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return type(data)(*(_pin(v, pinned) for v in data))
    if isinstance(data, (list, tuple)):
        return type(data)(_pin(v, pinned) for v in data)
    return data


# ---------------------------------------------------------------- iterators


class _BaseIter:
    _already_pinned = None  # tensor -> bool, for _pin; None: ask torch

    def __init__(self, loader, resume=None):
        self._dataset = loader.dataset
        self._iterable = loader._dataset_kind == "iterable"
        self._IterableDataset_len_called = loader._IterableDataset_len_called
        self._auto_collation = loader._auto_collation
        self._drop_last = loader.drop_last
        self._index_sampler = loader._index_sampler
        self._num_workers = loader.num_workers
        self._timeout = loader.timeout
        self._collate_fn = _effective_collate(loader)
        # Slots are page-locked already when fastload has the driver (thread
        # workers' come from cuMemHostAlloc, process workers' are registered
        # in place as the parent maps them); other batches (a custom
        # collate_fn's) are pinned by torch, which returns pinned tensors as
        # they are.  An upload needs neither.
        self._pin_memory = (loader.pin_memory and loader._upload is None
                            and _accelerator_available())
        if loader.pin_memory and not (self._pin_memory or cuda.is_available()):
            warnings.warn(
                "'pin_memory' argument is set as true but no accelerator is found, then device "
                "pinned memory won't be used.",
                stacklevel=3,
            )
        self._native_source = _native_source(self, loader)
        profiler.sync()  # before any worker starts
        self._timers = loader._timers.for_workers(self._num_workers)
        # With device=, the loop's waits are the upload iterator's to record.
        self._clock = ConsumerClock(self._timers) if loader._upload is None else None
        self._finished = False  # this epoch has ended (StopIteration raised)
        self._num_yielded = 0
        self._epoch = 0  # a persistent iterator's epochs: keys native augmentation
        self._batch_number = 0  # batches taken from the sampler this epoch: keys batch_transform
        self._batch_step = loader._batch_step
        self._in_order = bool(loader.in_order)
        # Map-style loaders batching a flat stream of indices count the
        # samples handed out (state_dict's samples_yielded): the sizes of
        # the batches taken from the sampler and not yet handed out, in
        # order, and the samples of those handed out (or raised).
        self._batching = _resume.batching(loader)
        self._counts_samples = self._batching["kind"] in ("samples", "flat")
        self._sizes = collections.deque()
        self._samples_yielded = 0
        # A torch DataPipe (fastload.loader.torch_compat): "iter" or "map", else None.
        self._datapipe = _torch_compat.datapipe_kind(self._dataset)
        self._datapipe_seed = None  # an IterDataPipe's shared seed this epoch
        self._datapipe_group = None
        if self._datapipe == "iter":
            self._datapipe_group = _torch_compat.datapipe_seed_group()
        # (world_size, rank), read here: worker processes are not in the group.
        self._world = _torch_compat.distributed_settings() if self._datapipe else (1, 0)
        if resume is None or not resume["in_epoch"]:
            if resume is not None:
                _resume.set_generators(loader, resume["generators"])
            # torch's order: the datapipe seed, the sampler iterator, then
            # the base seed.
            self._seed_datapipe(loader)
            self._sampler_iter = self._open_epoch(loader)
            self._base_seed = draw_seed(loader.generator)
            if resume is not None and resume["base_seed"] is not None:
                # A persistent loader's next epoch keeps its base seed.
                self._base_seed, self._epoch = resume["base_seed"], resume["epoch"]
        else:
            how, skip, eager = _resume.skip_plan(resume, loader)
            index_iter = self._index_iter
            if how == "samples":
                # The samples already handed out are skipped in the sampler's
                # stream, the rest cut into batches of this loader's size.
                index_iter = lambda: self._resumed_index_iter(skip, eager)  # noqa: E731
            self._seed_datapipe(loader, resume.get("datapipe_seed"))
            self._sampler_iter = self._open_epoch(loader, resume, index_iter)
            self._base_seed, self._epoch = resume["base_seed"], resume["epoch"]
            if not self._iterable:
                if how == "batches":
                    # The batches already handed out: their indices, not their data.
                    for _ in range(skip):
                        next(self._sampler_iter)
                else:
                    self._samples_yielded = skip
                self._num_yielded = resume["num_yielded"]
                self._batch_number = resume["num_yielded"]

    def __iter__(self):
        return self

    def _seed_datapipe(self, loader, seed=None):
        """An IterDataPipe's epoch: its shared seed drawn from the loader's
        generator (``seed``, resuming) and its random datapipes seeded from
        it here, as torch does; workers seed their copies from it again."""
        if self._datapipe != "iter":
            return
        if seed is None:
            seed = _torch_compat.draw_datapipe_seed(loader.generator, self._datapipe_group)
        self._datapipe_seed = seed
        _torch_compat.seed_datapipe(self._dataset, seed)

    def _request(self, index):
        """A worker's job: (epoch, index, batch number), and an IterDataPipe's
        seed, with which a persistent worker starts the epoch's pass."""
        request = (self._epoch, index, self._batch_number - 1)
        return request if self._datapipe != "iter" else request + (self._datapipe_seed,)

    def _open_epoch(self, loader, resume=None, index_iter=None):
        """The epoch's index iterator (``index_iter()``, by default
        ``_index_iter()``).  Records the random state its sampler draws
        from (fastload.loader.resume), or, resuming, replays the recorded one."""
        if resume is None:
            self._at_iter = _resume.snapshot(loader)
            it = self._index_iter()
        else:
            self._at_iter = resume["at_iter"]
            it = _resume.replay(self._at_iter, loader, index_iter or self._index_iter)
        self._at_first_draw = None

        def first_draw(draw):
            if resume is not None and resume["at_first_draw"] is not None:
                self._at_first_draw = resume["at_first_draw"]
                return _resume.replay(self._at_first_draw, loader, draw)
            if resume is not None:
                # The recorded run had not drawn yet: it drew later, from the
                # global state then (the program's own, restored by its own
                # checkpoint) and the loader's generators as recorded.
                _resume.set_generators(loader, resume["generators"])
            self._at_first_draw = _resume.snapshot(loader)
            return draw()

        return _resume.FirstDraw(it, first_draw)

    def _position(self):
        """Where this epoch stands (see DataLoader.state_dict), but the
        loader's generators; ``out_of_order``: batches were handed out in
        completion order, so no count resumes the epoch."""
        return {
            "out_of_order": not self._in_order and self._num_workers > 0 and self._num_yielded > 0,
            "in_epoch": True,
            "num_yielded": self._num_yielded,
            "samples_yielded": self._samples_yielded if self._counts_samples else None,
            "batching": self._batching,
            "epoch": self._epoch,
            "base_seed": self._base_seed,
            "at_iter": self._at_iter,
            "at_first_draw": self._at_first_draw,  # None: the sampler has not drawn yet
            "datapipe_seed": self._datapipe_seed,  # an IterDataPipe's, else None
        }

    _left = None  # the loader's record of where this iterator was dropped (DataLoader._remember)

    def _leave(self):
        """Dropped mid-epoch (the loop left by break): leaves the loader a
        record of where the epoch stood, for state_dict()."""
        left = self._left
        if (left is not None and not left and not self._finished and self._pid_ok()
                and getattr(self, "_base_seed", None) is not None):  # made in full
            left.append(self._position())

    def __del__(self):
        self._leave()

    def _index_iter(self):
        # A native dataset takes index arrays from fastload's own batch
        # sampler: the same indices without a Python int each.
        if self._native_source is not None and isinstance(self._index_sampler, BatchSampler):
            arrays = self._index_sampler._array_batches()
            if arrays is not None:
                return arrays
        return iter(self._index_sampler)

    def _resumed_index_iter(self, skip, eager):
        """The index iterator of an epoch resumed by samples: the sampler's
        indices after the first ``skip``, in this loader's batches
        (fastload.loader.resume.resumed_indices)."""
        kind = self._batching["kind"]
        sampler = self._index_sampler if kind == "samples" else self._index_sampler.sampler
        batch_size = None if kind == "samples" else self._index_sampler.batch_size
        drop_last = kind != "samples" and self._index_sampler.drop_last
        arrays = (self._native_source is not None and type(self._index_sampler) is BatchSampler
                  and type(sampler) in (RandomSampler, SequentialSampler))
        open_indices = sampler._index_chunks if arrays else lambda: iter(sampler)
        return _resume.resumed_indices(open_indices, skip, eager, batch_size, drop_last, arrays)

    def _pid_ok(self):
        return getattr(self, "_pid", os.getpid()) == os.getpid()

    def _reset(self, loader):
        profiler.sync()
        self._sampler_iter = self._open_epoch(loader)
        self._seed_datapipe(loader)  # after iter(sampler), as torch's _reset
        if self._clock is not None:
            self._clock.last = 0  # the time between epochs is not the loop's
        self._finished = False
        self._num_yielded = 0
        self._batch_number = 0
        self._sizes.clear()
        self._samples_yielded = 0
        self._batching = _resume.batching(loader)  # the sampler's epoch may be new
        self._IterableDataset_len_called = loader._IterableDataset_len_called

    def _next_index(self):
        index = next(self._sampler_iter)
        self._batch_number += 1
        if self._counts_samples:
            self._sizes.append(len(index) if self._auto_collation else 1)
        return index

    def _handed_out(self):
        """The oldest batch taken from the sampler is handed out (or its
        error raised): its samples count as consumed.  Batches come in the
        sampler's order (in_order=True; state_dict refuses otherwise)."""
        if self._sizes:
            self._samples_yielded += self._sizes.popleft()

    def __next__(self):
        if profiler.torch_profiling():
            with profiler.next_range(self._profile_name):
                return self._next()
        return self._next()

    @property
    def _profile_name(self):
        # torch's name for the range: profiler views file it under DataLoader.
        return f"enumerate(DataLoader)#{type(self).__name__}.__next__"

    def _next(self):
        called_at = clock_ns()
        self._note_depth()
        try:
            data = self._next_data()
        except StopIteration:
            self._finished = True
            raise
        self._num_yielded += 1
        if (
            self._iterable
            and self._IterableDataset_len_called is not None
            and self._num_yielded > self._IterableDataset_len_called
        ):
            # torch's words, which tests and log filters match; its hint is
            # given for worker threads too (the same cause, the same fix).
            msg = (
                f"Length of IterableDataset {self._dataset} was reported to be "
                f"{self._IterableDataset_len_called}(when accessing len(dataloader)), but "
                f"{self._num_yielded} samples have been fetched. "
            )
            if self._num_workers > 0:
                msg += (
                    "For multiprocessing data-loading, this could be caused by not properly "
                    "configuring the IterableDataset replica at each worker. Please see "
                    "https://pytorch.org/docs/stable/data.html#torch.utils.data.IterableDataset "
                    "for examples."
                )
            warnings.warn(msg, UserWarning, stacklevel=3)  # the loop's next(), past __next__
        if self._pin_memory:
            data = _pin(data, self._already_pinned)
        if self._clock is not None:
            self._clock.handed_over(called_at)
        return data

    def _note_depth(self):
        """Notes the batches in flight, and those of them done, as the loop
        asks for one (loader.stats()).  None without workers; a thread
        Engine notes them itself, in C."""

    def __len__(self):
        return len(self._index_sampler)

    def __getstate__(self):
        raise NotImplementedError(f"{self.__class__.__name__} cannot be pickled")


class _SingleThreadIter(_BaseIter):
    """num_workers=0: everything happens in the calling thread."""

    def __init__(self, loader, resume=None):
        super().__init__(loader, resume)
        if self._timeout != 0:
            raise AssertionError("timeout requires num_workers > 0 (as in torch)")
        if self._datapipe is not None:
            # The distributed rank's shard (the whole stream on one process).
            _torch_compat.shard_datapipe(self._dataset, 1, 0, self._world)
        plan = _fetch_plan(self, loader, num_workers=0)
        self._fetcher = make_fetcher(plan, StopFlag())

    def _next_data(self):
        index = self._next_index()
        # The loop makes the batch itself: its stages time into its own row.
        timers = self._timers
        timers.bind(self._num_workers)
        try:
            return self._fetcher.fetch(index, self._batch_number - 1)
        finally:
            self._handed_out()
            timers.unbind()


def _default_collation(loader):
    fn = loader.collate_fn
    return fn is default_collate or fn is _torch_compat.torch_default_collate()


def _worker_mode(loader):
    """'thread' or 'process' for a loader with workers (see worker_mode)."""
    if loader.worker_mode != "auto":
        return loader.worker_mode
    native = (_native.source_of(loader.dataset) is not None
              and loader._dataset_kind == "map" and loader._auto_collation
              and _default_collation(loader))
    # A dataset whose reads release the GIL (ZarrDataset) also scales on threads.
    parallel_reads = getattr(loader.dataset, "_threads_read_in_parallel", False) is True
    return "thread" if native or parallel_reads else "process"


def _native_source(it, loader):
    """The dataset's native source (fastload.datasets.native) when the loader takes
    the native path: a map-style dataset collated by the default rules,
    which the source reproduces, and no batch_transform but MixUp/CutMix
    (which the batch job runs in C)."""
    if it._iterable or not it._auto_collation or not isinstance(it._collate_fn, _SlotCollate):
        return None
    if isinstance(loader._batch_step, _batch_transform.CallStep):
        return None
    if loader._upload is not None and loader._upload.native_source is not None:
        return loader._upload.native_source  # uint8, normalized on the device
    return _native.source_of(it._dataset)


def _native_batches(it, pool):
    """The iterator's native source as a batch function on the calling
    thread (num_workers=0), or None."""
    if it._native_source is None:
        return None
    return _native.NativeBatches(it._native_source, pool, it._collate_fn.to_output,
                                 it._base_seed, _native.skip_reporter(it._dataset),
                                 _mix_plan(it))


def _mix_plan(it):
    """The MixUp/CutMix plan the native batch job runs, or None."""
    step = it._batch_step
    return step.plan if isinstance(step, _batch_transform.MixStep) else None


def _python_batch_step(it):
    """The batch_transform a worker applies to batches it collates in
    Python (the native path runs a MixStep in the batch job instead)."""
    return it._batch_step if it._native_source is None else None


def _fetch_plan(it, loader, num_workers):
    return FetchPlan(
        dataset=it._dataset,
        iterable=it._iterable,
        auto_collation=it._auto_collation,
        collate_fn=it._collate_fn,
        drop_last=it._drop_last,
        worker_init_fn=loader.worker_init_fn,
        num_workers=num_workers,
        base_seed=it._base_seed,
        native_batch=_native_batches(it, loader._slot_pool),
        loader_token=loader._token,
        batch_transform=_python_batch_step(it),
        datapipe=it._datapipe,
        datapipe_seed=it._datapipe_seed,
        world=it._world,
    )


# Shutting down (an iterator exhausted or dropped, its loader dropped,
# interpreter exit) sets the stop flag, so workers stop between samples, and
# waits for the sample each one is in -- for at most _SHUTDOWN_GRACE_SECONDS,
# as torch waits for a worker process before terminating it; once a timeout
# has fired on the iterator, for at most that timeout, but _MIN_GRACE_SECONDS
# at least (an idle worker needs the GIL a moment to exit).  A worker still in
# its sample then is stuck: it cannot be killed, so its thread is detached and
# left running with what it uses (dataset, engine) kept alive, and a
# RuntimeWarning names it and the sample.  Healthy workers finish a sample
# well within the bound and are always joined.
_SHUTDOWN_GRACE_SECONDS = 5.0
_MIN_GRACE_SECONDS = 1.0

# Iterators still alive at interpreter exit are shut down before
# finalization: a worker still running then would be ended (or parked) by
# CPython when it next asks for the GIL.
_live_iters = weakref.WeakSet()


@atexit.register
def _close_all_engines():
    for it in list(_live_iters):
        it._shutdown()


def _stuck_at(worker):
    """Where a worker that did not stop is stuck, for the warning."""
    fetcher = worker.fetcher
    if fetcher is None:
        return "while starting (worker_init_fn)" if worker.plan.worker_init_fn else "while starting"
    position = getattr(fetcher, "position", None)
    if position is None:
        return "while fetching a batch"
    if hasattr(position, "tolist"):  # a native batch's index array
        return f"at sample indices {position.tolist()!r}"
    return f"at sample index {position!r}"


class _ThreadedIter(_BaseIter):
    """num_workers > 0: batches are fetched by the engine's worker threads."""

    _timed_out = False  # a wait for a batch has timed out: workers may be stuck

    def __init__(self, loader, resume=None):
        super().__init__(loader, resume)
        self._prefetch_factor = loader.prefetch_factor
        self._persistent = loader.persistent_workers
        self._max_in_flight = self._num_workers * self._prefetch_factor
        if self._max_in_flight <= 0:
            raise AssertionError("prefetch_factor must be greater than 0 with workers")
        self._stop_flag = StopFlag()
        self._pid = os.getpid()  # the workers belong to this process
        # Autotuned (map-style only): the tuner's setting decides the active
        # workers and the batches kept in flight (_target).
        self._tuner = None if self._iterable else loader._autotune
        self._target = self._max_in_flight
        self._waited = 0.0  # seconds the last _next_delivery waited
        self._engine = self._start_workers(loader)
        if self._datapipe == "iter":
            # torch's iterator starts its workers with the epoch's seed, then
            # resets itself for the first epoch: a second seed is drawn for
            # the main process's datapipe, the workers keep the first.
            _torch_compat.seed_datapipe(self._dataset, _torch_compat.draw_datapipe_seed(
                loader.generator, self._datapipe_group))
        _live_iters.add(self)
        self._prime()

    def _start_workers(self, loader):
        plan = _fetch_plan(self, loader, self._num_workers)
        workers = [Worker(i, plan, self._stop_flag) for i in range(self._num_workers)]
        _torch_compat.route_torch_worker_info()
        if self._native_source is None:
            return _C.Engine(workers, self._max_in_flight, bool(loader.in_order),
                             stats=self._timers)
        # Native jobs: each batch runs in C on a worker, without the GIL.
        return _C.Engine(workers, self._max_in_flight, bool(loader.in_order),
                         source=self._native_source, pool=loader._slot_pool,
                         convert=self._collate_fn.to_output, seed=self._base_seed,
                         report=_native.skip_reporter(self._dataset), stats=self._timers,
                         mix=_mix_plan(self))

    def _prime(self):
        if self._tuner is not None:
            self._apply(self._tuner.begin())
            self._try_put_index()  # up to the target
            return
        for _ in range(self._max_in_flight):
            self._try_put_index()

    def _apply(self, setting):
        """Applies an autotuner setting: the workers that get new batches,
        and the batches kept in flight (fewer: submits are skipped)."""
        if self._engine.active != setting.workers:
            self._engine.active = setting.workers
        self._target = setting.in_flight

    def _reset(self, loader):
        """Persistent workers: a new epoch on the same threads."""
        super()._reset(loader)
        self._discard_in_flight()
        self._engine.reset()
        self._epoch += 1
        self._finished = False
        self._prime()

    def _discard_in_flight(self):
        # Batches still queued are cancelled; the ones running stop between
        # samples (the stop flag) and are dropped.  The wait for them is a
        # wait for a batch, so the loader's timeout bounds it.
        self._stop_flag.stopped = True
        self._engine.cancel_pending()
        timeout = self._timeout if self._timeout > 0 else None
        try:
            while self._engine.next(timeout) is not None:
                pass
        except TimeoutError:
            self._timed_out = True
            raise RuntimeError(f"DataLoader timed out after {self._timeout} seconds") from None
        self._stop_flag.stopped = False

    def _try_put_index(self):
        # One batch per batch delivered, as torch; autotuned, as many as
        # bring the batches in flight up to the target.  Indices go out in
        # sampler order either way, so the batches are the same.
        count = 1 if self._tuner is None else self._target - self._engine.in_flight
        for _ in range(count):
            try:
                index = self._next_index()
            except StopIteration:
                return
            # 1 means every worker has retired: the index is dropped, as torch does.
            self._engine.submit(self._request(index))

    def _next_delivery(self, timeout):
        """``engine.next(timeout)``, recording in ``_waited`` how long the
        consumer waited for it when a tuner needs to know."""
        if self._tuner is None or self._tuner.settled:
            return self._engine.next(timeout)
        start = time.perf_counter()
        try:
            return self._engine.next(timeout)
        finally:
            self._waited = time.perf_counter() - start

    def _next_data(self):
        if self._engine.closed:  # exhausted and shut down: stays exhausted
            raise StopIteration
        timeout = self._timeout if self._timeout > 0 else None
        while True:
            try:
                delivered = self._next_delivery(timeout)
            except TimeoutError:
                self._timed_out = True
                raise RuntimeError(f"DataLoader timed out after {self._timeout} seconds") from None
            if delivered is None:
                if self._tuner is not None:
                    self._tuner.end_epoch()
                self._finished = True
                if not self._persistent:
                    self._shutdown()
                raise StopIteration
            outcome, worker, value = delivered
            if outcome in (_C.JOB_SKIPPED, _C.JOB_CANCELLED):
                continue
            if outcome in (_C.JOB_DONE, _C.JOB_FAILED):
                self._handed_out()
            if self._tuner is not None and not self._tuner.settled:
                self._apply(self._tuner.observe(time.perf_counter(), self._waited,
                                                _autotune.batch_nbytes(value)))
            self._try_put_index()
            if outcome == _C.JOB_RETIRE:
                continue
            if outcome == _C.JOB_FAILED:  # a native batch's error, raised as a worker's
                value = ExceptionWrapper((type(value), value, value.__traceback__),
                                         f"in DataLoader worker {worker}")
            if isinstance(value, ExceptionWrapper):
                value.reraise()
            return value

    def _shutdown(self):
        engine = getattr(self, "_engine", None)
        if engine is not None and not engine.closed:
            self._stop_flag.stopped = True
            grace = _SHUTDOWN_GRACE_SECONDS
            if self._timed_out:
                grace = min(grace, max(self._timeout, _MIN_GRACE_SECONDS))
            stuck = engine.close(grace)
            if stuck:
                which = ", ".join(f"worker {w.id} (stuck {_stuck_at(w)})" for w in stuck)
                left = "its thread is" if len(stuck) == 1 else "their threads are"
                warnings.warn(
                    f"DataLoader {which} did not stop within {grace:g} seconds of shutdown; "
                    f"{left} left running, detached, with the dataset kept alive",
                    RuntimeWarning,
                )

    def __del__(self):
        self._leave()
        self._shutdown()


class _ProcessIter(_ThreadedIter):
    """num_workers > 0 with worker_mode='process': the same scheduling over
    worker processes (fastload.loader.process_engine)."""

    def __init__(self, loader, resume=None):
        _warn_about_worker_count(loader.num_workers)
        super().__init__(loader, resume)

    def _start_workers(self, loader):
        if loader._upload is not None and loader._upload.native_source is not None:
            raise ValueError("normalize_on_device=True needs worker_mode='thread'")
        collate_fn = loader.collate_fn
        default = isinstance(self._collate_fn, _SlotCollate)
        plan = _process.ProcessPlan(
            dataset=self._dataset,
            iterable=self._iterable,
            auto_collation=self._auto_collation,
            collate_fn=None if default or isinstance(self._collate_fn, _Convert) else collate_fn,
            convert_only=isinstance(self._collate_fn, _Convert),
            output=loader.output,
            drop_last=self._drop_last,
            worker_init_fn=loader.worker_init_fn,
            num_workers=self._num_workers,
            base_seed=self._base_seed,
            native=self._native_source is not None,
            loader_token=loader._token,
            max_free_slots=self._max_in_flight + 2,
            mix=_mix_plan(self),
            batch_transform=_python_batch_step(self),
            datapipe=self._datapipe,
            datapipe_seed=self._datapipe_seed,
            world=self._world,
        )
        context = loader.multiprocessing_context or _process.default_context()
        to_output = torch.from_numpy if loader.output == "torch" else None
        page_locking = None
        if loader.pin_memory and loader._upload is None and cuda.is_available():
            page_locking = _process.PageLocking(_pin_device(loader.pin_memory_device),
                                                max_waiting=self._max_in_flight)
        return _process.ProcessWorkers(plan, self._num_workers, self._max_in_flight,
                                       bool(loader.in_order), context, to_output,
                                       getattr(self._dataset, "_merge_worker_report", None),
                                       page_locking,
                                       self._tuner.setting.workers if self._tuner else None,
                                       on_times=self._timers.add)

    @property
    def _workers(self):
        """torch's attribute: the worker processes started (``is_alive()``,
        ``pid``, ``join()``); all of them unless the autotuner holds some
        back.  Empty once the workers are shut down."""
        return [channel.process for channel in self._engine.channels]

    def _note_depth(self):
        self._timers.note_depth(*self._engine.depth())

    def _already_pinned(self, tensor):
        # The slot tensors page-locked in place; torch's pin_memory() would
        # return them as they are too, after asking the driver per tensor.
        return self._engine.pinned(tensor.data_ptr())

    def _reset(self, loader):
        if not self._engine.broken:
            return super()._reset(loader)
        # A worker died last epoch: the new one starts on fresh workers.
        self._engine.close()
        _BaseIter._reset(self, loader)
        self._engine = self._start_workers(loader)
        self._epoch += 1
        self._finished = False
        self._prime()

    def _discard_in_flight(self):
        # A process cannot be interrupted between samples: wait for its
        # tasks (bounded by the loader's timeout) and drop what they made.
        timeout = self._timeout if self._timeout > 0 else None
        try:
            self._engine.discard_in_flight(timeout)
        except TimeoutError:
            self._timed_out = True
            raise RuntimeError(f"DataLoader timed out after {self._timeout} seconds") from None


def _warn_about_worker_count(num_workers):
    """torch's warning when a loader starts more worker processes than the
    CPUs this process may use (threads are not counted: they share the
    process's CPUs and take no memory of their own)."""
    cpuset_checked = hasattr(os, "sched_getaffinity")
    cpus = len(os.sched_getaffinity(0)) if cpuset_checked else os.cpu_count()
    if cpus is not None and num_workers <= cpus:
        return
    if cpus is None:
        suggestion = ("DataLoader is not able to compute a suggested max number of worker in "
                      "current system.")
    else:
        suggestion = (f"Our suggested max number of worker in current system is {cpus}"
                      f"{'' if cpuset_checked else ' (`cpuset` is not taken into account)'}, "
                      "which is smaller than what this DataLoader is going to create.")
    warnings.warn(
        f"This DataLoader will create {num_workers} worker processes in total. {suggestion} "
        "Please be aware that excessive worker creation might get DataLoader running slow or "
        "even freeze, lower the worker number to avoid potential slowness/freeze if necessary.",
        stacklevel=3)


def _accelerator_available():
    if torch is None:
        return False
    accelerator = getattr(torch, "accelerator", None)
    return bool(accelerator is not None and accelerator.is_available())
