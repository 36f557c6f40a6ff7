/*
 * cross_entropy.cu — cross-entropy on the GPU, behind dpc_ops.h: the
 * loss's forward (a row's probabilities kept for the backward) and
 * backward, with class weights, ignore_index and label smoothing, as
 * src/cpu/nn.c computes them; and the one-launch loss (ce_fused_kernel),
 * which may also compute the small Linears before it and the gradient of
 * its input in the same launch (src/core/gpu_linear.c's deferred Linear).
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
/* cross-entropy                                                             */
/* ------------------------------------------------------------------------ */

namespace {   /* file-local types: no clash with another file's of the same name */
struct ce_args {
    int64_t N, C;
    const char *input;       /* (N, C) contiguous */
    const int64_t *target;   /* (N) */
    const double *weight;    /* (C) or NULL */
    int64_t ignore_index;
    double eps;              /* label smoothing */
    int log_probs;
    double *rows, *probs;
    dpc_kernel_error *err;
};
}  // namespace

__device__ static inline double class_weight(const double *w, int64_t c)
{
    return w ? w[c] : 1.0;
}

/* Whether a row with target t counts: not ignored, and in range (a target
 * out of range fails the forward, which reports it; it counts for nothing
 * meanwhile and no weight is read for it). */
__device__ static inline bool ce_counts(int64_t t, int64_t ignore_index, int64_t C)
{
    return t != ignore_index && t >= 0 && t < C;
}

/* The probability of class j in a row, given the row's max m and 1 / the
 * sum of exp(x - m): one formula for the forward's stored probabilities
 * and the one-launch loss's recomputed ones, so that both are the same.
 * The product is rounded here (__dmul_rn): the compiler may not fuse it
 * into what the one-launch loss computes from it, which the stored value
 * cannot be. */
template <int DT>
__device__ static inline double ce_prob(const char *row, int64_t j, double m, double inv)
{
    return __dmul_rn(exp_of<DT>(dt_load(DT, row + j * (int64_t)dt_size(DT)) - m), inv);
}

namespace {   /* file-local types: no clash with another file's of the same name */
struct ce_red_args {
    int64_t N, C;
    const double *rows;
    const int64_t *target;
    const double *weight;
    int64_t ignore_index;
    int reduction;
    char *out;
    double *denom;
};
}  // namespace

/* When the rows need more than one block: the rows reduced into out (or
 * copied, for no reduction) and the weight of the counted rows into
 * *denom, by one block. */
template <int DT>
__global__ static void ce_reduce_kernel(ce_red_args r)
{
    begin_after_previous_kernel();
    __shared__ double sv[RED_THREADS / 32];
    __shared__ int64_t si[RED_THREADS / 32];
    const int es = (int)dt_size(DT);
    const double *rows = r.rows, *w = r.weight;
    const int64_t *target = r.target;
    const int64_t ignore = r.ignore_index, C = r.C;
    int64_t unused = 0;
    double total = 0, wsum = 0;
    auto row = [=](int64_t j, double &x, int64_t &xi) { x = rows[j]; xi = 0; };
    group_fold<RED_THREADS>(total, unused, r.N, sv, si, c_add(), row);
    auto weight = [=](int64_t j, double &x, int64_t &xi) {
        int64_t t = target[j];
        x = ce_counts(t, ignore, C) ? class_weight(w, t) : 0;
        xi = 0;
    };
    group_fold<RED_THREADS>(wsum, unused, r.N, sv, si, c_add(), weight);
    if (r.reduction == DPC_CE_NONE)
        for (int64_t i = threadIdx.x; i < r.N; i += blockDim.x)
            dt_store(DT, r.out + i * es, rows[i]);
    if (threadIdx.x == 0) {
        *r.denom = wsum;
        if (r.reduction != DPC_CE_NONE)
            dt_store(DT, r.out, r.reduction == DPC_CE_MEAN ? total / wsum : total);
    }
}

namespace {   /* file-local types: no clash with another file's of the same name */
struct ce_bwd_args {
    int64_t N, C;
    char *dinput;            /* (N, C) contiguous */
    const double *probs;     /* (N, C), NULL for log_probs */
    const int64_t *target;
    const double *weight;
    int64_t ignore_index;
    double eps;
    int log_probs;
    int need_wall;           /* the sum of the weights is needed */
    const char *g;           /* the loss's gradient, of dinput's dtype: (N) without reduction, else one value;
                              * NULL: 1 */
    int reduction;
    const double *denom;     /* the mean's denominator */
};
}  // namespace

/* The sum of the C class weights w as the one-launch loss adds them: lane
 * l of a warp every 32nd from l, then a fold of the lanes, so that both
 * backwards give the same bits. A whole warp calls it; lane 0 has it. */
__device__ static inline double warp_weight_sum(const double *w, int64_t C)
{
    double wall = 0;
    for (int64_t j = threadIdx.x % 32; j < C; j += 32)
        wall += w[j];
    for (int d = 16; d > 0; d >>= 1)
        wall += __shfl_down_sync(0xffffffffu, wall, d);
    return wall;
}

/* The sum of the class weights (C without weights), which label smoothing
 * with weights needs; the whole block calls it (sv: shared). */
