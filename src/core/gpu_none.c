/*
 * gpu_none.c — the CUDA side of the op table in a build without CUDA: no
 * tensor can be on a GPU, and every entry point says so clearly.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#ifndef DP_HAVE_CUDA
#include "dplua_cuda.h"
#include "dplua_internal.h"
#include "core/kernels.h"

static dp_status no_cuda(void)
{
    return dp_fail(DP_ERR_DEVICE, "this build of dplua has no CUDA backend (configure --with-cuda)");
}

dp_status gpu_storage_alloc(void **data, void **pool, size_t nbytes, int device)
{
    (void)data; (void)pool; (void)nbytes; (void)device;
    return no_cuda();
}
void gpu_storage_free(void *data, size_t nbytes, void *pool, int device)
{
    (void)data;
    (void)nbytes;
    (void)pool;
    (void)device;
}
dp_status gpu_host_alloc(void **data, size_t nbytes)
{
    (void)data; (void)nbytes;
    return dp_fail(DP_ERR_DEVICE, "pin_memory: pinned host memory serves copies to a GPU, and this build of dplua "
                   "has no CUDA backend (configure --with-cuda)");
}
void gpu_host_free(void *data, void *copy_event) { (void)data; (void)copy_event; }
dp_status gpu_upload_queued(dp_tensor *dst, dp_tensor *src) { (void)dst; (void)src; return no_cuda(); }
dp_status gpu_pinned_wait(dp_storage *s) { (void)s; return DP_OK; }
int dp_cuda_capturing(void) { return 0; }
int64_t dp_cuda_linear_fusions(void) { return 0; }
void dp_cuda_set_deferral(int on) { (void)on; }
void dp_cuda_launch_deferred(void) {}
dp_status dp_cuda_stream_new(void **stream, int device) { *stream = NULL; (void)device; return no_cuda(); }
dp_status dp_cuda_empty_cache(int device) { (void)device; return DP_OK; }
dp_status dp_cuda_memory_reserved(int device, int64_t *now, int64_t *peak)
{ (void)device; *now = *peak = 0; return no_cuda(); }
dp_status dp_cuda_mem_get_info(int device, int64_t *free_bytes, int64_t *total_bytes)
{ (void)device; *free_bytes = *total_bytes = 0; return no_cuda(); }
dp_status dp_cuda_device_properties(int device, char *name, size_t name_len, int64_t *total_memory, int *major,
                                    int *minor, int *multiprocessors)
{
    (void)device; (void)name_len;
    name[0] = 0;
    *total_memory = 0;
    *major = *minor = *multiprocessors = 0;
    return no_cuda();
}
void dp_cuda_stream_free(void *stream) { (void)stream; }
dp_status dp_cuda_set_stream(int device, void *stream) { (void)device; (void)stream; return no_cuda(); }
void *dp_cuda_current_stream(int device) { (void)device; return NULL; }
dp_status dp_cuda_stream_synchronize(void *stream) { (void)stream; return no_cuda(); }
dp_status dp_cuda_stream_query(void *stream, int *done) { (void)stream; *done = 1; return no_cuda(); }
dp_status dp_cuda_stream_wait_event(void *stream, void *event) { (void)stream; (void)event; return no_cuda(); }
dp_status dp_cuda_event_new(void **event, int device, int timing)
{ *event = NULL; (void)device; (void)timing; return no_cuda(); }
void dp_cuda_event_free(void *event) { (void)event; }
dp_status dp_cuda_event_record(void *event, void *stream) { (void)event; (void)stream; return no_cuda(); }
dp_status dp_cuda_event_synchronize(void *event) { (void)event; return no_cuda(); }
dp_status dp_cuda_event_query(void *event, int *done) { (void)event; *done = 1; return no_cuda(); }
dp_status dp_cuda_event_elapsed(double *ms, void *start, void *end)
{ *ms = 0; (void)start; (void)end; return no_cuda(); }
dp_status dp_cuda_graph_begin(dp_cuda_graph **out, int device) { *out = NULL; (void)device; return no_cuda(); }
dp_status dp_cuda_graph_end(dp_cuda_graph *g, int keep) { (void)g; (void)keep; return no_cuda(); }
dp_status dp_cuda_graph_replay(dp_cuda_graph *g) { (void)g; return no_cuda(); }
void dp_cuda_graph_free(dp_cuda_graph *g) { (void)g; }
dp_status dp_cuda_profile_start(void) { return no_cuda(); }
dp_status dp_cuda_profile_stop(int *rows, int64_t *dropped, double *span_ms)
{ *rows = 0; *dropped = 0; *span_ms = 0; return no_cuda(); }
dp_status dp_cuda_profile_row(int i, const char **name, int64_t *calls, double *ms)
{ (void)i; *name = ""; *calls = 0; *ms = 0; return no_cuda(); }
int dp_cuda_device_count(void) { return 0; }
dp_status dp_cuda_synchronize(int device) { (void)device; return no_cuda(); }
void dp_cuda_set_allow_tf32(int allow) { (void)allow; }
dp_status gpu_unary(int op, dp_tensor *out, dp_tensor *a) { (void)op; (void)out; (void)a; return no_cuda(); }
dp_status gpu_binary(int op, dp_tensor *out, dp_tensor *a, dp_tensor *b)
{ (void)op; (void)out; (void)a; (void)b; return no_cuda(); }
dp_status gpu_unary_backward(int op, dp_tensor *dx, dp_tensor *g, dp_tensor *x, dp_tensor *y)
{ (void)op; (void)dx; (void)g; (void)x; (void)y; return no_cuda(); }
dp_status gpu_where(dp_tensor *out, dp_tensor *cond, dp_tensor *a, dp_tensor *b)
{ (void)out; (void)cond; (void)a; (void)b; return no_cuda(); }
dp_status gpu_clamp(dp_tensor *out, dp_tensor *a, double lo, double hi)
{ (void)out; (void)a; (void)lo; (void)hi; return no_cuda(); }
dp_status gpu_copy(dp_tensor *dst, dp_tensor *src) { (void)dst; (void)src; return no_cuda(); }
dp_status gpu_fill(dp_tensor *dst, double value) { (void)dst; (void)value; return no_cuda(); }
bool gpu_any(int what, dp_tensor *t) { (void)what; (void)t; return false; }
int gpu_deferred_holds(const dp_tensor *t) { (void)t; return 0; }
dp_status gpu_random(dp_tensor *t, int kind, uint64_t counter, uint64_t key, int64_t low, uint64_t range)
{ (void)t; (void)kind; (void)counter; (void)key; (void)low; (void)range; return no_cuda(); }
dp_status gpu_dropout(dp_tensor *out, dp_tensor *in, uint64_t counter, uint64_t key, double p)
{ (void)out; (void)in; (void)counter; (void)key; (void)p; return no_cuda(); }
dp_status gpu_reduce(int op, dp_tensor *out, dp_tensor *indices, dp_tensor *a, int dim, int correction)
{ (void)op; (void)out; (void)indices; (void)a; (void)dim; (void)correction; return no_cuda(); }
dp_status gpu_softmax(dp_tensor *out, dp_tensor *a, int dim, int log)
{ (void)out; (void)a; (void)dim; (void)log; return no_cuda(); }
dp_status gpu_bmm(dp_tensor *out, dp_tensor *a, dp_tensor *b) { (void)out; (void)a; (void)b; return no_cuda(); }
dp_status gpu_linear(dp_tensor *out, dp_tensor *x, dp_tensor *w, dp_tensor *b)
{ (void)out; (void)x; (void)w; (void)b; return no_cuda(); }
dp_status gpu_linear_backward(dp_tensor *dx, dp_tensor *dw, dp_tensor *db, dp_tensor *g, dp_tensor *x, dp_tensor *w,
                              dp_tensor *mask, int op)
{ (void)dx; (void)dw; (void)db; (void)g; (void)x; (void)w; (void)mask; (void)op; return no_cuda(); }
dp_status gpu_linear_act(dp_tensor *out, dp_tensor *pre, dp_tensor *x, dp_tensor *w, dp_tensor *b, int act)
{ (void)out; (void)pre; (void)x; (void)w; (void)b; (void)act; return no_cuda(); }
dp_status gpu_index_select(dp_tensor *out, dp_tensor *a, int dim, dp_tensor *index)
{ (void)out; (void)a; (void)dim; (void)index; return no_cuda(); }
dp_status gpu_index_add(dp_tensor *out, int dim, dp_tensor *index, dp_tensor *src)
{ (void)out; (void)dim; (void)index; (void)src; return no_cuda(); }
dp_status gpu_gather(dp_tensor *out, dp_tensor *a, int dim, dp_tensor *index)
{ (void)out; (void)a; (void)dim; (void)index; return no_cuda(); }
dp_status gpu_scatter_add(dp_tensor *out, int dim, dp_tensor *index, dp_tensor *src)
{ (void)out; (void)dim; (void)index; (void)src; return no_cuda(); }
dp_status gpu_scatter(dp_tensor *out, int dim, dp_tensor *index, dp_tensor *src)
{ (void)out; (void)dim; (void)index; (void)src; return no_cuda(); }
dp_status gpu_argsort(dp_tensor *indices, dp_tensor *a, int descending)
{ (void)indices; (void)a; (void)descending; return no_cuda(); }
dp_status gpu_cumsum(dp_tensor *out, dp_tensor *a, int reverse) { (void)out; (void)a; (void)reverse; return no_cuda(); }
dp_status gpu_multinomial(dp_tensor *out, dp_tensor *cdf, dp_tensor *u) { (void)out; (void)cdf; (void)u; return no_cuda(); }
dp_status gpu_put(dp_tensor *dst, dp_tensor *index, dp_tensor *src)
{ (void)dst; (void)index; (void)src; return no_cuda(); }
dp_status gpu_cross_entropy(dp_tensor *out, cpu_ce_args *a) { (void)out; (void)a; return no_cuda(); }
bool gpu_cross_entropy_fuses(const dp_tensor *input) { (void)input; return false; }
dp_status gpu_cross_entropy_backward(dp_tensor *dinput, dp_tensor *g, const cpu_ce_args *a)
{ (void)dinput; (void)g; (void)a; return no_cuda(); }
dp_status gpu_classifier_loss(dp_tensor *out, dp_tensor *lse, dp_tensor *denom, const cpu_ce_args *a)
{ (void)out; (void)lse; (void)denom; (void)a; return no_cuda(); }
dp_status gpu_classifier_backward(dp_tensor *dinput, dp_tensor *g, dp_tensor *lse, const cpu_ce_args *a)
{ (void)dinput; (void)g; (void)lse; (void)a; return no_cuda(); }
dp_status gpu_unfold(dp_tensor *cols, dp_tensor *x, const cpu_unfold_args *u)
{ (void)cols; (void)x; (void)u; return no_cuda(); }
dp_status gpu_fold_add(dp_tensor *x, dp_tensor *cols, const cpu_unfold_args *u)
{ (void)x; (void)cols; (void)u; return no_cuda(); }
dp_status gpu_lstm_gates(dp_tensor *out, dp_tensor *gi, dp_tensor *gh, dp_tensor *c)
{ (void)out; (void)gi; (void)gh; (void)c; return no_cuda(); }
dp_status gpu_lstm_gates_backward(dp_tensor *dgates, dp_tensor *dc, dp_tensor *dout, dp_tensor *gi, dp_tensor *gh,
                                  dp_tensor *c, dp_tensor *c1)
{ (void)dgates; (void)dc; (void)dout; (void)gi; (void)gh; (void)c; (void)c1; return no_cuda(); }
dp_status gpu_gru_gates(dp_tensor *out, dp_tensor *gi, dp_tensor *gh, dp_tensor *h)
{ (void)out; (void)gi; (void)gh; (void)h; return no_cuda(); }
dp_status gpu_gru_gates_backward(dp_tensor *dgi, dp_tensor *dgh, dp_tensor *dh, dp_tensor *dout, dp_tensor *gi,
                                 dp_tensor *gh, dp_tensor *h)
{ (void)dgi; (void)dgh; (void)dh; (void)dout; (void)gi; (void)gh; (void)h; return no_cuda(); }
dp_status gpu_sgd_step(dp_tensor *p, dp_tensor *g, dp_tensor *buf, double lr, double momentum,
                       double dampening, int nesterov, double weight_decay, int first_step)
{
    (void)p; (void)g; (void)buf; (void)lr; (void)momentum; (void)dampening; (void)nesterov; (void)weight_decay;
    (void)first_step;
    return no_cuda();
}
dp_status gpu_adam_step(dp_tensor *p, dp_tensor *g, dp_tensor *m, dp_tensor *v, dp_tensor *vmax,
                        dp_tensor *master, double lr, double beta1, double beta2, double eps, double weight_decay,
                        int decoupled, int64_t step, dp_tensor *step_t)
{
    (void)p; (void)g; (void)m; (void)v; (void)vmax; (void)master; (void)lr; (void)beta1; (void)beta2; (void)eps;
    (void)weight_decay; (void)decoupled; (void)step; (void)step_t;
    return no_cuda();
}
dp_status gpu_rule_step(const optim_rule *r, dp_tensor *p, dp_tensor *g, dp_tensor *const state[3])
{
    (void)r; (void)p; (void)g; (void)state;
    return no_cuda();
}

int gpu_attention_takes(int dtype, int64_t E, int64_t Ev)
{
    (void)dtype; (void)E; (void)Ev;
    return 0;
}
dp_status gpu_attention_forward(const cpu_attention_args *a, dp_tensor *out, dp_tensor *lse)
{
    (void)a; (void)out; (void)lse;
    return no_cuda();
}
dp_status gpu_attention_backward(const cpu_attention_args *a, dp_tensor *out, dp_tensor *dout, dp_tensor *lse,
                                 dp_tensor *dq, dp_tensor *dk, dp_tensor *dv)
{
    (void)a; (void)out; (void)dout; (void)lse; (void)dq; (void)dk; (void)dv;
    return no_cuda();
}
dp_status gpu_layer_norm(const cpu_norm_args *a, dp_tensor *out, dp_tensor *sum, dp_tensor *mean, dp_tensor *rstd)
{
    (void)a; (void)out; (void)sum; (void)mean; (void)rstd;
    return no_cuda();
}
dp_status gpu_layer_norm_backward(const cpu_norm_args *a, dp_tensor *dy, dp_tensor *mean, dp_tensor *rstd,
                                  dp_tensor *dx, dp_tensor *dw, dp_tensor *db)
{
    (void)a; (void)dy; (void)mean; (void)rstd; (void)dx; (void)dw; (void)db;
    return no_cuda();
}
dp_status gpu_batch_norm(const cpu_bn_args *a, dp_tensor *out, dp_tensor *mean, dp_tensor *invstd)
{
    (void)a; (void)out; (void)mean; (void)invstd;
    return no_cuda();
}
dp_status gpu_batch_norm_backward(const cpu_bn_args *a, dp_tensor *dy, dp_tensor *mean, dp_tensor *invstd,
                                  dp_tensor *dx, dp_tensor *dw, dp_tensor *db)
{
    (void)a; (void)dy; (void)mean; (void)invstd; (void)dx; (void)dw; (void)db;
    return no_cuda();
}
#endif /* !DP_HAVE_CUDA */
