"""``ArrowImages`` against the usual torch wrapper of an image column, side by side.

    python benchmarks/arrow_images_bench.py            # 2000 generated photos
    python benchmarks/arrow_images_bench.py --quick    # 128 photos, one repetition

The JPEGs of a generated ImageNet-like folder (benchmarks/imagenet_like.py)
are written, with their labels, as a binary column of an uncompressed Arrow
IPC file and of a Parquet file, and read with torchvision's training
transform (RandomResizedCrop(224) + RandomHorizontalFlip + ToTensor +
Normalize), shuffled, batch 64, 2 workers, by:

* torch: torch's DataLoader (2 worker processes, persistent) over the
  dataset a user writes: the table (IPC memory-mapped, or Parquet read)
  opened in each worker, the image's bytes decoded by Pillow, the
  torchvision transform applied;
* fastload: ``fastload.ArrowImages`` over the IPC file, and over the
  Parquet file (read into memory once), given the same torchvision
  ``Compose`` (it compiles to the C plan; the run stops if a step would run
  in Python), in fastload's DataLoader (2 worker threads).

Interleaved in this one process, whole epochs, the median of the
repetitions; only the ratios mean much on a shared machine.  Prints
Markdown.
"""

import argparse
import io
import os
import statistics
import sys

try:
    import fastload
except ImportError:  # run from a checkout built in place
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import fastload

import pyarrow as pa
import pyarrow.ipc  # noqa: F401
import pyarrow.parquet as pq
import torch
from PIL import Image

import imagenet_like
import pil_pipeline
from image_timing import images_per_second

BATCH = 64
WORKERS = 2
KINDS = ("arrow", "parquet")
FULL = dict(images=2000, reps=3)
QUICK = dict(images=128, reps=1)


def make_tables(root, n_images):
    """The folder's JPEGs as an IPC file and a Parquet file; their paths."""
    folder = imagenet_like.make_image_folder(os.path.join(root, f"photos_{n_images}"),
                                             n_images=n_images)
    paths = {kind: os.path.join(root, f"photos_{n_images}.{kind}") for kind in KINDS}
    if all(os.path.exists(p) for p in paths.values()):
        return paths
    samples = fastload.ImageFolder(folder).samples
    blobs = []
    for path, _ in samples:
        with open(path, "rb") as f:
            blobs.append(f.read())
    table = pa.table({"image": pa.array(blobs, pa.binary()),
                      "label": pa.array([label for _, label in samples], pa.int64())})
    with pa.ipc.new_file(paths["arrow"], table.schema) as writer:
        writer.write_table(table)
    pq.write_table(table, paths["parquet"], row_group_size=256)
    return paths


class TorchTableImages(torch.utils.data.Dataset):
    """The usual wrapper: the table opened in each worker, Pillow decoding."""

    def __init__(self, path, transform):
        self.path, self.transform, self.table = path, transform, None
        self.n = pq.read_metadata(path).num_rows if path.endswith(".parquet") else \
            self._open().num_rows

    def _open(self):
        if self.path.endswith(".parquet"):
            return pq.read_table(self.path)
        return pa.ipc.open_file(pa.memory_map(self.path, "r")).read_all()

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.table is None:
            self.table = self._open()
        image = Image.open(io.BytesIO(self.table.column("image")[i].as_py())).convert("RGB")
        return self.transform(image), self.table.column("label")[i].as_py()


def make_loaders(paths):
    transform = pil_pipeline.train_transform(use_torchvision=True)
    loaders = {}
    for kind, path in paths.items():
        loaders[f"torch, {kind}"] = torch.utils.data.DataLoader(
            TorchTableImages(path, transform), batch_size=BATCH, shuffle=True,
            num_workers=WORKERS, persistent_workers=True)
        dataset = fastload.ArrowImages(path, transform=transform)
        if dataset.transform_plan.python:
            raise SystemExit(f"arrow_images_bench.py: steps in Python: "
                             f"{dataset.transform_plan.python}")
        loaders[f"fastload, {kind}"] = fastload.DataLoader(
            dataset, batch_size=BATCH, shuffle=True, num_workers=WORKERS,
            persistent_workers=True)
    return loaders


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--data", default=os.path.join(os.path.dirname(__file__), "data"))
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    paths = make_tables(args.data, sizes["images"])
    loaders = make_loaders(paths)
    for loader in loaders.values():  # workers started, files in the page cache
        images_per_second(loader)
    rates = {name: [] for name in loaders}
    for _ in range(sizes["reps"]):
        for name, loader in loaders.items():  # interleaved: a slow moment hits all
            rates[name].append(images_per_second(loader))
    rate = {name: statistics.median(r) for name, r in rates.items()}
    print(f"### Image columns: {sizes['images']} JPEGs, torchvision's training transform, "
          f"batch {BATCH}, {WORKERS} workers, shuffled\n")
    print("| table | torch img/s | fastload img/s | fastload vs torch |")
    print("|---|---:|---:|---:|")
    for kind in KINDS:
        fl, ref = rate[f"fastload, {kind}"], rate[f"torch, {kind}"]
        print(f"| {kind} | {ref:.0f} | {fl:.0f} | **{fl / ref:.2f}x** |")


if __name__ == "__main__":
    main()
