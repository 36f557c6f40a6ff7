/*
 * lt_host.c — cuBLASLt alone on the MLP's two cuBLASLt products, float32,
 * with the plan made as gemm.cu makes it (alignments of 256, a 32 MiB
 * workspace): the first layer's forward (x 256x784 @ W^T + bias, ReLU:
 * RELU_BIAS) and its weight gradient ((256x256)^T @ 256x784 with the bias
 * gradient: BGRADB), and that gradient without the bias's. For each of
 * the heuristic's first CHOICES algorithms, and again with a split of k
 * reduced in place (CUBLASLT_REDUCTION_SCHEME_INPLACE, where
 * cublasLtMatmulAlgoCheck takes it): its configuration (id, tile, stages,
 * split of k and its reduction), the kernels a call launches (the nodes
 * of a graph captured from one call), the host's µs a call and the whole
 * µs a call when RUNS calls are enqueued without a synchronisation (best
 * of 7), the GPU's µs a call replayed from a graph of RUNS calls (median
 * of 7 replays), and the largest difference from choice 0's output.
 * Choice 0 is what dplua takes; beside dplua's host cost of the same
 * product (scripts/bench/host_time.lua) it tells what gemm_run adds to the
 * library's own, and the other rows what another choice would cost.
 * Built by scripts/device-build into .device/bin/lt_host.
 * usage: lt_host
 */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <cublasLt.h>
#include <cuda_runtime.h>

#define RUNS 60
#define TRIES 7
#define CHOICES 8

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
            exit(1);                                                     \
        }                                                                \
    } while (0)

/* One product as cuBLASLt sees it (column-major, gemm.cu's swap of the
 * operands already made): D (rows x cols) = op(A) op(B) with epilogue. */
struct product {
    const char *name;
    cublasOperation_t ta, tb;
    int a_rows, a_cols, b_rows, b_cols, rows, cols;
    cublasLtEpilogue_t epilogue;
};

static void *device_random(size_t count)
{
    float *host = malloc(count * sizeof *host), *dev;
    CHECK("malloc", host != NULL);
    for (size_t i = 0; i < count; i++)
        host[i] = (float)rand() / RAND_MAX - 0.5f;
    CHECK("cudaMalloc", cudaMalloc((void **)&dev, count * sizeof *dev) == cudaSuccess);
    CHECK("cudaMemcpy", cudaMemcpy(dev, host, count * sizeof *dev, cudaMemcpyHostToDevice) == cudaSuccess);
    free(host);
    return dev;
}

static int config(const cublasLtMatmulAlgo_t *algo, cublasLtMatmulAlgoConfigAttributes_t attr)
{
    int value = 0;   /* every attribute printed here is 32 bits or fewer */
    size_t written;
    if (cublasLtMatmulAlgoConfigGetAttribute(algo, attr, &value, sizeof value, &written) != 0)
        return -1;
    return value;
}

static int compare(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* RUNS calls of algo: host and whole us a call, then the GPU's us a call
 * replayed from a graph; one row without its line's end. False (the row
 * says so) when cuBLASLt refuses the call. */
