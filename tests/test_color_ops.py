"""ColorJitter, RandomGrayscale and Grayscale fused into the image pipeline:
fidelity against torchvision's tensor functions on the same resized image,
the distribution of the random draws, that crop and flip draws are left as
they were, determinism across num_workers, and torchvision's argument
rules."""

import pathlib
import sys

import numpy as np
import pytest

PIL = pytest.importorskip("PIL")

import fastload  # noqa: E402
from fastload import _C  # noqa: E402
from fastload import transforms as T  # noqa: E402
from fl_helpers import (fastload_only, torchvision_colour,  # noqa: E402
                        torchvision_colour_chain)

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "benchmarks"))
import imagenet_like  # noqa: E402
import pil_pipeline  # noqa: E402

pytestmark = fastload_only

BRIGHTNESS, CONTRAST, SATURATION, HUE = range(4)
GEOMETRY = [T.RandomResizedCrop(72), T.RandomHorizontalFlip()]
# each adjustment's factors: darkening, identity's neighbours, extrapolation; hue both ways
OP_FACTORS = [
    (BRIGHTNESS, (0.0, 0.6, 1.4, 2.5)),
    (CONTRAST, (0.0, 0.6, 1.4, 2.5)),
    (SATURATION, (0.0, 0.6, 1.4, 2.5)),
    (HUE, (-0.5, -0.1, 0.05, 0.3, 0.5)),
]


def torchvision_functional():
    torch = pytest.importorskip("torch")
    tv = pil_pipeline.torchvision_or_none()
    if tv is None:
        pytest.skip("torchvision is not importable")
    from torchvision.transforms import functional as F
    return torch, F


@pytest.fixture(scope="module")
def images():
    """ImageNet-like pictures with real colour content, and a saturated
    pattern (pure hues, grays, black and white) for the HSV edge cases."""
    bank = imagenet_like.texture_bank(0)
    out = []
    for i, (w, h) in enumerate(((160, 120), (97, 131), (200, 200))):
        rng = np.random.default_rng([7, i])
        out.append(np.asarray(imagenet_like.synthesize(rng, w, h, bank).convert("RGB")))
    levels = np.array([0, 64, 128, 255], np.uint8)
    grid = np.stack(np.meshgrid(levels, levels, levels, indexing="ij"), -1).reshape(-1, 3)
    out.append(np.ascontiguousarray(np.repeat(np.repeat(grid.reshape(8, 8, 3), 12, 0), 12, 1)))
    return out


def run(transforms, image, seed, order=None):
    """The chain on one image as CHW float32 in [0, 1]; `order` fixes the
    jitter's order (the private hook the tests use)."""
    plan = T.compile_plan([*transforms, T.ToTensor()])
    plan.jitter_order = order
    return _C.transform_image(plan, image, seed, T.PILLOW_MAX_PIXELS)


def psnr(actual, reference):
    mse = np.mean((np.asarray(actual, np.float64) - np.asarray(reference, np.float64)) ** 2)
    return 99.0 if mse == 0 else 10 * np.log10(1.0 / mse)


def fixed(op, factor):
    """A ColorJitter whose only adjustment is `op`, at exactly `factor`."""
    ranges = [0, 0, 0, 0]
    ranges[op] = (factor, factor)
    return T.ColorJitter(*ranges)


# ------------------------------------------------------------------ fidelity


@pytest.mark.parametrize("op, factors", OP_FACTORS)
def test_each_op_matches_torchvision_tensor_functions(images, op, factors):
    torch, F = torchvision_functional()
    for seed, image in enumerate(images):
        resized = torch.from_numpy(run(GEOMETRY, image, seed))
        for factor in factors:
            ours = run([*GEOMETRY, fixed(op, factor)], image, seed)
            reference = torchvision_colour(F, resized, op, factor).numpy()
            assert psnr(ours, reference) >= 40, (op, factor, seed)


def test_grayscale_matches_torchvision(images):
    torch, F = torchvision_functional()
    for seed, image in enumerate(images):
        resized = torch.from_numpy(run(GEOMETRY, image, seed))
        reference = F.rgb_to_grayscale(resized, num_output_channels=3).numpy()
        for gray in (T.Grayscale(num_output_channels=3), T.RandomGrayscale(p=1.0)):
            ours = run([*GEOMETRY, gray], image, seed)
            assert psnr(ours, reference) >= 50
            np.testing.assert_array_equal(ours[0], ours[1])
            np.testing.assert_array_equal(ours[1], ours[2])


