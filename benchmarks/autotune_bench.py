"""num_workers="auto" against a sweep of fixed (num_workers, prefetch_factor).

    python benchmarks/autotune_bench.py            # both pipelines, full size
    python benchmarks/autotune_bench.py --quick    # small, for a smoke run

Two pipelines, each with a consumer that simulates a training step per
batch (``time.sleep``: the CPU is free meanwhile, as while a GPU computes):

* jpeg: ``fastload.ImageFolder`` over generated ImageNet-like photos
  (benchmarks/imagenet_like.py) with RandomResizedCrop(224) + flip +
  ToTensor + Normalize, batch 32, native C workers;
* numpy: ``workloads.NumpyWork`` (a Python dataset, ~1 ms of GIL-releasing
  NumPy work per sample), batch 32, thread workers.

For each, in this one process: one epoch per fixed setting of the sweep
(workers 1, 2, 4, ... up to the usable cores; prefetch 2 and 4), then one
epoch of a fresh ``num_workers="auto"`` loader, timed from ``iter()`` to its
last batch like the fixed ones, so its climb counts against it.  Prints
Markdown: every setting's batches per second, auto's first epoch as a ratio
of the best fixed setting, and what auto chose (``autotune_report()``).

``--epochs N`` adds the hardest case for a tuner: the JPEG pipeline at batch
64 with no training step, persistent loaders (auto and each fixed worker
count at prefetch 2) run epoch by epoch in turn, so each epoch of auto is
compared with the same epoch of the fixed settings, measured moments apart.
"""

import argparse
import os
import sys
import time

# This checkout's fastload, even where another one is installed.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import fastload  # noqa: E402
from fastload import transforms as T  # noqa: E402
from fastload.loader.autotune import usable_cores  # noqa: E402

import imagenet_like  # noqa: E402
from workloads import NumpyWork, cpu_model  # noqa: E402

BATCH = 32
MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
FULL = dict(images=3000, numpy_samples=12000)
QUICK = dict(images=2 * BATCH + 5, numpy_samples=2 * BATCH + 5)


def log(msg):
    sys.stderr.write(f"{msg}\n")
    sys.stderr.flush()


def jpeg_dataset(root):
    return fastload.ImageFolder(root, transform=T.Compose(
        [T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(),
         T.Normalize(MEAN, STD)]))


def epoch(loader, step_seconds):
    """Batches per second over one epoch, from iter() on; each batch is
    read (its sum), then the consumer 'trains' for step_seconds."""
    start = time.perf_counter()
    n = 0
    for images, _ in loader:
        if not float(images.sum()) == float(images.sum()):  # NaN check, and a read
            raise AssertionError("non-finite values in a batch")
        n += 1
        if step_seconds:
            time.sleep(step_seconds)
    return n / (time.perf_counter() - start)


def sweep_workers(cores):
    counts, w = [], 1
    while w < cores:
        counts.append(w)
        w *= 2
    return counts + [cores]


def run(name, dataset, mode, step_seconds, cores, prefetches=(2, 4)):
    rows = []
    for workers in sweep_workers(cores):
        for prefetch in prefetches:
            loader = fastload.DataLoader(dataset, batch_size=BATCH, shuffle=True,
                                         num_workers=workers, prefetch_factor=prefetch,
                                         worker_mode=mode)
            rate = epoch(loader, step_seconds)
            log(f"{name}: workers={workers} prefetch={prefetch}: {rate:.1f} batches/s")
            rows.append((workers, prefetch, rate))
            del loader
    auto = fastload.DataLoader(dataset, batch_size=BATCH, shuffle=True, num_workers="auto",
                               worker_mode=mode)
    auto_rate = epoch(auto, step_seconds)
    report = auto.autotune_report()
    log(f"{name}: auto: {auto_rate:.1f} batches/s, {report['workers']} workers, "
        f"prefetch {report['prefetch']}")
    return rows, auto_rate, report


