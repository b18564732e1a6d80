"""fastload under the real torch.distributed (gloo, processes on localhost):
every sample seen once per epoch across ranks, equal batch counts on every
rank, and a DDP training loop that ends without a hang.

The ranks meet through a file store rather than a TCP store: no port to pick
(a free port found by the parent can be taken before rank 0 binds it) and no
store server thread in rank 0 to outlive the process group.  Each rank drops
its DDP model and destroys the group while the interpreter is whole, so no
collective-library object is left for interpreter shutdown to destroy."""

import gc
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not (dist.is_available() and dist.is_gloo_available()):
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

import torch.multiprocessing as tmp  # noqa: E402

# Process groups of 2-3 spawned interpreters: the plain run only.
pytestmark = pytest.mark.slow

N = 53  # not a multiple of any world size: padding and drop_last both matter
EPOCHS = 2


def make_dataset(kind, root):
    import fastload

    if kind == "arrays":
        return fastload.ArrayDataset(np.arange(N * 4, dtype=np.float32).reshape(N, 4),
                                     np.arange(N))
    from fastload import transforms as T

    transform = T.Compose([T.RandomResizedCrop(8), T.ToTensor()])
    if kind == "shards":
        return fastload.WebDataset(os.path.join(root, "s-{0..4}.tar"), transform=transform)
    return fastload.ImageFolder(root, transform=transform)


def spawn(world, *args, out):
    """Runs run_rank on `world` processes meeting at a store file beside `out`."""
    store = f"{out}.store"
    tmp.spawn(run_rank, args=(world, store, *args, str(out)), nprocs=world, join=True)


