"""The image pipeline fastload is compared with: torchvision's ImageFolder
and ImageNet transforms, written in Pillow + torch for a machine without
torchvision.

    python benchmarks/pil_pipeline.py --check [--root DIR] [--bench-images N]

This is what a careful torch user would run when torchvision is missing,
and it reproduces torchvision's semantics exactly, down to the random
numbers: the same calls on torch's global generator in the same order
(``RandomResizedCrop``: ``torch.empty(1).uniform_`` twice per attempt,
``torch.randint`` for the offsets; ``RandomHorizontalFlip``:
``torch.rand(1)``), the same integer rounding of sizes and offsets, the same
Pillow calls on the image, the same tensor arithmetic.  With the same seed,
``train_transform()`` here and torchvision's produce identical tensors.

When torchvision is importable (``torchvision_or_none()``), the factory
functions (``train_transform``, ``val_transform``, ``image_folder``) return
torchvision's own objects instead, so a benchmark always measures the real
thing where it can.

The rules reproduced, with the torchvision functions they come from:

* ImageFolder (``datasets/folder.py``): classes are the sorted names of the
  root's subfolders; samples are every file under each class folder
  (``os.walk``, sorted, following links) whose lower-cased name ends in one
  of ``IMG_EXTENSIONS``; a class without a file is an error; the loader opens
  the file and returns ``Image.open(f).convert("RGB")``.
* RandomResizedCrop (``RandomResizedCrop.get_params``): up to 10 attempts of
  ``area * U(scale)`` and ``exp(U(log(ratio)))`` (log of the float32
  tensor), ``w = round(sqrt(area * ratio))``, ``h = round(sqrt(area /
  ratio))``; accepted if ``0 < w <= width and 0 < h <= height``, then
  ``i = randint(0, height - h + 1)``, ``j = randint(0, width - w + 1)``.
  Otherwise a centred crop of the whole image with its aspect ratio clamped
  to ``ratio``.  Then crop, then resize (``F.resized_crop``).
* Resize (``_compute_resized_output_size``): an int sets the short side,
  the long side becomes ``int(size * long / short)`` (truncated); a pair is
  ``(h, w)``.  An image already at the target size is returned as is.
* CenterCrop (``F.center_crop``): ``top = int(round((h - th) / 2.0))``,
  likewise ``left``; Python's ``round`` rounds halves to even, so an odd
  margin of 117 puts the crop at 58 and one of 119 at 60.
* ToTensor (``F.to_tensor``): a copy of the pixels as ``(H, W, C)``,
  permuted to ``(C, H, W)``, made contiguous, converted to float32 and
  divided by 255.
* Normalize (``F.normalize``): on a clone, ``sub_(mean).div_(std)`` with
  mean and std as tensors of the input's dtype shaped ``(C, 1, 1)``.

Crop-then-resize versus ``Image.resize(size, box=...)``: the box form avoids
copying the crop, but Pillow's filter then reads pixels just outside the
box (the crop form clamps at the crop's edge), so 1-20% of output pixels
differ by up to ~20 levels.  The crop form is what torchvision does, so it is
what is used here; ``--check`` verifies it pixel for pixel.
"""

import argparse
import math
import numbers
import os
import sys
import tempfile
import time
import warnings

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

from torchvision_import import import_torchvision

__all__ = [
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "IMG_EXTENSIONS",
    "CenterCrop",
    "Compose",
    "Normalize",
    "PILToTensor",
    "PilImageFolder",
    "RandomHorizontalFlip",
    "RandomResizedCrop",
    "Resize",
    "ToTensor",
    "find_classes",
    "image_folder",
    "make_dataset",
    "pil_loader",
    "torchvision_or_none",
    "train_transform",
    "val_transform",
]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
# torchvision.datasets.folder.IMG_EXTENSIONS
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")

BILINEAR = Image.Resampling.BILINEAR

_torchvision = None


def torchvision_or_none():
    """import_torchvision(), once."""
    global _torchvision
    if _torchvision is None:
        _torchvision = import_torchvision() or False
    return _torchvision or None


