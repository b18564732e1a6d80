"""SquashFS images read as a file system without mounting: "image.sqfs:/inner"
paths for ImageFolder, ImageFiles and WebDataset shards, read by the C
workers (threads and forked processes) with libsquashfs; the same samples,
classes and batches as the tree on disk; every compressor mksquashfs and
libsquashfs share; damaged images and missing paths as exceptions naming the
image and the inner path."""

import concurrent.futures
import errno
import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest

import fastload
from fastload import transforms as T
from fastload.datasets import squashfs
from fl_helpers import fastload_only

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "benchmarks"))
import imagenet_like  # noqa: E402

pytestmark = [
    fastload_only,
    pytest.mark.skipif(shutil.which("mksquashfs") is None,
                       reason="mksquashfs (squashfs-tools) is not installed"),
]
needs_support = pytest.mark.skipif(not squashfs.available(),
                                   reason="fastload was built without SquashFS support")

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


def mksquashfs(source, image, comp="zstd", *extra):
    """Makes `image` from the folder `source`; None when this mksquashfs
    lacks the compressor (its message says why)."""
    done = subprocess.run(["mksquashfs", str(source), str(image), "-comp", comp, "-noappend",
                           "-quiet", "-no-progress", "-processors", "1", *extra],
                          capture_output=True, text=True)
    if done.returncode != 0:
        return done.stderr.strip() or done.stdout.strip() or f"exit {done.returncode}"
    return None


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("tree")
    imagenet_like.make_image_folder(str(root / "train"), n_images=36, n_classes=3, processes=1)
    os.remove(root / "train" / "imagenet_like.json")
    # A nested folder and a file of another extension, as torchvision walks them.
    first = sorted((root / "train" / "class_01").glob("*.jpg"))[0]
    nested = root / "train" / "class_01" / "deeper"
    nested.mkdir()
    shutil.copy(first, nested / "z.jpg")
    (root / "train" / "class_02" / "notes.txt").write_text("not an image")
    return root


@pytest.fixture(scope="module")
def image(tree, tmp_path_factory):
    path = tmp_path_factory.mktemp("image") / "data.sqfs"
    failed = mksquashfs(tree, path)
    if failed:
        pytest.skip(f"mksquashfs -comp zstd failed: {failed}")
    return str(path)


def train_transform():
    return T.Compose([T.RandomResizedCrop(32), T.RandomHorizontalFlip(), T.ToTensor(),
                      T.Normalize(MEAN, STD)])


def batches(ds, **kwargs):
    torch = pytest.importorskip("torch")
    loader = fastload.DataLoader(ds, batch_size=8, shuffle=True, output="numpy",
                                 generator=torch.Generator().manual_seed(7), **kwargs)
    return [(np.array(x), np.array(y)) for x, y in loader]


def assert_same_batches(a, b):
    assert len(a) == len(b)
    for (x, y), (rx, ry) in zip(a, b):
        np.testing.assert_array_equal(x, rx)
        np.testing.assert_array_equal(y, ry)


# --------------------------------------------------------------- paths


def test_split_needs_an_image(tree, image, tmp_path):
    assert squashfs.split(image + ":/train") == (image, "/train")
    assert squashfs.split(os.fsencode(image + ":/train")) == (image, "/train")
    assert squashfs.split(str(tree / "train")) is None
    # A folder whose name ends in ':' stays an ordinary path, as does a
    # regular file that is not an image.
    folder = tmp_path / "run:"
    folder.mkdir()
    (folder / "a.txt").write_text("x")
    assert squashfs.split(str(tmp_path / "run:/a.txt")) is None
    plain = tmp_path / "plain"
    plain.write_bytes(b"hsq not an image")
    assert squashfs.split(str(plain) + ":/a") is None


def test_ordinary_path_with_colon_reads_from_disk(tree, tmp_path):
    folder = tmp_path / "run:"
    folder.mkdir()
    first = sorted((tree / "train" / "class_00").iterdir())[0]
    shutil.copy(first, folder / "a.jpg")
    on_disk = fastload.ImageFiles([str(first)])[0][0]
    np.testing.assert_array_equal(fastload.ImageFiles([str(folder / "a.jpg")])[0][0], on_disk)


