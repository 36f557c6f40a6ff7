/*
 * gemm_own.cu — our kernels for small products (dpc_gemm sends them here
 * up to GEMM_OWN_FLOPS multiply-adds): one block for those whose operands
 * fit its shared memory (small_gemm_kernel), tiles for the rest
 * (tiled_gemm_kernel), k split over a thread-block cluster where the
 * tiles are few. One launch may carry a Linear layer's two products, or
 * two layers' backwards in a chain, and an SGD step after them.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <stdint.h>
#include <string.h>

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "common/dtype_conv.h"
#include "dp_cuda.h"
#include "dpc_ops.h"
#include "common/dplua_codes.h"
#include "gemm.cuh"
#include "launch.cuh"
#include "sgd.cuh"

/* Up to GEMM_OWN_FLOPS multiply-adds, what cuBLASLt's kernels save on the
 * GPU is less than what a call costs on the host (15-20 us on the H200
 * machines, against 5-7 for a launch of ours), and an eager step of such
 * products is bound by the host. Each block computes a TILE x TILE tile of
 * C (TILE = 16 TM) with 256 threads, TM x TM elements each, from BK-deep
 * slices of op(A) and op(B) staged in shared memory; the next slice is
 * loaded into registers while the current one is used, 16 bytes a load
 * where the operands are aligned for it (the MLP step 56.3 -> 55.5 us
 * replayed). One launch may carry two products: a Linear layer's dx and
 * dw.
 *
 * A product of few tiles and a deep k (a 256 x 256 output from k = 784:
 * 16 tiles of 64) splits k over a thread-block cluster of up to
 * OWN_MAX_SPLITS blocks (sm_90): each block multiplies its share of k,
 * leaves its partial tile in its shared memory, and then each sums a part
 * of the tile over the cluster's blocks, in rank order, and writes it
 * through the epilogue. No workspace, no second launch, and the same
 * result for the same shape every time: a 64 x 2048 x 64 product took 36
 * us in 16 blocks, 10 us split 8 ways (cuBLASLt's 9.8). In a launch of two
 * products each has its own split (own_plan): the MLP's last layer's dw
 * (k = 256) splits 4 ways beside its unsplit dx (k = 10), 8.0 -> 6.1 us.
 *
 * Past GEMM_OWN_FLOPS multiply-adds cuBLASLt's GPU time wins over what
 * its host cost loses in this kernel: the MLP's 256 x 784 x 256 first
 * layer takes 10.8 us in cuBLASLt and 15.5 us in ours, its weight
 * gradient 7.2 and 14.4, and the MLP step replayed is 55.6 us with both in
 * cuBLASLt, 68.3 with both in ours. Ours has two warps a scheduler there
 * (one block an SM). */
#define GEMM_OWN_FLOPS (1 << 24)
/* k past which a product goes to cuBLASLt whatever its size: our kernels
 * stage k in slices and would take many of them one after another. */
#define OWN_MAX_K 2048
/* Blocks below which a smaller tile, or a split of k, is taken: about one
 * per SM of an H100/H200 (fewer, larger tiles were slower). */
#define OWN_MIN_BLOCKS 128
/* The most blocks a split of k spreads over: the portable cluster size. */
#define OWN_MAX_SPLITS 8
/* The least number of BK-deep slices of k each block of a split takes:
 * one lets the MLP's second layer (k = 256) take 32-wide tiles in 4
 * shares, 128 blocks, instead of 16-wide unsplit ones (8.6 -> 6.6 us). */
#define OWN_SHARE_SLICES 1


/* What the epilogue of element (i, j) reads besides C: its bias, and
 * whether the mask keeps it. */
template <typename Acc>
struct epilogue_in {
    Acc bias;
    bool keep;
};

template <typename T, typename Acc>
__device__ static inline epilogue_in<Acc> epilogue_load(const tile_job &J, int64_t i, int64_t j)
{
    const gemm_args &g = J.g;
    epilogue_in<Acc> e = { (Acc)0, true };
    if (i < g.m && j < g.n) {
        if (g.epilogue != DPC_EPI_BGRAD && g.bias)
            e.bias = to_acc(((const T *)g.bias)[j]);
        if (J.mask)
            e.keep = to_acc(((const T *)J.mask)[i * g.ldc + j]) > 0;
    }
    return e;
}

/* Element (i, j) of the job's C (batch entry C) from its product v:
 * alpha, beta, bias, the activation and the mask (e: epilogue_load's).
 * Returns it as stored. */
template <typename T, typename Acc>
__device__ static inline Acc tile_finish(const tile_job &J, T *C, int64_t i, int64_t j, Acc v, epilogue_in<Acc> e)
{
    const gemm_args &g = J.g;
    T *p = C + i * g.ldc + j;
    v = (Acc)g.alpha * v;
    if (g.beta != 0)   /* beta 0 does not read C (NaN there must not survive) */
        v = v + (Acc)g.beta * to_acc(*p);
    if (g.epilogue != DPC_EPI_BGRAD && g.bias)
        v = v + e.bias;
    v = activate(g.epilogue, v, g.aux ? (T *)g.aux + i * g.ldc + j : (T *)NULL);
    T stored;
    store(&stored, e.keep ? v : (Acc)0);
    *p = stored;
    return to_acc(stored);
}

/* The end of a cluster's reads of one another's shared memory: no block
 * leaves (its shared memory gone) before every block has read what it
 * needed from it. Relaxed, which orders no memory access: so every read
 * of another block's shared memory must have its value used (stored)
 * before the arrival, which then cannot come before the read has
 * returned; and no write needs to be seen by the others. cluster.sync()'s
 * release waited for the block's stores to C to drain (relaxed, with
 * tile_split_finish's loads at once, the MLP step replayed 1.6 us
 * shorter). */
__device__ static inline void cluster_leave(void)
{
#if __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.relaxed.aligned;\nbarrier.cluster.wait.aligned;\n" ::: "memory");
#endif
}

/* The blocks of a cluster that split a tile's k: each leaves its partial
 * tile (and row sums) in part, then sums its share of the elements over
 * the cluster's blocks in rank order. Every thread of the cluster's
 * blocks (of 256 threads each) calls it. */
