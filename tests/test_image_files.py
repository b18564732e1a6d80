"""ImageFolder's files: non-regular files (a FIFO named x.jpg must fail at
once, never block in open()), symlink loops in the folder walk, and
torchvision's ``loader`` argument."""

import inspect
import json
import os
import pathlib
import socket
import subprocess
import sys
import textwrap
import traceback

import numpy as np
import pytest

pytest.importorskip("PIL")
from PIL import Image  # noqa: E402

import fastload  # noqa: E402
from fastload import transforms as T  # noqa: E402
from fastload.datasets.images import default_loader  # noqa: E402
from fl_helpers import fastload_only  # noqa: E402

pytestmark = fastload_only

ROOT = pathlib.Path(__file__).resolve().parent.parent


def write_jpeg(path, value, size=(12, 10)):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((size[1], size[0], 3), value, np.uint8)).save(path, quality=95)


# ------------------------------------------------------ non-regular files

# Each case in a fresh interpreter: if a FIFO blocked open() again, the
# subprocess times out and the test fails instead of hanging the suite.
FIFO_SCRIPT = textwrap.dedent("""
    import json, os, sys
    import numpy as np
    import fastload
    from fastload import transforms as T
    from fastload.datasets.images import default_loader

    root = sys.argv[1]
    fifo = os.path.join(root, "a", "x.jpg")

    def native():
        return T.Compose([T.Resize(8), T.CenterCrop(8), T.ToTensor()])

    def python(image):
        return np.ascontiguousarray(np.asarray(image)[:4, :4])

    def run(name, fn):
        print(name, flush=True)  # the last name printed is the case that hung
        try:
            out = {"result": fn()}
        except Exception as e:
            out = {"type": type(e).__name__, "oserror": isinstance(e, OSError), "text": str(e)}
        print(json.dumps([name, out]), flush=True)

    for workers in (0, 2):
        for kind, transform in (("native", native), ("python", lambda: python)):
            def raise_(kind=kind, transform=transform, workers=workers):
                ds = fastload.ImageFolder(root, transform=transform())
                list(fastload.DataLoader(ds, batch_size=len(ds), num_workers=workers,
                                         output="numpy"))

            def skip(kind=kind, transform=transform, workers=workers):
                ds = fastload.ImageFolder(root, transform=transform(), on_error="skip")
                (x, y), = list(fastload.DataLoader(ds, batch_size=len(ds),
                                                   num_workers=workers, output="numpy"))
                return {"labels": y.tolist(), "n": len(x),
                        "skipped": [list(s) for s in ds.skipped]}

            run(f"raise-{kind}-{workers}", raise_)
            run(f"skip-{kind}-{workers}", skip)
    run("default_loader", lambda: default_loader(fifo))
    run("folder_default_loader",
        lambda: fastload.ImageFolder(root, loader=default_loader)[1])
    print("done", flush=True)
""")


