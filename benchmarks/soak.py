"""Soak: the JPEG pipeline for many small epochs, watching for leaks.

    python benchmarks/soak.py                    # 1000 epochs
    python benchmarks/soak.py --epochs 50        # the short version CI runs

Each epoch is a fresh iterator over a small folder of generated JPEGs, a
few damaged files among them (on_error="skip"), with the training
transform, alternating 1 and 2 workers and persistent and non-persistent
workers.  After a warm-up, the resident memory, the open file descriptors
and the thread count must stay flat: at the end, RSS may have grown by at
most --rss-slack MiB over the warm-up level, and descriptors and threads
must be back where they were.  Prints one line every --report epochs and a
summary; exits 1 when a bound is broken.
"""

import argparse
import gc
import os
import pathlib
import sys
import tempfile
import time

try:
    import fastload
except ImportError:  # run from a checkout built in place
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import fastload

import corrupt_jpegs
import imagenet_like
from fastload import transforms as T

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "tests"))
from proc_info import native_thread_count, rss_bytes  # noqa: E402


def open_fds():
    return len(os.listdir("/proc/self/fd"))


def make_folder(root):
    imagenet_like.make_image_folder(root, n_images=96, n_classes=3, processes=1)
    good = pathlib.Path(root, "class_00", "img_00000.jpg").read_bytes()
    for k, (_, data) in enumerate(corrupt_jpegs.damaged("img", good, flips=2)[:6]):
        pathlib.Path(root, "class_01", f"zz_bad_{k}.jpg").write_bytes(data)
    return root


def loaders(root):
    tf = T.Compose([T.RandomResizedCrop(64), T.RandomHorizontalFlip(), T.ToTensor(),
                    T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
    ds = fastload.ImageFolder(root, transform=tf, on_error="skip")
    return ds, [
        fastload.DataLoader(ds, batch_size=16, shuffle=True, num_workers=1),
        fastload.DataLoader(ds, batch_size=16, shuffle=True, num_workers=2),
        fastload.DataLoader(ds, batch_size=16, shuffle=True, num_workers=2,
                            persistent_workers=True),
    ]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--report", type=int, default=100)
    parser.add_argument("--rss-slack", type=float, default=16.0, help="MiB")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = make_folder(os.path.join(tmp, "folder"))
        ds, cycle = loaders(root)
        start = time.perf_counter()
        baseline = None
        peak_rss = 0
        for epoch in range(args.epochs):
            loader = cycle[epoch % len(cycle)]
            n = sum(len(labels) for _, labels in loader)
            if n != len(ds):
                sys.exit(f"epoch {epoch}: {n} samples, expected {len(ds)}")
            gc.collect()
            if epoch == args.warmup:
                baseline = (rss_bytes(), open_fds(), native_thread_count())
            if baseline is not None:
                peak_rss = max(peak_rss, rss_bytes())
            if (epoch + 1) % args.report == 0 or epoch + 1 == args.epochs:
                print(f"epoch {epoch + 1}: RSS {rss_bytes() / 2**20:.1f} MiB, "
                      f"{open_fds()} fds, {native_thread_count()} threads, "
                      f"{ds.skipped_count} skips, {time.perf_counter() - start:.0f} s", flush=True)
        if baseline is None:
            sys.exit("--epochs must exceed --warmup")
        # Persistent workers stay up while their loader lives: drop them all.
        del loader, cycle
        gc.collect()
        rss, fds, threads = rss_bytes(), open_fds(), native_thread_count()
        grown = (peak_rss - baseline[0]) / 2**20
        print(f"after {args.epochs} epochs: RSS peak {grown:+.1f} MiB over the warm-up level, "
              f"fds {baseline[1]} -> {fds}, threads {baseline[2]} -> {threads}")
        failures = []
        if grown > args.rss_slack:
            failures.append(f"RSS grew by {grown:.1f} MiB")
        if fds > baseline[1]:
            failures.append(f"{fds - baseline[1]} file descriptors leaked")
        if threads > baseline[2]:
            failures.append(f"{threads - baseline[2]} threads left running")
        if failures:
            sys.exit("soak failed: " + "; ".join(failures))
        print("soak ok")


if __name__ == "__main__":
    main()
