/*
 * tensor_test.c — TAP tests of the public C API (src/dplua.h), linked
 * against libdplua like any C user of the library: lifetime and
 * refcounts, views and their strides, contiguous copies, broadcasting and
 * type promotion, errors (status and message), matmul and reductions
 * checked against hand-computed values, and autograd (gradients,
 * retain_graph, grad hooks).
 *
 * Each test is a function; a check that fails prints `not ok` with the
 * file, line and what differed, and the test goes on. The plan comes last.
 */
#include "dplua.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* ---------------------------------------------------------------- TAP */

static int ntests, nfailed;

static void ok_at(int cond, int line, const char *fmt, ...)
{
    va_list ap;
    ntests++;
    if (!cond)
        nfailed++;
    printf("%s %d - ", cond ? "ok" : "not ok", ntests);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    if (!cond)
        printf("#   at tests/c/tensor_test.c:%d; last error: %s\n", line, dp_last_error());
}
#define OK(cond, ...) ok_at((cond) != 0, __LINE__, __VA_ARGS__)

static void diag(const char *fmt, ...)
{
    va_list ap;
    printf("# ");
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
}

/* ---------------------------------------------------------------- helpers */

/* A float32 tensor of the given shape holding vals (row-major). */
static dp_tensor *f32(int ndim, const int64_t *shape, const float *vals)
{
    dp_tensor *t = NULL;
    if (dp_empty(&t, ndim, shape, DP_FLOAT32, DP_CPU))
        return NULL;
    memcpy(dp_tensor_data(t), vals, sizeof(float) * (size_t)dp_tensor_numel(t));
    return t;
}

static dp_tensor *typed(int ndim, const int64_t *shape, int dtype, double value)
{
    dp_tensor *t = NULL;
    return dp_full(&t, ndim, shape, value, dtype, DP_CPU) ? NULL : t;
}

/* Element i (row-major over the logical shape) of any tensor, as a double,
 * read through its strides. */
static double at(dp_tensor *t, int64_t i)
{
    int nd = dp_tensor_ndim(t);
    int64_t off = 0;
    for (int d = nd - 1; d >= 0; d--) {
        int64_t size = dp_tensor_size(t, d);
        off += (i % size) * dp_tensor_stride(t, d);
        i /= size;
    }
    char *base = dp_tensor_data(t);
    switch (dp_tensor_dtype(t)) {
    case DP_FLOAT32: return ((float *)base)[off];
    case DP_FLOAT64: return ((double *)base)[off];
    case DP_INT64: return (double)((int64_t *)base)[off];
    case DP_INT32: return ((int32_t *)base)[off];
    case DP_UINT8: return ((uint8_t *)base)[off];
    case DP_BOOL: return ((uint8_t *)base)[off];
    }
    return NAN;
}

/* The tensor's values equal want[0..n) (within tol) and numel is n. */
static int values_are(dp_tensor *t, int64_t n, const double *want, double tol)
{
    if (!t || dp_tensor_numel(t) != n)
        return 0;
    for (int64_t i = 0; i < n; i++)
        if (!(fabs(at(t, i) - want[i]) <= tol)) {
            diag("element %lld is %g, expected %g", (long long)i, at(t, i), want[i]);
            return 0;
        }
    return 1;
}

/* t has ndim dims and get(t, d) == want[d] for each: get is dp_tensor_size
 * or dp_tensor_stride. */
static int dims_are(dp_tensor *t, int64_t (*get)(const dp_tensor *, int), int ndim, const int64_t *want)
{
    if (!t || dp_tensor_ndim(t) != ndim)
        return 0;
    for (int d = 0; d < ndim; d++)
        if (get(t, d) != want[d])
            return 0;
    return 1;
}

static int shape_is(dp_tensor *t, int ndim, const int64_t *shape)
{
    return dims_are(t, dp_tensor_size, ndim, shape);
}

static int strides_are(dp_tensor *t, int ndim, const int64_t *stride)
{
    return dims_are(t, dp_tensor_stride, ndim, stride);
}

static int error_mentions(const char *a, const char *b)
{
    const char *msg = dp_last_error();
    return msg && strstr(msg, a) && (!b || strstr(msg, b));
}

static void release(int n, ...)
{
    va_list ap;
    va_start(ap, n);
    for (int i = 0; i < n; i++)
        dp_tensor_release(va_arg(ap, dp_tensor *));
    va_end(ap);
}

static const int64_t S23[2] = { 2, 3 }, S32[2] = { 3, 2 };
static const float V23[6] = { 1, 2, 3, 4, 5, 6 };

/* ---------------------------------------------------------------- lifetime */

