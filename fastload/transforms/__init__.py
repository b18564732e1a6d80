"""Image transforms with torchvision's names and arguments, run in C.

``ops`` holds the per-image transforms and ``Compose``, ``plan`` folds a
chain into the one fused C operation each sample gets, ``batch`` holds the
transforms of whole batches (MixUp, CutMix) and ``from_torchvision`` maps
torchvision's transforms onto these.  Everything public is importable from
here: ``from fastload import transforms as T``.
"""

from .ops import *  # noqa: F401,F403
from .ops import __all__, PILLOW_MAX_PIXELS, apply_mix, compile_plan  # noqa: F401
