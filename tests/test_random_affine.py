"""RandomRotation and RandomAffine fused into the image pipeline's uint8
stage: bit for bit torchvision's F.rotate / F.affine on the PIL image with
the drawn parameters, the distributions of the draws, their place in the
chain, torchvision's classes compiled from an ImageFolder's Compose, and
determinism across num_workers."""

import math
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


@pytest.fixture(scope="module")
def images():
    """Real-content pictures of several shapes: odd sizes, a square one,
    tiny ones for the filter's borders."""
    return synthesized_images(11)


def reference(F, pil, t, params):
    """torchvision's functional op on the PIL image with the drawn params."""
    from torchvision.transforms import InterpolationMode as IM
    mode = IM.BILINEAR if t.interpolation == "bilinear" else IM.NEAREST
    center = list(t.center) if t.center is not None else None
    fill = list(t.fill)
    angle, translate, scale, shear = params
    if isinstance(t, T.RandomRotation):
        return F.rotate(pil, angle, mode, False, center, fill)
    return F.affine(pil, angle, list(translate), scale, list(shear), mode, fill, center)


WARPS = [
    T.RandomRotation(180),
    T.RandomRotation((-30, 60), "bilinear", fill=(10, 200, 30), center=(5, 7)),
    T.RandomRotation((90, 90)),  # Image.rotate's transpose paths
    T.RandomRotation((180, 180), center=(3.5, 2)),
    T.RandomAffine(45, (0.3, 0.2), (0.7, 1.3), (-20, 20, -10, 10), "bilinear", fill=7),
    T.RandomAffine(10, (0.5, 0.5), shear=15, center=(3, 40)),
    T.RandomAffine(0, (0.25, 0.25)),  # whole-pixel shifts only
    T.RandomAffine((-5, 5), scale=(0.5, 2.0), interpolation="bilinear", fill=[1, 2, 3]),
]


@pytest.mark.parametrize("warp", WARPS, ids=repr)
def test_bit_exact_with_torchvision_on_pil(torchvision, images, warp):
    from torchvision.transforms import functional as F
    plan = T.compile_plan([warp])
    for image in images:
        h, w = image.shape[:2]
        for seed in range(15):
            params = _C.warp_draws(plan, seed, 0, 0, w, h)
            ours = _C.transform_image(plan, image, seed, T.PILLOW_MAX_PIXELS)
            ref = np.asarray(reference(F, Image.fromarray(image), warp, params))
            np.testing.assert_array_equal(ours, ref, err_msg=f"{warp} {image.shape} {params}")


@pytest.mark.parametrize("warp", [WARPS[1], WARPS[4]], ids=repr)
def test_fused_after_geometry_and_before_a_policy(torchvision, images, warp):
    """Crop, flip, warp, policy: the warp acts on the image the geometry
    gives, and the policy on the warped one, as torchvision's chain."""
    from torchvision.transforms import autoaugment as aa
    from torchvision.transforms import functional as F
    geometry = [T.RandomResizedCrop((40, 56)), T.RandomHorizontalFlip()]
    policy = T.TrivialAugmentWide()
    base = T.compile_plan(geometry)
    plan = T.compile_plan([*geometry, warp, policy])
    from torchvision.transforms import InterpolationMode as IM
    for image in images[:3]:
        for seed in range(10):
            resized = _C.transform_image(base, image, seed, T.PILLOW_MAX_PIXELS)
            params = _C.warp_draws(plan, seed, 0, 0, image.shape[1], image.shape[0])
            pil = reference(F, Image.fromarray(resized), warp, params)
            for name, _, magnitude in _C.augment_draws(plan, seed, 0, 0, 56, 40):
                pil = aa._apply_op(pil, name, magnitude, IM.NEAREST, None)
            ours = _C.transform_image(plan, image, seed, T.PILLOW_MAX_PIXELS)
            np.testing.assert_array_equal(ours, np.asarray(pil))


def test_translate_is_drawn_for_the_output_size():
    """After a crop, the shift's range is a fraction of the crop's size."""
    plan = T.compile_plan([T.CenterCrop((10, 40)), T.RandomAffine(0, (1.0, 1.0))])
    shifts = [_C.warp_draws(plan, 3, 0, i, 500, 300)[1] for i in range(2000)]
    assert max(abs(tx) for tx, _ in shifts) == 40
    assert max(abs(ty) for _, ty in shifts) == 10


