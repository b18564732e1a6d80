"""Grayscale(num_output_channels=1) in C: one-channel tensors, equal to the
first channel of the same chain with Grayscale(3) (whose channels are all
equal, and whose fidelity to torchvision the colour tests check) through
every later step: Normalize, RandomErasing, channels_last, the loader's
batches and MixUp/CutMix on them; and equal to torchvision's own chain."""

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
from fl_helpers import fastload_only  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "benchmarks"))
import imagenet_like  # noqa: E402

pytestmark = fastload_only


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("folder")
    return imagenet_like.make_image_folder(str(root), n_images=20, n_classes=2, processes=1)


@pytest.fixture(scope="module")
def image(folder):
    path = next(pathlib.Path(folder).rglob("*.jpg"))
    with Image.open(path) as img:
        return np.asarray(img.convert("RGB"))


def chains(channels):
    """Chains ending in a tensor, with a Grayscale of `channels`."""
    gray = T.Grayscale(channels)
    gray_pil = T.Grayscale(channels, pil=True)
    return {
        "float": [T.RandomResizedCrop(24), T.RandomHorizontalFlip(), gray, T.ToTensor(),
                  T.Normalize((0.4,), (0.3,))],
        "pil-jitter": [T.Resize(30), T.CenterCrop(24), T.ColorJitter(0.4, 0.4, pil=True),
                       gray_pil, T.ToTensor()],
        "uint8": [T.RandomCrop(20, padding=3), gray_pil, T.PILToTensor()],
        "erase-random": [T.CenterCrop(24), gray, T.ToTensor(),
                         T.RandomErasing(p=1.0, value="random")],
        "erase-value": [T.CenterCrop(24), gray, T.ToTensor(), T.Normalize((0.5,), (0.5,)),
                        T.RandomErasing(p=1.0, value=0.25)],
        "policy": [T.RandomResizedCrop(24), T.TrivialAugmentWide(), gray_pil, T.ToTensor()],
        "blur-float16": [T.CenterCrop(24), gray, T.GaussianBlur(5, (0.5, 1.5)), T.ToTensor(),
                         T.ConvertImageDtype("float16")],
    }


@pytest.mark.parametrize("name", list(chains(1)))
@pytest.mark.parametrize("channels_last", [False, True])
def test_one_channel_is_the_first_of_three_equal_ones(image, name, channels_last):
    one = T.Compose(chains(1)[name], channels_last=channels_last)
    three = T.Compose(chains(3)[name], channels_last=channels_last)
    assert one.plan.output_shape() in ((1, 24, 24), (24, 24, 1), (1, 20, 20), (20, 20, 1))
    for seed in range(6):
        a = _C.transform_image(one.plan, image, seed, T.PILLOW_MAX_PIXELS)
        b = _C.transform_image(three.plan, image, seed, T.PILLOW_MAX_PIXELS)
        first = b[:1] if one.plan.layout == "CHW" else b[..., :1]
        assert a.shape == first.shape and a.dtype == b.dtype
        np.testing.assert_array_equal(a, first)


def test_one_thread_serves_one_channel_plans_of_every_dtype(image):
    """The thread's scratch row is sized in bytes: a uint8 plan, then wider
    elements of the same size (the sanitizer build checks the writes)."""
    import threading

    results = {}

    def run():
        for dtype in ("uint8", "float32", "float16"):
            tail = [T.PILToTensor()] + ([] if dtype == "uint8" else [T.ConvertImageDtype(dtype)])
            plan = T.Compose([T.CenterCrop(24), T.Grayscale(pil=True), *tail]).plan
            results[dtype] = _C.transform_image(plan, image, 0, T.PILLOW_MAX_PIXELS)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert results["uint8"].shape == (1, 24, 24)
    for dtype in ("float32", "float16"):
        np.testing.assert_allclose(results[dtype], results["uint8"] / 255.0, rtol=0, atol=1e-3)


@pytest.mark.parametrize("workers", [0, 2])
def test_loader_batches_have_one_channel(folder, workers):
    def loader(channels, **kwargs):
        ds = fastload.ImageFolder(folder, transform=T.Compose(
            [T.RandomResizedCrop(16), T.Grayscale(channels), T.ToTensor(),
             T.Normalize((0.5,), (0.5,)), T.RandomErasing(0.5)]))
        return fastload.DataLoader(ds, batch_size=8, num_workers=workers, shuffle=True,
                                   generator=torch.Generator().manual_seed(5), **kwargs)

    for kwargs in ({}, {"batch_transform": T.RandomChoice([T.MixUp(alpha=1.0, num_classes=2),
                                                           T.CutMix(alpha=1.0, num_classes=2)])}):
        got = list(loader(1, **kwargs))
        expected = list(loader(3, **kwargs))
        assert len(got) == len(expected) == 3
        for (x, y), (x3, y3) in zip(got, expected):
            assert x.shape == (len(y), 1, 16, 16) and x.dtype == torch.float32
            torch.testing.assert_close(x, x3[:, :1], rtol=0, atol=0)
            torch.testing.assert_close(y, y3, rtol=0, atol=0)


