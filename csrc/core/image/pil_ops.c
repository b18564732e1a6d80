/* fastload core: see pil_ops.h.
 *
 * Expressions are written in the order and types Pillow evaluates them
 * (float where it uses float, truncating casts where it truncates), since
 * the aim is bit-identical output. */
#define _GNU_SOURCE
#include "core/image/pil_ops.h"

#include "core/image/simd.h"
#include "core/status.h"

#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *const fl_pil_op_names[FL_PIL_OPS] = {
    "Identity",   "ShearX", "ShearY",    "TranslateX", "TranslateY",
    "Rotate",     "Brightness", "Color", "Contrast",   "Sharpness",
    "Posterize",  "Solarize",   "AutoContrast", "Equalize", "Invert",
};

/* Python's math.radians and math.degrees. */
static double radians(double degrees)
{
    return degrees * (M_PI / 180.0);
}

static double degrees(double radians)
{
    return radians * (180.0 / M_PI);
}

/* Python's float % (the result takes the divisor's sign). */
static double py_mod(double x, double m)
{
    double r = fmod(x, m);
    if (r != 0.0) {
        if ((m < 0) != (r < 0))
            r += m;
    } else {
        r = copysign(0.0, m);
    }
    return r;
}

/* Python's round(x, 15): the correctly rounded decimal, read back. */
static double py_round15(double x)
{
    char buf[64];
    snprintf(buf, sizeof buf, "%.15f", x);
    return strtod(buf, NULL);
}

/* ------------------------------------------------------------- geometry */

/* gcc vectorises loops with float compares and conversions only when it may assume that compares
 * and conversions raise no floating-point traps; nothing here reads the
 * exception flags, and the results are IEEE's either way. */
#if defined(__GNUC__) && !defined(__clang__)
#define FL_NO_TRAPS __attribute__((optimize("no-trapping-math")))
#else
#define FL_NO_TRAPS
#endif


#define COORD(v) ((v) < 0.0 ? -1 : ((int)(v)))
#define FLOOR(v) ((v) < 0.0 ? ((int)floor(v)) : ((int)(v)))

/* Every pixel the fill: one memset for a gray, else the first pixel's
 * bytes repeated by copying what is filled already (in steps that stay in
 * cache), instead of three single-byte stores a pixel. */
static void fill_image(unsigned char *dst, size_t pixels, const unsigned char fill[3])
{
    if (pixels == 0)
        return;
    if (fill[0] == fill[1] && fill[1] == fill[2]) {
        memset(dst, fill[0], 3 * pixels);
        return;
    }
    memcpy(dst, fill, 3);
    for (size_t done = 1; done < pixels;) {
        size_t k = pixels - done < done ? pixels - done : done;
        k = k < 4096 ? k : 4096;
        memcpy(dst + 3 * done, dst, 3 * k);
        done += k;
    }
}

static void copy_pixel(unsigned char *dst, const unsigned char *src)
{
    dst[0] = src[0];
    dst[1] = src[1];
    dst[2] = src[2];
}

/* Both corners of the output within 16.16 fixed point's reach. */
static int fits_fixed(const double a[6], int x, int y)
{
    return fabs(x * a[0] + y * a[1] + a[2]) < 32768.0 && fabs(x * a[3] + y * a[4] + a[5]) < 32768.0;
}

static int fix16(double v)
{
    return FLOOR(v * 65536.0 + 0.5);
}

/* Pillow's bilinear filter for one output pixel at source (xin, yin);
 * returns 0 (pixel keeps the fill) outside the image. */
static int bilinear_at(const unsigned char *src, int w, int h, double xin, double yin,
                       unsigned char *out)
{
    if (xin < 0.0 || xin >= w || yin < 0.0 || yin >= h)
        return 0;
    xin -= 0.5;
    yin -= 0.5;
    int x = FLOOR(xin), y = FLOOR(yin);
    double dx = xin - x, dy = yin - y;
    int yc = y < 0 ? 0 : y < h ? y : h - 1;
    int x0 = (x < 0 ? 0 : x < w ? x : w - 1) * 3;
    int x1 = (x + 1 < 0 ? 0 : x + 1 < w ? x + 1 : w - 1) * 3;
    const unsigned char *row = src + (size_t)yc * w * 3;
    const unsigned char *next = y + 1 >= 0 && y + 1 < h ? src + (size_t)(y + 1) * w * 3 : NULL;
    for (int b = 0; b < 3; b++) {
        double v1 = row[x0 + b] + (row[x1 + b] - row[x0 + b]) * dx;
        double v2 = next ? next[x0 + b] + (next[x1 + b] - next[x0 + b]) * dx : v1;
        v1 = v1 + (v2 - v1) * dy;
        out[b] = (unsigned char)v1;
    }
    return 1;
}

/* Pillow's BILINEAR affine transform (ImagingGenericTransform calling
 * affine_transform and bilinear_filter32RGB per pixel), with the same
 * arithmetic on every pixel but laid out for speed:
 *
 * - xout = a0 * xin + a1 * yin + a2 evaluates as (a0 * xin + a1 * yin) + a2;
 *   the product a1 * yin is the same for the whole row, so it is computed
 *   once; the sums stay per pixel, in Pillow's order.
 * - The filter's bounds test, floor and edge clamps become one branch-free
 *   computation of the four neighbours: inside the image, xin - 0.5 is at
 *   least -0.5, so floor is the truncation less one below zero; a row
 *   below the image (y + 1 == h, where Pillow reuses the first row's
 *   value) is the clamped row y itself, which gives that same value.
 * - A row is done in chunks, one pass per step over arrays (positions and
 *   weights, four pixels a vector; the sixteen bytes gathered; the blends
 *   per band, which the compiler vectorises), and the double arithmetic is
 *   exact whether done one value or several at a time.
 * - Pixels sampling outside the image take the fill, as in Pillow. */
#define WARP_CHUNK 64

/* The pixel at p as R | G << 8 | B << 16, and whatever the fourth byte
 * holds at 24: one load. */
static inline uint32_t load_word(const unsigned char *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap32(v);
#endif
    return v;
}

/* The pixel at byte offset `at` likewise, or with three loads for the
 * image's last pixel, where a fourth byte would lie past the end. */
static inline uint32_t load_rgb(const unsigned char *src, int at, int last)
{
    if (at < last)
        return load_word(src + at);
    return src[at] | (uint32_t)src[at + 1] << 8 | (uint32_t)src[at + 2] << 16;
}

/* Four lanes of double, and of the int32 and int64 that go with them (gcc
 * and clang vector extensions: SSE2 pairs in the baseline build, one AVX2
 * register in the other).  Written out rather than left to the
 * auto-vectoriser, which gives up on this loop's selects under AVX2. */
