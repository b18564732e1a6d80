"""The node-local shard cache (fastload.datasets.remote.shard_cache): one
download per shard per node, whole files only, the byte bound, LRU eviction
that never removes a pinned shard -- across processes."""

import fcntl
import multiprocessing
import os
import select
import signal
import threading
import time

import pytest

from fastload.datasets.remote import shard_cache
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
    assert sorted(os.listdir(directory)) == [".evict.lock", "k", "k.fill.lock", "k.lock"]


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


def test_forked_child_keeps_none_of_the_parents_locks(tmp_path):
    """A lock belongs to the open file: a child's copy of a pinned entry's
    descriptor would keep the entry locked after the parent unpins it, and
    a parent thread waiting for the exclusive lock would wait forever."""
    cache = ShardCache(str(tmp_path), 10 * UNIT)
    key = entry_key("s3://b/held.tar", UNIT, None)
    pin = cache.pin(key, UNIT, _writer(_content(key)))
    go, done = os.pipe()
    answer_r, answer_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # holds every descriptor it kept until the parent is done
        os.write(answer_w, b"1" if pin.held else b"0")
        pin.release()  # its parent's descriptor number: must not close what has it now
        grandchild = os.fork()  # a child forks in turn (its own worker processes)
        if grandchild == 0:
            os._exit(0)
        os.waitpid(grandchild, 0)
        os.write(answer_w, b"f")
        os.read(go, 1)
        os._exit(0)
    forked = False
    try:
        assert os.read(answer_r, 1) == b"0"  # the child's copy of the pin holds nothing
        ready, _, _ = select.select([answer_r], [], [], 120)
        forked = bool(ready) and os.read(answer_r, 1) == b"f"
        assert forked  # and it can fork in turn
        assert pin.held
        pin.release()
        assert cache._evict(key)  # the exclusive lock, without waiting: nobody holds it
        assert not os.path.exists(cache.path(key))
    finally:
        os.write(done, b"x")
        if not forked:
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        for fd in (go, done, answer_r, answer_w):
            os.close(fd)


def test_reader_waiting_for_a_download_does_not_wait_for_the_pins_after_it(tmp_path, monkeypatch):
    """A reader that found no file waits for the download under way, then
    pins the file while the filler (the loader's prefetcher, in the same
    process) still holds its own pin: waiting for every pin to go instead
    would wait for the loop that this reader blocks."""
    cache = ShardCache(str(tmp_path), 10 * UNIT)
    cache._ready_directory()
    key = entry_key("s3://b/shared.tar", UNIT, None)
    data = cache.path(key)
    looked = threading.Event()
    present = ShardCache._present

    def watched(*args, **kwargs):
        found = present(*args, **kwargs)
        looked.set()
        return found
    monkeypatch.setattr(ShardCache, "_present", staticmethod(watched))

    # The filler: the fill lock held, then the file written, then a pin.
    filling = shard_cache._lock(data + shard_cache._FILL, fcntl.LOCK_EX)
    got = []
    reader = threading.Thread(target=lambda: got.append(cache.pin(key, UNIT, _writer(b"x"))))
    reader.start()
    assert looked.wait(60)  # the reader found nothing and waits for the download
    with open(data + ".part", "wb") as f:
        f.write(_content(key))
    os.rename(data + ".part", data)
    fillers_pin = shard_cache._lock(data + shard_cache._LOCK, fcntl.LOCK_SH)
    shard_cache._descriptors.close(filling)
    reader.join(60)
    stuck = reader.is_alive()
    shard_cache._descriptors.close(fillers_pin)
    reader.join()
    assert not stuck
    assert _bytes(got[0].path) == _content(key)  # the filler's file, not a second download
    got[0].release()


def test_wait_for_another_download_ends_at_the_deadline(tmp_path):
    """A reader with a deadline (the loader's timeout) does not wait past
    it for a download under way elsewhere, and fills nothing; its pin and
    the entry are left as they were."""
    cache = ShardCache(str(tmp_path), 10 * UNIT)
    cache._ready_directory()
    key = entry_key("s3://b/slow.tar", UNIT, None)
    filling = shard_cache._lock(cache.path(key) + shard_cache._FILL, fcntl.LOCK_EX)
    try:
        with pytest.raises(TimeoutError, match="another download of it"):
            cache.pin(key, UNIT, _writer(b"never"), deadline=time.monotonic() + 0.2)
        assert not cache.complete(key, UNIT)
        assert cache._evict(key)  # no pin left behind: the entry's lock is free
    finally:
        shard_cache._descriptors.close(filling)
    with cache.pin(key, UNIT, _writer(_content(key)), deadline=time.monotonic() + 600) as pin:
        assert _bytes(pin.path) == _content(key)
