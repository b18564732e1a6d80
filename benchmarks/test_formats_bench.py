"""A smoke run of formats_bench.py on small files: every loader delivers
checked batches.  CI runs this with the benchmarks disabled; the numbers
come from ``python benchmarks/formats_bench.py``."""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("h5py")
pytest.importorskip("pyarrow")
pytest.importorskip("lmdb")

import formats_bench  # noqa: E402

pytestmark = [
    pytest.mark.filterwarnings(r"ignore:This DataLoader will create \d+ worker processes"),
    pytest.mark.filterwarnings("ignore:This process .* is multi-threaded, use of fork"),
]


@pytest.fixture(autouse=True)
def small_batches(monkeypatch):
    """Batches of 64 rows rather than 256: the check of each batch is the same."""
    monkeypatch.setattr(formats_bench, "BATCH", 64)


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    return formats_bench.make_files(str(tmp_path_factory.mktemp("formats")), 1024)


@pytest.mark.parametrize("library", ["torch", "fastload"])
@pytest.mark.parametrize("kind", formats_bench.KINDS)
def test_loader_delivers_checked_batches(paths, kind, library):
    setup = formats_bench.Setup(kind, paths[kind], library, 1024, batches=2)
    setup.epoch()
    setup.epoch()


def test_a_wrong_batch_fails_the_check(paths):
    setup = formats_bench.Setup("arrow", paths["arrow"], "fastload", 1024, batches=1)
    setup.plan = setup.plan + 1
    with pytest.raises(AssertionError, match="wrong rows"):
        setup.epoch()
