"""A smoke run of demo.py with small sizes: every workload's batches are
checked against checksums, and the table and its notes say what ran.  The
numbers come from ``./scripts/demo.sh``."""

import sys

import numpy as np
import pytest

pytest.importorskip("torch")

import demo  # noqa: E402

pytestmark = [
    pytest.mark.filterwarnings(r"ignore:This DataLoader will create \d+ worker processes"),
    pytest.mark.filterwarnings("ignore:This process .* is multi-threaded, use of fork"),
]


def test_tokenizer_checksum_matches_the_samples():
    dataset = demo.PythonTokenizer(demo.PythonTokenizer.DOCS + 9)
    indices = [0, 5, 63, 64, 69, 72, 5]
    direct = sum(int(dataset[i][0].sum()) + dataset[i][1] for i in indices)
    assert dataset.expected_checksum(indices) == direct


def test_tokenizer_samples_are_fixed_length_token_ids():
    dataset = demo.PythonTokenizer(10)
    tokens, label = dataset[3]
    assert tokens.shape == (demo.PythonTokenizer.SEQ,) and tokens.dtype == np.int64
    assert label == 3
    ids = dataset.tokenize(dataset.docs[3])
    assert 0 < len(ids) <= demo.PythonTokenizer.SEQ  # nothing is cut off
    assert list(tokens[: len(ids)]) == ids and not tokens[len(ids):].any()
    assert dataset.UNKNOWN not in ids  # single letters cover every word
    # Punctuation and capitals are handled, not just spaces.
    assert dataset.tokenize("Ba, ba.") == dataset.tokenize("ba") + [dataset.vocab[","]] + \
        dataset.tokenize("ba") + [dataset.vocab["."]]


def test_text_workload_runs_both_loaders(capsys):
    demo.main(["--workload", "text", "--text-samples", "40", "--batch-size", "16",
               "--workers", "0", "1", "--repeat", "1"])
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.startswith("PythonTokenizer  ")]
    assert [row[1] for row in rows] == ["0", "1"]
    assert "take turns on one GIL" in out


def test_image_workload_says_what_each_loader_runs(tmp_path, capsys):
    pytest.importorskip("PIL")
    demo.main(["--workload", "images", "--images", "70", "--workers", "1", "--repeat", "1",
               "--batch-size", "32", "--data", str(tmp_path)])
    out = capsys.readouterr().out
    assert any(line.startswith("ImageFolder  ") for line in out.splitlines())
    assert 'decode="fast"' in out
    if demo.import_torchvision() is None:
        assert "Pillow re-implementation" in out
    else:
        assert "torch: torchvision " in out


def test_image_notes_name_the_stand_in_without_torchvision():
    notes = demo.image_pipelines(None, "exact")
    assert "torchvision cannot be imported" in notes["torch"]
    assert 'decode="exact"' in notes["fastload"]


def _forget_torchvision():
    for name in [n for n in sys.modules if n == "torchvision" or n.startswith("torchvision.")]:
        del sys.modules[name]


def test_torchvision_built_for_another_torch_is_imported_without_meta_registrations(
        tmp_path, monkeypatch):
    # A stand-in package that fails at import as torchvision 0.28.0 does on
    # the CPU-only torch: its meta registrations name operators that never
    # loaded.
    package = tmp_path / "torchvision"
    package.mkdir()
    (package / "__init__.py").write_text(
        "from . import _meta_registrations\nfrom . import datasets, transforms\n")
    (package / "_meta_registrations.py").write_text(
        "raise RuntimeError('operator torchvision::nms does not exist')\n")
    (package / "datasets.py").write_text("")
    (package / "transforms.py").write_text("")
    saved = {n: m for n, m in sys.modules.items()
             if n == "torchvision" or n.startswith("torchvision.")}
    _forget_torchvision()
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        torchvision = demo.import_torchvision()
        assert torchvision is not None and torchvision.__file__ == str(package / "__init__.py")
        assert not hasattr(sys.modules["torchvision._meta_registrations"], "__file__")
    finally:
        _forget_torchvision()
        sys.modules.update(saved)


def test_missing_torchvision_gives_none():
    saved = {n: m for n, m in sys.modules.items()
             if n == "torchvision" or n.startswith("torchvision.")}
    _forget_torchvision()
    sys.modules["torchvision"] = None  # the import raises ModuleNotFoundError
    try:
        assert demo.import_torchvision() is None
    finally:
        _forget_torchvision()
        sys.modules.update(saved)
