"""Encoded images in a binary column of an Arrow table, decoded, transformed
and collated by the C image pipeline like ImageFolder's files.

Three inputs, one dataset:

* an uncompressed Arrow IPC file: memory-mapped, each image a byte range
  of the file, read by the C readers from the file itself (the ``ranges``
  route of tar shards);
* a ``pyarrow.Table`` in memory, or a Parquet file read into one (its
  image and label columns only): each image is read in place from the
  table's buffers, which the dataset keeps alive;
* a Hugging Face ``datasets.Dataset``: its Arrow table (memory-mapped from
  its cache files, or in memory) and its indices mapping after
  ``select``/``shuffle``/``filter``.  Hugging Face's ``Image()`` column is a
  struct ``{bytes, path}``: images held as bytes are read in place; a column
  whose images are all file paths becomes a list of files.
"""

import os

import numpy as np

from ..cache import file_identity
from ..images import ImageFiles
from ._common import hf_table, is_hf_dataset
from ...transforms.ops import PILLOW_MAX_PIXELS


class ArrowImages(ImageFiles):
    """``ArrowImages(source, image_column="image", label_column="label", ...)``:
    the images of a binary (or Hugging Face ``Image()``) column, with the
    options of :class:`fastload.ImageFiles`. ``source`` is an Arrow IPC file,
    a Parquet file (``.parquet``), a ``pyarrow.Table`` or a Hugging Face
    ``datasets.Dataset``. Compressed IPC files are refused: their buffers are
    not byte ranges of the file.  ``cache``, ``cache_size`` and
    ``cache_decoded`` as for ``ImageFiles``; a table in memory keeps decoded
    images only (its bytes are in memory already), and a bare
    ``pyarrow.Table`` only in ``cache="memory"``."""

    _memory = None  # (buffers, which): the images lie in these buffers
    _identity = b""  # what names a table's contents in a cache's key

    def __init__(self, source, image_column="image", label_column="label", transform=None,
                 target_transform=None, decode="fast", on_error="raise", **kwargs):
        import pyarrow as pa

        setup = dict(transform=transform, target_transform=target_transform, decode=decode,
                     on_error=on_error, max_pixels=kwargs.pop("max_pixels", PILLOW_MAX_PIXELS),
                     loader=kwargs.pop("loader", None), cache=kwargs.pop("cache", None),
                     cache_size=kwargs.pop("cache_size", None),
                     cache_decoded=kwargs.pop("cache_decoded", False))
        if kwargs:
            raise TypeError(f"unexpected arguments: {sorted(kwargs)}")
        indices = None
        if isinstance(source, pa.Table):
            table, name = source, "Arrow table"
        elif is_hf_dataset(source):
            table, indices, name = hf_table(source)
        elif isinstance(source, (str, bytes, os.PathLike)):
            path = os.fsdecode(os.fspath(source))
            if not path.endswith(".parquet"):
                self._from_ipc_file(path, image_column, label_column, setup)
                return
            table, name = _read_parquet(path, image_column, label_column), path
        else:
            raise TypeError("ArrowImages takes an Arrow IPC or Parquet file's path, a "
                            "pyarrow.Table or a Hugging Face datasets.Dataset, got "
                            f"{type(source).__name__}")
        if image_column not in table.column_names:
            raise ValueError(f"{name}: no column {image_column!r} "
                             f"(columns: {table.column_names})")
        labels = _labels(table, label_column, name)
        column = table.column(image_column)
        paths = _path_only(column, name, image_column)
        if paths is not None:
            if indices is not None:
                paths, labels = [paths[i] for i in indices], labels[indices]
            self._setup(paths, labels, **setup)
            return
        buffers, which, ranges = _in_place(column, name, image_column)
        if indices is not None:
            which, ranges, labels = which[indices], ranges[indices], labels[indices]
        if setup["cache"] is not None:
            self._identity = _identity(source, indices, image_column, setup)
        self._memory = (buffers, np.ascontiguousarray(which))
        blob = os.fsencode(f"{name}, column {image_column!r}") + b"\0"
        self._setup((blob, np.zeros(len(which), np.int64)), labels,
                    ranges=np.ascontiguousarray(ranges), **setup)

    def _from_ipc_file(self, path, image_column, label_column, setup):
        import pyarrow as pa
        import pyarrow.ipc  # noqa: F401

        try:
            mapping = pa.memory_map(path, "r")
            table = pa.ipc.open_file(mapping).read_all()
        except Exception as e:  # noqa: BLE001 (pyarrow raises ArrowInvalid, OSError)
            raise ValueError(f"cannot read {path!r} as an Arrow IPC file: {e}") from e
        mapping.seek(0)
        whole = mapping.read_buffer(mapping.size())  # zero-copy: the mapping itself
        if image_column not in table.column_names:
            raise ValueError(f"{path!r}: no column {image_column!r} "
                             f"(columns: {table.column_names})")
        ranges = []
        for chunk in _binary_chunks(table.column(image_column), repr(path), image_column):
            _, offsets_buf, data_buf = chunk.buffers()
            start = 0 if data_buf is None else data_buf.address - whole.address
            if data_buf is not None and not (0 <= start and start + data_buf.size <= whole.size):
                raise ValueError(f"{path!r}: column {image_column!r} is not a byte range of "
                                 "the file (compressed IPC files are not supported)")
            ranges.append(_spans(chunk, offsets_buf) + [start, 0])
        ranges = np.concatenate(ranges) if ranges else np.zeros((0, 2), np.int64)
        blob = os.fsencode(path) + b"\0"
        self._setup((blob, np.zeros(len(ranges), np.int64)),
                    _labels(table, label_column, repr(path)),
                    ranges=np.ascontiguousarray(ranges), **setup)

    def _cache_salt(self):
        return self._identity

    def _image_source(self, plan, skip, gpu_split=None):
        if self._memory is None:
            return super()._image_source(plan, skip, gpu_split)
        from ... import _C
        from ..images import _fallback
        return _C.ImageSource(self._paths, self._offsets, self._labels, plan,
                              exact=self.decode == "exact", max_pixels=self.max_pixels,
                              skip=skip, fallback=_fallback(), ranges=self._ranges,
                              fallback_all=self._fallback_all, memory=self._memory,
                              cache=self.cache._native if self.cache is not None else None,
                              cache_pixels=self.cache is not None, gpu_split=gpu_split)


