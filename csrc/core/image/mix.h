/* fastload core: MixUp and CutMix on a whole batch, with torchvision v2's
 * semantics (transforms.v2.MixUp, CutMix, and RandomChoice of them).
 *
 * A batch of n images is mixed with itself rolled by one (image i with
 * image i - 1, image 0 with image n - 1): MixUp blends the two with a
 * weight lam ~ Beta(alpha, alpha); CutMix pastes a box of image i - 1 into
 * image i, the box's side sqrt(1 - lam) of the image's, centred on a
 * uniform pixel and clipped, and corrects lam to the area actually pasted.
 * The int64 labels become one-hot float32 rows mixed with the same weight.
 *
 * The draws (which transform, lam, the box centre) come from the
 * counter-based generator keyed by (seed, epoch, batch number) on
 * FL_STREAM_MIX, so a batch is the same whichever thread or process makes
 * it.  The numbers differ from torch's generator; the distributions are
 * the same.
 */
#ifndef FL_MIX_H
#define FL_MIX_H

#include "core/image/rng.h"

#include <stddef.h>
#include <stdint.h>

enum { FL_MIX_MIXUP = 0, FL_MIX_CUTMIX = 1 };
#define FL_MIX_MAX_CHOICES 8

/* A batch transform: one of `n` transforms picked with its probability. */
typedef struct fl_mix_plan {
    int n;                             /* 1 .. FL_MIX_MAX_CHOICES; 0: no mixing */
    int kind[FL_MIX_MAX_CHOICES];      /* FL_MIX_* */
    double alpha[FL_MIX_MAX_CHOICES];  /* Beta(alpha, alpha), alpha > 0 */
    double cum_p[FL_MIX_MAX_CHOICES];  /* cumulative probabilities; the last is 1 */
    int num_classes;                   /* >= 1 */
} fl_mix_plan;

/* What one batch gets. */
typedef struct fl_mix_params {
    int kind;               /* FL_MIX_* */
    double lam;             /* drawn from Beta(alpha, alpha) */
    int x1, y1, x2, y2;     /* CutMix: the box pasted, [x1, x2) x [y1, y2) */
    double weight;          /* of each sample's own label: lam, or CutMix's
                               1 - box area / image area */
} fl_mix_params;

/* A contiguous batch of n images, each `channels` x height x width, stored
 * as C*H*W planes (nhwc 0) or H*W*C pixels (nhwc 1). */
typedef struct fl_mix_batch {
    void *images;           /* mixed in place */
    int dtype;              /* FL_DTYPE_* (resample.h) */
    int nhwc;
    size_t n;
    int channels, height, width;
    const int64_t *labels;  /* n class indices */
    float *soft;            /* out: n x num_classes soft labels */
} fl_mix_batch;

/* A Gamma(shape, 1) draw for shape > 0 (Marsaglia and Tsang; shape < 1 by
 * Gamma(shape + 1) * U^(1/shape)). */
double fl_rng_gamma(fl_rng *rng, double shape);

/* A Beta(a, b) draw as X / (X + Y) of two Gamma draws. */
double fl_rng_beta(fl_rng *rng, double a, double b);

/* Draws a batch's parameters for images of height x width: the transform
 * (only when the plan has more than one), lam, then CutMix's box centre
 * (x uniform in [0, width), then y in [0, height)), as torchvision orders
 * them. */
void fl_mix_draw(const fl_mix_plan *plan, uint64_t seed, uint64_t epoch, uint64_t batch,
                 int height, int width, fl_mix_params *out);

/* CutMix's box and weight for lam and a centre (torchvision's arithmetic:
 * half sides int(0.5 * sqrt(1 - lam) * side), clipped to the image). */
void fl_cutmix_box(double lam, int cx, int cy, int height, int width, fl_mix_params *out);

/* Mixes `batch` with `params`.  The labels are checked first: one outside
 * [0, num_classes) gives FL_ERR_INVALID, *bad_position set to its place in
 * the batch and nothing changed.  MixUp needs float images (float32 or
 * float16; torchvision refuses uint8 too): FL_ERR_INVALID.  FL_ERR_NOMEM
 * when the copy of one image cannot be allocated.  Returns FL_OK. */
int fl_mix_apply(const fl_mix_params *params, int num_classes, fl_mix_batch *batch,
                 size_t *bad_position);

#endif /* FL_MIX_H */
