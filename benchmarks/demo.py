"""fastload next to torch's DataLoader, on data generated on the spot.

    python benchmarks/demo.py                      # a few minutes
    python benchmarks/demo.py --workload images --images 2000 --workers 1 2
    python benchmarks/demo.py --workload text --workers 0 1 2

The headline workload is image training input: a folder of photo-like JPEGs
(made once, cached) through RandomResizedCrop(224) + RandomHorizontalFlip +
ToTensor + Normalize.  torch's DataLoader runs torchvision's ImageFolder and
transforms (Pillow decodes the whole image); where torchvision cannot be
imported, a Pillow re-implementation of them (benchmarks/pil_pipeline.py)
stands in, and the table says so.  fastload runs fastload.ImageFolder with
fastload.transforms, decoded and augmented in C, with decode="fast" (its
default: DCT-domain downscaling when the crop is much larger than the
output; --decode exact turns it off).

The other workloads are Python datasets, which both loaders call the same
way: FixedArrays and NumpyWork measure the loader itself, and
PythonTokenizer is a dataset whose __getitem__ is pure Python and holds the
GIL throughout.  fastload runs Python datasets in worker processes, as torch
does, so there the two loaders do the same work and differ only in the
hand-off; worker threads (worker_mode="thread") would take turns on one GIL
and lose.

Runs both loaders on the same dataset and configuration, with a progress bar
on stderr while each runs, then prints samples/s per loader and the speed-up.
The two loaders take turns (torch, fastload, torch, fastload, ...) and each
number is the median of its runs, so a machine that speeds up or slows down
meanwhile affects both alike.  Every sample of every batch is checked
against a checksum computed without a loader.

Works without torch installed: fastload then runs alone (NumPy batches).
"""

import argparse
import os
import platform
import random
import statistics
import sys
import time

try:
    import fastload
except ImportError:  # run from a checkout that is built in place, not installed
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import fastload

import numpy as np

from workloads import (FixedArrays, NumpyWork, consume, cpu_model, loader_kinds, make_loader,
                       seconds_per_item, torch, warm_up)

WORKLOADS = {
    "images": ("ImageFolder", "photo-like JPEGs, RandomResizedCrop(224) + flip + ToTensor + "
               "Normalize"),
    "fixed": ("FixedArrays", "3x64x64 float32 images, nearly free to make: the loader's own cost"),
    "numpy": ("NumpyWork", "~1 ms of GIL-releasing NumPy work per sample"),
    "text": ("PythonTokenizer",
             "text split and word-piece tokenised in pure Python: holds the GIL"),
}


def import_torchvision():
    """torchvision, or None (pil_pipeline.import_torchvision; that module
    needs torch, so it is imported here)."""
    import pil_pipeline

    return pil_pipeline.import_torchvision()


def image_pipelines(torchvision, decode):
    """``{loader: what it runs}`` for the image workload, for the notes
    under the table."""
    if torchvision is not None:
        torch_side = (f"torchvision {torchvision.__version__} ImageFolder + transforms "
                      "(Pillow decodes the whole image)")
    else:
        torch_side = ("torchvision cannot be imported here: a Pillow re-implementation of its "
                      "ImageFolder + transforms (benchmarks/pil_pipeline.py, same results)")
    if decode == "fast":
        fastload_side = ('fastload.ImageFolder + fastload.transforms, decode="fast" (region '
                         "decode, DCT-domain downscaling when the crop is much larger than "
                         '224 px; decode="exact" turns that off)')
    else:
        fastload_side = ('fastload.ImageFolder + fastload.transforms, decode="exact" (region '
                         "decode, no DCT-domain downscaling)")
    return {"torch": torch_side, "fastload": fastload_side}


