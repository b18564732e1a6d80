"""Train a small language model on nanoGPT's token files with fastload.TokenDataset.

    python examples/tokens_nanogpt.py --data /path/to/data/openwebtext   # train.bin, val.bin
    python examples/tokens_nanogpt.py                                    # small generated files

nanoGPT's prepare.py writes each split as one flat array of uint16 tokens.  Its
get_batch() draws batch_size offsets with replacement and slices x = data[i:i+block] and
y = data[i+1:i+1+block]; here TokenDataset(stride=1) with a RandomSampler(replacement=True)
draws the same offsets, and C worker threads cut the windows into int64 batches.
"""

import argparse
import os
import tempfile

import numpy as np
import torch
from torch import nn

from fastload import DataLoader, RandomSampler, TokenDataset


def make_tokens(folder, tokens=50_000, vocab=64, seed=0):
    """Token files with structure to learn: each token mostly predicts the next."""
    rng = np.random.default_rng(seed)
    successor = rng.permutation(vocab)
    data = np.empty(tokens, dtype=np.uint16)
    data[0] = 0
    noise = rng.random(tokens) < 0.1
    random_tokens = rng.integers(0, vocab, tokens)
    for i in range(1, tokens):
        data[i] = random_tokens[i] if noise[i] else successor[data[i - 1]]
    split = tokens * 9 // 10
    data[:split].tofile(os.path.join(folder, "train.bin"))
    data[split:].tofile(os.path.join(folder, "val.bin"))
    return folder


class TinyGPT(nn.Module):
    """One causal self-attention block: enough to show the loop, small enough for a CPU."""

    def __init__(self, vocab, block_size, dim=64, heads=4):
        super().__init__()
        self.tokens = nn.Embedding(vocab, dim)
        self.positions = nn.Embedding(block_size, dim)
        self.block = nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0,
                                                batch_first=True, norm_first=True)
        self.head = nn.Linear(dim, vocab)

    def forward(self, idx):
        t = idx.shape[1]
        h = self.tokens(idx) + self.positions(torch.arange(t))
        mask = nn.Transformer.generate_square_subsequent_mask(t)
        return self.head(self.block(h, src_mask=mask, is_causal=True))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", help="folder with train.bin and val.bin (default: generate)")
    parser.add_argument("--block-size", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-iters", type=int, default=200)
    parser.add_argument("--eval-iters", type=int, default=10)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as scratch:
        folder = args.data or make_tokens(scratch)
        train = TokenDataset(os.path.join(folder, "train.bin"), args.block_size, stride=1)
        val = TokenDataset(os.path.join(folder, "val.bin"), args.block_size, stride=1)
        vocab = int(np.fromfile(os.path.join(folder, "train.bin"), dtype=np.uint16).max()) + 1

        # nanoGPT's draws: max_iters batches of offsets, with replacement
        generator = torch.Generator().manual_seed(1337)
        sampler = RandomSampler(train, replacement=True,
                                num_samples=args.batch_size * args.max_iters, generator=generator)
        loader = DataLoader(train, batch_size=args.batch_size, sampler=sampler,
                            num_workers=args.workers)
        val_sampler = RandomSampler(val, replacement=True,
                                    num_samples=args.batch_size * args.eval_iters,
                                    generator=torch.Generator().manual_seed(0))
        val_loader = DataLoader(val, batch_size=args.batch_size, sampler=val_sampler)

        torch.manual_seed(1337)
        model = TinyGPT(vocab, args.block_size)
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
        for step, (x, y) in enumerate(loader):          # (B, block) int64 each; y is x shifted
            logits = model(x)
            loss = nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if step % 50 == 0 or step == args.max_iters - 1:
                print(f"step {step}: train loss {loss.item():.3f}")
        with torch.no_grad():
            losses = [nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten()).item()
                      for x, y in val_loader]
        print(f"val loss {np.mean(losses):.3f} (uniform guessing: {np.log(vocab):.3f})")


if __name__ == "__main__":
    main()
