/*
 * attention.c — scaled dot product attention as one op and one node on the
 * tape: q, k, v in, out and each query row's log-sum-exp kept for the
 * backward, never the (L, S) matrix of attention weights. The kernels are
 * src/cpu/attention.c and, on a GPU, the flash kernels of
 * cuda/attention.cu. Masks and dropout take the composite path of
 * lua/dplua/nn/functional.lua instead (dp_attention_fused says when this
 * op takes the inputs).
 */
#include "core/autograd.h"
#include "core/kernels.h"

#include <stdlib.h>
#include <string.h>

static const char *FN = "scaled_dot_product_attention";

/* t (..., n, d) as a (B, H, n, d) view: its own dims when it has at most 4
 * and a contiguous last dim, else a contiguous copy's */
static dp_status as_heads(dp_tensor **res, dp_tensor *t)
{
    int nd = t->ndim;
    int64_t shape[4] = { 1, 1, t->shape[nd - 2], t->shape[nd - 1] };
    int64_t stride[4] = { 0, 0, t->stride[nd - 2], 1 };
    if (nd <= 4 && (t->stride[nd - 1] == 1 || t->shape[nd - 1] == 1)) {
        for (int i = 0; i < nd - 2; i++) {
            shape[4 - nd + i] = t->shape[i];
            stride[4 - nd + i] = t->stride[i];
        }
        return tensor_view_of(res, t, 4, shape, stride, t->offset);
    }
    dp_tensor *c;
    dp_status st = dp_contiguous(&c, t);
    if (st)
        return st;
    for (int i = 0; i < nd - 3; i++)
        shape[0] *= c->shape[i];
    shape[1] = nd > 2 ? c->shape[nd - 3] : 1;
    stride[2] = shape[3];
    stride[1] = shape[2] * shape[3];
    stride[0] = shape[1] * stride[1];
    st = tensor_view_of(res, c, 4, shape, stride, c->offset);
    dp_tensor_release(c);
    return st;
}

/* A new tensor of like's shape with its last dim `last` long, dense, its
 * dims laid out in like's order (by stride, the last innermost): heads
 * that are views of (B, L, H, E) projections get outputs and gradients
 * stored (B, L, H, E) too, which the transpose back to (B, L, H * E) then
 * views instead of copying (PyTorch's flash attention does the same).
 * Past 4 dims it is contiguous: as_heads views only those as heads. */
static dp_status new_in_order_of(dp_tensor **res, const dp_tensor *like, int64_t last)
{
    int nd = like->ndim, order[DP_MAX_DIMS];
    int64_t shape[DP_MAX_DIMS], stride[DP_MAX_DIMS], dense[DP_MAX_DIMS];
    if (nd > 4) {
        memcpy(shape, like->shape, sizeof(int64_t) * (size_t)nd);
        shape[nd - 1] = last;
        return tensor_new(res, nd, shape, like->dtype, like->device);
    }
    for (int i = 0; i < nd; i++) {
        shape[i] = i == nd - 1 ? last : like->shape[i];
        int j = i;   /* insertion sort of the leading dims, larger strides first, ties in order */
        for (; i < nd - 1 && j > 0 && like->stride[order[j - 1]] < like->stride[i]; j--)
            order[j] = order[j - 1];
        order[j] = i;
    }
    int64_t step = 1;
    for (int j = nd - 1; j >= 0; j--) {
        dense[j] = shape[order[j]];
        stride[order[j]] = step;
        step *= shape[order[j]];
    }
    dp_tensor *base;
    dp_status st = tensor_new(&base, nd, dense, like->dtype, like->device);
    if (st)
        return st;
    st = tensor_view_of(res, base, nd, shape, stride, base->offset);
    dp_tensor_release(base);
    return st;
}

