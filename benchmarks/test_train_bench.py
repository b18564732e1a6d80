"""A smoke run of train_bench.py's loop on the CPU: every feed trains on
checked batches.  The numbers come from ``python benchmarks/train_bench.py``
on a machine with a CUDA GPU."""

import argparse

import pytest

pytest.importorskip("torch")
pytest.importorskip("PIL")

import pil_pipeline  # noqa: E402
import train_bench  # noqa: E402

pytestmark = [
    pytest.mark.filterwarnings(r"ignore:This DataLoader will create \d+ worker processes"),
    pytest.mark.filterwarnings("ignore:This process .* is multi-threaded, use of fork"),
]


def test_every_feed_trains_on_the_cpu(tmp_path):
    if pil_pipeline.torchvision_or_none() is None:
        pytest.skip("needs torchvision")
    args = argparse.Namespace(device="cpu", workers=1, data=str(tmp_path))
    # Each feed: one untimed batch (warm=0 plus one per worker), one timed;
    # every batch is checked (shape, dtype, device) and trained on.
    sizes = dict(train_bench.QUICK, warm=0, steps=1)
    workers, results = train_bench.run(args, sizes)
    assert workers == 1
    assert set(results) == {"ceiling", *train_bench.LOADERS}
    for name, (rate, busy) in results.items():
        assert rate > 0 and 0 < busy <= 1, name


def test_without_a_gpu_it_says_why(capsys, monkeypatch):
    if train_bench.why_no_gpu() is None:
        pytest.skip("a GPU is here")
    monkeypatch.setattr("sys.argv", ["train_bench.py"])
    train_bench.main()
    assert capsys.readouterr().out.startswith(train_bench.SKIP_LINE)
