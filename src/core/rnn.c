/*
 * rnn.c — the recurrent layers as fused ops: one timestep's gates of an
 * LSTM (dp_lstm_gates) or a GRU (dp_gru_gates), each one node on the tape
 * with a backward of one kernel, and a whole LSTM layer over a sequence
 * (dp_lstm_layer), one node whose backward runs the timesteps in C.
 * nn.LSTM and nn.GRU (lua/dplua/nn/rnn.lua) compute the input products
 * around them.
 */
#include "core/autograd.h"
#include "core/kernels.h"

#include <string.h>

/* Operand `what` of fn has the shape (ndim, shape) and ref's dtype
 * (float32 or float64) and device. */
static dp_status check_shaped(const char *fn, const char *what, const dp_tensor *t, const dp_tensor *ref, int ndim,
                              const int64_t *shape)
{
    char s1[160], s2[160];
    if (t->ndim != ndim || memcmp(t->shape, shape, sizeof(int64_t) * (size_t)ndim))
        return dp_fail(DP_ERR_SHAPE, "%s: expected %s of shape %s, got %s", fn, what,
                       dp_shape_str(s1, sizeof s1, ndim, shape), dp_shape_str(s2, sizeof s2, t->ndim, t->shape));
    if (t->dtype != DP_FLOAT32 && t->dtype != DP_FLOAT64)
        return dp_fail(DP_ERR_DTYPE, "%s: expected %s to be float32 or float64, got %s", fn, what,
                       dp_dtype_name(t->dtype));
    if (t->dtype != ref->dtype)
        return dp_fail(DP_ERR_DTYPE, "%s: expected %s of dtype %s (the state's), got %s", fn, what,
                       dp_dtype_name(ref->dtype), dp_dtype_name(t->dtype));
    if (t->device != ref->device)
        return dp_fail(DP_ERR_DEVICE, "%s: expected %s on the state's device %d, got device %d (-1 is the CPU)", fn,
                       what, ref->device, t->device);
    return DP_OK;
}

/* Operand `what` of fn is a (rows, cols) matrix of ref's dtype and device. */
static dp_status check_operand(const char *fn, const char *what, const dp_tensor *t, const dp_tensor *ref,
                               int64_t rows, int64_t cols)
{
    return check_shaped(fn, what, t, ref, 2, (int64_t[]){ rows, cols });
}

static dp_status check_state(const char *fn, const char *what, const dp_tensor *t)
{
    char s1[160];
    if (t->ndim != 2)
        return dp_fail(DP_ERR_SHAPE, "%s: expected %s to be 2-D (N, H), got %s", fn, what,
                       dp_shape_str(s1, sizeof s1, t->ndim, t->shape));
    return check_operand(fn, what, t, t, t->shape[0], t->shape[1]);
}

/* Contiguous copies (or the tensors themselves, retained) of n inputs. */
static dp_status contiguous_all(int n, dp_tensor *const *in, dp_tensor **out)
{
    dp_status st = DP_OK;
    for (int i = 0; i < n; i++)
        out[i] = NULL;
    for (int i = 0; i < n && !st; i++)
        st = dp_contiguous(&out[i], in[i]);
    return st;
}

static void release_all(int n, dp_tensor **t)
{
    for (int i = 0; i < n; i++)
        dp_tensor_release(t[i]);
}

/* Each input's gradient that the node wants, else the scratch tensor is dropped. */
static void hand_out(ag_node *n, dp_tensor **grads, dp_tensor **gi)
{
    for (int i = 0; i < n->ninputs; i++) {
        if (n->in[i].needs_grad)
            gi[i] = grads[i];
        else
            dp_tensor_release(grads[i]);
    }
}

/* ---------------------------------------------------------------- LSTM */

/* saved gi, gh, c and the output; g (2, N, H): the gradients of h' and
 * c'. gi and gh get one gradient, the gates'. */