# ------------------------------------------------------------------ the draws


def draws(t, n=10_000, width=64, height=48, seed=5):
    plan = T.compile_plan([t])
    return [_C.warp_draws(plan, seed, 0, i, width, height) for i in range(n)]


def assert_uniform(values, lo, hi):
    """Kolmogorov-Smirnov against U(lo, hi): 1.95 / sqrt(n) is the 99.9%
    quantile."""
    x = np.sort((np.asarray(values) - lo) / (hi - lo))
    n = len(x)
    d = max(np.max(np.arange(1, n + 1) / n - x), np.max(x - np.arange(n) / n))
    assert d < 1.95 / math.sqrt(n), d
    assert lo <= x.min() * (hi - lo) + lo and x.max() * (hi - lo) + lo < hi


def test_rotation_angle_is_uniform():
    angles = [d[0] for d in draws(T.RandomRotation((-10, 35)))]
    assert_uniform(angles, -10.0, 35.0)
    assert all(d[1:] == ((0, 0), 1.0, (0.0, 0.0)) for d in draws(T.RandomRotation(5), 20))


def test_affine_parameters_have_torchvisions_distributions():
    t = T.RandomAffine((-20, 40), translate=(0.1, 0.3), scale=(0.8, 1.25),
                       shear=(-5, 10, 2, 30))
    width, height = 75, 48
    d = draws(t, width=width, height=height)
    assert_uniform([a for a, _, _, _ in d], -20.0, 40.0)
    assert_uniform([s for _, _, s, _ in d], 0.8, 1.25)
    assert_uniform([sh[0] for _, _, _, sh in d], -5.0, 10.0)
    assert_uniform([sh[1] for _, _, _, sh in d], 2.0, 30.0)
    # round(uniform(-m, m)): integers within the bounds, the two ends
    # half as likely as the inner values (m = 7.5: the ends are -8..-7.5
    # and 7.5..8, rounding to the even 8 only at exactly 7.5)
    tx = np.array([tr[0] for _, tr, _, _ in d])
    ty = np.array([tr[1] for _, tr, _, _ in d])
    assert tx.dtype.kind == "i" and ty.dtype.kind == "i"
    assert np.abs(tx).max() <= round(0.1 * width) and np.abs(ty).max() <= round(0.3 * height)
    counts = np.bincount(ty + 14, minlength=29)  # max_dy = 14.4
    inner = counts[1:-1]
    expected = len(d) / (2 * 14.4)
    assert np.all(np.abs(inner - expected) < 5 * math.sqrt(expected))
    assert abs(tx.mean()) < 0.15 and abs(ty.mean()) < 0.4


def test_shear_of_two_values_leaves_y_unsheared_and_defaults_are_torchvisions():
    d = draws(T.RandomAffine(0, shear=12), n=500)
    assert all(sh[1] == 0.0 and -12 <= sh[0] < 12 for _, _, _, sh in d)
    assert all(x == (0.0, (0, 0), 1.0, (0.0, 0.0)) for x in draws(T.RandomAffine(0), n=20))


def test_draws_are_keyed_by_seed_epoch_and_index_on_their_own_stream(images):
    plan = T.compile_plan([T.RandomAffine(30, (0.2, 0.2))])
    a = [_C.warp_draws(plan, 5, 0, i, 32, 32) for i in range(100)]
    assert a == [_C.warp_draws(plan, 5, 0, i, 32, 32) for i in range(100)]
    assert a != [_C.warp_draws(plan, 5, 1, i, 32, 32) for i in range(100)]
    assert a != [_C.warp_draws(plan, 6, 0, i, 32, 32) for i in range(100)]
    assert _C.warp_draws(T.compile_plan([T.CenterCrop(8)]), 5, 0, 0, 32, 32) is None
    # the crop, flip and policy draws are those of the chain without it
    image = images[0]
    chain = [T.RandomResizedCrop(40), T.RandomHorizontalFlip()]
    with_warp = T.compile_plan([*chain, T.RandomRotation((0, 0)), T.TrivialAugmentWide()])
    without = T.compile_plan([*chain, T.TrivialAugmentWide()])
    for seed in range(20):
        np.testing.assert_array_equal(
            _C.transform_image(with_warp, image, seed, T.PILLOW_MAX_PIXELS),
            _C.transform_image(without, image, seed, T.PILLOW_MAX_PIXELS))


