/* Checks of the JPEG region decoder and the resampler (csrc/core/image/jpeg.c,
 * csrc/core/image/resample.c) without Python.h.
 *
 * Built as a shared library, its chk_* functions are driven through ctypes
 * by tests/c/jpeg_check.py, which compares the results with Pillow.  Built
 * with -DFL_CHECK_MAIN it is also a command-line tool:
 *
 *   jpeg_check fuzz [-n N] FILE...
 *                             mutate each JPEG (up to 400 truncations, 3N bit
 *                             flip sets and N overwritten runs; N = 100) and
 *                             decode the results whole and by region at each
 *                             scale, resampling what decodes; must not crash
 *                             or print, under ASan/UBSan included.  Prints
 *                             one summary line per file on stdout.
 *   jpeg_check bench FILE X Y W H OUT_W OUT_H [ROUNDS]
 *                             times a full decode, a region decode at the
 *                             scale fl_jpeg_pick_scale picks, and the
 *                             resample of that region to OUT_W x OUT_H:
 *                             the best of ROUNDS rounds (default 15).
 */
#define _POSIX_C_SOURCE 200809L
#include "core/image/jpeg.h"
#include "core/image/jpeg_restart.h"
#include "core/image/jpeg_transcode.h"
#include "core/image/resample.h"
#include "core/status.h"

#include <math.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jpeglib.h>

#if defined(__GNUC__)
#define CHK_EXPORT __attribute__((visibility("default")))
#else
#define CHK_EXPORT
#endif

/* One decoder and one scratch for the whole process, as one worker would
 * hold them: reuse across images of every size is part of what is tested. */
static fl_jpeg *decoder(void)
{
    static fl_jpeg *dec;
    if (!dec)
        fl_jpeg_new(&dec, NULL, 0); /* leaves it NULL on failure */
    return dec;
}

static fl_resample_scratch *scratch(void)
{
    static fl_resample_scratch *s;
    if (!s)
        s = fl_resample_scratch_new();
    return s;
}

CHK_EXPORT int chk_header(const unsigned char *data, size_t size, int *out4, char *msg,
                          size_t msg_size)
{
    fl_jpeg_header h;
    int rc = fl_jpeg_read_header(decoder(), data, size, &h, msg, msg_size);
    if (rc == FL_OK) {
        out4[0] = h.width;
        out4[1] = h.height;
        out4[2] = h.components;
        out4[3] = h.progressive;
    }
    return rc;
}

/* Decodes (the whole image when has_region is 0) and copies the pixels,
 * row by row, into dst (dst_cap bytes, rows packed).  dims gets the
 * buffer's width and height, box its box_x, box_y, box_w, box_h. */
CHK_EXPORT int chk_decode(const unsigned char *data, size_t size, int has_region, int x, int y,
                          int w, int h, int d, unsigned long long max_pixels,
                          unsigned char *dst, size_t dst_cap, int *dims, double *box,
                          char *msg, size_t msg_size)
{
    fl_jpeg_region region = {x, y, w, h, d};
    fl_pixels px;
    int rc = fl_jpeg_decode(decoder(), data, size, has_region ? &region : NULL, max_pixels,
                            &px, msg, msg_size);
    if (rc != FL_OK)
        return rc;
    dims[0] = px.width;
    dims[1] = px.height;
    box[0] = px.box_x;
    box[1] = px.box_y;
    box[2] = px.box_w;
    box[3] = px.box_h;
    size_t row = (size_t)px.width * 3;
    if (dst) {
        if (row * (size_t)px.height > dst_cap)
            return FL_ERR_FULL;
        for (int r = 0; r < px.height; r++)
            memcpy(dst + r * row, px.data + (size_t)r * px.stride, row);
    }
    return FL_OK;
}

CHK_EXPORT int chk_resample(const unsigned char *src, int src_w, int src_h, size_t stride,
                            double bx, double by, double bw, double bh, int out_w, int out_h,
                            int filter, int antialias, int flip, int layout, int dtype,
                            const float *scale, const float *offset, void *dst)
{
    fl_resample_target t = {out_w, out_h, filter, antialias, flip, layout, dtype,
                            {scale[0], scale[1], scale[2]},
                            {offset[0], offset[1], offset[2]}, dst};
    return fl_resample(src, src_w, src_h, stride, bx, by, bw, bh, &t, scratch());
}

/* Region decode followed by a crop-then-resize: the resampler only sees the
 * pixels the box touches.  d = 0 picks the scale with fl_jpeg_pick_scale.
 * used_d gets the scale used. */