@needs_support
def test_stat_listdir_read(tree, image):
    names = dict(squashfs.listdir(image + ":/train"))
    assert names == {"class_00": squashfs.DIR, "class_01": squashfs.DIR,
                     "class_02": squashfs.DIR}
    inner = sorted(os.listdir(tree / "train" / "class_00"))[0]
    disk = tree / "train" / "class_00" / inner
    st = squashfs.stat(f"{image}:/train/class_00/{inner}")
    assert st.st_size == disk.stat().st_size
    assert st.st_mtime == int(disk.stat().st_mtime)
    assert squashfs.read(f"{image}:/train/class_00/{inner}") == disk.read_bytes()
    assert squashfs.read(f"{image}:/train/class_00/{inner}", 10, 20) == disk.read_bytes()[10:30]
    assert squashfs.stat(image + ":/train").kind == squashfs.DIR


# ---------------------------------------------------------- ImageFolder


@needs_support
def test_image_folder_equals_disk(tree, image):
    disk = fastload.ImageFolder(str(tree / "train"), transform=train_transform())
    inside = fastload.ImageFolder(image + ":/train", transform=train_transform())
    assert inside.classes == disk.classes
    assert inside.class_to_idx == disk.class_to_idx
    prefix = str(tree / "train")
    assert [(p.replace(image + ":/train", prefix, 1), y) for p, y in inside.samples] == \
        list(disk.samples)
    assert any("deeper" in p for p, _ in inside.samples)
    assert_same_batches(batches(inside, num_workers=2, worker_mode="thread"),
                        batches(disk, num_workers=2, worker_mode="thread"))


@needs_support
def test_image_folder_at_the_image_root(tree, tmp_path):
    path = tmp_path / "root.sqfs"
    assert mksquashfs(tree / "train", path) is None
    inside = fastload.ImageFolder(f"{path}:/")
    disk = fastload.ImageFolder(str(tree / "train"))
    assert inside.classes == disk.classes
    assert len(inside) == len(disk)
    np.testing.assert_array_equal(inside[5][0], disk[5][0])


@needs_support
def test_process_workers_fork(tree, image):
    disk = fastload.ImageFolder(str(tree / "train"), transform=train_transform())
    inside = fastload.ImageFolder(image + ":/train", transform=train_transform())
    # The parent opens the image before the fork: the children read on
    # through the registry they inherit.
    inside[0]
    assert_same_batches(
        batches(inside, num_workers=2, worker_mode="process", multiprocessing_context="fork"),
        batches(disk, num_workers=2, worker_mode="thread"))


@needs_support
def test_image_files_and_python_loader(tree, image):
    files = sorted((tree / "train" / "class_00").glob("*.jpg"))
    inner = [f"{image}:/train/class_00/{f.name}" for f in files]
    disk = fastload.ImageFiles([str(f) for f in files], labels=list(range(len(files))))
    inside = fastload.ImageFiles(inner, labels=list(range(len(files))))
    for i in range(len(files)):
        np.testing.assert_array_equal(inside[i][0], disk[i][0])
        assert inside[i][1] == i
    # A Python loader opens the file through the same paths.
    from fastload.datasets.images import default_loader

    pil = fastload.ImageFiles(inner[:2], loader=default_loader)
    np.testing.assert_array_equal(np.asarray(pil[0][0]),
                                  np.asarray(default_loader(str(files[0]))))


@needs_support
def test_many_threads_read_at_once(tree, image):
    files = sorted((tree / "train").rglob("*.jpg"))
    want = {f: f.read_bytes() for f in files}

    def read(f):
        rel = f.relative_to(tree)
        return squashfs.read(f"{image}:/{rel}")

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        for _ in range(3):
            for f, got in zip(files, pool.map(read, files)):
                assert got == want[f]


# -------------------------------------------------------------- shards


