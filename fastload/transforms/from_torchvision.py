"""torchvision transforms given to a fastload image dataset, run in C where
they map exactly onto fastload's own.

``resolve(transform)`` decides where each step of a dataset's ``transform``
runs.  A torchvision ``Compose`` (v1 or v2) whose every step has a fastload
equivalent (``_TABLE``) with the same parameters, in an order
``fastload.transforms.compile_plan`` fuses, becomes a fastload ``Compose``:
the C plan, no Python per image.  Otherwise the longest leading run of
geometric steps (crops, resizes, flips) that compiles runs in C on the
uint8 image, and the steps from the first one that does not map run in
Python on that result, as a PIL image (what torchvision's ImageFolder hands
its transform), with the GIL.  A split is exact because the C part ends on
the RGB uint8 image torchvision's own geometric steps would produce from
the PIL image (within fastload's resampling tolerance); no colour, dtype or
tensor step is ever moved to C ahead of a Python one.

torchvision is never imported here: its classes are recognised by class
name and module, so fastload works without it.
"""

from typing import NamedTuple

from . import ops as T

__all__ = ["TransformPlan", "is_torchvision", "resolve", "torchvision_name"]

# The Python part is slower per image than the same chain in C by about
# this factor (benchmarks/images_bench.py, "torchvision classes" rows).
PYTHON_SLOWDOWN = 3


class TransformPlan(NamedTuple):
    """``dataset.transform_plan``: the dataset's transform steps by where
    they run.  ``native``: fused into the C plan (no Python per image);
    ``python``: called in order per image, with the GIL."""

    native: tuple
    python: tuple


def is_torchvision(obj):
    module = type(obj).__module__ or ""
    return module == "torchvision.transforms" or module.startswith("torchvision.transforms.")


def torchvision_name(obj):
    return type(obj).__name__


# ------------------------------------------------------------- the table
# Each builder takes the torchvision object and returns the fastload
# transforms doing the same (an empty list: nothing to do on a decoded RGB
# image), or None when the parameters have no exact C equivalent.


def _interpolation(mode):
    name = getattr(mode, "value", mode)  # InterpolationMode, or v2's string
    return name if name in ("nearest", "bilinear", "bicubic") else None


def _resampling(t):
    """(interpolation, antialias) for fastload, or None.  torchvision
    resamples PIL images with antialiasing whatever ``antialias`` says
    (and warns when it is False); only the default is compiled."""
    interpolation = _interpolation(t.interpolation)
    if interpolation is None or t.antialias is not True:
        return None
    return interpolation


def _random_resized_crop(t):
    interpolation = _resampling(t)
    if interpolation is None:
        return None
    return [T.RandomResizedCrop(t.size, scale=t.scale, ratio=t.ratio,
                                interpolation=interpolation, antialias=True)]


def _resize(t):
    interpolation = _resampling(t)
    if interpolation is None or t.size is None:  # v2's Resize(None, max_size=...)
        return None
    return [T.Resize(t.size, interpolation=interpolation, max_size=t.max_size, antialias=True)]


def _is_float32(dtype):
    return str(dtype) == "torch.float32"  # a torch.dtype; torch is not imported here


def _convert_image_dtype(t):
    return [T.ConvertImageDtype("float32")] if _is_float32(t.dtype) else None


def _to_dtype(t):
    if not _is_float32(t.dtype) or t.scale is not True:  # a dict of dtypes, or unscaled
        return None
    return [T.ConvertImageDtype("float32")]


def _is_v2(t):
    return (type(t).__module__ or "").startswith("torchvision.transforms.v2")


