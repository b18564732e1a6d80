"""A smoke run of native_route_bench.py (this checkout against itself); the
numbers come from ``python benchmarks/native_route_bench.py --baseline ...``."""

import native_route_bench


def test_quick_run_reports_every_case(capsys):
    native_route_bench.main(["--quick", "--baseline", native_route_bench.ROOT])
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| ") and "ms |" in line]
    # arrays, rows and images: wall and CPU per batch; first batch: one row; 1 and 2
    # workers each.
    assert len(rows) == 2 * (2 + 2 + 2 + 1)
    assert "baseline / this" in out
