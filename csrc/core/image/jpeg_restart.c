/* fastload core: see jpeg_restart.h.
 *
 * The cut-out file is the original's SOI, its tables (DQT, DHT), its JFIF
 * and Adobe segments (libjpeg reads the colour space from them), its frame
 * header with the height and width patched, its DRI and SOS, then the
 * selected intervals with restart markers renumbered 0..7 in turn, and
 * EOI.  Other APPn segments and comments are left out: the decode never
 * reads them.  Every selected interval is followed in the original by two
 * marker bytes (RSTn or EOI) and the segments kept are a subset of those
 * before the scan, so the cut-out file is never larger than the original:
 * one buffer of the original's size, kept and reused, always suffices.
 *
 * Inside the entropy-coded data a 0xFF byte is always followed by 0x00
 * (stuffing), a restart marker, or a marker ending the scan, so one memchr
 * pass finds every interval.  The pass must cover the whole scan: the
 * number of intervals is checked against the layout the headers promise,
 * and a file that does not keep the promise is left to the ordinary decode.
 */
#include "core/image/jpeg_restart.h"

#include "core/status.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct layout {
    int width, height;   /* of the image */
    int mcu_w, mcu_h;    /* full-size pixels an MCU covers */
    int per_row;         /* MCUs in a row */
    int rows;            /* MCU rows */
    int k;               /* MCUs an interval (the DRI value) */
    size_t scan;         /* where the entropy-coded data starts */
    size_t header;       /* bytes of the cut-out file's header, written in buf */
    size_t sof;          /* where the frame header starts in buf */
} layout;

void fl_jpeg_restart_release(fl_jpeg_restart *st)
{
    if (!st)
        return;
    free(st->starts);
    free(st->buf);
    memset(st, 0, sizeof *st);
}

static unsigned be16(const unsigned char *p)
{
    return ((unsigned)p[0] << 8) | p[1];
}

/* Reads the segments up to the scan, copying those the cut-out file keeps
 * into buf (at least `size` bytes).  Returns 1 for a single-scan Huffman
 * file with a restart interval that divides the MCUs of a row, else 0. */
static int parse(const unsigned char *d, size_t size, unsigned char *buf, layout *L)
{
    if (size < 4 || d[0] != 0xFF || d[1] != 0xD8)
        return 0;
    size_t pos = 2, n = 2;
    buf[0] = 0xFF;
    buf[1] = 0xD8;
    int have_sof = 0, nf = 0, hmax = 0, vmax = 0;
    unsigned ri = 0;
    for (;;) {
        if (pos + 4 > size || d[pos] != 0xFF)
            return 0;
        unsigned m = d[pos + 1];
        if (m == 0xFF) { /* fill byte */
            pos++;
            continue;
        }
        size_t len = be16(d + pos + 2);
        if (len < 2 || len > size - pos - 2)
            return 0;
        const unsigned char *s = d + pos;
        int keep = 1;
        switch (m) {
        case 0xC0: /* baseline */
        case 0xC1: /* extended sequential, Huffman */
            if (have_sof || len < 8 || s[4] != 8)
                return 0;
            L->height = (int)be16(s + 5);
            L->width = (int)be16(s + 7);
            nf = s[9];
            if (L->height == 0 || L->width == 0 || nf < 1 || nf > 4 ||
                len != 8 + 3 * (size_t)nf)
                return 0;
            for (int c = 0; c < nf; c++) {
                int h = s[11 + 3 * c] >> 4, v = s[11 + 3 * c] & 15;
                if (h < 1 || h > 4 || v < 1 || v > 4)
                    return 0;
                hmax = h > hmax ? h : hmax;
                vmax = v > vmax ? v : vmax;
            }
            have_sof = 1;
            L->sof = n;
            break;
        case 0xC4: /* DHT */
        case 0xDB: /* DQT */
        case 0xE0: /* APP0: JFIF */
        case 0xEE: /* APP14: Adobe's colour transform */
            break;
        case 0xDD: /* DRI */
            if (len != 4)
                return 0;
            ri = be16(s + 4);
            break;
        case 0xDA: { /* SOS */
            if (!have_sof || ri == 0 || len < 6 || s[4] != nf || len != 6 + 2 * (size_t)nf)
                return 0;
            memcpy(buf + n, s, 2 + len);
            n += 2 + len;
            /* One component alone is coded in 8 x 8 blocks of its own,
             * whatever sampling factors the frame declares. */
            L->mcu_w = nf == 1 ? 8 : 8 * hmax;
            L->mcu_h = nf == 1 ? 8 : 8 * vmax;
            L->per_row = (L->width + L->mcu_w - 1) / L->mcu_w;
            L->rows = (L->height + L->mcu_h - 1) / L->mcu_h;
            L->k = (int)ri;
            L->scan = pos + 2 + len;
            L->header = n;
            return L->per_row % L->k == 0;
        }
        default:
            if ((m >= 0xE1 && m <= 0xEF) || m == 0xFE) {
                keep = 0; /* other APPn, COM: not needed to decode */
                break;
            }
            return 0; /* progressive, lossless, arithmetic, DNL, stray markers */
        }
        if (keep) {
            memcpy(buf + n, s, 2 + len);
            n += 2 + len;
        }
        pos += 2 + len;
    }
}