template <typename T, typename Acc, int TILE>
__device__ static void tile_split_finish(const tile_job &J, T *C, int64_t i0, int64_t j0, bool with_sums,
                                         Acc *part)
{
#if __CUDA_ARCH__ >= 900
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    cluster.sync();   /* every block's partial is in its shared memory */
    const int splits = (int)cluster.num_blocks(), rank = (int)cluster.block_rank();
    for (int e = rank * 256 + (int)threadIdx.x; e < TILE * TILE + TILE; e += 256 * splits) {
        const bool sum_row = e >= TILE * TILE;
        const int64_t i = i0 + (sum_row ? e - TILE * TILE : e / TILE), j = j0 + e % TILE;
        if (i >= J.g.m || (sum_row ? !with_sums : j >= J.g.n))
            continue;
        /* every block's value first, then the sums in rank order: one
         * latency of the others' shared memory, not one a block */
        Acc u[OWN_MAX_SPLITS];
#pragma unroll
        for (int s = 0; s < OWN_MAX_SPLITS; s++)
            u[s] = s < splits ? cluster.map_shared_rank(part, s)[e] : Acc(0);
        Acc v = 0;
#pragma unroll
        for (int s = 0; s < OWN_MAX_SPLITS; s++)
            if (s < splits)
                v += u[s];
        if (sum_row)
            store((T *)J.g.bias + i, v);
        else
            tile_finish(J, C, i, j, v, epilogue_load<T, Acc>(J, i, j));
    }
    cluster_leave();
#else
    __trap();   /* the host splits only on devices with clusters (own_can_split) */
#endif
}

/* TM consecutive values from shared memory in as few loads as their
 * alignment allows (16 bytes at most a load): the rows of a slice are
 * padded to keep a thread's TM values aligned. */
template <int TM, typename Acc>
__device__ static inline void load_run(const Acc *p, Acc (&out)[TM])
{
    constexpr int BYTES = TM * (int)sizeof(Acc);
    if constexpr (BYTES % 16 == 0) {
#pragma unroll
        for (int v = 0; v < BYTES / 16; v++) {
            float4 q = reinterpret_cast<const float4 *>(p)[v];
            memcpy((char *)out + 16 * v, &q, 16);
        }
    } else if constexpr (BYTES == 8) {
        float2 q = *reinterpret_cast<const float2 *>(p);
        memcpy(out, &q, 8);
    } else {
#pragma unroll
        for (int r = 0; r < TM; r++)
            out[r] = p[r];
    }
}

/* The elements of an operand a thread of tiled_gemm_kernel reads in one
 * load where the operand's alignment allows (tile_vectors): 16 bytes, or
 * 8 of bfloat16 (the slices hold four of them in a thread's registers). */
__host__ __device__ constexpr int tile_vector(size_t elem)
{
    return elem == 8 ? 2 : 4;
}

/* V elements from p (aligned to V of them) into out, as Acc. */
template <int V, typename T, typename Acc>
__device__ static inline void load_vector(const T *p, Acc *out)
{
    constexpr int BYTES = V * (int)sizeof(T);
    static_assert(BYTES == 8 || BYTES == 16, "a vector of 8 or 16 bytes");
    T v[V];
    if constexpr (BYTES == 16) {
        uint4 q = *reinterpret_cast<const uint4 *>(p);
        memcpy(v, &q, 16);
    } else {
        uint2 q = *reinterpret_cast<const uint2 *>(p);
        memcpy(v, &q, 8);
    }
#pragma unroll
    for (int i = 0; i < V; i++)
        out[i] = to_acc(v[i]);
}

/* The shared memory of a block of tiled_gemm_kernel. */
template <typename Acc, int TM>
struct tile_smem {
    static constexpr int TILE = 16 * TM, BK = TM == 4 ? 32 : 64;
    /* Rows padded by PAD: a thread's TM values stay aligned for load_run,
     * and the stores of a slice spread over the banks (1: none collide). */
    static constexpr int PAD = TM == 1 ? 1 : 16 / (int)sizeof(Acc) > TM ? 16 / (int)sizeof(Acc) : TM;
    /* A split's partial tile and row sums reuse the slices' space once the
     * product is done. */
    union {
        struct {
            Acc a[BK][TILE + PAD], b[BK][TILE + PAD];
        } slice;
        Acc part[TILE * TILE + TILE];
    };
};

namespace {   /* file-local types: no clash with another file's of the same name */
/* Where a block of tiled_gemm_kernel works: one of `splits` shares of the
 * k of tile (tm, tn) of batch entry b, the tile's first row i0 and column
 * j0, its share of k from k_first to k. */
struct tile_place {
    int64_t k_first, k, tn, b, i0, j0;
    int splits;
};
}  // namespace

/* The place of block blk of job J (J.blocks of them, whole clusters: split
 * blk % J.splits of tile blk / J.splits, own_plan); from J alone, so that
 * the kernel finds it before it waits for the kernel before (64-bit
 * divisions, a few hundred instructions). */
template <typename Acc, int TM>
__device__ static inline tile_place tile_place_of(const tile_job &J, int64_t blk)
{
    constexpr int TILE = tile_smem<Acc, TM>::TILE, BK = tile_smem<Acc, TM>::BK;
    const gemm_args &g = J.g;
    tile_place p;
    p.splits = J.splits;
    const int64_t split = blk % J.splits, tile = blk / J.splits;
    /* this block's share of k: whole slices, the last share possibly empty */
    const int64_t share = CEIL_DIV(CEIL_DIV(g.k, (int64_t)BK), (int64_t)p.splits) * BK;
    p.k_first = split * share;
    p.k = g.k < p.k_first + share ? g.k : p.k_first + share;
    p.tn = tile % J.tiles_n;
    const int64_t tm = tile / J.tiles_n % J.tiles_m;
    p.b = tile / J.tiles_n / J.tiles_m;
    p.i0 = tm * TILE;
    p.j0 = p.tn * TILE;
    return p;
}

/* The tile of job J at place p (tile_place_of), by the block's 256
 * threads. Thread (tx, ty) computes rows ty TM .. ty TM + TM-1 and
 * columns tx TM .. tx TM + TM-1 of the tile: each step of k reads its TM
 * values of each operand with one or two vector loads from shared memory,
 * which is what bounds this kernel. */
