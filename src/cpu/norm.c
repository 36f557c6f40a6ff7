/*
 * norm.c — LayerNorm on the CPU, row by row in float64.
 *
 * A row is read once into scratch; its mean, then the mean of its squared
 * deviations (the biased variance, as PyTorch's) are taken in two passes,
 * which keeps a row of large values with a small spread exact where one
 * pass of sums and squares would cancel. The backward makes one pass per
 * row for dx and adds the row's share of dweight and dbias into float64
 * sums over all rows, stored once at the end.
 *
 * BatchNorm works on pieces of at most CPU_BN_CHUNK elements of one
 * channel's plane (or of one row of channels, for an (N, C) input), read
 * into float64 scratch: one pass for each channel's mean and variance
 * (each piece's own, two passes over the scratch, merged into the
 * channel's), one for the output; the backward's per-channel sums of dy
 * and dy * (x - mean) in one pass, then dx in another. The sums keep
 * eight lanes, which the compiler puts in vector registers.
 */
#include "cpu/cpu.h"

#include <math.h>
#include <string.h>

/* BatchNorm's kernels are compiled twice, for the baseline x86-64 and for
 * AVX2 (x86-64-v3), chosen at load time by the CPU: their conversions to
 * float64 and sums take half the instructions in AVX registers (128 x 16 x
 * 28 x 28 forward and backward: 3.8 ms to 2.4). The helpers below are
 * inlined into each clone, so that they are compiled for its target. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__)
#define BN_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define BN_CLONES
#endif
#define INLINE static inline __attribute__((always_inline))

/* n elements of dtype at p as float64 into dst: one switch a row */
INLINE void load_row(double *dst, int dtype, const char *p, int64_t n)
{
    if (dtype == DP_FLOAT64) {
        memcpy(dst, p, sizeof(double) * (size_t)n);
    } else if (dtype == DP_FLOAT32) {
        for (int64_t j = 0; j < n; j++)
            dst[j] = ((const float *)p)[j];
    } else {
        for (int64_t j = 0; j < n; j++)
            dst[j] = dt_load(dtype, p + j * (int64_t)dt_size(dtype));
    }
}

INLINE void store_row(int dtype, char *p, const double *src, int64_t n)
{
    if (dtype == DP_FLOAT64) {
        memcpy(p, src, sizeof(double) * (size_t)n);
    } else if (dtype == DP_FLOAT32) {
        for (int64_t j = 0; j < n; j++)
            ((float *)p)[j] = (float)src[j];
    } else {
        for (int64_t j = 0; j < n; j++)
            dt_store(dtype, p + j * (int64_t)dt_size(dtype), src[j]);
    }
}

/* row r of a (rows, n) contiguous tensor */
static char *row_of(const dp_tensor *t, int64_t r, int64_t n)
{
    return tensor_ptr(t) + r * n * (int64_t)dt_size(t->dtype);
}

static void load_optional(double *dst, const dp_tensor *t, int64_t n)
{
    if (t)
        load_row(dst, t->dtype, tensor_ptr(t), n);
}

/* x + residual of row r, rounded to sum's dtype as a separate addition
 * would, written to sum and read back into x */
static void add_residual(double *x, double *res, const cpu_norm_args *a, dp_tensor *sum, int64_t r)
{
    int64_t n = a->n;
    load_row(res, a->residual->dtype, row_of(a->residual, r, n), n);
    for (int64_t j = 0; j < n; j++)
        x[j] += res[j];
    store_row(sum->dtype, row_of(sum, r, n), x, n);
    load_row(x, sum->dtype, row_of(sum, r, n), n);
}

void cpu_layer_norm(const cpu_norm_args *a, dp_tensor *out, dp_tensor *sum, dp_tensor *mean, dp_tensor *rstd,
                    double *scratch)
{
    int64_t n = a->n;
    double *x = scratch, *res = x + n, *w = res + n, *b = w + n;
    size_t stat_size = dt_size(mean->dtype);
    load_optional(w, a->weight, n);
    load_optional(b, a->bias, n);
    for (int64_t r = 0; r < a->rows; r++) {
        load_row(x, a->x->dtype, row_of(a->x, r, n), n);
        if (a->residual)
            add_residual(x, res, a, sum, r);
        double m = 0, var = 0;
        for (int64_t j = 0; j < n; j++)
            m += x[j];
        m /= (double)n;
        for (int64_t j = 0; j < n; j++)
            var += (x[j] - m) * (x[j] - m);
        double rs = 1 / sqrt(var / (double)n + a->eps);
        for (int64_t j = 0; j < n; j++) {
            double y = (x[j] - m) * rs;
            x[j] = (a->weight ? y * w[j] : y) + (a->bias ? b[j] : 0);
        }
        store_row(out->dtype, row_of(out, r, n), x, n);
        dt_store(mean->dtype, tensor_ptr(mean) + r * (int64_t)stat_size, m);
        dt_store(rstd->dtype, tensor_ptr(rstd) + r * (int64_t)stat_size, rs);
    }
}

