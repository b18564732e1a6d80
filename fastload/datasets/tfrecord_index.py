"""Where a TFRecord file's records lie: index files in DALI's
``tfrecord2idx`` format, and GZIP files' decompressed copies.

An index file is text, one line a record: its offset in the file and its
size with the framing (``16 + length``), as DALI's ``tfrecord2idx`` and the
``tfrecord`` package's ``tfrecord.tools.tfrecord2idx`` write it.  A
``TFRecordDataset`` reads the index given, else the one beside the file
(``<file>.idx``) or in the cache folder (``$FASTLOAD_INDEX_DIR``, default
``~/.cache/fastload/tfrecord-index``), and builds one when none is there or
the one found does not describe the file as it is now (records not back to
back, not ending at the file's end, or older than the file): an index found
is a cache, never the truth.  Building one reads each record's 12-byte
header (``_C.tfrecord_index``, the length's CRC checked).

A GZIP-compressed file cannot be read at an offset, so it is decompressed
once, sequentially, into a plain TFRecord file in the cache folder
(``$FASTLOAD_TFRECORD_DIR``, default ``~/.cache/fastload/tfrecord``), named
by a hash of the file's path, size and modification time; the copy is then
indexed and read like any other file, by every worker and process, and
reused while the compressed file is unchanged.
"""

import gzip
import hashlib
import os
import shutil
import tempfile

import numpy as np

from .. import _C

__all__ = ["write_tfrecord_index", "read_index", "records_of", "decompressed"]

SUFFIX = ".idx"


def _index_dir():
    return os.environ.get("FASTLOAD_INDEX_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "fastload", "tfrecord-index")


def _copy_dir():
    return os.environ.get("FASTLOAD_TFRECORD_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "fastload", "tfrecord")


def _digest(path, extra=b""):
    return hashlib.sha1(os.fsencode(os.path.abspath(path)) + extra).hexdigest()[:20]


def _index_paths(path):
    """Where the index of ``path`` may be: beside it, then in the cache."""
    yield path + SUFFIX
    yield os.path.join(_index_dir(), f"{_digest(path)}-{os.path.basename(path)}{SUFFIX}")


def read_index(index_path):
    """The (offset, size) rows of a ``tfrecord2idx`` index file, as an int64
    array; ValueError when it is not one."""
    with open(index_path, "rb") as f:
        text = f.read()
    try:
        values = np.array(text.split(), dtype=np.int64)
    except ValueError:
        raise ValueError(f"{index_path}: not a tfrecord2idx index (lines of 'offset size')") \
            from None
    if values.size % 2:
        raise ValueError(f"{index_path}: not a tfrecord2idx index (an odd number of values)")
    return values.reshape(-1, 2)


def _describes(rows, size):
    """Whether index rows describe a file of ``size`` bytes: records back to
    back from offset 0 to the end, each at least its framing."""
    if len(rows) == 0:
        return size == 0
    offsets, sizes = rows[:, 0], rows[:, 1]
    return (offsets[0] == 0 and bool(np.all(sizes >= 16))
            and bool(np.all(offsets[1:] == offsets[:-1] + sizes[:-1]))
            and int(offsets[-1] + sizes[-1]) == size)


def _write(index_path, rows):
    directory = os.path.dirname(index_path) or "."
    os.makedirs(directory, exist_ok=True)
    text = "".join(f"{o} {s}\n" for o, s in rows.tolist())
    fd, temp = tempfile.mkstemp(prefix=".", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(temp, index_path)  # a reader sees the old file or the new one
    except BaseException:
        try:
            os.unlink(temp)
        except OSError:
            pass
        raise


def write_tfrecord_index(path, index_path=None, verify=True):
    """write_tfrecord_index(path, index_path=None, verify=True)

    Indexes the TFRecord file ``path`` and writes the index in DALI's
    ``tfrecord2idx`` format (a line ``offset size`` a record) to
    ``index_path``; None: beside the file (``<path>.idx``), else, when that
    folder is not writable, in the cache folder ``TFRecordDataset`` looks
    in.  ``verify``: check each record's length CRC.  Returns the path
    written.  OSError when the file cannot be read, ``fastload.DecodeError``
    naming the record for a corrupt length or a truncated record."""
    path = os.fspath(path)
    rows = _C.tfrecord_index(path, verify)
    if index_path is not None:
        _write(os.fspath(index_path), rows)
        return os.fspath(index_path)
    error = None
    for candidate in _index_paths(path):
        try:
            _write(candidate, rows)
            return candidate
        except OSError as e:
            error = e
    raise error


def records_of(path, index_path=None, verify=True):
    """The (offset, size) rows of the records of ``path``: from
    ``index_path`` (ValueError when it does not describe the file), else
    from an index found beside the file or in the cache and still valid,
    else indexed now (and the index saved where it can be)."""
    st = os.stat(path)
    if index_path is not None:
        rows = read_index(index_path)
        if not _describes(rows, st.st_size):
            raise ValueError(f"{os.fspath(index_path)} does not describe {path} "
                             f"({st.st_size} bytes): a stale index?")
        return rows
    for candidate in _index_paths(path):
        try:
            if os.stat(candidate).st_mtime_ns < st.st_mtime_ns:
                continue  # written before the file last changed
            rows = read_index(candidate)
        except (OSError, ValueError):
            continue
        if _describes(rows, st.st_size):
            return rows
    rows = _C.tfrecord_index(path, verify)
    for candidate in _index_paths(path):
        try:
            _write(candidate, rows)
            break
        except OSError:
            continue
    return rows


def decompressed(path):
    """The path of a plain copy of the GZIP-compressed TFRecord ``path``,
    made now unless one made from the file as it is is there already."""
    st = os.stat(path)
    stamp = f"{st.st_size}:{st.st_mtime_ns}".encode()
    copy = os.path.join(_copy_dir(), f"{_digest(path, stamp)}-{os.path.basename(path)}")
    if os.path.exists(copy):
        return copy
    os.makedirs(_copy_dir(), exist_ok=True)
    fd, temp = tempfile.mkstemp(prefix=".", suffix=".tmp", dir=_copy_dir())
    try:
        with os.fdopen(fd, "wb") as out, gzip.open(path, "rb") as f:
            shutil.copyfileobj(f, out, 1 << 20)
        os.replace(temp, copy)  # whole or not there: a concurrent maker writes the same
    except BaseException:
        try:
            os.unlink(temp)
        except OSError:
            pass
        raise
    return copy
