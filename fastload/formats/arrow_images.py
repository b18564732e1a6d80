"""Encoded images in a binary column of an Arrow IPC file, decoded,
transformed and collated by the C image pipeline like ImageFolder's files.

The file is memory-mapped; each image is a byte range of it, so the C
readers open the file itself (the ``ranges`` route of tar shards)."""

import os

import numpy as np

from ..images import ImageFiles
from ..transforms import PILLOW_MAX_PIXELS


class ArrowImages(ImageFiles):
    """``ArrowImages(path, image_column="image", label_column="label", ...)``:
    the images of an uncompressed Arrow IPC file's binary column, with the
    options of :class:`fastload.ImageFiles`. Compressed files are refused:
    their buffers are not byte ranges of the file."""

    def __init__(self, path, image_column="image", label_column="label", transform=None,
                 target_transform=None, decode="fast", on_error="raise", **kwargs):
        import pyarrow as pa
        import pyarrow.ipc  # noqa: F401

        path = os.fspath(path)
        try:
            mapping = pa.memory_map(path, "r")
            table = pa.ipc.open_file(mapping).read_all()
        except Exception as e:  # noqa: BLE001 (pyarrow raises ArrowInvalid, OSError)
            raise ValueError(f"cannot read {path!r} as an Arrow IPC file: {e}") from e
        mapping.seek(0)
        whole = mapping.read_buffer(mapping.size())  # zero-copy: the mapping itself
        base, size = whole.address, whole.size
        if image_column not in table.column_names:
            raise ValueError(f"{path!r}: no column {image_column!r} "
                             f"(columns: {table.column_names})")
        ranges = []
        for chunk in table.column(image_column).chunks:
            if not (pa.types.is_binary(chunk.type) or pa.types.is_large_binary(chunk.type)):
                raise ValueError(f"{path!r}: column {image_column!r} is {chunk.type}, "
                                 "not binary")
            if chunk.null_count:
                raise ValueError(f"{path!r}: column {image_column!r} has null images")
            _, offsets_buf, data_buf = chunk.buffers()
            dtype = np.int64 if pa.types.is_large_binary(chunk.type) else np.int32
            offsets = np.frombuffer(offsets_buf, dtype)[chunk.offset:chunk.offset + len(chunk) + 1]
            start = 0 if data_buf is None else data_buf.address - base
            if data_buf is not None and not (0 <= start and start + data_buf.size <= size):
                raise ValueError(f"{path!r}: column {image_column!r} is not a byte range of "
                                 "the file (compressed IPC files are not supported)")
            ranges.append(np.stack([start + offsets[:-1].astype(np.int64),
                                    np.diff(offsets).astype(np.int64)], axis=1))
        ranges = np.concatenate(ranges) if ranges else np.zeros((0, 2), np.int64)
        if label_column is not None and label_column in table.column_names:
            labels = np.asarray(table.column(label_column).to_numpy(), np.int64)
        else:
            labels = np.zeros(len(ranges), np.int64)
        blob = os.fsencode(path) + b"\0"
        self._setup((blob, np.zeros(len(ranges), np.int64)), labels, transform,
                    target_transform, decode, on_error, kwargs.pop("max_pixels", PILLOW_MAX_PIXELS),
                    kwargs.pop("loader", None), ranges=np.ascontiguousarray(ranges))
