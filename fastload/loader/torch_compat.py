"""Where fastload meets torch's own data-loading helpers."""

import copy
import threading

from .._random import draw_seed
from .._torch import torch

_route_lock = threading.Lock()
_routed = False


def torch_default_collate():
    return torch.utils.data.default_collate if torch is not None else None


def torch_default_convert():
    return torch.utils.data.default_convert if torch is not None else None


def route_torch_worker_info(fastload_worker_info):
    """Makes ``torch.utils.data.get_worker_info()`` answer inside fastload's
    worker threads.

    Datasets written for torch shard themselves with torch's function, which
    reads a per-process global that threads cannot use.  The replacement
    returns fastload's thread-local info on a fastload worker thread and
    defers to torch's own function everywhere else, so torch's DataLoader is
    unaffected.  ``fastload_worker_info`` is fastload's ``get_worker_info``.
    Done once, the first time a loader starts workers.
    """
    global _routed
    if torch is None:
        return
    with _route_lock:
        if _routed:
            return
        import torch.utils.data as tud
        import torch.utils.data._utils.worker as torch_worker

        torch_get = torch_worker.get_worker_info

        def get_worker_info_routed():
            info = fastload_worker_info()
            return info if info is not None else torch_get()

        get_worker_info_routed.__doc__ = torch_get.__doc__
        get_worker_info_routed.__wrapped__ = torch_get
        tud.get_worker_info = get_worker_info_routed
        torch_worker.get_worker_info = get_worker_info_routed
        _routed = True


# -- torch's DataPipes ---------------------------------------------------------
#
# torch's DataLoader drives an IterDataPipe graph itself, and so does
# fastload's, with torch's calls in torch's order (torch 2.13
# utils/data/dataloader.py and _utils/worker.py):
#
# * DataLoader(datapipe, shuffle=...) switches the graph's Shufflers on or off
#   (graph_settings.apply_shuffle_settings) and wraps the datapipe for
#   pickling (_IterDataPipeSerializationWrapper), which loader.dataset then is
#   (the wrapper holds the datapipe given: where apply_shuffle_settings
#   appends a Shuffler to a graph without one, torch's loader drops it);
# * each epoch draws a shared seed from the loader's generator (before the
#   base seed; on a persistent iterator's new epoch, after iter(sampler)) and
#   seeds every random datapipe from it (graph_settings.apply_random_seed),
#   in the main process and again in each worker before it iterates;
# * the sharding_filter datapipes are given their shard: the distributed rank
#   without workers, (worker id, rank) among num_workers * world_size with
#   them, before the user's worker_init_fn.
#
# torch walks a graph (graph_settings, traverse_dps) by pickling it with hooks
# set on the IterDataPipe and MapDataPipe classes, for the whole process: two
# threads walking or copying graphs at once would see each other's hooks (a
# RuntimeError, or a copy built from a hooked state).  Worker threads and the
# main thread therefore do every such walk and copy under _graph_lock.

_graph_lock = threading.RLock()


def datapipe_kind(dataset):
    """"iter" for torch's IterDataPipe, "map" for its MapDataPipe, else None."""
    if torch is None:
        return None
    from torch.utils.data import IterDataPipe, MapDataPipe

    if isinstance(dataset, IterDataPipe):
        return "iter"
    if isinstance(dataset, MapDataPipe):
        return "map"
    return None


def wrap_datapipe(dataset):
    """The dataset as torch's DataLoader keeps it: a datapipe in torch's
    serialization wrapper (pickled with dill when plain pickle fails)."""
    kind = datapipe_kind(dataset)
    if kind is None:
        return dataset
    from torch.utils.data.datapipes.datapipe import (
        _IterDataPipeSerializationWrapper,
        _MapDataPipeSerializationWrapper,
    )

    if kind == "iter":
        return _IterDataPipeSerializationWrapper(dataset)
    return _MapDataPipeSerializationWrapper(dataset)


def copy_datapipe(dataset):
    """A worker thread's own copy of a wrapped datapipe (None for any other
    dataset).  The wrapper deep-copies by pickling, which refuses lambdas in
    the graph; the datapipes themselves deep-copy as plain objects."""
    if datapipe_kind(dataset) is None or not hasattr(dataset, "_datapipe"):
        return None
    with _graph_lock:
        return wrap_datapipe(copy.deepcopy(dataset._datapipe))


def apply_datapipe_shuffle(datapipe, shuffle):
    """``DataLoader(datapipe, shuffle=...)``: the graph's Shufflers set on or
    off (shuffle=None leaves them as they are), in place.  A graph without
    a Shuffler gets torch's warning when shuffle is True (and a Shuffler
    appended to the datapipe returned, which torch's loader drops)."""
    from torch.utils.data.graph_settings import apply_shuffle_settings

    with _graph_lock:
        return apply_shuffle_settings(datapipe, shuffle=shuffle)


def distributed_settings():
    """(world_size, rank) of the default process group, (1, 0) without one."""
    if torch is None:
        return 1, 0
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


def datapipe_seed_group():
    """The process group an iterator shares its datapipe seed over (torch
    makes a gloo group per iterator), or None outside torch.distributed."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.new_group(backend="gloo")
    return None


def draw_datapipe_seed(generator, group):
    """An epoch's shared datapipe seed, drawn from the loader's generator as
    torch draws it, and rank 0's on every rank of ``group``."""
    seed = draw_seed(generator)
    if group is not None:
        shared = torch.tensor(seed, dtype=torch.int64)
        torch.distributed.broadcast(shared, src=0, group=group)
        seed = int(shared.item())
    return seed


def seed_datapipe(datapipe, seed):
    """Seeds every random datapipe of the graph from ``seed`` (torch's
    apply_random_seed with a generator seeded so).  A Shuffler uses its seed
    at the next ``iter()``: call this before each pass."""
    from torch.utils.data.graph_settings import apply_random_seed

    rng = torch.Generator()
    rng.manual_seed(seed)
    with _graph_lock:
        apply_random_seed(datapipe, rng)


def shard_datapipe(datapipe, num_workers, worker_id, world):
    """Gives the graph's sharding_filters their shard: instance
    ``worker_id * world_size + rank`` of ``num_workers * world_size``
    (num_workers=1, worker_id=0: the rank's shard, without workers).
    ``world`` is the loader process's ``distributed_settings()``: a worker
    process is no member of the process group."""
    from torch.utils.data.graph_settings import apply_sharding

    world_size, rank = world
    with _graph_lock:
        apply_sharding(datapipe, num_workers * world_size, worker_id * world_size + rank)