typedef double fl_v4d __attribute__((vector_size(32)));
typedef int64_t fl_v4l __attribute__((vector_size(32)));
typedef int32_t fl_v4i __attribute__((vector_size(16)));

/* What a chunk's positions say about all its pixels (lanes past the row's
 * end included, which only makes each answer more cautious): whether any
 * samples the image, whether every horizontal or every vertical weight is
 * 0, and whether any reads the image's last pixel (its bottom-right
 * neighbour, the furthest read, is at byte offset `last`). */
typedef struct fl_chunk_flags {
    int any, flat_x, flat_y, reaches_end;
} fl_chunk_flags;

/* The sampling positions of output pixels x0 .. x0 + n of one row: for each,
 * whether it samples the image (keep: -1, or 0 where it takes the fill),
 * its weights and the byte offsets of its four neighbours; and the chunk's
 * flags.  Per pixel, in Pillow's order: xin = x + 0.5, xx = a0 * xin +
 * a1 * yin + a2 (the row's product a1 * yin given), inside when 0 <= xx < w
 * and 0 <= yy < h; then xx - 0.5 is floored, which for values of at least
 * -0.5 is the truncation, less one below zero.  Outside, the positions are
 * made 0, which any later read accepts; their result is not kept.  Always
 * inlined, so that it is built for each of the caller's targets. */
static inline __attribute__((always_inline)) fl_chunk_flags warp_positions(
    const double a[6], int x0, double row_x, double row_y, int w, int h, int n, int last,
    int32_t *keep, double *dx, double *dy, int *off_top, int *off_bottom, int *step)
{
    fl_v4l any = {0}, moves_x = {0}, moves_y = {0};
    fl_v4i reaches_end = {0};
    const fl_v4d half = {0.5, 0.5, 0.5, 0.5}, one = {1.0, 1.0, 1.0, 1.0};
    const fl_v4d lane = {0.0, 1.0, 2.0, 3.0}, zero = {0.0, 0.0, 0.0, 0.0};
    const fl_v4d wd = zero + w, hd = zero + h, last_x = wd - 1.0, last_y = hd - 1.0;
    const double stride = 3.0 * w;
    for (int i = 0; i < n; i += 4) {
        fl_v4d xin = (zero + (double)(x0 + i) + lane) + half;
        fl_v4d xx = a[0] * xin + row_x + a[2];
        fl_v4d yy = a[3] * xin + row_y + a[5];
        fl_v4l in = (xx >= zero) & (xx < wd) & (yy >= zero) & (yy < hd);
        xx = (fl_v4d)((fl_v4l)(xx - half) & in);
        yy = (fl_v4d)((fl_v4l)(yy - half) & in);
        /* floor, as whole doubles (exact): the truncation, less one below zero */
        fl_v4d xf = __builtin_convertvector(__builtin_convertvector(xx, fl_v4i), fl_v4d);
        fl_v4d yf = __builtin_convertvector(__builtin_convertvector(yy, fl_v4i), fl_v4d);
        xf -= (fl_v4d)((fl_v4l)one & (xx < xf));
        yf -= (fl_v4d)((fl_v4l)one & (yy < yf));
        fl_v4d fx = xx - xf, fy = yy - yf; /* xx - (-1) below zero, as Pillow's */
        /* neighbours clamped to the image; floor is at least -1 */
        fl_v4d c0 = (fl_v4d)((fl_v4l)xf & ~(xf < zero)), r0 = (fl_v4d)((fl_v4l)yf & ~(yf < zero));
        fl_v4d c1 = xf + 1.0, r1 = yf + 1.0;
        c1 -= (fl_v4d)((fl_v4l)one & (c1 > last_x));
        r1 -= (fl_v4d)((fl_v4l)one & (r1 > last_y));
        /* byte offsets, whole doubles below 2^31 (the caller's bound) */
        fl_v4i top = __builtin_convertvector(r0 * stride + 3.0 * c0, fl_v4i);
        fl_v4i bottom = __builtin_convertvector(r1 * stride + 3.0 * c0, fl_v4i);
        fl_v4i s = __builtin_convertvector(3.0 * (c1 - c0), fl_v4i);
        fl_v4i keep4 = __builtin_convertvector(in, fl_v4i); /* -1 or 0 */
        any |= in;
        moves_x |= fx != zero;
        moves_y |= fy != zero;
        reaches_end |= bottom + s >= last;
        /* whole vectors: the arrays hold WARP_CHUNK, a multiple of 4 */
        memcpy(keep + i, &keep4, sizeof keep4);
        memcpy(dx + i, &fx, sizeof fx);
        memcpy(dy + i, &fy, sizeof fy);
        memcpy(off_top + i, &top, sizeof top);
        memcpy(off_bottom + i, &bottom, sizeof bottom);
        memcpy(step + i, &s, sizeof s);
    }
    fl_chunk_flags flags = {0, 1, 1, 0};
    for (int k = 0; k < 4; k++) {
        flags.any |= any[k] != 0;
        flags.flat_x &= moves_x[k] == 0;
        flags.flat_y &= moves_y[k] == 0;
        flags.reaches_end |= reaches_end[k] != 0;
    }
    return flags;
}

/* The packed neighbours of n pixels into q (top-left, top-right,
 * bottom-left, bottom-right), those a flat weight leaves unread as 0.
 * `bounded`, a constant at each call, picks load_rgb's end-of-image test
 * or plain loads. */
static inline __attribute__((always_inline)) void gather_neighbours(
    const unsigned char *src, const int *off_top, const int *off_bottom, const int *step, int n,
    int flat_x, int flat_y, int bounded, int last, uint32_t q[4][WARP_CHUNK])
{
#define FL_NEIGHBOUR(at) (bounded ? load_rgb(src, (at), last) : load_word(src + (at)))
    for (int i = 0; i < n; i++) {
        int t = off_top[i], b = off_bottom[i], s = step[i];
        q[0][i] = FL_NEIGHBOUR(t);
        q[1][i] = flat_x ? 0 : FL_NEIGHBOUR(t + s);
        q[2][i] = flat_y ? 0 : FL_NEIGHBOUR(b);
        q[3][i] = flat_x || flat_y ? 0 : FL_NEIGHBOUR(b + s);
    }
#undef FL_NEIGHBOUR
}

