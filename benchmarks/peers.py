"""The training pipeline through fastload and its peers, side by side in one run.

    python benchmarks/peers.py                       # 2000 photos, 2 workers, 3 rounds
    python benchmarks/peers.py --images 32 --rounds 1 --batch 8 --peers fastload torch
    python benchmarks/peers.py --json peers.json     # the table as JSON too

One pipeline, each loader in its idiomatic fastest form: JPEG photos,
RandomResizedCrop(224) + random horizontal flip + ToTensor + Normalize
(ImageNet mean/std), batch 64, shuffled, ``--workers`` workers (2), float32
CHW batches out:

* fastload: ``fastload.ImageFolder`` with ``fastload.transforms`` (the C plan
  on native worker threads);
* fastload, restart-marker shards: the same photos written untimed by
  ``fastload.shards_from_image_folder(..., restart_markers=True)`` (each JPEG
  rewritten losslessly so that a crop decodes only the intervals it covers:
  fastload's counterpart of FFCV's .beton), read by ``fastload.WebDataset``
  with the same transform and shuffle; its ratios are a column of their own;
* torch: torch's DataLoader over torchvision's ImageFolder and transforms
  (benchmarks/pil_pipeline.py: the exact Pillow + torch equivalent where
  torchvision cannot be imported);
* webdataset: ``wds.WebDataset`` over tar shards (written untimed), decoded
  with Pillow, the same torchvision transform, batched in the workers of a
  ``wds.WebLoader``;
* FFCV: a .beton of the photos (written untimed, JPEG, stored at their size)
  read by FFCV's ``Loader`` with its ``RandomResizedCropRGBImageDecoder``,
  ``RandomHorizontalFlip``, ``NormalizeImage`` (before ``ToTensor``: FFCV's
  loader hangs on CPU with it after ``ToTorchImage``) and ``ToTorchImage``
  (channels-last memory, FFCV's default);
* DALI: its CPU pipeline, ``fn.readers.file`` +
  ``fn.decoders.image_random_crop(device="cpu")`` + ``fn.resize`` +
  ``fn.crop_mirror_normalize`` (images_bench.DaliLoader), as many threads
  as workers;
* SPDL: ``spdl.pipeline`` with ``spdl.io`` decoding (FFmpeg) each JPEG
  through a crop + scale + flip filter to 224x224 uint8 on ``--workers``
  threads; the batch converted to float and normalised in torch;
* grain: ``grain.MapDataset`` shuffled, Pillow decode + the torchvision
  transform, batched, over ``--workers`` worker processes (``mp_prefetch``);
* litdata: the JPEG bytes ``optimize``d into chunks (untimed), read by a
  ``StreamingDataset`` (Pillow decode + the torchvision transform) and
  ``StreamingDataLoader``;
* decode-only ceiling: images_bench.py's measure (every file fully decoded
  by libjpeg-turbo on the same number of threads, nothing else).

A peer that is not installed is skipped with the reason (the ImportError's
text).  The photos are "held out": benchmarks/imagenet_like.py's generator
with a seed (1) the other benchmarks do not use.  The untimed conversions
are cached under ``--cache``, keyed by the photo set, and the time each took
is reported.  Every loader first runs one untimed epoch (workers up, files in
the page cache), then ``--rounds`` timed epochs interleaved (A B C ... A B C
...); each rate is the median, and each ratio fastload's median over the
peer's, with the range over the rounds' pairs.  Every batch is checked by
image_timing.images_per_second (shape, dtype, finite values).  Prints a
Markdown table on stdout, progress on stderr.
"""

import argparse
import contextlib
import hashlib
import json
import math
import multiprocessing
import os
import platform
import statistics
import sys
import time

# This checkout's fastload, even where another one is installed.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import fastload  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

import images_bench  # noqa: E402
import imagenet_like  # noqa: E402
import pil_pipeline  # noqa: E402
from compare import interleave, load_average, log  # noqa: E402
from image_timing import images_per_second  # noqa: E402
from workloads import cpu_model  # noqa: E402

MEAN, STD = images_bench.MEAN, images_bench.STD
SIZE = 224
SEED = 1  # held out: the other image benchmarks use imagenet_like's seed 0


