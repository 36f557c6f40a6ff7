/*
 * dplua.h — the public C API of dplua: tensors, ops, autograd, nn and
 * optimizer steps, files, the rendezvous store, process groups and DDP,
 * processes and clocks. The CUDA entry points (devices, streams, events,
 * graphs) are in dplua_cuda.h; the dtype and op codes in dplua_codes.h,
 * which this header includes. Link with -ldplua (pkg-config dplua).
 *
 * A tensor is an opaque, reference-counted handle. Every function that can
 * fail returns a dp_status; on failure dp_last_error() holds a message that
 * names the function, what it got and what it expected. Functions that make
 * a tensor return it through `out` with a reference owned by the caller.
 *
 *     dp_tensor *a, *b, *c;
 *     int64_t shape[2] = {2, 3};
 *     if (dp_full(&a, 2, shape, 1.0, DP_FLOAT32, DP_CPU) ||
 *         dp_full(&b, 2, shape, 2.0, DP_FLOAT32, DP_CPU) ||
 *         dp_binary(&c, DP_ADD, a, b))
 *         fprintf(stderr, "%s\n", dp_last_error());
 *     dp_tensor_release(a); dp_tensor_release(b); dp_tensor_release(c);
 *
 * Naming: every name starts with dp_ (DP_ for constants); a function that
 * writes into an existing tensor ends in _into (dp_unary_into, dp_copy_into).
 *
 * The declarations between the DP_CDEF markers are also LuaJIT's ffi.cdef
 * (scripts/gen-cdef writes them into lua/dplua/cdef.lua, which base.lua
 * declares), so they stay plain C: DP_API, which gen-cdef drops, is the
 * only macro there. Enums are only ever appended to.
 */
#ifndef DPLUA_H
#define DPLUA_H

#include <stddef.h>
#include <stdint.h>

#include "dplua_codes.h"

/* Marks what libdplua.so exports: it is built with -fvisibility=hidden,
 * so everything else stays inside. */
#if defined(__GNUC__)
#define DP_API __attribute__((visibility("default")))
#else
#define DP_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define DP_MAX_DIMS 8
#define DP_CPU (-1)
#define DP_ALL_DIMS (-100)

/* DP_CDEF_BEGIN */
typedef struct dp_tensor dp_tensor;

typedef enum {
    DP_OK = 0,
    DP_ERR_ARG,      /* a bad argument value or type */
    DP_ERR_SHAPE,    /* shapes that do not fit together */
    DP_ERR_DTYPE,    /* a dtype the operation does not take */
    DP_ERR_DEVICE,   /* a device that is absent or does not match */
    DP_ERR_INDEX,    /* an index or dim out of range */
    DP_ERR_MEMORY,   /* an allocation failed */
    DP_ERR_CUDA,     /* a CUDA, cuBLAS or NCCL call failed */
    DP_ERR_IO,       /* a file could not be read or written */
    DP_ERR_STATE     /* a call at the wrong time (e.g. backward twice) */
} dp_status;

/* errors and versions */
DP_API const char *dp_last_error(void);
DP_API const char *dp_version(void);
DP_API const char *dp_build_options(void);

/* lifetime: every tensor returned through `out` must be released once */
DP_API void dp_tensor_retain(dp_tensor *t);
DP_API void dp_tensor_release(dp_tensor *t);

/* inspection (never fail) */
DP_API int dp_tensor_dtype(const dp_tensor *t);   /* a dp_dtype (an int: LuaJIT boxes enum results) */
DP_API int dp_tensor_device(const dp_tensor *t);
DP_API int dp_tensor_ndim(const dp_tensor *t);
DP_API int64_t dp_tensor_size(const dp_tensor *t, int dim);
DP_API int64_t dp_tensor_stride(const dp_tensor *t, int dim);
DP_API int64_t dp_tensor_numel(const dp_tensor *t);
DP_API int64_t dp_tensor_offset(const dp_tensor *t);
DP_API int dp_tensor_is_contiguous(const dp_tensor *t);
DP_API void *dp_tensor_data(const dp_tensor *t);      /* first element; CPU only */
DP_API const char *dp_dtype_name(dp_dtype dtype);
DP_API size_t dp_dtype_size(dp_dtype dtype);
DP_API int dp_dtype_is_floating(dp_dtype dtype);
DP_API int dp_dtype_holds(dp_dtype dtype, double value);   /* value converts to dtype without overflow */
DP_API int64_t dp_memory_allocated(int device);
DP_API int64_t dp_max_memory_allocated(int device);
DP_API void dp_reset_peak_memory_stats(int device);

/* creation */
DP_API dp_status dp_empty(dp_tensor **out, int ndim, const int64_t *shape, dp_dtype dtype, int device);
DP_API dp_status dp_full(dp_tensor **out, int ndim, const int64_t *shape, double value, dp_dtype dtype, int device);
DP_API dp_status dp_arange(dp_tensor **out, double start, double end, double step, dp_dtype dtype, int device);
DP_API dp_status dp_linspace(dp_tensor **out, double start, double end, int64_t steps, dp_dtype dtype, int device);
DP_API dp_status dp_eye(dp_tensor **out, int64_t n, int64_t m, dp_dtype dtype, int device);
DP_API dp_status dp_rand(dp_tensor **out, int ndim, const int64_t *shape, dp_dtype dtype, int device);
/* dropout in training: x * 1 / (1 - p) where rand_like(x) (the same draw)
 * is at least p, else x * 0; p in [0, 1). Its backward makes the mask
 * again from the stream's counters rather than keeping it. */
DP_API dp_status dp_dropout(dp_tensor **out, dp_tensor *x, double p);
DP_API dp_status dp_randn(dp_tensor **out, int ndim, const int64_t *shape, dp_dtype dtype, int device);
DP_API dp_status dp_randint(dp_tensor **out, int64_t low, int64_t high, int ndim, const int64_t *shape, dp_dtype dtype,
                            int device);
