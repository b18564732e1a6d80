"""Making a WebDataset of ImageNet-21k's size from index files, and what one
rank of many then reads: its own shards' index files only.

    python benchmarks/shard_share_bench.py [--samples 14000000] [--per-shard 1000]
                                           [--world 1024] [--repeats 3]

Writing 14 million real samples takes hours, and constructing a dataset reads
no shard data once index files exist, so the shards here are sparse files of
a real shard's size and each index file holds a real 1,000-sample shard's
index (written by ``WebDataset`` over a tar of tiny samples), under each
sparse shard's own size and mtime.  Timed, page cache warm, alternating:

- *construct*: ``WebDataset(urls)``, which reads each index file's header
  (its sample count);
- *rank's share*: then the index files of the shards in rank 0's share of
  epoch 0 at ``--world`` ranks (``ShardSampler``), as the loader reads them
  for the rank's first batches;
- *every index file*: then every shard's (what each rank read before index
  files were read by share, and what a sampler over the whole dataset reads).

About 2.4 GB of index files are written under a temporary folder.
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
from fastload.datasets import shard_index


def template(folder, per_shard):
    """A real shard of ``per_shard`` tiny samples: its size, and the member
    index and derived arrays of its index file."""
    path = os.path.join(folder, "template.tar")
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tf:
        for n in range(per_shard):
            for ext, data in (("jpg", b"\xff\xd8" + bytes(62)), ("cls", b"%d" % (n % 1000))):
                info = tarfile.TarInfo(f"{n:09d}.{ext}")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    fastload.WebDataset(path)  # writes its index file
    found = shard_index.load(path)
    return os.path.getsize(path), found.member_index(), found.kept()


def write(folder, shards, per_shard):
    size, index, kept = template(folder, per_shard)
    paths = []
    for s in range(shards):
        path = os.path.join(folder, f"train-{s:06d}.tar")
        with open(path, "wb") as f:
            f.truncate(size)  # sparse: the shard's size, no data
        shard_index.save(path, index, kept)
        paths.append(path)
    return paths


def measure(paths, world, repeats):
    times = {"construct": [], "rank's share": [], "every index file": []}
    for _ in range(repeats):
        for whole in (False, True):
            started = time.perf_counter()
            ds = fastload.WebDataset(paths)
            built = time.perf_counter()
            if whole:
                ds._ready(ds.shard_starts[:-1])
                times["every index file"].append(time.perf_counter() - built)
            else:
                sampler = fastload.ShardSampler(ds, rank=0, world_size=world)
                first, end = sampler.share()
                ds._ready(list(sampler.stream(first, end)))
                times["rank's share"].append(time.perf_counter() - built)
                times["construct"].append(built - started)
                shards_read = len(paths) - len(ds._unloaded)
            del ds
    return shards_read, {name: statistics.median(t) for name, t in times.items()}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=14_000_000)
    parser.add_argument("--per-shard", type=int, default=1000)
    parser.add_argument("--world", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    shards = args.samples // args.per_shard
    with tempfile.TemporaryDirectory() as folder:
        paths = write(folder, shards, args.per_shard)
        shards_read, medians = measure(paths, args.world, args.repeats)
    print(f"{shards * args.per_shard} samples in {shards} shards, median of {args.repeats}; "
          f"rank 0 of {args.world} reads {shards_read} shards' index files")
    print(f"{'':<18} {'seconds':>8}")
    for name, seconds in medians.items():
        print(f"{name:<18} {seconds:>8.3f}")
    ratio = ((medians["construct"] + medians["every index file"])
             / (medians["construct"] + medians["rank's share"]))
    print(f"a rank's start: {ratio:.1f}x faster than reading every index file")
    return medians


if __name__ == "__main__":
    main()
