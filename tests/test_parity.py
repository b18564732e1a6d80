"""Core parity: the same configuration run through torch.utils.data.DataLoader and
fastload.DataLoader must yield identical batches (container types, tensor dtype,
shape, values) in the identical order.

Random configurations use separate but equally seeded torch.Generators for the
two loaders (or torch.manual_seed(s) before each loader for the global RNG), and
check_parity also asserts that both loaders consumed the RNG identically.
"""

import os

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")

import time  # noqa: E402

import torch.utils.data as tud  # noqa: E402

import fastload  # noqa: E402
import fl_helpers  # noqa: E402
from fl_helpers import (  # noqa: E402
    MAP_DATASET_NAMES,
    N,
    IterableIndices,
    assert_same_epochs,
    check_parity,
    identity,
    iterable_dataset,
    run_loader,
    sum_collate,
)


@pytest.fixture(autouse=True, params=["process", "thread"])
def worker_mode(request, monkeypatch):
    """Every case runs with fastload's worker processes and its threads."""
    if (request.param == "process" and os.environ.get("FASTLOAD_SANITIZER_RUN")
            and _without_workers(request)):
        # worker_mode reaches only loaders with workers (fl_helpers.run_loader):
        # this case would repeat its "thread" run exactly.  The plain run runs both.
        pytest.skip("no workers: the same run as the thread case (sanitizer run)")
    monkeypatch.setattr(fl_helpers, "WORKER_MODE", request.param)
    return request.param


# Tests whose loaders never have workers (no num_workers parameter).
_NO_WORKER_TESTS = {"test_map_dataset_parity"}


def _without_workers(request):
    params = getattr(request.node, "callspec", None)
    params = params.params if params is not None else {}
    return request.function.__name__ in _NO_WORKER_TESTS or params.get("num_workers", -1) == 0


BATCH_CFGS = [
    pytest.param(1, False, id="bs1"),
    pytest.param(1, True, id="bs1-drop"),
    pytest.param(3, False, id="bs3"),
    pytest.param(3, True, id="bs3-drop"),
    pytest.param(7, False, id="bs7"),
    pytest.param(7, True, id="bs7-drop"),
    pytest.param(None, False, id="bsNone"),
]


# ---------------------------------------------------------------------------
# map-style datasets x batching x workers
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("batch_size,drop_last", BATCH_CFGS)
@pytest.mark.parametrize("ds_name", MAP_DATASET_NAMES)
def test_map_dataset_parity(make_map_dataset, ds_name, batch_size, drop_last):
    ds = make_map_dataset(ds_name)
    actual, expected = check_parity(ds, lambda lib: dict(batch_size=batch_size, drop_last=drop_last))
    assert len(expected[0]) > 0


@pytest.mark.parametrize("batch_size,drop_last", [(3, False), (7, True), (None, False)])
@pytest.mark.parametrize("ds_name", MAP_DATASET_NAMES)
def test_map_dataset_parity_two_workers(make_map_dataset, ds_name, batch_size, drop_last):
    ds = make_map_dataset(ds_name)
    check_parity(ds, lambda lib: dict(batch_size=batch_size, drop_last=drop_last, num_workers=2))


@pytest.mark.parametrize("num_workers", [1, 3])
@pytest.mark.parametrize("ds_name", ["array", "dict", "nested_list", "torch_tensors", "memmap"])
def test_map_dataset_parity_other_worker_counts(make_map_dataset, ds_name, num_workers):
    ds = make_map_dataset(ds_name)
    check_parity(ds, lambda lib: dict(batch_size=4, num_workers=num_workers))


