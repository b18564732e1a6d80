"""The node-local shard cache: a directory of whole shards, shared by every
worker, rank and job on the node, bounded in bytes, evicted least recently
used first.

Each shard is an *entry*: its file ``<key>`` (``key``: a hash of the URL,
size and ETag, then the URL's base name, so another version of an object is
another entry), its lock file ``<key>.lock``, and whatever fastload writes
beside it (its index file).  The protocol, all with ``flock``:

- **reading**: a reader holds a shared lock on the entry's lock file for as
  long as it may open the file (a ``Pin``); the C reader opens the path on
  every read, so the pin, not an open descriptor, is what keeps it;
- **filling**: a reader that finds no complete file keeps its shared lock
  and takes the entry's *fill* lock ``<key>.fill.lock`` exclusively, which
  waits for a download under way elsewhere (and for nothing else: not for
  pins), looks again (another process may have filled it meanwhile: one
  download per shard per node), and downloads into ``<key>.part-*``, checked
  for size (the store checks the content), then renamed: a shard is seen
  only whole;
- **evicting**: under the directory's ``.evict.lock``, entries are visited
  oldest use first (``atime``, set on each pin) and removed only when their
  exclusive lock is free *now* (``LOCK_NB``): a pinned shard is never
  removed, nor one being filled.  The byte bound yields to pins: when
  everything is pinned the directory holds more than the bound until pins
  are released.

A lock file is removed with its entry while its exclusive lock is held; a
process that was waiting for the lock then holds it on a file no longer in
the directory, sees that (its descriptor's inode is not the path's) and
locks again.  Nothing is held in memory across processes, so two jobs with
different bounds can share the directory (each applies its own).

A lock belongs to the open file, not to the process: a child forked while
this process holds one would hold it too, for as long as its copy of the
descriptor stays open.  A child never uses its parent's locks, so it closes
every copy at once (``_Descriptors``); otherwise a lock that a thread of the
parent held at the fork could never be taken again.
"""

import errno
import fcntl
import hashlib
import os
import shutil
import threading
import time

from ..shard_index import SUFFIX

_LOCK = ".lock"
_FILL = ".fill.lock"  # ends in _LOCK: not an entry of its own
_PART = ".part-"


def default_directory():
    return os.environ.get("FASTLOAD_SHARD_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "fastload", "shards")


def entry_key(url, size, etag):
    """The entry's name: stable for (url, size, etag), readable by its tail."""
    digest = hashlib.sha1(f"{url}\0{size}\0{etag or ''}".encode()).hexdigest()[:24]
    tail = "".join(c if c.isalnum() or c in "-_." else "_" for c in url.rsplit("/", 1)[-1])
    return f"{digest}-{tail[-80:] or 'shard'}"


class _Descriptors:
    """The cache's open descriptors in this process, closed in a forked
    child before it runs anything else.  ``generation`` counts the forks
    this process descends from: a ``Pin`` made in an earlier one owns no
    descriptor here (its number may name another file by now)."""

    def __init__(self):
        self._mutex = threading.Lock()
        self._open = set()
        self.generation = 0
        # Looked up at each fork, not bound now: a child has a mutex of its own.
        os.register_at_fork(before=lambda: self._mutex.acquire(),
                            after_in_parent=lambda: self._mutex.release(),
                            after_in_child=self._after_in_child)

    def open(self, path, flags, mode):
        with self._mutex:  # not across a fork: the child sees it in the set
            fd = os.open(path, flags | os.O_CLOEXEC, mode)
            self._open.add(fd)
        return fd

    def close(self, fd):
        with self._mutex:
            self._open.discard(fd)
            os.close(fd)

    def _after_in_child(self):
        for fd in self._open:
            try:
                os.close(fd)
            except OSError:
                pass
        self._open.clear()
        self.generation += 1
        self._mutex = threading.Lock()  # the parent's is held by the fork


_descriptors = _Descriptors()


def _lock(path, operation):
    """A descriptor of the lock file ``path`` holding ``operation``
    (``LOCK_SH``/``LOCK_EX``, maybe ``| LOCK_NB``), on the file that is at
    ``path`` now; None when non-blocking and held elsewhere.  Close it with
    ``_descriptors.close``."""
    while True:
        fd = _descriptors.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, operation)
        except BlockingIOError:
            _descriptors.close(fd)
            return None
        except BaseException:
            _descriptors.close(fd)
            raise
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        _descriptors.close(fd)  # the entry was evicted while this waited: lock the new file


