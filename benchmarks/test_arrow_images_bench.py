"""A smoke run of arrow_images_bench.py --quick: every loader delivers checked
epochs and the report's rows are printed.  The numbers come from
``python benchmarks/arrow_images_bench.py``."""

import contextlib

import pytest

pytest.importorskip("torch")
pytest.importorskip("PIL")
pytest.importorskip("pyarrow")

import arrow_images_bench  # noqa: E402
import pil_pipeline  # noqa: E402

pytestmark = [
    pytest.mark.filterwarnings(r"ignore:This DataLoader will create \d+ worker processes"),
    pytest.mark.filterwarnings("ignore:This process .* is multi-threaded, use of fork"),
]


def test_every_row_is_printed(tmp_path, monkeypatch):
    if pil_pipeline.torchvision_or_none() is None:
        pytest.skip("needs torchvision")
    monkeypatch.setattr(arrow_images_bench, "QUICK", dict(images=16, reps=1))  # one batch
    out = tmp_path / "report.md"
    with open(out, "w") as f, contextlib.redirect_stdout(f):
        arrow_images_bench.main(["--quick", "--data", str(tmp_path)])
    text = out.read_text()
    for kind in arrow_images_bench.KINDS:
        assert f"| {kind} |" in text