class Setup:
    """What every peer is built from."""

    def __init__(self, root, samples, batch, workers, cache):
        self.root = root
        self.samples = samples  # [(path, class index)], torchvision's order
        self.batch = batch
        self.workers = workers
        self.cache = cache  # this photo set's conversion cache
        self.conversions = {}  # peer: (seconds, "built now" | "cached")

    def converted(self, peer, path, build):
        """``path`` made by ``build(path)`` once per photo set: a conversion
        outside the timed epochs.  Its time is kept beside it."""
        stamp = path + ".seconds"
        if os.path.exists(stamp):
            with open(stamp) as f:
                self.conversions[peer] = (float(f.read()), "cached")
            return path
        log(f"{peer}: converting the photos (untimed, cached in {self.cache})")
        start_method = multiprocessing.get_start_method(allow_none=True)
        start = time.perf_counter()
        with contextlib.redirect_stdout(sys.stderr):  # the table alone on stdout
            build(path)
        seconds = time.perf_counter() - start
        # litdata's optimize sets the start method to "spawn" for the whole
        # process; the loaders measured after it keep the platform's.
        multiprocessing.set_start_method(start_method, force=True)
        with open(stamp, "w") as f:
            f.write(f"{seconds:.3f}")
        self.conversions[peer] = (seconds, "built now")
        return path


def version(module_name):
    try:
        from importlib.metadata import version as v

        return v(module_name)
    except Exception:  # noqa: BLE001 - a version is only informative
        return "?"


def train_transform():
    """torchvision's training transform (pil_pipeline's equivalent without it)."""
    return pil_pipeline.train_transform(SIZE)


def pil_rgb(data):
    """Pillow's decode of JPEG bytes, as torchvision's loader converts it."""
    import io

    from PIL import Image

    with Image.open(io.BytesIO(data)) as img:
        return img.convert("RGB")


class Batches:
    """An iterable of ``(images, labels)`` torch batches from another
    iterable of batches, converted by ``convert``; each ``iter`` is one epoch."""

    def __init__(self, make_epoch, convert):
        self.make_epoch = make_epoch
        self.convert = convert

    def __iter__(self):
        for batch in self.make_epoch():
            yield self.convert(batch)


# ------------------------------------------------------------------ the peers


def make_fastload(s):
    dataset = fastload.ImageFolder(s.root, transform=images_bench.fastload_transform("train"))
    return fastload.DataLoader(dataset, batch_size=s.batch, shuffle=True,
                               num_workers=s.workers), f"fastload {fastload.__version__}"


def make_fastload_shards(s):
    def write(directory):
        os.makedirs(directory + ".tmp", exist_ok=True)
        per_shard = math.ceil(len(s.samples) / _shard_count(s))
        fastload.shards_from_image_folder(
            s.root, os.path.join(directory + ".tmp", "shard-%05d.tar"), shuffle=True, seed=0,
            maxcount=per_shard, restart_markers=True)
        os.replace(directory + ".tmp", directory)

    directory = s.converted(SHARDS, os.path.join(s.cache, "restart-shards"), write)
    urls = sorted(os.path.join(directory, n) for n in os.listdir(directory) if n.endswith(".tar"))
    dataset = fastload.WebDataset(urls, transform=images_bench.fastload_transform("train"))
    return fastload.DataLoader(dataset, batch_size=s.batch, shuffle=True,
                               num_workers=s.workers), \
        f"fastload {fastload.__version__}, shards with restart markers"


def make_torch(s):
    tv = pil_pipeline.torchvision_or_none()
    dataset = pil_pipeline.image_folder(s.root, train_transform())
    loader = torch.utils.data.DataLoader(dataset, batch_size=s.batch, shuffle=True,
                                         num_workers=s.workers)
    what = (f"torch {torch.__version__} + torchvision {tv.__version__}" if tv is not None
            else f"torch {torch.__version__} + Pillow (torchvision not importable)")
    return loader, what


def make_decode_only(s):
    loader = fastload.DataLoader(images_bench.DecodeOnly(s.root), batch_size=s.batch,
                                 num_workers=s.workers, collate_fn=images_bench.count_decoded)
    return loader, "images_bench.py's decode-only ceiling (full decode, nothing else)"


def _shard_count(s):
    """Enough shards for every worker of up to 16 to have some."""
    return min(len(s.samples), 16)


def _write_shards(s, directory):
    import webdataset as wds

    os.makedirs(directory)
    per_shard = math.ceil(len(s.samples) / _shard_count(s))
    with wds.ShardWriter(os.path.join(directory, "shard-%05d.tar"), maxcount=per_shard,
                         verbose=0) as sink:
        for i, (path, label) in enumerate(s.samples):
            with open(path, "rb") as f:
                sink.write({"__key__": f"{i:07d}", "jpg": f.read(), "cls": str(label).encode()})


