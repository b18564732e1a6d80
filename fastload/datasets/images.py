"""Image datasets decoded in C: ImageFolder and ImageFiles.

``ImageFolder`` follows torchvision's: the classes are the sorted names of
``root``'s sub-folders, ``class_to_idx`` maps them to indices, and sample i
is ``(image, class_index)``.  Paths are stored compactly (one bytes blob
and an offset array), not as a list of tuples that every worker copies;
``samples`` is a read-only sequence view over them.

Given a ``fastload.transforms.Compose`` whose output size is fixed, a
DataLoader with the default collate decodes whole batches in C; so does a
torchvision ``Compose`` whose steps all map onto fastload's, and one that
does not keeps its leading geometric steps in C and runs the rest in Python
on a PIL image (``fastload.transforms.from_torchvision``; ``transform_plan`` says which).
Any other callable runs in Python on the image decoded in C (an HWC uint8
NumPy array).  A ``loader`` (torchvision's argument: path -> sample) replaces the
C decoder; it is called with the GIL, once a sample.

Sample files are opened without blocking and refused unless they are
regular files: a FIFO named ``x.jpg`` would otherwise hang the reader.
"""

import collections
import copy
import errno
import io
import os
import stat
import sys
import warnings

import numpy as np

from .. import _C
from ..transforms import from_torchvision as _torchvision
from . import folder_index
from .native import SourceOwner
from .cache import SampleCache
from . import squashfs as _squashfs
from .._random import draw_seed
from .indexing import check_index
from ..transforms.ops import PILLOW_MAX_PIXELS, _nchw_view

__all__ = ["DecodeError", "ImageFiles", "ImageFolder", "IMG_EXTENSIONS", "default_loader"]

IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
SKIP_RECORDS = 1000  # failures remembered in dataset.skipped
# then the last error is raised (FL_IMAGE_MAX_SKIPS in csrc/core/source/image_source.h)
MAX_SKIPS_PER_SAMPLE = 64


DecodeError = _C.DecodeError  # OSError: a file that is not an image fastload can decode


def _file_kind(mode):
    for test, kind in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device")):
        if test(mode):
            return kind
    return "of an unknown kind"


def _not_regular(path, mode):
    code = errno.EISDIR if stat.S_ISDIR(mode) else errno.EINVAL
    return OSError(code, f"not a regular file ({_file_kind(mode)})", os.fsdecode(path))


