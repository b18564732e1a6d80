"""fastload's sampler classes produce exactly torch's indices for the same RNG
state (explicit torch.Generator or the global RNG) and consume it identically;
they also accept numpy.random.Generator (fastload-only)."""

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")

import torch.utils.data as tud  # noqa: E402

import fastload  # noqa: E402
from fl_helpers import fastload_only  # noqa: E402


class Sized:
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i


def _g(seed):
    return torch.Generator().manual_seed(seed)


def _compare(make, epochs=3, global_seed=None):
    """make(lib, generator_or_None) -> sampler. Iterates each sampler ``epochs``
    times and compares indices, len() and the generator state afterwards."""
    results, states, lens = [], [], []
    for lib in (tud, fastload):
        if global_seed is not None:
            torch.manual_seed(global_seed)
            g = None
        else:
            g = _g(1234)
        sampler = make(lib, g)
        lens.append(len(sampler) if hasattr(type(sampler), "__len__") else None)
        results.append([list(sampler) for _ in range(epochs)])
        states.append(torch.get_rng_state() if g is None else g.get_state())
    (t_res, f_res), (t_state, f_state) = results, states
    assert f_res == t_res
    flat = [j for ep in f_res for i in ep for j in (i if isinstance(i, list) else [i])]
    assert all(type(j) is int for j in flat), "indices must be python ints"
    assert torch.equal(f_state, t_state), "RNG consumed differently"
    assert lens[0] == lens[1]
    return t_res


@pytest.mark.parametrize("n", [1, 10, 100])
@pytest.mark.parametrize("replacement,num_samples", [
    (False, None), (False, 5), (False, 250), (True, None), (True, 31), (True, 32), (True, 70)])
@pytest.mark.parametrize("rng", ["generator", "global"])
def test_random_sampler(n, replacement, num_samples, rng):
    res = _compare(lambda lib, g: lib.RandomSampler(Sized(n), replacement=replacement,
                                                    num_samples=num_samples, generator=g),
                   global_seed=7 if rng == "global" else None)
    expected_len = n if num_samples is None else num_samples
    assert all(len(ep) == expected_len for ep in res)
    if n == 100 and not replacement and num_samples is None:
        assert res[0] != res[1]


@pytest.mark.parametrize("rng", ["generator", "global"])
def test_subset_random_sampler(rng):
    indices = [10, 3, 7, 7, 99, 0, 5]
    res = _compare(lambda lib, g: lib.SubsetRandomSampler(indices, generator=g),
                   global_seed=3 if rng == "global" else None)
    assert sorted(res[0]) == sorted(indices)


@pytest.mark.parametrize("weights", [
    pytest.param([0.1, 0.9, 0.4, 0.7, 3.0, 0.6], id="list"),
    pytest.param((1, 2, 3, 4), id="tuple_int"),
    pytest.param(np.linspace(0.5, 2.0, 17), id="ndarray"),
    pytest.param(torch.tensor([0.0, 1.0, 0.0, 2.0, 5.0], dtype=torch.float32), id="tensor_with_zeros"),
])
@pytest.mark.parametrize("replacement", [True, False])
@pytest.mark.parametrize("rng", ["generator", "global"])
def test_weighted_random_sampler(weights, replacement, rng):
    n_nonzero = int((torch.as_tensor(weights) > 0).sum())
    k = n_nonzero if not replacement else 40
    res = _compare(lambda lib, g: lib.WeightedRandomSampler(weights, k, replacement=replacement, generator=g),
                   global_seed=11 if rng == "global" else None)
    assert len(res[0]) == k


def test_sequential_sampler():
    assert list(fastload.SequentialSampler(Sized(5))) == [0, 1, 2, 3, 4]
    assert len(fastload.SequentialSampler(range(7))) == 7
    assert list(fastload.SequentialSampler(Sized(0))) == []


@pytest.mark.parametrize("batch_size", [1, 3, 4, 10])
@pytest.mark.parametrize("drop_last", [False, True])
def test_batch_sampler(batch_size, drop_last):
    for make_inner in (lambda lib: lib.SequentialSampler(Sized(10)), lambda lib: [9, 8, 7, 1, 2, 3, 5]):
        t = tud.BatchSampler(make_inner(tud), batch_size, drop_last)
        f = fastload.BatchSampler(make_inner(fastload), batch_size, drop_last)
        assert list(f) == list(t)
        assert len(f) == len(t)
        assert all(type(b) is list for b in f)


def test_batch_sampler_over_random_sampler_shares_generator():
    _compare(lambda lib, g: lib.BatchSampler(lib.RandomSampler(Sized(23), generator=g), 4, False))