@needs_support
def test_webdataset_shards_inside_an_image(tree, tmp_path, monkeypatch):
    import fastload.datasets.webdataset
    from fastload.datasets import shard_index
    from fastload.datasets.shard_writer import write_shards

    monkeypatch.setenv("FASTLOAD_INDEX_DIR", str(tmp_path / "index-cache"))
    folder = fastload.ImageFolder(str(tree / "train"))
    samples = [(pathlib.Path(p).read_bytes(), y) for p, y in folder.samples]
    shards_dir = tmp_path / "data" / "shards"
    shards_dir.mkdir(parents=True)
    paths = write_shards(samples, str(shards_dir / "shard-%06d.tar"), maxcount=15)
    # Index files made before the image, beside the shards, serve from inside
    # it; the last shard has none.
    for path in paths:
        fastload.datasets.webdataset.write_index(path)
    os.remove(paths[-1] + shard_index.SUFFIX)
    image = tmp_path / "shards.sqfs"
    assert mksquashfs(tmp_path / "data", image) is None
    inner = [f"{image}:/shards/{os.path.basename(p)}" for p in paths]

    disk = fastload.WebDataset(paths, transform=train_transform(), index_files=False)
    inside = fastload.WebDataset(inner, transform=train_transform())
    assert len(inside) == len(disk) == len(samples)
    assert [inside.key(i) for i in range(len(inside))] == \
        [disk.key(i) for i in range(len(disk))]
    assert_same_batches(batches(inside, num_workers=2, worker_mode="thread"),
                        batches(disk, num_workers=2, worker_mode="thread"))
    # The last shard's index file went to the cache folder (the image is
    # read-only) and serves the next construction; nothing was made beside
    # the image.
    cached = os.listdir(tmp_path / "index-cache")
    assert len(cached) == 1 and cached[0].endswith(os.path.basename(paths[-1]) +
                                                   shard_index.SUFFIX), cached
    assert shard_index.load(inner[0]).path == inner[0] + shard_index.SUFFIX
    assert shard_index.load(inner[-1]).path.startswith(str(tmp_path / "index-cache"))
    assert not os.path.exists(str(image) + ":")
    again = fastload.WebDataset(inner, transform=train_transform())
    assert_same_batches(batches(again), batches(disk))
    # Members by name, read from the image.
    with_fields = fastload.WebDataset(inner, fields=("cls",), index_files=False)
    assert int(with_fields[3][0]) == samples[3][1]


# --------------------------------------------------------- compressors


@needs_support
@pytest.mark.parametrize("comp", ["gzip", "xz", "lz4", "zstd"])
def test_each_compressor(tree, tmp_path, comp):
    path = tmp_path / f"{comp}.sqfs"
    failed = mksquashfs(tree, path, comp)
    if failed:
        pytest.skip(f"mksquashfs cannot write {comp} images here: {failed}")
    # Compressible text too, so that blocks are stored compressed.
    files = sorted((tree / "train").rglob("*"))
    try:
        squashfs.listdir(f"{path}:/train")
    except OSError as error:
        if error.errno == errno.ENOTSUP:
            pytest.skip(f"libsquashfs cannot read {comp} images: {error}")
        raise
    for f in files:
        if f.is_file():
            assert squashfs.read(f"{path}:/{f.relative_to(tree)}") == f.read_bytes()
    inside = fastload.ImageFolder(f"{path}:/train")
    disk = fastload.ImageFolder(str(tree / "train"))
    np.testing.assert_array_equal(inside[1][0], disk[1][0])


# ------------------------------------------------------------- damage


@pytest.fixture
def text_image(tmp_path):
    """A gzip image of one compressible file (its blocks stored compressed,
    each checked by zlib's adler32) and a folder."""
    src = tmp_path / "src"
    (src / "dir").mkdir(parents=True)
    (src / "big.txt").write_bytes(b"".join(b"line %06d of text\n" % i for i in range(40000)))
    (src / "dir" / "small.txt").write_bytes(b"small")
    path = tmp_path / "text.sqfs"
    failed = mksquashfs(src, path, "gzip")
    if failed:
        pytest.skip(f"mksquashfs -comp gzip failed: {failed}")
    return path, src


def assert_names_both(error, image, inner):
    text = str(error)
    assert str(image) in text and inner in text, text


@needs_support
def test_missing_inner_path(text_image):
    path, _ = text_image
    with pytest.raises(FileNotFoundError) as caught:
        squashfs.read(f"{path}:/dir/nothing.txt")
    assert_names_both(caught.value, path, "/dir/nothing.txt")
    with pytest.raises(FileNotFoundError) as caught:
        fastload.ImageFiles([f"{path}:/dir/nothing.jpg"])[0]
    assert_names_both(caught.value, path, "/dir/nothing.jpg")
    with pytest.raises(FileNotFoundError) as caught:
        squashfs.read(f"{path}:/nodir/small.txt")
    assert_names_both(caught.value, path, "/nodir/small.txt")
    with pytest.raises(NotADirectoryError):
        squashfs.read(f"{path}:/big.txt/small.txt")
    # The folder found before is remembered: a second lookup agrees.
    assert squashfs.read(f"{path}:/dir/small.txt") == b"small"
    assert squashfs.read(f"{path}:/dir/small.txt") == b"small"
    with pytest.raises(IsADirectoryError):
        squashfs.read(f"{path}:/dir")
    with pytest.raises(NotADirectoryError):
        squashfs.listdir(f"{path}:/big.txt")


