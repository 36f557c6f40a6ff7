/*
 * dplua.h — the one public C header of dplua.
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
 * This header is also read by LuaJIT's ffi.cdef (lua/dplua/init.lua), so the
 * declarations between the DP_CDEF markers stay plain C without macros.
 * Enums are only ever appended to.
 */
#ifndef DPLUA_H
#define DPLUA_H

#include <stddef.h>
#include <stdint.h>

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

typedef enum {
    DP_FLOAT32 = 0,
    DP_FLOAT64,
    DP_INT64,
    DP_INT32,
    DP_UINT8,
    DP_BOOL,
    DP_BFLOAT16,
    DP_NUM_DTYPES
} dp_dtype;

typedef enum {
    DP_NEG = 0, DP_ABS, DP_EXP, DP_LOG, DP_SQRT, DP_RSQRT, DP_TANH,
    DP_SIGMOID, DP_RELU, DP_GELU, DP_SIN, DP_COS, DP_SIGN, DP_FLOOR,
    DP_CEIL, DP_ROUND, DP_RECIPROCAL, DP_LOG1P, DP_EXPM1, DP_LOGICAL_NOT,
    DP_SQUARE, DP_GELU_TANH,
    DP_NUM_UNOPS
} dp_unop;

typedef enum {
    DP_ADD = 0, DP_SUB, DP_MUL, DP_DIV, DP_POW, DP_MAXIMUM, DP_MINIMUM,
    DP_EQ, DP_NE, DP_LT, DP_LE, DP_GT, DP_GE, DP_REMAINDER, DP_ATAN2,
    DP_LOGICAL_AND, DP_LOGICAL_OR,
    DP_NUM_BINOPS
} dp_binop;

typedef enum {
    DP_SUM = 0, DP_MEAN, DP_PROD, DP_MAX, DP_MIN, DP_ARGMAX, DP_ARGMIN,
    DP_VAR, DP_STD, DP_ALL, DP_ANY,
    DP_NUM_REDOPS
} dp_redop;

/* errors and versions */
const char *dp_last_error(void);
const char *dp_version(void);
const char *dp_build_options(void);

/* lifetime: every tensor returned through `out` must be released once */
void dp_tensor_retain(dp_tensor *t);
void dp_tensor_release(dp_tensor *t);
/* The Lua binding's tensor object: a box whose finalizer is this C
 * function, so that collecting a tensor runs no Lua code. */
typedef struct dp_tensor_box { dp_tensor *p; } dp_tensor_box;
void dp_tensor_box_release(dp_tensor_box *box);

/* inspection (never fail) */
int dp_tensor_dtype(const dp_tensor *t);
int dp_tensor_device(const dp_tensor *t);
int dp_tensor_ndim(const dp_tensor *t);
int64_t dp_tensor_size(const dp_tensor *t, int dim);
int64_t dp_tensor_stride(const dp_tensor *t, int dim);
int64_t dp_tensor_numel(const dp_tensor *t);
int64_t dp_tensor_offset(const dp_tensor *t);
int dp_tensor_is_contiguous(const dp_tensor *t);
void *dp_tensor_data(const dp_tensor *t);      /* first element; CPU only */
const char *dp_dtype_name(int dtype);
size_t dp_dtype_size(int dtype);
int dp_dtype_is_floating(int dtype);
int dp_dtype_holds(int dtype, double value);   /* value converts to dtype without overflow */
int64_t dp_memory_allocated(int device);
int64_t dp_max_memory_allocated(int device);

/* creation */
dp_status dp_empty(dp_tensor **out, int ndim, const int64_t *shape, int dtype, int device);
dp_status dp_full(dp_tensor **out, int ndim, const int64_t *shape, double value, int dtype, int device);
dp_status dp_arange(dp_tensor **out, double start, double end, double step, int dtype, int device);
dp_status dp_linspace(dp_tensor **out, double start, double end, int64_t steps, int dtype, int device);
dp_status dp_eye(dp_tensor **out, int64_t n, int64_t m, int dtype, int device);
dp_status dp_rand(dp_tensor **out, int ndim, const int64_t *shape, int dtype, int device);
dp_status dp_randn(dp_tensor **out, int ndim, const int64_t *shape, int dtype, int device);
dp_status dp_randint(dp_tensor **out, int64_t low, int64_t high, int ndim, const int64_t *shape, int dtype, int device);
void dp_manual_seed(uint64_t seed);
void dp_rng_get_state(uint64_t *seed, uint64_t *offset);
void dp_rng_set_state(uint64_t seed, uint64_t offset);

