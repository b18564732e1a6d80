"""LMDBDataset: samples equal to what the lmdb package reads for the same
keys (raw records, images decoded by the C pipeline, a Python decoder),
with thread and process workers and the usual samplers; missing keys,
values of the wrong size and files that are not LMDBs fail naming them."""

import io
import os
import pickle
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
lmdb = pytest.importorskip("lmdb")

import numpy as np  # noqa: E402
import torch.utils.data as tud  # noqa: E402
from PIL import Image  # noqa: E402

import fastload  # noqa: E402
import fastload.transforms as T  # noqa: E402
from fl_helpers import check_parity, fastload_only, row_dataset_configs  # noqa: E402

pytestmark = fastload_only

N = 23
SHAPE = (3, 4)


def write_db(path, values, keys=None, subdir=True):
    env = lmdb.open(str(path), map_size=1 << 24, subdir=subdir)
    with env.begin(write=True) as txn:
        for i, v in enumerate(values):
            txn.put(str(i).encode() if keys is None else keys[i], v)
    env.close()
    return str(path)


def png_bytes(rng):
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (10, 12, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    root = tmp_path_factory.mktemp("lmdb")
    rng = np.random.default_rng(0)
    records = rng.standard_normal((N,) + SHAPE).astype(np.float32)
    images = [png_bytes(rng) for _ in range(N)]
    return {
        "raw": write_db(root / "raw", [r.tobytes() for r in records]),
        "png": write_db(root / "png.mdb", images, subdir=False),
        "labels": rng.integers(0, 10, N),
    }


class PyLMDB(tud.Dataset):
    """What a user writes without fastload: the lmdb package in a Dataset,
    the environment opened on first use in each worker."""

    def __init__(self, path, decode, labels, subdir=True):
        self.path, self.decode, self.labels, self.subdir, self.env = path, decode, labels, subdir, None

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        if self.env is None:
            self.env = lmdb.open(self.path, readonly=True, lock=False, subdir=self.subdir)
        with self.env.begin() as txn:
            return self.decode(txn.get(str(i).encode())), int(self.labels[i])


def raw_record(b):
    return np.frombuffer(b, np.float32).reshape(SHAPE).copy()


def png_crop(b):
    """CenterCrop(8) then PILToTensor of a 10x12 image, as torchvision does it."""
    rgb = np.asarray(Image.open(io.BytesIO(b)).convert("RGB"))[1:9, 2:10]
    return torch.from_numpy(rgb.copy()).permute(2, 0, 1)


CONFIGS = row_dataset_configs(N)


@pytest.mark.parametrize("config", list(CONFIGS))
def test_raw_records_match_lmdb(stores, config):
    ds = fastload.LMDBDataset(stores["raw"], decode="raw", dtype=np.float32, shape=SHAPE,
                              labels=stores["labels"])
    make, extra = CONFIGS[config]
    check_parity(PyLMDB(stores["raw"], raw_record, stores["labels"]), make, fl_dataset=ds,
                 epochs=2, fl_extra=extra)


@pytest.mark.parametrize("config", list(CONFIGS))
def test_images_decoded_in_c_match_pillow(stores, config):
    ds = fastload.LMDBDataset(stores["png"], labels=stores["labels"],
                              transform=T.Compose([T.CenterCrop(8), T.PILToTensor()]))
    make, extra = CONFIGS[config]
    check_parity(PyLMDB(stores["png"], png_crop, stores["labels"], subdir=False), make,
                 fl_dataset=ds, epochs=1, fl_extra=extra)


def test_jpeg_values_decode_as_the_same_files_do(tmp_path):
    rng = np.random.default_rng(1)
    blobs = []
    for i in range(4):
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 255, (20, 30, 3), dtype=np.uint8)).save(buf, "JPEG")
        blobs.append(buf.getvalue())
        (tmp_path / f"{i}.jpg").write_bytes(buf.getvalue())
    keys = [b"img-%03d" % i for i in range(4)]
    path = write_db(tmp_path / "db", blobs, keys=keys)
    tf = T.Compose([T.Resize(16), T.CenterCrop(12), T.ToTensor()])
    ds = fastload.LMDBDataset(path, keys=keys, labels=[3, 1, 4, 1], transform=tf)
    files = fastload.ImageFiles([tmp_path / f"{i}.jpg" for i in range(4)], labels=[3, 1, 4, 1],
                                transform=tf)
    loader = fastload.DataLoader(ds, batch_size=4, num_workers=2)
    images, labels = next(iter(loader))
    expected = np.stack([np.asarray(files[i][0]) for i in range(4)])
    assert np.array_equal(np.asarray(images), expected)
    assert labels.tolist() == [3, 1, 4, 1]
    assert np.array_equal(np.asarray(ds[2][0]), expected[2])