def _use_torchvision(use_torchvision):
    if use_torchvision is None:
        return torchvision_or_none()
    if use_torchvision:
        tv = torchvision_or_none()
        if tv is None:
            raise RuntimeError("use_torchvision=True, but torchvision cannot be imported")
        return tv
    return None


# ------------------------------------------------------------------ dataset


def find_classes(directory):
    """``(classes, class_to_idx)``: the sorted names of ``directory``'s
    subfolders and their indices."""
    classes = sorted(entry.name for entry in os.scandir(directory) if entry.is_dir())
    if not classes:
        raise FileNotFoundError(f"Couldn't find any class folder in {directory}.")
    return classes, {name: i for i, name in enumerate(classes)}


def make_dataset(directory, class_to_idx, extensions=IMG_EXTENSIONS):
    """``[(path, class_index), ...]`` in torchvision's order: classes sorted,
    then each class folder walked in sorted order, files sorted."""
    directory = os.path.expanduser(directory)
    extensions = tuple(extensions)
    samples = []
    found = set()
    for name in sorted(class_to_idx):
        target_dir = os.path.join(directory, name)
        if not os.path.isdir(target_dir):
            continue
        for dirpath, _, fnames in sorted(os.walk(target_dir, followlinks=True)):
            for fname in sorted(fnames):
                if fname.lower().endswith(extensions):
                    samples.append((os.path.join(dirpath, fname), class_to_idx[name]))
                    found.add(name)
    empty = set(class_to_idx) - found
    if empty:
        raise FileNotFoundError(f"Found no valid file for the classes {', '.join(sorted(empty))}. "
                                f"Supported extensions are: {', '.join(extensions)}")
    return samples


def pil_loader(path):
    """torchvision's default loader: the decoded image, converted to RGB."""
    with open(path, "rb") as f:
        img = Image.open(f)
        return img.convert("RGB")


class PilImageFolder(Dataset):
    """``torchvision.datasets.ImageFolder`` without torchvision.

    ``root/<class>/.../<file>``; ``dataset[i]`` is ``(transform(image),
    target_transform(class_index))``.  Attributes as torchvision's:
    ``classes``, ``class_to_idx``, ``samples`` (= ``imgs``) and ``targets``."""

    def __init__(self, root, transform=None, target_transform=None, loader=pil_loader):
        root = os.fspath(root)
        self.root = os.path.expanduser(root)
        self.transform = transform
        self.target_transform = target_transform
        self.loader = loader
        self.extensions = IMG_EXTENSIONS
        self.classes, self.class_to_idx = find_classes(self.root)
        self.samples = make_dataset(self.root, self.class_to_idx, self.extensions)
        self.imgs = self.samples
        self.targets = [target for _, target in self.samples]

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, index):
        path, target = self.samples[index]
        sample = self.loader(path)
        if self.transform is not None:
            sample = self.transform(sample)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return sample, target

    def __repr__(self):
        lines = [f"Dataset {type(self).__name__}", f"    Number of datapoints: {len(self)}",
                 f"    Root location: {self.root}"]
        if self.transform is not None:
            lines.append("    Transform: " + repr(self.transform).replace("\n", "\n    "))
        return "\n".join(lines)


# ------------------------------------------------------------------ transforms


def _pair(size, what="size"):
    """torchvision's ``_setup_size``: an int or a 1-sequence is square, a
    2-sequence is ``(h, w)``."""
    if isinstance(size, numbers.Number):
        return int(size), int(size)
    if len(size) == 1:
        return int(size[0]), int(size[0])
    if len(size) != 2:
        raise ValueError(f"Please provide only two dimensions (h, w) for {what}.")
    return int(size[0]), int(size[1])


def _check_antialias(antialias):
    # Pillow always antialiases when it downsamples; torchvision warns and
    # goes on when told otherwise for a PIL image.  Refusing is clearer here.
    if antialias is False:
        raise ValueError("antialias=False is not possible with Pillow (which always antialiases)")