static void test_lifetime(void)
{
    int64_t before = dp_memory_allocated(DP_CPU);
    int64_t n1000[1] = { 1000 };
    dp_tensor *t = typed(1, n1000, DP_FLOAT32, 1.5);
    OK(t && dp_tensor_numel(t) == 1000 && dp_tensor_dtype(t) == DP_FLOAT32 &&
       dp_tensor_device(t) == DP_CPU && dp_tensor_is_contiguous(t), "full: a contiguous float32 tensor");
    OK(dp_memory_allocated(DP_CPU) - before == 4000, "its 4000 bytes are counted (got %lld)",
       (long long)(dp_memory_allocated(DP_CPU) - before));

    dp_tensor_retain(t);
    dp_tensor_release(t);
    OK(dp_memory_allocated(DP_CPU) - before == 4000 && at(t, 999) == 1.5,
       "retain + release keeps the tensor alive");

    dp_tensor *v = NULL;
    int64_t s[2] = { 10, 100 };
    OK(dp_view(&v, t, 2, s) == DP_OK, "view 1000 -> 10x100");
    OK(dp_memory_allocated(DP_CPU) - before == 4000, "a view allocates no storage");
    dp_tensor_release(t);
    OK(dp_memory_allocated(DP_CPU) - before == 4000 && at(v, 999) == 1.5,
       "the view keeps the storage alive after its base is released");
    dp_tensor_release(v);
    OK(dp_memory_allocated(DP_CPU) == before, "the last release frees the storage");

    dp_tensor_release(NULL);
    OK(1, "dp_tensor_release(NULL) is a no-op");

    dp_tensor *e = NULL;
    int64_t z[2] = { 0, 3 };
    OK(dp_empty(&e, 2, z, DP_INT64, DP_CPU) == DP_OK && dp_tensor_numel(e) == 0 && dp_tensor_data(e),
       "an empty tensor (0x3) has a valid data pointer");
    dp_tensor_release(e);

    dp_tensor *s0 = typed(0, NULL, DP_FLOAT64, 7);
    OK(s0 && dp_tensor_ndim(s0) == 0 && dp_tensor_numel(s0) == 1 && at(s0, 0) == 7, "a 0-d tensor");
    dp_tensor_release(s0);
}

/* ---------------------------------------------------------------- views */

static void test_views(void)
{
    dp_tensor *a = f32(2, S23, V23), *v = NULL, *tr = NULL, *nw = NULL, *sel = NULL, *ex = NULL, *sl = NULL;
    float *base = dp_tensor_data(a);

    OK(dp_view(&v, a, 2, S32) == DP_OK && shape_is(v, 2, S32) && dp_tensor_data(v) == base,
       "view 2x3 -> 3x2 shares the data");
    ((float *)dp_tensor_data(v))[5] = 60;
    OK(base[5] == 60, "a write through the view shows in the base");
    base[5] = 6;

    int64_t st_t[2] = { 1, 3 };
    OK(dp_transpose(&tr, a, 0, 1) == DP_OK && shape_is(tr, 2, S32) && strides_are(tr, 2, st_t) &&
       !dp_tensor_is_contiguous(tr) && dp_tensor_data(tr) == base, "transpose swaps the strides, shares the data");
    double want_t[6] = { 1, 4, 2, 5, 3, 6 };
    OK(values_are(tr, 6, want_t, 0), "transpose reads [[1, 4], [2, 5], [3, 6]]");

    int64_t s22[2] = { 2, 2 }, st_n[2] = { 3, 1 };
    OK(dp_narrow(&nw, a, 1, 1, 2) == DP_OK && shape_is(nw, 2, s22) && strides_are(nw, 2, st_n) &&
       dp_tensor_offset(nw) == 1 && (float *)dp_tensor_data(nw) == base + 1, "narrow(1, 1, 2): offset 1, strides (3, 1)");
    double want_n[4] = { 2, 3, 5, 6 };
    OK(values_are(nw, 4, want_n, 0), "narrow reads [[2, 3], [5, 6]]");

    int64_t s3[1] = { 3 };
    OK(dp_select(&sel, a, 0, 1) == DP_OK && shape_is(sel, 1, s3) && dp_tensor_offset(sel) == 3,
       "select(0, 1): the second row, offset 3");
    double want_s[3] = { 4, 5, 6 };
    OK(values_are(sel, 3, want_s, 0), "select reads [4, 5, 6]");
    dp_tensor *neg = NULL;
    OK(dp_select(&neg, a, 1, -1) == DP_OK && values_are(neg, 2, (double[]){ 3, 6 }, 0),
       "select(1, -1) counts from the end");
    dp_tensor_release(neg);

    int64_t s13[2] = { 1, 3 }, s43[2] = { 4, 3 }, st_e[2] = { 0, 1 };
    dp_tensor *row = NULL;
    OK(dp_view(&row, sel, 2, s13) == DP_OK && dp_expand(&ex, row, 2, s43) == DP_OK && shape_is(ex, 2, s43) &&
       strides_are(ex, 2, st_e), "expand 1x3 -> 4x3 has stride 0 in dim 0");
    double want_e[12] = { 4, 5, 6, 4, 5, 6, 4, 5, 6, 4, 5, 6 };
    OK(values_are(ex, 12, want_e, 0), "expand repeats the row");

    int64_t s2[1] = { 2 }, st3[1] = { 3 };
    dp_tensor *flat = NULL;
    int64_t s6[1] = { 6 };
    OK(dp_view(&flat, a, 1, s6) == DP_OK && dp_slice(&sl, flat, 0, 1, 6, 3) == DP_OK && shape_is(sl, 1, s2) &&
       strides_are(sl, 1, st3) && values_are(sl, 2, (double[]){ 2, 5 }, 0), "slice 1:6:3 has stride 3 and reads [2, 5]");

    dp_tensor *bad = NULL;
    int64_t s4[1] = { 4 };
    OK(dp_view(&bad, tr, 1, s6) != DP_OK, "view of a transposed tensor to 6 elements is refused");
    OK(dp_view(&bad, a, 1, s4) == DP_ERR_SHAPE && error_mentions("[4]", NULL),
       "view 2x3 -> 4 is DP_ERR_SHAPE and names [4] (%s)", dp_last_error());
    OK(dp_transpose(&bad, a, 0, 5) == DP_ERR_INDEX, "transpose(0, 5) of a 2-d tensor is DP_ERR_INDEX");
    OK(dp_select(&bad, a, 0, 2) == DP_ERR_INDEX && error_mentions("2", NULL),
       "select(0, 2) of 2 rows is DP_ERR_INDEX (%s)", dp_last_error());
    OK(dp_narrow(&bad, a, 1, 2, 2) != DP_OK, "narrow past the end is refused");
    int64_t s23b[2] = { 2, 4 };
    OK(dp_expand(&bad, a, 2, s23b) == DP_ERR_SHAPE, "expand 2x3 -> 2x4 is DP_ERR_SHAPE");

    release(10, a, v, tr, nw, sel, ex, sl, row, flat, NULL);
}

