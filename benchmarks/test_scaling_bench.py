"""A smoke run of scaling_bench.py: both workloads, both loaders, checked
batches.  The numbers come from ``python benchmarks/scaling_bench.py``."""

import pytest

pytest.importorskip("torch")
pytest.importorskip("PIL")

import scaling_bench  # noqa: E402

pytestmark = [
    pytest.mark.filterwarnings(r"ignore:This DataLoader will create \d+ worker processes"),
    pytest.mark.filterwarnings("ignore:This process .* is multi-threaded, use of fork"),
]


def test_quick_run_reports_both_workloads(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr("sys.argv", ["scaling_bench.py", "--quick", "--workers", "1", "2",
                                     "--data", str(tmp_path)])
    scaling_bench.main()
    out = capsys.readouterr().out
    assert out.count("| jpeg (images/s) |") == 2 and out.count("| rows (rows/s) |") == 2
    assert "| 1 |" in out and "| 100% | 100% |" in out
