"""Each augmentation op on one 224x224 picture: fastload's C op (through the
``_C.pil_op`` hook) against torchvision's ``autoaugment._apply_op`` on the PIL
image, with bilinear warps, checking that both give the same bytes.

    python benchmarks/pil_ops_bench.py            # 7 rounds of 40 calls per op
    python benchmarks/pil_ops_bench.py --quick    # 1 round of 3 calls

Times are CPU time of this thread per call, the best round of each, so a
busy machine inflates them less than wall time; the ratio compares the two
on the same image in the same process.  Prints Markdown on stdout.
"""

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from fastload import _C  # noqa: E402

import imagenet_like  # noqa: E402
import pil_pipeline  # noqa: E402
from workloads import cpu_model  # noqa: E402

# (op, magnitude): RandAugment(2, 9)'s magnitudes for the signed ops and the
# others' typical values
OPS = [("ShearX", 0.09), ("ShearY", -0.09), ("Rotate", 9.0), ("Rotate", -27.0),
       ("TranslateX", 40.0), ("Brightness", 0.27), ("Color", 0.27), ("Color", -0.27),
       ("Contrast", 0.27), ("Sharpness", 0.27), ("Posterize", 6.0), ("Solarize", 170.0),
       ("AutoContrast", 0.0), ("Equalize", 0.0)]


def picture(size=224):
    rng = np.random.default_rng(0)
    image = imagenet_like.synthesize(rng, size, size, imagenet_like.texture_bank(0))
    return np.ascontiguousarray(np.asarray(image.convert("RGB")))


def best_time(call, rounds, calls):
    best = float("inf")
    for _ in range(rounds):
        start = time.thread_time()
        for _ in range(calls):
            call()
        best = min(best, (time.thread_time() - start) / calls)
    return best


def measure(tv, rounds=7, calls=40):
    """[(op, magnitude, fastload seconds, torchvision seconds)]; raises if
    an op's bytes differ from torchvision's."""
    from PIL import Image
    from torchvision.transforms import InterpolationMode, autoaugment

    image = picture()
    pil = Image.fromarray(image)
    rows = []
    for op, magnitude in OPS:
        ours = _C.pil_op(op, image, magnitude, 1, (0, 0, 0))
        ref = autoaugment._apply_op(pil, op, magnitude, InterpolationMode.BILINEAR, None)
        if not np.array_equal(ours, np.asarray(ref)):
            raise AssertionError(f"{op} {magnitude}: fastload's bytes differ from Pillow's")
        fl = best_time(lambda: _C.pil_op(op, image, magnitude, 1, (0, 0, 0)), rounds, calls)
        tv_time = best_time(lambda: autoaugment._apply_op(
            pil, op, magnitude, InterpolationMode.BILINEAR, None), rounds, calls)
        rows.append((op, magnitude, fl, tv_time))
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    tv = pil_pipeline.torchvision_or_none()
    if tv is None:
        sys.exit("pil_ops_bench.py needs torchvision")
    rows = measure(tv, *((1, 3) if args.quick else (7, 40)))
    print(f"CPU: {cpu_model()}, {os.cpu_count()} cores; 224x224 RGB, bilinear, best of "
          f"{'1 round of 3' if args.quick else '7 rounds of 40'} calls (thread CPU time).\n")
    print("| op | magnitude | fastload ms | torchvision on PIL ms | fastload vs PIL |")
    print("|---|---:|---:|---:|---:|")
    for op, magnitude, fl, ref in rows:
        print(f"| {op} | {magnitude:g} | {fl * 1e3:.3f} | {ref * 1e3:.3f} | **{ref / fl:.2f}x** |")


if __name__ == "__main__":
    main()