@pytest.mark.parametrize("ds_name", ["dict", "torch_tensors"])
def test_torch_reference_shortcut(make_map_dataset, ds_name):
    """Premise of fl_helpers.torch_reference_kwargs: for map-style datasets torch
    yields the same batches and consumes RNGs the same with and without workers."""
    ds = make_map_dataset(ds_name)
    runs, states = [], []
    for nw in (0, 2):
        g = torch.Generator().manual_seed(4)
        runs.append(run_loader(tud.DataLoader, ds, dict(batch_size=5, shuffle=True, num_workers=nw,
                                                         generator=g), epochs=2))
        states.append(g.get_state())
    assert_same_epochs(runs[1], runs[0])
    assert torch.equal(states[0], states[1])


@pytest.mark.parametrize("ds_name", ["array", "dict", "getitems", "np_scalars"])
def test_fastload_dataset_base_class(make_map_dataset, ds_name):
    """A dataset subclassing fastload.Dataset behaves like the torch-based one."""
    t_ds = make_map_dataset(ds_name)
    f_ds = make_map_dataset(ds_name, base=fastload.Dataset)
    assert isinstance(f_ds, fastload.Dataset)
    for nw in (0, 2):
        check_parity(t_ds, lambda lib: dict(batch_size=3, num_workers=nw), fl_dataset=f_ds)


def test_getitems_is_used_only_with_auto_collation(make_map_dataset):
    ds = make_map_dataset("getitems")
    (batched,), _ = check_parity(ds, lambda lib: dict(batch_size=4))
    assert all(b["via"] == ["getitems"] * len(b["via"]) for b in batched)
    (unbatched,), _ = check_parity(ds, lambda lib: dict(batch_size=None))
    assert all(s["via"] == "getitem" for s in unbatched)


# ---------------------------------------------------------------------------
# shuffling: explicit generators and the global torch RNG
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("batch_size", [1, 5])
@pytest.mark.parametrize("num_workers", [0, 1, 2])
@pytest.mark.parametrize("seed", [0, 2024])
def test_shuffle_with_generator(make_map_dataset, seed, num_workers, batch_size):
    ds = make_map_dataset("tuple")
    actual, expected = check_parity(
        ds,
        lambda lib: dict(batch_size=batch_size, shuffle=True, num_workers=num_workers,
                         generator=torch.Generator().manual_seed(seed)),
        epochs=2,
    )
    # sanity: shuffled, and the two epochs differ
    labels0 = [b[0][:, 1].tolist() for b in expected[0]]
    labels1 = [b[0][:, 1].tolist() for b in expected[1]]
    assert labels0 != labels1


@pytest.mark.parametrize("batch_size,drop_last", [(4, True), (None, False)])
def test_shuffle_with_generator_drop_last_and_unbatched(make_map_dataset, batch_size, drop_last):
    ds = make_map_dataset("dict")
    for nw in (0, 2):
        check_parity(ds, lambda lib: dict(batch_size=batch_size, drop_last=drop_last, shuffle=True,
                                          num_workers=nw, generator=torch.Generator().manual_seed(11)),
                     epochs=2)


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("seed", [0, 77])
def test_shuffle_with_global_rng(make_map_dataset, seed, num_workers):
    """Both loaders draw the base seed at iterator creation, then the sampler seed,
    from the global RNG; torch.manual_seed(seed) is called before each loader."""
    ds = make_map_dataset("array")
    actual, expected = check_parity(
        ds, lambda lib: dict(batch_size=4, shuffle=True, num_workers=num_workers),
        epochs=2, global_seed=seed)
    assert not torch.equal(expected[0][0], expected[1][0])


def test_global_rng_is_consumed_even_without_shuffle(make_map_dataset):
    """The base seed is drawn from the global RNG for every iterator (torch semantics)."""
    ds = make_map_dataset("array")
    for lib in (tud, fastload):
        torch.manual_seed(5)
        loader = lib.DataLoader(ds, batch_size=4)
        it = iter(loader)
        state_after_iter = torch.get_rng_state()
        list(it)
        torch.manual_seed(5)
        torch.empty((), dtype=torch.int64).random_()
        assert torch.equal(state_after_iter, torch.get_rng_state()), lib.__name__


