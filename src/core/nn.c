/*
 * nn.c — the fused nn ops: linear, cross-entropy (and nll), unfold
 * (im2col, which a GPU's conv2d and pooling are built on) and the CPU's
 * conv2d and max_pool2d, each with its own backward so that a layer is
 * one node on the tape.
 */
#include "core/autograd.h"
#include "core/kernels.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static void drop3(dp_tensor *a, dp_tensor *b, dp_tensor *c)
{
    dp_tensor_release(a);
    dp_tensor_release(b);
    dp_tensor_release(c);
}

/* ---------------------------------------------------------------- linear */

/* x (.., in) as a matrix (M, in) */
static dp_status as_matrix(dp_tensor **out, dp_tensor *x)
{
    int64_t shape[2] = { -1, x->shape[x->ndim - 1] };
    if (x->ndim == 1)
        shape[0] = 1;
    return dp_reshape(out, x, 2, shape);
}

/* t's rows: t itself when 2-D, else its (M, last dim) view, made without a
 * node (the linear's node takes the N-D tensor itself) */
static dp_status rows_of(dp_tensor **rows, dp_tensor *t)
{
    if (t->ndim == 2) {
        dp_tensor_retain(t);
        *rows = t;
        return DP_OK;
    }
    int was = dp_set_grad_enabled(0);
    dp_status st = as_matrix(rows, t);
    dp_set_grad_enabled(was);
    return st;
}

/* m (M, n) viewed with x's leading dims and n, without a node */
static dp_status shaped_as_rows_of(dp_tensor **out, dp_tensor *m, const dp_tensor *x)
{
    if (x->ndim == 2) {
        dp_tensor_retain(m);
        *out = m;
        return DP_OK;
    }
    int64_t shape[DP_MAX_DIMS];
    memcpy(shape, x->shape, sizeof(int64_t) * (size_t)x->ndim);
    shape[x->ndim - 1] = m->shape[1];
    int was = dp_set_grad_enabled(0);
    dp_status st = dp_reshape(out, m, x->ndim, shape);
    dp_set_grad_enabled(was);
    return st;
}

/* The direct path: x's rows (2-D), everything contiguous on one device in
 * one float dtype (bfloat16 on a GPU only: cuBLASLt takes it, the CPU
 * kernels do not). */
static bool linear_direct(const dp_tensor *x, const dp_tensor *w, const dp_tensor *b)
{
    bool dtype_ok = x->dtype == DP_FLOAT32 || x->dtype == DP_FLOAT64 || (x->dtype == DP_BFLOAT16 && !ON_CPU(x));
    if (x->ndim != 2 || !dtype_ok)
        return false;
    if (w->dtype != x->dtype || w->device != x->device || !tensor_is_contiguous(x) || !tensor_is_contiguous(w))
        return false;
    return !b || (b->dtype == x->dtype && b->device == x->device && tensor_is_contiguous(b));
}

/* The direct path's node: its input 0 is x as given (2-D or more), its
 * saved[0] the rows x was computed from, and g comes in x's leading dims:
 * its rows go to the GEMMs and dx is made in input 0's shape. */
static dp_status bw_linear_direct(ag_node *n, dp_tensor *g, dp_tensor **gi)
{
    dp_tensor *x = n->saved[0], *w = n->saved[1], *gc = NULL, *g2 = NULL;
    bool has_b = n->ninputs > 2;
    dp_status st = g->dtype == x->dtype ? dp_contiguous(&gc, g) : dp_to(&gc, g, x->dtype, x->device);
    if (!st && gc != g && !tensor_is_contiguous(gc)) {
        dp_tensor *c;
        st = dp_contiguous(&c, gc);
        dp_tensor_release(gc);
        gc = c;
    }
    if (!st)
        st = rows_of(&g2, gc);
    if (!st && n->in[0].needs_grad)
        st = tensor_new(&gi[0], n->in[0].ndim, n->in[0].shape, x->dtype, x->device);
    if (!st && n->in[1].needs_grad)
        st = ag_grad_output(n, 1, &gi[1]);
    if (!st && has_b && n->in[2].needs_grad)
        st = ag_grad_output(n, 2, &gi[2]);
    /* the kernels take dx and the fold's mask as rows too (a GPU's chain
     * of layers matches one layer's dx with the next one's g) */
    int op = 0;
    dp_tensor *mask = gi[0] ? ag_offered_mask(n, 0, &op) : NULL, *dx2 = NULL, *mask2 = NULL;
    if (!st && gi[0])
        st = rows_of(&dx2, gi[0]);
    if (!st && mask)
        st = rows_of(&mask2, mask);
    if (!st && !(st = k_linear_backward(dx2, gi[1], has_b ? gi[2] : NULL, g2, x, w, mask2, op)) && mask)
        ag_took_mask(n);
    drop3(gc, g2, dx2);
    dp_tensor_release(mask2);
    return st;
}

