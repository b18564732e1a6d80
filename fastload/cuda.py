"""The CUDA driver as fastload sees it: loaded at run time (libcuda.so.1),
so fastload builds and runs without CUDA.

``is_available()`` and ``device_count()`` answer without importing torch or
initialising a CUDA runtime; they load the driver once per process.
"""

import re

from . import _C

__all__ = ["device_count", "is_available"]

_driver = None


def _status():
    global _driver
    if _driver is None:
        _driver = _C.cuda_driver()
    return _driver


def is_available():
    """True when the CUDA driver loads and reports at least one device."""
    return _status()["available"]


def device_count():
    """Number of CUDA devices the driver reports (0 without a driver)."""
    return _status()["device_count"]


def check_device(device):
    """Validates a ``device`` argument naming CUDA ("cuda" or "cuda:N");
    RuntimeError saying why when there is no such device."""
    match = re.fullmatch(r"cuda(?::(\d+))?", str(device))
    if match is None:
        raise ValueError(f"device={device!r} is not a CUDA device ('cuda' or 'cuda:N')")
    status = _status()
    if not status["available"]:
        raise RuntimeError(f"device={device!r} needs a CUDA device: {status['error']}")
    index = int(match.group(1) or 0)
    if index >= status["device_count"]:
        raise RuntimeError(f"device={device!r}: the CUDA driver reports "
                           f"{status['device_count']} device(s)")
    return index