static int reserve(void **buf, size_t *cap, size_t n, size_t elem)
{
    if (n <= *cap)
        return FL_OK;
    void *p = malloc(n * elem);
    if (!p)
        return FL_ERR_NOMEM;
    free(*buf);
    *buf = p;
    *cap = n;
    return FL_OK;
}

/* Finds where each of the `count` intervals starts (starts[count]: two
 * past the end of the last).  Returns 1 when the scan holds exactly
 * `count` intervals, numbered in turn, and ends with EOI; else 0. */
static int find_intervals(const unsigned char *d, size_t size, size_t scan, size_t count,
                          size_t *starts)
{
    size_t i = scan, n = 0;
    starts[0] = scan;
    for (;;) {
        const unsigned char *p = i < size ? memchr(d + i, 0xFF, size - i) : NULL;
        if (!p)
            return 0;
        size_t j = (size_t)(p - d);
        if (j + 1 >= size)
            return 0;
        unsigned m = d[j + 1];
        if (m == 0x00) {
            i = j + 2;
        } else if (m >= 0xD0 && m <= 0xD7) {
            if (m - 0xD0 != n % 8 || ++n >= count)
                return 0;
            starts[n] = i = j + 2;
        } else if (m == 0xD9) {
            if (n + 1 != count)
                return 0;
            starts[count] = j + 2;
            return 1;
        } else {
            return 0; /* fill bytes, another scan, anything else */
        }
    }
}

int fl_jpeg_restart_cut(fl_jpeg_restart *st, const unsigned char *data, size_t size, int x,
                        int y, int w, int h, int margin, fl_jpeg_cut *out)
{
    if (!st || !data || !out || size < 4 || margin < 0)
        return 0;
    if (reserve((void **)&st->buf, &st->buf_cap, size, 1) != FL_OK)
        return FL_ERR_NOMEM;
    layout L = {0};
    if (!parse(data, size, st->buf, &L))
        return 0;
    if (x < 0 || y < 0 || w < 1 || h < 1 || x > L.width - w || y > L.height - h)
        return 0;

    /* The rectangle of intervals covering the box and its margin. */
    int ex0 = x > margin ? x - margin : 0, ey0 = y > margin ? y - margin : 0;
    int ex1 = w + margin < L.width - x ? x + w + margin : L.width;
    int ey1 = h + margin < L.height - y ? y + h + margin : L.height;
    int ipr = L.per_row / L.k;
    int i0 = ex0 / L.mcu_w / L.k, i1 = (ex1 - 1) / L.mcu_w / L.k;
    int r0 = ey0 / L.mcu_h, r1 = (ey1 - 1) / L.mcu_h;
    /* libjpeg-turbo upsamples a component under three samples wide by
     * replication, not the triangle filter: a cut of one partial MCU at the
     * image's right (or bottom) edge takes the interval (row) before it too. */
    if (i0 > 0 && L.width - i0 * L.k * L.mcu_w <= L.mcu_w)
        i0--;
    if (r0 > 0 && L.height - r0 * L.mcu_h <= L.mcu_h)
        r0--;
    /* Today's region decode entropy-decodes every interval down to r1. */
    uint64_t cut = (uint64_t)(r1 - r0 + 1) * (uint64_t)(i1 - i0 + 1);
    uint64_t plain = (uint64_t)(r1 + 1) * (uint64_t)ipr;
    if (cut * 10 > plain * 9)
        return 0;

    size_t count = (size_t)L.rows * (size_t)ipr;
    if (reserve((void **)&st->starts, &st->starts_cap, count + 1, sizeof(size_t)) != FL_OK)
        return FL_ERR_NOMEM;
    if (!find_intervals(data, size, L.scan, count, st->starts))
        return 0;

    int sx = i0 * L.k * L.mcu_w, sy = r0 * L.mcu_h;
    int sx1 = (i1 + 1) * L.k * L.mcu_w, sy1 = (r1 + 1) * L.mcu_h;
    int sw = (sx1 < L.width ? sx1 : L.width) - sx;
    int sh = (sy1 < L.height ? sy1 : L.height) - sy;
    unsigned char *b = st->buf;
    b[L.sof + 5] = (unsigned char)(sh >> 8);
    b[L.sof + 6] = (unsigned char)sh;
    b[L.sof + 7] = (unsigned char)(sw >> 8);
    b[L.sof + 8] = (unsigned char)sw;
    size_t n = L.header;
    unsigned marker = 0;
    for (int r = r0; r <= r1; r++) {
        for (int i = i0; i <= i1; i++) {
            size_t at = (size_t)r * (size_t)ipr + (size_t)i;
            size_t from = st->starts[at], len = st->starts[at + 1] - 2 - from;
            if (len + 4 > st->buf_cap - n)
                return 0; /* cannot happen: see the comment at the top */
            if (r > r0 || i > i0) {
                b[n++] = 0xFF;
                b[n++] = (unsigned char)(0xD0 + marker);
                marker = (marker + 1) % 8;
            }
            memcpy(b + n, data + from, len);
            n += len;
        }
    }
    b[n++] = 0xFF;
    b[n++] = 0xD9;

    out->data = b;
    out->size = n;
    out->x = sx;
    out->y = sy;
    out->width = sw;
    out->height = sh;
    out->image_width = L.width;
    out->image_height = L.height;
    return 1;
}
