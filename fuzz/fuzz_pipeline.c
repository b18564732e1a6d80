/* libFuzzer target: untrusted bytes through the whole image pipeline.
 *
 * The first PARAM_BYTES bytes of an input choose a transform plan (crop
 * kind, output size, scale and ratio ranges, filter, flip, dtype, layout,
 * exact or DCT-scaled decode) and a random key; the rest is the file.  The
 * augmentations (RandomCrop's padding, RandomRotation/RandomAffine, a
 * policy such as RandAugment, colour ops, blur, RandomErasing) are chosen by a hash of the same bytes,
 * so the corpus keeps its layout as ops are added.  The
 * pipeline (csrc/core/image/pipeline.c) then does what a worker does, by the
 * file's magic bytes: for a JPEG (or bytes of no known format), header, crop
 * box, completeness check, region decode; for a PNG or WebP (libpng,
 * libwebp), header, whole decode to RGB; then the resample into the
 * output.  Images are capped at MAX_PIXELS so a run explores parsers rather
 * than allocating; every output byte is read, so a sanitizer sees any that
 * were left uninitialised.
 *
 * Built by fuzz/Makefile with clang -fsanitize=fuzzer, or with any compiler
 * and fuzz/replay.c as a plain program that runs files (the corpus and
 * every crash ever found) through the same function.
 */
#include "core/image/pipeline.h"
#include "core/image/resample.h"
#include "core/status.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define PARAM_BYTES 16
#define MAX_PIXELS (1u << 20) /* 1 MP: enough for every decoder path */
#define MAX_OUT 96            /* output side, pixels */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static double unit(uint8_t byte)
{
    return byte / 255.0;
}

/* The next `bits` bits of *h, as a number. */
static unsigned take(uint64_t *h, int bits)
{
    unsigned v = (unsigned)(*h & ((1u << bits) - 1));
    *h >>= bits;
    return v;
}

/* A plan without geometry becomes, half the time, a RandomCrop of the
 * plan's output size with up to 7 pixels of padding a side, in any mode. */
static void random_crop_from(uint64_t h, fl_image_plan *plan)
{
    if (plan->crop != FL_CROP_NONE || !take(&h, 1))
        return;
    plan->crop = FL_CROP_RANDOM;
    plan->crop_w = plan->out_w = 1 + (int)take(&h, 6);
    plan->crop_h = plan->out_h = 1 + (int)take(&h, 6);
    fl_pad_plan *pad = &plan->pad;
    pad->left = (int)take(&h, 3);
    pad->top = (int)take(&h, 3);
    pad->right = (int)take(&h, 3);
    pad->bottom = (int)take(&h, 3);
    pad->if_needed = (int)take(&h, 1);
    pad->once = (int)take(&h, 1);
    pad->mode = (int)take(&h, 2);
    for (int c = 0; c < 3; c++)
        pad->fill[c] = (unsigned char)take(&h, 8);
}

/* Half of the plans get colour ops: each adjustment on or off, ranges up to
 * twice ColorJitter's usual, a fixed or drawn order, grayscale before or
 * after, the jitter sometimes under a RandomApply; a quarter get a blur. */
static void color_from(uint64_t h, fl_image_plan *plan)
{
    fl_color_plan *color = &plan->color;
    if (take(&h, 2) == 0) {
        fl_blur_plan *blur = &plan->blur;
        blur->kernel_w = 1 + 2 * (int)take(&h, 3);
        blur->kernel_h = 1 + 2 * (int)take(&h, 3);
        blur->sigma_lo = 0.1 + take(&h, 3);
        blur->sigma_hi = blur->sigma_lo + take(&h, 3);
        blur->p = take(&h, 2) / 3.0;
    }
    if (!take(&h, 1))
        return;
    for (int op = 0; op < FL_COLOR_OPS; op++) {
        double spread = take(&h, 1) ? take(&h, 3) / 7.0 : 0.0; /* 0: the identity, off */
        if (op == FL_HUE) {
            color->lo[op] = -0.5 * spread;
            color->hi[op] = 0.5 * spread;
        } else {
            color->lo[op] = 1.0 - 0.9 * spread;
            color->hi[op] = 1.0 + 0.9 * spread;
        }
    }
    color->order[0] = -1;
    if (take(&h, 1)) {
        int shift = (int)take(&h, 2);
        for (int op = 0; op < FL_COLOR_OPS; op++)
            color->order[op] = (op + shift) % FL_COLOR_OPS;
    }
    color->gray_p = take(&h, 2) / 3.0;
    color->gray_first = (int)take(&h, 1);
    color->jitter_p = take(&h, 1) ? take(&h, 2) / 3.0 : 1.0;
    color->uint8 = (int)take(&h, 1); /* as on a uint8 tensor: truncated steps */
    fl_color_plan_from_ranges(color);
}

