/* fastload: the GPU resample kernel: fl_resample (core/image/resample.c)
 * for a batch of decoded RGB images, one thread per output pixel.
 *
 * One text, two compilers.  NVRTC compiles it at run time (the extension
 * carries it as the string fl_resample_kernel_source, so it has no
 * #include); gcc compiles it as C11 through core/cuda/resample_kernel.h,
 * which first includes core/cuda/kernels/host_shim.h to define the CUDA
 * qualifiers and intrinsics away, so the host reference and the tests run
 * the very function the GPU runs.  The structs below are the contract
 * between the host that fills them and the kernel: plain fixed-size fields
 * (int and float are 32 bits, unsigned long long 64, on both sides), no
 * implicit padding, addresses as unsigned long long.
 *
 * The arithmetic is fl_resample's, operation for operation: the tables are
 * fl_resample_tables' (double coefficients rounded to float, flip folded
 * in), every sum starts at 0.0f and adds one product at a time in tap
 * order, and the products and sums are __fmul_rn / __fadd_rn, which NVRTC
 * never fuses into a multiply-add (the CPU build has no FMA either), so
 * the result does not depend on --fmad.  Compile without --use_fast_math
 * and -ftz=true: denormal floats must stay.
 */

/* FL_DTYPE_* and FL_LAYOUT_* of core/image/resample.h (the host checks
 * that the values agree). */
#define FL_RK_UINT8 0
#define FL_RK_FLOAT32 1
#define FL_RK_FLOAT16 2
#define FL_RK_CHW 0
#define FL_RK_HWC 1

/* One image of a batch: where its pixels are and which tables it reads.
 * 64 bytes. */
typedef struct fl_rk_image {
    unsigned long long src; /* address of source pixel (src_x, src_y): RGB, 3 bytes a pixel */
    unsigned long long dst; /* address of the image's row of the batch */
    int src_pitch;          /* bytes between source rows */
    int src_x, src_y;       /* image coordinates of the pixel at src: 0, 0 for a whole
                               image; the tables' lo of each axis for a decoded region */
    int taps_x, taps_y;     /* fl_resample_coeffs' x.taps and y.taps */
    int x_first, y_first;   /* offsets (elements) of its first tables in the batch's
                               first array: out_w, then out_h entries */
    int x_weights, y_weights; /* offsets of its weight tables in the batch's weights:
                                 out_w * taps_x and out_h * taps_y entries */
    int vertical_first;     /* fl_resample_coeffs' vertical_first */
    int clip;               /* fl_resample_coeffs' clip */
    int reserved;           /* 0 */
} fl_rk_image;

/* A batch: passed by value as the kernel's one parameter.  72 bytes. */
typedef struct fl_rk_batch {
    unsigned long long images;  /* address of count fl_rk_image */
    unsigned long long first;   /* address of the int tables (image coordinates) */
    unsigned long long weights; /* address of the float tables */
    int count;                  /* images */
    int out_w, out_h;           /* every image's output size */
    int dtype;                  /* FL_RK_UINT8, FL_RK_FLOAT32, FL_RK_FLOAT16 */
    int layout;                 /* FL_RK_CHW (3 planes) or FL_RK_HWC (pixels) */
    float scale[3], offset[3];  /* per channel: out = v * scale + offset */
    int reserved;               /* 0 */
} fl_rk_batch;

static __device__ __forceinline__ float fl_rk_clip(float v)
{
    v = v > 0.0f ? v : 0.0f;
    return v < 255.0f ? v : 255.0f;
}

/* s + w * v, rounded after the product and after the sum. */
static __device__ __forceinline__ float fl_rk_madd(float s, float w, float v)
{
    return __fadd_rn(s, __fmul_rn(w, v));
}

/* fl_float_to_half (resample.c's to_half), step for step: round to nearest
 * even by a float addition at the half's precision. */
static __device__ __forceinline__ unsigned short fl_rk_half(float value)
{
    unsigned int in = __float_as_uint(value);
    int mag = (int)(in & 0x7fffffffu);
    int is_nan = -(int)(mag > 0x7f800000);
    int clamped = mag < 0x477fffff ? mag : 0x477fffff;
    int e = clamped >> 23;
    e = e > 113 ? e : 113;
    float sum = __fadd_rn(__uint_as_float((unsigned int)clamped),
                          __uint_as_float((unsigned int)(e + 13) << 23));
    unsigned int h = ((unsigned int)(e - 113) << 10) + (__float_as_uint(sum) & 0x7fffffu);
    h |= (unsigned int)is_nan & (0x0200u | (((unsigned int)mag >> 13) & 0x3ffu));
    return (unsigned short)(h | ((in >> 16) & 0x8000u));
}

/* resample.c's to_byte: round half up, clamp. */
static __device__ __forceinline__ unsigned char fl_rk_byte(float v)
{
    return (unsigned char)(int)fl_rk_clip(__fadd_rn(v, 0.5f));
}

/* Output pixel (x, y) of image i of batch b, all three channels: resampled
 * as fl_resample does (see fl_resample_coeffs in resample.h), then clipped,
 * scaled, offset, converted and stored at its place in the image's row.
 * x < out_w, y < out_h and i < count. */
