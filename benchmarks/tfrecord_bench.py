"""The training pipeline over the same photos as TFRecord files and as an
image folder, and through DALI's CPU ``readers.tfrecord``, in one run.

    python benchmarks/tfrecord_bench.py                    # $FASTLOAD_BENCH_PHOTOS, 2 workers, 3 rounds
    python benchmarks/tfrecord_bench.py --photos DIR --rounds 1 --batch 8 --shards 2
    python benchmarks/tfrecord_bench.py --json tfrecord.json

One pipeline: RandomResizedCrop(224) + random horizontal flip + ToTensor +
Normalize (ImageNet mean/std), batch ``--batch`` (64), shuffled,
``--workers`` (2) workers, float32 CHW batches out:

* fastload TFRecord: ``fastload.TFRecordDataset`` over ``--shards`` TFRecord
  files of the photos (``image/encoded``, ``image/class/label``; written
  untimed, in the folder's order, with their tfrecord2idx index files),
  ``fastload.transforms``, thread workers;
* fastload ImageFolder: ``fastload.ImageFolder`` over the photos, the same
  transform;
* DALI: ``fn.readers.tfrecord`` over the same files and index files
  (``random_shuffle=True``) + ``fn.decoders.image_random_crop(device="cpu")``
  + ``fn.resize`` + ``fn.crop_mirror_normalize``, ``--workers`` threads, run
  in a subprocess by ``--dali-python`` (default: ``$FASTLOAD_PEERS_PYTHON``,
  else this one), skipped with the reason when DALI cannot
  be imported there.

Each loader first runs one untimed epoch, then ``--rounds`` timed epochs,
interleaved (A B C A B C ...; DALI's subprocess runs an epoch when asked and
waits otherwise); each rate is the median, ratios are of medians.  Beside
the rate, the CPU time of the loader's process per image (every thread's:
``time.process_time``), which a machine busy with other work changes less.
Prints a Markdown table on stdout, progress on stderr.
"""

import argparse
import json
import os
import statistics
import struct
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import fastload  # noqa: E402
from fastload import transforms as T  # noqa: E402

import imagenet_like  # noqa: E402
from compare import log  # noqa: E402
from image_timing import images_per_second  # noqa: E402

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
SIZE = 224
PEERS_PYTHON = os.environ.get("FASTLOAD_PEERS_PYTHON", sys.executable)
DEFAULT_PHOTOS = os.environ.get("FASTLOAD_BENCH_PHOTOS")  # an image folder of real photos


# ---------------------------------------------------------------- writing

def _crc32c_masked(data):
    crc = fastload._C.crc32c(data, "auto")
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(n):
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number, payload):
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def example(image, label):
    """A tf.train.Example of an encoded image and its label, as TensorFlow
    writes it (packed int64 list)."""
    def entry(name, feature):
        return _field(1, _field(1, name) + _field(2, feature))

    return _field(1, entry(b"image/encoded", _field(1, _field(1, image))) +
                  entry(b"image/class/label", _field(3, _field(1, _varint(label)))))


def record(data):
    length = struct.pack("<Q", len(data))
    return (length + struct.pack("<I", _crc32c_masked(length)) + data +
            struct.pack("<I", _crc32c_masked(data)))


