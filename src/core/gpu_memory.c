/*
 * gpu_memory.c — the CUDA side's memory and ordering: storages in device
 * memory (and in a CUDA graph's pool while one is captured), copies
 * between host and device, each device's current stream, events, and
 * CUDA graphs.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#ifdef DP_HAVE_CUDA
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dplua_cuda.h"
#include "dplua_internal.h"
#include "core/gpu.h"

#define GPU_MAX_DEVICES 64

/* Each device's current stream (NULL: its legacy default stream): every
 * kernel and copy for a tensor on that device goes there. */
static void *current_stream[GPU_MAX_DEVICES];

void *gpu_stream_now(int device)
{
    return device >= 0 && device < GPU_MAX_DEVICES ? current_stream[device] : NULL;
}

/* ---------------------------------------------------------------- graph memory */

/* While a CUDA graph is captured, storages come from a pool of its own:
 * plain cudaMalloc blocks whose addresses the graph's kernels keep. A
 * block freed during the capture is handed out again to a later request
 * of the same size (one stream: the order of the graph is the order of
 * the capture); after the capture nothing is handed out again, since
 * every replay writes all of it. Memory from the ordinary pool that is
 * freed during the capture is kept too: kernels captured before the free
 * may read it at every replay. The pool goes when its graph and the last
 * storage from it are gone. */
typedef struct pool_block {
    void *data;
    size_t size;
    int in_use;
    struct pool_block *next;
} pool_block;

typedef struct gpu_pool {
    int refcount;        /* the graph, and each storage from the pool */
    int device;
    int capturing;
    pool_block *blocks;  /* from cudaMalloc, for this graph */
    pool_block *kept;    /* ordinary memory freed during the capture */
    struct gpu_pool *next_freed;
} gpu_pool;

/* the capture under way (one at a time in a process) */
static struct {
    gpu_pool *pool;      /* NULL when none */
    int device;
    void *prev_stream;
} capture;

int dp_cuda_capturing(void)
{
    return capture.pool != NULL;
}

/* a capture is under way on this device (its allocations and frees are the graph's) */
static bool capturing_on(int device)
{
    return capture.pool && capture.device == device;
}

dp_status gpu_not_capturable(const char *what)
{
    return dp_fail(DP_ERR_CUDA, "torch.cuda.graph: %s cannot be captured in a CUDA graph; do it before or after "
                   "the captured function (see docs/API.md, \"CUDA graphs\")", what);
}

static dp_status pool_alloc(gpu_pool *p, void **data, size_t nbytes)
{
    size_t size = (nbytes + 511) & ~(size_t)511;
    for (pool_block *b = p->blocks; b; b = b->next)
        if (!b->in_use && b->size == size) {
            b->in_use = 1;
            *data = b->data;
            return DP_OK;
        }
    pool_block *b = calloc(1, sizeof *b);
    if (!b)
        return dp_fail(DP_ERR_MEMORY, "out of memory allocating a graph pool block header");
    int st = dpc_malloc_plain(&b->data, size, p->device);
    if (st) {
        free(b);
        return dp_fail(DP_ERR_MEMORY, "out of memory allocating %zu bytes on cuda:%d for a CUDA graph: %s",
                       nbytes, p->device, dpc_error_string(st));
    }
    b->size = size;
    b->in_use = 1;
    b->next = p->blocks;
    p->blocks = b;
    *data = b->data;
    return DP_OK;
}

/* Pools let go of while a graph is captured: freeing one waits for the
 * device, which a capture forbids, so they wait for the capture's end. */
static gpu_pool *pools_freed_during_capture;

static void pool_release(gpu_pool *p)
{
    if (!p || --p->refcount > 0)
        return;
    if (capture.pool) {
        p->next_freed = pools_freed_during_capture;
        pools_freed_during_capture = p;
        return;
    }
    (void)dpc_synchronize(p->device);   /* no replay may still use the memory */
    for (pool_block *b = p->blocks, *next; b; b = next) {
        next = b->next;
        (void)dpc_free_plain(b->data, p->device);
        free(b);
    }
    for (pool_block *b = p->kept, *next; b; b = next) {
        next = b->next;
        (void)dpc_free(b->data, 0, p->device, NULL);
        free(b);
    }
    free(p);
}

