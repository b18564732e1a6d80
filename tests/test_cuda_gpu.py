"""pin_memory and device="cuda" on a real GPU: page-locked slots, uploaded
batches equal to the host batches, stream ordering while the GPU is busy,
flat device memory over many epochs, DLPack and CUDA Array Interface
consumers (torch, CuPy), normalize_on_device, and fork() after CUDA use.

tests/test_cuda_upload.py checks the same paths against a fake driver on
machines without a GPU; this module needs one and a torch built with CUDA,
and is skipped otherwise.  The reference for every uploaded batch is a
host loader over the same dataset with the same generator seed: both draw
the same indices and worker seeds, so their batches must be equal.
"""

import gc
import os
import pathlib
import sys
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import fastload  # noqa: E402
from fastload import transforms as T  # noqa: E402
from fl_helpers import IS_SHIM, fastload_only  # noqa: E402


def _why_no_gpu():
    """None when both fastload and torch can use a CUDA device, else why not."""
    if IS_SHIM:
        return "fastload-only feature (suite is running against the torch shim)"
    if not fastload.cuda.is_available():
        return f"needs a CUDA GPU (fastload: {fastload.cuda._status()['error']})"
    if not torch.cuda.is_available():
        return f"needs torch with CUDA (torch {torch.__version__} has no usable CUDA device)"
    return None


_NO_GPU = _why_no_gpu()

pytestmark = [
    pytest.mark.gpu,
    fastload_only,
    pytest.mark.skipif(_NO_GPU is not None, reason=_NO_GPU or ""),
]

CUDA0 = torch.device("cuda", 0)
# torch.cuda._sleep spins a kernel for this many clock cycles (about a
# millisecond): queued before a batch is read, it keeps the consumer's
# stream behind the host, so a buffer reused too early would be caught.
SLEEP_CYCLES = 2_000_000
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


def loader_pair(dataset, seed, **kwargs):
    """A host loader and a cuda:0 loader drawing the same batches."""
    device = kwargs.pop("device", "cuda")
    host = fastload.DataLoader(dataset, generator=torch.Generator().manual_seed(seed), **kwargs)
    gpu = fastload.DataLoader(dataset, generator=torch.Generator().manual_seed(seed),
                              device=device, **kwargs)
    return host, gpu


def integer_rows(n, width, seed=0):
    """float32 rows of small integers: sums are exact in any order, so GPU
    reductions can be compared with host ones by ==."""
    return np.random.default_rng(seed).integers(0, 100, (n, width)).astype(np.float32)


def assert_uploaded(actual, expected, path="batch"):
    """`actual` is `expected` (a host batch) moved to cuda:0: same structure,
    tensors on cuda:0 with the same dtype, shape and values; other leaves
    unchanged."""
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), f"{path}: {type(actual).__name__}"
        assert actual.device == CUDA0, f"{path}: on {actual.device}"
        assert actual.dtype == expected.dtype, f"{path}: {actual.dtype} != {expected.dtype}"
        assert actual.shape == expected.shape, f"{path}: {actual.shape} != {expected.shape}"
        # NumPy compares every dtype (torch.equal lacks some, uint16 among them).
        assert np.array_equal(actual.cpu().numpy(), expected.numpy()), f"{path}: values differ"
    elif isinstance(expected, dict):
        assert type(actual) is type(expected) and list(actual) == list(expected), path
        for key in expected:
            assert_uploaded(actual[key], expected[key], f"{path}[{key!r}]")
    elif isinstance(expected, (list, tuple)):
        assert type(actual) is type(expected) and len(actual) == len(expected), path
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_uploaded(a, e, f"{path}[{i}]")
    else:
        assert actual == expected, f"{path}: {actual!r} != {expected!r}"


def assert_same_epochs(host, gpu, epochs=2):
    assert len(gpu) == len(host)
    for epoch in range(epochs):
        n = 0
        for expected, actual in zip(host, gpu):
            assert_uploaded(actual, expected, f"epoch {epoch} batch {n}")
            n += 1
        assert n == len(host), f"epoch {epoch}: {n} batches, expected {len(host)}"


