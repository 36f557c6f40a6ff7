/*
 * conv.c — 2-D convolution on the CPU: the forward and both gradients of
 * contiguous float32/float64 tensors, as GEMMs on im2col columns; what
 * conv_direct.c computes directly (float32 on CPUs with AVX-512) goes
 * there.
 *
 * The columns of the whole batch would be C*kh*kw times the input (the
 * MNIST CNN's second layer: 85 MB), written once and read once from
 * memory. Here each image is cut into tiles of whole output rows whose
 * columns fit in the L2 cache, and each tile's columns go straight into
 * its GEMMs while they are still there: the output tile (forward), the
 * weight's gradient (accumulated over tiles) and the input's gradient
 * (the columns' gradient folded back at once). A 1x1 convolution with
 * stride 1 and no padding reads the input itself as its columns.
 */
#include "cpu/conv_direct.h"

#include <cblas.h>
#include <stdlib.h>
#include <string.h>

/* The columns of one tile, in elements: 64 K floats (256 KB) leave room
 * in a 512 KB-1 MB L2 for the GEMM's packed panels of the other operand. */
#define TILE_ELEMS 65536

typedef struct {
    int64_t N, C, H, W;          /* input */
    int64_t O, kh, kw, Ho, Wo;   /* weight (O, C/groups, kh, kw), output (N, O, Ho, Wo) */
    int64_t K, L;                /* C*kh*kw rows of columns, Ho*Wo of them per image */
    int64_t groups, Kg, Og;      /* per group: K/groups rows, O/groups outputs */
    int64_t rows;                /* output rows per tile */
    bool direct;                 /* 1x1, stride 1, no padding: the input is the columns */
    size_t es;
    const cpu_conv_args *a;
} conv_plan;

static void plan_of(conv_plan *p, const dp_tensor *x, const dp_tensor *w, const cpu_conv_args *a)
{
    const cpu_unfold_args *u = &a->u;
    p->N = x->shape[0], p->C = x->shape[1], p->H = x->shape[2], p->W = x->shape[3];
    p->O = w->shape[0], p->kh = w->shape[2], p->kw = w->shape[3];
    p->Ho = u->out_h, p->Wo = u->out_w;
    p->K = p->C * p->kh * p->kw, p->L = p->Ho * p->Wo;
    p->groups = a->groups, p->Kg = p->K / a->groups, p->Og = p->O / a->groups;
    p->direct = p->kh == 1 && p->kw == 1 && u->stride[0] == 1 && u->stride[1] == 1 && u->padding[0] == 0 &&
                u->padding[1] == 0;
    int64_t per_row = p->K * p->Wo;
    p->rows = p->direct ? p->Ho : TILE_ELEMS / (per_row > 0 ? per_row : 1);
    if (p->rows < 1)
        p->rows = 1;
    if (p->rows > p->Ho)
        p->rows = p->Ho;
    p->es = dp_dtype_size(x->dtype);
    p->a = a;
}

/* C (m x n, ldc) = alpha op(A) op(B) + beta C in x's dtype, row-major */
static void gemm(dp_dtype dt, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const void *A, int64_t lda,
                 const void *B, int64_t ldb, double beta, void *Cm, int64_t ldc)
{
    CBLAS_TRANSPOSE TA = ta ? CblasTrans : CblasNoTrans, TB = tb ? CblasTrans : CblasNoTrans;
    if (m == 0 || n == 0)
        return;
    if (k == 0) {   /* no channels or no outputs: C = beta C, which BLAS would refuse (a leading dimension 0) */
        for (int64_t i = 0; i < m && beta == 0; i++)
            memset((char *)Cm + i * ldc * (int64_t)dp_dtype_size(dt), 0, dp_dtype_size(dt) * (size_t)n);
        return;
    }
    if (dt == DP_FLOAT32)
        cblas_sgemm(CblasRowMajor, TA, TB, (int)m, (int)n, (int)k, 1.0f, A, (int)lda, B, (int)ldb, (float)beta, Cm,
                    (int)ldc);
    else
        cblas_dgemm(CblasRowMajor, TA, TB, (int)m, (int)n, (int)k, 1.0, A, (int)lda, B, (int)ldb, beta, Cm,
                    (int)ldc);
}