@pytest.mark.parametrize("order", [(0, 1, 2, 3), (3, 2, 1, 0), (1, 3, 0, 2), (2, 0, 3, 1)])
@pytest.mark.parametrize("gray_first", [False, True])
def test_the_chain_matches_torchvision_in_the_given_order(images, order, gray_first):
    torch, F = torchvision_functional()
    factors = (1.3, 0.7, 1.5, 0.12)
    jitter = T.ColorJitter(*[(f, f) for f in factors])
    gray = T.RandomGrayscale(p=1.0)
    colour = [gray, jitter] if gray_first else [jitter, gray]
    for seed, image in enumerate(images):
        reference = torchvision_colour_chain(F, torch.from_numpy(run(GEOMETRY, image, seed)),
                                             order, factors, gray_first)
        ours = run([*GEOMETRY, *colour], image, seed, order=order)
        assert psnr(ours, reference.numpy()) >= 40, (order, seed)


def test_colour_ops_leave_the_crop_and_flip_as_they_were(images):
    """The colour draws come from their own stream: the same seed gives the
    same box and flip with and without them (checked through grayscale,
    which is a fixed function of the resized pixels)."""
    image = images[0]
    weights = np.array([0.2989, 0.587, 0.114], np.float32)[:, None, None]
    for seed in range(20):
        plain = run(GEOMETRY, image, seed)
        gray = run([*GEOMETRY, T.ColorJitter(0.4, 0.4, 0.4, 0.1), T.RandomGrayscale(1.0)],
                   image, seed)
        assert gray.shape == plain.shape
        # After the jitter the levels differ, but the gray image still
        # shows the same crop: its edges correlate with the plain one's.
        plain_gray = (plain * weights).sum(0)
        corr = np.corrcoef(np.diff(plain_gray, axis=1).ravel(), np.diff(gray[0], axis=1).ravel())
        assert abs(corr[0, 1]) > 0.5, seed


def test_plans_without_colour_ops_give_the_same_bytes(images):
    """Identity colour settings (torchvision's None) take the one-pass path."""
    for seed, image in enumerate(images):
        plain = run(GEOMETRY, image, seed)
        same = run([*GEOMETRY, T.ColorJitter(), T.RandomGrayscale(p=0.0)], image, seed)
        np.testing.assert_array_equal(plain, same)


@pytest.mark.parametrize("dtype_chain", [
    [T.PILToTensor()],
    [T.PILToTensor(), T.ConvertImageDtype("float16")],
    [T.ToTensor(), T.Normalize((0.5, 0.4, 0.3), (0.2, 0.25, 0.3))],
])
def test_colour_ops_feed_every_dtype_and_layout(images, dtype_chain):
    image = images[0]
    colour = [T.ColorJitter(brightness=(1.2, 1.2), saturation=(0.5, 0.5))]
    floats = T.compile_plan([*GEOMETRY, *colour, T.ToTensor()])
    expected = _C.transform_image(floats, image, 5, T.PILLOW_MAX_PIXELS)
    for channels_last in (False, True):
        plan = T.compile_plan([*GEOMETRY, *colour, *dtype_chain], channels_last)
        out = _C.transform_image(plan, image, 5, T.PILLOW_MAX_PIXELS).astype(np.float64)
        if channels_last:
            out = out.transpose(2, 0, 1)
        mul = np.array(plan.mul)[:, None, None] * 255
        add = np.array(plan.add)[:, None, None]
        tolerance = 0.5 * mul.max() + 1e-6 if plan.dtype == "uint8" else 2e-3 * np.abs(out).max()
        np.testing.assert_allclose(out, expected * mul + add, atol=tolerance)


def test_compose_called_on_an_image_applies_the_colour_ops(images):
    torch = pytest.importorskip("torch")
    out = T.Compose([T.CenterCrop(64), T.Grayscale(num_output_channels=3), T.ToTensor()])(
        images[0])
    assert isinstance(out, torch.Tensor) and out.shape == (3, 64, 64)
    assert torch.equal(out[0], out[2])


# ------------------------------------------------------------------ the draws


def draws(transforms, n=10_000, seed=1234):
    plan = T.compile_plan(transforms)
    return [_C.color_draws(plan, seed, 0, i) for i in range(n)]


def chi_square(counts, expected):
    counts = np.asarray(counts, np.float64)
    return float(((counts - expected) ** 2 / expected).sum())


