"""loader.stats(): the timers agree with independent timing, the verdict is
right for input- and compute-bound loops, and every route records."""

import gc
import os
import time

import numpy as np
import pytest

import fastload
from fastload import _C
from fastload.observe.stats import LoaderStats, ROW_FIELDS, STAGES, _percentile

from test_cuda_upload import run_case
from test_cuda_driver import fake_driver  # noqa: F401 (fixture)

SLEEP_S = 0.01


class SelfTimed:
    """Each sample sleeps SLEEP_S and carries the time its __getitem__ took,
    measured by itself: the independent timing of the dataset stage."""

    def __len__(self):
        return 32

    def __getitem__(self, i):
        start = time.perf_counter()
        time.sleep(SLEEP_S)
        return np.array([time.perf_counter() - start])


def run(loader, compute_s=0.0):
    """Iterates one epoch; returns (the dataset's own total, the loop's own
    total wait in next())."""
    own = waited = 0.0
    it = iter(loader)
    while True:
        start = time.perf_counter()
        try:
            batch = next(it)
        except StopIteration:
            break
        waited += time.perf_counter() - start
        own += float(np.asarray(batch).sum())
        if compute_s:
            time.sleep(compute_s)
    return own, waited


def within(measured, expected, rel=0.10, slack_s=0.005):
    return abs(measured - expected) <= rel * expected + slack_s


@pytest.mark.parametrize("workers, mode", [(0, None), (2, "thread"), (2, "process")])
def test_dataset_stage_and_waits_agree_with_independent_timing(workers, mode):
    if mode == "process" and os.environ.get("FASTLOAD_SANITIZER_RUN"):
        pytest.skip("forks worker processes (not under the sanitizer)")
    kwargs = {"worker_mode": mode} if mode else {}
    loader = fastload.DataLoader(SelfTimed(), batch_size=4, num_workers=workers,
                                 output="numpy", **kwargs)
    own, waited = run(loader)
    stats = loader.stats()
    assert stats.batches == 8
    assert stats.stages["dataset"]["calls"] == 8
    assert stats.stages["collate"]["calls"] == 8
    assert within(stats.stages["dataset"]["seconds"], own), (stats.stages, own)
    assert stats.wait_s <= waited  # measured inside the same next() calls
    assert within(stats.wait_s, waited), (stats.wait_s, waited)
    assert stats.wait_fraction > 0.5
    assert stats.verdict.startswith("input-bound")
    if workers:
        assert sum(w["batches"] for w in stats.workers) == 8
        for w in stats.workers:
            # A sleeping worker is busy but hardly uses a CPU.
            assert w["busy_s"] > 0 and w["cpu_s"] < w["busy_s"]
        assert "more workers would help" in stats.verdict or "oversubscribed" in stats.verdict
    else:
        assert "workers would help" in stats.verdict


def test_a_loop_slower_than_its_data_is_compute_bound():
    data = fastload.ArrayDataset(np.zeros((64, 8), np.float32))
    loader = fastload.DataLoader(data, batch_size=4, num_workers=2, output="numpy")
    for _ in loader:
        time.sleep(0.02)
    stats = loader.stats()
    assert stats.batches == 16
    assert stats.verdict.startswith("compute-bound"), str(stats)
    assert stats.elapsed_s >= 15 * 0.02  # from the first next() to the last batch
    assert stats.stages["collate"]["calls"] == 16  # the native gather
    assert stats.mean_in_flight > 0


