/*
 * index.c — index_select and gather on the CPU. Index values are checked
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

/* out[pos] = a[pos with dim replaced by index[pos]], over index's shape. */
dp_status cpu_gather(dp_tensor *out, dp_tensor *a, int dim, dp_tensor *index)
{
    int nd = index->ndim;
    int64_t total = dp_tensor_numel(index), idx[DP_MAX_DIMS] = { 0 };
    size_t es = dp_dtype_size(a->dtype);
    int64_t size = a->ndim ? a->shape[dim] : 1;
    for (int64_t e = 0; e < total; e++) {
        int64_t ioff = index->offset, aoff = a->offset, ooff = out->offset;
        for (int d = 0; d < nd; d++) {
            ioff += idx[d] * index->stride[d];
            ooff += idx[d] * out->stride[d];
            if (d != dim)
                aoff += idx[d] * a->stride[d];
        }
        const char *ip = (const char *)index->storage->data + ioff * (int64_t)dp_dtype_size(index->dtype);
        int64_t v = index->dtype == DP_INT64 ? *(const int64_t *)ip : *(const int32_t *)ip;
        if (v < 0 || v >= size)
            return bad_index("gather", v, dim, size);
        if (a->ndim)
            aoff += v * a->stride[dim];
        memcpy((char *)out->storage->data + ooff * (int64_t)es,
               (const char *)a->storage->data + aoff * (int64_t)es, es);
        for (int d = nd - 1; d >= 0; d--) {
            if (++idx[d] < index->shape[d])
                break;
            idx[d] = 0;
        }
    }
    return DP_OK;
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
    int nd = index->ndim;
    int64_t total = dp_tensor_numel(index), idx[DP_MAX_DIMS] = { 0 };
    for (int64_t e = 0; e < total; e++) {
        int64_t ioff = index->offset, ooff = out->offset, soff = src->offset;
        for (int d = 0; d < nd; d++) {
            ioff += idx[d] * index->stride[d];
            soff += idx[d] * src->stride[d];
            if (d != dim)
                ooff += idx[d] * out->stride[d];
        }
        const char *ip = (const char *)index->storage->data + ioff * (int64_t)dp_dtype_size(index->dtype);
        int64_t v = index->dtype == DP_INT64 ? *(const int64_t *)ip : *(const int32_t *)ip;
        if (out->ndim)
            ooff += v * out->stride[dim];
        size_t es = dp_dtype_size(out->dtype);
        char *op = (char *)out->storage->data + ooff * (int64_t)es;
        const char *sp = (const char *)src->storage->data + soff * (int64_t)dp_dtype_size(src->dtype);
        dtype_store(out->dtype, op, dtype_load(out->dtype, op) + dtype_load(src->dtype, sp));
        for (int d = nd - 1; d >= 0; d--) {
            if (++idx[d] < index->shape[d])
                break;
            idx[d] = 0;
        }
    }
    return DP_OK;
}