__device__ static double ce_weight_sum(const ce_bwd_args &r, double *sv)
{
    if (!r.need_wall)
        return (double)r.C;
    if (threadIdx.x < 32) {
        const double wall = warp_weight_sum(r.weight, r.C);
        if (threadIdx.x == 0)
            sv[0] = wall;
    }
    __syncthreads();
    return sv[0];
}

/* dinput[i, k] = sc * ((1-eps) w_t (p_k - [k==t]) + eps/C (p_k sum_j w_j -
 * w_k)), or -sc w_t [k==t] for log-probabilities (nn.c's
 * cpu_cross_entropy_backward); sc is the row's share of the loss's
 * gradient. 0 for a row that does not count (ce_counts). Each operation
 * is rounded as written (__dmul_rn, __dadd_rn, __fma_rn): the one-launch
 * loss and the unfused backward inline this into different code, where
 * the compiler would be free to fuse different multiply-adds. */
__device__ static inline double ce_grad(const ce_bwd_args &r, int64_t k, int64_t t, double p, double wall, double sc)
{
    if (!ce_counts(t, r.ignore_index, r.C) || sc == 0)
        return 0;
    double wt = class_weight(r.weight, t);
    if (r.log_probs)
        return k == t ? -sc * wt : 0;
    double d = __dmul_rn(__dmul_rn(1 - r.eps, wt), __dsub_rn(p, (double)(k == t)));
    if (r.eps > 0)
        d = __dadd_rn(d, __dmul_rn(r.eps / (double)r.C, __fma_rn(p, wall, -class_weight(r.weight, k))));
    return __dmul_rn(d, sc);
}

/* The row's share of the loss gradient g (NULL: 1). */
template <int DT>
__device__ static inline double ce_scale(const ce_bwd_args &r, int64_t i, double denom)
{
    double g = r.g == NULL ? 1.0 : dt_load(DT, r.g + (r.reduction == DPC_CE_NONE ? i * (int64_t)dt_size(DT) : 0));
    return r.reduction == DPC_CE_MEAN ? g / denom : g;
}

/* The gradient for elements first, first + step, ... of dinput; the whole
 * block calls it. */
template <int DT>
__device__ static void ce_bwd_elems(const ce_bwd_args &r, int64_t first, int64_t step, double *sv)
{
    const int es = (int)dt_size(DT);
    const int64_t C = r.C;
    const double wall = ce_weight_sum(r, sv);
    for (int64_t e = first; e < r.N * C; e += step) {
        int64_t i = e / C, t = r.target[i];
        double sc = ce_scale<DT>(r, i, *r.denom);
        /* the forward wrote probabilities only for the rows that count */
        double p = ce_counts(t, r.ignore_index, C) && !r.log_probs ? r.probs[e] : 0;
        dt_store(DT, r.dinput + e * es, ce_grad(r, e % C, t, p, wall, sc));
    }
}

template <int DT>
__global__ static void ce_bwd_kernel(ce_bwd_args r)
{
    begin_after_previous_kernel();
    __shared__ double sv[1];
    ce_bwd_elems<DT>(r, (int64_t)blockIdx.x * blockDim.x + threadIdx.x, (int64_t)gridDim.x * blockDim.x, sv);
}

/* Row i's target (ignore_index past the rows). */
__device__ static inline int64_t ce_target(const ce_args &r, int64_t i)
{
    return i < r.N ? r.target[i] : r.ignore_index;
}

/* One sample row's loss, by its group of G threads: nn.c's row_log_probs
 * and the loss of cpu_cross_entropy. The probabilities are written to
 * r.probs when it is set. The loss is valid in lane 0. */
namespace {   /* file-local types: no clash with another file's of the same name */
struct ce_row {
    int64_t t;
    bool live, bad, active;   /* a row of the batch; its target out of range; it counts */
    const char *row;
    double m, inv, loss;
};
}  // namespace

template <int DT, int G>
__device__ static ce_row ce_row_loss(const ce_args &r, int64_t i, int64_t t, int lane, double *sv, int64_t *si)
{
    const int64_t C = r.C;
    const int es = (int)dt_size(DT);
    ce_row o;
    o.live = i < r.N;
    o.t = t;
    o.active = o.live && ce_counts(o.t, r.ignore_index, C);
    o.bad = o.t != r.ignore_index && !ce_counts(o.t, r.ignore_index, C);
    o.row = r.input + (o.live ? i : 0) * C * es;
    const char *row = o.row;
    const int64_t n = o.active ? C : 0;
    int64_t unused = 0;
    auto ld = [=](int64_t j, double &x, int64_t &xi) { x = dt_load(DT, row + j * es); xi = 0; };
    double m = -INFINITY, sum = 0, lse = 0, inv = 0;
    if (!r.log_probs) {
        group_fold<G>(m, unused, n, sv, si, c_max(), ld);
        auto ex = [=](int64_t j, double &x, int64_t &xi) { x = exp_of<DT>(dt_load(DT, row + j * es) - m); xi = 0; };
        group_fold<G>(sum, unused, n, sv, si, c_add(), ex);
        lse = m + log_of<DT>(sum);
        inv = 1 / sum;
        if (r.probs)
            for (int64_t j = lane; j < n; j += G)
                r.probs[i * C + j] = ce_prob<DT>(row, j, m, inv);
    }
    double smooth = 0;
    if (r.eps > 0) {
        const double *w = r.weight;
        const bool lp = r.log_probs;
        auto wl = [=](int64_t j, double &x, int64_t &xi) {
            double v = dt_load(DT, row + j * es);
            x = class_weight(w, j) * (lp ? v : v - lse);
            xi = 0;
        };
        group_fold<G>(smooth, unused, n, sv, si, c_add(), wl);
        smooth = -smooth;
    }
    o.m = m;
    o.inv = inv;
    o.loss = 0;
    if (o.active) {
        double xt = dt_load(DT, row + o.t * es), logpt = r.log_probs ? xt : xt - lse;
        o.loss = -class_weight(r.weight, o.t) * logpt * (1 - r.eps);
        if (r.eps > 0)
            o.loss += r.eps / (double)C * smooth;
    }
    if (o.bad && lane == 0)
        kernel_error(r.err, DPC_KERR_CE_TARGET, o.t, C);
    return o;
}

