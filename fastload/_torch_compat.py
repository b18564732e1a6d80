"""Where fastload meets torch's own data-loading helpers."""

import threading

from ._torch import torch
from ._worker import get_worker_info

_route_lock = threading.Lock()
_routed = False


def torch_default_collate():
    return torch.utils.data.default_collate if torch is not None else None


def torch_default_convert():
    return torch.utils.data.default_convert if torch is not None else None


def route_torch_worker_info():
    """Makes ``torch.utils.data.get_worker_info()`` answer inside fastload's
    worker threads.

    Datasets written for torch shard themselves with torch's function, which
    reads a per-process global that threads cannot use.  The replacement
    returns fastload's thread-local info on a fastload worker thread and
    defers to torch's own function everywhere else, so torch's DataLoader is
    unaffected.  Done once, the first time a loader starts workers.
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
            info = get_worker_info()
            return info if info is not None else torch_get()

        get_worker_info_routed.__doc__ = torch_get.__doc__
        get_worker_info_routed.__wrapped__ = torch_get
        tud.get_worker_info = get_worker_info_routed
        torch_worker.get_worker_info = get_worker_info_routed
        _routed = True
