"""The store layer of remote shards (fastload.datasets.remote): URLs,
listing, whole objects read with parallel ranges, retries and the errors
that name the URL -- against moto's S3 server and a faulty HTTP server on
localhost."""

import os
import socket
import threading
import time

import pytest

pytest.importorskip("obstore")

from fastload.datasets.remote import retry, urls  # noqa: E402
from fastload.datasets.remote.store import Store  # noqa: E402
from remote_servers import Fault, FaultyHTTPServer, s3_environment  # noqa: E402


@pytest.fixture(scope="module")
def s3():
    pytest.importorskip("moto.server")
    with s3_environment("shards") as server:
        yield server


@pytest.fixture
def http():
    with FaultyHTTPServer() as server:
        yield server


def _store(**kw):
    kw.setdefault("backoff_s", 0.01)
    kw.setdefault("max_backoff_s", 0.05)
    kw.setdefault("timeout_s", 30.0)  # a request lost on a busy machine is retried, not waited on
    return Store(**kw)


def _read(store, url, size, etag, path):
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        store.read_into(url, fd, size, etag)
    finally:
        os.close(fd)
    with open(path, "rb") as f:
        return f.read()


def test_url_names():
    assert urls.is_remote("s3://b/k.tar") and urls.is_remote("HTTPS://h/x")
    assert not urls.is_remote("/data/x.tar") and not urls.is_remote("file:///data/x.tar")
    assert urls.local_path("file:///data/x%20y.tar") == "/data/x y.tar"
    assert urls.split("s3://bucket/a/b.tar") == ("s3://bucket", "a/b.tar")
    assert urls.split("https://h:8080/p/q.tar") == ("https://h:8080", "p/q.tar")
    assert urls.split("az://container/p/k.tar") == ("az://container", "p/k.tar")
    listed = {"p/": ["p/a.tar", "p/a.tar.fastload-index", "p/b.tar", "p/sub/"]}
    found = urls.resolve(["s3://b/p/", "s3://b/p/*.tar", "/x.tar", "file:///y.tar"],
                         lambda base, prefix: listed[prefix])
    assert found == ["s3://b/p/a.tar", "s3://b/p/b.tar", "s3://b/p/a.tar", "s3://b/p/b.tar",
                     "/x.tar", "/y.tar"]
    with pytest.raises(FileNotFoundError, match="s3://b/p/none-"):
        urls.resolve(["s3://b/p/none-*"], lambda base, prefix: listed["p/"])


def test_s3_head_list_and_ranged_read(s3, tmp_path):
    blob = os.urandom(5 * 1000 + 17)
    s3.put("shards", "r/one.tar", blob)
    s3.put("shards", "r/two.tar", b"x" * 10)
    store = _store(range_bytes=1000, ranges_in_flight=3)
    size, etag = store.head("s3://shards/r/one.tar")
    assert size == len(blob) and etag
    assert sorted(store.list("s3://shards", "r/")) == ["r/one.tar", "r/two.tar"]
    assert _read(store, "s3://shards/r/one.tar", size, etag, tmp_path / "one") == blob
    assert store.get("s3://shards/r/two.tar") == b"x" * 10
    with pytest.raises(FileNotFoundError, match="s3://shards/r/missing.tar"):
        store.head("s3://shards/r/missing.tar")


def test_s3_md5_checked(s3, tmp_path):
    s3.put("shards", "md5.tar", b"a" * 100)
    store = _store()
    size, _ = store.head("s3://shards/md5.tar")
    wrong = '"%s"' % ("0" * 32)
    with pytest.raises(retry.RemoteError, match="s3://shards/md5.tar"):
        # the server's ETag is not the one listed: the object changed
        _read(store, "s3://shards/md5.tar", size, wrong, tmp_path / "x")


def test_http_retries_recover(http, tmp_path):
    blob = os.urandom(4000)
    http.objects["a.tar"] = blob
    http.faults = [Fault("a.tar", "503", times=3), Fault("a.tar", "cut", times=2),
                   Fault("a.tar", "500", times=1)]
    store = _store(range_bytes=1000, ranges_in_flight=2, attempts=8)
    url = f"{http.url}/a.tar"
    size, etag = store.head(url)
    assert _read(store, url, size, etag, tmp_path / "a") == blob
    assert all(f.times == 0 for f in http.faults)
    assert http.requests[("GET", "a.tar")] == 4 + 6


def test_http_retries_bounded_then_error_names_url(http, tmp_path):
    http.objects["b.tar"] = b"z" * 100
    http.faults = [Fault("b.tar", "503", times=100)]
    store = _store(attempts=3)
    url = f"{http.url}/b.tar"
    with pytest.raises(retry.RemoteError) as caught:
        _read(store, url, 100, None, tmp_path / "b")
    message = str(caught.value)
    assert url in message and "after 3 tries" in message and "503" in message
    assert http.requests[("GET", "b.tar")] == 3


def test_http_slow_answer_times_out_and_is_retried(http, tmp_path):
    http.objects["s.tar"] = b"s" * 300
    http.faults = [Fault("s.tar", "slow", times=1, delay_s=60)]
    store = _store(timeout_s=1.0, attempts=4)
    url = f"{http.url}/s.tar"
    assert _read(store, url, 300, None, tmp_path / "s") == b"s" * 300
    assert http.slow_started.is_set()
    http.release.set()


def test_http_not_found_is_final(http):
    store = _store(attempts=5)
    with pytest.raises(FileNotFoundError, match="nothing.tar"):
        store.head(f"{http.url}/nothing.tar")
    assert http.requests[("HEAD", "nothing.tar")] == 1


