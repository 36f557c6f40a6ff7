/*
 * attention.cu — fused scaled-dot-product attention, forward and backward,
 * behind dpc_ops.h (dpc_attention_*): softmax(scale q k^T, causal mask) v
 * without ever writing the L x S matrix of scores to memory.
 *
 * bfloat16, head dims 64 and 128 (E == Ev): FlashAttention-2's scheme on
 * the tensor cores (mma.sync m16n8k16, bf16 in, float32 accumulators;
 * operands from shared memory through ldmatrix).
 *
 * - Forward (attn_fwd_bf16): a block of 8 warps takes 128 query rows of
 *   one (batch, head), 16 rows a warp, and streams the keys and values
 *   through shared memory in tiles of 64, double-buffered with cp.async
 *   (the next tile loads while this one is used). Each warp keeps its
 *   rows' running max and sum (online softmax, in float32, in the base-2
 *   domain of exp2f) and its 16 x D slice of the output in registers; the
 *   probabilities go from the score accumulators straight into the A
 *   operand of P @ V, rounded to bf16 as FlashAttention rounds them. The
 *   output is divided by the row sum at the end, and the row's natural
 *   log-sum-exp (lse) is written: the only thing the backward needs
 *   besides q, k, v, out and dout. Causal: key tiles wholly above the
 *   diagonal are never loaded, and only tiles that cross the diagonal
 *   (or the end of the keys) are masked. Query tiles run heaviest first.
 *   Shared memory: Q 128 x D, K and V 2 x 64 x D: 48 KB for D = 64 (two
 *   blocks an SM), 96 KB for D = 128.
 * - Backward: attn_delta computes delta = rowsum(dout * out) in float32
 *   and zeroes the float32 dq accumulators (both in the workspace); then
 *   attn_bwd_bf16, a block of 8 warps per tile of BN keys (128 for
 *   D = 64, 64 for D = 128) of one (batch, head), keeps that tile's K and
 *   V in shared memory and walks the query rows that see it in steps of
 *   64 (from the diagonal on when causal), double-buffering q, dout, lse
 *   and delta. Each step recomputes S = q k^T and P = exp(scale S - lse),
 *   computes dP = dout v^T and dS = P (dP - delta), stages P and dS in
 *   shared memory as bf16, and then accumulates dV += P^T dout and
 *   dK += dS^T q in registers (one 16-row slice of the keys a warp) and
 *   adds dQ = dS k to the float32 accumulators with atomic adds (two
 *   floats at once on sm_90). dK is scaled when written; attn_dq_store
 *   turns the accumulators into dq (scaled) of the dtype. Where out, dout
 *   and dq rows start on 16 bytes (the usual case), the delta and dq
 *   passes run 8 threads a row with 16-byte accesses (attn_delta_vec,
 *   attn_dq_store_vec).
 * - Every tile in shared memory is swizzled: the 16-byte chunk c of row r
 *   sits at chunk c ^ (r % 8), so that the eight rows an ldmatrix phase
 *   reads, and the fragment stores of P and dS, fall on distinct banks.
 *   Rows past L or S are loaded as zeros and their scores masked, so any
 *   L and S work, L != S included. q, k, v and dout whose rows do not
 *   start on 16 bytes load through plain loads instead of cp.async.
 *
 * float32, any head dims up to 128 (E and Ev apart): the same algorithm
 * with plain float FMAs (no TF32: PyTorch's float32 attention is full
 * precision), tiles of 16 queries and 32 keys in the forward, 32 keys and
 * steps of 8 queries in the backward, in static shared memory whose rows
 * are padded by one float against bank conflicts.
 *
 * Top-left causal mask (PyTorch's is_causal): key j takes part in query
 * i's row when j <= i, so every row has key 0 and no row is empty unless
 * S is 0 (then out is 0 and lse -inf, and the backward writes zeros).
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <math.h>
#include <stdint.h>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "common/dplua_codes.h"
#include "common/dtype_conv.h"
#include "dp_cuda.h"
#include "dpc_ops.h"
#include "element.cuh"
#include "launch.cuh"

#define ATTN_THREADS 256
#define ATTN_WARPS (ATTN_THREADS / 32)
#define LOG2E 1.4426950408889634
#define LN2 0.6931471805599453f

/* What every kernel of this file reads: dpc_attention's fields, and the
 * outputs and workspace of the call. bf16 tensors are uint16_t bits. */
namespace {   /* file-local types: no clash with another file's of the same name */
struct attn_args {
    int64_t B, H, L, S;
    int E, Ev;
    const void *q, *k, *v;
    int64_t q_stride[3], k_stride[3], v_stride[3];
    int64_t o_stride[3], do_stride[3], dq_stride[3], dk_stride[3], dv_stride[3];
    float scale;
    float scale_log2;     /* scale * log2(e): scores in the base-2 domain of exp2f */
    int causal;
    int aligned;          /* q, k, v and dout rows start on 16 bytes: tiles load through cp.async */
    void *out;
    float *lse;
    const void *dout;
    float *dq_acc;        /* (B, H, L, E) float32, workspace */
    float *delta;         /* (B, H, L) float32, workspace */
    void *dq, *dk, *dv;
};
}  // namespace

/* The dynamic shared memory of the bf16 kernels. */
extern __shared__ uint4 attn_smem[];

/* ------------------------------------------------------------------------ */
/* element access                                                            */
/* ------------------------------------------------------------------------ */


/* The offset (in elements) of row i of head (b, h) = (bh / H, bh % H) in
 * an operand of strides st for b, h and the row. */
__device__ __forceinline__ int64_t row_offset(const int64_t (&st)[3], int64_t H, int64_t bh, int64_t i)
{
    return bh / H * st[0] + bh % H * st[1] + i * st[2];
}

/* Two values as adjacent bf16 (lo at the lower address), rounded as every
 * stored bf16 of dplua is (dtype_conv.h). */
__device__ __forceinline__ uint32_t bf16_pair(float lo, float hi)
{
    return (uint32_t)f32_to_bf16(lo) | (uint32_t)f32_to_bf16(hi) << 16;
}

/* The same for an operand of the tensor cores (P, dS: never NaN). cvt puts
 * its first source in the upper half. */
__device__ __forceinline__ uint32_t bf16_operand(float lo, float hi)
{
    uint32_t r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

/* p[0] += x, p[1] += y, atomically (p 8-byte aligned). */
__device__ __forceinline__ void atomic_add_pair(float *p, float x, float y)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    atomicAdd(reinterpret_cast<float2 *>(p), make_float2(x, y));
#else
    atomicAdd(p, x);
    atomicAdd(p + 1, y);
#endif
}

