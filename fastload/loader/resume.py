"""Resumable loaders: ``state_dict()`` / ``load_state_dict()``.

A loader resumed mid-epoch must yield exactly the samples the uninterrupted
run would have yielded next.  What decides them is known when the epoch
starts: the iterator's base seed (worker seeds, and the key of fastload's
augmentation with the epoch number), and the random draws the sampler makes
for the epoch.  So the state records, instead of the order itself:

* ``base_seed`` and ``epoch`` (a persistent loader's epoch counter);
* the random state the sampler drew from, twice: just before
  ``iter(sampler)`` (samplers that draw eagerly) and just before its first
  ``next()`` (samplers written as generators draw then, as torch's do):
  every generator the loader owns (its ``generator`` and its samplers') and
  the global ``torch``, ``numpy`` and ``random`` states;
* ``num_yielded``, the batches already handed out this epoch, and
  ``samples_yielded``, the samples in them (``batching`` says how the
  loader grouped its sampler's indices into batches).

Resuming replays the epoch's start: the loader's generators are set to the
recorded states, the global ones are *swapped in only around the sampler's
draws* (the program's own global random state is left as it is), and the
samples already handed out are skipped without loading them.  A loader
that batches a flat stream of indices (``batch_size=``, a plain
``BatchSampler``, or ``batch_size=None``) skips by samples, so it may
resume with another ``batch_size`` or ``drop_last``: the rest of the epoch
comes once each, in order, in batches of the new size.  A loader whose
``batch_sampler`` is its own skips by batches, and refuses a state whose
batching differs.  An iterable dataset has no indices to skip: its first
batches are loaded again and dropped, so it needs the same ``batch_size``,
``drop_last`` and ``num_workers``; one with ``state_dict``/``load_state_dict``,
as in torchdata, iterated without workers, is restored directly instead
(not loaded again as well).  A map-style dataset that has them is restored
too.

The state holds plain Python values only (ints, floats, strings, bools,
None, lists and dicts with string keys): a torch generator's state is a hex
string, a NumPy array a list under ``{"ndarray": dtype, "data": ...}``.  So
``torch.load`` with ``weights_only=True`` (its default), ``pickle`` and
``json`` all carry it.  States of the first format (tensors and NumPy
arrays) still load.
"""

import itertools
import random

import numpy as np

from .._torch import is_torch_generator, torch

STATE_VERSION = 2
_VERSIONS = (1, 2)  # the formats load_state_dict reads


# ------------------------------------------------------ plain state values


def _plain(value):
    """``value`` with NumPy arrays and scalars and tuples made plain."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.ndarray):
        return {"ndarray": value.dtype.str, "data": value.tolist()}
    if isinstance(value, np.generic):
        return value.item()
    return value


def _unplain(value):
    """``_plain``'s inverse (NumPy arrays as they were; tuples as lists)."""
    if isinstance(value, dict):
        if set(value) == {"ndarray", "data"}:
            return np.asarray(value["data"], dtype=np.dtype(value["ndarray"]))
        return {k: _unplain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_unplain(v) for v in value]
    return value


def _torch_state(state):
    """A torch RNG state (ByteTensor) as a hex string."""
    return state.numpy().tobytes().hex()


def _torch_state_back(state):
    if isinstance(state, str):
        return torch.frombuffer(bytearray.fromhex(state), dtype=torch.uint8)
    return state  # the first format kept the tensor


# ---------------------------------------------------------------- generators


def _generators(loader):
    """The distinct generator objects the loader and its samplers draw
    from, in a fixed order (None is the global RNG: not listed)."""
    found = []

    def add(generator):
        if generator is not None and all(generator is not g for g in found):
            found.append(generator)

    add(loader.generator)
    sampler = loader._index_sampler
    for _ in range(4):  # BatchSampler -> sampler -> ...
        if sampler is None:
            break
        add(getattr(sampler, "generator", None))
        sampler = getattr(sampler, "sampler", None)
    return found


def _get_state(generator):
    if is_torch_generator(generator):
        return _torch_state(generator.get_state())
    if isinstance(generator, np.random.Generator):
        return _plain(generator.bit_generator.state)
    raise TypeError(f"cannot record the state of a {type(generator).__name__}")