def test_factors_are_uniform_in_torchvisions_ranges():
    jitter = T.ColorJitter(brightness=0.4, contrast=(0.2, 0.9), saturation=2.0, hue=0.1)
    ranges = [(0.6, 1.4), (0.2, 0.9), (0.0, 3.0), (-0.1, 0.1)]
    samples = np.array([factors for _, factors, _ in draws([jitter])])
    for op, (lo, hi) in enumerate(ranges):
        column = samples[:, op]
        assert lo <= column.min() and column.max() <= hi
        counts, _ = np.histogram(column, bins=10, range=(lo, hi))
        # 9 degrees of freedom: 27.9 is the 0.999 quantile.  The seed is
        # fixed, so this is deterministic.
        assert chi_square(counts, len(column) / 10) < 27.9, op


def test_the_order_is_uniform_over_all_24():
    orders = [order for order, _, _ in draws([T.ColorJitter(0.4, 0.4, 0.4, 0.1)])]
    assert all(sorted(order) == [0, 1, 2, 3] for order in orders)
    distinct = sorted(set(orders))
    assert len(distinct) == 24
    counts = [orders.count(order) for order in distinct]
    # 23 degrees of freedom: 49.7 is the 0.999 quantile.
    assert chi_square(counts, len(orders) / 24) < 49.7


def test_off_adjustments_draw_no_factor():
    (_, factors, gray), = draws([T.ColorJitter(contrast=0.5)], n=1)
    assert factors[0] is None and factors[2] is None and factors[3] is None
    assert 0.5 <= factors[1] <= 1.5
    assert gray is False


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_grayscale_frequency_is_p(p):
    grays = [gray for _, _, gray in draws([T.RandomGrayscale(p)])]
    # Binomial(10000, p): 4 standard deviations.
    assert abs(sum(grays) - 10_000 * p) < 4 * (10_000 * p * (1 - p)) ** 0.5
    assert not any(gray for _, _, gray in draws([T.RandomGrayscale(0.0)], n=200))
    assert all(gray for _, _, gray in draws([T.RandomGrayscale(1.0)], n=200))


def test_draws_depend_on_seed_epoch_and_index():
    plan = T.compile_plan([T.ColorJitter(0.4, 0.4, 0.4, 0.1)])
    base = _C.color_draws(plan, 1, 0, 0)
    assert _C.color_draws(plan, 1, 0, 0) == base
    assert _C.color_draws(plan, 2, 0, 0) != base
    assert _C.color_draws(plan, 1, 1, 0) != base
    assert _C.color_draws(plan, 1, 0, 1) != base


# --------------------------------------------------------------- the loader


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("folder")
    return imagenet_like.make_image_folder(str(root), n_images=24, n_classes=2, processes=1)


def test_same_output_for_any_num_workers(folder):
    torch = pytest.importorskip("torch")
    transform = T.Compose([T.RandomResizedCrop(40), T.RandomHorizontalFlip(),
                           T.ColorJitter(0.4, 0.4, 0.4, 0.1), T.RandomGrayscale(0.3),
                           T.ToTensor(), T.Normalize((0.5,) * 3, (0.25,) * 3)])
    ds = fastload.ImageFolder(folder, transform=transform)

    def epoch(workers):
        loader = fastload.DataLoader(ds, batch_size=8, num_workers=workers, shuffle=True,
                                     generator=torch.Generator().manual_seed(11))
        return [x.numpy().copy() for x, _ in loader]

    reference = epoch(0)
    for workers in (1, 2):
        for x, rx in zip(epoch(workers), reference):
            np.testing.assert_array_equal(x, rx)


# ------------------------------------------------------------ argument rules


@pytest.mark.parametrize("kwargs", [
    {"brightness": -0.1},
    {"contrast": (1.5, 0.5)},
    {"saturation": (1, 2, 3)},
    {"hue": 0.6},
    {"hue": (-0.7, 0.2)},
    {"brightness": "bright"},
])
def test_jitter_arguments_fail_as_torchvision_does(kwargs):
    _, _ = torchvision_functional()
    import torchvision.transforms as TV
    with pytest.raises(Exception) as theirs:
        TV.ColorJitter(**kwargs)
    with pytest.raises(type(theirs.value)) as ours:
        T.ColorJitter(**kwargs)
    assert str(ours.value) == str(theirs.value)


def test_jitter_ranges_are_torchvisions():
    jitter = T.ColorJitter(brightness=0.4, contrast=1.5, saturation=(0.2, 0.3), hue=0.1)
    assert jitter.brightness == (0.6, 1.4)
    assert jitter.contrast == (0.0, 2.5)  # clipped at 0
    assert jitter.saturation == (0.2, 0.3)
    assert jitter.hue == (-0.1, 0.1)
    assert T.ColorJitter(brightness=(1, 1), hue=0).brightness is None


