import io

import numpy as np
import pytest
import torch

import fastload
from fastload import transforms as T

pa = pytest.importorskip("pyarrow")
import pyarrow.ipc  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
from PIL import Image  # noqa: E402

from fastload.datasets.formats.arrow_images import ArrowImages  # noqa: E402
from fl_helpers import check_parity, row_dataset_configs  # noqa: E402


def _images(tmp_path, n=6):
    rng = np.random.default_rng(0)
    paths, blobs = [], []
    for i in range(n):
        p = tmp_path / f"{i}.jpg"
        Image.fromarray(rng.integers(0, 255, (20 + i, 24, 3), np.uint8)).save(p, quality=90)
        paths.append(p)
        blobs.append(p.read_bytes())
    return paths, blobs


def _write(path, blobs, labels):
    table = pa.table({"image": pa.array(blobs, pa.binary()), "label": labels})
    with pa.ipc.new_file(str(path), table.schema) as w:
        w.write_table(table)


@pytest.mark.parametrize("workers", [0, 2])
def test_batches_match_image_files(tmp_path, workers):
    paths, blobs = _images(tmp_path)
    labels = list(range(len(blobs)))
    _write(tmp_path / "t.arrow", blobs, labels)
    tf = T.Compose([T.RandomResizedCrop(16), T.ToTensor()])
    ours = ArrowImages(tmp_path / "t.arrow", transform=tf)
    ref = fastload.ImageFiles(paths, labels, transform=tf)
    a = list(fastload.DataLoader(ours, batch_size=4, shuffle=True, num_workers=workers,
                                 generator=__import__("torch").Generator().manual_seed(3)))
    b = list(fastload.DataLoader(ref, batch_size=4, shuffle=True, num_workers=workers,
                                 generator=__import__("torch").Generator().manual_seed(3)))
    for (xa, ya), (xb, yb) in zip(a, b):
        assert (xa == xb).all() and (ya == yb).all()


def test_corrupt_image_names_row(tmp_path):
    _, blobs = _images(tmp_path, 3)
    blobs[1] = blobs[1][:40]
    _write(tmp_path / "t.arrow", blobs, [0, 1, 2])
    ds = ArrowImages(tmp_path / "t.arrow", transform=T.Compose([T.Resize((8, 8)), T.ToTensor()]))
    with pytest.raises(Exception, match="sample index 1"):
        ds[1]


def test_compressed_file_refused(tmp_path):
    _, blobs = _images(tmp_path, 2)
    table = pa.table({"image": pa.array(blobs, pa.binary()), "label": [0, 1]})
    options = pa.ipc.IpcWriteOptions(compression="zstd")
    with pa.ipc.new_file(str(tmp_path / "z.arrow"), table.schema, options=options) as w:
        w.write_table(table)
    with pytest.raises(ValueError, match="compressed"):
        ArrowImages(tmp_path / "z.arrow")


# --- in-memory tables, Parquet files and Hugging Face datasets -------------

N = 10


class PyTable(torch.utils.data.Dataset):
    """The usual torch wrapper: a table's image bytes decoded by Pillow."""

    def __init__(self, blobs, labels, rows=None):
        self.blobs, self.labels = blobs, labels
        self.rows = list(range(len(blobs))) if rows is None else rows

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        row = self.rows[i]
        rgb = np.asarray(Image.open(io.BytesIO(self.blobs[row])).convert("RGB"))
        return torch.from_numpy(center_crop(rgb).copy()).permute(2, 0, 1), self.labels[row]


def center_crop(rgb):
    top, left = round((rgb.shape[0] - 8) / 2), round((rgb.shape[1] - 8) / 2)  # torchvision's
    return rgb[top:top + 8, left:left + 8]


CROP = T.Compose([T.CenterCrop(8), T.PILToTensor()])
CONFIGS = row_dataset_configs(N)


