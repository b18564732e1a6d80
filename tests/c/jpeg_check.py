"""Checks the JPEG region decoder and the resampler (csrc/core/image/jpeg.c,
csrc/core/image/resample.c) against Pillow, through tests/c/jpeg_check.c.

    python3 tests/c/jpeg_check.py            # everything, -O3 build
    python3 tests/c/jpeg_check.py --asan     # everything under ASan + UBSan
    python3 tests/c/jpeg_check.py --quick    # fewer images and cases, one timing round

Builds the harness into a temporary directory, generates photo-like JPEGs
(Pillow's encoder, plus the harness's own for the sampling factors, restart
intervals, YCCK and scan counts Pillow cannot write), and checks:

  full      whole-image decode against Pillow's (max abs difference)
  region    region decodes, every scale, against the same library's decode
            of the whole image at that scale: identical inside the box
  pipeline  region + DCT scale + resample against Pillow decode -> crop(box)
            -> resize(BILINEAR) -> float: PSNR
  resample  fl_resample alone against Pillow's resize (uint8), against a
            float reference of the same coefficients (float32, antialias off,
            bicubic), and flip / layout / dtype consistency
  half      the float16 conversion for all 2^32 float bit patterns (numpy)
  corrupt   truncations, bit flips, overwrites, empty / PNG / text input,
            a 60000 x 60000 SOF and a 947-scan file: a status, never a crash,
            never a byte on stderr
  timing    full decode vs region (+ scale) decode, and resample vs Pillow

Prints one line per check and exits non-zero when one fails.
"""

import argparse
import ctypes
import io
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

ROOT = pathlib.Path(__file__).resolve().parents[2]
SOURCES = ["csrc/core/image/jpeg.c", "csrc/core/image/jpeg_restart.c",
           "csrc/core/image/jpeg_transcode.c",
           "csrc/core/image/resample.c", "csrc/core/status.c",
           "tests/c/jpeg_check.c"]
CC = shutil.which(os.environ.get("CC", "gcc")) or "cc"
WARN = ["-std=c11", "-Wall", "-Wextra", "-Werror", "-Icsrc"]
SAN = ["-O1", "-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=undefined",
       "-fno-omit-frame-pointer"]

FL_OK, FL_ERR_NOMEM, FL_ERR_INVALID = 0, -1, -2
FL_ERR_DECODE, FL_ERR_TOO_BIG = -10, -11
NEAREST, BILINEAR, BICUBIC = 0, 1, 2
CHW, HWC = 0, 1
U8, F32, F16 = 0, 1, 2
DEFAULT_MAX_PIXELS = 178956970
PIL_FILTER = {NEAREST: Image.NEAREST, BILINEAR: Image.BILINEAR, BICUBIC: Image.BICUBIC}

FAILURES = []


def report(name, ok, text):
    print(f"[{'ok' if ok else 'FAIL'}] {name}: {text}", flush=True)
    if not ok:
        FAILURES.append(name)


# --------------------------------------------------------------------------
# Build and bind

def build(outdir, sanitize, extra=()):
    flags = SAN if sanitize else ["-O3", "-fvisibility=hidden"]
    lib = outdir / ("libjpeg_check%s.so" % ("_asan" if sanitize else ""))
    exe = outdir / ("jpeg_check%s" % ("_asan" if sanitize else ""))
    # The library and the program compiled side by side (two compilers).
    compilers = [subprocess.Popen([CC, *WARN, *flags, *extra, *more, *SOURCES, "-o", str(target),
                                   "-ljpeg", "-lm"], cwd=ROOT)
                 for target, more in ((lib, ["-fPIC", "-shared"]), (exe, ["-DFL_CHECK_MAIN"]))]
    for compiler in [c for c in compilers if c.wait() != 0]:
        raise subprocess.CalledProcessError(compiler.returncode, compiler.args)
    return lib, exe


