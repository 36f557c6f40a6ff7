/*
 * gemm.cuh — what the files of dpc_gemm share (gemm.cu, the entry point
 * and the epilogues without cuBLASLt; gemm_own.cu, our kernels for small
 * products; gemm_lt.cu, cuBLASLt; linear_backward.cu, a Linear layer's
 * backward in our kernels): a product as the caller described it and the
 * epilogue's arithmetic.
 */
#ifndef DPC_GEMM_CUH
#define DPC_GEMM_CUH

#include <stdint.h>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "activation.cuh"
#include "dpc_ops.h"

/* The threads of gemm_own.cu's one-block kernel (small_gemm_kernel). */
#define GEMM_SMALL_THREADS 512

/* One product, as the caller described it (row-major). */
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

/* One product of a launch of our kernels, and the launch's products. */
struct tile_job {
    gemm_args g;
    const void *mask;        /* NULL, or like C (ldc, batch 1): C is 0 where !(mask > 0) */
    /* set by own_plan: the job's tiles, its blocks (whole
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

/* Whether the bytes [a, a + a_bytes) and [b, b + b_bytes) overlap. */
static inline bool gemm_overlap(const void *a, int64_t a_bytes, const void *b, int64_t b_bytes)
{
    const char *x = (const char *)a, *y = (const char *)b;
    return a_bytes > 0 && b_bytes > 0 && x < y + b_bytes && y < x + a_bytes;
}

/* ---------------------------------------------------------------- the epilogue */

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
    if (epilogue == DPC_EPI_DGELU_TANH) {   /* v as stored, then the GELU's backward: the two ops' values */
        T stored;
        store(&stored, v);
        return gelu_tanh_backward(to_acc(stored), to_acc(*aux));
    }
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

/* ---------------------------------------------------------------- across the files */

/* gemm.cu: C = act(beta C + bias), the bias left out unless with_bias;
 * and what the epilogue adds to a product that ran without it */
int gemm_scale_bias(const gemm_args &g, double beta, bool with_bias = true);
int gemm_epilogue_after(const gemm_args &g);

/* gemm_own.cu: whether a product of this shape is one for our kernels;
 * whether the jobs fit one block of them (with accumulators of acc_size
 * bytes); and the jobs (of one dtype and stream) run in one launch, with
 * sgd (of their dtype) in one block that then takes the step */
bool gemm_own_fits(int64_t m, int64_t n, int64_t k, int64_t batch);
bool gemm_own_one_block(const tile_jobs &jobs, size_t acc_size);
int gemm_own_run(tile_jobs &jobs, const dpc_sgd_args *sgd = NULL);

/* gemm_lt.cu: the product in cuBLASLt; DPC_UNSUPPORTED when cuBLASLt is
 * not at hand or has no algorithm for it */
int gemm_lt_run(const gemm_args &g);

#endif /* DPC_GEMM_CUH */
