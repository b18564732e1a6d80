"""ColorJitter, RandomGrayscale and Grayscale with Pillow's arithmetic
(``pil=True``, what torchvision's classes compile to): bit for bit
torchvision's functional ops on the PIL image for the same factors and
order (ImageEnhance, the 8-bit HSV hue shift, convert("L")), run after the
augmentation policy on the uint8 image; torchvision's v1 and v2 classes
compile to them."""

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
from fl_helpers import (fastload_only, torchvision_colour,  # noqa: E402
                        torchvision_colour_chain)

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "benchmarks"))
import imagenet_like  # noqa: E402

pytestmark = fastload_only

BRIGHTNESS, CONTRAST, SATURATION, HUE = range(4)


@pytest.fixture(scope="module")
def F(torchvision):
    from torchvision.transforms import functional
    return functional


@pytest.fixture(scope="module")
def images():
    """A picture with real colour content; random pixels; and a grid of
    pure hues, grays, black and white (the HSV edge cases)."""
    bank = imagenet_like.texture_bank(0)
    picture = np.asarray(imagenet_like.synthesize(np.random.default_rng(3), 96, 72, bank)
                         .convert("RGB"))
    noise = np.random.default_rng(5).integers(0, 256, (128, 256, 3), dtype=np.uint8)
    levels = np.array([0, 1, 64, 127, 128, 254, 255], np.uint8)
    grid = np.stack(np.meshgrid(levels, levels, levels, indexing="ij"), -1).reshape(49, 7, 3)
    return [picture, noise, np.ascontiguousarray(grid)]


def f32(x):
    """A factor as torch draws it: a float32 value."""
    return float(np.float32(x))


def run(transforms, image, order=None, seed=0):
    plan = T.compile_plan(transforms)
    plan.jitter_order = order  # the test hook fixing the order
    return _C.transform_image(plan, image, seed, T.PILLOW_MAX_PIXELS)


def fixed(op, factor):
    """A Pillow-arithmetic ColorJitter doing only `op`, at exactly `factor`."""
    ranges = [0, 0, 0, 0]
    ranges[op] = (factor, factor)
    return T.ColorJitter(*ranges, pil=True)


@pytest.mark.parametrize("op, factors", [
    (BRIGHTNESS, (0.0, 0.37, 1.0, 1.4, 2.5)),
    (CONTRAST, (0.0, 0.61, 1.4, 2.5)),
    (SATURATION, (0.0, 0.6, 1.8, 3.0)),
    # the hue shift truncates hue * 255 toward zero and wraps negative ones
    (HUE, (-0.5, -0.3, -0.2999, -0.0001, 0.0039, 0.1, 0.5)),
])
def test_each_op_is_torchvisions_on_the_pil_image_bit_for_bit(F, images, op, factors):
    for image in images:
        for factor in map(f32, factors):
            ours = run([fixed(op, factor)], image)
            reference = np.asarray(torchvision_colour(F, Image.fromarray(image), op, factor))
            np.testing.assert_array_equal(ours, reference, err_msg=f"{op} {factor}")


def test_grayscale_is_pillows_luma(F, images):
    for image in images:
        reference = np.asarray(F.rgb_to_grayscale(Image.fromarray(image), num_output_channels=3))
        for gray in (T.Grayscale(3, pil=True), T.RandomGrayscale(p=1.0, pil=True)):
            np.testing.assert_array_equal(run([gray], image), reference)
    # the tensor weights (0.2989 for red) round some pixels differently
    noise = images[1]
    assert not np.array_equal(run([T.Grayscale(3)], noise), run([T.Grayscale(3, pil=True)], noise))


@pytest.mark.parametrize("order", [(0, 1, 2, 3), (3, 2, 1, 0), (1, 3, 0, 2)])
@pytest.mark.parametrize("gray_first", [False, True])
def test_the_chain_is_torchvisions_in_the_given_order(F, images, order, gray_first):
    factors = [f32(f) for f in (1.3, 0.7, 1.5, 0.12)]
    jitter = T.ColorJitter(*[(f, f) for f in factors], pil=True)
    gray = T.RandomGrayscale(p=1.0, pil=True)
    for image in images:
        reference = torchvision_colour_chain(F, Image.fromarray(image), order, factors,
                                             gray_first)
        ours = run([gray, jitter] if gray_first else [jitter, gray], image, order=order)
        np.testing.assert_array_equal(ours, np.asarray(reference))


