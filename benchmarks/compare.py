"""torch's DataLoader against fastload's, interleaved in one process.

    python benchmarks/compare.py            # full sizes, a few minutes
    python benchmarks/compare.py --quick    # small sizes, a smoke run

On a shared machine absolute speed drifts by several times within minutes,
so the two loaders are never measured in separate runs: every configuration
runs torch, fastload, torch, fastload, ... in this process, and each loader's
number is the median of its repetitions.  Ratios are ratios of medians; the
"pairs" column gives the range of the ratio over the individual torch/fastload
pairs (adjacent in time), a direct view of the noise.  Each measurement is
preceded by an untimed pass of the same loader (see ``interleave``), so
neither loader pays for the other's side effects on this process.

Prints a Markdown report on stdout (progress goes to stderr).  Every timed
epoch and first batch is checked (sample count and exact checksum), so a
loader that drops or corrupts data fails loudly instead of looking fast.
"""

import argparse
import gc
import os
import platform
import statistics
import sys
import time

# This checkout's fastload, even where another one is installed.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import fastload  # noqa: E402

import numpy as np

from workloads import (BATCH_SIZE, FixedArrays, Indices, NumpyWork, consume, cpu_model, make_loader,
                       torch, warm_up)

LOADERS = ("torch", "fastload")
WORKERS = (0, 1, 2)  # torch warns above the core count; this machine has 2

FULL = dict(fixed=65536, work=2048, reps=5, ttfb_reps=21)
QUICK = dict(fixed=4096, work=256, reps=3, ttfb_reps=7)


def log(msg):
    """Progress on stderr: one line rewritten in place on a terminal."""
    sys.stderr.write(f"\r\033[2K{msg}" if sys.stderr.isatty() else f"{msg}\n")
    sys.stderr.flush()


def timed_epoch(loader, expected):
    start = time.perf_counter()
    result = consume(loader)
    elapsed = time.perf_counter() - start
    if result != expected:
        raise AssertionError(f"epoch gave (samples, checksum) {result}, expected {expected}")
    gc.collect()
    return elapsed


def timed_first_batch(loader, expected):
    """Seconds from creating the iterator to holding its first batch; the
    check and the shutdown of the workers are not timed."""
    start = time.perf_counter()
    it = iter(loader)
    batch = next(it)
    elapsed = time.perf_counter() - start
    result = consume([batch])
    if result != expected:
        raise AssertionError(f"first batch gave {result}, expected {expected}")
    del it, batch
    gc.collect()
    return elapsed


def interleave(measure, label, reps, prepare=None, kinds=LOADERS):
    """``measure(kind)`` for each of ``kinds`` (torch and fastload) in turn,
    ``reps`` times each; returns {kind: [seconds, ...]} in repetition order.

    ``prepare(kind)`` runs, untimed, just before each measurement.  It keeps
    one loader from paying for the other: torch's worker processes are
    forked, which leaves every page the parent had written copy-on-write, so
    the next writes to them fault again; without the untimed pass the
    fastload measurement right after a torch one pays those faults (2-3x on
    its time to first batch), a cost that exists only because both loaders
    share this process."""
    times = {kind: [] for kind in kinds}
    for rep in range(reps):
        for kind in kinds:
            log(f"{label}: {kind} {rep + 1}/{reps}")
            if prepare is not None:
                prepare(kind)
            times[kind].append(measure(kind))
    return times


def summarise(times, against="fastload"):
    """Each loader's median, and the range of torch's time over
    ``against``'s time across the repetitions' pairs."""
    med = {kind: statistics.median(ts) for kind, ts in times.items()}
    pairs = [t / f for t, f in zip(times["torch"], times[against])]
    return med, min(pairs), max(pairs)


def run_throughput(dataset, reps):
    expected = (len(dataset), dataset.expected_checksum(range(len(dataset))))
    rows = []
    for nw in WORKERS:
        # One loader per side, reused by every repetition as a training loop
        # reuses it across epochs; each epoch starts its workers afresh.
        loaders = {kind: make_loader(kind, dataset, nw) for kind in LOADERS}
        times = interleave(lambda kind: timed_epoch(loaders[kind], expected),
                           f"{dataset!r} num_workers={nw}", reps,
                           prepare=lambda kind: warm_up(loaders[kind]))
        med, lo, hi = summarise(times)
        rows.append((type(dataset).__name__, nw, len(dataset) / med["torch"],
                     len(dataset) / med["fastload"], med["torch"] / med["fastload"], lo, hi))
        del loaders
        gc.collect()
    return rows


