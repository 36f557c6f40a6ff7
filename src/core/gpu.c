/*
 * gpu.c — the CUDA side of the op table: turns tensors into the pointer
 * and stride descriptions of cuda/dpc_ops.h, calls the kernels, and turns
 * their statuses into messages. This file: the statuses, elementwise ops,
 * reductions, indexing, unfold and the recurrent gates; gpu_memory.c has device memory,
 * copies, streams, events and CUDA graphs, gpu_linear.c the matrix
 * products with the deferred Linear, the fused loss and the optimizer
 * steps. gpu_none.c stands for all of them in a build without CUDA.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#ifdef DP_HAVE_CUDA
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dplua_cuda.h"
#include "core/gpu.h"

/* ---------------------------------------------------------------- plumbing */

void *gpu_stream_of(int device)
{
    gpu_deferred_launch();
    return gpu_stream_now(device);
}

/* After an error that breaks the CUDA context (an illegal address, a
 * crashed kernel) every later call fails with it; the first one is kept
 * so that every later message can say where the trouble started. */
static char broken_since[320];

dp_status gpu_status(const char *fn, int st, int dtype)
{
    if (gpu_deferred_failure[0]) {
        char why[sizeof gpu_deferred_failure];
        memcpy(why, gpu_deferred_failure, sizeof why);
        gpu_deferred_failure[0] = 0;
        if (st == 0)
            return dp_fail(DP_ERR_CUDA, "%s (a Linear's waiting launch, made when %s came next)", why, fn);
        return dp_fail(DP_ERR_CUDA, "%s (a Linear's waiting launch, made when %s came next); then %s failed too: %s",
                       why, fn, fn, st == DPC_UNSUPPORTED ? "not supported" : dpc_error_string(st));
    }
    if (st == 0)
        return DP_OK;
    if (st == DPC_UNSUPPORTED)
        return dp_fail(DP_ERR_DTYPE, "%s: not supported on CUDA for dtype %s", fn, dp_dtype_name(dtype));
    if (broken_since[0])
        return dp_fail(DP_ERR_CUDA, "%s: CUDA cannot be used any more in this process: %s", fn, broken_since);
    if (dpc_error_is_sticky(st)) {
        snprintf(broken_since, sizeof broken_since, "%s failed with \"%s\", which leaves the CUDA context "
                 "unusable (restart the process; CUDA_LAUNCH_BLOCKING=1 or compute-sanitizer finds the kernel)",
                 fn, dpc_error_string(st));
        return dp_fail(DP_ERR_CUDA, "%s: CUDA error: %s (the CUDA context is now unusable: every later CUDA "
                       "call in this process fails)", fn, dpc_error_string(st));
    }
    return dp_fail(DP_ERR_CUDA, "%s: CUDA error: %s", fn, dpc_error_string(st));
}

/* Errors that kernels found (dpc_kernel_error in cuda/dpc_ops.h): the
 * block is made on first use; the host reads it after each
 * synchronisation and raises what it holds. */
static dpc_kernel_error *kernel_error_block;

dpc_kernel_error *gpu_kernel_error_block(void)
{
    if (!kernel_error_block)
        (void)dpc_kernel_error_block(&kernel_error_block);   /* NULL on failure: kernels then report nothing */
    return kernel_error_block;
}

dp_status gpu_kernel_errors(void)
{
    dpc_kernel_error *e = kernel_error_block;
    if (!e || e->code == DPC_KERR_NONE)
        return DP_OK;
    int code = e->code;
    long long v = e->value, limit = e->limit;
    e->code = DPC_KERR_NONE;
    const char *later = " (found by a CUDA kernel queued earlier, reported at this synchronisation)";
    switch (code) {
    case DPC_KERR_CE_TARGET:
        return dp_fail(DP_ERR_INDEX, "cross_entropy: target %lld is out of bounds (expected a class index in "
                       "[0, %lld) or ignore_index)%s", v, limit, later);
    case DPC_KERR_INDEX_SELECT:
        return dp_fail(DP_ERR_INDEX, "index_select: index %lld is out of bounds for a dimension of size %lld%s",
                       v, limit, later);
    case DPC_KERR_GATHER:
        return dp_fail(DP_ERR_INDEX, "gather: index %lld is out of bounds for a dimension of size %lld%s", v,
                       limit, later);
    case DPC_KERR_SCATTER:
        return dp_fail(DP_ERR_INDEX, "scatter: index %lld is out of bounds for a dimension of size %lld%s", v,
                       limit, later);
    case DPC_KERR_PUT:
        return dp_fail(DP_ERR_INDEX, "put_: index %lld is out of bounds for a tensor of %lld elements%s", v, limit,
                       later);
    default:
        return dp_fail(DP_ERR_INDEX, "scatter_add: index %lld is out of bounds for a dimension of size %lld%s",
                       v, limit, later);
    }
}

