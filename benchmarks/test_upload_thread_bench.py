"""A smoke run of upload_thread_bench.py through the tests' fake CUDA driver
(its device memory is host memory); the numbers come from
``python benchmarks/upload_thread_bench.py``."""

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

HERE = pathlib.Path(__file__).resolve().parent
CC = shutil.which("cc") or shutil.which("gcc")


@pytest.mark.skipif(CC is None, reason="needs a C compiler")
def test_quick_run_reports_the_upload_thread(tmp_path):
    driver = tmp_path / "libcuda-fake.so"
    subprocess.run([CC, "-shared", "-fPIC", "-O1", "-I", str(HERE.parent / "csrc"), "-o",
                    str(driver), str(HERE.parent / "tests" / "c" / "fake_libcuda.c")], check=True)
    result = subprocess.run(
        [sys.executable, str(HERE / "upload_thread_bench.py"), "--batches", "20", "--epochs", "1"],
        env=dict(os.environ, FASTLOAD_LIBCUDA=str(driver)), capture_output=True, text=True,
        timeout=300)
    assert result.returncode == 0, result.stderr
    header, row = result.stdout.splitlines()[-2:]
    assert "upload thread CPU µs/batch" in header
    rate, upload_us, loop_us = map(float, row.split())
    assert rate > 0 and upload_us > 0 and loop_us > 0
