/*
 * dpc_ops.h — the plain C face of the tensor kernels in the cuda/ folder.
 *
 * src/core dispatches here for tensors whose device is a GPU. Every
 * function returns 0 or a cudaError_t value (dpc_error_string() gives the
 * words), or DPC_UNSUPPORTED when no kernel exists for the dtype/op asked
 * for. Launches are asynchronous on `stream` (a cudaStream_t; NULL is the
 * legacy default stream); each launcher checks cudaGetLastError() right
 * after the launch.
 *
 * Element types are dplua's dtype codes (src/common/dplua_codes.h: 0 float32,
 * 1 float64, 2 int64, 3 int32, 4 uint8, 5 bool, 6 bfloat16); op codes are
 * its dp_unop / dp_binop / dp_redop values. Strides and shapes are in
 * elements.
 *
 * An elementwise kernel walks an iteration shape (dpc_shape) and reads or
 * writes each operand through its own strides over that shape (a broadcast
 * operand has stride 0 where it is broadcast), starting at `data`, which
 * already points at the operand's first element.
 */
#ifndef DPC_OPS_H
#define DPC_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "common/optim_rule.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DPC_MAX_DIMS 8
#define DPC_UNSUPPORTED (-1)

typedef struct {
    int ndim;
    int64_t shape[DPC_MAX_DIMS];
} dpc_shape;

typedef struct {
    void *data;
    int64_t stride[DPC_MAX_DIMS];
} dpc_operand;

/* ---- memory (cuda/memory.cu) ---- */

/* Stream-ordered allocation from the device's memory pool, whose release
 * threshold is set high on first use so that freed memory stays cached;
 * small blocks are also cached per stream in front of it (memory.cu).
 * dpc_free takes the size asked for (0 when unknown: the block goes
 * straight back to the pool). */
int dpc_malloc(void **ptr, size_t bytes, int device, void *stream);
/* The workspace cuBLASLt is given (what NVIDIA recommends for Hopper),
 * one of the cached sizes. */
#define DPC_GEMM_WORKSPACE_BYTES ((size_t)32 << 20)
int dpc_free(void *ptr, size_t bytes, int device, void *stream);
/* kind: 0 host to device, 1 device to host, 2 device to device. A copy to
 * the host returns when the data is there. */
int dpc_memcpy(void *dst, const void *src, size_t bytes, int kind, void *stream);
/* Page-locked ("pinned") host memory, which the copy engines read without
 * a staging copy; and a copy from it to the device that is only queued on
 * stream (the caller keeps the host memory alive and unchanged until the
 * stream passes it: an event recorded after the copy tells when). */
int dpc_host_alloc(void **ptr, size_t bytes);
int dpc_host_free(void *ptr);
int dpc_memcpy_queued(void *dst, const void *src, size_t bytes, void *stream);
int dpc_set_device(int device);
int dpc_get_device(int *device);
int dpc_synchronize(int device);
int dpc_mem_info(int device, size_t *free_bytes, size_t *total_bytes);
/* The pool's cached memory back to the driver (after a device sync); what
 * the pool holds now and at most. */
int dpc_pool_trim(int device);
int dpc_pool_reserved(int device, size_t *reserved, size_t *peak);

/* ---- streams, events, graphs (cuda/memory.cu) ---- */

/* Streams are non-blocking (no implicit order with the legacy stream).
 * *done is 1 when everything queued before has finished. */
int dpc_stream_create(void **stream, int device);
int dpc_stream_destroy(void *stream);
int dpc_stream_synchronize(void *stream);
int dpc_stream_query(void *stream, int *done);
int dpc_stream_wait_event(void *stream, void *event);
int dpc_event_create(void **event, int device, int timing);
int dpc_event_destroy(void *event);
int dpc_event_record(void *event, void *stream);
int dpc_event_synchronize(void *event);
int dpc_event_query(void *event, int *done);
int dpc_event_elapsed(float *ms, void *start, void *end);
/* Stream capture into a CUDA graph: begin, then end (instantiating it into
 * *exec when keep), launch it any number of times, destroy it. */
int dpc_capture_begin(void *stream);
int dpc_capture_end(void *stream, int keep, void **exec);
int dpc_graph_launch(void *exec, void *stream);
int dpc_graph_destroy(void *exec);
/* ---- the kernel profile (cuda/profile.cu) ----
 * Between start and stop every kernel of ours and every cuBLASLt product
 * is timed with events on its stream; stop waits for them and sums the
 * times by kernel (rows by total ms, descending, valid until the next
 * stop; span_ms: from the first launch's start to the last's end). */