def _table(blobs, labels):
    """The images in two chunks, the second one sliced: offsets that do not
    start at zero."""
    whole = pa.table({"image": pa.array(blobs, pa.binary()), "label": labels})
    return pa.concat_tables([whole.slice(0, 3), whole.slice(3)])


def _hf(blobs, labels):
    datasets = pytest.importorskip("datasets")
    rows = [{"bytes": b, "path": None} for b in blobs]
    return datasets.Dataset.from_dict({"image": rows, "label": labels}).cast_column(
        "image", datasets.Image())


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("kind", ["table", "parquet", "hf-shuffled"])
def test_tables_match_pillow(tmp_path, kind, config):
    _, blobs = _images(tmp_path, N)
    labels = [7 * i % 5 for i in range(N)]
    rows = None
    if kind == "table":
        source = _table(blobs, labels)
    elif kind == "parquet":
        source = tmp_path / "t.parquet"
        pq.write_table(_table(blobs, labels), source, row_group_size=4)
    else:
        source = _hf(blobs, labels).shuffle(seed=1)
        rows = [int(i) for i in source._indices.column(0).to_pylist()]
    ds = ArrowImages(source, transform=CROP)
    make, extra = CONFIGS[config]
    check_parity(PyTable(blobs, labels, rows), make, fl_dataset=ds, fl_extra=extra)


def test_hf_dataset_saved_to_disk_and_selected(tmp_path):
    datasets = pytest.importorskip("datasets")
    paths, blobs = _images(tmp_path, N)
    _hf(blobs, list(range(N))).save_to_disk(str(tmp_path / "saved"))
    selected = datasets.load_from_disk(str(tmp_path / "saved")).select([4, 0, 9])
    ds = ArrowImages(selected, transform=CROP)
    ref = fastload.ImageFiles([paths[i] for i in (4, 0, 9)], [4, 0, 9], transform=CROP)
    (x, y), = fastload.DataLoader(ds, batch_size=3)
    (rx, ry), = fastload.DataLoader(ref, batch_size=3)
    assert y.tolist() == [4, 0, 9] and (x == rx).all()


def test_hf_image_paths_are_read_as_files(tmp_path):
    datasets = pytest.importorskip("datasets")
    paths, _ = _images(tmp_path, 4)
    hf = datasets.Dataset.from_dict({"image": [str(p) for p in paths], "label": [0, 1, 2, 3]})
    ds = ArrowImages(hf.cast_column("image", datasets.Image()).select([2, 3]), transform=CROP)
    assert ds.path(0) == str(paths[2]) and ds.targets == [2, 3]
    assert (ds[1][0] == fastload.ImageFiles([paths[3]], transform=CROP)[0][0]).all()


def test_image_struct_mixing_bytes_and_paths_is_refused(tmp_path):
    paths, blobs = _images(tmp_path, 3)
    image = pa.array([{"bytes": blobs[0], "path": None}, {"bytes": None, "path": str(paths[1])},
                      {"bytes": blobs[2], "path": None}])
    with pytest.raises(ValueError, match="row 1"):
        ArrowImages(pa.table({"image": image}))


def test_null_image_names_the_row(tmp_path):
    _, blobs = _images(tmp_path, 3)
    with pytest.raises(ValueError, match="no image at row 2"):
        ArrowImages(pa.table({"image": pa.array(blobs[:2] + [None], pa.binary())}))


def test_corrupt_value_in_memory_names_the_sample(tmp_path):
    _, blobs = _images(tmp_path, 3)
    blobs[2] = blobs[2][:50]
    ds = ArrowImages(_table(blobs, [0, 1, 2]), transform=CROP)
    assert (ds[1][0] == ArrowImages(_table(blobs, [0, 1, 2]), transform=CROP)[1][0]).all()
    with pytest.raises(fastload.DecodeError, match="sample index 2"):
        list(fastload.DataLoader(ds, batch_size=3))


