/*
 * norm.c — LayerNorm on the CPU, row by row in float64.
 *
 * A row is read once into scratch; its mean, then the mean of its squared
 * deviations (the biased variance, as PyTorch's) are taken in two passes,
 * which keeps a row of large values with a small spread exact where one
 * pass of sums and squares would cancel. The backward makes one pass per
 * row for dx and adds the row's share of dweight and dbias into float64
 * sums over all rows, stored once at the end.
 */
#include "cpu/cpu.h"

#include <math.h>
#include <string.h>

/* n elements of dtype at p as float64 into dst: one switch a row */
static void load_row(double *dst, int dtype, const char *p, int64_t n)
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

static void store_row(int dtype, char *p, const double *src, int64_t n)
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
        store_row(dx->dtype, row_of(dx, r, n), x, n);
    }
    if (dw)
        store_row(dw->dtype, tensor_ptr(dw), sw, n);
    if (db)
        store_row(db->dtype, tensor_ptr(db), sb, n);
}