/* views: share storage with the input */
dp_status dp_view(dp_tensor **out, dp_tensor *t, int ndim, const int64_t *shape);
dp_status dp_reshape(dp_tensor **out, dp_tensor *t, int ndim, const int64_t *shape);
dp_status dp_permute(dp_tensor **out, dp_tensor *t, int ndim, const int *dims);
dp_status dp_transpose(dp_tensor **out, dp_tensor *t, int dim0, int dim1);
dp_status dp_expand(dp_tensor **out, dp_tensor *t, int ndim, const int64_t *shape);
dp_status dp_slice(dp_tensor **out, dp_tensor *t, int dim, int64_t start, int64_t stop, int64_t step);
dp_status dp_narrow(dp_tensor **out, dp_tensor *t, int dim, int64_t start, int64_t length);
dp_status dp_select(dp_tensor **out, dp_tensor *t, int dim, int64_t index);
dp_status dp_squeeze(dp_tensor **out, dp_tensor *t, int dim);   /* DP_ALL_DIMS: every size-1 dim */
dp_status dp_unsqueeze(dp_tensor **out, dp_tensor *t, int dim);
dp_status dp_contiguous(dp_tensor **out, dp_tensor *t);         /* t itself (retained) when already contiguous */
dp_status dp_alias(dp_tensor **out, dp_tensor *t);              /* a new handle on the same view (detach) */

/* math: new results */
dp_status dp_unary(dp_tensor **out, int op, dp_tensor *a);
dp_status dp_binary(dp_tensor **out, int op, dp_tensor *a, dp_tensor *b);
dp_status dp_binary_scalar(dp_tensor **out, int op, dp_tensor *a, double s, int scalar_first);
dp_status dp_where(dp_tensor **out, dp_tensor *cond, dp_tensor *a, dp_tensor *b);
dp_status dp_clamp(dp_tensor **out, dp_tensor *a, double lo, double hi);  /* NaN: no bound */
dp_status dp_reduce(dp_tensor **out, int op, dp_tensor *a, int dim, int keepdim, int correction);
dp_status dp_reduce_with_index(dp_tensor **values, dp_tensor **indices, int op, dp_tensor *a, int dim, int keepdim);
dp_status dp_softmax(dp_tensor **out, dp_tensor *a, int dim, int log);
dp_status dp_matmul(dp_tensor **out, dp_tensor *a, dp_tensor *b);
dp_status dp_mm(dp_tensor **out, dp_tensor *a, dp_tensor *b);
dp_status dp_bmm(dp_tensor **out, dp_tensor *a, dp_tensor *b);
dp_status dp_index_select(dp_tensor **out, dp_tensor *a, int dim, dp_tensor *index);
dp_status dp_gather(dp_tensor **out, dp_tensor *a, int dim, dp_tensor *index);
dp_status dp_cat(dp_tensor **out, int n, dp_tensor *const *ts, int dim);
dp_status dp_stack(dp_tensor **out, int n, dp_tensor *const *ts, int dim);
dp_status dp_to(dp_tensor **out, dp_tensor *a, int dtype, int device); /* a itself (retained) when nothing changes */
dp_status dp_clone(dp_tensor **out, dp_tensor *a);

/* math: in place, into an existing tensor (dst may alias an input) */
dp_status dp_unary_into(dp_tensor *dst, int op, dp_tensor *a);
dp_status dp_binary_into(dp_tensor *dst, int op, dp_tensor *a, dp_tensor *b);
dp_status dp_binary_scalar_into(dp_tensor *dst, int op, dp_tensor *a, double s, int scalar_first);
dp_status dp_clamp_into(dp_tensor *dst, dp_tensor *a, double lo, double hi);
dp_status dp_copy_(dp_tensor *dst, dp_tensor *src);  /* broadcasts src, casts dtype */
dp_status dp_fill_(dp_tensor *dst, double value);

/* scalars */
dp_status dp_item(dp_tensor *t, double *value);
dp_status dp_item_int64(dp_tensor *t, int64_t *value);

