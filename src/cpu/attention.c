/*
 * attention.c — scaled dot product attention on the CPU, head by head.
 *
 * float64: a head's keys and values are read once into float64 scratch,
 * then each query row makes two passes over its allowed keys: the first
 * finds the row's log-sum-exp with a running maximum, the second adds up
 * exp(score - lse) * v. No (L, S) matrix of scores is ever held, and the
 * log-sum-exp is all the backward needs besides q, k, v and out, as in
 * the GPU's flash kernels.
 *
 * float32 and bfloat16: the same algorithm in float32, as PyTorch's CPU
 * attention computes it, over blocks of CPU_ATTENTION_BLOCK query rows:
 * the block's scores against the keys it may see are one product
 * (OpenBLAS's sgemm), their exponentials a vectorised loop (vmath.h),
 * and the output (P V), and in the backward dP = dout V^T, dq = dS K,
 * dk += dS^T q and dv += P^T dout, products too. Only a block's scores
 * (CPU_ATTENTION_BLOCK x S) are held at a time.
 */
#include "cpu/cpu.h"
#include "cpu/vmath.h"

#include <cblas.h>
#include <math.h>
#include <string.h>

/* keys a query row takes: all, or with causal (top-left aligned) j <= i */
static int64_t keys_of_row(const cpu_attention_args *a, int64_t i)
{
    int64_t S = a->k->shape[2];
    return a->causal ? (i + 1 < S ? i + 1 : S) : S;
}

/* rows (n, d) of t's head (b, h) into dst, as float64 */
static void load_head(double *dst, const dp_tensor *t, int64_t b, int64_t h)
{
    int64_t n = t->shape[2], d = t->shape[3], es = (int64_t)dt_size(t->dtype);
    const char *base = tensor_ptr(t) + (b * t->stride[0] + h * t->stride[1]) * es;
    for (int64_t r = 0; r < n; r++)
        for (int64_t c = 0; c < d; c++)
            dst[r * d + c] = dtype_load(t->dtype, base + (r * t->stride[2] + c) * es);
}

/* (n, d) float64 rows into t's head (b, h) */
static void store_head(dp_tensor *t, int64_t b, int64_t h, const double *src)
{
    int64_t n = t->shape[2], d = t->shape[3], es = (int64_t)dt_size(t->dtype);
    char *base = tensor_ptr(t) + (b * t->stride[0] + h * t->stride[1]) * es;
    for (int64_t r = 0; r < n; r++)
        for (int64_t c = 0; c < d; c++)
            dtype_store(t->dtype, base + (r * t->stride[2] + c) * es, src[r * d + c]);
}

static double dot(const double *x, const double *y, int64_t n)
{
    double s = 0;
    for (int64_t e = 0; e < n; e++)
        s += x[e] * y[e];
    return s;
}

/* the scaled scores of query row qi against keys 0..n-1 into s; returns their log-sum-exp */
static double row_scores(double *s, const double *qi, const double *K, int64_t n, int64_t E, double scale)
{
    double m = -INFINITY, sum = 0;
    for (int64_t j = 0; j < n; j++) {
        s[j] = scale * dot(qi, K + j * E, E);
        if (s[j] > m) {
            sum = sum * exp(m - s[j]) + 1;
            m = s[j];
        } else {
            sum += exp(s[j] - m);
        }
    }
    return n ? m + log(sum) : -INFINITY;
}

/* ---------------------------------------------------------------- float32 */

#define BQ CPU_ATTENTION_BLOCK

/* rows (n, d) of t's head (b, h) into dst, as float */
static void load_head_f32(float *dst, const dp_tensor *t, int64_t b, int64_t h)
{
    int64_t n = t->shape[2], d = t->shape[3], es = (int64_t)dt_size(t->dtype);
    const char *base = tensor_ptr(t) + (b * t->stride[0] + h * t->stride[1]) * es;
    for (int64_t r = 0; r < n; r++) {
        const char *row = base + r * t->stride[2] * es;
        if (t->dtype == DP_FLOAT32 && t->stride[3] == 1)
            memcpy(dst + r * d, row, sizeof(float) * (size_t)d);
        else
            for (int64_t c = 0; c < d; c++)
                dst[r * d + c] = (float)dtype_load(t->dtype, row + c * t->stride[3] * es);
    }
}

/* (n, d) float rows into t's head (b, h) */
static void store_head_f32(dp_tensor *t, int64_t b, int64_t h, const float *src)
{
    int64_t n = t->shape[2], d = t->shape[3], es = (int64_t)dt_size(t->dtype);
    char *base = tensor_ptr(t) + (b * t->stride[0] + h * t->stride[1]) * es;
    for (int64_t r = 0; r < n; r++) {
        char *row = base + r * t->stride[2] * es;
        if (t->dtype == DP_FLOAT32 && t->stride[3] == 1)
            memcpy(row, src + r * d, sizeof(float) * (size_t)d);
        else
            for (int64_t c = 0; c < d; c++)
                dtype_store(t->dtype, row + c * t->stride[3] * es, src[r * d + c]);
    }
}