@pytest.fixture(scope="module")
def fifo_results(tmp_path_factory):
    root = tmp_path_factory.mktemp("fifo")
    write_jpeg(root / "a" / "good.jpg", 10)
    os.mkfifo(root / "a" / "x.jpg")
    write_jpeg(root / "a" / "z.jpg", 20)
    write_jpeg(root / "b" / "good.jpg", 30)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests")]))
    try:
        result = subprocess.run([sys.executable, "-c", FIFO_SCRIPT, str(root)], env=env,
                                capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        last = out.strip().splitlines()[-1:] or ["(nothing)"]
        pytest.fail(f"reading a FIFO named x.jpg blocked; last case started: {last[0]}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.rstrip().endswith("done"), result.stdout
    cases = dict(json.loads(line) for line in result.stdout.splitlines()
                 if line.startswith("["))
    return str(root / "a" / "x.jpg"), cases


@pytest.mark.parametrize("kind", ["native", "python"])
@pytest.mark.parametrize("workers", [0, 2])
def test_fifo_is_refused_at_once_naming_it(fifo_results, kind, workers):
    fifo, cases = fifo_results
    out = cases[f"raise-{kind}-{workers}"]
    assert out.get("oserror"), out
    assert "not a regular file (a FIFO)" in out["text"]
    assert fifo in out["text"] and "sample index 1" in out["text"]


@pytest.mark.parametrize("kind", ["native", "python"])
@pytest.mark.parametrize("workers", [0, 2])
def test_fifo_is_skipped_and_recorded(fifo_results, kind, workers):
    fifo, cases = fifo_results
    out = cases[f"skip-{kind}-{workers}"]["result"]
    assert out["n"] == 4 and out["labels"] == [0, 0, 0, 1]  # index 1 filled from index 2
    (index, path, message), = out["skipped"]
    assert (index, path) == (1, fifo) and "not a regular file (a FIFO)" in message


# (The Pillow fallback decodes bytes the C source read, which refuses a FIFO
# itself: test_fifo_is_skipped_and_recorded.)
@pytest.mark.parametrize("case", ["default_loader", "folder_default_loader"])
def test_python_openers_refuse_a_fifo(fifo_results, case):
    fifo, cases = fifo_results
    out = cases[case]
    assert out.get("oserror") and "not a regular file (a FIFO)" in out["text"], out
    assert fifo in out["text"]


def test_directory_device_and_socket_are_refused(tmp_path):
    (tmp_path / "d.jpg").mkdir()
    sock_path = tmp_path / "s.jpg"
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(sock_path))
    try:
        paths = [str(tmp_path / "d.jpg"), os.devnull, str(sock_path)]
        kinds = ["a directory", "a character device", "a socket"]
        for transform in (T.Compose([T.Resize(8), T.CenterCrop(8), T.ToTensor()]), None):
            ds = fastload.ImageFiles(paths, transform=transform)
            for i, (path, kind) in enumerate(zip(paths, kinds)):
                error = IsADirectoryError if kind == "a directory" else OSError
                with pytest.raises(error, match=f"not a regular file \\({kind}\\) "
                                                f"\\(sample index {i}\\)") as info:
                    ds[i]
                assert path in str(info.value)
                with pytest.raises(error, match=f"not a regular file \\({kind}\\)"):
                    default_loader(path)
    finally:
        sock.close()


# ------------------------------------------------------------ symlinks


def sample_paths(ds):
    return [os.path.relpath(p, ds.root) for p, _ in ds.samples]


def test_symlink_loop_lists_each_file_once(tmp_path):
    write_jpeg(tmp_path / "a" / "x.jpg", 1)
    write_jpeg(tmp_path / "a" / "sub" / "y.jpg", 2)
    os.symlink(tmp_path / "a", tmp_path / "a" / "sub" / "loop")  # a/sub/loop -> a
    write_jpeg(tmp_path / "b" / "z.jpg", 3)
    os.symlink(".", tmp_path / "b" / "self")  # b/self -> b, relative
    # (one loop a class: two would make the unchecked walk exponential,
    # a hang instead of a failure should the check ever go)
    ds = fastload.ImageFolder(tmp_path)
    assert sample_paths(ds) == ["a/x.jpg", "a/sub/y.jpg", "b/z.jpg"]
    assert ds.targets == [0, 0, 1]


def test_folder_reached_twice_is_walked_once(tmp_path):
    root = tmp_path / "root"
    write_jpeg(tmp_path / "shared" / "s.jpg", 1)
    write_jpeg(tmp_path / "other" / "o.jpg", 2)
    write_jpeg(root / "a" / "x.jpg", 3)
    os.symlink(tmp_path / "shared", root / "a" / "l2")
    os.symlink(tmp_path / "shared", root / "a" / "l1")
    os.symlink(tmp_path / "other", root / "a" / "m")  # a link reached once is followed
    ds = fastload.ImageFolder(root)
    # the first path in sorted order is kept
    assert sample_paths(ds) == ["a/x.jpg", "a/l1/s.jpg", "a/m/o.jpg"]


# -------------------------------------------------------------- loader=


def test_signature_follows_torchvision():
    params = list(inspect.signature(fastload.ImageFolder).parameters.values())
    assert [p.name for p in params[:6]] == ["root", "transform", "target_transform", "loader",
                                            "is_valid_file", "allow_empty"]
    assert all(p.kind is p.KEYWORD_ONLY for p in params[6:])


@pytest.fixture
def small_folder(tmp_path):
    for i, rel in enumerate(["a/1.jpg", "a/2.jpg", "b/3.jpg", "b/4.jpg", "b/5.jpg"]):
        write_jpeg(tmp_path / rel, 40 * i)
    return tmp_path


class RecordingLoader:
    """A loader returning a small array derived from the path's name."""

    def __init__(self, fail=None):
        self.calls = []
        self.fail = fail

    def __call__(self, path):
        self.calls.append(path)
        if self.fail and path.endswith(self.fail):
            raise ValueError("unreadable header")
        n = int(os.path.basename(path).split(".")[0])
        return np.full((2, 3), n, np.int64)


@pytest.mark.parametrize("workers,mode", [(0, "auto"), (2, "thread"), (2, "process")])
def test_custom_loader_feeds_transform_and_collate(small_folder, workers, mode):
    loader = RecordingLoader()
    ds = fastload.ImageFolder(small_folder, transform=lambda a: a * 10,
                              target_transform=lambda t: t + 100, loader=loader)
    assert ds.loader is loader and ds._native_source() is None
    batches = list(fastload.DataLoader(ds, batch_size=2, num_workers=workers, output="numpy",
                                       worker_mode=mode))
    x = np.concatenate([b[0] for b in batches])
    y = np.concatenate([b[1] for b in batches])
    assert [b[0].shape for b in batches] == [(2, 2, 3), (2, 2, 3), (1, 2, 3)]
    np.testing.assert_array_equal(x, np.arange(1, 6)[:, None, None] * 10 * np.ones((1, 2, 3)))
    assert y.tolist() == [100, 100, 101, 101, 101]
    if mode != "process":  # a worker process calls its own copy of the loader
        assert sorted(loader.calls) == sorted(p for p, _ in ds.samples)


def test_positional_loader_and_fastload_transform(small_folder):
    """A custom loader's PIL image goes through a fastload Compose in Python."""
    calls = []

    def pil(path):
        calls.append(path)
        with Image.open(path) as img:
            return img.convert("RGB").resize((4, 4))

    tf = T.Compose([T.CenterCrop(2), T.PILToTensor()])
    ds = fastload.ImageFolder(small_folder, tf, None, pil)
    assert ds._native_source() is None
    (x, y), = list(fastload.DataLoader(ds, batch_size=5, output="numpy"))
    assert x.shape == (5, 3, 2, 2) and x.dtype == np.uint8
    assert calls == [p for p, _ in ds.samples]


def test_default_loader_uses_the_c_decoder_only_where_it_cannot_be_told_apart(small_folder):
    tf = T.Compose([T.Resize(4), T.CenterCrop(4), T.ToTensor()])
    native = fastload.ImageFolder(small_folder, transform=tf)
    same = fastload.ImageFolder(small_folder, transform=tf, loader=default_loader)
    assert same._native_source() is not None
    a, = list(fastload.DataLoader(native, batch_size=5, output="numpy"))
    b, = list(fastload.DataLoader(same, batch_size=5, output="numpy"))
    np.testing.assert_array_equal(a[0], b[0])
    # a Python transform sees the loader's PIL image, as in torchvision
    seen = []
    ds = fastload.ImageFolder(small_folder, transform=lambda im: seen.append(im) or 0,
                              loader=default_loader)
    ds[0]
    assert isinstance(seen[0], Image.Image) and seen[0].mode == "RGB"
    with pytest.raises(TypeError, match="loader must be callable"):
        fastload.ImageFolder(small_folder, loader="pil")


@pytest.mark.parametrize("workers", [0, 2])
def test_loader_errors_name_the_file_and_index(small_folder, workers):
    ds = fastload.ImageFolder(small_folder, loader=RecordingLoader(fail="2.jpg"))
    with pytest.raises(ValueError, match="unreadable header") as info:
        list(fastload.DataLoader(ds, batch_size=5, num_workers=workers, output="numpy"))
    text = "".join(traceback.format_exception(info.type, info.value, info.tb))
    if sys.version_info >= (3, 11):  # the note; before 3.11 only the traceback shows it
        assert f"while loading sample index 1: {ds.samples[1][0]}" in text


@pytest.mark.parametrize("workers,mode", [(0, "auto"), (2, "thread"), (2, "process")])
def test_loader_errors_are_skipped_on_request(small_folder, workers, mode):
    ds = fastload.ImageFolder(small_folder, loader=RecordingLoader(fail="2.jpg"),
                              on_error="skip")
    # Worker processes report their skips to the loader's dataset object.
    (x, y), = list(fastload.DataLoader(ds, batch_size=5, num_workers=workers, output="numpy",
                                       worker_mode=mode))
    assert x[:, 0, 0].tolist() == [1, 3, 3, 4, 5] and y.tolist() == [0, 1, 1, 1, 1]
    (index, path, message), = ds.skipped
    assert (index, path) == (1, ds.samples[1][0]) and "unreadable header" in message
    assert ds.skipped_count == 1
