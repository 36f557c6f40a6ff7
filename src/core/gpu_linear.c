/*
 * gpu_linear.c — the CUDA side's matrix products: bmm and Linear layers
 * through dpc_gemm, the deferred Linear (small layers waiting to share a
 * launch with what follows them), the cross-entropy that takes the
 * Linears before it into its launch, and the optimizer steps that take a
 * waiting backward or bias gradient into theirs.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#ifdef DP_HAVE_CUDA
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dplua_cuda.h"
#include "dplua_internal.h"
#include "core/gpu.h"

char gpu_deferred_failure[400];   /* a deferred launch's error, for the next op to report */

/* ---------------------------------------------------------------- matrix products */

static int allow_tf32;

void dp_cuda_set_allow_tf32(int allow)
{
    allow_tf32 = allow != 0;
}

/* The transpose flag and leading dimension of a 2-D slice with one unit
 * stride, or 0 when it has none. */
static int64_t gemm_layout(int64_t rows, int64_t cols, int64_t rs, int64_t cs, int *trans)
{
    if (cs == 1 && (rs >= cols || rows == 1)) {
        *trans = 0;
        return rows == 1 ? (cols > 1 ? cols : 1) : rs;
    }
    if (rs == 1 && (cs >= rows || cols == 1)) {
        *trans = 1;
        return cols == 1 ? (rows > 1 ? rows : 1) : cs;
    }
    return 0;
}

/* a copy of t, contiguous, when it has no usable layout */
static dp_status gemm_operand(dp_tensor **res, dp_tensor *t, int *trans, int64_t *ld)
{
    *ld = gemm_layout(t->shape[1], t->shape[2], t->stride[1], t->stride[2], trans);
    if (*ld) {
        dp_tensor_retain(t);
        *res = t;
        return DP_OK;
    }
    dp_status st = tensor_new(res, 3, t->shape, t->dtype, t->device);
    if (!st && (st = gpu_copy(*res, t)))
        dp_tensor_release(*res);
    if (!st)
        *ld = gemm_layout((*res)->shape[1], (*res)->shape[2], (*res)->stride[1], (*res)->stride[2], trans);
    return st;
}

dp_status gpu_bmm(dp_tensor *out, dp_tensor *a, dp_tensor *b)
{
    int64_t batch = out->shape[0], m = out->shape[1], n = out->shape[2], k = a->shape[2];
    if (!dp_dtype_is_floating(out->dtype))
        return dp_fail(DP_ERR_DTYPE, "matmul: integer products are not supported on CUDA (got %s)",
                       dp_dtype_name(out->dtype));
    if (batch == 0 || m == 0 || n == 0)
        return DP_OK;
    if (k == 0)
        return gpu_fill(out, 0);
    dp_tensor *A = NULL, *B = NULL;
    int ta, tb;
    int64_t lda, ldb;
    dp_status st;
    if (!(st = gemm_operand(&A, a, &ta, &lda)) && !(st = gemm_operand(&B, b, &tb, &ldb))) {
        dpc_set_device(out->device);
        st = gpu_status("matmul", dpc_gemm(out->dtype, ta, tb, m, n, k, 1.0, gpu_first(A), lda, A->stride[0], gpu_first(B),
                                           ldb, B->stride[0], 0.0, gpu_first(out), n, m * n, batch, DPC_EPI_BIAS, NULL, NULL, allow_tf32,
                                           gpu_stream_of(out->device)), out->dtype);
    }
    dp_tensor_release(A);
    dp_tensor_release(B);
    return st;
}

/* out (M, N) = act(x (M, K) @ w (N, K)^T + b), all in one GEMM's
 * epilogue, on stream; pre (or NULL) gets the value before act */
static int linear_gemm(dp_tensor *out, dp_tensor *pre, dp_tensor *x, dp_tensor *w, dp_tensor *b, int epilogue,
                       void *stream)
{
    int64_t M = out->shape[0], N = out->shape[1], K = x->shape[1];
    dpc_set_device(out->device);
    return dpc_gemm(out->dtype, 0, 1, M, N, K, 1.0, gpu_first(x), K, 0, gpu_first(w), K, 0, 0.0, gpu_first(out), N, 0, 1,
                    epilogue, b ? gpu_first(b) : NULL, pre ? gpu_first(pre) : NULL, allow_tf32, stream);
}

static int act_epilogue(int act)
{
    return act == DP_RELU ? DPC_EPI_RELU : act == DP_GELU ? DPC_EPI_GELU : DPC_EPI_GELU_TANH;
}

/* ---------------------------------------------------------------- deferred launches */