static dp_status bw_linear(ag_node *n, dp_tensor *g, dp_tensor **gi)
{
    dp_tensor *x = n->saved[0], *w = n->saved[1];
    if (n->iarg[0])
        return bw_linear_direct(n, g, gi);
    dp_tensor *g2 = NULL, *x2 = NULL, *gt = NULL, *dx = NULL;
    dp_status st;
    if ((st = as_matrix(&g2, g)))
        return st;
    if (n->in[0].needs_grad && !(st = dp_mm(&dx, g2, w)))
        st = dp_reshape(&gi[0], dx, n->in[0].ndim, n->in[0].shape);
    if (!st && n->in[1].needs_grad && !(st = as_matrix(&x2, x)) && !(st = dp_transpose(&gt, g2, 0, 1)))
        st = dp_mm(&gi[1], gt, x2);
    if (!st && n->ninputs > 2 && n->in[2].needs_grad)
        st = dp_reduce(&gi[2], DP_SUM, g2, 0, 0, 0);
    drop3(g2, x2, gt);
    dp_tensor_release(dx);
    return st;
}

static dp_status linear_check(dp_tensor *x, dp_tensor *w, dp_tensor *b)
{
    char s1[160], s2[160];
    if (w->ndim != 2)
        return dp_fail(DP_ERR_SHAPE, "linear: weight must be 2-D (out_features, in_features), got %dD", w->ndim);
    if (x->ndim == 0 || x->shape[x->ndim - 1] != w->shape[1])
        return dp_fail(DP_ERR_SHAPE, "linear: input of shape %s does not match weight %s "
                       "(expected the last input dim to be in_features = %lld)",
                       dp_shape_str(s1, sizeof s1, x->ndim, x->shape), dp_shape_str(s2, sizeof s2, 2, w->shape),
                       (long long)w->shape[1]);
    if (b && (b->ndim != 1 || b->shape[0] != w->shape[0]))
        return dp_fail(DP_ERR_SHAPE, "linear: bias of shape %s does not match out_features = %lld",
                       dp_shape_str(s1, sizeof s1, b->ndim, b->shape), (long long)w->shape[0]);
    return DP_OK;
}

/* The direct path's output, a new (M, N) tensor: the product, with the
 * activation act (DP_RELU, DP_GELU, DP_GELU_TANH; 0 for none) applied too,
 * and in a new *pre, when pre is given, the product before it. */
static dp_status linear_direct_out(dp_tensor **out, dp_tensor **pre, dp_tensor *x, dp_tensor *w, dp_tensor *b,
                                   int act)
{
    int64_t shape[2] = { x->shape[0], w->shape[0] };
    dp_status st = tensor_new(out, 2, shape, x->dtype, x->device);
    if (!st && pre && (st = tensor_new(pre, 2, shape, x->dtype, x->device)))
        dp_tensor_release(*out);
    if (!st && (st = act ? k_linear_act(*out, pre ? *pre : NULL, x, w, b, act) : k_linear(*out, x, w, b))) {
        dp_tensor_release(*out);
        *out = NULL;
        if (pre) {
            dp_tensor_release(*pre);
            *pre = NULL;
        }
    }
    return st;
}

/* The node of a linear op on out, whose input 0 is x as given and whose
 * saved[0] is rows (x's (M, in) rows, or x itself), saved[1] w; none
 * without grad. */
static dp_status linear_record(dp_tensor **out, dp_tensor *x, dp_tensor *rows, dp_tensor *w, dp_tensor *b,
                               const char *name, ag_backward_fn fn, ag_node **n)
{
    dp_tensor *ins[3] = { x, w, b };
    dp_status st = ag_record_or_drop(out, name, fn, b ? 3 : 2, ins, n);
    if (!st && *n) {
        ag_save(*n, rows);
        ag_save(*n, w);
    }
    return st;
}

/* The direct path over x's rows when it takes x (2-D or more, contiguous,
 * not empty): *rows is then set (retained), else NULL and nothing is done.
 * An N-D x is one node on the tape, its product one GEMM with the bias (and
 * activation) in its epilogue, and its backward takes the bias gradient in
 * the GEMM's pass (a GPU's BGRAD epilogue): no view nodes around it, so
 * that an activation before it may fold into its backward. */
static dp_status direct_rows(dp_tensor **rows, dp_tensor *x, dp_tensor *w, dp_tensor *b)
{
    *rows = NULL;
    if (x->ndim < 2 || !tensor_is_contiguous(x) || dp_tensor_numel(x) == 0)
        return DP_OK;
    dp_tensor *r = NULL;
    dp_status st = rows_of(&r, x);
    if (!st && linear_direct(r, w, b))
        *rows = r;
    else
        dp_tensor_release(r);
    return st;
}

dp_status dp_linear(dp_tensor **out, dp_tensor *x, dp_tensor *w, dp_tensor *b)
{
    dp_tensor *rows = NULL, *y = NULL;
    dp_status st = linear_check(x, w, b);
    if (!st)
        st = direct_rows(&rows, x, w, b);
    if (st)
        return st;
    if (rows) {
        if (!(st = linear_direct_out(&y, NULL, rows, w, b, 0)))
            st = shaped_as_rows_of(out, y, x);
    } else {
        dp_tensor *wt = NULL;
        int was = dp_set_grad_enabled(0);
        st = dp_transpose(&wt, w, 0, 1);
        if (!st)
            st = b ? dp_matmul(&y, x, wt) : dp_matmul(out, x, wt);
        if (!st && b)
            st = dp_binary(out, DP_ADD, y, b);
        dp_set_grad_enabled(was);
        dp_tensor_release(wt);
    }
    dp_tensor_release(y);
    ag_node *n = NULL;
    if (!st && !(st = linear_record(out, x, rows ? rows : x, w, b, b ? "AddmmBackward0" : "MmBackward0", bw_linear,
                                    &n)) && n)
        n->iarg[0] = rows != NULL;
    dp_tensor_release(rows);
    return st;
}

