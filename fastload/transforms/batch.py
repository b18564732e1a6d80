"""``DataLoader(batch_transform=...)``: what runs on each collated batch.

torchvision documents MixUp and CutMix as a ``collate_fn`` wrapping
``default_collate``; such a lambda is opaque, so fastload takes the batch
transform apart from the collation instead:

* fastload's (or torchvision v2's) ``MixUp``, ``CutMix``, or
  ``RandomChoice`` of them becomes a ``MixStep``: a plan run in C.  On the
  native path it rides in the batch job itself (the engine's or
  ``NativeBatches``' ``mix``), mixing the slot in place after the source has
  filled it; any other batch is mixed by the same C function, from Python,
  in the worker that collated it.  The draws are keyed by (seed, epoch,
  batch number): a batch is the same for any ``num_workers`` or worker mode.
* any other callable ``(images, labels) -> (images, labels)`` becomes a
  ``CallStep``, called in the worker on the collated batch (the dataset then
  leaves the native path, which runs no Python per batch).
"""

import numbers

import numpy as np

from .. import _C
from .._random import draw_seed
from .._torch import torch
from .from_torchvision import is_torchvision, torchvision_name

__all__ = ["CallStep", "CutMix", "MixStep", "MixUp", "RandomChoice", "apply_mix", "resolve"]


_MIXUP, _CUTMIX = 0, 1  # csrc/core/image/mix.h FL_MIX_*


class MixPlan:
    """A compiled batch transform, read by csrc/bind/image/mixing.c: one of ``kinds``
    (0 MixUp, 1 CutMix) with Beta(``alphas[i]``, ``alphas[i]``), picked
    with ``probs[i]``, labels one-hot over ``num_classes``."""

    def __init__(self, kinds, alphas, probs, num_classes):
        self.kinds = tuple(kinds)
        self.alphas = tuple(alphas)
        self.probs = tuple(probs)
        self.num_classes = num_classes


def _labels_array(labels):
    """Class indices as a contiguous int64 vector (a view where it can be)."""
    array = labels.numpy() if hasattr(labels, "numpy") and hasattr(labels, "dim") else labels
    array = np.ascontiguousarray(array, dtype=np.int64)
    if array.ndim != 1:
        raise ValueError(
            f"fastload's MixUp and CutMix take class indices of shape (batch_size,), got "
            f"labels of shape {tuple(array.shape)} (probability labels are not supported)")
    return array


def apply_mix(plan, images, labels, seed, epoch=0, batch=0, inplace=False):
    """Runs a MixPlan on (images, labels) in C, the draws keyed by (seed,
    epoch, batch): returns (images, soft labels (N, num_classes) float32),
    torch tensors for torch input.  Images are (N, C, H, W): a torch tensor
    (contiguous or channels_last) or a NumPy array."""
    if plan.num_classes is None:
        raise ValueError("num_classes must be passed if the labels are index-based (1D)")
    is_tensor = torch is not None and isinstance(images, torch.Tensor)
    if is_tensor:
        if images.device.type != "cpu":
            raise ValueError("fastload's MixUp and CutMix run on CPU batches (in the loader's "
                             "workers); this batch is on " + str(images.device))
        if images.ndim != 4:
            raise ValueError(f"Expected a batched input with 4 dims, but got {images.ndim} "
                             "dimensions instead.")
        nhwc = not images.is_contiguous() and images.is_contiguous(
            memory_format=torch.channels_last)
        if not (nhwc or images.is_contiguous()):
            images, inplace = images.contiguous(), True
        if not inplace:
            images = images.clone()  # keeps the memory format
        array = (images.permute(0, 2, 3, 1) if nhwc else images).numpy()
    else:
        array = np.asarray(images)
        if array.ndim != 4:
            raise ValueError(f"Expected a batched input with 4 dims, but got {array.ndim} "
                             "dimensions instead.")
        nhwc = False
        if not inplace or not (array.flags.c_contiguous and array.flags.writeable):
            array = np.array(array, order="C", copy=True)
        images = array
    label_array = _labels_array(labels)
    if label_array.shape[0] != array.shape[0]:
        raise ValueError(f"The batch size of the image or video does not match the batch size "
                         f"of the labels: {array.shape[0]} != {label_array.shape[0]}.")
    soft = _C.mix_batch(array, label_array, plan, seed, epoch, batch, nhwc)
    if is_tensor or (torch is not None and isinstance(labels, torch.Tensor)):
        soft = torch.from_numpy(soft)
    return images, soft


class _BatchMix:
    """MixUp / CutMix: called on a batch, ``(images, labels) -> (images,
    soft labels)``, with draws from the global RNG, as torchvision's; given
    to ``DataLoader(batch_transform=...)``, run in C in the workers with
    draws keyed by (seed, epoch, batch number)."""

    _kind = None

    def __init__(self, *, alpha=1.0, num_classes=None, labels_getter="default"):
        alpha = float(alpha)
        if not alpha > 0:
            raise ValueError(f"{type(self).__name__}: alpha must be positive, got {alpha}")
        if num_classes is not None and (not isinstance(num_classes, numbers.Integral)
                                        or num_classes < 1):
            raise ValueError(f"{type(self).__name__}: num_classes must be a positive int, "
                             f"got {num_classes!r}")
        if labels_getter != "default":
            raise ValueError(f"{type(self).__name__}: fastload takes the labels as the second "
                             "item of the batch (labels_getter='default')")
        self.alpha = alpha
        self.num_classes = None if num_classes is None else int(num_classes)
        self.labels_getter = labels_getter

    @property
    def mix_plan(self):
        return MixPlan((self._kind,), (self.alpha,), (1.0,), self.num_classes)

    def __call__(self, images, labels):
        return apply_mix(self.mix_plan, images, labels, draw_seed(None))

    def __repr__(self):
        return f"{type(self).__name__}(alpha={self.alpha}, num_classes={self.num_classes})"