static __device__ __forceinline__ void fl_rk_pixel(const fl_rk_batch *b, int i, int x, int y)
{
    const fl_rk_image *im = (const fl_rk_image *)b->images + i;
    const int *first = (const int *)b->first;
    const float *weights = (const float *)b->weights;
    const unsigned char *src = (const unsigned char *)im->src;
    long long pitch = im->src_pitch;
    int tx = im->taps_x, ty = im->taps_y;
    /* The window's top-left source pixel, relative to src. */
    int x0 = first[im->x_first + x] - im->src_x;
    int y0 = first[im->y_first + y] - im->src_y;
    const float *xw = weights + im->x_weights + (long long)x * tx;
    const float *yw = weights + im->y_weights + (long long)y * ty;
    const unsigned char *top = src + y0 * pitch + 3 * (long long)x0;
    float v0, v1, v2;

    if (tx == 1 && ty == 1) {
        /* A pick (NEAREST, or a copy): the pixel itself. */
        v0 = top[0];
        v1 = top[1];
        v2 = top[2];
    } else if (im->vertical_first) {
        /* Each of the tx columns filtered vertically (and clipped), then
         * those filtered horizontally. */
        v0 = v1 = v2 = 0.0f;
        for (int t = 0; t < tx; t++) {
            const unsigned char *p = top + 3 * t;
            float c0 = 0.0f, c1 = 0.0f, c2 = 0.0f;
            for (int j = 0; j < ty; j++, p += pitch) {
                c0 = fl_rk_madd(c0, yw[j], (float)p[0]);
                c1 = fl_rk_madd(c1, yw[j], (float)p[1]);
                c2 = fl_rk_madd(c2, yw[j], (float)p[2]);
            }
            if (im->clip) {
                c0 = fl_rk_clip(c0);
                c1 = fl_rk_clip(c1);
                c2 = fl_rk_clip(c2);
            }
            v0 = fl_rk_madd(v0, xw[t], c0);
            v1 = fl_rk_madd(v1, xw[t], c1);
            v2 = fl_rk_madd(v2, xw[t], c2);
        }
    } else {
        /* Each of the ty rows filtered horizontally (and clipped; a lone
         * tap is the byte itself), then those filtered vertically. */
        v0 = v1 = v2 = 0.0f;
        const unsigned char *row = top;
        for (int j = 0; j < ty; j++, row += pitch) {
            float h0, h1, h2;
            if (tx == 1) {
                h0 = row[0];
                h1 = row[1];
                h2 = row[2];
            } else {
                h0 = h1 = h2 = 0.0f;
                for (int t = 0; t < tx; t++) {
                    const unsigned char *p = row + 3 * t;
                    h0 = fl_rk_madd(h0, xw[t], (float)p[0]);
                    h1 = fl_rk_madd(h1, xw[t], (float)p[1]);
                    h2 = fl_rk_madd(h2, xw[t], (float)p[2]);
                }
                if (im->clip) {
                    h0 = fl_rk_clip(h0);
                    h1 = fl_rk_clip(h1);
                    h2 = fl_rk_clip(h2);
                }
            }
            v0 = fl_rk_madd(v0, yw[j], h0);
            v1 = fl_rk_madd(v1, yw[j], h1);
            v2 = fl_rk_madd(v2, yw[j], h2);
        }
    }

    /* The store: clip255(v) * scale + offset, then the dtype. */
    float o[3];
    o[0] = __fadd_rn(__fmul_rn(fl_rk_clip(v0), b->scale[0]), b->offset[0]);
    o[1] = __fadd_rn(__fmul_rn(fl_rk_clip(v1), b->scale[1]), b->offset[1]);
    o[2] = __fadd_rn(__fmul_rn(fl_rk_clip(v2), b->scale[2]), b->offset[2]);
    long long plane = (long long)b->out_w * b->out_h;
    long long at = (long long)y * b->out_w + x; /* pixel index in the image */
    long long step = 1;                         /* elements between channels */
    if (b->layout == FL_RK_CHW) {
        step = plane;
    } else {
        at *= 3;
    }
    if (b->dtype == FL_RK_FLOAT32) {
        float *d = (float *)im->dst + at;
        for (int c = 0; c < 3; c++)
            d[c * step] = o[c];
    } else if (b->dtype == FL_RK_FLOAT16) {
        unsigned short *d = (unsigned short *)im->dst + at;
        for (int c = 0; c < 3; c++)
            d[c * step] = fl_rk_half(o[c]);
    } else {
        unsigned char *d = (unsigned char *)im->dst + at;
        for (int c = 0; c < 3; c++)
            d[c * step] = fl_rk_byte(o[c]);
    }
}

#ifdef __CUDACC__
/* Launch: grid (ceil(out_w / blockDim.x), ceil(out_h / blockDim.y), z) with
 * any z >= 1 (min(count, 65535), say), block (32, 8, 1) or any other shape;
 * thread (x, y) of grid layer z does output pixel (x, y) of images z,
 * z + gridDim.z, ...  One parameter: the fl_rk_batch, by value. */
extern "C" __global__ void fl_resample_batch(fl_rk_batch batch)
{
    int x = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    int y = (int)(blockIdx.y * blockDim.y + threadIdx.y);
    if (x >= batch.out_w || y >= batch.out_h)
        return;
    for (int i = (int)blockIdx.z; i < batch.count; i += (int)gridDim.z)
        fl_rk_pixel(&batch, i, x, y);
}
#endif
