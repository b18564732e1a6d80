"""RandomCrop with padding in the C pipeline: bit-exact against
torchvision's RandomCrop (v1 and v2) on the same image with the same
offsets, for every padding mode and shape; offsets uniform over the
positions; the same batches for any num_workers; JPEG and PNG files through
fastload.ImageFolder against torchvision's ImageFolder."""

import contextlib
import importlib
import warnings

import numpy as np
import pytest

PIL = pytest.importorskip("PIL")
from PIL import Image  # noqa: E402

import fastload  # noqa: E402
from fastload import transforms as T  # noqa: E402
from fl_helpers import fastload_only  # noqa: E402

pytestmark = fastload_only

CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR_STD = (0.2470, 0.2435, 0.2616)

# (width, height): odd sizes, one smaller than every crop, one a single row
SIZES = [(17, 13), (32, 32), (41, 29), (5, 7), (9, 1)]


def smooth_image(rng, width, height):
    """Noise over a gradient, so every pixel differs from its neighbours."""
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 7, y * 5, (x + y) * 3], axis=2)
    return ((base + rng.integers(0, 40, (height, width, 3))) % 256).astype(np.uint8)


@pytest.fixture(scope="module")
def png_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("random_crop_png")
    rng = np.random.default_rng(7)
    paths = []
    for i, (w, h) in enumerate(SIZES):
        path = root / f"{i}_{w}x{h}.png"
        Image.fromarray(smooth_image(rng, w, h)).save(path)
        paths.append(str(path))
    return paths


def v2_module(torchvision):
    return importlib.import_module("torchvision.transforms.v2")


@contextlib.contextmanager
def forced_offsets(torchvision, top, left):
    """torchvision's RandomCrop (v1 and v2) with the crop corner given."""
    v1 = torchvision.transforms.RandomCrop
    v2 = v2_module(torchvision).RandomCrop
    saved_v1, saved_v2 = v1.__dict__["get_params"], v2.make_params

    def v1_params(img, output_size):
        return top, left, output_size[0], output_size[1]

    def v2_params(self, flat_inputs):
        params = saved_v2(self, flat_inputs)
        params.update(top=top, left=left)
        return params

    v1.get_params = staticmethod(v1_params)
    v2.make_params = v2_params
    try:
        yield
    finally:
        v1.get_params = saved_v1
        v2.make_params = saved_v2


def torchvision_crop(torchvision, crop, image, crop_at):
    with forced_offsets(torchvision, *crop_at):
        return np.asarray(crop(image))


def torchvision_padded(torchvision, crop, image):
    """The image torchvision's RandomCrop (v1) `crop` cuts its window from:
    `image` padded by its own forward, caught where it asks for the offsets.
    Its output at any offsets is F.crop of this image there."""
    v1 = torchvision.transforms.RandomCrop
    saved = v1.__dict__["get_params"]
    seen = []

    def catch(img, output_size):
        seen.append(img)
        return 0, 0, output_size[0], output_size[1]

    v1.get_params = staticmethod(catch)
    try:
        crop(image)
    finally:
        v1.get_params = saved
    (padded,) = seen
    return padded


CONFIGS = [
    dict(size=32, padding=4),
    dict(size=(8, 11), padding=(2, 3), padding_mode="edge"),
    dict(size=(9, 6), padding=(1, 2, 3, 4), padding_mode="reflect"),
    dict(size=(9, 6), padding=[4, 3, 2, 1], padding_mode="symmetric"),
    dict(size=7, padding=25, padding_mode="reflect"),  # reflections past the image
    dict(size=7, padding=25, padding_mode="symmetric"),
    dict(size=(20, 24), pad_if_needed=True, padding_mode="reflect"),
    dict(size=(20, 24), padding=3, pad_if_needed=True, padding_mode="reflect"),
    dict(size=(20, 24), padding=(1, 0, 2, 5), pad_if_needed=True, padding_mode="symmetric"),
    dict(size=(20, 24), padding=2, pad_if_needed=True, padding_mode="edge"),
    dict(size=30, padding=(0, 6), pad_if_needed=True, fill=(255, 7, 128)),
    dict(size=5, padding=3, fill=200),
    dict(size=3),
]


def fits(config, width, height):
    crop = T.RandomCrop(**config)
    left, top, right, bottom = crop.padding_ltrb
    w, h = width + left + right, height + top + bottom
    if crop.pad_if_needed:
        w, h = max(w, crop.size[1]), max(h, crop.size[0])
    return w >= crop.size[1] and h >= crop.size[0]


