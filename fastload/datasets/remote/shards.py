"""What a ``WebDataset`` over URLs holds: each remote shard's place in the
node cache, its sample count, the pins that keep the shards in use, and the
prefetch of the next ones.

Made once, in the process that makes the dataset: every URL is listed
(``HEAD``: size and ETag) in threads, which fixes its cache entry, so the
native source's paths are known before any shard is downloaded.  A shard's
sample count comes from, in order: its index file in the cache (a warm
start), the prefix of the index file beside it in the store
(``<url>.fastload-index``, one small ranged GET), or the shard itself,
downloaded now.

Then ``ready(shards)`` brings shards into the cache (or waits for the
process already bringing them; with a ``timeout``, the loader's, until
then at most) and pins them; a pin is kept while the
shard was asked for in the last ``keep_calls`` calls, as batches still in
flight may read it.  ``prefetch(shards)`` (the sampler's next shards) does
the same in a background thread, the newest request replacing an older
one that has not started.  A process forked from one that ran obstore
(a worker process) cannot download: its ``ready`` pins what its parent
fetched, which is all its batches need, since the parent readies each
batch before it hands the batch out.
"""

import atexit
import concurrent.futures
import json
import os

import threading
import time
import weakref
import zlib

import numpy as np

from .. import shard_index
from .retry import FetchTimeout, RemoteError
from .shard_cache import ShardCache, entry_key
from .store import Store
from .urls import is_remote

KEEP_CALLS = 64     # ready() calls a pin outlives its last use (batches in flight)
PREFETCH_SHARDS = 2  # shards fetched ahead of the sampler
FETCH_THREADS = 4    # shards one batch fetches at once


class DeferredIndex:
    """A remote shard's index file, of which only the sample count is read
    when the dataset is made; ``open()`` reads the rest when the shard is
    first needed."""

    def __init__(self, remote, s, samples):
        self.remote, self.s, self.samples = remote, s, samples

    def open(self):
        """The whole index file: the copy the prefetcher saved beside the
        cached shard, else read from the store into memory (a
        ``BytesIndexFile``); None when it is no longer there: the shard is
        then indexed from its headers (``pin()`` first)."""
        saved = self.remote.saved_index(self.s)
        if saved is not None:
            return saved
        try:
            data = self.remote._prefix_of_remote_index(self.s, whole=True)
        except OSError:
            return None
        if data is None:
            return None
        self.remote.keep_index(self.s, data)
        return BytesIndexFile(self.remote.urls[self.s], data)

    def pin(self):
        return self.remote.pin_now(self.s)


class BytesIndexFile(shard_index.IndexFile):
    """An index file held in memory (read from the store)."""

    def __init__(self, name, data):
        at = len(shard_index.MAGIC)
        length, _, _, samples = shard_index._PREFIX.unpack_from(data, at)
        super().__init__(name, samples, length)
        self._data = data

    @property
    def _layout(self):
        if self._layout_read is None:
            start = len(shard_index.MAGIC) + shard_index._PREFIX.size
            try:
                header = json.loads(self._data[start:start + self._header_length])
                layout = {name: (np.dtype(dtype), int(count), int(offset), int(crc))
                          for name, (dtype, count, offset, crc) in header["arrays"].items()}
            except (ValueError, KeyError, TypeError, AttributeError) as error:
                raise OSError(f"{self.path}: the header does not check out") from error
            if "sample_starts" not in layout or layout["sample_starts"][1] != self.samples + 1:
                raise OSError(f"{self.path}: the header does not check out")
            self._layout_read = layout
        return self._layout_read

    def get(self, name):
        dtype, count, offset, crc = self._layout[name]
        data = self._data[offset:offset + count * dtype.itemsize]
        if len(data) != count * dtype.itemsize or zlib.crc32(data) != crc:
            raise OSError(f"{self.path}: array {name!r} does not check out")
        return np.frombuffer(data, dtype)