/* autograd: a tape recorded by the ops above while grad mode is on */
int dp_set_grad_enabled(int enabled);       /* returns the previous mode */
int dp_is_grad_enabled(void);
dp_status dp_set_requires_grad(dp_tensor *t, int requires_grad);
int dp_requires_grad(const dp_tensor *t);
int dp_is_leaf(const dp_tensor *t);
const char *dp_grad_fn_name(const dp_tensor *t);         /* NULL for leaves */
dp_tensor *dp_get_grad(dp_tensor *t);                    /* a new reference, or NULL */
dp_status dp_set_grad(dp_tensor *t, dp_tensor *grad);    /* NULL clears */
dp_status dp_set_grad_slot(dp_tensor *t, dp_tensor *slot); /* gradients are written into slot */
dp_status dp_backward(dp_tensor *root, dp_tensor *grad, int retain_graph); /* grad NULL: ones */
/* How many ReLU backwards were folded into the backward of the layer after
 * them (see ag_offered_mask in src/core/autograd.h) since the start: for
 * tests, and to see whether a model's ReLUs fold. */
int64_t dp_relu_backwards_folded(void);
typedef void (*dp_grad_hook)(dp_tensor *leaf, void *ctx);
dp_status dp_add_grad_hook(dp_tensor *leaf, dp_grad_hook fn, void *ctx);
void dp_clear_grad_hooks(dp_tensor *leaf);

/* nn: fused ops with their own backward */
dp_status dp_linear(dp_tensor **out, dp_tensor *x, dp_tensor *w, dp_tensor *b);
/* relu(linear(x, w, b)), one node on the tape (nn.Sequential fuses a
 * Linear followed by a ReLU through it). */
/* act(x @ w^T + b), act DP_RELU, DP_GELU or DP_GELU_TANH, as one node; b may be NULL */
dp_status dp_linear_act(dp_tensor **out, dp_tensor *x, dp_tensor *w, dp_tensor *b, int act);
/* reduction: 0 none, 1 mean, 2 sum; log_probs: the input holds log-probabilities (nll_loss) */
dp_status dp_cross_entropy(dp_tensor **out, dp_tensor *input, dp_tensor *target, dp_tensor *weight,
                           int64_t ignore_index, double label_smoothing, int reduction, int log_probs);
/* im2col: x (N, C, H, W) -> (N, C*kh*kw, L); padding reads pad_value */
dp_status dp_unfold(dp_tensor **out, dp_tensor *x, const int64_t *kernel, const int64_t *stride,
                    const int64_t *padding, const int64_t *dilation, double pad_value);
/* softmax(q @ k^T * scale) @ v over q (..., L, E), k (..., S, E), v (..., S, Ev)
 * of one float dtype and the same leading dims, without materialising the
 * (L, S) weights; is_causal: query i attends to keys j <= i. Only when
 * dp_attention_fused says a kernel takes the inputs (src/core/attention.c). */
int dp_attention_fused(const dp_tensor *q, const dp_tensor *k, const dp_tensor *v);
dp_status dp_scaled_dot_product_attention(dp_tensor **out, dp_tensor *q, dp_tensor *k, dp_tensor *v, int is_causal,
                                          double scale);

/* optim: one fused pass over a flat buffer (param, grad and state alike) */
dp_status dp_sgd_step(dp_tensor *param, dp_tensor *grad, dp_tensor *momentum_buf, double lr, double momentum,
                      double dampening, int nesterov, double weight_decay, int first_step);
dp_status dp_adam_step(dp_tensor *param, dp_tensor *grad, dp_tensor *exp_avg, dp_tensor *exp_avg_sq,
                       dp_tensor *max_exp_avg_sq, double lr, double beta1, double beta2, double eps,
                       double weight_decay, int decoupled, int64_t step);
/* The same with the step count in a 0-d float64 tensor on the parameters'
 * device, incremented by the call (capturable Adam). */
dp_status dp_adam_step_t(dp_tensor *param, dp_tensor *grad, dp_tensor *exp_avg, dp_tensor *exp_avg_sq,
                         dp_tensor *max_exp_avg_sq, double lr, double beta1, double beta2, double eps,
                         double weight_decay, int decoupled, dp_tensor *step);
