"""Weighted mixing of sources: MixDataset and MixSampler."""

import collections

import numpy as np
import pytest

import fastload

torch = pytest.importorskip("torch")


class Numbers(fastload.Dataset):
    """Samples that say where they come from: (source tag, local index)."""

    def __init__(self, tag, n):
        self.tag, self.n = tag, n

    def __len__(self):
        return self.n

    def __getitem__(self, index):
        if not 0 <= index < self.n:
            raise IndexError(index)
        return np.int64(self.tag * 1000 + index)


def make_mix(sizes=(50, 30, 20)):
    return fastload.MixDataset({name: Numbers(tag, n) for tag, (name, n)
                                in enumerate(zip(("web", "code", "books"), sizes))})


def test_the_mix_is_its_sources_under_one_index():
    mix = make_mix()
    assert len(mix) == 100 and mix.names == ["web", "code", "books"]
    assert [int(mix[i]) for i in (0, 49, 50, 79, 80, 99, -1)] == [0, 49, 1000, 1029, 2000,
                                                                     2019, 2019]
    assert [mix.source_of(i) for i in (0, 50, 99)] == ["web", "code", "books"]
    with pytest.raises(IndexError):
        mix[100]
    assert fastload.MixDataset([Numbers(0, 3), Numbers(1, 2)]).names == ["0", "1"]


@pytest.mark.parametrize("shuffle", [True, False])
def test_each_source_gets_its_weights_share(shuffle):
    mix = make_mix()
    sampler = fastload.MixSampler(mix, {"web": 0.7, "code": 0.2, "books": 0.1},
                                  num_samples=1000, shuffle=shuffle, seed=4)
    indices = list(sampler)
    assert len(indices) == len(sampler) == 1000
    sources = collections.Counter(mix.source_of(i) for i in indices)
    assert sources == {"web": 700, "code": 200, "books": 100}
    assert sampler.source_counts() == dict(sources)
    # Up-sampled without replacement: every sample of a source as often as
    # any other, give or take one (web: 700 of 50 samples, 14 times each).
    for name, lo in (("web", 0), ("code", 50), ("books", 80)):
        seen = collections.Counter(i for i in indices if mix.source_of(i) == name)
        size = len(mix.datasets[mix.names.index(name)])
        assert set(seen) == set(range(lo, lo + size))
        assert max(seen.values()) - min(seen.values()) <= 1
    # Down-sampled: each sample at most once.
    small = list(fastload.MixSampler(mix, [1, 1, 1], num_samples=30, seed=1))
    assert len(small) == len(set(small)) == 30
    if not shuffle:  # evenly spread: every window of 10 holds 7 web, 2 code, 1 books
        for start in range(0, 1000, 10):
            window = collections.Counter(mix.source_of(i) for i in indices[start:start + 10])
            assert window == {"web": 7, "code": 2, "books": 1}, (start, window)


def test_quotas_sum_exactly_by_largest_remainder():
    mix = make_mix()
    sampler = fastload.MixSampler(mix, [1, 1, 1], num_samples=100)
    assert sampler.quotas == [34, 33, 33] and sum(sampler.quotas) == 100
    assert fastload.MixSampler(mix, {"web": 1, "code": 0, "books": 0}).quotas == [100, 0, 0]


def test_draws_with_replacement_follow_the_weights():
    mix = make_mix()
    sampler = fastload.MixSampler(mix, [0.5, 0.3, 0.2], num_samples=20000, replacement=True)
    indices = np.fromiter(sampler, np.int64)
    web = indices[indices < 50]
    assert len(web) == 10000
    # Uniform draws over the source's 50 samples: each count near 200.
    counts = np.bincount(web, minlength=50)
    chi2 = float(((counts - 200.0) ** 2 / 200.0).sum())
    assert chi2 < 100  # 49 degrees of freedom: p < 1e-4 above this


def test_an_epoch_is_keyed_by_seed_and_epoch():
    mix = make_mix()

    def epoch(seed, number):
        sampler = fastload.MixSampler(mix, [0.6, 0.3, 0.1], seed=seed)
        sampler.set_epoch(number)
        return list(sampler)

    assert epoch(1, 0) == epoch(1, 0)
    assert epoch(1, 0) != epoch(1, 1) and epoch(1, 0) != epoch(2, 0)


