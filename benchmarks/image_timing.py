"""The timed epoch every image benchmark runs: images per second over one
pass of a loader, checking each batch as it arrives, so a loader that
delivers wrong or half-made batches cannot win."""

import time

import torch

SHAPE = (3, 224, 224)


def images_per_second(loader, shape=SHAPE):
    """Images per second over one epoch of ``loader``.  Each batch must be
    ``(images, labels)`` with float32 images of ``shape`` per sample and
    finite values (reading them all, as training would); an int batch is a
    count of images already checked (images_bench's decode-only ceiling)."""
    start = time.perf_counter()
    n = 0
    for batch in loader:
        if isinstance(batch, int):
            n += batch
            continue
        images, labels = batch
        if tuple(images.shape[1:]) != tuple(shape) or images.dtype != torch.float32:
            raise AssertionError(f"batch {tuple(images.shape)} {images.dtype}")
        if not torch.isfinite(images.sum()):
            raise AssertionError("non-finite values in a batch")
        n += len(labels)
    return n / (time.perf_counter() - start)