def test_torchvision_grayscale_one_channel_compiles(torchvision, folder, image):
    from torchvision import transforms as v1
    from torchvision.transforms import v2

    pil = Image.fromarray(image)
    for tf in (
        v1.Compose([v1.CenterCrop(48), v1.Grayscale(), v1.ToTensor(),
                    v1.Normalize((0.5,), (0.5,))]),
        v2.Compose([v2.CenterCrop(48), v2.Grayscale(), v2.ToImage(),
                    v2.ToDtype(torch.float32, scale=True), v2.Normalize([0.5], [0.5])]),
        # after the float conversion: the tensor formula
        v1.Compose([v1.CenterCrop(48), v1.ToTensor(), v1.Grayscale(1),
                    v1.Normalize((0.5,), (0.5,))]),
        v2.Compose([v2.CenterCrop(48), v2.Grayscale(1), v2.PILToTensor()]),
    ):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # compiled whole: no Python step, no warning
            ds = fastload.ImageFolder(folder, transform=tf)
        assert ds.transform_plan.python == ()
        ours = _C.transform_image(ds._plan, image, 0, T.PILLOW_MAX_PIXELS)
        theirs = tf(pil)
        assert tuple(theirs.shape) == ours.shape == (1, 48, 48)
        torch.testing.assert_close(torch.as_tensor(ours), theirs, rtol=0, atol=2e-6)
    # Grayscale(1) under a RandomApply: one channel or three by chance, left to Python
    tf = v1.Compose([v1.CenterCrop(48), v1.RandomApply([v1.Grayscale()], p=0.5),
                     v1.ToTensor()])
    with pytest.warns(UserWarning, match="RandomApply has no exact C equivalent"):
        ds = fastload.ImageFolder(folder, transform=tf)


# ------------------------------------------- a leading Grayscale: on the decoded pixels

LEADING = {
    "resize": [T.Resize(40), T.CenterCrop(32), T.ToTensor(), T.Normalize((0.5,), (0.5,))],
    "random-resized": [T.RandomResizedCrop(24), T.RandomHorizontalFlip(), T.PILToTensor()],
    "padded-crop": [T.RandomCrop(32, padding=4, padding_mode="reflect"), T.ToTensor()],
    "policy": [T.RandomResizedCrop(24), T.RandAugment(), T.ColorJitter(0.3, 0.3, pil=True),
               T.ToTensor(), T.RandomErasing(0.5)],
}


@pytest.mark.parametrize("name", list(LEADING))
@pytest.mark.parametrize("channels", [1, 3])
def test_a_leading_grayscale_equals_the_chain_on_the_gray_image(image, name, channels):
    """As torchvision on a PIL image: convert("L") first, then the chain on
    the one-band image, whose every op (resampling, pads, the policy's
    ops) gives, per band, what it gives on three equal bands."""
    leading = T.Compose([T.Grayscale(channels, pil=True), *LEADING[name]])
    assert leading.plan.gray_at_decode and leading.plan.channels == channels
    rest = T.Compose(LEADING[name])
    gray = np.repeat(np.asarray(Image.fromarray(image).convert("L"))[..., None], 3, axis=2)
    for seed in range(6):
        got = _C.transform_image(leading.plan, image, seed, T.PILLOW_MAX_PIXELS)
        expected = _C.transform_image(rest.plan, gray, seed, T.PILLOW_MAX_PIXELS)
        np.testing.assert_array_equal(got, expected[:channels])


def test_a_leading_grayscale_refuses_what_a_one_band_image_refuses():
    with pytest.raises(ValueError, match="three different values"):
        T.Compose([T.Grayscale(3, pil=True), T.RandomCrop(8, padding=2, fill=(1, 2, 3)),
                   T.ToTensor()])
    # the tensor weights are for a tensor, after the geometry: not first
    with pytest.raises(ValueError, match=r"the order must be \[Grayscale\(pil=True\)\]"):
        T.Compose([T.Grayscale(3), T.CenterCrop(8), T.ToTensor()])


def test_torchvision_leading_grayscale_compiles(torchvision, folder, image):
    from torchvision import transforms as v1
    from torchvision.transforms import v2

    pil = Image.fromarray(image)
    for m, tail in ((v1, [v1.ToTensor(), v1.Normalize((0.5,), (0.5,))]),
                    (v2, [v2.ToImage(), v2.ToDtype(torch.float32, scale=True)])):
        for channels in (1, 3):
            tf = m.Compose([m.Grayscale(channels), m.CenterCrop(48), *tail])
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                ds = fastload.ImageFolder(folder, transform=tf)
            assert ds.transform_plan.python == () and ds._plan.gray_at_decode
            ours = _C.transform_image(ds._plan, image, 0, T.PILLOW_MAX_PIXELS)
            theirs = tf(pil)
            assert tuple(theirs.shape) == ours.shape == (channels, 48, 48)
            torch.testing.assert_close(torch.as_tensor(ours), theirs, rtol=0, atol=2e-6)