static dp_status bw_lstm_gates(ag_node *n, dp_tensor *g, dp_tensor **gi)
{
    dp_tensor *xi = n->saved[0], *hh = n->saved[1], *c = n->saved[2], *out = n->saved[3];
    dp_tensor *gc = NULL, *c1 = NULL, *grads[3] = { NULL, NULL, NULL };
    dp_status st;
    if (!(st = dp_contiguous(&gc, g)) && !(st = dp_select(&c1, out, 0, 1)) &&
        !(st = tensor_new(&grads[0], 2, xi->shape, c->dtype, c->device)) &&
        !(st = tensor_new(&grads[2], 2, c->shape, c->dtype, c->device)) &&
        !(st = k_lstm_gates_backward(grads[0], grads[2], gc, xi, hh, c, c1))) {
        grads[1] = grads[0];
        dp_tensor_retain(grads[1]);
        hand_out(n, grads, gi);
        grads[0] = grads[1] = grads[2] = NULL;
    }
    release_all(3, grads);
    dp_tensor_release(gc);
    dp_tensor_release(c1);
    return st;
}

dp_status dp_lstm_gates(dp_tensor **out, dp_tensor *gi, dp_tensor *gh, dp_tensor *c)
{
    const char *fn = "lstm_gates";
    dp_status st = check_state(fn, "c", c);
    if (!st)
        st = check_operand(fn, "gi", gi, c, c->shape[0], 4 * c->shape[1]);
    if (!st)
        st = check_operand(fn, "gh", gh, c, c->shape[0], 4 * c->shape[1]);
    if (st)
        return st;
    dp_tensor *in[3] = { gi, gh, c }, *cc[3];
    int64_t shape[3] = { 2, c->shape[0], c->shape[1] };
    if (!(st = contiguous_all(3, in, cc)) && !(st = tensor_new(out, 3, shape, c->dtype, c->device)) &&
        (st = k_lstm_gates(*out, cc[0], cc[1], cc[2])))
        dp_tensor_release(*out);
    ag_node *n = NULL;
    if (!st && !(st = ag_record_or_drop(out, "LstmGatesBackward", bw_lstm_gates, 3, in, &n)) && n) {
        for (int i = 0; i < 3; i++)
            ag_save(n, cc[i]);
        ag_save_output(n, *out);
    }
    release_all(3, cc);
    return st;
}

/* ---------------------------------------------------------------- GRU */

/* saved gi, gh, h; g (N, H): the gradient of h' */
static dp_status bw_gru_gates(ag_node *n, dp_tensor *g, dp_tensor **gi)
{
    dp_tensor *xi = n->saved[0], *hh = n->saved[1], *h = n->saved[2];
    dp_tensor *gc = NULL, *grads[3] = { NULL, NULL, NULL };
    dp_status st;
    if (!(st = dp_contiguous(&gc, g)) && !(st = tensor_new(&grads[0], 2, xi->shape, h->dtype, h->device)) &&
        !(st = tensor_new(&grads[1], 2, hh->shape, h->dtype, h->device)) &&
        !(st = tensor_new(&grads[2], 2, h->shape, h->dtype, h->device)) &&
        !(st = k_gru_gates_backward(grads[0], grads[1], grads[2], gc, xi, hh, h))) {
        hand_out(n, grads, gi);
        grads[0] = grads[1] = grads[2] = NULL;
    }
    release_all(3, grads);
    dp_tensor_release(gc);
    return st;
}

dp_status dp_gru_gates(dp_tensor **out, dp_tensor *gi, dp_tensor *gh, dp_tensor *h)
{
    const char *fn = "gru_gates";
    dp_status st = check_state(fn, "h", h);
    if (!st)
        st = check_operand(fn, "gi", gi, h, h->shape[0], 3 * h->shape[1]);
    if (!st)
        st = check_operand(fn, "gh", gh, h, h->shape[0], 3 * h->shape[1]);
    if (st)
        return st;
    dp_tensor *in[3] = { gi, gh, h }, *cc[3];
    if (!(st = contiguous_all(3, in, cc)) && !(st = tensor_new(out, 2, h->shape, h->dtype, h->device)) &&
        (st = k_gru_gates(*out, cc[0], cc[1], cc[2])))
        dp_tensor_release(*out);
    ag_node *n = NULL;
    if (!st && !(st = ag_record_or_drop(out, "GruGatesBackward", bw_gru_gates, 3, in, &n)) && n)
        for (int i = 0; i < 3; i++)
            ag_save(n, cc[i]);
    release_all(3, cc);
    return st;
}

