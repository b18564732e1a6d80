/* fastload core: see webp.h.
 *
 * Pillow decodes every WebP with libwebp's animation decoder in RGBA and
 * drops the alpha.  A still image (no ANIM chunk) is decoded here with
 * WebPDecode straight into our RGB buffer instead, which gives the same RGB
 * values: libwebp converts each pixel the same way whatever the output
 * layout, and without premultiplication alpha never touches RGB.  An
 * animation goes through the animation decoder as Pillow's does, for its
 * first frame composed on the canvas.
 */
#include "core/image/webp.h"

#include "core/status.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <webp/decode.h>
#include <webp/demux.h>

struct fl_webp {
    unsigned char *pixels; /* RGB output; grows */
    size_t pixels_cap;
};

fl_webp *fl_webp_new(void)
{
    return calloc(1, sizeof(fl_webp));
}

void fl_webp_free(fl_webp *dec)
{
    if (!dec)
        return;
    free(dec->pixels);
    free(dec);
}

/* libwebp's only word for a library of another ABI is a 0 from the init. */
#define ABI_MISMATCH_TEXT                                                                         \
    "libwebp refuses the decoder ABI of the headers fastload was built with "                      \
    "(WEBP_DECODER_ABI_VERSION 0x%04x; the library is %d.%d.%d)"

static void abi_mismatch(char *msg, size_t msg_size)
{
    int v = WebPGetDecoderVersion();
    fl_set_msg(msg, msg_size, ABI_MISMATCH_TEXT, WEBP_DECODER_ABI_VERSION, v >> 16,
               (v >> 8) & 0xFF, v & 0xFF);
}

int fl_webp_check_library(char *msg, size_t msg_size)
{
    WebPDecoderConfig config;
    if (!WebPInitDecoderConfig(&config)) {
        abi_mismatch(msg, msg_size);
        return FL_ERR_INVALID;
    }
    fl_set_msg(msg, msg_size, "%s", "");
    return FL_OK;
}

int fl_is_webp(const unsigned char *data, size_t size)
{
    return size >= 12 && memcmp(data, "RIFF", 4) == 0 && memcmp(data + 8, "WEBP", 4) == 0;
}

static const char *status_text(VP8StatusCode status)
{
    switch (status) {
    case VP8_STATUS_OUT_OF_MEMORY:
        return "out of memory";
    case VP8_STATUS_INVALID_PARAM:
        return "invalid parameter";
    case VP8_STATUS_BITSTREAM_ERROR:
        return "corrupt bitstream";
    case VP8_STATUS_UNSUPPORTED_FEATURE:
        return "unsupported feature";
    case VP8_STATUS_NOT_ENOUGH_DATA:
        return "truncated data";
    default:
        return "decoding failed";
    }
}

static int status_error(VP8StatusCode status, char *msg, size_t msg_size)
{
    fl_set_msg(msg, msg_size, "invalid WebP: %s", status_text(status));
    return status == VP8_STATUS_OUT_OF_MEMORY ? FL_ERR_NOMEM : FL_ERR_DECODE;
}

/* Checks the input and reads its features. */
static int features(const unsigned char *data, size_t size, WebPBitstreamFeatures *out,
                    char *msg, size_t msg_size)
{
    fl_set_msg(msg, msg_size, "%s", "");
    if (!data && size > 0) {
        fl_set_msg(msg, msg_size, "invalid argument");
        return FL_ERR_INVALID;
    }
    if (!fl_is_webp(data, size)) {
        fl_set_msg(msg, msg_size, size == 0 ? "empty input: not a WebP file" : "not a WebP file");
        return FL_ERR_DECODE;
    }
    VP8StatusCode status = WebPGetFeatures(data, size, out);
    if (status != VP8_STATUS_OK)
        return status_error(status, msg, msg_size);
    if (out->width < 1 || out->height < 1) {
        fl_set_msg(msg, msg_size, "invalid WebP: a %d x %d canvas", out->width, out->height);
        return FL_ERR_DECODE;
    }
    return FL_OK;
}

