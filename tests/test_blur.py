"""GaussianBlur and RandomApply in the C image pipeline: the kernel equals
torchvision's, the output is within a PSNR floor of torchvision's
F.gaussian_blur (uint8, so rounded) on the same image and sigma, sigma is
uniform over its range, and RandomApply runs its op at the rate p."""

import importlib
import warnings

import numpy as np
import pytest

PIL = pytest.importorskip("PIL")
torch = pytest.importorskip("torch")
from PIL import Image  # noqa: E402

import fastload  # noqa: E402
from fastload import _C  # noqa: E402
from fastload import transforms as T  # noqa: E402
from fl_helpers import fastload_only  # noqa: E402

pytestmark = fastload_only

PSNR_FLOOR = 45.0  # dB against torchvision's uint8 output: rounding (docs/design.md)


def psnr(actual, reference):
    mse = np.mean((np.asarray(actual, np.float64) - np.asarray(reference, np.float64)) ** 2)
    return 99.0 if mse == 0 else 10 * np.log10(1.0 / mse)


def impulse(width, height):
    image = np.zeros((height, width, 3), np.uint8)
    image[height // 2, width // 2] = 255
    return image


@pytest.mark.parametrize("kernel_size, sigma", [(23, 1.7), ((5, 9), 0.8), (3, 0.1), (1, 2.0)])
def test_kernel_equals_torchvisions(torchvision, kernel_size, sigma):
    """The blur of an impulse is the 2-D kernel: the outer product of
    torchvision's own 1-D kernels."""
    from torchvision.transforms._functional_tensor import _get_gaussian_kernel1d

    kx, ky = (kernel_size, kernel_size) if isinstance(kernel_size, int) else kernel_size
    out = T.Compose([T.GaussianBlur(kernel_size, sigma=sigma), T.ToTensor()])(impulse(41, 41))
    kernel_x = _get_gaussian_kernel1d(kx, sigma, torch.float32, "cpu").numpy()
    kernel_y = _get_gaussian_kernel1d(ky, sigma, torch.float32, "cpu").numpy()
    expected = np.zeros((41, 41), np.float32)
    expected[20 - ky // 2:21 + ky // 2, 20 - kx // 2:21 + kx // 2] = np.outer(kernel_y, kernel_x)
    for channel in out.numpy():
        np.testing.assert_allclose(channel, expected, rtol=2e-6, atol=1e-9)


def photo_like(rng, width, height):
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 3 + y, y * 4, (x * y) % 97 * 2], axis=2).astype(np.float64)
    return np.clip(base % 256 + rng.normal(0, 12, (height, width, 3)), 0, 255).astype(np.uint8)


@pytest.fixture(scope="module")
def png_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("blur")
    rng = np.random.default_rng(1)
    paths = []
    for i, (w, h) in enumerate([(64, 48), (37, 53), (120, 90)]):
        path = root / f"{i}.png"
        Image.fromarray(photo_like(rng, w, h)).save(path)
        paths.append(str(path))
    return paths


def test_psnr_floor_against_torchvision(torchvision, png_files):
    """Against F.gaussian_blur on the uint8 tensor of the same image with the
    sigma drawn here (and against the PIL path, the same numbers): not
    exact, because torchvision rounds its result to uint8 (and sums the 2-D
    kernel in another order)."""
    from torchvision.transforms import functional as F

    tf = T.Compose([T.GaussianBlur(23, sigma=(0.1, 2.0)), T.ToTensor()])
    ds = fastload.ImageFiles(png_files, transform=tf)
    worst = 99.0
    for i, path in enumerate(png_files):
        with Image.open(path) as opened:
            image = opened.convert("RGB")
        for seed in range(6):
            sigma = ds._source.geometry(i, seed, 0)["blur_sigma"]
            out = ds._source.sample(i, seed, 0)
            tensor = torch.from_numpy(np.array(image)).permute(2, 0, 1).contiguous()
            expected = F.gaussian_blur(tensor, [23, 23], [sigma, sigma]).numpy() / 255.0
            via_pil = np.asarray(F.gaussian_blur(image, [23, 23], [sigma, sigma]))
            np.testing.assert_array_equal(via_pil.transpose(2, 0, 1), expected * 255.0)
            assert np.abs(out - expected).max() <= 1.0 / 255.0
            worst = min(worst, psnr(out, expected))
    assert worst >= PSNR_FLOOR, worst


def test_sigma_is_uniform_over_its_range(png_files):
    n = 4000
    ds = fastload.ImageFiles([png_files[0]] * n,
                             transform=T.Compose([T.GaussianBlur(5, sigma=(0.5, 1.5))]))
    sigmas = np.array([ds._source.geometry(i, 2, 0)["blur_sigma"] for i in range(n)])
    assert sigmas.min() >= 0.5 and sigmas.max() <= 1.5
    counts, _ = np.histogram(sigmas, bins=10, range=(0.5, 1.5))
    chi2 = ((counts - n / 10) ** 2 / (n / 10)).sum()
    assert chi2 < 40  # 9 degrees of freedom: p < 1e-5 above this
    fixed = fastload.ImageFiles([png_files[0]], transform=T.Compose([T.GaussianBlur(5, 0.7)]))
    assert fixed._source.geometry(0, 2, 0)["blur_sigma"] == 0.7


