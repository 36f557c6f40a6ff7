/*
 * gemm_lt.cu — products in cuBLASLt (dpc_gemm's path past our kernels'
 * sizes). cuBLASLt is dlopen()ed on first use (see dp_cuda.h): every
 * cublasLt* function is looked up once through dpc_cublaslt_symbol() and
 * called through a pointer. One handle per device is created on first
 * use. The workspace is taken on the call's own stream for each product
 * and given back right after it: a workspace shared by the whole device
 * would be raced on by products queued on two streams at once, and
 * memory.cu's cache keeps one per stream, so that this costs no driver
 * call. The descriptors of a product and the algorithm cuBLASLt's
 * heuristic picks for it are made once per shape (a plan) and cached, so
 * that a repeated product costs one cublasLtMatmul call on the host.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <stdio.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include <cuda_runtime.h>
#ifdef DP_HAVE_CUBLASLT
#include <cublasLt.h>
#endif

#include "common/dtype_conv.h"
#include "dp_cuda.h"
#include "dpc_ops.h"
#include "common/dplua_codes.h"
#include "gemm.cuh"

#ifdef DP_HAVE_CUBLASLT
/* Devices that get a cuBLASLt handle. */
#define GEMM_MAX_DEVICES 64
/* m*n*k up to which a product is first tried without a workspace. */
#define GEMM_SMALL_FLOPS (1 << 20)

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
    case DPC_EPI_DGELU_TANH: epi = CUBLASLT_EPILOGUE_DGELU; break;   /* aux: the GELU's input, read */
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

/* The kernel profile's row for a product: its dtype, shape and epilogue,
 * so that the step's products can be told apart. */
static int64_t profile_product(const gemm_args &g)
{
    static const char *epi[] = { "", " +relu", " +bgrad", " +gelu", " +gelu_tanh", " +dgelu_tanh" };
    const char *dt = g.dtype == DP_BFLOAT16 ? "bf16" : g.dtype == DP_FLOAT64 ? "f64" : g.allow_tf32 ? "tf32" : "f32";
    char label[128];
    snprintf(label, sizeof label, "cublasLt %s %c%c %lldx%lldx%lld%s%s", dt, g.trans_a ? 'T' : 'N', g.trans_b ? 'T' : 'N',
             (long long)g.m, (long long)g.n, (long long)g.k, g.batch > 1 ? " batched" : "",
             g.epilogue >= 0 && g.epilogue < 6 ? epi[g.epilogue] : "");
    return dpc_profile_before(g.stream, NULL, label);
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
        const int64_t token = dpc_profiling ? profile_product(g) : 0;
        st = lt.Matmul(handle, plan.op, alpha, g.B, plan.a, g.A, plan.b, beta, g.C, plan.c, g.C, plan.c,
                       &plan.algo, workspace, ws_bytes, g.stream);
        dpc_profile_after(g.stream, token);
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
int gemm_lt_run(const gemm_args &g)
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
    /* cuBLASLt's GELU keeps its input (aux) only with a leading dimension
     * divisible by 8 (cublasLt.h, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD) */
    bool tanh_gelu = g.epilogue == DPC_EPI_GELU_TANH || g.epilogue == DPC_EPI_DGELU_TANH;
    bool act_after = g.epilogue == DPC_EPI_GELU || (g.epilogue == DPC_EPI_RELU && g.aux) ||
                     (tanh_gelu && (g.dtype == DP_FLOAT64 || (g.aux && g.ldc % 8 != 0)));
    if (act_after) {
        lt_g.epilogue = DPC_EPI_BIAS;
        lt_g.aux = NULL;
    }
    /* lt_g's GELU is the tanh form only */
    bool epilogue = g.bias != NULL || is_activation(lt_g.epilogue) || lt_g.epilogue == DPC_EPI_DGELU_TANH;
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
            rc = gemm_epilogue_after(g);
    } else if (rc == 0 && act_after) {
        rc = gemm_scale_bias(g, 1.0, false);
    }
    if (ws) {
        int frc = dpc_free(ws, ws_bytes, device, g.stream);
        if (rc == 0)
            rc = frc;
    }
    return rc;
}
#else
int gemm_lt_run(const gemm_args &g)
{
    (void)g;
    return DPC_UNSUPPORTED;
}
#endif /* DP_HAVE_CUBLASLT */
