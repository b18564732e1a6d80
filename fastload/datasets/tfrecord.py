"""TFRecordDataset: images and features of ``tf.train.Example`` records in
TFRecord files, read, checked and parsed in C.

A sample is one record.  Its image feature (a ``bytes_list`` of one encoded
image) is decoded by the C image pipeline with the transforms ``ImageFolder``
takes (the same native plans: fastload's, torchvision's mapped onto them),
its label feature (an ``int64_list`` of one value) is the target, and other
features named in ``features`` come as NumPy arrays.  Records are found
through index files (``tfrecord_index``): a DataLoader's thread workers read
each batch's records straight from the files, check their CRCs, parse their
Examples and decode their images in C, without the GIL.
"""

import os

import numpy as np

from .. import _C
from ..transforms.ops import PILLOW_MAX_PIXELS
from . import tfrecord_index
from .images import MAX_SKIPS_PER_SAMPLE, DecodeError, ImageFiles, _fallback
from .indexing import check_index
from .webdataset import expand_urls

__all__ = ["TFRecordDataset"]

KINDS = ("bytes", "float", "int64")


def _fs(value):
    return value if value is None else os.fspath(value)


class TFRecordDataset(ImageFiles):
    """TFRecordDataset(paths, transform=None, target_transform=None, *,
    image="image/encoded", label="image/class/label", features=None,
    index=None, compression=None, verify_crc=True, decode="fast",
    on_error="raise", max_pixels=PILLOW_MAX_PIXELS)

    The ``tf.train.Example`` records of TFRecord files, map-style: sample i
    is record i, counting through the files in order.

    ``paths``: a list of files, or one string with brace patterns as
    ``WebDataset`` takes (``"train-{00000..01023}-of-01024"``).

    ``image``: the feature holding the encoded image (JPEG, PNG, WebP; other
    formats through Pillow), a ``bytes_list`` of one value, decoded and
    transformed as ``ImageFolder`` does (``transform``: a
    ``fastload.transforms.Compose`` or a torchvision one; another callable
    gets the image as an HWC uint8 array).  ``label``: an ``int64_list`` of
    one value, the target (None: targets are 0).  ``features``: more to
    read, a dict ``name -> kind`` with kind ``"int64"`` (an int64 array),
    ``"float"`` (a float32 array) or ``"bytes"`` (a list of ``bytes``);
    lists packed or not.  A sample is ``(image, target)``, or with
    ``features`` ``(image, target, {name: value})``.

    Without ``features`` and with a transform that fixes the output size, a
    DataLoader's batches are read, checked, parsed, decoded and transformed
    in C (as ``ImageFolder``'s); ``features`` take the per-sample path,
    whose records are still read and parsed in C.

    ``index``: where each file's records are: None finds the index beside
    the file (``<file>.idx``) or in the cache folder, building it when there
    is none or it is stale (``fastload.write_tfrecord_index``); or index
    files in DALI's ``tfrecord2idx`` format, a list matching ``paths`` or a
    brace pattern.  ``compression="gzip"``: the files are GZIP-compressed;
    each is decompressed once, sequentially, into a plain copy in
    ``$FASTLOAD_TFRECORD_DIR`` (default ``~/.cache/fastload/tfrecord``)
    reused while the file is unchanged, so samples are then read in any
    order, shuffled as any others (the copy takes the uncompressed size on
    disk; messages name it).

    ``verify_crc``: check each record's two CRC-32Cs (False skips the data
    CRC and the length CRC).  A corrupt length, a bad CRC, a truncated
    record, a malformed Example, or a feature missing or of another kind
    raise ``fastload.DecodeError`` naming the file, the record and the
    feature; ``on_error="skip"`` replaces such a sample by the next one and
    records it in ``skipped``, as the image datasets do.
    """

    _sources = ("_source", "_raw", "_records")

    def __init__(self, paths, transform=None, target_transform=None, *,
                 image="image/encoded", label="image/class/label", features=None, index=None,
                 compression=None, verify_crc=True, decode="fast", on_error="raise",
                 max_pixels=PILLOW_MAX_PIXELS):
        files = expand_urls(paths)
        if not files:
            raise ValueError("no TFRecord files given")
        if compression not in (None, "gzip"):
            raise ValueError(f"compression must be None or 'gzip', got {compression!r}")
        if not isinstance(image, str) or not image:
            raise TypeError(f"image must be a feature name (str), got {image!r}")
        if label is not None and not isinstance(label, str):
            raise TypeError(f"label must be a feature name (str) or None, got {label!r}")
        features = dict(features or {})
        for name, kind in features.items():
            if not isinstance(name, str):
                raise TypeError(f"features: names must be str, got {name!r}")
            if kind not in KINDS:
                raise ValueError(f"features[{name!r}]: kind must be one of {KINDS}, got "
                                 f"{kind!r}")
        if index is not None:
            index = expand_urls(index)
            if len(index) != len(files):
                raise ValueError(f"{len(files)} TFRecord files but {len(index)} index files")
        self.files = files
        self.image, self.label, self.features = image, label, features
        self.compression, self.verify_crc = compression, bool(verify_crc)
        read = ([tfrecord_index.decompressed(f) for f in files] if compression == "gzip"
                else files)
        rows = [tfrecord_index.records_of(f, None if index is None else index[k],
                                          self.verify_crc)
                for k, f in enumerate(read)]
        counts = np.array([len(r) for r in rows], np.int64)
        self.record_counts = counts.tolist()
        ranges = (np.ascontiguousarray(np.concatenate(rows), np.int64) if rows
                  else np.zeros((0, 2), np.int64))
        self._record_numbers = np.concatenate(
            [np.arange(c, dtype=np.int64) for c in counts]) if len(counts) else \
            np.zeros(0, np.int64)
        encoded = [os.fsencode(f) for f in read]
        blob = b"\0".join(encoded) + b"\0"
        starts = np.zeros(len(encoded), np.int64)
        starts[1:] = np.cumsum([len(e) + 1 for e in encoded])[:-1]
        offsets = np.repeat(starts, counts)
        self._spec = tuple(features.items())
        self._label_spec = () if label is None else ((label, "int64"),)
        self._setup((blob, offsets), np.zeros(len(offsets), np.int64), transform,
                    target_transform, decode, on_error, max_pixels, None, ranges=ranges)

    def _make_sources(self):
        self._records = _C.TFRecordSource(
            self._paths, self._offsets, self._ranges, self._record_numbers,
            self.image.encode(), None if self.label is None else self.label.encode(),
            verify=self.verify_crc)
        super()._make_sources()

    def _image_source(self, plan, skip, gpu_split=None):
        return _C.ImageSource(self._paths, self._offsets, self._labels, plan,
                              exact=self.decode == "exact", max_pixels=self.max_pixels,
                              skip=skip, fallback=_fallback(), ranges=self._ranges,
                              gpu_split=gpu_split, records=self._records)

    def record(self, index):
        """(file, record number in it) of sample ``index``."""
        index = check_index(index, len(self))
        return self.path(index), int(self._record_numbers[index])

    def _where(self, index):
        path, number = self.record(index)
        return f"{path}: record {number} at offset {int(self._ranges[index, 0])}"

    def example(self, index, features=None):
        """The features of record ``index`` as ``_C.parse_example`` gives
        them: ``features`` a dict name -> kind (default: this dataset's
        label and features); DecodeError naming the file, record and
        feature."""
        index = check_index(index, len(self))
        spec = tuple(features.items()) if features is not None else \
            self._label_spec + self._spec
        data = self._records.example(index)
        try:
            return _C.parse_example(data, spec)
        except DecodeError as e:
            raise DecodeError(f"{self._where(index)}: {e}") from None

    def _target(self, values):
        if self.label is None:
            return 0
        value = values[self.label]
        if len(value) != 1:
            raise DecodeError(f"feature '{self.label}' has {len(value)} values, not 1")
        return int(value[0])

    def _sample(self, index):
        values = self.example(index)
        try:
            target = self._target(values)
        except DecodeError as e:
            raise DecodeError(f"{self._where(index)}: {e}") from None
        image = self._read(index)
        extra = {name: values[name] for name, _ in self._spec}
        return image, target, extra

    def __getitem__(self, index):
        index = check_index(index, len(self))
        for tries in range(MAX_SKIPS_PER_SAMPLE):
            try:
                image, target, extra = self._sample(index)
                break
            except MemoryError:
                raise
            except Exception as e:
                if self.on_error != "skip" or tries + 1 == MAX_SKIPS_PER_SAMPLE:
                    raise
                self._record_skips([(index, self.path(index), str(e))])
                index = (index + 1) % len(self)
        if self._python_transform is not None:
            image = self._python_transform(image)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return (image, target, extra) if self._spec else (image, target)

    def _native_source(self, uint8=False):
        if self._spec:
            return None  # features come per sample
        return super()._native_source(uint8)

    @property
    def samples(self):
        """(file, record number in it) of every sample."""
        return [(self.path(i), int(n)) for i, n in enumerate(self._record_numbers)]

    @property
    def targets(self):
        """Every record's label (each record read and parsed now)."""
        return [self._target(self.example(i, dict(self._label_spec))) for i in range(len(self))]

    def __repr__(self):
        return (f"TFRecordDataset({len(self.files)} files, {len(self)} records, "
                f"image={self.image!r}, label={self.label!r})")

