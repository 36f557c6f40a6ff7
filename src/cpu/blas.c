/*
 * blas.c — batched matrix products on the CPU through OpenBLAS.
 *
 * float32 and float64 go to cblas_?gemm, each matrix with one unit stride
 * (row-major or transposed); int64 products run in a plain exact loop.
 * The caller (src/core/ops.c) brings other dtypes and layouts to these.
 */
#include "cpu/cpu.h"

#include <cblas.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* From OpenBLAS's cblas.h. Declared here as well, because Debian's
 * alternatives may point <cblas.h> at a BLAS without them. */
int openblas_get_num_threads(void);
void openblas_set_num_threads(int n);
char *openblas_get_config(void);

const char *cpu_blas_config(void)
{
    return openblas_get_config();
}

/* The threads set_num_threads asked for (0: never asked), which our own
 * loops use; OpenBLAS gets at most one per online CPU: it busy-waits, so
 * more only slow it, and each of its threads holds a buffer of tens of
 * MB, which an address-space limit may not allow (OpenBLAS then hangs
 * instead of failing). */
static int requested;

int cpu_blas_threads(void)
{
    return requested > 0 ? requested : openblas_get_num_threads();
}

void cpu_blas_set_threads(int n)
{
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    requested = n;
    openblas_set_num_threads(cpus > 0 && n > cpus ? (int)cpus : n);
}

/* Returns the BLAS leading dimension and transpose flag for the 2-D matrix
 * (rows x cols, strides rs, cs), or 0 when it has no unit stride. */
static int64_t blas_layout(int64_t rows, int64_t cols, int64_t rs, int64_t cs, CBLAS_TRANSPOSE *tr)
{
    if (cs == 1 && (rs >= (cols > 1 ? cols : 1) || rows == 1)) {
        *tr = CblasNoTrans;
        return rows == 1 ? (cols > 1 ? cols : 1) : rs;
    }
    if (rs == 1 && (cs >= (rows > 1 ? rows : 1) || cols == 1)) {
        *tr = CblasTrans;
        return cols == 1 ? (rows > 1 ? rows : 1) : cs;
    }
    return 0;
}

/* Integer products accumulate exactly in int64 (wrapping like PyTorch). */
static void gemm_int64(dp_tensor *out, dp_tensor *a, dp_tensor *b, int64_t batch, int64_t m, int64_t n, int64_t k)
{
    const int64_t *x = (const int64_t *)tensor_ptr(a), *y = (const int64_t *)tensor_ptr(b);
    int64_t *o = (int64_t *)tensor_ptr(out);
    for (int64_t z = 0; z < batch; z++)
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++) {
                uint64_t acc = 0;
                for (int64_t l = 0; l < k; l++)
                    acc += (uint64_t)x[(z * m + i) * k + l] * (uint64_t)y[(z * k + l) * n + j];
                o[(z * m + i) * n + j] = (int64_t)acc;
            }
}

bool cpu_bmm_takes(const dp_tensor *t)
{
    CBLAS_TRANSPOSE tr;
    if (t->dtype == DP_INT64)
        return tensor_is_contiguous(t);
    return (t->dtype == DP_FLOAT32 || t->dtype == DP_FLOAT64) &&
           blas_layout(t->shape[1], t->shape[2], t->stride[1], t->stride[2], &tr) != 0;
}

dp_status cpu_bmm(dp_tensor *out, dp_tensor *a, dp_tensor *b)
{
    int64_t batch = out->shape[0], m = out->shape[1], n = out->shape[2], k = a->shape[2];
    if (out->dtype == DP_INT64) {
        gemm_int64(out, a, b, batch, m, n, k);
        return DP_OK;
    }
    CBLAS_TRANSPOSE ta, tb;
    int64_t lda = blas_layout(m, k, a->stride[1], a->stride[2], &ta);
    int64_t ldb = blas_layout(k, n, b->stride[1], b->stride[2], &tb);
    if (!lda || !ldb)
        return dp_fail(DP_ERR_ARG, "bmm: internal error: operands need a unit stride");
    for (int64_t z = 0; z < batch; z++) {
        if (out->dtype == DP_FLOAT32)
            cblas_sgemm(CblasRowMajor, ta, tb, (int)m, (int)n, (int)k, 1.0f,
                        (const float *)tensor_ptr(a) + z * a->stride[0], (int)lda,
                        (const float *)tensor_ptr(b) + z * b->stride[0], (int)ldb, 0.0f,
                        (float *)tensor_ptr(out) + z * m * n, (int)(n > 0 ? n : 1));
        else
            cblas_dgemm(CblasRowMajor, ta, tb, (int)m, (int)n, (int)k, 1.0,
                        (const double *)tensor_ptr(a) + z * a->stride[0], (int)lda,
                        (const double *)tensor_ptr(b) + z * b->stride[0], (int)ldb, 0.0,
                        (double *)tensor_ptr(out) + z * m * n, (int)(n > 0 ? n : 1));
    }
    return DP_OK;
}