def _open_regular(path):
    """``open(path, "rb")`` for regular files only.  O_NONBLOCK keeps
    open() from waiting for a FIFO's writer; fstat then refuses it (and
    directories, devices); a socket fails open() with ENXIO."""
    if _squashfs.is_image_path(path):  # "image.sqfs:/inner" (squashfs.py)
        return _squashfs.open_file(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as e:
        if e.errno == errno.ENXIO:
            try:
                mode = os.stat(path).st_mode
            except OSError:
                raise e from None
            if not stat.S_ISREG(mode):
                raise _not_regular(path, mode) from None
        raise
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise _not_regular(path, mode)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")  # owns fd from here
    except BaseException:
        os.close(fd)
        raise


def default_loader(path):
    """torchvision's ``pil_loader``: the file as an RGB PIL image, opened
    as ``_open_regular`` does.  Given as ``loader`` with a fastload
    ``Compose``, the C decoder runs instead (the result is the same)."""
    from PIL import Image

    with _open_regular(path) as f:
        img = Image.open(f)
        return img.convert("RGB")


def _is_default_loader(loader):
    """Whether ``loader`` decodes a file to its RGB image and nothing more:
    fastload's or torchvision's default (only compared when torchvision is
    already imported, as it is when its loader was passed)."""
    if loader is default_loader:
        return True
    folder = sys.modules.get("torchvision.datasets.folder")
    return folder is not None and any(
        loader is getattr(folder, name, None) for name in ("default_loader", "pil_loader"))


def _pillow_decode(data):
    """Files that are not JPEG, PNG or WebP (their bytes, read by the C
    source): Pillow, with the GIL, to an HWC uint8 RGB array."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as img:
        return np.asarray(img.convert("RGB"))


def _fallback():
    try:
        import PIL  # noqa: F401
    except ImportError:
        return None
    return _pillow_decode


class _Samples:
    """``dataset.samples``: (path, class_index) pairs, built on access."""

    def __init__(self, dataset):
        self._dataset = dataset

    def __len__(self):
        return len(self._dataset)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        return self._dataset.path(i), int(self._dataset._labels[i])

    def __iter__(self):
        return (self[i] for i in range(len(self)))


class ImageFiles(SourceOwner):
    """Images at ``paths`` with integer ``labels`` (default 0 each).

    ``loader``: as torchvision's, a callable path -> sample (e.g. a PIL
    image) called with the GIL for each sample, whose result goes through
    ``transform``.  None (or a default loader, see ``default_loader``, with
    a transform that runs in C) decodes in C instead.

    ``transform_plan``: the transform's steps by where they run, as
    ``(native, python)`` (``fastload.transforms.from_torchvision.TransformPlan``).

    ``cache``: None, ``"memory"`` or a file path (e.g. under /dev/shm): the
    files' bytes kept, as first read, in a shared cache of ``cache_size``
    bytes (None: room for all) that later reads, worker processes and
    other datasets naming the same path use (``fastload.cache``);
    ``dataset.cache.stats()`` reports it.  ``cache_decoded=True``: the
    cache keeps each image's decoded pixels instead (``cache_size``
    needed), so later epochs skip the decode; the images are then always
    decoded whole, as with ``decode="exact"``.  ``cache_restart_markers=True``
    (with a cache of bytes): JPEGs are kept rewritten losslessly with
    restart markers (``fastload.add_restart_markers``: the same pixels), so
    that later epochs decode each crop from the parts of the file that
    cover it; the first read pays the rewrite."""

    _sources = ("_source", "_raw")  # they hold per-thread decoders: not pickled
    # True: PNG and WebP files are decoded by Pillow too (with the GIL), as
    # every format but JPEG, PNG and WebP is; set before the sources are
    # made (``_make_sources``), to compare the decoders.
    _fallback_all = False
    # True: JPEGs go into the cache rewritten with restart markers (_setup).
    _cache_restart = False

    def __init__(self, paths, labels=None, transform=None, target_transform=None,
                 decode="fast", on_error="raise", max_pixels=PILLOW_MAX_PIXELS, loader=None, *,
                 cache=None, cache_size=None, cache_decoded=False, cache_restart_markers=False):
        paths = [os.fspath(p) for p in paths]
        labels = np.zeros(len(paths), np.int64) if labels is None else np.asarray(labels, np.int64)
        if labels.shape != (len(paths),):
            raise ValueError(f"{len(paths)} paths but labels of shape {labels.shape}")
        self._setup(paths, labels, transform, target_transform, decode, on_error, max_pixels,
                    loader, cache=cache, cache_size=cache_size, cache_decoded=cache_decoded,
                    cache_restart_markers=cache_restart_markers)

    def _setup(self, paths, labels, transform, target_transform, decode, on_error, max_pixels,
               loader, ranges=None, cache=None, cache_size=None, cache_decoded=False,
               cache_restart_markers=False):
        if decode not in ("fast", "exact"):
            raise ValueError(f"decode must be 'fast' or 'exact', got {decode!r}")
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        if loader is not None and not callable(loader):
            raise TypeError(f"loader must be callable, got {type(loader).__name__}")
        if isinstance(paths, tuple):  # (blob, offsets): files shared by samples (shards)
            self._paths, self._offsets = paths
        else:
            encoded = [p if isinstance(p, bytes) else os.fsencode(p) for p in paths]
            blob = b"\0".join(encoded) + b"\0"
            if blob.count(b"\0") != (len(encoded) or 1):  # one terminator a path
                raise ValueError("a path contains a NUL byte")
            lengths = np.fromiter(map(len, encoded), np.int64, len(encoded)) + 1
            self._offsets = np.zeros(len(encoded), np.int64)
            self._offsets[1:] = np.cumsum(lengths)[:-1]
            self._paths = blob
        self._ranges = ranges  # (offset, size) of each sample in its file, or None
        self._labels = labels
        self.transform = transform
        self.target_transform = target_transform
        self.decode = decode
        self.on_error = on_error
        self.max_pixels = int(max_pixels)
        # on_error="skip": how many failed reads were replaced, and the most
        # recent (index, path, message) records (bounded: jobs run for days).
        self.skipped_count = 0
        self.skipped = collections.deque(maxlen=SKIP_RECORDS)
        self.loader = loader
        custom_loader = loader is not None and not _is_default_loader(loader)
        # A fastload Compose, or the part of a torchvision one that maps
        # onto it, runs in C; the rest per image in Python.
        resolved = _torchvision.resolve(transform, loader=custom_loader)
        if resolved.warning is not None:
            warnings.warn(resolved.warning, UserWarning, stacklevel=3)
        self.transform_plan = resolved.plan
        self._plan = resolved.compose.plan if resolved.compose is not None else None
        self._python_transform = resolved.python
        # The loader is called unless the C decoder gives what it would: a
        # default loader's image, seen only by a C plan.
        native_loader = not custom_loader and (loader is None or self._plan is not None)
        self._loader = None if native_loader else loader
        if cache_restart_markers and (cache is None or cache_decoded):
            raise ValueError("cache_restart_markers=True rewrites the JPEGs a cache of bytes "
                             "keeps: pass cache= (and not cache_decoded=True)")
        self._cache_restart = bool(cache_restart_markers)
        if cache is not None and self._loader is not None:
            raise ValueError("cache= keeps the bytes fastload's reader reads, but this loader "
                             "reads the files itself: pass loader=None")
        self._native = (self._plan is not None and self._plan.output_shape() is not None
                        and self._python_transform is None)
        # The samples' bytes, shared by every source, loader and process
        # naming the same cache (fastload.cache).
        self.cache = SampleCache.for_samples(cache, cache_size, self._paths, self._offsets,
                                             self._ranges, decoded=bool(cache_decoded),
                                             salt=self._cache_salt(),
                                             rewritten=self._cache_restart)
        self._make_sources()

    def _cache_salt(self):
        """What names the samples beyond their files' paths, sizes and
        times, for the cache's key (a subclass reading keys of a store)."""
        return b""

    def _make_sources(self):
        self._source = self._image_source(self._plan, skip=self.on_error == "skip")
        self._raw = self._image_source(None, skip=False)

    def _image_source(self, plan, skip, gpu_split=None):
        return _C.ImageSource(self._paths, self._offsets, self._labels, plan,
                              exact=self.decode == "exact", max_pixels=self.max_pixels,
                              skip=skip, fallback=_fallback(), ranges=self._ranges,
                              fallback_all=self._fallback_all,
                              cache=self.cache._native if self.cache is not None else None,
                              cache_pixels=self.cache is not None and self.cache.decoded,
                              gpu_split=gpu_split, cache_restart=self._cache_restart)

    def __len__(self):
        return len(self._offsets)

    def path(self, index):
        start = int(self._offsets[index])
        end = self._paths.index(b"\0", start)
        return os.fsdecode(self._paths[start:end])

    @property
    def samples(self):
        return _Samples(self)

    @property
    def targets(self):
        return self._labels.tolist()

    def __getitem__(self, index):
        index = check_index(index, len(self))
        for tries in range(MAX_SKIPS_PER_SAMPLE):
            try:
                image = self._read(index)
                break
            except MemoryError:
                raise
            except Exception as e:
                if self.on_error != "skip" or tries + 1 == MAX_SKIPS_PER_SAMPLE:
                    if self._loader is not None and hasattr(e, "add_note"):  # Python 3.11+
                        e.add_note(f"while loading sample index {index}: {self.path(index)}")
                    raise
                self._record_skips([(index, self.path(index), str(e))])
                index = (index + 1) % len(self)
        target = int(self._labels[index])
        if self._python_transform is not None:
            image = self._python_transform(image)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return image, target

    def _read(self, index):
        """Sample `index` as the loader (or the C decoder) gives it; with a
        fastload Compose, already transformed."""
        if self._loader is not None:
            return self._loader(self.path(index))
        if self._plan is not None:
            image = self._source.sample(index, draw_seed(None), 0)
            if self._plan.tensor_output and self._plan.layout == "HWC":
                image = _nchw_view(image)
            return image
        return self._raw.sample(index, 0, 0)

    def _native_source(self, uint8=False):
        """The loader's batch path (see fastload.datasets.native), when the
        transform is fused and fixes the output size; with ``uint8``, the
        same crops as uint8 (``_device_normalization`` gives the rest)."""
        if not self._native or self.target_transform is not None:
            return None
        if not uint8:
            return self._source
        if self._device_normalization() is None:
            return None
        raw = copy.copy(self._plan)
        raw.dtype, raw.mul, raw.add = "uint8", (1.0, 1.0, 1.0), (0.0, 0.0, 0.0)
        return self._image_source(raw, skip=self.on_error == "skip")

    def _gpu_split_source(self, budgets, explore=0):
        """The native source for ``decode_device="cuda"`` or ``"auto"``: its
        batches leave ``gpu_share`` of their JPEGs to the GPU decode stage
        (``gpu_split``, with ``budgets`` per image: JPEG bytes, table
        entries, pixels; every ``explore``-th batch one image on each side);
        None when the transform needs more than the GPU runs."""
        if self._native_source() is None:
            return None
        try:
            return self._image_source(self._plan, skip=self.on_error == "skip",
                                      gpu_split=(*budgets, explore))
        except ValueError:  # the plan has ops the GPU stage does not run
            return None

    def _device_normalization(self):
        """For normalize_on_device: (mul, add, dtype) such that the uint8
        batch of ``_native_source(uint8=True)`` times ``mul`` plus ``add``
        per channel, in float32 then cast to ``dtype``, is the float output;
        None when the transform does not end in a float tensor."""
        plan = self._plan
        if not self._native or not plan.tensor_output or plan.dtype == "uint8":
            return None
        return plan.mul[:plan.channels], plan.add[:plan.channels], plan.dtype

    def _record_skips(self, records):
        # The GIL is held: the two updates are not torn.
        self.skipped_count += len(records)
        self.skipped.extend(records)

    def _worker_report(self):
        """In a worker process: the skips recorded since the last report,
        for the loader's own dataset object (``_merge_worker_report``)."""
        new = self.skipped_count - getattr(self, "_reported_count", 0)
        if new == 0:
            return None
        self._reported_count = self.skipped_count
        return new, list(self.skipped)[-new:]

    def _merge_worker_report(self, report):
        count, records = report
        self.skipped_count += count
        self.skipped.extend(records)

