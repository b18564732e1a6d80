"""HDF5Dataset: datasets of one HDF5 file as the columns of a map-style
dataset, with h5py as the metadata parser.

A dataset stored contiguously, uncompressed and unfiltered is a plain
array at an offset in the file: it is memory-mapped there and its rows
gathered in C with the GIL released, as ``ArrayDataset`` gathers a
``.npy`` file's (no HDF5 call per batch; a file truncated under the mapping
raises OSError naming it).  A chunked or compressed one is read through
h5py, one read per batch, with HDF5's chunk cache sized by the user.

Every key reads the file the dataset opened: it is kept open by descriptor
(``_KeptFile``), mapped through that descriptor, and h5py reads the same
file, so a file replaced by rename (a new version written beside it and
renamed over it) is not half read: the dataset goes on reading the old
version.  A
worker process started by fork inherits the descriptor; one that receives
the dataset pickled (spawn, forkserver) reopens the path, and its reads
raise OSError naming the file if it is no longer the file the dataset
opened.
"""

import collections
import errno
import io
import os
import threading

import numpy as np

from ... import _C
from ._common import (RowsDataset, check_keys, describe_layouts, is_run, names_shown,
                      read_distinct_rows, require)

__all__ = ["HDF5Dataset"]

# How a dataset's rows are read:
#   "mapped":  memory-mapped, gathered in C (native byte order);
#   "swapped": memory-mapped, gathered by NumPy and byte-swapped to native;
#   "read":    through h5py, one read per batch (chunked, compressed,
#              filtered, external or not yet written storage).
_Layout = collections.namedtuple("_Layout", "key shape dtype offset storage chunks")

_DEFAULT_CACHE_BYTES = 32 << 20