DP_API void dp_manual_seed(uint64_t seed);
DP_API void dp_rng_get_state(uint64_t *seed, uint64_t *offset);
DP_API void dp_rng_set_state(uint64_t seed, uint64_t offset);

/* views: share storage with the input */
DP_API dp_status dp_view(dp_tensor **out, dp_tensor *t, int ndim, const int64_t *shape);
DP_API dp_status dp_reshape(dp_tensor **out, dp_tensor *t, int ndim, const int64_t *shape);
DP_API dp_status dp_permute(dp_tensor **out, dp_tensor *t, int ndim, const int *dims);
DP_API dp_status dp_transpose(dp_tensor **out, dp_tensor *t, int dim0, int dim1);
DP_API dp_status dp_expand(dp_tensor **out, dp_tensor *t, int ndim, const int64_t *shape);
DP_API dp_status dp_slice(dp_tensor **out, dp_tensor *t, int dim, int64_t start, int64_t stop, int64_t step);
DP_API dp_status dp_narrow(dp_tensor **out, dp_tensor *t, int dim, int64_t start, int64_t length);
DP_API dp_status dp_select(dp_tensor **out, dp_tensor *t, int dim, int64_t index);
DP_API dp_status dp_squeeze(dp_tensor **out, dp_tensor *t, int dim);   /* DP_ALL_DIMS: every size-1 dim */
DP_API dp_status dp_unsqueeze(dp_tensor **out, dp_tensor *t, int dim);
DP_API dp_status dp_contiguous(dp_tensor **out, dp_tensor *t);         /* t itself (retained) when already contiguous */
DP_API dp_status dp_alias(dp_tensor **out, dp_tensor *t);              /* a new handle on the same view (detach) */
/* t takes view's shape, strides and offset (t:unsqueeze_() and the other
 * in-place view changes): view must be a view of t's storage, and t may
 * not require grad (its autograd history would no longer match its shape). */
DP_API dp_status dp_set_view(dp_tensor *t, dp_tensor *view);
/* A view of t's storage with the given shape and strides, starting at
 * element offset of the storage (torch.as_strided): every element it
 * reaches must lie inside the storage; strides are non-negative. Not
 * recorded by autograd, so t may not require grad while grad mode is on. */
DP_API dp_status dp_as_strided(dp_tensor **out, dp_tensor *t, int ndim, const int64_t *shape, const int64_t *stride,
                               int64_t offset);
/* t resized in place to shape, contiguous (torch's resize_): its storage
 * read as C-contiguous from t's offset; where it holds too few elements, a
 * new storage takes the old elements that fit, the rest uninitialised.
 * Other views keep the old storage. t may not require grad. */
DP_API dp_status dp_resize_(dp_tensor *t, int ndim, const int64_t *shape);

/* math: new results */
DP_API dp_status dp_unary(dp_tensor **out, dp_unop op, dp_tensor *a);
DP_API dp_status dp_binary(dp_tensor **out, dp_binop op, dp_tensor *a, dp_tensor *b);
DP_API dp_status dp_binary_scalar(dp_tensor **out, dp_binop op, dp_tensor *a, double s, int scalar_first);
DP_API dp_status dp_where(dp_tensor **out, dp_tensor *cond, dp_tensor *a, dp_tensor *b);
DP_API dp_status dp_clamp(dp_tensor **out, dp_tensor *a, double lo, double hi);  /* NaN: no bound */
DP_API dp_status dp_reduce(dp_tensor **out, dp_redop op, dp_tensor *a, int dim, int keepdim, int correction);
DP_API dp_status dp_reduce_with_index(dp_tensor **values, dp_tensor **indices, dp_redop op, dp_tensor *a, int dim,
                                      int keepdim);
DP_API dp_status dp_softmax(dp_tensor **out, dp_tensor *a, int dim, int log);
DP_API dp_status dp_matmul(dp_tensor **out, dp_tensor *a, dp_tensor *b);
DP_API dp_status dp_mm(dp_tensor **out, dp_tensor *a, dp_tensor *b);
DP_API dp_status dp_bmm(dp_tensor **out, dp_tensor *a, dp_tensor *b);
DP_API dp_status dp_index_select(dp_tensor **out, dp_tensor *a, int dim, dp_tensor *index);
DP_API dp_status dp_gather(dp_tensor **out, dp_tensor *a, int dim, dp_tensor *index);
/* scatter (add = 0) or scatter_add (add = 1): a copy of a with src[p]
 * written (added) at p with dim replaced by index[p], p over index's shape
 * (no larger than src's, nor than a's but in dim); a, index, src of one
 * number of dims, a and src of one dtype and device */
DP_API dp_status dp_scatter(dp_tensor **out, dp_tensor *a, int dim, dp_tensor *index, dp_tensor *src, int add);
DP_API dp_status dp_cat(dp_tensor **out, int n, dp_tensor *const *ts, int dim);
DP_API dp_status dp_stack(dp_tensor **out, int n, dp_tensor *const *ts, int dim);
/* sorting and selecting: stable sorts (NaN above every number), indices int64 */
DP_API dp_status dp_sort(dp_tensor **values, dp_tensor **indices, dp_tensor *a, int dim, int descending);
DP_API dp_status dp_topk(dp_tensor **values, dp_tensor **indices, dp_tensor *a, int64_t k, int dim, int largest);
DP_API dp_status dp_cumsum(dp_tensor **out, dp_tensor *a, int dim);
/* probs 1-D or 2-D: num_samples int64 category indices per row, drawn from the global stream */
DP_API dp_status dp_multinomial(dp_tensor **out, dp_tensor *probs, int64_t num_samples, int replacement);
DP_API dp_status dp_nonzero(dp_tensor **out, dp_tensor *a);   /* (count, ndim) int64 */
/* a itself (retained) when nothing changes */
DP_API dp_status dp_to(dp_tensor **out, dp_tensor *a, dp_dtype dtype, int device);
/* Pinned (page-locked) host memory, for copies to a GPU: pin_memory gives
 * a contiguous pinned copy of a CPU tensor (a itself when it is pinned
 * already). dp_to_non_blocking is dp_to, except that the copy of a
 * contiguous pinned tensor to a GPU in its own dtype is only queued on the
 * device's current stream: the call returns at once, later work on that
 * stream sees the data, and the pinned memory must not be written until
 * dp_pinned_wait(a) (PyTorch's non_blocking=True). */