@pytest.mark.parametrize("version", ["v1", "v2"])
@pytest.mark.parametrize("config", CONFIGS, ids=repr)
def test_bit_exact_against_torchvision(torchvision, png_files, config, version):
    module = torchvision.transforms if version == "v1" else v2_module(torchvision)
    crop = module.RandomCrop(**config)
    ds = fastload.ImageFiles(png_files, transform=module.Compose([crop]))
    assert ds.transform_plan.python == ()
    checked = 0
    for i, path in enumerate(png_files):
        with Image.open(path) as opened:
            image = opened.convert("RGB")
        if not fits(config, *image.size):
            with pytest.raises(fastload.DecodeError, match="Required crop size"):
                ds._source.sample(i, 1, 0)
            continue
        for seed in range(4):
            out = ds._source.sample(i, seed, 0)
            crop_at = ds._source.geometry(i, seed, 0)["crop_at"]
            expected = torchvision_crop(torchvision, crop, image, crop_at)
            np.testing.assert_array_equal(out, expected, err_msg=f"{path} seed {seed}")
            checked += 1
    assert checked >= 8


@pytest.mark.parametrize("config", CONFIGS, ids=repr)
def test_transform_on_an_image_is_a_crop_of_the_padded_image(torchvision, config):
    """Called on an image, the output is one of the windows torchvision's
    pad gives (every position compared)."""
    rng = np.random.default_rng(3)
    image = smooth_image(rng, 27, 25)
    if not fits(config, 27, 25):
        pytest.skip("the crop does not fit this image")
    crop = T.RandomCrop(**config)
    out = T.Compose([crop])(image)
    tv_crop = torchvision.transforms.RandomCrop(**config)
    th, tw = crop.size
    # torchvision's forward at offsets (top, left) is F.crop of its padded
    # image there: pad once, then cut every window.
    padded = torchvision_padded(torchvision, tv_crop, Image.fromarray(image))
    crop_at = torchvision.transforms.functional.crop
    windows = set()
    for top in range(0, 80):
        for left in range(0, 80):
            try:
                windows.add(np.asarray(crop_at(padded, top, left, *tv_crop.size)).tobytes())
            except ValueError:
                pass
    assert out.shape == (th, tw, 3)
    assert out.tobytes() in windows


def test_offsets_are_uniform_over_the_positions(png_files):
    """(size 17 x 13 padded by 4: 25 x 21 for a 16 x 16 crop -> 10 x 6 positions.)"""
    n = 3000
    ds = fastload.ImageFiles([png_files[0]] * n, transform=T.Compose([T.RandomCrop(16, padding=4)]))
    counts = np.zeros((6, 10))
    for i in range(n):
        top, left = ds._source.geometry(i, 11, 0)["crop_at"]
        counts[top, left] += 1
    assert counts.min() > 0
    expected = n / counts.size
    chi2 = ((counts - expected) ** 2 / expected).sum()
    assert chi2 < 120  # 59 degrees of freedom: p < 1e-5 above this


def test_same_batches_for_any_num_workers(png_files):
    torch = pytest.importorskip("torch")
    tf = T.Compose([T.RandomCrop(16, padding=4, padding_mode="reflect"),
                    T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(CIFAR_MEAN, CIFAR_STD)])
    paths = [png_files[0], png_files[1], png_files[2]] * 8
    ds = fastload.ImageFiles(paths, transform=tf)

    def run(workers):
        loader = fastload.DataLoader(ds, batch_size=5, num_workers=workers, shuffle=True,
                                     generator=torch.Generator().manual_seed(5))
        return [x.numpy().copy() for x, _ in loader]

    reference = run(0)
    for a, b in zip(run(2), reference):
        np.testing.assert_array_equal(a, b)


def test_cifar_recipe_compiles_from_torchvision(torchvision, png_files):
    torch = pytest.importorskip("torch")
    tvt = torchvision.transforms
    for module in (tvt, v2_module(torchvision)):
        recipe = module.Compose([module.RandomCrop(32, padding=4), module.RandomHorizontalFlip(),
                                 module.ToTensor() if module is tvt else module.ToImage(),
                                 *([] if module is tvt else
                                   [module.ToDtype(torch.float32, scale=True)]),
                                 module.Normalize(CIFAR_MEAN, CIFAR_STD)])
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            ds = fastload.ImageFiles(png_files, transform=recipe)
        assert ds.transform_plan.python == ()
        assert ds[1][0].shape == (3, 32, 32)


