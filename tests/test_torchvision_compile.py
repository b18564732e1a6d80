"""torchvision transforms given to fastload's image datasets: chains whose
steps all map onto fastload's run in C (no Python per image) and match
torchvision on the PIL image within fastload's resampling tolerance; a chain
with a step that does not map warns once and gives torchvision's result;
parameters the C plan cannot express are never compiled; fastload works
without torchvision."""

import os
import pathlib
import pickle
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

pytest.importorskip("PIL")
torch = pytest.importorskip("torch")
from PIL import Image  # noqa: E402

import fastload  # noqa: E402
from fastload import transforms as T  # noqa: E402
from fl_helpers import fastload_only  # noqa: E402
from test_images import MEAN, STD, image_size, psnr  # noqa: E402 - fastload's own measures

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "benchmarks"))
import imagenet_like  # noqa: E402

pytestmark = fastload_only

# PSNR floors (in [0, 1] units) against torchvision on the PIL image.
# decode="exact" is documented within ~57 dB of Pillow (docs/benchmarks.md;
# 57.7 dB the minimum over these files); "fast" (DCT scaling) keeps the floor
# of test_images.test_fidelity_against_pillow (35.8 dB the minimum here).
FLOORS = {"exact": 50.0, "fast": 32.0}


@pytest.fixture(scope="module")
def test_images(tmp_path_factory):
    root = tmp_path_factory.mktemp("images")
    return imagenet_like.make_test_images(str(root))


@pytest.fixture(scope="module")
def photos(test_images):
    """Files big enough for the crops (as test_fidelity_against_pillow)."""
    return [p for p, _ in test_images if min(image_size(p)) >= 24]


@pytest.fixture(scope="module")
def png(test_images):
    return next(p for p, _ in test_images if p.endswith(".png"))


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("folder")
    return imagenet_like.make_image_folder(str(root), n_images=24, n_classes=2, processes=1)


@pytest.fixture(scope="module")
def tv(torchvision):
    from torchvision import transforms as v1
    from torchvision.transforms import v2

    return {"v1": v1, "v2": v2}


def pil_image(path):
    with Image.open(path) as img:
        return img.convert("RGB")


def to_tensor_steps(version, tv):
    if version == "v1":
        return [tv["v1"].ToTensor()]
    return [tv["v2"].ToImage(), tv["v2"].ToDtype(torch.float32, scale=True)]


def val_chain(version, tv, size=64):
    m = tv[version]
    return m.Compose([m.Resize(size + 8), m.CenterCrop(size), *to_tensor_steps(version, tv),
                      m.Normalize(MEAN, STD)])


def train_chain(version, tv):
    m = tv[version]
    return m.Compose([m.RandomResizedCrop(48, scale=(0.3, 1.0)), m.RandomHorizontalFlip(),
                      *to_tensor_steps(version, tv), m.Normalize(MEAN, STD)])


def unnormalize(x):
    x = torch.as_tensor(np.asarray(x))
    return x * torch.tensor(STD).view(3, 1, 1) + torch.tensor(MEAN).view(3, 1, 1)


def no_python_calls(monkeypatch, transform):
    """Makes every step of ``transform`` raise if called."""
    def boom(self, *args, **kwargs):
        raise AssertionError(f"{type(self).__name__} called in Python")

    for step in transform.transforms:
        monkeypatch.setattr(type(step), "__call__", boom)


# ---------------------------------------------------------- whole chains in C