FL_NO_TRAPS FL_SIMD_CLONES
static void bilinear_affine(const unsigned char *src, unsigned char *dst, int w, int h,
                            const double a[6], const unsigned char fill[3])
{
    size_t stride = (size_t)w * 3;
    /* per chunk: -1 where the pixel samples the image, 0 where it takes the fill */
    int32_t keep[WARP_CHUNK];
    double dx[WARP_CHUNK], dy[WARP_CHUNK];
    int off_top[WARP_CHUNK], off_bottom[WARP_CHUNK], step[WARP_CHUNK];
    int last = (int)(stride * (size_t)h) - 3; /* offset of the last pixel */
    /* neighbours (top-left, top-right, bottom-left, -right), bands in bytes 0..2 */
    uint32_t q[4][WARP_CHUNK];
    unsigned char v[3][WARP_CHUNK];
    for (int y = 0; y < h; y++) {
        double yin = y + 0.5;
        double row_x = a[1] * yin, row_y = a[4] * yin;
        unsigned char *out = dst + (size_t)y * stride;
        for (int x0 = 0; x0 < w; x0 += WARP_CHUNK) {
            int n = w - x0 < WARP_CHUNK ? w - x0 : WARP_CHUNK;
            unsigned char *o = out + 3 * (size_t)x0;
            fl_chunk_flags f = warp_positions(a, x0, row_x, row_y, w, h, n, last, keep, dx, dy,
                                              off_top, off_bottom, step);
            /* Where every weight of a kind is 0 (ShearX keeps each row's
             * y, so dy is 0; ShearY keeps x), v + (w - v) * 0 is v exactly:
             * the neighbours that term would bring are not read. */
            int flat_x = f.flat_x, flat_y = f.flat_y;
            if (!f.any) {
                fill_image(o, n, fill);
                continue;
            }
            /* Only a chunk that reaches the image's last pixel needs
             * load_rgb's test. */
            if (!f.reaches_end)
                gather_neighbours(src, off_top, off_bottom, step, n, flat_x, flat_y, 0, 0, q);
            else
                gather_neighbours(src, off_top, off_bottom, step, n, flat_x, flat_y, 1, last, q);
            for (int c = 0; c < 3; c++) {
                int shift = 8 * c;
                if (flat_x && flat_y) {
                    for (int i = 0; i < n; i++)
                        v[c][i] = (unsigned char)(q[0][i] >> shift);
                } else if (flat_y) {
                    for (int i = 0; i < n; i++) {
                        int p00 = (q[0][i] >> shift) & 0xff, p01 = (q[1][i] >> shift) & 0xff;
                        double v1 = p00 + (p01 - p00) * dx[i];
                        v[c][i] = (unsigned char)(int)v1;
                    }
                } else if (flat_x) {
                    for (int i = 0; i < n; i++) {
                        int p00 = (q[0][i] >> shift) & 0xff, p10 = (q[2][i] >> shift) & 0xff;
                        double v1 = p00, v2 = p10;
                        v1 = v1 + (v2 - v1) * dy[i];
                        v[c][i] = (unsigned char)(int)v1;
                    }
                } else {
                    for (int i = 0; i < n; i++) {
                        int p00 = (q[0][i] >> shift) & 0xff, p01 = (q[1][i] >> shift) & 0xff;
                        int p10 = (q[2][i] >> shift) & 0xff, p11 = (q[3][i] >> shift) & 0xff;
                        double v1 = p00 + (p01 - p00) * dx[i];
                        double v2 = p10 + (p11 - p10) * dx[i];
                        v1 = v1 + (v2 - v1) * dy[i];
                        v[c][i] = (unsigned char)(int)v1;
                    }
                }
            }
            for (size_t i = 0; i < (size_t)n; i++) {
                unsigned char k = (unsigned char)keep[i];
                o[3 * i] = (unsigned char)((v[0][i] & k) | (fill[0] & ~k));
                o[3 * i + 1] = (unsigned char)((v[1][i] & k) | (fill[1] & ~k));
                o[3 * i + 2] = (unsigned char)((v[2][i] & k) | (fill[2] & ~k));
            }
        }
    }
}

/* A whole-pixel shift (TranslateX/Y): output (x, y) is source (x + tx,
 * y + ty) where that is inside.  Both filters sample exactly at pixel
 * centres then (the bilinear weights are 0), so rows are copied. */
static void translate(const unsigned char *src, unsigned char *dst, int w, int h, int tx, int ty)
{
    int x0 = tx < 0 ? -tx : 0, x1 = tx > 0 ? w - tx : w; /* output columns with a source */
    if (x0 >= x1)
        return;
    for (int y = 0; y < h; y++) {
        int sy = y + ty;
        if (sy < 0 || sy >= h)
            continue;
        memcpy(dst + ((size_t)y * w + x0) * 3, src + ((size_t)sy * w + x0 + tx) * 3,
               (size_t)(x1 - x0) * 3);
    }
}

/* Nonzero when the matrix is a shift by whole pixels, within the image's
 * reach (so that the ints hold it). */
static int is_translation(const double a[6], int w, int h)
{
    return a[0] == 1.0 && a[1] == 0.0 && a[3] == 0.0 && a[4] == 1.0 && a[2] == floor(a[2]) &&
           a[5] == floor(a[5]) && fabs(a[2]) <= w && fabs(a[5]) <= h;
}

void fl_pil_affine(const unsigned char *src, unsigned char *dst, int w, int h, const double a[6],
                   int interpolation, const unsigned char fill[3])
{
    int shift = is_translation(a, w, h);
    if (interpolation == FL_WARP_BILINEAR && !shift && (size_t)w * h * 3 <= INT_MAX) {
        bilinear_affine(src, dst, w, h, a, fill); /* writes every pixel */
        return;
    }
    fill_image(dst, (size_t)w * h, fill);
    if (shift) {
        translate(src, dst, w, h, (int)a[2], (int)a[5]);
        return;
    }
    if (interpolation == FL_WARP_BILINEAR) {
        /* Too large for bilinear_affine's int offsets: pixel by pixel. */
        for (int y = 0; y < h; y++) {
            for (int x = 0; x < w; x++) {
                double xin = x + 0.5, yin = y + 0.5;
                double xx = a[0] * xin + a[1] * yin + a[2];
                double yy = a[3] * xin + a[4] * yin + a[5];
                bilinear_at(src, w, h, xx, yy, dst + ((size_t)y * w + x) * 3);
            }
        }
        return;
    }
    if (a[1] == 0 && a[3] == 0) {
        /* Pillow's scale path: positions accumulate along the row. */
        double yo = a[5] + a[4] * 0.5;
        for (int y = 0; y < h; y++, yo += a[4]) {
            int yi = COORD(yo);
            if (yi < 0 || yi >= h)
                continue;
            double xo = a[2] + a[0] * 0.5;
            for (int x = 0; x < w; x++, xo += a[0]) {
                int xi = COORD(xo);
                if (xi >= 0 && xi < w)
                    copy_pixel(dst + ((size_t)y * w + x) * 3, src + ((size_t)yi * w + xi) * 3);
            }
        }
        return;
    }
    if (fits_fixed(a, 0, 0) && fits_fixed(a, w, h) && fits_fixed(a, 0, h) && fits_fixed(a, w, 0)) {
        int a0 = fix16(a[0]), a1 = fix16(a[1]), a3 = fix16(a[3]), a4 = fix16(a[4]);
        int a2 = fix16(a[2] + a[0] * 0.5 + a[1] * 0.5);
        int a5 = fix16(a[5] + a[3] * 0.5 + a[4] * 0.5);
        for (int y = 0; y < h; y++, a2 += a1, a5 += a4) {
            int xx = a2, yy = a5;
            for (int x = 0; x < w; x++, xx += a0, yy += a3) {
                int xi = xx >> 16, yi = yy >> 16; /* floor: arithmetic shift, as Pillow */
                if (xi >= 0 && xi < w && yi >= 0 && yi < h)
                    copy_pixel(dst + ((size_t)y * w + x) * 3, src + ((size_t)yi * w + xi) * 3);
            }
        }
        return;
    }
    double xo = a[2] + a[1] * 0.5 + a[0] * 0.5;
    double yo = a[5] + a[4] * 0.5 + a[3] * 0.5;
    for (int y = 0; y < h; y++, xo += a[1], yo += a[4]) {
        double xx = xo, yy = yo;
        for (int x = 0; x < w; x++, xx += a[0], yy += a[3]) {
            int xi = COORD(xx), yi = COORD(yy);
            if (xi >= 0 && xi < w && yi >= 0 && yi < h)
                copy_pixel(dst + ((size_t)y * w + x) * 3, src + ((size_t)yi * w + xi) * 3);
        }
    }
}

