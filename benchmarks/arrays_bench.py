"""ArrayDataset and TokenDataset against torch's DataLoader, side by side.

    python benchmarks/arrays_bench.py            # 2 GiB of rows, 1 GiB of tokens
    python benchmarks/arrays_bench.py --quick    # 64 MiB each, a smoke run

Two workloads, random batches of 256 from a warm page cache:

* rows: 4 KiB float32 rows of a memory-mapped ``.npy`` file;
* tokens: 1024+1-token windows of a uint16 ``train.bin``, as int64 (x, y).

Each runs through

* torch (a): torch's DataLoader over the usual one-sample-per-``__getitem__``
  dataset, ``num_workers=2`` (persistent);
* torch (b): the fastest torch setup a careful user would pick: the batch
  sampler as the sampler (``batch_size=None``) and one vectorised
  ``__getitem__`` per batch, with 0 and with 2 workers;
* fastload: ``ArrayDataset`` / ``TokenDataset`` with 0, 1 and 2 workers;

interleaved in this one process (torch, fastload, torch, ... for each
repetition; the machine is shared and noisy, so only ratios of medians are
meaningful).  Every batch is checked against the indices the sampler drew.
The ceiling is this machine's single-thread memcpy bandwidth, measured in
the same run.  Peak memory comes afterwards, one child process per
configuration: the peak PSS of the process and its workers during one epoch,
anonymous memory above what it was before the epoch, and mapped file pages
(page cache shared with the system) apart.

Prints a Markdown report on stdout; progress goes to stderr.
"""

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import threading
import time

# This checkout's fastload, even where another one is installed.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import fastload  # noqa: E402

import numpy as np

from array_workloads import (BLOCK, ROW_VALUES, TorchRowBatches, TorchRows, TorchWindowBatches,
                             TorchWindows, check_rows_batch, check_tokens_batch, expected_rows,
                             expected_tokens, make_rows, make_tokens, memcpy_bandwidth, torch,
                             warm_page_cache)
from workloads import cpu_model

