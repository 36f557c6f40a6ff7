/*
 * gemm.cu — batched matrix products through cuBLASLt, behind dpc_ops.h.
 *
 * dplua's matrices are row-major and cuBLASLt's column-major. A row-major
 * m x n matrix read column-major is its n x m transpose, so C = op(A) op(B)
 * is computed as C^T = op(B)^T op(A)^T: B goes in as cuBLASLt's first
 * operand, A as its second, and m and n swap. A Linear layer's bias (one
 * value per column of C, out[i][j] += bias[j]) is then one value per row
 * of C^T, which is what CUBLASLT_EPILOGUE_BIAS adds.
 *
 * cuBLASLt is dlopen()ed on first use (see dp_cuda.h): every cublasLt*
 * function is looked up once through dpc_cublaslt_symbol() and called
 * through a pointer. One handle per device is created on first use. The
 * workspace is taken on the call's own stream for each product and given
 * back right after it: a workspace shared by the whole device would be
 * raced on by products queued on two streams at once, and memory.cu's
 * cache keeps one per stream, so that this costs no driver call. The
 * descriptors of a product and the algorithm cuBLASLt's heuristic picks
 * for it are made once per shape (a plan) and cached, so that a repeated
 * product costs one cublasLtMatmul call on the host. Products of at most
 * GEMM_OWN_FLOPS multiply-adds (and k at most OWN_MAX_K) skip cuBLASLt for
 * kernels of our own: one block for those whose operands fit its shared
 * memory (small_gemm_kernel), tiles for the rest (tiled_gemm_kernel); so
 * does a float32 Linear's forward up to STAGED_FLOPS (staged_gemm_kernel).
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <atomic>

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#ifdef DP_HAVE_CUBLASLT
#include <cublasLt.h>
#endif

#include "activation.cuh"
#include "common/dtype_conv.h"
#include "dp_cuda.h"
#include "dpc_ops.h"
#include "common/codes.h"
#include "launch.cuh"
#include "sgd.cuh"

#define CEIL_DIV(a, b) (((a) + (b) - 1) / (b))

/* Past this many blocks a grid-stride loop does the rest. */
#define DPC_MAX_BLOCKS 65536
#define GEMM_BLOCK 256
/* Devices that get a cuBLASLt handle. */
#define GEMM_MAX_DEVICES 64
/* m*n*k up to which a product is first tried without a workspace. */
#define GEMM_SMALL_FLOPS (1 << 20)

/* One product, as the caller described it (row-major). */
namespace {   /* file-local types: no clash with another file's of the same name */
struct gemm_args {
    int dtype, trans_a, trans_b, allow_tf32;
    int64_t m, n, k;
    double alpha, beta;
    const void *A, *B;
    void *bias, *C;          /* bias: read, or written by DPC_EPI_BGRAD */
    int64_t lda, ldb, ldc, stride_a, stride_b, stride_c, batch;
    cudaStream_t stream;
    int epilogue;            /* DPC_EPI_* */
    void *aux;               /* NULL, or like C (batch 1): the value before the activation */
};
}  // namespace

/* ------------------------------------------------------------------------ */
/* the epilogues without cuBLASLt                                            */
/* ------------------------------------------------------------------------ */

__device__ static inline float to_acc(float v) { return v; }
__device__ static inline double to_acc(double v) { return v; }
__device__ static inline float to_acc(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ static inline void store(float *p, float v) { *p = v; }
__device__ static inline void store(double *p, double v) { *p = v; }
__device__ static inline void store(__nv_bfloat16 *p, float v) { *p = __float2bfloat16_rn(v); }

__host__ __device__ static inline bool is_activation(int epilogue)
{
    return epilogue == DPC_EPI_RELU || epilogue == DPC_EPI_GELU || epilogue == DPC_EPI_GELU_TANH;
}

/* The epilogue's activation of v (the product with alpha, beta and the
 * bias in it), the value before it going to *aux when aux is given. The
 * activation reads v as stored in T (rounded to bfloat16 where T is),
 * which is what a Linear and then the activation's own op compute. */
template <typename T, typename Acc>
__device__ static inline Acc activate(int epilogue, Acc v, T *aux)
{
    if (!is_activation(epilogue))
        return v;
    T stored;
    store(&stored, v);
    v = to_acc(stored);
    if (aux)
        *aux = stored;
    if (epilogue == DPC_EPI_RELU)
        return v > 0 ? v : (Acc)0;   /* as the relu op: x > 0 ? x : 0 */
    return epilogue == DPC_EPI_GELU ? gelu_erf(v) : gelu_tanh(v);
}

/* C = act(beta * C + bias): used when k is 0 (the product adds nothing and
 * cuBLASLt may refuse the shape) and after a product whose epilogue
 * cuBLASLt lacks (beta 1; bias NULL when cuBLASLt added it). beta 0 writes
 * without reading C, as BLAS does, so that NaN in an uninitialised C does
 * not survive. C is (batch, m, n) with row stride ldc and batch stride
 * stride_c; bias is (n,) or NULL; Acc is the arithmetic type (float for
 * bfloat16). */
template <typename T, typename Acc>
__global__ static void scale_bias_kernel(T *C, int64_t ldc, int64_t stride_c, int64_t batch, int64_t m, int64_t n,
                                         Acc beta, const T *bias, int epilogue, T *aux)
{
    begin_after_previous_kernel();
    int64_t total = batch * m * n, stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += stride) {
        int64_t j = e % n, i = (e / n) % m, b = e / (n * m);
        T *p = C + b * stride_c + i * ldc + j;
        Acc v = beta == (Acc)0 ? (Acc)0 : beta * to_acc(*p);
        if (bias)
            v = v + to_acc(bias[j]);
        store(p, activate(epilogue, v, aux ? aux + i * ldc + j : (T *)NULL));
    }
}

template <typename T, typename Acc>
static int scale_bias_launch(const gemm_args &g, double beta, bool with_bias)
{
    int64_t total = g.batch * g.m * g.n, grid = CEIL_DIV(total, (int64_t)GEMM_BLOCK);
    if (grid > DPC_MAX_BLOCKS)
        grid = DPC_MAX_BLOCKS;
    return launch_kernel(scale_bias_kernel<T, Acc>, (unsigned)grid, GEMM_BLOCK, g.stream, (T *)g.C, g.ldc,
                         g.stride_c, g.batch, g.m, g.n, (Acc)beta,
                         with_bias && g.epilogue != DPC_EPI_BGRAD ? (const T *)g.bias : NULL, g.epilogue,
                         (T *)g.aux);
}

/* C = act(beta C + bias), the bias left out unless with_bias */
static int scale_bias(const gemm_args &g, double beta, bool with_bias = true)
{
    switch (g.dtype) {
    case DP_FLOAT32: return scale_bias_launch<float, float>(g, beta, with_bias);
    case DP_FLOAT64: return scale_bias_launch<double, double>(g, beta, with_bias);
    case DP_BFLOAT16: return scale_bias_launch<__nv_bfloat16, float>(g, beta, with_bias);
    default: return DPC_UNSUPPORTED;
    }
}

/* DPC_EPI_BGRAD's bias (m values) = the row sums of op(A) (m x k), batch 1 */
static int row_sums(const gemm_args &g)
{
    if (g.k == 0)
        return (int)cudaMemsetAsync(g.bias, 0, (size_t)g.m * dt_size(g.dtype), g.stream);
    dpc_shape s = { 1, { g.m } };
    dpc_operand out = { g.bias, { 1 } }, none = { NULL, { 0 } }, a = { (void *)g.A, { g.trans_a ? 1 : g.lda } };
    return dpc_reduce(DP_SUM, g.dtype, g.dtype, s, out, none, a, g.k, g.trans_a ? g.lda : 1, 0, g.stream);
}

/* What the epilogue adds to a product that ran without it. */
static int epilogue_after(const gemm_args &g)
{
    if (g.epilogue == DPC_EPI_BGRAD)
        return row_sums(g);
    return g.bias || is_activation(g.epilogue) ? scale_bias(g, 1.0) : 0;
}