/* An optimizer bucket's check before its fused step: every parameter
 * must still be the view at offsets[j] of flat_param (an error naming fn
 * otherwise); *any: some parameter has a gradient; *all: every one has,
 * and each is its slot at offsets[j] of flat_grad. */
dp_status dp_flat_grad_status(const char *fn, dp_tensor *flat_param, dp_tensor *flat_grad, int n,
                              dp_tensor *const *params, const int64_t *offsets, int *all, int *any);
/* Moves params into one flat buffer (each param becomes a view of it) and
 * gives them grad slots in a flat gradient buffer; params that already
 * form such a group get their existing buffers back. */
dp_status dp_flatten_params(dp_tensor **flat_param, dp_tensor **flat_grad, int n, dp_tensor *const *params);

/* data files: an IDX file (MNIST's format), gzip-compressed or not, as a
 * tensor of its element type (uint8 -> uint8, int32 -> int32, float -> float32, double -> float64) */
dp_status dp_load_idx(dp_tensor **out, const char *path);

/* distributed: the rendezvous store and process groups (src/dist).
 * Rank 0 serves the store (a TCP key-value server on a background thread);
 * every rank is a client. Only clients presenting the job's token are
 * served. Blocking calls take a timeout in seconds and fail with a message
 * instead of hanging. */
typedef struct dp_store dp_store;
typedef struct dp_pg dp_pg;
typedef struct dp_work dp_work;
typedef enum { DP_RED_SUM = 0, DP_RED_AVG, DP_RED_MAX, DP_RED_MIN, DP_RED_PRODUCT } dp_redop_dist;

/* is_server: bind host:port (port 0 picks a free one) and serve; rank is
 * the client's rank (-1 if none), so the server can tell who went away;
 * generation: which initialisation of the job this is (a store of
 * another refuses the client, which retries until timeout_s). */
dp_status dp_store_open(dp_store **out, const char *host, int port, int is_server, int rank,
                        const char *token, int64_t generation, double timeout_s);
/* The client protocol of PyTorch's TCPStore (torchrun's agent store). */
dp_status dp_store_open_torch(dp_store **out, const char *host, int port, double timeout_s);
int dp_store_port(const dp_store *s);
dp_status dp_store_set(dp_store *s, const char *key, const void *value, size_t len);
/* Waits for the key; *value is malloc'd (free with dp_free). */
dp_status dp_store_get(dp_store *s, const char *key, void **value, size_t *len, double timeout_s);
dp_status dp_store_add(dp_store *s, const char *key, int64_t delta, int64_t *result);
/* Sets key to desired if its value equals expected (or it is absent and
 * expected_len is 0); *current gets the value after the call. */
dp_status dp_store_compare_set(dp_store *s, const char *key, const void *expected, size_t expected_len,
                               const void *desired, size_t desired_len, void **current, size_t *current_len);
dp_status dp_store_wait(dp_store *s, const char *const *keys, int n, double timeout_s);
dp_status dp_store_check(dp_store *s, const char *const *keys, int n, int *all_present);
dp_status dp_store_delete(dp_store *s, const char *key, int *deleted);
void dp_store_close(dp_store *s);
void dp_free(void *p);

/* A process group over the store. backend: "gloo" (CPU tensors) or "nccl"
 * (CUDA tensors). ranks: the members' global ranks (NULL: all of 0..size-1);
 * name keeps different groups' keys apart. */
dp_status dp_pg_new(dp_pg **out, dp_store *store, const char *backend, int rank, int size,
                    double timeout_s, const char *name, const int *ranks);
int dp_pg_rank(const dp_pg *pg);
int dp_pg_size(const dp_pg *pg);
const char *dp_pg_backend(const dp_pg *pg);
uint64_t dp_pg_seq(const dp_pg *pg);
/* Collectives: work NULL runs synchronously; else *work is a handle to
 * wait on. Tensors must be contiguous. */
