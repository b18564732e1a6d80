/* fastload core: see png.h.
 *
 * libpng reports errors by calling our error function, which must not
 * return: it records the message and longjmps to the setjmp in the public
 * entry point running now, so the jump only unwinds this file's frames and
 * libpng's.  libpng's structs for the image live in the decoder (not in
 * locals that a longjmp could leave stale), and png_destroy_read_struct
 * frees everything libpng allocated; our own buffers belong to the decoder
 * and are kept.  Warnings (benign errors included) are ignored, except the
 * one libpng gives as it refuses to make a read struct for headers of
 * another version, which becomes the message; nothing is ever printed.
 *
 * libpng is asked for the image's own samples (depth < 8 unpacked to a byte
 * each, nothing else transformed), and each row is then turned into RGB by
 * Pillow's rules, which are (Pillow's PNG mode, then convert("RGB")):
 *
 *   gray 1, 2, 4 bit    "1" / "L": v * 255 / (2^depth - 1) (bits replicated)
 *   gray 8 bit          "L": v, v, v
 *   gray 16 bit         "I;16": min(v, 255) — clipped, not scaled
 *   gray + alpha 8/16   "LA" / "RGBA" from "LA;16B": the gray value's high
 *                       byte, alpha dropped
 *   RGB 8/16            "RGB" from "RGB;16B": each sample's high byte
 *   RGBA 8/16           "RGBA" from "RGBA;16B": high bytes, alpha dropped
 *   palette 1-8 bit     "P": the PLTE entry; an index past the palette's end
 *                       is black
 *
 * A tRNS chunk never changes a pixel (Pillow keeps it in info only), nor do
 * gAMA, cHRM, sRGB, iCCP, sBIT or bKGD (convert ignores them): all are
 * skipped.  tests/test_png_webp.py checks each rule against Pillow.
 */
#include "core/image/png.h"

#include "core/status.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <png.h>

/* Chunks libpng would otherwise read and interpret, none of which changes
 * the pixels convert("RGB") gives: handled as unknown, that is skipped
 * (their CRCs are still checked; a bad one is a warning, as libpng treats
 * ancillary chunks). */
static const png_byte SKIPPED_CHUNKS[] = "bKGD\0cHRM\0eXIf\0gAMA\0hIST\0iCCP\0iTXt\0oFFs\0"
                                         "pCAL\0pHYs\0sBIT\0sCAL\0sPLT\0sRGB\0tEXt\0tIME\0"
                                         "tRNS\0zTXt";

struct fl_png {
    png_structp png;          /* libpng's state for the image being decoded, else NULL */
    png_infop info;
    const unsigned char *data; /* the input and how much of it libpng has read */
    size_t size, pos;
    int truncated;            /* the input ran out */
    int creating;             /* inside png_create_read_struct: a warning is why it fails */
    int refused;              /* and libpng gave one */
    int status;               /* returned after a jump */
    char *msg;                /* the caller's message buffer, or NULL */
    size_t msg_size;
    unsigned char palette[256 * 3]; /* RGB, black past the PLTE's end */
    unsigned char *pixels;    /* RGB output; grows */
    size_t pixels_cap;
    unsigned char *raw;       /* libpng's rows: one row, or the whole image if interlaced */
    size_t raw_cap;
    png_bytep *rows;          /* row pointers for an interlaced image */
    size_t rows_cap;
};

fl_png *fl_png_new(void)
{
    return calloc(1, sizeof(fl_png));
}

void fl_png_free(fl_png *dec)
{
    if (!dec)
        return;
    free(dec->pixels);
    free(dec->raw);
    free(dec->rows);
    free(dec);
}

int fl_is_png(const unsigned char *data, size_t size)
{
    static const unsigned char signature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
    return size >= 8 && memcmp(data, signature, 8) == 0;
}

/* Grows *buf to at least `bytes`, discarding the contents. */
static int reserve(void **buf, size_t *cap, size_t bytes)
{
    if (bytes <= *cap)
        return FL_OK;
    void *p = malloc(bytes);
    if (!p)
        return FL_ERR_NOMEM;
    free(*buf);
    *buf = p;
    *cap = bytes;
    return FL_OK;
}

