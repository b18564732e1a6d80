"""fastload.write_shards and shards_from_image_folder: WebDataset tar shards
that the real webdataset package reads back as written, the same bytes on
every run, split by count and size, and clear errors for what cannot be
written."""

import gc
import io
import os
import pathlib
import subprocess
import sys
import tarfile
import textwrap
import warnings

import numpy as np
import pytest

pytest.importorskip("PIL")
from PIL import Image  # noqa: E402

import fastload  # noqa: E402
from fastload import shards_from_image_folder, write_shards  # noqa: E402
from fl_helpers import fastload_only  # noqa: E402

pytestmark = fastload_only


@pytest.fixture
def wds():
    return pytest.importorskip("webdataset")


def read_with_webdataset(wds, paths, *decode):
    """Samples as ``webdataset.WebDataset(paths).decode(*decode)`` yields them."""
    with warnings.catch_warnings():
        # webdataset 1.0.2 leaves each shard's file to the garbage collector;
        # collect it here, where its ResourceWarning is ignored.
        warnings.simplefilter("ignore", ResourceWarning)
        pipeline = wds.WebDataset([str(p) for p in paths], shardshuffle=False)
        if decode:
            pipeline = pipeline.decode(*decode)
        samples = list(pipeline)
        del pipeline
        gc.collect()
    return samples


def members(path):
    with tarfile.open(path) as tar:
        return tar.getmembers()


def pixels(shape, seed):
    return np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)


def encoded(array, fmt, **options):
    stream = io.BytesIO()
    Image.fromarray(array).save(stream, format=fmt, **options)
    return stream.getvalue()