class RemoteShards:
    """``RemoteShards(urls, store, cache, threads)``: every shard's local
    path (the cache entry for a URL, the path itself for a local shard)."""

    def __init__(self, urls, store, cache, threads=8, keep_calls=KEEP_CALLS,
                 prefetch_shards=PREFETCH_SHARDS):
        self.urls = list(urls)
        self.store = store
        self.cache = cache
        self.keep_calls = keep_calls
        self.prefetch_shards = prefetch_shards
        self.remote = [is_remote(u) for u in self.urls]
        listed = [None] * len(self.urls)
        wanted = [s for s, r in enumerate(self.remote) if r]
        with concurrent.futures.ThreadPoolExecutor(max(1, min(threads, len(wanted)))) as pool:
            for s, meta in zip(wanted, pool.map(lambda s: store.head(self.urls[s]), wanted)):
                listed[s] = meta
        self.sizes = [m[0] if m else None for m in listed]
        self.etags = [m[1] if m else None for m in listed]
        self.keys = [entry_key(u, m[0], m[1]) if m else None for u, m in zip(self.urls, listed)]
        self.paths = [cache.path(k) if k else u for u, k in zip(self.urls, self.keys)]
        self._transient()

    def _transient(self):
        """What a process has of its own: pins, their lock, the prefetcher."""
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._pins = {}      # shard -> Pin, held by this process
        self._last_use = {}  # shard -> the ready() call that last asked for it
        self._calls = 0
        self._prefetcher = None

    def __getstate__(self):
        state = self.__dict__.copy()
        for name in ("_lock", "_pins", "_last_use", "_prefetcher"):
            del state[name]
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._transient()

    def _own(self):
        """A forked child's copy drops its parent's pins (their locks stay
        the parent's) and its lock (maybe held by a thread not in the child)."""
        if self._pid != os.getpid():
            for pin in self._pins.values():
                pin.release()
            self._transient()

    # -- counting samples at construction ---------------------------------------

    def found_index(self, s):
        """What tells shard ``s``'s sample count without downloading it: its
        ``IndexFile`` in the cache, a ``DeferredIndex`` from the store, or
        None (the caller downloads the shard, ``pin_now``, and indexes it)."""
        path = self.paths[s]
        if not self.remote[s]:
            return shard_index.load(path)
        if self.cache.complete(self.keys[s], self.sizes[s]):
            found = shard_index.load(path)
            if found is not None:
                return found
        samples = self._remote_samples(s)
        return DeferredIndex(self, s, samples) if samples is not None else None

    def _prefix_of_remote_index(self, s, whole=False):
        """The index file beside shard ``s`` in the store (its prefix, or all
        of it), or None when there is none (or it is not for this shard)."""
        url = self.urls[s] + shard_index.SUFFIX
        head = len(shard_index.MAGIC) + shard_index._PREFIX.size
        try:
            data = self.store.get(url) if whole else self.store.get_range(url, 0, head)
        except FileNotFoundError:
            return None
        if len(data) < head or data[:len(shard_index.MAGIC)] != shard_index.MAGIC:
            return None
        _, size, _, _ = shard_index._PREFIX.unpack_from(data, len(shard_index.MAGIC))
        if size != self.sizes[s]:
            return None  # written for another version of the shard
        return data

    def _remote_samples(self, s):
        data = self._prefix_of_remote_index(s)
        if data is None:
            return None
        return shard_index._PREFIX.unpack_from(data, len(shard_index.MAGIC))[3]

    def saved_index(self, s):
        """Shard ``s``'s index file saved beside its cached copy
        (``keep_index``), or None."""
        if not self.cache.complete(self.keys[s], self.sizes[s]):
            return None
        return shard_index.load(self.paths[s])

    def fetch_index(self, s):
        """Saves shard ``s``'s index file beside its cached copy (pinned by
        this process), so that the loop does not wait for that request at
        the shard's first batch.  Best effort: the loop reads it otherwise."""
        if self.saved_index(s) is not None:
            return
        try:
            data = self._prefix_of_remote_index(s, whole=True)
        except OSError:
            return
        if data is not None:
            self.keep_index(s, data)

    def keep_index(self, s, data):
        """Saves the index file ``data`` of shard ``s`` beside its cached
        copy, when this process has that pinned, stamped with the copy's size
        and mtime (shard_index's check), so that the next dataset over the
        cache reads it there; it counts towards the bound and is evicted
        with the shard.  Best effort: a cache."""
        path = self.paths[s]
        if s not in self._pins:
            return
        try:
            self.cache.make_room(len(data))
            st = os.stat(path)
            if st.st_size != self.sizes[s]:
                return
            at = len(shard_index.MAGIC)
            length, size, _, samples = shard_index._PREFIX.unpack_from(data, at)
            stamped = bytearray(data)
            shard_index._PREFIX.pack_into(stamped, at, length, size, st.st_mtime_ns, samples)
            part = f"{path}{shard_index.SUFFIX}.part-{os.getpid()}-{threading.get_ident()}"
            with open(part, "wb") as f:
                f.write(stamped)
            os.replace(part, path + shard_index.SUFFIX)
        except OSError:
            pass

    # -- pins -------------------------------------------------------------------

    def pin_now(self, s):
        """A pin on shard ``s`` (fetched first when it is not cached), held
        by the caller (construction, while the shard is indexed)."""
        return self._pin(s)

    def _pin(self, s, deadline=None):
        url, size, etag = self.urls[s], self.sizes[s], self.etags[s]

        def fill(fd):
            if not Store.usable():
                raise RemoteError(f"{url}: not in the shard cache, and this process was forked "
                                  "after obstore started, so it cannot download it (its "
                                  "parent readies each batch's shards before handing it out)")
            self.store.read_into(url, fd, size, etag, deadline)
        try:
            return self.cache.pin(self.keys[s], size, fill, deadline)
        except TimeoutError as error:
            if isinstance(error, FetchTimeout):
                raise
            raise FetchTimeout(f"{url}: {error.strerror or error}") from None

    def ready(self, shards, timeout=None):
        """Shards ``shards`` (numbers) in the cache and pinned; pins not asked
        for in the last ``keep_calls`` calls released.  ``timeout``: seconds
        to wait at most (the loader's), for a download or for another
        process's; then ``FetchTimeout`` naming the first shard not there
        (the others that came are kept)."""
        self._own()
        deadline = None if not timeout else time.monotonic() + timeout
        shards = [s for s in shards if self.remote[s]]
        with self._lock:
            self._calls += 1
            now = self._calls
            missing = [s for s in shards if s not in self._pins]
            for s in shards:
                self._last_use[s] = now
        if len(missing) <= 1:
            for s in missing:
                self._hold(s, self._pin(s, deadline))
        else:  # a batch over many shards (another sampler): fetched side by side
            with concurrent.futures.ThreadPoolExecutor(
                    min(len(missing), FETCH_THREADS), thread_name_prefix="fastload-ready") as pool:
                futures = [pool.submit(self._pin, s, deadline) for s in missing]
            failed = None
            for s, future in zip(missing, futures):
                if future.exception() is None:
                    self._hold(s, future.result())
                elif failed is None:
                    failed = future.exception()
            if failed is not None:
                raise failed
        self._release_old()

    def _hold(self, s, pin):
        with self._lock:
            if s in self._pins:
                extra = pin  # pinned meanwhile (the prefetcher): one is enough
            else:
                self._pins[s], extra = pin, None
                self._last_use.setdefault(s, self._calls)
        if extra is not None:
            extra.release()

    def _release_old(self):
        with self._lock:
            old = [s for s, used in self._last_use.items()
                   if used <= self._calls - self.keep_calls and s in self._pins]
            pins = [self._pins.pop(s) for s in old]
            for s in old:
                del self._last_use[s]
        for pin in pins:
            pin.release()

    def release(self):
        """Releases every pin this process holds."""
        with self._lock:
            pins, self._pins, self._last_use = list(self._pins.values()), {}, {}
        for pin in pins:
            pin.release()

    @property
    def pinned(self):
        return sorted(self._pins)

    # -- prefetch ---------------------------------------------------------------

    def prefetch(self, shards):
        """Fetches ``shards`` (the next in the sampler's order, the first
        ``prefetch_shards`` of them) in the background and pins them."""
        self._own()
        if not Store.usable() or self.prefetch_shards <= 0:
            return
        shards = [s for s in shards if self.remote[s]][:self.prefetch_shards]
        with self._lock:
            shards = [s for s in shards if s not in self._pins]
            if not shards:
                return
            if self._prefetcher is None:
                self._prefetcher = _Prefetcher(self)
            self._prefetcher.ask(shards)

    def prefetch_errors(self):
        return [] if self._prefetcher is None else list(self._prefetcher.errors)


