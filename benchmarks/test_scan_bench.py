"""A smoke run of scan_bench.py on a tiny tree; the numbers come from
``python benchmarks/scan_bench.py`` (1 M files)."""

import scan_bench


def test_tiny_tree_reports_every_construction(tmp_path, capsys):
    medians = scan_bench.main(["--files", "300", "--classes", "7", "--repeats", "1",
                               "--settle", "0", "--data", str(tmp_path)])
    out = capsys.readouterr().out
    assert "300 files (7 classes)" in out and "second" in out and "x faster" in out
    assert set(medians) == set(scan_bench.ROUND) and all(v > 0 for v in medians.values())