def _split(blob):
    """The NUL-terminated paths of a blob, as bytes."""
    return blob.split(b"\0")[:-1]


def _join(paths):
    """(blob, offsets) of bytes paths, as ImageFiles keeps them."""
    blob = b"".join(p + b"\0" for p in paths)
    offsets = np.zeros(len(paths), np.int64)
    if paths:
        offsets[1:] = np.cumsum(np.fromiter(map(len, paths), np.int64, len(paths)) + 1)[:-1]
    return blob, offsets


def _folder_samples(root, keys, extensions, is_valid_file, index):
    """torchvision's make_dataset over the classes ``keys`` (sorted), listed
    in C (``folder_index.walk``): ((blob, offsets) of the paths, samples a
    class, the scan's info)."""
    if _squashfs.is_image_path(root):  # "image.sqfs:/inner": the image's own folders
        return _image_folder_samples(root, keys, extensions, is_valid_file)
    walk, info = folder_index.walk(root, [os.fsencode(k) for k in keys], index=index)
    prefix = folder_index._prefix(root)
    valid = is_valid_file
    c_exts = None
    if extensions is not None:
        exts = extensions if isinstance(extensions, str) else tuple(extensions)
        suffixes = (exts,) if isinstance(exts, str) else exts
        if all(isinstance(e, str) for e in suffixes):
            c_exts = tuple(os.fsencode(e) for e in suffixes)
        else:  # str.endswith raises, as in torchvision
            def valid(path):
                return path.lower().endswith(exts)
    blob, offsets, counts, undecided = _C.dir_samples(prefix, walk, c_exts)
    if c_exts is None:  # is_valid_file, called on every path, as torchvision does
        judge = np.arange(len(offsets))
    else:  # the few paths whose case folding Python has to judge
        judge = undecided
        def valid(path):
            return path.lower().endswith(exts)
    if len(judge):
        judged = [blob[start:blob.index(b"\0", start)] for start in offsets[judge].tolist()]
        keep = np.ones(len(offsets), bool)
        keep[judge] = [bool(valid(os.fsdecode(path))) for path in judged]
        if not keep.all():
            top = np.repeat(np.arange(len(keys)), counts)
            counts = np.bincount(top[keep], minlength=len(keys))
            blob, offsets = _join([p for p, k in zip(_split(blob), keep.tolist()) if k])
    return (blob or b"\0", offsets), counts, info  # ImageSource's blob ends with a NUL


