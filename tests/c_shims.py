"""LD_PRELOAD shims from tests/c/, compiled once a test module."""

import os
import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
CC = shutil.which(os.environ.get("CC", "gcc")) or shutil.which("cc")


def compile_shim(name, tmp_path_factory):
    """tests/c/<name>.c built as a shared object (warnings as errors); the
    test is skipped without a C compiler."""
    if CC is None:
        pytest.skip("needs a C compiler")
    lib = tmp_path_factory.mktemp("shim") / f"{name}.so"
    subprocess.run([CC, "-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-Werror", "-o", str(lib),
                    str(ROOT / "tests" / "c" / f"{name}.c"), "-ldl"], check=True)
    return lib
