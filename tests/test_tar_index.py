"""fastload._C.tar_index: the member index of a tar shard (csrc/core/source/tar.c).

Indexes are checked against Python's tarfile on archives tarfile writes
(ustar, GNU and pax formats) and on hand-made headers it reads; the
WebDataset grouping against the `webdataset` package when it is installed.
Every malformed shard must raise fastload.DecodeError naming the shard and
the member or offset, never crash or allocate what a header claims.
"""

import pathlib
import random
import sys
import tarfile

import pytest

from fl_helpers import fastload_only

pytestmark = fastload_only

import fastload  # noqa: E402
from fastload import _C  # noqa: E402

# The raw-header and tarfile helpers the fuzz corpus is made with.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "fuzz"))
from make_corpus import pax_record, tarfile_shard  # noqa: E402
from make_corpus import tar_header as header  # noqa: E402
from make_corpus import tar_member as member  # noqa: E402

REG = tarfile.REGTYPE
END = b"\0" * 1024


# ------------------------------------------------------------------ helpers

def write_tar(path, members, fmt=tarfile.PAX_FORMAT, **kwargs):
    """members: (name, type, data); links take `data` as their target."""
    path.write_bytes(tarfile_shard(fmt, members, **kwargs))
    return path


def pax(*records):
    return member(b"././@PaxHeader", b"".join(pax_record(k, v) for k, v in records), kind=b"x")


def raw(tmp_path, data, name="shard.tar"):
    path = tmp_path / name
    path.write_bytes(data)
    return path


def indexed(path, group=False):
    """[(name, data offset, size)] from tar_index, names decoded as tarfile does."""
    result = _C.tar_index(str(path), group)
    names = result["names"].split(b"\0")[:-1]
    starts = [0] * len(names)
    for i in range(1, len(names)):
        starts[i] = starts[i - 1] + len(names[i - 1]) + 1
    assert result["name_offsets"].tolist() == starts
    for key in ("name_offsets", "offsets", "sizes"):
        assert result[key].dtype == "int64" and len(result[key]) == len(names)
    return [(n.decode("utf-8", "surrogateescape"), int(o), int(s))
            for n, o, s in zip(names, result["offsets"], result["sizes"])]


def by_tarfile(path):
    with tarfile.open(path, encoding="utf-8", errors="surrogateescape") as tar:
        return [(m.name, m.offset_data, m.size) for m in tar if m.isreg()]


def assert_like_tarfile(path):
    ours = indexed(path)
    assert ours == by_tarfile(path)
    return ours


def decode_error(path, group=True):
    with pytest.raises(fastload.DecodeError) as info:
        _C.tar_index(str(path), group)
    message = str(info.value)
    assert str(path) in message
    return message


# ------------------------------------------------------- agreeing with tarfile

MIXED = [
    ("dir", tarfile.DIRTYPE, b""),
    ("dir/a.jpg", REG, b"jpeg bytes"),
    ("dir/a.cls", REG, b"7"),
    ("dir/empty.txt", REG, b""),
    ("link.jpg", tarfile.SYMTYPE, b"dir/a.jpg"),
    ("hard.jpg", tarfile.LNKTYPE, b"dir/a.jpg"),
    ("fifo", tarfile.FIFOTYPE, b""),
    ("chr", tarfile.CHRTYPE, b""),
    ("blocks.bin", REG, bytes(range(256)) * 5),
    ("p" * 60 + "/" + "q" * 90 + ".txt", REG, b"fits ustar with a prefix"),
]
LONG = [
    ("d" * 120 + "/" + "n" * 150 + ".txt", REG, b"long name"),
    ("l" * 130, tarfile.SYMTYPE, b"t" * 200),
    ("deep/" * 40 + "x.bin", REG, b"deep"),
]


