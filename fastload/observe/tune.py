"""Sweep ``num_workers`` x ``prefetch_factor`` on your data and recommend one.

    python -m fastload.tune DATASET_SPEC [--batch-size B] [--workers 0,1,2,4]
                            [--prefetch 1,2,4] [--batches N] [--warmup K] [--repeat R]
                            [--worker-mode auto|thread|process] [--transform train|eval]
                            [--plot out.png] [--json out.json]

``DATASET_SPEC`` is a folder of class folders (read as ``fastload.ImageFolder``
with the ImageNet training or evaluation transforms, in C), or
``module:attr`` / ``path/to/file.py:attr`` naming a dataset or a
zero-argument callable returning one.

Each setting iterates ``warmup`` batches, then times ``batches`` more with
nothing done to them: the rate is the loader's own ceiling on this machine,
which a training step only lowers.  The recommendation is the cheapest
setting (fewest workers, then least prefetch) within 5 % of the fastest.

``sweep()`` is the same measurement from Python.  tqdm (the progress bar) and
matplotlib (the plot) are optional: ``pip install "fastload-torch[tune]"``.  Without
tqdm the sweep runs without a bar; without matplotlib only ``plot`` fails.
"""

import argparse
import dataclasses
import gc
import importlib
import importlib.util
import json
import os
import statistics
import sys
from time import perf_counter

__all__ = ["TuneReport", "TuneRow", "default_workers", "load_dataset", "recommend", "sweep"]

TOLERANCE = 0.05  # a setting this close to the fastest counts as fast enough
DEFAULT_PREFETCH = (1, 2, 4)
INSTALL_HINT = 'pip install "fastload-torch[tune]"'
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class SpecError(ValueError):
    """A DATASET_SPEC that names no dataset."""


@dataclasses.dataclass(frozen=True)
class TuneRow:
    """One measured setting.  ``prefetch_factor`` is None with no workers,
    where prefetching does not apply."""

    num_workers: int
    prefetch_factor: "int | None"
    samples_per_s: float
    samples: int       # samples in the timed batches
    batches: int       # timed batches (after the warm-up)
    seconds: float     # perf_counter() over the timed batches

    def setting(self):
        if self.prefetch_factor is None:
            return f"num_workers={self.num_workers}"
        return f"num_workers={self.num_workers}, prefetch_factor={self.prefetch_factor}"

    def as_dict(self):
        return dataclasses.asdict(self)


def _cost(row):
    """What a setting costs: workers first (CPU cores, memory), then the
    batches held in flight."""
    return (row.num_workers, row.prefetch_factor or 0)


def recommend(rows, tolerance=TOLERANCE):
    """``(recommended, best, reason)`` for measured rows.

    ``best`` is the fastest row; ``recommended`` the cheapest row (fewest
    workers, then least prefetch) whose rate is within ``tolerance`` of the
    best; ``reason`` says why in one sentence.
    """
    rows = list(rows)
    if not rows:
        raise ValueError("recommend() needs at least one measured row")
    best = max(rows, key=lambda r: (r.samples_per_s, [-c for c in _cost(r)]))
    floor = (1.0 - tolerance) * best.samples_per_s
    chosen = min((r for r in rows if r.samples_per_s >= floor), key=_cost)
    percent = f"{tolerance * 100:g} %"
    if chosen is best:
        reason = (f"it is the fastest setting ({best.samples_per_s:,.0f} samples/s) and no "
                  f"cheaper one comes within {percent} of it.")
    else:
        ratio = chosen.samples_per_s / best.samples_per_s if best.samples_per_s else 1.0
        reason = (f"it reaches {ratio:.0%} of the fastest setting ({best.setting()}, "
                  f"{best.samples_per_s:,.0f} samples/s), within {percent}, with fewer "
                  f"{'workers' if chosen.num_workers < best.num_workers else 'batches in flight'}.")
    return chosen, best, reason


