"""The short soak CI runs: benchmarks/soak.py for 40 epochs, which exits
non-zero if memory, file descriptors or threads grow."""

import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("PIL")

SOAK = pathlib.Path(__file__).resolve().parent / "soak.py"


def test_short_soak_stays_flat():
    result = subprocess.run([sys.executable, str(SOAK), "--epochs", "40", "--warmup", "10",
                             "--report", "40"], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "soak ok" in result.stdout
