/*
 * lt_host.c — what cublasLtMatmul alone costs the host, for the MLP's
 * first layer (x 256x784 @ W^T 784x256 + bias, ReLU; float32), with the
 * plan made once as gemm.cu makes it (the heuristic's first choice, a
 * 32 MiB workspace): RUNS calls enqueued without a synchronisation, the
 * host's µs a call, then the whole µs a call, best of 7. Beside dplua's
 * host cost of the same product (scripts/bench/host_time.lua), the
 * difference is what dplua's gemm_run adds to the library's own.
 * Built by scripts/device-build into .device/bin/lt_host.
 * usage: lt_host
 */
#include <stdio.h>
#include <time.h>

#include <cublasLt.h>
#include <cuda_runtime.h>

#define RUNS 60
#define TRIES 7
#define M 256
#define N 256
#define K 784

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

#define CHECK(what, ok)                                                  \
    do {                                                                 \
        if (!(ok)) {                                                     \
            fprintf(stderr, "lt_host: %s failed\n", what);               \
            return 1;                                                    \
        }                                                                \
    } while (0)

int main(void)
{
    float *x, *w, *b, *y;
    void *ws;
    size_t ws_bytes = (size_t)32 << 20;
    CHECK("cudaMalloc", cudaMalloc((void **)&x, sizeof(float) * M * K) == cudaSuccess &&
                            cudaMalloc((void **)&w, sizeof(float) * N * K) == cudaSuccess &&
                            cudaMalloc((void **)&b, sizeof(float) * N) == cudaSuccess &&
                            cudaMalloc((void **)&y, sizeof(float) * M * N) == cudaSuccess &&
                            cudaMalloc(&ws, ws_bytes) == cudaSuccess);
    cudaMemset(x, 0, sizeof(float) * M * K);
    cudaMemset(w, 0, sizeof(float) * N * K);
    cudaMemset(b, 0, sizeof(float) * N);
    cublasLtHandle_t lt;
    CHECK("cublasLtCreate", cublasLtCreate(&lt) == CUBLAS_STATUS_SUCCESS);
    /* row-major y (M, N) = x (M, K) @ w^T as column-major y^T = w x^T:
     * cuBLASLt's A is w (K x N column-major, transposed), B is x^T (K x M) */
    cublasLtMatmulDesc_t op;
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_RELU_BIAS;
    CHECK("desc", cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS &&
                      cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta) == 0 &&
                      cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb) == 0 &&
                      cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi) == 0 &&
                      cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &b, sizeof b) == 0);
    cublasLtMatrixLayout_t la, lb, lc;
    CHECK("layouts", cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, K, N, K) == 0 &&
                         cublasLtMatrixLayoutCreate(&lb, CUDA_R_32F, K, M, K) == 0 &&
                         cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, N, M, N) == 0);
    cublasLtMatmulPreference_t pref;
    CHECK("preference", cublasLtMatmulPreferenceCreate(&pref) == 0 &&
                            cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                                 &ws_bytes, sizeof ws_bytes) == 0);
    cublasLtMatmulHeuristicResult_t result;
    int count = 0;
    CHECK("heuristic", cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc, lc, pref, 1, &result, &count) == 0 &&
                           count == 1);
    float one = 1, zero = 0;
    double host = 1e9, whole = 1e9;
    for (int t = 0; t < TRIES + 1; t++) {   /* the first try warms up */
        cudaDeviceSynchronize();
        double t0 = now();
        for (int r = 0; r < RUNS; r++)
            CHECK("cublasLtMatmul", cublasLtMatmul(lt, op, &one, w, la, x, lb, &zero, y, lc, y, lc, &result.algo, ws,
                                                   ws_bytes, 0) == CUBLAS_STATUS_SUCCESS);
        double t1 = now();
        cudaDeviceSynchronize();
        double t2 = now();
        if (t > 0 && (t1 - t0) / RUNS < host)
            host = (t1 - t0) / RUNS;
        if (t > 0 && (t2 - t0) / RUNS < whole)
            whole = (t2 - t0) / RUNS;
    }
    printf("%-40s %10.1f %10.1f\n", "cublasLtMatmul alone, 256x784->256", host * 1e6, whole * 1e6);
    return 0;
}
