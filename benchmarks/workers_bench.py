"""Python datasets in worker processes: torch against fastload's process
and thread workers, interleaved in one process.

    python benchmarks/workers_bench.py            # full sizes, about 5 minutes
    python benchmarks/workers_bench.py --quick    # small sizes, a smoke run

Three user-written map-style datasets, each loaded at batch 64 with
``num_workers`` 2 and 1, ``persistent_workers=True``, default collation:

* ``TextTokens``: ``__getitem__`` tokenises a generated text line in pure
  Python (lower-casing, ``split``, punctuation stripped, vocabulary ``dict``
  look-ups, characters as pieces for unknown words) and returns a fixed-
  length int64 array of token ids and a label.  It holds the GIL all along,
  so thread workers cannot run it in parallel;
* ``PilImages``: ``__getitem__`` opens a generated photo-like JPEG
  (benchmarks/imagenet_like.py) with Pillow, resizes its short side to 256,
  crops the centre 224x224 and returns it as a uint8 ``(3, 224, 224)`` array
  and its class: the usual hand-written image dataset;
* ``LargeArrays``: a fresh float32 ``(3, 224, 224)`` array per sample, made
  with one vectorised add (``workloads.FixedArrays`` at that size).  Making
  a sample costs little, so handing 37 MiB batches from the workers to the
  consumer dominates.

Each runs through three loaders: torch's ``DataLoader``; fastload's with
``worker_mode="process"`` (workers are processes, as torch's, and collate
into shared slots that the parent maps once and reuses); and fastload's with
``worker_mode="thread"`` (C worker threads, which take the GIL to call the
dataset).  Every configuration runs torch, fastload-process, fastload-thread,
torch, ... in this process (``compare.interleave``); each loader's first
epoch, which starts its persistent workers, is untimed.  Each loader's
number is the median of its timed epochs (whole epochs, iterator creation
included), ratios are ratios of medians, and the "pairs" columns give the
range of the ratio over the repetitions (adjacent in time).  Every epoch is
checked: its sample count and the exact checksum of every
value against one computed by calling the dataset directly.

Prints a Markdown report on stdout (progress goes to stderr).
"""

import argparse
import gc
import os
import platform
import statistics
import sys
import tempfile
import time

# The checkout this file is in comes first, built in place or not: an
# installed fastload elsewhere must not be what gets measured.
_CHECKOUT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if os.path.isdir(os.path.join(_CHECKOUT, "fastload")):
    sys.path.insert(0, _CHECKOUT)
import fastload  # noqa: E402

import numpy as np

from compare import interleave, load_average, log, summarise, timed_epoch
from workloads import BATCH_SIZE, FixedArrays, _DatasetBase, cpu_model, torch

LOADERS = ("torch", "fastload-process", "fastload-thread")
WORKERS = (2, 1)

FULL = dict(text=4096, images=256, large=768, reps=5)
QUICK = dict(text=2 * BATCH_SIZE + 5, images=BATCH_SIZE + 7, large=BATCH_SIZE + 3, reps=2)


