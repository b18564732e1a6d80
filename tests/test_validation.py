"""Argument validation (same exception types as torch), attribute-assignment
restrictions, and len() rules."""

import re
import warnings

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")

import torch.utils.data as tud  # noqa: E402

import fastload  # noqa: E402
from fl_helpers import (  # noqa: E402
    fastload_only,
    LIBS,
    N,
    IterableIndices,
    SizedIterable,
    capture_exception,
    iterable_dataset,
    no_worker_count_warning,
)



class MapDS(tud.Dataset):
    def __init__(self, n=N):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i


class Unsized(tud.Dataset):
    def __getitem__(self, i):
        return i


def assert_raises_like_torch(build, match=None):
    """``build(lib)`` performs the call with lib = torch.utils.data or fastload.
    The call must raise for torch (test premise); fastload must raise an
    exception of the same type, and both messages must match ``match``."""
    with no_worker_count_warning():
        t_exc = capture_exception(lambda: build(tud))
        f_exc = capture_exception(lambda: build(fastload))
    assert t_exc is not None, "premise: torch raises for this call"
    assert f_exc is not None, f"fastload did not raise; torch raised {type(t_exc).__name__}: {t_exc}"
    assert isinstance(f_exc, type(t_exc)), (
        f"fastload raised {type(f_exc).__name__}: {f_exc}\ntorch raised {type(t_exc).__name__}: {t_exc}")
    if match is not None:
        assert re.search(match, str(t_exc), re.I), f"premise: torch message {t_exc!s} ~ {match}"
        assert re.search(match, str(f_exc), re.I), f"fastload message {f_exc!s} does not match {match!r}"
    return f_exc


MAP = MapDS()
ITER = iterable_dataset(shard="none", n=5)

DATALOADER_ERRORS = {
    "negative_num_workers": (lambda lib: lib.DataLoader(MAP, num_workers=-1), "num_workers"),
    "negative_timeout": (lambda lib: lib.DataLoader(MAP, timeout=-1), "timeout"),
    "prefetch_without_workers": (lambda lib: lib.DataLoader(MAP, prefetch_factor=2), "prefetch_factor"),
    "negative_prefetch": (lambda lib: lib.DataLoader(MAP, num_workers=1, prefetch_factor=-1),
                          "prefetch_factor"),
    "persistent_without_workers": (lambda lib: lib.DataLoader(MAP, persistent_workers=True),
                                   "persistent_workers"),
    "iterable_shuffle": (lambda lib: lib.DataLoader(ITER, shuffle=True), "shuffle"),
    "iterable_sampler": (lambda lib: lib.DataLoader(ITER, sampler=[0, 1]), "sampler"),
    "iterable_batch_sampler": (lambda lib: lib.DataLoader(ITER, batch_sampler=[[0]]), "batch_sampler"),
    "sampler_and_shuffle": (lambda lib: lib.DataLoader(MAP, sampler=[0, 1], shuffle=True),
                            "mutually exclusive"),
    "batch_sampler_and_batch_size": (lambda lib: lib.DataLoader(MAP, batch_sampler=[[0]], batch_size=2),
                                     "mutually exclusive"),
    "batch_sampler_and_shuffle": (lambda lib: lib.DataLoader(MAP, batch_sampler=[[0]], shuffle=True),
                                  "mutually exclusive"),
    "batch_sampler_and_sampler": (lambda lib: lib.DataLoader(MAP, batch_sampler=[[0]], sampler=[0]),
                                  "mutually exclusive"),
    "batch_sampler_and_drop_last": (lambda lib: lib.DataLoader(MAP, batch_sampler=[[0]], drop_last=True),
                                    "mutually exclusive"),
    "batch_size_none_and_drop_last": (lambda lib: lib.DataLoader(MAP, batch_size=None, drop_last=True),
                                      "mutually exclusive"),
    "batch_size_zero": (lambda lib: lib.DataLoader(MAP, batch_size=0), "batch_size"),
    "batch_size_negative": (lambda lib: lib.DataLoader(MAP, batch_size=-3), "batch_size"),
    "batch_size_float": (lambda lib: lib.DataLoader(MAP, batch_size=2.5), "batch_size"),
    "batch_size_bool": (lambda lib: lib.DataLoader(MAP, batch_size=True), "batch_size"),
    "batch_size_str": (lambda lib: lib.DataLoader(MAP, batch_size="4"), "batch_size"),
    "drop_last_not_bool": (lambda lib: lib.DataLoader(MAP, batch_size=2, drop_last="yes"), "drop_last"),
    "mp_context_without_workers": (lambda lib: lib.DataLoader(MAP, multiprocessing_context="fork"),
                                   "multiprocessing_context"),
    "mp_context_invalid_name": (lambda lib: lib.DataLoader(MAP, num_workers=1,
                                                           multiprocessing_context="no-such-method"),
                                "multiprocessing_context"),
    "mp_context_wrong_type": (lambda lib: lib.DataLoader(MAP, num_workers=1, multiprocessing_context=42),
                              "multiprocessing_context"),
}


