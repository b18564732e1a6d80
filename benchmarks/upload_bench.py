"""Batches delivered to a GPU: fastload's DataLoader(device="cuda") against
torch's DataLoader with pin_memory=True and .to("cuda", non_blocking=True),
side by side.

    python benchmarks/upload_bench.py            # 1 GiB of rows, 200 training steps
    python benchmarks/upload_bench.py --quick    # 128 MiB, 20 steps: a smoke run

Two workloads, random batches of 256 from .npy files in a warm page cache:

* (a) host to device throughput: 64 KiB float32 rows (16 MiB batches).  The
  loop only checks each batch on the GPU (an exact float64 row sum), so an
  epoch measures how fast a loader gets bytes into device memory.  The
  ceiling is the pinned host-to-device bandwidth of this machine, measured
  in the same run (torch copying a large pinned tensor, timed with CUDA
  events).
* (b) a training loop: a small ResNet (conv + BN + ReLU blocks with
  residuals) trained with SGD on 3x112x112 uint8 images.  What matters is
  whether the loader keeps the GPU fed: the GPU busy fraction is the time
  the training steps take on the GPU (CUDA events around each step on the
  compute stream) over the wall time of the loop.  Waiting for a batch, or
  for a copy on the compute stream, counts as idle.

Each runs through

* torch: the fastest torch setup a careful user would pick for arrays: the
  batch sampler as the sampler (``batch_size=None``), one vectorised
  ``__getitem__`` per batch (what ``TensorDataset`` gives, without a call
  per sample), ``pin_memory=True``, persistent workers, and
  ``.to("cuda", non_blocking=True)`` in the loop;
* fastload: ``ArrayDataset`` with ``device="cuda"``, the same workers;

interleaved in this one process (torch, fastload, torch, ... for each
repetition; only ratios of medians are meaningful on a shared machine).
Every batch is checked against the indices the sampler drew.

Prints a Markdown report on stdout; progress goes to stderr.  Without a CUDA
GPU, or with a torch built without CUDA, it prints one line and exits 0.
"""

import argparse
import gc
import math
import os
import statistics
import sys
import time
import warnings

try:
    import fastload
except ImportError:  # run from a checkout built in place
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import fastload

import numpy as np

from array_workloads import CHUNK, row_value, torch
from workloads import cpu_model

BATCH = 256
SEED = 1234
ROW_VALUES = 16384            # 64 KiB of float32 a row
IMAGE_SHAPE = (3, 112, 112)   # uint8, 37 KiB an image
CLASSES = 10
FULL = dict(rows=(1 << 30) // (ROW_VALUES * 4), images=8192, steps=200, reps=5,
            bandwidth_bytes=256 << 20)
QUICK = dict(rows=(128 << 20) // (ROW_VALUES * 4), images=1024, steps=20, reps=2,
             bandwidth_bytes=64 << 20)
SKIP_LINE = "skipped: needs a CUDA GPU and torch with CUDA"
DEVICE = "cuda:0"  # fastload's device="cuda" is device 0 too

TORCH_NAME = "torch pin_memory + .to(non_blocking)"
FASTLOAD_NAME = 'fastload device="cuda"'


def log(msg):
    sys.stderr.write(f"\r\033[2K{msg}" if sys.stderr.isatty() else f"{msg}\n")
    sys.stderr.flush()


def why_no_gpu():
    """None when both loaders can deliver to a CUDA device, else why not."""
    if torch is None:
        return "torch is not installed"
    if not fastload.cuda.is_available():
        return f"fastload: {fastload.cuda._status()['error']}"
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} cannot use a CUDA device"
    return None


# ------------------------------------------------------------------ data