DP_API dp_status dp_pin_memory(dp_tensor **out, dp_tensor *a);
DP_API int dp_tensor_is_pinned(const dp_tensor *t);
DP_API dp_status dp_to_non_blocking(dp_tensor **out, dp_tensor *a, dp_dtype dtype, int device);
DP_API dp_status dp_pinned_wait(dp_tensor *t);
DP_API dp_status dp_clone(dp_tensor **out, dp_tensor *a);

/* math: in place, into an existing tensor (dst may alias an input) */
/* dst's element at row-major position index[j] = src[j] (PyTorch's put_) */
DP_API dp_status dp_put_into(dp_tensor *dst, dp_tensor *index, dp_tensor *src);
DP_API dp_status dp_unary_into(dp_tensor *dst, dp_unop op, dp_tensor *a);
DP_API dp_status dp_binary_into(dp_tensor *dst, dp_binop op, dp_tensor *a, dp_tensor *b);
DP_API dp_status dp_binary_scalar_into(dp_tensor *dst, dp_binop op, dp_tensor *a, double s, int scalar_first);
DP_API dp_status dp_clamp_into(dp_tensor *dst, dp_tensor *a, double lo, double hi);
DP_API dp_status dp_copy_into(dp_tensor *dst, dp_tensor *src);  /* broadcasts src, casts dtype */
DP_API dp_status dp_fill_into(dp_tensor *dst, double value);

/* scalars */
DP_API dp_status dp_item(dp_tensor *t, double *value);
DP_API dp_status dp_item_int64(dp_tensor *t, int64_t *value);

/* autograd: a tape recorded by the ops above while grad mode is on */
DP_API int dp_set_grad_enabled(int enabled);       /* returns the previous mode */
DP_API int dp_is_grad_enabled(void);
DP_API dp_status dp_set_requires_grad(dp_tensor *t, int requires_grad);
/* t becomes a leaf that does not require grad, in place (detach_) */
DP_API dp_status dp_detach_(dp_tensor *t);
DP_API int dp_requires_grad(const dp_tensor *t);
DP_API int dp_is_leaf(const dp_tensor *t);
DP_API const char *dp_grad_fn_name(const dp_tensor *t);         /* NULL for leaves */
DP_API dp_tensor *dp_get_grad(dp_tensor *t);                    /* a new reference, or NULL */
DP_API dp_status dp_set_grad(dp_tensor *t, dp_tensor *grad);    /* NULL clears */
DP_API dp_status dp_set_grad_slot(dp_tensor *t, dp_tensor *slot); /* gradients are written into slot */
DP_API dp_status dp_backward(dp_tensor *root, dp_tensor *grad, int retain_graph); /* grad NULL: ones */
/* Anomaly detection: while on, a backward checks every gradient a node
 * hands on and fails on the first that holds NaN, naming the node;
 * dp_anomaly_node is then that node's dp_grad_fn_seq (0 before any). */
DP_API int dp_set_detect_anomaly(int on);          /* returns the previous mode */
DP_API uint64_t dp_grad_fn_seq(const dp_tensor *t);  /* creation order of t's node; 0 for leaves */
DP_API uint64_t dp_anomaly_node(void);
/* The profiler's view of a backward (torch.profiler): while on, each node's
 * backward function is timed (dp_clock_monotonic seconds) and kept until
 * dp_backward_times takes up to cap of them, oldest first, and returns how
 * many it took. */
DP_API void dp_set_backward_timing(int on);
DP_API int dp_backward_times(const char **names, double *starts, double *seconds, int cap);
typedef void (*dp_grad_hook)(dp_tensor *leaf, void *ctx);
DP_API dp_status dp_add_grad_hook(dp_tensor *leaf, dp_grad_hook fn, void *ctx);
DP_API void dp_clear_grad_hooks(dp_tensor *leaf);

/* nn: fused ops with their own backward */
DP_API dp_status dp_linear(dp_tensor **out, dp_tensor *x, dp_tensor *w, dp_tensor *b);
/* act(x @ w^T + b), act DP_RELU, DP_GELU or DP_GELU_TANH, as one node; b may be NULL */
DP_API dp_status dp_linear_act(dp_tensor **out, dp_tensor *x, dp_tensor *w, dp_tensor *b, dp_unop act);
/* reduction: 0 none, 1 mean, 2 sum; log_probs: the input holds log-probabilities (nll_loss) */
DP_API dp_status dp_cross_entropy(dp_tensor **out, dp_tensor *input, dp_tensor *target, dp_tensor *weight,
                                  int64_t ignore_index, double label_smoothing, int reduction, int log_probs);
/* The same as autocast computes it (a float32 op): a bfloat16 input gives
 * the loss of it cast to float32, on a GPU's classifier path without
 * making that copy; other dtypes as dp_cross_entropy. */
