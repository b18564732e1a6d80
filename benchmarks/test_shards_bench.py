"""A smoke run of shards_bench.py --quick: the shards are written once and
read by both readers, and every row of the report is printed.  The numbers
come from ``python benchmarks/shards_bench.py``."""

import contextlib
import os
import re
import tarfile

import pytest

pytest.importorskip("torch")
pytest.importorskip("PIL")
pytest.importorskip("webdataset")

import shards_bench  # noqa: E402

pytestmark = [
    pytest.mark.filterwarnings(r"ignore:This DataLoader will create \d+ worker processes"),
    pytest.mark.filterwarnings("ignore:This process .* is multi-threaded, use of fork"),
    # webdataset 1.0.2 leaves each shard it read open for the garbage collector.
    pytest.mark.filterwarnings(r"ignore:unclosed file .*\.tar'>:ResourceWarning"),
]


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    data = tmp_path_factory.mktemp("bench-shards")
    quick = dict(shards_bench.QUICK, reps=1, first_batches=1)  # one of each is enough here
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(shards_bench, "QUICK", quick)
        out = data / "report.md"
        with open(out, "w") as f, contextlib.redirect_stdout(f):
            shards_bench.main(["--quick", "--data", str(data)])
    return data, out.read_text()


def test_every_row_is_printed(report):
    _, text = report
    lines = text.splitlines()
    for workers in shards_bench.WORKERS:
        rows = [line for line in lines if line.startswith(f"| {workers} |")]
        assert len(rows) == 3, (workers, text)  # throughput and both first-batch tables
        for row in rows:
            cells = [c.strip(" *x").replace(",", "") for c in row.strip("|").split("|")]
            numbers = [float(n) for c in cells[1:] for n in c.split("-")]  # pairs are ranges
            assert numbers and all(n > 0 for n in numbers), row
    stage_row = re.compile(r"\| (webdataset|\.\.\.|fastload)[^|]* \| \d+\.\d\d \|")
    assert sum(1 for line in lines if stage_row.fullmatch(line)) == 6, text
    assert "256 generated JPEGs in 2 shards of 128" in text


def test_shards_hold_the_original_jpeg_bytes(report):
    data, _ = report
    folder = os.path.join(data, f"imagenet-like-{shards_bench.QUICK['images']}")
    originals = {f"{name}_{os.path.splitext(os.path.basename(path))[0]}": (path, label)
                 for path, label, name in shards_bench._folder_samples(folder)}
    seen = set()
    for shard in sorted(os.listdir(folder + "-shards")):
        if not shard.endswith(".tar"):
            continue
        with tarfile.open(os.path.join(folder + "-shards", shard)) as tar:
            for member in tar.getmembers():
                key, ext = member.name.split(".", 1)
                path, label = originals[key]
                stored = tar.extractfile(member).read()
                if ext == "jpg":
                    with open(path, "rb") as f:
                        assert stored == f.read(), member.name
                    seen.add(key)
                else:
                    assert ext == "cls" and int(stored) == label, member.name
    assert seen == set(originals)
