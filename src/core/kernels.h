/*
 * kernels.h — the op table's last step: run a kernel on the device of its
 * output. src/cpu has the CPU kernels; src/core/gpu*.c adapt the same
 * calls to the CUDA kernels of cuda/dpc_ops.h. Arguments are as for the
 * cpu_* functions (src/cpu/cpu.h): checked, broadcast, cast.
 */
#ifndef DP_CORE_KERNELS_H
#define DP_CORE_KERNELS_H

#include "cpu/cpu.h"

/* gpu*.c: the CUDA side (each fails clearly in a build without CUDA) */
dp_status gpu_unary(int op, dp_tensor *out, dp_tensor *a);
dp_status gpu_binary(int op, dp_tensor *out, dp_tensor *a, dp_tensor *b);
dp_status gpu_unary_backward(int op, dp_tensor *dx, dp_tensor *g, dp_tensor *x, dp_tensor *y);
dp_status gpu_where(dp_tensor *out, dp_tensor *cond, dp_tensor *a, dp_tensor *b);
dp_status gpu_clamp(dp_tensor *out, dp_tensor *a, double lo, double hi);
dp_status gpu_copy(dp_tensor *dst, dp_tensor *src);
dp_status gpu_fill(dp_tensor *dst, double value);
dp_status gpu_reduce(int op, dp_tensor *out, dp_tensor *indices, dp_tensor *a, int dim, int correction);
dp_status gpu_softmax(dp_tensor *out, dp_tensor *a, int dim, int log);
/* gpu_attention.c: the flash kernels, for the dtypes and head dims gpu_attention_takes */
int gpu_attention_takes(int dtype, int64_t E, int64_t Ev);
dp_status gpu_attention_forward(const cpu_attention_args *a, dp_tensor *out, dp_tensor *lse);
dp_status gpu_attention_backward(const cpu_attention_args *a, dp_tensor *out, dp_tensor *dout, dp_tensor *lse,
                                 dp_tensor *dq, dp_tensor *dk, dp_tensor *dv);
/* gpu_norm.c: LayerNorm's kernels (cuda/norm.cu), arguments as cpu_layer_norm's */
dp_status gpu_layer_norm(const cpu_norm_args *a, dp_tensor *out, dp_tensor *sum, dp_tensor *mean, dp_tensor *rstd);
dp_status gpu_layer_norm_backward(const cpu_norm_args *a, dp_tensor *dy, dp_tensor *mean, dp_tensor *rstd,
                                  dp_tensor *dx, dp_tensor *dw, dp_tensor *db);
/* gpu_norm.c: BatchNorm's kernels, arguments as cpu_batch_norm's */
dp_status gpu_batch_norm(const cpu_bn_args *a, dp_tensor *out, dp_tensor *mean, dp_tensor *invstd);
dp_status gpu_batch_norm_backward(const cpu_bn_args *a, dp_tensor *dy, dp_tensor *mean, dp_tensor *invstd,
                                  dp_tensor *dx, dp_tensor *dw, dp_tensor *db);
dp_status gpu_bmm(dp_tensor *out, dp_tensor *a, dp_tensor *b);
dp_status gpu_linear(dp_tensor *out, dp_tensor *x, dp_tensor *w, dp_tensor *b);
dp_status gpu_linear_backward(dp_tensor *dx, dp_tensor *dw, dp_tensor *db, dp_tensor *g, dp_tensor *x, dp_tensor *w,
                              dp_tensor *mask, int op);