CHK_EXPORT int chk_pipeline(const unsigned char *data, size_t size, int x, int y, int w, int h,
                            int d, int out_w, int out_h, int filter, int flip, int layout,
                            int dtype, const float *scale, const float *offset, void *dst,
                            int *used_d, char *msg, size_t msg_size)
{
    if (d == 0)
        d = fl_jpeg_pick_scale(w, h, out_w, out_h);
    *used_d = d;
    fl_jpeg_region region = {x, y, w, h, d};
    fl_pixels px;
    int rc = fl_jpeg_decode(decoder(), data, size, &region, 178956970u, &px, msg, msg_size);
    if (rc != FL_OK)
        return rc;
    int x0 = (int)floor(px.box_x), y0 = (int)floor(px.box_y);
    int x1 = (int)ceil(px.box_x + px.box_w), y1 = (int)ceil(px.box_y + px.box_h);
    if (x1 > px.width)
        x1 = px.width;
    if (y1 > px.height)
        y1 = px.height;
    fl_resample_target t = {out_w, out_h, filter, 1, flip, layout, dtype,
                            {scale[0], scale[1], scale[2]},
                            {offset[0], offset[1], offset[2]}, dst};
    return fl_resample(px.data + (size_t)y0 * px.stride + (size_t)x0 * 3, x1 - x0, y1 - y0,
                       px.stride, px.box_x - x0, px.box_y - y0, px.box_w, px.box_h, &t,
                       scratch());
}

/* 1 when a region decode of the box would decode the restart intervals
 * that cover it (jpeg_restart.h) rather than the file, else 0 or a status. */
CHK_EXPORT int chk_restart_cut(const unsigned char *data, size_t size, int x, int y, int w,
                               int h, int margin)
{
    static fl_jpeg_restart st;
    fl_jpeg_cut cut;
    return fl_jpeg_restart_cut(&st, data, size, x, y, w, h, margin, &cut);
}

/* fl_jpeg_add_restarts into out[0 .. cap): the size, or 0 when it does not
 * fit; a status below 0, its message in msg. */
CHK_EXPORT long long chk_add_restarts(const unsigned char *data, size_t size, int max_interval,
                                      int optimize, unsigned char *out, size_t cap,
                                      int *interval, char *msg, size_t msg_size)
{
    unsigned char *buf = NULL;
    size_t n = 0;
    int rc = fl_jpeg_add_restarts(data, size, max_interval, optimize, 178956970u, &buf, &n,
                                  interval, msg, msg_size);
    if (rc != FL_OK)
        return rc;
    long long result = n <= cap ? (long long)n : 0;
    if (result)
        memcpy(out, buf, n);
    free(buf);
    return result;
}

CHK_EXPORT int chk_complete(const unsigned char *data, size_t size)
{
    return fl_jpeg_complete(data, size);
}

CHK_EXPORT void chk_half_array(const float *in, size_t n, uint16_t *out)
{
    for (size_t i = 0; i < n; i++)
        out[i] = fl_float_to_half(in[i]);
}

CHK_EXPORT int chk_pick_scale(int cw, int ch, int ow, int oh)
{
    return fl_jpeg_pick_scale(cw, ch, ow, oh);
}

CHK_EXPORT const char *chk_status_str(int status)
{
    return fl_status_str(status);
}

/* An encoder for what Pillow cannot write: sampling factors such as 4:4:0,
 * 4:1:1 or 2x2 luma with 1x1 chroma, restart intervals, YCCK, and
 * progressive files with hundreds of scans.  `pixels` has `components`
 * samples a pixel: 1 (gray), 3 (RGB) or 4 (CMYK, stored as given; with
 * ycck nonzero, transformed to YCCK).  h0, v0 are the first component's
 * sampling factors, the others get 1x1.  progressive: 0 sequential, 1
 * libjpeg's standard progression, 2 a script of every AC coefficient band
 * alone refined bit by bit (947 scans for three components); plus 4 for
 * arithmetic coding.  Returns the JPEG's size, or 0 on error or if it does
 * not fit in cap. */
typedef struct enc_err {
    struct jpeg_error_mgr pub;
    jmp_buf escape;
} enc_err;

static void enc_error(j_common_ptr cinfo)
{
    longjmp(((enc_err *)cinfo->err)->escape, 1);
}

static void enc_quiet(j_common_ptr cinfo, int level)
{
    (void)cinfo;
    (void)level;
}

#define MANY_SCANS (2 + 3 * 63 * 5)