static bool run_choice(cublasLtHandle_t lt, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t la,
                       cublasLtMatrixLayout_t lb, cublasLtMatrixLayout_t lc, const void *A, const void *B, void *D,
                       const cublasLtMatmulAlgo_t *algo, void *ws, size_t ws_bytes, cudaStream_t s, cudaEvent_t e0,
                       cudaEvent_t e1, const char *name)
{
    float one = 1, zero = 0;
    cublasStatus_t first = cublasLtMatmul(lt, op, &one, A, la, B, lb, &zero, D, lc, D, lc, algo, ws, ws_bytes, s);
    if (first != CUBLAS_STATUS_SUCCESS) {
        printf("%-14s cublasLtMatmul refused it (status %d)", name, (int)first);
        return false;
    }
#define CALL()                                                                                                \
    CHECK("cublasLtMatmul", cublasLtMatmul(lt, op, &one, A, la, B, lb, &zero, D, lc, D, lc, algo, ws, ws_bytes, \
                                           s) == CUBLAS_STATUS_SUCCESS)
    double host = 1e9, whole = 1e9;
    for (int t = 0; t < TRIES + 1; t++) {   /* the first try warms up */
        cudaStreamSynchronize(s);
        double t0 = now();
        for (int r = 0; r < RUNS; r++)
            CALL();
        double t1 = now();
        cudaStreamSynchronize(s);
        double t2 = now();
        if (t > 0 && (t1 - t0) / RUNS < host)
            host = (t1 - t0) / RUNS;
        if (t > 0 && (t2 - t0) / RUNS < whole)
            whole = (t2 - t0) / RUNS;
    }
    cudaGraph_t one_call, calls;
    cudaGraphExec_t exec;
    size_t kernels = 0;
    CHECK("capture", cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
    CALL();
    CHECK("capture", cudaStreamEndCapture(s, &one_call) == cudaSuccess &&
                         cudaGraphGetNodes(one_call, NULL, &kernels) == cudaSuccess);
    CHECK("capture", cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
    for (int r = 0; r < RUNS; r++)
        CALL();
    CHECK("capture", cudaStreamEndCapture(s, &calls) == cudaSuccess &&
                         cudaGraphInstantiate(&exec, calls, 0) == cudaSuccess);
    double replays[TRIES];
    for (int t = 0; t < TRIES + 1; t++) {
        float ms;
        cudaEventRecord(e0, s);
        CHECK("replay", cudaGraphLaunch(exec, s) == cudaSuccess);
        cudaEventRecord(e1, s);
        CHECK("replay", cudaEventSynchronize(e1) == cudaSuccess && cudaEventElapsedTime(&ms, e0, e1) == 0);
        if (t > 0)
            replays[t - 1] = ms * 1e3 / RUNS;
    }
    qsort(replays, TRIES, sizeof replays[0], compare);
    printf("%-14s %5d %5d %6d %6d %6d %7zu %10.1f %10.1f %10.2f", name, config(algo, CUBLASLT_ALGO_CONFIG_ID),
           config(algo, CUBLASLT_ALGO_CONFIG_TILE_ID), config(algo, CUBLASLT_ALGO_CONFIG_STAGES_ID),
           config(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM), config(algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME),
           kernels, host * 1e6, whole * 1e6, replays[TRIES / 2]);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(calls);
    cudaGraphDestroy(one_call);
    CALL();   /* D as this choice leaves it */
    CHECK("sync", cudaStreamSynchronize(s) == cudaSuccess);
#undef CALL
    return true;
}

static void measure(cublasLtHandle_t lt, const struct product *p)
{
    size_t ws_bytes = (size_t)32 << 20;
    void *ws, *A = device_random((size_t)p->a_rows * p->a_cols), *B = device_random((size_t)p->b_rows * p->b_cols);
    void *D = device_random((size_t)p->rows * p->cols), *bias = device_random((size_t)p->rows);
    CHECK("cudaMalloc", cudaMalloc(&ws, ws_bytes) == cudaSuccess);
    cublasLtMatmulDesc_t op;
    CHECK("desc", cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F) == 0 &&
                      cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &p->ta, sizeof p->ta) == 0 &&
                      cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &p->tb, sizeof p->tb) == 0 &&
                      cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &p->epilogue,
                                                     sizeof p->epilogue) == 0);
    if (p->epilogue != CUBLASLT_EPILOGUE_DEFAULT)   /* a bias is read, or the bias gradient written */
        CHECK("bias", cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias) == 0);
    cublasLtMatrixLayout_t la, lb, lc;
    CHECK("layouts", cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, p->a_rows, p->a_cols, p->a_rows) == 0 &&
                         cublasLtMatrixLayoutCreate(&lb, CUDA_R_32F, p->b_rows, p->b_cols, p->b_rows) == 0 &&
                         cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, p->rows, p->cols, p->rows) == 0);
    cublasLtMatmulPreference_t pref;
    uint32_t align = 256;
    CHECK("preference",
          cublasLtMatmulPreferenceCreate(&pref) == 0 &&
              cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                                   sizeof ws_bytes) == 0 &&
              cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align,
                                                   sizeof align) == 0 &&
              cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align,
                                                   sizeof align) == 0 &&
              cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align,
                                                   sizeof align) == 0 &&
              cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align,
                                                   sizeof align) == 0);
    cublasLtMatmulHeuristicResult_t result[CHOICES];
    int count = 0;
    CHECK("heuristic",
          cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc, lc, pref, CHOICES, result, &count) == 0 && count >= 1);
    cudaStream_t s;
    cudaEvent_t e0, e1;
    CHECK("stream", cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess &&
                        cudaEventCreate(&e0) == cudaSuccess && cudaEventCreate(&e1) == cudaSuccess);
    printf("%s: the heuristic's first %d choices (+inplace: the same with the split's reduction in place)\n",
           p->name, count);
    printf("%-14s %5s %5s %6s %6s %6s %7s %10s %10s %10s %12s\n", "choice", "id", "tile", "stages", "splitk",
           "reduce", "kernels", "host us", "whole us", "graph us", "max |diff|");
    size_t out = (size_t)p->rows * p->cols;
    float *first = malloc(out * sizeof *first), *mine = malloc(out * sizeof *mine);
    CHECK("malloc", first && mine);
    for (int c = 0; c < count; c++) {
        for (int inplace = 0; inplace < 2; inplace++) {
            cublasLtMatmulAlgo_t algo = result[c].algo;
            char name[32];
            snprintf(name, sizeof name, "%d%s", c, inplace ? "+inplace" : "");
            if (inplace) {
                cublasLtReductionScheme_t scheme = CUBLASLT_REDUCTION_SCHEME_INPLACE;
                cublasLtMatmulHeuristicResult_t check;
                if (config(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM) <= 1 ||
                    cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme,
                                                         sizeof scheme) != 0)
                    continue;
                if (cublasLtMatmulAlgoCheck(lt, op, la, lb, lc, lc, &algo, &check) != 0 ||
                    check.workspaceSize > ws_bytes) {
                    printf("%-14s refused by cublasLtMatmulAlgoCheck\n", name);
                    continue;
                }
            }
            if (!run_choice(lt, op, la, lb, lc, A, B, D, &algo, ws, ws_bytes, s, e0, e1, name)) {
                printf("\n");
                continue;
            }
            CHECK("copy", cudaMemcpy(c == 0 && !inplace ? first : mine, D, out * sizeof *mine,
                                     cudaMemcpyDeviceToHost) == cudaSuccess);
            double diff = 0;
            for (size_t i = 0; c + inplace > 0 && i < out; i++)
                diff = fabs(mine[i] - first[i]) > diff ? fabs(mine[i] - first[i]) : diff;
            printf(" %12.3g\n", diff);
        }
    }
    free(first);
    free(mine);
    CHECK("last error", cudaGetLastError() == cudaSuccess);
}

