"""Native array datasets: batches gathered in C, no Python per sample.

``ArrayDataset`` serves rows of NumPy arrays, ``np.memmap``s or ``.npy``
files (opened memory-mapped); ``TokenDataset`` serves fixed-length windows of
a flat token file, the layout language-model pre-training uses.  Both hold
only the arrays (and so the file mappings): memory does not grow with the
dataset's length or with ``num_workers``.

In a ``DataLoader`` with the default ``collate_fn`` a worker gathers a whole
batch with one call that copies the rows into the batch buffer with the GIL
released.  Outside a loader, and with a custom ``collate_fn``, they behave
as the equivalent Python datasets: ``ds[i]`` is a tuple of NumPy arrays.
"""

import os

import numpy as np

from .. import _C
from .indexing import check_index, index_array, is_index_batch, split_rows
from .native import SourceOwner

__all__ = ["ArrayDataset", "TokenDataset"]

_NPY_MAGIC = b"\x93NUMPY"


def _is_mapped(array):
    """True when the array's memory is a file mapping (worth prefetching)."""
    while array is not None:
        if isinstance(array, np.memmap):
            return True
        array = array.base if isinstance(array, np.ndarray) else None
    return False


def _mapped_file(array):
    """The file an array maps, as the gather takes it: ``(path, its size in
    bytes now)``, so that a file truncated later is named and told apart
    from one that fails to read; None for memory that is no named file's
    mapping (which the gather then does not prefetch)."""
    while array is not None:
        if isinstance(array, np.memmap):
            if array.filename is None:
                return None
            path = os.fsdecode(os.fspath(array.filename))
            try:
                size = os.stat(path).st_size
            except OSError:
                size = -1  # gone already: a later fault is reported without sizes
            return path, size
        array = array.base if isinstance(array, np.ndarray) else None
    return None