class TextTokens(_DatasetBase):
    """``n`` generated lines of 40-120 words; sample ``i`` is ``(ids, label)``:
    ``ids`` the line's first ``SEQ_LEN`` token ids (int64, ``[CLS]`` first,
    ``[PAD]``-padded), ``label`` the line's topic.  Tokenising is WordPiece-
    like, in pure Python: lower-case, split, strip punctuation, look the word
    up; a word outside the vocabulary is split greedily into the longest
    known pieces (``##``-prefixed after the first).  The GIL is held from
    start to end."""

    SEQ_LEN = 192
    VOCAB_WORDS = 2000
    OOV_WORDS = 1000  # words in the text but not in the vocabulary
    NUM_CLASSES = 4
    PAD, UNK, CLS = 0, 1, 2

    def __init__(self, n, seed=0):
        self.n = int(n)
        rng = np.random.default_rng(seed)
        letters = "abcdefghijklmnopqrstuvwxyz"
        alphabet = np.array(list(letters))

        def word():
            return "".join(rng.choice(alphabet, size=int(rng.integers(2, 12))))

        words = list(dict.fromkeys(word() for _ in range(self.VOCAB_WORDS + self.OOV_WORDS)))
        # The vocabulary: frequent words, then every one- and two-letter piece
        # (so any word can be split), as word starts and as "##" continuations.
        pieces = list(letters) + [a + b for a in letters for b in letters]
        entries = words[:self.VOCAB_WORDS] + pieces + ["##" + p for p in pieces]
        self.vocab = {}
        for entry in entries:
            self.vocab.setdefault(entry, self.CLS + 1 + len(self.vocab))
        # Zipf-like word frequencies; about 10% of the words are out of vocabulary.
        weights = 1.0 / np.arange(1, len(words) + 1)
        weights[self.VOCAB_WORDS:] = (weights[:self.VOCAB_WORDS].sum() * 0.1
                                      / (len(words) - self.VOCAB_WORDS))
        weights /= weights.sum()
        punctuation = ["", "", "", "", "", "", ",", ".", ";", "!", "?"]
        self.lines, self.labels = [], []
        for _ in range(self.n):
            picks = rng.choice(len(words), size=int(rng.integers(40, 121)), p=weights)
            marks = rng.integers(0, len(punctuation), size=picks.size)
            tokens = [words[p] + punctuation[m] for p, m in zip(picks, marks)]
            tokens[0] = tokens[0].capitalize()
            self.lines.append(" ".join(tokens))
            self.labels.append(int(rng.integers(self.NUM_CLASSES)))

    def __len__(self):
        return self.n

    def word_pieces(self, word):
        """Greedy longest-match split of an unknown word into known pieces."""
        ids, start = [], 0
        while start < len(word):
            for end in range(len(word), start, -1):
                piece = word[start:end] if start == 0 else "##" + word[start:end]
                token = self.vocab.get(piece)
                if token is not None:
                    break
            else:
                return [self.UNK]
            ids.append(token)
            start = end
        return ids

    def tokenize(self, line):
        ids = [self.CLS]
        for word in line.lower().split():
            word = word.strip(".,;:!?")
            token = self.vocab.get(word)
            if token is not None:
                ids.append(token)
            else:
                ids.extend(self.word_pieces(word))
            if len(ids) >= self.SEQ_LEN:
                return ids[:self.SEQ_LEN]
        return ids + [self.PAD] * (self.SEQ_LEN - len(ids))

    def __getitem__(self, index):
        if not 0 <= index < self.n:
            raise IndexError(f"index {index} out of range for {self.n} samples")
        return np.array(self.tokenize(self.lines[index]), dtype=np.int64), self.labels[index]

    def expected_checksum(self, indices):
        """The checksum of these samples, from the dataset called directly."""
        return sum(int(ids.sum()) + label for ids, label in map(self.__getitem__, indices))

    def __repr__(self):
        return f"TextTokens(n={self.n})"


class PilImages(_DatasetBase):
    """The JPEGs of an ImageFolder-style ``root``; sample ``i`` is the image
    decoded by Pillow, short side resized to ``RESIZE``, centre ``CROP`` x
    ``CROP`` crop, as a uint8 ``(3, CROP, CROP)`` array, and its class."""

    RESIZE, CROP = 256, 224

    def __init__(self, root):
        import pil_pipeline

        self.root = root
        _, class_to_idx = pil_pipeline.find_classes(root)
        self.samples = pil_pipeline.make_dataset(root, class_to_idx)
        self._resize = pil_pipeline.Resize(self.RESIZE)
        self._crop = pil_pipeline.CenterCrop(self.CROP)
        self._checksums = {}  # index -> checksum, filled by expected_checksum

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, index):
        from PIL import Image

        path, label = self.samples[index]
        with Image.open(path) as img:
            img = self._crop(self._resize(img.convert("RGB")))
        return np.ascontiguousarray(np.asarray(img).transpose(2, 0, 1)), label

    def expected_checksum(self, indices):
        """The checksum of these samples, from the dataset called directly
        (once per sample: decoding is deterministic)."""
        total = 0
        for i in indices:
            if i not in self._checksums:
                image, label = self[i]
                self._checksums[i] = int(image.sum(dtype=np.int64)) + label
            total += self._checksums[i]
        return total

    def __repr__(self):
        return f"PilImages({len(self)} JPEGs)"