/* t with `dim` removed (a view on the stack; no refcounts taken) */
static dp_tensor drop(const dp_tensor *t, int dim)
{
    dp_tensor v = *t;
    for (int i = dim; i < t->ndim - 1; i++) {
        v.shape[i] = t->shape[i + 1];
        v.stride[i] = t->stride[i + 1];
    }
    v.ndim = t->ndim - 1;
    return v;
}


/* ---------------------------------------------------------------- elementwise */

dp_status gpu_unary(int op, dp_tensor *out, dp_tensor *a)
{
    dp_status st;
    if (gpu_deferred_fuse(op, out, a, &st))
        return st;
    dpc_set_device(out->device);
    return gpu_status("unary op", dpc_unary(op, a->dtype, out->dtype, gpu_shape(out), gpu_operand(out), gpu_operand(a), gpu_stream_of(out->device)),
                      a->dtype);
}

dp_status gpu_binary(int op, dp_tensor *out, dp_tensor *a, dp_tensor *b)
{
    dpc_set_device(out->device);
    return gpu_status("binary op", dpc_binary(op, a->dtype, out->dtype, gpu_shape(out), gpu_operand(out), gpu_operand(a),
                                              gpu_operand(b), gpu_stream_of(out->device)), a->dtype);
}

dp_status gpu_unary_backward(int op, dp_tensor *dx, dp_tensor *g, dp_tensor *x, dp_tensor *y)
{
    dpc_set_device(dx->device);
    return gpu_status("backward", dpc_unary_backward(op, dx->dtype, gpu_shape(dx), gpu_operand(dx), gpu_operand(g),
                                                     gpu_operand(x), gpu_operand(y), gpu_stream_of(dx->device)), dx->dtype);
}

dp_status gpu_where(dp_tensor *out, dp_tensor *cond, dp_tensor *a, dp_tensor *b)
{
    dpc_set_device(out->device);
    return gpu_status("where", dpc_where(out->dtype, gpu_shape(out), gpu_operand(out), gpu_operand(cond), gpu_operand(a),
                                         gpu_operand(b), gpu_stream_of(out->device)), out->dtype);
}

dp_status gpu_clamp(dp_tensor *out, dp_tensor *a, double lo, double hi)
{
    dpc_set_device(out->device);
    return gpu_status("clamp", dpc_clamp(out->dtype, gpu_shape(out), gpu_operand(out), gpu_operand(a), lo, hi, gpu_stream_of(out->device)),
                      out->dtype);
}

/* Within one device: the kernel; across devices or with the host: through
 * a contiguous buffer of the destination's dtype. */
dp_status gpu_copy(dp_tensor *dst, dp_tensor *src)
{
    dp_status st;
    if (src->device == dst->device) {
        dpc_set_device(dst->device);
        return gpu_status("copy_", dpc_cast(dst->dtype, src->dtype, gpu_shape(dst), gpu_operand(dst), gpu_operand(src), gpu_stream_of(dst->device)),
                          src->dtype);
    }
    dp_tensor *host = NULL, *host2 = NULL;
    size_t bytes = (size_t)dp_tensor_numel(dst) * dp_dtype_size(dst->dtype);
    if (src->device == DP_CPU) {
        /* host source: cast and make contiguous on the host, then upload */
        if ((st = tensor_new(&host, dst->ndim, dst->shape, dst->dtype, DP_CPU)) || (st = cpu_copy(host, src)))
            goto done;
        if (tensor_is_contiguous(dst)) {
            st = gpu_memcpy(gpu_first(dst), gpu_first(host), bytes, 0, dst->device);
        } else {
            dp_tensor *dev;
            if (!(st = tensor_new(&dev, dst->ndim, dst->shape, dst->dtype, dst->device))) {
                if (!(st = gpu_memcpy(gpu_first(dev), gpu_first(host), bytes, 0, dst->device)))
                    st = gpu_copy(dst, dev);
                dp_tensor_release(dev);
            }
        }
    } else if (dst->device == DP_CPU) {
        /* device source: cast and make contiguous on its device, then download */
        dp_tensor *dev;
        if ((st = tensor_new(&dev, dst->ndim, dst->shape, dst->dtype, src->device)))
            goto done;
        if (!(st = gpu_copy(dev, src)) && !(st = tensor_new(&host, dst->ndim, dst->shape, dst->dtype, DP_CPU)) &&
            !(st = gpu_memcpy(gpu_first(host), gpu_first(dev), bytes, 1, src->device)))
            st = cpu_copy(dst, host);
        dp_tensor_release(dev);
    } else {
        /* between two GPUs: through the host */
        if (!(st = tensor_new(&host2, dst->ndim, dst->shape, dst->dtype, DP_CPU)) && !(st = gpu_copy(host2, src)))
            st = gpu_copy(dst, host2);
    }
done:
    dp_tensor_release(host);
    dp_tensor_release(host2);
    return st;
}