def smooth(height, width):
    """An RGB image that JPEG keeps close to its pixels (unlike noise)."""
    y, x = np.mgrid[0:height, 0:width]
    return np.stack([x * 255 // width, y * 255 // height, (x + y) * 255 // (width + height)],
                    axis=2).astype(np.uint8)


def decoded(data):
    with Image.open(io.BytesIO(data)) as image:
        return np.asarray(image)


def mixed_samples(n):
    return [{
        "__key__": f"sample{i:04d}",
        "jpg": pixels((12 + i, 16, 3), i),
        "png": pixels((9, 7), 100 + i),
        "cls": i % 3,
        "json": {"index": i, "name": f"n{i}", "tags": [i, None, True]},
        "npy": np.arange(i * 6, dtype=np.float32).reshape(i, 6),
        "txt": f"caption {i} \u00e9",
        "pyd": {"tuple": (i, "x")},
        "bin": bytes([i]) * (i + 1),
    } for i in range(n)]


def leftovers(directory):
    """The files in `directory` but the shards' index files, each checked to
    stand beside its shard."""
    names = sorted(p.name for p in pathlib.Path(directory).iterdir())
    shards = [n for n in names if not n.endswith(".fastload-index")]
    indexes = [n for n in names if n.endswith(".fastload-index")]
    assert all(n[:-len(".fastload-index")] in shards for n in indexes), names
    return shards


# ------------------------------------------------------ interoperability

def test_bytes_are_webdataset_tarwriters(wds, tmp_path):
    """Same encoders, member order and header fields as webdataset's TarWriter
    given a fixed mtime: the two shards are the same bytes."""
    samples = mixed_samples(5)
    [path] = write_shards(samples, str(tmp_path / "ours-%02d.tar"))
    theirs = tmp_path / "theirs.tar"
    with wds.TarWriter(str(theirs), mtime=0) as writer:
        for sample in samples:
            writer.write(sample)
    assert pathlib.Path(path).read_bytes() == theirs.read_bytes()


def test_webdataset_reads_what_was_written(wds, tmp_path):
    samples = mixed_samples(7)
    paths = write_shards(samples, str(tmp_path / "s-%06d.tar"), maxcount=3)
    assert [os.path.basename(p) for p in paths] == ["s-000000.tar", "s-000001.tar",
                                                      "s-000002.tar"]
    out = read_with_webdataset(wds, paths, "rgb8")
    assert [s["__key__"] for s in out] == [s["__key__"] for s in samples]
    for got, sample in zip(out, samples):
        assert {k for k in got if not k.startswith("__")} == \
            {k for k in sample if not k.startswith("__")}
        assert got["cls"] == sample["cls"]
        assert got["json"] == sample["json"]
        assert got["txt"] == sample["txt"]
        assert got["pyd"] == sample["pyd"]
        assert got["bin"] == sample["bin"]
        np.testing.assert_array_equal(got["npy"], sample["npy"])
        assert got["npy"].dtype == np.float32
        # PNG is lossless: the grey pixels come back (as rgb8, three equal channels).
        np.testing.assert_array_equal(got["png"], np.repeat(sample["png"][..., None], 3, 2))
        # JPEG as webdataset encodes it: quality 100.
        np.testing.assert_array_equal(got["jpg"],
                                      decoded(encoded(sample["jpg"], "JPEG", quality=100)))


def test_more_encoders_round_trip(wds, tmp_path):
    torch = pytest.importorskip("torch")
    sample = {
        "__key__": "k",
        "json.gz": {"compressed": True},
        "npz": {"a": np.arange(5, dtype=np.int16), "b": np.eye(2)},
        "pth": torch.arange(4),
        "cls": torch.tensor(7),           # webdataset would write "tensor(7)"
        "index": np.int64(12),
        "ppm": pixels((5, 6, 3), 1),
        "tiff": pixels((5, 6, 3), 2),
        "webp": pixels((5, 6, 3), 3),     # lossless unless quality is given
        "float.png": np.linspace(0, 1, 12).reshape(3, 4),
        "output.png": Image.fromarray(pixels((4, 4, 3), 4)),
    }
    paths = write_shards([sample], str(tmp_path / "x-%d.tar"))
    with warnings.catch_warnings():
        # torch.load inside webdataset's pth decoder; the value is what matters here
        warnings.simplefilter("ignore", FutureWarning)
        [got] = read_with_webdataset(wds, paths, "rgb8")
    assert got["json.gz"] == {"compressed": True}
    np.testing.assert_array_equal(got["npz"]["a"], sample["npz"]["a"])
    np.testing.assert_array_equal(got["npz"]["b"], sample["npz"]["b"])
    assert torch.equal(got["pth"], sample["pth"])
    assert got["cls"] == 7 and got["index"] == 12
    for field in ("ppm", "tiff", "webp"):
        np.testing.assert_array_equal(got[field], sample[field])
    expected = np.array(np.linspace(0, 1, 12).reshape(3, 4) * 255.0, np.uint8)
    np.testing.assert_array_equal(got["float.png"][..., 0], expected)
    np.testing.assert_array_equal(got["output.png"], np.asarray(sample["output.png"]))


def test_pairs_and_map_style_datasets(wds, tmp_path):
    jpeg = encoded(pixels((8, 8, 3), 0), "JPEG", quality=90)

    class MapStyle:  # as torch's Dataset: __len__ and __getitem__, no __iter__
        def __len__(self):
            return 3

        def __getitem__(self, i):
            return [(jpeg, np.int64(2)), (Image.fromarray(pixels((4, 5, 3), 1)), 0),
                    (pixels((6, 6), 2), 1)][i]

    paths = write_shards(MapStyle(), str(tmp_path / "p-%d.tar"))
    out = read_with_webdataset(wds, paths)
    assert [s["__key__"] for s in out] == ["000000000", "000000001", "000000002"]
    assert [sorted(k for k in s if not k.startswith("__")) for s in out] == \
        [["cls", "jpg"], ["cls", "png"], ["cls", "png"]]
    assert out[0]["jpg"] == jpeg          # encoded bytes copied as they are
    assert [int(s["cls"]) for s in out] == [2, 0, 1]

    paths = write_shards(iter([(pixels((4, 4, 3), 3), 5)]), str(tmp_path / "q-%d.tar"),
                         image_ext="jpg")
    assert [m.name for m in members(paths[0])] == ["000000000.cls", "000000000.jpg"]


# ------------------------------------------------------ the tar files

def test_same_samples_same_bytes(tmp_path):
    samples = mixed_samples(6)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = write_shards(samples, str(tmp_path / "a" / "s-%d.tar"), maxcount=4)
    second = write_shards(samples, str(tmp_path / "b" / "s-%d.tar"), maxcount=4)
    assert len(first) == len(second) == 2
    for a, b in zip(first, second):
        assert pathlib.Path(a).read_bytes() == pathlib.Path(b).read_bytes()
    for m in members(first[0]):
        assert (m.mtime, m.uid, m.gid, m.uname, m.gname, m.mode) == \
            (0, 0, 0, "bigdata", "bigdata", 0o444)
        assert m.isfile()


def test_member_order_is_sorted_fields_per_sample(tmp_path):
    [path] = write_shards([{"__key__": "b", "txt": "t", "cls": 1, "a.png": b"x"},
                           {"__key__": "a", "json": [], "cls": 2}], str(tmp_path / "o.tar"))
    assert [m.name for m in members(path)] == ["b.a.png", "b.cls", "b.txt", "a.cls", "a.json"]


def test_maxcount_splits_and_start_shard(tmp_path):
    samples = [{"cls": i} for i in range(10)]
    paths = write_shards(samples, str(tmp_path / "c-%03d.tar"), maxcount=4, start_shard=7)
    assert [os.path.basename(p) for p in paths] == ["c-007.tar", "c-008.tar", "c-009.tar"]
    names = [[m.name for m in members(p)] for p in paths]
    assert [len(n) for n in names] == [4, 4, 2]
    assert sum(names, []) == [f"{i:09d}.cls" for i in range(10)]
    assert leftovers(tmp_path) == ["c-007.tar", "c-008.tar", "c-009.tar"]


def test_maxsize_bounds_each_shard_file(tmp_path):
    payload = [{"bin": bytes([i]) * 3000} for i in range(12)]
    maxsize = 4 * tarfile.RECORDSIZE
    paths = write_shards(payload, str(tmp_path / "z-%d.tar"), maxsize=maxsize)
    assert len(paths) > 1
    sizes = [os.path.getsize(p) for p in paths]
    assert all(size <= maxsize for size in sizes)
    # Each shard is as full as the bound allows: the next sample would not fit.
    per_sample = tarfile.BLOCKSIZE + 3072
    for size, path in zip(sizes[:-1], paths):
        count = len(members(path))
        end = (count + 1) * per_sample + 2 * tarfile.BLOCKSIZE
        assert -(-end // tarfile.RECORDSIZE) * tarfile.RECORDSIZE > maxsize
    got = [m.name for p in paths for m in members(p)]
    assert got == [f"{i:09d}.bin" for i in range(12)]
    # A sample larger than maxsize alone gets a shard of its own.
    paths = write_shards([{"bin": b"x"}, {"bin": b"y" * 50_000}, {"bin": b"z"}],
                         str(tmp_path / "big-%d.tar"), maxsize=maxsize)
    assert [len(members(p)) for p in paths] == [1, 1, 1]


def test_pattern_without_field(tmp_path):
    [path] = write_shards([{"cls": 1}, {"cls": 2}], str(tmp_path / "one.tar"))
    assert path == str(tmp_path / "one.tar")
    with pytest.raises(ValueError, match=r"more than one shard.*no field for the shard number"):
        write_shards([{"cls": 1}, {"cls": 2}], str(tmp_path / "two.tar"), maxcount=1)
    assert leftovers(tmp_path) == ["one.tar"]  # nothing under the name, no temporary file
    with pytest.raises(ValueError, match="one printf field"):
        write_shards([{"cls": 1}], str(tmp_path / "%d-%d.tar"))


def test_error_midway_keeps_complete_shards_only(tmp_path):
    def samples():
        for i in range(5):
            yield {"cls": i}
        raise RuntimeError("source failed")

    with pytest.raises(RuntimeError, match="source failed"):
        write_shards(samples(), str(tmp_path / "e-%d.tar"), maxcount=2)
    # Shards 0 and 1 were complete; shard 2 held one sample when the source failed.
    assert leftovers(tmp_path) == ["e-0.tar", "e-1.tar"]
    assert [len(members(tmp_path / n)) for n in leftovers(tmp_path)] == [2, 2]


KILLED_WRITER = textwrap.dedent("""
    import os, signal, sys
    from fastload import write_shards

    def samples():
        for i in range(5):
            yield {"bin": b"x" * 1000}
        os.kill(os.getpid(), signal.SIGKILL)  # dies with shard 2 half written

    write_shards(samples(), os.path.join(sys.argv[1], "k-%d.tar"), maxcount=2)
""")


def test_killed_writer_leaves_no_partial_shard(tmp_path):
    root = pathlib.Path(__file__).resolve().parent.parent
    run = subprocess.run([sys.executable, "-c", KILLED_WRITER, str(tmp_path)], cwd=root,
                         capture_output=True, timeout=120)
    assert run.returncode == -9, run.stderr
    names = leftovers(tmp_path)
    assert [n for n in names if not n.startswith(".")] == ["k-0.tar", "k-1.tar"]
    assert [len(members(tmp_path / n)) for n in ("k-0.tar", "k-1.tar")] == [2, 2]
    [temporary] = [n for n in names if n.startswith(".")]
    assert temporary.startswith(".k-2.tar.") and temporary.endswith(".tmp")


def test_verbose_reports_each_shard(tmp_path, capsys):
    paths = write_shards([{"cls": i} for i in range(3)], str(tmp_path / "v-%d.tar"),
                         maxcount=2, verbose=True)
    assert capsys.readouterr().out.splitlines() == [
        f"fastload: wrote {paths[0]} (2 samples)", f"fastload: wrote {paths[1]} (1 sample)"]


def test_no_samples_no_shards(tmp_path):
    assert write_shards([], str(tmp_path / "n-%d.tar")) == []
    assert leftovers(tmp_path) == []


# ------------------------------------------------------ bad input

@pytest.mark.parametrize("sample, error, message", [
    ({"__key__": "a.b", "cls": 1}, ValueError, r"sample 1 .*key 'a\.b'.* contains '\.'"),
    ({"__key__": "", "cls": 1}, ValueError, "not a valid member name"),
    ({"__key__": 5, "cls": 1}, TypeError, "__key__ must be a str"),
    ({"__key__": "k", "jpg": object()}, TypeError,
     r"sample 1 \(key 'k'\): field 'jpg': expected encoded bytes, a PIL image"),
    ({"__key__": "k", "xyz": {1, 2}}, TypeError, r"field 'xyz': no encoder for extension 'xyz'"),
    ({"__key__": "k", "json": np.zeros(2)}, TypeError, r"field 'json': .*not JSON serializable"),
    ({"__key__": "k", "png": np.zeros((4, 4)) + 2.0}, ValueError, r"must lie in \[0, 1\]"),
    ({"__key__": "k", "png": np.zeros((2, 2, 2), np.uint8)}, ValueError, "1, 3 or 4 channels"),
    ({"__key__": "k", "a/b": b""}, ValueError, "not a valid file extension"),
    ({"__key__": "k", ".jpg": b""}, ValueError, "not a valid file extension"),
    ({"__key__": "k", "jpg": b"", "JPG": b""}, ValueError, "differ only in case"),
    ({"__key__": "k"}, ValueError, "no fields"),
    ({"__key__": "k" * 300, "cls": 1}, ValueError, "does not fit a USTAR header"),
    ((b"not an image", 1), ValueError, "not JPEG, PNG"),
    ((np.zeros((2, 2), np.uint8), 1.5), TypeError, "integer class index"),
    ((1, 2, 3), TypeError, "dict or an .image, label. pair"),
])
def test_bad_samples_raise_clearly(tmp_path, sample, error, message):
    good = {"__key__": "first", "cls": 0}
    with pytest.raises(error, match=message):
        write_shards([good, sample], str(tmp_path / "b-%d.tar"))
    assert leftovers(tmp_path) == []


def test_torch_tensor_is_not_an_image(tmp_path):
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError, match=r"sample 0 .*a torch tensor is not an image.*'npy'"):
        write_shards([(torch.zeros(3, 4, 4), 1)], str(tmp_path / "t-%d.tar"))


def test_repeated_key_is_refused(tmp_path):
    with pytest.raises(ValueError, match="sample 1: key 'same' repeats"):
        write_shards([{"__key__": "same", "cls": 0}, {"__key__": "same", "cls": 1}],
                     str(tmp_path / "r-%d.tar"))


def test_bad_arguments(tmp_path):
    target = str(tmp_path / "a-%d.tar")
    for kwargs, message in [({"maxcount": 0}, "maxcount"), ({"maxsize": -1}, "maxsize"),
                            ({"image_max_side": 0}, "image_max_side"),
                            ({"quality": 101}, "quality"), ({"image_ext": "gif"}, "image_ext"),
                            ({"start_shard": -1}, "start_shard")]:
        with pytest.raises(ValueError, match=message):
            write_shards([{"cls": 1}], target, **kwargs)
    with pytest.raises(TypeError, match="single dict"):
        write_shards({"cls": 1}, target)
    with pytest.raises(TypeError, match="iterable or a map-style dataset"):
        write_shards(3, target)


def test_missing_folders_are_created(tmp_path):
    # As writers do (webdataset's ShardWriter opens its files only; a user
    # writing "shards/train-%06d.tar" expects the folder to appear).
    paths = write_shards([{"cls": i} for i in range(3)],
                         str(tmp_path / "new" / "deeper" / "train-%06d.tar"), maxcount=2)
    assert paths == [str(tmp_path / "new" / "deeper" / f"train-{n:06d}.tar") for n in (0, 1)]
    assert [len(members(p)) for p in paths] == [2, 1]
    assert leftovers(tmp_path / "new" / "deeper") == ["train-000000.tar", "train-000001.tar"]
    # A pattern that puts each shard in a folder of its own.
    paths = write_shards([{"cls": i} for i in range(2)], str(tmp_path / "per" / "%d" / "s.tar"),
                         maxcount=1)
    assert paths == [str(tmp_path / "per" / str(n) / "s.tar") for n in (0, 1)]


def test_unwritable_destination(tmp_path):
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(NotADirectoryError, match="cannot write shard"):
        write_shards([{"cls": 1}], str(tmp_path / "file" / "s-%d.tar"))
    with pytest.raises(NotADirectoryError, match=r"cannot write shard '.*file/sub/s-0\.tar'"):
        write_shards([{"cls": 1}], str(tmp_path / "file" / "sub" / "s-%d.tar"))
    (tmp_path / "dir-0.tar").mkdir()
    with pytest.raises(IsADirectoryError, match="is a directory"):
        write_shards([{"cls": 1}], str(tmp_path / "dir-%d.tar"))
    assert leftovers(tmp_path) == ["dir-0.tar", "file"]


# ------------------------------------------------------ resizing

def test_image_max_side_bounds_the_longer_side(tmp_path):
    big_jpeg = encoded(smooth(200, 300), "JPEG", quality=75)
    small_jpeg = encoded(pixels((40, 30, 3), 1), "JPEG", quality=75)
    tall_png = encoded(pixels((120, 50, 3), 2), "PNG")
    samples = [{"jpg": big_jpeg}, {"jpg": small_jpeg}, {"png": tall_png},
               {"png": pixels((90, 30), 3)}, {"bin": big_jpeg}]
    path = write_shards(samples, str(tmp_path / "r-%d.tar"), image_max_side=64)[0]
    with tarfile.open(path) as tar:
        data = [tar.extractfile(m).read() for m in tar.getmembers()]
    sizes = [Image.open(io.BytesIO(d)).size for d in data]
    assert sizes == [(64, 43), (30, 40), (27, 64), (21, 64), (300, 200)]
    assert data[1] == small_jpeg and data[4] == big_jpeg   # within bounds / not an image field
    # quality=None keeps the source JPEG's quantisation tables.
    assert Image.open(io.BytesIO(data[0])).quantization == \
        Image.open(io.BytesIO(big_jpeg)).quantization
    # The result is the LANCZOS resize of the decoded source.
    expected = Image.open(io.BytesIO(big_jpeg)).resize((64, 43), Image.LANCZOS)
    np.testing.assert_array_equal(decoded(data[2]),
                                  np.asarray(Image.open(io.BytesIO(tall_png))
                                             .resize((27, 64), Image.LANCZOS)))
    assert np.abs(decoded(data[0]).astype(int) - np.asarray(expected).astype(int)).mean() < 3

    low = write_shards([{"jpg": big_jpeg}], str(tmp_path / "q-%d.tar"), image_max_side=64,
                       quality=20)[0]
    with tarfile.open(low) as tar:
        reencoded = tar.extractfile(tar.getmembers()[0]).read()
    assert Image.open(io.BytesIO(reencoded)).size == (64, 43)
    assert len(reencoded) < len(data[0])


def test_without_image_max_side_bytes_are_copied(tmp_path):
    big = encoded(pixels((300, 200, 3), 0), "JPEG", quality=75)
    [path] = write_shards([{"jpg": big}], str(tmp_path / "c-%d.tar"), quality=10)
    with tarfile.open(path) as tar:
        assert tar.extractfile(tar.getmembers()[0]).read() == big


# ------------------------------------------------------ image folders

@pytest.fixture
def image_folder(tmp_path):
    root = tmp_path / "folder"
    files = {"cat/a.jpg": ("JPEG", (20, 30)), "cat/b.JPEG": ("JPEG", (25, 20)),
             "dog/c.png": ("PNG", (8, 9)), "dog/d.jpeg": ("JPEG", (70, 40)),
             "emu/e.jpg": ("JPEG", (10, 10))}
    for i, (name, (fmt, (h, w))) in enumerate(sorted(files.items())):
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(encoded(pixels((h, w, 3), i), fmt))
    return root


def test_image_folder_round_trip(wds, image_folder, tmp_path):
    expected = [("cat/a.jpg", "jpg", 0), ("cat/b.JPEG", "jpg", 0), ("dog/c.png", "png", 1),
                ("dog/d.jpeg", "jpg", 1), ("emu/e.jpg", "jpg", 2)]
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    for source in (str(image_folder), fastload.ImageFolder(image_folder)):
        paths = shards_from_image_folder(source, str(out_dir / "f-%d.tar"), maxcount=2)
        assert len(paths) == 3
        got = read_with_webdataset(wds, paths)
        assert [s["__key__"] for s in got] == [f"{i:09d}" for i in range(5)]
        for sample, (name, field, label) in zip(got, expected):
            assert sample[field] == (image_folder / name).read_bytes()   # the file's bytes
            assert int(sample["cls"]) == label
        decoded_samples = read_with_webdataset(wds, paths, "rgb8")
        assert [s["cls"] for s in decoded_samples] == [0, 0, 1, 1, 2]


def test_image_folder_from_any_dataset_with_samples(image_folder, tmp_path):
    class TorchvisionLike:  # torchvision's ImageFolder exposes .samples the same way
        samples = [(str(image_folder / "dog/c.png"), 4), (str(image_folder / "cat/a.jpg"), 3)]

    [path] = shards_from_image_folder(TorchvisionLike(), str(tmp_path / "t-%d.tar"))
    assert [m.name for m in members(path)] == ["000000000.cls", "000000000.png",
                                               "000000001.cls", "000000001.jpg"]
    with pytest.raises(TypeError, match="'samples' list"):
        shards_from_image_folder(object(), str(tmp_path / "u-%d.tar"))


def test_image_folder_with_torchvision(image_folder, tmp_path):
    try:
        import torchvision
    except Exception as e:  # missing, or built for another torch
        pytest.skip(f"torchvision unavailable: {e}")
    dataset = torchvision.datasets.ImageFolder(str(image_folder))
    [path] = shards_from_image_folder(dataset, str(tmp_path / "tv-%d.tar"))
    ours = shards_from_image_folder(str(image_folder), str(tmp_path / "fl-%d.tar"))[0]
    assert pathlib.Path(path).read_bytes() == pathlib.Path(ours).read_bytes()


def test_image_folder_shuffle_is_seeded(image_folder, tmp_path):
    def keys(seed, name):
        [path] = shards_from_image_folder(str(image_folder), str(tmp_path / name),
                                          shuffle=True, seed=seed)
        return [m.name for m in members(path) if m.name.endswith(".cls")]

    first, again, other = keys(0, "a.tar"), keys(0, "b.tar"), keys(1, "c.tar")
    assert first == again
    assert sorted(first) == [f"{i:09d}.cls" for i in range(5)]
    assert first != sorted(first)   # shuffled, yet the key is still the dataset index
    assert first != other


def test_image_folder_resized(image_folder, tmp_path):
    [path] = shards_from_image_folder(str(image_folder), str(tmp_path / "r.tar"),
                                      image_max_side=16)
    with tarfile.open(path) as tar:
        sizes = {m.name: Image.open(tar.extractfile(m)).size
                 for m in tar.getmembers() if not m.name.endswith(".cls")}
    assert all(max(size) <= 16 for size in sizes.values())
    assert sizes["000000003.jpg"] == (9, 16)        # dog/d.jpeg: 40x70
    assert sizes["000000002.png"] == (9, 8)         # dog/c.png fits: copied