class Samples:
    """A Python map dataset of dicts: arrays of several dtypes and shapes, an
    int, and a string (which stays on the host)."""

    def __len__(self):
        return 29

    def __getitem__(self, i):
        return {
            "image": np.full((3, 4, 5), i, np.float32) + np.arange(5, dtype=np.float32),
            "mask": (np.arange(6, dtype=np.uint8) + i) % 7,
            "pair": (np.int64(i) * 3, np.array([i, -i], np.int16)),
            "id": i,
            "name": f"s{i}",
        }


# ------------------------------------------------------------ pinned slots


@pytest.mark.parametrize("output", ["torch", "numpy"])
@pytest.mark.parametrize("workers", [0, 2])
def test_pin_memory_batches_are_page_locked(workers, output):
    ds = fastload.ArrayDataset(integer_rows(40, 64), np.arange(40, dtype=np.int64))

    def batches(pin):
        loader = fastload.DataLoader(ds, batch_size=8, shuffle=True, num_workers=workers,
                                     pin_memory=pin, output=output,
                                     generator=torch.Generator().manual_seed(1))
        return [[torch.as_tensor(x) for x in batch] for batch in loader]

    pinned, plain = batches(True), batches(False)
    assert len(pinned) == len(plain) == 5
    for p, q in zip(pinned, plain):
        # NumPy output is never pinned by torch: a pinned array is fastload's slot.
        assert all(t.is_pinned() for t in p)
        assert not any(t.is_pinned() for t in q)  # the check above means something
        assert all(torch.equal(a, b) for a, b in zip(p, q))


def test_pin_memory_pins_python_dataset_batches():
    loader = fastload.DataLoader(Samples(), batch_size=4, num_workers=2, pin_memory=True)
    for batch in loader:
        assert batch["image"].is_pinned() and batch["mask"].is_pinned()
        assert batch["id"].is_pinned() and batch["pair"][1].is_pinned()


def test_non_blocking_copies_from_pinned_batches_read_the_right_rows():
    """What README recommends without device=: pin_memory=True, then
    .to("cuda", non_blocking=True).  The loop drops each host batch while its
    copy still waits behind GPU work; the slot must not be refilled with a
    later batch before the copy has read it."""
    rows = integer_rows(64, 4096)
    ds = fastload.ArrayDataset(rows)
    kwargs = dict(batch_size=4, shuffle=True, num_workers=2, persistent_workers=True)
    loader = fastload.DataLoader(ds, pin_memory=True, generator=torch.Generator().manual_seed(2),
                                 **kwargs)
    reference = fastload.DataLoader(ds, generator=torch.Generator().manual_seed(2), **kwargs)
    for epoch in range(3):
        sums = []
        for (x,) in loader:
            torch.cuda._sleep(SLEEP_CYCLES)
            sums.append(x.to(CUDA0, non_blocking=True).sum(dim=1, dtype=torch.float64))
        torch.cuda.synchronize()
        expected = [x.sum(dim=1, dtype=torch.float64) for (x,) in reference]
        assert len(sums) == len(expected) == 16
        for k, (got, want) in enumerate(zip(sums, expected)):
            assert torch.equal(got.cpu(), want), f"epoch {epoch} batch {k}: wrong rows"


class PythonRows:
    """A Python dataset over rows: process workers collate it into shared slots."""

    def __init__(self, rows):
        self.rows = rows

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]