static dp_status check(dp_tensor *q, dp_tensor *k, dp_tensor *v)
{
    dp_tensor *ts[3] = { q, k, v };
    const char *names[3] = { "query", "key", "value" };
    for (int i = 0; i < 3; i++) {
        if (!dp_dtype_is_floating(ts[i]->dtype))
            return dp_fail(DP_ERR_DTYPE, "%s: expected a floating point %s, got %s", FN, names[i],
                           dp_dtype_name(ts[i]->dtype));
        if (ts[i]->ndim < 2)
            return dp_fail(DP_ERR_SHAPE, "%s: expected %s of at least 2 dims (..., sequence, head dim), got %d-D",
                           FN, names[i], ts[i]->ndim);
    }
    if (k->dtype != q->dtype || v->dtype != q->dtype)
        return dp_fail(DP_ERR_DTYPE, "%s: expected query, key and value of one dtype, got %s, %s and %s", FN,
                       dp_dtype_name(q->dtype), dp_dtype_name(k->dtype), dp_dtype_name(v->dtype));
    if (k->device != q->device || v->device != q->device)
        return dp_fail(DP_ERR_DEVICE, "%s: expected query, key and value on one device, got devices %d, %d and %d "
                       "(-1 is the CPU)", FN, q->device, k->device, v->device);
    int nd = q->ndim;
    bool lead_ok = k->ndim == nd && v->ndim == nd;
    for (int i = 0; lead_ok && i < nd - 2; i++)
        lead_ok = k->shape[i] == q->shape[i] && v->shape[i] == q->shape[i];
    if (!lead_ok || k->shape[nd - 1] != q->shape[nd - 1] || v->shape[nd - 2] != k->shape[nd - 2])
    {
        char a[96], b[96], c[96];
        return dp_fail(DP_ERR_SHAPE, "%s: expected query (..., L, E), key (..., S, E) and value (..., S, Ev) with "
                       "the same leading dims, got %s, %s and %s", FN, dp_shape_str(a, sizeof a, q->ndim, q->shape),
                       dp_shape_str(b, sizeof b, k->ndim, k->shape), dp_shape_str(c, sizeof c, v->ndim, v->shape));
    }
    return DP_OK;
}

int dp_attention_fused(const dp_tensor *q, const dp_tensor *k, const dp_tensor *v)
{
    (void)k;
    if (q->ndim < 2)
        return 0;
    if (ON_CPU(q))
        return q->dtype == DP_FLOAT32 || q->dtype == DP_FLOAT64 || q->dtype == DP_BFLOAT16;
    return gpu_attention_takes(q->dtype, q->shape[q->ndim - 1], v->shape[v->ndim - 1]);
}

/* float64 scratch for the CPU kernels, or NULL for a GPU's */
static dp_status scratch_for(dp_tensor **res, const dp_tensor *q, int64_t doubles)
{
    *res = NULL;
    return ON_CPU(q) ? tensor_new(res, 1, &doubles, DP_FLOAT64, DP_CPU) : DP_OK;
}

static dp_status run_forward(const cpu_attention_args *a, dp_tensor *out, dp_tensor *lse)
{
    int64_t L = a->q->shape[2], S = a->k->shape[2], E = a->q->shape[3], Ev = a->v->shape[3];
    if (!ON_CPU(out))
        return gpu_attention_forward(a, out, lse);
    dp_tensor *scratch;
    dp_status st = scratch_for(&scratch, a->q, CPU_ATTENTION_FORWARD_SCRATCH(L, S, E, Ev));
    if (!st)
        cpu_attention_forward(a, out, lse, (double *)tensor_ptr(scratch));
    dp_tensor_release(scratch);
    return st;
}

static dp_status run_backward(const cpu_attention_args *a, dp_tensor *out, dp_tensor *dout, dp_tensor *lse,
                              dp_tensor *dq, dp_tensor *dk, dp_tensor *dv)
{
    int64_t L = a->q->shape[2], S = a->k->shape[2], E = a->q->shape[3], Ev = a->v->shape[3];
    if (!ON_CPU(out))
        return gpu_attention_backward(a, out, dout, lse, dq, dk, dv);
    dp_tensor *scratch;
    dp_status st = scratch_for(&scratch, a->q, CPU_ATTENTION_BACKWARD_SCRATCH(L, S, E, Ev));
    if (!st)
        cpu_attention_backward(a, out, dout, lse, dq, dk, dv, (double *)tensor_ptr(scratch));
    dp_tensor_release(scratch);
    return st;
}