/* ------------------------------------------------------------------------ */
/* libpng callbacks                                                         */

static void on_error(png_structp png, png_const_charp text)
{
    fl_png *dec = png_get_error_ptr(png);
    if (dec->truncated) {
        fl_set_msg(dec->msg, dec->msg_size, "truncated PNG data: the file ends after %zu bytes",
                dec->size);
        dec->status = FL_ERR_DECODE;
    } else if (strstr(text, "memory")) { /* "Out of memory", "Insufficient memory" */
        fl_set_msg(dec->msg, dec->msg_size, "PNG decoder out of memory (%s)", text);
        dec->status = FL_ERR_NOMEM;
    } else {
        fl_set_msg(dec->msg, dec->msg_size, "invalid PNG: %s", text);
        dec->status = FL_ERR_DECODE;
    }
    png_longjmp(png, 1);
}

/* Warnings are ignored, except the one png_create_read_struct gives before
 * it returns NULL: libpng is not of the version of the headers we were built
 * with ("Application built with libpng-1.5.30 but running with 1.6.39"). */
static void on_warning(png_structp png, png_const_charp text)
{
    fl_png *dec = png_get_error_ptr(png);
    if (dec && dec->creating) {
        dec->refused = 1;
        fl_set_msg(dec->msg, dec->msg_size, "libpng cannot make a decoder: %s", text);
    }
}

static void read_bytes(png_structp png, png_bytep out, size_t n)
{
    fl_png *dec = png_get_io_ptr(png);
    if (n > dec->size - dec->pos) {
        dec->truncated = 1;
        png_error(png, "truncated");
    }
    memcpy(out, dec->data + dec->pos, n);
    dec->pos += n;
}

/* ------------------------------------------------------------------------ */
/* One image                                                                */

/* Makes libpng's structs, with dec->msg set.  libpng tells a library of
 * another version (which it refuses) from running out of memory only in
 * a warning, which on_warning keeps as the message. */
static int create(fl_png *dec)
{
    fl_set_msg(dec->msg, dec->msg_size, "%s", "");
    dec->creating = 1;
    dec->refused = 0;
    dec->png = png_create_read_struct(PNG_LIBPNG_VER_STRING, dec, on_error, on_warning);
    dec->creating = 0;
    if (!dec->png && dec->refused)
        return FL_ERR_INVALID;
    if (dec->png)
        dec->info = png_create_info_struct(dec->png);
    if (!dec->png || !dec->info) {
        png_destroy_read_struct(&dec->png, &dec->info, NULL);
        fl_set_msg(dec->msg, dec->msg_size, "out of memory for the PNG decoder");
        return FL_ERR_NOMEM;
    }
    return FL_OK;
}

int fl_png_check_library(char *msg, size_t msg_size)
{
    fl_png dec = {.msg = msg, .msg_size = msg_size};
    int rc = create(&dec);
    png_destroy_read_struct(&dec.png, &dec.info, NULL);
    return rc;
}

/* Makes libpng's structs for the bytes in data[0 .. size). */
static int begin(fl_png *dec, const unsigned char *data, size_t size, char *msg,
                 size_t msg_size)
{
    fl_set_msg(msg, msg_size, "%s", "");
    if (!dec || (!data && size > 0)) {
        fl_set_msg(msg, msg_size, "invalid argument");
        return FL_ERR_INVALID;
    }
    if (!fl_is_png(data, size)) {
        fl_set_msg(msg, msg_size, size == 0 ? "empty input: not a PNG file" : "not a PNG file");
        return FL_ERR_DECODE;
    }
    dec->data = data;
    dec->size = size;
    dec->pos = 0;
    dec->truncated = 0;
    dec->status = FL_ERR_DECODE;
    dec->msg = msg;
    dec->msg_size = msg_size;
    return create(dec);
}

static void end(fl_png *dec)
{
    png_destroy_read_struct(&dec->png, &dec->info, NULL); /* sets both to NULL */
}

