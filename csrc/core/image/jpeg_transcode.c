/* fastload core: see jpeg_transcode.h.
 *
 * libjpeg reports errors by calling error_exit, which longjmps back to the
 * setjmp in fl_jpeg_add_restarts.  Everything the jump could strand lives
 * in one heap block (both codec structs, the error manager, the output
 * buffer) whose pointer is not modified after setjmp, so the exit path
 * releases it all whichever way it is reached.  Warnings that mean the
 * coefficients are incomplete or made up (truncation, corrupt data, lost
 * restart markers) are errors here too: a rewrite must never invent data.
 *
 * The output goes to a destination manager of our own rather than
 * jpeg_mem_dest, whose buffer is lost when an error strikes after it grew.
 */
#include "core/image/jpeg_transcode.h"

#include "core/status.h"

#include <limits.h>
#include <setjmp.h>
#include <stddef.h>
#include <stdio.h> /* jpeglib.h needs FILE and size_t */
#include <stdlib.h>

#include <jpeglib.h>
#include <jerror.h>

/* As in jpeg.c: progressive files with more scans are refused (a known
 * denial of service), and libjpeg's working memory beyond the coefficients
 * is capped. */
#define MAX_SCANS 500
#define MEMORY_SLACK ((uint64_t)64 << 20)

typedef struct transcoder {
    struct jpeg_decompress_struct src;
    struct jpeg_compress_struct dst;
    struct jpeg_error_mgr err;       /* shared by src and dst */
    struct jpeg_progress_mgr progress;
    struct jpeg_destination_mgr dest;
    jmp_buf escape;
    int status;                      /* returned after a jump */
    char *msg;
    size_t msg_size;
    unsigned char *buf;              /* owned: the output, grown by doubling */
    size_t cap;
    size_t size;                     /* bytes written, once finished */
} transcoder;

static transcoder *of(j_common_ptr cinfo)
{
    /* err is the first thing libjpeg can hand back that leads to us. */
    return (transcoder *)((char *)cinfo->err - offsetof(transcoder, err));
}

static void on_error(j_common_ptr cinfo)
{
    transcoder *t = of(cinfo);
    char text[JMSG_LENGTH_MAX];
    text[0] = '\0';
    if (cinfo->err->msg_code == JWRN_JPEG_EOF)
        snprintf(text, sizeof text, "premature end of JPEG data");
    else
        (*cinfo->err->format_message)(cinfo, text);
    if (text[0] >= 'A' && text[0] <= 'Z' && text[1] >= 'a' && text[1] <= 'z')
        text[0] = (char)(text[0] - 'A' + 'a');
    fl_set_msg(t->msg, t->msg_size, "%s", text);
    t->status = cinfo->err->msg_code == JERR_OUT_OF_MEMORY ? FL_ERR_NOMEM : FL_ERR_DECODE;
    longjmp(t->escape, 1);
}

static void on_message(j_common_ptr cinfo, int level)
{
    if (level >= 0)
        return;
    switch (cinfo->err->msg_code) {
    case JWRN_JPEG_EOF:
    case JWRN_HIT_MARKER:
    case JWRN_MUST_RESYNC:
    case JWRN_HUFF_BAD_CODE:
    case JWRN_ARITH_BAD_CODE:
        on_error(cinfo);
        break;
    default:
        cinfo->err->num_warnings++;
        break;
    }
}

static void on_output(j_common_ptr cinfo)
{
    (void)cinfo;
}

static void on_progress(j_common_ptr cinfo)
{
    if (!cinfo->is_decompressor)
        return;
    if (((j_decompress_ptr)cinfo)->input_scan_number > MAX_SCANS) {
        transcoder *t = of(cinfo);
        fl_set_msg(t->msg, t->msg_size, "JPEG has more than %d scans", MAX_SCANS);
        t->status = FL_ERR_DECODE;
        longjmp(t->escape, 1);
    }
}

/* The destination: t->buf, doubled whenever it fills. */
static void dest_init(j_compress_ptr cinfo)
{
    transcoder *t = of((j_common_ptr)cinfo);
    t->dest.next_output_byte = t->buf;
    t->dest.free_in_buffer = t->cap;
}

static boolean dest_empty(j_compress_ptr cinfo)
{
    transcoder *t = of((j_common_ptr)cinfo);
    size_t cap = t->cap * 2;
    if (cap > (size_t)INT_MAX) {
        fl_set_msg(t->msg, t->msg_size, "rewritten JPEG would exceed %d bytes", INT_MAX);
        t->status = FL_ERR_TOO_BIG;
        longjmp(t->escape, 1);
    }
    unsigned char *p = realloc(t->buf, cap);
    if (!p)
        ERREXIT1(cinfo, JERR_OUT_OF_MEMORY, 0);
    t->buf = p;
    /* Called only when the buffer is full. */
    t->dest.next_output_byte = p + t->cap;
    t->dest.free_in_buffer = cap - t->cap;
    t->cap = cap;
    return TRUE;
}

static void dest_term(j_compress_ptr cinfo)
{
    (void)cinfo;
}

/* The largest divisor of n not above most (at least 1). */
static int divisor_up_to(int n, int most)
{
    for (int k = most < n ? most : n; k > 1; k--)
        if (n % k == 0)
            return k;
    return 1;
}