@pytest.mark.parametrize("version", ["v1", "v2"])
@pytest.mark.parametrize("decode", ["exact", "fast"])
def test_deterministic_chain_runs_in_c_and_matches_torchvision(tv, photos, version, decode,
                                                               monkeypatch):
    tf = val_chain(version, tv)
    references = [tf(pil_image(p)) for p in photos]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ds = fastload.ImageFiles(photos, transform=tf, decode=decode)
    assert ds.transform_plan.native == tuple(tf.transforms) and ds.transform_plan.python == ()
    assert ds._native_source() is not None  # the batch path in C
    no_python_calls(monkeypatch, tf)
    worst = min((psnr(unnormalize(ds[i][0]).numpy(), unnormalize(ref).numpy()), photos[i])
                for i, ref in enumerate(references))
    assert worst[0] >= FLOORS[decode], worst
    (batch, _), = list(fastload.DataLoader(ds, batch_size=len(photos), num_workers=1))
    assert batch.shape == (len(photos), 3, 64, 64) and batch.dtype == torch.float32
    torch.testing.assert_close(batch[3], torch.as_tensor(ds[3][0]), rtol=0, atol=0)


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_random_chain_compiles_to_fastloads_own_plan(tv, folder, version, monkeypatch):
    tf = train_chain(version, tv)
    ours = T.Compose([T.RandomResizedCrop(48, scale=(0.3, 1.0)), T.RandomHorizontalFlip(),
                      T.ToTensor(), T.Normalize(MEAN, STD)])
    ds = fastload.ImageFolder(folder, transform=tf)
    own = fastload.ImageFolder(folder, transform=ours)
    assert vars(ds._plan) == vars(own._plan)
    no_python_calls(monkeypatch, tf)
    batches = [list(fastload.DataLoader(d, batch_size=8, shuffle=True, num_workers=2,
                                        generator=torch.Generator().manual_seed(7)))
               for d in (ds, own)]
    for (x, y), (ox, oy) in zip(*batches):
        assert torch.equal(x, ox) and torch.equal(y, oy)


def test_parameters_are_carried_over(tv):
    v1, v2 = tv["v1"], tv["v2"]
    bicubic = v1.InterpolationMode.BICUBIC
    cases = [
        (v1.Compose([v1.RandomResizedCrop((30, 40), scale=(0.2, 0.9), ratio=(0.5, 2.0),
                                          interpolation=bicubic), v1.RandomHorizontalFlip(0.25),
                     v1.PILToTensor(), v1.ConvertImageDtype(torch.float32),
                     v1.Normalize([0.5], [0.25])]),
         [T.RandomResizedCrop((30, 40), scale=(0.2, 0.9), ratio=(0.5, 2.0),
                              interpolation="bicubic"), T.RandomHorizontalFlip(0.25),
          T.PILToTensor(), T.ConvertImageDtype("float32"), T.Normalize([0.5], [0.25])]),
        (v2.Compose([v2.RGB(), v2.Resize(50, interpolation="nearest", max_size=80),
                     v2.CenterCrop((20, 30)), v2.ToImage(), v2.ToDtype(torch.float32, scale=True),
                     v2.ToPureTensor()]),
         [T.Resize(50, interpolation="nearest", max_size=80), T.CenterCrop((20, 30)),
          T.ToTensor()]),
        (v2.Compose([v2.Resize([33, 44], interpolation=v2.InterpolationMode.BICUBIC),
                     v2.RandomHorizontalFlip(p=1.0), v2.PILToTensor()]),
         [T.Resize((33, 44), interpolation="bicubic"), T.RandomHorizontalFlip(1.0),
          T.PILToTensor()]),
        (v1.Compose([v1.Resize([40]), v1.CenterCrop(32)]),  # uint8 HWC out, as fastload's own
         [T.Resize(40), T.CenterCrop(32)]),
    ]
    for tf, ours in cases:
        ds = fastload.ImageFiles(["unused.jpg"], transform=tf)
        assert ds.transform_plan.python == (), tf
        assert vars(ds._plan) == vars(T.Compose(ours).plan), tf


# ------------------------------------------------- not compiled: Python, warned


def unsupported_steps(tv):
    v1, v2 = tv["v1"], tv["v2"]
    return {
        "lanczos": v1.Resize(40, interpolation=v1.InterpolationMode.LANCZOS),
        "v2 box": v2.Resize(40, interpolation=v2.InterpolationMode.BOX),
        "no antialias": v2.Resize(40, antialias=False),
        "v2 size=None": v2.Resize(None, max_size=40),
        "rrc nearest-exact": v2.RandomResizedCrop(
            40, interpolation=v2.InterpolationMode.NEAREST_EXACT),
    }


@pytest.mark.filterwarnings("ignore:Anti-alias option is always applied for PIL Image input")
@pytest.mark.parametrize("name", ["lanczos", "v2 box", "no antialias", "v2 size=None",
                                  "rrc nearest-exact"])