/* A Linear small enough for our own GEMM kernel is not launched when it is
 * called. If the next op on the GPU is a ReLU or a GELU of its output, one
 * launch does both: the activation in the product's epilogue, the product
 * itself still written to the Linear's output, which Lua may read later.
 * If it is another such Linear of its output, both wait (two at most: a
 * third launches the first). If it is a cross-entropy of the last one's
 * output and they fit one block, the loss's launch computes them first
 * (gpu_cross_entropy). Each saves a launch, 4.3 us of host time on the
 * H200 host: the seed's F.relu(self.fc1(x)), self.fc2(h) and criterion
 * are one launch.
 *
 * The backward of such a Linear waits the same way when it computes dx
 * and is small enough to start a chain: if the next op is the backward of
 * the layer before, whose gradient is that dx, one launch of one block
 * computes both layers' (dpc_linear_backward's chain): the seed's fc2 and
 * fc1 backwards in one launch instead of two. The chain waits in turn,
 * and so does a lone backward: if the next op is a small SGD step on
 * their device and stream (gpu_sgd_step), the same block takes it after
 * the gradients, so that the seed's whole backward and step are one
 * launch.
 *
 * A first layer's backward (no dx) whose weight gradient cuBLASLt
 * computes leaves the bias gradient out of that call, which is then one
 * kernel instead of two, and the bias gradient waits: the next optimizer
 * step's launch makes it first when db lies in the step's flat gradient
 * buffer (gpu_sgd_step, gpu_adam_step; dpc_bias_grad in dpc_ops.h), else
 * it is launched alone, summed the same way.
 *
 * Any other work launches what waits first: every kernel and copy takes
 * its stream from stream_of, and synchronisations, stream and event calls,
 * capture boundaries and process-group submits (on the caller's thread)
 * call deferred_launch. So the device sees the calls in their order, and
 * work waits only while Lua runs between two ops; larger products are
 * launched at once, so that a long one overlaps the host's work.
 *
 * Measured on an H100 against the same build with nothing waiting: the
 * seed step takes 12.5-14.9 us eagerly against 27.1-29.6, and 9.9 against
 * 14.0 replayed from a CUDA graph. Tests turn the waiting off
 * (dp_cuda_set_deferral) to compare the bits with each op's own launch. */
enum { WAITS_NOTHING, WAITS_LINEAR, WAITS_LINEAR_BACKWARD, WAITS_BIAS_GRAD };
/* out = act(x @ w^T + b) as linear_gemm computes it (epilogue DPC_EPI_BIAS:
 * no act; pre, or NULL, gets the value before it) */
typedef struct {
    dp_tensor *x, *w, *b, *out, *pre;
    int epilogue;
} waiting_layer;
/* a Linear's backward, gpu_linear_backward's arguments */
typedef struct {
    dp_tensor *x, *w, *g, *mask, *dx, *dw, *db;
} waiting_backward;
typedef struct {
    int what;                   /* all tensors retained */
    waiting_layer layer[2];     /* WAITS_LINEAR: layer[1] reads layer[0]'s out */
    waiting_backward back[2];   /* WAITS_LINEAR_BACKWARD: back[1] (a chain) the layer before back[0], its g
                                 * back[0]'s dx; WAITS_BIAS_GRAD: back[0]'s db and g only */
    int layers;                 /* of layer or back */
    void *stream;
} waiting_work;

static pthread_mutex_t deferred_mu = PTHREAD_MUTEX_INITIALIZER;
static waiting_work deferred;   /* under deferred_mu */
static int64_t deferred_fusions;

static bool deferral_off;

int64_t dp_cuda_linear_fusions(void)
{
    return deferred_fusions;
}

void dp_cuda_set_deferral(int on)
{
    gpu_deferred_launch();
    deferral_off = !on;
}

#define LAYER_TENSORS 5
#define BACKWARD_TENSORS 7
#define WAITING_TENSORS (2 * BACKWARD_TENSORS)

static void layer_tensors(const waiting_layer *l, dp_tensor *t[LAYER_TENSORS])
{
    dp_tensor *all[LAYER_TENSORS] = { l->x, l->w, l->b, l->out, l->pre };
    memcpy(t, all, sizeof all);
}

static void backward_tensors(const waiting_backward *b, dp_tensor *t[BACKWARD_TENSORS])
{
    dp_tensor *all[BACKWARD_TENSORS] = { b->x, b->w, b->g, b->mask, b->dx, b->dw, b->db };
    memcpy(t, all, sizeof all);
}

/* w's tensors (NULL where it has none): what it retains and releases */
static void waiting_tensors(const waiting_work *w, dp_tensor *t[WAITING_TENSORS])
{
    memset(t, 0, WAITING_TENSORS * sizeof *t);
    for (int i = 0; i < w->layers; i++)
        if (w->what == WAITS_LINEAR)
            layer_tensors(&w->layer[i], t + i * LAYER_TENSORS);
        else
            backward_tensors(&w->back[i], t + i * BACKWARD_TENSORS);
}

/* Takes references to the tensors of w's layers (or backwards) from
 * `first` on: all of them, or the one just added to work that waits. */
static void waiting_retain(const waiting_work *w, int first)
{
    dp_tensor *t[WAITING_TENSORS];
    int per = w->what == WAITS_LINEAR ? LAYER_TENSORS : BACKWARD_TENSORS;
    waiting_tensors(w, t);
    for (int i = first * per; i < WAITING_TENSORS; i++)
        if (t[i])
            dp_tensor_retain(t[i]);
}

static void waiting_release(const waiting_work *w)
{
    dp_tensor *t[WAITING_TENSORS];
    waiting_tensors(w, t);
    for (int i = 0; i < WAITING_TENSORS; i++)
        dp_tensor_release(t[i]);
}