def test_callable_decoder_gets_the_value_bytes(stores):
    ds = fastload.LMDBDataset(stores["raw"], decode=raw_record, labels=stores["labels"],
                              transform=np.negative)
    value, label = ds[5]
    with lmdb.open(stores["raw"], readonly=True, lock=False) as env, env.begin() as txn:
        assert np.array_equal(value, -raw_record(txn.get(b"5")))
    assert label == stores["labels"][5]
    copy = pickle.loads(pickle.dumps(ds))  # the environment is reopened, not pickled
    assert np.array_equal(copy[5][0], value)


def test_missing_key_names_the_database_and_key(tmp_path, stores):
    path = write_db(tmp_path / "db", [b"\0" * 48] * 3)
    ds = fastload.LMDBDataset(path, decode="raw", dtype=np.float32, shape=SHAPE, length=5)
    with pytest.raises(OSError, match=r"LMDB .*db has no key '3' \(sample 3\)"):
        ds[[0, 3]]
    images = fastload.LMDBDataset(stores["png"], keys=[b"0", b"no\xffkey"],
                                  transform=T.Compose([T.CenterCrop(8), T.ToTensor()]))
    with pytest.raises(OSError, match=r"no key 'no\\xffkey' \(sample 1\)"):
        next(iter(fastload.DataLoader(images, batch_size=2)))


def test_value_of_the_wrong_size_names_key_and_sizes(tmp_path):
    path = write_db(tmp_path / "db", [b"\0" * 48, b"\0" * 40])
    ds = fastload.LMDBDataset(path, decode="raw", dtype=np.float32, shape=SHAPE)
    with pytest.raises(fastload.DecodeError, match="key '1' .* holds 40 bytes, not the 48"):
        ds[1]


def test_raw_records_take_the_native_batch_route(tmp_path, stores):
    ds = fastload.LMDBDataset(stores["raw"], decode="raw", dtype=np.float32, shape=SHAPE,
                              labels=stores["labels"])
    assert type(ds._native_source()).__name__ == "LMDBRows"
    with_transform = fastload.LMDBDataset(stores["raw"], decode="raw", dtype=np.float32,
                                          shape=SHAPE, transform=np.negative)
    assert with_transform._native_source() is None  # a transform needs Python a sample
    # Errors on the route name the key and the sample, in the main thread.
    missing = fastload.LMDBDataset(write_db(tmp_path / "short", [b"\0" * 48] * 3),
                                   decode="raw", dtype=np.float32, shape=SHAPE, length=5)
    wrong = fastload.LMDBDataset(write_db(tmp_path / "wrong", [b"\0" * 48, b"\0" * 40]),
                                 decode="raw", dtype=np.float32, shape=SHAPE)
    for dataset, error, message in ((missing, OSError, r"no key '3' \(sample 3\)"),
                                    (wrong, fastload.DecodeError, "key '1' .* holds 40 bytes")):
        for workers in (0, 2):
            loader = fastload.DataLoader(dataset, batch_size=5, num_workers=workers)
            with pytest.raises(error, match=message):
                list(loader)


def test_corrupt_image_value_names_the_key(tmp_path):
    path = write_db(tmp_path / "db", [b"\xff\xd8\xff\xe0 truncated"])
    ds = fastload.LMDBDataset(path, transform=T.Compose([T.CenterCrop(8), T.ToTensor()]))
    with pytest.raises(fastload.DecodeError, match="db"):
        ds[0]


@pytest.mark.parametrize("content", [b"", b"not an lmdb file" * 512])
def test_not_an_lmdb_or_truncated(tmp_path, content):
    bad = tmp_path / "bad.mdb"
    bad.write_bytes(content)
    with pytest.raises(OSError, match="bad.mdb"):
        fastload.LMDBDataset(bad, decode="raw", dtype=np.uint8, shape=1)
    with pytest.raises(OSError, match="nowhere"):
        fastload.LMDBDataset(tmp_path / "nowhere", decode="raw", dtype=np.uint8, shape=1)


