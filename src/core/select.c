/*
 * select.c — the op table's ordering and selecting ops: sort (and its
 * indices, argsort), topk, cumsum, multinomial, nonzero and put_. The
 * row ops see the lines along their dim as the rows of a contiguous
 * (rows, n) matrix (rows_along), which is what the kernels of
 * src/cpu/sort.c and cuda/sort.cu take, and turn their result back
 * (unrows).
 */
#include "core/autograd.h"
#include "core/kernels.h"

#include <math.h>
#include <string.h>

/* ---------------------------------------------------------------- rows */

/* a's lines along dim as a contiguous (rows, n) matrix of dtype (a 0-d a
 * is one row of one). Called with recording off. */
static dp_status rows_along(dp_tensor **res, dp_tensor *a, int dim, int dtype)
{
    int last = a->ndim ? a->ndim - 1 : 0;
    int64_t shape[2] = { 1, a->ndim ? a->shape[dim] : 1 };
    for (int d = 0; d < a->ndim; d++)
        if (d != dim)
            shape[0] *= a->shape[d];
    dp_tensor *t = NULL, *c = NULL, *cc = NULL;
    dp_status st;
    if (!(st = a->ndim ? dp_transpose(&t, a, dim, last) : dp_alias(&t, a)) &&
        !(st = dp_to(&c, t, dtype, a->device)) && !(st = dp_contiguous(&cc, c)))
        st = dp_reshape(res, cc, 2, shape);
    dp_tensor_release(t);
    dp_tensor_release(c);
    dp_tensor_release(cc);
    return st;
}

/* The inverse of rows_along for a result matrix m (rows, n'), which may
 * be a narrowed view: a contiguous tensor of a's shape with n' along dim. */
static dp_status unrows(dp_tensor **out, dp_tensor *m, const dp_tensor *a, int dim)
{
    int64_t shape[DP_MAX_DIMS] = { 0 };
    if (a->ndim == 0)
        return dp_reshape(out, m, 0, shape);
    int last = a->ndim - 1;
    memcpy(shape, a->shape, sizeof(int64_t) * (size_t)a->ndim);
    shape[dim] = a->shape[last];
    shape[last] = m->shape[1];
    dp_tensor *v = NULL, *t = NULL;
    dp_status st;
    if (!(st = dp_reshape(&v, m, a->ndim, shape)) && !(st = dp_transpose(&t, v, dim, last)))
        st = dp_contiguous(out, t);
    dp_tensor_release(v);
    dp_tensor_release(t);
    return st;
}

/* ---------------------------------------------------------------- sort, topk */

/* The CPU's argsort, with its scratch (kernels.h) */
dp_status argsort_on_cpu(dp_tensor *indices, dp_tensor *a, int descending)
{
    dp_tensor *scratch;
    int64_t bytes = 2 * a->shape[1] * (int64_t)sizeof(cpu_sort_entry);
    dp_status st = tensor_new(&scratch, 1, &bytes, DP_UINT8, DP_CPU);
    if (st)
        return st;
    cpu_argsort(indices, a, descending, (cpu_sort_entry *)tensor_ptr(scratch));
    dp_tensor_release(scratch);
    return DP_OK;
}

/* The positions of the first k of each line of a along dim in sorted
 * order (ascending, or descending), in a's layout. Recording off. */
static dp_status sorted_positions(dp_tensor **idx, dp_tensor *a, int dim, int descending, int64_t k)
{
    dp_tensor *m = NULL, *im = NULL, *ik = NULL;
    dp_status st;
    if (!(st = rows_along(&m, a, dim, a->dtype)) && !(st = tensor_new(&im, 2, m->shape, DP_INT64, a->device)) &&
        !(st = dp_tensor_numel(m) ? k_argsort(im, m, descending) : DP_OK) && !(st = dp_narrow(&ik, im, 1, 0, k)))
        st = unrows(idx, ik, a, dim);
    dp_tensor_release(m);
    dp_tensor_release(im);
    dp_tensor_release(ik);
    return st;
}