static void test_contiguous(void)
{
    dp_tensor *a = f32(2, S23, V23), *tr = NULL, *c = NULL, *same = NULL;
    dp_transpose(&tr, a, 0, 1);
    OK(dp_contiguous(&c, tr) == DP_OK && dp_tensor_is_contiguous(c) && dp_tensor_data(c) != dp_tensor_data(a),
       "contiguous of a transpose is a copy");
    int64_t st[2] = { 2, 1 };
    float *p = dp_tensor_data(c);
    OK(strides_are(c, 2, st) && p[0] == 1 && p[1] == 4 && p[2] == 2 && p[3] == 5 && p[4] == 3 && p[5] == 6,
       "its memory holds [1, 4, 2, 5, 3, 6] with strides (2, 1)");
    p[0] = 100;
    OK(((float *)dp_tensor_data(a))[0] == 1, "writing the copy leaves the base alone");
    OK(dp_contiguous(&same, a) == DP_OK && same == a, "contiguous of a contiguous tensor is the tensor itself");

    dp_tensor *cl = NULL;
    OK(dp_clone(&cl, tr) == DP_OK && dp_tensor_data(cl) != dp_tensor_data(a) &&
       values_are(cl, 6, (double[]){ 1, 4, 2, 5, 3, 6 }, 0), "clone copies the values");
    release(5, a, tr, c, same, cl);
}

/* ---------------------------------------------------------------- math */

static void test_broadcast(void)
{
    int64_t s21[2] = { 2, 1 }, s3[1] = { 3 };
    dp_tensor *a = f32(2, s21, (float[]){ 1, 2 }), *b = f32(1, s3, (float[]){ 10, 20, 30 }), *c = NULL;
    OK(dp_binary(&c, DP_ADD, a, b) == DP_OK && shape_is(c, 2, S23) && dp_tensor_dtype(c) == DP_FLOAT32,
       "(2,1) + (3) broadcasts to (2,3)");
    double want[6] = { 11, 21, 31, 12, 22, 32 };
    OK(values_are(c, 6, want, 0), "and holds [[11, 21, 31], [12, 22, 32]]");

    dp_tensor *d = NULL;
    OK(dp_binary_scalar(&d, DP_SUB, b, 1, 1) == DP_OK && values_are(d, 3, (double[]){ -9, -19, -29 }, 0),
       "1 - b (scalar first)");
    dp_tensor *m = NULL;
    OK(dp_binary(&m, DP_MUL, a, a) == DP_OK && values_are(m, 2, (double[]){ 1, 4 }, 0), "a * a");
    dp_tensor *cmp = NULL;
    OK(dp_binary(&cmp, DP_GT, b, a) == DP_OK && dp_tensor_dtype(cmp) == DP_BOOL && shape_is(cmp, 2, S23),
       "comparisons give bool");

    dp_tensor *x = f32(2, S23, V23), *bad = NULL;
    int64_t s4[1] = { 4 };
    dp_tensor *y = typed(1, s4, DP_FLOAT32, 1);
    OK(dp_binary(&bad, DP_ADD, x, y) == DP_ERR_SHAPE, "(2,3) + (4) is DP_ERR_SHAPE");
    OK(error_mentions("[2, 3]", "[4]"), "and the message names both shapes: %s", dp_last_error());

    /* in place: the destination does not broadcast */
    OK(dp_binary_into(y, DP_ADD, y, x) != DP_OK, "y(4) += x(2,3) is refused");
    dp_tensor *z = typed(2, S23, DP_FLOAT32, 1);
    OK(dp_binary_into(z, DP_ADD, z, b) == DP_OK && values_are(z, 6, (double[]){ 11, 21, 31, 11, 21, 31 }, 0),
       "z(2,3) += b(3) in place");
    release(10, a, b, c, d, m, cmp, x, y, z, bad);
}

