/*
 * backward.c — the gradient formulas, one function per family of ops.
 * They run with grad mode off and build their results from the same dp_*
 * ops as the forward pass (so they work on every device), except unary
 * ops, whose derivatives are one fused kernel.
 */
#include "core/autograd.h"
#include "core/kernels.h"

#include <math.h>
#include <string.h>

/* Releases the listed temporaries; NULLs are fine. */
static void drop(int n, dp_tensor **ts)
{
    for (int i = 0; i < n; i++)
        dp_tensor_release(ts[i]);
}
#define DROP(...) drop(sizeof((dp_tensor *[]){ __VA_ARGS__ }) / sizeof(dp_tensor *), (dp_tensor *[]){ __VA_ARGS__ })

static bool same_shape(const dp_tensor *t, const ag_input *in)
{
    return t->ndim == in->ndim && !memcmp(t->shape, in->shape, sizeof(int64_t) * (size_t)in->ndim);
}

dp_status ag_sum_to(dp_tensor **out, dp_tensor *grad, const ag_input *in)
{
    dp_tensor *g = grad;
    dp_status st = DP_OK;
    dp_tensor_retain(g);
    int lead = grad->ndim - in->ndim;
    for (int d = grad->ndim - 1; d >= 0 && !st; d--) {
        bool leading = d < lead;
        if (!leading && !(in->shape[d - lead] == 1 && grad->shape[d] != 1))
            continue;
        dp_tensor *r;
        st = dp_reduce(&r, DP_SUM, g, d, !leading, 0);
        dp_tensor_release(g);
        g = st ? NULL : r;
    }
    if (!st && (g->dtype != in->dtype || g->device != in->device)) {
        dp_tensor *c;
        st = dp_to(&c, g, in->dtype, in->device);
        dp_tensor_release(g);
        g = st ? NULL : c;
    }
    if (!st && !same_shape(g, in)) {
        /* e.g. a 0-d input: sums left a [1,1] */
        dp_tensor *v;
        st = dp_reshape(&v, g, in->ndim, in->shape);
        dp_tensor_release(g);
        g = st ? NULL : v;
    }
    *out = g;
    return st;
}

/* Stores grad, summed to input i's shape, into grads_in[i] when needed. */
static dp_status give(ag_node *n, int i, dp_tensor *grad, dp_tensor **grads_in)
{
    if (!n->in[i].needs_grad || !grad)
        return DP_OK;
    return ag_sum_to(&grads_in[i], grad, &n->in[i]);
}

/* ---------------------------------------------------------------- elementwise */

dp_status bw_unary(ag_node *n, dp_tensor *g, dp_tensor **gi)
{
    if (n->grad_masked)   /* a ReLU's, applied where its gradient was made */
        return give(n, 0, g, gi);
    dp_tensor *x = n->saved[0], *y = n->saved[1], *dx;
    dp_status st = tensor_new(&dx, x->ndim, x->shape, x->dtype, x->device);
    if (st)
        return st;
    dp_tensor *gc;
    if ((st = dp_contiguous(&gc, g))) {
        dp_tensor_release(dx);
        return st;
    }
    if (gc->dtype != x->dtype) {
        dp_tensor *c;
        st = dp_to(&c, gc, x->dtype, x->device);
        dp_tensor_release(gc);
        gc = c;
    }
    if (!st)
        st = k_unary_backward((int)n->iarg[0], dx, gc, x, y);
    dp_tensor_release(gc);
    if (!st)
        st = give(n, 0, dx, gi);
    dp_tensor_release(dx);
    return st;
}

static dp_status bw_binary_mul(ag_node *n, dp_tensor *g, dp_tensor **gi)
{
    dp_tensor *a = n->saved[0], *b = n->saved[1], *ga = NULL, *gb = NULL;
    dp_status st = DP_OK;
    if (n->in[0].needs_grad && !(st = dp_binary(&ga, DP_MUL, g, b)))
        st = give(n, 0, ga, gi);
    if (!st && n->in[1].needs_grad && !(st = dp_binary(&gb, DP_MUL, g, a)))
        st = give(n, 1, gb, gi);
    DROP(ga, gb);
    return st;
}