/* With xh = (x - mean) * rstd and g = dy * weight (dy without a weight):
 * dx = rstd * (g - mean(g) - xh * mean(g * xh)); dweight = sum over rows of
 * dy * xh, dbias = sum over rows of dy. */
void cpu_layer_norm_backward(const cpu_norm_args *a, dp_tensor *dy, dp_tensor *mean, dp_tensor *rstd,
                             dp_tensor *dx, dp_tensor *dw, dp_tensor *db, double *scratch)
{
    int64_t n = a->n;
    double *x = scratch, *g = x + n, *w = g + n, *sw = w + n, *sb = sw + n;
    size_t stat_size = dt_size(mean->dtype);
    load_optional(w, a->weight, n);
    memset(sw, 0, sizeof(double) * (size_t)(2 * n));
    for (int64_t r = 0; r < a->rows; r++) {
        load_row(x, a->x->dtype, row_of(a->x, r, n), n);
        load_row(g, dy->dtype, row_of(dy, r, n), n);
        double m = dt_load(mean->dtype, tensor_ptr(mean) + r * (int64_t)stat_size);
        double rs = dt_load(rstd->dtype, tensor_ptr(rstd) + r * (int64_t)stat_size);
        double g_mean = 0, gx_mean = 0;
        for (int64_t j = 0; j < n; j++) {
            x[j] = (x[j] - m) * rs;
            sw[j] += g[j] * x[j];
            sb[j] += g[j];
            if (a->weight)
                g[j] *= w[j];
            g_mean += g[j];
            gx_mean += g[j] * x[j];
        }
        if (!dx)
            continue;
        g_mean /= (double)n;
        gx_mean /= (double)n;
        for (int64_t j = 0; j < n; j++)
            x[j] = rs * (g[j] - g_mean - x[j] * gx_mean);
        if (a->dx_adds) {
            load_row(g, dx->dtype, row_of(dx, r, n), n);
            for (int64_t j = 0; j < n; j++)
                x[j] += g[j];
        }
        store_row(dx->dtype, row_of(dx, r, n), x, n);
    }
    if (dw)
        store_row(dw->dtype, tensor_ptr(dw), sw, n);
    if (db)
        store_row(db->dtype, tensor_ptr(db), sb, n);
}

/* ---------------------------------------------------------------- BatchNorm */

/* A piece of a BatchNorm pass: len contiguous elements from element off,
 * of one channel's plane of S (S > 1), or of one row of the C channels (S
 * = 1); c is the channel of its first element. The passes go through the
 * pieces in memory order: bn_next from a zeroed bn_run. */
typedef struct {
    int64_t seg, pos;   /* the plane (or row), and where in it the next piece starts */
    int64_t off, len, c;
} bn_run;

static bool bn_next(const cpu_bn_args *a, bn_run *r)
{
    const bool planes = a->S > 1;
    const int64_t seg_len = planes ? a->S : a->C, segs = planes ? a->N * a->C : a->N;
    if (a->S == 0)
        return false;
    if (r->pos >= seg_len) {
        r->seg++;
        r->pos = 0;
    }
    if (r->seg >= segs)
        return false;
    r->off = r->seg * seg_len + r->pos;
    r->len = seg_len - r->pos < CPU_BN_CHUNK ? seg_len - r->pos : CPU_BN_CHUNK;
    r->c = planes ? r->seg % a->C : r->pos;
    r->pos += r->len;
    return true;
}

INLINE void load_run(double *dst, const dp_tensor *t, const bn_run *r)
{
    load_row(dst, t->dtype, tensor_ptr(t) + r->off * (int64_t)dt_size(t->dtype), r->len);
}

INLINE void store_run(dp_tensor *t, const double *src, const bn_run *r)
{
    store_row(t->dtype, tensor_ptr(t) + r->off * (int64_t)dt_size(t->dtype), src, r->len);
}

