"""How close fastload's colour ops are to torchvision's, per op and chained.

    python benchmarks/color_fidelity.py

On ImageNet-like pictures (benchmarks/imagenet_like.py), after
RandomResizedCrop(224) + RandomHorizontalFlip: fastload's output in [0, 1]
for fixed factors and a fixed order, against torchvision 0.28's functions on
the same resized image, two ways:

* tensor: the resized image as a float tensor, through ``F.adjust_*`` for
  tensors (the formulas fastload implements);
* PIL: the resized image rounded to uint8 as a PIL image, through
  ``F.adjust_*`` for PIL (ImageEnhance; 8-bit rounding after every step).

Prints the minimum and median PSNR (dB) over images and factors, as
Markdown.
"""

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import imagenet_like  # noqa: E402
import pil_pipeline  # noqa: E402
from fastload import _C  # noqa: E402
from fastload import transforms as T  # noqa: E402

GEOMETRY = [T.RandomResizedCrop(224), T.RandomHorizontalFlip()]
FACTORS = {
    "brightness": (0.6, 0.8, 1.2, 1.4),
    "contrast": (0.6, 0.8, 1.2, 1.4),
    "saturation": (0.6, 0.8, 1.2, 1.4),
    "hue": (-0.1, -0.05, 0.05, 0.1),
}
OPS = list(FACTORS)


def run(transforms, image, seed, order=None):
    plan = T.compile_plan([*transforms, T.ToTensor()])
    plan.jitter_order = order
    return _C.transform_image(plan, image, seed, T.PILLOW_MAX_PIXELS)


def psnr(a, b):
    mse = np.mean((np.asarray(a, np.float64) - np.asarray(b, np.float64)) ** 2)
    return 99.0 if mse == 0 else 10 * np.log10(1.0 / mse)


def jitter(op, factor):
    ranges = {name: 0 for name in OPS}
    ranges[op] = (factor, factor)
    return T.ColorJitter(**ranges)


def references(torch, F, Image, resized, steps):
    """The steps ((name, factor), "gray") on the tensor and on the PIL image."""
    tensor = torch.from_numpy(resized)
    pil = Image.fromarray((resized.transpose(1, 2, 0) * 255 + 0.5).astype(np.uint8))
    for step in steps:
        if step == "gray":
            tensor = F.rgb_to_grayscale(tensor, num_output_channels=3)
            pil = F.rgb_to_grayscale(pil, num_output_channels=3)
        else:
            fn = getattr(F, f"adjust_{step[0]}")
            tensor, pil = fn(tensor, step[1]), fn(pil, step[1])
    return tensor.numpy(), np.asarray(pil, np.float64).transpose(2, 0, 1) / 255


def main():
    import torch
    from PIL import Image

    if pil_pipeline.torchvision_or_none() is None:
        sys.exit("color_fidelity.py needs torchvision")
    from torchvision.transforms import functional as F

    bank = imagenet_like.texture_bank(0)
    images = []
    for i in range(8):
        rng = np.random.default_rng([11, i])
        w, h = int(rng.integers(300, 600)), int(rng.integers(300, 600))
        images.append(np.asarray(imagenet_like.synthesize(rng, w, h, bank).convert("RGB")))
    rows = []

    def measure(name, colour, steps, order=None):
        scores = {"tensor": [], "PIL": []}
        for seed, image in enumerate(images):
            resized = run(GEOMETRY, image, seed)
            ours = run([*GEOMETRY, *colour], image, seed, order)
            tensor, pil = references(torch, F, Image, resized, steps)
            scores["tensor"].append(psnr(ours, tensor))
            scores["PIL"].append(psnr(ours, pil))
        return scores

    for op in OPS:
        merged = {"tensor": [], "PIL": []}
        for factor in FACTORS[op]:
            for kind, values in measure(op, [jitter(op, factor)], [(op, factor)]).items():
                merged[kind] += values
        rows.append((f"{op} {FACTORS[op]}", merged))
    rows.append(("grayscale", measure("gray", [T.Grayscale(num_output_channels=3)], ["gray"])))
    factors = {"brightness": 1.3, "contrast": 0.7, "saturation": 1.4, "hue": 0.08}
    chain = T.ColorJitter(**{k: (v, v) for k, v in factors.items()})
    for order in ((0, 1, 2, 3), (3, 2, 1, 0), (2, 3, 0, 1)):
        steps = [(OPS[i], factors[OPS[i]]) for i in order]
        rows.append((f"chain {'/'.join(OPS[i][0] for i in order)}",
                     measure("chain", [chain], steps, order)))
    print("| op (factors) | vs tensor: min | median | vs PIL: min | median |")
    print("|---|---:|---:|---:|---:|")
    for name, s in rows:
        print(f"| {name} | {min(s['tensor']):.1f} | {np.median(s['tensor']):.1f} | "
              f"{min(s['PIL']):.1f} | {np.median(s['PIL']):.1f} |")


if __name__ == "__main__":
    main()
