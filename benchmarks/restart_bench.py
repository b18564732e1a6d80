"""Region decodes from restart intervals: the training pipeline on the same
photos as they are and rewritten with ``fastload.add_restart_markers``.

    python benchmarks/restart_bench.py --data DIR            # an image folder
    python benchmarks/restart_bench.py                       # 400 generated photos
    python benchmarks/restart_bench.py --intervals 1,2,4 --images 500 --runs 3

Copies of the folder are rewritten once per interval bound k (cached under
--work).  Then, in one process, interleaved:

  decode   per image, the pipeline's sample (RandomResizedCrop(224) + flip +
           ToTensor + Normalize, decode="fast": region decode at the DCT scale
           the box allows, then the resample) in the calling thread; each
           image's minimum over --rounds, summed over images
  control  the same files through ``jpegtran -optimize -copy none`` (when
           installed): sequential with optimised tables, no restart markers
  loader   DataLoader(ImageFolder(...), batch 64, shuffle, 2 workers) over the
           folder, one epoch per run after an untimed one; median images/s
  --cache  the loader on the files as they are with cache="memory", with and
           without cache_restart_markers=True (the untimed epoch fills it)

Prints Markdown on stdout: the bytes, the per-image cost and the loader's
rate of each variant, and their ratios to the files as they are.
"""

import argparse
import os
import pathlib
import statistics
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
import fastload  # noqa: E402
from fastload import transforms as T  # noqa: E402

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def log(text):
    print(text, file=sys.stderr, flush=True)


def train_transform():
    return T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(),
                      T.Normalize(MEAN, STD)])