@pytest.mark.parametrize("fmt", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_members_match_tarfile(tmp_path, fmt):
    members = MIXED + (LONG if fmt != tarfile.USTAR_FORMAT else [])
    members += [(f"many/{i:05d}.bin", REG, b"m" * (i % 5)) for i in range(600)]
    path = write_tar(tmp_path / "shard.tar", members, fmt)
    ours = assert_like_tarfile(path)
    regular = [m for m in members if m[1] == REG]
    assert [name for name, _, _ in ours] == [m[0] for m in regular]
    data = path.read_bytes()
    for (name, offset, size), (_, _, content) in zip(ours, regular):
        assert data[offset:offset + size] == content, name


def test_non_utf8_and_unicode_names_are_bytes_as_stored(tmp_path):
    names = ["caf\u00e9.jpg", "\u65e5\u672c/\u8a9e.txt", "raw\udcff.bin"]
    path = write_tar(tmp_path / "shard.tar", [(n, REG, n.encode("utf-8", "surrogateescape"))
                                              for n in names],
                     encoding="utf-8", errors="surrogateescape")
    assert [name for name, _, _ in assert_like_tarfile(path)] == names


def test_shard_larger_than_the_read_window(tmp_path):
    """Small members run across window refills; large ones are skipped over
    (a short read after each); a pax header straddles a window's edge."""
    rng = random.Random(5)
    members = []
    for i in range(1500):
        members.append((f"s/{i:05d}.jpg", REG, rng.randbytes(rng.randrange(0, 3000))))
        if i % 500 == 250:
            members.append((f"s/{i:05d}.big", REG, rng.randbytes(2_500_000)))
        if i % 97 == 0:
            members.append(("x" * 300 + f"/{i}.txt", REG, b"long"))
    path = write_tar(tmp_path / "big.tar", members, tarfile.PAX_FORMAT)
    assert path.stat().st_size > 4 * (1 << 20)
    ours = assert_like_tarfile(path)
    data = path.read_bytes()
    want = [m for m in members if m[1] == REG]
    assert len(ours) == len(want)
    for (name, offset, size), (_, _, content) in zip(ours, want):
        assert data[offset:offset + size] == content, name


def test_pax_path_and_size_override_the_next_member(tmp_path):
    shard = (pax((b"path", b"from/pax.txt"), (b"size", b"5"), (b"mtime", b"1.5"))
             + header(b"short.txt", 0) + b"hello".ljust(512, b"\0")
             + pax((b"path", b"trailing/slashes.txt//"))
             + member(b"other.txt", b"x") + END)
    path = raw(tmp_path, shard)
    assert assert_like_tarfile(path) == [("from/pax.txt", 1536, 5),
                                         ("trailing/slashes.txt", 3584, 1)]


def test_first_extended_header_wins_as_in_tarfile(tmp_path):
    long_name = b"gnu/" + b"g" * 200 + b".txt"
    shard = (member(b"././@LongLink", long_name + b"\0", kind=b"L")
             + pax((b"path", b"pax/name.txt"))
             + member(b"short.txt", b"a")
             + pax((b"path", b"pax/first.txt"))
             + member(b"././@LongLink", long_name + b"\0", kind=b"L")
             + member(b"short.txt", b"b") + END)
    path = raw(tmp_path, shard)
    names = [name for name, _, _ in assert_like_tarfile(path)]
    assert names == [long_name.decode(), "pax/first.txt"]


def test_global_pax_headers_and_long_links_are_skipped(tmp_path):
    path = write_tar(tmp_path / "shard.tar",
                     [("a.txt", REG, b"a"), ("b" * 120, tarfile.SYMTYPE, b"c" * 300),
                      ("c.txt", REG, b"c")],
                     tarfile.PAX_FORMAT, pax_headers={"comment": "made by a test"})
    assert [n for n, _, _ in assert_like_tarfile(path)] == ["a.txt", "c.txt"]
    gnu = write_tar(tmp_path / "gnu.tar", [("l" * 120, tarfile.SYMTYPE, b"t" * 300),
                                           ("after.txt", REG, b"x")], tarfile.GNU_FORMAT)
    assert [n for n, _, _ in assert_like_tarfile(gnu)] == ["after.txt"]


def test_base256_size(tmp_path):
    size_field = b"\x80" + b"\0" * 9 + b"\x03\x00"  # 768
    shard = header(b"big.bin", 0, size_field=size_field) + b"b" * 1024 + END
    assert assert_like_tarfile(raw(tmp_path, shard)) == [("big.bin", 512, 768)]


def test_old_formats(tmp_path):
    shard = (header(b"v7dir/", 0, kind=b"\0", magic=b"\0" * 8)
             + member(b"v7dir/file.txt", b"v7", kind=b"\0", magic=b"\0" * 8)
             + member(b"ustar.txt", b"u", prefix=b"with/prefix")
             + member(b"spaces.txt", b"s", size_field=b"  1      \0 \0")
             + member(b"gnu.txt", b"g", magic=b"ustar  \0"))
    path = raw(tmp_path, shard + END)
    assert [n for n, _, _ in assert_like_tarfile(path)] == [
        "v7dir/file.txt", "with/prefix/ustar.txt", "spaces.txt", "gnu.txt"]
    # Signed-char checksums, as some old tars wrote them.
    h = bytearray(header("é.txt".encode(), 1))
    h[148:156] = b" " * 8
    h[148:156] = b"%06o\0 " % (sum(b - 256 if b > 127 else b for b in h))
    signed = raw(tmp_path, bytes(h) + b"x".ljust(512, b"\0") + END, "signed.tar")
    assert assert_like_tarfile(signed) == [("é.txt", 512, 1)]


def test_unknown_types_skip_their_data_and_links_ignore_theirs(tmp_path):
    shard = (member(b"label", b"v" * 700, kind=b"V")
             + header(b"hard.txt", 0, kind=b"1", linkname=b"a.txt")
             + member(b"a.txt", b"a") + END)
    assert [n for n, _, _ in assert_like_tarfile(raw(tmp_path, shard))] == ["a.txt"]


def test_end_of_archive(tmp_path):
    one = member(b"a.txt", b"a")
    # A single zero block ends it; what follows is ignored.
    garbage = raw(tmp_path, one + b"\0" * 512 + b"not a header" * 100, "garbage.tar")
    assert [n for n, _, _ in assert_like_tarfile(garbage)] == ["a.txt"]
    # The end of the file on a block boundary ends it too.
    no_marker = raw(tmp_path, one, "nomarker.tar")
    assert [n for n, _, _ in assert_like_tarfile(no_marker)] == ["a.txt"]
    # An archive of zero blocks is an empty archive (GNU tar writes these).
    empty = raw(tmp_path, b"\0" * 10240, "empty.tar")
    assert indexed(empty) == by_tarfile(empty) == []
    result = _C.tar_index(str(empty))
    assert result["names"] == b"" and result["sample_starts"].tolist() == [0]


def test_result_layout(tmp_path):
    path = write_tar(tmp_path / "shard.tar", [("a.jpg", REG, b"1"), ("a.cls", REG, b"2")])
    plain = _C.tar_index(path, False)
    assert sorted(plain) == ["name_offsets", "names", "offsets", "sizes"]
    grouped = _C.tar_index(str(path).encode())
    assert sorted(grouped) == ["key_lengths", "name_offsets", "names", "offsets",
                               "sample_members", "sample_starts", "sizes"]
    assert grouped["key_lengths"].tolist() == [1, 1]
    assert grouped["sample_members"].tolist() == [0, 1]
    assert grouped["sample_starts"].tolist() == [0, 2]
    with pytest.raises(TypeError):
        _C.tar_index()
    with pytest.raises(TypeError):
        _C.tar_index(3)


# ------------------------------------------------------------------ grouping

def our_samples(path):
    result = _C.tar_index(str(path))
    names = [n.decode("utf-8", "surrogateescape") for n in result["names"].split(b"\0")[:-1]]
    data = path.read_bytes()
    keys = result["key_lengths"].tolist()
    members, starts = result["sample_members"].tolist(), result["sample_starts"].tolist()
    samples = []
    for s in range(len(starts) - 1):
        sample = {}
        for m in members[starts[s]:starts[s + 1]]:
            name = names[m].encode("utf-8", "surrogateescape")
            key = name[:keys[m]].decode("utf-8", "surrogateescape")
            sample["__key__"] = key
            ext = name[keys[m] + 1:].decode("utf-8", "surrogateescape").lower()
            offset, size = int(result["offsets"][m]), int(result["sizes"][m])
            sample[ext] = data[offset:offset + size]
        samples.append(sample)
    return samples


def webdataset_samples(path):
    tariterators = pytest.importorskip("webdataset.tariterators")
    with open(path, "rb") as stream:
        files = tariterators.tar_file_expander([{"url": str(path), "stream": stream}])
        samples = list(tariterators.group_by_keys(files))
    return [{k: v for k, v in s.items() if k != "__url__"} for s in samples]


TRICKY = ["a/b.c.jpg", "a/b.c.JSON", "a/b.txt", "a/.hidden", "b/.x", "c.d/.y", "README",
          "__meta__", "__x__/y.txt", "__a__.txt", "x/__b__", "_c_.txt", "dir.v1/file",
          "dir.v1/file.txt", "x.y/z.txt", "x.y/z.TXT2", "noext/", "e.", "f..g", "g/h.",
          "line\nbreak.txt", "a\nb/c.d", "q.r\ns/t.u", "__n__\n", "k.jpg", "README2",
          "k.png", "k.jpg.extra"]


@pytest.mark.parametrize("fmt", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_grouping_matches_webdataset(tmp_path, fmt):
    names = [n for n in TRICKY if fmt == tarfile.PAX_FORMAT or n.isascii()]
    members = [(n, REG, n.encode() + b"!") for n in names]
    members += [(f"shard/{i:06d}.{ext}", REG, b"%d" % i)
                for i in range(50) for ext in ("jpg", "cls", "meta.json")]
    path = write_tar(tmp_path / "shard.tar", members, fmt)
    assert our_samples(path) == webdataset_samples(path)


def test_grouping_matches_webdataset_on_random_names(tmp_path):
    pytest.importorskip("webdataset.tariterators")
    rng = random.Random(11)
    alphabet = "ab._/\nA"
    for trial in range(40):
        names = []
        while len(names) < 30:
            name = "".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 9)))
            parts = name.split("/")
            if name.startswith("/") or ".." in parts or name.endswith("/"):
                continue
            names.append(name)
        path = write_tar(tmp_path / f"r{trial}.tar", [(n, REG, n.encode()) for n in names])
        try:
            expected = webdataset_samples(path)
        except ValueError:  # a duplicate extension in a sample
            message = decode_error(path)
            assert "repeats the extension" in message or "reserves" in message
            continue
        assert our_samples(path) == expected, names