static dp_status bw_binary_div(ag_node *n, dp_tensor *g, dp_tensor **gi)
{
    dp_tensor *b = n->saved[1], *y = n->saved[2], *ga = NULL, *t = NULL, *gb = NULL;
    dp_status st = DP_OK;
    if ((st = dp_binary(&ga, DP_DIV, g, b)))
        return st;
    st = give(n, 0, ga, gi);
    /* d(a/b)/db = -(a/b)/b: gb = -(g/b) * y */
    if (!st && n->in[1].needs_grad && !(st = dp_binary(&t, DP_MUL, ga, y)) &&
        !(st = dp_unary(&gb, DP_NEG, t)))
        st = give(n, 1, gb, gi);
    DROP(ga, t, gb);
    return st;
}

static dp_status bw_binary_pow(ag_node *n, dp_tensor *g, dp_tensor **gi)
{
    dp_tensor *a = n->saved[0], *b = n->saved[1], *y = n->saved[2];
    dp_tensor *bm1 = NULL, *p = NULL, *t = NULL, *ga = NULL, *la = NULL, *t2 = NULL, *gb = NULL;
    dp_status st = DP_OK;
    if (n->in[0].needs_grad) {
        /* g * b * a^(b-1) */
        if (!(st = dp_binary_scalar(&bm1, DP_SUB, b, 1, 0)) && !(st = dp_binary(&p, DP_POW, a, bm1)) &&
            !(st = dp_binary(&t, DP_MUL, p, b)) && !(st = dp_binary(&ga, DP_MUL, t, g)))
            st = give(n, 0, ga, gi);
    }
    if (!st && n->in[1].needs_grad) {
        /* g * y * log(a) */
        if (!(st = dp_unary(&la, DP_LOG, a)) && !(st = dp_binary(&t2, DP_MUL, y, la)) &&
            !(st = dp_binary(&gb, DP_MUL, t2, g)))
            st = give(n, 1, gb, gi);
    }
    DROP(bm1, p, t, ga, la, t2, gb);
    return st;
}

/* maximum/minimum: the larger (smaller) input takes the gradient; ties split it. */
static dp_status bw_binary_minmax(ag_node *n, dp_tensor *g, dp_tensor **gi)
{
    dp_tensor *a = n->saved[0], *b = n->saved[1];
    dp_tensor *win = NULL, *tie = NULL, *wf = NULL, *tf = NULL, *half = NULL, *w = NULL, *ga = NULL,
              *rest = NULL, *gb = NULL;
    int cmp = n->iarg[0] == DP_MAXIMUM ? DP_GT : DP_LT;
    dp_status st;
    if (!(st = dp_binary(&win, cmp, a, b)) && !(st = dp_binary(&tie, DP_EQ, a, b)) &&
        !(st = dp_to(&wf, win, g->dtype, g->device)) && !(st = dp_to(&tf, tie, g->dtype, g->device)) &&
        !(st = dp_binary_scalar(&half, DP_MUL, tf, 0.5, 0)) && !(st = dp_binary(&w, DP_ADD, wf, half)) &&
        !(st = dp_binary(&ga, DP_MUL, g, w)) && !(st = give(n, 0, ga, gi)) &&
        !(st = dp_binary(&rest, DP_SUB, g, ga)))
        st = give(n, 1, rest, gi);
    DROP(win, tie, wf, tf, half, w, ga, rest, gb);
    return st;
}

static dp_status bw_binary_atan2(ag_node *n, dp_tensor *g, dp_tensor **gi)
{
    dp_tensor *a = n->saved[0], *b = n->saved[1];
    dp_tensor *a2 = NULL, *b2 = NULL, *den = NULL, *q = NULL, *ga = NULL, *q2 = NULL, *gb = NULL, *ngb = NULL;
    dp_status st;
    if (!(st = dp_binary(&a2, DP_MUL, a, a)) && !(st = dp_binary(&b2, DP_MUL, b, b)) &&
        !(st = dp_binary(&den, DP_ADD, a2, b2)) && !(st = dp_binary(&q, DP_DIV, g, den)) &&
        !(st = dp_binary(&ga, DP_MUL, q, b)) && !(st = give(n, 0, ga, gi)) &&
        !(st = dp_binary(&q2, DP_MUL, q, a)) && !(st = dp_unary(&ngb, DP_NEG, q2)))
        st = give(n, 1, ngb, gi);
    DROP(a2, b2, den, q, ga, q2, gb, ngb);
    return st;
}

