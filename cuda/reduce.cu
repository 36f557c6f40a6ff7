/*
 * reduce.cu — reductions along one dim and softmax on the GPU, behind
 * dpc_ops.h (cross-entropy is cross_entropy.cu's).
 *
 * The semantics are those of src/cpu/reduce.c and src/cpu/nn.c: values are
 * accumulated in double (integer sums and products in uint64, wrapping, so
 * that they stay exact), max/min/argmax/argmin keep the first index of the
 * best value and the first NaN wins, var/std take two passes (mean, then
 * squared deviations) with the correction, and results are stored through
 * the output dtype with dtype_store's conversion.
 *
 * Every kernel gives one output position (or sample row) to a group of G
 * threads of a 256-thread block: G = 256 for long rows, a warp for medium
 * ones, one thread for short ones. Each thread walks its share of the row,
 * then the group combines the partial results in shared memory. Only the
 * order of additions differs from the CPU's sequential loops.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <type_traits>

#include <cuda_runtime.h>

#include "common/dplua_codes.h"
#include "dpc_ops.h"
#include "common/dtype_conv.h"
#include "iter.cuh"
#include "activation.cuh"
#include "kernel_error.cuh"
#include "launch.cuh"
#include "reduce.cuh"

/* ------------------------------------------------------------------------ */
/* reductions                                                                */
/* ------------------------------------------------------------------------ */

namespace {   /* file-local types: no clash with another file's of the same name */
struct red_args {
    dpc_iter<3> it;     /* operands: out, idx, a */
    int64_t count;      /* output positions */
    int64_t len;        /* elements reduced per position */
    int64_t a_stride;   /* their byte stride */
    int op, out_dtype, correction, has_idx;
};
}  // namespace

/* The ops other than var/std reduce through an associative combiner over
 * (double, int64) pairs, so a row can be folded in slices and the slices'
 * results folded again (the split path below). reduce_init gives the
 * combiner's identity, reduce_fold folds elements [j0, j1) of the row at
 * q (dtype IN, byte stride r.a_stride) into (v, i), with_combiner folds
 * other pairs the same way, and reduce_finish turns the row's pair into
 * its value, *index (arg ops, max/min) and *ires (integer sums and
 * products). */
__device__ static void reduce_init(int op, double &v, int64_t &i)
{
    bool prod = op == DP_PROD, best = op == DP_MAX || op == DP_MIN || op == DP_ARGMAX || op == DP_ARGMIN;
    v = (prod || op == DP_ALL) ? 1 : 0;
    i = prod ? 1 : best ? -1 : 0;   /* -1: c_best's empty slot */
}

/* Calls fn(combiner) with op's combiner; integer sums and products keep
 * their exact value in the index slot. */
template <class Fn> __device__ static void with_combiner(int op, bool is_int, Fn fn)
{
    switch (op) {
    case DP_SUM: case DP_MEAN: case DP_NORM:
        if (is_int)
            fn(c_iadd());
        else
            fn(c_add());
        return;
    case DP_PROD:
        if (is_int)
            fn(c_imul());
        else
            fn(c_mul());
        return;
    case DP_MAX: case DP_ARGMAX: case DP_MIN: case DP_ARGMIN:
        fn(c_best{ op == DP_MAX || op == DP_ARGMAX });
        return;
    case DP_ALL: fn(c_and()); return;
    case DP_ANY: fn(c_or()); return;
    }
}

template <int IN, int G>
__device__ static void reduce_fold(const red_args &r, const char *q, int64_t j0, int64_t j1, double &v, int64_t &i,
                                   double *sv, int64_t *si)
{
    const bool is_int = !dt_is_float(IN);
    const int64_t rs = r.a_stride;
    const int op = r.op;
    auto ld = [=](int64_t j, double &x, int64_t &xi) {
        if (op == DP_ALL || op == DP_ANY) {
            x = dt_load(IN, q + j * rs) != 0;
            xi = j;
        } else if (is_int && (op == DP_SUM || op == DP_MEAN || op == DP_PROD)) {
            x = 0;
            xi = dt_iload(IN, q + j * rs);
        } else if (op == DP_NORM) {
            x = dt_load(IN, q + j * rs);
            x *= x;
            xi = j;
        } else {
            x = dt_load(IN, q + j * rs);
            xi = j;
        }
    };
    with_combiner(op, is_int, [&](auto comb) { group_fold<G>(v, i, j0, j1, sv, si, comb, ld); });
}

