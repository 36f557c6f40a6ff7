/*
 * ops.c — the op table: checks arguments, works out broadcast shapes and
 * result dtypes (PyTorch's promotion rules), allocates results and
 * dispatches to the kernels of the tensors' device. Every message names
 * the op as the Lua user called it.
 */
#include "dplua_cuda.h"
#include "core/autograd.h"
#include "core/kernels.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const unop_names[DP_NUM_UNOPS] = {
    "neg", "abs", "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "relu", "gelu", "sin", "cos",
    "sign", "floor", "ceil", "round", "reciprocal", "log1p", "expm1", "logical_not", "square",
    "gelu", "erf",
};
static const char *const binop_names[DP_NUM_BINOPS] = {
    "add", "sub", "mul", "div", "pow", "maximum", "minimum", "eq", "ne", "lt", "le", "gt", "ge",
    "remainder", "atan2", "logical_and", "logical_or",
};
/* PyTorch's grad_fn names, so that printed tensors read the same */
static const char *const unop_grad_names[DP_NUM_UNOPS] = {
    "NegBackward0", "AbsBackward0", "ExpBackward0", "LogBackward0", "SqrtBackward0", "RsqrtBackward0",
    "TanhBackward0", "SigmoidBackward0", "ReluBackward0", "GeluBackward0", "SinBackward0", "CosBackward0",
    "SignBackward0", "FloorBackward0", "CeilBackward0", "RoundBackward0", "ReciprocalBackward0",
    "Log1PBackward0", "Expm1Backward0", "LogicalNotBackward0", "PowBackward0", "GeluBackward0", "ErfBackward0",
};
static const char *const binop_grad_names[DP_NUM_BINOPS] = {
    "AddBackward0", "SubBackward0", "MulBackward0", "DivBackward0", "PowBackward1", "MaximumBackward0",
    "MinimumBackward0", "", "", "", "", "", "", "RemainderBackward0", "Atan2Backward0", "", "",
};
static const char *const redop_names[DP_NUM_REDOPS] = {
    "sum", "mean", "prod", "max", "min", "argmax", "argmin", "var", "std", "all", "any", "norm",
};

/* ---------------------------------------------------------------- helpers */

/* "add" -> "add_", for messages about in-place calls */
static const char *inplace_name(const char *name)
{
    static _Thread_local char buf[40];
    snprintf(buf, sizeof buf, "%s_", name);
    return buf;
}

static dp_status same_device(const char *fn, const dp_tensor *a, const dp_tensor *b)
{
    char x[16], y[16];
    if (a->device != b->device)
        return dp_fail(DP_ERR_DEVICE, "%s: expected all tensors to be on the same device, got %s and %s", fn,
                       dp_device_str(x, sizeof x, a->device), dp_device_str(y, sizeof y, b->device));
    return DP_OK;
}

/* Kernels run on the CPU only until the CUDA backend lands. */


static dp_status broadcast_shapes(const char *fn, int na, const int64_t *sa, int nb, const int64_t *sb,
                                  int *nout, int64_t *out)
{
    char x[160], y[160];
    int n = na > nb ? na : nb;
    for (int i = 0; i < n; i++) {
        int ia = i - (n - na), ib = i - (n - nb);
        int64_t da = ia >= 0 ? sa[ia] : 1, db = ib >= 0 ? sb[ib] : 1;
        if (da != db && da != 1 && db != 1)
            return dp_fail(DP_ERR_SHAPE, "%s: shape %s does not broadcast with %s "
                           "(size %lld vs %lld at dim %d)", fn, dp_shape_str(x, sizeof x, na, sa),
                           dp_shape_str(y, sizeof y, nb, sb), (long long)da, (long long)db, i);
        out[i] = da == 1 ? db : da;
    }
    *nout = n;
    return DP_OK;
}

/* A view of t expanded to shape, or a cast copy when dtype differs. */
static dp_status prepare(dp_tensor **res, dp_tensor *t, int ndim, const int64_t *shape, int dtype)
{
    if (t->dtype == dtype && t->ndim == ndim && !memcmp(t->shape, shape, sizeof(int64_t) * (size_t)ndim)) {
        dp_tensor_retain(t);
        *res = t;
        return DP_OK;
    }
    dp_tensor *e;
    dp_status st = dp_expand(&e, t, ndim, shape);
    if (st || t->dtype == dtype) {
        *res = st ? NULL : e;
        return st;
    }
    st = tensor_new(res, ndim, shape, dtype, t->device);
    if (!st && (st = k_copy(*res, e)))
        dp_tensor_release(*res);
    dp_tensor_release(e);
    return st;
}

/* When dst's dtype or shape is not the result's, compute into a temporary
 * and copy; PyTorch refuses to store a float result into an integer tensor
 * in place, and so do we. */
static dp_status check_into(const char *fn, const dp_tensor *dst, int result_dtype, int ndim, const int64_t *shape)
{
    char x[160], y[160];
    if (dtype_promote(result_dtype, dst->dtype) != dst->dtype)
        return dp_fail(DP_ERR_DTYPE, "%s_: result type %s can't be cast to the desired output type %s",
                       fn, dp_dtype_name(result_dtype), dp_dtype_name(dst->dtype));
    int n;
    int64_t bshape[DP_MAX_DIMS];
    dp_status st = broadcast_shapes(fn, dst->ndim, dst->shape, ndim, shape, &n, bshape);
    if (st)
        return st;
    if (n != dst->ndim || memcmp(bshape, dst->shape, sizeof(int64_t) * (size_t)n))
        return dp_fail(DP_ERR_SHAPE, "%s_: output with shape %s doesn't match the broadcast shape %s",
                       fn, dp_shape_str(x, sizeof x, dst->ndim, dst->shape), dp_shape_str(y, sizeof y, ndim, shape));
    return DP_OK;
}

/* The bytes t's elements span in its storage: [*lo, *hi], empty (lo > hi)
 * when t has no elements. */
static void byte_span(const dp_tensor *t, int64_t *lo, int64_t *hi)
{
    int64_t first = t->offset, last = t->offset;
    for (int d = 0; d < t->ndim; d++) {
        if (t->shape[d] == 0) {
            *lo = 1;
            *hi = 0;
            return;
        }
        const int64_t reach = (t->shape[d] - 1) * t->stride[d];
        *(reach < 0 ? &first : &last) += reach;
    }
    const int64_t es = (int64_t)dp_dtype_size(t->dtype);
    *lo = first * es;
    *hi = (last + 1) * es - 1;
}

static bool same_view(const dp_tensor *a, const dp_tensor *b)
{
    return a->storage == b->storage && a->offset == b->offset && a->dtype == b->dtype && a->ndim == b->ndim &&
           !memcmp(a->shape, b->shape, sizeof(int64_t) * (size_t)a->ndim) &&
           !memcmp(a->stride, b->stride, sizeof(int64_t) * (size_t)a->ndim);
}