template <typename T, typename Acc, int TM>
__device__ static void tile_run(const tile_job &J, const tile_place &p, tile_smem<Acc, TM> &sm)
{
    constexpr int TILE = tile_smem<Acc, TM>::TILE, BK = tile_smem<Acc, TM>::BK, LOADS = TILE * BK / 256;
    static_assert(sizeof sm.slice >= sizeof sm.part, "a partial tile fits in the slices' space");
    auto &As = sm.slice.a, &Bs = sm.slice.b;
    const gemm_args &g = J.g;
    const int64_t m = g.m, n = g.n;
    const int64_t k_first = p.k_first, k = p.k, tn = p.tn, b = p.b, i0 = p.i0, j0 = p.j0;
    const int splits = p.splits;
    const T *A = (const T *)g.A + b * g.stride_a, *B = (const T *)g.B + b * g.stride_b;
    const int64_t a_i = g.trans_a ? 1 : g.lda, a_k = g.trans_a ? g.lda : 1;   /* op(A)(i, k) = A[i*a_i + k*a_k] */
    const int64_t b_k = g.trans_b ? 1 : g.ldb, b_j = g.trans_b ? g.ldb : 1;   /* op(B)(k, j) = B[k*b_k + j*b_j] */
    /* Load l of a slice runs along k where the operand is contiguous in k,
     * else along i (j): neighbouring threads read neighbouring elements. */
    const bool a_along_k = !g.trans_a, b_along_k = g.trans_b;
    const int t = (int)threadIdx.x, tx = t % 16, ty = t / 16;
    const bool with_sums = g.epilogue == DPC_EPI_BGRAD && tn == 0, row_sums = with_sums && tx == 0;
    /* Small tiles load their epilogue's bias and mask beside the first
     * slice, so that one latency covers both: a tile of one slice is made
     * of little more than the loads' latencies. Large tiles keep their
     * registers for the product. */
    constexpr bool EARLY = TM <= 2;
    epilogue_in<Acc> early[EARLY ? TM : 1][EARLY ? TM : 1];
    if constexpr (EARLY)
        if (splits == 1)
#pragma unroll
            for (int r = 0; r < TM; r++)
#pragma unroll
                for (int c = 0; c < TM; c++)
                    early[r][c] = epilogue_load<T, Acc>(J, i0 + ty * TM + r, j0 + tx * TM + c);

    /* Element q of a thread's part of a slice is (ii, kk) of the slice:
     * runs along k where the operand is contiguous in k, else along i (j),
     * so that neighbouring threads read neighbouring elements; with vectors
     * each thread reads V neighbours in one load (tile_vectors said that
     * the operand's alignment allows it). */
    constexpr int V = tile_vector(sizeof(T));
    auto slice_at = [&](int q, bool along_k, bool vec, int &ii, int &kk) {
        if (!vec) {
            const int l = t + 256 * q;
            along_k ? (kk = l % BK, ii = l / BK) : (ii = l % TILE, kk = l / TILE);
        } else {
            const int l = t + 256 * (q / V), v = q % V;
            along_k ? (kk = l % (BK / V) * V + v, ii = l / (BK / V)) : (ii = l % (TILE / V) * V + v, kk = l / (TILE / V));
        }
    };
    /* Element q (and, with vectors, the V - 1 after it) of op(X)'s slice
     * from k0: X(r, kk) at X[r * x_r + kk * x_k], r < rows, zero past the
     * ends. */
    auto load_part = [&](Acc *out, int q, const T *X, int64_t x_r, int64_t x_k, int64_t r0, int64_t rows, int64_t k0,
                         bool along_k, bool vec) {
        int rr, kk;
        slice_at(q, along_k, vec, rr, kk);
        const int64_t r = r0 + rr, kg = k0 + kk;
        const T *p = X + r * x_r + kg * x_k;
        if (vec && (along_k ? r < rows && kg + V <= k : r + V <= rows && kg < k)) {
            load_vector<V>(p, out);
            return;
        }
#pragma unroll
        for (int v = 0; v < V; v++)   /* one element, or a vector over a slice's ends */
            if (v == 0 || vec)
                out[v] = (along_k ? r < rows && kg + v < k : r + v < rows && kg < k) ? (Acc)to_acc(p[v]) : (Acc)0;
    };
    const bool a_vec = J.vec_a, b_vec = J.vec_b;
    Acc ra[LOADS], rb[LOADS];
    /* Elements q .. q + V - 1 of op(X)'s slice: a vector, or V loads of one
     * (each load_part call with its vec a constant, which keeps the loads'
     * code apart and short; a run-time vec there lost the vectors' gain).
     * op(A)(i, kk) = A[i*a_i + kk*a_k]; op(B)(kk, j) = B[j*b_j + kk*b_k]. */
    auto load_group = [&](Acc *regs, int q, const T *X, int64_t x_r, int64_t x_k, int64_t r0, int64_t rows,
                          int64_t k0, bool along_k, bool vec) {
        if (vec)
            load_part(&regs[q], q, X, x_r, x_k, r0, rows, k0, along_k, true);
        else
#pragma unroll
            for (int v = 0; v < V; v++)
                load_part(&regs[q + v], q + v, X, x_r, x_k, r0, rows, k0, along_k, false);
    };
    auto load_slice = [&](int64_t k0) {
#pragma unroll
        for (int q = 0; q < LOADS; q += V) {
            load_group(ra, q, A, a_i, a_k, i0, m, k0, a_along_k, a_vec);
            load_group(rb, q, B, b_j, b_k, j0, n, k0, b_along_k, b_vec);
        }
    };

    /* Two sets of accumulators, for even and odd kk: twice the independent
     * chains of multiply-adds, which a small tile (one element a thread)
     * otherwise waits on. */
    Acc acc[2][TM][TM], sums[TM];
#pragma unroll
    for (int r = 0; r < TM; r++) {
        sums[r] = 0;
#pragma unroll
        for (int c = 0; c < TM; c++)
            acc[0][r][c] = acc[1][r][c] = 0;
    }
    load_slice(k_first);
    for (int64_t k0 = k_first; k0 < k; k0 += BK) {
#pragma unroll
        for (int q = 0; q < LOADS; q++) {
            int ii, jj, kk;
            slice_at(q, a_along_k, a_vec, ii, kk);
            As[kk][ii] = ra[q];
            slice_at(q, b_along_k, b_vec, jj, kk);
            Bs[kk][jj] = rb[q];
        }
        __syncthreads();
        if (k0 + BK < k)
            load_slice(k0 + BK);
        auto multiply = [&](int kk) {
            Acc a[TM], bv[TM];
            load_run<TM>(&As[kk][ty * TM], a);
            load_run<TM>(&Bs[kk][tx * TM], bv);
#pragma unroll
            for (int r = 0; r < TM; r++)
#pragma unroll
                for (int c = 0; c < TM; c++)
                    acc[kk & 1][r][c] += a[r] * bv[c];
        };
        if constexpr (TM == 1) {
            /* Past k the slice holds zeros, which add nothing: chunks of it
             * wholly past k are skipped (a small layer's k is often less
             * than a slice). */
            constexpr int CHUNK = 16;
#pragma unroll 1
            for (int kc = 0; kc < BK && k0 + kc < k; kc += CHUNK)
#pragma unroll
                for (int kk = kc; kk < kc + CHUNK; kk++)
                    multiply(kk);
        } else {
#pragma unroll
            for (int kk = 0; kk < BK; kk++)
                multiply(kk);
        }
        /* the row sums outside the loop above, which they would slow for
         * every block: the 16 threads of a row of the tile each add every
         * 16th kk, and the shuffles below add their sums */
        if (with_sums)
#pragma unroll
            for (int kk = tx; kk < BK; kk += 16)
#pragma unroll
                for (int r = 0; r < TM; r++)
                    sums[r] += As[kk][ty * TM + r];
        __syncthreads();
    }
    if (with_sums)   /* a row's 16 threads are lanes of one half-warp */
#pragma unroll
        for (int r = 0; r < TM; r++)
#pragma unroll
            for (int o = 8; o > 0; o /= 2)
                sums[r] += __shfl_xor_sync(0xffffffffu, sums[r], o);

    T *C = (T *)g.C + b * g.stride_c;
    if (splits > 1) {   /* the main loop's last __syncthreads freed the slices */
#pragma unroll
        for (int r = 0; r < TM; r++) {
            if (row_sums)
                sm.part[TILE * TILE + ty * TM + r] = sums[r];
#pragma unroll
            for (int c = 0; c < TM; c++)
                sm.part[(ty * TM + r) * TILE + tx * TM + c] = acc[0][r][c] + acc[1][r][c];
        }
        tile_split_finish<T, Acc, TILE>(J, C, i0, j0, with_sums, sm.part);
        return;
    }
#pragma unroll
    for (int r = 0; r < TM; r++) {
        int64_t i = i0 + ty * TM + r;
        if (i >= m)
            continue;
        if (row_sums)
            store((T *)g.bias + i, sums[r]);
#pragma unroll
        for (int c = 0; c < TM; c++) {
            int64_t j = j0 + tx * TM + c;
            if (j < n) {
                epilogue_in<Acc> e;
                if constexpr (EARLY)
                    e = early[r][c];
                else
                    e = epilogue_load<T, Acc>(J, i, j);
                tile_finish(J, C, i, j, acc[0][r][c] + acc[1][r][c], e);
            }
        }
    }
}

