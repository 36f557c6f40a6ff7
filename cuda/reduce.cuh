/*
 * reduce.cuh — what reduce.cu (reductions, softmax) and cross_entropy.cu
 * share: output positions given to groups of threads, the group
 * reductions, the dispatch over group sizes and dtypes, and exp and log in
 * the precision of the data.
 */
#ifndef DPC_REDUCE_CUH
#define DPC_REDUCE_CUH

#include <math.h>
#include <stdint.h>

#include <type_traits>

#include <cuda_runtime.h>

#include "common/dplua_codes.h"
#include "common/dtype_conv.h"
#include "dpc_ops.h"
#include "launch.cuh"

#define RED_THREADS 256

/* ------------------------------------------------------------------------ */
/* dtypes (the conversions are in common/dtype_conv.h)                      */
/* ------------------------------------------------------------------------ */

__host__ __device__ static constexpr bool dt_is_float(int dtype)
{
    return dtype == DP_FLOAT32 || dtype == DP_FLOAT64 || dtype == DP_BFLOAT16;
}

/* ------------------------------------------------------------------------ */
/* output positions and group reductions                                     */
/* ------------------------------------------------------------------------ */

/* The grid-stride loop over output positions 0 .. count-1, one position
 * to a group of G threads: calls body(pos, sv, si) with the position of
 * this thread's group, for each of the block's turns, and the shared
 * slots of group_reduce. pos may be past count (the last turn's groups
 * that have none): such a group must still take part in its group's
 * barriers. A kernel calls it once. */
template <int G, class Body>
__device__ static inline void for_group_positions(int64_t count, Body body)
{
    __shared__ double sv[RED_THREADS / 32];
    __shared__ int64_t si[RED_THREADS / 32];
    const int per_block = RED_THREADS / G;
    const int grp = threadIdx.x / G;
    for (int64_t base = (int64_t)blockIdx.x * per_block; base < count; base += (int64_t)gridDim.x * per_block)
        body(base + grp, sv, si);
}

/* Combines (v, i) with the group's other threads; every thread of the
 * block must call it, and each gets its group's result. A warp, or a part
 * of one, combines through shuffles (lane l takes lane l + s for s = W/2,
 * .., 1, the pairing of a tree); a whole block (of RED_THREADS) then
 * folds its warps' results from sv and si, its RED_THREADS / 32 slots,
 * in warp order: two __syncthreads instead of one per level of a tree in
 * shared memory. */
template <int G, class Comb>
__device__ static inline void group_reduce(double &v, int64_t &i, double *sv, int64_t *si, Comb comb)
{
    static_assert(G == 1 || G == 2 || G == 4 || G == 8 || G == 16 || G == 32 || G == RED_THREADS,
                  "a group is a thread, a power of two of them within a warp, or the block");
    if (G == 1)
        return;
    constexpr int W = G < 32 ? G : 32;
    const int lane = threadIdx.x % W;
    for (int s = W / 2; s > 0; s >>= 1) {
        double ov = __shfl_down_sync(0xffffffffu, v, s, W);
        long long oi = __shfl_down_sync(0xffffffffu, (long long)i, s, W);
        if (lane < s)
            comb(v, i, ov, (int64_t)oi);
    }
    v = __shfl_sync(0xffffffffu, v, 0, W);
    i = (int64_t)__shfl_sync(0xffffffffu, (long long)i, 0, W);
    if (G <= 32)
        return;
    __syncthreads();  /* the previous result has been read by everyone */
    if (lane == 0) {
        sv[threadIdx.x / 32] = v;
        si[threadIdx.x / 32] = i;
    }
    __syncthreads();
    v = sv[0];
    i = si[0];
    for (int w = 1; w < RED_THREADS / 32; w++)
        comb(v, i, sv[w], si[w]);
}

namespace {   /* file-local types: no clash with another file's of the same name */
struct c_add {
    __device__ void operator()(double &a, int64_t &, double b, int64_t) const { a += b; }
};
struct c_mul {
    __device__ void operator()(double &a, int64_t &, double b, int64_t) const { a *= b; }
};
/* Integer sums and products wrap, kept in the index slot. */
struct c_iadd {
    __device__ void operator()(double &, int64_t &a, double, int64_t b) const
    {
        a = (int64_t)((uint64_t)a + (uint64_t)b);
    }
};
struct c_imul {
    __device__ void operator()(double &, int64_t &a, double, int64_t b) const
    {
        a = (int64_t)((uint64_t)a * (uint64_t)b);
    }
};
struct c_and {
    __device__ void operator()(double &a, int64_t &, double b, int64_t) const { a = a != 0 && b != 0; }
};
struct c_or {
    __device__ void operator()(double &a, int64_t &, double b, int64_t) const { a = a != 0 || b != 0; }
};
/* The CPU's sequential scan "a NaN or a strictly better value replaces
 * best": over pairs, a NaN beats a number, ties go to the lower index.
 * Index -1 is an empty slot. */
struct c_best {
    bool want_max;
    __device__ void operator()(double &a, int64_t &ai, double b, int64_t bi) const
    {
        bool take;
        if (ai < 0)
            take = bi >= 0;
        else if (bi < 0)
            take = false;
        else if (a != a || b != b)
            take = b != b && (a == a || bi < ai);
        else if (b == a)
            take = bi < ai;
        else
            take = want_max ? b > a : b < a;
        if (take) {
            a = b;
            ai = bi;
        }
    }
};
/* softmax's max: any NaN makes it NaN */
struct c_nanmax {
    __device__ void operator()(double &a, int64_t &, double b, int64_t) const
    {
        if (a == a && (b > a || b != b))
            a = b;
    }
};
/* cross-entropy's max: NaN is passed over */
struct c_max {
    __device__ void operator()(double &a, int64_t &, double b, int64_t) const
    {
        if (b > a)
            a = b;
    }
};
}  // namespace