/* One sample row per group, each row's loss to r.rows; ce_reduce_kernel
 * then reduces them. A bad target leaves its row 0 and is reported. */
template <int DT, int G>
__global__ static void ce_kernel(ce_args r)
{
    begin_after_previous_kernel();
    const int lane = threadIdx.x % G;
    for_group_positions<G>(r.N, [&](int64_t i, double *sv, int64_t *si) {
        ce_row o = ce_row_loss<DT, G>(r, i, ce_target(r, i), lane, sv, si);
        if (o.live && lane == 0)
            r.rows[i] = o.loss;
    });
}

/* v as stored in the dtype and read back (rounded to bfloat16 where it is). */
template <int DT> __device__ static inline double dt_round(double v)
{
    char stored[8];
    dt_store(DT, stored, v);
    return dt_load(DT, stored);
}

/* Element e (row e / width, column e % width) of one Linear before the
 * loss (dpc_ce_layer), summed as our GEMM kernel sums it unsplit: even and
 * odd k apart, then the bias, then the activation of the value as stored,
 * in float for float32 and bfloat16. So what it writes is what the
 * Linear's own launch would have written. x comes from `in` (the previous
 * layer's output, in shared memory) when given, else from global memory.
 * Returns the output as stored, which the next layer reads. */
template <int DT, typename Acc>
__device__ static Acc ce_layer_element(const dpc_ce_layer &L, int width, int e, const Acc *in)
{
    const int es = (int)dt_size(DT), K = (int)L.K, i = e / width, c = e % width;
    const char *w = (const char *)L.w + c * K * es;
    Acc acc[2] = { 0, 0 };
    if (in) {
        const Acc *x = in + i * K;
#pragma unroll 8
        for (int k = 0; k < K; k++)
            acc[k & 1] += x[k] * (Acc)dt_load(DT, w + k * es);
    } else {
        const char *x = (const char *)L.x + i * K * es;
#pragma unroll 8
        for (int k = 0; k < K; k++)
            acc[k & 1] += (Acc)dt_load(DT, x + k * es) * (Acc)dt_load(DT, w + k * es);
    }
    Acc v = acc[0] + acc[1];
    if (L.b)
        v += (Acc)dt_load(DT, (const char *)L.b + c * es);
    if (L.epilogue != DPC_EPI_BIAS) {   /* gemm.cu's activate */
        v = (Acc)dt_round<DT>(v);
        if (L.pre)
            dt_store(DT, (char *)L.pre + e * es, v);
        v = L.epilogue == DPC_EPI_RELU ? (v > 0 ? v : (Acc)0) : L.epilogue == DPC_EPI_GELU ? gelu_erf(v) : gelu_tanh(v);
    }
    dt_store(DT, (char *)L.out + e * es, v);
    return (Acc)dt_round<DT>(v);
}

/* The hidden layer's outputs a two-Linear chain keeps in shared memory
 * (counted in 8-byte elements, so that the limit is one for every dtype). */
#define CE_HIDDEN_MAX 1024

/* The Linears before the loss (dpc_ce_linear), by the whole block: a
 * hidden layer's output goes to global memory (Lua's tensors) and to
 * shared memory, which the last layer reads after one barrier. */
template <int DT>
__device__ static void ce_linears(const dpc_ce_linear &lin, int N, int C)
{
    typedef typename std::conditional<DT == DP_FLOAT64, double, float>::type Acc;
    __shared__ Acc hidden[CE_HIDDEN_MAX];
    const Acc *in = NULL;
    if (lin.layers == 2) {
        const int width = (int)lin.layer[1].K;
        for (int e = threadIdx.x; e < N * width; e += blockDim.x)
            hidden[e] = ce_layer_element<DT, Acc>(lin.layer[0], width, e, (const Acc *)NULL);
        __syncthreads();
        in = hidden;
    }
    const dpc_ce_layer last = lin.layers == 2 ? lin.layer[1] : lin.layer[0];   /* (a copy: no indexing of the parameter) */
    for (int e = threadIdx.x; e < N * C; e += blockDim.x)
        (void)ce_layer_element<DT, Acc>(last, C, e, in);
}

