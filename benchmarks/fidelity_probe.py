"""How close fastload's fused image pipeline is to Pillow, on a folder.

    python benchmarks/fidelity_probe.py FOLDER     # e.g. one made by imagenet_like.py

For every 37th image: the crop box and flip fastload decided, Pillow's full
decode of the file, then torchvision's crop-then-resize (bilinear,
antialiased) for RandomResizedCrop(224), or resize-then-center-crop for
Resize(256) + CenterCrop(224); prints the PSNR of fastload's output in [0, 1]
against it, with and without DCT-domain scaling.  (tests/test_images.py
holds the same comparison to its floors on a varied set of files.)
"""

import os
import sys

import numpy as np
from PIL import Image

try:
    import fastload
except ImportError:  # run from a checkout built in place
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import fastload
from fastload import transforms as T


def psnr(a, b):
    mse = np.mean((a.astype(np.float64) - b) ** 2)
    return 99.0 if mse == 0 else 10 * np.log10(1.0 / mse)


def pil_rgb(path):
    with Image.open(path) as img:
        return img.convert("RGB")


def train(root):
    for decode in ("exact", "fast"):
        tf = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor()])
        ds = fastload.ImageFolder(root, transform=tf, decode=decode)
        values, scaled = [], 0
        for i in range(0, len(ds), 37):
            g = ds._source.geometry(i, 7, 0)
            out = ds._source.sample(i, 7, 0)
            x, y, w, h = g["box"]
            ref = pil_rgb(ds.path(i)).crop((int(x), int(y), int(x + w), int(y + h)))
            ref = np.asarray(ref.resize((224, 224), Image.BILINEAR), np.float64) / 255.0
            if g["flip"]:
                ref = ref[:, ::-1]
            values.append(psnr(out.transpose(1, 2, 0), ref))
            scaled += g["scale_denom"] > 1
        print(f"RandomResizedCrop(224), decode={decode}: PSNR min {min(values):.1f} dB, "
              f"median {np.median(values):.1f} dB over {len(values)} images "
              f"({scaled} DCT-scaled)")


def val(root):
    tf = T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor()])
    ds = fastload.ImageFolder(root, transform=tf, decode="exact")
    values = []
    for i in range(0, len(ds), 37):
        out = ds._source.sample(i, 0, 0)
        img = pil_rgb(ds.path(i))
        w, h = img.size
        rw, rh = (256, int(256 * h / w)) if w <= h else (int(256 * w / h), 256)
        resized = img.resize((rw, rh), Image.BILINEAR)
        left, top = int(round((rw - 224) / 2.0)), int(round((rh - 224) / 2.0))
        ref = np.asarray(resized.crop((left, top, left + 224, top + 224)), np.float64) / 255.0
        values.append(psnr(out.transpose(1, 2, 0), ref))
    print(f"Resize(256) + CenterCrop(224), decode=exact: PSNR min {min(values):.1f} dB, "
          f"median {np.median(values):.1f} dB over {len(values)} images")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    train(sys.argv[1])
    val(sys.argv[1])
