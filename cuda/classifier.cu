/*
 * classifier.cu — cross-entropy over a language model's classifier,
 * behind dpc_ops.h: bfloat16 logits (N, C) of a wide vocabulary read as
 * they are, in float32 math, with only the row's log-sum-exp kept for the
 * backward (cuda/cross_entropy.cu keeps a row's probabilities in float64,
 * N x C of them: 6.6 GB for GPT-2's 16 x 1024 rows of 50,304 classes).
 *
 * Forward: one block a row, one pass over it for its max and its sum of
 * exp (online: the sum is rescaled when the max grows), 16 bytes a load
 * where the rows allow; then one block adds the rows' losses in a fixed
 * order. Backward: one block a row writes (softmax - onehot) * scale in
 * bfloat16, the probabilities recomputed from the logits and the row's
 * log-sum-exp. Label smoothing eps (without class weights) adds eps / C
 * of the uniform distribution: loss = (1 - eps)(lse - x_t) + eps (lse -
 * mean_j x_j), gradient p_k - (1 - eps)[k == t] - eps / C.
 */
#include <math.h>
#include <stdint.h>

#include <cuda_runtime.h>

#include "common/dplua_codes.h"
#include "common/dtype_conv.h"
#include "dpc_ops.h"
#include "kernel_error.cuh"
#include "launch.cuh"

#define CLS_THREADS 256
#define CLS_VEC 8   /* bfloat16 in a 16-byte load */

namespace {   /* file-local types: no clash with another file's of the same name */
/* A part of a row: its max m, the sum s of exp(x - m) over it, and the
 * sum of its values (for label smoothing). */
struct cls_part {
    float m, s, sum;
};
}  // namespace

/* p with one more value x. A -inf adds nothing (exp(-inf - -inf) would
 * be NaN); a NaN makes s NaN, as it makes PyTorch's loss. */
__device__ static inline void cls_take(cls_part &p, float x)
{
    p.sum += x;
    if (x > p.m) {
        p.s = p.s * expf(p.m - x) + 1;   /* p.m = -inf: s is 0 and exp gives 0 */
        p.m = x;
    } else if (x != -INFINITY) {
        p.s += expf(x - p.m);
    }
}

/* Two parts of a row as one. */
__device__ static inline cls_part cls_merge(cls_part a, cls_part b)
{
    cls_part r;
    r.m = fmaxf(a.m, b.m);
    r.s = (a.m == -INFINITY ? 0.0f : a.s * expf(a.m - r.m)) + (b.m == -INFINITY ? 0.0f : b.s * expf(b.m - r.m));
    r.sum = a.sum + b.sum;
    return r;
}

/* The block's parts merged; every thread gets the result. */
__device__ static cls_part cls_block_merge(cls_part p)
{
    __shared__ cls_part warps[CLS_THREADS / 32];
    for (int d = 16; d > 0; d >>= 1) {
        cls_part o = { __shfl_xor_sync(0xffffffffu, p.m, d), __shfl_xor_sync(0xffffffffu, p.s, d),
                       __shfl_xor_sync(0xffffffffu, p.sum, d) };
        p = cls_merge(p, o);
    }
    if (threadIdx.x % 32 == 0)
        warps[threadIdx.x / 32] = p;
    __syncthreads();
    cls_part r = warps[0];
    for (int w = 1; w < CLS_THREADS / 32; w++)
        r = cls_merge(r, warps[w]);
    __syncthreads();   /* warps[] is free for the next row */
    return r;
}

/* The 8 bfloat16 of a 16-byte load as floats (a bfloat16 is a float's
 * high half). */
__device__ static inline void cls_unpack(uint4 q, float (&f)[CLS_VEC])
{
    const unsigned w[4] = { q.x, q.y, q.z, q.w };
#pragma unroll
    for (int h = 0; h < 4; h++) {
        f[2 * h] = __uint_as_float(w[h] << 16);
        f[2 * h + 1] = __uint_as_float(w[h] & 0xffff0000u);
    }
}

namespace {
struct cls_args {
    int64_t N, C;
    const uint16_t *logits;   /* (N, C) bfloat16 */
    const int64_t *target;    /* (N) */
    int64_t ignore_index;
    float eps;                /* label smoothing */
    float *lse, *rows;        /* (N) each: the row's log-sum-exp, its loss (0 when it does not count) */
    dpc_kernel_error *err;
};
}  // namespace

/* Whether row i's target counts; a target out of [0, C) other than
 * ignore_index is reported and counts for nothing. */
