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

import multiprocessing
import os
import threading
import uuid
import weakref
from typing import Generic, TypeVar

from .. import _C, cuda
from .._torch import torch
from ..datasets.base import is_iterable_dataset
from ..transforms import batch as _batch_transform
from ..observe.stats import LoaderStats, LoaderTimers
from . import autotune as _autotune, node as _node, resume as _resume
from . import torch_compat as _torch_compat
from .collate import default_collate, default_convert
from . import iterators
from .decode_split import MODES as DECODE_MODES
from .sampler import BatchSampler, RandomSampler, SequentialSampler
from .upload import Upload, pin_device
from .worker import current_loader_token

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
    * ``decode_device``: "cpu" (default) or, with ``device="cuda"`` and a
      fastload image dataset whose transform the GPU runs (crops, resize,
      flip, ToTensor, Normalize), "cuda": the workers read each JPEG and draw
      its crop, nvJPEG decodes it on the GPU and a kernel resamples it into
      the batch (the same crops and flips as on the CPU); images the GPU
      does not take (progressive or CMYK JPEGs, PNG, WebP) are decoded by
      the workers as before.  "auto": the workers decode part of each
      batch and the GPU the rest, the split following the measured costs
      of both sides (``loader.stats()`` shows it).
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
    * ``num_workers="auto"``: a pool of as many workers as this rank's
      cores (the usable cores, divided among the ranks of the node under
      torchrun, Slurm or MPI: fastload/loader/node.py);
      it starts with all of them active and tunes the *active* workers and
      the prefetch depth by the throughput the loop sees, across epochs,
      searching again when later batches contradict its choice
      (``autotune_report()``).  Batches and their order are those
      of a fixed ``num_workers``.  ``loader.num_workers`` is then the pool
      size and ``loader.autotune`` True; ``prefetch_factor`` is the largest
      prefetch it may choose (default 8).  An IterableDataset gets a fixed
      pool (its shards follow the worker count).
    * ``max_prefetch_bytes``: with ``num_workers="auto"``, the most bytes of
      batches kept in flight (default: 1 GiB or an eighth of RAM, the
      lesser, divided among the ranks of the node).
    * ``worker_affinity``: the CPUs the workers run on.  None (default): as
      inherited.  CPU ids (an iterable of ints): every worker thread or
      process on those.  "numa": the cores of the NUMA node of this rank's
      GPU (``device``), shared evenly by the local ranks whose GPUs sit on
      it; without a ``device``, local rank r takes NUMA node
      ``r * nodes // ranks`` and shares it with the ranks mapped there.
      ``num_workers="auto"`` is then bounded by those CPUs.
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
                 worker_mode="auto", max_prefetch_bytes=None, batch_transform=None,
                 decode_device="cpu", worker_affinity=None):
        # The CPUs the workers run on (None: as inherited); decided first, as
        # they bound num_workers="auto".
        self.worker_affinity = worker_affinity
        self._worker_cpus = _worker_cpus(worker_affinity, device)
        self.autotune = isinstance(num_workers, str)
        self._autotune = None  # the autotuner, shared by this loader's iterators
        if self.autotune:
            self._autotune = _plan_autotune(num_workers, dataset, prefetch_factor,
                                            max_prefetch_bytes, self._worker_cpus)
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
        if decode_device not in DECODE_MODES:
            raise ValueError("decode_device must be 'cpu', 'cuda' or 'auto', got "
                             f"{decode_device!r}")
        self.decode_device = decode_device
        if decode_device != "cpu" and device_index is None:
            raise ValueError(f"decode_device={decode_device!r} needs device='cuda'")
        if decode_device != "cpu" and (normalize_on_device or self._batch_step is not None):
            raise ValueError(f"decode_device={decode_device!r} cannot be combined with "
                             "normalize_on_device or batch_transform yet")

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
            device=device_index if device_index is not None else pin_device(pin_memory_device))
        self._upload = Upload(self, device_index, in_flight) if device_index is not None else None
        self._timers = LoaderTimers()  # loader.stats()
        if self._autotune is not None:
            self._autotune.gil_clock = self._timers.gil_clock
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
        if self.num_workers > 0 and iterators.worker_mode(self) == "process":
            iterators.warn_about_worker_count(self.num_workers)  # here and per iterator, as torch

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
        workers = iterators.iterator_class(self)
        if self.num_workers == 0:
            it = workers(self)
            self._remember(it)
            return it
        if self.persistent_workers:
            previous = self._iterator
            if previous is not None and previous._pid != os.getpid():
                # Forked after the workers started: they are the parent's.
                # The child starts its own, as a fresh loader would.
                previous._shutdown()
                previous = self._iterator = None
            if previous is None or previous._kind != iterators.worker_mode(self):
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
        it = iterators.iterator_class(self)(self, state)
        if self.num_workers > 0 and self.persistent_workers:
            self._iterator = it
        self._remember(it)
        if it._iterable and state["in_epoch"] and not _resume.dataset_restored(state):
            # No indices to skip: the batches handed out are loaded again.
            for _ in range(state["num_yielded"]):
                next(it)
        return it

    # -- resumable state ----------------------------------------------------

    def _live_iterator(self):
        """The iterator the loader's position is that of: the persistent one,
        else the latest (None once it is gone)."""
        it = self._iterator if self.persistent_workers and self.num_workers > 0 else None
        if it is None and self._last_iter is not None:
            it = self._last_iter()
        return it

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
        it = self._live_iterator()
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
            iterators.worker_mode(self) if timers.num_workers else None, self.prefetch_factor,
            autotune=self.autotune_report(), sources=self._source_counts(),
            gpu_decode=self._upload.gpu_decode_report() if self._upload is not None else None)
        if reset:
            timers.timers.reset()
        return report

    def _source_counts(self):
        """The samples of each source handed out this epoch, when the sampler
        mixes sources (``MixSampler.source_counts``), else None."""
        if self.batch_sampler is not None and not _resume.is_flat(self.batch_sampler):
            return None  # batches of the user's: which samples went out is theirs to say
        sampler = self.sampler if self.batch_sampler is None else self.batch_sampler.sampler
        counts = getattr(sampler, "source_counts", None)
        if counts is None:
            return None
        it = self._live_iterator()
        if it is None:
            return counts(0)
        return counts(None if it._finished else it._samples_yielded)

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