def test_read_only_copy_opens_without_a_lock_file(tmp_path, stores):
    path = write_db(tmp_path / "db", [b"\1" * 48])
    os.remove(os.path.join(path, "lock.mdb"))
    os.chmod(path, 0o555)
    try:
        ds = fastload.LMDBDataset(path, decode="raw", dtype=np.float32, shape=SHAPE)
        assert ds[0][0].tobytes() == b"\1" * 48
    finally:
        os.chmod(path, 0o755)


def test_bad_arguments():
    with pytest.raises(ValueError, match="decode must be"):
        fastload.LMDBDataset("x", decode="png")
    with pytest.raises(ValueError, match="needs dtype and shape"):
        fastload.LMDBDataset("x", decode="raw")


def test_forked_process_opens_the_database_again(stores):
    ds = fastload.LMDBDataset(stores["raw"], decode="raw", dtype=np.float32, shape=SHAPE)
    parent = ds._source
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child reports whether it read through its own environment
        ok = ds[1][0].shape == SHAPE and ds._source is not parent
        os.write(write, b"1" if ok else b"0")
        os._exit(0)
    os.waitpid(pid, 0)
    os.close(write)
    answer = os.read(read, 1)
    os.close(read)
    assert answer == b"1"
    assert ds._source is parent


def test_another_process_may_write_while_the_database_is_read(tmp_path):
    """A writer in another process replaces every image between two epochs
    (LMDB forbids a second environment in this one): each value is read
    inside its transaction, so the second epoch decodes the new images."""
    rng = np.random.default_rng(2)
    first = [png_bytes(rng) for _ in range(6)]
    second = [png_bytes(rng) for _ in range(6)]
    path = write_db(tmp_path / "db", first)
    for i, blob in enumerate(second):
        (tmp_path / f"{i}.png").write_bytes(blob)
    ds = fastload.LMDBDataset(path, transform=T.ToTensor())
    before = [np.asarray(ds[i][0]) for i in range(6)]
    script = ("import lmdb, sys\n"
              "env = lmdb.open(sys.argv[1], map_size=1 << 24)\n"
              "with env.begin(write=True) as txn:\n"
              "    for i in range(6):\n"
              "        txn.put(str(i).encode(), open(f'{sys.argv[2]}/{i}.png', 'rb').read())\n")
    subprocess.run([sys.executable, "-c", script, path, str(tmp_path)], check=True)
    files = fastload.ImageFiles([tmp_path / f"{i}.png" for i in range(6)], transform=T.ToTensor())
    for i in range(6):
        after = np.asarray(ds[i][0])
        assert np.array_equal(after, np.asarray(files[i][0]))
        assert not np.array_equal(after, before[i])


def test_decoded_images_are_kept_in_a_cache(tmp_path, stores):
    tf = T.Compose([T.RandomResizedCrop(8), T.ToTensor()])
    plain = fastload.LMDBDataset(stores["png"], transform=tf)
    ds = fastload.LMDBDataset(stores["png"], transform=tf, cache=str(tmp_path / "px.cache"),
                              cache_size=1 << 20, cache_decoded=True)

    def epochs(dataset):
        loader = fastload.DataLoader(dataset, batch_size=5, shuffle=True, num_workers=2,
                                     generator=torch.Generator().manual_seed(3))
        return [np.asarray(x).copy() for _ in range(2) for x, _ in loader]

    for got, want in zip(epochs(ds), epochs(plain)):
        np.testing.assert_array_equal(got, want)
    assert (ds.cache.stats()["stored"], ds.cache.stats()["hits"]) == (N, N)
    # Other keys of the same database are other samples: another cache.
    keys = [str(N - 1 - i) for i in range(N)]
    reversed_keys = fastload.LMDBDataset(stores["png"], keys=keys, transform=tf,
                                         cache=str(tmp_path / "px.cache"), cache_size=1 << 20,
                                         cache_decoded=True)
    assert reversed_keys.cache.stats()["stored"] == 0
    with pytest.raises(ValueError, match="cache_decoded=True"):
        fastload.LMDBDataset(stores["png"], cache="memory")


