"""fastload's datasets: the base classes with torch's names, and the
datasets whose samples are read and decoded in C (images, arrays, tokens,
WebDataset shards, the formats), with the sample cache they share."""

from .base import Dataset, IterableDataset, is_iterable_dataset  # noqa: F401