/* sum of x */
INLINE double sum_of(const double *x, int64_t n)
{
    double s[8] = { 0 }, t = 0;
    int64_t j = 0;
    for (; j + 8 <= n; j += 8)
        for (int k = 0; k < 8; k++)
            s[k] += x[j + k];
    for (; j < n; j++)
        t += x[j];
    for (int k = 0; k < 8; k++)
        t += s[k];
    return t;
}

/* sum of g * (x - m), or of (x - m)^2 when g is NULL */
INLINE double dev_sum_of(const double *g, const double *x, double m, int64_t n)
{
    double s[8] = { 0 }, t = 0;
    int64_t j = 0;
    if (g) {
        for (; j + 8 <= n; j += 8)
            for (int k = 0; k < 8; k++)
                s[k] += g[j + k] * (x[j + k] - m);
        for (; j < n; j++)
            t += g[j] * (x[j] - m);
    } else {
        for (; j + 8 <= n; j += 8)
            for (int k = 0; k < 8; k++)
                s[k] += (x[j + k] - m) * (x[j + k] - m);
        for (; j < n; j++)
            t += (x[j] - m) * (x[j] - m);
    }
    for (int k = 0; k < 8; k++)
        t += s[k];
    return t;
}

/* the C elements of t (a parameter, or NULL for `fill`) as float64 */
static void load_channels(double *dst, const dp_tensor *t, int64_t C, double fill)
{
    if (t) {
        load_row(dst, t->dtype, tensor_ptr(t), C);
        return;
    }
    for (int64_t c = 0; c < C; c++)
        dst[c] = fill;
}

/* The batch's mean and invstd per channel in one pass, and the running
 * statistics moved toward its mean and unbiased variance. Each piece's
 * mean and squared deviations are merged into its channel's (Chan et
 * al.'s formula); a row of channels is Welford's update of each. x:
 * CPU_BN_CHUNK scratch, count: C. */
INLINE void batch_stats(const cpu_bn_args *a, double *x, double *mean, double *invstd, double *count)
{
    const int64_t C = a->C, M = a->N * a->S;
    double *m2 = invstd;
    memset(mean, 0, sizeof(double) * (size_t)C);
    memset(m2, 0, sizeof(double) * (size_t)C);
    memset(count, 0, sizeof(double) * (size_t)C);
    for (bn_run r = { 0 }; bn_next(a, &r);) {
        load_run(x, a->x, &r);
        if (a->S > 1) {
            const double nb = (double)r.len, mb = sum_of(x, r.len) / nb, qb = dev_sum_of(NULL, x, mb, r.len);
            const double na = count[r.c], n = na + nb, d = mb - mean[r.c];
            mean[r.c] += d * (nb / n);
            m2[r.c] += qb + d * d * (na * nb / n);
            count[r.c] = n;
        } else {
            const double n = (double)(r.seg + 1);
            for (int64_t j = 0; j < r.len; j++) {
                const double d = x[j] - mean[r.c + j];
                mean[r.c + j] += d / n;
                m2[r.c + j] += d * (x[j] - mean[r.c + j]);
            }
        }
    }
    if (a->running_mean) {
        dp_tensor *rm = a->running_mean, *rv = a->running_var;
        const size_t size = dt_size(rm->dtype);
        const double mom = a->momentum;
        for (int64_t c = 0; c < C; c++) {
            char *pm = tensor_ptr(rm) + c * (int64_t)size, *pv = tensor_ptr(rv) + c * (int64_t)size;
            dt_store(rm->dtype, pm, (1 - mom) * dt_load(rm->dtype, pm) + mom * mean[c]);
            dt_store(rv->dtype, pv, (1 - mom) * dt_load(rv->dtype, pv) + mom * m2[c] / (double)(M - 1));
        }
    }
    for (int64_t c = 0; c < C; c++)
        invstd[c] = 1 / sqrt(m2[c] / (double)M + a->eps);
}

