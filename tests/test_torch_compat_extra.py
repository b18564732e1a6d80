"""torch compatibility beyond batches: generic classes (torch's
``test_typing``), the IterableDataset length warning in torch's words, and
torch's DataPipes driven as torch's DataLoader drives them (shuffle setting,
per-epoch seeds, sharding across workers) -- each checked against torch's
own DataLoader.  ``test_torch_*`` are tests of torch's test/test_dataloader.py
with fastload's DataLoader in place of torch's."""

import itertools
import os
import warnings
from typing import List

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.utils.data as tud  # noqa: E402

import fastload  # noqa: E402
from fl_helpers import SizedIterable  # noqa: E402

dp = pytest.importorskip("torch.utils.data.datapipes")
from torch.utils.data.datapipes.iter import IterableWrapper  # noqa: E402


# --------------------------------------------------------------------------
# generic classes
# --------------------------------------------------------------------------


def test_torch_typing():
    # torch's test_typing: no TypeError.
    class SomeDatasetClass(fastload.Dataset[List[torch.Tensor]]):
        pass

    def _create_dataloader(is_train: bool) -> fastload.DataLoader[List[torch.Tensor]]:
        pass

    class Builtin(fastload.Dataset[list[torch.Tensor]]):
        pass

    def somefunction(dl: fastload.DataLoader[list[torch.Tensor]]):
        pass

    assert issubclass(SomeDatasetClass, fastload.Dataset)


class Counting(fastload.IterableDataset[int]):
    def __iter__(self):
        return iter(range(5))


class Squares(fastload.Dataset[int]):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        return i * i


def test_generic_classes_subscript_and_still_load():
    assert fastload.DataLoader[int].__origin__ is fastload.DataLoader
    assert fastload.Sampler[int].__origin__ is fastload.Sampler
    assert fastload.IterableDataset[str].__origin__ is fastload.IterableDataset
    assert issubclass(Counting, fastload.Dataset)
    assert fastload.datasets.base.is_iterable_dataset(Counting())
    loader = fastload.DataLoader[int](Counting(), batch_size=2)
    assert [b.tolist() for b in loader] == [[0, 1], [2, 3], [4]]
    assert [b.tolist() for b in fastload.DataLoader(Squares(), batch_size=3)] == [[0, 1, 4], [9]]
    # A subclass of both fastload's and torch's generic IterableDataset.
    class Both(fastload.IterableDataset[int], tud.IterableDataset[int]):
        def __iter__(self):
            return iter(range(3))

    assert [b.tolist() for b in fastload.DataLoader(Both(), batch_size=2)] == [[0, 1], [2]]


# --------------------------------------------------------------------------
# the IterableDataset length warning
# --------------------------------------------------------------------------


def _len_warnings(DataLoader, dataset, **kwargs):
    loader = DataLoader(dataset, **kwargs)
    len(loader)  # the reported length is compared only once len() was called
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        batches = [b.tolist() if hasattr(b, "tolist") else b for b in loader]
    return batches, [(w.category, str(w.message)) for w in caught
                     if "Length of IterableDataset" in str(w.message)]


LEN_CASES = {
    "unbatched": dict(batch_size=None),
    "batch1": dict(batch_size=1),
    "batch2": dict(batch_size=2),
    "batch2_drop_last": dict(batch_size=2, drop_last=True),
}


@pytest.mark.parametrize("case", list(LEN_CASES))
@pytest.mark.parametrize("workers", ["none", "process", "thread"])
def test_iterable_len_warning_is_torchs(case, workers):
    """The same warnings (UserWarning, torch's text word for word, the
    worker hint included) after the same batches as torch's loader."""
    dataset = SizedIterable(2, 7)
    kwargs = dict(LEN_CASES[case])
    num_workers = 0 if workers == "none" else 2
    theirs = _len_warnings(tud.DataLoader, dataset, num_workers=num_workers, **kwargs)
    if num_workers:
        kwargs["worker_mode"] = workers
    ours = _len_warnings(fastload.DataLoader, dataset, num_workers=num_workers, **kwargs)
    assert theirs[1], "torch warned: the case must exercise the warning"
    assert ours == theirs
    hint = "For multiprocessing data-loading, this could be caused by not properly configuring"
    assert all(category is UserWarning for category, _ in ours[1])
    assert all((hint in message) == (num_workers > 0) for _, message in ours[1])