static void test_promotion(void)
{
    int64_t s2[1] = { 2 };
    dp_tensor *i32 = typed(1, s2, DP_INT32, 3), *f = typed(1, s2, DP_FLOAT32, 0.5);
    dp_tensor *b = typed(1, s2, DP_BOOL, 1), *i64 = typed(1, s2, DP_INT64, 4), *u8 = typed(1, s2, DP_UINT8, 2);
    dp_tensor *f64_0d = typed(0, NULL, DP_FLOAT64, 1), *r = NULL;

    OK(dp_binary(&r, DP_ADD, i32, f) == DP_OK && dp_tensor_dtype(r) == DP_FLOAT32 && at(r, 0) == 3.5,
       "int32 + float32 -> float32 (3.5)");
    dp_tensor_release(r);
    OK(dp_binary_scalar(&r, DP_ADD, b, 2, 0) == DP_OK && dp_tensor_dtype(r) == DP_INT64 && at(r, 0) == 3,
       "bool + 2 (an integer scalar) -> int64 (3)");
    dp_tensor_release(r);
    OK(dp_binary(&r, DP_ADD, b, i64) == DP_OK && dp_tensor_dtype(r) == DP_INT64 && at(r, 1) == 5,
       "bool + int64 -> int64 (5)");
    dp_tensor_release(r);
    OK(dp_binary(&r, DP_ADD, u8, i32) == DP_OK && dp_tensor_dtype(r) == DP_INT32, "uint8 + int32 -> int32");
    dp_tensor_release(r);
    OK(dp_binary_scalar(&r, DP_MUL, i32, 2, 0) == DP_OK && dp_tensor_dtype(r) == DP_INT32 && at(r, 0) == 6,
       "int32 * 2 stays int32");
    dp_tensor_release(r);
    OK(dp_binary_scalar(&r, DP_MUL, i32, 2.5, 0) == DP_OK && dp_tensor_dtype(r) == DP_FLOAT32 && at(r, 0) == 7.5,
       "int32 * 2.5 -> float32");
    dp_tensor_release(r);
    OK(dp_binary(&r, DP_ADD, f, f64_0d) == DP_OK && dp_tensor_dtype(r) == DP_FLOAT32,
       "float32 + a 0-d float64 stays float32");
    dp_tensor_release(r);
    OK(dp_binary(&r, DP_DIV, i64, i32) == DP_OK && dp_dtype_is_floating(dp_tensor_dtype(r)) &&
       fabs(at(r, 0) - 4.0 / 3) < 1e-6, "int64 / int32 is a true division");
    dp_tensor_release(r);
    OK(dp_binary(&r, DP_SUB, b, b) == DP_ERR_DTYPE, "bool - bool is DP_ERR_DTYPE");
    OK(dp_unary(&r, DP_SQRT, i64) == DP_OK && dp_tensor_dtype(r) == DP_FLOAT32 && fabs(at(r, 0) - 2) < 1e-6,
       "sqrt of int64 -> float32");
    dp_tensor_release(r);

    OK(dp_to(&r, f, DP_INT64, DP_CPU) == DP_OK && dp_tensor_dtype(r) == DP_INT64 && at(r, 0) == 0,
       "to(int64) truncates 0.5 to 0");
    dp_tensor_release(r);
    OK(dp_to(&r, f, DP_FLOAT32, DP_CPU) == DP_OK && r == f, "to(its own dtype) is the tensor itself");
    dp_tensor_release(r);
    release(6, i32, f, b, i64, u8, f64_0d);
}

static void test_errors(void)
{
    dp_tensor *t = NULL;
    int64_t neg[2] = { 2, -3 }, huge[3] = { (int64_t)1 << 40, (int64_t)1 << 40, 4 };
    OK(dp_empty(&t, 2, neg, DP_FLOAT32, DP_CPU) == DP_ERR_SHAPE && error_mentions("-3", NULL),
       "a negative size is DP_ERR_SHAPE naming it: %s", dp_last_error());
    OK(dp_empty(&t, 3, huge, DP_FLOAT32, DP_CPU) != DP_OK, "2^40 x 2^40 x 4 elements fail: %s", dp_last_error());
    int64_t big[1] = { (int64_t)1 << 40 };
    OK(dp_full(&t, 1, big, 0, DP_FLOAT32, DP_CPU) != DP_OK, "2^40 float32 (4 TB) fails: %s", dp_last_error());
    int64_t nine[9] = { 1, 1, 1, 1, 1, 1, 1, 1, 1 };
    OK(dp_empty(&t, 9, nine, DP_FLOAT32, DP_CPU) == DP_ERR_SHAPE, "nine dims are DP_ERR_SHAPE");
    int64_t two[1] = { 2 };
    OK(dp_empty(&t, 1, two, 99, DP_CPU) == DP_ERR_DTYPE, "dtype 99 is DP_ERR_DTYPE");
    OK(dp_empty(&t, 1, two, -1, DP_CPU) == DP_ERR_DTYPE, "dtype -1 is DP_ERR_DTYPE");
    OK(dp_full(&t, 1, two, 0, DP_NUM_DTYPES, DP_CPU) == DP_ERR_DTYPE, "dtype DP_NUM_DTYPES is DP_ERR_DTYPE");
    OK(dp_arange(&t, 0, 1, 0, DP_FLOAT32, DP_CPU) == DP_ERR_ARG, "arange with step 0 is DP_ERR_ARG");
    OK(dp_randint(&t, 5, 1, 1, two, DP_INT64, DP_CPU) != DP_OK, "randint with low >= high fails");

    dp_tensor *a = f32(2, S23, V23), *b = f32(2, S23, V23);
    double v = 0;
    OK(dp_item(a, &v) == DP_ERR_SHAPE && error_mentions("6", NULL),
       "item of a 2x3 tensor is DP_ERR_SHAPE and says 6 elements: %s", dp_last_error());
    int64_t iv = 0;
    OK(dp_item_int64(a, &iv) != DP_OK, "item_int64 of a 2x3 tensor fails");
    dp_tensor *one = typed(0, NULL, DP_INT64, 42);
    OK(dp_item(one, &v) == DP_OK && v == 42 && dp_item_int64(one, &iv) == DP_OK && iv == 42, "item of a 0-d tensor");

    OK(dp_matmul(&t, a, b) == DP_ERR_SHAPE && error_mentions("[2, 3]", NULL),
       "matmul 2x3 @ 2x3 is DP_ERR_SHAPE naming the shapes: %s", dp_last_error());
    OK(dp_reduce(&t, DP_SUM, a, 2, 0, 0) == DP_ERR_INDEX, "sum over dim 2 of a 2-d tensor is DP_ERR_INDEX");
    OK(dp_softmax(&t, a, -3, 0) == DP_ERR_INDEX, "softmax over dim -3 of a 2-d tensor is DP_ERR_INDEX");
    dp_tensor *list[2] = { a, one };
    OK(dp_cat(&t, 2, list, 0) != DP_OK, "cat of a 2-d and a 0-d tensor fails");
    OK(dp_stack(&t, 0, list, 0) != DP_OK, "stack of no tensors fails");

    int64_t s2[1] = { 2 };
    dp_tensor *idx = typed(1, s2, DP_INT64, 5);
    OK(dp_index_select(&t, a, 1, idx) == DP_ERR_INDEX, "index_select with index 5 of 3 is DP_ERR_INDEX: %s",
       dp_last_error());
    dp_tensor *fidx = typed(1, s2, DP_FLOAT32, 0);
    OK(dp_index_select(&t, a, 1, fidx) != DP_OK, "index_select with a float index fails");
    OK(dp_empty(&t, 1, s2, DP_FLOAT32, 999) != DP_OK, "a tensor on cuda:999 fails: %s", dp_last_error());
    OK(dp_empty(&t, 1, s2, DP_FLOAT32, -7) != DP_OK, "a tensor on device -7 fails: %s", dp_last_error());
    release(5, a, b, one, idx, fidx);
}