/* ------------------------------------------------------------------------ */
/* products of our own: a tiled kernel                                       */
/* ------------------------------------------------------------------------ */

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
 * Past 16M multiply-adds cuBLASLt's GPU time wins over what its host cost
 * loses in this kernel (a Linear's forward goes to staged_gemm_kernel
 * instead), measured on the H200 with scripts/bench/gemm_tune: the MLP's
 * 256 x 784 x 256 first layer takes 10.8 us in cuBLASLt and 15.5 us in
 * ours (session 11, with vector loads), its weight gradient 7.2 and 14.4,
 * and the MLP step replayed is 55.6 us with both in cuBLASLt, 68.3 with
 * both in ours (its host time falls by only 1.5 us a step). Ours has two
 * warps a scheduler there (one block an SM) and issues an instruction
 * every 2.5 cycles (ncu); clusters of 16 for two blocks an SM were
 * slower (16.4 and 19.5 us). */
#define GEMM_OWN_FLOPS (1 << 24)
/* Up to this many, float32 products x @ w^T go to staged_gemm_kernel (below). */
#define STAGED_FLOPS (1 << 26)
/* ... split over clusters of at most this many blocks (a power of two).
 * Clusters of 8 left some of the H200's GPCs short of room for a second
 * cluster: a second wave, 15.9 us for the forward against 11.8 in
 * clusters of 4 (session 16's prototype, blocks of 512 threads and 128
 * KiB), 18.1 against 13.2 (session 17, blocks of 256 threads). */
#define STAGED_MAX_SPLITS 4
#define OWN_MAX_K 2048
/* Blocks below which a smaller tile, or a split of k, is taken (about one
 * per SM of an H100/H200; measured on the H200, fewer larger tiles were
 * slower). */
#define OWN_MIN_BLOCKS 128
/* The most blocks a split of k spreads over: the portable cluster size. */
#define OWN_MAX_SPLITS 8

/* The least number of BK-deep slices of k each block of a split takes:
 * one let the MLP's second layer (k = 256) take 32-wide tiles in 4
 * shares, 128 blocks, instead of 16-wide unsplit ones (8.6 -> 6.6 us). */
#define OWN_SHARE_SLICES 1

/* The limits above, which scripts/bench/gemm_tune varies to measure them
 * (read once from DPLUA_GEMM_OWN_FLOPS, DPLUA_GEMM_STAGED_FLOPS, DPLUA_GEMM_MAX_SPLITS, DPLUA_GEMM_STAGED_SPLITS,
 * DPLUA_GEMM_SHARE_SLICES, DPLUA_GEMM_MIN_BLOCKS and DPLUA_GEMM_TM, a
 * forced tile of 16 TM; unset: the defaults). */
static struct {
    double own_flops, staged_flops;
    int max_splits, staged_splits, share_slices, tm;
    int64_t min_blocks;
} own_limits;
static pthread_once_t own_limits_once = PTHREAD_ONCE_INIT;

static void own_limits_read(void)
{
    const char *v;
    own_limits.own_flops = (v = getenv("DPLUA_GEMM_OWN_FLOPS")) ? atof(v) : GEMM_OWN_FLOPS;
    own_limits.staged_flops = (v = getenv("DPLUA_GEMM_STAGED_FLOPS")) ? atof(v) : STAGED_FLOPS;
    own_limits.max_splits = (v = getenv("DPLUA_GEMM_MAX_SPLITS")) ? atoi(v) : OWN_MAX_SPLITS;
    if (own_limits.max_splits < 1 || own_limits.max_splits > OWN_MAX_SPLITS)
        own_limits.max_splits = OWN_MAX_SPLITS;
    own_limits.staged_splits = (v = getenv("DPLUA_GEMM_STAGED_SPLITS")) ? atoi(v) : STAGED_MAX_SPLITS;
    if (own_limits.staged_splits < 1 || own_limits.staged_splits > STAGED_MAX_SPLITS)   /* (staged_finish's bound) */
        own_limits.staged_splits = STAGED_MAX_SPLITS;
    own_limits.share_slices = (v = getenv("DPLUA_GEMM_SHARE_SLICES")) ? atoi(v) : OWN_SHARE_SLICES;
    if (own_limits.share_slices < 1)
        own_limits.share_slices = OWN_SHARE_SLICES;
    own_limits.min_blocks = (v = getenv("DPLUA_GEMM_MIN_BLOCKS")) ? atoll(v) : OWN_MIN_BLOCKS;
    if (own_limits.min_blocks < 1)
        own_limits.min_blocks = OWN_MIN_BLOCKS;
    own_limits.tm = (v = getenv("DPLUA_GEMM_TM")) ? atoi(v) : 0;
    if (own_limits.tm != 1 && own_limits.tm != 2 && own_limits.tm != 4)
        own_limits.tm = 0;   /* not forced */
}

