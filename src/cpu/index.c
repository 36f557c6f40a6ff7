/*
 * index.c — index_select, gather and scatter on the CPU. Index values are checked
 * here, where they are read, so a bad index is an error and never a read
 * outside the tensor.
 */
#include "cpu/cpu.h"

#include <string.h>

static dp_status bad_index(const char *fn, int64_t v, int dim, int64_t size)
{
    return dp_fail(DP_ERR_INDEX, "%s: index %lld is out of bounds for dimension %d with size %lld",
                   fn, (long long)v, dim, (long long)size);
}

static int64_t index_at(const dp_tensor *index, int64_t i)
{
    const char *p = tensor_ptr(index) + i * index->stride[0] * (int64_t)dp_dtype_size(index->dtype);
    return index->dtype == DP_INT64 ? *(const int64_t *)p : *(const int32_t *)p;
}

/* out.select(dim, i) = a.select(dim, index[i]); index is 1-D (or 0-d). */
dp_status cpu_index_select(dp_tensor *out, dp_tensor *a, int dim, dp_tensor *index)
{
    int64_t n = dp_tensor_numel(index), size = a->ndim ? a->shape[dim] : 1;
    for (int64_t i = 0; i < n; i++) {
        int64_t v = index_at(index, i);
        if (v < 0 || v >= size)
            return bad_index("index_select", v, dim, size);
    }
    for (int64_t i = 0; i < n; i++) {
        int64_t v = index_at(index, i);
        if (a->ndim == 0)
            return cpu_copy(out, a);
        dp_tensor src = *a, dst = *out;
        /* views in place on the stack: same storage, no refcounts taken */
        src.shape[dim] = 1;
        src.offset = a->offset + v * a->stride[dim];
        dst.shape[dim] = 1;
        dst.offset = out->offset + i * out->stride[dim];
        dp_status st = cpu_copy(&dst, &src);
        if (st)
            return st;
    }
    return DP_OK;
}

/* gather, scatter_add and scatter walk the positions p of index's shape
 * alike: `at` (of index's shape) at p, and `moved` at p with dim replaced
 * by index[p]. gather copies moved's element to at's; scatter_add adds at's
 * element to moved's; scatter copies at's to moved's (the last of several
 * writes to one element wins). */
enum walk { WALK_GATHER, WALK_SCATTER_ADD, WALK_SCATTER };
static dp_status index_walk(const char *fn, enum walk mode, dp_tensor *at, dp_tensor *moved, int dim,
                            dp_tensor *index)
{
    int nd = index->ndim;
    int64_t total = dp_tensor_numel(index), idx[DP_MAX_DIMS] = { 0 };
    int64_t size = moved->ndim ? moved->shape[dim] : 1;
    for (int64_t e = 0; e < total; e++) {
        int64_t ioff = index->offset, aoff = at->offset, moff = moved->offset;
        for (int d = 0; d < nd; d++) {
            ioff += idx[d] * index->stride[d];
            aoff += idx[d] * at->stride[d];
            if (d != dim)
                moff += idx[d] * moved->stride[d];
        }
        const char *ip = (const char *)index->storage->data + ioff * (int64_t)dp_dtype_size(index->dtype);
        int64_t v = index->dtype == DP_INT64 ? *(const int64_t *)ip : *(const int32_t *)ip;
        if (v < 0 || v >= size)
            return bad_index(fn, v, dim, size);
        if (moved->ndim)
            moff += v * moved->stride[dim];
        char *ap = (char *)at->storage->data + aoff * (int64_t)dp_dtype_size(at->dtype);
        char *mp = (char *)moved->storage->data + moff * (int64_t)dp_dtype_size(moved->dtype);
        if (mode == WALK_SCATTER_ADD)
            dtype_store(moved->dtype, mp, dtype_load(moved->dtype, mp) + dtype_load(at->dtype, ap));
        else if (mode == WALK_SCATTER)
            memcpy(mp, ap, dp_dtype_size(at->dtype));
        else
            memcpy(ap, mp, dp_dtype_size(at->dtype));
        for (int d = nd - 1; d >= 0; d--) {
            if (++idx[d] < index->shape[d])
                break;
            idx[d] = 0;
        }
    }
    return DP_OK;
}

/* out[pos] = a[pos with dim replaced by index[pos]], over index's shape. */
dp_status cpu_gather(dp_tensor *out, dp_tensor *a, int dim, dp_tensor *index)
{
    return index_walk("gather", WALK_GATHER, out, a, dim, index);
}

