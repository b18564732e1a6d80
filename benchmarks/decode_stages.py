"""Where the JPEG region decode of the training pipeline spends its time.

    python benchmarks/decode_stages.py                      # 400 generated photos
    python benchmarks/decode_stages.py --libjpeg /tmp/ljt/inst --libjpeg system

The regions are the training pipeline's own (RandomResizedCrop(224), the
boxes and DCT scales ``ImageFolder(..., decode="fast")`` decides for two
epochs of the generated ImageNet-like photos, benchmarks/imagenet_like.py).
A small C harness, compiled here against each libjpeg-turbo named by
``--libjpeg`` (an install prefix with include/ and lib/, or "system"),
decodes every region the way csrc/core/image/jpeg.c does (crop_scanline with
the two-pixel margin, rows skipped above the box, stop after its last row)
and with one knob changed at a time:

  full         what fastload does (RGB, fancy upsampling, ISLOW IDCT)
  ycc          no colour conversion (YCbCr out)
  nofancy      plain (replicated or merged) chroma upsampling
  ifast        the fast integer IDCT (informative: fastload keeps ISLOW)
  entropy      Huffman decoding only: jpeg_skip_scanlines to the box's last
               row (single-scan files: no IDCT; progressive files decode all
               scans in jpeg_start_decompress, as a region decode must)
  m8           the smallest M/8 scale (M = 1..8) whose box still covers
               224 x 224, instead of 1/1, 1/2, 1/4, 1/8

Every image runs every mode in turn, several rounds; each cost is the sum
over images of the per-image minimum (robust on a busy machine), divided
by the image count.  With several ``--libjpeg`` the harnesses alternate
round by round.  Prints Markdown on stdout.
"""

import argparse
import math
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
import fastload  # noqa: E402
import imagenet_like  # noqa: E402
from fastload import transforms as T  # noqa: E402

MODES = ["full", "ycc", "nofancy", "ifast", "entropy", "m8"]

HARNESS = r"""
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <jpeglib.h>

typedef struct { unsigned char *data; size_t size; int x, y, w, h, d; } item;
enum { FULL, YCC, NOFANCY, IFAST, ENTROPY, M8, NMODES };
static unsigned char *pix;

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static int ceil_div(long a, long b) { return (int)((a + b - 1) / b); }

static void run(struct jpeg_decompress_struct *ci, const item *it, int mode, int out)
{
    jpeg_mem_src(ci, it->data, (unsigned long)it->size);
    jpeg_read_header(ci, TRUE);
    int gray = ci->num_components == 1;
    ci->out_color_space = gray ? JCS_GRAYSCALE : mode == YCC ? JCS_YCbCr : JCS_RGB;
    ci->dct_method = mode == IFAST ? JDCT_IFAST : JDCT_ISLOW;
    ci->do_fancy_upsampling = mode != NOFANCY;
    int m = 8 / it->d;
    if (mode == M8 && it->d == 1)
        while (m > 1 && (long)it->w * (m - 1) >= 8L * out && (long)it->h * (m - 1) >= 8L * out)
            m--;
    ci->scale_num = (unsigned)m;
    ci->scale_denom = 8;
    jpeg_start_decompress(ci);
    int ow = (int)ci->output_width, oh = (int)ci->output_height;
    int sy0 = (int)((long)it->y * m / 8), sy1 = ceil_div((long)(it->y + it->h) * m, 8);
    int sx0 = (int)((long)it->x * m / 8), sx1 = ceil_div((long)(it->x + it->w) * m, 8);
    if (sy1 > oh) sy1 = oh;
    if (sx1 > ow) sx1 = ow;
    JDIMENSION xoff = (JDIMENSION)(sx0 > 2 ? sx0 - 2 : 0);
    JDIMENSION xend = (JDIMENSION)(sx1 + 2 < ow ? sx1 + 2 : ow), cw = xend - xoff;
    jpeg_crop_scanline(ci, &xoff, &cw);
    if (mode == ENTROPY) {
        jpeg_skip_scanlines(ci, (JDIMENSION)sy1);
        jpeg_abort_decompress(ci);
        return;
    }
    if (sy0 > 0)
        jpeg_skip_scanlines(ci, (JDIMENSION)sy0);
    size_t stride = (size_t)cw * (size_t)ci->output_components;
    while ((int)ci->output_scanline < sy1) {
        JSAMPROW rows[16];
        JDIMENSION want = (JDIMENSION)sy1 - ci->output_scanline;
        if (want > 16) want = 16;
        for (JDIMENSION k = 0; k < want; k++)
            rows[k] = pix + (ci->output_scanline - (JDIMENSION)sy0 + k) * stride;
        if (jpeg_read_scanlines(ci, rows, want) == 0)
            break;
    }
    jpeg_abort_decompress(ci);
}

int main(int argc, char **argv)
{
    if (argc != 4) return 2;
    int rounds = atoi(argv[2]), out = atoi(argv[3]);
    FILE *f = fopen(argv[1], "r");
    if (!f) return 2;
    item *items = NULL;
    int n = 0, cap = 0, x, y, w, h, d;
    char path[4096];
    while (fscanf(f, "%4095s %d %d %d %d %d", path, &x, &y, &w, &h, &d) == 6) {
        if (n == cap) {
            cap = cap ? 2 * cap : 256;
            if (!(items = realloc(items, (size_t)cap * sizeof *items)))
                return 3;
        }
        FILE *g = fopen(path, "rb");
        if (!g) return 2;
        fseek(g, 0, SEEK_END);
        long size = ftell(g);
        fseek(g, 0, SEEK_SET);
        items[n] = (item){malloc((size_t)size), (size_t)size, x, y, w, h, d};
        if (!items[n].data || fread(items[n].data, 1, (size_t)size, g) != (size_t)size) return 3;
        fclose(g);
        n++;
    }
    fclose(f);
    pix = malloc((size_t)64 << 20);
    double *best = malloc(sizeof(double) * NMODES * (size_t)n);
    if (!pix || !best) return 3;
    for (int k = 0; k < NMODES * n; k++) best[k] = 1e30;
    struct jpeg_decompress_struct ci;
    struct jpeg_error_mgr jerr;
    ci.err = jpeg_std_error(&jerr);
    jpeg_create_decompress(&ci);
    for (int r = 0; r < rounds; r++)
        for (int i = 0; i < n; i++)
            for (int m = 0; m < NMODES; m++) {
                double t0 = now();
                run(&ci, &items[i], m, out);
                double dt = now() - t0;
                if (dt < best[m * n + i]) best[m * n + i] = dt;
            }
    printf("%d", LIBJPEG_TURBO_VERSION_NUMBER);
    for (int m = 0; m < NMODES; m++) {
        double s = 0;
        for (int i = 0; i < n; i++) s += best[m * n + i];
        printf(" %.6f", s / n * 1e3);
    }
    printf("\n");
    jpeg_destroy_decompress(&ci);
    for (int i = 0; i < n; i++) free(items[i].data);
    free(items);
    free(best);
    free(pix);
    return 0;
}
"""