def make_webdataset(s):
    import webdataset as wds

    directory = s.converted("webdataset", os.path.join(s.cache, "wds"),
                            lambda d: _write_shards(s, d))
    urls = sorted(os.path.join(directory, n) for n in os.listdir(directory) if n.endswith(".tar"))
    dataset = (wds.WebDataset(urls, shardshuffle=len(urls), empty_check=False)
               .shuffle(1000)
               .decode("pil")
               .to_tuple("jpg", "cls")
               .map_tuple(train_transform(), int)
               .batched(s.batch, partial=True))
    loader = wds.WebLoader(dataset, batch_size=None, num_workers=s.workers)
    return loader, f"webdataset {version('webdataset')} + torch DataLoader"


class _PhotoFiles:
    """The photos as FFCV's writer reads them: (HWC uint8 RGB, label)."""

    def __init__(self, samples):
        self.samples = samples

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        path, label = self.samples[i]
        with open(path, "rb") as f:
            return np.asarray(pil_rgb(f.read())), label


def make_ffcv(s):
    from ffcv.fields import IntField, RGBImageField
    from ffcv.fields.decoders import IntDecoder, RandomResizedCropRGBImageDecoder
    from ffcv.loader import Loader, OrderOption
    from ffcv.transforms import NormalizeImage, RandomHorizontalFlip, Squeeze, ToTensor, ToTorchImage
    from ffcv.writer import DatasetWriter

    def write(path):
        # JPEG at the photos' own size (no max_resolution), as FFCV's ImageNet example stores them.
        fields = {"image": RGBImageField(write_mode="jpg", jpeg_quality=90), "label": IntField()}
        DatasetWriter(path + ".tmp", fields, num_workers=max(1, s.workers)).from_indexed_dataset(
            _PhotoFiles(s.samples))
        os.replace(path + ".tmp", path)

    path = s.converted("FFCV", os.path.join(s.cache, "photos.beton"), write)
    mean = np.array(MEAN) * 255
    std = np.array(STD) * 255
    loader = Loader(path, batch_size=s.batch, num_workers=max(1, s.workers),
                    order=OrderOption.RANDOM, os_cache=True, drop_last=False, pipelines={
                        "image": [RandomResizedCropRGBImageDecoder((SIZE, SIZE)),
                                  RandomHorizontalFlip(),
                                  NormalizeImage(mean, std, np.float32),
                                  ToTensor(), ToTorchImage()],
                        "label": [IntDecoder(), ToTensor(), Squeeze()]})
    return loader, f"FFCV {version('ffcv')} (channels-last memory)"


def make_dali(s):
    dali = images_bench.dali_or_none()
    if dali is None:
        import nvidia.dali  # noqa: F401 - raises the ImportError that says why
    loader = images_bench.DaliLoader(s.root, "train", max(1, s.workers), len(s.samples),
                                     batch=s.batch)
    return loader, f"DALI {dali.__version__} CPU pipeline"


def make_spdl(s):
    import spdl.io
    from spdl.pipeline import PipelineBuilder

    rng = np.random.default_rng()

    def load(sample):
        path, label = sample
        packets = spdl.io.demux_image(path)
        # RandomResizedCrop's box, torchvision's algorithm (pil_pipeline's transcription).
        top, left, h, w = pil_pipeline._crop_params(packets.codec.width, packets.codec.height,
                                                    (0.08, 1.0), (3 / 4, 4 / 3))
        flip = ",hflip" if rng.random() < 0.5 else ""
        frames = spdl.io.decode_packets(
            packets, filter_desc=f"crop={w}:{h}:{left}:{top},scale={SIZE}:{SIZE}{flip},format=rgb24")
        return spdl.io.to_numpy(spdl.io.convert_frames(frames)), label

    mean = torch.tensor(MEAN).view(1, 3, 1, 1) * 255
    std = torch.tensor(STD).view(1, 3, 1, 1) * 255

    def collate(items):
        images = torch.from_numpy(np.stack([img for img, _ in items]))  # N H W C uint8
        images = images.permute(0, 3, 1, 2).float().sub_(mean).div_(std)
        return images, torch.tensor([label for _, label in items])

    def epoch():
        order = rng.permutation(len(s.samples))
        pipeline = (PipelineBuilder()
                    .add_source([s.samples[i] for i in order])
                    .pipe(load, concurrency=max(1, s.workers))
                    .aggregate(s.batch, drop_last=False)
                    .pipe(collate)
                    .add_sink(4)
                    .build(num_threads=max(1, s.workers), max_failures=0))
        with pipeline.auto_stop():
            yield from pipeline

    return Batches(epoch, lambda b: b), f"SPDL {version('spdl')} (FFmpeg filter crop/scale/flip)"


