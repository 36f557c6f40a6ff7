/*
 * norm.cu — LayerNorm on the GPU, behind dpc_ops.h: the semantics of
 * src/cpu/norm.c, accumulated in float (double for float64 data).
 *
 * Forward: a row of up to 1024 elements goes to a warp (eight rows to a
 * block), a longer one to a whole block. Each thread takes the same share
 * of its row in three passes (the sum, the squared deviations from the
 * mean, the output): two passes keep the variance of large values with a
 * small spread exact, and the second and third reads of a row come from
 * the cache. Where n and every operand allow, a thread reads 16 bytes of
 * input at a time (a compile-time choice, as in gemm_own.cu).
 *
 * Backward: a block takes one row at a time, over up to 1024 blocks (as
 * many as 8 MiB of partial sums hold, at least 128): a block's rows run one
 * after another, so the rows in flight are the blocks. A thread owns the
 * same columns in every row, so it adds their shares of dweight and dbias
 * without atomics, in shared memory (or in its block's slice of the
 * workspace, for rows too long for it); a second kernel adds the blocks'
 * partial sums column by column in a fixed order. The block count depends
 * on the shape alone: the same bits on every run and every GPU.
 *
 * BatchNorm (x as (N, C, S)): a channel's N S elements are cut into up to
 * 256 slices of at least 4096 (bn_slices), a block each; a block's threads
 * keep a count, mean and sum of squared deviations (Welford's, merged by
 * Chan's formula, so large values with a small spread stay exact), merged
 * over the block in a fixed order. One slice (small channels) finishes the
 * channel in the block; else a second kernel merges the slices, a warp to
 * a channel, in slice order. Then one elementwise pass writes the output.
 * The backward sums dy and dy * (x - mean) the same way, then writes dx in
 * one elementwise pass. No atomics: the same bits on every run.
 */
#include <stdint.h>

#include <cuda_runtime.h>

#include "common/dplua_codes.h"
#include "common/dtype_conv.h"
#include "dpc_ops.h"
#include "launch.cuh"

#define LN_THREADS 256                   /* a block of the warp-per-row forward: eight rows */
#define LN_WARP_ROW 1024                 /* rows of up to this many elements go to one warp */
#define LN_BW_MIN_BLOCKS 128             /* the backward's blocks (backward_blocks) */
#define LN_BW_MAX_BLOCKS 1024
#define LN_BW_PARTIAL_BYTES (8 << 20)
#define LN_SHARED_BYTES (48 * 1024)      /* the partial sums kept in shared memory up to this size */
#define BN_THREADS 256                   /* BatchNorm's blocks */
#define BN_SLICE 4096                    /* a channel's elements a block of the reductions takes at least */
#define BN_MAX_SLICES 256                /* and its blocks at most */

namespace {   /* file-local types: no clash with another file's of the same name */

typedef uint16_t bf16;   /* the bits of a bfloat16 */

/* what a row is accumulated in */
template <class T> struct acc_of { typedef float type; };
template <> struct acc_of<double> { typedef double type; };

__device__ __forceinline__ float ld(float v) { return v; }
__device__ __forceinline__ double ld(double v) { return v; }
__device__ __forceinline__ float ld(bf16 v) { return bf16_to_f32(v); }
__device__ __forceinline__ void put(float &d, float v) { d = v; }
__device__ __forceinline__ void put(double &d, double v) { d = v; }
__device__ __forceinline__ void put(bf16 &d, float v) { d = f32_to_bf16(v); }

/* E elements loaded or stored at once, in 16-byte loads at most (eight
 * float32 outputs of eight bfloat16 inputs are two) */
#define VEC_ALIGN(size, E) ((size) * (E) < 16 ? (size) * (E) : 16)
template <class T, int E> struct alignas(VEC_ALIGN(sizeof(T), E)) vec { T e[E]; };

struct ln_forward_args {
    int64_t rows, n;
    const void *x, *residual, *weight, *bias;
    void *out, *sum, *mean, *rstd;
    double eps;
};

struct ln_backward_args {
    int64_t rows, n;
    const void *x, *weight, *dy, *mean, *rstd;
    void *dx;
    void *partial;       /* (blocks, 2, n) partial sums of dweight and dbias, or NULL when neither is wanted */
    int in_shared;       /* the sums are made in shared memory, then copied to partial */
    int dx_adds;         /* dx += the gradient: dx holds the gradient of x's other uses */
};

}  // namespace

/* The sum of v over a group: a warp (G = 32) or the whole block (G = 0),
 * whose size is a multiple of 32. Every thread of the group gets the same
 * bits: the butterfly adds the same pairs in every lane, and the warps'
 * sums are added in warp order. */
template <int G, class A>
__device__ __forceinline__ static A group_sum(A v, A *red)
{
    for (int s = 16; s > 0; s >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, s);
    if (G == 32)
        return v;
    __syncthreads();   /* the last sum has been read from red */
    if (threadIdx.x % 32 == 0)
        red[threadIdx.x / 32] = v;
    __syncthreads();
    A t = 0;
    for (int w = 0; w < (int)blockDim.x / 32; w++)
        t += red[w];
    return t;
}