class LargeArrays(FixedArrays):
    """``FixedArrays`` with ImageNet-sized float32 samples, ``(3, 224, 224)``
    (588 KiB each, 37 MiB a batch of 64)."""

    SHAPE = (3, 224, 224)

    def __repr__(self):
        return f"LargeArrays(n={self.n})"


def make_loader(kind, dataset, num_workers):
    """One of LOADERS with the same arguments: batch 64, sequential order,
    default collation, persistent workers, the rest at defaults."""
    common = dict(batch_size=BATCH_SIZE, num_workers=num_workers, persistent_workers=True)
    if kind == "torch":
        return torch.utils.data.DataLoader(dataset, **common)
    mode = kind.split("-", 1)[1]
    return fastload.DataLoader(dataset, worker_mode=mode, **common)


def time_per_item(dataset, samples=64):
    """Median seconds per ``__getitem__`` call here (the main process)."""
    n = min(samples, len(dataset))
    times = []
    for _ in range(3):
        start = time.perf_counter()
        for i in range(n):
            dataset[i]
        times.append((time.perf_counter() - start) / n)
    return statistics.median(times)


def _thread_cpu_seconds(pid):
    """CPU time of all the threads of process ``pid`` (nanosecond schedstat
    counters), or None when the process is gone or the kernel lacks them."""
    total = 0
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return total / 1e9


def tree_cpu_seconds():
    """CPU time used so far by this process and its live descendants (the
    loaders' worker processes), or None where /proc cannot tell.  Summed
    over a measurement it is what the loader cost, whatever share of the
    machine the scheduler gave it: on a shared machine the robust number."""
    total, stack = 0.0, [os.getpid()]
    while stack:
        pid = stack.pop()
        cpu = _thread_cpu_seconds(pid)
        if cpu is None:
            if pid == os.getpid():
                return None
            continue  # exited meanwhile
        total += cpu
        try:
            for tid in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    stack.extend(int(child) for child in f.read().split())
        except OSError:
            continue
    return total


def run_dataset(dataset, reps, workers=WORKERS):
    """Rows ``(name, num_workers, {kind: samples/s}, {kind: (ratio, lo, hi)},
    {kind: CPU seconds per sample or None})`` for each worker count; ratios
    are fastload's speed over torch's."""
    expected = (len(dataset), dataset.expected_checksum(range(len(dataset))))
    rows = []
    for nw in workers:
        loaders = {kind: make_loader(kind, dataset, nw) for kind in LOADERS}
        cpu = {kind: [] for kind in LOADERS}
        warm = set()

        def first_epoch(kind):
            # Untimed, before a loader's first timed epoch only: its workers
            # start (and fork) here, never again, so no later measurement
            # pays for another loader's fork.  A whole epoch, so that none
            # of its batches are still in flight when the timed one starts.
            if kind not in warm:
                timed_epoch(loaders[kind], expected)
                warm.add(kind)

        def measure(kind):
            before = tree_cpu_seconds()
            elapsed = timed_epoch(loaders[kind], expected)
            after = tree_cpu_seconds()
            if before is not None and after is not None:
                cpu[kind].append(after - before)
            return elapsed

        times = interleave(measure, f"{dataset!r} num_workers={nw}", reps, prepare=first_epoch,
                           kinds=LOADERS)
        speeds, ratios, cpu_per_sample = {}, {}, {}
        for kind in LOADERS:
            med, lo, hi = summarise(times, against=kind)
            speeds[kind] = len(dataset) / med[kind]
            ratios[kind] = (med["torch"] / med[kind], lo, hi)
            cpu_per_sample[kind] = statistics.median(cpu[kind]) / len(dataset) if cpu[kind] else None
        rows.append((type(dataset).__name__, nw, speeds, ratios, cpu_per_sample))
        del loaders
        gc.collect()
    return rows