class TuneReport:
    """The rows of a sweep, the fastest and the recommended setting.

    ``str(report)`` is the table and the recommendation; ``as_dict()`` is
    what ``--json`` writes; ``plot(path)`` draws samples/s against workers
    (needs matplotlib).
    """

    def __init__(self, rows, *, batch_size=None, batches=None, warmup=None, repeat=1, cpus=None,
                 tolerance=TOLERANCE):
        self.rows = list(rows)
        self.recommended, self.best, self.reason = recommend(self.rows, tolerance)
        self.tolerance = tolerance
        self.batch_size = batch_size
        self.batches = batches
        self.warmup = warmup
        self.repeat = repeat
        self.cpus = cpus

    def table(self):
        header = ("workers", "prefetch", "samples/s", "vs best")
        lines = []
        for row in self.rows:
            ratio = row.samples_per_s / self.best.samples_per_s if self.best.samples_per_s else 0.0
            mark = " <- recommended" if row is self.recommended else ""
            mark += " (best)" if row is self.best else ""
            lines.append((str(row.num_workers),
                          "-" if row.prefetch_factor is None else str(row.prefetch_factor),
                          f"{row.samples_per_s:,.1f}", f"{ratio:.2f}", mark))
        widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(header)]
        out = ["  ".join(h.rjust(w) for h, w in zip(header, widths))]
        out += ["  ".join(c.rjust(w) for c, w in zip(line[:4], widths)) + line[4] for line in lines]
        return "\n".join(out)

    def __str__(self):
        return (f"{self.table()}\n\nRecommended: {self.recommended.setting()}: {self.reason}")

    def __repr__(self):
        return (f"<TuneReport {len(self.rows)} settings, recommended "
                f"{self.recommended.setting()}>")

    def as_dict(self):
        return {
            "batch_size": self.batch_size,
            "batches": self.batches,
            "warmup": self.warmup,
            "repeat": self.repeat,
            "cpus": self.cpus,
            "tolerance": self.tolerance,
            "rows": [row.as_dict() for row in self.rows],
            "best": self.best.as_dict(),
            "recommended": self.recommended.as_dict(),
            "reason": self.reason,
        }

    def plot(self, path):
        """Write a PNG of samples/s against workers, one line per prefetch
        factor, the recommendation marked.  Needs matplotlib."""
        try:
            from matplotlib.backends.backend_agg import FigureCanvasAgg
            from matplotlib.figure import Figure
        except ImportError as e:
            raise ImportError(f"TuneReport.plot needs matplotlib: {INSTALL_HINT} "
                              f"(or pip install matplotlib)") from e
        # A Figure on its own Agg canvas leaves pyplot's global backend and
        # figures alone (the caller may be in a notebook).
        fig = Figure(figsize=(7, 4.5), dpi=100)
        FigureCanvasAgg(fig)
        ax = fig.add_subplot()
        serial = [r for r in self.rows if r.prefetch_factor is None]
        for prefetch in sorted({r.prefetch_factor for r in self.rows} - {None}):
            line = sorted((r for r in self.rows if r.prefetch_factor == prefetch),
                          key=lambda r: r.num_workers)
            ax.plot([r.num_workers for r in line], [r.samples_per_s for r in line],
                    marker="o", label=f"prefetch_factor={prefetch}")
        if serial:
            ax.plot([r.num_workers for r in serial], [r.samples_per_s for r in serial],
                    linestyle="none", marker="s", color="black", label="num_workers=0 (no prefetch)")
        ax.axhline((1.0 - self.tolerance) * self.best.samples_per_s, color="grey",
                   linestyle=":", linewidth=1,
                   label=f"{1.0 - self.tolerance:.0%} of best")
        rec = self.recommended
        ax.plot([rec.num_workers], [rec.samples_per_s], linestyle="none", marker="*",
                markersize=18, markerfacecolor="none", markeredgecolor="red",
                markeredgewidth=1.5, label=f"recommended: {rec.setting()}")
        ax.set_xticks(sorted({r.num_workers for r in self.rows}))
        ax.set_xlabel("num_workers")
        ax.set_ylabel("samples/s (no compute)")
        ax.set_ylim(0, 1.12 * self.best.samples_per_s)  # room for the marker above the best
        title = "fastload.tune"
        if self.batch_size is not None:
            title += f": batch_size={self.batch_size}"
        if self.cpus is not None:
            title += f", {self.cpus} usable CPUs"
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small", loc="lower right")
        fig.tight_layout()
        fig.savefig(os.fspath(path), format="png")


