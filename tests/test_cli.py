"""``python -m fastload`` (fastload/__main__.py): one line per fact a bug
report needs, each checked against what this process can see for itself."""

import os
import platform
import re
import subprocess
import sys

import numpy as np
import pytest

import fastload
from fastload import _C
from proc_info import mapped_files
from fastload.__main__ import OPTIONAL_PACKAGES, _optional_packages, _simd_in_use, _turbo_version


def run_cli(**env):
    result = subprocess.run([sys.executable, "-m", "fastload"], capture_output=True, text=True,
                            env=dict(os.environ, **env), timeout=120)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    fields = dict(line.split(": ", 1) for line in lines)
    assert len(fields) == len(lines) == 18, lines
    return fields


@pytest.fixture(scope="module")
def fields():
    return run_cli()


def test_versions_of_fastload_python_numpy_and_torch(fields):
    package_dir = os.path.dirname(os.path.abspath(fastload.__file__))
    assert fields["fastload"] == f"{fastload.__version__} ({package_dir})"
    assert fields["Python"].startswith(f"{platform.python_version()} (CPython, ")
    assert fields["NumPy"] == np.__version__
    try:
        import torch
    except ImportError:
        assert fields["torch"] == "not installed"
    else:
        assert fields["torch"] == torch.__version__


def test_libjpeg_it_was_built_with_and_the_one_loaded(fields):
    info = _C.build_info()
    assert info["jpeg_lib_version"] in (62, 70, 80)
    assert re.fullmatch(r"libjpeg-turbo \d+\.\d+\.\d+, JPEG_LIB_VERSION \d+",
                        fields["libjpeg built with"]), fields
    # The library the extension resolved jpeg_* in is mapped into this process.
    path, origin = re.fullmatch(r"(.+) \((bundled with fastload|system)\)",
                                fields["libjpeg loaded"]).groups()
    assert os.path.realpath(path) in mapped_files()
    libs = os.path.join(os.path.dirname(os.path.dirname(fastload.__file__)), "fastload.libs")
    assert (origin == "bundled with fastload") == os.path.realpath(path).startswith(
        os.path.realpath(libs) + os.sep)


def test_libpng_and_libwebp_versions(fields):
    info = _C.build_info()
    assert re.fullmatch(r"\d+\.\d+\.\d+ \(built with \d+\.\d+\.\d+\), libwebp: \d+\.\d+\.\d+",
                        fields["libpng"]), fields
    assert fields["libpng"].startswith(info["libpng_version"])
    assert info["libwebp_version"] > 0


def test_simd_line_names_the_cpu_features_and_honours_jsimd_forcenone(fields):
    features = " ".join(_C.build_info()["cpu_simd_features"]) or "none"
    assert fields["SIMD"].endswith(f" (CPU: {features})")
    assert run_cli(JSIMD_FORCENONE="1")["SIMD"].startswith("none, JSIMD_FORCENONE=1 ")


@pytest.mark.parametrize("environ,expected", [
    ({}, "avx2"),
    ({"JSIMD_FORCESSE2": "1"}, "sse2, JSIMD_FORCESSE2=1"),
    ({"JSIMD_FORCEAVX2": "0"}, "avx2"),  # only "1" forces, as in libjpeg-turbo
    ({"JSIMD_FORCESSE2": "1", "JSIMD_FORCEAVX2": "1"},
     "none, JSIMD_FORCESSE2=1, JSIMD_FORCEAVX2=1"),
])
def test_simd_in_use_follows_libjpeg_turbo_dispatch(environ, expected):
    info = {"libjpeg_turbo_version": 2001005, "libjpeg_with_simd": True,
            "cpu_simd_features": ("mmx", "sse", "sse2", "avx2")}
    assert _simd_in_use(info, environ) == expected
    assert _simd_in_use(dict(info, cpu_simd_features=("sse2",)), {}) == "sse2"
    assert _simd_in_use(dict(info, libjpeg_with_simd=False), {}).startswith("none")


def test_turbo_version_number_reads_as_major_minor_patch():
    assert _turbo_version(2001005) == "2.1.5"
    assert _turbo_version(3000090) == "3.0.90"


def test_cuda_driver_and_cpu_count(fields):
    driver = _C.cuda_driver()
    if driver["available"]:
        assert fields["CUDA driver"] == f"found, {driver['device_count']} device(s)"
    else:
        assert fields["CUDA driver"].startswith("not found (")
    assert fields["CPUs"] == f"{len(os.sched_getaffinity(0))} usable of {os.cpu_count()}"


def test_optional_packages_that_change_behaviour(fields):
    from importlib import metadata

    def installed(distribution):
        try:
            return metadata.version(distribution)
        except metadata.PackageNotFoundError:
            return None

    names = ["torch", "torchvision", "Pillow", "h5py", "pyarrow", "zarr", "lmdb", "webdataset"]
    assert [name for name, _ in OPTIONAL_PACKAGES] == names
    for name in names:
        version = installed(name)
        if name == "Pillow" and version is None and installed("Pillow-SIMD"):
            assert fields[name] == f"{installed('Pillow-SIMD')} (Pillow-SIMD)"
        else:
            assert fields[name] == (version or "not installed"), (name, fields)


def test_optional_packages_not_installed_and_pillow_simd():
    versions = {"torch": "2.13.0", "Pillow-SIMD": "9.0.0.post1"}
    assert _optional_packages(versions.get) == [
        "torch: 2.13.0", "torchvision: not installed", "Pillow: 9.0.0.post1 (Pillow-SIMD)",
        "h5py: not installed", "pyarrow: not installed", "zarr: not installed",
        "lmdb: not installed", "webdataset: not installed"]


def test_the_report_imports_no_optional_package():
    # Versions come from the packages' metadata: importing torchvision or
    # pyarrow would take seconds (and torchvision may not import at all).
    code = ("import runpy, sys; runpy.run_module('fastload', run_name='__main__'); "
            "print(sorted(m for m in ('torchvision', 'PIL', 'h5py', 'pyarrow', 'zarr', 'lmdb', "
            "'webdataset') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "[]", result.stdout
