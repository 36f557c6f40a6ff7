/*
 * index.cu — index_select, index_add, gather, scatter_add, scatter, put_ and
 * im2col on the GPU, behind dpc_ops.h.
 *
 * Every kernel gives one thread to one element of the larger side (the
 * output of a select, the source of an add, one column entry of im2col)
 * and works out the other side's position from it; accumulations into a
 * position that several threads reach (scatter_add, the fold of
 * overlapping windows) are atomicAdd, so their sums may round differently
 * from the CPU's fixed order. index_add (index_select's backward, and so
 * an Embedding's) sorts its indices instead and adds in a fixed order.
 *
 * An index outside its dimension never becomes an access outside the
 * tensor: index_select, gather, scatter_add and scatter report it through the
 * kernel error block (dpc_ops.h), put_ too (skipping it), and index_add skips it (its indices are
 * those of an index_select that was checked).
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cub/device/device_radix_sort.cuh>

#include "dpc_ops.h"
#include "common/dtype_conv.h"
#include "common/dplua_codes.h"
#include "kernel_error.cuh"
#include "launch.cuh"

#define INDEX_BLOCK 256

static unsigned grid_for(int64_t n)
{
    return grid_stride_blocks(n, INDEX_BLOCK);
}

/* Calls fn(T()) for the element type of a floating dtype. */
template <class Fn> static int with_fold_type(int dtype, Fn fn)
{
    switch (dtype) {
    case DP_FLOAT32: return fn(float());
    case DP_FLOAT64: return fn(double());
    case DP_BFLOAT16: return fn(__nv_bfloat16());
    }
    return DPC_UNSUPPORTED;
}

/* Calls fn(T()) for an unsigned type of the dtype's element size: copies
 * (select, gather) move elements as they are. DPC_UNSUPPORTED for a code
 * that is not a dtype. */
template <class Fn> static int with_element_bits(int dtype, Fn fn)
{
    switch (dt_size(dtype)) {
    case 1: return fn(uint8_t());
    case 2: return fn(uint16_t());
    case 4: return fn(uint32_t());
    case 8: return fn(uint64_t());
    }
    return DPC_UNSUPPORTED;
}

static bool fold_type_ok(int dtype)
{
    return dtype == DP_FLOAT32 || dtype == DP_FLOAT64 || dtype == DP_BFLOAT16;
}

/* The elements of index_select's output (index_add's source): -1 for a
 * negative size, 0 when there is nothing to do. */
static int64_t index_total(int64_t outer, int64_t size, int64_t inner, int64_t n)
{
    if (outer < 0 || size < 0 || inner < 0 || n < 0)
        return -1;
    return outer * n * inner;
}

/* ------------------------------------------------------------------------ */
/* index_select                                                              */
/* ------------------------------------------------------------------------ */

/* a is (outer, size, inner), out is (outer, n, inner), index is (n,).
 * A select copies elements as they are, so T is only an element size. */
template <typename T>
__global__ static void index_select_kernel(int64_t outer, int64_t size, int64_t inner, const T *a,
                                           const int64_t *index, int64_t n, T *out, dpc_kernel_error *err)
{
    begin_after_previous_kernel();
    grid_stride_loop(outer * n * inner, [&](int64_t e) {
        int64_t j = e % inner, i = (e / inner) % n, o = e / (inner * n);
        int64_t v = index[i];
        if (v < 0 || v >= size) {
            kernel_error(err, DPC_KERR_INDEX_SELECT, v, size);
            return;
        }
        out[e] = a[(o * size + v) * inner + j];
    });
}

/* Any dtype: the copy moves 1, 2, 4 or 8 bytes per element. Positions of
 * out whose index is bad are left as they were. */
extern "C" int dpc_index_select(int dtype, int64_t outer, int64_t size, int64_t inner, const void *a,
                                const int64_t *index, int64_t n, void *out, dpc_kernel_error *err, void *stream)
{
    int64_t total = index_total(outer, size, inner, n);
    if (dt_size(dtype) == 0)
        return DPC_UNSUPPORTED;
    if (total <= 0)
        return total < 0 ? (int)cudaErrorInvalidValue : 0;
    return with_element_bits(dtype, [&](auto zero) {
        using T = decltype(zero);
        return launch_kernel(index_select_kernel<T>, grid_for(total), INDEX_BLOCK, (cudaStream_t)stream, outer, size,
                             inner, (const T *)a, index, n, (T *)out, err);
    });
}

/* ------------------------------------------------------------------------ */
/* index_add                                                                 */
/* ------------------------------------------------------------------------ */