int gpu_deferred_holds(const dp_tensor *t)
{
    dp_tensor *held[WAITING_TENSORS];
    int n = 0;
    pthread_mutex_lock(&deferred_mu);
    if (deferred.what != WAITS_NOTHING) {
        waiting_tensors(&deferred, held);
        for (int i = 0; i < WAITING_TENSORS; i++)
            n += held[i] == t;
    }
    pthread_mutex_unlock(&deferred_mu);
    return n;
}

/* Makes w, whose references are held, the waiting work (nothing waits:
 * the caller asked stream_of, or took what waited). */
static void deferred_store(waiting_work w)
{
    pthread_mutex_lock(&deferred_mu);
    deferred = w;
    pthread_mutex_unlock(&deferred_mu);
}

/* The same, taking references to w's tensors. */
static void deferred_put(waiting_work w)
{
    waiting_retain(&w, 0);
    deferred_store(w);
}

/* The waiting work, taken when there is some and fits (NULL: any) accepts
 * it; then nothing waits, and the caller launches it and releases it. */
static bool deferred_take(bool (*fits)(const waiting_work *w, const void *ctx), const void *ctx, waiting_work *taken)
{
    pthread_mutex_lock(&deferred_mu);
    bool ok = deferred.what != WAITS_NOTHING && (!fits || fits(&deferred, ctx));
    if (ok) {
        *taken = deferred;
        deferred.what = WAITS_NOTHING;
    }
    pthread_mutex_unlock(&deferred_mu);
    return ok;
}

static dpc_linear_grads linear_grads(dp_tensor *dx, dp_tensor *dw, dp_tensor *db, dp_tensor *g, dp_tensor *x,
                                     dp_tensor *w, dp_tensor *mask)
{
    return (dpc_linear_grads){ g->shape[0], g->shape[1], x->shape[1], gpu_first(g), gpu_first(x), gpu_first(w),
                               dx && mask ? gpu_first(mask) : NULL, dx ? gpu_first(dx) : NULL, dw ? gpu_first(dw) : NULL,
                               db ? gpu_first(db) : NULL };
}

static dpc_bias_grad bias_grad_of(dp_tensor *db, dp_tensor *g)
{
    return (dpc_bias_grad){ g->shape[0], g->shape[1], gpu_first(g), gpu_first(db) };
}

/* db = the column sums of g, alone on stream (as an optimizer's launch
 * sums them). A CUDA status. */
static int bias_grad_alone(dp_tensor *db, dp_tensor *g, void *stream)
{
    dpc_bias_grad b = bias_grad_of(db, g);
    return dpc_bias_grad_sum(g->dtype, &b, stream);
}

/* dx = g @ w (0 where !(mask > 0) when mask is given; times the tanh
 * GELU's derivative at mask when gelu, mask then given), dw = g^T @ x, db = the column
 * sums of g, on stream: one launch of ours up to medium sizes (a ReLU's
 * mask only), else two cuBLASLt GEMMs with db in dw's epilogue and the
 * GELU's derivative in dx's (DGELU); but without dx, a small db apart
 * (dpc_bias_grad), left waiting for the optimizer's step when
 * bias_may_wait (nothing waits now). A CUDA status. */
static int linear_backward_on(dp_tensor *dx, dp_tensor *dw, dp_tensor *db, dp_tensor *g, dp_tensor *x, dp_tensor *w,
                              dp_tensor *mask, bool gelu, void *stream, bool bias_may_wait)
{
    int64_t M = g->shape[0], N = g->shape[1], K = x->shape[1];
    int st = dpc_set_device(g->device);
    if (st)
        return st;
    if (!gelu) {
        dpc_linear_grads layer = linear_grads(dx, dw, db, g, x, w, mask);
        int own = dpc_linear_backward(g->dtype, &layer, 1, NULL, stream);
        if (own != DPC_UNSUPPORTED)
            return own;
    }
    if (dx)   /* dx (M, K) = g (M, N) @ w (N, K) */
        st = dpc_gemm(g->dtype, 0, 0, M, K, N, 1.0, gpu_first(g), N, 0, gpu_first(w), K, 0, 0.0, gpu_first(dx), K, 0, 1,
                      gelu ? DPC_EPI_DGELU_TANH : DPC_EPI_BIAS, NULL, gelu ? gpu_first(mask) : NULL, allow_tf32,
                      stream);
    if (!st && dx && mask && !gelu)   /* the ReLU's backward, in place */
        st = dpc_unary_backward(DP_RELU, dx->dtype, gpu_shape(dx), gpu_operand(dx), gpu_operand(dx), gpu_operand(mask),
                                gpu_operand(mask), stream);
    /* (where our kernel takes dw, its epilogue sums db for nothing) */
    const bool bias_apart = !dx && dw && db && !dpc_gemm_own(N, K, M, 1) && dpc_bias_grad_fits(M, N);
    if (!st && dw)   /* dw (N, K) = g^T (N, M) @ x (M, K); db = the row sums of g^T */
        st = dpc_gemm(g->dtype, 1, 0, N, K, M, 1.0, gpu_first(g), N, 0, gpu_first(x), K, 0, 0.0, gpu_first(dw), K, 0, 1,
                      db && !bias_apart ? DPC_EPI_BGRAD : DPC_EPI_BIAS, db && !bias_apart ? gpu_first(db) : NULL, NULL,
                      allow_tf32, stream);
    if (!st && bias_apart && bias_may_wait)
        deferred_put((waiting_work){ .what = WAITS_BIAS_GRAD, .back[0] = { .g = g, .db = db }, .layers = 1,
                                     .stream = stream });
    else if (!st && bias_apart)
        st = bias_grad_alone(db, g, stream);
    else if (!st && db && !dw) {
        dpc_shape s = { 1, { N } };
        dpc_operand o = { .data = gpu_first(db), .stride = { 1 } }, in = { .data = gpu_first(g), .stride = { 1 } }, none = { 0 };
        st = dpc_reduce(DP_SUM, g->dtype, db->dtype, s, o, none, in, M, N, 0, stream);
    }
    return st;
}