@pytest.mark.parametrize("case", list(DATALOADER_ERRORS))
def test_dataloader_argument_errors(case):
    build, match = DATALOADER_ERRORS[case]
    assert_raises_like_torch(build, match)


SAMPLER_ERRORS = {
    "random_replacement_not_bool": (lambda lib: lib.RandomSampler(MAP, replacement=1), "replacement"),
    "random_num_samples_zero": (lambda lib: lib.RandomSampler(MAP, num_samples=0), "num_samples"),
    "random_num_samples_float": (lambda lib: lib.RandomSampler(MAP, num_samples=2.5), "num_samples"),
    "random_empty_dataset": (lambda lib: lib.RandomSampler(MapDS(0)), "num_samples"),
    "shuffle_empty_dataset": (lambda lib: lib.DataLoader(MapDS(0), shuffle=True), "num_samples"),
    "weighted_num_samples_zero": (lambda lib: lib.WeightedRandomSampler([1.0, 2.0], 0), "num_samples"),
    "weighted_num_samples_bool": (lambda lib: lib.WeightedRandomSampler([1.0, 2.0], True), "num_samples"),
    "weighted_replacement_not_bool": (lambda lib: lib.WeightedRandomSampler([1.0, 2.0], 2, replacement=1),
                                      "replacement"),
    "weighted_2d_weights": (lambda lib: lib.WeightedRandomSampler([[1.0, 2.0]], 2), "weights"),
    "batch_sampler_size_zero": (lambda lib: lib.BatchSampler(lib.SequentialSampler(MAP), 0, False),
                                "batch_size"),
    "batch_sampler_size_bool": (lambda lib: lib.BatchSampler(lib.SequentialSampler(MAP), True, False),
                                "batch_size"),
    "batch_sampler_drop_last_not_bool": (lambda lib: lib.BatchSampler(lib.SequentialSampler(MAP), 2, 1),
                                         "drop_last"),
    "distributed_rank_too_big": (lambda lib: lib.DistributedSampler(MAP, num_replicas=2, rank=2), "rank"),
    "distributed_rank_negative": (lambda lib: lib.DistributedSampler(MAP, num_replicas=2, rank=-1), "rank"),
    "distributed_no_process_group": (lambda lib: lib.DistributedSampler(MAP), None),
}


@pytest.mark.parametrize("case", list(SAMPLER_ERRORS))
def test_sampler_argument_errors(case):
    build, match = SAMPLER_ERRORS[case]
    assert_raises_like_torch(build, match)


def test_weighted_sampler_without_replacement_too_many_samples():
    """torch raises when iterating (multinomial), not at construction."""
    assert_raises_like_torch(
        lambda lib: list(lib.WeightedRandomSampler([1.0, 1.0], 3, replacement=False,
                                                   generator=torch.Generator().manual_seed(0))))


@pytest.mark.parametrize("lib", LIBS)
def test_valid_edge_arguments_are_accepted(lib):
    # prefetch_factor=None with workers defaults to 2; shuffle=False with IterableDataset is fine
    loader = lib.DataLoader(MAP, num_workers=1)
    assert loader.prefetch_factor == 2
    assert lib.DataLoader(MAP).prefetch_factor is None
    assert lib.DataLoader(MAP, num_workers=2, prefetch_factor=5).prefetch_factor == 5
    assert len(list(lib.DataLoader(ITER, shuffle=False, batch_size=2))) == 3
    # batch_sampler resets batch_size / drop_last
    loader = lib.DataLoader(MAP, batch_sampler=[[0, 1], [2]])
    assert loader.batch_size is None and loader.drop_last is False
    loader = lib.DataLoader(MAP, batch_size=None)
    assert loader.batch_size is None and loader.batch_sampler is None
    loader = lib.DataLoader(MAP, batch_size=4, shuffle=True)
    assert isinstance(loader.sampler, (tud.RandomSampler, fastload.RandomSampler))
    assert isinstance(lib.DataLoader(MAP).sampler, (tud.SequentialSampler, fastload.SequentialSampler))
    assert isinstance(lib.DataLoader(MAP, batch_size=3).batch_sampler,
                      (tud.BatchSampler, fastload.BatchSampler))
    loader = lib.DataLoader(MAP, batch_size=3, drop_last=True, num_workers=1, timeout=2.5)
    assert (loader.batch_size, loader.drop_last, loader.num_workers, loader.timeout) == (3, True, 1, 2.5)
    assert loader.dataset is MAP


