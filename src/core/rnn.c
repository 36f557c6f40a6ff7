/*
 * rnn.c — the recurrent layers' pointwise step as fused ops: one
 * timestep's gates of an LSTM (dp_lstm_gates) or a GRU (dp_gru_gates),
 * each one node on the tape with a backward of one kernel. nn.LSTM and
 * nn.GRU (lua/dplua/nn/rnn.lua) compute the products around them.
 */
#include "core/autograd.h"
#include "core/kernels.h"

/* Operand `what` of fn is a contiguous-able (rows, cols) matrix of ref's
 * dtype (float32 or float64) and device. */
static dp_status check_operand(const char *fn, const char *what, const dp_tensor *t, const dp_tensor *ref,
                               int64_t rows, int64_t cols)
{
    char s1[160];
    if (t->ndim != 2 || t->shape[0] != rows || t->shape[1] != cols)
        return dp_fail(DP_ERR_SHAPE, "%s: expected %s of shape [%lld, %lld], got %s", fn, what, (long long)rows,
                       (long long)cols, dp_shape_str(s1, sizeof s1, t->ndim, t->shape));
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