class _GrainLoad:
    """Pillow decode + the torchvision transform, as a grain map.  Pickled
    to grain's worker processes without the transform, which each makes
    anew (torchvision_import's way, as a fresh process cannot unpickle
    torchvision objects where torchvision's own import fails)."""

    def __init__(self):
        self.transform = train_transform()

    def __getstate__(self):
        return {}

    def __setstate__(self, state):
        self.__init__()

    def __call__(self, sample):
        path, label = sample
        with open(path, "rb") as f:
            return self.transform(pil_rgb(f.read())).numpy(), np.int64(label)


def make_grain(s):
    import grain

    # Threads in this process (grain's ReadOptions), a new iterator each
    # epoch.  grain's worker processes (mp_prefetch) are not used: started
    # anew each epoch they take longer to start than an epoch of these
    # photos lasts, and a persistent iterator over a repeated dataset keeps
    # producing (CPU and memory) while the other loaders are measured.
    def epoch():
        dataset = (grain.MapDataset.source(s.samples)
                   .shuffle(seed=int(np.random.randint(1 << 30)))
                   .map(_GrainLoad())
                   .batch(s.batch, drop_remainder=False)
                   .to_iter_dataset(grain.ReadOptions(num_threads=max(1, s.workers),
                                                      prefetch_buffer_size=2 * s.batch)))
        for images, labels in dataset:
            yield torch.from_numpy(images), torch.from_numpy(labels)

    return Batches(epoch, lambda b: b), f"grain {version('grain')} ({max(1, s.workers)} threads)"


def _litdata_item(sample):
    path, label = sample
    with open(path, "rb") as f:
        return {"jpeg": f.read(), "label": label}


class _LitdataTransform:
    """StreamingDataset's ``transform``: Pillow decode + the torchvision transform."""

    def __init__(self):
        self.transform = train_transform()

    def __call__(self, item):
        return self.transform(pil_rgb(item["jpeg"])), item["label"]


def make_litdata(s):
    import litdata as ld

    def optimize(path):
        ld.optimize(fn=_litdata_item, inputs=list(s.samples), output_dir=path + ".tmp",
                    chunk_bytes="64MB", num_workers=max(1, s.workers), mode="overwrite")
        os.replace(path + ".tmp", path)

    path = s.converted("litdata", os.path.join(s.cache, "litdata"), optimize)

    dataset = ld.StreamingDataset(path, shuffle=True, transform=_LitdataTransform())
    loader = ld.StreamingDataLoader(dataset, batch_size=s.batch, num_workers=s.workers)
    return loader, f"litdata {version('litdata')}"


SHARDS = "fastload-shards"
PEERS = {
    "fastload": make_fastload,
    SHARDS: make_fastload_shards,
    "torch": make_torch,
    "webdataset": make_webdataset,
    "FFCV": make_ffcv,
    "DALI": make_dali,
    "SPDL": make_spdl,
    "grain": make_grain,
    "litdata": make_litdata,
    "decode-only ceiling": make_decode_only,
}


# ------------------------------------------------------------------ the run


def photo_set(data, images, seed):
    """The photos (made once) and the conversion cache keyed by them."""
    root = imagenet_like.make_image_folder(
        os.path.join(data, f"imagenet-like-{images}-seed{seed}"), n_images=images, seed=seed)
    with open(os.path.join(root, imagenet_like.MANIFEST), "rb") as f:
        key = hashlib.sha256(f.read()).hexdigest()[:12]
    return root, key


def build_loaders(setup, names):
    """{name: (loader, description)} for the peers that run here, and
    {name: reason} for those that do not."""
    loaders, skipped = {}, {}
    for name in names:
        try:
            loaders[name] = PEERS[name](setup)
        except ImportError as e:
            skipped[name] = f"not installed: {e}"
        if name in skipped:
            log(f"{name}: skipped ({skipped[name]})")
    return loaders, skipped


def warm_up(setup, loaders, skipped):
    """One untimed epoch of each loader (workers up, files in the page
    cache); a loader that fails or delivers fewer images than the photos is
    dropped, with what happened."""
    for name in list(loaders):
        log(f"{name}: one untimed epoch")
        try:
            got = count_images(loaders[name][0])
            if got < len(setup.samples):
                raise RuntimeError(f"an epoch delivered {got} of {len(setup.samples)} images")
        except Exception as e:  # noqa: BLE001 - reported in the table
            reason = str(e).strip().splitlines()[0] if str(e).strip() else ""
            skipped[name] = f"failed: {type(e).__name__}: {reason}"[:300]
            log(f"{name}: {skipped[name]}")
            del loaders[name]


