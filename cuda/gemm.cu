/*
 * gemm.cu — batched matrix products behind dpc_ops.h (dpc_gemm), and the
 * epilogues that a product's own kernel did not apply.
 *
 * dplua's matrices are row-major and cuBLASLt's column-major. A row-major
 * m x n matrix read column-major is its n x m transpose, so C = op(A) op(B)
 * is computed as C^T = op(B)^T op(A)^T: B goes in as cuBLASLt's first
 * operand, A as its second, and m and n swap. A Linear layer's bias (one
 * value per column of C, out[i][j] += bias[j]) is then one value per row
 * of C^T, which is what CUBLASLT_EPILOGUE_BIAS adds.
 *
 * The one dispatch rule: a product of at most GEMM_OWN_FLOPS multiply-adds
 * (and k at most OWN_MAX_K) runs in our kernels (gemm_own.cu), where a
 * launch costs the host less than a cuBLASLt call; every other product is
 * cuBLASLt's (gemm_lt.cu), and ours again only where cuBLASLt is missing
 * or has no algorithm for it.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <stdint.h>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "common/dtype_conv.h"
#include "dp_cuda.h"
#include "dpc_ops.h"
#include "common/dplua_codes.h"
#include "gemm.cuh"
#include "launch.cuh"

#define GEMM_BLOCK 256

/* ------------------------------------------------------------------------ */
/* the epilogues without cuBLASLt                                            */
/* ------------------------------------------------------------------------ */


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
    grid_stride_loop(batch * m * n, [&](int64_t e) {
        int64_t j = e % n, i = (e / n) % m, b = e / (n * m);
        T *p = C + b * stride_c + i * ldc + j;
        Acc v = beta == (Acc)0 ? (Acc)0 : beta * to_acc(*p);
        if (bias)
            v = v + to_acc(bias[j]);
        store(p, activate(epilogue, v, aux ? aux + i * ldc + j : (T *)NULL));
    });
}

template <typename T, typename Acc>
static int scale_bias_launch(const gemm_args &g, double beta, bool with_bias)
{
    unsigned grid = grid_stride_blocks(g.batch * g.m * g.n, GEMM_BLOCK);
    return launch_kernel(scale_bias_kernel<T, Acc>, grid, GEMM_BLOCK, g.stream, (T *)g.C, g.ldc,
                         g.stride_c, g.batch, g.m, g.n, (Acc)beta,
                         with_bias && g.epilogue != DPC_EPI_BGRAD ? (const T *)g.bias : NULL, g.epilogue,
                         (T *)g.aux);
}

/* C = act(beta C + bias), the bias left out unless with_bias */
int gemm_scale_bias(const gemm_args &g, double beta, bool with_bias)
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
int gemm_epilogue_after(const gemm_args &g)
{
    if (g.epilogue == DPC_EPI_BGRAD)
        return row_sums(g);
    return g.bias || is_activation(g.epilogue) || g.epilogue == DPC_EPI_DGELU_TANH ? gemm_scale_bias(g, 1.0) : 0;
}

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
    bool dgelu = epilogue == DPC_EPI_DGELU_TANH;
    if (m < 0 || n < 0 || k < 0 || batch < 0 || batch > INT32_MAX || epilogue < 0 ||
        epilogue > DPC_EPI_DGELU_TANH || (bgrad && (bias == NULL || batch != 1)) ||
        (aux && (batch != 1 || !(is_activation(epilogue) || dgelu))) || (dgelu && (aux == NULL || bias != NULL)))
        return (int)cudaErrorInvalidValue;
    if (m == 0 || n == 0 || batch == 0)   /* no product; the row sums of op(A) may still be asked for */
        return bgrad && m > 0 ? row_sums(g) : 0;
    /* Batch entries writing the same C would race. A single row's
     * leading dimension is never used. */
    if (C == NULL || (m > 1 && ldc < n) || (batch > 1 && stride_c == 0))
        return (int)cudaErrorInvalidValue;
    int rc;
    if (k == 0) {   /* op(A) op(B) is all zeros */
        rc = gemm_scale_bias(g, beta);
        return rc == 0 && bgrad ? row_sums(g) : rc;
    }
    if (A == NULL || B == NULL)
        return (int)cudaErrorInvalidValue;
    tile_jobs jobs;
    memset(&jobs, 0, sizeof jobs);
    jobs.job[0].g = g;
    jobs.count = 1;
    if (gemm_own_fits(m, n, k, batch))
        return gemm_own_run(jobs);
    if ((rc = gemm_lt_run(g)) != DPC_UNSUPPORTED)
        return rc;
    /* without cuBLASLt (not built, not found, or no algorithm for this
     * shape) our kernel, slower on large products, is still right */
    return gemm_own_run(jobs);
}