def test_process_worker_slots_are_page_locked_in_place():
    """Process workers' shared slots, page-locked by the parent where they are
    mapped: batches are pinned without a copy, and a slot the loop drops while
    a non-blocking copy from it waits behind GPU work is not refilled early."""
    rows = integer_rows(64, 4096)
    kwargs = dict(batch_size=4, shuffle=True, num_workers=2, persistent_workers=True,
                  worker_mode="process")
    loader = fastload.DataLoader(PythonRows(rows), pin_memory=True,
                                 generator=torch.Generator().manual_seed(4), **kwargs)
    reference = fastload.DataLoader(PythonRows(rows), generator=torch.Generator().manual_seed(4),
                                    **kwargs)
    for epoch in range(3):
        sums = []
        for x in loader:
            assert x.is_pinned()
            assert loader._iterator._already_pinned(x)  # the slot itself, not a copy
            torch.cuda._sleep(SLEEP_CYCLES)
            sums.append(x.to(CUDA0, non_blocking=True).sum(dim=1, dtype=torch.float64))
        torch.cuda.synchronize()
        expected = [x.sum(dim=1, dtype=torch.float64) for x in reference]
        assert len(sums) == len(expected) == 16
        for k, (got, want) in enumerate(zip(sums, expected)):
            assert torch.equal(got.cpu(), want), f"epoch {epoch} batch {k}: wrong rows"


# ---------------------------------------------------------------- uploads


@pytest.mark.parametrize("workers, device", [(0, "cuda"), (2, "cuda:0")])
def test_uploaded_array_batches_equal_the_host_batches(workers, device):
    n = 45  # not a multiple of the batch size: the last batch is short
    rng = np.random.default_rng(3)
    ds = fastload.ArrayDataset(rng.standard_normal((n, 5, 7)).astype(np.float32),
                               rng.integers(0, 65536, (n, 3)).astype(np.uint16),
                               rng.integers(-2**40, 2**40, n))
    host, gpu = loader_pair(ds, seed=4, batch_size=6, shuffle=True, num_workers=workers,
                            device=device)
    assert_same_epochs(host, gpu)


@pytest.mark.parametrize("workers", [0, 2])
def test_uploaded_python_dataset_batches_equal_the_host_batches(workers):
    host, gpu = loader_pair(Samples(), seed=5, batch_size=4, shuffle=True, num_workers=workers)
    assert_same_epochs(host, gpu)
    batch = next(iter(gpu))
    assert isinstance(batch["name"], list) and isinstance(batch["name"][0], str)


@pytest.mark.parametrize("stream", ["default", "side"])
def test_consumer_stream_waits_for_the_upload(stream):
    """Each batch is read by a kernel queued behind a long sleep on the
    consumer's stream, and dropped by Python before that kernel runs: the
    loop must see every batch's own values (the consumer stream waits for
    the upload, and the buffer is not refilled until the kernel is done)."""
    rows = integer_rows(96, 16384)  # 64 KiB rows
    host, gpu = loader_pair(fastload.ArrayDataset(rows), seed=6, batch_size=8, shuffle=True,
                            num_workers=2)
    consumer = torch.cuda.Stream() if stream == "side" else torch.cuda.current_stream()
    for epoch in range(2):
        outs = []
        with torch.cuda.stream(consumer):
            torch.cuda._sleep(SLEEP_CYCLES)  # busy before the first batch arrives
            for batch in gpu:
                torch.cuda._sleep(SLEEP_CYCLES)
                outs.append((batch[0] * 2).sum(dtype=torch.float64))
            del batch
        torch.cuda.synchronize()
        expected = [(x * 2).sum(dtype=torch.float64).item() for (x,) in host]
        assert [o.item() for o in outs] == expected, f"epoch {epoch}"