class PythonTokenizer:
    """``n`` samples ``(token_ids, label)`` whose cost is pure Python.

    Sample i is document ``i % DOCS`` (about 120 generated words with some
    capitals and punctuation, made once in ``__init__``) lower-cased, split
    into words and punctuation one character at a time, and each word
    tokenised by greedy longest-match word-piece lookup in a dict, the
    way a simple Python tokenizer does it; the ids are padded with 0 to a
    ``(SEQ,)`` int64 array.  ``label = index % 10``.  Every call does the
    whole job again (nothing is cached), and all of it holds the GIL: no
    NumPy work to speak of, no I/O.

    The checksum of a sample (the sum of its ids plus its label) depends on
    the document only, so ``expected_checksum`` calls the dataset once per
    document.
    """

    SEQ = 512
    DOCS = 64
    NUM_CLASSES = 10
    UNKNOWN = 1

    def __init__(self, n, seed=0):
        self.n = int(n)
        rng = random.Random(seed)
        consonants, vowels = "bcdfghjklmnprstvwz", "aeiou"
        syllables = sorted({rng.choice(consonants) + rng.choice(vowels)
                            + rng.choice(["", "", rng.choice(consonants)]) for _ in range(300)})
        words = ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 4)))
                 for _ in range(3000)]
        # Half the syllables start words; every syllable continues one
        # ("##" prefix); single letters catch the rest.
        pieces = (syllables[: len(syllables) // 2] + ["##" + s for s in syllables]
                  + list(consonants + vowels) + ["##" + c for c in consonants + vowels]
                  + list(".,;:!?"))
        self.vocab = {"[PAD]": 0, "[UNK]": self.UNKNOWN}
        for piece in pieces:
            self.vocab.setdefault(piece, len(self.vocab))
        self.longest_piece = max(len(p) for p in self.vocab)
        self.docs = []
        for _ in range(self.DOCS):
            doc = []
            for _ in range(rng.randint(100, 140)):
                word = rng.choice(words)
                if rng.random() < 0.1:
                    word = word.capitalize()
                if rng.random() < 0.15:
                    word += rng.choice(".,;:!?")
                doc.append(word)
            self.docs.append(" ".join(doc))
        self._doc_sums = None  # filled lazily by expected_checksum

    def __len__(self):
        return self.n

    def tokenize(self, text):
        """The ids of ``text``: words by word-piece, punctuation one id each."""
        ids = []
        word = []
        for ch in text.lower() + " ":
            if ch.isalnum():
                word.append(ch)
                continue
            if word:
                self._word_pieces("".join(word), ids)
                word = []
            if not ch.isspace():
                ids.append(self.vocab.get(ch, self.UNKNOWN))
        return ids

    def _word_pieces(self, word, ids):
        start = 0
        while start < len(word):
            for end in range(min(len(word), start + self.longest_piece), start, -1):
                piece = word[start:end] if start == 0 else "##" + word[start:end]
                token = self.vocab.get(piece)
                if token is not None:
                    ids.append(token)
                    start = end
                    break
            else:
                ids.append(self.UNKNOWN)  # no piece fits: the whole word is unknown
                return

    def __getitem__(self, index):
        if not 0 <= index < self.n:
            raise IndexError(f"index {index} out of range for {self.n} samples")
        ids = self.tokenize(self.docs[index % self.DOCS])[: self.SEQ]
        tokens = np.zeros(self.SEQ, dtype=np.int64)
        tokens[: len(ids)] = ids
        return tokens, index % self.NUM_CLASSES

    def expected_checksum(self, indices):
        """The checksum of these samples, from the dataset called once per
        document."""
        if self._doc_sums is None:
            self._doc_sums = [int(self[d][0].sum()) for d in range(min(self.DOCS, self.n))]
        idx = np.asarray(indices, dtype=np.int64)
        counts = np.bincount(idx % self.DOCS, minlength=self.DOCS)
        return (sum(int(c) * s for c, s in zip(counts, self._doc_sums))
                + int((idx % self.NUM_CLASSES).sum()))

    def time_per_item(self, calls=100):
        """Median seconds per ``__getitem__`` call on this machine."""
        return seconds_per_item(self, calls)

    def __repr__(self):
        return f"PythonTokenizer(n={self.n})"


class ProgressBar:
    """``label [######......] done/total  rate samples/s`` on stderr.

    On a terminal the line is rewritten in place with ``\\r`` (at most 20
    times a second, so drawing costs nothing measurable); elsewhere (a log
    file) only the finished line is written."""

    WIDTH = 30

    def __init__(self, label, total, stream=sys.stderr):
        self.label = label
        self.total = total
        self.stream = stream
        self.live = stream.isatty()
        self.start = time.perf_counter()
        self.next_draw = self.start

    def update(self, done):
        if self.live:
            now = time.perf_counter()
            if now >= self.next_draw:
                self.next_draw = now + 0.05
                self._draw(done, now - self.start, "\r")

    def finish(self, done, seconds):
        self._draw(done, seconds, "\r" if self.live else "")
        self.stream.write("\n")
        self.stream.flush()

    def _draw(self, done, seconds, prefix):
        filled = self.WIDTH * done // max(self.total, 1)
        bar = "#" * filled + "." * (self.WIDTH - filled)
        rate = done / seconds if seconds > 0 else 0.0
        self.stream.write(f"{prefix}{self.label} [{bar}] {done:>{len(str(self.total))}}/{self.total}"
                          f"  {rate:>9,.0f} samples/s")
        self.stream.flush()


def run_once(kind, loader, dataset, num_workers, expected):
    label = f"  {kind:<8} num_workers={num_workers}"
    bar = ProgressBar(label, len(dataset))
    start = time.perf_counter()
    result = consume(loader, on_batch=bar.update)
    seconds = time.perf_counter() - start
    bar.finish(result[0], seconds)
    if result != expected:
        raise SystemExit(f"{kind} returned wrong data: (samples, checksum) = {result}, "
                         f"expected {expected}")
    return seconds


def consume_images(loader, on_batch):
    """Reads every image batch; the crops are random (and drawn differently
    by the two loaders), so batches are checked for shape, dtype, finite
    values and labels rather than a checksum."""
    done = 0
    for images, labels in loader:
        if tuple(images.shape[1:]) != (3, 224, 224) or images.dtype != torch.float32:
            raise SystemExit(f"wrong batch: {tuple(images.shape)} {images.dtype}")
        if not torch.isfinite(images.sum()) or len(labels) != len(images):
            raise SystemExit("a batch holds non-finite values or mismatched labels")
        done += len(labels)
        on_batch(done)
    return done


def image_loaders(root, kinds, num_workers, batch_size, torchvision, decode):
    import images_bench
    import pil_pipeline

    loaders = {}
    if "torch" in kinds:
        use_tv = torchvision is not None
        transform = pil_pipeline.train_transform(use_torchvision=use_tv)
        dataset = pil_pipeline.image_folder(root, transform, use_torchvision=use_tv)
        loaders["torch"] = torch.utils.data.DataLoader(dataset, batch_size=batch_size,
                                                       shuffle=True, num_workers=num_workers)
    dataset = fastload.ImageFolder(root, transform=images_bench.fastload_transform("train"),
                                   decode=decode)
    loaders["fastload"] = fastload.DataLoader(dataset, batch_size=batch_size, shuffle=True,
                                              num_workers=num_workers)
    return loaders, len(dataset)


def run_images(args, kinds, torchvision):
    """The image workload; returns result rows."""
    try:
        import imagenet_like
    except ImportError:
        print("Pillow is not installed: skipping the image workload.", file=sys.stderr)
        return []
    root = os.path.join(args.data, f"imagenet-like-{args.images}")
    print(f"Making {args.images} photo-like JPEGs in {root} (once) ...", file=sys.stderr)
    imagenet_like.make_image_folder(root, n_images=args.images)
    title, what = WORKLOADS["images"]
    print(f"{title} ({args.images} images): {what}", file=sys.stderr)
    rows = []
    for nw in [w for w in args.workers if w > 0 or torch is None] or [1]:
        loaders, n = image_loaders(root, kinds, nw, args.batch_size, torchvision, args.decode)
        times = {kind: [] for kind in loaders}
        for rep in range(args.repeat + 1):
            for kind, loader in loaders.items():
                label = f"  {kind:<8} num_workers={nw}" + ("  (warm-up)" if rep == 0 else "")
                bar = ProgressBar(label, n)
                start = time.perf_counter()
                done = consume_images(loader, bar.update)
                seconds = time.perf_counter() - start
                bar.finish(done, seconds)
                if done != n:
                    raise SystemExit(f"{kind} delivered {done} images, expected {n}")
                if rep > 0:  # the first pass warms the page cache and the workers
                    times[kind].append(seconds)
        rate = {kind: n / statistics.median(ts) for kind, ts in times.items()}
        rows.append((title, nw, rate.get("torch"), rate["fastload"]))
        del loaders
    print(file=sys.stderr)
    return rows


def parse_args(argv):
    parser = argparse.ArgumentParser(
        description="Compare fastload.DataLoader with torch.utils.data.DataLoader.")
    parser.add_argument("--samples", type=int, default=32768,
                        help="samples per epoch of FixedArrays (default 32768)")
    parser.add_argument("--work-samples", type=int, default=1024,
                        help="samples per epoch of NumpyWork, ~1 ms each (default 1024)")
    parser.add_argument("--text-samples", type=int, default=2048,
                        help="samples per epoch of PythonTokenizer, ~0.5 ms each (default 2048)")
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2], metavar="N",
                        help="num_workers values to run (default: 0 2; the image workload "
                             "skips 0)")
    parser.add_argument("--images", type=int, default=1024,
                        help="JPEGs in the generated image folder (default 1024)")
    parser.add_argument("--decode", choices=["fast", "exact"], default="fast",
                        help="fastload.ImageFolder's decode mode (default fast, its default)")
    parser.add_argument("--data", default=os.environ.get("FASTLOAD_BENCH_DATA",
                                                         "/tmp/fastload-bench"),
                        help="where the image folder is made and kept")
    parser.add_argument("--workload", choices=["images", "fixed", "numpy", "text", "all"],
                        default="all")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3,
                        help="runs per loader and configuration; the median is reported (default 3)")
    args = parser.parse_args(argv)
    if (min(args.workers) < 0 or args.samples < 1 or args.work_samples < 1
            or args.text_samples < 1 or args.repeat < 1 or args.images < 1):
        parser.error("--workers must be >= 0; --samples, --work-samples, --text-samples, "
                     "--images and --repeat >= 1")
    return args


