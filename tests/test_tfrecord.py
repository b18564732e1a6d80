"""fastload.TFRecordDataset: TFRecord files of tf.train.Example records,
framed, checked, parsed and decoded in C; interop with the ``tfrecord``
package (no TensorFlow)."""

import gzip
import io
import itertools
import os
import pathlib
import shutil
import struct
import sys

import numpy as np
import pytest

import fastload
from fastload import _C
from fastload import transforms as T

Image = pytest.importorskip("PIL.Image")
torch = pytest.importorskip("torch")
tfrecord = pytest.importorskip("tfrecord")
crc32c_module = pytest.importorskip("crc32c")
from tfrecord import example_pb2  # noqa: E402
from tfrecord.tools.tfrecord2idx import create_index  # noqa: E402

# The protobuf encoders the fuzz corpus is made with.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "fuzz"))
from make_corpus import pb_field as field  # noqa: E402
from make_corpus import pb_varint as varint  # noqa: E402
from make_corpus import tf_example as example  # noqa: E402
from make_corpus import tf_feature as feature  # noqa: E402


# ---------------------------------------------------------------- helpers

def masked(data):
    crc = crc32c_module.crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def frame(data):
    """One TFRecord record around `data`."""
    length = struct.pack("<Q", len(data))
    return length + struct.pack("<I", masked(length)) + data + struct.pack("<I", masked(data))


def jpeg(rng, size=(24, 20)):
    buffer = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (*size, 3), dtype=np.uint8)).save(buffer, "JPEG")
    return buffer.getvalue()


def write_records(path, payloads):
    with open(path, "wb") as f:
        for p in payloads:
            f.write(frame(p))
    return str(path)


def image_records(rng, n, label=lambda i: i):
    return [example({"image/encoded": feature("bytes", [jpeg(rng)]),
                     "image/class/label": feature("int64", [label(i)])}) for i in range(n)]


SMALL = T.Compose([T.Resize(16), T.CenterCrop(16), T.ToTensor()])


@pytest.fixture(autouse=True)
def index_dir(tmp_path, monkeypatch):
    """Index files and decompressed copies in this test's folder."""
    monkeypatch.setenv("FASTLOAD_INDEX_DIR", str(tmp_path / "index-cache"))
    monkeypatch.setenv("FASTLOAD_TFRECORD_DIR", str(tmp_path / "copies"))


# ------------------------------------------------------------------- CRC-32C

@pytest.mark.parametrize("size", [0, 1, 7, 8, 9, 63, 64, 65, 1000, 4097])
@pytest.mark.parametrize("start", [0, 1, 3])
def test_crc32c_implementations_agree(size, start):
    data = np.random.default_rng(size).integers(0, 256, size + start, dtype=np.uint8).tobytes()
    view = memoryview(data)[start:]  # unaligned starts
    want = crc32c_module.crc32c(bytes(view))
    assert _C.crc32c(view, "table") == want
    assert _C.crc32c(view, "auto") == want
    hw = _C.crc32c(view, "hw")
    assert hw is None or hw == want


def test_crc32c_known_value():
    assert _C.crc32c(b"123456789", "table") == 0xE3069283
    assert _C.crc32c(b"123456789", "auto") == 0xE3069283


# ------------------------------------------------------------ tfrecord interop

