"""RandAugment, TrivialAugmentWide and AutoAugment fused into the image
pipeline: each op against torchvision's own (autoaugment._apply_op on the
PIL image, bit for bit), the magnitude tables, the distribution of the
draws, torchvision's classes compiled from an ImageFolder's Compose, and
determinism across num_workers."""

import collections
import pathlib
import sys
import warnings

import numpy as np
import pytest

pytest.importorskip("PIL")
torch = pytest.importorskip("torch")

from PIL import Image  # noqa: E402

import fastload  # noqa: E402
from fastload import _C  # noqa: E402
from fastload import transforms as T  # noqa: E402
from fl_helpers import fastload_only, synthesized_images  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "benchmarks"))
import imagenet_like  # noqa: E402

pytestmark = fastload_only

SPACE = ["Identity", "ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate", "Brightness",
         "Color", "Contrast", "Sharpness", "Posterize", "Solarize", "AutoContrast", "Equalize"]
SIGNED = {"ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate", "Brightness", "Color",
          "Contrast", "Sharpness"}


@pytest.fixture(scope="module")
def aa(torchvision):
    from torchvision.transforms import autoaugment
    return autoaugment


@pytest.fixture(scope="module")
def images():
    """Real-content pictures of several shapes (a square one for Rotate's
    transpose paths, tiny ones for the filter's borders)."""
    return synthesized_images(7)


MAGNITUDES = {
    "ShearX": [-0.99, -0.3, 0.1, 0.6], "ShearY": [-0.2, 0.3, 0.99],
    "TranslateX": [-45.3, -32.0, 10.7], "TranslateY": [-20.0, 5.0, 31.9],
    "Rotate": [-135.0, -90.0, -12.5, 0.0, 7.3, 30.0, 90.0, 180.0],
    "Brightness": [-0.99, -0.3, 0.0, 0.5, 0.9], "Color": [-0.9, 0.4, 0.99],
    "Contrast": [-0.9, 0.0, 0.4, 0.99], "Sharpness": [-1.0, -0.9, 0.3, 0.99],
    "Posterize": [1, 2, 4, 5, 8], "Solarize": [-3.0, 0.0, 93.0, 127.5, 255.0, 255.5, 300.0],
    "AutoContrast": [0.0], "Equalize": [0.0], "Invert": [0.0], "Identity": [0.0],
}


@pytest.mark.parametrize("op", sorted(MAGNITUDES))
def test_each_op_is_bit_exact_with_torchvision_on_pil(aa, images, op):
    from torchvision.transforms import InterpolationMode as IM
    for image in images:
        for magnitude in MAGNITUDES[op]:
            for code, mode in ((0, IM.NEAREST), (1, IM.BILINEAR)):
                for fill in (None, [10, 200, 30]):
                    ref = np.asarray(aa._apply_op(Image.fromarray(image), op, float(magnitude),
                                                  mode, fill))
                    ours = _C.pil_op(op, image, float(magnitude), code, fill or (0, 0, 0))
                    np.testing.assert_array_equal(ours, ref, err_msg=f"{op} {magnitude} "
                                                  f"{image.shape} {mode} {fill}")


def test_warps_and_blends_are_bit_exact_on_thin_and_chunk_edge_images(aa):
    """The bilinear warp works a row in chunks of 64 pixels and skips the
    neighbours a zero weight never uses (ShearX, ShearY); Color makes its
    gray values 256 pixels at a time, and Sharpness filters rows 512 values
    at a time: one-pixel-wide and -high images, widths just past a chunk,
    and rows that leave the image partway, against Pillow."""
    from torchvision.transforms import InterpolationMode as IM
    rng = np.random.default_rng(3)
    for w, h in ((1, 9), (9, 1), (2, 2), (3, 3), (65, 3), (129, 17), (173, 4), (345, 6)):
        image = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        for op, magnitude in (("ShearX", 0.99), ("ShearX", -0.3), ("ShearY", 0.6),
                              ("ShearY", -0.99), ("Rotate", 7.3), ("Rotate", -135.0),
                              ("Color", 0.4), ("Color", -0.9), ("Sharpness", 0.99),
                              ("Sharpness", -0.6), ("Sharpness", -1.0)):
            ref = np.asarray(aa._apply_op(Image.fromarray(image), op, magnitude, IM.BILINEAR,
                                          [10, 200, 30]))
            ours = _C.pil_op(op, image, magnitude, 1, (10, 200, 30))
            np.testing.assert_array_equal(ours, ref, err_msg=f"{op} {magnitude} {w}x{h}")