/* index_add in a fixed order, so that two runs give the same bits (an
 * atomicAdd per element adds a repeated index's rows in whatever order
 * the threads come, and rounds bfloat16 at every add): the indices are
 * sorted once with their positions (CUB's radix sort, stable: a repeated
 * index keeps its positions in order), then the first thread of each run
 * of one index adds the run's rows of src in that order, in float (double
 * for float64), and adds the sum to out once. An index outside [0, size)
 * sorts as `size` and is skipped (those are an index_select's indices,
 * checked there). */

/* keys: each index, or size when it is out of range; pos: 0 .. n-1 */
__global__ static void index_keys_kernel(const int64_t *index, int64_t n, int64_t size, int64_t *keys, int64_t *pos)
{
    begin_after_previous_kernel();
    grid_stride_loop(n, [&](int64_t i) {
        const int64_t v = index[i];
        keys[i] = v >= 0 && v < size ? v : size;
        pos[i] = i;
    });
}

template <typename T> struct add_type { typedef float type; };
template <> struct add_type<double> { typedef double type; };

/* out is (outer, size, inner), src is (outer, n, inner); keys (sorted) and
 * pos (their positions in the index) are (n,). One thread per element of
 * src as sorted; the first of each run does the run's sum. */
template <typename T>
__global__ static void index_add_sorted_kernel(int64_t outer, int64_t size, int64_t inner, T *out,
                                               const int64_t *keys, const int64_t *pos, int64_t n, const T *src)
{
    begin_after_previous_kernel();
    typedef typename add_type<T>::type Acc;
    grid_stride_loop(outer * n * inner, [&](int64_t e) {
        const int64_t j = e % inner, s = (e / inner) % n, o = e / (inner * n), v = keys[s];
        if (v >= size || (s > 0 && keys[s - 1] == v))
            return;
        Acc sum = 0;
        for (int64_t r = s; r < n && keys[r] == v; r++)
            sum += (Acc)src[(o * n + pos[r]) * inner + j];
        T *at = &out[(o * size + v) * inner + j];
        *at = (T)((Acc)*at + sum);
    });
}

/* The number of bits that hold 0 .. size (the sort looks at no others). */
static int index_key_bits(int64_t size)
{
    int bits = 1;
    while (bits < 63 && (size >> bits) != 0)
        bits++;
    return bits;
}

/* The workspace's parts, each on 256 bytes: keys and positions, before
 * and after the sort, then CUB's own. */
static size_t index_part_bytes(int64_t n)
{
    return ((size_t)n * sizeof(int64_t) + 255) / 256 * 256;
}

extern "C" size_t dpc_index_add_workspace(int64_t n, int64_t size)
{
    if (n <= 0 || n > INT32_MAX || size < 0)
        return 0;
    size_t sort_bytes = 0;
    if (cub::DeviceRadixSort::SortPairs(NULL, sort_bytes, (const int64_t *)NULL, (int64_t *)NULL,
                                        (const int64_t *)NULL, (int64_t *)NULL, (int)n, 0, index_key_bits(size)) !=
        cudaSuccess)
        return 0;
    return 4 * index_part_bytes(n) + sort_bytes;
}

extern "C" int dpc_index_add(int dtype, int64_t outer, int64_t size, int64_t inner, void *out,
                             const int64_t *index, int64_t n, const void *src, void *workspace,
                             size_t workspace_bytes, void *stream)
{
    int64_t total = index_total(outer, size, inner, n);
    if (!fold_type_ok(dtype))
        return DPC_UNSUPPORTED;
    if (total <= 0)
        return total < 0 ? (int)cudaErrorInvalidValue : 0;
    if (n > INT32_MAX || workspace == NULL || workspace_bytes < dpc_index_add_workspace(n, size))
        return (int)cudaErrorInvalidValue;
    cudaStream_t s = (cudaStream_t)stream;
    const size_t part = index_part_bytes(n);
    char *w = (char *)workspace;
    int64_t *keys = (int64_t *)w, *pos = (int64_t *)(w + part), *sorted_keys = (int64_t *)(w + 2 * part),
            *sorted_pos = (int64_t *)(w + 3 * part);
    size_t sort_bytes = workspace_bytes - 4 * part;
    int rc = launch_kernel(index_keys_kernel, grid_for(n), INDEX_BLOCK, s, index, n, size, keys, pos);
    if (!rc)
        rc = (int)cub::DeviceRadixSort::SortPairs(w + 4 * part, sort_bytes, keys, sorted_keys, pos, sorted_pos, (int)n,
                                                  0, index_key_bits(size), s);
    if (rc)
        return rc;
    return with_fold_type(dtype, [&](auto zero) {
        using T = decltype(zero);
        return launch_kernel(index_add_sorted_kernel<T>, grid_for(total), INDEX_BLOCK, s, outer, size, inner, (T *)out,
                             (const int64_t *)sorted_keys, (const int64_t *)sorted_pos, n, (const T *)src);
    });
}