void fl_pil_inverse_affine(double cx, double cy, double angle, double tx, double ty, double scale,
                           double shear_x, double shear_y, double m[6])
{
    double rot = radians(angle), sx = radians(shear_x), sy = radians(shear_y);
    double a = cos(rot - sy) / cos(sy);
    double b = -cos(rot - sy) * tan(sx) / cos(sy) - sin(rot);
    double c = sin(rot - sy) / cos(sy);
    double d = -sin(rot - sy) * tan(sx) / cos(sy) + cos(rot);
    m[0] = d / scale;
    m[1] = -b / scale;
    m[2] = 0.0 / scale;
    m[3] = -c / scale;
    m[4] = a / scale;
    m[5] = 0.0 / scale;
    m[2] += m[0] * (-cx - tx) + m[1] * (-cy - ty);
    m[5] += m[3] * (-cx - tx) + m[4] * (-cy - ty);
    m[2] += cx;
    m[5] += cy;
}

/* Image.transpose: 1 ROTATE_90 (counter-clockwise), 2 ROTATE_180,
 * 3 ROTATE_270; 90 and 270 only for square images here. */
static void transpose(const unsigned char *src, unsigned char *dst, int w, int h, int quarter)
{
    for (int y = 0; y < h; y++) {
        for (int x = 0; x < w; x++) {
            int sx, sy;
            if (quarter == 1) {
                sx = w - 1 - y;
                sy = x;
            } else if (quarter == 2) {
                sx = w - 1 - x;
                sy = h - 1 - y;
            } else {
                sx = y;
                sy = h - 1 - x;
            }
            copy_pixel(dst + ((size_t)y * w + x) * 3, src + ((size_t)sy * w + sx) * 3);
        }
    }
}

void fl_pil_rotate(const unsigned char *src, unsigned char *dst, int w, int h, double angle,
                   int interpolation, const unsigned char fill[3], int center, double cx,
                   double cy)
{
    angle = py_mod(angle, 360.0);
    if (!center) {
        if (angle == 0) {
            memcpy(dst, src, (size_t)w * h * 3);
            return;
        }
        if (angle == 180) {
            transpose(src, dst, w, h, 2);
            return;
        }
        if ((angle == 90 || angle == 270) && w == h) {
            transpose(src, dst, w, h, angle == 90 ? 1 : 3);
            return;
        }
        cx = w / 2.0;
        cy = h / 2.0;
    }
    double r = -radians(angle);
    double m[6] = {py_round15(cos(r)), py_round15(sin(r)), 0.0,
                   py_round15(-sin(r)), py_round15(cos(r)), 0.0};
    double x = -cx - 0, y = -cy - 0;
    double c = m[0] * x + m[1] * y + m[2];
    double f = m[3] * x + m[4] * y + m[5];
    m[2] = c + cx;
    m[5] = f + cy;
    fl_pil_affine(src, dst, w, h, m, interpolation, fill);
}

/* ---------------------------------------------------------------- colour */

/* Pillow's RGB -> L: ITU-R 601-2 luma in 16-bit fixed point. */
static inline int luma(const unsigned char *p)
{
    return (p[0] * 19595 + p[1] * 38470 + p[2] * 7471 + 0x8000) >> 16;
}

/* The largest |alpha| whose extrapolations stay within int32: 2^22, so
 * |t| <= 255 + 2^22 * 255 < 2^31. */
#define BLEND_INT_ALPHA 4194304.0f

/* Image.blend(degenerate, image, alpha) over n values: Pillow's float
 * expression per value, truncated, clipped only when extrapolating.  The
 * degenerate values are degenerate[i], or `fixed` where `uniform` (a
 * constant at each call).  Written so that the loops vectorise (float lanes
 * compute exactly what the scalar expression does).  out may be
 * degenerate. */
static inline __attribute__((always_inline)) void blend_values(
    const unsigned char *degenerate, int fixed, int uniform, const unsigned char *image,
    unsigned char *out, size_t n, float alpha)
{
#define FL_DEGENERATE(i) (uniform ? fixed : degenerate[i])
    if (alpha >= 0 && alpha <= 1.0) {
        for (size_t i = 0; i < n; i++)
            out[i] = (unsigned char)(FL_DEGENERATE(i) + alpha * (image[i] - FL_DEGENERATE(i)));
        return;
    }
    if (fabsf(alpha) <= BLEND_INT_ALPHA) {
        /* |t| < 2^31: truncated to an integer first, then clipped, which
         * gives the same byte; gcc vectorises a float clip into compares
         * and blends per byte lane, several times slower. */
        for (size_t i = 0; i < n; i++) {
            int32_t t = (int32_t)(FL_DEGENERATE(i) + alpha * (image[i] - FL_DEGENERATE(i)));
            t = t < 0 ? 0 : t;
            out[i] = (unsigned char)(t > 255 ? 255 : t);
        }
        return;
    }
    for (size_t i = 0; i < n; i++) {
        float t = (float)(FL_DEGENERATE(i) + alpha * (image[i] - FL_DEGENERATE(i)));
        t = t <= 0.0f ? 0.0f : t;
        t = t >= 255.0f ? 255.0f : t;
        out[i] = (unsigned char)t;
    }
#undef FL_DEGENERATE
}

FL_NO_TRAPS FL_SIMD_CLONES
static void blend_bytes(const unsigned char *degenerate, const unsigned char *image,
                        unsigned char *out, size_t n, float alpha)
{
    blend_values(degenerate, 0, 0, image, out, n, alpha);
}