static int layer_launch(const waiting_layer *l, void *stream)
{
    return linear_gemm(l->out, l->pre, l->x, l->w, l->b, l->epilogue, stream);
}

static dpc_linear_grads backward_grads(const waiting_backward *b)
{
    return linear_grads(b->dx, b->dw, b->db, b->g, b->x, b->w, b->mask);
}

/* The layers of the waiting backward w, as dpc_linear_backward takes them */
static void waiting_grads(const waiting_work *w, dpc_linear_grads grads[2])
{
    for (int i = 0; i < w->layers; i++)
        grads[i] = backward_grads(&w->back[i]);
}

/* The waiting backward w (one layer, or a chain of two in one launch),
 * then the SGD step sgd in the same launch when it is given (gpu_sgd_step
 * asked dpc_linear_backward_takes_sgd). A CUDA status. */
static int backward_launch(const waiting_work *w, const dpc_sgd_args *sgd)
{
    const waiting_backward *b = &w->back[0];
    if (w->layers == 1 && !sgd)
        return linear_backward_on(b->dx, b->dw, b->db, b->g, b->x, b->w, b->mask, false, w->stream, false);
    dpc_linear_grads grads[2];
    waiting_grads(w, grads);
    int rc = dpc_set_device(b->g->device);
    return rc ? rc : dpc_linear_backward(b->g->dtype, grads, w->layers, sgd, w->stream);
}

/* Launches the waiting work, if any, leaving the current device as it
 * was (the caller may have set another for its own work). A failure is
 * kept for the next op's gpu_status to report, since the caller may not
 * return a status. */
static void deferred_run(waiting_work *w)
{
    int device = -1;
    (void)dpc_get_device(&device);
    bool forward = w->what == WAITS_LINEAR;
    int rc = 0;
    for (int i = 0; forward && !rc && i < w->layers; i++)
        rc = layer_launch(&w->layer[i], w->stream);
    if (w->what == WAITS_LINEAR_BACKWARD)
        rc = backward_launch(w, NULL);
    if (w->what == WAITS_BIAS_GRAD) {
        rc = dpc_set_device(w->back[0].g->device);
        rc = rc ? rc : bias_grad_alone(w->back[0].db, w->back[0].g, w->stream);
    }
    if (device >= 0)
        dpc_set_device(device);
    const char *what = forward ? "linear"
                       : w->what == WAITS_BIAS_GRAD ? "linear backward (the bias gradient)"
                       : w->layers == 2 ? "linear backward (two layers in one launch)"
                                        : "linear backward";
    if (rc && !gpu_deferred_failure[0] && gpu_status(what, rc, (forward ? w->layer[0].x : w->back[0].g)->dtype))
        snprintf(gpu_deferred_failure, sizeof gpu_deferred_failure, "%s", dp_last_error());
    waiting_release(w);
}

/* Launches the first n of the waiting Linears w (taken), the rest staying in w. */
static void layers_launch(waiting_work *w, int n)
{
    if (n == 0)
        return;
    waiting_work head = { .what = WAITS_LINEAR, .layers = n, .stream = w->stream };
    memcpy(head.layer, w->layer, (size_t)n * sizeof *w->layer);
    deferred_run(&head);
    memmove(w->layer, w->layer + n, (size_t)(w->layers - n) * sizeof *w->layer);
    w->layers -= n;
}

void gpu_deferred_launch(void)
{
    waiting_work w;
    if (deferred_take(NULL, NULL, &w))
        deferred_run(&w);
}

void dp_cuda_launch_deferred(void)
{
    gpu_deferred_launch();
}

static bool queued_on(const waiting_work *w, const void *stream)
{
    return w->stream == stream;
}

/* The same, only when the waiting work is queued for stream. */
void gpu_deferred_launch_on(void *stream)
{
    waiting_work w;
    if (deferred_take(queued_on, stream, &w))
        deferred_run(&w);
}

static bool same_matrix(const dp_tensor *a, const dp_tensor *y)
{
    return a->storage == y->storage && a->offset == y->offset && a->dtype == y->dtype && a->ndim == 2 &&
           a->shape[0] == y->shape[0] && a->shape[1] == y->shape[1] && tensor_is_contiguous(a);
}

