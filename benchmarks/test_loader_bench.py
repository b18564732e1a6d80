"""pytest-benchmark: torch's DataLoader against fastload's, side by side.

Every benchmark is parametrised over the loader (torch, fastload) and
num_workers (0, 1, 2); ``benchmark.group`` puts the torch and fastload rows of
one configuration together in pytest-benchmark's report.  Each body reads
every value of every batch and asserts the sample count and the exact
checksum computed without a loader, so a fast but wrong loader fails.

CI runs this file with ``--benchmark-disable`` (each body once, as a plain
test), so the sizes are small.  For numbers, run it with benchmarks enabled
(``python -m pytest benchmarks``) or, better on a noisy machine, use
``python benchmarks/compare.py``, which interleaves the two loaders.
"""

import gc

import pytest

from workloads import BATCH_SIZE, FixedArrays, NumpyWork, consume, make_loader

pytest.importorskip("torch")

pytestmark = [
    # torch warns when num_workers exceeds the CPU count (a 1-core runner).
    pytest.mark.filterwarnings(r"ignore:This DataLoader will create \d+ worker processes"),
    # Python >= 3.12 warns when a process with threads forks (torch's
    # workers fork; torch's own intra-op threads count).
    pytest.mark.filterwarnings("ignore:This process .* is multi-threaded, use of fork"),
]

LOADERS = ["torch", "fastload"]
WORKERS = [0, 1, 2]

FIXED_SAMPLES = 4096  # 64 batches of 64
WORK_SAMPLES = 384  # 6 batches of ~1 ms samples
ROUNDS = 3


def _smoke(request):
    """With --benchmark-disable (CI) each body runs once, untimed, as a
    check: fewer samples (16 and 2 batches) are checked the same way."""
    return request.config.getoption("benchmark_disable", False)


@pytest.fixture(scope="module")
def fixed_arrays(request):
    return FixedArrays(FIXED_SAMPLES // 4 if _smoke(request) else FIXED_SAMPLES)


@pytest.fixture(scope="module")
def numpy_work(request):
    dataset = NumpyWork(WORK_SAMPLES // 3 if _smoke(request) else WORK_SAMPLES)
    dataset.expected_checksum([0])  # compute the reference once, outside any timing
    return dataset


def _epoch_benchmark(benchmark, dataset, loader, num_workers):
    expected = (len(dataset), dataset.expected_checksum(range(len(dataset))))
    data_loader = make_loader(loader, dataset, num_workers)
    # One round = one epoch from a fresh iterator, so worker start-up is
    # included, as it is in every epoch without persistent_workers.  The
    # warm-up round absorbs first-use costs, including the copy-on-write
    # faults that an earlier test's forked torch workers leave behind.
    result = benchmark.pedantic(consume, args=(data_loader,), rounds=ROUNDS, warmup_rounds=1)
    assert result == expected


@pytest.mark.parametrize("num_workers", WORKERS)
@pytest.mark.parametrize("loader", LOADERS)
def test_epoch_fixed_arrays(benchmark, fixed_arrays, loader, num_workers):
    benchmark.group = f"epoch FixedArrays({FIXED_SAMPLES}) num_workers={num_workers}"
    _epoch_benchmark(benchmark, fixed_arrays, loader, num_workers)


@pytest.mark.parametrize("num_workers", WORKERS)
@pytest.mark.parametrize("loader", LOADERS)
def test_epoch_numpy_work(benchmark, numpy_work, loader, num_workers):
    benchmark.group = f"epoch NumpyWork({WORK_SAMPLES}) num_workers={num_workers}"
    _epoch_benchmark(benchmark, numpy_work, loader, num_workers)


class _FirstBatch:
    """One time-to-first-batch round: the loader is built beforehand (not
    timed), the iterator is created and its first batch taken (timed), then
    the batch is checked and the iterator shut down (not timed)."""

    def __init__(self, loader, dataset, num_workers):
        self.loader = make_loader(loader, dataset, num_workers)
        self.iterator = None
        self.batch = None

    def take(self):
        self.iterator = iter(self.loader)
        self.batch = next(self.iterator)

    def finish(self):
        if self.iterator is None:
            return None
        batch, self.batch = self.batch, None
        # Dropping the iterator stops its workers (threads or processes).
        self.iterator = None
        gc.collect()
        return consume([batch])


@pytest.mark.parametrize("num_workers", WORKERS)
@pytest.mark.parametrize("loader", LOADERS)
def test_time_to_first_batch(benchmark, fixed_arrays, loader, num_workers):
    benchmark.group = f"time to first batch, num_workers={num_workers}"
    expected = (BATCH_SIZE, fixed_arrays.expected_checksum(range(BATCH_SIZE)))
    rounds = []
    results = []

    def setup():
        rounds.append(_FirstBatch(loader, fixed_arrays, num_workers))
        return (rounds[-1],), {}

    def teardown(round_):
        results.append(round_.finish())

    try:
        # Warm-up round: as in _epoch_benchmark.
        benchmark.pedantic(_FirstBatch.take, setup=setup, teardown=teardown, rounds=5, warmup_rounds=1)
    finally:
        # With --benchmark-disable pytest-benchmark skips the teardown.
        results.extend(r.finish() for r in rounds if r.iterator is not None)
    assert results and all(r == expected for r in results), results