dp_status bw_binary(ag_node *n, dp_tensor *g, dp_tensor **gi)
{
    dp_tensor *t = NULL, *q = NULL, *fq = NULL;
    dp_status st = DP_OK;
    switch (n->iarg[0]) {
    case DP_ADD:
        if (!(st = give(n, 0, g, gi)))
            st = give(n, 1, g, gi);
        return st;
    case DP_SUB:
        if ((st = give(n, 0, g, gi)) || !n->in[1].needs_grad)
            return st;
        if (!(st = dp_unary(&t, DP_NEG, g)))
            st = give(n, 1, t, gi);
        dp_tensor_release(t);
        return st;
    case DP_MUL: return bw_binary_mul(n, g, gi);
    case DP_DIV: return bw_binary_div(n, g, gi);
    case DP_POW: return bw_binary_pow(n, g, gi);
    case DP_MAXIMUM: case DP_MINIMUM: return bw_binary_minmax(n, g, gi);
    case DP_ATAN2: return bw_binary_atan2(n, g, gi);
    case DP_REMAINDER: {
        /* a - floor(a/b)*b: da = g, db = -g*floor(a/b) */
        dp_tensor *gb = NULL;
        if ((st = give(n, 0, g, gi)) || !n->in[1].needs_grad)
            return st;
        if (!(st = dp_binary(&q, DP_DIV, n->saved[0], n->saved[1])) && !(st = dp_unary(&fq, DP_FLOOR, q)) &&
            !(st = dp_binary(&t, DP_MUL, g, fq)) && !(st = dp_unary(&gb, DP_NEG, t)))
            st = give(n, 1, gb, gi);
        DROP(t, q, fq, gb);
        return st;
    }
    }
    return dp_fail(DP_ERR_STATE, "backward: op %lld has no derivative", (long long)n->iarg[0]);
}

dp_status bw_where(ag_node *n, dp_tensor *g, dp_tensor **gi)
{
    dp_tensor *cond = n->saved[0], *zero = NULL, *ga = NULL, *gb = NULL;
    dp_status st = dp_full(&zero, 0, NULL, 0, g->dtype, g->device);
    if (!st && n->in[1].needs_grad && !(st = dp_where(&ga, cond, g, zero)))
        st = give(n, 1, ga, gi);
    if (!st && n->in[2].needs_grad && !(st = dp_where(&gb, cond, zero, g)))
        st = give(n, 2, gb, gi);
    DROP(zero, ga, gb);
    return st;
}

/* The gradient passes where lo <= x <= hi. */
dp_status bw_clamp(ag_node *n, dp_tensor *g, dp_tensor **gi)
{
    dp_tensor *x = n->saved[0], *lo = NULL, *hi = NULL, *in = NULL, *zero = NULL, *ga = NULL;
    dp_status st;
    if (!(st = dp_binary_scalar(&lo, DP_GE, x, isnan(n->darg[0]) ? -INFINITY : n->darg[0], 0)) &&
        !(st = dp_binary_scalar(&hi, DP_LE, x, isnan(n->darg[1]) ? INFINITY : n->darg[1], 0)) &&
        !(st = dp_binary(&in, DP_LOGICAL_AND, lo, hi)) &&
        !(st = dp_full(&zero, 0, NULL, 0, g->dtype, g->device)) && !(st = dp_where(&ga, in, g, zero)))
        st = give(n, 0, ga, gi);
    DROP(lo, hi, in, zero, ga);
    return st;
}

/* ---------------------------------------------------------------- reductions */

/* grad of a reduction, brought back to the input's shape (a broadcast view) */
static dp_status expand_back(dp_tensor **out, dp_tensor *g, const ag_node *n)
{
    int dim = (int)n->iarg[1];
    bool keep = n->iarg[2] || dim == DP_ALL_DIMS;
    dp_tensor *u = NULL;
    dp_status st;
    if (dim == DP_ALL_DIMS || keep || n->in[0].ndim == 0)
        st = dp_reshape(&u, g, dim == DP_ALL_DIMS ? 0 : g->ndim, g->shape);
    else
        st = dp_unsqueeze(&u, g, dim);
    if (!st)
        st = dp_expand(out, u, n->in[0].ndim, n->in[0].shape);
    dp_tensor_release(u);
    return st;
}

