"""``python -m fastload``: what this fastload was built with and runs on, one
fact a line; the first thing to paste into a bug report."""

import os
import platform
import sys


def _version_of(distribution):
    """The installed version of `distribution`, or None; reads its metadata
    rather than importing it (importing torch takes seconds)."""
    from importlib import metadata

    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


# The optional packages that change what fastload does or what a user's
# pipeline hands it, as (name printed, distributions to look for: the first
# installed counts).
OPTIONAL_PACKAGES = (
    ("torch", ("torch",)),                  # tensors, torch datasets, samplers, process workers
    ("torchvision", ("torchvision",)),      # its transforms run in C where they map
    ("Pillow", ("Pillow", "Pillow-SIMD")),  # fallback decoder, PIL transforms, write_shards
    ("h5py", ("h5py",)),                    # HDF5Dataset
    ("pyarrow", ("pyarrow",)),              # ArrowDataset, ArrowImages
    ("zarr", ("zarr",)),                    # ZarrDataset
    ("lmdb", ("lmdb",)),                    # databases written with it, read by LMDBDataset
    ("webdataset", ("webdataset",)),        # shards written with it, read by WebDataset
)


def _optional_packages(version_of=None):
    """One "name: version" line per optional package, "not installed" when
    it is not; `version_of(distribution)` gives a version or None (the
    installed metadata by default: nothing is imported)."""
    version_of = version_of or _version_of
    lines = []
    for name, distributions in OPTIONAL_PACKAGES:
        found = next(((d, v) for d in distributions if (v := version_of(d))), None)
        if found is None:
            lines.append(f"{name}: not installed")
        elif found[0] == distributions[0]:
            lines.append(f"{name}: {found[1]}")
        else:
            lines.append(f"{name}: {found[1]} ({found[0]})")
    return lines


def _turbo_version(number):
    """2001005 -> '2.1.5' (LIBJPEG_TURBO_VERSION_NUMBER is MMMmmmppp)."""
    return f"{number // 1000000}.{number // 1000 % 1000}.{number % 1000}"


def _libjpeg_origin(path, package_dir):
    """Where the loaded libjpeg comes from: the copy a binary wheel carries
    (fastload.libs next to the package) or the system's."""
    bundled = os.path.join(os.path.dirname(package_dir), "fastload.libs")
    inside = os.path.commonpath([os.path.realpath(path), os.path.realpath(bundled)])
    return "bundled with fastload" if inside == os.path.realpath(bundled) else "system"


def _simd_in_use(info, environ):
    """The SIMD code libjpeg-turbo runs, as its run-time dispatch (jsimd.c)
    picks it: what the CPU supports, narrowed by JSIMD_FORCESSE2,
    JSIMD_FORCEAVX2 and JSIMD_FORCENONE when they are "1"."""
    if not info["libjpeg_turbo_version"] or not info["libjpeg_with_simd"]:
        return "none (libjpeg built without SIMD)"
    usable = set(info["cpu_simd_features"]) & {"sse2", "avx2", "neon"}
    forced = [name for name in ("SSE2", "AVX2", "NONE") if environ.get(f"JSIMD_FORCE{name}") == "1"]
    for name in forced:
        usable &= {name.lower()}
    best = next((name for name in ("avx2", "sse2", "neon") if name in usable), "none")
    return best + "".join(f", JSIMD_FORCE{name}=1" for name in forced)


def report(environ=os.environ):
    """The lines ``python -m fastload`` prints."""
    import numpy

    import fastload
    from fastload import _C, cuda

    package_dir = os.path.dirname(os.path.abspath(fastload.__file__))
    info = _C.build_info()
    lines = [
        f"fastload: {fastload.__version__} ({package_dir})",
        f"Python: {platform.python_version()} ({platform.python_implementation()}, "
        f"{sys.executable})",
        f"NumPy: {numpy.__version__}",
        *_optional_packages(),
    ]
    if info["libjpeg_turbo_version"]:
        built = f"libjpeg-turbo {_turbo_version(info['libjpeg_turbo_version'])}"
    else:
        built = "libjpeg (not libjpeg-turbo)"
    lines.append(f"libjpeg built with: {built}, JPEG_LIB_VERSION {info['jpeg_lib_version']}")
    path = info["libjpeg_path"]
    if path:
        lines.append(f"libjpeg loaded: {os.path.realpath(path)} "
                     f"({_libjpeg_origin(path, package_dir)})")
    else:
        lines.append("libjpeg loaded: unknown")
    webp = info["libwebp_version"]
    lines.append(f"libpng: {info['libpng_version']} (built with {info['libpng_built_version']}), "
                 f"libwebp: {webp >> 16}.{(webp >> 8) & 0xFF}.{webp & 0xFF}")
    lines.append("SquashFS images: " + ("supported (libsquashfs)" if info.get("squashfs") else
                                        "not supported (built without libsquashfs)"))
    features = " ".join(info["cpu_simd_features"]) or "none"
    lines.append(f"SIMD: {_simd_in_use(info, environ)} (CPU: {features})")
    driver = cuda._status()
    if driver["available"]:
        lines.append(f"CUDA driver: found, {driver['device_count']} device(s)")
    else:
        lines.append(f"CUDA driver: not found ({driver['error']})")
    lines.append(f"CPUs: {len(os.sched_getaffinity(0))} usable of {os.cpu_count()}")
    return lines


def main():
    print("\n".join(report()))


if __name__ == "__main__":
    main()
