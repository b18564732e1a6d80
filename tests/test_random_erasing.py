"""RandomErasing in the C image pipeline: exact against torchvision's erase
for the same box, the box's distribution against torchvision's get_params,
the chain grammar, torchvision's classes compiled, and draws that do not
depend on num_workers."""

import importlib
import math
import pathlib
import sys

import numpy as np
import pytest

pytest.importorskip("PIL")
torch = pytest.importorskip("torch")

import fastload  # noqa: E402
from fastload import _C
from fastload.datasets import native as _native  # noqa: E402
from fastload import transforms as T  # noqa: E402
from fl_helpers import fastload_only  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "benchmarks"))
import imagenet_like  # noqa: E402

pytestmark = fastload_only

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("erase_folder")
    return imagenet_like.make_image_folder(str(root), n_images=16, n_classes=2, processes=1)


def _head(tensor=True, dtype=None, normalize=True):
    ops = [T.RandomResizedCrop((24, 30))]
    ops.append(T.ToTensor() if tensor else T.PILToTensor())
    if dtype is not None:
        ops.append(T.ConvertImageDtype(dtype))
    if normalize:
        ops.append(T.Normalize(MEAN, STD))
    return ops


CASES = [  # (head kwargs, channels_last, value)
    (dict(), False, 0),
    (dict(), False, (1.5, -2.0, 0.25)),
    (dict(), True, (1.5, -2.0, 0.25)),
    (dict(tensor=False, dtype="float16"), False, 0.75),
    (dict(tensor=False, normalize=False), False, (10, 200, 77)),
]


@pytest.mark.parametrize("head,channels_last,value", CASES)
def test_exact_against_torchvision_erase_for_the_same_box(folder, torchvision, head,
                                                          channels_last, value):
    erase = T.RandomErasing(p=1.0, scale=(0.05, 0.3), value=value)
    with_erase = fastload.ImageFolder(folder, transform=T.Compose(_head(**head) + [erase],
                                                                  channels_last=channels_last))
    without = fastload.ImageFolder(folder, transform=T.Compose(_head(**head),
                                                               channels_last=channels_last))
    src, plain = _native.source_of(with_erase), _native.source_of(without)
    plan = with_erase.transform.plan
    values = value if isinstance(value, tuple) else (value,)
    erased = 0
    for index in range(len(with_erase)):
        ours = src.sample(index, 11, 2)
        base = plain.sample(index, 11, 2)
        box = _C.erase_draws(plan, 11, 2, index, 30, 24)
        assert box is not None  # p=1 and a small scale: the first try fits
        i, j, h, w = box
        chw = torch.from_numpy(base).permute(2, 0, 1) if channels_last else \
            torch.from_numpy(base)
        fill = torch.tensor(values, dtype=torch.float32)[:, None, None]
        v2 = importlib.import_module("torchvision.transforms.v2.functional")
        for erase_fn in (v2.erase, torchvision.transforms.functional.erase):
            expected = erase_fn(chw.clone(), i, j, h, w, fill)
            got = torch.from_numpy(ours)
            got = got.permute(2, 0, 1) if channels_last else got
            assert torch.equal(got, expected), (index, box)
        erased += h * w
    assert erased > 0


def test_random_values_are_standard_normal_inside_the_box_only(folder):
    head = _head()
    ds = fastload.ImageFolder(folder, transform=T.Compose(
        head + [T.RandomErasing(p=1.0, scale=(0.3, 0.33), value="random")]))
    plain = fastload.ImageFolder(folder, transform=T.Compose(head))
    src, base_src = _native.source_of(ds), _native.source_of(plain)
    inside = []
    for index in range(len(ds)):
        ours, base = src.sample(index, 5, 0), base_src.sample(index, 5, 0)
        i, j, h, w = _C.erase_draws(ds.transform.plan, 5, 0, index, 30, 24)
        mask = np.zeros(ours.shape, bool)
        mask[:, i:i + h, j:j + w] = True
        assert np.array_equal(ours[~mask], base[~mask])
        inside.append(ours[mask])
    values = np.concatenate(inside).astype(np.float64)
    assert values.size > 2000
    assert abs(values.mean()) < 0.1 and abs(values.std() - 1.0) < 0.05


def _tv_boxes(torchvision, n, height, width, scale, ratio):
    torch.manual_seed(0)
    image = torch.zeros(3, height, width)
    get = torchvision.transforms.RandomErasing.get_params
    boxes = []
    for _ in range(n):
        i, j, h, w, v = get(image, scale, ratio, [0.0])
        boxes.append(None if v is image else (i, j, h, w))
    return boxes