# ------------------------------------------------------------------ the sweep

def usable_cpus():
    """This rank's CPUs (its share of the node, fastload/loader/node.py), as
    the DataLoader's worker-count warning counts them."""
    from ..loader import node
    return node.rank_cores()


def default_workers(cpus=None):
    """0, 1, 2, 4, 8, ... up to ``cpus`` (the usable CPU count), and ``cpus``
    itself: more workers than CPUs only take turns."""
    cpus = usable_cpus() if cpus is None else cpus
    ladder = [0]
    n = 1
    while n <= cpus:
        ladder.append(n)
        n *= 2
    if ladder[-1] != cpus and cpus > 0:
        ladder.append(cpus)
    return tuple(ladder)


def _settings(workers, prefetch):
    """The (num_workers, prefetch_factor) pairs to measure, cheapest first.

    A setting the DataLoader chooses itself (such as a future
    ``num_workers="auto"``) would be one more entry here, measured as the
    others and reported in its own row.
    """
    settings = []
    for w in sorted(set(workers)):
        if w == 0:
            settings.append((0, None))  # prefetching needs workers
        else:
            settings.extend((w, p) for p in sorted(set(prefetch)))
    return settings


def _is_dataset(obj):
    """Map-style (indexable and sized) or iterable, as a DataLoader takes it."""
    return ((hasattr(obj, "__getitem__") and hasattr(obj, "__len__"))
            or hasattr(obj, "__iter__")) and not isinstance(obj, (str, bytes, type))


def _leading_dim(batch):
    """The batch dimension of the first array in a collated batch, or None."""
    shape = getattr(batch, "shape", None)
    if shape is not None:
        return int(shape[0]) if len(shape) else None
    if isinstance(batch, dict):
        batch = list(batch.values())
    if isinstance(batch, (list, tuple)):
        for item in batch:
            n = _leading_dim(item)
            if n is not None:
                return n
        return len(batch) if batch and isinstance(batch, list) else None
    return None


def _samples_in(batch, loader):
    if getattr(loader, "batch_size", None) is None and getattr(loader, "batch_sampler", None) is None:
        return 1  # batch_size=None: each item is one sample
    n = _leading_dim(batch)
    return n if n is not None else (getattr(loader, "batch_size", None) or 1)


def _tqdm():
    """tqdm's bar class, or None when tqdm is not installed."""
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    return tqdm


def _progress_bar(total, enabled):
    """A tqdm bar on stderr; None without tqdm or when not wanted."""
    bar = _tqdm() if enabled else None
    if bar is None:
        return None
    return bar(total=total, file=sys.stderr, unit="batch", dynamic_ncols=True, leave=False)


def _measure(loader, warmup, batches, bar):
    """Iterate ``warmup`` batches, then time the next ``batches``: from just
    after the last warm-up batch arrives (from the start, without warm-up)
    to just after the last timed one arrives, before the iterator is shut
    down.  An epoch too short for them is followed by the next one; its start
    is timed too, as a training loop pays it."""
    total = warmup + batches
    done = timed_samples = 0
    start = perf_counter() if warmup == 0 else None
    end = None
    while end is None:
        iterator = iter(loader)
        progressed = False
        for batch in iterator:
            progressed = True
            if done >= warmup:
                timed_samples += _samples_in(batch, loader)
            del batch  # hand the slot back before waiting for the next one
            done += 1
            if done == total:
                end = perf_counter()
                break
            if done == warmup:
                start = perf_counter()
            if bar is not None:
                bar.update(1)
        del iterator
        if not progressed:
            raise ValueError("the loader yielded no batch: nothing to measure")
    if bar is not None:
        bar.update(1)
    return timed_samples, end - start