def run_rank(rank, world, store, kind, root, drop_last, num_workers, out):
    import fastload

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        ds = make_dataset(kind, root)
        labels = np.asarray(ds.targets if kind != "arrays" else np.arange(N))
        # rank and world size from torch.distributed
        sampler = (fastload.ShardSampler(ds, seed=1, buffer_size=4) if kind == "shards"
                   else fastload.DistributedSampler(ds, drop_last=drop_last))
        loader = fastload.DataLoader(ds, batch_size=4, sampler=sampler, num_workers=num_workers,
                                     persistent_workers=num_workers > 0)
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        seen, counts = [], []
        for epoch in range(EPOCHS):
            sampler.set_epoch(epoch)
            batches = 0
            for x, y in loader:
                features = x.reshape(len(x), -1)[:, :4].float()
                loss = model(features).square().mean()  # all-reduce in backward: a missing
                optimizer.zero_grad()                   # batch on one rank would hang here
                loss.backward()
                optimizer.step()
                seen.append((epoch, y.tolist()))
                batches += 1
            counts.append(batches)
        gathered = [None] * world
        dist.all_gather_object(gathered, (seen, counts))
        if rank == 0:
            torch.save({"gathered": gathered, "labels": labels}, out)
        dist.barrier()
        del model, optimizer, loss, loader  # DDP holds the group; gone before it is destroyed
        gc.collect()
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("drop_last", [False, True])
def test_ranks_see_each_sample_once_with_equal_batch_counts(tmp_path, world, drop_last):
    out = tmp_path / "result.pt"
    spawn(world, "arrays", None, drop_last, 0, out=out)
    result = torch.load(out, weights_only=False)
    per_rank = result["gathered"]
    counts = [c for _, c in per_rank]
    assert all(c == counts[0] for c in counts)  # the same batches on every rank, each epoch
    for epoch in range(EPOCHS):
        samples = [i for seen, _ in per_rank for e, batch in seen if e == epoch for i in batch]
        if drop_last:
            assert len(samples) == len(set(samples)) == (N // world) * world
        else:
            # Padded to equal shares with the first samples again, as torch's sampler.
            assert set(samples) == set(range(N))
            assert len(samples) == -(-N // world) * world
    rank0 = per_rank[0][0]
    orders = [[i for e, batch in rank0 if e == epoch for i in batch] for epoch in range(EPOCHS)]
    assert orders[0] != orders[1]  # set_epoch reshuffles


def test_image_folder_with_workers_under_ddp(tmp_path):
    from PIL import Image

    rng = np.random.default_rng(0)
    for c in range(3):
        (tmp_path / f"c{c}").mkdir()
        for i in range(7):
            Image.fromarray(rng.integers(0, 256, (12, 12, 3), dtype=np.uint8)).save(
                tmp_path / f"c{c}" / f"{i}.jpg")
    out = tmp_path / "result.pt"
    world = 2
    spawn(world, "images", str(tmp_path), False, 2, out=out)
    result = torch.load(out, weights_only=False)
    per_rank = result["gathered"]
    # 21 images: 11 a rank (one padded), 3 batches of at most 4, every epoch, on both ranks.
    assert [c for _, c in per_rank] == [[3] * EPOCHS] * world


@pytest.mark.parametrize("world", [2, 3])
def test_shard_sampler_shows_every_sample_with_equal_batch_counts(tmp_path, world):
    import io
    import tarfile

    from PIL import Image

    rng = np.random.default_rng(0)
    sample = 0
    for s, size in enumerate((9, 4, 7, 5, 6)):  # unequal shards, 31 samples
        with tarfile.open(tmp_path / f"s-{s}.tar", "w") as tf:
            for i in range(size):
                buffer = io.BytesIO()
                Image.fromarray(rng.integers(0, 256, (12, 12, 3), dtype=np.uint8)).save(
                    buffer, "JPEG")
                # Each sample's label is its number: the gathered labels say which were seen.
                for ext, data in (("jpg", buffer.getvalue()), ("cls", str(sample).encode())):
                    info = tarfile.TarInfo(f"{s}-{i}.{ext}")
                    info.size = len(data)
                    tf.addfile(info, io.BytesIO(data))
                sample += 1
    out = tmp_path / "result.pt"
    spawn(world, "shards", str(tmp_path), False, 1, out=out)
    per_rank = torch.load(out, weights_only=False)["gathered"]
    counts = [c for _, c in per_rank]
    assert all(c == counts[0] for c in counts)  # equal_length: DDP steps the same number of times
    for epoch in range(EPOCHS):
        samples = [i for seen, _ in per_rank for e, batch in seen if e == epoch for i in batch]
        # The stream split by samples, padded to equal shares: each sample once, fewer
        # than `world` twice.
        assert set(samples) == set(range(sample))
        assert len(samples) == -(-sample // world) * world


def run_datapipe_rank(rank, world, store, out):
    import fastload
    from torch.utils.data.datapipes.iter import IterableWrapper

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        results = {}
        for name, DataLoader in (("torch", torch.utils.data.DataLoader),
                                 ("fastload", fastload.DataLoader)):
            for num_workers in (0, 2):
                torch.manual_seed(100 + rank)  # each rank's own global seed
                datapipe = IterableWrapper(list(range(40))).shuffle(buffer_size=8)
                loader = DataLoader(datapipe.sharding_filter(), shuffle=True, batch_size=3,
                                    num_workers=num_workers)
                results[name, num_workers] = [[b.tolist() for b in loader] for _ in range(2)]
        torch.manual_seed(100 + rank)
        loader = fastload.DataLoader(
            IterableWrapper(list(range(40))).shuffle(buffer_size=8).sharding_filter(),
            shuffle=True, batch_size=3, num_workers=2, worker_mode="thread")
        results["fastload_threads", 2] = [[b.tolist() for b in loader] for _ in range(2)]
        gathered = [None] * world
        dist.all_gather_object(gathered, results)
        if rank == 0:
            torch.save(gathered, out)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_datapipe_shards_by_rank_with_rank_zeros_seed(tmp_path):
    """An IterDataPipe under torch.distributed: the shuffle seed is rank 0's
    on every rank (broadcast), each rank (and each of its workers) loads its
    own shard -- torch's batches on every rank."""
    out = tmp_path / "result.pt"
    store = f"{out}.store"
    world = 2
    tmp.spawn(run_datapipe_rank, args=(world, store, str(out)), nprocs=world, join=True)
    per_rank = torch.load(out, weights_only=False)
    for results in per_rank:
        for num_workers in (0, 2):
            assert results["fastload", num_workers] == results["torch", num_workers]
        assert results["fastload_threads", 2] == results["torch", 2]
    for num_workers in (0, 2):
        for epoch in range(2):
            samples = [i for results in per_rank
                       for batch in results["fastload", num_workers][epoch] for i in batch]
            assert sorted(samples) == list(range(40))


class IndexShards:
    """Samples that are their own index, in unequal shards (what ShardSampler
    reads of a WebDataset): the gathered batches say which samples were seen."""

    shard_starts = np.cumsum([0, 9, 4, 7, 5, 6, 8, 3])  # 42 samples

    def __len__(self):
        return int(self.shard_starts[-1])

    def __getitem__(self, index):
        return index


def run_elastic_rank(rank, world, store, root, old_world, out):
    """One rank of a run that stops after 2 batches and saves its state
    (`old_world` None), or of a run on another number of ranks that resumes
    from those states and finishes the epoch."""
    import fastload

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        ds = IndexShards()
        sampler = fastload.ShardSampler(ds, seed=3, buffer_size=4)  # rank, world from dist
        sampler.set_epoch(1)
        loader = fastload.DataLoader(ds, batch_size=2, sampler=sampler, num_workers=1)
        if old_world is not None:  # the states the other run saved, one a rank
            loader.load_state_dict(torch.load(os.path.join(root, f"state-{rank % old_world}.pt")))
        seen = []
        for number, batch in enumerate(loader):
            seen += batch.tolist()
            if old_world is None and number == 1:
                torch.save(loader.state_dict(), os.path.join(root, f"state-{rank}.pt"))
                break
        gathered = [None] * world
        dist.all_gather_object(gathered, seen)
        if rank == 0:
            torch.save(gathered, out)
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("old, new", [(4, 3), (2, 4)])
def test_elastic_resume_on_another_number_of_ranks(tmp_path, old, new):
    """A ShardSampler epoch checkpointed on `old` ranks finishes on `new`
    ranks: every sample of the epoch once (padding to equal shares aside)."""
    first, then = tmp_path / "first.pt", tmp_path / "then.pt"
    tmp.spawn(run_elastic_rank, args=(old, f"{first}.store", str(tmp_path), None, str(first)),
              nprocs=old, join=True)
    tmp.spawn(run_elastic_rank, args=(new, f"{then}.store", str(tmp_path), old, str(then)),
              nprocs=new, join=True)
    before = [i for seen in torch.load(first, weights_only=False) for i in seen]
    after = torch.load(then, weights_only=False)
    assert len(before) == len(set(before)) == old * 4  # 2 batches of 2 a rank
    assert len({len(seen) for seen in after}) == 1  # equal lengths on the new ranks
    every = before + [i for seen in after for i in seen]
    assert set(every) == set(range(len(IndexShards())))
    assert len(every) - len(IndexShards()) < new  # at most one padded sample a new rank