/* PyTorch's rules for a write into dst of what is computed from the
 * inputs (NULL: none): no two of dst's elements are one memory location
 * (an expanded view), and an input in dst's memory is dst itself, not a
 * part, a transpose or a broadcast of it, whose elements the write would
 * change before they are read (t:add_(t:t()) gave wrong values). */
static dp_status check_overlap(const char *fn, const dp_tensor *dst, const dp_tensor *a, const dp_tensor *b)
{
    const int64_t n = shape_numel(dst->ndim, dst->shape);
    for (int d = 0; d < dst->ndim && n > 0; d++)
        if (dst->stride[d] == 0 && dst->shape[d] > 1)
            return dp_fail(DP_ERR_ARG, "%s: more than one element of the written-to tensor refers to a single memory "
                           "location (an expanded view): write into a clone() of it", fn);
    /* as PyTorch: only where both are dense (no gaps, no element twice) is
     * a common span an overlap: strided views may interleave, as two
     * columns of one matrix do */
    int64_t lo, hi;
    byte_span(dst, &lo, &hi);
    if (n * (int64_t)dp_dtype_size(dst->dtype) != hi - lo + 1)
        return DP_OK;
    const dp_tensor *in[2] = { a, b };
    for (int i = 0; i < 2; i++) {
        int64_t in_lo, in_hi;
        if (!in[i] || in[i]->storage != dst->storage || same_view(in[i], dst))
            continue;
        byte_span(in[i], &in_lo, &in_hi);
        if (shape_numel(in[i]->ndim, in[i]->shape) * (int64_t)dp_dtype_size(in[i]->dtype) != in_hi - in_lo + 1)
            continue;
        if (lo <= hi && in_lo <= in_hi && in_lo <= hi && lo <= in_hi)
            return dp_fail(DP_ERR_ARG, "%s: some elements of an input and of the written-to tensor refer to a single "
                           "memory location (an input is a part or a view of the output): pass a clone() of the "
                           "input", fn);
    }
    return DP_OK;
}

/* ---------------------------------------------------------------- unary */

static bool unop_needs_float(int op)
{
    switch (op) {
    case DP_EXP: case DP_LOG: case DP_SQRT: case DP_RSQRT: case DP_TANH: case DP_SIGMOID:
    case DP_GELU: case DP_GELU_TANH: case DP_SIN: case DP_COS: case DP_RECIPROCAL:
    case DP_LOG1P: case DP_EXPM1: case DP_ERF:
        return true;
    }
    return false;
}

static dp_status unary_dtypes(int op, const dp_tensor *a, int *compute, int *result)
{
    if (op < 0 || op >= DP_NUM_UNOPS)
        return dp_fail(DP_ERR_ARG, "unary: invalid op %d", op);
    *compute = a->dtype;
    if (unop_needs_float(op) && !dp_dtype_is_floating(a->dtype))
        *compute = DP_FLOAT32;
    if (a->dtype == DP_BOOL && op == DP_SQUARE)
        *compute = DP_INT64;   /* PyTorch: bool ** 2 is int64 */
    if (a->dtype == DP_BOOL && (op == DP_NEG || op == DP_RELU || op == DP_FLOOR || op == DP_CEIL || op == DP_ROUND))
        return dp_fail(DP_ERR_DTYPE, "%s: not supported for bool tensors%s", unop_names[op],
                       op == DP_NEG ? " (use logical_not() instead)" : "");
    *result = op == DP_LOGICAL_NOT ? DP_BOOL : *compute;
    return DP_OK;
}

static dp_status unary_run(dp_tensor *out, int op, dp_tensor *a, int compute)
{
    dp_tensor *in;
    dp_status st = prepare(&in, a, a->ndim, a->shape, compute);
    if (st)
        return st;
    st = k_unary(op, out, in);
    dp_tensor_release(in);
    return st;
}

dp_status dp_unary(dp_tensor **out, dp_unop op, dp_tensor *a)
{
    int compute = 0, result = 0;
    dp_status st = unary_dtypes(op, a, &compute, &result);
    if (st || (st = tensor_new(out, a->ndim, a->shape, result, a->device)))
        return st;
    if ((st = unary_run(*out, op, a, compute))) {
        dp_tensor_release(*out);
        return st;
    }
    ag_node *n;
    if ((st = ag_record_or_drop(out, unop_grad_names[op], bw_unary, 1, &a, &n)) || !n)
        return st;
    n->iarg[0] = op;
    ag_save(n, a);
    ag_save_output(n, *out);
    if (op == DP_RELU)
        ag_set_relu_mask(n, 1);
    return DP_OK;
}

/* An _into op whose dst cannot take the kernel's output as it is: the
 * op made the result in *tmp (st its status), which is copied into dst
 * (converted, broadcast) and released. */
static dp_status copy_made(dp_tensor *dst, dp_status st, dp_tensor **tmp)
{
    if (st)
        return st;
    st = dp_copy_into(dst, *tmp);
    dp_tensor_release(*tmp);
    return st;
}

dp_status dp_unary_into(dp_tensor *dst, dp_unop op, dp_tensor *a)
{
    int compute = 0, result = 0;
    dp_status st = unary_dtypes(op, a, &compute, &result);
    if (st || (st = same_device(unop_names[op], dst, a)) ||
        (st = check_into(unop_names[op], dst, result, a->ndim, a->shape)) ||
        (st = check_overlap(inplace_name(unop_names[op]), dst, a, NULL)) ||
        (st = ag_check_inplace(inplace_name(unop_names[op]), dst)))
        return st;
    if (dst->dtype == result && dst->ndim == a->ndim)
        return unary_run(dst, op, a, compute);
    dp_tensor *tmp;
    return copy_made(dst, dp_unary(&tmp, op, a), &tmp);
}

/* ---------------------------------------------------------------- binary */

static bool binop_is_comparison(int op)
{
    return (op >= DP_EQ && op <= DP_GE) || op == DP_LOGICAL_AND || op == DP_LOGICAL_OR;
}

static int rank_of(const dp_tensor *t)
{
    return t->ndim ? DTYPE_DIM : DTYPE_ZERO_DIM;
}

static dp_status binary_dtypes(int op, const dp_tensor *a, const dp_tensor *b, int *compute, int *result)
{
    if (op < 0 || op >= DP_NUM_BINOPS)
        return dp_fail(DP_ERR_ARG, "binary: invalid op %d", op);
    *compute = dtype_result(a->dtype, rank_of(a), b->dtype, rank_of(b));
    if ((op == DP_DIV || op == DP_ATAN2) && !dp_dtype_is_floating(*compute))
        *compute = DP_FLOAT32;
    if (*compute == DP_BOOL && (op == DP_SUB || op == DP_POW || op == DP_REMAINDER))
        return dp_fail(DP_ERR_DTYPE, "%s: not supported for two bool tensors%s", binop_names[op],
                       op == DP_SUB ? " (use logical_xor() or ne() instead)" : "");
    *result = binop_is_comparison(op) ? DP_BOOL : *compute;
    return DP_OK;
}

