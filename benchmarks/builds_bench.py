"""Two builds of fastload's extension in one process: each policy op and the
RandomResizedCrop resample, timed call for call in alternation.

    python benchmarks/builds_bench.py OLD_TREE [NEW_TREE]   # NEW_TREE: this tree

Each tree is a fastload checkout with its extension built in place
(``python setup.py build_ext --inplace``).  Their ``_C`` modules are loaded
side by side under different names, checked to give the same bytes, then
timed in turns (old, new, old, ...) on the same inputs: a shared machine's
speed drifts by a third within minutes, and alternating makes the drift
fall on both alike.  Times are thread CPU time per call, the lower quartile
of ``--rounds`` turns each.  Prints Markdown on stdout.
"""

import argparse
import glob
import importlib.machinery
import importlib.util
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import fastload.transforms as T  # noqa: E402

import pil_ops_bench  # noqa: E402
from workloads import cpu_model  # noqa: E402


def load_extension(tree, tag):
    """The ``_C`` module built in ``tree``, loaded as ``fastload_<tag>._C``."""
    paths = glob.glob(os.path.join(tree, "fastload", "_C.*.so"))
    if not paths:
        raise SystemExit(f"builds_bench.py: no built extension under {tree}/fastload")
    name = f"fastload_{tag}._C"
    loader = importlib.machinery.ExtensionFileLoader(name, paths[0])
    module = importlib.util.module_from_spec(
        importlib.util.spec_from_file_location(name, paths[0], loader=loader))
    loader.exec_module(module)
    return module


def photos(count=24, seed=0):
    """Decoded photo-like RGB images of ImageNet's sizes."""
    import imagenet_like
    rng = np.random.default_rng(seed)
    bank = imagenet_like.texture_bank(seed)
    out = []
    for _ in range(count):
        w, h = int(rng.integers(300, 600)), int(rng.integers(250, 500))
        image = imagenet_like.synthesize(rng, w, h, bank).convert("RGB")
        out.append(np.ascontiguousarray(np.asarray(image)))
    return out


def workloads():
    """[(name, calls per turn, call(C, k))]: the policy ops on a 224x224
    picture, and RandomResizedCrop(224) + flip to the uint8 image of photo
    k % 24 with seed k."""
    picture = pil_ops_bench.picture()
    rows = [(f"{op} {magnitude:g}", 20,
             lambda C, k, op=op, m=magnitude: C.pil_op(op, picture, m, 1, (0, 0, 0)))
            for op, magnitude in pil_ops_bench.OPS]
    images = photos()
    plan = T.compile_plan([T.RandomResizedCrop(224), T.RandomHorizontalFlip()])
    rows.append(("RandomResizedCrop 224, uint8", 24, lambda C, k: C.transform_image(
        plan, images[k % len(images)], k, T.PILLOW_MAX_PIXELS)))
    return rows


def compare(old, new, rounds=25):
    """[(name, old seconds, new seconds)] per call; raises if the builds'
    bytes differ."""
    rows = []
    for name, calls, call in workloads():
        for k in range(calls):
            if not np.array_equal(call(old, k), call(new, k)):
                raise AssertionError(f"{name}: the two builds give different bytes")
        times = {id(old): [], id(new): []}
        for _ in range(rounds):
            for C in (old, new):
                start = time.thread_time()
                for k in range(calls):
                    call(C, k)
                times[id(C)].append((time.thread_time() - start) / calls)
        quartile = [sorted(times[id(C)])[len(times[id(C)]) // 4] for C in (old, new)]
        rows.append((name, *quartile))
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("old", help="a fastload tree with its extension built, or the "
                        "folder holding an installed fastload package")
    parser.add_argument("new", nargs="?", default=os.path.dirname(HERE))
    parser.add_argument("--rounds", type=int, default=25)
    args = parser.parse_args()
    rows = compare(load_extension(args.old, "old"), load_extension(args.new, "new"),
                   args.rounds)
    print(f"CPU: {cpu_model()}, {os.cpu_count()} cores; old: {args.old}, new: {args.new}; "
          f"thread CPU time per call, lower quartile of {args.rounds} alternating turns; "
          "the same bytes from both.\n")
    print("| workload | old ms | new ms | new / old |")
    print("|---|---:|---:|---:|")
    for name, old, new in rows:
        print(f"| {name} | {old * 1e3:.3f} | {new * 1e3:.3f} | **{new / old:.2f}** |")


if __name__ == "__main__":
    main()