/* ---------------------------------------------------------------- memory */

/* The number of GPUs, asked once it is known to be non-zero (it cannot
 * change within a process; a failure is asked again, to report it). */
static int device_count(int *count)
{
    static int known;
    if (known > 0) {
        *count = known;
        return 0;
    }
    int st = dpc_device_count(count);
    if (st == 0)
        known = *count;
    return st;
}

dp_status gpu_storage_alloc(void **data, void **pool, size_t nbytes, int device)
{
    int count = 0;
    int st = device_count(&count);
    *pool = NULL;
    if (st != 0 || device >= count)
        return dp_fail(DP_ERR_DEVICE, "device cuda:%d is not available (%d CUDA device%s%s%s)", device, count,
                       count == 1 ? "" : "s", st ? ": " : "", st ? dpc_error_string(st) : "");
    if (capturing_on(device)) {
        dp_status ds = pool_alloc(capture.pool, data, nbytes);
        if (!ds) {
            capture.pool->refcount++;
            *pool = capture.pool;
        }
        return ds;
    }
    if ((st = dpc_malloc(data, nbytes ? nbytes : 1, device, gpu_stream_now(device)))) {   /* it sets the device */
        size_t free_bytes = 0, total = 0;
        (void)dpc_mem_info(device, &free_bytes, &total);
        return dp_fail(DP_ERR_MEMORY, "CUDA out of memory: %zu bytes requested on cuda:%d; tensors hold %lld bytes "
                       "there and the device has %zu of %zu bytes free (%s)", nbytes, device,
                       (long long)dp_memory_allocated(device), free_bytes, total, dpc_error_string(st));
    }
    return DP_OK;
}

void gpu_storage_free(void *data, size_t nbytes, void *pool, int device)
{
    gpu_pool *p = pool;
    if (p) {
        if (p->capturing)
            for (pool_block *b = p->blocks; b; b = b->next)
                if (b->data == data)
                    b->in_use = 0;
        pool_release(p);
        return;
    }
    if (!data)
        return;
    if (capturing_on(device)) {
        /* kept for the graph (with no header to remember it by: leaked rather than freed under the graph) */
        pool_block *b = calloc(1, sizeof *b);
        if (b) {
            b->data = data;
            b->next = capture.pool->kept;
            capture.pool->kept = b;
        }
        return;
    }
    dpc_free(data, nbytes, device, gpu_stream_now(device));   /* it sets the device */
}

/* Contiguous bytes between host and device (kind as dpc_memcpy). A copy
 * with the host waits for the stream, so the errors kernels found come
 * out here. */
dp_status gpu_memcpy(void *dst, const void *src, size_t bytes, int kind, int device)
{
    if (kind != 2 && dp_cuda_capturing())
        return gpu_not_capturable(kind == 0 ? "a copy from the host to the GPU (a tensor made from Lua values, a "
                                          "random draw, a CPU tensor moved to the GPU)"
                                        : "a copy from the GPU to the host (:item(), :tolist(), print, :cpu())");
    int st = dpc_set_device(device);
    if (!st && bytes)
        st = dpc_memcpy(dst, src, bytes, kind, gpu_stream_of(device));
    dp_status ds = gpu_status("copy", st, -1);
    return ds || kind == 2 ? ds : gpu_kernel_errors();
}

/* ---------------------------------------------------------------- pinned host memory */

dp_status gpu_host_alloc(void **data, size_t nbytes)
{
    int count = 0;
    int st = device_count(&count);
    if (st != 0 || count == 0)
        return dp_fail(DP_ERR_DEVICE, "pin_memory: pinned host memory serves copies to a GPU, and no CUDA device is "
                       "available%s%s", st ? ": " : "", st ? dpc_error_string(st) : "");
    if ((st = dpc_host_alloc(data, nbytes)))
        return dp_fail(DP_ERR_MEMORY, "pin_memory: could not page-lock %zu bytes of host memory (%s)", nbytes,
                       dpc_error_string(st));
    return DP_OK;
}

void gpu_host_free(void *data, void *copy_event)
{
    if (copy_event) {
        (void)dpc_event_synchronize(copy_event);
        (void)dpc_event_destroy(copy_event);
    }
    (void)dpc_host_free(data);
}