/* ---------------------------------------------------------------- LSTM layer */

/* The view of t[i] along its first dim. */
static dp_status row_view(dp_tensor **v, dp_tensor *t, int64_t i)
{
    return tensor_view_of(v, t, t->ndim - 1, t->shape + 1, t->stride + 1, t->offset + i * t->stride[0]);
}

/* The view of t[i][k]. */
static dp_status pair_view(dp_tensor **v, dp_tensor *t, int64_t i, int64_t k)
{
    return tensor_view_of(v, t, t->ndim - 2, t->shape + 2, t->stride + 2,
                          t->offset + i * t->stride[0] + k * t->stride[1]);
}

/* y (2, T + 1, N, H) of the forward (y[0][t] = h_t, y[1][t] = c_t): every
 * previous h, y[0][0..T-1], as one (T N, H) matrix, the operand of the
 * recurrent weight's gradient */
static dp_status previous_hs(dp_tensor **hs, dp_tensor *y)
{
    int64_t T = y->shape[1] - 1, N = y->shape[2], H = y->shape[3];
    return tensor_view_of(hs, y, 2, (int64_t[]){ T * N, H }, (int64_t[]){ H, 1 }, y->offset);
}

/* d (2, N, H) = g[0][t] and g[1][t] */
static dp_status copy_pair(dp_tensor *d, dp_tensor *g, int64_t t)
{
    dp_status st = DP_OK;
    for (int64_t k = 0; k < 2 && !st; k++) {
        dp_tensor *dst = NULL, *src = NULL;
        if (!(st = row_view(&dst, d, k)) && !(st = pair_view(&src, g, k, t)))
            st = k_copy(dst, src);
        dp_tensor_release(dst);
        dp_tensor_release(src);
    }
    return st;
}

/* One timestep of the backward, t from the end: from d (2, N, H), the
 * gradients of h_t and c_t, the gates' gradient dgates[t] (N, 4H), then d
 * becomes the gradients of h_{t-1} and c_{t-1}: the recurrent product
 * dgates[t] w_hh and dc, plus what y itself got there (g[.][t]). */
static dp_status lstm_step_back(ag_node *n, dp_tensor *g, dp_tensor *dgates, dp_tensor *d, dp_tensor *dc, int64_t t)
{
    dp_tensor *xi = n->saved[0], *gh = n->saved[1], *w = n->saved[2], *y = n->saved[3];
    dp_tensor *dg = NULL, *a = NULL, *b = NULL, *cp = NULL, *cn = NULL, *hp = NULL, *d0 = NULL, *d1 = NULL;
    dp_tensor *g0 = NULL, *g1 = NULL;
    dp_status st;
    if (!(st = row_view(&dg, dgates, t)) && !(st = row_view(&a, xi, t)) && !(st = row_view(&b, gh, t)) &&
        !(st = pair_view(&cp, y, 1, t)) && !(st = pair_view(&cn, y, 1, t + 1)) && !(st = pair_view(&hp, y, 0, t)) &&
        !(st = row_view(&d0, d, 0)) && !(st = row_view(&d1, d, 1)) && !(st = pair_view(&g0, g, 0, t)) &&
        !(st = pair_view(&g1, g, 1, t)) && !(st = k_lstm_gates_backward(dg, dc, d, a, b, cp, cn)) &&
        !(st = k_linear_backward(d0, NULL, NULL, dg, hp, w, NULL, 0)) && !(st = k_binary(DP_ADD, d0, d0, g0)))
        st = k_binary(DP_ADD, d1, dc, g1);
    dp_tensor *all[] = { dg, a, b, cp, cn, hp, d0, d1, g0, g1 };
    release_all((int)(sizeof all / sizeof all[0]), all);
    return st;
}

