"""Write samples as WebDataset tar shards.

A shard is a plain tar file: each sample is a run of consecutive members
``<key>.<field>`` sharing one key, in the layout webdataset's ``TarWriter``
and ``ShardWriter`` write and any WebDataset reader reads.  Fields are
encoded from their extension as webdataset's default encoders do, so the
same samples give the bytes webdataset would write, but with fixed member
metadata: two runs over the same samples write identical shards.  A shard is
written under a temporary name in its directory and renamed when complete,
so the final names only ever hold complete shards.  A shard for a URL
(``s3://``, ``gs://``, ``az://``, ``http(s)://``) is written so in a
temporary folder, then uploaded with its index file through obstore
(``_Uploader``) while the next one is written.
"""

import collections
import concurrent.futures
import gzip
import io
import json
import numbers
import os
import pickle
import random
import secrets
import shutil
import sys
import tarfile
import tempfile
import urllib.parse
import zipfile
from collections.abc import Mapping

import numpy as np

from .remote import urls as remote_urls
from .restart_markers import rewrite_if_jpeg
from .shard_index import SUFFIX
from .webdataset import write_index

__all__ = ["write_shards", "shards_from_image_folder"]

# Member metadata, fixed so that output depends on the samples only.  Owner
# and mode are webdataset's TarWriter defaults; the mtime is the epoch (as in
# reproducible builds) instead of the time of writing.
MEMBER_OWNER = "bigdata"
MEMBER_MODE = 0o444
MEMBER_MTIME = 0
# USTAR: what webdataset writes, and the simplest layout for a reader: one
# 512-byte header a member, no extended headers.
TAR_FORMAT = tarfile.USTAR_FORMAT
NAME_ENCODING = "utf-8"

INT_FIELDS = frozenset("cls cls2 class count index inx id".split())
JSON_FIELDS = frozenset(("json", "jsn"))
PICKLE_FIELDS = frozenset(("pyd", "pickle", "pkl"))
# Pillow format for each image extension.  webdataset's "pbm"/"pgm" handlers
# ask Pillow for formats it does not have; Pillow writes all three (and
# "pnm") as PPM, picking P4/P5/P6 from the image mode.
IMAGE_FORMATS = {
    "jpg": "JPEG", "jpeg": "JPEG", "img": "JPEG", "image": "JPEG",
    "png": "PNG",
    "pbm": "PPM", "pgm": "PPM", "ppm": "PPM", "pnm": "PPM",
    "tif": "TIFF", "tiff": "TIFF",
    "webp": "WEBP",
}
# Encoded images that image_max_side re-encodes; other formats are copied.
RESIZABLE_FORMATS = ("JPEG", "PNG")
# webdataset writes the images it encodes as JPEG (and TIFF) at quality 100.
DEFAULT_QUALITY = 100


# ------------------------------------------------------------ encoders

def _is_tensor(value):
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def _encode_int(value):
    # webdataset writes str(value); a 0-d array or tensor would then be
    # written as "tensor(3)", which no reader parses, so unwrap it first.
    if isinstance(value, np.ndarray) or _is_tensor(value):
        if value.ndim != 0:
            raise ValueError(f"expected a single number, got an array of shape "
                             f"{tuple(value.shape)}")
        value = value.item()
    if isinstance(value, numbers.Integral):
        value = int(value)
    return str(value).encode("ascii")


def _encode_json(value):
    return json.dumps(value).encode("utf-8")


def _as_array(value):
    if _is_tensor(value):
        return value.detach().cpu().numpy()
    return np.asarray(value)


def _encode_npy(value):
    array = _as_array(value)
    if array.dtype.hasobject:
        raise TypeError("an object array cannot be written as .npy without pickling "
                        "(readers load with allow_pickle=False); use 'pyd'")
    stream = io.BytesIO()
    np.lib.format.write_array(stream, array, allow_pickle=False)
    return stream.getvalue()


