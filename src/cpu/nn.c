/*
 * nn.c — CPU kernels for the fused nn ops: cross-entropy (forward and
 * backward in one place so the formulas sit together), im2col/col2im and
 * max pooling.
 * Inputs are contiguous (src/core/nn.c makes them so).
 */
#include "cpu/cpu.h"
#include "cpu/vmath.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- cross-entropy */

static double class_weight(const dp_tensor *weight, int64_t c)
{
    return weight ? ((const double *)tensor_ptr(weight))[c] : 1.0;
}

static dp_status bad_target(int64_t t, int64_t C)
{
    return dp_fail(DP_ERR_INDEX, "cross_entropy: target %lld is out of bounds (expected a class index in "
                   "[0, %lld) or ignore_index)", (long long)t, (long long)C);
}

/* Row i's log-probabilities into logp; with logits (not log_probs) and a
 * prow (only when a backward will follow) also the probabilities, which
 * the backward reuses instead of calling exp again. */
static void row_log_probs(const cpu_ce_args *a, int64_t i, int64_t C, double *logp, double *prow)
{
    int dtype = a->input->dtype;
    size_t es = dp_dtype_size(dtype);
    const char *row = tensor_ptr(a->input) + i * C * (int64_t)es;
    double m = -INFINITY, sum = 0;
    if (dtype == DP_FLOAT32) {   /* the common case, without a conversion call per element */
        for (int64_t j = 0; j < C; j++)
            logp[j] = ((const float *)row)[j];
    } else {
        for (int64_t j = 0; j < C; j++)
            logp[j] = dtype_load(dtype, row + j * (int64_t)es);
    }
    for (int64_t j = 0; j < C; j++)
        if (logp[j] > m) m = logp[j];
    if (a->log_probs)
        return;
    for (int64_t j = 0; j < C; j++) {
        /* float32 logits: expf's error is below the float32 result's rounding */
        double e = dtype == DP_FLOAT32 ? (double)expf((float)(logp[j] - m)) : exp(logp[j] - m);
        sum += e;
        if (prow)
            prow[j] = e;
    }
    double lse = m + log(sum), inv = 1 / sum;
    for (int64_t j = 0; j < C; j++) {
        logp[j] -= lse;
        if (prow)
            prow[j] *= inv;
    }
}

/* float32 logits without label smoothing (a classifier's): row x's
 * log-sum-exp, and with prow (only when a backward will follow) its
 * probabilities in float32; vm_expf twice, once for the sum and once for
 * prow, is cheaper than a third pass over the row to scale it. */
#define LANES 8
VM_CLONES static double logsumexp_row_f32(const float *restrict x, int64_t C, float *restrict prow)
{
    const float m = vm_max_f32(x, C);
    double lane[LANES] = { 0 }, sum = 0;
    int64_t j;
    for (j = 0; j + LANES <= C; j += LANES)
        for (int k = 0; k < LANES; k++)
            lane[k] += vm_expf(x[j + k] - m);
    for (; j < C; j++)
        sum += vm_expf(x[j] - m);
    for (int k = 0; k < LANES; k++)
        sum += lane[k];
    if (prow) {
        double inv = 1 / sum;
        for (j = 0; j < C; j++)
            prow[j] = (float)(vm_expf(x[j] - m) * inv);
    }
    return m + log(sum);
}

/* The per-sample losses, reduced into out; the mean's denominator; and
 * (for logits) the softmax into a->probs (N x C, float32 where the input
 * is and no label smoothing, else float64). */