static float dot_f32(const float *x, const float *y, int64_t n)
{
    float s = 0;
    for (int64_t e = 0; e < n; e++)
        s += x[e] * y[e];
    return s;
}

/* exp(row[j] - shift) in place for j < n, zero for n <= j < width */
static void exp_row(float *row, int64_t n, int64_t width, float shift)
{
    for (int64_t j = 0; j < n; j++)
        row[j] = vm_expf(row[j] - shift);
    for (int64_t j = n; j < width; j++)
        row[j] = 0.0f;
}

static float *lse_at(const dp_tensor *lse, int64_t row) { return (float *)tensor_ptr(lse) + row; }

/* The forward of head (b, h) over query blocks: P = the block's scaled
 * scores (m x n, n the keys its last row sees), each row's softmax in
 * place, then out = P V. */
static void forward_f32(const cpu_attention_args *a, dp_tensor *out, dp_tensor *lse, float *scratch, int64_t b,
                        int64_t h)
{
    const dp_tensor *q = a->q;
    int64_t H = q->shape[1], L = q->shape[2], E = q->shape[3], S = a->k->shape[2], Ev = a->v->shape[3];
    float *Q = scratch, *K = Q + L * E, *V = K + S * E, *O = V + S * Ev, *P = O + L * Ev;
    load_head_f32(Q, q, b, h);
    load_head_f32(K, a->k, b, h);
    load_head_f32(V, a->v, b, h);
    for (int64_t i0 = 0; i0 < L; i0 += BQ) {
        int64_t m = L - i0 < BQ ? L - i0 : BQ, n = keys_of_row(a, i0 + m - 1);
        if (n == 0) {   /* no keys: out 0, lse -inf */
            memset(O + i0 * Ev, 0, sizeof(float) * (size_t)(m * Ev));
            for (int64_t r = 0; r < m; r++)
                *lse_at(lse, (b * H + h) * L + i0 + r) = -INFINITY;
            continue;
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)m, (int)n, (int)E, (float)a->scale, Q + i0 * E,
                    (int)E, K, (int)E, 0.0f, P, (int)n);
        for (int64_t r = 0; r < m; r++) {
            float *row = P + r * n, mx = -INFINITY, sum = 0;
            int64_t nr = keys_of_row(a, i0 + r);
            for (int64_t j = 0; j < nr; j++)
                mx = row[j] > mx ? row[j] : mx;
            exp_row(row, nr, n, mx);
            for (int64_t j = 0; j < nr; j++)
                sum += row[j];
            for (int64_t j = 0; j < nr; j++)
                row[j] /= sum;
            *lse_at(lse, (b * H + h) * L + i0 + r) = mx + logf(sum);
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)m, (int)Ev, (int)n, 1.0f, P, (int)n, V, (int)Ev,
                    0.0f, O + i0 * Ev, (int)Ev);
    }
    store_head_f32(out, b, h, O);
}

/* The backward of head (b, h) over query blocks: P again from the
 * scores and lse, dP = dout V^T, dS = P (dP - delta) scale, then
 * dv += P^T dout, dq = dS K, dk += dS^T q. */
static void backward_f32(const cpu_attention_args *a, dp_tensor *out, dp_tensor *dout, dp_tensor *lse,
                         dp_tensor *dq, dp_tensor *dk, dp_tensor *dv, float *scratch, int64_t b, int64_t h)
{
    const dp_tensor *q = a->q;
    int64_t H = q->shape[1], L = q->shape[2], E = q->shape[3], S = a->k->shape[2], Ev = a->v->shape[3];
    float *Q = scratch, *K = Q + L * E, *V = K + S * E, *O = V + S * Ev, *dO = O + L * Ev;
    float *dQ = dO + L * Ev, *dK = dQ + L * E, *dV = dK + S * E, *P = dV + S * Ev, *dP = P + BQ * S;
    load_head_f32(Q, q, b, h);
    load_head_f32(K, a->k, b, h);
    load_head_f32(V, a->v, b, h);
    load_head_f32(O, out, b, h);
    load_head_f32(dO, dout, b, h);
    memset(dQ, 0, sizeof(float) * (size_t)(L * E + S * E + S * Ev));
    const float scale = (float)a->scale;
    for (int64_t i0 = 0; i0 < L; i0 += BQ) {
        int64_t m = L - i0 < BQ ? L - i0 : BQ, n = keys_of_row(a, i0 + m - 1);
        if (n == 0)
            continue;   /* no keys: no gradient */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)m, (int)n, (int)E, scale, Q + i0 * E, (int)E, K,
                    (int)E, 0.0f, P, (int)n);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)m, (int)n, (int)Ev, 1.0f, dO + i0 * Ev, (int)Ev,
                    V, (int)Ev, 0.0f, dP, (int)n);
        for (int64_t r = 0; r < m; r++) {
            int64_t i = i0 + r, nr = keys_of_row(a, i);
            float *p = P + r * n, *ds = dP + r * n;
            float delta = dot_f32(dO + i * Ev, O + i * Ev, Ev);
            exp_row(p, nr, n, *lse_at(lse, (b * H + h) * L + i));
            for (int64_t j = 0; j < n; j++)
                ds[j] = p[j] * (ds[j] - delta) * scale;
        }
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)n, (int)Ev, (int)m, 1.0f, P, (int)n, dO + i0 * Ev,
                    (int)Ev, 1.0f, dV, (int)Ev);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)m, (int)E, (int)n, 1.0f, dP, (int)n, K, (int)E,
                    0.0f, dQ + i0 * E, (int)E);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)n, (int)E, (int)m, 1.0f, dP, (int)n, Q + i0 * E,
                    (int)E, 1.0f, dK, (int)E);
    }
    store_head_f32(dq, b, h, dQ);
    store_head_f32(dk, b, h, dK);
    store_head_f32(dv, b, h, dV);
}