@needs_support
def test_bad_compressed_block(text_image, tmp_path):
    path, src = text_image
    data = bytearray(path.read_bytes())
    # The file's first data block follows the 96-byte superblock (and the
    # compressor options, when any): garble a stretch of it.
    data[400:900] = bytes((b * 7 + 3) & 0xFF for b in range(500))
    damaged = tmp_path / "damaged.sqfs"
    damaged.write_bytes(bytes(data))
    with pytest.raises(OSError) as caught:
        squashfs.read(f"{damaged}:/big.txt")
    assert caught.value.errno == errno.EIO
    assert_names_both(caught.value, damaged, "/big.txt")
    assert "damaged" in str(caught.value)
    # The C workers report it as well, naming both.
    with pytest.raises(OSError) as caught:
        fastload.ImageFiles([f"{damaged}:/big.txt"])[0]
    assert_names_both(caught.value, damaged, "/big.txt")


@needs_support
def test_truncated_image(text_image, tmp_path):
    path, _ = text_image
    data = path.read_bytes()
    cut = tmp_path / "cut.sqfs"
    cut.write_bytes(data[:len(data) // 2])
    with pytest.raises(OSError) as caught:
        squashfs.read(f"{cut}:/dir/small.txt")
    assert caught.value.errno == errno.EIO
    assert "truncated" in str(caught.value) and str(cut) in str(caught.value)
    with pytest.raises(OSError) as caught:
        fastload.ImageFolder(f"{cut}:/")
    assert str(cut) in str(caught.value)
    tiny = tmp_path / "tiny.sqfs"
    tiny.write_bytes(data[:40])
    with pytest.raises(OSError) as caught:
        squashfs.read(f"{tiny}:/dir/small.txt")
    assert "truncated" in str(caught.value)


@needs_support
def test_bad_superblock(text_image, tmp_path):
    path, _ = text_image
    data = bytearray(path.read_bytes())
    data[28:30] = b"\x07\x00"  # version_major 7
    bad = tmp_path / "bad.sqfs"
    bad.write_bytes(bytes(data))
    with pytest.raises(OSError) as caught:
        squashfs.read(f"{bad}:/dir/small.txt")
    assert "superblock" in str(caught.value) and str(bad) in str(caught.value)
    data = bytearray(path.read_bytes())
    data[12:16] = (3).to_bytes(4, "little")  # block size 3: not a power of two in range
    bad.write_bytes(bytes(data))
    with pytest.raises(OSError) as caught:
        squashfs.stat(f"{bad}:/dir/small.txt")
    assert str(bad) in str(caught.value)


# ----------------------------------------------------------- reporting


def test_python_m_fastload_reports_squashfs():
    out = subprocess.run([sys.executable, "-m", "fastload"], capture_output=True, text=True,
                         check=True).stdout
    line = next(line for line in out.splitlines() if line.startswith("SquashFS images:"))
    assert ("supported (libsquashfs)" in line) == squashfs.available()


@pytest.mark.skipif(squashfs.available(), reason="built with SquashFS support")
def test_without_support_the_error_says_so(image):
    with pytest.raises(OSError, match="built without SquashFS support"):
        squashfs.read(image + ":/train")


# --------------------------------------------------------------- the wheel

_PARENT = pathlib.Path(fastload.__file__).resolve().parent.parent
_BUNDLED = _PARENT / "fastload.libs"


@pytest.mark.skipif(not (_BUNDLED.is_dir() and any(p.name.startswith("libjpeg")
                                                   for p in _BUNDLED.iterdir())),
                    reason="fastload is not running from a repaired wheel (no fastload.libs/)")
def test_the_wheel_carries_libsquashfs_and_its_licence():
    assert squashfs.available()
    assert any(p.name.startswith("libsquashfs") for p in _BUNDLED.iterdir())
    licences = [p for info in _PARENT.glob("fastload_torch-*.dist-info")
                for p in (info / "licenses").glob("*")]
    names = {p.name for p in licences}
    assert {"libsquashfs1-copyright", "LGPL-3", "GPL-3"} <= names, names
    assert "GNU LESSER GENERAL PUBLIC LICENSE" in next(
        p for p in licences if p.name == "LGPL-3").read_text()
