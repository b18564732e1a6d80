"""What batch slots cost: 64 KiB batches, reused or allocated, and the memory
kept after a loop held many of them.

    python benchmarks/slots_bench.py            # 7 repetitions, 2000 held batches
    python benchmarks/slots_bench.py --quick    # a smoke run

* collate, reused: ``_C.collate`` of one 64 KiB array into a pool, the batch
  dropped at once, so every batch reuses the same slot;
* collate, allocated: the same into a pool that keeps no idle slot
  (``max_free=0``), so every batch allocates and frees one;
* loader, 0 and 2 workers: steady-state epochs of ``ArrayDataset`` batches
  (500 an epoch), with the slots the pool allocated meanwhile;
* held then released: private memory above the start while a loop holds 2000
  batches, and after it let them go (in a child process, for a clean heap).

Times are the minimum over repetitions of process CPU time per batch (the
machine is shared and noisy; CPU time is less disturbed by other jobs than
wall time).  Compare builds by running this from each checkout.
"""

import argparse
import os
import subprocess
import sys
import time

# This checkout's build, even where another fastload is installed: the point
# is to compare checkouts.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import fastload  # noqa: E402
import numpy as np  # noqa: E402

from fastload import _C  # noqa: E402
BATCH_BYTES = 64 << 10

HOLD = """
import gc, sys
import numpy as np
import fastload
from proc_info import anon_rss_bytes
loader = fastload.DataLoader(fastload.ArrayDataset(np.ones((640, 1024), np.uint8)),
                             batch_size=64, output="numpy")
for batch in loader:
    pass
del batch
gc.collect()
before = anon_rss_bytes()
held = []
while len(held) < int(sys.argv[1]):
    held.extend(loader)
holding = anon_rss_bytes()
del held
gc.collect()
print(holding - before, anon_rss_bytes() - before)
"""


def cpu_per_batch(run, batches, reps):
    best = float("inf")
    for _ in range(reps):
        start = time.process_time()
        run()
        best = min(best, (time.process_time() - start) / batches)
    return best * 1e6


def collate(max_free, batches, reps):
    pool = _C.SlotPool(max_free=max_free)
    sample = [np.ones(BATCH_BYTES, np.uint8)]

    def run():
        for _ in range(batches):
            batch = _C.collate(sample, pool, None)
            del batch

    return cpu_per_batch(run, batches, reps)


def loader(workers, batches, reps):
    rows = np.ones((64 * batches, 1024), np.uint8)
    epochs = fastload.DataLoader(fastload.ArrayDataset(rows), batch_size=64,
                                 num_workers=workers, output="numpy")

    def run():
        for batch in epochs:
            pass

    def allocations():  # (builds before SlotPool.stats() cannot tell)
        stats = getattr(epochs._slot_pool, "stats", None)
        return stats()["allocations"] if stats else None

    run()  # the pool's steady state
    allocated = allocations()
    result = cpu_per_batch(run, batches, reps)
    # A later epoch may still reach a higher peak of batches in flight than
    # the first, so a few allocations are possible; one per batch is not.
    return result, "n/a" if allocated is None else allocations() - allocated


def held_then_released(batches):
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.path.join(ROOT, "tests")]))
    out = subprocess.run([sys.executable, "-c", HOLD, str(batches)], env=environment, cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    return [int(v) / (1 << 20) for v in out.split()]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few batches and repetitions")
    args = parser.parse_args(argv)
    batches, reps, held = (200, 2, 200) if args.quick else (20000, 7, 2000)
    print("| 64 KiB batches | CPU µs a batch | slots allocated while measured |")
    print("|---|---|---|")
    print(f"| collate, reused slot | {collate(16, batches, reps):.1f} | 0 |")
    print(f"| collate, allocated slot (max_free=0) | {collate(0, batches, reps):.1f} | "
          f"{batches * reps} |")
    for workers in (0, 2):
        per_batch, allocated = loader(workers, batches // 40, reps * 2)
        print(f"| loader, {workers} workers, steady epochs | {per_batch:.1f} | {allocated} |")
    holding, after = held_then_released(held)
    print(f"\n{held} batches held: +{holding:.1f} MiB private memory; "
          f"released: +{after:.1f} MiB")


if __name__ == "__main__":
    main()
