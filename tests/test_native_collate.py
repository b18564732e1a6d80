"""_C.collate (the GIL-free path) against torch's default_collate, and the
lifetime of the batch buffers it fills."""

import gc
import sys

import numpy as np
import pytest

from fastload import _C
from fastload.loader.collate import NUMPY, collate
from np_compare import as_numpy

torch = pytest.importorskip("torch")
from fl_helpers import assert_same  # noqa: E402
from torch.utils.data import default_collate as torch_collate  # noqa: E402


def make(kind, i):
    rng = np.random.default_rng(i)
    if kind == "array":
        return rng.standard_normal((3, 4)).astype(np.float32)
    if kind == "pair":
        return rng.integers(0, 255, (2, 5), dtype=np.uint8), int(i)
    if kind == "dict":
        return {"x": rng.standard_normal(3), "y": float(i) / 3, "flag": i % 2 == 0, "name": f"s{i}"}
    if kind == "nested":
        return [(np.int16(i), np.float32(i) / 2), {"t": torch.arange(3) * i, "b": b"raw"}]
    if kind == "strided":
        return np.arange(40, dtype=np.int32).reshape(5, 8)[::2, 1::3] + i
    if kind == "scalar0d":
        return np.array(i, dtype=np.float64)
    if kind == "complex":
        return (rng.standard_normal(2) + 1j * rng.standard_normal(2)).astype(np.complex64)
    if kind == "empty":
        return np.zeros((0, 3), dtype=np.float32)
    if kind == "tuple_of_str":
        return (f"p{i}", np.float16(i))
    if kind == "all_dtypes":
        return tuple(np.arange(3).astype(t) for t in
                     ("?", "i1", "u1", "i2", "u2", "i4", "u4", "i8", "u8", "f2", "f4", "f8", "c16"))
    raise AssertionError(kind)


KINDS = ["array", "pair", "dict", "nested", "strided", "scalar0d", "complex", "empty",
         "tuple_of_str", "all_dtypes"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("batch_size", [1, 5])
def test_native_path_matches_torch(kind, batch_size):
    samples = [make(kind, i) for i in range(batch_size)]
    pool = _C.SlotPool()
    got = _C.collate(samples, pool, torch.from_numpy)
    assert got is not NotImplemented, "these samples are within the native rules"
    assert_same(got, torch_collate(samples))
    # And the NumPy output of the same path equals torch's result as NumPy.
    assert_same(_C.collate(samples, pool, None), as_numpy(torch_collate(samples)))


@pytest.mark.parametrize("kind", KINDS)
def test_python_numpy_rules_match_torch(kind):
    samples = [make(kind, i) for i in range(4)]
    assert_same(collate(samples, NUMPY), as_numpy(torch_collate(samples)))


FALLBACKS = {
    "ragged_shapes": [np.zeros(3), np.zeros(4)],
    "mixed_dtypes": [np.zeros(3, np.float32), np.zeros(3, np.float64)],
    "big_endian": [np.zeros(3, ">f4"), np.zeros(3, ">f4")],
    "int_overflow": [2**63, 1],
    "mixed_int_float": [1, 2.5],
    "ragged_lists": [[1, 2], [3]],
    "namedtuple": [sys.version_info, sys.version_info],
    "object_array": [np.array([None]), np.array([None])],
    "uint64_scalars": [np.uint64(1), np.uint64(2)],
    "tensor_requires_grad": [torch.ones(2, requires_grad=True), torch.ones(2)],
    "unsupported": [object(), object()],
    # More dimensions than the strided copy takes (NumPy 2 allows 64).
    "many_dims": [np.zeros((1,) * 40)[..., ::-1], np.zeros((1,) * 40)],
    "not_a_list": None,  # a tuple of samples
}


@pytest.mark.parametrize("case", sorted(FALLBACKS))
def test_outside_the_native_rules_falls_back(case):
    samples = FALLBACKS[case]
    if samples is None:
        samples = (np.zeros(2), np.zeros(2))
    assert _C.collate(samples, _C.SlotPool(), torch.from_numpy) is NotImplemented


def test_batch_memory_is_owned_by_a_slot_and_recycled():
    pool = _C.SlotPool(max_free=4)
    samples = [np.full((256, 256), i, dtype=np.float32) for i in range(8)]
    first = _C.collate(samples, pool, None)
    owner = first.base
    assert type(owner).__name__ == "SlotOwner"
    assert not first.flags.owndata and first.flags.c_contiguous and first.flags.writeable
    assert owner.address % 4096 == 0 and owner.nbytes >= first.nbytes
    address = owner.address
    assert pool.counts() == (1, 0)

    # A held batch is never overwritten: the next batch gets another slot.
    second = _C.collate([s + 1 for s in samples], pool, None)
    assert second.base.address != address
    assert pool.counts() == (2, 0)
    np.testing.assert_array_equal(first[3], samples[3])

    # Freed batches return their slots, and the next batch reuses one.
    tensor = torch.from_numpy(first)  # a tensor shares the slot too
    del first, owner
    gc.collect()
    assert pool.counts() == (2, 0)
    del tensor
    assert pool.counts() == (2, 1)
    third = _C.collate(samples, pool, None)
    assert third.base.address == address
    del second, third
    assert pool.counts() == (2, 2)


def test_slots_outlive_their_pool_object():
    pool = _C.SlotPool()
    batch = _C.collate([np.arange(10)] * 3, pool, None)
    del pool
    gc.collect()
    np.testing.assert_array_equal(batch[2], np.arange(10))  # memory still valid
    del batch
