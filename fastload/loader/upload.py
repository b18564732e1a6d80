"""The upload stage of ``DataLoader(device="cuda")``.

One thread owns one non-blocking CUDA stream.  It takes each host batch as
the engine produced it: NumPy arrays over page-locked slots, never made
into tensors on the host (the loader skips that conversion when it
uploads).  One call a batch, ``CudaStream.upload``, walks the batch in C,
enqueues one ``cuMemcpyHtoDAsync`` per array into device buffers from the
loader's device pool, records an event, and returns the batch over device
arrays, which the thread queues for the training loop; then it goes on to
the next batch, so uploads overlap decoding and compute.  The stream keeps
the host batch until its event completes, then lets it go, and its slots
return to the host pool.

The consumer turns device arrays into torch tensors with
``torch.from_dlpack`` in its own thread: the DLPack exchange makes the
consumer's current stream wait for the batch's event on the GPU, so the loop
never reads a buffer before its copy is done and the host never blocks.
A channels_last image batch is uploaded as its NHWC memory and exported
with its strides, so the tensor is channels_last as on the host.  At most
``depth`` uploaded batches wait in the queue: the prefetch bound holds for
device memory too.
"""

import queue
import re
import threading

from .. import _C
from .._torch import torch
from ..observe.profiler import next_range, torch_profiling
from ..datasets import native as _native
from ..observe.stats import UPLOAD, ConsumerClock, clock_ns


_POLL_S = 0.05  # how often a blocked upload thread checks for close()


class DeviceIter:
    """Iterates device batches uploaded from ``pump``'s host batches."""

    def __init__(self, pump, to_torch, normalize=None, clock=None):
        self._pump = pump
        self._clock = clock  # the loop's waits (fastload.stats.ConsumerClock), or None
        self._to_torch = to_torch
        self._normalize = normalize  # (mul, add, dtype) for the image array, or None
        self._done = False

    def __iter__(self):
        return self

    def __len__(self):
        return len(self._pump.host)

    def __next__(self):
        if torch_profiling():
            with next_range("enumerate(DataLoader)#DeviceIter.__next__"):
                return self._next()
        return self._next()

    def _next(self):
        if self._done:
            raise StopIteration
        called_at = clock_ns()
        if self._clock is not None:
            ready = self._pump.ready.qsize()
            self._clock.note_depth(ready, ready)
        item = self._pump.next_item()
        if item is None:  # stopped: a new epoch of a persistent loader took over
            self._done = True
            raise StopIteration
        if item[0] != "batch":
            self._done = True
            self._pump.close()
            if item[0] == "error":
                raise item[1]
            raise StopIteration
        batch = item[1]
        if self._to_torch:
            batch = _tensors(batch, self._normalize)
        if self._clock is not None:
            self._clock.handed_over(called_at)
        return batch

    def __del__(self):
        # Dropped mid-epoch: the thread stops after the batch it is on.
        self._pump.stop.set()


