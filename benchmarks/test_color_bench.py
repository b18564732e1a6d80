"""A smoke run of color_bench.py on a small folder: every loader delivers
checked batches.  The numbers come from ``python benchmarks/color_bench.py``."""

import pytest

pytest.importorskip("torch")
pytest.importorskip("PIL")

import color_bench  # noqa: E402
from image_timing import images_per_second  # noqa: E402
import imagenet_like  # noqa: E402
import pil_pipeline  # noqa: E402


BATCH = 8  # batches of 8 rather than color_bench.BATCH: the checks are the same


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench-colour")
    return imagenet_like.make_image_folder(str(root), n_images=BATCH + 5,
                                           n_classes=2, processes=1)


def test_every_loader_delivers_checked_batches(folder, monkeypatch):
    monkeypatch.setattr(color_bench, "BATCH", BATCH)
    tv = pil_pipeline.torchvision_or_none()
    if tv is None:
        pytest.skip("torchvision is not importable")
    for name, loader in color_bench.make_loaders(folder, 0, tv).items():
        assert images_per_second(loader) > 0, name