dp_status gpu_fill(dp_tensor *dst, double value)
{
    dpc_set_device(dst->device);
    return gpu_status("fill_", dpc_fill(dst->dtype, gpu_shape(dst), gpu_operand(dst), value, gpu_stream_of(dst->device)), dst->dtype);
}

/* Integer checks of pow/remainder: rare, so on a host copy. */
bool gpu_any(int what, dp_tensor *t)
{
    dp_tensor *host;
    if (tensor_new(&host, t->ndim, t->shape, t->dtype, DP_CPU))
        return false;
    bool found = gpu_copy(host, t) == DP_OK && cpu_any(what, host);
    dp_tensor_release(host);
    return found;
}

dp_status gpu_random(dp_tensor *t, int kind, uint64_t counter, uint64_t key, int64_t low, uint64_t range)
{
    /* the counter is fixed at capture: every replay would draw the same numbers */
    if (dp_cuda_capturing())
        return gpu_not_capturable("a random draw (rand, randn, randint, dropout)");
    dpc_set_device(t->device);
    return gpu_status("random", dpc_random(t->dtype, kind, dp_tensor_numel(t), counter, key, low, range, gpu_first(t),
                                           gpu_stream_of(t->device)), t->dtype);
}

/* out = in with dropout's mask of blocks counter.. applied (dpc_dropout);
 * both contiguous, of one dtype and device */
dp_status gpu_dropout(dp_tensor *out, dp_tensor *in, uint64_t counter, uint64_t key, double p)
{
    if (dp_cuda_capturing())
        return gpu_not_capturable("a random draw (rand, randn, randint, dropout)");
    dpc_set_device(out->device);
    return gpu_status("dropout", dpc_dropout(out->dtype, dp_tensor_numel(out), counter, key, p, gpu_first(in),
                                             gpu_first(out), gpu_stream_of(out->device)), out->dtype);
}

/* ---------------------------------------------------------------- reductions */

dp_status gpu_reduce(int op, dp_tensor *out, dp_tensor *indices, dp_tensor *a, int dim, int correction)
{
    dp_tensor in_view = drop(a, dim);
    dp_tensor out_view = out->ndim == a->ndim ? drop(out, dim) : *out;
    dpc_operand idx = { 0 };
    if (indices) {
        dp_tensor iv = indices->ndim == a->ndim ? drop(indices, dim) : *indices;
        idx = gpu_operand(&iv);
    }
    dpc_set_device(out->device);
    return gpu_status("reduction", dpc_reduce(op, a->dtype, out->dtype, gpu_shape(&out_view), gpu_operand(&out_view), idx,
                                              gpu_operand(&in_view), a->shape[dim], a->stride[dim], correction, gpu_stream_of(out->device)),
                      a->dtype);
}

dp_status gpu_softmax(dp_tensor *out, dp_tensor *a, int dim, int log)
{
    if (a->ndim == 0)
        return gpu_fill(out, log ? 0.0 : 1.0);
    dp_tensor in_view = drop(a, dim), out_view = drop(out, dim);
    dpc_set_device(out->device);
    return gpu_status("softmax", dpc_softmax(a->dtype, gpu_shape(&out_view), gpu_operand(&out_view), out->stride[dim],
                                             gpu_operand(&in_view), a->stride[dim], a->shape[dim], log, gpu_stream_of(out->device)), a->dtype);
}


