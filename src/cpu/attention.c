/*
 * attention.c — scaled dot product attention on the CPU, head by head.
 *
 * A head's keys and values are read once into float64 scratch, then each
 * query row makes two passes over its allowed keys: the first finds the
 * row's log-sum-exp with a running maximum, the second adds up
 * exp(score - lse) * v. No (L, S) matrix of scores is ever held, and the
 * log-sum-exp is all the backward needs besides q, k, v and out, as in
 * the GPU's flash kernels. Everything is computed in float64.
 */
#include "cpu/cpu.h"

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

void cpu_attention_forward(const cpu_attention_args *a, dp_tensor *out, dp_tensor *lse, double *scratch)
{
    const dp_tensor *q = a->q;
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