typedef struct {
    const char *name;
    int64_t calls;
    double ms;
} dpc_profile_row;
int dpc_profile_start(void);
int dpc_profile_stop(void);
int dpc_profile_rows(const dpc_profile_row **rows, int *n, int64_t *dropped, double *span_ms);
/* The launch points' side: dpc_profiling is nonzero while a profile is
 * on; before gives a token (0: not recorded) that after takes. */
extern int dpc_profiling;
int64_t dpc_profile_before(void *stream, const void *func, const char *label);
void dpc_profile_after(void *stream, int64_t token);

/* cudaMalloc / cudaFree: memory outside the stream-ordered pool. */
int dpc_malloc_plain(void **ptr, size_t bytes, int device);
int dpc_free_plain(void *ptr, int device);

/* ---- errors found by kernels ----
 *
 * A kernel that finds a bad argument in device memory (a class index out
 * of range, say) cannot stop the host, and the host must not wait for
 * every kernel to find out. Such kernels get the device address of this
 * block (mapped host memory, one per process), leave the first error
 * there (code non-zero: which check, from the DPC_KERR_ list) and write
 * nothing else of consequence; the host reads it at its next
 * synchronisation and raises the error then. */
typedef struct {
    volatile int code;
    int pad;
    volatile long long value, limit;   /* the bad value, and the bound it broke */
} dpc_kernel_error;
enum { DPC_KERR_NONE, DPC_KERR_CE_TARGET, DPC_KERR_INDEX_SELECT, DPC_KERR_GATHER, DPC_KERR_SCATTER_ADD, DPC_KERR_PUT,
       DPC_KERR_SCATTER };
int dpc_kernel_error_block(dpc_kernel_error **block);
/* 1 for the errors after which the CUDA context is unusable (an illegal
 * address, a kernel that crashed): every later call fails with them. */
int dpc_error_is_sticky(int status);

/* ---- elementwise (cuda/elementwise.cu) ---- */

/* out = op(a); a is of dtype `in`, out of dtype `out_dtype` (the result
 * dtype of dp_unary: the same, or bool for logical_not). */
int dpc_unary(int op, int in_dtype, int out_dtype, dpc_shape s, dpc_operand out, dpc_operand a, void *stream);
/* out = a op b; a and b are of dtype `dtype`, out of `out_dtype` (bool for
 * comparisons and logical ops). Integer ops wrap; x % 0 gives 0. */
int dpc_binary(int op, int dtype, int out_dtype, dpc_shape s, dpc_operand out, dpc_operand a, dpc_operand b,
               void *stream);
/* dx = d op(x)/dx * g, with y = op(x) (float dtypes; the formulas of
 * src/cpu/elementwise.c's unary backward); ops with a zero derivative fill 0. */
int dpc_unary_backward(int op, int dtype, dpc_shape s, dpc_operand dx, dpc_operand g, dpc_operand x,
                       dpc_operand y, void *stream);
/* out = cond ? a : b; cond is bool (uint8), a, b and out of `dtype`. */
int dpc_where(int dtype, dpc_shape s, dpc_operand out, dpc_operand cond, dpc_operand a, dpc_operand b,
              void *stream);
/* out = min(max(a, lo), hi); NaN stays NaN. */
int dpc_clamp(int dtype, dpc_shape s, dpc_operand out, dpc_operand a, double lo, double hi, void *stream);
/* out = a converted from in_dtype to out_dtype (also a strided copy when
 * they are equal); float to integer truncates, bf16 rounds to nearest even. */
int dpc_cast(int out_dtype, int in_dtype, dpc_shape s, dpc_operand out, dpc_operand a, void *stream);
int dpc_fill(int dtype, dpc_shape s, dpc_operand out, double value, void *stream);

/* ---- sorting and selecting (cuda/sort.cu) ----
 *
 * Rows of contiguous (rows, n) matrices, as src/cpu/sort.c's kernels take
 * them, with the same results. argsort: indices (rows, n) = each row of a
 * (dtype) in stable sorted order, NaN above every number; scratch holds
 * rows * dpc_argsort_width(n) int64. cumsum: out (rows, n) = running sums
 * of a (a float dtype or int64) along each row, from its end with
 * reverse. multinomial: out (rows, k) = for each u (rows, k), the first
 * category whose running sum in cdf (rows, n) passes u times the row's
 * total (common/search.h). */