# ---------------------------------------------------------------------------
# samplers
# ---------------------------------------------------------------------------

def _g(seed):
    return torch.Generator().manual_seed(seed)


SAMPLER_CASES = {
    "sequential": lambda lib, ds: dict(sampler=lib.SequentialSampler(ds)),
    "random": lambda lib, ds: dict(sampler=lib.RandomSampler(ds, generator=_g(1))),
    "random_replacement": lambda lib, ds: dict(
        sampler=lib.RandomSampler(ds, replacement=True, generator=_g(2))),
    "random_replacement_num_samples": lambda lib, ds: dict(
        sampler=lib.RandomSampler(ds, replacement=True, num_samples=70, generator=_g(3))),
    "random_num_samples_gt_len": lambda lib, ds: dict(
        sampler=lib.RandomSampler(ds, num_samples=2 * N + 5, generator=_g(4))),
    "random_num_samples_lt_len": lambda lib, ds: dict(
        sampler=lib.RandomSampler(ds, num_samples=5, generator=_g(5))),
    "subset_random": lambda lib, ds: dict(
        sampler=lib.SubsetRandomSampler([3, 1, 4, 15, 9, 2, 6, 5, 22], generator=_g(6))),
    "weighted_replacement": lambda lib, ds: dict(
        sampler=lib.WeightedRandomSampler([0.1 * (i % 4) + 0.05 for i in range(N)], 30,
                                          replacement=True, generator=_g(7))),
    "weighted_no_replacement": lambda lib, ds: dict(
        sampler=lib.WeightedRandomSampler(np.linspace(1, 3, N), 15, replacement=False,
                                          generator=_g(8))),
    "plain_list": lambda lib, ds: dict(sampler=[5, 3, 1, 0, 22, 3, 7, 8, 2, 9]),
    "iterable_no_len": lambda lib, ds: dict(sampler=IterableIndices([4, 4, 0, 21, 13, 8, 1])),
    "batch_sampler_random": lambda lib, ds: dict(
        batch_size=1, batch_sampler=lib.BatchSampler(lib.RandomSampler(ds, generator=_g(9)), 4, False)),
    "batch_sampler_drop_last": lambda lib, ds: dict(
        batch_sampler=lib.BatchSampler(lib.SequentialSampler(ds), 5, True)),
    "batch_sampler_list_of_lists": lambda lib, ds: dict(
        batch_sampler=[[0, 1, 2], [22], [5, 5, 6, 7], [3, 2]]),
    "batch_sampler_iterable": lambda lib, ds: dict(
        batch_sampler=IterableIndices([[1, 2], [3], [4, 5, 6]])),
}


@pytest.mark.parametrize("sampler_lib,num_workers", [("torch", 0), ("fastload", 0), ("fastload", 2)])
@pytest.mark.parametrize("case", list(SAMPLER_CASES))
def test_sampler_parity(make_map_dataset, case, sampler_lib, num_workers):
    """torch loader always gets torch's sampler; the fastload loader gets either
    torch's (accepted as-is) or fastload's own sampler classes."""
    ds = make_map_dataset("tuple")
    make = SAMPLER_CASES[case]

    def kwargs(lib):
        kw = dict(batch_size=3, num_workers=num_workers)
        s_lib = tud if (lib is tud or sampler_lib == "torch") else fastload
        kw.update(make(s_lib, ds))
        if "batch_sampler" in kw:
            kw.pop("batch_size")
        return kw

    check_parity(ds, kwargs, epochs=2)


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("sampler_lib", ["torch", "fastload"])
def test_random_sampler_global_rng(make_map_dataset, sampler_lib, num_workers):
    ds = make_map_dataset("array")

    def kwargs(lib):
        s_lib = tud if (lib is tud or sampler_lib == "torch") else fastload
        return dict(batch_size=2, num_workers=num_workers, sampler=s_lib.RandomSampler(ds))

    check_parity(ds, kwargs, epochs=2, global_seed=123)


