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

from . import from_torchvision as _torchvision
from . import ops as T

__all__ = ["CallStep", "MixStep", "resolve"]


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
        images, soft = T.apply_mix(self.plan, images, labels, seed, epoch, number, inplace=True)
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
    if isinstance(batch_transform, (T.MixUp, T.CutMix, T.RandomChoice)):
        return MixStep(batch_transform)
    mapped = _torchvision.batch_transform(batch_transform)
    if mapped is not None:
        return MixStep(mapped)
    if callable(batch_transform):
        return CallStep(batch_transform)
    raise TypeError("batch_transform must be MixUp, CutMix, RandomChoice of them, or a callable "
                    f"(images, labels) -> (images, labels); got {type(batch_transform).__name__}")