/* act(linear(x, w, b)) as one node (nn.Sequential's Linear then ReLU or
 * GELU): on the direct path the activation runs in the product's epilogue
 * (cuBLASLt's, or our kernel's). A ReLU's backward takes its mask from the
 * output's sign; a GELU's needs the product before it, which the epilogue
 * writes beside the output when there will be a backward. Either may be
 * folded into the backward of a Linear that reads the output
 * (ag_offered_mask): the GELU's tanh form, whose derivative cuBLASLt's
 * DGELU epilogue applies, like the ReLU. Elsewhere it is the two ops. The
 * node is named as PyTorch names the activation's.
 * saved: x's rows, w, then the output (ReLU) or the product (GELU), each
 * in the output's shape; iarg[1] act. */
static dp_status bw_linear_act(ag_node *n, dp_tensor *g, dp_tensor **gi)
{
    if (n->grad_masked)   /* the activation's part was done where g was made */
        return bw_linear_direct(n, g, gi);
    dp_tensor *s = n->saved[2], *gc = NULL, *dz = NULL;
    dp_status st = g->dtype == s->dtype ? dp_contiguous(&gc, g) : dp_to(&gc, g, s->dtype, s->device);
    if (!st && !(st = tensor_new(&dz, s->ndim, s->shape, s->dtype, s->device)) &&
        !(st = k_unary_backward((int)n->iarg[1], dz, gc, s, s)))
        st = bw_linear_direct(n, dz, gi);
    drop3(gc, dz, NULL);
    return st;
}

dp_status dp_linear_act(dp_tensor **out, dp_tensor *x, dp_tensor *w, dp_tensor *b, dp_unop act)
{
    if (act != DP_RELU && act != DP_GELU && act != DP_GELU_TANH)
        return dp_fail(DP_ERR_ARG, "linear with an activation: the activation must be relu, gelu or gelu with "
                       "approximate='tanh' (got unary op %d)", act);
    dp_tensor *rows = NULL;
    dp_status st = linear_check(x, w, b);
    if (!st)
        st = direct_rows(&rows, x, w, b);
    if (st)
        return st;
    if (!rows) {
        dp_tensor *y = NULL;
        if (!(st = dp_linear(&y, x, w, b)))
            st = dp_unary(out, act, y);
        dp_tensor_release(y);
        return st;
    }
    dp_tensor *ins[3] = { x, w, b }, *y = NULL, *pre = NULL, *pre_shaped = NULL;
    bool relu = act == DP_RELU, keep_pre = !relu && ag_needs_record(b ? 3 : 2, ins);
    ag_node *n = NULL;
    if (!(st = linear_direct_out(&y, keep_pre ? &pre : NULL, rows, w, b, act)) &&
        !(st = pre ? shaped_as_rows_of(&pre_shaped, pre, x) : DP_OK) && !(st = shaped_as_rows_of(out, y, x)) &&
        !(st = linear_record(out, x, rows, w, b, relu ? "ReluBackward0" : "GeluBackward0", bw_linear_act, &n)) &&
        n) {
        n->iarg[1] = act;
        if (relu) {
            ag_save_output(n, *out);
            ag_set_relu_mask(n, 2);
        } else {
            ag_save(n, pre_shaped);
            if (act == DP_GELU_TANH)
                ag_set_gelu_fold(n, 2);
        }
    }
    drop3(rows, y, pre);
    dp_tensor_release(pre_shaped);
    return st;
}

/* ---------------------------------------------------------------- cross-entropy */

/* saved: probs (or NULL for nll), target, weight (or NULL), denom, the
 * gradient for a loss gradient of 1 when the forward made it (or NULL) */
static dp_status bw_cross_entropy(ag_node *n, dp_tensor *g, dp_tensor **gi)
{
    if (n->saved[4] && ag_is_implicit_one(g)) {
        gi[0] = n->saved[4];   /* handed over: a second backward (retain_graph) computes its own */
        n->saved[4] = NULL;
        return DP_OK;
    }
    cpu_ce_args a = { NULL, n->saved[1], n->saved[2], n->iarg[0], n->darg[0], (int)n->iarg[2], n->saved[0],
                      (int)n->iarg[1], n->saved[3], NULL, false };
    /* nll_loss of a CPU log_softmax over the classes: the logits' gradient at once */
    dp_tensor *y = a.log_probs && a.label_smoothing == 0 && ON_CPU(g) ? ag_offered_log_softmax(n, 0, 1) : NULL;
    dp_tensor *gc = NULL, *dx = NULL;
    dp_status st;
    if (!(st = dp_to(&gc, g, n->in[0].dtype, n->in[0].device)) && !(st = dp_contiguous(&dx, gc))) {
        dp_tensor_release(gc);
        gc = dx;
        dx = NULL;
        if (!(st = tensor_new(&dx, 2, n->in[0].shape, n->in[0].dtype, n->in[0].device)) &&
            !(st = y ? cpu_nll_log_softmax_backward(dx, gc, y, &a) : k_cross_entropy_backward(dx, gc, &a)) &&
            !(st = ag_sum_to(&gi[0], dx, &n->in[0])) && y)
            ag_took_mask(n);
    }
    drop3(gc, dx, NULL);
    return st;
}