class HDF5Dataset(RowsDataset):
    """Rows of datasets of one HDF5 file: ``ds[i] == (f[k][i] for k in keys)``.

    ``keys`` names the HDF5 datasets (paths such as ``"train/images"``
    work) that form one sample; they share their first dimension.  Each
    must hold a numeric or bool dtype.  ``ds[i]`` gives a tuple of NumPy
    arrays; ``ds[[i, j, ...]]`` a tuple of batch arrays; in a DataLoader
    with the default collate function a batch is a list of one ``(B, *row)``
    array per key, as for ``ArrayDataset``.

    Contiguous, uncompressed datasets are memory-mapped and gathered in C;
    when every key is, the loader reads batches with C worker threads and
    no Python per batch.  Chunked or compressed datasets are read with one
    h5py call per batch (the batch's sorted unique rows, then put back in
    sampler order).  HDF5 caches decompressed chunks per open dataset:
    ``chunk_cache_bytes`` sets that cache for each key in each process
    (least recently used chunks go first).  h5py serialises every call
    under one lock, so for compressed data use worker processes
    (``worker_mode="process"``, the default for a dataset that is not all
    memory-mapped): each opens the file itself on its first read.

    ``cache`` (None, ``"memory"`` or a file path) and ``cache_size`` keep
    the rows read through h5py, decompressed, as first read, in a shared
    cache (``fastload.cache``) that later epochs, worker processes and
    other datasets naming the same path read instead of the file.
    """

    _sources = ("_source", "_arrays", "_open", "_swapped", "_mapped_file")
    _file = None  # the _KeptFile every key reads

    def __init__(self, path, keys=("images", "labels"), chunk_cache_bytes=_DEFAULT_CACHE_BYTES,
                 *, cache=None, cache_size=None):
        h5py = require("h5py", "HDF5Dataset")
        self.path = os.fsdecode(os.fspath(path))
        self.keys = check_keys(keys, "HDF5Dataset")
        if (isinstance(chunk_cache_bytes, bool)
                or not isinstance(chunk_cache_bytes, (int, np.integer)) or chunk_cache_bytes < 0):
            raise ValueError("chunk_cache_bytes must be a non-negative integer, "
                             f"got {chunk_cache_bytes!r}")
        self.chunk_cache_bytes = int(chunk_cache_bytes)
        self._file = _KeptFile.open(self.path)
        self._layouts = _read_layouts(h5py, self._file, self.keys)
        lengths = [layout.shape[0] for layout in self._layouts]
        if len(set(lengths)) > 1:
            detail = ", ".join(f"{k!r}: {n}" for k, n in zip(self.keys, lengths))
            raise ValueError(f"{self.path!r}: the datasets differ in length ({detail}); "
                             "the keys of one sample must share their first dimension")
        self._length = lengths[0]
        self._names = self.keys
        self._make_sources()
        self._open_cache(cache, cache_size, [self.path])

    def __setstate__(self, state):
        self.__dict__.update(state)
        if self._file.error is not None:
            # A spawned worker's copy of a dataset whose file was replaced
            # since: no sources; every read raises the error, naming the file.
            self._arrays, self._gathered, self._native = (None,) * len(self._layouts), (), False
            self._source, self._open = None, [None, threading.Lock()]
            self._swapped, self._mapped_file = {}, None
            return
        self._make_sources()

    def _native_source(self, uint8=False):
        self._file.check()
        return super()._native_source(uint8)

    def _batch(self, indices):
        self._file.check()
        return super()._batch(indices)

    def _make_sources(self):
        arrays = []
        for layout in self._layouts:
            arrays.append(None if layout.storage == "read" else self._map(layout))
        self._arrays = tuple(arrays)
        self._gathered = tuple(p for p, layout in enumerate(self._layouts)
                               if layout.storage == "mapped")
        self._native = len(self._gathered) == len(self._layouts)
        self._source = None
        # The file as the C sources name it in errors: its size now is read
        # from the kept descriptor (the file mapped), not from the path.
        self._mapped_file = (self.path, self._file.size(), self._file.fd)
        if self._gathered:
            self._source = _C.RowSource(tuple(arrays[p] for p in self._gathered),
                                        tuple(self._mapped_file for _ in self._gathered))
        # Byte-swapped rows are gathered by the same guarded C copy (as raw
        # bytes, in the file's order), then swapped by NumPy: NumPy reading
        # the mapping itself would die of SIGBUS on a file cut short.
        self._swapped = {p: _C.RowSource((arrays[p],), (self._mapped_file,))
                         for p, layout in enumerate(self._layouts)
                         if layout.storage == "swapped"}
        # (process id, h5py.File, {key: h5py.Dataset}), opened on the first
        # h5py read in each process: an open HDF5 file is neither pickled
        # nor used across fork.
        self._open = [None, threading.Lock()]

    def _map(self, layout):
        try:
            return self._file.memmap(layout.dtype, layout.offset, layout.shape)
        except (OSError, ValueError) as e:
            raise OSError(f"cannot memory-map dataset {layout.key!r} of {self.path!r} "
                          f"({e}); was the file changed since the dataset was made?") from e

    @property
    def mapped_keys(self):
        """The keys whose rows are memory-mapped (the others are read
        through h5py)."""
        return tuple(layout.key for layout in self._layouts if layout.storage != "read")

    def _dataset(self, key):
        """The h5py dataset ``key`` of this process's open file."""
        pid = os.getpid()
        state = self._open[0]
        if state is None or state[0] != pid:
            with self._open[1]:
                state = self._open[0]
                if state is None or state[0] != pid:
                    state = self._open[0] = (pid,) + self._open_file()
        return state[2][key]

    def _open_file(self):
        h5py = require("h5py", "HDF5Dataset")
        read = [layout for layout in self._layouts if layout.storage == "read"]
        slots = _cache_slots(self.chunk_cache_bytes, read)
        try:
            f = self._file.open_h5py(h5py, rdcc_nbytes=self.chunk_cache_bytes, rdcc_w0=0.0,
                                     rdcc_nslots=slots)
            return f, {layout.key: f[layout.key] for layout in read}
        except (OSError, KeyError) as e:
            raise OSError(f"cannot open {self.path!r} to read {read[0].key!r}: {e}") from e

    def _read_rows(self, position, indices):
        layout = self._layouts[position]
        native = layout.dtype.newbyteorder("=")
        if layout.storage == "swapped":
            # A file cut short since is named with the dataset before the
            # read; one cut during it, by the guarded gather.
            if 0 <= self._file.size() < layout.offset + layout.dtype.itemsize * int(
                    np.prod(layout.shape, dtype=np.int64)):
                raise _C.file_changed(self._mapped_file, f"dataset {layout.key!r}")
            rows = self._swapped[position].batch(np.asarray(indices, np.int64), None, None, 0,
                                                 0)[0][0]
            return rows.astype(native)
        return read_distinct_rows(layout, indices, lambda unique: self._read_sorted(layout, unique))

    def _read_sorted(self, layout, unique):
        dataset = self._dataset(layout.key)
        try:
            if is_run(unique):
                return dataset[int(unique[0]):int(unique[-1]) + 1]  # one hyperslab
            if layout.chunks is not None:
                return _read_by_chunk(dataset, unique, layout.chunks[0])
            return dataset[unique]
        except Exception as e:  # noqa: BLE001 (h5py raises OSError, ValueError, RuntimeError)
            raise OSError(f"cannot read dataset {layout.key!r} of {self.path!r} "
                          f"(rows {int(unique[0])} to {int(unique[-1])}): {e}") from e

    def __repr__(self):
        return (f"HDF5Dataset({self.path!r}, {self._length} rows of "
                f"{describe_layouts(self._layouts)})")


