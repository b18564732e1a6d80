/* fastload core: see pil_color.h. */
#include "core/image/pil_color.h"

#include "core/image/pil_ops.h"
#include "core/status.h"

#include <math.h>
#include <string.h>

static inline unsigned char clip8(int v)
{
    return v <= 0 ? 0 : v >= 255 ? 255 : (unsigned char)v;
}

/* Pillow's rgb2hsv_row: colorsys.py's formulas, float variables, double
 * intermediates where its C literals make them double, truncated. */
static inline void rgb_to_hsv1(const unsigned char *in, unsigned char *out)
{
    unsigned char r = in[0], g = in[1], b = in[2];
    unsigned char maxc = r > g ? (r > b ? r : b) : (g > b ? g : b);
    unsigned char minc = r < g ? (r < b ? r : b) : (g < b ? g : b);
    unsigned char uh = 0, us = 0;
    if (maxc != minc) {
        float cr = (float)(maxc - minc);
        float s = cr / (float)maxc;
        float rc = (float)(maxc - r) / cr;
        float gc = (float)(maxc - g) / cr;
        float bc = (float)(maxc - b) / cr;
        float h;
        if (r == maxc)
            h = bc - gc;
        else if (g == maxc)
            h = (float)(2.0 + rc - bc);
        else
            h = (float)(4.0 + gc - rc);
        h = (float)fmod(h / 6.0 + 1.0, 1.0); /* a negative h wraps into [0, 1) */
        uh = clip8((int)(h * 255.0));
        us = clip8((int)(s * 255.0));
    }
    out[0] = uh;
    out[1] = us;
    out[2] = maxc;
}

/* Pillow's hsv2rgb for one pixel. */
static inline void hsv_to_rgb1(const unsigned char *in, unsigned char *out)
{
    unsigned char h = in[0], s = in[1], v = in[2];
    if (s == 0) {
        out[0] = out[1] = out[2] = v;
        return;
    }
    int i = (int)floor((float)h * 6.0 / 255.0); /* 0..6 */
    float f = (float)((float)h * 6.0 / 255.0 - (float)i);
    float fs = (float)((float)s / 255.0);
    unsigned char p = clip8((int)round((float)v * (1.0 - fs)));
    unsigned char q = clip8((int)round((float)v * (1.0 - fs * f)));
    unsigned char t = clip8((int)round((float)v * (1.0 - fs * (1.0 - f))));
    /* Pillow's switch on i % 6, as (r, g, b) per sextant of the hue */
    const unsigned char sextants[6][3] = {{v, t, p}, {q, v, p}, {p, v, t},
                                          {p, q, v}, {t, p, v}, {v, p, q}};
    memcpy(out, sextants[i % 6], 3);
}

void fl_pil_rgb_to_hsv(const unsigned char *src, unsigned char *dst, size_t pixels)
{
    for (size_t i = 0; i < 3 * pixels; i += 3)
        rgb_to_hsv1(src + i, dst + i);
}

void fl_pil_hsv_to_rgb(const unsigned char *src, unsigned char *dst, size_t pixels)
{
    for (size_t i = 0; i < 3 * pixels; i += 3)
        hsv_to_rgb1(src + i, dst + i);
}

void fl_pil_adjust_hue(const unsigned char *src, unsigned char *dst, size_t pixels,
                       double hue_factor)
{
    /* np.array(hue_factor * 255).astype(np.uint8): truncated toward zero,
     * then taken modulo 256 (a negative shift wraps) */
    unsigned char shift = (unsigned char)(int)(hue_factor * 255.0);
    for (size_t i = 0; i < 3 * pixels; i += 3) {
        unsigned char hsv[3];
        rgb_to_hsv1(src + i, hsv);
        hsv[0] = (unsigned char)(hsv[0] + shift); /* the uint8 add wraps */
        hsv_to_rgb1(hsv, dst + i);
    }
}

void fl_pil_grayscale(const unsigned char *src, unsigned char *dst, size_t pixels)
{
    for (size_t i = 0; i < 3 * pixels; i += 3) {
        /* Pillow's RGB -> L: ITU-R 601-2 luma in 16-bit fixed point */
        int l = (src[i] * 19595 + src[i + 1] * 38470 + src[i + 2] * 7471 + 0x8000) >> 16;
        dst[i] = dst[i + 1] = dst[i + 2] = (unsigned char)l;
    }
}

int fl_pil_color_apply(const fl_color_draw *draw, unsigned char **image, unsigned char **spare,
                       int w, int h)
{
    /* ImageEnhance's classes: Brightness, Contrast, Color (saturation) */
    static const int ENHANCE[3] = {FL_OP_BRIGHTNESS, FL_OP_CONTRAST, FL_OP_COLOR};
    size_t pixels = (size_t)w * (size_t)h;
    if (draw->gray && draw->gray_first)
        fl_pil_grayscale(*image, *image, pixels);
    for (int k = 0; k < FL_COLOR_OPS; k++) {
        int op = draw->order[k];
        if (op < 0 || op >= FL_COLOR_OPS || !draw->on[op])
            continue;
        double factor = draw->factor[op];
        if (op == FL_HUE) {
            if (!(factor >= -0.5 && factor <= 0.5))
                return FL_ERR_INVALID;
            fl_pil_adjust_hue(*image, *image, pixels, factor);
            continue;
        }
        if (!(factor >= 0.0))
            return FL_ERR_INVALID;
        /* Image.blend takes its alpha as a C float */
        int rc = fl_pil_enhance(ENHANCE[op], (float)factor, *image, *spare, w, h);
        if (rc != FL_OK)
            return rc;
        unsigned char *t = *image;
        *image = *spare;
        *spare = t;
    }
    if (draw->gray && !draw->gray_first)
        fl_pil_grayscale(*image, *image, pixels);
    return FL_OK;
}