__device__ static double reduce_finish(int op, bool is_int, int64_t n, double v, int64_t i, int64_t *index,
                                       int64_t *ires)
{
    switch (op) {
    case DP_SUM: case DP_MEAN: case DP_PROD:
        if (is_int) {
            *ires = i;
            return (double)i;
        }
        return op == DP_MEAN ? v / (double)n : v;
    case DP_NORM:
        return sqrt(v);
    case DP_MAX: case DP_ARGMAX: case DP_MIN: case DP_ARGMIN:
        *index = i;
        return i < 0 ? NAN : v;
    }
    return v;
}

/* Reduces the n elements at q (byte stride r.a_stride) of dtype IN;
 * returns the double value and sets *index and *ires as reduce_finish
 * does. The group's threads all call it. */
template <int IN, int G>
__device__ static double reduce_row(const red_args &r, const char *q, int64_t n, int64_t *index, int64_t *ires,
                                    double *sv, int64_t *si)
{
    const bool is_int = !dt_is_float(IN);
    double v;
    int64_t i;
    reduce_init(r.op, v, i);
    if (r.op == DP_VAR || r.op == DP_STD) {
        /* two passes: the mean, then the squared deviations */
        const int64_t rs = r.a_stride;
        auto ld = [=](int64_t j, double &x, int64_t &xi) { x = dt_load(IN, q + j * rs); xi = j; };
        group_fold<G>(v, i, n, sv, si, c_add(), ld);
        double mean = v / (double)n, ss = 0;
        auto dev = [=](int64_t j, double &x, int64_t &xi) {
            double d = dt_load(IN, q + j * rs) - mean;
            x = d * d;
            xi = j;
        };
        group_fold<G>(ss, i, n, sv, si, c_add(), dev);
        double dof = (double)(n - r.correction);
        double var = dof > 0 ? ss / dof : NAN;
        return r.op == DP_STD ? sqrt(var) : var;
    }
    reduce_fold<IN, G>(r, q, 0, n, v, i, sv, si);
    return reduce_finish(r.op, is_int, n, v, i, index, ires);
}

/* reduce.c's reduce_row: what goes to out (and idx) for one position. */
__device__ static void reduce_write(const red_args &r, char *o, char *ip, const char *q, double v, int64_t index,
                                    int64_t ires)
{
    bool arg = r.op == DP_ARGMAX || r.op == DP_ARGMIN;
    if (index < 0)
        index = 0;  /* max/min of nothing: the core refuses it */
    if (arg)
        *(int64_t *)o = index;
    else if (r.out_dtype == DP_INT64 && (r.op == DP_SUM || r.op == DP_PROD))
        *(int64_t *)o = ires;
    else if (r.out_dtype == DP_INT64 && (r.op == DP_MAX || r.op == DP_MIN))
        *(int64_t *)o = r.len > 0 ? *(const int64_t *)(q + index * r.a_stride) : 0;
    else
        dt_store(r.out_dtype, o, v);
    if (r.has_idx)
        *(int64_t *)ip = index;
}

/* one output position per group of G threads */
template <int IN, int G>
__global__ static void reduce_kernel(red_args r)
{
    begin_after_previous_kernel();
    const int lane = threadIdx.x % G;
    for_group_positions<G>(r.count, [&](int64_t pos, double *sv, int64_t *si) {
        bool live = pos < r.count;
        char *p[3];
        iter_ptrs(r.it, live ? pos : 0, p);
        int64_t index = 0, ires = 0;
        /* dead groups reduce nothing but still take part in the barriers */
        double v = reduce_row<IN, G>(r, p[2], live ? r.len : 0, &index, &ires, sv, si);
        if (live && lane == 0)
            reduce_write(r, p[0], p[1], p[2], v, index, ires);
    });
}

/* Few long rows would leave most of the GPU idle with one group per row
 * (a loss's mean over a whole batch of activations ran on one block):
 * then each row is cut into `split` slices of at least SPLIT_MIN_SLICE
 * elements, a block folds each slice into a partial pair (pass 1), and a
 * second launch folds each row's partials and writes the result (pass 2).
 * The slicing depends only on the shape, so results are reproducible. */
#define SPLIT_MIN_SLICE 16384
#define SPLIT_BLOCKS 2048   /* about 16 blocks per SM on an H100/H200 */