def make_images(root, n_images):
    """The generated JPEG folder (imagenet_like: photo-like, short side
    200-600 px, 10 classes); made once per size and kept under ``root``."""
    import imagenet_like

    return imagenet_like.make_image_folder(os.path.join(root, f"imagenet-like-{n_images}"),
                                           n_images=n_images)


def report(sizes, rows, per_item, load_before, wall):
    out = [
        f"Machine: {os.cpu_count()} CPUs ({cpu_model()}), Python {platform.python_version()}, "
        f"torch {torch.__version__}, NumPy {np.__version__}, fastload {fastload.__version__}.",
        f"Load average before/after: {load_before} / {load_average()}; run took {wall:.0f} s.",
        f"Batch {BATCH_SIZE}, sequential order, default collation, persistent workers; "
        f"{sizes['reps']} epochs per loader, interleaved; medians.  Per sample in the main "
        "process: " + ", ".join(f"{name} {sec * 1e3:.3f} ms" for name, sec in per_item.items())
        + f"; samples per epoch: TextTokens {sizes['text']}, PilImages {sizes['images']}, "
        f"LargeArrays {sizes['large']}.",
        "",
        "| dataset | num_workers | torch samples/s | fastload-process samples/s "
        "| fastload-thread samples/s | process/torch | pairs | thread/torch | pairs |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, nw, speeds, ratios, _ in rows:
        cells = [name, str(nw)] + [f"{speeds[kind]:,.0f}" for kind in LOADERS]
        for kind in LOADERS[1:]:
            ratio, lo, hi = ratios[kind]
            cells += [f"**{ratio:.2f}x**", f"{lo:.2f}-{hi:.2f}"]
        out.append("| " + " | ".join(cells) + " |")
    out += [
        "",
        "CPU time per sample, all threads of this process and of the worker processes during "
        "the timed epochs (medians; the consumer's checksum included, the same for every "
        "loader): what each loader cost, whatever share of the machine it got.",
        "",
        "| dataset | num_workers | torch µs | fastload-process µs | fastload-thread µs "
        "| process/torch | thread/torch |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, nw, _, _, cpu in rows:
        if cpu["torch"] is None:
            out.append(f"| {name} | {nw} | n/a | n/a | n/a | n/a | n/a |")
            continue
        cells = [name, str(nw)] + [f"{cpu[kind] * 1e6:,.1f}" for kind in LOADERS]
        cells += [f"{cpu[kind] / cpu['torch']:.2f}" for kind in LOADERS[1:]]
        out.append("| " + " | ".join(cells) + " |")
    print("\n".join(out))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    parser.add_argument("--reps", type=int, help="epochs per loader and configuration")
    parser.add_argument("--data", default=os.environ.get("FASTLOAD_BENCH_DATA",
                                                         os.path.join(tempfile.gettempdir(),
                                                                      "fastload-bench")),
                        help="where the JPEGs are generated (and kept)")
    args = parser.parse_args(argv)
    if torch is None:
        parser.error("torch is not installed: there is nothing to compare with")
    sizes = dict(QUICK if args.quick else FULL)
    if args.reps:
        sizes["reps"] = args.reps
    torch.set_num_threads(1)  # the main process only consumes; workers are single-threaded

    log("generating the datasets")
    datasets = [TextTokens(sizes["text"]),
                PilImages(make_images(args.data, sizes["images"])),
                LargeArrays(sizes["large"])]
    per_item = {type(ds).__name__: time_per_item(ds) for ds in datasets}
    load_before = load_average()
    wall = time.perf_counter()
    rows = []
    for dataset in datasets:
        rows += run_dataset(dataset, sizes["reps"])
    wall = time.perf_counter() - wall
    if sys.stderr.isatty():
        sys.stderr.write("\r\033[2K")
    report(sizes, rows, per_item, load_before, wall)


if __name__ == "__main__":
    main()
