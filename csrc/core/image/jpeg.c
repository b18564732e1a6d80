/* fastload core: see jpeg.h.
 *
 * libjpeg reports errors by calling error_exit, which must not return.
 * Ours longjmps back to the setjmp in fl_jpeg_decode or fl_jpeg_read_header
 * — the public entry points themselves — or in create() under fl_jpeg_new,
 * so the jump only ever unwinds this
 * file's own frames and libjpeg's, never a lock, the GIL or a caller's
 * frame.  Everything allocated before the jump belongs to the decoder (the
 * pixel and row buffers) or to libjpeg's image pool, which
 * jpeg_abort_decompress releases; no local owns anything, so nothing leaks.
 *
 * Warnings go through emit_message.  Those that mean pixels are missing or
 * made up (premature end of data, corrupt entropy-coded data, lost restart
 * markers) jump out like errors; the rest (unknown JFIF revisions, stray
 * bytes between markers, which some cameras write) are ignored.  Nothing is
 * ever printed.
 *
 * One jpeg_decompress_struct lives as long as the decoder: libjpeg keeps
 * its permanent pool (source manager, tables) across images, and
 * jpeg_abort_decompress after every image returns it to the start state.
 */
#include "core/image/jpeg.h"

#include "core/image/jpeg_restart.h"
#include "core/status.h"

#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h> /* jpeglib.h needs FILE and size_t */
#include <stdlib.h>

#include <jpeglib.h>
#include <jerror.h>

/* Pixels of context kept on each side of the box, at the decoded scale,
 * beyond what the box needs.  jpeg_crop_scanline treats the crop's left and
 * right edges as image edges: fancy (triangle) chroma upsampling there
 * replicates the edge chroma sample instead of blending in its neighbour,
 * which makes the outermost pixel on each side differ from a whole-image
 * decode, and a crop under two chroma samples wide falls back to plain
 * replication altogether.  Two pixels on each side avoid both, so the
 * pixels inside the box are exactly those of a whole-image decode (tests/c
 * checks this for every sampling and scale). */
#define EDGE_MARGIN 2

/* Progressive files may hold any number of scans, and each costs a pass
 * over the coefficients; a tiny file with thousands of scans is a known
 * denial of service.  Real encoders write about ten; libjpeg-turbo's fuzzers
 * allow 500. */
#define MAX_SCANS 500

/* The inverse DCT: the accurate integer one, as Pillow uses.  The
 * definition can be overridden at build time to compare methods. */
#ifndef FL_JPEG_DCT_METHOD
#define FL_JPEG_DCT_METHOD JDCT_ISLOW
#endif

/* libjpeg's working memory beyond the coefficients of a multi-scan image
 * (row buffers, tables): generous for 65500-pixel-wide rows. */
#define MEMORY_SLACK ((uint64_t)64 << 20)

typedef struct fl_jpeg_err {
    struct jpeg_error_mgr pub; /* first: libjpeg sees only this part */
    jmp_buf escape;            /* set by the public entry point running now */
    int status;                /* what that entry point returns after the jump */
    char *msg;                 /* the caller's message buffer, or NULL */
    size_t msg_size;
} fl_jpeg_err;

struct fl_jpeg {
    struct jpeg_decompress_struct cinfo; /* created once, aborted after each image */
    fl_jpeg_err err;                     /* cinfo.err points here */
    struct jpeg_progress_mgr progress;   /* cinfo.progress points here: scan limit */
    unsigned char *pixels;               /* RGB output; grows, handed out via fl_pixels */
    size_t pixels_cap;
    unsigned char *row;                  /* one decoded row: CMYK, or one thrown away */
    size_t row_cap;
    fl_jpeg_restart restart;             /* buffers of the restart-interval cut */
};

/* ------------------------------------------------------------------------ */
/* Messages and libjpeg callbacks                                           */

/* libjpeg's text for its current message, first letter lowercased
 * ("Not a JPEG file" becomes "not a JPEG file", "JPEG..." stays). */
static void take_libjpeg_msg(j_common_ptr cinfo)
{
    fl_jpeg_err *err = (fl_jpeg_err *)cinfo->err;
    if (!err->msg || err->msg_size == 0)
        return;
    if (err->pub.msg_code == JWRN_JPEG_EOF) {
        fl_set_msg(err->msg, err->msg_size, "premature end of JPEG data");
        return;
    }
    char text[JMSG_LENGTH_MAX];
    text[0] = '\0';
    (*cinfo->err->format_message)(cinfo, text);
    if (text[0] >= 'A' && text[0] <= 'Z' && text[1] >= 'a' && text[1] <= 'z')
        text[0] = (char)(text[0] - 'A' + 'a');
    fl_set_msg(err->msg, err->msg_size, "%s", text);
}