/* x, sum: (rows, n) of TI; residual: (rows, n) of TR; out: (rows, n) of
 * TO; weight, bias: n of TW */
template <class TI, class TO, class TR, class TW, int G, int E, bool RES>
__global__ static void ln_forward_kernel(ln_forward_args a)
{
    begin_after_previous_kernel();
    typedef typename acc_of<TI>::type A;
    typedef vec<TI, E> VI;
    typedef vec<TO, E> VO;
    typedef vec<TW, E> VW;
    __shared__ A red[32];
    const int size = G ? G : (int)blockDim.x, lane = (int)threadIdx.x % size;
    const int64_t groups = blockDim.x / size, chunks = a.n / E;
    const VW *w = (const VW *)a.weight, *b = (const VW *)a.bias;
    for (int64_t row = blockIdx.x * groups + threadIdx.x / size; row < a.rows; row += gridDim.x * groups) {
        const VI *x = (const VI *)a.x + row * chunks;
        VI *h = RES ? (VI *)a.sum + row * chunks : NULL;
        A s = 0;
        for (int64_t c = lane; c < chunks; c += size) {
            VI v = x[c];
            if (RES) {
                vec<TR, E> r = ((const vec<TR, E> *)a.residual)[row * chunks + c];
                for (int k = 0; k < E; k++)
                    put(v.e[k], ld(v.e[k]) + ld(r.e[k]));
                h[c] = v;   /* read back below by this thread alone */
            }
            for (int k = 0; k < E; k++)
                s += ld(v.e[k]);
        }
        const A mean = group_sum<G>(s, red) / (A)a.n;
        const VI *src = RES ? h : x;
        A q = 0;
        for (int64_t c = lane; c < chunks; c += size) {
            VI v = src[c];
            for (int k = 0; k < E; k++) {
                A d = ld(v.e[k]) - mean;
                q += d * d;
            }
        }
        const A rstd = (A)1 / sqrt(group_sum<G>(q, red) / (A)a.n + (A)a.eps);
        VO *out = (VO *)a.out + row * chunks;
        for (int64_t c = lane; c < chunks; c += size) {
            VI v = src[c];
            VO y;
            VW wv, bv;
            if (w)
                wv = w[c];
            if (b)
                bv = b[c];
            for (int k = 0; k < E; k++) {
                A t = (ld(v.e[k]) - mean) * rstd;
                if (w)
                    t *= ld(wv.e[k]);
                if (b)
                    t += ld(bv.e[k]);
                put(y.e[k], t);
            }
            out[c] = y;
        }
        if (lane == 0) {
            ((A *)a.mean)[row] = mean;
            ((A *)a.rstd)[row] = rstd;
        }
    }
}

/* With xh = (x - mean) * rstd and g = dy * weight: dx = rstd * (g - mean(g)
 * - xh * mean(g * xh)); each thread adds dy * xh and dy of its columns to
 * its block's partial sums. x, dx: (rows, n) of TI; dy: (rows, n) of TO;
 * weight: n of TW. */
template <class TI, class TO, class TW, int E>
__global__ static void ln_backward_kernel(ln_backward_args a)
{
    begin_after_previous_kernel();
    typedef typename acc_of<TI>::type A;
    typedef vec<TI, E> VI;
    typedef vec<TO, E> VO;
    typedef vec<TW, E> VW;
    extern __shared__ __align__(16) unsigned char ln_shared[];
    __shared__ A red[32];
    const int64_t n = a.n, chunks = n / E;
    A *acc = !a.partial ? NULL : a.in_shared ? (A *)ln_shared : (A *)a.partial + blockIdx.x * 2 * n;
    for (int64_t j = threadIdx.x * E; acc && j < n; j += blockDim.x * E)
        for (int k = 0; k < E; k++)
            acc[j + k] = acc[n + j + k] = 0;
    const VW *w = (const VW *)a.weight;
    for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
        const VI *x = (const VI *)a.x + row * chunks;
        const VO *dy = (const VO *)a.dy + row * chunks;
        const A mean = ((const A *)a.mean)[row], rstd = ((const A *)a.rstd)[row];
        A sg = 0, sgx = 0;
        for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
            VI xv = x[c];
            VO gv = dy[c];
            VW wv;
            if (w)
                wv = w[c];
            for (int k = 0; k < E; k++) {
                A xh = (ld(xv.e[k]) - mean) * rstd, g = ld(gv.e[k]);
                if (acc) {
                    acc[c * E + k] += g * xh;
                    acc[n + c * E + k] += g;
                }
                if (w)
                    g *= ld(wv.e[k]);
                sg += g;
                sgx += g * xh;
            }
        }
        if (!a.dx)
            continue;
        sg = group_sum<0>(sg, red) / (A)n;
        sgx = group_sum<0>(sgx, red) / (A)n;
        VI *dx = (VI *)a.dx + row * chunks;
        for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
            VI xv = x[c], d;
            VO gv = dy[c];
            VW wv;
            if (w)
                wv = w[c];
            if (a.dx_adds)
                d = dx[c];
            for (int k = 0; k < E; k++) {
                A xh = (ld(xv.e[k]) - mean) * rstd, g = ld(gv.e[k]);
                if (w)
                    g *= ld(wv.e[k]);
                put(d.e[k], rstd * (g - sg - xh * sgx) + (a.dx_adds ? ld(d.e[k]) : (A)0));
            }
            dx[c] = d;
        }
    }
    if (!acc || !a.in_shared)
        return;
    A *part = (A *)a.partial + blockIdx.x * 2 * n;
    for (int64_t j = threadIdx.x * E; j < n; j += blockDim.x * E)
        for (int k = 0; k < E; k++) {
            part[j + k] = acc[j + k];
            part[n + j + k] = acc[n + j + k];
        }
}

