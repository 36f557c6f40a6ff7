/*
 * memory.cu — device memory and device selection, behind dpc_ops.h.
 *
 * Allocations are stream-ordered (cudaMallocAsync) from each device's
 * default memory pool. A pool normally hands freed memory back to the
 * driver at every synchronisation; its release threshold is raised to
 * UINT64_MAX the first time a device is used here, so that freed blocks
 * stay cached and a training step that frees and reallocates the same
 * sizes costs no driver calls (what PyTorch's caching allocator buys).
 *
 * Calls that name a device make it current for their duration and put the
 * caller's current device back, so that none of them changes which device
 * later calls default to (only dpc_set_device does that).
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <stdint.h>

#include <atomic>

#include <cuda_runtime.h>

#include "dpc_ops.h"

/* Devices whose pools are remembered as set up; a device past this is set
 * up on every allocation instead, which is only slower. */
#define DPC_MAX_DEVICES 64

static std::atomic<bool> pool_ready[DPC_MAX_DEVICES];

/* A failed runtime call also records its error as the thread's "last
 * error"; clear it, so that the next kernel launcher's cudaGetLastError()
 * does not report it a second time as its own. */
static int status(cudaError_t err)
{
    if (err != cudaSuccess)
        (void)cudaGetLastError();
    return (int)err;
}

/* Makes `device` current until the guard goes out of scope. */
namespace {   /* file-local types: no clash with another file's of the same name */
struct device_guard {
    int prev = -1, want;
    cudaError_t err;
    explicit device_guard(int device) : want(device)
    {
        err = cudaGetDevice(&prev);
        if (err == cudaSuccess && prev != want)
            err = cudaSetDevice(want);
    }
    ~device_guard()
    {
        if (err == cudaSuccess && prev != want)
            (void)cudaSetDevice(prev);
    }
    device_guard(const device_guard &) = delete;
    device_guard &operator=(const device_guard &) = delete;
};
}  // namespace

/* Raises the release threshold of device's default pool, once. Setting it
 * twice (two threads racing on first use) is harmless. */
static cudaError_t pool_setup(int device)
{
    if (device >= 0 && device < DPC_MAX_DEVICES && pool_ready[device].load(std::memory_order_acquire))
        return cudaSuccess;
    cudaMemPool_t pool;
    cudaError_t err = cudaDeviceGetDefaultMemPool(&pool, device);
    if (err != cudaSuccess)
        return err;
    uint64_t threshold = UINT64_MAX;
    err = cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold);
    if (err == cudaSuccess && device >= 0 && device < DPC_MAX_DEVICES)
        pool_ready[device].store(true, std::memory_order_release);
    return err;
}

/* ------------------------------------------------------------------------ */
/* allocation                                                                */
/* ------------------------------------------------------------------------ */

/* cudaMallocAsync takes memory from the pool of the stream's device; with
 * the legacy default stream (NULL) that is the current device, hence the
 * guard. A request for 0 bytes gives NULL, which dpc_free accepts. */
extern "C" int dpc_malloc(void **ptr, size_t bytes, int device, void *stream)
{
    *ptr = NULL;
    if (bytes == 0)
        return 0;
    device_guard guard(device);
    if (guard.err != cudaSuccess)
        return status(guard.err);
    cudaError_t err = pool_setup(device);
    if (err == cudaSuccess)
        err = cudaMallocAsync(ptr, bytes, (cudaStream_t)stream);
    if (err != cudaSuccess)
        *ptr = NULL;
    return status(err);
}

/* The block returns to the pool once the work queued on `stream` before
 * this call is done; work on other streams that still uses it must be
 * ordered before this point by the caller. */
extern "C" int dpc_free(void *ptr, int device, void *stream)
{
    if (ptr == NULL)
        return 0;
    device_guard guard(device);
    if (guard.err != cudaSuccess)
        return status(guard.err);
    return status(cudaFreeAsync(ptr, (cudaStream_t)stream));
}

/* Copies to the host wait for the data. Copies from the host wait too: the
 * host buffer is usually pageable memory that the caller may free or reuse
 * as soon as this returns. Device-to-device copies stay asynchronous. */
extern "C" int dpc_memcpy(void *dst, const void *src, size_t bytes, int kind, void *stream)
{
    static const cudaMemcpyKind kinds[3] = { cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost,
                                             cudaMemcpyDeviceToDevice };
    if (kind < 0 || kind > 2)
        return (int)cudaErrorInvalidValue;
    if (bytes == 0)
        return 0;
    if (dst == NULL || src == NULL)
        return (int)cudaErrorInvalidValue;
    cudaStream_t s = (cudaStream_t)stream;
    cudaError_t err = cudaMemcpyAsync(dst, src, bytes, kinds[kind], s);
    if (err == cudaSuccess && kind != 2)
        err = cudaStreamSynchronize(s);
    return status(err);
}

/* ------------------------------------------------------------------------ */
/* devices                                                                   */
/* ------------------------------------------------------------------------ */

extern "C" int dpc_set_device(int device)
{
    return status(cudaSetDevice(device));
}

extern "C" int dpc_get_device(int *device)
{
    *device = 0;
    return status(cudaGetDevice(device));
}

extern "C" int dpc_synchronize(int device)
{
    device_guard guard(device);
    if (guard.err != cudaSuccess)
        return status(guard.err);
    return status(cudaDeviceSynchronize());
}

extern "C" int dpc_mem_info(int device, size_t *free_bytes, size_t *total_bytes)
{
    *free_bytes = 0;
    *total_bytes = 0;
    device_guard guard(device);
    if (guard.err != cudaSuccess)
        return status(guard.err);
    return status(cudaMemGetInfo(free_bytes, total_bytes));
}
