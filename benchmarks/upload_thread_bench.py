"""What the upload stage of DataLoader(device="cuda") costs the host per
batch: the CPU time of its thread (taking the engine's batch, the upload
call, the queue) and of the loop's thread (turning the device batch into
tensors), on batches whose copies cost next to nothing.

    python benchmarks/upload_thread_bench.py [--batches 2000] [--epochs 5]

Needs a CUDA driver: a GPU's, or a stand-in named by FASTLOAD_LIBCUDA (the
tests' fake driver, whose device memory is host memory: build it with
``cc -shared -fPIC -O1 -Icsrc -o /tmp/libcuda-fake.so tests/c/fake_libcuda.c``).
Without torch's CUDA (the fake driver) the loop cannot make tensors of the
fake's memory: it takes the device batches as they come (the upload thread,
which is measured, runs as with a GPU).  An ArrayDataset of 32 tiny images
(3x8x8 uint8) and labels a batch, two worker threads, persistent workers;
epochs after an untimed one; medians.  Without a driver it prints one line
and exits 0.
"""

import argparse
import os
import statistics
import sys
import time

import numpy as np

try:
    import fastload
except ImportError:  # run from a checkout built in place
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import fastload
from fastload import cuda
from fastload.loader import upload

BATCH = 32


def _upload_thread_cpu():
    """The upload threads' CPU seconds so far, by thread id (they record
    their own, as they end)."""
    spent = []
    run = upload.Pump._run

    def timed(pump):
        started = time.thread_time()
        try:
            run(pump)
        finally:
            spent.append(time.thread_time() - started)

    upload.Pump._run = timed
    return spent


def measure(batches, epochs, output):
    spent = _upload_thread_cpu()
    ds = fastload.ArrayDataset(np.zeros((BATCH * batches, 3, 8, 8), np.uint8),
                               np.arange(BATCH * batches))
    loader = fastload.DataLoader(ds, batch_size=BATCH, num_workers=2, device="cuda",
                                 persistent_workers=True, output=output)
    rows = []
    for epoch in range(epochs + 1):
        spent.clear()
        wall, loop = time.perf_counter(), time.thread_time()
        count = sum(1 for _ in loader)
        loader._upload.stop()  # the thread ends: its CPU time is in `spent`
        wall, loop = time.perf_counter() - wall, time.thread_time() - loop
        assert count == batches
        if epoch:  # the first one starts the workers
            rows.append((count / wall, 1e6 * sum(spent) / count, 1e6 * loop / count))
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=2000)
    parser.add_argument("--epochs", type=int, default=5)
    args = parser.parse_args(argv)
    if not cuda.is_available():
        print("upload_thread_bench: no CUDA driver (set FASTLOAD_LIBCUDA to the fake one)")
        return None
    try:
        import torch
    except ImportError:
        torch = None
    output = "torch" if torch is not None else "numpy"
    if torch is not None and not torch.cuda.is_available():
        upload._tensors = lambda batch, normalize: batch  # the fake driver: see above
    rows = measure(args.batches, args.epochs, output)
    medians = [statistics.median(column) for column in zip(*rows)]
    print(f"output={output}, batch {BATCH}, {args.batches} batches x {args.epochs} epochs")
    print(f"{'batches/s':>10} {'upload thread CPU µs/batch':>27} {'loop CPU µs/batch':>18}")
    print(f"{medians[0]:>10.0f} {medians[1]:>27.1f} {medians[2]:>18.1f}")
    return medians


if __name__ == "__main__":
    main()
