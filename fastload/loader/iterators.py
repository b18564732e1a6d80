"""The iterators a DataLoader returns, one per worker kind.

``SingleThreadIter`` fetches on the calling thread (``num_workers=0``);
``ThreadedIter`` drives the C engine's worker threads (``_C.Engine``);
``ProcessIter`` the same rules over worker processes
(``process_engine.ProcessWorkers``).  The main-thread scheduling mirrors
torch's multi-process iterator: batches go to workers round-robin, at most
``num_workers * prefetch_factor`` are in flight, one new batch is
requested per batch delivered, and a worker whose iterable shard ends stops
receiving work.  So the same samplers and generators give the same batches
in the same order.
"""

import atexit
import collections
import os
import time
import warnings
import weakref

from .. import _C, cuda
from .._random import draw_seed
from .._torch import torch
from ..datasets import native as _native
from ..observe import profiler
from ..observe.stats import ConsumerClock, clock_ns
from ..transforms import batch as _batch_transform
from . import autotune as _autotune, node as _node, process_engine as _process, resume as _resume
from . import torch_compat as _torch_compat
from .collate import collation, default_collate, output_converter
from .sampler import BatchSampler, RandomSampler, SequentialSampler
from .upload import pin, pin_device
from .engine import ThreadEngine
from .worker import (ExceptionWrapper, FetchPlan, StopFlag, Worker, get_worker_info,
                     make_fetcher)


_TRACE_NAMES = {None: "_SingleThreadIter", "thread": "_ThreadedIter", "process": "_ProcessIter"}


class _BaseIter:
    _already_pinned = None  # tensor -> bool, for pin(); None: ask torch
    _kind = None            # the workers' kind: None (no workers), "thread" or "process"

    def __init__(self, loader, resume=None):
        self._dataset = loader.dataset
        self._iterable = loader._dataset_kind == "iterable"
        self._IterableDataset_len_called = loader._IterableDataset_len_called
        self._auto_collation = loader._auto_collation
        self._drop_last = loader.drop_last
        self._index_sampler = loader._index_sampler
        self._num_workers = loader.num_workers
        self._timeout = loader.timeout
        self._collation = collation(loader)
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
        # A source filled part by part is readied for each batch where the
        # indices are drawn (worker processes ready their own copies).
        self._ready = (_native.readier(self._dataset)
                       if self._native_source is not None
                       and getattr(self, "_kind", None) != "process" else None)
        # Samples brought onto the node (remote shards) where the indices are
        # drawn, when _ready runs elsewhere or not at all.
        self._fetch = _native.fetcher(self._dataset) if self._ready is None else None
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

    # On the class, not looked up in the module: an iterator still alive at
    # interpreter exit is dropped (__del__ -> _leave) after module globals
    # may have been cleared.
    _getpid = staticmethod(os.getpid)

    def _pid_ok(self):
        return getattr(self, "_pid", None) in (None, self._getpid())

    def _reset(self, loader):
        profiler.sync()
        self._sampler_iter = self._open_epoch(loader)
        self._seed_datapipe(loader)  # after iter(sampler), as torch's _reset
        if self._clock is not None:
            self._clock.last = 0  # the time between epochs is not the loop's
        self._finished = False
        self._num_yielded = 0
        self._batch_number = 0
        self._unfetched = None
        self._sizes.clear()
        self._samples_yielded = 0
        self._batching = _resume.batching(loader)  # the sampler's epoch may be new
        self._IterableDataset_len_called = loader._IterableDataset_len_called

    _unfetched = None  # a batch's indices drawn, not brought onto the node in time

    def _next_index(self):
        if self._unfetched is not None:  # its download timed out: tried again
            index, self._unfetched = self._unfetched, None
        else:
            index = next(self._sampler_iter)
        self._bring(index)
        self._batch_number += 1
        if self._counts_samples:
            self._sizes.append(len(index) if self._auto_collation else 1)
        return index

    def _bring(self, index):
        """Readies the batch ``index`` (``_ready`` or ``_fetch``: remote
        shards downloaded), within the loader's ``timeout``: a wait for a
        download is a wait for a batch.  When it times out the indices are
        kept, to be tried again by the next call, and torch's error is
        raised with what the dataset waited for (the shard's URL)."""
        bring = self._ready if self._ready is not None else self._fetch
        if bring is None:
            return
        if not self._timeout:
            bring(index)
            return
        try:
            bring(index, timeout=self._timeout)
        except TimeoutError as error:
            self._unfetched = index
            self._timed_out = True
            raise RuntimeError(f"DataLoader timed out after {self._timeout} seconds: "
                               f"{error}") from None

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
        # torch's form of the range's name: profiler views file it under
        # DataLoader.  The iterator names are those traces have always shown.
        return f"enumerate(DataLoader)#{_TRACE_NAMES[self._kind]}.__next__"

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
            data = pin(data, self._already_pinned)
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