/* values and indices of the first k in sorted order along dim; the
 * values' gradient goes back to the indices (gather's backward). */
static dp_status select_sorted(dp_tensor **values, dp_tensor **indices, dp_tensor *a, int dim, int descending,
                               int64_t k, const char *grad_name)
{
    int was = dp_set_grad_enabled(0);
    dp_tensor *idx = NULL;
    dp_status st = sorted_positions(&idx, a, dim, descending, k);
    *values = NULL;
    if (!st && !(st = tensor_new(values, idx->ndim, idx->shape, a->dtype, a->device)) && dp_tensor_numel(idx))
        st = a->ndim ? k_gather(*values, a, dim, idx) : k_copy(*values, a);
    dp_set_grad_enabled(was);
    if (st) {
        dp_tensor_release(idx);
        dp_tensor_release(*values);
        return st;
    }
    *indices = idx;
    ag_node *n;
    if ((st = ag_record_or_drop(values, grad_name, a->ndim ? bw_gather : bw_identity, 1, &a, &n)) || !n) {
        if (st)
            dp_tensor_release(*indices);
        return st;
    }
    ag_save(n, idx);
    n->iarg[0] = dim;
    return DP_OK;
}

dp_status dp_sort(dp_tensor **values, dp_tensor **indices, dp_tensor *a, int dim, int descending)
{
    dp_status st = dim_check("sort", &dim, a->ndim);
    if (st)
        return st;
    return select_sorted(values, indices, a, dim, descending, a->ndim ? a->shape[dim] : 1, "SortBackward0");
}

dp_status dp_topk(dp_tensor **values, dp_tensor **indices, dp_tensor *a, int64_t k, int dim, int largest)
{
    dp_status st = dim_check("topk", &dim, a->ndim);
    if (st)
        return st;
    int64_t size = a->ndim ? a->shape[dim] : 1;
    if (k < 0 || k > size)
        return dp_fail(DP_ERR_INDEX, "topk: k (%lld) is out of range for dim %d of size %lld (expected 0 <= k <= "
                       "%lld)", (long long)k, dim, (long long)size, (long long)size);
    return select_sorted(values, indices, a, dim, largest, k, "TopkBackward0");
}

/* ---------------------------------------------------------------- cumsum */

/* The running sums along dim (from the end with reverse), in the
 * result dtype: a float's own, int64 for the others. Recording off. */
static dp_status cumsum_run(dp_tensor **out, dp_tensor *a, int dim, int reverse)
{
    int dtype = dp_dtype_is_floating(a->dtype) ? a->dtype : DP_INT64;
    int was = dp_set_grad_enabled(0);
    dp_tensor *m = NULL, *om = NULL;
    dp_status st;
    if (!(st = rows_along(&m, a, dim, dtype)) && !(st = tensor_new(&om, 2, m->shape, dtype, a->device)) &&
        !(st = dp_tensor_numel(m) ? k_cumsum(om, m, reverse) : DP_OK))
        st = unrows(out, om, a, dim);
    dp_set_grad_enabled(was);
    dp_tensor_release(m);
    dp_tensor_release(om);
    return st;
}

/* the gradient of a cumsum is the running sum of g from the end */
static dp_status bw_cumsum(ag_node *n, dp_tensor *g, dp_tensor **gi)
{
    if (!n->in[0].needs_grad)
        return DP_OK;
    dp_tensor *r;
    dp_status st = cumsum_run(&r, g, (int)n->iarg[0], 1);
    if (st)
        return st;
    st = ag_sum_to(&gi[0], r, &n->in[0]);
    dp_tensor_release(r);
    return st;
}

