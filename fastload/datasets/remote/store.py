"""Objects read through obstore: head, list, whole objects read into a
file with parallel range reads, and files uploaded.

obstore wraps Rust's object_store: one client per bucket (or host), its
requests run off the GIL, credentials come from the store's usual sources
(``AWS_*``, ``GOOGLE_*``, ``AZURE_*`` environment variables, instance
metadata; ``storage_options`` adds to them) and are never logged here.
obstore's own retries are off: ``retry.Backoff`` retries each range on its
own, so a connection cut mid-body costs one range, not the object.

obstore's runtime does not survive ``fork()``: a process forked from one
that used it must not call it (``Store.usable`` says so; the dataset then
reads only what its parent put in the cache).
"""

import concurrent.futures
import datetime
import hashlib
import os
import pathlib
import re
import threading
import time

from . import urls
from .retry import Backoff, FetchTimeout, RemoteError, ShardChanged, first_line

RANGE_BYTES = 8 << 20  # one range read
RANGES_IN_FLIGHT = 8   # per object being read
_MD5_ETAG = re.compile(r'^"?([0-9a-fA-F]{32})"?$')


def _obstore():
    try:
        import obstore
        import obstore.store
    except ImportError:
        raise ImportError("reading shards from object storage needs obstore: "
                          "pip install 'fastload-torch[remote]' (or: pip install obstore)") \
            from None
    return obstore


def _plain_http_endpoint(options):
    """True when the store's endpoint is plain HTTP (an S3 gateway on the
    local network, a test server): obstore refuses it unless told.  The
    environment's endpoint counts too, as obstore reads it."""
    endpoint = options.get("endpoint") or options.get("aws_endpoint") or \
        os.environ.get("AWS_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT") or ""
    return str(endpoint).lower().startswith("http://")


# The pid whose obstore runtime is running: a forked child of it must not
# call obstore (tokio's threads are not in the child; a call would hang).
_runtime_pid = None