def _random_crop(t):
    if _is_v2(t):
        # v2 keeps padding as [left, right, top, bottom] (None for 0) and
        # pads once by padding plus the pad_if_needed shortfall
        left, right, top, bottom = t.padding if t.padding is not None else (0, 0, 0, 0)
        padding = (left, top, right, bottom)
    else:
        padding = t.padding
    if isinstance(t.fill, dict):  # v2's fill per tv_tensor type
        return None
    crop = T.RandomCrop(t.size, padding=padding, pad_if_needed=t.pad_if_needed, fill=t.fill,
                        padding_mode=t.padding_mode)
    crop.pad_once = _is_v2(t)
    return [crop]


def _gaussian_blur(t):
    return [T.GaussianBlur(tuple(t.kernel_size), sigma=tuple(t.sigma))]


def _random_apply(t):
    steps = list(t.transforms)
    ops = _fastload_ops(steps[0]) if len(steps) == 1 else None
    if ops is None or len(ops) != 1:
        return None
    if isinstance(ops[0], T.Grayscale) and ops[0].num_output_channels == 1:
        return None  # one channel or three, image by image: no batch shape
    if isinstance(ops[0], (T.RandomGrayscale, T.Grayscale)):
        # Gray with probability p times the step's own: one draw does it.
        p = ops[0].p if isinstance(ops[0], T.RandomGrayscale) else 1.0
        return [T.RandomGrayscale(t.p * p, pil=ops[0].pil)]
    return [T.RandomApply(ops, p=t.p)]
def _random_erasing(t):
    value = t.value
    if value is None:  # v2 keeps "random" as None
        value = "random"
    elif isinstance(value, (list, tuple)) and len(value) == 1:
        value = value[0]
    return [T.RandomErasing(t.p, tuple(t.scale), tuple(t.ratio), value, t.inplace)]
def _augment_options(t):
    """(interpolation, fill) of a torchvision augmentation policy.  A v2
    fill given per image type (a dict) stays in Python."""
    return {"interpolation": _interpolation(t.interpolation), "fill": t.fill}


def _policy(op, t):
    """v2's policies run v1's ops on a PIL image with the same tables but
    Solarize's thresholds, which the plan takes as they are."""
    op.solarize_v2 = _is_v2(t)
    return [op]


def _rand_augment(t):
    return _policy(T.RandAugment(t.num_ops, t.magnitude, t.num_magnitude_bins,
                                 **_augment_options(t)), t)


def _trivial_augment(t):
    return _policy(T.TrivialAugmentWide(t.num_magnitude_bins, **_augment_options(t)), t)


def _auto_augment(t):
    return _policy(T.AutoAugment(t.policy, **_augment_options(t)), t)


def _warp_options(t):
    """(interpolation, fill, center) of torchvision's RandomRotation or
    RandomAffine, v1 or v2 (a v2 fill given per image type, a dict, stays
    in Python)."""
    return {"interpolation": _interpolation(t.interpolation), "fill": t.fill,
            "center": t.center}


def _random_rotation(t):
    if t.expand:
        raise ValueError("expand=True changes the output size per image")
    return [T.RandomRotation(t.degrees, **_warp_options(t))]


def _random_affine(t):
    affine = T.RandomAffine(t.degrees, t.translate, t.scale, t.shear, **_warp_options(t))
    affine.matrix_v2 = _is_v2(t)
    return [affine]


def _color_jitter(t):
    """torchvision's ColorJitter (v1 or v2) runs on the PIL image: Pillow's
    arithmetic (ColorJitter(pil=True)).  Its ranges are checked already
    (None: off)."""
    ranges = {name: getattr(t, name) for name in ("brightness", "contrast", "saturation", "hue")}
    return [T.ColorJitter(**{name: 0 if r is None else tuple(r) for name, r in ranges.items()},
                          pil=True)]


def _grayscale(t):
    if t.num_output_channels not in (1, 3):
        return None
    return [T.Grayscale(t.num_output_channels, pil=True)]


