"""Weighted mixing of several sources: ``MixDataset`` and ``MixSampler``.

LLM pre-training draws from several corpora in fixed proportions (web crawl
70 %, code 20 %, books 10 %), as MosaicML's streams with proportions,
litdata's ``CombinedStreamingDataset``, webdataset's ``RandomMix`` and
Grain's mixing do.  Here that is a dataset and a sampler, so the rest is
the loader's (workers, the batch path, ``state_dict()``):

* ``MixDataset`` is the sources side by side under one index (source k's
  sample i is index ``offsets[k] + i``), each with a name;
* ``MixSampler`` decides an epoch of ``num_samples`` indices: each source's
  quota is its weight's share (rounded by largest remainder, so the quotas
  sum exactly and the per-source counts are the weights' up to one
  sample), filled from its own order (a permutation of the source, again
  and again when the quota is larger; draws with replacement; or a sampler
  of its own, such as a ``ShardSampler`` that keeps a shard set's streaming
  order and splits it between ranks), and the sources interleaved in a
  random order.  Every draw is keyed by (seed, epoch), so the epoch does not
  depend on ``num_workers`` and a loader resumes it exactly by replaying it.

``loader.stats().sources`` counts the samples of each source handed out in
the current epoch (``MixSampler.source_counts``).
"""

import time

import numpy as np

from ..loader.sampler import Sampler
from .base import Dataset
from .indexing import check_index

__all__ = ["MixDataset", "MixSampler"]


class MixDataset(Dataset):
    """Several map-style datasets as one, each a named source.

    ``MixDataset(sources)``: a dict ``{name: dataset}`` (or a list, named
    "0", "1", ...).  Sample ``offsets[k] + i`` is source k's sample i;
    ``source_of(index)`` names its source.  Draw from it by weight with
    ``MixSampler``.
    """

    def __init__(self, sources):
        if not isinstance(sources, dict):
            sources = {str(k): dataset for k, dataset in enumerate(sources)}
        if not sources:
            raise ValueError("MixDataset needs at least one source")
        self.names = [str(name) for name in sources]
        self.datasets = list(sources.values())
        sizes = [len(dataset) for dataset in self.datasets]
        self.offsets = np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)

    def __len__(self):
        return int(self.offsets[-1])

    def _locate(self, index):
        index = check_index(index, len(self))
        k = int(np.searchsorted(self.offsets, index, side="right") - 1)
        return k, index - int(self.offsets[k])

    def __getitem__(self, index):
        k, local = self._locate(index)
        return self.datasets[k][local]

    def __getitems__(self, indices):
        """A batch of samples: each source's part fetched with one call of its
        own ``__getitems__`` where it has one (an ArrayDataset's row gather),
        then put back in the batch's order."""
        located = [self._locate(i) for i in indices]
        out = [None] * len(located)
        for k, dataset in enumerate(self.datasets):
            where = [j for j, (source, _) in enumerate(located) if source == k]
            if not where:
                continue
            local = [located[j][1] for j in where]
            getitems = getattr(dataset, "__getitems__", None)
            samples = getitems(local) if getitems is not None else [dataset[i] for i in local]
            for j, sample in zip(where, samples):
                out[j] = sample
        return out

    def _fetch(self, indices, timeout=None):
        """Brings the samples ``indices`` onto the node where a source must
        (a ``WebDataset`` over URLs: its shards into the node cache), by
        that source's own ``_fetch`` with its local indices (the
        native-source protocol, fastload.datasets.native).  The loader calls
        it where the indices are drawn, so worker processes, which cannot
        download, read what their parent fetched.  ``timeout``: for all the
        sources together."""
        fetchers = [getattr(dataset, "_fetch", None) for dataset in self.datasets]
        if not any(fetchers):
            return
        n = len(self)
        indices = np.asarray(indices, np.int64).ravel()
        indices = np.where(indices < 0, indices + n, indices)
        indices = indices[(indices >= 0) & (indices < n)]  # the others fail in __getitem__
        sources = np.searchsorted(self.offsets, indices, side="right") - 1
        deadline = None if not timeout else time.monotonic() + timeout
        for k, fetch in enumerate(fetchers):
            local = indices[sources == k] - self.offsets[k]
            if fetch is None or not len(local):
                continue
            if deadline is None:
                fetch(local)
            else:  # time left, or next to none: what is cached still pins
                fetch(local, timeout=max(deadline - time.monotonic(), 1e-6))

    def source_of(self, index):
        """The name of the source sample ``index`` comes from."""
        return self.names[self._locate(index)[0]]

    def __repr__(self):
        sizes = np.diff(self.offsets)
        parts = ", ".join(f"{name}: {int(n)}" for name, n in zip(self.names, sizes))
        return f"MixDataset({parts})"