/* Row i's gradient for a loss gradient of 1 into rb.dinput, by its group
 * (lane of G), the probabilities recomputed as the unfused backward reads
 * them: wsum the batch's weight, wall the class weights' sum. */
template <int DT, int G>
__device__ static inline void ce_row_grad(const ce_args &r, const ce_bwd_args &rb, const ce_row &o, int64_t i, int lane,
                                          double wsum, double wall)
{
    const int es = (int)dt_size(DT);
    const double sc = ce_scale<DT>(rb, i, wsum);
    for (int64_t k = lane; k < r.C; k += G) {
        double p = o.active && !r.log_probs ? ce_prob<DT>(o.row, k, o.m, o.inv) : 0;
        dt_store(DT, rb.dinput + (i * r.C + k) * es, ce_grad(rb, k, o.t, p, wall, sc));
    }
}

/* A classifier's head too large for ce_layer_element's walk from global
 * memory (the MLP's 256 x 128 -> 10: 1,280 multiply-adds a thread of one
 * block, each with two dependent loads; one block reading its rows 16
 * bytes at a time measured about 7 us slower than the layer's
 * own launch) runs over a cluster of blocks, CE_HEAD_ROWS rows each
 * (ce_fused_kernel's HEAD): each block stages its rows of x and all of w
 * in shared memory, 16 bytes a load (one latency for all of them), sums
 * them, then takes its rows' losses and gradients; the first block adds
 * the batch's losses after a cluster barrier (ce_head_finish). */
#define CE_HEAD_ROWS 32
#define CE_HEAD_THREADS 256
#define CE_HEAD_LANES (CE_HEAD_THREADS / CE_HEAD_ROWS)   /* threads of a row in the product */
#define CE_HEAD_COLS 4                                  /* columns a thread takes at most */
#define CE_HEAD_MAX_BLOCKS 8                            /* the portable cluster size */
#define CE_HEAD_LOADS 8                                 /* 16-byte loads a thread has in flight */
#define CE_HEAD_STAGE_BYTES (44 * 1024)                 /* with the rest, under 48 KiB of static shared memory */

/* A row of the head's staging is padded by 16 bytes: rows stay aligned for
 * 16-byte loads, and neighbouring rows start on other banks. */
template <typename Acc> __host__ __device__ static constexpr int ce_head_stride(int64_t K)
{
    return (int)K + 16 / (int)sizeof(Acc);
}

/* 16 / sizeof(Acc) consecutive Acc from shared memory p (16-byte
 * aligned): one load. */
template <typename Acc>
__device__ static inline void ce_head_load(const Acc *p, Acc (&out)[16 / sizeof(Acc)])
{
    float4 q = *reinterpret_cast<const float4 *>(p);
    memcpy(out, &q, 16);
}

/* The 16 bytes q of dtype DT (16 / its size elements) to dst as Acc,
 * converted in registers (bfloat16 is the high half of a float). */
template <int DT, typename Acc>
__device__ static inline void ce_head_unpack(uint4 q, Acc *dst)
{
    const unsigned w[4] = { q.x, q.y, q.z, q.w };
#pragma unroll
    for (int h = 0; h < 4; h++)
        if constexpr (DT == DP_FLOAT32) {
            dst[h] = __uint_as_float(w[h]);
        } else if constexpr (DT == DP_BFLOAT16) {
            dst[2 * h] = __uint_as_float(w[h] << 16);
            dst[2 * h + 1] = __uint_as_float(w[h] & 0xffff0000u);
        } else if (h % 2 == 0) {
            dst[h / 2] = __hiloint2double((int)w[h + 1], (int)w[h]);
        }
}

/* Rows [row0, row0 + CE_HEAD_ROWS) (those below N) of the head L, out (N,
 * C) = x (N, K) @ w (C, K)^T + b, by the block, as our GEMM sums the layer
 * launched alone: even and odd k apart within each share of k (k_share
 * deep, dpc_gemm_k_share), the shares added in order from 0 as
 * tile_split_finish adds them (one share: its sum alone), then the bias.
 * So what it writes is what the Linear's own launch would have written. */