/* ---------------------------------------------------------------- indexing */

/* a contiguous (outer, size, inner) reading of t around dim */
static void around(const dp_tensor *t, int dim, int64_t *outer, int64_t *size, int64_t *inner)
{
    *outer = *inner = 1;
    for (int i = 0; i < dim; i++) *outer *= t->shape[i];
    for (int i = dim + 1; i < t->ndim; i++) *inner *= t->shape[i];
    *size = t->ndim ? t->shape[dim] : 1;
}

/* int64, contiguous, on the device of `like` */
static dp_status device_index(dp_tensor **res, dp_tensor *index, const dp_tensor *like)
{
    dp_tensor *c;
    dp_status st = dp_to(&c, index, DP_INT64, like->device);
    if (st)
        return st;
    st = dp_contiguous(res, c);
    dp_tensor_release(c);
    return st;
}

dp_status gpu_index_select(dp_tensor *out, dp_tensor *a, int dim, dp_tensor *index)
{
    dp_tensor *ac = NULL, *idx = NULL;
    int64_t outer, size, inner, n = dp_tensor_numel(index);
    dp_status st;
    if (!(st = dp_contiguous(&ac, a)) && !(st = device_index(&idx, index, a))) {
        around(ac, dim, &outer, &size, &inner);
        dpc_set_device(a->device);
        st = gpu_status("index_select", dpc_index_select(a->dtype, outer, size, inner, gpu_first(ac), gpu_first(idx), n,
                                                         gpu_first(out), gpu_kernel_error_block(), gpu_stream_of(a->device)), a->dtype);
    }
    dp_tensor_release(ac);
    dp_tensor_release(idx);
    return st;
}

dp_status gpu_index_add(dp_tensor *out, int dim, dp_tensor *index, dp_tensor *src)
{
    dp_tensor *sc = NULL, *idx = NULL, *ws = NULL;
    int64_t outer, size, inner, n = dp_tensor_numel(index);
    dp_status st;
    if (!tensor_is_contiguous(out))
        return dp_fail(DP_ERR_ARG, "index_add: internal error: the destination must be contiguous");
    if (n > INT32_MAX)
        return dp_fail(DP_ERR_ARG, "index_add: %lld indices are too many on a GPU (at most %d)", (long long)n,
                       INT32_MAX);
    around(out, dim, &outer, &size, &inner);
    dpc_set_device(out->device);
    int64_t bytes = (int64_t)dpc_index_add_workspace(n, size);
    if (n > 0 && bytes == 0)
        return gpu_status("index_add", (int)DPC_UNSUPPORTED, out->dtype);
    if (!(st = dp_contiguous(&sc, src)) && !(st = device_index(&idx, index, out)) &&
        !(st = gpu_workspace(&ws, bytes, out->device))) {
        dpc_set_device(out->device);
        st = gpu_status("index_add", dpc_index_add(out->dtype, outer, size, inner, gpu_first(out), gpu_first(idx), n,
                                                   gpu_first(sc), ws ? gpu_first(ws) : NULL, (size_t)bytes,
                                                   gpu_stream_of(out->device)),
                        out->dtype);
    }
    dp_tensor_release(sc);
    dp_tensor_release(idx);
    dp_tensor_release(ws);
    return st;
}

dp_status gpu_gather(dp_tensor *out, dp_tensor *a, int dim, dp_tensor *index)
{
    dp_tensor *idx = NULL;
    dp_status st = dp_to(&idx, index, DP_INT64, a->device);
    if (!st) {
        dpc_set_device(a->device);
        st = gpu_status("gather", dpc_gather(a->dtype, gpu_shape(idx), gpu_operand(out), gpu_operand(a), gpu_operand(idx), dim,
                                             a->ndim ? a->shape[dim] : 1, gpu_kernel_error_block(), gpu_stream_of(a->device)), a->dtype);
    }
    dp_tensor_release(idx);
    return st;
}

/* integer scatter_add (no atomicAdd for it here) runs on host copies, and
 * so does every scatter_add in deterministic mode (the CPU adds in index
 * order; the kernel's atomicAdd in whatever order the threads come) */
