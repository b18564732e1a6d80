"""Image transforms with torchvision's names and arguments, run in C.

A ``Compose`` of these, given to a fastload image dataset, compiles into one
fused operation per sample: pick the crop box, decode only that region of
the JPEG (scaled down in the DCT domain when the box is much larger than
the output), resample to the output size, flip, convert and normalise,
writing straight into the sample's row of the batch buffer.

The chain must read as torchvision's usual pipelines do::

    [Grayscale(pil=True)]           (first: convert("L") on the decoded pixels)
    [RandomResizedCrop | Resize [CenterCrop | RandomCrop] | CenterCrop | RandomCrop]
    [RandomHorizontalFlip]
    [RandomRotation | RandomAffine]
    [RandAugment | TrivialAugmentWide | AutoAugment]
    [ColorJitter] [RandomGrayscale | Grayscale]   (either order; a flip may follow
                                                   them, unless a warp or policy ran)
    [GaussianBlur]                                (a flip may follow, as above)
    [ToTensor | PILToTensor [ConvertImageDtype]]
    [Normalize]
    [RandomErasing]                 (on the tensor, after the conversion)

``RandomApply([op], p)`` of ColorJitter or GaussianBlur stands where the op
does.  RandomCrop pads only as the first geometric step (after a Resize it
takes no padding).

The colour ops act on the resized image, with the formulas of torchvision's
functions on float tensors (see ``ColorJitter``), or, with ``pil=True`` (what
torchvision's classes compile to), with Pillow's arithmetic on the uint8
image after any warp or policy, or, with ``uint8=True``, as those functions
go on a uint8 tensor (torchvision's classes after ``PILToTensor``).  They are fused only
after the geometry and before the tensor conversion, the usual recipe: in
any other place they would not commute exactly with the crop and resize, so
``Compose`` refuses them there (ValueError); a torchvision ``Compose`` with
them elsewhere runs in Python, per image, as any other callable does.  The
one exception is a leading ``Grayscale(pil=True)``, torchvision's first step
in grayscale recipes: Pillow's ops act on each band alike, so the geometry on
three equal bands gives the one-band image's.  ``Grayscale(1)`` keeps one
channel: the tensors are (1, H, W).

RandomRotation, RandomAffine and the augmentation policies act on the
resized image as uint8 RGB, with Pillow's arithmetic: torchvision's ops on a
PIL image, bit for bit (see ``RandomAffine`` and ``RandAugment``).

``RandomErasing`` overwrites a random box of the stored sample (after
Normalize: the value is in normalised units), as torchvision's does on a
tensor.  ``MixUp``, ``CutMix`` and ``RandomChoice`` of them act on whole
batches: give one to ``DataLoader(batch_transform=...)``.

Randomness (the crop box, the flip, the colour and augmentation draws, the
erased box) comes from a counter-based generator keyed by (seed, epoch,
sample index): the loader's generator fixes the seed, and the output is the
same for any ``num_workers``.  Called directly on an
image (an HWC uint8 array, or a PIL image) a transform draws its seed from
torch's (or NumPy's) global generator, as torchvision's do.

Any other callable given as a dataset's ``transform`` (a function) is
called in the worker, with the GIL, on the image decoded in C; torchvision's
transforms are compiled to these where they map (``fastload.transforms.from_torchvision``).
"""

import collections.abc
import numbers

import numpy as np

from .. import _C
from .._random import draw_seed
from .._torch import torch
from .plan import AUTO_POLICIES, FILTERS, compile_plan

__all__ = [
    "AutoAugment",
    "AutoAugmentPolicy",
    "CenterCrop",
    "ColorJitter",
    "Compose",
    "ConvertImageDtype",
    "GaussianBlur",
    "Grayscale",
    "InterpolationMode",
    "Normalize",
    "PILToTensor",
    "RandAugment",
    "RandomAffine",
    "RandomApply",
    "RandomCrop",
    "RandomErasing",
    "RandomGrayscale",
    "RandomHorizontalFlip",
    "RandomResizedCrop",
    "RandomRotation",
    "Resize",
    "ToTensor",
    "TrivialAugmentWide",
]


class InterpolationMode:
    """torchvision's interpolation names (plain strings here)."""

    NEAREST = "nearest"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"





def _interpolation(value):
    name = getattr(value, "value", value)  # torchvision's enum, or a string
    if name not in FILTERS:
        raise ValueError(f"interpolation {value!r} is not one of {sorted(FILTERS)}")
    return name


PILLOW_MAX_PIXELS = 178_956_970  # Pillow's decompression-bomb limit