static void test_matmul(void)
{
    dp_tensor *a = f32(2, S23, V23);
    dp_tensor *b = f32(2, S32, (float[]){ 7, 8, 9, 10, 11, 12 });
    dp_tensor *c = NULL, *bt = NULL, *c2 = NULL;
    int64_t s22[2] = { 2, 2 };
    double want[4] = { 58, 64, 139, 154 };
    OK(dp_matmul(&c, a, b) == DP_OK && shape_is(c, 2, s22) && values_are(c, 4, want, 1e-4),
       "[[1,2,3],[4,5,6]] @ [[7,8],[9,10],[11,12]] = [[58,64],[139,154]]");

    /* the same product from a transposed (non-contiguous) right operand */
    int64_t s23[2] = { 2, 3 };
    dp_tensor *bT = f32(2, s23, (float[]){ 7, 9, 11, 8, 10, 12 });
    OK(dp_transpose(&bt, bT, 0, 1) == DP_OK && dp_mm(&c2, a, bt) == DP_OK && values_are(c2, 4, want, 1e-4),
       "mm with a transposed operand gives the same");

    int64_t s3[1] = { 3 };
    dp_tensor *v = f32(1, s3, (float[]){ 1, 0, -1 }), *mv = NULL;
    OK(dp_matmul(&mv, a, v) == DP_OK && dp_tensor_ndim(mv) == 1 && values_are(mv, 2, (double[]){ -2, -2 }, 1e-5),
       "matrix @ vector drops the unit dim: [-2, -2]");

    int64_t sb[3] = { 2, 2, 3 };
    dp_tensor *ba = NULL, *bb = NULL, *bc = NULL, *bx = NULL;
    dp_tensor *list[2] = { a, a };
    OK(dp_stack(&ba, 2, list, 0) == DP_OK && shape_is(ba, 3, sb), "stack two 2x3 into 2x2x3");
    dp_tensor *blist[2] = { b, b };
    OK(dp_stack(&bb, 2, blist, 0) == DP_OK && dp_bmm(&bc, ba, bb) == DP_OK &&
       values_are(bc, 8, (double[]){ 58, 64, 139, 154, 58, 64, 139, 154 }, 1e-4), "bmm of the stacks");
    /* batched matmul broadcasts a 2-d right operand over the batch */
    OK(dp_matmul(&bx, ba, b) == DP_OK && values_are(bx, 8, (double[]){ 58, 64, 139, 154, 58, 64, 139, 154 }, 1e-4),
       "matmul (2,2,3) @ (3,2) broadcasts");
    OK(dp_bmm(&c, a, b) != DP_OK, "bmm of 2-d operands is refused");
    release(12, a, b, c, bt, c2, bT, v, mv, ba, bb, bc, bx);
}