def _read_by_chunk(dataset, unique, chunk_rows):
    """Rows ``unique`` (sorted, distinct) of a chunked dataset: one slice of
    each chunk they touch, from its first row read to its last.  HDF5 reads
    a chunk whole either way, but h5py's selection of scattered rows costs
    far more than these reads (256 random rows in 4-row lzf chunks: 29 ms
    against 4.3)."""
    chunk = unique // chunk_rows
    starts = np.flatnonzero(np.r_[True, chunk[1:] != chunk[:-1]])
    ends = np.r_[starts[1:], len(unique)]
    out = np.empty((len(unique),) + dataset.shape[1:], dataset.dtype)
    for start, end in zip(starts.tolist(), ends.tolist()):
        first = int(unique[start])
        block = dataset[first:int(unique[end - 1]) + 1]
        out[start:end] = block[unique[start:end] - first]
    return out


class _KeptFile:
    """A file kept open by descriptor, so that what is read is the file
    opened, whatever later lies at its path: ``open_h5py()`` opens that very
    file with h5py, ``memmap()`` maps it.  Pickled
    (for a spawned worker), it travels as the path, the descriptor's number
    and the file's identity (device, inode): the copy takes the descriptor
    where its process has it (the same process, a forked one), else reopens
    the path; its reads raise OSError when the path no longer names the
    file."""

    error = None  # (errno, message): a copy that could not take the file

    def __init__(self, path, fd):
        self.path = path
        self.fd = fd  # owned: closed by close(), or when this object goes
        self.identity = _identity(os.fstat(fd))

    def check(self):
        """OSError naming the file when this copy could not take it."""
        if self.error is not None:
            raise OSError(*self.error)

    @classmethod
    def open(cls, path):
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError as e:
            raise ValueError(f"cannot open {path!r}: no such file") from e
        except OSError as e:
            raise ValueError(f"cannot open {path!r}: {e.strerror}") from e
        return cls(path, fd)

    def memmap(self, dtype, offset, shape):
        """A read-only memory map of this file's bytes."""
        self.check()
        with open(self.fd, "rb", closefd=False) as f:  # mmap takes its own descriptor
            return np.memmap(f, dtype=dtype, mode="r", offset=offset, shape=shape)

    def open_h5py(self, h5py, **kwargs):
        """``h5py.File`` of this file: opened by path while the path names
        it (HDF5 reads with its own descriptor), else (the file was replaced
        since) through a reader of the kept descriptor."""
        self.check()
        try:
            f = h5py.File(self.path, "r", **kwargs)
        except OSError:
            f = None  # gone, or no HDF5 file now
        if f is not None:
            try:
                same = _identity(os.fstat(f.id.get_vfd_handle())) == self.identity
            except (OSError, TypeError, ValueError):
                same = False
            if same:
                return f
            f.close()
        return h5py.File(_KeptReader(self), "r", **kwargs)

    def size(self):
        """The file's size in bytes now; -1 when it cannot be told."""
        try:
            return os.fstat(self.fd).st_size
        except OSError:
            return -1

    def close(self, _close=os.close):  # bound now: __del__ may run after os is torn down
        fd, self.fd = self.fd, -1
        if fd >= 0:
            _close(fd)

    def __del__(self):
        self.close()

    def __getstate__(self):
        return {"path": self.path, "fd": self.fd, "identity": list(self.identity)}

    def __setstate__(self, state):
        self.path, self.fd = state["path"], -1
        self.identity = tuple(state["identity"])
        try:
            if _identity(os.fstat(state["fd"])) == self.identity:
                self.fd = os.dup(state["fd"])  # this process has the file open already
                return
        except OSError:
            pass
        # Raised on the first read, not here: a worker that fails to
        # unpickle its dataset dies before it can report why.
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError as e:
            self.error = (e.errno, f"cannot reopen {self.path!r}: {e.strerror}")
            return
        if _identity(os.fstat(fd)) != self.identity:
            os.close(fd)
            self.error = (errno.ESTALE, _replaced(self.path))
            return
        self.fd = fd