def _open_npy(path):
    """A .npy file, memory-mapped read-only; ValueError naming the file
    when it is not one NumPy can map."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            magic = f.read(len(_NPY_MAGIC))
    except OSError as e:
        raise ValueError(f"cannot open {path!r}: {e.strerror}") from e
    if magic != _NPY_MAGIC:
        raise ValueError(f"{path!r} is not a .npy file (it does not start with the .npy magic)")
    try:
        return np.load(path, mmap_mode="r", allow_pickle=False)
    except ValueError as e:
        raise ValueError(f"cannot memory-map {path!r}: {e}") from e


def _as_array(obj, position):
    if isinstance(obj, (str, bytes, os.PathLike)):
        return _open_npy(obj)
    if hasattr(obj, "numpy") and hasattr(obj, "is_cuda") and not isinstance(obj, np.ndarray):
        if obj.is_cuda:
            raise ValueError(f"array {position} is a CUDA tensor; ArrayDataset needs CPU data")
        return obj.detach().numpy()
    if isinstance(obj, np.ndarray):
        return obj
    raise TypeError(
        f"array {position}: expected a NumPy array, a tensor or a .npy path, "
        f"got {type(obj).__name__}"
    )


def _rows_contiguous(a):
    """True when each row (a[i]) is one contiguous block in C order."""
    expected = a.itemsize
    for size, stride in zip(reversed(a.shape[1:]), reversed(a.strides[1:])):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True


def _check_array(a, position):
    if a.ndim < 1:
        raise ValueError(f"array {position} is a scalar (0-d); ArrayDataset needs rows")
    if a.dtype.kind not in "biufc" or a.dtype.fields is not None:
        raise TypeError(
            f"array {position} has dtype {a.dtype}; ArrayDataset serves numeric and bool "
            "arrays only"
        )
    if not a.dtype.isnative:
        raise ValueError(
            f"array {position} has non-native byte order ({a.dtype}); convert it with "
            f"a.astype(a.dtype.newbyteorder('='))"
        )
    if not _rows_contiguous(a):
        if _is_mapped(a):
            raise ValueError(
                f"array {position} is memory-mapped and its rows are not contiguous; copying "
                "it would read the whole file into memory (write it out row-contiguous)"
            )
        a = np.ascontiguousarray(a)  # in memory: one copy, documented
    return a


class _GatheredRows(SourceOwner):
    """What both datasets share: a batch is their native source's gather
    (``self._source``, made by ``_make_sources``)."""

    def _gather(self, indices, pool, convert):
        return self._source.batch(index_array(indices), pool, convert, 0, 0)[0]

    def _native_source(self, uint8=False):
        """The loader's batch path (see fastload.datasets.native): the rows
        gathered in C into the batch slot."""
        return None if uint8 else self._source


class ArrayDataset(_GatheredRows):
    """Rows of arrays: ``ds[i] == (a[i], b[i], ...)``.

    Each argument is a NumPy array, an ``np.memmap``, a CPU tensor (used
    without copying) or the path of a ``.npy`` file (memory-mapped
    read-only).  All share their first dimension.  Rows must be contiguous
    in memory: an in-memory array with strided rows is copied once, a
    memory-mapped one is refused.

    ``ds[i]`` gives a tuple of NumPy arrays (copies of the rows);
    ``ds[[i, j, ...]]`` a tuple of batch arrays.  In a DataLoader with the
    default collate function each batch is gathered in C, with the GIL
    released, straight into the batch buffer: a list of one ``(B, *row)``
    batch per array, as torch's DataLoader gives for a ``TensorDataset``.
    """

    def __init__(self, *arrays):
        if not arrays:
            raise ValueError("ArrayDataset needs at least one array")
        checked = []
        for position, obj in enumerate(arrays):
            checked.append(_check_array(_as_array(obj, position), position))
        lengths = [len(a) for a in checked]
        if len(set(lengths)) > 1:
            detail = ", ".join(f"array {i}: {n}" for i, n in enumerate(lengths))
            raise ValueError(f"ArrayDataset arrays differ in length ({detail})")
        self.arrays = tuple(checked)
        self._files = tuple(_mapped_file(a) for a in checked)
        self._length = lengths[0]
        self._make_sources()

    def _make_sources(self):
        self._source = _C.RowSource(self.arrays, self._files)

    def __len__(self):
        return self._length

    def __getitem__(self, index):
        # Every read goes through the C gather, whose bus-error guard turns
        # a mapped file cut short into OSError (NumPy indexing the mapping
        # itself would die of SIGBUS).
        if is_index_batch(index):
            return tuple(self._gather(index, None, None))
        if isinstance(index, slice):
            return tuple(self._gather(np.arange(*index.indices(self._length)), None, None))
        i = check_index(index, self._length)
        return tuple(rows[0, ...] for rows in self._gather([i], None, None))  # 0-d, not scalars

    def __getitems__(self, indices):
        return split_rows(self._gather(indices, None, None))

    def __repr__(self):
        shapes = ", ".join(f"{a.dtype}{list(a.shape[1:])}" for a in self.arrays)
        return f"ArrayDataset({self._length} rows of {shapes})"


class TokenDataset(_GatheredRows):
    """Windows of a flat token sequence for language-model training.

    ``path_or_array`` is a raw token file (the ``train.bin`` layout: tokens
    of ``dtype``, default uint16, back to back; memory-mapped), a ``.npy``
    file, or a 1-d integer array.  Sample i is ``(x, y)`` with
    ``x = tokens[s : s + block_size]`` and ``y = tokens[s + 1 : s + block_size + 1]``,
    ``s = i * stride`` (``stride`` defaults to ``block_size``), both widened
    to int64.  ``len()`` is the number of complete windows.  With
    ``shuffle=True`` in the loader, windows come in random order.
    """

    _DTYPES = ("uint8", "int8", "uint16", "int16", "uint32", "int32", "int64")

    def __init__(self, path_or_array, block_size, dtype=None, stride=None):
        if isinstance(path_or_array, (str, bytes, os.PathLike)):
            tokens = self._open(os.fspath(path_or_array), dtype)
            where = repr(os.fspath(path_or_array))
        else:
            tokens = _as_array(path_or_array, 0)
            if dtype is not None and np.dtype(dtype) != tokens.dtype:
                raise ValueError(f"dtype={np.dtype(dtype)} but the array holds {tokens.dtype}")
            where = "the token array"
        if tokens.ndim != 1:
            raise ValueError(f"{where} must be 1-d, got shape {tokens.shape}")
        if tokens.dtype.name not in self._DTYPES or not tokens.dtype.isnative:
            raise TypeError(
                f"{where} holds {tokens.dtype}; tokens must be one of {', '.join(self._DTYPES)}"
            )
        if not tokens.flags.c_contiguous:
            if _is_mapped(tokens):
                raise ValueError(f"{where} is memory-mapped and not contiguous")
            tokens = np.ascontiguousarray(tokens)
        block_size = _positive_int(block_size, "block_size")
        stride = block_size if stride is None else _positive_int(stride, "stride")
        if len(tokens) < block_size + 1:
            raise ValueError(
                f"block_size={block_size} needs at least {block_size + 1} tokens, "
                f"but {where} has {len(tokens)}"
            )
        self.tokens = tokens
        self.block_size = block_size
        self.stride = stride
        self._file = _mapped_file(tokens)
        self._length = (len(tokens) - 1 - block_size) // stride + 1
        self._make_sources()

    def _make_sources(self):
        self._source = _C.WindowSource(self.tokens, self._file, self.stride, self.block_size)

    @staticmethod
    def _open(path, dtype):
        try:
            with open(path, "rb") as f:
                magic = f.read(len(_NPY_MAGIC))
            size = os.path.getsize(path)
        except OSError as e:
            raise ValueError(f"cannot open {path!r}: {e.strerror}") from e
        if magic == _NPY_MAGIC:
            tokens = _open_npy(path)
            if dtype is not None and np.dtype(dtype) != tokens.dtype:
                raise ValueError(f"dtype={np.dtype(dtype)} but {path!r} holds {tokens.dtype}")
            return tokens
        dtype = np.dtype(np.uint16 if dtype is None else dtype)
        if size % dtype.itemsize:
            raise ValueError(
                f"{path!r} has {size} bytes, not a whole number of {dtype} tokens "
                f"({dtype.itemsize} bytes each)"
            )
        if size == 0:
            raise ValueError(f"{path!r} is empty")
        return np.memmap(path, dtype=dtype, mode="r")

    def __len__(self):
        return self._length

    def __getitem__(self, index):
        if is_index_batch(index):
            return tuple(self._gather(index, None, None))
        x, y = self._gather([check_index(index, self._length)], None, None)
        return x[0], y[0]

    def __getitems__(self, indices):
        return split_rows(self._gather(indices, None, None))

    def __repr__(self):
        return (f"TokenDataset({self._length} windows of {self.block_size}+1 "
                f"{self.tokens.dtype} tokens, stride {self.stride})")


_INT64_MAX = 2**63 - 1


def _positive_int(value, name):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if value > _INT64_MAX:
        raise ValueError(f"{name}={value} is too large (at most 2**63 - 1)")
    return int(value)