dp_status gpu_upload_queued(dp_tensor *dst, dp_tensor *src)
{
    dp_storage *s = src->storage;
    if (dp_cuda_capturing())
        return gpu_not_capturable("a copy from the host to the GPU (a pinned tensor moved with non_blocking=true)");
    int st = dpc_set_device(dst->device);
    if (!st && !s->copy_event)
        st = dpc_event_create(&s->copy_event, dst->device, 0);
    void *stream = gpu_stream_of(dst->device);
    size_t bytes = (size_t)dp_tensor_numel(dst) * dp_dtype_size(dst->dtype);
    if (!st)
        st = dpc_memcpy_queued(gpu_first(dst), gpu_first(src), bytes, stream);
    if (!st)
        st = dpc_event_record(s->copy_event, stream);
    return gpu_status("to(non_blocking=true)", st, -1);
}

dp_status gpu_pinned_wait(dp_storage *s)
{
    return s->copy_event ? gpu_status("pinned memory wait", dpc_event_synchronize(s->copy_event), -1) : DP_OK;
}

dp_status gpu_workspace(dp_tensor **ws, int64_t bytes, int device)
{
    return bytes > 0 ? tensor_new(ws, 1, &bytes, DP_UINT8, device) : DP_OK;
}

int dp_cuda_device_count(void)
{
    int n = 0;
    return device_count(&n) == 0 ? n : 0;
}

dp_status dp_cuda_synchronize(int device)
{
    gpu_deferred_launch();
    if (dp_cuda_capturing())
        return gpu_not_capturable("torch.cuda.synchronize()");
    dp_status st = gpu_status("synchronize", dpc_synchronize(device), -1);
    return st ? st : gpu_kernel_errors();
}

/* ---------------------------------------------------------------- streams and events */

static dp_status valid_device(int device, const char *fn)
{
    int n = dp_cuda_device_count();
    if (device < 0 || device >= n || device >= GPU_MAX_DEVICES)
        return dp_fail(DP_ERR_DEVICE, "%s: device cuda:%d is not available (%d CUDA device%s)", fn, device, n,
                       n == 1 ? "" : "s");
    return DP_OK;
}

dp_status dp_cuda_empty_cache(int device)
{
    if (dp_cuda_device_count() == 0)
        return DP_OK;   /* nothing cached, as in PyTorch */
    dp_status st = valid_device(device, "cuda.empty_cache");
    if (st)
        return st;
    if (dp_cuda_capturing())
        return gpu_not_capturable("torch.cuda.empty_cache()");
    return gpu_status("cuda.empty_cache", dpc_pool_trim(device), -1);
}

/* Two sizes about a device from q, a dpc_ query that `what` names; both
 * 0 when it fails. */
static dp_status device_sizes(const char *what, int device, int (*q)(int device, size_t *a, size_t *b), int64_t *a,
                              int64_t *b)
{
    size_t x = 0, y = 0;
    dp_status st = valid_device(device, what);
    if (!st)
        st = gpu_status(what, q(device, &x, &y), -1);
    *a = (int64_t)x;
    *b = (int64_t)y;
    return st;
}

dp_status dp_cuda_memory_reserved(int device, int64_t *now, int64_t *peak)
{
    return device_sizes("cuda.memory_reserved", device, dpc_pool_reserved, now, peak);
}

dp_status dp_cuda_mem_get_info(int device, int64_t *free_bytes, int64_t *total_bytes)
{
    return device_sizes("cuda.mem_get_info", device, dpc_mem_info, free_bytes, total_bytes);
}

dp_status dp_cuda_device_properties(int device, char *name, size_t name_len, int64_t *total_memory, int *major,
                                    int *minor, int *multiprocessors)
{
    struct dpc_device_info d;
    dp_status st = valid_device(device, "cuda.get_device_properties");
    if (!st)
        st = gpu_status("cuda.get_device_properties", dpc_device_info(device, &d), -1);
    if (st)
        return st;
    snprintf(name, name_len, "%s", d.name);
    *total_memory = (int64_t)d.total_memory;
    *major = d.major;
    *minor = d.minor;
    *multiprocessors = d.multiprocessors;
    return DP_OK;
}