static const waiting_layer *last_layer(const waiting_work *w)
{
    return &w->layer[w->layers - 1];
}

/* The waiting Linears end in ctx (a matrix) on the current stream. */
static bool ends_in(const waiting_work *w, const void *ctx)
{
    const dp_tensor *t = ctx;
    return w->what == WAITS_LINEAR && w->stream == gpu_stream_now(t->device) && same_matrix(t, last_layer(w)->out);
}

/* out = act(x @ w^T + b): waits when our kernel takes it, after the waiting
 * Linears when x is the last one's output, else alone. */
static dp_status linear_enqueue(waiting_layer l)
{
    dp_tensor *out = l.out;
    int64_t M = out->shape[0], N = out->shape[1], K = l.x->shape[1];
    bool waits = !deferral_off && M > 0 && N > 0 && K > 0 && dpc_gemm_own(M, N, K, 1);
    waiting_work w;
    if (waits && !gpu_deferred_failure[0] && deferred_take(ends_in, l.x, &w)) {
        layers_launch(&w, w.layers == 2 ? 1 : 0);   /* two wait at most */
        if (gpu_deferred_failure[0]) {   /* that one failed: the other goes too, and this one fails */
            deferred_run(&w);
            return gpu_status("linear", 0, out->dtype);
        }
        w.layer[w.layers++] = l;
        waiting_retain(&w, w.layers - 1);
        deferred_store(w);
        return DP_OK;
    }
    void *stream = gpu_stream_of(out->device);   /* after the work waiting, if any */
    if (gpu_deferred_failure[0])   /* that one failed: say so now, and launch or defer nothing */
        return gpu_status("linear", 0, out->dtype);
    if (!waits)
        return gpu_status("linear", layer_launch(&l, stream), out->dtype);
    deferred_put((waiting_work){ .what = WAITS_LINEAR, .layer[0] = l, .layers = 1, .stream = stream });
    return DP_OK;
}

dp_status gpu_linear(dp_tensor *out, dp_tensor *x, dp_tensor *w, dp_tensor *b)
{
    return linear_enqueue((waiting_layer){ .x = x, .w = w, .b = b, .out = out, .epilogue = DPC_EPI_BIAS });
}

dp_status gpu_linear_act(dp_tensor *out, dp_tensor *pre, dp_tensor *x, dp_tensor *w, dp_tensor *b, int act)
{
    return linear_enqueue((waiting_layer){ .x = x, .w = w, .b = b, .out = out, .pre = pre,
                                           .epilogue = act_epilogue(act) });
}

/* The waiting Linears end in the loss's input (ctx), the last without an
 * activation after it. */
static bool takes_output(const waiting_work *w, const void *ctx)
{
    return ends_in(w, ctx) && last_layer(w)->epilogue == DPC_EPI_BIAS;
}

typedef struct {
    const dp_tensor *out, *a;
} activation_of;

/* out = act(a) fits the last waiting Linear's epilogue: a is its output,
 * it has no activation yet, and out is a itself or a new tensor (not one
 * the product reads). */
static bool fits_epilogue(const waiting_work *w, const void *ctx)
{
    const dp_tensor *out = ((const activation_of *)ctx)->out, *a = ((const activation_of *)ctx)->a;
    if (w->what != WAITS_LINEAR)
        return false;
    const waiting_layer *l = last_layer(w);
    const dp_tensor *y = l->out;
    return l->epilogue == DPC_EPI_BIAS && same_matrix(a, y) && out->dtype == y->dtype && out->ndim == 2 &&
           tensor_is_contiguous(out) && out->shape[0] == y->shape[0] && out->shape[1] == y->shape[1] &&
           (out->storage == y->storage ? out->offset == y->offset
                                       : out->storage != l->x->storage && out->storage != l->w->storage &&
                                             (!l->b || out->storage != l->b->storage));
}

/* out = op(a) as the epilogue of the waiting Linear whose output a is,
 * when op is a ReLU or GELU: then both still wait; false (nothing done)
 * otherwise. */
bool gpu_deferred_fuse(int op, dp_tensor *out, dp_tensor *a, dp_status *st)
{
    waiting_work w;
    if ((op != DP_RELU && op != DP_GELU && op != DP_GELU_TANH) ||
        !deferred_take(fits_epilogue, &(activation_of){ out, a }, &w))
        return false;
    waiting_layer *l = &w.layer[w.layers - 1];
    if (out->storage != l->out->storage) {   /* the product stays in a, the activation goes to out */
        dp_tensor_retain(out);
        l->pre = l->out;
        l->out = out;
    }
    l->epilogue = act_epilogue(op);
    deferred_fusions++;
    deferred_store(w);
    *st = DP_OK;
    return true;
}

typedef struct {
    const dp_tensor *g;            /* this backward's gradient */
    dpc_linear_grads layer;        /* this backward's */
} chain_of;

/* The waiting backward and this one (ctx) make a chain: the waiting one's
 * dx is this one's gradient, on the same stream, and one block takes both. */
