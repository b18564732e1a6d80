"""add_restart_markers: JPEG bytes rewritten losslessly with restart markers.

A region decode of a plain JPEG entropy-decodes every row above the region,
across the whole width: Huffman-coded data has no random access.  With a
restart marker every k MCUs, k dividing the MCUs of a row, each interval
stands alone, and fastload's decoder reads only the intervals a crop covers
(csrc/core/image/jpeg_restart.h).  The rewrite keeps the DCT coefficients
as they are (as ``jpegtran -restart`` does): the decoded pixels are the
original's, by any decoder.
"""

from .. import _C
from ..transforms.ops import PILLOW_MAX_PIXELS

_JPEG_MAGIC = b"\xff\xd8\xff"


def add_restart_markers(data, *, max_interval=4, optimize=True, max_pixels=PILLOW_MAX_PIXELS):
    """add_restart_markers(data, *, max_interval=4, optimize=True, max_pixels=PILLOW_MAX_PIXELS) -> bytes

    The JPEG ``data`` (bytes-like) rewritten losslessly with a restart
    marker every k MCUs, k the largest divisor of the MCUs in a row that is
    at most ``max_interval``: the same DCT coefficients, so every decoder
    gives the same pixels, in a sequential (baseline) file (a progressive
    file becomes sequential, which also decodes faster).  ``optimize``:
    Huffman tables fitted to the image, twice the rewrite's time for about
    3 % fewer bytes.  Only what decoding needs is kept: EXIF, ICC profiles
    and comments are dropped.  Typically 2 % larger (5 % without
    ``optimize``).

    fastload decodes a crop of such a file (RandomResizedCrop,
    CenterCrop) from the intervals that cover it, skipping the entropy
    decoding of the rest.

    Raises fastload.DecodeError for input that is not a JPEG it can read
    (corrupt, truncated, lossless), or larger than ``max_pixels`` pixels.
    """
    if isinstance(max_interval, bool) or not isinstance(max_interval, int) \
            or not 1 <= max_interval <= 65535:
        raise ValueError(f"max_interval must be an integer from 1 to 65535, got {max_interval!r}")
    out, _ = _C.add_restart_markers(bytes(data), max_interval, bool(optimize), int(max_pixels))
    return out


def rewrite_if_jpeg(data, max_pixels=PILLOW_MAX_PIXELS):
    """``data`` with restart markers when it is a JPEG that can be rewritten;
    otherwise ``data`` unchanged (other formats, and JPEGs the rewrite
    refuses, which then fail at decode time as they would have)."""
    if not bytes(data[:3]) == _JPEG_MAGIC:
        return data
    try:
        out, _ = _C.add_restart_markers(bytes(data), 4, True, int(max_pixels))
    except (_C.DecodeError, MemoryError):
        return data
    return out