/* Integer ops that would trap or have no integer result are errors, as in
 * PyTorch, rather than undefined behaviour. */
static dp_status check_integer_operand(int op, int compute, dp_tensor *y)
{
    if (dp_dtype_is_floating(compute) || compute == DP_BOOL)
        return DP_OK;
    if (op == DP_REMAINDER && k_any(CPU_ANY_ZERO, y))
        return dp_fail(DP_ERR_ARG, "remainder: ZeroDivisionError: integer division by zero");
    if (op == DP_POW && k_any(CPU_ANY_NEGATIVE, y))
        return dp_fail(DP_ERR_ARG, "pow: integers to negative integer powers are not allowed "
                       "(convert to a floating dtype first)");
    return DP_OK;
}

static dp_status binary_run(dp_tensor *out, int op, dp_tensor *a, dp_tensor *b, int compute)
{
    dp_tensor *x = NULL, *y = NULL;
    dp_status st;
    if (!(st = prepare(&x, a, out->ndim, out->shape, compute)) &&
        !(st = prepare(&y, b, out->ndim, out->shape, compute)) &&
        !(st = check_integer_operand(op, compute, y)))
        st = k_binary(op, out, x, y);
    dp_tensor_release(x);
    dp_tensor_release(y);
    return st;
}

static dp_status binary_check(int op, dp_tensor *a, dp_tensor *b, int *compute, int *result,
                              int *ndim, int64_t *shape)
{
    dp_status st = binary_dtypes(op, a, b, compute, result);
    if (st || (st = same_device(binop_names[op], a, b)))
        return st;
    return broadcast_shapes(binop_names[op], a->ndim, a->shape, b->ndim, b->shape, ndim, shape);
}

dp_status dp_binary(dp_tensor **out, dp_binop op, dp_tensor *a, dp_tensor *b)
{
    int compute = 0, result = 0, ndim = 0;
    int64_t shape[DP_MAX_DIMS];
    dp_status st = binary_check(op, a, b, &compute, &result, &ndim, shape);
    if (st || (st = tensor_new(out, ndim, shape, result, a->device)))
        return st;
    if ((st = binary_run(*out, op, a, b, compute))) {
        dp_tensor_release(*out);
        return st;
    }
    ag_node *n;
    dp_tensor *ins[2] = { a, b };
    if ((st = ag_record_or_drop(out, binop_grad_names[op], bw_binary, 2, ins, &n)) || !n)
        return st;
    n->iarg[0] = op;
    ag_save(n, a);
    ag_save(n, b);
    ag_save_output(n, *out);
    return DP_OK;
}

dp_status dp_binary_into(dp_tensor *dst, dp_binop op, dp_tensor *a, dp_tensor *b)
{
    int compute = 0, result = 0, ndim = 0;
    int64_t shape[DP_MAX_DIMS];
    dp_status st = binary_check(op, a, b, &compute, &result, &ndim, shape);
    if (st || (st = same_device(binop_names[op], dst, a)) ||
        (st = check_into(binop_names[op], dst, result, ndim, shape)) ||
        (st = check_overlap(inplace_name(binop_names[op]), dst, a, b)) ||
        (st = ag_check_inplace(inplace_name(binop_names[op]), dst)))
        return st;
    if (dst->dtype == result && dst->ndim == ndim)
        return binary_run(dst, op, a, b, compute);
    dp_tensor *tmp;
    return copy_made(dst, dp_binary(&tmp, op, a, b), &tmp);
}

/* A Lua number is a "wrapped scalar" in PyTorch's sense: int64 when it
 * has an integer value, else float32, and of the lowest priority, so that
 * float32 + 2.5 stays float32 and int32 + 2 stays int32. The scalar becomes
 * a 0-d tensor of the result dtype, which then promotes the same way. */
static int scalar_dtype(const dp_tensor *a, double s)
{
    bool integral = s == floor(s) && fabs(s) < 9.3e18;
    return dtype_result(a->dtype, rank_of(a), integral ? DP_INT64 : DP_FLOAT32, DTYPE_WRAPPED);
}

/* A Lua number in an op becomes a 0-d tensor on the op's device. The
 * numbers a loop uses step after step (x * 0.5, x / 255) are kept, direct-
 * mapped by value, dtype, device and stream, so that on a GPU such an op
 * costs no fill kernel for its number (the stream: a kept number was
 * filled on the stream current then, which another stream's kernels are
 * not ordered after). Nothing writes into them: they are only ever an op's
 * input (and an autograd node's saved input). None is kept while a CUDA
 * graph is captured, since memory made then is filled only when the graph
 * replays; one kept before is used. */
#define SCALAR_CACHE 64
static struct kept_scalar {
    dp_tensor *t;
    double v;
    int dtype, device;
    void *stream;
} scalar_cache[SCALAR_CACHE];

static dp_status scalar_tensor(dp_tensor **out, const dp_tensor *a, double s)
{
    int dtype = scalar_dtype(a, s), device = a->device;
    void *stream = device == DP_CPU ? NULL : dp_cuda_current_stream(device);
    uint64_t bits;
    memcpy(&bits, &s, sizeof bits);   /* by bits: -0.0 and 0.0 differ, a NaN finds itself */
    uint64_t h = (bits ^ (bits >> 31) ^ ((uint64_t)dtype << 8) ^ (uint64_t)(device + 1)) * 0x9E3779B97F4A7C15ull;
    struct kept_scalar *kept = &scalar_cache[h >> 58];   /* 64 slots */
    if (kept->t && memcmp(&kept->v, &s, sizeof s) == 0 && kept->dtype == dtype && kept->device == device &&
        kept->stream == stream) {
        dp_tensor_retain(kept->t);
        *out = kept->t;
        return DP_OK;
    }
    /* (not dp_full: a number beside a tensor converts as its op's kernel
     * converts it, wrapping or saturating as PyTorch's do, where full
     * refuses a value its dtype cannot hold) */
    dp_status st = tensor_filled(out, 0, NULL, s, dtype, device);
    /* A kept tensor is let go only on the stream it was kept for (where
     * its memory is given back when it is released): kernels queued on
     * that stream that read it are then ordered before any reuse. */
    bool kept_freeable = !kept->t || kept->device == DP_CPU || kept->stream == dp_cuda_current_stream(kept->device);
    if (!st && kept_freeable && (device == DP_CPU || !dp_cuda_capturing())) {
        dp_tensor_release(kept->t);
        dp_tensor_retain(*out);
        kept->t = *out;
        kept->v = s;
        kept->dtype = dtype;
        kept->device = device;
        kept->stream = stream;
    }
    return st;
}