class SingleThreadIter(_BaseIter):
    """num_workers=0: everything happens in the calling thread."""

    def __init__(self, loader, resume=None):
        super().__init__(loader, resume)
        if self._timeout != 0:
            raise AssertionError("timeout requires num_workers > 0 (as in torch)")
        if self._datapipe is not None:
            # The distributed rank's shard (the whole stream on one process).
            _torch_compat.shard_datapipe(self._dataset, 1, 0, self._world)
        plan = _fetch_plan(self, loader, num_workers=0)
        plan = plan.bind(loader._slot_pool, converts=_converts_on_host(self, loader),
                         source=self._native_source)
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


def iterator_class(loader):
    """The iterator class for ``loader``."""
    return SingleThreadIter if loader.num_workers == 0 else WorkerIter


def worker_mode(loader):
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
    if it._iterable or not it._auto_collation or it._collation != "default":
        return None
    if isinstance(loader._batch_step, _batch_transform.CallStep):
        return None
    if loader._upload is not None and loader._upload.native_source is not None:
        return loader._upload.native_source  # uint8, normalized on the device
    return _native.source_of(it._dataset)


def _mix_plan(it):
    """The MixUp/CutMix plan the native batch job runs, or None."""
    step = it._batch_step
    return step.plan if isinstance(step, _batch_transform.MixStep) else None


def _python_batch_step(it):
    """The batch_transform a worker applies to batches it collates in
    Python (the native path runs a MixStep in the batch job instead)."""
    return it._batch_step if it._native_source is None else None


def _converts_on_host(it, loader):
    """Whether slot arrays become the output type on the host.  Not when the
    upload stage takes the batches: it copies the NumPy slots as they are and
    the tensors are made on the device (fastload.loader.upload), unless a
    batch_transform of the user's reads the batches first (it gets what it
    would get without device=)."""
    return loader._upload is None or isinstance(_python_batch_step(it), _batch_transform.CallStep)