def test_blends_clip_like_pillow_at_extreme_factors(aa, images):
    """Extrapolating blends clip each value: large factors (integer clipping)
    and factors past 2^22 (float clipping) give Pillow's bytes."""
    from torchvision.transforms import InterpolationMode as IM
    for image in images[:3]:
        for op in ("Color", "Sharpness", "Contrast", "Brightness"):
            for magnitude in (40.0, -40.0, 5e6, -5e6, 3e9):
                ref = np.asarray(aa._apply_op(Image.fromarray(image), op, magnitude,
                                              IM.NEAREST, None))
                ours = _C.pil_op(op, image, magnitude, 0, (0, 0, 0))
                np.testing.assert_array_equal(ours, ref, err_msg=f"{op} {magnitude}")


def test_pil_op_refuses_what_pillow_refuses():
    image = np.zeros((4, 4, 3), np.uint8)
    with pytest.raises(ValueError, match="unknown op"):
        _C.pil_op("Blur", image, 0.0, 0, (0, 0, 0))
    with pytest.raises(ValueError, match="Posterize"):
        _C.pil_op("Posterize", image, 0.0, 0, (0, 0, 0))


# ------------------------------------------------------------------ the draws


def plan_of(aug):
    return T.compile_plan([aug])


def draws(aug, n, width=64, height=48, seed=11):
    plan = plan_of(aug)
    return [_C.augment_draws(plan, seed, 0, i, width, height) for i in range(n)]


def space(aa, aug, bins, width, height):
    if isinstance(aug, T.TrivialAugmentWide):
        return aa.TrivialAugmentWide()._augmentation_space(bins)
    return aa.RandAugment()._augmentation_space(bins, (height, width))


@pytest.mark.parametrize("aug", [T.RandAugment(num_ops=3, magnitude=17),
                                 T.RandAugment(magnitude=4, num_magnitude_bins=10),
                                 T.TrivialAugmentWide(), T.TrivialAugmentWide(11),
                                 T.AutoAugment(), T.AutoAugment("cifar10"),
                                 T.AutoAugment("svhn")])
@pytest.mark.parametrize("size", [(64, 48), (331, 200), (97, 131)])
def test_magnitudes_are_torchvisions_tables(aa, aug, size):
    width, height = size
    bins = 10 if isinstance(aug, T.AutoAugment) else aug.num_magnitude_bins
    table = space(aa, aug, bins, width, height)
    seen = set()
    for ops in draws(aug, 600, width, height):
        for name, b, magnitude in ops:
            if name == "Invert":
                assert magnitude == 0.0
                continue
            values, signed = table[name]
            expected = float(values[b].item()) if values.ndim > 0 else 0.0
            assert abs(magnitude) == expected and (signed or magnitude >= 0), (name, b)
            if isinstance(aug, T.RandAugment) and values.ndim > 0:
                assert b == aug.magnitude
            seen.add(name)
    assert len(seen) >= 5


def chi_square(counts, expected):
    return sum((c - e) ** 2 / e for c, e in zip(counts, expected))


def test_trivial_augment_distribution():
    ops = [d[0] for d in draws(T.TrivialAugmentWide(), 10_000)]
    assert all(len(d) == 1 for d in draws(T.TrivialAugmentWide(), 50))
    counts = collections.Counter(name for name, _, _ in ops)
    # 13 degrees of freedom: the 99.9% quantile is 34.5
    assert chi_square([counts[n] for n in SPACE], [10_000 / 14] * 14) < 34.5
    binned = [(b, m) for name, b, m in ops if name in SIGNED]
    bins = collections.Counter(b for b, _ in binned)
    assert chi_square([bins[b] for b in range(31)], [len(binned) / 31] * 31) < 59.7  # 30 dof
    negative = sum(m < 0 for b, m in binned if b > 0) / sum(1 for b, _ in binned if b > 0)
    assert 0.47 < negative < 0.53


def test_rand_augment_distribution():
    all_draws = draws(T.RandAugment(), 5_000)
    assert all(len(d) == 2 for d in all_draws)
    counts = collections.Counter(name for d in all_draws for name, _, _ in d)
    assert chi_square([counts[n] for n in SPACE], [10_000 / 14] * 14) < 34.5
    signs = [m < 0 for d in all_draws for name, _, m in d if name in SIGNED]
    assert 0.47 < sum(signs) / len(signs) < 0.53


