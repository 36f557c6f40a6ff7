/*
 * gpu.c — the CUDA side of the op table: turns tensors into the pointer
 * and stride descriptions of cuda/dpc_ops.h, calls the kernels, and turns
 * their statuses into messages. Also the device memory of storages and the
 * copies between host and device. Built without CUDA, every entry point
 * fails with a message that says so (no tensor can be on a GPU then).
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif
#include "core/kernels.h"

#include <stdlib.h>
#include <string.h>

#ifdef DP_HAVE_CUDA
#include "dp_cuda.h"
#include "dpc_ops.h"

/* ---------------------------------------------------------------- plumbing */

static dp_status gpu_status(const char *fn, int st, int dtype)
{
    if (st == 0)
        return DP_OK;
    if (st == DPC_UNSUPPORTED)
        return dp_fail(DP_ERR_DTYPE, "%s: not supported on CUDA for dtype %s", fn, dp_dtype_name(dtype));
    return dp_fail(DP_ERR_CUDA, "%s: CUDA error: %s", fn, dpc_error_string(st));
}

static int set_device(int device)
{
    return dpc_set_device(device);
}

static dpc_shape shape_of(const dp_tensor *t)
{
    dpc_shape s = { .ndim = t->ndim };
    memcpy(s.shape, t->shape, sizeof(int64_t) * (size_t)t->ndim);
    return s;
}

static void *first(const dp_tensor *t)
{
    return (char *)t->storage->data + t->offset * (int64_t)dp_dtype_size(t->dtype);
}