def test_memory_ranges_are_checked_against_their_buffers():
    from fastload import _C

    args = (b"t\0", np.zeros(1, np.int64), np.zeros(1, np.int64))
    memory = ((b"0123456789",), np.zeros(1, np.int64))
    _C.ImageSource(*args, ranges=np.array([[4, 6]], np.int64), memory=memory)
    with pytest.raises(ValueError, match="past the end"):
        _C.ImageSource(*args, ranges=np.array([[5, 6]], np.int64), memory=memory)
    with pytest.raises(ValueError, match="buffer 1 of 1"):
        _C.ImageSource(*args, ranges=np.array([[0, 1]], np.int64),
                       memory=((b"x",), np.ones(1, np.int64)))


def test_arrow_dataset_follows_a_hf_indices_mapping():
    datasets = pytest.importorskip("datasets")
    hf = datasets.Dataset.from_dict({"x": [1.5 * i for i in range(8)], "y": list(range(8))})
    picked = hf.shuffle(seed=4).select([5, 1, 2])
    ds = fastload.ArrowDataset(picked, columns=["x", "y"])
    assert [int(ds[i][1]) for i in range(3)] == picked["y"]
    assert [float(ds[i][0]) for i in range(3)] == picked["x"]
    with pytest.raises(TypeError, match="datasets.Dataset"):
        ArrowImages(object())


@pytest.mark.parametrize("kind", ["ipc", "parquet", "table", "hf-shuffled"])
def test_decoded_images_are_kept_in_a_cache(tmp_path, kind):
    paths, blobs = _images(tmp_path, N)
    labels = list(range(N))
    if kind == "ipc":
        source = tmp_path / "t.arrow"
        _write(source, blobs, labels)
    elif kind == "parquet":
        source = tmp_path / "t.parquet"
        pq.write_table(_table(blobs, labels), source, row_group_size=4)
    elif kind == "table":
        source = _table(blobs, labels)
    else:
        source = _hf(blobs, labels).shuffle(seed=2)
    tf = T.Compose([T.RandomResizedCrop(12), T.ToTensor()])
    plain = ArrowImages(source, transform=tf, decode="exact")  # what decoded pixels give
    ds = ArrowImages(source, transform=tf, cache="memory", cache_size=1 << 20,
                     cache_decoded=True)

    def epochs(dataset):
        loader = fastload.DataLoader(dataset, batch_size=4, shuffle=True, num_workers=2,
                                     generator=torch.Generator().manual_seed(1))
        return [x.clone() for _ in range(2) for x, _ in loader]

    for got, want in zip(epochs(ds), epochs(plain)):
        assert torch.equal(got, want)
    assert (ds.cache.stats()["stored"], ds.cache.stats()["hits"]) == (N, N)


def test_a_shared_cache_needs_a_table_it_can_name(tmp_path):
    _, blobs = _images(tmp_path, 4)
    table = _table(blobs, [0, 1, 2, 3])
    with pytest.raises(ValueError, match="cache_decoded=True"):
        ArrowImages(table, cache="memory")
    with pytest.raises(ValueError, match="no file a shared cache"):
        ArrowImages(table, cache=str(tmp_path / "c.cache"), cache_size=1 << 20,
                    cache_decoded=True)
    # A Hugging Face dataset is named by its fingerprint and order: another
    # order of the same table is another cache.
    hf = _hf(blobs, [0, 1, 2, 3])
    path = str(tmp_path / "hf.cache")
    first = ArrowImages(hf, cache=path, cache_size=1 << 20, cache_decoded=True)
    first[0]
    again = ArrowImages(hf, cache=path, cache_size=1 << 20, cache_decoded=True)
    assert again.cache.stats()["stored"] == 1
    shuffled = ArrowImages(hf.shuffle(seed=0), cache=path, cache_size=1 << 20,
                           cache_decoded=True)
    assert shuffled.cache.stats()["stored"] == 0
    # An IPC file is read as a file: its images' bytes may be kept too.
    _write(tmp_path / "t.arrow", blobs, [0, 1, 2, 3])
    ipc = ArrowImages(tmp_path / "t.arrow", cache="memory")
    np.testing.assert_array_equal(ipc[2][0], ArrowImages(tmp_path / "t.arrow")[2][0])
    assert ipc.cache.stats()["stored"] == 1