def _lock_by(path, deadline):
    """``_lock(path, LOCK_EX)``, waiting until ``deadline`` at most (None:
    for as long as it takes); None when it is held elsewhere then.  flock
    has no timeout: the wait polls, every 5 ms at first, then every 100."""
    if deadline is None:
        return _lock(path, fcntl.LOCK_EX)
    pause = 0.005
    while True:
        fd = _lock(path, fcntl.LOCK_EX | fcntl.LOCK_NB)
        left = deadline - time.monotonic()
        if fd is not None or left <= 0:
            return fd
        time.sleep(min(pause, left))
        pause = min(0.1, pause * 2)


class Pin:
    """A shared lock on a cache entry: its file stays while this is held."""

    __slots__ = ("path", "_fd", "_generation")

    def __init__(self, path, fd):
        self.path, self._fd = path, fd
        self._generation = _descriptors.generation

    @property
    def held(self):
        return self._fd is not None and self._generation == _descriptors.generation

    def release(self):
        fd, self._fd = self._fd, None
        if fd is not None and self._generation == _descriptors.generation:
            _descriptors.close(fd)

    __del__ = release

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()


class ShardCache:
    """``ShardCache(directory=None, max_bytes=None)``: the directory
    (default ``$FASTLOAD_SHARD_CACHE``, else ``~/.cache/fastload/shards``;
    local NVMe or ``/dev/shm``) and its byte bound (default: 80 % of what
    the file system has free when the cache is first used, plus what the
    cache holds then)."""

    def __init__(self, directory=None, max_bytes=None):
        self.directory = os.path.abspath(directory or default_directory())
        if max_bytes is not None and max_bytes <= 0:
            raise ValueError(f"cache_bytes must be > 0, got {max_bytes}")
        self.max_bytes = max_bytes
        self.downloads = 0  # files this object filled (statistics, tests)

    def __getstate__(self):
        return {"directory": self.directory, "max_bytes": self.max_bytes, "downloads": 0}

    def _ready_directory(self):
        os.makedirs(self.directory, exist_ok=True)
        if self.max_bytes is None:
            free = shutil.disk_usage(self.directory).free
            self.max_bytes = int(free * 0.8) + self.used_bytes()
        return self.directory

    def path(self, key):
        return os.path.join(self.directory, key)

    def complete(self, key, size):
        """True when the entry's file is there, whole (unpinned: it may go)."""
        try:
            return os.stat(self.path(key)).st_size == size
        except FileNotFoundError:
            return False

    # -- pins -------------------------------------------------------------------

    def pin(self, key, size, fill, deadline=None):
        """A ``Pin`` on entry ``key`` holding ``size`` bytes, filled first if
        it is not in the cache: ``fill(fd)`` writes the shard into the open
        file ``fd`` (raising on failure: nothing is kept then).  Only one
        process of the node fills an entry; the others wait for it, until
        ``deadline`` (a ``time.monotonic()`` value; ``TimeoutError`` then)."""
        self._ready_directory()
        data = self.path(key)
        fd = _lock(data + _LOCK, fcntl.LOCK_SH)  # from now on the entry is not evicted
        try:
            if not self._present(data, size, fill_locked=False):
                # The fill lock, not the entry's: a reader waiting here for
                # a download under way must not wait for the pins after it.
                filling = _lock_by(data + _FILL, deadline)
                if filling is None:
                    raise TimeoutError(errno.ETIMEDOUT, "another download of it (another "
                                       "worker, rank or job on the node, or the prefetch) "
                                       "did not end in time")
                try:
                    if not self._present(data, size):
                        self._fill(key, size, fill)
                finally:
                    _descriptors.close(filling)
        except BaseException:
            _descriptors.close(fd)
            raise
        return self._pinned(data, fd)

    @staticmethod
    def _present(data, size, fill_locked=True):
        """True when the entry's file is whole; with the fill lock held, a
        file of another size (damaged since; never pinned) is removed."""
        try:
            st = os.stat(data)
        except FileNotFoundError:
            return False
        if st.st_size == size:
            return True
        if fill_locked:
            os.unlink(data)
        return False

    @staticmethod
    def _pinned(data, fd):
        try:  # the use that LRU eviction orders by; the mtime is the index file's check
            st = os.stat(data)
            os.utime(data, ns=(max(st.st_atime_ns + 1, time.time_ns()), st.st_mtime_ns))
        except OSError:
            pass
        return Pin(data, fd)

    def _fill(self, key, size, fill):
        """Downloads entry ``key`` (its fill lock and a pin held by the caller)."""
        self.make_room(size)
        data = self.path(key)
        part = f"{data}{_PART}{os.getpid()}-{threading.get_ident()}"
        fd = _descriptors.open(part, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            try:
                fill(fd)
                written = os.fstat(fd).st_size
                if written != size:
                    raise OSError(errno.EIO, f"{key}: {written} bytes written, {size} expected")
                os.fdatasync(fd)
            finally:
                _descriptors.close(fd)
            os.rename(part, data)
        except BaseException:
            try:
                os.unlink(part)
            except FileNotFoundError:
                pass
            raise
        self.downloads += 1

    # -- the bound --------------------------------------------------------------

    def _entries(self):
        """``(data entries [(atime_ns, key, bytes)], total bytes)``: every
        file but the locks counts (index files with their shard, downloads
        under way at their full size)."""
        entries, total, sidecars = {}, 0, {}
        with os.scandir(self.directory) as scan:
            for item in scan:
                name = item.name
                if name.startswith(".") or name.endswith(_LOCK):
                    continue
                try:
                    st = item.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                total += st.st_size
                if _PART in name:
                    self._drop_stale_part(name)
                elif name.endswith(SUFFIX):
                    key = name[:-len(SUFFIX)]
                    sidecars[key] = sidecars.get(key, 0) + st.st_size
                else:
                    entries[name] = (st.st_atime_ns, st.st_size)
        listed = [(atime, key, size + sidecars.get(key, 0))
                  for key, (atime, size) in entries.items()]
        return sorted(listed), total

    def _drop_stale_part(self, name):
        """A download nobody is doing any more (its process died)."""
        key = name.split(_PART, 1)[0]
        if key.endswith(SUFFIX):  # an index file being written beside its shard
            key = key[:-len(SUFFIX)]
        fd = _lock(self.path(key) + _LOCK, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if fd is None:
            return  # a download under way
        try:
            os.unlink(self.path(name))
        except FileNotFoundError:
            pass
        finally:
            _descriptors.close(fd)

    def used_bytes(self):
        """What the cache directory holds now (lock files aside)."""
        try:
            return self._entries()[1]
        except FileNotFoundError:
            return 0

    def make_room(self, size):
        """Evicts unpinned entries, least recently used first, until ``size``
        more bytes fit under the bound (or nothing more can go).  Returns
        the bytes the directory then holds."""
        self._ready_directory()
        guard = _lock(os.path.join(self.directory, ".evict.lock"), fcntl.LOCK_EX)
        try:
            entries, total = self._entries()
            for _, key, nbytes in entries:
                if total + size <= self.max_bytes:
                    break
                if self._evict(key):
                    total -= nbytes
            return total
        finally:
            _descriptors.close(guard)

    def _evict(self, key):
        data = self.path(key)
        fd = _lock(data + _LOCK, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if fd is None:
            return False  # pinned, or being filled
        try:
            for path in (data, data + SUFFIX, data + _FILL, data + _LOCK):
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass
        finally:
            _descriptors.close(fd)
        return True

