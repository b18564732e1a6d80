"""A smoke run of tfrecord_bench.py on a small folder; the numbers come from
``python benchmarks/tfrecord_bench.py``."""

import pytest

pytest.importorskip("torch")
pytest.importorskip("PIL")

import imagenet_like  # noqa: E402
import tfrecord_bench  # noqa: E402


def test_quick_run_reports_both_loaders(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("FASTLOAD_INDEX_DIR", str(tmp_path / "index"))
    folder = imagenet_like.make_image_folder(str(tmp_path / "photos"), n_images=20, n_classes=3,
                                             processes=1)
    medians, skipped = tfrecord_bench.main(
        ["--photos", folder, "--cache", str(tmp_path / "cache"), "--shards", "2", "--batch", "8",
         "--rounds", "1", "--no-dali"])
    out = capsys.readouterr().out
    assert "20 images in 2 TFRecord files" in out and "fastload TFRecord / this" in out
    assert set(medians) == {"fastload TFRecord", "fastload ImageFolder"}
    assert all(v > 0 for v in medians.values())
    assert skipped == {"DALI": "--no-dali"}


def test_records_match_the_tfrecord_package(tmp_path):
    tfrecord = pytest.importorskip("tfrecord")
    from tfrecord import example_pb2

    data = tfrecord_bench.record(tfrecord_bench.example(b"\xff\xd8jpeg", 7))
    path = tmp_path / "a.tfrecord"
    path.write_bytes(data)
    (raw,) = list(tfrecord.reader.tfrecord_iterator(str(path)))
    ex = example_pb2.Example()
    ex.ParseFromString(bytes(raw))
    assert ex.features.feature["image/encoded"].bytes_list.value == [b"\xff\xd8jpeg"]
    assert ex.features.feature["image/class/label"].int64_list.value == [7]


def test_dali_is_skipped_with_the_reason_where_it_cannot_be_imported(tmp_path):
    import importlib.util
    import sys

    try:
        importable = importlib.util.find_spec("nvidia.dali") is not None
    except ModuleNotFoundError:  # no nvidia package at all
        importable = False
    if importable:
        pytest.skip("DALI is importable here")
    child = tfrecord_bench.DaliChild(sys.executable, [], [], 0, 8, 1)
    assert child.skipped.startswith("DALI cannot be imported")
    missing = tfrecord_bench.DaliChild(str(tmp_path / "no-python"), [], [], 0, 8, 1)
    assert missing.skipped.startswith("no Python at")
