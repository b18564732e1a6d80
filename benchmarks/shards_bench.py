"""WebDataset tar shards: fastload's reader against the webdataset package.

    python benchmarks/shards_bench.py            # 2000 generated photos, 16 shards
    python benchmarks/shards_bench.py --quick    # 256 photos, fewer repetitions

A generated ImageNet-like folder (benchmarks/imagenet_like.py) is written
once as WebDataset shards: each sample a ``<key>.jpg`` member holding the
original JPEG file's bytes and a ``<key>.cls`` member holding its class
index, 128 samples a shard, in a fixed shuffled order (as ImageNet shards
are written).  Three loaders then run the same training transform
(RandomResizedCrop(224) + RandomHorizontalFlip + ToTensor + Normalize) at
batch 64 with ``num_workers`` 0, 1 and 2, interleaved in this one process:

* webdataset: ``webdataset.WebDataset(urls, shardshuffle=...)`` with a
  1000-sample shuffle buffer, ``decode("pil")``, ``to_tuple("jpg", "cls")``
  and the torchvision-equivalent transform (benchmarks/pil_pipeline.py;
  torchvision's own when it is installed) in ``map_tuple``, through
  torch's DataLoader, which gives each worker its share of the shards
  (webdataset's ``split_by_worker``);
* fastload shards: ``fastload.WebDataset`` over the same shards,
  ``fastload.ShardSampler`` (shards in a shuffled order, the same 1000-sample
  buffer) and ``fastload.DataLoader`` with ``fastload.transforms``;
* fastload folder: ``fastload.ImageFolder`` over the original files,
  ``shuffle=True``, the same transform.

Throughput is images per second over whole epochs of persistent loaders
(an untimed first epoch starts the workers and warms the page cache), the
median of the repetitions; the **pairs** columns give the range of the
ratio over the repetitions, each pair measured seconds apart.  Time to
first batch is ``next(iter(loader))`` of a loader made just before (workers
started by that call), and, in the second table, the same with the dataset
and loader made inside the timing (fastload indexes every shard's tar
headers then; webdataset reads nothing until iterated).  Every batch's
shape and dtype are checked and its values read; every epoch's labels are
counted against the dataset's.  A third table splits one thread's time per
image between the stages of webdataset's pipeline, beside what
libjpeg-turbo's whole-image decode alone costs fastload.  Prints Markdown on
stdout.
"""

import argparse
import gc
import io
import json
import os
import statistics
import sys
import tarfile
import time

try:
    import fastload
except ImportError:  # run from a checkout built in place
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import fastload

import numpy as np
import torch

import imagenet_like
import pil_pipeline
from images_bench import BATCH, fastload_transform, log
from workloads import cpu_model

SAMPLES_PER_SHARD = 128
SHUFFLE_BUFFER = 1000
WORKERS = (0, 1, 2)
LOADERS = ("webdataset", "fastload shards", "fastload folder")
FULL = dict(images=2000, reps=5, first_batches=7)
QUICK = dict(images=256, reps=2, first_batches=2)
SHARDS_MANIFEST = "shards.json"
SHARDS_VERSION = 1  # bumped whenever the bytes written change


def webdataset_or_none():
    try:
        import webdataset
    except ImportError:
        return None
    return webdataset


# ------------------------------------------------------------------ shards


def _folder_samples(folder):
    """(path, class index, class name) of every JPEG, in ImageFolder's order."""
    classes = sorted(e.name for e in os.scandir(folder) if e.is_dir())
    return [(os.path.join(folder, name, f), c, name)
            for c, name in enumerate(classes)
            for f in sorted(os.listdir(os.path.join(folder, name))) if f.endswith(".jpg")]


def _add_member(tar, name, data):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    info.mtime = 0
    tar.addfile(info, io.BytesIO(data))