DP_API dp_status dp_cross_entropy_fp32(dp_tensor **out, dp_tensor *input, dp_tensor *target, dp_tensor *weight,
                                       int64_t ignore_index, double label_smoothing, int reduction, int log_probs);
/* im2col: x (N, C, H, W) -> (N, C*kh*kw, L); padding reads pad_value */
DP_API dp_status dp_unfold(dp_tensor **out, dp_tensor *x, const int64_t *kernel, const int64_t *stride,
                           const int64_t *padding, const int64_t *dilation, double pad_value);
/* 2-D convolution of CPU float32/float64 tensors as one node: x (N, C, H,
 * W), w (O, C/groups, kh, kw), b (O) or NULL -> (N, O, Ho, Wo); stride,
 * padding and dilation are (height, width) pairs */
DP_API dp_status dp_conv2d(dp_tensor **out, dp_tensor *x, dp_tensor *w, dp_tensor *b, const int64_t *stride,
                           const int64_t *padding, const int64_t *dilation, int64_t groups);
/* max pooling of a CPU float32/float64 x (N, C, H, W) as one node; kernel,
 * stride, padding (at most half the kernel) and dilation are pairs */
DP_API dp_status dp_max_pool2d(dp_tensor **out, dp_tensor *x, const int64_t *kernel, const int64_t *stride,
                               const int64_t *padding, const int64_t *dilation);
/* softmax(q @ k^T * scale) @ v over q (..., L, E), k (..., S, E), v (..., S, Ev)
 * of one float dtype and the same leading dims, without materialising the
 * (L, S) weights; is_causal: query i attends to keys j <= i. Only when
 * dp_attention_fused says a kernel takes the inputs (src/core/attention.c). */
DP_API int dp_attention_fused(const dp_tensor *q, const dp_tensor *k, const dp_tensor *v);
DP_API dp_status dp_scaled_dot_product_attention(dp_tensor **out, dp_tensor *q, dp_tensor *k, dp_tensor *v,
                                                 int is_causal, double scale);

/* LayerNorm over the last `normalized` elements of each row of input (float32,
 * float64 or bfloat16): out = (x - mean) * rstd * weight + bias with the
 * biased variance and rstd = 1 / sqrt(var + eps), as one node
 * (src/core/norm.c). weight and bias: `normalized` elements of out_dtype, or
 * NULL. out_dtype: the input's, or float32 for a bfloat16 input (autocast's
 * float32 layer_norm without a float32 copy of the input). mean and rstd
 * (either may be NULL): each row's, 1-D, float32 (float64 for a float64
 * input). */
DP_API dp_status dp_layer_norm(dp_tensor **out, dp_tensor **mean, dp_tensor **rstd, dp_tensor *input,
                               dp_tensor *weight, dp_tensor *bias, int64_t normalized, double eps,
                               dp_dtype out_dtype);
/* sum = x + residual (one shape and dtype) and out = layer_norm(sum) as above,
 * in one pass; sum's node is an addition's, out's a LayerNorm's of sum */
DP_API dp_status dp_add_layer_norm(dp_tensor **sum, dp_tensor **out, dp_tensor *x, dp_tensor *residual,
                                   dp_tensor *weight, dp_tensor *bias, int64_t normalized, double eps,
                                   dp_dtype out_dtype);
/* BatchNorm over every dim of input (N, C, ...) but the channels (dim 1), as
 * one node (src/core/norm.c): out = (x - mean) * invstd * weight + bias with
 * invstd = 1 / sqrt(var + eps), of the input's dtype (float32, float64 or
 * bfloat16). weight, bias, running_mean, running_var: C elements each, or
 * NULL, all of one dtype: the input's, or float32 for a bfloat16 input (as
 * PyTorch's mixed BatchNorm under autocast). With training set, or without
 * running statistics, mean and var are the batch's (var biased); training
 * also moves the running statistics in place by momentum toward the
 * batch's mean and unbiased variance. Otherwise they are the running ones. */
DP_API dp_status dp_batch_norm(dp_tensor **out, dp_tensor *input, dp_tensor *weight, dp_tensor *bias,
                               dp_tensor *running_mean, dp_tensor *running_var, int training, double momentum,
                               double eps);

/* One timestep of a recurrent layer's gates as one node (src/core/rnn.c),
 * float32 or float64 operands of one dtype and device. LSTM: gi =
 * x W_ih^T + b_ih and gh = h W_hh^T + b_hh (N, 4H), whose sum holds the
 * pre-activations of i, f, g, o, c (N, H); out (2, N, H) holds
 * h' = o tanh(c') then c' = f c + i g, with i, f, o sigmoids and g a
 * tanh. GRU: gi = x W_ih^T + b_ih and
 * gh = h W_hh^T + b_hh (N, 3H) of r, z, n, h (N, H); out (N, H) =
 * (1 - z) n + z h with r = sigmoid(gi_r + gh_r), z = sigmoid(gi_z + gh_z),
 * n = tanh(gi_n + r gh_n). */
DP_API dp_status dp_lstm_gates(dp_tensor **out, dp_tensor *gi, dp_tensor *gh, dp_tensor *c);
DP_API dp_status dp_gru_gates(dp_tensor **out, dp_tensor *gi, dp_tensor *gh, dp_tensor *h);
/* A whole LSTM layer over a sequence as one node (src/core/rnn.c): gi
 * (T, N, 4H) = x W_ih^T + b_ih of every timestep, h0 and c0 (N, H), w_hh
 * (4H, H), b_hh (4H) or NULL, all float32 or float64 of one dtype and
 * device. out (2, T + 1, N, H) holds h0, then h_t after each timestep t,
 * and the same of the c's (so that the layer's output, out[0][1..T], is
 * contiguous), the gates as dp_lstm_gates computes them from gi[t] and
 * h_{t-1} w_hh^T + b_hh. Its backward runs the timesteps back in C and
 * gets the weight's gradient from one product over the whole sequence. */
