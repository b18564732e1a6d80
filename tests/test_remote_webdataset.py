"""WebDataset over URLs (fastload.datasets.remote): shards from moto's S3
server and a faulty HTTP server on localhost give the batches the same
shards give from local disk, through the node-local shard cache."""

import io
import multiprocessing
import os
import re
import shutil
import tempfile

import numpy as np
import pytest

pytest.importorskip("obstore")
torch = pytest.importorskip("torch")
Image = pytest.importorskip("PIL.Image")

import fastload  # noqa: E402
from fastload import transforms as T  # noqa: E402
from fastload.datasets import shard_index  # noqa: E402
from fastload.datasets.remote.retry import RemoteError, ShardChanged  # noqa: E402
from remote_servers import Fault, FaultyHTTPServer, s3_environment, upload_folder  # noqa: E402

SHARDS, PER = 6, 5
BUCKET = "train"


def _encode(pixels):
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "JPEG")
    return buffer.getvalue()


def _samples():
    rng = np.random.default_rng(5)
    return [(_encode(rng.integers(0, 256, (20, 26, 3), dtype=np.uint8)), i % 4)
            for i in range(SHARDS * PER)]


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    """Shards written by write_shards (with index files) in one folder, the
    same tars without them in another."""
    root = tmp_path_factory.mktemp("remote-shards")
    indexed = root / "indexed"
    indexed.mkdir()
    paths = fastload.write_shards(_samples(), str(indexed / "s-%03d.tar"), maxcount=PER)
    bare = root / "bare"
    bare.mkdir()
    for path in paths:
        shutil.copy(path, bare)
    return root, paths


@pytest.fixture(scope="module")
def s3(local):
    pytest.importorskip("moto.server")
    root, _ = local
    with s3_environment(BUCKET) as server:
        upload_folder(server, BUCKET, root / "indexed", "indexed/")
        upload_folder(server, BUCKET, root / "bare", "bare/")
        yield server


@pytest.fixture
def http(local):
    root, _ = local
    with FaultyHTTPServer() as server:
        for name in os.listdir(root / "indexed"):
            server.objects[f"d/{name}"] = (root / "indexed" / name).read_bytes()
        yield server


FAST = {"backoff_s": 0.01, "max_backoff_s": 0.05, "timeout_s": 30.0}
PATTERN = f"s-{{000..{SHARDS - 1:03d}}}.tar"


def _transform():
    return T.Compose([T.RandomResizedCrop(12), T.ToTensor()])


def _dataset(urls, cache, **kw):
    kw.setdefault("remote_options", FAST)
    return fastload.WebDataset(urls, transform=_transform(), cache_dir=str(cache), **kw)


def _batches(ds, workers=2, mode="thread", seed=3, **kw):
    loader = fastload.DataLoader(ds, batch_size=4, sampler=fastload.ShardSampler(ds, seed=seed),
                                 num_workers=workers, worker_mode=mode if workers else "auto",
                                 generator=torch.Generator().manual_seed(1), **kw)
    return [(a.clone(), b.clone()) for a, b in loader]


def _same(xs, ys):
    assert len(xs) == len(ys)
    for (a, la), (b, lb) in zip(xs, ys):
        assert torch.equal(a, b) and torch.equal(la, lb)


def _cached_shards(cache):
    return sorted(n for n in os.listdir(cache) if n.endswith(".tar"))


@pytest.fixture(scope="module")
def expected(local):
    root, _ = local
    ds = fastload.WebDataset(str(root / "indexed" / PATTERN), transform=_transform())
    return _batches(ds, workers=0)


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_s3_same_batches_as_local_disk(s3, expected, tmp_path, mode):
    ds = _dataset(f"s3://{BUCKET}/indexed/{PATTERN}", tmp_path)
    assert len(ds) == SHARDS * PER
    assert _cached_shards(tmp_path) == []  # counted from the index files: nothing downloaded
    _same(_batches(ds, mode=mode), expected)
    assert len(_cached_shards(tmp_path)) == SHARDS
    assert ds.path(0).startswith(f"s3://{BUCKET}/indexed/s-")


