"""Dataset base classes, with torch's names and protocol.

torch's own ``torch.utils.data.Dataset`` and ``IterableDataset`` (and any
object with ``__getitem__``/``__len__``, or ``__iter__``) work with
fastload.DataLoader as they are; these classes exist so code runs without
torch installed.
"""

from typing import Generic, TypeVar

from .._torch import torch

T_co = TypeVar("T_co", covariant=True)


class Dataset(Generic[T_co]):
    """A map-style dataset: ``__getitem__(index)`` and usually ``__len__``.

    Generic in the sample type, as torch's: ``class Images(Dataset[Tensor])``.

    Optionally ``__getitems__(indices)`` returns a whole batch of samples in
    one call (the loader then makes one call per batch instead of one per
    sample).
    """

    def __getitem__(self, index):
        raise NotImplementedError("Subclasses of Dataset should implement __getitem__.")


class IterableDataset(Dataset[T_co]):
    """A stream of samples: ``__iter__``.  With worker threads each worker
    calls ``iter(dataset)`` on its own thread, where ``get_worker_info()``
    tells it which shard to produce."""

    def __iter__(self):
        raise NotImplementedError("Subclasses of IterableDataset should implement __iter__.")


def is_iterable_dataset(dataset):
    """True for fastload's and torch's IterableDataset."""
    if isinstance(dataset, IterableDataset):
        return True
    return torch is not None and isinstance(dataset, torch.utils.data.IterableDataset)
