"""ChunkShuffleSampler: a random order that keeps batches within few chunks.

Chunked, compressed storage (Zarr, chunked HDF5) decodes a whole chunk to
read one of its rows, so a uniformly random batch of B rows decodes about B
chunks.  The usual remedy is to shuffle blocks of chunks: the chunks are put
in a random order, cut into blocks of ``block`` chunks, and the rows of each
block shuffled among themselves.  A batch then draws from one or two blocks
(``2 * block`` chunks at most while a batch is no larger than a block),
every row still comes once an epoch, and which rows meet in a batch changes
with the epoch.
"""

import math

import numpy as np

from .sampler import Sampler

__all__ = ["ChunkShuffleSampler"]


class ChunkShuffleSampler(Sampler):
    """Every index of ``dataset`` (or of ``range(n)`` for an int) once an
    epoch, in random blocks of ``block`` chunks of ``chunk_rows`` rows.

    With ``shuffle=True`` the order of the chunks and of the rows within
    each block is drawn from ``(seed, epoch)``: call ``set_epoch`` each
    epoch, as with ``DistributedSampler``.  ``shuffle=False`` gives
    ``0 .. n-1``.  For a Zarr array ``chunk_rows`` is ``array.chunks[0]``.

    ``num_replicas``/``rank`` (default: torch.distributed's when it is
    initialized, else 1 and 0) split the epoch's order into equal
    contiguous shares, one a replica, so each replica reads its own blocks;
    as ``DistributedSampler`` does, the order is padded by repeating its
    start, or with ``drop_last`` trimmed, to a multiple of ``num_replicas``.
    The order depends only on (seed, epoch), so a resumed loader
    (``DataLoader.load_state_dict``) replays it.
    """

    def __init__(self, dataset, chunk_rows, block=4, shuffle=True, seed=0, drop_last=False,
                 num_replicas=None, rank=None):
        self.dataset = dataset
        n = dataset if _is_int(dataset) else len(dataset)
        if n < 0:
            raise ValueError(f"ChunkShuffleSampler needs a non-negative length, got {n}")
        for name, value in (("chunk_rows", chunk_rows), ("block", block)):
            if not _is_int(value) or value <= 0:
                raise ValueError(f"{name} should be a positive integer, but got {name}={value!r}")
        if not isinstance(shuffle, bool) or not isinstance(drop_last, bool):
            raise ValueError("shuffle and drop_last should be booleans, but got "
                             f"shuffle={shuffle!r}, drop_last={drop_last!r}")
        if not _is_int(seed):
            raise ValueError(f"seed should be an integer, but got seed={seed!r}")
        if num_replicas is None:
            num_replicas = _world("get_world_size", 1)
        if rank is None:
            rank = _world("get_rank", 0)
        if not _is_int(num_replicas) or num_replicas <= 0:
            raise ValueError(f"num_replicas should be a positive integer, got {num_replicas!r}")
        if not _is_int(rank) or not 0 <= rank < num_replicas:
            raise ValueError(f"Invalid rank {rank}, rank should be in the interval "
                             f"[0, {num_replicas - 1}]")
        self.length = int(n)
        self.chunk_rows = int(chunk_rows)
        self.block = int(block)
        self.shuffle = shuffle
        self.seed = int(seed)
        self.drop_last = drop_last
        self.num_replicas = int(num_replicas)
        self.rank = int(rank)
        self.epoch = 0
        if drop_last and self.length % self.num_replicas:
            self.num_samples = self.length // self.num_replicas
        else:
            self.num_samples = math.ceil(self.length / self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas

    def set_epoch(self, epoch):
        """Sets the epoch, so each epoch draws a new order (the same on
        every replica)."""
        self.epoch = epoch

    def order(self):
        """This epoch's indices, before the split between replicas."""
        n = self.length
        if not self.shuffle or n == 0:
            return np.arange(n, dtype=np.int64)
        rng = np.random.default_rng([self.seed & (2 ** 64 - 1), int(self.epoch)])
        n_chunks = -(-n // self.chunk_rows)
        starts = rng.permutation(n_chunks).astype(np.int64) * self.chunk_rows
        rows = (starts[:, None] + np.arange(self.chunk_rows, dtype=np.int64)).reshape(-1)
        rows = rows[rows < n]  # the last chunk may be short
        # Block b holds the rows of the chunks at positions [b*block, (b+1)*block)
        # of the chunk order: shuffle each block's rows among themselves.
        ends = np.cumsum(np.minimum(self.chunk_rows, n - starts))[self.block - 1::self.block]
        for block_rows in np.split(rows, ends[:-1] if len(ends) and ends[-1] == n else ends):
            rng.shuffle(block_rows)
        return rows

    def _index_chunks(self):
        """The replica's indices as one int64 array."""
        order = self.order()
        if self.total_size > len(order) and len(order):
            order = np.resize(order, self.total_size)  # repeats its start, as torch pads
        share = order[:self.total_size]
        yield share[self.rank * self.num_samples:(self.rank + 1) * self.num_samples]

    def __iter__(self):
        for chunk in self._index_chunks():
            yield from chunk.tolist()

    def __len__(self):
        return self.num_samples


def _is_int(value):
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _world(query, default):
    """torch.distributed's world size or rank when a process group is
    initialized, else ``default``."""
    from .._torch import torch

    if torch is None or not torch.distributed.is_available() or \
            not torch.distributed.is_initialized():
        return default
    return getattr(torch.distributed, query)()