static dp_status scatter_add_on_host(dp_tensor *out, int dim, dp_tensor *index, dp_tensor *src)
{
    dp_tensor *ho = NULL, *hi = NULL, *hs = NULL;
    dp_status st;
    if (!(st = dp_to(&ho, out, out->dtype, DP_CPU)) && !(st = dp_to(&hi, index, index->dtype, DP_CPU)) &&
        !(st = dp_to(&hs, src, src->dtype, DP_CPU)) && !(st = cpu_scatter_add(ho, dim, hi, hs)))
        st = gpu_copy(out, ho);
    dp_tensor_release(ho);
    dp_tensor_release(hi);
    dp_tensor_release(hs);
    return st;
}

/* scatter_add (add) or scatter into out, the index as an int64 device copy */
static dp_status scatter_run(dp_tensor *out, int dim, dp_tensor *index, dp_tensor *src, bool add)
{
    dp_tensor *idx = NULL;
    dp_status st = dp_to(&idx, index, DP_INT64, out->device);
    if (!st) {
        dpc_set_device(out->device);
        int64_t size = out->ndim ? out->shape[dim] : 1;
        int r = add ? dpc_scatter_add(out->dtype, gpu_shape(idx), gpu_operand(out), gpu_operand(idx), gpu_operand(src),
                                      dim, size, gpu_kernel_error_block(), gpu_stream_of(out->device))
                    : dpc_scatter(out->dtype, gpu_shape(idx), gpu_operand(out), gpu_operand(idx), gpu_operand(src), dim,
                                  size, gpu_kernel_error_block(), gpu_stream_of(out->device));
        st = gpu_status(add ? "scatter_add" : "scatter", r, out->dtype);
    }
    dp_tensor_release(idx);
    return st;
}

dp_status gpu_scatter_add(dp_tensor *out, int dim, dp_tensor *index, dp_tensor *src)
{
    if (!dp_dtype_is_floating(out->dtype) || dp_deterministic())
        return scatter_add_on_host(out, dim, index, src);
    return scatter_run(out, dim, index, src, true);
}

dp_status gpu_scatter(dp_tensor *out, int dim, dp_tensor *index, dp_tensor *src)
{
    return scatter_run(out, dim, index, src, false);
}


dp_status gpu_put(dp_tensor *dst, dp_tensor *index, dp_tensor *src)
{
    dp_tensor *idx = NULL;
    dp_status st = device_index(&idx, index, dst);
    if (!st) {
        dpc_set_device(dst->device);
        st = gpu_status("put_", dpc_put(dst->dtype, gpu_shape(dst), gpu_operand(dst), gpu_first(idx),
                                        dp_tensor_numel(idx), gpu_first(src), gpu_kernel_error_block(),
                                        gpu_stream_of(dst->device)), dst->dtype);
    }
    dp_tensor_release(idx);
    return st;
}

/* ---------------------------------------------------------------- sorting and selecting */

/* the rows of contiguous (rows, n) matrices, as select.c makes them */
dp_status gpu_argsort(dp_tensor *indices, dp_tensor *a, int descending)
{
    int64_t rows = a->shape[0], n = a->shape[1], scratch_size = dpc_argsort_width(n) * rows;
    dp_tensor *scratch;
    dp_status st = tensor_new(&scratch, 1, &scratch_size, DP_INT64, a->device);
    if (st)
        return st;
    dpc_set_device(a->device);
    st = gpu_status("sort", dpc_argsort(a->dtype, rows, n, gpu_first(a), descending, gpu_first(indices),
                                        gpu_first(scratch), gpu_stream_of(a->device)), a->dtype);
    dp_tensor_release(scratch);
    return st;
}

dp_status gpu_cumsum(dp_tensor *out, dp_tensor *a, int reverse)
{
    dpc_set_device(a->device);
    return gpu_status("cumsum", dpc_cumsum(a->dtype, a->shape[0], a->shape[1], gpu_first(a), gpu_first(out), reverse,
                                           gpu_stream_of(a->device)), a->dtype);
}

dp_status gpu_multinomial(dp_tensor *out, dp_tensor *cdf, dp_tensor *u)
{
    dpc_set_device(out->device);
    return gpu_status("multinomial", dpc_multinomial(cdf->shape[0], cdf->shape[1], u->shape[1], gpu_first(cdf),
                                                     gpu_first(u), gpu_first(out), gpu_stream_of(out->device)),
                      cdf->dtype);
}