template <int DT>
__device__ static void ce_head_linear(const dpc_ce_layer &L, int64_t N, int C, int64_t row0, int64_t k_share)
{
    typedef typename std::conditional<DT == DP_FLOAT64, double, float>::type Acc;
    constexpr int ES = DT == DP_FLOAT64 ? 8 : DT == DP_BFLOAT16 ? 2 : 4, V = 16 / ES, AV = 16 / (int)sizeof(Acc);
    __shared__ __align__(16) Acc stage[CE_HEAD_STAGE_BYTES / sizeof(Acc)];
    const int K = (int)L.K, stride = ce_head_stride<Acc>(K), per_row = K / V;
    const int rows = N - row0 < CE_HEAD_ROWS ? (int)(N - row0) : CE_HEAD_ROWS, loads = (rows + C) * per_row;
    Acc *xs = stage, *ws = stage + CE_HEAD_ROWS * stride;
    /* load q: 16 bytes of row q / per_row of x's rows then w's */
    auto source = [&](int q) {
        const int r = q / per_row, k = q % per_row * V;
        return r < rows ? (const char *)L.x + ((row0 + r) * K + k) * ES : (const char *)L.w + ((r - rows) * K + k) * ES;
    };
    for (int q0 = (int)threadIdx.x; q0 < loads; q0 += CE_HEAD_THREADS * CE_HEAD_LOADS) {
        uint4 v[CE_HEAD_LOADS];
#pragma unroll
        for (int u = 0; u < CE_HEAD_LOADS; u++)
            if (q0 + u * CE_HEAD_THREADS < loads)
                v[u] = *reinterpret_cast<const uint4 *>(source(q0 + u * CE_HEAD_THREADS));
#pragma unroll
        for (int u = 0; u < CE_HEAD_LOADS; u++) {
            const int q = q0 + u * CE_HEAD_THREADS, r = q / per_row, k = q % per_row * V;
            if (q < loads)
                ce_head_unpack<DT>(v[u], (r < rows ? xs + r * stride : ws + (r - rows) * stride) + k);
        }
    }
    __syncthreads();
    const int r = (int)threadIdx.x / CE_HEAD_LANES, c0 = (int)threadIdx.x % CE_HEAD_LANES;
    if (r >= rows)
        return;
    const bool split = k_share < K;
    Acc out[CE_HEAD_COLS];
#pragma unroll
    for (int j = 0; j < CE_HEAD_COLS; j++)
        out[j] = 0;
    for (int s0 = 0; s0 < K; s0 += (int)k_share) {
        const int s1 = K < s0 + k_share ? K : s0 + (int)k_share;
        Acc acc[CE_HEAD_COLS][2];
#pragma unroll
        for (int j = 0; j < CE_HEAD_COLS; j++)
            acc[j][0] = acc[j][1] = 0;
#pragma unroll 2
        for (int k = s0; k < s1; k += AV) {   /* s0 and AV are even: element v of a load has k's parity */
            Acc xv[AV];
            ce_head_load(xs + r * stride + k, xv);
#pragma unroll
            for (int j = 0; j < CE_HEAD_COLS; j++)
                if (c0 + j * CE_HEAD_LANES < C) {
                    Acc wv[AV];
                    ce_head_load(ws + (c0 + j * CE_HEAD_LANES) * stride + k, wv);
#pragma unroll
                    for (int v = 0; v < AV; v++)
                        acc[j][v & 1] += xv[v] * wv[v];
                }
        }
#pragma unroll
        for (int j = 0; j < CE_HEAD_COLS; j++)
            out[j] = split ? out[j] + (acc[j][0] + acc[j][1]) : acc[j][0] + acc[j][1];
    }
#pragma unroll
    for (int j = 0; j < CE_HEAD_COLS; j++) {
        const int c = c0 + j * CE_HEAD_LANES;
        if (c < C) {
            Acc v = out[j];
            if (L.b)
                v += (Acc)dt_load(DT, (const char *)L.b + c * ES);
            dt_store(DT, (char *)L.out + ((row0 + r) * C + c) * ES, v);
        }
    }
}

/* The cluster barrier of the head's launch in its two halves: each thread
 * arrives once its block's rows' losses are in global memory (release),
 * and waits, before the first block reads them all (acquire) and before
 * any block leaves. */
__device__ static inline void ce_cluster_arrive(void)
{
#if __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
#else
    __trap();   /* the host takes a head only on devices with clusters */
#endif
}

__device__ static inline void ce_cluster_wait(void)
{
#if __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
#else
    __trap();
#endif
}

/* The rows of a head's launch at most (its cluster's), and so the rows a
 * lane of a warp adds of them. */
#define CE_HEAD_MAX_ROWS (CE_HEAD_ROWS * CE_HEAD_MAX_BLOCKS)
#define CE_HEAD_LANE_ROWS (CE_HEAD_MAX_ROWS / 32)

/* The head's launch after its product: each block its rows' losses (to
 * r.rows) and, with rb.dinput, their gradients, for which its first warp
 * adds the weights of every row of the batch itself (from their targets
 * t, which lane l loaded for rows l, l + 32, ..: the one block's order,
 * so every block has the one block's sum); the first block then adds the
 * rows' losses in the same order into the loss. */
