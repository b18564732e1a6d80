"""Shards in object storage: ``s3://``, ``gs://``, ``az://``, ``http(s)://``.

``WebDataset`` takes URLs as it takes paths.  This package turns them into
local files: ``urls`` says which names are remote and expands prefixes and
globs; ``store`` reads objects through obstore (the Rust object_store, off
the GIL) with parallel range reads and bounded retries; ``shard_cache`` is
the node-local directory the shards are downloaded into, shared by every
worker, rank and job on the node; ``shards`` is what a dataset holds: each
shard's cache path, its sample count, the pins that keep the shards in use
from eviction, and the prefetch of the next shards in the sampler's order.

obstore is an optional dependency: ``pip install fastload-torch[remote]``.
"""

from .urls import is_remote, resolve  # noqa: F401