static int transcode(transcoder *t, const unsigned char *data, size_t size, int max_interval,
                     int optimize, uint64_t max_pixels, int *interval)
{
    j_decompress_ptr src = &t->src;
    j_compress_ptr dst = &t->dst;
    jpeg_mem_src(src, data, (unsigned long)size);
    jpeg_read_header(src, TRUE);
    uint64_t pixels = (uint64_t)src->image_width * src->image_height;
    if (pixels > max_pixels) {
        fl_set_msg(t->msg, t->msg_size, "image is %u x %u pixels, more than the limit of %llu",
                   (unsigned)src->image_width, (unsigned)src->image_height,
                   (unsigned long long)max_pixels);
        return FL_ERR_TOO_BIG;
    }
    uint64_t budget = ((uint64_t)src->image_width + 32) * ((uint64_t)src->image_height + 32) *
                          (uint64_t)src->num_components * 2 + MEMORY_SLACK;
    src->mem->max_memory_to_use = budget < (uint64_t)LONG_MAX ? (long)budget : LONG_MAX;
    jvirt_barray_ptr *coef = jpeg_read_coefficients(src);
    if (!coef) {
        fl_set_msg(t->msg, t->msg_size, "JPEG decoder made no progress");
        return FL_ERR_DECODE;
    }

    jpeg_copy_critical_parameters(src, dst);
    dst->optimize_coding = optimize ? TRUE : FALSE;
    int mcu_w = 8;
    if (dst->num_components > 1)
        for (int c = 0; c < dst->num_components; c++)
            if (8 * dst->comp_info[c].h_samp_factor > mcu_w)
                mcu_w = 8 * dst->comp_info[c].h_samp_factor;
    int per_row = (int)((dst->image_width + (JDIMENSION)mcu_w - 1) / (JDIMENSION)mcu_w);
    int k = divisor_up_to(per_row, max_interval ? max_interval : FL_JPEG_RESTART_DEFAULT_MAX);
    dst->restart_interval = (unsigned int)k;
    dst->mem->max_memory_to_use = src->mem->max_memory_to_use;

    t->cap = size + size / 8 + 4096;
    t->buf = malloc(t->cap);
    if (!t->buf) {
        fl_set_msg(t->msg, t->msg_size, "out of memory for a %zu-byte JPEG", t->cap);
        return FL_ERR_NOMEM;
    }
    t->dest.init_destination = dest_init;
    t->dest.empty_output_buffer = dest_empty;
    t->dest.term_destination = dest_term;
    dst->dest = &t->dest;
    jpeg_write_coefficients(dst, coef);
    jpeg_finish_compress(dst);
    jpeg_finish_decompress(src);
    t->size = t->cap - t->dest.free_in_buffer;
    if (interval)
        *interval = k;
    return FL_OK;
}

/* The setjmp frame: t is the only state, and it is not modified here. */
static int run(transcoder *t, const unsigned char *data, size_t size, int max_interval,
               int optimize, uint64_t max_pixels, int *interval)
{
    if (setjmp(t->escape))
        return t->status;
    jpeg_create_decompress(&t->src);
    t->src.progress = &t->progress;
    jpeg_create_compress(&t->dst);
    return transcode(t, data, size, max_interval, optimize, max_pixels, interval);
}

int fl_jpeg_add_restarts(const unsigned char *data, size_t size, int max_interval,
                         int optimize, uint64_t max_pixels, unsigned char **out, size_t *out_size,
                         int *interval, char *msg, size_t msg_size)
{
    fl_set_msg(msg, msg_size, "%s", "");
    if (!out || !out_size || (!data && size > 0) || max_interval < 0) {
        fl_set_msg(msg, msg_size, "invalid argument");
        return FL_ERR_INVALID;
    }
    *out = NULL;
    *out_size = 0;
    if (size == 0) {
        fl_set_msg(msg, msg_size, "empty input: not a JPEG file");
        return FL_ERR_DECODE;
    }
    if (size > (size_t)INT_MAX) {
        fl_set_msg(msg, msg_size, "input of %zu bytes is too large", size);
        return FL_ERR_TOO_BIG;
    }
    transcoder *t = calloc(1, sizeof *t);
    if (!t) {
        fl_set_msg(msg, msg_size, "out of memory for a JPEG transcoder");
        return FL_ERR_NOMEM;
    }
    t->msg = msg;
    t->msg_size = msg_size;
    t->src.err = jpeg_std_error(&t->err);
    t->dst.err = &t->err;
    t->err.error_exit = on_error;
    t->err.emit_message = on_message;
    t->err.output_message = on_output;
    t->progress.progress_monitor = on_progress;
    int rc = run(t, data, size, max_interval, optimize, max_pixels, interval);
    /* Safe on structs never created: calloc left their memory managers NULL. */
    jpeg_destroy_compress(&t->dst);
    jpeg_destroy_decompress(&t->src);
    if (rc == FL_OK) {
        *out = t->buf; /* the caller owns it now */
        *out_size = t->size;
    } else {
        free(t->buf);
    }
    free(t);
    return rc;
}