BN_CLONES void cpu_batch_norm(const cpu_bn_args *a, dp_tensor *out, dp_tensor *mean, dp_tensor *invstd, double *scratch)
{
    const int64_t C = a->C;
    double *x = scratch, *m = x + CPU_BN_CHUNK, *rs = m + C, *scale = rs + C, *shift = scale + C;
    if (a->training) {
        batch_stats(a, x, m, rs, scale);
    } else {
        load_channels(m, a->running_mean, C, 0);
        load_channels(rs, a->running_var, C, 0);
        for (int64_t c = 0; c < C; c++)
            rs[c] = 1 / sqrt(rs[c] + a->eps);
    }
    store_row(mean->dtype, tensor_ptr(mean), m, C);
    store_row(invstd->dtype, tensor_ptr(invstd), rs, C);
    load_channels(scale, a->weight, C, 1);
    load_channels(shift, a->bias, C, 0);
    for (int64_t c = 0; c < C; c++)
        scale[c] *= rs[c];
    for (bn_run r = { 0 }; bn_next(a, &r);) {
        load_run(x, a->x, &r);
        if (a->S > 1) {
            const double mc = m[r.c], sc = scale[r.c], sh = shift[r.c];
            for (int64_t j = 0; j < r.len; j++)
                x[j] = (x[j] - mc) * sc + sh;
        } else {
            for (int64_t j = 0; j < r.len; j++)
                x[j] = (x[j] - m[r.c + j]) * scale[r.c + j] + shift[r.c + j];
        }
        store_run(out, x, &r);
    }
}

/* With xh = (x - mean) * invstd, over each channel's M = N S elements:
 * dweight = sum of dy * xh, dbias = sum of dy; dx = weight * invstd * (dy
 * - mean(dy) - xh * mean(dy * xh)) for the batch's statistics, weight *
 * invstd * dy for running ones. As dx = k1 dy + k2 (x - mean) + k3. */
BN_CLONES void cpu_batch_norm_backward(const cpu_bn_args *a, dp_tensor *dy, dp_tensor *mean, dp_tensor *invstd,
                             dp_tensor *dx, dp_tensor *dw, dp_tensor *db, double *scratch)
{
    const int64_t C = a->C, M = a->N * a->S;
    double *x = scratch, *g = x + CPU_BN_CHUNK, *m = g + CPU_BN_CHUNK, *rs = m + C, *sg = rs + C, *sgx = sg + C,
           *k1 = sgx + C;
    double *k2 = sgx, *k3 = sg;   /* once the sums are used */
    load_row(m, mean->dtype, tensor_ptr(mean), C);
    load_row(rs, invstd->dtype, tensor_ptr(invstd), C);
    memset(sg, 0, sizeof(double) * (size_t)(2 * C));
    if ((dx && a->training) || dw || db) {
        for (bn_run r = { 0 }; bn_next(a, &r);) {
            load_run(x, a->x, &r);
            load_run(g, dy, &r);
            if (a->S > 1) {
                sg[r.c] += sum_of(g, r.len);
                sgx[r.c] += dev_sum_of(g, x, m[r.c], r.len);
            } else {
                for (int64_t j = 0; j < r.len; j++) {
                    sg[r.c + j] += g[j];
                    sgx[r.c + j] += g[j] * (x[j] - m[r.c + j]);
                }
            }
        }
        for (int64_t c = 0; c < C; c++)
            k1[c] = sgx[c] * rs[c];
        if (dw)
            store_row(dw->dtype, tensor_ptr(dw), k1, C);
        if (db)
            store_row(db->dtype, tensor_ptr(db), sg, C);
    }
    if (!dx)
        return;
    load_channels(k1, a->weight, C, 1);
    for (int64_t c = 0; c < C; c++) {
        k1[c] *= rs[c];
        k2[c] = a->training ? -k1[c] * rs[c] * rs[c] * sgx[c] / (double)M : 0;
        k3[c] = a->training ? -k1[c] * sg[c] / (double)M : 0;
    }
    for (bn_run r = { 0 }; bn_next(a, &r);) {
        load_run(g, dy, &r);
        if (a->training)
            load_run(x, a->x, &r);
        if (a->S > 1) {
            const double mc = m[r.c], c1 = k1[r.c], c2 = k2[r.c], c3 = k3[r.c];
            if (a->training)
                for (int64_t j = 0; j < r.len; j++)
                    g[j] = c1 * g[j] + c2 * (x[j] - mc) + c3;
            else
                for (int64_t j = 0; j < r.len; j++)
                    g[j] *= c1;
        } else {
            for (int64_t j = 0; j < r.len; j++)
                g[j] = k1[r.c + j] * g[j] + (a->training ? k2[r.c + j] * (x[j] - m[r.c + j]) + k3[r.c + j] : 0);
        }
        store_run(dx, g, &r);
    }
}