# --------------------------------------------------------------------------
# fastload-only arguments
# --------------------------------------------------------------------------

@fastload_only
@pytest.mark.parametrize("output", ["tensorflow", "NUMPY ", "", None, 3])
def test_invalid_output_raises_value_error(output):
    with pytest.raises((ValueError, TypeError)) as info:
        next(iter(fastload.DataLoader(MAP, output=output)))
    if isinstance(output, str):
        assert info.type is ValueError


@fastload_only
@pytest.mark.parametrize("device", ["not-a-device", "cuda:-5x"])
def test_invalid_device_raises_value_error(device):
    with pytest.raises(ValueError):
        next(iter(fastload.DataLoader(MAP, device=device)))


@fastload_only
@pytest.mark.parametrize("output", ["auto", "numpy", "torch"])
def test_valid_output_values(output):
    batches = list(fastload.DataLoader(MAP, batch_size=4, output=output))
    assert len(batches) == 6
    expected_type = np.ndarray if output == "numpy" else torch.Tensor
    assert all(type(b) is expected_type for b in batches)
    assert [int(x) for b in batches for x in b] == list(range(N))


@fastload_only
def test_device_cpu_is_accepted():
    batches = list(fastload.DataLoader(MAP, batch_size=4, device="cpu"))
    assert all(isinstance(b, torch.Tensor) and b.device.type == "cpu" for b in batches)
    batches = list(fastload.DataLoader(MAP, batch_size=4, device=torch.device("cpu")))
    assert torch.equal(torch.cat(batches), torch.arange(N))


# --------------------------------------------------------------------------
# attribute assignment after construction
# --------------------------------------------------------------------------

FROZEN_ATTRS = ["batch_size", "batch_sampler", "sampler", "drop_last", "dataset", "persistent_workers"]


@pytest.mark.parametrize("attr", FROZEN_ATTRS)
def test_frozen_attributes(attr):
    def build(lib):
        loader = lib.DataLoader(MAP, batch_size=2)
        setattr(loader, attr, getattr(loader, attr))

    exc = assert_raises_like_torch(build, "should not be set after")
    assert isinstance(exc, ValueError)
    assert attr in str(exc)


@pytest.mark.parametrize("lib", LIBS)
def test_other_attributes_can_be_reassigned(lib):
    loader = lib.DataLoader(MAP, batch_size=4)
    loader.num_workers = 0
    loader.timeout = 0
    loader.worker_init_fn = None
    loader.collate_fn = lambda batch: ("custom", batch)
    first = next(iter(loader))
    assert first == ("custom", [0, 1, 2, 3])


# --------------------------------------------------------------------------
# len() rules
# --------------------------------------------------------------------------