static int64_t reduced_count(const ag_node *n)
{
    int dim = (int)n->iarg[1];
    if (dim == DP_ALL_DIMS || n->in[0].ndim == 0) {
        int64_t c = 1;
        for (int i = 0; i < n->in[0].ndim; i++)
            c *= n->in[0].shape[i];
        return c;
    }
    return n->in[0].shape[dim];
}

dp_status bw_reduce(ag_node *n, dp_tensor *g, dp_tensor **gi)
{
    dp_tensor *ge = NULL, *t = NULL, *u = NULL, *ye = NULL, *mask = NULL, *mf = NULL, *cnt = NULL, *mean = NULL,
              *dev = NULL;
    dp_tensor *x = n->saved[0], *y = n->saved[1];
    int op = (int)n->iarg[0], dim = (int)n->iarg[1];
    int64_t count = reduced_count(n);
    dp_status st = expand_back(&ge, g, n);
    if (st)
        return st;
    switch (op) {
    case DP_SUM:
        st = give(n, 0, ge, gi);
        break;
    case DP_MEAN:
        if (!(st = dp_binary_scalar(&t, DP_DIV, ge, (double)count, 0)))
            st = give(n, 0, t, gi);
        break;
    case DP_PROD:
        if (!(st = expand_back(&ye, y, n)) && !(st = dp_binary(&t, DP_MUL, ge, ye)) &&
            !(st = dp_binary(&u, DP_DIV, t, x)))
            st = give(n, 0, u, gi);
        break;
    case DP_MAX: case DP_MIN: {
        /* evenly among the elements equal to the result */
        bool keep = n->iarg[2] || dim == DP_ALL_DIMS;
        if (!(st = expand_back(&ye, y, n)) && !(st = dp_binary(&mask, DP_EQ, x, ye)) &&
            !(st = dp_to(&mf, mask, g->dtype, g->device)) &&
            !(st = dim == DP_ALL_DIMS ? dp_reduce(&cnt, DP_SUM, mf, DP_ALL_DIMS, 0, 0)
                                      : dp_reduce(&cnt, DP_SUM, mf, dim, 1, 0)) &&
            !(st = dp_binary(&t, DP_MUL, ge, mf)) && !(st = dp_binary(&u, DP_DIV, t, cnt)))
            st = give(n, 0, u, gi);
        (void)keep;
        break;
    }
    case DP_VAR: case DP_STD: {
        double denom = (double)(count - n->iarg[3]);
        if (!(st = dim == DP_ALL_DIMS ? dp_reduce(&mean, DP_MEAN, x, DP_ALL_DIMS, 0, 0)
                                      : dp_reduce(&mean, DP_MEAN, x, dim, 1, 0)) &&
            !(st = dp_binary(&dev, DP_SUB, x, mean)) && !(st = dp_binary(&t, DP_MUL, ge, dev))) {
            if (op == DP_VAR) {
                if (!(st = dp_binary_scalar(&u, DP_MUL, t, 2.0 / denom, 0)))
                    st = give(n, 0, u, gi);
            } else if (!(st = expand_back(&ye, y, n)) && !(st = dp_binary(&mf, DP_DIV, t, ye)) &&
                       !(st = dp_binary_scalar(&u, DP_DIV, mf, denom, 0))) {
                st = give(n, 0, u, gi);
            }
        }
        break;
    }
    case DP_NORM:
        /* x / norm, and 0 where the norm is 0 (PyTorch's subgradient) */
        if (!(st = expand_back(&ye, y, n)) && !(st = dp_binary(&t, DP_DIV, ge, ye)) &&
            !(st = dp_binary_scalar(&mask, DP_EQ, ye, 0.0, 0)) &&
            !(st = dp_full(&cnt, 0, NULL, 0, t->dtype, t->device)) &&
            !(st = dp_where(&mf, mask, cnt, t)) && !(st = dp_binary(&u, DP_MUL, mf, x)))
            st = give(n, 0, u, gi);
        break;
    default:
        st = dp_fail(DP_ERR_STATE, "backward: reduction %d has no derivative", op);
    }
    DROP(ge, t, u, ye, mask, mf, cnt, mean, dev);
    return st;
}