def test_colour_runs_after_the_policy_on_its_uint8_result(F, images):
    image = images[0]
    geometry = [T.RandomResizedCrop(40), T.RandomHorizontalFlip(), T.TrivialAugmentWide()]
    first = T.compile_plan(geometry)
    factor = f32(0.2)
    full = T.compile_plan([*geometry, fixed(HUE, factor), T.PILToTensor()])
    for seed in range(6):
        policy = _C.transform_image(first, image, seed, T.PILLOW_MAX_PIXELS)
        reference = np.asarray(F.adjust_hue(Image.fromarray(policy), factor)).transpose(2, 0, 1)
        ours = _C.transform_image(full, image, seed, T.PILLOW_MAX_PIXELS)
        np.testing.assert_array_equal(ours, reference)


def test_random_draws_are_the_tensor_jitters(images):
    """The same draws (factors, order, grayscale coin, RandomApply's coin)
    from the colour stream, whichever arithmetic applies them."""
    draws = {}
    for pil in (False, True):
        chain = [T.RandomApply([T.ColorJitter(0.4, 0.4, 0.4, 0.1, pil=pil)], p=0.8),
                 T.RandomGrayscale(0.2, pil=pil)]
        plan = T.compile_plan(chain)
        assert plan.color_pil is pil
        draws[pil] = [_C.color_draws(plan, 11, 0, i) for i in range(20)]
    assert draws[True] == draws[False]


def test_one_arithmetic_per_chain_and_colour_after_the_policy():
    with pytest.raises(ValueError, match="both need the same arithmetic"):
        T.compile_plan([T.ColorJitter(0.2, pil=True), T.RandomGrayscale()])
    with pytest.raises(ValueError, match="cannot fuse"):
        T.compile_plan([T.ColorJitter(0.2, pil=True), T.RandAugment()])
    assert "pil=True" in repr(T.ColorJitter(0.2, pil=True))
    assert T.compile_plan([T.ColorJitter(0.2)]).color_pil is False


# ------------------------------------------------ torchvision's classes compiled


@pytest.fixture(scope="module")
def tv(torchvision):
    from torchvision import transforms as v1
    from torchvision.transforms import v2

    return {"v1": v1, "v2": v2}


@pytest.fixture(scope="module")
def png(tmp_path_factory, images):
    path = tmp_path_factory.mktemp("png") / "picture.png"
    Image.fromarray(images[0]).save(path)
    return str(path)


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_torchvisions_colour_classes_compile_to_pillows_arithmetic(tv, version):
    m = tv[version]
    tf = m.Compose([m.RandomResizedCrop(32), m.RandomHorizontalFlip(),
                    m.RandomApply([m.ColorJitter(0.4, 0.3, 0.2, 0.1)], p=0.8),
                    m.RandomGrayscale(p=0.2), m.PILToTensor()])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ds = fastload.ImageFiles(["unused.jpg"], transform=tf)
    assert ds.transform_plan.python == ()
    ours = T.Compose([T.RandomResizedCrop(32), T.RandomHorizontalFlip(),
                      T.RandomApply([T.ColorJitter(0.4, 0.3, 0.2, 0.1, pil=True)], p=0.8),
                      T.RandomGrayscale(p=0.2, pil=True), T.PILToTensor()])
    assert vars(ds._plan) == vars(ours.plan)


@pytest.mark.parametrize("version", ["v1", "v2"])
@pytest.mark.parametrize("step", ["saturation", "hue", "grayscale"])
def test_a_compiled_chain_gives_torchvisions_bytes(tv, png, version, step):
    """No resampling (a crop of a PNG): the whole output is exact."""
    m = tv[version]
    colour = {"saturation": lambda: m.ColorJitter(saturation=(1.6, 1.6)),
              "hue": lambda: m.ColorJitter(hue=(-0.25, -0.25)),
              "grayscale": lambda: m.Grayscale(3)}[step]()
    tf = m.Compose([m.CenterCrop(48), colour, m.PILToTensor()])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ds = fastload.ImageFiles([png], transform=tf)
    assert ds.transform_plan.python == ()
    with Image.open(png) as img:
        expected = tf(img.convert("RGB"))
    torch.testing.assert_close(torch.as_tensor(ds[0][0]), torch.as_tensor(expected), rtol=0,
                               atol=0)


def test_colour_before_the_policy_stays_in_python(tv):
    v1 = tv["v1"]
    tf = v1.Compose([v1.RandomResizedCrop(32), v1.ColorJitter(0.2), v1.TrivialAugmentWide(),
                     v1.ToTensor()])
    with pytest.warns(UserWarning, match="this order of steps does not fuse"):
        ds = fastload.ImageFiles(["unused.jpg"], transform=tf)
    assert [type(t).__name__ for t in ds.transform_plan.native] == ["RandomResizedCrop"]
    # one channel, without a tensor conversion: a PIL "L" image, which the
    # C plan does not make
    tf = v1.Compose([v1.CenterCrop(32), v1.Grayscale(1)])
    with pytest.warns(UserWarning, match="this order of steps does not fuse"):
        fastload.ImageFiles(["unused.jpg"], transform=tf)
