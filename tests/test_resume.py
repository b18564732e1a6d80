"""Resumable loaders: after load_state_dict(), a loader yields exactly the
batches the uninterrupted run would have yielded next, bit for bit."""

import io
import itertools
import json
import pickle

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


def through_torch_save(state):
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer)  # torch's defaults: weights_only=True


def through_pickle(state):
    return pickle.loads(pickle.dumps(state))


def through_json(state):
    return json.loads(json.dumps(state))


SAVES = [through_torch_save, through_pickle, through_json]


def numpy_sampled(bit_generator):
    def make():
        ds = arrays()
        sampler = fastload.RandomSampler(ds, generator=np.random.Generator(bit_generator(4)))
        return fastload.DataLoader(ds, batch_size=8, sampler=sampler, num_workers=2)
    return make


@pytest.mark.parametrize("save", SAVES)
@pytest.mark.parametrize("make", [
    lambda: fastload.DataLoader(arrays(), batch_size=8, shuffle=True, generator=seeded()),
    lambda: fastload.DataLoader(arrays(), batch_size=8, shuffle=True),  # the global RNG
    numpy_sampled(np.random.PCG64),
    numpy_sampled(np.random.MT19937),  # its state holds an array
], ids=["torch_generator", "global_rng", "numpy_pcg64", "numpy_mt19937"])
@pytest.mark.parametrize("cut", [0, 2])
def test_state_survives_a_checkpoint(save, make, cut):
    check_resume(make, cut=cut, save=save)


def test_persistent_state_survives_a_checkpoint():
    check_resume(lambda: fastload.DataLoader(arrays(), batch_size=6, shuffle=True, num_workers=2,
                                             persistent_workers=True), cut=3, epochs_before=1,
                 save=through_torch_save)


def plain_types(value, where="state"):
    """Every value in the state is a plain Python one."""
    if isinstance(value, dict):
        for k, v in value.items():
            assert type(k) is str, f"{where}: key {k!r}"
            plain_types(v, f"{where}[{k!r}]")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            plain_types(v, f"{where}[{i}]")
    else:
        assert value is None or type(value) in (bool, int, float, str), \
            f"{where} is a {type(value).__module__}.{type(value).__name__}"


@pytest.mark.parametrize("make", [
    lambda: fastload.DataLoader(arrays(), batch_size=8, shuffle=True, generator=seeded()),
    numpy_sampled(np.random.MT19937),
    lambda: fastload.DataLoader(Squares(), batch_size=None, shuffle=True, num_workers=2,
                                persistent_workers=True),
    lambda: fastload.DataLoader(Stream(), batch_size=4),
    lambda: fastload.DataLoader(Counter(), batch_size=3),
])
def test_the_state_holds_plain_python_values(make):
    loader = make()
    plain_types(loader.state_dict())
    it = iter(loader)
    plain_types(loader.state_dict())  # in the epoch, before its first draw
    next(it)
    plain_types(loader.state_dict())
    list(it)
    plain_types(loader.state_dict())


def first_format(state):
    """The state as the first format held it: tensors, NumPy arrays, tuples."""
    state = dict(state, fastload_state=1)
    state.pop("batching"), state.pop("samples_yielded")

    def tensor(text):
        return torch.frombuffer(bytearray.fromhex(text), dtype=torch.uint8)

    def draws(snapshot):
        if snapshot is None:
            return None
        numpy_state = snapshot["globals"]["numpy"]
        version, internal, gauss = snapshot["globals"]["random"]
        return {"generators": [tensor(g) for g in snapshot["generators"]],
                "globals": {"torch": tensor(snapshot["globals"]["torch"]),
                            "numpy": ("MT19937",
                                      np.asarray(numpy_state["state"]["key"]["data"], np.uint32),
                                      numpy_state["state"]["pos"], numpy_state["has_gauss"],
                                      numpy_state["gauss"]),
                            "random": (version, tuple(internal), gauss)}}

    state["at_iter"] = draws(state["at_iter"])
    state["at_first_draw"] = draws(state["at_first_draw"])
    state["generators"] = [tensor(g) for g in state["generators"]]
    return state


def test_a_state_of_the_first_format_still_loads():
    check_resume(lambda: fastload.DataLoader(arrays(), batch_size=8, shuffle=True,
                                             generator=seeded()), cut=2, save=first_format)


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
    with pytest.raises(ValueError, match="sampler changed .*RandomSampler of 37 -> "
                                         ".*SequentialSampler of 37"):
        other.load_state_dict(state)
    other = fastload.DataLoader(arrays(), batch_size=8, shuffle=True)  # no generator
    other.load_state_dict(state)
    with pytest.raises(ValueError, match="generators differ"):
        iter(other)


