/*
 * random.cu — random draws on the GPU, behind dpc_ops.h: one thread per
 * element turns Philox block (counter + i) into a value with the same
 * functions as the CPU (src/common/philox.h), so a draw on the GPU gives the
 * CPU's numbers (normal values up to the last bit of log and cos).
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <cuda_runtime.h>

#include "common/philox.h"
#include "dpc_ops.h"
#include "common/dtype_conv.h"
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