def _encode_npz(value):
    if not isinstance(value, Mapping):
        raise TypeError(f"'npz' takes a dict of arrays, got {type(value).__name__}")
    # np.savez stamps each member with the current time; a fixed timestamp
    # keeps shards reproducible.  Compressed, as webdataset's encoder writes.
    stream = io.BytesIO()
    with zipfile.ZipFile(stream, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, item in value.items():
            if not isinstance(name, str):
                raise TypeError(f"'npz' names must be str, got {type(name).__name__}")
            info = zipfile.ZipInfo(name + ".npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            with archive.open(info, "w", force_zip64=True) as member:
                np.lib.format.write_array(member, _as_array(item), allow_pickle=False)
    return stream.getvalue()


def _encode_pth(value):
    import torch

    stream = io.BytesIO()
    torch.save(value, stream)
    return stream.getvalue()


def _to_pil(image):
    """A PIL image from a PIL image or an HWC / HW array, as webdataset's
    imageencoder converts them (floats in [0, 1] scaled to uint8)."""
    from PIL import Image

    if isinstance(image, Image.Image):
        return image
    if _is_tensor(image):
        raise TypeError("a torch tensor is not an image here: convert it to an HWC uint8 "
                        "array (tensor.permute(1, 2, 0).numpy()), or write it as 'npy' or 'pth'")
    if not isinstance(image, np.ndarray):
        raise TypeError(f"expected encoded bytes, a PIL image or an HWC array, "
                        f"got {type(image).__name__}")
    if image.dtype.kind == "f":
        low, high = float(np.amin(image)), float(np.amax(image))
        if low <= -0.001 or high >= 1.001:
            raise ValueError(f"float image values must lie in [0, 1], got [{low}, {high}]")
        image = np.array(np.clip(image, 0.0, 1.0) * 255.0, np.uint8)
    elif image.dtype == np.uint16 and image.ndim == 2:
        pass  # 16-bit grey (PNG, TIFF)
    elif image.dtype != np.uint8:
        raise TypeError(f"image arrays must be uint8 or float in [0, 1], got {image.dtype}")
    if image.ndim == 3 and image.shape[2] == 1:
        image = image[:, :, 0]
    if not (image.ndim == 2 or (image.ndim == 3 and image.shape[2] in (3, 4))):
        raise ValueError(f"image arrays must be HW or HWC with 1, 3 or 4 channels, "
                         f"got shape {image.shape}")
    return Image.fromarray(np.ascontiguousarray(image))


def _fit(image, max_side):
    """``image`` scaled down so that its longer side is ``max_side``
    (unchanged when it already fits)."""
    from PIL import Image

    width, height = image.size
    if max_side is None or max(width, height) <= max_side:
        return image
    if width >= height:
        size = (max_side, max(1, round(height * max_side / width)))
    else:
        size = (max(1, round(width * max_side / height)), max_side)
    # Pillow resamples "1" and "P" images with NEAREST whatever it is asked.
    if image.mode == "P":
        image = image.convert("RGBA" if "transparency" in image.info else "RGB")
    elif image.mode == "1":
        image = image.convert("L")
    return image.resize(size, Image.LANCZOS)


def _save(image, fmt, quality, source=None):
    """``image`` encoded as ``fmt``.  ``source``: the encoded image it was
    resized from, whose JPEG quantisation tables, chroma subsampling and
    colour profile are kept when ``quality`` is None."""
    options = {}
    if fmt in ("JPEG", "TIFF"):
        options["quality"] = DEFAULT_QUALITY if quality is None else quality
    elif fmt == "WEBP":
        options.update({"lossless": True} if quality is None else {"quality": quality})
    if source is not None:
        if source.info.get("icc_profile"):
            options["icc_profile"] = source.info["icc_profile"]
        if fmt == "JPEG" and quality is None and getattr(source, "quantization", None):
            from PIL import JpegImagePlugin

            del options["quality"]
            options["qtables"] = source.quantization
            subsampling = JpegImagePlugin.get_sampling(source)
            if subsampling != -1:
                options["subsampling"] = subsampling
    with io.BytesIO() as stream:
        image.save(stream, format=fmt, **options)
        return stream.getvalue()


class _Encoder:
    """Turns one field value into bytes from the field's extension."""

    def __init__(self, image_max_side, quality, restart_markers=False):
        self.image_max_side = image_max_side
        self.quality = quality
        self.restart_markers = restart_markers

    def __call__(self, field, value):
        compress = field.endswith(".gz")
        ext = (field[:-3] if compress else field).rsplit(".", 1)[-1].lower()
        data = self._encode(ext, value)
        if self.restart_markers and ext in ("jpg", "jpeg"):
            data = rewrite_if_jpeg(data)
        if compress:
            data = gzip.compress(data, mtime=0)
        return data

    def _encode(self, ext, value):
        fmt = IMAGE_FORMATS.get(ext)
        if isinstance(value, (bytes, bytearray, memoryview)):
            if fmt is not None and self.image_max_side is not None:
                return self._fit_encoded(bytes(value))
            return bytes(value)
        if isinstance(value, str):
            return value.encode("utf-8")
        if fmt is not None:
            return _save(_fit(_to_pil(value), self.image_max_side), fmt, self.quality)
        if ext in INT_FIELDS:
            return _encode_int(value)
        if ext in JSON_FIELDS:
            return _encode_json(value)
        if ext in PICKLE_FIELDS:
            return pickle.dumps(value)
        if ext == "npy":
            return _encode_npy(value)
        if ext == "npz":
            return _encode_npz(value)
        if ext == "pth":
            return _encode_pth(value)
        raise TypeError(f"no encoder for extension {ext!r} and a {type(value).__name__}: "
                        f"pass bytes or str, or use an extension with an encoder "
                        f"(cls, json, npy, npz, pyd, pth, jpg, png, ...)")

    def _fit_encoded(self, data):
        from PIL import Image

        with Image.open(io.BytesIO(data)) as image:  # reads the header only
            if max(image.size) <= self.image_max_side or image.format not in RESIZABLE_FORMATS:
                return data
            image.load()
            return _save(_fit(image, self.image_max_side), image.format, self.quality,
                         source=image)


# ------------------------------------------------------------ samples

def _check_key(key):
    if not isinstance(key, str):
        raise TypeError(f"__key__ must be a str, got {type(key).__name__}")
    if not key or key.startswith("/") or key.endswith("/") or "\0" in key:
        raise ValueError(f"__key__ {key!r} is not a valid member name prefix")
    if "." in key:
        # Readers split "<key>.<field>" at the first dot of the file name.
        raise ValueError(f"__key__ {key!r} contains '.': readers would split the key there")


def _check_fields(fields):
    lowered = {}
    for field in fields:
        if not isinstance(field, str):
            raise TypeError(f"field names must be str, got {type(field).__name__} {field!r}")
        if not field or field[0] == "." or field[-1] == "." or "/" in field or "\0" in field:
            raise ValueError(f"field name {field!r} is not a valid file extension")
        other = lowered.setdefault(field.lower(), field)
        if other != field:
            # Readers lower-case extensions: the two would collide.
            raise ValueError(f"fields {other!r} and {field!r} differ only in case")


def _sniff_image_ext(data):
    head = bytes(data[:12])
    if head.startswith(b"\xff\xd8\xff"):
        return "jpg"
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "png"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "webp"
    if head[:2] in (b"II", b"MM") and head[2:4] in (b"*\0", b"\0*"):
        return "tiff"
    raise ValueError("image bytes are not JPEG, PNG, WebP or TIFF; write dict samples "
                     "to name the field")


def _class_index(label):
    if isinstance(label, np.ndarray) or _is_tensor(label):
        if label.ndim == 0:
            label = label.item()
    if isinstance(label, bool) or not isinstance(label, numbers.Integral):
        raise TypeError(f"the label of an (image, label) sample must be an integer class "
                        f"index, got {type(label).__name__}; write dict samples for other "
                        f"targets")
    return int(label)


def _as_dict(sample, index, image_ext):
    """A dict sample, made from an (image, label) pair if need be."""
    if isinstance(sample, Mapping):
        sample = dict(sample)
        sample.setdefault("__key__", f"{index:09d}")
        return sample
    if isinstance(sample, (tuple, list)) and len(sample) == 2:
        image, label = sample
        ext = image_ext
        if ext is None:
            ext = (_sniff_image_ext(image) if isinstance(image, (bytes, bytearray, memoryview))
                   else "png")
        return {"__key__": f"{index:09d}", ext: image, "cls": _class_index(label)}
    raise TypeError(f"a sample must be a dict or an (image, label) pair, "
                    f"got {type(sample).__name__}")


def _iterate(samples):
    if isinstance(samples, Mapping):
        raise TypeError("samples is a single dict: pass an iterable of samples")
    if (hasattr(samples, "__len__") and hasattr(samples, "__getitem__")
            and not hasattr(samples, "__iter__")):
        # A map-style dataset (torch's Dataset has no __iter__).
        return (samples[i] for i in range(len(samples)))
    try:
        return iter(samples)
    except TypeError:
        raise TypeError(f"samples must be an iterable or a map-style dataset, "
                        f"got {type(samples).__name__}") from None


def _members(sample, encoder):
    """The (TarInfo, bytes) members of one dict sample, in webdataset's
    order: fields sorted by name; fields starting with "_" (``__key__``,
    ``__url__``, ...) are metadata and not written."""
    key = sample["__key__"]
    _check_key(key)
    fields = [f for f in sample if not (isinstance(f, str) and f.startswith("_"))]
    _check_fields(fields)
    fields.sort()
    if not fields:
        raise ValueError("the sample has no fields to write")
    members = []
    for field in fields:
        try:
            data = encoder(field, sample[field])
        except Exception as e:
            kind = TypeError if isinstance(e, TypeError) else ValueError
            raise kind(f"field {field!r}: {e}") from e
        info = tarfile.TarInfo(f"{key}.{field}")
        info.size = len(data)
        info.mtime = MEMBER_MTIME
        info.mode = MEMBER_MODE
        info.uname = info.gname = MEMBER_OWNER
        try:
            info.tobuf(TAR_FORMAT, NAME_ENCODING, "surrogateescape")
        except ValueError as e:
            raise ValueError(f"member {info.name!r} does not fit a USTAR header ({e}): names "
                             f"are at most 100 bytes, or 255 split at a '/'") from None
        members.append((info, data))
    return members


# ------------------------------------------------------------ shard files

def _padded(size):
    return -(-size // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE


def _members_size(members):
    return sum(tarfile.BLOCKSIZE + _padded(info.size) for info, _ in members)


def _file_size(members_size):
    """Size of a tar file whose members take ``members_size`` bytes: two
    zero blocks end it, and tarfile pads it to a whole record."""
    end = members_size + 2 * tarfile.BLOCKSIZE
    return -(-end // tarfile.RECORDSIZE) * tarfile.RECORDSIZE


class _Shard:
    """One shard being written to a temporary file beside its final path;
    ``name``: where it goes in the end (``path``, or the URL it is
    uploaded to; then the file needs no fsync: it is read once, and gone)."""

    def __init__(self, path, name=None):
        self.path = path
        self.name = name or path
        directory, name = os.path.split(path)
        if os.path.isdir(path):
            raise IsADirectoryError(f"cannot write shard {path!r}: it is a directory")
        self.temp_path = os.path.join(directory, f".{name}.{secrets.token_hex(4)}.tmp")
        if directory:
            # Missing folders are made, as writers do ("shards/train-%06d.tar").
            try:
                os.makedirs(directory, exist_ok=True)
            except FileExistsError:
                pass  # something that is not a folder: the open below says what
            except OSError as e:
                raise type(e)(e.errno, f"cannot write shard {path!r}: cannot create its "
                              f"folder: {e.strerror}", e.filename) from None
        try:
            # O_EXCL: never clobber another writer's file; mode 0o666 less the
            # umask, as an ordinary open() would give the shard.
            fd = os.open(self.temp_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except OSError as e:
            raise type(e)(e.errno, f"cannot write shard {path!r}: {e.strerror}",
                          directory or ".") from None
        self.file = os.fdopen(fd, "wb")
        self.tar = tarfile.open(fileobj=self.file, mode="w", format=TAR_FORMAT,
                                encoding=NAME_ENCODING)
        self.count = 0
        self.members_size = 0
        self.last_key = None

    def add(self, members):
        for info, data in members:
            self.tar.addfile(info, io.BytesIO(data))
        self.members_size += _members_size(members)
        self.count += 1

    def finish(self):
        """Complete the tar, make it durable, and move it to its final name."""
        self.tar.close()
        self.file.flush()
        if self.name != self.path:  # uploaded from here, then removed
            self.file.close()
            os.replace(self.temp_path, self.path)
            return
        os.fsync(self.file.fileno())
        self.file.close()
        os.replace(self.temp_path, self.path)
        directory = os.path.dirname(self.path) or "."
        try:  # make the rename itself durable; not every platform can
            fd = os.open(directory, os.O_RDONLY)
        except OSError:
            return
        try:
            os.fsync(fd)
        except OSError:
            pass
        finally:
            os.close(fd)

    def abandon(self):
        """Drop the partial shard: its final name is never touched."""
        try:
            self.tar.close()
        except Exception:
            pass
        self.file.close()
        try:
            os.unlink(self.temp_path)
        except FileNotFoundError:
            pass


def _shard_namer(pattern, start_shard):
    """``name(n)`` for shard number n; it raises when the pattern has no
    field for the number and n is not the first shard."""
    try:
        numbered = pattern % start_shard != pattern % (start_shard + 1)
    except TypeError as e:
        if "not all arguments converted" not in str(e):
            raise ValueError(f"pattern {pattern!r} must hold one printf field for the shard "
                             f"number, such as %06d ({e})") from None
        numbered = False
    except ValueError as e:
        raise ValueError(f"pattern {pattern!r} is not a valid printf pattern ({e})") from None

    def name(number):
        if numbered:
            return pattern % number
        if number != start_shard:
            raise ValueError(f"the samples need more than one shard, but pattern {pattern!r} "
                             f"has no field for the shard number (such as %06d)")
        return pattern.replace("%%", "%")
    return name


def _positive_int(name, value):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def _finish(shard, written, verbose, uploader=None):
    shard.finish()
    write_index(shard.path)  # readers then skip the shard's headers
    written.append(shard.name)
    if uploader is not None:
        uploader.submit(shard)
    elif verbose:
        _wrote(shard.name, shard.count)


def _wrote(name, count):
    print(f"fastload: wrote {name} ({count} sample{'' if count == 1 else 's'})")


class _Uploader:
    """Shards for URLs: each written into a temporary folder, then uploaded
    (the shard, then its index file, so that an index in the store always
    has its shard) on a thread of its own while the next shard is written,
    then removed.  One upload at a time, so at most two shards are on the
    local disk.  An upload's error (``RemoteError`` naming the URL, after
    the store's retries) is raised by the next ``submit`` or ``finish``."""

    def __init__(self, storage_options, remote_options, verbose):
        from .remote.store import Store

        self.store = Store(storage_options, **(remote_options or {}))
        self.directory = tempfile.mkdtemp(prefix="fastload-shards-")
        self.verbose = verbose
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="fastload-upload")
        self._pending = collections.deque()  # (future, url, samples), oldest first

    def local_path(self, number):
        return os.path.join(self.directory, f"shard-{number:09d}.tar")

    def submit(self, shard):
        while self._pending:  # the last upload ends before this one starts
            self._reap()
        future = self._pool.submit(self._upload, shard.path, shard.name)
        self._pending.append((future, shard.name, shard.count))

    def _upload(self, path, url):
        try:
            self.store.put_file(url, path)
            self.store.put_file(url + SUFFIX, path + SUFFIX)
        finally:
            for name in (path, path + SUFFIX):
                try:
                    os.unlink(name)
                except FileNotFoundError:
                    pass

    def _reap(self):
        future, url, count = self._pending.popleft()
        future.result()
        if self.verbose:
            _wrote(url, count)

    def finish(self):
        while self._pending:
            self._reap()

    def close(self):
        """Waits for the upload under way (the shards written before an
        error are uploaded), then removes the temporary folder."""
        try:
            self._pool.shutdown(wait=True)
        finally:
            shutil.rmtree(self.directory, ignore_errors=True)


def write_shards(samples, pattern, maxcount=100_000, maxsize=3_000_000_000, *,
                 image_max_side=None, quality=None, image_ext=None, start_shard=0,
                 verbose=False, restart_markers=False, storage_options=None,
                 remote_options=None):
    """write_shards(samples, pattern, maxcount=100000, maxsize=3e9, *, image_max_side=None, quality=None, image_ext=None, start_shard=0, verbose=False, restart_markers=False, storage_options=None, remote_options=None) -> list of paths

    Write ``samples`` as WebDataset tar shards named ``pattern % n`` for
    n = start_shard, start_shard + 1, ...; return the paths written, in order.

    ``pattern`` may be a URL (``s3://bucket/train-%06d.tar``, ``gs://``,
    ``az://``, ``http(s)://``; ``file://`` is a path): each shard is then
    written in a temporary folder (``$TMPDIR``) and uploaded with its index
    file through obstore (a multipart upload when larger than 5 MiB) while
    the next one is written; the URLs are returned.  ``storage_options``
    and ``remote_options`` are ``WebDataset``'s (credentials come from the
    store's usual environment variables).

    ``samples``: an iterable or map-style dataset of samples, each either a
    dict as webdataset's ``TarWriter`` takes (``{"__key__": "a1", "jpg":
    ..., "cls": 3, "json": {...}}``; ``__key__`` defaults to the sample's
    running index, ``"%09d"``) or an ``(image, label)`` pair, written as
    ``{"__key__": "%09d" % i, ext: image, "cls": label}`` with ``ext``
    ``image_ext``, or by default the format of encoded image bytes
    (jpg/png/webp/tiff) and ``"png"`` for pixels.

    Each field is encoded from its extension as webdataset's default
    encoders do: bytes as they are, str as UTF-8, cls/cls2/class/count/
    index/inx/id as ``str(int)``, json/jsn with ``json.dumps``, npy/npz in
    NumPy's formats, pyd/pickle/pkl with pickle, pth with ``torch.save``,
    jpg/jpeg/png/ppm/pgm/pbm/tif/tiff/webp from a PIL image or an HWC
    array (uint8, or float in [0, 1]) with Pillow; a ``.gz`` suffix
    gzips the result.  Fields starting with ``_`` are not written.

    A new shard starts when the current one holds ``maxcount`` samples, or
    when the next sample would make its file larger than ``maxsize`` bytes
    (a sample larger than that alone gets a shard of its own).

    ``image_max_side``: images whose longer side is larger are scaled down
    to it (Pillow, LANCZOS) before they are written; encoded JPEG and PNG
    bytes are then decoded and re-encoded, other bytes copied.  Without it
    encoded images are copied byte for byte.  ``quality``: JPEG and WebP
    quality of the images this function encodes; None keeps a resized
    JPEG's own quantisation tables, and writes pixels as webdataset does
    (JPEG quality 100; lossless WebP).

    ``restart_markers``: JPEG fields (jpg, jpeg) are rewritten losslessly
    with restart markers (``fastload.add_restart_markers``: the same
    pixels, EXIF and ICC profiles dropped), so that fastload decodes a
    crop from the parts of the file that cover it.  JPEGs the rewrite
    cannot read are written as they are.

    Each shard gets an index file beside it (``<shard>.fastload-index``),
    which ``WebDataset`` reads instead of the shard's headers.

    Raises ValueError or TypeError naming the sample and field for input
    that cannot be written, and OSError naming the shard when it cannot
    be created.  Missing folders on a shard's path are created.  Shards
    completed before an error stay; the one being written is removed.
    """
    pattern = os.fspath(pattern)
    if remote_urls.scheme(pattern) == "file":  # not unquoted: "%06d" is the pattern's
        pattern = urllib.parse.urlsplit(pattern).path
    maxcount = _positive_int("maxcount", maxcount)
    if isinstance(maxsize, bool) or not isinstance(maxsize, numbers.Real) or not maxsize > 0:
        raise ValueError(f"maxsize must be a positive number of bytes, got {maxsize!r}")
    if image_max_side is not None:
        image_max_side = _positive_int("image_max_side", image_max_side)
    if quality is not None and not (isinstance(quality, numbers.Integral)
                                    and 1 <= quality <= 100):
        raise ValueError(f"quality must be an integer from 1 to 100, got {quality!r}")
    if image_ext is not None and image_ext not in IMAGE_FORMATS:
        raise ValueError(f"image_ext must be one of {sorted(IMAGE_FORMATS)}, got {image_ext!r}")
    if isinstance(start_shard, bool) or not isinstance(start_shard, numbers.Integral) \
            or start_shard < 0:
        raise ValueError(f"start_shard must be a non-negative integer, got {start_shard!r}")
    start_shard = int(start_shard)
    shard_name = _shard_namer(pattern, start_shard)
    encoder = _Encoder(image_max_side, quality, bool(restart_markers))

    uploader = None
    if remote_urls.is_remote(pattern):
        uploader = _Uploader(storage_options, remote_options, verbose)

    def new_shard(number):
        if uploader is None:
            return _Shard(shard_name(number))
        return _Shard(uploader.local_path(number), shard_name(number))

    written = []
    shard = None
    number = start_shard
    try:
        for index, sample in enumerate(_iterate(samples)):
            try:
                sample = _as_dict(sample, index, image_ext)
                members = _members(sample, encoder)
            except (TypeError, ValueError) as e:
                key = sample.get("__key__") if isinstance(sample, dict) else None
                where = f"sample {index}" + (f" (key {key!r})" if isinstance(key, str) else "")
                kind = TypeError if isinstance(e, TypeError) else ValueError
                raise kind(f"{where}: {e}") from e
            if shard is not None:
                if sample["__key__"] == shard.last_key:
                    raise ValueError(f"sample {index}: key {shard.last_key!r} repeats the "
                                     f"previous sample's; readers would merge the two")
                size = _members_size(members)
                if shard.count >= maxcount or _file_size(shard.members_size + size) > maxsize:
                    shard_name(number)  # raises before finishing if there is no next name
                    _finish(shard, written, verbose, uploader)
                    shard = None
            if shard is None:
                shard = new_shard(number)
                number += 1
            shard.add(members)
            shard.last_key = sample["__key__"]
        if shard is not None:
            _finish(shard, written, verbose, uploader)
            shard = None
        if uploader is not None:
            uploader.finish()
    finally:
        if shard is not None:
            shard.abandon()
        if uploader is not None:
            uploader.close()
    return written


def _field_for_file(path):
    ext = os.path.splitext(path)[1].lower().lstrip(".")
    if not ext:
        raise ValueError(f"{path!r} has no file extension to name its field")
    return "jpg" if ext == "jpeg" else ext


def shards_from_image_folder(dataset, pattern, *, shuffle=False, seed=0, **options):
    """shards_from_image_folder(dataset, pattern, *, shuffle=False, seed=0, **options) -> list of paths

    Write an image folder as WebDataset shards: ``dataset`` is a folder
    path (read as ``fastload.ImageFolder`` reads it) or any dataset with
    torchvision's ``samples`` list of (path, class_index) pairs
    (``fastload.ImageFolder``, ``ImageFiles``, torchvision's
    ``ImageFolder``).  Sample i is ``{"__key__": "%09d" % i, ext: the file's
    bytes, "cls": class_index}``: files are copied as they are (no decode
    unless ``image_max_side`` asks for resizing); ``ext`` is the file's
    extension in lower case, ".jpeg" written as "jpg" so that ImageNet's
    ".JPEG" files are read with ``.to_tuple("jpg", "cls")``.  Transforms
    of the dataset are not applied.

    Samples are written in the dataset's order (sorted by class), or with
    ``shuffle=True`` in an order drawn from ``seed``; the key stays the
    dataset index.  Shard readers go through each shard sequentially and
    shuffle only within a buffer, so shuffling here keeps the classes
    mixed within each shard.  ``options`` go to ``write_shards``.
    """
    if isinstance(dataset, (str, bytes, os.PathLike)):
        from .images import ImageFolder

        dataset = ImageFolder(dataset)
    try:
        items = dataset.samples
    except AttributeError:
        raise TypeError(f"expected a folder path or a dataset with a 'samples' list of "
                        f"(path, class_index), got {type(dataset).__name__}") from None
    order = list(range(len(items)))
    if shuffle:
        random.Random(seed).shuffle(order)

    def samples():
        for i in order:
            path, label = items[i]
            path = os.fsdecode(path)
            field = _field_for_file(path)
            with open(path, "rb") as f:
                data = f.read()
            yield {"__key__": f"{i:09d}", field: data, "cls": int(label)}

    return write_shards(samples(), pattern, **options)
