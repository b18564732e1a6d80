"""A smoke run of images_bench.py on a small folder: every loader of both
transforms delivers checked batches.  The numbers come from
``python benchmarks/images_bench.py``."""

import pytest

pytest.importorskip("torch")
pytest.importorskip("PIL")

import images_bench  # noqa: E402
from image_timing import images_per_second  # noqa: E402
import imagenet_like  # noqa: E402

pytestmark = [
    pytest.mark.filterwarnings(r"ignore:This DataLoader will create \d+ worker processes"),
    pytest.mark.filterwarnings("ignore:This process .* is multi-threaded, use of fork"),
]


BATCH = 8  # batches of 8 rather than images_bench.BATCH: the checks are the same


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench-images")
    return imagenet_like.make_image_folder(str(root), n_images=2 * BATCH + 5,
                                           n_classes=3, processes=1)


@pytest.mark.parametrize("kind", ["train", "val"])
def test_every_loader_delivers_checked_batches(folder, kind, monkeypatch):
    monkeypatch.setattr(images_bench, "BATCH", BATCH)
    for name, loader in images_bench.make_loaders(folder, kind, workers=1).items():
        assert images_per_second(loader) > 0, name


def test_scan_benchmark_builds_the_same_dataset(tmp_path):
    import scan_bench

    root = scan_bench.make_files(str(tmp_path), 50, n_classes=7)
    built = {name: build(root) for name, build in scan_bench.BUILDERS.items()}
    assert list(built["fastload"].samples) == list(built["torchvision rules"].samples)
    assert len(built["fastload"]) == 50