def test_s3_without_index_files_downloads_at_construction(s3, expected, tmp_path,
                                                          monkeypatch):
    from fastload.datasets.remote.store import Store

    def no_head(self, url):
        if url not in self.listed:
            raise AssertionError(f"HEAD {url}: the listing said")
        return self.listed[url]
    monkeypatch.setattr(Store, "head", no_head)  # sizes and ETags come from the listing
    ds = _dataset(f"s3://{BUCKET}/bare/", tmp_path)  # a prefix: every object under it
    assert ds.urls == [f"s3://{BUCKET}/bare/s-{i:03d}.tar" for i in range(SHARDS)]
    assert len(_cached_shards(tmp_path)) == SHARDS
    _same(_batches(ds, workers=0), expected)
    # The next dataset over the same cache reads the index files kept there.
    warm = _dataset(f"s3://{BUCKET}/bare/s-*.tar", tmp_path)
    assert warm.urls == ds.urls
    _same(_batches(warm), expected)


def test_s3_resume_is_exact(s3, tmp_path):
    ds = _dataset(f"s3://{BUCKET}/indexed/{PATTERN}", tmp_path)

    def make():
        return fastload.DataLoader(ds, batch_size=3, sampler=fastload.ShardSampler(ds, seed=9),
                                   num_workers=2, generator=torch.Generator().manual_seed(4))
    full = list(make())
    loader = make()
    it = iter(loader)
    head = [next(it) for _ in range(3)]
    state = loader.state_dict()
    del it
    shutil.rmtree(tmp_path)  # a new node: its cache is empty
    resumed_ds = _dataset(f"s3://{BUCKET}/indexed/{PATTERN}", tmp_path)
    resumed = fastload.DataLoader(resumed_ds, batch_size=3,
                                  sampler=fastload.ShardSampler(resumed_ds, seed=9),
                                  num_workers=2, generator=torch.Generator().manual_seed(4))
    resumed.load_state_dict(state)
    _same(head + list(resumed), full)


def test_http_faults_are_retried(http, expected, tmp_path):
    http.faults = [Fault("d/s-001.tar", "503", times=2), Fault("d/s-003.tar", "cut", times=2),
                   Fault("d/s-004.tar", "500", times=1)]
    ds = _dataset(f"{http.url}/d/{PATTERN}", tmp_path)
    _same(_batches(ds), expected)
    assert all(f.times == 0 for f in http.faults)
    assert all(http.requests[("GET", f"d/s-{i:03d}.tar")] >= 1 for i in range(SHARDS))


def test_http_error_names_the_url(http, tmp_path):
    http.faults = [Fault("d/s-002.tar", "503", times=1000)]
    ds = _dataset(f"{http.url}/d/{PATTERN}", tmp_path,
                  remote_options={**FAST, "attempts": 3})
    url = f"{http.url}/d/s-002.tar"
    with pytest.raises(RemoteError, match=f"{url}: GET bytes 0-.* failed after 3 tries: .*503"):
        ds[2 * PER]
    assert ds[0][1] == 0  # the other shards are fine


def test_missing_shard_is_named(http, tmp_path):
    with pytest.raises(FileNotFoundError, match=f"{http.url}/d/nope.tar"):
        _dataset(f"{http.url}/d/nope.tar", tmp_path)


def test_shard_changed_since_listed_is_named(http, tmp_path):
    ds = _dataset(f"{http.url}/d/{PATTERN}", tmp_path)
    http.objects["d/s-000.tar"] += b"\0" * 512
    with pytest.raises(ShardChanged, match=f"{http.url}/d/s-000.tar: changed since it was listed"):
        ds[0]


def test_cache_bound_holds_and_pins_are_kept(http, expected, tmp_path):
    size = len(http.objects["d/s-000.tar"])
    ds = _dataset(f"{http.url}/d/{PATTERN}", tmp_path, cache_bytes=2 * size + 100,
                  prefetch_shards=0)
    ds._remote.keep_calls = 1  # a pin lasts one batch: the bound can hold
    sampler = fastload.ShardSampler(ds, shuffle=False)
    seen = []
    for start in range(0, len(ds), PER):
        indices = list(sampler)[start:start + PER]
        ds._ready(indices)
        s = ds.shard_of(indices[0])
        assert ds._remote.pinned == [s]
        assert os.path.exists(ds._remote.paths[s])  # pinned: in the cache, whatever the bound
        seen.append(ds[indices[0]][1])
        assert ds._remote.cache.used_bytes() <= 2 * size + 100
    assert len(seen) == SHARDS
    _same(_batches(ds), expected)  # evicted shards come back