def test_records_the_tfrecord_package_writes_read_identically(tmp_path):
    rng = np.random.default_rng(0)
    path = str(tmp_path / "data.tfrecord")
    writer = tfrecord.TFRecordWriter(path)
    want = []
    for i in range(7):
        datum = {"image/encoded": (jpeg(rng), "byte"),
                 "image/class/label": (i * 3 - 5, "int"),
                 "tags": ([b"a" * i, b"", bytes(range(i))], "byte"),
                 "box": (rng.random(i + 1).astype(np.float32).tolist(), "float"),
                 "ids": ([-(2 ** 62), 0, i, 2 ** 40], "int")}
        writer.write(datum)
        want.append(datum)
    writer.close()
    ds = fastload.TFRecordDataset(path, features={"tags": "bytes", "box": "float",
                                                  "ids": "int64"})
    assert len(ds) == 7
    for i, (image, target, extra) in enumerate(ds):
        assert target == want[i]["image/class/label"][0]
        assert extra["tags"] == want[i]["tags"][0]
        np.testing.assert_array_equal(extra["box"], np.float32(want[i]["box"][0]))
        assert extra["box"].dtype == np.float32
        np.testing.assert_array_equal(extra["ids"], np.int64(want[i]["ids"][0]))
        assert image.shape[2] == 3
    # Every Example as protobuf parses it.
    for i, record in enumerate(tfrecord.reader.tfrecord_iterator(path)):
        ex = example_pb2.Example()
        ex.ParseFromString(bytes(record))
        got = ds.example(i, {"tags": "bytes", "box": "float", "ids": "int64"})
        assert got["tags"] == list(ex.features.feature["tags"].bytes_list.value)
        np.testing.assert_array_equal(got["box"], ex.features.feature["box"].float_list.value)
        assert got["ids"].tolist() == list(ex.features.feature["ids"].int64_list.value)


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "unpacked"])
def test_packed_and_unpacked_lists(tmp_path, packed):
    rng = np.random.default_rng(1)
    floats, ints = [1.5, -2.25, 3e38, 0.0], [0, 1, -1, 2 ** 63 - 1, -(2 ** 63)]
    payload = example({"image/encoded": feature("bytes", [jpeg(rng)]),
                       "image/class/label": feature("int64", [4], packed),
                       "f": feature("float", floats, packed),
                       "i": feature("int64", ints, packed)})
    # protobuf reads what was written by hand the same way.
    ex = example_pb2.Example()
    ex.ParseFromString(payload)
    assert list(ex.features.feature["i"].int64_list.value) == ints
    path = write_records(tmp_path / "a.tfrecord", [payload])
    ds = fastload.TFRecordDataset(path, features={"f": "float", "i": "int64"})
    image, target, extra = ds[0]
    assert target == 4
    np.testing.assert_array_equal(extra["f"], np.float32(floats))
    assert extra["i"].tolist() == ints


def test_mixed_packing_unknown_fields_and_last_entry_wins():
    # Values packed and unpacked in one list accumulate; unknown fields
    # are skipped; a map key seen twice keeps its last value.
    ints = field(1, 2, varint(1) + varint(2)) + field(1, 0, varint(3)) + field(9, 5, b"xxxx")
    payload = (field(7, 0, varint(5)) +
               example({"k": field(3, 2, ints)}) +
               field(1, 2, field(1, 2, field(1, 2, b"j") + field(2, 2, feature("float", [1.0])))) +
               field(1, 2, field(1, 2, field(1, 2, b"j") + field(2, 2, feature("int64", [9])))))
    got = _C.parse_example(payload, (("k", "int64"), ("j", "int64")))
    assert got["k"].tolist() == [1, 2, 3]
    assert got["j"].tolist() == [9]


def test_index_files_match_tfrecord2idx(tmp_path):
    rng = np.random.default_rng(2)
    path = write_records(tmp_path / "a.tfrecord", image_records(rng, 9))
    theirs = tmp_path / "theirs.idx"
    create_index(path, str(theirs))
    written = fastload.write_tfrecord_index(path)
    assert written == path + ".idx"
    with open(written, "rb") as f:
        assert f.read() == theirs.read_bytes()
    # The dataset takes theirs as given, and finds its own beside the file.
    assert len(fastload.TFRecordDataset(path, index=str(theirs))) == 9
    assert len(fastload.TFRecordDataset(path)) == 9


def test_index_is_built_when_absent_in_the_cache_when_read_only(tmp_path):
    rng = np.random.default_rng(3)
    folder = tmp_path / "ro"
    folder.mkdir()
    path = write_records(folder / "a.tfrecord", image_records(rng, 4))
    os.chmod(folder, 0o555)
    try:
        if os.access(folder, os.W_OK):
            pytest.skip("running as root: the folder stays writable")
        ds = fastload.TFRecordDataset(path)
        assert len(ds) == 4
        assert not os.path.exists(path + ".idx")
        assert len(os.listdir(tmp_path / "index-cache")) == 1
    finally:
        os.chmod(folder, 0o755)


def test_a_stale_index_is_rebuilt_and_a_given_one_refused(tmp_path):
    rng = np.random.default_rng(4)
    path = write_records(tmp_path / "a.tfrecord", image_records(rng, 3))
    fastload.write_tfrecord_index(path)
    stale = tmp_path / "stale.idx"
    shutil.copy(path + ".idx", stale)
    with open(path, "ab") as f:
        f.write(frame(image_records(rng, 1)[0]))
    assert len(fastload.TFRecordDataset(path)) == 4  # rebuilt
    with pytest.raises(ValueError, match="stale"):
        fastload.TFRecordDataset(path, index=str(stale))