/* a op s, or s op a with scalar_first, s as a tensor (scalar_tensor):
 * into dst when there is one, else a new *out. */
static dp_status binary_with_scalar(dp_tensor **out, dp_tensor *dst, int op, dp_tensor *a, double s,
                                    int scalar_first)
{
    dp_tensor *t;
    dp_status st = scalar_tensor(&t, a, s);
    if (st)
        return st;
    dp_tensor *x = scalar_first ? t : a, *y = scalar_first ? a : t;
    st = dst ? dp_binary_into(dst, op, x, y) : dp_binary(out, op, x, y);
    dp_tensor_release(t);
    return st;
}

dp_status dp_binary_scalar(dp_tensor **out, dp_binop op, dp_tensor *a, double s, int scalar_first)
{
    return binary_with_scalar(out, NULL, op, a, s, scalar_first);
}

dp_status dp_binary_scalar_into(dp_tensor *dst, dp_binop op, dp_tensor *a, double s, int scalar_first)
{
    return binary_with_scalar(NULL, dst, op, a, s, scalar_first);
}

/* ---------------------------------------------------------------- where, clamp */

dp_status dp_where(dp_tensor **out, dp_tensor *cond, dp_tensor *a, dp_tensor *b)
{
    int n1, n2;
    int64_t s1[DP_MAX_DIMS], s2[DP_MAX_DIMS];
    dp_status st;
    if (cond->dtype != DP_BOOL)
        return dp_fail(DP_ERR_DTYPE, "where: expected condition to be a bool tensor, got %s",
                       dp_dtype_name(cond->dtype));
    if ((st = same_device("where", cond, a)) || (st = same_device("where", a, b)) ||
        (st = broadcast_shapes("where", a->ndim, a->shape, b->ndim, b->shape, &n1, s1)) ||
        (st = broadcast_shapes("where", cond->ndim, cond->shape, n1, s1, &n2, s2)))
        return st;
    int dtype = dtype_promote(a->dtype, b->dtype);
    dp_tensor *c = NULL, *x = NULL, *y = NULL;
    if (!(st = prepare(&c, cond, n2, s2, DP_BOOL)) && !(st = prepare(&x, a, n2, s2, dtype)) &&
        !(st = prepare(&y, b, n2, s2, dtype)) && !(st = tensor_new(out, n2, s2, dtype, a->device))) {
        ag_node *n = NULL;
        dp_tensor *ins[3] = { cond, a, b };
        if ((st = k_where(*out, c, x, y)))
            dp_tensor_release(*out);
        else if (!(st = ag_record_or_drop(out, "WhereBackward0", bw_where, 3, ins, &n)) && n)
            ag_save(n, cond);
    }
    dp_tensor_release(c);
    dp_tensor_release(x);
    dp_tensor_release(y);
    return st;
}

static int clamp_dtype(const dp_tensor *a, double lo, double hi)
{
    bool integral = (isnan(lo) || lo == floor(lo)) && (isnan(hi) || hi == floor(hi));
    if (a->dtype == DP_BOOL || (!dp_dtype_is_floating(a->dtype) && !integral))
        return integral ? DP_INT64 : DP_FLOAT32;
    return a->dtype;
}

static dp_status clamp_check(dp_tensor *a, double lo, double hi)
{
    if (isnan(lo) && isnan(hi))
        return dp_fail(DP_ERR_ARG, "clamp: at least one of 'min' or 'max' must not be nil");
    (void)a;
    return DP_OK;
}

dp_status dp_clamp(dp_tensor **out, dp_tensor *a, double lo, double hi)
{
    dp_status st = clamp_check(a, lo, hi);
    int dtype = clamp_dtype(a, lo, hi);
    dp_tensor *x;
    if (st || (st = prepare(&x, a, a->ndim, a->shape, dtype)))
        return st;
    if (!(st = tensor_new(out, a->ndim, a->shape, dtype, a->device)) &&
        (st = k_clamp(*out, x, isnan(lo) ? -INFINITY : lo, isnan(hi) ? INFINITY : hi)))
        dp_tensor_release(*out);
    dp_tensor_release(x);
    ag_node *n = NULL;
    if (!st && !(st = ag_record_or_drop(out, "ClampBackward1", bw_clamp, 1, &a, &n)) && n) {
        ag_save(n, a);
        n->darg[0] = lo;
        n->darg[1] = hi;
    }
    return st;
}

dp_status dp_clamp_into(dp_tensor *dst, dp_tensor *a, double lo, double hi)
{
    dp_status st = clamp_check(a, lo, hi);
    if (st || (st = check_into("clamp", dst, clamp_dtype(a, lo, hi), a->ndim, a->shape)) ||
        (st = check_overlap("clamp_", dst, a, NULL)) || (st = ag_check_inplace("clamp_", dst)))
        return st;
    dp_tensor *tmp;
    return copy_made(dst, dp_clamp(&tmp, a, lo, hi), &tmp);
}

/* ---------------------------------------------------------------- copy, fill, to */

dp_status dp_copy_into(dp_tensor *dst, dp_tensor *src)
{
    dp_tensor *e;
    dp_status st;
    if ((st = check_overlap("copy_", dst, src, NULL)) || (st = ag_check_inplace("copy_", dst)))
        return st;   /* (copies may cross devices) */
    if (src->ndim == dst->ndim && !memcmp(src->shape, dst->shape, sizeof(int64_t) * (size_t)dst->ndim))
        return k_copy(dst, src);
    if ((st = dp_expand(&e, src, dst->ndim, dst->shape))) {
        char x[160], y[160];
        return dp_fail(DP_ERR_SHAPE, "copy_: source shape %s does not broadcast to destination shape %s",
                       dp_shape_str(x, sizeof x, src->ndim, src->shape),
                       dp_shape_str(y, sizeof y, dst->ndim, dst->shape));
    }
    st = k_copy(dst, e);
    dp_tensor_release(e);
    return st;
}

dp_status dp_fill_into(dp_tensor *dst, double value)
{
    if (!dp_dtype_holds(dst->dtype, value))
        return dp_fail(DP_ERR_ARG, "fill_: value %g cannot be converted to %s without overflow", value,
                       dp_dtype_name(dst->dtype));
    dp_status st = ag_check_inplace("fill_", dst);
    if (st)
        return st;
    return k_fill(dst, value);
}

/* a copied by `copy` into a new tensor of dtype on device (pinned: in
 * page-locked host memory), the copy recorded for autograd as PyTorch
 * names it */
