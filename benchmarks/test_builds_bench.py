"""A smoke run of builds_bench.py with this tree as both builds: the two
copies of the extension load side by side, agree byte for byte, and every
workload is timed.  The numbers come from ``python
benchmarks/builds_bench.py OLD_TREE``."""

import os

import pytest

pytest.importorskip("PIL")

import builds_bench  # noqa: E402

import fastload._C  # noqa: E402

# the folder holding the fastload package in use: the checkout with an
# in-place build, or site-packages under a wheel
TREE = os.path.dirname(os.path.dirname(os.path.abspath(fastload._C.__file__)))


def test_this_tree_against_itself():
    old = builds_bench.load_extension(TREE, "a")
    new = builds_bench.load_extension(TREE, "b")
    assert old is not new
    rows = builds_bench.compare(old, new, rounds=1)
    assert len(rows) == len(builds_bench.pil_ops_bench.OPS) + 1
    assert all(a > 0 and b > 0 for _, a, b in rows)


def test_a_tree_without_a_build_is_refused(tmp_path):
    (tmp_path / "fastload").mkdir()
    with pytest.raises(SystemExit, match="no built extension"):
        builds_bench.load_extension(str(tmp_path), "c")