class Lib:
    def __init__(self, path):
        c = ctypes.CDLL(str(path))
        P, S, I, D = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_double
        c.chk_header.argtypes = [P, S, P, P, S]
        c.chk_decode.argtypes = [P, S, I, I, I, I, I, I, ctypes.c_ulonglong, P, S, P, P, P, S]
        c.chk_resample.argtypes = [P, I, I, S, D, D, D, D, I, I, I, I, I, I, I, P, P, P]
        c.chk_pipeline.argtypes = [P, S, I, I, I, I, I, I, I, I, I, I, I, P, P, P, P, P, S]
        c.chk_complete.argtypes = [P, S]
        c.chk_restart_cut.argtypes = [P, S, I, I, I, I, I]
        c.chk_add_restarts.argtypes = [P, S, I, I, P, S, P, P, S]
        c.chk_add_restarts.restype = ctypes.c_longlong
        c.chk_half_array.argtypes = [P, S, P]
        c.chk_half_array.restype = None
        c.chk_pick_scale.argtypes = [I, I, I, I]
        c.chk_encode.argtypes = [P, I, I, I, I, I, I, I, I, I, P, S]
        c.chk_encode.restype = S
        c.chk_status_str.restype = ctypes.c_char_p
        self.c = c
        self.msg = ctypes.create_string_buffer(256)

    def header(self, data):
        out = (ctypes.c_int * 4)()
        rc = self.c.chk_header(data, len(data), out, self.msg, 256)
        return rc, tuple(out), self.msg.value.decode()

    def decode(self, data, region=None, d=1, max_pixels=DEFAULT_MAX_PIXELS, cap=None):
        """(rc, pixels HxWx3 or None, box (4,), message)."""
        if cap is None:
            rc, hdr, _ = self.header(data)
            cap = max(hdr[0] * hdr[1] * 3, 64) if rc == FL_OK else 64
        dst = np.empty(cap, np.uint8)
        dims = (ctypes.c_int * 2)()
        box = (ctypes.c_double * 4)()
        x, y, w, h = region if region else (0, 0, 0, 0)
        rc = self.c.chk_decode(data, len(data), int(region is not None), x, y, w, h, d,
                               max_pixels, dst.ctypes.data, cap, dims, box, self.msg, 256)
        msg = self.msg.value.decode()
        if rc != FL_OK:
            return rc, None, None, msg
        pw, ph = dims[0], dims[1]
        return rc, dst[: pw * ph * 3].reshape(ph, pw, 3).copy(), np.array(box[:]), msg

    def resample(self, src, box, size, filt=BILINEAR, antialias=1, flip=0, layout=HWC,
                 dtype=U8, scale=(1, 1, 1), offset=(0, 0, 0)):
        src = np.ascontiguousarray(src)
        h, w = src.shape[:2]
        ow, oh = size
        npt = {U8: np.uint8, F32: np.float32, F16: np.uint16}[dtype]
        dst = np.empty((oh, ow, 3) if layout == HWC else (3, oh, ow), npt)
        sc = (ctypes.c_float * 3)(*scale)
        of = (ctypes.c_float * 3)(*offset)
        rc = self.c.chk_resample(src.ctypes.data, w, h, src.strides[0], *map(float, box), ow, oh,
                                 filt, antialias, flip, layout, dtype, sc, of, dst.ctypes.data)
        return rc, dst

    def pipeline(self, data, region, size, d=0, flip=0):
        ow, oh = size
        dst = np.empty((3, oh, ow), np.float32)
        sc = (ctypes.c_float * 3)(1, 1, 1)
        of = (ctypes.c_float * 3)(0, 0, 0)
        used = ctypes.c_int()
        rc = self.c.chk_pipeline(data, len(data), *region, d, ow, oh, BILINEAR, flip, CHW, F32,
                                 sc, of, dst.ctypes.data, ctypes.byref(used), self.msg, 256)
        return rc, dst, used.value, self.msg.value.decode()

    def encode(self, pixels, components, quality=90, h0=2, v0=2, progressive=0,
               restart_rows=0, ycck=0):
        pixels = np.ascontiguousarray(pixels, np.uint8)
        h, w = pixels.shape[:2]
        cap = w * h * components * 4 + (1 << 16)
        out = np.empty(cap, np.uint8)
        n = self.c.chk_encode(pixels.ctypes.data, w, h, components, ycck, quality, h0, v0,
                              progressive, restart_rows, out.ctypes.data, cap)
        assert n > 0, "encoder failed"
        return out[:n].tobytes()


    def add_restarts(self, data, max_interval=0, optimize=1):
        """(status or size, bytes, k, message)."""
        cap = len(data) * 2 + (1 << 16)
        out = np.empty(cap, np.uint8)
        k = ctypes.c_int(0)
        n = self.c.chk_add_restarts(data, len(data), max_interval, optimize, out.ctypes.data, cap,
                                    ctypes.byref(k), self.msg, 256)
        return n, (out[:n].tobytes() if n > 0 else None), k.value, self.msg.value.decode()


class StderrCapture:
    """Collects what C code writes to file descriptor 2."""

    def __enter__(self):
        sys.stderr.flush()
        self.tmp = tempfile.TemporaryFile()
        self.saved = os.dup(2)
        os.dup2(self.tmp.fileno(), 2)
        return self

    def __exit__(self, *exc):
        os.dup2(self.saved, 2)
        os.close(self.saved)
        self.tmp.seek(0)
        self.text = self.tmp.read().decode(errors="replace")
        self.tmp.close()


# --------------------------------------------------------------------------
# Images

