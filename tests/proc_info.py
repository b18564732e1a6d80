"""What /proc says about this process: fastload's workers are native threads,
invisible to ``threading.enumerate()``.  No torch needed here."""

import os


def native_thread_count():
    return len(os.listdir("/proc/self/task"))


def native_thread_names():
    names = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                names.append(f.read().strip())
        except OSError:  # thread exited meanwhile
            pass
    return names


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def anon_rss_bytes(shared=False):
    """Resident private memory (heap, buffers), without mapped files: the
    pages of a memory-mapped dataset file belong to the page cache.  With
    `shared`, also resident shared memory (batches from worker processes
    live in memfd slots)."""
    wanted = ("RssAnon:", "RssShmem:") if shared else ("RssAnon:",)
    total, found = 0, 0
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(wanted):
                total += int(line.split()[1]) * 1024
                found += 1
    if found != len(wanted):
        raise RuntimeError(f"no {' '.join(wanted)} in /proc/self/status")
    return total


def mapped_files():
    """Real paths of the files mapped into this process (its shared
    libraries among them)."""
    with open("/proc/self/maps") as f:
        fields = (line.split(maxsplit=5) for line in f)
        return {os.path.realpath(row[5].rstrip("\n")) for row in fields
                if len(row) == 6 and row[5].startswith("/")}
