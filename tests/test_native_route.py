"""The native batch route: a batch of fastload's own datasets runs in C on a
worker thread, and crosses into Python only on the consumer's thread."""

import gc
import os
import weakref

import numpy as np
import pytest

import fastload
from fastload import _C
from fastload.loader import worker as _worker
from fastload import transforms as T

PIL = pytest.importorskip("PIL.Image")


@pytest.fixture
def counted_fetches(monkeypatch):
    """How many times a worker thread ran Worker.fetch (Python per batch)."""
    calls = []
    fetch = _worker.Worker.fetch

    def counting(self, request):
        calls.append(request)
        return fetch(self, request)

    monkeypatch.setattr(_worker.Worker, "fetch", counting)
    return calls


def arrays(n=40):
    return fastload.ArrayDataset(np.arange(n * 3, dtype=np.float32).reshape(n, 3), np.arange(n))


def write_folder(root, names):
    os.makedirs(root / "a", exist_ok=True)
    rng = np.random.default_rng(0)
    for name in names:
        pixels = rng.integers(0, 256, (12, 16, 3), dtype=np.uint8)
        fmt = "PNG" if name.endswith(b".png") else "JPEG"
        with open(os.path.join(os.fsencode(root / "a"), name), "wb") as f:
            PIL.fromarray(pixels).save(f, fmt)
    return root


@pytest.mark.parametrize("num_workers", [1, 2])
def test_native_batches_call_no_python_on_workers(counted_fetches, num_workers):
    ds = fastload.TokenDataset(np.arange(500, dtype=np.uint16), block_size=8)
    loader = fastload.DataLoader(ds, batch_size=5, num_workers=num_workers)
    expected = [ds[list(range(i, min(i + 5, len(ds))))] for i in range(0, len(ds), 5)]
    for (x, y), (ex, ey) in zip(loader, expected):
        assert np.array_equal(x.numpy(), ex) and np.array_equal(y.numpy(), ey)
    assert counted_fetches == []


def test_python_datasets_still_fetch_on_the_worker(counted_fetches):
    loader = fastload.DataLoader(list(range(10)), batch_size=5, num_workers=1,
                                 worker_mode="thread")
    assert [b.tolist() for b in loader] == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]
    assert len(counted_fetches) == 2


def test_a_bad_index_fails_its_own_batch_in_turn():
    batches = [[0, 1], [2, 3], [99], [4, 5]]
    loader = fastload.DataLoader(arrays(), batch_sampler=batches, num_workers=2)
    it = iter(loader)
    assert next(it)[1].tolist() == [0, 1]
    assert next(it)[1].tolist() == [2, 3]
    with pytest.raises(IndexError, match="index 99 is out of range.*40 samples"):
        next(it)
    with pytest.raises(IndexError, match="in DataLoader worker 0"):
        next(iter(fastload.DataLoader(arrays(), batch_sampler=[[99]], num_workers=1)))


def test_worker_init_fn_error_reaches_the_consumer():
    def init(worker_id):
        raise ValueError(f"init failed in {worker_id}")

    loader = fastload.DataLoader(arrays(), batch_size=4, num_workers=2, worker_init_fn=init)
    with pytest.raises(ValueError, match="init failed in 0"):
        next(iter(loader))


def test_worker_info_is_set_on_native_workers():
    seen = []

    def init(worker_id):
        info = fastload.get_worker_info()
        seen.append((worker_id, info.id, info.num_workers))

    loader = fastload.DataLoader(arrays(), batch_size=4, num_workers=2, worker_init_fn=init)
    assert len(list(loader)) == 10
    assert sorted(seen) == [(0, 0, 2), (1, 1, 2)]


def test_images_through_the_native_route_match_the_single_thread_route(tmp_path):
    root = write_folder(tmp_path, [b"%02d.jpg" % i for i in range(10)] + [b"10.png"])
    ds = fastload.ImageFolder(root, transform=T.Compose(
        [T.RandomResizedCrop(8), T.RandomHorizontalFlip(), T.ToTensor()], channels_last=True))

    def epoch(num_workers):
        torch = pytest.importorskip("torch")
        loader = fastload.DataLoader(ds, batch_size=4, shuffle=True, num_workers=num_workers,
                                     generator=torch.Generator().manual_seed(3))
        return list(loader)

    single, threaded = epoch(0), epoch(2)
    assert len(single) == len(threaded) == 3
    for (a, la), (b, lb) in zip(single, threaded):
        assert a.shape == b.shape and a.stride() == b.stride()  # channels_last NCHW views
        assert (a == b).all() and (la == lb).all()