static bool chains_after(const waiting_work *w, const void *ctx)
{
    const chain_of *c = ctx;
    const waiting_backward *b = &w->back[0];
    if (w->what != WAITS_LINEAR_BACKWARD || w->layers != 1 || !b->dx || !same_matrix(c->g, b->dx) ||
        w->stream != gpu_stream_now(c->g->device))
        return false;
    dpc_linear_grads layer[2] = { backward_grads(b), c->layer };
    return dpc_linear_backward_chains(layer);
}

/* dx = g @ w (through the backward of op, DP_RELU or DP_GELU_TANH, at mask
 * when mask is given), dw = g^T @ x, db = the column sums of g. When g is
 * the dx of the waiting backward of the layer after this one, the two
 * make a chain, one launch of one block, which waits in turn for an SGD
 * step to take (gpu_sgd_step). Else this one waits for the layer before
 * when it may start a chain; or, a first layer's, launches dw and leaves
 * db waiting for the optimizer (linear_backward_on). A GELU folded in
 * takes cuBLASLt's products at once: the chains mask for a ReLU only. */
dp_status gpu_linear_backward(dp_tensor *dx, dp_tensor *dw, dp_tensor *db, dp_tensor *g, dp_tensor *x, dp_tensor *w,
                              dp_tensor *mask, int op)
{
    const bool gelu = mask && op == DP_GELU_TANH;
    waiting_backward this = { .x = x, .w = w, .g = g, .mask = mask, .dx = dx, .dw = dw, .db = db };
    chain_of chain = { .g = g, .layer = backward_grads(&this) };
    waiting_work after;
    if (!gelu && deferred_take(chains_after, &chain, &after)) {
        after.back[after.layers++] = this;
        waiting_retain(&after, after.layers - 1);
        deferred_fusions++;
        deferred_store(after);
        return DP_OK;
    }
    void *stream = gpu_stream_of(g->device);   /* after the work waiting, if any */
    if (gpu_deferred_failure[0])
        return gpu_status("linear backward", 0, g->dtype);
    if (!gelu && !deferral_off && dx && dpc_linear_backward_may_chain(&chain.layer)) {
        deferred_put((waiting_work){ .what = WAITS_LINEAR_BACKWARD, .back[0] = this, .layers = 1, .stream = stream });
        return DP_OK;
    }
    return gpu_status("linear backward", linear_backward_on(dx, dw, db, g, x, w, mask, gelu, stream, !deferral_off),
                      g->dtype);
}


/* ---------------------------------------------------------------- cross-entropy */

/* All on the device: a bad target is found by the kernel and reported at
 * the next synchronisation (a host check would cost a round trip per
 * step and could not be captured in a CUDA graph). */
bool gpu_cross_entropy_fuses(const dp_tensor *input)
{
    return dpc_cross_entropy_fuses(input->shape[0], input->shape[1]) != 0;
}

/* The waiting Linears from layer `from` on, as the loss's launch takes them. */
static dpc_ce_linear ce_layers(const waiting_work *w, int from)
{
    dpc_ce_linear c = { .layers = w->layers - from };
    for (int i = from; i < w->layers; i++) {
        const waiting_layer *l = &w->layer[i];
        c.layer[i - from] = (dpc_ce_layer){ gpu_first(l->x), gpu_first(l->w), l->b ? gpu_first(l->b) : NULL, gpu_first(l->out),
                                            l->pre ? gpu_first(l->pre) : NULL, l->x->shape[1], l->epilogue };
    }
    return c;
}

/* The loss; when its input is the output of the waiting Linears (a
 * classifier's head, or its last two layers) and they fit one block, they
 * run in the loss's launch: a launch less for each, as with a ReLU after
 * one. The ones that do not fit are launched first. */
dp_status gpu_cross_entropy(dp_tensor *out, cpu_ce_args *a)
{
    int64_t N = a->input->shape[0], C = a->input->shape[1];
    dp_tensor *rows = NULL;
    waiting_work lin;
    int done = 0;
    dp_status st = tensor_new(&rows, 1, &N, DP_FLOAT64, a->input->device);
    bool with_linear = !st && deferred_take(takes_output, a->input, &lin);
    dpc_ce_linear linear = { .layers = 0 };
    if (with_linear) {
        int from = 0;
        for (; from < lin.layers; from++) {
            linear = ce_layers(&lin, from);
            if (dpc_cross_entropy_takes_linear(a->input->dtype, N, C, &linear))
                break;
        }
        layers_launch(&lin, from);
        with_linear = lin.layers > 0;
    }
    if (!st) {
        dpc_set_device(a->input->device);
        st = gpu_status(with_linear ? "linear and cross_entropy" : "cross_entropy",
                        dpc_cross_entropy(a->input->dtype, N, C, gpu_first(a->input), gpu_first(a->target),
                                          a->weight ? gpu_first(a->weight) : NULL, a->ignore_index, a->label_smoothing,
                                          a->log_probs, a->reduction, gpu_first(rows),
                                          a->probs ? gpu_first(a->probs) : NULL, gpu_first(out), gpu_first(a->denom),
                                          a->grad_one ? gpu_first(a->grad_one) : NULL, &done,
                                          with_linear ? &linear : NULL, gpu_kernel_error_block(), gpu_stream_of(a->input->device)),
                        a->input->dtype);
    }
    if (with_linear) {
        if (st) {   /* the Linears' outputs are Lua's too: give them their values */
            layers_launch(&lin, lin.layers);
        } else {
            deferred_fusions += lin.layers;
            waiting_release(&lin);
        }
    }
    a->grad_one_done = !st && done;
    dp_tensor_release(rows);
    return st;
}

