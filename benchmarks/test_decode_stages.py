"""A smoke run of decode_stages.py on a few photos: the C harness builds
against the system libjpeg-turbo, decodes every region in every mode and
prints both tables.  The numbers come from
``python benchmarks/decode_stages.py``."""

import os
import shutil

import pytest

pytest.importorskip("PIL")
if shutil.which(os.environ.get("CC", "gcc")) is None:
    pytest.skip("no C compiler", allow_module_level=True)

import decode_stages  # noqa: E402


def test_quick_run_prints_every_mode(tmp_path, capsys):
    decode_stages.main(["--data", str(tmp_path / "photos"), "--images", "20", "--rounds", "1",
                        "--repeats", "1"])
    out = capsys.readouterr().out
    assert "regions (RandomResizedCrop(224), 2 epochs of 20 photos)" in out
    header = "| libjpeg-turbo | " + " | ".join(decode_stages.MODES) + " |"
    assert header in out
    row = next(line for line in out.splitlines() if "(system) |" in line)
    costs = [float(v) for v in row.split("|")[2:-1]]
    assert len(costs) == len(decode_stages.MODES) and all(c > 0 for c in costs)
