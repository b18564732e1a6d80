"""MixUp / CutMix (and RandomChoice of them) in C: exact against
torchvision v2 for the same lam / box, their draws' distributions, and
DataLoader(batch_transform=...) on the native and Python paths: batches
that do not depend on the workers, soft labels, resume, clear errors."""

import importlib
import pathlib
import sys

import numpy as np
import pytest

pytest.importorskip("PIL")
torch = pytest.importorskip("torch")

import fastload  # noqa: E402
from fastload import _C
from fastload.transforms import batch as _batch_transform  # noqa: E402
from fastload import transforms as T  # noqa: E402
from fl_helpers import draw_base_seed, fastload_only  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "benchmarks"))
import imagenet_like  # noqa: E402

pytestmark = fastload_only

MIXUP, CUTMIX = 0, 1


@pytest.fixture(scope="module")
def v2(torchvision):
    return importlib.import_module("torchvision.transforms.v2")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("mix_folder")
    return imagenet_like.make_image_folder(str(root), n_images=36, n_classes=4, processes=1)


def _batch(dtype=torch.float32, n=6, shape=(3, 9, 11), classes=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.uint8:
        images = torch.randint(0, 256, (n, *shape), generator=g, dtype=torch.uint8)
    else:
        images = torch.randn((n, *shape), generator=g).to(dtype)
    labels = torch.randint(0, classes, (n,), generator=g)
    return images, labels


def _forced(transform, params):
    transform.make_params = lambda flat_inputs: params
    return transform


# ---------------------------------------------------------------- fidelity


@pytest.mark.parametrize("lam", [0.0, 0.3, 0.77, 1.0])
def test_mixup_float32_is_exact(v2, lam):
    images, labels = _batch()
    want_images, want_labels = _forced(v2.MixUp(num_classes=5), {"lam": lam})(images, labels)
    ours = images.numpy().copy()
    soft = _C.mix_apply(ours, labels.numpy(), MIXUP, lam, None, 5, False)
    assert torch.equal(torch.from_numpy(ours), want_images)
    assert torch.equal(torch.from_numpy(soft), want_labels)


def test_mixup_float16_within_one_ulp(v2):
    images, labels = _batch(torch.float16)
    want_images, want_labels = _forced(v2.MixUp(num_classes=5), {"lam": 0.3})(images, labels)
    ours = images.numpy().copy()
    soft = _C.mix_apply(ours, labels.numpy(), MIXUP, 0.3, None, 5, False)
    ulps = np.abs(ours.view(np.int16).astype(np.int32) -
                  want_images.numpy().view(np.int16).astype(np.int32))
    assert ulps.max() <= 1  # measured: 0 (exact) on this batch
    assert torch.equal(torch.from_numpy(soft), want_labels)


def test_cutmix_box_is_torchvisions(v2):
    # torchvision's own make_params with a seeded generator; the same lam and
    # centre (drawn again in its order) through fastload's arithmetic.
    for height, width in ((9, 11), (224, 224), (31, 7)):
        image = torch.zeros(2, 3, height, width)
        for seed in range(200):
            cutmix = v2.CutMix(num_classes=3)
            torch.manual_seed(seed)
            params = cutmix.make_params([image])
            torch.manual_seed(seed)
            lam = float(cutmix._dist.sample(()))
            cx, cy = int(torch.randint(width, size=(1,))), int(torch.randint(height, size=(1,)))
            box, weight = _C.cutmix_box(lam, cx, cy, height, width)
            assert box == params["box"] and weight == params["lam_adjusted"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.uint8])
@pytest.mark.parametrize("nhwc", [False, True])
def test_cutmix_is_exact(v2, dtype, nhwc):
    images, labels = _batch(dtype)
    box = (2, 1, 9, 6)
    weight = 1.0 - (9 - 2) * (6 - 1) / (11 * 9)
    cutmix = _forced(v2.CutMix(num_classes=5), {"box": box, "lam_adjusted": weight})
    want_images, want_labels = cutmix(images, labels)
    ours = (images.permute(0, 2, 3, 1) if nhwc else images).contiguous().numpy()
    soft = _C.mix_apply(ours, labels.numpy(), CUTMIX, 0.5, box, 5, nhwc)
    got = torch.from_numpy(ours)
    assert torch.equal(got.permute(0, 3, 1, 2) if nhwc else got, want_images)
    assert torch.equal(torch.from_numpy(soft), want_labels)


def test_a_batch_of_one_mixes_with_itself(v2):
    images, labels = _batch(n=1)
    want, want_labels = _forced(v2.MixUp(num_classes=5), {"lam": 0.4})(images, labels)
    ours = images.numpy().copy()
    soft = _C.mix_apply(ours, labels.numpy(), MIXUP, 0.4, None, 5, False)
    assert torch.equal(torch.from_numpy(ours), want)
    assert torch.equal(torch.from_numpy(soft), want_labels)


