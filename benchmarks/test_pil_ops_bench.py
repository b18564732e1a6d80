"""A smoke run of pil_ops_bench.py: every op is timed and gives Pillow's
bytes.  The numbers come from ``python benchmarks/pil_ops_bench.py``."""

import pytest

pytest.importorskip("torch")
pytest.importorskip("PIL")

import pil_ops_bench  # noqa: E402
import pil_pipeline  # noqa: E402


def test_every_op_is_timed_and_exact():
    tv = pil_pipeline.torchvision_or_none()
    if tv is None:
        pytest.skip("torchvision cannot be imported")
    rows = pil_ops_bench.measure(tv, rounds=1, calls=1)
    assert [(op, m) for op, m, _, _ in rows] == pil_ops_bench.OPS
    assert all(fl > 0 and ref > 0 for _, _, fl, ref in rows)