__device__ __forceinline__ float quad_max(float v)
{
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v)
{
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

/* ------------------------------------------------------------------------ */
/* tensor-core and asynchronous-copy primitives (sm_80 on)                   */
/* ------------------------------------------------------------------------ */

__device__ __forceinline__ uint32_t smem_addr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

/* 16 bytes from global to shared memory, or 16 zero bytes when !valid. */
__device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, bool valid)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async4(uint32_t dst, const void *src, bool valid)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void cp_async_commit(void) { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
/* Waits until at most N of this thread's committed groups are in flight. */
template <int N> __device__ __forceinline__ void cp_async_wait(void)
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* Four 8 x 8 matrices of bf16 from shared memory: lanes 8i .. 8i + 7 give
 * the row addresses of matrix i, and register i receives matrix i's row
 * lane / 4, columns 2 (lane % 4) and the next (with .trans, its column
 * lane / 4, rows 2 (lane % 4) and the next). */
__device__ __forceinline__ void ldsm4(uint32_t (&r)[4], uint32_t addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
__device__ __forceinline__ void ldsm4_trans(uint32_t (&r)[4], uint32_t addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

/* c (16 x 8, float) += a (16 x 16, row-major) @ b (16 x 8, column-major).
 * With g = lane / 4 and t = lane % 4: c holds rows g, g + 8 at columns
 * 2t, 2t + 1 (c[0], c[1] of row g; c[2], c[3] of row g + 8); a holds
 * (g, 2t..), (g + 8, 2t..), (g, 2t + 8..), (g + 8, 2t + 8..); b holds
 * (k = 2t.., n = g), (k = 2t + 8.., n = g). So the accumulators of two
 * adjacent 16 x 8 tiles are, packed in pairs, the A operand of a 16 x 16
 * product: how P and dS go from one product into the next. */
__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* ------------------------------------------------------------------------ */
/* swizzled bf16 tiles in shared memory                                      */
/* ------------------------------------------------------------------------ */

/* Element offset of (r, c) in a tile of rows of W bf16 (W a multiple of
 * 64: eight 16-byte chunks or more): chunk c / 8 of row r is stored at
 * chunk (c / 8) ^ (r % 8) of that row. */
template <int W> __device__ __forceinline__ int swz(int r, int c)
{
    return r * W + (((c >> 3) ^ (r & 7)) << 3) + (c & 7);
}

/* The shared address of what lane gives ldmatrix for the 16 x 16 block at
 * (r0, c0) of a tile of width W, read as one of the three operands:
 * - a_rows: an A operand stored row-major (rows of the product's M);
 * - b_rows: a B operand stored with n as the row (k^T, v for dout v^T),
 *   read without .trans: registers 0, 1 for columns c0.. of n-tile r0..,
 *   2, 3 for n-tile r0 + 8..;
 * - k_rows: a B operand stored with k as the row (v in P v), or an A
 *   operand stored transposed (P^T, dS^T), read with .trans; as B,
 *   registers 0, 1 are n-tile c0.., 2, 3 n-tile c0 + 8... */
template <int W> __device__ __forceinline__ uint32_t a_rows(const uint16_t *tile, int r0, int c0, int lane)
{
    return smem_addr(tile + swz<W>(r0 + (lane & 15), c0 + (lane >> 4) * 8));
}
template <int W> __device__ __forceinline__ uint32_t b_rows(const uint16_t *tile, int r0, int c0, int lane)
{
    return smem_addr(tile + swz<W>(r0 + (lane & 7) + (lane >> 4) * 8, c0 + ((lane >> 3) & 1) * 8));
}
template <int W> __device__ __forceinline__ uint32_t k_rows(const uint16_t *tile, int r0, int c0, int lane)
{
    return smem_addr(tile + swz<W>(r0 + (lane & 7) + ((lane >> 3) & 1) * 8, c0 + (lane >> 4) * 8));
}
/* P^T or dS^T as the A operand (rows = keys, k = queries) of the block of
 * queries q0.. and keys n0.. of the tile P (queries x keys), with .trans:
 * matrices (q0, n0), (q0, n0 + 8), (q0 + 8, n0), (q0 + 8, n0 + 8). */
template <int W> __device__ __forceinline__ uint32_t at_rows(const uint16_t *tile, int q0, int n0, int lane)
{
    return smem_addr(tile + swz<W>(q0 + (lane & 7) + (lane >> 4) * 8, n0 + ((lane >> 3) & 1) * 8));
}

/* Rows row0 .. row0 + ROWS - 1 of a matrix of `rows` rows of W bf16 (row
 * stride `stride` elements, the row contiguous) into a swizzled tile;
 * rows past the end as zeros. Asynchronous (cp.async) when aligned. */
template <int ROWS, int W>
__device__ __forceinline__ void load_tile(uint16_t *tile, const uint16_t *base, int64_t stride, int64_t row0,
                                          int64_t rows, bool aligned)
{
    constexpr int CHUNKS = ROWS * W / 8;
    static_assert(CHUNKS % ATTN_THREADS == 0, "a tile is a whole number of 16-byte chunks a thread");
#pragma unroll
    for (int i = 0; i < CHUNKS / ATTN_THREADS; i++) {
        const int id = i * ATTN_THREADS + threadIdx.x;
        const int r = id / (W / 8), c = id % (W / 8) * 8;
        const bool valid = row0 + r < rows;
        const uint16_t *src = base + (valid ? row0 + r : 0) * stride + c;
        uint16_t *dst = tile + swz<W>(r, c);
        if (aligned) {
            cp_async16(smem_addr(dst), src, valid);
        } else {
            uint32_t w[4] = { 0, 0, 0, 0 };
            if (valid)
                for (int e = 0; e < 8; e++)
                    w[e / 2] |= (uint32_t)src[e] << (e % 2 * 16);
            *reinterpret_cast<uint4 *>(dst) = make_uint4(w[0], w[1], w[2], w[3]);
        }
    }
}

/* ------------------------------------------------------------------------ */
/* bfloat16 forward                                                          */
/* ------------------------------------------------------------------------ */

/* 128 query rows a block (16 a warp), keys in tiles of 64. */
#define FWD_BM 128
#define FWD_BN 64

template <int D> static constexpr size_t fwd_smem(void)
{
    return (size_t)(FWD_BM * D + 4 * FWD_BN * D) * sizeof(uint16_t);
}

/* s (the warp's 16 x FWD_BN scores of key tile n0, scaled to base 2) with
 * the keys past S, and above the diagonal when causal, set to -inf; i0 is
 * the query of the thread's row g. */
__device__ __forceinline__ void fwd_mask(float (&s)[FWD_BN / 8][4], const attn_args &a, int64_t i0, int64_t n0,
                                         int t)
{
#pragma unroll
    for (int nt = 0; nt < FWD_BN / 8; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int64_t j = n0 + nt * 8 + 2 * t + (e & 1), i = i0 + (e >> 1) * 8;
            if (j >= a.S || (a.causal && j > i))
                s[nt][e] = -INFINITY;
        }
}

template <int D>
__global__ void __launch_bounds__(ATTN_THREADS, D <= 64 ? 2 : 1) attn_fwd_bf16(attn_args a)
{
    begin_after_previous_kernel();
    constexpr int BM = FWD_BM, BN = FWD_BN, DT = D / 8, NT = BN / 8;
    uint16_t *sQ = reinterpret_cast<uint16_t *>(attn_smem);
    uint16_t *sK = sQ + BM * D;            /* two tiles of BN x D */
    uint16_t *sV = sK + 2 * BN * D;        /* two tiles of BN x D */
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, t = lane % 4;
    const int64_t m0 = (int64_t)(gridDim.x - 1 - blockIdx.x) * BM;   /* causal: the longest rows first */
    const int64_t i0 = m0 + warp * 16 + g;                           /* the query of the thread's row g */
    const int64_t n_end = a.causal ? min(a.S, m0 + BM) : a.S;
    const int tiles = (int)CEIL_DIV(n_end, (int64_t)BN);

    for (int64_t bh = blockIdx.y; bh < a.B * a.H; bh += gridDim.y) {
        const int64_t b = bh / a.H, h = bh % a.H;
        const uint16_t *q = (const uint16_t *)a.q + b * a.q_stride[0] + h * a.q_stride[1];
        const uint16_t *k = (const uint16_t *)a.k + b * a.k_stride[0] + h * a.k_stride[1];
        const uint16_t *v = (const uint16_t *)a.v + b * a.v_stride[0] + h * a.v_stride[1];
        load_tile<BM, D>(sQ, q, a.q_stride[2], m0, a.L, a.aligned);
        load_tile<BN, D>(sK, k, a.k_stride[2], 0, a.S, a.aligned);
        load_tile<BN, D>(sV, v, a.v_stride[2], 0, a.S, a.aligned);
        cp_async_commit();

        float o[DT][4] = {};
        float row_max[2] = { -INFINITY, -INFINITY }, row_sum[2] = { 0.f, 0.f };   /* rows g, g + 8 */
        for (int it = 0; it < tiles; it++) {
            const int64_t n0 = (int64_t)it * BN;
            const uint16_t *tK = sK + (it & 1) * BN * D, *tV = sV + (it & 1) * BN * D;
            if (it + 1 < tiles) {
                load_tile<BN, D>(sK + ((it + 1) & 1) * BN * D, k, a.k_stride[2], n0 + BN, a.S, a.aligned);
                load_tile<BN, D>(sV + ((it + 1) & 1) * BN * D, v, a.v_stride[2], n0 + BN, a.S, a.aligned);
            }
            cp_async_commit();
            cp_async_wait<1>();   /* this tile (and Q) arrived; the next may still be in flight */
            __syncthreads();

            float s[NT][4] = {};   /* S = Q K^T, the warp's 16 rows */
#pragma unroll
            for (int kk = 0; kk < D / 16; kk++) {
                uint32_t qa[4];
                ldsm4(qa, a_rows<D>(sQ, warp * 16, kk * 16, lane));
#pragma unroll
                for (int np = 0; np < NT / 2; np++) {
                    uint32_t kb[4];
                    ldsm4(kb, b_rows<D>(tK, np * 16, kk * 16, lane));
                    mma_bf16(s[2 * np], qa, kb[0], kb[1]);
                    mma_bf16(s[2 * np + 1], qa, kb[2], kb[3]);
                }
            }
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    s[nt][e] *= a.scale_log2;
            if (n0 + BN > a.S || (a.causal && n0 + BN - 1 > m0))
                fwd_mask(s, a, i0, n0, t);

            /* online softmax: the new running max, the old sums and
             * outputs rescaled to it, the tile's probabilities */
#pragma unroll
            for (int r = 0; r < 2; r++) {
                float mx = row_max[r];
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
                    mx = fmaxf(mx, fmaxf(s[nt][2 * r], s[nt][2 * r + 1]));
                mx = quad_max(mx);
                const float base = mx == -INFINITY ? 0.f : mx;   /* no -inf - -inf */
                const float alpha = exp2f(row_max[r] - base);
                row_max[r] = mx;
                float sum = 0.f;
#pragma unroll
                for (int nt = 0; nt < NT; nt++) {
                    s[nt][2 * r] = exp2f(s[nt][2 * r] - base);
                    s[nt][2 * r + 1] = exp2f(s[nt][2 * r + 1] - base);
                    sum += s[nt][2 * r] + s[nt][2 * r + 1];
                }
                row_sum[r] = row_sum[r] * alpha + sum;   /* the thread's share; the quad's summed at the end */
#pragma unroll
                for (int dt = 0; dt < DT; dt++) {
                    o[dt][2 * r] *= alpha;
                    o[dt][2 * r + 1] *= alpha;
                }
            }

            /* O += P V, P as bf16 straight from the accumulators */
#pragma unroll
            for (int kk = 0; kk < BN / 16; kk++) {
                const uint32_t pa[4] = { bf16_operand(s[2 * kk][0], s[2 * kk][1]),
                                         bf16_operand(s[2 * kk][2], s[2 * kk][3]),
                                         bf16_operand(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                         bf16_operand(s[2 * kk + 1][2], s[2 * kk + 1][3]) };
#pragma unroll
                for (int dp = 0; dp < DT / 2; dp++) {
                    uint32_t vb[4];
                    ldsm4_trans(vb, k_rows<D>(tV, kk * 16, dp * 16, lane));
                    mma_bf16(o[2 * dp], pa, vb[0], vb[1]);
                    mma_bf16(o[2 * dp + 1], pa, vb[2], vb[3]);
                }
            }
            __syncthreads();   /* every warp is done with this buffer before it is loaded again */
        }
        cp_async_wait<0>();

#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int64_t i = i0 + 8 * r;
            const float sum = quad_sum(row_sum[r]), inv = 1.f / sum;
            if (i >= a.L)
                continue;
            uint32_t *out = (uint32_t *)((uint16_t *)a.out + row_offset(a.o_stride, a.H, bh, i));
#pragma unroll
            for (int dt = 0; dt < DT; dt++)
                out[dt * 4 + t] = bf16_pair(o[dt][2 * r] * inv, o[dt][2 * r + 1] * inv);
            if (t == 0)
                a.lse[bh * a.L + i] = (row_max[r] + log2f(sum)) * LN2;
        }
        __syncthreads();   /* sQ is loaded again for the next (batch, head) */
    }
}

/* ------------------------------------------------------------------------ */
/* bfloat16 backward                                                         */
/* ------------------------------------------------------------------------ */

/* A block: BN keys; query rows in steps of BM. The warps split each
 * product's output as: S and dP (BM x BN): 4 warps down, 2 across;
 * dK and dV (BN x D): BN / 16 warps down, the rest across D; dQ (BM x D):
 * 4 down, 2 across. */
template <int D> struct bwd_tiles {
    static constexpr int BM = 64;
    static constexpr int BN = D <= 64 ? 128 : 64;
    static constexpr int S_COLS = BN / 2;
    static constexpr int KV_WARPS_DOWN = BN / 16;
    static constexpr int KV_COLS = D / (ATTN_WARPS / KV_WARPS_DOWN);
    static constexpr int Q_COLS = D / 2;
    static_assert(BM / 16 * 2 == ATTN_WARPS && KV_WARPS_DOWN <= ATTN_WARPS, "the warps tile each product");
    /* K, V; Q, dout twice; P, dS; lse, delta twice */
    static constexpr size_t smem = (size_t)(2 * BN * D + 4 * BM * D + 2 * BM * BN) * sizeof(uint16_t) +
                                   (size_t)4 * BM * sizeof(float);
};

/* Query rows m0 .. m0 + BM - 1: q, dout, lse and delta into one buffer. */
template <int D>
__device__ __forceinline__ void bwd_load_rows(uint16_t *sQ, uint16_t *sdO, float *sLse, float *sDelta,
                                              const attn_args &a, const uint16_t *q, const uint16_t *dout,
                                              const float *lse, const float *delta, int64_t m0)
{
    constexpr int BM = bwd_tiles<D>::BM;
    load_tile<BM, D>(sQ, q, a.q_stride[2], m0, a.L, a.aligned);
    load_tile<BM, D>(sdO, dout, a.do_stride[2], m0, a.L, a.aligned);
    if (threadIdx.x < 2 * BM) {
        const int r = threadIdx.x % BM;
        const bool valid = m0 + r < a.L;
        const float *src = (threadIdx.x < BM ? lse : delta) + (valid ? m0 + r : 0);
        cp_async4(smem_addr((threadIdx.x < BM ? sLse : sDelta) + r), src, valid);
    }
}

template <int D>
__global__ void __launch_bounds__(ATTN_THREADS, 1) attn_bwd_bf16(attn_args a)
{
    begin_after_previous_kernel();
    typedef bwd_tiles<D> T;
    constexpr int BM = T::BM, BN = T::BN, NS = T::S_COLS / 8, NKV = T::KV_COLS / 8, NQ = T::Q_COLS / 8;
    uint16_t *sK = reinterpret_cast<uint16_t *>(attn_smem);
    uint16_t *sV = sK + BN * D;
    uint16_t *sQ = sV + BN * D;           /* two buffers of BM x D */
    uint16_t *sdO = sQ + 2 * BM * D;      /* two buffers of BM x D */
    uint16_t *sP = sdO + 2 * BM * D;      /* BM x BN */
    uint16_t *sdS = sP + BM * BN;         /* BM x BN */
    float *sLse = reinterpret_cast<float *>(sdS + BM * BN);   /* two buffers of BM */
    float *sDelta = sLse + 2 * BM;                            /* two buffers of BM */
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, t = lane % 4;
    /* the warp's place in S and dP, in dK and dV, in dQ */
    const int s_row = warp % 4 * 16, s_col = warp / 4 * T::S_COLS;
    const int kv_row = warp % T::KV_WARPS_DOWN * 16, kv_col = warp / T::KV_WARPS_DOWN * T::KV_COLS;
    const int q_row = warp % 4 * 16, q_col = warp / 4 * T::Q_COLS;
    const int64_t n0 = (int64_t)blockIdx.x * BN;
    const int64_t first = a.causal ? n0 / BM : 0, steps = CEIL_DIV(a.L, (int64_t)BM);

    for (int64_t bh = blockIdx.y; bh < a.B * a.H; bh += gridDim.y) {
        const int64_t b = bh / a.H, h = bh % a.H;
        const uint16_t *q = (const uint16_t *)a.q + b * a.q_stride[0] + h * a.q_stride[1];
        const uint16_t *k = (const uint16_t *)a.k + b * a.k_stride[0] + h * a.k_stride[1];
        const uint16_t *v = (const uint16_t *)a.v + b * a.v_stride[0] + h * a.v_stride[1];
        const uint16_t *dout = (const uint16_t *)a.dout + b * a.do_stride[0] + h * a.do_stride[1];
        const float *lse = a.lse + bh * a.L, *delta = a.delta + bh * a.L;
        float *dq_acc = a.dq_acc + bh * a.L * D;
        if (first < steps) {
            load_tile<BN, D>(sK, k, a.k_stride[2], n0, a.S, a.aligned);
            load_tile<BN, D>(sV, v, a.v_stride[2], n0, a.S, a.aligned);
            bwd_load_rows<D>(sQ, sdO, sLse, sDelta, a, q, dout, lse, delta, first * BM);
        }
        cp_async_commit();

        float dk[NKV][4] = {}, dv[NKV][4] = {};
        for (int64_t step = first; step < steps; step++) {
            const int64_t m0 = step * BM;
            const int buf = (int)((step - first) & 1);
            const uint16_t *tQ = sQ + buf * BM * D, *tdO = sdO + buf * BM * D;
            const float *tLse = sLse + buf * BM, *tDelta = sDelta + buf * BM;
            if (step + 1 < steps)
                bwd_load_rows<D>(sQ + (buf ^ 1) * BM * D, sdO + (buf ^ 1) * BM * D, sLse + (buf ^ 1) * BM,
                                 sDelta + (buf ^ 1) * BM, a, q, dout, lse, delta, m0 + BM);
            cp_async_commit();
            cp_async_wait<1>();
            __syncthreads();

            /* S = Q K^T and dP = dout V^T, the warp's 16 x S_COLS */
            float s[NS][4] = {}, dp[NS][4] = {};
#pragma unroll
            for (int kk = 0; kk < D / 16; kk++) {
                uint32_t qa[4], oa[4];
                ldsm4(qa, a_rows<D>(tQ, s_row, kk * 16, lane));
                ldsm4(oa, a_rows<D>(tdO, s_row, kk * 16, lane));
#pragma unroll
                for (int np = 0; np < NS / 2; np++) {
                    uint32_t kb[4], vb[4];
                    ldsm4(kb, b_rows<D>(sK, s_col + np * 16, kk * 16, lane));
                    mma_bf16(s[2 * np], qa, kb[0], kb[1]);
                    mma_bf16(s[2 * np + 1], qa, kb[2], kb[3]);
                    ldsm4(vb, b_rows<D>(sV, s_col + np * 16, kk * 16, lane));
                    mma_bf16(dp[2 * np], oa, vb[0], vb[1]);
                    mma_bf16(dp[2 * np + 1], oa, vb[2], vb[3]);
                }
            }

            /* P = exp(scale S - lse), 0 where masked; dS = P (dP - delta);
             * both into shared memory as bf16 */
            const bool masked = (a.causal && n0 + BN - 1 > m0) || n0 + BN > a.S || m0 + BM > a.L;
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const int row = s_row + g + 8 * r;
                const int64_t i = m0 + row;
                const float lse2 = tLse[row] * (float)LOG2E, dlt = tDelta[row];
#pragma unroll
                for (int nt = 0; nt < NS; nt++) {
                    const int col = s_col + nt * 8 + 2 * t;
                    float p[2], ds[2];
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        const int64_t j = n0 + col + e;
                        p[e] = exp2f(s[nt][2 * r + e] * a.scale_log2 - lse2);
                        if (masked && (i >= a.L || j >= a.S || (a.causal && j > i)))
                            p[e] = 0.f;
                        ds[e] = p[e] * (dp[nt][2 * r + e] - dlt);
                    }
                    *reinterpret_cast<uint32_t *>(sP + swz<BN>(row, col)) = bf16_operand(p[0], p[1]);
                    *reinterpret_cast<uint32_t *>(sdS + swz<BN>(row, col)) = bf16_operand(ds[0], ds[1]);
                }
            }
            __syncthreads();

            /* dV += P^T dout, dK += dS^T Q: the warp's 16 keys x KV_COLS */
#pragma unroll
            for (int kk = 0; kk < BM / 16; kk++) {
                uint32_t pa[4], sa[4];
                ldsm4_trans(pa, at_rows<BN>(sP, kk * 16, kv_row, lane));
                ldsm4_trans(sa, at_rows<BN>(sdS, kk * 16, kv_row, lane));
#pragma unroll
                for (int np = 0; np < NKV / 2; np++) {
                    uint32_t ob[4], qb[4];
                    ldsm4_trans(ob, k_rows<D>(tdO, kk * 16, kv_col + np * 16, lane));
                    mma_bf16(dv[2 * np], pa, ob[0], ob[1]);
                    mma_bf16(dv[2 * np + 1], pa, ob[2], ob[3]);
                    ldsm4_trans(qb, k_rows<D>(tQ, kk * 16, kv_col + np * 16, lane));
                    mma_bf16(dk[2 * np], sa, qb[0], qb[1]);
                    mma_bf16(dk[2 * np + 1], sa, qb[2], qb[3]);
                }
            }

            /* dQ += dS K (unscaled), the warp's 16 rows x Q_COLS, into the
             * float accumulators */
            float dq[NQ][4] = {};
#pragma unroll
            for (int kk = 0; kk < BN / 16; kk++) {
                uint32_t sa[4];
                ldsm4(sa, a_rows<BN>(sdS, q_row, kk * 16, lane));
#pragma unroll
                for (int np = 0; np < NQ / 2; np++) {
                    uint32_t kb[4];
                    ldsm4_trans(kb, k_rows<D>(sK, kk * 16, q_col + np * 16, lane));
                    mma_bf16(dq[2 * np], sa, kb[0], kb[1]);
                    mma_bf16(dq[2 * np + 1], sa, kb[2], kb[3]);
                }
            }
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const int64_t i = m0 + q_row + g + 8 * r;
                if (i >= a.L)
                    continue;
                float *acc = dq_acc + i * D + q_col + 2 * t;
#pragma unroll
                for (int nt = 0; nt < NQ; nt++)
                    atomic_add_pair(acc + nt * 8, dq[nt][2 * r], dq[nt][2 * r + 1]);
            }
            __syncthreads();   /* P, dS and this buffer are written again next step */
        }
        cp_async_wait<0>();

#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int64_t j = n0 + kv_row + g + 8 * r;
            if (j >= a.S)
                continue;
            uint32_t *dkr = (uint32_t *)((uint16_t *)a.dk + row_offset(a.dk_stride, a.H, bh, j) + kv_col);
            uint32_t *dvr = (uint32_t *)((uint16_t *)a.dv + row_offset(a.dv_stride, a.H, bh, j) + kv_col);
#pragma unroll
            for (int nt = 0; nt < NKV; nt++) {
                dkr[nt * 4 + t] = bf16_pair(dk[nt][2 * r] * a.scale, dk[nt][2 * r + 1] * a.scale);
                dvr[nt * 4 + t] = bf16_pair(dv[nt][2 * r], dv[nt][2 * r + 1]);
            }
        }
        __syncthreads();   /* K and V are loaded again for the next (batch, head) */
    }
}