def run(setup, names, rounds):
    """Measures every peer that runs here; returns the report as a dict."""
    loaders, skipped = build_loaders(setup, names)
    warm_up(setup, loaders, skipped)
    rates = interleave(lambda name: images_per_second(loaders[name][0]), "peers", rounds,
                       kinds=list(loaders))
    rows = []
    fl, shards = rates.get("fastload"), rates.get(SHARDS)
    for name in loaders:
        med = statistics.median(rates[name])
        row = {"peer": name, "what": loaders[name][1], "images_per_s": med, "rates": rates[name]}
        if fl is not None:
            pairs = [f / r for f, r in zip(fl, rates[name])]
            row["fastload_over_peer"] = statistics.median(fl) / med
            row["pairs"] = [min(pairs), max(pairs)]
        if shards is not None:
            row["shards_over_peer"] = statistics.median(shards) / med
        if name in setup.conversions:
            row["conversion_s"], row["conversion"] = setup.conversions[name]
        rows.append(row)
    return {"rows": rows, "skipped": skipped}


def count_images(loader):
    """The images one epoch of ``loader`` delivers (a decode-only batch is its count)."""
    return sum(batch if isinstance(batch, int) else len(batch[1]) for batch in loader)


def report(result, args, root, wall, load_before):
    lines = [
        f"Machine: {os.cpu_count()} CPUs ({cpu_model()}), Python {platform.python_version()}; "
        f"load average before/after: {load_before} / {load_average()}; run took {wall:.0f} s.",
        f"{args.images} held-out photos ({root}), batch {args.batch}, shuffled, "
        f"{args.workers} workers; RandomResizedCrop({SIZE}) + flip + ToTensor + Normalize; "
        f"one untimed epoch each, then medians of {args.rounds} interleaved epochs.",
        "",
        "| loader | images/s | fastload/peer | pairs | fastload shards/peer | untimed conversion |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for row in result["rows"]:
        ratio = f"**{row['fastload_over_peer']:.2f}x**" if "fastload_over_peer" in row else "n/a"
        pairs = "%.2f-%.2f" % tuple(row["pairs"]) if "pairs" in row else ""
        shards = f"{row['shards_over_peer']:.2f}x" if "shards_over_peer" in row else ""
        conv = (f"{row['conversion_s']:.1f} s ({row['conversion']})"
                if "conversion_s" in row else "")
        lines.append(f"| {row['what']} | {row['images_per_s']:,.0f} | {ratio} | {pairs} "
                     f"| {shards} | {conv} |")
    for name, reason in result["skipped"].items():
        lines.append(f"| {name} | skipped: {reason} | | | | |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=images_bench.BATCH)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=SEED, help="the photo set's generator seed")
    parser.add_argument("--peers", nargs="+", choices=list(PEERS), default=list(PEERS),
                        help="which loaders (default: all)")
    parser.add_argument("--data", default=os.environ.get("FASTLOAD_BENCH_DATA",
                                                         "/tmp/fastload-bench"))
    parser.add_argument("--cache", help="conversion cache (default: DATA/peers-cache)")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args(argv)
    if "fastload" not in args.peers:
        args.peers.insert(0, "fastload")  # the ratios are to fastload
    log(f"making {args.images} photos (once)")
    root, key = photo_set(args.data, args.images, args.seed)
    cache = os.path.join(args.cache or os.path.join(args.data, "peers-cache"),
                         f"{os.path.basename(root)}-{key}")
    os.makedirs(cache, exist_ok=True)
    samples = pil_pipeline.make_dataset(root, pil_pipeline.find_classes(root)[1])
    setup = Setup(root, samples, args.batch, args.workers, cache)
    torch.set_num_threads(1)  # the main process only consumes
    load_before = load_average()
    wall = time.perf_counter()
    result = run(setup, args.peers, args.rounds)
    wall = time.perf_counter() - wall
    log("done")
    if sys.stderr.isatty():
        sys.stderr.write("\r\033[2K")
    print(report(result, args, root, wall, load_before))
    if args.json:
        result.update(images=args.images, workers=args.workers, batch=args.batch,
                      rounds=args.rounds, root=root, cpus=os.cpu_count(), cpu=cpu_model(),
                      python=platform.python_version(), seconds=wall,
                      date=time.strftime("%Y-%m-%d", time.gmtime()))
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    with contextlib.suppress(AttributeError):
        np.seterr(all="ignore")
    main()
