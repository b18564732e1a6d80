"""Today's training recipes, written once with torchvision's own classes: torch's
DataLoader over torchvision's ImageFolder against fastload's, given the same
transform objects.

    python benchmarks/recipe_bench.py              # 512 generated photos, 3 rounds
    python benchmarks/recipe_bench.py --images 2048 --rounds 5

Two recipes, batch 64, shuffled, for num_workers 0, 1 and 2:

* "RandAugment" (DeiT / timm style): RandomResizedCrop(224),
  RandomHorizontalFlip, RandAugment(2, 9), PILToTensor, ConvertImageDtype,
  Normalize, RandomErasing(0.25); batches mixed by
  RandomChoice([MixUp(alpha=0.8), CutMix(alpha=1.0)]).
* "TrivialAugmentWide" (torchvision's reference recipe): the same with
  TrivialAugmentWide and RandomErasing(0.1), MixUp(alpha=0.2) / CutMix(1.0).

Both use bilinear interpolation for the augment ops, as the torchvision
reference scripts do.  torch mixes batches in a ``collate_fn``, as
torchvision's documentation shows; fastload takes the same object as
``batch_transform=`` and runs it on the batch in C.  The fastload dataset
gets the torchvision ``Compose`` itself: the run stops if any step would run
in Python, so the table measures the compiled chain.  One untimed epoch
each, then ``--rounds`` timed epochs interleaved (torch, fastload, torch,
...); each rate is the median, as one epoch's rate moves by a tenth from
run to run on a shared machine.  Prints Markdown on stdout.
"""

import argparse
import importlib
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import fastload  # noqa: E402

import torch  # noqa: E402

import imagenet_like  # noqa: E402
import pil_pipeline  # noqa: E402
from image_timing import images_per_second  # noqa: E402
from workloads import cpu_model  # noqa: E402

BATCH = 64
MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
# name: (augment, its kwargs, RandomErasing p, MixUp alpha, CutMix alpha)
RECIPES = {
    "RandAugment": ("RandAugment", dict(num_ops=2, magnitude=9), 0.25, 0.8, 1.0),
    "TrivialAugmentWide": ("TrivialAugmentWide", {}, 0.1, 0.2, 1.0),
}


def recipe(tv, name, num_classes):
    """(per-image transform, batch transform) of recipe ``name``, built from
    torchvision's classes."""
    augment, kwargs, erase_p, mixup_alpha, cutmix_alpha = RECIPES[name]
    t, v2 = tv.transforms, importlib.import_module("torchvision.transforms.v2")
    bilinear = t.InterpolationMode.BILINEAR
    transform = t.Compose([
        t.RandomResizedCrop(224, interpolation=bilinear, antialias=True),
        t.RandomHorizontalFlip(),
        getattr(t, augment)(interpolation=bilinear, **kwargs),
        t.PILToTensor(),
        t.ConvertImageDtype(torch.float),
        t.Normalize(MEAN, STD),
        t.RandomErasing(p=erase_p),
    ])
    mix = v2.RandomChoice([v2.MixUp(alpha=mixup_alpha, num_classes=num_classes),
                           v2.CutMix(alpha=cutmix_alpha, num_classes=num_classes)])
    return transform, mix


class MixingCollate:
    """torchvision's documented pattern: collate, then mix the batch."""

    def __init__(self, mix):
        self.mix = mix

    def __call__(self, samples):
        return self.mix(*torch.utils.data.default_collate(samples))


def fastload_folder(root, transform):
    """fastload's ImageFolder with the torchvision transform, which must
    compile whole to the C plan."""
    dataset = fastload.ImageFolder(root, transform=transform)
    if dataset.transform_plan.python:
        raise SystemExit("recipe_bench.py: these steps would run in Python: "
                         f"{dataset.transform_plan.python}")
    return dataset


def make_loaders(root, workers, tv, name):
    num_classes = len(tv.datasets.ImageFolder(root).classes)
    transform, mix = recipe(tv, name, num_classes)
    extra = dict(persistent_workers=True) if workers else {}
    return {
        "torch + torchvision": torch.utils.data.DataLoader(
            tv.datasets.ImageFolder(root, transform=transform), batch_size=BATCH, shuffle=True,
            num_workers=workers, collate_fn=MixingCollate(mix), **extra),
        "fastload": fastload.DataLoader(
            fastload_folder(root, transform), batch_size=BATCH, shuffle=True,
            num_workers=workers, batch_transform=mix, **extra),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--data", default=os.environ.get("FASTLOAD_BENCH_DATA",
                                                         "/tmp/fastload-bench"))
    args = parser.parse_args()
    tv = pil_pipeline.torchvision_or_none()
    if tv is None:
        sys.exit("recipe_bench.py needs torchvision")
    root = os.path.join(args.data, f"imagenet-like-{args.images}")
    imagenet_like.make_image_folder(root, n_images=args.images)
    torch.set_num_threads(1)  # the main process only consumes
    rows = []
    for name in RECIPES:
        for workers in args.workers:
            loaders = make_loaders(root, workers, tv, name)
            for loader in loaders.values():
                images_per_second(loader)  # untimed: workers up, files in the page cache
            rates = {kind: [] for kind in loaders}
            for _ in range(args.rounds):
                for kind, loader in loaders.items():
                    rates[kind].append(images_per_second(loader))
                    sys.stderr.write(f"{name}, num_workers={workers}, {kind}: "
                                     f"{rates[kind][-1]:,.0f} img/s\n")
            rows.append((name, workers, {k: statistics.median(r) for k, r in rates.items()}))
            del loaders
    print("## Training recipes: RandAugment / TrivialAugmentWide + RandomErasing + "
          "MixUp/CutMix\n")
    print(f"CPU: {cpu_model()}, {os.cpu_count()} cores; {args.images} generated JPEGs, "
          f"batch {BATCH}, shuffled; medians of {args.rounds} interleaved epochs after one "
          f"untimed each; torchvision "
          f"{tv.__version__} on Pillow; the same torchvision objects given to both.\n")
    print("| recipe | workers | torch + torchvision img/s | fastload img/s | fastload vs torch |")
    print("|---|---:|---:|---:|---:|")
    for name, workers, r in rows:
        fl, ref = r["fastload"], r["torch + torchvision"]
        print(f"| {name} | {workers} | {ref:,.0f} | {fl:,.0f} | **{fl / ref:.2f}x** |")


if __name__ == "__main__":
    main()