static void test_reductions(void)
{
    dp_tensor *a = f32(2, S23, V23), *r = NULL, *idx = NULL;
    double v = 0;
    OK(dp_reduce(&r, DP_SUM, a, DP_ALL_DIMS, 0, 0) == DP_OK && dp_tensor_ndim(r) == 0 && dp_item(r, &v) == DP_OK &&
       v == 21, "sum = 21");
    dp_tensor_release(r);
    OK(dp_reduce(&r, DP_SUM, a, 0, 0, 0) == DP_OK && values_are(r, 3, (double[]){ 5, 7, 9 }, 0), "sum(0) = [5, 7, 9]");
    dp_tensor_release(r);
    int64_t s21[2] = { 2, 1 };
    OK(dp_reduce(&r, DP_MEAN, a, -1, 1, 0) == DP_OK && shape_is(r, 2, s21) &&
       values_are(r, 2, (double[]){ 2, 5 }, 1e-6), "mean(-1, keepdim) = [[2], [5]]");
    dp_tensor_release(r);
    OK(dp_reduce(&r, DP_PROD, a, DP_ALL_DIMS, 0, 0) == DP_OK && dp_item(r, &v) == DP_OK && v == 720, "prod = 720");
    dp_tensor_release(r);
    OK(dp_reduce_with_index(&r, &idx, DP_MAX, a, 1, 0) == DP_OK && values_are(r, 2, (double[]){ 3, 6 }, 0) &&
       dp_tensor_dtype(idx) == DP_INT64 && values_are(idx, 2, (double[]){ 2, 2 }, 0),
       "max(1) = values [3, 6], indices [2, 2] (int64)");
    release(2, r, idx);
    OK(dp_reduce_with_index(&r, &idx, DP_MIN, a, 0, 0) == DP_OK && values_are(r, 3, (double[]){ 1, 2, 3 }, 0) &&
       values_are(idx, 3, (double[]){ 0, 0, 0 }, 0), "min(0) = values [1, 2, 3], indices [0, 0, 0]");
    release(2, r, idx);

    int64_t s4[1] = { 4 };
    dp_tensor *x = f32(1, s4, (float[]){ 1, 2, 3, 4 });
    OK(dp_reduce(&r, DP_VAR, x, DP_ALL_DIMS, 0, 1) == DP_OK && dp_item(r, &v) == DP_OK && fabs(v - 5.0 / 3) < 1e-5,
       "var([1, 2, 3, 4]) = 5/3 (correction 1)");
    dp_tensor_release(r);
    OK(dp_reduce(&r, DP_STD, x, DP_ALL_DIMS, 0, 0) == DP_OK && dp_item(r, &v) == DP_OK && fabs(v - sqrt(1.25)) < 1e-5,
       "std([1, 2, 3, 4], correction 0) = sqrt(1.25)");
    dp_tensor_release(r);

    int64_t s22[2] = { 2, 2 };
    dp_tensor *y = f32(2, s22, (float[]){ 1, 5, 7, 2 });
    OK(dp_reduce(&r, DP_ARGMAX, y, DP_ALL_DIMS, 0, 0) == DP_OK && dp_item(r, &v) == DP_OK && v == 2,
       "argmax of [[1, 5], [7, 2]] = 2 (flat)");
    dp_tensor_release(r);
    OK(dp_reduce(&r, DP_ARGMIN, y, 1, 0, 0) == DP_OK && values_are(r, 2, (double[]){ 0, 1 }, 0),
       "argmin(1) = [0, 1]");
    dp_tensor_release(r);

    dp_tensor *b = NULL;
    OK(dp_binary_scalar(&b, DP_GT, y, 4, 0) == DP_OK && dp_reduce(&r, DP_ANY, b, DP_ALL_DIMS, 0, 0) == DP_OK &&
       dp_item(r, &v) == DP_OK && v == 1, "any(y > 4) is true");
    dp_tensor_release(r);
    OK(dp_reduce(&r, DP_ALL, b, 0, 0, 0) == DP_OK && values_are(r, 2, (double[]){ 0, 0 }, 0), "all(y > 4, 0) = [F, F]");
    dp_tensor_release(r);

    dp_tensor *sm = NULL;
    OK(dp_softmax(&sm, y, 1, 0) == DP_OK &&
       values_are(sm, 4, (double[]){ 1 / (1 + exp(4)), 1 / (1 + exp(-4)), 1 / (1 + exp(-5)), 1 / (1 + exp(5)) }, 1e-6),
       "softmax(1) of [[1, 5], [7, 2]]");
    dp_tensor_release(sm);

    /* a transposed input reduces by its logical layout */
    dp_tensor *tr = NULL;
    OK(dp_transpose(&tr, a, 0, 1) == DP_OK && dp_reduce(&r, DP_SUM, tr, 1, 0, 0) == DP_OK &&
       values_are(r, 3, (double[]){ 5, 7, 9 }, 0), "sum(1) of the transpose = [5, 7, 9]");
    dp_tensor_release(r);

    int64_t s03[2] = { 0, 3 };
    dp_tensor *e = typed(2, s03, DP_FLOAT32, 0);
    OK(dp_reduce(&r, DP_SUM, e, 0, 0, 0) == DP_OK && values_are(r, 3, (double[]){ 0, 0, 0 }, 0),
       "sum(0) of a 0x3 tensor = [0, 0, 0]");
    dp_tensor_release(r);
    OK(dp_reduce(&r, DP_MAX, e, DP_ALL_DIMS, 0, 0) != DP_OK, "max of an empty tensor fails: %s", dp_last_error());
    release(6, a, x, y, b, tr, e);
}