def test_unsupported_resampling_is_not_compiled(tv, png, name):
    step = unsupported_steps(tv)[name]
    tf = tv["v2"].Compose([step, tv["v2"].CenterCrop(32), tv["v2"].ToImage(),
                           tv["v2"].ToDtype(torch.float32, scale=True)])
    with pytest.warns(UserWarning, match=f"{type(step).__name__} has no exact C equivalent, "
                                         "so .* run in Python per image, with the GIL"):
        ds = fastload.ImageFiles([png], transform=tf)
    assert ds.transform_plan.native == () and ds.transform_plan.python == tuple(tf.transforms)
    assert ds._native_source() is None
    if "rrc" not in name:  # deterministic: exactly torchvision's (PNG decodes bit for bit)
        torch.testing.assert_close(ds[0][0], tf(pil_image(png)), rtol=0, atol=0)


@pytest.mark.parametrize("make", [
    lambda v1, v2: v1.ConvertImageDtype(torch.float16),
    lambda v1, v2: v2.ToDtype(torch.float32, scale=False),
    lambda v1, v2: v2.ToDtype(torch.float64, scale=True),
    lambda v1, v2: v2.ToDtype({"others": torch.float32}, scale=True),
], ids=["float16", "unscaled", "float64", "dict"])
def test_other_dtypes_are_not_compiled(tv, png, make):
    v1, v2 = tv["v1"], tv["v2"]
    step = make(v1, v2)
    tf = v2.Compose([v2.Resize(40), v2.CenterCrop(32), v2.PILToTensor(), step])
    with pytest.warns(UserWarning, match=f"{type(step).__name__} has no exact C equivalent"):
        ds = fastload.ImageFiles([png], transform=tf)
    assert [type(t).__name__ for t in ds.transform_plan.native] == ["Resize", "CenterCrop"]
    out, expected = ds[0][0], tf(pil_image(png))
    assert out.dtype == expected.dtype and out.shape == expected.shape


@pytest.mark.parametrize("version", ["v1", "v2"])
@pytest.mark.parametrize("decode", ["exact", "fast"])
def test_partial_chain_warns_once_and_gives_torchvisions_result(tv, photos, version, decode):
    m = tv[version]
    # a step with no C equivalent, without randomness
    tf = m.Compose([m.Resize(72), m.CenterCrop(64), m.RandomInvert(1.0),
                    *to_tensor_steps(version, tv),
                    m.Normalize(MEAN, STD)])
    with pytest.warns(UserWarning) as record:
        ds = fastload.ImageFiles(photos, transform=tf, decode=decode)
    assert len(record) == 1
    message = str(record[0].message)
    assert "RandomInvert has no exact C equivalent" in message
    assert "(after Resize, CenterCrop in C), with the GIL: expect ~" in message
    assert record[0].filename == __file__  # points at the caller
    steps = tuple(tf.transforms)
    assert ds.transform_plan == (steps[:2], steps[2:])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per dataset: not per image or per batch
        outs = [ds[i][0] for i in range(len(photos))]
        (batch, _), = list(fastload.DataLoader(ds, batch_size=len(photos), num_workers=2))
    worst = min((psnr(unnormalize(out).numpy(), unnormalize(tf(pil_image(p))).numpy()), p)
                for out, p in zip(outs, photos))
    assert worst[0] >= FLOORS[decode], worst
    assert torch.equal(batch, torch.stack([torch.as_tensor(o) for o in outs]))


def test_split_keeps_random_geometry_in_c(tv, folder):
    v2 = tv["v2"]
    tf = v2.Compose([v2.RandomResizedCrop(32), v2.RandomHorizontalFlip(), v2.RandomInvert(),
                     v2.ToImage(), v2.ToDtype(torch.float32, scale=True)])
    with pytest.warns(UserWarning, match="RandomInvert has no exact C equivalent"):
        ds = fastload.ImageFolder(folder, transform=tf)
    assert [type(t).__name__ for t in ds.transform_plan.native] == [
        "RandomResizedCrop", "RandomHorizontalFlip"]
    own = T.Compose([T.RandomResizedCrop(32), T.RandomHorizontalFlip()])
    assert vars(ds._plan) == vars(own.plan)
    torch.manual_seed(0)
    image, _ = ds[0]
    assert type(image).__name__ == "Image" and image.shape == (3, 32, 32)  # a v2 tv_tensor


