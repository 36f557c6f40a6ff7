/*
 * reduce.c — reductions over one dim (or everything) and softmax.
 *
 * Both are written as "one output position at a time": cpu_foreach walks
 * views of the output and input with the reduced dim removed, and the row
 * function runs the reduction along that dim using its length and stride,
 * accumulating in double (int64 for integer sums and products, so they stay
 * exact).
 */
#include "cpu/cpu.h"
#include "cpu/vmath.h"

#include <math.h>

typedef struct {
    int op;
    int out_dtype;
    int correction;
    int64_t len;        /* size of the reduced dim */
    int64_t in_stride;  /* its byte stride in the input */
    int64_t out_stride; /* softmax: its byte stride in the output */
    int log;            /* softmax: log_softmax */
} reduce_ctx;

/* Removes `dim` from t's view (shape and strides), in place on a copy. */
static void drop_dim(dp_tensor *view, const dp_tensor *t, int dim)
{
    *view = *t;
    for (int i = dim; i < t->ndim - 1; i++) {
        view->shape[i] = t->shape[i + 1];
        view->stride[i] = t->stride[i + 1];
    }
    view->ndim = t->ndim - 1;
}

#define LD_F32(p) ((double)*(const float *)(p))
#define LD_F64(p) (*(const double *)(p))
#define LD_BF16P(p) ((double)bf16_to_float(*(const uint16_t *)(p)))
#define LD_I64(p) ((double)*(const int64_t *)(p))
#define LD_I32(p) ((double)*(const int32_t *)(p))
#define LD_U8(p) ((double)*(const uint8_t *)(p))
#define LD_B8(p) ((double)(*(const uint8_t *)(p) != 0))

#define ILD_I64(p) (*(const int64_t *)(p))
#define ILD_I32(p) ((int64_t)*(const int32_t *)(p))
#define ILD_U8(p) ((int64_t)*(const uint8_t *)(p))
#define ILD_B8(p) ((int64_t)(*(const uint8_t *)(p) != 0))
#define ILD_NONE(p) ((int64_t)0)

/* The sum (SQ(v) = v) or the sum of squares (SQ(v) = v * v) of n
 * contiguous floats (doubles) in double lanes, which vectorise without
 * reassociating a serial sum: the 4 million gradients of a language model
 * took 5 ms one add at a time. */
#define SUM_LANES(name, T, SQ)                                              \
    VM_CLONES static double name(const void *p, int64_t n)                  \
    {                                                                       \
        const T *q = p;                                                     \
        double lane[SUM_LANES_N] = { 0 }, s = 0;                            \
        int64_t j = 0;                                                      \
        for (; j + SUM_LANES_N <= n; j += SUM_LANES_N)                      \
            for (int k = 0; k < SUM_LANES_N; k++) {                         \
                double v = q[j + k];                                        \
                lane[k] += SQ(v);                                           \
            }                                                               \
        for (; j < n; j++) {                                                \
            double v = q[j];                                                \
            s += SQ(v);                                                     \
        }                                                                   \
        for (int k = 0; k < SUM_LANES_N; k++)                               \
            s += lane[k];                                                   \
        return s;                                                           \
    }
#define LANES 8
#define SUM_LANES_N 32   /* four chains of AVX-512 adds in flight: an add's latency is four cycles */
#define PLAIN(v) (v)
#define SQUARE(v) ((v) * (v))
SUM_LANES(sum_lanes_f32, float, PLAIN)
SUM_LANES(sum_lanes_f64, double, PLAIN)
SUM_LANES(sumsq_lanes_f32, float, SQUARE)
SUM_LANES(sumsq_lanes_f64, double, SQUARE)

/* Reduces one run of `len` elements at q with byte stride rs; a float
 * sum or norm over contiguous elements (rs == ES, 0 for none) in lanes. Values are
 * written through the output's dtype; the index (arg ops, max/min with
 * indices) goes to *index. */