/* dw[j], db[j] = the blocks' partial sums of column j. A block of 32 warps
 * takes 32 columns, a lane each (the reads coalesce); warp w adds the
 * partial sums of blocks w, w + 32, ... in order, then the first warp adds
 * the 32 warps' sums in warp order: the same bits on every run. */
template <class TO, class A>
__global__ static void ln_param_grads_kernel(const A *partial, int64_t blocks, int64_t n, TO *dw, TO *db)
{
    begin_after_previous_kernel();
    __shared__ A warp_w[32][33], warp_b[32][33];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int64_t j = blockIdx.x * 32 + lane;
    A sw = 0, sb = 0;
    for (int64_t k = warp; j < n && k < blocks; k += 32) {
        sw += partial[k * 2 * n + j];
        sb += partial[k * 2 * n + n + j];
    }
    warp_w[warp][lane] = sw;
    warp_b[warp][lane] = sb;
    __syncthreads();
    if (warp != 0 || j >= n)
        return;
    for (int w = 1; w < 32; w++) {
        sw += warp_w[w][lane];
        sb += warp_b[w][lane];
    }
    if (dw)
        put(dw[j], sw);
    if (db)
        put(db[j], sb);
}

/* ------------------------------------------------------------------------ */
/* launchers                                                                 */
/* ------------------------------------------------------------------------ */

template <class T> struct tag { typedef T type; };

/* f(tag<TI>, tag<TO>) for the dtype pairs the kernels take: LayerNorm's
 * (input, output), BatchNorm's (input, parameters) */
template <class F> static int with_dtypes(int in, int out, F f)
{
    if (in == DP_FLOAT32 && out == DP_FLOAT32)
        return f(tag<float>(), tag<float>());
    if (in == DP_FLOAT64 && out == DP_FLOAT64)
        return f(tag<double>(), tag<double>());
    if (in == DP_BFLOAT16 && out == DP_BFLOAT16)
        return f(tag<bf16>(), tag<bf16>());
    if (in == DP_BFLOAT16 && out == DP_FLOAT32)
        return f(tag<bf16>(), tag<float>());
    return DPC_UNSUPPORTED;
}

/* whether rows of n elements and every pointer of ps (NULL, or aligned as
 * a vec of E elements of `size` bytes) take loads of E elements */
static bool takes_vectors(int64_t n, int E, const void *const *ps, int count, size_t size)
{
    if (n % E)
        return false;
    for (int i = 0; i < count; i++)
        if ((uintptr_t)ps[i] % VEC_ALIGN(size, (size_t)E))
            return false;
    return true;
}

/* a block over one row: a thread for each of its chunks, in whole warps, 32 to 512 */
static int row_block_threads(int64_t chunks)
{
    int64_t t = CEIL_DIV(chunks, 32) * 32;
    return t < 32 ? 32 : t > 512 ? 512 : (int)t;
}

/* f(tag<TI>, tag<TO>, tag<TR>, tag<TW>) for LayerNorm's dtypes: input
 * and output a pair of with_dtypes, or float32 in and bfloat16 out; the
 * parameters float32 unless both are bfloat16 (float64 with float64); the
 * residual the input's, or bfloat16 beside a float32 input. */
template <class F> static int with_ln_dtypes(int in, int out, int res, F f)
{
    if (in == DP_FLOAT32 && res == DP_BFLOAT16) {
        if (out == DP_FLOAT32)
            return f(tag<float>(), tag<float>(), tag<bf16>(), tag<float>());
        if (out == DP_BFLOAT16)
            return f(tag<float>(), tag<bf16>(), tag<bf16>(), tag<float>());
        return DPC_UNSUPPORTED;
    }
    if (res != in)
        return DPC_UNSUPPORTED;
    if (in == DP_FLOAT32 && out == DP_BFLOAT16)
        return f(tag<float>(), tag<bf16>(), tag<float>(), tag<float>());
    return with_dtypes(in, out, [&](auto ti, auto to) {
        return f(ti, to, ti, to);   /* (bfloat16, float32): float32 parameters, the output's */
    });
}

