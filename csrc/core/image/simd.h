/* fastload core: building hot loops for the CPU they run on.
 *
 * FL_SIMD_CLONES marks a function whose loops vectorise: gcc builds it
 * twice, for AVX2 and for the x86-64 baseline (SSE2), and the loader picks
 * the copy for the CPU at load time (an ifunc).  No FMA: a fused
 * multiply-add rounds once where the plain expression rounds twice, and
 * the pipeline's results are kept bit for bit (Pillow's arithmetic, and the
 * same output on every CPU).  No reassociation either (no -ffast-math), so
 * wider vectors change speed only, never a value.
 */
#ifndef FL_SIMD_H
#define FL_SIMD_H

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define FL_SIMD_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define FL_SIMD_CLONES
#endif

#endif /* FL_SIMD_H */
