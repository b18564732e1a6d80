"""The shared sample cache of the image datasets: ``cache=`` and ``cache_size=``.

``cache="memory"`` keeps the samples' file bytes in an anonymous shared
memory file (a memfd) that the dataset's process workers share: forked
ones inherit it, spawned ones reopen it through ``/proc/<pid>/fd/<fd>``.
``cache=<path>`` (e.g. ``"/dev/shm/imagenet.cache"``) keeps them in that
file, which every loader and process on the node naming the same path
shares, across runs too.  The first read of a sample stores its bytes;
later reads copy them from the cache and check their size and checksum.

``cache_size`` bounds the whole file (header, index and data), in bytes;
None makes it big enough for every sample.  When full, samples read later
are simply not stored (first come, no eviction; see
csrc/core/sample_cache.h).  A file made for other data (the files' paths,
sizes or modification times differ) or of another size is replaced.
"""

import os

from . import _C

__all__ = ["SampleCache"]

_ALIGNMENT_SLACK = 8  # each sample's bytes are placed 8-byte aligned


class SampleCache:
    """A dataset's open cache.  ``path`` is the file (None: in memory);
    ``stats()`` the counters shared by everyone using it: capacity,
    data_bytes, used, stored, hits, rejected (stores refused for want of
    room) and corrupt (entries whose bytes did not match, dropped and read
    again from the source).  Pickled (for a spawned worker), it reopens the
    same file."""

    def __init__(self, path, key, samples, capacity, _reopen=None):
        self.path = path
        self.key = key
        self.samples = samples
        self.capacity = capacity
        self._native = _C.SampleCache(_reopen or path, key, samples, capacity)

    @classmethod
    def for_samples(cls, cache, cache_size, paths, offsets, ranges):
        """The cache ``cache`` (None, "memory" or a path) of ``cache_size``
        bytes (None: room for every sample) for these samples, or None."""
        if cache is None:
            if cache_size is not None:
                raise ValueError("cache_size is given but cache is None")
            return None
        if cache == "memory":
            path = None
        elif isinstance(cache, (str, bytes, os.PathLike)):
            path = os.fsdecode(os.fspath(cache))
            if not path:
                raise ValueError("cache must be 'memory' or a file path, got ''")
        else:
            raise TypeError(f"cache must be None, 'memory' or a file path, "
                            f"got {type(cache).__name__}")
        key, total = _C.sample_cache_key(paths, offsets, ranges)
        samples = len(offsets)
        overhead = _C.SampleCache.overhead(samples)
        if cache_size is None:
            capacity = overhead + total + _ALIGNMENT_SLACK * samples + 1
        else:
            if isinstance(cache_size, bool) or not isinstance(cache_size, int):
                raise TypeError(f"cache_size must be an int (bytes) or None, "
                                f"got {type(cache_size).__name__}")
            if cache_size <= overhead:
                raise ValueError(f"cache_size={cache_size} leaves no room for samples: the "
                                 f"index of {samples} samples takes {overhead} bytes")
            capacity = cache_size
        return cls(path, key, samples, capacity)

    def stats(self):
        return self._native.stats()

    def file_offset(self, index):
        """Where sample ``index``'s bytes lie in the file, or None."""
        return self._native.file_offset(index)

    def __reduce__(self):
        where = self.path
        if where is None:  # the creator's memfd, open while it lives
            where = f"/proc/{os.getpid()}/fd/{self._native.fd}"
        return _reopen, (self.path, self.key, self.samples, self.capacity, where)

    def __repr__(self):
        where = "memory" if self.path is None else repr(self.path)
        return f"SampleCache({where}, capacity={self.capacity})"


def _reopen(path, key, samples, capacity, where):
    return SampleCache(path, key, samples, capacity, _reopen=where)