/* ---------------------------------------------------------------- the entry points */

void cpu_attention_forward(const cpu_attention_args *a, dp_tensor *out, dp_tensor *lse, double *scratch)
{
    const dp_tensor *q = a->q;
    if (q->dtype != DP_FLOAT64) {
        for (int64_t b = 0; b < q->shape[0]; b++)
            for (int64_t h = 0; h < q->shape[1]; h++)
                forward_f32(a, out, lse, (float *)scratch, b, h);
        return;
    }
    int64_t B = q->shape[0], H = q->shape[1], L = q->shape[2], E = q->shape[3];
    int64_t S = a->k->shape[2], Ev = a->v->shape[3];
    double *Q = scratch, *K = Q + L * E, *V = K + S * E, *O = V + S * Ev, *s = O + L * Ev;
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++) {
            load_head(Q, q, b, h);
            load_head(K, a->k, b, h);
            load_head(V, a->v, b, h);
            memset(O, 0, sizeof(double) * (size_t)(L * Ev));
            for (int64_t i = 0; i < L; i++) {
                int64_t n = keys_of_row(a, i);
                double row_lse = row_scores(s, Q + i * E, K, n, E, a->scale);
                for (int64_t j = 0; j < n; j++) {
                    double p = exp(s[j] - row_lse);
                    for (int64_t e = 0; e < Ev; e++)
                        O[i * Ev + e] += p * V[j * Ev + e];
                }
                dtype_store(lse->dtype, tensor_ptr(lse) + ((b * H + h) * L + i) * (int64_t)dt_size(lse->dtype),
                            row_lse);
            }
            store_head(out, b, h, O);
        }
}

/* With p = exp(score - lse) and delta_i = dout_i . out_i (= sum_j p_ij dp_ij):
 * dv_j += p_ij dout_i; dp_ij = dout_i . v_j; ds_ij = p_ij (dp_ij - delta_i);
 * dq_i += scale ds_ij k_j; dk_j += scale ds_ij q_i. */
void cpu_attention_backward(const cpu_attention_args *a, dp_tensor *out, dp_tensor *dout, dp_tensor *lse,
                            dp_tensor *dq, dp_tensor *dk, dp_tensor *dv, double *scratch)
{
    const dp_tensor *q = a->q;
    if (q->dtype != DP_FLOAT64) {
        for (int64_t b = 0; b < q->shape[0]; b++)
            for (int64_t h = 0; h < q->shape[1]; h++)
                backward_f32(a, out, dout, lse, dq, dk, dv, (float *)scratch, b, h);
        return;
    }
    int64_t B = q->shape[0], H = q->shape[1], L = q->shape[2], E = q->shape[3];
    int64_t S = a->k->shape[2], Ev = a->v->shape[3];
    double *Q = scratch, *K = Q + L * E, *V = K + S * E, *O = V + S * Ev, *dO = O + L * Ev;
    double *dQ = dO + L * Ev, *dK = dQ + L * E, *dV = dK + S * E;
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++) {
            load_head(Q, q, b, h);
            load_head(K, a->k, b, h);
            load_head(V, a->v, b, h);
            load_head(O, out, b, h);
            load_head(dO, dout, b, h);
            memset(dQ, 0, sizeof(double) * (size_t)(L * E + S * E + S * Ev));
            for (int64_t i = 0; i < L; i++) {
                int64_t n = keys_of_row(a, i);
                const double *qi = Q + i * E, *gi = dO + i * Ev;
                double row_lse = dtype_load(lse->dtype,
                                            tensor_ptr(lse) + ((b * H + h) * L + i) * (int64_t)dt_size(lse->dtype));
                double delta = dot(gi, O + i * Ev, Ev);
                for (int64_t j = 0; j < n; j++) {
                    double p = exp(a->scale * dot(qi, K + j * E, E) - row_lse);
                    double ds = p * (dot(gi, V + j * Ev, Ev) - delta) * a->scale;
                    for (int64_t e = 0; e < Ev; e++)
                        dV[j * Ev + e] += p * gi[e];
                    for (int64_t e = 0; e < E; e++) {
                        dQ[i * E + e] += ds * K[j * E + e];
                        dK[j * E + e] += ds * qi[e];
                    }
                }
            }
            store_head(dq, b, h, dQ);
            store_head(dk, b, h, dK);
            store_head(dv, b, h, dV);
        }
}