/* ---------------------------------------------------------------- linear */

/* Below this many multiply-adds a register-blocked loop beats OpenBLAS's
 * call overhead (the seed model's layers are 32x10x10). */
#define SMALL_GEMM 65536
#define SMALL_PAD 16384     /* elements of padded operand copies on the stack */
/* Operand rows are padded to whole blocks of columns: 8 for narrow
 * outputs (a 2-class head), else 16. */
#define PAD(n) ((n) <= 8 ? (int64_t)8 : (((n) + 15) & ~(int64_t)15))

/* Compiled twice, for the baseline x86-64 and for AVX2 with FMA (Haswell
 * on), chosen at load time by the CPU: the accumulators of a block fit in
 * two AVX registers instead of four SSE ones, and each update is one fma. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__)
#define SMALL_GEMM_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define SMALL_GEMM_CLONES
#endif

/* out (rows x cols) = init + A (rows x inner; A(r, k) = A[r*ars + k*acs])
 * @ Bp (inner x PAD(cols)), in blocks of NB columns held in registers (GCC
 * vectors: AVX registers in the x86-64-v3 clone, SSE pairs otherwise).
 * init is a padded row (the bias) or NULL for zeros. */
#define SMALL_GEMM_FN(T, name, NB)                                                       \
    SMALL_GEMM_CLONES static void name(int64_t rows, int64_t cols, int64_t inner, const T *A, \
                                       int64_t ars, int64_t acs, const T *Bp, const T *init, T *out) \
    {                                                                                    \
        typedef T vec __attribute__((vector_size(32)));   /* one AVX register */          \
        enum { W = 32 / sizeof(T), NV = NB / W };         /* a block is NV vectors */     \
        const int64_t pad = PAD(cols);                                                   \
        for (int64_t r = 0; r < rows; r++)                                               \
            for (int64_t jb = 0; jb < pad; jb += NB) {                                   \
                vec acc[NV], acc2[NV];   /* even and odd k: twice the chains in flight */ \
                for (int v = 0; v < NV; v++) {                                           \
                    vec zero = { 0 };                                                    \
                    acc[v] = acc2[v] = zero;                                             \
                    if (init)                                                            \
                        memcpy(&acc[v], init + jb + v * W, sizeof(vec));                 \
                }                                                                        \
                int64_t k = 0;                                                           \
                for (; k + 1 < inner; k += 2) {                                          \
                    const T a = A[r * ars + k * acs], a2 = A[r * ars + (k + 1) * acs];   \
                    const T *b = Bp + k * pad + jb;                                      \
                    for (int v = 0; v < NV; v++) {                                       \
                        vec bv, bv2;                                                     \
                        memcpy(&bv, b + v * W, sizeof(vec));                             \
                        memcpy(&bv2, b + pad + v * W, sizeof(vec));                      \
                        acc[v] += a * bv;                                                \
                        acc2[v] += a2 * bv2;                                             \
                    }                                                                    \
                }                                                                        \
                for (; k < inner; k++) {                                                 \
                    const T a = A[r * ars + k * acs];                                    \
                    for (int v = 0; v < NV; v++) {                                       \
                        vec bv;                                                          \
                        memcpy(&bv, Bp + k * pad + jb + v * W, sizeof(vec));             \
                        acc[v] += a * bv;                                                \
                    }                                                                    \
                }                                                                        \
                for (int v = 0; v < NV; v++)                                             \
                    acc[v] += acc2[v];                                                   \
                T res[NB];                                                               \
                memcpy(res, acc, sizeof res);                                            \
                int64_t n = cols - jb < NB ? cols - jb : NB;                             \
                T *o = out + r * cols + jb;  /* a loop: memcpy's call costs more here */ \
                for (int64_t t = 0; t < n; t++)                                          \
                    o[t] = res[t];                                                       \
            }                                                                            \
    }
SMALL_GEMM_FN(float, small_gemm_f32_8, 8)
SMALL_GEMM_FN(float, small_gemm_f32_16, 16)
SMALL_GEMM_FN(double, small_gemm_f64_8, 8)
SMALL_GEMM_FN(double, small_gemm_f64_16, 16)

