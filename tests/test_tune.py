"""``python -m fastload.tune`` and ``fastload.tune.sweep``: the sweep's
settings and sample counts, the recommendation rule, the dataset specs and
their errors, the JSON and PNG outputs, and the optional dependencies.

Nothing here asserts a rate: the measured numbers depend on the machine.
"""

import json
import os
import pathlib
import subprocess
import sys
import textwrap
import weakref

import numpy as np
import pytest

import fastload

pytestmark = pytest.mark.skipif(
    bool(getattr(fastload, "__torch_shim__", False)), reason="fastload's own tool"
)

from fastload.observe import tune  # noqa: E402
from fastload.observe.tune import TuneReport, TuneRow, recommend  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
REPORT_KEYS = {"batch_size", "batches", "warmup", "repeat", "cpus", "tolerance", "rows", "best",
               "recommended", "reason"}
ROW_KEYS = {"num_workers", "prefetch_factor", "samples_per_s", "samples", "batches", "seconds"}

DATASET_FILE = textwrap.dedent("""
    import numpy as np

    class Squares:
        def __len__(self):
            return 20

        def __getitem__(self, i):
            return np.full((3, 4), i, np.float32), i * i

    DATASET = Squares()

    def make_dataset():
        return Squares()

    NOT_A_DATASET = 42

    def not_a_factory():
        return 42

    def needs_arguments(root):
        return Squares()
""")


def row(workers, prefetch, rate):
    return TuneRow(workers, prefetch, float(rate), samples=100, batches=10, seconds=100 / rate)


def small_jpeg_folder(root, classes=2, per_class=6):
    from PIL import Image

    rng = np.random.default_rng(0)
    for c in range(classes):
        folder = root / f"class_{c}"
        folder.mkdir(parents=True)
        for i in range(per_class):
            pixels = rng.integers(0, 256, (40 + 4 * i, 56, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(folder / f"{i}.jpg", quality=90)
    return root


@pytest.fixture
def dataset_file(tmp_path):
    path = tmp_path / "my_data.py"
    path.write_text(DATASET_FILE)
    return path


# ------------------------------------------------------- recommendation rule

def test_recommends_the_fewest_workers_within_five_percent_of_the_best():
    rows = [row(0, None, 500), row(1, 1, 800), row(1, 2, 900), row(2, 1, 960),
            row(2, 2, 1000), row(4, 1, 990)]
    chosen, best, reason = recommend(rows)
    assert best is rows[4]
    assert chosen is rows[3]  # 960 >= 95 % of 1000; (1, 2) at 900 is not
    assert "96%" in reason and "num_workers=2, prefetch_factor=2" in reason


def test_recommendation_breaks_worker_ties_by_least_prefetch():
    rows = [row(1, 1, 100), row(2, 4, 1000), row(2, 1, 950), row(2, 2, 990)]
    chosen, best, reason = recommend(rows)
    assert (chosen.num_workers, chosen.prefetch_factor) == (2, 1)  # exactly 95 % counts
    assert best is rows[1]
    assert "batches in flight" in reason


def test_recommendation_is_the_best_when_nothing_cheaper_is_close():
    rows = [row(0, None, 100), row(1, 1, 400), row(2, 1, 1000), row(2, 2, 940)]
    chosen, best, reason = recommend(rows)
    assert chosen is best is rows[2]
    assert reason.startswith("it is the fastest setting")
    assert recommend(rows[:1])[0].setting() == "num_workers=0"


def test_equal_rates_make_the_cheaper_setting_best():
    rows = [row(4, 2, 1000), row(2, 2, 1000), row(2, 1, 1000)]
    chosen, best, _ = recommend(rows)
    assert chosen is best is rows[2]


def test_tolerance_and_the_serial_setting():
    rows = [row(0, None, 900), row(2, 1, 1000)]
    assert recommend(rows)[0] is rows[1]
    assert recommend(rows, tolerance=0.10)[0] is rows[0]


def test_recommend_needs_rows():
    with pytest.raises(ValueError, match="at least one"):
        recommend([])


def test_report_table_and_dict():
    rows = [row(0, None, 500), row(1, 1, 980), row(1, 2, 1000)]
    report = TuneReport(rows, batch_size=8, batches=10, warmup=2, cpus=2)
    text = str(report)
    lines = text.splitlines()
    assert lines[0].split() == ["workers", "prefetch", "samples/s", "vs", "best"]
    assert lines[1].split() == ["0", "-", "500.0", "0.50"]
    assert lines[2].split()[:4] == ["1", "1", "980.0", "0.98"] and "recommended" in lines[2]
    assert "(best)" in lines[3]
    assert "Recommended: num_workers=1, prefetch_factor=1:" in text
    d = report.as_dict()
    assert set(d) == REPORT_KEYS
    assert d["recommended"] == rows[1].as_dict() and d["best"] == rows[2].as_dict()
    assert json.loads(json.dumps(d)) == d


# ------------------------------------------------------------- worker ladder

@pytest.mark.parametrize("cpus,ladder", [(1, (0, 1)), (2, (0, 1, 2)), (3, (0, 1, 2, 3)),
                                         (6, (0, 1, 2, 4, 6)), (16, (0, 1, 2, 4, 8, 16))])
def test_worker_ladder(cpus, ladder):
    assert tune.default_workers(cpus) == ladder


def test_default_ladder_follows_the_affinity_mask(monkeypatch):
    if not hasattr(os, "sched_getaffinity"):
        pytest.skip("no sched_getaffinity here")
    assert max(tune.default_workers()) == len(os.sched_getaffinity(0))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2})
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    assert tune.default_workers() == (0, 1, 2, 3)
    report = tune.sweep(list(range(16)), batch_size=4, batches=1, warmup=0, prefetch=(1,),
                        progress=False, worker_mode="thread")
    assert [r.num_workers for r in report.rows] == [0, 1, 2, 3]
    assert report.cpus == 3


