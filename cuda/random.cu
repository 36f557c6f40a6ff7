/*
 * random.cu — random draws on the GPU, behind dpc_ops.h: one thread per
 * element turns Philox block (counter + i) into a value with the same
 * functions as the CPU (src/common/philox.h), so a draw on the GPU gives the
 * CPU's numbers (normal values up to the last bit of log and cos). Dropout
 * draws its mask the same way inside the kernel that applies it.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <cuda_runtime.h>

#include "common/philox.h"
#include "dpc_ops.h"
#include "common/dtype_conv.h"
#include "element.cuh"
#include "launch.cuh"

#define RANDOM_BLOCK 256

__global__ static void random_kernel(int dtype, int kind, int64_t n, uint64_t counter, uint64_t key, int64_t low,
                                     uint64_t range, char *out, int es)
{
    begin_after_previous_kernel();
    int is_double = dtype == DP_FLOAT64, is_bf16 = dtype == DP_BFLOAT16;
    grid_stride_loop(n, [&](int64_t i) {
        uint32_t w[4];
        philox(counter + (uint64_t)i, key, w);
        double v = kind == PHILOX_UNIFORM ? philox_uniform(w, is_double, is_bf16)
                   : kind == PHILOX_NORMAL ? philox_normal(w) : philox_int(w, low, range);
        dt_store(dtype, out + i * es, v);
    });
}

extern "C" int dpc_random(int dtype, int kind, int64_t n, uint64_t counter, uint64_t key, int64_t low,
                          uint64_t range, void *out, void *stream)
{
    int es = (int)dt_size(dtype);
    if (es == 0 || n < 0 || (kind == PHILOX_INT && range == 0))
        return (int)cudaErrorInvalidValue;
    if (n == 0)
        return 0;
    return launch_kernel(random_kernel, grid_stride_blocks(n, RANDOM_BLOCK), RANDOM_BLOCK, (cudaStream_t)stream, dtype,
                         kind, n, counter, key, low, range, (char *)out, es);
}

/* out[i] = in[i] * scale where block counter + i keeps element i, else
 * in[i] * 0 (NaN and the sign of zero as a product gives them); float
 * arithmetic for bfloat16 and float32, double for float64. */
template <typename T, typename A>
__global__ static void dropout_kernel(int dtype, int64_t n, uint64_t counter, uint64_t key, double p, A scale,
                                      const T *in, T *out)
{
    begin_after_previous_kernel();
    grid_stride_loop(n, [&](int64_t i) {
        const A m = philox_keeps(counter + (uint64_t)i, key, dtype, p) ? scale : (A)0;
        st_elem(out + i, ld_elem(in + i) * m);
    });
}

extern "C" int dpc_dropout(int dtype, int64_t n, uint64_t counter, uint64_t key, double p, const void *in, void *out,
                           void *stream)
{
    if (n < 0 || !(p >= 0 && p < 1))
        return (int)cudaErrorInvalidValue;
    if (n == 0)
        return 0;
    const unsigned grid = grid_stride_blocks(n, RANDOM_BLOCK);
    cudaStream_t s = (cudaStream_t)stream;
    const double scale = 1 / (1 - p);
    switch (dtype) {
    case DP_FLOAT32:
        return launch_kernel(dropout_kernel<float, float>, grid, RANDOM_BLOCK, s, dtype, n, counter, key, p,
                             (float)scale, (const float *)in, (float *)out);
    case DP_FLOAT64:
        return launch_kernel(dropout_kernel<double, double>, grid, RANDOM_BLOCK, s, dtype, n, counter, key, p, scale,
                             (const double *)in, (double *)out);
    case DP_BFLOAT16:
        return launch_kernel(dropout_kernel<uint16_t, float>, grid, RANDOM_BLOCK, s, dtype, n, counter, key, p,
                             (float)scale, (const uint16_t *)in, (uint16_t *)out);
    }
    return DPC_UNSUPPORTED;
}