def test_gzip_files_read_as_plain_ones(tmp_path):
    rng = np.random.default_rng(5)
    records = image_records(rng, 6)
    plain = write_records(tmp_path / "a.tfrecord", records)
    packed = str(tmp_path / "a.tfrecord.gz")
    with open(plain, "rb") as f, gzip.open(packed, "wb") as g:
        g.write(f.read())
    a = fastload.TFRecordDataset(plain, SMALL)
    b = fastload.TFRecordDataset(packed, SMALL, compression="gzip")
    assert len(b) == 6
    for i in range(6):
        np.testing.assert_array_equal(a[i][0], b[i][0])
        assert a[i][1] == b[i][1] == i
    again = fastload.TFRecordDataset(packed, SMALL, compression="gzip")
    assert again.path(0) == b.path(0)  # the copy is reused


def test_brace_patterns_and_record_numbers(tmp_path):
    rng = np.random.default_rng(6)
    for s in range(3):
        write_records(tmp_path / f"part-{s}.tfrecord",
                      image_records(rng, 2 + s, label=lambda i, s=s: 10 * s + i))
    ds = fastload.TFRecordDataset(str(tmp_path / "part-{0..2}.tfrecord"), SMALL)
    assert len(ds) == 9 and ds.record_counts == [2, 3, 4]
    assert ds.targets == [0, 1, 10, 11, 12, 20, 21, 22, 23]
    assert ds.record(4) == (str(tmp_path / "part-1.tfrecord"), 2)


# --------------------------------------------------------- against ImageFolder

@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """An ImageFolder tree and a TFRecord file of its samples, in its order."""
    root = tmp_path_factory.mktemp("folder")
    rng = np.random.default_rng(7)
    for c in ("cat", "dog"):
        (root / "train" / c).mkdir(parents=True)
        for i in range(7):
            size = (int(rng.integers(30, 90)), int(rng.integers(30, 90)))
            pixels = rng.integers(0, 256, (*size, 3), dtype=np.uint8)
            fmt = "PNG" if i == 3 else "JPEG"
            Image.fromarray(pixels).save(root / "train" / c / f"{i}.{fmt.lower()}", fmt)
    folder = fastload.ImageFolder(root / "train")
    writer = tfrecord.TFRecordWriter(str(root / "train.tfrecord"))
    for path, label in folder.samples:
        with open(path, "rb") as f:
            data = f.read()
        writer.write({"image/encoded": (data, "byte"),
                      "image/class/label": (label, "int")})
    writer.close()
    return root


TRAIN = T.Compose([T.RandomResizedCrop(24), T.RandomHorizontalFlip(), T.ToTensor(),
                   T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])


@pytest.mark.parametrize("num_workers", [0, 2])
def test_batches_equal_image_folders(folder, num_workers):
    a = fastload.ImageFolder(folder / "train", transform=TRAIN)
    b = fastload.TFRecordDataset(str(folder / "train.tfrecord"), transform=TRAIN)
    assert b._native_source() is not None

    def batches(ds):
        return list(fastload.DataLoader(ds, batch_size=4, shuffle=True, num_workers=num_workers,
                                        generator=torch.Generator().manual_seed(3)))

    for (x, y), (u, v) in zip(batches(a), batches(b), strict=True):
        torch.testing.assert_close(x, u, rtol=0, atol=0)
        assert y.tolist() == v.tolist()


def test_samples_equal_image_folders(folder):
    a = fastload.ImageFolder(folder / "train", transform=SMALL)
    b = fastload.TFRecordDataset(str(folder / "train.tfrecord"), transform=SMALL)
    raw_a = fastload.ImageFolder(folder / "train")
    raw_b = fastload.TFRecordDataset(str(folder / "train.tfrecord"))
    for i in range(len(a)):
        np.testing.assert_array_equal(np.asarray(a[i][0]), np.asarray(b[i][0]))
        np.testing.assert_array_equal(raw_a[i][0], raw_b[i][0])
        assert a[i][1] == b[i][1]


def test_torchvision_transform(folder, torchvision):
    tv = torchvision.transforms
    transform = tv.Compose([tv.Resize(20), tv.CenterCrop(20), tv.ToTensor()])
    a = fastload.ImageFolder(folder / "train", transform=transform)
    b = fastload.TFRecordDataset(str(folder / "train.tfrecord"), transform=transform)
    (x, y), = itertools.islice(fastload.DataLoader(a, batch_size=14), 1)
    (u, v), = itertools.islice(fastload.DataLoader(b, batch_size=14), 1)
    torch.testing.assert_close(x, u, rtol=0, atol=0)
    assert y.tolist() == v.tolist()