def write_shards(folder, out_dir, per_shard=SAMPLES_PER_SHARD, seed=0):
    """Writes ``folder``'s JPEGs, their bytes unchanged, as WebDataset shards
    ``out_dir/shard-NNNNNN.tar`` of ``per_shard`` samples each (the last one
    holds the rest), samples in an order shuffled with ``seed``; returns the
    shard paths.  Made once: a manifest written last records what the
    shards were made from."""
    samples = _folder_samples(folder)
    with open(os.path.join(folder, imagenet_like.MANIFEST)) as f:
        source = json.load(f)
    wanted = dict(version=SHARDS_VERSION, source=source, per_shard=per_shard, seed=seed,
                  samples=len(samples))
    n_shards = -(-len(samples) // per_shard)
    paths = [os.path.join(out_dir, f"shard-{s:06d}.tar") for s in range(n_shards)]
    manifest = os.path.join(out_dir, SHARDS_MANIFEST)
    try:
        with open(manifest) as f:
            if json.load(f) == wanted:
                return paths
    except (OSError, ValueError):
        pass
    os.makedirs(out_dir, exist_ok=True)
    for entry in os.scandir(out_dir):
        if entry.name == SHARDS_MANIFEST or entry.name.startswith("shard-"):
            os.remove(entry.path)
    order = np.random.default_rng(seed).permutation(len(samples))
    for s, path in enumerate(paths):
        with tarfile.open(path + ".tmp", "w", format=tarfile.USTAR_FORMAT) as tar:
            for i in order[s * per_shard:(s + 1) * per_shard]:
                file, label, class_name = samples[i]
                key = f"{class_name}_{os.path.splitext(os.path.basename(file))[0]}"
                with open(file, "rb") as f:
                    _add_member(tar, key + ".jpg", f.read())
                _add_member(tar, key + ".cls", str(label).encode())
        os.replace(path + ".tmp", path)
    with open(manifest, "w") as f:
        json.dump(wanted, f)
    return paths


# ------------------------------------------------------------------ loaders


def identity(x):
    return x


def webdataset_loader(urls, workers):
    """The webdataset recipe: shards split between workers, shuffled shards
    and samples, Pillow decoding, torchvision's transform, torch's loader."""
    import webdataset

    dataset = (webdataset.WebDataset(urls, shardshuffle=len(urls), seed=0)
               .shuffle(SHUFFLE_BUFFER)
               .decode("pil")
               .to_tuple("jpg", "cls")
               .map_tuple(pil_pipeline.train_transform(), identity))
    return torch.utils.data.DataLoader(dataset, batch_size=BATCH, num_workers=workers,
                                       persistent_workers=workers > 0)


def fastload_shards_loader(urls, workers):
    dataset = fastload.WebDataset(urls, transform=fastload_transform("train"))
    sampler = fastload.ShardSampler(dataset, buffer_size=SHUFFLE_BUFFER, seed=0)
    return fastload.DataLoader(dataset, batch_size=BATCH, sampler=sampler, num_workers=workers,
                               persistent_workers=workers > 0)


def fastload_folder_loader(folder, workers):
    dataset = fastload.ImageFolder(folder, transform=fastload_transform("train"))
    return fastload.DataLoader(dataset, batch_size=BATCH, shuffle=True, num_workers=workers,
                               persistent_workers=workers > 0)


def builders(folder, urls):
    """Loader name -> a function of ``num_workers`` making that loader, its
    dataset included."""
    return {
        "webdataset": lambda workers: webdataset_loader(urls, workers),
        "fastload shards": lambda workers: fastload_shards_loader(urls, workers),
        "fastload folder": lambda workers: fastload_folder_loader(folder, workers),
    }


def webdataset_stages(urls):
    """webdataset's pipeline cut after each stage, iterated in this process:
    stage name -> a function making an iterable of samples."""
    import webdataset

    def read():
        return webdataset.WebDataset(urls, shardshuffle=len(urls), seed=0).shuffle(SHUFFLE_BUFFER)

    return {
        "read": lambda: read().to_tuple("jpg", "cls"),
        "decode": lambda: read().decode("pil").to_tuple("jpg", "cls"),
        "transform": lambda: read().decode("pil").to_tuple("jpg", "cls").map_tuple(
            pil_pipeline.train_transform(), identity),
    }


def decode_only_loader(folder):
    """libjpeg-turbo's full decode of every file and nothing else, on this
    thread: what decoding alone costs fastload."""
    from images_bench import DecodeOnly, count_decoded

    return fastload.DataLoader(DecodeOnly(folder), batch_size=BATCH, collate_fn=count_decoded)


def stage_costs(folder, urls, n_images, reps):
    """Milliseconds per image of each cut of webdataset's pipeline and of
    fastload's decode alone, one thread each, medians of interleaved runs."""
    stages = webdataset_stages(urls)
    costs = {name: [] for name in (*stages, "decode only")}
    for rep in range(reps):
        for name, make in stages.items():
            log(f"stage costs: webdataset {name} {rep + 1}/{reps}")
            start = time.perf_counter()
            n = sum(1 for _ in make())
            costs[name].append(1000 * (time.perf_counter() - start) / n)
            if n != n_images:
                raise AssertionError(f"webdataset {name}: {n} samples, not {n_images}")
        log(f"stage costs: decode only {rep + 1}/{reps}")
        start = time.perf_counter()
        n = sum(decode_only_loader(folder))
        costs["decode only"].append(1000 * (time.perf_counter() - start) / n)
        if n != n_images:
            raise AssertionError(f"decode only: {n} images, not {n_images}")
    return {name: statistics.median(c) for name, c in costs.items()}


def check_batch(batch, n_classes):
    """Checks one batch and reads every value; returns its labels."""
    images, labels = batch
    if (images.ndim != 4 or tuple(images.shape[1:]) != (3, 224, 224)
            or images.dtype != torch.float32 or not 0 < len(images) <= BATCH):
        raise AssertionError(f"images {tuple(images.shape)} {images.dtype}")
    if labels.dtype != torch.int64 or tuple(labels.shape) != (len(images),):
        raise AssertionError(f"labels {tuple(labels.shape)} {labels.dtype}")
    if not torch.isfinite(images.sum()):
        raise AssertionError("non-finite values in a batch")
    labels = labels.numpy()
    if labels.min() < 0 or labels.max() >= n_classes:
        raise AssertionError(f"labels out of range: {labels.min()}..{labels.max()}")
    return labels


def epoch(loader, class_counts, number=0):
    """Images per second over one epoch.  Checks every batch, and that the
    epoch held each class as often as the dataset does (no sample lost or
    repeated in a way the counts can see)."""
    set_epoch = getattr(getattr(loader, "sampler", None), "set_epoch", None)
    if set_epoch is not None:
        set_epoch(number)
    seen = np.zeros(len(class_counts), np.int64)
    start = time.perf_counter()
    for batch in loader:
        seen += np.bincount(check_batch(batch, len(class_counts)), minlength=len(class_counts))
    elapsed = time.perf_counter() - start
    if not np.array_equal(seen, class_counts):
        raise AssertionError(f"an epoch gave classes {seen.tolist()}, "
                             f"the dataset has {class_counts.tolist()}")
    return int(seen.sum()) / elapsed


def first_batch(build, workers, n_classes):
    """(seconds to ``next(iter(loader))`` of a loader made just before,
    seconds including making the dataset and the loader)."""
    start = time.perf_counter()
    loader = build(workers)
    made = time.perf_counter()
    it = iter(loader)
    batch = next(it)
    done = time.perf_counter()
    check_batch(batch, n_classes)
    if len(batch[1]) != BATCH:
        raise AssertionError(f"a first batch of {len(batch[1])} samples")
    del batch, it, loader
    gc.collect()
    return done - made, done - start


# ------------------------------------------------------------------ report


def run(folder, urls, sizes):
    class_counts = np.bincount([label for _, label, _ in _folder_samples(folder)])
    build = builders(folder, urls)
    throughput, first, first_with_dataset = {}, {}, {}
    for workers in WORKERS:
        loaders = {name: build[name](workers) for name in LOADERS}
        rates = {name: [] for name in LOADERS}
        for rep in range(sizes["reps"]):
            for name, loader in loaders.items():
                log(f"num_workers={workers}: {name} epoch {rep + 1}/{sizes['reps']}")
                if rep == 0:
                    epoch(loader, class_counts)  # untimed: workers up, files in the page cache
                rates[name].append(epoch(loader, class_counts, rep + 1))
        throughput[workers] = rates
        del loaders, loader
        gc.collect()
        times = {name: [] for name in LOADERS}
        for rep in range(sizes["first_batches"]):
            for name in LOADERS:
                log(f"num_workers={workers}: {name} first batch {rep + 1}/{sizes['first_batches']}")
                times[name].append(first_batch(build[name], workers, len(class_counts)))
        first[workers] = {name: statistics.median(t[0] for t in ts) for name, ts in times.items()}
        first_with_dataset[workers] = {name: statistics.median(t[1] for t in ts)
                                       for name, ts in times.items()}
    stages = stage_costs(folder, urls, int(class_counts.sum()), sizes["reps"])
    return throughput, first, first_with_dataset, stages


def print_report(sizes, n_shards, throughput, first, first_with_dataset, stages, load_before,
                 seconds):
    import webdataset

    wds, shards, folder = LOADERS
    tv = pil_pipeline.torchvision_or_none()
    print("## WebDataset shards: fastload vs webdataset + torch DataLoader\n")
    print(f"CPU: {cpu_model()}, {os.cpu_count()} cores; load average {load_before:.2f} before, "
          f"{os.getloadavg()[0]:.2f} after; the run took {seconds:.0f} s.  "
          f"{sizes['images']} generated JPEGs in {n_shards} shards of {SAMPLES_PER_SHARD}; "
          f"batch {BATCH}; train transform; shuffle buffer {SHUFFLE_BUFFER}; webdataset "
          f"{webdataset.__version__}; torchvision: "
          f"{tv.__version__ if tv else 'no (Pillow equivalent)'}.\n")
    print(f"Images/s, medians of {sizes['reps']} interleaved epochs (persistent workers):\n")
    print(f"| workers | {wds} img/s | {shards} img/s | {folder} img/s "
          f"| shards vs webdataset | pairs | shards vs folder | pairs |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for workers in WORKERS:
        rates = throughput[workers]
        med = {name: statistics.median(r) for name, r in rates.items()}
        cells = []
        for other in (wds, folder):
            pairs = [a / b for a, b in zip(rates[shards], rates[other])]
            cells.append(f"**{med[shards] / med[other]:.2f}x** | "
                         f"{min(pairs):.2f}-{max(pairs):.2f}")
        print(f"| {workers} | {med[wds]:,.0f} | {med[shards]:,.0f} | {med[folder]:,.0f} | "
              f"{cells[0]} | {cells[1]} |")
    for title, table in (("a loader made just before", first),
                         ("dataset and loader made inside the timing", first_with_dataset)):
        print(f"\nTime to first batch, ms ({title}; medians of {sizes['first_batches']}):\n")
        print(f"| workers | {wds} | {shards} | {folder} | webdataset / shards |")
        print("|---:|---:|---:|---:|---:|")
        for workers in WORKERS:
            ms = {name: 1000 * s for name, s in table[workers].items()}
            print(f"| {workers} | {ms[wds]:,.1f} | {ms[shards]:,.1f} | {ms[folder]:,.1f} | "
                  f"**{ms[wds] / ms[shards]:.1f}x** |")
    print(f"\nWhere the time goes, one thread (ms per image; webdataset's pipeline cut after "
          f"each stage and iterated in this process; medians of {sizes['reps']}):\n")
    print("| stage | ms per image |")
    print("|---|---:|")
    for label, ms in (
            ("webdataset: read the tar, group members, shuffle buffer", stages["read"]),
            ("... + decode with Pillow (whole image, RGB)", stages["decode"]),
            ("... + transform (crop, resize, flip, ToTensor, Normalize)", stages["transform"]),
            ("... + DataLoader collation (the num_workers=0 epoch above)",
             1000 / statistics.median(throughput[0][wds])),
            ("fastload: libjpeg-turbo whole-image decode alone", stages["decode only"]),
            ("fastload shards, the whole pipeline (the num_workers=0 epoch above)",
             1000 / statistics.median(throughput[0][shards]))):
        print(f"| {label} | {ms:.2f} |")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--data", default=os.environ.get("FASTLOAD_BENCH_DATA",
                                                         "/tmp/fastload-bench"))
    args = parser.parse_args(argv)
    if webdataset_or_none() is None:
        sys.exit("shards_bench needs the webdataset package: pip install webdataset")
    sizes = QUICK if args.quick else FULL
    folder = os.path.join(args.data, f"imagenet-like-{sizes['images']}")
    log(f"making {folder} and its shards (once)")
    imagenet_like.make_image_folder(folder, n_images=sizes["images"])
    urls = write_shards(folder, folder + "-shards")
    torch.set_num_threads(1)  # the main process only consumes; workers are single-threaded
    load_before = os.getloadavg()[0]
    start = time.perf_counter()
    results = run(folder, urls, sizes)
    log("done")
    print_report(sizes, len(urls), *results, load_before, time.perf_counter() - start)


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
