/*
 * cpu.h — the CPU kernels. They trust their arguments: src/core/ops.c has
 * already checked shapes and devices, broadcast the inputs to the output's
 * shape (stride-0 views) and cast them to the compute dtype. A kernel that
 * finds no loop for a dtype returns DP_ERR_DTYPE through dp_fail.
 */
#ifndef DP_CPU_H
#define DP_CPU_H

#include "core/tensor.h"
#include "common/optim_rule.h"

/* A row function processes n elements of `nops` operands whose byte
 * strides along the row are s[0..nops-1]; p[0] is the output. */
typedef void (*cpu_row_fn)(int64_t n, char **p, const int64_t *s, const void *ctx);

/* Runs fn over every row of ts[0]'s shape; all operands have that shape. */
void cpu_foreach(int nops, dp_tensor *const *ts, cpu_row_fn fn, const void *ctx);

/* elementwise.c: out and inputs all of out's shape */
dp_status cpu_unary(int op, dp_tensor *out, dp_tensor *a);
dp_status cpu_binary(int op, dp_tensor *out, dp_tensor *a, dp_tensor *b);
/* dx = grad of unary op at x (input) and y (its output) times g */
dp_status cpu_unary_backward(int op, dp_tensor *dx, dp_tensor *g, dp_tensor *x, dp_tensor *y);
dp_status cpu_where(dp_tensor *out, dp_tensor *cond, dp_tensor *a, dp_tensor *b);
dp_status cpu_clamp(dp_tensor *out, dp_tensor *a, double lo, double hi);
/* True when some element is zero (CPU_ANY_ZERO) or negative (CPU_ANY_NEGATIVE). */
enum { CPU_ANY_ZERO, CPU_ANY_NEGATIVE };
bool cpu_any(int what, dp_tensor *t);
dp_status cpu_copy(dp_tensor *dst, dp_tensor *src);
dp_status cpu_fill(dp_tensor *dst, double value);

/* reduce.c: a reduced over `dim` (DP_ALL_DIMS: over everything) into out,
 * whose shape is a's with that dim removed (or kept as 1). */
dp_status cpu_reduce(int op, dp_tensor *out, dp_tensor *indices, dp_tensor *a, int dim, int correction);
dp_status cpu_softmax(dp_tensor *out, dp_tensor *a, int dim, int log);
/* dx = the gradient of softmax (log_softmax) at its output y, given g;
 * all three of y's shape and dtype, dx not overlapping g or y */
dp_status cpu_softmax_backward(dp_tensor *dx, dp_tensor *g, dp_tensor *y, int dim, int log);

/* blas.c: out[batch, m, n] = a[batch, m, k] @ b[batch, k, n] (3-D views),
 * all of one dtype: float32 or float64, out contiguous and a and b as
 * cpu_bmm_takes says; or int64, all contiguous. */
bool cpu_bmm_takes(const dp_tensor *t);
/* blas.c: OpenBLAS's build configuration and its number of threads
 * (the CPU kernels' only threads: the products, convolutions included) */
const char *cpu_blas_config(void);
int cpu_blas_threads(void);
void cpu_blas_set_threads(int n);
dp_status cpu_bmm(dp_tensor *out, dp_tensor *a, dp_tensor *b);

/* blas.c: the fused linear layer on contiguous float32/float64 matrices:
 * out (M, N) = x (M, K) @ w (N, K)^T + b (N or NULL), and its backward
 * (dx, dw, db may each be NULL). */
void cpu_linear(dp_tensor *out, dp_tensor *x, dp_tensor *w, dp_tensor *b);
void cpu_linear_backward(dp_tensor *dx, dp_tensor *dw, dp_tensor *db, dp_tensor *g, dp_tensor *x, dp_tensor *w);