def _rgb_array(image):
    """A PIL image, or an HWC (or HW grayscale) uint8 array, as HWC RGB."""
    if hasattr(image, "convert") and hasattr(image, "mode"):  # PIL.Image.Image
        return np.asarray(image.convert("RGB"))
    array = np.asarray(image)
    if array.dtype != np.uint8:
        raise TypeError(f"expected a PIL image or a uint8 array, got dtype {array.dtype}")
    if array.ndim == 2:
        array = np.repeat(array[:, :, None], 3, axis=2)
    if array.ndim != 3 or array.shape[2] != 3:
        raise TypeError(f"expected an HWC RGB image, got shape {array.shape}")
    if array.strides[2] != 1 or array.strides[1] != 3:
        array = np.ascontiguousarray(array)
    return array


def _nchw_view(images):
    """(..., H, W, C) memory seen as (..., C, H, W): torch's channels_last."""
    n = images.ndim
    order = (*range(n - 3), n - 1, n - 3, n - 2)
    return images.permute(*order) if hasattr(images, "permute") else images.transpose(order)


class _Transform:
    """Calling a transform on one image runs it alone (as Compose([t]))."""

    def __call__(self, image):
        return Compose([self])(image)


def _size_pair(size, name):
    """An int or a 1- or 2-sequence, as torchvision takes it: (height, width)."""
    if isinstance(size, numbers.Integral):
        pair = (int(size), int(size))
    elif isinstance(size, (tuple, list)) and len(size) in (1, 2):
        pair = (int(size[0]), int(size[-1]))
    else:
        raise ValueError(f"{name}: size must be an int or a sequence of 1 or 2 ints, got {size!r}")
    if min(pair) < 1:
        raise ValueError(f"{name}: size must be positive, got {size!r}")
    return pair


class RandomResizedCrop(_Transform):
    """A random box of ``scale`` of the area and ``ratio`` aspect, resized to
    ``size`` (torchvision's get_params rules)."""

    op = "random_resized_crop"

    def __init__(self, size, scale=(0.08, 1.0), ratio=(3.0 / 4.0, 4.0 / 3.0),
                 interpolation=InterpolationMode.BILINEAR, antialias=True):
        self.size = _size_pair(size, "RandomResizedCrop")
        if scale[0] > scale[1] or ratio[0] > ratio[1]:
            raise ValueError("RandomResizedCrop: scale and ratio should be of kind (min, max)")
        if not 0 < scale[0] or not 0 < ratio[0]:
            raise ValueError("RandomResizedCrop: scale and ratio must be positive")
        self.scale = (float(scale[0]), float(scale[1]))
        self.ratio = (float(ratio[0]), float(ratio[1]))
        self.interpolation = _interpolation(interpolation)
        self.antialias = bool(antialias)

    def __repr__(self):
        return (f"RandomResizedCrop(size={self.size}, scale={self.scale}, ratio={self.ratio}, "
                f"interpolation={self.interpolation}, antialias={self.antialias})")


class Resize(_Transform):
    """An int size resizes the short side (the long side keeps the aspect,
    capped by ``max_size``); a pair is the exact (height, width)."""

    op = "resize"

    def __init__(self, size, interpolation=InterpolationMode.BILINEAR, max_size=None,
                 antialias=True):
        if isinstance(size, (tuple, list)) and len(size) == 1:
            size = size[0]
        if isinstance(size, numbers.Integral):
            if size < 1:
                raise ValueError(f"Resize: size must be positive, got {size}")
            self.size = int(size)
            if max_size is not None and max_size <= size:
                raise ValueError(f"max_size = {max_size} must be strictly greater than the "
                                 f"requested size for the smaller edge size = {size}")
        else:
            if max_size is not None:
                raise ValueError("max_size is only supported when size is an int")
            self.size = _size_pair(size, "Resize")
        self.max_size = max_size
        self.interpolation = _interpolation(interpolation)
        self.antialias = bool(antialias)

    def __repr__(self):
        return (f"Resize(size={self.size}, interpolation={self.interpolation}, "
                f"max_size={self.max_size}, antialias={self.antialias})")


class CenterCrop(_Transform):
    """The centred box of ``size`` (height, width)."""

    op = "center_crop"

    def __init__(self, size):
        self.size = _size_pair(size, "CenterCrop")

    def __repr__(self):
        return f"CenterCrop(size={self.size})"


class RandomHorizontalFlip(_Transform):
    """Mirrors the image with probability ``p``."""

    op = "flip"

    def __init__(self, p=0.5):
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"RandomHorizontalFlip: p must be in [0, 1], got {p}")
        self.p = float(p)

    def __repr__(self):
        return f"RandomHorizontalFlip(p={self.p})"