def test_cli_without_workers_stays_within_usable_cpus(dataset_file, tmp_path, capsys):
    out = tmp_path / "report.json"
    assert tune.main([f"{dataset_file}:DATASET", "--batch-size", "4", "--batches", "1",
                      "--warmup", "0", "--prefetch", "1", "--worker-mode", "thread",
                      "--no-progress", "--json", str(out)]) == 0
    workers = [r["num_workers"] for r in json.loads(out.read_text())["rows"]]
    assert workers == list(tune.default_workers())
    assert max(workers) <= tune.usable_cpus()


# ----------------------------------------------------------------- the sweep

def test_settings_and_loaders_dropped_between_them():
    """One row for no workers, one per prefetch factor otherwise; each
    setting's loader is gone before the next one is made."""
    made = []

    def factory(num_workers, prefetch_factor):
        assert all(ref() is None for ref in made), "a previous setting's loader is still alive"
        loader = fastload.DataLoader(list(range(10)), batch_size=4, num_workers=num_workers,
                                     prefetch_factor=prefetch_factor, worker_mode="thread")
        made.append(weakref.ref(loader))
        return loader

    report = tune.sweep(factory, workers=(2, 0, 1), prefetch=(2, 1), batches=2, warmup=1,
                        progress=False)
    assert [(r.num_workers, r.prefetch_factor) for r in report.rows] == [
        (0, None), (1, 1), (1, 2), (2, 1), (2, 2)]
    assert len(made) == 5
    assert report.batch_size is None  # a factory's own


def test_repeat_goes_round_the_settings_and_takes_the_median():
    made = []

    def factory(num_workers, prefetch_factor):
        made.append((num_workers, prefetch_factor))
        return fastload.DataLoader(list(range(8)), batch_size=4, num_workers=num_workers,
                                   prefetch_factor=prefetch_factor, worker_mode="thread")

    report = tune.sweep(factory, workers=(0, 1), prefetch=(1,), batches=2, warmup=0, repeat=3,
                        progress=False)
    assert made == [(0, None), (1, 1)] * 3
    assert report.repeat == 3 and report.as_dict()["repeat"] == 3
    for r in report.rows:
        assert (r.batches, r.samples) == (6, 24)
    with pytest.raises(ValueError, match="repeat must be at least 1"):
        tune.sweep(factory, repeat=0, progress=False)