def _set_state(generator, state):
    if is_torch_generator(generator):
        generator.set_state(_torch_state_back(state))
    else:
        generator.bit_generator.state = _unplain(state)


def _global_states():
    return {
        "torch": _torch_state(torch.get_rng_state()) if torch is not None else None,
        "numpy": _plain(np.random.get_state(legacy=False)),
        "random": _plain(random.getstate()),
    }


def _set_global_states(states):
    if states["torch"] is not None and torch is not None:
        torch.set_rng_state(_torch_state_back(states["torch"]))
    numpy_state = states["numpy"]
    np.random.set_state(_unplain(numpy_state) if isinstance(numpy_state, dict) else numpy_state)
    version, internal, gauss = states["random"]
    random.setstate((version, tuple(internal), gauss))


def generator_states(loader):
    """The states of the generators the loader owns, now."""
    return [_get_state(g) for g in _generators(loader)]


def snapshot(loader):
    """The random state the loader's sampler may draw from, now."""
    return {"generators": generator_states(loader), "globals": _global_states()}


def set_generators(loader, states):
    """Puts the loader's own generators in the recorded states."""
    generators = _generators(loader)
    if len(generators) != len(states):
        raise ValueError(
            "load_state_dict: the loader's generators differ from the ones recorded "
            f"({len(generators)} now, {len(states)} in the state): build the loader with the "
            "same sampler and generator arguments")
    for g, s in zip(generators, states):
        _set_state(g, s)


def replay(state, loader, fn):
    """Calls fn() with the loader's generators in the recorded states and
    the recorded global states swapped in, then puts the program's own
    global states back."""
    set_generators(loader, state["generators"])
    own = _global_states()
    _set_global_states(state["globals"])
    try:
        return fn()
    finally:
        _set_global_states(own)


class FirstDraw:
    """An index iterator that calls ``before()`` once, just before its first
    ``next()`` (when a lazy sampler makes its draws)."""

    __slots__ = ("_it", "_before")

    def __init__(self, it, before):
        self._it = it
        self._before = before

    def __iter__(self):
        return self

    def __next__(self):
        before, self._before = self._before, None
        if before is not None:
            return before(lambda: next(self._it))
        return next(self._it)


# ------------------------------------------------------------------ batching


def _flat_batch_classes():
    from .sampler import BatchSampler

    classes = [BatchSampler]
    if torch is not None:
        classes.append(torch.utils.data.BatchSampler)
    return classes


def is_flat(batch_sampler):
    """Whether ``batch_sampler`` cuts its ``sampler``'s indices, in order,
    into lists of ``batch_size`` (the last shorter, or dropped with
    ``drop_last``): fastload's or torch's BatchSampler, its ``__iter__``
    not overridden."""
    return any(isinstance(batch_sampler, cls) and type(batch_sampler).__iter__ is cls.__iter__
               for cls in _flat_batch_classes())


# A sampler's settings that decide its order (DistributedSampler's,
# ChunkShuffleSampler's, ShardSampler's ...), recorded where it has them.
_SETTINGS = ("epoch", "seed", "rank", "num_replicas", "world_size", "shuffle", "replacement",
             "drop_last", "buffer_size", "equal_length")


def _describe_sampler(sampler):
    try:
        length = len(sampler)
    except Exception:  # noqa: BLE001 (no length: TypeError, NotImplementedError of a stream sampler)
        length = None
    settings = {}
    for name in _SETTINGS:
        value = getattr(sampler, name, None)
        if isinstance(value, (bool, int, np.integer)):
            settings[name] = value if isinstance(value, bool) else int(value)
    description = {"type": f"{type(sampler).__module__}.{type(sampler).__qualname__}",
                   "length": length if length is None else int(length), "settings": settings}
    continued = getattr(sampler, "continued", None)  # ShardSampler: the runs before this one
    if continued:
        description["continued"] = continued
    return description


