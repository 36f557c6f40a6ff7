/*
 * norm.c — LayerNorm as one op and one node on the tape, named as
 * PyTorch's (NativeLayerNormBackward0): each row's mean and 1/std are kept
 * for the backward, which computes dx, dweight and dbias in one pass over
 * the rows instead of the dozen nodes of the composite. dp_add_layer_norm
 * adds a residual in the same pass (a GPT block's x + attn(ln_1(x)) before
 * ln_2), its sum recorded as an ordinary addition. BatchNorm is one op
 * and one node too (NativeBatchNormBackward0): it keeps each channel's
 * mean and 1/std and moves the running statistics in place. The kernels
 * are src/cpu/norm.c and, on a GPU, cuda/norm.cu.
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
                             int pdtype)
{
    char s[96];
    if (p->dtype != pdtype)
        return dp_fail(DP_ERR_DTYPE, "%s: expected %s of dtype %s (the parameters' beside this input and output), "
                       "got %s", fn, what, dp_dtype_name(pdtype), dp_dtype_name(p->dtype));
    if (p->device != x->device)
        return dp_fail(DP_ERR_DEVICE, "%s: expected %s on the input's device %d, got device %d (-1 is the CPU)", fn,
                       what, x->device, p->device);
    if (dp_tensor_numel(p) != n)
        return dp_fail(DP_ERR_SHAPE, "%s: expected %s of %lld elements (the normalized shape's), got shape %s", fn,
                       what, (long long)n, dp_shape_str(s, sizeof s, p->ndim, p->shape));
    return DP_OK;
}

/* The parameters' dtype beside an input and an output of these dtypes:
 * float32 beside either of bfloat16's pairings with float32 */
static int param_dtype(int in_dtype, int out_dtype)
{
    return in_dtype == DP_BFLOAT16 ? out_dtype : in_dtype;
}

static dp_status check(const char *fn, dp_tensor *x, dp_tensor *res, dp_tensor *w, dp_tensor *b, int64_t n,
                       int out_dtype)
{
    char s[96], r[96];
    if (!dp_dtype_is_floating(x->dtype))
        return dp_fail(DP_ERR_DTYPE, "%s: expected a floating point input, got %s", fn, dp_dtype_name(x->dtype));
    if (out_dtype != x->dtype && !(x->dtype == DP_BFLOAT16 && out_dtype == DP_FLOAT32) &&
        !(x->dtype == DP_FLOAT32 && out_dtype == DP_BFLOAT16))
        return dp_fail(DP_ERR_DTYPE, "%s: expected the output dtype to be the input's (%s), or float32 and "
                       "bfloat16 for each other, got %s", fn, dp_dtype_name(x->dtype), dp_dtype_name(out_dtype));
    if (n < 1 || !ends_in(x, n))
        return dp_fail(DP_ERR_SHAPE, "%s: expected an input whose last dims hold %lld elements, got shape %s", fn,
                       (long long)n, dp_shape_str(s, sizeof s, x->ndim, x->shape));
    if (res && ((res->dtype != x->dtype && !(x->dtype == DP_FLOAT32 && res->dtype == DP_BFLOAT16)) ||
                res->device != x->device || res->ndim != x->ndim ||
                memcmp(res->shape, x->shape, sizeof(int64_t) * (size_t)x->ndim)))
        return dp_fail(DP_ERR_SHAPE, "%s: expected the residual of the input's shape, dtype (or bfloat16 beside "
                       "float32) and device, got %s %s on device %d for %s %s on device %d", fn,
                       dp_shape_str(r, sizeof r, res->ndim, res->shape), dp_dtype_name(res->dtype), res->device,
                       dp_shape_str(s, sizeof s, x->ndim, x->shape), dp_dtype_name(x->dtype), x->device);
    const int pdtype = param_dtype(x->dtype, out_dtype);
    dp_status st = w ? check_param(fn, "weight", w, x, n, pdtype) : DP_OK;
    return st || !b ? st : check_param(fn, "bias", b, x, n, pdtype);
}

