"""Image transforms with torchvision's names and arguments, run in C.

``ops`` holds the per-image transforms and ``Compose``; ``plan`` folds a
chain into the one fused C operation each sample gets; ``batch`` holds the
transforms of whole batches (MixUp, CutMix, RandomChoice of them);
``from_torchvision`` maps torchvision's transforms onto these.  Import them
from here: ``from fastload import transforms as T``.
"""

from .batch import CutMix, MixUp, RandomChoice, apply_mix  # noqa: F401
from .ops import *  # noqa: F401,F403
from .ops import PILLOW_MAX_PIXELS, __all__ as _ops_all  # noqa: F401
from .plan import Plan, compile_plan  # noqa: F401

__all__ = sorted([*_ops_all, "CutMix", "MixUp", "RandomChoice"])