class MixUp(_BatchMix):
    """torchvision.transforms.v2.MixUp: each image i becomes lam * image i +
    (1 - lam) * image i - 1 (the batch rolled by one), lam ~ Beta(alpha,
    alpha) per batch; the labels, one-hot, are mixed alike.  Float images
    only (float32, float16), as torchvision's."""

    _kind = _MIXUP


class CutMix(_BatchMix):
    """torchvision.transforms.v2.CutMix: a box of image i - 1 is pasted into
    image i, its sides sqrt(1 - lam) of the image's around a uniform centre,
    clipped; the labels are mixed by the area pasted.  float32, float16 or
    uint8 images."""

    _kind = _CUTMIX


class RandomChoice:
    """torchvision.transforms.v2.RandomChoice of MixUp and CutMix: one of
    them per batch, with probabilities ``p`` (default equal; normalised)."""

    def __init__(self, transforms, p=None):
        if not isinstance(transforms, (list, tuple)):
            raise TypeError("Argument transforms should be a sequence of callables")
        if p is None:
            p = [1] * len(transforms)
        elif len(p) != len(transforms):
            raise ValueError(f"Length of p doesn't match the number of transforms: {len(p)} != "
                             f"{len(transforms)}")
        if not transforms or not all(isinstance(t, _BatchMix) for t in transforms):
            raise TypeError("fastload's RandomChoice picks among MixUp and CutMix; give any "
                            "other batch function as a plain callable")
        if len(transforms) > 8:
            raise ValueError("RandomChoice: at most 8 transforms")
        classes = {t.num_classes for t in transforms}
        if len(classes) != 1:
            raise ValueError(f"RandomChoice: the transforms disagree on num_classes ({classes})")
        total = sum(p)
        self.transforms = list(transforms)
        self.p = [prob / total for prob in p]

    @property
    def num_classes(self):
        return self.transforms[0].num_classes

    @property
    def mix_plan(self):
        return MixPlan([t._kind for t in self.transforms], [t.alpha for t in self.transforms],
                       self.p, self.num_classes)

    def __call__(self, images, labels):
        return apply_mix(self.mix_plan, images, labels, draw_seed(None))

    def __repr__(self):
        return f"RandomChoice({self.transforms!r}, p={self.p})"


def _default_labels(t):
    getter = getattr(t, "_labels_getter", None)
    return getattr(getter, "__name__", "") == "_find_labels_default_heuristic"


def _from_torchvision(t):
    """torchvision v2's MixUp, CutMix, or RandomChoice of them, as fastload's
    (run in C); None for anything else (a labels_getter of its own, another
    transform), which then runs as the callable it is."""
    if not is_torchvision(t):
        return None
    name = torchvision_name(t)
    try:
        if name in ("MixUp", "CutMix") and _default_labels(t):
            cls = MixUp if name == "MixUp" else CutMix
            return cls(alpha=t.alpha, num_classes=t.num_classes)
        if name == "RandomChoice":
            parts = [_from_torchvision(step) for step in t.transforms]
            if parts and all(isinstance(p, (MixUp, CutMix)) for p in parts):
                return RandomChoice(parts, p=list(t.p))
    except (AttributeError, TypeError, ValueError):
        return None
    return None


def _pair(batch):
    if isinstance(batch, (list, tuple)) and len(batch) == 2:
        return batch
    raise TypeError("batch_transform: expected batches of (images, labels), got "
                    f"{type(batch).__name__}" + (f" of {len(batch)} items"
                                                 if isinstance(batch, (list, tuple)) else ""))


def _like(batch, images, labels):
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(images, labels)
    return type(batch)((images, labels)) if isinstance(batch, (list, tuple)) else (images, labels)


class MixStep:
    """MixUp / CutMix as a C plan (see the module docstring)."""

    def __init__(self, transform):
        if transform.num_classes is None:
            raise ValueError("batch_transform: num_classes must be passed if the labels are "
                             f"index-based (1D): {transform!r}")
        self.transform = transform
        self.plan = transform.mix_plan

    def __call__(self, batch, seed, epoch, number):
        images, labels = _pair(batch)
        images, soft = apply_mix(self.plan, images, labels, seed, epoch, number, inplace=True)
        return _like(batch, images, soft)

    def __repr__(self):
        return f"MixStep({self.transform!r})"


class CallStep:
    """Any other ``(images, labels) -> (images, labels)`` callable."""

    def __init__(self, fn):
        self.fn = fn

    def __call__(self, batch, seed, epoch, number):
        images, labels = _pair(batch)
        return _like(batch, *_pair(self.fn(images, labels)))

    def __repr__(self):
        return f"CallStep({self.fn!r})"


def resolve(batch_transform):
    """The step for ``DataLoader(batch_transform=...)``, or None."""
    if batch_transform is None:
        return None
    if isinstance(batch_transform, (MixUp, CutMix, RandomChoice)):
        return MixStep(batch_transform)
    mapped = _from_torchvision(batch_transform)
    if mapped is not None:
        return MixStep(mapped)
    if callable(batch_transform):
        return CallStep(batch_transform)
    raise TypeError("batch_transform must be MixUp, CutMix, RandomChoice of them, or a callable "
                    f"(images, labels) -> (images, labels); got {type(batch_transform).__name__}")