int64_t dpc_argsort_width(int64_t n);
int dpc_argsort(int dtype, int64_t rows, int64_t n, const void *a, int descending, int64_t *indices,
                int64_t *scratch, void *stream);
int dpc_cumsum(int dtype, int64_t rows, int64_t n, const void *a, void *out, int reverse, void *stream);
int dpc_multinomial(int64_t rows, int64_t n, int64_t k, const double *cdf, const double *u, int64_t *out,
                    void *stream);

/* ---- reductions (cuda/reduce.cu) ---- */

/* For every position of the output iteration shape s (the input's shape
 * with the reduced dim removed): reduce the `len` elements of a that start
 * there, `a_stride` apart, with dp_redop `op` (correction for var/std).
 * out is of out_dtype (dp_reduce's result dtype); idx, when its data is not
 * NULL, receives the int64 index (max/min with indices, argmax/argmin write
 * their result to out). Accumulates in double (int64 for integer sums). */
int dpc_reduce(int op, int in_dtype, int out_dtype, dpc_shape s, dpc_operand out, dpc_operand idx,
               dpc_operand a, int64_t len, int64_t a_stride, int correction, void *stream);
/* softmax / log_softmax along a dim of `len` elements, strides along it
 * out_stride and a_stride, at every position of s (the dim removed). */
int dpc_softmax(int dtype, dpc_shape s, dpc_operand out, int64_t out_stride, dpc_operand a, int64_t a_stride,
                int64_t len, int log, void *stream);
/* Cross-entropy over contiguous input (N, C) of dtype, int64 target (N),
 * optional float64 weight (C), with no host round trip: the per-sample
 * losses into rows (N doubles, device scratch), then reduced into out
 * (dtype; N values for DPC_CE_NONE, else one) and the weight of the
 * counted rows into *denom (device double). With probs not NULL, the
 * softmax goes there too (N x C doubles). log_probs: the input holds
 * log-probabilities (nll_loss). A target out of [0, C) other than
 * ignore_index is left in err (its row counts 0). With grad_one not NULL
 * and a reduction, the input's gradient for a loss gradient of 1 (N x C
 * of dtype) is written there too when the loss fits one launch, which
 * *grad_one_done then says. */
enum { DPC_CE_NONE, DPC_CE_MEAN, DPC_CE_SUM };
int dpc_cross_entropy_fuses(int64_t N, int64_t C);
/* The Linears whose last output is the loss's input, run in the loss's
 * launch first: one, or a hidden layer and the last one reading its out.
 * Each is out (N, width) = act(x (N, K) @ w (width, K)^T + b (width, or
 * NULL)), all contiguous of the loss's dtype; the last one's width is C,
 * a hidden one's the next one's K. */
typedef struct {
    const void *x, *w, *b;
    void *out, *pre;         /* pre: NULL, or the value before the activation */
    int64_t K;
    int epilogue;            /* DPC_EPI_BIAS (none: the last layer's), _RELU, _GELU or _GELU_TANH */
} dpc_ce_layer;
typedef struct {
    dpc_ce_layer layer[2];
    int layers;              /* 0 (none), 1 or 2 */
} dpc_ce_linear;
/* Whether dpc_cross_entropy takes such Linears of dtype: a loss of one
 * launch, and products small enough for one block, or one last layer
 * (a classifier's head) that a cluster of blocks takes by rows. */
int dpc_cross_entropy_takes_linear(int dtype, int64_t N, int64_t C, const dpc_ce_linear *linear);
int dpc_cross_entropy(int dtype, int64_t N, int64_t C, const void *input, const int64_t *target,
                      const double *weight, int64_t ignore_index, double smoothing, int log_probs, int reduction,
                      double *rows, double *probs, void *out, double *denom, void *grad_one, int *grad_one_done,
                      const dpc_ce_linear *linear, dpc_kernel_error *err, void *stream);
/* dinput (N, C) of dtype from probs (or nothing for log_probs) and g, the
 * loss's gradient (dtype; N values for DPC_CE_NONE, else one, divided by
 * *denom for a mean): the formulas of src/cpu/nn.c. */
