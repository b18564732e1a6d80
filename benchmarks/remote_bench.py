"""Shards from object storage against the same shards on local disk.

    python benchmarks/remote_bench.py [--images 2000] [--per-shard 100] [--workers 2]
                                      [--batch-size 32] [--repeats 2] [--no-webdataset]
                                      [--no-litdata] [--peers-python PYTHON] [--cache DIR]
                                      [--litdata-chunk-bytes N]

An ImageNet-like folder (benchmarks/imagenet_like.py) written as WebDataset
shards with their index files (``shards_from_image_folder``), uploaded to
moto's S3 server started as its own process on localhost.  Then, with the
same workers, transform and ``ShardSampler``, one epoch each, interleaved
per repeat:

- *local disk*: ``WebDataset`` over the shard paths (page cache warm);
- *S3, cold cache*: over ``s3://`` URLs into an empty shard cache (every
  shard downloaded while the epoch runs, the next ones prefetched);
- *S3, warm cache*: the same URLs again over the cache the cold run filled;
- *webdataset, HTTP*: the webdataset package's pipeline with torch's
  DataLoader (the same number of worker processes, Pillow decoding and
  torchvision's transform, shards split between workers) reading the same
  shards from an HTTP server process on localhost with ``pipe:curl``, as
  its documentation streams remote shards (``--no-webdataset``: left out);
- *litdata, S3*: litdata's ``StreamingDataset`` + ``StreamingDataLoader``
  (the same number of workers, Pillow decoding and torchvision's transform,
  shuffled) streaming the same images from the same S3 server into an
  empty cache, after ``litdata.optimize`` turned them into its chunks of
  about a shard's size (its unit of download and shuffling, as a shard is
  fastload's; 64 MB chunks, 3 for 2,000 images, left litdata's shuffled
  workers waiting: 19 against 50 images/s), untimed, cached under
  ``--cache``, and uploaded beside the shards.
  litdata runs in a subprocess of ``--peers-python`` (default
  ``$FASTLOAD_PEERS_PYTHON``, else this Python), a virtual environment of
  its own; where it cannot be imported the row says why (``--no-litdata``:
  left out).

Reported: images/s (median of the repeats), each run's ratio to local disk,
and the CPU seconds the loader's process and the server's used per epoch;
then fastload's cold-cache rate over each peer's (the issue's targets: at
least 2x each).
moto is Python: on a small machine it competes with the loader for the
cores, so the cold ratio counts the server's cost too.  Needs obstore and
moto[server].
"""

import argparse
import hashlib
import json
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pil_pipeline  # noqa: E402
from images_bench import fastload_transform  # noqa: E402
from imagenet_like import MANIFEST, make_image_folder  # noqa: E402

BUCKET = "bench"
ENV = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
       "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true"}


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(command, port):
    """A server process answering on ``port``: (process, its URL)."""
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            urllib.request.urlopen(endpoint + "/", timeout=1).close()
            return process, endpoint
        except OSError:
            if process.poll() is not None:
                raise RuntimeError(f"{command[2]} did not start") from None
            time.sleep(0.1)
    process.kill()
    raise RuntimeError(f"{command[2]} did not answer")


def start_s3():
    """moto's server in its own process; returns (process, endpoint)."""
    port = _free_port()
    return start_server([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p",
                         str(port)], port)


def start_http(folder):
    port = _free_port()
    return start_server([sys.executable, "-m", "http.server", "-b", "127.0.0.1", "-d", folder,
                         str(port)], port)


def cpu_seconds(pid=None):
    """CPU seconds (user + system) this process, or process ``pid``, used."""
    if pid is None:
        times = os.times()
        return times.user + times.system
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


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


def _timed(loader, server):
    """(images/s, loader CPU s, server CPU s) of one pass over ``loader``."""
    cpu, served = cpu_seconds(), cpu_seconds(server) if server else 0.0
    start, n = time.perf_counter(), 0
    for images, _ in loader:
        n += len(images)
    elapsed = time.perf_counter() - start
    return (n / elapsed, cpu_seconds() - cpu,
            (cpu_seconds(server) - served) if server else 0.0)


def epoch(urls, args, cache_dir=None, server=None):
    """One epoch of fastload over ``urls`` (the dataset made untimed)."""
    kwargs = {"cache_dir": cache_dir} if cache_dir else {}
    ds = fastload.WebDataset(urls, transform=fastload_transform("train"), **kwargs)
    loader = fastload.DataLoader(ds, batch_size=args.batch_size, num_workers=args.workers,
                                 sampler=fastload.ShardSampler(ds, seed=0))
    return _timed(loader, server)