def load_average():
    """The 1-minute load average, as a sentence: other jobs on the machine
    take cores from the workers (and hurt torch's worker processes most on
    a GIL-bound dataset)."""
    try:
        return f"Load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs"
    except OSError:
        return "Load average unknown"


def format_table(rows):
    """The result rows as an aligned text table."""
    header = ("workload", "num_workers", "torch samples/s", "fastload samples/s", "speed-up")
    lines = []
    for title, nw, t, f in rows:
        lines.append((title, str(nw), f"{t:,.0f}" if t else "n/a", f"{f:,.0f}",
                      f"{f / t:.2f}x" if t else "n/a"))
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(header)]

    def join(cells):
        return "  ".join(c.ljust(w) if i < 2 else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths)))

    rule = ["-" * w for w in widths]
    return "\n".join([join(header), join(rule)] + [join(line) for line in lines])


def main(argv=None):
    args = parse_args(argv)
    kinds = loader_kinds()
    names = ["images", "fixed", "numpy", "text"] if args.workload == "all" else [args.workload]
    datasets = {"fixed": FixedArrays(args.samples), "numpy": NumpyWork(args.work_samples),
                "text": PythonTokenizer(args.text_samples)}
    torchvision = import_torchvision() if "images" in names and torch is not None else None

    torch_version = torch.__version__ if torch is not None else "not installed"
    print(f"fastload {fastload.__version__}, torch {torch_version}, NumPy {np.__version__}, "
          f"Python {platform.python_version()}; {os.cpu_count()} CPUs ({cpu_model()})")
    if torch is None:
        print("torch is not installed: running fastload alone, with NumPy batches "
              "(pip install torch to see the comparison).")
    print(f"Batch size {args.batch_size}; each configuration runs {args.repeat} time(s) per loader, "
          f"alternating; samples/s is the median.  {load_average()}.\n")

    rows = []
    measured = {}
    for name in names:
        if name == "images":
            image_rows = run_images(args, kinds, torchvision)
            rows += image_rows
            if image_rows:
                measured[name] = ""
            continue
        dataset = datasets[name]
        title, what = WORKLOADS[name]
        expected = (len(dataset), dataset.expected_checksum(range(len(dataset))))
        measured[name] = ""
        if name in ("numpy", "text"):
            measured[name] = f"{dataset.time_per_item() * 1e3:.2f} ms per sample measured here"
        extra = f", {measured[name]}" if measured[name] else ""
        print(f"{title} ({len(dataset)} samples): {what}{extra}", file=sys.stderr)
        for nw in args.workers:
            loaders = {kind: make_loader(kind, dataset, nw, args.batch_size) for kind in kinds}
            times = {kind: [] for kind in kinds}
            for _ in range(args.repeat):
                for kind in kinds:
                    # A few untimed batches first: first-use costs, and the
                    # copy-on-write page faults that torch's forked workers
                    # leave on this process's memory, are not the next
                    # loader's to pay.
                    warm_up(loaders[kind])
                    times[kind].append(run_once(kind, loaders[kind], dataset, nw, expected))
            rate = {kind: len(dataset) / statistics.median(ts) for kind, ts in times.items()}
            rows.append((title, nw, rate.get("torch"), rate["fastload"]))
            del loaders
        print(file=sys.stderr)

    print("All batches checked: every sample arrived (checksums match where the data is "
          f"not randomly augmented).  {load_average()}.\n")
    print(format_table(rows))
    print()
    for name in measured:
        title, what = WORKLOADS[name]
        print(f"{title}: {what}" + (f"; {measured[name]}." if measured[name] else "."))
        if name == "images":
            for kind, runs in image_pipelines(torchvision, args.decode).items():
                if kind in kinds:
                    print(f"  {kind}: {runs}.")
        if name == "text" and torch is not None:
            print("  both loaders run this dataset in worker processes (fastload's "
                  "worker_mode='auto'); worker threads would take turns on one GIL.")
    if torch is not None:
        print("\nspeed-up = fastload samples/s / torch samples/s, same process, same data.  "
              "Full benchmarks: benchmarks/images_bench.py, compare.py, arrays_bench.py "
              "(see docs/benchmarks.md).")


if __name__ == "__main__":
    main()