dp_status cpu_cross_entropy(dp_tensor *out, const cpu_ce_args *a)
{
    int64_t N = a->input->shape[0], C = a->input->shape[1];
    double wsum = 0, total = 0, eps = a->label_smoothing;
    double *logp = malloc(sizeof(double) * (size_t)(C > 0 ? C : 1));
    double *probs = a->probs ? (double *)tensor_ptr(a->probs) : NULL;
    float *probs32 = a->probs && a->probs->dtype == DP_FLOAT32 ? (float *)tensor_ptr(a->probs) : NULL;
    size_t es = dp_dtype_size(out->dtype);
    if (!logp)
        return dp_fail(DP_ERR_MEMORY, "cross_entropy: out of memory");
    for (int64_t i = 0; i < N; i++) {
        int64_t t = ((const int64_t *)tensor_ptr(a->target))[i];
        if (a->reduction == CE_REDUCE_NONE)
            dtype_store(out->dtype, tensor_ptr(out) + i * (int64_t)es, 0.0);
        if (t == a->ignore_index)
            continue;
        if (t < 0 || t >= C) {
            free(logp);
            return bad_target(t, C);
        }
        double wt = class_weight(a->weight, t), loss;
        if (a->log_probs && eps == 0) {   /* nll_loss: only the target's entry counts */
            size_t ies = dp_dtype_size(a->input->dtype);
            loss = -wt * dtype_load(a->input->dtype, tensor_ptr(a->input) + (i * C + t) * (int64_t)ies);
            if (a->reduction == CE_REDUCE_NONE)
                dtype_store(out->dtype, tensor_ptr(out) + i * (int64_t)es, loss);
            total += loss;
            wsum += wt;
            continue;
        }
        if (a->input->dtype == DP_FLOAT32 && eps == 0 && !a->log_probs) {
            const float *x = (const float *)tensor_ptr(a->input) + i * C;
            loss = -wt * (x[t] - logsumexp_row_f32(x, C, probs32 ? probs32 + i * C : NULL));
            if (a->reduction == CE_REDUCE_NONE)
                dtype_store(out->dtype, tensor_ptr(out) + i * (int64_t)es, loss);
            total += loss;
            wsum += wt;
            continue;
        }
        row_log_probs(a, i, C, logp, probs ? probs + i * C : NULL);
        loss = -wt * logp[t] * (1 - eps);
        if (eps > 0) {
            double smooth = 0;
            for (int64_t j = 0; j < C; j++)
                smooth -= class_weight(a->weight, j) * logp[j];
            loss += eps / (double)C * smooth;
        }
        if (a->reduction == CE_REDUCE_NONE)
            dtype_store(out->dtype, tensor_ptr(out) + i * (int64_t)es, loss);
        total += loss;
        wsum += wt;
    }
    free(logp);
    *(double *)tensor_ptr(a->denom) = wsum;
    if (a->reduction != CE_REDUCE_NONE)
        dtype_store(out->dtype, tensor_ptr(out), a->reduction == CE_REDUCE_MEAN ? total / wsum : total);
    return DP_OK;
}

/* dinput[i, k] = scale_i * ((1-eps) w_t (p_k - [k==t]) + eps/C (p_k sum_j w_j - w_k)),
 * or -scale_i w_t [k==t] for log-probability inputs; scale_i is g_i, or
 * g for a sum, or g / denom for a mean. */
dp_status cpu_cross_entropy_backward(dp_tensor *dinput, dp_tensor *g, const cpu_ce_args *a)
{
    int64_t N = dinput->shape[0], C = dinput->shape[1];
    double eps = a->label_smoothing, wall = 0;
    size_t es = dp_dtype_size(dinput->dtype), gs = dp_dtype_size(g->dtype);
    const double *probs = a->probs ? (const double *)tensor_ptr(a->probs) : NULL;
    double g0 = dtype_load(g->dtype, tensor_ptr(g));
    if (a->reduction == CE_REDUCE_MEAN)
        g0 /= *(const double *)tensor_ptr(a->denom);
    for (int64_t j = 0; j < C; j++)
        wall += class_weight(a->weight, j);
    for (int64_t i = 0; i < N; i++) {
        char *row = tensor_ptr(dinput) + i * C * (int64_t)es;
        int64_t t = ((const int64_t *)tensor_ptr(a->target))[i];
        double sc = a->reduction == CE_REDUCE_NONE ? dtype_load(g->dtype, tensor_ptr(g) + i * (int64_t)gs) : g0;
        bool skip = t == a->ignore_index || sc == 0;
        double wt = skip ? 0 : class_weight(a->weight, t);
        if (skip || a->log_probs) {   /* zero but at the target: the floating dtypes' 0 is all zero bits */
            memset(row, 0, (size_t)C * es);
            if (!skip)
                dtype_store(dinput->dtype, row + t * (int64_t)es, -sc * wt);
            continue;
        }
        if (a->probs->dtype == DP_FLOAT32) {   /* float32 logits without smoothing */
            const float *prow = (const float *)tensor_ptr(a->probs) + i * C;
            float *d = (float *)row, f = (float)(wt * sc);
            for (int64_t k = 0; k < C; k++)
                d[k] = f * prow[k];
            d[t] = (float)(wt * sc * ((double)prow[t] - 1));
            continue;
        }
        const double *prow = probs + i * C;
        if (eps == 0 && dinput->dtype == DP_FLOAT32) {   /* the common case, stored directly */
            float *d = (float *)row;
            double f = wt * sc;
            for (int64_t k = 0; k < C; k++)
                d[k] = (float)(f * prow[k]);
            d[t] = (float)(f * (prow[t] - 1));
            continue;
        }
        for (int64_t k = 0; k < C; k++) {
            double p = prow[k];
            double d = (1 - eps) * wt * (p - (k == t));
            if (eps > 0)
                d += eps / (double)C * (p * wall - class_weight(a->weight, k));
            dtype_store(dinput->dtype, row + k * (int64_t)es, d * sc);
        }
    }
    return DP_OK;
}

