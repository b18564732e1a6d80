"""num_workers="auto": the engine's active bound, the loader (same batches
as a fixed num_workers, thread and memory bounds, iterable datasets,
validation) and the autotuner itself, driven by a simulated pipeline (no
timings measured here: the simulation's clock is its own)."""

import os
import random

import numpy as np
import pytest

import fastload
from fastload import _C
from fastload.loader import autotune as _autotune
from fastload.loader.autotune import Autotuner, Setting
from fl_helpers import fastload_only, iterable_dataset, native_thread_names

pytestmark = fastload_only

CORES = _autotune.usable_cores()


# ------------------------------------------------------------ engine bound


class Echo:
    def start(self):
        pass

    def fetch(self, request):
        return _C.JOB_DONE, request

    def stop(self):
        pass


def drain(engine):
    out = []
    while (delivered := engine.next(5.0)) is not None:
        out.append(delivered)
    return out


def test_engine_active_bound_routes_new_jobs_and_keeps_order():
    engine = _C.Engine([Echo() for _ in range(3)], 12, name="fl-active")
    assert engine.active == 3
    for i in range(3):
        engine.submit(i)
    engine.active = 1
    for i in range(3, 6):
        engine.submit(i)
    engine.active = 2
    for i in range(6, 9):
        engine.submit(i)
    got = drain(engine)
    assert [value for _, _, value in got] == list(range(9))
    # Worker 2 still runs the job queued on it before the shrink.
    assert [worker for _, worker, _ in got] == [0, 1, 2, 0, 0, 0, 0, 1, 0]
    for bad in (0, 4, -1):
        with pytest.raises(ValueError, match="Engine.active must be in 1..3"):
            engine.active = bad
    engine.close()
    with pytest.raises(RuntimeError):
        engine.active = 1


# ------------------------------------------------------------------ loader


