/* fastload core: Pillow's image ops on an RGB uint8 image, and the
 * automatic augmentation policies built on them.
 *
 * Each op has the semantics torchvision's functional API gives it on a PIL
 * image (F.affine / F.rotate through Image.transform and Image.rotate,
 * ImageEnhance's Brightness, Color, Contrast and Sharpness, ImageOps'
 * posterize, solarize, autocontrast, equalize and invert), with Pillow's own
 * arithmetic: the same float expressions, truncations, fixed-point warp and
 * lookup tables, so results are bit-identical on the same input.
 *
 * RandAugment, TrivialAugmentWide and AutoAugment draw their ops, magnitude
 * bins and signs from a fl_rng (torchvision's distributions; other numbers
 * than torch's generator) and apply them with torchvision's op tables.
 *
 * Images are contiguous HWC (rows 3 * w bytes).  Every op reads src and
 * writes dst, two different buffers of the same size; nothing allocates.
 */
#ifndef FL_PIL_OPS_H
#define FL_PIL_OPS_H

#include "core/image/rng.h"

/* torchvision's op names (autoaugment._apply_op), in the order of
 * RandAugment's augmentation space; Invert last (AutoAugment only). */
enum {
    FL_OP_IDENTITY,
    FL_OP_SHEAR_X,
    FL_OP_SHEAR_Y,
    FL_OP_TRANSLATE_X,
    FL_OP_TRANSLATE_Y,
    FL_OP_ROTATE,
    FL_OP_BRIGHTNESS,
    FL_OP_COLOR,
    FL_OP_CONTRAST,
    FL_OP_SHARPNESS,
    FL_OP_POSTERIZE,
    FL_OP_SOLARIZE,
    FL_OP_AUTOCONTRAST,
    FL_OP_EQUALIZE,
    FL_OP_INVERT,
    FL_PIL_OPS
};

/* The names above, as torchvision spells them. */
extern const char *const fl_pil_op_names[FL_PIL_OPS];

/* Warp interpolation: Pillow's NEAREST and BILINEAR. */
enum { FL_WARP_NEAREST = 0, FL_WARP_BILINEAR = 1 };

/* torchvision's _apply_op(img, op, magnitude, interpolation, fill) on a PIL
 * image: src (w x h) into dst, which must not overlap.  `fill` colours the
 * pixels a warp brings in from outside.  Returns FL_OK, or FL_ERR_INVALID for an unknown op or a
 * magnitude Pillow refuses (posterize bits outside 1..8). */
int fl_pil_apply(int op, double magnitude, int interpolation, const unsigned char fill[3],
                 const unsigned char *src, unsigned char *dst, int w, int h);

/* Image.transform(size, AFFINE, a, resample, fillcolor=fill) into an image
 * of the same size: dst(x, y) = src(a * (x + .5, y + .5)) with Pillow's
 * dispatch (scale, 16.16 fixed point or float for NEAREST; its BILINEAR). */
void fl_pil_affine(const unsigned char *src, unsigned char *dst, int w, int h, const double a[6],
                   int interpolation, const unsigned char fill[3]);

/* torchvision's _get_inverse_affine_matrix (angles in degrees), the matrix
 * F.affine hands Pillow. */
void fl_pil_inverse_affine(double cx, double cy, double angle, double tx, double ty, double scale,
                           double shear_x, double shear_y, double out[6]);

/* Image.rotate(angle, resample, expand=False, fillcolor=fill) about the
 * centre (or (cx, cy) when center is nonzero), with its transpose fast
 * paths. */
void fl_pil_rotate(const unsigned char *src, unsigned char *dst, int w, int h, double angle,
                   int interpolation, const unsigned char fill[3], int center, double cx,
                   double cy);

/* ImageEnhance's Brightness, Color or Contrast (op FL_OP_BRIGHTNESS,
 * FL_OP_COLOR or FL_OP_CONTRAST) .enhance(factor): src (w x h) into dst.
 * fl_pil_apply's op with the factor given as it is, not as 1 + magnitude
 * (ColorJitter's factors).  Returns FL_OK, or FL_ERR_INVALID for another op. */
int fl_pil_enhance(int op, float factor, const unsigned char *src, unsigned char *dst, int w,
                   int h);

/* ------------------------------------------------------------- policies */

enum { FL_AUGMENT_NONE = 0, FL_AUGMENT_RAND = 1, FL_AUGMENT_TRIVIAL = 2, FL_AUGMENT_AUTO = 3 };
enum { FL_AUTO_IMAGENET = 0, FL_AUTO_CIFAR10 = 1, FL_AUTO_SVHN = 2 };

#define FL_AUGMENT_MAX_OPS 16 /* RandAugment's num_ops at most */

typedef struct fl_augment_plan {
    int policy;              /* FL_AUGMENT_*; 0 (a zeroed plan): none */
    int num_ops;             /* RandAugment */
    int magnitude;           /* RandAugment: the magnitude bin */
    int num_bins;            /* RandAugment, TrivialAugmentWide: >= 2 */
    int table;               /* AutoAugment: FL_AUTO_* */
    int interpolation;       /* FL_WARP_* */
    float fill[3];           /* 0..255, truncated to integers as torchvision does for PIL */
    int solarize_v2;         /* 1: torchvision.transforms.v2's Solarize thresholds,
                                255 * linspace(1, 0) (v1: linspace(255, 0)) */
} fl_augment_plan;

/* The ops one sample gets, in order. */
typedef struct fl_augment_draw {
    int count;
    int op[FL_AUGMENT_MAX_OPS];
    int bin[FL_AUGMENT_MAX_OPS];      /* index into the op's magnitudes */
    int negative[FL_AUGMENT_MAX_OPS]; /* the signed-magnitude coin came up negative */
} fl_augment_draw;

/* Draws a sample's ops: RandAugment's num_ops uniform ops of 14 at the fixed
 * bin, TrivialAugmentWide's one op of 14 at a uniform bin, AutoAugment's
 * uniform sub-policy of 25 with each of its two ops applied with its
 * probability; a fair sign coin for the signed ops. */
void fl_augment_draw_for(const fl_augment_plan *plan, fl_rng *rng, fl_augment_draw *out);

/* The magnitude of draw `i` for a w x h image: torchvision's float32
 * magnitude tables (torch.linspace's rounding), signed. */
double fl_augment_magnitude(const fl_augment_plan *plan, const fl_augment_draw *draw, int i, int w,
                            int h);

/* Applies the draw to `*image` (w x h), using `spare` (same size) for the
 * steps; on return *image points at whichever of the two holds the
 * result.  Returns FL_OK or FL_ERR_INVALID. */
int fl_augment_apply(const fl_augment_plan *plan, const fl_augment_draw *draw,
                     unsigned char **image, unsigned char **spare, int w, int h);

#endif /* FL_PIL_OPS_H */