static void test_indexing(void)
{
    dp_tensor *a = f32(2, S23, V23), *r = NULL;
    int64_t s2[1] = { 2 };
    dp_tensor *idx = typed(1, s2, DP_INT64, 0);
    ((int64_t *)dp_tensor_data(idx))[0] = 2;
    OK(dp_index_select(&r, a, 1, idx) == DP_OK && values_are(r, 4, (double[]){ 3, 1, 6, 4 }, 0),
       "index_select(1, [2, 0]) = [[3, 1], [6, 4]]");
    dp_tensor_release(r);

    dp_tensor *g = NULL;
    int64_t s21[2] = { 2, 1 };
    dp_tensor *gi = typed(2, s21, DP_INT64, 1);
    ((int64_t *)dp_tensor_data(gi))[1] = 2;
    OK(dp_gather(&g, a, 1, gi) == DP_OK && shape_is(g, 2, s21) && values_are(g, 2, (double[]){ 2, 6 }, 0),
       "gather(1, [[1], [2]]) = [[2], [6]]");

    dp_tensor *list[2] = { a, a }, *c = NULL;
    int64_t s26[2] = { 2, 6 };
    OK(dp_cat(&c, 2, list, 1) == DP_OK && shape_is(c, 2, s26) && at(c, 3) == 1 && at(c, 11) == 6,
       "cat along dim 1: 2x6");
    dp_tensor_release(c);
    int64_t s232[3] = { 2, 3, 2 };
    OK(dp_stack(&c, 2, list, -1) == DP_OK && shape_is(c, 3, s232), "stack along dim -1: 2x3x2");
    dp_tensor_release(c);

    dp_tensor *cond = NULL, *w = NULL, *z = typed(2, S23, DP_FLOAT32, 0);
    OK(dp_binary_scalar(&cond, DP_GT, a, 3, 0) == DP_OK && dp_where(&w, cond, a, z) == DP_OK &&
       values_are(w, 6, (double[]){ 0, 0, 0, 4, 5, 6 }, 0), "where(a > 3, a, 0)");
    dp_tensor *cl = NULL;
    OK(dp_clamp(&cl, a, 2, NAN) == DP_OK && values_are(cl, 6, (double[]){ 2, 2, 3, 4, 5, 6 }, 0),
       "clamp(2, NaN): a lower bound only");
    dp_tensor *row = NULL;
    OK(dp_select(&row, a, 0, 0) == DP_OK && dp_fill_into(row, 9) == DP_OK &&
       values_are(a, 6, (double[]){ 9, 9, 9, 4, 5, 6 }, 0), "fill_ through a view writes the base");
    OK(dp_copy_into(row, cl) != DP_OK, "copy_ of a 2x3 into a row of 3 is refused");
    release(10, a, idx, g, gi, cond, w, z, cl, row, NULL);
}

/* ---------------------------------------------------------------- autograd */

static void test_autograd(void)
{
    int64_t s3[1] = { 3 };
    dp_tensor *x = f32(1, s3, (float[]){ 1, 2, 3 }), *sq = NULL, *y = NULL, *g = NULL;
    OK(dp_set_requires_grad(x, 1) == DP_OK && dp_requires_grad(x) && dp_is_leaf(x), "x requires grad, a leaf");
    OK(dp_binary(&sq, DP_MUL, x, x) == DP_OK && dp_reduce(&y, DP_SUM, sq, DP_ALL_DIMS, 0, 0) == DP_OK &&
       dp_requires_grad(y) && !dp_is_leaf(y) && dp_grad_fn_name(y) && !strcmp(dp_grad_fn_name(y), "SumBackward0"),
       "y = (x * x).sum() records SumBackward0 (got %s)", y && dp_grad_fn_name(y) ? dp_grad_fn_name(y) : "NULL");
    OK(dp_get_grad(x) == NULL, "no grad before backward");
    OK(dp_backward(y, NULL, 0) == DP_OK, "y.backward()");
    g = dp_get_grad(x);
    OK(g && values_are(g, 3, (double[]){ 2, 4, 6 }, 1e-6), "x.grad = 2x = [2, 4, 6]");
    dp_tensor_release(g);

    OK(dp_backward(y, NULL, 0) == DP_ERR_STATE && error_mentions("second time", NULL),
       "a second backward without retain_graph is DP_ERR_STATE: %s", dp_last_error());
    release(2, sq, y);

    /* gradients accumulate; retain_graph keeps the graph for another pass */
    sq = y = NULL;
    dp_binary(&sq, DP_MUL, x, x);
    dp_reduce(&y, DP_SUM, sq, DP_ALL_DIMS, 0, 0);
    OK(dp_backward(y, NULL, 1) == DP_OK && dp_backward(y, NULL, 0) == DP_OK,
       "backward(retain_graph) then backward again");
    g = dp_get_grad(x);
    OK(g && values_are(g, 3, (double[]){ 6, 12, 18 }, 1e-5), "x.grad accumulated three times: [6, 12, 18]");
    dp_tensor_release(g);
    OK(dp_backward(y, NULL, 0) == DP_ERR_STATE, "the third backward finds the graph freed");
    release(2, sq, y);

    OK(dp_set_grad(x, NULL) == DP_OK && dp_get_grad(x) == NULL, "set_grad(NULL) clears the grad");

    /* a non-scalar root needs a gradient of its shape */
    dp_tensor *e = NULL, *gw = NULL, *bad = NULL;
    dp_unary(&e, DP_EXP, x);
    OK(dp_backward(e, NULL, 1) == DP_ERR_SHAPE, "backward of a non-scalar without a gradient is DP_ERR_SHAPE");
    int64_t s2[1] = { 2 };
    bad = typed(1, s2, DP_FLOAT32, 1);
    OK(dp_backward(e, bad, 1) == DP_ERR_SHAPE && error_mentions("[2]", "[3]"),
       "a gradient of the wrong shape is DP_ERR_SHAPE naming both: %s", dp_last_error());
    gw = f32(1, s3, (float[]){ 1, 0, 2 });
    OK(dp_backward(e, gw, 0) == DP_OK, "backward with a gradient");
    g = dp_get_grad(x);
    OK(g && values_are(g, 3, (double[]){ exp(1), 0, 2 * exp(3) }, 1e-4), "x.grad = gradient * exp(x)");
    release(4, g, e, gw, bad);
    dp_set_grad(x, NULL);

    /* no recording with grad mode off */
    int was = dp_set_grad_enabled(0);
    dp_tensor *ng = NULL;
    OK(dp_binary(&ng, DP_MUL, x, x) == DP_OK && !dp_requires_grad(ng) && dp_grad_fn_name(ng) == NULL,
       "with grad mode off, x * x records nothing");
    dp_set_grad_enabled(was);
    OK(dp_is_grad_enabled() == was, "grad mode restored");

    /* a tensor that requires grad cannot be modified in place, except
     * under no_grad, and then a graph that saved it refuses to backward */
    OK(dp_fill_into(x, 0) == DP_ERR_STATE && dp_unary_into(x, DP_NEG, x) == DP_ERR_STATE,
       "an in-place op on a leaf that requires grad is DP_ERR_STATE");
    dp_tensor *sq2 = NULL, *y2 = NULL;
    dp_binary(&sq2, DP_MUL, x, x);
    dp_reduce(&y2, DP_SUM, sq2, DP_ALL_DIMS, 0, 0);
    was = dp_set_grad_enabled(0);
    OK(dp_fill_into(x, 1) == DP_OK, "fill_ of the leaf under no_grad");
    dp_set_grad_enabled(was);
    OK(dp_backward(y2, NULL, 0) == DP_ERR_STATE && error_mentions("modified", NULL),
       "backward through a graph whose saved tensor was modified is DP_ERR_STATE: %s", dp_last_error());
    release(2, sq2, y2);
    /* ...and requires_grad is only settable on leaves */
    OK(dp_set_requires_grad(ng, 1) == DP_OK, "requires_grad on a fresh (leaf) result");
    dp_tensor *nl = NULL;
    dp_binary(&nl, DP_ADD, ng, ng);
    OK(dp_set_requires_grad(nl, 0) == DP_ERR_STATE, "turning requires_grad off on a non-leaf is DP_ERR_STATE");
    release(3, x, ng, nl);
}

