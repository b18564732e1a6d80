"""ImageFolder's tree: listed in C, kept in an index file while it holds.

Listing a tree of millions of files is what makes a torchvision
``ImageFolder`` slow to construct, again at every start and on every rank.
``walk`` lists it with ``_C.dir_scan`` (every folder read with getdents64
on a few threads, in os.walk's order, csrc/core/source/dir_scan.h) and
keeps the result, the walk, in an index file: ``.fastload-folder-index``
in the tree's root, or in ``$FASTLOAD_INDEX_DIR`` (default
``~/.cache/fastload/shard-index``, as for shards' index files) when the root
is not writable.  A later construction reads that file and stats each
folder the walk reached (``_C.dir_check``, on the same threads): while every
folder keeps its (st_dev, st_ino, mtime_ns, ctime_ns, size), no entry was
added, removed or renamed anywhere in the tree, and the walk is reused.

Clocks are coarse (file systems stamp times from a clock that ticks every
few milliseconds, some every second or two): a folder changed in the same
tick as the scan read it keeps the time the scan recorded.  Folders whose
ctime or mtime lies within ``RACY_SECONDS`` of the scan are therefore
flagged racy and read again (their names hashed) at every check, until a
check finds them older; then the file is rewritten without the flag.

The index holds the whole walk (every file, folder by folder), not the
samples: the extension filter and ``is_valid_file`` run again at each
construction, so one index serves any of them.  The root's sub-folders (the
classes) are listed by ``find_classes`` at each construction and must be
the ones recorded.  An index that does not check out (another magic, a
short or damaged file, other classes) is ignored and rewritten; files are
written to a temporary name and renamed, so processes racing to write it
each leave a whole file and readers see one whole file or another.
"""

import hashlib
import json
import mmap
import os
import struct
import tempfile
import time

import numpy as np

from .. import _C
from .shard_index import _cache_dir

MAGIC = b"FLDIRIX1"
NAME = ".fastload-folder-index"
RACY_SECONDS = 3.0  # module constant: the tests set it to 0 to see a clean reuse
SCAN_THREADS = 8  # folders read at once: on network file systems latency, not CPU, bounds a scan
_PREFIX = struct.Struct("<QQQ")  # header length, body length, body checksum (the body 8-aligned)
_BYTES = ("tops", "folder_paths", "names", "check_paths")
_ARRAYS = ("top_folders", "folder_offsets", "folder_files", "check_offsets", "checks")
_CHECK_FIELDS = 7  # dev, ino, mtime_ns, ctime_ns, size, listing hash, racy (dir_scan.h)
_CHECK_CTIME, _CHECK_MTIME, _CHECK_RACY = 3, 2, 6


def _paths(root):
    """Where the index of the tree at ``root`` may be: in it, then in the
    cache folder (named by a hash of the root's absolute path)."""
    yield os.path.join(root, NAME)
    absolute = os.path.abspath(root)
    digest = hashlib.sha1(os.fsencode(absolute)).hexdigest()[:20]
    base = os.path.basename(absolute.rstrip(os.sep)) or "root"
    yield os.path.join(_cache_dir(), f"{digest}-{base}{NAME}")


def _prefix(root):
    """What torchvision puts before a class name: os.path.join(root, name)."""
    return os.fsencode(os.path.join(root, ""))


def walk(root, tops, index=True, threads=None):
    """The walk of the classes ``tops`` (bytes names) under ``root``, as
    ``_C.dir_scan`` gives it, and what it took: ``{"index": the index file's
    path or None, "reused": whether the walk came from it, "dirs_read":
    folders listed, "dirs_checked": folders stat'ed}``."""
    threads = SCAN_THREADS if threads is None else threads
    prefix = _prefix(root)
    tops = list(tops)
    if index:
        for path in _paths(root):
            found = _load(path, tops)
            if found is None:
                continue
            changed, reread = _C.dir_check(prefix, found, threads)
            if changed >= 0:
                continue
            info = {"index": path, "reused": True, "dirs_read": reread,
                    "dirs_checked": len(found["check_offsets"])}
            if reread:
                _clear_racy(path, found)
            return found, info
    racy_after = time.time_ns() - int(RACY_SECONDS * 1e9)
    found = _C.dir_scan(prefix, tops, threads, racy_after)
    found["tops"] = b"".join(t + b"\0" for t in tops)
    info = {"index": None, "reused": False, "dirs_read": found["dirs_read"], "dirs_checked": 0}
    if index and found["complete"]:
        info["index"] = save(root, found)
    return found, info


