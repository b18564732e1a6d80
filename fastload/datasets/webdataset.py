"""WebDataset tar shards, read natively: ``WebDataset`` and ``ShardSampler``.

A shard is a plain tar file whose members are grouped into samples by
WebDataset's rule: the member path up to the first dot of its last
component is the sample's key, the rest its extension (``n01/img7.jpg`` and
``n01/img7.cls`` are sample ``n01/img7``).  ``WebDataset`` indexes every
shard once (in C, headers only: ``_C.tar_index``; later from its index file,
read when the shard is first needed), and is then a map-style
dataset: sample ``i`` is ``(image, label)``, its image a byte range of its
shard decoded by the same C pipeline as ``ImageFolder`` (JPEG with region
decode and DCT scaling; other formats through Pillow), its label the
integer in its ``.cls`` member.  So every sampler works (``shuffle=True``,
``DistributedSampler``), batches take the native path (no Python per
sample), and a loader over it resumes like any other.

Streaming order, as WebDataset users expect it, is a sampler:
``ShardSampler`` visits the shards in an order shuffled per epoch, reads
each shard's samples in sequence through a shuffle buffer, and splits that
stream between ranks by samples (equal shares at any number of ranks) --
the disk sees long sequential reads, and the order depends only on (seed,
epoch), never on ``num_workers``.
"""

import concurrent.futures
import copy
import errno
import io
import itertools
import json
import os
import pickle
import re
import threading

import numpy as np

from .. import _C
from . import shard_index
from . import squashfs as _squashfs
from .remote import shards as remote_shards
from .remote import store as remote_store
from .remote import urls as remote_urls
from .remote.shard_cache import ShardCache
from .indexing import check_index
from .images import MAX_SKIPS_PER_SAMPLE, PILLOW_MAX_PIXELS, ImageFiles
from ..loader.sampler import Sampler

__all__ = ["WebDataset", "ShardSampler", "expand_urls", "write_index"]

IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "ppm", "pgm", "bmp", "webp", "tif", "tiff")

_BRACES = re.compile(r"\{([^{}]*)\}")


def _decode_int(data):
    return int(data.decode("ascii").strip())


def _decode_npy(data):
    return np.load(io.BytesIO(data), allow_pickle=False)


def _decode_torch(data):
    import torch

    return torch.load(io.BytesIO(data))


def _decode_image(data):
    from PIL import Image

    with Image.open(io.BytesIO(data)) as img:
        return np.asarray(img.convert("RGB"))


# What webdataset's default decoders make of each extension; anything else
# stays bytes.  (Like webdataset, "pyd"/"pickle" unpickle: only for shards
# you trust.)
DEFAULT_DECODERS = {
    **dict.fromkeys(("cls", "cls2", "class", "count", "index", "inx", "id"), _decode_int),
    **dict.fromkeys(("txt", "text", "transcript"), lambda data: data.decode("utf-8")),
    **dict.fromkeys(("json", "jsn"), json.loads),
    "npy": _decode_npy,
    **dict.fromkeys(("pyd", "pickle"), pickle.loads),
    "pth": _decode_torch,
    **dict.fromkeys(IMAGE_EXTENSIONS, _decode_image),
}


def expand_urls(urls):
    """Shard paths from a list, or from one string with brace patterns as
    WebDataset writes them: ``"data/shard-{000000..000099}.tar"`` (numeric
    ranges keep the width of their first bound), ``"{a,b}.tar"``, several
    braces, and ``"::"`` between patterns."""
    if isinstance(urls, (str, bytes, os.PathLike)):
        urls = [os.fsdecode(urls)]
        urls = [part for url in urls for part in url.split("::")]
        return [path for url in urls for path in _expand_one(url)]
    paths = [os.fsdecode(u) for u in urls]
    if not paths:
        raise ValueError("no shards given")
    return paths


def _expand_one(pattern):
    match = _BRACES.search(pattern)
    if match is None:
        return [pattern]
    head, tail = pattern[:match.start()], pattern[match.end():]
    body = match.group(1)
    numeric = re.fullmatch(r"(\d+)\.\.(\d+)", body)
    if numeric:
        lo, hi = numeric.groups()
        if int(hi) < int(lo):
            raise ValueError(f"empty range {{{body}}} in {pattern!r}")
        choices = [str(i).zfill(len(lo)) for i in range(int(lo), int(hi) + 1)]
    else:
        choices = body.split(",")
    return [path for choice in choices for path in _expand_one(head + choice + tail)]


