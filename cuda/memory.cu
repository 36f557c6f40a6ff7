/*
 * memory.cu — device memory and device selection, streams, events and
 * CUDA graphs, and the block where kernels leave errors; behind dpc_ops.h.
 *
 * Allocations are stream-ordered (cudaMallocAsync) from each device's
 * default memory pool. A pool normally hands freed memory back to the
 * driver at every synchronisation; its release threshold is raised to
 * UINT64_MAX the first time a device is used here, so that freed blocks
 * stay cached and a training step that frees and reallocates the same
 * sizes costs no driver calls (what PyTorch's caching allocator buys).
 *
 * In front of the pools, blocks of up to 1 MiB (and GEMM workspaces) that
 * are freed outside a capture are kept per size class and handed to the
 * next request of their class on the same device and stream (the
 * small-block cache below): a training step of a small model frees and
 * makes the same few tensors each time, and that saves a cudaMallocAsync
 * and cudaFreeAsync, each a driver call, per tensor.
 *
 * Calls that name a device make it current for their duration and put the
 * caller's current device back, so that none of them changes which device
 * later calls default to (only dpc_set_device does that).
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <stdint.h>
#include <stdlib.h>

#include <atomic>
#include <mutex>

#include <string.h>

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

/* Gives the pool's cached, unused memory back to the driver, after the
 * frees queued so far (device must be current). */
static cudaError_t trim_pool(int device)
{
    cudaMemPool_t pool;
    cudaError_t err = cudaDeviceSynchronize();
    if (err == cudaSuccess)
        err = cudaDeviceGetDefaultMemPool(&pool, device);
    if (err == cudaSuccess)
        err = cudaMemPoolTrimTo(pool, 0);
    return err;
}

/* ------------------------------------------------------------------------ */
/* the small-block cache                                                     */
/* ------------------------------------------------------------------------ */

/* Blocks are cached by size class (requests rounded up to CACHE_GRAIN
 * bytes), at most CACHE_CLASS_BYTES (and at least CACHE_MIN_DEPTH blocks)
 * per class and CACHE_MAX_BYTES in all, each with the device and stream
 * it was freed on. A class holds thousands of small blocks because Lua
 * frees tensors in bursts: its collector finds a few thousand steps'
 * worth of dead tensors at once (some 20000 in a loop of seed steps), and
 * every block the cache cannot keep then costs a cudaFreeAsync, and its
 * next request a cudaMallocAsync, a microsecond or two each.
 *
 * A block is only reused on the stream it was freed on, where the
 * stream's order makes the reuse as safe as the pool's own. While any
 * capture runs the cache is bypassed both ways: a graph must neither take
 * a block that eager work will reuse nor leave its own memory here. The
 * cached blocks go back to the pool on dpc_pool_trim (empty_cache),
 * before an out-of-memory retry, and when their stream is destroyed. */
#define CACHE_GRAIN 512
#define CACHE_CLASSES 2048   /* classes 1 .. 2048: blocks up to 1 MiB */
#define CACHE_WORKSPACE (CACHE_CLASSES + 1)   /* and one class for GEMM workspaces */
#define CACHE_CLASS_BYTES ((size_t)16 << 20)
#define CACHE_MIN_DEPTH 8
#define CACHE_SCAN 64
/* At most this much is held in the cache in all (the depth alone would
 * allow gigabytes over many classes); past it, freed blocks go back to the
 * pool. */
#define CACHE_MAX_BYTES ((size_t)256 << 20)

namespace {   /* file-local types: no clash with another file's of the same name */
struct cached_block {
    void *ptr, *stream;
    int device;
};
struct cache_class {
    size_t n, cap;
    cached_block *b;   /* grown as needed, never freed */
};
}  // namespace

static cache_class block_cache[CACHE_WORKSPACE + 1];   /* under cache_mutex */
static size_t cached_bytes;                            /* under cache_mutex */
static std::mutex cache_mutex;
static std::atomic<int> captures_running;

/* The class of a request, or 0 for sizes that are not cached. Requests
 * of a class are always given the class's whole size, captured or not, so
 * that any block of a class can serve any request of it. */
static size_t cache_class_of(size_t bytes)
{
    if (bytes == DPC_GEMM_WORKSPACE_BYTES)
        return CACHE_WORKSPACE;
    size_t c = (bytes + CACHE_GRAIN - 1) / CACHE_GRAIN;
    return c <= CACHE_CLASSES ? c : 0;
}

