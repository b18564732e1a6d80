"""Checkpoint a training run mid-epoch and resume it exactly.

    python examples/resume.py --checkpoint run.pt --stop-after 7   # "preempted" at step 7
    python examples/resume.py --checkpoint run.pt                  # picks up at step 8
    python examples/resume.py --checkpoint other.pt                # the same run, uninterrupted

The checkpoint holds the model, the optimiser and loader.state_dict(): plain Python values,
saved with torch.save.  A new process builds the same DataLoader, calls load_state_dict(),
and gets exactly the batches the uninterrupted run would have had next, so both runs end
with the same weights (the printed checksum).  --data takes a folder with x.npy and y.npy;
without it, small arrays are generated from a fixed seed.
"""

import argparse
import os
import sys
import tempfile

import numpy as np
import torch
from torch import nn

from fastload import ArrayDataset, DataLoader


def make_arrays(folder, rows=2048, dim=16, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, dim)).astype(np.float32)
    y = (x @ rng.normal(size=dim) > 0).astype(np.int64)
    np.save(os.path.join(folder, "x.npy"), x)
    np.save(os.path.join(folder, "y.npy"), y)
    return folder


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", help="folder with x.npy and y.npy (default: generate them)")
    parser.add_argument("--checkpoint", required=True, help="file to save to and resume from")
    parser.add_argument("--stop-after", type=int, help="save and exit after this many steps")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)            # the same arithmetic in every run, for the checksum

    with tempfile.TemporaryDirectory() as scratch:
        folder = args.data or make_arrays(scratch)
        dataset = ArrayDataset(os.path.join(folder, "x.npy"), os.path.join(folder, "y.npy"))
        loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True,
                            num_workers=args.workers, generator=torch.Generator().manual_seed(0))
        torch.manual_seed(0)
        model = nn.Linear(dataset[0][0].shape[0], 2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        epoch = step = 0

        if os.path.exists(args.checkpoint):
            state = torch.load(args.checkpoint)
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            loader.load_state_dict(state["loader"])       # the rest of the interrupted epoch
            epoch, step = state["epoch"], state["step"]
            print(f"resumed at epoch {epoch}, step {step}")

        while epoch < args.epochs:
            for x, y in loader:
                loss = nn.functional.cross_entropy(model(x), y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                step += 1
                if step == args.stop_after:
                    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                                "loader": loader.state_dict(), "epoch": epoch, "step": step},
                               args.checkpoint)
                    print(f"saved at epoch {epoch}, step {step}: stopping")
                    return 0
            epoch += 1
        checksum = sum(float(p.detach().double().sum()) for p in model.parameters())
        print(f"done: {step} steps, loss {loss.item():.4f}, weights checksum {checksum:.12f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
