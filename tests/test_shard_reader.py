"""fastload.WebDataset and ShardSampler: WebDataset tar shards read natively."""

import io
import itertools
import os
import shutil
import tarfile

import numpy as np
import pytest

import fastload
from fastload import transforms as T
from fastload.datasets.webdataset import expand_urls

Image = pytest.importorskip("PIL.Image")
torch = pytest.importorskip("torch")

SHARD_SIZES = (5, 7, 4, 6)


def encode(pixels, fmt="JPEG"):
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, fmt)
    return buffer.getvalue()


def add(tf, name, data):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tf.addfile(info, io.BytesIO(data))


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """Shards written with tarfile, and the same images as files."""
    root = tmp_path_factory.mktemp("shards")
    rng = np.random.default_rng(0)
    files, labels, n = [], [], 0
    for s, size in enumerate(SHARD_SIZES):
        with tarfile.open(root / f"shard-{s:03d}.tar", "w", format=tarfile.GNU_FORMAT) as tf:
            for _ in range(size):
                fmt, ext = ("PNG", "png") if n % 5 == 4 else ("JPEG", "jpg")
                data = encode(rng.integers(0, 256, (24, 30, 3), dtype=np.uint8), fmt)
                key = f"class{n % 3}/sample{n:05d}"
                add(tf, f"{key}.{ext}", data)
                add(tf, f"{key}.cls", str(n % 3).encode())
                add(tf, f"{key}.json", b'{"n": %d}' % n)
                path = root / "files" / f"{n:05d}.{ext}"
                path.parent.mkdir(exist_ok=True)
                path.write_bytes(data)
                files.append(str(path))
                labels.append(n % 3)
                n += 1
    return root, files, labels


def pattern(root):
    return str(root / f"shard-{{000..{len(SHARD_SIZES) - 1:03d}}}.tar")


def test_expand_urls():
    assert expand_urls("a-{08..10}.tar") == ["a-08.tar", "a-09.tar", "a-10.tar"]
    assert expand_urls("{x,y}/s{1..2}.tar::z.tar") == ["x/s1.tar", "x/s2.tar", "y/s1.tar",
                                                       "y/s2.tar", "z.tar"]
    assert expand_urls(["p.tar", "q.tar"]) == ["p.tar", "q.tar"]
    with pytest.raises(ValueError, match="empty range"):
        expand_urls("s{3..1}.tar")


def test_samples_match_the_same_images_as_files(shards):
    root, files, labels = shards
    transform = T.Compose([T.Resize((10, 12)), T.ToTensor()])
    ds = fastload.WebDataset(pattern(root), transform=transform)
    reference = fastload.ImageFiles(files, labels, transform=transform)
    assert len(ds) == len(reference) == sum(SHARD_SIZES)
    assert ds.keys[6] == "class0/sample00006" and ds.shard_of(6) == 1
    assert ds.path(6).endswith("shard-001.tar:class0/sample00006")
    for num_workers in (0, 2):
        got = list(fastload.DataLoader(ds, batch_size=4, num_workers=num_workers))
        want = list(fastload.DataLoader(reference, batch_size=4))
        for (a, la), (b, lb) in zip(got, want):
            assert torch.equal(a, b) and torch.equal(la, lb)
    image, label = ds[4]  # a PNG member, through Pillow
    assert label == 1 and np.array_equal(image, reference[4][0])


def test_random_augmentation_does_not_depend_on_workers(shards):
    root, _, _ = shards
    ds = fastload.WebDataset(pattern(root), transform=T.Compose(
        [T.RandomResizedCrop(8), T.RandomHorizontalFlip(), T.ToTensor()]))

    def epoch(num_workers):
        sampler = fastload.ShardSampler(ds, seed=3, buffer_size=4)
        loader = fastload.DataLoader(ds, batch_size=5, sampler=sampler, num_workers=num_workers,
                                     generator=torch.Generator().manual_seed(1))
        return list(loader)

    for (a, la), (b, lb) in zip(epoch(0), epoch(2)):
        assert torch.equal(a, b) and torch.equal(la, lb)