static bool capturing(void)
{
    return captures_running.load(std::memory_order_relaxed) != 0;
}

static size_t class_bytes(size_t c)
{
    return c == CACHE_WORKSPACE ? DPC_GEMM_WORKSPACE_BYTES : c * CACHE_GRAIN;
}

static void *cache_take(size_t c, int device, void *stream)
{
    std::lock_guard<std::mutex> lock(cache_mutex);
    cache_class &k = block_cache[c];
    /* the newest blocks first, and only so many: a long run of another
     * stream's blocks must not make every request walk it */
    for (size_t j = k.n, seen = 0; j-- > 0 && seen++ < CACHE_SCAN;)
        if (k.b[j].device == device && k.b[j].stream == stream) {
            void *ptr = k.b[j].ptr;
            k.b[j] = k.b[--k.n];
            cached_bytes -= class_bytes(c);
            return ptr;
        }
    return NULL;
}

static bool cache_put(size_t c, void *ptr, int device, void *stream)
{
    std::lock_guard<std::mutex> lock(cache_mutex);
    cache_class &k = block_cache[c];
    if (cached_bytes + class_bytes(c) > CACHE_MAX_BYTES)
        return false;
    if (k.n == k.cap) {
        size_t depth = CACHE_CLASS_BYTES / class_bytes(c);
        if (depth < CACHE_MIN_DEPTH)
            depth = CACHE_MIN_DEPTH;
        size_t cap = k.cap ? 2 * k.cap : CACHE_MIN_DEPTH;
        if (cap > depth)
            cap = depth;
        cached_block *grown = cap > k.cap ? (cached_block *)realloc(k.b, cap * sizeof *grown) : NULL;
        if (grown == NULL)
            return false;
        k.b = grown;
        k.cap = cap;
    }
    k.b[k.n++] = cached_block{ ptr, stream, device };
    cached_bytes += class_bytes(c);
    return true;
}

/* Gives the cached blocks of device (all devices when -1) and stream (any
 * when any_stream) back to the pool, each on its own stream. */
static void cache_flush(int device, bool any_stream, void *stream)
{
    std::lock_guard<std::mutex> lock(cache_mutex);
    for (size_t c = 1; c <= CACHE_WORKSPACE; c++) {
        cache_class &k = block_cache[c];
        for (size_t j = k.n; j-- > 0;) {
            cached_block b = k.b[j];
            if ((device >= 0 && b.device != device) || (!any_stream && b.stream != stream))
                continue;
            k.b[j] = k.b[--k.n];
            cached_bytes -= class_bytes(c);
            device_guard guard(b.device);
            (void)status(guard.err != cudaSuccess ? guard.err : cudaFreeAsync(b.ptr, (cudaStream_t)b.stream));
        }
    }
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
    size_t c = cache_class_of(bytes);
    if (c != 0 && !capturing() && (*ptr = cache_take(c, device, stream)) != NULL)
        return 0;
    if (c != 0)
        bytes = class_bytes(c);   /* so that the block can serve its whole class later */
    device_guard guard(device);
    if (guard.err != cudaSuccess)
        return status(guard.err);
    cudaError_t err = pool_setup(device);
    if (err == cudaSuccess)
        err = cudaMallocAsync(ptr, bytes, (cudaStream_t)stream);
    if (err == cudaErrorMemoryAllocation && !capturing()) {   /* a capture cannot wait for the device */
        /* Memory freed on other streams, held by the small-block cache, or
         * cached by the pool in blocks of the wrong sizes may be what is
         * missing: wait for the frees, give the caches back to the
         * driver, and try once more. */
        (void)cudaGetLastError();
        cache_flush(device, true, NULL);
        if (trim_pool(device) == cudaSuccess)
            err = cudaMallocAsync(ptr, bytes, (cudaStream_t)stream);
    }
    if (err != cudaSuccess)
        *ptr = NULL;
    return status(err);
}

/* The block returns to the pool (or the cache) once the work queued on
 * `stream` before this call is done; work on other streams that still
 * uses it must be ordered before this point by the caller. */
