"""The CUDA driver, loaded at run time: without one, fastload says why and
device='cuda' fails clearly; with one (a fake libcuda built here, since CI
has no GPU), the driver is found, initialised and counted, and its errors
are reported by name.  Each case runs in a fresh process: the driver is
loaded once per process."""

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from fl_helpers import fastload_only

pytestmark = fastload_only

ROOT = pathlib.Path(__file__).resolve().parent.parent
CC = shutil.which(os.environ.get("CC", "gcc")) or shutil.which("cc")

PROBE = """
import fastload, fastload.cuda as cuda
print(cuda.is_available(), cuda.device_count())
try:
    fastload.DataLoader(range(4), device=DEVICE)
except Exception as e:
    print(f"{type(e).__name__}: {e}")
"""


def run(device="cuda", **env):
    environment = dict(os.environ, PYTHONPATH=str(ROOT), **env)
    result = subprocess.run([sys.executable, "-c", PROBE.replace("DEVICE", repr(device))],
                            env=environment, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


@pytest.fixture(scope="module")
def fake_driver(tmp_path_factory):
    if CC is None:
        pytest.skip("needs a C compiler")
    out = tmp_path_factory.mktemp("fakecuda")
    libs = {}
    for name, flags in (("ok", []), ("old", ["-DFAKE_CUDA_TOO_OLD"]),
                        ("no-register", ["-DFAKE_CUDA_NO_REGISTER"])):
        lib = out / f"libcuda-{name}.so"
        subprocess.run([CC, "-shared", "-fPIC", "-O1", "-Wall", "-Wextra", "-Werror", *flags,
                        "-I", str(ROOT / "csrc"), "-o", str(lib),
                        str(ROOT / "tests" / "c" / "fake_libcuda.c")], check=True)
        libs[name] = str(lib)
    return libs


def test_no_driver():
    lines = run(FASTLOAD_LIBCUDA="libcuda-that-does-not-exist.so.1")
    assert lines[0] == "False 0"
    assert lines[1].startswith("RuntimeError: device='cuda' needs a CUDA device: cannot load "
                               "the CUDA driver (libcuda-that-does-not-exist.so.1")


def test_driver_with_a_device(fake_driver):
    lines = run(FASTLOAD_LIBCUDA=fake_driver["ok"], FAKE_CUDA_DEVICES="2")
    assert lines == ["True 2"]  # the loader was made
    lines = run("cuda:2", FASTLOAD_LIBCUDA=fake_driver["ok"], FAKE_CUDA_DEVICES="2")
    assert lines[1] == "RuntimeError: device='cuda:2': the CUDA driver reports 2 device(s)"


def test_driver_without_devices(fake_driver):
    lines = run(FASTLOAD_LIBCUDA=fake_driver["ok"], FAKE_CUDA_DEVICES="0")
    assert lines == ["False 0",
                     "RuntimeError: device='cuda' needs a CUDA device: "
                     "the CUDA driver reports no device"]


def test_cuinit_error_is_named(fake_driver):
    lines = run(FASTLOAD_LIBCUDA=fake_driver["ok"], FAKE_CUDA_INIT="100")
    assert lines[0] == "False 0"
    assert lines[1].endswith("cuInit failed: no CUDA-capable device is detected")
    lines = run(FASTLOAD_LIBCUDA=fake_driver["ok"], FAKE_CUDA_INIT="7")
    assert lines[1].endswith("cuInit failed: CUDA error 7")


def test_driver_too_old(fake_driver):
    lines = run(FASTLOAD_LIBCUDA=fake_driver["old"])
    assert lines[0] == "False 0"
    assert "has no cuMemHostAlloc: too old" in lines[1]


def test_not_a_cuda_device_name():
    lines = run("cudax", FASTLOAD_LIBCUDA="none.so")
    assert lines[1] == "ValueError: device='cudax' is not a CUDA device ('cuda' or 'cuda:N')"