/* Image.blend of a one-colour image (Brightness's black, Contrast's mean
 * gray) with the image, computed rather than looked up in a table: the
 * table's reads do not vectorise. */
FL_NO_TRAPS FL_SIMD_CLONES
static void blend_fixed(int degenerate, const unsigned char *restrict image,
                        unsigned char *restrict out, size_t n, float alpha)
{
    blend_values(NULL, degenerate, 1, image, out, n, alpha);
}

#define BLEND_CHUNK 256 /* pixels whose gray values are made at a time */

enum { DEGENERATE_BLACK, DEGENERATE_GRAY, DEGENERATE_MEAN, DEGENERATE_SMOOTH };

#define SHARPEN_CHUNK 512 /* values of a row filtered at a time */

/* ImageEnhance.Sharpness: Image.blend(image.filter(SMOOTH), image, alpha),
 * in one pass.  SMOOTH is the 3x3 kernel 1 1 1 / 1 5 1 / 1 1 1 with divisor
 * 13, and leaves the border as it is, so the border blends with itself and
 * is copied.  Pillow's float sum per value adds the rows below first, each
 * row's three products left to right:
 *
 *     ss = 0.5 + ((b[-3] k1 + b[0] k1) + b[3] k1)       row below
 *             + ((h[-3] k1 + h[0] k5) + h[3] k1)        this row
 *             + ((a[-3] k1 + a[0] k1) + a[3] k1)        row above
 *
 * The products v * k1 and the three-product sum of a row (the bracket of
 * the rows below and above) are the same for every output row that reads
 * them, so each is made once per source row and kept in a ring of three
 * rows; the sums are the same floats in the same order.  Columns go by
 * chunks, so the rings live on the stack whatever the width. */
FL_NO_TRAPS FL_SIMD_CLONES
static void sharpen(const unsigned char *src, unsigned char *dst, int w, int h, float alpha)
{
    const float k1 = 1.0f / 13.0f, k5 = 5.0f / 13.0f;
    size_t row = (size_t)w * 3;
    memcpy(dst, src, row * (size_t)h);
    if (w < 3 || h < 3)
        return;
    float products[3][SHARPEN_CHUNK + 6]; /* v * k1 of a row, 3 values each side extra */
    float sums[3][SHARPEN_CHUNK];         /* a row's three-product bracket */
    unsigned char smoothed[SHARPEN_CHUNK];
    for (size_t lo = 3; lo < row - 3; lo += SHARPEN_CHUNK) {
        size_t n = row - 3 - lo < SHARPEN_CHUNK ? row - 3 - lo : SHARPEN_CHUNK;
        for (int r = 0; r < h; r++) {
            /* row r's products and bracket, into ring slot r % 3 */
            const unsigned char *in = src + (size_t)r * row + lo - 3;
            float *restrict p = products[r % 3], *restrict t = sums[r % 3];
            for (size_t j = 0; j < n + 6; j++)
                p[j] = (float)in[j] * k1;
            for (size_t i = 0; i < n; i++)
                t[i] = (p[i] + p[i + 3]) + p[i + 6];
            if (r < 2)
                continue;
            /* output row y = r - 1: below is row r, above row r - 2 */
            int y = r - 1;
            const float *restrict below = sums[r % 3], *restrict above = sums[(r + 1) % 3];
            const float *restrict hp = products[y % 3];
            const unsigned char *here = src + (size_t)y * row + lo;
            for (size_t i = 0; i < n; i++) {
                float v = 0.5f;
                v += below[i];
                v += (hp[i] + (float)here[i] * k5) + hp[i + 6];
                v += above[i];
                /* Pillow clips to 0..255 first; with these weights v lies
                 * in 0.5 .. 255.5 plus rounding, which truncates in range. */
                smoothed[i] = (unsigned char)v;
            }
            blend_bytes(smoothed, here, dst + (size_t)y * row + lo, n, alpha);
        }
    }
}

/* An ImageEnhance class: Image.blend of its degenerate image with the
 * image.  Where the degenerate image is one value (black, the mean gray)
 * it is blended as that value. */
FL_SIMD_CLONES
static void enhance(int kind, float alpha, const unsigned char *src, unsigned char *dst, int w,
                    int h)
{
    size_t pixels = (size_t)w * h;
    if (kind == DEGENERATE_BLACK || kind == DEGENERATE_MEAN) {
        int degenerate = 0;
        if (kind == DEGENERATE_MEAN) {
            /* ImageStat's mean of the L image, int(mean + 0.5) */
            unsigned long long sum = 0;
            for (size_t i = 0; i < pixels; i++)
                sum += (unsigned long long)luma(src + 3 * i);
            degenerate = (int)((double)sum / (double)pixels + 0.5);
        }
        blend_fixed(degenerate, src, dst, 3 * pixels, alpha);
        return;
    }
    if (kind == DEGENERATE_GRAY) {
        /* Each pixel's gray value three times (the L image converted back
         * to RGB), a chunk at a time, then one blend over the chunk.  With
         * alpha 0 or 1 the blend gives the gray or the image exactly, as
         * Pillow's copies do. */
        unsigned char gray[3 * BLEND_CHUNK];
        for (size_t start = 0; start < pixels; start += BLEND_CHUNK) {
            size_t n = pixels - start < BLEND_CHUNK ? pixels - start : BLEND_CHUNK;
            const unsigned char *in = src + 3 * start;
            for (size_t i = 0; i < n; i++)
                gray[3 * i] = gray[3 * i + 1] = gray[3 * i + 2] = (unsigned char)luma(in + 3 * i);
            blend_bytes(gray, in, dst + 3 * start, 3 * n, alpha);
        }
        return;
    }
    sharpen(src, dst, w, h, alpha);
}

static void apply_lut(const unsigned char lut[3][256], const unsigned char *src,
                      unsigned char *dst, size_t pixels)
{
    for (size_t i = 0; i < pixels; i++) {
        dst[3 * i] = lut[0][src[3 * i]];
        dst[3 * i + 1] = lut[1][src[3 * i + 1]];
        dst[3 * i + 2] = lut[2][src[3 * i + 2]];
    }
}

static void histogram(const unsigned char *src, size_t pixels, unsigned long long hist[3][256])
{
    memset(hist, 0, 3 * 256 * sizeof hist[0][0]);
    for (size_t i = 0; i < pixels; i++) {
        hist[0][src[3 * i]]++;
        hist[1][src[3 * i + 1]]++;
        hist[2][src[3 * i + 2]]++;
    }
}

/* ImageOps.autocontrast(image): each band stretched from its lowest to its
 * highest value. */