DP_API dp_status dp_lstm_layer(dp_tensor **out, dp_tensor *gi, dp_tensor *h0, dp_tensor *c0, dp_tensor *w_hh,
                               dp_tensor *b_hh);

/* optim: one fused pass over a flat buffer (param, grad and state alike) */
DP_API dp_status dp_sgd_step(dp_tensor *param, dp_tensor *grad, dp_tensor *momentum_buf, double lr, double momentum,
                             double dampening, int nesterov, double weight_decay, int first_step);
/* master NULL: every buffer of the parameters' dtype. Else param is
 * bfloat16, master its float32 master copy, the moments float32 and grad
 * bfloat16 or float32: the step updates master in float32 and writes it
 * rounded to bfloat16 into param, in the same pass. */
DP_API dp_status dp_adam_step(dp_tensor *param, dp_tensor *grad, dp_tensor *exp_avg, dp_tensor *exp_avg_sq,
                              dp_tensor *max_exp_avg_sq, dp_tensor *master, double lr, double beta1, double beta2,
                              double eps, double weight_decay, int decoupled, int64_t step);
/* The same with the step count in a 0-d float64 tensor on the parameters'
 * device, incremented by the call (capturable Adam). */
DP_API dp_status dp_adam_step_t(dp_tensor *param, dp_tensor *grad, dp_tensor *exp_avg, dp_tensor *exp_avg_sq,
                                dp_tensor *max_exp_avg_sq, dp_tensor *master, double lr, double beta1, double beta2,
                                double eps, double weight_decay, int decoupled, dp_tensor *step);
/* Adadelta, RMSprop and Adagrad: PyTorch 1.13's single-tensor step in one
 * pass, every buffer of the parameters' dtype, size and device. RMSprop
 * reads grad_avg only when centered and momentum_buf only with momentum >
 * 0 (either may be NULL otherwise); Adagrad's step counts from 1 (its
 * learning rate is lr / (1 + (step - 1) lr_decay)). */
DP_API dp_status dp_adadelta_step(dp_tensor *param, dp_tensor *grad, dp_tensor *square_avg, dp_tensor *acc_delta,
                                  double lr, double rho, double eps, double weight_decay);
DP_API dp_status dp_rmsprop_step(dp_tensor *param, dp_tensor *grad, dp_tensor *square_avg, dp_tensor *grad_avg,
                                 dp_tensor *momentum_buf, double lr, double alpha, double eps, double weight_decay,
                                 double momentum, int centered);
DP_API dp_status dp_adagrad_step(dp_tensor *param, dp_tensor *grad, dp_tensor *sum, double lr, double lr_decay,
                                 double weight_decay, double eps, int64_t step);
/* Moves params into one flat buffer (each param becomes a view of it) and
 * gives them grad slots in a flat gradient buffer; params that are already
 * neighbours in such buffers get views of them instead. */
DP_API dp_status dp_flatten_params(dp_tensor **flat_param, dp_tensor **flat_grad, int n, dp_tensor *const *params);
/* How many of params, from the first, lie next to each other in one flat
 * buffer with their grad slots (0: the first is in none); a group of such
 * neighbours flattens to views of where it is. */
DP_API int dp_flat_run_length(int n, dp_tensor *const *params);

/* data files: an IDX file (MNIST's format), gzip-compressed or not, as a
 * tensor of its element type (uint8 -> uint8, int32 -> int32, float -> float32, double -> float64) */
DP_API dp_status dp_load_idx(dp_tensor **out, const char *path);

/* distributed: the rendezvous store and process groups (src/dist).
 * Rank 0 serves the store (a TCP key-value server on a background thread);
 * every rank is a client. Only clients presenting the job's token are
 * served. Blocking calls take a timeout in seconds and fail with a message
 * instead of hanging. */
typedef struct dp_store dp_store;
typedef struct dp_pg dp_pg;
typedef struct dp_work dp_work;

/* is_server: bind host:port (port 0 picks a free one) and serve; rank is
 * the client's rank (-1 if none), so the server can tell who went away;
 * world_size bounds the clients a server takes at once (<= 0: unknown);
 * token NULL or "": $DPLUA_JOB_TOKEN, else a private file rank 0 writes
 * (docs/DISTRIBUTED.md); generation: which initialisation of the job this
 * is (a store of another refuses the client, which retries until
 * timeout_s). */
DP_API dp_status dp_store_open(dp_store **out, const char *host, int port, int is_server, int rank, int world_size,
                               const char *token, int64_t generation, double timeout_s);
/* The client protocol of PyTorch's TCPStore (torchrun's agent store). */
DP_API dp_status dp_store_open_torch(dp_store **out, const char *host, int port, double timeout_s);
DP_API int dp_store_port(const dp_store *s);
DP_API dp_status dp_store_set(dp_store *s, const char *key, const void *value, size_t len);
/* Waits for the key; *value is malloc'd (free with dp_free). */
DP_API dp_status dp_store_get(dp_store *s, const char *key, void **value, size_t *len, double timeout_s);
DP_API dp_status dp_store_add(dp_store *s, const char *key, int64_t delta, int64_t *result);
/* Sets key to desired if its value equals expected (or it is absent and
 * expected_len is 0); *current gets the value after the call. */
DP_API dp_status dp_store_compare_set(dp_store *s, const char *key, const void *expected, size_t expected_len,
                                      const void *desired, size_t desired_len, void **current, size_t *current_len);
DP_API dp_status dp_store_wait(dp_store *s, const char *const *keys, int n, double timeout_s);
DP_API dp_status dp_store_check(dp_store *s, const char *const *keys, int n, int *all_present);
DP_API dp_status dp_store_delete(dp_store *s, const char *key, int *deleted);
DP_API void dp_store_close(dp_store *s);
DP_API void dp_free(void *p);

