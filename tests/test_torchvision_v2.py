"""torchvision.transforms.v2's RandAugment, TrivialAugmentWide, AutoAugment,
RandomRotation and RandomAffine compiled from a Compose: on a PIL image they
run v1's ops with the same draws, except Solarize's thresholds (255 times
float32 fractions) and RandomAffine's matrix (grouped otherwise), which the
plan takes as v2 has them; bit for bit v2's functional ops on the PIL
image."""

import warnings

import numpy as np
import pytest

pytest.importorskip("PIL")
torch = pytest.importorskip("torch")
from PIL import Image  # noqa: E402

import fastload  # noqa: E402
from fastload import _C  # noqa: E402
from fastload.transforms import from_torchvision as _torchvision  # noqa: E402
from fastload import transforms as T  # noqa: E402
from fl_helpers import fastload_only, synthesized_images  # noqa: E402

pytestmark = fastload_only


@pytest.fixture(scope="module")
def v2(torchvision):
    from torchvision.transforms import v2
    return v2


@pytest.fixture(scope="module")
def images():
    return synthesized_images(11)


def compiled(chain):
    """The plan a torchvision Compose compiles to (no Python part)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        resolved = _torchvision.resolve(chain)
    assert resolved.python is None, resolved.warning
    return resolved.compose.plan


def policies(v2):
    return [v2.RandAugment(num_ops=3, magnitude=15), v2.TrivialAugmentWide(),
            v2.AutoAugment(v2.AutoAugmentPolicy.CIFAR10),
            v2.RandAugment(magnitude=20, interpolation=v2.InterpolationMode.BILINEAR,
                           fill=[40, 90, 200])]


def v2_magnitude(v2, policy, name, bin_, ours, width, height):
    """The magnitude v2 passes its op for bin `bin_`, signed as ours is (its
    Solarize takes a fraction of 255 where ours is the threshold)."""
    magnitudes, signed = policy._AUGMENTATION_SPACE[name]
    bins = 10 if isinstance(policy, v2.AutoAugment) else policy.num_magnitude_bins
    table = magnitudes(bins, height, width)
    magnitude = 0.0 if table is None or table.ndim == 0 else float(table[bin_])
    return -magnitude if signed and ours < 0 else magnitude


@pytest.mark.parametrize("index", range(4))
def test_policies_are_v2s_ops_on_the_pil_image_bit_for_bit(v2, images, index):
    policy = policies(v2)[index]
    geometry = [T.RandomResizedCrop((40, 56)), T.RandomHorizontalFlip()]
    base = T.compile_plan(geometry)
    plan = compiled(v2.Compose([v2.RandomResizedCrop((40, 56)), v2.RandomHorizontalFlip(),
                                policy]))
    assert plan.augment_solarize_v2
    for image in images[:3]:
        for seed in range(12):
            pil = Image.fromarray(_C.transform_image(base, image, seed, T.PILLOW_MAX_PIXELS))
            for name, bin_, magnitude in _C.augment_draws(plan, seed, 0, 0, 56, 40):
                pil = policy._apply_image_or_video_transform(
                    pil, name, v2_magnitude(v2, policy, name, bin_, magnitude, 56, 40),
                    policy.interpolation, policy._fill)
            ours = _C.transform_image(plan, image, seed, T.PILLOW_MAX_PIXELS)
            np.testing.assert_array_equal(ours, np.asarray(pil))


def test_solarize_thresholds_are_v2s(v2):
    """v2 scales float32 fractions by 255 in double: some thresholds lie just
    off v1's, across an integer (246.49999... for 246.5, 238.000001 for 238)."""
    for policy in (v2.RandAugment(magnitude=2), v2.TrivialAugmentWide()):
        plan = compiled(v2.Compose([policy]))
        table = policy._AUGMENTATION_SPACE["Solarize"][0](31, 48, 64)
        seen = 0
        for index in range(400):
            for name, bin_, magnitude in _C.augment_draws(plan, 1, 0, index, 64, 48):
                if name == "Solarize":
                    assert magnitude == 255.0 * float(table[bin_])
                    seen += 1
        assert seen > 0
    v1_plan = T.compile_plan([T.RandAugment(magnitude=2)])
    v2_plan = compiled(v2.Compose([v2.RandAugment(magnitude=2)]))
    v1_plan.augment, v2_plan.augment = 1, 1
    assert vars(v1_plan) == {**vars(v2_plan), "augment_solarize_v2": False}


AFFINES = [
    lambda v2: v2.RandomAffine(45, (0.3, 0.2), (0.7, 1.3), (-20, 20, -10, 10),
                               v2.InterpolationMode.BILINEAR, fill=7),
    lambda v2: v2.RandomAffine(180, (0.5, 0.5), (0.5, 2.0), shear=15, center=(3, 40)),
    lambda v2: v2.RandomRotation((-30, 60), v2.InterpolationMode.BILINEAR, fill=[10, 200, 30],
                                 center=(5, 7)),
    lambda v2: v2.RandomRotation(180),
]


@pytest.mark.parametrize("index", range(len(AFFINES)))
def test_rotation_and_affine_are_v2s_on_the_pil_image_bit_for_bit(v2, images, index):
    from torchvision.transforms.v2 import functional as F
    from torchvision.transforms.v2._utils import _get_fill
    warp = AFFINES[index](v2)
    fill = _get_fill(warp._fill, Image.Image)  # as the class passes it for a PIL image
    plan = compiled(v2.Compose([warp]))
    assert plan.warp_v2 == isinstance(warp, v2.RandomAffine)
    for image in images:
        h, w = image.shape[:2]
        for seed in range(15):
            angle, translate, scale, shear = _C.warp_draws(plan, seed, 0, 0, w, h)
            pil = Image.fromarray(image)
            if isinstance(warp, v2.RandomRotation):
                ref = F.rotate(pil, angle, warp.interpolation, False, warp.center, fill)
            else:
                ref = F.affine(pil, angle, list(translate), scale, list(shear),
                               warp.interpolation, fill, warp.center)
            ours = _C.transform_image(plan, image, seed, T.PILLOW_MAX_PIXELS)
            np.testing.assert_array_equal(ours, np.asarray(ref), err_msg=f"{warp} {image.shape}")


def test_a_v2_recipe_runs_whole_in_c(v2, tmp_path):
    root = tmp_path / "folder"
    (root / "a").mkdir(parents=True)
    for i, image in enumerate(synthesized_images(3)):
        Image.fromarray(image).save(root / "a" / f"{i}.png")
    tf = v2.Compose([v2.RandomResizedCrop(24), v2.RandomHorizontalFlip(), v2.RandomAffine(10),
                     v2.TrivialAugmentWide(), v2.ColorJitter(0.3, 0.3, 0.3, 0.05),
                     v2.RandomGrayscale(), v2.ToImage(), v2.ToDtype(torch.float32, scale=True)])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ds = fastload.ImageFolder(str(root), transform=tf)
    assert ds.transform_plan.python == ()
    runs = [list(fastload.DataLoader(ds, batch_size=2, num_workers=n,
                                     generator=torch.Generator().manual_seed(3)))
            for n in (0, 2)]
    for (x, y), (ox, oy) in zip(*runs):
        assert x.shape[1:] == (3, 24, 24) and torch.equal(x, ox) and torch.equal(y, oy)
