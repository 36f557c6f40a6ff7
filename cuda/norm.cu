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

/* x, residual, sum: (rows, n) of TI; out: (rows, n) of TO; weight, bias: n of TO */
template <class TI, class TO, int G, int E, bool RES>
__global__ static void ln_forward_kernel(ln_forward_args a)
{
    begin_after_previous_kernel();
    typedef typename acc_of<TI>::type A;
    typedef vec<TI, E> VI;
    typedef vec<TO, E> VO;
    __shared__ A red[32];
    const int size = G ? G : (int)blockDim.x, lane = (int)threadIdx.x % size;
    const int64_t groups = blockDim.x / size, chunks = a.n / E;
    const VO *w = (const VO *)a.weight, *b = (const VO *)a.bias;
    for (int64_t row = blockIdx.x * groups + threadIdx.x / size; row < a.rows; row += gridDim.x * groups) {
        const VI *x = (const VI *)a.x + row * chunks;
        VI *h = RES ? (VI *)a.sum + row * chunks : NULL;
        A s = 0;
        for (int64_t c = lane; c < chunks; c += size) {
            VI v = x[c];
            if (RES) {
                VI r = ((const VI *)a.residual)[row * chunks + c];
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
            VO y, wv, bv;
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
 * weight: n of TO. */
template <class TI, class TO, int E>
__global__ static void ln_backward_kernel(ln_backward_args a)
{
    begin_after_previous_kernel();
    typedef typename acc_of<TI>::type A;
    typedef vec<TI, E> VI;
    typedef vec<TO, E> VO;
    extern __shared__ __align__(16) unsigned char ln_shared[];
    __shared__ A red[32];
    const int64_t n = a.n, chunks = n / E;
    A *acc = !a.partial ? NULL : a.in_shared ? (A *)ln_shared : (A *)a.partial + blockIdx.x * 2 * n;
    for (int64_t j = threadIdx.x * E; acc && j < n; j += blockDim.x * E)
        for (int k = 0; k < E; k++)
            acc[j + k] = acc[n + j + k] = 0;
    const VO *w = (const VO *)a.weight;
    for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
        const VI *x = (const VI *)a.x + row * chunks;
        const VO *dy = (const VO *)a.dy + row * chunks;
        const A mean = ((const A *)a.mean)[row], rstd = ((const A *)a.rstd)[row];
        A sg = 0, sgx = 0;
        for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
            VI xv = x[c];
            VO gv = dy[c], wv;
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
            VO gv = dy[c], wv;
            if (w)
                wv = w[c];
            for (int k = 0; k < E; k++) {
                A xh = (ld(xv.e[k]) - mean) * rstd, g = ld(gv.e[k]);
                if (w)
                    g *= ld(wv.e[k]);
                put(d.e[k], rstd * (g - sg - xh * sgx));
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

/* f(tag<TI>, tag<TO>) for the dtype pairs the kernels take */
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

/* whether rows of n elements and every pointer (NULL, or aligned as a
 * vec of E elements of its type) take loads of E elements */
static bool takes_vectors(int64_t n, int E, const void *const *ins, int nins, size_t in_size,
                          const void *const *outs, int nouts, size_t out_size)
{
    if (n % E)
        return false;
    for (int i = 0; i < nins; i++)
        if ((uintptr_t)ins[i] % VEC_ALIGN(in_size, (size_t)E))
            return false;
    for (int i = 0; i < nouts; i++)
        if ((uintptr_t)outs[i] % VEC_ALIGN(out_size, (size_t)E))
            return false;
    return true;
}

/* a block over one row: a thread for each of its chunks, in whole warps, 32 to 512 */
static int row_block_threads(int64_t chunks)
{
    int64_t t = CEIL_DIV(chunks, 32) * 32;
    return t < 32 ? 32 : t > 512 ? 512 : (int)t;
}

template <class TI, class TO, int E>
static int launch_forward(const ln_forward_args &r, cudaStream_t stream)
{
    const bool res = r.residual != NULL;
    if (r.n <= LN_WARP_ROW) {
        unsigned grid = grid_stride_blocks(r.rows, LN_THREADS / 32);
        return res ? launch_kernel(ln_forward_kernel<TI, TO, 32, E, true>, grid, LN_THREADS, stream, r)
                   : launch_kernel(ln_forward_kernel<TI, TO, 32, E, false>, grid, LN_THREADS, stream, r);
    }
    unsigned grid = grid_stride_blocks(r.rows, 1);
    int threads = row_block_threads(r.n / E);
    return res ? launch_kernel(ln_forward_kernel<TI, TO, 0, E, true>, grid, threads, stream, r)
               : launch_kernel(ln_forward_kernel<TI, TO, 0, E, false>, grid, threads, stream, r);
}

extern "C" int dpc_layer_norm(int in_dtype, int out_dtype, const dpc_norm *a, void *out, void *sum, void *mean,
                              void *rstd, void *stream)
{
    if (a->n < 1 || a->rows < 0 || (a->residual && !sum))
        return (int)cudaErrorInvalidValue;
    if (a->rows == 0)
        return 0;
    ln_forward_args r = { a->rows, a->n, a->x, a->residual, a->weight, a->bias, out, sum, mean, rstd, a->eps };
    return with_dtypes(in_dtype, out_dtype, [&](auto ti, auto to) {
        typedef typename decltype(ti)::type TI;
        typedef typename decltype(to)::type TO;
        constexpr int V = 16 / sizeof(TI);
        const void *ins[3] = { a->x, a->residual, sum }, *outs[3] = { out, a->weight, a->bias };
        return takes_vectors(a->n, V, ins, 3, sizeof(TI), outs, 3, sizeof(TO))
                   ? launch_forward<TI, TO, V>(r, (cudaStream_t)stream)
                   : launch_forward<TI, TO, 1>(r, (cudaStream_t)stream);
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

template <class TI, class TO, int E>
static int launch_backward(ln_backward_args r, void *dw, void *db, cudaStream_t stream)
{
    typedef typename acc_of<TI>::type A;
    const int64_t blocks = backward_blocks(r.rows, r.n, sizeof(A));
    const size_t shared = 2 * (size_t)r.n * sizeof(A);
    r.in_shared = r.partial && shared <= LN_SHARED_BYTES;
    int rc = 0;
    if (blocks > 0)
        rc = launch_kernel_smem(NULL, 0, r.in_shared ? shared : 0, ln_backward_kernel<TI, TO, E>, (unsigned)blocks,
                                row_block_threads(r.n / E), stream, r);
    if (rc || !(dw || db))
        return rc;   /* (without rows, the sums of no blocks: zeros) */
    return launch_kernel(ln_param_grads_kernel<TO, A>, (unsigned)CEIL_DIV(r.n, 32), 32 * 32, stream,
                         (const A *)r.partial, blocks, r.n, (TO *)dw, (TO *)db);
}

extern "C" int dpc_layer_norm_backward(int in_dtype, int out_dtype, const dpc_norm *a, const void *dy,
                                       const void *mean, const void *rstd, void *dx, void *dw, void *db,
                                       void *workspace, void *stream)
{
    if (a->n < 1 || a->rows < 0 || ((dw || db) && !workspace && a->rows > 0))
        return (int)cudaErrorInvalidValue;
    ln_backward_args r = { a->rows, a->n, a->x, a->weight, dy, mean, rstd, dx, (dw || db) ? workspace : NULL, 0 };
    return with_dtypes(in_dtype, out_dtype, [&](auto ti, auto to) {
        typedef typename decltype(ti)::type TI;
        typedef typename decltype(to)::type TO;
        constexpr int V = 16 / sizeof(TI);
        const void *ins[2] = { a->x, dx }, *outs[2] = { dy, a->weight };
        return takes_vectors(a->n, V, ins, 2, sizeof(TI), outs, 2, sizeof(TO))
                   ? launch_backward<TI, TO, V>(r, dw, db, (cudaStream_t)stream)
                   : launch_backward<TI, TO, 1>(r, dw, db, (cudaStream_t)stream);
    });
}
