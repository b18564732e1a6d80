"""HDF5Dataset, ArrowDataset and LMDBDataset against the usual torch wrapper, side by side.

    python benchmarks/formats_bench.py            # 256 MiB of rows per file
    python benchmarks/formats_bench.py --quick    # 8 MiB, a smoke run

Rows of 4 KiB (1024 float32) plus an int64 label, the same content in six
files: an HDF5 file with contiguous datasets, two with chunked,
lzf-compressed datasets (chunks of 4 rows, sized for random access, and of
64 rows, where every random row decodes 256 KiB), an Arrow IPC (Feather v2)
file, a Parquet file, a Zarr v3 group (zarr's default zstd, 64-row chunks)
and an LMDB file (one 4 KiB value a row, key ``str(i)``), read in random
batches and, for Zarr, also in batches of ``ChunkShuffleSampler``'s order
(blocks of 4 chunks: a batch decodes a few chunks), and the HDF5 file of
64-row chunks likewise.  The "-cached" kinds read the 64-row HDF5 file and
the Zarr group with ``cache="memory"`` on fastload's side: the untimed
first epoch stores the rows decoded, the timed ones read them back (torch's
wrapper has no cache: it decodes every epoch).  Random batches of 256
from a warm page cache, the same batches for every loader:

* torch: torch's DataLoader, ``num_workers=2`` (persistent), over the
  dataset a user writes: h5py (or zarr) opened in each worker,
  ``f[key][i]`` per sample; or the table memory-mapped in each worker,
  ``column[i]`` per sample; or the lmdb package in each worker,
  ``txn.get(str(i))`` per sample;
* fastload: ``HDF5Dataset`` / ``ArrowDataset`` (``ArrowDataset.from_parquet``
  for Parquet, whose torch wrapper reads the same table with pyarrow) in
  fastload's DataLoader, ``num_workers=2`` (threads where every column is
  memory-mapped and for Zarr, processes for the chunked HDF5 files);
  ``--zarr-worker-modes`` also times Zarr on both kinds of worker.

Interleaved in this one process, repeated; the machine may be shared, so
only the ratio of medians means much.  Every batch is checked against the
indices drawn.  Prints a Markdown table on stdout.
"""

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import fastload  # noqa: E402

import h5py  # noqa: E402
import lmdb  # noqa: E402
import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.feather as feather  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
import torch  # noqa: E402
import torch.utils.data as tud  # noqa: E402

from workloads import cpu_model  # noqa: E402

try:
    import zarr  # noqa: E402
except ImportError:  # the Zarr cases are left out
    zarr = None

ROW = 1024
BATCH = 256
FULL = dict(rows=65536, batches=60, reps=5)
QUICK = dict(rows=2048, batches=4, reps=1)
KINDS = ("hdf5", "hdf5-chunked-4", "hdf5-chunked-64", "hdf5-chunk-shuffled",
         "hdf5-chunked-64-cached", "arrow", "parquet", "lmdb")
# Zarr v3 (zstd, 64-row chunks): random batches, and batches of
# ChunkShuffleSampler's order (blocks of 4 chunks), the same order for both.
ZARR_KINDS = ("zarr", "zarr-chunk-shuffled", "zarr-cached") if zarr is not None else ()
KINDS += ZARR_KINDS
ZARR_CHUNK_ROWS = 64
# Rows a chunk of the files the "-chunk-shuffled" kinds read (hdf5-chunked-64's, zarr's).
SHUFFLED = {"hdf5-chunk-shuffled": 64, "zarr-chunk-shuffled": ZARR_CHUNK_ROWS}
# Fewer batches where torch takes minutes an epoch.
BATCH_SHARE = {"hdf5-chunked-64": 3, "hdf5-chunked-64-cached": 3}


def row_values(rows, columns=ROW):
    """The first ``columns`` values of each of ``rows`` (the check computes
    4: the full rows would cost more than a fast loader's batch)."""
    return ((rows[:, None] * 131 + np.arange(columns)[None, :]) % 4093).astype(np.float32)