def test_direct_call_returns_new_tensors():
    images, labels = _batch()
    before = images.clone()
    for mix in (T.MixUp(num_classes=5), T.CutMix(num_classes=5, alpha=0.5),
                T.RandomChoice([T.MixUp(num_classes=5), T.CutMix(num_classes=5)])):
        out, soft = mix(images, labels)
        assert torch.equal(images, before)
        assert out.shape == images.shape and soft.shape == (6, 5) and soft.dtype == torch.float32
        assert torch.allclose(soft.sum(1), torch.ones(6))
    last = images.contiguous(memory_format=torch.channels_last)
    torch.manual_seed(1)
    out_last, soft_last = T.CutMix(num_classes=5)(last, labels)
    torch.manual_seed(1)
    out, soft = T.CutMix(num_classes=5)(images, labels)
    assert torch.equal(out_last, out) and torch.equal(soft_last, soft)


# ------------------------------------------------------------- distributions


def _plan(*transforms, p=None):
    mix = transforms[0] if len(transforms) == 1 else T.RandomChoice(list(transforms), p=p)
    return mix.mix_plan


@pytest.mark.parametrize("alpha", [0.2, 1.0, 2.0])
def test_lam_moments_are_beta(alpha):
    plan = _plan(T.MixUp(alpha=alpha, num_classes=3))
    lams = np.array([_C.mix_draws(plan, 7, 0, k, 32, 32)[1] for k in range(10_000)])
    assert lams.min() >= 0.0 and lams.max() <= 1.0
    var = 1.0 / (4.0 * (2.0 * alpha + 1.0))  # Beta(a, a)
    assert abs(lams.mean() - 0.5) < 0.015
    assert abs(lams.var() - var) / var < 0.05


def test_cutmix_weights_match_torchvision(v2):
    height, width, n = 24, 32, 10_000
    plan = _plan(T.CutMix(num_classes=3))
    ours = np.array([_C.mix_draws(plan, 1, 0, k, height, width)[3] for k in range(n)])
    cutmix = v2.CutMix(num_classes=3)
    torch.manual_seed(0)
    image = torch.zeros(1, 3, height, width)
    theirs = np.array([cutmix.make_params([image])["lam_adjusted"] for _ in range(n)])
    assert abs(ours.mean() - theirs.mean()) < 0.01
    assert abs(ours.std() - theirs.std()) < 0.01


def test_random_choice_probabilities():
    plan = _plan(T.MixUp(num_classes=3), T.CutMix(num_classes=3), p=[1, 3])
    kinds = np.array([_C.mix_draws(plan, 2, 0, k, 8, 8)[0] for k in range(10_000)])
    assert abs(kinds.mean() - 0.75) < 0.015


def test_draws_are_keyed_by_seed_epoch_and_batch():
    plan = _plan(T.MixUp(num_classes=3))
    draw = lambda *key: _C.mix_draws(plan, *key, 8, 8)  # noqa: E731
    assert draw(1, 0, 5) == draw(1, 0, 5)
    assert len({draw(1, 0, 5), draw(2, 0, 5), draw(1, 1, 5), draw(1, 0, 6)}) == 4


# ------------------------------------------------------------------ loader

MIX = T.RandomChoice([T.MixUp(num_classes=4), T.CutMix(num_classes=4)])


def _image_dataset(folder):
    return fastload.ImageFolder(folder, transform=T.Compose([
        T.RandomResizedCrop(20), T.ToTensor(), T.Normalize((0.5,) * 3, (0.25,) * 3)]))


class Squares(fastload.Dataset):
    """A Python dataset of (CHW float32 image, class) samples."""

    def __len__(self):
        return 36

    def __getitem__(self, i):
        return np.full((3, 6, 5), float(i), np.float32) + np.arange(5, dtype=np.float32), i % 4


def _run(dataset, batch_transform=MIX, **kwargs):
    loader = fastload.DataLoader(dataset, batch_size=8, shuffle=True,
                                 generator=torch.Generator().manual_seed(3),
                                 batch_transform=batch_transform, **kwargs)
    return [(x.clone(), y.clone()) for x, y in loader]


WORKERS = [dict(num_workers=2), dict(num_workers=2, worker_mode="thread"),
           dict(num_workers=2, worker_mode="process"), dict(num_workers=2, in_order=False)]


@pytest.mark.parametrize("kind", ["native", "python"])
def test_batches_do_not_depend_on_workers(folder, kind):
    dataset = _image_dataset(folder) if kind == "native" else Squares()
    first = _run(dataset)
    assert len(first) == 5
    for images, labels in first:
        assert labels.dtype == torch.float32 and labels.shape == (len(images), 4)
        assert torch.allclose(labels.sum(1), torch.ones(len(images)))
    for kwargs in WORKERS:
        other = _run(dataset, **kwargs)
        if kwargs.get("in_order") is False:
            key = lambda b: b[1].numpy().tobytes()  # noqa: E731
            first_sorted, other = sorted(first, key=key), sorted(other, key=key)
        else:
            first_sorted = first
        assert all(torch.equal(a, c) and torch.equal(b, d)
                   for (a, b), (c, d) in zip(first_sorted, other)), kwargs


