"""LMDBDataset: the values of an LMDB database as samples, read with
liblmdb from the C worker threads.

Sample i is the value of key i: the index written as ASCII decimal
(``b"0"``, ``b"1"``, ..., the usual ImageNet-LMDB layout) or ``keys[i]``.
Values are JPEG/PNG/WebP images decoded by the C image pipeline, fixed-size
raw records copied into the batch, or bytes handed to a Python callable.
Every value is read inside a read transaction (an image's is copied out
before it ends), so another process may write the database while it is
read; a batch sees the values as they were when each sample was read.
"""

import os

import numpy as np

from ... import _C
from ..native import SourceOwner
from ..indexing import check_index, checked_index_array, is_index_batch
from ..cache import file_identity
from ..images import ImageFiles, _fallback
from ...transforms.ops import PILLOW_MAX_PIXELS

__all__ = ["LMDBDataset"]


def _key_blob(keys):
    keys = [k.encode() if isinstance(k, str) else bytes(k) for k in keys]
    offsets = np.zeros(len(keys) + 1, np.int64)
    offsets[1:] = np.cumsum([len(k) for k in keys])
    return b"".join(keys), offsets


def _open(path, db, keys, value_size):
    blob, offsets = (None, None) if keys is None else keys
    return _C.LMDBSource(path, db, keys=blob, key_offsets=offsets, value_size=value_size)


def _length(source, keys, length, path):
    if keys is not None:
        return len(keys[1]) - 1
    if length is None:
        return source.entries()
    if isinstance(length, bool) or not isinstance(length, (int, np.integer)) or length < 0:
        raise ValueError(f"{path!r}: length must be a non-negative integer, got {length!r}")
    return int(length)


def _labels(labels, length, path):
    labels = (np.zeros(length, np.int64) if labels is None
              else np.ascontiguousarray(labels, np.int64))
    if labels.shape != (length,):
        raise ValueError(f"{path!r}: {length} samples but labels of shape {labels.shape}")
    return labels


def LMDBDataset(path, keys=None, decode="jpeg", dtype=None, shape=None, labels=None,
                transform=None, target_transform=None, db=None, length=None, **image_options):
    """The values of the LMDB database at ``path`` (its directory, or the
    data file itself) as a map-style dataset: ``ds[i] == (sample, label)``.

    ``keys``: sample i is the value of ``keys[i]`` (bytes or str); None:
    of the key ``str(i)`` in ASCII, for i below ``length`` (default: the
    number of entries of the database).  ``db``: a named database (None:
    the default one).  ``labels``: one int per sample (default 0 each); an
    LMDB of images holds no labels of its own, so they come from this
    array (e.g. saved with the database as a .npy file).

    ``decode``:
      * ``"jpeg"``: values are encoded images (JPEG, PNG, WebP; others
        through Pillow) decoded and transformed by the C pipeline straight
        from the memory map, as ``ImageFolder``'s files; ``transform`` and
        ``image_options`` (decode, on_error, max_pixels, and cache,
        cache_size with cache_decoded=True: the images kept decoded) as
        for ``fastload.ImageFiles``.
      * ``"raw"``: values are records of ``dtype`` and ``shape``, copied in
        C into the batch (one read transaction per batch, no GIL).
      * a callable: ``decode(value_bytes)`` gives the sample, called with
        the GIL held (use worker processes for heavy decoding).

    Missing keys raise OSError naming the database and the key; a value of
    the wrong size (raw) or an image that cannot be decoded raises
    ``fastload.DecodeError``.  The open environment is never pickled: a
    worker process opens the database itself.
    """
    path = os.fsdecode(os.fspath(path))
    key_list = None if keys is None else _key_blob(keys)
    if isinstance(decode, str) and decode == "jpeg":
        return _LMDBImages(path, key_list, labels, transform, target_transform, db, length,
                           **image_options)
    if image_options:
        raise TypeError(f"LMDBDataset: {sorted(image_options)} apply to decode='jpeg' only")
    if isinstance(decode, str) and decode == "raw":
        if dtype is None or shape is None:
            raise ValueError("LMDBDataset: decode='raw' needs dtype and shape")
    elif not callable(decode):
        raise ValueError(f"LMDBDataset: decode must be 'jpeg', 'raw' or a callable, "
                         f"got {decode!r}")
    return _LMDBValues(path, key_list, decode, dtype, shape, labels, transform,
                       target_transform, db, length)


class _ReopenAfterFork:
    """An LMDB environment is used only in the process that opened it
    (liblmdb's rule): a forked worker process opens the database again on
    its first read."""

    def _in_this_process(self):
        if self._pid != os.getpid():
            self._make_sources()


