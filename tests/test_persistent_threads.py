"""One persistent loader, two Python threads: the second thread gets a clear
error, or whole epochs; never a share of the other thread's batches.

The interleaving is forced with events: a batch sampler whose ``__iter__``
(called by ``iter(loader)`` as it starts the epoch) stops one thread there,
half-way through starting its epoch, while the other thread asks for one."""

import threading

import pytest

torch = pytest.importorskip("torch")
import torch.utils.data as tud  # noqa: E402

import fastload  # noqa: E402
from fl_helpers import fastload_only  # noqa: E402

pytestmark = fastload_only

N, SIZE = 40, 4
BUSY = r"persistent workers are (serving|starting) an epoch"


class Items(tud.Dataset):
    def __len__(self):
        return N

    def __getitem__(self, i):
        return i


class GatedBatches:
    """Batches of SIZE in order; `__iter__` stops the thread `gated` until
    `go` is set, after telling `inside`."""

    def __init__(self):
        self.gated = None
        self.inside = threading.Event()
        self.go = threading.Event()

    def __iter__(self):
        if threading.current_thread() is self.gated:
            self.gated = None
            self.inside.set()
            self.go.wait(120)
        return iter([list(range(i, i + SIZE)) for i in range(0, N, SIZE)])

    def __len__(self):
        return N // SIZE


@pytest.mark.parametrize("mode", ["thread", "process"])
@pytest.mark.parametrize("first_epoch", [True, False])
def test_second_thread_starting_an_epoch_meanwhile_is_refused(mode, first_epoch):
    sampler = GatedBatches()
    loader = fastload.DataLoader(Items(), batch_sampler=sampler, num_workers=2,
                                 worker_mode=mode, persistent_workers=True)
    if not first_epoch:
        assert sum(len(b) for b in loader) == N  # this thread's epoch, finished
    epochs, errors = [], []

    def other_thread():
        try:
            for _ in range(2):
                epochs.append(sum(len(b) for b in loader))
        except Exception as error:  # noqa: BLE001 (reported below)
            errors.append(error)

    other = threading.Thread(target=other_thread, name="other")
    sampler.gated = other
    other.start()
    try:
        assert sampler.inside.wait(120)
        # `other` is inside iter(loader), starting its epoch: this thread's
        # epoch may not start over it.
        with pytest.raises(RuntimeError, match=BUSY):
            iter(loader)
    finally:
        sampler.go.set()
        other.join(120)
    assert not errors and epochs == [N, N]
    # Its epochs done, this thread may start one.
    assert sum(len(b) for b in loader) == N


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_epoch_of_a_thread_whose_loop_failed_is_not_shared(mode):
    class FailsOnce(Items):
        failed = False

        def __getitem__(self, i):
            if i == 9 and not FailsOnce.failed:
                FailsOnce.failed = True
                raise ValueError("sample 9")
            return i

    loader = fastload.DataLoader(FailsOnce(), batch_size=SIZE, num_workers=2, worker_mode=mode,
                                 persistent_workers=True, multiprocessing_context="fork")
    with pytest.raises(ValueError, match="sample 9"):
        for _ in loader:
            pass
    # This thread's epoch failed half-way and this thread lives on: another
    # thread is refused, rather than given the rest of that epoch.
    caught = []
    other = threading.Thread(target=lambda: caught.append(_error_of(lambda: list(loader))))
    other.start()
    other.join(120)
    assert isinstance(caught[0], RuntimeError) and "persistent workers are" in str(caught[0])
    # The failed thread's next epoch is whole.
    assert sorted(int(x) for b in loader for x in b) == list(range(N))


def _error_of(call):
    try:
        call()
    except Exception as error:  # noqa: BLE001
        return error
    return None
