"""Index handling shared by the datasets: one index or a batch of them,
checked against the dataset's length as Python sequences are."""

import numpy as np


def is_index_batch(index):
    """True for a sequence of indices (a list, or an array or tensor with
    at least one dimension), False for one index."""
    if isinstance(index, (list, tuple)):
        return True
    return hasattr(index, "__array__") and np.ndim(index) >= 1


def split_rows(batch):
    """One batch gather as a list of samples: row views (0-d arrays, not
    NumPy scalars, for 1-d arrays, as ds[i] gives)."""
    return [tuple(b[j, ...] for b in batch) for j in range(len(batch[0]))]


def index_array(indices):
    """Lists, tuples and integer arrays go to C as they are; anything else
    with __array__ (a tensor of indices) becomes an array first."""
    if isinstance(indices, (list, tuple, np.ndarray)):
        return indices
    return np.asarray(indices)


def check_index(index, length):
    """``index`` as a non-negative int below ``length`` (negative ones count
    from the end); TypeError or IndexError as a list gives."""
    try:
        i = index.__index__()
    except AttributeError:
        raise TypeError(f"dataset indices must be integers, not {type(index).__name__}") from None
    if not -length <= i < length:
        raise IndexError(f"index {i} is out of range for a dataset of {length} samples")
    return i + length if i < 0 else i


def checked_index_array(indices, length):
    """A batch of indices as int64 with negatives resolved; IndexError
    naming an index out of range, TypeError for a non-integer."""
    indices = index_array(indices)
    if isinstance(indices, (list, tuple)):
        indices = [check_index(i, length) for i in indices]
        return np.asarray(indices, dtype=np.int64).reshape(-1)
    if indices.dtype.kind not in "iu":
        raise TypeError(f"dataset indices must be integers, not {indices.dtype}")
    indices = indices.astype(np.int64).reshape(-1)
    bad = (indices < -length) | (indices >= length)
    if bad.any():
        raise IndexError(f"index {indices[bad][0]} is out of range for a dataset of "
                         f"{length} samples")
    return np.where(indices < 0, indices + length, indices)
