"""ZarrDataset: arrays of one Zarr group (format 2 or 3) as the columns of
a map-style dataset, read through zarr.

A batch is one zarr read per array: the batch's sorted unique rows (a
slice when they are a run, otherwise an orthogonal selection, so each chunk
is fetched and decoded once), put back in sampler order.  zarr decodes the
chunks on its own thread pool, and blosc, zstd and gzip decode without the
GIL, so worker threads read in parallel (``worker_mode="auto"`` picks them
for this dataset).  An array stored as a single uncompressed chunk in a
local directory is one plain file: it is memory-mapped and its rows
gathered in C, as ``ArrayDataset`` gathers a ``.npy`` file's.
"""

import collections
import os

import numpy as np

from ... import _C
from ._common import (RowsDataset, check_keys, describe_layouts, file_size, is_run, names_shown,
                      read_distinct_rows, require)

__all__ = ["ZarrDataset"]

# How a key's rows are read:
#   "mapped": its one chunk file memory-mapped, gathered in C;
#   "chunks": chunk files of whole rows in a local directory, read and
#             decoded here (numcodecs, off the GIL), each once a batch;
#   "read":   through zarr, one orthogonal read per batch (any other store
#             or codec: sharding, transposes, checksums, remote stores).
_Layout = collections.namedtuple("_Layout", "key shape dtype chunks storage chunk_file")

_DEFAULT_KEYS = ("images", "labels")