def test_random_apply_rate(png_files):
    n = 4000
    blur = T.Compose([T.RandomApply([T.GaussianBlur(5)], p=0.3)])
    ds = fastload.ImageFiles([png_files[0]] * n, transform=blur)
    applied = sum(ds._source.geometry(i, 4, 0)["blur_sigma"] is not None for i in range(n))
    assert abs(applied - 0.3 * n) < 5 * (n * 0.3 * 0.7) ** 0.5

    jitter = T.Compose([T.RandomApply([T.ColorJitter(0.4, 0.4, 0.4, 0.1)], p=0.8)]).plan
    on = sum(_C.color_draws(jitter, 4, 0, i)[1][0] is not None for i in range(n))
    assert abs(on - 0.8 * n) < 5 * (n * 0.8 * 0.2) ** 0.5

    # p = 1 draws no coin: the numbers are those of the op alone
    alone = T.Compose([T.ColorJitter(0.4, 0.4, 0.4, 0.1)]).plan
    always = T.Compose([T.RandomApply([T.ColorJitter(0.4, 0.4, 0.4, 0.1)], p=1.0)]).plan
    for i in range(20):
        assert _C.color_draws(alone, 4, 0, i) == _C.color_draws(always, 4, 0, i)


def test_random_apply_skips_the_op(png_files):
    image = photo_like(np.random.default_rng(2), 30, 20)
    never = T.Compose([T.RandomApply([T.GaussianBlur(9)], p=0.0), T.ToTensor()])
    plain = T.Compose([T.ToTensor()])
    np.testing.assert_array_equal(never(image).numpy(), plain(image).numpy())
    jitter_never = T.Compose([T.RandomApply([T.ColorJitter(0.9, 0.9)], p=0.0), T.ToTensor()])
    np.testing.assert_array_equal(jitter_never(image).numpy(), plain(image).numpy())


def test_simclr_recipe(torchvision, png_files):
    recipe = [T.RandomResizedCrop(32), T.RandomHorizontalFlip(),
              T.RandomApply([T.ColorJitter(0.4, 0.4, 0.4, 0.1)], p=0.8),
              T.RandomGrayscale(0.2), T.GaussianBlur(23), T.ToTensor(),
              T.Normalize((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))]
    ds = fastload.ImageFiles(png_files, transform=T.Compose(recipe))
    assert ds[0][0].shape == (3, 32, 32)
    loader = fastload.DataLoader(ds, batch_size=3, num_workers=2,
                                 generator=torch.Generator().manual_seed(0))
    batches = [x.numpy() for x, _ in loader]
    reference = [x.numpy() for x, _ in fastload.DataLoader(
        ds, batch_size=3, num_workers=0, generator=torch.Generator().manual_seed(0))]
    np.testing.assert_array_equal(batches[0], reference[0])

    tv = torchvision.transforms
    blur_only = tv.Compose([tv.RandomResizedCrop(32), tv.RandomHorizontalFlip(),
                            tv.RandomApply([tv.GaussianBlur(23)], p=0.5), tv.ToTensor()])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ds = fastload.ImageFiles(png_files, transform=blur_only)
    assert ds.transform_plan.python == ()
    v2 = importlib.import_module("torchvision.transforms.v2")
    ds = fastload.ImageFiles(png_files, transform=v2.Compose([v2.GaussianBlur((5, 7), (0.2, 1.0))]))
    assert ds.transform_plan.python == ()
    # torchvision's SimCLR recipe compiles whole, its colour ops with Pillow's arithmetic
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ds = fastload.ImageFiles(png_files, transform=tv.Compose(
            [tv.RandomResizedCrop(32), tv.RandomHorizontalFlip(),
             tv.RandomApply([tv.ColorJitter(0.4, 0.4, 0.4, 0.1)], p=0.8),
             tv.RandomGrayscale(0.2), tv.GaussianBlur(23), tv.ToTensor()]))
    assert ds.transform_plan.python == () and ds._plan.color_pil


def test_order_and_arguments():
    T.Compose([T.GaussianBlur(3), T.RandomHorizontalFlip(), T.ToTensor()])  # a flip commutes
    with pytest.raises(ValueError, match="cannot fuse"):
        T.Compose([T.GaussianBlur(3), T.ColorJitter(0.4)])
    with pytest.raises(ValueError, match="cannot fuse"):
        T.Compose([T.ToTensor(), T.GaussianBlur(3)])
    with pytest.raises(ValueError, match="odd and positive"):
        T.GaussianBlur(4)
    with pytest.raises(ValueError, match="must be positive"):
        T.GaussianBlur(3, sigma=0)
    with pytest.raises(ValueError, match=r"of the form \(min, max\)"):
        T.GaussianBlur(3, sigma=(2.0, 1.0))
    with pytest.raises(ValueError, match="one ColorJitter or one GaussianBlur"):
        T.RandomApply([T.RandomHorizontalFlip()])
    with pytest.raises(ValueError, match=r"p must be in \[0, 1\]"):
        T.RandomApply([T.GaussianBlur(3)], p=1.5)