__device__ static inline bool cls_counts(int64_t t, int64_t ignore_index, int64_t C, dpc_kernel_error *err)
{
    if (t == ignore_index)
        return false;
    if (t < 0 || t >= C) {
        if (threadIdx.x == 0)
            kernel_error(err, DPC_KERR_CE_TARGET, t, C);
        return false;
    }
    return true;
}

/* VEC: every row starts on 16 bytes and C is a multiple of CLS_VEC. */
template <bool VEC>
__global__ static void __launch_bounds__(CLS_THREADS) cls_forward_kernel(cls_args a)
{
    begin_after_previous_kernel();
    for (int64_t i = blockIdx.x; i < a.N; i += gridDim.x) {
        const int64_t t = a.target[i];
        if (!cls_counts(t, a.ignore_index, a.C, a.err)) {   /* the same t in every thread: no barrier skipped */
            if (threadIdx.x == 0)
                a.rows[i] = a.lse[i] = 0;
            continue;
        }
        const uint16_t *row = a.logits + i * a.C;
        cls_part p = { -INFINITY, 0, 0 };
        if (VEC) {
            const uint4 *v = reinterpret_cast<const uint4 *>(row);
            for (int64_t q = threadIdx.x; q < a.C / CLS_VEC; q += CLS_THREADS) {
                float f[CLS_VEC];
                cls_unpack(v[q], f);
#pragma unroll
                for (int u = 0; u < CLS_VEC; u++)
                    cls_take(p, f[u]);
            }
        } else {
            for (int64_t k = threadIdx.x; k < a.C; k += CLS_THREADS)
                cls_take(p, bf16_to_f32(row[k]));
        }
        p = cls_block_merge(p);
        if (threadIdx.x == 0) {
            const float lse = p.m + logf(p.s), xt = bf16_to_f32(row[t]);
            float loss = lse - xt;
            if (a.eps > 0)
                loss = (1 - a.eps) * loss + a.eps * (lse - p.sum / (float)a.C);
            a.lse[i] = lse;
            a.rows[i] = loss;
        }
    }
}

namespace {
struct cls_red_args {
    int64_t N;
    const float *rows;
    const int64_t *target;
    int64_t ignore_index, C;
    int reduction;            /* DPC_CE_* */
    int out_dtype;
    void *out;                /* (N) for DPC_CE_NONE, else one value */
    double *denom;            /* the counted rows */
};
}  // namespace

/* One block: the rows' losses added in double in a fixed order (each
 * thread every CLS_THREADS-th row, then the threads in order), and the
 * counted rows into *denom; or the rows copied for no reduction. */
__global__ static void __launch_bounds__(CLS_THREADS) cls_reduce_kernel(cls_red_args r)
{
    begin_after_previous_kernel();
    __shared__ double total[CLS_THREADS], count[CLS_THREADS];
    const int es = (int)dt_size(r.out_dtype);
    double s = 0, n = 0;
    for (int64_t i = threadIdx.x; i < r.N; i += CLS_THREADS) {
        const int64_t t = r.target[i];
        const bool counts = t != r.ignore_index && t >= 0 && t < r.C;
        s += r.rows[i];
        n += counts ? 1 : 0;
        if (r.reduction == DPC_CE_NONE)
            dt_store(r.out_dtype, (char *)r.out + i * es, r.rows[i]);
    }
    total[threadIdx.x] = s;
    count[threadIdx.x] = n;
    __syncthreads();
    if (threadIdx.x != 0)
        return;
    for (int j = 1; j < CLS_THREADS; j++) {
        s += total[j];
        n += count[j];
    }
    *r.denom = n;
    if (r.reduction != DPC_CE_NONE)
        dt_store(r.out_dtype, r.out, r.reduction == DPC_CE_MEAN ? s / n : s);
}

static bool cls_vector_rows(const void *p, int64_t C)
{
    return C % CLS_VEC == 0 && (uintptr_t)p % 16 == 0;
}

static unsigned cls_grid(int64_t N)
{
    return (unsigned)(N < DPC_MAX_BLOCKS ? N : DPC_MAX_BLOCKS);
}