def make_files(root, n):
    os.makedirs(root, exist_ok=True)
    paths = {kind: os.path.join(root, f"rows-{n}.{kind}") for kind in KINDS}
    for kind in ZARR_KINDS:
        paths[kind] = os.path.join(root, f"rows-{n}.zarr")
    paths["hdf5-chunk-shuffled"] = paths["hdf5-chunked-64"]
    paths["hdf5-chunked-64-cached"] = paths["hdf5-chunked-64"]
    if all(os.path.exists(p) for p in paths.values()):
        return paths
    x = row_values(np.arange(n))
    y = np.arange(n, dtype=np.int64)
    with h5py.File(paths["hdf5"], "w") as f:
        f["x"], f["y"] = x, y
    for rows_a_chunk in (4, 64):
        with h5py.File(paths[f"hdf5-chunked-{rows_a_chunk}"], "w") as f:
            f.create_dataset("x", data=x, chunks=(rows_a_chunk, ROW), compression="lzf")
            f.create_dataset("y", data=y, chunks=(min(n, 4096),), compression="lzf")
    table = pa.table({"x": pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), ROW),
                      "y": pa.array(y)})
    feather.write_feather(table, paths["arrow"], compression="uncompressed")
    pq.write_table(table, paths["parquet"], row_group_size=8192)
    if ZARR_KINDS:
        group = zarr.open_group(paths["zarr"], mode="w", zarr_format=3)
        group.create_array("x", data=x, chunks=(ZARR_CHUNK_ROWS, ROW))
        group.create_array("y", data=y, chunks=(min(n, 4096),))
    env = lmdb.open(paths["lmdb"], map_size=2 * x.nbytes + (64 << 20), subdir=False)
    with env.begin(write=True) as txn:
        for i in range(n):
            txn.put(str(i).encode(), x[i].tobytes())
    env.close()
    return paths


class TorchH5(tud.Dataset):
    def __init__(self, path):
        self.path, self.file = path, None
        with h5py.File(path, "r") as f:
            self.n = len(f["y"])

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.file is None:
            self.file = h5py.File(self.path, "r")
        return self.file["x"][i], self.file["y"][i]


class TorchArrow(tud.Dataset):
    def __init__(self, path):
        self.path, self.table = path, None
        self.n = (pq.ParquetFile(path).metadata.num_rows if path.endswith("parquet")
                  else feather.read_table(path, memory_map=True).num_rows)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.table is None:
            self.table = (pq.read_table(self.path) if self.path.endswith("parquet")
                          else feather.read_table(self.path, memory_map=True))
            self.x, self.y = self.table.column("x"), self.table.column("y")
        return np.array(self.x[i].values), self.y[i].as_py()


class TorchZarr(tud.Dataset):
    def __init__(self, path):
        self.path, self.group = path, None
        self.n = zarr.open_group(path, mode="r")["y"].shape[0]

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.group is None:
            self.group = zarr.open_group(self.path, mode="r")
            self.x, self.y = self.group["x"], self.group["y"]
        return self.x[i], self.y[i]


class TorchLMDB(tud.Dataset):
    """The lmdb package in a Dataset, the environment opened in each worker."""

    def __init__(self, path):
        self.path, self.env = path, None
        with lmdb.open(path, readonly=True, lock=False, subdir=False) as env:
            self.n = env.stat()["entries"]

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.env is None:
            self.env = lmdb.open(self.path, readonly=True, lock=False, subdir=False)
        with self.env.begin() as txn:
            return np.frombuffer(txn.get(str(i).encode()), np.float32).copy(), i


def torch_dataset(kind, path):
    if kind.startswith("hdf5"):
        return TorchH5(path)
    if kind.startswith("zarr"):
        return TorchZarr(path)
    return TorchLMDB(path) if kind == "lmdb" else TorchArrow(path)


def fastload_dataset(kind, path):
    # "-cached": the rows decoded kept in a memory cache, filled by the
    # untimed first epoch (the timed ones read the same rows: epoch 2 on).
    cache = dict(cache="memory") if kind.endswith("-cached") else {}
    if kind.startswith("zarr"):
        return fastload.ZarrDataset(path, ("x", "y"), **cache)
    if kind == "lmdb":
        labels = np.arange(TorchLMDB(path).n)  # the label of row i is i, as in the other files
        return fastload.LMDBDataset(path, decode="raw", dtype=np.float32, shape=ROW,
                                    labels=labels)
    if kind.startswith("hdf5"):
        return fastload.HDF5Dataset(path, ("x", "y"), **cache)
    if kind == "parquet":
        return fastload.ArrowDataset.from_parquet(path)
    return fastload.ArrowDataset(path)


