"""ArrowDataset: batches equal to what pyarrow reads for the same rows, from
memory-mapped Arrow IPC (Feather v2) files of one or several record
batches, tables, record batches and Parquet files, with thread and process
workers and the usual samplers; unsupported columns and bad files fail with
messages naming them."""

import pickle
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pa = pytest.importorskip("pyarrow")

import numpy as np  # noqa: E402
import pyarrow.feather as feather  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
import torch.utils.data as tud  # noqa: E402

import fastload  # noqa: E402
from fl_helpers import assert_truncation_is_named, check_parity, fastload_only  # noqa: E402

pytestmark = fastload_only

N = 37


def fixed_list(values, *shape):
    """A (possibly nested) fixed-size list column of rows of ``shape``."""
    array = pa.array(values.reshape(-1))
    for size in reversed(shape):
        array = pa.FixedSizeListArray.from_arrays(array, size)
    return array


def make_table(n=N):
    rng = np.random.default_rng(0)
    return pa.table({
        "image": fixed_list(rng.integers(0, 255, (n, 2, 3, 4), dtype=np.uint8), 2, 3, 4),
        "label": pa.array(rng.integers(0, 10, n)),
        "embedding": fixed_list(rng.standard_normal((n, 5)).astype(np.float32), 5),
        "half": pa.array(rng.standard_normal(n).astype(np.float16)),
        "flag": pa.array(rng.integers(0, 2, n).astype(bool)),
        "name": pa.array([f"row{i}" for i in range(n)]),
    })


NUMERIC = ["image", "label", "embedding", "half", "flag"]


def arrow_rows(table, columns):
    """The columns as pyarrow itself converts them: rows of NumPy arrays."""
    out = []
    for name in columns:
        column = table.column(name).combine_chunks()
        shape = []
        while pa.types.is_fixed_size_list(column.type):
            shape.append(column.type.list_size)
            column = column.flatten()
        out.append(column.to_numpy(zero_copy_only=False).reshape([len(table)] + shape))
    return out


class ArrowRows(tud.Dataset):
    """What a user writes without fastload: pyarrow rows per sample."""

    def __init__(self, table, columns):
        self.arrays = arrow_rows(table, columns)

    def __len__(self):
        return len(self.arrays[0])

    def __getitem__(self, i):
        return tuple(np.array(a[i]) for a in self.arrays)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("arrow")
    table = make_table()
    feather.write_feather(table, root / "one.arrow", compression="uncompressed")
    feather.write_feather(table, root / "batches.arrow", compression="uncompressed",
                          chunksize=10)
    feather.write_feather(table, root / "lz4.arrow", compression="lz4")
    pq.write_table(table, root / "data.parquet", row_group_size=8)
    return root, table


def open_source(kind, files):
    root, table = files
    if kind == "ipc":
        return (fastload.ArrowDataset(root / "one.arrow", NUMERIC),
                feather.read_table(root / "one.arrow"))
    if kind == "ipc-batches":
        return (fastload.ArrowDataset(str(root / "batches.arrow"), NUMERIC),
                feather.read_table(root / "batches.arrow"))
    if kind == "ipc-lz4":
        return (fastload.ArrowDataset(root / "lz4.arrow", NUMERIC),
                feather.read_table(root / "lz4.arrow"))
    if kind == "table-slice":
        part = table.slice(3, N - 5)
        return fastload.ArrowDataset(part, NUMERIC), part
    if kind == "record-batch":
        batch = table.to_batches()[0]
        return fastload.ArrowDataset(batch, NUMERIC), pa.Table.from_batches([batch])
    return fastload.ArrowDataset.from_parquet(root / "data.parquet", NUMERIC), pq.read_table(
        root / "data.parquet")