/* A process group over the store. backend: "gloo" (CPU tensors) or "nccl"
 * (CUDA tensors). ranks: the members' global ranks (NULL: all of 0..size-1);
 * name keeps different groups' keys apart. */
DP_API dp_status dp_pg_new(dp_pg **out, dp_store *store, const char *backend, int rank, int size,
                           double timeout_s, const char *name, const int *ranks);
DP_API int dp_pg_rank(const dp_pg *pg);
DP_API int dp_pg_size(const dp_pg *pg);
DP_API const char *dp_pg_backend(const dp_pg *pg);
DP_API uint64_t dp_pg_seq(const dp_pg *pg);
/* Collectives: work NULL runs synchronously; else *work is a handle to
 * wait on. Tensors must be contiguous. op: DP_SUM, DP_MEAN (floating
 * point only), DP_PROD, DP_MAX or DP_MIN; the other dp_redop are refused. */
DP_API dp_status dp_pg_all_reduce(dp_pg *pg, dp_tensor *t, dp_redop op, dp_work **work);
DP_API dp_status dp_pg_broadcast(dp_pg *pg, dp_tensor *t, int root, dp_work **work);
DP_API dp_status dp_pg_reduce(dp_pg *pg, dp_tensor *t, int root, dp_redop op, dp_work **work);
/* all_gather: out has size * numel(in) elements; reduce_scatter: in has
 * size * numel(out); all_to_all: equal splits along dim 0 */
DP_API dp_status dp_pg_all_gather(dp_pg *pg, dp_tensor *out, dp_tensor *in, dp_work **work);
DP_API dp_status dp_pg_reduce_scatter(dp_pg *pg, dp_tensor *out, dp_tensor *in, dp_redop op, dp_work **work);
DP_API dp_status dp_pg_all_to_all(dp_pg *pg, dp_tensor *out, dp_tensor *in, dp_work **work);
DP_API dp_status dp_pg_send(dp_pg *pg, dp_tensor *t, int dst, int tag);
DP_API dp_status dp_pg_recv(dp_pg *pg, dp_tensor *t, int src, int tag);
DP_API dp_status dp_pg_barrier(dp_pg *pg);
/* gather: in on every rank, out (size * numel(in) elements) on the root;
 * scatter: out on every rank, in (size * numel(out)) on the root. Ranks
 * other than the root pass NULL for the root's tensor. */
DP_API dp_status dp_pg_gather(dp_pg *pg, dp_tensor *out, dp_tensor *in, int root, dp_work **work);
DP_API dp_status dp_pg_scatter(dp_pg *pg, dp_tensor *out, dp_tensor *in, int root, dp_work **work);
/* isend, irecv, batch_isend_irecv: tensors[i] is sent to (is_send[i]) or
 * received from group rank peers[i] with tags[i]; all are posted together
 * in issue order, and *work (required) completes when every one has. */
DP_API dp_status dp_pg_p2p(dp_pg *pg, int n, dp_tensor *const *tensors, const int *is_send, const int *peers,
                           const int *tags, dp_work **work);
/* torch.distributed.nn.functional.all_reduce: *out is the all_reduce
 * (SUM) of a copy of in, recorded on the tape; its backward all_reduces
 * (SUM) the gradient over the same group. */
DP_API dp_status dp_pg_all_reduce_autograd(dp_tensor **out, dp_pg *pg, dp_tensor *in);
DP_API void dp_pg_free(dp_pg *pg);
DP_API dp_status dp_work_wait(dp_work *w);
DP_API int dp_work_is_completed(dp_work *w);
DP_API void dp_work_free(dp_work *w);

/* DistributedDataParallel's reducer: gradient buckets over the flat
 * gradient buffer, all-reduced (DP_MEAN) from grad-ready hooks during backward;
 * backward returns once they are done. */
typedef struct dp_ddp dp_ddp;
DP_API dp_status dp_ddp_new(dp_ddp **out, dp_pg *pg, int n, dp_tensor *const *params, const char *const *names,
                            int64_t first_bucket_bytes, int64_t bucket_bytes, int find_unused);
DP_API void dp_ddp_set_sync(dp_ddp *d, int sync);   /* 0 inside no_sync(): gradients accumulate locally */
/* Buckets averaged in dtype (DP_BFLOAT16: PyTorch's bf16_compress_hook) and
 * cast back; -1 for the gradients' own dtype. */
DP_API dp_status dp_ddp_set_comm_dtype(dp_ddp *d, int dtype);
DP_API int dp_ddp_num_buckets(const dp_ddp *d);
DP_API dp_status dp_ddp_bucket_range(const dp_ddp *d, int i, int64_t *start, int64_t *end);
DP_API dp_tensor *dp_ddp_flat_param(dp_ddp *d);     /* a new reference */
/* ZeRO-2: from now on this rank keeps only its shard [*start, *end) of the
 * flat gradient, averaged into *grad_shard (a new reference) by backward;
 * parameters' .grad stay nil outside no_sync(). */
DP_API dp_status dp_ddp_shard_grads(dp_ddp *d, dp_tensor **grad_shard, int64_t *start, int64_t *end);
/* Join: a rank out of inputs matches the others' backward collectives with
 * zero gradients. */
DP_API dp_status dp_ddp_join_backward(dp_ddp *d);
DP_API void dp_ddp_free(dp_ddp *d);

/* checkpoints: the safetensors format (src/io/safetensors.c). A reader
 * opens and validates the whole header (every failure names the file and
 * the problem); tensors are then read one at a time, in header order, into
 * new CPU tensors. Names and metadata are valid while the reader is open. */