class Pump:
    """The upload thread and what it uses.  It holds no reference to the
    DeviceIter, so dropping the iterator mid-epoch collects it and stops
    the thread."""

    def __init__(self, host_iter, stream, pool, depth, timers=None, row=None, gpu=None):
        self.host = host_iter
        self._stream = stream
        self._pool = pool
        self._gpu = gpu  # GpuDecoding: batches carry a GPU part to decode
        self._timers, self._row = timers, row  # where the upload's time goes, or None
        self.ready = queue.Queue(maxsize=max(1, depth))
        self.stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fastload-upload", daemon=True)
        self._thread.start()

    def next_item(self):
        """The next ("batch" | "end" | "error", ...) item, or None once the
        thread was stopped and nothing is left."""
        while True:
            try:
                return self.ready.get(timeout=_POLL_S)
            except queue.Empty:
                if not self._thread.is_alive():
                    try:  # it may have queued its last item just before ending
                        return self.ready.get_nowait()
                    except queue.Empty:
                        return None

    def close(self):
        """Stops the thread and waits for it (a batch it is waiting for
        arrives first)."""
        self.stop.set()
        while self._thread.is_alive():
            self._discard_ready()  # a thread waiting to queue a batch goes on, then ends
            self._thread.join(timeout=_POLL_S)  # returns as soon as it has ended

    def _discard_ready(self):
        while True:
            try:
                self.ready.get_nowait()
            except queue.Empty:
                return

    def _run(self):
        stream = self._stream
        try:
            gpu = self._gpu
            for batch in self.host:
                started = clock_ns()
                if gpu is None:
                    device_batch, _ = stream.upload(batch, self._pool)
                else:
                    device_batch, _ = stream.upload(batch, self._pool, gpu.decoder)
                    gpu.after_batch()
                if self._timers is not None:
                    self._timers.add_stage(self._row, UPLOAD, started, clock_ns())
                del batch  # the stream keeps it until its copies are done
                if not self._put(("batch", device_batch)) or self.stop.is_set():
                    return
            self._put(("end",))
        except BaseException as error:  # the consumer re-raises it
            self._put(("error", error))
        finally:
            stream.synchronize()  # host memory is read until then

    def _put(self, item):
        while not self.stop.is_set():
            try:
                self.ready.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                self._stream.collect()  # the loop is behind: let go of copied host batches
        return False


def _tensors(batch, normalize):
    """The device batch with each DeviceArray as a torch tensor; the first
    array (the images) normalised on the device when ``normalize`` is set."""
    state = [normalize]
    return _to_torch(batch, state)


def _to_torch(x, state):
    # A module function, not a closure (a recursive closure is a reference cycle).
    if type(x) is _C.DeviceArray:
        tensor = torch.from_dlpack(x)  # the current stream waits for the upload
        normalize, state[0] = state[0], None
        return tensor if normalize is None else _normalize(tensor, *normalize)
    if isinstance(x, dict):
        return type(x)((k, _to_torch(v, state)) for k, v in x.items())
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return type(x)(*(_to_torch(v, state) for v in x))
    if isinstance(x, (list, tuple)):
        return type(x)(_to_torch(v, state) for v in x)
    return x


def _normalize(images, mul, add, dtype):
    """uint8 (N, C, H, W) images to ``images * mul + add`` per channel,
    computed in float32 as the host pipeline computes it, then cast to
    ``dtype``; a channels_last batch keeps its memory format."""
    mul = torch.tensor(mul, dtype=torch.float32, device=images.device).view(1, -1, 1, 1)
    add = torch.tensor(add, dtype=torch.float32, device=images.device).view(1, -1, 1, 1)
    return images.to(torch.float32).mul_(mul).add_(add).to(getattr(torch, dtype))


# What a batch's GPU part may hold per image (gpu_split's budgets): its JPEG
# bytes (on the host), its resize's table entries, and its decoded pixels
# (the stage's device pool: 3 bytes a pixel).  Budgets are per batch, so a
# large image fits when others are small; past them, the workers decode.
GPU_BYTES_PER_IMAGE = 512 << 10
GPU_TABLE_ENTRIES_PER_IMAGE = 64 << 10
GPU_PIXELS_PER_IMAGE = 1 << 20