int dpc_cross_entropy_backward(int dtype, int64_t N, int64_t C, void *dinput, const double *probs,
                               const int64_t *target, const double *weight, int64_t ignore_index,
                               double smoothing, int log_probs, int reduction, const void *g,
                               const double *denom, void *stream);

/* Cross-entropy over a classifier's bfloat16 logits (N, C) contiguous,
 * without class weights or log-probabilities (cuda/classifier.cu): read
 * as they are in float32 math, one pass a row; the row's log-sum-exp to
 * lse (N floats) and its loss to rows (N floats, device scratch), then
 * reduced into out (out_dtype; N values for DPC_CE_NONE, else one) and the
 * count of the counted rows into *denom. A target out of [0, C) other
 * than ignore_index is left in err (its row counts 0). */
int dpc_classifier_loss(int64_t N, int64_t C, const void *logits, const int64_t *target, int64_t ignore_index,
                        double smoothing, int reduction, float *lse, float *rows, int out_dtype, void *out,
                        double *denom, dpc_kernel_error *err, void *stream);
/* dlogits (N, C) bfloat16 = (softmax - onehot) * the row's share of g
 * (g_dtype; N values for DPC_CE_NONE, else one, divided by *denom for a
 * mean), with label smoothing's share; 0 for rows that do not count. */
int dpc_classifier_backward(int64_t N, int64_t C, void *dlogits, const void *logits, const int64_t *target,
                            int64_t ignore_index, double smoothing, const float *lse, int reduction, int g_dtype,
                            const void *g, const double *denom, void *stream);

/* ---- matrix products (cuda/gemm.cu, cuBLASLt) ---- */

/* What dpc_gemm does beside the product, in cuBLASLt's epilogue where it
 * has one (else in a kernel after the product). */
enum {
    DPC_EPI_BIAS = 0,        /* adds bias (n values) to every row, when bias is not NULL */
    DPC_EPI_RELU = 1,        /* that, then max(0, .) */
    DPC_EPI_BGRAD = 2,       /* writes the row sums of op(A) (over k) to bias (m values); batch 1 */
    DPC_EPI_GELU = 3,        /* the bias, then GELU (x Phi(x), erf) */
    DPC_EPI_GELU_TANH = 4,   /* the bias, then GELU's tanh form */
    DPC_EPI_DGELU_TANH = 5,  /* times GELU_TANH's derivative at aux (read, laid out as C; no bias): a GELU's
                                backward folded into the product that makes its input gradient */
};

/* Row-major, batched: C[b] = alpha * op(A[b]) @ op(B[b]) + beta * C[b] for
 * b < batch, op = transpose when trans_* is set; A is m x k after op, B is
 * k x n after op, C is m x n with leading dimension ldc; stride_* between
 * batch entries (0 broadcasts). dtype float32 (tf32 when allow_tf32),
 * float64 or bfloat16 (float accumulation). epilogue: DPC_EPI_*, with
 * bias of dtype. aux (batch 1, laid out as C; NULL for none) receives the
 * value before an activation (RELU, GELU, GELU_TANH), as stored in dtype:
 * what a Linear alone would have written, which GELU's backward needs;
 * with DGELU_TANH it is that value, read.
 * Products of at most 16M multiply-adds (k at most 2048) run in kernels of
 * our own, in one launch with their epilogue; there a product of k at
 * most DPC_GEMM_UNSPLIT_K and at most DPC_GEMM_UNSPLIT_MACS multiply-adds
 * sums every element's k in one order (even and odd k apart, never split
 * over blocks), the order in which the one-launch loss's block computes
 * the Linears it takes (dpc_cross_entropy_takes_linear); a larger head it
 * takes over a cluster is summed in the shares of k that
 * dpc_gemm_k_share gives. */
#define DPC_GEMM_UNSPLIT_K 128
#define DPC_GEMM_UNSPLIT_MACS 65536
int dpc_gemm(int dtype, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, double alpha,
             const void *A, int64_t lda, int64_t stride_a, const void *B, int64_t ldb, int64_t stride_b,
             double beta, void *C, int64_t ldc, int64_t stride_c, int64_t batch, int epilogue, void *bias,
             void *aux, int allow_tf32, void *stream);

