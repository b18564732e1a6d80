"""ImageFolder / ImageFiles and fastload.transforms: torchvision's folder
rules, fidelity against Pillow for the same crop box and flip, determinism
across num_workers, and clear errors (or skips) for bad files."""

import os
import pathlib
import sys

import numpy as np
import pytest

PIL = pytest.importorskip("PIL")
from PIL import Image  # noqa: E402

import fastload  # noqa: E402
from fastload import transforms as T  # noqa: E402
from fl_helpers import fastload_only  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "benchmarks"))
import imagenet_like  # noqa: E402
import pil_pipeline  # noqa: E402

pytestmark = fastload_only

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


@pytest.fixture(scope="module")
def test_images(tmp_path_factory):
    root = tmp_path_factory.mktemp("images")
    return imagenet_like.make_test_images(str(root))


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("folder")
    return imagenet_like.make_image_folder(str(root), n_images=60, n_classes=3, processes=1)


def psnr(actual, reference):
    mse = np.mean((np.asarray(actual, np.float64) - reference) ** 2)
    return 99.0 if mse == 0 else 10 * np.log10(1.0 / mse)


def image_size(path):
    with Image.open(path) as img:
        return img.size


def pil_reference(path, geometry):
    """Pillow's full decode, then the crop and bilinear (antialiased)
    resize torchvision would do for this box, then the flip; in [0, 1]."""
    with Image.open(path) as opened:
        img = opened.convert("RGB")
    x, y, w, h = geometry["box"]
    out_w, out_h = geometry["out"]
    if geometry["hard_crop"]:
        img = img.crop((int(x), int(y), int(x + w), int(y + h))).resize((out_w, out_h),
                                                                      Image.BILINEAR)
    else:  # Resize then CenterCrop: a box of the resized image
        sw, sh = geometry["size"]
        rw, rh = round(sw * out_w / w), round(sh * out_h / h)
        resized = img.resize((rw, rh), Image.BILINEAR)
        left, top = round(x * rw / sw), round(y * rh / sh)
        img = resized.crop((left, top, left + out_w, top + out_h))
    ref = np.asarray(img, np.float64) / 255.0
    return ref[:, ::-1] if geometry["flip"] else ref


# ------------------------------------------------------------ folder rules


def test_folder_follows_torchvision_rules(folder):
    ours = fastload.ImageFolder(folder)
    theirs = pil_pipeline.PilImageFolder(folder)
    assert ours.classes == theirs.classes
    assert ours.class_to_idx == theirs.class_to_idx
    assert list(ours.samples) == list(theirs.samples)
    assert ours.targets == theirs.targets
    assert len(ours) == len(theirs) == 60


def test_nested_folders_in_torchvision_order(tmp_path):
    for rel in ["a/z.jpg", "a/sub/x.jpg", "a/sub/deeper/y.JPG", "a/b.png", "b/k.jpeg",
                "b/notes.txt", "c/q.jpg"]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(b"")
    ours = fastload.ImageFolder(tmp_path)
    classes, class_to_idx = pil_pipeline.find_classes(str(tmp_path))
    assert ours.classes == classes
    assert list(ours.samples) == pil_pipeline.make_dataset(str(tmp_path), class_to_idx)


def test_folder_filters_and_errors(tmp_path):
    for name in ("b", "a"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "x.jpg").write_bytes(b"")
        (tmp_path / name / "y.txt").write_bytes(b"")
    ds = fastload.ImageFolder(tmp_path)
    assert ds.classes == ["a", "b"] and len(ds) == 2
    ds = fastload.ImageFolder(tmp_path, extensions=(".txt",))
    assert [os.path.basename(p) for p, _ in ds.samples] == ["y.txt", "y.txt"]
    ds = fastload.ImageFolder(tmp_path, is_valid_file=lambda p: True)
    assert len(ds) == 4
    with pytest.raises(ValueError, match="Both extensions and is_valid_file"):
        fastload.ImageFolder(tmp_path, extensions=(".jpg",), is_valid_file=lambda p: True)
    with pytest.raises(FileNotFoundError, match="Found no valid file for the classes a, b. "
                                                "Supported extensions are: .png"):
        fastload.ImageFolder(tmp_path, extensions=(".png",))
    assert len(fastload.ImageFolder(tmp_path, extensions=(".png",), allow_empty=True)) == 0
    with pytest.raises(FileNotFoundError, match="Couldn't find any class folder"):
        fastload.ImageFolder(tmp_path / "a")


