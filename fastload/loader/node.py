"""This process's share of the node it runs on.

A launcher such as ``torchrun --nproc-per-node 8`` starts several training
processes (local ranks) on one machine, each with its own DataLoader.  A
loader that counted every core of the machine as its own would start, with
8 ranks, eight times the workers the machine can run.  This module answers,
for this process: how many ranks share the node and which one this is
(``local_ranks``), which CPUs are this rank's (``rank_cpus``) and how many
(``rank_cores``: the one count every worker bound, warning and piece of
advice uses), its share of the prefetch memory bound (``rank_max_bytes``),
and the CPUs of a GPU's NUMA node (``numa_cpus``) for ``worker_affinity``.

The rule (docs/guide, "Several ranks on one node"):

* The ranks on the node come from the launcher's environment:
  ``LOCAL_WORLD_SIZE``/``LOCAL_RANK`` (torchrun), else
  ``SLURM_NTASKS_PER_NODE``/``SLURM_LOCALID``, else
  ``OMPI_COMM_WORLD_LOCAL_SIZE``/``OMPI_COMM_WORLD_LOCAL_RANK``, else
  ``MPI_LOCALNRANKS``/``MPI_LOCALRANKID``; else this process is alone.
* A process whose affinity mask the launcher already narrowed below the
  node's CPUs (``taskset``, ``srun --cpu-bind``, ``numactl``) keeps that mask
  as its share.  Else the usable CPUs are divided evenly among the local
  ranks, rank r taking the r-th contiguous slice.  Every rank gets at least
  one CPU: with more ranks than CPUs, rank r gets CPU r modulo the count,
  and the ranks together then count more CPUs than there are.
* The default prefetch memory bound (``default_max_bytes``) is divided
  evenly among the local ranks, at least 1 byte each.
"""

import os
from collections import namedtuple

# Where sysfs is mounted; every reader takes a `sysfs` root (None: this), so
# tests point them at a tree of their own.
SYSFS = "/sys"

# (size, rank): how many ranks run on this node, and which one this is.
LocalRanks = namedtuple("LocalRanks", "size rank")