/* ------------------------------------------------------------------------ */
/* both dtypes: delta before the backward, dq after it                       */
/* ------------------------------------------------------------------------ */

/* delta[row] = sum over Ev of dout * out, a warp a row; and the row's dq
 * accumulators zeroed. T: float or uint16_t (bf16 bits). */
template <typename T>
__global__ void attn_delta(attn_args a)
{
    begin_after_previous_kernel();
    const int lane = threadIdx.x % 32;
    const int64_t rows = a.B * a.H * a.L;
    for (int64_t row = (int64_t)blockIdx.x * ATTN_WARPS + threadIdx.x / 32; row < rows;
         row += (int64_t)gridDim.x * ATTN_WARPS) {
        const T *o = (const T *)a.out + row_offset(a.o_stride, a.H, row / a.L, row % a.L);
        const T *d = (const T *)a.dout + row_offset(a.do_stride, a.H, row / a.L, row % a.L);
        float sum = 0.f;
        for (int e = lane; e < a.Ev; e += 32)
            sum += ld_elem(o + e) * ld_elem(d + e);
        for (int off = 16; off > 0; off /= 2)
            sum += __shfl_xor_sync(0xffffffffu, sum, off);
        if (lane == 0)
            a.delta[row] = sum;
        for (int e = lane; e < a.E; e += 32)
            a.dq_acc[row * a.E + e] = 0.f;
    }
}