template <int DT, int G>
__device__ static void ce_head_finish(const ce_args &r, const ce_red_args &rr, const ce_bwd_args &rb, const ce_row &o,
                                      int64_t i, int lane, const int64_t (&t)[CE_HEAD_LANE_ROWS])
{
    const int es = (int)dt_size(DT);
    if (o.live && lane == 0) {
        r.rows[i] = o.loss;
        if (rr.reduction == DPC_CE_NONE)
            dt_store(DT, rr.out + i * es, o.loss);
    }
    ce_cluster_arrive();
    __shared__ double weight_sum, weight_all;
    if (threadIdx.x < 32) {
        double wsum = 0;
#pragma unroll
        for (int u = 0; u < CE_HEAD_LANE_ROWS; u++)
            if (threadIdx.x + 32 * u < r.N && ce_counts(t[u], r.ignore_index, r.C))
                wsum += class_weight(r.weight, t[u]);
        const double wall = rb.need_wall ? warp_weight_sum(rb.weight, r.C) : 0;
        for (int d = 16; d > 0; d >>= 1)
            wsum += __shfl_down_sync(0xffffffffu, wsum, d);
        if (threadIdx.x == 0) {
            weight_sum = wsum;
            weight_all = rb.need_wall ? wall : (double)r.C;
            if (blockIdx.x == 0)
                *rr.denom = wsum;
        }
    }
    __syncthreads();
    if (rb.dinput && o.live)
        ce_row_grad<DT, G>(r, rb, o, i, lane, weight_sum, weight_all);
    ce_cluster_wait();
    if (blockIdx.x != 0 || threadIdx.x >= 32 || rr.reduction == DPC_CE_NONE)
        return;
    double rows[CE_HEAD_LANE_ROWS], total = 0;
#pragma unroll
    for (int u = 0; u < CE_HEAD_LANE_ROWS; u++)   /* all loads first: one latency */
        rows[u] = threadIdx.x + 32 * u < r.N ? r.rows[threadIdx.x + 32 * u] : 0;
#pragma unroll
    for (int u = 0; u < CE_HEAD_LANE_ROWS; u++)
        if (threadIdx.x + 32 * u < r.N)
            total += rows[u];
    for (int d = 16; d > 0; d >>= 1)
        total += __shfl_down_sync(0xffffffffu, total, d);
    if (threadIdx.x == 0)
        dt_store(DT, rr.out, rr.reduction == DPC_CE_MEAN ? total / weight_sum : total);
}

/* The whole loss in one launch when one block holds every row (N at most
 * RED_THREADS / G): the rows' losses and weights stay in shared memory for
 * the reduction, and with rb.dinput the block also writes there the
 * input's gradient for a loss gradient of 1 (each group its row's, the
 * probabilities recomputed as the unfused backward reads them), which the
 * backward of a loss called with no gradient then takes as it is. HEAD:
 * the loss and its head (ce_head_linear, k_share) over a cluster of
 * blocks, CE_HEAD_ROWS rows each (ce_head_finish). */
template <int DT, int G, bool HEAD>
__global__ static void __launch_bounds__(HEAD ? CE_HEAD_THREADS : CE_FUSED_MAX_THREADS)
    ce_fused_kernel(ce_args r, ce_red_args rr, ce_bwd_args rb, dpc_ce_linear lin, int64_t k_share)
{
    begin_after_previous_kernel();
    constexpr int ROWS = HEAD ? CE_HEAD_ROWS : CE_FUSED_ROWS;   /* a block's */
    __shared__ double sv[RED_THREADS / 32];
    __shared__ int64_t si[RED_THREADS / 32];
    const int es = (int)dt_size(DT);
    const int grp = threadIdx.x / G, lane = threadIdx.x % G;
    const int64_t i = grp < ROWS ? (HEAD ? (int64_t)blockIdx.x * CE_HEAD_ROWS : 0) + grp : r.N;   /* r.N: none */
    const int64_t target = ce_target(r, i);   /* its latency beside the Linear's */
    if constexpr (HEAD) {
        int64_t t[CE_HEAD_LANE_ROWS];   /* the first warp's targets of the batch, for its weights' sum */
        if (threadIdx.x < 32)
#pragma unroll
            for (int u = 0; u < CE_HEAD_LANE_ROWS; u++)
                t[u] = ce_target(r, threadIdx.x + 32 * u);
        ce_head_linear<DT>(lin.layer[0], r.N, (int)r.C, (int64_t)blockIdx.x * CE_HEAD_ROWS, k_share);
        __syncthreads();
        ce_head_finish<DT, G>(r, rr, rb, ce_row_loss<DT, G>(r, i, target, lane, sv, si), i, lane, t);
        return;
    }
    __shared__ double row_loss[ROWS], row_weight[ROWS];
    if (lin.layers) {   /* the Linears before the loss first: r.input is the last one's output */
        ce_linears<DT>(lin, (int)r.N, (int)r.C);
        __syncthreads();
    }
    ce_row o = ce_row_loss<DT, G>(r, i, target, lane, sv, si);
    if (lane == 0 && grp < ROWS) {
        row_loss[grp] = o.loss;
        row_weight[grp] = o.active ? class_weight(r.weight, o.t) : 0;
    }
    __syncthreads();
    if (rr.reduction == DPC_CE_NONE && o.live && lane == 0)
        dt_store(DT, rr.out + i * es, o.loss);
    /* The first warp adds the rows' losses and weights (a block-wide fold
     * of each would take four barriers), and the class weights when label
     * smoothing needs their sum (warp_weight_sum, as the unfused backward
     * adds them), and hands the sums to the block for the gradient. */
    __shared__ double weight_sum, weight_all;
    if (threadIdx.x < 32) {
        double total = 0, wsum = 0;
        for (int j = (int)threadIdx.x; j < r.N; j += 32) {
            total += row_loss[j];
            wsum += row_weight[j];
        }
        const double wall = rb.need_wall ? warp_weight_sum(rb.weight, r.C) : 0;
        for (int d = 16; d > 0; d >>= 1) {
            total += __shfl_down_sync(0xffffffffu, total, d);
            wsum += __shfl_down_sync(0xffffffffu, wsum, d);
        }
        if (threadIdx.x == 0) {
            weight_sum = wsum;
            weight_all = rb.need_wall ? wall : (double)r.C;
            *rr.denom = wsum;
            if (rr.reduction != DPC_CE_NONE)
                dt_store(DT, rr.out, rr.reduction == DPC_CE_MEAN ? total / wsum : total);
        }
    }
    if (!rb.dinput)
        return;
    __syncthreads();
    if (o.live)
        ce_row_grad<DT, G>(r, rb, o, i, lane, weight_sum, weight_all);
}

