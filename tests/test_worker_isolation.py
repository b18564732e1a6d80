"""What torch's worker processes guarantee, kept by fastload's workers.

torch's workers are processes: each has its own copy of the dataset, its own
global random state and its own thread-bound objects.  fastload runs Python
datasets in worker processes by default (worker_mode="auto") and gives the
same batches; explicit thread workers copy what must be copied (an
IterableDataset per worker) and refuse what cannot work on shared threads.
"""

import math
import os
import random
import sqlite3
import threading
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.utils.data as tud  # noqa: E402

import fastload  # noqa: E402
from fl_helpers import fastload_only  # noqa: E402

pytestmark = fastload_only

MODES = ["thread", "process"]
# torch warns when a loader starts more workers than this machine has cores.
more_workers_than_cores = pytest.mark.filterwarnings("ignore:This DataLoader will create")


# ----------------------------------------------------------------- datasets


class RangeIterable(tud.IterableDataset):
    """torch's documented sharding example: worker_init_fn narrows start/end."""

    def __init__(self, start, end):
        self.start, self.end = start, end

    def __iter__(self):
        return iter(range(self.start, self.end))


def narrow_to_worker(worker_id):
    info = tud.get_worker_info()
    ds = info.dataset
    overall_start, overall_end = ds.start, ds.end
    per_worker = int(math.ceil((overall_end - overall_start) / float(info.num_workers)))
    ds.start = overall_start + worker_id * per_worker
    ds.end = min(ds.start + per_worker, overall_end)


class ShardsItself(tud.IterableDataset):
    """Shards in __iter__ and returns self (a common pattern)."""

    def __init__(self, n):
        self.n = n

    def __iter__(self):
        info = tud.get_worker_info()
        workers, wid = (info.num_workers, info.id) if info else (1, 0)
        self.position, self.step = wid, workers
        return self

    def __next__(self):
        if self.position >= self.n:
            raise StopIteration
        value, self.position = self.position, self.position + self.step
        return value


class GlobalRandom(tud.Dataset):
    """Draws from the process-wide generators, as torchvision's transforms do."""

    def __len__(self):
        return 24

    def __getitem__(self, i):
        return (i, random.random(), np.random.rand(), torch.rand(()).item())


class FakeDataLike(tud.Dataset):
    """torchvision.datasets.FakeData's rule: save, seed, draw, restore."""

    def __len__(self):
        return 64

    def __getitem__(self, index):
        state = torch.get_rng_state()
        torch.manual_seed(index + 7)
        image = torch.randn(3, 4, 4)
        target = torch.randint(0, 10, size=(1,), dtype=torch.long)[0]
        torch.set_rng_state(state)
        return image, target


class SqliteRows(tud.Dataset):
    """Opens its connection in __init__ (bound to the creating thread)."""

    def __init__(self, path):
        self.db = sqlite3.connect(path)

    def __len__(self):
        return self.db.execute("select count(*) from t").fetchone()[0]

    def __getitem__(self, i):
        return self.db.execute("select v from t where k = ?", (i,)).fetchone()[0]


class ReusedBuffer(tud.Dataset):
    """Returns the same NumPy buffer every call, overwritten each time."""

    def __init__(self):
        self.buffer = np.zeros(4, np.int64)

    def __len__(self):
        return 32

    def __getitem__(self, i):
        self.buffer[:] = i
        return self.buffer


class Rows(tud.Dataset):
    def __len__(self):
        return 96

    def __getitem__(self, i):
        return np.full((16,), i, np.float32), i


class Raises(tud.Dataset):
    def __init__(self, error):
        self.error = error

    def __len__(self):
        return 8

    def __getitem__(self, i):
        if i == 5:
            raise self.error
        return i