template <class TI, class TO, class TR, class TW, int E>
static int launch_forward(const ln_forward_args &r, cudaStream_t stream)
{
    const bool res = r.residual != NULL;
    if (r.n <= LN_WARP_ROW) {
        unsigned grid = grid_stride_blocks(r.rows, LN_THREADS / 32);
        return res ? launch_kernel(ln_forward_kernel<TI, TO, TR, TW, 32, E, true>, grid, LN_THREADS, stream, r)
                   : launch_kernel(ln_forward_kernel<TI, TO, TR, TW, 32, E, false>, grid, LN_THREADS, stream, r);
    }
    unsigned grid = grid_stride_blocks(r.rows, 1);
    int threads = row_block_threads(r.n / E);
    return res ? launch_kernel(ln_forward_kernel<TI, TO, TR, TW, 0, E, true>, grid, threads, stream, r)
               : launch_kernel(ln_forward_kernel<TI, TO, TR, TW, 0, E, false>, grid, threads, stream, r);
}

extern "C" int dpc_layer_norm(int in_dtype, int out_dtype, const dpc_norm *a, void *out, void *sum, void *mean,
                              void *rstd, void *stream)
{
    if (a->n < 1 || a->rows < 0 || (a->residual && !sum))
        return (int)cudaErrorInvalidValue;
    if (a->rows == 0)
        return 0;
    ln_forward_args r = { a->rows, a->n, a->x, a->residual, a->weight, a->bias, out, sum, mean, rstd, a->eps };
    const int res_dtype = a->residual ? a->residual_dtype : in_dtype;
    return with_ln_dtypes(in_dtype, out_dtype, res_dtype, [&](auto ti, auto to, auto tr, auto tw) {
        typedef typename decltype(ti)::type TI;
        typedef typename decltype(to)::type TO;
        typedef typename decltype(tr)::type TR;
        typedef typename decltype(tw)::type TW;
        constexpr int V = 16 / sizeof(TI);
        const void *ins[2] = { a->x, sum }, *res[1] = { a->residual }, *outs[1] = { out },
                   *params[2] = { a->weight, a->bias };
        return takes_vectors(a->n, V, ins, 2, sizeof(TI)) && takes_vectors(a->n, V, res, 1, sizeof(TR)) &&
                       takes_vectors(a->n, V, outs, 1, sizeof(TO)) && takes_vectors(a->n, V, params, 2, sizeof(TW))
                   ? launch_forward<TI, TO, TR, TW, V>(r, (cudaStream_t)stream)
                   : launch_forward<TI, TO, TR, TW, 1>(r, (cudaStream_t)stream);
    });
}

/* The backward's blocks: as many as LN_BW_PARTIAL_BYTES of partial sums
 * hold, from LN_BW_MIN_BLOCKS to LN_BW_MAX_BLOCKS, and no more than rows */
static int64_t backward_blocks(int64_t rows, int64_t n, size_t acc_size)
{
    int64_t fit = (int64_t)(LN_BW_PARTIAL_BYTES / (2 * (size_t)n * acc_size));
    int64_t blocks = fit > LN_BW_MAX_BLOCKS ? LN_BW_MAX_BLOCKS : fit < LN_BW_MIN_BLOCKS ? LN_BW_MIN_BLOCKS : fit;
    return rows < blocks ? rows : blocks;
}

extern "C" size_t dpc_layer_norm_workspace(int in_dtype, int64_t rows, int64_t n)
{
    size_t acc_size = in_dtype == DP_FLOAT64 ? 8 : 4;
    return (size_t)backward_blocks(rows, n, acc_size) * 2 * (size_t)n * acc_size;
}

template <class TI, class TO, class TW, int E>
static int launch_backward(ln_backward_args r, void *dw, void *db, cudaStream_t stream)
{
    typedef typename acc_of<TI>::type A;
    const int64_t blocks = backward_blocks(r.rows, r.n, sizeof(A));
    const size_t shared = 2 * (size_t)r.n * sizeof(A);
    r.in_shared = r.partial && shared <= LN_SHARED_BYTES;
    int rc = 0;
    if (blocks > 0)
        rc = launch_kernel_smem(NULL, 0, r.in_shared ? shared : 0, ln_backward_kernel<TI, TO, TW, E>, (unsigned)blocks,
                                row_block_threads(r.n / E), stream, r);
    if (rc || !(dw || db))
        return rc;   /* (without rows, the sums of no blocks: zeros) */
    return launch_kernel(ln_param_grads_kernel<TW, A>, (unsigned)CEIL_DIV(r.n, 32), 32 * 32, stream,
                         (const A *)r.partial, blocks, r.n, (TW *)dw, (TW *)db);
}

extern "C" int dpc_layer_norm_backward(int in_dtype, int out_dtype, const dpc_norm *a, const void *dy,
                                       const void *mean, const void *rstd, void *dx, void *dw, void *db,
                                       void *workspace, void *stream)
{
    if (a->n < 1 || a->rows < 0 || ((dw || db) && !workspace && a->rows > 0))
        return (int)cudaErrorInvalidValue;
    ln_backward_args r = { a->rows, a->n, a->x, a->weight, dy, mean, rstd, dx, (dw || db) ? workspace : NULL, 0,
                           a->dx_adds };
    return with_ln_dtypes(in_dtype, out_dtype, in_dtype, [&](auto ti, auto to, auto, auto tw) {
        typedef typename decltype(ti)::type TI;
        typedef typename decltype(to)::type TO;
        typedef typename decltype(tw)::type TW;
        constexpr int V = 16 / sizeof(TI);
        const void *ins[2] = { a->x, dx }, *outs[1] = { dy }, *params[1] = { a->weight };
        return takes_vectors(a->n, V, ins, 2, sizeof(TI)) && takes_vectors(a->n, V, outs, 1, sizeof(TO)) &&
                       takes_vectors(a->n, V, params, 1, sizeof(TW))
                   ? launch_backward<TI, TO, TW, V>(r, dw, db, (cudaStream_t)stream)
                   : launch_backward<TI, TO, TW, 1>(r, dw, db, (cudaStream_t)stream);
    });
}

