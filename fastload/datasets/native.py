"""The native batch path, in one place.

fastload's own datasets (``ImageFiles``/``ImageFolder``, ``ArrayDataset``,
``TokenDataset``, the format datasets over them, and ``LMDBDataset``'s raw
records) each hold a *native source*: a ``_C`` object that turns an
index array into a collated batch in plain C (``source.batch(indices, pool,
convert, seed, epoch)``).  A dataset exposes it through one method::

    dataset._native_source(uint8=False) -> source or None

(None when its transform or target_transform needs Python per sample;
``uint8=True`` asks for the same crops as uint8, for normalisation on the
device).  A loader takes the native path when the dataset has a source, is
map-style and collates with the default rules, which the source reproduces.

On that path thread workers run each batch in C without the GIL (the
engine's native jobs); ``num_workers=0`` and worker processes call
``batch()`` through a ``NativeBatches``.

A dataset whose source's arrays are filled part by part, when first needed
(a ``WebDataset`` read from index files loads each shard so), also has::

    dataset._ready(indices)

which loads the parts those samples lie in.  The loader calls it with each
batch's indices before the source reads them: in the process that draws
the indices (thread workers share its arrays), and in a ``NativeBatches``
(a worker process has its own copy).

A dataset whose samples must first be brought onto the node (a
``WebDataset`` over URLs: its shards into the node cache) also has::

    dataset._fetch(indices)

which brings them and keeps them there while the batch may be read.  The
loader calls it where the indices are drawn whenever ``_ready`` is not
called there (worker processes: a process forked from one that ran the
object-store client cannot run it), before the batch is handed out.

Both take ``timeout=`` (seconds): a loader with a ``timeout`` passes its
own, and the call raises ``TimeoutError`` naming what it waited for (a
shard's URL) when the samples are not there by then; the loader raises
torch's timeout error with that message.
"""

__all__ = ["NativeBatches", "SourceOwner", "fetcher", "readier", "source_of"]


def source_of(dataset, uint8=False):
    """The dataset's native source, or None."""
    method = getattr(dataset, "_native_source", None)
    return method(uint8=uint8) if method is not None else None


def readier(dataset):
    """The dataset's ``_ready(indices)``, or None when its source is
    complete from the start."""
    return getattr(dataset, "_ready", None)


def fetcher(dataset):
    """The dataset's ``_fetch(indices)``, or None when its samples are on
    the node from the start."""
    return getattr(dataset, "_fetch", None)


def skip_reporter(dataset):
    """What takes the records of samples a source replaced (on_error="skip"):
    the dataset's ``_record_skips``, or None."""
    return getattr(dataset, "_record_skips", None)


class SourceOwner:
    """A dataset holding native sources (``_C`` objects made from its other
    attributes by ``_make_sources()``, named in ``_sources``): they are not
    pickled, so a copy (a spawned worker process's) makes its own."""

    _sources = ("_source",)

    def __getstate__(self):
        state = self.__dict__.copy()
        for name in self._sources:
            del state[name]
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._make_sources()


class NativeBatches:
    """``(indices, epoch, number) -> batch`` over a native source, on the
    calling thread; skipped-sample records go to ``report``; ``mix``
    (MixUp/CutMix) runs in the batch job, keyed by the batch number;
    ``ready``: the dataset's ``_ready``, called with the indices first."""

    __slots__ = ("source", "pool", "convert", "seed", "report", "mix", "ready")

    def __init__(self, source, pool, convert, seed, report=None, mix=None, ready=None):
        self.source = source
        self.pool = pool
        self.convert = convert
        self.seed = seed
        self.report = report
        self.mix = mix  # a MixUp/CutMix plan run on the batch in C, keyed by its number
        self.ready = ready

    def __call__(self, indices, epoch, number=0):
        if self.ready is not None:
            self.ready(indices)
        if self.mix is None:
            batch, skipped = self.source.batch(indices, self.pool, self.convert, self.seed, epoch)
        else:
            batch, skipped = self.source.batch(indices, self.pool, self.convert, self.seed, epoch,
                                               self.mix, number)
        if skipped and self.report is not None:
            self.report(skipped)
        return batch