/* The output columns [lo, hi) of a row whose input column is w0 + ow*s
 * that fall inside [0, W). */
static void inside_range(int64_t w0, int64_t s, int64_t W, int64_t Wo, int64_t *lo, int64_t *hi)
{
    *lo = w0 >= 0 ? 0 : (-w0 + s - 1) / s;
    *hi = w0 >= W ? 0 : (W - 1 - w0) / s + 1;
    if (*hi > Wo)
        *hi = Wo;
    if (*lo > *hi)
        *lo = *hi;
}

/* cols (K x (oh1-oh0)*Wo) = the columns of image x (C, H, W) for output
 * rows [oh0, oh1); fold: x += cols instead (the gradient's way back). */
#define IM2COL_FN(T, name)                                                                         \
    static void name(const conv_plan *p, T *x, T *cols, int64_t oh0, int64_t oh1, bool fold)      \
    {                                                                                              \
        const cpu_unfold_args *u = &p->a->u;                                                       \
        int64_t sh = u->stride[0], sw = u->stride[1], Lt = (oh1 - oh0) * p->Wo;                    \
        for (int64_t c = 0; c < p->C; c++)                                                         \
            for (int64_t i = 0; i < p->kh; i++)                                                    \
                for (int64_t j = 0; j < p->kw; j++) {                                              \
                    T *row = cols + ((c * p->kh + i) * p->kw + j) * Lt;                            \
                    int64_t w0 = j * u->dilation[1] - u->padding[1], lo, hi;                       \
                    inside_range(w0, sw, p->W, p->Wo, &lo, &hi);                                   \
                    for (int64_t oh = oh0; oh < oh1; oh++) {                                       \
                        T *d = row + (oh - oh0) * p->Wo;                                           \
                        int64_t h = oh * sh - u->padding[0] + i * u->dilation[0];                  \
                        if (h < 0 || h >= p->H) {                                                  \
                            if (!fold)                                                             \
                                memset(d, 0, sizeof(T) * (size_t)p->Wo);                           \
                            continue;                                                              \
                        }                                                                          \
                        T *src = x + (c * p->H + h) * p->W;                                        \
                        if (fold) {                                                                \
                            for (int64_t ow = lo; ow < hi; ow++)                                   \
                                src[w0 + ow * sw] += d[ow];                                        \
                            continue;                                                              \
                        }                                                                          \
                        for (int64_t ow = 0; ow < lo; ow++)                                        \
                            d[ow] = 0;                                                             \
                        if (sw == 1)                                                               \
                            memcpy(d + lo, src + w0 + lo, sizeof(T) * (size_t)(hi - lo));          \
                        else                                                                       \
                            for (int64_t ow = lo; ow < hi; ow++)                                   \
                                d[ow] = src[w0 + ow * sw];                                         \
                        for (int64_t ow = hi; ow < p->Wo; ow++)                                    \
                            d[ow] = 0;                                                             \
                    }                                                                              \
                }                                                                                  \
    }
IM2COL_FN(float, im2col_f32)
IM2COL_FN(double, im2col_f64)

static void im2col(const conv_plan *p, dp_dtype dt, void *x, void *cols, int64_t oh0, int64_t oh1, bool fold)
{
    if (dt == DP_FLOAT32)
        im2col_f32(p, x, cols, oh0, oh1, fold);
    else
        im2col_f64(p, x, cols, oh0, oh1, fold);
}

/* out (O, L) rows = b[o] (or zeros); db[o] = the sum of g's (N, O, L)
 * over N and L, in eight running sums (one chain of dependent adds would
 * take longer than the GEMMs of a small convolution). */
