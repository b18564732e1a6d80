"""PNG training pipeline: fastload's C decoders against the Pillow fallback
and torch + Pillow.

    python benchmarks/png_bench.py            # 2000 generated 256x256 PNGs
    python benchmarks/png_bench.py --quick    # 200 PNGs

A folder of RGB PNGs (benchmarks/imagenet_like.py's photo-like synthesis,
256 x 256, saved by Pillow at its default compression) through
RandomResizedCrop(224) + RandomHorizontalFlip + ToTensor + Normalize, at
batch 64 with ``num_workers`` 0, 1 and 2:

* fastload: ``fastload.ImageFolder`` with ``fastload.transforms``; each PNG
  is decoded by libpng on the worker thread, without the GIL;
* fastload, Pillow fallback: the same, with PNGs sent to the Pillow
  fallback (``_fallback_all``), which decodes with the GIL held;
* torch: torch's DataLoader over torchvision's ImageFolder and transforms
  (benchmarks/pil_pipeline.py; its Pillow equivalent when torchvision
  cannot be imported).

Each loader runs one untimed epoch (workers up, files in the page cache),
then one timed epoch; every batch's shape, dtype and values are checked.
Prints Markdown on stdout.
"""

import argparse
import os
import sys

# This checkout's fastload, even where another one is installed.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import fastload  # noqa: E402

import numpy as np
import torch
from PIL import Image

import imagenet_like
import pil_pipeline
from fastload import transforms as T
from image_timing import images_per_second
from workloads import cpu_model

BATCH = 64
SIZE = 256
N_CLASSES = 10
MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def log(msg):
    sys.stderr.write(f"\r\033[2K{msg}" if sys.stderr.isatty() else f"{msg}\n")
    sys.stderr.flush()


def make_png_folder(root, n_images, seed=0):
    """n_images photo-like RGB PNGs of SIZE x SIZE in N_CLASSES class
    folders; kept and reused once complete."""
    done = os.path.join(root, ".complete")
    if os.path.exists(done):
        return root
    bank = imagenet_like.texture_bank(seed)
    for i in range(n_images):
        folder = os.path.join(root, f"class{i % N_CLASSES:02d}")
        os.makedirs(folder, exist_ok=True)
        rng = np.random.default_rng([seed, i])
        imagenet_like.synthesize(rng, SIZE, SIZE, bank).save(
            os.path.join(folder, f"{i:06d}.png"))
    open(done, "w").close()
    return root


def fastload_transform():
    return T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(),
                      T.Normalize(MEAN, STD)])


def fastload_folder(root, pillow):
    ds = fastload.ImageFolder(root, transform=fastload_transform())
    if pillow:
        ds._fallback_all = True  # PNGs to the Pillow fallback, as other formats go
        ds._make_sources()
    return ds


def make_loaders(root, workers):
    extra = dict(persistent_workers=True) if workers else {}
    torch_ds = pil_pipeline.image_folder(root, pil_pipeline.train_transform())
    return {
        "fastload": fastload.DataLoader(fastload_folder(root, pillow=False), batch_size=BATCH,
                                        shuffle=True, num_workers=workers, **extra),
        "fastload, Pillow fallback": fastload.DataLoader(
            fastload_folder(root, pillow=True), batch_size=BATCH, shuffle=True,
            num_workers=workers, **extra),
        "torch": torch.utils.data.DataLoader(torch_ds, batch_size=BATCH, shuffle=True,
                                             num_workers=workers, **extra),
    }


def run(root, worker_counts):
    torch.set_num_threads(1)  # the main process only consumes; workers are single-threaded
    rows = []
    for workers in worker_counts:
        rates = {}
        for name, loader in make_loaders(root, workers).items():
            log(f"num_workers={workers}: {name}")
            images_per_second(loader)  # untimed
            rates[name] = images_per_second(loader)
        rows.append((workers, rates))
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--data", default=os.environ.get("FASTLOAD_BENCH_DATA",
                                                         "/tmp/fastload-bench"))
    args = parser.parse_args()
    n_images = 200 if args.quick else 2000
    root = os.path.join(args.data, f"png-{SIZE}-{n_images}")
    log(f"making {root} (once)")
    make_png_folder(root, n_images)
    rows = run(root, (0, 1, 2))
    log("done")
    sample = os.path.join(root, "class00", "000000.png")
    kib = os.path.getsize(sample) / 1024
    print("## PNG pipeline: libpng in C vs the Pillow fallback vs torch + Pillow\n")
    print(f"CPU: {cpu_model()}, {os.cpu_count()} cores; {n_images} generated {SIZE}x{SIZE} RGB "
          f"PNGs (~{kib:.0f} KiB each), RandomResizedCrop(224) + flip + ToTensor + Normalize, "
          f"batch {BATCH}, shuffled; one timed epoch after an untimed one; Pillow "
          f"{Image.__version__}; torchvision: "
          f"{'yes' if pil_pipeline.torchvision_or_none() else 'no (Pillow equivalent)'}.\n")
    print("| workers | fastload img/s | fastload, Pillow fallback img/s | torch img/s "
          "| fastload vs fallback | fastload vs torch |")
    print("|---:|---:|---:|---:|---:|---:|")
    for workers, r in rows:
        fl, pil, tv = r["fastload"], r["fastload, Pillow fallback"], r["torch"]
        print(f"| {workers} | {fl:,.0f} | {pil:,.0f} | {tv:,.0f} | {fl / pil:.2f}x | "
              f"**{fl / tv:.2f}x** |")


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