/* Each thread folds elements j0 + lane, j0 + lane + G, ... below j1 with
 * comb, then the group combines. LOAD(j) gives element j as (double,
 * int64). */
template <int G, class Comb, class Load>
__device__ static inline void group_fold(double &v, int64_t &i, int64_t j0, int64_t j1, double *sv, int64_t *si,
                                         Comb comb, Load load)
{
    for (int64_t j = j0 + threadIdx.x % G; j < j1; j += G) {
        double x;
        int64_t xi;
        load(j, x, xi);
        comb(v, i, x, xi);
    }
    group_reduce<G>(v, i, sv, si, comb);
}

/* The same over elements 0 .. n-1. */
template <int G, class Comb, class Load>
__device__ static inline void group_fold(double &v, int64_t &i, int64_t n, double *sv, int64_t *si, Comb comb,
                                         Load load)
{
    group_fold<G>(v, i, 0, n, sv, si, comb, load);
}

/* G threads for a row of len: whole blocks for long rows (or few of
 * them), a warp for medium ones, one thread for short ones. */
static int group_size(int64_t len, int64_t rows)
{
    if (len >= 1024 || (rows <= 1024 && len >= 256))
        return 256;
    return len >= 32 ? 32 : 1;
}

static unsigned grid_for(int64_t rows, int G)
{
    unsigned grid = grid_stride_blocks(rows, RED_THREADS / G);
    return grid < 1 ? 1 : grid;
}

/* The one-launch loss (ce_fused_kernel): at most this many rows, and
 * threads in its block. */
#define CE_FUSED_ROWS RED_THREADS
#define CE_FUSED_MAX_THREADS 1024

/* Calls fn(integral_constant<int, G>) for G in 1, 32, 256. */
template <class Fn> static int with_group(int G, Fn fn)
{
    switch (G) {
    case 1: return fn(std::integral_constant<int, 1>());
    case 32: return fn(std::integral_constant<int, 32>());
    case 256: return fn(std::integral_constant<int, 256>());
    }
    return DPC_UNSUPPORTED;
}

/* The same for the one-launch loss's groups: also 2, 4 and 8 (short rows). */
template <class Fn> static int with_ce_group(int G, Fn fn)
{
    switch (G) {
    case 2: return fn(std::integral_constant<int, 2>());
    case 4: return fn(std::integral_constant<int, 4>());
    case 8: return fn(std::integral_constant<int, 8>());
    }
    return with_group(G, fn);
}

template <class Fn> static int with_dtype(int dtype, Fn fn)
{
    switch (dtype) {
    case DP_FLOAT32: return fn(std::integral_constant<int, DP_FLOAT32>());
    case DP_FLOAT64: return fn(std::integral_constant<int, DP_FLOAT64>());
    case DP_INT64: return fn(std::integral_constant<int, DP_INT64>());
    case DP_INT32: return fn(std::integral_constant<int, DP_INT32>());
    case DP_UINT8: return fn(std::integral_constant<int, DP_UINT8>());
    case DP_BOOL: return fn(std::integral_constant<int, DP_BOOL>());
    case DP_BFLOAT16: return fn(std::integral_constant<int, DP_BFLOAT16>());
    }
    return DPC_UNSUPPORTED;
}

/* The same for the floating dtypes only (softmax, cross-entropy). */
template <class Fn> static int with_float_dtype(int dtype, Fn fn)
{
    switch (dtype) {
    case DP_FLOAT32: return fn(std::integral_constant<int, DP_FLOAT32>());
    case DP_FLOAT64: return fn(std::integral_constant<int, DP_FLOAT64>());
    case DP_BFLOAT16: return fn(std::integral_constant<int, DP_BFLOAT16>());
    }
    return DPC_UNSUPPORTED;
}

/* exp and log in the precision of the data: float for float32 and
 * bfloat16, double for float64. A row may be one thread's (short rows),
 * and a double exp is a chain of some forty dependent FP64 instructions:
 * a cross-entropy over 10 classes spent microseconds in them. */
template <int DT> __device__ static inline double exp_of(double x)
{
    return DT == DP_FLOAT64 ? exp(x) : (double)expf((float)x);
}
template <int DT> __device__ static inline double log_of(double x)
{
    return DT == DP_FLOAT64 ? log(x) : (double)logf((float)x);
}


#endif /* DPC_REDUCE_CUH */
