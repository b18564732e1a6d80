"""fastload without torch: a child process in which ``import torch`` fails
loads the same data, as NumPy arrays, that torch's DataLoader yields here
(as tensors): same values, dtypes, shapes, containers and order."""

import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from np_compare import as_numpy, assert_same_numpy

# Runs in the child.  Datasets are defined here so both sides share them.
DATASETS = textwrap.dedent('''
    import numpy as np

    class Pairs:
        def __len__(self):
            return 23

        def __getitem__(self, i):
            return np.arange(6, dtype=np.float32).reshape(2, 3) * i, i

    class Records:
        def __len__(self):
            return 10

        def __getitem__(self, i):
            return {"x": np.full(4, i, np.int16), "w": i / 4, "ok": i % 3 == 0,
                    "s": np.float32(i), "name": f"n{i}", "pair": (i, [i, 2 * i])}

    class Stream:
        def __iter__(self):
            from fastload import get_worker_info
            info = get_worker_info()
            wid, n = (0, 1) if info is None else (info.id, info.num_workers)
            return iter(np.arange(wid * 100, wid * 100 + 5 + 2 * wid, dtype=np.int64))
''')

CHILD = DATASETS + textwrap.dedent('''
    import pickle, sys
    sys.modules["torch"] = None  # any "import torch" now raises ImportError
    import fastload
    from fastload import IterableDataset

    class IterStream(Stream, IterableDataset):
        pass

    assert fastload.DataLoader([1]).output == "numpy"
    out = {}
    for nw in (0, 2):
        out["pairs", nw] = list(fastload.DataLoader(Pairs(), batch_size=4, num_workers=nw))
        out["records", nw] = list(fastload.DataLoader(Records(), batch_size=3, drop_last=True,
                                                      num_workers=nw))
        out["stream", nw] = list(fastload.DataLoader(IterStream(), batch_size=2, num_workers=nw))
        out["unbatched", nw] = list(fastload.DataLoader(Pairs(), batch_size=None, num_workers=nw))
    g = np.random.default_rng(5)
    out["shuffled"] = [b[1].tolist() for b in
                       fastload.DataLoader(Pairs(), batch_size=5, shuffle=True, generator=g)]
    try:
        list(fastload.DataLoader(Pairs(), batch_size=2, num_workers=2,
                                 collate_fn=lambda b: 1 / 0))
    except ZeroDivisionError as e:
        out["error"] = str(e).splitlines()[0]
    # Generic classes, as torch's (its test_typing), without torch.
    from typing import List

    class TypedPairs(Pairs, fastload.Dataset[List[np.ndarray]]):
        pass

    class TypedStream(Stream, fastload.IterableDataset[np.ndarray]):
        pass

    def typed(dl: fastload.DataLoader[List[np.ndarray]]) -> fastload.Sampler[int]:
        pass

    out["typed"] = (len(list(fastload.DataLoader[List[np.ndarray]](TypedPairs(), batch_size=4))),
                    len(list(fastload.DataLoader(TypedStream(), batch_size=2))))
    pickle.dump(out, sys.stdout.buffer)
''')


@pytest.fixture(scope="module")
def child_results():
    run = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, timeout=300)
    assert run.returncode == 0, run.stderr.decode()
    return pickle.loads(run.stdout)


def test_without_torch_matches_torch_as_numpy(child_results):
    torch = pytest.importorskip("torch")
    namespace = {}
    exec(DATASETS, namespace)
    DL = torch.utils.data.DataLoader
    for nw in (0, 2):
        want = {
            "pairs": list(DL(namespace["Pairs"](), batch_size=4, num_workers=nw)),
            "records": list(DL(namespace["Records"](), batch_size=3, drop_last=True,
                               num_workers=nw)),
            "unbatched": list(DL(namespace["Pairs"](), batch_size=None, num_workers=nw)),
        }
        for name, batches in want.items():
            assert_same_numpy(child_results[name, nw], as_numpy(batches), f"{name} num_workers={nw}")
    # The child's stream shards with fastload.get_worker_info(); torch's
    # equivalent shards with torch's.
    class TorchStream(torch.utils.data.IterableDataset):
        def __iter__(self):
            info = torch.utils.data.get_worker_info()
            wid = 0 if info is None else info.id
            return iter(np.arange(wid * 100, wid * 100 + 5 + 2 * wid, dtype=np.int64))

    for nw in (0, 2):
        want = as_numpy(list(DL(TorchStream(), batch_size=2, num_workers=nw)))
        assert_same_numpy(child_results["stream", nw], want, f"stream num_workers={nw}")


def test_without_torch_shuffles_with_numpy_generators_and_reports_errors(child_results):
    order = [i for batch in child_results["shuffled"] for i in batch]
    assert sorted(order) == list(range(23)) and order != list(range(23))
    assert child_results["error"].startswith("Caught ZeroDivisionError in DataLoader worker")


def test_without_torch_generic_classes_subscript(child_results):
    # 23 pairs in batches of 4; the stream's 5 items in batches of 2.
    assert child_results["typed"] == (6, 3)