/* ------------------------------------------------------------------------ */
/* gather and scatter_add                                                    */
/* ------------------------------------------------------------------------ */

/* For position e of s (the index's shape): the offsets, in elements, of
 * that position in `whole` and `index`, and in `part` with dim left out
 * (the index supplies it). */
__device__ static inline void gather_offsets(const dpc_shape &s, int dim, int64_t e, const dpc_operand &whole,
                                             const dpc_operand &part, const dpc_operand &index, int64_t *ow,
                                             int64_t *op, int64_t *oi)
{
    *ow = *op = *oi = 0;
    for (int d = s.ndim - 1; d >= 0; d--) {
        int64_t c = e % s.shape[d];
        e /= s.shape[d];
        *oi += c * index.stride[d];
        *ow += c * whole.stride[d];
        if (d != dim)
            *op += c * part.stride[d];
    }
}

static int64_t shape_numel(const dpc_shape &s)
{
    int64_t n = 1;
    for (int d = 0; d < s.ndim; d++)
        n *= s.shape[d];
    return n;
}

/* The walk gather and scatter_add share, p over s (index's shape):
 * f(w, q) with w the element of `whole` at p and q the one of `part` at p
 * with dim replaced by index[p]. A bad index is reported as `what` (a
 * DPC_KERR_ code) and its p passed over. */
template <typename T, class F>
__device__ static inline void gather_walk(const dpc_shape &s, int64_t total, const dpc_operand &whole,
                                          const dpc_operand &part, const dpc_operand &index, int dim, int64_t size,
                                          int what, dpc_kernel_error *err, F f)
{
    grid_stride_loop(total, [&](int64_t e) {
        int64_t ow, op, oi;
        gather_offsets(s, dim, e, whole, part, index, &ow, &op, &oi);
        int64_t v = ((const int64_t *)index.data)[oi];
        if (v < 0 || v >= size) {
            kernel_error(err, what, v, size);
            return;
        }
        f((T *)whole.data + ow, (T *)part.data + op + v * part.stride[dim]);
    });
}

/* out[p] = a[p with dim replaced by index[p]], p over s (index's shape) */
template <typename T>
__global__ static void gather_kernel(dpc_shape s, int64_t total, dpc_operand out, dpc_operand a, dpc_operand index,
                                     int dim, int64_t size, dpc_kernel_error *err)
{
    begin_after_previous_kernel();
    gather_walk<T>(s, total, out, a, index, dim, size, DPC_KERR_GATHER, err, [](T *o, const T *x) { *o = *x; });
}

/* out[p with dim replaced by index[p]] += src[p], p over s, atomically */
template <typename T>
__global__ static void scatter_add_kernel(dpc_shape s, int64_t total, dpc_operand out, dpc_operand index,
                                          dpc_operand src, int dim, int64_t size, dpc_kernel_error *err)
{
    begin_after_previous_kernel();
    gather_walk<T>(s, total, src, out, index, dim, size, DPC_KERR_SCATTER_ADD, err,
                   [](const T *x, T *o) { atomicAdd(o, *x); });
}

/* out[p with dim replaced by index[p]] = src[p], p over s */
template <typename T>
__global__ static void scatter_kernel(dpc_shape s, int64_t total, dpc_operand out, dpc_operand index, dpc_operand src,
                                      int dim, int64_t size, dpc_kernel_error *err)
{
    begin_after_previous_kernel();
    gather_walk<T>(s, total, src, out, index, dim, size, DPC_KERR_SCATTER, err, [](const T *x, T *o) { *o = *x; });
}

extern "C" int dpc_gather(int dtype, dpc_shape s, dpc_operand out, dpc_operand a, dpc_operand index, int dim,
                          int64_t size, dpc_kernel_error *err, void *stream)
{
    int64_t total = shape_numel(s);
    if (dim < 0 || dim >= s.ndim)
        return (int)cudaErrorInvalidValue;
    if (total == 0)
        return 0;
    return with_element_bits(dtype, [&](auto zero) {
        return launch_kernel(gather_kernel<decltype(zero)>, grid_for(total), INDEX_BLOCK, (cudaStream_t)stream, s,
                             total, out, a, index, dim, size, err);
    });
}

