"""fastload in a profiler's timeline, beside the model.

**torch.profiler.**  While one records, each ``next()`` of a fastload
iterator is a range on the training loop's thread, named as torch names its
own (``enumerate(DataLoader)#_ThreadedIter.__next__``), and fastload records
what its workers do: each batch, each stage (read, decode, transform,
collate, dataset, upload) and each wait for the GIL, on the worker's own
thread.  Worker threads run C that torch's profiler cannot see, so these
events join its trace when it is written::

    with torch.profiler.profile() as prof:
        for batch in loader:
            ...
    fastload.profiler.export_chrome_trace(prof, "trace.json")

or, with a schedule, ``on_trace_ready=fastload.profiler.trace_handler(dir)``
in place of ``torch.profiler.tensorboard_trace_handler(dir)``.  Each worker
thread shows as its own row ("fastload-w0", ...).  Process workers run in
other processes, which a trace of this one does not show (torch's own
worker processes do not appear either); their times are in
``loader.stats()``.

**NVTX (Nsight Systems).**  ``nvtx(True)`` marks the same batches and
stages as NVTX ranges on the threads that run them; it is on by itself when
fastload is imported under a tool that listens for NVTX (Nsight Systems sets
``NVTX_INJECTION64_PATH``).  It needs the NVTX library, which CUDA builds of
torch load (``libnvToolsExt.so.1``); ``$FASTLOAD_LIBNVTX`` names another.
"""

import contextlib
import gzip
import json
import os
import socket
import sys
import time

from .. import _C
from .._torch import torch

__all__ = ["export_chrome_trace", "merge_into_chrome_trace", "nvtx", "trace_handler"]

# Events kept between exports (24 bytes each): a JPEG loader makes about
# four per sample, so this holds a minute or more of a typical profile.
TRACE_CAPACITY = 1 << 18

_NOTHING = contextlib.nullcontext()
# monotonic ns -> Unix ns, sampled when recording starts (Chrome traces are
# in Unix time).
_offset_ns = None


def torch_profiling():
    """Whether a torch.profiler (or autograd profiler) records now (none
    can before torch's autograd profiler is imported: it is not imported
    here for the asking)."""
    return getattr(sys.modules.get("torch.autograd.profiler"), "_is_profiler_enabled", False)


def sync():
    """Records the workers' events while a torch profiler records: called as
    an iterator starts an epoch (before its workers do) and by next_range.
    Returns whether one records.  A profile's end is noticed at the next
    epoch's start; until then its events wait for the export."""
    if not torch_profiling():
        if _C.trace_on():
            _C.trace_stop()
        return False
    if not _C.trace_on():
        start_recording()
    return True


def next_range(name):
    """For one ``next()`` of the loop: a torch record_function range while a
    torch profiler records, else a context that does nothing."""
    if not sync():
        return _NOTHING
    return torch.autograd.profiler.record_function(name)


def start_recording():
    """Records every loader's worker events from now, dropping any kept."""
    global _offset_ns
    _C.trace_start(TRACE_CAPACITY)
    _offset_ns = _unix_offset()


def _unix_offset():
    before = _C.clock_ns()
    unix = time.time_ns()
    return unix - (before + _C.clock_ns()) // 2


def take_events():
    """Stops recording; returns the events as dicts, times in Unix ns."""
    raw, dropped = _C.trace_take(TRACE_CAPACITY)
    offset = _offset_ns if _offset_ns is not None else _unix_offset()
    events = []
    for i in range(0, len(raw), 24):
        start = int.from_bytes(raw[i:i + 8], "little")
        end = int.from_bytes(raw[i + 8:i + 16], "little")
        kind = int.from_bytes(raw[i + 16:i + 20], "little", signed=True)
        tid = int.from_bytes(raw[i + 20:i + 24], "little", signed=True)
        events.append({"kind": _C.TRACE_KINDS[kind], "tid": tid,
                       "start_ns": start + offset, "end_ns": end + offset})
    return events, dropped


def merge_into_chrome_trace(path):
    """Adds fastload's recorded worker events to the Chrome trace at `path`
    (written by torch.profiler; ``.gz`` too), keeping those that overlap
    the trace's own span.  Returns the number added."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as f:
        trace = json.load(f)
    events, dropped = take_events()
    base_ns = int(trace.get("baseTimeNanoseconds", 0))
    spans = [(e["ts"], e["ts"] + e.get("dur", 0)) for e in trace.get("traceEvents", [])
             if e.get("ph") == "X" and "ts" in e]
    first = min((s for s, _ in spans), default=float("-inf"))
    last = max((e for _, e in spans), default=float("inf"))
    pid = os.getpid()
    named = {e.get("tid") for e in trace.get("traceEvents", [])
             if e.get("ph") == "M" and e.get("name") == "thread_name"}
    added = []
    for event in events:
        ts = (event["start_ns"] - base_ns) / 1e3
        dur = (event["end_ns"] - event["start_ns"]) / 1e3
        if ts + dur < first or ts > last:
            continue  # read ahead before the profile began, or after it ended
        added.append({"ph": "X", "cat": "fastload", "name": f"fastload {event['kind']}",
                      "pid": pid, "tid": event["tid"], "ts": ts, "dur": dur})
    for tid in sorted({e["tid"] for e in added} - named):
        added.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                      "args": {"name": _thread_name(tid)}})
    if dropped:
        trace.setdefault("fastload", {})["dropped_events"] = dropped
    trace.setdefault("traceEvents", []).extend(added)
    with opener(path, "wt") as f:
        json.dump(trace, f)
    return sum(1 for e in added if e["ph"] == "X")


def _thread_name(tid):
    try:
        with open(f"/proc/self/task/{tid}/comm") as f:
            return f.read().strip()
    except OSError:  # the thread has ended
        return f"fastload worker {tid}"


def export_chrome_trace(prof, path):
    """``prof.export_chrome_trace(path)`` with fastload's worker threads in it."""
    prof.export_chrome_trace(str(path))
    merge_into_chrome_trace(path)


def trace_handler(dir_name, worker_name=None, use_gzip=False):
    """An ``on_trace_ready`` handler like torch's
    ``tensorboard_trace_handler``, whose traces also hold fastload's worker
    threads."""
    def handler(prof):
        os.makedirs(dir_name, exist_ok=True)
        name = worker_name or f"{socket.gethostname()}_{os.getpid()}"
        path = os.path.join(dir_name, f"{name}.{time.time_ns()}.pt.trace.json"
                            + (".gz" if use_gzip else ""))
        export_chrome_trace(prof, path)

    return handler


def nvtx(enabled=True, library=None):
    """Turns NVTX ranges for fastload's batches and stages on or off.
    Raises OSError when the NVTX library cannot be loaded."""
    if enabled:
        _C.nvtx_start(library)
    else:
        _C.nvtx_stop()
