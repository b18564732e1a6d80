"""fastload next to torch's DataLoader, on data generated on the spot.

    python benchmarks/demo.py                      # a minute or two
    python benchmarks/demo.py --workload images --images 2000 --workers 1 2
    python benchmarks/demo.py --workload fixed --workers 0 1 2

The headline workload is image training input: a folder of photo-like JPEGs
(made once, cached) through RandomResizedCrop(224) + RandomHorizontalFlip +
ToTensor + Normalize — torch's DataLoader with the same transforms written
with Pillow (torchvision's when installed), against fastload.ImageFolder with
fastload.transforms, decoded and augmented in C.  The others measure the
loader itself on Python datasets.

Runs both loaders on the same dataset and configuration, with a progress bar
on stderr while each runs, then prints samples/s per loader and the speed-up.
The two loaders take turns (torch, fastload, torch, fastload, ...) and each
number is the median of its runs, so a machine that speeds up or slows down
meanwhile affects both alike.  Every sample of every batch is checked
against a checksum computed without a loader.

Works without torch installed: fastload then runs alone (NumPy batches).
"""

import argparse
import os
import platform
import statistics
import sys
import time

try:
    import fastload
except ImportError:  # run from a checkout that is built in place, not installed
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import fastload

import numpy as np

from workloads import (FixedArrays, NumpyWork, consume, cpu_model, loader_kinds, make_loader, torch,
                       warm_up)

WORKLOADS = {
    "images": ("ImageFolder", "photo-like JPEGs, RandomResizedCrop(224) + flip + ToTensor + "
               "Normalize"),
    "fixed": ("FixedArrays", "3x64x64 float32 images, nearly free to make: the loader's own cost"),
    "numpy": ("NumpyWork", "~1 ms of GIL-releasing NumPy work per sample"),
}


class ProgressBar:
    """``label [######......] done/total  rate samples/s`` on stderr.

    On a terminal the line is rewritten in place with ``\\r`` (at most 20
    times a second, so drawing costs nothing measurable); elsewhere (a log
    file) only the finished line is written."""

    WIDTH = 30

    def __init__(self, label, total, stream=sys.stderr):
        self.label = label
        self.total = total
        self.stream = stream
        self.live = stream.isatty()
        self.start = time.perf_counter()
        self.next_draw = self.start

    def update(self, done):
        if self.live:
            now = time.perf_counter()
            if now >= self.next_draw:
                self.next_draw = now + 0.05
                self._draw(done, now - self.start, "\r")

    def finish(self, done, seconds):
        self._draw(done, seconds, "\r" if self.live else "")
        self.stream.write("\n")
        self.stream.flush()

    def _draw(self, done, seconds, prefix):
        filled = self.WIDTH * done // max(self.total, 1)
        bar = "#" * filled + "." * (self.WIDTH - filled)
        rate = done / seconds if seconds > 0 else 0.0
        self.stream.write(f"{prefix}{self.label} [{bar}] {done:>{len(str(self.total))}}/{self.total}"
                          f"  {rate:>9,.0f} samples/s")
        self.stream.flush()


def run_once(kind, loader, dataset, num_workers, expected):
    label = f"  {kind:<8} num_workers={num_workers}"
    bar = ProgressBar(label, len(dataset))
    start = time.perf_counter()
    result = consume(loader, on_batch=bar.update)
    seconds = time.perf_counter() - start
    bar.finish(result[0], seconds)
    if result != expected:
        raise SystemExit(f"{kind} returned wrong data: (samples, checksum) = {result}, "
                         f"expected {expected}")
    return seconds


def consume_images(loader, on_batch):
    """Reads every image batch; the crops are random (and drawn differently
    by the two loaders), so batches are checked for shape, dtype, finite
    values and labels rather than a checksum."""
    done = 0
    for images, labels in loader:
        if tuple(images.shape[1:]) != (3, 224, 224) or images.dtype != torch.float32:
            raise SystemExit(f"wrong batch: {tuple(images.shape)} {images.dtype}")
        if not torch.isfinite(images.sum()) or len(labels) != len(images):
            raise SystemExit("a batch holds non-finite values or mismatched labels")
        done += len(labels)
        on_batch(done)
    return done


def image_loaders(root, kinds, num_workers, batch_size):
    import images_bench
    import pil_pipeline

    loaders = {}
    if "torch" in kinds:
        dataset = pil_pipeline.image_folder(root, pil_pipeline.train_transform())
        loaders["torch"] = torch.utils.data.DataLoader(dataset, batch_size=batch_size,
                                                       shuffle=True, num_workers=num_workers)
    dataset = fastload.ImageFolder(root, transform=images_bench.fastload_transform("train"))
    loaders["fastload"] = fastload.DataLoader(dataset, batch_size=batch_size, shuffle=True,
                                              num_workers=num_workers)
    return loaders, len(dataset)


