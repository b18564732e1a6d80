"""Train a classifier on features stored as .npy files with fastload.ArrayDataset.

    python examples/arrays.py --data /path/to/dir      # dir/x.npy (N, D) and dir/y.npy (N,)
    python examples/arrays.py                          # small generated files

The .npy files are memory-mapped; each batch's rows are gathered in C by a worker thread,
with no Python call per sample, and handed over as torch tensors.
"""

import argparse
import os
import tempfile

import numpy as np
import torch
from torch import nn

from fastload import ArrayDataset, DataLoader


def make_arrays(folder, rows=4096, dim=32, classes=4, seed=0):
    rng = np.random.default_rng(seed)
    centres = rng.normal(0, 2, (classes, dim)).astype(np.float32)
    y = rng.integers(0, classes, rows)
    x = centres[y] + rng.normal(0, 1, (rows, dim)).astype(np.float32)
    np.save(os.path.join(folder, "x.npy"), x)
    np.save(os.path.join(folder, "y.npy"), y.astype(np.int64))
    return folder


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", help="folder with x.npy and y.npy (default: generate them)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as scratch:
        folder = args.data or make_arrays(scratch)
        dataset = ArrayDataset(os.path.join(folder, "x.npy"), os.path.join(folder, "y.npy"))
        x0, y0 = dataset[0]                                  # a tuple of NumPy arrays
        classes = int(np.load(os.path.join(folder, "y.npy"), mmap_mode="r").max()) + 1
        loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True,
                            num_workers=args.workers, generator=torch.Generator().manual_seed(0))

        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(x0.shape[0], 64), nn.ReLU(), nn.Linear(64, classes))
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
        for epoch in range(args.epochs):
            correct = total = 0
            for x, y in loader:                              # (B, D) float32, (B,) int64
                logits = model(x)
                loss = nn.functional.cross_entropy(logits, y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                correct += (logits.argmax(1) == y).sum().item()
                total += len(y)
            print(f"epoch {epoch}: loss {loss.item():.3f}, train accuracy {correct / total:.2f}")


if __name__ == "__main__":
    main()