extern "C" int dpc_free(void *ptr, size_t bytes, int device, void *stream)
{
    if (ptr == NULL)
        return 0;
    size_t c = bytes ? cache_class_of(bytes) : 0;
    if (c != 0 && !capturing() && cache_put(c, ptr, device, stream))
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

/* Portable: usable by copies to any device of the process. */
extern "C" int dpc_host_alloc(void **ptr, size_t bytes)
{
    *ptr = NULL;
    return status(cudaHostAlloc(ptr, bytes ? bytes : 1, cudaHostAllocPortable));
}

extern "C" int dpc_host_free(void *ptr)
{
    return ptr ? status(cudaFreeHost(ptr)) : 0;
}

extern "C" int dpc_memcpy_queued(void *dst, const void *src, size_t bytes, void *stream)
{
    if (bytes == 0)
        return 0;
    if (dst == NULL || src == NULL)
        return (int)cudaErrorInvalidValue;
    return status(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, (cudaStream_t)stream));
}

/* ------------------------------------------------------------------------ */
/* devices                                                                   */
/* ------------------------------------------------------------------------ */

/* Every op makes its tensor's device current; asking first is a read of
 * the runtime's thread state, where setting it is a heavier call. */
extern "C" int dpc_set_device(int device)
{
    int current;
    cudaError_t err = cudaGetDevice(&current);
    if (err == cudaSuccess && current == device)
        return 0;
    if (err != cudaSuccess)
        (void)cudaGetLastError();
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

extern "C" int dpc_pool_trim(int device)
{
    cache_flush(device, true, NULL);
    device_guard guard(device);
    return status(guard.err != cudaSuccess ? guard.err : trim_pool(device));
}

/* What the device's pool holds from the driver now and at most (either
 * pointer may be NULL). */
extern "C" int dpc_pool_reserved(int device, size_t *reserved, size_t *peak)
{
    cudaMemPool_t pool;
    uint64_t now = 0, high = 0;
    cudaError_t err = cudaDeviceGetDefaultMemPool(&pool, device);
    if (err == cudaSuccess)
        err = cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &now);
    if (err == cudaSuccess)
        err = cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemHigh, &high);
    if (reserved)
        *reserved = (size_t)now;
    if (peak)
        *peak = (size_t)high;
    return status(err);
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

/* ------------------------------------------------------------------------ */
/* streams and events                                                        */
/* ------------------------------------------------------------------------ */

/* A stream or event query: "not ready" is an answer (*done 0), not an
 * error, and is cleared from the thread's last error. */
static int query_status(cudaError_t err, int *done)
{
    *done = err == cudaSuccess;
    if (err == cudaErrorNotReady) {
        (void)cudaGetLastError();
        return 0;
    }
    return status(err);
}

/* Non-blocking, as PyTorch's streams: no implicit ordering with the legacy
 * default stream, which a capture (below) needs. */
extern "C" int dpc_stream_create(void **stream, int device)
{
    *stream = NULL;
    device_guard guard(device);
    if (guard.err != cudaSuccess)
        return status(guard.err);
    return status(cudaStreamCreateWithFlags((cudaStream_t *)stream, cudaStreamNonBlocking));
}

extern "C" int dpc_stream_destroy(void *stream)
{
    if (stream == NULL)
        return 0;
    cache_flush(-1, false, stream);   /* their frees are queued on it */
    return status(cudaStreamDestroy((cudaStream_t)stream));
}

extern "C" int dpc_stream_synchronize(void *stream)
{
    return status(cudaStreamSynchronize((cudaStream_t)stream));
}

/* *done: 1 when all work queued on the stream has finished. */
extern "C" int dpc_stream_query(void *stream, int *done)
{
    return query_status(cudaStreamQuery((cudaStream_t)stream), done);
}

extern "C" int dpc_stream_wait_event(void *stream, void *event)
{
    return status(cudaStreamWaitEvent((cudaStream_t)stream, (cudaEvent_t)event, 0));
}

extern "C" int dpc_event_create(void **event, int device, int timing)
{
    *event = NULL;
    device_guard guard(device);
    if (guard.err != cudaSuccess)
        return status(guard.err);
    return status(cudaEventCreateWithFlags((cudaEvent_t *)event, timing ? cudaEventDefault : cudaEventDisableTiming));
}

extern "C" int dpc_event_destroy(void *event)
{
    return event ? status(cudaEventDestroy((cudaEvent_t)event)) : 0;
}