_TABLE = {
    "RandomResizedCrop": _random_resized_crop,
    "Resize": _resize,
    "CenterCrop": lambda t: [T.CenterCrop(t.size)],
    "RandomHorizontalFlip": lambda t: [T.RandomHorizontalFlip(t.p)],
    "ToTensor": lambda t: [T.ToTensor()],
    "PILToTensor": lambda t: [T.PILToTensor()],
    "ToImage": lambda t: [T.PILToTensor()],  # v2: PIL -> uint8 CHW image tensor
    "ConvertImageDtype": _convert_image_dtype,
    "ToDtype": _to_dtype,
    "Normalize": lambda t: [T.Normalize(t.mean, t.std, t.inplace)],
    "ToPureTensor": lambda t: [],  # v2: unwraps tv_tensors; batches are plain tensors
    "RGB": lambda t: [],  # decoded images are RGB already
    "RandomCrop": _random_crop,
    "GaussianBlur": _gaussian_blur,
    "RandomApply": _random_apply,
    "RandomErasing": _random_erasing,
    "RandAugment": _rand_augment,
    "TrivialAugmentWide": _trivial_augment,
    "AutoAugment": _auto_augment,
    "RandomRotation": _random_rotation,
    "RandomAffine": _random_affine,
    "ColorJitter": _color_jitter,
    "RandomGrayscale": lambda t: [T.RandomGrayscale(t.p, pil=True)],
    "Grayscale": _grayscale,
}

# Steps that may run in C ahead of a Python part: they only move pixels (or
# do nothing), so their uint8 result is the PIL image torchvision's own
# steps would hand to the next one.
_GEOMETRIC = {"RandomResizedCrop", "Resize", "CenterCrop", "RandomHorizontalFlip", "RGB",
              "RandomCrop"}


def _fastload_ops(t):
    """The fastload transforms for torchvision step ``t``, or None."""
    build = _TABLE.get(torchvision_name(t)) if is_torchvision(t) else None
    if build is None:
        return None
    try:
        return build(t)
    except (AttributeError, TypeError, ValueError):
        # parameters fastload refuses (torchvision raises or warns at call time)
        return None


def _steps(transform):
    """The steps of a torchvision transform: a Compose's, flattened."""
    if torchvision_name(transform) == "Compose" and isinstance(getattr(transform, "transforms", None),
                                                    (list, tuple)):
        steps = []
        for t in transform.transforms:
            steps.extend(_steps(t) if is_torchvision(t) else [t])
        return steps
    return [transform]


# Steps that convert to a tensor, and those of them that make it float:
# torchvision's colour steps after a float conversion act on the float
# tensor, with its tensor formulas.
_TO_TENSOR = {"ToTensor", "PILToTensor", "ToImage", "ConvertImageDtype", "ToDtype",
              "ToPureTensor"}
_TO_FLOAT = {"ToTensor", "ConvertImageDtype", "ToDtype"}
_FLOAT_COLOUR = {"ColorJitter", "RandomGrayscale", "Grayscale", "GaussianBlur", "RandomApply"}


def _tensor_form(ops, uint8):
    """``ops`` (colour ops or a blur) with torchvision's tensor formulas:
    what fastload's float stage runs unless told ``pil``; with ``uint8``,
    as on a uint8 tensor (each step's result truncated), or None where
    fastload has no such form (a blur, which torchvision rounds there)."""
    for op in ops:
        for inner in op.transforms if isinstance(op, T.RandomApply) else [op]:
            if uint8 and not hasattr(inner, "uint8"):
                return None
            if hasattr(inner, "pil"):
                inner.pil = False
                inner.uint8 = uint8
    return ops