#define BIAS_FNS(T, fill, grad)                                                 \
    static void fill(const conv_plan *p, T *out, const T *b)                   \
    {                                                                          \
        for (int64_t o = 0; o < p->O; o++)                                     \
            for (int64_t l = 0; l < p->L; l++)                                 \
                out[o * p->L + l] = b ? b[o] : (T)0;                           \
    }                                                                          \
    static void grad(const conv_plan *p, const T *g, T *db)                    \
    {                                                                          \
        for (int64_t o = 0; o < p->O; o++) {                                   \
            double s = 0;                                                      \
            for (int64_t n = 0; n < p->N; n++) {                               \
                const T *r = g + (n * p->O + o) * p->L;                        \
                T acc[8] = { 0 }, t = 0;                                       \
                int64_t l = 0;                                                 \
                for (; l + 8 <= p->L; l += 8)                                  \
                    for (int k = 0; k < 8; k++)                                \
                        acc[k] += r[l + k];                                    \
                for (; l < p->L; l++)                                          \
                    t += r[l];                                                 \
                for (int k = 0; k < 8; k++)                                    \
                    t += acc[k];                                               \
                s += t;                                                        \
            }                                                                  \
            db[o] = (T)s;                                                      \
        }                                                                      \
    }
BIAS_FNS(float, fill_bias_f32, bias_grad_f32)
BIAS_FNS(double, fill_bias_f64, bias_grad_f64)

static void fill_bias(const conv_plan *p, dp_dtype dt, void *out, const void *b)
{
    if (dt == DP_FLOAT32)
        fill_bias_f32(p, out, b);
    else
        fill_bias_f64(p, out, b);
}

/* The columns of image n's tile of output rows [oh0, oh1) and their
 * leading dimension: the input itself on the direct path, else written to
 * cols. */
static const char *tile_columns(const conv_plan *p, dp_dtype dt, char *xn, char *cols, int64_t oh0, int64_t oh1,
                                int64_t *ld)
{
    if (p->direct) {
        *ld = p->L;
        return xn + oh0 * p->Wo * (int64_t)p->es;
    }
    im2col(p, dt, xn, cols, oh0, oh1, false);
    *ld = (oh1 - oh0) * p->Wo;
    return cols;
}

static void *scratch_for(const conv_plan *p)
{
    return p->direct ? malloc(1) : malloc(p->es * (size_t)(p->K * p->rows * p->Wo));
}

dp_status cpu_conv2d(dp_tensor *out, dp_tensor *x, dp_tensor *w, dp_tensor *b, const cpu_conv_args *a)
{
    if (conv_direct_takes(x, w, a))
        return conv_direct_forward(out, x, w, b, a);
    conv_plan p;
    plan_of(&p, x, w, a);
    dp_dtype dt = x->dtype;
    int64_t es = (int64_t)p.es;
    char *cols = scratch_for(&p);
    if (!cols)
        return dp_fail(DP_ERR_MEMORY, "conv2d: out of memory for the columns of %lld output rows",
                       (long long)p.rows);
    for (int64_t n = 0; n < p.N; n++) {
        char *xn = tensor_ptr(x) + n * p.C * p.H * p.W * es, *on = tensor_ptr(out) + n * p.O * p.L * es;
        fill_bias(&p, dt, on, b ? tensor_ptr(b) : NULL);
        for (int64_t oh0 = 0; oh0 < p.Ho; oh0 += p.rows) {
            int64_t oh1 = oh0 + p.rows < p.Ho ? oh0 + p.rows : p.Ho, Lt = (oh1 - oh0) * p.Wo, ld;
            const char *B = tile_columns(&p, dt, xn, cols, oh0, oh1, &ld);
            for (int64_t g = 0; g < p.groups; g++)   /* out[g] (Og x Lt) += w[g] (Og x Kg) @ cols[g] (Kg x Lt) */
                gemm(dt, false, false, p.Og, Lt, p.Kg, tensor_ptr(w) + g * p.Og * p.Kg * es, p.Kg,
                     B + g * p.Kg * ld * es, ld, 1.0, on + (g * p.Og * p.L + oh0 * p.Wo) * es, p.L);
        }
    }
    free(cols);
    return DP_OK;
}

static void bias_grad(const conv_plan *p, dp_dtype dt, dp_tensor *db, const dp_tensor *g)
{
    if (dt == DP_FLOAT32)
        bias_grad_f32(p, (const float *)tensor_ptr(g), (float *)tensor_ptr(db));
    else
        bias_grad_f64(p, (const double *)tensor_ptr(g), (double *)tensor_ptr(db));
}

/* The gradients of one tile of image n: dw += g (Og x Lt) @ cols^T per
 * group, and the columns' gradient w^T @ g folded into dxn. */