static dp_status ce_check(dp_tensor *input, dp_tensor *target, dp_tensor *weight, int reduction, double smoothing)
{
    char s1[160], s2[160];
    if (input->ndim != 2)
        return dp_fail(DP_ERR_SHAPE, "cross_entropy: expected input of shape (N, C), got %s",
                       dp_shape_str(s1, sizeof s1, input->ndim, input->shape));
    if (!dp_dtype_is_floating(input->dtype))
        return dp_fail(DP_ERR_DTYPE, "cross_entropy: expected a floating point input, got %s", dp_dtype_name(input->dtype));
    if (target->dtype != DP_INT64)
        return dp_fail(DP_ERR_DTYPE, "cross_entropy: expected target to hold int64 class indices, got %s "
                       "(use target:long())", dp_dtype_name(target->dtype));
    if (target->ndim != 1 || target->shape[0] != input->shape[0])
        return dp_fail(DP_ERR_SHAPE, "cross_entropy: expected target of shape [%lld] for input of shape %s "
                       "(class indices, one per sample), got %s",
                       (long long)input->shape[0], dp_shape_str(s1, sizeof s1, input->ndim, input->shape),
                       dp_shape_str(s2, sizeof s2, target->ndim, target->shape));
    if (weight && (weight->ndim != 1 || weight->shape[0] != input->shape[1]))
        return dp_fail(DP_ERR_SHAPE, "cross_entropy: weight must have shape (%lld), got %s",
                       (long long)input->shape[1], dp_shape_str(s1, sizeof s1, weight->ndim, weight->shape));
    if (reduction < CE_REDUCE_NONE || reduction > CE_REDUCE_SUM)
        return dp_fail(DP_ERR_ARG, "cross_entropy: invalid reduction %d", reduction);
    if (!(smoothing >= 0 && smoothing <= 1))
        return dp_fail(DP_ERR_ARG, "cross_entropy: label_smoothing must be in [0, 1], got %g", smoothing);
    if (target->device != input->device || (weight && weight->device != input->device))
        return dp_fail(DP_ERR_DEVICE, "cross_entropy: input, target and weight must be on the same device");
    return DP_OK;
}

/* The classifier's path (cuda/classifier.cu): bfloat16 logits on a GPU,
 * too many rows for the one-launch loss, without class weights or
 * log-probabilities (a language model's head). The logits are read as
 * they are in float32 math and only the rows' log-sum-exp is kept, where
 * the other path keeps N x C float64 probabilities. */
static bool ce_by_lse(const dp_tensor *input, const dp_tensor *weight, int log_probs)
{
    return !ON_CPU(input) && input->dtype == DP_BFLOAT16 && input->shape[1] > 0 && !weight && !log_probs &&
           !k_cross_entropy_fuses(input);
}

/* saved: the logits, target, lse (N float32), denom; the gradient is
 * written in a new tensor: the logits' storage may be Lua's too, and the
 * tape cannot tell whether anything will read it again. */
static dp_status bw_cross_entropy_lse(ag_node *n, dp_tensor *g, dp_tensor **gi)
{
    cpu_ce_args a = { n->saved[0], n->saved[1], NULL, n->iarg[0], n->darg[0], 0, NULL, (int)n->iarg[1], n->saved[3],
                      NULL, false };
    dp_tensor *gc = NULL, *dx = NULL;
    dp_status st = dp_contiguous(&gc, g);
    if (!st && !(st = tensor_new(&dx, 2, n->in[0].shape, DP_BFLOAT16, n->in[0].device)) &&
        !(st = gpu_classifier_backward(dx, gc, n->saved[2], &a)))
        st = ag_sum_to(&gi[0], dx, &n->in[0]);
    drop3(gc, dx, NULL);
    return st;
}

/* The loss of out_dtype on the classifier's path; x and t contiguous. */
static dp_status cross_entropy_lse(dp_tensor **out, dp_tensor *input, dp_tensor *x, dp_tensor *t, int64_t ignore_index,
                                   double label_smoothing, int reduction, dp_dtype out_dtype)
{
    int64_t N = x->shape[0];
    dp_tensor *lse = NULL, *denom = NULL;
    cpu_ce_args a = { x, t, NULL, ignore_index, label_smoothing, 0, NULL, reduction, NULL, NULL, false };
    dp_status st = tensor_new(&lse, 1, &N, DP_FLOAT32, x->device);
    if (!st && !(st = tensor_new(&denom, 0, NULL, DP_FLOAT64, x->device)) &&
        !(st = tensor_new(out, reduction == CE_REDUCE_NONE ? 1 : 0, &N, out_dtype, x->device))) {
        a.denom = denom;
        if ((st = gpu_classifier_loss(*out, lse, denom, &a)))
            dp_tensor_release(*out);
    }
    ag_node *n = NULL;
    if (!st && !(st = ag_record_or_drop(out, "NllLossBackward0", bw_cross_entropy_lse, 1, &input, &n)) && n) {
        ag_save(n, x);
        ag_save(n, t);
        ag_save(n, lse);
        ag_save(n, denom);
        n->iarg[0] = ignore_index;
        n->iarg[1] = reduction;
        n->darg[0] = label_smoothing;
    }
    drop3(lse, denom, NULL);
    return st;
}