def test_order_that_does_not_fuse_runs_whole_in_python(tv, png):
    v1, v2 = tv["v1"], tv["v2"]
    # v2 resamples the float tensor here, not the PIL image: C cannot do that
    tf = v2.Compose([v2.ToImage(), v2.ToDtype(torch.float32, scale=True), v2.Resize(40),
                     v2.CenterCrop(32)])
    with pytest.warns(UserWarning, match="this order of steps does not fuse into one C "
                                         "operation, so ToImage, ToDtype, Resize, CenterCrop "
                                         "run in Python per image, with the GIL"):
        ds = fastload.ImageFiles([png], transform=tf)
    assert ds.transform_plan.native == ()
    torch.testing.assert_close(ds[0][0], tf(pil_image(png)), rtol=0, atol=0)
    # a leading step that does not map: nothing runs in C
    tf = v1.Compose([v1.RandomInvert(1.0), v1.Resize(40), v1.CenterCrop(32), v1.ToTensor()])
    with pytest.warns(UserWarning, match="RandomInvert has no exact C equivalent"):
        ds = fastload.ImageFiles([png], transform=tf)
    assert ds.transform_plan.native == ()
    torch.testing.assert_close(ds[0][0], tf(pil_image(png)), rtol=0, atol=0)
    # colour (other than a leading Grayscale) before the geometry: the plan runs colour
    # after it, so nothing runs in C
    tf = v1.Compose([v1.ColorJitter(brightness=(1.3, 1.3)), v1.Resize(40), v1.CenterCrop(32),
                     v1.ToTensor()])
    with pytest.warns(UserWarning, match="this order of steps does not fuse"):
        ds = fastload.ImageFiles([png], transform=tf)
    assert ds.transform_plan.native == ()
    torch.testing.assert_close(ds[0][0], tf(pil_image(png)), rtol=0, atol=0)


def test_foreign_steps_and_subclasses_stay_in_python(tv, png):
    v1 = tv["v1"]

    class MyResize(v1.Resize):  # may do anything: not torchvision's class
        pass

    for odd in (MyResize(40), v1.Lambda(lambda img: img), (lambda img: img)):
        tf = v1.Compose([odd, v1.CenterCrop(32), v1.ToTensor()])
        with pytest.warns(UserWarning, match="run in Python per image"):
            ds = fastload.ImageFiles([png], transform=tf)
        assert ds.transform_plan.native == () and len(ds.transform_plan.python) == 3
        torch.testing.assert_close(ds[0][0], tf(pil_image(png)), rtol=0, atol=0)


