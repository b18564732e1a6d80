"""pin_memory=True with worker processes: the parent page-locks each shared
slot in place (cuMemHostRegister) when it first maps it, keeps it registered
while the worker reuses the slot, unregisters it just before the mapping goes
(never under a live batch), and hands a released slot back to its worker only
once the copies queued from it are done.

Driven through the fake CUDA driver (tests/c/fake_libcuda.c), which tracks
registered ranges as the driver does, refuses an unregistration that comes
after the unmapping, and can hold events pending.  Each case runs in a fresh
process: the driver is loaded once per process.  tests/test_cuda_gpu.py checks
the same on a real GPU.
"""

import os
import subprocess
import sys
import textwrap

import pytest

from fl_helpers import fastload_only
from test_cuda_driver import CC, ROOT, fake_driver  # noqa: F401 (fixture)
from test_cuda_upload import PRELUDE

pytestmark = fastload_only

PROCESS_PRELUDE = PRELUDE + """
import gc
from fastload.loader import process_engine as _process

class Rows:
    \"\"\"A Python dataset: row i is 1000 copies of i, with label i.\"\"\"
    def __len__(self):
        return 64
    def __getitem__(self, i):
        return np.full(1000, i, np.float32), i

def channels(it):
    return it._engine.channels

def registrations(it):
    return [m for c in channels(it) for m in c.maps.values()
            if isinstance(m, _process.HostRegistration)]

def check_batch(x, y):
    assert np.array_equal(np.asarray(x)[:, 0], np.asarray(y))

def memfd_mappings():
    with open("/proc/self/maps") as f:
        return sum("fastload-slot" in line for line in f)

def open_fds():
    return len(os.listdir("/proc/self/fd"))
"""