dp_status gpu_linear_act(dp_tensor *out, dp_tensor *pre, dp_tensor *x, dp_tensor *w, dp_tensor *b, int act);
dp_status gpu_index_select(dp_tensor *out, dp_tensor *a, int dim, dp_tensor *index);
dp_status gpu_index_add(dp_tensor *out, int dim, dp_tensor *index, dp_tensor *src);
dp_status gpu_gather(dp_tensor *out, dp_tensor *a, int dim, dp_tensor *index);
dp_status gpu_scatter_add(dp_tensor *out, int dim, dp_tensor *index, dp_tensor *src);
dp_status gpu_scatter(dp_tensor *out, int dim, dp_tensor *index, dp_tensor *src);
dp_status gpu_cross_entropy(dp_tensor *out, cpu_ce_args *a);
bool gpu_cross_entropy_fuses(const dp_tensor *input);
dp_status gpu_cross_entropy_backward(dp_tensor *dinput, dp_tensor *g, const cpu_ce_args *a);
/* the classifier's loss (bfloat16 logits, no class weights, no
 * log-probabilities): its rows' log-sum-exp kept in lse (N float32) */
dp_status gpu_classifier_loss(dp_tensor *out, dp_tensor *lse, dp_tensor *denom, const cpu_ce_args *a);
dp_status gpu_classifier_backward(dp_tensor *dinput, dp_tensor *g, dp_tensor *lse, const cpu_ce_args *a);
dp_status gpu_unfold(dp_tensor *cols, dp_tensor *x, const cpu_unfold_args *u);
dp_status gpu_fold_add(dp_tensor *x, dp_tensor *cols, const cpu_unfold_args *u);
dp_status gpu_lstm_gates(dp_tensor *out, dp_tensor *gi, dp_tensor *gh, dp_tensor *c);
dp_status gpu_lstm_gates_backward(dp_tensor *dgates, dp_tensor *dc, dp_tensor *dout, dp_tensor *gi, dp_tensor *gh,
                                  dp_tensor *c, dp_tensor *c1);
dp_status gpu_gru_gates(dp_tensor *out, dp_tensor *gi, dp_tensor *gh, dp_tensor *h);
dp_status gpu_gru_gates_backward(dp_tensor *dgi, dp_tensor *dgh, dp_tensor *dh, dp_tensor *dout, dp_tensor *gi,
                                 dp_tensor *gh, dp_tensor *h);
dp_status gpu_sgd_step(dp_tensor *p, dp_tensor *g, dp_tensor *buf, double lr, double momentum,
                       double dampening, int nesterov, double weight_decay, int first_step);
/* step_t: NULL, or the 0-d float64 device step count of capturable Adam
 * (incremented on the device; `step` is then ignored) */
dp_status gpu_adam_step(dp_tensor *p, dp_tensor *g, dp_tensor *m, dp_tensor *v, dp_tensor *vmax,
                        dp_tensor *master, double lr, double beta1, double beta2, double eps, double weight_decay,
                        int decoupled, int64_t step, dp_tensor *step_t);
/* Adadelta's, RMSprop's or Adagrad's step (common/optim_rule.h) */
dp_status gpu_rule_step(const optim_rule *r, dp_tensor *p, dp_tensor *g, dp_tensor *const state[3]);
bool gpu_any(int what, dp_tensor *t);
/* select.c's row kernels (cpu.h's argsort, cumsum, multinomial) and put_ */
dp_status gpu_argsort(dp_tensor *indices, dp_tensor *a, int descending);
dp_status gpu_cumsum(dp_tensor *out, dp_tensor *a, int reverse);
dp_status gpu_multinomial(dp_tensor *out, dp_tensor *cdf, dp_tensor *u);
dp_status gpu_put(dp_tensor *dst, dp_tensor *index, dp_tensor *src);
/* how many references to t the launch waiting in gpu_linear.c holds */
int gpu_deferred_holds(const dp_tensor *t);
/* t (new, contiguous) = the values of Philox blocks counter.. (common/philox.h) */
dp_status gpu_random(dp_tensor *t, int kind, uint64_t counter, uint64_t key, int64_t low, uint64_t range);
/* out = in with dropout's mask of blocks counter.. applied (dpc_dropout) */
dp_status gpu_dropout(dp_tensor *out, dp_tensor *in, uint64_t counter, uint64_t key, double p);

#define ON_CPU(t) ((t)->device == DP_CPU)