extern "C" int dpc_classifier_loss(int64_t N, int64_t C, const void *logits, const int64_t *target,
                                   int64_t ignore_index, double smoothing, int reduction, float *lse, float *rows,
                                   int out_dtype, void *out, double *denom, dpc_kernel_error *err, void *stream)
{
    if (N < 0 || C <= 0 || dt_size(out_dtype) == 0)
        return (int)cudaErrorInvalidValue;
    cls_args a = { N, C, (const uint16_t *)logits, target, ignore_index, (float)smoothing, lse, rows, err };
    cudaStream_t s = (cudaStream_t)stream;
    if (N > 0) {
        int rc = cls_vector_rows(logits, C) ? launch_kernel(cls_forward_kernel<true>, cls_grid(N), CLS_THREADS, s, a)
                                            : launch_kernel(cls_forward_kernel<false>, cls_grid(N), CLS_THREADS, s, a);
        if (rc)
            return rc;
    }
    cls_red_args r = { N, rows, target, ignore_index, C, reduction, out_dtype, out, denom };
    return launch_kernel(cls_reduce_kernel, 1, CLS_THREADS, s, r);
}

namespace {
struct cls_bwd_args {
    int64_t N, C;
    uint16_t *dlogits;        /* (N, C) bfloat16 */
    const uint16_t *logits;
    const int64_t *target;
    int64_t ignore_index;
    float eps;
    const float *lse;
    int reduction;
    int g_dtype;
    const void *g;            /* the loss's gradient: (N) for DPC_CE_NONE, else one value */
    const double *denom;
};
}  // namespace

/* Element k of a row's gradient: (p_k - (1 - eps)[k == t] - eps / C) * sc. */
__device__ static inline float cls_grad(float x, float lse, int64_t k, int64_t t, float eps, float eps_c, float sc)
{
    const float p = expf(x - lse);
    return (p - (k == t ? 1 - eps : 0.0f) - eps_c) * sc;
}

template <bool VEC>
__global__ static void __launch_bounds__(CLS_THREADS) cls_backward_kernel(cls_bwd_args a)
{
    begin_after_previous_kernel();
    const int es = (int)dt_size(a.g_dtype);
    const float eps_c = a.eps / (float)a.C;
    for (int64_t i = blockIdx.x; i < a.N; i += gridDim.x) {
        const int64_t t = a.target[i];
        const bool counts = t != a.ignore_index && t >= 0 && t < a.C;
        double g = dt_load(a.g_dtype, (const char *)a.g + (a.reduction == DPC_CE_NONE ? i * es : 0));
        const float sc = counts ? (float)(a.reduction == DPC_CE_MEAN ? g / *a.denom : g) : 0.0f;
        const float lse = a.lse[i];
        const uint16_t *row = a.logits + i * a.C;
        uint16_t *drow = a.dlogits + i * a.C;
        if (VEC) {
            const uint4 *v = reinterpret_cast<const uint4 *>(row);
            uint4 *dv = reinterpret_cast<uint4 *>(drow);
            for (int64_t q = threadIdx.x; q < a.C / CLS_VEC; q += CLS_THREADS) {
                float f[CLS_VEC];
                cls_unpack(v[q], f);
                unsigned w[4];
#pragma unroll
                for (int h = 0; h < 4; h++) {
                    const int64_t k = q * CLS_VEC + 2 * h;
                    const unsigned lo = sc == 0 ? 0u : f32_to_bf16(cls_grad(f[2 * h], lse, k, t, a.eps, eps_c, sc));
                    const unsigned hi = sc == 0 ? 0u : f32_to_bf16(cls_grad(f[2 * h + 1], lse, k + 1, t, a.eps, eps_c, sc));
                    w[h] = lo | hi << 16;
                }
                dv[q] = make_uint4(w[0], w[1], w[2], w[3]);
            }
        } else {
            for (int64_t k = threadIdx.x; k < a.C; k += CLS_THREADS)
                drow[k] = sc == 0 ? 0 : f32_to_bf16(cls_grad(bf16_to_f32(row[k]), lse, k, t, a.eps, eps_c, sc));
        }
    }
}

extern "C" int dpc_classifier_backward(int64_t N, int64_t C, void *dlogits, const void *logits, const int64_t *target,
                                       int64_t ignore_index, double smoothing, const float *lse, int reduction,
                                       int g_dtype, const void *g, const double *denom, void *stream)
{
    if (N < 0 || C <= 0 || dt_size(g_dtype) == 0)
        return (int)cudaErrorInvalidValue;
    if (N == 0)
        return 0;
    cls_bwd_args a = { N, C, (uint16_t *)dlogits, (const uint16_t *)logits, target, ignore_index, (float)smoothing,
                       lse, reduction, g_dtype, g, denom };
    cudaStream_t s = (cudaStream_t)stream;
    if (cls_vector_rows(logits, C) && cls_vector_rows(dlogits, C))
        return launch_kernel(cls_backward_kernel<true>, cls_grid(N), CLS_THREADS, s, a);
    return launch_kernel(cls_backward_kernel<false>, cls_grid(N), CLS_THREADS, s, a);
}