def _compose(steps):
    """A fastload Compose doing ``steps`` (all mapped), or None if their
    order does not fuse.  Colour steps and blurs right after the tensor
    conversion run in fastload's float stage, before it: on a float tensor
    they are linear in the scale (or scale-free), so on the image before
    ``/ 255`` they give the same tensor; on a uint8 tensor (PILToTensor,
    v2's ToImage) they run with its truncations (``uint8=True``)."""
    ops = []
    converted_at = None  # where the tensor conversion's ops begin in ops
    is_float = False  # it made a float tensor, and only colour steps followed
    for t in steps:
        name, mapped = torchvision_name(t), _fastload_ops(t)
        if converted_at is not None and name in _FLOAT_COLOUR:
            mapped = _tensor_form(mapped, uint8=not is_float)
            if mapped is None:
                return None
            ops[converted_at:converted_at] = mapped
            converted_at += len(mapped)
            continue
        if name in _TO_TENSOR:
            converted_at = len(ops) if converted_at is None else converted_at
            is_float = is_float or name in _TO_FLOAT
        else:
            converted_at, is_float = None, False
        ops.extend(mapped)
    try:
        return T.Compose(ops)
    except (TypeError, ValueError):
        return None


class PythonSteps:
    """The torchvision steps that run per image in Python: called on the
    HWC uint8 array from C, they see it as a PIL image, as torchvision's
    ImageFolder gives it; a sample from a ``loader`` is passed unchanged."""

    def __init__(self, steps):
        self.steps = tuple(steps)

    def __call__(self, image):
        if type(image).__module__ == "numpy":
            from PIL import Image

            image = Image.fromarray(image)  # HWC uint8: an RGB image
        for step in self.steps:
            image = step(image)
        return image

    def __repr__(self):
        return f"PythonSteps({', '.join(torchvision_name(t) for t in self.steps)})"


def _split(steps):
    """(C part, Python part) of a chain that does not compile whole: the
    longest geometric prefix that compiles, or nothing."""
    for k in range(len(steps), 0, -1):
        prefix = steps[:k]
        if all(torchvision_name(t) in _GEOMETRIC and _fastload_ops(t) is not None for t in prefix):
            compose = _compose(prefix)
            if compose is not None and compose.transforms:
                return compose, k
    return None, 0


def _warning(steps, k):
    """The message for a chain of which ``steps[k:]`` run in Python."""
    unmapped = [t for t in steps[k:] if _fastload_ops(t) is None]
    names = lambda ts: ", ".join(torchvision_name(t) for t in ts)  # noqa: E731
    why = (f"{names(unmapped)} {'has' if len(unmapped) == 1 else 'have'} no exact C equivalent"
           if unmapped else "this order of steps does not fuse into one C operation")
    where = f" (after {names(steps[:k])} in C)" if k else ""
    return (f"fastload: {why}, so {names(steps[k:])} {'runs' if len(steps) - k == 1 else 'run'} "
            f"in Python per image{where}, with the GIL: expect ~{PYTHON_SLOWDOWN}x slower than "
            "the whole chain in C; see docs/guide/images-and-transforms.md")


class Resolved(NamedTuple):
    compose: object  # the fastload Compose run in C, or None
    python: object  # the callable run per image after it, or None
    plan: TransformPlan
    warning: str  # or None


def resolve(transform, loader=False):
    """Where ``transform`` runs (see the module docstring).  ``loader``:
    a Python loader makes the samples, so the transform runs on them as
    it is."""
    if transform is None:
        return Resolved(None, None, TransformPlan((), ()), None)
    torchvision = is_torchvision(transform)
    steps = _steps(transform) if torchvision else [transform]
    if loader:
        return Resolved(None, PythonSteps(steps) if torchvision else transform,
                        TransformPlan((), tuple(steps)), None)
    if isinstance(transform, T.Compose):
        return Resolved(transform, None, TransformPlan(tuple(transform.transforms), ()), None)
    if not torchvision:
        return Resolved(None, transform, TransformPlan((), (transform,)), None)
    if all(_fastload_ops(t) is not None for t in steps):
        compose = _compose(steps)
        if compose is not None:
            return Resolved(compose, None, TransformPlan(tuple(steps), ()), None)
    compose, k = _split(steps)
    return Resolved(compose, PythonSteps(steps[k:]),
                    TransformPlan(tuple(steps[:k]), tuple(steps[k:])), _warning(steps, k))
