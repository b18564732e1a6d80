"""A smoke run of shard_index_bench.py; the numbers come from
``python benchmarks/shard_index_bench.py``."""

import shard_index_bench


def test_quick_run_reports_both_ways(capsys):
    medians = shard_index_bench.main(["--samples", "300", "--shards", "3", "--repeats", "1"])
    out = capsys.readouterr().out
    assert "300 samples in 3 shards" in out and "x faster" in out
    assert set(medians) == {"headers", "index files"} and all(v > 0 for v in medians.values())