static void on_error(j_common_ptr cinfo)
{
    fl_jpeg_err *err = (fl_jpeg_err *)cinfo->err;
    take_libjpeg_msg(cinfo);
    err->status = err->pub.msg_code == JERR_OUT_OF_MEMORY ? FL_ERR_NOMEM : FL_ERR_DECODE;
    longjmp(err->escape, 1);
}

static void on_message(j_common_ptr cinfo, int level)
{
    if (level >= 0)
        return; /* trace output */
    switch (cinfo->err->msg_code) {
    case JWRN_JPEG_EOF:       /* data ran out: the rest would be made up */
    case JWRN_HIT_MARKER:     /* a marker inside entropy-coded data */
    case JWRN_MUST_RESYNC:    /* restart markers lost */
    case JWRN_HUFF_BAD_CODE:  /* corrupt entropy-coded data */
    case JWRN_ARITH_BAD_CODE: /* the same, arithmetic coding */
        on_error(cinfo);
        break;
    default:
        cinfo->err->num_warnings++;
        break;
    }
}

static void on_output(j_common_ptr cinfo)
{
    (void)cinfo; /* never print */
}

static void on_progress(j_common_ptr cinfo)
{
    if (!cinfo->is_decompressor)
        return;
    j_decompress_ptr d = (j_decompress_ptr)cinfo;
    if (d->input_scan_number > MAX_SCANS) {
        fl_jpeg_err *err = (fl_jpeg_err *)cinfo->err;
        fl_set_msg(err->msg, err->msg_size, "JPEG has more than %d scans", MAX_SCANS);
        err->status = FL_ERR_DECODE;
        longjmp(err->escape, 1);
    }
}

/* ------------------------------------------------------------------------ */
/* Decoder lifetime                                                         */

/* jpeg_create_decompress reports running out of memory, and a library of
 * another ABI than our jpeglib.h (JERR_BAD_LIB_VERSION, JERR_BAD_STRUCT_SIZE),
 * through error_exit.  That message is libjpeg's, kept as it words it, for
 * it is the one a search finds. */
static int create(fl_jpeg *dec, char *msg, size_t msg_size)
{
    dec->err.msg = NULL; /* on_error leaves the text to us */
    dec->err.msg_size = 0;
    if (setjmp(dec->err.escape)) {
        char text[JMSG_LENGTH_MAX];
        text[0] = '\0';
        (*dec->err.pub.format_message)((j_common_ptr)&dec->cinfo, text);
        fl_set_msg(msg, msg_size, "libjpeg cannot make a decoder: %s", text);
        return dec->err.status == FL_ERR_NOMEM ? FL_ERR_NOMEM : FL_ERR_INVALID;
    }
    jpeg_create_decompress(&dec->cinfo);
    return FL_OK;
}

int fl_jpeg_new(fl_jpeg **out, char *msg, size_t msg_size)
{
    *out = NULL;
    fl_set_msg(msg, msg_size, "%s", "");
    fl_jpeg *dec = calloc(1, sizeof *dec);
    if (!dec) {
        fl_set_msg(msg, msg_size, "out of memory for a JPEG decoder");
        return FL_ERR_NOMEM;
    }
    dec->cinfo.err = jpeg_std_error(&dec->err.pub);
    dec->err.pub.error_exit = on_error;
    dec->err.pub.emit_message = on_message;
    dec->err.pub.output_message = on_output;
    int rc = create(dec, msg, msg_size);
    if (rc != FL_OK) {
        jpeg_destroy_decompress(&dec->cinfo); /* frees what was made, if anything */
        free(dec);
        return rc;
    }
    dec->progress.progress_monitor = on_progress;
    dec->cinfo.progress = &dec->progress;
    *out = dec; /* the caller owns it */
    return FL_OK;
}

void fl_jpeg_free(fl_jpeg *dec)
{
    if (!dec)
        return;
    jpeg_destroy_decompress(&dec->cinfo);
    free(dec->pixels);
    free(dec->row);
    fl_jpeg_restart_release(&dec->restart);
    free(dec);
}

/* Grows *buf to at least `bytes`, discarding the contents. */
static int reserve(unsigned char **buf, size_t *cap, size_t bytes)
{
    if (bytes <= *cap)
        return FL_OK;
    unsigned char *p = malloc(bytes);
    if (!p)
        return FL_ERR_NOMEM;
    free(*buf);
    *buf = p;
    *cap = bytes;
    return FL_OK;
}