class ZarrDataset(RowsDataset):
    """Rows of arrays of one Zarr group: ``ds[i] == (g[k][i] for k in keys)``.

    ``store_or_group`` is a path (or URL zarr opens) of a group or of one
    array, or a ``zarr.Group`` or ``zarr.Array``.  ``keys`` names the arrays
    of the group (paths such as ``"train/images"`` work) that form one
    sample; they share their first dimension.  A single array is a dataset
    of one column (``keys`` is then not given).  Arrays must hold a numeric
    or bool dtype.  ``ds[i]`` is a tuple of NumPy arrays, ``ds[[i, j]]`` a
    tuple of batch arrays; in a DataLoader with the default collate
    function a batch is a list of one ``(B, *row)`` array per key.

    Random batches decode every chunk they touch: pair the dataset with
    ``ChunkShuffleSampler`` so that a batch touches few chunks.  A chunk
    that cannot be decoded raises ``OSError`` naming the store, the key and
    the rows; a chunk that is absent reads as the array's fill value, as
    zarr defines it.  ``worker_mode="auto"`` runs this dataset on worker
    threads (chunk reads and decodes release the GIL), or on processes when
    a key is read through zarr (sharded, filtered, remote).

    ``cache`` (None, ``"memory"`` or a file path) and ``cache_size`` keep
    the rows of the keys read chunk by chunk, decoded, as first read, in a
    shared cache (``fastload.cache``) that later epochs, worker processes
    and other datasets naming the same path read instead of the store (a
    local store: the cache's key hashes its files' sizes and times).
    """

    _sources = ("_source", "_arrays", "_zarr", "_chunk_readers")

    def __init__(self, store_or_group, keys=_DEFAULT_KEYS, *, cache=None, cache_size=None):
        zarr = require("zarr", "ZarrDataset")
        if int(zarr.__version__.split(".")[0]) < 3:
            raise ImportError(f"ZarrDataset needs zarr 3 or later (it reads format 2 and 3 "
                              f"stores), found zarr {zarr.__version__}: pip install -U zarr")
        node, self.store = _open(zarr, store_or_group)
        # A path is reopened by each process that unpickles the dataset; a
        # zarr object is pickled as zarr pickles it (its store and path).
        self._node = None if isinstance(store_or_group, (str, bytes, os.PathLike)) else node
        if isinstance(node, zarr.Array):
            if keys is not _DEFAULT_KEYS and keys is not None:
                raise ValueError(f"{self.store!r} is an array, not a group: it is the dataset's "
                                 f"one column (keys={keys!r} names arrays of a group)")
            self.keys = (node.path or os.path.basename(self.store.rstrip("/")),)
        else:
            self.keys = check_keys(keys, "ZarrDataset")
        self._layouts = [_layout(zarr, node, self.store, key) for key in self.keys]
        lengths = [layout.shape[0] for layout in self._layouts]
        if len(set(lengths)) > 1:
            detail = ", ".join(f"{k!r}: {n}" for k, n in zip(self.keys, lengths))
            raise ValueError(f"{self.store!r}: the arrays differ in length ({detail}); "
                             "the keys of one sample must share their first dimension")
        self._length = lengths[0]
        self._names = self.keys
        self._make_sources(node)
        files = []
        if cache is not None:
            for position, array in enumerate(self._zarr):
                if position not in self._gathered:
                    files.extend(_local_files(array, self.store))
        self._open_cache(cache, cache_size, files)

    def _make_sources(self, node=None):
        zarr = require("zarr", "ZarrDataset")
        if node is None:
            node = self._node if self._node is not None else _open(zarr, self.store)[0]
        self._zarr = [node if isinstance(node, zarr.Array) else node[layout.key]
                      for layout in self._layouts]
        arrays = [self._map(layout) if layout.storage == "mapped" else None
                  for layout in self._layouts]
        self._chunk_readers = [_ChunkReader(self.store, layout.key, array)
                               if layout.storage == "chunks" else None
                               for layout, array in zip(self._layouts, self._zarr)]
        self._arrays = tuple(arrays)
        self._gathered = tuple(p for p, layout in enumerate(self._layouts)
                               if layout.storage == "mapped")
        self._native = len(self._gathered) == len(self._layouts)
        self._source = None
        if self._gathered:
            self._source = _C.RowSource(
                tuple(arrays[p] for p in self._gathered),
                tuple((self._layouts[p].chunk_file, file_size(self._layouts[p].chunk_file))
                      for p in self._gathered))

    def _map(self, layout):
        try:
            return np.memmap(layout.chunk_file, dtype=layout.dtype, mode="r", shape=layout.shape)
        except (OSError, ValueError) as e:
            raise OSError(f"cannot memory-map array {layout.key!r} of {self.store!r} "
                          f"({layout.chunk_file!r}: {e}); was the store changed since the "
                          "dataset was made?") from e

    @property
    def _threads_read_in_parallel(self):
        """True when no key is read through zarr, whose pipeline runs on one
        event-loop thread a process: the chunk files are then read and
        decoded with the GIL released, and worker threads read batches in
        parallel (worker_mode="auto" picks them)."""
        return all(layout.storage != "read" for layout in self._layouts)

    @property
    def mapped_keys(self):
        """The keys whose rows are memory-mapped (the others are read
        chunk by chunk)."""
        return tuple(layout.key for layout in self._layouts if layout.storage == "mapped")

    def _read_rows(self, position, indices):
        return read_distinct_rows(self._layouts[position], indices,
                                  lambda unique: self._read_sorted(position, unique))

    def _read_sorted(self, position, unique):
        layout, array = self._layouts[position], self._zarr[position]
        reader = self._chunk_readers[position]
        try:
            if reader is not None:
                return reader.rows(unique)
            if is_run(unique):
                return array[int(unique[0]):int(unique[-1]) + 1]  # one slice
            return array.oindex[unique]
        except Exception as e:  # noqa: BLE001 (codecs and stores raise many kinds)
            raise OSError(f"cannot read array {layout.key!r} of {self.store!r} "
                          f"(rows {int(unique[0])} to {int(unique[-1])}): "
                          f"{type(e).__name__}: {e}") from e

    def __repr__(self):
        return (f"ZarrDataset({self.store!r}, {self._length} rows of "
                f"{describe_layouts(self._layouts)})")


def _open(zarr, store_or_group):
    """The zarr node and the name errors give its store."""
    if isinstance(store_or_group, (zarr.Array, zarr.Group)):
        return store_or_group, _node_name(store_or_group)
    if isinstance(store_or_group, (bytes, os.PathLike)):
        store_or_group = os.fsdecode(os.fspath(store_or_group))
    if not isinstance(store_or_group, str):
        raise TypeError("ZarrDataset takes a path, a zarr.Group or a zarr.Array, not "
                        f"{type(store_or_group).__name__}")
    path = store_or_group
    if "://" not in path and not os.path.exists(path):
        raise ValueError(f"cannot open {path!r}: no such file or directory")
    try:
        return zarr.open(path, mode="r"), path
    except Exception as e:  # noqa: BLE001 (zarr raises many kinds for a bad store)
        raise ValueError(f"cannot open {path!r} as a Zarr group or array: "
                         f"{type(e).__name__}: {e}") from e


