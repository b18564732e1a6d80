"""The GPU resample kernel (csrc/core/cuda/kernels/resample.cu) against the
CPU path (fl_resample, csrc/core/image/resample.c).

No GPU is needed: the kernel's source compiles as C too, and
_C.resample_kernel runs its per-pixel function over a batch on the CPU
(resample_kernel_host.c), from tables made by fl_resample_tables and with
each image read from a copy of only the region those tables say is read
(an offset origin and a padded pitch, as a region decode would give).  The
kernel repeats fl_resample's float operations in the same order, so the
outputs are compared for equality, every dtype included: any difference at
all is a kernel that drifted from the CPU path.  The source string the
extension carries for NVRTC must be the file's text, and where NVRTC or
nvcc is installed the text must compile as CUDA (to PTX), with the kernel
under its unmangled name and no fused multiply-add in it.
"""

import ctypes
import os
import pathlib
import re
import shutil
import subprocess

import numpy as np
import pytest

from fastload import _C

ROOT = pathlib.Path(__file__).resolve().parent.parent
KERNEL = ROOT / "csrc" / "core" / "cuda" / "kernels" / "resample.cu"

NEAREST, BILINEAR, BICUBIC = 0, 1, 2
UINT8, FLOAT32, FLOAT16 = 0, 1, 2
CHW, HWC = 0, 1
NAMES = {UINT8: "uint8", FLOAT32: "float32", FLOAT16: "float16"}


def run_both(images, boxes, flips, size, filt, antialias, dtype, layout, scale, offset):
    args = (images, boxes, flips, size, filt, antialias, dtype, layout, scale, offset)
    cpu = _C.resample_kernel(*args, False)
    kernel = _C.resample_kernel(*args, True)
    return cpu, kernel


def assert_same(cpu, kernel, what):
    assert cpu.shape == kernel.shape and cpu.dtype == kernel.dtype, what
    # Bits, not values: -0.0 against 0.0, or a NaN, would be a difference too.
    differ = np.count_nonzero(cpu.view(np.uint8) != kernel.view(np.uint8))
    if differ:
        wide = np.abs(cpu.astype(np.float64) - kernel.astype(np.float64))
        pytest.fail(f"{what}: {differ} of {cpu.nbytes} bytes differ (largest difference "
                    f"{wide.max()})")


def random_box(rng, w, h):
    """A box inside a w x h image: the whole image, one touching the right
    and bottom edges, an integer one, or one with fractional origin and
    size anywhere inside."""
    kind = rng.integers(4)
    if kind == 0:
        return (0.0, 0.0, float(w), float(h))
    if kind == 1:
        bx, by = rng.uniform(0, w * 0.6), rng.uniform(0, h * 0.6)
        return (bx, by, w - bx, h - by)
    if kind == 2:
        bw, bh = int(rng.integers(1, w + 1)), int(rng.integers(1, h + 1))
        return (float(rng.integers(0, w - bw + 1)), float(rng.integers(0, h - bh + 1)),
                float(bw), float(bh))
    bw, bh = rng.uniform(0.3, 1.0) * w, rng.uniform(0.3, 1.0) * h
    return (rng.uniform(0, w - bw), rng.uniform(0, h - bh), bw, bh)


