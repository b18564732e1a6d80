"""fastload: torch's DataLoader interface, a C engine underneath.

Change ``from torch.utils.data import DataLoader`` to
``from fastload import DataLoader``: native datasets are read by C worker
threads with the GIL released; Python datasets run in worker processes, as
torch's do, and hand batches over through shared buffers without a copy.
"""

import sys as _sys

from . import transforms
from .datasets.arrays import ArrayDataset, TokenDataset
from .datasets.formats import ArrowDataset, ArrowImages, HDF5Dataset, LMDBDataset, ZarrDataset
from .datasets.images import DecodeError, ImageFiles, ImageFolder
from .loader.worker import WorkerInfo, get_worker_info
from .loader.collate import default_collate, default_convert
from .loader.dataloader import DataLoader
from .datasets.webdataset import ShardSampler, WebDataset
from .datasets.tfrecord import TFRecordDataset
from .datasets.tfrecord_index import write_tfrecord_index
from .datasets.base import Dataset, IterableDataset
from .datasets.mix import MixDataset, MixSampler
from .loader.sampler import (
    BatchSampler,
    DistributedSampler,
    RandomSampler,
    Sampler,
    SequentialSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
)
from .datasets.shard_writer import shards_from_image_folder, write_shards
from .datasets.restart_markers import add_restart_markers
from .observe.stats import LoaderStats
from .loader.chunk_sampler import ChunkShuffleSampler

from .observe import profiler, stats

__version__ = "0.1.0"

# The module paths of earlier releases, now stage folders' modules: the same
# module objects, so ``import fastload.images`` and pickles naming the old
# paths keep working.  (``fastload.tune`` is a module of its own: it runs
# with ``python -m``.)
from . import datasets as _datasets, loader as _loader  # noqa: E402

for _old, _new in {
    "arrays": _datasets.arrays,
    "cache": _datasets.cache,
    "chunk_sampler": _loader.chunk_sampler,
    "collate": _loader.collate,
    "dataloader": _loader.dataloader,
    "formats": _datasets.formats,
    "images": _datasets.images,
    "profiler": profiler,
    "sampler": _loader.sampler,
    "shard_reader": _datasets.webdataset,
    "shards": _datasets.shard_writer,
    "stats": stats,
}.items():
    _sys.modules[f"{__name__}.{_old}"] = _new
    globals()[_old] = _new
del _old, _new

__all__ = [
    "ArrayDataset",
    "ArrowDataset",
    "ArrowImages",
    "BatchSampler",
    "ChunkShuffleSampler",
    "DataLoader",
    "DecodeError",
    "Dataset",
    "DistributedSampler",
    "HDF5Dataset",
    "ImageFiles",
    "ImageFolder",
    "IterableDataset",
    "LMDBDataset",
    "LoaderStats",
    "MixDataset",
    "MixSampler",
    "RandomSampler",
    "Sampler",
    "SequentialSampler",
    "ShardSampler",
    "SubsetRandomSampler",
    "TFRecordDataset",
    "TokenDataset",
    "WebDataset",
    "WeightedRandomSampler",
    "WorkerInfo",
    "add_restart_markers",
    "ZarrDataset",
    "default_collate",
    "default_convert",
    "get_worker_info",
    "shards_from_image_folder",
    "write_shards",
    "write_tfrecord_index",
]