/* ---------------------------------------------------------------- unfold, optimizers */

dp_status gpu_unfold(dp_tensor *cols, dp_tensor *x, const cpu_unfold_args *u)
{
    dpc_set_device(x->device);
    return gpu_status("unfold", dpc_unfold(x->dtype, x->shape[0], x->shape[1], x->shape[2], x->shape[3], u->kernel,
                                           u->stride, u->padding, u->dilation, u->out_h, u->out_w, gpu_first(x),
                                           gpu_first(cols), u->pad_value, gpu_stream_of(x->device)), x->dtype);
}

/* The fold in deterministic mode: on host copies, in the CPU's fixed order
 * (the kernel adds overlapping windows with atomicAdd) */
static dp_status fold_add_on_host(dp_tensor *x, dp_tensor *cols, const cpu_unfold_args *u)
{
    dp_tensor *hx = NULL, *hc = NULL;
    dp_status st;
    if (!(st = dp_to(&hx, x, x->dtype, DP_CPU)) && !(st = dp_to(&hc, cols, cols->dtype, DP_CPU)) &&
        !(st = cpu_fold_add(hx, hc, u)))
        st = gpu_copy(x, hx);
    dp_tensor_release(hx);
    dp_tensor_release(hc);
    return st;
}

dp_status gpu_fold_add(dp_tensor *x, dp_tensor *cols, const cpu_unfold_args *u)
{
    if (dp_deterministic())
        return fold_add_on_host(x, cols, u);
    dpc_set_device(x->device);
    return gpu_status("unfold backward", dpc_fold_add(x->dtype, x->shape[0], x->shape[1], x->shape[2], x->shape[3],
                                                      u->kernel, u->stride, u->padding, u->dilation, u->out_h,
                                                      u->out_w, gpu_first(x), gpu_first(cols), gpu_stream_of(x->device)), x->dtype);
}

/* ---------------------------------------------------------------- recurrent gates */

dp_status gpu_lstm_gates(dp_tensor *out, dp_tensor *gi, dp_tensor *gh, dp_tensor *c)
{
    dpc_set_device(out->device);
    return gpu_status("lstm gates", dpc_lstm_gates(out->dtype, c->shape[0], c->shape[1], gpu_first(gi), gpu_first(gh),
                                                   gpu_first(c), gpu_first(out), gpu_stream_of(out->device)),
                      out->dtype);
}

dp_status gpu_lstm_gates_backward(dp_tensor *dgates, dp_tensor *dc, dp_tensor *dout, dp_tensor *gi, dp_tensor *gh,
                                  dp_tensor *c, dp_tensor *c1)
{
    dpc_set_device(dc->device);
    return gpu_status("lstm gates backward",
                      dpc_lstm_gates_backward(dc->dtype, c->shape[0], c->shape[1], gpu_first(dout), gpu_first(gi),
                                              gpu_first(gh), gpu_first(c), gpu_first(c1), gpu_first(dgates),
                                              gpu_first(dc), gpu_stream_of(dc->device)),
                      dc->dtype);
}

dp_status gpu_gru_gates(dp_tensor *out, dp_tensor *gi, dp_tensor *gh, dp_tensor *h)
{
    dpc_set_device(out->device);
    return gpu_status("gru gates", dpc_gru_gates(out->dtype, h->shape[0], h->shape[1], gpu_first(gi), gpu_first(gh),
                                                 gpu_first(h), gpu_first(out), gpu_stream_of(out->device)),
                      out->dtype);
}

dp_status gpu_gru_gates_backward(dp_tensor *dgi, dp_tensor *dgh, dp_tensor *dh, dp_tensor *dout, dp_tensor *gi,
                                 dp_tensor *gh, dp_tensor *h)
{
    dpc_set_device(dh->device);
    return gpu_status("gru gates backward",
                      dpc_gru_gates_backward(dh->dtype, h->shape[0], h->shape[1], gpu_first(dout), gpu_first(gi),
                                             gpu_first(gh), gpu_first(h), gpu_first(dgi), gpu_first(dgh),
                                             gpu_first(dh), gpu_stream_of(dh->device)),
                      dh->dtype);
}

#endif /* DP_HAVE_CUDA */