def _clear_racy(path, found):
    """After a check read the racy folders again and found them as recorded:
    those now older than RACY_SECONDS lose the flag, and the file is
    rewritten (atomically) when any did."""
    checks = np.array(found["checks"])
    racy_after = time.time_ns() - int(RACY_SECONDS * 1e9)
    still = (checks[:, _CHECK_CTIME] >= racy_after) | (checks[:, _CHECK_MTIME] >= racy_after)
    racy = checks[:, _CHECK_RACY] != 0
    if not (racy & ~still).any():
        return
    checks[:, _CHECK_RACY] = racy & still
    try:
        _write(path, dict(found, checks=checks))
    except OSError:
        pass  # an index file is a cache: the racy folders are read again next time


def save(root, found):
    """Writes the walk's index file in the root, else in the cache folder.
    Returns the path written, or None when neither takes it."""
    for path in _paths(root):
        try:
            _write(path, found)
            return path
        except OSError:
            continue
    return None


def _write(path, found):
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    layout, parts, at = {}, [], 0
    for name in _BYTES + _ARRAYS:
        value = found[name]
        data = bytes(value) if name in _BYTES else np.ascontiguousarray(value, "<i8").tobytes()
        layout[name] = [at, len(data)]
        parts.append(data)
        parts.append(b"\0" * (-len(data) % 8))
        at += len(data) + (-len(data) % 8)
    body = b"".join(parts)
    header = json.dumps({"layout": layout, "checks": len(found["check_offsets"])}).encode()
    header += b" " * (-len(header) % 8)
    fd, temp = tempfile.mkstemp(prefix=".fastload-index-", suffix=".tmp", dir=directory)
    try:
        os.fchmod(fd, 0o644)  # mkstemp's 0600 would hide it from the tree's other users
        with os.fdopen(fd, "wb") as f:
            f.write(MAGIC + _PREFIX.pack(len(header), len(body), _C.dir_checksum(body)) + header)
            f.write(body)
        os.replace(temp, path)
    except BaseException:
        try:
            os.unlink(temp)
        except OSError:
            pass
        raise


def _load(path, tops):
    """The walk kept at ``path`` for these tops, or None (no file, another
    version's, damaged, or for other classes).  The file is mapped, not
    read: the walk's names stay in the page cache, viewed, not copied."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < len(MAGIC) + _PREFIX.size:
                return None
            data = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ)
    except (OSError, ValueError):
        return None
    start = len(MAGIC) + _PREFIX.size
    if data[:len(MAGIC)] != MAGIC:
        return None
    header_length, body_length, checksum = _PREFIX.unpack_from(data, len(MAGIC))
    if start + header_length + body_length != size:
        return None
    body = memoryview(data)[start + header_length:]
    if _C.dir_checksum(body) != checksum:
        return None
    try:
        header = json.loads(data[start:start + header_length])
        layout = header["layout"]
        found = {}
        for name in _BYTES + _ARRAYS:
            at, length = (int(v) for v in layout[name])
            if at < 0 or length < 0 or at + length > body_length or at % 8 or length % 8 and \
                    name in _ARRAYS:
                return None
            raw = body[at:at + length]
            found[name] = raw if name in _BYTES else np.frombuffer(raw, "<i8")
        checks = int(header["checks"])
    except (ValueError, KeyError, TypeError):
        return None
    if found["tops"] != b"".join(t + b"\0" for t in tops):
        return None
    if found["checks"].size != checks * _CHECK_FIELDS or len(found["check_offsets"]) != checks:
        return None
    found["checks"] = found["checks"].reshape(checks, _CHECK_FIELDS)
    found["complete"] = True
    found["dirs_read"] = 0
    return found
