/*
 * iter.cuh — the strided iterator of the cuda/ kernels: N operands walked
 * over one shape, size-1 dims dropped and dims merged where they are
 * contiguous for every operand (cpu_foreach's rule in src/cpu). Strides are
 * in bytes. Each including file gets its own copy (anonymous namespace).
 */
#ifndef DP_CUDA_ITER_CUH
#define DP_CUDA_ITER_CUH

#include "dpc_ops.h"

#include <stdint.h>
#include <string.h>

namespace {
template <int N> struct dpc_iter {
    int ndim;
    int64_t shape[DPC_MAX_DIMS];
    int64_t stride[N][DPC_MAX_DIMS];
    char *data[N];
};
}  // namespace

/* Builds the iterator over s for operands of element sizes es; returns the
 * number of elements (positions). */
template <int N>
static int64_t iter_build(dpc_iter<N> *it, const dpc_shape &s, const dpc_operand *ops, const size_t *es)
{
    int64_t numel = 1;
    memset(it, 0, sizeof *it);
    for (int k = 0; k < N; k++)
        it->data[k] = (char *)ops[k].data;
    int nd = 0;
    for (int i = 0; i < s.ndim; i++) {
        numel *= s.shape[i];
        if (s.shape[i] == 1)
            continue;
        bool merge = nd > 0;
        for (int k = 0; k < N && merge; k++)
            merge = it->stride[k][nd - 1] == ops[k].stride[i] * (int64_t)es[k] * s.shape[i];
        for (int k = 0; k < N; k++)
            it->stride[k][merge ? nd - 1 : nd] = ops[k].stride[i] * (int64_t)es[k];
        if (merge)
            it->shape[nd - 1] *= s.shape[i];
        else
            it->shape[nd++] = s.shape[i];
    }
    it->ndim = nd;
    return numel;
}

/* The operands' addresses at element (position) pos. */
template <int N> __device__ static inline void iter_ptrs(const dpc_iter<N> &it, int64_t pos, char **p)
{
#pragma unroll
    for (int k = 0; k < N; k++)
        p[k] = it.data[k];
    for (int d = it.ndim - 1; d >= 0; d--) {
        int64_t c = pos % it.shape[d];
        pos /= it.shape[d];
#pragma unroll
        for (int k = 0; k < N; k++)
            p[k] += c * it.stride[k][d];
    }
}

#endif
