"""The parent's side of a process worker's slots: every array of a batch over
one slot has a C owner (``_C.MappedSlotOwner``) as its NumPy base, and the
owner's dealloc puts the slot on its channel's C return list
(``_C.SlotReturns``), which the next request to the worker drains.  The slot
goes back only when the last array or tensor over it is gone; a batch kept
past the workers' end keeps its memory and goes back to no one.

(The page-locked case, a slot fenced before it goes back, runs against the
fake CUDA driver in test_cuda_process_pinning.py.)
"""

import gc
import mmap
import pickle
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.utils.data as tud  # noqa: E402

import fastload  # noqa: E402
from fastload import _C  # noqa: E402
from fl_helpers import fastload_only  # noqa: E402

pytestmark = fastload_only


class Rows(tud.Dataset):
    """One array a sample (one slot a batch): row i is 8 copies of i."""

    def __len__(self):
        return 32

    def __getitem__(self, i):
        return np.full(8, i, np.int64)


def test_a_slot_comes_back_when_its_last_owner_dies():
    returns = _C.SlotReturns()
    mapping = mmap.mmap(-1, 1 << 16)
    owner = returns.own(mapping, 7, 4096, 8192)
    a = owner.array(16, np.dtype(np.float32), (4, 3), (12, 4))
    b = owner.array(64, np.dtype(np.int64), (2,), (8,))
    # The arrays are views of the slot's region, writable, their base the owner.
    assert a.base is owner and b.base is owner and a.flags.writeable
    assert a.__array_interface__["data"][0] == owner.address + 16 and owner.nbytes == 8192
    a[:] = 1.5
    assert np.frombuffer(mapping, np.float32, 12, 4096 + 16).tolist() == [1.5] * 12
    assert type(owner).__name__ == "MappedSlotOwner" and returns.held == 1
    del owner, a
    assert (returns.held, returns.freed) == (1, [])  # b still lives
    del b
    assert (returns.held, returns.freed, returns.fence_of) == (0, [7], {})
    assert returns.take(sys.maxsize) == [7] and returns.freed == []


def test_an_array_must_lie_in_its_slot():
    returns = _C.SlotReturns()
    mapping = mmap.mmap(-1, 1 << 16)
    with pytest.raises(ValueError, match="does not lie"):
        returns.own(mapping, 1, 60000, 8192)
    owner = returns.own(mapping, 1, 0, 100)
    with pytest.raises(ValueError, match="does not lie"):
        owner.array(0, np.dtype(np.float32), (30,), (4,))
    with pytest.raises(ValueError, match="does not lie"):
        owner.array(0, np.dtype(np.float32), (5,), (-4,))
    with pytest.raises(TypeError):
        owner.array(0, np.dtype(object), (3,), (8,))
    backwards = owner.array(96, np.dtype(np.float32), (5,), (-4,))
    assert backwards.shape == (5,) and owner.array(100, np.dtype(np.uint8), (0,), (1,)).size == 0
    with pytest.raises(TypeError):
        type(owner)()
    del owner, backwards
    assert returns.take(sys.maxsize) == [1]


def test_a_closed_list_takes_nothing_back_and_keeps_the_mapping():
    returns = _C.SlotReturns()
    mapping = mmap.mmap(-1, 1 << 16)
    array = returns.own(mapping, 3, 0, 4096).array(0, np.dtype(np.uint8), (4096,), (1,))
    array[:] = 9
    returns.close()
    del mapping  # the owner's view keeps the memory mapped
    assert int(array.sum()) == 9 * 4096 and returns.held == 1
    del array
    assert (returns.held, returns.freed, returns.take(0)) == (0, [], [])


def _loader():
    return fastload.DataLoader(Rows(), batch_size=4, num_workers=1, prefetch_factor=2,
                               worker_mode="process")


def test_a_slot_goes_back_only_after_its_last_view_is_gone():
    loader = _loader()
    it = iter(loader)
    (channel,) = it._engine.channels
    returned = []
    real_send = channel.conn.send_bytes

    def recording_send(data):
        returned.extend(pickle.loads(data)[2])  # a request: (task, request, freed ids)
        real_send(data)

    channel.conn.send_bytes = recording_send
    batch = next(it)
    assert isinstance(batch, torch.Tensor) and batch[:, 0].tolist() == [0, 1, 2, 3]
    assert (channel.held, channel.freed) == (1, [])
    view = batch[1:]        # a torch view of the tensor
    array = view.numpy()    # a NumPy view of that view
    del batch
    assert (channel.held, channel.freed) == (1, [])
    del view
    assert (channel.held, channel.freed) == (1, [])
    assert array[0].tolist() == [1] * 8
    del array
    assert channel.held == 0
    (slot,) = channel.freed
    assert slot not in returned
    rest = [b[:, 0].tolist() for b in it]  # the next request hands it back
    assert rest == [[i, i + 1, i + 2, i + 3] for i in range(4, 32, 4)]
    assert slot in returned


def test_a_batch_kept_past_close_returns_nowhere():
    loader = _loader()
    it = iter(loader)
    (channel,) = it._engine.channels
    kept = next(it)
    view = kept[2:]
    del it, loader
    gc.collect()
    assert channel.closed and not channel.maps  # the worker is gone, its mappings dropped
    # The batch's memory lives on through its arrays.
    assert kept[:, 0].tolist() == [0, 1, 2, 3] and view[:, -1].tolist() == [2, 3]
    assert channel.held == 1
    del kept, view
    assert (channel.held, channel.freed, channel.fenced) == (0, [], [])
