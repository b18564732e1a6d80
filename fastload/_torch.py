"""torch, when it is installed: fastload works without it (NumPy output).

``import fastload`` does not import torch: torch takes seconds to import, and
a process that never makes a tensor (``python -m fastload``, a child that
only decodes, a script reading arrays into NumPy) need not pay for it.
``torch`` here is None when torch is not installed, else a stand-in that
imports torch at its first attribute access and hands over torch's
attribute, so ``torch is not None`` and ``torch.X`` read as they would with
torch imported.  ``is_tensor`` and ``is_torch_generator`` never import it:
no tensor or torch generator exists before torch is imported.
"""

import importlib
import importlib.util
import sys


_module = None  # torch once imported here (fully: import_module has returned)


def _import():
    global _module
    _module = importlib.import_module("torch")
    return _module


class _Torch:
    """torch, imported at the first attribute access."""

    __slots__ = ()

    def __getattr__(self, name):
        return getattr(_module or _import(), name)

    def __repr__(self):
        module = sys.modules.get("torch")
        return repr(module) if module is not None else "<torch, not imported yet>"


def _installed():
    """Whether torch is installed, read from the installed packages without
    importing it (a sys.modules["torch"] of None blocks the import)."""
    if "torch" in sys.modules:
        return sys.modules["torch"] is not None
    return importlib.util.find_spec("torch") is not None


torch = _Torch() if _installed() else None


def _loaded(attribute):
    """torch.<attribute> when torch has been imported (fully), else None."""
    module = sys.modules.get("torch")
    return getattr(module, attribute, None) if module is not None else None


def is_tensor(obj):
    tensor = _loaded("Tensor")
    return tensor is not None and isinstance(obj, tensor)


def is_torch_generator(obj):
    generator = _loaded("Generator")
    return generator is not None and isinstance(obj, generator)
