"""Resumable loaders: after load_state_dict(), a loader yields exactly the
batches the uninterrupted run would have yielded next, bit for bit."""

import io
import itertools

import numpy as np
import pytest

import fastload
from fastload import transforms as T

torch = pytest.importorskip("torch")
from fl_helpers import to_numpy_tree  # noqa: E402

N = 37


class Squares(torch.utils.data.Dataset):
    """A Python dataset (process workers under worker_mode="auto")."""

    def __len__(self):
        return N

    def __getitem__(self, i):
        return np.float32(i * i), i


class Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        return iter(range(start, 50, step))


class Counter(torch.utils.data.Dataset):
    """A dataset with its own state, restored as torchdata restores it."""

    def __init__(self):
        self.offset = 0

    def __len__(self):
        return 10

    def __getitem__(self, i):
        return i + self.offset

    def state_dict(self):
        return {"offset": self.offset}

    def load_state_dict(self, state):
        self.offset = state["offset"]


def arrays():
    return fastload.ArrayDataset(np.arange(N * 2, dtype=np.float32).reshape(N, 2), np.arange(N))


def plain(batches):
    return [to_numpy_tree(b) for b in batches]


def same(a, b):
    assert len(a) == len(b)
    for x, y in zip(plain(a), plain(b)):
        np.testing.assert_equal(x, y)


def interrupted(make, cut, epochs_before=0, save=lambda state: state):
    """Runs `epochs_before` epochs, then `cut` batches; returns the state
    (through `save`), with the global RNG state a user's checkpoint holds."""
    loader = make()
    for _ in range(epochs_before):
        list(loader)
    it = iter(loader)
    head = list(itertools.islice(it, cut))
    return head, save(loader.state_dict()), torch.get_rng_state()


def resumed(make, state, rng):
    torch.manual_seed(12345)  # the new process's own state, overwritten by the user's
    torch.set_rng_state(rng)
    loader = make()
    loader.load_state_dict(state)
    rest = list(loader)
    return rest, list(loader)  # the rest of the epoch, then the next epoch


def check_resume(make, cut, epochs_before=0, save=lambda state: state):
    torch.manual_seed(0)
    loader = make()
    full = [list(loader) for _ in range(epochs_before + 2)]
    torch.manual_seed(0)
    head, state, rng = interrupted(make, cut, epochs_before, save)
    rest, after = resumed(make, state, rng)
    same(head + rest, full[epochs_before])
    same(after, full[epochs_before + 1])


def seeded(seed=7):
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("cut", [0, 2, 5])
@pytest.mark.parametrize("num_workers,persistent", [(0, False), (2, False), (2, True)])
@pytest.mark.parametrize("generator", [True, False], ids=["generator", "global_rng"])
def test_array_dataset_resumes_mid_epoch(cut, num_workers, persistent, generator):
    check_resume(lambda: fastload.DataLoader(
        arrays(), batch_size=8, shuffle=True, num_workers=num_workers,
        persistent_workers=persistent, generator=seeded() if generator else None), cut)


def test_persistent_loader_resumes_in_a_later_epoch(tmp_path):
    check_resume(lambda: fastload.DataLoader(
        fastload.TokenDataset(np.arange(400, dtype=np.uint16), block_size=7), batch_size=6,
        shuffle=True, num_workers=2, persistent_workers=True, generator=seeded()),
        cut=3, epochs_before=2)


def test_random_augmentation_resumes_bit_for_bit(tmp_path):
    from PIL import Image

    rng = np.random.default_rng(0)
    for c in ("a", "b"):
        (tmp_path / c).mkdir()
        for i in range(6):
            pixels = rng.integers(0, 256, (20, 24, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(tmp_path / c / f"{i}.jpg")
    ds = fastload.ImageFolder(tmp_path, transform=T.Compose(
        [T.RandomResizedCrop(8), T.RandomHorizontalFlip(), T.ToTensor()]))
    check_resume(lambda: fastload.DataLoader(ds, batch_size=4, shuffle=True, num_workers=2,
                                             persistent_workers=True), cut=1, epochs_before=1)


@pytest.mark.parametrize("worker_mode", ["process", "thread"])
def test_python_dataset_resumes(worker_mode):
    check_resume(lambda: fastload.DataLoader(Squares(), batch_size=5, shuffle=True,
                                             num_workers=2, worker_mode=worker_mode), cut=3)


def test_torch_samplers_resume():
    def make():
        ds = arrays()
        sampler = torch.utils.data.RandomSampler(ds)  # draws from torch's global RNG
        return fastload.DataLoader(ds, batch_size=4, sampler=sampler, num_workers=1)

    check_resume(make, cut=4)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_iterable_dataset_resumes_by_loading_again(num_workers):
    check_resume(lambda: fastload.DataLoader(Stream(), batch_size=4, num_workers=num_workers),
                 cut=3)


def test_state_survives_torch_save():
    def through_torch_save(state):
        buffer = io.BytesIO()
        torch.save(state, buffer)
        buffer.seek(0)
        return torch.load(buffer, weights_only=False)

    check_resume(lambda: fastload.DataLoader(arrays(), batch_size=8, shuffle=True,
                                             generator=seeded()), cut=2, save=through_torch_save)


def test_a_finished_epoch_resumes_at_the_next():
    make = lambda: fastload.DataLoader(arrays(), batch_size=8, shuffle=True,  # noqa: E731
                                       generator=seeded())
    loader = make()
    first, second = list(loader), list(loader)
    again = make()
    list(again)
    state = again.state_dict()
    fresh = make()
    fresh.load_state_dict(state)
    same(list(fresh), second)
    assert len(first) == len(second) == 5


def test_dataset_state_is_saved_and_restored():
    ds = Counter()
    loader = fastload.DataLoader(ds, batch_size=None)
    ds.offset = 100
    state = loader.state_dict()
    ds2 = Counter()
    fastload.DataLoader(ds2, batch_size=None).load_state_dict(state)
    assert ds2.offset == 100


def test_bad_states_are_refused():
    loader = fastload.DataLoader(arrays(), batch_size=8, shuffle=True, generator=seeded())
    with pytest.raises(ValueError, match="not a state from fastload"):
        loader.load_state_dict({"num_yielded": 3})
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    other = fastload.DataLoader(arrays(), batch_size=8, shuffle=False)
    other.load_state_dict(state)
    with pytest.raises(ValueError, match="generators differ"):
        iter(other)