/* The group of threads a row gets in the one-launch loss (0: the loss
 * does not fit one block), and the block's threads. Rows of 5 to 31
 * classes get 2 to 8 threads each (at most 4 classes a thread) where the
 * block can hold them: one thread walking a row of 10 classes three times
 * (its max, its sum of exp, its gradient) was the MLP step's slowest
 * kernel. */
static int ce_fused_group(int64_t N, int64_t C, int *threads)
{
    *threads = RED_THREADS;
    if (N <= 0 || C < 0)
        return 0;
    int G = group_size(C, N);
    if (G == 1 && C > 4 && N <= CE_FUSED_ROWS) {
        int lanes = C <= 8 ? 2 : C <= 16 ? 4 : 8;
        if (N * lanes <= CE_FUSED_MAX_THREADS) {
            int64_t t = CEIL_DIV(N * lanes, (int64_t)32) * 32;
            *threads = t > RED_THREADS ? (int)t : RED_THREADS;
            return lanes;
        }
    }
    return grid_for(N, G) == 1 ? G : 0;
}

/* Whether dpc_cross_entropy runs as one launch (one block holds every row). */
extern "C" int dpc_cross_entropy_fuses(int64_t N, int64_t C)
{
    int threads;
    return ce_fused_group(N, C, &threads) != 0;
}

/* Multiply-adds a thread of the loss's block may take of a Linear before
 * it: a seed-sized head (32 x 10 -> 2: 10 each). Past that the GEMM's own
 * launch, with its operands staged in shared memory over many blocks, is
 * faster than one block reading them from global memory. And k at most
 * DPC_GEMM_UNSPLIT_K, where (with the DPC_GEMM_UNSPLIT_MACS that this
 * limit keeps a layer within, asserted below) our GEMM kernel never
 * splits k over blocks, so that ce_layer_element's sums are the GEMM's to
 * the last bit. */
#define CE_LINEAR_MAX_MACS 256
static_assert((int64_t)CE_LINEAR_MAX_MACS * RED_THREADS <= DPC_GEMM_UNSPLIT_MACS,
              "every Linear the loss takes is one our GEMM kernel never splits");

static bool ce_layer_fits(int64_t N, int64_t width, const dpc_ce_layer &L)
{
    return width > 0 && L.K > 0 && L.K <= DPC_GEMM_UNSPLIT_K &&
           CEIL_DIV(N * width, (int64_t)RED_THREADS) * L.K <= CE_LINEAR_MAX_MACS &&
           (L.epilogue == DPC_EPI_BIAS || L.epilogue == DPC_EPI_RELU || L.epilogue == DPC_EPI_GELU ||
            L.epilogue == DPC_EPI_GELU_TANH);
}

/* The share of k (dpc_gemm_k_share) in which the loss's launch sums lin's
 * one layer as a head over a cluster (ce_head_linear), or 0 when it does
 * not take it so: a layer without an activation that ce_layer_fits
 * refuses, whose rows' groups fit CE_HEAD_THREADS, whose columns fit
 * CE_HEAD_COLS a thread, whose x and w are read 16 bytes at a time and
 * staged in CE_HEAD_STAGE_BYTES, in at most CE_HEAD_MAX_BLOCKS blocks, on
 * a device with clusters, and that our GEMM would run alone. */
static int64_t ce_head_share(int dtype, int64_t N, int64_t C, const dpc_ce_linear &lin)
{
    int threads, G = ce_fused_group(N, C, &threads);
    if (lin.layers != 1 || G == 0 || G * CE_HEAD_ROWS > CE_HEAD_THREADS || !(dpc_device_can() & DPC_CAN_CLUSTER))
        return 0;
    const dpc_ce_layer &L = lin.layer[0];
    const int64_t es = (int64_t)dt_size(dtype), acc = dtype == DP_FLOAT64 ? 8 : 4;
    const int64_t stride = acc == 8 ? ce_head_stride<double>(L.K) : ce_head_stride<float>(L.K);
    if (L.epilogue != DPC_EPI_BIAS || L.K <= 0 || ce_layer_fits(N, C, L) || C > CE_HEAD_COLS * CE_HEAD_LANES ||
        L.K * es % 16 != 0 || (uintptr_t)L.x % 16 != 0 || (uintptr_t)L.w % 16 != 0 ||
        (CE_HEAD_ROWS + C) * stride * acc > CE_HEAD_STAGE_BYTES || CEIL_DIV(N, (int64_t)CE_HEAD_ROWS) > CE_HEAD_MAX_BLOCKS)
        return 0;
    return dpc_gemm_k_share(dtype, N, C, L.K);
}