CONFIGS = {
    "seq-bs4": (lambda lib: dict(batch_size=4), None),
    "shuffle-bs5": (lambda lib: dict(batch_size=5, shuffle=True,
                                     generator=torch.Generator().manual_seed(7)), None),
    "shuffle-w2-threads": (lambda lib: dict(batch_size=5, shuffle=True, num_workers=2,
                                            generator=torch.Generator().manual_seed(7)), None),
    "shuffle-w2-processes": (lambda lib: dict(batch_size=5, shuffle=True, num_workers=2,
                                              generator=torch.Generator().manual_seed(7)),
                             {"worker_mode": "process"}),
    "distributed": (lambda lib: dict(batch_size=4, sampler=lib.DistributedSampler(
        range(N - 8), num_replicas=3, rank=2, shuffle=True, seed=5)), None),
    "custom-collate-w2": (lambda lib: dict(batch_size=4, num_workers=2,
                                           collate_fn=lambda b: b), None),
}

KINDS = ["ipc", "ipc-batches", "ipc-lz4", "table-slice", "record-batch", "parquet"]


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("kind", KINDS)
def test_batches_match_pyarrow(files, kind, config):
    ds, table = open_source(kind, files)
    make, extra = CONFIGS[config]
    check_parity(ArrowRows(table, NUMERIC), make, fl_dataset=ds, epochs=2, fl_extra=extra)


def test_single_chunk_ipc_columns_are_views_of_the_mapping(files):
    root, _ = files
    ds = fastload.ArrowDataset(root / "one.arrow", NUMERIC)
    # Bools are bit-packed in Arrow: unpacked into memory, the rest mapped.
    assert [f is not None for f in ds._files] == [True, True, True, True, False]
    assert not ds._arrays[0].flags.owndata and not ds._arrays[0].flags.writeable
    several = fastload.ArrowDataset(root / "batches.arrow", NUMERIC)
    assert all(f is None for f in several._files)  # concatenated into memory once


def test_indexing_outside_a_loader(files):
    root, table = files
    ds = fastload.ArrowDataset(root / "one.arrow", ["image", "label"])
    image, label = arrow_rows(table, ["image", "label"])
    assert len(ds) == N
    row = ds[4]
    assert isinstance(row, tuple) and row[0].shape == (2, 3, 4)
    np.testing.assert_array_equal(row[0], image[4])
    np.testing.assert_array_equal(ds[-1][1], label[-1])
    batch = ds[[9, 0, 9]]
    np.testing.assert_array_equal(batch[0], image[[9, 0, 9]])
    np.testing.assert_array_equal(ds[np.array([5, 6])][1], label[5:7])
    np.testing.assert_array_equal(ds[1:30:4][0], image[1:30:4])
    assert ds.columns == ("image", "label")
    assert fastload.ArrowDataset(table.select(["label"])).columns == ("label",)
    with pytest.raises(IndexError, match=f"index {N} is out of range for a dataset of {N}"):
        ds[[0, N]]


def test_pickled_file_dataset_maps_the_file_again(files):
    root, _ = files
    ds = fastload.ArrowDataset(root / "one.arrow", NUMERIC)
    state = pickle.dumps(ds)
    assert len(state) < 2048  # the path, not the data
    copy = pickle.loads(state)
    for got, want in zip(copy[[3, 1]], ds[[3, 1]]):
        np.testing.assert_array_equal(got, want)
    from_table = pickle.loads(pickle.dumps(fastload.ArrowDataset(make_table(), ["label"])))
    np.testing.assert_array_equal(from_table[[2]][0], ds[[2]][1])
    loader = fastload.DataLoader(ds, batch_size=8, num_workers=2, worker_mode="process",
                                 multiprocessing_context="spawn", output="numpy")
    got = np.concatenate([b[1] for b in loader])
    np.testing.assert_array_equal(got, ds[list(range(N))][1])


