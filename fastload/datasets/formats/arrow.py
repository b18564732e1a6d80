"""ArrowDataset: the fixed-width columns of an Arrow table as the columns
of a map-style dataset.

An Arrow IPC file (Feather v2) is memory-mapped; a column of fixed-width
numbers, or of fixed-size lists of them, stored as one chunk without nulls
is then a NumPy view of the mapping (no copy) whose rows are gathered in C
with the GIL released, as ``ArrayDataset`` gathers a ``.npy`` file's.  A
column split over several record batches is concatenated into memory
once, when the dataset is made.  Parquet is encoded, so
``ArrowDataset.from_parquet`` decodes the columns into memory, row group by
row group.
"""

import os

import numpy as np

from ... import _C
from ._common import MAX_COLUMNS, RowsDataset, file_size, hf_table, is_hf_dataset, require

__all__ = ["ArrowDataset"]



class ArrowDataset(RowsDataset):
    """Rows of an Arrow table's columns: ``ds[i] == (column[i] for each column)``.

    ``path_or_table`` is the path of an Arrow IPC file (Feather v2; opened
    memory-mapped), a ``pyarrow.Table`` or a ``pyarrow.RecordBatch``.  A
    Hugging Face ``datasets.Dataset`` is used as its table (memory-mapped
    from the cache files), its rows put in the order of the indices
    mapping ``select``/``shuffle``/``filter`` leave, if any (a copy of the
    rows, made once).  ``columns``
    picks and orders the columns (default: all of them).

    Each column must hold integers, floats or bools, or fixed-size lists of
    them (nested lists give more dimensions: a ``(H, W, C)`` image is a
    list of lists of lists), and no nulls; other types are refused, naming
    the column.  A single-chunk numeric column is used in place (bools are
    bit-packed in Arrow, so they are unpacked into memory; a column of
    several chunks is concatenated into memory once).

    ``ds[i]`` gives a tuple of NumPy arrays; in a DataLoader with the
    default collate function each batch is gathered in C into the batch
    buffer: a list of one ``(B, *row)`` array per column.
    """

    def __init__(self, path_or_table, columns=None):
        pa = require("pyarrow", "ArrowDataset")
        if isinstance(path_or_table, (str, bytes, os.PathLike)):
            path = os.fsdecode(os.fspath(path_or_table))
            self._setup(_open_ipc(pa, path), columns, path)
        elif isinstance(path_or_table, pa.RecordBatch):
            self._setup(pa.Table.from_batches([path_or_table]), columns, None)
        elif isinstance(path_or_table, pa.Table):
            self._setup(path_or_table, columns, None)
        elif is_hf_dataset(path_or_table):
            table, indices, _ = hf_table(path_or_table)
            if columns is not None:  # only the columns used are reordered
                table = table.select([columns] if isinstance(columns, str) else list(columns))
            self._setup(table if indices is None else table.take(indices), columns, None)
        else:
            raise TypeError("ArrowDataset takes the path of an Arrow IPC file, a pyarrow.Table, "
                            "a pyarrow.RecordBatch or a Hugging Face datasets.Dataset, got "
                            f"{type(path_or_table).__name__}")

    @classmethod
    def from_parquet(cls, path, columns=None):
        """``from_parquet(path, columns=None) -> ArrowDataset``

        The columns of a Parquet file, decoded into memory row group by
        row group (Parquet pages are encoded and compressed, so they cannot
        be mapped): each column costs its full size in memory once, with no
        second copy.  Column types follow the rules of ``ArrowDataset``."""
        pq = require("pyarrow.parquet", "ArrowDataset.from_parquet")
        path = os.fsdecode(os.fspath(path))
        try:
            parquet = pq.ParquetFile(path)
        except FileNotFoundError as e:
            raise ValueError(f"cannot open {path!r}: no such file") from e
        except Exception as e:  # noqa: BLE001 (pyarrow raises ArrowInvalid, OSError)
            raise ValueError(f"cannot read {path!r} as a Parquet file: {e}") from e
        schema = parquet.schema_arrow
        where = repr(path)
        names = _check_columns(columns, schema.names, where)
        length = parquet.metadata.num_rows
        arrays = []
        for name in names:
            tail, dtype = _fixed_shape(schema.field(name).type, name, where)
            arrays.append(np.empty((length,) + tail, dtype))
        start = 0
        for group in range(parquet.num_row_groups):
            try:
                table = parquet.read_row_group(group, columns=list(names))
            except Exception as e:  # noqa: BLE001
                raise ValueError(f"cannot read row group {group} of {path!r}: {e}") from e
            for name, out in zip(names, arrays):
                _fill(out, start, table.column(name), name, where)
            start += table.num_rows
        if start != length:
            raise ValueError(f"{where}: its row groups hold {start} rows, its footer says "
                             f"{length}")
        self = cls.__new__(cls)
        self.path = None
        self.columns = names
        self._table = None
        self._arrays = tuple(arrays)
        self._files = (None,) * len(arrays)
        self._finish()
        return self

    def _setup(self, table, columns, path):
        self.path = path
        self._table = None if path is not None else table  # pickled when there is no file
        where = repr(path) if path is not None else "the table"
        self.columns = _check_columns(columns, table.column_names, where)
        arrays, files = [], []
        mapped = (path, file_size(path)) if path is not None else None
        for name in self.columns:
            array, in_place = _column(table.column(name), name, where)
            arrays.append(array)
            files.append(mapped if in_place else None)
        self._arrays = tuple(arrays)
        self._files = tuple(files)
        self._finish()

    def _finish(self):
        self._length = len(self._arrays[0]) if self._arrays else 0
        self._names = self.columns
        self._gathered = tuple(range(len(self.columns)))
        self._native = True
        self._make_sources()

    def _make_sources(self):
        self._source = _C.RowSource(self._arrays, self._files)

    def __getstate__(self):
        state = self.__dict__.copy()
        del state["_source"]
        if self.path is not None:  # a file: each process maps it again
            del state["_arrays"], state["_files"]
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        if self.path is not None:
            pa = require("pyarrow", "ArrowDataset")
            self._setup(_open_ipc(pa, self.path), self.columns, self.path)
        else:
            self._make_sources()

    def __repr__(self):
        shapes = ", ".join(f"{name}: {a.dtype}{list(a.shape[1:])}"
                           for name, a in zip(self.columns, self._arrays))
        where = f"{self.path!r}, " if self.path is not None else ""
        return f"ArrowDataset({where}{self._length} rows of {shapes})"