def run_images(args, kinds):
    """The image workload; returns result rows."""
    try:
        import imagenet_like
    except ImportError:
        print("Pillow is not installed: skipping the image workload.", file=sys.stderr)
        return []
    root = os.path.join(args.data, f"imagenet-like-{args.images}")
    print(f"Making {args.images} photo-like JPEGs in {root} (once) ...", file=sys.stderr)
    imagenet_like.make_image_folder(root, n_images=args.images)
    title, what = WORKLOADS["images"]
    print(f"{title} ({args.images} images): {what}", file=sys.stderr)
    rows = []
    for nw in [w for w in args.workers if w > 0 or torch is None] or [1]:
        loaders, n = image_loaders(root, kinds, nw, args.batch_size)
        times = {kind: [] for kind in loaders}
        for rep in range(args.repeat + 1):
            for kind, loader in loaders.items():
                label = f"  {kind:<8} num_workers={nw}" + ("  (warm-up)" if rep == 0 else "")
                bar = ProgressBar(label, n)
                start = time.perf_counter()
                done = consume_images(loader, bar.update)
                seconds = time.perf_counter() - start
                bar.finish(done, seconds)
                if done != n:
                    raise SystemExit(f"{kind} delivered {done} images, expected {n}")
                if rep > 0:  # the first pass warms the page cache and the workers
                    times[kind].append(seconds)
        rate = {kind: n / statistics.median(ts) for kind, ts in times.items()}
        rows.append((title, nw, rate.get("torch"), rate["fastload"]))
        del loaders
    print(file=sys.stderr)
    return rows




def parse_args(argv):
    parser = argparse.ArgumentParser(
        description="Compare fastload.DataLoader with torch.utils.data.DataLoader.")
    parser.add_argument("--samples", type=int, default=32768,
                        help="samples per epoch of FixedArrays (default 32768)")
    parser.add_argument("--work-samples", type=int, default=1024,
                        help="samples per epoch of NumpyWork, ~1 ms each (default 1024)")
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2], metavar="N",
                        help="num_workers values to run (default: 0 2)")
    parser.add_argument("--images", type=int, default=1024,
                        help="JPEGs in the generated image folder (default 1024)")
    parser.add_argument("--data", default=os.environ.get("FASTLOAD_BENCH_DATA",
                                                         "/tmp/fastload-bench"),
                        help="where the image folder is made and kept")
    parser.add_argument("--workload", choices=["images", "fixed", "numpy", "all"],
                        default="all")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3,
                        help="runs per loader and configuration; the median is reported (default 3)")
    args = parser.parse_args(argv)
    if (min(args.workers) < 0 or args.samples < 1 or args.work_samples < 1 or args.repeat < 1
            or args.images < 1):
        parser.error("--workers must be >= 0; --samples, --work-samples, --images and "
                     "--repeat >= 1")
    return args


def main(argv=None):
    args = parse_args(argv)
    kinds = loader_kinds()
    names = ["images", "fixed", "numpy"] if args.workload == "all" else [args.workload]
    datasets = {"fixed": FixedArrays(args.samples), "numpy": NumpyWork(args.work_samples)}

    torch_version = torch.__version__ if torch is not None else "not installed"
    print(f"fastload {fastload.__version__}, torch {torch_version}, NumPy {np.__version__}, "
          f"Python {platform.python_version()}; {os.cpu_count()} CPUs ({cpu_model()})")
    if torch is None:
        print("torch is not installed: running fastload alone, with NumPy batches "
              "(pip install torch to see the comparison).")
    print(f"Batch size {args.batch_size}; each configuration runs {args.repeat} time(s) per loader, "
          "alternating; samples/s is the median.\n")

    rows = []
    for name in names:
        if name == "images":
            rows += run_images(args, kinds)
            continue
        dataset = datasets[name]
        title, what = WORKLOADS[name]
        expected = (len(dataset), dataset.expected_checksum(range(len(dataset))))
        extra = ""
        if name == "numpy":
            extra = f", {dataset.time_per_item(calls=50) * 1e3:.2f} ms per sample measured here"
        print(f"{title} ({len(dataset)} samples): {what}{extra}", file=sys.stderr)
        for nw in args.workers:
            loaders = {kind: make_loader(kind, dataset, nw, args.batch_size) for kind in kinds}
            times = {kind: [] for kind in kinds}
            for _ in range(args.repeat):
                for kind in kinds:
                    # A few untimed batches first: first-use costs, and the
                    # copy-on-write page faults that torch's forked workers
                    # leave on this process's memory, are not the next
                    # loader's to pay.
                    warm_up(loaders[kind])
                    times[kind].append(run_once(kind, loaders[kind], dataset, nw, expected))
            rate = {kind: len(dataset) / statistics.median(ts) for kind, ts in times.items()}
            rows.append((title, nw, rate.get("torch"), rate["fastload"]))
            del loaders
        print(file=sys.stderr)

    print("All batches checked: every sample arrived (checksums match where the data is "
          "not randomly augmented).\n")
    header = ("workload", "num_workers", "torch samples/s", "fastload samples/s", "speed-up")
    lines = []
    for title, nw, t, f in rows:
        lines.append((title, str(nw), f"{t:,.0f}" if t else "n/a", f"{f:,.0f}",
                      f"{f / t:.2f}x" if t else "n/a"))
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(header)]
    print("  ".join(h.ljust(w) if i < 2 else h.rjust(w) for i, (h, w) in enumerate(zip(header, widths))))
    print("  ".join("-" * w for w in widths))
    for line in lines:
        print("  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths))))
    if torch is not None:
        print("\nspeed-up = fastload samples/s / torch samples/s, same process, same data.  "
              "Full benchmarks: benchmarks/images_bench.py, compare.py, arrays_bench.py "
              "(see docs/benchmarks.md).")


if __name__ == "__main__":
    main()