class MixSampler(Sampler):
    """Indices of a ``MixDataset`` drawn from its sources by weight.

    ``MixSampler(mix, weights, num_samples=None, *, replacement=False,
    shuffle=True, seed=0, samplers=None)``

    ``weights``: one per source, a dict by name or a sequence (relative:
    they need not sum to 1).  ``num_samples``: the epoch's length (default:
    the sources' lengths summed).  Source k's quota is its weight's share
    of ``num_samples``, rounded by largest remainder.  It is filled from:

    * ``samplers[k]`` when given (a dict by name or a sequence; None for a
      source keeps the default below): that sampler's indices into the
      source, in its order, iterated again when the quota is longer (its
      ``set_epoch`` is called with the mix's epoch); a ``ShardSampler``
      keeps a shard set's streaming order and splits it between ranks;
    * else, without ``replacement`` (default), permutations of the source
      one after another (each sample once while the quota allows, then
      again: up-sampling), in order with ``shuffle=False``;
    * with ``replacement``, independent draws.

    The sources are then interleaved: in a random order (``shuffle``), else
    evenly spread by weight.  Every draw is keyed by (seed, epoch)
    (``set_epoch``, as ``DistributedSampler``).
    """

    def __init__(self, mix, weights, num_samples=None, *, replacement=False, shuffle=True,
                 seed=0, samplers=None):
        if not isinstance(mix, MixDataset):
            raise TypeError(f"MixSampler needs a fastload.MixDataset, got {type(mix).__name__}")
        self.mix = mix
        self.weights = _per_source(mix, weights, "weights")
        if any(w is None for w in self.weights):
            missing = [n for n, w in zip(mix.names, self.weights) if w is None]
            raise ValueError(f"MixSampler: no weight for source {', '.join(missing)}")
        weights = np.asarray(self.weights, dtype=np.float64)
        if not np.isfinite(weights).all() or (weights < 0).any() or weights.sum() <= 0:
            raise ValueError(f"MixSampler: weights must be finite, >= 0 and not all 0, got "
                             f"{self.weights}")
        self.samplers = _per_source(mix, samplers, "samplers") if samplers is not None else \
            [None] * len(mix.names)
        sizes = [len(s) if s is not None else len(d)
                 for s, d in zip(self.samplers, mix.datasets)]
        if num_samples is None:
            num_samples = sum(sizes)
        if not isinstance(num_samples, (int, np.integer)) or num_samples < 0:
            raise ValueError(f"num_samples should be an integer >= 0, got {num_samples!r}")
        self.num_samples = int(num_samples)
        self.quotas = _largest_remainder(weights / weights.sum(), self.num_samples)
        for name, quota, size in zip(mix.names, self.quotas, sizes):
            if quota and not size:
                raise ValueError(f"MixSampler: source {name} is empty but its weight asks "
                                 f"for {quota} samples")
        self.replacement = bool(replacement)
        self.shuffle = bool(shuffle)
        self.seed = seed
        self.epoch = 0
        self._epoch_of = None  # (epoch, its indices, their sources) last drawn

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __len__(self):
        return self.num_samples

    def __iter__(self):
        indices, _ = self._draw()
        return iter(indices.tolist())

    def source_counts(self, n=None):
        """``{name: count}`` of the sources of this epoch's first ``n``
        indices (default: all of them)."""
        _, sources = self._draw()
        counts = np.bincount(sources[:n], minlength=len(self.mix.names))
        return {name: int(c) for name, c in zip(self.mix.names, counts)}

    def _draw(self):
        """This epoch's (indices, source of each), drawn once per epoch."""
        if self._epoch_of is not None and self._epoch_of[0] == self.epoch:
            return self._epoch_of[1:]
        rng = np.random.default_rng([self.seed, self.epoch, 0])
        parts = [self._fill(k, quota, np.random.default_rng([self.seed, self.epoch, 1 + k]))
                 for k, quota in enumerate(self.quotas)]
        sources = np.repeat(np.arange(len(parts)), self.quotas)
        if self.shuffle:
            sources = rng.permutation(sources)
        elif self.num_samples:  # evenly spread: source's j-th sample at (j + 1/2) / quota
            where = np.concatenate([(np.arange(q) + 0.5) / q for q in self.quotas if q])
            sources = sources[np.argsort(where, kind="stable")]
        indices = np.empty(self.num_samples, np.int64)
        for k, part in enumerate(parts):  # each source's samples in their own order
            indices[sources == k] = part + self.mix.offsets[k]
        self._epoch_of = (self.epoch, indices, sources)
        return indices, sources

    def _fill(self, k, quota, rng):
        """Source k's ``quota`` local indices for this epoch, in order."""
        sampler, size = self.samplers[k], len(self.mix.datasets[k])
        if sampler is not None:
            if hasattr(sampler, "set_epoch"):
                sampler.set_epoch(self.epoch)
            out = []
            while len(out) < quota:
                before = len(out)
                out.extend(int(i) for i, _ in zip(sampler, range(quota - len(out))))
                if len(out) == before:
                    raise ValueError(f"MixSampler: the sampler of source {self.mix.names[k]} "
                                     "yields nothing")
            return np.asarray(out, dtype=np.int64)
        if self.replacement:
            return rng.integers(size, size=quota, dtype=np.int64)
        passes = -(-quota // size) if quota else 0
        order = [rng.permutation(size) if self.shuffle else np.arange(size)
                 for _ in range(passes)]
        return np.concatenate(order)[:quota] if order else np.empty(0, np.int64)

    def __repr__(self):
        parts = ", ".join(f"{n}: {q}" for n, q in zip(self.mix.names, self.quotas))
        return f"MixSampler({parts} of {self.num_samples})"


def _per_source(mix, values, what):
    """One value per source, from a dict by name or a sequence."""
    if isinstance(values, dict):
        unknown = set(map(str, values)) - set(mix.names)
        if unknown:
            raise ValueError(f"MixSampler: {what} name no source: {', '.join(sorted(unknown))} "
                             f"(the sources are {', '.join(mix.names)})")
        named = {str(k): v for k, v in values.items()}
        return [named.get(name) for name in mix.names]
    values = list(values)
    if len(values) != len(mix.names):
        raise ValueError(f"MixSampler: {len(values)} {what} for {len(mix.names)} sources")
    return values


def _largest_remainder(shares, total):
    """Integer parts of ``shares * total`` summing to ``total``: the floors,
    plus one for the largest remainders."""
    exact = shares * total
    out = np.floor(exact).astype(np.int64)
    extra = total - int(out.sum())
    if extra:
        out[np.argsort(-(exact - out), kind="stable")[:extra]] += 1
    return out.tolist()
