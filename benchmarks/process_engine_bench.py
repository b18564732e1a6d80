"""What the loop's thread pays per batch to schedule worker processes,
against worker threads, on a dataset that costs nothing.

    python benchmarks/process_engine_bench.py [--batches 2000] [--epochs 5]

A map-style Python dataset returns a 16-element int64 array per sample;
batch 64, ``num_workers=2``, persistent workers.  The process and the
thread loader run epoch after epoch, interleaved in this process, after one
untimed epoch each.  Per mode: batches/s, the loop thread's CPU time per
batch (``time.thread_time``: scheduling, the channel, rebuilding the batch)
and the CPU time of this process and its worker processes per batch.  The
sample costs nothing, so the difference between the modes' loop-thread
CPU is what the process engine's Python side costs a batch (docs/design.md,
"Where the scheduling rules live").
"""

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from workers_bench import tree_cpu_seconds  # noqa: E402

import fastload  # noqa: E402

MODES = ("process", "thread")


class Trivial:
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return np.full(16, i, dtype=np.int64)


def measure(batches, epochs):
    """{mode: [(batches/s, loop CPU µs/batch, tree CPU µs/batch), ...]}."""
    loaders = {mode: fastload.DataLoader(Trivial(64 * batches), batch_size=64, num_workers=2,
                                         worker_mode=mode, persistent_workers=True)
               for mode in MODES}
    for loader in loaders.values():  # starts the workers
        for _ in loader:
            pass
    rows = {mode: [] for mode in MODES}
    for _ in range(epochs):
        for mode, loader in loaders.items():
            wall, loop, tree = time.perf_counter(), time.thread_time(), tree_cpu_seconds()
            count = sum(1 for _ in loader)
            wall = time.perf_counter() - wall
            loop = time.thread_time() - loop
            tree = tree_cpu_seconds() - tree if tree is not None else float("nan")
            rows[mode].append((count / wall, 1e6 * loop / count, 1e6 * tree / count))
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=2000)
    parser.add_argument("--epochs", type=int, default=5)
    args = parser.parse_args(argv)
    rows = measure(args.batches, args.epochs)
    print(f"{'mode':<8} {'batches/s':>10} {'loop CPU µs/batch':>18} {'tree CPU µs/batch':>18}")
    for mode, values in rows.items():
        medians = [statistics.median(column) for column in zip(*values)]
        print(f"{mode:<8} {medians[0]:>10.0f} {medians[1]:>18.1f} {medians[2]:>18.1f}")
    return rows


if __name__ == "__main__":
    main()
