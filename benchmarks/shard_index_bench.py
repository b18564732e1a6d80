"""Making a WebDataset: reading every shard's tar headers and label members,
against reading the shards' index files (fastload.datasets.shard_index).

    python benchmarks/shard_index_bench.py [--samples 400000] [--shards 40] [--repeats 5]

Shards of tiny samples (a 64-byte ``.jpg`` stand-in and a ``.cls``; indexing
cost is per member, not per byte) are written once with tarfile; the two
ways then alternate, ``index_threads=1`` (one core's cost; threads divide
both), page cache warm.  Prints the median seconds of each, per million
samples, and the ratio.
"""

import argparse
import io
import os
import statistics
import sys
import tarfile
import tempfile
import time

try:
    import fastload
except ImportError:  # run from a checkout built in place
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import fastload


def write(folder, samples, shards):
    paths, n = [], 0
    per = -(-samples // shards)
    for s in range(shards):
        path = os.path.join(folder, f"s-{s:05d}.tar")
        with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tf:
            for _ in range(min(per, samples - n)):
                for ext, data in (("jpg", b"\xff\xd8" + bytes(62)), ("cls", b"%d" % (n % 1000))):
                    info = tarfile.TarInfo(f"{n:09d}.{ext}")
                    info.size = len(data)
                    tf.addfile(info, io.BytesIO(data))
                n += 1
        paths.append(path)
    return paths


def measure(paths, repeats):
    fastload.WebDataset(paths, index_threads=1)  # writes the index files
    times = {"headers": [], "index files": []}
    for _ in range(repeats):
        for name, index_files in (("headers", False), ("index files", True)):
            started = time.perf_counter()
            ds = fastload.WebDataset(paths, index_threads=1, index_files=index_files)
            times[name].append(time.perf_counter() - started)
    return len(ds), {name: statistics.median(t) for name, t in times.items()}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=400_000)
    parser.add_argument("--shards", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        count, medians = measure(write(folder, args.samples, args.shards), args.repeats)
    print(f"{count} samples in {args.shards} shards, one thread, median of {args.repeats}")
    print(f"{'read':<12} {'seconds':>8} {'s per million':>14}")
    for name, seconds in medians.items():
        print(f"{name:<12} {seconds:>8.3f} {seconds * 1e6 / count:>14.3f}")
    print(f"index files: {medians['headers'] / medians['index files']:.1f}x faster")
    return medians


if __name__ == "__main__":
    main()