/* max/min with a dim: the gradient goes to the returned index only. */
dp_status bw_reduce_index(ag_node *n, dp_tensor *g, dp_tensor **gi)
{
    dp_tensor *idx = n->saved[0], *ge = NULL, *ie = NULL, *ar = NULL, *arv = NULL, *hit = NULL, *zero = NULL,
              *ga = NULL;
    int dim = (int)n->iarg[1], nd = n->in[0].ndim;
    int64_t shape[DP_MAX_DIMS];
    if (nd == 0)   /* the max of one element is that element */
        return give(n, 0, g, gi);
    for (int i = 0; i < nd; i++)
        shape[i] = i == dim ? n->in[0].shape[i] : 1;
    dp_status st;
    if (!(st = expand_back(&ge, g, n)) && !(st = expand_back(&ie, idx, n)) &&
        !(st = dp_arange(&ar, 0, (double)n->in[0].shape[dim], 1, DP_INT64, g->device)) &&
        !(st = dp_view(&arv, ar, nd, shape)) && !(st = dp_binary(&hit, DP_EQ, ie, arv)) &&
        !(st = dp_full(&zero, 0, NULL, 0, g->dtype, g->device)) && !(st = dp_where(&ga, hit, ge, zero)))
        st = give(n, 0, ga, gi);
    DROP(ge, ie, ar, arv, hit, zero, ga);
    return st;
}

dp_status bw_softmax(ag_node *n, dp_tensor *g, dp_tensor **gi)
{
    dp_tensor *y = n->saved[0], *gy = NULL, *s = NULL, *d = NULL, *ga = NULL, *e = NULL;
    int dim = (int)n->iarg[0];
    dp_status st;
    if (n->grad_masked)   /* an nll_loss's backward made g through this log_softmax */
        return give(n, 0, g, gi);
    if (ON_CPU(y) && g->dtype == y->dtype) {   /* one kernel; g may be a broadcast view */
        if (!(st = tensor_new(&ga, y->ndim, y->shape, y->dtype, y->device)) &&
            !(st = cpu_softmax_backward(ga, g, y, dim, (int)n->iarg[1])))
            st = give(n, 0, ga, gi);
    } else if (n->iarg[1]) {
        /* log_softmax: g - exp(y) * sum(g) */
        if (!(st = dp_reduce(&s, DP_SUM, g, dim, 1, 0)) && !(st = dp_unary(&e, DP_EXP, y)) &&
            !(st = dp_binary(&gy, DP_MUL, e, s)) && !(st = dp_binary(&ga, DP_SUB, g, gy)))
            st = give(n, 0, ga, gi);
    } else {
        /* softmax: y * (g - sum(g * y)) */
        if (!(st = dp_binary(&gy, DP_MUL, g, y)) && !(st = dp_reduce(&s, DP_SUM, gy, dim, 1, 0)) &&
            !(st = dp_binary(&d, DP_SUB, g, s)) && !(st = dp_binary(&ga, DP_MUL, y, d)))
            st = give(n, 0, ga, gi);
    }
    DROP(gy, s, d, ga, e);
    return st;
}

/* ---------------------------------------------------------------- matmul */

/* a @ b where 1-D operands were promoted: ga = g @ b^T, gb = a^T @ g,
 * each summed over broadcast batch dims back to the operand's shape. */