def _jitter_range(value, name, center=1, bound=(0, float("inf")), clip_first_on_zero=True):
    """torchvision's ColorJitter._check_input: a number v is [center - v,
    center + v] (clipped at 0 for the factors), a pair is (min, max); the
    identity range (center, center) is None: the adjustment is off."""
    if isinstance(value, numbers.Number):
        if value < 0:
            raise ValueError(f"If {name} is a single number, it must be non negative.")
        value = [center - float(value), center + float(value)]
        if clip_first_on_zero:
            value[0] = max(value[0], 0.0)
    elif isinstance(value, (tuple, list)) and len(value) == 2:
        value = [float(value[0]), float(value[1])]
    else:
        raise TypeError(f"{name} should be a single number or a list/tuple with length 2.")
    if not bound[0] <= value[0] <= value[1] <= bound[1]:
        raise ValueError(f"{name} values should be between {bound}, but got {value}.")
    if value[0] == value[1] == center:
        return None
    return tuple(value)


class ColorJitter(_Transform):
    """Random brightness, contrast, saturation and hue, as torchvision's:
    per image, the four adjustments run in a random order, each with a
    factor drawn uniformly from its range (a number v means
    [max(0, 1 - v), 1 + v], hue's [-v, v] with v <= 0.5; a pair is (min, max)).

    The formulas are those of torchvision's functions on float tensors
    (``F.adjust_brightness/contrast/saturation/hue``: blends with black,
    with the mean gray level, with the grayscale image; a shift of the HSV
    hue), applied to the resized image before conversion.  On a PIL image
    torchvision uses Pillow's ImageEnhance instead, rounding to 8 bits
    after each step; the results differ slightly (docs/design.md).

    ``pil=True`` runs torchvision's PIL path instead: ImageEnhance's
    Brightness, Contrast and Color and the hue shift through Pillow's 8-bit
    HSV, on the resized image as uint8 RGB after any RandomRotation,
    RandomAffine or augmentation policy: for the same factors and order,
    torchvision's output on the PIL image, bit for bit (torchvision's
    ColorJitter in a Compose given to a dataset compiles to this).

    ``uint8=True`` runs torchvision's tensor formulas as they go on a uint8
    tensor (the jitter after ``PILToTensor`` or v2's ``ToImage``): each
    adjustment's result truncated to a whole number, the grays that
    contrast and saturation blend with floored first, and the hue shift
    taken through [0, 1] and back with v2's ``ToDtype`` scaling."""

    op = "color_jitter"

    def __init__(self, brightness=0, contrast=0, saturation=0, hue=0, *, pil=False,
                 uint8=False):
        _one_arithmetic(self, pil, uint8)
        self.brightness = _jitter_range(brightness, "brightness")
        self.contrast = _jitter_range(contrast, "contrast")
        self.saturation = _jitter_range(saturation, "saturation")
        self.hue = _jitter_range(hue, "hue", center=0, bound=(-0.5, 0.5),
                                 clip_first_on_zero=False)

    def __repr__(self):
        return (f"ColorJitter(brightness={self.brightness}, contrast={self.contrast}, "
                f"saturation={self.saturation}, hue={self.hue}{_arithmetic(self)})")


def _arithmetic(t):
    """The repr's tail for a colour op's arithmetic keyword, if not the default."""
    return ", pil=True" if t.pil else ", uint8=True" if t.uint8 else ""


def _one_arithmetic(t, pil, uint8):
    t.pil, t.uint8 = bool(pil), bool(uint8)
    if t.pil and t.uint8:
        raise ValueError(f"{type(t).__name__}: pil=True and uint8=True are two different "
                         "arithmetics; give one")


class RandomGrayscale(_Transform):
    """Grayscale with probability ``p`` (torchvision's tensor weights
    0.2989, 0.587, 0.114), kept as 3 equal channels.  ``pil=True``:
    Pillow's ``convert("L")`` instead (its fixed-point 0.299, 0.587,
    0.114), as torchvision on a PIL image, with ``ColorJitter(pil=True)``.
    ``uint8=True``: the tensor weights, truncated, as on a uint8 tensor
    (with ``ColorJitter(uint8=True)``)."""

    op = "random_grayscale"

    def __init__(self, p=0.1, *, pil=False, uint8=False):
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"RandomGrayscale: p must be in [0, 1], got {p}")
        self.p = float(p)
        _one_arithmetic(self, pil, uint8)

    def __repr__(self):
        return f"RandomGrayscale(p={self.p}{_arithmetic(self)})"