namespace {   /* file-local types: no clash with another file's of the same name */
struct tile_job {
    gemm_args g;
    const void *mask;        /* NULL, or like C (ldc, batch 1): C is 0 where !(mask > 0) */
    /* set by own_plan (or staged_plan): the job's tiles, its blocks (whole
     * clusters) and how many of them share each tile's k (1, or the
     * cluster's size) */
    int64_t tiles_m, tiles_n, blocks;
    int splits;
    bool vec_a, vec_b;       /* set by tile_vectors: op(A), op(B) are read tile_vector() elements a load */
};
struct tile_jobs {
    tile_job job[4];         /* a Linear's dx and dw; two Linears' in a chain */
    int count;
    int splits;              /* the blocks of a cluster: 1 when no job splits its tiles' k */
    int chain_at;            /* 0, or the first job that reads what the jobs before it wrote: then one block
                              * runs them all (small_gemm_kernel) */
};
}  // namespace

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
 * release waited for the block's stores to C to drain (session 18: with
 * it relaxed and tile_split_finish's loads at once, the MLP step replayed
 * 1.6 us shorter). */
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
 * of SMALL_THREADS instead stages every operand at once (one global
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
#define SMALL_THREADS 512
#define SMALL_OUTPUTS 4
#define SMALL_BYTES (32 * 1024)
/* at most 256 multiply-adds a thread, a few hundred cycles of FMAs */
#define SMALL_MACS (SMALL_THREADS * 256)

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
        const int e = (int)threadIdx.x + u * SMALL_THREADS;
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
    for (int e = (int)threadIdx.x + SMALL_EARLY * SMALL_THREADS; e < b.total; e += SMALL_THREADS) {
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
    for (int o = (int)threadIdx.x + SMALL_THREADS; has; o += SMALL_THREADS) {
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
    for (int i = (int)threadIdx.x; i < a.n; i += SMALL_THREADS) {
        Acc b = b0;
        const Acc p = sgd_element(p0, to_acc(G[i]), B != NULL, &b, c);
        if (B)
            sgd_store(B + i, b);
        sgd_store(P + i, p);
        if (i + SMALL_THREADS < a.n)
            small_sgd_load<T>(a, i + SMALL_THREADS, p0, b0);
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
__global__ static void __launch_bounds__(SMALL_THREADS) small_gemm_kernel(const __grid_constant__ small_jobs params)
{
    let_next_kernel_start();
    __shared__ __align__(16) Acc sm[SMALL_BYTES / sizeof(Acc)];
    __shared__ __align__(16) small_jobs s;
    static_assert(sizeof s % sizeof(int) == 0 && sizeof s / sizeof(int) <= SMALL_THREADS, "one word a thread");
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
        const int64_t most = SMALL_THREADS * SMALL_OUTPUTS;   /* bounds each factor before any product */
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

/* Whether the bytes [a, a + a_bytes) and [b, b + b_bytes) overlap. */
static bool overlap(const void *a, int64_t a_bytes, const void *b, int64_t b_bytes)
{
    const char *x = (const char *)a, *y = (const char *)b;
    return a_bytes > 0 && b_bytes > 0 && x < y + b_bytes && y < x + a_bytes;
}

/* Whether a first-part job writes any memory the stage reads. */
static bool stage_reads_output(const small_stage &S, const gemm_args &g)
{
    const int64_t es = (int64_t)dt_size(g.dtype);
    const int64_t read = S.count ? ((S.count / S.inner - 1) * S.ld + S.inner) * es : 0;
    const int64_t written = ((g.m - 1) * g.ldc + g.n) * es;
    return overlap(S.src, read, g.C, written) || (g.aux && overlap(S.src, read, g.aux, written)) ||
           (g.epilogue == DPC_EPI_BGRAD && g.bias && overlap(S.src, read, g.bias, g.m * es));
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
static bool own_fits(int64_t m, int64_t n, int64_t k, int64_t batch)
{
    pthread_once(&own_limits_once, own_limits_read);
    return k <= OWN_MAX_K && (double)m * (double)n * (double)k * (double)batch <= own_limits.own_flops;
}

extern "C" int dpc_gemm_own(int64_t m, int64_t n, int64_t k, int64_t batch)
{
    return own_fits(m, n, k, batch);
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
    return unsplit ? 1 : slices / own_limits.share_slices;
}

/* Each job's tiles of 16 TM and how many blocks share each tile's k (k in
 * slices of BK, each share at least OWN_SHARE_SLICES slices deep): enough
 * for the launch to reach OWN_MIN_BLOCKS blocks (own_limits.min_blocks),
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
    const int64_t reach = CEIL_DIV(own_limits.min_blocks, tiles);
    int64_t cluster = 1;
    for (int j = 0; j < jobs.count; j++) {
        int64_t balance = CEIL_DIV(slices[j], least), want = reach > balance ? reach : balance;
        want = want < deeps[j] ? want : deeps[j];
        wants[j] = want < own_limits.max_splits ? want : own_limits.max_splits;
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
 * GPU OWN_MIN_BLOCKS blocks (or the tile DPLUA_GEMM_TM forces); *blocks
 * is then own_plan's launch. */
static int tiled_choice(tile_jobs &jobs, size_t acc_size, bool one_block, small_jobs &s, int64_t *blocks)
{
    const int tm = own_limits.tm;
    if ((tm == 0 || one_block) && small_plan(s, jobs, acc_size))
        return 0;
    if (one_block)   /* (dpc_linear_backward_chains or _takes_sgd said it fits) */
        return -1;
    if ((tm == 0 || tm == 4) && ((*blocks = own_plan(jobs, 4)) >= own_limits.min_blocks || tm == 4))
        return 4;
    if ((tm == 0 || tm == 2) && ((*blocks = own_plan(jobs, 2)) >= own_limits.min_blocks || tm == 2))
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
        return launch_kernel(small_gemm_kernel<T, Acc>, 1, SMALL_THREADS, jobs.job[0].g.stream, s);
    case 4: return tiled_launch<T, Acc, 4>(jobs, blocks);
    case 2: return tiled_launch<T, Acc, 2>(jobs, blocks);
    case 1: return tiled_launch<T, Acc, 1>(jobs, blocks);
    default: return DPC_UNSUPPORTED;
    }
}

/* The share of k each block of our kernel sums of a Linear's forward
 * launched alone (out (m, n) = x (m, k) @ w (n, k)^T): k when no block
 * shares an element's k, 0 when the product is not our tiled or
 * one-block kernel's (cuBLASLt's, or the staged kernel's past 16M).
 * The one-launch loss sums a head it takes in these shares, in rank
 * order, as tile_split_finish does (reduce.cu's ce_head_linear). */
extern "C" int64_t dpc_gemm_k_share(int dtype, int64_t m, int64_t n, int64_t k)
{
    if (m <= 0 || n <= 0 || k <= 0 || !own_fits(m, n, k, 1))
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
static int tiled_gemm(tile_jobs &jobs, const dpc_sgd_args *sgd = NULL)
{
    pthread_once(&own_limits_once, own_limits_read);
    switch (jobs.job[0].g.dtype) {
    case DP_FLOAT32: return tiled_pick<float, float>(jobs, sgd);
    case DP_FLOAT64: return tiled_pick<double, double>(jobs, sgd);
    case DP_BFLOAT16: return tiled_pick<__nv_bfloat16, float>(jobs, sgd);
    default: return DPC_UNSUPPORTED;
    }
}

/* ------------------------------------------------------------------------ */
/* a Linear's forward of medium size: each block stages its share of k      */
/* ------------------------------------------------------------------------ */

/* Past GEMM_OWN_FLOPS a product went to cuBLASLt, whose call costs the
 * host 12-19 us (two launches, a split of k and its reduction, and the
 * library's own work) against about 5 for a launch of ours: the MLP's
 * first layer (256 x 784 -> 256) made an eager step bound by the host
 * whenever the host was slower than usual. tiled_gemm_kernel is 4 us
 * slower than cuBLASLt there (its slices wait on their loads one after
 * another, two warps a scheduler). Here a block of four k-groups of 64
 * threads copies its whole share of k of both operands into shared
 * memory at once with cp.async (one latency for all of it, no register
 * staging), then each group multiplies a quarter of it, 8 x 8 outputs a
 * thread, each operand read 16 bytes (4 of k) a load; the groups' sums
 * are added in order and, where k is split, over a cluster in rank order
 * (staged_finish).
 *
 * Measured on the H200 (session 16): the first layer's forward 11.9 us in
 * a graph against cuBLASLt's 10.8, and the eager MLP step 55.2-55.9 us on
 * a noisy host against 55.4-72.9 with cuBLASLt (replayed 52.4 -> 54.4).
 * Session 17 (8 x 8 a thread, four groups, staged_finish): 11.8-12.1 us
 * alone, the MLP step replayed 0.3-1.0 us shorter.
 * Only products whose operands are both contiguous along k (x @ w^T)
 * come here: the weight gradient's layout (both contiguous along their
 * rows) took 9.8 us against cuBLASLt's 7.1 and made the step slower
 * (59.0 eager, 56.9 replayed); in session 18 four versions of its own
 * (8 x 8 in k-groups, 4 x 4 without, its rows landing in stages) took
 * 10.9-11.3 us, the step replayed 57.4-60.6 against 53.9. float32 only,
 * from 16-byte aligned operands; anything else goes where it went
 * before. */
#define STAGED_TILE 64
/* A thread's outputs: STAGED_RUN x STAGED_RUN of the tile, so that a
 * k-group is (STAGED_TILE / STAGED_RUN)^2 threads. 8 x 8 reads half the
 * shared memory a multiply-add that 4 x 4 did, in half the loads (session
 * 17, ncu on the MLP's first layer: 3.4M warp instructions with 4 x 4, of
 * them 1.6M the multiply-adds; 2.6M with 8 x 8, where the copies, the
 * groups' sums and the cluster's took 40% of the samples). */
#define STAGED_RUN 8
#define STAGED_SIDE (STAGED_TILE / STAGED_RUN)
#define STAGED_GROUP_THREADS (STAGED_SIDE * STAGED_SIDE)
#define STAGED_GROUPS 4
#define STAGED_THREADS (STAGED_GROUP_THREADS * STAGED_GROUPS)
#define STAGED_MIN_BLOCKS 128
/* the least k a k-group multiplies where k is split further */
#define STAGED_MIN_DEPTH 16
/* shared memory a block may ask for, where the device allows it (a share
 * of k up to 316 along both operands) */
#define STAGED_MAX_SMEM (160 * 1024)

namespace {   /* file-local types: no clash with another file's of the same name */
struct staged_job {
    tile_job job;   /* tiles_m, tiles_n and splits set; no mask */
    int share;      /* the k of one split: a multiple of 4 */
};
}  // namespace

/* 16 bytes from global src (of which `bytes`, the rest zero) to shared dst */
__device__ static inline void copy_async16(void *dst, const void *src, int bytes)
{
#if __CUDA_ARCH__ >= 800
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(bytes) : "memory");
#else
    __trap();   /* the host stages only on devices with clusters (sm_90) */
#endif
}

__device__ static inline void copies_async_wait(void)
{
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;\n" ::: "memory");
#endif
}

/* An operand is staged as 64 rows of staged_ld(share) floats: an odd
 * number of 16-byte groups, so that the 8 rows of B a quarter warp reads
 * at once fall in 8 different bank groups (of A it reads one row). */
__host__ __device__ constexpr int staged_ld(int share)
{
    return (share / 4 | 1) * 4;
}

/* Copies rows r0 .. r0 + 63 (r < rows) of X (X[r * ld + k]), k from k0 to
 * kend, into S, zeros past the ends, 16 bytes a copy: STAGED_COPY_LANES
 * threads along a row (its k in at most two passes), the block's rows
 * STAGED_THREADS / STAGED_COPY_LANES apart, so that a thread's copies of
 * a pass differ only in their row. */
#define STAGED_COPY_LANES 64
__device__ static void staged_copy(float *S, const float *X, int64_t ld, int64_t r0, int64_t rows, int64_t k0,
                                   int64_t kend, int share)
{
    constexpr int ROW_STEP = STAGED_THREADS / STAGED_COPY_LANES;
    const int quads = share / 4, ldk = staged_ld(share), r_first = (int)threadIdx.x / STAGED_COPY_LANES;
    for (int q = (int)threadIdx.x % STAGED_COPY_LANES; q < quads; q += STAGED_COPY_LANES) {
        const int64_t k = k0 + 4 * q, left = kend - k;
        const int k_bytes = left > 0 ? (left >= 4 ? 16 : (int)left * 4) : 0;
        const float *src = X + (r0 + r_first) * ld + k;
        float *dst = S + r_first * ldk + 4 * q;
#pragma unroll 4
        for (int r = r_first; r < STAGED_TILE; r += ROW_STEP, src += ROW_STEP * ld, dst += ROW_STEP * ldk) {
            const int bytes = r0 + r < rows ? k_bytes : 0;
            copy_async16(dst, bytes ? src : X, bytes);
        }
    }
}

/* v[r] = k 4 kq .. 4 kq + 3 of row tr + STAGED_SIDE r of the staged
 * operand: a quarter warp's 8 rows one apart, in 8 bank groups */
__device__ static inline void staged_quad(const float *S, int ldk, int tr, int kq, float4 (&v)[STAGED_RUN])
{
#pragma unroll
    for (int r = 0; r < STAGED_RUN; r++)
        v[r] = *reinterpret_cast<const float4 *>(S + (tr + STAGED_SIDE * r) * ldk + 4 * kq);
}

/* The tile's elements from the groups' sums (sums: the block's, as
 * staged_gemm_kernel leaves them), added over the cluster's blocks in
 * rank order (split k) and each block's groups in order, through the
 * epilogue into C: each block takes every splits-th 256 runs of 4
 * columns (a thread one), 16 bytes from each group of each block. */
__device__ static void staged_finish(const tile_job &J, float *C, int64_t i0, int64_t j0, float *sums)
{
    constexpr int ELEMS = STAGED_TILE * STAGED_TILE;
    auto finish = [&](int rank, int splits, auto sums_of) {
        for (int f = 4 * (rank * STAGED_THREADS + (int)threadIdx.x); f < ELEMS; f += 4 * STAGED_THREADS * splits) {
            /* f is output (r, c) of thread (tx, ty) of a group, the 3 after it those of tx + 1 .. tx + 3 */
            const int ft = f % STAGED_GROUP_THREADS, rc = f / STAGED_GROUP_THREADS;
            const int64_t i = i0 + ft / STAGED_SIDE + STAGED_SIDE * (rc / STAGED_RUN),
                          j = j0 + ft % STAGED_SIDE + STAGED_SIDE * (rc % STAGED_RUN);
            if (i >= J.g.m || j >= J.g.n)
                continue;   /* (loaded only where stored: cluster_leave) */
            /* every load first, then the sums: one latency of the other blocks' shared memory */
            float4 u[STAGED_MAX_SPLITS][STAGED_GROUPS];
#pragma unroll
            for (int s = 0; s < STAGED_MAX_SPLITS; s++)
#pragma unroll
                for (int gr = 0; gr < STAGED_GROUPS; gr++)
                    u[s][gr] = s < splits ? *reinterpret_cast<const float4 *>(sums_of(s) + gr * ELEMS + f)
                                          : make_float4(0, 0, 0, 0);
            float4 v = make_float4(0, 0, 0, 0);
#pragma unroll
            for (int s = 0; s < STAGED_MAX_SPLITS; s++)
#pragma unroll
                for (int gr = 0; gr < STAGED_GROUPS; gr++)
                    if (s < splits) {
                        v.x += u[s][gr].x;
                        v.y += u[s][gr].y;
                        v.z += u[s][gr].z;
                        v.w += u[s][gr].w;
                    }
            const float out[4] = { v.x, v.y, v.z, v.w };
#pragma unroll
            for (int e = 0; e < 4; e++)
                if (j + e < J.g.n)
                    tile_finish(J, C, i, j + e, out[e], epilogue_load<float, float>(J, i, j + e));
        }
    };
    if (J.splits == 1) {
        __syncthreads();
        finish(0, 1, [&](int) { return (const float *)sums; });
        return;
    }
#if __CUDA_ARCH__ >= 900
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    cluster.sync();   /* every block's sums are in its shared memory */
    finish((int)cluster.block_rank(), (int)cluster.num_blocks(),
           [&](int s) { return (const float *)cluster.map_shared_rank(sums, s); });
    cluster_leave();
#else
    __trap();   /* the host splits only on devices with clusters (own_can_split) */
#endif
}

/* C = op(A) op(B) with op(A) = A (m x k) and op(B) = B^T (B n x k), both
 * contiguous along k; block b is split b % splits of tile b / splits.
 * Thread (tx, ty) of a k-group computes rows ty + STAGED_SIDE r, columns
 * tx + STAGED_SIDE c. */
__global__ static void __launch_bounds__(STAGED_THREADS) staged_gemm_kernel(const __grid_constant__ staged_job s)
{
    let_next_kernel_start();
    extern __shared__ __align__(16) float staged_smem[];
    const tile_job &J = s.job;
    const gemm_args &g = J.g;
    /* (32-bit: staged_plan keeps the blocks under 2^31) */
    const int tiles_n = (int)J.tiles_n, tiles_m = (int)J.tiles_m;
    const int split = (int)blockIdx.x % J.splits, tile = (int)blockIdx.x / J.splits;
    const int64_t i0 = (int64_t)(tile / tiles_n % tiles_m) * STAGED_TILE, j0 = (int64_t)(tile % tiles_n) * STAGED_TILE;
    const int64_t b = tile / tiles_n / tiles_m;
    const int64_t k0 = (int64_t)split * s.share, kend = g.k < k0 + s.share ? g.k : k0 + s.share;
    const int share = s.share, quads = share / 4, ldk = staged_ld(share);
    float *As = staged_smem, *Bs = staged_smem + STAGED_TILE * ldk;
    const float *A = (const float *)g.A + b * g.stride_a, *B = (const float *)g.B + b * g.stride_b;
    const int t = (int)threadIdx.x % STAGED_GROUP_THREADS, group = (int)threadIdx.x / STAGED_GROUP_THREADS;
    const int tx = t % STAGED_SIDE, ty = t / STAGED_SIDE;
    wait_for_previous_kernel();
    staged_copy(As, A, g.lda, i0, g.m, k0, kend, share);
    staged_copy(Bs, B, g.ldb, j0, g.n, k0, kend, share);
    copies_async_wait();
    __syncthreads();
    /* this group's part of the share; past k (zeros) skipped */
    const int live = kend > k0 ? (int)((kend - k0 + 3) / 4) : 0;
    const int q0 = quads * group / STAGED_GROUPS, q1_part = quads * (group + 1) / STAGED_GROUPS;
    const int q1 = q1_part < live ? q1_part : live;
    float acc[STAGED_RUN][STAGED_RUN] = {};
#pragma unroll 2
    for (int kq = q0; kq < q1; kq++) {
        float4 av[STAGED_RUN], bv[STAGED_RUN];
        staged_quad(As, ldk, ty, kq, av);
        staged_quad(Bs, ldk, tx, kq, bv);
        auto multiply = [&](auto pick) {
#pragma unroll
            for (int r = 0; r < STAGED_RUN; r++)
#pragma unroll
                for (int c = 0; c < STAGED_RUN; c++)
                    acc[r][c] += pick(av[r]) * pick(bv[c]);
        };
        multiply([](const float4 &v) { return v.x; });
        multiply([](const float4 &v) { return v.y; });
        multiply([](const float4 &v) { return v.z; });
        multiply([](const float4 &v) { return v.w; });
    }
    /* Each group leaves its sums in the operands' space, a thread's
     * outputs STAGED_GROUP_THREADS apart (the lanes of a warp on 32 banks,
     * and 4 columns of a row side by side); then each block of the cluster
     * (one, unsplit) adds 1 / splits of the tile (staged_finish). */
    __syncthreads();   /* every group is done with the operands */
#pragma unroll
    for (int r = 0; r < STAGED_RUN; r++)
#pragma unroll
        for (int c = 0; c < STAGED_RUN; c++)
            staged_smem[(group * STAGED_RUN * STAGED_RUN + r * STAGED_RUN + c) * STAGED_GROUP_THREADS + t] = acc[r][c];
    staged_finish(J, (float *)g.C + b * g.stride_c, i0, j0, staged_smem);
}

/* The most dynamic shared memory staged_gemm_kernel may have on the
 * current device: the device's opt-in limit (99 KiB on some, 227 on the
 * H200), at most STAGED_MAX_SMEM; asked and granted to the kernel once
 * per device. */
static size_t staged_smem_limit(void)
{
    static std::atomic<int> known[GEMM_MAX_DEVICES];   /* 0: not asked yet, else the limit + 1 */
    int device;
    if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= GEMM_MAX_DEVICES) {
        (void)cudaGetLastError();
        return 0;
    }
    int v = known[device].load(std::memory_order_relaxed);
    if (v == 0) {
        int limit = 48 * 1024;   /* what every kernel may have without asking */
        int optin = 0;
        if (cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) == cudaSuccess) {
            optin = optin < STAGED_MAX_SMEM ? optin : STAGED_MAX_SMEM;
            if (optin > limit && cudaFuncSetAttribute(staged_gemm_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                      optin) == cudaSuccess)
                limit = optin;
        }
        (void)cudaGetLastError();   /* a refusal above is an answer, not an error for the next call to find */
        v = limit + 1;
        known[device].store(v, std::memory_order_relaxed);
    }
    return (size_t)(v - 1);
}

/* Whether the staged kernel takes g, and its plan: a float32 product of
 * operands contiguous along k and aligned for 16-byte copies, past our
 * other kernels' size and within STAGED_FLOPS, at least half a tile in
 * each dimension (a narrower one would waste most of every block), whose
 * share of k fits the device's shared memory. */
static bool staged_plan(staged_job &s, const gemm_args &g, size_t *smem)
{
    pthread_once(&own_limits_once, own_limits_read);
    const double flops = (double)g.m * (double)g.n * (double)g.k * (double)g.batch;
    if (g.dtype != DP_FLOAT32 || g.trans_a || !g.trans_b || g.allow_tf32 || g.epilogue == DPC_EPI_BGRAD ||
        g.k <= 0 || g.m < STAGED_TILE / 2 || g.n < STAGED_TILE / 2 || flops > own_limits.staged_flops ||
        !own_can_split())
        return false;
    auto aligned = [](const void *p, int64_t ld, int64_t stride, int64_t batch) {
        return (uintptr_t)p % 16 == 0 && ld % 4 == 0 && (batch == 1 || stride % 4 == 0);
    };
    if (!aligned(g.A, g.lda, g.stride_a, g.batch) || !aligned(g.B, g.ldb, g.stride_b, g.batch))
        return false;
    memset(&s, 0, sizeof s);
    tile_job &J = s.job;
    J.g = g;
    J.tiles_m = CEIL_DIV(g.m, (int64_t)STAGED_TILE);
    J.tiles_n = CEIL_DIV(g.n, (int64_t)STAGED_TILE);
    const int64_t tiles = J.tiles_m * J.tiles_n * g.batch;
    int splits = 1;
    while (splits * 2 <= own_limits.staged_splits && tiles * splits < STAGED_MIN_BLOCKS &&
           g.k >= (int64_t)splits * 2 * STAGED_GROUPS * STAGED_MIN_DEPTH)
        splits *= 2;
    const int64_t share = CEIL_DIV(CEIL_DIV(g.k, (int64_t)splits), (int64_t)4) * 4;
    /* (a share past STAGED_MAX_SMEM floats could never fit: a bound for the int below) */
    if (share > STAGED_MAX_SMEM || tiles * splits > INT32_MAX)
        return false;
    /* the operands, or later the groups' sums */
    const int64_t floats = 2 * STAGED_TILE * staged_ld((int)share), least = STAGED_GROUPS * STAGED_TILE * STAGED_TILE;
    *smem = (size_t)(floats > least ? floats : least) * sizeof(float);
    if (*smem > staged_smem_limit())
        return false;
    J.splits = splits;
    J.blocks = tiles * splits;
    s.share = (int)share;
    return true;
}

/* Products the staged kernel was launched for (dpc_gemm_staged_launches) */
static std::atomic<int64_t> staged_launches{ 0 };

extern "C" int64_t dpc_gemm_staged_launches(void)
{
    return staged_launches.load(std::memory_order_relaxed);
}

/* The launch staged_plan planned. */
static int staged_launch(const staged_job &s, size_t smem)
{
    cudaLaunchAttribute cluster;
    cluster.id = cudaLaunchAttributeClusterDimension;
    cluster.val.clusterDim.x = (unsigned)s.job.splits;
    cluster.val.clusterDim.y = cluster.val.clusterDim.z = 1;
    const int rc = launch_kernel_smem(&cluster, s.job.splits > 1, smem, staged_gemm_kernel, (unsigned)s.job.blocks,
                                      STAGED_THREADS, s.job.g.stream, s);
    if (rc == 0)
        staged_launches.fetch_add(1, std::memory_order_relaxed);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* a Linear layer's backward                                                 */
/* ------------------------------------------------------------------------ */

/* Whether a layer's products are ours to run. */
static bool layer_is_ours(const dpc_linear_grads &L)
{
    /* dx's k is N, dw's is M; a bias gradient alone is a reduction */
    return L.M > 0 && L.N > 0 && L.K > 0 && own_fits(L.M, L.K, L.N, 1) && own_fits(L.N, L.K, L.M, 1) &&
           !(L.db && !L.dw);
}

static void add_layer_jobs(tile_jobs &jobs, int dtype, const dpc_linear_grads &L, cudaStream_t s)
{
    const int64_t M = L.M, N = L.N, K = L.K;
    if (L.dx) {   /* dx (M, K) = g (M, N) @ w (N, K), masked */
        jobs.job[jobs.count].g = gemm_args{ dtype, 0, 0, 0, M, K, N, 1.0, 0.0, L.g, L.w, NULL, L.dx, N, K, K, 0, 0, 0, 1,
                                            s, DPC_EPI_BIAS };
        jobs.job[jobs.count++].mask = L.mask;
    }
    if (L.dw)   /* dw (N, K) = g^T (N, M) @ x (M, K); db = the row sums of g^T */
        jobs.job[jobs.count++].g = gemm_args{ dtype, 1, 0, 0, N, K, M, 1.0, 0.0, L.g, L.x, L.db, L.dw, N, K, K, 0, 0, 0,
                                              1, s, L.db ? DPC_EPI_BGRAD : DPC_EPI_BIAS };
}

/* The products of one layer, or of two in a chain (the second reading
 * the first's dx). */
static void layers_jobs(tile_jobs &jobs, int dtype, const dpc_linear_grads *layer, int layers, cudaStream_t s)
{
    memset(&jobs, 0, sizeof jobs);
    add_layer_jobs(jobs, dtype, layer[0], s);
    if (layers == 2) {
        jobs.chain_at = jobs.count;
        add_layer_jobs(jobs, dtype, layer[1], s);
    }
}

/* Whether the layers' products fit one block of small_gemm_kernel, the
 * layers in turn (a chain when two), whatever the dtype: planned for
 * 8-byte elements, the most any takes. */
static bool layers_fit_one_block(const dpc_linear_grads *layer, int layers)
{
    tile_jobs jobs;
    layers_jobs(jobs, DP_FLOAT64, layer, layers, NULL);
    small_jobs s;
    return small_plan(s, jobs, sizeof(double));
}

extern "C" int dpc_linear_backward_chains(const dpc_linear_grads *layer)
{
    const dpc_linear_grads &a = layer[0], &b = layer[1];
    return layer_is_ours(a) && layer_is_ours(b) && a.dx && b.g == a.dx && b.M == a.M && b.N == a.K &&
           layers_fit_one_block(layer, 2);
}

extern "C" int dpc_linear_backward_may_chain(const dpc_linear_grads *first)
{
    return layer_is_ours(*first) && first->dx && layers_fit_one_block(first, 1);
}

/* An SGD step after the products, in their one block: of this many
 * elements at most (8 a thread), a few hundred cycles; a larger step is
 * better spread over the GPU (optim.cu). */
#define SMALL_SGD_MAX (SMALL_THREADS * 8)

/* Whether the step's parameters or momentum overlap an output of the
 * layers (each thread loads its first ones before the products). */
static bool sgd_overlaps_outputs(int dtype, const dpc_linear_grads *layer, int layers, const dpc_sgd_args &a)
{
    const int64_t es = (int64_t)dt_size(dtype), bytes = a.n * es;
    for (int l = 0; l < layers; l++) {
        const dpc_linear_grads &L = layer[l];
        const void *out[3] = { L.dx, L.dw, L.db };
        const int64_t out_bytes[3] = { L.M * L.K * es, L.N * L.K * es, L.N * es };
        for (int o = 0; o < 3; o++)
            if (out[o] && (overlap(a.param, bytes, out[o], out_bytes[o]) ||
                           (a.momentum_buf && overlap(a.momentum_buf, bytes, out[o], out_bytes[o]))))
                return true;
    }
    return false;
}

extern "C" int dpc_linear_backward_takes_sgd(int dtype, const dpc_linear_grads *layer, int layers,
                                             const dpc_sgd_args *sgd)
{
    if (sgd->n <= 0 || sgd->n > SMALL_SGD_MAX || !sgd->param || !sgd->grad ||
        sgd_overlaps_outputs(dtype, layer, layers, *sgd))
        return 0;
    if (layers == 2)
        return dpc_linear_backward_chains(layer);
    return layers == 1 && layer_is_ours(layer[0]) && (layer[0].dx || layer[0].dw) && layers_fit_one_block(layer, 1);
}

extern "C" int dpc_linear_backward(int dtype, const dpc_linear_grads *layer, int layers, const dpc_sgd_args *sgd,
                                   void *stream)
{
    for (int l = 0; l < layers; l++)
        if (layer[l].M < 0 || layer[l].N < 0 || layer[l].K < 0)
            return (int)cudaErrorInvalidValue;
    if (dtype != DP_FLOAT32 && dtype != DP_FLOAT64 && dtype != DP_BFLOAT16)
        return DPC_UNSUPPORTED;
    if (layers == 2 ? !dpc_linear_backward_chains(layer) : layers != 1 || !layer_is_ours(layer[0]))
        return DPC_UNSUPPORTED;
    if (sgd && !dpc_linear_backward_takes_sgd(dtype, layer, layers, sgd))
        return DPC_UNSUPPORTED;
    tile_jobs jobs;
    layers_jobs(jobs, dtype, layer, layers, (cudaStream_t)stream);
    return jobs.count ? tiled_gemm(jobs, sgd) : 0;
}

#ifdef DP_HAVE_CUBLASLT
/* ------------------------------------------------------------------------ */
/* cuBLASLt, looked up once                                                  */
/* ------------------------------------------------------------------------ */

/* Each X(Name) is the function cublasLtName, called as lt.Name(...). */
#define LT_FUNCS(X)                                                                             \
    X(Create) X(MatmulDescCreate) X(MatmulDescDestroy) X(MatmulDescSetAttribute)                \
    X(MatrixLayoutCreate) X(MatrixLayoutDestroy) X(MatrixLayoutSetAttribute)                    \
    X(MatmulPreferenceCreate) X(MatmulPreferenceDestroy) X(MatmulPreferenceSetAttribute)        \
    X(MatmulAlgoGetHeuristic) X(Matmul)

static struct {
#define LT_FIELD(name) decltype(&cublasLt##name) name;
    LT_FUNCS(LT_FIELD)
#undef LT_FIELD
    int ok;
} lt;

static pthread_once_t lt_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t lt_mutex = PTHREAD_MUTEX_INITIALIZER;
static cublasLtHandle_t lt_handles[GEMM_MAX_DEVICES];   /* under lt_mutex */

static void lt_load(void)
{
#define LT_LOAD(name)                                                                          \
    if ((lt.name = (decltype(&cublasLt##name))dpc_cublaslt_symbol("cublasLt" #name, NULL)) == NULL) \
        return;
    LT_FUNCS(LT_LOAD)
#undef LT_LOAD
    lt.ok = 1;
}

/* cuBLAS statuses in the words of dpc_ops.h: a cudaError_t, or
 * DPC_UNSUPPORTED for what cuBLASLt cannot do. */
static int lt_status(cublasStatus_t st)
{
    switch (st) {
    case CUBLAS_STATUS_SUCCESS: return 0;
    case CUBLAS_STATUS_NOT_SUPPORTED: return DPC_UNSUPPORTED;
    case CUBLAS_STATUS_ALLOC_FAILED: return (int)cudaErrorMemoryAllocation;
    case CUBLAS_STATUS_INVALID_VALUE: return (int)cudaErrorInvalidValue;
    case CUBLAS_STATUS_ARCH_MISMATCH: return (int)cudaErrorNoKernelImageForDevice;
    case CUBLAS_STATUS_NOT_INITIALIZED: return (int)cudaErrorInitializationError;
    case CUBLAS_STATUS_EXECUTION_FAILED: return (int)cudaErrorLaunchFailure;
    default: return (int)cudaErrorUnknown;
    }
}

static int lt_handle(int device, cublasLtHandle_t *handle)
{
    int st = 0;
    if (device < 0 || device >= GEMM_MAX_DEVICES)
        return DPC_UNSUPPORTED;
    pthread_mutex_lock(&lt_mutex);
    if (lt_handles[device] == NULL)
        st = lt_status(lt.Create(&lt_handles[device]));
    *handle = lt_handles[device];
    pthread_mutex_unlock(&lt_mutex);
    return st;
}

/* ------------------------------------------------------------------------ */
/* the plan cache                                                            */
/* ------------------------------------------------------------------------ */

/* Everything cuBLASLt's heuristic is told about a product; products with
 * equal keys share a plan. Compared with memcmp, so always zeroed before
 * it is filled. */
namespace {   /* file-local types: no clash with another file's of the same name */
struct algo_key {
    int64_t device, dtype, tf32, trans_a, trans_b, m, n, k, lda, ldb, ldc;
    int64_t stride_a, stride_b, stride_c, batch, epilogue;
    int64_t align_a, align_b, align_c, align_bias, align_aux, workspace;
};

/* A product's descriptors and the algorithm the heuristic chose for them,
 * or (ok 0) the heuristic's "none": what is costly about a product on the
 * host, made once per shape. Only the bias pointer changes from call to
 * call. */
struct lt_plan {
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t a = NULL, b = NULL, c = NULL;
    cublasLtMatmulAlgo_t algo;
    int ok = 0;
    lt_plan() = default;   /* no destructor: the cache lives until exit */
    lt_plan(const lt_plan &) = delete;
    lt_plan &operator=(const lt_plan &) = delete;
    void clear()
    {
        if (c) lt.MatrixLayoutDestroy(c);
        if (b) lt.MatrixLayoutDestroy(b);
        if (a) lt.MatrixLayoutDestroy(a);
        if (op) lt.MatmulDescDestroy(op);
        op = NULL;
        a = b = c = NULL;
        ok = 0;
    }
};
}  // namespace

#define PLAN_CACHE_SIZE 256
/* Direct-mapped. Held under lt_mutex from lookup to the end of the
 * product's launch, since the bias pointer is set on the shared
 * descriptor. */
static struct {
    int used;
    algo_key key;
    lt_plan plan;
} plan_cache[PLAN_CACHE_SIZE];

static unsigned plan_slot(const algo_key *key)
{
    const unsigned char *p = (const unsigned char *)key;
    uint32_t h = 2166136261u;   /* FNV-1a */
    for (size_t i = 0; i < sizeof *key; i++)
        h = (h ^ p[i]) * 16777619u;
    return h % PLAN_CACHE_SIZE;
}

/* ------------------------------------------------------------------------ */
/* one product                                                               */
/* ------------------------------------------------------------------------ */

static cudaDataType_t lt_type(int dtype)
{
    return dtype == DP_FLOAT64 ? CUDA_R_64F : dtype == DP_BFLOAT16 ? CUDA_R_16BF : CUDA_R_32F;
}

/* The alignment cuBLASLt may assume for a matrix: that of its pointer and,
 * when there are several batch entries, of every entry's, up to 256. */
static uint32_t alignment(const void *p, int64_t stride, int64_t batch, size_t es)
{
    uint64_t bits = (uint64_t)(uintptr_t)p | 256u;
    if (batch > 1)
        bits |= (uint64_t)stride * es;
    return (uint32_t)(bits & (~bits + 1));   /* the lowest set bit */
}

/* A column-major rows x cols layout (a stored matrix, before its op). With
 * one column the leading dimension is never used, and a row-major caller
 * may pass anything there for a single row; cuBLASLt wants ld >= rows. */
static cublasStatus_t lt_layout(cublasLtMatrixLayout_t *l, int dtype, int64_t rows, int64_t cols, int64_t ld,
                                int64_t stride, int64_t batch)
{
    if (cols == 1 && ld < rows)
        ld = rows;
    cublasStatus_t st = lt.MatrixLayoutCreate(l, lt_type(dtype), (uint64_t)rows, (uint64_t)cols, ld);
    if (st != CUBLAS_STATUS_SUCCESS || batch == 1)
        return st;
    int32_t count = (int32_t)batch;
    st = lt.MatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = lt.MatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                                 sizeof stride);
    return st;
}

/* The operation: compute and scale types, the swapped operands' ops and,
 * with epilogue, g's epilogue, the bias's type and aux's leading dimension
 * (the pointers are set for each call). BGRADB reduces cuBLASLt's B, which
 * is our A, over k. cuBLASLt's GELU is the tanh form; gemm_run asks for
 * nothing it lacks (the erf form, a ReLU's value before it). */
static cublasStatus_t lt_op(cublasLtMatmulDesc_t *op, const gemm_args &g, bool epilogue)
{
    cublasComputeType_t compute = g.dtype == DP_FLOAT64 ? CUBLAS_COMPUTE_64F
                                  : (g.dtype == DP_FLOAT32 && g.allow_tf32) ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                                           : CUBLAS_COMPUTE_32F;
    cudaDataType_t scale = g.dtype == DP_FLOAT64 ? CUDA_R_64F : CUDA_R_32F;
    cublasOperation_t ta = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;   /* cuBLASLt's A is our B */
    cublasOperation_t tb = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasStatus_t st = lt.MatmulDescCreate(op, compute, scale);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = lt.MatmulDescSetAttribute(*op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = lt.MatmulDescSetAttribute(*op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
    if (st != CUBLAS_STATUS_SUCCESS || !epilogue)
        return st;
    cublasLtEpilogue_t epi;
    switch (g.epilogue) {
    case DPC_EPI_BGRAD: epi = CUBLASLT_EPILOGUE_BGRADB; break;
    case DPC_EPI_RELU: epi = g.bias ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_RELU; break;
    case DPC_EPI_GELU_TANH:
        epi = g.aux ? (g.bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX)
                    : (g.bias ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU);
        break;
    default: epi = CUBLASLT_EPILOGUE_BIAS;
    }
    int32_t bias_type = (int32_t)lt_type(g.dtype);
    int64_t bias_stride = 0;   /* the same bias for every batch entry */
    int64_t aux_ld = g.ldc;    /* aux is laid out as C */
    st = lt.MatmulDescSetAttribute(*op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi);
    if (st == CUBLAS_STATUS_SUCCESS && g.aux)
        st = lt.MatmulDescSetAttribute(*op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &g.aux, sizeof g.aux);
    if (st == CUBLAS_STATUS_SUCCESS && g.aux)
        st = lt.MatmulDescSetAttribute(*op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof aux_ld);
    if (st != CUBLAS_STATUS_SUCCESS || g.bias == NULL)
        return st;
    st = lt.MatmulDescSetAttribute(*op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias, sizeof g.bias);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = lt.MatmulDescSetAttribute(*op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                               sizeof bias_type);
    if (st == CUBLAS_STATUS_SUCCESS && g.batch > 1)
        st = lt.MatmulDescSetAttribute(*op, CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE, &bias_stride,
                                               sizeof bias_stride);
    return st;
}

/* The key of g's product. */
static void lt_key(algo_key *key, const gemm_args &g, int device, bool epilogue, size_t workspace)
{
    size_t es = dt_size(g.dtype);
    memset(key, 0, sizeof *key);
    *key = algo_key{ device, g.dtype, g.allow_tf32 != 0, g.trans_a != 0, g.trans_b != 0, g.m, g.n, g.k,
                     g.lda, g.ldb, g.ldc, g.batch > 1 ? g.stride_a : 0, g.batch > 1 ? g.stride_b : 0,
                     g.batch > 1 ? g.stride_c : 0, g.batch, epilogue ? 1 + g.epilogue : 0,
                     alignment(g.A, g.stride_a, g.batch, es), alignment(g.B, g.stride_b, g.batch, es),
                     alignment(g.C, g.stride_c, g.batch, es), epilogue && g.bias ? alignment(g.bias, 0, 1, es) : 0,
                     epilogue && g.aux ? alignment(g.aux, 0, 1, es) : 0, (int64_t)workspace };
}

/* Makes plan's descriptors for g and asks the heuristic for the best
 * algorithm; plan->ok 0 when it has none. */
static int lt_plan_make(lt_plan *plan, cublasLtHandle_t handle, const gemm_args &g, const algo_key &key)
{
    bool epilogue = key.epilogue != 0;
    cublasStatus_t st = lt_op(&plan->op, g, epilogue);
    if (st == CUBLAS_STATUS_SUCCESS)   /* stored B: k x n row-major, or n x k when transposed */
        st = lt_layout(&plan->a, g.dtype, g.trans_b ? g.k : g.n, g.trans_b ? g.n : g.k, g.ldb, g.stride_b, g.batch);
    if (st == CUBLAS_STATUS_SUCCESS)   /* stored A: m x k row-major, or k x m when transposed */
        st = lt_layout(&plan->b, g.dtype, g.trans_a ? g.m : g.k, g.trans_a ? g.k : g.m, g.lda, g.stride_a, g.batch);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = lt_layout(&plan->c, g.dtype, g.n, g.m, g.ldc, g.stride_c, g.batch);
    if (st != CUBLAS_STATUS_SUCCESS)
        return lt_status(st);
    uint64_t ws = (uint64_t)key.workspace;
    uint32_t align[4] = { (uint32_t)key.align_b, (uint32_t)key.align_a, (uint32_t)key.align_c,
                          (uint32_t)key.align_c };   /* cuBLASLt's A, B, C, D */
    static const cublasLtMatmulPreferenceAttributes_t align_attr[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES
    };
    cublasLtMatmulPreference_t pref = NULL;
    st = lt.MatmulPreferenceCreate(&pref);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = lt.MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    for (int i = 0; i < 4 && st == CUBLAS_STATUS_SUCCESS; i++)
        st = lt.MatmulPreferenceSetAttribute(pref, align_attr[i], &align[i], sizeof align[i]);
    cublasLtMatmulHeuristicResult_t result;
    int count = 0;
    memset(&result, 0, sizeof result);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = lt.MatmulAlgoGetHeuristic(handle, plan->op, plan->a, plan->b, plan->c, plan->c, pref, 1, &result,
                                       &count);
    if (pref)
        lt.MatmulPreferenceDestroy(pref);
    if (st != CUBLAS_STATUS_SUCCESS && st != CUBLAS_STATUS_NOT_SUPPORTED)
        return lt_status(st);
    plan->ok = st == CUBLAS_STATUS_SUCCESS && count >= 1 && result.state == CUBLAS_STATUS_SUCCESS;
    if (plan->ok)
        plan->algo = result.algo;
    return 0;
}

/* C = alpha * op(A) op(B) + beta * C (+ bias with epilogue) as C^T = op(B)^T
 * op(A)^T in column-major, with the cached plan for its key (made first
 * when there is none). DPC_UNSUPPORTED when cuBLASLt has no algorithm. */
static int lt_matmul(cublasLtHandle_t handle, const gemm_args &g, int device, bool epilogue, void *workspace,
                     size_t ws_bytes)
{
    algo_key key;
    lt_key(&key, g, device, epilogue, ws_bytes);
    unsigned slot = plan_slot(&key);
    int rc = 0;
    pthread_mutex_lock(&lt_mutex);
    lt_plan &plan = plan_cache[slot].plan;
    if (!plan_cache[slot].used || memcmp(&plan_cache[slot].key, &key, sizeof key) != 0) {
        plan.clear();
        plan_cache[slot].used = 0;
        if ((rc = lt_plan_make(&plan, handle, g, key)) == 0) {
            plan_cache[slot].used = 1;
            plan_cache[slot].key = key;
        } else {
            plan.clear();
        }
    }
    if (rc == 0 && !plan.ok)
        rc = DPC_UNSUPPORTED;
    cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
    if (rc == 0 && epilogue && g.bias)
        st = lt.MatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias, sizeof g.bias);
    if (rc == 0 && st == CUBLAS_STATUS_SUCCESS && epilogue && g.aux)
        st = lt.MatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &g.aux, sizeof g.aux);
    if (rc == 0 && st == CUBLAS_STATUS_SUCCESS) {
        float alpha32 = (float)g.alpha, beta32 = (float)g.beta;
        const void *alpha = g.dtype == DP_FLOAT64 ? (const void *)&g.alpha : &alpha32;
        const void *beta = g.dtype == DP_FLOAT64 ? (const void *)&g.beta : &beta32;
        st = lt.Matmul(handle, plan.op, alpha, g.B, plan.a, g.A, plan.b, beta, g.C, plan.c, g.C, plan.c,
                       &plan.algo, workspace, ws_bytes, g.stream);
    }
    pthread_mutex_unlock(&lt_mutex);
    return rc != 0 ? rc : lt_status(st);
}

/* The product with the bias and activation in cuBLASLt's epilogue, or,
 * when cuBLASLt has no algorithm for that, the product and then the rest
 * in a kernel of our own. An activation cuBLASLt lacks (GELU's erf form,
 * or a ReLU whose value before it is wanted) runs in that kernel after the
 * product and bias; so does GELU in float64, which cuBLASLt's epilogue
 * computes to about 2e-10 only (measured on the H200 against the CPU). */
static int gemm_run(const gemm_args &g)
{
    int device, rc;
    cublasLtHandle_t handle;
    if (pthread_once(&lt_once, lt_load) != 0 || !lt.ok)
        return DPC_UNSUPPORTED;   /* dpc_cublaslt_version(&why) says why */
    if (cudaGetDevice(&device) != cudaSuccess) {
        (void)cudaGetLastError();
        return (int)cudaErrorNoDevice;
    }
    if ((rc = lt_handle(device, &handle)) != 0)
        return rc;
    /* Without a workspace cuBLASLt still has algorithms, only fewer; a
     * small product (here one with a deep k: the rest are our kernel's)
     * first tries without, which saves two pool calls per product. */
    void *ws = NULL;
    size_t ws_bytes = 0;
    bool small = (double)g.m * (double)g.n * (double)g.k * (double)g.batch <= GEMM_SMALL_FLOPS;
    gemm_args lt_g = g;   /* what cuBLASLt's epilogue does */
    bool act_after = g.epilogue == DPC_EPI_GELU || (g.epilogue == DPC_EPI_RELU && g.aux) ||
                     (g.epilogue == DPC_EPI_GELU_TANH && g.dtype == DP_FLOAT64);
    if (act_after) {
        lt_g.epilogue = DPC_EPI_BIAS;
        lt_g.aux = NULL;
    }
    bool epilogue = g.bias != NULL || is_activation(lt_g.epilogue);   /* lt_g's GELU is the tanh form only */
    rc = small ? lt_matmul(handle, lt_g, device, epilogue, NULL, 0) : DPC_UNSUPPORTED;
    if (rc == DPC_UNSUPPORTED) {
        ws_bytes = DPC_GEMM_WORKSPACE_BYTES;
        if (dpc_malloc(&ws, ws_bytes, device, g.stream) != 0) {
            ws = NULL;
            ws_bytes = 0;
        }
        rc = lt_matmul(handle, lt_g, device, epilogue, ws, ws_bytes);
    }
    /* Some releases call an epilogue they lack an invalid value rather
     * than unsupported; a product that is itself invalid fails again. */
    if ((rc == DPC_UNSUPPORTED || rc == (int)cudaErrorInvalidValue) && epilogue) {
        rc = lt_matmul(handle, g, device, false, ws, ws_bytes);
        if (rc == 0)
            rc = epilogue_after(g);
    } else if (rc == 0 && act_after) {
        rc = scale_bias(g, 1.0, false);
    }
    if (ws) {
        int frc = dpc_free(ws, ws_bytes, device, g.stream);
        if (rc == 0)
            rc = frc;
    }
    return rc;
}
#endif /* DP_HAVE_CUBLASLT */

/* ------------------------------------------------------------------------ */
/* the entry point                                                           */
/* ------------------------------------------------------------------------ */

extern "C" int dpc_gemm(int dtype, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, double alpha,
                        const void *A, int64_t lda, int64_t stride_a, const void *B, int64_t ldb, int64_t stride_b,
                        double beta, void *C, int64_t ldc, int64_t stride_c, int64_t batch, int epilogue,
                        void *bias, void *aux, int allow_tf32, void *stream)
{
    gemm_args g = { dtype, trans_a, trans_b, allow_tf32, m, n, k, alpha, beta, A, B, bias, C,
                    lda, ldb, ldc, stride_a, stride_b, stride_c, batch, (cudaStream_t)stream, epilogue, aux };
    bool bgrad = epilogue == DPC_EPI_BGRAD;
    if (dtype != DP_FLOAT32 && dtype != DP_FLOAT64 && dtype != DP_BFLOAT16)
        return DPC_UNSUPPORTED;
    if (m < 0 || n < 0 || k < 0 || batch < 0 || batch > INT32_MAX || epilogue < 0 ||
        epilogue > DPC_EPI_GELU_TANH || (bgrad && (bias == NULL || batch != 1)) ||
        (aux && (batch != 1 || !is_activation(epilogue))))
        return (int)cudaErrorInvalidValue;
    if (m == 0 || n == 0 || batch == 0)   /* no product; the row sums of op(A) may still be asked for */
        return bgrad && m > 0 ? row_sums(g) : 0;
    /* Batch entries writing the same C would race. A single row's
     * leading dimension is never used. */
    if (C == NULL || (m > 1 && ldc < n) || (batch > 1 && stride_c == 0))
        return (int)cudaErrorInvalidValue;
    int rc;
    if (k == 0) {   /* op(A) op(B) is all zeros */
        rc = scale_bias(g, beta);
        return rc == 0 && bgrad ? row_sums(g) : rc;
    }
    if (A == NULL || B == NULL)
        return (int)cudaErrorInvalidValue;
    tile_jobs jobs;
    memset(&jobs, 0, sizeof jobs);
    jobs.job[0].g = g;
    jobs.count = 1;
    if (own_fits(m, n, k, batch))
        return tiled_gemm(jobs);
    staged_job staged;
    size_t smem;
    if (staged_plan(staged, g, &smem))
        return staged_launch(staged, smem);
#ifdef DP_HAVE_CUBLASLT
    if ((rc = gemm_run(g)) != DPC_UNSUPPORTED)
        return rc;
#endif
    /* without cuBLASLt (not built, not found, or no algorithm for this
     * shape) our kernel, slower on large products, is still right */
    return tiled_gemm(jobs);
}