def _image_folder_samples(root, keys, extensions, is_valid_file):
    """``_folder_samples`` for a root inside a SquashFS image: its folders
    listed through libsquashfs, torchvision's filter applied here.  No
    index file: the image is one file, its folders are read from memory."""
    if is_valid_file is None:
        exts = extensions if isinstance(extensions, str) else tuple(extensions)
        def is_valid_file(path):
            return path.lower().endswith(exts)
    paths, counts = [], []
    for key in keys:
        before = len(paths)
        for folder, names in _squashfs.walk_class(os.fsencode(os.path.join(root, key))):
            for name in sorted(names):
                path = folder + b"/" + name
                if is_valid_file(os.fsdecode(path)):
                    paths.append(path)
        counts.append(len(paths) - before)
    blob, offsets = _join(paths)
    info = {"index": None, "reused": False, "dirs_read": None, "dirs_checked": 0}
    return (blob or b"\0", offsets), np.asarray(counts, np.int64), info


class ImageFolder(ImageFiles):
    """torchvision's ImageFolder, decoded in C.

    ``ImageFolder(root, transform=None, target_transform=None, loader=None,
    is_valid_file=None, allow_empty=False)`` as torchvision's, but the
    default ``loader`` (None) is the C decoder, and the image a Python
    ``transform`` gets is an HWC uint8 array; pass ``loader=default_loader``
    (fastload's or torchvision's) for PIL images.  fastload's own arguments
    are keywords.  The walk keeps torchvision's order, but each folder
    (st_dev, st_ino) is walked once per class: a symlink loop, which
    torchvision's walk follows until ELOOP, listing its files dozens of
    times, is cut; a folder linked twice is listed at its first path.

    The tree is listed in C on a few threads and kept in an index file
    (``.fastload-folder-index`` in ``root``, else in ``$FASTLOAD_INDEX_DIR``)
    that later constructions reuse while no folder in the tree has changed:
    they read one file and stat each folder
    (``fastload.datasets.folder_index``).  ``index=False``: no index file,
    read or written.  ``scan_info`` says what the construction did.
    """

    def __init__(self, root, transform=None, target_transform=None, loader=None,
                 is_valid_file=None, allow_empty=False, *, extensions=None, decode="fast",
                 on_error="raise", max_pixels=PILLOW_MAX_PIXELS, cache=None, cache_size=None,
                 cache_decoded=False, cache_restart_markers=False, index=True):
        self.root = os.path.expanduser(os.fspath(root))
        if extensions is not None and is_valid_file is not None:
            raise ValueError("Both extensions and is_valid_file cannot be None or not None "
                             "at the same time")
        self.classes, self.class_to_idx = self.find_classes(self.root)
        if not self.class_to_idx:
            raise ValueError("'class_to_index' must have at least one entry to collect any "
                             "samples.")
        if extensions is None and is_valid_file is None:
            extensions = IMG_EXTENSIONS
        # torchvision's order: classes sorted; in each, the folders of
        # os.walk sorted by path, and the files of each folder sorted.
        keys = sorted(self.class_to_idx)
        paths, counts, self.scan_info = _folder_samples(self.root, keys, extensions,
                                                        is_valid_file, index)
        empty = [name for name, count in zip(keys, counts.tolist()) if count == 0]
        if empty and not allow_empty:
            msg = f"Found no valid file for the classes {', '.join(sorted(empty))}. "
            if extensions is not None:
                msg += ("Supported extensions are: " + (extensions if isinstance(extensions, str)
                                                        else ", ".join(extensions)))
            raise FileNotFoundError(msg)
        self.extensions = extensions
        labels = np.repeat(np.asarray([self.class_to_idx[k] for k in keys], np.int64), counts)
        self._setup(paths, labels, transform, target_transform, decode, on_error, max_pixels,
                    loader, cache=cache, cache_size=cache_size, cache_decoded=cache_decoded,
                    cache_restart_markers=cache_restart_markers)

    @staticmethod
    def find_classes(directory):
        if _squashfs.is_image_path(directory):  # "image.sqfs:/inner" (squashfs.py)
            classes = _squashfs.find_classes(directory)
        else:
            classes = sorted(e.name for e in os.scandir(directory) if e.is_dir())
        if not classes:
            raise FileNotFoundError(f"Couldn't find any class folder in {directory}.")
        return classes, {name: i for i, name in enumerate(classes)}
