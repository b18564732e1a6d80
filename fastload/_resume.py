"""Resumable loaders: ``state_dict()`` / ``load_state_dict()``.

A loader resumed mid-epoch must yield exactly the batches the uninterrupted
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
* ``num_yielded``, the batches already handed out this epoch.

Resuming replays the epoch's start: the loader's generators are set to the
recorded states, the global ones are *swapped in only around the sampler's
draws* (the program's own global random state is left as it is), and the
first ``num_yielded`` batches of indices are skipped without loading them.
An iterable dataset has no indices to skip: its first batches are loaded
again and dropped (a dataset with ``state_dict``/``load_state_dict``, as in
torchdata, is restored directly instead, as is any map-style dataset that
has them).
"""

import copy
import random

import numpy as np

from ._torch import is_torch_generator, torch

STATE_VERSION = 1


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
        return generator.get_state()
    if isinstance(generator, np.random.Generator):
        return copy.deepcopy(generator.bit_generator.state)
    raise TypeError(f"cannot record the state of a {type(generator).__name__}")


def _set_state(generator, state):
    if is_torch_generator(generator):
        generator.set_state(state)
    else:
        generator.bit_generator.state = state


def _global_states():
    return {
        "torch": torch.get_rng_state() if torch is not None else None,
        "numpy": np.random.get_state(),
        "random": random.getstate(),
    }


def _set_global_states(states):
    if states["torch"] is not None and torch is not None:
        torch.set_rng_state(states["torch"])
    np.random.set_state(states["numpy"])
    random.setstate(states["random"])


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


def check(state):
    if not isinstance(state, dict) or state.get("fastload_state") != STATE_VERSION:
        raise ValueError("load_state_dict: not a state from fastload's DataLoader.state_dict() "
                         f"(version {STATE_VERSION})")
    return state