/* __grid_constant__: the jobs are read where the launch put them, not
 * copied to each thread's local memory for the run-time choice of one.
 * Two blocks of 4-byte types share an SM (at most 128 registers a
 * thread); a block of 256 threads alone leaves an SM half idle while it
 * waits for its next slice. The jobs' blocks come in order, each job's
 * (J.blocks, whole clusters) as split b % J.splits of its tile b /
 * J.splits (own_plan). */
template <typename T, typename Acc, int TM>
__global__ static void __launch_bounds__(256, sizeof(Acc) == 4 ? 2 : 1)
    tiled_gemm_kernel(const __grid_constant__ tile_jobs jobs)
{
    let_next_kernel_start();
    __shared__ __align__(16) tile_smem<Acc, TM> sm;
    /* the block's job and place, from the parameters alone: before the wait */
    int64_t blk = blockIdx.x;
    int j = 0;
    while (j + 1 < jobs.count && blk >= jobs.job[j].blocks)
        blk -= jobs.job[j++].blocks;
    const tile_job &J = jobs.job[j];
    const bool past = blk / J.splits >= J.tiles_m * J.tiles_n * J.g.batch;
    const tile_place p = tile_place_of<Acc, TM>(J, blk);
    /* every block waits, so that this grid never ends before the one before it */
    wait_for_previous_kernel();
    if (past)
        return;   /* an unsplit job's blocks past its tiles, to fill its last cluster */
    tile_run<T, Acc, TM>(J, p, sm);
}

/* ------------------------------------------------------------------------ */
/* products for one block: operands whole in shared memory                  */
/* ------------------------------------------------------------------------ */

/* A product, or a Linear's two, whose operands fit in shared memory
 * together (a seed-sized layer: 32 x 10 from k = 10) is made in a tile of
 * little but latencies: index arithmetic, a global load and two barriers
 * per slice, 16 x 16 elements computed for the few that exist. One block
 * of GEMM_SMALL_THREADS instead stages every operand at once (one global
 * latency for all of them), and each thread computes whole elements of C,
 * at most SMALL_OUTPUTS (a bias gradient's row sums among them), each a
 * dot product over all of k from shared memory, summed as tile_run sums
 * (even and odd k apart). A chain (chain_at > 0: two Linears' backwards,
 * the second reading the first's dx) runs its two parts in turn in the
 * same launch, a barrier between them. Where both parts' operands fit
 * at once, the second's are staged with the first's, and the first
 * part's dx goes to the second's operand in shared memory as it is
 * computed (besides global memory): the second part then reads no
 * global memory, a latency less. */
#define SMALL_OUTPUTS 4
#define SMALL_BYTES (32 * 1024)
/* at most 256 multiply-adds a thread, a few hundred cycles of FMAs */
#define SMALL_MACS (GEMM_SMALL_THREADS * 256)

namespace {   /* file-local types: no clash with another file's of the same name */
/* One operand of one job, as staged: element e of its `count`, in memory
 * order (`inner` consecutive ones, rows `ld` apart), goes to shared memory
 * at at + (e / inner) * outer_step + (e % inner) * inner_step. */
struct small_stage {
    const void *src;
    int64_t ld;
    int count, inner, at, outer_step, inner_step;   /* count 0: fed by a job of the first part (feeds) */
};
struct small_jobs {
    tile_jobs jobs;
    small_stage stage[8];   /* job j's op(A) in 2j (row i at a_ld[j] i), op(B) in 2j + 1 (row kk at n kk) */
    int a_ld[4];
    int ahead;              /* a chain's second part staged with the first (its own place in sm) */
    int feeds[4][2];        /* 0, or 1 + a stage of the second part that job j's C (i, j) also goes to */
    dpc_sgd_args sgd;       /* n 0, or the SGD step the block takes after the products (small_sgd_step) */
};
/* An element of C a thread computes, or (j < 0) the row sum i of op(A). */
struct small_out {
    int job, i, j;
};
}  // namespace

