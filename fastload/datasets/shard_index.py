"""Index files of WebDataset shards: the member index written once, read
instead of the shard's headers.

Indexing a shard reads the header of every member (``_C.tar_index``) and
every label member: about 5 s per million samples on one core, again on
every rank and at every start.  The index file keeps what that produced:
the member index (names, data offsets and sizes, WebDataset's grouping into
samples) and what the reader derived from it (each sample's image range per
list of image extensions, its labels per label extension, its key), valid
while the shard keeps its size and modification time.  ``write_shards`` writes it beside
each shard; ``WebDataset`` reads it, or builds it on first use and saves it
beside the shard, or in ``$FASTLOAD_INDEX_DIR`` (default
``~/.cache/fastload/shard-index``) when the shard's folder is read-only.

A file is ``MAGIC``; a fixed prefix (the length of a JSON header, the
shard's size and mtime, its sample count); the header (each array's dtype,
length, offset and CRC-32); then the arrays, each 8-byte aligned, read one
by one as they are needed.  Opening a file reads the prefix only, so a
dataset of many shards learns each one's sample count with a stat and one
small read, and parses the rest of a shard's index when it first reads the
shard.  Anything that does not check out (another magic, a short file, a
stale shard, an array whose CRC differs) is ignored and the shard indexed
again: an index file is a cache, never the truth.
"""

import hashlib
import json
import os
import struct
import tempfile
import zlib

import numpy as np

from . import squashfs

MAGIC = b"FLSHIDX2"
SUFFIX = ".fastload-index"
_PREFIX = struct.Struct("<QQqQ")  # header length, shard size, shard mtime_ns, samples
# The arrays of _C.tar_index's dict (its "names" is bytes, kept as uint8).
_MEMBER_ARRAYS = ("name_offsets", "offsets", "sizes", "key_lengths", "sample_members",
                  "sample_starts")