def _read_in_child(ds, out):
    try:
        ds._ready([0])
        out.put("read")
    except RemoteError as error:
        out.put(str(error))


def test_forked_process_does_not_download(http, tmp_path):
    ds = _dataset(f"{http.url}/d/{PATTERN}", tmp_path)
    ds._ready([PER])  # obstore ran here: a forked child must not call it
    context = multiprocessing.get_context("fork")
    out = context.Queue()
    child = context.Process(target=_read_in_child, args=(ds, out))
    child.start()
    message = out.get(timeout=120)
    child.join(120)
    assert "cannot download it" in message and "d/s-000.tar" in message


def test_prefetch_follows_the_sampler(http, tmp_path):
    ds = _dataset(f"{http.url}/d/{PATTERN}", tmp_path, prefetch_shards=SHARDS)
    sampler = fastload.ShardSampler(ds, shuffle=False, buffer_size=0)
    it = iter(sampler)
    next(it)  # entering shard 0: shards 1.. are fetched in the background
    ds._ready([0])
    prefetcher = ds._remote._prefetcher
    prefetcher.stop()  # waits for the shard being fetched; drops the rest
    assert not ds._remote.prefetch_errors()
    assert 0 in ds._remote.pinned and len(ds._remote.pinned) >= 1
    assert len(_cached_shards(tmp_path)) == len(ds._remote.pinned)


def test_prefetched_shards_bring_their_index_files(http, tmp_path):
    """The prefetcher saves each shard's index file beside its cached copy,
    so the shard's first batch makes no index request in the loop."""
    ds = _dataset(f"{http.url}/d/{PATTERN}", tmp_path, prefetch_shards=SHARDS)
    sampler = fastload.ShardSampler(ds, shuffle=False, buffer_size=0)
    it = iter(sampler)
    next(it)
    ds._ready([0])
    ds._remote._prefetcher.stop()  # waits for the shard being fetched
    fetched = [s for s in ds._remote.pinned if s != 0]
    assert fetched and not ds._remote.prefetch_errors()
    assert all(os.path.exists(ds._remote.paths[s] + shard_index.SUFFIX) for s in fetched)

    def index_gets():
        return sum(n for (method, path), n in http.requests.items()
                   if method == "GET" and path.endswith(shard_index.SUFFIX))
    before = index_gets()
    s = fetched[0]
    assert ds[s * PER][1] == ds[s * PER][1]  # the shard's samples, its arrays loaded
    assert index_gets() == before


def test_fields_read_from_the_cache(http, local, tmp_path):
    root, _ = local
    here = fastload.WebDataset(str(root / "indexed" / PATTERN), fields=("__key__", "cls", "jpg"))
    there = fastload.WebDataset(f"{http.url}/d/{PATTERN}", fields=("__key__", "cls", "jpg"),
                                cache_dir=str(tmp_path), remote_options=FAST)
    for i in (0, PER + 1, len(here) - 1):
        key, label, image = there[i]
        assert (key, label) == here[i][:2] and np.array_equal(image, here[i][2])
        assert there.members(i) == here.members(i)