class Scripted:
    """Stands in for the autotuner: a new setting every batch, growing and
    shrinking across the whole pool, so jobs queued beyond a shrunk bound
    are common."""

    adapting = True

    def __init__(self, max_workers, max_prefetch=3):
        sizes = sorted({1, max_workers, max(1, max_workers // 2)})
        self.settings = [Setting(w, p, w * p) for p in (1, max_prefetch, 2)
                         for w in sizes[::-1] + sizes]
        self.max_workers = max_workers
        self.k = 0

    @property
    def setting(self):
        return self.settings[self.k % len(self.settings)]

    def begin(self):
        return self.setting

    def observe(self, now, waited, nbytes):
        self.k += 1
        return self.setting


class Rows(fastload.Dataset):
    """A Python dataset (default collation) whose samples name their index."""

    def __init__(self, n=53):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return np.full(5, i, dtype=np.int64), i


def make_dataset(kind, tmp_path_factory):
    if kind == "arrays":
        x = np.arange(61 * 6, dtype=np.float32).reshape(61, 6)
        return fastload.ArrayDataset(x, np.arange(61))
    if kind == "images":
        import sys
        sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
        import imagenet_like
        from fastload import transforms as T
        root = tmp_path_factory.mktemp("auto_images")
        folder = imagenet_like.make_image_folder(str(root), n_images=40, n_classes=2,
                                                 processes=1)
        return fastload.ImageFolder(folder, transform=T.Compose(
            [T.RandomResizedCrop(24), T.RandomHorizontalFlip(), T.ToTensor()]))
    return Rows()


def batches(loader, epochs=1):
    return [[tuple(np.asarray(part).copy() for part in batch) for batch in loader]
            for _ in range(epochs)]


def loader_for(dataset, workers, mode, persistent, scripted=False, **kwargs):
    torch = pytest.importorskip("torch")
    loader = fastload.DataLoader(dataset, batch_size=4, shuffle=True, num_workers=workers,
                                 generator=torch.Generator().manual_seed(7), output="numpy",
                                 worker_mode=mode, persistent_workers=persistent, **kwargs)
    if scripted:
        loader._autotune = Scripted(loader.num_workers)
    return loader


@pytest.mark.parametrize("persistent", [False, True], ids=["fresh", "persistent"])
@pytest.mark.parametrize("kind,mode", [("arrays", "thread"), ("images", "thread"),
                                       ("python", "thread"), ("python", "process")])
def test_same_batches_as_a_fixed_worker_count(kind, mode, persistent, tmp_path_factory):
    dataset = make_dataset(kind, tmp_path_factory)
    expected = batches(loader_for(dataset, 2, mode, persistent), epochs=2)
    auto = loader_for(dataset, "auto", mode, persistent, scripted=True)
    got = batches(auto, epochs=2)
    assert auto._autotune.k > 0  # the setting changed while batches were in flight
    assert len(got) == len(expected) and all(len(g) == len(e) for g, e in zip(got, expected))
    for got_epoch, expected_epoch in zip(got, expected):
        for got_batch, expected_batch in zip(got_epoch, expected_epoch):
            for g, e in zip(got_batch, expected_batch):
                np.testing.assert_array_equal(g, e)


def test_same_batches_with_the_autotuner_adapting():
    expected = batches(loader_for(Rows(200), 2, "thread", False))
    auto = loader_for(Rows(200), "auto", "thread", False)
    # Windows of two deliveries, so it measures and tries a step within this
    # epoch (a decision takes at most 2 x 8 skipped deliveries and 2 counted).
    auto._autotune = Autotuner(auto.num_workers, window_batches=2, window_seconds=0.0,
                               max_window_batches=2)
    got = batches(auto)
    for got_batch, expected_batch in zip(got[0], expected[0], strict=True):
        for g, e in zip(got_batch, expected_batch):
            np.testing.assert_array_equal(g, e)
    assert len(auto.autotune_report()["steps"]) >= 2


def test_worker_threads_never_outnumber_the_usable_cores():
    before = sum(name.startswith("fastload-w") for name in native_thread_names())
    x = np.zeros((40, 3), dtype=np.float32)
    loader = fastload.DataLoader(fastload.ArrayDataset(x), batch_size=2, num_workers="auto")
    it = iter(loader)
    next(it)
    during = sum(name.startswith("fastload-w") for name in native_thread_names())
    assert loader.num_workers == CORES
    assert during - before <= CORES
    del it


def test_process_workers_start_when_first_activated():
    loader = loader_for(Rows(), "auto", "process", False)
    loader._autotune = Autotuner.fixed(1, 2, "held at one worker")
    it = iter(loader)
    got = [next(it) for _ in range(13)]
    assert len(it._engine.channels) == 1  # the others were never needed
    assert len(got + list(it)) == 14


def test_max_prefetch_bytes_bounds_the_batches_in_flight():
    batch_bytes = 4 * 5 * 8 + 4 * 8  # four rows of five int64, four int64 labels
    loader = fastload.DataLoader(Rows(200), batch_size=4, num_workers="auto",
                                 worker_mode="thread", output="numpy",
                                 max_prefetch_bytes=3 * batch_bytes)
    # Start as deep as the pool allows, so only the byte budget holds it back.
    loader._autotune = Autotuner(loader.num_workers, 8, 3 * batch_bytes,
                                 start_workers=loader.num_workers, start_prefetch=8)
    it = iter(loader)
    in_flight = []
    for _ in it:
        in_flight.append(it._engine.in_flight)
    report = loader.autotune_report()
    assert report["batch_bytes"] == batch_bytes and report["in_flight"] == 3
    # The first batch's size lowers the target: what was in flight drains
    # (no submits) down to the budget, and stays within it.
    assert all(b <= max(a, 3) for a, b in zip(in_flight, in_flight[1:]))
    assert max(in_flight[in_flight.index(3):]) <= 3


def test_iterable_dataset_keeps_every_worker():
    dataset = iterable_dataset("range", base=fastload.IterableDataset, n=40,
                               get_info=fastload.get_worker_info)
    auto = fastload.DataLoader(dataset, batch_size=3, num_workers="auto", output="numpy",
                               worker_mode="thread")
    fixed = fastload.DataLoader(dataset, batch_size=3, num_workers=CORES, output="numpy",
                                worker_mode="thread")
    got = [b[1].tolist() for b in auto]
    assert got == [b[1].tolist() for b in fixed]
    assert sorted(i for b in got for i in b) == list(range(40))
    report = auto.autotune_report()
    assert report["settled"] and report["workers"] == CORES == auto.num_workers
    assert report["steps"] == [] and "IterableDataset" in report["reason"]


class WorkerCount(fastload.Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        return fastload.get_worker_info().num_workers


def test_loader_attributes_and_worker_info():
    loader = fastload.DataLoader(WorkerCount(), num_workers="auto", worker_mode="thread",
                                 prefetch_factor=3, output="numpy")
    assert loader.autotune is True and loader.num_workers == CORES
    assert isinstance(loader.num_workers, int) and loader.prefetch_factor == 3
    assert {int(b[0]) for b in loader} == {CORES}
    report = loader.autotune_report()
    assert report["max_workers"] == CORES and report["max_prefetch"] == 3
    plain = fastload.DataLoader(WorkerCount(), num_workers=0)
    assert plain.autotune is False and plain.autotune_report() is None


@pytest.mark.parametrize("kwargs,message", [
    ({"num_workers": "bogus"}, "num_workers option should be a non-negative integer or 'auto'"),
    ({"num_workers": "auto", "prefetch_factor": 0}, "prefetch_factor option should be a positive"),
    ({"num_workers": "auto", "max_prefetch_bytes": 0}, "max_prefetch_bytes should be a positive"),
    ({"num_workers": 2, "max_prefetch_bytes": 1 << 20}, "max_prefetch_bytes needs num_workers"),
])
def test_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        fastload.DataLoader(Rows(), **kwargs)


# ------------------------------------------------- the controller, simulated


class Fixed:
    """One setting held throughout, for the sweep the tuner is compared to."""

    def __init__(self, workers, prefetch):
        self.max_workers = workers
        self.held = Setting(workers, prefetch, workers * prefetch)

    def begin(self):
        return self.held

    def observe(self, now, waited, nbytes):
        return self.held


def simulate_epochs(tuner, epochs, batches, work, consume, cores, seed=0, nbytes=1000,
                    noise=0.2, seen=None, gil_penalty=None):
    """A discrete-event model of the loader: round-robin over the active
    workers, each a FIFO taking `work` seconds a batch (slower when more
    workers than `cores` share them), `in_flight` batches kept submitted,
    in-order delivery, and a consumer that spends `consume` seconds per
    batch (or consume(k, rng), k counting every batch of the run).  Each
    epoch starts with an empty pipeline, as a new epoch's first batches do.
    With `gil_penalty`, workers run Python under the GIL: one runs at a
    time, each switch costing more the more of them there are, and the
    tuner's GIL clock counts their waits.
    Noise from a seeded generator.  Returns the batches per second the
    consumer saw in each epoch, from its start to its last batch."""
    rng = random.Random(seed)
    free = [0.0] * tuner.max_workers
    rates = []
    now = 0.0
    clock = [0.0, 0.0]  # the workers' GIL waits and busy time, in seconds
    if gil_penalty is not None:
        tuner.gil_clock = lambda: tuple(clock)
    for epoch in range(epochs):
        finish = []
        cursor = 0

        def top_up(t, setting, delivered):
            nonlocal cursor
            while len(finish) - delivered < setting.in_flight and len(finish) < batches:
                if cursor >= setting.workers:
                    cursor = 0
                start = max(free[cursor], t)
                if gil_penalty is None:
                    slowdown = max(1.0, setting.workers / cores)
                else:
                    slowdown = setting.workers * (1 + gil_penalty * (setting.workers - 1))
                took = work * slowdown * rng.uniform(1 - noise, 1 + noise)
                clock[0] += took * (1 - 1 / slowdown)
                clock[1] += took
                free[cursor] = start + took
                finish.append(free[cursor])
                cursor += 1

        began = now
        setting = tuner.begin()
        top_up(now, setting, 0)
        for k in range(batches):
            got = max(now, finish[k])
            setting = tuner.observe(got, got - now, nbytes)
            if seen is not None:
                seen.append(setting)
            top_up(got, setting, k + 1)
            step = epoch * batches + k
            spent = (consume(step, rng) if callable(consume)
                     else consume * rng.uniform(1 - noise, 1 + noise))
            now = got + spent
        rates.append(batches / (now - began))
    return rates


def simulate(tuner, batches, work, consume, cores, **kwargs):
    """simulate_epochs over one epoch of `batches`: its batches per second."""
    return simulate_epochs(tuner, 1, batches, work, consume, cores, **kwargs)[0]


def best_fixed(max_workers, batches, work, consume, cores, **kwargs):
    return max(simulate(Fixed(w, p), batches, work, consume, cores, **kwargs)
               for w in range(1, max_workers + 1) for p in (1, 2, 4, 8))


def bursty(k, rng):
    """A training step that stalls every tenth batch (an evaluation, a log)."""
    return 0.05 if k % 10 == 0 else 0.001


@pytest.mark.parametrize("case,work,consume,cores,least_workers", [
    ("workers are the bottleneck", 0.010, 0.002, 8, 5),
    ("the cores are the bottleneck", 0.010, 0.001, 4, 4),
    ("the consumer is the bottleneck", 0.001, 0.010, 8, 1),
    ("a bursty consumer", 0.004, bursty, 2, 2),
])
def test_converges_near_the_best_fixed_setting(case, work, consume, cores, least_workers):
    tuner = Autotuner(cores)
    seen = []
    auto = simulate(tuner, 3000, work, consume, cores, seen=seen)
    best = best_fixed(cores, 3000, work, consume, cores)
    report = tuner.report()
    assert report["settled"], case
    assert auto >= 0.9 * best, (case, auto / best, report)
    assert least_workers <= report["workers"] <= cores
    assert all(s.workers <= cores and s.prefetch <= _autotune.DEFAULT_MAX_PREFETCH for s in seen)
    # After settling the setting never moves.
    settled_at = report["steps"][-1]["batch"]
    assert len(set(seen[settled_at:])) == 1


def test_the_consumer_bound_case_settles_at_one_worker():
    tuner = Autotuner(8)
    simulate(tuner, 500, 0.001, 0.010, 8)
    report = tuner.report()
    assert (report["workers"], report["prefetch"]) == (1, 2)
    assert report["reason"] == "the consumer hardly waits"


def test_a_bursty_consumer_gets_a_deeper_buffer():
    tuner = Autotuner(2)
    simulate(tuner, 3000, 0.004, bursty, 2)
    assert tuner.report()["prefetch"] > _autotune.START_PREFETCH


@pytest.mark.parametrize("seed", range(10))
def test_noisy_pipelines_settle_without_oscillating(seed):
    tuner = Autotuner(8)
    seen = []
    simulate(tuner, 4000, 0.010, 0.002, 8, seed=seed, noise=0.5, seen=seen)
    report = tuner.report()
    assert report["settled"] and len(report["steps"]) <= 12
    assert report["workers"] >= 4  # 5 keep up; noise may stop it one short
    changes = sum(a != b for a, b in zip(seen, seen[1:]))
    assert changes <= 2 * len(report["steps"])


@pytest.mark.parametrize("seed", range(3))
def test_workers_taking_turns_with_the_gil_are_reduced(seed):
    # Thread workers running Python: one computes at a time, and each more
    # worker makes the switches dearer.  One worker is the fastest; the
    # tuner starts with all four and must come down to it.
    tuner = Autotuner(4)
    auto = simulate(tuner, 3000, 0.004, 0.0005, 4, seed=seed, gil_penalty=0.5)
    best = max(simulate(Fixed(w, p), 3000, 0.004, 0.0005, 4, seed=seed, gil_penalty=0.5)
               for w in range(1, 5) for p in (1, 2, 4, 8))
    report = tuner.report()
    assert report["workers"] == 1, report
    assert auto >= 0.9 * best, (auto / best, report)


def test_byte_budget_caps_what_is_in_flight():
    tuner = Autotuner(8, 8, max_bytes=5_000, start_workers=8, start_prefetch=8)
    assert tuner.setting.in_flight == 64  # no batch seen yet
    seen = []
    simulate(tuner, 2000, 0.010, 0.001, 8, nbytes=1000, seen=seen)
    assert all(s.in_flight <= 5 for s in seen)
    tiny = Autotuner(4, 8, max_bytes=10)
    assert tiny.observe(0.0, 0.0, 1000).in_flight == 1  # at least one batch


def test_starts_with_every_worker():
    tuner = Autotuner(6)
    assert tuner.setting == Setting(6, _autotune.START_PREFETCH, 6 * _autotune.START_PREFETCH)
    simulate(tuner, 200, 0.010, 0.001, 6)
    assert tuner.report()["steps"][0]["workers"] == 6


@pytest.mark.parametrize("seed", range(4))
def test_short_epochs_of_a_persistent_loader(seed):
    # The hardest case for a tuner: 32 batches an epoch and no training step,
    # the workers the bottleneck on 2 cores.  Its first epoch must come close
    # to the best fixed setting, and the later ones match it.
    def run(tuner):
        return simulate_epochs(tuner, 8, 32, 0.010, 0.0002, 2, seed=seed)

    best = max((run(Fixed(w, p)) for w in (1, 2) for p in (1, 2, 4, 8)),
               key=lambda rates: sum(rates))
    tuner = Autotuner(2)
    auto = run(tuner)
    assert auto[0] >= 0.8 * best[0], (auto, best, tuner.report())
    assert all(a >= 0.95 * b for a, b in zip(auto[1:], best[1:])), (auto, best, tuner.report())


def test_a_search_continues_across_epochs():
    # The consumer is the bottleneck: one worker keeps up, found by halving
    # from eight over windows longer than an epoch.
    tuner = Autotuner(8)
    seen = []
    simulate_epochs(tuner, 40, 20, 0.001, 0.010, 8, seen=seen)
    report = tuner.report()
    assert report["settled"] and report["workers"] == 1, report
    assert report["reason"] == "the consumer hardly waits"
    decided = [step["batch"] for step in report["steps"]]
    assert decided[-1] > 20 and len(decided) >= 3  # beyond the first epoch
    assert not any(step["decision"] == "reopened" for step in report["steps"])


def changing_consumer(switch_every, slow=0.010, fast=0.0005):
    def consume(k, rng):
        return (slow if (k // switch_every) % 2 == 0 else fast) * rng.uniform(0.9, 1.1)
    return consume


def test_a_choice_the_next_epochs_contradict_is_reopened():
    # Consumer-bound for 1,500 batches (one worker keeps up), then the
    # training step gets 20x faster: the consumer waits, so the choice is
    # reopened and the workers grow to the cores.
    tuner = Autotuner(4)
    simulate_epochs(tuner, 60, 50, 0.004, changing_consumer(1500), 4)
    report = tuner.report()
    decisions = [step["decision"] for step in report["steps"]]
    assert decisions.count("reopened") == 1, report
    before = report["steps"][decisions.index("reopened") - 1]
    assert before["workers"] == 1
    assert report["settled"] and report["workers"] == 4, report


def test_reopening_is_bounded():
    # A consumer that changes pace every 400 batches, for ever: the tuner
    # reopens at most max_reopens times, then holds its setting.
    tuner = Autotuner(4, max_reopens=3)
    seen = []
    simulate(tuner, 20000, 0.004, changing_consumer(400), 4, seen=seen)
    report = tuner.report()
    assert report["reopened"] == 3 and not report["adapting"], report
    assert "held" in report["reason"]
    held_from = report["steps"][-1]["batch"]
    assert len(set(seen[held_from + 1:])) == 1


def test_a_fixed_controller_never_moves():
    tuner = Autotuner.fixed(3, 2, "fixed")
    assert tuner.settled and tuner.setting == Setting(3, 2, 6)
    assert tuner.observe(1.0, 1.0, 100) == Setting(3, 2, 6)