static void autocontrast_lut(const unsigned long long hist[3][256], unsigned char lut[3][256])
{
    for (int b = 0; b < 3; b++) {
        int lo = 0, hi = 255;
        while (lo < 255 && !hist[b][lo])
            lo++;
        while (hi > 0 && !hist[b][hi])
            hi--;
        for (int i = 0; i < 256; i++) {
            if (hi <= lo) {
                lut[b][i] = (unsigned char)i;
                continue;
            }
            double scale = 255.0 / (hi - lo), offset = -lo * scale;
            double v = i * scale + offset;
            long ix = (long)v; /* int() truncates toward zero */
            lut[b][i] = (unsigned char)(ix < 0 ? 0 : ix > 255 ? 255 : ix);
        }
    }
}

/* ImageOps.equalize(image): each band through its cumulative histogram. */
static void equalize_lut(const unsigned long long hist[3][256], unsigned char lut[3][256])
{
    for (int b = 0; b < 3; b++) {
        unsigned long long total = 0, last = 0;
        int nonzero = 0;
        for (int i = 0; i < 256; i++) {
            if (hist[b][i]) {
                nonzero++;
                total += hist[b][i];
                last = hist[b][i];
            }
        }
        unsigned long long step = nonzero <= 1 ? 0 : (total - last) / 255;
        unsigned long long n = step / 2;
        for (int i = 0; i < 256; i++) {
            if (!step) {
                lut[b][i] = (unsigned char)i;
                continue;
            }
            unsigned long long v = n / step;
            lut[b][i] = (unsigned char)(v > 255 ? 255 : v); /* Image.point clips */
            n += hist[b][i];
        }
    }
}

/* ImageOps.posterize and ImageOps.solarize as the arithmetic their tables
 * hold, over n bytes: loops that vectorise, where table reads do not. */
FL_SIMD_CLONES
static void posterize(const unsigned char *restrict src, unsigned char *restrict dst, size_t n,
                      unsigned char mask)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = src[i] & mask;
}

/* Values below `threshold` (0 .. 256) are kept, the others inverted: at 0,
 * ImageOps.invert. */
FL_SIMD_CLONES
static void solarize(const unsigned char *restrict src, unsigned char *restrict dst, size_t n,
                     int threshold)
{
    if (threshold > 255) {
        memcpy(dst, src, n);
        return;
    }
    unsigned char t = (unsigned char)threshold; /* a byte compare: 32 lanes */
    for (size_t i = 0; i < n; i++)
        dst[i] = (unsigned char)(src[i] < t ? src[i] : 255 - src[i]);
}

int fl_pil_apply(int op, double magnitude, int interpolation, const unsigned char fill[3],
                 const unsigned char *src, unsigned char *dst, int w, int h)
{
    size_t pixels = (size_t)w * h;
    double m[6];
    unsigned char lut[3][256];
    unsigned long long hist[3][256];
    switch (op) {
    case FL_OP_IDENTITY:
        memcpy(dst, src, pixels * 3);
        return FL_OK;
    case FL_OP_SHEAR_X:
    case FL_OP_SHEAR_Y: {
        double shear = degrees(atan(magnitude));
        fl_pil_inverse_affine(0.0, 0.0, 0.0, 0.0, 0.0, 1.0, op == FL_OP_SHEAR_X ? shear : 0.0,
                              op == FL_OP_SHEAR_Y ? shear : 0.0, m);
        fl_pil_affine(src, dst, w, h, m, interpolation, fill);
        return FL_OK;
    }
    case FL_OP_TRANSLATE_X:
    case FL_OP_TRANSLATE_Y: {
        double t = (double)(long long)magnitude; /* int(magnitude) */
        fl_pil_inverse_affine(w * 0.5, h * 0.5, 0.0, op == FL_OP_TRANSLATE_X ? t : 0.0,
                              op == FL_OP_TRANSLATE_Y ? t : 0.0, 1.0, 0.0, 0.0, m);
        fl_pil_affine(src, dst, w, h, m, interpolation, fill);
        return FL_OK;
    }
    case FL_OP_ROTATE:
        fl_pil_rotate(src, dst, w, h, magnitude, interpolation, fill, 0, 0.0, 0.0);
        return FL_OK;
    case FL_OP_BRIGHTNESS:
    case FL_OP_COLOR:
    case FL_OP_CONTRAST:
    case FL_OP_SHARPNESS: {
        static const int kinds[] = {DEGENERATE_BLACK, DEGENERATE_GRAY, DEGENERATE_MEAN,
                                    DEGENERATE_SMOOTH};
        int kind = kinds[op - FL_OP_BRIGHTNESS];
        enhance(kind, (float)(1.0 + magnitude), src, dst, w, h);
        return FL_OK;
    }
    case FL_OP_POSTERIZE: {
        int bits = (int)magnitude;
        if (bits < 1 || bits > 8)
            return FL_ERR_INVALID;
        posterize(src, dst, 3 * pixels, (unsigned char)~((1 << (8 - bits)) - 1));
        return FL_OK;
    }
    case FL_OP_SOLARIZE: {
        /* v < magnitude for whole v is v < ceil(magnitude), within 0 .. 256
         * (no v is below a NaN) */
        double t = ceil(magnitude);
        solarize(src, dst, 3 * pixels, !(t >= 0.0) ? 0 : t > 256.0 ? 256 : (int)t);
        return FL_OK;
    }
    case FL_OP_INVERT: /* a solarize whose threshold no value is below */
        solarize(src, dst, 3 * pixels, 0);
        return FL_OK;
    case FL_OP_AUTOCONTRAST:
        histogram(src, pixels, hist);
        autocontrast_lut((const unsigned long long(*)[256])hist, lut);
        break;
    case FL_OP_EQUALIZE:
        histogram(src, pixels, hist);
        equalize_lut((const unsigned long long(*)[256])hist, lut);
        break;
    default:
        return FL_ERR_INVALID;
    }
    apply_lut((const unsigned char(*)[256])lut, src, dst, pixels);
    return FL_OK;
}

/* ------------------------------------------------------------- policies */

/* RandAugment's and TrivialAugmentWide's spaces: 14 ops, Identity first. */
#define SPACE_OPS 14

/* AutoAugment's sub-policies: (op, probability, magnitude bin or -1). */
typedef struct auto_step {
    unsigned char op;
    float p;
    signed char bin;
} auto_step;

