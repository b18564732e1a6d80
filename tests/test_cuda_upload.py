"""Pinned slots and the upload stage, driven through a fake CUDA driver
(tests/c/fake_libcuda.c): its "device memory" is host memory, so uploaded
batches can be read back through the pointers fastload exports, and its
counters show what fastload asked of the driver.  The same behaviour on a
real GPU is checked by tests/test_cuda_gpu.py (marked ``gpu``).

Each case runs in a fresh process: the driver is loaded once per process.
"""

import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

from fl_helpers import fastload_only
from test_cuda_driver import CC, ROOT, fake_driver  # noqa: F401 (fixture)

pytestmark = fastload_only

PRELUDE = """
import ctypes, os, sys, warnings
import numpy as np
import fastload
from fastload import _C
warnings.simplefilter("error")

_fake = ctypes.CDLL(os.environ["FASTLOAD_LIBCUDA"])
COUNTERS = ("device_bytes", "device_buffers", "pinned_buffers", "copies", "stream_waits",
            "last_wait_stream", "event_records", "last_record_stream", "live_streams",
            "live_events", "host_registered", "register_calls", "unregister_calls",
            "bad_registrations", "last_register_flags", "event_queries", "pending_queries",
            "event_syncs")

def counters():
    out = (ctypes.c_longlong * len(COUNTERS))()
    _fake.fake_cuda_counters(out, len(COUNTERS))
    return dict(zip(COUNTERS, out))

def read_back(array):
    # The fake's device memory is host memory: read it through the CUDA
    # Array Interface, as a GPU consumer would find it.
    cai = array.__cuda_array_interface__
    assert cai["version"] == 3 and cai["strides"] is None
    dtype = np.dtype(cai["typestr"])
    count = int(np.prod(cai["shape"], dtype=np.int64))
    raw = (ctypes.c_char * (count * dtype.itemsize)).from_address(cai["data"][0])
    return np.frombuffer(raw, dtype=dtype).reshape(cai["shape"]).copy()

ROWS = np.arange(40 * 6, dtype=np.float32).reshape(40, 6)
LABELS = np.arange(40, dtype=np.int64) * 3
"""