class Store:
    """Reads objects by URL.  ``storage_options``: keyword arguments of
    ``obstore.store.from_url`` for every bucket (``endpoint``, ``region``,
    ``client_options``, credentials...); ``attempts``, ``backoff_s``,
    ``max_backoff_s``: the retries; ``timeout_s``: one request's limit;
    ``range_bytes``, ``ranges_in_flight``: how an object is read."""

    def __init__(self, storage_options=None, *, attempts=6, backoff_s=0.2, max_backoff_s=10.0,
                 timeout_s=120.0, connect_timeout_s=10.0, range_bytes=RANGE_BYTES,
                 ranges_in_flight=RANGES_IN_FLIGHT):
        if range_bytes < 1 or ranges_in_flight < 1:
            raise ValueError("range_bytes and ranges_in_flight must be >= 1")
        self.storage_options = dict(storage_options or {})
        self.backoff = Backoff(attempts, backoff_s, max_backoff_s)
        self.timeout_s, self.connect_timeout_s = timeout_s, connect_timeout_s
        self.range_bytes, self.ranges_in_flight = int(range_bytes), int(ranges_in_flight)
        self._clients = {}
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self.listed = {}  # url -> (size, etag) of the objects list() saw

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_clients"], state["_lock"], state["listed"] = {}, None, {}
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._lock = threading.Lock()
        self._pid = os.getpid()

    @staticmethod
    def usable():
        """False in a process forked from one whose obstore runtime runs."""
        return _runtime_pid in (None, os.getpid())

    def _client(self, url):
        """``(obstore, store, key)`` for ``url``; one store per bucket/host."""
        global _runtime_pid
        if not self.usable():
            raise RemoteError(f"{url}: cannot be read from a process forked after obstore "
                              "started (its runtime does not survive fork); the parent "
                              "process fetches shards into the cache for its workers")
        if self._pid != os.getpid():  # a copy in another process: its own clients
            self._clients, self._lock, self._pid = {}, threading.Lock(), os.getpid()
        obstore = _obstore()
        base, key = urls.split(url)
        with self._lock:
            store = self._clients.get(base)
            if store is None:
                options = dict(self.storage_options)
                client = {"timeout": datetime.timedelta(seconds=self.timeout_s),
                          "connect_timeout": datetime.timedelta(seconds=self.connect_timeout_s)}
                if urls.scheme(url) == "http" or _plain_http_endpoint(options):
                    client["allow_http"] = True
                client.update(options.pop("client_options", None) or {})
                _runtime_pid = os.getpid()  # from here on a forked child must not call it
                try:
                    store = obstore.store.from_url(base, client_options=client,
                                                   retry_config={"max_retries": 0}, **options)
                except Exception as error:  # credentials, options: nothing to retry
                    raise RemoteError(f"{url}: no client for {base}: {first_line(error)}") \
                        from error
                self._clients[base] = store
        return obstore, store, key

    def head(self, url):
        """``(size, etag)`` of the object at ``url`` (etag None when the
        store gives none); from the listing when ``list()`` saw it (a prefix
        of many shards costs one request per thousand, not one per shard)."""
        if url in self.listed:
            return self.listed[url]
        obstore, store, key = self._client(url)
        meta = self.backoff.call("HEAD", url, obstore.head, store, key)
        return int(meta["size"]), meta.get("e_tag")

    def list(self, base, prefix):
        """The keys under ``prefix`` in the store at ``base``."""
        obstore, store, _ = self._client(base + "/")

        def listing():
            return [meta for batch in obstore.list(store, prefix=prefix or None)
                    for meta in batch]
        found = self.backoff.call("LIST", f"{base}/{prefix}", listing)
        for meta in found:
            self.listed[f"{base}/{meta['path']}"] = (int(meta["size"]), meta.get("e_tag"))
        return [meta["path"] for meta in found]

    def get(self, url):
        """The whole object at ``url`` as bytes (small objects: index files)."""
        obstore, store, key = self._client(url)
        return bytes(self.backoff.call("GET", url, lambda: obstore.get(store, key).bytes()))

    def get_range(self, url, start, end):
        """Bytes ``[start, end)`` of the object at ``url`` (fewer at its end)."""
        obstore, store, key = self._client(url)
        return bytes(self.backoff.call(
            f"GET bytes {start}-{end - 1}", url,
            lambda: _ranged(url, obstore.get_range, store, key, start=start, end=end)))

    def put_file(self, url, path):
        """Uploads the local file ``path`` to ``url``: one request, or a
        multipart upload for a file larger than obstore's part size (5 MiB,
        parts sent side by side); retried whole (the store keeps the old
        object, or none, until an upload completes)."""
        obstore, store, key = self._client(url)
        self.backoff.call("PUT", url, obstore.put, store, key, pathlib.Path(path))

    def _range(self, url, size, etag, start, end, stop=None):
        """Bytes ``[start, end)`` of the object, checked against the size and
        ETag it had when listed."""
        obstore, store, key = self._client(url)

        def once():
            result = _ranged(url, obstore.get, store, key, options={"range": (start, end)})
            meta = result.meta
            if int(meta["size"]) != size or (etag and meta.get("e_tag")
                                              and meta["e_tag"] != etag):
                raise ShardChanged(f"{url}: changed since it was listed: {size} bytes, ETag "
                                   f"{etag} then; {meta['size']} bytes, ETag {meta.get('e_tag')} "
                                   "now")
            data = result.bytes()
            if len(data) != end - start:
                raise ConnectionError(f"short read: {len(data)} of {end - start} bytes")
            return data
        return self.backoff.call(f"GET bytes {start}-{end - 1}", url, once, stop=stop)

    def read_into(self, url, fd, size, etag=None, deadline=None):
        """Writes the object at ``url`` (``size`` bytes, ``etag`` as listed)
        into the open file ``fd`` with parallel range reads, then checks its
        MD5 where the ETag is one (S3, single-part uploads).  RemoteError
        naming the URL when a range fails after its retries;
        ``ShardChanged`` when the object is not the one listed;
        ``FetchTimeout`` when it is not all read by ``deadline`` (a
        ``time.monotonic()`` value): the ranges still in flight then finish
        in the background (within the request timeout) and write nothing,
        and no more are started."""
        os.ftruncate(fd, size)
        starts = range(0, size, self.range_bytes)
        if deadline is None and len(starts) <= 1:  # one range, no limit: on this thread
            for start in starts:
                _pwrite_all(fd, self._range(url, size, etag, start, size), start)
            self._check_md5(url, fd, size, etag)
            return
        writes = _Writes(fd)

        def one(start):
            end = min(size, start + self.range_bytes)
            writes.write(self._range(url, size, etag, start, end, writes.stop), start)
        pool = concurrent.futures.ThreadPoolExecutor(
            max(1, min(self.ranges_in_flight, len(starts))), thread_name_prefix="fastload-fetch")
        try:
            futures = [pool.submit(one, start) for start in starts]
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            done, pending = concurrent.futures.wait(
                futures, timeout, return_when=concurrent.futures.FIRST_EXCEPTION)
            if pending and not any(f.exception() for f in done):
                raise FetchTimeout(f"{url}: not downloaded in time ({writes.written} of {size} "
                                   "bytes read)")
            for future in futures:
                if future.done():
                    future.result()
        finally:
            writes.abandon()  # nothing is written into fd after this
            pool.shutdown(wait=False, cancel_futures=True)
        self._check_md5(url, fd, size, etag)

    @staticmethod
    def _check_md5(url, fd, size, etag):
        if urls.scheme(url) not in ("s3", "s3a") or not etag:
            return
        match = _MD5_ETAG.match(etag)
        if match is None:  # a multipart upload's ETag is not the content's MD5
            return
        digest, at = hashlib.md5(usedforsecurity=False), 0
        while at < size:
            chunk = os.pread(fd, min(16 << 20, size - at), at)
            if not chunk:
                break
            digest.update(chunk)
            at += len(chunk)
        if digest.hexdigest() != match.group(1).lower():
            raise RemoteError(f"{url}: the bytes read do not match the object's MD5 "
                              f"(ETag {etag}): corrupted in transit")


