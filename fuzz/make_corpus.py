"""Writes the seed corpus of the pipeline fuzz target (fuzz/corpus/pipeline).

    python fuzz/make_corpus.py

Each seed is 16 parameter bytes (the plan: see fuzz_pipeline.c) followed by
a small JPEG from benchmarks/imagenet_like.make_test_images: every kind
(baseline and progressive, each chroma sampling, grayscale, CMYK, restart
markers, optimised tables), under a few plans each, plus a truncated file
and a PNG.  Deterministic, so the corpus in the repository can be
regenerated; files over MAX_BYTES are left out to keep it small.
"""

import os
import pathlib
import random
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent / "benchmarks"))
import imagenet_like  # noqa: E402

MAX_BYTES = 24 * 1024
PLANS_PER_IMAGE = 3


def main():
    out = ROOT / "corpus" / "pipeline"
    out.mkdir(parents=True, exist_ok=True)
    for old in out.iterdir():
        old.unlink()
    rng = random.Random(0)
    with tempfile.TemporaryDirectory() as tmp:
        images = imagenet_like.make_test_images(tmp)
        written = 0
        for path, _ in images:
            data = pathlib.Path(path).read_bytes()
            if len(data) > MAX_BYTES:
                continue
            name = pathlib.Path(path).stem
            variants = [data]
            if name.startswith("rgb_224"):
                variants.append(data[: len(data) * 2 // 3])  # truncated
            for v, body in enumerate(variants):
                for k in range(PLANS_PER_IMAGE):
                    params = bytes([k % 3] + [rng.randrange(256) for _ in range(15)])
                    (out / f"{name}-{v}{k}").write_bytes(params + body)
                    written += 1
    total = sum(f.stat().st_size for f in out.iterdir())
    print(f"{written} seeds, {total / 1024:.0f} KiB in {os.path.relpath(out)}")


if __name__ == "__main__":
    main()