@pytest.mark.parametrize("batches,samples", [(3, 10), (5, 18)])
def test_samples_counted_from_batches_across_epochs(batches, samples):
    """10 samples in batches of 4: 4, 4, 2, then the next epoch."""
    report = tune.sweep(list(range(10)), batch_size=4, workers=(0, 1), prefetch=(1,),
                        batches=batches, warmup=0, progress=False, shuffle=False,
                        worker_mode="thread")
    for r in report.rows:
        assert (r.batches, r.samples) == (batches, samples)
        assert r.seconds > 0 and r.samples_per_s == pytest.approx(samples / r.seconds)


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


@pytest.mark.parametrize("warmup", [0, 2])
def test_timed_window_is_the_timed_batches_only(monkeypatch, warmup):
    """On a clock that ticks once per batch made and 100 times when the
    iterator is shut down, the timed window holds exactly the timed batches:
    not the last warm-up batch, not the shutdown."""
    clock = FakeClock()
    monkeypatch.setattr(tune, "perf_counter", clock)

    class Loader:
        batch_size, batch_sampler = 4, None

        def __iter__(self):
            try:
                for _ in range(100):
                    clock.now += 1  # making a batch
                    yield np.zeros((4, 2))
            finally:
                clock.now += 100  # shutting down

    report = tune.sweep(lambda num_workers, prefetch_factor: Loader(), workers=(0,),
                        batches=3, warmup=warmup, progress=False)
    assert (report.rows[0].seconds, report.rows[0].samples) == (3.0, 12)


def test_batch_size_none_counts_one_sample_per_item():
    report = tune.sweep([np.zeros(5)] * 6, batch_size=None, workers=(0,), batches=4, warmup=1,
                        progress=False)
    assert report.rows[0].samples == 4


def test_iterable_dataset_is_not_shuffled():
    class Stream(fastload.IterableDataset):
        def __iter__(self):
            return iter(range(12))

    report = tune.sweep(Stream(), batch_size=3, workers=(0,), batches=2, warmup=1,
                        progress=False)
    assert report.rows[0].samples == 6


def test_sweep_rejects_what_it_varies():
    with pytest.raises(TypeError, match="num_workers is what sweep"):
        tune.sweep(list(range(4)), num_workers=2, progress=False)
    with pytest.raises(TypeError, match="a loader factory builds its own loader"):
        tune.sweep(lambda num_workers, prefetch_factor: [], shuffle=True, progress=False)
    with pytest.raises(TypeError, match="takes a dataset or a loader factory"):
        tune.sweep(42, progress=False)
    with pytest.raises(ValueError, match="prefetch must be positive"):
        tune.sweep(list(range(4)), workers=(1,), prefetch=(0,), progress=False)
    with pytest.raises(ValueError, match="no batch"):
        tune.sweep(lambda num_workers, prefetch_factor: [], workers=(0,), progress=False)


# --------------------------------------------------------------- the CLI