/* out_dtype: the loss's dtype on the classifier's path (elsewhere it is
 * the input's: callers ask for another only where that path takes it). */
static dp_status cross_entropy(dp_tensor **out, dp_tensor *input, dp_tensor *target, dp_tensor *weight,
                               int64_t ignore_index, double label_smoothing, int reduction, int log_probs,
                               dp_dtype out_dtype)
{
    dp_status st = ce_check(input, target, weight, reduction, label_smoothing);
    if (st)
        return st;
    dp_tensor *x = NULL, *t = NULL, *w = NULL;
    if (ce_by_lse(input, weight, log_probs)) {
        if (!(st = dp_contiguous(&x, input)) && !(st = dp_contiguous(&t, target)))
            st = cross_entropy_lse(out, input, x, t, ignore_index, label_smoothing, reduction, out_dtype);
        drop3(x, t, NULL);
        return st;
    }
    if ((st = dp_contiguous(&x, input)) || (st = dp_contiguous(&t, target)) ||
        (weight && (st = dp_to(&w, weight, DP_FLOAT64, input->device)))) {
        drop3(x, t, w);
        return st;
    }
    int64_t N = input->shape[0];
    dp_tensor *probs = NULL, *denom = NULL, *grad_one = NULL;
    bool grad = ag_needs_record(1, &input);
    /* float32 probabilities for float32 logits on the CPU without label
     * smoothing (half the bytes to write and read again), else float64 */
    bool probs32 = ON_CPU(input) && input->dtype == DP_FLOAT32 && label_smoothing == 0;
    if (!log_probs && grad)
        st = tensor_new(&probs, 2, input->shape, probs32 ? DP_FLOAT32 : DP_FLOAT64, input->device);
    /* on a GPU, a loss that fits one launch also writes the gradient the
     * usual backward() will ask for, which saves the backward's launch */
    if (!st && grad && reduction != CE_REDUCE_NONE && k_cross_entropy_fuses(input))
        st = tensor_new(&grad_one, 2, input->shape, input->dtype, input->device);
    cpu_ce_args a = { x, t, w, ignore_index, label_smoothing, log_probs, probs, reduction, NULL, grad_one, false };
    if (!st && !(st = tensor_new(&denom, 0, NULL, DP_FLOAT64, input->device)) &&
        !(st = tensor_new(out, reduction == CE_REDUCE_NONE ? 1 : 0, &N, input->dtype, input->device))) {
        a.denom = denom;
        if ((st = k_cross_entropy(*out, &a)))
            dp_tensor_release(*out);
    }
    ag_node *n = NULL;
    if (!st && !(st = ag_record_or_drop(out, "NllLossBackward0", bw_cross_entropy, 1, &input, &n)) && n) {
        if (probs)
            ag_save(n, probs);
        else
            n->saved[n->nsaved++] = NULL;
        ag_save(n, t);
        if (w)
            ag_save(n, w);
        else
            n->saved[n->nsaved++] = NULL;
        ag_save(n, denom);
        if (a.grad_one_done)
            ag_save(n, grad_one);
        else
            n->saved[n->nsaved++] = NULL;
        n->iarg[0] = ignore_index;
        n->iarg[1] = reduction;
        n->iarg[2] = log_probs;
        n->darg[0] = label_smoothing;
    }
    drop3(x, t, w);
    drop3(probs, denom, grad_one);
    return st;
}

dp_status dp_cross_entropy(dp_tensor **out, dp_tensor *input, dp_tensor *target, dp_tensor *weight,
                           int64_t ignore_index, double label_smoothing, int reduction, int log_probs)
{
    return cross_entropy(out, input, target, weight, ignore_index, label_smoothing, reduction, log_probs,
                         input->dtype);
}

/* Autocast's cross-entropy (a float32 op): a bfloat16 input is the loss
 * of it cast to float32, which the classifier's path computes without the
 * copy (a 16 x 1024 x 50,304 float32 copy is 3.3 GB); elsewhere the cast
 * is made here, recorded like any other. */
dp_status dp_cross_entropy_fp32(dp_tensor **out, dp_tensor *input, dp_tensor *target, dp_tensor *weight,
                                int64_t ignore_index, double label_smoothing, int reduction, int log_probs)
{
    if (input->dtype != DP_BFLOAT16)
        return dp_cross_entropy(out, input, target, weight, ignore_index, label_smoothing, reduction, log_probs);
    dp_status st = ce_check(input, target, weight, reduction, label_smoothing);
    if (st)
        return st;
    if (ce_by_lse(input, weight, log_probs))
        return cross_entropy(out, input, target, weight, ignore_index, label_smoothing, reduction, log_probs,
                             DP_FLOAT32);
    dp_tensor *x = NULL;
    if (!(st = dp_to(&x, input, DP_FLOAT32, input->device)))
        st = dp_cross_entropy(out, x, target, weight, ignore_index, label_smoothing, reduction, log_probs);
    dp_tensor_release(x);
    return st;
}