# ------------------------------------------------------- a file cut short

TRUNCATED_LMDB = """
import io, os
import numpy as np, lmdb, torch
from PIL import Image
import fastload
from fastload import transforms as T

root, decode, workers = {root!r}, {decode!r}, {workers}
PAGE = os.sysconf("SC_PAGESIZE")
n = 512
rng = np.random.default_rng(0)
if decode == "raw":
    values = [np.full(64, i, np.float32).tobytes() for i in range(n)]
else:
    values = []
    for i in range(n):
        out = io.BytesIO()
        Image.fromarray(np.full((8, 8, 3), i % 251, np.uint8)).save(out, "PNG")
        values.append(out.getvalue())
env = lmdb.open(root, map_size=1 << 26)
with env.begin(write=True) as txn:
    for i, v in enumerate(values):
        txn.put(str(i).encode(), v)
env.close()
data_file = os.path.join(root, "data.mdb")
whole = open(data_file, "rb").read()

def restore():
    with open(data_file, "r+b") as f:  # the same file (liblmdb maps it), whole again
        f.write(whole)

if decode == "raw":
    ds = fastload.LMDBDataset(root, decode="raw", dtype=np.float32, shape=(64,),
                              labels=np.arange(n))
    first = lambda batch: batch[0][:, 0].tolist()
else:
    ds = fastload.LMDBDataset(root, labels=np.arange(n),
                              transform=T.Compose([T.Resize((4, 4)), T.PILToTensor()]))
    first = lambda batch: batch[1].tolist()
loader = fastload.DataLoader(ds, batch_size=16, num_workers=workers)
# The B-tree pages gone; then the meta pages too; {cycles} times over.
for cut in (2 * PAGE, 0) * {cycles}:
    it = iter(loader)
    assert first(next(it)) == list(range(16))
    os.truncate(data_file, cut)
    try:
        for batch in it:
            pass
    except OSError as e:
        print("raised:", e)
    else:
        print("no error")
    del it
    restore()
    assert [x for batch in loader for x in first(batch)] == list(range(n))
# The reader table (lock.mdb), as another process sees it while this one
# still has the database open: every read transaction a fault stopped was
# aborted, so no slot of this process is left pinned to an old snapshot.
# With workers, a cut can land between a worker's size check and its
# mdb_txn_begin: that begin is caught too, losing its slot, so at most one
# slot a worker and a cut; without workers the cut never races a read.
import subprocess, sys
table = subprocess.run(
    [sys.executable, "-c", "import lmdb, sys; "
     "print(lmdb.open(sys.argv[1], readonly=True).readers(), end='')", root],
    check=True, capture_output=True, text=True).stdout
print("readers:", repr(table))
mine = [line for line in table.splitlines()[1:] if line.split()[:1] == [str(os.getpid())]]
assert len(mine) <= {workers} * 2 * {cycles}, table
print("done")
"""

CYCLES = 4


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("decode", ["raw", "jpeg"])
def test_a_data_file_cut_short_under_the_loader_raises(tmp_path, decode, workers):
    """data.mdb cut short while a loader reads it: liblmdb reads its B-tree
    pages from the map inside its lookups, which run under the bus-error
    guard, so the loader raises OSError naming the file (not SIGBUS), the
    read transaction is aborted, and the dataset reads again once the file
    is whole.  Cut and restored again and again, the reader table shows no
    slot of the process left behind without workers (a fault inside
    mdb_txn_begin would leak one each time), and at most one a worker and a
    cut with workers, whose reads race the cut."""
    from fl_helpers import assert_child_ok, run_in_child

    root = tmp_path / "db"
    result = run_in_child(TRUNCATED_LMDB.format(root=str(root), decode=decode, workers=workers,
                                                cycles=CYCLES))
    assert_child_ok(result)
    assert "readers:" in result.stdout, result.stdout
    messages = result.stdout.split("readers:")[0].split("raised:")[1:]
    assert len(messages) == 2 * CYCLES, result.stdout
    data_file = str(root / "data.mdb")
    for message, cut in zip(messages, [2 * os.sysconf("SC_PAGESIZE"), 0] * CYCLES):
        assert (f"file changed under the loader: {data_file!r} is shorter than when it was "
                "opened (sample index") in message, message
        assert f" {cut} now)" in message, message
