/*
 * autograd.h — the tape. An op that sees an input requiring grad records a
 * node on its output: the backward function, edges to the inputs' nodes
 * (or to the leaf tensors themselves), the inputs' shapes and dtypes, and
 * whatever it saved. dp_backward walks the nodes in reverse creation order.
 */
#ifndef DP_CORE_AUTOGRAD_H
#define DP_CORE_AUTOGRAD_H

#include "core/tensor.h"

#define AG_MAX_SAVED 5
#define AG_MAX_ARGS 8

typedef struct ag_node ag_node;

/* Computes grads_in[i] for every input i with in[i].needs_grad, from the
 * gradient of the node's output. Runs with grad mode off. Leaves
 * grads_in[i] NULL for an input that gets no gradient (e.g. zero). */
typedef dp_status (*ag_backward_fn)(ag_node *n, dp_tensor *grad, dp_tensor **grads_in);

typedef struct {
    int ndim;
    int64_t shape[DP_MAX_DIMS];
    int dtype;
    int device;
    bool needs_grad;
} ag_input;

struct ag_node {
    int refcount;
    size_t capacity;           /* of its block from the caching allocator */
    uint64_t seq;              /* creation order: later nodes run first */
    const char *name;          /* PyTorch's name, e.g. "AddBackward0" */
    ag_backward_fn backward;
    int ninputs;
    ag_node **next;            /* grad_fn of each input, or NULL */
    dp_tensor **leaf;          /* each input that is a leaf requiring grad, or NULL */
    ag_input *in;
    int nsaved;
    dp_tensor *saved[AG_MAX_SAVED];
    uint32_t saved_version[AG_MAX_SAVED];
    int64_t iarg[AG_MAX_ARGS];
    double darg[2];
    bool freed;                /* saved tensors released by a backward */
    int fold_saved;            /* 1 + the index in saved of the output whose backward a
                                  consumer may apply (ag_set_relu_mask, ag_set_gelu_fold,
                                  ag_set_log_softmax_fold); or 0 */
    int fold_kind;             /* which: AG_FOLD_RELU, AG_FOLD_GELU_TANH or AG_FOLD_LOG_SOFTMAX */
    /* engine state, only during dp_backward */
    int deps;
    dp_tensor *grad;
    int mask_input;            /* the input offered its node's fold (ag_offered_mask), or -1 */
    bool mask_taken;           /* the backward applied it (ag_took_mask) */
    bool grad_masked;          /* the gradient this node got has its backward applied already */
    bool in_walk;              /* listed by count_deps */
    bool run;                  /* dp_grad: its backward leads to an input */
    int capture;               /* dp_grad: 1 + the index of the input whose node this is, or 0 */
    int64_t lua_hook;          /* id of the Lua hooks of the tensor whose node this is, or 0 */
};

bool ag_grad_enabled(void);
void ag_node_release(ag_node *n);
/* tensor.c: a tensor with Lua hooks is gone; its id is queued for Lua. */
void ag_lua_hook_done(int64_t id);
/* True when recording is on and some input requires grad. */
bool ag_needs_record(int n, dp_tensor *const *inputs);
/* Records a node on out (which then requires grad) when ag_needs_record;
 * *node is NULL otherwise. On failure out is left untouched. */
dp_status ag_record(dp_tensor *out, const char *name, ag_backward_fn fn, int n,
                    dp_tensor *const *inputs, ag_node **node);
/* The same, releasing *out when recording fails: for an op's last step. */
dp_status ag_record_or_drop(dp_tensor **out, const char *name, ag_backward_fn fn, int n,
                           dp_tensor *const *inputs, ag_node **node);
/* Saves an input (retained) or the op's output (an alias without grad_fn,
 * so that the output and its node do not keep each other alive). */
void ag_save(ag_node *n, dp_tensor *t);
void ag_save_output(ag_node *n, dp_tensor *out);
/* Refuses in-place writes that would corrupt the tape, and bumps the
 * storage version that saved tensors are checked against. */
dp_status ag_check_inplace(const char *fn, dp_tensor *dst);

/* Runs fn(ctx) once when the running backward ends (queued from a hook);
 * a failure becomes backward's error. Queuing the same pair twice is a no-op. */
dp_status ag_queue_final_callback(dp_status (*fn)(void *ctx), void *ctx);