struct hook_log { int calls; dp_tensor *leaf; };

static void count_hook(dp_tensor *leaf, void *ctx)
{
    struct hook_log *h = ctx;
    h->calls++;
    h->leaf = leaf;
}

static void test_hooks(void)
{
    int64_t s3[1] = { 3 };
    dp_tensor *x = f32(1, s3, (float[]){ 1, 2, 3 }), *w = f32(1, s3, (float[]){ 4, 5, 6 });
    dp_set_requires_grad(x, 1);
    dp_set_requires_grad(w, 1);
    struct hook_log hx = { 0, NULL }, hw = { 0, NULL };
    OK(dp_add_grad_hook(x, count_hook, &hx) == DP_OK && dp_add_grad_hook(w, count_hook, &hw) == DP_OK,
       "hooks on two leaves");

    /* z = sum(x * w + x * x): x reaches the root along three paths */
    dp_tensor *xw = NULL, *xx = NULL, *s = NULL, *z = NULL, *gx = NULL, *gw = NULL;
    dp_binary(&xw, DP_MUL, x, w);
    dp_binary(&xx, DP_MUL, x, x);
    dp_binary(&s, DP_ADD, xw, xx);
    dp_reduce(&z, DP_SUM, s, DP_ALL_DIMS, 0, 0);
    OK(dp_backward(z, NULL, 1) == DP_OK, "backward");
    OK(hx.calls == 1 && hw.calls == 1, "each hook fired once (x: %d, w: %d)", hx.calls, hw.calls);
    OK(hx.leaf == x && hw.leaf == w, "with its own leaf");
    gx = dp_get_grad(x);
    gw = dp_get_grad(w);
    OK(gx && values_are(gx, 3, (double[]){ 6, 9, 12 }, 1e-5), "x.grad = w + 2x = [6, 9, 12]");
    OK(gw && values_are(gw, 3, (double[]){ 1, 2, 3 }, 1e-5), "w.grad = x = [1, 2, 3]");
    release(2, gx, gw);

    OK(dp_backward(z, NULL, 0) == DP_OK && hx.calls == 2 && hw.calls == 2,
       "a second backward fires each hook once more (x: %d, w: %d)", hx.calls, hw.calls);

    /* a leaf that the graph does not reach: its hook does not fire */
    dp_tensor *u = f32(1, s3, (float[]){ 0, 0, 0 }), *y = NULL;
    struct hook_log hu = { 0, NULL };
    dp_set_requires_grad(u, 1);
    dp_add_grad_hook(u, count_hook, &hu);
    dp_reduce(&y, DP_SUM, w, DP_ALL_DIMS, 0, 0);
    OK(dp_backward(y, NULL, 0) == DP_OK && hu.calls == 0 && hw.calls == 3 && hx.calls == 2,
       "backward of sum(w) fires only w's hook (u: %d, w: %d, x: %d)", hu.calls, hw.calls, hx.calls);

    OK(dp_add_grad_hook(z, count_hook, &hu) == DP_ERR_STATE, "a hook on a non-leaf is DP_ERR_STATE");
    dp_clear_grad_hooks(x);
    dp_tensor *z2 = NULL;
    dp_reduce(&z2, DP_SUM, x, DP_ALL_DIMS, 0, 0);
    OK(dp_backward(z2, NULL, 0) == DP_OK && hx.calls == 2, "no call after dp_clear_grad_hooks");
    release(10, x, w, xw, xx, s, z, u, y, z2, NULL);
}

/* ---------------------------------------------------------------- main */

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);   /* a crash still shows how far it got */
    diag("dplua %s", dp_version());
    test_lifetime();
    test_views();
    test_contiguous();
    test_broadcast();
    test_promotion();
    test_errors();
    test_matmul();
    test_reductions();
    test_indexing();
    test_autograd();
    test_hooks();
    printf("1..%d\n", ntests);
    return nfailed ? 1 : 0;
}
