"""Random draws shared by the loader and the samplers.

With torch installed and a torch.Generator (or none, meaning torch's global
RNG), every draw is the very torch call torch's DataLoader and samplers make,
in the same order, so a given seed yields torch's exact batches.  A
``numpy.random.Generator`` works everywhere; without torch, ``None`` means
NumPy's global RNG (seeded by ``numpy.random.seed``).
"""

import numpy as np

from ._torch import is_torch_generator, torch

_INT64_MAX = 2**63 - 1


def _use_torch(generator):
    return torch is not None and (generator is None or is_torch_generator(generator))


def _numpy_rng(generator):
    if isinstance(generator, np.random.Generator):
        return generator
    if generator is None:
        return np.random.mtrand._rand  # the legacy global RNG, as np.random.seed sets it
    raise TypeError(
        "generator must be a torch.Generator, a numpy.random.Generator or None, "
        f"but got {type(generator).__name__}"
    )


def _integers(rng, high, size=None):
    """Uniform int64s in [0, high) from a Generator or the legacy RandomState."""
    draw = rng.integers if isinstance(rng, np.random.Generator) else rng.randint
    return draw(0, high, size=size, dtype=np.int64)


def draw_seed(generator=None):
    """A 63-bit seed, drawn as torch draws a DataLoader's base seed."""
    if _use_torch(generator):
        return int(torch.empty((), dtype=torch.int64).random_(generator=generator).item())
    return int(_integers(_numpy_rng(generator), _INT64_MAX))


def fresh_generator(generator):
    """What RandomSampler uses when given no generator: a new one seeded from
    the global RNG (torch's rule)."""
    if _use_torch(None):
        return torch.Generator().manual_seed(draw_seed(None))
    return np.random.default_rng(draw_seed(None))


def randperm_array(n, generator):
    """torch.randperm(n) as an int64 NumPy array."""
    if _use_torch(generator):
        return torch.randperm(n, generator=generator).numpy()
    return _numpy_rng(generator).permutation(n)


def randperm(n, generator):
    return randperm_array(n, generator).tolist()


def randint_array(high, size, generator):
    """torch.randint(high, (size,)) as an int64 NumPy array."""
    if _use_torch(generator):
        return torch.randint(high=high, size=(size,), dtype=torch.int64, generator=generator).numpy()
    return _integers(_numpy_rng(generator), high, size)


def multinomial(weights, num_samples, replacement, generator):
    """Indices drawn with probability proportional to `weights` (float64)."""
    if _use_torch(generator):
        w = torch.as_tensor(weights, dtype=torch.double)
        return torch.multinomial(w, num_samples, replacement, generator=generator).tolist()
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 1 or (w < 0).any() or not np.isfinite(w).all() or w.sum() <= 0:
        raise RuntimeError("invalid multinomial distribution (weights must be finite, >= 0, sum > 0)")
    if not replacement and num_samples > np.count_nonzero(w):
        raise RuntimeError("cannot sample n_sample > prob_dist.size(-1) samples without replacement")
    rng = _numpy_rng(generator)
    return rng.choice(w.shape[0], size=num_samples, replace=replacement, p=w / w.sum()).tolist()


def manual_generator(seed):
    """A generator seeded with `seed` (DistributedSampler's per-epoch one)."""
    if torch is not None:
        return torch.Generator().manual_seed(seed)
    return np.random.default_rng(seed)