def _ranged(url, get, *args, **kwargs):
    """``get(*args, **kwargs)``, an obstore range read of ``url``; a server
    that answers with the whole object instead (no HTTP Range support) is a
    ``RemoteError`` that says so, not retried."""
    try:
        return get(*args, **kwargs)
    except Exception as error:  # obstore's NotSupportedError
        if type(error).__name__ == "NotSupportedError" and "range" in str(error).lower():
            raise RemoteError(f"{url}: the server does not answer range reads (HTTP Range "
                              "requests), which shards are read with") from error
        raise


class _Writes:
    """Range reads written into one file, until ``abandon()``: after it no
    write starts, and it returns only when those under way have ended (the
    caller closes the file then).  ``stop`` is set by ``abandon()``."""

    def __init__(self, fd):
        self.fd = fd
        self.stop = threading.Event()
        self.written = 0
        self._cond = threading.Condition()
        self._writing = 0

    def write(self, data, offset):
        with self._cond:
            if self.stop.is_set():
                return
            self._writing += 1
        try:
            _pwrite_all(self.fd, data, offset)
        finally:
            with self._cond:
                self._writing -= 1
                self.written += len(data)
                self._cond.notify_all()

    def abandon(self):
        with self._cond:
            self.stop.set()
            self._cond.wait_for(lambda: self._writing == 0)


def _pwrite_all(fd, data, offset):
    view, at = memoryview(data), 0
    while at < len(view):
        at += os.pwrite(fd, view[at:], offset + at)
