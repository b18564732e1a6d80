"""Train an image classifier on an ImageNet-style folder with fastload.

    python examples/imagenet_train.py --data /path/to/imagenet     # root/train, root/val
    python examples/imagenet_train.py                              # small generated folder

The folder is read as torchvision's ImageFolder reads it (one subfolder per class); the
JPEGs are decoded, cropped, flipped and normalised in C by fastload's worker threads.  The
loop is the usual one: only the import of DataLoader and ImageFolder changed.
"""

import argparse
import os
import tempfile

import numpy as np
import torch
from torch import nn

import fastload
from fastload import DataLoader, ImageFolder, transforms as T

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def make_folder(root, classes=4, per_class=16, seed=0):
    """A small ImageNet-like folder: root/{train,val}/class_k/*.jpg (needs Pillow)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    for split, count in (("train", per_class), ("val", per_class // 4)):
        for k in range(classes):
            folder = os.path.join(root, split, f"class_{k}")
            os.makedirs(folder, exist_ok=True)
            for i in range(count):
                h, w = rng.integers(96, 160, size=2)
                # class k: a colour gradient in its own direction, plus noise
                y, x = np.mgrid[0:h, 0:w]
                base = (np.sin((x * np.cos(k) + y * np.sin(k)) / 9.0) + 1) * 100
                image = np.stack([base, base[::-1] * 0.8, np.full_like(base, 40 * k)], axis=-1)
                image += rng.normal(0, 12, image.shape)
                Image.fromarray(image.clip(0, 255).astype(np.uint8)).save(
                    os.path.join(folder, f"{i:04d}.jpg"), quality=90)
    return root


def small_cnn(classes):
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, classes))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", help="folder with train/ and val/ (default: generate one)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--workers", default="auto", help='a number or "auto"')
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args(argv)
    workers = args.workers if args.workers == "auto" else int(args.workers)

    with tempfile.TemporaryDirectory() as scratch:
        root = args.data or make_folder(os.path.join(scratch, "imagenet"))
        size = args.image_size
        train = ImageFolder(os.path.join(root, "train"), transform=T.Compose([
            T.RandomResizedCrop(size), T.RandomHorizontalFlip(), T.ToTensor(),
            T.Normalize(MEAN, STD)]))
        val = ImageFolder(os.path.join(root, "val"), transform=T.Compose([
            T.Resize(size * 8 // 7), T.CenterCrop(size), T.ToTensor(), T.Normalize(MEAN, STD)]))
        train_loader = DataLoader(train, batch_size=args.batch_size, shuffle=True,
                                  num_workers=workers, drop_last=True,
                                  generator=torch.Generator().manual_seed(0))
        val_loader = DataLoader(val, batch_size=args.batch_size, num_workers=2)

        torch.manual_seed(0)
        model = small_cnn(len(train.classes))
        optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
        loss_fn = nn.CrossEntropyLoss()
        for epoch in range(args.epochs):
            model.train()
            losses = []
            for images, labels in train_loader:          # (N, 3, size, size) float32, (N,) int64
                loss = loss_fn(model(images), labels)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                losses.append(loss.item())
            model.eval()
            correct = total = 0
            with torch.no_grad():
                for images, labels in val_loader:
                    correct += (model(images).argmax(1) == labels).sum().item()
                    total += len(labels)
            print(f"epoch {epoch}: train loss {np.mean(losses):.3f}, "
                  f"val accuracy {correct / max(total, 1):.2f} ({total} images)")
        print(train_loader.stats())


if __name__ == "__main__":
    main()