def random_case(rng):
    """One batch: 1 to 4 images of random sizes, each with a box and a flip,
    and a target whose size is a random factor of the first box: up to 4x
    larger, or 1x to 20x smaller; now and then a tall image shrunk in
    height only (Pillow's vertical-first order) or a same-size copy."""
    shape = rng.integers(6)
    if shape == 0:  # tall, height shrinks far more than width: vertical first
        ow, oh = int(rng.integers(1, 40)), int(rng.integers(1, 30))
        sizes = [(ow + int(rng.integers(0, 3)), oh * int(rng.integers(3, 12)) + 7)]
    elif shape == 1:  # tiny images: 1-pixel rows and columns
        sizes = [(int(rng.integers(1, 4)), int(rng.integers(1, 4)))]
        ow, oh = int(rng.integers(1, 9)), int(rng.integers(1, 9))
    else:
        w, h = int(rng.integers(1, 160)), int(rng.integers(1, 160))
        sizes = [(w, h)]
        if shape == 2:  # upscale
            ow, oh = int(w * rng.uniform(1, 4)) + 1, int(h * rng.uniform(1, 4)) + 1
        elif shape == 3:  # same size: a copy when the box is an integer one
            ow, oh = w, h
        else:  # downscale by 1x .. 20x
            ow = max(1, int(round(w / rng.uniform(1, 20))))
            oh = max(1, int(round(h / rng.uniform(1, 20))))
    for _ in range(int(rng.integers(0, 4))):
        sizes.append((int(rng.integers(1, 120)), int(rng.integers(1, 120))))
    images = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for w, h in sizes]
    # Some smooth images too: the bicubic lobes then rarely clip.
    for k, image in enumerate(images):
        if rng.integers(3) == 0:
            h, w = image.shape[:2]
            ramp = np.add.outer(np.arange(h) * 3, np.arange(w) * 2)
            images[k] = np.stack([ramp, ramp * 2 + 7, 255 - ramp], -1).clip(0, 255).astype(
                np.uint8)
    boxes = [random_box(rng, im.shape[1], im.shape[0]) for im in images]
    flips = [bool(rng.integers(2)) for _ in images]
    return images, boxes, flips, (ow, oh)


SCALINGS = [
    ((1.0, 1.0, 1.0), (0.0, 0.0, 0.0)),                       # the stored bytes
    ((1 / 255, 1 / 255, 1 / 255), (0.0, 0.0, 0.0)),           # ToTensor
    ((1 / 58.395, 1 / 57.12, 1 / 57.375), (-2.1179, -2.0357, -1.8044)),  # Normalize
    ((1.3, -0.7, 0.5), (-20.0, 200.0, 0.25)),                 # clamps uint8 both ways
]


@pytest.mark.parametrize("seed", range(8))
def test_kernel_equals_fl_resample_on_random_batches(seed):
    rng = np.random.default_rng(1000 + seed)
    for case in range(40):
        images, boxes, flips, size = random_case(rng)
        filt = int(rng.integers(3))
        antialias = int(rng.integers(2))
        dtype = int(rng.integers(3))
        layout = int(rng.integers(2))
        scale, offset = SCALINGS[int(rng.integers(len(SCALINGS)))]
        cpu, kernel = run_both(images, boxes, flips, size, filt, antialias, dtype, layout,
                               scale, offset)
        what = (f"seed {seed} case {case}: sizes {[im.shape[1::-1] for im in images]} "
                f"boxes {boxes} flips {flips} -> {size}, filter {filt}, antialias "
                f"{antialias}, {NAMES[dtype]}, {'CHW' if layout == CHW else 'HWC'}")
        assert_same(cpu, kernel, what)


@pytest.mark.parametrize("filt", [NEAREST, BILINEAR, BICUBIC])
@pytest.mark.parametrize("dtype", [UINT8, FLOAT32, FLOAT16])
def test_kernel_equals_fl_resample_everywhere(filt, dtype):
    """Every filter, dtype, layout, antialias and flip on fixed geometries:
    a downscale by 7.3 with a fractional box, an upscale, a copy, a box on
    the bottom-right edges, a vertical-first shrink, and 20x down."""
    rng = np.random.default_rng(7)
    image = rng.integers(0, 256, (150, 131, 3), dtype=np.uint8)
    tall = rng.integers(0, 256, (300, 40, 3), dtype=np.uint8)
    geometries = [
        ([image], [(3.25, 1.5, 120.4, 140.2)], (16, 19)),
        ([image], [(10.5, 20.25, 30.0, 20.0)], (97, 61)),
        ([image], [(4.0, 9.0, 64.0, 80.0)], (64, 80)),
        ([image], [(100.75, 120.5, 30.25, 29.5)], (11, 13)),
        ([tall], [(0.0, 0.0, 40.0, 300.0)], (37, 41)),
        ([image, tall], [(0.0, 0.0, 131.0, 150.0), (0.5, 0.5, 39.5, 299.5)], (7, 7)),
    ]
    for layout in (CHW, HWC):
        for antialias in (0, 1):
            for flip in (False, True):
                for images, boxes, size in geometries:
                    scale, offset = SCALINGS[2] if dtype != UINT8 else SCALINGS[3]
                    cpu, kernel = run_both(images, boxes, [flip] * len(images), size, filt,
                                           antialias, dtype, layout, scale, offset)
                    assert_same(cpu, kernel, f"{boxes} -> {size}, layout {layout}, "
                                f"antialias {antialias}, flip {flip}")


