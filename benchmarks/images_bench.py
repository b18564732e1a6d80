"""The ImageNet-style input pipeline: fastload against torch + Pillow.

    python benchmarks/images_bench.py            # 2000 generated photos
    python benchmarks/images_bench.py --quick    # 256 photos, fewer repetitions

Over a generated ImageNet-like folder (benchmarks/imagenet_like.py: photo-
like JPEGs, short side 200-600 px, quality 75-95, mixed subsampling), at
batch 64 with ``num_workers`` 1 and 2, interleaved in this one process:

* torch: torch's DataLoader over a torchvision-equivalent ImageFolder and
  transforms written with Pillow and torch (benchmarks/pil_pipeline.py;
  torchvision's own when it is installed);
* fastload: ``fastload.ImageFolder`` with ``fastload.transforms``;
* fastload, torchvision v2 classes: the same recipe written with
  ``torchvision.transforms.v2`` and given to ``fastload.ImageFolder`` as it is
  (compiled to the same C plan: the speed should equal fastload's), and the
  same with a ``RandomInvert`` after the flip, a step fastload does not run in
  C (the crop and flip stay in C; RandomInvert, ToImage, ToDtype and Normalize
  run in Python per image: the cost of a fallback), when torchvision can be
  imported;
* decode-only ceiling: libjpeg-turbo full decode of the same files on the
  same number of fastload threads into a reused buffer, nothing else (no
  crop, no resize, no copy out);
* DALI's CPU pipeline with the same operations and as many threads, when
  ``nvidia.dali`` can be imported (``pip install nvidia-dali-cuda130`` runs
  on CPU alone).  SPDL needs FFmpeg's shared libraries, which pip does not
  provide, so it is not included.

for the training transform (RandomResizedCrop(224) + RandomHorizontalFlip +
ToTensor + Normalize) and the validation one (Resize(256) + CenterCrop(224)
+ ToTensor + Normalize).  Ratios are of medians; every batch's shape and
dtype are checked and its values read.  Prints Markdown on stdout.
"""

import argparse
import gc
import os
import statistics
import sys
import time
import warnings

# This checkout's fastload, even where another one is installed.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import fastload  # noqa: E402

import numpy as np
import torch

import imagenet_like
import pil_pipeline
from fastload import transforms as T
from image_timing import images_per_second
from workloads import cpu_model

BATCH = 64
MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
FULL = dict(images=2000, reps=3)
QUICK = dict(images=256, reps=2)


def log(msg):
    sys.stderr.write(f"\r\033[2K{msg}" if sys.stderr.isatty() else f"{msg}\n")
    sys.stderr.flush()


def torchvision_v2_transform(kind, python_step=False):
    """The recipe with torchvision.transforms.v2's classes, or None."""
    if pil_pipeline.torchvision_or_none() is None:
        return None
    from torchvision.transforms import v2

    if kind == "train":
        ops = [v2.RandomResizedCrop(224), v2.RandomHorizontalFlip()]
    else:
        ops = [v2.Resize(256), v2.CenterCrop(224)]
    if python_step:
        ops.append(v2.RandomInvert())
    return v2.Compose(ops + [v2.ToImage(), v2.ToDtype(torch.float32, scale=True),
                             v2.Normalize(MEAN, STD)])


def fastload_transform(kind):
    if kind == "train":
        ops = [T.RandomResizedCrop(224), T.RandomHorizontalFlip()]
    else:
        ops = [T.Resize(256), T.CenterCrop(224)]
    return T.Compose(ops + [T.ToTensor(), T.Normalize(MEAN, STD)])


class DecodeOnly(fastload.ImageFolder):
    """The ceiling: each batch's JPEGs read and fully decoded by libjpeg-turbo
    on the worker thread, into the thread's reused buffer, and nothing
    else; the batch is the number of images decoded."""

    def __getitems__(self, indices):
        return self._raw.decode_only(indices)


def epoch(loader, n_images):
    """Seconds for one epoch of the 224x224 training or validation transform; checks every batch's shape and the count."""
    start = time.perf_counter()
    seen = 0
    for images, labels in loader:
        assert tuple(images.shape[1:]) == (3, 224, 224), images.shape
        seen += len(labels)
    assert seen == n_images, (seen, n_images)
    return time.perf_counter() - start


def count_decoded(batch):
    return batch


def dali_or_none():
    try:
        import nvidia.dali  # noqa: F401
    except ImportError:
        return None
    return nvidia.dali


