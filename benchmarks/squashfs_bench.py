"""SquashFS images read without mounting against the same files on disk (and
through squashfuse when it can mount here), in one run.

    python benchmarks/squashfs_bench.py                       # $FASTLOAD_BENCH_PHOTOS
    python benchmarks/squashfs_bench.py --data DIR            # another class folder tree
    python benchmarks/squashfs_bench.py --quick               # 256 generated photos

The training pipeline (RandomResizedCrop(224) + flip + ToTensor +
Normalize, batch 64, 2 worker threads) reads the class folders by:

* disk: ``fastload.ImageFolder(DIR)``, the files as they are;
* squashfs: ``fastload.ImageFolder("IMAGE:/")`` over a zstd image of the
  same tree (made once with ``mksquashfs -comp zstd``, kept in --work);
* squashfuse: ``fastload.ImageFolder(MOUNTPOINT)`` over the same image
  mounted with squashfuse (skipped, with the reason, when it cannot mount).

Each is timed "warm" (the files in the page cache: an untimed epoch read
them) and "cold": before each cold epoch the page cache is dropped,
``echo 3 > /proc/sys/vm/drop_caches`` when this process may (root, outside
a read-only /proc), else ``posix_fadvise(POSIX_FADV_DONTNEED)`` on every
file read (the tree's files; the image file), which the report names.  The
loaders run one after another, repetition by repetition, and each row is
the median epoch.  Prints Markdown, with squashfs's images/s over disk's.
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

try:
    import fastload
except ImportError:  # run from a checkout built in place
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import fastload

import imagenet_like
from images_bench import BATCH, epoch, fastload_transform, log

WORKERS = 2
LOADERS = ("disk", "squashfs", "squashfuse")
PHOTOS = os.environ.get("FASTLOAD_BENCH_PHOTOS")  # a class folder tree of real photos
FULL = dict(reps=3)
QUICK = dict(images=256, reps=1)


def make_image(tree, image):
    """The zstd image of `tree` at `image`, made unless one newer than the
    tree is there."""
    if os.path.exists(image) and os.path.getmtime(image) >= os.path.getmtime(tree):
        return image
    os.makedirs(os.path.dirname(image), exist_ok=True)
    log(f"mksquashfs {tree} -> {image} (zstd)")
    subprocess.run(["mksquashfs", tree, image, "-comp", "zstd", "-noappend", "-quiet",
                    "-no-progress"], check=True, capture_output=True)
    return image


def mount_squashfuse(image, mountpoint):
    """Mounts `image`; returns None, or why it cannot."""
    if shutil.which("squashfuse") is None:
        return "squashfuse is not installed"
    os.makedirs(mountpoint, exist_ok=True)
    done = subprocess.run(["squashfuse", image, mountpoint], capture_output=True, text=True)
    if done.returncode != 0:
        return f"squashfuse cannot mount here: {(done.stderr or done.stdout).strip()}"
    return None


def unmount(mountpoint):
    for command in (["fusermount", "-u", mountpoint], ["fusermount3", "-u", mountpoint],
                    ["umount", mountpoint]):
        if shutil.which(command[0]) and subprocess.run(command, capture_output=True).returncode == 0:
            return


def drop_caches(files, fadvise_only=False):
    """Drops the page cache; returns how ("drop_caches" or "fadvise")."""
    try:
        if fadvise_only:
            raise PermissionError
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return "drop_caches"
    except OSError:
        for path in files:
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
        return "fadvise"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--data", default=None,
                        help="a tree of class folders (default: $FASTLOAD_BENCH_PHOTOS, "
                             "else generated)")
    parser.add_argument("--work", default=os.path.join(os.path.dirname(os.path.abspath(
        __file__)), "data", "squashfs"), help="where the image and the mount point go")
    parser.add_argument("--reps", type=int, default=None)
    parser.add_argument("--fadvise", action="store_true",
                        help="drop only the files read from the page cache, never all of it")
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    reps = args.reps or sizes["reps"]
    tree = args.data
    if tree is None:
        if args.quick or not (PHOTOS and os.path.isdir(PHOTOS)):
            tree = imagenet_like.make_image_folder(
                os.path.join(args.work, f"photos_{QUICK['images']}"), n_images=QUICK["images"])
        else:
            tree = PHOTOS
    tree = os.path.abspath(tree)
    if shutil.which("mksquashfs") is None:
        sys.exit("squashfs_bench: needs mksquashfs (squashfs-tools)")
    image = make_image(tree, os.path.join(args.work, os.path.basename(tree) + ".zstd.sqfs"))
    mountpoint = tempfile.mkdtemp(prefix="squashfuse-", dir=args.work)
    fuse_skip = mount_squashfuse(image, mountpoint)
    roots = {"disk": tree, "squashfs": image + ":/", "squashfuse": mountpoint}
    names = [n for n in LOADERS if n != "squashfuse" or fuse_skip is None]
    try:
        datasets = {n: fastload.ImageFolder(roots[n], transform=fastload_transform("train"))
                    for n in names}
        n_images = len(datasets["disk"])
        assert all(len(d) == n_images for d in datasets.values())
        files = [p for p, _ in datasets["disk"].samples] + [image]
        loaders = {n: fastload.DataLoader(datasets[n], batch_size=BATCH, num_workers=WORKERS,
                                          shuffle=True, persistent_workers=True)
                   for n in names}
        times = {(n, kind): [] for n in names for kind in ("warm", "cold")}
        how = None
        for rep in range(reps):
            for n in names:
                log(f"rep {rep + 1}/{reps}: {n} warm")
                epoch(loaders[n], n_images)  # fills the page cache
                times[n, "warm"].append(epoch(loaders[n], n_images))
            for n in names:
                log(f"rep {rep + 1}/{reps}: {n} cold")
                how = drop_caches(files, args.fadvise)
                times[n, "cold"].append(epoch(loaders[n], n_images))
        del loaders
    finally:
        if fuse_skip is None:
            unmount(mountpoint)
        try:
            os.rmdir(mountpoint)
        except OSError:
            pass
    rate = {key: n_images / statistics.median(t) for key, t in times.items()}
    size_tree = sum(os.path.getsize(p) for p in files[:-1])
    print(f"## SquashFS (zstd) against the files on disk: {n_images} images, "
          f"{size_tree / 1e6:.0f} MB on disk, image {os.path.getsize(image) / 1e6:.0f} MB\n")
    print(f"RandomResizedCrop(224) + flip + ToTensor + Normalize, batch {BATCH}, "
          f"{WORKERS} worker threads, median of {reps} epochs; cold: page cache dropped "
          f"before each epoch by {'echo 3 > /proc/sys/vm/drop_caches' if how == 'drop_caches' else 'posix_fadvise(DONTNEED) on every file and the image'}; "
          f"{os.cpu_count()} CPUs.\n")
    print("| loader | warm images/s | cold images/s | warm vs disk | cold vs disk |")
    print("|---|---:|---:|---:|---:|")
    for n in names:
        print(f"| {n} | {rate[n, 'warm']:.0f} | {rate[n, 'cold']:.0f} | "
              f"{rate[n, 'warm'] / rate['disk', 'warm']:.2f}x | "
              f"{rate[n, 'cold'] / rate['disk', 'cold']:.2f}x |")
    if fuse_skip is not None:
        print(f"\nsquashfuse: skipped ({fuse_skip}).")
    return rate


if __name__ == "__main__":
    main()
