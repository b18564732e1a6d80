"""fastload.add_restart_markers and the region decode of files with restart
markers: the rewrite is lossless (Pillow decodes it to the original's
pixels), and a crop decoded from the intervals that cover it is the same,
bit for bit, as from the original file.  tests/c/jpeg_check.py checks the
decoder alone at every scale and sampling."""

import io
import struct

import numpy as np
import pytest

pytest.importorskip("PIL")
from PIL import Image  # noqa: E402

import fastload  # noqa: E402
from fastload import transforms as T  # noqa: E402

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def photo(width, height, seed):
    """Smooth shapes plus noise: JPEG-like content, deterministic."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    base = np.stack([128 + 100 * np.sin(x / rng.uniform(5, 40) + c) *
                     np.cos(y / rng.uniform(5, 40) - c) for c in range(3)], axis=-1)
    base += rng.normal(0, 6, base.shape)
    return np.clip(base, 0, 255).astype(np.uint8)


def jpeg(arr, mode="RGB", **kw):
    buf = io.BytesIO()
    Image.fromarray(arr).convert(mode).save(buf, "JPEG", **kw)
    return buf.getvalue()


def restart_interval(data):
    """The DRI value of a JPEG, or 0."""
    i = 2
    while i + 4 <= len(data) and data[i] == 0xFF:
        marker, length = data[i + 1], struct.unpack(">H", data[i + 2:i + 4])[0]
        if marker == 0xDD:
            return struct.unpack(">H", data[i + 4:i + 6])[0]
        if marker == 0xDA:
            return 0
        i += 2 + length
    return 0


KINDS = [("444", dict(subsampling=0)), ("422", dict(subsampling=1)),
         ("420", dict(subsampling=2)), ("420_prog", dict(subsampling=2, progressive=True)),
         ("gray", dict(mode="L")), ("cmyk", dict(mode="CMYK"))]


@pytest.fixture(scope="module")
def originals():
    files = []
    for i, (w, h) in enumerate([(641, 479), (333, 500), (500, 375), (97, 131)]):
        arr = photo(w, h, i)
        for name, kw in KINDS:
            files.append((f"{w}x{h}_{name}", jpeg(arr, quality=85 + i, **kw)))
    return files


def test_rewrite_is_lossless(originals):
    for name, data in originals:
        new = fastload.add_restart_markers(data)
        k = restart_interval(new)
        assert 1 <= k <= 4, name
        with Image.open(io.BytesIO(data)) as a, Image.open(io.BytesIO(new)) as b:
            assert a.size == b.size and a.mode == b.mode, name
            assert "progressive" not in b.info, name
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=name)
        assert len(new) < len(data) * 1.2, name
        assert fastload.add_restart_markers(new) == new  # a fixed point
        fast = fastload.add_restart_markers(data, optimize=False)
        with Image.open(io.BytesIO(data)) as a, Image.open(io.BytesIO(fast)) as b:
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=name)
    one = fastload.add_restart_markers(originals[0][1], max_interval=1)
    assert restart_interval(one) == 1


def test_rewrite_refuses_what_it_cannot_read(originals):
    with pytest.raises(fastload.DecodeError, match="not a JPEG"):
        fastload.add_restart_markers(b"hello")
    data = originals[0][1]
    with pytest.raises(fastload.DecodeError, match="premature end"):
        fastload.add_restart_markers(data[:len(data) // 2])
    with pytest.raises(fastload.DecodeError, match="more than the limit"):
        fastload.add_restart_markers(data, max_pixels=1000)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="max_interval"):
            fastload.add_restart_markers(data, max_interval=bad)


@pytest.mark.parametrize("decode", ["fast", "exact"])
def test_crops_of_the_rewrite_are_the_originals(originals, tmp_path, decode):
    before, after = [], []
    for name, data in originals:
        (tmp_path / f"{name}.jpg").write_bytes(data)
        (tmp_path / f"{name}_rst.jpg").write_bytes(fastload.add_restart_markers(data))
        before.append(str(tmp_path / f"{name}.jpg"))
        after.append(str(tmp_path / f"{name}_rst.jpg"))
    for tf in (T.Compose([T.RandomResizedCrop(48), T.RandomHorizontalFlip(), T.ToTensor(),
                          T.Normalize(MEAN, STD)]),
               T.Compose([T.RandomResizedCrop(224, scale=(0.05, 0.3)), T.ToTensor()]),
               T.Compose([T.Resize(72), T.CenterCrop(64), T.ToTensor()])):
        ref = fastload.ImageFiles(before, transform=tf, decode=decode)
        new = fastload.ImageFiles(after, transform=tf, decode=decode)
        for i in range(len(before)):
            for seed in range(6):
                np.testing.assert_array_equal(new._source.sample(i, seed, 0),
                                              ref._source.sample(i, seed, 0),
                                              err_msg=f"{before[i]} seed {seed}")


def test_write_shards_with_restart_markers(originals, tmp_path):
    import tarfile

    torch = pytest.importorskip("torch")
    samples = [{"__key__": f"{i:04d}", "jpg": data, "cls": i} for i, (_, data) in
               enumerate(originals)]
    plain = fastload.write_shards(samples, str(tmp_path / "p-%02d.tar"), maxcount=10)
    rst = fastload.write_shards(samples, str(tmp_path / "r-%02d.tar"), maxcount=10,
                                restart_markers=True)
    members = {}
    for path in rst:
        with tarfile.open(path) as tar:
            for m in tar.getmembers():
                members[m.name] = tar.extractfile(m).read()
    for s in samples:
        assert members[s["__key__"] + ".jpg"] == fastload.add_restart_markers(s["jpg"])
    tf = T.Compose([T.RandomResizedCrop(64), T.RandomHorizontalFlip(), T.ToTensor()])

    def run(paths):
        loader = fastload.DataLoader(fastload.WebDataset(paths, transform=tf), batch_size=5,
                                     shuffle=True, num_workers=0,
                                     generator=torch.Generator().manual_seed(3))
        return [(x.numpy().copy(), y.numpy().copy()) for x, y in loader]

    for (x0, y0), (x1, y1) in zip(run(plain), run(rst)):
        np.testing.assert_array_equal(x0, x1)
        np.testing.assert_array_equal(y0, y1)


def test_write_shards_keeps_what_it_cannot_rewrite(tmp_path):
    import tarfile

    broken = b"\xff\xd8\xff\xe0 not a jpeg"
    png = io.BytesIO()
    Image.fromarray(photo(20, 10, 0)).save(png, "PNG")
    paths = fastload.write_shards([{"__key__": "a", "jpg": broken, "png": png.getvalue()}],
                                  str(tmp_path / "s-%02d.tar"), restart_markers=True)
    with tarfile.open(paths[0]) as tar:
        assert tar.extractfile("a.jpg").read() == broken
        assert tar.extractfile("a.png").read() == png.getvalue()


def test_cache_keeps_jpegs_with_restart_markers(originals, tmp_path):
    paths = []
    for name, data in originals:
        (tmp_path / f"{name}.jpg").write_bytes(data)
        paths.append(str(tmp_path / f"{name}.jpg"))
    (tmp_path / "broken.jpg").write_bytes(originals[0][1][:200])
    tf = T.Compose([T.RandomResizedCrop(64), T.RandomHorizontalFlip(), T.ToTensor()])
    plain = fastload.ImageFiles(paths, transform=tf)
    bytes_cache = fastload.ImageFiles(paths, transform=tf, cache="memory")
    ds = fastload.ImageFiles(paths, transform=tf, cache="memory", cache_restart_markers=True)
    for epoch in range(3):  # the first fills the cache, the others read the rewrites
        for i in range(len(paths)):
            want = plain._source.sample(i, epoch, 0)
            np.testing.assert_array_equal(ds._source.sample(i, epoch, 0), want)
            np.testing.assert_array_equal(bytes_cache._source.sample(i, epoch, 0), want)
    stats, as_read = ds.cache.stats(), bytes_cache.cache.stats()
    assert stats["stored"] == as_read["stored"] == len(paths)
    assert stats["hits"] == 2 * len(paths)
    assert stats["used"] != as_read["used"]  # the rewrites, not the files' bytes

    broken = fastload.ImageFiles([str(tmp_path / "broken.jpg")], transform=tf, cache="memory",
                                 cache_restart_markers=True)
    for _ in range(2):  # kept as read: it fails the same way from the cache
        with pytest.raises(fastload.DecodeError, match="premature end"):
            broken._source.sample(0, 0, 0)

    with pytest.raises(ValueError, match="cache_restart_markers"):
        fastload.ImageFiles(paths, transform=tf, cache_restart_markers=True)
    with pytest.raises(ValueError, match="cache_restart_markers"):
        fastload.ImageFiles(paths, transform=tf, cache="memory", cache_size=1 << 26,
                            cache_decoded=True, cache_restart_markers=True)