#define S(name, p, bin) {FL_OP_##name, p, bin}
static const auto_step AUTO_POLICIES[3][25][2] = {
    {
        /* IMAGENET */
        {S(POSTERIZE, 0.4f, 8), S(ROTATE, 0.6f, 9)},
        {S(SOLARIZE, 0.6f, 5), S(AUTOCONTRAST, 0.6f, -1)},
        {S(EQUALIZE, 0.8f, -1), S(EQUALIZE, 0.6f, -1)},
        {S(POSTERIZE, 0.6f, 7), S(POSTERIZE, 0.6f, 6)},
        {S(EQUALIZE, 0.4f, -1), S(SOLARIZE, 0.2f, 4)},
        {S(EQUALIZE, 0.4f, -1), S(ROTATE, 0.8f, 8)},
        {S(SOLARIZE, 0.6f, 3), S(EQUALIZE, 0.6f, -1)},
        {S(POSTERIZE, 0.8f, 5), S(EQUALIZE, 1.0f, -1)},
        {S(ROTATE, 0.2f, 3), S(SOLARIZE, 0.6f, 8)},
        {S(EQUALIZE, 0.6f, -1), S(POSTERIZE, 0.4f, 6)},
        {S(ROTATE, 0.8f, 8), S(COLOR, 0.4f, 0)},
        {S(ROTATE, 0.4f, 9), S(EQUALIZE, 0.6f, -1)},
        {S(EQUALIZE, 0.0f, -1), S(EQUALIZE, 0.8f, -1)},
        {S(INVERT, 0.6f, -1), S(EQUALIZE, 1.0f, -1)},
        {S(COLOR, 0.6f, 4), S(CONTRAST, 1.0f, 8)},
        {S(ROTATE, 0.8f, 8), S(COLOR, 1.0f, 2)},
        {S(COLOR, 0.8f, 8), S(SOLARIZE, 0.8f, 7)},
        {S(SHARPNESS, 0.4f, 7), S(INVERT, 0.6f, -1)},
        {S(SHEAR_X, 0.6f, 5), S(EQUALIZE, 1.0f, -1)},
        {S(COLOR, 0.4f, 0), S(EQUALIZE, 0.6f, -1)},
        {S(EQUALIZE, 0.4f, -1), S(SOLARIZE, 0.2f, 4)},
        {S(SOLARIZE, 0.6f, 5), S(AUTOCONTRAST, 0.6f, -1)},
        {S(INVERT, 0.6f, -1), S(EQUALIZE, 1.0f, -1)},
        {S(COLOR, 0.6f, 4), S(CONTRAST, 1.0f, 8)},
        {S(EQUALIZE, 0.8f, -1), S(EQUALIZE, 0.6f, -1)},
    },
    {
        /* CIFAR10 */
        {S(INVERT, 0.1f, -1), S(CONTRAST, 0.2f, 6)},
        {S(ROTATE, 0.7f, 2), S(TRANSLATE_X, 0.3f, 9)},
        {S(SHARPNESS, 0.8f, 1), S(SHARPNESS, 0.9f, 3)},
        {S(SHEAR_Y, 0.5f, 8), S(TRANSLATE_Y, 0.7f, 9)},
        {S(AUTOCONTRAST, 0.5f, -1), S(EQUALIZE, 0.9f, -1)},
        {S(SHEAR_Y, 0.2f, 7), S(POSTERIZE, 0.3f, 7)},
        {S(COLOR, 0.4f, 3), S(BRIGHTNESS, 0.6f, 7)},
        {S(SHARPNESS, 0.3f, 9), S(BRIGHTNESS, 0.7f, 9)},
        {S(EQUALIZE, 0.6f, -1), S(EQUALIZE, 0.5f, -1)},
        {S(CONTRAST, 0.6f, 7), S(SHARPNESS, 0.6f, 5)},
        {S(COLOR, 0.7f, 7), S(TRANSLATE_X, 0.5f, 8)},
        {S(EQUALIZE, 0.3f, -1), S(AUTOCONTRAST, 0.4f, -1)},
        {S(TRANSLATE_Y, 0.4f, 3), S(SHARPNESS, 0.2f, 6)},
        {S(BRIGHTNESS, 0.9f, 6), S(COLOR, 0.2f, 8)},
        {S(SOLARIZE, 0.5f, 2), S(INVERT, 0.0f, -1)},
        {S(EQUALIZE, 0.2f, -1), S(AUTOCONTRAST, 0.6f, -1)},
        {S(EQUALIZE, 0.2f, -1), S(EQUALIZE, 0.6f, -1)},
        {S(COLOR, 0.9f, 9), S(EQUALIZE, 0.6f, -1)},
        {S(AUTOCONTRAST, 0.8f, -1), S(SOLARIZE, 0.2f, 8)},
        {S(BRIGHTNESS, 0.1f, 3), S(COLOR, 0.7f, 0)},
        {S(SOLARIZE, 0.4f, 5), S(AUTOCONTRAST, 0.9f, -1)},
        {S(TRANSLATE_Y, 0.9f, 9), S(TRANSLATE_Y, 0.7f, 9)},
        {S(AUTOCONTRAST, 0.9f, -1), S(SOLARIZE, 0.8f, 3)},
        {S(EQUALIZE, 0.8f, -1), S(INVERT, 0.1f, -1)},
        {S(TRANSLATE_Y, 0.7f, 9), S(AUTOCONTRAST, 0.9f, -1)},
    },
    {
        /* SVHN */
        {S(SHEAR_X, 0.9f, 4), S(INVERT, 0.2f, -1)},
        {S(SHEAR_Y, 0.9f, 8), S(INVERT, 0.7f, -1)},
        {S(EQUALIZE, 0.6f, -1), S(SOLARIZE, 0.6f, 6)},
        {S(INVERT, 0.9f, -1), S(EQUALIZE, 0.6f, -1)},
        {S(EQUALIZE, 0.6f, -1), S(ROTATE, 0.9f, 3)},
        {S(SHEAR_X, 0.9f, 4), S(AUTOCONTRAST, 0.8f, -1)},
        {S(SHEAR_Y, 0.9f, 8), S(INVERT, 0.4f, -1)},
        {S(SHEAR_Y, 0.9f, 5), S(SOLARIZE, 0.2f, 6)},
        {S(INVERT, 0.9f, -1), S(AUTOCONTRAST, 0.8f, -1)},
        {S(EQUALIZE, 0.6f, -1), S(ROTATE, 0.9f, 3)},
        {S(SHEAR_X, 0.9f, 4), S(SOLARIZE, 0.3f, 3)},
        {S(SHEAR_Y, 0.8f, 8), S(INVERT, 0.7f, -1)},
        {S(EQUALIZE, 0.9f, -1), S(TRANSLATE_Y, 0.6f, 6)},
        {S(INVERT, 0.9f, -1), S(EQUALIZE, 0.6f, -1)},
        {S(CONTRAST, 0.3f, 3), S(ROTATE, 0.8f, 4)},
        {S(INVERT, 0.8f, -1), S(TRANSLATE_Y, 0.0f, 2)},
        {S(SHEAR_Y, 0.7f, 6), S(SOLARIZE, 0.4f, 8)},
        {S(INVERT, 0.6f, -1), S(ROTATE, 0.8f, 4)},
        {S(SHEAR_Y, 0.3f, 7), S(TRANSLATE_X, 0.9f, 3)},
        {S(SHEAR_X, 0.1f, 6), S(INVERT, 0.6f, -1)},
        {S(SOLARIZE, 0.7f, 2), S(TRANSLATE_Y, 0.6f, 7)},
        {S(SHEAR_Y, 0.8f, 4), S(INVERT, 0.8f, -1)},
        {S(SHEAR_X, 0.7f, 9), S(TRANSLATE_Y, 0.8f, 3)},
        {S(SHEAR_Y, 0.8f, 5), S(AUTOCONTRAST, 0.7f, -1)},
        {S(SHEAR_X, 0.7f, 2), S(INVERT, 0.1f, -1)},
    },
};
#undef S

