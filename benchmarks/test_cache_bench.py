"""A smoke run of cache_bench.py --quick: every loader delivers checked
epochs, warm and cold, and the report's rows are printed.  The numbers
come from ``python benchmarks/cache_bench.py``."""

import contextlib

import pytest

pytest.importorskip("torch")
pytest.importorskip("PIL")

import cache_bench  # noqa: E402

pytestmark = [
    pytest.mark.filterwarnings(r"ignore:This DataLoader will create \d+ worker processes"),
    pytest.mark.filterwarnings("ignore:This process .* is multi-threaded, use of fork"),
]


def test_every_row_is_printed(tmp_path, monkeypatch):
    monkeypatch.setattr(cache_bench, "QUICK", dict(images=64, reps=1))
    out = tmp_path / "report.md"
    with open(out, "w") as f, contextlib.redirect_stdout(f):
        cache_bench.main(["--quick", "--data", str(tmp_path)])
    text = out.read_text()
    for name in cache_bench.LOADERS:
        assert f"| {name} |" in text
    assert text.count("64 samples stored, 128 hits, 0 corrupt") == 2  # warm + cold
