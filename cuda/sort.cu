/*
 * sort.cu — the row kernels of sort, topk, cumsum and multinomial on the
 * GPU, behind dpc_ops.h. src/core/select.c hands them contiguous (rows,
 * n) matrices whose rows are the lines along the op's dim, as it hands
 * them to src/cpu/sort.c, and they give the CPU's results:
 *
 * - argsort: one block a row sorts the row's positions with a bitonic
 *   network in global memory (a scratch row of the next power of two),
 *   ordering by key, then by position, so that the order is the stable
 *   one of the CPU's merge sort. topk is this sort's first k: simple, and
 *   at 50,304 columns a row costs 136 passes over 64K positions.
 * - cumsum: one thread a row adds along it in the CPU's order (double
 *   for floats, int64 for integers), so the sums are the CPU's bits.
 * - multinomial: one thread a sample searches its row's running sums
 *   (common/search.h).
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <cuda_runtime.h>

#include "common/dplua_codes.h"
#include "common/dtype_conv.h"
#include "common/search.h"
#include "dpc_ops.h"
#include "launch.cuh"

#define SORT_MAX_THREADS 1024
#define SORT_MAX_BLOCKS 4096
#define ROW_BLOCK 256

/* ------------------------------------------------------------------------ */
/* argsort                                                                   */
/* ------------------------------------------------------------------------ */

namespace {   /* file-local types: no clash with another file's of the same name */
/* The order of a row's positions: by key (NaN above every number; int64
 * exactly), ties by position; positions past the row's end (the
 * network's padding) after all of them. */
struct row_order {
    const char *row;
    int dtype;
    int descending;
    int64_t n;
    int64_t es;

    __device__ int compare_keys(int64_t x, int64_t y) const
    {
        if (dtype == DP_INT64) {
            int64_t a = ((const int64_t *)row)[x], b = ((const int64_t *)row)[y];
            return (a > b) - (a < b);
        }
        double a = dt_load(dtype, row + x * es), b = dt_load(dtype, row + y * es);
        bool an = a != a, bn = b != b;
        if (an || bn)
            return (int)an - (int)bn;
        return (a > b) - (a < b);
    }

    __device__ bool before(int64_t x, int64_t y) const
    {
        if (x >= n || y >= n)
            return x < y;
        int c = compare_keys(x, y);
        if (c != 0)
            return descending ? c > 0 : c < 0;
        return x < y;
    }
};
}  // namespace

__global__ static void argsort_kernel(int dtype, int64_t rows, int64_t n, int64_t width, const char *a, int descending,
                                      int64_t *indices, int64_t *scratch)
{
    begin_after_previous_kernel();
    const int64_t es = (int64_t)dt_size(dtype);
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        int64_t *buf = scratch + r * width;
        const row_order order = { a + r * n * es, dtype, descending, n, es };
        for (int64_t i = threadIdx.x; i < width; i += blockDim.x)
            buf[i] = i;
        __syncthreads();
        for (int64_t k = 2; k <= width; k <<= 1) {
            for (int64_t j = k >> 1; j > 0; j >>= 1) {
                for (int64_t i = threadIdx.x; i < width; i += blockDim.x) {
                    int64_t l = i ^ j;
                    if (l <= i)
                        continue;
                    int64_t x = buf[i], y = buf[l];
                    bool ascending_pair = (i & k) == 0;
                    if (ascending_pair ? order.before(y, x) : order.before(x, y)) {
                        buf[i] = y;
                        buf[l] = x;
                    }
                }
                __syncthreads();
            }
        }
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
            indices[r * n + i] = buf[i];
        __syncthreads();
    }
}

extern "C" int64_t dpc_argsort_width(int64_t n)
{
    int64_t w = 1;
    while (w < n)
        w <<= 1;
    return w;
}

extern "C" int dpc_argsort(int dtype, int64_t rows, int64_t n, const void *a, int descending, int64_t *indices,
                           int64_t *scratch, void *stream)
{
    if (dt_size(dtype) == 0)
        return DPC_UNSUPPORTED;
    if (rows < 0 || n < 0)
        return (int)cudaErrorInvalidValue;
    if (rows == 0 || n == 0)
        return 0;
    int64_t width = dpc_argsort_width(n);
    unsigned threads = width >= SORT_MAX_THREADS ? SORT_MAX_THREADS : width < 32 ? 32 : (unsigned)width;
    unsigned blocks = rows > SORT_MAX_BLOCKS ? SORT_MAX_BLOCKS : (unsigned)rows;
    return launch_kernel(argsort_kernel, blocks, threads, (cudaStream_t)stream, dtype, rows, n, width,
                         (const char *)a, descending, indices, scratch);
}

/* ------------------------------------------------------------------------ */
/* cumsum                                                                    */
/* ------------------------------------------------------------------------ */

__global__ static void cumsum_kernel(int dtype, int64_t rows, int64_t n, const char *a, char *out, int reverse)
{
    begin_after_previous_kernel();
    const int64_t es = (int64_t)dt_size(dtype);
    const bool is_int = !(dtype == DP_FLOAT32 || dtype == DP_FLOAT64 || dtype == DP_BFLOAT16);
    grid_stride_loop(rows, [&](int64_t r) {
        double f = 0;
        uint64_t i = 0;
        for (int64_t s = 0; s < n; s++) {
            int64_t j = r * n + (reverse ? n - 1 - s : s);
            if (is_int) {
                i += (uint64_t)((const int64_t *)a)[j];
                ((int64_t *)out)[j] = (int64_t)i;
            } else {
                f += dt_load(dtype, a + j * es);
                dt_store(dtype, out + j * es, f);
            }
        }
    });
}

/* floats of any width, or int64 (select.c sums integers as int64) */
extern "C" int dpc_cumsum(int dtype, int64_t rows, int64_t n, const void *a, void *out, int reverse, void *stream)
{
    if (dtype != DP_FLOAT32 && dtype != DP_FLOAT64 && dtype != DP_BFLOAT16 && dtype != DP_INT64)
        return DPC_UNSUPPORTED;
    if (rows < 0 || n < 0)
        return (int)cudaErrorInvalidValue;
    if (rows == 0 || n == 0)
        return 0;
    return launch_kernel(cumsum_kernel, grid_stride_blocks(rows, ROW_BLOCK), ROW_BLOCK, (cudaStream_t)stream, dtype,
                         rows, n, (const char *)a, (char *)out, reverse);
}

/* ------------------------------------------------------------------------ */
/* multinomial                                                               */
/* ------------------------------------------------------------------------ */

__global__ static void multinomial_kernel(int64_t rows, int64_t n, int64_t k, const double *cdf, const double *u,
                                          int64_t *out)
{
    begin_after_previous_kernel();
    grid_stride_loop(rows * k, [&](int64_t e) {
        const double *row = cdf + (e / k) * n;
        out[e] = cdf_search(row, n, u[e] * row[n - 1]);
    });
}

extern "C" int dpc_multinomial(int64_t rows, int64_t n, int64_t k, const double *cdf, const double *u, int64_t *out,
                               void *stream)
{
    if (rows < 0 || n <= 0 || k < 0)
        return (int)cudaErrorInvalidValue;
    if (rows == 0 || k == 0)
        return 0;
    return launch_kernel(multinomial_kernel, grid_stride_blocks(rows * k, ROW_BLOCK), ROW_BLOCK, (cudaStream_t)stream,
                         rows, n, k, cdf, u, out);
}