def _worker_cpus(worker_affinity, device):
    """``worker_affinity`` as the sorted tuple of CPU ids the workers run
    on, or None (as inherited)."""
    if worker_affinity is None:
        return None
    if isinstance(worker_affinity, str):
        if worker_affinity != "numa":
            raise ValueError(f"worker_affinity should be None, 'numa' or CPU ids, but got "
                             f"worker_affinity={worker_affinity!r}")
        if device is None or str(device) == "cpu":
            return tuple(_node.numa_cpus())
        gpu = cuda.check_device(device)
        try:
            addresses = [_C.cuda_pci_bus_id(i) for i in range(cuda.device_count())]
        except RuntimeError as e:
            raise RuntimeError(f"worker_affinity='numa' needs the GPUs' PCI addresses: {e}") \
                from None
        return tuple(_node.numa_cpus(gpu, addresses))
    try:
        cpus = sorted(set(worker_affinity))
    except TypeError:
        raise ValueError(f"worker_affinity should be None, 'numa' or CPU ids, but got "
                         f"worker_affinity={worker_affinity!r}") from None
    if not cpus or not all(isinstance(c, int) and not isinstance(c, bool) and 0 <= c < 1024
                           for c in cpus):
        raise ValueError(f"worker_affinity needs CPU ids in 0..1023, but got "
                         f"worker_affinity={worker_affinity!r}")
    return tuple(cpus)


def _plan_autotune(num_workers, dataset, prefetch_factor, max_prefetch_bytes, cpus=None):
    """The autotuner for ``num_workers="auto"``, after checking the
    arguments that go with it.  ``cpus``: the workers' CPUs, when
    ``worker_affinity`` names them (else this rank's share of the node)."""
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
    # Several ranks on one node share its cores and memory (loader/node.py).
    workers = min(len(cpus) if cpus else _node.rank_cores(), _MAX_WORKERS)
    if max_prefetch_bytes is None:
        max_prefetch_bytes = _node.rank_max_bytes()
    if is_iterable_dataset(dataset):
        # Each worker reads its own shard: a worker left idle would drop its
        # data, so the count is fixed.
        return _autotune.Autotuner.fixed(
            workers, prefetch_factor or _autotune.START_PREFETCH,
            "an IterableDataset's shards follow the worker count: fixed at the usable cores")
    return _autotune.Autotuner(workers, max_prefetch, max_prefetch_bytes)