def _identity(x):
    return x


def webdataset_epoch(urls, args, server):
    """One epoch of webdataset + torch's DataLoader over ``urls``.  Worker
    processes' CPU time is not in this process's: it is left out (0)."""
    import torch
    import webdataset

    dataset = (webdataset.WebDataset(urls, shardshuffle=len(urls), seed=0)
               .decode("pil").to_tuple("jpg", "cls")
               .map_tuple(pil_pipeline.train_transform(), _identity))
    loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size,
                                         num_workers=args.workers)
    rate, _, served = _timed(loader, server)
    return rate, 0.0, served


# litdata's side, run by --peers-python: "optimize FOLDER OUT WORKERS
# CHUNK_BYTES" writes the images as litdata's chunks; "epoch URL CACHE BATCH WORKERS ENDPOINT"
# streams them once and prints {"rate": images/s, "images": n}.
LITDATA_CHILD = r"""
import json
import sys
import time

sys.path.insert(0, sys.argv[1])  # benchmarks/
import litdata as ld  # noqa: E402
import pil_pipeline  # noqa: E402


def item(sample):
    path, label = sample
    with open(path, "rb") as f:
        return {"jpeg": f.read(), "label": label}


class Transform:
    def __init__(self):
        self.transform = pil_pipeline.train_transform()

    def __call__(self, item):
        import io

        from PIL import Image

        with Image.open(io.BytesIO(item["jpeg"])) as img:
            return self.transform(img.convert("RGB")), item["label"]


def main(mode, *args):
    if mode == "optimize":
        folder, out, workers, chunk_bytes = args
        samples = pil_pipeline.make_dataset(folder, pil_pipeline.find_classes(folder)[1])
        ld.optimize(fn=item, inputs=samples, output_dir=out, chunk_bytes=int(chunk_bytes),
                    num_workers=int(workers), mode="overwrite")
        return
    url, cache, batch, workers, endpoint = args
    # litdata's obstore path sets its own client options, without the plain
    # HTTP that a local S3 server speaks (AWS_ALLOW_HTTP is not read then).
    from litdata.streaming import downloader

    options = getattr(downloader, "_OBSTORE_CLIENT_OPTIONS", None)
    if isinstance(options, dict):
        downloader._OBSTORE_CLIENT_OPTIONS = {**options, "allow_http": "true"}
    dataset = ld.StreamingDataset(url, cache_dir=cache, shuffle=True, seed=0,
                                  transform=Transform(),
                                  storage_options={"endpoint_url": endpoint})
    loader = ld.StreamingDataLoader(dataset, batch_size=int(batch), num_workers=int(workers))
    start, n = time.perf_counter(), 0
    for images, _ in loader:
        n += len(images)
    print(json.dumps({"rate": n / (time.perf_counter() - start), "images": n}))


if __name__ == "__main__":
    main(*sys.argv[2:])
"""


