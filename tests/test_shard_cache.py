"""The node-local shard cache (fastload.datasets.remote.shard_cache): one
download per shard per node, whole files only, the byte bound, LRU eviction
that never removes a pinned shard -- across processes."""

import multiprocessing
import os

import pytest

from fastload.datasets.remote.shard_cache import ShardCache, entry_key

UNIT = 1000


def _writer(content, log=None):
    def fill(fd):
        if log is not None:
            with open(log, "a") as f:
                f.write(f"{os.getpid()}\n")
        os.pwrite(fd, content, 0)
    return fill


def _bytes(path):
    with open(path, "rb") as f:
        return f.read()


def _content(key):
    return (key.encode() * UNIT)[:UNIT]


def _pin_and_read(directory, key, log, start, out):
    start.wait()
    cache = ShardCache(directory, 10 * UNIT)
    with cache.pin(key, UNIT, _writer(_content(key), log)) as pin:
        with open(pin.path, "rb") as f:
            out.put(f.read() == _content(key))


def test_entry_key_is_stable_and_names_the_version():
    a = entry_key("s3://b/x/shard-000001.tar", 10, '"e1"')
    assert a == entry_key("s3://b/x/shard-000001.tar", 10, '"e1"')
    assert a.endswith("-shard-000001.tar")
    assert a != entry_key("s3://b/x/shard-000001.tar", 10, '"e2"')
    assert a != entry_key("s3://b/x/shard-000001.tar", 11, '"e1"')


def test_one_download_per_shard_across_processes(tmp_path):
    context = multiprocessing.get_context("fork")
    log, start, out = tmp_path / "log", context.Event(), context.Queue()
    directory = str(tmp_path / "cache")
    workers = [context.Process(target=_pin_and_read, args=(directory, "k", str(log), start, out))
               for _ in range(4)]
    for w in workers:
        w.start()
    start.set()
    results = [out.get(timeout=120) for _ in workers]
    for w in workers:
        w.join(120)
        assert w.exitcode == 0
    assert results == [True] * 4
    assert len(log.read_text().split()) == 1
    assert sorted(os.listdir(directory)) == [".evict.lock", "k", "k.lock"]


def test_failed_fill_leaves_nothing_and_the_next_pin_fills(tmp_path):
    cache = ShardCache(str(tmp_path), 10 * UNIT)

    def broken(fd):
        os.pwrite(fd, b"x" * 10, 0)
        raise ConnectionError("cut")
    with pytest.raises(ConnectionError):
        cache.pin("k", UNIT, broken)
    assert not cache.complete("k", UNIT)
    assert not [n for n in os.listdir(tmp_path) if ".part-" in n]
    with pytest.raises(OSError, match="10 bytes written, 1000 expected"):
        cache.pin("k", UNIT, lambda fd: os.pwrite(fd, b"x" * 10, 0))
    with cache.pin("k", UNIT, _writer(_content("k"))) as pin:
        assert _bytes(pin.path) == _content("k")


def test_bound_holds_lru_first(tmp_path):
    cache = ShardCache(str(tmp_path), 3 * UNIT)
    for n in range(10):
        key = f"s{n}"
        cache.pin(key, UNIT, _writer(_content(key))).release()
        assert cache.used_bytes() <= 3 * UNIT
    assert sorted(k for k in os.listdir(tmp_path) if not k.startswith(".") and
                  not k.endswith(".lock")) == ["s7", "s8", "s9"]
    cache.pin("s7", UNIT, _writer(b"")).release()  # s7 used again: s8 goes next
    cache.pin("s10", UNIT, _writer(_content("s10"))).release()
    assert cache.complete("s7", UNIT) and not cache.complete("s8", UNIT)
    assert cache.downloads == 11


def _hold(directory, key, held, done):
    cache = ShardCache(directory, 2 * UNIT)
    pin = cache.pin(key, UNIT, _writer(_content(key)))
    held.set()
    done.wait(120)
    pin.release()


def test_pinned_shard_is_never_evicted(tmp_path):
    directory = str(tmp_path)
    context = multiprocessing.get_context("fork")
    held, done = context.Event(), context.Event()
    holder = context.Process(target=_hold, args=(directory, "pinned", held, done))
    holder.start()
    try:
        assert held.wait(120)
        cache = ShardCache(directory, 2 * UNIT)
        mine = cache.pin("mine", UNIT, _writer(_content("mine")))
        for n in range(5):  # the bound is full of pins: they stay, the bound yields
            cache.pin(f"s{n}", UNIT, _writer(_content(f"s{n}"))).release()
            assert cache.complete("pinned", UNIT) and cache.complete("mine", UNIT)
        mine.release()
    finally:
        done.set()
        holder.join(120)
    assert holder.exitcode == 0
    cache.pin("s9", UNIT, _writer(_content("s9"))).release()  # now both may go
    assert not cache.complete("pinned", UNIT) and not cache.complete("mine", UNIT)
    assert cache.used_bytes() <= 2 * UNIT


def test_changed_file_is_fetched_again(tmp_path):
    cache = ShardCache(str(tmp_path), 10 * UNIT)
    cache.pin("k", UNIT, _writer(_content("k"))).release()
    with open(tmp_path / "k", "ab") as f:
        f.write(b"more")  # damaged: not the size its entry names
    log = tmp_path / "log"
    cache.pin("k", UNIT, _writer(_content("k"), str(log))).release()
    assert len(log.read_text().split()) == 1
    assert _bytes(tmp_path / "k") == _content("k")