extern "C" int dpc_cross_entropy_takes_linear(int dtype, int64_t N, int64_t C, const dpc_ce_linear *lin)
{
    if (!dt_is_float(dtype) || !dpc_cross_entropy_fuses(N, C) || lin->layers < 1 || lin->layers > 2)
        return 0;
    const dpc_ce_layer &last = lin->layer[lin->layers - 1];
    if (last.epilogue != DPC_EPI_BIAS)
        return 0;
    if (lin->layers == 1)
        return ce_layer_fits(N, C, last) || ce_head_share(dtype, N, C, *lin) > 0;
    const dpc_ce_layer &hidden = lin->layer[0];
    return ce_layer_fits(N, C, last) && last.x == hidden.out && N * last.K <= CE_HIDDEN_MAX &&
           ce_layer_fits(N, last.K, hidden);
}

extern "C" int dpc_cross_entropy(int dtype, int64_t N, int64_t C, const void *input, const int64_t *target,
                                 const double *weight, int64_t ignore_index, double smoothing, int log_probs,
                                 int reduction, double *rows, double *probs, void *out, double *denom,
                                 void *grad_one, int *grad_one_done, const dpc_ce_linear *linear,
                                 dpc_kernel_error *err, void *stream)
{
    *grad_one_done = 0;
    if (!dt_is_float(dtype))
        return DPC_UNSUPPORTED;
    if (N < 0 || C < 0)
        return (int)cudaErrorInvalidValue;
    dpc_ce_linear lin = {};
    if (linear)
        lin = *linear;
    /* > 0: the head's launch (which dpc_cross_entropy_takes_linear would
     * also find, at the cost of planning the head's product again) */
    const int64_t k_share = linear ? ce_head_share(dtype, N, C, lin) : 0;
    if (linear && ((k_share == 0 && !dpc_cross_entropy_takes_linear(dtype, N, C, linear)) ||
                   linear->layer[linear->layers - 1].out != input))
        return (int)cudaErrorInvalidValue;
    ce_args r = { N, C, (const char *)input, target, weight, ignore_index, smoothing, log_probs,
                  rows, log_probs ? NULL : probs, err };
    ce_red_args rr = { N, C, rows, target, weight, ignore_index, reduction, (char *)out, denom };
    ce_bwd_args rb = { N, C, reduction == DPC_CE_NONE ? NULL : (char *)grad_one, r.probs, target, weight,
                       ignore_index, smoothing, log_probs, !log_probs && smoothing > 0 && weight != NULL, NULL,
                       reduction, denom };
    int threads, fused_G = ce_fused_group(N, C, &threads);
    return with_float_dtype(dtype, [&](auto d) {
        constexpr int DT = decltype(d)::value;
        if (fused_G) {
            int rc = with_ce_group(fused_G, [&](auto g) {
                constexpr int GS = decltype(g)::value;
                if constexpr (GS * CE_HEAD_ROWS <= CE_HEAD_THREADS)
                    if (k_share > 0) {
                        cudaLaunchAttribute cluster;
                        cluster.id = cudaLaunchAttributeClusterDimension;
                        cluster.val.clusterDim.x = (unsigned)CEIL_DIV(N, (int64_t)CE_HEAD_ROWS);
                        cluster.val.clusterDim.y = cluster.val.clusterDim.z = 1;
                        return launch_kernel_with(&cluster, 1, ce_fused_kernel<DT, GS, true>,
                                                  cluster.val.clusterDim.x, CE_HEAD_THREADS, (cudaStream_t)stream, r,
                                                  rr, rb, lin, k_share);
                    }
                return launch_kernel(ce_fused_kernel<DT, GS, false>, 1, threads, (cudaStream_t)stream, r, rr, rb,
                                     lin, (int64_t)0);
            });
            *grad_one_done = !rc && rb.dinput != NULL;
            return rc;
        }
        if (N > 0) {
            int st = with_group(group_size(C, N), [&](auto g) {
                constexpr int GS = decltype(g)::value;
                return launch_kernel(ce_kernel<DT, GS>, grid_for(N, GS), RED_THREADS, (cudaStream_t)stream, r);
            });
            if (st)
                return st;
        }
        return launch_kernel(ce_reduce_kernel<DT>, 1, RED_THREADS, (cudaStream_t)stream, rr);
    });
}

extern "C" int dpc_cross_entropy_backward(int dtype, int64_t N, int64_t C, void *dinput, const double *probs,
                                          const int64_t *target, const double *weight, int64_t ignore_index,
                                          double smoothing, int log_probs, int reduction, const void *g,
                                          const double *denom, void *stream)
{
    if (!dt_is_float(dtype))
        return DPC_UNSUPPORTED;
    if (N < 0 || C < 0)
        return (int)cudaErrorInvalidValue;
    if (N == 0 || C == 0)
        return 0;
    ce_bwd_args r = { N, C, (char *)dinput, probs, target, weight, ignore_index, smoothing, log_probs,
                      !log_probs && smoothing > 0 && weight != NULL, (const char *)g, reduction, denom };
    int64_t grid = CEIL_DIV(N * C, (int64_t)RED_THREADS);
    /* every block sums the C weights once: fewer, fuller blocks then */
    int64_t cap = r.need_wall ? 1024 : DPC_MAX_BLOCKS;
    if (grid > cap)
        grid = cap;
    return with_float_dtype(dtype, [&](auto d) {
        return launch_kernel(ce_bwd_kernel<decltype(d)::value>, (unsigned)grid, RED_THREADS, (cudaStream_t)stream, r);
    });
}