def test_resize_then_random_crop(torchvision, png_files):
    """Without padding after a Resize, the crop is a box of the resized
    image (resampled, so compared by PSNR); with padding it is not fused."""
    tf = T.Compose([T.Resize(48), T.RandomCrop(40), T.ToTensor()])
    ds = fastload.ImageFiles([png_files[2]], transform=tf)
    with Image.open(png_files[2]) as opened:
        image = opened.convert("RGB")
    tv = torchvision.transforms
    for seed in range(3):
        top, left = ds._source.geometry(0, seed, 0)["crop_at"]
        reference = np.asarray(tv.Resize(48)(image), np.float64)[top:top + 40, left:left + 40]
        out = ds._source.sample(0, seed, 0).transpose(1, 2, 0) * 255.0
        mse = np.mean((out - reference) ** 2)
        assert 10 * np.log10(255.0 ** 2 / max(mse, 1e-12)) >= 35
    with pytest.raises(ValueError, match="RandomCrop pads only as the first geometric step"):
        T.Compose([T.Resize(48), T.RandomCrop(40, padding=2)])
    with pytest.raises(ValueError, match="cannot fuse"):
        T.Compose([T.RandomCrop(40), T.CenterCrop(30)])
    mixed = tv.Compose([tv.Resize(48), tv.RandomCrop(40, padding=2), tv.ToTensor()])
    with pytest.warns(UserWarning, match="RandomCrop"):
        ds = fastload.ImageFiles([png_files[2]], transform=mixed)
    assert [type(t).__name__ for t in ds.transform_plan.native] == ["Resize"]


def test_arguments_are_checked():
    with pytest.raises(ValueError, match="Padding mode"):
        T.RandomCrop(8, padding=1, padding_mode="wrap")
    with pytest.raises(ValueError, match="Padding must be"):
        T.RandomCrop(8, padding=(1, 2, 3))
    with pytest.raises(ValueError, match="negative padding"):
        T.RandomCrop(8, padding=-1)
    with pytest.raises(ValueError, match="fill"):
        T.RandomCrop(8, padding=1, fill=(1, 2))
    with pytest.raises(ValueError, match="0..255"):
        T.RandomCrop(8, padding=1, fill=300)


def test_a_crop_larger_than_the_image_names_the_file(png_files):
    ds = fastload.ImageFiles([png_files[3]], transform=T.Compose([T.RandomCrop(16)]))
    with pytest.raises(fastload.DecodeError, match=r"5x7.png.*Required crop size \(16, 16\) is larger than "
                                        r"input image size \(7, 5\)"):
        ds[0]


@pytest.fixture(scope="module")
def image_folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("random_crop_folder")
    rng = np.random.default_rng(9)
    for label, ext in (("jpeg", "jpg"), ("png", "png")):
        (root / label).mkdir()
        for i, (w, h) in enumerate([(40, 30), (33, 47), (64, 64), (25, 21)]):
            image = Image.fromarray(smooth_image(rng, w, h))
            image.save(root / label / f"{i}.{ext}", **({"quality": 90} if ext == "jpg" else {}))
    return str(root)


@pytest.mark.parametrize("mode", ["constant", "reflect", "symmetric", "edge"])
def test_image_folder_against_torchvision(torchvision, image_folder, mode):
    """Same crop offsets forced into torchvision: PNG bit-exact; JPEG
    bit-exact against the crop of fastload's own full decode (only the
    window's pixels are decoded here), and close to Pillow's decode."""
    tv = torchvision.transforms
    crop = tv.RandomCrop(32, padding=(4, 6), padding_mode=mode, fill=(9, 99, 199))
    ours = fastload.ImageFolder(image_folder, transform=tv.Compose([crop]))
    theirs = torchvision.datasets.ImageFolder(image_folder)
    whole = fastload.ImageFolder(image_folder)  # the full decode, untransformed
    assert ours.transform_plan.python == ()
    for i, (path, label) in enumerate(theirs.samples):
        for seed in (0, 1):
            crop_at = ours._source.geometry(i, seed, 0)["crop_at"]
            out = ours._source.sample(i, seed, 0)
            reference = torchvision_crop(torchvision, crop, theirs[i][0], crop_at)
            if path.endswith(".png"):
                np.testing.assert_array_equal(out, reference)
                continue
            own = torchvision_crop(torchvision, crop, Image.fromarray(whole[i][0]), crop_at)
            np.testing.assert_array_equal(out, own)
            mse = np.mean((out.astype(np.float64) - reference) ** 2)
            assert mse == 0 or 10 * np.log10(255.0 ** 2 / mse) >= 40
