"""Writes the seed corpora of the fuzz targets (fuzz/corpus/<target>).

    python fuzz/make_corpus.py [pipeline] [tar] [tfrecord]   # all when none is named

pipeline: each seed is 16 parameter bytes (the plan: see fuzz_pipeline.c)
followed by a small JPEG from benchmarks/imagenet_like.make_test_images:
every kind (baseline and progressive, each chroma sampling, grayscale, CMYK,
restart markers, optimised tables), under a few plans each, plus a truncated
file; a few of them rewritten with restart markers every k MCUs
(fastload.add_restart_markers); then small PNGs (every colour type, 16-bit, interlaced, APNG) and
WebPs (lossy, lossless, alpha, animated), and broken ones.

tar: shards written by Python's tarfile in the ustar, GNU and pax formats
(long names and links, directories, links, FIFOs, a global pax header, many
and empty members), hand-made headers tarfile does not write (pax size=,
base-256 sizes, v7 directories, old-GNU times where ustar keeps its prefix,
trailing garbage), and malformed ones (truncated, a member cut short, a bad
checksum, a huge size, "../" and absolute names, a sparse member, gzip
bytes, a duplicate extension).

tfrecord: TFRecord files of Examples built by hand (every kind of list,
packed and unpacked, unknown fields, an empty Example), and damaged ones (a
bad length or data CRC, truncated, a huge length, a group, a varint too
long, a ragged packed list); and one bare Example.

Deterministic, so the corpus in the repository can be regenerated; files
over MAX_BYTES are left out to keep it small.
"""

import io
import os
import pathlib
import random
import struct
import sys
import tarfile
import tempfile
import zlib

ROOT = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent / "benchmarks"))

MAX_BYTES = 24 * 1024
PLANS_PER_IMAGE = 3


def fresh_directory(target):
    out = ROOT / "corpus" / target
    out.mkdir(parents=True, exist_ok=True)
    for old in out.iterdir():
        old.unlink()
    return out