/* A row of nll_loss's gradient through log_softmax: f (exp(y) - onehot(t)) */
VM_CLONES static void nll_log_softmax_row_f32(float *restrict d, const float *restrict y, int64_t C, int64_t t, float f)
{
    for (int64_t k = 0; k < C; k++)
        d[k] = f * vm_expf(y[k]);
    d[t] -= f;
}

dp_status cpu_nll_log_softmax_backward(dp_tensor *dx, dp_tensor *g, dp_tensor *y, const cpu_ce_args *a)
{
    int64_t N = dx->shape[0], C = dx->shape[1];
    size_t es = dp_dtype_size(dx->dtype), gs = dp_dtype_size(g->dtype);
    double g0 = dtype_load(g->dtype, tensor_ptr(g));
    if (a->reduction == CE_REDUCE_MEAN)
        g0 /= *(const double *)tensor_ptr(a->denom);
    for (int64_t i = 0; i < N; i++) {
        char *row = tensor_ptr(dx) + i * C * (int64_t)es;
        const char *yrow = tensor_ptr(y) + i * C * (int64_t)es;
        int64_t t = ((const int64_t *)tensor_ptr(a->target))[i];
        double sc = a->reduction == CE_REDUCE_NONE ? dtype_load(g->dtype, tensor_ptr(g) + i * (int64_t)gs) : g0;
        if (t == a->ignore_index || sc == 0) {   /* the floating dtypes' 0 is all zero bits */
            memset(row, 0, (size_t)C * es);
            continue;
        }
        double f = sc * class_weight(a->weight, t);
        if (dx->dtype == DP_FLOAT32) {
            nll_log_softmax_row_f32((float *)row, (const float *)yrow, C, t, (float)f);
            continue;
        }
        for (int64_t k = 0; k < C; k++)
            dtype_store(dx->dtype, row + k * (int64_t)es,
                        f * (exp(dtype_load(y->dtype, yrow + k * (int64_t)es)) - (k == t)));
    }
    return DP_OK;
}

/* ---------------------------------------------------------------- im2col */

/* cols (N, C*kh*kw, Ho*Wo) from x (N, C, H, W); fold = 1 adds cols back
 * into x instead (the backward). */
static void im2col_walk(dp_tensor *x, dp_tensor *cols, const cpu_unfold_args *u, int fold)
{
    int64_t N = x->shape[0], C = x->shape[1], H = x->shape[2], W = x->shape[3];
    int64_t kh = u->kernel[0], kw = u->kernel[1], L = u->out_h * u->out_w;
    size_t es = dp_dtype_size(x->dtype);
    char *xp = tensor_ptr(x), *cp = tensor_ptr(cols);
    for (int64_t n = 0; n < N; n++)
        for (int64_t c = 0; c < C; c++)
            for (int64_t i = 0; i < kh; i++)
                for (int64_t j = 0; j < kw; j++) {
                    int64_t col = (c * kh + i) * kw + j;
                    char *crow = cp + ((n * C * kh * kw + col) * L) * (int64_t)es;
                    for (int64_t oh = 0; oh < u->out_h; oh++) {
                        int64_t h = oh * u->stride[0] - u->padding[0] + i * u->dilation[0];
                        for (int64_t ow = 0; ow < u->out_w; ow++) {
                            int64_t w = ow * u->stride[1] - u->padding[1] + j * u->dilation[1];
                            char *cv = crow + (oh * u->out_w + ow) * (int64_t)es;
                            bool inside = h >= 0 && h < H && w >= 0 && w < W;
                            char *xv = inside ? xp + (((n * C + c) * H + h) * W + w) * (int64_t)es : NULL;
                            if (fold) {
                                if (inside)
                                    dtype_store(x->dtype, xv, dtype_load(x->dtype, xv) + dtype_load(x->dtype, cv));
                            } else {
                                dtype_store(x->dtype, cv, inside ? dtype_load(x->dtype, xv) : u->pad_value);
                            }
                        }
                    }
                }
}

dp_status cpu_unfold(dp_tensor *cols, dp_tensor *x, const cpu_unfold_args *u)
{
    im2col_walk(x, cols, u, 0);
    return DP_OK;
}

dp_status cpu_fold_add(dp_tensor *x, dp_tensor *cols, const cpu_unfold_args *u)
{
    im2col_walk(x, cols, u, 1);
    return DP_OK;
}

/* ---------------------------------------------------------------- max pooling */

/* The taps [lo, hi) of a window starting at s0 (step d, k taps) that fall
 * inside [0, n). */