def photo(w, h, seed):
    """Smooth gradients, blurred shapes and sensor-like noise."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    img = np.empty((h, w, 3), np.float32)
    for c in range(3):
        fx, fy = rng.uniform(0.3, 3.0, 2)
        px, py = rng.uniform(0, 2 * np.pi, 2)
        gx, gy = rng.uniform(-50, 50, 2)
        img[..., c] = (128 + 60 * np.sin(2 * np.pi * fx * x / w + px)
                       * np.cos(2 * np.pi * fy * y / h + py)
                       + gx * (x / w - 0.5) + gy * (y / h - 0.5))
    im = Image.fromarray(np.clip(img, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(im)
    for _ in range(int(rng.integers(3, 14))):
        x0, x1 = sorted(rng.uniform(-0.2, 1.2, 2) * w)
        y0, y1 = sorted(rng.uniform(-0.2, 1.2, 2) * h)
        color = tuple(int(v) for v in rng.integers(0, 256, 3))
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)([x0, y0, x1, y1], fill=color)
    im = im.filter(ImageFilter.GaussianBlur(float(rng.uniform(0.3, 1.5))))
    a = np.asarray(im).astype(np.float32) + rng.normal(0, rng.uniform(2, 8), (h, w, 3))
    return np.clip(a, 0, 255).astype(np.uint8)


def pillow_jpeg(arr, mode="RGB", **kw):
    im = Image.fromarray(arr)
    if mode != "RGB":
        im = im.convert(mode)
    buf = io.BytesIO()
    im.save(buf, "JPEG", **kw)
    return buf.getvalue()


def make_corpus(lib, quick, seed=1):
    """[(name, bytes)]: varied sizes, qualities, sampling, modes."""
    rng = np.random.default_rng(seed)
    sizes = [(1, 1), (2, 3), (7, 5), (16, 16), (17, 33), (63, 65), (100, 75), (227, 229),
             (333, 500), (500, 375), (640, 480), (1023, 767), (1200, 900)]
    if quick:
        sizes = [(1, 1), (7, 5), (17, 33), (227, 229), (500, 375), (1023, 767)]
    corpus = []
    for i, (w, h) in enumerate(sizes):
        arr = photo(w, h, seed * 1000 + i)
        q = int(rng.integers(75, 96))
        for sub in (0, 1, 2):
            for prog in (False, True):
                name = f"{w}x{h}_q{q}_{['444', '422', '420'][sub]}{'_prog' if prog else ''}"
                corpus.append((name, pillow_jpeg(arr, quality=q, subsampling=sub,
                                                 progressive=prog)))
        corpus.append((f"{w}x{h}_q{q}_gray", pillow_jpeg(arr, "L", quality=q)))
        corpus.append((f"{w}x{h}_q{q}_gray_prog", pillow_jpeg(arr, "L", quality=q,
                                                              progressive=True)))
        corpus.append((f"{w}x{h}_q{q}_cmyk", pillow_jpeg(arr, "CMYK", quality=q)))
        # Sampling factors and kinds Pillow cannot write.
        # Stored inverted, as Adobe (and Pillow's encoder) write CMYK.
        cmyk = 255 - np.asarray(Image.fromarray(arr).convert("CMYK"))
        for (h0, v0, tag) in ((1, 2, "440"), (4, 1, "411"), (2, 2, "420"), (1, 4, "h1v4")):
            for prog in (0, 1):
                corpus.append((f"{w}x{h}_q{q}_{tag}{'_prog' if prog else ''}_rst",
                               lib.encode(arr, 3, q, h0, v0, prog, restart_rows=1)))
        corpus.append((f"{w}x{h}_q{q}_gray_2x2", lib.encode(arr[..., :1], 1, q, 2, 2)))
        # Restart intervals of k MCUs, k dividing the MCUs of a row (the
        # region decode cuts out the intervals it needs) and k not dividing
        # them (it decodes the file as it is).
        for (h0, v0, comps, tag) in ((1, 1, 3, "444"), (2, 1, 3, "422"), (2, 2, 3, "420"),
                                     (1, 2, 3, "440"), (2, 2, 1, "gray"), (2, 2, 4, "cmyk")):
            mcu_w = 8 if comps == 1 else 8 * h0
            per_row = -(-w // mcu_w)
            ks = sorted({1, max(k for k in (1, 2, 3, 4) if per_row % k == 0)})
            ks += [k for k in (3, 5) if per_row % k][:1]
            src = arr[..., :1] if comps == 1 else cmyk if comps == 4 else arr
            for k in ks:
                corpus.append((f"{w}x{h}_q{q}_{tag}_rst{k}",
                               lib.encode(src, comps, q, h0, v0, 0, restart_rows=-k)))
        corpus.append((f"{w}x{h}_q{q}_420_arith", lib.encode(arr, 3, q, 2, 2, 4)))
        corpus.append((f"{w}x{h}_q{q}_420_prog_arith", lib.encode(arr, 3, q, 2, 2, 5)))
        corpus.append((f"{w}x{h}_q{q}_ycck", lib.encode(cmyk, 4, q, 2, 2, 0, ycck=1)))
        corpus.append((f"{w}x{h}_q{q}_cmyk_sub", lib.encode(cmyk, 4, q, 2, 1, 1)))
    return corpus


def pillow_rgb(data):
    """Pillow's decode as an HxWx3 array, or None if Pillow cannot decode."""
    try:
        return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    except OSError:
        return None


def psnr(a, b):
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return 99.0 if mse == 0 else 10 * np.log10(255.0 ** 2 / mse)


# --------------------------------------------------------------------------
# Checks

def check_full(lib, corpus):
    worst, worst_name, exact = 0, "", 0
    failed = []
    pillow_cannot = []
    for name, data in corpus:
        rc, px, box, msg = lib.decode(data)
        ref = pillow_rgb(data)
        if ref is None:  # arithmetic coding: Pillow's libjpeg lacks it
            pillow_cannot.append(name)
            if rc != FL_OK:
                failed.append(f"{name}: rc={rc} {msg}")
            continue
        if rc != FL_OK or px.shape != ref.shape:
            failed.append(f"{name}: rc={rc} {msg}")
            continue
        if not np.array_equal(box, [0, 0, ref.shape[1], ref.shape[0]]):
            failed.append(f"{name}: box {box}")
        diff = int(np.abs(px.astype(int) - ref.astype(int)).max())
        exact += diff == 0
        if diff > worst:
            worst, worst_name = diff, name
    ok = not failed and worst <= 1
    report("full decode vs Pillow", ok,
           f"{len(corpus) - len(pillow_cannot)} images, {exact} identical, max abs diff {worst}"
           f"; {len(pillow_cannot)} arithmetic-coded ones decode (Pillow cannot)"
           f"{' (' + worst_name + ')' if worst else ''}" + ("; " + "; ".join(failed[:5])
                                                          if failed else ""))


def random_boxes(w, h, rng, n):
    boxes = [(0, 0, w, h), (w - 1, h - 1, 1, 1), (0, 0, 1, 1)]
    while len(boxes) < n:
        bw, bh = int(rng.integers(1, w + 1)), int(rng.integers(1, h + 1))
        boxes.append((int(rng.integers(0, w - bw + 1)), int(rng.integers(0, h - bh + 1)), bw, bh))
    return boxes