class Litdata:
    """litdata in a subprocess of another Python: ``reason`` says why it
    cannot run, else ``epoch()`` runs one."""

    def __init__(self, python, work, cache):
        self.python, self.work, self.reason = python, work, None
        self.script = os.path.join(work, "litdata_child.py")
        with open(self.script, "w") as f:
            f.write(LITDATA_CHILD)
        self.cache = cache
        probe = subprocess.run([python, "-c", "import litdata; print(litdata.__version__)"],
                               capture_output=True, text=True)
        if probe.returncode != 0:
            lines = (probe.stderr or probe.stdout).strip().splitlines()
            self.reason = f"litdata not importable by {python}: {lines[-1] if lines else '?'}"
        else:
            self.version = probe.stdout.strip()

    def _run(self, *args, env=None):
        result = subprocess.run([self.python, self.script,
                                 os.path.dirname(os.path.abspath(__file__)), *args],
                                capture_output=True, text=True, cwd=self.work,
                                env={**os.environ, **(env or {})})
        if result.returncode != 0:
            raise RuntimeError(f"litdata {args[0]} failed: {result.stderr.strip()[-2000:]}")
        return result.stdout

    def optimized(self, folder, workers, chunk_bytes):
        """The images in litdata's format, in chunks of ``chunk_bytes``:
        made once per image set and chunk size (untimed)."""
        with open(os.path.join(folder, MANIFEST), "rb") as f:
            key = hashlib.sha256(f.read()).hexdigest()[:12]
        out = os.path.join(self.cache, f"litdata-{key}-{chunk_bytes}")
        if not os.path.exists(os.path.join(out, "index.json")):
            start = time.perf_counter()
            self._run("optimize", folder, out + ".tmp", str(workers), str(chunk_bytes))
            shutil.rmtree(out, ignore_errors=True)
            os.replace(out + ".tmp", out)
            print(f"litdata: optimized in {time.perf_counter() - start:.1f} s (untimed, "
                  f"cached in {out})")
        return out

    def epoch(self, url, cache, args, endpoint, server):
        served = cpu_seconds(server)
        out = self._run("epoch", url, cache, str(args.batch_size), str(args.workers), endpoint)
        result = json.loads(out.strip().splitlines()[-1])
        if result["images"] != args.images:
            raise RuntimeError(f"litdata's epoch delivered {result['images']} of "
                               f"{args.images} images")
        return result["rate"], 0.0, cpu_seconds(server) - served


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--per-shard", type=int, default=100)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--no-webdataset", action="store_true")
    parser.add_argument("--no-litdata", action="store_true")
    parser.add_argument("--litdata-chunk-bytes", type=int,
                        help="litdata's chunk size (default: the shards' mean size)")
    parser.add_argument("--peers-python", default=os.environ.get("FASTLOAD_PEERS_PYTHON",
                                                                 sys.executable),
                        help="the Python litdata runs in")
    parser.add_argument("--cache", default=os.path.join(
        os.environ.get("FASTLOAD_BENCH_DATA", "/tmp/fastload-bench"), "remote-cache"),
        help="where litdata's optimized copy is kept between runs")
    args = parser.parse_args(argv)

    work = tempfile.mkdtemp(prefix="fastload-remote-bench-")
    process = http = None
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
        webdataset_urls = None
        if not args.no_webdataset:
            http, http_url = start_http(shard_dir)
            webdataset_urls = [f"pipe:curl -s -f {http_url}/{os.path.basename(p)}"
                               for p in paths]
        litdata, skipped = None, {}
        if not args.no_litdata:
            os.makedirs(args.cache, exist_ok=True)
            litdata = Litdata(args.peers_python, work, args.cache)
            if litdata.reason:
                skipped["litdata, S3"], litdata = litdata.reason, None
            else:
                chunk_bytes = args.litdata_chunk_bytes or size // len(paths)
                upload(endpoint, litdata.optimized(folder, args.workers, chunk_bytes),
                       "litdata/")
        print(f"{args.images} images in {len(paths)} shards ({size / 2**20:.0f} MiB), "
              f"{args.workers} workers, batch {args.batch_size}, "
              f"{os.cpu_count()} cores; S3: moto on localhost")
        runs = {"local disk": [], "S3, cold cache": [], "S3, warm cache": []}
        if webdataset_urls:
            runs["webdataset, HTTP"] = []
        if litdata:
            runs["litdata, S3"] = []
        epoch(local, args)  # the page cache warm
        for r in range(args.repeats):
            cache = os.path.join(work, f"cache-{r}")
            runs["local disk"].append(epoch(local, args))
            runs["S3, cold cache"].append(epoch(remote, args, cache, process.pid))
            runs["S3, warm cache"].append(epoch(remote, args, cache, process.pid))
            if webdataset_urls:
                runs["webdataset, HTTP"].append(webdataset_epoch(webdataset_urls, args,
                                                                 http.pid))
            if litdata:
                runs["litdata, S3"].append(litdata.epoch(
                    f"s3://{BUCKET}/litdata", os.path.join(work, f"litdata-cache-{r}"), args,
                    endpoint, process.pid))
            shutil.rmtree(cache)
        medians = {name: statistics.median(v[0] for v in values)
                   for name, values in runs.items()}
        base = medians["local disk"]
        for name, value in medians.items():
            loader_cpu = statistics.median(v[1] for v in runs[name])
            server_cpu = statistics.median(v[2] for v in runs[name])
            print(f"  {name:16s} {value:7.0f} images/s  {value / base:5.2f}x local disk  "
                  f"CPU s: loader {loader_cpu:5.1f}, server {server_cpu:4.1f}  "
                  f"({', '.join(f'{v[0]:.0f}' for v in runs[name])})")
        for name, reason in skipped.items():
            print(f"  {name:16s} skipped: {reason}")
        cold = medians["S3, cold cache"]
        for name in ("webdataset, HTTP", "litdata, S3"):
            if name in medians:
                print(f"  fastload S3 cold over {name}: {cold / medians[name]:.2f}x "
                      "(target: 2x)")
        return medians
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        for server in (process, http):
            if server is not None:
                server.terminate()
                server.wait(30)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
