"""The shared sample cache (``cache=`` of the image datasets): the same
batches as without it in every worker mode, shared between loaders and
processes, its bound kept, corrupt entries and changed datasets detected
and read again, and clear errors for bad arguments."""

import os
import pathlib
import pickle
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

pytest.importorskip("PIL")

import fastload  # noqa: E402
from fastload import transforms as T  # noqa: E402
from fl_helpers import fastload_only  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "benchmarks"))
import imagenet_like  # noqa: E402

pytestmark = fastload_only

N = 12


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("cached")
    return imagenet_like.make_image_folder(str(root), n_images=N, n_classes=2, processes=1)


@pytest.fixture
def own_folder(folder, tmp_path):
    """A copy the test may change."""
    return shutil.copytree(folder, tmp_path / "folder")


def transform():
    return T.Compose([T.RandomResizedCrop(24), T.RandomHorizontalFlip(), T.ToTensor()])


def epochs(ds, n_epochs=2, **kwargs):
    import torch

    loader = fastload.DataLoader(ds, batch_size=4, shuffle=True, output="numpy",
                                 generator=torch.Generator().manual_seed(5), **kwargs)
    return [[(x.copy(), y.copy()) for x, y in loader] for _ in range(n_epochs)]


def assert_same(actual, expected):
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        assert len(a) == len(e)
        for (x, y), (ex, ey) in zip(a, e):
            np.testing.assert_array_equal(x, ex)
            np.testing.assert_array_equal(y, ey)


@pytest.fixture(scope="module")
def reference(folder):
    pytest.importorskip("torch")
    return epochs(fastload.ImageFolder(folder, transform=transform()))


# ------------------------------------------------------------- same data

@pytest.mark.parametrize("workers", [0, 2])
def test_cached_batches_match_uncached(folder, reference, workers):
    ds = fastload.ImageFolder(folder, transform=transform(), cache="memory")
    assert_same(epochs(ds, num_workers=workers), reference)
    stats = ds.cache.stats()
    assert stats["stored"] == N  # epoch 1 stored every sample once
    assert stats["hits"] == N  # epoch 2 read them all back
    assert stats["corrupt"] == stats["rejected"] == 0


@pytest.mark.parametrize("context", [
    "fork", pytest.param("spawn", marks=pytest.mark.slow)])  # spawn: a torch import a worker
def test_process_workers_share_the_memory_cache(folder, reference, context):
    ds = fastload.ImageFolder(folder, transform=transform(), cache="memory")
    if context == "spawn":  # one worker for both epochs
        kwargs = dict(num_workers=1, persistent_workers=True)
        reference = epochs(fastload.ImageFolder(folder, transform=transform()),
                           worker_mode="thread", **kwargs)
    else:
        kwargs = dict(num_workers=2)
    assert_same(epochs(ds, worker_mode="process", multiprocessing_context=context, **kwargs),
                reference)
    # The workers filled and read the parent's cache.
    stats = ds.cache.stats()
    assert (stats["stored"], stats["hits"]) == (N, N)


def test_a_pickled_dataset_reopens_the_same_memory_cache(folder):
    ds = fastload.ImageFolder(folder, cache="memory")
    copy = pickle.loads(pickle.dumps(ds))  # what a spawned worker gets
    copy[4]
    assert ds.cache.stats()["stored"] == 1
    ds[4]
    assert ds.cache.stats()["hits"] == 1


def test_single_samples_use_the_cache(folder):
    plain = fastload.ImageFolder(folder)
    ds = fastload.ImageFolder(folder, cache="memory")
    for _ in range(2):
        np.testing.assert_array_equal(ds[3][0], plain[3][0])
    assert (ds.cache.stats()["stored"], ds.cache.stats()["hits"]) == (1, 1)


def test_two_processes_share_a_cache_file(folder, reference, tmp_path):
    path = str(tmp_path / "shared.cache")
    script = textwrap.dedent(f"""
        import fastload
        ds = fastload.ImageFolder({folder!r}, cache={path!r})
        for i in range(len(ds)):
            ds[i]
        print(ds.cache.stats()["stored"])
    """)
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(fastload.__file__)))
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=True, env=env)
    assert out.stdout.split() == [str(N)]
    ds = fastload.ImageFolder(folder, transform=transform(), cache=path)
    assert ds.cache.stats()["stored"] == N  # the other process's entries
    assert_same(epochs(ds, n_epochs=1), reference[:1])
    stats = ds.cache.stats()
    assert (stats["stored"], stats["hits"]) == (N, N)