static inline dp_status k_unary(int op, dp_tensor *out, dp_tensor *a)
{ return ON_CPU(out) ? cpu_unary(op, out, a) : gpu_unary(op, out, a); }
static inline dp_status k_binary(int op, dp_tensor *out, dp_tensor *a, dp_tensor *b)
{ return ON_CPU(out) ? cpu_binary(op, out, a, b) : gpu_binary(op, out, a, b); }
static inline dp_status k_unary_backward(int op, dp_tensor *dx, dp_tensor *g, dp_tensor *x, dp_tensor *y)
{ return ON_CPU(dx) ? cpu_unary_backward(op, dx, g, x, y) : gpu_unary_backward(op, dx, g, x, y); }
static inline dp_status k_where(dp_tensor *out, dp_tensor *cond, dp_tensor *a, dp_tensor *b)
{ return ON_CPU(out) ? cpu_where(out, cond, a, b) : gpu_where(out, cond, a, b); }
static inline dp_status k_clamp(dp_tensor *out, dp_tensor *a, double lo, double hi)
{ return ON_CPU(out) ? cpu_clamp(out, a, lo, hi) : gpu_clamp(out, a, lo, hi); }
/* a copy may cross devices: only host to host stays on the CPU */
static inline dp_status k_copy(dp_tensor *dst, dp_tensor *src)
{ return ON_CPU(dst) && ON_CPU(src) ? cpu_copy(dst, src) : gpu_copy(dst, src); }
static inline dp_status k_fill(dp_tensor *dst, double value)
{ return ON_CPU(dst) ? cpu_fill(dst, value) : gpu_fill(dst, value); }
static inline bool k_any(int what, dp_tensor *t)
{ return ON_CPU(t) ? cpu_any(what, t) : gpu_any(what, t); }
static inline dp_status k_reduce(int op, dp_tensor *out, dp_tensor *indices, dp_tensor *a, int dim, int correction)
{ return ON_CPU(out) ? cpu_reduce(op, out, indices, a, dim, correction) : gpu_reduce(op, out, indices, a, dim, correction); }
static inline dp_status k_softmax(dp_tensor *out, dp_tensor *a, int dim, int log)
{ return ON_CPU(out) ? cpu_softmax(out, a, dim, log) : gpu_softmax(out, a, dim, log); }
/* ops.c: a CPU product of any dtype and layout, through copies that
 * cpu_bmm takes where the operands are not such */
dp_status bmm_on_cpu(dp_tensor *out, dp_tensor *a, dp_tensor *b);
static inline dp_status k_bmm(dp_tensor *out, dp_tensor *a, dp_tensor *b)
{ return ON_CPU(out) ? bmm_on_cpu(out, a, b) : gpu_bmm(out, a, b); }
static inline dp_status k_linear(dp_tensor *out, dp_tensor *x, dp_tensor *w, dp_tensor *b)
{
    if (!ON_CPU(out))
        return gpu_linear(out, x, w, b);
    cpu_linear(out, x, w, b);
    return DP_OK;
}
/* out = act(x @ w^T + b), act DP_RELU, DP_GELU or DP_GELU_TANH; pre (or
 * NULL) gets x @ w^T + b */
static inline dp_status k_linear_act(dp_tensor *out, dp_tensor *pre, dp_tensor *x, dp_tensor *w, dp_tensor *b,
                                     int act)
{
    if (!ON_CPU(out))
        return gpu_linear_act(out, pre, x, w, b, act);
    cpu_linear(pre ? pre : out, x, w, b);
    return cpu_unary(act, out, pre ? pre : out);
}
/* dx = g @ w, dw = g^T @ x, db = column sums of g (any may be NULL); g,
 * x and dx are (M, N), (M, K) and (M, K) rows. When mask is given (dx's
 * shape), dx then goes through the backward of
 * the activation op (DP_RELU: 0 where !(mask > 0), mask its output;
 * DP_GELU_TANH: times its derivative, mask its input), folded in (see
 * ag_offered_mask) */