class Setup:
    """One loader over one file, iterated over a fixed plan of batches."""

    def __init__(self, kind, path, library, n_rows, batches, seed=0, worker_mode="auto"):
        if kind in SHUFFLED:
            self.plan = fastload.ChunkShuffleSampler(n_rows, SHUFFLED[kind], block=4,
                                                     seed=seed).order()[:batches * BATCH]
        else:
            self.plan = np.random.default_rng(seed).integers(0, n_rows, batches * BATCH)
        sampler = self.plan.tolist()
        if library == "torch":
            dataset = torch_dataset(kind, path)
            self.loader = tud.DataLoader(dataset, batch_size=BATCH, sampler=sampler,
                                         num_workers=2, persistent_workers=True)
        else:
            self.loader = fastload.DataLoader(fastload_dataset(kind, path), batch_size=BATCH,
                                              sampler=sampler, num_workers=2,
                                              persistent_workers=True, worker_mode=worker_mode)

    def epoch(self):
        """Seconds for one pass over the plan, every batch checked."""
        start = time.perf_counter()
        for k, (x, y) in enumerate(self.loader):
            want = self.plan[k * BATCH:(k + 1) * BATCH]
            if not np.array_equal(np.asarray(y), want):
                raise AssertionError(f"batch {k}: wrong rows")
            if not np.array_equal(np.asarray(x[:, :4]), row_values(want, 4)):
                raise AssertionError(f"batch {k}: wrong values")
        return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small files, one repetition")
    parser.add_argument("--dir", default=os.path.join("build", "formats-bench"))
    parser.add_argument("--kinds", nargs="+", choices=KINDS, default=KINDS,
                        help="the files to measure (default all)")
    parser.add_argument("--zarr-worker-modes", action="store_true",
                        help="also time fastload's thread and process workers on the Zarr files")
    args = parser.parse_args()
    size = QUICK if args.quick else FULL
    paths = make_files(args.dir, size["rows"])
    times = {}
    libraries = {kind: ["torch", "fastload"] for kind in args.kinds}
    if args.zarr_worker_modes:
        for kind in set(ZARR_KINDS) & set(args.kinds):
            libraries[kind] += ["fastload-thread", "fastload-process"]
    for kind in args.kinds:
        warm(paths.values())
        batches = max(1, size["batches"] // BATCH_SHARE.get(kind, 1))
        setups = {lib: Setup(kind, paths[kind], lib.split("-")[0], size["rows"], batches,
                             worker_mode=lib.split("-")[1] if "-" in lib else "auto")
                  for lib in libraries[kind]}
        for setup in setups.values():
            setup.epoch()  # workers started, files opened
        for _ in range(size["reps"]):
            for lib, setup in setups.items():
                times.setdefault((kind, lib), []).append(setup.epoch())
                print(f"{kind} {lib}: {times[kind, lib][-1]:.3f} s", file=sys.stderr)
        del setups
    versions = f"torch {torch.__version__}, h5py {h5py.__version__}, pyarrow {pa.__version__}"
    if zarr is not None:
        versions += f", zarr {zarr.__version__}"
    versions += f", lmdb {lmdb.__version__}"
    print(f"Random batches of {BATCH} rows (4 KiB float32 + int64 label) of {size['rows']}, "
          f"{size['batches']} batches an epoch "
          f"({size['batches'] // BATCH_SHARE['hdf5-chunked-64']} for hdf5-chunked-64), median of {size['reps']}; {cpu_model()}, {os.cpu_count()} cores; "
          f"{versions}.\n")
    print("| file | torch DataLoader, 2 workers (samples/s) | fastload, 2 workers (samples/s) "
          "| ratio |")
    print("|---|---:|---:|---:|")
    for kind in args.kinds:
        samples = max(1, size["batches"] // BATCH_SHARE.get(kind, 1)) * BATCH
        t = statistics.median(times[kind, "torch"])
        f = statistics.median(times[kind, "fastload"])
        print(f"| {kind} | {samples / t:,.0f} | {samples / f:,.0f} | {t / f:.1f}x |")
    modes = [kind for kind in args.kinds if (kind, "fastload-thread") in times]
    if modes:
        print("\n| file | fastload, 2 thread workers (samples/s) "
              "| fastload, 2 worker processes (samples/s) |")
        print("|---|---:|---:|")
        for kind in modes:
            samples = size["batches"] * BATCH
            print(f"| {kind} | {samples / statistics.median(times[kind, 'fastload-thread']):,.0f} "
                  f"| {samples / statistics.median(times[kind, 'fastload-process']):,.0f} |")


def warm(paths):
    """Reads the files (and the files of the directories) into the page cache."""
    for path in paths:
        files = ([os.path.join(d, name) for d, _, names in os.walk(path) for name in names]
                 if os.path.isdir(path) else [path])
        for name in files:
            with open(name, "rb") as f:
                while f.read(1 << 24):
                    pass

if __name__ == "__main__":
    main()