dp_status bw_matmul(ag_node *n, dp_tensor *g, dp_tensor **gi)
{
    dp_tensor *a = n->saved[0], *b = n->saved[1];
    dp_tensor *a2 = NULL, *b2 = NULL, *g2 = NULL, *bt = NULL, *at = NULL, *ga = NULL, *gb = NULL;
    int64_t gshape[DP_MAX_DIMS];
    int gnd = 0;
    dp_status st = DP_OK;
    bool a_vec = a->ndim == 1, b_vec = b->ndim == 1;
    /* g with the dims that 1-D operands dropped put back */
    memcpy(gshape, g->shape, sizeof(int64_t) * (size_t)g->ndim);
    gnd = g->ndim;
    if (a_vec) { /* insert m = 1 before the last (n) dim, or at the end when b is a vector too */
        int at_dim = b_vec ? gnd : gnd - 1;
        memmove(gshape + at_dim + 1, gshape + at_dim, sizeof(int64_t) * (size_t)(gnd - at_dim));
        gshape[at_dim] = 1;
        gnd++;
    }
    if (b_vec)
        gshape[gnd++] = 1;
    if ((st = a_vec ? dp_unsqueeze(&a2, a, 0) : dp_alias(&a2, a)) ||
        (st = b_vec ? dp_unsqueeze(&b2, b, 1) : dp_alias(&b2, b)) ||
        (st = dp_reshape(&g2, g, gnd, gshape)))
        goto done;
    if (n->in[0].needs_grad) {
        ag_input in = n->in[0];
        if (a_vec) { in.ndim = 2; in.shape[1] = in.shape[0]; in.shape[0] = 1; }
        dp_tensor *s = NULL;
        if (!(st = dp_transpose(&bt, b2, -1, -2)) && !(st = dp_matmul(&ga, g2, bt)) &&
            !(st = ag_sum_to(&s, ga, &in)))
            st = dp_reshape(&gi[0], s, n->in[0].ndim, n->in[0].shape);
        dp_tensor_release(s);
    }
    if (!st && n->in[1].needs_grad) {
        ag_input in = n->in[1];
        if (b_vec) { in.ndim = 2; in.shape[1] = 1; }
        dp_tensor *s = NULL;
        if (!(st = dp_transpose(&at, a2, -1, -2)) && !(st = dp_matmul(&gb, at, g2)) &&
            !(st = ag_sum_to(&s, gb, &in)))
            st = dp_reshape(&gi[1], s, n->in[1].ndim, n->in[1].shape);
        dp_tensor_release(s);
    }
done:
    DROP(a2, b2, g2, bt, at, ga, gb);
    return st;
}

/* ---------------------------------------------------------------- views and copies */

/* view, reshape, squeeze, unsqueeze, flatten: the same elements in another shape */
dp_status bw_reshape(ag_node *n, dp_tensor *g, dp_tensor **gi)
{
    return dp_reshape(&gi[0], g, n->in[0].ndim, n->in[0].shape);
}

dp_status bw_expand(ag_node *n, dp_tensor *g, dp_tensor **gi)
{
    return give(n, 0, g, gi);
}

/* clone, contiguous, to(dtype): the gradient in the input's dtype; a
 * cast (autocast's of each weight) is written straight into the leaf's
 * flat gradient slot where it has one, not into a new tensor then copied */
dp_status bw_identity(ag_node *n, dp_tensor *g, dp_tensor **gi)
{
    const ag_input *in = &n->in[0];
    if (!in->needs_grad || g->dtype == in->dtype || g->device != in->device || !same_shape(g, in))
        return give(n, 0, g, gi);
    dp_status st = ag_grad_output(n, 0, &gi[0]);
    if (!st && (st = k_copy(gi[0], g))) {
        dp_tensor_release(gi[0]);
        gi[0] = NULL;
    }
    return st;
}

dp_status bw_permute(ag_node *n, dp_tensor *g, dp_tensor **gi)
{
    int inv[DP_MAX_DIMS];
    for (int i = 0; i < n->in[0].ndim; i++)
        inv[n->iarg[i]] = i;
    return dp_permute(&gi[0], g, n->in[0].ndim, inv);
}

/* slice (iarg: dim, start, stop, step) or select (iarg: dim, index, -1):
 * g added into the same window of the gradient the input's node has
 * gathered so far (another window's: split's pieces, a loop of selects),
 * else written into zeros of the input's shape, given on. */
dp_status bw_window(ag_node *n, dp_tensor *g, dp_tensor **gi)
{
    dp_tensor *z = ag_pending_grad(n, 0), *w = NULL;
    bool into = z && z->dtype == g->dtype;
    dp_status st = DP_OK;
    if (into) {
        dp_tensor_retain(z);
        z->storage->version++;
    } else if ((st = dp_full(&z, n->in[0].ndim, n->in[0].shape, 0, g->dtype, g->device))) {
        return st;
    }
    if (n->iarg[4])
        st = dp_select(&w, z, (int)n->iarg[0], n->iarg[1]);
    else
        st = dp_slice(&w, z, (int)n->iarg[0], n->iarg[1], n->iarg[2], n->iarg[3]);
    if (!st)
        st = into ? dp_binary_into(w, DP_ADD, w, g) : dp_copy_into(w, g);
    if (!st && !into)
        st = give(n, 0, z, gi);
    DROP(z, w);
    return st;
}