def test_degenerate_affine_gives_the_fill():
    """A scale so small that every source position is 2**30 pixels away."""
    plan = T.compile_plan([T.RandomAffine(0, scale=(1e-12, 1e-12), fill=(9, 8, 7))])
    out = _C.transform_image(plan, np.full((6, 9, 3), 200, np.uint8), 0, T.PILLOW_MAX_PIXELS)
    assert (out == np.array([9, 8, 7], np.uint8)).all()


# ------------------------------------------------------------ chain and errors


def test_order_rules():
    for chain in ([T.RandomRotation(10), T.RandomHorizontalFlip()],
                  [T.RandAugment(), T.RandomAffine(10)],
                  [T.RandomRotation(10), T.RandomAffine(10)],
                  [T.ColorJitter(0.2), T.RandomRotation(10)],
                  [T.ToTensor(), T.RandomAffine(5)],
                  [T.RandomRotation(10), T.Resize(32)]):
        with pytest.raises(ValueError, match="cannot fuse"):
            T.Compose(chain)
    with pytest.raises(ValueError, match="expand=True"):
        T.Compose([T.RandomRotation(10, expand=True)])
    T.Compose([T.Resize(40), T.CenterCrop(32), T.RandomHorizontalFlip(), T.RandomAffine(10),
               T.AutoAugment(), T.ColorJitter(0.1), T.ToTensor()])


def test_calling_directly_works_like_other_transforms(images):
    torch.manual_seed(0)
    out = T.RandomRotation(30)(images[1])
    assert out.shape == images[1].shape and out.dtype == np.uint8


CASES = [
    (lambda m: m.RandomRotation(-3), ValueError, "must be positive"),
    (lambda m: m.RandomRotation([1, 2, 3]), ValueError, "sequence of length 2"),
    (lambda m: m.RandomRotation("abc"), ValueError, "sequence of length 2"),
    (lambda m: m.RandomRotation(3, center=[1]), ValueError, "sequence of length 2"),
    (lambda m: m.RandomRotation(3, center=5), TypeError, "sequence of length 2"),
    (lambda m: m.RandomRotation(3, fill={1}), TypeError, "Fill should be"),
    (lambda m: m.RandomAffine(-1), ValueError, "must be positive"),
    (lambda m: m.RandomAffine(5, translate=0.1), TypeError, "sequence of length 2"),
    (lambda m: m.RandomAffine(5, translate=(0.1, 1.5)), ValueError, "between 0 and 1"),
    (lambda m: m.RandomAffine(5, scale=(0.0, 1.0)), ValueError, "should be positive"),
    (lambda m: m.RandomAffine(5, scale=(1.0,)), ValueError, "sequence of length 2"),
    (lambda m: m.RandomAffine(5, shear=-2), ValueError, "must be positive"),
    (lambda m: m.RandomAffine(5, shear=(1, 2, 3)), ValueError, "sequence of length 2 or 4"),
    (lambda m: m.RandomAffine(5, fill=object()), TypeError, "Fill should be"),
    (lambda m: m.RandomAffine(5, center=(1, 2, 3)), ValueError, "sequence of length 2"),
]


@pytest.mark.parametrize("make, error, message", CASES)
def test_argument_errors_are_torchvisions(torchvision, make, error, message):
    from torchvision import transforms as v1
    with pytest.raises(error, match=message):
        make(v1)
    with pytest.raises(error, match=message):
        make(T)


def test_what_torchvision_only_raises_later_is_refused_at_once():
    with pytest.raises(ValueError, match="min <= max"):
        T.RandomRotation((10, -10))
    with pytest.raises(ValueError, match="NEAREST or BILINEAR"):
        T.RandomAffine(5, interpolation="bicubic")
    with pytest.raises(ValueError, match="fill"):
        T.RandomRotation(5, fill=(1, 2))
    assert T.RandomAffine(5, fill=7.9).fill == (7, 7, 7)