int main(void)
{
    cublasLtHandle_t lt;
    CHECK("cublasLtCreate", cublasLtCreate(&lt) == CUBLAS_STATUS_SUCCESS);
    /* row-major y (256, 256) = x (256, 784) @ w^T as column-major y^T = w x^T:
     * A is w (784 x 256 column-major, transposed), B is x^T (784 x 256) */
    const struct product forward = { "first layer forward, 256x784 -> 256, RELU_BIAS", CUBLAS_OP_T, CUBLAS_OP_N,
                                     784, 256, 784, 256, 256, 256, CUBLASLT_EPILOGUE_RELU_BIAS };
    /* row-major dw (256, 784) = dy^T (256 x 256) @ x (256, 784) as column-major
     * dw^T = x^T dy: A is x^T (784 x 256), B is dy^T (256 x 256, transposed);
     * the bias gradient is the row sums of dy^T, BGRADB */
    const struct product weight = { "its weight gradient, (256x256)^T @ 256x784, BGRADB", CUBLAS_OP_N, CUBLAS_OP_T,
                                    784, 256, 256, 256, 784, 256, CUBLASLT_EPILOGUE_BGRADB };
    const struct product weight_alone = { "its weight gradient alone, DEFAULT", CUBLAS_OP_N, CUBLAS_OP_T, 784, 256,
                                          256, 256, 784, 256, CUBLASLT_EPILOGUE_DEFAULT };
    measure(lt, &forward);
    measure(lt, &weight);
    measure(lt, &weight_alone);
    return 0;
}