dp_status dp_cumsum(dp_tensor **out, dp_tensor *a, int dim)
{
    dp_status st = dim_check("cumsum", &dim, a->ndim);
    if (st || (st = cumsum_run(out, a, dim, 0)))
        return st;
    ag_node *n;
    if ((st = ag_record_or_drop(out, "CumsumBackward0", bw_cumsum, 1, &a, &n)) || !n)
        return st;
    n->iarg[0] = dim;
    return DP_OK;
}

/* ---------------------------------------------------------------- multinomial */

/* PyTorch's checks of the probabilities, made on a host copy: finite and
 * non-negative, each row with a positive sum and, without replacement,
 * at least num_samples categories of non-zero probability. */
static dp_status check_probs(dp_tensor *p2, int64_t num_samples, int replacement)
{
    dp_tensor *h;
    dp_status st = dp_to(&h, p2, DP_FLOAT64, DP_CPU);
    if (st)
        return st;
    int64_t rows = h->shape[0], n = h->shape[1];
    const double *p = (const double *)tensor_ptr(h);
    for (int64_t r = 0; r < rows && !st; r++) {
        double sum = 0;
        int64_t positive = 0;
        for (int64_t j = 0; j < n; j++) {
            double v = p[r * n + j];
            if (!(v >= 0) || isinf(v)) {
                st = dp_fail(DP_ERR_ARG, "multinomial: the probabilities must be finite and non-negative, got %g "
                             "in row %lld", v, (long long)r);
                break;
            }
            sum += v;
            positive += v > 0;
        }
        if (!st && sum <= 0)
            st = dp_fail(DP_ERR_ARG, "multinomial: the probabilities of row %lld sum to 0 (expected a positive "
                         "sum)", (long long)r);
        else if (!st && !replacement && positive < num_samples)
            st = dp_fail(DP_ERR_ARG, "multinomial: row %lld has %lld categories of non-zero probability, too few "
                         "to draw %lld samples without replacement", (long long)r, (long long)positive,
                         (long long)num_samples);
    }
    dp_tensor_release(h);
    return st;
}

/* With replacement: each sample is a uniform number searched in the
 * row's running sums (cpu_multinomial). Without: each category gets the
 * key log(u) / p of a uniform u, and the num_samples largest keys are
 * the draws, in order: the Efraimidis-Spirakis scheme, which draws as
 * taking one category at a time in proportion to p and removing it. */
static dp_status multinomial_run(dp_tensor **out, dp_tensor *p2, int64_t k, int replacement)
{
    int64_t rows = p2->shape[0], n = p2->shape[1], shape[2] = { rows, replacement ? k : n };
    dp_tensor *u = NULL, *cdf = NULL, *lu = NULL, *keys = NULL;
    dp_status st = dp_rand(&u, 2, shape, DP_FLOAT64, p2->device);
    if (st)
        return st;
    if (replacement) {
        shape[1] = k;
        if (!(st = cumsum_run(&cdf, p2, 1, 0)) && !(st = tensor_new(out, 2, shape, DP_INT64, p2->device)) &&
            (st = k_multinomial(*out, cdf, u)))
            dp_tensor_release(*out);
    } else if (!(st = dp_unary(&lu, DP_LOG, u)) && !(st = dp_binary(&keys, DP_DIV, lu, p2))) {
        st = sorted_positions(out, keys, 1, 1, k);
    }
    dp_tensor_release(u);
    dp_tensor_release(cdf);
    dp_tensor_release(lu);
    dp_tensor_release(keys);
    return st;
}