def test_iterable_len_warning_not_given_when_torch_gives_none():
    dataset = SizedIterable(7, 7)
    for DataLoader in (tud.DataLoader, fastload.DataLoader):
        assert _len_warnings(DataLoader, dataset, batch_size=2)[1] == []


# --------------------------------------------------------------------------
# DataPipes
# --------------------------------------------------------------------------


def _shuffled_dp(buffer_size=5, n=40):
    return IterableWrapper(list(range(n))).shuffle(buffer_size=buffer_size).sharding_filter()


def _epochs(DataLoader, datapipe, epochs, seed_each_epoch=None, **kwargs):
    loader = DataLoader(datapipe, **kwargs)
    out = []
    for _ in range(epochs):
        if seed_each_epoch is not None:
            torch.manual_seed(seed_each_epoch)
        out.append([b.tolist() if hasattr(b, "tolist") else b for b in loader])
    return out


DP_LOADERS = [
    pytest.param(0, "process", False, id="no_workers"),
    pytest.param(2, "process", False, id="processes"),
    pytest.param(2, "process", True, id="persistent_processes"),
    pytest.param(2, "thread", False, id="threads"),
    pytest.param(2, "thread", True, id="persistent_threads"),
]


def _fl_kwargs(num_workers, mode, persistent):
    if num_workers == 0:
        return {}
    return dict(worker_mode=mode, persistent_workers=persistent)


@pytest.mark.parametrize("num_workers,mode,persistent", DP_LOADERS)
@pytest.mark.parametrize("batch_size", [None, 3])
def test_datapipe_shuffle_matches_torch(num_workers, mode, persistent, batch_size):
    """shuffle=True with a generator: per-epoch seeds from the generator,
    each worker's shard of the seeded shuffle -- torch's batches, epoch by
    epoch."""
    common = dict(shuffle=True, batch_size=batch_size, num_workers=num_workers)
    theirs = _epochs(tud.DataLoader, _shuffled_dp(), 3,
                     generator=torch.Generator().manual_seed(7),
                     persistent_workers=persistent, **common)
    ours = _epochs(fastload.DataLoader, _shuffled_dp(), 3,
                   generator=torch.Generator().manual_seed(7),
                   **_fl_kwargs(num_workers, mode, persistent), **common)
    assert ours == theirs
    assert theirs[0] != theirs[1]  # a new order each epoch
    flat = sorted(itertools.chain.from_iterable(
        b if isinstance(b, list) else [b] for b in ours[0]))
    assert flat == list(range(40))  # every element once: workers took disjoint shards


@pytest.mark.parametrize("num_workers,mode,persistent", DP_LOADERS)
def test_datapipe_shuffle_follows_global_seed_as_torch(num_workers, mode, persistent):
    common = dict(shuffle=True, batch_size=4, num_workers=num_workers)
    theirs = _epochs(tud.DataLoader, _shuffled_dp(), 2, seed_each_epoch=123,
                     persistent_workers=persistent, **common)
    ours = _epochs(fastload.DataLoader, _shuffled_dp(), 2, seed_each_epoch=123,
                   **_fl_kwargs(num_workers, mode, persistent), **common)
    assert ours == theirs
    assert ours[0] == ours[1]