class _Prefetcher:
    """One thread fetching the shards last asked for, in order.  An error is
    kept (``errors``) and not raised: the shard is fetched again, and the
    error raised, when a batch needs it."""

    def __init__(self, shards):
        self._shards = weakref.ref(shards)
        self._wanted = []
        self._cond = threading.Condition()
        self._stop = False
        self._pid = os.getpid()
        self.errors = []
        self._thread = threading.Thread(target=self._run, name="fastload-prefetch", daemon=True)
        self._thread.start()
        _live.add(self)
        weakref.finalize(shards, self._halt)  # the thread ends with its dataset

    def _halt(self):
        if self._pid != os.getpid():
            return  # a forked child's copy: no thread, maybe a condition held at the fork
        with self._cond:
            self._stop = True
            self._cond.notify()

    def ask(self, shards):
        with self._cond:
            self._wanted = list(shards)
            self._cond.notify()

    def stop(self):
        self._halt()
        if self._thread is not threading.current_thread():
            self._thread.join()

    def _run(self):
        while True:
            with self._cond:
                while not self._wanted and not self._stop:
                    self._cond.wait()
                if self._stop:
                    return
                s = self._wanted.pop(0)
            owner = self._shards()
            if owner is None:
                return
            try:
                with owner._lock:
                    if s in owner._pins:
                        continue
                pin = owner._pin(s)
                owner._hold(s, pin)
                owner.fetch_index(s)
            except Exception as error:  # raised again when a batch needs the shard
                self.errors.append(error)
                del self.errors[:-8]
            finally:
                del owner


_live = weakref.WeakSet()


@atexit.register
def _stop_prefetchers():
    """Joins the prefetch threads before the interpreter finalizes (a forked
    child's copies have no thread, and maybe a lock held at the fork)."""
    for prefetcher in list(_live):
        if prefetcher._pid == os.getpid():
            prefetcher.stop()