def test_device_memory_stays_flat_over_100_epochs():
    rows = integer_rows(512, 4096)  # 16 KiB rows, 1 MiB batches: a leaked slot shows
    total = float(rows.astype(np.float64).sum())
    loader = fastload.DataLoader(fastload.ArrayDataset(rows), batch_size=64, shuffle=True,
                                 num_workers=2, device="cuda",
                                 generator=torch.Generator().manual_seed(7))
    acc = torch.zeros((), dtype=torch.float64, device=CUDA0)
    free = {}
    for epoch in range(1, 101):
        for (x,) in loader:
            acc += x.sum(dtype=torch.float64)
        del x  # no batch outlives its epoch
        if epoch in (5, 100):
            gc.collect()
            torch.cuda.synchronize()
            free[epoch] = torch.cuda.mem_get_info()[0]
    assert acc.item() == 100 * total
    # A slot leaked per epoch would be 95 MiB; a slot or two more at a rare
    # peak of in-flight batches, or another process on the GPU, a few MiB.
    drop = free[5] - free[100]
    assert drop <= 8 << 20, f"free device memory fell by {drop / 2**20:.1f} MiB over 95 epochs"


# ------------------------------------------------------ DLPack and CAI


def numpy_pair(seed=8):
    rng = np.random.default_rng(seed)
    ds = fastload.ArrayDataset(rng.standard_normal((20, 3, 4)).astype(np.float32),
                               rng.integers(0, 1000, 20))
    return loader_pair(ds, seed=seed, batch_size=8, shuffle=True, num_workers=2, output="numpy")


def test_device_arrays_export_dlpack_and_the_cuda_array_interface():
    host, gpu = numpy_pair()
    n = 0
    for expected, batch in zip(host, gpu):
        assert isinstance(batch, list) and len(batch) == 2
        for e, leaf in zip(expected, batch):
            assert isinstance(leaf, fastload._C.DeviceArray), type(leaf)
            assert leaf.shape == e.shape and leaf.dtype == e.dtype and leaf.nbytes == e.nbytes
            assert leaf.__dlpack_device__() == (2, 0)  # kDLCUDA, device 0
            cai = leaf.__cuda_array_interface__
            assert cai["version"] == 3 and cai["shape"] == e.shape
            assert np.dtype(cai["typestr"]) == e.dtype and cai["strides"] is None
            assert isinstance(cai["data"][0], int) and cai["data"][0] != 0
            assert cai["data"][1] is False
            assert isinstance(cai["stream"], int) and cai["stream"] not in (0, 1, 2)
            t = torch.from_dlpack(leaf)
            assert t.device == CUDA0 and t.dtype == torch.from_numpy(e).dtype
            assert np.array_equal(t.cpu().numpy(), e)
            side = torch.cuda.Stream()
            with torch.cuda.stream(side):  # a second export, for another stream
                again = torch.from_dlpack(leaf)
            side.synchronize()
            assert again.data_ptr() == t.data_ptr()
        n += 1
    assert n == len(host) == 3


def test_cupy_reads_device_arrays():
    with warnings.catch_warnings():  # CuPy may warn about its CUDA setup on import
        warnings.simplefilter("ignore")
        cupy = pytest.importorskip("cupy")
    try:
        cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # installed, but not for this driver
        pytest.skip(f"CuPy cannot use the GPU: {e}")
    host, gpu = numpy_pair(seed=9)
    n = 0
    for expected, batch in zip(host, gpu):
        for e, leaf in zip(expected, batch):
            by_cai = cupy.asarray(leaf)  # __cuda_array_interface__, no copy
            by_dlpack = cupy.from_dlpack(leaf)
            assert by_cai.dtype == e.dtype and by_cai.shape == e.shape
            assert by_cai.data.ptr == leaf.__cuda_array_interface__["data"][0]
            assert np.array_equal(cupy.asnumpy(by_cai), e)
            assert np.array_equal(cupy.asnumpy(by_dlpack), e)
        n += 1
    assert n == 3


# -------------------------------------------------- normalize_on_device


@pytest.fixture(scope="module")
def image_folder(tmp_path_factory):
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "benchmarks"))
    import imagenet_like

    root = tmp_path_factory.mktemp("gpu_images")
    return imagenet_like.make_image_folder(str(root), n_images=40, n_classes=4, processes=1)


