"""default_collate and default_convert: torch's rules, for torch or NumPy output.

The rules are torch's, case for case: tensors and arrays are stacked along a
new first axis, NumPy scalars and Python numbers become 1-d batches (floats
as float64, ints as int64, bools as bool), str and bytes stay lists,
mappings, namedtuples and sequences are collated field by field (tuples turn
into lists), and anything else is a TypeError.  With the NumPy backend every
result equals ``torch_result.numpy()`` — same dtypes, shapes and containers —
and the errors have torch's types.

The loader first tries ``_C.collate``, which applies the same rules in C with
the GIL released for the common cases, and falls back to this module.
"""

import collections.abc
import copy
import re

import numpy as np

from .. import _C
from .._torch import is_tensor, torch
from . import torch_compat as _torch_compat

_STR_OR_OBJECT_DTYPE = re.compile("[SaUO]")

default_collate_err_msg_format = (
    "default_collate: batch must contain tensors, numpy arrays, numbers, "
    "dicts or lists; found {}"
)


class _TorchBackend:
    name = "torch"

    @staticmethod
    def stack(batch):
        elem = batch[0]
        if elem.is_nested:
            raise RuntimeError(
                "Batches of nested tensors are not currently supported by the default "
                "collate_fn; please provide a custom collate_fn to handle them appropriately."
            )
        if elem.layout in _sparse_layouts():
            raise RuntimeError(
                "Batches of sparse tensors are not currently supported by the default "
                "collate_fn; please provide a custom collate_fn to handle them appropriately."
            )
        return torch.stack(batch, 0)

    as_array = staticmethod(lambda x: torch.as_tensor(x))

    @staticmethod
    def from_floats(batch):
        return torch.tensor(batch, dtype=torch.float64)

    @staticmethod
    def from_ints(batch):
        return torch.tensor(batch)


class _NumpyBackend:
    name = "numpy"

    @staticmethod
    def stack(batch):
        arrays = [_numpy_of(b) for b in batch]
        first = arrays[0].shape
        for i, a in enumerate(arrays):
            if a.shape != first:
                raise RuntimeError(
                    "stack expects each tensor to be equal size, but got "
                    f"{list(first)} at entry 0 and {list(a.shape)} at entry {i}"
                )
        return np.stack(arrays, 0)

    @staticmethod
    def as_array(x):
        arr = np.asarray(x)
        if _STR_OR_OBJECT_DTYPE.search(arr.dtype.str):
            raise TypeError(f"can't convert np.ndarray of type {arr.dtype}.")
        if arr.dtype.byteorder not in "=|":
            raise ValueError(
                "given numpy array has byte order different from the native byte order. "
                "Conversion between byte orders is currently not supported."
            )
        return arr

    @staticmethod
    def from_floats(batch):
        return np.array(batch, dtype=np.float64)

    @staticmethod
    def from_ints(batch):
        # torch.tensor's inference: any float -> float32 (torch's default
        # dtype), any complex -> complex64, all bools -> bool, else int64.
        if any(isinstance(x, complex) for x in batch):
            return np.array(batch, dtype=np.complex64)
        if any(isinstance(x, float) for x in batch):
            return np.array(batch, dtype=np.float32)
        if all(isinstance(x, bool) for x in batch):
            return np.array(batch, dtype=np.bool_)
        for x in batch:
            if not -(2**63) <= x < 2**63:
                raise ValueError("Overflow when unpacking long long")
        return np.array(batch, dtype=np.int64)


def _numpy_of(x):
    return x.numpy() if is_tensor(x) else np.asarray(x)


def _sparse_layouts():
    # Read when a tensor is stacked, torch imported by then (fastload/_torch.py).
    return (
        torch.sparse_coo,
        torch.sparse_csr,
        torch.sparse_bsr,
        torch.sparse_csc,
        torch.sparse_bsc,
    )


TORCH = _TorchBackend() if torch is not None else None
NUMPY = _NumpyBackend()


def backend_for(output):
    """The collate backend for a loader's ``output`` ("torch" or "numpy")."""
    return TORCH if output == "torch" else NUMPY


def collate(batch, backend):
    """torch's default_collate rules, producing the backend's array type."""
    elem = batch[0]
    elem_type = type(elem)
    if is_tensor(elem):
        return backend.stack(batch)
    if isinstance(elem, np.ndarray):
        if _STR_OR_OBJECT_DTYPE.search(elem.dtype.str) is not None:
            raise TypeError(default_collate_err_msg_format.format(elem.dtype))
        return backend.stack([backend.as_array(b) for b in batch])
    if isinstance(elem, (np.bool_, np.number, np.object_)):
        return backend.as_array(batch)
    if isinstance(elem, float):
        return backend.from_floats(batch)
    if isinstance(elem, int):
        return backend.from_ints(batch)
    if isinstance(elem, (str, bytes)):
        return batch
    if isinstance(elem, collections.abc.Mapping):
        fields = {key: collate([d[key] for d in batch], backend) for key in elem}
        return _rebuild_mapping(elem, fields)
    if isinstance(elem, tuple) and hasattr(elem, "_fields"):  # namedtuple
        return elem_type(*(collate(samples, backend) for samples in zip(*batch)))
    if isinstance(elem, collections.abc.Sequence):
        size = len(elem)
        if any(len(e) != size for e in batch):
            raise RuntimeError("each element in list of batch should be of equal size")
        # Each column is a tuple, as in torch: a column of str stays a tuple.
        columns = [collate(samples, backend) for samples in zip(*batch)]
        if isinstance(elem, tuple):
            return columns
        return _rebuild_sequence(elem, columns)
    raise TypeError(default_collate_err_msg_format.format(elem_type))


