"""A smoke run of recipe_bench.py on a small folder: both loaders deliver
checked batches, and fastload compiles each recipe's torchvision transform
whole.  The numbers come from ``python benchmarks/recipe_bench.py``."""

import pytest

pytest.importorskip("torch")
pytest.importorskip("PIL")

import imagenet_like  # noqa: E402
import pil_pipeline  # noqa: E402
import recipe_bench  # noqa: E402
from image_timing import images_per_second  # noqa: E402


BATCH = 8  # batches of 8 rather than recipe_bench.BATCH: the checks are the same


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench-recipe")
    return imagenet_like.make_image_folder(str(root), n_images=BATCH + 5,
                                           n_classes=3, processes=1)


@pytest.mark.parametrize("name", sorted(recipe_bench.RECIPES))
def test_both_loaders_deliver_mixed_batches(folder, name, monkeypatch):
    monkeypatch.setattr(recipe_bench, "BATCH", BATCH)
    tv = pil_pipeline.torchvision_or_none()
    if tv is None:
        pytest.skip("torchvision is not importable")
    for kind, loader in recipe_bench.make_loaders(folder, 0, tv, name).items():
        assert images_per_second(loader) > 0, kind
        images, labels = next(iter(loader))
        assert tuple(labels.shape) == (recipe_bench.BATCH, 3), kind  # soft labels
