"""ResNet-50 training fed by torch's DataLoader and by fastload, side by side:
images per second and how much of the time the GPU is busy.

    python benchmarks/train_bench.py                        # ResNet-50, batch 256, every core
    python benchmarks/train_bench.py --quick --device cpu   # a smoke run of the loop on the CPU

The data is a folder of generated photo-like JPEGs with ImageNet's spread of
sizes, qualities and chroma subsampling (benchmarks/imagenet_like.py), read
in random order with replacement, through the training transform of
torchvision's ImageNet recipe written with ``torchvision.transforms``:
RandomResizedCrop(224), RandomHorizontalFlip, ToTensor, Normalize.

The loop: torchvision's ResNet-50, channels_last, bf16 autocast, SGD with
momentum, one optimiser step a batch.  The loaders, each with the same
``num_workers`` (default: one per core) and persistent workers:

* torch: ``torchvision.datasets.ImageFolder`` and torch's DataLoader with
  ``pin_memory=True``; the loop moves each batch with
  ``.to("cuda", non_blocking=True)``;
* fastload: the same script with the import changed (``fastload.ImageFolder``
  given the same torchvision transform, ``fastload.DataLoader``) and
  ``device="cuda"``: batches arrive on the GPU;
* fastload uint8: ``fastload.transforms`` with ``channels_last=True`` and
  ``normalize_on_device=True``: uint8 images are uploaded (a quarter of the
  bytes) and converted and normalised on the GPU;
* ceiling: the same steps on one batch already on the GPU, the model's own
  rate on this card.

GPU busy is the GPU time of the training steps (CUDA events around each
step on the compute stream) over the GPU time from the first timed step's
start to the last one's end.  A step waiting for its batch, or for a copy
on the compute stream, counts as idle.  The first batches of each run
(one per worker, and a few more) are not timed: the workers' start and the
batches they made meanwhile would flatter a loader that cannot keep up.

Prints a Markdown report on stdout; progress goes to stderr.  Without a
CUDA GPU (and without ``--device cpu``) it prints one line and exits 0.
"""

import argparse
import gc
import os
import statistics
import sys
import time
import warnings

# This checkout's fastload, even where another one is installed.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import fastload  # noqa: E402

import numpy as np
import torch

import imagenet_like
import pil_pipeline
from fastload import transforms as T
from upload_bench import SKIP_LINE, why_no_gpu
from workloads import cpu_model

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
CLASSES = 1000
FULL = dict(images=4096, folders=100, batch=256, warm=4, steps=48, reps=2, model="resnet50")
QUICK = dict(images=96, folders=4, batch=16, warm=1, steps=3, reps=1, model="resnet18")
LOADERS = ("torch", "fastload", "fastload uint8")


def log(msg):
    sys.stderr.write(f"\r\033[2K{msg}" if sys.stderr.isatty() else f"{msg}\n")
    sys.stderr.flush()


# ---------------------------------------------------------------- loaders


def make_loader(name, root, workers, samples, batch, device):
    """The loader `name` over `root`: `samples` random images an epoch."""
    kwargs = dict(batch_size=batch, num_workers=workers, persistent_workers=workers > 0,
                  drop_last=True)
    on_gpu = device.type == "cuda"
    if name == "torch":
        ds = pil_pipeline.image_folder(root, pil_pipeline.train_transform(use_torchvision=True),
                                       use_torchvision=True)
        sampler = torch.utils.data.RandomSampler(ds, replacement=True, num_samples=samples)
        return torch.utils.data.DataLoader(ds, sampler=sampler, pin_memory=on_gpu, **kwargs)
    if name == "fastload":
        ds = fastload.ImageFolder(root,
                                  transform=pil_pipeline.train_transform(use_torchvision=True))
        extra = dict(device="cuda") if on_gpu else {}
    else:
        ds = fastload.ImageFolder(root, transform=T.Compose(
            [T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(),
             T.Normalize(MEAN, STD)], channels_last=True))
        extra = dict(device="cuda", normalize_on_device=True) if on_gpu else {}
    sampler = fastload.RandomSampler(ds, replacement=True, num_samples=samples)
    return fastload.DataLoader(ds, sampler=sampler, **kwargs, **extra)


# ------------------------------------------------------------------- loop


class Clock:
    """Marks on the compute stream (CUDA events), or host time on the CPU."""

    def __init__(self, device):
        self.cuda = device.type == "cuda"

    def mark(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def seconds(self, a, b):
        return a.elapsed_time(b) / 1e3 if self.cuda else b - a

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()


class Trainer:
    def __init__(self, model_name, device):
        import torchvision

        self.device = device
        model = getattr(torchvision.models, model_name)(num_classes=CLASSES)
        self.model = model.to(device, memory_format=torch.channels_last)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1, momentum=0.9,
                                         weight_decay=1e-4)
        self.clock = Clock(device)

    def step(self, images, labels):
        x = images.contiguous(memory_format=torch.channels_last)
        # bf16 on the GPU, the measured setting.  The CPU runs only the smoke
        # test, in float32: CPU bf16 kernels without AMX are ~10x slower.
        with torch.autocast(self.device.type, dtype=torch.bfloat16,
                            enabled=self.device.type == "cuda"):
            loss = torch.nn.functional.cross_entropy(self.model(x), labels)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        return loss

    def run(self, batches, warm, steps, batch):
        """`warm` untimed steps, then `steps` timed ones, each on the next of
        `batches`.  Returns (images a second, GPU busy fraction)."""
        spans = []
        it = iter(batches)
        for k in range(warm + steps):
            images, labels = next(it)
            if images.shape != (batch, 3, 224, 224) or images.dtype != torch.float32 \
                    or images.device != self.device or labels.device != self.device:
                raise AssertionError(f"batch {k}: {tuple(images.shape)} {images.dtype} "
                                     f"on {images.device}, labels on {labels.device}")
            if k == warm:
                self.clock.sync()
                host_start = time.perf_counter()
            begin = self.clock.mark()
            loss = self.step(images, labels)
            end = self.clock.mark()
            if k >= warm:
                spans.append((begin, end))
            del images, labels  # the loader may reuse the buffers once the GPU is done
        self.clock.sync()
        wall = time.perf_counter() - host_start
        if not torch.isfinite(loss):
            raise AssertionError(f"the loss is {loss.item()}")
        busy = sum(self.clock.seconds(b, e) for b, e in spans)
        return steps * batch / wall, busy / self.clock.seconds(spans[0][0], spans[-1][1])