/* A third of the plans get an augmentation policy (any, with up to 7 ops,
 * any bins, either warp, any fill). */
static void policy_from(uint64_t h, fl_image_plan *plan)
{
    unsigned policy = take(&h, 2);
    if (policy == FL_AUGMENT_NONE || !take(&h, 1))
        return;
    fl_augment_plan *a = &plan->augment;
    a->policy = (int)policy;
    a->num_ops = (int)take(&h, 3);
    a->num_bins = 2 + (int)take(&h, 5);
    a->magnitude = (int)take(&h, 5) % a->num_bins;
    a->table = (int)take(&h, 2) % 3;
    a->interpolation = (int)take(&h, 1);
    for (int c = 0; c < 3; c++)
        a->fill[c] = (float)take(&h, 8);
}

/* A quarter get a RandomRotation or RandomAffine (any angle, shift, scale,
 * shear and centre, either filter). */
static void warp_from(uint64_t h, fl_image_plan *plan)
{
    if (take(&h, 2) != 0)
        return;
    fl_warp_plan *wp = &plan->warp;
    wp->kind = take(&h, 1) ? FL_RANDOM_AFFINE : FL_RANDOM_ROTATION;
    wp->degrees_lo = -(double)take(&h, 8);
    wp->degrees_hi = take(&h, 8);
    wp->translate_x = take(&h, 2) / 4.0;
    wp->translate_y = take(&h, 2) / 4.0;
    wp->scale_lo = 0.01 + take(&h, 3) / 4.0;
    wp->scale_hi = wp->scale_lo + take(&h, 3) / 4.0;
    wp->shear_x_lo = -(double)take(&h, 6);
    wp->shear_x_hi = take(&h, 6);
    wp->interpolation = (int)take(&h, 1);
    for (int c = 0; c < 3; c++)
        wp->fill[c] = (float)(take(&h, 3) * 36);
    wp->center = (int)take(&h, 1);
    wp->center_x = take(&h, 6);
    wp->center_y = take(&h, 6);
}

/* Half get RandomErasing. */
static void erasing_from(uint64_t h, fl_image_plan *plan)
{
    if (!take(&h, 1))
        return;
    fl_erase_plan *e = &plan->erase;
    e->p = take(&h, 2) / 3.0;
    e->scale_lo = take(&h, 3) / 16.0;
    e->scale_hi = e->scale_lo + take(&h, 3) / 16.0;
    e->ratio_lo = 0.25 + take(&h, 2);
    e->ratio_hi = e->ratio_lo + take(&h, 2);
    e->random = (int)take(&h, 1);
    for (int c = 0; c < 3; c++)
        e->value[c] = (float)take(&h, 4) - 8.0f;
}