# ------------------------------------------------------- a file cut short

TRUNCATED_IPC = """
import io, os
import numpy as np, pyarrow as pa, pyarrow.ipc, torch
from PIL import Image
import fastload
from fastload import transforms as T
from fastload.datasets.formats.arrow_images import ArrowImages

path, source, workers = {path!r}, {source!r}, {workers}
PAGE = os.sysconf("SC_PAGESIZE")
rng = np.random.default_rng(0)
blobs = []
for i in range(96):
    out = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (32, 32, 3), np.uint8)).save(out, "JPEG", quality=95)
    blobs.append(out.getvalue())

def write():
    table = pa.table({{"image": pa.array(blobs, pa.binary()), "label": np.arange(96) * 7}})
    with pa.ipc.new_file(path, table.schema) as w:
        w.write_table(table)

write()
mapping = pa.memory_map(path)
table = pa.ipc.open_file(mapping).read_all()
base = mapping.read_buffer(mapping.size()).address
_, offsets, data = table.column("image").chunk(0).buffers()
last = data.address - base + int(np.frombuffer(offsets, np.int32)[95])
labels_at = table.column("label").chunk(0).buffers()[1].address - base
# The page holding the last image's first byte, and every page after it
# (the labels' too: they follow the images), are cut away; the images
# before it stay readable.
cut = last // PAGE * PAGE
assert 0 < cut <= labels_at, (cut, labels_at)
ds = ArrowImages(path if source == "path" else table,
                 transform=T.Compose([T.Resize((8, 8)), T.PILToTensor()]))
loader = fastload.DataLoader(ds, batch_size=4, num_workers=workers)
it = iter(loader)
assert next(it)[1].tolist() == [0, 7, 14, 21]
os.truncate(path, cut)
seen = 4
try:
    for x, y in it:
        assert y.tolist() == [7 * i for i in range(seen, seen + 4)], y
        seen += 4
except OSError as e:
    print("raised:", e)
else:
    print("no error")
del it
write()  # the same bytes again: the loader reads the whole file again
assert torch.cat([y for _, y in loader]).tolist() == [7 * i for i in range(96)]
print("done")
"""


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("source", ["path", "table"])
def test_a_file_cut_short_under_the_loader_raises(tmp_path, source, workers):
    """An Arrow IPC file cut short while a loader reads it (by path, or a
    pyarrow.Table memory-mapped from it): the labels were copied out when
    the dataset was made, the images are read through pread or the
    bus-error guard, so the loader raises OSError naming the file instead
    of the process dying of SIGBUS; it works again once the file is whole."""
    from fl_helpers import assert_child_ok, run_in_child

    path = tmp_path / "t.arrow"
    result = run_in_child(TRUNCATED_IPC.format(path=str(path), source=source,
                                               workers=workers))
    assert_child_ok(result)
    assert "raised:" in result.stdout, result.stdout
    message = result.stdout.split("raised:", 1)[1]
    assert repr(str(path)) in message or str(path) in message, message
    if source == "table":
        assert (f"file changed under the loader: {str(path)!r} is shorter than when it was "
                "opened (sample index 9") in message, message


def test_labels_are_copied_out_of_the_mapping(tmp_path):
    """The label column of a mapped table is a copy, not a view of the
    mapping: a file cut short under it cannot fault NumPy later."""
    _, blobs = _images(tmp_path, 3)
    _write(tmp_path / "t.arrow", blobs, [4, 5, 6])
    ds = ArrowImages(tmp_path / "t.arrow")
    assert ds._labels.flags.owndata and ds._labels.tolist() == [4, 5, 6]
    table = pa.ipc.open_file(pa.memory_map(str(tmp_path / "t.arrow"))).read_all()
    assert ArrowImages(table)._labels.flags.owndata