/* index.c */
dp_status cpu_index_select(dp_tensor *out, dp_tensor *a, int dim, dp_tensor *index);
dp_status cpu_gather(dp_tensor *out, dp_tensor *a, int dim, dp_tensor *index);
/* out.select(dim, index[i]) += src.select(dim, i) (index_select's backward) */
dp_status cpu_index_add(dp_tensor *out, int dim, dp_tensor *index, dp_tensor *src);
/* out[pos with dim replaced by index[pos]] += src[pos] (gather's backward) */
dp_status cpu_scatter_add(dp_tensor *out, int dim, dp_tensor *index, dp_tensor *src);
dp_status cpu_scatter(dp_tensor *out, int dim, dp_tensor *index, dp_tensor *src);

/* index.c: the non-zero elements of a, in row-major order: their number,
 * and their coordinates into out (count, a's ndim) int64 contiguous */
int64_t cpu_count_nonzero(dp_tensor *a);
void cpu_nonzero(dp_tensor *out, dp_tensor *a);
/* dst's element at row-major position index[j] (negative: from the end;
 * checked against dst's numel) = src[j]; src contiguous, of dst's dtype,
 * with index's numel elements. Nothing is written when an index is bad. */
dp_status cpu_put(dp_tensor *dst, dp_tensor *index, dp_tensor *src);

/* sort.c: rows of contiguous (rows, n) matrices. argsort: indices (rows,
 * n) int64 = the stable order of each row of a (NaN above all numbers);
 * scratch holds 2n entries. cumsum: out (rows, n) of a's dtype (floats
 * add in double, integers in int64), from the end of the row with
 * reverse. multinomial: out (rows, k) int64 = for each u of (rows, k)
 * float64, the category (common/search.h) of u times the row's total in
 * the running sums cdf (rows, n) float64. */
typedef struct {
    union { double f; int64_t i; };   /* the key: i for int64, f for the others */
    int64_t pos;
} cpu_sort_entry;
void cpu_argsort(dp_tensor *indices, dp_tensor *a, int descending, cpu_sort_entry *scratch);
void cpu_cumsum(dp_tensor *out, dp_tensor *a, int reverse);
void cpu_multinomial(dp_tensor *out, dp_tensor *cdf, dp_tensor *u);

/* nn.c: cross-entropy over input (N, C) contiguous, target (N) int64 */
enum { CE_REDUCE_NONE, CE_REDUCE_MEAN, CE_REDUCE_SUM };
typedef struct {
    dp_tensor *input, *target, *weight;   /* weight (C) float64 or NULL */
    int64_t ignore_index;
    double label_smoothing;
    int log_probs;
    dp_tensor *probs;                     /* (N, C) softmax, NULL for log_probs: float32 for float32
                                             logits without label smoothing on the CPU, else float64 */
    int reduction;                        /* CE_REDUCE_* */
    dp_tensor *denom;                     /* 0-d float64: the weight of the counted rows, the mean's denominator */
    dp_tensor *grad_one;                  /* (N, C) of the input's dtype, or NULL: see grad_one_done */
    bool grad_one_done;                   /* set when the forward also wrote the input's gradient for a loss
                                           * gradient of 1 to grad_one (a GPU's one-launch loss does) */
} cpu_ce_args;
/* out: the losses (N) for CE_REDUCE_NONE, else 0-d, of the input's dtype;
 * also fills a->denom and a->probs. */
dp_status cpu_cross_entropy(dp_tensor *out, const cpu_ce_args *a);
/* g: out's gradient, contiguous, of out's shape and dtype */
dp_status cpu_cross_entropy_backward(dp_tensor *dinput, dp_tensor *g, const cpu_ce_args *a);
/* nll_loss's backward through the log_softmax y (N, C) that made its
 * input, in one pass: dx = scale_i w_t (exp(y) - onehot(t)) per row (the
 * log-probabilities' gradient, -scale_i w_t at t, taken through g - exp(y)
 * sum(g)); dx, y of the input's dtype */
dp_status cpu_nll_log_softmax_backward(dp_tensor *dx, dp_tensor *g, dp_tensor *y, const cpu_ce_args *a);