def test_auto_augment_applies_each_op_with_its_probability(aa):
    """Expected applications per draw, from torchvision's own policy table:
    each sub-policy 1/25, each of its ops with its p."""
    policies = aa.AutoAugment()._get_policies(aa.AutoAugmentPolicy.IMAGENET)
    expected = collections.Counter()
    for sub in policies:
        for name, p, _ in sub:
            expected[name] += p / len(policies)
    n = 10_000
    counts = collections.Counter(name for d in draws(T.AutoAugment(), n) for name, _, _ in d)
    for name, e in expected.items():
        assert abs(counts[name] / n - e) < 4 * np.sqrt(e / n) + 1e-9, name
    assert set(counts) <= set(expected)


def test_draws_are_keyed_by_seed_epoch_and_index():
    plan = plan_of(T.TrivialAugmentWide())
    a = [_C.augment_draws(plan, 5, 0, i, 32, 32) for i in range(200)]
    assert a == [_C.augment_draws(plan, 5, 0, i, 32, 32) for i in range(200)]
    assert a != [_C.augment_draws(plan, 5, 1, i, 32, 32) for i in range(200)]
    assert a != [_C.augment_draws(plan, 6, 0, i, 32, 32) for i in range(200)]


def test_crop_and_flip_draws_are_unchanged_by_a_policy(images):
    """The policy draws from its own stream: the geometry-only chain gives
    the same crop and flip, sample for sample."""
    image = images[0]
    base = T.compile_plan([T.RandomResizedCrop(40), T.RandomHorizontalFlip()])
    with_policy = T.compile_plan([T.RandomResizedCrop(40), T.RandomHorizontalFlip(),
                                  T.RandAugment(num_ops=0)])
    for seed in range(20):
        np.testing.assert_array_equal(
            _C.transform_image(base, image, seed, T.PILLOW_MAX_PIXELS),
            _C.transform_image(with_policy, image, seed, T.PILLOW_MAX_PIXELS))


# --------------------------------------------------------- the fused chain


@pytest.mark.parametrize("aug", [T.RandAugment(num_ops=3, magnitude=15), T.TrivialAugmentWide(),
                                 T.AutoAugment(), T.RandAugment(interpolation="bilinear",
                                                                fill=(40, 90, 200))])
def test_fused_chain_matches_torchvision_ops_on_the_resized_image(aa, images, aug):
    """The chain's output is torchvision's ops, as drawn, on the image the
    geometry alone gives: bit for bit."""
    from torchvision.transforms import InterpolationMode as IM
    geometry = [T.RandomResizedCrop((40, 56)), T.RandomHorizontalFlip()]
    base = T.compile_plan(geometry)
    plan = T.compile_plan([*geometry, aug])
    mode = IM.BILINEAR if aug.interpolation == "bilinear" else IM.NEAREST
    fill = list(aug.fill) if aug.fill != (0, 0, 0) else None
    for image in images[:3]:
        for seed in range(12):
            resized = _C.transform_image(base, image, seed, T.PILLOW_MAX_PIXELS)
            pil = Image.fromarray(resized)
            for name, _, magnitude in _C.augment_draws(plan, seed, 0, 0, 56, 40):
                pil = aa._apply_op(pil, name, magnitude, mode, fill)
            ours = _C.transform_image(plan, image, seed, T.PILLOW_MAX_PIXELS)
            np.testing.assert_array_equal(ours, np.asarray(pil))


def test_the_policy_then_colour_ops_and_normalize(images):
    """With ColorJitter and Normalize after it, the stages compose: the
    uint8 result of the policy goes through the float stage."""
    image = images[0]
    aug = T.TrivialAugmentWide()
    norm = T.Normalize([0.4, 0.5, 0.6], [0.2, 0.25, 0.3])
    jitter = T.ColorJitter(brightness=(1.3, 1.3))
    first = T.compile_plan([T.RandomResizedCrop(32), aug])
    full = T.compile_plan([T.RandomResizedCrop(32), aug, jitter, T.ToTensor(), norm])
    for seed in range(8):
        u8 = _C.transform_image(first, image, seed, T.PILLOW_MAX_PIXELS)
        expected = np.clip(u8.astype(np.float32) * np.float32(1.3), 0, 255) / np.float32(255)
        expected = (expected.transpose(2, 0, 1) - np.array(norm.mean, np.float32)[:, None, None]) \
            / np.array(norm.std, np.float32)[:, None, None]
        ours = _C.transform_image(full, image, seed, T.PILLOW_MAX_PIXELS)
        np.testing.assert_allclose(ours, expected, atol=1e-4)