dp_status dp_pg_all_reduce(dp_pg *pg, dp_tensor *t, int op, dp_work **work);
dp_status dp_pg_broadcast(dp_pg *pg, dp_tensor *t, int root, dp_work **work);
dp_status dp_pg_reduce(dp_pg *pg, dp_tensor *t, int root, int op, dp_work **work);
dp_status dp_pg_all_gather(dp_pg *pg, dp_tensor *out, dp_tensor *in, dp_work **work);   /* out: size * numel(in) */
dp_status dp_pg_reduce_scatter(dp_pg *pg, dp_tensor *out, dp_tensor *in, int op, dp_work **work); /* in: size * numel(out) */
dp_status dp_pg_all_to_all(dp_pg *pg, dp_tensor *out, dp_tensor *in, dp_work **work);  /* equal splits along dim 0 */
dp_status dp_pg_send(dp_pg *pg, dp_tensor *t, int dst, int tag);
dp_status dp_pg_recv(dp_pg *pg, dp_tensor *t, int src, int tag);
dp_status dp_pg_barrier(dp_pg *pg);
void dp_pg_free(dp_pg *pg);
dp_status dp_work_wait(dp_work *w);
int dp_work_is_completed(dp_work *w);
void dp_work_free(dp_work *w);

/* DistributedDataParallel's reducer: gradient buckets over the flat
 * gradient buffer, all-reduced (AVG) from grad-ready hooks during backward;
 * backward returns once they are done. */
typedef struct dp_ddp dp_ddp;
dp_status dp_ddp_new(dp_ddp **out, dp_pg *pg, int n, dp_tensor *const *params, const char *const *names,
                     int64_t first_bucket_bytes, int64_t bucket_bytes, int find_unused);
void dp_ddp_set_sync(dp_ddp *d, int sync);   /* 0 inside no_sync(): gradients accumulate locally */
int dp_ddp_num_buckets(const dp_ddp *d);
dp_status dp_ddp_bucket_range(const dp_ddp *d, int i, int64_t *start, int64_t *end);
dp_tensor *dp_ddp_flat_param(dp_ddp *d);     /* a new reference */
void dp_ddp_free(dp_ddp *d);

/* CUDA devices (0 and clear errors in a build without CUDA) */
int dp_cuda_device_count(void);
dp_status dp_cuda_synchronize(int device);
void dp_cuda_set_allow_tf32(int allow);
void dp_reset_peak_memory_stats(int device);

/* torch.cuda's memory and device queries. empty_cache gives the pool's
 * cached memory back to the driver (a no-op without CUDA). */
dp_status dp_cuda_empty_cache(int device);
dp_status dp_cuda_memory_reserved(int device, int64_t *now, int64_t *peak);
dp_status dp_cuda_mem_get_info(int device, int64_t *free_bytes, int64_t *total_bytes);
dp_status dp_cuda_device_properties(int device, char *name, size_t name_len, int64_t *total_memory, int *major,
                                    int *minor, int *multiprocessors);

/* Streams and events (cudaStream_t / cudaEvent_t as void *). Each device
 * has a current stream (NULL: its legacy default stream) where the
 * kernels and copies of its tensors go. Synchronisations also raise the
 * errors that kernels found since the last one (a bad class index...). */
dp_status dp_cuda_stream_new(void **stream, int device);
void dp_cuda_stream_free(void *stream);
dp_status dp_cuda_set_stream(int device, void *stream);
void *dp_cuda_current_stream(int device);
dp_status dp_cuda_stream_synchronize(void *stream);
dp_status dp_cuda_stream_query(void *stream, int *done);
dp_status dp_cuda_stream_wait_event(void *stream, void *event);
dp_status dp_cuda_event_new(void **event, int device, int timing);
void dp_cuda_event_free(void *event);
dp_status dp_cuda_event_record(void *event, void *stream);
dp_status dp_cuda_event_synchronize(void *event);
dp_status dp_cuda_event_query(void *event, int *done);
dp_status dp_cuda_event_elapsed(double *ms, void *start, void *end);

/* CUDA graphs: begin makes a capture stream current on the device; what
 * runs until end (keep = 0 discards it, after an error) is recorded, not
 * executed, and replay runs it on the current stream. Memory allocated
 * during the capture belongs to the graph (see docs/API.md). */
typedef struct dp_cuda_graph dp_cuda_graph;
int dp_cuda_capturing(void);   /* 1 while a capture is under way */
/* How many times a small Linear and the ReLU or GELU after it ran as one
 * launch (src/core/gpu.c, "the deferred Linear") */
int64_t dp_cuda_linear_fusions(void);
/* Whether small Linears wait to share a launch (on by default); tests turn
 * it off to compare with each op's own launch. */
void dp_cuda_set_deferral(int on);
/* Launches the deferred Linear now if one waits: for work that another
 * thread will queue (a process group's collectives) */