def _local_files(array, store):
    """The files of ``array`` in a local store, sorted (a cache's key hashes
    them); ValueError for a store of another kind."""
    root = getattr(array.store, "root", None)
    if root is None:
        raise ValueError(f"cache= needs a store on the local file system (its key hashes the "
                         f"files' sizes and times); {store!r} is not one")
    top = os.path.join(os.fspath(root), array.path)
    return sorted(os.path.join(folder, name) for folder, _, names in os.walk(top)
                  for name in names)


def _node_name(node):
    """'<store>/<path>' of a zarr object, as a user recognises it."""
    root = getattr(node.store, "root", None)
    if root is not None:
        return os.path.join(os.fspath(root), node.path) if node.path else os.fspath(root)
    return str(node.store_path)


def _layout(zarr, node, store, key):
    if isinstance(node, zarr.Array):
        obj = node
    else:
        try:
            obj = node[key]
        except KeyError:
            names = sorted(name for name, _ in node.arrays())
            raise KeyError(f"{store!r} has no array {key!r} "
                           f"(its arrays: {names_shown(names)})") from None
        if not isinstance(obj, zarr.Array):
            raise ValueError(f"{store!r}: {key!r} is a group, not an array")
    dtype = obj.dtype
    if (not isinstance(dtype, np.dtype) or dtype.kind not in "biufc"
            or dtype.fields is not None or dtype.subdtype is not None):
        raise TypeError(f"{store!r}: array {key!r} has dtype {dtype}; ZarrDataset serves "
                        "numeric and bool arrays only")
    if len(obj.shape) == 0:
        raise ValueError(f"{store!r}: array {key!r} is a scalar; ZarrDataset needs rows")
    shape = tuple(int(n) for n in obj.shape)
    chunk_file = _single_plain_chunk(zarr, obj, dtype)
    if chunk_file is not None:
        storage = "mapped"
    else:
        storage = "chunks" if _ChunkReader.serves(zarr, obj) else "read"
    return _Layout(key, shape, dtype, tuple(obj.chunks), storage, chunk_file)


def _single_plain_chunk(zarr, array, dtype):
    """The file holding the whole array as raw C-order native bytes, when it
    is stored that way (one chunk covering it, no codec but the byte layout,
    a local directory store); else None."""
    if tuple(array.chunks) != tuple(array.shape) or not dtype.isnative or array.nbytes == 0:
        return None
    if array.compressors or array.filters:
        return None
    metadata = array.metadata
    if metadata.zarr_format == 2:
        if metadata.order != "C":
            return None
    else:
        serializer = array.serializer
        if type(serializer).__name__ != "BytesCodec":
            return None  # sharding, or another array-to-bytes codec
        endian = getattr(serializer.endian, "value", serializer.endian)
        if endian not in (None, "little" if np.little_endian else "big"):
            return None
    root = getattr(array.store, "root", None)
    if not isinstance(array.store, zarr.storage.LocalStore) or root is None:
        return None
    key = metadata.encode_chunk_key((0,) * len(array.shape))
    path = os.path.join(os.fspath(root), array.path, *key.split("/"))
    if file_size(path) != array.nbytes:
        return None  # not written (fill value), or not the plain bytes
    return path