/* dq = scale * the accumulators, in dq's dtype: a warp a row, as
 * attn_delta (the row's place in dq found once). */
template <typename T>
__global__ void attn_dq_store(attn_args a)
{
    begin_after_previous_kernel();
    const int lane = threadIdx.x % 32;
    const int64_t rows = a.B * a.H * a.L;
    for (int64_t row = (int64_t)blockIdx.x * ATTN_WARPS + threadIdx.x / 32; row < rows;
         row += (int64_t)gridDim.x * ATTN_WARPS) {
        T *dq = (T *)a.dq + row_offset(a.dq_stride, a.H, row / a.L, row % a.L);
        const float *acc = a.dq_acc + row * a.E;
        for (int e = lane; e < a.E; e += 32)
            st_elem(dq + e, acc[e] * a.scale);
    }
}

/* The same two passes for the bf16 kernels' head dims with 16-byte
 * accesses (out, dout and dq rows on 16 bytes): 8 threads a row, D / 8
 * elements each, so that every load and store moves 16 bytes. */
#define ROW_THREADS 8
#define ROWS_A_BLOCK (ATTN_THREADS / ROW_THREADS)

__device__ __forceinline__ float bf16_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }

template <int D>
__global__ void attn_delta_vec(attn_args a)
{
    begin_after_previous_kernel();
    constexpr int PER = D / ROW_THREADS;
    const int part = threadIdx.x % ROW_THREADS;
    const int64_t rows = a.B * a.H * a.L;
    for (int64_t row = (int64_t)blockIdx.x * ROWS_A_BLOCK + threadIdx.x / ROW_THREADS; row < rows;
         row += (int64_t)gridDim.x * ROWS_A_BLOCK) {
        const int64_t bh = row / a.L, i = row % a.L;
        const uint4 *o = (const uint4 *)((const uint16_t *)a.out + row_offset(a.o_stride, a.H, bh, i) + part * PER);
        const uint4 *d = (const uint4 *)((const uint16_t *)a.dout + row_offset(a.do_stride, a.H, bh, i) + part * PER);
        float sum = 0.f;
#pragma unroll
        for (int c = 0; c < PER / 8; c++) {
            const uint4 ov = o[c], dv = d[c];
            const uint32_t ow[4] = {ov.x, ov.y, ov.z, ov.w}, dw[4] = {dv.x, dv.y, dv.z, dv.w};
#pragma unroll
            for (int w = 0; w < 4; w++)
                sum += bf16_lo(ow[w]) * bf16_lo(dw[w]) + bf16_hi(ow[w]) * bf16_hi(dw[w]);
        }
        /* the row's 8 threads are adjacent lanes, in the loop or out of it together: the
         * shuffle names them alone (a warp's last rows may leave the loop before the others) */
        const unsigned lanes = 0xffu << (threadIdx.x % 32 / ROW_THREADS * ROW_THREADS);
        for (int off = ROW_THREADS / 2; off > 0; off /= 2)
            sum += __shfl_xor_sync(lanes, sum, off);
        if (part == 0)
            a.delta[row] = sum;
        float4 *acc = (float4 *)(a.dq_acc + row * D + part * PER);
#pragma unroll
        for (int c = 0; c < PER / 4; c++)
            acc[c] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
}

template <int D>
__global__ void attn_dq_store_vec(attn_args a)
{
    begin_after_previous_kernel();
    constexpr int PER = D / ROW_THREADS;
    const int part = threadIdx.x % ROW_THREADS;
    const int64_t rows = a.B * a.H * a.L;
    for (int64_t row = (int64_t)blockIdx.x * ROWS_A_BLOCK + threadIdx.x / ROW_THREADS; row < rows;
         row += (int64_t)gridDim.x * ROWS_A_BLOCK) {
        uint4 *dq = (uint4 *)((uint16_t *)a.dq + row_offset(a.dq_stride, a.H, row / a.L, row % a.L) + part * PER);
        const float4 *acc = (const float4 *)(a.dq_acc + row * D + part * PER);
#pragma unroll
        for (int c = 0; c < PER / 8; c++) {
            const float4 x = acc[2 * c], y = acc[2 * c + 1];
            const float s = a.scale;
            dq[c] = make_uint4(bf16_pair(x.x * s, x.y * s), bf16_pair(x.z * s, x.w * s), bf16_pair(y.x * s, y.y * s),
                               bf16_pair(y.z * s, y.w * s));
        }
    }
}

/* ------------------------------------------------------------------------ */
/* float32                                                                   */
/* ------------------------------------------------------------------------ */

#define F32_MAX_D 128
#define F32_PAD (F32_MAX_D + 1)   /* a row's floats in shared memory: rows j and j + 1 one bank apart */
#define F32_BM 16                 /* forward: queries a block (16 threads a row) */
#define F32_BN 32                 /* keys a tile (forward) or a block (backward) */
#define F32_BQ 8                  /* backward: queries a step (a warp a row) */

/* Rows row0 .. row0 + ROWS - 1 (of `rows`) of a strided float matrix with
 * n columns into rows of F32_PAD floats; zeros past the end. */
template <int ROWS>
__device__ __forceinline__ void f32_load(float (*tile)[F32_PAD], const float *base, int64_t stride, int64_t row0,
                                         int64_t rows, int n)
{
    for (int id = threadIdx.x; id < ROWS * n; id += ATTN_THREADS) {
        const int r = id / n, c = id % n;
        tile[r][c] = row0 + r < rows ? base[(row0 + r) * stride + c] : 0.f;
    }
}

/* A block: 16 query rows, 16 threads a row; a thread has two keys of each
 * tile of 32 (c and c + 16) and every 16th output column from c. */
__global__ void __launch_bounds__(ATTN_THREADS) attn_fwd_f32(attn_args a)
{
    begin_after_previous_kernel();
    __shared__ float sQ[F32_BM][F32_PAD], sK[F32_BN][F32_PAD], sV[F32_BN][F32_PAD];
    __shared__ float sP[F32_BM][F32_BN + 1];
    const int r = threadIdx.x / 16, c = threadIdx.x % 16;
    const int64_t m0 = (int64_t)(gridDim.x - 1 - blockIdx.x) * F32_BM, i = m0 + r;
    const int64_t n_end = a.causal ? min(a.S, m0 + F32_BM) : a.S;

    for (int64_t bh = blockIdx.y; bh < a.B * a.H; bh += gridDim.y) {
        const int64_t b = bh / a.H, h = bh % a.H;
        const float *q = (const float *)a.q + b * a.q_stride[0] + h * a.q_stride[1];
        const float *k = (const float *)a.k + b * a.k_stride[0] + h * a.k_stride[1];
        const float *v = (const float *)a.v + b * a.v_stride[0] + h * a.v_stride[1];
        __syncthreads();   /* the previous (batch, head) is done with sQ */
        f32_load<F32_BM>(sQ, q, a.q_stride[2], m0, a.L, a.E);

        float o[F32_MAX_D / 16] = {};
        float row_max = -INFINITY, row_sum = 0.f;
        for (int64_t n0 = 0; n0 < n_end; n0 += F32_BN) {
            __syncthreads();   /* the last tile's sK, sV, sP are read */
            f32_load<F32_BN>(sK, k, a.k_stride[2], n0, a.S, a.E);
            f32_load<F32_BN>(sV, v, a.v_stride[2], n0, a.S, a.Ev);
            __syncthreads();
            float x[2];
            for (int u = 0; u < 2; u++) {
                const int jj = c + 16 * u;
                const int64_t j = n0 + jj;
                float dot = 0.f;
                for (int e = 0; e < a.E; e++)
                    dot += sQ[r][e] * sK[jj][e];
                x[u] = j < a.S && !(a.causal && j > i) ? dot * a.scale_log2 : -INFINITY;
            }
            float mx = fmaxf(row_max, fmaxf(x[0], x[1]));
            for (int off = 8; off > 0; off /= 2)
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
            const float base = mx == -INFINITY ? 0.f : mx;
            const float alpha = exp2f(row_max - base);
            row_max = mx;
            const float p0 = exp2f(x[0] - base), p1 = exp2f(x[1] - base);
            row_sum = row_sum * alpha + p0 + p1;
            sP[r][c] = p0;
            sP[r][c + 16] = p1;
#pragma unroll
            for (int u = 0; u < F32_MAX_D / 16; u++)
                o[u] *= alpha;
            __syncthreads();
            for (int jj = 0; jj < F32_BN; jj++) {
                const float p = sP[r][jj];
#pragma unroll
                for (int u = 0; u < F32_MAX_D / 16; u++)
                    if (c + 16 * u < a.Ev)
                        o[u] += p * sV[jj][c + 16 * u];
            }
        }
        for (int off = 8; off > 0; off /= 2)
            row_sum += __shfl_xor_sync(0xffffffffu, row_sum, off);
        if (i < a.L) {
            float *out = (float *)a.out + row_offset(a.o_stride, a.H, bh, i);
#pragma unroll
            for (int u = 0; u < F32_MAX_D / 16; u++)
                if (c + 16 * u < a.Ev)
                    out[c + 16 * u] = o[u] / row_sum;
            if (c == 0)
                a.lse[bh * a.L + i] = (row_max + log2f(row_sum)) * LN2;
        }
    }
}

/* A block: 32 keys, query rows in steps of 8. Scores: a warp a query, a
 * lane a key; dK and dV: 8 threads a key, every 8th column; dQ: a warp a
 * query, a lane every 32nd column. */
__global__ void __launch_bounds__(ATTN_THREADS) attn_bwd_f32(attn_args a)
{
    begin_after_previous_kernel();
    __shared__ float sK[F32_BN][F32_PAD], sV[F32_BN][F32_PAD], sQ[F32_BQ][F32_PAD], sdO[F32_BQ][F32_PAD];
    __shared__ float sP[F32_BQ][F32_BN + 1], sdS[F32_BQ][F32_BN + 1];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int kv_key = threadIdx.x / 8, kv_col = threadIdx.x % 8;
    const int64_t n0 = (int64_t)blockIdx.x * F32_BN;
    const int64_t first = a.causal ? n0 / F32_BQ * F32_BQ : 0;   /* rows before n0 see none of these keys */

    for (int64_t bh = blockIdx.y; bh < a.B * a.H; bh += gridDim.y) {
        const int64_t b = bh / a.H, h = bh % a.H;
        const float *q = (const float *)a.q + b * a.q_stride[0] + h * a.q_stride[1];
        const float *k = (const float *)a.k + b * a.k_stride[0] + h * a.k_stride[1];
        const float *v = (const float *)a.v + b * a.v_stride[0] + h * a.v_stride[1];
        const float *dout = (const float *)a.dout + b * a.do_stride[0] + h * a.do_stride[1];
        const float *lse = a.lse + bh * a.L, *delta = a.delta + bh * a.L;
        __syncthreads();   /* the previous (batch, head) is done with sK, sV */
        f32_load<F32_BN>(sK, k, a.k_stride[2], n0, a.S, a.E);
        f32_load<F32_BN>(sV, v, a.v_stride[2], n0, a.S, a.Ev);

        float dk[F32_MAX_D / 8] = {}, dv[F32_MAX_D / 8] = {};
        for (int64_t m0 = first; m0 < a.L; m0 += F32_BQ) {
            __syncthreads();   /* the last step's rows are read */
            f32_load<F32_BQ>(sQ, q, a.q_stride[2], m0, a.L, a.E);
            f32_load<F32_BQ>(sdO, dout, a.do_stride[2], m0, a.L, a.Ev);
            __syncthreads();
            const int64_t i = m0 + warp, j = n0 + lane;
            float p = 0.f, ds = 0.f;
            if (i < a.L && j < a.S && !(a.causal && j > i)) {
                float s = 0.f, dp = 0.f;
                for (int e = 0; e < a.E; e++)
                    s += sQ[warp][e] * sK[lane][e];
                for (int e = 0; e < a.Ev; e++)
                    dp += sdO[warp][e] * sV[lane][e];
                p = exp2f(s * a.scale_log2 - lse[i] * (float)LOG2E);
                ds = p * (dp - delta[i]);
            }
            sP[warp][lane] = p;
            sdS[warp][lane] = ds;
            __syncthreads();
            for (int rr = 0; rr < F32_BQ; rr++) {
                const float pv = sP[rr][kv_key], sv = sdS[rr][kv_key];
#pragma unroll
                for (int u = 0; u < F32_MAX_D / 8; u++) {
                    const int e = kv_col + 8 * u;
                    if (e < a.Ev)
                        dv[u] += pv * sdO[rr][e];
                    if (e < a.E)
                        dk[u] += sv * sQ[rr][e];
                }
            }
            if (i < a.L) {
                for (int e = lane; e < a.E; e += 32) {
                    float sum = 0.f;
                    for (int jj = 0; jj < F32_BN; jj++)
                        sum += sdS[warp][jj] * sK[jj][e];
                    atomicAdd(a.dq_acc + (bh * a.L + i) * a.E + e, sum);
                }
            }
        }

        const int64_t j = n0 + kv_key;
        if (j < a.S) {
            float *dkr = (float *)a.dk + row_offset(a.dk_stride, a.H, bh, j);
            float *dvr = (float *)a.dv + row_offset(a.dv_stride, a.H, bh, j);
#pragma unroll
            for (int u = 0; u < F32_MAX_D / 8; u++) {
                const int e = kv_col + 8 * u;
                if (e < a.E)
                    dkr[e] = dk[u] * a.scale;
                if (e < a.Ev)
                    dvr[e] = dv[u];
            }
        }
    }
}

/* ------------------------------------------------------------------------ */
/* launchers                                                                 */
/* ------------------------------------------------------------------------ */

extern "C" int dpc_attention_takes(int dtype, int64_t E, int64_t Ev)
{
    if (dtype == DP_BFLOAT16)
        return E == Ev && (E == 64 || E == 128);
    if (dtype == DP_FLOAT32)
        return E >= 1 && E <= F32_MAX_D && Ev >= 1 && Ev <= F32_MAX_D;
    return 0;
}

/* A grid's second dimension (the (batch, head) pairs, which each block
 * loops over past it): at most 65535. */
static unsigned bh_blocks(int64_t bh)
{
    return (unsigned)(bh > 65535 ? 65535 : bh);
}

static unsigned grid_for(int64_t blocks)
{
    return (unsigned)(blocks > DPC_MAX_BLOCKS ? DPC_MAX_BLOCKS : blocks);
}

/* Whether the rows of a strided bf16 tensor all start on 16 bytes. */
static bool rows_aligned(const void *p, const int64_t *stride)
{
    return (uintptr_t)p % 16 == 0 && stride[0] % 8 == 0 && stride[1] % 8 == 0 && stride[2] % 8 == 0;
}

/* Whether every row of an output the bf16 kernels write two elements at a
 * time starts on 4 bytes. */
static bool pairs_aligned(const void *p, const int64_t *stride)
{
    return (uintptr_t)p % 4 == 0 && stride[0] % 2 == 0 && stride[1] % 2 == 0 && stride[2] % 2 == 0;
}

static attn_args attn_args_of(int dtype, const dpc_attention *in)
{
    attn_args a = {};
    a.B = in->B;
    a.H = in->H;
    a.L = in->L;
    a.S = in->S;
    a.E = (int)in->E;
    a.Ev = (int)in->Ev;
    a.q = in->q;
    a.k = in->k;
    a.v = in->v;
    for (int d = 0; d < 3; d++) {
        a.q_stride[d] = in->q_stride[d];
        a.k_stride[d] = in->k_stride[d];
        a.v_stride[d] = in->v_stride[d];
        a.o_stride[d] = in->o_stride[d];
        a.do_stride[d] = in->do_stride[d];
        a.dq_stride[d] = in->dq_stride[d];
        a.dk_stride[d] = in->dk_stride[d];
        a.dv_stride[d] = in->dv_stride[d];
    }
    a.scale = (float)in->scale;
    a.scale_log2 = (float)(in->scale * LOG2E);
    a.causal = in->causal != 0;
    a.aligned = dtype == DP_BFLOAT16 && rows_aligned(in->q, in->q_stride) && rows_aligned(in->k, in->k_stride) &&
                rows_aligned(in->v, in->v_stride);
    return a;
}

/* A bf16 kernel with `smem` bytes of dynamic shared memory: past 48 KB it
 * must be allowed first, on each device (the call costs the host about
 * what a launch does, and attention's kernels are few and long). */
template <typename Kernel>
static int launch_big(Kernel kernel, size_t smem, dim3 grid, cudaStream_t s, const attn_args &a)
{
    int rc = (int)cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (rc) {
        (void)cudaGetLastError();
        return rc;
    }
    return launch_kernel_smem(NULL, 0, smem, kernel, grid, dim3(ATTN_THREADS), s, a);
}

template <int D> static int fwd_bf16_launch(const attn_args &a, cudaStream_t s)
{
    dim3 grid((unsigned)CEIL_DIV(a.L, (int64_t)FWD_BM), bh_blocks(a.B * a.H));
    return launch_big(attn_fwd_bf16<D>, fwd_smem<D>(), grid, s, a);
}

template <int D> static int bwd_bf16_launch(const attn_args &a, cudaStream_t s)
{
    dim3 grid((unsigned)CEIL_DIV(a.S, (int64_t)bwd_tiles<D>::BN), bh_blocks(a.B * a.H));
    return launch_big(attn_bwd_bf16<D>, bwd_tiles<D>::smem, grid, s, a);
}

extern "C" int dpc_attention_forward(int dtype, const dpc_attention *in, void *out, float *lse, void *stream)
{
    if (!dpc_attention_takes(dtype, in->E, in->Ev))
        return DPC_UNSUPPORTED;
    cudaStream_t s = (cudaStream_t)stream;
    const int64_t rows = in->B * in->H * in->L;
    if (rows == 0)
        return 0;
    if (in->S == 0) {   /* an empty softmax: no key to attend to */
        const size_t bytes = (size_t)(rows * in->Ev) * (dtype == DP_BFLOAT16 ? 2 : 4);
        int rc = (int)cudaMemsetAsync(out, 0, bytes, s);
        return rc ? rc : dpc_fill_f32(lse, -INFINITY, rows, stream);
    }
    if (!pairs_aligned(out, in->o_stride))   /* the kernels store two bf16 at once */
        return (int)cudaErrorMisalignedAddress;
    attn_args a = attn_args_of(dtype, in);
    a.out = out;
    a.lse = lse;
    if (dtype == DP_FLOAT32) {
        dim3 grid((unsigned)CEIL_DIV(a.L, (int64_t)F32_BM), bh_blocks(a.B * a.H));
        return launch_kernel(attn_fwd_f32, grid, ATTN_THREADS, s, a);
    }
    return a.E == 64 ? fwd_bf16_launch<64>(a, s) : fwd_bf16_launch<128>(a, s);
}

extern "C" size_t dpc_attention_workspace(int dtype, const dpc_attention *in)
{
    if (!dpc_attention_takes(dtype, in->E, in->Ev))
        return 0;
    return (size_t)(in->B * in->H * in->L) * (size_t)(in->E + 1) * sizeof(float);
}

extern "C" int dpc_attention_backward(int dtype, const dpc_attention *in, const void *out, const void *dout,
                                      const float *lse, void *dq, void *dk, void *dv, void *workspace,
                                      void *stream)
{
    if (!dpc_attention_takes(dtype, in->E, in->Ev))
        return DPC_UNSUPPORTED;
    cudaStream_t s = (cudaStream_t)stream;
    const int64_t bh = in->B * in->H;
    const size_t elem = dtype == DP_BFLOAT16 ? 2 : 4;
    if (bh == 0)
        return 0;
    if (in->L == 0 || in->S == 0) {   /* no score: every gradient is 0 */
        int rc = (int)cudaMemsetAsync(dq, 0, (size_t)(bh * in->L * in->E) * elem, s);
        if (!rc)
            rc = (int)cudaMemsetAsync(dk, 0, (size_t)(bh * in->S * in->E) * elem, s);
        if (!rc)
            rc = (int)cudaMemsetAsync(dv, 0, (size_t)(bh * in->S * in->Ev) * elem, s);
        return rc;
    }
    /* two bf16 stored at once; two accumulators added at once */
    if (!pairs_aligned(dk, in->dk_stride) || !pairs_aligned(dv, in->dv_stride) || (uintptr_t)workspace % 8)
        return (int)cudaErrorMisalignedAddress;
    attn_args a = attn_args_of(dtype, in);
    a.out = (void *)out;
    a.dout = dout;
    a.lse = (float *)lse;
    a.dq_acc = (float *)workspace;
    a.delta = a.dq_acc + bh * in->L * in->E;
    a.dq = dq;
    a.dk = dk;
    a.dv = dv;
    a.aligned = a.aligned && rows_aligned(dout, in->do_stride);

    const int64_t rows = bh * in->L;
    const unsigned row_grid = grid_for(CEIL_DIV(rows, (int64_t)ATTN_WARPS));   /* a warp a row */
    int rc;
    if (dtype == DP_FLOAT32) {
        rc = launch_kernel(attn_delta<float>, row_grid, ATTN_THREADS, s, a);
        if (!rc) {
            dim3 grid((unsigned)CEIL_DIV(a.S, (int64_t)F32_BN), bh_blocks(bh));
            rc = launch_kernel(attn_bwd_f32, grid, ATTN_THREADS, s, a);
        }
        return rc ? rc : launch_kernel(attn_dq_store<float>, row_grid, ATTN_THREADS, s, a);
    }
    /* (the float4 accumulators: a workspace on 16 bytes) */
    const bool vec = a.aligned && rows_aligned(out, in->o_stride) && rows_aligned(dq, in->dq_stride) &&
                     (uintptr_t)workspace % 16 == 0;
    void (*delta)(attn_args) = !vec ? attn_delta<uint16_t> : a.E == 64 ? attn_delta_vec<64> : attn_delta_vec<128>;
    void (*store)(attn_args) =
        !vec ? attn_dq_store<uint16_t> : a.E == 64 ? attn_dq_store_vec<64> : attn_dq_store_vec<128>;
    const unsigned grid = vec ? grid_for(CEIL_DIV(rows, (int64_t)ROWS_A_BLOCK)) : row_grid;
    rc = launch_kernel(delta, grid, ATTN_THREADS, s, a);
    if (!rc)
        rc = a.E == 64 ? bwd_bf16_launch<64>(a, s) : bwd_bf16_launch<128>(a, s);
    return rc ? rc : launch_kernel(store, grid, ATTN_THREADS, s, a);
}