def _split_name(name):
    """(key, extension) of a member path, as WebDataset splits it."""
    slash = name.rfind(b"/") + 1
    dot = name.find(b".", slash)
    return name[:dot], name[dot + 1:]


class _Shard:
    """One shard's samples: where each one's image is, and its label.

    Built from the C index with array operations, not a Python loop over
    members, or read from the shard's index file (shard_index), which keeps
    these arrays too: per image-extension list, each sample's image range;
    per label extension, the labels; and each sample's key.  From an index
    file only the sample count is read when the shard is opened; the arrays
    are read by ``load()``, when a sample of the shard is first needed (a
    rank reads the index files of its own shards only)."""

    def __init__(self, path, image_extensions, label_extension, keep_index, index_files=True,
                 found=None, name=None):
        # found: the shard's index file (shard_index.load), whose arrays
        # load() reads, or a remote one read then (remote.shards.DeferredIndex);
        # None: the shard is indexed now (and, with index_files, the file
        # written).  name: what messages call the shard (its URL), default path.
        self.path = path
        self.name = name or path
        self._extensions_wanted = (image_extensions, label_extension)
        self._keep_index = keep_index
        self._index_files = index_files
        self._kept_names = ("images." + ",".join(image_extensions),
                            f"labels.{label_extension}" if label_extension else None)
        if found is not None:
            self.count = found.samples
            self._unread = found
        else:
            self._unread = None
            self._index(None)

    @property
    def loaded(self):
        return self._unread is None

    def load(self):
        """Reads the shard's arrays from its index file, if not read yet: the
        ones an earlier reader derived with these settings, else the member
        index to derive them from.  An index file replaced or damaged since
        the shard was opened: the shard is indexed again, and must still
        hold as many samples."""
        found, self._unread = self._unread, None
        if found is None:
            return
        pin = None
        if isinstance(found, remote_shards.DeferredIndex):  # a remote index file, read now
            deferred, found = found, found.open()
            if found is None:  # gone since: index the shard itself
                pin = deferred.pin()
        try:
            self._load_from(found)
        finally:
            if pin is not None:
                pin.release()

    def _load_from(self, found):
        images_key, labels_key = self._kept_names
        n = self.count
        if found is None:
            self._index(None)
            self._check_count(n)
            return
        try:
            wanted = ["key_spans", images_key] + ([labels_key] if labels_key else [])
            if all(name in found and found.length(name) in (n, 2 * n) for name in wanted):
                self.index = found.member_index() if self._keep_index else None
                self._key_spans = found.get("key_spans").reshape(n, 2)
                self.images = found.get(images_key).reshape(n, 2)
                self.labels = found.get(labels_key) if labels_key else np.zeros(n, np.int64)
                self._names_from = found  # the names are read when a key is first asked for
                return
        except OSError:
            found = None
        self._index(found)
        self._check_count(n)

    def _check_count(self, n):
        if self.count != n:
            raise ValueError(f"{self.name}: the shard changed while it was read: {n} samples "
                             f"when the dataset was made, {self.count} now")

    def _index(self, found):
        """Indexes the shard: from the member index of ``found`` (an index
        file without the arrays these settings derive), else from the tar
        headers; saves the index file unless index files are off."""
        image_extensions, label_extension = self._extensions_wanted
        images_key, labels_key = self._kept_names
        path = self.path
        if found is not None:
            try:
                index, kept = found.member_index(), found.kept()
            except OSError:  # replaced or damaged since it was opened
                found = None
        if found is None:
            index, kept = _C.tar_index(path), {}
        self.index = index if self._keep_index else None  # every member, for fields
        self._names = index["names"]
        n = self.count = len(index["sample_starts"]) - 1
        member_with = self._members_by_extension(index)
        image = np.full(n, -1, np.int64)
        for extension in reversed(image_extensions):  # the first listed wins
            candidate = member_with(extension)
            image = np.where(candidate >= 0, candidate, image)
        if (image < 0).any():
            bad = int(np.flatnonzero(image < 0)[0])
            raise ValueError(f"{self.name}: sample {self.key(bad)!r} has no image member (one of "
                             f"{', '.join(image_extensions)}); it has "
                             f"{', '.join(self._extensions(index, bad)) or 'nothing'}")
        offsets, sizes = index["offsets"], index["sizes"]
        self.images = np.stack([offsets[image], sizes[image]], axis=1)
        self.labels = np.zeros(n, np.int64)
        if labels_key:
            self.labels = self._read_labels(member_with(label_extension), label_extension,
                                            offsets, sizes)
            kept[labels_key] = self.labels
        if self._index_files:  # for the next start, and the other ranks
            kept.update({"key_spans": self._key_spans.ravel(), images_key: self.images.ravel()})
            shard_index.save(path, index, kept)

    _names_from = None

    @property
    def _names(self):
        """The members' names, NUL-terminated, back to back (for keys)."""
        if self._names_from is not None:
            try:
                names = self._names_from.get("names").tobytes()
            except OSError:  # the file was replaced since: the shard is the same
                names = _C.tar_index(self.path, False)["names"]
            self.__dict__["_names"], self._names_from = names, None
        return self.__dict__["_names"]

    @_names.setter
    def _names(self, names):
        self.__dict__["_names"] = names

    def _members_by_extension(self, index):
        """Sets the samples' key spans; returns ``member_with(extension)``:
        per sample, its member with that extension, or -1."""
        names = np.frombuffer(index["names"], np.uint8)
        members, starts = index["sample_members"], index["sample_starts"]
        n = self.count
        ends = np.flatnonzero(names == 0)  # member i's name ends at ends[i]
        key_lengths = index["key_lengths"][members]
        name_starts = index["name_offsets"][members]
        first = starts[:-1]  # each sample's first member: its key
        self._key_spans = np.stack([name_starts[first], key_lengths[first]], axis=1)
        sample_of = np.repeat(np.arange(n), np.diff(starts))  # for each entry of `members`
        ext_start = name_starts + key_lengths + 1
        ext_length = ends[members] - ext_start
        upper = (names >= 65) & (names <= 90)
        lower = names + upper.astype(np.uint8) * 32  # extensions compare in ASCII lower case

        def member_with(extension):
            wanted = np.frombuffer(extension.encode(), np.uint8)
            hit = ext_length == len(wanted)
            for j, byte in enumerate(wanted):
                at = np.minimum(ext_start + j, len(lower) - 1)
                hit &= lower[at] == byte
            found = np.full(n, -1, np.int64)
            found[sample_of[hit]] = members[hit]
            return found

        return member_with

    def key(self, s):
        start, length = self._key_spans[s]
        return os.fsdecode(self._names[start:start + length])

    def _extensions(self, index, s):
        starts, members = index["sample_starts"], index["sample_members"]
        out = []
        for m in members[starts[s]:starts[s + 1]]:
            begin = index["name_offsets"][m]
            out.append(os.fsdecode(_split_name(self._names[begin:self._names.index(b"\0",
                                                                                  begin)])[1]))
        return sorted(out)

    def _read_labels(self, member, extension, offsets, sizes):
        if (member < 0).any():
            s = int(np.flatnonzero(member < 0)[0])
            raise ValueError(f"{self.name}: sample {self.key(s)!r} has no .{extension} member")
        where, size = offsets[member], sizes[member]
        if (size > 64).any():
            s = int(np.flatnonzero(size > 64)[0])
            raise ValueError(f"{self.name}: {self.key(s)}.{extension} is {size[s]} bytes, not "
                             "a class index")
        # Every label in one call: one open, one pread a member, in C.
        try:
            blob = _C.tar_read(self.path, where, size)
        except OSError as error:
            if error.errno != errno.EIO or _squashfs.is_image_path(self.path):
                raise  # (inside an image, the error names the image and the shard)
            length = os.path.getsize(self.path)
            s = int(np.flatnonzero(where + size > length)[0]) if (where + size > length).any() \
                else 0
            raise OSError(errno.EIO, f"file changed under the loader: {self.path!r} is shorter "
                          f"than when it was opened (the .{extension} member of sample "
                          f"{self.key(s)!r}; {length} bytes now)") from None
        ends = np.cumsum(size).tolist()
        labels = np.empty(self.count, np.int64)
        start = 0
        for s, end in enumerate(ends):
            try:
                labels[s] = int(blob[start:end])
            except ValueError:
                raise ValueError(f"{self.name}: {self.key(s)}.{extension} holds "
                                 f"{blob[start:end][:64]!r}, not an integer class index") from None
            start = end
        return labels


