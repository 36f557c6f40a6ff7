/*
 * nn.c — CPU kernels for the fused nn ops: cross-entropy (forward and
 * backward in one place so the formulas sit together) and im2col/col2im.
 * Inputs are contiguous (src/core/nn.c makes them so).
 */
#include "cpu/cpu.h"

#include <math.h>
#include <stdlib.h>

/* ---------------------------------------------------------------- cross-entropy */

/* Row i of input (C classes): fills logp (C values) and returns nothing;
 * with log_probs the input already holds log-probabilities. */
static void row_log_probs(const dp_tensor *input, int64_t i, int64_t C, int log_probs, double *logp)
{
    size_t es = dp_dtype_size(input->dtype);
    const char *row = tensor_ptr(input) + i * C * (int64_t)es;
    double m = -INFINITY, sum = 0;
    for (int64_t j = 0; j < C; j++) {
        logp[j] = dtype_load(input->dtype, row + j * (int64_t)es);
        if (logp[j] > m) m = logp[j];
    }
    if (log_probs)
        return;
    for (int64_t j = 0; j < C; j++)
        sum += exp(logp[j] - m);
    double lse = m + log(sum);
    for (int64_t j = 0; j < C; j++)
        logp[j] -= lse;
}

static double class_weight(const dp_tensor *weight, int64_t c)
{
    return weight ? dtype_load(weight->dtype, tensor_ptr(weight) + c * (int64_t)dp_dtype_size(weight->dtype)) : 1.0;
}

static dp_status bad_target(int64_t t, int64_t C)
{
    return dp_fail(DP_ERR_INDEX, "cross_entropy: target %lld is out of bounds (expected a class index in "
                   "[0, %lld) or ignore_index)", (long long)t, (long long)C);
}

/* Per-sample losses into rows (N doubles) and the mean's denominator. */
dp_status cpu_cross_entropy(double *rows, double *denom, const cpu_ce_args *a)
{
    int64_t N = a->input->shape[0], C = a->input->shape[1];
    double wsum = 0, eps = a->label_smoothing;
    double *logp = malloc(sizeof(double) * (size_t)(C > 0 ? C : 1));
    if (!logp)
        return dp_fail(DP_ERR_MEMORY, "cross_entropy: out of memory");
    for (int64_t i = 0; i < N; i++) {
        int64_t t = ((const int64_t *)tensor_ptr(a->target))[i];
        rows[i] = 0;
        if (t == a->ignore_index)
            continue;
        if (t < 0 || t >= C) {
            free(logp);
            return bad_target(t, C);
        }
        row_log_probs(a->input, i, C, a->log_probs, logp);
        double wt = class_weight(a->weight, t);
        double loss = -wt * logp[t] * (1 - eps);
        if (eps > 0) {
            double smooth = 0;
            for (int64_t j = 0; j < C; j++)
                smooth -= class_weight(a->weight, j) * logp[j];
            loss += eps / (double)C * smooth;
        }
        rows[i] = loss;
        wsum += wt;
    }
    free(logp);
    *denom = wsum;
    return DP_OK;
}

/* dinput[i, k] = scale_i * ((1-eps) w_t (p_k - [k==t]) + eps/C (p_k sum_j w_j - w_k)),
 * or -scale_i w_t [k==t] for log-probability inputs. */
dp_status cpu_cross_entropy_backward(dp_tensor *dinput, const double *scale, const cpu_ce_args *a)
{
    int64_t N = a->input->shape[0], C = a->input->shape[1];
    double eps = a->label_smoothing, wall = 0;
    size_t es = dp_dtype_size(dinput->dtype);
    double *logp = malloc(sizeof(double) * (size_t)(C > 0 ? C : 1));
    if (!logp)
        return dp_fail(DP_ERR_MEMORY, "cross_entropy: out of memory");
    for (int64_t j = 0; j < C; j++)
        wall += class_weight(a->weight, j);
    for (int64_t i = 0; i < N; i++) {
        char *row = tensor_ptr(dinput) + i * C * (int64_t)es;
        int64_t t = ((const int64_t *)tensor_ptr(a->target))[i];
        if (t == a->ignore_index || scale[i] == 0) {
            for (int64_t k = 0; k < C; k++)
                dtype_store(dinput->dtype, row + k * (int64_t)es, 0);
            continue;
        }
        double wt = class_weight(a->weight, t);
        if (a->log_probs) {
            for (int64_t k = 0; k < C; k++)
                dtype_store(dinput->dtype, row + k * (int64_t)es, k == t ? -scale[i] * wt : 0);
            continue;
        }
        row_log_probs(a->input, i, C, 0, logp);
        for (int64_t k = 0; k < C; k++) {
            double p = exp(logp[k]);
            double d = (1 - eps) * wt * (p - (k == t));
            if (eps > 0)
                d += eps / (double)C * (p * wall - class_weight(a->weight, k));
            dtype_store(dinput->dtype, row + k * (int64_t)es, scale[i] * d);
        }
    }
    free(logp);
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