class Compose:
    """Applies each transform in turn."""

    def __init__(self, transforms):
        self.transforms = list(transforms)

    def __call__(self, img):
        for t in self.transforms:
            img = t(img)
        return img

    def __repr__(self):
        body = "".join(f"\n    {t}" for t in self.transforms)
        return f"{type(self).__name__}({body}\n)"


class RandomResizedCrop:
    """A crop of random area (``scale`` of the image) and aspect ratio
    (``ratio``), resized to ``size``; torchvision's algorithm and random
    draws (see the module docstring)."""

    def __init__(self, size, scale=(0.08, 1.0), ratio=(3.0 / 4.0, 4.0 / 3.0), interpolation=BILINEAR,
                 antialias=True):
        _check_antialias(antialias)
        self.size = _pair(size)
        if scale[0] > scale[1] or ratio[0] > ratio[1]:
            warnings.warn("Scale and ratio should be of kind (min, max)")
        self.scale = scale
        self.ratio = ratio
        self.interpolation = interpolation
        self.antialias = antialias

    @staticmethod
    def get_params(img, scale, ratio):
        """``(i, j, h, w)``: top, left, height and width of the crop for the
        PIL image ``img``; draws from torch's global generator."""
        width, height = img.size
        return _crop_params(width, height, scale, ratio)

    def __call__(self, img):
        i, j, h, w = self.get_params(img, self.scale, self.ratio)
        img = img.crop((j, i, j + w, i + h))
        out_h, out_w = self.size
        if img.size == (out_w, out_h):  # F.resize's "already that size" shortcut
            return img
        return img.resize((out_w, out_h), self.interpolation)

    def __repr__(self):
        return (f"{type(self).__name__}(size={self.size}, scale={tuple(round(s, 4) for s in self.scale)}, "
                f"ratio={tuple(round(r, 4) for r in self.ratio)}, interpolation={self.interpolation!r}, "
                f"antialias={self.antialias})")


def _crop_params(width, height, scale, ratio):
    """torchvision's RandomResizedCrop.get_params, transcribed: the same
    draws from torch's global generator, in the same order."""
    area = height * width
    # float32, as torchvision's torch.log(torch.tensor(ratio)); the bounds
    # reach uniform_ as float32 values widened to double.
    log_lo, log_hi = torch.log(torch.tensor(ratio)).tolist()
    for _ in range(10):
        target_area = area * torch.empty(1).uniform_(scale[0], scale[1]).item()
        aspect_ratio = torch.exp(torch.empty(1).uniform_(log_lo, log_hi)).item()
        w = int(round(math.sqrt(target_area * aspect_ratio)))
        h = int(round(math.sqrt(target_area / aspect_ratio)))
        if 0 < w <= width and 0 < h <= height:
            i = torch.randint(0, height - h + 1, size=(1,)).item()
            j = torch.randint(0, width - w + 1, size=(1,)).item()
            return i, j, h, w
    # No attempt fitted: the whole image, its aspect ratio clamped to `ratio`.
    in_ratio = float(width) / float(height)
    if in_ratio < min(ratio):
        w = width
        h = int(round(w / min(ratio)))
    elif in_ratio > max(ratio):
        h = height
        w = int(round(h * max(ratio)))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


class RandomHorizontalFlip:
    """Mirrors the image left-right when ``torch.rand(1) < p``."""

    def __init__(self, p=0.5):
        self.p = p

    def __call__(self, img):
        if torch.rand(1) < self.p:
            return img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        return img

    def __repr__(self):
        return f"{type(self).__name__}(p={self.p})"