def write_index(path):
    """Writes the index file of the shard at ``path`` (shard_index): with
    the image ranges and labels WebDataset's defaults read, or the member
    index alone when its samples are of another kind."""
    try:
        _Shard(path, IMAGE_EXTENSIONS, "cls", keep_index=False)  # derives, and saves
    except ValueError:
        shard_index.save(path, _C.tar_index(path))


class WebDataset(ImageFiles):
    """WebDataset tar shards as a map-style dataset of ``(image, label)``.

    ``WebDataset(urls, transform=None, target_transform=None, *,
    image_extensions=IMAGE_EXTENSIONS, label_extension="cls", decode="fast",
    on_error="raise", max_pixels=PILLOW_MAX_PIXELS, index_threads=None, index_files=True)``

    ``urls``: a list of shard paths or a brace pattern (``expand_urls``).
    ``fields``: what a sample is.  None (default): ``(image, label)``, the
    batches made in C.  A tuple of names: a tuple of those members,
    ``"image"`` being the transformed image, ``"label"`` the label, and any
    other name an extension decoded as webdataset decodes it (``json``,
    ``txt``, ``npy``, ``cls``, images to HWC uint8 arrays; ``decoders``
    maps extensions to your own ``bytes -> value``).  ``"dict"``: every
    member so, with ``"__key__"``, ``"image"`` and ``"label"``.  With fields
    each sample is read in Python (the loader gives such datasets process
    workers).
    Each sample's image is its first member with one of
    ``image_extensions``; its label the integer in its ``label_extension``
    member (None: no labels, 0 each).  A sample without them is an error
    naming the shard and the key.  ``transform`` and the rest are
    ``ImageFiles``'s: a fastload ``Compose`` with a fixed output size gives
    batches made in C.  Shards are indexed once, in parallel threads, when
    the dataset is made; ``key(i)`` and ``shard_of(i)`` say where sample
    ``i`` came from.  With ``index_files`` (default) a shard's index is read
    from its index file (``<shard>.fastload-index``, written by
    ``write_shards`` or by the first ``WebDataset`` over it; see
    fastload.datasets.shard_index) instead of its headers, while the shard
    keeps its size and modification time, and only when one of the shard's
    samples is first needed (the dataset is made from each file's sample
    count: a rank reads its own shards' index files); False: always read
    the headers, write nothing.

    URLs (``s3://``, ``gs://``, ``az://``, ``http(s)://``; ``file://`` is a
    path) are read through obstore (``pip install fastload-torch[remote]``;
    fastload.datasets.remote): a URL ending in ``/``, or with a glob, is
    every object under it.  Each shard is downloaded whole, with parallel
    range reads, into the node-local shard cache ``cache_dir`` (default
    ``$FASTLOAD_SHARD_CACHE``, else ``~/.cache/fastload/shards``), bounded
    by ``cache_bytes`` (least recently used shards evicted; shards in use
    never), when a batch first needs it; ``ShardSampler`` has the next
    ``prefetch_shards`` fetched ahead.  Every worker, rank and job on the
    node shares the cache: a shard is downloaded once.  The sample counts
    come from the index files beside the shards (``write_shards`` writes
    them; upload them with the shards) with one small read each, else the
    shards are downloaded when the dataset is made.  ``storage_options``:
    obstore's store settings (``endpoint``, ``region``, credentials; by
    default its environment variables); ``remote_options``: ``attempts``,
    ``backoff_s``, ``max_backoff_s``, ``timeout_s``, ``connect_timeout_s``,
    ``range_bytes``, ``ranges_in_flight`` (fastload.datasets.remote.store).
    """

    def __init__(self, urls, transform=None, target_transform=None, *,
                 image_extensions=IMAGE_EXTENSIONS, label_extension="cls", decode="fast",
                 on_error="raise", max_pixels=PILLOW_MAX_PIXELS, index_threads=None,
                 fields=None, decoders=None, cache=None, cache_size=None, cache_decoded=False,
                 index_files=True, cache_restart_markers=False, cache_dir=None,
                 cache_bytes=None, storage_options=None, remote_options=None,
                 prefetch_shards=remote_shards.PREFETCH_SHARDS):
        self.urls = expand_urls(urls)
        self._remote = None
        if any(remote_urls.is_remote(u) or remote_urls.scheme(u) == "file" for u in self.urls):
            store = remote_store.Store(storage_options, **(remote_options or {}))
            self.urls = remote_urls.resolve(self.urls, store.list)
            if any(remote_urls.is_remote(u) for u in self.urls):
                self._remote = remote_shards.RemoteShards(
                    self.urls, store, ShardCache(cache_dir, cache_bytes),
                    threads=index_threads or 16, prefetch_shards=prefetch_shards)
        paths = self._remote.paths if self._remote is not None else self.urls
        if fields is not None and fields != "dict" and (
                isinstance(fields, str) or not all(isinstance(f, str) for f in fields)):
            raise ValueError(f"fields must be None, 'dict' or a tuple of names, got {fields!r}")
        self.fields = tuple(fields) if fields not in (None, "dict") else fields
        self.decoders = {**DEFAULT_DECODERS, **(decoders or {})}
        image_extensions = tuple(e.lower().lstrip(".") for e in image_extensions)
        threads = index_threads or min(8, len(self.urls), os.cpu_count() or 1)
        if self._remote is not None:  # waits on the network more than on the cores
            threads = index_threads or min(16, len(self.urls))

        def shard(s, found=None):
            pin = None
            if found is None and self._remote is not None and self._remote.remote[s]:
                pin = self._remote.pin_now(s)  # downloaded to be indexed
            try:
                return _Shard(paths[s], image_extensions, label_extension,
                              keep_index=fields is not None, index_files=index_files,
                              found=found, name=self.urls[s])
            finally:
                if pin is not None:
                    pin.release()

        # A shard with an index file costs a stat and one small read here (a
        # remote one: one small GET); the others are indexed (their headers
        # read; a remote one downloaded first) in parallel threads.
        if not index_files:
            found = [None] * len(paths)
        elif self._remote is not None:
            with concurrent.futures.ThreadPoolExecutor(threads) as pool:
                found = list(pool.map(self._remote.found_index, range(len(paths))))
        else:
            found = [shard_index.load(path) for path in paths]
        shards = [shard(s, f) if f is not None else None for s, f in enumerate(found)]
        unindexed = [s for s, f in enumerate(found) if f is None]
        with concurrent.futures.ThreadPoolExecutor(min(threads, len(unindexed) or 1)) as pool:
            for s, made in zip(unindexed, pool.map(shard, unindexed)):
                shards[s] = made
        self._shard_list = shards  # their full indexes too, with fields
        counts = np.array([shard.count for shard in shards], np.int64)
        self.shard_starts = np.concatenate(([0], np.cumsum(counts)))  # samples of shard s
        encoded = [os.fsencode(path) + b"\0" for path in paths]
        path_offsets = np.concatenate(([0], np.cumsum([len(e) for e in encoded])[:-1]))
        offsets = np.repeat(path_offsets.astype(np.int64), counts)
        # Each shard's rows are written when it is loaded (_ready), before
        # any of its samples is read; the native sources read these arrays.
        total = int(self.shard_starts[-1])
        self._unloaded = {s for s, shard in enumerate(shards) if not shard.loaded}
        self._load_lock = threading.Lock()
        self._index_threads = threads
        ranges, labels = np.zeros((total, 2), np.int64), np.zeros(total, np.int64)
        self._ranges, self._labels = ranges, labels
        for s in range(len(shards)):
            if s not in self._unloaded:
                self._fill(s)
        if cache is not None:  # the cache's key covers every sample's range
            self._load(sorted(self._unloaded))
        self._setup((b"".join(encoded), offsets), labels, transform, target_transform, decode,
                    on_error, max_pixels, loader=None, ranges=ranges,
                    cache=cache, cache_size=cache_size, cache_decoded=cache_decoded,
                    cache_restart_markers=cache_restart_markers)

    def _fill(self, s):
        """Writes shard ``s``'s rows of the ranges and labels; the shard
        then keeps only its keys (and member index, with fields)."""
        shard = self._shard_list[s]
        rows = slice(int(self.shard_starts[s]), int(self.shard_starts[s + 1]))
        self._ranges[rows], self._labels[rows] = shard.images, shard.labels
        shard.images = shard.labels = None

    def _ready(self, indices, timeout=None):
        """Loads the shards that samples ``indices`` lie in: their index
        files are read, their rows filled.  The loader calls it with each
        batch's indices before the native source reads them; ``__getitem__``
        with its own.  With ``on_error="skip"`` the shards after them are
        loaded too, as far as a failed sample's replacements (the next
        samples) can reach.  ``timeout``: the loader's, for the download
        of remote shards (``FetchTimeout`` naming the URL)."""
        if not self._unloaded and self._remote is None:
            return
        shards = self._shards_of(indices)
        if self._remote is not None:
            self._remote.ready(sorted(shards), timeout)
        wanted = shards & self._unloaded
        if wanted:
            self._load(sorted(wanted))

    def _shards_of(self, indices):
        """The shards samples ``indices`` lie in (with on_error="skip", and
        those their replacements can reach)."""
        indices = np.asarray(indices, np.int64).ravel()
        shards = set(np.unique(np.searchsorted(self.shard_starts, indices, side="right") - 1)
                     .tolist())
        if self.on_error == "skip":
            shards |= self._reach(shards)
        return shards

    def _fetch(self, indices, timeout=None):
        """Brings the remote shards samples ``indices`` lie in into the node
        cache and pins them there while the batch may be in flight (the
        native-source protocol's ``_fetch``): the loader calls it where the
        indices are drawn when the batch is read elsewhere (worker processes,
        which cannot download: obstore does not survive fork).  ``timeout``
        as for ``_ready``."""
        if self._remote is not None:
            self._remote.ready(sorted(self._shards_of(indices)), timeout)

    def _prefetch(self, shards):
        """Fetches ``shards`` (numbers in ``urls``, the sampler's next) into
        the node cache in the background (``ShardSampler`` calls it)."""
        if self._remote is not None:
            self._remote.prefetch(shards)

    def _reach(self, shards):
        """The shards after each of ``shards`` (wrapping round) that hold its
        next ``MAX_SKIPS_PER_SAMPLE`` samples."""
        counts, n = np.diff(self.shard_starts), len(self._shard_list)
        out = set()
        for s in shards:
            covered, t = 0, s
            while covered < MAX_SKIPS_PER_SAMPLE and len(out) < n:
                t = (t + 1) % n
                out.add(t)
                covered += int(counts[t])
        return out

    def _load(self, shards):
        """Reads shards' index files (in threads) and fills their rows."""
        with self._load_lock:
            shards = [s for s in shards if s in self._unloaded]
            if not shards:
                return
            threads = min(self._index_threads, len(shards))
            if threads == 1:
                for s in shards:
                    self._shard_list[s].load()
            else:
                with concurrent.futures.ThreadPoolExecutor(threads) as pool:
                    list(pool.map(lambda s: self._shard_list[s].load(), shards))
            for s in shards:
                self._fill(s)
                self._unloaded.discard(s)

    @property
    def targets(self):
        self._load(sorted(self._unloaded))
        return super().targets

    def __getstate__(self):
        state = super().__getstate__()
        state["decoders"] = {k: v for k, v in self.decoders.items()
                             if DEFAULT_DECODERS.get(k) is not v}  # the defaults by name
        del state["_load_lock"]
        return state

    def __setstate__(self, state):
        state["decoders"] = {**DEFAULT_DECODERS, **state["decoders"]}
        state["_load_lock"] = threading.Lock()
        super().__setstate__(state)

    def _read(self, index):
        self._ready((index,))
        return super()._read(index)

    def _native_source(self, uint8=False):
        return super()._native_source(uint8) if self.fields is None else None

    def __getitem__(self, index):
        if self.fields is None:
            return super().__getitem__(index)
        index = check_index(index, len(self))
        members = self.members(index)
        decoded = {}

        def value(name):
            if name in ("image", "label"):
                if not decoded:  # the image is decoded only when asked for
                    decoded["image"], decoded["label"] = super(WebDataset, self).__getitem__(
                        index)
                return decoded[name]
            if name == "__key__":
                return self.key(index)
            if name not in members:
                raise KeyError(f"{self.path(index)} has no .{name} member (it has "
                               f"{', '.join(sorted(members))})")
            decoder = self.decoders.get(name)
            return decoder(members[name]) if decoder is not None else members[name]

        if self.fields == "dict":
            names = ["__key__", "image", "label", *sorted(members)]
            return {name: value(name) for name in names}
        return tuple(value(name) for name in self.fields)

    def members(self, index):
        """Every member of sample ``index`` as raw bytes, by extension
        (datasets made with ``fields``)."""
        s = self.shard_of(index)
        self._ready((index,))
        shard = self._shard_list[s]
        if shard.index is None:
            raise RuntimeError("members() needs a WebDataset made with fields=")
        local = index - int(self.shard_starts[s])
        idx = shard.index
        names, name_offsets = idx["names"], idx["name_offsets"]
        starts = idx["sample_starts"]
        out = {}
        for m in idx["sample_members"][starts[local]:starts[local + 1]]:
            begin = name_offsets[m]
            _, ext = _split_name(names[begin:names.index(b"\0", begin)])
            out[ext.decode("utf-8", "replace")] = shard_index._pread(
                shard.path, int(idx["sizes"][m]), int(idx["offsets"][m]))
        return out

    def shard_of(self, index):
        """The shard sample ``index`` is in (its number in ``urls``)."""
        return int(np.searchsorted(self.shard_starts, index, side="right") - 1)

    def key(self, index):
        """Sample ``index``'s key (its members' names without extensions)."""
        s = self.shard_of(index)
        self._ready((index,))
        return self._shard_list[s].key(index - int(self.shard_starts[s]))

    @property
    def keys(self):
        """Every sample's key, as a new list (``key(i)`` is one)."""
        self._load(sorted(self._unloaded))
        return [shard.key(i) for shard in self._shard_list for i in range(shard.count)]

    def path(self, index):
        return f"{self.urls[self.shard_of(index)]}:{self.key(index)}"

    def __repr__(self):
        return f"WebDataset({len(self)} samples in {len(self.urls)} shards)"