static dp_status copy_to_new(dp_tensor **out, dp_tensor *a, dp_dtype dtype, int device, bool pinned,
                             dp_status (*copy)(dp_tensor *dst, dp_tensor *src))
{
    dp_status st = pinned ? tensor_new_pinned(out, a->ndim, a->shape, dtype)
                          : tensor_new(out, a->ndim, a->shape, dtype, device);
    if (!st && (st = copy(*out, a))) {
        dp_tensor_release(*out);
        return st;
    }
    ag_node *n;
    return st ? st : ag_record_or_drop(out, "ToCopyBackward0", bw_identity, 1, &a, &n);
}

dp_status dp_to(dp_tensor **out, dp_tensor *a, dp_dtype dtype, int device)
{
    if (dtype < 0 || dtype >= DP_NUM_DTYPES)
        return dp_fail(DP_ERR_DTYPE, "to: invalid dtype %d", dtype);
    if (device < DP_CPU)
        return dp_fail(DP_ERR_DEVICE, "to: invalid device %d", device);
    if ((int)dtype == a->dtype && device == a->device) {
        dp_tensor_retain(a);
        *out = a;
        return DP_OK;
    }
    return copy_to_new(out, a, dtype, device, false, dp_copy_into);
}

dp_status dp_to_non_blocking(dp_tensor **out, dp_tensor *a, dp_dtype dtype, int device)
{
    if (!a->storage->pinned || device == DP_CPU || (int)dtype != a->dtype || !tensor_is_contiguous(a))
        return dp_to(out, a, dtype, device);
    return copy_to_new(out, a, dtype, device, false, gpu_upload_queued);
}

dp_status dp_pin_memory(dp_tensor **out, dp_tensor *a)
{
    if (a->device != DP_CPU)
        return dp_fail(DP_ERR_DEVICE, "pin_memory: expected a CPU tensor, got one on cuda:%d (only host memory is "
                       "pinned)", a->device);
    if (a->storage->pinned) {
        dp_tensor_retain(a);
        *out = a;
        return DP_OK;
    }
    return copy_to_new(out, a, (dp_dtype)a->dtype, DP_CPU, true, dp_copy_into);
}

int dp_tensor_is_pinned(const dp_tensor *t) { return t->storage->pinned; }

dp_status dp_pinned_wait(dp_tensor *t)
{
    return t->storage->pinned ? gpu_pinned_wait(t->storage) : DP_OK;
}

/* ---------------------------------------------------------------- reductions */

static int reduce_result_dtype(int op, int dtype)
{
    switch (op) {
    case DP_SUM: case DP_PROD:
        return dp_dtype_is_floating(dtype) ? dtype : DP_INT64;
    case DP_ARGMAX: case DP_ARGMIN:
        return DP_INT64;
    case DP_ALL: case DP_ANY:
        return DP_BOOL;
    }
    return dtype;
}

static dp_status reduce_check(const char *fn, int op, dp_tensor *a, int *dim)
{
    dp_status st;
    if (op < 0 || op >= DP_NUM_REDOPS)
        return dp_fail(DP_ERR_ARG, "reduce: invalid op %d", op);
    if ((op == DP_MEAN || op == DP_VAR || op == DP_STD || op == DP_NORM) && !dp_dtype_is_floating(a->dtype))
        return dp_fail(DP_ERR_DTYPE, "%s: could not infer output dtype: input dtype must be a floating "
                       "point dtype, got %s (convert with :float() first)", fn, dp_dtype_name(a->dtype));
    if (*dim != DP_ALL_DIMS && (st = dim_check(fn, dim, a->ndim)))
        return st;
    bool needs_values = op == DP_MAX || op == DP_MIN || op == DP_ARGMAX || op == DP_ARGMIN;
    int64_t len = *dim == DP_ALL_DIMS ? dp_tensor_numel(a) : a->ndim ? a->shape[*dim] : 1;
    if (needs_values && len == 0)
        return dp_fail(DP_ERR_SHAPE, "%s: expected reduction dim to have non-zero size "
                       "(cannot take the %s of an empty tensor)", fn, fn);
    return DP_OK;
}

/* Shape of the result: dim removed or kept as 1. */
static int reduced_shape(const dp_tensor *a, int dim, int keepdim, int64_t *shape)
{
    int n = 0;
    for (int i = 0; i < a->ndim; i++) {
        if (i == dim && !keepdim) continue;
        shape[n++] = i == dim ? 1 : a->shape[i];
    }
    return n;
}

/* Runs a reduction with dim resolved; DP_ALL_DIMS flattens first. */
static dp_status reduce_kernel(dp_tensor **values, dp_tensor **indices, int op, dp_tensor *a, int dim,
                               int keepdim, int correction)
{
    dp_tensor *src = a;
    dp_status st;
    int64_t shape[DP_MAX_DIMS];
    int ndim;
    if (dim == DP_ALL_DIMS || a->ndim == 0) {
        int64_t n = dp_tensor_numel(a);
        if ((st = dp_reshape(&src, a, 1, &n)))
            return st;
        dim = 0;
        ndim = 0;
    } else {
        dp_tensor_retain(src);
        ndim = reduced_shape(a, dim, keepdim, shape);
    }
    *values = NULL;
    if (indices)
        *indices = NULL;
    if (!(st = tensor_new(values, ndim, shape, reduce_result_dtype(op, a->dtype), a->device)) &&
        (!indices || !(st = tensor_new(indices, ndim, shape, DP_INT64, a->device))))
        st = k_reduce(op, *values, indices ? *indices : NULL, src, dim, correction);
    if (st) {
        dp_tensor_release(*values);
        if (indices)
            dp_tensor_release(*indices);
    }
    dp_tensor_release(src);
    return st;
}

/* Runs the kernel with recording off (it reshapes internally), then
 * records one node for the whole reduction. */
static dp_status reduce_run(dp_tensor **values, dp_tensor **indices, int op, dp_tensor *a, int dim,
                            int keepdim, int correction)
{
    static const char *const names[2][DP_NUM_REDOPS] = {
        { "SumBackward0", "MeanBackward0", "ProdBackward0", "MaxBackward1", "MinBackward1", "", "",
          "VarBackward0", "StdBackward0", "", "", "NormBackward1" },
        { "SumBackward1", "MeanBackward1", "ProdBackward1", "AmaxBackward0", "AminBackward0", "", "",
          "VarBackward0", "StdBackward0", "", "", "NormBackward1" },
    };
    int was = dp_set_grad_enabled(0);
    dp_status st = reduce_kernel(values, indices, op, a, dim, keepdim, correction);
    dp_set_grad_enabled(was);
    ag_node *n;
    if (st)
        return st;
    if (indices) {
        st = ag_record_or_drop(values, op == DP_MAX ? "MaxBackward0" : "MinBackward0", bw_reduce_index, 1, &a, &n);
        if (st && indices)
            dp_tensor_release(*indices);
        if (!n)
            return st;
        ag_save(n, *indices);
    } else {
        if ((st = ag_record_or_drop(values, names[dim != DP_ALL_DIMS][op], bw_reduce, 1, &a, &n)) || !n)
            return st;
        ag_save(n, a);
        ag_save_output(n, *values);
    }
    n->iarg[0] = op;
    n->iarg[1] = a->ndim == 0 ? DP_ALL_DIMS : dim;
    n->iarg[2] = keepdim;
    n->iarg[3] = correction;
    return DP_OK;
}

