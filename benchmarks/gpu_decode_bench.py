"""JPEGs decoded on the GPU against the CPU workers: images a second
delivered to the GPU by ``DataLoader(device="cuda")`` with
``decode_device="cuda"`` and with the default ``"cpu"``, side by side.

    python benchmarks/gpu_decode_bench.py [--workers 4 16] [--images 2048] [--epochs 3]
    python benchmarks/gpu_decode_bench.py --quick     # a smoke run

Generated ImageNet-like JPEGs (benchmarks/imagenet_like.py: camera sizes,
2-4 bits a pixel, some progressive and gray files, which the GPU path hands
back to the workers), a page cache warm; RandomResizedCrop(224) + flip +
ToTensor + Normalize, batch 256, persistent workers.  For each worker count
the two routes alternate epoch by epoch in this one process (only ratios of
medians are meaningful on a shared machine); each epoch's images a second
counts a loop that only waits for each batch on the GPU (an event).  Prints
a Markdown table; without a CUDA GPU, nvJPEG or NVRTC it prints one line
and exits 0.
"""

import argparse
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
try:
    import fastload
except ImportError:  # run from a checkout built in place
    sys.path.insert(0, os.path.dirname(HERE))
    import fastload
sys.path.insert(0, HERE)
from imagenet_like import make_image_folder  # noqa: E402

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def why_not():
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available() or not fastload.cuda.is_available():
        return "no CUDA GPU"
    for name, info in (("nvJPEG", fastload.cuda._nvjpeg_info()),
                       ("NVRTC", fastload.cuda._nvrtc_info())):
        if not info["available"]:
            return f"{name} is not available ({info['error']})"
    return None


def epoch_rate(loader):
    import torch

    count, started = 0, time.perf_counter()
    for images, _ in loader:
        torch.cuda.current_stream().synchronize()  # the batch is on the GPU
        count += images.shape[0]
    return count / (time.perf_counter() - started)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[4, 16])
    parser.add_argument("--images", type=int, default=2048)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--quick", action="store_true", help="few images, one epoch")
    args = parser.parse_args(argv)
    if args.quick:
        args.images, args.epochs, args.batch_size = 256, 1, 64
    reason = why_not()
    if reason:
        print(f"gpu_decode_bench: skipped: {reason}")
        return None
    from fastload import transforms as T

    transform = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(),
                           T.Normalize(MEAN, STD)])
    rows = []
    with tempfile.TemporaryDirectory() as root:
        make_image_folder(root, n_images=args.images)
        ds = fastload.ImageFolder(root, transform=transform)
        for workers in args.workers:
            loaders = {route: fastload.DataLoader(ds, batch_size=args.batch_size, shuffle=True,
                                                  num_workers=workers, persistent_workers=True,
                                                  device="cuda", decode_device=route)
                       for route in ("cpu", "cuda")}
            rates = {route: [] for route in loaders}
            for route, loader in loaders.items():  # warm-up: kernels, pools, page cache
                epoch_rate(loader)
            for _ in range(args.epochs):
                for route, loader in loaders.items():
                    rates[route].append(epoch_rate(loader))
            decoder = loaders["cuda"]._upload.decoder
            medians = {route: statistics.median(r) for route, r in rates.items()}
            rows.append((workers, medians["cpu"], medians["cuda"], decoder.backend))
            print(f"{workers} workers: {medians}", file=sys.stderr)
    print("| workers | CPU decode (img/s) | GPU decode (img/s) | GPU / CPU | nvJPEG backend |")
    print("| --- | --- | --- | --- | --- |")
    for workers, cpu, gpu, backend in rows:
        print(f"| {workers} | {cpu:,.0f} | {gpu:,.0f} | {gpu / cpu:.2f}x | {backend} |")
    return rows


if __name__ == "__main__":
    main()
