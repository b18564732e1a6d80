"""A smoke run of workers_bench.py on tiny sizes: every loader of every
dataset delivers checked epochs (twice, through persistent workers), and a
wrong checksum fails.  The numbers come from
``python benchmarks/workers_bench.py``."""

import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("PIL")

import workers_bench  # noqa: E402
from compare import timed_epoch  # noqa: E402
from workloads import BATCH_SIZE  # noqa: E402

pytestmark = [
    pytest.mark.filterwarnings(r"ignore:This DataLoader will create \d+ worker processes"),
    pytest.mark.filterwarnings("ignore:This process .* is multi-threaded, use of fork"),
]


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    root = tmp_path_factory.mktemp("workers-bench")
    import imagenet_like

    images = imagenet_like.make_image_folder(str(root / "images"), n_images=BATCH_SIZE + 7,
                                             n_classes=3, processes=1)
    return {
        "text": workers_bench.TextTokens(2 * BATCH_SIZE + 5),
        "images": workers_bench.PilImages(images),
        "large": workers_bench.LargeArrays(BATCH_SIZE + 3),
    }


@pytest.mark.parametrize("num_workers", [1, 2])
@pytest.mark.parametrize("kind", workers_bench.LOADERS)
@pytest.mark.parametrize("name", ["text", "images", "large"])
def test_every_loader_delivers_checked_epochs(datasets, name, kind, num_workers):
    dataset = datasets[name]
    expected = (len(dataset), dataset.expected_checksum(range(len(dataset))))
    loader = workers_bench.make_loader(kind, dataset, num_workers)
    timed_epoch(loader, expected)
    timed_epoch(loader, expected)  # the same persistent workers again


def test_a_wrong_epoch_fails_the_check(datasets):
    dataset = datasets["text"]
    expected = (len(dataset), dataset.expected_checksum(range(len(dataset))) + 1)
    loader = workers_bench.make_loader("fastload-process", dataset, 1)
    with pytest.raises(AssertionError, match="checksum"):
        timed_epoch(loader, expected)


def test_text_tokens_are_fixed_length_and_split_unknown_words():
    dataset = workers_bench.TextTokens(8)
    ids, label = dataset[3]
    assert ids.shape == (dataset.SEQ_LEN,) and ids.dtype.name == "int64"
    assert ids[0] == dataset.CLS and 0 <= label < dataset.NUM_CLASSES
    unknown = "zzzzqzzzzq"
    assert unknown not in dataset.vocab
    pieces = dataset.word_pieces(unknown)
    assert len(pieces) > 1 and dataset.UNK not in pieces


def test_the_benchmark_runs_and_reports(datasets, capsys):
    rows = workers_bench.run_dataset(datasets["large"], reps=1, workers=(1,))
    assert [(name, nw) for name, nw, _, _, _ in rows] == [("LargeArrays", 1)]
    workers_bench.report(dict(workers_bench.QUICK, reps=1), rows, {"LargeArrays": 1e-5}, "n/a", 1.0)
    out = capsys.readouterr().out
    assert out.count("| LargeArrays | 1 |") == 2  # speed and CPU tables


def test_tree_cpu_counts_child_processes():
    # A child that uses 0.3 s of CPU, then waits: only counting the child can
    # make the parent's measurement (which blocks meanwhile) see that much.
    burn = ("import sys, time\n"
            "while time.process_time() < 0.3: pass\n"
            "print('done', flush=True)\n"
            "sys.stdin.read()\n")
    before = workers_bench.tree_cpu_seconds()
    with subprocess.Popen([sys.executable, "-c", burn], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, text=True) as child:
        assert child.stdout.readline() == "done\n"
        after = workers_bench.tree_cpu_seconds()
    assert after - before >= 0.3