static int64_t split_for(int op, int64_t count, int64_t len)
{
    if (op == DP_VAR || op == DP_STD || len < 2 * SPLIT_MIN_SLICE || count * 4 >= SPLIT_BLOCKS)
        return 1;
    int64_t s = CEIL_DIV(len, (int64_t)SPLIT_MIN_SLICE), most = SPLIT_BLOCKS / count;
    return s < most ? s : most;
}

template <int IN>
__global__ static void reduce_split_kernel(red_args r, int64_t split, double *pv, int64_t *pi)
{
    begin_after_previous_kernel();
    __shared__ double sv[RED_THREADS / 32];
    __shared__ int64_t si[RED_THREADS / 32];
    int64_t per = CEIL_DIV(r.len, split);
    for (int64_t b = blockIdx.x; b < r.count * split; b += gridDim.x) {
        int64_t j0 = (b % split) * per, j1 = j0 + per < r.len ? j0 + per : r.len;
        char *p[3];
        iter_ptrs(r.it, b / split, p);
        double v;
        int64_t i;
        reduce_init(r.op, v, i);
        reduce_fold<IN, RED_THREADS>(r, p[2], j0, j1, v, i, sv, si);
        if (threadIdx.x == 0) {
            pv[b] = v;
            pi[b] = i;
        }
    }
}

template <int IN>
__global__ static void reduce_combine_kernel(red_args r, int64_t split, const double *pv, const int64_t *pi)
{
    begin_after_previous_kernel();
    __shared__ double sv[RED_THREADS / 32];
    __shared__ int64_t si[RED_THREADS / 32];
    const bool is_int = !dt_is_float(IN);
    for (int64_t pos = blockIdx.x; pos < r.count; pos += gridDim.x) {
        const double *qv = pv + pos * split;
        const int64_t *qi = pi + pos * split;
        auto ld = [=](int64_t k, double &x, int64_t &xi) { x = qv[k]; xi = qi[k]; };
        double v;
        int64_t i, index = 0, ires = 0;
        reduce_init(r.op, v, i);
        with_combiner(r.op, is_int, [&](auto comb) { group_fold<RED_THREADS>(v, i, split, sv, si, comb, ld); });
        v = reduce_finish(r.op, is_int, r.len, v, i, &index, &ires);
        char *p[3];
        iter_ptrs(r.it, pos, p);
        if (threadIdx.x == 0)
            reduce_write(r, p[0], p[1], p[2], v, index, ires);
    }
}

/* Both passes, with the partials in a block from the stream's pool. */
template <int IN>
static int reduce_split(const red_args &r, int64_t split, cudaStream_t stream)
{
    int device;
    void *ws;
    int64_t parts = r.count * split;
    size_t bytes = (size_t)parts * (sizeof(double) + sizeof(int64_t));
    int rc = (int)cudaGetDevice(&device);
    if (rc == 0)
        rc = dpc_malloc(&ws, bytes, device, stream);
    if (rc != 0)
        return rc;
    double *pv = (double *)ws;
    int64_t *pi = (int64_t *)(pv + parts);
    unsigned grid = grid_stride_blocks(parts, 1);   /* a block a part */
    rc = launch_kernel(reduce_split_kernel<IN>, grid, RED_THREADS, stream, r, split, pv, pi);
    if (rc == 0)
        rc = launch_kernel(reduce_combine_kernel<IN>, (unsigned)r.count, RED_THREADS, stream, r, split, pv, pi);
    int frc = dpc_free(ws, bytes, device, stream);
    return rc != 0 ? rc : frc;
}