def make_npy(path, shape, dtype, rows_of):
    """A .npy file of `shape` whose rows [a, b) are rows_of(a, b), unless it
    already exists with that shape and dtype (generated data is reused)."""
    if os.path.exists(path):
        existing = np.load(path, mmap_mode="r")
        if existing.shape == shape and existing.dtype == dtype:
            return path
    tmp = f"{path}.partial"
    out = np.lib.format.open_memmap(tmp, mode="w+", dtype=dtype, shape=shape)
    step = max(1, CHUNK // (out[0].nbytes or 1))
    for start in range(0, shape[0], step):
        stop = min(shape[0], start + step)
        out[start:stop] = rows_of(start, stop)
    out.flush()
    del out
    os.replace(tmp, path)
    return path


def per_row(path, reduce):
    """reduce(rows) over the .npy at `path`, read in chunks; reading the
    whole file also warms the page cache for the runs."""
    a = np.load(path, mmap_mode="r")
    step = max(1, CHUNK // (a[0].nbytes or 1))
    return np.concatenate([reduce(np.asarray(a[s:s + step])) for s in range(0, len(a), step)])


def prepare_data(directory, sizes):
    """The files, and what each row must sum to: the checks compare every
    delivered batch with these, so they need no loader."""
    os.makedirs(directory, exist_ok=True)
    log("writing the data files (once)")
    cols = np.arange(ROW_VALUES)[None, :]
    rows = make_npy(os.path.join(directory, f"upload-rows-{sizes['rows']}x{ROW_VALUES}.npy"),
                    (sizes["rows"], ROW_VALUES), np.float32,
                    lambda a, b: row_value(np.arange(a, b)[:, None], cols))
    n = sizes["images"]
    images = make_npy(os.path.join(directory, f"upload-images-{n}.npy"), (n, *IMAGE_SHAPE),
                      np.uint8, lambda a, b: np.random.default_rng([SEED, a]).integers(
                          0, 256, (b - a, *IMAGE_SHAPE), dtype=np.uint8))
    labels = make_npy(os.path.join(directory, f"upload-labels-{n}.npy"), (n,), np.int64,
                      lambda a, b: (np.arange(a, b) * 7 + 3) % CLASSES)
    log("warming the page cache")
    # Integer values: float64 sums are exact in any order, on the GPU too.
    row_sums = per_row(rows, lambda r: r.sum(axis=1, dtype=np.float64))
    image_sums = per_row(images, lambda r: r.reshape(len(r), -1).sum(axis=1, dtype=np.int64))
    return dict(rows=rows, images=images, labels=labels, row_sums=row_sums,
                image_sums=image_sums, label_values=np.load(labels))


class TorchBatches:
    """torch's side: the TensorDataset equivalent without a call per sample.
    The sampler hands over a batch of indices and one fancy-indexing gather
    per array makes the batch; the .npy files are memory-mapped lazily, in
    each worker process, so nothing large is pickled or copied at start."""

    def __init__(self, *paths):
        self.paths = paths
        self.arrays = None
        self.n = len(np.load(paths[0], mmap_mode="r"))

    def __len__(self):
        return self.n

    def __getitem__(self, indices):
        if self.arrays is None:
            self.arrays = [np.load(p, mmap_mode="r") for p in self.paths]
        indices = np.asarray(indices)
        return tuple(torch.from_numpy(a[indices]) for a in self.arrays)

    def __getstate__(self):
        return {"paths": self.paths, "arrays": None, "n": self.n}


class Feed:
    """One loader configuration delivering CUDA batches, with its sampler's
    generator kept so that every epoch draws the same indices (`plan`)."""

    def __init__(self, family, workers, paths, samples):
        tud = torch.utils.data
        self.generator = torch.Generator()
        kwargs = dict(num_workers=workers, persistent_workers=workers > 0)
        if family == "fastload":
            ds = fastload.ArrayDataset(*paths)
            sampler = fastload.RandomSampler(ds, num_samples=samples, generator=self.generator)
            self.loader = fastload.DataLoader(ds, batch_size=BATCH, sampler=sampler,
                                              device="cuda", **kwargs)
        else:
            ds = TorchBatches(*paths)
            sampler = tud.RandomSampler(ds, num_samples=samples, generator=self.generator)
            self.loader = tud.DataLoader(ds, batch_size=None,
                                         sampler=tud.BatchSampler(sampler, BATCH, False),
                                         pin_memory=True, **kwargs)
        self.copies = family == "torch"
        self.batches_per_epoch = math.ceil(samples / BATCH)
        self.plan = np.asarray(list(tud.RandomSampler(
            range(len(ds)), num_samples=samples, generator=torch.Generator().manual_seed(SEED))))

    def batches(self, limit=None):
        """Each batch's arrays on the GPU, readable on the current stream."""
        self.generator.manual_seed(SEED)
        for k, batch in enumerate(self.loader):
            if limit is not None and k >= limit:
                return
            if self.copies:
                batch = [t.to(DEVICE, non_blocking=True) for t in batch]
            yield batch


def check(name, got, expected):
    """Compares what the GPU computed from the batches with the source."""
    got = torch.cat(got).cpu().numpy()
    if got.shape != expected.shape or not np.array_equal(got, expected):
        raise AssertionError(f"{name}: a batch holds the wrong rows")


# --------------------------------------------------- (a) throughput


def pinned_h2d_bandwidth(nbytes, repeats=10):
    """This machine's host-to-device bandwidth from page-locked memory in
    bytes/s: the best of `repeats` copies of `nbytes`, timed on the GPU."""
    src = torch.ones(nbytes, dtype=torch.uint8).pin_memory()
    best = float("inf")
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst = src.to(DEVICE, non_blocking=True)
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3)
        del dst
    return nbytes / best


def deliver_epoch(name, feed, row_sums, limit=None):
    """One checked epoch (or its first `limit` batches); returns seconds,
    from asking for the first batch to the last one being on the GPU."""
    sums = []
    start = time.perf_counter()
    for (rows,) in feed.batches(limit):
        sums.append(rows.sum(dim=1, dtype=torch.float64))
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    n = len(sums) if limit is not None else feed.batches_per_epoch
    if len(sums) != n:
        raise AssertionError(f"{name}: {len(sums)} batches, expected {n}")
    check(name, sums, row_sums[feed.plan[:n * BATCH]])
    return elapsed


def warn_if_shm_is_small(workers, batch_bytes):
    """torch's workers hand batches over in /dev/shm; a container's default
    64 MiB is too small for 16 MiB batches and fails with a bus error."""
    try:
        st = os.statvfs("/dev/shm")
    except OSError:
        return
    needed = (2 * max(workers) + 2) * batch_bytes  # prefetch_factor 2, and a margin
    if st.f_bavail * st.f_frsize < needed:
        log(f"warning: /dev/shm has {st.f_bavail * st.f_frsize >> 20} MiB free; torch's "
            f"workers may need {needed >> 20} MiB (docker: --shm-size)")


def run_throughput(data, sizes, workers):
    n = sizes["rows"]
    warn_if_shm_is_small(workers, BATCH * ROW_VALUES * 4)
    feeds = {(family, w): Feed(family, w, [data["rows"]], n)
             for w in workers for family in ("torch", "fastload")}
    times = {key: [] for key in feeds}
    for rep in range(sizes["reps"]):
        for (family, w), feed in feeds.items():
            log(f"(a) throughput: {family} w{w} {rep + 1}/{sizes['reps']}")
            deliver_epoch(family, feed, data["row_sums"], limit=8)  # untimed: workers up
            times[family, w].append(deliver_epoch(family, feed, data["row_sums"]))
            gc.collect()
    # Where fastload's time went, for the report: its stage timers over every epoch.
    stats = {w: str(feeds["fastload", w].loader.stats()) for w in workers}
    del feeds
    gc.collect()
    epoch_bytes = n * ROW_VALUES * 4
    return {key: epoch_bytes / statistics.median(ts) for key, ts in times.items()}, stats


# ------------------------------------------------ (b) training loop


_Module = torch.nn.Module if torch is not None else object


class Block(_Module):
    """Two 3x3 conv + BN, ReLU between, plus the input (through a 1x1 conv
    + BN when the shape changes), then ReLU: ResNet's basic block."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        nn = torch.nn
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                          nn.BatchNorm2d(cout))

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + self.shortcut(x))


def small_resnet():
    nn = torch.nn
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, 2, 1, bias=False), nn.BatchNorm2d(32), nn.ReLU(inplace=True),
        Block(32, 32, 1), Block(32, 64, 2), Block(64, 128, 2), Block(128, 256, 2),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(256, CLASSES),
    ).to(DEVICE)


class Trainer:
    def __init__(self):
        self.model = small_resnet()
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)

    def step(self, images, labels):
        x = images.float().mul_(1 / 255)
        loss = torch.nn.functional.cross_entropy(self.model(x), labels)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        return loss


def train(name, feed, trainer, expected, steps):
    """`steps` training steps fed by `feed`.  The clock starts when the
    first batch is in hand (steady state: worker start-up is not counted)
    and stops when the last step is done on the GPU.  Returns (wall
    seconds, GPU seconds in the steps)."""
    events, seen = [], []
    batches = feed.batches()
    images, labels = next(batches)
    start = time.perf_counter()
    while True:
        # The check reads every value; outside the events, so it is not
        # counted as training work.
        seen.append(torch.stack([images.reshape(len(images), -1).sum(dim=1, dtype=torch.int64),
                                 labels], dim=1))
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        loss = trainer.step(images, labels)
        end.record()
        events.append((begin, end))
        del images, labels  # the loader may reuse the buffers once the GPU is done
        try:
            images, labels = next(batches)
        except StopIteration:
            break
    torch.cuda.synchronize()
    wall = time.perf_counter() - start
    if len(events) != steps:
        raise AssertionError(f"{name}: {len(events)} steps, expected {steps}")
    if not torch.isfinite(loss):
        raise AssertionError(f"{name}: the loss is {loss.item()}")
    check(name, seen, expected)
    return wall, sum(b.elapsed_time(e) for b, e in events) / 1e3


def run_training(data, sizes, workers):
    torch.backends.cudnn.benchmark = True
    samples = sizes["steps"] * BATCH
    paths = [data["images"], data["labels"]]
    feeds = {(family, w): Feed(family, w, paths, samples)
             for w in workers for family in ("torch", "fastload")}
    expected = {key: np.stack([data["image_sums"][feed.plan], data["label_values"][feed.plan]], 1)
                for key, feed in feeds.items()}
    trainer = Trainer()
    for (family, w), feed in feeds.items():  # workers up, cuDNN's algorithms chosen
        log(f"(b) training: warming up {family} w{w}")
        for images, labels in feed.batches(limit=4):
            trainer.step(images, labels)
    results = {key: [] for key in feeds}
    for rep in range(sizes["reps"]):
        for (family, w), feed in feeds.items():
            log(f"(b) training: {family} w{w} {rep + 1}/{sizes['reps']}")
            results[family, w].append(
                train(family, feed, trainer, expected[family, w], sizes["steps"]))
            gc.collect()
    del feeds
    gc.collect()
    out = {}
    for key, runs in results.items():
        wall = statistics.median(w for w, _ in runs)
        out[key] = dict(steps_s=sizes["steps"] / wall,
                        busy=statistics.median(g / w for w, g in runs))
    return out


# ---------------------------------------------------------------- report


def loader_name(family):
    return FASTLOAD_NAME if family == "fastload" else TORCH_NAME


def report(sizes, workers, bandwidths, throughput, training, stats):
    h2d = statistics.median(bandwidths)
    props = torch.cuda.get_device_properties(DEVICE)
    print('## Batches to the GPU: fastload device="cuda" vs torch pin_memory + non_blocking\n')
    print(f"GPU: {props.name} ({props.total_memory / 2**30:.0f} GiB); CPU: {cpu_model()}, "
          f"{os.cpu_count()} cores; torch {torch.__version__} (CUDA {torch.version.cuda}). "
          f"Batches of {BATCH}, random order, page cache warm; medians of {sizes['reps']} "
          "interleaved repetitions.")
    print(f"Pinned host-to-device bandwidth (same run; torch copying a "
          f"{sizes['bandwidth_bytes'] >> 20} MiB pinned tensor, best of 10, timed with CUDA "
          f"events): {h2d / 1e9:.2f} GB/s "
          f"(measurements {', '.join(f'{b / 1e9:.2f}' for b in bandwidths)}).\n")

    gib = sizes["rows"] * ROW_VALUES * 4 / 2**30
    print(f"### (a) Host to device: {ROW_VALUES * 4 >> 10} KiB float32 rows, "
          f"{BATCH * ROW_VALUES * 4 >> 20} MiB batches, {gib:.2f} GiB an epoch\n")
    print("GB/s: batch bytes on the GPU per second of the epoch (start-up included).\n")
    print("| loader | workers | GB/s to the GPU | of pinned H2D | vs torch (same workers) |")
    print("|---|---:|---:|---:|---:|")
    for w in workers:
        for family in ("torch", "fastload"):
            bw = throughput[family, w]
            print(f"| {loader_name(family)} | {w} | {bw / 1e9:.2f} | {bw / h2d:.0%} | "
                  f"{bw / throughput['torch', w]:.2f}x |")
    print()

    print(f"### (b) Training: a small ResNet, SGD, {sizes['steps']} steps on "
          f"{'x'.join(map(str, IMAGE_SHAPE))} uint8 images\n")
    print("GPU busy: GPU time of the training steps (CUDA events on the compute stream) over "
          "the wall time of the loop, from the first batch in hand to the last step done.\n")
    print("| loader | workers | steps/s | samples/s | GPU busy | vs torch (same workers) |")
    print("|---|---:|---:|---:|---:|---:|")
    for w in workers:
        for family in ("torch", "fastload"):
            r = training[family, w]
            print(f"| {loader_name(family)} | {w} | {r['steps_s']:.1f} | "
                  f"{r['steps_s'] * BATCH:,.0f} | {r['busy']:.0%} | "
                  f"{r['steps_s'] / training['torch', w]['steps_s']:.2f}x |")
    print()
    ratios = []
    for w in workers:
        a = throughput["fastload", w] / throughput["torch", w]
        b = training["fastload", w]["steps_s"] / training["torch", w]["steps_s"]
        ratios.append(f"{w} workers: throughput {a:.2f}x, training steps/s {b:.2f}x")
    print("fastload / torch: " + "; ".join(ratios))
    for w in workers:
        print(f"\n`loader.stats()` of fastload's (a) loader, {w} workers, every epoch:\n")
        print("```\n" + stats[w] + "\n```")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="small files, few steps and repetitions")
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 4],
                        help="num_workers values to compare (default: 2 4)")
    parser.add_argument("--data", default=os.environ.get("FASTLOAD_BENCH_DATA",
                                                         "/tmp/fastload-bench"),
                        help="where the data files are made (and kept)")
    args = parser.parse_args()
    why = why_no_gpu()
    if why is not None:
        print(f"{SKIP_LINE} ({why})")
        return
    # Neither is about the loaders: torch's advice on the worker count, and
    # Python's on fork() in a process with threads (torch's workers fork).
    warnings.filterwarnings("ignore", message=r"This DataLoader will create \d+ worker")
    warnings.filterwarnings("ignore", message=r"This process .* is multi-threaded")
    sizes = QUICK if args.quick else FULL
    data = prepare_data(args.data, sizes)
    bandwidths = [pinned_h2d_bandwidth(sizes["bandwidth_bytes"])]
    throughput, stats = run_throughput(data, sizes, args.workers)
    bandwidths.append(pinned_h2d_bandwidth(sizes["bandwidth_bytes"]))
    training = run_training(data, sizes, args.workers)
    log("done")
    report(sizes, args.workers, bandwidths, throughput, training, stats)


if __name__ == "__main__":
    main()
