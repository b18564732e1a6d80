"""The native batch route, before and after: two builds of fastload side by
side on the loaders whose batches are made in C.

    python benchmarks/native_route_bench.py --baseline ../old-checkout
    python benchmarks/native_route_bench.py --baseline ../old-checkout --quick

``--baseline`` is another checkout of fastload, built in place
(``python setup.py build_ext --inplace``); this checkout is the other side.
Every measurement runs in a fresh child process that imports one of the two
builds; the two alternate within each round (and which goes first alternates
between rounds), so drift on a shared machine hits both alike.  Reported:
medians over the rounds and the ratio baseline / this checkout (above 1:
this checkout is faster).

Cases, each with 1 and 2 workers (persistent, so epochs reuse the threads):

* arrays: ``ArrayDataset`` of 1 KiB float32 rows, batches of 64 -- a 64 KiB
  copy, so the time per batch is mostly the route's own overhead;
* rows: 4 KiB float32 rows, batches of 256 (1 MiB): the shape of
  benchmarks/arrays_bench.py;
* images: ``ImageFolder`` of ImageNet-like JPEGs through RandomResizedCrop(64),
  a flip, ToTensor and Normalize, batches of 32 -- decode-bound;
* first batch: a new loader's ``next(iter(loader))`` (threads started, first
  batch made) for the array dataset.

Per batch: wall time (throughput) and the process's CPU time (overhead: time
any thread of the process spent, so spinning and GIL hand-offs count).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

CHILD = r"""
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
import numpy as np
import fastload
from fastload import transforms as T

case, workers, batches, folder = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
# A tree without fastload/ (the copy scripts/test.sh runs the suite from, against
# the installed wheel) measures the installed package.
if os.path.isdir(os.path.join(sys.argv[1], "fastload")):
    assert os.path.dirname(fastload.__file__) == os.path.join(sys.argv[1], "fastload")

if case == "images":
    ds = fastload.ImageFolder(folder, transform=T.Compose([
        T.RandomResizedCrop(64), T.RandomHorizontalFlip(), T.ToTensor(),
        T.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))]))
    batch_size = 32
elif case == "rows":  # benchmarks/arrays_bench.py's shape: 4 KiB rows, batches of 256
    ds = fastload.ArrayDataset(np.random.default_rng(0).random((16384, 1024), dtype=np.float32),
                               np.arange(16384))
    batch_size = 256
else:
    ds = fastload.ArrayDataset(np.random.default_rng(0).random((8192, 256), dtype=np.float32),
                               np.arange(8192))
    batch_size = 64

def loader(persistent):
    return fastload.DataLoader(ds, batch_size=batch_size, shuffle=True, num_workers=workers,
                               persistent_workers=persistent)

if case == "first":
    times = []
    for _ in range(batches):
        start = time.perf_counter()
        it = iter(loader(False))
        next(it)
        times.append(time.perf_counter() - start)
        del it
    print(json.dumps({"first_s": sorted(times)[len(times) // 2]}))
    sys.exit()

dl = loader(True)
for _ in dl:  # warm: threads, slots, page cache
    pass
done, wall, cpu = 0, 0.0, 0.0
while done < batches:
    w0, c0 = time.perf_counter(), time.process_time()
    for b in dl:
        done += 1
    wall += time.perf_counter() - w0
    cpu += time.process_time() - c0
print(json.dumps({"wall_s": wall / done, "cpu_s": cpu / done}))
"""


def measure(tree, case, workers, batches, folder):
    out = subprocess.run([sys.executable, "-c", CHILD, tree, case, str(workers), str(batches),
                          folder], check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def cases(quick):
    for workers in (1, 2):
        yield "arrays", workers, 64 if quick else 2000
        yield "rows", workers, 16 if quick else 500
        yield "images", workers, 16 if quick else 300
    for workers in (1, 2):
        yield "first", workers, 3 if quick else 15


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", required=True, help="another built fastload checkout")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="a smoke run")
    args = parser.parse_args(argv)
    rounds = 1 if args.quick else args.rounds
    trees = {"baseline": os.path.abspath(args.baseline), "this": ROOT}

    sys.path.insert(0, HERE)
    from imagenet_like import make_image_folder

    cache = os.path.join(tempfile.gettempdir(), "fastload-bench-route")
    folder = make_image_folder(cache, n_images=64 if args.quick else 600, n_classes=4)

    results = {}
    for r in range(rounds):
        for case, workers, batches in cases(args.quick):
            order = ["baseline", "this"] if r % 2 == 0 else ["this", "baseline"]
            for side in order:
                got = measure(trees[side], case, workers, batches, folder)
                for metric, value in got.items():
                    results.setdefault((case, workers, metric), {}).setdefault(side, []).append(
                        value)

    print(f"baseline: {trees['baseline']}\nthis:     {trees['this']}\n")
    print("| case | workers | measure | baseline | this checkout | baseline / this |")
    print("|---|---|---|---|---|---|")
    names = {"wall_s": "wall per batch", "cpu_s": "CPU per batch", "first_s": "first batch"}
    for (case, workers, metric), sides in results.items():
        old = statistics.median(sides["baseline"])
        new = statistics.median(sides["this"])
        print(f"| {case} | {workers} | {names[metric]} | {old * 1e3:.3f} ms | "
              f"{new * 1e3:.3f} ms | {old / new:.2f}x |")


if __name__ == "__main__":
    main()