def batching(loader):
    """How ``loader`` makes its batches, as the state records it: ``kind``
    is "samples" (batch_size=None: one sample a batch), "flat" (a flat
    stream of indices cut into batches), "batches" (a user batch_sampler)
    or "iterable" (an iterable dataset)."""
    batch_sampler = loader.batch_sampler
    batch_size, drop_last, sampler = loader.batch_size, bool(loader.drop_last), loader.sampler
    if loader._dataset_kind == "iterable":
        kind, sampler = "iterable", None
    elif batch_sampler is None:
        kind = "samples"
    elif is_flat(batch_sampler):
        kind, sampler = "flat", batch_sampler.sampler
        batch_size, drop_last = int(batch_sampler.batch_size), bool(batch_sampler.drop_last)
    else:
        kind, sampler = "batches", batch_sampler
        batch_size = getattr(batch_sampler, "batch_size", None)
        drop_last = getattr(batch_sampler, "drop_last", None)
        batch_size = int(batch_size) if isinstance(batch_size, (int, np.integer)) else None
        drop_last = drop_last if isinstance(drop_last, bool) else None
    return {"kind": kind, "batch_size": batch_size, "drop_last": drop_last,
            "num_workers": int(loader.num_workers),
            "sampler": None if sampler is None else _describe_sampler(sampler)}


_KINDS = {
    "samples": "batch_size=None (one sample at a time)",
    "flat": "batches cut from its sampler's indices (batch_size=)",
    "batches": "a batch_sampler of its own",
    "iterable": "an iterable dataset",
}


def _changes(saved, now, names):
    return ", ".join(f"{name} {saved[name]!r} -> {now[name]!r}"
                     for name in names if saved[name] != now[name])


def skip_plan(state, loader, starting=True):
    """How a resumed epoch skips what the recorded run handed out:
    ``("samples", n, eager)``, the first n indices of the sampler (which
    the recorded run opened at ``iter()`` when ``eager``, else at its first
    draw), or ``("batches", n, None)``, the first n batches of the index
    sampler.  ValueError, naming what changed, where the loader's batching
    or sampler cannot continue the recorded run exactly.  Before the epoch
    starts (``starting`` False: in load_state_dict) a sampler's ``epoch``
    is not compared yet: ``set_epoch`` may come after loading."""
    saved = state.get("batching")
    if saved is None:  # the first format: batches handed out, nothing else known
        return "batches", state["num_yielded"], None
    now = batching(loader)
    flat = ("samples", "flat")
    if saved["kind"] in flat and now["kind"] in flat:
        skip = _continue_elsewhere(state, loader, starting)
        if skip is not None:
            return "samples", skip, saved["kind"] == "samples"
        changed = _sampler_changes(saved["sampler"], now["sampler"], starting)
        if changed:
            raise ValueError(
                f"load_state_dict: the loader's sampler changed since the state was saved "
                f"({changed}): resume with the same sampler, dataset length and settings "
                "(set_epoch as when it was saved)")
        return "samples", state["samples_yielded"], saved["kind"] == "samples"
    if saved["kind"] != now["kind"]:
        raise ValueError(
            f"load_state_dict: the state was saved by a loader with {_KINDS[saved['kind']]}, "
            f"this one has {_KINDS[now['kind']]}: it cannot continue that epoch exactly")
    if now["kind"] == "batches":
        changed = _changes(saved, now, ("batch_size", "drop_last"))
        sampler = _sampler_changes(saved["sampler"], now["sampler"], starting)
        changed = ", ".join(filter(None, [changed, sampler and f"batch_sampler {sampler}"]))
        if changed:
            raise ValueError(
                f"load_state_dict: the loader's batch_sampler changed ({changed}); a "
                "batch_sampler of its own resumes by skipping the batches handed out, which "
                "needs the same batches: resume with the same batch_sampler")
        return "batches", state["num_yielded"], None
    changed = _changes(saved, now, ("batch_size", "drop_last", "num_workers"))
    if changed:
        raise ValueError(
            f"load_state_dict: the loader changed ({changed}); an iterable dataset resumes by "
            "loading the batches handed out again, which needs the same batch_size, drop_last "
            "and num_workers (or a dataset with state_dict()/load_state_dict())")
    return "batches", state["num_yielded"], None


# What may differ when a sampler continues an epoch begun on another number
# of ranks (ShardSampler.continue_epoch).
_ELASTIC = {"rank", "world_size"}


