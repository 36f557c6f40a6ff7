/*
 * sort.c — the row kernels of sort, topk, cumsum and multinomial on the
 * CPU. src/core/select.c hands them contiguous (rows, n) matrices whose
 * rows are the lines along the op's dim.
 */
#include "cpu/cpu.h"
#include "common/search.h"

/* ---------------------------------------------------------------- sort */

/* Keys compare as PyTorch's sort compares them: NaN above every number
 * (and equal to NaN); int64 exactly, every other dtype as a double. */
static int key_cmp(const cpu_sort_entry *x, const cpu_sort_entry *y, bool exact)
{
    if (exact)
        return (x->i > y->i) - (x->i < y->i);
    bool xn = x->f != x->f, yn = y->f != y->f;
    if (xn || yn)
        return xn - yn;
    return (x->f > y->f) - (x->f < y->f);
}

/* A bottom-up merge sort of e[0..n) (tmp as long): stable, so equal keys
 * keep their order, which is what stable=true promises in either
 * direction. Returns the array that holds the result. */
static cpu_sort_entry *merge_sort(cpu_sort_entry *e, cpu_sort_entry *tmp, int64_t n, bool exact, bool descending)
{
    for (int64_t width = 1; width < n; width *= 2) {
        for (int64_t lo = 0; lo < n; lo += 2 * width) {
            int64_t mid = lo + width < n ? lo + width : n, hi = lo + 2 * width < n ? lo + 2 * width : n;
            int64_t i = lo, j = mid, k = lo;
            while (i < mid && j < hi) {
                int c = key_cmp(&e[j], &e[i], exact);
                /* the right one goes first only when strictly before */
                tmp[k++] = (descending ? c > 0 : c < 0) ? e[j++] : e[i++];
            }
            while (i < mid) tmp[k++] = e[i++];
            while (j < hi) tmp[k++] = e[j++];
        }
        cpu_sort_entry *s = e;
        e = tmp;
        tmp = s;
    }
    return e;
}

void cpu_argsort(dp_tensor *indices, dp_tensor *a, int descending, cpu_sort_entry *scratch)
{
    int64_t rows = a->shape[0], n = a->shape[1];
    size_t es = dp_dtype_size(a->dtype);
    bool exact = a->dtype == DP_INT64;
    const char *src = tensor_ptr(a);
    int64_t *out = (int64_t *)tensor_ptr(indices);
    for (int64_t r = 0; r < rows; r++) {
        cpu_sort_entry *e = scratch;
        for (int64_t j = 0; j < n; j++) {
            const char *p = src + (r * n + j) * (int64_t)es;
            e[j].pos = j;
            if (exact)
                e[j].i = *(const int64_t *)p;
            else
                e[j].f = dtype_load(a->dtype, p);
        }
        e = merge_sort(e, scratch + n, n, exact, descending);
        for (int64_t j = 0; j < n; j++)
            out[r * n + j] = e[j].pos;
    }
}

/* ---------------------------------------------------------------- cumsum */

/* out (rows, n) = running sums of a along each row, from the end with
 * reverse (the backward). Floats add in double and store each prefix in
 * out's dtype; integers add in int64, wrapping. */
void cpu_cumsum(dp_tensor *out, dp_tensor *a, int reverse)
{
    int64_t rows = a->shape[0], n = a->shape[1];
    size_t es = dp_dtype_size(a->dtype);
    bool is_int = !dp_dtype_is_floating(out->dtype);
    const char *src = tensor_ptr(a);
    char *dst = tensor_ptr(out);
    for (int64_t r = 0; r < rows; r++) {
        double f = 0;
        uint64_t i = 0;
        for (int64_t s = 0; s < n; s++) {
            int64_t j = r * n + (reverse ? n - 1 - s : s);
            if (is_int) {
                i += (uint64_t)*(const int64_t *)(src + j * (int64_t)es);
                ((int64_t *)dst)[j] = (int64_t)i;
            } else {
                f += dtype_load(a->dtype, src + j * (int64_t)es);
                dtype_store(out->dtype, dst + j * (int64_t)es, f);
            }
        }
    }
}

/* ---------------------------------------------------------------- multinomial */

/* out (rows, k) int64: for each u of that row, the first category whose
 * running sum passes u times the row's total (cdf (rows, n) float64, u
 * (rows, k) float64 in [0, 1)). A category of probability 0 adds nothing
 * to the running sum and so is never first to pass; should rounding let u
 * times the total reach the total, the last category of non-zero
 * probability is taken. */
void cpu_multinomial(dp_tensor *out, dp_tensor *cdf, dp_tensor *u)
{
    int64_t rows = cdf->shape[0], n = cdf->shape[1], k = u->shape[1];
    const double *c = (const double *)tensor_ptr(cdf), *uu = (const double *)tensor_ptr(u);
    int64_t *o = (int64_t *)tensor_ptr(out);
    for (int64_t r = 0; r < rows; r++) {
        const double *row = c + r * n;
        for (int64_t s = 0; s < k; s++)
            o[r * k + s] = cdf_search(row, n, uu[r * k + s] * row[n - 1]);
    }
}