def test_grayscale_arguments():
    with pytest.raises(ValueError, match="num_output_channels should be either 1 or 3"):
        T.Grayscale(2)
    assert T.Grayscale().num_output_channels == 1  # torchvision's default
    with pytest.raises(ValueError, match="without ToTensor or PILToTensor after it"):
        T.Compose([T.CenterCrop(8), T.Grayscale()])
    with pytest.raises(ValueError, match="3 channels' statistics for the 1 channel"):
        T.Compose([T.Grayscale(), T.ToTensor(), T.Normalize((0.5, 0.5, 0.5), (0.2,) * 3)])
    with pytest.raises(ValueError, match="either a single value or 1"):
        T.Compose([T.Grayscale(), T.ToTensor(), T.RandomErasing(value=(0, 0, 0))])
    with pytest.raises(ValueError, match=r"p must be in \[0, 1\]"):
        T.RandomGrayscale(1.5)


def test_colour_ops_are_fused_only_after_the_geometry():
    jitter = T.ColorJitter(0.4)
    with pytest.raises(ValueError, match="cannot fuse"):
        T.Compose([jitter, T.RandomResizedCrop(10)])
    with pytest.raises(ValueError, match="cannot fuse"):
        T.Compose([T.Resize(20), T.RandomGrayscale(), T.CenterCrop(10)])
    with pytest.raises(ValueError, match="cannot fuse"):
        T.Compose([T.ToTensor(), jitter])
    with pytest.raises(ValueError, match="cannot fuse"):
        T.Compose([jitter, T.ColorJitter(hue=0.1)])
    with pytest.raises(ValueError, match="cannot fuse"):
        T.Compose([T.RandomGrayscale(), T.Grayscale(num_output_channels=3)])
    # A flip commutes with the colour ops, so it may follow them.
    plan = T.Compose([T.RandomResizedCrop(10), jitter, T.RandomHorizontalFlip(),
                      T.RandomGrayscale(), T.ToTensor()]).plan
    assert plan.flip_p == 0.5 and plan.gray_p == 0.1 and not plan.gray_first
    assert T.Compose([T.RandomGrayscale(), jitter]).plan.gray_first


def test_malformed_colour_plans_are_refused(images):
    plan = T.compile_plan([T.ColorJitter(0.4)])
    plan.hue = (0.2, 0.7)
    with pytest.raises(ValueError, match="colour factor range"):
        _C.transform_image(plan, images[0], 0, T.PILLOW_MAX_PIXELS)
    plan = T.compile_plan([T.ColorJitter(0.4)])
    plan.jitter_order = (0, 1, 1, 2)
    with pytest.raises(ValueError, match="jitter_order.*permutation"):
        _C.transform_image(plan, images[0], 0, T.PILLOW_MAX_PIXELS)
    plan = T.compile_plan([T.ColorJitter(0.4, uint8=True)])
    plan.color_pil = True
    with pytest.raises(ValueError, match="color_uint8"):
        _C.transform_image(plan, images[0], 0, T.PILLOW_MAX_PIXELS)


# --------------------------------------------- on a uint8 tensor (uint8=True)


def run_uint8(transforms, image, seed, order=None):
    """The chain on one image as the CHW uint8 tensor PILToTensor gives."""
    plan = T.compile_plan([*transforms, T.PILToTensor()])
    plan.jitter_order = order
    return _C.transform_image(plan, image, seed, T.PILLOW_MAX_PIXELS)


def uint8_differences(ours, reference):
    """(largest difference, share of values that differ) of two uint8 images."""
    d = np.abs(np.asarray(ours, np.int32) - np.asarray(reference, np.int32))
    return int(d.max()), float((d > 0).mean())


@pytest.mark.parametrize("op, factors", OP_FACTORS)
def test_each_op_on_a_uint8_tensor_is_torchvisions(images, op, factors):
    """v1's tensor functions on the uint8 tensor, bit for bit, but for the
    hue, whose HSV round trip fastload computes in fewer divisions (a value
    moves by one level where the exact result is within float error of a
    whole number); v2's likewise, and v2 also sums the gray that saturation
    blends with in fused multiply-adds (torch's add with alpha), moving a
    value by one level where the blend lands on a whole number."""
    torch, F = torchvision_functional()
    from torchvision.transforms.v2 import functional as F2
    for seed, image in enumerate(images):
        resized = torch.from_numpy(run_uint8(GEOMETRY, image, seed))
        for factor in factors:
            ours = run_uint8([*GEOMETRY, fixed_uint8(op, factor)], image, seed)
            assert ours.dtype == np.uint8
            for version, functions, inexact in (("v1", F, {HUE}), ("v2", F2, {HUE, SATURATION})):
                reference = torchvision_colour(functions, resized, op, factor)
                if op not in inexact:
                    np.testing.assert_array_equal(ours, reference,
                                                  err_msg=f"{version} {op} {factor} {seed}")
                most, share = uint8_differences(ours, reference)
                assert most <= 1 and share < 0.02, (version, op, factor, seed)