/* The gradients of the inputs gi, h0, c0, w_hh, b_hh: dgates (T, N, 4H),
 * d's two halves, and the products of dgates with every previous h. */
static dp_status lstm_layer_grads(ag_node *n, dp_tensor *dgates, dp_tensor *d, dp_tensor **gi)
{
    dp_tensor *y = n->saved[3], *w = n->saved[2], *hs = NULL, *dg2 = NULL;
    int64_t T = dgates->shape[0], N = dgates->shape[1], G = dgates->shape[2];
    dp_status st = DP_OK;
    for (int i = 1; i < 3 && !st; i++) {
        dp_tensor *v = NULL;
        if (n->in[i].needs_grad && !(st = row_view(&v, d, i - 1)))
            st = dp_clone(&gi[i], v);
        dp_tensor_release(v);
    }
    bool dw = n->in[3].needs_grad, db = n->ninputs > 4 && n->in[4].needs_grad;
    if (!st && (dw || db) && !(st = previous_hs(&hs, y)) &&
        !(st = tensor_view_of(&dg2, dgates, 2, (int64_t[]){ T * N, G }, (int64_t[]){ G, 1 }, dgates->offset)) &&
        !(st = dw ? ag_grad_output(n, 3, &gi[3]) : DP_OK) && !(st = db ? ag_grad_output(n, 4, &gi[4]) : DP_OK))
        st = k_linear_backward(NULL, dw ? gi[3] : NULL, db ? gi[4] : NULL, dg2, hs, w, NULL, 0);
    if (!st && n->in[0].needs_grad) {
        dp_tensor_retain(dgates);
        gi[0] = dgates;
    }
    dp_tensor_release(hs);
    dp_tensor_release(dg2);
    return st;
}

/* saved gi, gh (T, N, 4H), w_hh and the output y (2, T + 1, N, H); g of
 * y's shape */
static dp_status bw_lstm_layer(ag_node *n, dp_tensor *g, dp_tensor **gi)
{
    dp_tensor *xi = n->saved[0], *y = n->saved[3];
    int64_t T = xi->shape[0], N = y->shape[2], H = y->shape[3];
    dp_tensor *gc = NULL, *dgates = NULL, *d = NULL, *dc = NULL;
    dp_status st;
    if (!(st = dp_contiguous(&gc, g)) && !(st = tensor_new(&dgates, 3, xi->shape, xi->dtype, xi->device)) &&
        !(st = tensor_new(&d, 3, (int64_t[]){ 2, N, H }, y->dtype, y->device)) &&
        !(st = tensor_new(&dc, 2, (int64_t[]){ N, H }, y->dtype, y->device)))
        st = copy_pair(d, gc, T);
    for (int64_t t = T - 1; t >= 0 && !st; t--)
        st = lstm_step_back(n, gc, dgates, d, dc, t);
    if (!st)
        st = lstm_layer_grads(n, dgates, d, gi);
    dp_tensor *all[] = { gc, dgates, d, dc };
    release_all((int)(sizeof all / sizeof all[0]), all);
    return st;
}

static dp_status lstm_layer_check(dp_tensor *gi, dp_tensor *h0, dp_tensor *c0, dp_tensor *w_hh, dp_tensor *b_hh)
{
    const char *fn = "lstm_layer";
    char s1[160];
    dp_status st = check_state(fn, "h0", h0);
    if (st)
        return st;
    int64_t N = h0->shape[0], H = h0->shape[1];
    if (gi->ndim != 3 || gi->shape[0] < 1)
        return dp_fail(DP_ERR_SHAPE, "%s: expected gi of shape [T, %lld, %lld] with T >= 1, got %s", fn, (long long)N,
                       (long long)(4 * H), dp_shape_str(s1, sizeof s1, gi->ndim, gi->shape));
    if (!(st = check_shaped(fn, "gi", gi, h0, 3, (int64_t[]){ gi->shape[0], N, 4 * H })) &&
        !(st = check_operand(fn, "c0", c0, h0, N, H)) && !(st = check_operand(fn, "w_hh", w_hh, h0, 4 * H, H)) && b_hh)
        st = check_shaped(fn, "b_hh", b_hh, h0, 1, (int64_t[]){ 4 * H });
    return st;
}

