"""Damaged JPEGs through the loader (tests/corrupt_jpegs.py): every sample
either decodes or raises (or, with on_error="skip", is skipped) naming its
file; nothing crashes; the good samples sharing a batch with bad ones come
out exactly as they do alone."""

import collections
import pathlib
import sys

import numpy as np
import pytest

pytest.importorskip("PIL")

import fastload  # noqa: E402
from fastload import transforms as T  # noqa: E402
from fl_helpers import fastload_only  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "benchmarks"))  # noqa: E402
import corrupt_jpegs  # noqa: E402
import imagenet_like  # noqa: E402

pytestmark = fastload_only

SOURCES = ("rgb_224x224_420", "prog_500x375_420", "gray_300x451", "cmyk_240x180", "restart_400x300")


def transform():
    # Deterministic, so a good sample's output does not depend on its index.
    return T.Compose([T.Resize(40), T.CenterCrop(32), T.ToTensor()])


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """(good_paths, [(kind, path)]) with every damaged variant on disk."""
    root = tmp_path_factory.mktemp("corrupt")
    images = imagenet_like.make_test_images(str(root / "good"))
    good = [p for p, _ in images if pathlib.Path(p).stem in SOURCES]
    assert len(good) == len(SOURCES)
    bad = []
    for i, path in enumerate(good):
        for kind, data in corrupt_jpegs.damaged(pathlib.Path(path).stem,
                                                pathlib.Path(path).read_bytes(), seed=i):
            bad.append((kind, data))
    bad += corrupt_jpegs.not_jpegs()
    out = []
    for k, (kind, data) in enumerate(bad):
        p = root / f"bad_{k:04d}.jpg"
        p.write_bytes(data)
        out.append((kind, str(p)))
    return good, out


def test_each_damaged_file_decodes_or_raises_naming_it(corpus):
    _, bad = corpus
    ds = fastload.ImageFiles([p for _, p in bad], transform=transform())
    outcomes = collections.Counter()
    for i, (kind, path) in enumerate(bad):
        try:
            image, _ = ds[i]
        except (fastload.DecodeError, OSError) as e:
            assert pathlib.Path(path).name in str(e), (kind, e)
            assert f"sample index {i}" in str(e) or isinstance(e, FileNotFoundError), (kind, e)
            outcomes["raised"] += 1
        else:
            assert image.shape == (3, 32, 32) and np.isfinite(image).all(), kind
            outcomes["decoded"] += 1
    assert outcomes["raised"] > len(bad) // 2
    assert sum(outcomes.values()) == len(bad)


@pytest.mark.parametrize("workers", [0, 2])
def test_good_samples_in_a_batch_are_unaffected(corpus, workers):
    good, bad = corpus
    # good, bad, good, bad, ...: every batch mixes them
    paths = [p for pair in zip(good * (len(bad) // len(good) + 1), [p for _, p in bad])
             for p in pair]
    labels = list(range(len(paths)))
    alone = {p: fastload.ImageFiles([p], transform=transform())[0][0] for p in good}
    ds = fastload.ImageFiles(paths, labels=labels, transform=transform(), on_error="skip")
    seen = 0
    for images, batch_labels in fastload.DataLoader(ds, batch_size=8, num_workers=workers,
                                                    output="numpy"):
        for image, label in zip(images, batch_labels):
            path = paths[label]
            if path in alone:
                np.testing.assert_array_equal(image, alone[path])
            seen += 1
    assert seen == len(paths)
    skipped_paths = {p for _, p, _ in ds.skipped}
    assert skipped_paths and skipped_paths <= {p for _, p in bad}
    assert all(message for _, _, message in ds.skipped)


def test_raise_mode_names_the_first_bad_file_of_a_batch(corpus):
    good, bad = corpus
    truncated = next(p for kind, p in bad if "truncated mid-scan" in kind)
    ds = fastload.ImageFiles([good[0], truncated, good[1]], transform=transform())
    with pytest.raises(fastload.DecodeError, match=pathlib.Path(truncated).name):
        next(iter(fastload.DataLoader(ds, batch_size=3, num_workers=1)))
    # and the loader keeps working for the next batch / epoch
    ds2 = fastload.ImageFiles(good, transform=transform())
    assert len(list(fastload.DataLoader(ds2, batch_size=2, num_workers=1))) == 3