def run_case(body, fake_driver, **env):  # noqa: F811 (the fixture)
    script = PRELUDE + textwrap.dedent(body) + "\nprint('ok')\n"
    environment = dict(os.environ, PYTHONPATH=str(ROOT), FASTLOAD_LIBCUDA=fake_driver["ok"],
                       **env)
    result = subprocess.run([sys.executable, "-c", script], env=environment,
                            capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines()[-1] == "ok", result.stdout
    return result.stdout.splitlines()[:-1]


def test_pin_memory_slots_are_page_locked_by_the_driver(fake_driver):  # noqa: F811
    run_case("""
        ds = fastload.ArrayDataset(ROWS, LABELS)
        for workers in (0, 2):
            plain = fastload.DataLoader(ds, batch_size=8, num_workers=workers, output="numpy")
            pinned = fastload.DataLoader(ds, batch_size=8, num_workers=workers,
                                         pin_memory=True, output="numpy")  # no warning
            for a, b in zip(plain, pinned):
                assert all(np.array_equal(x, y) for x, y in zip(a, b))
        assert counters()["pinned_buffers"] > 0
        # A freed pinned batch is fenced on the legacy default stream (a
        # non-blocking copy from it may still be queued); reuse waits for it.
        records = counters()["event_records"]
        del a, b
        c = counters()
        assert c["event_records"] > records and c["last_record_stream"] == 1
    """, fake_driver)


def test_device_batches_equal_the_host_batches(fake_driver):  # noqa: F811
    run_case("""
        import torch
        ds = fastload.ArrayDataset(ROWS, LABELS)
        for workers in (0, 2):
            kwargs = dict(batch_size=7, shuffle=True, num_workers=workers, output="numpy")
            host = fastload.DataLoader(ds, generator=torch.Generator().manual_seed(3), **kwargs)
            dev = fastload.DataLoader(ds, generator=torch.Generator().manual_seed(3),
                                      device="cuda", **kwargs)
            assert len(dev) == len(host)
            for epoch in range(2):
                n = 0
                for expected, got in zip(host, dev):
                    assert isinstance(got, list) and len(got) == 2
                    for e, g in zip(expected, got):
                        assert isinstance(g, _C.DeviceArray), type(g)
                        assert g.shape == e.shape and g.dtype == e.dtype and g.device == 0
                        assert np.array_equal(read_back(g), e)
                    n += 1
                assert n == len(host)
        c = counters()
        assert c["copies"] > 0 and c["pinned_buffers"] > 0  # staged in page-locked slots
    """, fake_driver)


def test_structures_and_python_datasets_upload_every_array(fake_driver):  # noqa: F811
    run_case("""
        class Samples:
            def __len__(self):
                return 10
            def __getitem__(self, i):
                return {"x": np.full((2, 3), i, np.float32), "id": i, "name": f"s{i}"}
        loader = fastload.DataLoader(Samples(), batch_size=4, device="cuda", output="numpy")
        batches = list(loader)
        assert [len(read_back(b["x"])) for b in batches] == [4, 4, 2]
        assert np.array_equal(read_back(batches[2]["x"]), np.float32([[[8] * 3] * 2, [[9] * 3] * 2]))
        assert np.array_equal(read_back(batches[1]["id"]), [4, 5, 6, 7])
        assert batches[0]["name"] == ["s0", "s1", "s2", "s3"]  # not arrays: left on the host
    """, fake_driver)


def test_dlpack_export_waits_on_the_consumer_stream(fake_driver):  # noqa: F811
    run_case("""
        loader = fastload.DataLoader(fastload.ArrayDataset(ROWS), batch_size=8, device="cuda",
                                     output="numpy")
        (x,) = next(iter(loader))
        assert x.__dlpack_device__() == (2, 0)
        before = counters()["stream_waits"]
        capsule = x.__dlpack__(stream=12345)
        assert "dltensor" in repr(capsule)
        c = counters()
        assert c["stream_waits"] == before + 1 and c["last_wait_stream"] == 12345
        x.__dlpack__(stream=-1)  # the consumer synchronises itself
        assert counters()["stream_waits"] == before + 1
        x.__dlpack__()  # None: the legacy default stream
        assert counters()["last_wait_stream"] == 1
        for bad, error in (({"stream": 0}, ValueError), ({"copy": True}, BufferError),
                           ({"dl_device": (2, 1)}, BufferError), ({"dl_device": (1, 0)}, BufferError)):
            try:
                x.__dlpack__(**bad)
            except error:
                pass
            else:
                raise AssertionError(f"{bad} was accepted")
        x.__dlpack__(dl_device=(2, 0), max_version=(1, 0))
        assert "DeviceArray(shape=(8, 6)" in repr(x)
    """, fake_driver)


def test_device_arrays_are_followed_by_the_garbage_collector(fake_driver):  # noqa: F811
    run_case("""
        import gc
        pool = _C.SlotPool(memory="device")
        stream = _C.CudaStream(0)
        (x, y), event = stream.upload([ROWS, LABELS], pool)
        # The collector sees every object a DeviceArray holds (a cycle through
        # one can be found), its heap type included.
        assert gc.is_tracked(x)
        held = gc.get_referents(x)
        for obj in (type(x), x.dtype, event, stream):
            assert any(h is obj for h in held), (obj, held)
        assert any(r is x for r in gc.get_referrers(event))
        # Arrays reachable only from a cycle are freed by a collection, and
        # their device slots go back to the pool.
        holder = [x, y, event]
        holder.append(holder)
        del x, y, event, holder
        gc.collect()
        assert pool.counts() == (2, 2), pool.counts()
        # Each DeviceArray and CudaEvent holds one reference to its type, and
        # gives it back when it dies.
        types = sys.getrefcount(_C.DeviceArray), sys.getrefcount(_C.CudaEvent)
        for _ in range(20):
            arrays, event = stream.upload([ROWS, LABELS], pool)
            del arrays, event
        stream.synchronize()  # the stream lets go of the last host batch and its event
        assert (sys.getrefcount(_C.DeviceArray), sys.getrefcount(_C.CudaEvent)) == types
    """, fake_driver)


def test_released_buffers_are_fenced_on_the_last_reader_stream(fake_driver):  # noqa: F811
    run_case("""
        import gc
        # One batch, and the iterator drained: the upload thread has nothing
        # left to record, so only the release can move the counter.
        loader = fastload.DataLoader(fastload.ArrayDataset(ROWS[:8]), batch_size=8,
                                     device="cuda", output="numpy")
        batches = iter(loader)
        (x,) = next(batches)
        assert next(batches, None) is None
        capsule = x.__dlpack__(stream=777)
        del x
        gc.collect()
        records = counters()["event_records"]
        del capsule  # an unconsumed capsule still owns its tensor: this frees the buffer
        c = counters()
        assert c["event_records"] == records + 1 and c["last_record_stream"] == 777
    """, fake_driver)


def test_device_memory_stays_flat_over_100_epochs(fake_driver):  # noqa: F811
    run_case("""
        ds = fastload.ArrayDataset(ROWS, LABELS)
        loader = fastload.DataLoader(ds, batch_size=8, shuffle=True, num_workers=2,
                                     persistent_workers=True, device="cuda", output="numpy")
        peak = []
        for epoch in range(100):
            for batch in loader:
                read_back(batch[0])
            del batch
            peak.append(counters()["device_buffers"])
        assert max(peak[5:]) <= max(peak[:5]), peak
        assert counters()["live_streams"] == 1
    """, fake_driver)


def test_uploaded_host_slots_return_to_the_pool_without_gc(fake_driver):  # noqa: F811
    # Each page-locked slot costs a driver allocation: a host batch kept
    # alive by a reference cycle after its upload would make the pool
    # allocate a new slot for almost every batch until the collector ran.
    run_case("""
        import gc
        gc.disable()
        ds = fastload.ArrayDataset(ROWS, LABELS)
        for structure in (None, lambda b: {"rows": b[0], "labels": (b[1], [b[1]])}):
            kwargs = dict(collate_fn=lambda s: structure(fastload.default_collate(s))
                          ) if structure else {}
            loader = fastload.DataLoader(ds, batch_size=4, shuffle=True, num_workers=2,
                                         persistent_workers=True, device="cuda",
                                         output="numpy", worker_mode="thread", **kwargs)
            allocations = []
            for epoch in range(4):
                for batch in loader:
                    pass
                del batch
                allocations.append(loader._slot_pool.stats()["allocations"])
            # 4 batches in flight at the workers and 2 at the upload stage, and the
            # timing may add one at an epoch's turn; kept alive, 40 batches would be.
            assert allocations[-1] <= 12, allocations
    """, fake_driver)


def test_out_of_device_memory_names_the_bytes(fake_driver):  # noqa: F811
    run_case("""
        loader = fastload.DataLoader(fastload.ArrayDataset(ROWS), batch_size=40, device="cuda",
                                     output="numpy")
        try:
            next(iter(loader))
        except MemoryError as e:
            assert "CUDA out of memory: cannot allocate" in str(e) and "on cuda:0" in str(e), e
        else:
            raise AssertionError("no MemoryError")
        assert counters()["device_buffers"] == 0
    """, fake_driver, FAKE_CUDA_MEMORY="1000")


def test_worker_errors_reach_the_loop_through_the_upload_stage(fake_driver):  # noqa: F811
    run_case("""
        class Broken:
            def __len__(self):
                return 12
            def __getitem__(self, i):
                if i == 9:
                    raise KeyError(f"sample {i} is missing")
                return np.float32(i)
        for workers in (0, 2):
            loader = fastload.DataLoader(Broken(), batch_size=4, num_workers=workers,
                                         device="cuda", output="numpy")
            it = iter(loader)
            assert read_back(next(it)).tolist() == [0, 1, 2, 3]
            try:
                for _ in it:
                    pass
            except KeyError as e:
                assert "sample 9 is missing" in str(e), e
            else:
                raise AssertionError("the error was lost")
            it = iter(loader)  # the next epoch works
            assert read_back(next(it)).tolist() == [0, 1, 2, 3]
            del it  # dropped mid-epoch: the upload thread stops
        import threading, time
        for _ in range(100):
            if not any(t.name == "fastload-upload" for t in threading.enumerate()):
                break
            time.sleep(0.05)
        assert not any(t.name == "fastload-upload" for t in threading.enumerate())
    """, fake_driver)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_a_child_forked_after_cuda_use_gets_a_clear_error(fake_driver):  # noqa: F811
    run_case("""
        loader = fastload.DataLoader(fastload.ArrayDataset(ROWS), batch_size=8, device="cuda",
                                     pin_memory=True, output="numpy")
        held = next(iter(loader))
        pid = os.fork()
        if pid == 0:
            code = 3
            try:
                del held  # frees a device buffer: never calls the driver here
                fastload.DataLoader(fastload.ArrayDataset(ROWS), device="cuda")
            except RuntimeError as e:
                code = 0 if "forked" in str(e) else 4
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
        assert read_back(held[0]).shape == (8, 6)  # the parent is unaffected
    """, fake_driver)


def test_normalize_on_device_needs_a_float_image_transform(fake_driver):  # noqa: F811
    lines = run_case("""
        for kwargs in ({}, {"device": "cuda", "output": "numpy"}):
            try:
                fastload.DataLoader(range(4), normalize_on_device=True, **kwargs)
            except ValueError as e:
                print(e)
        try:
            fastload.DataLoader(range(4), device="cuda", normalize_on_device=True)
        except ValueError as e:
            print(e)
    """, fake_driver)
    assert lines == ["normalize_on_device=True needs device='cuda'",
                     "normalize_on_device=True needs torch (output='torch')",
                     "normalize_on_device=True needs a fastload image dataset whose transform "
                     "is a fastload.transforms.Compose ending in ToTensor (and Normalize)"]


def test_pin_memory_without_a_driver_warns_once_and_changes_nothing():
    script = PRELUDE.split("_fake =")[0] + textwrap.dedent("""
        ds = fastload.ArrayDataset(np.arange(40 * 6, dtype=np.float32).reshape(40, 6))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            pinned = [b[0] for b in fastload.DataLoader(ds, batch_size=8, pin_memory=True,
                                                        output="numpy")]
        assert len(caught) == 1 and "pin_memory" in str(caught[0].message), caught
        plain = [b[0] for b in fastload.DataLoader(ds, batch_size=8, output="numpy")]
        assert all(np.array_equal(a, b) for a, b in zip(pinned, plain))
        print("ok")
    """)
    environment = dict(os.environ, PYTHONPATH=str(ROOT), FASTLOAD_LIBCUDA="no-such-libcuda.so")
    result = subprocess.run([sys.executable, "-c", script], env=environment,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


def test_dropping_the_iterator_mid_epoch_stops_the_upload_thread(fake_driver):  # noqa: F811
    run_case("""
        import gc, threading, time
        def uploading():
            return sum(t.name == "fastload-upload" for t in threading.enumerate())
        rows = np.zeros((400, 4), np.float32)
        for persistent in (False, True):
            loader = fastload.DataLoader(fastload.ArrayDataset(rows), batch_size=1, num_workers=2,
                                         persistent_workers=persistent, device="cuda",
                                         output="numpy")
            for epoch in range(3):
                it = iter(loader)
                for _ in range(3):
                    next(it)
                assert uploading() == 1
                del it  # mid-epoch, with hundreds of batches to go
                gc.collect()
                for _ in range(200):
                    if uploading() == 0:
                        break
                    time.sleep(0.05)
                assert uploading() == 0, (persistent, epoch)
            assert sum(1 for _ in loader) == 400  # a full epoch after the partial ones
            del loader
            gc.collect()
    """, fake_driver)


def test_two_iterators_of_one_loader_run_side_by_side(fake_driver):  # noqa: F811
    run_case("""
        loader = fastload.DataLoader(fastload.ArrayDataset(ROWS), batch_size=8, num_workers=2,
                                     device="cuda", output="numpy")
        pairs = list(zip(loader, loader))  # as with torch: each iterator is independent
        assert len(pairs) == 5
        for (a,), (b,) in pairs:
            assert np.array_equal(read_back(a), read_back(b))
        persistent = fastload.DataLoader(fastload.ArrayDataset(ROWS), batch_size=8, num_workers=2,
                                         persistent_workers=True, device="cuda", output="numpy")
        first = iter(persistent)
        next(first)
        second = iter(persistent)  # takes the shared workers over; the first one ends
        assert sum(1 for _ in first) <= 4
        assert sum(1 for _ in second) == 5
    """, fake_driver)


def test_one_call_uploads_a_batch_keeping_its_structure_and_layouts(fake_driver):  # noqa: F811
    run_case("""
        import collections, torch
        Pair = collections.namedtuple("Pair", "images labels")

        class DLTensor(ctypes.Structure):  # dlpack.h
            _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_int32),
                        ("device_id", ctypes.c_int32), ("ndim", ctypes.c_int32),
                        ("code", ctypes.c_uint8), ("bits", ctypes.c_uint8),
                        ("lanes", ctypes.c_uint16), ("shape", ctypes.POINTER(ctypes.c_int64)),
                        ("strides", ctypes.POINTER(ctypes.c_int64)),
                        ("byte_offset", ctypes.c_uint64)]
        capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
        capsule_pointer.restype = ctypes.c_void_p
        capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]

        def read_strided(array):
            cai = array.__cuda_array_interface__
            span = max((n - 1) * s for n, s in zip(cai["shape"], cai["strides"])) + 1
            raw = (ctypes.c_char * span).from_address(cai["data"][0])
            flat = np.frombuffer(raw, dtype=np.dtype(cai["typestr"]))
            return np.lib.stride_tricks.as_strided(flat, cai["shape"], cai["strides"]).copy()

        pool = _C.SlotPool(memory="device")
        stream = _C.CudaStream(0)
        nhwc = np.arange(2 * 4 * 5 * 3, dtype=np.uint8).reshape(2, 4, 5, 3)
        nchw = nhwc.transpose(0, 3, 1, 2)  # channels_last: an NCHW view of NHWC memory
        scattered = ROWS[::2, 1:4]          # not one block: made contiguous on the host
        batch = {"pair": Pair(nchw, torch.from_numpy(LABELS)), "rows": [scattered, 7, "id"],
                 "empty": (ROWS[:0],)}
        copies = counters()["copies"]
        out, event = stream.upload(batch, pool)
        assert counters()["copies"] - copies == 3  # the empty array needs none
        assert type(out) is dict and list(out) == ["pair", "rows", "empty"]
        assert type(out["pair"]) is Pair and type(out["empty"]) is tuple
        images, labels = out["pair"]
        assert images.shape == (2, 3, 4, 5) and images.ready is event
        assert images.__cuda_array_interface__["strides"] == nchw.strides
        assert np.array_equal(read_strided(images), nchw)
        tensor = DLTensor.from_address(capsule_pointer(images.__dlpack__(stream=-1), b"dltensor"))
        assert [tensor.strides[i] for i in range(4)] == [60, 1, 15, 3]  # in elements
        assert np.array_equal(read_back(labels), LABELS)  # a tensor leaf, through its memory
        assert np.array_equal(read_back(out["rows"][0]), scattered)
        assert out["rows"][1:] == [7, "id"]  # not arrays: left as they are
        assert out["empty"][0].shape == (0, 6)
        try:
            stream.upload([ROWS, np.array([None, 1], dtype=object)], pool)
        except TypeError as error:
            assert "batch array 1" in str(error), error
        else:
            raise AssertionError("an object array was uploaded")

        # The stream keeps a host batch until its copies are done.
        stream.synchronize()
        host = np.ones((64, 64), np.float32)
        before = sys.getrefcount(host)
        _fake.fake_cuda_hold_events(1)
        arrays, event = stream.upload((host,), pool)
        assert stream.collect() == 1 and sys.getrefcount(host) > before
        _fake.fake_cuda_hold_events(0)
        assert stream.collect() == 0 and sys.getrefcount(host) == before
    """, fake_driver)


def test_uploading_loaders_make_no_tensor_on_the_host(fake_driver):  # noqa: F811
    run_case("""
        import torch
        from fastload.loader import upload
        made = []
        from_numpy = torch.from_numpy
        torch.from_numpy = lambda a: made.append(a.shape) or from_numpy(a)
        # The fake device cannot back torch tensors: see the device batch itself.
        upload._tensors = lambda batch, normalize: batch
        ds = fastload.ArrayDataset(ROWS, LABELS)
        for mode, workers in (("thread", 0), ("thread", 2), ("process", 2)):
            loader = fastload.DataLoader(ds, batch_size=8, num_workers=workers,
                                         worker_mode=mode, device="cuda")
            assert loader.output == "torch"
            for x, y in loader:
                assert type(x) is _C.DeviceArray and type(y) is _C.DeviceArray
        assert made == []
        # A batch_transform of the user's gets what it gets without device=.
        seen = []
        def keep(images, labels):
            seen.append((type(images), type(labels)))
            return images, labels
        loader = fastload.DataLoader(ds, batch_size=8, device="cuda", batch_transform=keep)
        assert all(type(x) is _C.DeviceArray for x, _ in loader)
        assert set(seen) == {(torch.Tensor, torch.Tensor)}, seen
    """, fake_driver)