/* The share of k each block of our kernel sums of a Linear's forward
 * launched alone (out (m, n) = x (m, k) @ w (n, k)^T, batch 1): k when it
 * is not split over blocks, 0 when neither our one-block nor our tiled
 * kernel runs it (cuBLASLt does). The one-launch loss
 * sums a Linear it takes in the same shares (dpc_cross_entropy). */
int64_t dpc_gemm_k_share(int dtype, int64_t m, int64_t n, int64_t k);

/* Whether dpc_gemm runs a product of this shape in our one-block or tiled
 * kernel (one launch, whatever the epilogue and layout) rather than
 * cuBLASLt's. */
int dpc_gemm_own(int64_t m, int64_t n, int64_t k, int64_t batch);


/* One Linear layer's gradients: dx (M, K) = g (M, N) @ w (N, K), set to 0
 * where !(mask > 0) when mask (M, K) is given (a ReLU's backward folded
 * in); dw (N, K) = g^T @ x (M, K); db (N) = the column sums of g. Any of
 * dx, dw, db may be NULL; all contiguous, of one dtype. */
typedef struct {
    int64_t M, N, K;
    const void *g, *x, *w, *mask;
    void *dx, *dw, *db;
} dpc_linear_grads;

/* An SGD step over flat buffers of n elements of one dtype: param -=
 * lr * the update from grad (PyTorch's formulas, src/cpu/optim.c);
 * momentum_buf NULL when momentum is 0. grad is written only where the
 * step makes a bias gradient first (dpc_sgd_step's first). */
typedef struct {
    int64_t n;
    void *param;
    void *grad;
    void *momentum_buf;
    double lr, momentum, dampening, weight_decay;
    int nesterov, first_step;
} dpc_sgd_args;

/* A Linear layer's backward in one launch of our own; or two layers' (a
 * chain: layers 2, layer[1] the layer before layer[0], its g layer[0]'s
 * dx) in one launch of one block, which computes layer[0]'s first. With
 * sgd (else NULL; dpc_linear_backward_takes_sgd said yes) that block then
 * takes the SGD step too. DPC_UNSUPPORTED when a product is too large for
 * our kernel (see dpc_gemm), db comes without dw, or a chain does not fit
 * one block (dpc_linear_backward_chains): the caller then runs them
 * otherwise. */
int dpc_linear_backward(int dtype, const dpc_linear_grads *layer, int layers, const dpc_sgd_args *sgd, void *stream);

/* Whether dpc_linear_backward runs these layers (one, or a chain of two)
 * and then the SGD step sgd (on tensors of dtype) in one launch of one
 * block: the step is small, and its parameters and momentum are none of
 * the layers' outputs. */
int dpc_linear_backward_takes_sgd(int dtype, const dpc_linear_grads *layer, int layers, const dpc_sgd_args *sgd);

/* Whether dpc_linear_backward runs these two layers (layer[0], layer[1])
 * as a chain. */
int dpc_linear_backward_chains(const dpc_linear_grads *layer);

/* Whether this layer's backward may be the first of a chain: it computes
 * dx and leaves room in the block for a layer before it. */
int dpc_linear_backward_may_chain(const dpc_linear_grads *first);

/* ---- optimizers (cuda/optim.cu): PyTorch 1.13's formulas, as src/cpu/optim.c ---- */

/* A Linear's bias gradient summed apart from its weight gradient: db (n)
 * = the column sums of g (m, n), both contiguous, of the step's dtype.
 * The first layer's, whose weight gradient cuBLASLt computes (then in one
 * kernel instead of two), waits for the optimizer's step, whose launch
 * makes it first when db lies in the step's flat gradient buffer. */
typedef struct {
    int64_t m, n;
    const void *g;
    void *db;
} dpc_bias_grad;

/* Whether dpc_bias_grad_sum takes a g of this shape (small enough that
 * summing it again costs less than cuBLASLt's second kernel). */
int dpc_bias_grad_fits(int64_t m, int64_t n);
/* The bias gradient b alone, summed as an optimizer's launch sums it. */
int dpc_bias_grad_sum(int dtype, const dpc_bias_grad *b, void *stream);

/* first: NULL, or a bias gradient whose db lies in a->grad, which the
 * step's launch makes before it updates those elements. */
int dpc_sgd_step(int dtype, const dpc_sgd_args *a, const dpc_bias_grad *first, void *stream);
/* Adam's flat buffers (n elements each). master NULL: all of the
 * parameters' dtype (grad_dtype too). Else param is bfloat16, master its
 * float32 copy, the moments float32 and the gradient bfloat16 or float32
 * (grad_dtype): the update runs on master and param gets it rounded. */