static void tile_backward(const conv_plan *p, dp_dtype dt, const dp_tensor *w, char *gn, char *xn, char *dxn,
                          dp_tensor *dw, char *cols, char *dcols, int64_t oh0, int64_t oh1)
{
    int64_t es = (int64_t)p->es, Lt = (oh1 - oh0) * p->Wo, ld;
    char *gt = gn + oh0 * p->Wo * es;
    if (dw) {
        const char *B = tile_columns(p, dt, xn, cols, oh0, oh1, &ld);
        for (int64_t g = 0; g < p->groups; g++)
            gemm(dt, false, true, p->Og, p->Kg, Lt, gt + g * p->Og * p->L * es, p->L, B + g * p->Kg * ld * es, ld,
                 1.0, tensor_ptr(dw) + g * p->Og * p->Kg * es, p->Kg);
    }
    if (!dxn)
        return;
    char *D = p->direct ? dxn : dcols;   /* the direct path writes dx's rows in place */
    int64_t ldd = p->direct ? p->L : Lt;
    for (int64_t g = 0; g < p->groups; g++)   /* dcols[g] (Kg x Lt) = w[g]^T (Kg x Og) @ g[g] (Og x Lt) */
        gemm(dt, true, false, p->Kg, Lt, p->Og, tensor_ptr(w) + g * p->Og * p->Kg * es, p->Kg,
             gt + g * p->Og * p->L * es, p->L, 0.0, D + g * p->Kg * ldd * es, ldd);
    if (!p->direct)
        im2col(p, dt, dxn, dcols, oh0, oh1, true);
}

/* dx and dw, either of them NULL, as GEMMs on each tile's columns */
static dp_status gemm_backward(const conv_plan *p, dp_tensor *dx, dp_tensor *dw, dp_tensor *g, dp_tensor *x,
                               dp_tensor *w)
{
    dp_dtype dt = x->dtype;
    int64_t es = (int64_t)p->es;
    size_t tile = p->es * (size_t)(p->K * p->rows * p->Wo);
    char *cols = scratch_for(p), *dcols = dx && !p->direct ? malloc(tile) : NULL;
    if (!cols || (dx && !p->direct && !dcols)) {
        free(cols);
        free(dcols);
        return dp_fail(DP_ERR_MEMORY, "conv2d backward: out of memory for the columns of %lld output rows",
                       (long long)p->rows);
    }
    if (dx)
        memset(tensor_ptr(dx), 0, p->es * (size_t)(p->N * p->C * p->H * p->W));
    if (dw)
        memset(tensor_ptr(dw), 0, p->es * (size_t)(p->O * p->Kg));
    for (int64_t n = 0; (dx || dw) && n < p->N; n++) {
        char *xn = tensor_ptr(x) + n * p->C * p->H * p->W * es, *gn = tensor_ptr(g) + n * p->O * p->L * es;
        char *dxn = dx ? tensor_ptr(dx) + n * p->C * p->H * p->W * es : NULL;
        for (int64_t oh0 = 0; oh0 < p->Ho; oh0 += p->rows)
            tile_backward(p, dt, w, gn, xn, dxn, dw, cols, dcols, oh0, oh0 + p->rows < p->Ho ? oh0 + p->rows : p->Ho);
    }
    free(cols);
    free(dcols);
    return DP_OK;
}

dp_status cpu_conv2d_backward(dp_tensor *dx, dp_tensor *dw, dp_tensor *db, dp_tensor *g, dp_tensor *x, dp_tensor *w,
                              const cpu_conv_args *a)
{
    conv_plan p;
    plan_of(&p, x, w, a);
    dp_status st;
    if (conv_direct_takes(x, w, a)) {
        bool dx_direct = conv_direct_takes_input_grad(x);
        st = conv_direct_backward(dx_direct ? dx : NULL, dw, g, x, w, a);
        if (!st && dx && !dx_direct)
            st = gemm_backward(&p, dx, NULL, g, x, w);
    } else {
        st = gemm_backward(&p, dx, dw, g, x, w);
    }
    if (!st && db)
        bias_grad(&p, x->dtype, db, g);
    return st;
}
