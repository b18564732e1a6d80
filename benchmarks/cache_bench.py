"""The sample cache: epoch 2 of an ImageFolder with and without ``cache=``,
against torch's DataLoader over torchvision's ImageFolder.

    python benchmarks/cache_bench.py            # 2000 generated photos
    python benchmarks/cache_bench.py --quick    # 256 photos, fewer repetitions

A generated ImageNet-like folder (benchmarks/imagenet_like.py) is read with
the validation transform (Resize(256) + CenterCrop(224) + ToTensor +
Normalize) at batch 64 and 2 workers by:

* torch: torch's DataLoader over torchvision's ImageFolder (2 worker
  processes);
* fastload: fastload's DataLoader over ``fastload.ImageFolder`` (2 worker
  threads), without a cache;
* fastload cached: the same with ``cache="memory"``, filled by an untimed
  first epoch, so every timed epoch reads the cache;
* fastload decoded: the same with ``cache_decoded=True``: the cache keeps
  the images' decoded pixels (sized for all of them), so the timed epochs
  decode nothing.  (Its images are decoded whole, as ``decode="exact"``;
  the other fastload loaders use the default ``decode="fast"``.)

``--transform train`` reads with the training transform instead
(RandomResizedCrop(224) + flip + ToTensor + Normalize).

Each is timed twice an epoch: with the files in the page cache ("warm":
the first, untimed epoch read them), and with every file dropped from the
page cache before the epoch (``posix_fadvise(POSIX_FADV_DONTNEED)``:
"cold", what a dataset larger than the page cache, or one on a network
file system, costs).  The cache itself lives in shared memory, which the
drop does not touch.  Throughput is images per second of whole epochs of
persistent loaders, the median of the repetitions.  Prints Markdown.
"""

import argparse
import os
import statistics
import sys

try:
    import fastload
except ImportError:  # run from a checkout built in place
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import fastload

import torch

import imagenet_like
import pil_pipeline
from images_bench import BATCH, epoch, fastload_transform, log

WORKERS = 2
LOADERS = ("torch", "fastload", "fastload cached", "fastload decoded")
FULL = dict(images=2000, reps=3)
QUICK = dict(images=256, reps=1)


def drop_page_cache(paths):
    """Asks the kernel to forget the files' cached pages; returns how many
    files it could ask about."""
    dropped = 0
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            dropped += 1
        finally:
            os.close(fd)
    return dropped


def decoded_size(files):
    """Bytes of a cache holding every image's pixels (3 bytes a pixel, a
    16-byte header, 8-byte aligned) and its index."""
    from PIL import Image

    data = 0
    for path in files:
        with Image.open(path) as image:
            width, height = image.size
        data += (16 + 3 * width * height + 7) // 8 * 8
    return fastload._C.SampleCache.overhead(len(files)) + data


def make_loader(name, root, kind, files):
    if name == "torch":
        tf = pil_pipeline.val_transform() if kind == "val" else pil_pipeline.train_transform()
        dataset = pil_pipeline.image_folder(root, tf)
        return torch.utils.data.DataLoader(dataset, batch_size=BATCH, num_workers=WORKERS,
                                           persistent_workers=True, shuffle=kind == "train")
    cache = dict(cache="memory") if name == "fastload cached" else {}
    if name == "fastload decoded":
        cache = dict(cache="memory", cache_decoded=True, cache_size=decoded_size(files))
    dataset = fastload.ImageFolder(root, transform=fastload_transform(kind), **cache)
    return fastload.DataLoader(dataset, batch_size=BATCH, num_workers=WORKERS,
                               persistent_workers=True, shuffle=kind == "train")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--data", default=os.path.join(os.path.dirname(__file__), "data"))
    parser.add_argument("--transform", choices=("val", "train"), default="val")
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    root = imagenet_like.make_image_folder(os.path.join(args.data, f"cache_{sizes['images']}"),
                                           n_images=sizes["images"])
    files = [p for p, _ in fastload.ImageFolder(root).samples]
    n = len(files)
    loaders = {name: make_loader(name, root, args.transform, files) for name in LOADERS}
    for name, loader in loaders.items():  # workers started, files read, the cache filled
        log(f"first epoch: {name}")
        epoch(loader, n)
    times = {(name, temp): [] for name in LOADERS for temp in ("warm", "cold")}
    for rep in range(sizes["reps"]):
        for temp in ("warm", "cold"):
            for name, loader in loaders.items():  # interleaved: a slow moment hits all
                log(f"rep {rep + 1}: {name}, {temp}")
                if temp == "cold":
                    drop_page_cache(files)
                times[name, temp].append(epoch(loader, n))
    caches = {name: loaders[name].dataset.cache.stats()
              for name in ("fastload cached", "fastload decoded")}
    rate = {key: n / statistics.median(t) for key, t in times.items()}
    mib = sum(os.path.getsize(p) for p in files) / 2 ** 20
    print(f"### Sample cache: epoch 2, {n} JPEGs ({mib:.0f} MiB), {args.transform} "
          f"transform, batch {BATCH}, {WORKERS} workers\n")
    print("| loader | warm page cache (img/s) | files dropped (img/s) |")
    print("|---|---:|---:|")
    for name in LOADERS:
        print(f"| {name} | {rate[name, 'warm']:.0f} | {rate[name, 'cold']:.0f} |")
    print()
    for temp in ("warm", "cold"):
        for name in ("fastload cached", "fastload decoded"):
            print(f"- {temp}: {name} / fastload = "
                  f"{rate[name, temp] / rate['fastload', temp]:.2f}x, "
                  f"{name} / torch = {rate[name, temp] / rate['torch', temp]:.2f}x")
    for name, stats in caches.items():
        print(f"- {name}: {stats['stored']} samples stored, {stats['hits']} hits, "
              f"{stats['corrupt']} corrupt, {stats['used'] / 2 ** 20:.0f} MiB used")


if __name__ == "__main__":
    main()