/* Output o of the part (jobs first .. end-1, their elements of C in order,
 * each followed by its row sums): false past the last. */
__device__ static inline bool small_locate(const tile_jobs &jobs, int first, int end, int o, small_out &out)
{
    for (int jb = first; jb < end; jb++) {
        const gemm_args &g = jobs.job[jb].g;
        const int n = (int)g.n, mn = (int)g.m * n, sums = g.epilogue == DPC_EPI_BGRAD ? (int)g.m : 0;
        if (o < mn) {
            out = { jb, o / n, o % n };
            return true;
        }
        if ((o -= mn) < sums) {
            out = { jb, o, -1 };
            return true;
        }
        o -= sums;
    }
    return false;
}

/* Where element e of one run of elements over the stages from `first` on
 * (e below their total) is read, and (dst) where in shared memory it goes. */
template <typename T>
__device__ static inline const T *small_stage_at(const small_jobs &s, int first, int e, int &dst)
{
    int st = first;
    while (e >= s.stage[st].count)
        e -= s.stage[st++].count;
    const small_stage &S = s.stage[st];
    const int o = e / S.inner, r = e - o * S.inner;
    dst = S.at + o * S.outer_step + r * S.inner_step;
    return (const T *)S.src + o * S.ld + r;
}

/* The staged elements a thread locates before the kernel waits. */
#define SMALL_EARLY 2

namespace {   /* file-local types: no clash with another file's of the same name */
/* What a thread finds of a part before the kernel waits, from the jobs'
 * description alone: its first output, and where its first SMALL_EARLY
 * elements of the part's stages (stage_first .. stage_end-1) come from
 * and go. */
template <typename T>
struct small_start {
    small_out out;
    bool has;
    int stage_first, total, loads;
    const T *src[SMALL_EARLY];
    int dst[SMALL_EARLY];
};
}  // namespace

template <typename T>
__device__ static small_start<T> small_begin(const small_jobs &s, int first, int end, int stage_first, int stage_end)
{
    small_start<T> b;
    b.has = small_locate(s.jobs, first, end, (int)threadIdx.x, b.out);
    b.stage_first = stage_first;
    b.total = b.loads = 0;
    for (int st = stage_first; st < stage_end; st++)
        b.total += s.stage[st].count;
#pragma unroll
    for (int u = 0; u < SMALL_EARLY; u++) {
        const int e = (int)threadIdx.x + u * GEMM_SMALL_THREADS;
        if (e < b.total) {
            b.src[u] = small_stage_at<T>(s, stage_first, e, b.dst[u]);
            b.loads = u + 1;
        }
    }
    return b;
}

/* The part's stages into shared memory, as one run of elements over them:
 * the elements located early loaded together, then the rest. The loops
 * here are not unrolled: a single block's kernel runs on an SM whose
 * instruction cache has not seen it, and every instruction it runs is
 * fetched once, so code is latency. */
template <typename T, typename Acc>
__device__ static void small_stage_part(const small_jobs &s, const small_start<T> &b, Acc *sm)
{
    Acc v[SMALL_EARLY];
#pragma unroll
    for (int u = 0; u < SMALL_EARLY; u++)
        if (u < b.loads)
            v[u] = to_acc(*b.src[u]);
#pragma unroll
    for (int u = 0; u < SMALL_EARLY; u++)
        if (u < b.loads)
            sm[b.dst[u]] = v[u];
#pragma unroll 1
    for (int e = (int)threadIdx.x + SMALL_EARLY * GEMM_SMALL_THREADS; e < b.total; e += GEMM_SMALL_THREADS) {
        int dst;
        const T *src = small_stage_at<T>(s, b.stage_first, e, dst);
        sm[dst] = to_acc(*src);
    }
}

/* Jobs first .. end-1 by the whole block, from what small_begin found
 * (b): the epilogue inputs of each thread's first element are loaded
 * beside the operands, then each thread computes its elements. */
template <typename T, typename Acc>
__device__ static void small_part(const small_jobs &s, int first, int end, const small_start<T> &b, Acc *sm)
{
    small_out out = b.out;
    bool has = b.has;
    epilogue_in<Acc> e = { (Acc)0, true };
    if (has && out.j >= 0)
        e = epilogue_load<T, Acc>(s.jobs.job[out.job], out.i, out.j);
    small_stage_part<T, Acc>(s, b, sm);
    __syncthreads();
#pragma unroll 1
    for (int o = (int)threadIdx.x + GEMM_SMALL_THREADS; has; o += GEMM_SMALL_THREADS) {
        const int jb = out.job, i = out.i, j = out.j;
        const tile_job &J = s.jobs.job[jb];
        const int k = (int)J.g.k, n = (int)J.g.n;
        const Acc *a = sm + s.stage[2 * jb].at + i * s.a_ld[jb];
        int kk = 0;
        if (j < 0) {   /* a row sum: four chains of adds, not one */
            Acc s0 = 0, s1 = 0, s2 = 0, s3 = 0;
            for (; kk + 4 <= k; kk += 4) {
                s0 += a[kk];
                s1 += a[kk + 1];
                s2 += a[kk + 2];
                s3 += a[kk + 3];
            }
            for (; kk < k; kk++)
                s0 += a[kk];
            store((T *)J.g.bias + i, (s0 + s1) + (s2 + s3));
        } else {   /* even and odd kk apart, as tile_run */
            const Acc *b = sm + s.stage[2 * jb + 1].at + j;
            Acc even = 0, odd = 0;
#pragma unroll 2
            for (; kk + 2 <= k; kk += 2) {
                even += a[kk] * b[kk * n];
                odd += a[kk + 1] * b[(kk + 1) * n];
            }
            if (kk < k)
                even += a[kk] * b[kk * n];
            const Acc stored = tile_finish(J, (T *)J.g.C, i, j, even + odd, e);
            for (int f = 0; f < 2 && s.feeds[jb][f]; f++) {   /* C is a second-part operand: its row i */
                const small_stage &F = s.stage[s.feeds[jb][f] - 1];
                sm[F.at + i * F.outer_step + j * F.inner_step] = stored;
            }
        }
        if ((has = small_locate(s.jobs, first, end, o, out)) && out.j >= 0)
            e = epilogue_load<T, Acc>(s.jobs.job[out.job], out.i, out.j);
    }
}