def sweep(dataset_or_loader_factory, *, batch_size=64, workers=None, prefetch=DEFAULT_PREFETCH,
          batches=30, warmup=5, repeat=1, progress=True, **loader_kwargs):
    """Measure the loader's samples/s for each (num_workers, prefetch_factor).

    ``dataset_or_loader_factory`` is a dataset, given to
    ``fastload.DataLoader(dataset, batch_size, num_workers=w,
    prefetch_factor=p, shuffle=True, **loader_kwargs)``, or a callable
    ``factory(num_workers=w, prefetch_factor=p)`` returning a loader (any
    iterable of batches; ``prefetch_factor`` is None for ``w == 0``).
    ``workers`` defaults to ``default_workers()``, which never exceeds the
    usable CPU count; ``prefetch`` applies to ``w > 0`` only, so ``w == 0``
    gives one row.  Each setting iterates ``warmup`` batches, then times
    ``batches`` more with ``time.perf_counter`` and nothing done to them;
    with ``repeat=R`` the settings are measured in R rounds, one after the
    other in each, and a row's rate is the median of its rounds (its
    ``samples``, ``batches`` and ``seconds`` are the rounds' totals).
    Each loader and iterator is dropped (and garbage collected) before the
    next setting starts, so workers do not pile up.  ``progress`` shows a
    tqdm bar on stderr when tqdm is installed.  Returns a ``TuneReport``.
    """
    workers = default_workers() if workers is None else tuple(workers)
    prefetch = tuple(prefetch)
    if batches < 1 or warmup < 0 or repeat < 1:
        raise ValueError(f"batches and repeat must be at least 1 and warmup at least 0, "
                         f"got batches={batches}, repeat={repeat}, warmup={warmup}")
    if not workers or any(not isinstance(w, int) or w < 0 for w in workers):
        raise ValueError(f"workers must be non-negative ints, got {workers!r}")
    if any(w > 0 for w in workers) and (
            not prefetch or any(not isinstance(p, int) or p < 1 for p in prefetch)):
        raise ValueError(f"prefetch must be positive ints, got {prefetch!r}")

    from_dataset = _is_dataset(dataset_or_loader_factory)
    if from_dataset:
        make_loader = _dataset_loader(dataset_or_loader_factory, batch_size, loader_kwargs)
    elif callable(dataset_or_loader_factory):
        if loader_kwargs:
            raise TypeError(f"loader arguments {sorted(loader_kwargs)} apply to a dataset; "
                            f"a loader factory builds its own loader")
        make_loader = dataset_or_loader_factory
    else:
        raise TypeError(f"sweep() takes a dataset or a loader factory, got "
                        f"{type(dataset_or_loader_factory).__name__}")

    settings = _settings(workers, prefetch)
    bar = _progress_bar(repeat * len(settings) * (warmup + batches), progress)
    runs = {setting: [] for setting in settings}  # (samples, seconds) per round
    try:
        # Rounds go through every setting in turn, so that a burst of load
        # from another process is shared out rather than landing on one row.
        for _ in range(repeat):
            for w, p in settings:
                if bar is not None:
                    bar.set_description(f"workers={w} prefetch={'-' if p is None else p}")
                loader = make_loader(num_workers=w, prefetch_factor=p)
                try:
                    runs[w, p].append(_measure(loader, warmup, batches, bar))
                finally:
                    del loader
                    gc.collect()  # join this setting's workers before the next starts
    finally:
        if bar is not None:
            bar.close()
    rows = []
    for (w, p), measured in runs.items():
        rate = statistics.median(n / t if t > 0 else float("inf") for n, t in measured)
        rows.append(TuneRow(w, p, rate, sum(n for n, _ in measured), repeat * batches,
                            sum(t for _, t in measured)))
    return TuneReport(rows, batch_size=batch_size if from_dataset else None, batches=batches,
                      warmup=warmup, cpus=usable_cpus(), repeat=repeat)


