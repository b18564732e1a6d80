"""Several ranks on one node (fastload/loader/node.py): the local ranks from
the launcher's environment, each rank's share of the cores and of the
prefetch memory bound, the CPUs of a GPU's NUMA node from sysfs, and
``worker_affinity`` putting worker threads and processes on the CPUs given.
"""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import fastload
from fastload import _C
from fastload.loader import node

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
USABLE = sorted(os.sched_getaffinity(0))


# ------------------------------------------------------------- local ranks

@pytest.mark.parametrize("env,expected", [
    ({}, (1, 0)),
    ({"LOCAL_WORLD_SIZE": "8", "LOCAL_RANK": "3"}, (8, 3)),
    ({"SLURM_NTASKS_PER_NODE": "4", "SLURM_LOCALID": "1"}, (4, 1)),
    ({"SLURM_NTASKS_PER_NODE": "4(x2)", "SLURM_LOCALID": "2"}, (4, 2)),
    ({"OMPI_COMM_WORLD_LOCAL_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "1"}, (2, 1)),
    ({"MPI_LOCALNRANKS": "6", "MPI_LOCALRANKID": "5"}, (6, 5)),
    # torchrun's variables come first, also under srun.
    ({"LOCAL_WORLD_SIZE": "2", "LOCAL_RANK": "0", "SLURM_NTASKS_PER_NODE": "4",
      "SLURM_LOCALID": "3"}, (2, 0)),
    # A pair without its rank, or with a rank out of range, is passed over.
    ({"LOCAL_WORLD_SIZE": "2", "SLURM_NTASKS_PER_NODE": "4", "SLURM_LOCALID": "3"}, (4, 3)),
    ({"LOCAL_WORLD_SIZE": "2", "LOCAL_RANK": "2"}, (1, 0)),
    ({"LOCAL_WORLD_SIZE": "0", "LOCAL_RANK": "0"}, (1, 0)),
    ({"LOCAL_WORLD_SIZE": "x", "LOCAL_RANK": "0"}, (1, 0)),
])
def test_local_ranks_from_the_launchers_environment(env, expected):
    assert node.local_ranks(env) == expected


def test_local_ranks_default_to_this_process_environment(monkeypatch):
    for size_name, rank_name in node._LAUNCHER_VARIABLES:
        monkeypatch.delenv(size_name, raising=False)
        monkeypatch.delenv(rank_name, raising=False)
    assert node.local_ranks() == (1, 0)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")
    monkeypatch.setenv("LOCAL_RANK", "2")
    assert node.local_ranks() == (3, 2)


# ----------------------------------------------------------- cores shared

def test_cpu_lists():
    assert node.parse_cpulist("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert node.parse_cpulist("5") == [5]
    assert node.format_cpus([11, 0, 1, 2, 3, 8, 10]) == "0-3,8,10-11"
    assert node.format_cpus([4]) == "4"


@pytest.mark.parametrize("cpus,size", [(16, 8), (16, 3), (16, 16), (6, 4), (2, 2), (5, 1)])
def test_the_cores_are_divided_in_contiguous_slices(cpus, size):
    slices = [node.share(range(cpus), size, r) for r in range(size)]
    assert [c for s in slices for c in s] == list(range(cpus))  # each core once, in order
    assert all(s == list(range(s[0], s[-1] + 1)) for s in slices)
    assert max(map(len, slices)) - min(map(len, slices)) <= 1


def test_more_ranks_than_cores_get_one_core_each():
    assert [node.share([4, 5], 5, r) for r in range(5)] == [[4], [5], [4], [5], [4]]


def fake_sysfs(root, online="0-15", cgroup=None, numa=None, gpus=None):
    """A sysfs tree under ``root``: the online CPUs, the cgroup's cpuset,
    NUMA nodes ({node: cpulist}) and PCI devices ({address: numa_node})."""
    cpu = root / "devices" / "system" / "cpu"
    cpu.mkdir(parents=True)
    (cpu / "online").write_text(online + "\n")
    if cgroup is not None:
        (root / "fs" / "cgroup").mkdir(parents=True)
        (root / "fs" / "cgroup" / "cpuset.cpus.effective").write_text(cgroup + "\n")
    for n, cpulist in (numa or {}).items():
        d = root / "devices" / "system" / "node" / f"node{n}"
        d.mkdir(parents=True)
        (d / "cpulist").write_text(cpulist + "\n")
    for address, n in (gpus or {}).items():
        d = root / "bus" / "pci" / "devices" / address
        d.mkdir(parents=True)
        (d / "numa_node").write_text(f"{n}\n")
    return str(root)


def test_a_rank_takes_its_slice_of_the_usable_cores(tmp_path):
    sysfs = fake_sysfs(tmp_path)
    everything = range(16)
    env = {"LOCAL_WORLD_SIZE": "4", "LOCAL_RANK": "2"}
    assert node.rank_cpus(env, sysfs, allowed=everything) == [8, 9, 10, 11]
    assert node.rank_cpus({}, sysfs, allowed=everything) == list(everything)


def test_a_mask_the_launcher_narrowed_is_the_ranks_share(tmp_path):
    sysfs = fake_sysfs(tmp_path)
    env = {"LOCAL_WORLD_SIZE": "4", "LOCAL_RANK": "2"}
    # srun --cpu-bind / taskset gave this rank 4 of the 16 CPUs: kept as they are.
    assert node.rank_cpus(env, sysfs, allowed=[4, 5, 6, 7]) == [4, 5, 6, 7]


def test_a_containers_cpuset_is_divided_among_its_ranks(tmp_path):
    # The container has CPUs 8-15 of the machine: a mask equal to its cpuset
    # is not a launcher's binding, so the ranks divide it.
    sysfs = fake_sysfs(tmp_path, cgroup="8-15")
    env = {"LOCAL_WORLD_SIZE": "2", "LOCAL_RANK": "1"}
    assert node.rank_cpus(env, sysfs, allowed=range(8, 16)) == [12, 13, 14, 15]


def test_rank_cores_and_memory_follow_the_local_ranks(monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    if len(USABLE) >= 2 and set(USABLE) == set(node.node_cpus() or USABLE):
        assert node.rank_cores() == len(node.share(USABLE, 2, 1))
    assert node.rank_max_bytes() == node.default_max_bytes() // 2
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert node.rank_cores() == len(USABLE)
    assert node.rank_max_bytes() == node.default_max_bytes()


# -------------------------------------------------------------------- NUMA

TWO_NODES = {0: "0-7", 1: "8-15"}
FOUR_GPUS = {"0000:1b:00.0": 0, "0000:3b:00.0": 0, "0000:86:00.0": 1, "0000:af:00.0": 1}


@pytest.mark.parametrize("rank,expected", [(0, [0, 1, 2, 3]), (1, [4, 5, 6, 7]),
                                           (2, [8, 9, 10, 11]), (3, [12, 13, 14, 15])])
def test_numa_cpus_of_the_ranks_gpu(tmp_path, rank, expected):
    sysfs = fake_sysfs(tmp_path, numa=TWO_NODES, gpus=FOUR_GPUS)
    env = {"LOCAL_WORLD_SIZE": "4", "LOCAL_RANK": str(rank)}
    # The driver spells the address in upper case; sysfs in lower.
    addresses = [a.upper() for a in FOUR_GPUS]
    assert node.numa_cpus(rank, addresses, env, sysfs, allowed=range(16)) == expected


def test_numa_cpus_of_a_gpu_alone_on_its_node(tmp_path):
    sysfs = fake_sysfs(tmp_path, numa=TWO_NODES,
                       gpus={"0000:1b:00.0": 0, "0000:3b:00.0": 0, "0000:86:00.0": 1})
    addresses = list({"0000:1b:00.0", "0000:3b:00.0", "0000:86:00.0"})
    addresses.sort()
    env = {"LOCAL_WORLD_SIZE": "3", "LOCAL_RANK": "2"}
    assert node.numa_cpus(2, addresses, env, sysfs, allowed=range(16)) == list(range(8, 16))
    env = {"LOCAL_WORLD_SIZE": "3", "LOCAL_RANK": "1"}
    assert node.numa_cpus(1, addresses, env, sysfs, allowed=range(16)) == [4, 5, 6, 7]


def test_numa_cpus_are_those_this_process_may_use(tmp_path):
    sysfs = fake_sysfs(tmp_path, numa=TWO_NODES, gpus=FOUR_GPUS)
    got = node.numa_cpus(2, list(FOUR_GPUS), {}, sysfs, allowed=[9, 10, 11])
    assert got == [9, 10, 11]
    with pytest.raises(ValueError, match="none of NUMA node 1's CPUs is allowed to this "
                                         "process \\(it may use CPUs 0-3\\)"):
        node.numa_cpus(2, list(FOUR_GPUS), {}, sysfs, allowed=[0, 1, 2, 3])


def test_numa_node_unknown_on_a_machine_of_one_node(tmp_path):
    # numa_node is -1 where the firmware does not say: one node holds it all.
    sysfs = fake_sysfs(tmp_path, numa={0: "0-3"}, gpus={"0000:01:00.0": -1})
    assert node.numa_cpus(0, ["0000:01:00.0"], {}, sysfs, allowed=range(4)) == [0, 1, 2, 3]
    sysfs = fake_sysfs(tmp_path / "two", numa=TWO_NODES, gpus={"0000:01:00.0": -1})
    with pytest.raises(ValueError, match="no NUMA node for the GPU at 0000:01:00.0"):
        node.numa_cpus(0, ["0000:01:00.0"], {}, sysfs, allowed=range(16))


@pytest.mark.parametrize("size,rank,expected", [
    (1, 0, list(range(8))), (2, 1, list(range(8, 16))), (4, 1, [4, 5, 6, 7]),
    (4, 2, [8, 9, 10, 11]), (3, 0, [0, 1, 2, 3]), (3, 1, [4, 5, 6, 7]),
    (3, 2, list(range(8, 16)))])
def test_numa_cpus_without_a_device_follow_the_local_rank(tmp_path, size, rank, expected):
    sysfs = fake_sysfs(tmp_path, numa=TWO_NODES)
    env = {"LOCAL_WORLD_SIZE": str(size), "LOCAL_RANK": str(rank)}
    assert node.numa_cpus(None, (), env, sysfs, allowed=range(16)) == expected


def test_numa_cpus_without_numa_nodes(tmp_path):
    with pytest.raises(ValueError, match="sysfs names no NUMA node"):
        node.numa_cpus(None, (), {}, fake_sysfs(tmp_path), allowed=range(16))


# --------------------------------------------------- ranks side by side

RANK = textwrap.dedent("""
    import json, os
    import numpy as np
    import fastload
    from fastload.loader import node
    x = np.zeros((64, 4), dtype=np.float32)
    loader = fastload.DataLoader(fastload.ArrayDataset(x), batch_size=4, num_workers="auto",
                                 worker_mode="thread")
    it = iter(loader)
    next(it)
    threads = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                threads += f.read().startswith("fastload-w")
        except OSError:
            pass
    print(json.dumps({"workers": loader.num_workers, "threads": threads,
                      "max_bytes": loader._autotune.max_bytes,
                      "node_bytes": node.default_max_bytes()}))
""")


@pytest.mark.parametrize("ranks", [2, 4])
def test_ranks_of_a_node_share_its_cores_and_memory(ranks):
    env = {k: v for k, v in os.environ.items()
           if k not in {name for pair in node._LAUNCHER_VARIABLES for name in pair}}
    env["PYTHONPATH"] = ROOT
    procs = [subprocess.Popen([sys.executable, "-c", RANK], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True,
                              env=dict(env, LOCAL_WORLD_SIZE=str(ranks), LOCAL_RANK=str(r)))
             for r in range(ranks)]
    reports = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        reports.append(json.loads(out.splitlines()[-1]))
    cores = node.usable_cores()
    for report in reports:
        assert 1 <= report["workers"] and report["threads"] == report["workers"]
    if ranks <= cores:
        assert sum(r["workers"] for r in reports) <= cores
        assert sum(r["threads"] for r in reports) <= cores
    else:
        # More ranks than cores: one worker each, the least a loader runs.
        assert all(r["workers"] == 1 for r in reports)
    assert all(r["max_bytes"] == r["node_bytes"] // ranks for r in reports)
    assert sum(r["max_bytes"] for r in reports) <= reports[0]["node_bytes"]


# ------------------------------------------------------- worker affinity

class Affinity(fastload.Dataset):
    """Each sample: the CPUs the worker that fetched it may run on."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        mask = np.zeros(64, dtype=np.int64)
        mask[sorted(os.sched_getaffinity(0))] = 1
        return mask


def worker_masks(loader):
    return {tuple(np.flatnonzero(row)) for batch in loader for row in np.asarray(batch)}


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_workers_run_on_the_cpus_given(mode):
    cpu = USABLE[-1]
    loader = fastload.DataLoader(Affinity(), batch_size=2, num_workers=2, worker_mode=mode,
                                 output="numpy", worker_affinity=[cpu])
    assert worker_masks(loader) == {(cpu,)}
    # Without it the workers keep what they inherit.
    plain = fastload.DataLoader(Affinity(), batch_size=2, num_workers=2, worker_mode=mode,
                                output="numpy")
    assert worker_masks(plain) == {tuple(USABLE)}


def test_the_engines_threads_run_on_the_cpus_given():
    cpu = USABLE[0]
    x = np.zeros((64, 4), dtype=np.float32)
    loader = fastload.DataLoader(fastload.ArrayDataset(x), batch_size=4, num_workers=2,
                                 worker_mode="thread", worker_affinity={cpu})
    before = set(os.listdir("/proc/self/task"))  # threads of earlier loaders not counted
    it = iter(loader)
    next(it)
    allowed = []
    for tid in set(os.listdir("/proc/self/task")) - before:
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                if not f.read().startswith("fastload-w"):
                    continue
            with open(f"/proc/self/task/{tid}/status") as f:
                allowed += [line.split(":")[1].strip() for line in f
                            if line.startswith("Cpus_allowed_list")]
        except OSError:
            pass
    assert allowed == [str(cpu), str(cpu)]
    del it


def test_auto_is_bounded_by_the_cpus_given():
    loader = fastload.DataLoader(Affinity(), batch_size=2, num_workers="auto",
                                 worker_affinity=[USABLE[0]])
    assert loader.num_workers == 1


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_cpus_the_kernel_refuses_are_named(mode):
    missing = 1000  # no CPU of this machine
    if missing in USABLE:
        pytest.skip("this machine has a CPU 1000")
    loader = fastload.DataLoader(Affinity(), batch_size=2, num_workers=2, worker_mode=mode,
                                 output="numpy", worker_affinity=[missing, missing + 1])
    with pytest.raises(OSError, match=f"cannot run worker (thread|process) [01] on CPUs "
                                      f"{missing}-{missing + 1}: Invalid argument"):
        list(loader)


def test_worker_affinity_is_checked():
    for bad in ("all", [], [-1], [1024], [True], 3):
        with pytest.raises(ValueError, match="worker_affinity"):
            fastload.DataLoader(Affinity(), num_workers=1, worker_affinity=bad)
    loader = fastload.DataLoader(Affinity(), num_workers=1, worker_affinity=range(2))
    assert loader.worker_affinity == range(2) and loader._worker_cpus == (0, 1)


def test_numa_without_a_device_uses_this_machines_nodes():
    nodes = node.numa_nodes()
    if not nodes:
        pytest.skip("no NUMA node in this machine's sysfs")
    loader = fastload.DataLoader(Affinity(), batch_size=2, num_workers=1, output="numpy",
                                 worker_affinity="numa")
    expected = node.numa_cpus()
    assert loader._worker_cpus == tuple(expected)
    assert worker_masks(loader) == {tuple(expected)}


def test_engine_refuses_bad_cpu_ids():
    with pytest.raises(ValueError, match="CPU id 1024 is outside 0..1023"):
        _C.Engine([object()], 1, cpus=[1024])
    with pytest.raises(ValueError, match="cpus needs 1..1024 CPU ids"):
        _C.Engine([object()], 1, cpus=[])


# ------------------------------------------------ the GPU's PCI address

PCI_PROBE = textwrap.dedent("""
    from fastload import _C
    print(_C.cuda_pci_bus_id(0), _C.cuda_pci_bus_id(1))
""")


def test_the_gpus_pci_address_from_the_driver(fake_gpu_libraries):
    env = dict(os.environ, PYTHONPATH=ROOT, FASTLOAD_LIBCUDA=fake_gpu_libraries["cuda"],
               FAKE_CUDA_DEVICES="2", FAKE_CUDA_PCI="0000:3B:00.0,0000:AF:00.0")
    out = subprocess.run([sys.executable, "-c", PCI_PROBE], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["0000:3b:00.0", "0000:af:00.0"]


NUMA_PROBE = textwrap.dedent("""
    import sys
    import fastload
    from fastload.loader import node
    node.SYSFS = sys.argv[1]
    loader = fastload.DataLoader(list(range(8)), batch_size=2, num_workers=1,
                                 device=sys.argv[2], worker_affinity="numa")
    print(",".join(map(str, loader._worker_cpus)))
""")


@pytest.mark.skipif(len(USABLE) < 2, reason="needs 2 usable CPUs")
@pytest.mark.parametrize("rank", [0, 1])
def test_numa_from_the_gpus_pci_address(fake_gpu_libraries, tmp_path, rank):
    # Two NUMA nodes of one usable CPU each, a GPU on each: local rank r on
    # cuda:r runs its workers on the CPU of its GPU's node.
    first, second = USABLE[0], USABLE[1]
    sysfs = fake_sysfs(tmp_path, numa={0: str(first), 1: str(second)},
                       gpus={"0000:3b:00.0": 0, "0000:af:00.0": 1})
    env = dict(os.environ, PYTHONPATH=ROOT, FASTLOAD_LIBCUDA=fake_gpu_libraries["cuda"],
               FAKE_CUDA_DEVICES="2", FAKE_CUDA_PCI="0000:3B:00.0,0000:AF:00.0",
               LOCAL_WORLD_SIZE="2", LOCAL_RANK=str(rank))
    out = subprocess.run([sys.executable, "-c", NUMA_PROBE, sysfs, f"cuda:{rank}"], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str((first, second)[rank])


@pytest.mark.skipif(len(USABLE) < 2 or set(USABLE) != set(node.node_cpus() or ()),
                    reason="needs 2 usable CPUs, all of the node's")
def test_the_worker_count_warning_counts_this_ranks_cores(monkeypatch):
    # As many ranks as CPUs: one CPU each, so two worker processes are too many.
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(len(USABLE)))
    monkeypatch.setenv("LOCAL_RANK", "0")
    with pytest.warns(UserWarning, match="This DataLoader will create 2 worker processes in "
                                         "total. Our suggested max number of worker in current "
                                         "system is 1,"):
        fastload.DataLoader(list(range(4)), batch_size=2, num_workers=2, worker_mode="process")