/* Reads the chunks up to the image data (inside the setjmp). */
static void read_info(fl_png *dec)
{
    png_structp png = dec->png;
    png_set_read_fn(png, dec, read_bytes);
    /* Widths and heights up to PNG's own limit: max_pixels is the cap. */
    png_set_user_limits(png, PNG_UINT_31_MAX, PNG_UINT_31_MAX);
#ifdef PNG_MAXIMUM_INFLATE_WINDOW
    /* Some encoders declare a smaller zlib window than they use; zlib
     * (and so Pillow) decodes such streams, libpng refuses them unless
     * told to use the full window. */
    png_set_option(png, PNG_MAXIMUM_INFLATE_WINDOW, PNG_OPTION_ON);
#endif
    png_set_keep_unknown_chunks(png, PNG_HANDLE_CHUNK_NEVER, NULL, 0);
    png_set_keep_unknown_chunks(png, PNG_HANDLE_CHUNK_NEVER, SKIPPED_CHUNKS,
                                (int)(sizeof SKIPPED_CHUNKS / 5));
    png_read_info(png, dec->info);
}

/* One row of libpng's samples (depth < 8 already one byte a sample) to RGB,
 * by the rules at the top of this file. */
static void row_to_rgb(const fl_png *dec, const unsigned char *restrict in,
                       unsigned char *restrict out, size_t width, int color_type, int depth)
{
    size_t x;
    switch (color_type) {
    case PNG_COLOR_TYPE_GRAY:
        if (depth == 16) {
            for (x = 0; x < width; x++) {
                unsigned v = ((unsigned)in[2 * x] << 8) | in[2 * x + 1];
                out[3 * x] = out[3 * x + 1] = out[3 * x + 2] = (unsigned char)(v > 255 ? 255 : v);
            }
        } else {
            unsigned scale = 255u / ((1u << depth) - 1u); /* 255, 85, 17 or 1 */
            for (x = 0; x < width; x++)
                out[3 * x] = out[3 * x + 1] = out[3 * x + 2] = (unsigned char)(in[x] * scale);
        }
        break;
    case PNG_COLOR_TYPE_GRAY_ALPHA: {
        size_t step = depth == 16 ? 4 : 2;
        for (x = 0; x < width; x++)
            out[3 * x] = out[3 * x + 1] = out[3 * x + 2] = in[step * x];
        break;
    }
    case PNG_COLOR_TYPE_RGB:
        if (depth == 16) {
            for (x = 0; x < 3 * width; x++)
                out[x] = in[2 * x];
        } else {
            memcpy(out, in, 3 * width);
        }
        break;
    case PNG_COLOR_TYPE_RGB_ALPHA: {
        size_t step = depth == 16 ? 8 : 4, sample = depth == 16 ? 2 : 1;
        for (x = 0; x < width; x++)
            for (size_t c = 0; c < 3; c++)
                out[3 * x + c] = in[step * x + sample * c];
        break;
    }
    default: /* PNG_COLOR_TYPE_PALETTE */
        for (x = 0; x < width; x++)
            memcpy(out + 3 * x, dec->palette + 3 * (size_t)in[x], 3);
        break;
    }
}