def test_unsupported_columns_name_the_column_and_type(files):
    root, table = files
    with pytest.raises(TypeError, match=r"one.arrow': column 'name' has type string; "
                                        "ArrowDataset serves integer, float and bool"):
        fastload.ArrowDataset(root / "one.arrow")
    for column, type_name in [(pa.array([[1, 2], [3]]), r"list<item: int64>"),
                              (pa.array([b"a", b"b"]), "binary"),
                              (pa.array([None, None]), "null"),
                              (pa.array(np.array([1, 2], "datetime64[s]")), r"timestamp\[s\]")]:
        with pytest.raises(TypeError, match=f"the table: column 'c' has type {type_name}"):
            fastload.ArrowDataset(pa.table({"c": column}))
    with pytest.raises(TypeError, match=r"data.parquet': column 'name' has type string"):
        fastload.ArrowDataset.from_parquet(root / "data.parquet")


def test_nulls_are_refused():
    with pytest.raises(ValueError, match="column 'x' has 1 nulls"):
        fastload.ArrowDataset(pa.table({"x": pa.array([1.0, None, 3.0])}))
    inner = pa.FixedSizeListArray.from_arrays(pa.array([1, None, 3, 4]), 2)
    with pytest.raises(ValueError, match="column 'v' has 1 nulls"):
        fastload.ArrowDataset(pa.table({"v": inner}))


def test_missing_columns_name_the_file(files):
    root, _ = files
    with pytest.raises(KeyError, match=r"one.arrow' has no column 'pixels' \(its columns: "
                                       r"'image', 'label'"):
        fastload.ArrowDataset(root / "one.arrow", ["label", "pixels"])
    with pytest.raises(KeyError, match=r"data.parquet' has no column 'pixels'"):
        fastload.ArrowDataset.from_parquet(root / "data.parquet", "pixels")
    with pytest.raises(ValueError, match="columns repeat"):
        fastload.ArrowDataset(root / "one.arrow", ["label", "label"])
    with pytest.raises(TypeError, match="takes the path of an Arrow IPC file"):
        fastload.ArrowDataset(np.zeros(3))


def test_bad_files_name_the_file(files, tmp_path):
    root, _ = files
    (tmp_path / "x.arrow").write_bytes(b"not arrow" * 100)
    with pytest.raises(ValueError, match=r"cannot read .*x.arrow' as an Arrow IPC"):
        fastload.ArrowDataset(tmp_path / "x.arrow")
    with pytest.raises(ValueError, match=r"cannot open .*missing.arrow': no such file"):
        fastload.ArrowDataset(tmp_path / "missing.arrow")
    data = (root / "one.arrow").read_bytes()
    (tmp_path / "cut.arrow").write_bytes(data[:len(data) // 2])
    with pytest.raises(ValueError, match=r"cannot read .*cut.arrow' as an Arrow IPC"):
        fastload.ArrowDataset(tmp_path / "cut.arrow")
    (tmp_path / "x.parquet").write_bytes(b"PAR1 not really" * 10)
    with pytest.raises(ValueError, match=r"cannot read .*x.parquet' as a Parquet file"):
        fastload.ArrowDataset.from_parquet(tmp_path / "x.parquet")
    parquet = (root / "data.parquet").read_bytes()
    corrupt = bytearray(parquet)
    corrupt[200:1200] = b"\xff" * 1000  # pages of the first row groups
    (tmp_path / "bad.parquet").write_bytes(bytes(corrupt))
    with pytest.raises(ValueError, match=r"bad.parquet'"):
        fastload.ArrowDataset.from_parquet(tmp_path / "bad.parquet", NUMERIC)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_file_truncated_under_the_mapping(tmp_path, num_workers):
    path = tmp_path / "t.arrow"
    rows = np.arange(4096 * 256, dtype=np.float32).reshape(4096, 256)
    feather.write_feather(pa.table({"x": fixed_list(rows, 256)}), path,
                          compression="uncompressed")
    assert_truncation_is_named(fastload.ArrowDataset(path), path, rows, num_workers)


def test_missing_pyarrow_says_what_to_install(files):
    root, _ = files
    run = subprocess.run([sys.executable, "-c",
                          "import sys; sys.modules['pyarrow'] = None\n"
                          "import fastload\n"
                          f"fastload.ArrowDataset({str(root / 'one.arrow')!r})"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode != 0
    assert "ImportError: ArrowDataset needs the pyarrow package: pip install pyarrow" in run.stderr