/* ---------------------------------------------------------------- unfold */

static void unfold_args_of(const ag_node *n, cpu_unfold_args *u)
{
    for (int i = 0; i < 2; i++) {
        u->kernel[i] = n->iarg[i];
        u->stride[i] = n->iarg[2 + i];
        u->padding[i] = n->iarg[4 + i];
        u->dilation[i] = n->iarg[6 + i];
    }
    u->out_h = (int64_t)n->darg[0];
    u->out_w = (int64_t)n->darg[1];
}

static dp_status bw_unfold(ag_node *n, dp_tensor *g, dp_tensor **gi)
{
    cpu_unfold_args u;
    unfold_args_of(n, &u);
    dp_tensor *z = NULL, *gc = NULL;
    dp_status st = dp_full(&z, 4, n->in[0].shape, 0, g->dtype, g->device);
    if (!st && !(st = dp_contiguous(&gc, g)) && !(st = k_fold_add(z, gc, &u)))
        st = ag_sum_to(&gi[0], z, &n->in[0]);
    drop3(z, gc, NULL);
    return st;
}

dp_status dp_unfold(dp_tensor **out, dp_tensor *x, const int64_t *kernel, const int64_t *stride,
                    const int64_t *padding, const int64_t *dilation, double pad_value)
{
    char s1[160];
    if (x->ndim != 4)
        return dp_fail(DP_ERR_SHAPE, "unfold: expected a 4-D input (N, C, H, W), got %s",
                       dp_shape_str(s1, sizeof s1, x->ndim, x->shape));
    if (!dp_dtype_is_floating(x->dtype))
        return dp_fail(DP_ERR_DTYPE, "unfold: expected a floating point tensor, got %s", dp_dtype_name(x->dtype));
    cpu_unfold_args u = { .pad_value = pad_value };
    int64_t out_hw[2];
    for (int i = 0; i < 2; i++) {
        if (kernel[i] <= 0 || stride[i] <= 0 || dilation[i] <= 0 || padding[i] < 0)
            return dp_fail(DP_ERR_ARG, "unfold: kernel, stride and dilation must be positive and padding "
                           "non-negative (got kernel %lld, stride %lld, padding %lld, dilation %lld)",
                           (long long)kernel[i], (long long)stride[i], (long long)padding[i], (long long)dilation[i]);
        int64_t span, size;   /* dilation (kernel - 1) + 1, the input's size + 2 padding: checked */
        if (__builtin_mul_overflow(dilation[i], kernel[i] - 1, &span) || __builtin_add_overflow(span, 1, &span) ||
            __builtin_mul_overflow(padding[i], 2, &size) || __builtin_add_overflow(size, x->shape[2 + i], &size))
            return dp_fail(DP_ERR_ARG, "unfold: kernel %lld with dilation %lld, or padding %lld, is too large",
                           (long long)kernel[i], (long long)dilation[i], (long long)padding[i]);
        if (size < span)
            return dp_fail(DP_ERR_SHAPE, "unfold: input %s (padded %lld) is smaller than the kernel span %lld",
                           dp_shape_str(s1, sizeof s1, x->ndim, x->shape), (long long)size, (long long)span);
        out_hw[i] = (size - span) / stride[i] + 1;
        u.kernel[i] = kernel[i];
        u.stride[i] = stride[i];
        u.padding[i] = padding[i];
        u.dilation[i] = dilation[i];
    }
    u.out_h = out_hw[0];
    u.out_w = out_hw[1];
    int64_t shape[3] = { x->shape[0] };
    if (__builtin_mul_overflow(x->shape[1], kernel[0], &shape[1]) || __builtin_mul_overflow(shape[1], kernel[1], &shape[1]) ||
        __builtin_mul_overflow(out_hw[0], out_hw[1], &shape[2]))
        return dp_fail(DP_ERR_SHAPE, "unfold: %lld channels of a %lld x %lld kernel at %lld x %lld positions are too many",
                       (long long)x->shape[1], (long long)kernel[0], (long long)kernel[1], (long long)out_hw[0],
                       (long long)out_hw[1]);
    dp_tensor *xc;
    dp_status st = dp_contiguous(&xc, x);
    if (st)
        return st;
    if (!(st = tensor_new(out, 3, shape, x->dtype, x->device)) && (st = k_unfold(*out, xc, &u)))
        dp_tensor_release(*out);
    dp_tensor_release(xc);
    ag_node *n = NULL;
    if (!st && !(st = ag_record_or_drop(out, "Im2ColBackward0", bw_unfold, 1, &x, &n)) && n) {
        for (int i = 0; i < 2; i++) {
            n->iarg[i] = kernel[i];
            n->iarg[2 + i] = stride[i];
            n->iarg[4 + i] = padding[i];
            n->iarg[6 + i] = dilation[i];
        }
        n->darg[0] = (double)out_hw[0];
        n->darg[1] = (double)out_hw[1];
    }
    return st;
}

/* ---------------------------------------------------------------- conv2d */

