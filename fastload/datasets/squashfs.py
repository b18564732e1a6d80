"""Paths inside SquashFS images, read without mounting.

``"/data/train.sqfs:/train/cat/1.jpg"`` names the file ``/train/cat/1.jpg``
inside the image ``/data/train.sqfs``: the part before ``":/"`` must be an
existing regular file whose first bytes are SquashFS's magic ``hsqs``, else
the whole string is an ordinary path (a folder named ``"a:"`` stays one).
Of several ``":/"``, the leftmost whose left part is an image counts.
``ImageFolder``, ``ImageFiles``, ``WebDataset`` shards and every dataset
whose samples are files take such paths; the C workers read them with
libsquashfs (csrc/core/source/squashfs_read.c), each image opened once per
process.

Inside an image, symbolic links are not followed: ``walk_class`` and
``find_classes`` skip them (torchvision's walk would follow them on disk).

Built without libsquashfs, a path inside an image raises
``OSError(ENOTSUP, "fastload was built without SquashFS support ...")``;
``available()`` says which (``python -m fastload`` prints it).
"""

import io
import os
import stat as _stat

from fastload import _C

__all__ = ["available", "split", "is_image_path", "stat", "listdir", "read", "open_file",
           "walk_class", "find_classes"]

FILE, DIR, LINK, OTHER = 1, 2, 3, 4


def available():
    """Whether this fastload was built with libsquashfs."""
    return bool(_C.build_info().get("squashfs"))


def split(path):
    """``(image, inner)`` when ``path`` lies inside a SquashFS image, else
    None.  A path without ``":/"`` is answered without a system call."""
    if isinstance(path, os.PathLike):
        path = os.fspath(path)
    if (b":/" if isinstance(path, bytes) else ":/") not in path:
        return None
    return _C.squashfs_split(path)


def is_image_path(path):
    return split(path) is not None


class Stat:
    """What ``os.stat`` would say of a path inside an image (the fields
    SquashFS keeps; modification times in whole seconds)."""

    __slots__ = ("kind", "st_mode", "st_size", "st_mtime", "st_mtime_ns")

    def __init__(self, kind, mode, size, mtime):
        self.kind = kind
        type_bits = {FILE: _stat.S_IFREG, DIR: _stat.S_IFDIR, LINK: _stat.S_IFLNK}.get(kind, 0)
        self.st_mode = type_bits | (mode & 0o7777)
        self.st_size = size
        self.st_mtime = float(mtime)
        self.st_mtime_ns = mtime * 1_000_000_000

    def __repr__(self):
        return (f"squashfs.Stat(st_mode={oct(self.st_mode)}, st_size={self.st_size}, "
                f"st_mtime={self.st_mtime})")


def stat(path):
    """``Stat`` of a path inside an image; OSError (FileNotFoundError, ...)
    naming the image and the inner path."""
    return Stat(*_C.squashfs_stat(path))


def listdir(path):
    """``[(name, kind)]`` of a folder inside an image, names as bytes when
    ``path`` is bytes, else str; in the image's order (bytewise sorted)."""
    names, kinds = _C.squashfs_listdir(path)
    if not isinstance(path, bytes):
        names = [os.fsdecode(n) for n in names]
    return list(zip(names, kinds))


def read(path, offset=0, length=-1):
    """The bytes of a file inside an image (``length`` -1: to its end)."""
    return _C.squashfs_read(path, offset, length)


def open_file(path):
    """A file inside an image as a binary file object (its bytes in memory)."""
    return io.BytesIO(read(path))


def _join(top, name):
    return top + (b"/" if isinstance(top, bytes) else "/") + name if not \
        top.endswith(b"/" if isinstance(top, bytes) else "/") else top + name


def walk_class(top):
    """``ImageFolder``'s walk of one class folder inside an image: (folder,
    file names) sorted by folder, as ``sorted(os.walk(top))`` lists them
    (images hold no loops; links are skipped).  ``top`` is bytes."""
    found = []
    pending = [top]
    while pending:
        folder = pending.pop()
        try:
            entries = listdir(folder)
        except (FileNotFoundError, NotADirectoryError):
            continue  # os.walk reports nothing for it either
        found.append((folder, [n for n, k in entries if k == FILE]))
        pending.extend(_join(folder, n) for n, k in entries if k == DIR)
    found.sort()
    return found


def find_classes(directory):
    """The class folders of ``directory`` inside an image, sorted as
    torchvision sorts them (by str)."""
    return sorted(name for name, kind in listdir(os.fsdecode(directory)) if kind == DIR)
