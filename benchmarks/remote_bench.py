"""Shards from object storage against the same shards on local disk.

    python benchmarks/remote_bench.py [--images 2000] [--per-shard 100] [--workers 2]
                                      [--batch-size 32] [--repeats 2] [--crop 224]

An ImageNet-like folder (benchmarks/imagenet_like.py) written as WebDataset
shards with their index files (``shards_from_image_folder``), uploaded to
moto's S3 server started as its own process on localhost.  Then, with the
same workers, transform and ``ShardSampler``, one epoch each, interleaved
per repeat:

- *local disk*: ``WebDataset`` over the shard paths (page cache warm);
- *S3, cold cache*: over ``s3://`` URLs into an empty shard cache (every
  shard downloaded while the epoch runs, the next ones prefetched);
- *S3, warm cache*: the same URLs again over the cache the cold run filled.

Reported: images/s (median of the repeats) and each S3 run's ratio to local
disk.  moto is Python: on a small machine it competes with the loader for
the cores, so the cold ratio counts the server's cost too.  Needs obstore
and moto[server].
"""

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

try:
    import fastload
except ImportError:  # run from a checkout built in place
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import fastload
from fastload import transforms as T

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from imagenet_like import make_image_folder  # noqa: E402

BUCKET = "bench"
ENV = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
       "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true"}


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_s3():
    """moto's server in its own process; returns (process, endpoint)."""
    port = _free_port()
    process = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1",
                                "-p", str(port)], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            urllib.request.urlopen(endpoint + "/", timeout=1).close()
            return process, endpoint
        except OSError:
            if process.poll() is not None:
                raise RuntimeError("moto's server did not start") from None
            time.sleep(0.1)
    process.kill()
    raise RuntimeError("moto's server did not answer")


def upload(endpoint, folder, prefix):
    import obstore
    import obstore.store

    store = obstore.store.from_url(f"s3://{BUCKET}", endpoint=endpoint,
                                   client_options={"allow_http": True})
    for name in sorted(os.listdir(folder)):
        with open(os.path.join(folder, name), "rb") as f:
            obstore.put(store, prefix + name, f.read())


def create_bucket(endpoint):
    request = urllib.request.Request(f"{endpoint}/{BUCKET}", method="PUT")
    urllib.request.urlopen(request, timeout=30).close()


def epoch(urls, args, cache_dir=None):
    """Images/s of one epoch over ``urls`` (the dataset made untimed)."""
    transform = T.Compose([T.RandomResizedCrop(args.crop), T.RandomHorizontalFlip(),
                           T.ToTensor()])
    kwargs = {"cache_dir": cache_dir} if cache_dir else {}
    ds = fastload.WebDataset(urls, transform=transform, **kwargs)
    loader = fastload.DataLoader(ds, batch_size=args.batch_size, num_workers=args.workers,
                                 sampler=fastload.ShardSampler(ds, seed=0))
    start, n = time.perf_counter(), 0
    for images, _ in loader:
        n += len(images)
    elapsed = time.perf_counter() - start
    del loader, ds
    return n / elapsed


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--per-shard", type=int, default=100)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--crop", type=int, default=224)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)

    work = tempfile.mkdtemp(prefix="fastload-remote-bench-")
    process = None
    saved = {k: os.environ.get(k) for k in (*ENV, "AWS_ENDPOINT_URL")}
    try:
        folder = os.path.join(work, "images")
        make_image_folder(folder, n_images=args.images, n_classes=10, seed=0)
        shard_dir = os.path.join(work, "shards")
        os.makedirs(shard_dir)
        paths = fastload.shards_from_image_folder(folder, os.path.join(shard_dir, "s-%05d.tar"),
                                                  maxcount=args.per_shard)
        size = sum(os.path.getsize(p) for p in paths)
        process, endpoint = start_s3()
        os.environ.update(ENV, AWS_ENDPOINT_URL=endpoint)
        create_bucket(endpoint)
        upload(endpoint, shard_dir, "shards/")
        pattern = f"s-{{00000..{len(paths) - 1:05d}}}.tar"
        local, remote = os.path.join(shard_dir, pattern), f"s3://{BUCKET}/shards/{pattern}"
        print(f"{args.images} images in {len(paths)} shards ({size / 2**20:.0f} MiB), "
              f"{args.workers} workers, batch {args.batch_size}, crop {args.crop}, "
              f"{os.cpu_count()} cores; S3: moto on localhost")
        runs = {"local disk": [], "S3, cold cache": [], "S3, warm cache": []}
        epoch(local, args)  # the page cache warm
        for r in range(args.repeats):
            cache = os.path.join(work, f"cache-{r}")
            runs["local disk"].append(epoch(local, args))
            runs["S3, cold cache"].append(epoch(remote, args, cache))
            runs["S3, warm cache"].append(epoch(remote, args, cache))
            shutil.rmtree(cache)
        medians = {name: statistics.median(v) for name, v in runs.items()}
        base = medians["local disk"]
        for name, value in medians.items():
            print(f"  {name:15s} {value:8.0f} images/s  {value / base:5.2f}x local disk  "
                  f"({', '.join(f'{v:.0f}' for v in runs[name])})")
        return medians
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        if process is not None:
            process.terminate()
            process.wait(30)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