def _identity(source, indices, image_column, setup):
    """What names the images of a table held in memory, for the key of a
    cache (which keeps their pixels only: the bytes are in memory already):
    a Parquet file's path, size and time; a Hugging Face dataset's
    fingerprint and indices.  A bare table has none, so only a cache in
    memory (the dataset's own) may keep it."""
    if not setup["cache_decoded"]:
        raise ValueError("the images of a table in memory are in memory already: its cache= "
                         "keeps the decoded images only; pass cache_decoded=True")
    if isinstance(source, (str, bytes, os.PathLike)):
        name = b"parquet" + file_identity(os.fsdecode(os.fspath(source)))
    elif is_hf_dataset(source):
        name = f"datasets\0{getattr(source, '_fingerprint', '')}".encode()
    elif setup["cache"] == "memory":
        name = b"table"
    else:
        raise ValueError("a pyarrow.Table has no file a shared cache's key could check: use "
                         "cache='memory', or give ArrowImages the file")
    order = b"" if indices is None else np.asarray(indices, np.int64).tobytes()
    return name + f"\0{image_column}\0".encode() + order


def _read_parquet(path, image_column, label_column):
    import pyarrow.parquet as pq

    try:
        names = pq.read_schema(path).names
        wanted = [c for c in (image_column, label_column) if c in names]
        return pq.read_table(path, columns=wanted or None)
    except Exception as e:  # noqa: BLE001 (pyarrow raises ArrowInvalid, OSError)
        raise ValueError(f"cannot read {path!r} as a Parquet file: {e}") from e


def _labels(table, label_column, name):
    if label_column is None or label_column not in table.column_names:
        return np.zeros(table.num_rows, np.int64)
    column = table.column(label_column)
    if column.null_count:
        raise ValueError(f"{name}: column {label_column!r} has null labels")
    column = _copied(column, f"column {label_column!r} of {name}")
    return np.array(column.to_numpy(), np.int64)  # a copy: never a view of a mapping


def _copied(column, what):
    """The chunks of ``column`` with their buffers copied out (under the C
    bus-error guard): a table memory-mapped from a file lends views of the
    mapping, and a file cut short under them would end the process with
    SIGBUS when NumPy reads them; the copy raises OSError naming the file.
    Nested and dictionary chunks are left as they are."""
    import pyarrow as pa

    chunks = []
    for chunk in column.chunks:
        if chunk.type.num_fields or pa.types.is_dictionary(chunk.type):
            chunks.append(chunk)
            continue
        buffers = [None if buf is None else _copied_buffer(buf, what)
                   for buf in chunk.buffers()]
        chunks.append(pa.Array.from_buffers(chunk.type, len(chunk), buffers,
                                            null_count=chunk.null_count, offset=chunk.offset))
    return pa.chunked_array(chunks, column.type)