def _dataset_loader(dataset, batch_size, loader_kwargs):
    from .. import DataLoader
    from ..datasets.base import is_iterable_dataset

    kwargs = dict(loader_kwargs)
    for name in ("num_workers", "prefetch_factor"):
        if name in kwargs:
            raise TypeError(f"{name} is what sweep() varies; pass workers= / prefetch= instead")
    custom_order = (is_iterable_dataset(dataset)
                    or any(k in kwargs for k in ("sampler", "batch_sampler")))
    if not custom_order:
        kwargs.setdefault("shuffle", True)  # as training reads: random files, not in order
    if "batch_sampler" not in kwargs:
        kwargs["batch_size"] = batch_size

    def make(num_workers, prefetch_factor):
        return DataLoader(dataset, num_workers=num_workers, prefetch_factor=prefetch_factor,
                          **kwargs)

    return make


# ------------------------------------------------------------------ the CLI

def image_transform(kind):
    """The standard ImageNet recipe in fastload's C transforms: ``"train"``
    (RandomResizedCrop(224), flip) or ``"eval"`` (Resize(256),
    CenterCrop(224)), then ToTensor and Normalize."""
    from .. import transforms as T

    if kind == "train":
        head = [T.RandomResizedCrop(224), T.RandomHorizontalFlip()]
    elif kind == "eval":
        head = [T.Resize(256), T.CenterCrop(224)]
    else:
        raise ValueError(f"transform must be 'train' or 'eval', got {kind!r}")
    return T.Compose([*head, T.ToTensor(), T.Normalize(IMAGENET_MEAN, IMAGENET_STD)])


def _import_file(path):
    name = "_fastload_tune_" + "".join(c if c.isalnum() else "_" for c in
                                       os.path.splitext(os.path.basename(path))[0])
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None:
        raise SpecError(f"{path!r} cannot be imported as a Python file")
    module = importlib.util.module_from_spec(spec)
    # Registered so that process workers (fork) and pickling find its classes.
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def load_dataset(spec, transform="train"):
    """The dataset a DATASET_SPEC names.

    A folder: ``fastload.ImageFolder(spec, transform=image_transform(transform))``.
    ``module:attr`` or ``path/to/file.py:attr``: that object (a dotted attr
    is followed), called with no arguments when it is not a dataset itself.
    Raises ``SpecError`` (a ValueError) saying what is wrong.
    """
    if os.path.isdir(spec):
        from .. import ImageFolder

        try:
            return ImageFolder(spec, transform=image_transform(transform))
        except FileNotFoundError as e:
            raise SpecError(f"{spec!r} is not an image folder: {e}") from None
    where, sep, attr = spec.rpartition(":")
    if not sep or not where or not attr:
        if os.path.exists(spec):
            raise SpecError(f"{spec!r} is not a directory; name a dataset in a file as "
                            f"'{spec}:NAME'")
        raise SpecError(f"{spec!r}: no such directory, and not of the form module:attr or "
                        f"path/to/file.py:attr")
    if where.endswith(".py") or os.sep in where:
        if not os.path.isfile(where):
            raise SpecError(f"{spec!r}: no such Python file {where!r}")
        module = _import_file(where)
    else:
        try:
            module = importlib.import_module(where)
        except ImportError as e:
            raise SpecError(f"{spec!r}: cannot import module {where!r}: {e}") from None
    obj = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise SpecError(f"{spec!r}: {where!r} has no attribute {attr!r}") from None
    if _is_dataset(obj):
        return obj
    if not callable(obj):
        raise SpecError(f"{spec!r} is of type {type(obj).__name__}: not a dataset (an object "
                        f"with __getitem__ and __len__, or __iter__) nor a callable returning one")
    try:
        dataset = obj()
    except TypeError as e:
        raise SpecError(f"{spec!r}: calling it with no arguments failed: {e}") from None
    if not _is_dataset(dataset):
        raise SpecError(f"{spec!r}() returned an object of type {type(dataset).__name__}: not "
                        f"a dataset (an object with __getitem__ and __len__, or __iter__)")
    return dataset