def run_first_batch(dataset, reps):
    """Time to first batch in two situations: a new loader (the start of
    training: its batch buffers are not allocated yet) and a loader reused
    from a previous epoch (every later epoch without persistent_workers)."""
    expected = (BATCH_SIZE, dataset.expected_checksum(range(BATCH_SIZE)))
    name = type(dataset).__name__
    rows = []
    for nw in WORKERS:
        # New loader: built untimed, then timed from iter().  The untimed
        # pass first does the same with another new loader.
        def new_loader_first_batch(kind):
            return timed_first_batch(make_loader(kind, dataset, nw), expected)

        times = interleave(new_loader_first_batch, f"first batch, {name}, new loader, num_workers={nw}",
                           reps, prepare=new_loader_first_batch)
        rows.append((name, "new", nw) + summarise(times))
        reused = {kind: make_loader(kind, dataset, nw) for kind in LOADERS}
        times = interleave(lambda kind: timed_first_batch(reused[kind], expected),
                           f"first batch, {name}, reused loader, num_workers={nw}", reps,
                           prepare=lambda kind: warm_up(reused[kind]))
        rows.append((name, "reused", nw) + summarise(times))
        del reused
        gc.collect()
    rows.sort(key=lambda row: row[1] != "new")  # the "new" rows first
    return rows




def load_average():
    try:
        return "%.2f %.2f %.2f" % os.getloadavg()
    except OSError:
        return "n/a"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    parser.add_argument("--reps", type=int,
                        help="epochs per loader and configuration (default 5, 3 with --quick)")
    args = parser.parse_args(argv)
    if torch is None:
        parser.error("torch is not installed: there is nothing to compare with "
                     "(benchmarks/demo.py runs fastload alone)")
    sizes = dict(QUICK if args.quick else FULL)
    if args.reps:
        sizes["reps"] = args.reps

    fixed = FixedArrays(sizes["fixed"])
    work = NumpyWork(sizes["work"])
    load_before = load_average()
    ms_per_item = work.time_per_item() * 1e3
    wall = time.perf_counter()
    throughput = run_throughput(fixed, sizes["reps"]) + run_throughput(work, sizes["reps"])
    first_batch = (run_first_batch(fixed, sizes["ttfb_reps"])
                   + run_first_batch(Indices(BATCH_SIZE * 8), sizes["ttfb_reps"]))
    wall = time.perf_counter() - wall
    if sys.stderr.isatty():
        sys.stderr.write("\r\033[2K")

    out = []
    out.append(f"Machine: {os.cpu_count()} CPUs ({cpu_model()}), Python {platform.python_version()}, "
               f"torch {torch.__version__}, NumPy {np.__version__}, fastload {fastload.__version__}.")
    out.append(f"Load average before/after: {load_before} / {load_average()}; "
               f"NumpyWork measured at {ms_per_item:.2f} ms per sample; run took {wall:.0f} s.")
    out.append(f"Batch size {BATCH_SIZE}, default collation, sequential order. "
               f"FixedArrays: {sizes['fixed']} samples, NumpyWork: {sizes['work']} samples per epoch; "
               f"{sizes['reps']} epochs per loader, interleaved; medians.")
    out.append("")
    out.append("| workload | num_workers | torch samples/s | fastload samples/s | fastload/torch | pairs |")
    out.append("|---|---:|---:|---:|---:|---:|")
    for name, nw, t, f, ratio, lo, hi in throughput:
        out.append(f"| {name} | {nw} | {t:,.0f} | {f:,.0f} | **{ratio:.2f}x** | {lo:.2f}-{hi:.2f} |")
    out.append("")
    out.append(f"Time to first batch: iterator creation + first batch of {BATCH_SIZE}; median of "
               f"{sizes['ttfb_reps']}, interleaved.  \"new\": a loader built just before (untimed); "
               f"\"reused\": the same loader again after an earlier (partial) epoch.  Indices has "
               f"nothing to load: its row is start-up alone.")
    out.append("")
    out.append("| workload | loader | num_workers | torch ms | fastload ms | torch/fastload | pairs |")
    out.append("|---|---|---:|---:|---:|---:|---:|")
    for name, mode, nw, med, lo, hi in first_batch:
        t, f = med["torch"] * 1e3, med["fastload"] * 1e3
        out.append(f"| {name} | {mode} | {nw} | {t:.2f} | {f:.2f} | **{t / f:.1f}x** | {lo:.1f}-{hi:.1f} |")
    print("\n".join(out))


if __name__ == "__main__":
    main()