def test_warm_cache_reads_the_index_kept_there(http, tmp_path):
    ds = _dataset(f"{http.url}/d/{PATTERN}", tmp_path)
    ds._ready(range(len(ds)))  # every shard, and its index file, read
    assert all(os.path.exists(p + shard_index.SUFFIX) for p in ds._remote.paths)
    before = sum(n for (method, path), n in http.requests.items()
                 if method == "GET" and path.endswith(shard_index.SUFFIX))
    warm = _dataset(f"{http.url}/d/{PATTERN}", tmp_path)
    warm._ready(range(len(warm)))
    after = sum(n for (method, path), n in http.requests.items()
                if method == "GET" and path.endswith(shard_index.SUFFIX))
    assert after == before  # the counts and the arrays from the cache: no index GET
    assert [warm[i][1] for i in range(len(warm))] == [ds[i][1] for i in range(len(ds))]


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_loader_timeout_bounds_a_download(http, tmp_path, mode):
    """Every shard answers slowly (until the server is released): the wait
    for the first batch's download ends at the loader's timeout with
    torch's error, naming the shard's URL."""
    http.faults = [Fault(f"d/s-{i:03d}.tar", "slow", times=1000, delay_s=600)
                   for i in range(SHARDS)]
    ds = _dataset(f"{http.url}/d/{PATTERN}", tmp_path)
    url = re.escape(http.url) + r"/d/s-\d{3}\.tar"
    with pytest.raises(RuntimeError, match=rf"DataLoader timed out after 2 seconds: {url}: "):
        _batches(ds, mode=mode, timeout=2)
    assert _cached_shards(tmp_path) == []


def test_batches_kept_across_a_download_timeout(http, local, tmp_path):
    """The batch delivered when the next one's download timed out is handed
    out by the next call, which downloads that one again: no batch is lost
    or repeated."""
    root, _ = local

    def run(ds, workers, timeout=0):
        loader = fastload.DataLoader(
            ds, batch_size=PER, num_workers=workers, timeout=timeout,
            worker_mode="thread" if workers else "auto",
            prefetch_factor=1 if workers else None,
            sampler=fastload.ShardSampler(ds, shuffle=False, buffer_size=0),
            generator=torch.Generator().manual_seed(1))
        return loader
    expected = [(a.clone(), b.clone()) for a, b in
                run(fastload.WebDataset(str(root / "indexed" / PATTERN),
                                        transform=_transform()), 0)]
    http.faults = [Fault("d/s-001.tar", "slow", times=1, delay_s=600)]
    ds = _dataset(f"{http.url}/d/{PATTERN}", tmp_path, prefetch_shards=0)
    ds._ready(range(PER))  # shard 0 in the cache: only batch 0's decode races the timeout
    loader = run(ds, 1, timeout=10)
    it = iter(loader)
    with pytest.raises(RuntimeError, match=rf"timed out after 10 seconds: "
                                           rf"{re.escape(http.url)}/d/s-001\.tar: "):
        next(it)
    assert loader.state_dict()["samples_yielded"] == 0  # the held batch is not handed out
    http.release.set()
    got = [(a.clone(), b.clone()) for a, b in it]
    _same(got, expected)


def _mix_batches(mix, workers, mode="thread"):
    sampler = fastload.MixSampler(mix, {"a": 2, "b": 1}, num_samples=24, seed=4)
    loader = fastload.DataLoader(mix, batch_size=4, sampler=sampler, num_workers=workers,
                                 worker_mode=mode if workers else "auto",
                                 generator=torch.Generator().manual_seed(1))
    return [(a.clone(), b.clone()) for a, b in loader]


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_mix_of_remote_sources(http, local, tmp_path, mode):
    """A MixDataset of WebDatasets over URLs: the loader fetches each
    source's shards where it draws the indices (MixDataset._fetch), so
    worker processes, which cannot download, read them from the cache."""
    root, _ = local
    plain = T.Compose([T.Resize((12, 12)), T.ToTensor()])  # no random draw: any worker count

    def mix(where, **kw):
        return fastload.MixDataset({
            "a": fastload.WebDataset(f"{where}/s-{{000..002}}.tar", transform=plain, **kw),
            "b": fastload.WebDataset(f"{where}/s-{{003..005}}.tar", transform=plain, **kw)})
    expected = _mix_batches(mix(str(root / "indexed")), 0)
    remote = mix(f"{http.url}/d", cache_dir=str(tmp_path), remote_options=FAST,
                 prefetch_shards=0)
    assert _cached_shards(tmp_path) == []
    _same(_mix_batches(remote, 2, mode), expected)
    assert len(_cached_shards(tmp_path)) == SHARDS
    if mode == "process":  # the parent pinned them: it downloaded them
        assert sorted(remote.datasets[0]._remote.pinned) == [0, 1, 2]


