"""A smoke run of autotune_bench.py on tiny sizes: every fixed setting and
"auto" deliver their epoch, and the report names what auto chose.  The
numbers come from ``python benchmarks/autotune_bench.py``."""

import pytest

pytest.importorskip("torch")
pytest.importorskip("PIL")

import autotune_bench  # noqa: E402


def test_quick_run_reports_every_setting_and_auto(tmp_path, capsys):
    results = autotune_bench.main(["--quick", "--root", str(tmp_path), "--jpeg-step-ms", "0",
                                   "--numpy-step-ms", "0", "--epochs", "2"])
    out = capsys.readouterr().out
    for pipeline in ("jpeg", "numpy"):
        rows, auto_rate, report = results[pipeline]
        assert len(rows) == 2 * len(autotune_bench.sweep_workers(autotune_bench.usable_cores()))
        assert all(rate > 0 for _, _, rate in rows) and auto_rate > 0
        assert 1 <= report["workers"] <= report["max_workers"]
        assert f"### {pipeline}" in out
    assert "auto / best fixed" in out
    rows, report = results["persistent"]
    assert [row[0] for row in rows] == [0, 1] and all(row[1] > 0 and row[3] > 0 for row in rows)
    assert "persistent loaders" in out
