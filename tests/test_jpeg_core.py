"""The JPEG region decoder and the resampler (csrc/core/image/jpeg.c, resample.c)
checked alone against Pillow by tests/c/jpeg_check.py: full and region
decodes, the fused resample, float16 conversion, corrupt inputs (a status,
never a crash or a byte on stderr)."""

import pathlib
import shutil
import subprocess
import sys

import pytest

pytest.importorskip("PIL")
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("gcc") is None, reason="needs a C compiler")]

SCRIPT = pathlib.Path(__file__).resolve().parent / "c" / "jpeg_check.py"


def test_jpeg_core_against_pillow():
    result = subprocess.run([sys.executable, str(SCRIPT), "--quick"], capture_output=True,
                            text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert "all checks passed" in result.stdout