def test_duplicate_extension_is_an_error_only_when_grouping(tmp_path):
    path = write_tar(tmp_path / "shard.tar", [("s/a.jpg", REG, b"1"), ("s/a.JPG", REG, b"2")])
    message = decode_error(path)
    assert "'s/a.JPG'" in message and "'s/a.jpg'" in message
    assert [n for n, _, _ in indexed(path)] == ["s/a.jpg", "s/a.JPG"]
    reserved = write_tar(tmp_path / "key.tar", [("a.__key__", REG, b"k")])
    assert "'a.__key__'" in decode_error(reserved)


def test_large_sample_duplicate_found(tmp_path):
    """Extensions are checked with a set, not pairwise: many in one sample."""
    exts = [f"e{i}" for i in range(3000)]
    members = [(f"one.{e}", REG, b"") for e in exts]
    ok = write_tar(tmp_path / "ok.tar", members)
    result = _C.tar_index(str(ok))
    assert result["sample_starts"].tolist() == [0, 3000]
    bad = write_tar(tmp_path / "bad.tar", members + [("one.E1234", REG, b"")])
    assert "'one.E1234'" in decode_error(bad)


# ------------------------------------------------------------------ malformed

def test_empty_file(tmp_path):
    assert "empty" in decode_error(raw(tmp_path, b""))