typedef struct dp_safetensors dp_safetensors;
DP_API dp_status dp_safetensors_open(dp_safetensors **out, const char *path);
DP_API int dp_safetensors_count(const dp_safetensors *f);
DP_API const char *dp_safetensors_name(const dp_safetensors *f, int i);
DP_API dp_status dp_safetensors_tensor(dp_tensor **out, const dp_safetensors *f, int i);
DP_API int dp_safetensors_metadata_count(const dp_safetensors *f);
DP_API const char *dp_safetensors_metadata_key(const dp_safetensors *f, int i);
DP_API const char *dp_safetensors_metadata_value(const dp_safetensors *f, int i);
DP_API void dp_safetensors_close(dp_safetensors *f);   /* NULL is fine */
/* Writes n tensors (any device, any layout) and n_meta metadata strings
 * atomically: into path.tmp.<pid>, fsync, rename over path, fsync the
 * directory. Names must be distinct valid UTF-8. */
DP_API dp_status dp_safetensors_save(const char *path, int n, const char *const *names, dp_tensor *const *tensors,
                                     int n_meta, const char *const *meta_keys, const char *const *meta_values);

/* checkpoints: PyTorch's format (src/io/torchfile.c), the zip archive that
 * torch.save writes since PyTorch 1.6. Opening reads the archive and
 * unpickles its data.pkl into a tree of values without running anything
 * (src/io/pickle.c): only the globals torch.save writes are known, any
 * other is refused by name. Values are numbered nodes; a node's kind says
 * which accessor reads it. Lists and tuples have len items; dicts have len
 * pairs, items 2i (key) and 2i+1 (value). Strings stay valid while the file
 * is open. Tensors are read when asked, into new contiguous CPU tensors. */
typedef enum {
    DP_PY_NONE = 0, DP_PY_BOOL, DP_PY_INT, DP_PY_FLOAT, DP_PY_STR, DP_PY_BYTES,
    DP_PY_LIST, DP_PY_TUPLE, DP_PY_DICT, DP_PY_ODICT, DP_PY_TENSOR, DP_PY_DTYPE, DP_PY_DEVICE,
    DP_PY_NUM_KINDS
} dp_pykind;
typedef struct dp_torchfile dp_torchfile;
/* 1 when path's first bytes are those of PyTorch's format (its zip
 * archive, or its legacy pickle); 0 otherwise, or when it cannot be read. */
DP_API int dp_torchfile_sniff(const char *path);
DP_API dp_status dp_torchfile_open(dp_torchfile **out, const char *path);
DP_API void dp_torchfile_close(dp_torchfile *f);   /* NULL is fine */
DP_API int dp_torchfile_root(const dp_torchfile *f);
DP_API int dp_torchfile_kind(const dp_torchfile *f, int node);   /* a dp_pykind; -1 for a bad node */
DP_API int64_t dp_torchfile_int(const dp_torchfile *f, int node);     /* an int or a bool */
DP_API double dp_torchfile_float(const dp_torchfile *f, int node);
/* str, bytes, a dtype's name ("float32"), a device ("cuda:0") */
DP_API const char *dp_torchfile_str(const dp_torchfile *f, int node, size_t *len);
DP_API int dp_torchfile_len(const dp_torchfile *f, int node);
DP_API int dp_torchfile_item(const dp_torchfile *f, int node, int i);
DP_API dp_status dp_torchfile_tensor(dp_tensor **out, const dp_torchfile *f, int node);
/* The writer: values in pickle order (containers opened with begin(kind)
 * and closed with end()), then saved atomically as PyTorch's zip format.
 * A tensor given twice is stored once. */
typedef struct dp_torchwriter dp_torchwriter;
DP_API dp_status dp_torchwriter_new(dp_torchwriter **out);
DP_API void dp_torchwriter_free(dp_torchwriter *w);   /* NULL is fine */
DP_API dp_status dp_torchwriter_none(dp_torchwriter *w);
DP_API dp_status dp_torchwriter_bool(dp_torchwriter *w, int v);
DP_API dp_status dp_torchwriter_int(dp_torchwriter *w, int64_t v);
DP_API dp_status dp_torchwriter_float(dp_torchwriter *w, double v);
DP_API dp_status dp_torchwriter_str(dp_torchwriter *w, const char *s, size_t len);
DP_API dp_status dp_torchwriter_dtype(dp_torchwriter *w, dp_dtype dtype);
DP_API dp_status dp_torchwriter_device(dp_torchwriter *w, const char *type, int index);   /* index -1: none */
DP_API dp_status dp_torchwriter_tensor(dp_torchwriter *w, dp_tensor *t);
DP_API dp_status dp_torchwriter_begin(dp_torchwriter *w, dp_pykind kind);   /* LIST, TUPLE, DICT or ODICT */
DP_API dp_status dp_torchwriter_end(dp_torchwriter *w);
DP_API dp_status dp_torchwriter_save(dp_torchwriter *w, const char *path);

/* ---- the program's surroundings: processes, clocks, the machine ----
 *
 * For the launcher, `dplua env` and the Lua library (the sweep driver,
 * progress bars, metrics), so that no Lua code declares libc's functions,
 * structures or constants through the FFI. Processes are this process's
 * children, by pid; signals are numbers (SIGTERM 15, SIGKILL 9). */

/* Starts program (a path, or a name looked up in $PATH; NULL: this dplua
 * program) with argv (argv[0] first, NULL-terminated) and this process's
 * environment with the entries of env put over it ("NAME=VALUE" sets,
 * "NAME" removes; NULL-terminated, or NULL). stdin is /dev/null; stdout
 * and stderr are appended to the files stdout_path and stderr_path
 * (created when absent; one file when the paths are equal; NULL: this
 * process's); signals are at their defaults. A program that cannot run is
 * an error here. */