def test_python_path_is_the_c_function_on_the_collated_batch():
    # Sequential batches: the base seed is the generator's first draw.
    loader = fastload.DataLoader(Squares(), batch_size=8,
                                 generator=torch.Generator().manual_seed(5), batch_transform=MIX)
    mixed = list(loader)
    seed = draw_base_seed(torch.Generator().manual_seed(5))
    plain = list(fastload.DataLoader(Squares(), batch_size=8))
    for number, ((images, labels), (want_images, want_labels)) in enumerate(zip(plain, mixed)):
        images, soft = T.apply_mix(MIX.mix_plan, images, labels, seed, 0, number)
        assert torch.equal(images, want_images) and torch.equal(soft, want_labels)


def test_torchvision_mix_runs_in_c(folder, v2):
    tv = v2.RandomChoice([v2.MixUp(num_classes=4), v2.CutMix(num_classes=4)])
    step = _batch_transform.resolve(tv)
    assert isinstance(step, _batch_transform.MixStep)
    ours, theirs = _run(_image_dataset(folder)), _run(_image_dataset(folder), tv)
    assert all(torch.equal(a, c) and torch.equal(b, d) for (a, b), (c, d) in zip(ours, theirs))
    custom = v2.MixUp(num_classes=4, labels_getter=lambda batch: batch[1])
    assert isinstance(_batch_transform.resolve(custom), _batch_transform.CallStep)


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_any_callable_runs_on_the_collated_batch(folder, mode):
    def shift(images, labels):
        return images * 0 + 1, labels + 100

    batches = _run(_image_dataset(folder), shift, num_workers=2, worker_mode=mode)
    assert all(torch.all(x == 1) and torch.all(y >= 100) for x, y in batches)


def test_resume_gives_the_same_remaining_batches(folder):
    dataset = _image_dataset(folder)
    kwargs = dict(batch_size=8, shuffle=True, batch_transform=MIX, num_workers=2)
    loader = fastload.DataLoader(dataset, generator=torch.Generator().manual_seed(8), **kwargs)
    it = iter(loader)
    next(it), next(it)
    state = loader.state_dict()
    rest = [(x.clone(), y.clone()) for x, y in it]
    again = fastload.DataLoader(dataset, generator=torch.Generator().manual_seed(99), **kwargs)
    again.load_state_dict(state)
    resumed = [(x.clone(), y.clone()) for x, y in again]
    assert len(resumed) == len(rest) == 3
    assert all(torch.equal(a, c) and torch.equal(b, d) for (a, b), (c, d) in zip(rest, resumed))


# ------------------------------------------------------------------ errors


@pytest.mark.parametrize("workers", [0, 2])
def test_label_out_of_range_names_the_batch_and_sample(folder, workers):
    mix = T.MixUp(num_classes=2)  # the folder has 4 classes
    with pytest.raises(ValueError, match=r"batch \d+: sample index \d+ has label [23], outside "
                                         r"\[0, num_classes=2\)"):
        _run(_image_dataset(folder), mix, num_workers=workers)
    with pytest.raises(ValueError, match=r"batch 0: label [23] of the sample at position \d+"):
        _run(Squares(), mix, num_workers=workers)


def test_num_classes_missing_is_refused_up_front(folder, v2):
    for mix in (T.MixUp(), v2.CutMix()):
        with pytest.raises(ValueError, match="num_classes must be passed"):
            fastload.DataLoader(_image_dataset(folder), batch_size=4, batch_transform=mix)
    with pytest.raises(ValueError, match="num_classes must be passed"):
        T.MixUp()(*_batch())


def test_mixup_refuses_uint8_images(folder):
    dataset = fastload.ImageFolder(folder, transform=T.Compose([T.RandomResizedCrop(20),
                                                                T.PILToTensor()]))
    with pytest.raises(TypeError, match="MixUp needs float images"):
        _run(dataset, T.MixUp(num_classes=4))
    batches = _run(dataset, T.CutMix(num_classes=4))  # CutMix only copies pixels
    assert batches[0][0].dtype == torch.uint8


def test_bad_arguments():
    with pytest.raises(ValueError, match="alpha"):
        T.MixUp(alpha=0, num_classes=3)
    with pytest.raises(ValueError, match="Length of p"):
        T.RandomChoice([T.MixUp(num_classes=3)], p=[1, 2])
    with pytest.raises(ValueError, match="disagree on num_classes"):
        T.RandomChoice([T.MixUp(num_classes=3), T.CutMix(num_classes=4)])
    with pytest.raises(TypeError, match="batch_transform must be"):
        fastload.DataLoader(Squares(), batch_transform=3)