class _LMDBImages(_ReopenAfterFork, ImageFiles):
    """Images decoded by the C pipeline from the values of an LMDB."""

    _sources = ("_source", "_raw", "_lmdb")

    def __init__(self, path, keys, labels, transform, target_transform, db, length,
                 decode="fast", on_error="raise", max_pixels=PILLOW_MAX_PIXELS, cache=None,
                 cache_size=None, cache_decoded=False):
        self.lmdb_path, self.db, self._keys = path, db, keys
        self._lmdb, self._pid = _open(path, db, keys, 0), os.getpid()
        n = _length(self._lmdb, keys, length, path)
        if cache is not None and not cache_decoded:
            raise ValueError(f"{path!r}: an LMDB's values are memory-mapped already; its "
                             "cache= keeps the decoded images only: pass cache_decoded=True")
        # Every sample names the database in messages; the key is in the text.
        paths = (os.fsencode(path) + b"\0", np.zeros(n, np.int64))
        self._setup(paths, _labels(labels, n, path), transform, target_transform, decode,
                    on_error, max_pixels, None, cache=cache, cache_size=cache_size,
                    cache_decoded=cache_decoded)

    def _cache_salt(self):
        # The data file's size and time: a directory's do not follow its data.
        path = self.lmdb_path
        data = os.path.join(path, "data.mdb") if os.path.isdir(path) else path
        keys = b"" if self._keys is None else self._keys[0] + self._keys[1].tobytes()
        return file_identity(data) + repr((self.db, len(self))).encode() + b"\0" + keys

    def _make_sources(self):
        if getattr(self, "_lmdb", None) is None or self._pid != os.getpid():
            self._lmdb = _open(self.lmdb_path, self.db, self._keys, 0)
        self._pid = os.getpid()
        super()._make_sources()

    def _native_source(self, uint8=False):
        self._in_this_process()
        return super()._native_source(uint8)

    def __getitem__(self, index):
        self._in_this_process()
        return super().__getitem__(index)

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._lmdb = None
        self._make_sources()

    def _image_source(self, plan, skip, gpu_split=None):
        return _C.ImageSource(self._paths, self._offsets, self._labels, plan,
                              exact=self.decode == "exact", max_pixels=self.max_pixels,
                              skip=skip, fallback=_fallback(), lmdb=self._lmdb,
                              cache=self.cache._native if self.cache is not None else None,
                              cache_pixels=self.cache is not None, gpu_split=gpu_split)


class _LMDBValues(_ReopenAfterFork, SourceOwner):
    """Raw records or callable-decoded values of an LMDB."""

    _sources = ("_source", "_rows")

    def __init__(self, path, keys, decode, dtype, shape, labels, transform, target_transform,
                 db, length):
        self.lmdb_path, self.db, self._keys, self.decode = path, db, keys, decode
        self.transform, self.target_transform = transform, target_transform
        if decode == "raw":
            self.dtype = np.dtype(dtype)
            self.shape = tuple(int(s) for s in ((shape,) if np.isscalar(shape) else shape))
            if self.dtype.hasobject or self.dtype.itemsize == 0:
                raise ValueError(f"LMDBDataset: dtype {self.dtype} has no fixed size")
            self._value_size = int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize
        else:
            self._value_size = 0
        self._make_sources()
        self._length = _length(self._source, keys, length, path)
        self._labels = _labels(labels, self._length, path)

    def _make_sources(self):
        self._source = _open(self.lmdb_path, self.db, self._keys, self._value_size)
        self._rows = None  # made on first use: the labels come after the source
        self._pid = os.getpid()

    def _native_source(self, uint8=False):
        """Raw records with no transform: the loader's batch path, the
        records and labels copied in C (fastload.datasets.native)."""
        if (self.decode != "raw" or uint8 or self.transform is not None
                or self.target_transform is not None):
            return None
        self._in_this_process()
        if self._rows is None:
            self._rows = _C.LMDBRows(self._source, self._labels, self.dtype, self.shape)
        return self._rows

    def __len__(self):
        return self._length

    @property
    def targets(self):
        return self._labels.tolist()

    def _values(self, indices):
        """The samples ``indices`` (int64, resolved): one array for raw
        records, else a list of decoded values."""
        self._in_this_process()
        if self.decode == "raw":
            out = np.empty((len(indices),) + self.shape, self.dtype)
            self._source.gather(np.ascontiguousarray(indices), out)
            return out
        return [self.decode(self._source.get(int(i))) for i in indices]

    def _finish(self, value, label):
        label = int(label)
        if self.transform is not None:
            value = self.transform(value)
        if self.target_transform is not None:
            label = self.target_transform(label)
        return value, label

    def __getitem__(self, index):
        if is_index_batch(index) or isinstance(index, slice):
            if isinstance(index, slice):
                index = np.arange(*index.indices(self._length))
            return self.__getitems__(index)
        i = check_index(index, self._length)
        return self._finish(self._values(np.array([i], np.int64))[0], self._labels[i])

    def __getitems__(self, indices):
        indices = checked_index_array(indices, self._length)
        values = self._values(indices)
        return [self._finish(v, l) for v, l in zip(values, self._labels[indices])]