@pytest.mark.parametrize("n", [10, 11])
@pytest.mark.parametrize("num_replicas,rank", [(1, 0), (3, 0), (3, 2), (4, 3)])
@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("drop_last", [False, True])
def test_distributed_sampler(n, num_replicas, rank, shuffle, drop_last):
    samplers = [lib.DistributedSampler(Sized(n), num_replicas=num_replicas, rank=rank, shuffle=shuffle,
                                       seed=17, drop_last=drop_last) for lib in (tud, fastload)]
    for epoch in (0, 0, 1, 5):
        for s in samplers:
            s.set_epoch(epoch)
        t_idx, f_idx = (list(s) for s in samplers)
        assert f_idx == t_idx
        assert len(samplers[1]) == len(samplers[0]) == len(t_idx)
    # covers everything (no drop_last) / disjoint across ranks
    if not drop_last:
        all_idx = set()
        for r in range(num_replicas):
            all_idx |= set(fastload.DistributedSampler(Sized(n), num_replicas=num_replicas, rank=r,
                                                       shuffle=shuffle, seed=17))
        assert all_idx == set(range(n))


def test_distributed_sampler_epochs_differ_and_do_not_touch_global_rng():
    torch.manual_seed(0)
    state = torch.get_rng_state()
    s = fastload.DistributedSampler(Sized(50), num_replicas=2, rank=1, shuffle=True)
    s.set_epoch(0)
    a = list(s)
    s.set_epoch(1)
    b = list(s)
    assert a != b and len(a) == len(b) == 25
    assert torch.equal(torch.get_rng_state(), state)


def test_samplers_are_sampler_instances():
    ds = Sized(4)
    for s in (fastload.SequentialSampler(ds), fastload.RandomSampler(ds), fastload.SubsetRandomSampler([1]),
              fastload.WeightedRandomSampler([1.0], 1), fastload.BatchSampler([0], 1, False),
              fastload.DistributedSampler(ds, num_replicas=1, rank=0)):
        assert isinstance(s, fastload.Sampler)


def test_torch_sampler_subclass_still_works_with_fastload_loader():
    class Reverse(tud.Sampler):
        def __init__(self, n):
            self.n = n

        def __iter__(self):
            return iter(range(self.n - 1, -1, -1))

        def __len__(self):
            return self.n

    out = list(fastload.DataLoader(Sized(5), batch_size=2, sampler=Reverse(5)))
    assert [b.tolist() for b in out] == [[4, 3], [2, 1], [0]]


# --------------------------------------------------------------------------
# numpy.random.Generator (fastload-only)
# --------------------------------------------------------------------------

@fastload_only
def test_random_sampler_numpy_generator():
    a = list(fastload.RandomSampler(Sized(50), generator=np.random.default_rng(3)))
    b = list(fastload.RandomSampler(Sized(50), generator=np.random.default_rng(3)))
    c = list(fastload.RandomSampler(Sized(50), generator=np.random.default_rng(4)))
    assert sorted(a) == list(range(50))
    assert a == b
    assert a != c
    assert all(type(i) is int for i in a)
    # the generator is advanced: a second pass gives a new permutation
    s = fastload.RandomSampler(Sized(50), generator=np.random.default_rng(3))
    first, second = list(s), list(s)
    assert first == a and second != first and sorted(second) == list(range(50))


@fastload_only
def test_random_sampler_numpy_generator_replacement_and_num_samples():
    s = fastload.RandomSampler(Sized(7), replacement=True, num_samples=100,
                               generator=np.random.default_rng(0))
    idx = list(s)
    assert len(idx) == 100 == len(s)
    assert set(idx) <= set(range(7)) and len(set(idx)) > 1
    s = fastload.RandomSampler(Sized(7), num_samples=16, generator=np.random.default_rng(0))
    idx = list(s)
    assert len(idx) == 16 and set(idx) == set(range(7))


@fastload_only
def test_subset_and_weighted_samplers_numpy_generator():
    idx = list(fastload.SubsetRandomSampler([5, 9, 2, 2], generator=np.random.default_rng(1)))
    assert sorted(idx) == [2, 2, 5, 9]
    w = [0.0, 1.0, 0.0, 3.0, 2.0]
    draws = list(fastload.WeightedRandomSampler(w, 200, replacement=True, generator=np.random.default_rng(2)))
    assert len(draws) == 200 and set(draws) <= {1, 3, 4} and {1, 3, 4} <= set(draws)
    draws = list(fastload.WeightedRandomSampler(w, 3, replacement=False, generator=np.random.default_rng(2)))
    assert sorted(draws) == [1, 3, 4]
    again = list(fastload.WeightedRandomSampler(w, 3, replacement=False, generator=np.random.default_rng(2)))
    assert draws == again


@fastload_only
def test_dataloader_with_numpy_generator_sampler():
    ds = Sized(12)
    loader = fastload.DataLoader(ds, batch_size=4, num_workers=2,
                                 sampler=fastload.RandomSampler(ds, generator=np.random.default_rng(5)))
    batches = [b.tolist() for b in loader]
    assert sorted(i for b in batches for i in b) == list(range(12))
    assert [len(b) for b in batches] == [4, 4, 4]