/* A stored element as src/common/dtype_conv.h rounds it (NaN too), as
 * optim.cu's SGD stores it. */
__device__ static inline void sgd_store(float *p, float v) { *p = v; }
__device__ static inline void sgd_store(double *p, double v) { *p = v; }
__device__ static inline void sgd_store(__nv_bfloat16 *p, float v)
{
    *reinterpret_cast<uint16_t *>(p) = f32_to_bf16(v);
}

/* Parameter i of the SGD step and its momentum as the update reads it
 * (0 where there is none, or on the first step), into p and b. */
template <typename T, typename Acc>
__device__ static inline void small_sgd_load(const dpc_sgd_args &a, int i, Acc &p, Acc &b)
{
    p = to_acc(((const T *)a.param)[i]);
    b = a.momentum_buf && !a.first_step ? to_acc(((const T *)a.momentum_buf)[i]) : (Acc)0;
}

/* The SGD step after the products, by the whole block, each element as
 * optim.cu's sgd_kernel computes it (sgd.cuh). The gradients are the
 * products' (written by this block before a barrier) or older; each
 * thread's first parameter and momentum (p0, b0) were loaded at the
 * start, beside the operands. */
template <typename T, typename Acc>
__device__ static void small_sgd_step(const dpc_sgd_args &a, Acc p0, Acc b0)
{
    const sgd_consts<Acc> c = sgd_consts_of<Acc>(a);
    T *P = (T *)a.param, *B = (T *)a.momentum_buf;
    const T *G = (const T *)a.grad;
#pragma unroll 1
    for (int i = (int)threadIdx.x; i < a.n; i += GEMM_SMALL_THREADS) {
        Acc b = b0;
        const Acc p = sgd_element(p0, to_acc(G[i]), B != NULL, &b, c);
        if (B)
            sgd_store(B + i, b);
        sgd_store(P + i, p);
        if (i + GEMM_SMALL_THREADS < a.n)
            small_sgd_load<T>(a, i + GEMM_SMALL_THREADS, p0, b0);
    }
}

/* The jobs' description is read by run-time indices (which job, which
 * operand), chains of reads that each may miss the constant cache of an
 * SM that has not run this launch; so the block first copies it into
 * shared memory, all of it at once, and reads it there. That, and
 * finding each thread's first outputs and operands in it (small_begin),
 * touch no memory of the kernel before, so they are done while that one
 * still runs (launch.cuh). */
template <typename T, typename Acc>
__global__ static void __launch_bounds__(GEMM_SMALL_THREADS) small_gemm_kernel(const __grid_constant__ small_jobs params)
{
    let_next_kernel_start();
    __shared__ __align__(16) Acc sm[SMALL_BYTES / sizeof(Acc)];
    __shared__ __align__(16) small_jobs s;
    static_assert(sizeof s % sizeof(int) == 0 && sizeof s / sizeof(int) <= GEMM_SMALL_THREADS, "one word a thread");
    if (threadIdx.x < sizeof s / sizeof(int))
        reinterpret_cast<int *>(&s)[threadIdx.x] = reinterpret_cast<const int *>(&params)[threadIdx.x];
    __syncthreads();
    /* also before the wait: where each part's first outputs and operands are */
    const int at = s.jobs.chain_at ? s.jobs.chain_at : s.jobs.count, count = s.jobs.count;
    const small_start<T> first = small_begin<T>(s, 0, at, 0, 2 * (s.ahead ? count : at));
    const small_start<T> second = small_begin<T>(s, at, count, s.ahead ? 2 * count : 2 * at, 2 * count);
    wait_for_previous_kernel();
    Acc p0 = 0, b0 = 0;   /* the step's first parameter and momentum of this thread, loaded early */
    const dpc_sgd_args &sgd = s.sgd;
    if ((int)threadIdx.x < sgd.n)
        small_sgd_load<T>(sgd, (int)threadIdx.x, p0, b0);
    small_part<T, Acc>(s, 0, at, first, sm);
    if (at < count) {
        __syncthreads();   /* the first part's writes visible to the block; unless ahead, its shared memory free */
        small_part<T, Acc>(s, at, count, second, sm);
    }
    if (sgd.n > 0) {
        __syncthreads();   /* the gradients the block wrote visible to all of it */
        small_sgd_step<T, Acc>(sgd, p0, b0);
    }
}

/* Places the operands of jobs first .. end-1 of s.jobs in shared memory
 * of elements of acc_size bytes from element `at` on, which ends at the
 * end of them: false when they do not fit one block. */
static bool small_plan_part(small_jobs &s, int first, int end, size_t acc_size, int64_t &at)
{
    int64_t outputs = 0, macs = 0;
    for (int j = first; j < end; j++) {
        const gemm_args &g = s.jobs.job[j].g;
        const int64_t most = GEMM_SMALL_THREADS * SMALL_OUTPUTS;   /* bounds each factor before any product */
        if (g.batch != 1 || g.m > most || g.n > most || g.k > SMALL_MACS)
            return false;
        const int64_t m = g.m, n = g.n, k = g.k, a_ld = k | 1;   /* odd: rows i of a warp in distinct banks */
        const int64_t a_at = at, b_at = a_at + m * a_ld;
        at = b_at + k * n;
        outputs += m * n + (g.epilogue == DPC_EPI_BGRAD ? m : 0);
        macs += m * n * k;
        if (at * (int64_t)acc_size > SMALL_BYTES || outputs > most || macs > SMALL_MACS)
            return false;
        s.a_ld[j] = (int)a_ld;
        s.stage[2 * j] = g.trans_a ? small_stage{ g.A, g.lda, (int)(m * k), (int)m, (int)a_at, 1, (int)a_ld }
                                   : small_stage{ g.A, g.lda, (int)(m * k), (int)k, (int)a_at, (int)a_ld, 1 };
        s.stage[2 * j + 1] = g.trans_b ? small_stage{ g.B, g.ldb, (int)(k * n), (int)k, (int)b_at, 1, (int)n }
                                       : small_stage{ g.B, g.ldb, (int)(k * n), (int)n, (int)b_at, (int)n, 1 };
    }
    return true;
}

