/*
 * linear_backward.cu — a Linear layer's backward in our GEMM kernels
 * (gemm_own.cu): dx and dw in one launch, two layers' backwards chained
 * in one block, and an SGD step after them in that block
 * (dpc_linear_backward, called by src/core/gpu_linear.c's deferred launches).
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <stdint.h>
#include <string.h>

#include <cuda_runtime.h>

#include "common/dtype_conv.h"
#include "dpc_ops.h"
#include "common/dplua_codes.h"
#include "gemm.cuh"

/* Whether a layer's products are ours to run. */
static bool layer_is_ours(const dpc_linear_grads &L)
{
    /* dx's k is N, dw's is M; a bias gradient alone is a reduction */
    return L.M > 0 && L.N > 0 && L.K > 0 && gemm_own_fits(L.M, L.K, L.N, 1) && gemm_own_fits(L.N, L.K, L.M, 1) &&
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
    return gemm_own_one_block(jobs, sizeof(double));
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
#define SMALL_SGD_MAX (GEMM_SMALL_THREADS * 8)

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
            if (out[o] && (gemm_overlap(a.param, bytes, out[o], out_bytes[o]) ||
                           (a.momentum_buf && gemm_overlap(a.momentum_buf, bytes, out[o], out_bytes[o]))))
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
    return jobs.count ? gemm_own_run(jobs, sgd) : 0;
}