dp_status dp_reduce(dp_tensor **out, dp_redop op, dp_tensor *a, int dim, int keepdim, int correction)
{
    const char *fn = op >= 0 && op < DP_NUM_REDOPS ? redop_names[op] : "reduce";
    dp_status st = reduce_check(fn, op, a, &dim);
    return st ? st : reduce_run(out, NULL, op, a, dim, keepdim, correction);
}

dp_status dp_reduce_with_index(dp_tensor **values, dp_tensor **indices, dp_redop op, dp_tensor *a, int dim, int keepdim)
{
    if (op != DP_MAX && op != DP_MIN)
        return dp_fail(DP_ERR_ARG, "reduce_with_index: only max and min return indices");
    if (dim == DP_ALL_DIMS)
        return dp_fail(DP_ERR_ARG, "%s: indices need a dim", redop_names[op]);
    dp_status st = reduce_check(redop_names[op], op, a, &dim);
    return st ? st : reduce_run(values, indices, op, a, dim, keepdim, 0);
}

dp_status dp_softmax(dp_tensor **out, dp_tensor *a, int dim, int log)
{
    const char *fn = log ? "log_softmax" : "softmax";
    dp_status st;
    if ((st = dim_check(fn, &dim, a->ndim)))
        return st;
    if (!dp_dtype_is_floating(a->dtype))
        return dp_fail(DP_ERR_DTYPE, "%s: expected a floating point tensor, got %s", fn, dp_dtype_name(a->dtype));
    if ((st = tensor_new(out, a->ndim, a->shape, a->dtype, a->device)))
        return st;
    /* nothing to compute; the rows around an empty dim may still be many */
    if (dp_tensor_numel(a) > 0 && (st = k_softmax(*out, a, dim, log))) {
        dp_tensor_release(*out);
        return st;
    }
    ag_node *n;
    if ((st = ag_record_or_drop(out, log ? "LogSoftmaxBackward0" : "SoftmaxBackward0", bw_softmax, 1, &a, &n)) || !n)
        return st;
    ag_save_output(n, *out);
    n->iarg[0] = dim;
    n->iarg[1] = log;
    if (log)
        ag_set_log_softmax_fold(n, 0);
    return DP_OK;
}

/* ---------------------------------------------------------------- matmul */

/* t itself when cpu_bmm takes it as an operand of dtype, else a
 * contiguous copy of dtype */
static dp_status bmm_operand(dp_tensor **res, dp_tensor *t, int dtype)
{
    if (t->dtype == dtype && cpu_bmm_takes(t)) {
        dp_tensor_retain(t);
        *res = t;
        return DP_OK;
    }
    dp_status st = tensor_new(res, t->ndim, t->shape, dtype, t->device);
    if (!st && (st = cpu_copy(*res, t))) {
        dp_tensor_release(*res);
        *res = NULL;
    }
    return st;
}

/* bfloat16 is multiplied in float32, integers exactly in int64; the
 * result is copied into out when it is not out itself. */
dp_status bmm_on_cpu(dp_tensor *out, dp_tensor *a, dp_tensor *b)
{
    if (out->shape[0] == 0 || out->shape[1] == 0 || out->shape[2] == 0)
        return DP_OK;
    if (a->shape[2] == 0)
        return cpu_fill(out, 0);
    int dtype = !dp_dtype_is_floating(out->dtype) ? DP_INT64 : out->dtype == DP_FLOAT64 ? DP_FLOAT64 : DP_FLOAT32;
    dp_tensor *ka = NULL, *kb = NULL, *ko = NULL;
    dp_status st;
    if (!(st = bmm_operand(&ka, a, dtype)) && !(st = bmm_operand(&kb, b, dtype))) {
        if (out->dtype == dtype && tensor_is_contiguous(out)) {
            dp_tensor_retain(out);
            ko = out;
        } else {
            st = tensor_new(&ko, 3, out->shape, dtype, out->device);
        }
    }
    if (!st && !(st = cpu_bmm(ko, ka, kb)) && ko != out)
        st = cpu_copy(out, ko);
    dp_tensor_release(ka);
    dp_tensor_release(kb);
    dp_tensor_release(ko);
    return st;
}

/* The checks of a product fn of a and b: dtypes, devices, then the
 * operands' dimensions (ndim_ok, else the message says what fn expected). */
static dp_status matmul_check(const char *fn, const dp_tensor *a, const dp_tensor *b, bool ndim_ok,
                              const char *expected)
{
    if (a->dtype != b->dtype)
        return dp_fail(DP_ERR_DTYPE, "%s: expected both operands to have the same dtype, got %s and %s",
                       fn, dp_dtype_name(a->dtype), dp_dtype_name(b->dtype));
    if (a->dtype == DP_BOOL)
        return dp_fail(DP_ERR_DTYPE, "%s: not supported for bool tensors", fn);
    dp_status st = same_device(fn, a, b);
    if (st || ndim_ok)
        return st;
    return dp_fail(DP_ERR_SHAPE, "%s: %s, got %dD and %dD", fn, expected, a->ndim, b->ndim);
}

static dp_status matmul_nd(const char *fn, dp_tensor **out, dp_tensor *a, dp_tensor *b, bool drop_m, bool drop_n);

/* Runs the product with recording off and records one node on the
 * result, whose backward knows the original (possibly 1-D) operands. */
static dp_status matmul_recorded(const char *fn, dp_tensor **out, dp_tensor *a, dp_tensor *b)
{
    dp_tensor *a2 = NULL, *b2 = NULL;
    bool drop_m = a->ndim == 1, drop_n = b->ndim == 1;
    int was = dp_set_grad_enabled(0);
    dp_status st;
    if (!(st = drop_m ? dp_unsqueeze(&a2, a, 0) : dp_alias(&a2, a)) &&
        !(st = drop_n ? dp_unsqueeze(&b2, b, 1) : dp_alias(&b2, b)))
        st = matmul_nd(fn, out, a2, b2, drop_m, drop_n);
    dp_set_grad_enabled(was);
    dp_tensor_release(a2);
    dp_tensor_release(b2);
    if (st)
        return st;
    const char *name = a->ndim == 1 && b->ndim == 1 ? "DotBackward0" : b->ndim == 1 && a->ndim == 2 ? "MvBackward0"
                     : a->ndim == 2 && b->ndim == 2 ? "MmBackward0" : a->ndim == 3 && b->ndim == 3 ? "BmmBackward0"
                     : "MatmulBackward0";
    ag_node *n;
    dp_tensor *ins[2] = { a, b };
    if ((st = ag_record_or_drop(out, name, bw_matmul, 2, ins, &n)) || !n)
        return st;
    ag_save(n, a);
    ag_save(n, b);
    return DP_OK;
}