dp_status dp_multinomial(dp_tensor **out, dp_tensor *probs, int64_t num_samples, int replacement)
{
    if (probs->ndim != 1 && probs->ndim != 2)
        return dp_fail(DP_ERR_SHAPE, "multinomial: expected probabilities of 1 or 2 dims, got %d", probs->ndim);
    if (!dp_dtype_is_floating(probs->dtype))
        return dp_fail(DP_ERR_DTYPE, "multinomial: expected a floating point probability tensor, got %s",
                       dp_dtype_name(probs->dtype));
    int64_t n = probs->shape[probs->ndim - 1];
    if (n == 0)
        return dp_fail(DP_ERR_SHAPE, "multinomial: expected at least one category, got none");
    if (num_samples <= 0)
        return dp_fail(DP_ERR_ARG, "multinomial: expected num_samples > 0, got %lld", (long long)num_samples);
    if (!replacement && num_samples > n)
        return dp_fail(DP_ERR_ARG, "multinomial: cannot draw num_samples=%lld > %lld categories without "
                       "replacement (pass replacement=true)", (long long)num_samples, (long long)n);
    int64_t shape[2] = { probs->ndim == 2 ? probs->shape[0] : 1, n };
    int was = dp_set_grad_enabled(0);
    dp_tensor *p = NULL, *p2 = NULL, *o2 = NULL;
    dp_status st;
    if (!(st = dp_to(&p, probs, DP_FLOAT64, probs->device)) && !(st = dp_reshape(&p2, p, 2, shape)) &&
        !(st = check_probs(p2, num_samples, replacement)) && !(st = multinomial_run(&o2, p2, num_samples, replacement)))
        st = probs->ndim == 2 ? dp_alias(out, o2) : dp_reshape(out, o2, 1, &num_samples);
    dp_set_grad_enabled(was);
    dp_tensor_release(p);
    dp_tensor_release(p2);
    dp_tensor_release(o2);
    return st;
}

/* ---------------------------------------------------------------- nonzero, put_ */

/* Its size depends on the data, so it is found on the host (a GPU
 * tensor is copied there and the result back). */
dp_status dp_nonzero(dp_tensor **out, dp_tensor *a)
{
    dp_tensor *h = NULL, *r = NULL;
    dp_status st = dp_to(&h, a, a->dtype, DP_CPU);
    if (st)
        return st;
    int64_t shape[2] = { cpu_count_nonzero(h), a->ndim };
    if (!(st = tensor_new(&r, 2, shape, DP_INT64, DP_CPU))) {
        cpu_nonzero(r, h);
        st = dp_to(out, r, DP_INT64, a->device);
    }
    dp_tensor_release(h);
    dp_tensor_release(r);
    return st;
}

dp_status dp_put_into(dp_tensor *dst, dp_tensor *index, dp_tensor *src)
{
    dp_status st;
    if (index->dtype != DP_INT64 && index->dtype != DP_INT32)
        return dp_fail(DP_ERR_DTYPE, "put_: expected an int64 index tensor, got %s", dp_dtype_name(index->dtype));
    if (dp_tensor_numel(src) != dp_tensor_numel(index))
        return dp_fail(DP_ERR_SHAPE, "put_: expected source to have as many elements as index (%lld), got %lld",
                       (long long)dp_tensor_numel(index), (long long)dp_tensor_numel(src));
    if (dst->device != src->device || dst->device != index->device)
        return dp_fail(DP_ERR_DEVICE, "put_: expected self, index and source to be on the same device");
    for (int d = 0; d < dst->ndim && dp_tensor_numel(dst) > 1; d++)
        if (dst->stride[d] == 0 && dst->shape[d] > 1)
            return dp_fail(DP_ERR_ARG, "put_: more than one element of the written-to tensor refers to a single "
                           "memory location (an expanded view): write into a clone() of it");
    if ((st = ag_check_inplace("put_", dst)))
        return st;
    if (dp_tensor_numel(index) == 0)
        return DP_OK;
    int was = dp_set_grad_enabled(0);
    dp_tensor *s = NULL, *sc = NULL;
    if (!(st = dp_to(&s, src, dst->dtype, dst->device)) && !(st = dp_contiguous(&sc, s)))
        st = k_put(dst, index, sc);
    dp_set_grad_enabled(was);
    dp_tensor_release(s);
    dp_tensor_release(sc);
    return st;
}