int fl_webp_read_header(const unsigned char *data, size_t size, int *width, int *height,
                        char *msg, size_t msg_size)
{
    WebPBitstreamFeatures f;
    int rc = features(data, size, &f, msg, msg_size);
    if (rc != FL_OK)
        return rc;
    *width = f.width;
    *height = f.height;
    return FL_OK;
}

/* The first frame of an animation, composed on its canvas, to RGB. */
static int first_frame(fl_webp *dec, const unsigned char *data, size_t size, int width,
                       int height, char *msg, size_t msg_size)
{
    WebPAnimDecoderOptions options;
    if (!WebPAnimDecoderOptionsInit(&options)) {
        fl_set_msg(msg, msg_size, "libwebp's animation decoder is not the version built against");
        return FL_ERR_DECODE;
    }
    options.color_mode = MODE_RGBA;
    options.use_threads = 0;
    WebPData whole = {data, size};
    WebPAnimDecoder *anim = WebPAnimDecoderNew(&whole, &options);
    if (!anim) {
        fl_set_msg(msg, msg_size, "invalid WebP: corrupt or truncated animation");
        return FL_ERR_DECODE;
    }
    int rc = FL_OK;
    WebPAnimInfo info;
    uint8_t *canvas = NULL;
    int timestamp;
    if (!WebPAnimDecoderGetInfo(anim, &info) || (int)info.canvas_width != width ||
        (int)info.canvas_height != height) {
        fl_set_msg(msg, msg_size, "invalid WebP: inconsistent canvas size");
        rc = FL_ERR_DECODE;
    } else if (!WebPAnimDecoderGetNext(anim, &canvas, &timestamp) || !canvas) {
        fl_set_msg(msg, msg_size, "invalid WebP: corrupt first frame");
        rc = FL_ERR_DECODE;
    } else {
        size_t n = (size_t)width * (size_t)height;
        for (size_t i = 0; i < n; i++)
            memcpy(dec->pixels + 3 * i, canvas + 4 * i, 3);
    }
    WebPAnimDecoderDelete(anim);
    return rc;
}

int fl_webp_decode(fl_webp *dec, const unsigned char *data, size_t size, uint64_t max_pixels,
                   const unsigned char **rgb, int *width, int *height, size_t *stride, char *msg,
                   size_t msg_size)
{
    if (!dec || !rgb || !width || !height || !stride) {
        fl_set_msg(msg, msg_size, "invalid argument");
        return FL_ERR_INVALID;
    }
    WebPDecoderConfig config;
    if (!WebPInitDecoderConfig(&config)) {
        abi_mismatch(msg, msg_size);
        return FL_ERR_INVALID;
    }
    int rc = features(data, size, &config.input, msg, msg_size);
    if (rc != FL_OK)
        return rc;
    int w = config.input.width, h = config.input.height;
    if ((uint64_t)w * (uint64_t)h > max_pixels) {
        fl_set_msg(msg, msg_size, "image of %d x %d pixels exceeds max_pixels=%llu", w, h,
                (unsigned long long)max_pixels);
        return FL_ERR_TOO_BIG;
    }
    size_t row = (size_t)w * 3, bytes = row * (size_t)h; /* WebP sides are below 2^14 */
    if (bytes > dec->pixels_cap) {
        unsigned char *p = malloc(bytes);
        if (!p) {
            fl_set_msg(msg, msg_size, "out of memory for a %d x %d pixel image", w, h);
            return FL_ERR_NOMEM;
        }
        free(dec->pixels);
        dec->pixels = p;
        dec->pixels_cap = bytes;
    }
    if (config.input.has_animation) {
        rc = first_frame(dec, data, size, w, h, msg, msg_size);
        if (rc != FL_OK)
            return rc;
    } else {
        config.output.colorspace = MODE_RGB;
        config.output.is_external_memory = 1;
        config.output.u.RGBA.rgba = dec->pixels;
        config.output.u.RGBA.stride = (int)row;
        config.output.u.RGBA.size = bytes;
        VP8StatusCode status = WebPDecode(data, size, &config);
        WebPFreeDecBuffer(&config.output); /* nothing to free in our memory; by the book */
        if (status != VP8_STATUS_OK)
            return status_error(status, msg, msg_size);
    }
    *rgb = dec->pixels;
    *width = w;
    *height = h;
    *stride = row;
    return FL_OK;
}