dp_status bw_cat(ag_node *n, dp_tensor *g, dp_tensor **gi)
{
    int dim = (int)n->iarg[0];
    int64_t at = 0;
    dp_status st = DP_OK;
    for (int i = 0; i < n->ninputs && !st; i++) {
        int64_t len = n->in[i].shape[dim];
        if (n->in[i].needs_grad) {
            dp_tensor *part;
            if (!(st = dp_narrow(&part, g, dim, at, len))) {
                st = give(n, i, part, gi);
                dp_tensor_release(part);
            }
        }
        at += len;
    }
    return st;
}

/* index_select: the rows of g added back at their indices with
 * index_add into zeros, in place in the leaf's flat gradient slot when it
 * has one (an Embedding's weight: no copy of the whole table's gradient
 * afterwards). */
dp_status bw_index_select(ag_node *n, dp_tensor *g, dp_tensor **gi)
{
    if (!n->in[0].needs_grad)
        return DP_OK;
    dp_tensor *z = NULL, *gc = NULL;
    bool in_place = g->dtype == n->in[0].dtype && g->device == n->in[0].device;
    dp_status st = in_place ? ag_grad_output(n, 0, &z) : dp_full(&z, n->in[0].ndim, n->in[0].shape, 0, g->dtype,
                                                                   g->device);
    if (!st && in_place)
        st = k_fill(z, 0);
    if (!st && !(st = dp_contiguous(&gc, g)) && !(st = k_index_add(z, (int)n->iarg[0], n->saved[0], gc)))
        st = give(n, 0, z, gi);
    DROP(z, gc);
    return st;
}

/* scatter(_add): the input's gradient is g (scatter: zero where src was
 * written); src's is g gathered at the index, placed in zeros of src's
 * shape when the index covers only part of it. */
dp_status bw_scatter(ag_node *n, dp_tensor *g, dp_tensor **gi)
{
    dp_tensor *index = n->saved[0], *ga = NULL, *zeros = NULL, *gs = NULL, *whole = NULL, *part = NULL;
    int dim = (int)n->iarg[0];
    dp_status st = DP_OK;
    if (n->in[0].needs_grad) {
        if (n->iarg[1]) {
            st = give(n, 0, g, gi);
        } else if (!(st = dp_clone(&ga, g)) && !(st = dp_full(&zeros, index->ndim, index->shape, 0, g->dtype, g->device)) &&
                   !(st = k_scatter(ga, dim, index, zeros))) {
            st = give(n, 0, ga, gi);
        }
    }
    if (!st && n->in[1].needs_grad && !(st = dp_gather(&gs, g, dim, index))) {
        const ag_input *in = &n->in[1];
        if (gs->ndim == in->ndim && !memcmp(gs->shape, in->shape, sizeof(int64_t) * (size_t)in->ndim)) {
            st = give(n, 1, gs, gi);
        } else if (!(st = dp_full(&whole, in->ndim, in->shape, 0, g->dtype, g->device))) {
            part = whole;
            dp_tensor_retain(part);
            for (int d = 0; d < in->ndim && !st; d++) {
                dp_tensor *v;
                if (!(st = dp_narrow(&v, part, d, 0, gs->shape[d]))) {
                    dp_tensor_release(part);
                    part = v;
                }
            }
            if (!st && !(st = k_copy(part, gs)))
                st = give(n, 1, whole, gi);
        }
    }
    DROP(ga, zeros, gs, whole, part);
    return st;
}

dp_status bw_gather(ag_node *n, dp_tensor *g, dp_tensor **gi)
{
    dp_tensor *z = NULL;
    dp_status st = dp_full(&z, n->in[0].ndim, n->in[0].shape, 0, g->dtype, g->device);
    if (!st && !(st = k_scatter_add(z, (int)n->iarg[0], n->saved[0], g)))
        st = give(n, 0, z, gi);
    dp_tensor_release(z);
    return st;
}