def _cache_dir():
    return os.environ.get("FASTLOAD_INDEX_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "fastload", "shard-index")


def _paths(shard):
    """Where the index of ``shard`` may be: beside it, then in the cache
    folder (named by a hash of the shard's absolute path)."""
    yield shard + SUFFIX
    absolute = os.path.abspath(shard)
    digest = hashlib.sha1(os.fsencode(absolute)).hexdigest()[:20]
    yield os.path.join(_cache_dir(), f"{digest}-{os.path.basename(shard)}{SUFFIX}")


def _identity(shard):
    st = squashfs.stat(shard) if squashfs.is_image_path(shard) else os.stat(shard)
    return st.st_size, st.st_mtime_ns


def _pread(path, size, offset):
    """``size`` bytes at ``offset`` of ``path`` (fewer at its end), which may
    lie inside a SquashFS image (an index file made before the image was)."""
    if squashfs.is_image_path(path):
        st = squashfs.stat(path)
        return squashfs.read(path, min(offset, st.st_size),
                             max(0, min(size, st.st_size - offset)))
    with open(path, "rb") as f:
        return os.pread(f.fileno(), size, offset)


def load(shard):
    """The shard's ``IndexFile``, or None when there is none that matches the
    shard as it is now."""
    try:
        identity = _identity(shard)
    except OSError:
        return None  # the shard itself: indexing says what is wrong
    for path in _paths(shard):
        # Inside an image, modification times are whole seconds: an index
        # file written beside the shard before the image was made recorded
        # the nanoseconds.
        found = IndexFile.open(path, identity, whole_seconds=squashfs.is_image_path(shard))
        if found is not None:
            return found
    return None


class IndexFile:
    """An index file whose prefix checked out: its header is parsed, and
    each array read and checked, when first asked for (a reader that finds
    what it derived last time reads neither the member index nor the names
    it does not need).  Each array has its own CRC-32."""

    def __init__(self, path, samples, header_length):
        self.path = path
        self.samples = samples  # the shard's sample count
        self._header_length = header_length
        self._layout_read = None  # name -> (dtype, count, offset, crc32)

    @classmethod
    def open(cls, path, identity, whole_seconds=False):
        try:
            head = _pread(path, len(MAGIC) + _PREFIX.size, 0)
        except OSError:
            return None
        if len(head) != len(MAGIC) + _PREFIX.size or head[:len(MAGIC)] != MAGIC:
            return None  # not an index this version wrote
        length, size, mtime_ns, samples = _PREFIX.unpack_from(head, len(MAGIC))
        if whole_seconds:
            mtime_ns -= mtime_ns % 1_000_000_000
        if (size, mtime_ns) != identity:
            return None
        return cls(path, samples, length)

    @property
    def _layout(self):
        """The header's array layout, parsed on first use; OSError when the
        file no longer holds a valid one (replaced or damaged since)."""
        if self._layout_read is None:
            start = len(MAGIC) + _PREFIX.size
            try:
                header = json.loads(_pread(self.path, self._header_length, start))
                layout = {name: (np.dtype(dtype), int(count), int(offset), int(crc))
                          for name, (dtype, count, offset, crc) in header["arrays"].items()}
            except (ValueError, KeyError, TypeError, AttributeError) as error:
                raise OSError(f"{self.path}: the header does not check out") from error
            if not set(_MEMBER_ARRAYS) | {"names"} <= set(layout) or \
                    layout["sample_starts"][1] != self.samples + 1:
                raise OSError(f"{self.path}: the header does not check out")
            self._layout_read = layout
        return self._layout_read

    def __contains__(self, name):
        return name in self._layout

    def length(self, name):
        return self._layout[name][1]

    def get(self, name):
        """Array ``name``, read and checked; OSError when the file no longer
        holds it (replaced or damaged since it was opened)."""
        dtype, count, offset, crc = self._layout[name]
        data = _pread(self.path, count * dtype.itemsize, offset)
        if len(data) != count * dtype.itemsize or zlib.crc32(data) != crc:
            raise OSError(f"{self.path}: array {name!r} does not check out")
        return np.frombuffer(data, dtype)

    def member_index(self):
        """The shard's member index, as ``_C.tar_index`` gives it."""
        index = {name: self.get(name) for name in _MEMBER_ARRAYS}
        index["names"] = self.get("names").tobytes()
        return index

    def kept(self):
        """The arrays a reader kept here, by name (read now)."""
        return {name: self.get(name) for name in self._layout
                if name not in _MEMBER_ARRAYS and name != "names"}


def save(shard, index, kept=None):
    """Writes the index file of ``shard``: its member index (``_C.tar_index``)
    and the int64 arrays in ``kept`` (by name), beside the shard, else in the
    cache folder, atomically (a reader sees the old file or the new one).
    Returns the path written, or None when neither place takes it."""
    try:
        identity = _identity(shard)
    except OSError:
        return None
    arrays = {name: np.ascontiguousarray(index[name], np.int64) for name in _MEMBER_ARRAYS}
    arrays["names"] = np.frombuffer(index["names"], np.uint8)
    for name, values in (kept or {}).items():
        arrays[name] = np.ascontiguousarray(values, np.int64)
    for path in _paths(shard):
        try:
            _write(path, identity, arrays)
            return path
        except OSError:
            continue
    return None


def _write(path, identity, arrays):
    if squashfs.is_image_path(path):  # beside a shard inside an image: read-only
        raise OSError(f"{path}: inside a SquashFS image")
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    # The arrays start after the header, whose length depends on their
    # offsets: guess its room, and grow the guess until the header fits.
    room = 512
    crcs = {name: zlib.crc32(array.tobytes()) for name, array in arrays.items()}
    start = len(MAGIC) + _PREFIX.size
    while True:
        at = _aligned(start + room)
        body, layout = at, {}
        for name, array in arrays.items():
            layout[name] = [array.dtype.str, len(array), at, crcs[name]]
            at = _aligned(at + array.nbytes)
        header = json.dumps({"arrays": layout}).encode()
        if len(header) <= room:
            header = header.ljust(room)
            break
        room = _aligned(len(header) + 64)
    size, mtime_ns = identity
    prefix = _PREFIX.pack(len(header), size, mtime_ns, len(arrays["sample_starts"]) - 1)
    fd, temp = tempfile.mkstemp(prefix=".", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(MAGIC + prefix + header)
            f.write(b"\0" * (body - start - len(header)))
            f.write(_body(arrays, layout, body))
        os.replace(temp, path)
    except BaseException:
        try:
            os.unlink(temp)
        except OSError:
            pass
        raise


def _body(arrays, layout, start):
    """The arrays laid out from file offset ``start``, padding included."""
    out = bytearray()
    for name, array in arrays.items():
        out += b"\0" * (layout[name][2] - start - len(out))
        out += array.tobytes()
    return bytes(out)


def _aligned(n):
    return (n + 7) & ~7