@pytest.mark.parametrize("shuffle", [False, None])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_datapipe_shuffle_false_or_unspecified_as_torch(shuffle, num_workers):
    """shuffle=False switches the Shuffler off; None leaves it on, seeded by
    the loader all the same."""
    common = dict(shuffle=shuffle, batch_size=4, num_workers=num_workers)
    theirs = _epochs(tud.DataLoader, _shuffled_dp(), 2,
                     generator=torch.Generator().manual_seed(3), **common)
    ours = _epochs(fastload.DataLoader, _shuffled_dp(), 2,
                   generator=torch.Generator().manual_seed(3), **common)
    assert ours == theirs
    if shuffle is False:
        unsharded = [list(range(i, min(i + 4, 40))) for i in range(0, 40, 4)]
        assert num_workers or ours[0] == unsharded


def test_datapipe_without_shuffler_warns_as_torch():
    """torch warns that it appends a Shuffler, and its loader keeps the
    datapipe it was given: fastload gives the warning and the batches."""
    def run(DataLoader):
        with pytest.warns(UserWarning, match="does not contain a `Shuffler`"):
            loader = DataLoader(IterableWrapper(list(range(10))), shuffle=True, batch_size=4)
        return [b.tolist() for b in loader], type(loader.dataset)

    assert run(fastload.DataLoader) == run(tud.DataLoader)


def test_datapipe_loader_dataset_is_torchs_wrapper():
    datapipe = _shuffled_dp()
    ours = fastload.DataLoader(datapipe, shuffle=True)
    theirs = tud.DataLoader(datapipe, shuffle=True)
    assert type(ours.dataset) is type(theirs.dataset)
    assert ours.dataset._datapipe is datapipe


@pytest.mark.parametrize("num_workers,mode", [(0, "process"), (2, "process"), (2, "thread")])
def test_map_datapipe_as_torch(num_workers, mode):
    """A MapDataPipe is map-style: torch's wrapper, the sampler's order."""
    from torch.utils.data.datapipes.map import SequenceWrapper

    def run(DataLoader, **extra):
        loader = DataLoader(SequenceWrapper(list(range(20))), shuffle=True, batch_size=3,
                            num_workers=num_workers, generator=torch.Generator().manual_seed(1),
                            **extra)
        return [b.tolist() for b in loader], type(loader.dataset)

    extra = dict(worker_mode=mode) if num_workers else {}
    assert run(fastload.DataLoader, **extra) == run(tud.DataLoader)


def test_iterable_dataset_still_refuses_shuffle():
    with pytest.raises(ValueError, match="expected unspecified shuffle option"):
        fastload.DataLoader(SizedIterable(3, 3), shuffle=True)


def test_datapipe_resume_mid_epoch_gives_the_rest_of_the_epoch():
    kwargs = dict(shuffle=True, batch_size=4, generator=torch.Generator().manual_seed(9))
    full = [b.tolist() for b in fastload.DataLoader(_shuffled_dp(), **kwargs)]
    loader = fastload.DataLoader(_shuffled_dp(), shuffle=True, batch_size=4,
                                 generator=torch.Generator().manual_seed(9))
    it = iter(loader)
    head = [next(it).tolist() for _ in range(3)]
    state = loader.state_dict()
    resumed = fastload.DataLoader(_shuffled_dp(), shuffle=True, batch_size=4,
                                  generator=torch.Generator().manual_seed(1234))
    resumed.load_state_dict(state)
    assert head + [b.tolist() for b in resumed] == full