dp_status dp_cuda_stream_new(void **stream, int device)
{
    dp_status st = valid_device(device, "cuda.Stream");
    return st ? st : gpu_status("cuda.Stream", dpc_stream_create(stream, device), -1);
}

void dp_cuda_stream_free(void *stream)
{
    gpu_deferred_launch_on(stream);   /* before the stream is gone */
    for (int d = 0; d < GPU_MAX_DEVICES; d++)
        if (current_stream[d] == stream)
            current_stream[d] = NULL;
    (void)dpc_stream_destroy(stream);
}

dp_status dp_cuda_set_stream(int device, void *stream)
{
    dp_status st = valid_device(device, "cuda.set_stream");
    if (st)
        return st;
    if (capturing_on(device))
        return gpu_not_capturable("changing the current stream");
    gpu_deferred_launch();
    current_stream[device] = stream;
    return DP_OK;
}

/* No launch of the deferred work here: a process group's worker thread
 * asks this (src/dist/nccl.c), and its submit launched it already
 * (dp_cuda_launch_deferred), on the caller's thread. */
void *dp_cuda_current_stream(int device)
{
    return gpu_stream_now(device);
}

/* The host waits for a stream or an event (handle) through wait, a
 * dpc_*_synchronize named `what`: refused while a graph is captured, and
 * the kernel errors of the work it waited for are reported after it. */
static dp_status host_wait(const char *what, int (*wait)(void *handle), void *handle)
{
    gpu_deferred_launch();
    if (dp_cuda_capturing()) {
        char call[64];
        snprintf(call, sizeof call, "%s()", what);
        return gpu_not_capturable(call);
    }
    dp_status st = gpu_status(what, wait(handle), -1);
    return st ? st : gpu_kernel_errors();
}

dp_status dp_cuda_stream_synchronize(void *stream)
{
    return host_wait("Stream:synchronize", dpc_stream_synchronize, stream);
}

dp_status dp_cuda_stream_query(void *stream, int *done)
{
    gpu_deferred_launch();
    return gpu_status("Stream:query", dpc_stream_query(stream, done), -1);
}

dp_status dp_cuda_stream_wait_event(void *stream, void *event)
{
    gpu_deferred_launch();
    return gpu_status("Stream:wait_event", dpc_stream_wait_event(stream, event), -1);
}

dp_status dp_cuda_event_new(void **event, int device, int timing)
{
    dp_status st = valid_device(device, "cuda.Event");
    return st ? st : gpu_status("cuda.Event", dpc_event_create(event, device, timing), -1);
}

void dp_cuda_event_free(void *event)
{
    (void)dpc_event_destroy(event);
}

dp_status dp_cuda_event_record(void *event, void *stream)
{
    gpu_deferred_launch();
    return gpu_status("Event:record", dpc_event_record(event, stream), -1);
}

dp_status dp_cuda_event_synchronize(void *event)
{
    return host_wait("Event:synchronize", dpc_event_synchronize, event);
}

dp_status dp_cuda_event_query(void *event, int *done)
{
    gpu_deferred_launch();
    return gpu_status("Event:query", dpc_event_query(event, done), -1);
}

dp_status dp_cuda_event_elapsed(double *ms, void *start, void *end)
{
    float f = 0;
    dp_status st = gpu_status("Event:elapsed_time", dpc_event_elapsed(&f, start, end), -1);
    *ms = f;
    return st;
}

/* ---------------------------------------------------------------- the kernel profile */

dp_status dp_cuda_profile_start(void)
{
    gpu_deferred_launch();   /* what was queued before is not the profile's */
    return gpu_status("cuda.profile_kernels", dpc_profile_start(), -1);
}

dp_status dp_cuda_profile_stop(int *rows, int64_t *dropped, double *span_ms)
{
    gpu_deferred_launch();
    const dpc_profile_row *table;
    dp_status st = gpu_status("cuda.profile_kernels", dpc_profile_stop(), -1);
    dpc_profile_rows(&table, rows, dropped, span_ms);
    return st;
}