static void taps_inside(int64_t s0, int64_t d, int64_t k, int64_t n, int64_t *lo, int64_t *hi)
{
    if (d == 1) {   /* no division: it would cost more than the window's compares */
        *lo = s0 >= 0 ? 0 : -s0;
        *hi = n - s0;
    } else {
        *lo = s0 >= 0 ? 0 : (-s0 + d - 1) / d;
        *hi = s0 >= n ? 0 : (n - 1 - s0) / d + 1;
    }
    if (*hi > k)
        *hi = k;
    if (*lo > *hi)
        *lo = *hi;
}

/* Each window's largest element and where it is (h*W + w in its plane):
 * the first of equal ones, a NaN above all numbers, and for a window of
 * -inf alone its first element, as PyTorch picks. */
#define MAX_POOL_FN(T, name)                                                                  \
    static void name(const T *x, T *out, int64_t *arg, int64_t planes, int64_t H, int64_t W,  \
                     const cpu_unfold_args *u)                                                \
    {                                                                                         \
        int64_t dh = u->dilation[0], dw = u->dilation[1];                                     \
        for (int64_t pl = 0; pl < planes; pl++) {                                             \
            const T *xp = x + pl * H * W;                                                     \
            for (int64_t oh = 0; oh < u->out_h; oh++) {                                       \
                int64_t h0 = oh * u->stride[0] - u->padding[0], ilo, ihi;                     \
                taps_inside(h0, dh, u->kernel[0], H, &ilo, &ihi);                             \
                for (int64_t ow = 0; ow < u->out_w; ow++) {                                   \
                    int64_t w0 = ow * u->stride[1] - u->padding[1], jlo, jhi;                 \
                    taps_inside(w0, dw, u->kernel[1], W, &jlo, &jhi);                         \
                    int64_t at = ilo < ihi && jlo < jhi ? (h0 + ilo * dh) * W + w0 + jlo * dw : -1; \
                    T best = -INFINITY;                                                       \
                    for (int64_t i = ilo; i < ihi; i++) {                                     \
                        const T *r = xp + (h0 + i * dh) * W + w0;                             \
                        for (int64_t j = jlo; j < jhi; j++) {                                 \
                            T v = r[j * dw];   /* no branch: random data mispredicts it */    \
                            bool take = v > best || v != v;                                   \
                            best = take ? v : best;                                           \
                            at = take ? (h0 + i * dh) * W + w0 + j * dw : at;                 \
                        }                                                                     \
                    }                                                                         \
                    int64_t o = (pl * u->out_h + oh) * u->out_w + ow;                         \
                    out[o] = best;                                                            \
                    if (arg)                                                                  \
                        arg[o] = at;                                                          \
                }                                                                             \
            }                                                                                 \
        }                                                                                     \
    }
MAX_POOL_FN(float, max_pool_f32)
MAX_POOL_FN(double, max_pool_f64)

dp_status cpu_max_pool2d(dp_tensor *out, dp_tensor *argmax, dp_tensor *x, const cpu_unfold_args *u)
{
    int64_t planes = x->shape[0] * x->shape[1], H = x->shape[2], W = x->shape[3];
    int64_t *arg = argmax ? (int64_t *)tensor_ptr(argmax) : NULL;
    if (x->dtype == DP_FLOAT32)
        max_pool_f32((const float *)tensor_ptr(x), (float *)tensor_ptr(out), arg, planes, H, W, u);
    else if (x->dtype == DP_FLOAT64)
        max_pool_f64((const double *)tensor_ptr(x), (double *)tensor_ptr(out), arg, planes, H, W, u);
    else
        return dp_fail(DP_ERR_DTYPE, "max_pool2d: expected float32 or float64, got %s", dp_dtype_name(x->dtype));
    return DP_OK;
}

dp_status cpu_max_pool2d_backward(dp_tensor *dx, dp_tensor *g, dp_tensor *argmax)
{
    int64_t planes = dx->shape[0] * dx->shape[1], HW = dx->shape[2] * dx->shape[3];
    int64_t L = g->shape[2] * g->shape[3];
    const int64_t *arg = (const int64_t *)tensor_ptr(argmax);
    memset(tensor_ptr(dx), 0, dp_dtype_size(dx->dtype) * (size_t)(planes * HW));
    for (int64_t pl = 0; pl < planes; pl++)
        for (int64_t l = 0; l < L; l++) {
            int64_t at = arg[pl * L + l];
            if (at < 0)
                continue;
            if (dx->dtype == DP_FLOAT32)
                ((float *)tensor_ptr(dx))[pl * HW + at] += ((const float *)tensor_ptr(g))[pl * L + l];
            else
                ((double *)tensor_ptr(dx))[pl * HW + at] += ((const double *)tensor_ptr(g))[pl * L + l];
        }
    return DP_OK;
}