extern "C" int dpc_reduce(int op, int in_dtype, int out_dtype, dpc_shape s, dpc_operand out, dpc_operand idx,
                          dpc_operand a, int64_t len, int64_t a_stride, int correction, void *stream)
{
    if (op < 0 || op >= DP_NUM_REDOPS || dt_size(in_dtype) == 0 || dt_size(out_dtype) == 0)
        return DPC_UNSUPPORTED;
    if (s.ndim < 0 || s.ndim > DPC_MAX_DIMS || len < 0)
        return (int)cudaErrorInvalidValue;
    bool arg = op == DP_ARGMAX || op == DP_ARGMIN;
    if (arg && out_dtype != DP_INT64)
        return DPC_UNSUPPORTED;
    red_args r;
    if (idx.data == NULL)
        memset(idx.stride, 0, sizeof idx.stride);  /* let it merge with anything */
    dpc_operand ops[3] = { out, idx, a };
    size_t es[3] = { dt_size(out_dtype), 8, dt_size(in_dtype) };
    r.count = iter_build<3>(&r.it, s, ops, es);
    r.len = len;
    r.a_stride = a_stride * (int64_t)es[2];
    r.op = op;
    r.out_dtype = out_dtype;
    r.correction = correction;
    r.has_idx = idx.data != NULL;
    if (r.count <= 0)
        return 0;
    int64_t split = split_for(op, r.count, len);
    if (split > 1)
        return with_dtype(in_dtype, [&](auto d) { return reduce_split<decltype(d)::value>(r, split, (cudaStream_t)stream); });
    int G = group_size(len, r.count);
    return with_dtype(in_dtype, [&](auto d) {
        return with_group(G, [&](auto g) {
            constexpr int IN = decltype(d)::value, GS = decltype(g)::value;
            return launch_kernel(reduce_kernel<IN, GS>, grid_for(r.count, GS), RED_THREADS, (cudaStream_t)stream, r);
        });
    });
}

/* ------------------------------------------------------------------------ */
/* softmax                                                                   */
/* ------------------------------------------------------------------------ */

namespace {   /* file-local types: no clash with another file's of the same name */
struct softmax_args {
    dpc_iter<2> it;     /* operands: out, a */
    int64_t count, len, out_stride, a_stride;  /* strides in bytes */
    int log;
};
}  // namespace

/* m = max (NaN if any), sum = sum of exp(x - m), then each output is
 * x - (m + log(sum)) or exp(x - m) / sum, as reduce.c's SOFTMAX_ROW. */
template <int DT, int G>
__global__ static void softmax_kernel(softmax_args r)
{
    begin_after_previous_kernel();
    for_group_positions<G>(r.count, [&](int64_t pos, double *sv, int64_t *si) {
        bool live = pos < r.count;
        char *p[2];
        iter_ptrs(r.it, live ? pos : 0, p);
        const char *q = p[1];
        const int64_t n = live ? r.len : 0, rs = r.a_stride;
        double m = -INFINITY, sum = 0;
        int64_t unused = 0;
        auto ld = [=](int64_t j, double &x, int64_t &xi) { x = dt_load(DT, q + j * rs); xi = 0; };
        group_fold<G>(m, unused, n, sv, si, c_nanmax(), ld);
        auto ex = [=](int64_t j, double &x, int64_t &xi) { x = exp_of<DT>(dt_load(DT, q + j * rs) - m); xi = 0; };
        group_fold<G>(sum, unused, n, sv, si, c_add(), ex);
        double lse = m + log_of<DT>(sum);
        for (int64_t j = threadIdx.x % G; j < n; j += G) {
            double v = dt_load(DT, q + j * rs);
            dt_store(DT, p[0] + j * r.out_stride, r.log ? v - lse : exp_of<DT>(v - m) / sum);
        }
    });
}

extern "C" int dpc_softmax(int dtype, dpc_shape s, dpc_operand out, int64_t out_stride, dpc_operand a,
                           int64_t a_stride, int64_t len, int log, void *stream)
{
    if (!dt_is_float(dtype))
        return DPC_UNSUPPORTED;
    if (s.ndim < 0 || s.ndim > DPC_MAX_DIMS || len < 0)
        return (int)cudaErrorInvalidValue;
    softmax_args r;
    dpc_operand ops[2] = { out, a };
    size_t es[2] = { dt_size(dtype), dt_size(dtype) };
    r.count = iter_build<2>(&r.it, s, ops, es);
    r.len = len;
    r.out_stride = out_stride * (int64_t)es[0];
    r.a_stride = a_stride * (int64_t)es[1];
    r.log = log;
    if (r.count <= 0 || len == 0)
        return 0;
    int G = group_size(len, r.count);
    return with_float_dtype(dtype, [&](auto d) {
        return with_group(G, [&](auto g) {
            constexpr int DT = decltype(d)::value, GS = decltype(g)::value;
            return launch_kernel(softmax_kernel<DT, GS>, grid_for(r.count, GS), RED_THREADS, (cudaStream_t)stream, r);
        });
    });
}