#define REDUCE_RUN(tag, LOAD, ILOAD, IS_INT, LANES, ES)                           \
    static double reduce_run_##tag(const reduce_ctx *c, const char *q, int64_t *index, \
                                   int64_t *iresult)                                  \
    {                                                                                 \
        int64_t n = c->len, rs = c->in_stride;                                        \
        switch (c->op) {                                                              \
        case DP_SUM: case DP_MEAN: {                                                  \
            if (IS_INT) { uint64_t s = 0; /* wraps, as in PyTorch */                 \
                          for (int64_t i = 0; i < n; i++) s += (uint64_t)ILOAD(q + i * rs); \
                          *iresult = (int64_t)s; return (double)(int64_t)s; }         \
            double s = 0;                                                             \
            if (ES && rs == ES) s = sum_lanes_##LANES(q, n);   /* contiguous floats */ \
            else for (int64_t i = 0; i < n; i++) s += LOAD(q + i * rs);               \
            return c->op == DP_MEAN ? s / (double)n : s; }                            \
        case DP_PROD: {                                                               \
            if (IS_INT) { uint64_t s = 1;                                             \
                          for (int64_t i = 0; i < n; i++) s *= (uint64_t)ILOAD(q + i * rs); \
                          *iresult = (int64_t)s; return (double)(int64_t)s; }         \
            double s = 1; for (int64_t i = 0; i < n; i++) s *= LOAD(q + i * rs);      \
            return s; }                                                               \
        case DP_MAX: case DP_ARGMAX: case DP_MIN: case DP_ARGMIN: {                   \
            bool want_max = c->op == DP_MAX || c->op == DP_ARGMAX;                    \
            double best = LOAD(q); int64_t bi = 0;                                    \
            for (int64_t i = 1; i < n && best == best; i++) {                         \
                double v = LOAD(q + i * rs);                                          \
                if (v != v || (want_max ? v > best : v < best)) { best = v; bi = i; } \
            }                                                                         \
            *index = bi; return best; }                                               \
        case DP_VAR: case DP_STD: {                                                   \
            double mean = 0, ss = 0;                                                  \
            for (int64_t i = 0; i < n; i++) mean += LOAD(q + i * rs);                 \
            mean /= (double)n;                                                        \
            for (int64_t i = 0; i < n; i++) { double d = LOAD(q + i * rs) - mean; ss += d * d; } \
            double dof = (double)(n - c->correction);                                 \
            double var = dof > 0 ? ss / dof : NAN;                                    \
            return c->op == DP_STD ? sqrt(var) : var; }                               \
        case DP_NORM: {                                                               \
            double s = 0;                                                             \
            if (ES && rs == ES) s = sumsq_lanes_##LANES(q, n);                        \
            else for (int64_t i = 0; i < n; i++) { double x = LOAD(q + i * rs); s += x * x; } \
            return sqrt(s); }                                                         \
        case DP_ALL: {                                                                \
            for (int64_t i = 0; i < n; i++) if (LOAD(q + i * rs) == 0) return 0;      \
            return 1; }                                                               \
        case DP_ANY: {                                                                \
            for (int64_t i = 0; i < n; i++) if (LOAD(q + i * rs) != 0) return 1;      \
            return 0; }                                                               \
        }                                                                             \
        return 0;                                                                     \
    }

REDUCE_RUN(f32, LD_F32, ILD_NONE, 0, f32, 4)
REDUCE_RUN(f64, LD_F64, ILD_NONE, 0, f64, 8)
REDUCE_RUN(bf16, LD_BF16P, ILD_NONE, 0, f32, 0)   /* (ES 0: no lanes) */
REDUCE_RUN(i64, LD_I64, ILD_I64, 1, f64, 0)
REDUCE_RUN(i32, LD_I32, ILD_I32, 1, f64, 0)
REDUCE_RUN(u8, LD_U8, ILD_U8, 1, f64, 0)
REDUCE_RUN(b8, LD_B8, ILD_B8, 1, f64, 0)

typedef double (*reduce_run_fn)(const reduce_ctx *, const char *, int64_t *, int64_t *);
static const reduce_run_fn reduce_runs[DP_NUM_DTYPES] = {
    [DP_FLOAT32] = reduce_run_f32, [DP_FLOAT64] = reduce_run_f64, [DP_BFLOAT16] = reduce_run_bf16,
    [DP_INT64] = reduce_run_i64, [DP_INT32] = reduce_run_i32, [DP_UINT8] = reduce_run_u8,
    [DP_BOOL] = reduce_run_b8,
};

typedef struct {
    reduce_ctx c;
    reduce_run_fn run;
    bool with_index;
} reduce_job;