extern "C" int dpc_scatter_add(int dtype, dpc_shape s, dpc_operand out, dpc_operand index, dpc_operand src,
                               int dim, int64_t size, dpc_kernel_error *err, void *stream)
{
    int64_t total = shape_numel(s);
    if (!fold_type_ok(dtype))
        return DPC_UNSUPPORTED;
    if (dim < 0 || dim >= s.ndim)
        return (int)cudaErrorInvalidValue;
    if (total == 0)
        return 0;
    cudaStream_t st = (cudaStream_t)stream;
    return with_fold_type(dtype, [&](auto zero) {
        return launch_kernel(scatter_add_kernel<decltype(zero)>, grid_for(total), INDEX_BLOCK, st, s, total, out, index,
                             src, dim, size, err);
    });
}

extern "C" int dpc_scatter(int dtype, dpc_shape s, dpc_operand out, dpc_operand index, dpc_operand src, int dim,
                           int64_t size, dpc_kernel_error *err, void *stream)
{
    int64_t total = shape_numel(s);
    if (dim < 0 || dim >= s.ndim)
        return (int)cudaErrorInvalidValue;
    if (total == 0)
        return 0;
    return with_element_bits(dtype, [&](auto zero) {
        return launch_kernel(scatter_kernel<decltype(zero)>, grid_for(total), INDEX_BLOCK, (cudaStream_t)stream, s,
                             total, out, index, src, dim, size, err);
    });
}

/* ------------------------------------------------------------------------ */
/* put_                                                                      */
/* ------------------------------------------------------------------------ */

/* dst[row-major position index[j]] = src[j]; one thread a j */
template <typename T>
__global__ static void put_kernel(dpc_shape s, int64_t numel, dpc_operand dst, const int64_t *index, int64_t n,
                                  const T *src, dpc_kernel_error *err)
{
    begin_after_previous_kernel();
    grid_stride_loop(n, [&](int64_t j) {
        int64_t v = index[j];
        if (v < -numel || v >= numel) {
            kernel_error(err, DPC_KERR_PUT, v, numel);
            return;
        }
        int64_t i = v < 0 ? v + numel : v, off = 0;
        for (int d = s.ndim - 1; d >= 0; d--) {
            off += (i % s.shape[d]) * dst.stride[d];
            i /= s.shape[d];
        }
        ((T *)dst.data)[off] = src[j];
    });
}

extern "C" int dpc_put(int dtype, dpc_shape s, dpc_operand dst, const int64_t *index, int64_t n, const void *src,
                       dpc_kernel_error *err, void *stream)
{
    if (n < 0)
        return (int)cudaErrorInvalidValue;
    if (n == 0)
        return 0;
    int64_t numel = shape_numel(s);
    return with_element_bits(dtype, [&](auto zero) {
        using T = decltype(zero);
        return launch_kernel(put_kernel<T>, grid_for(n), INDEX_BLOCK, (cudaStream_t)stream, s, numel, dst, index, n,
                             (const T *)src, err);
    });
}

/* ------------------------------------------------------------------------ */
/* im2col and its fold                                                       */
/* ------------------------------------------------------------------------ */

/* The geometry of one unfold, by value (the caller's arrays are host
 * memory). */
namespace {   /* file-local types: no clash with another file's of the same name */
struct unfold_geom {
    int64_t N, C, H, W;
    int64_t kh, kw, sh, sw, ph, pw, dh, dw;
    int64_t oh, ow;
};
}  // namespace

/* Where column entry e of cols (N, C*kh*kw, oh*ow) reads x (N, C, H, W):
 * the offset into x, or -1 when the window lies on the padding. The walk
 * of src/cpu/nn.c's im2col_walk, one entry at a time, in the index type I:
 * 32-bit where every offset fits (a 64-bit division costs a GPU tens of
 * instructions, and an entry takes eight of them). */
template <typename I>
__device__ static inline I unfold_source(const unfold_geom &g, I e)
{
    const I oh = (I)g.oh, ow = (I)g.ow, kh = (I)g.kh, kw = (I)g.kw, L = oh * ow, rows = (I)g.C * kh * kw;
    I pos = e % L, row = (e / L) % rows, n = e / (L * rows);
    I c = row / (kh * kw), i = (row / kw) % kh, j = row % kw;
    I h = (pos / ow) * (I)g.sh - (I)g.ph + i * (I)g.dh;
    I w = (pos % ow) * (I)g.sw - (I)g.pw + j * (I)g.dw;
    if (h < 0 || h >= (I)g.H || w < 0 || w >= (I)g.W)
        return -1;
    return ((n * (I)g.C + c) * (I)g.H + h) * (I)g.W + w;
}