dp_status gpu_cross_entropy_backward(dp_tensor *dinput, dp_tensor *g, const cpu_ce_args *a)
{
    int64_t N = dinput->shape[0], C = dinput->shape[1];
    dpc_set_device(dinput->device);
    return gpu_status("cross_entropy backward",
                      dpc_cross_entropy_backward(dinput->dtype, N, C, gpu_first(dinput), a->probs ? gpu_first(a->probs) : NULL,
                                                 gpu_first(a->target), a->weight ? gpu_first(a->weight) : NULL,
                                                 a->ignore_index, a->label_smoothing, a->log_probs, a->reduction,
                                                 gpu_first(g), gpu_first(a->denom), gpu_stream_of(dinput->device)),
                      dinput->dtype);
}


/* The classifier's loss (cuda/classifier.cu): a bfloat16 input's rows
 * read as they are, their log-sum-exp into lse (N float32). */
dp_status gpu_classifier_loss(dp_tensor *out, dp_tensor *lse, dp_tensor *denom, const cpu_ce_args *a)
{
    int64_t N = a->input->shape[0], C = a->input->shape[1];
    dp_tensor *rows = NULL;
    dp_status st = tensor_new(&rows, 1, &N, DP_FLOAT32, a->input->device);
    if (st)
        return st;
    dpc_set_device(a->input->device);
    st = gpu_status("cross_entropy",
                    dpc_classifier_loss(N, C, gpu_first(a->input), gpu_first(a->target), a->ignore_index,
                                        a->label_smoothing, a->reduction, gpu_first(lse), gpu_first(rows), out->dtype,
                                        gpu_first(out), gpu_first(denom), gpu_kernel_error_block(),
                                        gpu_stream_of(a->input->device)),
                    a->input->dtype);
    dp_tensor_release(rows);
    return st;
}

/* g: the loss's gradient, contiguous */
dp_status gpu_classifier_backward(dp_tensor *dinput, dp_tensor *g, dp_tensor *lse, const cpu_ce_args *a)
{
    int64_t N = dinput->shape[0], C = dinput->shape[1];
    dpc_set_device(dinput->device);
    return gpu_status("cross_entropy backward",
                      dpc_classifier_backward(N, C, gpu_first(dinput), gpu_first(a->input), gpu_first(a->target),
                                              a->ignore_index, a->label_smoothing, gpu_first(lse), a->reduction,
                                              g->dtype, gpu_first(g), gpu_first(a->denom), gpu_stream_of(dinput->device)),
                      dinput->dtype);
}

/* ---------------------------------------------------------------- optimizers */

typedef struct {
    const dp_tensor *p;       /* the parameters */
    const dpc_sgd_args *a;    /* the step */
} sgd_of;

/* The waiting backward can take the SGD step ctx in its launch: on the
 * parameters' device and stream, of their dtype, and it fits one block
 * (dpc_linear_backward_takes_sgd). */
static bool takes_sgd(const waiting_work *w, const void *ctx)
{
    const sgd_of *o = ctx;
    const dp_tensor *g = w->back[0].g;
    if (w->what != WAITS_LINEAR_BACKWARD || g->device != o->p->device || w->stream != gpu_stream_now(o->p->device) ||
        g->dtype != o->p->dtype)
        return false;
    dpc_linear_grads grads[2];
    waiting_grads(w, grads);
    return dpc_linear_backward_takes_sgd(o->p->dtype, grads, w->layers, o->a);
}

/* An optimizer's step over flat buffers: parameters p, gradients g and
 * its state (a momentum buffer, Adam's moments; NULL where none). */
typedef struct {
    const dp_tensor *p, *g, *state[4];
} step_of;

/* The waiting bias gradient can be made in the launch of the step ctx:
 * on its device, stream and dtype, db inside the step's gradients, and
 * the layer's gradient none of the step's buffers. */
static bool bias_in_step(const waiting_work *w, const void *ctx)
{
    const step_of *o = ctx;
    const dp_tensor *db = w->back[0].db, *lg = w->back[0].g, *p = o->p, *g = o->g;
    if (w->what != WAITS_BIAS_GRAD || lg->device != p->device || w->stream != gpu_stream_now(p->device) ||
        lg->dtype != p->dtype || g->dtype != p->dtype || db->storage != g->storage || !tensor_is_contiguous(db) ||
        !tensor_is_contiguous(g))
        return false;
    const dp_tensor *buffers[6] = { p, g, o->state[0], o->state[1], o->state[2], o->state[3] };
    for (int i = 0; i < 6; i++)
        if (buffers[i] && buffers[i]->storage == lg->storage)
            return false;
    const ptrdiff_t at = (const char *)gpu_first(db) - (const char *)gpu_first(g);
    const ptrdiff_t size = (ptrdiff_t)dp_dtype_size(g->dtype);
    return at >= 0 && at % size == 0 && at / size + dp_tensor_numel(db) <= dp_tensor_numel(g);
}

