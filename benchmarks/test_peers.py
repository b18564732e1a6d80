"""A smoke run of peers.py on a few photos: every peer either runs (a
positive rate, checked batches) or is skipped with the reason; fastload
and torch see the same images.  The numbers come from
``python benchmarks/peers.py`` (docs/benchmarks.md, "Peers")."""

import importlib.util

import pytest

pytest.importorskip("torch")
pytest.importorskip("PIL")

import peers  # noqa: E402

pytestmark = [
    pytest.mark.filterwarnings(r"ignore:This DataLoader will create \d+ worker processes"),
    pytest.mark.filterwarnings("ignore:This process .* is multi-threaded, use of fork"),
]

IMAGES, BATCH, WORKERS = 32, 8, 1
# The module each peer needs beyond torch and fastload.
MODULES = {"webdataset": "webdataset", "FFCV": "ffcv", "DALI": "nvidia.dali", "SPDL": "spdl",
           "grain": "grain", "litdata": "litdata"}


def installed(module):
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a missing parent package
        return False


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    data = tmp_path_factory.mktemp("bench-peers")
    root, key = peers.photo_set(str(data), IMAGES, peers.SEED)
    samples = peers.pil_pipeline.make_dataset(root, peers.pil_pipeline.find_classes(root)[1])
    cache = data / f"cache-{key}"
    cache.mkdir()
    return peers.Setup(root, samples, BATCH, WORKERS, str(cache))


def test_every_peer_runs_or_is_skipped_with_the_reason(setup):
    result = peers.run(setup, list(peers.PEERS), rounds=1)
    ran = {row["peer"]: row for row in result["rows"]}
    assert set(ran) | set(result["skipped"]) == set(peers.PEERS)
    assert not set(ran) & set(result["skipped"])
    for name, module in MODULES.items():
        if not installed(module):
            assert result["skipped"][name].startswith("not installed: "), name
            assert len(result["skipped"][name]) > len("not installed: "), name
    expected = {"fastload", peers.SHARDS, "torch", "decode-only ceiling"}
    expected |= {"webdataset"} if installed("webdataset") else set()
    assert expected <= set(ran), result["skipped"]
    for name, row in ran.items():
        assert row["images_per_s"] > 0, name
        assert row["fastload_over_peer"] > 0, name
    assert ran["fastload"]["fastload_over_peer"] == 1
    assert ran[peers.SHARDS]["shards_over_peer"] == 1
    assert ran[peers.SHARDS]["conversion"] == "built now"  # written untimed, once
    if "webdataset" in ran:  # its shards were written for this photo set, once
        assert ran["webdataset"]["conversion"] == "built now"
        assert peers.run(setup, ["fastload", "webdataset"], 1)["rows"][1]["conversion"] == "cached"


def test_fastload_and_torch_see_the_same_images(setup):
    loaders, skipped = peers.build_loaders(setup, ["fastload", "torch"])
    assert not skipped
    counts = {name: peers.count_images(loader) for name, (loader, _) in loaders.items()}
    assert counts == {"fastload": IMAGES, "torch": IMAGES}
    loaders, skipped = peers.build_loaders(setup, [peers.SHARDS])
    assert not skipped
    assert peers.count_images(loaders[peers.SHARDS][0]) == IMAGES


def test_the_report_has_a_row_per_peer(setup, capsys, tmp_path):
    import json

    out = tmp_path / "peers.json"
    result = peers.main(["--images", str(IMAGES), "--rounds", "1", "--batch", str(BATCH),
                         "--workers", str(WORKERS), "--data", str(tmp_path),
                         "--peers", "torch", "--json", str(out)])
    table = capsys.readouterr().out
    assert "| fastload " in table and "| torch " in table
    assert json.loads(out.read_text())["rows"] == json.loads(json.dumps(result["rows"]))