static void reduce_row(int64_t n, char **p, const int64_t *s, const void *ctx)
{
    const reduce_job *job = ctx;
    bool arg = job->c.op == DP_ARGMAX || job->c.op == DP_ARGMIN;
    for (int64_t i = 0; i < n; i++) {
        int64_t index = 0, iresult = 0;
        double v = job->run(&job->c, p[1] + i * s[1], &index, &iresult);
        char *o = p[0] + i * s[0];
        if (arg)
            *(int64_t *)o = index;
        else if (job->c.out_dtype == DP_INT64 && (job->c.op == DP_SUM || job->c.op == DP_PROD))
            *(int64_t *)o = iresult;
        else if (job->c.out_dtype == DP_INT64 && (job->c.op == DP_MAX || job->c.op == DP_MIN))
            *(int64_t *)o = *(const int64_t *)(p[1] + i * s[1] + index * job->c.in_stride);
        else
            dtype_store(job->c.out_dtype, o, v);
        if (job->with_index)
            *(int64_t *)(p[2] + i * s[2]) = index;
    }
}

dp_status cpu_reduce(int op, dp_tensor *out, dp_tensor *indices, dp_tensor *a, int dim, int correction)
{
    dp_tensor in_view, out_view, idx_view;
    drop_dim(&in_view, a, dim);
    reduce_job job = {
        .c = { .op = op, .out_dtype = out->dtype, .correction = correction, .len = a->shape[dim],
               .in_stride = a->stride[dim] * (int64_t)dp_dtype_size(a->dtype) },
        .run = reduce_runs[a->dtype],
        .with_index = indices != NULL,
    };
    /* out may carry the reduced dim as size 1 (keepdim): drop it too */
    if (out->ndim == a->ndim) drop_dim(&out_view, out, dim); else out_view = *out;
    if (indices) {
        if (indices->ndim == a->ndim) drop_dim(&idx_view, indices, dim); else idx_view = *indices;
    }
    dp_tensor *ts[3] = { &out_view, &in_view, &idx_view };
    cpu_foreach(indices ? 3 : 2, ts, reduce_row, &job);
    return DP_OK;
}

/* ---------------------------------------------------------------- softmax */

/* Each exp is taken once: the sum pass keeps exp(v - m) in the output
 * row, which softmax then scales by 1 / sum (log_softmax overwrites it
 * with v - lse). EXP is vm_expf for float32 rows (within about an ulp,
 * as the float32 result's rounding) and exp otherwise; sums are in double. */
#define SOFTMAX_ROW(tag, S, LOAD, STORE, EXP)                                           \
    static void softmax_##tag(int64_t n, char **p, const int64_t *s, const void *ctx)   \
    {                                                                                   \
        const reduce_ctx *c = ctx;                                                      \
        for (int64_t i = 0; i < n; i++) {                                               \
            const char *q = p[1] + i * s[1];                                            \
            char *o = p[0] + i * s[0];                                                  \
            double m = -INFINITY, sum = 0;                                              \
            for (int64_t j = 0; j < c->len; j++) {                                      \
                double v = LOAD(*(const S *)(q + j * c->in_stride));                    \
                if (v > m || v != v) m = v;                                             \
            }                                                                           \
            for (int64_t j = 0; j < c->len; j++) {                                      \
                double e = EXP(LOAD(*(const S *)(q + j * c->in_stride)) - m);           \
                sum += e;                                                               \
                if (!c->log)                                                            \
                    *(S *)(o + j * c->out_stride) = STORE(e);                           \
            }                                                                           \
            if (c->log) {                                                               \
                double lse = m + log(sum);                                              \
                for (int64_t j = 0; j < c->len; j++)                                    \
                    *(S *)(o + j * c->out_stride) =                                     \
                        STORE(LOAD(*(const S *)(q + j * c->in_stride)) - lse);          \
            } else {                                                                    \
                double inv = 1 / sum;                                                   \
                for (int64_t j = 0; j < c->len; j++) {                                  \
                    S *out = (S *)(o + j * c->out_stride);                              \
                    *out = STORE(LOAD(*out) * inv);                                     \
                }                                                                       \
            }                                                                           \
        }                                                                               \
    }

/* A float32 row of contiguous elements (the softmax of a classifier's
 * logits): the same three passes, with vmath.h's exp, which vectorises,
 * and sums in double lanes (the lanes keep the loop free of a serial
 * dependency and need no reassociation). A NaN or inf in the row makes a
 * NaN sum, so every output is NaN, as with the general rows. */