def test_one_shot_generator_sampler(make_map_dataset):
    """A bare generator object as sampler (single epoch)."""
    ds = make_map_dataset("array")
    for nw in (0, 2):
        check_parity(ds, lambda lib: dict(batch_size=2, num_workers=nw,
                                          sampler=(i for i in [7, 1, 1, 20, 3])))


def test_custom_sampler_subclass(make_map_dataset):
    class EvensFirst(fastload.Sampler):
        def __init__(self, n):
            self.n = n

        def __iter__(self):
            return iter(list(range(0, self.n, 2)) + list(range(1, self.n, 2)))

        def __len__(self):
            return self.n

    ds = make_map_dataset("py_scalars")
    actual, expected = check_parity(ds, lambda lib: dict(batch_size=4, sampler=EvensFirst(N)))
    assert actual[0][0][1].tolist() == [0, 2, 4, 6]


DIST_CFGS = [
    pytest.param(rank, shuffle, drop_last, 0, id=f"rank{rank}-shuffle{int(shuffle)}-drop{int(drop_last)}")
    for rank in (0, 2) for shuffle in (True, False) for drop_last in (False, True)
] + [pytest.param(rank, True, False, 2, id=f"rank{rank}-shuffle1-drop0-workers2") for rank in (0, 2)]


@pytest.mark.parametrize("rank,shuffle,drop_last,num_workers", DIST_CFGS)
def test_distributed_sampler_parity(make_map_dataset, rank, shuffle, drop_last, num_workers):
    ds = make_map_dataset("array")

    def kwargs(lib):
        return dict(batch_size=2, num_workers=num_workers,
                    sampler=lib.DistributedSampler(ds, num_replicas=3, rank=rank, shuffle=shuffle,
                                                   seed=5, drop_last=drop_last))

    def set_epoch(kw, epoch):
        kw["sampler"].set_epoch(epoch)

    actual, expected = check_parity(ds, kwargs, epochs=3, before_epoch=set_epoch)
    if shuffle:
        assert not torch.equal(expected[0][0], expected[1][0])


# ---------------------------------------------------------------------------
# collate_fn variants
# ---------------------------------------------------------------------------

COLLATE_CASES = {
    "default": lambda lib: {},
    "explicit_default_collate": lambda lib: dict(collate_fn=lib.default_collate),
    "custom": lambda lib: dict(collate_fn=sum_collate),
    "identity_lambda": lambda lib: dict(collate_fn=lambda x: x),
}


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("case", list(COLLATE_CASES))
def test_collate_fn_parity(make_map_dataset, case, num_workers):
    ds = make_map_dataset("tuple")
    actual, expected = check_parity(
        ds, lambda lib: dict(batch_size=3, num_workers=num_workers, **COLLATE_CASES[case](lib)))
    if case == "custom":
        # the custom collate output is returned untouched (numpy, tuple), not converted
        assert isinstance(actual[0][0]["sum"], np.ndarray)
        assert isinstance(actual[0][0]["labels"], tuple)
    if case == "identity_lambda":
        assert isinstance(actual[0][0], list) and isinstance(actual[0][0][0], tuple)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_collate_fn_unbatched(make_map_dataset, num_workers):
    ds = make_map_dataset("nested_list")
    check_parity(ds, lambda lib: dict(batch_size=None, num_workers=num_workers, collate_fn=identity))
    check_parity(ds, lambda lib: dict(batch_size=None, num_workers=num_workers,
                                      collate_fn=lib.default_convert))


# ---------------------------------------------------------------------------
# iterable-style datasets
# ---------------------------------------------------------------------------

ITER_BATCH_CFGS = [
    pytest.param(None, False, id="bsNone"),
    pytest.param(1, False, id="bs1"),
    pytest.param(3, False, id="bs3"),
    pytest.param(3, True, id="bs3-drop"),
]