def resized_output_size(height, width, size, max_size=None):
    """``[new_h, new_w]`` by torchvision's ``_compute_resized_output_size``:
    ``size`` an int (or 1-sequence) sets the short side and the long side is
    ``int(size * long / short)``; a 2-sequence is ``(h, w)``."""
    if isinstance(size, numbers.Number) or len(size) == 1:
        requested = int(size) if isinstance(size, numbers.Number) else int(size[0])
        short, long = (width, height) if width <= height else (height, width)
        new_short, new_long = requested, int(requested * long / short)
        if max_size is not None:
            if max_size <= requested:
                raise ValueError(f"max_size = {max_size} must be strictly greater than the requested "
                                 f"size for the smaller edge size = {size}")
            if new_long > max_size:
                new_short, new_long = int(max_size * new_short / new_long), max_size
        new_w, new_h = (new_short, new_long) if width <= height else (new_long, new_short)
        return [new_h, new_w]
    if max_size is not None:
        raise ValueError("max_size is only allowed when size sets the smaller edge (an int)")
    return [int(size[0]), int(size[1])]


class Resize:
    """Resizes to ``size``: an int sets the short side (aspect kept, long
    side truncated), a pair ``(h, w)`` is exact."""

    def __init__(self, size, interpolation=BILINEAR, max_size=None, antialias=True):
        _check_antialias(antialias)
        if not isinstance(size, (numbers.Number, list, tuple)) or (
                not isinstance(size, numbers.Number) and len(size) not in (1, 2)):
            raise ValueError(f"size must be an int or a 1- or 2-sequence, got {size!r}")
        self.size = size
        self.interpolation = interpolation
        self.max_size = max_size
        self.antialias = antialias

    def __call__(self, img):
        width, height = img.size
        new_h, new_w = resized_output_size(height, width, self.size, self.max_size)
        if (new_h, new_w) == (height, width):
            return img
        return img.resize((new_w, new_h), self.interpolation)

    def __repr__(self):
        return (f"{type(self).__name__}(size={self.size}, interpolation={self.interpolation!r}, "
                f"max_size={self.max_size}, antialias={self.antialias})")


def center_crop_box(height, width, crop_h, crop_w):
    """``(top, left)`` of a centred ``crop_h x crop_w`` crop, rounded as
    torchvision rounds (Python's ``round``: halves to even)."""
    return int(round((height - crop_h) / 2.0)), int(round((width - crop_w) / 2.0))


class CenterCrop:
    """A centred crop of ``size`` (an int is square).  torchvision pads an
    image smaller than the crop; none of ours is, so that raises here."""

    def __init__(self, size):
        self.size = _pair(size)

    def __call__(self, img):
        crop_h, crop_w = self.size
        width, height = img.size
        if crop_w > width or crop_h > height:
            raise ValueError(f"CenterCrop{self.size}: the image is only {height}x{width} (padding is "
                             f"not implemented)")
        top, left = center_crop_box(height, width, crop_h, crop_w)
        return img.crop((left, top, left + crop_w, top + crop_h))

    def __repr__(self):
        return f"{type(self).__name__}(size={self.size})"


_MODE_DTYPES = {"I": np.int32, "I;16" if sys.byteorder == "little" else "I;16B": np.int16, "F": np.float32}


class ToTensor:
    """A PIL image (or ``(H, W, C)`` uint8 array) to a ``(C, H, W)`` float32
    tensor in [0, 1]; 32-bit integer and float modes are not scaled."""

    def __call__(self, pic):
        if isinstance(pic, np.ndarray):
            if pic.ndim == 2:
                pic = pic[:, :, None]
            img = torch.from_numpy(pic.transpose((2, 0, 1))).contiguous()
            return img.to(torch.get_default_dtype()).div(255) if img.dtype == torch.uint8 else img
        img = torch.from_numpy(np.array(pic, _MODE_DTYPES.get(pic.mode, np.uint8), copy=True))
        if pic.mode == "1":
            img = 255 * img
        img = img.view(pic.size[1], pic.size[0], len(pic.getbands()))
        img = img.permute((2, 0, 1)).contiguous()
        if img.dtype == torch.uint8:
            return img.to(dtype=torch.get_default_dtype()).div(255)
        return img

    def __repr__(self):
        return f"{type(self).__name__}()"


