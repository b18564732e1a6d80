"""The ImageNet recipe with colour augmentation: fastload against torch +
torchvision on Pillow.

    python benchmarks/color_bench.py              # 512 generated photos
    python benchmarks/color_bench.py --images 2000

RandomResizedCrop(224) + RandomHorizontalFlip + ColorJitter(0.4, 0.4, 0.4,
0.1) + RandomGrayscale(0.1) + ToTensor + Normalize, batch 64, shuffled, for
num_workers 0, 1 and 2: torch's DataLoader over torchvision's ImageFolder and
transforms (torchvision is required), fastload's ImageFolder with
fastload.transforms, and fastload without the two colour ops (what they
cost).  One untimed epoch, then one timed; prints Markdown on stdout.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import fastload  # noqa: E402

import torch  # noqa: E402

import imagenet_like  # noqa: E402
import pil_pipeline  # noqa: E402
from fastload import transforms as T  # noqa: E402
from image_timing import images_per_second  # noqa: E402
from workloads import cpu_model  # noqa: E402

BATCH = 64
MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
JITTER = (0.4, 0.4, 0.4, 0.1)
GRAY_P = 0.1


def torchvision_transform(tv):
    t = tv.transforms
    return t.Compose([t.RandomResizedCrop(224), t.RandomHorizontalFlip(),
                      t.ColorJitter(*JITTER), t.RandomGrayscale(GRAY_P),
                      t.ToTensor(), t.Normalize(MEAN, STD)])


def fastload_transform(colour=True):
    ops = [T.RandomResizedCrop(224), T.RandomHorizontalFlip()]
    if colour:
        ops += [T.ColorJitter(*JITTER), T.RandomGrayscale(GRAY_P)]
    return T.Compose(ops + [T.ToTensor(), T.Normalize(MEAN, STD)])


def make_loaders(root, workers, tv):
    extra = dict(persistent_workers=True) if workers else {}

    def fl(colour):
        return fastload.DataLoader(fastload.ImageFolder(root, transform=fastload_transform(colour)),
                                   batch_size=BATCH, shuffle=True, num_workers=workers, **extra)

    return {
        "torch + torchvision": torch.utils.data.DataLoader(
            tv.datasets.ImageFolder(root, transform=torchvision_transform(tv)),
            batch_size=BATCH, shuffle=True, num_workers=workers, **extra),
        "fastload": fl(True),
        "fastload, no colour ops": fl(False),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=512)
    parser.add_argument("--data", default=os.environ.get("FASTLOAD_BENCH_DATA",
                                                         "/tmp/fastload-bench"))
    args = parser.parse_args()
    tv = pil_pipeline.torchvision_or_none()
    if tv is None:
        sys.exit("color_bench.py needs torchvision")
    root = os.path.join(args.data, f"imagenet-like-{args.images}")
    imagenet_like.make_image_folder(root, n_images=args.images)
    torch.set_num_threads(1)
    rows = []
    for workers in (0, 1, 2):
        loaders = make_loaders(root, workers, tv)
        rates = {}
        for name, loader in loaders.items():
            images_per_second(loader)  # untimed: workers up, files in the page cache
            rates[name] = images_per_second(loader)
            sys.stderr.write(f"num_workers={workers} {name}: {rates[name]:,.0f} img/s\n")
        rows.append((workers, rates))
        del loaders
    print("## ImageNet recipe + ColorJitter(0.4, 0.4, 0.4, 0.1) + RandomGrayscale(0.1)\n")
    print(f"CPU: {cpu_model()}, {os.cpu_count()} cores; {args.images} generated JPEGs, "
          f"batch {BATCH}, shuffled; one timed epoch after one untimed; "
          f"torchvision {tv.__version__} on Pillow.\n")
    print("| workers | torch + torchvision img/s | fastload img/s | fastload vs torch "
          "| fastload without colour img/s | colour ops cost |")
    print("|---:|---:|---:|---:|---:|---:|")
    for workers, r in rows:
        fl, plain, ref = r["fastload"], r["fastload, no colour ops"], r["torch + torchvision"]
        print(f"| {workers} | {ref:,.0f} | {fl:,.0f} | **{fl / ref:.2f}x** | {plain:,.0f} "
              f"| {100 * (1 - fl / plain):.0f}% |")


if __name__ == "__main__":
    main()