def regions(root, out, epochs=2):
    ds = fastload.ImageFolder(root, transform=T.Compose(
        [T.RandomResizedCrop(out), T.RandomHorizontalFlip(), T.ToTensor()]), decode="fast")
    lines, scales = [], {}
    for epoch in range(epochs):
        for i in range(len(ds)):
            g = ds._source.geometry(i, 1234, epoch)
            x, y, w, h = g["box"]
            x0, y0 = math.floor(x), math.floor(y)
            x1, y1 = math.ceil(x + w), math.ceil(y + h)
            d = g["scale_denom"]
            scales[d] = scales.get(d, 0) + 1
            lines.append(f"{ds.samples[i][0]} {x0} {y0} {x1 - x0} {y1 - y0} {d}\n")
    return lines, scales


def build(prefix, workdir):
    src = workdir / "decode_stages.c"
    src.write_text(HARNESS)
    tag = "system" if prefix == "system" else pathlib.Path(prefix).name
    exe = workdir / f"decode_stages_{len(list(workdir.iterdir()))}_{tag}"
    cmd = [os.environ.get("CC", "gcc"), "-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", str(src),
           "-o", str(exe)]
    env = dict(os.environ)
    if prefix != "system":
        libdir = next(p for p in (pathlib.Path(prefix) / "lib", pathlib.Path(prefix) / "lib64")
                      if (p / "libjpeg.so").exists())
        cmd[1:1] = ["-I", str(pathlib.Path(prefix) / "include")]
        cmd += ["-L", str(libdir), f"-Wl,-rpath,{libdir}"]
        env["LD_LIBRARY_PATH"] = str(libdir)
    subprocess.run(cmd + ["-ljpeg"], check=True)
    return exe, env


def version(number):
    return f"{number // 1000000}.{number // 1000 % 1000}.{number % 1000}"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default=os.environ.get("FASTLOAD_BENCH_DATA",
                                                         os.path.join(tempfile.gettempdir(),
                                                                      "fastload_decode_stages")))
    parser.add_argument("--images", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=2, help="alternations of the libraries")
    parser.add_argument("--libjpeg", action="append",
                        help="install prefix of a libjpeg-turbo, or 'system' (default)")
    args = parser.parse_args(argv)
    libs = args.libjpeg or ["system"]
    imagenet_like.make_image_folder(args.data, n_images=args.images)
    out = 224
    lines, scales = regions(args.data, out)
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="decode_stages_"))
    try:
        listing = workdir / "regions.txt"
        listing.write_text("".join(lines))
        harnesses = [build(prefix, workdir) for prefix in libs]
        results = {}
        for _ in range(args.repeats):
            for (exe, env), prefix in zip(harnesses, libs):
                got = subprocess.run([str(exe), str(listing), str(args.rounds), str(out)],
                                     env=env, check=True, capture_output=True, text=True).stdout
                number, *ms = got.split()
                key = (prefix, version(int(number)))
                prev = results.get(key)
                ms = [float(v) for v in ms]
                results[key] = ms if prev is None else [min(a, b) for a, b in zip(prev, ms)]
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    print(f"{len(lines)} regions (RandomResizedCrop({out}), 2 epochs of {args.images} photos); "
          f"DCT scale 1/d: {dict(sorted(scales.items()))}; ms per image, "
          f"sum of per-image minima over {args.rounds} rounds x {args.repeats}\n")
    print("| libjpeg-turbo | " + " | ".join(MODES) + " |")
    print("|---|" + "---:|" * len(MODES))
    for (prefix, ver), ms in results.items():
        print(f"| {ver} ({prefix}) | " + " | ".join(f"{v:.3f}" for v in ms) + " |")
    print()
    print("| libjpeg-turbo | entropy | IDCT + upsampling + colour + copy | of which colour "
          "(full - ycc) | fancy upsampling (full - nofancy) |")
    print("|---|---:|---:|---:|---:|")
    for (prefix, ver), ms in results.items():
        m = dict(zip(MODES, ms))
        print(f"| {ver} | {m['entropy']:.3f} ({100 * m['entropy'] / m['full']:.0f} %) | "
              f"{m['full'] - m['entropy']:.3f} | {m['full'] - m['ycc']:+.3f} | "
              f"{m['full'] - m['nofancy']:+.3f} |")


if __name__ == "__main__":
    main()