class PILToTensor:
    """A PIL image to a ``(C, H, W)`` tensor of its own dtype, unscaled (a
    permuted view, not made contiguous, as torchvision's)."""

    def __call__(self, pic):
        img = torch.as_tensor(np.array(pic, copy=True))
        img = img.view(pic.size[1], pic.size[0], len(pic.getbands()))
        return img.permute((2, 0, 1))

    def __repr__(self):
        return f"{type(self).__name__}()"


class Normalize:
    """``(tensor - mean[:, None, None]) / std[:, None, None]`` per channel,
    on a copy unless ``inplace``."""

    def __init__(self, mean, std, inplace=False):
        self.mean = mean
        self.std = std
        self.inplace = inplace

    def __call__(self, tensor):
        if not isinstance(tensor, torch.Tensor) or not tensor.is_floating_point():
            raise TypeError(f"Normalize expects a float tensor, got {type(tensor).__name__} "
                            f"{getattr(tensor, 'dtype', '')}")
        if tensor.ndim < 3:
            raise ValueError(f"Normalize expects a (..., C, H, W) tensor, got shape {tuple(tensor.shape)}")
        if not self.inplace:
            tensor = tensor.clone()
        mean = torch.as_tensor(self.mean, dtype=tensor.dtype, device=tensor.device)
        std = torch.as_tensor(self.std, dtype=tensor.dtype, device=tensor.device)
        if (std == 0).any():
            raise ValueError(f"std evaluated to zero after conversion to {tensor.dtype}, leading to division by zero.")
        if mean.ndim == 1:
            mean = mean.view(-1, 1, 1)
        if std.ndim == 1:
            std = std.view(-1, 1, 1)
        return tensor.sub_(mean).div_(std)

    def __repr__(self):
        return f"{type(self).__name__}(mean={self.mean}, std={self.std})"


# ------------------------------------------------------------------ factories


def train_transform(size=224, use_torchvision=None):
    """RandomResizedCrop(size) + RandomHorizontalFlip + ToTensor + Normalize
    (ImageNet statistics).  ``use_torchvision``: None = torchvision's when
    importable, True = require it, False = the Pillow versions here."""
    tv = _use_torchvision(use_torchvision)
    t = tv.transforms if tv is not None else sys.modules[__name__]
    return t.Compose([
        t.RandomResizedCrop(size, antialias=True),
        t.RandomHorizontalFlip(),
        t.ToTensor(),
        t.Normalize(IMAGENET_MEAN, IMAGENET_STD),
    ])


def val_transform(resize=256, crop=224, use_torchvision=None):
    """Resize(resize) + CenterCrop(crop) + ToTensor + Normalize."""
    tv = _use_torchvision(use_torchvision)
    t = tv.transforms if tv is not None else sys.modules[__name__]
    return t.Compose([
        t.Resize(resize, antialias=True),
        t.CenterCrop(crop),
        t.ToTensor(),
        t.Normalize(IMAGENET_MEAN, IMAGENET_STD),
    ])


def image_folder(root, transform=None, target_transform=None, use_torchvision=None):
    """torchvision's ImageFolder when importable, else ``PilImageFolder``."""
    tv = _use_torchvision(use_torchvision)
    cls = tv.datasets.ImageFolder if tv is not None else PilImageFolder
    return cls(root, transform=transform, target_transform=target_transform)


# ------------------------------------------------------------------ self-check
class _Checker:
    def __init__(self):
        self.failures = 0

    def __call__(self, ok, what):
        print(f"  {'ok  ' if ok else 'FAIL'} {what}")
        if not ok:
            self.failures += 1
        return ok