/* saved: x, w (contiguous); iarg: stride, padding, dilation (pairs), groups */
static void conv_args_of(const ag_node *n, const dp_tensor *w, cpu_conv_args *a)
{
    for (int i = 0; i < 2; i++) {
        a->u.kernel[i] = w->shape[2 + i];
        a->u.stride[i] = n->iarg[i];
        a->u.padding[i] = n->iarg[2 + i];
        a->u.dilation[i] = n->iarg[4 + i];
    }
    a->groups = n->iarg[6];
    a->u.out_h = (int64_t)n->darg[0];
    a->u.out_w = (int64_t)n->darg[1];
}

static dp_status bw_conv2d(ag_node *n, dp_tensor *g, dp_tensor **gi)
{
    dp_tensor *x = n->saved[0], *w = n->saved[1], *g2 = NULL, *gc = NULL;
    cpu_conv_args a;
    conv_args_of(n, w, &a);
    dp_status st = dp_to(&g2, g, x->dtype, x->device);
    if (!st)
        st = dp_contiguous(&gc, g2);
    if (!st && n->in[0].needs_grad)
        st = tensor_new(&gi[0], 4, x->shape, x->dtype, x->device);
    if (!st && n->in[1].needs_grad)
        st = ag_grad_output(n, 1, &gi[1]);
    if (!st && n->ninputs > 2 && n->in[2].needs_grad)
        st = ag_grad_output(n, 2, &gi[2]);
    if (!st)
        st = cpu_conv2d_backward(gi[0], gi[1], n->ninputs > 2 ? gi[2] : NULL, gc, x, w, &a);
    drop3(g2, gc, NULL);
    return st;
}

static dp_status conv2d_check(dp_tensor *x, dp_tensor *w, dp_tensor *b, int64_t groups)
{
    char s1[160], s2[160];
    if (x->ndim != 4 || w->ndim != 4)
        return dp_fail(DP_ERR_SHAPE, "conv2d: expected a 4-D input (N, C, H, W) and a 4-D weight (O, C/groups, kh, "
                       "kw), got %s and %s", dp_shape_str(s1, sizeof s1, x->ndim, x->shape),
                       dp_shape_str(s2, sizeof s2, w->ndim, w->shape));
    if (!ON_CPU(x) || !ON_CPU(w) || (b && !ON_CPU(b)))
        return dp_fail(DP_ERR_DEVICE, "conv2d: the fused convolution takes CPU tensors only");
    if ((x->dtype != DP_FLOAT32 && x->dtype != DP_FLOAT64) || w->dtype != x->dtype || (b && b->dtype != x->dtype))
        return dp_fail(DP_ERR_DTYPE, "conv2d: expected input, weight and bias of one dtype, float32 or float64, "
                       "got %s and %s", dp_dtype_name(x->dtype), dp_dtype_name(w->dtype));
    if (groups < 1 || x->shape[1] != w->shape[1] * groups || w->shape[0] % groups != 0)
        return dp_fail(DP_ERR_SHAPE, "conv2d: weight %s with groups=%lld does not match input %s (expected "
                       "C = weight.shape[1] * groups, and out_channels divisible by groups)",
                       dp_shape_str(s2, sizeof s2, w->ndim, w->shape), (long long)groups,
                       dp_shape_str(s1, sizeof s1, x->ndim, x->shape));
    if (b && (b->ndim != 1 || b->shape[0] != w->shape[0]))
        return dp_fail(DP_ERR_SHAPE, "conv2d: expected a bias of shape [%lld], got %s", (long long)w->shape[0],
                       dp_shape_str(s1, sizeof s1, b->ndim, b->shape));
    return DP_OK;
}

/* The output's size along a dim of n elements into *size, or a failure. */
static dp_status window_out_size(int64_t *size_out, const char *fn, int64_t n, int64_t k, int64_t s, int64_t p,
                                 int64_t d)
{
    int64_t span, size;   /* d (k - 1) + 1, n + 2 p */
    if (k <= 0 || s <= 0 || d <= 0 || p < 0)
        return dp_fail(DP_ERR_ARG, "%s: kernel, stride and dilation must be positive and padding non-negative "
                       "(got kernel %lld, stride %lld, padding %lld, dilation %lld)", fn, (long long)k,
                       (long long)s, (long long)p, (long long)d);
    if (__builtin_mul_overflow(d, k - 1, &span) || __builtin_add_overflow(span, 1, &span) ||
        __builtin_mul_overflow(p, 2, &size) || __builtin_add_overflow(size, n, &size))
        return dp_fail(DP_ERR_ARG, "%s: kernel %lld with dilation %lld, or padding %lld, is too large", fn,
                       (long long)k, (long long)d, (long long)p);
    if (size < span)
        return dp_fail(DP_ERR_SHAPE, "%s: input size %lld (padded %lld) is smaller than the kernel span %lld", fn,
                       (long long)n, (long long)size, (long long)span);
    *size_out = (size - span) / s + 1;
    return DP_OK;
}