def test_mix_fetch_bounded_by_the_loader_timeout(http, tmp_path):
    http.faults = [Fault(f"d/s-{i:03d}.tar", "slow", times=1000, delay_s=600)
                   for i in range(SHARDS)]
    plain = T.Compose([T.Resize((12, 12)), T.ToTensor()])
    remote = fastload.MixDataset([
        fastload.WebDataset(f"{http.url}/d/s-{{000..002}}.tar", transform=plain,
                            cache_dir=str(tmp_path), remote_options=FAST),
        fastload.WebDataset(f"{http.url}/d/s-{{003..005}}.tar", transform=plain,
                            cache_dir=str(tmp_path), remote_options=FAST)])
    loader = fastload.DataLoader(remote, batch_size=4, shuffle=True, num_workers=2,
                                 worker_mode="process", timeout=2)
    with pytest.raises(RuntimeError, match=rf"DataLoader timed out after 2 seconds: "
                                           rf"{re.escape(http.url)}/d/s-\d{{3}}\.tar: "):
        next(iter(loader))


def test_write_shards_to_s3(s3, local, expected, tmp_path, monkeypatch):
    """write_shards to an s3:// pattern: each shard written in a temporary
    folder, uploaded with its index file, then removed; read back over the
    URL, the shards are the local ones."""
    from fastload.datasets.remote.store import Store

    _, paths = local
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    os.mkdir(tmp_path / "tmp")
    urls = fastload.write_shards(_samples(), f"s3://{BUCKET}/written/s-%03d.tar", maxcount=PER)
    assert urls == [f"s3://{BUCKET}/written/s-{i:03d}.tar" for i in range(SHARDS)]
    assert os.listdir(tmp_path / "tmp") == []  # the local copies are gone
    store = Store()
    for url, path in zip(urls, paths):
        with open(path, "rb") as f:
            assert store.get(url) == f.read()
    os.mkdir(tmp_path / "cache")
    ds = _dataset(f"s3://{BUCKET}/written/", tmp_path / "cache")
    assert ds.urls == urls
    assert _cached_shards(tmp_path / "cache") == []  # counted from the uploaded index files
    _same(_batches(ds), expected)


def test_write_shards_multipart_upload(s3, tmp_path):
    """A shard larger than obstore's part size goes up in parts (its ETag
    is then not an MD5) and reads back whole."""
    from fastload.datasets.remote.store import Store

    rng = np.random.default_rng(8)
    big = [rng.integers(0, 256, 6 << 20, dtype=np.uint8).tobytes() for _ in range(2)]
    samples = [{"__key__": f"k{i}", "bin": data, "cls": i} for i, data in enumerate(big)]
    urls = fastload.write_shards(samples, f"s3://{BUCKET}/big/b-%d.tar", maxcount=1)
    paths = fastload.write_shards(samples, str(tmp_path / "b-%d.tar"), maxcount=1)
    store = Store()
    for url, path in zip(urls, paths):
        size, etag = store.head(url)
        assert size == os.path.getsize(path) and "-" in etag  # "<md5 of the parts' md5s>-2"
    ds = fastload.WebDataset(f"s3://{BUCKET}/big/", fields=("__key__", "bin", "cls"),
                             image_extensions=("bin",), cache_dir=str(tmp_path / "cache"),
                             remote_options=FAST)
    assert [ds[i] for i in range(2)] == [(f"k{i}", big[i], i) for i in range(2)]


def test_write_shards_upload_error_names_the_url(s3, tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with pytest.raises(RemoteError, match=r"s3://no-such-bucket/s-000\.tar: PUT failed"):
        fastload.write_shards(_samples(), "s3://no-such-bucket/s-%03d.tar", maxcount=PER,
                              remote_options={**FAST, "attempts": 2})
    assert os.listdir(tmp_path) == []  # the temporary folder is removed


def test_server_without_range_reads_is_named(http, tmp_path):
    http.ranges = False
    with pytest.raises(RemoteError, match=rf"{re.escape(http.url)}/d/s-000\.tar\.fastload-index: "
                                          "the server does not answer range reads"):
        _dataset(f"{http.url}/d/{PATTERN}", tmp_path)