def _check_get_params(check):
    print("RandomResizedCrop.get_params (torchvision's algorithm, transcribed in _crop_params):")
    sizes = [(500, 375), (375, 500), (224, 224), (1, 1), (7, 5), (1000, 10), (10, 1000), (641, 479),
             (1067, 600), (200, 356)]
    configs = [((0.08, 1.0), (3 / 4, 4 / 3)), ((0.5, 1.0), (1.0, 1.0)), ((0.9, 1.0), (0.5, 2.0)),
               ((1.2, 1.5), (3 / 4, 4 / 3))]  # the last one never fits: always the fallback
    draws = outside = 0
    for seed in range(40):
        for width, height in sizes:
            for scale, ratio in configs:
                torch.manual_seed(seed)
                i, j, h, w = _crop_params(width, height, scale, ratio)
                draws += 1
                if not (0 <= i and 0 <= j and 0 < h and 0 < w and i + h <= height and j + w <= width):
                    outside += 1
                    check(False, f"crop {(i, j, h, w)} outside a {width}x{height} image")
    check(outside == 0, f"{draws} draws (1x1 to 1000x10 images, forced fallbacks included): "
                        "every crop inside its image")
    # The fallback's clamped ratios, by hand: 1000x10 -> w = round(10 * 4/3) = 13.
    torch.manual_seed(0)
    check(_crop_params(1000, 10, (1.2, 1.5), (3 / 4, 4 / 3)) == (0, 493, 10, 13),
          "fallback on 1000x10 (too wide): (0, 493, 10, 13)")
    torch.manual_seed(0)
    check(_crop_params(10, 1000, (1.2, 1.5), (3 / 4, 4 / 3)) == (493, 0, 13, 10),
          "fallback on 10x1000 (too tall): (493, 0, 13, 10)")
    torch.manual_seed(0)
    check(_crop_params(400, 300, (1.2, 1.5), (3 / 4, 4 / 3)) == (0, 0, 300, 400),
          "fallback on 400x300 (ratio within range): the whole image")
    tv = torchvision_or_none()
    if tv is not None:
        img = Image.new("RGB", (641, 479))
        same = True
        for seed in range(200):
            torch.manual_seed(seed)
            a = tv.transforms.RandomResizedCrop.get_params(img, [0.08, 1.0], [3 / 4, 4 / 3])
            torch.manual_seed(seed)
            same &= a == RandomResizedCrop.get_params(img, (0.08, 1.0), (3 / 4, 4 / 3))
        check(same, f"torchvision {tv.__version__} is importable: its get_params agrees on 200 seeds")


def _check_shapes(check):
    print("Resize / CenterCrop sizes and offsets (torchvision's rounding):")
    # (width, height) -> Resize(256) output (width, height), worked out by hand:
    # the long side is int(256 * long / short), truncated.
    expected_resize = {
        (500, 375): (341, 256),  # 341.33
        (375, 500): (256, 341),
        (256, 256): (256, 256),  # unchanged (returned as is)
        (257, 256): (257, 256),  # 257.0 exactly
        (1067, 600): (455, 256),  # 455.25
        (200, 356): (256, 455),  # 455.68: truncated, not rounded
        (601, 257): (598, 256),  # 598.66
        (300, 224): (342, 256),  # 342.86, upscaled
    }
    for (w, h), want in expected_resize.items():
        got = Resize(256)(Image.new("RGB", (w, h))).size
        check(got == want, f"Resize(256) of {w}x{h} -> {got[0]}x{got[1]} (expect {want[0]}x{want[1]})")
    got = Resize((100, 150))(Image.new("RGB", (500, 375))).size
    check(got == (150, 100), f"Resize((100, 150)) of 500x375 -> {got[0]}x{got[1]} (a pair is (h, w))")
    # CenterCrop(224) offsets: margins 117 and 119 are odd; round-half-even.
    expected_crop = {(341, 256): (16, 58), (343, 256): (16, 60), (256, 455): (116, 16),
                     (224, 224): (0, 0), (225, 225): (0, 0), (227, 227): (2, 2)}
    base = np.arange(500 * 500 * 3, dtype=np.uint32).reshape(500, 500, 3).astype(np.uint8)
    for (w, h), (top, left) in expected_crop.items():
        img = Image.fromarray(np.ascontiguousarray(base[:h, :w]))
        got = np.asarray(CenterCrop(224)(img))
        want = base[top:top + 224, left:left + 224]
        check(got.shape == (224, 224, 3) and np.array_equal(got, want),
              f"CenterCrop(224) of {w}x{h}: top {top}, left {left}")
    try:
        CenterCrop(224)(Image.new("RGB", (223, 300)))
        check(False, "CenterCrop larger than the image raises")
    except ValueError:
        check(True, "CenterCrop larger than the image raises")