/* The CPU kernels' float64 scratch: `doubles` of them in *scratch, which
 * the caller releases (NULL when the status is not DP_OK). */
static dp_status cpu_scratch(dp_tensor **scratch, int64_t doubles, double **p)
{
    dp_status st = tensor_new(scratch, 1, &doubles, DP_FLOAT64, DP_CPU);
    *p = st ? NULL : (double *)tensor_ptr(*scratch);
    if (st)
        *scratch = NULL;
    return st;
}

static dp_status run_forward(const cpu_norm_args *a, dp_tensor *out, dp_tensor *sum, dp_tensor *mean,
                             dp_tensor *rstd)
{
    if (!ON_CPU(out))
        return gpu_layer_norm(a, out, sum, mean, rstd);
    dp_tensor *scratch;
    double *ws;
    dp_status st = cpu_scratch(&scratch, CPU_NORM_FORWARD_SCRATCH(a->n), &ws);
    if (!st)
        cpu_layer_norm(a, out, sum, mean, rstd, ws);
    dp_tensor_release(scratch);
    return st;
}

static dp_status run_backward(const cpu_norm_args *a, dp_tensor *dy, dp_tensor *mean, dp_tensor *rstd,
                              dp_tensor *dx, dp_tensor *dw, dp_tensor *db)
{
    if (!ON_CPU(dy))
        return gpu_layer_norm_backward(a, dy, mean, rstd, dx, dw, db);
    dp_tensor *scratch;
    double *ws;
    dp_status st = cpu_scratch(&scratch, CPU_NORM_BACKWARD_SCRATCH(a->n), &ws);
    if (!st)
        cpu_layer_norm_backward(a, dy, mean, rstd, dx, dw, db, ws);
    dp_tensor_release(scratch);
    return st;
}

/* saved: the normalized rows (contiguous), mean, rstd, then the weight if
 * there is one; iarg[0] n, iarg[1] the output's dtype. In a pre-LayerNorm
 * transformer x also feeds the residual path, whose gradient reaches x's
 * node first: dx is then added to it in the same pass (ag_pending_grad)
 * instead of written apart and summed. */