class _ChunkReader:
    """The rows of an array whose chunks are runs of whole rows in files of
    a local directory, read chunk by chunk: each chunk a batch touches is
    read and decoded once, with the numcodecs codec zarr would call (blosc,
    zstd, gzip, lz4 and zlib decode without the GIL), and an absent chunk is
    the fill value, as zarr reads it.  zarr's own pipeline costs over half
    a millisecond of Python a chunk, on one event-loop thread a process;
    this costs tens of microseconds, and thread workers read in parallel."""

    def __init__(self, store, key, array):
        self.store, self.key = store, key
        self.root = os.path.join(os.fspath(array.store.root), array.path)
        metadata = array.metadata
        self.encode_key = metadata.encode_chunk_key
        self.ndim = len(array.shape)
        self.chunk_shape = tuple(int(n) for n in array.chunks)
        self.codecs, self.stored_dtype = _decoders(array)
        self.dtype = array.dtype.newbyteorder("=")
        self.fill = np.asarray(array.fill_value if array.fill_value is not None else 0,
                               dtype=self.dtype)
        self.chunk_bytes = int(np.prod(self.chunk_shape, dtype=np.int64)) * self.dtype.itemsize

    @staticmethod
    def serves(zarr, array):
        """True when the array can be read this way."""
        if not isinstance(array.store, zarr.storage.LocalStore):
            return False
        if tuple(array.chunks[1:]) != tuple(array.shape[1:]) or array.shards is not None:
            return False
        return _decoders(array) is not None

    def rows(self, unique):
        """The rows ``unique`` (sorted, distinct), in that order."""
        rows_a_chunk = self.chunk_shape[0]
        out = np.empty((len(unique),) + self.chunk_shape[1:], self.dtype)
        chunk_of = unique // rows_a_chunk
        bounds = np.flatnonzero(np.diff(chunk_of)) + 1
        starts = np.concatenate(([0], bounds))
        ends = np.concatenate((bounds, [len(unique)]))
        for start, end in zip(starts.tolist(), ends.tolist()):
            chunk = int(chunk_of[start])
            out[start:end] = self._chunk(chunk)[unique[start:end] - chunk * rows_a_chunk]
        return out

    def _chunk(self, number):
        path = os.path.join(self.root, *self.encode_key((number,) + (0,) * (self.ndim - 1))
                            .split("/"))
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return np.broadcast_to(self.fill, self.chunk_shape)
        for codec in self.codecs:
            data = codec.decode(data)
        data = memoryview(data).cast("B") if not isinstance(data, bytes) else data
        if len(data) != self.chunk_bytes:
            raise ValueError(f"chunk {number} ({path!r}) decodes to {len(data)} bytes, "
                             f"not the {self.chunk_bytes} of a {self.chunk_shape} chunk")
        chunk = np.frombuffer(data, self.stored_dtype).reshape(self.chunk_shape)
        return chunk if self.stored_dtype.isnative else chunk.astype(self.dtype)

    def __repr__(self):
        return f"_ChunkReader({self.store!r}, {self.key!r})"


# zarr v3 codecs whose chunks the numcodecs codec of the same name decodes
# (each format describes itself: no parameter is needed to decode).
_V3_DECODERS = {"ZstdCodec": "Zstd", "BloscCodec": "Blosc", "GzipCodec": "GZip"}


def _decoders(array):
    """(the numcodecs codecs that decode a chunk file, in order; the dtype
    of the decoded bytes), or None when a codec is one this reader leaves
    to zarr."""
    import numcodecs

    metadata = array.metadata
    dtype = array.dtype
    if metadata.zarr_format == 2:
        if metadata.order != "C":
            return None
        # Filters change what the bytes mean (delta, astype...): left to zarr.
        if metadata.filters:
            return None
        codecs = [metadata.compressor] if metadata.compressor is not None else []
        if not all(isinstance(c, numcodecs.abc.Codec) for c in codecs):
            return None
        return codecs, dtype
    if array.filters or type(array.serializer).__name__ != "BytesCodec":
        return None
    endian = getattr(array.serializer.endian, "value", array.serializer.endian)
    if endian is not None:
        dtype = dtype.newbyteorder("<" if endian == "little" else ">")
    codecs = []
    for codec in reversed(array.compressors):
        name = _V3_DECODERS.get(type(codec).__name__)
        if name is not None:
            codecs.append(getattr(numcodecs, name)())
        elif isinstance(getattr(codec, "_codec", None), numcodecs.abc.Codec):
            codecs.append(codec._codec)  # numcodecs.zarr3's wrappers
        else:
            return None
    return codecs, dtype