/* Whether a first-part job writes any memory the stage reads. */
static bool stage_reads_output(const small_stage &S, const gemm_args &g)
{
    const int64_t es = (int64_t)dt_size(g.dtype);
    const int64_t read = S.count ? ((S.count / S.inner - 1) * S.ld + S.inner) * es : 0;
    const int64_t written = ((g.m - 1) * g.ldc + g.n) * es;
    return gemm_overlap(S.src, read, g.C, written) || (g.aux && gemm_overlap(S.src, read, g.aux, written)) ||
           (g.epilogue == DPC_EPI_BGRAD && g.bias && gemm_overlap(S.src, read, g.bias, g.m * es));
}

/* A chain's second part staged ahead, with the first part's: each of its
 * stages that reads a first-part job's C, whole and row by row as the job
 * writes it, is fed by the job instead (tile_finish's value, as the stage
 * would load it). False when another stage reads what the first part
 * writes: then the second part cannot be staged ahead. */
static bool small_plan_feeds(small_jobs &s, int at)
{
    for (int st = 2 * at; st < 2 * s.jobs.count; st++) {
        small_stage &S = s.stage[st];
        for (int jb = 0; jb < at && S.count; jb++) {
            const gemm_args &g = s.jobs.job[jb].g;
            int *slot = !s.feeds[jb][0] ? &s.feeds[jb][0] : !s.feeds[jb][1] ? &s.feeds[jb][1] : NULL;
            if (slot && S.src == g.C && S.ld == g.ldc && S.inner == g.n && S.count == g.m * g.n) {
                *slot = st + 1;
                S.count = 0;
            }
        }
        for (int jb = 0; jb < at && S.count; jb++)
            if (stage_reads_output(S, s.jobs.job[jb].g))
                return false;
    }
    return true;
}

/* Whether the jobs (both parts of a chain) fit small_gemm_kernel; s is
 * then its argument. A chain's second part goes after the first where
 * both fit, else in the first's place. */
static bool small_plan(small_jobs &s, const tile_jobs &jobs, size_t acc_size)
{
    memset(&s, 0, sizeof s);
    s.jobs = jobs;
    const int at = jobs.chain_at ? jobs.chain_at : jobs.count;
    int64_t end = 0;
    if (!small_plan_part(s, 0, at, acc_size, end))
        return false;
    if (at == jobs.count)
        return true;
    if (small_plan_part(s, at, jobs.count, acc_size, end) && small_plan_feeds(s, at)) {
        s.ahead = 1;
        return true;
    }
    memset(s.feeds, 0, sizeof s.feeds);
    end = 0;
    return small_plan_part(s, at, jobs.count, acc_size, end);
}

/* Whether a product of this shape is one for our kernel. */
bool gemm_own_fits(int64_t m, int64_t n, int64_t k, int64_t batch)
{
    return k <= OWN_MAX_K && (double)m * (double)n * (double)k * (double)batch <= GEMM_OWN_FLOPS;
}

extern "C" int dpc_gemm_own(int64_t m, int64_t n, int64_t k, int64_t batch)
{
    return gemm_own_fits(m, n, k, batch);
}

/* Whether a split of k may run on the current device: it launches
 * clusters and our kernel was built for it. */
static bool own_can_split(void)
{
    return dpc_device_can() & DPC_CAN_CLUSTER;
}

/* The most blocks that may share a k of `slices` slices, OWN_SHARE_SLICES
 * slices each; one for a product launched alone that the one-launch loss
 * might take (k up to DPC_GEMM_UNSPLIT_K, DPC_GEMM_UNSPLIT_MACS
 * multiply-adds at most), so that a Linear's forward sums as the loss
 * sums it (see dpc_ops.h). A larger one splits: the MLP's last layer
 * (256 x 128 -> 10) in 32 blocks rather than 16. */
static int64_t own_deep(const tile_jobs &jobs, int j, int64_t slices)
{
    const gemm_args &g = jobs.job[j].g;
    const bool unsplit = jobs.count == 1 && g.k <= DPC_GEMM_UNSPLIT_K &&
                         (double)g.m * (double)g.n * (double)g.k * (double)g.batch <= DPC_GEMM_UNSPLIT_MACS;
    return unsplit ? 1 : slices / OWN_SHARE_SLICES;
}

/* Each job's tiles of 16 TM and how many blocks share each tile's k (k in
 * slices of BK, each share at least OWN_SHARE_SLICES slices deep): enough
 * for the launch to reach OWN_MIN_BLOCKS blocks,
 * and for a deep job to take about as long as the shallowest beside it
 * (the MLP's last layer's dw, k = 256, beside its dx, k = 10). A job
 * splits over a whole cluster or not at all, and an unsplit job's blocks
 * fill whole clusters (the extra ones do nothing), so that every block of
 * a cluster belongs to one job. Returns the launch's blocks. */
static int64_t own_plan(tile_jobs &jobs, int tm)
{
    const int64_t tile = 16 * tm, bk = tm == 4 ? 32 : 64;   /* tile_smem's TILE and BK */
    int64_t tiles = 0, least = INT64_MAX, slices[4], deeps[4], wants[4];
    for (int j = 0; j < jobs.count; j++) {
        tile_job &J = jobs.job[j];
        J.tiles_m = CEIL_DIV(J.g.m, tile);
        J.tiles_n = CEIL_DIV(J.g.n, tile);
        tiles += J.tiles_m * J.tiles_n * J.g.batch;
        slices[j] = CEIL_DIV(J.g.k, bk);
        deeps[j] = own_deep(jobs, j, slices[j]);
        least = slices[j] < least ? slices[j] : least;
    }
    const int64_t reach = CEIL_DIV((int64_t)OWN_MIN_BLOCKS, tiles);
    int64_t cluster = 1;
    for (int j = 0; j < jobs.count; j++) {
        int64_t balance = CEIL_DIV(slices[j], least), want = reach > balance ? reach : balance;
        want = want < deeps[j] ? want : deeps[j];
        wants[j] = want < OWN_MAX_SPLITS ? want : OWN_MAX_SPLITS;
        cluster = wants[j] > cluster ? wants[j] : cluster;
    }
    if (!own_can_split())
        cluster = 1;
    int64_t blocks = 0;
    for (int j = 0; j < jobs.count; j++) {
        tile_job &J = jobs.job[j];
        J.splits = wants[j] > 1 && deeps[j] >= cluster ? (int)cluster : 1;
        J.blocks = CEIL_DIV(J.tiles_m * J.tiles_n * J.g.batch * J.splits, cluster) * cluster;
        blocks += J.blocks;
    }
    jobs.splits = (int)cluster;
    return blocks;
}