def test_size_changed_since_listed(http, tmp_path):
    http.objects["c.tar"] = b"c" * 500
    store = _store(range_bytes=200)
    url = f"{http.url}/c.tar"
    size, etag = store.head(url)
    http.objects["c.tar"] = b"c" * 600
    with pytest.raises(retry.ShardChanged, match=f"{url}: changed since it was listed: 500 "):
        _read(store, url, size, etag, tmp_path / "c")


def test_read_by_a_deadline_times_out_naming_the_url(http, tmp_path):
    http.objects["d.tar"] = b"d" * 3000
    http.faults = [Fault("d.tar", "slow", times=1, delay_s=600)]
    store = _store(range_bytes=1000, ranges_in_flight=3)
    url = f"{http.url}/d.tar"
    path = tmp_path / "d"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        with pytest.raises(retry.FetchTimeout, match=rf"{url}: not downloaded in time \(\d+ of "
                                                     "3000 bytes read\\)"):
            store.read_into(url, fd, 3000, None, deadline=time.monotonic() + 0.5)
        assert isinstance(retry.FetchTimeout("x"), TimeoutError)
    finally:
        os.close(fd)
    before = path.read_bytes()
    http.release.set()  # the slow range answers now; its bytes are not written
    for thread in threading.enumerate():  # the abandoned ranges' threads end with them
        if thread.name.startswith("fastload-fetch"):
            thread.join(120)
    assert path.read_bytes() == before
    blocks = [before[i:i + 1000] for i in range(0, 3000, 1000)]
    assert all(b in (b"d" * 1000, b"\0" * 1000) for b in blocks) and b"\0" * 1000 in blocks
    # With time enough the same read completes.
    assert _read(store, url, 3000, None, tmp_path / "d2") == b"d" * 3000


def test_backoff_stops_when_told():
    stop = threading.Event()
    calls = []

    def failing():
        calls.append(1)
        stop.set()
        raise ConnectionError("reset")
    with pytest.raises(retry.Abandoned):
        retry.Backoff(attempts=5, base_s=60).call("GET", "u", failing, stop=stop)
    assert calls == [1]


def test_gs_and_az_urls_name_bucket_and_container():
    """As obstore (object_store) and fsspec read them: the bucket or the
    container first, the account of az:// from the environment."""
    assert urls.split("gs://bucket/a/b.tar") == ("gs://bucket", "a/b.tar")
    assert urls.split("az://container/k.tar") == ("az://container", "k.tar")
    assert urls.split("azure://container/p/k.tar") == ("azure://container", "p/k.tar")
    assert urls.split("abfss://fs@acc.dfs.core.windows.net/p/k.tar") == \
        ("abfss://fs@acc.dfs.core.windows.net", "p/k.tar")
    listed = {("gs://bucket", "p/"): ["p/a.tar", "p/a.tar.fastload-index", "p/b.tar"],
              ("az://container", "q/"): ["q/c.tar"]}
    assert urls.resolve(["gs://bucket/p/", "az://container/q/*.tar"],
                        lambda base, prefix: listed[base, prefix]) == \
        ["gs://bucket/p/a.tar", "gs://bucket/p/b.tar", "az://container/q/c.tar"]


SECRET = "c2VjcmV0LWtleS1zZWNyZXQta2V5LXNlY3JldC1rZXk="


def test_gs_and_az_stores_from_url_and_environment(monkeypatch):
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_NAME", "acc")
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_KEY", SECRET)
    _, az, key = _store()._client("az://container/p/k.tar")
    assert type(az).__name__ == "AzureStore" and key == "p/k.tar"
    assert az.config["container_name"] == "container"
    _, gs, key = _store(storage_options={"skip_signature": True})._client("gs://bucket/a/b.tar")
    assert type(gs).__name__ == "GCSStore" and key == "a/b.tar"
    assert gs.config["bucket"] == "bucket" and gs.config["skip_signature"] == "true"


def test_credentials_error_names_the_url(monkeypatch, tmp_path):
    monkeypatch.setenv("GOOGLE_SERVICE_ACCOUNT_PATH", str(tmp_path / "missing.json"))
    with pytest.raises(retry.RemoteError, match=r"gs://bucket/a\.tar: no client for gs://bucket: "
                                                r".*missing\.json"):
        _store()._client("gs://bucket/a.tar")


def test_failed_listing_names_the_url_not_the_key(monkeypatch):
    """A listing that cannot reach the store (nothing listens there) fails
    after its retries naming the URL; the account key is in no message."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: connections are refused
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_NAME", "acc")
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_KEY", SECRET)
    store = _store(storage_options={"endpoint": f"http://127.0.0.1:{port}/acc"}, attempts=2)
    with pytest.raises(retry.RemoteError, match=r"az://container/p/: LIST failed after 2 tries"
                       ) as caught:
        store.list("az://container", "p/")
    chain = [caught.value, caught.value.__cause__]
    assert not any(SECRET in str(e) or SECRET in repr(e) for e in chain)


def test_server_without_range_reads_is_a_clear_error(http, tmp_path):
    http.objects["n.tar"] = b"n" * 3000
    http.ranges = False  # every GET answered with the whole object
    store = _store(range_bytes=1000, attempts=4)
    url = f"{http.url}/n.tar"
    with pytest.raises(retry.RemoteError, match=rf"{url}: the server does not answer range "
                                                r"reads \(HTTP Range requests\)"):
        _read(store, url, 3000, None, tmp_path / "n")
    with pytest.raises(retry.RemoteError, match="does not answer range reads"):
        store.get_range(url, 0, 40)
    assert http.requests[("GET", "n.tar")] <= 3 + 1  # not retried: one GET per range