/* the block width that PAD(cols) padded to */
#define SMALL_GEMM_PICK(T, name)                                                                         \
    static void name(int64_t rows, int64_t cols, int64_t inner, const T *A, int64_t ars, int64_t acs,     \
                     const T *Bp, const T *init, T *out)                                                  \
    {                                                                                                    \
        (cols <= 8 ? name##_8 : name##_16)(rows, cols, inner, A, ars, acs, Bp, init, out);               \
    }
SMALL_GEMM_PICK(float, small_gemm_f32)
SMALL_GEMM_PICK(double, small_gemm_f64)

/* dst (rows x PAD(cols)) = src (rows x cols; src(r, c) = src[r*rs + c*cs]), zero-padded */
#define PAD_COPY(T, dst, src, rows, cols, rs, cs)                                         \
    do {                                                                                  \
        const int64_t pad_ = PAD(cols);                                                   \
        for (int64_t r_ = 0; r_ < (rows); r_++)                                           \
            for (int64_t c_ = 0; c_ < pad_; c_++)                                         \
                (dst)[r_ * pad_ + c_] = c_ < (cols) ? (src)[r_ * (rs) + c_ * (cs)] : (T)0; \
    } while (0)

#define LINEAR_FWD(T, GEMM, SMALL)                                                       \
    do {                                                                                 \
        const T *X = (const T *)tensor_ptr(x), *W = (const T *)tensor_ptr(w);            \
        const T *B = b ? (const T *)tensor_ptr(b) : NULL;                                \
        T *O = (T *)tensor_ptr(out);                                                     \
        if (M * N * K <= SMALL_GEMM && K * PAD(N) <= SMALL_PAD) {                        \
            T wt[SMALL_PAD], bias[SMALL_PAD];                                            \
            PAD_COPY(T, wt, W, K, N, 1, K);                /* w^T, (K x PAD(N)) */       \
            if (B)                                                                       \
                PAD_COPY(T, bias, B, 1, N, 0, 1);                                        \
            SMALL(M, N, K, X, K, 1, wt, B ? bias : NULL, O);                             \
        } else {                                                                         \
            for (int64_t i = 0; i < M && B; i++)                                         \
                memcpy(O + i * N, B, sizeof(T) * (size_t)N);                             \
            GEMM(CblasRowMajor, CblasNoTrans, CblasTrans, (int)M, (int)N, (int)K, 1, X,  \
                 (int)K, W, (int)K, B ? 1 : 0, O, (int)N);                               \
        }                                                                                \
    } while (0)

/* out (M, N) = x (M, K) @ w (N, K)^T + b (N); all contiguous, one float dtype */
void cpu_linear(dp_tensor *out, dp_tensor *x, dp_tensor *w, dp_tensor *b)
{
    int64_t M = out->shape[0], N = out->shape[1], K = x->shape[1];
    if (out->dtype == DP_FLOAT32)
        LINEAR_FWD(float, cblas_sgemm, small_gemm_f32);
    else
        LINEAR_FWD(double, cblas_dgemm, small_gemm_f64);
}

#define LINEAR_BWD(T, GEMM, SMALL)                                                               \
    do {                                                                                         \
        const T *G = (const T *)tensor_ptr(g), *X = (const T *)tensor_ptr(x);                    \
        const T *W = (const T *)tensor_ptr(w);                                                   \
        T *DX = dx ? (T *)tensor_ptr(dx) : NULL, *DW = dw ? (T *)tensor_ptr(dw) : NULL;          \
        T *DB = db ? (T *)tensor_ptr(db) : NULL;                                                 \
        bool small = M * N * K <= SMALL_GEMM;                                                    \
        if (DX && small && N * PAD(K) <= SMALL_PAD) {                                            \
            T wp[SMALL_PAD];                                                                     \
            PAD_COPY(T, wp, W, N, K, K, 1);                /* w, (N x PAD(K)) */                 \
            SMALL(M, K, N, G, N, 1, wp, NULL, DX);                                               \
        } else if (DX) {                                                                         \
            GEMM(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)M, (int)K, (int)N, 1, G, (int)N, \
                 W, (int)K, 0, DX, (int)K);                                                      \
        }                                                                                        \
        if (DW && small && M * PAD(K) <= SMALL_PAD) {                                            \
            T xp[SMALL_PAD];                                                                     \
            PAD_COPY(T, xp, X, M, K, K, 1);                /* x, (M x PAD(K)) */                 \
            SMALL(N, K, M, G, 1, N, xp, NULL, DW);         /* g^T @ x */                         \
        } else if (DW) {                                                                         \
            GEMM(CblasRowMajor, CblasTrans, CblasNoTrans, (int)N, (int)K, (int)M, 1, G, (int)N,  \
                 X, (int)K, 0, DW, (int)K);                                                      \
        }                                                                                        \
        if (DB) {                                                                                \
            for (int64_t j = 0; j < N; j++)                                                      \
                DB[j] = 0;                                                                       \
            for (int64_t i = 0; i < M; i++)                                                      \
                for (int64_t j = 0; j < N; j++)                                                  \
                    DB[j] += G[i * N + j];                                                       \
        }                                                                                        \
    } while (0)

/* dx = g @ w, dw = g^T @ x, db = column sums of g; any may be NULL */
void cpu_linear_backward(dp_tensor *dx, dp_tensor *dw, dp_tensor *db, dp_tensor *g, dp_tensor *x, dp_tensor *w)
{
    int64_t M = g->shape[0], N = g->shape[1], K = x->shape[1];
    if (g->dtype == DP_FLOAT32)
        LINEAR_BWD(float, cblas_sgemm, small_gemm_f32);
    else
        LINEAR_BWD(double, cblas_dgemm, small_gemm_f64);
}