# webdataset leaves its shard files to the garbage collector.
@pytest.mark.filterwarnings("ignore::ResourceWarning",
                            "ignore::pytest.PytestUnraisableExceptionWarning")
def test_reads_shards_written_by_webdataset(tmp_path):
    wds = pytest.importorskip("webdataset")
    rng = np.random.default_rng(1)
    images = [rng.integers(0, 256, (16, 16, 3), dtype=np.uint8) for _ in range(6)]
    with wds.TarWriter(str(tmp_path / "w.tar")) as sink:
        for i, pixels in enumerate(images):
            sink.write({"__key__": f"k{i}", "png": pixels, "cls": i % 4})
    ds = fastload.WebDataset(str(tmp_path / "w.tar"))
    theirs = list(wds.WebDataset(str(tmp_path / "w.tar"), shardshuffle=False)
                  .decode("rgb8").to_tuple("__key__", "png", "cls"))
    assert ds.keys == [key for key, _, _ in theirs]
    for i, (key, pixels, label) in enumerate(theirs):
        image, ours = ds[i]
        assert ours == label and np.array_equal(image, pixels) and np.array_equal(image,
                                                                                  images[i])


def test_shard_sampler_covers_every_sample_once(shards):
    root, _, _ = shards
    ds = fastload.WebDataset(pattern(root))
    sampler = fastload.ShardSampler(ds, seed=5, buffer_size=3)
    first = list(sampler)
    assert sorted(first) == list(range(len(ds))) and len(sampler) == len(ds)
    assert list(sampler) == first  # keyed by (seed, epoch) only
    sampler.set_epoch(1)
    assert list(sampler) != first and sorted(sampler) == list(range(len(ds)))
    plain = fastload.ShardSampler(ds, shuffle=False)
    assert list(plain) == list(range(len(ds)))