/* saved: q, k, v, out, lse; iarg[0] causal; darg[0] scale */
static dp_status bw_attention(ag_node *n, dp_tensor *g, dp_tensor **gi)
{
    dp_tensor *q = n->saved[0], *k = n->saved[1], *v = n->saved[2], *out = n->saved[3], *lse = n->saved[4];
    dp_tensor *q4 = NULL, *k4 = NULL, *v4 = NULL, *o4 = NULL, *gc = NULL, *g4 = NULL;
    dp_tensor *grads[3] = { NULL, NULL, NULL }, *grads4[3] = { NULL, NULL, NULL };
    dp_tensor *ins[3] = { q, k, v };
    dp_status st = DP_OK;
    if (g->dtype == out->dtype)   /* read where it is (as_heads copies what the kernels cannot read) */
        dp_tensor_retain(gc = g);
    else
        st = dp_to(&gc, g, out->dtype, out->device);
    if (!st && !(st = as_heads(&q4, q)) && !(st = as_heads(&k4, k)) && !(st = as_heads(&v4, v)) &&
        !(st = as_heads(&o4, out)) && !(st = as_heads(&g4, gc)))
        for (int i = 0; i < 3 && !st; i++)
            if (!(st = new_in_order_of(&grads[i], ins[i], ins[i]->shape[ins[i]->ndim - 1])))
                st = as_heads(&grads4[i], grads[i]);
    if (!st) {
        cpu_attention_args a = { q4, k4, v4, (int)n->iarg[0], n->darg[0] };
        st = run_backward(&a, o4, g4, lse, grads4[0], grads4[1], grads4[2]);
    }
    for (int i = 0; i < 3; i++) {
        if (!st && n->in[i].needs_grad) {
            gi[i] = grads[i];
            grads[i] = NULL;
        }
        dp_tensor_release(grads[i]);
        dp_tensor_release(grads4[i]);
    }
    dp_tensor *tmp[6] = { q4, k4, v4, o4, gc, g4 };
    for (int i = 0; i < 6; i++)
        dp_tensor_release(tmp[i]);
    return st;
}

dp_status dp_scaled_dot_product_attention(dp_tensor **out, dp_tensor *q, dp_tensor *k, dp_tensor *v, int is_causal,
                                          double scale)
{
    dp_status st = check(q, k, v);
    if (st)
        return st;
    if (!dp_attention_fused(q, k, v))
        return dp_fail(DP_ERR_ARG, "%s: no fused kernel takes %s inputs with head dims %lld and %lld here "
                       "(F.scaled_dot_product_attention takes the composite path for them)", FN,
                       dp_dtype_name(q->dtype), (long long)q->shape[q->ndim - 1], (long long)v->shape[v->ndim - 1]);
    dp_tensor *q4 = NULL, *k4 = NULL, *v4 = NULL, *o4 = NULL, *lse = NULL;
    if ((st = new_in_order_of(out, q, v->shape[v->ndim - 1])))
        return st;
    if (!(st = as_heads(&q4, q)) && !(st = as_heads(&k4, k)) && !(st = as_heads(&v4, v)) &&
        !(st = as_heads(&o4, *out))) {
        int64_t lse_shape[3] = { q4->shape[0], q4->shape[1], q4->shape[2] };
        int lse_dtype = q->dtype == DP_FLOAT64 ? DP_FLOAT64 : DP_FLOAT32;
        if (!(st = tensor_new(&lse, 3, lse_shape, lse_dtype, q->device))) {
            cpu_attention_args a = { q4, k4, v4, is_causal != 0, scale };
            st = run_forward(&a, o4, lse);
        }
    }
    dp_tensor_release(q4);
    dp_tensor_release(k4);
    dp_tensor_release(v4);
    dp_tensor_release(o4);
    ag_node *n = NULL;
    dp_tensor *ins[3] = { q, k, v };
    if (!st && !(st = ag_record(*out, "ScaledDotProductFlashAttentionBackward0", bw_attention, 3, ins, &n)) && n) {
        ag_save(n, q);
        ag_save(n, k);
        ag_save(n, v);
        ag_save_output(n, *out);
        ag_save(n, lse);
        n->iarg[0] = is_causal != 0;
        n->darg[0] = scale;
    }
    dp_tensor_release(lse);
    if (st) {
        dp_tensor_release(*out);
        *out = NULL;
    }
    return st;
}