def persistent_epochs(dataset, cores, epochs, batch_size=64):
    """Per epoch: auto's batches per second and the best fixed count's, the
    loaders persistent and run in turn, epoch by epoch."""
    loaders = {w: fastload.DataLoader(dataset, batch_size=batch_size, shuffle=True,
                                      num_workers=w, persistent_workers=True)
               for w in sweep_workers(cores)}
    loaders["auto"] = fastload.DataLoader(dataset, batch_size=batch_size, shuffle=True,
                                          num_workers="auto", persistent_workers=True)
    rows = []
    for e in range(epochs):
        rates = {name: epoch(loader, 0.0) for name, loader in loaders.items()}
        best = max((w for w in rates if w != "auto"), key=rates.get)
        rows.append((e, rates["auto"], best, rates[best]))
        log(f"epoch {e}: auto {rates['auto']:.1f}/s, best fixed {best}: {rates[best]:.1f}/s")
    return rows, loaders["auto"].autotune_report()


def persistent_markdown(rows, report):
    out = ["### jpeg, persistent loaders, no training step (batch 64)", "",
           "| epoch | auto batches/s | best fixed | its batches/s | auto / best |",
           "|---:|---:|---:|---:|---:|"]
    out += [f"| {e} | {a:.1f} | {w} | {b:.1f} | **{a / b:.3f}** |" for e, a, w, b in rows]
    out += ["", f"auto chose {report['workers']} workers, prefetch {report['prefetch']} "
            f"({report['reason']}); searches reopened: {report['reopened']}", ""]
    return "\n".join(out)


def markdown(name, step_seconds, rows, auto_rate, report):
    best = max(rows, key=lambda r: r[2])
    out = [f"### {name} (consumer step {step_seconds * 1e3:g} ms per batch)", "",
           "| workers | prefetch | batches/s |", "|---:|---:|---:|"]
    out += [f"| {w} | {p} | {r:.1f} |" for w, p, r in rows]
    out += [f"| **auto** | | **{auto_rate:.1f}** |", "",
            f"auto / best fixed ({best[0]} workers, prefetch {best[1]}): "
            f"**{auto_rate / best[2]:.3f}**; auto chose {report['workers']} workers, prefetch "
            f"{report['prefetch']} ({report['in_flight']} in flight), settled: "
            f"{report['reason']}; windows: "
            + ", ".join(f"{s['workers']}x{s['prefetch']} {s['batches_per_s']:.0f}/s "
                        f"{s['decision']}" for s in report["steps"]), ""]
    return "\n".join(out)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--root", default=os.path.join(os.path.expanduser("~"), ".cache",
                                                       "fastload-bench", "autotune"))
    parser.add_argument("--pipelines", default="jpeg,numpy")
    parser.add_argument("--jpeg-step-ms", type=float, default=20.0)
    parser.add_argument("--numpy-step-ms", type=float, default=5.0)
    parser.add_argument("--epochs", type=int, default=0,
                        help="also run persistent loaders for this many epochs (jpeg, no step)")
    args = parser.parse_args(argv)
    size = QUICK if args.quick else FULL
    cores = usable_cores()
    print(f"## num_workers='auto' vs fixed settings\n\n{cpu_model()}, {cores} usable cores, "
          f"batch {BATCH}, one epoch each.\n")
    results = {}
    for pipeline in args.pipelines.split(","):
        if pipeline == "jpeg":
            root = imagenet_like.make_image_folder(os.path.join(args.root, f"jpeg{size['images']}"),
                                                   n_images=size["images"], n_classes=10)
            step = args.jpeg_step_ms / 1e3
            rows, rate, report = run("jpeg", jpeg_dataset(root), "thread", step, cores)
        else:
            step = args.numpy_step_ms / 1e3
            rows, rate, report = run("numpy", NumpyWork(size["numpy_samples"]), "thread", step,
                                     cores)
        print(markdown(pipeline, step, rows, rate, report))
        results[pipeline] = (rows, rate, report)
    if args.epochs:
        root = imagenet_like.make_image_folder(os.path.join(args.root, f"jpeg{size['images']}"),
                                               n_images=size["images"], n_classes=10)
        rows, report = persistent_epochs(jpeg_dataset(root), cores, args.epochs,
                                         batch_size=2 * BATCH)
        print(persistent_markdown(rows, report))
        results["persistent"] = (rows, report)
    return results


if __name__ == "__main__":
    main()
