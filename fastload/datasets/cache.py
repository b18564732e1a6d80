"""The shared sample cache of the image datasets: ``cache=`` and ``cache_size=``.

``cache="memory"`` keeps the samples' file bytes in an anonymous shared
memory file (a memfd) that the dataset's process workers share: forked
ones inherit it, spawned ones reopen it through ``/proc/<pid>/fd/<fd>``.
``cache=<path>`` (e.g. ``"/dev/shm/imagenet.cache"``) keeps them in that
file, which every loader and process on the node naming the same path
shares, across runs too.  The first read of a sample stores its bytes;
later reads copy them from the cache and check their size and checksum.

``cache_decoded=True`` keeps each image decoded whole instead (its RGB
pixels), so later reads skip the decode; the plan then always decodes
whole (as ``decode="exact"``), so every epoch gives the same output.  A
file in a format decoded by the fallback (Pillow) is not kept then.

``cache_size`` bounds the whole file (header, index and data), in bytes;
None makes it big enough for every sample's bytes (decoded pixels have no
size known before the decode: ``cache_decoded`` needs ``cache_size``).
When full, samples read later
are simply not stored (first come, no eviction; see
csrc/core/source/sample_cache.h).  A file made for other data (the files' paths,
sizes or modification times differ) or of another size is replaced.
"""

import hashlib
import os

from .. import _C

__all__ = ["SampleCache", "file_identity"]

_ALIGNMENT_SLACK = 8  # each sample's bytes are placed 8-byte aligned


class SampleCache:
    """A dataset's open cache.  ``path`` is the file (None: in memory);
    ``stats()`` the counters shared by everyone using it: capacity,
    data_bytes, used, stored, hits, rejected (stores refused for want of
    room) and corrupt (entries whose bytes did not match, dropped and read
    again from the source); and broken: True once this process found the
    file cut short under its mapping (another process truncated it), after
    which every sample is read from its source.  Pickled (for a spawned
    worker), it reopens the same file."""

    def __init__(self, path, key, samples, capacity, decoded=False, _reopen=None):
        self.path = path
        self.key = key
        self.decoded = decoded
        self.samples = samples
        self.capacity = capacity
        self._native = _C.SampleCache(_reopen or path, key, samples, capacity)

    @classmethod
    def for_samples(cls, cache, cache_size, paths, offsets, ranges, decoded=False, salt=b"",
                    rewritten=False):
        """The cache ``cache`` (None, "memory" or a path) of ``cache_size``
        bytes (None: room for every sample's bytes) for these samples, or
        None; ``decoded``: it keeps their decoded pixels; ``salt``: more
        that names the samples, hashed into the key (an LMDB's keys);
        ``rewritten``: JPEGs are kept with restart markers, a few percent
        larger (cache_size None: room for a quarter more, and 2 KiB a
        sample for the tables of small files)."""
        path = _where(cache, cache_size)
        if path is False:
            if decoded:
                raise ValueError("cache_decoded=True is given but cache is None")
            return None
        key, total = _C.sample_cache_key(paths, offsets, ranges)
        if decoded:  # another key: a file of bytes is never read as pixels
            salt = b"pixels\0" + salt
        if salt:
            key = _hash(key.to_bytes(8, "little") + salt)
        if cache_size is None and decoded:
            raise ValueError("cache_decoded=True needs cache_size (bytes): the pixels' size is "
                             "not known before the images are decoded (3 bytes a pixel)")
        samples = len(offsets)
        if rewritten:
            total += total // 4 + 2048 * samples
        return cls(path, key, samples, _capacity(cache_size, samples, total), decoded)

    @classmethod
    def for_rows(cls, cache, cache_size, files, layout, samples, total):
        """The cache ``cache`` of ``cache_size`` bytes (None: room for all)
        for ``samples`` fixed-size rows, ``total`` bytes in all, of the data
        in ``files`` as ``layout`` (a str naming keys, dtypes and shapes)
        describes it; None when ``cache`` is None.  The key is a hash of
        the layout and of each file's path, size and modification time."""
        path = _where(cache, cache_size)
        if path is False:
            return None
        key = _hash(layout.encode() + b"".join(file_identity(name) for name in files))
        return cls(path, key, samples, _capacity(cache_size, samples, total))

    def stats(self):
        return self._native.stats()

    def file_offset(self, index):
        """Where sample ``index``'s bytes lie in the file, or None."""
        return self._native.file_offset(index)

    def __reduce__(self):
        where = self.path
        if where is None:  # the creator's memfd, open while it lives
            where = f"/proc/{os.getpid()}/fd/{self._native.fd}"
        return _reopen, (self.path, self.key, self.samples, self.capacity, where, self.decoded)

    def __repr__(self):
        where = "memory" if self.path is None else repr(self.path)
        decoded = ", decoded" if self.decoded else ""
        return f"SampleCache({where}, capacity={self.capacity}{decoded})"


def file_identity(path):
    """What a cache's key takes of a file: its absolute path, size and
    modification time (so a rewritten file gives another key)."""
    st = os.stat(path)
    return f"\0{os.path.abspath(path)}\0{st.st_size}\0{st.st_mtime_ns}".encode()


def _hash(data):
    """A 64-bit key of ``data``."""
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def _where(cache, cache_size):
    """The file ``cache`` names: None for "memory", False for no cache."""
    if cache is None:
        if cache_size is not None:
            raise ValueError("cache_size is given but cache is None")
        return False
    if cache == "memory":
        return None
    if isinstance(cache, (str, bytes, os.PathLike)):
        path = os.fsdecode(os.fspath(cache))
        if not path:
            raise ValueError("cache must be 'memory' or a file path, got ''")
        return path
    raise TypeError(f"cache must be None, 'memory' or a file path, got {type(cache).__name__}")


def _capacity(cache_size, samples, total):
    """The file's bytes: ``cache_size`` checked, or (None) room for every
    sample's ``total`` bytes."""
    overhead = _C.SampleCache.overhead(samples)
    if cache_size is None:
        return overhead + total + _ALIGNMENT_SLACK * samples + 1
    if isinstance(cache_size, bool) or not isinstance(cache_size, int):
        raise TypeError(f"cache_size must be an int (bytes) or None, "
                        f"got {type(cache_size).__name__}")
    if cache_size <= overhead:
        raise ValueError(f"cache_size={cache_size} leaves no room for samples: the "
                         f"index of {samples} samples takes {overhead} bytes")
    return cache_size


def _reopen(path, key, samples, capacity, where, decoded=False):
    return SampleCache(path, key, samples, capacity, decoded, _reopen=where)