@pytest.mark.parametrize("data, words", [
    (b"hello", "less than one header block"),
    (bytes(range(256)) * 4, "bad checksum"),
    (b"\x1f\x8b\x08\x00" + bytes(1000), "gzip"),
    (b"BZh91AY&SY" + bytes(600), "bzip2"),
])
def test_not_a_tar(tmp_path, data, words):
    message = decode_error(raw(tmp_path, data))
    assert "not a tar archive" in message and words in message


def test_truncated_shards(tmp_path):
    path = write_tar(tmp_path / "good.tar", [("a.txt", REG, b"a" * 100),
                                             ("b.txt", REG, b"b" * 5000)])
    data = path.read_bytes()
    # Cut inside b.txt's data: the member and its header's offset are named.
    message = decode_error(raw(tmp_path, data[:1024 + 512 + 2000], "cut.tar"))
    assert "'b.txt'" in message and "offset 1024" in message and "truncated" in message
    # Cut inside a header block.
    message = decode_error(raw(tmp_path, data[:1024 + 100], "header.tar"))
    assert "header block at offset 1024" in message
    # Cut inside the padding after the last member's data.
    message = decode_error(raw(tmp_path, member(b"a.txt", b"a" * 10)[:522], "pad.tar"))
    assert "'a.txt'" in message and "padding" in message
    # An extended header with no member after it.
    message = decode_error(raw(tmp_path, pax((b"path", b"x.txt")) + END, "pax.tar"))
    assert "extended header at offset 0" in message


def test_bad_checksum_after_the_first_header(tmp_path):
    shard = member(b"a.txt", b"a") + member(b"b.txt", b"b", checksum_delta=3) + END
    message = decode_error(raw(tmp_path, shard))
    assert "bad header checksum at offset 1024" in message and "'a.txt'" in message