class DaliLoader:
    """DALI's CPU pipeline for the same transform, iterated like a loader:
    one epoch is ceil(n / BATCH) batches, delivered as torch tensors."""

    def __init__(self, root, kind, threads, n_images, batch=None):
        from nvidia.dali import fn, pipeline_def, types

        batch = batch or BATCH
        mean = [255 * m for m in MEAN]
        std = [255 * s for s in STD]

        @pipeline_def(device_id=None)
        def pipeline():
            jpegs, labels = fn.readers.file(file_root=root, random_shuffle=True, name="Reader")
            if kind == "train":
                images = fn.decoders.image_random_crop(jpegs, device="cpu", output_type=types.RGB,
                                                       random_area=[0.08, 1.0],
                                                       random_aspect_ratio=[3 / 4, 4 / 3])
                images = fn.resize(images, resize_x=224, resize_y=224,
                                   interp_type=types.INTERP_LINEAR, antialias=True)
                return fn.crop_mirror_normalize(images, dtype=types.FLOAT, output_layout="CHW",
                                                mean=mean, std=std,
                                                mirror=fn.random.coin_flip(probability=0.5)), labels
            images = fn.decoders.image(jpegs, device="cpu", output_type=types.RGB)
            images = fn.resize(images, resize_shorter=256, interp_type=types.INTERP_LINEAR,
                               antialias=True)
            return fn.crop_mirror_normalize(images, dtype=types.FLOAT, output_layout="CHW",
                                            crop=(224, 224), mean=mean, std=std), labels

        self.pipe = pipeline(batch_size=batch, num_threads=threads, prefetch_queue_depth=2, seed=0)
        self.pipe.build()
        self.batches = -(-n_images // batch)

    def __iter__(self):
        for _ in range(self.batches):
            images, labels = self.pipe.run()
            yield torch.from_numpy(np.asarray(images.as_tensor())), np.asarray(labels.as_tensor())


def make_loaders(root, kind, workers):
    torch_ds = pil_pipeline.image_folder(
        root, pil_pipeline.train_transform() if kind == "train" else pil_pipeline.val_transform())
    loaders = {
        "torch": torch.utils.data.DataLoader(torch_ds, batch_size=BATCH, shuffle=True,
                                             num_workers=workers, persistent_workers=True),
        "fastload": fastload.DataLoader(fastload.ImageFolder(root, transform=fastload_transform(kind)),
                                        batch_size=BATCH, shuffle=True, num_workers=workers,
                                        persistent_workers=True),
        "decode only": fastload.DataLoader(DecodeOnly(root), batch_size=BATCH,
                                           num_workers=workers, persistent_workers=True,
                                           collate_fn=count_decoded),
    }
    if dali_or_none() is not None:
        loaders["DALI"] = DaliLoader(root, kind, workers, len(torch_ds))
    for name, python_step in (("torchvision v2", False), ("torchvision v2 + Python step", True)):
        transform = torchvision_v2_transform(kind, python_step)
        if transform is not None:
            with warnings.catch_warnings():  # the Python step's: runs in Python, as measured here
                warnings.simplefilter("ignore", UserWarning)
                dataset = fastload.ImageFolder(root, transform=transform)
            loaders[f"fastload, {name}"] = fastload.DataLoader(
                dataset, batch_size=BATCH, shuffle=True, num_workers=workers,
                persistent_workers=True)
    return loaders


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--data", default=os.environ.get("FASTLOAD_BENCH_DATA",
                                                         "/tmp/fastload-bench"))
    args = parser.parse_args()
    sizes = QUICK if args.quick else FULL
    root = os.path.join(args.data, f"imagenet-like-{sizes['images']}")
    log(f"making {root} (once)")
    imagenet_like.make_image_folder(root, n_images=sizes["images"])
    torch.set_num_threads(1)  # the main process only consumes; workers are single-threaded
    rows = []
    for kind in ("train", "val"):
        for workers in (1, 2):
            loaders = make_loaders(root, kind, workers)
            rates = {name: [] for name in loaders}
            for rep in range(sizes["reps"]):
                for name, loader in loaders.items():
                    log(f"{kind} num_workers={workers}: {name} {rep + 1}/{sizes['reps']}")
                    if rep == 0:
                        images_per_second(loader)  # untimed: workers up, files in the page cache
                    rates[name].append(images_per_second(loader))
            med = {name: statistics.median(r) for name, r in rates.items()}
            rows.append((kind, workers, med))
            del loaders
            gc.collect()
    log("done")
    print("## Image pipeline: fastload vs torch DataLoader + Pillow\n")
    print(f"CPU: {cpu_model()}, {os.cpu_count()} cores; {sizes['images']} generated JPEGs, "
          f"batch {BATCH}, shuffled; medians of {sizes['reps']} interleaved epochs; "
          f"torchvision: {'yes' if pil_pipeline.torchvision_or_none() else 'no (Pillow equivalent)'}.\n")
    dali = dali_or_none()
    print(f"DALI: {dali.__version__ + ' (CPU)' if dali else 'not installed'}.\n")
    print("| transform | workers | torch img/s | fastload img/s | decode-only img/s "
          "| DALI img/s | fastload vs torch | vs decode-only | vs DALI |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for kind, workers, med in rows:
        fl, dali_rate = med["fastload"], med.get("DALI")
        dali_cells = (f"{dali_rate:,.0f}", f"{fl / dali_rate:.2f}x") if dali_rate else ("n/a",) * 2
        print(f"| {kind} | {workers} | {med['torch']:,.0f} | {fl:,.0f} | "
              f"{med['decode only']:,.0f} | {dali_cells[0]} | **{fl / med['torch']:.2f}x** | "
              f"{fl / med['decode only']:.2f}x | {dali_cells[1]} |")
    if any("fastload, torchvision v2" in med for _, _, med in rows):
        print("\n### The same recipe with torchvision.transforms.v2 classes, given to "
              "fastload.ImageFolder\n")
        print("| transform | workers | fastload transforms img/s | torchvision v2 img/s "
              "| ratio | v2 + RandomInvert img/s | ratio |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for kind, workers, med in rows:
            fl, v2_rate = med["fastload"], med["fastload, torchvision v2"]
            python_step = med["fastload, torchvision v2 + Python step"]
            print(f"| {kind} | {workers} | {fl:,.0f} | {v2_rate:,.0f} | **{v2_rate / fl:.2f}x** "
                  f"| {python_step:,.0f} | {python_step / fl:.2f}x |")


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