/* The whole decode (inside the setjmp). */
static int decode(fl_png *dec, uint64_t max_pixels, const unsigned char **rgb, int *width,
                  int *height, size_t *stride)
{
    png_structp png = dec->png;
    png_infop info = dec->info;
    read_info(dec);
    png_uint_32 w, h;
    int depth, color_type, interlace;
    png_get_IHDR(png, info, &w, &h, &depth, &color_type, &interlace, NULL, NULL);
    if ((uint64_t)w * h > max_pixels) {
        fl_set_msg(dec->msg, dec->msg_size, "image of %u x %u pixels exceeds max_pixels=%llu",
                (unsigned)w, (unsigned)h, (unsigned long long)max_pixels);
        return FL_ERR_TOO_BIG;
    }
    if (color_type == PNG_COLOR_TYPE_PALETTE) {
        png_colorp entries = NULL;
        int n = 0;
        memset(dec->palette, 0, sizeof dec->palette);
        if (png_get_PLTE(png, info, &entries, &n) && entries) {
            for (int i = 0; i < n && i < 256; i++) {
                dec->palette[3 * i] = entries[i].red;
                dec->palette[3 * i + 1] = entries[i].green;
                dec->palette[3 * i + 2] = entries[i].blue;
            }
        }
    }
    if (depth < 8)
        png_set_packing(png);
    int passes = png_set_interlace_handling(png);
    png_read_update_info(png, info);
    size_t rowbytes = png_get_rowbytes(png, info);

    size_t out_stride = (size_t)w * 3;
    if ((uint64_t)w * h > (uint64_t)(SIZE_MAX / 8)) {
        fl_set_msg(dec->msg, dec->msg_size, "image of %u x %u pixels is too large", (unsigned)w,
                (unsigned)h);
        return FL_ERR_TOO_BIG;
    }
    /* 8-bit RGB rows are already what we want: libpng writes them in place. */
    int in_place = color_type == PNG_COLOR_TYPE_RGB && depth == 8;
    int rc = reserve((void **)&dec->pixels, &dec->pixels_cap, out_stride * h);
    size_t raw_rows = passes > 1 ? h : 1;
    if (rc == FL_OK && !in_place)
        rc = reserve((void **)&dec->raw, &dec->raw_cap, rowbytes * raw_rows);
    if (rc == FL_OK && passes > 1)
        rc = reserve((void **)&dec->rows, &dec->rows_cap, sizeof(png_bytep) * h);
    if (rc != FL_OK) {
        fl_set_msg(dec->msg, dec->msg_size, "out of memory for a %u x %u pixel image",
                (unsigned)w, (unsigned)h);
        return rc;
    }

    if (passes > 1) {
        /* Adam7: every pass revisits every row, so all rows stay at hand. */
        for (png_uint_32 y = 0; y < h; y++)
            dec->rows[y] = in_place ? dec->pixels + y * out_stride : dec->raw + y * rowbytes;
        png_read_image(png, dec->rows);
        if (!in_place)
            for (png_uint_32 y = 0; y < h; y++)
                row_to_rgb(dec, dec->rows[y], dec->pixels + y * out_stride, w, color_type,
                           depth);
    } else {
        for (png_uint_32 y = 0; y < h; y++) {
            unsigned char *out = dec->pixels + y * out_stride;
            png_read_row(png, in_place ? out : dec->raw, NULL);
            if (!in_place)
                row_to_rgb(dec, dec->raw, out, w, color_type, depth);
        }
    }
    /* The chunks after the image data (IEND) are not read: Pillow does not
     * need them either. */
    *rgb = dec->pixels;
    *width = (int)w;
    *height = (int)h;
    *stride = out_stride;
    return FL_OK;
}

int fl_png_decode(fl_png *dec, const unsigned char *data, size_t size, uint64_t max_pixels,
                  const unsigned char **rgb, int *width, int *height, size_t *stride, char *msg,
                  size_t msg_size)
{
    if (!rgb || !width || !height || !stride) {
        fl_set_msg(msg, msg_size, "invalid argument");
        return FL_ERR_INVALID;
    }
    int rc = begin(dec, data, size, msg, msg_size);
    if (rc != FL_OK)
        return rc;
    if (setjmp(png_jmpbuf(dec->png))) {
        /* Only dec survives the jump, and libpng's structs live in it. */
        end(dec);
        return dec->status;
    }
    int result = decode(dec, max_pixels, rgb, width, height, stride);
    end(dec);
    return result;
}

int fl_png_read_header(fl_png *dec, const unsigned char *data, size_t size, int *width,
                       int *height, char *msg, size_t msg_size)
{
    if (!width || !height) {
        fl_set_msg(msg, msg_size, "invalid argument");
        return FL_ERR_INVALID;
    }
    int rc = begin(dec, data, size, msg, msg_size);
    if (rc != FL_OK)
        return rc;
    if (setjmp(png_jmpbuf(dec->png))) {
        end(dec);
        return dec->status;
    }
    read_info(dec);
    *width = (int)png_get_image_width(dec->png, dec->info);
    *height = (int)png_get_image_height(dec->png, dec->info);
    end(dec);
    return FL_OK;
}