def test_normalize_on_device_equals_the_uint8_host_path(image_folder):
    pytest.importorskip("PIL")
    crop = [T.RandomResizedCrop(224), T.RandomHorizontalFlip()]

    def loader(tail, **kwargs):
        ds = fastload.ImageFolder(image_folder, transform=T.Compose(crop + tail))
        return fastload.DataLoader(ds, batch_size=8, shuffle=True, num_workers=2,
                                   generator=torch.Generator().manual_seed(10), **kwargs)

    normalize = [T.ToTensor(), T.Normalize(MEAN, STD)]
    gpu = loader(normalize, device="cuda", normalize_on_device=True)
    uint8 = loader([T.PILToTensor()])
    floats = loader(normalize)  # the host's float pipeline, not quantised
    mul = torch.tensor([1 / (255 * s) for s in STD]).view(1, 3, 1, 1)
    add = torch.tensor([-m / s for m, s in zip(MEAN, STD)]).view(1, 3, 1, 1)
    n = 0
    for (images, labels), (u8, u8_labels), (f32, _) in zip(gpu, uint8, floats):
        assert images.device == CUDA0 and labels.device == CUDA0
        assert images.dtype == torch.float32 and images.shape == (8, 3, 224, 224)
        assert u8.dtype == torch.uint8
        got = images.cpu()
        torch.testing.assert_close(got, u8.float() * mul + add, rtol=1e-6, atol=1e-6)
        assert torch.equal(labels.cpu(), u8_labels)
        # The uint8 step is the only difference from the host's float output.
        assert ((got - f32).abs() <= 0.5 * mul * (1 + 1e-4) + 1e-6).all()
        n += 1
    assert n == 5


def test_normalize_on_device_of_one_channel(image_folder):
    pytest.importorskip("PIL")
    crop = [T.RandomResizedCrop(64), T.Grayscale(pil=True)]

    def loader(tail, **kwargs):
        ds = fastload.ImageFolder(image_folder, transform=T.Compose(crop + tail))
        return fastload.DataLoader(ds, batch_size=8, num_workers=2,
                                   generator=torch.Generator().manual_seed(11), **kwargs)

    gpu = loader([T.ToTensor(), T.Normalize((0.5,), (0.25,))], device="cuda",
                 normalize_on_device=True)
    for (images, _), (u8, _) in zip(gpu, loader([T.PILToTensor()])):
        assert images.shape == u8.shape == (8, 1, 64, 64)
        torch.testing.assert_close(images.cpu(), u8.float() * (1 / (255 * 0.25)) - 2.0,
                                   rtol=1e-6, atol=1e-6)


# ------------------------------------------------------------------- fork


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_a_child_forked_after_cuda_use_gets_a_clear_error():
    rows = integer_rows(16, 8)
    loader = fastload.DataLoader(fastload.ArrayDataset(rows), batch_size=8, device="cuda")
    held = [batch[0] for batch in loader]  # CUDA in use (and the upload thread done)
    gc.collect()
    read_end, write_end = os.pipe()
    with warnings.catch_warnings():  # Python 3.12+ warns about fork() with threads
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the child: never returns to pytest
        code, message = 3, "no error"
        try:
            os.close(read_end)
            fastload.DataLoader(fastload.ArrayDataset(rows), batch_size=8, device="cuda")
        except RuntimeError as e:
            code, message = (0 if "fork" in str(e) else 4), str(e)
        except BaseException as e:
            code, message = 5, f"{type(e).__name__}: {e}"
        finally:
            try:
                os.write(write_end, message.encode()[:4000])
            finally:
                os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        message = pipe.read().decode(errors="replace")
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status), f"the child died: status {status:#x} ({message})"
    assert os.WEXITSTATUS(status) == 0, f"exit {os.WEXITSTATUS(status)}: {message}"
    # The parent is unaffected.
    assert torch.equal(torch.cat(held).cpu(), torch.from_numpy(rows))
    assert torch.equal(next(iter(loader))[0].cpu(), torch.from_numpy(rows[:8]))