def test_batches_do_not_depend_on_workers_and_resume_exactly():
    mix = make_mix()

    def loader(workers):
        sampler = fastload.MixSampler(mix, [0.6, 0.3, 0.1], num_samples=90, seed=3)
        return fastload.DataLoader(mix, batch_size=8, sampler=sampler, num_workers=workers)

    full = [b.tolist() for b in loader(0)]
    for workers in (2,):
        assert [b.tolist() for b in loader(workers)] == full
    first = loader(2)
    it = iter(first)
    head = [next(it).tolist() for _ in range(4)]
    state = first.state_dict()
    resumed = loader(0)
    resumed.load_state_dict(state)
    assert head + [b.tolist() for b in resumed] == full


def test_stats_count_the_samples_of_each_source_handed_out():
    mix = make_mix()
    sampler = fastload.MixSampler(mix, [0.6, 0.3, 0.1], num_samples=90, seed=5)
    loader = fastload.DataLoader(mix, batch_size=8, sampler=sampler, num_workers=2)
    assert loader.stats().sources == {"web": 0, "code": 0, "books": 0}
    it = iter(loader)
    seen = collections.Counter()
    for _ in range(5):
        seen.update(["web", "code", "books"][int(v) // 1000] for v in next(it))
    report = loader.stats()
    assert report.sources == dict(seen) and sum(seen.values()) == 40
    assert report.as_dict()["sources"] == dict(seen)
    assert "sources this epoch: web" in str(report)
    for _ in it:
        pass
    assert loader.stats().sources == {"web": 54, "code": 27, "books": 9}
    plain = fastload.DataLoader(mix, batch_size=8)
    assert plain.stats().sources is None and "sources" not in str(plain.stats())


def test_a_source_can_keep_its_own_order():
    """A source with a sampler of its own (a ShardSampler for a shard set)
    gives its samples in that sampler's order."""
    mix = make_mix()
    books = fastload.SequentialSampler(range(20))
    sampler = fastload.MixSampler(mix, {"web": 2, "code": 1, "books": 1}, num_samples=80,
                                  samplers={"books": books})
    indices = list(sampler)
    assert [i - 80 for i in indices if i >= 80] == list(range(20))
    webs = [i for i in indices if i < 50]
    assert len(webs) == len(set(webs)) == 40  # a permutation's first 40: no repeats


@pytest.mark.parametrize("bad, match", [
    (dict(weights=[1, 1]), "2 weights for 3 sources"),
    (dict(weights={"web": 1, "news": 1}), "news"),
    (dict(weights={"web": 1}), "no weight for source code, books"),
    (dict(weights=[1, -1, 1]), ">= 0"),
    (dict(weights=[0, 0, 0]), "not all 0"),
    (dict(weights=[1, 1, 1], num_samples=-1), "num_samples"),
])
def test_bad_arguments_are_named(bad, match):
    with pytest.raises(ValueError, match=match):
        fastload.MixSampler(make_mix(), **bad)
    with pytest.raises(TypeError, match="MixDataset"):
        fastload.MixSampler(Numbers(0, 3), [1])
    with pytest.raises(ValueError, match="source empty is empty"):
        fastload.MixSampler(fastload.MixDataset({"full": Numbers(0, 3), "empty": Numbers(1, 0)}),
                            [1, 1])


def test_a_batch_is_fetched_with_one_call_per_source():
    calls = []

    class Batched(Numbers):
        def __getitems__(self, indices):
            calls.append((self.tag, list(indices)))
            return [self[i] for i in indices]

    mix = fastload.MixDataset({"a": Batched(0, 10), "b": Numbers(1, 10), "c": Batched(2, 10)})
    assert [int(v) for v in mix.__getitems__([12, 3, 25, 4, 11])] == [1002, 3, 2005, 4, 1001]
    assert calls == [(0, [3, 4]), (2, [5])]
    sampler = fastload.MixSampler(mix, [1, 1, 1], seed=2)
    batches = [b.tolist() for b in fastload.DataLoader(mix, batch_size=6, sampler=sampler)]
    expected = [int(mix[i]) for i in sampler]
    assert sum(batches, []) == expected