extern "C" int dpc_event_record(void *event, void *stream)
{
    return status(cudaEventRecord((cudaEvent_t)event, (cudaStream_t)stream));
}

extern "C" int dpc_event_synchronize(void *event)
{
    return status(cudaEventSynchronize((cudaEvent_t)event));
}

extern "C" int dpc_event_query(void *event, int *done)
{
    return query_status(cudaEventQuery((cudaEvent_t)event), done);
}

extern "C" int dpc_event_elapsed(float *ms, void *start, void *end)
{
    *ms = 0;
    return status(cudaEventElapsedTime(ms, (cudaEvent_t)start, (cudaEvent_t)end));
}

/* ------------------------------------------------------------------------ */
/* CUDA graphs                                                               */
/* ------------------------------------------------------------------------ */

/* Relaxed mode: memory for the captured work comes from cudaMalloc (see
 * src/core/gpu_memory.c), which the stricter modes forbid while capturing; dplua
 * itself refuses the calls that would break a capture (host copies,
 * synchronisation) before CUDA sees them. */
extern "C" int dpc_capture_begin(void *stream)
{
    captures_running++;
    cudaError_t err = cudaStreamBeginCapture((cudaStream_t)stream, cudaStreamCaptureModeRelaxed);
    if (err != cudaSuccess)
        captures_running--;
    return status(err);
}

/* Ends the capture; with keep, instantiates it into *exec. The graph
 * itself is not needed after instantiation. */
extern "C" int dpc_capture_end(void *stream, int keep, void **exec)
{
    cudaGraph_t graph = NULL;
    *exec = NULL;
    cudaError_t err = cudaStreamEndCapture((cudaStream_t)stream, &graph);
    captures_running--;   /* the capture is over, whether or not it worked */
    if (err == cudaSuccess && keep)
        err = cudaGraphInstantiate((cudaGraphExec_t *)exec, graph, 0);
    if (graph)
        (void)cudaGraphDestroy(graph);
    return status(err);
}

extern "C" int dpc_graph_launch(void *exec, void *stream)
{
    return status(cudaGraphLaunch((cudaGraphExec_t)exec, (cudaStream_t)stream));
}

extern "C" int dpc_graph_destroy(void *exec)
{
    return exec ? status(cudaGraphExecDestroy((cudaGraphExec_t)exec)) : 0;
}

/* Plain device memory, outside any pool or stream order: a graph's
 * private memory (src/core/gpu_memory.c), which must not move while it lives. */
extern "C" int dpc_malloc_plain(void **ptr, size_t bytes, int device)
{
    *ptr = NULL;
    device_guard guard(device);
    if (guard.err != cudaSuccess)
        return status(guard.err);
    return status(cudaMalloc(ptr, bytes ? bytes : 1));
}

extern "C" int dpc_free_plain(void *ptr, int device)
{
    device_guard guard(device);
    if (guard.err != cudaSuccess)
        return status(guard.err);
    return status(cudaFree(ptr));
}

/* ------------------------------------------------------------------------ */
/* errors                                                                    */
/* ------------------------------------------------------------------------ */

/* Host memory that kernels write through its device mapping (UVA: the
 * same address on every device): see dpc_kernel_error in dpc_ops.h. */
extern "C" int dpc_kernel_error_block(dpc_kernel_error **block)
{
    static std::mutex mu;
    static dpc_kernel_error *mapped;
    std::lock_guard<std::mutex> lock(mu);
    cudaError_t err = cudaSuccess;
    if (!mapped) {
        void *p = NULL;
        err = cudaHostAlloc(&p, sizeof(dpc_kernel_error), cudaHostAllocMapped | cudaHostAllocPortable);
        if (err == cudaSuccess) {
            memset(p, 0, sizeof(dpc_kernel_error));
            mapped = (dpc_kernel_error *)p;
        }
    }
    *block = mapped;
    return status(err);
}

/* The errors after which the context is unusable: every later call in
 * the process fails with them. */
extern "C" int dpc_error_is_sticky(int st)
{
    switch ((cudaError_t)st) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorHardwareStackError:
    case cudaErrorAssert:
    case cudaErrorLaunchTimeout:
    case cudaErrorECCUncorrectable:
        return 1;
    default:
        return 0;
    }
}
