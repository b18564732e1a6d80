/* fastload core: counter-based random numbers for augmentation.
 *
 * The n-th draw for a key (seed, epoch, sample index) is a pure function of
 * the key and n: a sample gets the same crop and flip whichever worker
 * thread decodes it and in whatever order, so output does not depend on
 * num_workers.  Each draw hashes (key, counter) with the SplitMix64
 * finaliser, a bijection with full avalanche; the key itself is such a hash
 * of its three parts, so nearby seeds, epochs and indices give unrelated
 * streams.
 */
#ifndef FL_RNG_H
#define FL_RNG_H

#include <math.h>
#include <stdint.h>

typedef struct fl_rng {
    uint64_t key;
    uint64_t counter;
} fl_rng;

static inline uint64_t fl__mix64(uint64_t z)
{
    z += 0x9e3779b97f4a7c15u;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

static inline void fl_rng_init(fl_rng *rng, uint64_t seed, uint64_t epoch, uint64_t index)
{
    rng->key = fl__mix64(fl__mix64(fl__mix64(seed) ^ epoch) ^ index);
    rng->counter = 0;
}

/* Stream ids: independent sequences for one key, so that adding draws to
 * one kind of augmentation leaves the others' numbers unchanged. */
enum {
    FL_STREAM_GEOMETRY = 0,
    FL_STREAM_COLOR = 1,
    FL_STREAM_AUGMENT = 2, /* RandAugment & co., keyed by sample */
    FL_STREAM_ERASE = 3,   /* RandomErasing, keyed by sample */
    FL_STREAM_MIX = 4,     /* MixUp / CutMix, keyed by (seed, epoch, batch number) */
    FL_STREAM_BLUR = 5,    /* GaussianBlur's sigma and its RandomApply coin */
    FL_STREAM_AFFINE = 6,  /* RandomRotation / RandomAffine, keyed by sample */
};

/* The generator of `stream` for the key; stream 0 is fl_rng_init's. */
static inline void fl_rng_init_stream(fl_rng *rng, uint64_t seed, uint64_t epoch, uint64_t index,
                                      uint64_t stream)
{
    fl_rng_init(rng, seed, epoch, index);
    if (stream != FL_STREAM_GEOMETRY)
        rng->key = fl__mix64(rng->key ^ fl__mix64(~stream));
}

static inline uint64_t fl_rng_next(fl_rng *rng)
{
    return fl__mix64(rng->key ^ fl__mix64(rng->counter++));
}

/* Uniform in [0, 1), 53 bits. */
static inline double fl_rng_uniform(fl_rng *rng)
{
    return (double)(fl_rng_next(rng) >> 11) * 0x1.0p-53;
}

/* Uniform integer in [0, n) for n >= 1 (multiply-shift; the bias is below
 * 2**-32 for the image sizes drawn here). */
static inline int64_t fl_rng_below(fl_rng *rng, int64_t n)
{
    return (int64_t)(((unsigned __int128)fl_rng_next(rng) * (uint64_t)n) >> 64);
}

/* A standard normal draw (Box-Muller, two uniforms a draw, the sine
 * unused). */
static inline double fl_rng_normal(fl_rng *rng)
{
    double u1 = 1.0 - fl_rng_uniform(rng); /* (0, 1]: the log is finite */
    double u2 = fl_rng_uniform(rng);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

#endif /* FL_RNG_H */
