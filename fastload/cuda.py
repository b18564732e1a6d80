"""The CUDA driver as fastload sees it: loaded at run time (libcuda.so.1),
so fastload builds and runs without CUDA.

``is_available()`` and ``device_count()`` answer without importing torch or
initialising a CUDA runtime; they load the driver once per process.

The GPU decode stage's libraries, nvJPEG and NVRTC, are opened the same way
(csrc/core/cuda/nvjpeg.c, nvrtc.c): ``_library_folders()`` names where to
look (the ``nvidia-*-cu12``/``-cu13`` wheels' lib folders, the CUDA
toolkit's) and ``_nvjpeg_info()``/``_nvrtc_info()`` say what was loaded.
"""

import importlib.util
import os
import platform
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


# The wheels' packages holding each library's lib/ folder: CUDA 12 wheels
# have one package per library (nvidia-nvjpeg-cu12 is nvidia/nvjpeg/lib),
# CUDA 13 wheels share nvidia/cu13/lib.
_WHEEL_PACKAGES = {
    "nvjpeg": ("nvidia.cu13", "nvidia.nvjpeg"),
    "nvrtc": ("nvidia.cu13", "nvidia.cuda_nvrtc"),
}


def _package_folders(name):
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return []
    if spec is None or not spec.submodule_search_locations:
        return []
    return [os.path.join(folder, "lib") for folder in spec.submodule_search_locations]


def _library_folders(library):
    """Existing folders to search for ``library`` ("nvjpeg" or "nvrtc"), in
    order: the pip wheels', then the toolkit's ($CUDA_HOME, $CUDA_PATH,
    /usr/local/cuda).  A copy already loaded in the process comes first
    and the system's search last; the C side does both."""
    folders = []
    for package in _WHEEL_PACKAGES[library]:
        folders += _package_folders(package)
    machine = {"x86_64": "x86_64-linux", "aarch64": "sbsa-linux"}.get(platform.machine())
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home:
            folders.append(os.path.join(home, "lib64"))
            if machine:
                folders.append(os.path.join(home, "targets", machine, "lib"))
    unique = []
    for folder in folders:
        if folder not in unique and os.path.isdir(folder):
            unique.append(folder)
    return unique


def _nvjpeg_info():
    """{'available', 'path', 'version', 'error'} of nvJPEG, opened once per
    process; never raises for a missing library."""
    return _C.nvjpeg_info(_library_folders("nvjpeg"))


def _nvrtc_info():
    """The same for NVRTC."""
    return _C.nvrtc_info(_library_folders("nvrtc"))


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