def write_jpegs(folder, n):
    from PIL import Image

    rng = np.random.default_rng(0)
    for label in ("a", "b"):
        os.makedirs(folder / label, exist_ok=True)
        for i in range(n // 2):
            pixels = rng.integers(0, 255, (48, 64, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(folder / label / f"{i}.jpg", quality=90)


@pytest.mark.parametrize("workers", [0, 2])
def test_the_native_image_pipeline_times_each_stage(tmp_path, workers):
    write_jpegs(tmp_path, 24)
    from fastload import transforms as T

    dataset = fastload.ImageFolder(str(tmp_path), transform=T.Compose(
        [T.RandomResizedCrop(32), T.RandomHorizontalFlip(), T.ToTensor()]))
    loader = fastload.DataLoader(dataset, batch_size=6, num_workers=workers, output="numpy")
    for _ in range(2):
        for _ in loader:
            pass
    stats = loader.stats()
    assert stats.batches == 8
    for stage in ("read", "decode", "transform"):
        assert stats.stages[stage]["calls"] == 48, (stage, stats.stages)
        assert stats.stages[stage]["seconds"] > 0
    pipeline = sum(stats.stages[s]["seconds"] for s in ("read", "decode", "transform"))
    if workers:
        busy = sum(w["busy_s"] for w in stats.workers)
        assert pipeline <= busy  # the stages run inside the workers' jobs
        assert sum(w["batches"] for w in stats.workers) == 8
    else:
        assert pipeline <= stats.wait_s  # the loop made every batch itself
    assert stats.stages["dataset"]["calls"] == 0  # no Python per sample


def test_reset_starts_a_new_window_and_persistent_workers_accumulate():
    data = fastload.ArrayDataset(np.zeros((40, 4), np.float32))
    loader = fastload.DataLoader(data, batch_size=4, num_workers=2, persistent_workers=True,
                                 output="numpy")
    for _ in range(2):
        for _ in loader:
            pass
    first = loader.stats(reset=True)
    assert first.batches == 20 and sum(w["batches"] for w in first.workers) == 20
    assert loader.stats().batches == 0
    for _ in loader:
        pass
    assert loader.stats().batches == 10


def test_turning_the_timers_off_records_no_stage():
    data = fastload.ArrayDataset(np.zeros((40, 4), np.float32))
    loader = fastload.DataLoader(data, batch_size=4, num_workers=2, output="numpy")
    _C.set_stats_enabled(False)
    try:
        for _ in loader:
            pass
    finally:
        _C.set_stats_enabled(True)
    stats = loader.stats()
    assert stats.batches == 10  # the loop's side is Python's, always kept
    assert all(stage["calls"] == 0 for stage in stats.stages.values())
    assert all(w["batches"] == 0 for w in stats.workers)


def test_the_report_reads_as_a_table_and_a_dict():
    loader = fastload.DataLoader(SelfTimed(), batch_size=8, num_workers=2, output="numpy",
                                 worker_mode="thread")
    run(loader)
    stats = loader.stats()
    text = str(stats)
    assert stats.verdict in text
    for header in ("stage", "dataset", "worker", "loop wait per batch", "p95"):
        assert header in text
    d = stats.as_dict()
    assert d["batches"] == 4 and d["num_workers"] == 2 and d["worker_mode"] == "thread"
    assert set(d["stages"]) == set(STAGES)
    assert d["wait_ms"]["p50"] <= d["wait_ms"]["p95"] <= d["wait_ms"]["max"]
    assert len(d["workers"]) == 2
    assert repr(stats).startswith("<LoaderStats 4 batches")


def test_uploads_are_timed_and_the_loop_waits_on_the_device_iterator(fake_driver):  # noqa: F811
    run_case("""
        ds = fastload.ArrayDataset(ROWS, LABELS)
        for workers in (0, 2):
            loader = fastload.DataLoader(ds, batch_size=8, num_workers=workers, device="cuda",
                                         output="numpy")
            for _ in loader:
                pass
            stats = loader.stats()
            assert stats.batches == 5, stats
            assert stats.stages["upload"]["calls"] == 5, stats.stages
            assert stats.stages["collate"]["calls"] == 5, stats.stages
    """, fake_driver)


# ------------------------------------------------------------- the verdict


def snapshot(wait_s, elapsed_s, workers=(), stage_s=None, batches=100, asks=None):
    """A Timers snapshot by hand: workers as (busy, idle, gil, cpu) seconds;
    asks as (asks, empty, idle_at_cap, starved_wait_s): how often the loop
    asked, found no batch deliverable, and found that with a worker idle at
    the in-flight cap, and how long it waited for batches it found none of
    (by default every ask found none, and the workers busy)."""
    rows = []
    for busy, idle, gil, cpu in workers:
        row = [0] * ROW_FIELDS
        row[-5:] = [int(busy * 1e9), int(idle * 1e9), int(gil * 1e9), int(cpu * 1e9), 10]
        rows.append(tuple(row))
    extra = [0] * ROW_FIELDS
    for name, seconds in (stage_s or {}).items():
        extra[STAGES.index(name)] = int(seconds * 1e9)
        extra[len(STAGES) + STAGES.index(name)] = 1
    rows.append(tuple(extra))
    n_asks, empty, idle_at_cap, starved_s = asks or (batches, batches, 0, wait_s)
    consumer = {"batches": batches, "wait_ns": int(wait_s * 1e9),
                "period_ns": int(elapsed_s * 1e9), "depth_samples": n_asks, "in_flight_sum": 0,
                "ready_sum": 0, "empty_asks": empty, "idle_at_cap_asks": idle_at_cap,
                "starved_wait_ns": int(starved_s * 1e9), "wait_hist": [(1000, 1100, batches)]}
    return {"rows": rows, "consumer": consumer}


def verdict(wait_s, workers=(), stage_s=None, cpus=8, contention=0.0, asks=None,
            prefetch_factor=2):
    snap = snapshot(wait_s, 10.0, workers, stage_s, asks=asks)
    return LoaderStats(snap, len(workers), "thread", prefetch_factor, cpus=cpus,
                       contention=contention).verdict


def test_verdicts():
    assert verdict(0.2, [(5, 5, 0, 5)]).startswith(
        "compute-bound: data was ready 98% of the time")
    busy = [(9.5, 0.5, 0, 9)] * 2
    v = verdict(4, busy, {"decode": 13.49, "read": 5.5})
    assert v.startswith("input-bound: the loop waited 40% of the time")
    assert "decode is 71% of worker time" in v and v.endswith("more workers would help")
    assert verdict(4, busy, cpus=2).endswith("a cache would help")
    assert "worker_mode='process'" in verdict(4, [(9, 1, 5, 4)] * 2)
    # Python on two thread workers: each busy, each computing half the time.
    taking_turns = verdict(4, [(9.5, 0.5, 0.2, 4.8)] * 2, {"dataset": 17})
    assert "run Python one at a time (the GIL)" in taking_turns, taking_turns
    assert "1.0 CPUs together" in taking_turns
    # Sleeping or reading: busy, hardly computing; not the GIL.
    assert "the GIL" not in verdict(4, [(9.5, 0.5, 0, 0.2)] * 2, {"dataset": 17})
    assert "even beyond the core count" in verdict(4, [(9.5, 0.5, 0, 1)] * 2, cpus=2)
    assert "oversubscribed" in verdict(4, [(9.5, 0.5, 0, 1)] * 2, contention=0.9)
    # Workers idle 70 %, and at most of the loop's empty asks one of them sat
    # idle because the in-flight cap was reached: prefetch would help.
    assert "larger prefetch_factor would help" in verdict(4, [(3, 7, 0, 3)] * 2,
                                                          asks=(100, 60, 50, 3.8))
    none = LoaderStats(snapshot(6, 10.0, (), {"dataset": 5}), 0, None, None, cpus=4)
    assert none.verdict == ("input-bound: the loop waited 60% of the time; dataset is 83% of "
                            "loading time; workers would help (num_workers > 0)")
    empty = LoaderStats(snapshot(0, 0, (), batches=0), 0, None, None)
    assert empty.verdict == "no batches yet"


@pytest.mark.parametrize("prefetch_factor", [2, 8])
def test_a_wait_with_batches_ready_is_the_hand_off_not_a_call_for_prefetch(prefetch_factor):
    # A cheap in-memory dataset: the loop waits 0.3 ms a batch (13 %), yet a
    # batch was ready at every ask; idle workers are no evidence that more
    # prefetch would help, at any prefetch_factor.
    idle = [(2, 8, 0, 2)] * 2
    v = verdict(1.3, idle, {"collate": 3}, asks=(100, 0, 0, 0), prefetch_factor=prefetch_factor)
    assert v.startswith("input-bound: the loop waited 13% of the time"), v
    assert "prefetch_factor would help" not in v and "more workers would help" not in v, v
    assert "a batch was ready at 100% of the loop's asks" in v, v
    assert "handing batches over" in v, v
    # Mostly ready: a few empty asks with little of the wait behind them.
    v = verdict(1.3, idle, asks=(100, 5, 5, 0.1), prefetch_factor=prefetch_factor)
    assert "prefetch_factor would help" not in v and "handing batches over" in v, v


def test_an_empty_queue_with_busy_workers_calls_for_workers_not_prefetch():
    # The loop found nothing ready and no worker idle at the cap: the workers
    # are too slow, however idle they are on average.
    v = verdict(4, [(6, 4, 0, 6)] * 2, asks=(100, 80, 0, 3.9))
    assert v.endswith("more workers would help"), v
    assert "prefetch" not in v, v
    v = verdict(4, [(6, 4, 0, 6)] * 2, asks=(100, 80, 0, 3.9), cpus=2)
    assert "prefetch" not in v and "a cache would help" in v, v


def test_workers_held_back_by_the_autotuner_are_not_a_call_for_prefetch():
    # num_workers="auto" kept one of two workers active while the loop
    # waited with a worker idle at the in-flight cap: the advice names the
    # autotuner's choice, not prefetch_factor (its own knob).
    tuned = {"workers": 1, "max_workers": 2, "prefetch": 2, "settled": True,
             "reason": "the consumer hardly waits"}
    snap = snapshot(4, 10.0, [(9.5, 0.5, 0, 9), (0, 10, 0, 0)], asks=(100, 60, 50, 3.8))
    v = LoaderStats(snap, 2, "thread", 8, cpus=2, autotune=tuned).verdict
    assert "prefetch_factor would help" not in v, v
    assert "num_workers='auto' keeps 1 of 2 workers active (settled: the consumer hardly waits)" in v
    tuned["workers"] = 2  # every worker active: the usual advice
    v = LoaderStats(snap, 2, "thread", 8, cpus=2, autotune=tuned).verdict
    assert "larger prefetch_factor would help" in v, v


def test_the_timers_record_what_the_loop_found_as_it_asked():
    timers = _C.Timers(1)
    # Nothing deliverable, a worker idle at the in-flight cap; then nothing
    # deliverable, workers busy; then a batch ready.
    timers.note_depth(4, 0, False, True)
    called = _C.clock_ns() - 5_000_000
    starved_wait = timers.record_next(called, 0) - called
    timers.note_depth(4, 1, False, False)  # in order: done, but not the next one
    called = _C.clock_ns() - 3_000_000
    starved_wait += timers.record_next(called, 0) - called
    timers.note_depth(4, 2, True, False)
    called = _C.clock_ns() - 1_000_000
    timers.record_next(called, 0)
    timers.note_depth(4, 2)  # without the flags: deliverable when any is ready
    timers.record_next(_C.clock_ns(), 0)
    consumer = timers.snapshot()["consumer"]
    assert consumer["depth_samples"] == 4
    assert consumer["empty_asks"] == 2 and consumer["idle_at_cap_asks"] == 1
    assert consumer["starved_wait_ns"] == starved_wait
    timers.reset()
    consumer = timers.snapshot()["consumer"]
    assert (consumer["empty_asks"], consumer["idle_at_cap_asks"], consumer["starved_wait_ns"]) \
        == (0, 0, 0)


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_every_worker_route_notes_what_the_loop_found(mode):
    data = fastload.ArrayDataset(np.zeros((64, 4), np.float32))
    loader = fastload.DataLoader(data, batch_size=4, num_workers=2, worker_mode=mode,
                                 output="numpy")
    for _ in loader:
        pass
    stats = loader.stats().as_dict()
    assert stats["asks"] >= 16
    assert 0 <= stats["idle_at_cap_asks"] <= stats["empty_asks"] <= stats["asks"]
    assert 0 <= stats["starved_wait_s"] <= stats["wait_s"] + 1e-9


def test_percentiles_of_the_wait_histogram():
    timers = _C.Timers(1)
    for ms in range(1, 101):  # waits of 1..100 ms, and a few ns of the call
        timers.record_next(_C.clock_ns() - ms * 1_000_000, 0)
    hist = timers.snapshot()["consumer"]["wait_hist"]
    assert sum(count for _lo, _hi, count in hist) == 100
    for q, exact in ((0.5, 50e6), (0.95, 95e6)):
        assert abs(_percentile(hist, q) - exact) <= 0.0625 * exact
    for lo, hi, _count in hist:
        assert hi > lo and (hi - lo) <= lo / 8 + 1  # buckets under 12.5 % wide


def test_timers_check_their_arguments():
    timers = _C.Timers(2)
    with pytest.raises(IndexError, match="no row 2"):
        timers.take(2)
    with pytest.raises(ValueError, match="tuple of"):
        timers.add(0, (1, 2))
    with pytest.raises(ValueError, match="no stage"):
        timers.add_stage(0, len(STAGES), 0, 5)
    with pytest.raises(ValueError, match="rows must be"):
        _C.Timers(0)
    with pytest.raises(TypeError, match="Timers"):
        _C.Engine([object()], 1, stats=object())
    timers.add(1, tuple(range(ROW_FIELDS)))
    assert timers.take(1) == tuple(range(ROW_FIELDS))
    assert timers.take(1) == (0,) * ROW_FIELDS


def test_an_autotuned_loader_shows_what_it_chose():
    data = fastload.ArrayDataset(np.zeros((256, 4), np.float32))
    loader = fastload.DataLoader(data, batch_size=4, num_workers="auto", output="numpy")
    for _ in loader:
        pass
    stats = loader.stats()
    report = loader.autotune_report()
    assert stats.as_dict()["autotune"] == report
    assert f"workers active, prefetch {report['prefetch']}" in str(stats)
    assert stats.batches == 64


def test_a_loader_iterated_inside_another_loaders_dataset_keeps_both_timers():
    inner_data = fastload.ArrayDataset(np.zeros((8, 2), np.float32))

    class Outer:
        def __len__(self):
            return 4

        def __getitem__(self, i):
            # A loader (and its timers) made and dropped inside a sample.
            inner = fastload.DataLoader(inner_data, batch_size=4, output="numpy")
            return np.array([sum(1 for _ in inner)])

    loader = fastload.DataLoader(Outer(), batch_size=2, output="numpy")
    for _ in loader:
        pass
    gc.collect()
    stats = loader.stats()
    assert stats.batches == 2
    # The outer stages are still the outer loader's after each inner epoch.
    assert stats.stages["dataset"]["calls"] == 2 and stats.stages["collate"]["calls"] == 2


class Instant:
    def __len__(self):
        return 16

    def __getitem__(self, i):
        return np.full(4, i, np.float32)


@pytest.mark.parametrize("in_order", [True, False])
def test_a_process_batch_waiting_in_its_pipe_is_ready_at_the_ask(in_order):
    # The first batch is done and sits in its worker's pipe, not yet read:
    # the loop's ask finds it ready (an empty ask would call for more
    # workers or prefetch that cannot help).
    if os.environ.get("FASTLOAD_SANITIZER_RUN"):
        pytest.skip("forks worker processes (not under the sanitizer)")
    loader = fastload.DataLoader(Instant(), batch_size=4, num_workers=1, worker_mode="process",
                                 in_order=in_order, output="numpy")
    it = iter(loader)
    (channel,) = it._engine.channels
    assert channel.conn.poll(120)  # the result has arrived (the bound only catches a hang)
    assert not it._engine.results  # and is not read yet
    assert it._engine.depth()[2]  # deliverable
    assert np.asarray(next(it))[:, 0].tolist() == [0, 1, 2, 3]
    consumer = loader.stats().as_dict()
    assert consumer["asks"] == 1 and consumer["empty_asks"] == 0, consumer
    del it