def _check_pixels(check, path):
    print(f"Pixel checks on {path}:")
    img = pil_loader(path)
    w, h = img.size
    # RandomResizedCrop = get_params, crop, resize; not resize(box=...).
    torch.manual_seed(3)
    i, j, ch, cw = _crop_params(w, h, (0.08, 1.0), (3 / 4, 4 / 3))
    want = np.asarray(img.crop((j, i, j + cw, i + ch)).resize((224, 224), BILINEAR))
    torch.manual_seed(3)
    got = np.asarray(RandomResizedCrop(224)(img))
    check(np.array_equal(got, want), f"RandomResizedCrop(224): crop {cw}x{ch} at ({j}, {i}) then resize")
    boxed = np.asarray(img.resize((224, 224), BILINEAR, box=(j, i, j + cw, i + ch)))
    differ = float((boxed != want).any(axis=2).mean())
    print(f"       (resize with box= instead: {100 * differ:.1f}% of pixels differ, "
          f"max {int(np.abs(boxed.astype(int) - want).max())} levels; not used)")
    # The whole train transform against the reference draws in order.
    t = train_transform(use_torchvision=False)
    for seed in range(20):
        torch.manual_seed(seed)
        got = t(img)
        torch.manual_seed(seed)
        i, j, ch, cw = _crop_params(w, h, (0.08, 1.0), (3 / 4, 4 / 3))
        ref = img.crop((j, i, j + cw, i + ch)).resize((224, 224), BILINEAR)
        if torch.rand(1) < 0.5:
            ref = ref.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        ref = torch.from_numpy(np.asarray(ref).transpose(2, 0, 1).astype(np.float32) / np.float32(255))
        mean = torch.tensor(IMAGENET_MEAN, dtype=torch.float32)[:, None, None]
        std = torch.tensor(IMAGENET_STD, dtype=torch.float32)[:, None, None]
        ref = (ref - mean) / std
        if not torch.equal(got, ref):
            check(False, f"train_transform, seed {seed}: differs from the reference")
            break
    else:
        check(True, "train_transform on 20 seeds: bit-identical to reference crop/flip/ToTensor/Normalize")
    x = ToTensor()(img)
    check(x.dtype == torch.float32 and x.shape == (3, h, w) and x.is_contiguous()
          and torch.equal(x, torch.from_numpy(np.asarray(img).transpose(2, 0, 1).astype(np.float32)) / 255),
          "ToTensor: contiguous float32 (3, H, W), exactly uint8 / 255")
    p = PILToTensor()(img)
    check(p.dtype == torch.uint8 and p.shape == (3, h, w)
          and torch.equal(p, torch.from_numpy(np.asarray(img).transpose(2, 0, 1).copy())),
          "PILToTensor: uint8 (3, H, W), unscaled")
    gray = ToTensor()(img.convert("L"))
    check(gray.shape == (1, h, w), "ToTensor of an L image: (1, H, W)")
    tv = torchvision_or_none()
    if tv is not None:
        for name, ours, theirs in (("train", train_transform(use_torchvision=False), train_transform()),
                                   ("val", val_transform(use_torchvision=False), val_transform())):
            same = True
            for seed in range(20):
                torch.manual_seed(seed)
                a = ours(img)
                torch.manual_seed(seed)
                same &= torch.equal(a, theirs(img))
            check(same, f"{name}_transform equals torchvision {tv.__version__}'s on 20 seeds")