typedef struct {
    int64_t kernel[2], stride[2], padding[2], dilation[2];
    int64_t out_h, out_w;
    double pad_value;
} cpu_unfold_args;
dp_status cpu_unfold(dp_tensor *cols, dp_tensor *x, const cpu_unfold_args *u);
dp_status cpu_fold_add(dp_tensor *x, dp_tensor *cols, const cpu_unfold_args *u);
/* nn.c: max pooling of x (N, C, H, W) over u's windows into out (N, C,
 * Ho, Wo), and each window's argmax (h*W + w in its plane; PyTorch's pick
 * among equals and NaNs) into argmax (N, C, Ho, Wo) int64 unless NULL;
 * all contiguous, float32 or float64. The backward writes dx (x's shape)
 * whole: g (out's shape and dtype) added at the argmaxes. */
dp_status cpu_max_pool2d(dp_tensor *out, dp_tensor *argmax, dp_tensor *x, const cpu_unfold_args *u);
dp_status cpu_max_pool2d_backward(dp_tensor *dx, dp_tensor *g, dp_tensor *argmax);

/* conv.c: out (N, O, Ho, Wo) = conv2d of x (N, C, H, W) with w (O,
 * C/groups, kh, kw) and b (O, or NULL); u's kernel is w's, out_h and
 * out_w are Ho and Wo. All contiguous, one dtype: float32 or float64.
 * The backward writes whichever of dx (x's shape), dw, db is not NULL
 * from g, out's gradient (contiguous). */
typedef struct {
    cpu_unfold_args u;
    int64_t groups;
} cpu_conv_args;
dp_status cpu_conv2d(dp_tensor *out, dp_tensor *x, dp_tensor *w, dp_tensor *b, const cpu_conv_args *a);
dp_status cpu_conv2d_backward(dp_tensor *dx, dp_tensor *dw, dp_tensor *db, dp_tensor *g, dp_tensor *x, dp_tensor *w,
                              const cpu_conv_args *a);

/* rnn.c: one timestep of the recurrent layers' gates (src/core/rnn.c has
 * the shapes), on contiguous float32 or float64 operands of one dtype */
dp_status cpu_lstm_gates(dp_tensor *out, dp_tensor *gi, dp_tensor *gh, dp_tensor *c);
dp_status cpu_lstm_gates_backward(dp_tensor *dgates, dp_tensor *dc, dp_tensor *dout, dp_tensor *gi, dp_tensor *gh,
                                  dp_tensor *c, dp_tensor *c1);
dp_status cpu_gru_gates(dp_tensor *out, dp_tensor *gi, dp_tensor *gh, dp_tensor *h);
dp_status cpu_gru_gates_backward(dp_tensor *dgi, dp_tensor *dgh, dp_tensor *dh, dp_tensor *dout, dp_tensor *gi,
                                 dp_tensor *gh, dp_tensor *h);

/* attention.c: scaled dot product attention over heads (b, h). q (B, H, L, E),
 * k (B, H, S, E), v (B, H, S, Ev), out (B, H, L, Ev), its gradient dout and
 * dq, dk, dv: views of one dtype with contiguous rows; lse (B, H, L)
 * contiguous: each query row's log-sum-exp of its scaled scores. causal:
 * query i takes keys j <= i. scratch: float64, of the sizes below (the
 * float32 path uses it as floats). */
typedef struct {
    const dp_tensor *q, *k, *v;
    int causal;
    double scale;
} cpu_attention_args;
#define CPU_ATTENTION_BLOCK 64   /* query rows a block of the float32 path */
#define CPU_ATTENTION_FORWARD_SCRATCH(L, S, E, Ev) \
    ((L) * (E) + (S) * (E) + (S) * (Ev) + (L) * (Ev) + (S) + CPU_ATTENTION_BLOCK * (S))
#define CPU_ATTENTION_BACKWARD_SCRATCH(L, S, E, Ev) \
    (2 * ((L) * (E) + (S) * (E) + (S) * (Ev) + (L) * (Ev)) + CPU_ATTENTION_BLOCK * (S))
void cpu_attention_forward(const cpu_attention_args *a, dp_tensor *out, dp_tensor *lse, double *scratch);
void cpu_attention_backward(const cpu_attention_args *a, dp_tensor *out, dp_tensor *dout, dp_tensor *lse,
                            dp_tensor *dq, dp_tensor *dk, dp_tensor *dv, double *scratch);

