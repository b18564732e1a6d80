"""A smoke run of png_bench.py on a small folder: every loader delivers
checked batches, and the C decoders' batches equal the Pillow fallback's.
The numbers come from ``python benchmarks/png_bench.py``."""

import pytest

pytest.importorskip("torch")
pytest.importorskip("PIL")

import png_bench  # noqa: E402
from image_timing import images_per_second  # noqa: E402

pytestmark = [
    pytest.mark.filterwarnings(r"ignore:This DataLoader will create \d+ worker processes"),
    pytest.mark.filterwarnings("ignore:This process .* is multi-threaded, use of fork"),
]


BATCH = 8  # batches of 8 rather than png_bench.BATCH: the checks are the same


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench-png")
    return png_bench.make_png_folder(str(root), BATCH + 5)


def test_every_loader_delivers_checked_batches(folder, monkeypatch):
    monkeypatch.setattr(png_bench, "BATCH", BATCH)
    for workers in (0, 1):
        for name, loader in png_bench.make_loaders(folder, workers).items():
            assert images_per_second(loader) > 0, (name, workers)


def test_c_decoders_and_the_fallback_give_the_same_samples(folder):
    native = png_bench.fastload_folder(folder, pillow=False)
    pillow = png_bench.fastload_folder(folder, pillow=True)
    for i in (0, 7, len(native) - 1):
        assert (native._source.sample(i, 3, 0) == pillow._source.sample(i, 3, 0)).all()