dp_status dp_conv2d(dp_tensor **out, dp_tensor *x, dp_tensor *w, dp_tensor *b, const int64_t *stride,
                    const int64_t *padding, const int64_t *dilation, int64_t groups)
{
    dp_status st = conv2d_check(x, w, b, groups);
    if (st)
        return st;
    cpu_conv_args a = { .groups = groups };
    int64_t shape[4] = { x->shape[0], w->shape[0] }, positions;
    for (int i = 0; i < 2; i++) {
        if ((st = window_out_size(&shape[2 + i], "conv2d", x->shape[2 + i], w->shape[2 + i], stride[i], padding[i],
                                  dilation[i])))
            return st;
        a.u.kernel[i] = w->shape[2 + i];
        a.u.stride[i] = stride[i];
        a.u.padding[i] = padding[i];
        a.u.dilation[i] = dilation[i];
    }
    if (__builtin_mul_overflow(shape[2], shape[3], &positions) ||
        __builtin_mul_overflow(positions, w->shape[1] * w->shape[2] * w->shape[3], &positions))
        return dp_fail(DP_ERR_SHAPE, "conv2d: a %lld x %lld kernel at %lld x %lld positions are too many",
                       (long long)w->shape[2], (long long)w->shape[3], (long long)shape[2], (long long)shape[3]);
    a.u.out_h = shape[2];
    a.u.out_w = shape[3];
    dp_tensor *xc = NULL, *wc = NULL, *bc = NULL;
    if (!(st = dp_contiguous(&xc, x)) && !(st = dp_contiguous(&wc, w)) && !(st = b ? dp_contiguous(&bc, b) : DP_OK) &&
        !(st = tensor_new(out, 4, shape, x->dtype, x->device)) && (st = cpu_conv2d(*out, xc, wc, bc, &a))) {
        dp_tensor_release(*out);
        *out = NULL;
    }
    dp_tensor *ins[3] = { x, w, b };
    ag_node *n = NULL;
    if (!st && !(st = ag_record_or_drop(out, "ConvolutionBackward0", bw_conv2d, b ? 3 : 2, ins, &n)) && n) {
        ag_save(n, xc);
        ag_save(n, wc);
        for (int i = 0; i < 2; i++) {
            n->iarg[i] = stride[i];
            n->iarg[2 + i] = padding[i];
            n->iarg[4 + i] = dilation[i];
        }
        n->iarg[6] = groups;
        n->darg[0] = (double)shape[2];
        n->darg[1] = (double)shape[3];
    }
    drop3(xc, wc, bc);
    return st;
}

/* ---------------------------------------------------------------- max_pool2d */

/* saved: the argmaxes (N, C, Ho, Wo) int64 */
static dp_status bw_max_pool2d(ag_node *n, dp_tensor *g, dp_tensor **gi)
{
    dp_tensor *g2 = NULL, *gc = NULL;
    dp_status st = dp_to(&g2, g, n->in[0].dtype, n->in[0].device);
    if (!st && !(st = dp_contiguous(&gc, g2)) && !(st = tensor_new(&gi[0], 4, n->in[0].shape, n->in[0].dtype,
                                                                    n->in[0].device)))
        st = cpu_max_pool2d_backward(gi[0], gc, n->saved[0]);
    drop3(g2, gc, NULL);
    return st;
}

dp_status dp_max_pool2d(dp_tensor **out, dp_tensor *x, const int64_t *kernel, const int64_t *stride,
                        const int64_t *padding, const int64_t *dilation)
{
    char s1[160];
    if (x->ndim != 4)
        return dp_fail(DP_ERR_SHAPE, "max_pool2d: expected a 4-D input (N, C, H, W), got %s",
                       dp_shape_str(s1, sizeof s1, x->ndim, x->shape));
    if (!ON_CPU(x) || (x->dtype != DP_FLOAT32 && x->dtype != DP_FLOAT64))
        return dp_fail(DP_ERR_DTYPE, "max_pool2d: the fused pooling takes CPU float32 or float64 tensors, got %s",
                       dp_dtype_name(x->dtype));
    cpu_unfold_args u = { .pad_value = 0 };
    int64_t shape[4] = { x->shape[0], x->shape[1] };
    dp_status st;
    for (int i = 0; i < 2; i++) {
        if ((st = window_out_size(&shape[2 + i], "max_pool2d", x->shape[2 + i], kernel[i], stride[i], padding[i],
                                  dilation[i])))
            return st;
        if (2 * padding[i] > kernel[i])
            return dp_fail(DP_ERR_ARG, "max_pool2d: padding %lld is more than half the kernel %lld",
                           (long long)padding[i], (long long)kernel[i]);
        u.kernel[i] = kernel[i];
        u.stride[i] = stride[i];
        u.padding[i] = padding[i];
        u.dilation[i] = dilation[i];
    }
    u.out_h = shape[2];
    u.out_w = shape[3];
    bool grad = ag_needs_record(1, &x);
    dp_tensor *xc = NULL, *arg = NULL;
    if (!(st = dp_contiguous(&xc, x)) && !(st = grad ? tensor_new(&arg, 4, shape, DP_INT64, x->device) : DP_OK) &&
        !(st = tensor_new(out, 4, shape, x->dtype, x->device)) && (st = cpu_max_pool2d(*out, arg, xc, &u))) {
        dp_tensor_release(*out);
        *out = NULL;
    }
    ag_node *n = NULL;
    if (!st && !(st = ag_record_or_drop(out, "MaxPool2DWithIndicesBackward0", bw_max_pool2d, 1, &x, &n)) && n)
        ag_save(n, arg);
    drop3(xc, arg, NULL);
    return st;
}