# ------------------------------------------------------------- loader, resume

def labelled(tmp_path, n=37):
    rng = np.random.default_rng(8)
    paths = []
    for s, count in enumerate((n // 3, n // 3, n - 2 * (n // 3))):
        start = s * (n // 3)
        paths.append(write_records(tmp_path / f"s{s}.tfrecord",
                                   image_records(rng, count, label=lambda i, a=start: a + i)))
    return paths


@pytest.mark.parametrize("features", [None, {"image/class/label": "int64"}],
                         ids=["native", "features"])
def test_thread_workers_with_shuffle_give_every_record_once(tmp_path, features):
    ds = fastload.TFRecordDataset(labelled(tmp_path), SMALL, features=features)
    loader = fastload.DataLoader(ds, batch_size=5, shuffle=True, num_workers=2,
                                 worker_mode="thread",
                                 collate_fn=None if features is None else
                                 lambda batch: [s[1] for s in batch])
    for _ in range(2):
        seen = []
        for batch in loader:
            seen.extend(batch[1].tolist() if features is None else batch)
        assert sorted(seen) == list(range(37))


def test_process_workers(tmp_path):
    ds = fastload.TFRecordDataset(labelled(tmp_path), SMALL)
    seen = [y for _, ys in fastload.DataLoader(ds, batch_size=6, num_workers=2,
                                                worker_mode="process") for y in ys.tolist()]
    assert seen == list(range(37))


def test_resume_mid_epoch(tmp_path):
    ds = fastload.TFRecordDataset(labelled(tmp_path), transform=T.Compose(
        [T.RandomResizedCrop(8), T.RandomHorizontalFlip(), T.ToTensor()]))

    def make():
        return fastload.DataLoader(ds, batch_size=4, shuffle=True, num_workers=2,
                                   generator=torch.Generator().manual_seed(5))

    full = list(make())
    loader = make()
    it = iter(loader)
    head = list(itertools.islice(it, 3))
    state = loader.state_dict()
    again = make()
    again.load_state_dict(state)
    rest = list(again)
    assert len(head) + len(rest) == len(full)
    for (x, y), (u, v) in zip(head + rest, full):
        torch.testing.assert_close(x, u, rtol=0, atol=0)
        assert y.tolist() == v.tolist()


# ------------------------------------------------------------------ errors

def damaged(tmp_path, how, n=6, bad=3):
    """A file of n records whose record `bad` is damaged `how`, and its
    index made before the damage."""
    rng = np.random.default_rng(9)
    records = image_records(rng, n)
    if how == "missing":
        records[bad] = example({"image/encoded": feature("bytes", [jpeg(rng)])})
    elif how == "wrong_type":
        records[bad] = example({"image/encoded": feature("bytes", [jpeg(rng)]),
                                "image/class/label": feature("float", [1.0])})
    elif how == "malformed":
        records[bad] = records[bad][:-3]  # a length runs past the end
    framed = [frame(r) for r in records]
    path = str(tmp_path / "bad.tfrecord")
    with open(path, "wb") as f:
        f.write(b"".join(framed))
    fastload.write_tfrecord_index(path)
    start = sum(len(r) for r in framed[:bad])
    with open(path, "rb") as f:
        data = bytearray(f.read())
    if how == "crc":
        data[start + len(framed[bad]) - 1] ^= 0x01  # the stored data CRC: the data is intact
    elif how == "length":
        data[start] ^= 0x01
    elif how == "truncated":
        data = data[:start + 40]
    with open(path, "wb") as f:
        f.write(data)
    if how == "truncated":
        os.utime(path + ".idx")  # the index stays newer: the read finds the damage
    return path


READ_ERRORS = {
    "crc": "record 3 at offset [0-9]+: bad data CRC",
    "missing": "record 3 at offset [0-9]+: feature 'image/class/label' is missing",
    "wrong_type": "record 3 at offset [0-9]+: feature 'image/class/label' is a float_list, "
                  "expected int64_list",
    "malformed": "record 3 at offset [0-9]+: malformed Example",
}


@pytest.mark.parametrize("how", sorted(READ_ERRORS))
@pytest.mark.parametrize("path_kind", ["native", "getitem"])
def test_damaged_records_name_file_record_and_feature(tmp_path, how, path_kind):
    path = damaged(tmp_path, how)
    ds = fastload.TFRecordDataset(path, SMALL)
    with pytest.raises(fastload.DecodeError, match=READ_ERRORS[how]) as info:
        if path_kind == "native":
            list(fastload.DataLoader(ds, batch_size=6, num_workers=2))
        else:
            ds[3]
    assert "bad.tfrecord" in str(info.value)
    ds[2], ds[4]  # the others read


@pytest.mark.parametrize("how,message", [
    ("length", "record 3 at offset [0-9]+: corrupt length"),
    ("truncated", "record 3 at offset [0-9]+: truncated record"),
])
def test_corrupt_framing_fails_indexing(tmp_path, how, message):
    path = damaged(tmp_path, how)
    os.unlink(path + ".idx")
    with pytest.raises(fastload.DecodeError, match=message) as info:
        fastload.TFRecordDataset(path)
    assert "bad.tfrecord" in str(info.value)


@pytest.mark.parametrize("how,message", [
    ("length", "record 3 at offset [0-9]+: corrupt length"),
    ("truncated", "record 3 at offset [0-9]+: "),
])
def test_corrupt_framing_behind_an_old_index_fails_the_read(tmp_path, how, message):
    path = damaged(tmp_path, how)
    ds = fastload.TFRecordDataset(path, SMALL, index=path + ".idx") if how == "length" \
        else None
    if how == "truncated":  # the index no longer describes the file
        with pytest.raises(ValueError, match="stale"):
            fastload.TFRecordDataset(path, SMALL, index=path + ".idx")
        return
    with pytest.raises(fastload.DecodeError, match=message):
        list(fastload.DataLoader(ds, batch_size=6, num_workers=2))


def test_a_file_cut_short_after_indexing_names_the_record(tmp_path):
    path = write_records(tmp_path / "a.tfrecord", image_records(np.random.default_rng(11), 5))
    ds = fastload.TFRecordDataset(path, SMALL)
    assert ds.samples[4] == (path, 4)
    size = os.path.getsize(path)
    os.truncate(path, size - 10)
    with pytest.raises(OSError, match="record 4 at offset [0-9]+") as info:
        ds[4]
    assert info.value.filename == path
    with pytest.raises(OSError, match="record 4 at offset [0-9]+"):
        list(fastload.DataLoader(ds, batch_size=5, num_workers=2))
    ds[3]


def test_verify_crc_false_skips_the_checks(tmp_path):
    path = damaged(tmp_path, "crc")
    ds = fastload.TFRecordDataset(path, SMALL, verify_crc=False)
    assert ds[3][1] == 3
    labels = [y for _, ys in fastload.DataLoader(ds, batch_size=6, num_workers=2)
              for y in ys.tolist()]
    assert labels == list(range(6))


@pytest.mark.parametrize("how", ["crc", "missing", "wrong_type", "malformed"])
def test_skip_replaces_damaged_records(tmp_path, how):
    path = damaged(tmp_path, how)
    ds = fastload.TFRecordDataset(path, SMALL, on_error="skip")
    labels = [y for _, ys in fastload.DataLoader(ds, batch_size=6, num_workers=2)
              for y in ys.tolist()]
    assert labels == [0, 1, 2, 4, 4, 5]
    assert ds.skipped_count == 1 and ds.skipped[0][0] == 3
    assert ds[3][1] == 4


def test_argument_checks(tmp_path):
    path = write_records(tmp_path / "a.tfrecord", image_records(np.random.default_rng(0), 1))
    with pytest.raises(ValueError, match="compression"):
        fastload.TFRecordDataset(path, compression="zlib")
    with pytest.raises(ValueError, match="kind"):
        fastload.TFRecordDataset(path, features={"x": "string"})
    with pytest.raises(ValueError, match="index files"):
        fastload.TFRecordDataset(path, index=[path + ".idx", path + ".idx"])
    with pytest.raises(FileNotFoundError):
        fastload.TFRecordDataset(str(tmp_path / "nope.tfrecord"))


def test_garbage_never_crashes_the_parser():
    rng = np.random.default_rng(10)
    good = example({"a": feature("int64", [1, 2, 3]), "b": feature("bytes", [b"xy"]),
                    "c": feature("float", [1.0], packed=False)})
    spec = (("a", "int64"), ("b", "bytes"), ("c", "float"))
    for _ in range(2000):
        data = bytearray(good)
        for _ in range(int(rng.integers(1, 4))):
            data[int(rng.integers(0, len(data)))] = int(rng.integers(0, 256))
        cut = bytes(data[:int(rng.integers(0, len(data) + 1))])
        try:
            _C.parse_example(cut, spec)
        except fastload.DecodeError:
            pass