static dpc_operand operand(const dp_tensor *t)
{
    dpc_operand o = { .data = first(t) };
    memcpy(o.stride, t->stride, sizeof(int64_t) * (size_t)t->ndim);
    return o;
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

/* ---------------------------------------------------------------- memory */

dp_status gpu_storage_alloc(void **data, size_t nbytes, int device)
{
    int count = 0;
    int st = dpc_device_count(&count);
    if (st != 0 || device >= count)
        return dp_fail(DP_ERR_DEVICE, "device cuda:%d is not available (%d CUDA device%s%s%s)", device, count,
                       count == 1 ? "" : "s", st ? ": " : "", st ? dpc_error_string(st) : "");
    if ((st = set_device(device)) || (st = dpc_malloc(data, nbytes ? nbytes : 1, device, NULL)))
        return dp_fail(DP_ERR_MEMORY, "out of memory allocating %zu bytes on cuda:%d: %s", nbytes, device,
                       dpc_error_string(st));
    return DP_OK;
}

void gpu_storage_free(void *data, int device)
{
    if (data && set_device(device) == 0)
        dpc_free(data, device, NULL);
}

/* Contiguous bytes between host and device (kind as dpc_memcpy). */
dp_status gpu_memcpy(void *dst, const void *src, size_t bytes, int kind, int device)
{
    int st = set_device(device);
    if (!st && bytes)
        st = dpc_memcpy(dst, src, bytes, kind, NULL);
    return gpu_status("copy", st, -1);
}

int dp_cuda_device_count(void)
{
    int n = 0;
    return dpc_device_count(&n) == 0 ? n : 0;
}

dp_status dp_cuda_synchronize(int device)
{
    return gpu_status("synchronize", dpc_synchronize(device), -1);
}

/* ---------------------------------------------------------------- elementwise */

dp_status gpu_unary(int op, dp_tensor *out, dp_tensor *a)
{
    set_device(out->device);
    return gpu_status("unary op", dpc_unary(op, a->dtype, out->dtype, shape_of(out), operand(out), operand(a), NULL),
                      a->dtype);
}

dp_status gpu_binary(int op, dp_tensor *out, dp_tensor *a, dp_tensor *b)
{
    set_device(out->device);
    return gpu_status("binary op", dpc_binary(op, a->dtype, out->dtype, shape_of(out), operand(out), operand(a),
                                              operand(b), NULL), a->dtype);
}

dp_status gpu_unary_backward(int op, dp_tensor *dx, dp_tensor *g, dp_tensor *x, dp_tensor *y)
{
    set_device(dx->device);
    return gpu_status("backward", dpc_unary_backward(op, dx->dtype, shape_of(dx), operand(dx), operand(g),
                                                     operand(x), operand(y), NULL), dx->dtype);
}

dp_status gpu_where(dp_tensor *out, dp_tensor *cond, dp_tensor *a, dp_tensor *b)
{
    set_device(out->device);
    return gpu_status("where", dpc_where(out->dtype, shape_of(out), operand(out), operand(cond), operand(a),
                                         operand(b), NULL), out->dtype);
}

dp_status gpu_clamp(dp_tensor *out, dp_tensor *a, double lo, double hi)
{
    set_device(out->device);
    return gpu_status("clamp", dpc_clamp(out->dtype, shape_of(out), operand(out), operand(a), lo, hi, NULL),
                      out->dtype);
}

/* Within one device: the kernel; across devices or with the host: through
 * a contiguous buffer of the destination's dtype. */
dp_status gpu_copy(dp_tensor *dst, dp_tensor *src)
{
    dp_status st;
    if (src->device == dst->device) {
        set_device(dst->device);
        return gpu_status("copy_", dpc_cast(dst->dtype, src->dtype, shape_of(dst), operand(dst), operand(src), NULL),
                          src->dtype);
    }
    dp_tensor *host = NULL, *host2 = NULL;
    size_t bytes = (size_t)dp_tensor_numel(dst) * dp_dtype_size(dst->dtype);
    if (src->device == DP_CPU) {
        /* host source: cast and make contiguous on the host, then upload */
        if ((st = tensor_new(&host, dst->ndim, dst->shape, dst->dtype, DP_CPU)) || (st = cpu_copy(host, src)))
            goto done;
        if (tensor_is_contiguous(dst)) {
            st = gpu_memcpy(first(dst), first(host), bytes, 0, dst->device);
        } else {
            dp_tensor *dev;
            if (!(st = tensor_new(&dev, dst->ndim, dst->shape, dst->dtype, dst->device))) {
                if (!(st = gpu_memcpy(first(dev), first(host), bytes, 0, dst->device)))
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
            !(st = gpu_memcpy(first(host), first(dev), bytes, 1, src->device)))
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
    set_device(dst->device);
    return gpu_status("fill_", dpc_fill(dst->dtype, shape_of(dst), operand(dst), value, NULL), dst->dtype);
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

/* ---------------------------------------------------------------- reductions */

dp_status gpu_reduce(int op, dp_tensor *out, dp_tensor *indices, dp_tensor *a, int dim, int correction)
{
    dp_tensor in_view = drop(a, dim);
    dp_tensor out_view = out->ndim == a->ndim ? drop(out, dim) : *out;
    dpc_operand idx = { 0 };
    if (indices) {
        dp_tensor iv = indices->ndim == a->ndim ? drop(indices, dim) : *indices;
        idx = operand(&iv);
    }
    set_device(out->device);
    return gpu_status("reduction", dpc_reduce(op, a->dtype, out->dtype, shape_of(&out_view), operand(&out_view), idx,
                                              operand(&in_view), a->shape[dim], a->stride[dim], correction, NULL),
                      a->dtype);
}

dp_status gpu_softmax(dp_tensor *out, dp_tensor *a, int dim, int log)
{
    if (a->ndim == 0)
        return gpu_fill(out, log ? 0.0 : 1.0);
    dp_tensor in_view = drop(a, dim), out_view = drop(out, dim);
    set_device(out->device);
    return gpu_status("softmax", dpc_softmax(a->dtype, shape_of(&out_view), operand(&out_view), out->stride[dim],
                                             operand(&in_view), a->stride[dim], a->shape[dim], log, NULL), a->dtype);
}

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
        set_device(out->device);
        st = gpu_status("matmul", dpc_gemm(out->dtype, ta, tb, m, n, k, 1.0, first(A), lda, A->stride[0], first(B),
                                           ldb, B->stride[0], 0.0, first(out), n, m * n, batch, NULL, allow_tf32,
                                           NULL), out->dtype);
    }
    dp_tensor_release(A);
    dp_tensor_release(B);
    return st;
}

/* out (M, N) = x (M, K) @ w (N, K)^T + b, the bias in cuBLASLt's epilogue */
dp_status gpu_linear(dp_tensor *out, dp_tensor *x, dp_tensor *w, dp_tensor *b)
{
    int64_t M = out->shape[0], N = out->shape[1], K = x->shape[1];
    set_device(out->device);
    return gpu_status("linear", dpc_gemm(out->dtype, 0, 1, M, N, K, 1.0, first(x), K, 0, first(w), K, 0, 0.0,
                                         first(out), N, 0, 1, b ? first(b) : NULL, allow_tf32, NULL), out->dtype);
}

dp_status gpu_linear_backward(dp_tensor *dx, dp_tensor *dw, dp_tensor *db, dp_tensor *g, dp_tensor *x, dp_tensor *w)
{
    int64_t M = g->shape[0], N = g->shape[1], K = x->shape[1];
    int st = set_device(g->device);
    if (!st && dx)   /* dx (M, K) = g (M, N) @ w (N, K) */
        st = dpc_gemm(g->dtype, 0, 0, M, K, N, 1.0, first(g), N, 0, first(w), K, 0, 0.0, first(dx), K, 0, 1, NULL,
                      allow_tf32, NULL);
    if (!st && dw)   /* dw (N, K) = g^T (N, M) @ x (M, K) */
        st = dpc_gemm(g->dtype, 1, 0, N, K, M, 1.0, first(g), N, 0, first(x), K, 0, 0.0, first(dw), K, 0, 1, NULL,
                      allow_tf32, NULL);
    if (!st && db) { /* db (N) = the column sums of g */
        dpc_shape s = { 1, { N } };
        dpc_operand o = { .data = first(db), .stride = { 1 } }, in = { .data = first(g), .stride = { 1 } }, none = { 0 };
        st = dpc_reduce(DP_SUM, g->dtype, db->dtype, s, o, none, in, M, N, 0, NULL);
    }
    return gpu_status("linear backward", st, g->dtype);
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

/* a device int that kernels set to flag a bad index, read back after */
static dp_status flag_read(dp_tensor *flag, int *value)
{
    return gpu_memcpy(value, first(flag), sizeof *value, 1, flag->device);
}

dp_status gpu_index_select(dp_tensor *out, dp_tensor *a, int dim, dp_tensor *index)
{
    dp_tensor *ac = NULL, *idx = NULL, *flag = NULL;
    int64_t outer, size, inner, one = 1, n = dp_tensor_numel(index);
    int bad = 0;
    dp_status st;
    if ((st = dp_contiguous(&ac, a)) || (st = device_index(&idx, index, a)) ||
        (st = dp_full(&flag, 1, &one, 0, DP_INT32, a->device)))
        goto done;
    around(ac, dim, &outer, &size, &inner);
    set_device(a->device);
    if ((st = gpu_status("index_select", dpc_index_select(a->dtype, outer, size, inner, first(ac), first(idx), n,
                                                          first(out), first(flag), NULL), a->dtype)) ||
        (st = flag_read(flag, &bad)))
        goto done;
    if (bad)
        st = dp_fail(DP_ERR_INDEX, "index_select: an index is out of bounds for dimension %d with size %lld", dim,
                     (long long)size);
done:
    dp_tensor_release(ac);
    dp_tensor_release(idx);
    dp_tensor_release(flag);
    return st;
}

dp_status gpu_index_add(dp_tensor *out, int dim, dp_tensor *index, dp_tensor *src)
{
    dp_tensor *sc = NULL, *idx = NULL;
    int64_t outer, size, inner;
    dp_status st;
    if (!tensor_is_contiguous(out))
        return dp_fail(DP_ERR_ARG, "index_add: internal error: the destination must be contiguous");
    if (!(st = dp_contiguous(&sc, src)) && !(st = device_index(&idx, index, out))) {
        around(out, dim, &outer, &size, &inner);
        set_device(out->device);
        st = gpu_status("index_add", dpc_index_add(out->dtype, outer, size, inner, first(out), first(idx),
                                                   dp_tensor_numel(index), first(sc), NULL), out->dtype);
    }
    dp_tensor_release(sc);
    dp_tensor_release(idx);
    return st;
}

/* host copies of the operands, the CPU kernel, and the result uploaded */
static dp_status host_copy(dp_tensor **res, dp_tensor *t)
{
    return dp_to(res, t, t->dtype, DP_CPU);
}

dp_status gpu_gather(dp_tensor *out, dp_tensor *a, int dim, dp_tensor *index)
{
    dp_tensor *ha = NULL, *hi = NULL, *ho = NULL;
    dp_status st;
    if (!(st = host_copy(&ha, a)) && !(st = host_copy(&hi, index)) &&
        !(st = tensor_new(&ho, out->ndim, out->shape, out->dtype, DP_CPU)) && !(st = cpu_gather(ho, ha, dim, hi)))
        st = gpu_copy(out, ho);
    dp_tensor_release(ha);
    dp_tensor_release(hi);
    dp_tensor_release(ho);
    return st;
}

dp_status gpu_scatter_add(dp_tensor *out, int dim, dp_tensor *index, dp_tensor *src)
{
    dp_tensor *ho = NULL, *hi = NULL, *hs = NULL;
    dp_status st;
    if (!(st = host_copy(&ho, out)) && !(st = host_copy(&hi, index)) && !(st = host_copy(&hs, src)) &&
        !(st = cpu_scatter_add(ho, dim, hi, hs)))
        st = gpu_copy(out, ho);
    dp_tensor_release(ho);
    dp_tensor_release(hi);
    dp_tensor_release(hs);
    return st;
}

/* ---------------------------------------------------------------- cross-entropy */

/* Targets are checked on the host (a clear error, and the denominator of
 * the mean); the losses come back to the host for the reduction. */
dp_status gpu_cross_entropy(double *rows, double *denom, const cpu_ce_args *a)
{
    int64_t N = a->input->shape[0], C = a->input->shape[1];
    dp_tensor *ht = NULL, *hw = NULL, *drows = NULL, *flag = NULL;
    int64_t one = 1;
    dp_status st;
    if ((st = host_copy(&ht, a->target)) || (a->weight && (st = host_copy(&hw, a->weight))))
        goto done;
    double wsum = 0;
    for (int64_t i = 0; i < N; i++) {
        int64_t t = ((const int64_t *)tensor_ptr(ht))[i];
        if (t == a->ignore_index)
            continue;
        if (t < 0 || t >= C) {
            st = dp_fail(DP_ERR_INDEX, "cross_entropy: target %lld is out of bounds (expected a class index in "
                         "[0, %lld) or ignore_index)", (long long)t, (long long)C);
            goto done;
        }
        wsum += hw ? ((const double *)tensor_ptr(hw))[t] : 1.0;
    }
    *denom = wsum;
    if ((st = tensor_new(&drows, 1, &N, DP_FLOAT64, a->input->device)) ||
        (st = dp_full(&flag, 1, &one, 0, DP_INT32, a->input->device)))
        goto done;
    set_device(a->input->device);
    if (!(st = gpu_status("cross_entropy",
                          dpc_cross_entropy(a->input->dtype, N, C, first(a->input), first(a->target),
                                            a->weight ? first(a->weight) : NULL, a->ignore_index,
                                            a->label_smoothing, a->log_probs, first(drows),
                                            a->probs ? first(a->probs) : NULL, first(flag), NULL),
                          a->input->dtype)))
        st = gpu_memcpy(rows, first(drows), sizeof(double) * (size_t)N, 1, a->input->device);
done:
    dp_tensor_release(ht);
    dp_tensor_release(hw);
    dp_tensor_release(drows);
    dp_tensor_release(flag);
    return st;
}

dp_status gpu_cross_entropy_backward(dp_tensor *dinput, const double *scale, const cpu_ce_args *a)
{
    int64_t N = dinput->shape[0], C = dinput->shape[1];
    dp_tensor *dscale = NULL;
    dp_status st = tensor_new(&dscale, 1, &N, DP_FLOAT64, dinput->device);
    if (!st && !(st = gpu_memcpy(first(dscale), scale, sizeof(double) * (size_t)N, 0, dinput->device)))
        st = gpu_status("cross_entropy backward",
                        dpc_cross_entropy_backward(dinput->dtype, N, C, first(dinput),
                                                   a->probs ? first(a->probs) : NULL, first(a->target),
                                                   a->weight ? first(a->weight) : NULL, a->ignore_index,
                                                   a->label_smoothing, a->log_probs, first(dscale), NULL),
                        dinput->dtype);
    dp_tensor_release(dscale);
    return st;
}

/* ---------------------------------------------------------------- unfold, optimizers */

dp_status gpu_unfold(dp_tensor *cols, dp_tensor *x, const cpu_unfold_args *u)
{
    set_device(x->device);
    return gpu_status("unfold", dpc_unfold(x->dtype, x->shape[0], x->shape[1], x->shape[2], x->shape[3], u->kernel,
                                           u->stride, u->padding, u->dilation, u->out_h, u->out_w, first(x),
                                           first(cols), u->pad_value, NULL), x->dtype);
}

dp_status gpu_fold_add(dp_tensor *x, dp_tensor *cols, const cpu_unfold_args *u)
{
    set_device(x->device);
    return gpu_status("unfold backward", dpc_fold_add(x->dtype, x->shape[0], x->shape[1], x->shape[2], x->shape[3],
                                                      u->kernel, u->stride, u->padding, u->dilation, u->out_h,
                                                      u->out_w, first(x), first(cols), NULL), x->dtype);
}

dp_status gpu_sgd_step(dp_tensor *p, dp_tensor *g, dp_tensor *buf, double lr, double momentum,
                       double dampening, int nesterov, double weight_decay, int first_step)
{
    set_device(p->device);
    return gpu_status("sgd_step", dpc_sgd_step(p->dtype, dp_tensor_numel(p), first(p), first(g),
                                               buf ? first(buf) : NULL, lr, momentum, dampening, nesterov,
                                               weight_decay, first_step, NULL), p->dtype);
}

dp_status gpu_adam_step(dp_tensor *p, dp_tensor *g, dp_tensor *m, dp_tensor *v, dp_tensor *vmax, double lr,
                        double beta1, double beta2, double eps, double weight_decay, int decoupled, int64_t step)
{
    set_device(p->device);
    return gpu_status("adam_step", dpc_adam_step(p->dtype, dp_tensor_numel(p), first(p), first(g), first(m), first(v),
                                                 vmax ? first(vmax) : NULL, lr, beta1, beta2, eps, weight_decay,
                                                 decoupled, step, NULL), p->dtype);
}

#else /* no CUDA in this build: no tensor can be on a GPU, but say so clearly */

static dp_status no_cuda(void)
{
    return dp_fail(DP_ERR_DEVICE, "this build of dplua has no CUDA backend (configure --with-cuda)");
}

dp_status gpu_storage_alloc(void **data, size_t nbytes, int device)
{
    (void)data; (void)nbytes; (void)device;
    return no_cuda();
}
void gpu_storage_free(void *data, int device) { (void)data; (void)device; }
dp_status gpu_memcpy(void *dst, const void *src, size_t bytes, int kind, int device)
{ (void)dst; (void)src; (void)bytes; (void)kind; (void)device; return no_cuda(); }
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
dp_status gpu_reduce(int op, dp_tensor *out, dp_tensor *indices, dp_tensor *a, int dim, int correction)
{ (void)op; (void)out; (void)indices; (void)a; (void)dim; (void)correction; return no_cuda(); }
dp_status gpu_softmax(dp_tensor *out, dp_tensor *a, int dim, int log)
{ (void)out; (void)a; (void)dim; (void)log; return no_cuda(); }
dp_status gpu_bmm(dp_tensor *out, dp_tensor *a, dp_tensor *b) { (void)out; (void)a; (void)b; return no_cuda(); }
dp_status gpu_linear(dp_tensor *out, dp_tensor *x, dp_tensor *w, dp_tensor *b)
{ (void)out; (void)x; (void)w; (void)b; return no_cuda(); }
dp_status gpu_linear_backward(dp_tensor *dx, dp_tensor *dw, dp_tensor *db, dp_tensor *g, dp_tensor *x, dp_tensor *w)
{ (void)dx; (void)dw; (void)db; (void)g; (void)x; (void)w; return no_cuda(); }
dp_status gpu_index_select(dp_tensor *out, dp_tensor *a, int dim, dp_tensor *index)
{ (void)out; (void)a; (void)dim; (void)index; return no_cuda(); }
dp_status gpu_index_add(dp_tensor *out, int dim, dp_tensor *index, dp_tensor *src)
{ (void)out; (void)dim; (void)index; (void)src; return no_cuda(); }
dp_status gpu_gather(dp_tensor *out, dp_tensor *a, int dim, dp_tensor *index)
{ (void)out; (void)a; (void)dim; (void)index; return no_cuda(); }
dp_status gpu_scatter_add(dp_tensor *out, int dim, dp_tensor *index, dp_tensor *src)
{ (void)out; (void)dim; (void)index; (void)src; return no_cuda(); }
dp_status gpu_cross_entropy(double *rows, double *denom, const cpu_ce_args *a)
{ (void)rows; (void)denom; (void)a; return no_cuda(); }
dp_status gpu_cross_entropy_backward(dp_tensor *dinput, const double *scale, const cpu_ce_args *a)
{ (void)dinput; (void)scale; (void)a; return no_cuda(); }
dp_status gpu_unfold(dp_tensor *cols, dp_tensor *x, const cpu_unfold_args *u)
{ (void)cols; (void)x; (void)u; return no_cuda(); }
dp_status gpu_fold_add(dp_tensor *x, dp_tensor *cols, const cpu_unfold_args *u)
{ (void)x; (void)cols; (void)u; return no_cuda(); }
dp_status gpu_sgd_step(dp_tensor *p, dp_tensor *g, dp_tensor *buf, double lr, double momentum,
                       double dampening, int nesterov, double weight_decay, int first_step)
{
    (void)p; (void)g; (void)buf; (void)lr; (void)momentum; (void)dampening; (void)nesterov; (void)weight_decay;
    (void)first_step;
    return no_cuda();
}
dp_status gpu_adam_step(dp_tensor *p, dp_tensor *g, dp_tensor *m, dp_tensor *v, dp_tensor *vmax, double lr,
                        double beta1, double beta2, double eps, double weight_decay, int decoupled, int64_t step)
{
    (void)p; (void)g; (void)m; (void)v; (void)vmax; (void)lr; (void)beta1; (void)beta2; (void)eps;
    (void)weight_decay; (void)decoupled; (void)step;
    return no_cuda();
}

#endif