def test_cli_on_an_image_folder(tmp_path):
    pytest.importorskip("PIL")
    pytest.importorskip("matplotlib")
    folder = small_jpeg_folder(tmp_path / "images")
    out_json, out_png = tmp_path / "tune.json", tmp_path / "tune.png"
    proc = subprocess.run(
        [sys.executable, "-m", "fastload.tune", str(folder), "--batch-size", "4",
         "--workers", "0,1,2", "--prefetch", "1,2", "--batches", "3", "--warmup", "1",
         "--transform", "eval", "--json", str(out_json), "--plot", str(out_png)],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "12 samples, batch_size=4" in proc.stdout
    assert "Recommended: num_workers=" in proc.stdout
    report = json.loads(out_json.read_text())
    assert set(report) == REPORT_KEYS | {"dataset", "worker_mode"}
    assert [(r["num_workers"], r["prefetch_factor"]) for r in report["rows"]] == [
        (0, None), (1, 1), (1, 2), (2, 1), (2, 2)]
    assert all(set(r) == ROW_KEYS and r["samples"] == 12 for r in report["rows"])
    assert report["recommended"] in report["rows"] and report["best"] in report["rows"]
    assert out_png.read_bytes().startswith(PNG_MAGIC)


def test_image_folder_gets_the_imagenet_transforms(tmp_path):
    pytest.importorskip("PIL")
    folder = small_jpeg_folder(tmp_path / "images", per_class=1)
    for kind in ("train", "eval"):
        ds = tune.load_dataset(str(folder), kind)
        assert isinstance(ds, fastload.ImageFolder)
        image, label = ds[0]
        assert np.asarray(image).shape == (3, 224, 224) and label == 0
    names = [type(t).__name__ for t in tune.image_transform("train").transforms]
    assert names == ["RandomResizedCrop", "RandomHorizontalFlip", "ToTensor", "Normalize"]
    names = [type(t).__name__ for t in tune.image_transform("eval").transforms]
    assert names == ["Resize", "CenterCrop", "ToTensor", "Normalize"]


@pytest.mark.parametrize("attr", ["DATASET", "make_dataset", "Squares"])
def test_cli_on_a_file_spec(dataset_file, tmp_path, capsys, attr):
    pytest.importorskip("matplotlib")
    out_png = tmp_path / "plot.png"
    assert tune.main([f"{dataset_file}:{attr}", "--batch-size", "5", "--workers", "0,1",
                      "--prefetch", "2", "--batches", "2", "--warmup", "1",
                      "--worker-mode", "thread", "--plot", str(out_png)]) == 0
    out = capsys.readouterr().out
    assert "20 samples, batch_size=5" in out
    assert out.count("\n") >= 4 and "Recommended:" in out
    assert out_png.read_bytes().startswith(PNG_MAGIC)


def test_module_spec(dataset_file, monkeypatch):
    monkeypatch.syspath_prepend(str(dataset_file.parent))
    monkeypatch.delitem(sys.modules, "my_data", raising=False)
    ds = tune.load_dataset("my_data:make_dataset")
    assert len(ds) == 20 and ds[3][1] == 9


@pytest.mark.parametrize("spec,message", [
    ("{tmp}/missing", "no such directory, and not of the form module:attr"),
    ("{tmp}/empty_dir", "is not an image folder"),
    ("{tmp}/my_data.py", "is not a directory; name a dataset in a file"),
    ("{tmp}/nope.py:DATASET", "no such Python file"),
    ("no_such_module_for_fastload_tune:ds", "cannot import module 'no_such_module_for_fastload_tune'"),
    ("{tmp}/my_data.py:MISSING", "has no attribute 'MISSING'"),
    ("{tmp}/my_data.py:NOT_A_DATASET", "is of type int: not a dataset"),
    ("{tmp}/my_data.py:not_a_factory", "returned an object of type int: not a dataset"),
    ("{tmp}/my_data.py:needs_arguments", "calling it with no arguments failed"),
])
def test_bad_specs_are_named(dataset_file, capsys, spec, message):
    (dataset_file.parent / "empty_dir").mkdir()
    spec = spec.format(tmp=dataset_file.parent)
    with pytest.raises(SystemExit) as exc:
        tune.main([spec, "--workers", "0", "--no-progress"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert message in err
    assert os.path.basename(spec.split(":")[0]) in err  # names what was given


def test_bad_option_values(capsys):
    for args, message in [(["--workers", "0,x"], "comma-separated integers"),
                          (["--prefetch", "0"], "--prefetch must be positive"),
                          (["--batches", "0"], "--batches and --repeat must be at least 1"),
                          (["--repeat", "0"], "--batches and --repeat must be at least 1")]:
        with pytest.raises(SystemExit):
            tune.main(["whatever", *args])
        assert message in capsys.readouterr().err


# ---------------------------------------------------- optional dependencies

WITHOUT_EXTRAS = textwrap.dedent("""
    import sys
    sys.modules["tqdm"] = sys.modules["matplotlib"] = None  # import fails, as if not installed
    import fastload
    from fastload.observe import tune
    report = tune.sweep(list(range(8)), batch_size=4, workers=(0,), batches=2, warmup=0)
    assert report.rows[0].samples == 8
    try:
        report.plot("never.png")
    except ImportError as e:
        print("plot:", e)
    try:
        tune.main(["whatever", "--plot", "never.png"])
    except SystemExit as e:
        print("exit:", e.code)
""")


def test_works_without_tqdm_and_matplotlib_until_a_plot_is_asked_for(tmp_path):
    proc = subprocess.run([sys.executable, "-c", WITHOUT_EXTRAS], cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "plot: TuneReport.plot needs matplotlib: pip install \"fastload-torch[tune]\"" in proc.stdout
    assert "exit: 2" in proc.stdout
    assert "--plot needs matplotlib: pip install \"fastload-torch[tune]\"" in proc.stderr
    assert not (tmp_path / "never.png").exists()
