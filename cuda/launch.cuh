/*
 * launch.cuh — how every kernel of ours is launched: launch_kernel(), with
 * programmatic dependent launch (PDL) on devices that have it (sm_90 on).
 *
 * Why: a training step of small layers is a chain of short kernels, and
 * between two of them the GPU spends about a microsecond scheduling the
 * next grid after the last block of the one before has finished. With
 * PDL the next kernel's blocks are scheduled while the one before still
 * runs and wait on the device (griddepcontrol.wait) for it to finish and
 * for its writes to be visible: the same order, less of the gap. It holds
 * in CUDA graphs too, where the gaps are what a replayed step is made of.
 *
 * The contract: a kernel launched by launch_kernel() starts with
 * begin_after_previous_kernel(), before it reads or writes any memory
 * (or with its two halves apart: below).
 * Without that call it could run beside the kernel before it.
 * tests/sh/test_cuda_sources.sh checks every kernel of cuda/ for it.
 * Kernels of others (cuBLASLt's, NCCL's) and copies keep plain stream
 * order on either side of ours. PDL is always on where the device has it:
 * off, the seed step replayed from a CUDA graph takes 23% longer (12.2
 * against 9.9 us on an H100).
 */
#ifndef DPC_LAUNCH_CUH
#define DPC_LAUNCH_CUH

#include <stdint.h>

#include <cuda_runtime.h>

#include <tuple>
#include <utility>

#include "dpc_ops.h"   /* the kernel profile's launch hooks */

#define CEIL_DIV(a, b) (((a) + (b) - 1) / (b))

/* Past this many blocks a grid-stride loop does the rest: more blocks than
 * the GPU can hold at once only add scheduling work. */
#define DPC_MAX_BLOCKS 65536

/* The blocks of a grid-stride loop over n items, `per_block` of them to a
 * block: enough for one turn, at most DPC_MAX_BLOCKS (none for n = 0). */
static inline unsigned grid_stride_blocks(int64_t n, int64_t per_block)
{
    int64_t grid = CEIL_DIV(n, per_block);
    return (unsigned)(grid > DPC_MAX_BLOCKS ? DPC_MAX_BLOCKS : grid);
}

/* A thread's share of a grid-stride loop over 0 .. n-1, one index to a
 * thread a turn: body(i) for each of its indices. */
template <class Body>
__device__ __forceinline__ void grid_stride_loop(int64_t n, Body body)
{
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        body(i);
}

/* let_next_kernel_start lets the kernel after this one in the stream be
 * scheduled; wait_for_previous_kernel waits until the kernel before this
 * one has finished and its writes are visible. Both are no-ops when the
 * launch was not programmatic, and before sm_90. The first statement of
 * every kernel of ours is begin_after_previous_kernel, both in turn. */
__device__ __forceinline__ void let_next_kernel_start(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void wait_for_previous_kernel(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void begin_after_previous_kernel(void)
{
    let_next_kernel_start();
    wait_for_previous_kernel();
}
/* A kernel with work that touches no memory but its own shared memory
 * (copying its parameters there, index arithmetic) may instead begin
 * with let_next_kernel_start(), do that work while the kernel before it
 * still runs, and call wait_for_previous_kernel() before anything else. */

/* What the current device does of sm_90's that our kernels use (cuda/
 * device.cu; asked once per device): thread-block clusters and PDL.
 * Either needs our kernels built for sm_90 on. */
enum { DPC_CAN_CLUSTER = 1, DPC_CAN_PDL = 2 };
int dpc_device_can(void);

/* Launches kernel with its parameters' values at params[0 .. n - 1]
 * (cudaLaunchKernelExC's contract); a CUDA status, left for no later call
 * to find. */
template <typename... Params, size_t... I>
static inline int launch_values(const cudaLaunchConfig_t &config, void (*kernel)(Params...),
                                std::tuple<Params...> &values, std::index_sequence<I...>)
{
    void *params[] = { static_cast<void *>(&std::get<I>(values))..., NULL };
    const void *func = reinterpret_cast<const void *>(kernel);
    const int64_t token = dpc_profiling ? dpc_profile_before(config.stream, func, NULL) : 0;
    const int rc = (int)cudaLaunchKernelExC(&config, func, params);
    if (rc)
        (void)cudaGetLastError();
    if (token)
        dpc_profile_after(config.stream, token);
    return rc;
}

/* kernel<<<grid, block, smem, stream>>>(args...) with the launch
 * attributes `extra` (count of them, at most 3) and PDL where the device
 * has it; a CUDA status. */
template <typename... Params, typename... Args>
static inline int launch_kernel_smem(const cudaLaunchAttribute *extra, int count, size_t smem,
                                     void (*kernel)(Params...), dim3 grid, dim3 block, cudaStream_t stream,
                                     Args &&...args)
{
    cudaLaunchAttribute attrs[4];
    int n = 0;
    for (int i = 0; i < count && i < 3; i++)
        attrs[n++] = extra[i];
    if (dpc_device_can() & DPC_CAN_PDL) {
        attrs[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attrs[n++].val.programmaticStreamSerializationAllowed = 1;
    }
    cudaLaunchConfig_t config = {};
    config.gridDim = grid;
    config.blockDim = block;
    config.dynamicSmemBytes = smem;
    config.stream = stream;
    config.attrs = attrs;
    config.numAttrs = (unsigned)n;
    std::tuple<Params...> values(static_cast<Args &&>(args)...);   /* each converted to its parameter's type */
    return launch_values(config, kernel, values, std::index_sequence_for<Params...>{});
}

/* the same without dynamic shared memory */
template <typename... Params, typename... Args>
static inline int launch_kernel_with(const cudaLaunchAttribute *extra, int count, void (*kernel)(Params...),
                                     dim3 grid, dim3 block, cudaStream_t stream, Args &&...args)
{
    return launch_kernel_smem(extra, count, 0, kernel, grid, block, stream, static_cast<Args &&>(args)...);
}

template <typename... Params, typename... Args>
static inline int launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, cudaStream_t stream,
                                Args &&...args)
{
    return launch_kernel_with(NULL, 0, kernel, grid, block, stream, static_cast<Args &&>(args)...);
}

#endif /* DPC_LAUNCH_CUH */
