"""Exact comparison of batches as NumPy trees; usable without torch."""

import sys

import numpy as np


def as_numpy(batch):
    """The batch with every torch tensor replaced by its NumPy array."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(batch, torch.Tensor):
        return batch.numpy()
    if isinstance(batch, dict):
        return {k: as_numpy(v) for k, v in batch.items()}
    if isinstance(batch, list):
        return [as_numpy(v) for v in batch]
    if isinstance(batch, tuple):
        return tuple(as_numpy(v) for v in batch)
    return batch


def assert_same_numpy(got, want, path="batch"):
    """Same container types, keys, dtypes, shapes and values, all the way down."""
    assert type(got) is type(want), f"{path}: {type(got)} != {type(want)}"
    if isinstance(want, np.ndarray):
        assert (got.dtype, got.shape) == (want.dtype, want.shape), path
        np.testing.assert_array_equal(got, want, err_msg=path)
    elif isinstance(want, dict):
        assert list(got) == list(want), path
        for k in want:
            assert_same_numpy(got[k], want[k], f"{path}[{k!r}]")
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want), path
        for i, (g, w) in enumerate(zip(got, want)):
            assert_same_numpy(g, w, f"{path}[{i}]")
    else:
        assert got == want, path
