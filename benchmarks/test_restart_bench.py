"""A smoke run of restart_bench.py on a few generated photos: the rewrite,
the per-image costs, the loader with and without the cache.  The numbers
come from ``python benchmarks/restart_bench.py``."""

import pytest

pytest.importorskip("PIL")
pytest.importorskip("torch")

import restart_bench  # noqa: E402


def test_quick_run_prints_every_variant(tmp_path, capsys):
    restart_bench.main(["--work", str(tmp_path), "--images", "12", "--rounds", "1", "--runs", "1",
                        "--batch", "4", "--workers", "1", "--cache"])
    out = capsys.readouterr().out
    for name in ("as they are", "restart markers, k <= 4", "cache of the files' bytes",
                 "cache, cache_restart_markers=True"):
        assert f"| {name} |" in out