/* norm.c: LayerNorm over `rows` rows of n elements. x (rows, n)
 * contiguous, float32, float64 or bfloat16; residual NULL, or as x: the
 * rows normalized are then x + residual rounded to x's dtype, written to
 * sum. weight and bias: n contiguous elements of out's dtype, or NULL.
 * mean and rstd: one per row, float32 (float64 for a float64 x). dy: out's
 * gradient, (rows, n) contiguous of out's dtype; dx as x, dw and db as
 * weight, each NULL when not wanted; with dx_adds, dx's gradient is added
 * to what dx holds (the gradient of x's other uses). scratch: float64, of
 * the sizes below. */
typedef struct {
    const dp_tensor *x, *residual, *weight, *bias;
    int64_t rows, n;
    double eps;
    bool dx_adds;
} cpu_norm_args;
#define CPU_NORM_FORWARD_SCRATCH(n) (4 * (n))
#define CPU_NORM_BACKWARD_SCRATCH(n) (5 * (n))
void cpu_layer_norm(const cpu_norm_args *a, dp_tensor *out, dp_tensor *sum, dp_tensor *mean, dp_tensor *rstd,
                    double *scratch);
void cpu_layer_norm_backward(const cpu_norm_args *a, dp_tensor *dy, dp_tensor *mean, dp_tensor *rstd,
                             dp_tensor *dx, dp_tensor *dw, dp_tensor *db, double *scratch);

/* norm.c: BatchNorm of x (N, C, S) contiguous, float32, float64 or
 * bfloat16, over N and S (S: the product of the dims after the channels).
 * weight, bias, running_mean, running_var: C contiguous elements of the
 * parameters' dtype (x's, or float32 for a bfloat16 x), or NULL. training:
 * normalize by the batch's statistics, and move the running ones (when
 * given) by momentum; else by the running ones. mean and invstd: per
 * channel, float32 (float64 for a float64 x), what the forward normalized
 * by. dy and dx as x, dw and db as weight, each NULL when not wanted.
 * scratch: float64, CPU_BN_SCRATCH(C) of them. */
typedef struct {
    const dp_tensor *x, *weight, *bias;
    dp_tensor *running_mean, *running_var;
    int64_t N, C, S;
    int training;
    double momentum, eps;
} cpu_bn_args;
#define CPU_BN_CHUNK 1024
#define CPU_BN_SCRATCH(C) (2 * CPU_BN_CHUNK + 6 * (C))
void cpu_batch_norm(const cpu_bn_args *a, dp_tensor *out, dp_tensor *mean, dp_tensor *invstd, double *scratch);
void cpu_batch_norm_backward(const cpu_bn_args *a, dp_tensor *dy, dp_tensor *mean, dp_tensor *invstd,
                             dp_tensor *dx, dp_tensor *dw, dp_tensor *db, double *scratch);

/* optim.c: fused updates over contiguous flat buffers of one dtype, float32 or float64 */
dp_status cpu_sgd_step(dp_tensor *p, dp_tensor *g, dp_tensor *buf, double lr, double momentum,
                       double dampening, int nesterov, double weight_decay, int first_step);
dp_status cpu_adam_step(dp_tensor *p, dp_tensor *g, dp_tensor *m, dp_tensor *v, dp_tensor *vmax, double lr,
                        double beta1, double beta2, double eps, double weight_decay, int decoupled, int64_t step);
/* Adam on the float32 master copy w of bfloat16 parameters p (float32
 * moments; a bfloat16 or float32 gradient): w is updated, p = w rounded */
dp_status cpu_adam_step_master(dp_tensor *p, dp_tensor *w, dp_tensor *g, dp_tensor *m, dp_tensor *v,
                               dp_tensor *vmax, double lr, double beta1, double beta2, double eps,
                               double weight_decay, int decoupled, int64_t step);
/* Adadelta's, RMSprop's or Adagrad's step r over p, g and the state of
 * common/optim_rule.h (NULL where r needs none) */
dp_status cpu_rule_step(const optim_rule *r, dp_tensor *p, dp_tensor *g, dp_tensor *const state[3]);

#endif
