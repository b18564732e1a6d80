/* fastload core: torchvision's ColorJitter and RandomGrayscale on a PIL
 * image, with Pillow's 8-bit arithmetic.
 *
 * On a PIL image torchvision adjusts brightness, contrast and saturation
 * with ImageEnhance (pil_ops.h), rounding to 8 bits after each step, and
 * the hue through Image.convert("HSV"): the 8-bit hue channel shifted by
 * np.uint8(hue_factor * 255) with wraparound, then convert("RGB").
 * RandomGrayscale is convert("L") repeated into three channels.  These are
 * Pillow's conversions (its Convert.c: the same float expressions and
 * truncations), so results are bit-identical for the same factors and
 * order.  The draws are augment.h's (fl_color_draw_for), from the colour
 * stream.
 *
 * Images are contiguous HWC RGB uint8.
 */
#ifndef FL_PIL_COLOR_H
#define FL_PIL_COLOR_H

#include "core/image/augment.h"

#include <stddef.h>

/* Image.convert("HSV") of `pixels` RGB pixels (3 bytes each: H, S, V). */
void fl_pil_rgb_to_hsv(const unsigned char *src, unsigned char *dst, size_t pixels);

/* Image.convert("RGB") of an HSV image. */
void fl_pil_hsv_to_rgb(const unsigned char *src, unsigned char *dst, size_t pixels);

/* torchvision's _functional_pil.adjust_hue(img, hue_factor) on an RGB
 * image; src and dst may be the same buffer. */
void fl_pil_adjust_hue(const unsigned char *src, unsigned char *dst, size_t pixels,
                       double hue_factor);

/* _functional_pil.to_grayscale(img, 3): Pillow's luma in every channel;
 * src and dst may be the same buffer. */
void fl_pil_grayscale(const unsigned char *src, unsigned char *dst, size_t pixels);

/* Applies a colour draw as torchvision does on a PIL image: grayscale
 * first when draw->gray_first, the adjustments that are on in
 * draw->order, then grayscale when it comes last.  `*image` (w x h) and
 * `*spare` (same size) swap as the steps go; on return *image points at the
 * result.  Returns FL_OK, or FL_ERR_INVALID for a factor torchvision
 * refuses (negative, or a hue outside [-0.5, 0.5]). */
int fl_pil_color_apply(const fl_color_draw *draw, unsigned char **image, unsigned char **spare,
                       int w, int h);

#endif /* FL_PIL_COLOR_H */