# The launchers' variables, by precedence: (ranks on the node, this rank).
_LAUNCHER_VARIABLES = (
    ("LOCAL_WORLD_SIZE", "LOCAL_RANK"),                                  # torchrun
    ("SLURM_NTASKS_PER_NODE", "SLURM_LOCALID"),                          # Slurm's srun
    ("OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),        # Open MPI
    ("MPI_LOCALNRANKS", "MPI_LOCALRANKID"),                              # MPICH, Intel MPI
)


def _leading_int(text):
    """The integer that ``text`` starts with ("4" and Slurm's "4(x2)" give
    4), else None."""
    digits = ""
    for ch in (text or "").strip():
        if not ch.isdigit():
            break
        digits += ch
    return int(digits) if digits else None


def local_ranks(environ=None):
    """How many ranks share this node and which one this process is, from
    the launcher's environment (``environ``, default ``os.environ``); a pair
    whose rank is missing or outside ``0..size-1`` is passed over.
    ``LocalRanks(1, 0)`` when no launcher says."""
    env = os.environ if environ is None else environ
    for size_name, rank_name in _LAUNCHER_VARIABLES:
        size = _leading_int(env.get(size_name))
        rank = _leading_int(env.get(rank_name))
        if size is not None and size >= 1 and rank is not None and rank < size:
            return LocalRanks(size, rank)
    return LocalRanks(1, 0)


def parse_cpulist(text):
    """The CPU ids of a kernel CPU list ("0-3,8,10-11"), sorted."""
    cpus = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return sorted(cpus)


def _read_cpulist(path):
    """The CPU list in the file at ``path``, or None when it cannot be read
    or holds none."""
    try:
        with open(path) as f:
            cpus = parse_cpulist(f.read())
    except (OSError, ValueError):
        return None
    return cpus or None


def allowed_cpus():
    """The CPUs this process may run on (its affinity mask), sorted."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def usable_cores():
    """How many CPUs this process may run on (its affinity mask, as torch's
    worker-count warning counts them); at least 1."""
    return max(1, len(allowed_cpus()))


def node_cpus(sysfs=None):
    """The CPUs the node gives its processes: the container's cpuset where
    the cgroup (v2) names one, else the online CPUs; None when neither can
    be read."""
    sysfs = SYSFS if sysfs is None else sysfs
    return (_read_cpulist(os.path.join(sysfs, "fs", "cgroup", "cpuset.cpus.effective"))
            or _read_cpulist(os.path.join(sysfs, "devices", "system", "cpu", "online")))


def share(cpus, size, rank):
    """Rank ``rank``'s contiguous slice of ``cpus`` divided evenly among
    ``size`` ranks; one CPU (``cpus[rank % len(cpus)]``) when there are more
    ranks than CPUs."""
    cpus = list(cpus)
    if size <= 1:
        return cpus
    if size > len(cpus):
        return [cpus[rank % len(cpus)]]
    return cpus[rank * len(cpus) // size:(rank + 1) * len(cpus) // size]


def rank_cpus(environ=None, sysfs=None, allowed=None):
    """This rank's CPUs, sorted: the affinity mask as it is when the
    launcher narrowed it below the node's CPUs, else this rank's even slice
    of it (``share``).  ``allowed``: the mask (default this process's)."""
    allowed = allowed_cpus() if allowed is None else sorted(allowed)
    size, rank = local_ranks(environ)
    if size == 1:
        return allowed
    node = node_cpus(sysfs)
    if node is not None and set(allowed) < set(node):
        return allowed  # the launcher's own binding: already this rank's share
    return share(allowed, size, rank)


def rank_cores(environ=None, sysfs=None):
    """How many CPUs are this rank's (``rank_cpus``), at least 1: the bound
    on ``num_workers="auto"``, and the count the worker-count warning and
    ``loader.stats()``/``fastload.tune`` advice use."""
    return max(1, len(rank_cpus(environ, sysfs)))


def default_max_bytes():
    """The node's default prefetch memory bound: 1 GiB, or an eighth of the
    physical memory when that is less."""
    limit = 1 << 30
    try:
        physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return limit
    return min(limit, max(1, physical // 8))


def rank_max_bytes(environ=None):
    """This rank's share of ``default_max_bytes``: the default
    ``max_prefetch_bytes`` of a ``num_workers="auto"`` loader."""
    return max(1, default_max_bytes() // local_ranks(environ).size)


# ------------------------------------------------------------------ NUMA

def pci_numa_node(address, sysfs=None):
    """The NUMA node of the PCI device at ``address`` ("0000:3b:00.0"), or
    None when sysfs does not say (no file, or -1: a machine of one node)."""
    sysfs = SYSFS if sysfs is None else sysfs
    path = os.path.join(sysfs, "bus", "pci", "devices", address.lower(), "numa_node")
    try:
        with open(path) as f:
            node = int(f.read().strip())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None


def numa_node_cpus(node, sysfs=None):
    """The CPUs of NUMA node ``node``, or None when sysfs does not say."""
    sysfs = SYSFS if sysfs is None else sysfs
    return _read_cpulist(os.path.join(sysfs, "devices", "system", "node", f"node{node}",
                                      "cpulist"))


def numa_nodes(sysfs=None):
    """The NUMA nodes that have CPUs, sorted (``[]`` when sysfs has none)."""
    sysfs = SYSFS if sysfs is None else sysfs
    nodes = []
    try:
        names = os.listdir(os.path.join(sysfs, "devices", "system", "node"))
    except OSError:
        return nodes
    for name in names:
        if name.startswith("node") and name[4:].isdigit() and numa_node_cpus(int(name[4:]),
                                                                               sysfs):
            nodes.append(int(name[4:]))
    return sorted(nodes)


def numa_cpus(gpu=None, gpu_addresses=(), environ=None, sysfs=None, allowed=None):
    """The CPUs of ``worker_affinity="numa"`` for this rank.

    With a GPU (``gpu``: this rank's device index into ``gpu_addresses``,
    the PCI addresses of the node's GPUs): the CPUs of that GPU's NUMA node,
    divided evenly among the local ranks whose GPUs sit on that node (local
    rank r uses GPU r, torchrun's convention, this rank ``gpu``).  Without
    one (``gpu=None``): local rank r takes NUMA node
    ``nodes[r * len(nodes) // size]`` of the nodes that have CPUs, whose CPUs
    the ranks mapped to it divide evenly.  The CPUs are those of the NUMA
    node this process may use (``allowed``, default its affinity mask).
    Raises ValueError when sysfs names no NUMA node, or none of its CPUs is
    allowed to this process."""
    allowed = set(allowed_cpus() if allowed is None else allowed)
    size, rank = local_ranks(environ)
    nodes = numa_nodes(sysfs)
    if not nodes:
        raise ValueError("worker_affinity='numa': sysfs names no NUMA node with CPUs")
    if gpu is None:
        def node_of(r):
            return nodes[r * len(nodes) // size]
    else:
        addresses = list(gpu_addresses)

        def node_of(r):
            index = gpu if r == rank else r
            if index >= len(addresses):
                return None  # a rank without a GPU of its own shares no GPU's node
            found = pci_numa_node(addresses[index], sysfs)
            if found is None and len(nodes) == 1:
                return nodes[0]  # one NUMA node: every device is on it
            return found
    node = node_of(rank)
    if node is None:
        raise ValueError(f"worker_affinity='numa': sysfs names no NUMA node for the GPU at "
                         f"{addresses[gpu]}")
    sharing = [r for r in range(size) if node_of(r) == node]
    cpus = [c for c in numa_node_cpus(node, sysfs) or () if c in allowed]
    if not cpus:
        raise ValueError(f"worker_affinity='numa': none of NUMA node {node}'s CPUs is allowed "
                         f"to this process (it may use CPUs {format_cpus(allowed)})")
    return share(cpus, len(sharing), sharing.index(rank))


def format_cpus(cpus):
    """A sorted CPU list in the kernel's form: [0, 1, 2, 3, 8] gives "0-3,8"."""
    parts = []
    cpus = sorted(cpus)
    i = 0
    while i < len(cpus):
        j = i
        while j + 1 < len(cpus) and cpus[j + 1] == cpus[j] + 1:
            j += 1
        parts.append(str(cpus[i]) if i == j else f"{cpus[i]}-{cpus[j]}")
        i = j + 1
    return ",".join(parts)