def _check_dataset(check, root):
    print(f"PilImageFolder over {root}:")
    ds = PilImageFolder(root, transform=val_transform(use_torchvision=False))
    classes_ok = ds.classes == sorted(ds.classes) and ds.class_to_idx == {c: i for i, c in enumerate(ds.classes)}
    check(classes_ok and len(ds) > 0 and ds.targets == [t for _, t in ds.samples],
          f"{len(ds)} samples, {len(ds.classes)} classes ({ds.classes[0]}..{ds.classes[-1]}), sorted")
    order_ok = all(os.path.basename(os.path.dirname(p)) == ds.classes[t] for p, t in ds.samples)
    check(order_ok and [p for p, _ in ds.samples] == sorted(p for p, _ in ds.samples),
          "samples sorted by class, then by file name; each path in its class folder")
    for name, transform in (("train", train_transform(use_torchvision=False)),
                            ("val", val_transform(use_torchvision=False))):
        ds = PilImageFolder(root, transform=transform)
        n = min(len(ds), 256)
        loader = torch.utils.data.DataLoader(torch.utils.data.Subset(ds, range(n)), batch_size=64,
                                             num_workers=2)
        seen = 0
        ok = True
        for images, labels in loader:
            ok &= images.shape[1:] == (3, 224, 224) and images.dtype == torch.float32
            ok &= labels.dtype == torch.int64 and images.shape[0] == labels.shape[0]
            ok &= bool(torch.isfinite(images).all())
            seen += labels.shape[0]
        check(ok and seen == n, f"{name}: DataLoader(num_workers=2, batch_size=64) gave {seen} samples "
                                f"of (3, 224, 224) float32")


def _throughput(root, n_images, reps):
    print(f"\nThroughput, images/s (informational; {n_images} images, batch 64, median of {reps} epochs, "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}, "
          f"{torch.get_num_threads()} torch thread(s) in the main process):")
    print("| transform | num_workers | images/s |")
    print("|---|---:|---:|")
    for name, transform in (("train", train_transform(use_torchvision=False)),
                            ("val", val_transform(use_torchvision=False))):
        ds = torch.utils.data.Subset(PilImageFolder(root, transform=transform), range(n_images))
        for nw in (0, 1, 2):
            loader = torch.utils.data.DataLoader(ds, batch_size=64, num_workers=nw)
            times = []
            for _ in range(reps):
                start = time.perf_counter()
                count = sum(labels.shape[0] for _, labels in loader)
                times.append(time.perf_counter() - start)
                assert count == n_images
            times.sort()
            print(f"| {name} | {nw} | {n_images / times[len(times) // 2]:,.0f} |", flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="run the self-check (and the informational timing)")
    parser.add_argument("--root", help="an image folder to use (default: one made with make_image_folder "
                                       "in the temporary directory)")
    parser.add_argument("--bench-images", type=int, default=1024, help="images per timed epoch (0: no timing)")
    parser.add_argument("--reps", type=int, default=3, help="timed epochs per configuration")
    parser.add_argument("--torch-threads", type=int,
                        help="torch.set_num_threads() for the main process (workers always use 1); on a busy "
                             "2-core machine, 2 intra-op threads can make ToTensor/Normalize 10-50x slower "
                             "with num_workers=0")
    args = parser.parse_args(argv)
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    if not args.check:
        parser.print_help()
        return 0
    tv = torchvision_or_none()
    print(f"torch {torch.__version__}, Pillow {Image.__version__}, torchvision "
          f"{tv.__version__ if tv is not None else 'not importable (the Pillow versions are checked alone)'}")
    check = _Checker()
    _check_get_params(check)
    _check_shapes(check)
    root = args.root
    if root is None:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from imagenet_like import make_image_folder

        root = os.path.join(tempfile.gettempdir(), "fastload-imagenet-like-2000")
        start = time.perf_counter()
        make_image_folder(root)
        print(f"(image folder {root} ready in {time.perf_counter() - start:.1f} s)")
    first = PilImageFolder(root).samples[0][0]
    _check_pixels(check, first)
    _check_dataset(check, root)
    if args.bench_images > 0:
        n = min(args.bench_images, len(PilImageFolder(root)))
        _throughput(root, n, args.reps)
    print(f"\n{check.failures} check(s) failed" if check.failures else "\nall checks passed")
    return 1 if check.failures else 0


if __name__ == "__main__":
    sys.exit(main())
