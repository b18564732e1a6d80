"""Per-worker random generators: fastload's WorkerInfo.rng draws what
torch's worker processes draw from their re-seeded global RNGs."""

import random

import numpy as np
import pytest

import fastload

torch = pytest.importorskip("torch")


class TorchGlobals(torch.utils.data.Dataset):
    """Draws from the global RNGs, which torch re-seeds in each worker."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        return random.random(), float(np.random.rand()), float(torch.rand(1))


class FastloadWorkerRNG(torch.utils.data.Dataset):
    """Draws from the worker's own generators instead."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        rng = fastload.get_worker_info().rng
        return (
            rng.random_generator.random(),
            float(rng.numpy_generator.rand()),
            float(torch.rand(1, generator=rng.torch_generator)),
        )


@pytest.mark.parametrize("num_workers", [1, 2])
def test_worker_rng_matches_torch_worker_globals(num_workers):
    def run(loader_cls, dataset):
        loader = loader_cls(dataset, batch_size=None, num_workers=num_workers,
                            generator=torch.Generator().manual_seed(7))
        return [tuple(float(v) for v in sample) for sample in loader]

    want = run(torch.utils.data.DataLoader, TorchGlobals())
    got = run(fastload.DataLoader, FastloadWorkerRNG())
    assert got == want


def test_worker_info_fields():
    seen = []

    class Probe(torch.utils.data.Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            info = fastload.get_worker_info()
            seen.append((info.id, info.num_workers, info.seed, info.worker_method, info.dataset))
            return i

    g = torch.Generator().manual_seed(3)
    base_seed = int(torch.empty((), dtype=torch.int64).random_(generator=torch.Generator().manual_seed(3)).item())
    dataset = Probe()
    list(fastload.DataLoader(dataset, num_workers=2, generator=g, worker_mode="thread"))
    assert {s[0] for s in seen} == {0, 1}
    for worker_id, num_workers, seed, method, ds in seen:
        assert (num_workers, seed, method) == (2, base_seed + worker_id, "thread")
        assert ds is dataset
    assert fastload.get_worker_info() is None
    info = fastload.WorkerInfo(0, 1, 0, None)
    with pytest.raises(RuntimeError):
        info.id = 3  # read-only, as torch's