def pipeline_corpus():
    import imagenet_like

    out = fresh_directory("pipeline")
    rng = random.Random(0)
    with tempfile.TemporaryDirectory() as tmp:
        images = imagenet_like.make_test_images(tmp)
        written = 0
        for path, _ in images:
            data = pathlib.Path(path).read_bytes()
            if len(data) > MAX_BYTES:
                continue
            name = pathlib.Path(path).stem
            variants = [data]
            if name.startswith("rgb_224"):
                variants.append(data[: len(data) * 2 // 3])  # truncated
            for v, body in enumerate(variants):
                for k in range(PLANS_PER_IMAGE):
                    params = bytes([k % 3] + [rng.randrange(256) for _ in range(15)])
                    (out / f"{name}-{v}{k}").write_bytes(params + body)
                    written += 1
        restart = restart_seeds(images)
    # PNG and WebP: their own random stream, so the JPEG seeds above stay
    # the same whatever is added here.
    rng = random.Random(1)
    for name, body in png_webp_seeds().items():
        for k in range(PLANS_PER_IMAGE):
            params = bytes([k % 3] + [rng.randrange(256) for _ in range(15)])
            (out / f"{name}-{k}").write_bytes(params + body)
            written += 1
    # JPEGs with restart markers every k MCUs (region decodes cut out the
    # intervals they need): their own random stream too.
    rng = random.Random(2)
    for name, body in restart.items():
        for k in range(PLANS_PER_IMAGE):
            params = bytes([k % 3] + [rng.randrange(256) for _ in range(15)])
            (out / f"{name}-{k}").write_bytes(params + body)
            written += 1
    report(out, written)


def restart_seeds(images):
    """Small test JPEGs rewritten by fastload.add_restart_markers with k up to
    1 and 4, and one of them cut short."""
    sys.path.insert(0, str(ROOT.parent))
    import fastload

    seeds = {}
    for path, _ in images:
        name = pathlib.Path(path).stem
        if not (name.startswith(("rgb_224", "tiny_17x33", "tiny_33x17", "prog_17x33",
                                 "cmyk_33x17")) and path.endswith(".jpg")):
            continue
        data = pathlib.Path(path).read_bytes()
        for k in (1, 4):
            body = fastload.add_restart_markers(data, max_interval=k)
            if len(body) <= MAX_BYTES:
                seeds[f"rst{k}_{name}"] = body
    body = seeds.get("rst1_rgb_224x224_420")
    if body:
        seeds["rst1_rgb_224x224_420_cut"] = body[: len(body) * 2 // 3]
    return seeds


# -------------------------------------------------------------- PNG, WebP

def png_chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def raw_png(samples, depth, color_type, interlace=False, extra=b""):
    """A PNG of (h, w, channels) samples at 8 or 16 bits, filter type 0,
    Adam7-interlaced on request: kinds Pillow does not write."""
    import numpy as np

    h, w = samples.shape[:2]
    dtype = ">u2" if depth == 16 else np.uint8

    def scanlines(part):
        return b"".join(b"\0" + row.astype(dtype).tobytes() for row in part.reshape(len(part), -1))

    passes = [(0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2),
              (0, 1, 1, 2)] if interlace else [(0, 0, 1, 1)]
    raw = b"".join(scanlines(samples[y0::dy, x0::dx]) for x0, y0, dx, dy in passes
                   if w > x0 and h > y0)
    ihdr = struct.pack(">IIBBBBB", w, h, depth, color_type, 0, 0, int(interlace))
    return (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) + extra
            + png_chunk(b"IDAT", zlib.compress(raw)) + png_chunk(b"IEND", b""))


def png_webp_seeds():
    """Small files of every kind the PNG and WebP decoders handle, and a few
    broken ones."""
    import numpy as np
    from PIL import Image, features

    gen = np.random.default_rng(0)
    h, w = 13, 21
    rgba = gen.integers(0, 256, (h, w, 4), dtype=np.uint8)

    def saved(img, fmt="PNG", **kw):
        buf = io.BytesIO()
        img.save(buf, fmt, **kw)
        return buf.getvalue()

    palette = Image.fromarray(rgba[:, :, 0] // 16).convert("P")
    palette.putpalette(bytes(range(48)))
    seeds = {
        "png-rgb": saved(Image.fromarray(rgba[:, :, :3])),
        "png-rgba": saved(Image.fromarray(rgba, "RGBA")),
        "png-gray": saved(Image.fromarray(rgba[:, :, 0])),
        "png-gray-alpha": saved(Image.fromarray(rgba[:, :, :2].copy(), "LA")),
        "png-1bit": saved(Image.fromarray(rgba[:, :, 0] > 127)),
        "png-palette4-trns": saved(palette, bits=4, transparency=2),
        "png-palette8": saved(palette),
        "png-gray16": saved(Image.fromarray(rgba[:, :, 0].astype(np.uint16) * 3)),
        "png-rgb16": raw_png(rgba[:, :, :3].astype(np.uint16) * 257, 16, 2),
        "png-interlaced-rgba": raw_png(rgba, 8, 6, interlace=True),
        "png-interlaced-gray16": raw_png(rgba[:, :, :1].astype(np.uint16) * 300, 16, 0,
                                         interlace=True),
        "png-apng": saved(Image.fromarray(rgba[:, :, :3]), save_all=True,
                          append_images=[Image.fromarray(rgba[::-1, :, :3].copy())]),
    }
    seeds["png-truncated"] = seeds["png-rgb"][:len(seeds["png-rgb"]) // 2]
    huge = png_chunk(b"IHDR", struct.pack(">IIBBBBB", 1 << 20, 1 << 20, 8, 2, 0, 0, 0))
    seeds["png-huge"] = seeds["png-rgb"][:8] + huge + seeds["png-rgb"][33:]
    if features.check("webp"):
        seeds.update({
            "webp-lossy": saved(Image.fromarray(rgba[:, :, :3]), "WEBP", quality=70),
            "webp-lossless": saved(Image.fromarray(rgba[:, :, :3]), "WEBP", lossless=True),
            "webp-alpha": saved(Image.fromarray(rgba, "RGBA"), "WEBP", quality=70),
            "webp-animated": saved(Image.fromarray(rgba, "RGBA"), "WEBP", save_all=True,
                                   append_images=[Image.fromarray(rgba[::-1].copy(), "RGBA")],
                                   duration=40),
        })
        seeds["webp-truncated"] = seeds["webp-lossy"][:len(seeds["webp-lossy"]) * 2 // 3]
    return seeds


def report(out, written):
    total = sum(f.stat().st_size for f in out.iterdir())
    print(f"{written} seeds, {total / 1024:.0f} KiB in {os.path.relpath(out)}")


# ------------------------------------------------------------------- tar

def tar_header(name, size, kind=b"0", prefix=b"", magic=b"ustar\x0000", size_field=None,
               checksum_delta=0, linkname=b""):
    """One raw 512-byte header block, its checksum computed (then shifted
    by checksum_delta to make a bad one).  tests/test_tar_index.py makes its
    hand-made shards with it too."""
    h = bytearray(512)
    h[0:len(name)] = name
    h[100:108] = b"0000644\0"
    h[108:116] = h[116:124] = b"0000000\0"
    h[124:136] = size_field if size_field is not None else b"%011o\0" % size
    h[136:148] = b"00000000000\0"
    h[156:157] = kind
    h[157:157 + len(linkname)] = linkname
    h[257:265] = magic
    h[345:345 + len(prefix)] = prefix
    h[148:156] = b" " * 8
    h[148:156] = b"%06o\0 " % (sum(h) + checksum_delta)
    return bytes(h)


def tar_member(name, data, **header):
    padding = b"\0" * (-len(data) % 512)
    return tar_header(name, len(data), **header) + data + padding


def pax_record(keyword, value):
    body = b" %s=%s\n" % (keyword, value)
    length = len(body) + 1
    while len(b"%d" % length) + len(body) != length:
        length += 1
    return b"%d" % length + body


END = b"\0" * 1024


def tarfile_shard(fmt, members, **kwargs):
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=fmt, **kwargs) as tar:
        for name, kind, data in members:
            info = tarfile.TarInfo(name)
            info.mtime = 0
            info.type = kind
            if kind == tarfile.SYMTYPE or kind == tarfile.LNKTYPE:
                info.linkname = data.decode()
                data = b""
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data else None)
    return buffer.getvalue()


def tar_seeds():
    reg, d = tarfile.REGTYPE, tarfile.DIRTYPE
    webdataset = [("shard", d, b"")]
    for i in range(3):
        webdataset += [(f"shard/{i:06d}.jpg", reg, bytes([i]) * (100 + i)),
                       (f"shard/{i:06d}.cls", reg, b"%d" % i),
                       (f"shard/{i:06d}.meta.JSON", reg, b"{}")]
    odd = [("__meta__", reg, b"m"), ("README", reg, b"no extension"), ("a/.hidden", reg, b"h"),
           ("empty.txt", reg, b""), ("link.txt", tarfile.SYMTYPE, b"empty.txt"),
           ("hard.txt", tarfile.LNKTYPE, b"empty.txt"), ("fifo", tarfile.FIFOTYPE, b"")]
    long_names = [("d" * 90 + "/" + "n" * 120 + ".txt", reg, b"long"),
                  ("l" * 150 + ".cls", tarfile.SYMTYPE, b"t" * 140)]
    many = [(f"{i:04d}.bin", reg, b"x" * (i % 3)) for i in range(20)]
    seeds = {
        "ustar-webdataset": tarfile_shard(tarfile.USTAR_FORMAT, webdataset + odd),
        "gnu-webdataset": tarfile_shard(tarfile.GNU_FORMAT, webdataset + odd),
        "pax-webdataset": tarfile_shard(tarfile.PAX_FORMAT, webdataset + odd),
        "gnu-long-names": tarfile_shard(tarfile.GNU_FORMAT, long_names),
        "pax-long-names": tarfile_shard(tarfile.PAX_FORMAT, long_names + [("é.txt", reg, b"u")]),
        "pax-global": tarfile_shard(tarfile.PAX_FORMAT, webdataset,
                                    pax_headers={"comment": "global"}),
        "ustar-many": tarfile_shard(tarfile.USTAR_FORMAT, many),
        "empty-archive": END * 5,
    }
    pax = pax_record(b"path", b"from/pax.txt") + pax_record(b"size", b"5")
    seeds["pax-size"] = (tar_member(b"PaxHeader", pax, kind=b"x")
                         + tar_header(b"short.txt", 0) + b"hello".ljust(512, b"\0") + END)
    seeds["base256-size"] = (tar_header(b"big.bin", 0, size_field=b"\x80" + b"\0" * 9 + b"\x02\x00")
                             + b"b" * 512 + END)
    seeds["v7-directory"] = tar_header(b"dir/", 0, kind=b"\0", magic=b"\0" * 8) + tar_member(
        b"dir/file.txt", b"v7", kind=b"\0", magic=b"\0" * 8) + END
    seeds["old-gnu-times"] = tar_member(b"name.txt", b"g", magic=b"ustar  \0",
                                        prefix=b"12345670123\0") + END
    seeds["ustar-prefix"] = tar_member(b"name.txt", b"p", prefix=b"some/prefix") + END
    seeds["trailing-garbage"] = tar_member(b"a.txt", b"a") + END + b"garbage" * 100
    seeds["duplicate-extension"] = tar_member(b"a.jpg", b"1") + tar_member(b"a.JPG", b"2") + END
    seeds["reserved-extension"] = tar_member(b"a.__key__", b"k") + END
    good = seeds["ustar-webdataset"]
    seeds["truncated-header"] = good[:512 * 3 + 100]
    seeds["cut-member"] = tar_member(b"a.txt", b"a" * 2000)[:1500]
    seeds["missing-padding"] = tar_header(b"a.txt", 10) + b"0123456789"
    seeds["bad-checksum"] = tar_member(b"a.txt", b"a") + tar_member(b"b.txt", b"b",
                                                                    checksum_delta=1) + END
    seeds["huge-size"] = tar_header(b"huge.bin", 0, size_field=b"77777777777\0") + END
    seeds["huge-base256"] = tar_header(b"huge.bin", 0, size_field=b"\x80" + b"\xff" * 11) + END
    seeds["dotdot"] = tar_member(b"ok/../../etc/passwd.txt", b"x") + END
    seeds["absolute"] = tar_member(b"/etc/passwd.txt", b"x") + END
    seeds["sparse"] = tar_header(b"sparse.bin", 0, kind=b"S") + END
    seeds["pax-sparse"] = tar_member(b"PaxHeader", pax_record(b"GNU.sparse.map", b"0,1"),
                                     kind=b"x") + tar_member(b"s.bin", b"s") + END
    seeds["pax-truncated"] = tar_member(b"PaxHeader", pax, kind=b"x") + END
    seeds["gzip"] = b"\x1f\x8b\x08\x00" + bytes(60)
    seeds["not-a-tar"] = bytes(range(256)) * 3
    seeds["short"] = b"ustar"
    return seeds


def tar_corpus():
    out = fresh_directory("tar")
    written = 0
    for name, data in tar_seeds().items():
        if len(data) <= MAX_BYTES:
            (out / name).write_bytes(data)
            written += 1
    report(out, written)


def crc32c(data):
    """CRC-32C in plain Python (the seeds need no package)."""
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 & -(crc & 1))
    return crc ^ 0xFFFFFFFF


def tf_frame(data, bad_length_crc=False, bad_data_crc=False):
    def masked(d):
        crc = crc32c(d)
        return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF

    length = struct.pack("<Q", len(data))
    return (length + struct.pack("<I", masked(length) ^ bad_length_crc) + data +
            struct.pack("<I", masked(data) ^ bad_data_crc))


def pb_varint(n):
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def pb_field(number, wire, payload):
    tag = pb_varint(number << 3 | wire)
    return tag + (pb_varint(len(payload)) + payload if wire == 2 else payload)


def tf_feature(kind, values, packed=True):
    """A Feature message, lists packed or not (written by hand: protobuf's
    own encoder always packs)."""
    if kind == "bytes":
        body = b"".join(pb_field(1, 2, v) for v in values)
    elif kind == "float":
        raw = [struct.pack("<f", v) for v in values]
        body = pb_field(1, 2, b"".join(raw)) if packed else \
            b"".join(pb_field(1, 5, r) for r in raw)
    else:
        raw = [pb_varint(v) for v in values]
        body = pb_field(1, 2, b"".join(raw)) if packed else \
            b"".join(pb_field(1, 0, r) for r in raw)
    return pb_field({"bytes": 1, "float": 2, "int64": 3}[kind], 2, body)


def tf_example(features):
    """An Example from {name: Feature bytes}."""
    return pb_field(1, 2, b"".join(pb_field(1, 2, pb_field(1, 2, name.encode()) +
                                            pb_field(2, 2, value))
                                   for name, value in features.items()))


def tfrecord_seeds():
    image = b"\xff\xd8\xff\xe0" + bytes(range(60)) + b"\xff\xd9"
    plain = tf_example({"image/encoded": tf_feature("bytes", [image]),
                        "image/class/label": tf_feature("int64", [7])})
    every = tf_example({"image/encoded": tf_feature("bytes", [image, b""]),
                        "image/class/label": tf_feature("int64", [-1, 2 ** 63 - 1], False),
                        "a": tf_feature("float", [1.5, -0.0, 3e38]),
                        "b": tf_feature("float", [2.5], False),
                        "c": tf_feature("int64", [0, 1, -(2 ** 63)])})
    wrong = tf_example({"image/encoded": tf_feature("int64", [1]),
                        "image/class/label": tf_feature("float", [1.0])})
    ragged = pb_field(2, 2, pb_field(1, 2, b"\0" * 5))
    seeds = {
        "empty": b"",
        "one": tf_frame(plain),
        "three": tf_frame(plain) + tf_frame(every) + tf_frame(wrong),
        "empty-example": tf_frame(b""),
        "bad-length-crc": tf_frame(plain, bad_length_crc=True),
        "bad-data-crc": tf_frame(plain) + tf_frame(every, bad_data_crc=True),
        "truncated": (tf_frame(plain) + tf_frame(every))[:-9],
        "huge-length": struct.pack("<Q", 2 ** 63) + b"\0" * 20,
        "header-only": tf_frame(plain)[:10],
        "unknown-fields": tf_frame(pb_field(9, 0, pb_varint(3)) + plain +
                                   pb_field(15, 1, b"x" * 8)),
        "group": tf_frame(plain + bytes([0x0B, 0x0C])),
        "long-varint": tf_frame(b"\x0a" + b"\xff" * 11),
        "example-only": every,
        # a packed float list of 5 bytes: not a whole number of floats
        "packed-float-ragged": tf_frame(pb_field(1, 2, pb_field(1, 2, pb_field(1, 2, b"a") +
                                                                pb_field(2, 2, ragged)))),
    }
    return seeds


def tfrecord_corpus():
    out = fresh_directory("tfrecord")
    written = 0
    for name, data in tfrecord_seeds().items():
        if len(data) <= MAX_BYTES:
            (out / name).write_bytes(data)
            written += 1
    report(out, written)


def main(targets):
    corpora = {"pipeline": pipeline_corpus, "tar": tar_corpus, "tfrecord": tfrecord_corpus}
    for target in targets or corpora:
        corpora[target]()


if __name__ == "__main__":
    main(sys.argv[1:])
