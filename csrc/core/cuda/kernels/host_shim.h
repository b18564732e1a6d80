/* fastload core: what a CUDA compiler provides and gcc does not, so that
 * kernels/resample.cu also compiles as C11 (see core/cuda/resample_kernel.h,
 * the one file that includes it, right before the kernel source).
 *
 * The qualifiers are defined away, and the intrinsics the kernel uses
 * become the plain C operations they stand for: __fadd_rn and __fmul_rn
 * are one IEEE float addition and multiplication each (gcc does not fuse
 * them under -std=c11, whose default is -ffp-contract=off, and x86-64
 * evaluates float in float), __float_as_uint and __uint_as_float copy bits.
 */
#ifndef FL_CUDA_KERNELS_HOST_SHIM_H
#define FL_CUDA_KERNELS_HOST_SHIM_H

#ifdef __CUDACC__
#error "host_shim.h is for host compilers: a CUDA compiler reads resample.cu as it is"
#endif

#include <string.h>

#define __device__
#define __global__
#define __forceinline__ inline

static inline float __fadd_rn(float a, float b)
{
    return a + b;
}

static inline float __fmul_rn(float a, float b)
{
    return a * b;
}

static inline unsigned int __float_as_uint(float f)
{
    unsigned int u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float __uint_as_float(unsigned int u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

#endif /* FL_CUDA_KERNELS_HOST_SHIM_H */