DP_API dp_status dp_process_spawn(int *pid, const char *program, const char *const *argv, const char *const *env,
                                  const char *stdout_path, const char *stderr_path);
/* Waits at most timeout_s seconds (0: only looks; negative: no limit) for
 * the child pid to end, less when a signal arrives. *exited: 1 when it has
 * ended (and is reaped), else 0; then *exit_code is its exit status, or -1
 * when signal *signo ended it. */
DP_API dp_status dp_process_wait(int pid, double timeout_s, int *exited, int *exit_code, int *signo);
DP_API dp_status dp_process_kill(int pid, int signo);
/* DataLoader's workers: fork() without exec, the child killed when this
 * process dies (the pid, 0 in the child, -1 on failure); pipes
 * (close-on-exec) and whole reads and writes on them (a read returns the
 * bytes read, fewer than n at the pipe's end, -1 on error); a wait for a
 * readable fd (1 readable or at its end, 0 not within timeout_s, -1
 * error); _exit for a child that must not run its parent's exit handlers. */
DP_API int dp_worker_fork(void);
DP_API dp_status dp_pipe_open(int *read_fd, int *write_fd);
DP_API dp_status dp_fd_write_all(int fd, const void *buf, int64_t n);
DP_API int64_t dp_fd_read_all(int fd, void *buf, int64_t n);
DP_API int dp_fd_wait_readable(int fd, double timeout_s);
DP_API void dp_fd_close(int fd);
DP_API void dp_exit_now(int status);
DP_API const char *dp_signal_name(int signo);        /* "SIGTERM"; "signal 40" for others */

/* Seconds on a clock that only goes forward (for durations), and since
 * 1970 (UTC). */
DP_API double dp_clock_monotonic(void);
DP_API double dp_clock_wall(void);
DP_API int dp_sleep(double seconds);                 /* 0, or 1 when a signal ended it early */
DP_API int dp_cpu_count(void);                       /* online CPUs */
/* The CPU kernels' threads (OpenBLAS's): OPENBLAS_NUM_THREADS, else
 * OMP_NUM_THREADS, else one per online CPU until set; n >= 1. */
DP_API dp_status dp_set_num_threads(int n);
/* torch.use_deterministic_algorithms: while on, the GPU ops whose sums
 * depend on the order threads come in (scatter_add and the fold of
 * overlapping windows, atomic adds) take deterministic paths instead */
DP_API void dp_set_deterministic(int on);
DP_API int dp_deterministic(void);
DP_API int dp_get_num_threads(void);
DP_API int dp_is_terminal(int fd);
DP_API dp_status dp_make_dirs(const char *path);     /* mkdir -p */

/* ---- data for language models (src/io/bpe.c, src/io/tokens.c) ----
 *
 * GPT-2's byte-level BPE tokenizer, from GPT-2's encoder.json and
 * vocab.bpe. Text is bytes (any bytes: invalid UTF-8 encodes too); ids
 * and texts that these calls return are malloc'd (free with dp_free).
 * Encoding caches the pieces it has seen, so an encoder is used by one
 * thread at a time. */
typedef struct dp_bpe dp_bpe;
DP_API dp_status dp_bpe_open(dp_bpe **out, const char *encoder_json, const char *vocab_bpe);
DP_API void dp_bpe_close(dp_bpe *b);                 /* NULL is fine */
DP_API int dp_bpe_vocab_size(const dp_bpe *b);
DP_API int dp_bpe_token_id(const dp_bpe *b, const char *bytes, size_t len);   /* -1: no such token */
DP_API const char *dp_bpe_token_bytes(const dp_bpe *b, int id, size_t *len);  /* NULL: no such id */
DP_API dp_status dp_bpe_encode(dp_bpe *b, const char *text, size_t len, int32_t **ids, int64_t *n);
DP_API dp_status dp_bpe_decode(const dp_bpe *b, const int32_t *ids, int64_t n, char **text, size_t *len);

/* Token files: llm.c's .bin shards (a header of 256 int32: magic
 * 20240520, version 1 = uint16 or 2 = uint32 tokens, count) or
 * one-dimensional .npy arrays ('<u2', '<u4', '<i4', '<i8'), mapped into
 * memory and checked against their size at open. windows copies nwin
 * windows of len tokens starting at starts[i] into x (nwin x len int64)
 * and, when y is not NULL, the tokens one further on into y. */
typedef struct dp_token_file dp_token_file;
DP_API dp_status dp_token_file_open(dp_token_file **out, const char *path);
DP_API void dp_token_file_close(dp_token_file *f);   /* NULL is fine */
DP_API int64_t dp_token_file_count(const dp_token_file *f);
DP_API int dp_token_file_width(const dp_token_file *f);   /* bytes per token in the file */
DP_API dp_status dp_token_file_read(const dp_token_file *f, int64_t start, int64_t n, int64_t *dst);
DP_API dp_status dp_token_file_windows(const dp_token_file *f, const int64_t *starts, int64_t nwin, int64_t len,
                                int64_t *x, int64_t *y);
/* Writes a .bin shard: tokens stream into path.tmp.<pid>; close writes the
 * header, fsyncs and renames it over path (and frees the writer, as abort
 * does without writing anything). */
typedef struct dp_token_writer dp_token_writer;
DP_API dp_status dp_token_writer_open(dp_token_writer **out, const char *path, int version);
DP_API dp_status dp_token_writer_write(dp_token_writer *w, const int32_t *ids, int64_t n);
DP_API dp_status dp_token_writer_close(dp_token_writer *w);
DP_API void dp_token_writer_abort(dp_token_writer *w);   /* NULL is fine */
/* DP_CDEF_END */

#ifdef __cplusplus
}
#endif
#endif /* DPLUA_H */