def check_region(lib, corpus, quick):
    rng = np.random.default_rng(2)
    cases, cut, failed = 0, 0, []
    for name, data in corpus:
        _, hdr, _ = lib.header(data)
        w, h = hdr[0], hdr[1]
        full = {}
        for d in (1, 2, 4, 8):
            rc, px, box, msg = lib.decode(data, (0, 0, w, h), d)
            if rc != FL_OK or px.shape[:2] != (-(-h // d), -(-w // d)):
                failed.append(f"{name} whole/{d}: rc={rc} {msg} "
                              f"{None if px is None else px.shape}")
                continue
            full[d] = px
        for (x, y, bw, bh) in random_boxes(w, h, rng, 6 if quick else 14):
            for d in full:
                rc, px, box, msg = lib.decode(data, (x, y, bw, bh), d)
                cases += 1
                cut += lib.c.chk_restart_cut(data, len(data), x, y, bw, bh, 2 * d) == 1
                if rc != FL_OK:
                    failed.append(f"{name} {x},{y},{bw}x{bh}/{d}: rc={rc} {msg}")
                    continue
                want = np.array([x / d, y / d, bw / d, bh / d])
                # The buffer's origin in the scaled image, from the box.
                ox, oy = want[0] - box[0], want[1] - box[1]
                if (not np.allclose(box[2:], want[2:]) or ox != int(ox) or oy != int(oy)
                        or box[0] < 0 or box[1] < 0 or box[0] + box[2] > px.shape[1] + 1e-9
                        or box[1] + box[3] > px.shape[0] + 1e-9):
                    failed.append(f"{name} {x},{y},{bw}x{bh}/{d}: box {box} buffer {px.shape}")
                    continue
                ox, oy = int(ox), int(oy)
                x0, y0 = int(np.floor(box[0])), int(np.floor(box[1]))
                x1, y1 = int(np.ceil(box[0] + box[2])), int(np.ceil(box[1] + box[3]))
                mine = px[y0:y1, x0:x1]
                ref = full[d][oy + y0:oy + y1, ox + x0:ox + x1]
                if mine.shape != ref.shape or not np.array_equal(mine, ref):
                    diff = (np.abs(mine.astype(int) - ref.astype(int)).max()
                            if mine.shape == ref.shape else "shape")
                    failed.append(f"{name} {x},{y},{bw}x{bh}/{d}: differs ({diff})")
    report("region decode vs whole decode", not failed,
           f"{cases} region decodes over {len(corpus)} images identical inside the box"
           f" ({cut} from restart intervals cut out)"
           + ("; " + "; ".join(failed[:6]) + f" ({len(failed)} failures)" if failed else ""))


def check_add_restarts(lib, corpus, quick):
    """fl_jpeg_add_restarts: the rewritten file decodes to the original's
    pixels (this decoder and Pillow), and its region decodes (most of them
    from cut-out intervals) equal the original's whole decode at every scale."""
    rng = np.random.default_rng(3)
    files = cases = cut = 0
    grew, files_seen = [], []
    failed = []
    for name, data in corpus:
        rc, _, _, _ = lib.decode(data)
        if rc != FL_OK:
            continue
        n, new, k, msg = lib.add_restarts(data, optimize=len(files_seen) % 2)
        files_seen.append(name)
        if n <= 0:
            failed.append(f"{name}: rewrite rc={n} {msg}")
            continue
        files += 1
        grew.append(len(new) / len(data))
        _, hdr, _ = lib.header(data)
        w, h = hdr[0], hdr[1]
        ref_p, new_p = pillow_rgb(data), pillow_rgb(new)
        if ref_p is not None and (new_p is None or not np.array_equal(ref_p, new_p)):
            failed.append(f"{name}: Pillow decodes the rewrite differently")
        for d in (1, 2, 4, 8):
            rc, ref, _, msg = lib.decode(data, (0, 0, w, h), d)
            rc2, mine, _, msg2 = lib.decode(new, (0, 0, w, h), d)
            if rc != FL_OK or rc2 != FL_OK or not np.array_equal(ref, mine):
                failed.append(f"{name} whole/{d}: differs ({rc} {rc2} {msg2})")
                continue
            for (x, y, bw, bh) in random_boxes(w, h, rng, 3 if quick else 6):
                rc, px, box, msg = lib.decode(new, (x, y, bw, bh), d)
                cases += 1
                cut += lib.c.chk_restart_cut(new, len(new), x, y, bw, bh, 2 * d) == 1
                if rc != FL_OK:
                    failed.append(f"{name} {x},{y},{bw}x{bh}/{d}: rc={rc} {msg}")
                    continue
                ox, oy = int(round(x / d - box[0])), int(round(y / d - box[1]))
                x0, y0 = int(np.floor(box[0])), int(np.floor(box[1]))
                x1, y1 = int(np.ceil(box[0] + box[2])), int(np.ceil(box[1] + box[3]))
                if not np.array_equal(px[y0:y1, x0:x1], ref[oy + y0:oy + y1, ox + x0:ox + x1]):
                    failed.append(f"{name} rewritten {x},{y},{bw}x{bh}/{d}: differs")
    report("add_restarts: lossless, regions exact", not failed and files > 0,
           f"{files} files rewritten (size x{min(grew):.3f}..x{max(grew):.3f}), "
           f"{cases} region decodes of them identical to the original's whole decode "
           f"({cut} from cut-out intervals)"
           + ("; " + "; ".join(failed[:6]) + f" ({len(failed)} failures)" if failed else ""))


def rrc_box(w, h, rng):
    """torchvision RandomResizedCrop's box (scale 0.08-1, ratio 3/4-4/3)."""
    area = w * h
    for _ in range(10):
        target = area * rng.uniform(0.08, 1.0)
        ratio = np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3)))
        bw = int(round(np.sqrt(target * ratio)))
        bh = int(round(np.sqrt(target / ratio)))
        if 0 < bw <= w and 0 < bh <= h:
            return (int(rng.integers(0, w - bw + 1)), int(rng.integers(0, h - bh + 1)), bw, bh)
    s = min(w, h)
    return (w - s) // 2, (h - s) // 2, s, s


def center_box(w, h):
    """Resize(256) then CenterCrop(224), as one box of the original."""
    s = min(w, h) * 224 / 256
    bw = bh = max(1, int(round(s)))
    return (w - bw) // 2, (h - bh) // 2, bw, bh


