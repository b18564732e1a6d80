"""Building an ImageFolder over many files: fastload against torchvision's
rules (benchmarks/pil_pipeline.py; torchvision's own when installed).

    python benchmarks/scan_bench.py                # 1.28 M empty files, 1000 classes
    python benchmarks/scan_bench.py --files 200000

The files are empty (made once, under --data): this measures listing,
sorting and storing paths, which is all a dataset does before its first
sample.  Interleaved, medians of 3; the Python memory each dataset holds
afterwards is measured with tracemalloc.  Prints Markdown.
"""

import argparse
import gc
import os
import statistics
import sys
import time
import tracemalloc

try:
    import fastload
except ImportError:  # run from a checkout built in place
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import fastload

import pil_pipeline


def make_files(root, n_files, n_classes=1000):
    marker = os.path.join(root, f".complete-{n_files}")
    if os.path.exists(marker):
        return root
    per_class = -(-n_files // n_classes)
    made = 0
    for c in range(n_classes):
        folder = os.path.join(root, f"n{c:08d}")
        os.makedirs(folder, exist_ok=True)
        for i in range(min(per_class, n_files - made)):
            open(os.path.join(folder, f"n{c:08d}_{i:06d}.JPEG"), "wb").close()
        made += per_class
    open(marker, "wb").close()
    return root


BUILDERS = {
    "torchvision rules": lambda root: pil_pipeline.image_folder(root),
    "fastload": lambda root: fastload.ImageFolder(root),
}


def timed(build, root):
    gc.collect()
    start = time.perf_counter()
    dataset = build(root)
    seconds = time.perf_counter() - start
    del dataset
    return seconds


def held_memory(build, root):
    """Bytes of Python allocations the built dataset keeps alive."""
    gc.collect()
    tracemalloc.start()
    dataset = build(root)
    gc.collect()
    held = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    n = len(dataset)
    del dataset
    return held, n


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=1_281_167)
    parser.add_argument("--data", default=os.environ.get("FASTLOAD_BENCH_DATA",
                                                         "/tmp/fastload-bench"))
    args = parser.parse_args()
    root = make_files(os.path.join(args.data, f"scan-{args.files}"), args.files)
    for build in BUILDERS.values():
        timed(build, root)  # untimed: the directory entries in the kernel's cache
    times = {name: [] for name in BUILDERS}
    for _ in range(3):
        for name, build in BUILDERS.items():
            times[name].append(timed(build, root))
    print(f"## ImageFolder over {args.files:,} files (1000 classes)\n")
    print("| dataset | build time (s) | Python memory held (MiB) |")
    print("|---|---:|---:|")
    med = {name: statistics.median(ts) for name, ts in times.items()}
    for name, build in BUILDERS.items():
        held, n = held_memory(build, root)
        assert n == args.files, (name, n)
        print(f"| {name} | {med[name]:.2f} | {held / (1 << 20):,.0f} |")
    print(f"\nfastload builds it {med['torchvision rules'] / med['fastload']:.2f}x faster.")


if __name__ == "__main__":
    main()