def run_case(body, driver, **env):
    script = PROCESS_PRELUDE + textwrap.dedent(body) + "\nprint('ok')\n"
    environment = dict(os.environ, PYTHONPATH=str(ROOT), FASTLOAD_LIBCUDA=driver, **env)
    result = subprocess.run([sys.executable, "-c", script], env=environment,
                            capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines()[-1] == "ok", result.stdout
    return result.stdout.splitlines()[:-1]


def test_each_slot_is_registered_once_and_unregistered_when_it_goes(fake_driver):  # noqa: F811
    run_case("""
        fds, memfds = open_fds(), memfd_mappings()
        loader = fastload.DataLoader(Rows(), batch_size=4, num_workers=2, pin_memory=True,
                                     persistent_workers=True, worker_mode="process")
        batches = 0
        for epoch in range(3):
            for x, y in loader:
                check_batch(x, y)
                # The batch lies in a slot the parent page-locked: no copy.
                assert loader._iterator._already_pinned(x) and loader._iterator._already_pinned(y)
                batches += 1
            del x, y
        c = counters()
        slots = registrations(loader._iterator)
        assert len(slots) == sum(len(ch.maps) for ch in channels(loader._iterator))  # all
        assert c["register_calls"] == c["host_registered"] == len(slots) < batches // 4
        assert c["last_register_flags"] == 1  # portable, as the pinned allocator's
        # Each released batch was fenced on the legacy default stream.
        assert c["event_records"] >= batches - len(slots) and c["last_record_stream"] == 1
        del loader, slots
        gc.collect()
        c = counters()
        assert c["host_registered"] == 0 and c["unregister_calls"] == c["register_calls"]
        assert c["bad_registrations"] == 0  # none twice, none after its unmapping
        assert (open_fds(), memfd_mappings()) == (fds, memfds)
    """, fake_driver["ok"])


def test_a_live_batch_keeps_its_slot_registered_and_mapped(fake_driver):  # noqa: F811
    run_case("""
        # Small slots share their worker's arena (one memfd, one mapping,
        # one registration); slots of 1.5 MiB get one each.
        class Large(Rows):
            def __getitem__(self, i):
                return np.full(100_000, i, np.float32), i
        loader = fastload.DataLoader(Large(), batch_size=4, num_workers=1, pin_memory=True,
                                     worker_mode="process")
        it = iter(loader)
        held = [next(it) for _ in range(3)]
        next(it)  # a fourth batch, dropped at once: its slot stays mapped for reuse
        assert len(registrations(it)) > 3
        del it, loader  # the worker stops; its mappings go, but the held ones
        gc.collect()
        c = counters()
        assert c["host_registered"] == 3 and c["unregister_calls"] == c["register_calls"] - 3
        for batch in held:
            check_batch(*batch)
        assert [int(batch[1][0]) for batch in held] == [0, 4, 8]
        del batch
        held.pop()
        assert counters()["host_registered"] == 2
        del held
        c = counters()
        assert c["host_registered"] == 0 and c["bad_registrations"] == 0
        assert memfd_mappings() == 0
        # Small batches: the arena stays registered while any batch in it lives.
        loader = fastload.DataLoader(Rows(), batch_size=4, num_workers=1, pin_memory=True,
                                     worker_mode="process")
        it = iter(loader)
        held = [next(it) for _ in range(3)]
        del it, loader
        gc.collect()
        assert counters()["host_registered"] == 1
        held.pop(0)
        held.pop(0)
        assert counters()["host_registered"] == 1
        check_batch(*held[0])
        del held
        c = counters()
        assert c["host_registered"] == 0 and c["bad_registrations"] == 0
        assert memfd_mappings() == 0
    """, fake_driver["ok"])


def test_slots_a_worker_drops_are_unregistered_at_once(fake_driver):  # noqa: F811
    run_case("""
        class Growing:
            # Every batch needs a larger slot than the last: the worker's
            # pool frees its oldest idle slots, and the parent drops them.
            def __len__(self):
                return 40
            def __getitem__(self, i):
                # (Past 1 MiB a slot is a memfd of its own, which can go.)
                return np.full((1 << 17) + (1 << 16) * (i // 2), i, np.float32), i
        loader = fastload.DataLoader(Growing(), batch_size=2, num_workers=1, prefetch_factor=1,
                                     pin_memory=True, worker_mode="process")
        it = iter(loader)
        for n in range(len(loader) - 1):
            x, y = next(it)
            assert np.asarray(x)[1, -1] == np.asarray(y)[1] == 2 * n + 1
            del x, y
            # Every live registration is a mapping the parent keeps.
            live = sum(len(c.locked) for c in channels(it))
            assert counters()["host_registered"] == live, (n, counters(), live)
        c = counters()  # the iterator is alive: only slots the worker dropped are gone
        assert c["unregister_calls"] > 0 and c["bad_registrations"] == 0
    """, fake_driver["ok"])


def test_a_released_slot_goes_back_only_after_its_fence(fake_driver):  # noqa: F811
    run_case("""
        loader = fastload.DataLoader(Rows(), batch_size=4, num_workers=1, prefetch_factor=2,
                                     pin_memory=True, persistent_workers=True,
                                     worker_mode="process")
        it = iter(loader)
        (channel,) = channels(it)
        returned = []
        real_send = channel.conn.send_bytes

        def checked_send(data):
            # Every slot handed back must be safe to overwrite: the small
            # slots lie in one arena, and each released slot has its own
            # fence in the arena's registration.
            message = __import__("pickle").loads(data)  # a request
            if message is not None:
                if message[2]:
                    (registration,) = channel.maps.values()
                    for slot_id in message[2]:
                        assert registration.fence_done(slot_id), (slot_id, message[2])
                returned.extend(message[2])
            real_send(data)

        channel.conn.send_bytes = checked_send
        _fake.fake_cuda_hold_events(1)  # the GPU is busy: fences stay pending
        for x, y in it:
            check_batch(x, y)
        del x, y
        c = counters()
        assert c["pending_queries"] > 0
        # Two fences may wait (num_workers * prefetch_factor); past that the
        # oldest is waited for, so the worker's pool stays bounded.
        assert len(channel.fenced) + len(channel.freed) >= 2 and c["event_syncs"] > 0
        # In flight (2), waiting on fences (2), and the two batches the loop
        # held as it asked for the next: 6 slots, not one per batch.
        assert len(channel.maps) <= 6 < len(loader), len(channel.maps)
        _fake.fake_cuda_hold_events(0)  # the GPU caught up
        registered = c["register_calls"]
        for epoch in range(2):
            for x, y in loader:
                check_batch(x, y)
        del x, y
        assert not channel.fenced, channel.fenced  # handed back with the next requests
        assert counters()["register_calls"] == registered, (counters(), registered)  # reused
        assert returned
    """, fake_driver["ok"])


def test_each_released_slot_waits_on_its_own_fence_not_the_newest(fake_driver):  # noqa: F811
    # Slots A and B lie in one arena (one registration).  A's copies are done
    # when B is released with the GPU still busy: A goes back to its worker
    # with the next request, without waiting for B's fence (one event per
    # arena, recorded at each release, made every slot wait for the newest).
    run_case("""
        loader = fastload.DataLoader(Rows(), batch_size=4, num_workers=1, prefetch_factor=4,
                                     pin_memory=True, worker_mode="process")
        it = iter(loader)
        (channel,) = channels(it)
        a, b = next(it), next(it)
        (registration,) = registrations(it)
        del a
        (slot_a,) = channel.freed
        _fake.fake_cuda_hold_events(1)  # B's copies are still queued on the GPU
        del b
        slot_b = channel.freed[-1]
        assert slot_a != slot_b and set(channel.fence_of) == {slot_a, slot_b}
        assert channel.fence_of[slot_a] is channel.fence_of[slot_b] is registration
        assert registration.fence_done(slot_a) and not registration.fence_done(slot_b)
        syncs = counters()["event_syncs"]
        assert channel._returnable() == [slot_a]
        assert counters()["event_syncs"] == syncs  # nothing waited for
        assert list(channel.fenced) == [slot_b]
        _fake.fake_cuda_hold_events(0)  # the GPU caught up
        assert channel._returnable() == [slot_b] and not channel.fence_of
        for x, y in it:
            check_batch(x, y)
    """, fake_driver["ok"])


def test_no_registration_without_pin_memory_or_with_threads(fake_driver):  # noqa: F811
    run_case("""
        plain = fastload.DataLoader(Rows(), batch_size=4, num_workers=2, worker_mode="process",
                                    persistent_workers=True)
        for x, y in plain:
            check_batch(x, y)
        assert all(type(m) is __import__("mmap").mmap for c in channels(plain._iterator)
                   for m in c.maps.values())
        threads = fastload.DataLoader(fastload.ArrayDataset(ROWS, LABELS), batch_size=8,
                                      num_workers=2, pin_memory=True)
        assert len(list(threads)) == 5
        c = counters()
        assert c["register_calls"] == 0 and c["pinned_buffers"] > 0
    """, fake_driver["ok"])


def test_process_pin_memory_without_a_driver_warns_once_as_before():
    script = PROCESS_PRELUDE.replace(
        '_fake = ctypes.CDLL(os.environ["FASTLOAD_LIBCUDA"])', "") + textwrap.dedent("""
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            loader = fastload.DataLoader(Rows(), batch_size=4, num_workers=2, pin_memory=True,
                                         persistent_workers=True, worker_mode="process")
            for x, y in loader:
                check_batch(x, y)
        assert [str(w.message) for w in caught] == [
            "'pin_memory' argument is set as true but no accelerator is found, then device "
            "pinned memory won't be used."], caught
        assert not registrations(loader._iterator)
        print("ok")
    """)
    environment = dict(os.environ, PYTHONPATH=str(ROOT), FASTLOAD_LIBCUDA="no-such-libcuda.so")
    result = subprocess.run([sys.executable, "-c", script], env=environment,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


@pytest.mark.parametrize("driver, env, reason", [
    ("ok", {"FAKE_CUDA_REGISTER_ERROR": "2"}, "cuMemHostRegister failed: CUDA error 2"),
    ("no-register", {}, "this CUDA driver has no cuMemHostRegister_v2"),
])
def test_a_refused_registration_warns_once_and_keeps_batches_pageable(
        fake_driver, driver, env, reason):  # noqa: F811
    lines = run_case("""
        loader = fastload.DataLoader(Rows(), batch_size=4, num_workers=2, pin_memory=True,
                                     persistent_workers=True, worker_mode="process")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for epoch in range(2):
                for x, y in loader:
                    check_batch(x, y)
        assert len(caught) == 1 and caught[0].category is RuntimeWarning, caught
        print(caught[0].message)
        assert not registrations(loader._iterator) and counters()["host_registered"] == 0
    """, fake_driver[driver], **env)
    assert lines[0].startswith("pin_memory=True: fastload could not page-lock a batch slot of "
                               "worker "), lines
    assert reason in lines[0], lines


def test_pin_keeps_tensors_fastload_page_locked(fake_driver):  # noqa: F811
    # Only reached with an accelerator; here (a CPU build of torch) pin_memory()
    # would raise, so returning the batch as it is shows no copy was asked for.
    run_case("""
        import torch
        from fastload.loader.upload import pin as _pin
        loader = fastload.DataLoader(Rows(), batch_size=4, num_workers=1, pin_memory=True,
                                     worker_mode="process", persistent_workers=True)
        it = iter(loader)
        batch = {"rows": next(it), "more": [next(it)]}
        pinned = _pin(batch, it._already_pinned)
        assert pinned["rows"][0] is batch["rows"][0] and pinned["more"][0][1] is batch["more"][0][1]
        assert not it._already_pinned(torch.zeros(4))
    """, fake_driver["ok"])


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_a_forked_child_leaves_the_parents_registrations_alone(fake_driver):  # noqa: F811
    run_case("""
        loader = fastload.DataLoader(Rows(), batch_size=4, num_workers=1, pin_memory=True,
                                     worker_mode="process")
        it = iter(loader)
        held = next(it)
        before = counters()["unregister_calls"]
        pid = os.fork()
        if pid == 0:
            code = 3
            try:
                del held, it, loader  # the child's copies: the driver is not called
                gc.collect()
                code = 0 if counters()["unregister_calls"] == before else 4
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
        check_batch(*held)
        del held, it, loader
        gc.collect()
        c = counters()
        assert c["host_registered"] == 0 and c["bad_registrations"] == 0
    """, fake_driver["ok"])