def test_single_step_and_nested_compose(tv, png):
    v1, v2 = tv["v1"], tv["v2"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ds = fastload.ImageFiles([png], transform=v2.Compose([
            v2.Compose([v2.Resize(40), v2.CenterCrop(32)]), v2.ToImage(),
            v2.ToDtype(torch.float32, scale=True)]))
        assert ds._native_source() is not None and len(ds.transform_plan.native) == 4
        ds = fastload.ImageFiles([png], transform=v1.CenterCrop(16))
        assert ds.transform_plan.python == () and ds[0][0].shape == (16, 16, 3)


def test_a_python_loader_gets_the_whole_chain_without_a_warning(tv, png):
    v1 = tv["v1"]
    tf = val_chain("v1", tv)
    seen = []

    def loader(path):
        seen.append(path)
        return pil_image(path)

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ds = fastload.ImageFiles([png], transform=tf, loader=loader)
        assert ds.transform_plan == ((), tuple(tf.transforms))
        torch.testing.assert_close(ds[0][0], tf(pil_image(png)), rtol=0, atol=0)
        assert seen == [png]
        # torchvision's default loader decodes to what the C decoder gives
        from torchvision.datasets.folder import default_loader

        ds = fastload.ImageFiles([png], transform=tf, loader=default_loader)
        assert ds.transform_plan.python == () and ds._native_source() is not None
        assert v1 is not None


def test_datasets_pickle_without_a_new_warning(tv, png):
    v1 = tv["v1"]
    tf = v1.Compose([v1.CenterCrop(40), v1.RandomInvert(1.0), v1.ToTensor()])
    with pytest.warns(UserWarning):
        ds = fastload.ImageFiles([png], transform=tf)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        copy = pickle.loads(pickle.dumps(ds))
    assert [type(t).__name__ for t in copy.transform_plan.python] == ["RandomInvert", "ToTensor"]
    torch.testing.assert_close(copy[0][0], ds[0][0], rtol=0, atol=0)


# ---------------------------------------------------------- without torchvision


def test_fastload_does_not_import_or_need_torchvision(png):
    script = textwrap.dedent(f"""
        import sys
        if sys.argv[1] == "hidden":
            sys.modules["torchvision"] = None  # importing it raises ImportError
        import fastload
        from fastload import transforms as T

        def loaded():
            return [m for m, module in sys.modules.items()
                    if m.split(".")[0] == "torchvision" and module is not None]

        ds = fastload.ImageFiles([{png!r}], transform=T.Compose([T.CenterCrop(8), T.ToTensor()]))
        assert ds[0][0].shape == (3, 8, 8) and ds.transform_plan.python == ()
        ds = fastload.ImageFiles([{png!r}], transform=lambda image: image[:4])
        assert ds[0][0].shape[0] == 4
        assert loaded() == [], loaded()
        print("ok")
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(pathlib.Path(fastload.__file__).parent.parent), os.environ.get("PYTHONPATH", "")]))
    for torchvision in ("installed", "hidden"):
        out = subprocess.run([sys.executable, "-W", "error", "-c", script, torchvision],
                             capture_output=True, text=True, env=env, timeout=120)
        assert out.returncode == 0 and out.stdout.strip() == "ok", (torchvision, out.stderr)


# ------------------------------------------- colour steps on the float tensor

FLOAT_COLOUR_STEPS = {
    "brightness": lambda m: m.ColorJitter(brightness=(1.3, 1.3)),
    "contrast": lambda m: m.ColorJitter(contrast=(0.6, 0.6)),
    "saturation": lambda m: m.ColorJitter(saturation=(1.6, 1.6)),
    "hue": lambda m: m.ColorJitter(hue=(-0.25, -0.25)),
    "grayscale": lambda m: m.Grayscale(3),
    "random-grayscale": lambda m: m.RandomGrayscale(1.0),
    "applied-grayscale": lambda m: m.RandomApply([m.Grayscale(3)], p=1.0),
    "applied-jitter": lambda m: m.RandomApply([m.ColorJitter(saturation=(0.4, 0.4))], p=1.0),
    "blur": lambda m: m.GaussianBlur(5, sigma=(1.2, 1.2)),
}


@pytest.mark.parametrize("version", ["v1", "v2"])
@pytest.mark.parametrize("step", list(FLOAT_COLOUR_STEPS))
def test_colour_after_the_float_conversion_runs_in_c_as_on_the_tensor(tv, png, version, step):
    """No resampling (a crop of a PNG), so the C float stage sees the
    tensor's values: equal within float rounding (the blur included)."""
    m = tv[version]
    tf = m.Compose([m.CenterCrop(48), *to_tensor_steps(version, tv),
                    FLOAT_COLOUR_STEPS[step](m), m.Normalize(MEAN, STD)])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ds = fastload.ImageFiles([png], transform=tf)
    assert ds.transform_plan.python == ()
    torch.testing.assert_close(torch.as_tensor(ds[0][0]), tf(pil_image(png)), rtol=0,
                               atol=2e-5)


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_colour_after_the_float_conversion_compiles_to_the_tensor_formulas(tv, version):
    m = tv[version]
    tf = m.Compose([m.RandomResizedCrop(32), m.RandomHorizontalFlip(),
                    *to_tensor_steps(version, tv),
                    m.RandomApply([m.ColorJitter(0.4, 0.4, 0.4, 0.1)], p=0.8),
                    m.RandomGrayscale(0.2), m.Normalize(MEAN, STD)])
    ds = fastload.ImageFiles(["unused.jpg"], transform=tf)
    ours = T.Compose([T.RandomResizedCrop(32), T.RandomHorizontalFlip(),
                      T.RandomApply([T.ColorJitter(0.4, 0.4, 0.4, 0.1)], p=0.8),
                      T.RandomGrayscale(0.2), T.ToTensor(), T.Normalize(MEAN, STD)])
    assert vars(ds._plan) == vars(ours.plan)


# ------------------------------------------- colour steps on the uint8 tensor

UINT8_COLOUR_STEPS = {k: v for k, v in FLOAT_COLOUR_STEPS.items() if k != "blur"}


@pytest.mark.parametrize("version", ["v1", "v2"])
@pytest.mark.parametrize("step", list(UINT8_COLOUR_STEPS))
def test_colour_on_the_uint8_tensor_runs_in_c_as_torchvision(tv, png, version, step):
    """After PILToTensor (v2: ToImage), before the float conversion: the
    C stage works as on the uint8 tensor, truncations and all.  Within one
    level (the hue's HSV round trip, v2's fused gray sums), mostly exact."""
    m = tv[version]
    to_uint8 = m.ToImage() if version == "v2" else m.PILToTensor()
    tf = m.Compose([m.CenterCrop(48), to_uint8, UINT8_COLOUR_STEPS[step](m)])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ds = fastload.ImageFiles([png], transform=tf)
    assert ds.transform_plan.python == ()
    ours, reference = torch.as_tensor(ds[0][0]), tf(pil_image(png))
    assert ours.dtype == reference.dtype == torch.uint8
    difference = (ours.int() - reference.int()).abs()
    assert difference.max() <= 1 and (difference > 0).float().mean() < 0.02


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_colour_on_the_uint8_tensor_compiles_to_the_uint8_formulas(tv, version):
    m = tv[version]
    to_uint8, to_float = ((m.ToImage(), m.ToDtype(torch.float32, scale=True)) if version == "v2"
                          else (m.PILToTensor(), m.ConvertImageDtype(torch.float32)))
    tf = m.Compose([m.RandomResizedCrop(32), m.RandomHorizontalFlip(), to_uint8,
                    m.RandomApply([m.ColorJitter(0.4, 0.4, 0.4, 0.1)], p=0.8),
                    m.RandomGrayscale(0.2), to_float, m.Normalize(MEAN, STD)])
    ds = fastload.ImageFiles(["unused.jpg"], transform=tf)
    ours = T.Compose([T.RandomResizedCrop(32), T.RandomHorizontalFlip(),
                      T.RandomApply([T.ColorJitter(0.4, 0.4, 0.4, 0.1, uint8=True)], p=0.8),
                      T.RandomGrayscale(0.2, uint8=True), T.ToTensor(),
                      T.Normalize(MEAN, STD)])
    assert vars(ds._plan) == vars(ours.plan)


def test_a_blur_on_the_uint8_tensor_stays_in_python(tv, png):
    v1 = tv["v1"]
    tf = v1.Compose([v1.CenterCrop(32), v1.PILToTensor(), v1.GaussianBlur(3, sigma=(1.2, 1.2))])
    with pytest.warns(UserWarning, match="does not fuse"):
        ds = fastload.ImageFiles([png], transform=tf)
    assert [type(t).__name__ for t in ds.transform_plan.native] == ["CenterCrop"]
    torch.testing.assert_close(torch.as_tensor(ds[0][0]), tf(pil_image(png)), rtol=0, atol=0)


def test_colour_after_normalize_or_on_both_sides_stays_in_python(tv):
    v1 = tv["v1"]
    for tf in (v1.Compose([v1.CenterCrop(32), v1.ToTensor(), v1.Normalize(MEAN, STD),
                           v1.ColorJitter(0.3)]),
               v1.Compose([v1.CenterCrop(32), v1.ColorJitter(0.3), v1.ToTensor(),
                           v1.RandomGrayscale(0.2)])):
        with pytest.warns(UserWarning, match="does not fuse"):
            ds = fastload.ImageFiles(["unused.jpg"], transform=tf)
        assert [type(t).__name__ for t in ds.transform_plan.native] == ["CenterCrop"]


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_random_apply_of_a_grayscale_is_one_draw(tv, version):
    m = tv[version]
    for step, p in ((m.RandomGrayscale(0.5), 0.2), (m.Grayscale(3), 0.4)):
        ds = fastload.ImageFiles(["unused.jpg"], transform=m.Compose(
            [m.CenterCrop(32), m.RandomApply([step], p=0.4), m.PILToTensor()]))
        ours = T.Compose([T.CenterCrop(32), T.RandomGrayscale(p, pil=True), T.PILToTensor()])
        assert vars(ds._plan) == vars(ours.plan)