/* ------------------------------------------------------------------------ */
/* Decoding                                                                 */

/* Pillow's CMYK to RGB (Convert.c cmyk2rgb) after its "CMYK;I" unpacker,
 * which inverts every sample because Adobe writes inverted CMYK: with the
 * inverted ink c' = 255 - c and black k' = 255 - k, each channel is
 * (255 - k') - round(c' * (255 - k') / 255), the rounding being
 * ((t >> 8) + t) >> 8 of t = product + 128. */
static void cmyk_to_rgb(const unsigned char *restrict in, size_t n, unsigned char *restrict out)
{
    for (size_t i = 0; i < n; i++) {
        unsigned k = in[4 * i + 3];
        for (int c = 0; c < 3; c++) {
            unsigned t = (255u - in[4 * i + c]) * k + 128u;
            out[3 * i + c] = (unsigned char)(k - (((t >> 8) + t) >> 8));
        }
    }
}

static int ceil_div(int a, int b)
{
    return (int)(((long long)a + b - 1) / b);
}

/* Skips rows at the top of the output.  jpeg_skip_scanlines does the work
 * without colour conversion (and, for single-scan images, without the
 * inverse DCT of whole iMCU rows).  We call it once, from row 0, which is
 * the case its known bugs spare (libjpeg-turbo #915 needs a skip starting
 * inside a row group); releases before 2.0.6 had worse ones (segfaults and
 * hangs with some upsampling and progressive combinations), so there the
 * rows are read and dropped instead. */
static void skip_rows(fl_jpeg *dec, JDIMENSION n)
{
    j_decompress_ptr ci = &dec->cinfo;
    JDIMENSION target = ci->output_scanline + n;
#if defined(LIBJPEG_TURBO_VERSION_NUMBER) && LIBJPEG_TURBO_VERSION_NUMBER >= 2000006
    jpeg_skip_scanlines(ci, n);
#endif
    /* Whatever is left (everything, on old releases) is read and dropped. */
    while (ci->output_scanline < target) {
        JSAMPROW row = dec->row;
        if (jpeg_read_scanlines(ci, &row, 1) != 1)
            ERREXIT(ci, JERR_INPUT_EOF);
    }
}