/* a (batch.., m, k) @ b (batch.., k, n) after 1-D operands got their unit
 * dims; `drop` says which unit dims of the result to remove again. */
static dp_status matmul_nd(const char *fn, dp_tensor **out, dp_tensor *a, dp_tensor *b, bool drop_m, bool drop_n)
{
    char x[160], y[160];
    int64_t m = a->shape[a->ndim - 2], k = a->shape[a->ndim - 1];
    int64_t k2 = b->shape[b->ndim - 2], n = b->shape[b->ndim - 1];
    if (k != k2)
        return dp_fail(DP_ERR_SHAPE, "%s: mat1 and mat2 shapes cannot be multiplied (%s and %s: "
                       "inner sizes %lld and %lld differ)", fn,
                       dp_shape_str(x, sizeof x, a->ndim, a->shape), dp_shape_str(y, sizeof y, b->ndim, b->shape),
                       (long long)k, (long long)k2);
    int nbatch;
    int64_t batch[DP_MAX_DIMS], full[DP_MAX_DIMS];
    dp_status st = broadcast_shapes(fn, a->ndim - 2, a->shape, b->ndim - 2, b->shape, &nbatch, batch);
    if (st)
        return st;
    if (nbatch + 2 > DP_MAX_DIMS)
        return dp_fail(DP_ERR_SHAPE, "%s: too many batch dims", fn);
    int64_t B = shape_numel(nbatch, batch);
    dp_tensor *ea = NULL, *eb = NULL, *a3 = NULL, *b3 = NULL, *o3 = NULL;
    memcpy(full, batch, sizeof(int64_t) * (size_t)nbatch);
    full[nbatch] = m; full[nbatch + 1] = k;
    int64_t sa[3] = { B, m, k }, sb[3] = { B, k, n }, so[3] = { B, m, n };
    if ((st = dp_expand(&ea, a, nbatch + 2, full)) || (st = dp_reshape(&a3, ea, 3, sa)))
        goto done;
    full[nbatch] = k; full[nbatch + 1] = n;
    if ((st = dp_expand(&eb, b, nbatch + 2, full)) || (st = dp_reshape(&b3, eb, 3, sb)) ||
        (st = tensor_new(&o3, 3, so, a->dtype, a->device)) || (st = k_bmm(o3, a3, b3)))
        goto done;
    /* final shape: batch, then m unless dropped, then n unless dropped */
    int nd = nbatch;
    if (!drop_m) full[nd++] = m;
    if (!drop_n) full[nd++] = n;
    st = dp_view(out, o3, nd, full);
done:
    dp_tensor_release(ea); dp_tensor_release(eb);
    dp_tensor_release(a3); dp_tensor_release(b3); dp_tensor_release(o3);
    return st;
}

dp_status dp_matmul(dp_tensor **out, dp_tensor *a, dp_tensor *b)
{
    dp_status st = matmul_check("matmul", a, b, a->ndim > 0 && b->ndim > 0,
                                "both arguments need at least 1 dimension");
    return st ? st : matmul_recorded("matmul", out, a, b);
}

dp_status dp_mm(dp_tensor **out, dp_tensor *a, dp_tensor *b)
{
    dp_status st = matmul_check("mm", a, b, a->ndim == 2 && b->ndim == 2, "expected 2-D matrices");
    return st ? st : matmul_recorded("mm", out, a, b);
}

dp_status dp_bmm(dp_tensor **out, dp_tensor *a, dp_tensor *b)
{
    dp_status st = matmul_check("bmm", a, b, a->ndim == 3 && b->ndim == 3, "expected 3-D tensors");
    if (st)
        return st;
    if (a->shape[0] != b->shape[0])
        return dp_fail(DP_ERR_SHAPE, "bmm: batch sizes differ: %lld and %lld",
                       (long long)a->shape[0], (long long)b->shape[0]);
    return matmul_recorded("bmm", out, a, b);
}

/* ---------------------------------------------------------------- indexing */

static dp_status check_index_tensor(const char *fn, const dp_tensor *index)
{
    if (index->dtype != DP_INT64 && index->dtype != DP_INT32)
        return dp_fail(DP_ERR_DTYPE, "%s: expected an int64 index tensor, got %s", fn, dp_dtype_name(index->dtype));
    return DP_OK;   /* any device: GPU kernels take a device copy */
}

/* What index_select and gather share once their arguments are checked:
 * out (of shape ndim, shape) filled by k from a along dim, recorded with
 * index saved for the backward. */
static dp_status index_op_run(dp_tensor **out, dp_tensor *a, int dim, dp_tensor *index, int ndim,
                              const int64_t *shape,
                              dp_status (*k)(dp_tensor *out, dp_tensor *a, int dim, dp_tensor *index),
                              const char *grad_name, ag_backward_fn bw)
{
    dp_status st;
    if ((st = tensor_new(out, ndim, shape, a->dtype, a->device)))
        return st;
    if ((st = k(*out, a, dim, index))) {
        dp_tensor_release(*out);
        return st;
    }
    ag_node *n;
    if ((st = ag_record_or_drop(out, grad_name, bw, 1, &a, &n)) || !n)
        return st;
    ag_save(n, index);
    n->iarg[0] = dim;
    return DP_OK;
}

dp_status dp_index_select(dp_tensor **out, dp_tensor *a, int dim, dp_tensor *index)
{
    dp_status st;
    if ((st = check_index_tensor("index_select", index)) || 
        (st = dim_check("index_select", &dim, a->ndim)))
        return st;
    if (index->ndim > 1)
        return dp_fail(DP_ERR_SHAPE, "index_select: index must be 0-D or 1-D, got %dD", index->ndim);
    int64_t shape[DP_MAX_DIMS];
    memcpy(shape, a->shape, sizeof shape);
    if (a->ndim)
        shape[dim] = dp_tensor_numel(index);
    return index_op_run(out, a, dim, index, a->ndim, shape, k_index_select, "IndexSelectBackward0", bw_index_select);
}