def test_calling_a_policy_directly_works_like_other_transforms(images):
    torch.manual_seed(0)
    out = T.RandAugment()(images[0])
    assert out.shape == images[0].shape and out.dtype == np.uint8
    out = T.Compose([T.AutoAugment(), T.ToTensor()])(Image.fromarray(images[1]))
    assert tuple(out.shape) == (3, 131, 97)


def test_order_rules():
    for chain in ([T.RandAugment(), T.RandomHorizontalFlip()],
                  [T.RandAugment(), T.TrivialAugmentWide()],
                  [T.ColorJitter(0.2), T.AutoAugment()],
                  [T.ToTensor(), T.RandAugment()],
                  [T.RandAugment(), T.Resize(32)]):
        with pytest.raises(ValueError, match="cannot fuse"):
            T.Compose(chain)
    T.Compose([T.Resize(40), T.CenterCrop(32), T.RandomHorizontalFlip(), T.AutoAugment(),
               T.ColorJitter(0.1), T.RandomGrayscale(), T.ToTensor()])


@pytest.mark.parametrize("make, message", [
    (lambda: T.RandAugment(magnitude=31), "magnitude"),
    (lambda: T.RandAugment(num_ops=17), "num_ops"),
    (lambda: T.RandAugment(num_magnitude_bins=1, magnitude=0), "num_magnitude_bins"),
    (lambda: T.TrivialAugmentWide(interpolation="bicubic"), "NEAREST or BILINEAR"),
    (lambda: T.TrivialAugmentWide(fill=(1, 2)), "fill"),
    (lambda: T.AutoAugment(fill=300), "fill"),
    (lambda: T.AutoAugment("mnist"), "not recognized"),
])
def test_argument_validation(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_fill_is_truncated_as_torchvision_does_for_pil():
    assert T.RandAugment(fill=7.9).fill == (7, 7, 7)
    assert T.RandAugment(fill=[3]).fill == (3, 3, 3)
    assert T.AutoAugment(fill=(1, 2.5, 3)).fill == (1, 2, 3)


# ------------------------------------------------- torchvision's own classes


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("folder")
    return imagenet_like.make_image_folder(str(root), n_images=24, n_classes=2, processes=1)


@pytest.mark.parametrize("policy", ["RandAugment", "TrivialAugmentWide", "AutoAugment"])
def test_imagefolder_with_torchvision_compose_compiles_and_is_worker_independent(
        torchvision, folder, policy):
    from torchvision import transforms as v1
    tf = v1.Compose([v1.RandomResizedCrop(48), v1.RandomHorizontalFlip(),
                     getattr(v1, policy)(), v1.ToTensor(),
                     v1.Normalize([0.5] * 3, [0.25] * 3)])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ds = fastload.ImageFolder(folder, transform=tf)
    assert ds.transform_plan.python == ()
    runs = [list(fastload.DataLoader(ds, batch_size=8, shuffle=True, num_workers=n,
                                     generator=torch.Generator().manual_seed(3)))
            for n in (0, 2)]
    for (x, y), (ox, oy) in zip(*runs):
        assert torch.equal(x, ox) and torch.equal(y, oy)


def test_torchvision_parameters_are_carried_over(torchvision):
    from torchvision import transforms as v1
    from fastload.transforms import from_torchvision as _torchvision
    tf = v1.Compose([v1.CenterCrop(30), v1.RandAugment(3, 5, 12, v1.InterpolationMode.BILINEAR,
                                                       fill=[1, 2, 3])])
    plan = _torchvision.resolve(tf).compose.plan
    own = T.compile_plan([T.CenterCrop(30), T.RandAugment(3, 5, 12, "bilinear", (1, 2, 3))])
    assert vars(plan) == vars(own)
    tf = v1.Compose([v1.AutoAugment(v1.AutoAugmentPolicy.SVHN)])
    assert _torchvision.resolve(tf).compose.plan.augment_table == 2


def test_unmapped_parameters_stay_in_python(torchvision):
    from torchvision import transforms as v1
    from torchvision.transforms import v2
    from fastload.transforms import from_torchvision as _torchvision
    for step in (v1.RandAugment(interpolation=v1.InterpolationMode.BICUBIC),
                 v2.RandAugment(fill={Image.Image: 3}),  # a fill per image type
                 v2.TrivialAugmentWide(interpolation=v2.InterpolationMode.BICUBIC)):
        resolved = _torchvision.resolve(v1.Compose([v1.RandomResizedCrop(32), step]))
        assert resolved.python is not None and resolved.warning
