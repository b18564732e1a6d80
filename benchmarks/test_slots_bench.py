"""A smoke run of slots_bench.py; the numbers come from
``python benchmarks/slots_bench.py``."""

import slots_bench


def test_quick_run_reports_every_case(capsys):
    slots_bench.main(["--quick"])
    out = capsys.readouterr().out
    assert out.count("| collate") == 2 and out.count("| loader") == 2
    assert "batches held" in out