/* ------------------------------------------------------------------------ */
/* BatchNorm                                                                 */
/* ------------------------------------------------------------------------ */

namespace {

/* what every BatchNorm kernel reads; x, dy, out (y or dx) as units of V
 * elements, Sv of them to a channel's plane */
struct bn_args {
    int64_t N, C, Sv, slices;
    const void *x, *weight, *bias, *dy;
    void *running_mean, *running_var;
    void *mean, *invstd;     /* C of the accumulator type */
    void *out, *dw, *db;
    void *sums;              /* backward: (2, C) sums of dy and dy * (x - mean) */
    void *partial;           /* (3, slices, C) Welford states, or (2, slices, C) sums, when slices > 1 */
    int training;
    double momentum, eps, count;   /* count: a channel's elements, N S */
};

/* n values, their mean and the sum of their squared deviations */
template <class A> struct wstat { A n, mean, m2; };

}  // namespace

/* the statistics of the values of a and b together (Chan et al.) */
template <class A>
__device__ __forceinline__ static wstat<A> merge(wstat<A> a, wstat<A> b)
{
    const A n = a.n + b.n, d = b.mean - a.mean, f = b.n / (n > 0 ? n : (A)1);   /* no branch: see channel_units */
    wstat<A> r = { n, a.mean + d * f, a.m2 + b.m2 + d * d * a.n * f };
    return r;
}

/* lane 0 gets the warp's statistics, merged in a fixed order */
template <class A>
__device__ __forceinline__ static wstat<A> warp_merge(wstat<A> s)
{
    for (int o = 16; o > 0; o >>= 1) {
        wstat<A> t = { __shfl_down_sync(0xffffffffu, s.n, o), __shfl_down_sync(0xffffffffu, s.mean, o),
                       __shfl_down_sync(0xffffffffu, s.m2, o) };
        s = merge(s, t);
    }
    return s;
}