template <typename T, typename I>
__global__ static void unfold_kernel(unfold_geom g, I total, const T *x, T *cols, T pad)
{
    begin_after_previous_kernel();
    const I stride = (I)(gridDim.x * blockDim.x);
    for (I e = (I)(blockIdx.x * blockDim.x + threadIdx.x); e < total; e += stride) {
        I at = unfold_source<I>(g, e);
        cols[e] = at < 0 ? pad : x[at];
    }
}

template <typename T, typename I>
__global__ static void fold_add_kernel(unfold_geom g, I total, T *x, const T *cols)
{
    begin_after_previous_kernel();
    const I stride = (I)(gridDim.x * blockDim.x);
    for (I e = (I)(blockIdx.x * blockDim.x + threadIdx.x); e < total; e += stride) {
        I at = unfold_source<I>(g, e);
        if (at >= 0)
            atomicAdd(&x[at], cols[e]);
    }
}

/* Fills g; returns the number of column entries, 0 when there is nothing
 * to do, -1 for a geometry that is not one. */
static int64_t unfold_setup(unfold_geom *g, int64_t N, int64_t C, int64_t H, int64_t W, const int64_t *kernel,
                            const int64_t *stride, const int64_t *padding, const int64_t *dilation, int64_t oh,
                            int64_t ow)
{
    *g = unfold_geom{ N, C, H, W, kernel[0], kernel[1], stride[0], stride[1], padding[0], padding[1],
                      dilation[0], dilation[1], oh, ow };
    if (N < 0 || C < 0 || H < 0 || W < 0 || oh < 0 || ow < 0 || g->kh < 0 || g->kw < 0)
        return -1;
    return N * C * g->kh * g->kw * oh * ow;
}

/* unfold (x into cols) or, with fold, its backward (cols added into x;
 * bfloat16 adds round at each atomic add, as the CPU's fold rounds at
 * each add, in another order). */
static int unfold_run(bool fold, int dtype, int64_t N, int64_t C, int64_t H, int64_t W, const int64_t *kernel,
                      const int64_t *stride, const int64_t *padding, const int64_t *dilation, int64_t oh, int64_t ow,
                      void *x, void *cols, double pad_value, cudaStream_t s)
{
    unfold_geom g;
    if (!fold_type_ok(dtype))
        return DPC_UNSUPPORTED;
    int64_t total = unfold_setup(&g, N, C, H, W, kernel, stride, padding, dilation, oh, ow);
    if (total <= 0)
        return total < 0 ? (int)cudaErrorInvalidValue : 0;
    /* 32-bit indices when every entry of cols and x, and the stride of the
     * grid's walk past the last, fit */
    const int64_t most = total > N * C * H * W ? total : N * C * H * W;
    const bool narrow = most + (int64_t)DPC_MAX_BLOCKS * INDEX_BLOCK < INT32_MAX;
    return with_fold_type(dtype, [&](auto zero) {
        using T = decltype(zero);
        if (fold && narrow)
            return launch_kernel(fold_add_kernel<T, int32_t>, grid_for(total), INDEX_BLOCK, s, g, (int32_t)total,
                                 (T *)x, (const T *)cols);
        if (fold)
            return launch_kernel(fold_add_kernel<T, int64_t>, grid_for(total), INDEX_BLOCK, s, g, total, (T *)x,
                                 (const T *)cols);
        if (narrow)
            return launch_kernel(unfold_kernel<T, int32_t>, grid_for(total), INDEX_BLOCK, s, g, (int32_t)total,
                                 (const T *)x, (T *)cols, (T)pad_value);
        return launch_kernel(unfold_kernel<T, int64_t>, grid_for(total), INDEX_BLOCK, s, g, total, (const T *)x,
                             (T *)cols, (T)pad_value);
    });
}

extern "C" int dpc_unfold(int dtype, int64_t N, int64_t C, int64_t H, int64_t W, const int64_t *kernel,
                          const int64_t *stride, const int64_t *padding, const int64_t *dilation, int64_t oh,
                          int64_t ow, const void *x, void *cols, double pad_value, void *stream)
{
    return unfold_run(false, dtype, N, C, H, W, kernel, stride, padding, dilation, oh, ow, (void *)x, cols,
                      pad_value, (cudaStream_t)stream);
}

extern "C" int dpc_fold_add(int dtype, int64_t N, int64_t C, int64_t H, int64_t W, const int64_t *kernel,
                            const int64_t *stride, const int64_t *padding, const int64_t *dilation, int64_t oh,
                            int64_t ow, void *x, const void *cols, void *stream)
{
    return unfold_run(true, dtype, N, C, H, W, kernel, stride, padding, dilation, oh, ow, x, (void *)cols, 0,
                      (cudaStream_t)stream);
}
