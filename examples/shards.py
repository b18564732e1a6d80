"""Write an image folder as WebDataset shards, then train from the shards.

    python examples/shards.py --data /path/to/imagenet/train --out /path/to/shards
    python examples/shards.py                             # small generated folder and shards

fastload.shards_from_image_folder stores each file's bytes as they are (with the class
index as `cls`), in tar shards that the webdataset package reads unchanged.
fastload.WebDataset reads them back as a map-style dataset of (image, label), decoding in C,
and fastload.ShardSampler gives WebDataset's streaming order: shards shuffled per epoch, each
read in sequence through a shuffle buffer, split between ranks.
"""

import argparse
import glob
import os
import tempfile

import numpy as np
import torch
from torch import nn

import fastload
from fastload import transforms as T


def make_folder(root, classes=4, per_class=16, seed=0):
    """A small folder of JPEGs, one subfolder per class (needs Pillow)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    for k in range(classes):
        os.makedirs(os.path.join(root, f"class_{k}"), exist_ok=True)
        for i in range(per_class):
            image = rng.normal(60 * k, 30, (72, 96, 3)).clip(0, 255).astype(np.uint8)
            Image.fromarray(image).save(os.path.join(root, f"class_{k}", f"{i:04d}.jpg"))
    return root


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", help="an image folder (default: generate one)")
    parser.add_argument("--out", help="where the shards go (default: a temporary folder)")
    parser.add_argument("--maxcount", type=int, default=16, help="samples a shard")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as scratch:
        folder = args.data or make_folder(os.path.join(scratch, "images"))
        out = args.out or os.path.join(scratch, "shards")
        os.makedirs(out, exist_ok=True)           # write_shards does not make folders
        # A class-sorted folder is written shuffled: shard readers shuffle only in a buffer.
        paths = fastload.shards_from_image_folder(folder, os.path.join(out, "train-%06d.tar"),
                                                  shuffle=True, seed=0, maxcount=args.maxcount)
        print(f"wrote {len(paths)} shards: {os.path.basename(paths[0])} ...")

        train = fastload.WebDataset(sorted(glob.glob(os.path.join(out, "train-*.tar"))),
                                    transform=T.Compose([
                                        T.RandomResizedCrop(args.image_size),
                                        T.RandomHorizontalFlip(), T.ToTensor()]))
        sampler = fastload.ShardSampler(train, seed=0, buffer_size=100)
        loader = fastload.DataLoader(train, batch_size=args.batch_size, sampler=sampler,
                                     num_workers=args.workers)

        torch.manual_seed(0)
        classes = int(np.max(train.targets)) + 1     # the cls members, read when indexed
        model = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                              nn.Flatten(), nn.Linear(8, classes))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for epoch in range(args.epochs):
            sampler.set_epoch(epoch)                  # a new shard order each epoch
            seen = 0
            for images, labels in loader:
                loss = nn.functional.cross_entropy(model(images), labels)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                seen += len(labels)
            print(f"epoch {epoch}: {seen} samples, last loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