static inline dp_status k_linear_backward(dp_tensor *dx, dp_tensor *dw, dp_tensor *db, dp_tensor *g, dp_tensor *x,
                                          dp_tensor *w, dp_tensor *mask, int op)
{
    if (!ON_CPU(g))
        return gpu_linear_backward(dx, dw, db, g, x, w, mask, op);
    cpu_linear_backward(dx, dw, db, g, x, w);
    return dx && mask ? cpu_unary_backward(op, dx, dx, mask, mask) : DP_OK;
}
static inline dp_status k_index_select(dp_tensor *out, dp_tensor *a, int dim, dp_tensor *index)
{ return ON_CPU(out) ? cpu_index_select(out, a, dim, index) : gpu_index_select(out, a, dim, index); }
static inline dp_status k_index_add(dp_tensor *out, int dim, dp_tensor *index, dp_tensor *src)
{ return ON_CPU(out) ? cpu_index_add(out, dim, index, src) : gpu_index_add(out, dim, index, src); }
static inline dp_status k_gather(dp_tensor *out, dp_tensor *a, int dim, dp_tensor *index)
{ return ON_CPU(out) ? cpu_gather(out, a, dim, index) : gpu_gather(out, a, dim, index); }
static inline dp_status k_scatter_add(dp_tensor *out, int dim, dp_tensor *index, dp_tensor *src)
{ return ON_CPU(out) ? cpu_scatter_add(out, dim, index, src) : gpu_scatter_add(out, dim, index, src); }
static inline dp_status k_scatter(dp_tensor *out, int dim, dp_tensor *index, dp_tensor *src)
{ return ON_CPU(out) ? cpu_scatter(out, dim, index, src) : gpu_scatter(out, dim, index, src); }
/* select.c: the CPU's argsort with its scratch */
dp_status argsort_on_cpu(dp_tensor *indices, dp_tensor *a, int descending);
static inline dp_status k_argsort(dp_tensor *indices, dp_tensor *a, int descending)
{ return ON_CPU(a) ? argsort_on_cpu(indices, a, descending) : gpu_argsort(indices, a, descending); }
static inline dp_status k_cumsum(dp_tensor *out, dp_tensor *a, int reverse)
{
    if (!ON_CPU(out))
        return gpu_cumsum(out, a, reverse);
    cpu_cumsum(out, a, reverse);
    return DP_OK;
}
static inline dp_status k_multinomial(dp_tensor *out, dp_tensor *cdf, dp_tensor *u)
{
    if (!ON_CPU(out))
        return gpu_multinomial(out, cdf, u);
    cpu_multinomial(out, cdf, u);
    return DP_OK;
}
static inline dp_status k_put(dp_tensor *dst, dp_tensor *index, dp_tensor *src)
{ return ON_CPU(dst) ? cpu_put(dst, index, src) : gpu_put(dst, index, src); }
/* t's references other than the waiting launch's (gpu_linear.c), which uses t
 * before any op that comes after it can: no sharing to protect from */