def fixed_uint8(op, factor):
    jitter = fixed(op, factor)
    jitter.uint8 = True
    return jitter


@pytest.mark.parametrize("channels", [1, 3])
def test_grayscale_of_a_uint8_tensor_is_torchvisions(images, channels):
    torch, F = torchvision_functional()
    for seed, image in enumerate(images):
        resized = torch.from_numpy(run_uint8(GEOMETRY, image, seed))
        reference = F.rgb_to_grayscale(resized, num_output_channels=channels).numpy()
        grays = [T.Grayscale(channels, uint8=True)]
        if channels == 3:
            grays.append(T.RandomGrayscale(p=1.0, uint8=True))
        for gray in grays:
            np.testing.assert_array_equal(run_uint8([*GEOMETRY, gray], image, seed), reference)


@pytest.mark.parametrize("order", [(0, 1, 2, 3), (3, 2, 1, 0), (1, 3, 0, 2), (2, 0, 3, 1)])
@pytest.mark.parametrize("gray_first", [False, True])
def test_the_uint8_chain_is_torchvisions_in_the_given_order(images, order, gray_first):
    torch, F = torchvision_functional()
    factors = (1.3, 0.7, 1.5, 0.12)
    jitter = T.ColorJitter(*[(f, f) for f in factors], uint8=True)
    gray = T.RandomGrayscale(p=1.0, uint8=True)
    colour = [gray, jitter] if gray_first else [jitter, gray]
    for seed, image in enumerate(images):
        reference = torchvision_colour_chain(
            F, torch.from_numpy(run_uint8(GEOMETRY, image, seed)), order, factors, gray_first)
        ours = run_uint8([*GEOMETRY, *colour], image, seed, order=order)
        # the hue's one-level differences, which a later contrast or
        # saturation can stretch to two
        most, share = uint8_differences(ours, reference.numpy())
        assert most <= 2 and share < 0.01, (order, seed)


def test_uint8_colour_ops_draw_as_the_float_ones_and_feed_the_float_conversion(images):
    """The same draws as without uint8=True (only the arithmetic differs),
    and ConvertImageDtype + Normalize after them see the uint8 values."""
    jitter = dict(brightness=0.4, contrast=0.4, saturation=0.4, hue=0.1)
    fixed_geometry = [T.Resize(72), T.CenterCrop(72)]  # only the colour draws follow the seed
    for seed, image in enumerate(images):
        ours = run_uint8([*fixed_geometry, T.ColorJitter(**jitter, uint8=True)], image, seed)
        floats = run([*fixed_geometry, T.ColorJitter(**jitter)], image, seed)
        other_draws = run([*fixed_geometry, T.ColorJitter(**jitter)], image, seed + 100)
        # the truncations, which contrast and saturation stretch, move
        # values by a few levels; other draws move them by far more
        assert np.abs(ours / 255.0 - floats).max() < 10 / 255
        assert np.abs(ours / 255.0 - other_draws).max() > 40 / 255
        plan = T.compile_plan([*fixed_geometry, T.ColorJitter(**jitter, uint8=True),
                               T.PILToTensor(), T.ConvertImageDtype("float32"),
                               T.Normalize((0.5,) * 3, (0.25,) * 3)])
        normalized = _C.transform_image(plan, image, seed, T.PILLOW_MAX_PIXELS)
        np.testing.assert_allclose(normalized, (ours / np.float32(255) - 0.5) / 0.25, atol=2e-6)


def test_uint8_arithmetic_is_refused_where_it_has_no_meaning():
    with pytest.raises(ValueError, match="two different arithmetics"):
        T.ColorJitter(0.4, pil=True, uint8=True)
    with pytest.raises(ValueError, match="two different arithmetics"):
        T.RandomGrayscale(uint8=True, pil=True)
    with pytest.raises(ValueError, match="same arithmetic"):
        T.Compose([T.ColorJitter(0.4, uint8=True), T.RandomGrayscale()])
    with pytest.raises(ValueError, match="rounds a uint8 blur"):
        T.Compose([T.ColorJitter(0.4, uint8=True), T.GaussianBlur(3), T.PILToTensor()])
    assert repr(T.Grayscale(3, uint8=True)) == "Grayscale(num_output_channels=3, uint8=True)"
