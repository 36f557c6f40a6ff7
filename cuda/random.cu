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
/* Past this many blocks a grid-stride loop does the rest. */
#define RANDOM_MAX_BLOCKS 65536

__global__ static void random_kernel(int dtype, int kind, int64_t n, uint64_t counter, uint64_t key, int64_t low,
                                     uint64_t range, char *out, int es)
{
    begin_after_previous_kernel();
    int is_double = dtype == DP_FLOAT64, is_bf16 = dtype == DP_BFLOAT16;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        uint32_t w[4];
        philox(counter + (uint64_t)i, key, w);
        double v = kind == PHILOX_UNIFORM ? philox_uniform(w, is_double, is_bf16)
                   : kind == PHILOX_NORMAL ? philox_normal(w) : philox_int(w, low, range);
        dt_store(dtype, out + i * es, v);
    }
}

extern "C" int dpc_random(int dtype, int kind, int64_t n, uint64_t counter, uint64_t key, int64_t low,
                          uint64_t range, void *out, void *stream)
{
    int es = (int)dt_size(dtype);
    if (es == 0 || n < 0 || (kind == PHILOX_INT && range == 0))
        return (int)cudaErrorInvalidValue;
    if (n == 0)
        return 0;
    int64_t grid = CEIL_DIV(n, (int64_t)RANDOM_BLOCK);
    if (grid > RANDOM_MAX_BLOCKS)
        grid = RANDOM_MAX_BLOCKS;
    return launch_kernel(random_kernel, (unsigned)grid, RANDOM_BLOCK, (cudaStream_t)stream, dtype, kind, n, counter,
                         key, low, range, (char *)out, es);
}