dp_status dp_cuda_profile_row(int i, const char **name, int64_t *calls, double *ms)
{
    const dpc_profile_row *table;
    int n;
    int64_t dropped;
    double span;
    dpc_profile_rows(&table, &n, &dropped, &span);
    if (i < 0 || i >= n)
        return dp_fail(DP_ERR_ARG, "cuda.profile_kernels: row %d out of range (%d rows)", i, n);
    *name = table[i].name;
    *calls = table[i].calls;
    *ms = table[i].ms;
    return DP_OK;
}

/* ---------------------------------------------------------------- CUDA graphs */

struct dp_cuda_graph {
    int device;
    void *stream;        /* the capture's stream, until the capture ends */
    void *exec;          /* the instantiated graph */
    gpu_pool *pool;
    dp_cuda_graph *next_freed;
};

/* Graphs collected while another is captured: freeing one waits for the
 * device, which a capture forbids, so it waits for the capture's end. */
static dp_cuda_graph *freed_during_capture;

dp_status dp_cuda_graph_begin(dp_cuda_graph **out, int device)
{
    *out = NULL;
    dp_status st = valid_device(device, "torch.cuda.graph");
    if (st)
        return st;
    if (capture.pool)
        return dp_fail(DP_ERR_ARG, "torch.cuda.graph: a capture is already under way (captures do not nest)");
    gpu_deferred_launch();   /* eager work, not the graph's */
    dp_cuda_graph *g = calloc(1, sizeof *g);
    gpu_pool *p = calloc(1, sizeof *p);
    if (!g || !p) {
        free(g);
        free(p);
        return dp_fail(DP_ERR_MEMORY, "torch.cuda.graph: out of memory");
    }
    p->refcount = 1;
    p->device = device;
    p->capturing = 1;
    g->device = device;
    g->pool = p;
    if ((st = gpu_status("torch.cuda.graph", dpc_stream_create(&g->stream, device), -1)) ||
        (st = gpu_status("torch.cuda.graph (begin capture)", dpc_capture_begin(g->stream), -1))) {
        (void)dpc_stream_destroy(g->stream);
        free(g);
        free(p);
        return st;
    }
    capture.pool = p;
    capture.device = device;
    capture.prev_stream = current_stream[device];
    current_stream[device] = g->stream;
    *out = g;
    return DP_OK;
}

dp_status dp_cuda_graph_end(dp_cuda_graph *g, int keep)
{
    if (!g || !g->stream)
        return dp_fail(DP_ERR_ARG, "torch.cuda.graph: no capture is under way");
    gpu_deferred_launch();   /* the graph's last product */
    int st = dpc_capture_end(g->stream, keep, &g->exec);
    current_stream[g->device] = capture.prev_stream;
    capture.pool = NULL;
    g->pool->capturing = 0;
    (void)dpc_stream_destroy(g->stream);
    g->stream = NULL;
    while (freed_during_capture) {
        dp_cuda_graph *f = freed_during_capture;
        freed_during_capture = f->next_freed;
        dp_cuda_graph_free(f);
    }
    while (pools_freed_during_capture) {
        gpu_pool *p = pools_freed_during_capture;
        pools_freed_during_capture = p->next_freed;
        p->refcount = 1;
        pool_release(p);
    }
    if (st && keep)
        return dp_fail(DP_ERR_CUDA, "torch.cuda.graph: the capture failed: %s (a call that cannot be captured "
                       "ran inside it)", dpc_error_string(st));
    return DP_OK;
}

dp_status dp_cuda_graph_replay(dp_cuda_graph *g)
{
    if (!g->exec)
        return dp_fail(DP_ERR_ARG, "CUDAGraph:replay: the graph holds no captured work");
    if (capture.pool)
        return gpu_not_capturable("replaying a CUDA graph");
    dpc_set_device(g->device);
    return gpu_status("CUDAGraph:replay", dpc_graph_launch(g->exec, gpu_stream_of(g->device)), -1);
}

void dp_cuda_graph_free(dp_cuda_graph *g)
{
    if (!g)
        return;
    if (g->stream)
        (void)dp_cuda_graph_end(g, 0);
    else if (capture.pool) {
        g->next_freed = freed_during_capture;
        freed_during_capture = g;
        return;
    }
    (void)dpc_graph_destroy(g->exec);
    pool_release(g->pool);
    free(g);
}


#endif /* DP_HAVE_CUDA */