LEN_CASES = {
    "bs1": (lambda lib: lib.DataLoader(MAP), N),
    "bs3": (lambda lib: lib.DataLoader(MAP, batch_size=3), 8),
    "bs3_drop": (lambda lib: lib.DataLoader(MAP, batch_size=3, drop_last=True), 7),
    "bs7_shuffle": (lambda lib: lib.DataLoader(MAP, batch_size=7, shuffle=True), 4),
    "bs_none": (lambda lib: lib.DataLoader(MAP, batch_size=None), N),
    "bs_larger_than_dataset_drop": (lambda lib: lib.DataLoader(MAP, batch_size=50, drop_last=True), 0),
    "list_sampler": (lambda lib: lib.DataLoader(MAP, batch_size=3, sampler=list(range(10))), 4),
    "random_sampler_num_samples": (
        lambda lib: lib.DataLoader(MAP, batch_size=4, sampler=lib.RandomSampler(MAP, num_samples=9)), 3),
    "weighted_sampler": (
        lambda lib: lib.DataLoader(MAP, batch_size=4, sampler=lib.WeightedRandomSampler([1.0] * N, 10)), 3),
    "distributed": (lambda lib: lib.DataLoader(
        MAP, batch_size=2, sampler=lib.DistributedSampler(MAP, num_replicas=4, rank=1)), 3),
    "distributed_drop_last": (lambda lib: lib.DataLoader(
        MAP, batch_size=1, sampler=lib.DistributedSampler(MAP, num_replicas=4, rank=1, drop_last=True)), 5),
    "batch_sampler_lists": (lambda lib: lib.DataLoader(MAP, batch_sampler=[[0, 1], [2], [3, 4, 5]]), 3),
    "workers": (lambda lib: lib.DataLoader(MAP, batch_size=5, num_workers=2), 5),
    "iterable_sized_bs3": (lambda lib: lib.DataLoader(SizedIterable(10, 10), batch_size=3), 4),
    "iterable_sized_bs3_drop": (
        lambda lib: lib.DataLoader(SizedIterable(10, 10), batch_size=3, drop_last=True), 3),
    "iterable_sized_bs_none": (lambda lib: lib.DataLoader(SizedIterable(10, 10), batch_size=None), 10),
    "iterable_sized_workers": (
        lambda lib: lib.DataLoader(SizedIterable(10, 10), batch_size=4, num_workers=2), 3),
}


@pytest.mark.parametrize("case", list(LEN_CASES))
def test_len(case):
    build, expected = LEN_CASES[case]
    assert len(build(tud)) == expected  # premise
    assert len(build(fastload)) == expected


@pytest.mark.parametrize("lib", LIBS)
def test_len_of_map_iterator(lib):
    loader = lib.DataLoader(MAP, batch_size=3, drop_last=True)
    it = iter(loader)
    assert len(it) == 7
    next(it)
    assert len(it) == 7  # torch: len of the index sampler, not the remaining count
    del it


LEN_ERRORS = {
    "unsized_dataset": lambda lib: len(lib.DataLoader(Unsized(), batch_size=2, sampler=IterableIndices([0]))),
    "iterable_sampler_no_len": lambda lib: len(lib.DataLoader(MAP, sampler=IterableIndices([0, 1]))),
    "iterable_batch_sampler_no_len": lambda lib: len(lib.DataLoader(MAP,
                                                                    batch_sampler=IterableIndices([[0]]))),
    "iterable_dataset_no_len": lambda lib: len(lib.DataLoader(ITER, batch_size=2)),
}


@pytest.mark.parametrize("case", list(LEN_ERRORS))
def test_len_errors(case):
    exc = assert_raises_like_torch(LEN_ERRORS[case])
    assert isinstance(exc, TypeError)


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("lib", LIBS)
def test_iterable_len_warning_when_more_batches_than_reported(lib, num_workers):
    loader = lib.DataLoader(SizedIterable(3, 5), batch_size=1, num_workers=num_workers)
    assert len(loader) == 3
    expected = 5 * max(num_workers, 1)  # unsharded: every worker yields everything
    with pytest.warns(UserWarning, match="Length of IterableDataset"):
        batches = list(loader)
    assert len(batches) == expected


@pytest.mark.parametrize("lib", LIBS)
def test_iterable_len_warning_batched(lib):
    """Surprising torch rule: the number of *batches* yielded is compared with
    len(dataset) (samples, here 4), not with len(loader) (batches, here 2)."""
    loader = lib.DataLoader(SizedIterable(4, 9), batch_size=2)
    assert len(loader) == 2
    it = iter(loader)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(4):  # batches 1..4: no warning although len(loader) == 2
            next(it)
    with pytest.warns(UserWarning, match="Length of IterableDataset"):
        assert next(it).tolist() == [8]
    with pytest.raises(StopIteration):
        next(it)
    del it


@pytest.mark.parametrize("lib", LIBS)
def test_no_iterable_len_warning_without_len_call_or_when_accurate(lib):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # len() never called -> no warning even though the dataset under-reports
        assert len(list(lib.DataLoader(SizedIterable(3, 5), batch_size=1))) == 5
        # accurate length -> no warning
        loader = lib.DataLoader(SizedIterable(5, 5), batch_size=2)
        assert len(loader) == 3
        assert len(list(loader)) == 3