def _distributed_rank():
    """(rank, world size): torch.distributed when initialised, else the
    RANK and WORLD_SIZE environment variables, else (0, 1)."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except ImportError:
        pass
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def _cut(total, rank, world):
    """(first, end): rank's run of ``total`` positions split between ``world``
    ranks, N/W give or take one each."""
    return total * rank // world, total * (rank + 1) // world


class ShardSampler(Sampler):
    """Sample indices of a ``WebDataset`` in streaming order.

    ``ShardSampler(dataset, shuffle=True, seed=0, buffer_size=1000, rank=None,
    world_size=None, equal_length=True, drop_last=False)``

    Each epoch (``set_epoch``, as ``DistributedSampler``) has one stream:
    the shards in an order shuffled with (seed, epoch), their samples in
    sequence.  The stream is split between ranks by samples, not by shards:
    rank r of W takes positions ``[N*r//W, N*(r+1)//W)`` of the N samples
    (rank and world size from torch.distributed, else RANK/WORLD_SIZE, else
    the arguments' defaults 0 and 1), so the shares differ by one sample at
    most whatever the shard sizes, and a rank reads a run of whole shards
    with a part of one at either end (long sequential reads; a share may
    start or end inside a shard).  Each rank reads its share through a
    shuffle buffer of ``buffer_size`` samples (0: none).  Every draw is keyed
    by (seed, epoch), so the order does not depend on ``num_workers``.

    DDP needs the same number of batches on every rank: with
    ``equal_length`` (default) every rank yields ``ceil(N/W)`` samples, a
    rank one short repeating its share's first sample (as
    ``DistributedSampler`` pads), or, with ``drop_last=True``,
    ``floor(N/W)``, a rank one over leaving one out.  Either way an epoch
    shows every sample, less at most W - 1 with ``drop_last``.  Without
    ``equal_length`` each rank yields its share as it is.
    """

    def __init__(self, dataset, shuffle=True, seed=0, buffer_size=1000, rank=None,
                 world_size=None, equal_length=True, drop_last=False):
        starts = getattr(dataset, "shard_starts", None)
        if starts is None:
            raise TypeError("ShardSampler needs a fastload.WebDataset")
        if rank is None or world_size is None:
            found_rank, found_world = _distributed_rank()
            rank = found_rank if rank is None else rank
            world_size = found_world if world_size is None else world_size
        self.rank, self.world_size = rank, world_size
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is not in [0, {self.world_size})")
        self.starts = np.asarray(starts, dtype=np.int64)  # shard s: samples [starts[s], starts[s+1])
        self.total = int(self.starts[-1])
        if self.total < self.world_size:
            raise ValueError(f"{self.total} samples cannot be split between "
                             f"{self.world_size} ranks")
        if buffer_size < 0:
            raise ValueError(f"buffer_size must be >= 0, got {buffer_size}")
        self.shuffle = shuffle
        self.seed = seed
        self.buffer_size = buffer_size
        self.equal_length = equal_length
        self.drop_last = drop_last
        self.epoch = 0
        # A remote dataset's next shards are fetched ahead, in this order.
        self._prefetch = (dataset._prefetch if getattr(dataset, "_remote", None) is not None
                          else None)

    def set_epoch(self, epoch):
        self.epoch = epoch

    def share(self, rank=None):
        """``(first, end)``: the positions of ``rank``'s share (default: this
        sampler's) in the epoch's stream."""
        return _cut(self.total, self.rank if rank is None else rank, self.world_size)

    def _order(self):
        n = len(self.starts) - 1
        if not self.shuffle:
            return np.arange(n)
        return np.random.default_rng([self.seed, self.epoch, 0]).permutation(n)

    def _length(self, share, total):
        """How many samples a rank yields of its ``share`` of ``total``."""
        if not self.equal_length:
            return share
        if self.drop_last:
            return total // self.world_size
        return -(-total // self.world_size)

    def __len__(self):
        rest = self._rest()
        total = self.total if rest is None else len(rest)
        first, end = _cut(total, self.rank, self.world_size)
        return self._length(end - first, total)

    def stream(self, first, end):
        """The sample indices at positions ``[first, end)`` of this epoch's
        stream, in order: parts of the shards that hold them, each read in
        sequence."""
        order = self._order()
        sizes = np.diff(self.starts)[order]
        ends = np.cumsum(sizes)  # where each shard, in this epoch's order, ends in the stream
        k = int(np.searchsorted(ends, first, side="right"))
        last = int(np.searchsorted(ends, end - 1, side="right")) if end > first else k
        position = first
        while position < end:
            if self._prefetch is not None:  # this share's next shards, fetched meanwhile
                self._prefetch(order[k + 1:last + 1].tolist())
            shard_first = int(ends[k] - sizes[k])
            base = int(self.starts[order[k]]) - shard_first
            stop = min(end, int(ends[k]))
            yield from range(base + position, base + stop)
            position = stop
            k += 1

    def __iter__(self):
        rest = self._rest()
        if rest is None:
            total, part = self.total, self.stream
        else:  # the rest of an epoch another number of ranks began
            total, part = len(rest), lambda a, b: iter(rest[a:b].tolist())
        first, end = _cut(total, self.rank, self.world_size)
        count = self._length(end - first, total)
        stream = part(first, end)
        if count > end - first:  # one short of the others: repeat the share's first sample
            pad = part(first, first + count - (end - first))
            stream = itertools.chain(stream, pad if end > first else part(0, 1))
        if self.shuffle and self.buffer_size > 1:
            stream = self._buffered(stream)
        for index in itertools.islice(stream, count):
            yield int(index)

    # -- elastic resume ---------------------------------------------------------

    def continue_epoch(self, settings, runs):
        """Makes this epoch the rest of one that runs on other numbers of
        ranks began (``DataLoader.load_state_dict`` calls it: elastic
        resume).  ``settings`` are the recorded sampler's; ``runs`` lists,
        oldest first, each run's ``[world_size, samples yielded by each of
        its ranks]`` (the same on every rank: ``equal_length``).  The samples
        those runs did not yield are this epoch's stream, split between this
        run's ranks as an epoch is.  Returns False where the epoch cannot be
        continued so (other settings, or unequal lengths)."""
        mine = {"seed": self.seed, "shuffle": self.shuffle, "buffer_size": self.buffer_size,
                "equal_length": self.equal_length, "drop_last": self.drop_last,
                "epoch": self.epoch}
        if not settings.get("equal_length") or any(settings.get(name) != value
                                                  for name, value in mine.items()):
            return False
        runs = tuple((int(world), int(yielded)) for world, yielded in runs)
        begun = copy.copy(self)
        for n, (world, yielded) in enumerate(runs):
            begun.world_size, begun._runs = world, (self.epoch, runs[:n])
            if world < 1 or not 0 <= yielded <= len(begun):
                return False
        self._runs = (self.epoch, runs)
        return True

    @property
    def continued(self):
        """The runs this epoch continues (``continue_epoch``), as
        ``[[world_size, yielded], ...]``, or None: a loader's state records
        them, so an epoch continued once can be resumed again."""
        runs = self._current_runs()
        return [list(run) for run in runs] if runs else None

    _runs = None    # (epoch, ((world size, yielded), ...)) from continue_epoch
    _rest_of = None  # (_runs, the rest of that epoch's stream)

    def _current_runs(self):
        return self._runs[1] if self._runs is not None and self._runs[0] == self.epoch else ()

    def _rest(self):
        """The sample indices a continued epoch has still to show, in stream
        order, or None when no other run began this epoch."""
        runs = self._current_runs()
        if not runs:
            return None
        if self._rest_of is not None and self._rest_of[0] == self._runs:
            return self._rest_of[1]
        shown = np.zeros(self.total, dtype=bool)
        for n, (world, yielded) in enumerate(runs):
            for rank in range(world):  # what each rank of that run yielded
                begun = copy.copy(self)
                begun._prefetch = None  # a replay reads nothing
                begun.rank, begun.world_size = rank, world
                begun._runs, begun._rest_of = (self.epoch, runs[:n]), None
                shown[np.fromiter(itertools.islice(iter(begun), yielded), np.int64)] = True
        order = self._order()
        stream = np.concatenate([np.arange(self.starts[s], self.starts[s + 1]) for s in order])
        rest = stream[~shown[stream]]
        self._rest_of = (self._runs, rest)
        return rest

    def _buffered(self, stream):
        """WebDataset's shuffle buffer: fill it, then emit a random slot and
        put the next sample there; drain it at the end."""
        rng = np.random.default_rng([self.seed, self.epoch, 1 + self.rank])
        buffer = []
        for index in stream:
            if len(buffer) < self.buffer_size:
                buffer.append(index)
                continue
            slot = rng.integers(len(buffer))
            yield buffer[slot]
            buffer[slot] = index
        rng.shuffle(buffer)
        yield from buffer