def test_box_distribution_matches_torchvision_get_params(torchvision):
    height, width, scale, ratio, n = 56, 64, (0.02, 0.33), (0.3, 3.3), 10_000
    plan = T.Compose([T.Resize((height, width)), T.ToTensor(),
                      T.RandomErasing(p=0.5, scale=scale, ratio=ratio)]).plan
    ours = [_C.erase_draws(plan, 3, 0, k, width, height) for k in range(n)]
    on = [b for b in ours if b is not None]
    assert abs(len(on) / n - 0.5) < 0.02  # p
    theirs = [b for b in _tv_boxes(torchvision, n, height, width, scale, ratio) if b is not None]
    for boxes in (on, theirs):
        for i, j, h, w in boxes:
            assert 0 <= i <= height - h and 0 <= j <= width - w and h < height and w < width
    area = lambda bs: np.array([h * w / (height * width) for _, _, h, w in bs])  # noqa: E731
    log_ratio = lambda bs: np.array([math.log(h / w) for _, _, h, w in bs])  # noqa: E731
    a_ours, a_theirs = area(on), area(theirs)
    # whole-pixel rounding widens the range a little
    assert a_ours.min() > scale[0] * 0.5 and a_ours.max() < scale[1] * 1.15
    assert abs(a_ours.mean() - a_theirs.mean()) < 0.01
    assert abs(a_ours.std() - a_theirs.std()) < 0.01
    # log-uniform ratio: the log's mean and spread match torchvision's
    r_ours, r_theirs = log_ratio(on), log_ratio(theirs)
    assert abs(r_ours.mean() - r_theirs.mean()) < 0.05
    assert abs(r_ours.std() - r_theirs.std()) < 0.05
    centre = lambda bs: np.array([(j + w / 2) / width for _, j, _, w in bs])  # noqa: E731
    assert abs(centre(on).mean() - 0.5) < 0.01


def test_no_box_after_ten_misses():
    # A box of 99% of the area never fits strictly inside: nothing is erased.
    plan = T.Compose([T.Resize((8, 8)), T.ToTensor(),
                      T.RandomErasing(p=1.0, scale=(0.99, 1.0), ratio=(1.0, 1.0))]).plan
    assert all(_C.erase_draws(plan, 1, 0, k, 8, 8) is None for k in range(50))


def test_grammar():
    with pytest.raises(ValueError, match="RandomErasing needs a tensor"):
        T.Compose([T.Resize(8), T.RandomErasing()])
    with pytest.raises(ValueError, match="cannot fuse"):
        T.Compose([T.ToTensor(), T.RandomErasing(), T.RandomErasing()])
    with pytest.raises(ValueError, match="cannot fuse"):
        T.Compose([T.ToTensor(), T.RandomErasing(), T.Normalize(MEAN, STD)])
    T.Compose([T.ToTensor(), T.RandomErasing()])  # after ToTensor alone is fine
    with pytest.raises(ValueError, match="'random'"):
        T.RandomErasing(value="noise")
    with pytest.raises(ValueError, match="single value or 3"):
        T.RandomErasing(value=(1, 2))
    with pytest.raises(ValueError, match="between 0 and 1"):
        T.RandomErasing(scale=(0.1, 1.5))
    with pytest.raises(ValueError, match="probability"):
        T.RandomErasing(p=1.5)


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_torchvision_random_erasing_compiles(folder, torchvision, version):
    tv = (torchvision.transforms if version == "v1"
          else importlib.import_module("torchvision.transforms.v2"))
    tail = [tv.ToTensor()] if version == "v1" else [tv.ToImage(), tv.ToDtype(torch.float32,
                                                                              scale=True)]
    chain = tv.Compose([tv.RandomResizedCrop((24, 30))] + tail +
                       [tv.Normalize(MEAN, STD), tv.RandomErasing(p=0.7, value="random")])
    ds = fastload.ImageFolder(folder, transform=chain)
    assert ds.transform_plan.python == ()
    plan = ds._plan
    assert plan.erase_p == 0.7 and plan.erase_random
    chain = tv.Compose([tv.RandomResizedCrop((24, 30))] + tail +
                       [tv.RandomErasing(value=(0.1, 0.2, 0.3))])
    plan = fastload.ImageFolder(folder, transform=chain)._plan
    assert plan.erase_value == (0.1, 0.2, 0.3) and not plan.erase_random


def test_batches_do_not_depend_on_workers(folder):
    tf = T.Compose(_head() + [T.RandomErasing(p=0.5, value="random")])
    ds = fastload.ImageFolder(folder, transform=tf)

    def run(**kwargs):
        loader = fastload.DataLoader(ds, batch_size=5, shuffle=True,
                                     generator=torch.Generator().manual_seed(4), **kwargs)
        return [images.clone() for images, _ in loader]

    first = run()
    for kwargs in (dict(num_workers=2), dict(num_workers=2, worker_mode="process")):
        assert all(torch.equal(a, b) for a, b in zip(first, run(**kwargs)))


def test_erasing_leaves_the_other_draws_alone(folder):
    # The crop and flip come from their own stream: erasing changes no other pixel.
    head = _head()
    a = _native.source_of(fastload.ImageFolder(folder, transform=T.Compose(
        head + [T.RandomErasing(p=0.0)])))
    b = _native.source_of(fastload.ImageFolder(folder, transform=T.Compose(head)))
    for index in range(4):
        assert np.array_equal(a.sample(index, 9, 1), b.sample(index, 9, 1))