static inline int k_holders(const dp_tensor *t)
{ return t->refcount - (ON_CPU(t) ? 0 : gpu_deferred_holds(t)); }
/* whether the loss runs as one launch, which can also write the gradient for a loss gradient of 1 */
static inline bool k_cross_entropy_fuses(const dp_tensor *input)
{ return !ON_CPU(input) && gpu_cross_entropy_fuses(input); }
static inline dp_status k_cross_entropy(dp_tensor *out, cpu_ce_args *a)
{ return ON_CPU(a->input) ? cpu_cross_entropy(out, a) : gpu_cross_entropy(out, a); }
static inline dp_status k_cross_entropy_backward(dp_tensor *dinput, dp_tensor *g, const cpu_ce_args *a)
{ return ON_CPU(dinput) ? cpu_cross_entropy_backward(dinput, g, a) : gpu_cross_entropy_backward(dinput, g, a); }
static inline dp_status k_unfold(dp_tensor *cols, dp_tensor *x, const cpu_unfold_args *u)
{ return ON_CPU(cols) ? cpu_unfold(cols, x, u) : gpu_unfold(cols, x, u); }
static inline dp_status k_fold_add(dp_tensor *x, dp_tensor *cols, const cpu_unfold_args *u)
{ return ON_CPU(x) ? cpu_fold_add(x, cols, u) : gpu_fold_add(x, cols, u); }
static inline dp_status k_lstm_gates(dp_tensor *out, dp_tensor *gi, dp_tensor *gh, dp_tensor *c)
{ return ON_CPU(out) ? cpu_lstm_gates(out, gi, gh, c) : gpu_lstm_gates(out, gi, gh, c); }
static inline dp_status k_lstm_gates_backward(dp_tensor *dgates, dp_tensor *dc, dp_tensor *dout, dp_tensor *gi,
                                              dp_tensor *gh, dp_tensor *c, dp_tensor *c1)
{
    return ON_CPU(dc) ? cpu_lstm_gates_backward(dgates, dc, dout, gi, gh, c, c1)
                      : gpu_lstm_gates_backward(dgates, dc, dout, gi, gh, c, c1);
}
static inline dp_status k_gru_gates(dp_tensor *out, dp_tensor *gi, dp_tensor *gh, dp_tensor *h)
{ return ON_CPU(out) ? cpu_gru_gates(out, gi, gh, h) : gpu_gru_gates(out, gi, gh, h); }
static inline dp_status k_gru_gates_backward(dp_tensor *dgi, dp_tensor *dgh, dp_tensor *dh, dp_tensor *dout,
                                             dp_tensor *gi, dp_tensor *gh, dp_tensor *h)
{
    return ON_CPU(dh) ? cpu_gru_gates_backward(dgi, dgh, dh, dout, gi, gh, h)
                      : gpu_gru_gates_backward(dgi, dgh, dh, dout, gi, gh, h);
}
/* optim.c: the CPU's steps for any float dtype, bfloat16 through float32
 * copies that cpu_sgd_step, cpu_adam_step and cpu_rule_step take; with a
 * float32 master copy of bfloat16 parameters (master, else NULL)
 * cpu_adam_step_master */
dp_status sgd_step_on_cpu(dp_tensor *p, dp_tensor *g, dp_tensor *buf, double lr, double momentum,
                          double dampening, int nesterov, double weight_decay, int first_step);
dp_status adam_step_on_cpu(dp_tensor *p, dp_tensor *g, dp_tensor *m, dp_tensor *v, dp_tensor *vmax,
                           dp_tensor *master, double lr, double beta1, double beta2, double eps, double weight_decay,
                           int decoupled, int64_t step);
dp_status rule_step_on_cpu(const optim_rule *r, dp_tensor *p, dp_tensor *g, dp_tensor *const state[3]);
static inline dp_status k_sgd_step(dp_tensor *p, dp_tensor *g, dp_tensor *buf, double lr, double momentum,
                                   double dampening, int nesterov, double weight_decay, int first_step)
{
    return ON_CPU(p) ? sgd_step_on_cpu(p, g, buf, lr, momentum, dampening, nesterov, weight_decay, first_step)
                     : gpu_sgd_step(p, g, buf, lr, momentum, dampening, nesterov, weight_decay, first_step);
}
static inline dp_status k_adam_step(dp_tensor *p, dp_tensor *g, dp_tensor *m, dp_tensor *v, dp_tensor *vmax,
                                    dp_tensor *master, double lr, double beta1, double beta2, double eps,
                                    double weight_decay, int decoupled, int64_t step)
{
    return ON_CPU(p) ? adam_step_on_cpu(p, g, m, v, vmax, master, lr, beta1, beta2, eps, weight_decay, decoupled, step)
                     : gpu_adam_step(p, g, m, v, vmax, master, lr, beta1, beta2, eps, weight_decay, decoupled, step,
                                     NULL);
}
static inline dp_status k_rule_step(const optim_rule *r, dp_tensor *p, dp_tensor *g, dp_tensor *const state[3])
{ return ON_CPU(p) ? rule_step_on_cpu(r, p, g, state) : gpu_rule_step(r, p, g, state); }

#endif