static void plan_from(const uint8_t *p, fl_image_plan *plan, fl_sample_key *key)
{
    memset(plan, 0, sizeof *plan);
    plan->crop = p[0] % 3;
    plan->out_w = 1 + p[1] % MAX_OUT;
    plan->out_h = 1 + p[2] % MAX_OUT;
    plan->scale_lo = 0.01 + 0.5 * unit(p[3]);
    plan->scale_hi = plan->scale_lo + 0.5 * unit(p[4]);
    plan->ratio_lo = 0.25 + unit(p[5]);
    plan->ratio_hi = plan->ratio_lo + 2.0 * unit(p[6]);
    if (plan->crop == FL_CROP_RESIZE_CENTER) {
        plan->resize = p[7] & 1 ? 1 + p[8] % MAX_OUT : 0;
        plan->max_size = p[7] & 2 ? plan->resize + 1 + p[9] % 8 : 0;
        if (!plan->resize && (p[7] & 4)) {
            plan->resize_w = 1 + p[8] % MAX_OUT;
            plan->resize_h = 1 + p[9] % MAX_OUT;
        }
        plan->crop_w = p[7] & 8 ? 1 + p[10] % MAX_OUT : 0;
        plan->crop_h = plan->crop_w ? 1 + p[11] % MAX_OUT : 0;
        plan->out_w = plan->crop_w;
        plan->out_h = plan->crop_h;
    } else if (plan->crop == FL_CROP_NONE) {
        plan->out_w = plan->out_h = 0; /* the image's own size */
    }
    plan->filter = p[12] % 3;
    plan->antialias = p[12] & 4 ? 1 : 0;
    plan->flip_p = unit(p[13]);
    plan->dtype = (p[14] & 3) % 3;
    plan->layout = (p[14] >> 2) & 1;
    plan->exact = (p[14] >> 3) & 1;
    for (int c = 0; c < 3; c++) {
        plan->mul[c] = plan->dtype == FL_DTYPE_UINT8 ? 1.0f : 1.0f / 255.0f;
        plan->add[c] = 0.0f;
    }
    plan->max_pixels = MAX_PIXELS;
    key->seed = p[15];
    key->epoch = p[15] >> 4;
    key->index = p[3] ^ p[10];
    uint64_t h = 0;
    for (int i = 0; i < PARAM_BYTES; i++)
        h = fl__mix64(h ^ p[i]);
    /* Each family reads its own 64 bits. */
    random_crop_from(h, plan);
    color_from(fl__mix64(h ^ 1), plan);
    policy_from(fl__mix64(h ^ 2), plan);
    warp_from(fl__mix64(h ^ 3), plan);
    erasing_from(fl__mix64(h ^ 4), plan);
    /* A leading Grayscale on half the plans; one channel stored on a quarter of
     * those always gray. */
    plan->gray_at_decode = (int)((h >> 58) & 1);
    int gray = plan->color.gray_p == 1.0 || plan->gray_at_decode;
    plan->channels = gray && (h >> 62) == 0 ? 1 : 3;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < PARAM_BYTES)
        return 0;
    fl_image_plan plan;
    fl_sample_key key;
    plan_from(data, &plan, &key);
    data += PARAM_BYTES;
    size -= PARAM_BYTES;

    char msg[256];
    fl_image_worker *w;
    if (fl_image_worker_get(&w, msg, sizeof msg) != FL_OK)
        abort(); /* no decoder before anything ran: not the input's doing */
    fl_sample_geometry g;
    /* Bytes of no known format go to the JPEG path, whose parser sees them. */
    fl_image_format format = fl_image_format_of(data, size);
    if (format == FL_FORMAT_OTHER)
        format = FL_FORMAT_JPEG;
    if (fl_pipeline_image(w, format, &plan, &key, data, size, NULL, &g, msg, sizeof msg) !=
        FL_OK)
        return 0;
    if (g.out_w < 1 || g.out_h < 1 || (uint64_t)g.out_w * g.out_h > MAX_PIXELS)
        return 0; /* a resize plan can ask for big outputs; not what is explored */
    size_t bytes = (size_t)g.out_w * g.out_h * (size_t)plan.channels * fl_dtype_size(plan.dtype);
    unsigned char *out = malloc(bytes);
    if (!out)
        return 0;
    if (fl_pipeline_image(w, format, &plan, &key, data, size, out, &g, msg, sizeof msg) ==
        FL_OK) {
        /* Read every output byte: uninitialised memory becomes a report. */
        volatile unsigned char sink = 0;
        unsigned char acc = 0;
        for (size_t i = 0; i < bytes; i++)
            acc ^= out[i];
        sink = acc;
        (void)sink;
    }
    free(out);
    return 0;
}
