/*
 * norm.c — LayerNorm as one op and one node on the tape, named as
 * PyTorch's (NativeLayerNormBackward0): each row's mean and 1/std are kept
 * for the backward, which computes dx, dweight and dbias in one pass over
 * the rows instead of the dozen nodes of the composite. dp_add_layer_norm
 * adds a residual in the same pass (a GPT block's x + attn(ln_1(x)) before
 * ln_2), its sum recorded as an ordinary addition. The kernels are
 * src/cpu/norm.c and, on a GPU, cuda/norm.cu.
 */
#include "core/autograd.h"
#include "core/kernels.h"

#include <string.h>

static int stat_dtype(int dtype)
{
    return dtype == DP_FLOAT64 ? DP_FLOAT64 : DP_FLOAT32;
}

/* whether t's last dims hold n elements */
static bool ends_in(const dp_tensor *t, int64_t n)
{
    int64_t p = 1;
    for (int i = t->ndim - 1; i >= 0 && p < n; i--)
        p *= t->shape[i];
    return p == n;
}

static dp_status check_param(const char *fn, const char *what, const dp_tensor *p, const dp_tensor *x, int64_t n,
                             int out_dtype)
{
    char s[96];
    if (p->dtype != out_dtype)
        return dp_fail(DP_ERR_DTYPE, "%s: expected %s of dtype %s (the output's), got %s", fn, what,
                       dp_dtype_name(out_dtype), dp_dtype_name(p->dtype));
    if (p->device != x->device)
        return dp_fail(DP_ERR_DEVICE, "%s: expected %s on the input's device %d, got device %d (-1 is the CPU)", fn,
                       what, x->device, p->device);
    if (dp_tensor_numel(p) != n)
        return dp_fail(DP_ERR_SHAPE, "%s: expected %s of %lld elements (the normalized shape's), got shape %s", fn,
                       what, (long long)n, dp_shape_str(s, sizeof s, p->ndim, p->shape));
    return DP_OK;
}

static dp_status check(const char *fn, dp_tensor *x, dp_tensor *res, dp_tensor *w, dp_tensor *b, int64_t n,
                       int out_dtype)
{
    char s[96], r[96];
    if (!dp_dtype_is_floating(x->dtype))
        return dp_fail(DP_ERR_DTYPE, "%s: expected a floating point input, got %s", fn, dp_dtype_name(x->dtype));
    if (out_dtype != x->dtype && !(x->dtype == DP_BFLOAT16 && out_dtype == DP_FLOAT32))
        return dp_fail(DP_ERR_DTYPE, "%s: expected the output dtype to be the input's (%s), or float32 for a "
                       "bfloat16 input, got %s", fn, dp_dtype_name(x->dtype), dp_dtype_name(out_dtype));
    if (n < 1 || !ends_in(x, n))
        return dp_fail(DP_ERR_SHAPE, "%s: expected an input whose last dims hold %lld elements, got shape %s", fn,
                       (long long)n, dp_shape_str(s, sizeof s, x->ndim, x->shape));
    if (res && (res->dtype != x->dtype || res->device != x->device || res->ndim != x->ndim ||
                memcmp(res->shape, x->shape, sizeof(int64_t) * (size_t)x->ndim)))
        return dp_fail(DP_ERR_SHAPE, "%s: expected the residual of the input's shape, dtype and device, got %s %s "
                       "on device %d for %s %s on device %d", fn, dp_shape_str(r, sizeof r, res->ndim, res->shape),
                       dp_dtype_name(res->dtype), res->device, dp_shape_str(s, sizeof s, x->ndim, x->shape),
                       dp_dtype_name(x->dtype), x->device);
    dp_status st = w ? check_param(fn, "weight", w, x, n, out_dtype) : DP_OK;
    return st || !b ? st : check_param(fn, "bias", b, x, n, out_dtype);
}

/* float64 scratch for the CPU kernels */
static dp_status run_forward(const cpu_norm_args *a, dp_tensor *out, dp_tensor *sum, dp_tensor *mean,
                             dp_tensor *rstd)
{
    if (!ON_CPU(out))
        return gpu_layer_norm(a, out, sum, mean, rstd);
    dp_tensor *scratch;
    int64_t doubles = CPU_NORM_FORWARD_SCRATCH(a->n);
    dp_status st = tensor_new(&scratch, 1, &doubles, DP_FLOAT64, DP_CPU);
    if (!st)
        cpu_layer_norm(a, out, sum, mean, rstd, (double *)tensor_ptr(scratch));
    dp_tensor_release(scratch);
    return st;
}

static dp_status run_backward(const cpu_norm_args *a, dp_tensor *dy, dp_tensor *mean, dp_tensor *rstd,
                              dp_tensor *dx, dp_tensor *dw, dp_tensor *db)
{
    if (!ON_CPU(dy))
        return gpu_layer_norm_backward(a, dy, mean, rstd, dx, dw, db);
    dp_tensor *scratch;
    int64_t doubles = CPU_NORM_BACKWARD_SCRATCH(a->n);
    dp_status st = tensor_new(&scratch, 1, &doubles, DP_FLOAT64, DP_CPU);
    if (!st)
        cpu_layer_norm_backward(a, dy, mean, rstd, dx, dw, db, (double *)tensor_ptr(scratch));
    dp_tensor_release(scratch);
    return st;
}

/* saved: the normalized rows (contiguous), mean, rstd, then the weight if
 * there is one; iarg[0] n, iarg[1] the output's dtype */