def _iterable_variant(variant):
    """(dataset for torch, dataset for fastload)"""
    if variant == "no_shard":
        ds = iterable_dataset(shard="none")
        return ds, ds
    if variant == "shard_torch_info":
        # fastload patches torch.utils.data.get_worker_info inside its worker threads
        ds = iterable_dataset(shard="uneven", get_info=tud.get_worker_info)
        return ds, ds
    if variant == "shard_fastload_info":
        return (iterable_dataset(shard="uneven", get_info=tud.get_worker_info),
                iterable_dataset(shard="uneven", get_info=fastload.get_worker_info,
                                 base=fastload.IterableDataset))
    assert variant == "stride"
    return (iterable_dataset(shard="stride", n=14),
            iterable_dataset(shard="stride", n=14, base=fastload.IterableDataset))


@pytest.mark.parametrize("num_workers", [0, 1, 2, 3])
@pytest.mark.parametrize("batch_size,drop_last", ITER_BATCH_CFGS)
@pytest.mark.parametrize("variant", ["shard_torch_info", "shard_fastload_info"])
def test_iterable_parity_uneven_shards(variant, batch_size, drop_last, num_workers):
    """Workers' batches are merged round-robin; shards of different lengths make
    workers run out at different times (and drop_last applies per worker)."""
    t_ds, f_ds = _iterable_variant(variant)
    actual, expected = check_parity(
        t_ds, lambda lib: dict(batch_size=batch_size, drop_last=drop_last, num_workers=num_workers),
        fl_dataset=f_ds)
    assert len(expected[0]) > 0


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("batch_size,drop_last", ITER_BATCH_CFGS)
@pytest.mark.parametrize("variant", ["no_shard", "stride"])
def test_iterable_parity(variant, batch_size, drop_last, num_workers):
    """no_shard: every worker yields the full range (torch duplicates data)."""
    t_ds, f_ds = _iterable_variant(variant)
    check_parity(
        t_ds, lambda lib: dict(batch_size=batch_size, drop_last=drop_last, num_workers=num_workers),
        fl_dataset=f_ds)


@pytest.mark.parametrize("num_workers", [2, 3])
def test_iterable_with_empty_shards(num_workers):
    """n=2 split (1,4,9)-weighted: some workers get no items at all."""
    ds = iterable_dataset(shard="uneven", n=2)
    check_parity(ds, lambda lib: dict(batch_size=1, num_workers=num_workers))
    check_parity(ds, lambda lib: dict(batch_size=2, drop_last=True, num_workers=num_workers))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_iterable_dict_samples(num_workers):
    t_ds = iterable_dataset("dict", get_info=tud.get_worker_info)
    f_ds = iterable_dataset("dict", get_info=fastload.get_worker_info)
    for bs in (None, 4):
        check_parity(t_ds, lambda lib: dict(batch_size=bs, num_workers=num_workers), fl_dataset=f_ds,
                     epochs=2)


# ---------------------------------------------------------------------------
# prefetch_factor, persistent workers, in_order
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("num_workers", [1, 2])
@pytest.mark.parametrize("prefetch_factor", [1, 2, 5])
def test_prefetch_factor(make_map_dataset, prefetch_factor, num_workers):
    ds = make_map_dataset("dict")
    check_parity(ds, lambda lib: dict(batch_size=3, num_workers=num_workers,
                                      prefetch_factor=prefetch_factor))
    it_ds = iterable_dataset(shard="uneven", n=19)
    check_parity(it_ds, lambda lib: dict(batch_size=2, num_workers=num_workers,
                                         prefetch_factor=prefetch_factor))


@pytest.mark.parametrize("num_workers", [1, 2])
def test_persistent_workers_shuffle_generator(make_map_dataset, num_workers):
    """With persistent workers torch draws the base seed only for the first
    iterator; later epochs only advance the sampler. Orders must still match."""
    ds = make_map_dataset("tuple")
    actual, expected = check_parity(
        ds, lambda lib: dict(batch_size=4, shuffle=True, num_workers=num_workers, persistent_workers=True,
                             generator=torch.Generator().manual_seed(31)),
        epochs=3)
    assert len(expected) == 3