class GpuDecoding:
    """decode_device="cuda" or "auto": the dataset's source whose batches leave
    JPEGs to the GPU, the GpuDecoder that decodes them, and the split's
    controller (fastload.loader.decode_split), fed after each batch by the
    upload thread: the workers' costs from the batch's GPU part, the GPU's
    from the stage's timing events."""

    EXPLORE = 16  # with "auto", every 16th batch keeps one image on each side

    def __init__(self, loader, device_index):
        from .. import cuda
        from .decode_split import DecodeSplit

        dataset = loader.dataset
        maker = getattr(dataset, "_gpu_split_source", None)
        budgets = (GPU_BYTES_PER_IMAGE, GPU_TABLE_ENTRIES_PER_IMAGE, GPU_PIXELS_PER_IMAGE)
        self.split = DecodeSplit(loader.decode_device, max(1, loader.num_workers),
                                 explore=self.EXPLORE)
        explore = self.EXPLORE if loader.decode_device == "auto" else 0
        self.source = (maker(budgets, explore) if maker is not None and loader.batch_size
                       else None)
        if self.source is None:
            raise ValueError(
                f"decode_device={loader.decode_device!r} needs a fastload image dataset "
                "(ImageFolder, ImageFiles, WebDataset, ...) whose transform is a "
                "fastload.transforms.Compose of crops, resize, flip, ToTensor and Normalize, "
                "and batches (batch_size)")
        self.source.gpu_share = self.split.share
        self.decoder = _C.GpuDecoder(device_index, dataset._plan, dataset.decode == "exact",
                                     dataset.max_pixels, loader.batch_size, budgets[1],
                                     budgets[2], True, cuda._library_folders("nvjpeg"),
                                     cuda._library_folders("nvrtc"))
        self.gpu_images = self.cpu_images = 0
        self._gpu_cost = None  # seconds a GPU image, from the latest timed batches

    def after_batch(self):
        """On the upload thread, after each batch: counts, and with "auto"
        the controller's new share for the next batches."""
        last = self.decoder.last_batch
        self.gpu_images += last["gpu_images"]
        self.cpu_images += last["worker_cpu_images"] + last["cpu_fallbacks"]
        images, seconds = self.decoder.take_timing()
        if images:
            self._gpu_cost = seconds / images
        if self.split.mode != "auto":
            return
        gpu = last["worker_gpu_images"] if self._gpu_cost is not None else 0
        self.split.observe(last["worker_cpu_images"], last["worker_cpu_seconds"], gpu,
                           last["worker_prep_seconds"], gpu * (self._gpu_cost or 0.0))
        self.source.gpu_share = self.split.share

    def report(self):
        return {**self.split.as_dict(), "backend": self.decoder.backend,
                "gpu_images": self.gpu_images, "cpu_images": self.cpu_images}


def pin_device(pin_memory_device):
    """The device whose context page-locks the slots (any: they are portable)."""
    match = re.fullmatch(r"cuda:(\d+)", str(pin_memory_device or ""))
    return int(match.group(1)) if match else 0


class Upload:
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
        self.gpu = None           # the GPU decode stage, with decode_device="cuda"/"auto"
        if loader.normalize_on_device:
            source = _native.source_of(loader.dataset, uint8=True)
            if source is None:
                raise ValueError(
                    "normalize_on_device=True needs a fastload image dataset whose transform "
                    "is a fastload.transforms.Compose ending in ToTensor (and Normalize)")
            self.native_source = source
            self.normalize = loader.dataset._device_normalization()
        if loader.decode_device != "cpu":
            self.gpu = GpuDecoding(loader, device_index)
            self.native_source = self.gpu.source
        self._pump = None

    @property
    def decoder(self):
        return self.gpu.decoder if self.gpu is not None else None

    def gpu_decode_report(self):
        return self.gpu.report() if self.gpu is not None else None

    def stop(self):
        if self._pump is not None:
            self._pump.close()
            self._pump = None

    def start(self, host_iter, timers):
        self._pump = Pump(host_iter, self.stream, self.pool, self.depth, timers.timers,
                          timers.upload_row, self.gpu)
        return DeviceIter(self._pump, self.to_torch, self.normalize,
                          ConsumerClock(timers.timers))


def pin(data, pinned=None):
    """Page-locks the tensors in a batch (only reached with an accelerator),
    except those `pinned(tensor)` says fastload page-locked already."""
    if pinned is not None and isinstance(data, torch.Tensor) and pinned(data):
        return data
    if hasattr(data, "pin_memory"):  # tensors, and custom batch types that opt in
        return data.pin_memory()
    if isinstance(data, dict):
        return type(data)({k: pin(v, pinned) for k, v in data.items()})
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return type(data)(*(pin(v, pinned) for v in data))
    if isinstance(data, (list, tuple)):
        return type(data)(pin(v, pinned) for v in data)
    return data
