"""``import_torchvision()``: torchvision, where it can be imported, for the
benchmarks and the tests (tests/conftest.py's ``torchvision`` fixture).
fastload itself never imports torchvision.

A torchvision wheel built against another torch build (the PyPI
torchvision with the CPU-only torch) fails at import: its compiled
operators do not load, and torchvision._meta_registrations then refers to
operators that do not exist.  The transforms and ImageFolder used here are
pure Python and need neither, so the import is retried with that one module
replaced by an empty one.
"""

import sys
import types

__all__ = ["forget_torchvision", "import_torchvision"]


def import_torchvision():
    """torchvision, or None when it cannot be imported here."""
    try:
        import torchvision
        return torchvision
    except ModuleNotFoundError as e:
        if e.name == "torchvision":  # not installed
            return None
    except Exception:  # noqa: BLE001 - see the module docstring
        pass
    forget_torchvision()
    sys.modules["torchvision._meta_registrations"] = types.ModuleType(
        "torchvision._meta_registrations")
    try:
        import torchvision
        from torchvision import datasets, transforms  # noqa: F401 - what is used
    except Exception:  # noqa: BLE001 - not importable after all
        forget_torchvision()
        return None
    return torchvision


def forget_torchvision():
    """Drops torchvision and its submodules from ``sys.modules``."""
    for name in [n for n in sys.modules if n == "torchvision" or n.startswith("torchvision.")]:
        del sys.modules[name]