class _KeptReader(io.RawIOBase):
    """A read-only file object over a _KeptFile's descriptor, for h5py's
    fileobj driver.  It reads at its own position (pread): forked workers
    share the descriptor's offset, so seek-then-read would race."""

    def __init__(self, kept):
        super().__init__()
        self._kept = kept  # keeps the descriptor open
        self._pos = 0

    def readable(self):
        return True

    def seekable(self):
        return True

    def seek(self, offset, whence=os.SEEK_SET):
        if whence == os.SEEK_CUR:
            offset += self._pos
        elif whence == os.SEEK_END:
            offset += os.fstat(self._kept.fd).st_size
        if offset < 0:
            raise ValueError(f"negative seek position {offset}")
        self._pos = offset
        return offset

    def tell(self):
        return self._pos

    def readinto(self, buffer):
        n = os.preadv(self._kept.fd, [buffer], self._pos)
        self._pos += n
        return n


def _identity(st):
    return (st.st_dev, st.st_ino)


def _replaced(path):
    return (f"{path!r} was replaced since the dataset was made (it names another file now): "
            "its keys would read two versions of it.  Make the dataset again to read the new "
            "file")


def _read_layouts(h5py, kept, keys):
    path = kept.path
    try:
        f = kept.open_h5py(h5py)
    except OSError as e:
        raise ValueError(f"cannot open {path!r} as an HDF5 file: {e}") from e
    with f:
        size = kept.size()
        return [_layout(h5py, f, path, size, key) for key in keys]


def _layout(h5py, f, path, size, key):
    try:
        obj = f[key]
    except KeyError:
        names = []
        f.visititems(lambda name, o: names.append(name) if isinstance(o, h5py.Dataset) else None)
        raise KeyError(f"{path!r} has no dataset {key!r} (its datasets: {names_shown(names)})") \
            from None
    if not isinstance(obj, h5py.Dataset):
        raise ValueError(f"{path!r}: {key!r} is a {type(obj).__name__.lower()}, not a dataset")
    dtype = obj.dtype
    if dtype.kind not in "biufc" or dtype.fields is not None or dtype.subdtype is not None:
        raise TypeError(f"{path!r}: dataset {key!r} has dtype {dtype}; HDF5Dataset serves "
                        "numeric and bool datasets only")
    if obj.shape is None or len(obj.shape) == 0:
        raise ValueError(f"{path!r}: dataset {key!r} is a scalar; HDF5Dataset needs rows")
    shape = tuple(int(n) for n in obj.shape)
    offset = obj.id.get_offset()
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    plain = (offset is not None and obj.chunks is None and obj.compression is None
             and obj.external is None and nbytes > 0
             and obj.id.get_type().get_size() == dtype.itemsize)
    if not plain:
        return _Layout(key, shape, dtype, None, "read", obj.chunks)
    if size >= 0 and offset + nbytes > size:
        raise ValueError(f"{path!r} is truncated: dataset {key!r} lies at bytes {offset} to "
                         f"{offset + nbytes}, but the file has {size} bytes")
    return _Layout(key, shape, dtype, int(offset), "mapped" if dtype.isnative else "swapped",
                   None)


def _cache_slots(cache_bytes, layouts):
    """HDF5's advice for its chunk cache: a prime number of hash slots about
    100 times the number of chunks the cache holds."""
    chunk_bytes = [int(np.prod(layout.chunks, dtype=np.int64)) * layout.dtype.itemsize
                   for layout in layouts if layout.chunks]
    fits = cache_bytes // max(1, min(chunk_bytes, default=1 << 20))
    slots = max(521, min(100 * fits, 1 << 24)) | 1
    while any(slots % d == 0 for d in range(3, int(slots ** 0.5) + 1, 2)):
        slots += 2
    return slots