# torch's test_shuffler_iterdatapipe (test/test_dataloader.py), with
# fastload's DataLoader and worker threads as well as processes.  torch
# starts every worker process with "spawn"; here "fork" does for most
# (a spawned worker imports torch afresh: minutes on a busy machine), and
# "spawn" for one configuration.
@pytest.mark.parametrize("mode", ["process", "thread"])
def test_torch_shuffler_iterdatapipe(mode):
    exp = list(range(100))

    def _create_dp(buffer_size):
        input_ds = dp.iter.IterableWrapper(exp)
        return input_ds.shuffle(buffer_size=buffer_size).sharding_filter()

    for bs in (5, 20, 33):
        for num_workers, pw in itertools.product((0, 1, 2), (True, False)):
            if num_workers == 0 and (pw or mode == "thread"):
                continue
            shuffle_dp = _create_dp(bs)
            mp_ctx = None
            if num_workers > 0 and mode == "process":
                mp_ctx = "spawn" if (bs, num_workers, pw) == (5, 2, True) else "fork"
            extra = dict(worker_mode=mode) if num_workers > 0 else {}
            dl = fastload.DataLoader(shuffle_dp, num_workers=num_workers, shuffle=True,
                                     multiprocessing_context=mp_ctx, persistent_workers=pw,
                                     **extra)
            # No seed
            dl_res_ns = list(dl)
            assert sorted(dl_res_ns) == exp
            # Same seeds
            dl_res = []
            for _epoch in range(2):
                torch.manual_seed(123)
                dl_res.append(list(dl))
            assert dl_res[0] == dl_res[1]
            assert sorted(dl_res[0]) == exp
            # Different seeds
            torch.manual_seed(321)
            dl_res.append(list(dl))
            assert len(dl_res[0]) == len(dl_res[2])
            assert dl_res[0] != dl_res[2]
            assert sorted(dl_res[0]) == sorted(dl_res[2])
            if dl._iterator is not None:
                dl._iterator._shutdown()
                dl._iterator = None
            del dl


def row_processor(row):
    return np.add(row, 1)


def filter_len(row):
    return len(row) == 4


# torch's _test_multiprocessing_iterdatapipe (test/test_dataloader.py), with
# fastload's DataLoader: functions from module scope reach worker processes
# of every start method, with shuffle=True (on a graph without a Shuffler:
# torch's warning, which its test suite lets pass).
@pytest.mark.filterwarnings("ignore:`shuffle=True` was set, but the datapipe does not contain")
def test_torch_multiprocessing_iterdatapipe():
    import multiprocessing as mp

    reference = [torch.as_tensor([[2, 3, 4, 5]], dtype=torch.int64),
                 torch.as_tensor([[2, 3, 4, 5]], dtype=torch.int64)]
    datapipe = IterableWrapper([[1, 2, 3, 4], [1, 2, 3, 4, 5, 6]])
    datapipe = datapipe.map(row_processor)
    datapipe = datapipe.filter(filter_len)
    dl_common_args = dict(num_workers=2, batch_size=2, shuffle=True, pin_memory=False)
    # Every start method, by name and as a context, in the plain run.  The
    # sanitizer run (scripts/test.sh sets FASTLOAD_SANITIZER_RUN) takes the
    # default only: the others differ in Python's multiprocessing, not in
    # fastload's C (the same process workers and shared slots), and each
    # spawned worker there is an ASan interpreter importing torch (about 4 min).
    contexts = mp.get_all_start_methods() if not os.environ.get("FASTLOAD_SANITIZER_RUN") else []
    for ctx in [None] + contexts:
        got = [t.type(torch.int64) for t in
               fastload.DataLoader(datapipe, multiprocessing_context=ctx, **dl_common_args)]
        assert len(got) == len(reference)
        assert all(torch.equal(a, b) for a, b in zip(got, reference))
        if ctx is not None:
            ctx = mp.get_context(ctx)
            got = [t.type(torch.int64) for t in
                   fastload.DataLoader(datapipe, multiprocessing_context=ctx, **dl_common_args)]
            assert all(torch.equal(a, b) for a, b in zip(got, reference))


def test_datapipe_with_lambda_on_worker_threads():
    """A graph holding a lambda cannot be pickled; worker threads copy it
    without pickling."""
    datapipe = IterableWrapper(list(range(12))).map(lambda x: x * 10).sharding_filter()
    loader = fastload.DataLoader(datapipe, batch_size=2, num_workers=2, worker_mode="thread")
    got = sorted(itertools.chain.from_iterable(b.tolist() for b in loader))
    assert got == [x * 10 for x in range(12)]