/* thread 0 gets the block's statistics, the warps merged in order */
template <class A>
__device__ __forceinline__ static wstat<A> block_merge(wstat<A> s)
{
    __shared__ wstat<A> warps[32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    s = warp_merge(s);
    if (lane == 0)
        warps[warp] = s;
    __syncthreads();
    if (warp == 0) {
        wstat<A> none = { 0, 0, 0 };
        s = warp_merge(lane < (int)blockDim.x / 32 ? warps[lane] : none);
    }
    return s;
}

/* body(i) for the thread's units of channel c among its units begin ..
 * end - 1 (counted over n, then the plane), i the unit's index in x */
template <class Body>
__device__ __forceinline__ static void channel_units(const bn_args &a, int64_t c, int64_t begin, int64_t end,
                                                     Body body)
{
    const int64_t u = begin + threadIdx.x;
    if (u >= end)
        return;
    int64_t n = u / a.Sv, s = u - n * a.Sv;
    const int64_t dn = blockDim.x / a.Sv, ds = blockDim.x - dn * a.Sv, turns = CEIL_DIV(end - u, (int64_t)blockDim.x);
#pragma unroll 4   /* a counted loop without branches: the loads of four turns go out before their use */
    for (int64_t t = 0; t < turns; t++) {
        body((n * a.C + c) * a.Sv + s);
        s += ds;
        n += dn;
        if (s >= a.Sv) {
            s -= a.Sv;
            n++;
        }
    }
}

/* this block's channel and its share of the channel's units */
__device__ __forceinline__ static void block_slice(const bn_args &a, int64_t *c, int64_t *begin, int64_t *end)
{
    const int64_t units = a.N * a.Sv, per = CEIL_DIV(units, a.slices), b = blockIdx.x % a.slices;
    *c = blockIdx.x / a.slices;
    *begin = b * per;
    *end = *begin + per < units ? *begin + per : units;
}

/* channel c's mean and invstd from its statistics; the running ones moved */
template <class TP, class A>
__device__ __forceinline__ static void finish_stats(const bn_args &a, int64_t c, wstat<A> s)
{
    ((A *)a.mean)[c] = s.mean;
    ((A *)a.invstd)[c] = (A)1 / sqrt(s.m2 / s.n + (A)a.eps);
    if (a.running_mean) {
        TP *rm = (TP *)a.running_mean, *rv = (TP *)a.running_var;
        const A mom = (A)a.momentum;
        put(rm[c], ((A)1 - mom) * ld(rm[c]) + mom * s.mean);
        put(rv[c], ((A)1 - mom) * ld(rv[c]) + mom * (s.m2 / (s.n - 1)));
    }
}

/* a block a slice of a channel: its statistics to the partials, or, when
 * the channel is one slice (FINISH), the channel's mean and invstd */
template <class TX, class TP, int V, bool FINISH>
__global__ static void bn_stats_kernel(bn_args a)
{
    begin_after_previous_kernel();
    typedef typename acc_of<TX>::type A;
    typedef vec<TX, V> VX;
    int64_t c, begin, end;
    block_slice(a, &c, &begin, &end);
    wstat<A> s = { 0, 0, 0 };
    channel_units(a, c, begin, end, [&](int64_t i) {
        const VX v = ((const VX *)a.x)[i];
        A sum = 0, q = 0;
        for (int k = 0; k < V; k++)
            sum += ld(v.e[k]);
        const A m = sum / (A)V;
        for (int k = 0; k < V; k++)
            q += (ld(v.e[k]) - m) * (ld(v.e[k]) - m);
        wstat<A> t = { (A)V, m, q };
        s = merge(s, t);
    });
    s = block_merge(s);
    if (threadIdx.x != 0)
        return;
    if (FINISH) {
        finish_stats<TP>(a, c, s);
        return;
    }
    A *p = (A *)a.partial;
    const int64_t at = (blockIdx.x % a.slices) * a.C + c, plane = a.slices * a.C;
    p[at] = s.n;
    p[plane + at] = s.mean;
    p[2 * plane + at] = s.m2;
}

/* a warp a channel: its slices' statistics merged in order (training), or
 * the mean and invstd of the running statistics */
template <class TP, class A>
__global__ static void bn_stats_finish_kernel(bn_args a)
{
    begin_after_previous_kernel();
    const int64_t c = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    if (c >= a.C)
        return;   /* (the whole warp) */
    if (!a.training) {
        if (lane == 0) {
            ((A *)a.mean)[c] = ld(((const TP *)a.running_mean)[c]);
            ((A *)a.invstd)[c] = (A)1 / sqrt(ld(((const TP *)a.running_var)[c]) + (A)a.eps);
        }
        return;
    }
    const A *p = (const A *)a.partial;
    const int64_t plane = a.slices * a.C;
    wstat<A> s = { 0, 0, 0 };
    for (int64_t b = lane; b < a.slices; b += 32) {
        wstat<A> t = { p[b * a.C + c], p[plane + b * a.C + c], p[2 * plane + b * a.C + c] };
        s = merge(s, t);
    }
    s = warp_merge(s);
    if (lane == 0)
        finish_stats<TP>(a, c, s);
}

/* i's channel: unit i lies in plane i / Sv of the (N, C) planes */
template <class I>
__device__ __forceinline__ static int64_t channel_of(const bn_args &a, int64_t i)
{
    return (int64_t)(((I)i / (I)a.Sv) % (I)a.C);
}

/* out = (x - mean) * invstd * weight + bias; I: the unit index's type for
 * the division (32 bits where the units allow) */
template <class TX, class TP, int V, class I>
__global__ static void bn_apply_kernel(bn_args a)
{
    begin_after_previous_kernel();
    typedef typename acc_of<TX>::type A;
    typedef vec<TX, V> VX;
    const A *mean = (const A *)a.mean, *invstd = (const A *)a.invstd;
    const TP *w = (const TP *)a.weight, *b = (const TP *)a.bias;
    grid_stride_loop(a.N * a.C * a.Sv, [&](int64_t i) {
        const int64_t c = channel_of<I>(a, i);
        const A m = mean[c], scale = w ? invstd[c] * ld(w[c]) : invstd[c], shift = b ? ld(b[c]) : (A)0;
        const VX v = ((const VX *)a.x)[i];
        VX y;
        for (int k = 0; k < V; k++)
            put(y.e[k], (ld(v.e[k]) - m) * scale + shift);
        ((VX *)a.out)[i] = y;
    });
}

/* channel c's sums: kept for dx, and dweight = sum dy * xh, dbias = sum dy */
template <class TP, class A>
__device__ __forceinline__ static void finish_sums(const bn_args &a, int64_t c, A sg, A sgx)
{
    ((A *)a.sums)[c] = sg;
    ((A *)a.sums)[a.C + c] = sgx;
    if (a.dw)
        put(((TP *)a.dw)[c], sgx * ((const A *)a.invstd)[c]);
    if (a.db)
        put(((TP *)a.db)[c], sg);
}

/* a block a slice of a channel: the sums of dy and dy * (x - mean) to the
 * partials, or, when the channel is one slice (FINISH), the channel's */
template <class TX, class TP, int V, bool FINISH>
__global__ static void bn_backward_reduce_kernel(bn_args a)
{
    begin_after_previous_kernel();
    typedef typename acc_of<TX>::type A;
    typedef vec<TX, V> VX;
    __shared__ A red[32];
    int64_t c, begin, end;
    block_slice(a, &c, &begin, &end);
    const A m = ((const A *)a.mean)[c];
    A sg = 0, sgx = 0;
    channel_units(a, c, begin, end, [&](int64_t i) {
        const VX g = ((const VX *)a.dy)[i], v = ((const VX *)a.x)[i];
        for (int k = 0; k < V; k++) {
            sg += ld(g.e[k]);
            sgx += ld(g.e[k]) * (ld(v.e[k]) - m);
        }
    });
    sg = group_sum<0>(sg, red);
    sgx = group_sum<0>(sgx, red);
    if (threadIdx.x != 0)
        return;
    if (FINISH) {
        finish_sums<TP>(a, c, sg, sgx);
        return;
    }
    A *p = (A *)a.partial;
    const int64_t at = (blockIdx.x % a.slices) * a.C + c;
    p[at] = sg;
    p[a.slices * a.C + at] = sgx;
}

/* a warp a channel: its slices' sums added in order */
template <class TP, class A>
__global__ static void bn_backward_finish_kernel(bn_args a)
{
    begin_after_previous_kernel();
    const int64_t c = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    if (c >= a.C)
        return;   /* (the whole warp) */
    const A *p = (const A *)a.partial;
    A sg = 0, sgx = 0;
    for (int64_t b = lane; b < a.slices; b += 32) {
        sg += p[b * a.C + c];
        sgx += p[a.slices * a.C + b * a.C + c];
    }
    for (int o = 16; o > 0; o >>= 1) {
        sg += __shfl_down_sync(0xffffffffu, sg, o);
        sgx += __shfl_down_sync(0xffffffffu, sgx, o);
    }
    if (lane == 0)
        finish_sums<TP>(a, c, sg, sgx);
}

/* dx = k1 dy + k2 (x - mean) + k3, with k1 = weight * invstd and, for the
 * batch's statistics, k2 = -k1 invstd^2 mean(dy (x - mean)) and k3 = -k1
 * mean(dy) (k2 = k3 = 0 for running ones) */
template <class TX, class TP, int V, class I>
__global__ static void bn_dx_kernel(bn_args a)
{
    begin_after_previous_kernel();
    typedef typename acc_of<TX>::type A;
    typedef vec<TX, V> VX;
    const A *mean = (const A *)a.mean, *invstd = (const A *)a.invstd, *sums = (const A *)a.sums;
    const TP *w = (const TP *)a.weight;
    grid_stride_loop(a.N * a.C * a.Sv, [&](int64_t i) {
        const int64_t c = channel_of<I>(a, i);
        const A rs = invstd[c], k1 = w ? rs * ld(w[c]) : rs;
        const VX g = ((const VX *)a.dy)[i];
        VX d;
        if (a.training) {
            const A m = mean[c], k2 = -k1 * rs * rs * (sums[a.C + c] / (A)a.count),
                    k3 = -k1 * (sums[c] / (A)a.count);
            const VX v = ((const VX *)a.x)[i];
            for (int k = 0; k < V; k++)
                put(d.e[k], k1 * ld(g.e[k]) + k2 * (ld(v.e[k]) - m) + k3);
        } else {
            for (int k = 0; k < V; k++)
                put(d.e[k], k1 * ld(g.e[k]));
        }
        ((VX *)a.out)[i] = d;
    });
}

/* the blocks of a channel's reductions: one per BN_SLICE elements, 1 to
 * BN_MAX_SLICES — enough blocks to fill the GPU for the few channels of a
 * large activation, one block a channel for small ones */
static int64_t bn_slices(const dpc_bn *a)
{
    const int64_t s = CEIL_DIV(a->N * a->S, BN_SLICE);
    return s < 1 ? 1 : s > BN_MAX_SLICES ? BN_MAX_SLICES : s;
}

extern "C" size_t dpc_batch_norm_workspace(int in_dtype, const dpc_bn *a, int backward)
{
    const size_t acc = in_dtype == DP_FLOAT64 ? 8 : 4, slices = (size_t)bn_slices(a), C = (size_t)a->C;
    if (backward)
        return acc * C * (2 + (slices > 1 ? 2 * slices : 0));
    return a->training && slices > 1 ? acc * C * 3 * slices : 0;
}

/* the kernels' arguments: units of V elements */
static bn_args bn_args_of(const dpc_bn *a, int V, void *workspace, bool backward)
{
    bn_args r = {};
    r.N = a->N;
    r.C = a->C;
    r.Sv = a->S / V;
    r.slices = bn_slices(a);
    r.x = a->x;
    r.weight = a->weight;
    r.bias = a->bias;
    r.running_mean = a->running_mean;
    r.running_var = a->running_var;
    r.training = a->training;
    r.momentum = a->momentum;
    r.eps = a->eps;
    r.count = (double)a->N * (double)a->S;
    r.sums = backward ? workspace : NULL;
    r.partial = workspace;
    return r;
}

template <class TX, class TP, int V>
static int launch_bn_forward(bn_args r, cudaStream_t stream)
{
    typedef typename acc_of<TX>::type A;
    const unsigned finish_grid = (unsigned)CEIL_DIV(r.C, BN_THREADS / 32);
    int rc;
    if (!r.training)
        rc = launch_kernel(bn_stats_finish_kernel<TP, A>, finish_grid, BN_THREADS, stream, r);
    else if (r.slices == 1)
        rc = launch_kernel(bn_stats_kernel<TX, TP, V, true>, (unsigned)r.C, BN_THREADS, stream, r);
    else if (!(rc = launch_kernel(bn_stats_kernel<TX, TP, V, false>, (unsigned)(r.C * r.slices), BN_THREADS, stream,
                                  r)))
        rc = launch_kernel(bn_stats_finish_kernel<TP, A>, finish_grid, BN_THREADS, stream, r);
    const int64_t units = r.N * r.C * r.Sv;
    if (rc || units == 0)
        return rc;
    const unsigned grid = grid_stride_blocks(units, BN_THREADS);
    return units <= (int64_t)UINT32_MAX ? launch_kernel(bn_apply_kernel<TX, TP, V, uint32_t>, grid, BN_THREADS, stream, r)
                                        : launch_kernel(bn_apply_kernel<TX, TP, V, uint64_t>, grid, BN_THREADS, stream, r);
}

extern "C" int dpc_batch_norm(int in_dtype, int param_dtype, const dpc_bn *a, void *out, void *mean,
                              void *invstd, void *workspace, void *stream)
{
    if (a->N < 0 || a->C < 0 || a->S < 0 || (a->training && bn_slices(a) > 1 && !workspace) ||
        (!a->training && !(a->running_mean && a->running_var)))
        return (int)cudaErrorInvalidValue;
    if (a->C == 0)
        return 0;
    return with_dtypes(in_dtype, param_dtype, [&](auto tx, auto tp) {
        typedef typename decltype(tx)::type TX;
        typedef typename decltype(tp)::type TP;
        constexpr int V = 16 / sizeof(TX);
        const void *ps[2] = { a->x, out };
        const bool vectors = takes_vectors(a->S, V, ps, 2, sizeof(TX));
        bn_args r = bn_args_of(a, vectors ? V : 1, workspace, false);
        r.out = out;
        r.mean = mean;
        r.invstd = invstd;
        return vectors ? launch_bn_forward<TX, TP, V>(r, (cudaStream_t)stream)
                       : launch_bn_forward<TX, TP, 1>(r, (cudaStream_t)stream);
    });
}

template <class TX, class TP, int V>
static int launch_bn_backward(bn_args r, bool reduce, cudaStream_t stream)
{
    typedef typename acc_of<TX>::type A;
    int rc = 0;
    if (reduce && r.slices == 1)
        rc = launch_kernel(bn_backward_reduce_kernel<TX, TP, V, true>, (unsigned)r.C, BN_THREADS, stream, r);
    else if (reduce && !(rc = launch_kernel(bn_backward_reduce_kernel<TX, TP, V, false>,
                                            (unsigned)(r.C * r.slices), BN_THREADS, stream, r)))
        rc = launch_kernel(bn_backward_finish_kernel<TP, A>, (unsigned)CEIL_DIV(r.C, BN_THREADS / 32), BN_THREADS,
                           stream, r);
    const int64_t units = r.N * r.C * r.Sv;
    if (rc || !r.out || units == 0)
        return rc;
    const unsigned grid = grid_stride_blocks(units, BN_THREADS);
    return units <= (int64_t)UINT32_MAX ? launch_kernel(bn_dx_kernel<TX, TP, V, uint32_t>, grid, BN_THREADS, stream, r)
                                        : launch_kernel(bn_dx_kernel<TX, TP, V, uint64_t>, grid, BN_THREADS, stream, r);
}

extern "C" int dpc_batch_norm_backward(int in_dtype, int param_dtype, const dpc_bn *a, const void *dy,
                                       const void *mean, const void *invstd, void *dx, void *dw, void *db,
                                       void *workspace, void *stream)
{
    const bool reduce = (dx && a->training) || dw || db;
    if (a->N < 0 || a->C < 0 || a->S < 0 || (reduce && !workspace && a->C > 0))
        return (int)cudaErrorInvalidValue;
    if (a->C == 0)
        return 0;
    return with_dtypes(in_dtype, param_dtype, [&](auto tx, auto tp) {
        typedef typename decltype(tx)::type TX;
        typedef typename decltype(tp)::type TP;
        typedef typename acc_of<TX>::type A;
        constexpr int V = 16 / sizeof(TX);
        const void *ps[3] = { a->x, dy, dx };   /* dx NULL: not wanted, no constraint */
        const bool vectors = takes_vectors(a->S, V, ps, 3, sizeof(TX));
        bn_args r = bn_args_of(a, vectors ? V : 1, workspace, true);
        r.dy = dy;
        r.mean = (void *)mean;
        r.invstd = (void *)invstd;
        r.out = dx;
        r.dw = dw;
        r.db = db;
        r.partial = workspace ? (char *)workspace + 2 * (size_t)a->C * sizeof(A) : NULL;
        return vectors ? launch_bn_backward<TX, TP, V>(r, reduce, (cudaStream_t)stream)
                       : launch_bn_backward<TX, TP, 1>(r, reduce, (cudaStream_t)stream);
    });
}
