"""Building an ImageFolder over many files: torchvision's against fastload's
first construction (the tree listed in C, the index file written) and its
second (the index file read, each folder stat'ed).

    python benchmarks/scan_bench.py                # 1 M empty files, 1000 classes
    python benchmarks/scan_bench.py --files 200000

The files are empty (made once under --data, default /tmp/fastload-bench,
and reused): this measures listing, sorting and storing paths, which is all
a dataset does before its first sample.  One round is torchvision, fastload
without an index file (it writes one), fastload again (it reads it), and
fastload with ``index=False``; rounds are interleaved, medians printed with
the ratios; every dataset is checked to hold torchvision's samples.  A tree
made just now is left to age ``--settle`` seconds first: folders changed
within folder_index.RACY_SECONDS of a scan are read again at each check
until then.  Prints Markdown.
"""

import argparse
import gc
import os
import statistics
import sys
import time

try:
    import fastload
except ImportError:  # run from a checkout built in place
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import fastload

from fastload.datasets import folder_index

import pil_pipeline


def make_files(root, n_files, n_classes=1000):
    """A tree of n_files empty files in n_classes folders, made once."""
    marker = os.path.join(root, f".complete-{n_files}")
    if os.path.exists(marker):
        return root
    per_class = -(-n_files // n_classes)
    made = 0
    for c in range(n_classes):
        folder = os.path.join(root, f"n{c:08d}")
        os.makedirs(folder, exist_ok=True)
        for i in range(min(per_class, n_files - made)):
            os.close(os.open(os.path.join(folder, f"n{c:08d}_{i:06d}.JPEG"),
                             os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o644))
        made += per_class
    open(marker, "wb").close()
    return root


def drop_index(root):
    for path in folder_index._paths(root):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


BUILDERS = {
    "torchvision rules": lambda root: pil_pipeline.image_folder(root),
    "fastload": lambda root: fastload.ImageFolder(root),
}

# label: (untimed preparation or None, construction)
ROUND = {
    "torchvision": (None, lambda root: pil_pipeline.image_folder(root)),
    "fastload, first (scan, index written)": (drop_index, lambda root: fastload.ImageFolder(root)),
    "fastload, second (index read)": (None, lambda root: fastload.ImageFolder(root)),
    "fastload, index=False": (None, lambda root: fastload.ImageFolder(root, index=False)),
}


def timed(step, root):
    """Seconds to build, and the dataset."""
    prepare, build = step
    if prepare is not None:
        prepare(root)
    gc.collect()
    start = time.perf_counter()
    dataset = build(root)
    return time.perf_counter() - start, dataset


def settle(root, seconds):
    """Waits until the tree's newest folder is `seconds` old."""
    newest = max(os.stat(os.path.join(root, name)).st_ctime for name in os.listdir(root))
    newest = max(newest, os.stat(root).st_ctime)
    wait = newest + seconds - time.time()
    if wait > 0:
        time.sleep(wait)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=1_000_000)
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--settle", type=float, default=folder_index.RACY_SECONDS + 1)
    parser.add_argument("--data", default=os.environ.get("FASTLOAD_BENCH_DATA",
                                                         "/tmp/fastload-bench"))
    args = parser.parse_args(argv)
    name = f"scan-{args.files}" + ("" if args.classes == 1000 else f"-{args.classes}")
    root = make_files(os.path.join(args.data, name), args.files, args.classes)
    settle(root, args.settle)
    reference = None
    for label, step in ROUND.items():  # untimed: the kernel's directory caches warm
        _, dataset = timed(step, root)
        samples = list(dataset.samples)
        if reference is None:
            reference = samples
        assert samples == reference, f"{label}: not torchvision's samples"
        assert len(samples) == args.files, (label, len(samples))
        del dataset, samples
    times = {label: [] for label in ROUND}
    info = {}
    for _ in range(args.repeats):
        for label, step in ROUND.items():
            seconds, dataset = timed(step, root)
            times[label].append(seconds)
            info[label] = getattr(dataset, "scan_info", None)
            del dataset
    med = {label: statistics.median(ts) for label, ts in times.items()}
    tv = med["torchvision"]
    print(f"## ImageFolder over {args.files:,} files ({args.classes} classes)\n")
    print("| construction | time (s), median of "
          f"{args.repeats} | torchvision / this | folders read | folders stat'ed |")
    print("|---|---:|---:|---:|---:|")
    for label in ROUND:
        i = info[label]
        read, checked = ("", "") if i is None else (i["dirs_read"], i["dirs_checked"])
        print(f"| {label} | {med[label]:.3f} | {tv / med[label]:.1f}x | {read} | {checked} |")
    second = info["fastload, second (index read)"]
    assert second["reused"], "the second construction did not read the index"
    print(f"\nfirst construction {tv / med['fastload, first (scan, index written)']:.1f}x faster "
          f"than torchvision's, second {tv / med['fastload, second (index read)']:.1f}x faster "
          f"(index file: {os.path.getsize(second['index']) / (1 << 20):.1f} MiB).")
    return med


if __name__ == "__main__":
    main()