def write_tfrecords(folder, out, shards, restart_markers=False):
    """The folder's samples, in its order, as `shards` TFRecord files with
    index files beside them (each JPEG rewritten with restart markers when
    `restart_markers`); returns (files, index files), reusing what a
    previous run wrote for the same photos."""
    os.makedirs(out, exist_ok=True)
    samples = list(fastload.ImageFolder(folder).samples)
    files = [os.path.join(out, f"train-{s:05d}-of-{shards:05d}.tfrecord") for s in range(shards)]
    indexes = [f + ".idx" for f in files]
    stamp = os.path.join(out, "written.json")
    want = {"photos": os.path.abspath(folder), "count": len(samples), "shards": shards,
            "restart_markers": restart_markers}
    try:
        with open(stamp) as f:
            if json.load(f) == want and all(map(os.path.exists, indexes)):
                return files, indexes
    except (OSError, ValueError):
        pass
    start = time.perf_counter()
    per = -(-len(samples) // shards)
    for s, path in enumerate(files):
        with open(path, "wb") as f:
            for image_path, label in samples[s * per:(s + 1) * per]:
                with open(image_path, "rb") as g:
                    data = g.read()
                if restart_markers:
                    data = fastload.add_restart_markers(data)
                f.write(record(example(data, label)))
        fastload.write_tfrecord_index(path, path + ".idx")
    with open(stamp, "w") as f:
        json.dump(want, f)
    log(f"wrote {len(samples)} records in {shards} TFRecord files in "
        f"{time.perf_counter() - start:.1f} s (untimed)")
    return files, indexes


# ---------------------------------------------------------------- loaders

def transform():
    return T.Compose([T.RandomResizedCrop(SIZE), T.RandomHorizontalFlip(), T.ToTensor(),
                      T.Normalize(MEAN, STD)])


def timed(loader, count):
    """(images/s, CPU seconds of this process an image) over one epoch: the
    CPU time counts every thread's, so it holds on a busy machine where the
    rate does not."""
    cpu = time.process_time()
    rate = images_per_second(loader)
    return rate, (time.process_time() - cpu) / count


def make_loaders(folder, files, batch, workers):
    common = dict(batch_size=batch, shuffle=True, num_workers=workers, persistent_workers=True)
    return {
        "fastload TFRecord": fastload.DataLoader(
            fastload.TFRecordDataset(files, transform()), **common),
        "fastload ImageFolder": fastload.DataLoader(
            fastload.ImageFolder(folder, transform=transform()), **common),
    }


DALI_CHILD = r"""
import json, sys, time
import numpy as np
try:
    import nvidia.dali
    from nvidia.dali import fn, pipeline_def, types
    import nvidia.dali.tfrecord as tfrec
except ImportError as e:
    print(json.dumps({"skipped": f"DALI cannot be imported: {e}"}))
    sys.exit(0)
args = json.loads(sys.argv[1])
mean = [255 * m for m in args["mean"]]
std = [255 * s for s in args["std"]]
size = args["size"]

@pipeline_def(device_id=None)
def pipeline():
    inputs = fn.readers.tfrecord(
        path=args["files"], index_path=args["indexes"], random_shuffle=True, name="Reader",
        features={"image/encoded": tfrec.FixedLenFeature((), tfrec.string, ""),
                  "image/class/label": tfrec.FixedLenFeature([1], tfrec.int64, -1)})
    images = fn.decoders.image_random_crop(inputs["image/encoded"], device="cpu",
                                           output_type=types.RGB, random_area=[0.08, 1.0],
                                           random_aspect_ratio=[3 / 4, 4 / 3])
    images = fn.resize(images, resize_x=size, resize_y=size, interp_type=types.INTERP_LINEAR,
                       antialias=True)
    images = fn.crop_mirror_normalize(images, dtype=types.FLOAT, output_layout="CHW", mean=mean,
                                      std=std, mirror=fn.random.coin_flip(probability=0.5))
    return images, inputs["image/class/label"]

pipe = pipeline(batch_size=args["batch"], num_threads=args["workers"], prefetch_queue_depth=2,
                seed=0)
pipe.build()
batches = -(-args["count"] // args["batch"])

def epoch():
    start, cpu, n = time.perf_counter(), time.process_time(), 0
    for _ in range(batches):
        images, labels = pipe.run()
        a = np.asarray(images.as_tensor())
        if a.shape[1:] != (3, size, size) or not np.isfinite(a.sum()):
            raise AssertionError(f"batch {a.shape}")
        n += len(a)
    return n / (time.perf_counter() - start), (time.process_time() - cpu) / n

print(json.dumps({"ready": nvidia.dali.__version__}), flush=True)
for line in sys.stdin:  # one epoch a line, so the parent interleaves them with its own
    rate, cpu = epoch()
    print(json.dumps({"rate": rate, "cpu": cpu}), flush=True)
"""


class DaliChild:
    """DALI's pipeline in a subprocess of ``python``, built once; each
    ``epoch()`` runs one epoch there and returns its images/s, so DALI's
    rounds interleave with the loaders of this process.  ``skipped``: why
    it could not start (None when it runs)."""

    def __init__(self, python, files, indexes, count, batch, workers):
        self.process, self.skipped, self.version = None, None, None
        if not os.path.exists(python):
            self.skipped = f"no Python at {python}"
            return
        args = {"files": files, "indexes": indexes, "count": count, "batch": batch,
                "workers": workers, "mean": MEAN, "std": STD, "size": SIZE}
        env = dict(os.environ, PYTHONPATH="")
        self.process = subprocess.Popen([python, "-c", DALI_CHILD, json.dumps(args)],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True, env=env)
        first = self._answer()
        if first is None or "skipped" in first:
            self.skipped = first["skipped"] if first else self._failure()
            self.close()
        else:
            self.version = first["ready"]

    def _answer(self):
        line = self.process.stdout.readline()
        return json.loads(line) if line.strip() else None

    def _failure(self):
        self.process.wait()
        lines = self.process.stderr.read().strip().splitlines()
        return f"DALI's run failed: {lines[-1] if lines else self.process.returncode}"

    def epoch(self):
        self.process.stdin.write("epoch\n")
        self.process.stdin.flush()
        answer = self._answer()
        if answer is None:
            raise RuntimeError(self._failure())
        return answer["rate"], answer["cpu"]

    def close(self):
        if self.process is None:
            return
        self.process.stdin.close()  # the child's loop ends
        self.process.wait()
        self.process.stdout.close()
        self.process.stderr.close()


# ---------------------------------------------------------------- the run

def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--photos", default=None,
                        help="an image folder (default: $FASTLOAD_BENCH_PHOTOS, else generated)")
    parser.add_argument("--images", type=int, default=2000,
                        help="photos to generate when --photos is not given and the default "
                             "is absent")
    parser.add_argument("--cache", default=os.path.join(os.path.expanduser("~"), ".cache",
                                                        "fastload-bench", "tfrecord"))
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dali-python", default=PEERS_PYTHON)
    parser.add_argument("--no-dali", action="store_true")
    parser.add_argument("--restart-markers", action="store_true",
                        help="records hold the JPEGs rewritten with restart markers "
                             "(fastload.add_restart_markers); every loader reads the same files")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)

    folder = args.photos
    if folder is None:
        folder = DEFAULT_PHOTOS if DEFAULT_PHOTOS and os.path.isdir(DEFAULT_PHOTOS) else \
            imagenet_like.make_image_folder(os.path.join(args.cache, f"photos-{args.images}"),
                                            n_images=args.images)
    out = os.path.join(args.cache, "records-" + os.path.basename(os.path.abspath(folder)) +
                       ("-restart" if args.restart_markers else ""))
    files, indexes = write_tfrecords(folder, out, args.shards, args.restart_markers)
    loaders = make_loaders(folder, files, args.batch, args.workers)
    count = len(loaders["fastload ImageFolder"].dataset)
    measures = {name: (lambda loader=loader: timed(loader, count))
                for name, loader in loaders.items()}
    skipped, dali = {}, None
    if args.no_dali:
        skipped["DALI"] = "--no-dali"
    else:
        log("DALI readers.tfrecord: building its pipeline in a subprocess")
        dali = DaliChild(args.dali_python, files, indexes, count, args.batch, args.workers)
        if dali.skipped:
            skipped["DALI"] = dali.skipped
        else:
            measures[f"DALI {dali.version} readers.tfrecord (CPU)"] = dali.epoch
    rates = {name: [] for name in measures}
    cpu = {name: [] for name in measures}
    try:
        for name, measure in measures.items():
            log(f"{name}: warm-up epoch")
            measure()
        for r in range(args.rounds):
            for name, measure in measures.items():
                log(f"{name}: round {r + 1}/{args.rounds}")
                rate, seconds = measure()
                rates[name].append(rate)
                cpu[name].append(seconds)
    finally:
        if dali is not None:
            dali.close()
    medians = {name: statistics.median(r) for name, r in rates.items()}
    cpu_ms = {name: 1000 * statistics.median(c) for name, c in cpu.items()}
    tf, tf_cpu = medians["fastload TFRecord"], cpu_ms["fastload TFRecord"]
    print(f"{count} images in {args.shards} TFRecord files"
          f"{' (JPEGs with restart markers)' if args.restart_markers else ''}, batch {args.batch}, "
          f"{args.workers} workers, {args.rounds} rounds, {os.cpu_count()} CPUs\n")
    print("| loader | images/s (median) | fastload TFRecord / this | CPU ms an image "
          "(median) | this / fastload TFRecord |")
    print("|---|---:|---:|---:|---:|")
    for name, m in medians.items():
        print(f"| {name} | {m:.1f} | {tf / m:.2f}x | {cpu_ms[name]:.2f} | "
              f"{cpu_ms[name] / tf_cpu:.2f}x |")
    for name, why in skipped.items():
        print(f"\n{name} skipped: {why}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rates": rates, "medians": medians, "cpu_seconds": cpu,
                       "skipped": skipped,
                       "images": count}, f, indent=1)
    return medians, skipped


if __name__ == "__main__":
    main()