static int decode(fl_jpeg *dec, const unsigned char *data, size_t size,
                  const fl_jpeg_region *region, uint64_t max_pixels, fl_pixels *out)
{
    j_decompress_ptr ci = &dec->cinfo;
    char *msg = dec->err.msg;
    size_t msg_size = dec->err.msg_size;

    jpeg_mem_src(ci, data, (unsigned long)size);
    jpeg_read_header(ci, TRUE);

    int width = (int)ci->image_width, height = (int)ci->image_height;
    uint64_t pixels = (uint64_t)ci->image_width * ci->image_height;
    if (pixels > max_pixels) {
        fl_set_msg(msg, msg_size, "image is %d x %d pixels, more than the limit of %llu", width,
                height, (unsigned long long)max_pixels);
        return FL_ERR_TOO_BIG;
    }

    fl_jpeg_region whole = {0, 0, width, height, 1};
    const fl_jpeg_region *r = region ? region : &whole;
    int d = r->scale_denom;
    if (d != 1 && d != 2 && d != 4 && d != 8) {
        fl_set_msg(msg, msg_size, "scale_denom is %d, not 1, 2, 4 or 8", d);
        return FL_ERR_INVALID;
    }
    if (r->x < 0 || r->y < 0 || r->width < 1 || r->height < 1 || r->x > width - r->width ||
        r->y > height - r->height) {
        fl_set_msg(msg, msg_size, "crop box %d,%d %dx%d is not inside the %d x %d image", r->x,
                r->y, r->width, r->height, width, height);
        return FL_ERR_INVALID;
    }

    int ncomp = ci->num_components;
    if (ncomp != 1 && ncomp != 3 && ncomp != 4) {
        fl_set_msg(msg, msg_size, "unsupported JPEG with %d colour components", ncomp);
        return FL_ERR_DECODE;
    }
    int cmyk = ci->jpeg_color_space == JCS_CMYK || ci->jpeg_color_space == JCS_YCCK;
    ci->out_color_space = cmyk ? JCS_CMYK : JCS_RGB;
    ci->dct_method = FL_JPEG_DCT_METHOD;
    ci->do_fancy_upsampling = TRUE;    /* Pillow's default too */
    ci->scale_num = 1;
    ci->scale_denom = (unsigned int)d;
    /* Multi-scan images keep every coefficient: at most 2 bytes a sample,
     * padded to whole blocks.  A legitimate image never needs more. */
    uint64_t budget = ((uint64_t)ci->image_width + 32) * ((uint64_t)ci->image_height + 32) *
                          (uint64_t)ncomp * 2 + MEMORY_SLACK;
    ci->mem->max_memory_to_use = budget < (uint64_t)LONG_MAX ? (long)budget : LONG_MAX;

    jpeg_start_decompress(ci);

    int ow = (int)ci->output_width, oh = (int)ci->output_height;
    int sy0 = r->y / d, sy1 = ceil_div(r->y + r->height, d);
    int sx0 = r->x / d, sx1 = ceil_div(r->x + r->width, d);
    if (sy1 > oh)
        sy1 = oh;
    if (sx1 > ow)
        sx1 = ow;
    JDIMENSION xoff = (JDIMENSION)(sx0 > EDGE_MARGIN ? sx0 - EDGE_MARGIN : 0);
    JDIMENSION xend = (JDIMENSION)(sx1 + EDGE_MARGIN < ow ? sx1 + EDGE_MARGIN : ow);
    JDIMENSION cw = xend - xoff;
    jpeg_crop_scanline(ci, &xoff, &cw); /* moves xoff left to an iMCU boundary */

    int rows = sy1 - sy0;
    size_t stride = (size_t)cw * 3;
    int rc = reserve(&dec->pixels, &dec->pixels_cap, stride * (size_t)rows);
    if (rc == FL_OK)
        rc = reserve(&dec->row, &dec->row_cap, (size_t)cw * (size_t)ci->output_components);
    if (rc != FL_OK) {
        fl_set_msg(msg, msg_size, "out of memory for a %u x %d pixel buffer", (unsigned)cw, rows);
        return rc;
    }

    if (sy0 > 0)
        skip_rows(dec, (JDIMENSION)sy0);
    while ((int)ci->output_scanline < sy1) {
        size_t at = (size_t)(ci->output_scanline - (JDIMENSION)sy0);
        JDIMENSION got;
        if (cmyk) {
            JSAMPROW row = dec->row;
            got = jpeg_read_scanlines(ci, &row, 1);
            if (got == 1)
                cmyk_to_rgb(dec->row, cw, dec->pixels + at * stride);
        } else {
            JSAMPROW ptrs[16];
            JDIMENSION want = (JDIMENSION)(sy1 - (int)ci->output_scanline);
            if (want > 16)
                want = 16;
            for (JDIMENSION k = 0; k < want; k++)
                ptrs[k] = dec->pixels + (at + k) * stride;
            got = jpeg_read_scanlines(ci, ptrs, want);
        }
        if (got == 0) {
            /* A memory source never suspends; do not spin if it does. */
            fl_set_msg(msg, msg_size, "JPEG decoder made no progress");
            return FL_ERR_DECODE;
        }
    }
    /* The rows below the box are never decoded: the caller aborts. */

    out->data = dec->pixels;
    out->width = (int)cw;
    out->height = rows;
    out->stride = stride;
    out->box_x = (double)r->x / d - (double)xoff;
    out->box_y = (double)r->y / d - (double)sy0;
    out->box_w = (double)r->width / d;
    out->box_h = (double)r->height / d;
    return FL_OK;
}

/* Decodes the region from the restart intervals that cover it when the
 * file has a usable layout (jpeg_restart.h), else from the file itself.
 * The cut-out file keeps EDGE_MARGIN pixels at the decoded scale around the
 * box inside the image, for the reason given at EDGE_MARGIN: its edges are
 * image edges to libjpeg, horizontally and vertically alike (rows are
 * upsampled from the chroma rows above and below in the same way).  At
 * smaller scales libjpeg-turbo enlarges the chroma IDCT instead of
 * upsampling, so each pixel depends on its own blocks only.  The cut starts
 * on an MCU boundary, a multiple of 8 pixels, so at every scale its origin
 * is a whole pixel of the scaled image and the box is simply moved. */