/* Whether each job's operands may be read tile_vector() elements a load:
 * their pointers, leading dimensions and batch strides are multiples of
 * that (the other dimension is contiguous). */
static void tile_vectors(tile_jobs &jobs, size_t elem)
{
    const int64_t v = tile_vector(elem);
    auto aligned = [&](const void *p, int64_t ld, int64_t stride, int64_t batch) {
        return (uintptr_t)p % (uintptr_t)(v * (int64_t)elem) == 0 && ld % v == 0 &&
               (batch == 1 || stride % v == 0);
    };
    for (int j = 0; j < jobs.count; j++) {
        tile_job &J = jobs.job[j];
        J.vec_a = aligned(J.g.A, J.g.lda, J.g.stride_a, J.g.batch);
        J.vec_b = aligned(J.g.B, J.g.ldb, J.g.stride_b, J.g.batch);
    }
}

/* The launch own_plan planned, in tiles of 16 TM. */
template <typename T, typename Acc, int TM>
static int tiled_launch(tile_jobs &jobs, int64_t blocks)
{
    if (blocks > INT32_MAX)
        return DPC_UNSUPPORTED;
    tile_vectors(jobs, sizeof(T));
    cudaLaunchAttribute cluster;
    cluster.id = cudaLaunchAttributeClusterDimension;
    cluster.val.clusterDim.x = (unsigned)jobs.splits;
    cluster.val.clusterDim.y = cluster.val.clusterDim.z = 1;
    return launch_kernel_with(&cluster, jobs.splits > 1, tiled_gemm_kernel<T, Acc, TM>, (unsigned)blocks, 256,
                              jobs.job[0].g.stream, jobs);
}

/* Which of our kernels runs the jobs: small_gemm_kernel (returns 0, s its
 * argument) for jobs that fit one block (a chain or an SGD step must:
 * with one_block, -1 when they do not), else the largest tile TM
 * (returned) that, with k split where it is deep enough, still gives the
 * GPU OWN_MIN_BLOCKS blocks; *blocks is then own_plan's launch. */
static int tiled_choice(tile_jobs &jobs, size_t acc_size, bool one_block, small_jobs &s, int64_t *blocks)
{
    if (small_plan(s, jobs, acc_size))
        return 0;
    if (one_block)   /* (dpc_linear_backward_chains or _takes_sgd said it fits) */
        return -1;
    if ((*blocks = own_plan(jobs, 4)) >= OWN_MIN_BLOCKS)
        return 4;
    if ((*blocks = own_plan(jobs, 2)) >= OWN_MIN_BLOCKS)
        return 2;
    *blocks = own_plan(jobs, 1);
    return 1;
}

template <typename T, typename Acc>
static int tiled_pick(tile_jobs &jobs, const dpc_sgd_args *sgd)
{
    small_jobs s;
    int64_t blocks = 0;
    switch (tiled_choice(jobs, sizeof(Acc), jobs.chain_at || sgd, s, &blocks)) {
    case 0:
        if (sgd)
            s.sgd = *sgd;
        return launch_kernel(small_gemm_kernel<T, Acc>, 1, GEMM_SMALL_THREADS, jobs.job[0].g.stream, s);
    case 4: return tiled_launch<T, Acc, 4>(jobs, blocks);
    case 2: return tiled_launch<T, Acc, 2>(jobs, blocks);
    case 1: return tiled_launch<T, Acc, 1>(jobs, blocks);
    default: return DPC_UNSUPPORTED;
    }
}

/* The share of k each block of our kernel sums of a Linear's forward
 * launched alone (out (m, n) = x (m, k) @ w (n, k)^T): k when no block
 * shares an element's k, 0 when the product is not our tiled or
 * one-block kernel's (cuBLASLt's).
 * The one-launch loss sums a head it takes in these shares, in rank
 * order, as tile_split_finish does (reduce.cu's ce_head_linear). */
extern "C" int64_t dpc_gemm_k_share(int dtype, int64_t m, int64_t n, int64_t k)
{
    if (m <= 0 || n <= 0 || k <= 0 || !gemm_own_fits(m, n, k, 1))
        return 0;
    tile_jobs jobs;
    memset(&jobs, 0, sizeof jobs);
    gemm_args &g = jobs.job[0].g;
    g.dtype = dtype;
    g.trans_b = 1;
    g.m = m;
    g.n = n;
    g.k = k;
    g.lda = g.ldb = k;
    g.ldc = n;
    g.batch = 1;
    jobs.count = 1;
    small_jobs s;
    int64_t blocks;
    const int tm = tiled_choice(jobs, dtype == DP_FLOAT64 ? sizeof(double) : sizeof(float), false, s, &blocks);
    const int64_t bk = tm == 4 ? 32 : 64;   /* tile_smem's BK */
    return tm <= 0 || jobs.job[0].splits == 1 ? k : CEIL_DIV(CEIL_DIV(k, bk), (int64_t)jobs.job[0].splits) * bk;
}

/* Runs the jobs (all of one dtype and stream) in one launch; with sgd (of
 * their dtype) one block that then takes the step. */
int gemm_own_run(tile_jobs &jobs, const dpc_sgd_args *sgd)
{
    switch (jobs.job[0].g.dtype) {
    case DP_FLOAT32: return tiled_pick<float, float>(jobs, sgd);
    case DP_FLOAT64: return tiled_pick<double, double>(jobs, sgd);
    case DP_BFLOAT16: return tiled_pick<__nv_bfloat16, float>(jobs, sgd);
    default: return DPC_UNSUPPORTED;
    }
}

bool gemm_own_one_block(const tile_jobs &jobs, size_t acc_size)
{
    small_jobs s;
    return small_plan(s, jobs, acc_size);
}