VM_CLONES static void softmax_row_f32(const float *restrict q, float *restrict o, int64_t len, int logs)
{
    const float m = vm_max_f32(q, len);
    double lane[LANES] = { 0 };
    int64_t j = 0;
    for (; j + LANES <= len; j += LANES)
        for (int k = 0; k < LANES; k++) {
            float e = vm_expf(q[j + k] - m);
            lane[k] += e;
            if (!logs)
                o[j + k] = e;
        }
    double sum = 0;
    for (; j < len; j++) {
        float e = vm_expf(q[j] - m);
        sum += e;
        if (!logs)
            o[j] = e;
    }
    for (int k = 0; k < LANES; k++)
        sum += lane[k];
    if (logs) {
        double lse = m + log(sum);
        for (j = 0; j < len; j++)
            o[j] = (float)(q[j] - lse);
    } else {
        double inv = 1 / sum;
        for (j = 0; j < len; j++)
            o[j] = (float)(o[j] * inv);
    }
}

static void softmax_f32_rows(int64_t n, char **p, const int64_t *s, const void *ctx)
{
    const reduce_ctx *c = ctx;
    for (int64_t i = 0; i < n; i++)
        softmax_row_f32((const float *)(p[1] + i * s[1]), (float *)(p[0] + i * s[0]), c->len, c->log);
}

#define TO_F32(x) ((float)(x))
#define TO_F64(x) (x)
#define TO_BF16(x) float_to_bf16((float)(x))
#define FROM_BF16(x) ((double)bf16_to_float(x))
#define FROM_NUM(x) ((double)(x))
#define EXP_F32(x) ((double)vm_expf((float)(x)))
SOFTMAX_ROW(f32, float, FROM_NUM, TO_F32, EXP_F32)
SOFTMAX_ROW(f64, double, FROM_NUM, TO_F64, exp)
SOFTMAX_ROW(bf16, uint16_t, FROM_BF16, TO_BF16, exp)

dp_status cpu_softmax(dp_tensor *out, dp_tensor *a, int dim, int log)
{
    cpu_row_fn fn = a->dtype == DP_FLOAT32 ? softmax_f32 : a->dtype == DP_FLOAT64 ? softmax_f64
                  : a->dtype == DP_BFLOAT16 ? softmax_bf16 : NULL;
    if (fn == softmax_f32 && a->ndim > 0 && a->stride[dim] == 1 && out->stride[dim] == 1)
        fn = softmax_f32_rows;
    if (!fn)
        return dp_fail(DP_ERR_DTYPE, "softmax: expected a floating dtype, got %s", dp_dtype_name(a->dtype));
    if (a->ndim == 0) {
        /* softmax of a single value: 1 (log: 0) */
        return cpu_fill(out, log ? 0.0 : 1.0);
    }
    dp_tensor in_view, out_view;
    drop_dim(&in_view, a, dim);
    drop_dim(&out_view, out, dim);
    reduce_ctx c = { .len = a->shape[dim], .log = log,
                     .in_stride = a->stride[dim] * (int64_t)dp_dtype_size(a->dtype),
                     .out_stride = out->stride[dim] * (int64_t)dp_dtype_size(out->dtype) };
    dp_tensor *ts[2] = { &out_view, &in_view };
    cpu_foreach(2, ts, fn, &c);
    return DP_OK;
}

/* ---------------------------------------------------------------- softmax backward */

/* dx along a row from the output y and its gradient g: softmax's
 * y (g - sum(g y)), log_softmax's g - exp(y) sum(g). One read of the row
 * for the sum and one for dx, where the tensor ops took five passes. */
typedef struct {
    int64_t len, s_dx, s_g, s_y;   /* the row's length; its byte stride in dx, g and y */
    int log;
} softmax_bwd_ctx;

#define SOFTMAX_BWD_ROW(tag, S, LOAD, STORE, EXP)                                           \
    static void softmax_bwd_##tag(int64_t n, char **p, const int64_t *s, const void *ctx)   \
    {                                                                                       \
        const softmax_bwd_ctx *c = ctx;                                                     \
        for (int64_t i = 0; i < n; i++) {                                                   \
            char *dx = p[0] + i * s[0];                                                     \
            const char *g = p[1] + i * s[1], *y = p[2] + i * s[2];                          \
            double sum = 0;                                                                 \
            for (int64_t j = 0; j < c->len; j++) {                                          \
                double gv = LOAD(*(const S *)(g + j * c->s_g));                             \
                sum += c->log ? gv : gv * LOAD(*(const S *)(y + j * c->s_y));               \
            }                                                                               \
            for (int64_t j = 0; j < c->len; j++) {                                          \
                double gv = LOAD(*(const S *)(g + j * c->s_g));                             \
                double yv = LOAD(*(const S *)(y + j * c->s_y));                             \
                *(S *)(dx + j * c->s_dx) = STORE(c->log ? gv - EXP(yv) * sum : yv * (gv - sum)); \
            }                                                                               \
        }                                                                                   \
    }