typedef struct {
    void *param, *grad, *exp_avg, *exp_avg_sq, *max_exp_avg_sq, *master;
    int grad_dtype;
} dpc_adam_buffers;

/* step_dev NULL: `step` is this step's count. Else (capturable Adam) the
 * count lives in *step_dev on the device: it is incremented first (a
 * kernel) and read by the update, and `step` is ignored. first: as for
 * dpc_sgd_step, db in grad. */
int dpc_adam_step(int dtype, int64_t n, const dpc_adam_buffers *b, double lr, double beta1, double beta2, double eps,
                  double weight_decay, int decoupled, int64_t step, double *step_dev, const dpc_bias_grad *first,
                  void *stream);
/* Adadelta's, RMSprop's or Adagrad's step r (common/optim_rule.h) over
 * flat buffers of n elements of dtype: param, grad and the state that
 * optim_rule.h lists (NULL where r needs none). first: as for
 * dpc_sgd_step, db in grad. */
int dpc_rule_step(int dtype, int64_t n, const optim_rule *r, void *param, void *grad, void *const state[3],
                  const dpc_bias_grad *first, void *stream);

/* ---- random draws (cuda/random.cu) ---- */

/* out (n contiguous elements of dtype) = value `kind` (src/common/philox.h:
 * uniform, normal, or low + draw mod range) of Philox blocks counter + i
 * under key. */
int dpc_random(int dtype, int kind, int64_t n, uint64_t counter, uint64_t key, int64_t low, uint64_t range,
               void *out, void *stream);
/* Dropout: out = in * 1 / (1 - p) where block counter + i under key keeps
 * element i (philox_keeps: the uniform of the dtype's draw >= p), else
 * in * 0; n contiguous elements of float32, float64 or bfloat16. The
 * backward is the same call on the gradient. */
int dpc_dropout(int dtype, int64_t n, uint64_t counter, uint64_t key, double p, const void *in, void *out,
                void *stream);

/* ---- indexing (cuda/index.cu) ---- */

/* out.select(dim, i) = a.select(dim, index[i]) for contiguous a (outer x
 * size x inner) and out (outer x n x inner); index int64 (n), each checked:
 * one out of [0, size) is left in err (its positions of out are not written). */
int dpc_index_select(int dtype, int64_t outer, int64_t size, int64_t inner, const void *a, const int64_t *index,
                     int64_t n, void *out, dpc_kernel_error *err, void *stream);
/* out (outer x size x inner) .select(dim, index[i]) += src (outer x n x
 * inner) .select(dim, i), in a fixed order (the indices sorted, a
 * repeated one's rows added in their order, in float32 for bfloat16, and
 * to out once): the same bits on every run. workspace: device memory of
 * dpc_index_add_workspace(n, size) bytes (0: n is 0 or too large, over
 * 2^31 - 1). An index out of [0, size) adds nothing. */
size_t dpc_index_add_workspace(int64_t n, int64_t size);
int dpc_index_add(int dtype, int64_t outer, int64_t size, int64_t inner, void *out, const int64_t *index,
                  int64_t n, const void *src, void *workspace, size_t workspace_bytes, void *stream);
/* Over the positions p of s (the index's shape; index int64, strided):
 * gather: out[p] = a[p with dim replaced by index[p]] (any dtype);
 * scatter_add: out[p with dim replaced by index[p]] += src[p], atomically
 * (float32, float64, bfloat16); scatter: = src[p] (any dtype; of positions
 * that share a target, one write wins). An index out of [0, size) is left
 * in err. */
int dpc_gather(int dtype, dpc_shape s, dpc_operand out, dpc_operand a, dpc_operand index, int dim, int64_t size,
               dpc_kernel_error *err, void *stream);
int dpc_scatter_add(int dtype, dpc_shape s, dpc_operand out, dpc_operand index, dpc_operand src, int dim,
                    int64_t size, dpc_kernel_error *err, void *stream);
int dpc_scatter(int dtype, dpc_shape s, dpc_operand out, dpc_operand index, dpc_operand src, int dim, int64_t size,
                dpc_kernel_error *err, void *stream);
/* put_: dst's element at row-major position index[j] (of dst's shape s;
 * negative from the end) = src[j], j < n, src contiguous of dst's dtype;
 * an index out of [-numel, numel) is left in err and skipped. */
