"""A smoke run of remote_bench.py; the numbers come from
``python benchmarks/remote_bench.py``."""

import pytest

pytest.importorskip("obstore")
pytest.importorskip("moto.server")

import remote_bench  # noqa: E402


def test_quick_run_reports_every_way(capsys):
    medians = remote_bench.main(["--images", "40", "--per-shard", "10", "--workers", "1",
                                 "--batch-size", "8", "--repeats", "1", "--no-webdataset",
                                 "--no-litdata"])
    out = capsys.readouterr().out
    assert "40 images in 4 shards" in out and "x local disk" in out
    assert set(medians) == {"local disk", "S3, cold cache", "S3, warm cache"}
    assert all(v > 0 for v in medians.values())


def test_litdata_row_or_the_reason_it_is_missing(capsys, tmp_path):
    import importlib.util
    import re
    import sys

    medians = remote_bench.main(["--images", "40", "--per-shard", "10", "--workers", "1",
                                 "--batch-size", "8", "--repeats", "1", "--no-webdataset",
                                 "--peers-python", sys.executable, "--cache", str(tmp_path)])
    out = capsys.readouterr().out
    if importlib.util.find_spec("litdata") is None:
        assert re.search(r"litdata, S3 +skipped: litdata not importable by", out)
        assert "litdata, S3" not in medians
    else:
        assert medians["litdata, S3"] > 0 and "fastload S3 cold over litdata, S3" in out