static int is_signed(int op)
{
    return op >= FL_OP_SHEAR_X && op <= FL_OP_SHARPNESS;
}

/* The ops whose magnitude is a table (not the scalar 0). */
static int has_bins(int op)
{
    return op != FL_OP_IDENTITY && op != FL_OP_AUTOCONTRAST && op != FL_OP_EQUALIZE &&
           op != FL_OP_INVERT;
}

void fl_augment_draw_for(const fl_augment_plan *plan, fl_rng *rng, fl_augment_draw *out)
{
    memset(out, 0, sizeof *out);
    if (plan->policy == FL_AUGMENT_RAND || plan->policy == FL_AUGMENT_TRIVIAL) {
        int count = plan->policy == FL_AUGMENT_RAND ? plan->num_ops : 1;
        if (count > FL_AUGMENT_MAX_OPS)
            count = FL_AUGMENT_MAX_OPS;
        for (int i = 0; i < count; i++) {
            int op = (int)fl_rng_below(rng, SPACE_OPS);
            out->op[i] = op;
            if (has_bins(op))
                out->bin[i] = plan->policy == FL_AUGMENT_RAND
                                  ? plan->magnitude
                                  : (int)fl_rng_below(rng, plan->num_bins);
            out->negative[i] = is_signed(op) && fl_rng_below(rng, 2);
        }
        out->count = count;
    } else if (plan->policy == FL_AUGMENT_AUTO) {
        int table = plan->table >= 0 && plan->table <= 2 ? plan->table : 0;
        const auto_step *steps = AUTO_POLICIES[table][fl_rng_below(rng, 25)];
        double probs[2] = {fl_rng_uniform(rng), fl_rng_uniform(rng)};
        int signs[2] = {(int)fl_rng_below(rng, 2), (int)fl_rng_below(rng, 2)};
        for (int i = 0; i < 2; i++) {
            /* torch.rand gives a float32; p is torchvision's Python float */
            double p = (double)steps[i].p;
            if (!((float)probs[i] <= (float)p))
                continue;
            int k = out->count++;
            out->op[k] = steps[i].op;
            out->bin[k] = steps[i].bin < 0 ? 0 : steps[i].bin;
            out->negative[k] = is_signed(steps[i].op) && signs[i] == 0;
        }
    }
}

/* torch.linspace(start, end, n)[i] in float32: halves from either end, with
 * the fused multiply-add torch's CPU kernel compiles to. */
static float linspace(double start, double end, int n, int i)
{
    float s = (float)start, e = (float)end;
    float step = (e - s) / (float)(n - 1);
    return i < n / 2 ? fmaf(step, (float)i, s) : fmaf(-step, (float)(n - 1 - i), e);
}

double fl_augment_magnitude(const fl_augment_plan *plan, const fl_augment_draw *draw, int i, int w,
                            int h)
{
    int op = draw->op[i], bin = draw->bin[i];
    int wide = plan->policy == FL_AUGMENT_TRIVIAL;
    int n = plan->policy == FL_AUGMENT_AUTO ? 10 : plan->num_bins;
    double m = 0.0;
    switch (op) {
    case FL_OP_SHEAR_X:
    case FL_OP_SHEAR_Y:
        m = linspace(0.0, wide ? 0.99 : 0.3, n, bin);
        break;
    case FL_OP_TRANSLATE_X:
        m = linspace(0.0, wide ? 32.0 : 150.0 / 331.0 * w, n, bin);
        break;
    case FL_OP_TRANSLATE_Y:
        m = linspace(0.0, wide ? 32.0 : 150.0 / 331.0 * h, n, bin);
        break;
    case FL_OP_ROTATE:
        m = linspace(0.0, wide ? 135.0 : 30.0, n, bin);
        break;
    case FL_OP_BRIGHTNESS:
    case FL_OP_COLOR:
    case FL_OP_CONTRAST:
    case FL_OP_SHARPNESS:
        m = linspace(0.0, wide ? 0.99 : 0.9, n, bin);
        break;
    case FL_OP_POSTERIZE: {
        /* 8 - (arange(n) / ((n - 1) / k)).round().int(), in float32 */
        float q = (float)bin / (float)((n - 1) / (wide ? 6.0 : 4.0));
        m = 8 - (int)nearbyintf(q);
        break;
    }
    case FL_OP_SOLARIZE:
        /* v2 scales its float32 fractions in double: a threshold may then
         * lie just above an integer that v1's table hits exactly */
        m = plan->solarize_v2 ? 255.0 * (double)linspace(1.0, 0.0, n, bin)
                              : linspace(255.0, 0.0, n, bin);
        break;
    default:
        break;
    }
    return draw->negative[i] ? -m : m;
}

int fl_augment_apply(const fl_augment_plan *plan, const fl_augment_draw *draw,
                     unsigned char **image, unsigned char **spare, int w, int h)
{
    unsigned char fill[3];
    for (int c = 0; c < 3; c++)
        fill[c] = (unsigned char)(int)plan->fill[c];
    for (int i = 0; i < draw->count; i++) {
        if (draw->op[i] == FL_OP_IDENTITY)
            continue;
        double magnitude = fl_augment_magnitude(plan, draw, i, w, h);
        int rc = fl_pil_apply(draw->op[i], magnitude, plan->interpolation, fill, *image, *spare,
                              w, h);
        if (rc != FL_OK)
            return rc;
        unsigned char *t = *image;
        *image = *spare;
        *spare = t;
    }
    return FL_OK;
}

int fl_pil_enhance(int op, float factor, const unsigned char *src, unsigned char *dst, int w,
                   int h)
{
    int kind = op == FL_OP_BRIGHTNESS ? DEGENERATE_BLACK
               : op == FL_OP_COLOR    ? DEGENERATE_GRAY
               : op == FL_OP_CONTRAST ? DEGENERATE_MEAN
                                      : -1;
    if (kind < 0)
        return FL_ERR_INVALID;
    enhance(kind, factor, src, dst, w, h);
    return FL_OK;
}