static void many_scans(jpeg_scan_info *scans, int ncomp, int *count)
{
    int n = 0;
    for (int pass = 0; pass < 2; pass++) { /* DC: first, then its last bit */
        scans[n].comps_in_scan = ncomp;
        for (int c = 0; c < ncomp; c++)
            scans[n].component_index[c] = c;
        scans[n].Ss = 0, scans[n].Se = 0;
        scans[n].Ah = pass, scans[n].Al = 1 - pass;
        n++;
    }
    for (int c = 0; c < ncomp; c++)
        for (int k = 1; k < 64; k++)
            for (int al = 4; al >= 0; al--) {
                scans[n].comps_in_scan = 1;
                scans[n].component_index[0] = c;
                scans[n].Ss = k, scans[n].Se = k;
                scans[n].Ah = al == 4 ? 0 : al + 1, scans[n].Al = al;
                n++;
            }
    *count = n;
}

static size_t encode(const unsigned char *pixels, int w, int h, int components, int ycck,
                     int quality, int h0, int v0, int progressive, int restart_rows,
                     unsigned char *out, size_t cap)
{
    struct jpeg_compress_struct c;
    enc_err err;
    unsigned char *mem = NULL;
    unsigned long mem_size = 0;
    /* Allocated before setjmp so the jump cannot lose it. */
    jpeg_scan_info *scans = malloc(sizeof(jpeg_scan_info) * MANY_SCANS);
    if (!scans)
        return 0;
    c.err = jpeg_std_error(&err.pub);
    err.pub.error_exit = enc_error;
    err.pub.emit_message = enc_quiet;
    if (setjmp(err.escape)) {
        jpeg_destroy_compress(&c);
        free(mem);
        free(scans);
        return 0;
    }
    jpeg_create_compress(&c);
    jpeg_mem_dest(&c, &mem, &mem_size);
    c.image_width = (JDIMENSION)w;
    c.image_height = (JDIMENSION)h;
    c.input_components = components;
    c.in_color_space = components == 1 ? JCS_GRAYSCALE : components == 3 ? JCS_RGB : JCS_CMYK;
    jpeg_set_defaults(&c);
    if (components == 4 && ycck)
        jpeg_set_colorspace(&c, JCS_YCCK);
    jpeg_set_quality(&c, quality, TRUE);
    c.comp_info[0].h_samp_factor = h0;
    c.comp_info[0].v_samp_factor = v0;
    c.arith_code = (progressive & 4) ? TRUE : FALSE;
    if ((progressive & 3) == 1) {
        jpeg_simple_progression(&c);
    } else if ((progressive & 3) == 2) {
        int count;
        many_scans(scans, c.num_components, &count);
        c.scan_info = scans;
        c.num_scans = count;
    }
    if (restart_rows < 0)
        c.restart_interval = (unsigned int)-restart_rows; /* -k: every k MCUs */
    else
        c.restart_in_rows = restart_rows;
    jpeg_start_compress(&c, TRUE);
    while (c.next_scanline < c.image_height) {
        JSAMPROW row = (JSAMPROW)(pixels + (size_t)c.next_scanline * w * components);
        jpeg_write_scanlines(&c, &row, 1);
    }
    jpeg_finish_compress(&c);
    jpeg_destroy_compress(&c);
    free(scans);
    size_t n = mem_size <= cap ? (size_t)mem_size : 0;
    if (n)
        memcpy(out, mem, n);
    free(mem);
    return n;
}

CHK_EXPORT size_t chk_encode(const unsigned char *pixels, int w, int h, int components,
                             int ycck, int quality, int h0, int v0, int progressive,
                             int restart_rows, unsigned char *out, size_t cap)
{
    return encode(pixels, w, h, components, ycck, quality, h0, v0, progressive, restart_rows,
                  out, cap);
}

#ifdef FL_CHECK_MAIN

static unsigned char *read_file(const char *path, size_t *size)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *buf = malloc(n > 0 ? (size_t)n : 1);
    if (buf && n > 0 && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    *size = n > 0 ? (size_t)n : 0;
    return buf;
}

static uint64_t rng_state = 0x9e3779b97f4a7c15u;