# ---------------------------------------------------------------- fidelity


@pytest.mark.parametrize("decode, floor", [("exact", 38.0), ("fast", 32.0)])
@pytest.mark.parametrize("transform", ["train", "val"])
def test_fidelity_against_pillow(test_images, decode, floor, transform):
    if transform == "train":
        tf = T.Compose([T.RandomResizedCrop(64, scale=(0.3, 1.0)), T.RandomHorizontalFlip(),
                        T.ToTensor()])
    else:
        tf = T.Compose([T.Resize(72), T.CenterCrop(64), T.ToTensor()])
    usable = [(p, d) for p, d in test_images if min(image_size(p)) >= 24]
    ds = fastload.ImageFiles([p for p, _ in usable], transform=tf, decode=decode)
    worst = []
    for i, (path, description) in enumerate(usable):
        for seed in (1, 2):
            geometry = ds._source.geometry(i, seed, 0)
            out = ds._source.sample(i, seed, 0).transpose(1, 2, 0)
            worst.append((psnr(out, pil_reference(path, geometry)), description, geometry))
    worst.sort(key=lambda w: w[0])
    assert worst[0][0] >= floor, worst[:3]


def test_output_layouts_and_dtypes(test_images):
    path = next(p for p, d in test_images if d.startswith("641x479"))
    base = [T.Resize(40), T.CenterCrop(32)]
    chw = fastload.ImageFiles([path], transform=T.Compose(base + [T.ToTensor()]))[0][0]
    hwc = fastload.ImageFiles([path], transform=T.Compose(base + [T.ToTensor()],
                                                           channels_last=True))[0][0]
    u8 = fastload.ImageFiles([path], transform=T.Compose(base + [T.PILToTensor()]))[0][0]
    f16 = fastload.ImageFiles([path], transform=T.Compose(
        base + [T.PILToTensor(), T.ConvertImageDtype("float16")]))[0][0]
    norm = fastload.ImageFiles([path], transform=T.Compose(
        base + [T.ToTensor(), T.Normalize(MEAN, STD)]))[0][0]
    assert chw.shape == (3, 32, 32) and chw.dtype == np.float32
    # channels_last: the same (C, H, W) values over HWC memory
    assert hwc.shape == chw.shape and hwc.base is not None and hwc.base.shape == (32, 32, 3)
    np.testing.assert_allclose(hwc, chw, atol=1e-6)
    assert u8.dtype == np.uint8 and np.abs(u8 / 255.0 - chw).max() <= 0.5 / 255 + 1e-6
    assert f16.dtype == np.float16 and np.abs(f16 - chw).max() < 1e-3
    expected = (chw - np.array(MEAN)[:, None, None]) / np.array(STD)[:, None, None]
    np.testing.assert_allclose(norm, expected, atol=1e-5)


# ------------------------------------------------------------- determinism


def train_transform():
    return T.Compose([T.RandomResizedCrop(48), T.RandomHorizontalFlip(), T.ToTensor(),
                      T.Normalize(MEAN, STD)])


def epochs(ds, workers, seed, n_epochs=1, persistent=False):
    import torch

    loader = fastload.DataLoader(ds, batch_size=8, num_workers=workers, shuffle=True,
                                 generator=torch.Generator().manual_seed(seed),
                                 persistent_workers=persistent)
    return [[(x.numpy().copy(), y.numpy().copy()) for x, y in loader] for _ in range(n_epochs)]


def test_same_output_for_any_num_workers(folder):
    pytest.importorskip("torch")
    ds = fastload.ImageFolder(folder, transform=train_transform())
    reference = epochs(ds, 0, seed=3)
    for workers in (1, 2):
        for (x, y), (rx, ry) in zip(epochs(ds, workers, seed=3)[0], reference[0]):
            np.testing.assert_array_equal(x, rx)
            np.testing.assert_array_equal(y, ry)


