"""Samplers with torch's names, arguments, errors and random draws.

When torch is installed these consume a torch.Generator (or torch's global
RNG) with exactly torch's calls, so they give torch's order for a seed; they
also take a ``numpy.random.Generator`` and work without torch.
"""

import itertools
import math
from typing import Generic, TypeVar

import numpy as np

from .. import _random

T_co = TypeVar("T_co", covariant=True)


class Sampler(Generic[T_co]):
    """Base class: an iterable of dataset indices (or of index lists);
    generic in what it yields, as torch's (``Sampler[int]``)."""

    def __iter__(self):
        raise NotImplementedError


class SequentialSampler(Sampler):
    """0, 1, ..., len(data_source) - 1."""

    def __init__(self, data_source):
        self.data_source = data_source

    def __iter__(self):
        return iter(range(len(self.data_source)))

    def _index_chunks(self):
        """__iter__'s indices as int64 arrays (see BatchSampler._array_batches)."""
        yield np.arange(len(self.data_source), dtype=np.int64)

    def __len__(self):
        return len(self.data_source)


class RandomSampler(Sampler):
    """A random permutation each pass, or ``num_samples`` draws with
    replacement."""

    def __init__(self, data_source, replacement=False, num_samples=None, generator=None):
        self.data_source = data_source
        self.replacement = replacement
        self._num_samples = num_samples
        self.generator = generator
        if not isinstance(self.replacement, bool):
            raise TypeError(
                f"replacement should be a boolean value, but got replacement={self.replacement}"
            )
        if not isinstance(self.num_samples, int) or self.num_samples <= 0:
            raise ValueError(
                f"num_samples should be a positive integer value, but got num_samples={self.num_samples}"
            )

    @property
    def num_samples(self):
        if self._num_samples is None:
            return len(self.data_source)
        return self._num_samples

    def __iter__(self):
        for chunk in self._index_chunks():
            yield from chunk.tolist()

    def _index_chunks(self):
        """The indices as int64 arrays, drawn lazily one chunk at a time
        exactly as torch draws them."""
        n = len(self.data_source)
        generator = self.generator
        if generator is None:
            generator = _random.fresh_generator(None)
        if self.replacement:
            # torch draws in chunks of 32; matching the chunks matches its stream.
            for _ in range(self.num_samples // 32):
                yield _random.randint_array(n, 32, generator)
            yield _random.randint_array(n, self.num_samples % 32, generator)
        else:
            for _ in range(self.num_samples // n):
                yield _random.randperm_array(n, generator)
            yield _random.randperm_array(n, generator)[: self.num_samples % n]

    def __len__(self):
        return self.num_samples


class SubsetRandomSampler(Sampler):
    """The given indices in a random order."""

    def __init__(self, indices, generator=None):
        self.indices = indices
        self.generator = generator

    def __iter__(self):
        for i in _random.randperm(len(self.indices), self.generator):
            yield self.indices[i]

    def __len__(self):
        return len(self.indices)


class WeightedRandomSampler(Sampler):
    """``num_samples`` indices drawn with probability proportional to
    ``weights``."""

    def __init__(self, weights, num_samples, replacement=True, generator=None):
        if not isinstance(num_samples, int) or isinstance(num_samples, bool) or num_samples <= 0:
            raise ValueError(
                f"num_samples should be a positive integer value, but got num_samples={num_samples}"
            )
        if not isinstance(replacement, bool):
            raise ValueError(
                f"replacement should be a boolean value, but got replacement={replacement}"
            )
        weights = _as_float64_vector(weights)
        self.weights = weights
        self.num_samples = num_samples
        self.replacement = replacement
        self.generator = generator

    def __iter__(self):
        yield from _random.multinomial(
            self.weights, self.num_samples, self.replacement, self.generator
        )

    def __len__(self):
        return self.num_samples


def _as_float64_vector(weights):
    from .._torch import torch

    if torch is not None:
        w = torch.as_tensor(weights, dtype=torch.double)
    else:
        import numpy as np

        w = np.asarray(weights, dtype=np.float64)
    if len(w.shape) != 1:
        raise ValueError(
            f"weights should be a 1d sequence but given weights have shape {tuple(w.shape)}"
        )
    return w


class BatchSampler(Sampler):
    """Groups another sampler's indices into lists of ``batch_size``."""

    def __init__(self, sampler, batch_size, drop_last):
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size <= 0:
            raise ValueError(
                f"batch_size should be a positive integer value, but got batch_size={batch_size}"
            )
        if not isinstance(drop_last, bool):
            raise ValueError(f"drop_last should be a boolean value, but got drop_last={drop_last}")
        self.sampler = sampler
        self.batch_size = batch_size
        self.drop_last = drop_last

    def __iter__(self):
        it = iter(self.sampler)
        if self.drop_last:
            for batch in zip(*([it] * self.batch_size)):
                yield list(batch)
        else:
            batch = list(itertools.islice(it, self.batch_size))
            while batch:
                yield batch
                batch = list(itertools.islice(it, self.batch_size))

    def _array_batches(self):
        """The batches __iter__ yields, as int64 arrays, with the same
        random draws; None when the sampler is not one of fastload's own
        (whose draws are known).  Native datasets take these: no Python int
        per index."""
        if type(self) is not BatchSampler or type(self.sampler) not in (RandomSampler,
                                                                         SequentialSampler):
            return None
        return _batches_of(self.sampler._index_chunks(), self.batch_size, self.drop_last)

    def __len__(self):
        if self.drop_last:
            return len(self.sampler) // self.batch_size
        return (len(self.sampler) + self.batch_size - 1) // self.batch_size


def _batches_of(chunks, size, drop_last):
    pending = np.empty(0, dtype=np.int64)
    for chunk in chunks:
        pending = np.concatenate((pending, chunk)) if len(pending) else chunk
        start = 0
        while len(pending) - start >= size:
            yield pending[start:start + size]
            start += size
        pending = pending[start:]
    if len(pending) and not drop_last:
        yield pending


class DistributedSampler(Sampler):
    """This replica's share of the dataset (``rank`` of ``num_replicas``),
    shuffled with ``seed + epoch`` (call ``set_epoch`` each epoch), padded
    by repetition or trimmed (``drop_last``) to equal shares."""

    def __init__(self, dataset, num_replicas=None, rank=None, shuffle=True, seed=0, drop_last=False):
        if num_replicas is None:
            num_replicas = _distributed("get_world_size")
        if rank is None:
            rank = _distributed("get_rank")
        if rank >= num_replicas or rank < 0:
            raise ValueError(f"Invalid rank {rank}, rank should be in the interval [0, {num_replicas - 1}]")
        self.dataset = dataset
        self.num_replicas = num_replicas
        self.rank = rank
        self.epoch = 0
        self.drop_last = drop_last
        if self.drop_last and len(self.dataset) % self.num_replicas != 0:
            self.num_samples = math.ceil((len(self.dataset) - self.num_replicas) / self.num_replicas)
        else:
            self.num_samples = math.ceil(len(self.dataset) / self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas
        self.shuffle = shuffle
        self.seed = seed

    def __iter__(self):
        n = len(self.dataset)
        if self.shuffle:
            indices = _random.randperm(n, _random.manual_generator(self.seed + self.epoch))
        else:
            indices = list(range(n))
        if not self.drop_last:
            padding = self.total_size - len(indices)
            if padding <= len(indices):
                indices += indices[:padding]
            else:
                indices += (indices * math.ceil(padding / len(indices)))[:padding]
        else:
            indices = indices[: self.total_size]
        return iter(indices[self.rank : self.total_size : self.num_replicas])

    def __len__(self):
        return self.num_samples

    def set_epoch(self, epoch):
        """Sets the epoch, so each epoch shuffles differently (same on every replica)."""
        self.epoch = epoch


def _distributed(query):
    from .._torch import torch

    if torch is None or not torch.distributed.is_available():
        raise RuntimeError("Requires distributed package to be available")
    return getattr(torch.distributed, query)()
