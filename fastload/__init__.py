"""fastload: torch's DataLoader interface, a C engine underneath.

Change ``from torch.utils.data import DataLoader`` to
``from fastload import DataLoader``: native datasets are read by C worker
threads with the GIL released; Python datasets run in worker processes, as
torch's do, and hand batches over through shared buffers without a copy.
"""

from . import profiler, transforms
from .arrays import ArrayDataset, TokenDataset
from .formats import ArrowDataset, ArrowImages, HDF5Dataset, LMDBDataset, ZarrDataset
from .images import DecodeError, ImageFiles, ImageFolder
from ._worker import WorkerInfo, get_worker_info
from .collate import default_collate, default_convert
from .dataloader import DataLoader
from .shard_reader import ShardSampler, WebDataset
from .datasets import Dataset, IterableDataset
from .sampler import (
    BatchSampler,
    DistributedSampler,
    RandomSampler,
    Sampler,
    SequentialSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
)
from .shards import shards_from_image_folder, write_shards
from .stats import LoaderStats
from .chunk_sampler import ChunkShuffleSampler

__version__ = "0.1.0"

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
    "RandomSampler",
    "Sampler",
    "SequentialSampler",
    "ShardSampler",
    "SubsetRandomSampler",
    "TokenDataset",
    "WebDataset",
    "WeightedRandomSampler",
    "WorkerInfo",
    "ZarrDataset",
    "default_collate",
    "default_convert",
    "get_worker_info",
    "shards_from_image_folder",
    "write_shards",
]