int dpc_put(int dtype, dpc_shape s, dpc_operand dst, const int64_t *index, int64_t n, const void *src,
            dpc_kernel_error *err, void *stream);
/* im2col over contiguous x (N, C, H, W) into cols (N, C*kh*kw, oh*ow), and
 * the fold back (cols added into x) for the backward. */
int dpc_unfold(int dtype, int64_t N, int64_t C, int64_t H, int64_t W, const int64_t *kernel,
               const int64_t *stride, const int64_t *padding, const int64_t *dilation, int64_t oh, int64_t ow,
               const void *x, void *cols, double pad_value, void *stream);
int dpc_fold_add(int dtype, int64_t N, int64_t C, int64_t H, int64_t W, const int64_t *kernel,
                 const int64_t *stride, const int64_t *padding, const int64_t *dilation, int64_t oh, int64_t ow,
                 void *x, const void *cols, void *stream);

/* ---- recurrent gates (cuda/rnn.cu): one timestep over N rows of H units,
 * contiguous float32 or float64 operands (src/core/rnn.c has the formulas) ---- */

/* gi + gh (N, 4H) the gates i, f, g, o, c (N, H) -> out (2, N, H): h' then c' */
int dpc_lstm_gates(int dtype, int64_t N, int64_t H, const void *gi, const void *gh, const void *c, void *out,
                   void *stream);
/* dout (2, N, H), c1 = out[1] -> dgates (N, 4H, the gradient of gi and of gh), dc (N, H) */
int dpc_lstm_gates_backward(int dtype, int64_t N, int64_t H, const void *dout, const void *gi, const void *gh,
                            const void *c, const void *c1, void *dgates, void *dc, void *stream);
/* gi, gh (N, 3H) of r, z, n, h (N, H) -> out (N, H) */
int dpc_gru_gates(int dtype, int64_t N, int64_t H, const void *gi, const void *gh, const void *h, void *out,
                  void *stream);
/* dout (N, H) -> dgi, dgh (N, 3H), dh (N, H) */
int dpc_gru_gates_backward(int dtype, int64_t N, int64_t H, const void *dout, const void *gi, const void *gh,
                           const void *h, void *dgi, void *dgh, void *dh, void *stream);

/* ---- attention (cuda/attention.cu) ---- */

/* Scaled dot-product attention of q (B, H, L, E), k (B, H, S, E) and
 * v (B, H, S, Ev), each given by its first element and its strides (in
 * elements) for b, h and the sequence; the last dim is contiguous. The
 * outputs out (B, H, L, Ev), dq, dk, dv (q's, k's, v's shapes) and the
 * gradient dout (out's shape) are given by their strides too, so that
 * heads stored (B, L, H, E), as a transformer's projections make them,
 * are read and written in place. out, dq, dk and dv are dense: their
 * elements fill one block, in some order of the dims. */
typedef struct {
    int64_t B, H, L, S, E, Ev;         /* batch, heads, query length, key length, head dims of q/k and of v */
    const void *q, *k, *v;             /* first elements */
    int64_t q_stride[3], k_stride[3], v_stride[3];   /* in elements, for b, h and the sequence; the last dim is contiguous */
    int64_t o_stride[3], do_stride[3], dq_stride[3], dk_stride[3], dv_stride[3];   /* the same for out, dout, dq, dk, dv */
    double scale;                      /* scores are scale * q.k */
    int causal;                        /* key j takes part in query i's row only when j <= i (PyTorch's is_causal: tril(ones(L, S)), top-left aligned) */
} dpc_attention;
/* Whether the fused kernels take this dtype and these head dims (else the
 * caller uses a composite of matmul and softmax): bfloat16 with
 * E == Ev == 64 or 128, float32 with E and Ev up to 128. */
int dpc_attention_takes(int dtype, int64_t E, int64_t Ev);
/* out (B, H, L, Ev) of dtype; lse (B, H, L) float32 contiguous: the
 * natural log-sum-exp of each query row's scaled, masked scores (the only
 * thing saved for backward). S == 0 gives out 0 and lse -inf. out and its
 * strides must be 4-byte aligned (a fresh allocation is). */
int dpc_attention_forward(int dtype, const dpc_attention *a, void *out, float *lse, void *stream);
/* Bytes of device scratch memory that dpc_attention_backward needs: the
 * float32 dq accumulators (B, H, L, E) and delta = rowsum(dout * out)
 * (B, H, L). */