def uploaded(loader, device):
    """torch's loop body: each pinned batch moved with a non-blocking copy
    (on the compute stream, so the step after it waits for the copy)."""
    for images, labels in loader:
        yield (images.to(device, non_blocking=True), labels.to(device, non_blocking=True))


def repeat_batch(device, batch):
    images = torch.randn(batch, 3, 224, 224, device=device)
    labels = torch.randint(0, CLASSES, (batch,), device=device)
    while True:
        yield images, labels


# ------------------------------------------------------------------- main


def run(args, sizes):
    device = torch.device(args.device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())  # what batches report
    workers = args.workers if args.workers is not None else os.cpu_count()
    root = os.path.join(args.data, f"imagenet-like-{sizes['images']}-{sizes['folders']}")
    log(f"making {root} (once)")
    imagenet_like.make_image_folder(root, n_images=sizes["images"],
                                   n_classes=sizes["folders"])
    torch.backends.cudnn.benchmark = True
    trainer = Trainer(sizes["model"], device)
    batch, warm = sizes["batch"], sizes["warm"] + workers
    samples = (warm + sizes["steps"]) * batch
    loaders = {name: make_loader(name, root, workers, samples, batch, device)
               for name in LOADERS}
    log("warming up the model")
    trainer.run(repeat_batch(device, batch), 3, 2, batch)
    results = {name: [] for name in ("ceiling", *LOADERS)}
    for rep in range(sizes["reps"]):
        for name in results:
            log(f"{name} {rep + 1}/{sizes['reps']}")
            if name == "ceiling":
                feed = repeat_batch(device, batch)
            elif name == "torch" and device.type == "cuda":
                feed = uploaded(loaders[name], device)
            else:
                feed = loaders[name]
            results[name].append(trainer.run(feed, warm, sizes["steps"], batch))
            del feed
            gc.collect()
    log("done")
    return workers, {name: (statistics.median(r[0] for r in runs),
                            statistics.median(r[1] for r in runs))
                     for name, runs in results.items()}


def report(args, sizes, workers, results):
    device = torch.device(args.device)
    card = (torch.cuda.get_device_properties(device).name if device.type == "cuda"
            else "none (CPU smoke run)")
    print(f"## {sizes['model']} training: fastload vs torch DataLoader + torchvision\n")
    print(f"GPU: {card}; CPU: {cpu_model()}, {os.cpu_count()} cores; torch {torch.__version__}; "
          f"batch {sizes['batch']}, channels_last, bf16 autocast, SGD; "
          f"{sizes['images']} generated JPEGs drawn with replacement; num_workers={workers}; "
          f"{sizes['steps']} timed steps after {sizes['warm'] + workers} untimed; medians of "
          f"{sizes['reps']} interleaved runs.\n")
    ceiling = results["ceiling"][0]
    torch_rate = results["torch"][0]
    print("| feed | images/s | GPU busy | of the ceiling | vs torch |")
    print("|---|---:|---:|---:|---:|")
    for name, (rate, busy) in results.items():
        label = "ceiling (one batch on the GPU)" if name == "ceiling" else name
        print(f"| {label} | {rate:,.0f} | {busy:.1%} | {rate / ceiling:.0%} | "
              f"{rate / torch_rate:.2f}x |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a few small steps (a smoke run)")
    parser.add_argument("--device", default="cuda", help="cuda (default), or cpu for a smoke run")
    parser.add_argument("--workers", type=int, help="num_workers (default: one per core)")
    parser.add_argument("--steps", type=int, help="timed steps a run")
    parser.add_argument("--data", default=os.environ.get("FASTLOAD_BENCH_DATA",
                                                         "/tmp/fastload-bench"))
    args = parser.parse_args()
    if args.device != "cpu":
        why = why_no_gpu()
        if why is not None:
            print(f"{SKIP_LINE} ({why})")
            return
    if pil_pipeline.torchvision_or_none() is None:
        print("skipped: needs torchvision")
        return
    # Neither is about the loaders: torch's advice on the worker count, and
    # Python's on fork() in a process with threads (torch's workers fork).
    warnings.filterwarnings("ignore", message=r"This DataLoader will create \d+ worker")
    warnings.filterwarnings("ignore", message=r"This process .* is multi-threaded")
    sizes = dict(QUICK if args.quick else FULL)
    if args.steps is not None:
        sizes["steps"] = args.steps
    workers, results = run(args, sizes)
    report(args, sizes, workers, results)


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