# ------------------------------------------- resuming with another batch_size


def labels(batches):
    """The sample indices in batches, in order (each dataset's label is its index)."""
    return [int(i) for b in batches for i in np.asarray(to_numpy_tree(b)[1]).reshape(-1)]


def stream_loader(dataset, workers, batch_size, drop_last=False, shuffle=True, generator=True):
    num_workers, mode = (0, "auto") if workers == 0 else (2, workers)
    ds = arrays() if dataset == "arrays" else Squares()
    return fastload.DataLoader(ds, batch_size=batch_size, shuffle=shuffle, drop_last=drop_last,
                               num_workers=num_workers, worker_mode=mode,
                               generator=seeded() if generator else None)


def epoch_order(dataset, shuffle, generator=True):
    """The epoch's indices, one at a time: the sampler's stream."""
    return labels(stream_loader(dataset, 0, 1, shuffle=shuffle, generator=generator))


@pytest.mark.parametrize("new_size", [6, 3, 1])
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("dataset,workers", [("arrays", 0), ("arrays", "thread"),
                                              ("python", "thread"), ("python", "process")])
def test_resuming_with_another_batch_size_yields_the_rest_of_the_epoch_once(
        dataset, workers, shuffle, drop_last, new_size):
    order = epoch_order(dataset, shuffle)
    first = stream_loader(dataset, workers, 4, drop_last, shuffle)
    it = iter(first)
    head = list(itertools.islice(it, 3))
    state = first.state_dict()
    assert state["samples_yielded"] == 12
    del it
    resumed = stream_loader(dataset, workers, new_size, drop_last, shuffle)
    resumed.load_state_dict(state)
    rest = list(resumed)
    want = order[12:]
    if drop_last:
        want = want[:len(want) // new_size * new_size]
    assert labels(head) == order[:12]
    assert labels(rest) == want
    sizes = [len(to_numpy_tree(b)[1]) for b in rest]
    assert all(size == new_size for size in sizes[:-1]) and 0 < sizes[-1] <= new_size
    if not drop_last:
        assert sorted(labels(head) + labels(rest)) == list(range(N))  # once each


def test_resuming_by_samples_draws_from_the_global_rng_as_recorded():
    torch.manual_seed(3)
    order = epoch_order("arrays", True, generator=False)
    torch.manual_seed(3)
    first = stream_loader("arrays", 0, 4, generator=False)
    head = list(itertools.islice(iter(first), 2))
    state = first.state_dict()
    torch.manual_seed(99)  # the new process's own state: not the epoch's
    resumed = stream_loader("arrays", "thread", 5, generator=False)
    resumed.load_state_dict(state)
    assert labels(head) + labels(resumed) == order


def test_a_resumed_run_saves_and_resumes_again_with_a_third_batch_size():
    order = epoch_order("python", True)
    first = stream_loader("python", 0, 4)
    head = list(itertools.islice(iter(first), 2))
    second = stream_loader("python", "thread", 6)
    second.load_state_dict(first.state_dict())
    it = iter(second)
    middle = list(itertools.islice(it, 2))
    state = second.state_dict()
    assert state["samples_yielded"] == 20
    del it
    third = stream_loader("python", "process", 3)
    third.load_state_dict(state)
    assert labels(head) + labels(middle) + labels(third) == order


def test_batch_size_none_and_batches_resume_into_each_other():
    order = epoch_order("arrays", True)
    first = stream_loader("arrays", 0, None)
    head = list(itertools.islice(iter(first), 5))
    second = stream_loader("arrays", 0, 4)
    second.load_state_dict(first.state_dict())
    it = iter(second)
    middle = list(itertools.islice(it, 2))
    third = stream_loader("arrays", 0, None)
    third.load_state_dict(second.state_dict())
    got = [int(to_numpy_tree(s)[1]) for s in head] + labels(middle)
    got += [int(to_numpy_tree(s)[1]) for s in third]
    assert got == order


@pytest.mark.parametrize("before,after", [((2, "thread"), (0, "auto")),
                                          ((0, "auto"), (2, "process")),
                                          ((2, "thread"), (3, "thread"))])
def test_a_map_dataset_resumes_with_another_number_of_workers(before, after):
    order = epoch_order("python", True)

    def make(workers):
        return fastload.DataLoader(Squares(), batch_size=4, shuffle=True, num_workers=workers[0],
                                   worker_mode=workers[1], generator=seeded())

    first = make(before)
    it = iter(first)
    head = list(itertools.islice(it, 3))
    state = first.state_dict()
    del it
    resumed = make(after)
    resumed.load_state_dict(state)
    assert labels(head) + labels(resumed) == order


class Pairs(torch.utils.data.Sampler):
    """A batch sampler of its own: pairs, then the rest as one batch."""

    batch_size = 2

    def __init__(self, n, batch_size=2):
        self.n, self.batch_size = n, batch_size

    def __iter__(self):
        for start in range(0, 10, self.batch_size):
            yield list(range(start, start + self.batch_size))
        yield list(range(10, self.n))

    def __len__(self):
        return 10 // self.batch_size + 1


def test_a_batch_sampler_of_its_own_resumes_by_batches_or_refuses():
    def make(**kwargs):
        return fastload.DataLoader(Squares(), **kwargs)

    full = labels(make(batch_sampler=Pairs(N)))
    first = make(batch_sampler=Pairs(N))
    it = iter(first)
    head = list(itertools.islice(it, 2))
    state = first.state_dict()
    same_again = make(batch_sampler=Pairs(N))
    same_again.load_state_dict(state)
    assert labels(head) + labels(same_again) == full
    with pytest.raises(ValueError, match=r"batch_sampler changed \(batch_size 2 -> 5, "
                                         r".*Pairs of 6 -> .*Pairs of 3\)"):
        make(batch_sampler=Pairs(N, 5)).load_state_dict(state)
    with pytest.raises(ValueError, match="saved by a loader with a batch_sampler of its own, "
                                         r"this one has batches cut .*\(batch_size=\)"):
        make(batch_size=2).load_state_dict(state)
    flat = make(batch_size=2)
    flat_it = iter(flat)
    next(flat_it)
    with pytest.raises(ValueError, match="saved by a loader with batches cut .*, this one has "
                                         "a batch_sampler of its own"):
        make(batch_sampler=Pairs(N)).load_state_dict(flat.state_dict())


@pytest.mark.parametrize("change,message", [
    (dict(batch_size=5), "batch_size 4 -> 5"),
    (dict(drop_last=True), "drop_last False -> True"),
    (dict(num_workers=2), "num_workers 0 -> 2"),
])
def test_an_iterable_dataset_refuses_another_batching(change, message):
    first = fastload.DataLoader(Stream(), batch_size=4)
    it = iter(first)
    next(it)
    state = first.state_dict()
    kwargs = dict(dict(batch_size=4), **change)
    with pytest.raises(ValueError, match=f"iterable dataset resumes.*|{message}") as info:
        fastload.DataLoader(Stream(), **kwargs).load_state_dict(state)
    assert message in str(info.value) and "iterable dataset" in str(info.value)


def test_a_state_of_out_of_order_batches_is_refused():
    loader = fastload.DataLoader(Squares(), batch_size=4, num_workers=2, worker_mode="thread",
                                 in_order=False)
    it = iter(loader)
    loader.state_dict()  # nothing handed out yet: the epoch resumes from its start
    next(it)
    with pytest.raises(ValueError, match="needs in_order=True"):
        loader.state_dict()


class Faulty(Squares):
    def __getitem__(self, i):
        if i == 5:
            raise KeyError("sample 5 is bad")
        return super().__getitem__(i)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_batch_that_raised_counts_as_consumed(num_workers):
    def make(batch_size):
        return fastload.DataLoader(Faulty(), batch_size=batch_size, num_workers=num_workers,
                                   worker_mode="thread")

    first = make(4)
    it = iter(first)
    head = [next(it)]
    with pytest.raises(KeyError, match="sample 5 is bad"):
        next(it)
    head.append(next(it))
    state = first.state_dict()
    assert state["samples_yielded"] == 12
    del it
    resumed = make(5)
    resumed.load_state_dict(state)
    assert labels(head) + labels(resumed) == [0, 1, 2, 3] + list(range(8, N))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_state_dict_after_break_is_where_the_loop_left(num_workers):
    # The loop's iterator is dropped by break: state_dict() still says where it was.
    order = epoch_order("arrays", True)
    first = stream_loader("arrays", 0 if num_workers == 0 else "thread", 4)
    head = []
    for i, batch in enumerate(first):
        head.append(batch)
        if i == 2:
            break
    state = first.state_dict()
    assert state["in_epoch"] and state["samples_yielded"] == 12
    resumed = stream_loader("arrays", 0, 4)
    resumed.load_state_dict(state)
    assert labels(head) + labels(resumed) == order


def test_a_sampler_set_to_another_epoch_or_seed_is_refused():
    def make(epoch, seed=0):
        ds = arrays()
        sampler = fastload.DistributedSampler(ds, num_replicas=2, rank=1, seed=seed)
        sampler.set_epoch(epoch)
        return fastload.DataLoader(ds, batch_size=4, sampler=sampler)

    full = labels(make(3))
    first = make(3)
    it = iter(first)
    head = [next(it)]
    state = first.state_dict()
    resumed = make(0)
    resumed.load_state_dict(state)  # set_epoch may come after load_state_dict
    resumed.sampler.set_epoch(3)
    assert labels(head) + labels(resumed) == full
    forgot = make(0)
    forgot.load_state_dict(state)
    with pytest.raises(ValueError, match=r"sampler changed .*\(epoch 3 -> 0\)"):
        iter(forgot)
    with pytest.raises(ValueError, match=r"sampler changed .*\(seed 0 -> 5\)"):
        make(3, seed=5).load_state_dict(state)


class Positioned(torch.utils.data.IterableDataset):
    """An iterable dataset that keeps its place (torchdata's way): the copy
    iterated knows how far it went."""

    def __init__(self):
        self.position = 0

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        for value in range(start, 30, step):
            if value >= self.position:
                self.position = value + 1
                yield value

    def state_dict(self):
        return {"position": self.position}

    def load_state_dict(self, state):
        self.position = state["position"]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_an_iterable_dataset_with_its_own_state_is_not_skipped_twice(num_workers):
    def make():
        return fastload.DataLoader(Positioned(), batch_size=4, num_workers=num_workers)

    full = labels_of_values(make())
    first = make()
    it = iter(first)
    head = list(itertools.islice(it, 2))
    state = first.state_dict()
    resumed = make()
    resumed.load_state_dict(state)
    assert labels_of_values(head) + labels_of_values(resumed) == full


def labels_of_values(batches):
    return [int(v) for b in batches for v in np.asarray(to_numpy_tree(b)).reshape(-1)]


@pytest.mark.parametrize("workers", [0, "thread", "process"])
@pytest.mark.parametrize("before,after", [((4, False), (6, True)), ((4, True), (3, False)),
                                          ((4, True), (1, True))])
def test_drop_last_may_change_on_resume(workers, before, after):
    order = epoch_order("python", True)
    first = stream_loader("python", workers, before[0], before[1])
    it = iter(first)
    head = list(itertools.islice(it, 2))
    state = first.state_dict()
    del it
    resumed = stream_loader("python", workers, after[0], after[1])
    resumed.load_state_dict(state)
    want = order[8:]
    if after[1]:
        want = want[:len(want) // after[0] * after[0]]
    assert labels(head) == order[:8] and labels(resumed) == want


def test_a_persistent_loader_records_the_sampler_epoch_of_each_epoch():
    def make():
        ds = arrays()
        sampler = fastload.DistributedSampler(ds, num_replicas=2, rank=0, seed=1)
        return fastload.DataLoader(ds, batch_size=4, sampler=sampler, num_workers=2,
                                   persistent_workers=True, worker_mode="thread")

    want = make()
    want.sampler.set_epoch(1)
    full = labels(want)
    first = make()
    list(first)
    first.sampler.set_epoch(1)
    it = iter(first)
    head = [next(it)]
    state = first.state_dict()
    resumed = make()
    resumed.load_state_dict(state)
    resumed.sampler.set_epoch(1)
    assert labels(head) + labels(resumed) == full


def test_a_sampler_without_a_length_iterates_and_resumes():
    """A stream sampler whose __len__ raises NotImplementedError: iter()
    works (the state's description of the sampler has no length), and a
    state saved mid-epoch resumes the rest of the epoch."""

    class Stream(torch.utils.data.Sampler):
        def __init__(self, n):
            self.n = n

        def __iter__(self):
            return iter(range(self.n))

        def __len__(self):
            raise NotImplementedError("a stream has no length")

    data = fastload.ArrayDataset(np.arange(20, dtype=np.int64))

    def loader():
        return fastload.DataLoader(data, batch_size=4, sampler=Stream(20), output="numpy")

    first = loader()
    it = iter(first)
    seen = [int(v) for _ in range(2) for v in next(it)[0]]
    state = first.state_dict()
    resumed = loader()
    resumed.load_state_dict(state)
    rest = [int(v) for batch in resumed for v in batch[0]]
    assert seen + rest == list(range(20))