static dp_status bw_layer_norm(ag_node *n, dp_tensor *g, dp_tensor **gi)
{
    dp_tensor *x = n->saved[0], *mean = n->saved[1], *rstd = n->saved[2], *w = n->nsaved > 3 ? n->saved[3] : NULL;
    dp_tensor *gt = NULL, *gc = NULL, *grads[3] = { NULL, NULL, NULL };
    dp_tensor *pending = n->in[0].needs_grad ? ag_pending_grad(n, 0) : NULL;
    int out_dtype = (int)n->iarg[1];
    dp_status st = dp_to(&gt, g, out_dtype, x->device);
    if (!st)
        st = dp_contiguous(&gc, gt);
    if (!st && pending) {
        dp_tensor_retain(grads[0] = pending);
        pending->storage->version++;
    }
    for (int i = 0; i < 3 && !st; i++)
        if (n->in[i].needs_grad && !grads[i])
            st = tensor_new(&grads[i], n->in[i].ndim, n->in[i].shape, n->in[i].dtype, n->in[i].device);
    if (!st) {
        int64_t cols = n->iarg[0];
        cpu_norm_args a = { x, NULL, w, NULL, dp_tensor_numel(x) / cols, cols, 0, pending != NULL };
        st = run_backward(&a, gc, mean, rstd, grads[0], grads[1], grads[2]);
    }
    if (pending) {   /* in place: nothing to give */
        dp_tensor_release(grads[0]);
        grads[0] = NULL;
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
        cpu_norm_args a = { c[0], c[1], c[2], c[3], rows, cols, eps, false };
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

/* ---------------------------------------------------------------- BatchNorm */

/* The dtype of the parameters and running statistics (the first given, or
 * the input's), checked against the input's */
static dp_status bn_param_dtype(int *pdtype, dp_tensor *x, dp_tensor *const *params)
{
    static const char *const names[4] = { "weight", "bias", "running_mean", "running_var" };
    static const int order[4] = { 2, 3, 0, 1 };   /* PyTorch's: the running statistics first */
    int first = -1;
    for (int k = 0; k < 4 && first < 0; k++)
        if (params[order[k]])
            first = order[k];
    *pdtype = first < 0 ? x->dtype : params[first]->dtype;
    if (*pdtype != x->dtype && !(x->dtype == DP_BFLOAT16 && *pdtype == DP_FLOAT32))
        return dp_fail(DP_ERR_DTYPE, "batch_norm: expected %s of the input's dtype %s%s, got %s", names[first],
                       dp_dtype_name(x->dtype), x->dtype == DP_BFLOAT16 ? " or float32" : "",
                       dp_dtype_name(*pdtype));
    for (int k = 0; k < 4; k++) {
        const int i = order[k];
        const dp_tensor *p = params[i];
        if (!p)
            continue;
        if (p->dtype != *pdtype)
            return dp_fail(DP_ERR_DTYPE, "batch_norm: expected %s of dtype %s (the %s's), got %s", names[i],
                           dp_dtype_name(*pdtype), names[first], dp_dtype_name(p->dtype));
        if (p->device != x->device)
            return dp_fail(DP_ERR_DEVICE, "batch_norm: expected %s on the input's device %d, got device %d (-1 is "
                           "the CPU)", names[i], x->device, p->device);
        if (dp_tensor_numel(p) != x->shape[1])
            return dp_fail(DP_ERR_SHAPE, "batch_norm: %s should contain %lld elements not %lld (one per channel, "
                           "dim 1 of the input)", names[i], (long long)x->shape[1], (long long)dp_tensor_numel(p));
    }
    return DP_OK;
}

static dp_status bn_check(dp_tensor *x, dp_tensor *const *params, int training, int use_batch, int *pdtype)
{
    char s[96];
    if (!dp_dtype_is_floating(x->dtype))
        return dp_fail(DP_ERR_DTYPE, "batch_norm: expected a floating point input, got %s", dp_dtype_name(x->dtype));
    if (x->ndim < 2)
        return dp_fail(DP_ERR_SHAPE, "batch_norm: expected an input of at least 2 dims (N, C, ...), got shape %s",
                       dp_shape_str(s, sizeof s, x->ndim, x->shape));
    if (!params[2] != !params[3])
        return dp_fail(DP_ERR_ARG, "batch_norm: expected both running_mean and running_var, or neither");
    dp_status st = bn_param_dtype(pdtype, x, params);
    if (st)
        return st;
    int64_t per_channel = x->shape[1] ? dp_tensor_numel(x) / x->shape[1] : 0;
    if (training && per_channel <= 1)
        return dp_fail(DP_ERR_SHAPE, "batch_norm: Expected more than 1 value per channel when training, got input "
                       "size %s", dp_shape_str(s, sizeof s, x->ndim, x->shape));
    for (int i = 2; i < 4 && use_batch; i++)
        if (params[i] && (st = ag_check_inplace("batch_norm (its running statistics)", params[i])))
            return st;
    return DP_OK;
}

static dp_status run_bn_forward(const cpu_bn_args *a, dp_tensor *out, dp_tensor *mean, dp_tensor *invstd)
{
    if (!ON_CPU(out))
        return gpu_batch_norm(a, out, mean, invstd);
    dp_tensor *scratch;
    double *ws;
    dp_status st = cpu_scratch(&scratch, CPU_BN_SCRATCH(a->C), &ws);
    if (!st)
        cpu_batch_norm(a, out, mean, invstd, ws);
    dp_tensor_release(scratch);
    return st;
}

static dp_status run_bn_backward(const cpu_bn_args *a, dp_tensor *dy, dp_tensor *mean, dp_tensor *invstd,
                                 dp_tensor *dx, dp_tensor *dw, dp_tensor *db)
{
    if (!ON_CPU(dy))
        return gpu_batch_norm_backward(a, dy, mean, invstd, dx, dw, db);
    dp_tensor *scratch;
    double *ws;
    dp_status st = cpu_scratch(&scratch, CPU_BN_SCRATCH(a->C), &ws);
    if (!st)
        cpu_batch_norm_backward(a, dy, mean, invstd, dx, dw, db, ws);
    dp_tensor_release(scratch);
    return st;
}

/* x (N, C, S) as the kernels see it */
static cpu_bn_args bn_args(const dp_tensor *x, const dp_tensor *w, const dp_tensor *b, int use_batch)
{
    cpu_bn_args a = { .x = x, .weight = w, .bias = b, .N = x->shape[0], .C = x->shape[1], .S = 1,
                      .training = use_batch };
    for (int i = 2; i < x->ndim; i++)
        a.S *= x->shape[i];
    return a;
}

/* saved: the input (contiguous), mean, invstd, then the weight if there is
 * one; iarg[0]: normalized by the batch's statistics */
static dp_status bw_batch_norm(ag_node *n, dp_tensor *g, dp_tensor **gi)
{
    dp_tensor *x = n->saved[0], *mean = n->saved[1], *invstd = n->saved[2], *w = n->nsaved > 3 ? n->saved[3] : NULL;
    dp_tensor *gt = NULL, *gc = NULL, *grads[3] = { NULL, NULL, NULL };
    dp_status st = dp_to(&gt, g, x->dtype, x->device);
    if (!st)
        st = dp_contiguous(&gc, gt);
    for (int i = 0; i < 3 && !st; i++)
        if (n->in[i].needs_grad)
            st = ag_grad_output(n, i, &grads[i]);
    if (!st) {
        cpu_bn_args a = bn_args(x, w, NULL, (int)n->iarg[0]);
        st = run_bn_backward(&a, gc, mean, invstd, grads[0], grads[1], grads[2]);
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

dp_status dp_batch_norm(dp_tensor **out, dp_tensor *input, dp_tensor *weight, dp_tensor *bias,
                        dp_tensor *running_mean, dp_tensor *running_var, int training, double momentum, double eps)
{
    dp_tensor *params[4] = { weight, bias, running_mean, running_var };
    const int use_batch = training || !running_mean;
    int pdtype;
    dp_status st = bn_check(input, params, training, use_batch, &pdtype);
    if (st)
        return st;
    /* c: the input, weight, bias and running statistics, contiguous */
    dp_tensor *c[5] = { NULL }, *m = NULL, *r = NULL, *y = NULL, *ins[5] = { input, weight, bias, running_mean,
                                                                           running_var };
    int64_t C = input->shape[1];
    int stat_dtype = input->dtype == DP_FLOAT64 ? DP_FLOAT64 : DP_FLOAT32;
    int was = dp_set_grad_enabled(0);
    st = contiguous_all(c, ins, 5);
    if (!st && !(st = tensor_new(&y, input->ndim, input->shape, input->dtype, input->device)) &&
        !(st = tensor_new(&m, 1, &C, stat_dtype, input->device)) &&
        !(st = tensor_new(&r, 1, &C, stat_dtype, input->device))) {
        cpu_bn_args a = bn_args(c[0], c[1], c[2], use_batch);
        a.running_mean = c[3];
        a.running_var = c[4];
        a.momentum = momentum;
        a.eps = eps;
        st = run_bn_forward(&a, y, m, r);
        for (int i = 3; i < 5 && !st && use_batch; i++)
            if (c[i] && c[i] != ins[i])
                st = dp_copy_into(ins[i], c[i]);   /* running statistics that are not contiguous */
    }
    dp_set_grad_enabled(was);
    ag_node *n = NULL;
    dp_tensor *rec[3] = { input, weight, bias };
    if (!st && !(st = ag_record(y, "NativeBatchNormBackward0", bw_batch_norm, 3, rec, &n)) && n) {
        ag_save(n, c[0]);
        ag_save(n, m);
        ag_save(n, r);
        if (c[1])
            ag_save(n, c[1]);
        n->iarg[0] = use_batch;
    }
    for (int i = 0; i < 5; i++)
        dp_tensor_release(c[i]);
    dp_tensor_release(m);
    dp_tensor_release(r);
    if (st) {
        dp_tensor_release(y);
        return st;
    }
    *out = y;
    return DP_OK;
}