static uint64_t rng(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

typedef struct counts {
    long ok, decode, too_big, invalid, nomem, other;
} counts;

static void tally(counts *c, int rc)
{
    switch (rc) {
    case FL_OK: c->ok++; break;
    case FL_ERR_DECODE: c->decode++; break;
    case FL_ERR_TOO_BIG: c->too_big++; break;
    case FL_ERR_INVALID: c->invalid++; break;
    case FL_ERR_NOMEM: c->nomem++; break;
    default: c->other++; break;
    }
}

/* Decodes `data` whole and by a region at each scale, and resamples what
 * decodes; returns the whole-image status. */
static int try_all(const unsigned char *data, size_t size, counts *c, int *bad_msg)
{
    char msg[200];
    fl_pixels px;
    fl_jpeg *dec = decoder();
    int first = fl_jpeg_decode(dec, data, size, NULL, 1u << 24, &px, msg, sizeof msg);
    tally(c, first);
    if ((first == FL_OK) != (msg[0] == '\0') || strchr(msg, '\n'))
        (*bad_msg)++;
    /* The lossless rewrite reads the same bytes; it may refuse them, never
     * crash or leak. */
    unsigned char *rewritten = NULL;
    size_t rewritten_size = 0;
    int rw = fl_jpeg_add_restarts(data, size, 0, (int)(size & 1), 1u << 24, &rewritten,
                                  &rewritten_size, NULL, msg, sizeof msg);
    if ((rw == FL_OK) != (rewritten != NULL) || (rw == FL_OK) != (msg[0] == '\0'))
        (*bad_msg)++;
    free(rewritten);
    fl_jpeg_header hdr;
    if (fl_jpeg_read_header(dec, data, size, &hdr, msg, sizeof msg) != FL_OK ||
        hdr.width < 4 || hdr.height < 4 || (uint64_t)hdr.width * hdr.height > (1u << 24))
        return first;
    static unsigned char out[3 * 32 * 32];
    const float one[3] = {1, 1, 1}, zero[3] = {0, 0, 0};
    for (int d = 1; d <= 8; d *= 2) {
        fl_jpeg_region r = {hdr.width / 4, hdr.height / 3, hdr.width / 2, hdr.height / 2, d};
        int rc = fl_jpeg_decode(dec, data, size, &r, 1u << 24, &px, msg, sizeof msg);
        tally(c, rc);
        if (rc == FL_OK) {
            fl_resample_target t = {32, 32, FL_FILTER_BILINEAR, 1, 1, FL_LAYOUT_HWC,
                                    FL_DTYPE_UINT8, {one[0], one[1], one[2]},
                                    {zero[0], zero[1], zero[2]}, out};
            int rr = fl_resample(px.data, px.width, px.height, px.stride, px.box_x, px.box_y,
                                 px.box_w, px.box_h, &t, scratch());
            if (rr != FL_OK)
                c->other++;
        }
    }
    return first;
}

static int fuzz_file(const char *path, int rounds)
{
    size_t size;
    unsigned char *orig = read_file(path, &size);
    if (!orig) {
        printf("%s: cannot read\n", path);
        return 1;
    }
    unsigned char *buf = malloc(size + 16);
    counts c = {0};
    int bad_msg = 0;

    /* Every truncation for small files, about 400 evenly spaced for big. */
    size_t step = size / 400 + 1;
    for (size_t n = 0; n < size; n += step) {
        /* A fresh allocation of exactly n bytes, so ASan sees overreads. */
        unsigned char *cut = malloc(n ? n : 1);
        memcpy(cut, orig, n);
        try_all(cut, n, &c, &bad_msg);
        free(cut);
    }
    /* Bit flips: 1 to 8 random bits each time. */
    for (int i = 0; i < 3 * rounds; i++) {
        memcpy(buf, orig, size);
        int flips = 1 + (int)(rng() % 8);
        for (int k = 0; k < flips; k++) {
            size_t at = (size_t)(rng() % size);
            buf[at] ^= (unsigned char)(1u << (rng() % 8));
        }
        try_all(buf, size, &c, &bad_msg);
    }
    /* Runs of random bytes written over the data. */
    for (int i = 0; i < rounds; i++) {
        memcpy(buf, orig, size);
        size_t at = (size_t)(rng() % size), len = 1 + (size_t)(rng() % 64);
        for (size_t k = at; k < size && k < at + len; k++)
            buf[k] = (unsigned char)rng();
        try_all(buf, size, &c, &bad_msg);
    }
    printf("%s: ok=%ld decode=%ld too_big=%ld invalid=%ld nomem=%ld other=%ld bad_msg=%d\n",
           path, c.ok, c.decode, c.too_big, c.invalid, c.nomem, c.other, bad_msg);
    free(buf);
    free(orig);
    return c.other || c.nomem || c.invalid || bad_msg ? 1 : 0;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

typedef struct bench_ctx {
    const unsigned char *data;
    size_t size;
    const fl_jpeg_region *region; /* NULL: whole image */
    fl_pixels px;                 /* the last decode */
    double box[4];                /* what the resample reads */
    const fl_resample_target *target;
    int failed;
} bench_ctx;

static void run_decode(bench_ctx *b)
{
    char msg[200];
    if (fl_jpeg_decode(decoder(), b->data, b->size, b->region, UINT64_MAX, &b->px, msg,
                       sizeof msg) != FL_OK)
        b->failed = 1;
}

static void run_resample(bench_ctx *b)
{
    if (fl_resample(b->px.data, b->px.width, b->px.height, b->px.stride, b->box[0], b->box[1],
                    b->box[2], b->box[3], b->target, scratch()) != FL_OK)
        b->failed = 1;
}

/* Best of 15 rounds of the mean of n calls, in milliseconds. */
static int bench_rounds = 15; /* the best of this many timed rounds */

static double time_ms(void (*op)(bench_ctx *), bench_ctx *b, int n)
{
    double best = 1e30;
    for (int round = 0; round < bench_rounds; round++) {
        double t0 = now();
        for (int i = 0; i < n; i++)
            op(b);
        double el = (now() - t0) / n;
        if (el < best)
            best = el;
    }
    return best * 1e3;
}

static int bench(int argc, char **argv)
{
    if (argc < 9)
        return 2;
    if (argc >= 10)
        bench_rounds = atoi(argv[9]) > 0 ? atoi(argv[9]) : 1;
    bench_ctx b = {0};
    unsigned char *data = read_file(argv[2], &b.size);
    if (!data)
        return 1;
    b.data = data;
    int x = atoi(argv[3]), y = atoi(argv[4]), w = atoi(argv[5]), h = atoi(argv[6]);
    int ow = atoi(argv[7]), oh = atoi(argv[8]);
    int d = fl_jpeg_pick_scale(w, h, ow, oh);
    fl_jpeg_region r1 = {x, y, w, h, 1}, rd = {x, y, w, h, d};
    float *dst = malloc(sizeof(float) * 3 * (size_t)ow * oh);
    /* ImageNet mean and standard deviation, as a training pipeline would. */
    fl_resample_target t = {ow, oh, FL_FILTER_BILINEAR, 1, 0, FL_LAYOUT_CHW, FL_DTYPE_FLOAT32,
                            {1 / 58.395f, 1 / 57.12f, 1 / 57.375f},
                            {-123.675f / 58.395f, -116.28f / 57.12f, -103.53f / 57.375f}, dst};
    b.target = &t;

    b.region = NULL;
    double full = time_ms(run_decode, &b, 20);
    b.box[0] = x, b.box[1] = y, b.box[2] = w, b.box[3] = h;
    double full_rs = time_ms(run_resample, &b, 20);
    b.region = &r1;
    double reg1 = time_ms(run_decode, &b, 20);
    b.region = &rd;
    double regd = time_ms(run_decode, &b, 20);
    b.box[0] = b.px.box_x, b.box[1] = b.px.box_y, b.box[2] = b.px.box_w, b.box[3] = b.px.box_h;
    double rs = time_ms(run_resample, &b, 50);
    printf("full_decode_ms=%.3f full_resample_ms=%.3f region_decode_ms=%.3f "
           "region_scaled_decode_ms=%.3f scale=%d scaled_resample_ms=%.3f decoded=%dx%d\n",
           full, full_rs, reg1, regd, d, rs, b.px.width, b.px.height);
    free(dst);
    free(data);
    return b.failed;
}

int main(int argc, char **argv)
{
    if (argc >= 3 && strcmp(argv[1], "fuzz") == 0) {
        int rc = 0, first = 2, rounds = 100;
        if (argc >= 5 && strcmp(argv[2], "-n") == 0) {
            rounds = atoi(argv[3]);
            first = 4;
        }
        for (int i = first; i < argc; i++)
            rc |= fuzz_file(argv[i], rounds);
        fl_jpeg_free(decoder());
        fl_resample_scratch_free(scratch());
        return rc;
    }
    if (argc >= 2 && strcmp(argv[1], "bench") == 0)
        return bench(argc, argv);
    fprintf(stderr, "usage: jpeg_check fuzz [-n N] FILE... | bench FILE X Y W H OUT_W OUT_H [ROUNDS]\n");
    return 2;
}

#endif /* FL_CHECK_MAIN */