def _fetch_plan(it, loader, num_workers):
    """The iterator's FetchPlan: what its workers fetch, unbound."""
    return FetchPlan(
        dataset=it._dataset,
        iterable=it._iterable,
        auto_collation=it._auto_collation,
        collation=it._collation,
        output=loader.output,
        drop_last=it._drop_last,
        worker_init_fn=loader.worker_init_fn,
        num_workers=num_workers,
        base_seed=it._base_seed,
        native=it._native_source is not None,
        mix=_mix_plan(it),
        loader_token=loader._token,
        batch_transform=_python_batch_step(it),
        datapipe=it._datapipe,
        datapipe_seed=it._datapipe_seed,
        world=it._world,
        cpus=loader._worker_cpus,
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


class WorkerIter(_BaseIter):
    """num_workers > 0: batches are fetched by an engine's workers (threads
    or processes, ``worker_mode``), scheduled as torch schedules them (see
    the module docstring and ``engine.Engine``)."""

    _timed_out = False  # a wait for a batch has timed out: workers may be stuck

    def __init__(self, loader, resume=None):
        self._kind = worker_mode(loader)
        if self._kind == "process":
            warn_about_worker_count(loader.num_workers)
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
        if self._kind == "process":
            return _start_processes(self, loader)
        return _start_threads(self, loader)

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
        """Persistent workers: a new epoch on the same workers, or on new
        ones when a worker died in the last (the engine is broken)."""
        if self._engine.broken:
            self._engine.close(_SHUTDOWN_GRACE_SECONDS)
            super()._reset(loader)
            self._engine = self._start_workers(loader)
        else:
            super()._reset(loader)
            self._held = None
            self._discard_in_flight()
            self._engine.reset()
        self._epoch += 1
        self._finished = False
        self._prime()

    def _discard_in_flight(self):
        # The wait for the batches still out is a wait for a batch, so the
        # loader's timeout bounds it.
        timeout = self._timeout if self._timeout > 0 else None
        try:
            self._engine.discard_in_flight(timeout)
        except TimeoutError:
            self._timed_out = True
            raise RuntimeError(f"DataLoader timed out after {self._timeout} seconds") from None

    @property
    def _workers(self):
        """torch's attribute: the workers started (processes: ``is_alive()``,
        ``pid``, ``join()``); all of them unless the autotuner holds some
        back.  Empty once worker processes are shut down."""
        return self._engine.workers

    def _note_depth(self):
        self._engine.note_depth(self._timers)

    def _already_pinned(self, tensor):
        # Slot tensors a process engine page-locked in place; torch's
        # pin_memory() would return them as they are too, after asking the
        # driver per tensor.
        return self._engine.pinned(tensor.data_ptr())

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
            # False: every worker has retired; the index is dropped, as torch does.
            self._engine.submit(self._request(index))

    def _next_delivery(self, timeout):
        """``engine.next(timeout)``, recording in ``_waited`` how long the
        consumer waited for it when a tuner needs to know."""
        if self._tuner is None or not self._tuner.adapting:
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
            if self._held is not None:  # delivered when the next batch's download timed out
                delivered, self._held = self._held, None
                outcome, worker, value = delivered
            else:
                try:
                    delivered = self._next_delivery(timeout)
                except TimeoutError:
                    self._timed_out = True
                    raise RuntimeError(
                        f"DataLoader timed out after {self._timeout} seconds") from None
                if delivered is None:
                    self._finished = True
                    if not self._persistent:
                        self._shutdown()
                    raise StopIteration
                outcome, worker, value = delivered
                if outcome in (_C.JOB_SKIPPED, _C.JOB_CANCELLED):
                    continue
                if self._tuner is not None and self._tuner.adapting:
                    self._apply(self._tuner.observe(time.perf_counter(), self._waited,
                                                    _autotune.batch_nbytes(value)))
            self._put_index_holding(delivered)
            if outcome in (_C.JOB_DONE, _C.JOB_FAILED):
                self._handed_out()  # not before: a held batch is not handed out (state_dict)
            if outcome == _C.JOB_RETIRE:
                continue
            if outcome == _C.JOB_FAILED:  # a native batch's error, raised as a worker's
                value = ExceptionWrapper((type(value), value, value.__traceback__),
                                         f"in DataLoader worker {worker}")
            if isinstance(value, ExceptionWrapper):
                value.reraise()
            return value

    _held = None  # (outcome, worker, value) delivered, not handed out yet

    def _put_index_holding(self, delivered):
        """``_try_put_index()``; when the next batch's download times out,
        the batch just ``delivered`` is held for the next call (which tries
        that download again first), and the timeout raised."""
        try:
            self._try_put_index()
        except RuntimeError:
            if self._unfetched is not None:
                self._held = delivered
            raise

    def _shutdown(self):
        engine = getattr(self, "_engine", None)
        if engine is not None and not engine.closed:
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


def _start_threads(it, loader):
    """The thread engine for iterator ``it``: ``Worker`` threads under
    ``_C.Engine``."""
    converts = _converts_on_host(it, loader)
    plan = _fetch_plan(it, loader, it._num_workers)
    plan = plan.bind(loader._slot_pool, converts=converts, source=it._native_source)
    workers = [Worker(i, plan, it._stop_flag) for i in range(it._num_workers)]
    _torch_compat.route_torch_worker_info(get_worker_info)
    if it._native_source is None:
        engine = _C.Engine(workers, it._max_in_flight, bool(loader.in_order), stats=it._timers,
                           cpus=loader._worker_cpus)
    else:
        # Native jobs: each batch runs in C on a worker, without the GIL.
        engine = _C.Engine(workers, it._max_in_flight, bool(loader.in_order),
                           source=it._native_source, pool=loader._slot_pool,
                           convert=output_converter(loader.output) if converts else None,
                           seed=it._base_seed,
                           report=_native.skip_reporter(it._dataset), stats=it._timers,
                           mix=_mix_plan(it), cpus=loader._worker_cpus)
    return ThreadEngine(engine, workers, it._stop_flag)


def _start_processes(it, loader):
    """The process engine for iterator ``it``: ``ProcessWorkers``."""
    if loader._upload is not None and loader._upload.native_source is not None:
        option = ("normalize_on_device=True" if loader.normalize_on_device
                  else f"decode_device={loader.decode_device!r}")
        raise ValueError(f"{option} needs worker_mode='thread'")
    plan = _fetch_plan(it, loader, it._num_workers)  # pickled to each worker
    context = loader.multiprocessing_context or _process.default_context()
    page_locking = None
    if loader.pin_memory and loader._upload is None and cuda.is_available():
        page_locking = _process.PageLocking(pin_device(loader.pin_memory_device),
                                            max_waiting=it._max_in_flight)
    # The parent converts (the workers never do); an upload needs no conversion.
    to_output = output_converter(loader.output) if loader._upload is None else None
    return _process.ProcessWorkers(plan, it._num_workers, it._max_in_flight,
                                   bool(loader.in_order), context, to_output,
                                   getattr(it._dataset, "_merge_worker_report", None),
                                   page_locking,
                                   it._tuner.setting.workers if it._tuner else None,
                                   on_times=it._timers.add)


def warn_about_worker_count(num_workers):
    """torch's warning when a loader starts more worker processes than the
    CPUs this rank may use (its share of the node: loader/node.py; threads
    are not counted: they share the process's CPUs and take no memory of
    their own)."""
    cpuset_checked = hasattr(os, "sched_getaffinity")
    cpus = _node.rank_cores() if cpuset_checked else os.cpu_count()
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