dp_status dp_gather(dp_tensor **out, dp_tensor *a, int dim, dp_tensor *index)
{
    char x[160], y[160];
    dp_status st;
    if ((st = check_index_tensor("gather", index)) || 
        (st = dim_check("gather", &dim, a->ndim)))
        return st;
    if (index->ndim != a->ndim && !(index->ndim <= 1 && a->ndim <= 1))
        return dp_fail(DP_ERR_SHAPE, "gather: index tensor must have the same number of dimensions "
                       "as input (%d), got %d", a->ndim, index->ndim);
    for (int d = 0; d < index->ndim && d < a->ndim; d++)
        if (d != dim && index->shape[d] > a->shape[d])
            return dp_fail(DP_ERR_SHAPE, "gather: size of index %s does not fit input %s at dim %d",
                           dp_shape_str(x, sizeof x, index->ndim, index->shape),
                           dp_shape_str(y, sizeof y, a->ndim, a->shape), d);
    return index_op_run(out, a, dim, index, index->ndim, index->shape, k_gather, "GatherBackward0", bw_gather);
}

/* scatter / scatter_add: a copy of a with src[p] written (or added) at p
 * with dim replaced by index[p], over index's shape. Recorded with the
 * index saved; iarg: dim, add. */
dp_status dp_scatter(dp_tensor **out, dp_tensor *a, int dim, dp_tensor *index, dp_tensor *src, int add)
{
    const char *fn = add ? "scatter_add" : "scatter";
    char x[160], y[160], z[160];
    dp_status st;
    if ((st = check_index_tensor(fn, index)) || (st = dim_check(fn, &dim, a->ndim)) ||
        (st = same_device(fn, a, src)))
        return st;
    if (src->dtype != a->dtype)
        return dp_fail(DP_ERR_DTYPE, "%s: expected src of the input's dtype %s, got %s", fn, dp_dtype_name(a->dtype),
                       dp_dtype_name(src->dtype));
    if (index->ndim != a->ndim || src->ndim != a->ndim)
        return dp_fail(DP_ERR_SHAPE, "%s: index and src must have as many dimensions as the input (%d), got %d and %d",
                       fn, a->ndim, index->ndim, src->ndim);
    for (int d = 0; d < index->ndim; d++)
        if (index->shape[d] > src->shape[d] || (d != dim && index->shape[d] > a->shape[d]))
            return dp_fail(DP_ERR_SHAPE, "%s: index %s must not be larger than src %s in any dim, nor than the "
                           "input %s in any dim but %d", fn, dp_shape_str(x, sizeof x, index->ndim, index->shape),
                           dp_shape_str(y, sizeof y, src->ndim, src->shape),
                           dp_shape_str(z, sizeof z, a->ndim, a->shape), dim);
    if ((st = tensor_new(out, a->ndim, a->shape, a->dtype, a->device)))
        return st;
    if ((st = k_copy(*out, a)) || (st = (add ? k_scatter_add : k_scatter)(*out, dim, index, src))) {
        dp_tensor_release(*out);
        return st;
    }
    ag_node *n;
    dp_tensor *inputs[2] = { a, src };
    if ((st = ag_record_or_drop(out, add ? "ScatterAddBackward0" : "ScatterBackward0", bw_scatter, 2, inputs, &n)) ||
        !n)
        return st;
    ag_save(n, index);
    n->iarg[0] = dim;
    n->iarg[1] = add;
    return DP_OK;
}

dp_status dp_cat(dp_tensor **out, int n, dp_tensor *const *ts, int dim)
{
    char x[160], y[160];
    dp_status st;
    if (n <= 0)
        return dp_fail(DP_ERR_ARG, "cat: expected a non-empty list of tensors");
    const dp_tensor *first = ts[0];
    if (first->ndim == 0)
        return dp_fail(DP_ERR_SHAPE, "cat: zero-dimensional tensor (at position 0) cannot be concatenated");
    if ((st = dim_check("cat", &dim, first->ndim)))
        return st;
    int dtype = first->dtype;
    int64_t shape[DP_MAX_DIMS];
    memcpy(shape, first->shape, sizeof shape);
    shape[dim] = 0;
    for (int i = 0; i < n; i++) {
        const dp_tensor *t = ts[i];
        if ((st = same_device("cat", first, t)))
            return st;
        bool ok = t->ndim == first->ndim;
        for (int d = 0; ok && d < t->ndim; d++)
            ok = d == dim || t->shape[d] == first->shape[d];
        if (!ok)
            return dp_fail(DP_ERR_SHAPE, "cat: sizes of tensors must match except in dimension %d: "
                           "tensor 0 has shape %s but tensor %d has shape %s", dim,
                           dp_shape_str(x, sizeof x, first->ndim, first->shape), i,
                           dp_shape_str(y, sizeof y, t->ndim, t->shape));
        shape[dim] += t->shape[dim];
        dtype = dtype_promote(dtype, t->dtype);
    }
    if ((st = tensor_new(out, first->ndim, shape, dtype, first->device)))
        return st;
    int64_t at = 0;
    for (int i = 0; i < n && !st; i++) {
        dp_tensor *part;
        if (!(st = dp_narrow(&part, *out, dim, at, ts[i]->shape[dim]))) {
            st = k_copy(part, ts[i]);
            dp_tensor_release(part);
        }
        at += ts[i]->shape[dim];
    }
    if (st) {
        dp_tensor_release(*out);
        return st;
    }
    ag_node *nd;
    if ((st = ag_record_or_drop(out, "CatBackward0", bw_cat, n, ts, &nd)) || !nd)
        return st;
    nd->iarg[0] = dim;
    return DP_OK;
}

dp_status dp_stack(dp_tensor **out, int n, dp_tensor *const *ts, int dim)
{
    char x[160], y[160];
    dp_tensor *few[256], **parts = few;
    if (n <= 0)
        return dp_fail(DP_ERR_ARG, "stack: expected a non-empty list of tensors");
    dp_status st = dim_check("stack", &dim, ts[0]->ndim + 1);
    if (st)
        return st;
    for (int i = 0; i < n; i++)
        if (ts[i]->ndim != ts[0]->ndim || memcmp(ts[i]->shape, ts[0]->shape, sizeof(int64_t) * (size_t)ts[0]->ndim))
            return dp_fail(DP_ERR_SHAPE, "stack: expects each tensor to be equal size, but got %s at entry 0 "
                           "and %s at entry %d", dp_shape_str(x, sizeof x, ts[0]->ndim, ts[0]->shape),
                           dp_shape_str(y, sizeof y, ts[i]->ndim, ts[i]->shape), i);
    if (n > 256 && !(parts = malloc(sizeof *parts * (size_t)n)))
        return dp_fail(DP_ERR_MEMORY, "stack: out of memory for a list of %d tensors", n);
    int made = 0;
    for (; made < n && !st; made++)
        st = dp_unsqueeze(&parts[made], ts[made], dim);
    if (st)
        made--;
    else
        st = dp_cat(out, n, parts, dim);
    for (int i = 0; i < made; i++)
        dp_tensor_release(parts[i]);
    if (parts != few)
        free(parts);
    return st;
}
