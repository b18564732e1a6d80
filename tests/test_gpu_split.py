"""The workers' half of the GPU decode stage: a batch that leaves some of
its JPEGs to the GPU (an ImageSource made with gpu_split).

The GPU's work is done here on the CPU (libjpeg decodes each image whole,
the GPU resample kernel's host build resamples it): the finished batch must
be the CPU path's with decode="exact", byte for byte -- same crops, same
flips, same coefficients -- whichever images went to the GPU."""

import io
import os
from pathlib import Path

import numpy as np
import pytest

import fastload
from fastload import _C
from fastload import transforms as T

Image = pytest.importorskip("PIL.Image")

N = 12
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def _jpeg(rng, size, mode="RGB", **save):
    pixels = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    image = Image.fromarray(pixels).convert(mode)
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", quality=90, **save)
    return buffer.getvalue()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """JPEGs of various sizes (gray ones too), one progressive, one PNG."""
    root = tmp_path_factory.mktemp("split")
    rng = np.random.default_rng(5)
    paths = []
    for i in range(N):
        size = (int(rng.integers(40, 300)), int(rng.integers(40, 300)))
        if i == 4:
            data, ext = _jpeg(rng, size, progressive=True), "jpg"
        elif i == 7:
            buffer = io.BytesIO()
            Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), np.uint8)).save(
                buffer, "PNG")
            data, ext = buffer.getvalue(), "png"
        else:
            data, ext = _jpeg(rng, size, "L" if i % 5 == 2 else "RGB"), "jpg"
        path = root / f"{i:02d}.{ext}"
        path.write_bytes(data)
        paths.append(str(path))
    return paths


def _dataset(files, transform=None, **kwargs):
    transform = transform or T.Compose([T.RandomResizedCrop(24), T.RandomHorizontalFlip(),
                                        T.ToTensor(), T.Normalize(MEAN, STD)])
    return fastload.ImageFiles(files, labels=list(range(len(files))), transform=transform,
                               decode="exact", **kwargs)


def _split(ds, share, budgets=(1 << 20, 4096, 1 << 20), explore=0):
    source = ds._image_source(ds._plan, skip=ds.on_error == "skip",
                              gpu_split=(*budgets, explore))
    source.gpu_share = share
    return source


def _batches(ds, source, indices, seed=7, epoch=1):
    (images, labels, part), skipped = source.batch(indices, None, None, seed, epoch)
    (want, want_labels), want_skipped = ds._source.batch(indices, None, None, seed, epoch)
    return images, labels, part, skipped, want, want_labels, want_skipped


@pytest.mark.parametrize("transform", [
    None,
    T.Compose([T.Resize(20), T.CenterCrop(16), T.ToTensor()]),
    T.Compose([T.RandomResizedCrop((20, 28), interpolation=T.InterpolationMode.BICUBIC),
               T.RandomHorizontalFlip(), T.PILToTensor()]),
])
def test_the_finished_batch_is_the_cpu_paths(files, transform):
    ds = _dataset(files, transform)
    indices = np.arange(N)
    images, labels, part, _, want, want_labels, _ = _batches(ds, _split(ds, 1.0), indices)
    info = _C.gpu_part_items(part)
    # Every JPEG but the progressive one; the PNG is no JPEG.
    assert sorted(item["row"] for item in info["items"]) == [i for i in range(N) if i not in (4, 7)]
    assert info["cpu_count"] == 2
    assert np.array_equal(labels, want_labels)
    _C.gpu_part_finish_on_host(ds._plan, part, images)
    assert images.dtype == want.dtype and images.shape == want.shape
    if ds._plan.crop == 1:  # random-resized: a hard crop
        assert np.array_equal(images, want)
    else:
        # Resize's box is no hard crop: the GPU resamples the whole image, the
        # CPU path a decoded region, and Pillow's choice of which pass goes
        # first looks at the source's size, so a tall image may take the
        # other order: the same up to float rounding.
        np.testing.assert_allclose(images, want, rtol=0, atol=1e-6)


def test_a_share_spreads_the_gpu_rows_and_catches_up(files):
    ds = _dataset(files)
    images, _, part, _, want, _, _ = _batches(ds, _split(ds, 0.5), np.arange(N))
    rows = [item["row"] for item in _C.gpu_part_items(part)["items"]]
    # Six of twelve, every other row; the progressive row 4 goes to the CPU
    # and row 5 takes its turn.
    assert rows == [0, 2, 5, 6, 8, 10]
    _C.gpu_part_finish_on_host(ds._plan, part, images)
    assert np.array_equal(images, want)


def test_what_does_not_fit_the_budgets_is_decoded_on_the_cpu(files):
    ds = _dataset(files)
    sizes = [os.path.getsize(path) for path in files]
    # Room for about half the bytes of a batch.
    source = _split(ds, 1.0, budgets=(sum(sizes) // (2 * N), 4096, 1 << 20))
    images, _, part, _, want, _, _ = _batches(ds, source, np.arange(N))
    info = _C.gpu_part_items(part)
    assert 0 < info["count"] < N - 2 and info["encoded_used"] <= sum(sizes) // 2
    assert info["count"] + info["cpu_count"] == N
    _C.gpu_part_finish_on_host(ds._plan, part, images)
    assert np.array_equal(images, want)
    # No room for pixels: everything on the CPU.
    images, _, part, _, want, _, _ = _batches(ds, _split(ds, 1.0, (1 << 20, 4096, 0)),
                                              np.arange(N))
    assert _C.gpu_part_items(part)["count"] == 0
    assert np.array_equal(images, want)


def test_exploring_keeps_one_image_on_each_side(files):
    ds = _dataset(files)
    jpegs = [i for i in range(N) if i not in (4, 7)]  # the ones the GPU takes
    for share, expected in ((0.0, [1, 0, 1, 0]), (1.0, [9, 10, 9, 10])):
        source = _split(ds, share, explore=2)
        counts = [_C.gpu_part_items(source.batch(jpegs, None, None, 1, 0)[0][2])["count"]
                  for _ in range(4)]
        assert counts == expected


def test_a_sample_that_fails_is_skipped_as_on_the_cpu_path(files, tmp_path):
    broken = tmp_path / "broken.jpg"
    broken.write_bytes(Path(files[0]).read_bytes()[:200])  # truncated
    paths = [str(broken)] + files[1:]
    ds = _dataset(paths, on_error="skip")
    images, labels, part, skipped, want, want_labels, want_skipped = _batches(
        ds, _split(ds, 1.0), np.arange(N))
    assert [s[0] for s in skipped] == [s[0] for s in want_skipped] == [0]
    assert np.array_equal(labels, want_labels)
    _C.gpu_part_finish_on_host(ds._plan, part, images)
    assert np.array_equal(images, want)
    # Without skipping, the error names the file, as on the CPU path.
    strict = _dataset(paths)
    with pytest.raises(fastload.DecodeError, match="broken.jpg"):
        _split(strict, 1.0).batch(np.arange(N), None, None, 0, 0)


def test_only_transforms_the_gpu_runs_take_a_split(files):
    ds = _dataset(files, T.Compose([T.RandomResizedCrop(24), T.ColorJitter(0.4, 0.4),
                                    T.ToTensor()]))
    with pytest.raises(ValueError, match="colour ops"):
        _split(ds, 1.0)
    source = _split(_dataset(files), 0.25)
    assert source.gpu_share == 0.25 and _dataset(files)._source.gpu_share is None
    with pytest.raises(ValueError, match=r"gpu_share must be in \[0, 1\]"):
        source.gpu_share = 1.5