def test_a_png_with_a_name_that_is_not_utf8_decodes(tmp_path):
    root = write_folder(tmp_path, [b"0.jpg", b"\xff-1.png"])
    ds = fastload.ImageFolder(root, transform=T.Compose([T.Resize((6, 6)), T.ToTensor()]))
    for num_workers in (0, 1):
        images, labels = next(iter(fastload.DataLoader(ds, batch_size=2,
                                                       num_workers=num_workers)))
        assert tuple(images.shape) == (2, 3, 6, 6)


def test_skipped_samples_are_reported_from_native_workers(tmp_path):
    root = write_folder(tmp_path, [b"0.jpg", b"1.jpg", b"2.jpg", b"3.jpg"])
    (root / "a" / "1.jpg").write_bytes(b"\xff\xd8 not really a jpeg")
    ds = fastload.ImageFolder(root, transform=T.Compose([T.Resize((6, 6)), T.ToTensor()]),
                              on_error="skip")
    _, labels = next(iter(fastload.DataLoader(ds, batch_size=4, num_workers=2)))
    assert len(labels) == 4
    assert ds.skipped_count == 1
    index, path, message = ds.skipped[0]
    assert index == 1 and path.endswith("1.jpg") and message


def test_a_malformed_plan_names_the_field():
    plan = T.Compose([T.CenterCrop(4), T.ToTensor()]).plan
    plan.dtype = "int8"
    image = np.zeros((8, 8, 3), np.uint8)
    with pytest.raises(ValueError, match="field dtype"):
        _C.transform_image(plan, image, 0, 1 << 20)
    plan.dtype = "float32"
    del plan.layout
    with pytest.raises(AttributeError, match="layout"):
        _C.transform_image(plan, image, 0, 1 << 20)


def test_a_cycle_through_a_persistent_iterator_is_collected():
    """dataset -> loader -> persistent iterator -> engine -> worker -> dataset:
    the collector sees the engine's references, so the cycle goes, and its
    threads stop, without waiting for the end of the program."""
    ds = arrays()
    loader = fastload.DataLoader(ds, batch_size=8, num_workers=2, persistent_workers=True)
    ds.loader = loader
    assert len(list(loader)) == 5
    engine = weakref.ref(loader._iterator._engine)
    del ds, loader
    gc.collect()
    assert engine() is None


def test_samples_can_be_byte_ranges_of_one_file(tmp_path):
    """The source under shard datasets: sample i is bytes [offset, offset + size)
    of its file (a JPEG and a PNG packed back to back here)."""
    root = write_folder(tmp_path, [b"0.jpg", b"1.png"])
    parts = [(root / "a" / name).read_bytes() for name in ("0.jpg", "1.png")]
    packed = tmp_path / "packed.bin"
    packed.write_bytes(b"header" + parts[0] + parts[1])
    ranges = np.array([[6, len(parts[0])], [6 + len(parts[0]), len(parts[1])]], np.int64)
    plan = T.Compose([T.Resize((6, 6)), T.ToTensor()]).plan

    def source(path, offsets, ranges=None):
        return _C.ImageSource(path, np.asarray(offsets, np.int64), np.array([0, 1], np.int64),
                              plan, fallback=fastload.datasets.images._fallback(), ranges=ranges)

    files = os.fsencode(root / "a" / "0.jpg") + b"\0" + os.fsencode(root / "a" / "1.png") + b"\0"
    (expected, _), _ = source(files, [0, files.index(b"\0") + 1]).batch([0, 1], None, None,
                                                                         0, 0)
    (got, _), _ = source(os.fsencode(packed) + b"\0", [0, 0], ranges).batch([0, 1], None, None,
                                                                           0, 0)
    np.testing.assert_array_equal(got, expected)

    packed.write_bytes(b"header" + parts[0])  # truncated after it was indexed
    with pytest.raises(OSError, match=r"past the end of the file.*truncated.*sample index 1"):
        source(os.fsencode(packed) + b"\0", [0, 0], ranges).batch([0, 1], None, None, 0, 0)
