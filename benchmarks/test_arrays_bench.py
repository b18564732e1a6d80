"""A smoke run of arrays_bench.py on small files: every configuration
delivers checked batches, and the memory probe runs.  CI runs this with the
benchmarks disabled; the numbers come from ``python benchmarks/arrays_bench.py``."""

import os

import pytest

torch = pytest.importorskip("torch")

import arrays_bench  # noqa: E402
from array_workloads import make_rows, make_tokens  # noqa: E402

pytestmark = [
    pytest.mark.filterwarnings(r"ignore:This DataLoader will create \d+ worker processes"),
    pytest.mark.filterwarnings("ignore:This process .* is multi-threaded, use of fork"),
]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("arrays")
    return {
        "rows": make_rows(str(root / "rows.npy"), 3000),
        "tokens": make_tokens(str(root / "tokens.bin"), 3000 * 1025),
    }


@pytest.mark.parametrize("name", list(arrays_bench.CONFIGS))
@pytest.mark.parametrize("workload", ["rows", "tokens"])
def test_configuration_delivers_checked_batches(files, workload, name):
    setup = arrays_bench.Setup(workload, files[workload], name, samples=5 * arrays_bench.BATCH)
    setup.epoch()
    setup.epoch()  # the same draws again (persistent workers, re-seeded sampler)


def test_a_wrong_batch_fails_the_check(files):
    setup = arrays_bench.Setup("rows", files["rows"], "fastload w0", samples=arrays_bench.BATCH)
    setup.plan = [expected + 1 for expected in setup.plan]
    with pytest.raises(AssertionError, match="wrong rows"):
        setup.epoch()


def test_memory_probe_sees_this_process():
    pss = arrays_bench._tree_pss(os.getpid())
    assert pss["anon"] > 1 << 20 and pss["file"] > 0