static dp_status bw_layer_norm(ag_node *n, dp_tensor *g, dp_tensor **gi)
{
    dp_tensor *x = n->saved[0], *mean = n->saved[1], *rstd = n->saved[2], *w = n->nsaved > 3 ? n->saved[3] : NULL;
    dp_tensor *gt = NULL, *gc = NULL, *grads[3] = { NULL, NULL, NULL };
    int out_dtype = (int)n->iarg[1];
    dp_status st = dp_to(&gt, g, out_dtype, x->device);
    if (!st)
        st = dp_contiguous(&gc, gt);
    for (int i = 0; i < 3 && !st; i++)
        if (n->in[i].needs_grad)
            st = tensor_new(&grads[i], n->in[i].ndim, n->in[i].shape, n->in[i].dtype, n->in[i].device);
    if (!st) {
        int64_t cols = n->iarg[0];
        cpu_norm_args a = { x, NULL, w, NULL, dp_tensor_numel(x) / cols, cols, 0 };
        st = run_backward(&a, gc, mean, rstd, grads[0], grads[1], grads[2]);
    }
    for (int i = 0; i < 3; i++) {
        if (!st)
            gi[i] = grads[i];
        else
            dp_tensor_release(grads[i]);
    }
    dp_tensor_release(gt);
    dp_tensor_release(gc);
    return st;
}

/* each of ts[0..n-1] contiguous (itself, retained, or a copy), NULL kept */
static dp_status contiguous_all(dp_tensor **res, dp_tensor *const *ts, int n)
{
    dp_status st = DP_OK;
    for (int i = 0; i < n; i++) {
        res[i] = NULL;
        if (!st && ts[i])
            st = dp_contiguous(&res[i], ts[i]);
    }
    return st;
}

static dp_status record(dp_tensor *sum, dp_tensor *out, dp_tensor *const *ins, dp_tensor *rows, dp_tensor *mean,
                        dp_tensor *rstd, dp_tensor *w, int64_t cols, int out_dtype)
{
    ag_node *n = NULL;
    dp_status st = DP_OK;
    if (sum && !(st = ag_record(sum, "AddBackward0", bw_binary, 2, ins, &n)) && n)
        n->iarg[0] = DP_ADD;
    dp_tensor *ln_ins[3] = { sum ? sum : ins[0], ins[2], ins[3] };
    if (st || (st = ag_record(out, "NativeLayerNormBackward0", bw_layer_norm, 3, ln_ins, &n)) || !n)
        return st;
    ag_save(n, rows);
    ag_save(n, mean);
    ag_save(n, rstd);
    if (w)
        ag_save(n, w);
    n->iarg[0] = cols;
    n->iarg[1] = out_dtype;
    return DP_OK;
}

/* ins: x, residual (or NULL), weight, bias (either may be NULL); sum NULL
 * without a residual */
static dp_status layer_norm(const char *fn, dp_tensor **sum, dp_tensor **out, dp_tensor **mean, dp_tensor **rstd,
                            dp_tensor *const *ins, int64_t cols, double eps, int out_dtype)
{
    dp_tensor *x = ins[0];
    dp_status st = check(fn, x, ins[1], ins[2], ins[3], cols, out_dtype);
    if (st)
        return st;
    int64_t rows = dp_tensor_numel(x) / cols;
    dp_tensor *c[4], *m = NULL, *r = NULL, *s = NULL, *y = NULL;
    int was = dp_set_grad_enabled(0);
    st = contiguous_all(c, ins, 4);
    dp_set_grad_enabled(was);
    if (!st && !(st = tensor_new(&y, x->ndim, x->shape, out_dtype, x->device)) &&
        !(st = tensor_new(&m, 1, &rows, stat_dtype(x->dtype), x->device)) &&
        !(st = tensor_new(&r, 1, &rows, stat_dtype(x->dtype), x->device)) &&
        !(st = sum ? tensor_new(&s, x->ndim, x->shape, x->dtype, x->device) : DP_OK)) {
        cpu_norm_args a = { c[0], c[1], c[2], c[3], rows, cols, eps };
        if (!(st = run_forward(&a, y, s, m, r)))
            st = record(s, y, ins, s ? s : c[0], m, r, c[2], cols, out_dtype);
    }
    for (int i = 0; i < 4; i++)
        dp_tensor_release(c[i]);
    if (st) {
        dp_tensor *made[4] = { y, m, r, s };
        for (int i = 0; i < 4; i++)
            dp_tensor_release(made[i]);
        return st;
    }
    *out = y;
    if (sum)
        *sum = s;
    if (mean)
        *mean = m;
    else
        dp_tensor_release(m);
    if (rstd)
        *rstd = r;
    else
        dp_tensor_release(r);
    return DP_OK;
}

dp_status dp_layer_norm(dp_tensor **out, dp_tensor **mean, dp_tensor **rstd, dp_tensor *input, dp_tensor *weight,
                        dp_tensor *bias, int64_t normalized, double eps, dp_dtype out_dtype)
{
    dp_tensor *ins[4] = { input, NULL, weight, bias };
    return layer_norm("layer_norm", NULL, out, mean, rstd, ins, normalized, eps, out_dtype);
}

dp_status dp_add_layer_norm(dp_tensor **sum, dp_tensor **out, dp_tensor *x, dp_tensor *residual, dp_tensor *weight,
                            dp_tensor *bias, int64_t normalized, double eps, dp_dtype out_dtype)
{
    if (!residual)
        return dp_fail(DP_ERR_ARG, "add_layer_norm: expected a residual tensor, got NULL");
    dp_tensor *ins[4] = { x, residual, weight, bias };
    return layer_norm("add_layer_norm", sum, out, NULL, NULL, ins, normalized, eps, out_dtype);
}