BATCH = 256
SEED = 1234
FULL = dict(rows=(2 << 30) // (ROW_VALUES * 4), tokens=1 << 29, batches=400, reps=5)
QUICK = dict(rows=(64 << 20) // (ROW_VALUES * 4), tokens=1 << 25, batches=40, reps=3)

# name -> (workload, loader family, num_workers)
CONFIGS = {
    "torch (a) w2": ("a", 2),
    "torch (b) w0": ("b", 0),
    "torch (b) w2": ("b", 2),
    "fastload w0": ("fastload", 0),
    "fastload w1": ("fastload", 1),
    "fastload w2": ("fastload", 2),
}


def log(msg):
    sys.stderr.write(f"\r\033[2K{msg}" if sys.stderr.isatty() else f"{msg}\n")
    sys.stderr.flush()


class Setup:
    """One loader configuration over one workload, with the sampler's
    generator kept so that every epoch draws the same indices."""

    def __init__(self, workload, path, name, samples, config=None):
        family, workers = config or CONFIGS[name]  # config: (family, workers) not in CONFIGS
        self.workload, self.name = workload, name
        self.generator = torch.Generator()
        if workload == "rows":
            datasets = {"a": TorchRows, "b": TorchRowBatches}
            fl_dataset = lambda: fastload.ArrayDataset(path)  # noqa: E731
            self.check, expected = check_rows_batch, expected_rows
            self.scale = 1  # sample index -> row
        else:
            datasets = {"a": TorchWindows, "b": TorchWindowBatches}
            fl_dataset = lambda: fastload.TokenDataset(path, BLOCK)  # noqa: E731
            self.check, expected = check_tokens_batch, expected_tokens
            self.scale = BLOCK  # window index -> first token
        worker_kw = dict(num_workers=workers, persistent_workers=workers > 0)
        if family == "fastload":
            ds = fl_dataset()
            sampler = fastload.RandomSampler(ds, num_samples=samples, generator=self.generator)
            self.loader = fastload.DataLoader(ds, batch_size=BATCH, sampler=sampler, **worker_kw)
        else:
            tud = torch.utils.data
            ds = datasets[family](path)
            sampler = tud.RandomSampler(ds, num_samples=samples, generator=self.generator)
            if family == "a":
                self.loader = tud.DataLoader(ds, batch_size=BATCH, sampler=sampler, **worker_kw)
            else:
                self.loader = tud.DataLoader(ds, batch_size=None,
                                             sampler=tud.BatchSampler(sampler, BATCH, False),
                                             **worker_kw)
        self.length = len(ds)
        self.samples = samples
        # The indices every epoch draws (the sampler is re-seeded each time).
        plan = list(torch.utils.data.RandomSampler(
            range(self.length), num_samples=samples,
            generator=torch.Generator().manual_seed(SEED)))
        self.plan = [expected(np.asarray(plan[k:k + BATCH]) * self.scale)
                     for k in range(0, samples, BATCH)]
        self.batch_bytes = BATCH * (ROW_VALUES * 4 if workload == "rows" else 2 * BLOCK * 8)

    def epoch(self, limit=None):
        """One checked epoch (or its first `limit` batches); returns seconds."""
        self.generator.manual_seed(SEED)
        start = time.perf_counter()
        n = 0
        for k, batch in enumerate(self.loader):
            self.check(batch, self.plan[k])
            n += 1
            if limit is not None and n >= limit:
                break
        elapsed = time.perf_counter() - start
        if limit is None and n != len(self.plan):
            raise AssertionError(f"{self.name}: {n} batches, expected {len(self.plan)}")
        return elapsed


def prepare_data(args, sizes):
    os.makedirs(args.data, exist_ok=True)
    paths = {
        "rows": os.path.join(args.data, f"rows-{sizes['rows']}.npy"),
        "tokens": os.path.join(args.data, f"tokens-{sizes['tokens']}.bin"),
    }
    log("writing the data files (once)")
    make_rows(paths["rows"], sizes["rows"])
    make_tokens(paths["tokens"], sizes["tokens"])
    for path in paths.values():
        log(f"warming the page cache: {path}")
        warm_page_cache(path)
    return paths


def run_speed(workload, path, sizes):
    samples = sizes["batches"] * BATCH
    setups = {name: Setup(workload, path, name, samples) for name in CONFIGS}
    times = {name: [] for name in CONFIGS}
    for rep in range(sizes["reps"]):
        for name, setup in setups.items():
            log(f"{workload}: {name} {rep + 1}/{sizes['reps']}")
            setup.epoch(limit=8)  # untimed: workers up, buffers and mappings warm
            times[name].append(setup.epoch())
            gc.collect()
    batch_bytes = next(iter(setups.values())).batch_bytes
    del setups
    gc.collect()
    return {name: samples / statistics.median(ts) for name, ts in times.items()}, \
        {name: sizes["batches"] * batch_bytes / statistics.median(ts) for name, ts in times.items()}


# ------------------------------------------------------------ peak memory


def _tree_pss(pid):
    """PSS (bytes) of a process and all its descendants: {"anon": private
    and shared anonymous memory, "file": mapped file pages}."""
    total = {"anon": 0, "file": 0}
    stack = [pid]
    while stack:
        p = stack.pop()
        try:
            with open(f"/proc/{p}/smaps_rollup") as f:
                for line in f:
                    if line.startswith(("Pss_Anon:", "Pss_Shmem:")):
                        total["anon"] += int(line.split()[1]) * 1024
                    elif line.startswith("Pss_File:"):
                        total["file"] += int(line.split()[1]) * 1024
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    stack.extend(int(c) for c in f.read().split())
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return total


def memory_child(workload, path, name, batches):
    """Runs in a child process: one epoch of one configuration, sampling the
    process tree's PSS every 10 ms; prints JSON.  Anonymous memory (heaps,
    batch buffers, shared-memory transfers between processes) and mapped
    file pages (the page cache the dataset reads) are kept apart: only the
    former is memory the loader costs."""
    setup = Setup(workload, path, name, batches * BATCH)
    gc.collect()
    baseline = _tree_pss(os.getpid())
    peak = dict(baseline)
    done = threading.Event()

    def sample():
        while not done.is_set():
            now = _tree_pss(os.getpid())
            for kind in peak:
                peak[kind] = max(peak[kind], now[kind])
            done.wait(0.01)

    sampler = threading.Thread(target=sample)
    sampler.start()
    setup.epoch()
    done.set()
    sampler.join()
    print(json.dumps({"baseline": baseline, "peak": peak}))


def run_memory(workload, path, sizes):
    out = {}
    for name in CONFIGS:
        log(f"peak memory: {workload} {name}")
        result = subprocess.run(
            [sys.executable, os.path.abspath(__file__), "--memory-child", workload, path, name,
             str(sizes["batches"])],
            check=True, capture_output=True, text=True)
        out[name] = json.loads(result.stdout.strip().splitlines()[-1])
    return out


# ----------------------------------------------------------------- report


def report(sizes, paths, speeds, memory, memcpy_bw):
    mib = 1 << 20
    print("## ArrayDataset / TokenDataset vs torch DataLoader\n")
    print(f"CPU: {cpu_model()}, {os.cpu_count()} cores; batches of {BATCH}, "
          f"{sizes['batches']} random batches an epoch, median of {sizes['reps']} interleaved "
          "epochs; page cache warm.")
    print(f"Single-thread memcpy bandwidth (same run): {np.median(memcpy_bw) / 1e9:.2f} GB/s "
          f"(measurements {', '.join(f'{b / 1e9:.2f}' for b in memcpy_bw)}).\n")
    for workload, path in paths.items():
        samples_s, bytes_s = speeds[workload]
        a = samples_s["torch (a) w2"]
        b = max(samples_s["torch (b) w0"], samples_s["torch (b) w2"])
        size = os.path.getsize(path) / (1 << 30)
        title = ("4 KiB float32 rows" if workload == "rows" else f"{BLOCK}+1 uint16 token windows")
        print(f"### {title} ({size:.2f} GiB file)\n")
        print("| loader | samples/s | GB/s delivered | vs torch (a) | vs best torch (b) "
              "| of memcpy | peak anon. memory (MiB) | peak mapped file (MiB) |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|")
        for name in CONFIGS:
            mem = memory[workload][name]
            print(f"| {name} | {samples_s[name]:,.0f} | {bytes_s[name] / 1e9:.2f} | "
                  f"{samples_s[name] / a:.2f}x | {samples_s[name] / b:.2f}x | "
                  f"{bytes_s[name] / np.median(memcpy_bw):.0%} | "
                  f"{(mem['peak']['anon'] - mem['baseline']['anon']) / mib:,.0f} | "
                  f"{mem['peak']['file'] / mib:,.0f} |")
        print()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small files, few repetitions")
    parser.add_argument("--data", default=os.environ.get("FASTLOAD_BENCH_DATA",
                                                         "/tmp/fastload-bench"),
                        help="where the data files are made (and kept)")
    parser.add_argument("--memory-child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_child:
        workload, path, name, batches = args.memory_child
        memory_child(workload, path, name, int(batches))
        return
    if torch is None:
        sys.exit("torch is needed for the comparison")
    sizes = QUICK if args.quick else FULL
    paths = prepare_data(args, sizes)
    memcpy_bw = [memcpy_bandwidth()]
    speeds = {w: run_speed(w, p, sizes) for w, p in paths.items()}
    memcpy_bw.append(memcpy_bandwidth())
    memory = {w: run_memory(w, p, sizes) for w, p in paths.items()}
    log("done")
    report(sizes, paths, speeds, memory, memcpy_bw)


if __name__ == "__main__":
    main()