static int decode_region(fl_jpeg *dec, const unsigned char *data, size_t size,
                         const fl_jpeg_region *region, uint64_t max_pixels, fl_pixels *out)
{
    if (!region || (region->scale_denom != 1 && region->scale_denom != 2 &&
                    region->scale_denom != 4 && region->scale_denom != 8))
        return decode(dec, data, size, region, max_pixels, out);
    fl_jpeg_cut cut;
    int rc = fl_jpeg_restart_cut(&dec->restart, data, size, region->x, region->y,
                                 region->width, region->height,
                                 EDGE_MARGIN * region->scale_denom, &cut);
    if (rc < 0) {
        fl_set_msg(dec->err.msg, dec->err.msg_size, "out of memory for a JPEG region");
        return rc;
    }
    /* Too large an image is refused by the ordinary decode, with its words. */
    if (rc == 0 || (uint64_t)cut.image_width * (uint64_t)cut.image_height > max_pixels)
        return decode(dec, data, size, region, max_pixels, out);
    fl_jpeg_region moved = *region;
    moved.x -= cut.x;
    moved.y -= cut.y;
    return decode(dec, cut.data, cut.size, &moved, max_pixels, out);
}

/* The checks both entry points make before libjpeg sees the bytes; points
 * the error manager at the caller's message buffer. */
static int check_input(fl_jpeg *dec, const unsigned char *data, size_t size, int has_out,
                       char *msg, size_t msg_size)
{
    fl_set_msg(msg, msg_size, "%s", "");
    if (!dec || !has_out || (!data && size > 0)) {
        fl_set_msg(msg, msg_size, "invalid argument");
        return FL_ERR_INVALID;
    }
    if (size == 0) {
        fl_set_msg(msg, msg_size, "empty input: not a JPEG file");
        return FL_ERR_DECODE;
    }
    if (size > ULONG_MAX) {
        fl_set_msg(msg, msg_size, "input of %zu bytes is too large", size);
        return FL_ERR_TOO_BIG;
    }
    dec->err.msg = msg;
    dec->err.msg_size = msg_size;
    return FL_OK;
}

int fl_jpeg_decode(fl_jpeg *dec, const unsigned char *data, size_t size,
                   const fl_jpeg_region *region, uint64_t max_pixels, fl_pixels *out,
                   char *msg, size_t msg_size)
{
    int rc = check_input(dec, data, size, out != NULL, msg, msg_size);
    if (rc != FL_OK)
        return rc;
    if (setjmp(dec->err.escape)) {
        /* Only dec survives the jump, and it was not modified after setjmp. */
        jpeg_abort_decompress(&dec->cinfo);
        return dec->err.status;
    }
    rc = decode_region(dec, data, size, region, max_pixels, out);
    jpeg_abort_decompress(&dec->cinfo);
    return rc;
}

int fl_jpeg_read_header(fl_jpeg *dec, const unsigned char *data, size_t size,
                        fl_jpeg_header *out, char *msg, size_t msg_size)
{
    int rc = check_input(dec, data, size, out != NULL, msg, msg_size);
    if (rc != FL_OK)
        return rc;
    if (setjmp(dec->err.escape)) {
        jpeg_abort_decompress(&dec->cinfo);
        return dec->err.status;
    }
    j_decompress_ptr ci = &dec->cinfo;
    jpeg_mem_src(ci, data, (unsigned long)size);
    jpeg_read_header(ci, TRUE);
    out->width = (int)ci->image_width;
    out->height = (int)ci->image_height;
    out->components = ci->num_components;
    out->progressive = ci->progressive_mode ? 1 : 0;
    jpeg_abort_decompress(ci);
    return FL_OK;
}

int fl_jpeg_complete(const unsigned char *data, size_t size)
{
    /* Walk the marker segments from SOI to the first SOS. */
    size_t pos = 2;
    while (pos + 4 <= size) {
        if (data[pos] != 0xFF)
            return 0;
        unsigned char marker = data[pos + 1];
        if (marker == 0xFF) { /* fill byte */
            pos++;
            continue;
        }
        size_t length = ((size_t)data[pos + 2] << 8) | data[pos + 3];
        if (marker == 0xDA) { /* SOS: entropy data follows; EOI must end it */
            size_t scan = pos + 2 + length;
            for (size_t i = size - 1; i > scan; i--)
                if (data[i] == 0xD9 && data[i - 1] == 0xFF)
                    return 1;
            return 0;
        }
        if (length < 2)
            return 0;
        pos += 2 + length;
    }
    return 0;
}

int fl_jpeg_pick_scale(int crop_w, int crop_h, int out_w, int out_h)
{
    if (crop_w < 1 || crop_h < 1 || out_w < 1 || out_h < 1)
        return 1;
    for (int d = 8; d > 1; d /= 2)
        if ((long long)crop_w >= (long long)out_w * d &&
            (long long)crop_h >= (long long)out_h * d)
            return d;
    return 1;
}