/* y (2, T + 1, N, H) = h0, then h_t after each timestep t, and the same
 * of the c's; gh (T, N, 4H), or (1, N, 4H) reused when no backward
 * follows, gets each timestep's recurrent product h_{t-1} w_hh^T + b_hh.
 * The gate kernel writes (h_t, c_t) into hc (2, N, H), copied into y.
 * Operands contiguous. */
static dp_status lstm_layer_run(dp_tensor *y, dp_tensor *gh, dp_tensor *hc, dp_tensor *gi, dp_tensor *h0,
                                dp_tensor *c0, dp_tensor *w, dp_tensor *b)
{
    dp_status st = DP_OK;
    for (int64_t k = 0; k < 2 && !st; k++) {
        dp_tensor *v = NULL;
        if (!(st = pair_view(&v, y, k, 0)))
            st = k_copy(v, k ? c0 : h0);
        dp_tensor_release(v);
    }
    for (int64_t t = 0; t < gi->shape[0] && !st; t++) {
        dp_tensor *hp = NULL, *cp = NULL, *a = NULL, *r = NULL, *h1 = NULL, *c1 = NULL, *hn = NULL, *cn = NULL;
        if (!(st = pair_view(&hp, y, 0, t)) && !(st = pair_view(&cp, y, 1, t)) && !(st = row_view(&a, gi, t)) &&
            !(st = row_view(&r, gh, gh->shape[0] > 1 ? t : 0)) && !(st = k_linear(r, hp, w, b)) &&
            !(st = k_lstm_gates(hc, a, r, cp)) && !(st = row_view(&h1, hc, 0)) && !(st = row_view(&c1, hc, 1)) &&
            !(st = pair_view(&hn, y, 0, t + 1)) && !(st = pair_view(&cn, y, 1, t + 1)) && !(st = k_copy(hn, h1)))
            st = k_copy(cn, c1);
        dp_tensor *all[] = { hp, cp, a, r, h1, c1, hn, cn };
        release_all((int)(sizeof all / sizeof all[0]), all);
    }
    return st;
}

dp_status dp_lstm_layer(dp_tensor **out, dp_tensor *gi, dp_tensor *h0, dp_tensor *c0, dp_tensor *w_hh,
                        dp_tensor *b_hh)
{
    dp_status st = lstm_layer_check(gi, h0, c0, w_hh, b_hh);
    if (st)
        return st;
    int nin = b_hh ? 5 : 4;
    dp_tensor *in[5] = { gi, h0, c0, w_hh, b_hh }, *cc[5] = { NULL }, *gh = NULL, *hc = NULL;
    int64_t T = gi->shape[0], N = h0->shape[0], H = h0->shape[1];
    int64_t yshape[4] = { 2, T + 1, N, H }, ghshape[3] = { ag_needs_record(nin, in) ? T : 1, N, 4 * H };
    if (!(st = contiguous_all(nin, in, cc)) && !(st = tensor_new(&gh, 3, ghshape, h0->dtype, h0->device)) &&
        !(st = tensor_new(&hc, 3, (int64_t[]){ 2, N, H }, h0->dtype, h0->device)) &&
        !(st = tensor_new(out, 4, yshape, h0->dtype, h0->device)) &&
        (st = lstm_layer_run(*out, gh, hc, cc[0], cc[1], cc[2], cc[3], cc[4])))
        dp_tensor_release(*out);
    ag_node *n = NULL;
    if (!st && !(st = ag_record_or_drop(out, "LstmLayerBackward", bw_lstm_layer, nin, in, &n)) && n) {
        ag_save(n, cc[0]);
        ag_save(n, gh);
        ag_save(n, cc[3]);
        ag_save_output(n, *out);
    }
    release_all(nin, cc);
    dp_tensor_release(gh);
    dp_tensor_release(hc);
    return st;
}