def pick(root, n):
    """n files of the folder spread over its classes, as (relative path, class)."""
    ds = fastload.ImageFolder(root)
    step = max(1, len(ds.samples) // n)
    return [(os.path.relpath(p, root), c) for p, c in ds.samples[::step][:n]]


def rewrite(root, files, dest, k):
    """dest/<same layout>: the files rewritten with restart markers (bound k)."""
    done = dest / ".complete"
    if done.exists():
        return
    for rel, _ in files:
        out = dest / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        data = (pathlib.Path(root) / rel).read_bytes()
        try:
            data = fastload.add_restart_markers(data, max_interval=k)
        except fastload.DecodeError:
            pass
        out.write_bytes(data)
    done.write_text("")


def rewrite_plain(root, files, dest):
    """The control: the same rewrite without restart markers (jpegtran
    -optimize -copy none: sequential, optimised tables), to tell the
    markers' effect from the rest of the rewrite's."""
    import subprocess

    done = dest / ".complete"
    if done.exists():
        return
    for rel, _ in files:
        out = dest / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        data = (pathlib.Path(root) / rel).read_bytes()
        result = subprocess.run(["jpegtran", "-optimize", "-copy", "none"], input=data,
                                capture_output=True)
        out.write_bytes(result.stdout if result.returncode == 0 and result.stdout else data)
    done.write_text("")


def copy(root, files, dest):
    done = dest / ".complete"
    if done.exists():
        return
    for rel, _ in files:
        out = dest / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes((pathlib.Path(root) / rel).read_bytes())
    done.write_text("")


def decode_costs(folders, files, rounds):
    """{name: ms an image}: per-image minimum over rounds, in this thread."""
    sets = {name: fastload.ImageFiles([str(f / rel) for rel, _ in files],
                                      transform=train_transform())
            for name, f in folders.items()}
    best = {name: [float("inf")] * len(files) for name in folders}
    for r in range(rounds):
        for i in range(len(files)):
            for name, ds in sets.items():  # interleaved image by image
                t = time.perf_counter()
                ds._source.sample(i, r, 0)
                best[name][i] = min(best[name][i], time.perf_counter() - t)
    return {name: 1e3 * sum(b) / len(b) for name, b in best.items()}


def loader_rates(folders, runs, workers, batch, cached=()):
    """{name: median images/s}; ``cached``: (name, folder, restart markers)
    variants reading through a sample cache in memory."""
    import torch

    torch.set_num_threads(1)

    def loader(folder, **cache):
        return fastload.DataLoader(fastload.ImageFolder(str(folder), transform=train_transform(),
                                                        **cache),
                                   batch_size=batch, shuffle=True, num_workers=workers,
                                   persistent_workers=True)

    loaders = {name: loader(f) for name, f in folders.items()}
    for name, folder, restart in cached:
        loaders[name] = loader(folder, cache="memory", cache_restart_markers=restart)
    folders = loaders
    rates = {name: [] for name in folders}
    for run in range(runs + 1):
        for name, loader in loaders.items():
            n = 0
            t = time.perf_counter()
            for x, _ in loader:
                n += x.shape[0]
            if run:  # the first epoch is untimed: workers start, files enter the page cache
                rates[name].append(n / (time.perf_counter() - t))
        log(f"loader run {run}/{runs}")
    del loaders
    return {name: statistics.median(r) for name, r in rates.items()}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", help="an image folder (default: generated photos)")
    parser.add_argument("--work", default=os.environ.get("FASTLOAD_BENCH_DATA",
                                                         "/tmp/fastload-bench"))
    parser.add_argument("--images", type=int, default=400)
    parser.add_argument("--intervals", default="4", help="comma-separated bounds on k")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--no-loader", action="store_true")
    parser.add_argument("--cache", action="store_true",
                        help="also the files as they are through cache=\"memory\", with and "
                             "without cache_restart_markers (the first, untimed epoch fills it)")
    args = parser.parse_args(argv)
    work = pathlib.Path(args.work)
    root = args.data
    if root is None:
        import imagenet_like

        root = str(work / f"imagenet-like-{args.images}")
        log(f"making {root} (once)")
        imagenet_like.make_image_folder(root, n_images=args.images)
    files = pick(root, args.images)
    tag = f"{pathlib.Path(root).name}-{len(files)}"
    folders = {"as they are": work / f"restart-{tag}-plain"}
    copy(root, files, folders["as they are"])
    import shutil

    if shutil.which("jpegtran"):
        folders["rewritten, no restart markers"] = work / f"restart-{tag}-optimize"
        log("rewriting without restart markers (once)")
        rewrite_plain(root, files, folders["rewritten, no restart markers"])
    for k in [int(v) for v in args.intervals.split(",")]:
        folders[f"restart markers, k <= {k}"] = work / f"restart-{tag}-k{k}"
        log(f"rewriting with k <= {k} (once)")
        rewrite(root, files, folders[f"restart markers, k <= {k}"], k)
    size = {name: sum((f / rel).stat().st_size for rel, _ in files)
            for name, f in folders.items()}
    log("decode costs")
    cost = decode_costs(folders, files, args.rounds)
    plain = folders["as they are"]
    cached = [("cache of the files' bytes", plain, False),
              ("cache, cache_restart_markers=True", plain, True)] if args.cache else []
    rate = {} if args.no_loader else loader_rates(folders, args.runs, args.workers, args.batch,
                                                  cached)
    base = "as they are"
    print(f"## Restart markers: {len(files)} images of {root}\n")
    print(f"RandomResizedCrop(224) + flip + ToTensor + Normalize, decode=\"fast\"; per-image "
          f"cost: minimum of {args.rounds} interleaved rounds in one thread; loader: "
          f"{args.workers} workers, batch {args.batch}, median of {args.runs} interleaved "
          f"epochs.\n")
    print("| files | bytes | ms an image | vs as they are | loader img/s | vs as they are |")
    print("|---|---:|---:|---:|---:|---:|")
    for name in folders:
        r = rate.get(name)
        print(f"| {name} | {size[name] / size[base]:.3f}x | {cost[name]:.3f} | "
              f"**{cost[base] / cost[name]:.2f}x** | {f'{r:,.0f}' if r else 'n/a'} | "
              f"{f'**{r / rate[base]:.2f}x**' if r else 'n/a'} |")
    for name, _, _ in cached:
        print(f"| {name} | | | | {rate[name]:,.0f} | **{rate[name] / rate[base]:.2f}x** |")


if __name__ == "__main__":
    main()