def test_persistent_workers_global_rng(make_map_dataset):
    ds = make_map_dataset("array")
    check_parity(ds, lambda lib: dict(batch_size=4, shuffle=True, num_workers=2, persistent_workers=True),
                 epochs=3, global_seed=9)


@pytest.mark.parametrize("num_workers", [1, 2])
def test_persistent_workers_iterable(num_workers):
    ds = iterable_dataset(shard="uneven", n=13)
    check_parity(ds, lambda lib: dict(batch_size=2, num_workers=num_workers, persistent_workers=True),
                 epochs=3)


def test_persistent_workers_partial_epoch(make_map_dataset):
    """Abandoning an epoch half-way and starting a new one restarts from the beginning."""
    ds = make_map_dataset("array")
    results = {}
    for lib in (tud, fastload):
        loader = lib.DataLoader(ds, batch_size=2, num_workers=2, persistent_workers=True)
        it = iter(loader)
        first = [next(it) for _ in range(3)]
        second_epoch = list(loader)
        results[lib.__name__] = (first, second_epoch)
        del it, loader
    assert_same_epochs(list(results["fastload"]), list(results["torch.utils.data"]))
    assert len(results["fastload"][1]) == (N + 1) // 2


@pytest.mark.parametrize("num_workers", [1, 2, 3])
def test_in_order_false_map(make_map_dataset, num_workers):
    ds = make_map_dataset("tuple")
    check_parity(ds, lambda lib: dict(batch_size=2, num_workers=num_workers, in_order=False),
                 ordered=False, epochs=2)


@pytest.mark.parametrize("num_workers", [2, 3])
def test_in_order_false_iterable(num_workers):
    ds = iterable_dataset(shard="uneven", n=20)
    check_parity(ds, lambda lib: dict(batch_size=3, num_workers=num_workers, in_order=False),
                 ordered=False)


class _SlowFirst(tud.Dataset):
    """Item 0 is slow, so out-of-order delivery actually happens."""

    def __len__(self):
        return 12

    def __getitem__(self, i):
        if i == 0:
            time.sleep(0.2)
        return np.array([i, i * i])


def test_in_order_false_with_slow_item():
    actual, expected = check_parity(
        _SlowFirst(), lambda lib: dict(batch_size=1, num_workers=2, in_order=False), ordered=False)
    assert len(actual[0]) == 12


def test_in_order_false_without_workers_is_ordered(make_map_dataset):
    ds = make_map_dataset("tuple")
    check_parity(ds, lambda lib: dict(batch_size=3, in_order=False))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_loader_reiteration_is_independent(make_map_dataset, num_workers):
    """Two live iterators over the same loader do not interfere."""
    ds = make_map_dataset("array")
    out = {}
    for lib in (tud, fastload):
        loader = lib.DataLoader(ds, batch_size=4, num_workers=num_workers)
        it1, it2 = iter(loader), iter(loader)
        a = [next(it1), next(it1)]
        b = list(it2)
        a += list(it1)
        out[lib.__name__] = [a, b]
        del it1, it2
    assert_same_epochs(out["fastload"], out["torch.utils.data"])
    assert len(out["fastload"][0]) == len(out["fastload"][1]) == 6


def test_run_loader_helper_detects_differences(make_map_dataset):
    """Guard against a vacuous comparison helper."""
    ds = make_map_dataset("array")
    a = run_loader(tud.DataLoader, ds, dict(batch_size=3))
    b = run_loader(tud.DataLoader, ds, dict(batch_size=3, shuffle=True,
                                              generator=torch.Generator().manual_seed(0)))
    with pytest.raises(AssertionError):
        assert_same_epochs(a, b)