/* ---------------------------------------------------------------- accumulation (backward) */

dp_status cpu_index_add(dp_tensor *out, int dim, dp_tensor *index, dp_tensor *src)
{
    int64_t n = dp_tensor_numel(index);
    for (int64_t i = 0; i < n; i++) {
        int64_t v = index_at(index, i);
        if (out->ndim == 0)
            return cpu_binary(DP_ADD, out, out, src);
        dp_tensor from = *src, to = *out;
        from.shape[dim] = 1;
        from.offset = src->offset + i * src->stride[dim];
        to.shape[dim] = 1;
        to.offset = out->offset + v * out->stride[dim];
        dp_status st = cpu_binary(DP_ADD, &to, &to, &from);
        if (st)
            return st;
    }
    return DP_OK;
}

dp_status cpu_scatter_add(dp_tensor *out, int dim, dp_tensor *index, dp_tensor *src)
{
    return index_walk("scatter_add", WALK_SCATTER_ADD, src, out, dim, index);
}

dp_status cpu_scatter(dp_tensor *out, int dim, dp_tensor *index, dp_tensor *src)
{
    return index_walk("scatter", WALK_SCATTER, src, out, dim, index);
}

/* ---------------------------------------------------------------- nonzero, put */

/* Runs body with p at each element of t, in row-major order, and coords
 * its coordinates. */
#define FOR_EACH_ELEMENT(t, p, coords, body)                                                      \
    do {                                                                                          \
        int64_t coords[DP_MAX_DIMS] = { 0 }, total_ = dp_tensor_numel(t);                         \
        for (int64_t e_ = 0; e_ < total_; e_++) {                                                 \
            int64_t off_ = (t)->offset;                                                           \
            for (int d_ = 0; d_ < (t)->ndim; d_++)                                                \
                off_ += coords[d_] * (t)->stride[d_];                                             \
            const char *p = (const char *)(t)->storage->data + off_ * (int64_t)dp_dtype_size((t)->dtype); \
            body;                                                                                 \
            for (int d_ = (t)->ndim - 1; d_ >= 0; d_--) {                                         \
                if (++coords[d_] < (t)->shape[d_])                                                \
                    break;                                                                        \
                coords[d_] = 0;                                                                   \
            }                                                                                     \
        }                                                                                         \
    } while (0)

/* (NaN is not zero, as in PyTorch) */
int64_t cpu_count_nonzero(dp_tensor *a)
{
    int64_t count = 0;
    FOR_EACH_ELEMENT(a, p, at, count += dtype_load(a->dtype, p) != 0);
    return count;
}

void cpu_nonzero(dp_tensor *out, dp_tensor *a)
{
    int64_t *o = (int64_t *)tensor_ptr(out);
    int nd = a->ndim;
    FOR_EACH_ELEMENT(a, p, at, {
        if (dtype_load(a->dtype, p) != 0) {
            memcpy(o, at, sizeof(int64_t) * (size_t)nd);
            o += nd;
        }
    });
}

/* The storage offset of dst's element at row-major position i. */
static int64_t flat_offset(const dp_tensor *t, int64_t i)
{
    int64_t off = t->offset;
    for (int d = t->ndim - 1; d >= 0; d--) {
        off += (i % t->shape[d]) * t->stride[d];
        i /= t->shape[d];
    }
    return off;
}

dp_status cpu_put(dp_tensor *dst, dp_tensor *index, dp_tensor *src)
{
    int64_t numel = dp_tensor_numel(dst);
    size_t es = dp_dtype_size(dst->dtype);
    for (int pass = 0; pass < 2; pass++) {
        int64_t j = 0;
        FOR_EACH_ELEMENT(index, p, at, {
            int64_t v = index->dtype == DP_INT64 ? *(const int64_t *)p : *(const int32_t *)p;
            if (v < -numel || v >= numel)
                return dp_fail(DP_ERR_INDEX, "put_: index %lld is out of bounds for a tensor of %lld elements",
                               (long long)v, (long long)numel);
            if (pass == 1)
                memcpy((char *)dst->storage->data + flat_offset(dst, v < 0 ? v + numel : v) * (int64_t)es,
                       tensor_ptr(src) + j * (int64_t)es, es);
            j++;
        });
    }
    return DP_OK;
}