def _continue_elsewhere(state, loader, starting):
    """Elastic resume: when the loader's sampler can continue an epoch that
    ran on other numbers of ranks (``continue_epoch``: ShardSampler), and the
    recorded one is of its type and differs in rank and world size at most,
    the sampler is told which runs began the epoch and yields the rest of
    it.  Returns how many of its indices to skip: 0 after another run, the
    samples handed out when this is the same rank of the same run, or None
    where this does not apply.  Before the epoch starts its ``epoch`` may
    not be set yet (it is told again when it starts)."""
    saved, now = state["batching"]["sampler"], batching(loader)["sampler"]
    sampler = loader.sampler if loader.batch_sampler is None else loader.batch_sampler.sampler
    continue_epoch = getattr(sampler, "continue_epoch", None)
    if saved is None or now is None or saved["type"] != now["type"] or continue_epoch is None:
        return None
    old, new = saved.get("settings", {}), now.get("settings", {})
    differ = {name for name in set(old) | set(new) if old.get(name) != new.get(name)}
    if not starting:
        differ.discard("epoch")
    runs = saved.get("continued") or []
    if not differ <= _ELASTIC or not (differ or runs):
        return None
    if differ:  # the recorded run is over: its ranks each yielded samples_yielded
        runs = runs + [[old.get("world_size"), state["samples_yielded"]]]
    settings = dict(old) if starting else dict(old, epoch=new.get("epoch"))
    if not continue_epoch(settings, runs):
        return None
    return 0 if differ else state["samples_yielded"]


def _sampler_changes(saved, now, starting):
    """What differs between two sampler descriptions, as text ("" if
    nothing does)."""
    if saved is None or now is None:
        return "" if saved == now else f"{_sampler_text(saved)} -> {_sampler_text(now)}"
    if (saved["type"], saved["length"]) != (now["type"], now["length"]):
        return f"{_sampler_text(saved)} -> {_sampler_text(now)}"
    old, new = saved.get("settings", {}), now.get("settings", {})
    return ", ".join(f"{name} {old.get(name)!r} -> {new.get(name)!r}"
                     for name in sorted(set(old) | set(new))
                     if old.get(name) != new.get(name) and (starting or name != "epoch"))


def _sampler_text(description):
    if description is None:
        return "none"
    length = description["length"]
    return description["type"] + ("" if length is None else f" of {length}")


def dataset_restored(state):
    """Whether an iterable dataset's own state (``state_dict()``, restored
    by load_state_dict) already stands past the batches handed out: it is
    the copy the loop's own thread iterated (num_workers=0).  A worker's
    copy is not the one the loader asks, so with workers the batches are
    loaded again from the restored (initial) state."""
    batching = state.get("batching")
    return "dataset" in state and batching is not None and batching["num_workers"] == 0


def resumed_indices(open_indices, skip, eager, batch_size, drop_last, arrays):
    """The rest of an epoch's index stream after its first ``skip`` indices,
    cut into batches of ``batch_size`` (None: one index at a time).
    ``open_indices()`` opens the sampler's stream: at once when ``eager``,
    else at the first ``next()``, as the recorded run opened it.  With
    ``arrays`` the stream is of int64 chunks and the batches are arrays."""
    it = open_indices() if eager else None
    return _resumed(it, open_indices, skip, batch_size, drop_last, arrays)


def _resumed(it, open_indices, skip, batch_size, drop_last, arrays):
    if it is None:
        it = open_indices()
    if arrays:
        from .sampler import _batches_of

        yield from _batches_of(_skip_chunks(it, skip), batch_size, drop_last)
        return
    it = itertools.islice(it, skip, None)
    if batch_size is None:
        yield from it
    elif drop_last:
        for batch in zip(*([it] * batch_size)):
            yield list(batch)
    else:
        batch = list(itertools.islice(it, batch_size))
        while batch:
            yield batch
            batch = list(itertools.islice(it, batch_size))


def _skip_chunks(chunks, skip):
    for chunk in chunks:
        if skip >= len(chunk):
            skip -= len(chunk)
            continue
        yield chunk[skip:]
        skip = 0


def check(state):
    if not isinstance(state, dict) or state.get("fastload_state") not in _VERSIONS:
        raise ValueError("load_state_dict: not a state from fastload's DataLoader.state_dict() "
                         f"(versions {', '.join(map(str, _VERSIONS))})")
    return state