void dp_cuda_launch_deferred(void);
dp_status dp_cuda_graph_begin(dp_cuda_graph **out, int device);
dp_status dp_cuda_graph_end(dp_cuda_graph *g, int keep);
dp_status dp_cuda_graph_replay(dp_cuda_graph *g);
void dp_cuda_graph_free(dp_cuda_graph *g);

/* memory pressure: tensors are freed by Lua's GC, which does not see their
 * size; the binding collects when this says enough was allocated */
int dp_gc_wanted(void);
void dp_gc_done(double lua_heap_kb);   /* after the collection: collectgarbage("count") */

/* checkpoints: the safetensors format (src/core/safetensors.c). A reader
 * opens and validates the whole header (every failure names the file and
 * the problem); tensors are then read one at a time, in header order, into
 * new CPU tensors. Names and metadata are valid while the reader is open. */
typedef struct dp_safetensors dp_safetensors;
dp_status dp_safetensors_open(dp_safetensors **out, const char *path);
int dp_safetensors_count(const dp_safetensors *f);
const char *dp_safetensors_name(const dp_safetensors *f, int i);
dp_status dp_safetensors_tensor(dp_tensor **out, const dp_safetensors *f, int i);
int dp_safetensors_metadata_count(const dp_safetensors *f);
const char *dp_safetensors_metadata_key(const dp_safetensors *f, int i);
const char *dp_safetensors_metadata_value(const dp_safetensors *f, int i);
void dp_safetensors_close(dp_safetensors *f);   /* NULL is fine */
/* Writes n tensors (any device, any layout) and n_meta metadata strings
 * atomically: into path.tmp.<pid>, fsync, rename over path, fsync the
 * directory. Names must be distinct valid UTF-8. */
dp_status dp_safetensors_save(const char *path, int n, const char *const *names, dp_tensor *const *tensors,
                              int n_meta, const char *const *meta_keys, const char *const *meta_values);

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
dp_status dp_process_spawn(int *pid, const char *program, const char *const *argv, const char *const *env,
                           const char *stdout_path, const char *stderr_path);
/* Waits at most timeout_s seconds (0: only looks; negative: no limit) for
 * the child pid to end, less when a signal arrives. *exited: 1 when it has
 * ended (and is reaped), else 0; then *exit_code is its exit status, or -1
 * when signal *signo ended it. */
dp_status dp_process_wait(int pid, double timeout_s, int *exited, int *exit_code, int *signo);
dp_status dp_process_kill(int pid, int signo);
const char *dp_signal_name(int signo);        /* "SIGTERM"; "signal 40" for others */

/* Seconds on a clock that only goes forward (for durations), and since
 * 1970 (UTC). */
double dp_clock_monotonic(void);
double dp_clock_wall(void);
int dp_sleep(double seconds);                 /* 0, or 1 when a signal ended it early */
int dp_cpu_count(void);                       /* online CPUs */
int dp_is_terminal(int fd);
dp_status dp_make_dirs(const char *path);     /* mkdir -p */

/* The launcher, `dplua --nproc_per_node=N script.lua args...`
 * (src/dist/launch.c, docs/DISTRIBUTED.md): starts the ranks of this node
 * and ends them all when one fails. argv[0] is the program, argv[1] the
 * first launcher flag. Returns the exit status: 0 when every rank exited
 * 0; the status of the first rank that failed (128 + signal number when a
 * signal killed it); 128 + the signal when the launcher was interrupted;
 * 2 for a bad command line; 1 when the ranks could not be started. */
int dp_launch_main(int argc, char **argv);
int dp_launch_is_flag(const char *arg);       /* "--nproc-per-node=4", "--tee": '_' or '-' */

/* `dplua env`: the libraries and devices of this build, one fact at a
 * time ("CUDA runtime", "13.0"), values that say why when something is
 * missing; never fails. dp_cuda_devices: *count GPUs, or an error that
 * says why there are none. */
typedef void (*dp_fact_fn)(const char *key, const char *value, void *ctx);
void dp_env_facts(dp_fact_fn fn, void *ctx);
dp_status dp_cuda_devices(int *count);
/* DP_CDEF_END */

#ifdef __cplusplus
}
#endif
#endif /* DPLUA_H */