def _open_ipc(pa, path):
    """The table of an Arrow IPC file, memory-mapped (its buffers point into
    the mapping unless the file is compressed)."""
    import pyarrow.ipc  # noqa: F401 (the submodule; pyarrow is installed)

    try:
        source = pa.memory_map(path, "r")
    except FileNotFoundError as e:
        raise ValueError(f"cannot open {path!r}: no such file") from e
    except OSError as e:
        raise ValueError(f"cannot open {path!r}: {e}") from e
    try:
        return pa.ipc.open_file(source).read_all()
    except Exception as e:  # noqa: BLE001 (pyarrow raises ArrowInvalid, OSError)
        raise ValueError(f"cannot read {path!r} as an Arrow IPC (Feather v2) file: {e}") from e


def _check_columns(columns, available, where):
    if columns is None:
        names = tuple(available)
    else:
        names = (columns,) if isinstance(columns, str) else tuple(columns)
        for name in names:
            if not isinstance(name, str):
                raise TypeError(f"ArrowDataset columns must be strings, got {name!r}")
            if name not in available:
                raise KeyError(f"{where} has no column {name!r} (its columns: "
                               f"{', '.join(repr(n) for n in available) or 'none'})")
        if len(set(names)) != len(names):
            raise ValueError(f"ArrowDataset columns repeat: {names!r}")
    if not names:
        raise ValueError(f"{where} has no columns to serve")
    if len(set(available)) != len(available):
        raise ValueError(f"{where} has columns of the same name; pick them with columns=")
    if len(names) > MAX_COLUMNS:
        raise ValueError(f"ArrowDataset serves at most {MAX_COLUMNS} columns, {where} has "
                         f"{len(names)}: pick some with columns=")
    return names


def _fixed_shape(arrow_type, name, where):
    """(row shape, NumPy dtype) of a column type the gather serves;
    TypeError naming the column otherwise."""
    import pyarrow as pa

    tail = []
    leaf = arrow_type
    while pa.types.is_fixed_size_list(leaf):
        tail.append(leaf.list_size)
        leaf = leaf.value_type
    if pa.types.is_boolean(leaf):
        return tuple(tail), np.dtype(np.bool_)
    if pa.types.is_integer(leaf) or pa.types.is_floating(leaf):
        return tuple(tail), np.dtype(leaf.to_pandas_dtype())
    raise TypeError(f"{where}: column {name!r} has type {arrow_type}; ArrowDataset serves "
                    "integer, float and bool columns and fixed-size lists of them")


def _values(chunk, name, where):
    """A chunk's values as a flat NumPy array: a view of its buffer when
    they are numbers (so of the mapping, for a mapped file), a copy for
    bools."""
    import pyarrow as pa

    if chunk.null_count:
        raise ValueError(f"{where}: column {name!r} has {chunk.null_count} nulls; "
                         "ArrowDataset serves columns without nulls")
    if pa.types.is_fixed_size_list(chunk.type):
        return _values(chunk.flatten(), name, where)
    if pa.types.is_boolean(chunk.type):
        return chunk.to_numpy(zero_copy_only=False)
    return chunk.to_numpy(zero_copy_only=True)


def _chunk_rows(chunk, tail, name, where):
    return _values(chunk, name, where).reshape((len(chunk),) + tail)


def _column(chunked, name, where):
    """(the column as an array of rows, whether it is a view of the
    table's own buffer)."""
    tail, dtype = _fixed_shape(chunked.type, name, where)
    if chunked.num_chunks == 1:
        rows = _chunk_rows(chunked.chunk(0), tail, name, where)
        return rows, dtype != np.bool_
    out = np.empty((len(chunked),) + tail, dtype)
    _fill(out, 0, chunked, name, where)
    return out, False


def _fill(out, start, chunked, name, where):
    """Copies a column's chunks into ``out`` from row ``start`` on."""
    tail = out.shape[1:]
    for chunk in chunked.chunks:
        rows = _chunk_rows(chunk, tail, name, where)
        dst = out[start:start + len(chunk)]
        if rows.dtype == dst.dtype and rows.flags.c_contiguous and dst.flags.c_contiguous:
            # A view of a mapped file: copied under the C bus-error guard,
            # so a file cut short raises OSError naming it, not SIGBUS.
            _C.copy_mapped(rows, dst, f"column {name!r}")
        else:
            dst[...] = rows
        start += len(chunk)