class Grayscale(_Transform):
    """Grayscale always, as 1 channel (the default, as torchvision's) or 3
    equal ones.  One channel needs a tensor conversion after it (ToTensor
    or PILToTensor): the batches are then (N, 1, H, W).  ``pil=True`` and
    ``uint8=True``: as ``RandomGrayscale``'s."""

    op = "grayscale"

    def __init__(self, num_output_channels=1, *, pil=False, uint8=False):
        if num_output_channels not in (1, 3):
            raise ValueError("num_output_channels should be either 1 or 3")
        self.num_output_channels = num_output_channels
        _one_arithmetic(self, pil, uint8)

    def __repr__(self):
        return (f"Grayscale(num_output_channels={self.num_output_channels}"
                f"{_arithmetic(self)})")


def _augment_fill(fill, name):
    """torchvision's fill for a PIL image (_parse_fill): None is black, a
    number every channel, a sequence of 1 or 3 values; each truncated to
    an int, as Pillow receives it."""
    if fill is None:
        values = (0, 0, 0)
    elif isinstance(fill, numbers.Number):
        values = (fill,) * 3
    elif isinstance(fill, (tuple, list)) and len(fill) in (1, 3):
        values = tuple(fill) * (3 // len(fill))
    else:
        raise ValueError(f"{name}: fill must be None, a number or a sequence of 1 or 3 numbers "
                         f"(RGB images), got {fill!r}")
    values = tuple(int(v) for v in values)
    if not all(0 <= v <= 255 for v in values):
        raise ValueError(f"{name}: fill values must be in [0, 255], got {fill!r}")
    return values


def _augment_interpolation(value, name):
    mode = _interpolation(value)
    if mode not in (InterpolationMode.NEAREST, InterpolationMode.BILINEAR):
        raise ValueError(f"{name}: interpolation must be NEAREST or BILINEAR, got {value!r}")
    return mode


def _check_sequence(x, name, sizes):
    """torchvision's _check_sequence_input: its exception types and messages."""
    msg = sizes[0] if len(sizes) < 2 else " or ".join(str(n) for n in sizes)
    if not isinstance(x, collections.abc.Sequence):
        raise TypeError(f"{name} should be a sequence of length {msg}.")
    if len(x) not in sizes:
        raise ValueError(f"{name} should be a sequence of length {msg}.")


def _angle_range(x, name, sizes=(2,)):
    """torchvision's _setup_angle: a number d is (-d, d); a sequence is taken
    as it is.  fastload also wants lo <= hi (torch's uniform_ raises at
    call time otherwise)."""
    if isinstance(x, numbers.Number):
        if x < 0:
            raise ValueError(f"If {name} is a single number, it must be positive.")
        x = [-x, x]
    else:
        _check_sequence(x, name, sizes)
    values = tuple(float(d) for d in x)
    for lo, hi in zip(values[::2], values[1::2]):
        if not lo <= hi:
            raise ValueError(f"{name}: the range must be (min, max) with min <= max, got {x!r}")
    return values


def _warp_fill(fill, name):
    if fill is not None and not isinstance(fill, (collections.abc.Sequence, numbers.Number)):
        raise TypeError("Fill should be either a sequence or a number.")
    return _augment_fill(fill, name)


def _warp_center(center):
    if center is None:
        return None
    _check_sequence(center, "center", (2,))
    return tuple(float(c) for c in center)


class RandomRotation(_Transform):
    """torchvision's RandomRotation: an angle uniform in ``degrees``, then
    ``F.rotate`` (Image.rotate) on the resized image as uint8 RGB with
    Pillow's arithmetic: for the same angle, torchvision's output on the PIL
    image, bit for bit.  ``expand=True`` changes the size per image: a
    ``Compose`` refuses it (a torchvision chain then runs it in Python).
    Interpolation NEAREST or BILINEAR.  The angle comes from fastload's
    generator, keyed by (seed, epoch, index)."""

    op = "rotation"

    def __init__(self, degrees, interpolation=InterpolationMode.NEAREST, expand=False,
                 center=None, fill=0):
        self.degrees = _angle_range(degrees, "degrees")
        self.center = _warp_center(center)
        self.interpolation = _augment_interpolation(interpolation, "RandomRotation")
        self.expand = bool(expand)
        self.fill = _warp_fill(fill, "RandomRotation")

    def __repr__(self):
        return (f"RandomRotation(degrees={list(self.degrees)}, interpolation={self.interpolation}, "
                f"expand={self.expand}, center={self.center}, fill={self.fill})")


class RandomAffine(_Transform):
    """torchvision's RandomAffine: an angle uniform in ``degrees``; a shift
    of ``round(uniform(-tx * width, tx * width))`` pixels (and likewise in
    y) for ``translate=(tx, ty)``; a scale uniform in ``scale``; an x shear
    uniform in ``shear[0:2]`` and a y shear in ``shear[2:4]`` when given
    four values; then ``F.affine`` (Image.transform with torchvision's
    inverse matrix) on the resized image as uint8 RGB with Pillow's
    arithmetic: for the same parameters, torchvision's output on the PIL
    image, bit for bit.  Interpolation NEAREST or BILINEAR.  The parameters
    come from fastload's generator, keyed by (seed, epoch, index)."""

    op = "affine"

    def __init__(self, degrees, translate=None, scale=None, shear=None,
                 interpolation=InterpolationMode.NEAREST, fill=0, center=None):
        self.degrees = _angle_range(degrees, "degrees")
        if translate is not None:
            _check_sequence(translate, "translate", (2,))
            for t in translate:
                if not (0.0 <= t <= 1.0):
                    raise ValueError("translation values should be between 0 and 1")
            translate = tuple(float(t) for t in translate)
        self.translate = translate
        if scale is not None:
            _check_sequence(scale, "scale", (2,))
            for v in scale:
                if v <= 0:
                    raise ValueError("scale values should be positive")
            scale = tuple(float(v) for v in scale)
            if not scale[0] <= scale[1]:
                raise ValueError(f"scale: the range must be (min, max) with min <= max, "
                                 f"got {scale!r}")
        self.scale = scale
        self.shear = None if shear is None else _angle_range(shear, "shear", (2, 4))
        self.interpolation = _augment_interpolation(interpolation, "RandomAffine")
        self.fill = _warp_fill(fill, "RandomAffine")
        self.center = _warp_center(center)
        # torchvision.transforms.v2's matrix: v1's formulas grouped otherwise,
        # so a pixel now and then differs
        self.matrix_v2 = False

    def __repr__(self):
        return (f"RandomAffine(degrees={list(self.degrees)}, translate={self.translate}, "
                f"scale={self.scale}, shear={self.shear}, interpolation={self.interpolation}, "
                f"fill={self.fill}, center={self.center})")


MAX_AUGMENT_OPS = 16  # csrc/core/image/pil_ops.h FL_AUGMENT_MAX_OPS


class RandAugment(_Transform):
    """torchvision's RandAugment: ``num_ops`` ops drawn uniformly from its 14
    (Identity, ShearX/Y, TranslateX/Y, Rotate, Brightness, Color, Contrast,
    Sharpness, Posterize, Solarize, AutoContrast, Equalize), each at
    magnitude bin ``magnitude`` of ``num_magnitude_bins``, signed by a fair
    coin where the op is signed.

    The ops run on the resized image as uint8 RGB with Pillow's semantics
    (what torchvision does to the PIL image ImageFolder hands it): the same
    output as ``torchvision.transforms.functional`` on that image, bit for
    bit.  The draws come from fastload's generator, keyed by (seed, epoch,
    index).  fastload allows ``num_ops`` up to 16."""

    op = "rand_augment"

    def __init__(self, num_ops=2, magnitude=9, num_magnitude_bins=31,
                 interpolation=InterpolationMode.NEAREST, fill=None):
        if not isinstance(num_ops, numbers.Integral) or not 0 <= num_ops <= MAX_AUGMENT_OPS:
            raise ValueError(f"RandAugment: num_ops must be an int in [0, {MAX_AUGMENT_OPS}], "
                             f"got {num_ops!r}")
        if not isinstance(num_magnitude_bins, numbers.Integral) or num_magnitude_bins < 2:
            raise ValueError(f"RandAugment: num_magnitude_bins must be an int >= 2, "
                             f"got {num_magnitude_bins!r}")
        if not isinstance(magnitude, numbers.Integral) or not 0 <= magnitude < num_magnitude_bins:
            raise ValueError(f"RandAugment: magnitude must be an int in [0, num_magnitude_bins), "
                             f"got {magnitude!r}")
        self.num_ops = int(num_ops)
        self.magnitude = int(magnitude)
        self.num_magnitude_bins = int(num_magnitude_bins)
        self.interpolation = _augment_interpolation(interpolation, "RandAugment")
        self.fill = _augment_fill(fill, "RandAugment")
        # torchvision.transforms.v2's Solarize thresholds, 255 * linspace(1, 0)
        # in double, instead of v1's linspace(255, 0) (a few bins differ by
        # a float32 ulp across an integer)
        self.solarize_v2 = False

    def __repr__(self):
        return (f"RandAugment(num_ops={self.num_ops}, magnitude={self.magnitude}, "
                f"num_magnitude_bins={self.num_magnitude_bins}, "
                f"interpolation={self.interpolation}, fill={self.fill})")


class TrivialAugmentWide(_Transform):
    """torchvision's TrivialAugmentWide: one op of RandAugment's 14 at a
    uniform magnitude bin of the wide ranges; as ``RandAugment`` otherwise."""

    op = "trivial_augment"

    def __init__(self, num_magnitude_bins=31, interpolation=InterpolationMode.NEAREST, fill=None):
        if not isinstance(num_magnitude_bins, numbers.Integral) or num_magnitude_bins < 2:
            raise ValueError(f"TrivialAugmentWide: num_magnitude_bins must be an int >= 2, "
                             f"got {num_magnitude_bins!r}")
        self.num_magnitude_bins = int(num_magnitude_bins)
        self.interpolation = _augment_interpolation(interpolation, "TrivialAugmentWide")
        self.fill = _augment_fill(fill, "TrivialAugmentWide")
        self.solarize_v2 = False  # as RandAugment's

    def __repr__(self):
        return (f"TrivialAugmentWide(num_magnitude_bins={self.num_magnitude_bins}, "
                f"interpolation={self.interpolation}, fill={self.fill})")


class AutoAugmentPolicy:
    """torchvision's policy names (plain strings here)."""

    IMAGENET = "imagenet"
    CIFAR10 = "cifar10"
    SVHN = "svhn"




class AutoAugment(_Transform):
    """torchvision's AutoAugment: one of the policy's 25 sub-policies,
    uniformly, each of its two ops applied with its probability at its
    magnitude bin of 10; as ``RandAugment`` otherwise."""

    op = "auto_augment"

    def __init__(self, policy=AutoAugmentPolicy.IMAGENET,
                 interpolation=InterpolationMode.NEAREST, fill=None):
        name = getattr(policy, "value", policy)  # torchvision's enum, or a string
        if name not in AUTO_POLICIES:
            raise ValueError(f"The provided policy {policy} is not recognized.")
        self.policy = name
        self.interpolation = _augment_interpolation(interpolation, "AutoAugment")
        self.fill = _augment_fill(fill, "AutoAugment")
        self.solarize_v2 = False  # as RandAugment's

    def __repr__(self):
        return f"AutoAugment(policy={self.policy}, fill={self.fill})"


class ToTensor(_Transform):
    """HWC uint8 -> CHW float32 in [0, 1]."""

    op = "to_tensor"

    def __repr__(self):
        return "ToTensor()"


class PILToTensor(_Transform):
    """HWC uint8 -> CHW uint8."""

    op = "pil_to_tensor"

    def __repr__(self):
        return "PILToTensor()"


class ConvertImageDtype(_Transform):
    """uint8 -> float32 / float16 in [0, 1] (after PILToTensor)."""

    op = "convert_dtype"

    def __init__(self, dtype):
        name = str(dtype).replace("torch.", "")
        name = {"float": "float32", "half": "float16"}.get(name, name)
        if name not in ("float32", "float16", "uint8"):
            raise ValueError(f"ConvertImageDtype: unsupported dtype {dtype}")
        self.dtype = name

    def __repr__(self):
        return f"ConvertImageDtype({self.dtype})"


class Normalize(_Transform):
    """(x - mean) / std per channel, on float output."""

    op = "normalize"

    def __init__(self, mean, std, inplace=False):
        self.mean = tuple(float(m) for m in mean)
        self.std = tuple(float(s) for s in std)
        if len(self.mean) not in (1, 3) or len(self.std) not in (1, 3):
            raise ValueError("Normalize: mean and std need 1 or 3 values (RGB images)")
        if any(s == 0 for s in self.std):
            raise ValueError(f"std evaluated to zero after conversion to float32, leading to "
                             f"division by zero: {self.std}")
        self.inplace = inplace

    def __repr__(self):
        return f"Normalize(mean={list(self.mean)}, std={list(self.std)})"


class RandomErasing(_Transform):
    """Erases a random box of the tensor image with probability ``p``
    (torchvision's rules: area fraction in ``scale``, log-uniform aspect
    ratio in ``ratio``, ten tries, else nothing).  ``value``: a number, one
    per channel, or "random" (a standard normal draw per element).  It acts
    on the stored sample, after Normalize: the value is in those units.
    ``inplace`` is accepted for torchvision's signature (the row is always
    written in place)."""

    op = "erasing"

    def __init__(self, p=0.5, scale=(0.02, 0.33), ratio=(0.3, 3.3), value=0, inplace=False):
        if not isinstance(value, (numbers.Number, str, tuple, list)):
            raise TypeError("Argument value should be either a number or str or a sequence")
        if isinstance(value, str) and value != "random":
            raise ValueError("If value is str, it should be 'random'")
        if not isinstance(scale, (tuple, list)):
            raise TypeError("Scale should be a sequence")
        if not isinstance(ratio, (tuple, list)):
            raise TypeError("Ratio should be a sequence")
        if (scale[0] > scale[1]) or (ratio[0] > ratio[1]):
            raise ValueError("Scale and ratio should be of kind (min, max)")
        if scale[0] < 0 or scale[1] > 1:
            raise ValueError("Scale should be between 0 and 1")
        if p < 0 or p > 1:
            raise ValueError("Random erasing probability should be between 0 and 1")
        if not ratio[0] > 0:
            raise ValueError("RandomErasing: ratio must be positive")
        if isinstance(value, numbers.Number):
            value = (float(value),)
        elif not isinstance(value, str):
            value = tuple(float(v) for v in value)
            if len(value) not in (1, 3):
                raise ValueError("If value is a sequence, it should have either a single value "
                                 "or 3 (number of input channels)")
        self.p = float(p)
        self.scale = (float(scale[0]), float(scale[1]))
        self.ratio = (float(ratio[0]), float(ratio[1]))
        self.value = value
        self.inplace = bool(inplace)

    def __repr__(self):
        return (f"RandomErasing(p={self.p}, scale={self.scale}, ratio={self.ratio}, "
                f"value={self.value!r}, inplace={self.inplace})")


class Compose:
    """Transforms applied in order; compiles to one fused C operation.

    ``channels_last=True`` lays each image out as HWC in memory; batches
    then are (N, C, H, W) tensors in torch's channels_last memory format.
    """

    def __init__(self, transforms, channels_last=False):
        self.transforms = list(transforms)
        self.channels_last = bool(channels_last)
        self.plan = compile_plan(self.transforms, self.channels_last)

    def __call__(self, image):
        """Transforms one image (PIL, or an HWC uint8 array): a torch tensor
        when the chain converts to a tensor and torch is installed, else a
        NumPy array (HWC uint8 when there is no tensor conversion, where
        torchvision would return a PIL image).  The random draws come from
        a seed taken from the global RNG."""
        out = _C.transform_image(self.plan, _rgb_array(image), crop_seed(),
                                 PILLOW_MAX_PIXELS)
        if self.plan.tensor_output:
            if torch is not None:
                out = torch.from_numpy(out)
            if self.channels_last:
                out = _nchw_view(out)
        return out

    def __repr__(self):
        body = "".join(f"\n    {t!r}" for t in self.transforms)
        return f"Compose({body}\n)"


def crop_seed():
    """A seed for a transform used outside a loader: from the global RNG,
    as torchvision's transforms draw theirs."""
    return draw_seed(None)


# ------------------------------------------- RandomCrop, GaussianBlur, RandomApply

_PADDING_MODES = ("constant", "edge", "reflect", "symmetric")


class RandomCrop(_Transform):
    """A ``size`` crop at uniform random offsets, whole pixels, as
    torchvision's: ``padding`` first pads the image (an int: every side; a
    pair: left/right, top/bottom; four: left, top, right, bottom), then
    ``pad_if_needed`` pads a side shorter than the crop by the shortfall on
    both ends; ``padding_mode`` constant (``fill``: a number or an RGB
    triple), edge, reflect or symmetric.  Only the part of the window inside
    the image is decoded.  A crop larger than the padded image is an error
    for that sample, as torchvision's ValueError."""

    op = "random_crop"

    def __init__(self, size, padding=None, pad_if_needed=False, fill=0, padding_mode="constant"):
        self.size = _size_pair(size, "RandomCrop")
        self.padding = padding
        self.padding_ltrb = _padding_ltrb(padding)
        self.pad_if_needed = bool(pad_if_needed)
        if padding_mode not in _PADDING_MODES:
            raise ValueError("Padding mode should be either constant, edge, reflect or symmetric")
        self.padding_mode = padding_mode
        self.fill = fill
        self.fill_rgb = _fill_rgb(fill)
        # torchvision v2 pads once by padding + the pad_if_needed shortfall;
        # v1 pads twice (it differs for reflect and symmetric)
        self.pad_once = False

    @property
    def pads(self):
        """True when the crop may reach past the image."""
        return self.pad_if_needed or any(self.padding_ltrb)

    def __repr__(self):
        return (f"RandomCrop(size={self.size}, padding={self.padding}, "
                f"pad_if_needed={self.pad_if_needed}, fill={self.fill}, "
                f"padding_mode={self.padding_mode})")


def _padding_ltrb(padding):
    """torchvision's padding argument as (left, top, right, bottom)."""
    if padding is None:
        return (0, 0, 0, 0)
    if isinstance(padding, numbers.Integral):
        padding = [padding]
    if not isinstance(padding, (tuple, list)) or len(padding) not in (1, 2, 4) or not all(
            isinstance(p, numbers.Integral) for p in padding):
        raise ValueError(f"Padding must be an int or a 1, 2, or 4 element tuple, not {padding!r}")
    padding = [int(p) for p in padding]
    if min(padding) < 0:
        raise ValueError(f"RandomCrop: negative padding (a crop) is not supported: {padding}")
    if len(padding) == 1:
        return (padding[0],) * 4
    if len(padding) == 2:
        return (padding[0], padding[1], padding[0], padding[1])
    return tuple(padding)


def _fill_rgb(fill):
    """A fill number or RGB triple as three ints in 0..255 (truncated, as
    torchvision's fill for a PIL image)."""
    values = fill if isinstance(fill, (tuple, list)) else [fill]
    if len(values) == 1:
        values = list(values) * 3
    if len(values) != 3 or not all(isinstance(v, numbers.Real) for v in values):
        raise ValueError(f"fill must be a number or a sequence of 1 or 3 numbers, got {fill!r}")
    rgb = tuple(int(v) for v in values)
    if min(rgb) < 0 or max(rgb) > 255:
        raise ValueError(f"fill values must be in 0..255 for uint8 images, got {fill!r}")
    return rgb


class GaussianBlur(_Transform):
    """torchvision's GaussianBlur: a ``kernel_size`` (x, y; odd) Gaussian
    with sigma drawn uniformly from ``sigma`` (min, max) per image (a number:
    fixed), reflect padding; after the colour ops, on the float image.  On a
    PIL image torchvision rounds the result to 8 bits; here it is not
    rounded before the tensor conversion (docs/design.md)."""

    op = "blur"

    def __init__(self, kernel_size, sigma=(0.1, 2.0)):
        if isinstance(kernel_size, numbers.Integral):
            kernel_size = (kernel_size, kernel_size)
        if not isinstance(kernel_size, (tuple, list)) or len(kernel_size) not in (1, 2):
            raise ValueError("Kernel size should be a tuple/list of two integers")
        kernel_size = (int(kernel_size[0]), int(kernel_size[-1]))
        for k in kernel_size:
            if k <= 0 or k % 2 == 0:
                raise ValueError("Kernel size value should be an odd and positive number.")
        if max(kernel_size) > _C_MAX_BLUR_KERNEL:
            raise ValueError(f"GaussianBlur: kernel sizes up to {_C_MAX_BLUR_KERNEL} are supported")
        self.kernel_size = kernel_size
        if isinstance(sigma, numbers.Number):
            if sigma <= 0:
                raise ValueError("If sigma is a single number, it must be positive.")
            sigma = (float(sigma), float(sigma))
        elif isinstance(sigma, (tuple, list)) and len(sigma) == 2:
            if not 0.0 < sigma[0] <= sigma[1]:
                raise ValueError("sigma values should be positive and of the form (min, max).")
            sigma = (float(sigma[0]), float(sigma[1]))
        else:
            raise ValueError("sigma should be a single number or a list/tuple with length 2.")
        self.sigma = sigma

    def __repr__(self):
        return f"GaussianBlur(kernel_size={self.kernel_size}, sigma={self.sigma})"


_C_MAX_BLUR_KERNEL = 1023  # FL_BLUR_MAX_KERNEL


class RandomApply(_Transform):
    """Runs ``transforms`` with probability ``p``: one ColorJitter or one
    GaussianBlur, drawn from that op's own random stream."""

    op = "apply"

    def __init__(self, transforms, p=0.5):
        transforms = list(transforms)
        if len(transforms) != 1 or not isinstance(transforms[0], (ColorJitter, GaussianBlur)):
            raise ValueError("fastload's RandomApply takes one ColorJitter or one GaussianBlur, "
                             f"got {transforms!r}")
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"RandomApply: p must be in [0, 1], got {p}")
        self.transforms = transforms
        self.p = float(p)

    def __repr__(self):
        return f"RandomApply({self.transforms!r}, p={self.p})"