SOFTMAX_BWD_ROW(f32, float, FROM_NUM, TO_F32, EXP_F32)
SOFTMAX_BWD_ROW(f64, double, FROM_NUM, TO_F64, exp)
SOFTMAX_BWD_ROW(bf16, uint16_t, FROM_BF16, TO_BF16, exp)

/* contiguous float32 rows: float arithmetic, as the tensor ops had, with
 * the sum in double lanes */
VM_CLONES static void softmax_bwd_row_f32(float *restrict dx, const float *restrict g, const float *restrict y,
                                          int64_t len, int logs)
{
    double lane[LANES] = { 0 }, sum = 0;
    int64_t j = 0;
    for (; j + LANES <= len; j += LANES)
        for (int k = 0; k < LANES; k++)
            lane[k] += logs ? (double)g[j + k] : (double)g[j + k] * y[j + k];
    for (; j < len; j++)
        sum += logs ? (double)g[j] : (double)g[j] * y[j];
    for (int k = 0; k < LANES; k++)
        sum += lane[k];
    float fs = (float)sum;
    if (logs)
        for (j = 0; j < len; j++)
            dx[j] = g[j] - vm_expf(y[j]) * fs;
    else
        for (j = 0; j < len; j++)
            dx[j] = y[j] * (g[j] - fs);
}

/* the same with g one value along the row (the gradient of a sum, broadcast) */
VM_CLONES static void softmax_bwd_row_f32_const(float *restrict dx, float g, const float *restrict y, int64_t len,
                                                int logs)
{
    double lane[LANES] = { 0 }, sum = 0;
    int64_t j = 0;
    if (logs) {
        sum = (double)g * (double)len;
    } else {
        for (; j + LANES <= len; j += LANES)
            for (int k = 0; k < LANES; k++)
                lane[k] += y[j + k];
        for (; j < len; j++)
            sum += y[j];
        for (int k = 0; k < LANES; k++)
            sum += lane[k];
        sum *= g;
    }
    float fs = (float)sum;
    if (logs)
        for (j = 0; j < len; j++)
            dx[j] = g - vm_expf(y[j]) * fs;
    else
        for (j = 0; j < len; j++)
            dx[j] = y[j] * (g - fs);
}

static void softmax_bwd_f32_rows(int64_t n, char **p, const int64_t *s, const void *ctx)
{
    const softmax_bwd_ctx *c = ctx;
    for (int64_t i = 0; i < n; i++) {
        float *dx = (float *)(p[0] + i * s[0]);
        const float *g = (const float *)(p[1] + i * s[1]), *y = (const float *)(p[2] + i * s[2]);
        if (c->s_g == 0)
            softmax_bwd_row_f32_const(dx, *g, y, c->len, c->log);
        else
            softmax_bwd_row_f32(dx, g, y, c->len, c->log);
    }
}

dp_status cpu_softmax_backward(dp_tensor *dx, dp_tensor *g, dp_tensor *y, int dim, int log)
{
    cpu_row_fn fn = y->dtype == DP_FLOAT32 ? softmax_bwd_f32 : y->dtype == DP_FLOAT64 ? softmax_bwd_f64
                  : y->dtype == DP_BFLOAT16 ? softmax_bwd_bf16 : NULL;
    if (!fn)
        return dp_fail(DP_ERR_DTYPE, "softmax backward: expected a floating dtype, got %s", dp_dtype_name(y->dtype));
    if (y->ndim == 0)   /* a single value's softmax is constant */
        return cpu_fill(dx, 0.0);
    if (fn == softmax_bwd_f32 && dx->stride[dim] == 1 && (g->stride[dim] == 1 || g->stride[dim] == 0) &&
        y->stride[dim] == 1)
        fn = softmax_bwd_f32_rows;
    int64_t es = (int64_t)dp_dtype_size(y->dtype);
    softmax_bwd_ctx c = { .len = y->shape[dim], .log = log, .s_dx = dx->stride[dim] * es,
                          .s_g = g->stride[dim] * es, .s_y = y->stride[dim] * es };
    dp_tensor dx_view, g_view, y_view;
    drop_dim(&dx_view, dx, dim);
    drop_dim(&g_view, g, dim);
    drop_dim(&y_view, y, dim);
    dp_tensor *ts[3] = { &dx_view, &g_view, &y_view };
    cpu_foreach(3, ts, fn, &c);
    return DP_OK;
}