def test_batch_rows_are_the_single_images():
    """Each row of a batch is what the image gives alone: the tables'
    offsets and the rows' addresses do not mix images up."""
    rng = np.random.default_rng(3)
    images = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
              for w, h in [(50, 40), (7, 90), (120, 33), (1, 1)]]
    boxes = [(0.0, 0.0, float(im.shape[1]), float(im.shape[0])) for im in images]
    flips = [False, True, False, True]
    args = (BICUBIC, 1, FLOAT32, CHW, (1.0, 1.0, 1.0), (0.0, 0.0, 0.0), True)
    batch = _C.resample_kernel(images, boxes, flips, (24, 20), *args)
    for k in range(len(images)):
        alone = _C.resample_kernel([images[k]], [boxes[k]], [flips[k]], (24, 20), *args)
        assert np.array_equal(batch[k], alone[0])
    assert not np.array_equal(batch[0], batch[2])


def test_bad_boxes_are_refused_as_fl_resample_refuses_them():
    image = np.zeros((10, 10, 3), np.uint8)
    for box in [(0.0, 0.0, 11.0, 10.0), (-1.0, 0.0, 5.0, 5.0), (0.0, 0.0, 0.0, 5.0)]:
        for kernel in (False, True):
            with pytest.raises(ValueError, match="refused"):
                _C.resample_kernel([image], [box], [False], (4, 4), BILINEAR, 1, UINT8, CHW,
                                   (1.0,) * 3, (0.0,) * 3, kernel)


def test_the_embedded_source_is_the_file():
    assert _C.resample_kernel_source() == KERNEL.read_text(encoding="utf-8")


def test_the_source_stands_alone():
    """NVRTC gets the text as one string: nothing to include."""
    text = KERNEL.read_text(encoding="utf-8")
    assert not re.search(r"^\s*#\s*include", text, re.M)
    assert 'extern "C" __global__ void fl_resample_batch(' in text


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_the_source_compiles_as_cuda_without_fused_multiply_add(tmp_path):
    ptx = tmp_path / "resample.ptx"
    # Not under the sanitizer run's preloaded runtimes: nvcc's own tools are
    # not built for them.
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    result = subprocess.run(["nvcc", "-ptx", "-arch=sm_80", "-x", "cu", str(KERNEL), "-o",
                             str(ptx)], capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr
    code = ptx.read_text()
    assert re.search(r"\.entry\s+fl_resample_batch\(", code)  # unmangled: extern "C"
    assert "fma." not in code and "mad.f32" not in code


def _nvrtc():
    for name in ("libnvrtc.so", "libnvrtc.so.13", "libnvrtc.so.12"):
        try:
            return ctypes.CDLL(name)
        except OSError:
            pass
    return None


def test_the_embedded_source_compiles_with_nvrtc():
    """The string as the loader hands it to NVRTC, with no options."""
    nvrtc = _nvrtc()
    if nvrtc is None:
        pytest.skip("needs libnvrtc")
    program = ctypes.c_void_p()
    source = _C.resample_kernel_source().encode()
    assert nvrtc.nvrtcCreateProgram(ctypes.byref(program), source, b"resample.cu", 0, None,
                                    None) == 0
    try:
        status = nvrtc.nvrtcCompileProgram(program, 0, None)
        size = ctypes.c_size_t()
        nvrtc.nvrtcGetProgramLogSize(program, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        nvrtc.nvrtcGetProgramLog(program, log)
        assert status == 0, log.value.decode(errors="replace")
        nvrtc.nvrtcGetPTXSize(program, ctypes.byref(size))
        ptx = ctypes.create_string_buffer(size.value)
        assert nvrtc.nvrtcGetPTX(program, ptx) == 0
    finally:
        nvrtc.nvrtcDestroyProgram(ctypes.byref(program))
    code = ptx.value.decode()
    assert re.search(r"\.entry\s+fl_resample_batch\(", code)
    assert "fma." not in code and "mad.f32" not in code