/* A ReLU's backward multiplies its gradient by (y > 0), a tanh GELU's by
 * its derivative at its input x. A node whose backward starts that way
 * names its saved y with ag_set_relu_mask (its x with ag_set_gelu_fold).
 * When input i's node is such a node, and the gradient this node writes
 * for input i is all that node will get, ag_offered_mask(n, i, &op) is
 * that saved tensor (same shape, dtype and device as input i, contiguous)
 * and op DP_RELU or DP_GELU_TANH, else NULL: a backward may then apply the
 * activation's backward as it writes that gradient (in a GEMM's epilogue,
 * which saves a kernel, a pass over the gradient and a tensor), and says
 * so with ag_took_mask(n). The activation's node then finds
 * n->grad_masked set and skips its part. The decision is made as the
 * backward runs, so whatever reads the activation's gradient at that
 * point must be the engine alone. */
enum { AG_FOLD_RELU = 1, AG_FOLD_GELU_TANH, AG_FOLD_LOG_SOFTMAX };
void ag_set_relu_mask(ag_node *n, int saved_index);
void ag_set_gelu_fold(ag_node *n, int saved_index);
dp_tensor *ag_offered_mask(const ag_node *n, int i, int *op);
void ag_took_mask(ag_node *n);
/* The same for a log_softmax's backward, g - exp(y) sum(g), folded into
 * an nll_loss's, whose gradient has one non-zero per row: its node names
 * y with ag_set_log_softmax_fold; ag_offered_log_softmax(n, i, dim) is y
 * when input i's node is a log_softmax along dim that may be folded
 * (as ag_offered_mask decides), else NULL; the taker calls
 * ag_took_mask(n), and the log_softmax passes its gradient on as it is. */
void ag_set_log_softmax_fold(ag_node *n, int saved_index);
dp_tensor *ag_offered_log_softmax(const ag_node *n, int i, int dim);

/* A tensor for input i's gradient, to be written whole by the backward
 * function: the leaf's flat-buffer slot when that saves a copy. */
dp_status ag_grad_output(ag_node *n, int i, dp_tensor **out);

/* The gradient input i's node has gathered so far, when a backward may
 * add into it in place (its node's alone, contiguous, of the input's shape,
 * dtype and device), else NULL: a window's backward (narrow, select,
 * split's pieces) adds its part into it instead of making the whole input
 * in zeros for each window and summing them. */
dp_tensor *ag_pending_grad(ag_node *n, int i);

/* backward.c: reduces grad (broadcast shape) to an input's shape and dtype */
dp_status ag_sum_to(dp_tensor **out, dp_tensor *grad, const ag_input *in);
/* Whether g is the implicit gradient 1 of a 0-d loss (backward() called
 * without a gradient): a backward may then hand out what its forward
 * already computed for that case. */
bool ag_is_implicit_one(const dp_tensor *g);

/* backward.c: the formulas (see each for what it saves) */
dp_status bw_unary(ag_node *n, dp_tensor *g, dp_tensor **gi);        /* saved x, y; iarg op */
dp_status bw_binary(ag_node *n, dp_tensor *g, dp_tensor **gi);       /* saved a, b, y; iarg op */
dp_status bw_where(ag_node *n, dp_tensor *g, dp_tensor **gi);        /* saved cond */
dp_status bw_clamp(ag_node *n, dp_tensor *g, dp_tensor **gi);        /* saved x; darg lo, hi */
dp_status bw_reduce(ag_node *n, dp_tensor *g, dp_tensor **gi);       /* saved x, y; iarg op, dim, keepdim, correction */
dp_status bw_reduce_index(ag_node *n, dp_tensor *g, dp_tensor **gi); /* saved indices; iarg -, dim, keepdim */
dp_status bw_softmax(ag_node *n, dp_tensor *g, dp_tensor **gi);      /* saved y; iarg dim, log */
dp_status bw_matmul(ag_node *n, dp_tensor *g, dp_tensor **gi);       /* saved a, b */
dp_status bw_reshape(ag_node *n, dp_tensor *g, dp_tensor **gi);
dp_status bw_expand(ag_node *n, dp_tensor *g, dp_tensor **gi);
dp_status bw_identity(ag_node *n, dp_tensor *g, dp_tensor **gi);
dp_status bw_permute(ag_node *n, dp_tensor *g, dp_tensor **gi);      /* iarg dims */
dp_status bw_window(ag_node *n, dp_tensor *g, dp_tensor **gi);       /* iarg dim, start, stop, step, is_select */
dp_status bw_cat(ag_node *n, dp_tensor *g, dp_tensor **gi);          /* iarg dim */
dp_status bw_index_select(ag_node *n, dp_tensor *g, dp_tensor **gi); /* saved index; iarg dim */
dp_status bw_gather(ag_node *n, dp_tensor *g, dp_tensor **gi);       /* saved index; iarg dim */
dp_status bw_scatter(ag_node *n, dp_tensor *g, dp_tensor **gi);      /* saved index; iarg dim, add */

#endif