def convert(data, backend):
    """torch's default_convert rules (used when automatic batching is off)."""
    elem_type = type(data)
    if is_tensor(data):
        return data if backend is TORCH else data.numpy()
    if elem_type.__module__ == "numpy" and elem_type.__name__ not in ("str_", "string_"):
        if elem_type.__name__ == "ndarray" and _STR_OR_OBJECT_DTYPE.search(data.dtype.str):
            return data
        return backend.as_array(data)
    if isinstance(data, collections.abc.Mapping):
        return _rebuild_mapping(data, {key: convert(data[key], backend) for key in data})
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return elem_type(*(convert(d, backend) for d in data))
    if isinstance(data, tuple):
        return [convert(d, backend) for d in data]
    if isinstance(data, collections.abc.Sequence) and not isinstance(data, (str, bytes)):
        return _rebuild_sequence(data, [convert(d, backend) for d in data])
    return data


def _rebuild_mapping(template, fields):
    """A mapping of template's type holding `fields` (a plain dict when that
    type cannot be rebuilt)."""
    try:
        if isinstance(template, collections.abc.MutableMapping):
            clone = copy.copy(template)
            clone.update(fields)
            return clone
        return type(template)(fields)
    except TypeError:
        return fields


def _rebuild_sequence(template, items):
    """A sequence of template's type holding `items` (a list when that type
    cannot be rebuilt)."""
    try:
        if isinstance(template, collections.abc.MutableSequence):
            clone = copy.copy(template)
            for i, item in enumerate(items):
                clone[i] = item
            return clone
        return type(template)(items)
    except TypeError:
        return items


def default_collate(batch):
    """Collates a list of samples into a batch, by torch's rules.

    Gives torch tensors when torch is installed, NumPy arrays otherwise.
    """
    return collate(batch, TORCH or NUMPY)


def default_convert(data):
    """Converts NumPy arrays and scalars in a sample to tensors, by torch's
    rules (to NumPy arrays when torch is not installed)."""
    return convert(data, TORCH or NUMPY)


# ------------------------------------------- the loader's collate wrappers


def output_converter(output):
    """What turns a slot's NumPy array into ``output``'s type: torch's
    from_numpy for "torch", None (the array as it is) for "numpy"."""
    return torch.from_numpy if output == "torch" and torch is not None else None


class SlotCollate:
    """default_collate for a worker: stacks in C into the worker's slots
    when the samples allow it, else applies the same rules in Python.
    ``convert`` turns slot arrays into the output type (output_converter);
    a process worker passes None and its parent converts."""

    def __init__(self, pool, backend, convert):
        self.pool = pool
        self.backend = backend
        self.to_output = convert

    def __call__(self, samples):
        if type(samples) is list:
            batch = _C.collate(samples, self.pool, self.to_output)
            if batch is not NotImplemented:
                return batch
        return collate(samples, self.backend)


class Convert:
    def __init__(self, backend):
        self.backend = backend

    def __call__(self, sample):
        return convert(sample, self.backend)


def collation(loader):
    """How the loader's workers collate: "default" or "convert" where
    fastload's fast paths stand in for the default functions (torch's
    included), which they reproduce; else the user's collate_fn."""
    fn = loader.collate_fn
    if fn is default_collate or fn is _torch_compat.torch_default_collate():
        return "default"
    if fn is default_convert or fn is _torch_compat.torch_default_convert():
        return "convert"
    return fn


class StepIntoSlots:
    """A batch_transform in a worker process whose batches the parent
    converts: arrays the step made afresh (soft labels, say) are copied into
    this worker's shared slots too, so the parent converts them as it does
    the collated ones (a fresh array would arrive as NumPy)."""

    def __init__(self, step, pool):
        self.step = step
        self.pool = pool

    def _into_slot(self, value):
        if isinstance(value, np.ndarray) and value.base is None and value.ndim >= 1 \
                and len(value) > 0:
            stacked = _C.collate(list(value), self.pool, None)
            if stacked is not NotImplemented:
                return stacked
        return value

    def __call__(self, batch, seed, epoch, number):
        batch = self.step(batch, seed, epoch, number)
        if isinstance(batch, (list, tuple)) and not hasattr(batch, "_fields"):
            return type(batch)(self._into_slot(v) for v in batch)
        return batch