# ------------------------------------------------- torchvision's own classes


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("folder")
    return imagenet_like.make_image_folder(str(root), n_images=24, n_classes=2, processes=1)


def test_imagefolder_with_torchvision_compose_compiles_and_is_worker_independent(
        torchvision, folder):
    from torchvision import transforms as v1
    for warp in (v1.RandomRotation(20, v1.InterpolationMode.BILINEAR, fill=[5, 6, 7]),
                 v1.RandomAffine(15, (0.1, 0.1), (0.9, 1.1), 8, center=[10, 12])):
        tf = v1.Compose([v1.RandomResizedCrop(48), v1.RandomHorizontalFlip(), warp,
                         v1.TrivialAugmentWide(), v1.ToTensor(),
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
    tf = v1.Compose([v1.CenterCrop(30), v1.RandomAffine((-3, 9), (0.2, 0.4), (0.5, 1.5),
                                                        (1, 2, 3, 4),
                                                        v1.InterpolationMode.BILINEAR,
                                                        fill=[1, 2, 3], center=[4, 5])])
    plan = _torchvision.resolve(tf).compose.plan
    own = T.compile_plan([T.CenterCrop(30), T.RandomAffine((-3, 9), (0.2, 0.4), (0.5, 1.5),
                                                            (1, 2, 3, 4), "bilinear",
                                                            (1, 2, 3), (4, 5))])
    assert vars(plan) == vars(own)
    assert plan.warp_shear_y == (3.0, 4.0) and plan.warp_has_center
    tf = v1.Compose([v1.RandomRotation(7, center=(1, 2), fill=4)])
    plan = _torchvision.resolve(tf).compose.plan
    assert plan.warp == 1 and plan.warp_degrees == (-7.0, 7.0) and plan.warp_fill == (4.0,) * 3


def test_unmapped_parameters_stay_in_python(torchvision):
    from torchvision import transforms as v1
    from torchvision.transforms import v2
    from fastload.transforms import from_torchvision as _torchvision
    for step in (v1.RandomRotation(10, expand=True),
                 v1.RandomAffine(5, interpolation=v1.InterpolationMode.BICUBIC),
                 v2.RandomRotation(10, fill={Image.Image: 3}),  # a fill per image type
                 v2.RandomAffine(5, interpolation=v2.InterpolationMode.BICUBIC)):
        resolved = _torchvision.resolve(v1.Compose([v1.RandomResizedCrop(32), step]))
        assert resolved.python is not None and resolved.warning
        assert "no exact C equivalent" in resolved.warning


def test_warped_image_is_stored_in_every_dtype_and_layout():
    """After the uint8 stage, each output dtype and layout holds the warped
    uint8 image's values (converted through per-channel tables of the
    stored value)."""
    rng = np.random.default_rng(4)
    image = rng.integers(0, 256, (23, 37, 3), dtype=np.uint8)
    warp = T.RandomRotation(30, "bilinear", fill=(9, 99, 199))
    mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]

    def run(extra, **kw):
        return _C.transform_image(T.compile_plan([warp, *extra], **kw), image, 5,
                                  T.PILLOW_MAX_PIXELS)

    u8 = run([])
    assert u8.dtype == np.uint8 and u8.shape == (23, 37, 3)
    unit = u8.transpose(2, 0, 1).astype(np.float32) / 255
    np.testing.assert_array_equal(run([T.PILToTensor()]), u8.transpose(2, 0, 1))
    np.testing.assert_allclose(run([T.ToTensor()]), unit, rtol=0, atol=1e-6)
    np.testing.assert_allclose(run([T.ToTensor()], channels_last=True), unit.transpose(1, 2, 0),
                               rtol=0, atol=1e-6)
    half = run([T.PILToTensor(), T.ConvertImageDtype("float16")])
    assert half.dtype == np.float16
    np.testing.assert_allclose(half, unit, rtol=0, atol=5e-4)
    normalised = run([T.ToTensor(), T.Normalize(mean, std)])
    expected = (unit - np.float32(mean)[:, None, None]) / np.float32(std)[:, None, None]
    np.testing.assert_allclose(normalised, expected, rtol=0, atol=1e-5)