size_t dpc_attention_workspace(int dtype, const dpc_attention *a);
/* dout (B, H, L, Ev) of dtype; writes dq (B,H,L,E), dk (B,H,S,E), dv
 * (B,H,S,Ev) of dtype. dk, dv and their strides 4-byte aligned, workspace
 * 8-byte aligned (fresh allocations are). */
int dpc_attention_backward(int dtype, const dpc_attention *a, const void *out, const void *dout, const float *lse,
                           void *dq, void *dk, void *dv, void *workspace, void *stream);

/* ---- LayerNorm (cuda/norm.cu) ---- */

/* LayerNorm over `rows` rows of n elements: x (rows, n) contiguous;
 * residual NULL, or of x's shape and of x's dtype or residual_dtype
 * bfloat16 beside a float32 x: the rows normalized are then x + residual
 * rounded to x's dtype, also written to sum. weight and bias: n elements,
 * or NULL, of float32 unless input and output are both bfloat16 (then
 * bfloat16) or float64. The dtype pairs (input, output) taken: float32 and
 * float32, float64 and float64, bfloat16 and bfloat16, bfloat16 and
 * float32, float32 and bfloat16. */
typedef struct {
    int64_t rows, n;
    const void *x, *residual, *weight, *bias;
    int residual_dtype;
    double eps;
    int dx_adds;   /* backward: dx += x's gradient (dx holds the gradient of x's other uses) */
} dpc_norm;
/* out (rows, n) of out_dtype; mean and rstd (rows): each row's mean and
 * 1 / sqrt(biased variance + eps), float32 (float64 for float64 input) */
int dpc_layer_norm(int in_dtype, int out_dtype, const dpc_norm *a, void *out, void *sum, void *mean, void *rstd,
                   void *stream);
/* Bytes of device scratch memory that dpc_layer_norm_backward needs for
 * its per-block partial sums of dweight and dbias (when either is wanted) */
size_t dpc_layer_norm_workspace(int in_dtype, int64_t rows, int64_t n);
/* dy (rows, n) of out_dtype, contiguous; writes dx (as x), dw and db (as
 * weight), each NULL when not wanted. The partial sums of dweight and
 * dbias are added in a fixed order: the same bits on every run. */
int dpc_layer_norm_backward(int in_dtype, int out_dtype, const dpc_norm *a, const void *dy, const void *mean,
                            const void *rstd, void *dx, void *dw, void *db, void *workspace, void *stream);

/* ---- BatchNorm (cuda/norm.cu) ---- */

/* BatchNorm of x (N, C, S) contiguous over N and S, per channel. weight,
 * bias, running_mean, running_var: C elements of the parameters' dtype, or
 * NULL. training: normalize by the batch's mean and biased variance, and
 * move the running statistics (when given) by momentum toward the batch's
 * mean and unbiased variance; else by the running ones. The dtype pairs
 * (input, parameters) taken: float32 and float32, float64 and float64,
 * bfloat16 and bfloat16, bfloat16 and float32. */
typedef struct {
    int64_t N, C, S;
    const void *x, *weight, *bias;
    void *running_mean, *running_var;
    int training;
    double momentum, eps;
} dpc_bn;
/* Bytes of device scratch memory that dpc_batch_norm (backward = 0) or
 * dpc_batch_norm_backward (backward = 1) needs: per-channel partial sums */
size_t dpc_batch_norm_workspace(int in_dtype, const dpc_bn *a, int backward);
/* out as x; mean and invstd (C): what x was normalized by, float32
 * (float64 for float64 input). The statistics are combined in a fixed
 * order: the same bits on every run. */
int dpc_batch_norm(int in_dtype, int param_dtype, const dpc_bn *a, void *out, void *mean, void *invstd,
                   void *workspace, void *stream);
/* dy as x, contiguous; mean and invstd as the forward gave them; writes dx
 * (as x), dw and db (as weight), each NULL when not wanted */
int dpc_batch_norm_backward(int in_dtype, int param_dtype, const dpc_bn *a, const void *dy,
                            const void *mean, const void *invstd, void *dx, void *dw, void *db, void *workspace,
                            void *stream);

#ifdef __cplusplus
}
#endif

#endif /* DPC_OPS_H */
