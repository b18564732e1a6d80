"""How fastload and torch's DataLoader scale with the worker count, side by
side: throughput and efficiency per worker from 1 worker to every core.

    python benchmarks/scaling_bench.py                 # workers 1, 2, 4, ... up to the cores
    python benchmarks/scaling_bench.py --workers 1 2   # chosen worker counts
    python benchmarks/scaling_bench.py --quick         # a smoke run

Two workloads, each loader with persistent workers:

* jpeg: the training transform of torchvision's ImageNet recipe
  (RandomResizedCrop(224), RandomHorizontalFlip, ToTensor, Normalize) over
  generated photo-like JPEGs of ImageNet's sizes (benchmarks/imagenet_like.py),
  batch 64: torch's DataLoader over torchvision's ImageFolder and transforms
  (the Pillow equivalent without torchvision) against ``fastload.ImageFolder``
  with ``fastload.transforms``.  Each worker gets the same number of images,
  so an epoch takes about as long at every worker count;
* rows: random batches of 256 float32 rows of 4 KiB from a memory-mapped
  ``.npy`` file in a warm page cache: torch's fastest setup (a BatchSampler
  as the sampler, one fancy-indexing gather a batch) against
  ``fastload.ArrayDataset``.  Every batch is checked against the rows drawn.

Efficiency per worker at n workers is the rate at n over n times the rate at
1 worker.  Epochs are interleaved (torch, fastload, torch, ...) and each
figure is a median.  Prints a Markdown report on stdout.
"""

import argparse
import functools
import gc
import os
import statistics
import sys
import warnings

# This checkout's fastload, even where another one is installed.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import fastload  # noqa: E402

import numpy as np
import torch

import imagenet_like
import pil_pipeline
from array_workloads import ROW_VALUES, make_rows, warm_page_cache
from arrays_bench import BATCH as ROW_BATCH, Setup
from fastload import transforms as T
from image_timing import images_per_second
from workloads import cpu_model

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
IMAGE_BATCH = 64
FULL = dict(images=4096, images_per_worker=384, rows=(1 << 30) // (ROW_VALUES * 4),
            row_batches=1000, reps=3)
QUICK = dict(images=128, images_per_worker=64, rows=(16 << 20) // (ROW_VALUES * 4),
             row_batches=20, reps=1)
FAMILIES = ("torch", "fastload")


def log(msg):
    sys.stderr.write(f"\r\033[2K{msg}" if sys.stderr.isatty() else f"{msg}\n")
    sys.stderr.flush()


def jpeg_loader(family, root, workers, samples):
    kwargs = dict(batch_size=IMAGE_BATCH, num_workers=workers, persistent_workers=True)
    if family == "torch":
        ds = pil_pipeline.image_folder(root, pil_pipeline.train_transform())
        sampler = torch.utils.data.RandomSampler(ds, replacement=True, num_samples=samples)
        return torch.utils.data.DataLoader(ds, sampler=sampler, **kwargs)
    ds = fastload.ImageFolder(root, transform=T.Compose(
        [T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(),
         T.Normalize(MEAN, STD)]))
    sampler = fastload.RandomSampler(ds, replacement=True, num_samples=samples)
    return fastload.DataLoader(ds, sampler=sampler, **kwargs)


def rows_per_second(setup):
    """Rows a second over one checked epoch of an arrays_bench setup."""
    return setup.samples / setup.epoch()


def measure(workload, workers, sizes, data):
    """{family: median rate} at `workers` workers, interleaved epochs after
    one untimed epoch each (workers up, page cache and slots warm)."""
    if workload == "jpeg":
        samples = sizes["images_per_worker"] * workers
        epochs = {f: functools.partial(images_per_second,
                                       jpeg_loader(f, data["root"], workers, samples))
                  for f in FAMILIES}
    else:
        # arrays_bench's checked epochs: torch's fastest setup (its family "b") and fastload
        samples = sizes["row_batches"] * ROW_BATCH
        epochs = {f: functools.partial(rows_per_second, Setup(
            "rows", data["rows"], f"{f} w{workers}", samples,
            config=("b" if f == "torch" else f, workers))) for f in FAMILIES}
    rates = {f: [] for f in FAMILIES}
    for f in FAMILIES:
        epochs[f]()
    for rep in range(sizes["reps"]):
        for f in FAMILIES:
            log(f"{workload} num_workers={workers}: {f} {rep + 1}/{sizes['reps']}")
            rates[f].append(epochs[f]())
    del epochs
    gc.collect()
    return {f: statistics.median(r) for f, r in rates.items()}


def report(sizes, results):
    print("## Scaling with the worker count: fastload vs torch DataLoader\n")
    print(f"CPU: {cpu_model()}, {os.cpu_count()} cores; torch {torch.__version__}; "
          f"torchvision: {'yes' if pil_pipeline.torchvision_or_none() else 'no'}. "
          f"jpeg: {sizes['images']} generated JPEGs, {sizes['images_per_worker']} images an "
          f"epoch per worker, batch {IMAGE_BATCH}; rows: {sizes['rows']} rows of "
          f"{ROW_VALUES * 4 >> 10} KiB, {sizes['row_batches']} batches of {ROW_BATCH} an epoch. "
          f"Medians of {sizes['reps']} interleaved epochs. Efficiency: rate at n workers / "
          "(n x rate at 1 worker).\n")
    unit = {"jpeg": "images/s", "rows": "rows/s"}
    print("| workload | workers | torch | fastload | fastload vs torch "
          "| torch efficiency | fastload efficiency |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for workload, by_workers in results.items():
        first = min(by_workers)
        for workers, rates in sorted(by_workers.items()):
            eff = {f: rates[f] / (workers / first * by_workers[first][f]) for f in FAMILIES}
            print(f"| {workload} ({unit[workload]}) | {workers} | {rates['torch']:,.0f} | "
                  f"{rates['fastload']:,.0f} | **{rates['fastload'] / rates['torch']:.2f}x** | "
                  f"{eff['torch']:.0%} | {eff['fastload']:.0%} |")


def default_workers():
    counts, n = [], 1
    while n < os.cpu_count():
        counts.append(n)
        n *= 2
    return counts + [os.cpu_count()]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--workers", type=int, nargs="+", help="default: 1, 2, 4, ... cores")
    parser.add_argument("--workloads", nargs="+", choices=("jpeg", "rows"),
                        default=["jpeg", "rows"])
    parser.add_argument("--data", default=os.environ.get("FASTLOAD_BENCH_DATA",
                                                         "/tmp/fastload-bench"))
    args = parser.parse_args()
    warnings.filterwarnings("ignore", message=r"This DataLoader will create \d+ worker")
    warnings.filterwarnings("ignore", message=r"This process .* is multi-threaded")
    sizes = QUICK if args.quick else FULL
    workers = sorted(set(args.workers or default_workers()))
    torch.set_num_threads(1)  # the main process only consumes
    data = {}
    if "jpeg" in args.workloads:
        data["root"] = os.path.join(args.data, f"imagenet-like-{sizes['images']}")
        log(f"making {data['root']} (once)")
        imagenet_like.make_image_folder(data["root"], n_images=sizes["images"])
    if "rows" in args.workloads:
        data["rows"] = os.path.join(args.data, f"rows-{sizes['rows']}.npy")
        log("writing the rows file (once)")
        make_rows(data["rows"], sizes["rows"])
        warm_page_cache(data["rows"])
    results = {w: {n: measure(w, n, sizes, data) for n in workers} for w in args.workloads}
    log("done")
    report(sizes, results)


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