def _copied_buffer(buf, what):
    """A copy of a pyarrow buffer made under the C bus-error guard (see
    ``_copied``)."""
    import pyarrow as pa

    from ... import _C

    out = bytearray(buf.size)
    _C.copy_mapped(buf, out, what)
    return pa.py_buffer(out)


def _first_null(chunks):
    """The table row of the first null value of ``chunks``, or None."""
    row = 0
    for chunk in chunks:
        if chunk.null_count:
            return row + int(np.flatnonzero(~np.asarray(chunk.is_valid()))[0])
        row += len(chunk)
    return None


def _binary_chunks(column, name, image_column):
    """The column's chunks, checked to be binary with no null image."""
    import pyarrow as pa

    for chunk in column.chunks:
        if not (pa.types.is_binary(chunk.type) or pa.types.is_large_binary(chunk.type)):
            raise ValueError(f"{name}: column {image_column!r} is {chunk.type}, "
                             "not binary (or Hugging Face's Image() struct)")
    row = _first_null(column.chunks)
    if row is not None:
        raise ValueError(f"{name}: column {image_column!r} has no image at row {row}")
    return column.chunks


def _spans(chunk, offsets_buf):
    """(offset, size) of each value of a binary chunk within its data buffer."""
    import pyarrow as pa

    dtype = np.int64 if pa.types.is_large_binary(chunk.type) else np.int32
    # Copied under the guard: the buffer may be a view of a mapped file.
    if offsets_buf is not None:
        offsets_buf = _copied_buffer(offsets_buf, "the offsets of an image column")
    offsets = np.frombuffer(offsets_buf, dtype)[chunk.offset:chunk.offset + len(chunk) + 1]
    return np.stack([offsets[:-1].astype(np.int64), np.diff(offsets).astype(np.int64)], axis=1)


def _struct_field(column, field):
    import pyarrow as pa

    # flatten() applies each chunk's offset and nulls to its fields.
    index = column.type.get_field_index(field)
    return pa.chunked_array([chunk.flatten()[index] for chunk in column.chunks],
                            column.type.field(index).type)


def _path_only(column, name, image_column):
    """The file paths of a Hugging Face ``Image()`` column that holds no
    bytes, or None when the column holds bytes (or is plain binary)."""
    import pyarrow as pa

    if not pa.types.is_struct(column.type):
        return None
    if column.type.get_field_index("bytes") < 0 or column.type.get_field_index("path") < 0:
        raise ValueError(f"{name}: column {image_column!r} is {column.type}, not binary "
                         "or a Hugging Face Image() struct {bytes, path}")
    data = _struct_field(column, "bytes")
    if data.null_count < len(data) or len(data) == 0:
        return None
    paths = _struct_field(column, "path")
    row = _first_null(paths.chunks)
    if row is not None:
        raise ValueError(f"{name}: column {image_column!r} has neither bytes nor a path "
                         f"at row {row}")
    return paths.to_pylist()


def _in_place(column, name, image_column):
    """(buffers, which, ranges): image i is bytes ranges[i] of
    buffers[which[i]], for a binary column or an Image() struct column whose
    images are held as bytes."""
    import pyarrow as pa

    if pa.types.is_struct(column.type):
        data = _struct_field(column, "bytes")
        row = _first_null(data.chunks)
        if row is not None:
            raise ValueError(f"{name}: column {image_column!r} holds some images as bytes and "
                             f"others as file paths (row {row}); fastload reads either all "
                             "from the table or all from files")
        column = data
    buffers, which, ranges = [], [], []
    for chunk in _binary_chunks(column, name, image_column):
        _, offsets_buf, data_buf = chunk.buffers()
        which.append(np.full(len(chunk), len(buffers), np.int64))
        buffers.append(data_buf if data_buf is not None else b"")
        ranges.append(_spans(chunk, offsets_buf))
    if not ranges:
        return (), np.zeros(0, np.int64), np.zeros((0, 2), np.int64)
    return tuple(buffers), np.concatenate(which), np.concatenate(ranges)