def _int_list(text):
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}")
    if not values:
        raise argparse.ArgumentTypeError("expected at least one integer")
    return values


def _parser():
    parser = argparse.ArgumentParser(
        prog="python -m fastload.tune",
        description="Measure fastload.DataLoader's samples/s on a dataset for each "
                    "(num_workers, prefetch_factor) and recommend the cheapest setting within "
                    "5 % of the fastest.")
    parser.add_argument("dataset", metavar="DATASET_SPEC",
                        help="an image folder (class folders of images), or module:attr or "
                             "path/to/file.py:attr naming a dataset or a zero-argument callable "
                             "returning one")
    parser.add_argument("--batch-size", type=int, default=64, help="default: 64")
    parser.add_argument("--workers", type=_int_list,
                        help="comma-separated worker counts (default: 0, 1, 2, 4, ... up to the "
                             f"{usable_cpus()} usable CPUs)")
    parser.add_argument("--prefetch", type=_int_list, default=DEFAULT_PREFETCH,
                        help="comma-separated prefetch factors (default: 1,2,4)")
    parser.add_argument("--batches", type=int, default=30,
                        help="batches timed per setting, after the warm-up (default: 30)")
    parser.add_argument("--warmup", type=int, default=5,
                        help="batches iterated before timing each setting (default: 5)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="rounds over all settings; each row is the median of its rounds "
                             "(default: 1; more on a busy machine)")
    parser.add_argument("--worker-mode", choices=("auto", "thread", "process"), default="auto",
                        help="DataLoader(worker_mode=...) (default: auto)")
    parser.add_argument("--transform", choices=("train", "eval"), default="train",
                        help="for an image folder: the ImageNet training (RandomResizedCrop, "
                             "flip) or evaluation (Resize, CenterCrop) transforms "
                             "(default: train)")
    parser.add_argument("--plot", metavar="PNG", help="write a plot of the sweep (matplotlib)")
    parser.add_argument("--json", metavar="JSON", help="write the report as JSON")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def main(argv=None):
    parser = _parser()
    args = parser.parse_args(argv)
    if args.batch_size < 1:
        parser.error(f"--batch-size must be at least 1, got {args.batch_size}")
    if args.batches < 1 or args.repeat < 1 or args.warmup < 0:
        parser.error("--batches and --repeat must be at least 1 and --warmup at least 0")
    if args.workers is not None and min(args.workers) < 0:
        parser.error(f"--workers must be non-negative, got {args.workers}")
    if min(args.prefetch) < 1:
        parser.error(f"--prefetch must be positive, got {args.prefetch}")
    if args.plot:
        try:
            importlib.import_module("matplotlib")  # fail before the sweep, not after it
        except ImportError:
            parser.error(f"--plot needs matplotlib: {INSTALL_HINT}")
    if not args.no_progress and _tqdm() is None:
        print(f"(no progress bar: tqdm is not installed; {INSTALL_HINT})", file=sys.stderr)
    try:
        dataset = load_dataset(args.dataset, args.transform)
    except SpecError as e:
        parser.error(str(e))

    report = sweep(dataset, batch_size=args.batch_size, workers=args.workers,
                   prefetch=args.prefetch, batches=args.batches, warmup=args.warmup,
                   repeat=args.repeat, progress=not args.no_progress, worker_mode=args.worker_mode)
    print(f"{args.dataset}: {len(dataset) if hasattr(dataset, '__len__') else '?'} samples, "
          f"batch_size={args.batch_size}, {args.warmup} warm-up + {args.batches} timed batches "
          f"per setting{f' in each of {args.repeat} rounds (median)' if args.repeat > 1 else ''}, "
          f"{report.cpus} usable CPUs, no compute")
    print(report)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"dataset": args.dataset, "worker_mode": args.worker_mode,
                       **report.as_dict()}, f, indent=2)
            f.write("\n")
    if args.plot:
        report.plot(args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