def check_pipeline(lib, corpus, quick):
    rng = np.random.default_rng(3)
    stats = {1: [], "scaled": []}
    failed = []
    for name, data in corpus:
        if pillow_rgb(data) is None:
            continue
        ref_img = Image.open(io.BytesIO(data)).convert("RGB")
        w, h = ref_img.size
        if min(w, h) < 8:
            continue
        boxes = [center_box(w, h)] + [rrc_box(w, h, rng) for _ in range(3 if quick else 8)]
        for i, (x, y, bw, bh) in enumerate(boxes):
            out = (224, 224) if i % 3 != 2 else (int(rng.integers(16, 300)),
                                                  int(rng.integers(16, 300)))
            ref = np.asarray(ref_img.crop((x, y, x + bw, y + bh)).resize(out, Image.BILINEAR))
            ref = ref.astype(np.float32).transpose(2, 0, 1)
            for d in (1, 0):  # 1: no DCT scaling; 0: fl_jpeg_pick_scale
                rc, dst, used, msg = lib.pipeline(data, (x, y, bw, bh), out, d)
                if rc != FL_OK:
                    failed.append(f"{name} {x},{y},{bw}x{bh}->{out}/{d}: rc={rc} {msg}")
                    continue
                if d == 0 and used == 1:
                    continue
                stats[1 if used == 1 else "scaled"].append(
                    (psnr(dst, ref), f"{name} {x},{y},{bw}x{bh}->{out[0]}x{out[1]}/{used}"))
    # 4:1:1 and 1x4 luma sampling are rare (DV video; no common encoder);
    # scaled down, libjpeg upsamples their chroma with a triangle filter
    # where the full-size decode replicates it 4x, which costs several dB on
    # saturated synthetic colours.  Reported, not held to a floor.
    exotic = ("_411", "_h1v4")
    for key, floor in ((1, 38.0), ("scaled", 32.0), ("scaled exotic", 0.0)):
        vals = sorted(v for v in stats[1 if key == 1 else "scaled"]
                      if (key == "scaled exotic") == any(e in v[1] for e in exotic)
                      or key == 1)
        if not vals:
            report(f"pipeline PSNR {key}", False, "no cases")
            continue
        lo, med = vals[0], vals[len(vals) // 2][0]
        label = {1: "scale 1", "scaled": "DCT-scaled, 4:4:4/4:2:2/4:2:0/4:4:0/gray/CMYK",
                 "scaled exotic": "DCT-scaled, 4:1:1 and 1x4 sampling, informational"}[key]
        text = (f"{len(vals)} cases, min {lo[0]:.1f} dB ({lo[1]}), median {med:.1f} dB, "
                + (f"floor {floor}" if floor else "no floor"))
        report(f"pipeline PSNR ({label})", lo[0] >= floor and not failed,
               text + ("; " + "; ".join(failed[:4]) if failed else ""))


def pillow_coeffs(in_size, b0, b1, out_size, support, antialias):
    """Pillow's precompute_coeffs in float64 (and a non-antialiased variant)."""
    scale = (b1 - b0) / out_size
    fs = max(scale, 1.0) if antialias else 1.0
    sup = support * fs
    rows = []
    for i in range(out_size):
        c = b0 + (i + 0.5) * scale
        lo = max(int(c - sup + 0.5), 0)
        hi = min(int(c + sup + 0.5), in_size)
        rows.append((lo, hi, c, fs))
    return rows


def kernel(x, filt):
    x = np.abs(x)
    if filt == BILINEAR:
        return np.where(x < 1, 1 - x, 0.0)
    a = -0.5
    return np.where(x < 1, ((a + 2) * x - (a + 3)) * x * x + 1,
                    np.where(x < 2, (((x - 5) * x + 8) * x - 4) * a, 0.0))


def ref_matrix(in_size, b0, blen, out_size, filt, antialias):
    m = np.zeros((out_size, in_size))
    sup = 1.0 if filt == BILINEAR else 2.0
    for i, (lo, hi, c, fs) in enumerate(pillow_coeffs(in_size, b0, b0 + blen, out_size, sup,
                                                      antialias)):
        xs = np.arange(lo, hi)
        k = kernel((xs - c + 0.5) / fs, filt)
        if k.sum() != 0:
            k = k / k.sum()
        m[i, lo:hi] = k
    return m


def ref_resample_float(src, box, size, filt, antialias):
    """Float separable resize with Pillow's coefficients, clipped like Pillow,
    in Pillow 13's pass order (vertical first when the height shrinks by more
    than twice what the width does)."""
    h, w = src.shape[:2]
    mx = ref_matrix(w, box[0], box[2], size[0], filt, antialias)
    my = ref_matrix(h, box[1], box[3], size[1], filt, antialias)
    a = src.astype(np.float64)
    if size[1] < h and h - size[1] > 2 * (w - size[0]):
        tmp = np.clip(np.einsum("oy,yxc->oxc", my, a), 0, 255)
        return np.clip(np.einsum("ox,yxc->yoc", mx, tmp), 0, 255)
    tmp = np.clip(np.einsum("ox,yxc->yoc", mx, a), 0, 255)
    return np.clip(np.einsum("oy,yxc->oxc", my, tmp), 0, 255)


def check_resample(lib, quick):
    rng = np.random.default_rng(4)
    n = 60 if quick else 250
    worst = {BILINEAR: 0, BICUBIC: 0, NEAREST: 0}
    worst_float = 0.0
    failed = []
    for i in range(n):
        w, h = int(rng.integers(1, 700)), int(rng.integers(1, 700))
        src = photo(w, h, 500 + i)
        if i % 3 == 0:  # integer box
            bw, bh = int(rng.integers(1, w + 1)), int(rng.integers(1, h + 1))
            box = (int(rng.integers(0, w - bw + 1)), int(rng.integers(0, h - bh + 1)), bw, bh)
        else:  # float box, float32-representable (Pillow's box is float32)
            bx0, bx1 = sorted(rng.uniform(0, w, 2))
            by0, by1 = sorted(rng.uniform(0, h, 2))
            box = tuple(float(np.float32(v)) for v in (bx0, by0, max(bx1 - bx0, 0.25),
                                                        max(by1 - by0, 0.25)))
            box = (box[0], box[1], min(box[2], w - box[0]), min(box[3], h - box[1]))
            if box[2] <= 0 or box[3] <= 0 or np.float32(box[0] + box[2]) > w \
                    or np.float32(box[1] + box[3]) > h:
                continue
        out = (int(rng.integers(1, 400)), int(rng.integers(1, 400)))
        filt = (BILINEAR, BICUBIC, NEAREST)[i % 3 if i % 5 else 0]
        pil_box = (box[0], box[1], box[0] + box[2], box[1] + box[3])
        ref = np.asarray(Image.fromarray(src).resize(out, PIL_FILTER[filt], box=pil_box))
        rc, mine = lib.resample(src, box, out, filt)
        if rc != FL_OK:
            failed.append(f"rc={rc} {w}x{h} {box}->{out}")
            continue
        d = int(np.abs(mine.astype(int) - ref.astype(int)).max())
        if d > worst[filt]:
            worst[filt] = d
            if d > (0 if filt == NEAREST else 1):
                failed.append(f"filter {filt} {w}x{h} box {box} -> {out}: diff {d}")
        if filt != NEAREST:
            aa = int(i % 2)
            rc, f = lib.resample(src, box, out, filt, antialias=aa, dtype=F32)
            r = ref_resample_float(src, box, out, filt, aa)
            e = float(np.abs(f - r).max())
            worst_float = max(worst_float, e)
            if e > 2e-3:
                failed.append(f"float filter {filt} aa {aa} {w}x{h} {box}->{out}: {e}")
        # Flip, layout and dtype against the plain result.
        sc, of = (0.5, 1 / 57.0, -2.0), (3.0, -2.1, 0.25)
        _, base = lib.resample(src, box, out, filt, dtype=F32, scale=sc, offset=of)
        _, flipped = lib.resample(src, box, out, filt, flip=1, dtype=F32, scale=sc, offset=of)
        _, chw = lib.resample(src, box, out, filt, layout=CHW, dtype=F32, scale=sc, offset=of)
        _, half = lib.resample(src, box, out, filt, layout=CHW, dtype=F16, scale=sc, offset=of)
        _, u8 = lib.resample(src, box, out, filt, dtype=U8, scale=sc, offset=of)
        _, plain = lib.resample(src, box, out, filt, dtype=F32)
        want_u8 = np.clip(np.floor(plain * np.float32(sc) + np.float32(of) + np.float32(0.5)),
                          0, 255)
        if not np.array_equal(flipped, base[:, ::-1]):
            failed.append(f"flip {w}x{h} {box}->{out}")
        if not np.array_equal(chw, base.transpose(2, 0, 1)):
            failed.append(f"layout {w}x{h} {box}->{out}")
        if not np.array_equal(half, chw.astype(np.float16).view(np.uint16)):
            failed.append(f"float16 {w}x{h} {box}->{out}")
        if not np.allclose(base, plain * np.float32(sc) + np.float32(of), atol=1e-4):
            failed.append(f"scale/offset {w}x{h} {box}->{out}")
        if np.abs(u8.astype(int) - want_u8).max() > 1:
            failed.append(f"uint8 scale/offset {w}x{h} {box}->{out}")
    # Bad arguments.
    src = photo(10, 10, 9)
    bad = [((-0.5, 0, 5, 5), (4, 4)), ((0, 0, 11, 5), (4, 4)), ((0, 0, 0, 5), (4, 4)),
           ((0, 0, 5, 5), (0, 4)), ((0, 0, float("nan"), 5), (4, 4))]
    for box, out in bad:
        if lib.resample(src, box, out)[0] != FL_ERR_INVALID:
            failed.append(f"accepted bad box {box} -> {out}")
    report("resample vs Pillow (uint8)", not failed and worst[BILINEAR] <= 1
           and worst[BICUBIC] <= 1 and worst[NEAREST] == 0,
           f"{n} cases: max abs diff bilinear {worst[BILINEAR]}, bicubic {worst[BICUBIC]}, "
           f"nearest {worst[NEAREST]}; float32 vs float64 reference (antialias on and off) "
           f"max {worst_float:.2e}; flip/layout/float16/scale checks"
           + ("; " + "; ".join(failed[:5]) + f" ({len(failed)})" if failed else ""))


def check_half(lib, quick):
    step = 1 << 24
    bad = 0
    total = 0
    starts = range(0, 1 << 32, step) if not quick else range(0, 1 << 32, step * 16)
    t0 = time.time()
    for start in starts:
        bits = np.arange(start, start + step, dtype=np.uint64).astype(np.uint32)
        f = bits.view(np.float32)
        out = np.empty(step, np.uint16)
        lib.c.chk_half_array(f.ctypes.data, step, out.ctypes.data)
        with np.errstate(over="ignore", invalid="ignore"):
            ref = f.astype(np.float16).view(np.uint16)
        nan = np.isnan(f)
        same = (out == ref) | (nan & ((out & 0x7C00) == 0x7C00) & ((out & 0x3FF) != 0)
                               & ((out & 0x8000) == (ref & 0x8000)))
        bad += int((~same).sum())
        total += step
    report("float16 conversion vs numpy", bad == 0,
           f"{total} bit patterns ({'all' if total == 1 << 32 else 'sampled'}), {bad} differ, "
           f"{time.time() - t0:.0f} s")


def set_sof_size(data, w, h):
    """The bytes with every SOFn frame's size replaced."""
    b = bytearray(data)
    i = 2
    while i + 4 < len(b):
        if b[i] != 0xFF:
            i += 1
            continue
        m = b[i + 1]
        if m in (0xD8, 0x01) or 0xD0 <= m <= 0xD7 or m == 0xFF:
            i += 1 if m == 0xFF else 2
            continue
        length = b[i + 2] << 8 | b[i + 3]
        if 0xC0 <= m <= 0xCF and m not in (0xC4, 0xC8, 0xCC):
            b[i + 5:i + 7] = h.to_bytes(2, "big")
            b[i + 7:i + 9] = w.to_bytes(2, "big")
        if m == 0xDA:
            break
        i += 2 + length
    return bytes(b)


def check_corrupt(lib, exe, corpus, quick, outdir):
    failed = []
    samples = [c for c in corpus if any(s in c[0] for s in ("227x229", "63x65", "17x33"))]
    if quick:
        samples = samples[:8]
    # Files with restart intervals of k MCUs: region decodes cut them up.
    samples += [c for c in corpus if c[0].startswith("227x229") and
                any(c[0].endswith(f"_{t}_rst1") for t in ("420", "422", "gray", "cmyk"))]
    paths = []
    for name, data in samples:
        p = outdir / f"{name}.jpg"
        p.write_bytes(data)
        paths.append(str(p))
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    env["ASAN_OPTIONS"] = "detect_leaks=1:abort_on_error=1"
    t0 = time.time()
    run = subprocess.run([str(exe), "fuzz", *paths], capture_output=True, text=True, env=env,
                         timeout=3000)
    totals = np.zeros(6, int)
    for line in run.stdout.splitlines():
        parts = dict(kv.split("=") for kv in line.split(": ", 1)[1].split())
        totals += [int(parts[k]) for k in ("ok", "decode", "too_big", "invalid", "nomem",
                                           "other")]
    ok = run.returncode == 0 and run.stderr == ""
    report(f"corrupt inputs ({exe.name})", ok,
           f"{len(paths)} files, {totals.sum()} decodes: ok {totals[0]}, decode error "
           f"{totals[1]}, too big {totals[2]}, other {totals[3:].sum()}; stderr "
           f"{len(run.stderr)} bytes, {time.time() - t0:.0f} s"
           + (f"; rc={run.returncode} {run.stdout[-300:]} {run.stderr[-600:]}" if not ok else ""))

    # Specific inputs, in process, with fd 2 captured.
    png = io.BytesIO()
    Image.fromarray(photo(8, 8, 1)).save(png, "PNG")
    big = dict(corpus)["227x229_q" + next(n.split("_q")[1].split("_")[0] for n, _ in corpus
                                          if n.startswith("227x229_q")) + "_420"]
    huge = set_sof_size(big, 60000, 60000)
    huge_prog = set_sof_size(dict(corpus)[next(n for n, _ in corpus
                                               if n.startswith("227x229") and
                                               n.endswith("420_prog"))], 60000, 60000)
    cases = [
        ("empty", b"", FL_ERR_DECODE, "empty"),
        ("png", png.getvalue(), FL_ERR_DECODE, "not a JPEG file: starts with 0x89 0x50"),
        ("text", b"hello, world\n" * 10, FL_ERR_DECODE, "not a JPEG file"),
        ("soi only", b"\xff\xd8", FL_ERR_DECODE, "premature end of JPEG data"),
        ("truncated", big[: len(big) * 2 // 3], FL_ERR_DECODE, "premature end of JPEG data"),
        ("header only", big[:200], FL_ERR_DECODE, ""),
        ("60000x60000", huge, FL_ERR_TOO_BIG, "60000 x 60000"),
        ("60000x60000 progressive", huge_prog, FL_ERR_TOO_BIG, "60000 x 60000"),
        ("too many scans", lib.encode(photo(64, 48, 2), 3, 90, 2, 2, 2), FL_ERR_DECODE,
         "more than 500 scans"),
    ]
    lines = []
    with StderrCapture() as cap:
        for name, data, want, text in cases:
            t0 = time.perf_counter()
            rc, _, _, msg = lib.decode(data, cap=1 << 16)
            ms = (time.perf_counter() - t0) * 1e3
            good = rc == want and text in msg and "\n" not in msg and msg
            if name.startswith("60000"):
                good = good and ms < 50
                hrc, hdr, _ = lib.header(data)
                good = good and hrc == FL_OK and hdr[:2] == (60000, 60000)
            lines.append(f"{name}: {rc} '{msg}' {ms:.2f} ms")
            if not good:
                failed.append(lines[-1])
        # A region outside the image and a bad scale.
        for region, d in (((0, 0, 300, 10), 1), ((5, 5, 10, 10), 3), ((-1, 0, 5, 5), 1)):
            rc, _, _, msg = lib.decode(big, region, d)
            if rc != FL_ERR_INVALID or not msg:
                failed.append(f"region {region}/{d}: {rc} {msg}")
        # Random bytes behind a JPEG header.
        rng = np.random.default_rng(7)
        for i in range(200):
            junk = big[:300] + rng.integers(0, 256, int(rng.integers(0, 3000)),
                                            dtype=np.uint8).tobytes()
            rc = lib.decode(junk, cap=1 << 20)[0]
            if rc not in (FL_OK, FL_ERR_DECODE):
                failed.append(f"junk {i}: {rc}")
    if cap.text:
        failed.append("stderr: " + cap.text[:300])
    # fl_jpeg_complete: every corpus file is complete, no truncation is.
    wrong = [name for name, data in corpus if not lib.c.chk_complete(data, len(data))]
    for name, data in samples:
        for n in range(0, len(data) - 1, max(1, len(data) // 50)):
            if lib.c.chk_complete(data[:n], n):
                wrong.append(f"{name}[:{n}]")
    if wrong:
        failed.append("fl_jpeg_complete wrong for " + ", ".join(wrong[:5]))
    lines.append(f"fl_jpeg_complete right for {len(corpus)} files and their truncations")
    report("specific bad inputs", not failed, "; ".join(lines)
           + ("; FAILED: " + " | ".join(failed[:5]) if failed else ""))


def check_pick_scale(lib):
    cases = [((448, 448, 224, 224), 2), ((447, 448, 224, 224), 1), ((1792, 1800, 224, 224), 8),
             ((1791, 1800, 224, 224), 4), ((10, 10, 224, 224), 1), ((500, 375, 224, 224), 1),
             ((1000, 900, 224, 224), 4), ((0, 5, 1, 1), 1)]
    bad = [(a, lib.c.chk_pick_scale(*a), want) for a, want in cases
           if lib.c.chk_pick_scale(*a) != want]
    report("fl_jpeg_pick_scale", not bad, f"{len(cases)} cases" + (f"; {bad}" if bad else ""))


# --quick times each operation once (every path still runs; the times it
# prints are rough), the full run the best of 15 rounds.
TIMING_ROUNDS = 15


def time_pillow(fn, n=20, rounds=None):
    if rounds is None:
        rounds = TIMING_ROUNDS
    if rounds == 1:
        n = 1
    best = 1e9
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t0) / n)
    return best * 1e3


def check_timing(lib, exe, outdir):
    arr = photo(500, 375, 11)
    lines = []
    for tag, data, box in (
            ("500x375 4:2:0 q90, RandomResizedCrop box 306x262 at 73,41",
             pillow_jpeg(arr, quality=90), (73, 41, 306, 262)),
            ("500x375 4:2:0 q90 progressive, same box",
             pillow_jpeg(arr, quality=90, progressive=True), (73, 41, 306, 262)),
            ("1200x900 4:2:0 q90, box 800x600 at 150,120",
             pillow_jpeg(photo(1200, 900, 12), quality=90), (150, 120, 800, 600))):
        p = outdir / "bench.jpg"
        p.write_bytes(data)
        run = subprocess.run([str(exe), "bench", str(p), *map(str, box), "224", "224",
                              str(TIMING_ROUNDS)],
                             capture_output=True, text=True, check=True)
        vals = dict(kv.split("=") for kv in run.stdout.split())
        x, y, w, h = box

        def pil():
            im = Image.open(io.BytesIO(data)).convert("RGB")
            return im.crop((x, y, x + w, y + h)).resize((224, 224), Image.BILINEAR)

        def pil_decode():
            return Image.open(io.BytesIO(data)).convert("RGB")

        pil_ms = time_pillow(pil)
        pil_dec = time_pillow(pil_decode)
        ours = float(vals["region_scaled_decode_ms"]) + float(vals["scaled_resample_ms"])
        lines.append(
            f"{tag}: full decode {vals['full_decode_ms']} ms (Pillow {pil_dec:.3f}), region "
            f"decode {vals['region_decode_ms']} ms, region at 1/{vals['scale']} "
            f"{vals['region_scaled_decode_ms']} ms ({vals['decoded']}), resample to 224x224 "
            f"float CHW normalised {vals['scaled_resample_ms']} ms; decode+resample {ours:.3f} "
            f"ms vs Pillow decode+crop+resize {pil_ms:.3f} ms")
    # Resample alone against Pillow's resize, same uint8 input.
    src = photo(500, 375, 13)
    im = Image.fromarray(src)
    for filt, fname in ((BILINEAR, "bilinear"), (BICUBIC, "bicubic")):
        for dtype, dname in ((U8, "uint8 HWC"), (F32, "float32 CHW")):
            layout = HWC if dtype == U8 else CHW
            ours = time_pillow(lambda: lib.resample(src, (0, 0, 500, 375), (224, 224), filt,
                                                    layout=layout, dtype=dtype), n=50)
            pil = time_pillow(lambda: im.resize((224, 224), PIL_FILTER[filt]), n=50)
            lines.append(f"resample 500x375->224x224 {fname} -> {dname}: {ours:.3f} ms vs "
                         f"Pillow resize {pil:.3f} ms ({pil / ours:.1f}x)")
    report("timing", True, "\n    " + "\n    ".join(lines))


def check_dct_methods(outdir):
    """ISLOW (the default) against IFAST: speed and error vs Pillow."""
    (outdir / "ifast").mkdir(exist_ok=True)
    lib_fast, exe_fast = build(outdir / "ifast", False, ["-DFL_JPEG_DCT_METHOD=JDCT_IFAST"])
    lib_fast = Lib(lib_fast)
    arr = photo(500, 375, 11)
    data = pillow_jpeg(arr, quality=90)
    ref = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    p = outdir / "bench.jpg"
    p.write_bytes(data)
    out = {}
    for tag, exe, lib in (("ISLOW", outdir / "jpeg_check", None), ("IFAST", exe_fast, lib_fast)):
        run = subprocess.run([str(exe), "bench", str(p), "0", "0", "500", "375", "224", "224",
                              str(TIMING_ROUNDS)],
                             capture_output=True, text=True, check=True)
        vals = dict(kv.split("=") for kv in run.stdout.split())
        out[tag] = vals["full_decode_ms"]
        if lib is not None:
            px = lib.decode(data)[1]
            out[tag + "_psnr"] = psnr(px, ref)
            out[tag + "_max"] = int(np.abs(px.astype(int) - ref.astype(int)).max())
    report("DCT method", True, f"500x375 q90 full decode: ISLOW {out['ISLOW']} ms, IFAST "
           f"{out['IFAST']} ms; IFAST vs Pillow (ISLOW): PSNR {out['IFAST_psnr']:.1f} dB, max "
           f"abs diff {out['IFAST_max']}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--asan", action="store_true", help="build and run under ASan+UBSan")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--skip-half", action="store_true")
    args = ap.parse_args()
    global TIMING_ROUNDS
    if args.quick:
        TIMING_ROUNDS = 1

    if args.asan and "libasan" not in os.environ.get("LD_PRELOAD", ""):
        libs = [subprocess.run([CC, f"-print-file-name={n}"], capture_output=True, text=True)
                .stdout.strip() for n in ("libasan.so", "libubsan.so")]
        env = dict(os.environ, LD_PRELOAD=" ".join(libs), PYTHONMALLOC="malloc",
                   ASAN_OPTIONS="detect_leaks=0:abort_on_error=1")
        os.execve(sys.executable, [sys.executable, *sys.argv], env)

    with tempfile.TemporaryDirectory() as tmp:
        outdir = pathlib.Path(tmp)
        lib_path, exe = build(outdir, args.asan)
        lib = Lib(lib_path)
        t0 = time.time()
        corpus = make_corpus(lib, args.quick)
        print(f"corpus: {len(corpus)} JPEGs ({time.time() - t0:.0f} s)", flush=True)
        with StderrCapture() as cap:
            check_full(lib, corpus)
            check_region(lib, corpus, args.quick)
            check_add_restarts(lib, corpus, args.quick)
            check_pipeline(lib, corpus, args.quick)
            check_resample(lib, args.quick)
            check_pick_scale(lib)
        report("nothing on stderr", cap.text == "", repr(cap.text[:300]))
        if not args.skip_half:
            check_half(lib, args.quick or args.asan)
        check_corrupt(lib, exe, corpus, args.quick, outdir)
        if not args.asan:
            check_timing(lib, exe, outdir)
            check_dct_methods(outdir)
    print("FAILED: " + ", ".join(FAILURES) if FAILURES else "all checks passed")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