class KillsItself(tud.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        if i == 3:
            os.kill(os.getpid(), 9)
        return i


class KillsItselfOnce(tud.Dataset):
    def __init__(self, marker):
        self.marker = marker

    def __len__(self):
        return 8

    def __getitem__(self, i):
        if i == 3 and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            os.kill(os.getpid(), 9)
        return i


class Sleeps(tud.Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        threading.Event().wait(600 if i == 1 else 0)  # stuck, as far as a test can tell
        return i


class IteratesItsLoader(tud.Dataset):
    loader = None

    def __len__(self):
        return 4

    def __getitem__(self, i):
        return sum(len(b) for b in self.loader)


class IteratesAnotherLoader(tud.Dataset):
    def __init__(self, mode):
        self.mode = mode

    def __len__(self):
        return 4

    def __getitem__(self, i):
        inner = fastload.DataLoader(list(range(i + 3)), batch_size=2,
                                    num_workers=1 if self.mode == "thread" else 0,
                                    worker_mode="thread")
        return sum(len(b) for b in inner)


def flat(batches):
    return [v for b in batches for v in (b.tolist() if hasattr(b, "tolist") else b)]


# ---------------------------------------------------------------- isolation


@more_workers_than_cores
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("workers", [1, 2, 3])
def test_torch_sharding_example_gives_torch_samples(mode, workers):
    ds = RangeIterable(3, 7)
    got = fastload.DataLoader(ds, num_workers=workers, worker_init_fn=narrow_to_worker,
                              worker_mode=mode)
    want = tud.DataLoader(RangeIterable(3, 7), num_workers=workers,
                          worker_init_fn=narrow_to_worker)
    assert sorted(flat(got)) == sorted(flat(want)) == [3, 4, 5, 6]
    assert flat(got) == flat(want)
    assert (ds.start, ds.end) == (3, 7)  # the user's object is untouched


@more_workers_than_cores
@pytest.mark.parametrize("mode", MODES)
def test_iterable_returning_self_does_not_duplicate(mode):
    got = flat(fastload.DataLoader(ShardsItself(1000), batch_size=10, num_workers=4,
                                   worker_mode=mode))
    assert sorted(got) == list(range(1000))


def test_global_random_state_is_torchs_by_default():
    def run(DataLoader):
        torch.manual_seed(0)
        random.seed(0)
        np.random.seed(0)
        loader = DataLoader(GlobalRandom(), batch_size=4, shuffle=True, num_workers=2)
        epochs = [[b for b in loader] for _ in range(2)]  # no generator: the global one
        return epochs, torch.rand(3), random.random(), np.random.rand()

    (got, *got_after), (want, *want_after) = run(fastload.DataLoader), run(tud.DataLoader)
    for got_epoch, want_epoch in zip(got, want):
        assert len(got_epoch) == len(want_epoch) == 6
        for g, w in zip(got_epoch, want_epoch):
            for a, b in zip(g, w):
                assert torch.equal(a, b)
    assert torch.equal(got_after[0], want_after[0])  # the main thread's stream is untouched
    assert got_after[1:] == want_after[1:]


@more_workers_than_cores
@pytest.mark.parametrize("workers", [2, 4])
def test_dataset_reseeding_the_global_rng_gives_torchs_batches(workers):
    got = list(fastload.DataLoader(FakeDataLike(), batch_size=8, num_workers=workers))
    want = list(tud.DataLoader(FakeDataLike(), batch_size=8, num_workers=workers))
    for (gx, gy), (wx, wy) in zip(got, want, strict=True):
        assert torch.equal(gx, wx) and torch.equal(gy, wy)


def test_thread_bound_connection_works_by_default(tmp_path):
    path = str(tmp_path / "rows.db")
    with sqlite3.connect(path) as db:
        db.execute("create table t (k integer primary key, v integer)")
        db.executemany("insert into t values (?, ?)", [(i, i * i) for i in range(40)])
    got = flat(fastload.DataLoader(SqliteRows(path), batch_size=8, num_workers=2))
    assert got == [i * i for i in range(40)]


def test_reused_sample_buffer_gives_torchs_batches():
    # Each worker process has its own buffer; a batch of one sample is
    # collated before the next overwrites it.  (Within a batch, torch too
    # collates N references to one buffer.)
    got = flat(fastload.DataLoader(ReusedBuffer(), batch_size=1, num_workers=2))
    want = flat(tud.DataLoader(ReusedBuffer(), batch_size=1, num_workers=2))
    assert got == want


def test_auto_mode_picks_threads_for_native_datasets_only():
    from fastload.loader.iterators import worker_mode as _worker_mode

    native = fastload.ArrayDataset(np.arange(8, dtype=np.float32))
    assert _worker_mode(fastload.DataLoader(native, num_workers=1)) == "thread"
    assert _worker_mode(fastload.DataLoader(native, num_workers=1, collate_fn=list)) == "process"
    assert _worker_mode(fastload.DataLoader(Rows(), num_workers=1)) == "process"
    assert _worker_mode(fastload.DataLoader(Rows(), num_workers=1,
                                            worker_mode="thread")) == "thread"


# ----------------------------------------------------------- process workers


@more_workers_than_cores
@pytest.mark.parametrize("in_order", [True, False])
@pytest.mark.parametrize("persistent", [False, True])
def test_process_workers_match_torch(in_order, persistent):
    def run(DataLoader, **extra):
        g = torch.Generator().manual_seed(3)
        loader = DataLoader(Rows(), batch_size=8, shuffle=True, num_workers=3, generator=g,
                            persistent_workers=persistent, in_order=in_order, **extra)
        return [list(loader) for _ in range(2)]

    got, want = run(fastload.DataLoader, worker_mode="process"), run(tud.DataLoader)
    for got_epoch, want_epoch in zip(got, want):
        key = (lambda b: b[1][0].item()) if not in_order else None
        if key:
            got_epoch, want_epoch = sorted(got_epoch, key=key), sorted(want_epoch, key=key)
        assert len(got_epoch) == len(want_epoch) == 12
        for (gx, gy), (wx, wy) in zip(got_epoch, want_epoch):
            assert torch.equal(gx, wx) and torch.equal(gy, wy)


def test_process_batches_are_shared_slots_reused_without_copies():
    loader = fastload.DataLoader(Rows(), batch_size=8, num_workers=2, worker_mode="process",
                                 persistent_workers=True)
    def mapped_ranges():
        for channel in loader._iterator._engine.channels:
            for mapping in channel.maps.values():
                start = np.frombuffer(mapping, np.uint8).ctypes.data
                yield start, start + len(mapping)

    for epoch in range(3):
        for x, y in loader:
            # Both arrays lie in a slot the parent mapped from a worker.
            for array in (x, y):
                address = array.data_ptr()
                assert any(lo <= address < hi for lo, hi in mapped_ranges())
            assert torch.equal(x[:, 0], y.float())
    channels = loader._iterator._engine.channels
    # Batches were dropped as they came: each worker reuses a few slots.
    assert all(0 < len(c.maps) <= loader.prefetch_factor + 2 for c in channels)


def test_held_process_batches_are_never_overwritten():
    loader = fastload.DataLoader(Rows(), batch_size=4, num_workers=2, worker_mode="process")
    held = list(loader)
    assert [int(x[0, 0]) for x, _ in held] == list(range(0, 96, 4))
    for x, y in held:
        assert torch.equal(x[:, 0], y.float())


def test_process_workers_with_spawn():
    got = list(fastload.DataLoader(Rows(), batch_size=32, num_workers=2, worker_mode="process",
                                   multiprocessing_context="spawn"))
    assert [int(x[0, 0]) for x, _ in got] == [0, 32, 64]


class Info(tud.Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        ours, theirs = fastload.get_worker_info(), tud.get_worker_info()
        return (ours.worker_method, ours.id, theirs.id, ours.seed, theirs.seed,
                ours.dataset is not None)


def as_is(sample):
    return sample


class HoldsALambda(Rows):
    def __init__(self):
        self.scale = lambda x: x


def test_unpicklable_dataset_for_spawn_names_the_attribute():
    loader = fastload.DataLoader(HoldsALambda(), batch_size=8, num_workers=1,
                                 worker_mode="process", multiprocessing_context="spawn")
    with pytest.raises(Exception) as caught:
        next(iter(loader))
    notes = "\n".join(getattr(caught.value, "__notes__", []))
    assert "dataset attribute 'scale' cannot be pickled" in notes and "'spawn'" in notes


PARENT_KILLED_SCRIPT = """
import os, sys
sys.path.insert(0, {tests!r})
import fastload
from test_worker_isolation import Rows
loader = fastload.DataLoader(Rows(), batch_size=8, num_workers=2, worker_mode="process",
                             persistent_workers=True)
next(iter(loader))
print(" ".join(str(c.process.pid) for c in loader._iterator._engine.channels), flush=True)
os.kill(os.getpid(), 9)
"""


def test_workers_exit_when_their_parent_is_killed():
    import subprocess
    import sys
    import time

    script = PARENT_KILLED_SCRIPT.format(tests=os.path.dirname(os.path.abspath(__file__)))
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=120)
    pids = [int(p) for p in result.stdout.split()]
    assert len(pids) == 2, result.stderr

    def running(pid):
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] != "Z"
        except FileNotFoundError:
            return False

    # Orphaned workers notice within a second; the bound only catches a hang.
    deadline = time.monotonic() + 60
    while any(running(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(running(p) for p in pids)


def test_process_worker_info_is_its_own():
    g = torch.Generator().manual_seed(5)
    batches = list(fastload.DataLoader(Info(), batch_size=None, num_workers=2, generator=g,
                                       worker_mode="process", collate_fn=as_is))
    seeds = {b[1]: b[3] for b in batches}
    assert {b[0] for b in batches} == {"process"}
    assert all(b[1] == b[2] and b[3] == b[4] for b in batches)
    assert seeds[1] == seeds[0] + 1


def test_killed_process_worker_is_reported_and_the_program_lives():
    loader = fastload.DataLoader(KillsItself(), batch_size=2, num_workers=2,
                                 worker_mode="process")
    with pytest.raises(RuntimeError, match=r"DataLoader worker \(pid \d+\) is killed by signal"):
        list(loader)
    assert flat(fastload.DataLoader(Rows(), batch_size=48, num_workers=2))[:1] is not None


def test_persistent_loader_replaces_a_dead_worker_next_epoch(tmp_path):
    loader = fastload.DataLoader(KillsItselfOnce(str(tmp_path / "killed")), batch_size=2,
                                 num_workers=2, worker_mode="process", persistent_workers=True)
    with pytest.raises(RuntimeError, match="is killed by signal: SIGKILL"):
        list(loader)
    assert flat(loader) == list(range(8))
    assert flat(loader) == list(range(8))


def test_process_worker_timeout():
    loader = fastload.DataLoader(Sleeps(), batch_size=1, num_workers=2, timeout=1,
                                 worker_mode="process")
    with pytest.raises(RuntimeError, match="timed out after 1 seconds"):
        list(loader)


# -------------------------------------------------------- threads and loops


def test_persistent_loader_refuses_a_second_threads_epoch():
    loader = fastload.DataLoader(Rows(), batch_size=8, num_workers=2, persistent_workers=True,
                                 worker_mode="thread")
    it = iter(loader)
    next(it)
    errors = []

    def second():
        try:
            iter(loader)
        except RuntimeError as e:
            errors.append(str(e))

    t = threading.Thread(target=second, name="second-loop")
    t.start()
    t.join()
    assert errors and "persistent workers are serving an epoch of thread" in errors[0]
    assert len(list(it)) == 11  # the first thread's epoch goes on unharmed
    t = threading.Thread(target=lambda: errors.append(len(list(loader))))
    t.start()
    t.join()
    assert errors[-1] == 12  # a finished epoch frees the workers for any thread


@pytest.mark.parametrize("mode", MODES)
def test_iterating_a_loader_inside_its_own_worker_is_refused(mode):
    ds = IteratesItsLoader()
    loader = fastload.DataLoader(ds, batch_size=2, num_workers=2, worker_mode=mode)
    ds.loader = loader
    with pytest.raises(RuntimeError, match="cannot be iterated from inside one of its own"):
        list(loader)


@pytest.mark.parametrize("mode", MODES)
def test_another_loader_inside_a_worker_works(mode):
    got = flat(fastload.DataLoader(IteratesAnotherLoader(mode), batch_size=2, num_workers=2,
                                   worker_mode=mode))
    assert got == [3, 4, 5, 6]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("error", [SystemExit(3), KeyboardInterrupt()])
def test_exit_from_a_dataset_is_a_failed_worker_not_an_exit(mode, error):
    loader = fastload.DataLoader(Raises(error), batch_size=2, num_workers=2, worker_mode=mode)
    with pytest.raises(RuntimeError, match=f"exited unexpectedly: {type(error).__name__}"):
        list(loader)


# ------------------------------------------------------------ argument limits


def test_worker_limits_name_their_argument():
    with pytest.raises(ValueError, match="num_workers"):
        fastload.DataLoader(Rows(), num_workers=10**6)
    with pytest.raises(ValueError, match="prefetch_factor"):
        fastload.DataLoader(Rows(), num_workers=2, prefetch_factor=2**31)
    with pytest.raises(ValueError, match="worker_mode"):
        fastload.DataLoader(Rows(), num_workers=2, worker_mode="green")


# ------------------------------------------------------- stuck process workers


STUCK_SCRIPT = """
import sys
sys.path.insert(0, {tests!r})
import fastload
from test_worker_isolation import Sleeps
loader = fastload.DataLoader(Sleeps(), batch_size=1, num_workers=2, timeout=1,
                             worker_mode="process", persistent_workers={persistent})
try:
    list(loader)
except RuntimeError as e:
    print("first:", e)
if {persistent}:
    try:
        iter(loader)  # a new epoch waits for the stuck task: bounded by timeout
    except RuntimeError as e:
        print("reset:", e)
"""


@pytest.mark.parametrize("persistent", [False, True])
def test_stuck_process_worker_does_not_hold_up_exit(persistent):
    import subprocess
    import sys

    script = STUCK_SCRIPT.format(tests=os.path.dirname(os.path.abspath(__file__)),
                                 persistent=persistent)
    # Sleeps blocks for 600 s: an exit that waited for it would run into
    # this limit.
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert "first: DataLoader timed out after 1 seconds" in result.stdout
    if persistent:
        assert "reset: DataLoader timed out after 1 seconds" in result.stdout


FORKED_SCRIPT = """
import os, sys
sys.path.insert(0, {tests!r})
import fastload
from test_worker_isolation import Rows
loader = fastload.DataLoader(Rows(), batch_size=32, num_workers=2, persistent_workers=True,
                             worker_mode={mode!r})
assert len(list(loader)) == 3
pid = os.fork()
if pid == 0:
    # The child's workers are its own; the parent's are left alone.
    firsts = [int(x[0, 0]) for x, _ in loader]
    os._exit(0 if firsts == [0, 32, 64] else 1)
_, status = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(status) == 0, status
assert [int(x[0, 0]) for x, _ in loader] == [0, 32, 64]  # the parent's workers still serve
print("ok")
"""


@pytest.mark.parametrize("mode", MODES)
def test_persistent_loader_works_in_a_forked_child(mode):
    import subprocess
    import sys

    script = FORKED_SCRIPT.format(tests=os.path.dirname(os.path.abspath(__file__)), mode=mode)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr


CTRL_C_SCRIPT = """
import sys
sys.path.insert(0, {tests!r})
import fastload
from test_worker_isolation import Sleeps
it = iter(fastload.DataLoader(Sleeps(), batch_size=1, num_workers=2, worker_mode="process"))
next(it)
print("waiting", flush=True)
next(it)  # worker 1 is stuck: only Ctrl-C ends this
"""


def test_ctrl_c_while_waiting_for_a_stuck_process_worker():
    import signal
    import subprocess
    import sys

    script = CTRL_C_SCRIPT.format(tests=os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "waiting"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)  # a hang would run into this
    finally:
        proc.kill()
    assert "KeyboardInterrupt" in err and proc.returncode != 0


@pytest.mark.parametrize("context", [None, "spawn"])
def test_native_image_dataset_in_process_workers(tmp_path, context):
    from PIL import Image

    from fastload import transforms as T

    rng = np.random.default_rng(0)
    for label in "ab":
        (tmp_path / label).mkdir()
        for i in range(3):
            pixels = rng.integers(0, 256, (40, 50, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(tmp_path / label / f"{i}.jpg")
    ds = fastload.ImageFolder(tmp_path, transform=T.Compose([T.RandomResizedCrop(16),
                                                             T.ToTensor()]))

    def batches(mode, **extra):
        g = torch.Generator().manual_seed(1)
        return list(fastload.DataLoader(ds, batch_size=3, num_workers=2, generator=g,
                                        worker_mode=mode, **extra))

    # Crops are keyed by (seed, epoch, index): the same in any worker.
    want, got = batches("thread"), batches("process", multiprocessing_context=context)
    assert len(got) == len(want) == 2
    for (gx, gy), (wx, wy) in zip(got, want):
        assert torch.equal(gx, wx) and torch.equal(gy, wy)


def test_more_worker_processes_than_cpus_warn_as_torch_does():
    cpus = len(os.sched_getaffinity(0))
    kwargs = dict(batch_size=2, num_workers=cpus + 1)

    def warnings_of(DataLoader, **extra):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            list(DataLoader(list(range(4)), **kwargs, **extra))
        return [str(w.message) for w in caught if "worker processes in total" in str(w.message)]

    expected = warnings_of(tud.DataLoader)
    assert expected  # at construction and per iterator
    assert warnings_of(fastload.DataLoader, worker_mode="process") == expected
    assert warnings_of(fastload.DataLoader, worker_mode="thread") == []
