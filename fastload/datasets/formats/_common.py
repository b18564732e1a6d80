"""What the format datasets share: importing their library on first use,
and the row-gather plumbing of fastload.arrays."""

import importlib
import os

import numpy as np

from ..native import SourceOwner
from ..cache import SampleCache
from ..indexing import check_index, checked_index_array, index_array, is_index_batch, split_rows

__all__ = ["require", "file_size", "RowsDataset"]


def require(module, needed_by):
    """Import ``module`` (e.g. "h5py"); ImportError saying what to install
    when it is missing."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        package = module.split(".")[0]
        raise ImportError(
            f"{needed_by} needs the {package} package: pip install {package} "
            '(or pip install "fastload-torch[formats]")'
        ) from e


MAX_COLUMNS = 32  # the C gather serves up to this many arrays


def check_keys(keys, owner):
    """`keys` (a name or names) as a tuple of distinct strings the C gather
    can serve, else TypeError/ValueError naming `owner` (the class)."""
    keys = (keys,) if isinstance(keys, str) else tuple(keys)
    if not keys:
        raise ValueError(f"{owner} needs at least one key")
    for key in keys:
        if not isinstance(key, str):
            raise TypeError(f"{owner} keys must be strings, got {key!r}")
    if len(set(keys)) != len(keys):
        raise ValueError(f"{owner} keys repeat: {keys!r}")
    if len(keys) > MAX_COLUMNS:
        raise ValueError(f"{owner} serves at most {MAX_COLUMNS} keys, got {len(keys)}")
    return keys


def names_shown(names):
    """The first names of a file's contents, for an error message."""
    shown = ", ".join(repr(n) for n in names[:20]) + (", ..." if len(names) > 20 else "")
    return shown or "none"


def file_size(path):
    """The file's size in bytes now; -1 when it cannot be told."""
    try:
        return os.stat(path).st_size
    except OSError:
        return -1


def read_distinct_rows(layout, indices, read):
    """Rows `indices` of a key read from its file by `read(unique)`, which
    gets the sorted distinct indices (one read a batch, however the batch
    repeats or orders them); the rows come back in `indices`' order and in
    native byte order."""
    native = layout.dtype.newbyteorder("=")
    if len(indices) == 0:
        return np.empty((0,) + layout.shape[1:], native)
    unique, inverse = np.unique(indices, return_inverse=True)
    rows = np.asarray(read(unique))
    if len(unique) != len(indices) or not np.array_equal(unique, indices):
        rows = rows[inverse.reshape(-1)]
    return rows if rows.dtype.isnative else rows.astype(native)


def is_run(unique):
    """Whether sorted distinct indices are consecutive: one slice reads them."""
    return unique[-1] - unique[0] + 1 == len(unique)


def describe_layouts(layouts):
    """'key: dtype[row shape] storage, ...' for a dataset's repr."""
    return ", ".join(f"{layout.key}: {layout.dtype.newbyteorder('=')}{list(layout.shape[1:])}"
                     f" {layout.storage}" for layout in layouts)


class RowsDataset(SourceOwner):
    """A dataset whose sample i is ``(column[i] for each column)``.

    Subclasses set ``_length`` and ``_names`` and make, in
    ``_make_sources()``, ``_source``: a ``_C.RowSource`` over the columns
    the C gather serves (all of them when ``_native`` is True), or None.
    ``_read_rows(position, indices)`` reads the other columns for a batch.
    """

    _native = False
    _gathered = ()  # positions of the columns _source serves, in its order
    cache = None  # SampleCache of the rows read (not gathered), or None
    _cache_first = {}  # position -> the cache entry of its row 0

    def _native_source(self, uint8=False):
        """The loader's batch path (fastload.datasets.native): the rows gathered in
        C into the batch slot, when every column is a plain mapping."""
        return self._source if self._native and not uint8 else None

    def __len__(self):
        return self._length

    def _batch(self, indices):
        """Each column's rows ``indices`` as one array, in column order."""
        if self._native:
            return self._source.batch(index_array(indices), None, None, 0, 0)[0]
        indices = checked_index_array(indices, self._length)
        out = [None] * len(self._names)
        if self._gathered:
            for position, rows in zip(self._gathered,
                                      self._source.batch(indices, None, None, 0, 0)[0]):
                out[position] = rows
        for position in range(len(out)):
            if out[position] is None:
                out[position] = self._read_through_cache(position, indices)
        return out

    def _open_cache(self, cache, cache_size, files):
        """Sets ``cache``: the rows of the columns read (not gathered) kept,
        as first read, in a SampleCache (``fastload.cache``), one entry a
        row; ``files`` are what the data is read from (the key hashes their
        size and modification time)."""
        read = [p for p in range(len(self._names)) if p not in self._gathered]
        if cache is not None and not read:
            raise ValueError(f"cache= keeps the rows read and decoded, but every key of "
                             f"{self!r} is memory-mapped: the page cache already keeps them")
        layouts = [self._layouts[p] for p in read]
        row_bytes = [layout.dtype.itemsize * int(np.prod(layout.shape[1:], dtype=np.int64))
                     for layout in layouts]
        described = repr([(type(self).__name__, layout.key, layout.dtype.str, layout.shape)
                          for layout in layouts])
        self.cache = SampleCache.for_rows(cache, cache_size, files, described,
                                          len(read) * self._length,
                                          sum(row_bytes) * self._length)
        self._cache_first = {p: slot * self._length for slot, p in enumerate(read)}

    def _read_through_cache(self, position, indices):
        """``_read_rows`` with the cache: the rows it holds copied from it,
        the others read and stored."""
        if self.cache is None:
            return self._read_rows(position, indices)
        layout = self._layouts[position]
        first = self._cache_first[position]
        rows = np.empty((len(indices),) + layout.shape[1:], layout.dtype.newbyteorder("="))
        found = self.cache._native.read_rows(first, indices, rows)
        if not found.all():
            missing = indices[~found]
            read = np.ascontiguousarray(self._read_rows(position, missing), rows.dtype)
            rows[~found] = read
            self.cache._native.write_rows(first, missing, read)
        return rows

    def __getitem__(self, index):
        if is_index_batch(index):
            return tuple(self._batch(index))
        if isinstance(index, slice):
            return tuple(self._batch(np.arange(*index.indices(self._length))))
        i = check_index(index, self._length)
        return tuple(rows[0, ...] for rows in self._batch([i]))

    def __getitems__(self, indices):
        return split_rows(self._batch(indices))


def is_hf_dataset(obj):
    """Whether ``obj`` is a Hugging Face ``datasets.Dataset`` (checked without
    importing ``datasets``)."""
    return type(obj).__module__.split(".")[0] == "datasets" and hasattr(obj, "_indices")


def hf_table(dataset):
    """(pyarrow table, row of each sample or None, name) of a Hugging Face
    Dataset: ``select``, ``shuffle`` and ``filter`` leave an indices mapping
    over the table rather than a new table."""
    table = dataset.data.table  # datasets.table.Table wraps the pyarrow one
    indices = None
    if dataset._indices is not None:
        indices = np.asarray(dataset._indices.column(0).to_numpy(), np.int64)
    name = getattr(dataset.info, "dataset_name", None) or "Hugging Face dataset"
    return table, indices, name
