"""torch, when it is installed: fastload works without it (NumPy output)."""

try:
    import torch
except ImportError:  # pragma: no cover - exercised on machines without torch
    torch = None


def is_tensor(obj):
    return torch is not None and isinstance(obj, torch.Tensor)


def is_torch_generator(obj):
    return torch is not None and isinstance(obj, torch.Generator)