# ------------------------------------------------------------- the bound

def test_the_bound_is_kept(folder, reference, tmp_path):
    path = tmp_path / "small.cache"
    sizes = sorted(os.path.getsize(p) for p, _ in fastload.ImageFolder(folder).samples)
    size = fastload._C.SampleCache.overhead(N) + sum(sizes[:N // 2])  # room for about half
    ds = fastload.ImageFolder(folder, transform=transform(), cache=str(path), cache_size=size)
    assert_same(epochs(ds), reference)
    stats = ds.cache.stats()
    assert os.path.getsize(path) == size == stats["capacity"]
    assert stats["used"] <= stats["data_bytes"]
    assert 0 < stats["stored"] < N and stats["rejected"] > 0
    assert stats["hits"] == stats["stored"]  # epoch 2: the stored ones from the cache


# ------------------------------------------------------- corrupt and stale

def test_a_corrupt_entry_is_detected_and_read_again(folder, tmp_path):
    path = tmp_path / "c.cache"
    plain = fastload.ImageFolder(folder)
    ds = fastload.ImageFolder(folder, cache=str(path))
    expected = plain[5][0]
    ds[5]
    where = ds.cache.file_offset(5)
    with open(path, "r+b") as f:  # flip bytes in the middle of the stored JPEG
        f.seek(where + 600)
        data = f.read(16)
        f.seek(where + 600)
        f.write(bytes(b ^ 0xFF for b in data))
    np.testing.assert_array_equal(ds[5][0], expected)
    stats = ds.cache.stats()
    assert stats["corrupt"] == 1 and stats["hits"] == 0
    assert stats["stored"] == 2  # stored again, in fresh space
    assert ds.cache.file_offset(5) not in (None, where)
    np.testing.assert_array_equal(ds[5][0], expected)
    assert ds.cache.stats()["hits"] == 1


def test_a_damaged_index_entry_is_not_followed(folder, tmp_path):
    path = tmp_path / "c.cache"
    ds = fastload.ImageFolder(folder, cache=str(path))
    expected = fastload.ImageFolder(folder)[2][0]
    ds[2]
    with open(path, "r+b") as f:  # entry 2's offset and size point past the file
        f.seek(4096 + 2 * 32)
        f.write((1 << 62).to_bytes(8, "little") * 2)
    np.testing.assert_array_equal(ds[2][0], expected)
    assert ds.cache.stats()["hits"] == 0


def test_a_changed_dataset_gets_a_new_cache(own_folder, tmp_path):
    from PIL import Image

    path = str(tmp_path / "c.cache")
    old = fastload.ImageFolder(own_folder, cache=path)
    for i in range(len(old)):
        old[i]
    before = old[0][0]
    changed = old.path(0)
    Image.fromarray(np.full((20, 30, 3), 77, np.uint8)).save(changed, "JPEG")
    new = fastload.ImageFolder(own_folder, cache=path)
    assert new.cache.stats()["stored"] == 0  # not the stale entries
    np.testing.assert_array_equal(new[0][0], fastload.ImageFolder(own_folder)[0][0])
    assert new[0][0].shape == (20, 30, 3)
    # The old dataset keeps its own (now unlinked) file, unharmed.
    np.testing.assert_array_equal(old[0][0], before)


def test_a_foreign_file_at_the_path_is_replaced(folder, tmp_path):
    path = tmp_path / "not_a_cache"
    path.write_bytes(b"something else entirely" * 1000)
    ds = fastload.ImageFolder(folder, cache=str(path))
    ds[0]
    assert ds.cache.stats()["stored"] == 1
    assert path.read_bytes()[:8] != b"somethin"


# ------------------------------------------------------------- arguments

def test_bad_arguments_are_clear(folder, tmp_path):
    with pytest.raises(FileNotFoundError, match="no_such_dir"):
        fastload.ImageFolder(folder, cache=str(tmp_path / "no_such_dir" / "c.cache"))
    with pytest.raises(IsADirectoryError):
        fastload.ImageFolder(folder, cache=str(tmp_path))
    with pytest.raises(TypeError, match="cache must be"):
        fastload.ImageFolder(folder, cache=5)
    with pytest.raises(ValueError, match="leaves no room"):
        fastload.ImageFolder(folder, cache="memory", cache_size=100)
    with pytest.raises(ValueError, match="cache is None"):
        fastload.ImageFolder(folder, cache_size=1 << 20)
    with pytest.raises(ValueError, match="loader"):
        fastload.ImageFolder(folder, cache="memory", loader=lambda p: p)


def test_webdataset_shards_use_the_cache(folder, tmp_path):
    paths = fastload.shards_from_image_folder(folder, str(tmp_path / "s-%02d.tar"), maxcount=5)
    plain = fastload.WebDataset(paths, transform=transform())
    ds = fastload.WebDataset(paths, transform=transform(), cache="memory")
    assert_same(epochs(ds), epochs(plain))
    assert (ds.cache.stats()["stored"], ds.cache.stats()["hits"]) == (N, N)


# ------------------------------------------------------- decoded pixels

DECODED_SIZE = 1 << 24  # room for the 12 images' pixels (about 9 MB)


@pytest.fixture(scope="module")
def exact_reference(folder):
    pytest.importorskip("torch")
    return epochs(fastload.ImageFolder(folder, transform=transform(), decode="exact"))


@pytest.mark.parametrize("decode", ["fast", "exact"])
@pytest.mark.parametrize("workers", [0, 2])
def test_decoded_cache_gives_the_exact_decode_every_epoch(folder, exact_reference, decode,
                                                          workers):
    ds = fastload.ImageFolder(folder, transform=transform(), decode=decode, cache="memory",
                              cache_size=DECODED_SIZE, cache_decoded=True)
    assert_same(epochs(ds, num_workers=workers), exact_reference)
    stats = ds.cache.stats()
    assert (stats["stored"], stats["hits"]) == (N, N)
    # Each entry is the image's pixels: 3 bytes a pixel and a 16-byte header.
    pixels = sum(16 + 3 * w * h for w, h in (ds._raw.geometry(i, 0, 0)["size"]
                                            for i in range(N)))
    assert pixels <= stats["used"] < pixels + 8 * N


def test_process_workers_share_the_decoded_cache(folder, exact_reference):
    ds = fastload.ImageFolder(folder, transform=transform(), cache="memory",
                              cache_size=DECODED_SIZE, cache_decoded=True)
    assert_same(epochs(ds, num_workers=2, worker_mode="process"), exact_reference)
    assert (ds.cache.stats()["stored"], ds.cache.stats()["hits"]) == (N, N)


def test_python_transforms_get_the_cached_pixels(folder):
    plain = fastload.ImageFolder(folder, transform=np.ascontiguousarray)
    ds = fastload.ImageFolder(folder, transform=np.ascontiguousarray, cache="memory",
                              cache_size=DECODED_SIZE, cache_decoded=True)
    for _ in range(2):
        np.testing.assert_array_equal(ds[7][0], plain[7][0])
    assert (ds.cache.stats()["stored"], ds.cache.stats()["hits"]) == (1, 1)


def test_png_and_webp_are_kept_decoded(tmp_path):
    from PIL import Image

    rng = np.random.default_rng(3)
    paths = []
    for i, fmt in enumerate(["PNG", "WEBP", "PNG"]):
        paths.append(str(tmp_path / f"{i}.{fmt.lower()}"))
        Image.fromarray(rng.integers(0, 256, (40 + i, 50, 3), np.uint8)).save(paths[-1], fmt)
    plain = fastload.ImageFiles(paths, transform=transform())
    ds = fastload.ImageFiles(paths, transform=transform(), cache="memory", cache_size=1 << 20,
                             cache_decoded=True)
    assert_same(epochs(ds), epochs(plain))
    assert (ds.cache.stats()["stored"], ds.cache.stats()["hits"]) == (3, 3)


def test_a_bytes_cache_file_is_not_read_as_pixels(folder, exact_reference, tmp_path):
    path = str(tmp_path / "c.cache")
    encoded = fastload.ImageFolder(folder, cache=path, cache_size=DECODED_SIZE)
    for i in range(N):
        encoded[i]
    ds = fastload.ImageFolder(folder, transform=transform(), cache=path,
                              cache_size=DECODED_SIZE, cache_decoded=True)
    assert ds.cache.stats()["stored"] == 0  # another key: the file was replaced
    assert_same(epochs(ds), exact_reference)


def test_a_corrupt_decoded_entry_is_decoded_again(folder, tmp_path):
    path = tmp_path / "c.cache"
    ds = fastload.ImageFolder(folder, cache=str(path), cache_size=DECODED_SIZE,
                              cache_decoded=True)
    expected = fastload.ImageFolder(folder)[5][0]
    np.testing.assert_array_equal(ds[5][0], expected)
    where = ds.cache.file_offset(5)
    with open(path, "r+b") as f:  # change pixels
        f.seek(where + 1000)
        f.write(b"\0" * 64)
    np.testing.assert_array_equal(ds[5][0], expected)
    stats = ds.cache.stats()
    assert (stats["corrupt"], stats["hits"], stats["stored"]) == (1, 0, 2)


def test_decoded_cache_arguments_are_clear(folder):
    with pytest.raises(ValueError, match="needs cache_size"):
        fastload.ImageFolder(folder, cache="memory", cache_decoded=True)
    with pytest.raises(ValueError, match="cache is None"):
        fastload.ImageFolder(folder, cache_decoded=True)


# ------------------------------------------------------- a file cut short

TRUNCATED_CACHE = """
import os
import numpy as np, torch
from PIL import Image
import fastload
from fastload import transforms as T

root, cache, workers, decoded, cut = {root!r}, {cache!r}, {workers}, {decoded}, {cut}
rng = np.random.default_rng(0)
for c in range(2):
    os.makedirs(os.path.join(root, f"c{{c}}"))
    for i in range(6):
        Image.fromarray(rng.integers(0, 255, (40, 48, 3), np.uint8)).save(
            os.path.join(root, f"c{{c}}", f"{{i}}.jpg"), quality=90)

def epoch(ds):
    loader = fastload.DataLoader(ds, batch_size=4, shuffle=True, num_workers=workers,
                                 output="numpy", generator=torch.Generator().manual_seed(5))
    return [(x.copy(), y.copy()) for x, y in loader]

tf = T.Compose([T.RandomResizedCrop(24), T.ToTensor()])
options = dict(cache_decoded=True, cache_size=1 << 20) if decoded else {{}}
plain = fastload.ImageFolder(root, transform=tf, decode="exact" if decoded else "fast")
ds = fastload.ImageFolder(root, transform=tf, cache=cache, **options)
first = epoch(ds)
assert ds.cache.stats()["stored"] == 12 and not ds.cache.stats()["broken"]
os.truncate(cache, cut)  # another process cuts the file between epochs
for a, b in zip(epoch(ds) + [(None, None)], epoch(plain) + [(None, None)]):
    if a[0] is None:
        assert b[0] is None
        continue
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
stats = ds.cache.stats()
print("stats:", stats)
assert stats["broken"] and stats["hits"] == 0, stats
assert [len(x) for x, _ in first] == [4, 4, 4]
# A dataset made anew sets the cache file up again and uses it.
again = fastload.ImageFolder(root, transform=tf, cache=cache, **options)
epoch(again)
epoch(again)
assert again.cache.stats()["hits"] == 12 and not again.cache.stats()["broken"]
print("done")
"""


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("decoded", [False, True])
@pytest.mark.parametrize("cut", [0, 4096])
def test_a_cache_file_cut_short_between_epochs_is_dropped(tmp_path, workers, decoded, cut):
    """Another process cuts the cache file short between epochs: every read
    and write of its mapping runs under the bus-error guard, so instead of
    the process dying of SIGBUS the cache is marked broken and every sample
    is read from its source (the same batches), and stats() says so."""
    from fl_helpers import assert_child_ok, run_in_child

    result = run_in_child(TRUNCATED_CACHE.format(
        root=str(tmp_path / "images"), cache=str(tmp_path / "c.cache"), workers=workers,
        decoded=decoded, cut=cut))
    assert_child_ok(result)


def test_stats_report_broken_false(folder, tmp_path):
    ds = fastload.ImageFolder(folder, cache=str(tmp_path / "c.cache"))
    assert ds.cache.stats()["broken"] is False


def test_a_cache_whose_space_cannot_be_reserved_leaves_no_file(folder, tmp_path):
    """posix_fallocate failing (here past RLIMIT_FSIZE, as a full /dev/shm
    fails with ENOSPC) raises OSError naming the file, and removes the file
    this attempt made; a file that was there before is left."""
    from fl_helpers import assert_child_ok, run_in_child

    made, existing = tmp_path / "made.cache", tmp_path / "existing.cache"
    existing.write_bytes(b"")
    result = run_in_child(f"""
        import resource, signal, fastload
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 16, resource.RLIM_INFINITY))
        for path in ({str(made)!r}, {str(existing)!r}):
            try:
                fastload.ImageFolder({str(folder)!r}, cache=path, cache_size=1 << 24)
            except OSError as e:
                print("raised:", e)
        print("done")
    """)
    assert_child_ok(result)
    assert result.stdout.count("cannot reserve the cache's space") == 2, result.stdout
    assert str(made) in result.stdout
    assert not made.exists()
    assert existing.exists() and existing.stat().st_size == 0
