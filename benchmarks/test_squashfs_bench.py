"""A smoke run of squashfs_bench.py --quick: every loader (squashfuse when it
can mount here) delivers checked epochs, warm and cold, and the report's rows
are printed.  The numbers come from ``python benchmarks/squashfs_bench.py``."""

import contextlib
import shutil

import pytest

pytest.importorskip("torch")
pytest.importorskip("PIL")

import squashfs_bench  # noqa: E402
from fastload.datasets import squashfs  # noqa: E402

pytestmark = [
    pytest.mark.skipif(shutil.which("mksquashfs") is None, reason="needs mksquashfs"),
    pytest.mark.skipif(not squashfs.available(), reason="built without SquashFS support"),
]


def test_every_row_is_printed(tmp_path, monkeypatch):
    monkeypatch.setattr(squashfs_bench, "QUICK", dict(images=64, reps=1))
    out = tmp_path / "report.md"
    with open(out, "w") as f, contextlib.redirect_stdout(f):
        rate = squashfs_bench.main(["--quick", "--work", str(tmp_path), "--fadvise"])
    text = out.read_text()
    for name in ("disk", "squashfs"):
        assert f"| {name} |" in text
    assert ("| squashfuse |" in text) != ("squashfuse: skipped" in text)
    assert rate["squashfs", "cold"] > 0