def test_seed_and_epoch_change_the_augmentation(folder):
    pytest.importorskip("torch")
    ds = fastload.ImageFolder(folder, transform=train_transform())
    a, b = epochs(ds, 2, seed=3, n_epochs=2, persistent=True)
    other = epochs(ds, 2, seed=4)[0]
    assert not np.array_equal(a[0][0], b[0][0])
    assert not np.array_equal(a[0][0], other[0][0])


# --------------------------------------------------------------- bad input


@pytest.fixture
def bad_files(tmp_path, test_images):
    good = next(p for p, d in test_images if d.startswith("641x479"))
    data = pathlib.Path(good).read_bytes()
    files = {
        "good": good,
        "truncated": tmp_path / "truncated.jpg",
        "empty": tmp_path / "empty.jpg",
        "text": tmp_path / "text.jpg",
        "huge": tmp_path / "huge.jpg",
        "missing": tmp_path / "missing.jpg",
    }
    files["truncated"].write_bytes(data[: len(data) // 2])
    files["empty"].write_bytes(b"")
    files["text"].write_bytes(b"this is not an image\n" * 10)
    sof = data.index(b"\xff\xc0") if b"\xff\xc0" in data else data.index(b"\xff\xc2")
    huge = bytearray(data)
    huge[sof + 5:sof + 9] = (60000).to_bytes(2, "big") * 2  # height, width
    files["huge"].write_bytes(bytes(huge))
    return {k: str(v) for k, v in files.items()}


@pytest.mark.parametrize("kind, error, message", [
    ("truncated", fastload.DecodeError, "truncated|premature end|corrupt"),
    ("empty", fastload.DecodeError, "empty file"),
    ("text", fastload.DecodeError, "cannot decode"),
    ("huge", fastload.DecodeError, "exceeds max_pixels"),
    ("missing", FileNotFoundError, "No such file"),
])
@pytest.mark.parametrize("workers", [0, 2])
def test_bad_file_raises_naming_it(bad_files, kind, error, message, workers):
    paths = [bad_files["good"], bad_files[kind], bad_files["good"]]
    ds = fastload.ImageFiles(paths, transform=train_transform())
    loader = fastload.DataLoader(ds, batch_size=3, num_workers=workers)
    with pytest.raises(error, match=message) as info:
        next(iter(loader))
    assert os.path.basename(bad_files[kind]) in str(info.value)
    with pytest.raises(error, match=message):
        ds[1]


def test_skip_replaces_bad_samples_and_reports_them(bad_files):
    kinds = ["truncated", "empty", "text", "huge", "missing"]
    paths = [bad_files["good"]] + [bad_files[k] for k in kinds] + [bad_files["good"]]
    ds = fastload.ImageFiles(paths, labels=list(range(len(paths))), transform=train_transform(),
                             on_error="skip")
    (images, labels), = list(fastload.DataLoader(ds, batch_size=len(paths), output="numpy"))
    assert images.shape[0] == len(paths)
    # each bad index is filled from the next good one (the last file)
    assert labels.tolist() == [0] + [len(paths) - 1] * len(kinds) + [len(paths) - 1]
    # every bad file is reported (several times: later bad samples retry it)
    assert {os.path.basename(p) for _, p, _ in ds.skipped} == {
        os.path.basename(bad_files[k]) for k in kinds}
    assert {i for i, _, _ in ds.skipped} == set(range(1, 1 + len(kinds)))
    assert ds.skipped_count == len(ds.skipped) >= len(kinds)


# ------------------------------------------------------------ other paths


def test_png_matches_the_pillow_reference(test_images):
    png = next(p for p, d in test_images if p.endswith(".png"))
    ds = fastload.ImageFiles([png], transform=T.Compose([T.Resize(32), T.CenterCrop(32),
                                                         T.ToTensor()]))
    geometry = ds._source.geometry(0, 0, 0)
    out = ds._source.sample(0, 0, 0).transpose(1, 2, 0)
    assert psnr(out, pil_reference(png, geometry)) >= 38


def test_python_callable_gets_the_decoded_image(test_images):
    path = next(p for p, d in test_images if d.startswith("641x479"))
    seen = []

    def transform(image):
        seen.append(image.shape)
        return image[:8, :8].copy()

    ds = fastload.ImageFiles([path, path], transform=transform)
    image, label = ds[0]
    assert image.shape == (8, 8, 3) and image.dtype == np.uint8 and label == 0
    with Image.open(path) as img:
        reference = np.asarray(img.convert("RGB"))
    assert seen[0] == reference.shape
    assert np.abs(image.astype(int) - reference[:8, :8]).max() <= 1
    (batch, labels), = list(fastload.DataLoader(ds, batch_size=2, num_workers=1, output="numpy"))
    assert batch.shape == (2, 8, 8, 3)


def test_transform_order_is_checked():
    with pytest.raises(ValueError, match="cannot fuse"):
        T.Compose([T.ToTensor(), T.RandomResizedCrop(10)])
    with pytest.raises(ValueError, match="Normalize needs a float image"):
        T.Compose([T.PILToTensor(), T.Normalize(MEAN, STD)])
    with pytest.raises(TypeError, match="not a fastload transform"):
        T.Compose([lambda x: x])


def test_truncation_is_found_even_when_the_crop_is_above_the_cut(bad_files):
    """A region decode stops after the box's last row; the missing
    end-of-image marker still gives the truncation away, for every box."""
    ds = fastload.ImageFiles([bad_files["truncated"]], transform=T.Compose(
        [T.RandomResizedCrop(16, scale=(0.01, 0.02)), T.ToTensor()]))
    for seed in range(20):
        with pytest.raises(fastload.DecodeError, match="truncated.jpg .*premature end"):
            ds._source.sample(0, seed, 0)


def test_channels_last_batches_are_nchw_views(folder):
    torch = pytest.importorskip("torch")
    tf = T.Compose([T.Resize(40), T.CenterCrop(32), T.ToTensor()], channels_last=True)
    images, _ = next(iter(fastload.DataLoader(fastload.ImageFolder(folder, transform=tf),
                                              batch_size=4)))
    assert images.shape == (4, 3, 32, 32)
    assert images.is_contiguous(memory_format=torch.channels_last)
    plain = fastload.ImageFolder(folder, transform=T.Compose([T.Resize(40), T.CenterCrop(32),
                                                              T.ToTensor()]))
    reference, _ = next(iter(fastload.DataLoader(plain, batch_size=4)))
    assert torch.equal(images, reference)


def test_transforms_called_on_an_image(test_images):
    torch = pytest.importorskip("torch")
    path = next(p for p, d in test_images if d.startswith("641x479"))
    with Image.open(path) as img:
        img.load()
        tf = T.Compose([T.Resize(72), T.CenterCrop(64), T.ToTensor()])
        out = tf(img)
        assert isinstance(out, torch.Tensor) and out.shape == (3, 64, 64)
        ds = fastload.ImageFiles([path], transform=tf, decode="exact")
        geometry = ds._source.geometry(0, 0, 0)
        assert psnr(out.numpy().transpose(1, 2, 0), pil_reference(path, geometry)) >= 38
        assert T.RandomResizedCrop(32)(img).shape == (32, 32, 3)  # HWC uint8, no tensor step
        assert T.PILToTensor()(np.asarray(img)).dtype == torch.uint8
        gray = T.Compose([T.CenterCrop(8), T.ToTensor()])(np.zeros((10, 10), np.uint8))
        assert gray.shape == (3, 8, 8)
    with pytest.raises(TypeError, match="uint8"):
        T.ToTensor()(np.zeros((4, 4, 3), np.float32))


def test_image_files_arguments():
    with pytest.raises(ValueError, match="NUL byte"):
        fastload.ImageFiles(["a\0b.jpg"])
    with pytest.raises(ValueError, match="2 paths but labels of shape"):
        fastload.ImageFiles(["a.jpg", "b.jpg"], labels=[1])
    with pytest.raises(ValueError, match="decode must be"):
        fastload.ImageFiles(["a.jpg"], decode="slow")
    with pytest.raises(ValueError, match="on_error must be"):
        fastload.ImageFiles(["a.jpg"], on_error="ignore")
    ds = fastload.ImageFiles([b"/x/a.jpg", "/x/b.jpg"], labels=[3, 4])
    assert list(ds.samples) == [("/x/a.jpg", 3), ("/x/b.jpg", 4)] and ds.targets == [3, 4]


def test_non_jpeg_without_pillow_is_a_clear_error(test_images, monkeypatch):
    import fastload.datasets.images

    bmp = pathlib.Path(next(p for p, d in test_images if p.endswith(".png"))).with_suffix(".bmp")
    Image.new("RGB", (9, 9)).save(bmp)
    monkeypatch.setattr(fastload.datasets.images, "_fallback", lambda: None)
    ds = fastload.ImageFiles([bmp], transform=T.Compose([T.CenterCrop(8), T.ToTensor()]))
    with pytest.raises(fastload.DecodeError, match=r"rgb_200x150.bmp \(sample index 0\): not a "
                                                   "JPEG, PNG or WebP, and Pillow is not "
                                                   "installed"):
        ds[0]


def test_decode_only_counts_and_names_bad_files(bad_files):
    ds = fastload.ImageFiles([bad_files["good"], bad_files["truncated"]])
    assert ds._raw.decode_only([0, 0, -2]) == 3
    with pytest.raises(fastload.DecodeError, match=r"truncated.jpg \(sample index 1\)"):
        ds._raw.decode_only([0, 1])


def test_resize_of_an_extreme_aspect_ratio_keeps_a_pixel(tmp_path):
    # Resize(5, max_size=6) of a 1000 x 3 image: the short side rounds to 0
    # (found by fuzzing: a NaN crop box); it is kept at one pixel.
    path = tmp_path / "strip.jpg"
    Image.fromarray(np.full((3, 1000, 3), 128, np.uint8)).save(path, quality=90)
    out = fastload.ImageFiles([str(path)], transform=T.Compose(
        [T.Resize(5, max_size=6), T.ToTensor()]))[0][0]
    assert out.shape == (3, 1, 6) and np.isfinite(out).all()


@pytest.mark.parametrize("channels_last", [False, True])
def test_uint8_split_for_normalize_on_device(folder, channels_last):
    """normalize_on_device uploads the uint8 form of the same crops and
    applies the fused normalisation on the device; done here on CPU
    tensors, it equals the float pipeline up to the 8-bit quantisation."""
    torch = pytest.importorskip("torch")
    from fastload.loader.upload import _normalize

    ds = fastload.ImageFolder(folder, transform=T.Compose(
        [T.RandomResizedCrop(40), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)],
        channels_last=channels_last))
    mul, add, dtype = ds._device_normalization()
    args = (np.arange(12), None, torch.from_numpy, 5, 1)  # indices, pool, convert, seed, epoch
    (images, labels), _ = ds._native_source().batch(*args)
    (raw, raw_labels), _ = ds._native_source(uint8=True).batch(*args)
    assert raw.dtype == torch.uint8 and raw.shape == images.shape and torch.equal(labels, raw_labels)
    normalized = _normalize(raw, mul, add, dtype)
    expected = (raw.double() * torch.tensor(mul, dtype=torch.float64).view(1, 3, 1, 1)
                + torch.tensor(add, dtype=torch.float64).view(1, 3, 1, 1))
    torch.testing.assert_close(normalized.double(), expected, rtol=0, atol=1e-5)
    half_level = 0.5 / 255 / min(STD) + 1e-5
    assert (normalized - images).abs().max().item() <= half_level
    if channels_last:
        assert normalized.is_contiguous(memory_format=torch.channels_last)
    assert fastload.ImageFolder(folder, transform=T.Compose(
        [T.CenterCrop(8), T.PILToTensor()]))._native_source(uint8=True) is None