/* The waiting bias gradient, taken into *taken and described in *b, when
 * the step o can make it in its launch (bias_in_step); else NULL. */
static const dpc_bias_grad *bias_for_step(step_of o, waiting_work *taken, dpc_bias_grad *b)
{
    if (!deferred_take(bias_in_step, &o, taken))
        return NULL;
    *b = bias_grad_of(taken->back[0].db, taken->back[0].g);
    return b;
}

/* After the step's launch (status rc) that took the bias gradient `taken`. */
static void bias_step_done(waiting_work *taken, int rc)
{
    deferred_fusions += !rc;
    waiting_release(taken);
}

/* The step over the flat buffers p, g (and buf); in the launch of the
 * backward that waits, when it computed the last gradients and can take
 * it (the seed's chain of two Linears and its step: one launch); after
 * the first layer's bias gradient in the step's own launch when that
 * waits. */
dp_status gpu_sgd_step(dp_tensor *p, dp_tensor *g, dp_tensor *buf, double lr, double momentum,
                       double dampening, int nesterov, double weight_decay, int first_step)
{
    const dpc_sgd_args a = { dp_tensor_numel(p), gpu_first(p), gpu_first(g), buf ? gpu_first(buf) : NULL, lr, momentum,
                             dampening, weight_decay, nesterov, first_step };
    waiting_work back;
    if (deferred_take(takes_sgd, &(sgd_of){ p, &a }, &back)) {
        int rc = backward_launch(&back, &a);
        if (!rc)
            deferred_fusions++;
        waiting_release(&back);
        return gpu_status(back.layers == 2 ? "linear backward (two layers) and sgd_step in one launch"
                                           : "linear backward and sgd_step in one launch", rc, p->dtype);
    }
    waiting_work bias;
    dpc_bias_grad b;
    const dpc_bias_grad *first_bias = bias_for_step((step_of){ p, g, { buf } }, &bias, &b);
    dpc_set_device(p->device);
    int rc = dpc_sgd_step(p->dtype, &a, first_bias, gpu_stream_of(p->device));
    if (first_bias)
        bias_step_done(&bias, rc);
    return gpu_status(first_bias ? "sgd_step with the first layer's bias gradient" : "sgd_step", rc, p->dtype);
}

/* Adam's step (on the float32 master copy when there is one); after the
 * first layer's bias gradient in its launch when that waits (as
 * gpu_sgd_step). */
dp_status gpu_adam_step(dp_tensor *p, dp_tensor *g, dp_tensor *m, dp_tensor *v, dp_tensor *vmax,
                        dp_tensor *master, double lr, double beta1, double beta2, double eps, double weight_decay,
                        int decoupled, int64_t step, dp_tensor *step_t)
{
    waiting_work bias;
    dpc_bias_grad b;
    const dpc_bias_grad *first_bias = bias_for_step((step_of){ p, g, { m, v, vmax, master } }, &bias, &b);
    const dpc_adam_buffers bufs = { gpu_first(p), gpu_first(g), gpu_first(m), gpu_first(v),
                                    vmax ? gpu_first(vmax) : NULL, master ? gpu_first(master) : NULL, g->dtype };
    dpc_set_device(p->device);
    int rc = dpc_adam_step(p->dtype, dp_tensor_numel(p), &bufs, lr, beta1, beta2, eps, weight_decay, decoupled, step,
                           step_t ? (double *)gpu_first(step_t) : NULL, first_bias, gpu_stream_of(p->device));
    if (first_bias)
        bias_step_done(&bias, rc);
    return gpu_status(first_bias ? "adam_step with the first layer's bias gradient" : "adam_step", rc, p->dtype);
}

/* Adadelta's, RMSprop's or Adagrad's step; after the first layer's bias
 * gradient in its launch when that waits (as gpu_sgd_step). */
dp_status gpu_rule_step(const optim_rule *r, dp_tensor *p, dp_tensor *g, dp_tensor *const state[3])
{
    waiting_work bias;
    dpc_bias_grad b;
    const dpc_bias_grad *first_bias = bias_for_step((step_of){ p, g, { state[0], state[1], state[2] } }, &bias, &b);
    void *bufs[3];
    for (int i = 0; i < 3; i++)
        bufs[i] = state[i] ? gpu_first(state[i]) : NULL;
    dpc_set_device(p->device);
    int rc = dpc_rule_step(p->dtype, dp_tensor_numel(p), r, gpu_first(p), gpu_first(g), bufs, first_bias,
                           gpu_stream_of(p->device));
    if (first_bias)
        bias_step_done(&bias, rc);
    char what[96];
    snprintf(what, sizeof what, "%s%s", r->fn, first_bias ? " with the first layer's bias gradient" : "");
    return gpu_status(what, rc, p->dtype);
}

#endif /* DP_HAVE_CUDA */