@pytest.mark.parametrize("world", [2, 3, 5])
def test_shard_sampler_splits_the_stream_between_ranks_by_samples(shards, world):
    root, _, _ = shards
    ds = fastload.WebDataset(pattern(root))
    n = len(ds)  # 22 samples in shards of 5, 7, 4 and 6

    def parts(**kwargs):
        return [list(fastload.ShardSampler(ds, seed=2, rank=r, world_size=world, **kwargs))
                for r in range(world)]

    # Each rank's share is a run of the epoch's stream, N/W samples give or take one.
    stream = list(fastload.ShardSampler(ds, seed=2, buffer_size=0))
    shares = parts(equal_length=False, buffer_size=0)
    assert sum(shares, []) == stream
    assert {len(p) for p in shares} <= {n // world, -(-n // world)}
    # Shuffled through the buffer: the same shares, in another order.
    shuffled = parts(equal_length=False)
    assert [sorted(p) for p in shuffled] == [sorted(p) for p in shares] and shuffled != shares
    # Equal lengths: padded with the share's first sample, or one left out.
    padded, dropped = parts(), parts(drop_last=True)
    assert {len(p) for p in padded} == {-(-n // world)}
    assert {len(p) for p in dropped} == {n // world}
    assert set(sum(padded, [])) == set(range(n))
    assert len(set(sum(dropped, []))) == n // world * world
    for share, pad, drop in zip(shares, padded, dropped):
        assert set(drop) <= set(share) and set(pad) == set(share)
        assert len(pad) == len(share) or pad.count(share[0]) == 2


def test_shard_sampler_splits_more_ranks_than_shards(shards):
    root, _, _ = shards
    ds = fastload.WebDataset(pattern(root))
    world = len(SHARD_SIZES) * 2  # shares inside shards
    parts = [list(fastload.ShardSampler(ds, seed=1, rank=r, world_size=world, drop_last=True))
             for r in range(world)]
    assert len({i for p in parts for i in p}) == len(ds) // world * world
    with pytest.raises(ValueError, match="23 ranks"):
        fastload.ShardSampler(ds, rank=0, world_size=len(ds) + 1)


class _Shards:
    """What ShardSampler reads of a WebDataset: the first sample of each shard."""

    def __init__(self, total, shard):
        sizes = [shard] * (total // shard) + ([total % shard] if total % shard else [])
        self.shard_starts = np.concatenate(([0], np.cumsum(sizes)))


IMAGENET = 1_281_167  # ImageNet-1k's training samples


@pytest.mark.parametrize("shard", [1000, 5000])
def test_an_epoch_shows_every_sample_at_thousands_of_ranks(shard):
    ds = _Shards(IMAGENET, shard)
    for world in (1, 8, 64, 256, 512, 1024, 4096):
        ranks = (0, world // 2, world - 1)
        padded = [fastload.ShardSampler(ds, rank=r, world_size=world) for r in ranks]
        dropped = [fastload.ShardSampler(ds, rank=r, world_size=world, drop_last=True)
                   for r in ranks]
        assert {len(s) for s in padded} == {-(-IMAGENET // world)}
        assert {len(s) for s in dropped} == {IMAGENET // world}
        # The shares cover the stream, end to end: padded, every sample is shown.
        shares = [padded[0].share(r) for r in range(world)]
        assert shares[0][0] == 0 and shares[-1][1] == IMAGENET
        assert all(a[1] == b[0] for a, b in zip(shares, shares[1:]))
        assert world * len(padded[0]) - IMAGENET < world  # repeated to equal lengths
        # With drop_last, fewer than one a rank is left out.
        shown = world * len(dropped[0])
        assert IMAGENET - shown < world, (world, shown)
        assert world > 1024 or shown / IMAGENET >= 0.999, (world, shown)
    # Every rank's indices at 1,024 ranks, one epoch: each sample once.
    world, seen = 1024, np.zeros(IMAGENET, np.int32)
    for rank in range(world):
        sampler = fastload.ShardSampler(ds, seed=3, buffer_size=0, rank=rank, world_size=world,
                                        equal_length=False)
        sampler.set_epoch(2)
        seen[np.fromiter(sampler, np.int64)] += 1
    assert (seen == 1).all()


def test_resume_with_the_shard_sampler(shards):
    root, _, _ = shards
    ds = fastload.WebDataset(pattern(root), transform=T.Compose(
        [T.RandomResizedCrop(8), T.ToTensor()]))

    def make():
        return fastload.DataLoader(ds, batch_size=3, sampler=fastload.ShardSampler(ds, seed=9),
                                   num_workers=2, generator=torch.Generator().manual_seed(4))

    full = list(make())
    loader = make()
    it = iter(loader)
    head = [next(it) for _ in range(2)]
    state = loader.state_dict()
    resumed = make()
    resumed.load_state_dict(state)
    for (a, la), (b, lb) in zip(head + list(resumed), full):
        assert torch.equal(a, b) and torch.equal(la, lb)


def test_bad_shards_are_named(tmp_path):
    with tarfile.open(tmp_path / "nolabel.tar", "w") as tf:
        add(tf, "a.jpg", encode(np.zeros((4, 4, 3), np.uint8)))
    with pytest.raises(ValueError, match=r"nolabel\.tar: sample 'a' has no \.cls member"):
        fastload.WebDataset(str(tmp_path / "nolabel.tar"))
    assert len(fastload.WebDataset(str(tmp_path / "nolabel.tar"), label_extension=None)) == 1

    with tarfile.open(tmp_path / "noimage.tar", "w") as tf:
        add(tf, "b.cls", b"1")
    with pytest.raises(ValueError, match=r"noimage\.tar: sample 'b' has no image member"):
        fastload.WebDataset(str(tmp_path / "noimage.tar"))

    with tarfile.open(tmp_path / "badcls.tar", "w") as tf:
        add(tf, "c.jpg", encode(np.zeros((4, 4, 3), np.uint8)))
        add(tf, "c.cls", b"cat")
    with pytest.raises(ValueError, match=r"c\.cls holds b'cat', not an integer"):
        fastload.WebDataset(str(tmp_path / "badcls.tar"))

    (tmp_path / "text.tar").write_bytes(b"not a tar file at all" * 40)
    with pytest.raises(fastload.DecodeError, match="text.tar"):
        fastload.WebDataset(str(tmp_path / "text.tar"))


def test_a_shard_truncated_after_indexing_fails_its_sample(tmp_path):
    with tarfile.open(tmp_path / "s.tar", "w") as tf:
        for i in range(3):
            add(tf, f"k{i}.jpg", encode(np.full((8, 8, 3), i * 40, np.uint8)))
            add(tf, f"k{i}.cls", b"0")
    ds = fastload.WebDataset(str(tmp_path / "s.tar"),
                             transform=T.Compose([T.Resize((8, 8)), T.ToTensor()]))
    data = (tmp_path / "s.tar").read_bytes()
    (tmp_path / "s.tar").write_bytes(data[:int(ds._ranges[2, 0]) + 10])
    loader = fastload.DataLoader(ds, batch_size=3, num_workers=1)
    with pytest.raises(OSError, match=r"truncated \(sample index 2\).*s\.tar"):
        next(iter(loader))


def test_a_shard_cut_between_indexing_and_its_labels_raises(tmp_path):
    """The labels are read right after the shard is indexed: a shard cut
    short in between (simulated: cut just after it is indexed) raises
    OSError naming it and the sample."""
    from fl_helpers import assert_child_ok, run_in_child

    path = tmp_path / "s.tar"
    with tarfile.open(path, "w") as tf:
        for i in range(64):
            add(tf, f"k{i:02d}.jpg", encode(np.full((32, 32, 3), i, np.uint8)))
            add(tf, f"k{i:02d}.cls", b"%d" % i)
    result = run_in_child(f"""
        import os, fastload, fastload.datasets.webdataset as shard_reader

        class CutWhenIndexed:
            def __getattr__(self, name):
                return getattr(fastload._C, name)

            @staticmethod
            def tar_index(*args):
                index = fastload._C.tar_index(*args)
                os.truncate({str(path)!r}, {os.sysconf("SC_PAGESIZE")})
                return index

        shard_reader._C = CutWhenIndexed()
        try:
            fastload.WebDataset({str(path)!r})
        except OSError as e:
            print("raised:", e)
        print("done")
    """)
    assert_child_ok(result)
    assert (f"file changed under the loader: {str(path)!r} is shorter than when it was opened "
            "(the .cls member of sample 'k") in result.stdout, result.stdout


def test_shards_written_by_fastload_read_back_as_the_folder(shards, tmp_path):
    root, files, labels = shards
    folder = tmp_path / "folder"
    for path, label in zip(files, labels):
        (folder / f"c{label}").mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, folder / f"c{label}" / os.path.basename(path))
    transform = T.Compose([T.Resize((9, 9)), T.ToTensor()])
    reference = fastload.ImageFolder(folder, transform=transform)
    written = fastload.shards_from_image_folder(reference, str(tmp_path / "out-%03d.tar"),
                                                maxcount=8)
    assert len(written) == -(-len(files) // 8)
    ds = fastload.WebDataset(written, transform=transform)
    assert len(ds) == len(reference)
    for (a, la), (b, lb) in zip(fastload.DataLoader(ds, batch_size=6, num_workers=2),
                                fastload.DataLoader(reference, batch_size=6)):
        assert torch.equal(a, b) and torch.equal(la, lb)


def test_fields_decode_other_members_as_webdataset_does(shards):
    root, _, labels = shards
    transform = T.Compose([T.Resize((5, 5)), T.ToTensor()])
    ds = fastload.WebDataset(pattern(root), transform=transform, fields=("image", "json", "cls"))
    image, meta, cls = ds[6]
    assert image.shape == (3, 5, 5) and meta == {"n": 6} and cls == labels[6]
    assert ds._native_source() is None  # samples read in Python
    whole = fastload.WebDataset(pattern(root), fields="dict",
                                decoders={"json": lambda data: data.upper()})
    sample = whole[4]
    assert sorted(sample) == ["__key__", "cls", "image", "json", "label", "png"]
    assert sample["__key__"] == "class1/sample00004" and sample["json"] == b'{"N": 4}'
    assert sample["png"].shape == (24, 30, 3) and np.array_equal(sample["png"], sample["image"])
    with pytest.raises(KeyError, match=r"shard-000\.tar:class0/sample00000 has no \.txt member"):
        fastload.WebDataset(pattern(root), fields=("txt",))[0]
    batches = list(fastload.DataLoader(ds, batch_size=4, num_workers=2))
    assert [m["n"].tolist() for _, m, _ in batches][0] == [0, 1, 2, 3]


def test_fields_without_the_image_do_not_decode_it(shards, monkeypatch):
    root, _, labels = shards
    ds = fastload.WebDataset(pattern(root), fields=("json", "cls"))
    monkeypatch.setattr(fastload.ImageFiles, "_read", lambda self, i: pytest.fail("decoded"))
    assert ds[-1] == ({"n": len(ds) - 1}, labels[-1])
    with pytest.raises(IndexError, match="out of range"):
        ds[len(ds)]


class _Indices(_Shards):
    """A dataset whose sample is its index, in shards: what ranks saw, by index."""

    def __init__(self, sizes):
        self.shard_starts = np.concatenate(([0], np.cumsum(sizes)))

    def __len__(self):
        return int(self.shard_starts[-1])

    def __getitem__(self, index):
        return index


def _run(ds, world, batches, state=None, **kwargs):
    """Each rank of a run: (the indices it yielded, its state after `batches`
    batches, or at the end when None)."""
    out = []
    for rank in range(world):
        sampler = fastload.ShardSampler(ds, seed=7, buffer_size=3, rank=rank, world_size=world,
                                        **kwargs)
        sampler.set_epoch(1)
        loader = fastload.DataLoader(ds, batch_size=2, sampler=sampler)
        if state is not None:
            loader.load_state_dict(state)
        it, seen = iter(loader), []
        for batch in itertools.islice(it, batches):
            seen += batch.tolist()
        out.append((seen, loader.state_dict()))
    return out


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("worlds", [(4, 3), (2, 4), (4, 3, 2)])
def test_elastic_resume_shows_the_rest_of_the_epoch_once(worlds, drop_last):
    ds = _Indices([9, 4, 7, 5, 6, 8, 3])  # 42 samples in unequal shards
    n, shown, state = len(ds), [], None
    for world in worlds[:-1]:  # each run stops after 2 batches (4 samples) a rank
        ranks = _run(ds, world, 2, state, drop_last=drop_last)
        shown += [i for seen, _ in ranks for i in seen]
        state = ranks[-1][1]  # any rank's state: every rank yielded as many
        assert len(shown) == len(set(shown))
    last = _run(ds, worlds[-1], None, state, drop_last=drop_last)
    rest = [i for seen, _ in last for i in seen]
    counts = {len(seen) for seen, _ in last}
    assert len(counts) == 1  # equal lengths on the new ranks too
    every = shown + rest
    if drop_last:
        assert len(every) == len(set(every)) and n - len(every) < worlds[-1]
    else:
        assert set(every) == set(range(n)) and len(every) - n < worlds[-1]
    # The new ranks' shares are runs of what was left, in the stream's order.
    sampler = fastload.ShardSampler(ds, seed=7, buffer_size=0, rank=0, world_size=1)
    sampler.set_epoch(1)
    stream = list(sampler)
    left = [i for i in stream if i not in set(shown)]
    if drop_last:  # each new rank leaves out at most one of its share
        assert set(rest) <= set(left) and len(rest) == len(left) // worlds[-1] * worlds[-1]
    else:
        assert set(rest) == set(left)


def test_a_continued_epoch_resumes_on_the_same_ranks_too():
    ds = _Indices([9, 4, 7, 5, 6, 8, 3])
    first = _run(ds, 4, 2)
    state = first[0][1]
    # Three ranks take over and stop after one more batch each; rank 1 resumes again.
    second = _run(ds, 3, 1, state)
    again = _run(ds, 3, None, second[1][1])
    plain = _run(ds, 3, None, state)
    assert again[1][0] == plain[1][0][2:]  # the rest of rank 1's share, as if not stopped


def test_elastic_resume_at_1024_ranks_by_computation():
    ds = _Shards(IMAGENET, 1000)
    old, new, yielded = 1024, 768, 600
    settings = {"seed": 0, "shuffle": True, "buffer_size": 0, "equal_length": True,
                "drop_last": False, "epoch": 0, "world_size": old}
    sampler = fastload.ShardSampler(ds, buffer_size=0, rank=5, world_size=new)
    assert sampler.continue_epoch(settings, [[old, yielded]])
    rest = sampler._rest()
    assert len(rest) == IMAGENET - old * yielded and len(np.unique(rest)) == len(rest)
    shown = np.zeros(IMAGENET, bool)
    for rank in range(old):
        first, _ = fastload.ShardSampler(ds, buffer_size=0, rank=rank, world_size=old).share()
        # Without a buffer a rank's first samples are the first of its share.
        shown[list(fastload.ShardSampler(ds, buffer_size=0, world_size=1).stream(
            first, first + yielded))] = True
    assert not shown[rest].any() and shown.sum() + len(rest) == IMAGENET
    assert len(sampler) == -(-len(rest) // new)
    assert not sampler.continue_epoch(dict(settings, seed=1), [[old, yielded]])


# ------------------------------------------------------------ index files

def _same(a, b):
    assert len(a) == len(b) and a.keys == b.keys
    assert np.array_equal(a.targets, b.targets)
    assert all(a.path(i) == b.path(i) for i in range(len(a)))


def _no_header_reads(monkeypatch):
    """Makes reading a shard's headers fail: what still works used index files."""
    from fastload.datasets import webdataset

    class NoScan:
        def __getattr__(self, name):
            return getattr(fastload._C, name)

        @staticmethod
        def tar_index(*args):
            raise AssertionError("a shard's headers were read")

    monkeypatch.setattr(webdataset, "_C", NoScan())


def test_write_shards_writes_index_files_that_readers_use(tmp_path, monkeypatch):
    rng = np.random.default_rng(1)
    samples = [(encode(rng.integers(0, 256, (6, 6, 3), dtype=np.uint8)), i % 3)
               for i in range(11)]
    paths = fastload.write_shards(samples, str(tmp_path / "w-%02d.tar"), maxcount=4)
    assert all(os.path.exists(p + ".fastload-index") for p in paths)
    scanned = fastload.WebDataset(paths, index_files=False)
    _no_header_reads(monkeypatch)
    indexed = fastload.WebDataset(paths, transform=T.Compose([T.Resize((6, 6)), T.ToTensor()]))
    _same(indexed, scanned)
    assert [int(y) for _, y in fastload.DataLoader(indexed, batch_size=None)] == \
        [i % 3 for i in range(11)]


def test_a_shard_without_one_gets_an_index_file_on_first_read(shards, tmp_path, monkeypatch):
    root, _, _ = shards
    for s in range(len(SHARD_SIZES)):
        shutil.copyfile(root / f"shard-{s:03d}.tar", tmp_path / f"shard-{s:03d}.tar")
    scanned = fastload.WebDataset(pattern(tmp_path), index_files=False)
    assert not list(tmp_path.glob("*.fastload-index"))
    first = fastload.WebDataset(pattern(tmp_path))
    assert len(list(tmp_path.glob("*.fastload-index"))) == len(SHARD_SIZES)
    with monkeypatch.context() as m:
        _no_header_reads(m)
        _same(fastload.WebDataset(pattern(tmp_path)), first)
        # Another choice of label or image members: derived again from the
        # member index the file holds, not from the headers.
        again = fastload.WebDataset(pattern(tmp_path), label_extension=None,
                                    image_extensions=("png", "jpg"))
        assert len(again) == len(first) and set(again.targets) == {0}
    _same(first, scanned)


@pytest.mark.parametrize("damage", ["rewritten", "truncated", "garbage", "flipped"])
def test_a_stale_or_damaged_index_file_is_rebuilt(shards, tmp_path, damage):
    root, _, _ = shards
    shard = tmp_path / "s.tar"
    shutil.copyfile(root / "shard-000.tar", shard)
    index = tmp_path / "s.tar.fastload-index"
    fastload.WebDataset(str(shard))
    data = index.read_bytes()
    if damage == "rewritten":  # the shard changed: another one under the same name
        shutil.copyfile(root / "shard-001.tar", shard)
    elif damage == "truncated":
        index.write_bytes(data[:len(data) // 2])
    elif damage == "garbage":
        index.write_bytes(b"\x00" * len(data))
    else:  # one bit of an array: the checksum
        index.write_bytes(data[:-9] + bytes([data[-9] ^ 1]) + data[-8:])
    read = fastload.WebDataset(str(shard))
    _same(read, fastload.WebDataset(str(shard), index_files=False))
    assert fastload.datasets.shard_index.load(str(shard)) is not None  # written again


def test_an_index_file_that_cannot_be_written_beside_goes_to_the_cache_folder(
        shards, tmp_path, monkeypatch):
    root, _, _ = shards
    shutil.copyfile(root / "shard-002.tar", tmp_path / "s.tar")
    (tmp_path / "s.tar.fastload-index").mkdir()  # in the way, as a read-only folder would be
    cache = tmp_path / "cache"
    monkeypatch.setenv("FASTLOAD_INDEX_DIR", str(cache))
    first = fastload.WebDataset(str(tmp_path / "s.tar"))
    assert len(list(cache.glob("*s.tar.fastload-index"))) == 1
    _no_header_reads(monkeypatch)
    _same(fastload.WebDataset(str(tmp_path / "s.tar")), first)


# ----------------------------------------------- index files read by share

def _written(tmp_path, count=24, per=4, bad=()):
    """Shards of ``per`` small JPEGs (label i % 3) written by write_shards;
    the samples in ``bad`` hold the first bytes of one only."""
    rng = np.random.default_rng(2)
    samples = [(encode(rng.integers(0, 256, (6, 6, 3), dtype=np.uint8))[:(20 if i in bad
                                                                          else None)], i % 3)
               for i in range(count)]
    return fastload.write_shards(samples, str(tmp_path / "r-%02d.tar"), maxcount=per)


def _index_reads(monkeypatch):
    """The shards whose index files' arrays are read, as they are read."""
    from fastload.datasets import shard_index

    read, get = set(), shard_index.IndexFile.get

    def recorded(self, name):
        read.add(self.path[:-len(shard_index.SUFFIX)])
        return get(self, name)

    monkeypatch.setattr(shard_index.IndexFile, "get", recorded)
    return read


SMALL = T.Compose([T.Resize((6, 6)), T.ToTensor()])


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_rank_reads_the_index_files_of_its_own_shards_only(tmp_path, monkeypatch,
                                                             num_workers):
    paths = _written(tmp_path)
    scanned = fastload.WebDataset(paths, transform=SMALL, index_files=False)
    read = _index_reads(monkeypatch)
    _no_header_reads(monkeypatch)
    ds = fastload.WebDataset(paths, transform=SMALL)
    assert not read  # made from the files' headers: every shard's sample count
    for epoch in range(2):
        batches = []
        for dataset in (ds, scanned):
            sampler = fastload.ShardSampler(dataset, rank=1, world_size=4, buffer_size=3)
            sampler.set_epoch(epoch)
            loader = fastload.DataLoader(dataset, batch_size=2, sampler=sampler,
                                         num_workers=num_workers)
            batches.append([(x.numpy(), y.numpy()) for x, y in loader])
        assert len(batches[0]) == 3
        for (x, y), (x_scanned, y_scanned) in zip(*batches):
            assert np.array_equal(x, x_scanned) and np.array_equal(y, y_scanned)
        sampler = fastload.ShardSampler(ds, rank=1, world_size=4)
        sampler.set_epoch(epoch)
        first, end = sampler.share()
        wanted = {ds.urls[ds.shard_of(i)] for i in sampler.stream(first, end)}
        assert wanted <= read
    assert read == {ds.urls[s] for s in range(len(ds.urls)) if s not in ds._unloaded}
    assert len(read) < len(paths)  # two epochs of one rank in four: not every shard


def test_shards_read_by_share_give_what_every_access_path_gives(tmp_path):
    paths = _written(tmp_path, count=10, per=3)
    scanned = fastload.WebDataset(paths, transform=SMALL, index_files=False)
    fresh = lambda: fastload.WebDataset(paths, transform=SMALL)  # noqa: E731
    ds = fresh()
    assert len(ds._unloaded) == len(paths)
    assert ds.key(7) == scanned.key(7) and ds.path(4) == scanned.path(4)
    assert len(ds._unloaded) == len(paths) - 2
    assert np.array_equal(ds[9][0], scanned[9][0]) and ds[9][1] == scanned[9][1]
    copy = __import__("pickle").loads(__import__("pickle").dumps(fresh()))
    assert np.array_equal(copy[5][0], scanned[5][0])
    assert fresh().targets == scanned.targets and fresh().keys == scanned.keys
    assert list(fresh().samples) == list(scanned.samples)
    for dataset in (fresh(), scanned):  # worker processes load their own copies
        loader = fastload.DataLoader(dataset, batch_size=4, shuffle=True, num_workers=2,
                                     worker_mode="process",
                                     generator=torch.Generator().manual_seed(3))
        got = [(x.numpy(), y.numpy()) for x, y in loader]
        if dataset is scanned:
            assert all(np.array_equal(a, b) for pair in zip(got, expected)
                       for a, b in zip(*pair))
        expected = got


def test_a_skipped_sample_is_replaced_from_the_next_shard_read_by_share(tmp_path):
    paths = _written(tmp_path, count=12, per=4, bad={3})  # the last of the first shard
    batches = []
    for index_files in (True, False):
        ds = fastload.WebDataset(paths, transform=SMALL, on_error="skip",
                                 index_files=index_files)
        loader = fastload.DataLoader(ds, batch_size=2, sampler=[2, 3], num_workers=1)
        batches.append([(x.numpy(), y.numpy()) for x, y in loader])
        assert [record[0] for record in ds.skipped] == [3]
    (x, y), = batches[0]
    assert np.array_equal(x, batches[1][0][0]) and y.tolist() == [2, 4 % 3]


def test_a_shard_changed_after_the_dataset_was_made_is_named(tmp_path):
    paths = _written(tmp_path, count=8, per=4)
    ds = fastload.WebDataset(paths, transform=SMALL)
    os.unlink(paths[1] + ".fastload-index")
    shutil.copyfile(_written(tmp_path / "other", count=3, per=3)[0], paths[1])
    loader = fastload.DataLoader(ds, batch_size=4)
    with pytest.raises(ValueError, match=r"r-01\.tar: the shard changed .* 4 samples .* 3 now"):
        list(loader)