@pytest.mark.parametrize("size_field", [
    b"77777777777\0",                      # 8 GiB, octal
    b"\x80\0\0\0\x40" + b"\0" * 7,        # 2**62 bytes, base-256
])
def test_huge_sizes_are_refused_without_allocating(tmp_path, size_field):
    message = decode_error(raw(tmp_path, header(b"huge.bin", 0, size_field=size_field) + END))
    assert "'huge.bin'" in message and "offset 0" in message


@pytest.mark.parametrize("size_field", [b"\x80" + b"\xff" * 11, b"\xff" * 12, b"12x4\0" + bytes(7)])
def test_size_fields_out_of_range_or_malformed(tmp_path, size_field):
    message = decode_error(raw(tmp_path, header(b"a.bin", 0, size_field=size_field) + END))
    assert "size field in the header at offset 0" in message


def test_oversized_extended_header(tmp_path):
    body = pax_record(b"comment", b"c" * (1 << 20))
    shard = member(b"././@PaxHeader", body, kind=b"x") + member(b"a.txt", b"a") + END
    message = decode_error(raw(tmp_path, shard))
    assert "extended header at offset 0" in message and "more than" in message


@pytest.mark.parametrize("name, fault", [
    (b"../escape.txt", "'..'"),
    (b"ok/../../etc/passwd", "'..'"),
    (b"a/..", "'..'"),
    (b"/etc/passwd", "absolute"),
])
def test_unsafe_names_are_refused(tmp_path, name, fault):
    message = decode_error(raw(tmp_path, member(b"fine.txt", b"f") + member(name, b"x") + END))
    assert f"'{name.decode()}'" in message and fault in message and "offset 1024" in message


def test_unsafe_names_from_extended_headers(tmp_path):
    for i, shard in enumerate([
        pax((b"path", b"../../x.txt")) + member(b"x.txt", b"x") + END,
        pax((b"path", b"/")) + member(b"x.txt", b"x") + END,  # strips to ""
        member(b"././@LongLink", b"/abs/long\0", kind=b"L") + member(b"x.txt", b"x") + END,
    ]):
        message = decode_error(raw(tmp_path, shard, f"{i}.tar"))
        assert "refused" in message


def test_empty_name_is_refused(tmp_path):
    assert "empty" in decode_error(raw(tmp_path, member(b"", b"x") + END))


def test_dotted_names_that_are_safe(tmp_path):
    shard = member(b"./a.txt", b"a") + member(b"b..c.txt", b"b") + member(b"..d/e", b"e") + END
    assert [n for n, _, _ in assert_like_tarfile(raw(tmp_path, shard))] == [
        "./a.txt", "b..c.txt", "..d/e"]


@pytest.mark.parametrize("records", [
    [(b"GNU.sparse.map", b"0,1")],
    [(b"size", b"12abc")],
    [(b"size", b"")],
])
def test_pax_headers_refused(tmp_path, records):
    shard = pax(*records) + member(b"a.txt", b"a") + END
    assert "pax extended header at offset 0" in decode_error(raw(tmp_path, shard))


def test_malformed_pax_records(tmp_path):
    for i, body in enumerate([b"99 path=a\n", b"x path=a\n", b"6 p=a\n\n", b"5 =a\n"]):
        shard = member(b"././@PaxHeader", body, kind=b"x") + member(b"a.txt", b"a") + END
        assert "malformed pax" in decode_error(raw(tmp_path, shard, f"{i}.tar"))


def test_sparse_members_are_refused(tmp_path):
    message = decode_error(raw(tmp_path, header(b"sparse.bin", 0, kind=b"S") + END))
    assert "sparse" in message


def test_io_errors(tmp_path):
    with pytest.raises(FileNotFoundError) as info:
        _C.tar_index(str(tmp_path / "missing.tar"))
    assert info.value.filename == str(tmp_path / "missing.tar")
    with pytest.raises(IsADirectoryError):
        _C.tar_index(str(tmp_path))


def test_random_corruption_never_crashes(tmp_path):
    """Every error is a DecodeError; every success is what tarfile reads."""
    good = write_tar(tmp_path / "good.tar",
                     [(f"s/{i:03d}.{e}", REG, b"d" * (i * 37 % 900))
                      for i in range(30) for e in ("jpg", "cls")] + LONG).read_bytes()
    rng = random.Random(3)
    for trial in range(300):
        data = bytearray(good)
        for _ in range(rng.randrange(1, 4)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        if trial % 3 == 0:
            data = data[:rng.randrange(len(data))]
        path = raw(tmp_path, bytes(data), "mutated.tar")
        try:
            _C.tar_index(str(path))
        except fastload.DecodeError as exc:
            assert str(path) in str(exc)
