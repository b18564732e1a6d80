"""A generated corpus of damaged JPEGs, made from good ones: truncated at
every segment, bit flips in headers and in entropy-coded data, wrong and
huge declared dimensions, empty files, and text files named .jpg.

Used by tests/test_corrupt_corpus.py and benchmarks/soak.py.
"""

import random

MARKER_NAMES = {0xD8: "SOI", 0xC0: "SOF0", 0xC1: "SOF1", 0xC2: "SOF2", 0xC4: "DHT",
                0xDB: "DQT", 0xDD: "DRI", 0xDA: "SOS", 0xD9: "EOI", 0xFE: "COM"}


def segments(data):
    """[(offset, name)] of the marker segments up to the first scan, the
    scan itself and the EOI."""
    out = [(0, "SOI")]
    pos = 2
    while pos + 4 <= len(data) and data[pos] == 0xFF:
        marker = data[pos + 1]
        name = MARKER_NAMES.get(marker, f"APP{marker - 0xE0}" if 0xE0 <= marker <= 0xEF
                                else f"0x{marker:02X}")
        out.append((pos, name))
        length = (data[pos + 2] << 8) | data[pos + 3]
        if marker == 0xDA:
            out.append((pos + 2 + length, "scan data"))
            break
        pos += 2 + length
    out.append((len(data) - 2, "EOI"))
    return out


def sof_offset(data):
    for pos, name in segments(data):
        if name.startswith("SOF"):
            return pos
    raise ValueError("no SOF marker")


def with_size(data, width, height):
    sof = sof_offset(data)
    out = bytearray(data)
    out[sof + 5:sof + 7] = height.to_bytes(2, "big")
    out[sof + 7:sof + 9] = width.to_bytes(2, "big")
    return bytes(out)


def damaged(name, data, seed=0, flips=24):
    """[(kind, bytes)] of damaged variants of one good JPEG `name`."""
    rng = random.Random(seed)
    cases = []
    for pos, segment in segments(data):
        for delta in (0, 1, 3):
            cut = pos + delta
            if 0 <= cut < len(data):
                cases.append((f"{name}: truncated at {segment}+{delta}", data[:cut]))
    scan = next(pos for pos, seg in segments(data) if seg == "scan data")
    cases.append((f"{name}: truncated mid-scan", data[:(scan + len(data)) // 2]))
    for i in range(flips):
        lo, hi = (2, scan) if i % 2 == 0 else (scan, len(data) - 2)
        out = bytearray(data)
        pos = rng.randrange(lo, hi)
        out[pos] ^= 1 << rng.randrange(8)
        where = "header" if i % 2 == 0 else "entropy data"
        cases.append((f"{name}: bit flip in {where} at {pos}", bytes(out)))
    cases.append((f"{name}: zero width", with_size(data, 0, 10)))
    cases.append((f"{name}: declared 60000x60000", with_size(data, 60000, 60000)))
    cases.append((f"{name}: declared larger than coded", with_size(data, 4000, 3000)))
    cases.append((f"{name}: declared smaller than coded", with_size(data, 8, 8)))
    return cases


def not_jpegs():
    return [("empty file", b""), ("text named .jpg", b"just some text, not an image\n" * 4),
            ("two bytes of SOI", b"\xff\xd8"), ("SOI then garbage", b"\xff\xd8\xff" + bytes(500))]
