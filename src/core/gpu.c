/*
 * gpu.c — the CUDA side of the op table: turns tensors into the pointer
 * and stride descriptions of cuda/dpc_ops.h, calls the kernels, and turns
 * their statuses into messages. Also the device memory of storages and the
 * copies between host and device. Built without CUDA, every entry point
 * fails with a message that says so (no tensor can be on a GPU then).
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif
#include "core/kernels.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef DP_HAVE_CUDA
#include "dp_cuda.h"
#include "dpc_ops.h"

/* ---------------------------------------------------------------- plumbing */

#define GPU_MAX_DEVICES 64

/* Each device's current stream (NULL: its legacy default stream): every
 * kernel and copy for a tensor on that device goes there. */
static void *current_stream[GPU_MAX_DEVICES];

static void *stream_now(int device)
{
    return device >= 0 && device < GPU_MAX_DEVICES ? current_stream[device] : NULL;
}

/* deferred launches, below the products */
static void deferred_launch(void);
static void deferred_launch_on(void *stream);
static bool deferred_fuse(int op, dp_tensor *out, dp_tensor *a, dp_status *st);

/* The stream for work about to be enqueued on device, after the deferred
 * work (below) if some waits: every kernel and copy asks for it. */
static void *stream_of(int device)
{
    deferred_launch();
    return stream_now(device);
}

/* After an error that breaks the CUDA context (an illegal address, a
 * crashed kernel) every later call fails with it; the first one is kept
 * so that every later message can say where the trouble started. */
static char broken_since[320];

static char deferred_failure[400];   /* a deferred launch's error, for the next op to report */

static dp_status gpu_status(const char *fn, int st, int dtype)
{
    if (deferred_failure[0]) {
        char why[sizeof deferred_failure];
        memcpy(why, deferred_failure, sizeof why);
        deferred_failure[0] = 0;
        if (st == 0)
            return dp_fail(DP_ERR_CUDA, "%s (a Linear's waiting launch, made when %s came next)", why, fn);
        return dp_fail(DP_ERR_CUDA, "%s (a Linear's waiting launch, made when %s came next); then %s failed too: %s",
                       why, fn, fn, st == DPC_UNSUPPORTED ? "not supported" : dpc_error_string(st));
    }
    if (st == 0)
        return DP_OK;
    if (st == DPC_UNSUPPORTED)
        return dp_fail(DP_ERR_DTYPE, "%s: not supported on CUDA for dtype %s", fn, dp_dtype_name(dtype));
    if (broken_since[0])
        return dp_fail(DP_ERR_CUDA, "%s: CUDA cannot be used any more in this process: %s", fn, broken_since);
    if (dpc_error_is_sticky(st)) {
        snprintf(broken_since, sizeof broken_since, "%s failed with \"%s\", which leaves the CUDA context "
                 "unusable (restart the process; CUDA_LAUNCH_BLOCKING=1 or compute-sanitizer finds the kernel)",
                 fn, dpc_error_string(st));
        return dp_fail(DP_ERR_CUDA, "%s: CUDA error: %s (the CUDA context is now unusable: every later CUDA "
                       "call in this process fails)", fn, dpc_error_string(st));
    }
    return dp_fail(DP_ERR_CUDA, "%s: CUDA error: %s", fn, dpc_error_string(st));
}

static int set_device(int device)
{
    return dpc_set_device(device);
}

/* Errors that kernels found (dpc_kernel_error in cuda/dpc_ops.h): the
 * block is made on first use; the host reads it after each
 * synchronisation and raises what it holds. */
static dpc_kernel_error *kernel_error_block;

static dpc_kernel_error *kerr(void)
{
    if (!kernel_error_block)
        (void)dpc_kernel_error_block(&kernel_error_block);   /* NULL on failure: kernels then report nothing */
    return kernel_error_block;
}

static dp_status kernel_errors(void)
{
    dpc_kernel_error *e = kernel_error_block;
    if (!e || e->code == DPC_KERR_NONE)
        return DP_OK;
    int code = e->code;
    long long v = e->value, limit = e->limit;
    e->code = DPC_KERR_NONE;
    const char *later = " (found by a CUDA kernel queued earlier, reported at this synchronisation)";
    switch (code) {
    case DPC_KERR_CE_TARGET:
        return dp_fail(DP_ERR_INDEX, "cross_entropy: target %lld is out of bounds (expected a class index in "
                       "[0, %lld) or ignore_index)%s", v, limit, later);
    case DPC_KERR_INDEX_SELECT:
        return dp_fail(DP_ERR_INDEX, "index_select: index %lld is out of bounds for a dimension of size %lld%s",
                       v, limit, later);
    case DPC_KERR_GATHER:
        return dp_fail(DP_ERR_INDEX, "gather: index %lld is out of bounds for a dimension of size %lld%s", v,
                       limit, later);
    default:
        return dp_fail(DP_ERR_INDEX, "scatter_add: index %lld is out of bounds for a dimension of size %lld%s",
                       v, limit, later);
    }
}

static dpc_shape shape_of(const dp_tensor *t)
{
    dpc_shape s = { .ndim = t->ndim };
    memcpy(s.shape, t->shape, sizeof(int64_t) * (size_t)t->ndim);
    return s;
}

static void *first(const dp_tensor *t)
{
    return (char *)t->storage->data + t->offset * (int64_t)dp_dtype_size(t->dtype);
}

static dpc_operand operand(const dp_tensor *t)
{
    dpc_operand o = { .data = first(t) };
    memcpy(o.stride, t->stride, sizeof(int64_t) * (size_t)t->ndim);
    return o;
}

/* t with `dim` removed (a view on the stack; no refcounts taken) */
static dp_tensor drop(const dp_tensor *t, int dim)
{
    dp_tensor v = *t;
    for (int i = dim; i < t->ndim - 1; i++) {
        v.shape[i] = t->shape[i + 1];
        v.stride[i] = t->stride[i + 1];
    }
    v.ndim = t->ndim - 1;
    return v;
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

static dp_status not_capturable(const char *what)
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
    if ((st = dpc_malloc(data, nbytes ? nbytes : 1, device, stream_now(device)))) {   /* it sets the device */
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
    dpc_free(data, nbytes, device, stream_now(device));   /* it sets the device */
}

/* Contiguous bytes between host and device (kind as dpc_memcpy). A copy
 * with the host waits for the stream, so the errors kernels found come
 * out here. */
dp_status gpu_memcpy(void *dst, const void *src, size_t bytes, int kind, int device)
{
    if (kind != 2 && dp_cuda_capturing())
        return not_capturable(kind == 0 ? "a copy from the host to the GPU (a tensor made from Lua values, a "
                                          "random draw, a CPU tensor moved to the GPU)"
                                        : "a copy from the GPU to the host (:item(), :tolist(), print, :cpu())");
    int st = set_device(device);
    if (!st && bytes)
        st = dpc_memcpy(dst, src, bytes, kind, stream_of(device));
    dp_status ds = gpu_status("copy", st, -1);
    return ds || kind == 2 ? ds : kernel_errors();
}

int dp_cuda_device_count(void)
{
    int n = 0;
    return device_count(&n) == 0 ? n : 0;
}

dp_status dp_cuda_synchronize(int device)
{
    deferred_launch();
    if (dp_cuda_capturing())
        return not_capturable("torch.cuda.synchronize()");
    dp_status st = gpu_status("synchronize", dpc_synchronize(device), -1);
    return st ? st : kernel_errors();
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
        return not_capturable("torch.cuda.empty_cache()");
    return gpu_status("cuda.empty_cache", dpc_pool_trim(device), -1);
}

dp_status dp_cuda_memory_reserved(int device, int64_t *now, int64_t *peak)
{
    size_t r = 0, p = 0;
    dp_status st = valid_device(device, "cuda.memory_reserved");
    if (!st)
        st = gpu_status("cuda.memory_reserved", dpc_pool_reserved(device, &r, &p), -1);
    *now = (int64_t)r;
    *peak = (int64_t)p;
    return st;
}

dp_status dp_cuda_mem_get_info(int device, int64_t *free_bytes, int64_t *total_bytes)
{
    size_t f = 0, t = 0;
    dp_status st = valid_device(device, "cuda.mem_get_info");
    if (!st)
        st = gpu_status("cuda.mem_get_info", dpc_mem_info(device, &f, &t), -1);
    *free_bytes = (int64_t)f;
    *total_bytes = (int64_t)t;
    return st;
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
    deferred_launch_on(stream);   /* before the stream is gone */
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
        return not_capturable("changing the current stream");
    deferred_launch();
    current_stream[device] = stream;
    return DP_OK;
}

/* No launch of the deferred work here: a process group's worker thread
 * asks this (src/dist/nccl.c), and its submit launched it already
 * (dp_cuda_launch_deferred), on the caller's thread. */
void *dp_cuda_current_stream(int device)
{
    return stream_now(device);
}

dp_status dp_cuda_stream_synchronize(void *stream)
{
    deferred_launch();
    if (dp_cuda_capturing())
        return not_capturable("Stream:synchronize()");
    dp_status st = gpu_status("Stream:synchronize", dpc_stream_synchronize(stream), -1);
    return st ? st : kernel_errors();
}

dp_status dp_cuda_stream_query(void *stream, int *done)
{
    deferred_launch();
    return gpu_status("Stream:query", dpc_stream_query(stream, done), -1);
}

dp_status dp_cuda_stream_wait_event(void *stream, void *event)
{
    deferred_launch();
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
    deferred_launch();
    return gpu_status("Event:record", dpc_event_record(event, stream), -1);
}

dp_status dp_cuda_event_synchronize(void *event)
{
    deferred_launch();
    if (dp_cuda_capturing())
        return not_capturable("Event:synchronize()");
    dp_status st = gpu_status("Event:synchronize", dpc_event_synchronize(event), -1);
    return st ? st : kernel_errors();
}

dp_status dp_cuda_event_query(void *event, int *done)
{
    deferred_launch();
    return gpu_status("Event:query", dpc_event_query(event, done), -1);
}

dp_status dp_cuda_event_elapsed(double *ms, void *start, void *end)
{
    float f = 0;
    dp_status st = gpu_status("Event:elapsed_time", dpc_event_elapsed(&f, start, end), -1);
    *ms = f;
    return st;
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
    deferred_launch();   /* eager work, not the graph's */
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
    deferred_launch();   /* the graph's last product */
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
        return not_capturable("replaying a CUDA graph");
    set_device(g->device);
    return gpu_status("CUDAGraph:replay", dpc_graph_launch(g->exec, stream_of(g->device)), -1);
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

/* ---------------------------------------------------------------- elementwise */

dp_status gpu_unary(int op, dp_tensor *out, dp_tensor *a)
{
    dp_status st;
    if (deferred_fuse(op, out, a, &st))
        return st;
    set_device(out->device);
    return gpu_status("unary op", dpc_unary(op, a->dtype, out->dtype, shape_of(out), operand(out), operand(a), stream_of(out->device)),
                      a->dtype);
}

dp_status gpu_binary(int op, dp_tensor *out, dp_tensor *a, dp_tensor *b)
{
    set_device(out->device);
    return gpu_status("binary op", dpc_binary(op, a->dtype, out->dtype, shape_of(out), operand(out), operand(a),
                                              operand(b), stream_of(out->device)), a->dtype);
}

dp_status gpu_unary_backward(int op, dp_tensor *dx, dp_tensor *g, dp_tensor *x, dp_tensor *y)
{
    set_device(dx->device);
    return gpu_status("backward", dpc_unary_backward(op, dx->dtype, shape_of(dx), operand(dx), operand(g),
                                                     operand(x), operand(y), stream_of(dx->device)), dx->dtype);
}

dp_status gpu_where(dp_tensor *out, dp_tensor *cond, dp_tensor *a, dp_tensor *b)
{
    set_device(out->device);
    return gpu_status("where", dpc_where(out->dtype, shape_of(out), operand(out), operand(cond), operand(a),
                                         operand(b), stream_of(out->device)), out->dtype);
}

dp_status gpu_clamp(dp_tensor *out, dp_tensor *a, double lo, double hi)
{
    set_device(out->device);
    return gpu_status("clamp", dpc_clamp(out->dtype, shape_of(out), operand(out), operand(a), lo, hi, stream_of(out->device)),
                      out->dtype);
}

/* Within one device: the kernel; across devices or with the host: through
 * a contiguous buffer of the destination's dtype. */
dp_status gpu_copy(dp_tensor *dst, dp_tensor *src)
{
    dp_status st;
    if (src->device == dst->device) {
        set_device(dst->device);
        return gpu_status("copy_", dpc_cast(dst->dtype, src->dtype, shape_of(dst), operand(dst), operand(src), stream_of(dst->device)),
                          src->dtype);
    }
    dp_tensor *host = NULL, *host2 = NULL;
    size_t bytes = (size_t)dp_tensor_numel(dst) * dp_dtype_size(dst->dtype);
    if (src->device == DP_CPU) {
        /* host source: cast and make contiguous on the host, then upload */
        if ((st = tensor_new(&host, dst->ndim, dst->shape, dst->dtype, DP_CPU)) || (st = cpu_copy(host, src)))
            goto done;
        if (tensor_is_contiguous(dst)) {
            st = gpu_memcpy(first(dst), first(host), bytes, 0, dst->device);
        } else {
            dp_tensor *dev;
            if (!(st = tensor_new(&dev, dst->ndim, dst->shape, dst->dtype, dst->device))) {
                if (!(st = gpu_memcpy(first(dev), first(host), bytes, 0, dst->device)))
                    st = gpu_copy(dst, dev);
                dp_tensor_release(dev);
            }
        }
    } else if (dst->device == DP_CPU) {
        /* device source: cast and make contiguous on its device, then download */
        dp_tensor *dev;
        if ((st = tensor_new(&dev, dst->ndim, dst->shape, dst->dtype, src->device)))
            goto done;
        if (!(st = gpu_copy(dev, src)) && !(st = tensor_new(&host, dst->ndim, dst->shape, dst->dtype, DP_CPU)) &&
            !(st = gpu_memcpy(first(host), first(dev), bytes, 1, src->device)))
            st = cpu_copy(dst, host);
        dp_tensor_release(dev);
    } else {
        /* between two GPUs: through the host */
        if (!(st = tensor_new(&host2, dst->ndim, dst->shape, dst->dtype, DP_CPU)) && !(st = gpu_copy(host2, src)))
            st = gpu_copy(dst, host2);
    }
done:
    dp_tensor_release(host);
    dp_tensor_release(host2);
    return st;
}

dp_status gpu_fill(dp_tensor *dst, double value)
{
    set_device(dst->device);
    return gpu_status("fill_", dpc_fill(dst->dtype, shape_of(dst), operand(dst), value, stream_of(dst->device)), dst->dtype);
}

/* Integer checks of pow/remainder: rare, so on a host copy. */
bool gpu_any(int what, dp_tensor *t)
{
    dp_tensor *host;
    if (tensor_new(&host, t->ndim, t->shape, t->dtype, DP_CPU))
        return false;
    bool found = gpu_copy(host, t) == DP_OK && cpu_any(what, host);
    dp_tensor_release(host);
    return found;
}

dp_status gpu_random(dp_tensor *t, int kind, uint64_t counter, uint64_t key, int64_t low, uint64_t range)
{
    /* the counter is fixed at capture: every replay would draw the same numbers */
    if (dp_cuda_capturing())
        return not_capturable("a random draw (rand, randn, randint, dropout)");
    set_device(t->device);
    return gpu_status("random", dpc_random(t->dtype, kind, dp_tensor_numel(t), counter, key, low, range, first(t),
                                           stream_of(t->device)), t->dtype);
}

/* ---------------------------------------------------------------- reductions */

dp_status gpu_reduce(int op, dp_tensor *out, dp_tensor *indices, dp_tensor *a, int dim, int correction)
{
    dp_tensor in_view = drop(a, dim);
    dp_tensor out_view = out->ndim == a->ndim ? drop(out, dim) : *out;
    dpc_operand idx = { 0 };
    if (indices) {
        dp_tensor iv = indices->ndim == a->ndim ? drop(indices, dim) : *indices;
        idx = operand(&iv);
    }
    set_device(out->device);
    return gpu_status("reduction", dpc_reduce(op, a->dtype, out->dtype, shape_of(&out_view), operand(&out_view), idx,
                                              operand(&in_view), a->shape[dim], a->stride[dim], correction, stream_of(out->device)),
                      a->dtype);
}

dp_status gpu_softmax(dp_tensor *out, dp_tensor *a, int dim, int log)
{
    if (a->ndim == 0)
        return gpu_fill(out, log ? 0.0 : 1.0);
    dp_tensor in_view = drop(a, dim), out_view = drop(out, dim);
    set_device(out->device);
    return gpu_status("softmax", dpc_softmax(a->dtype, shape_of(&out_view), operand(&out_view), out->stride[dim],
                                             operand(&in_view), a->stride[dim], a->shape[dim], log, stream_of(out->device)), a->dtype);
}

/* ---------------------------------------------------------------- matrix products */

static int allow_tf32;

void dp_cuda_set_allow_tf32(int allow)
{
    allow_tf32 = allow != 0;
}

/* The transpose flag and leading dimension of a 2-D slice with one unit
 * stride, or 0 when it has none. */
static int64_t gemm_layout(int64_t rows, int64_t cols, int64_t rs, int64_t cs, int *trans)
{
    if (cs == 1 && (rs >= cols || rows == 1)) {
        *trans = 0;
        return rows == 1 ? (cols > 1 ? cols : 1) : rs;
    }
    if (rs == 1 && (cs >= rows || cols == 1)) {
        *trans = 1;
        return cols == 1 ? (rows > 1 ? rows : 1) : cs;
    }
    return 0;
}

/* a copy of t, contiguous, when it has no usable layout */
static dp_status gemm_operand(dp_tensor **res, dp_tensor *t, int *trans, int64_t *ld)
{
    *ld = gemm_layout(t->shape[1], t->shape[2], t->stride[1], t->stride[2], trans);
    if (*ld) {
        dp_tensor_retain(t);
        *res = t;
        return DP_OK;
    }
    dp_status st = tensor_new(res, 3, t->shape, t->dtype, t->device);
    if (!st && (st = gpu_copy(*res, t)))
        dp_tensor_release(*res);
    if (!st)
        *ld = gemm_layout((*res)->shape[1], (*res)->shape[2], (*res)->stride[1], (*res)->stride[2], trans);
    return st;
}

dp_status gpu_bmm(dp_tensor *out, dp_tensor *a, dp_tensor *b)
{
    int64_t batch = out->shape[0], m = out->shape[1], n = out->shape[2], k = a->shape[2];
    if (!dp_dtype_is_floating(out->dtype))
        return dp_fail(DP_ERR_DTYPE, "matmul: integer products are not supported on CUDA (got %s)",
                       dp_dtype_name(out->dtype));
    if (batch == 0 || m == 0 || n == 0)
        return DP_OK;
    if (k == 0)
        return gpu_fill(out, 0);
    dp_tensor *A = NULL, *B = NULL;
    int ta, tb;
    int64_t lda, ldb;
    dp_status st;
    if (!(st = gemm_operand(&A, a, &ta, &lda)) && !(st = gemm_operand(&B, b, &tb, &ldb))) {
        set_device(out->device);
        st = gpu_status("matmul", dpc_gemm(out->dtype, ta, tb, m, n, k, 1.0, first(A), lda, A->stride[0], first(B),
                                           ldb, B->stride[0], 0.0, first(out), n, m * n, batch, DPC_EPI_BIAS, NULL, NULL, allow_tf32,
                                           stream_of(out->device)), out->dtype);
    }
    dp_tensor_release(A);
    dp_tensor_release(B);
    return st;
}

/* out (M, N) = act(x (M, K) @ w (N, K)^T + b), all in one GEMM's
 * epilogue, on stream; pre (or NULL) gets the value before act */
static int linear_gemm(dp_tensor *out, dp_tensor *pre, dp_tensor *x, dp_tensor *w, dp_tensor *b, int epilogue,
                       void *stream)
{
    int64_t M = out->shape[0], N = out->shape[1], K = x->shape[1];
    set_device(out->device);
    return dpc_gemm(out->dtype, 0, 1, M, N, K, 1.0, first(x), K, 0, first(w), K, 0, 0.0, first(out), N, 0, 1,
                    epilogue, b ? first(b) : NULL, pre ? first(pre) : NULL, allow_tf32, stream);
}

static int act_epilogue(int act)
{
    return act == DP_RELU ? DPC_EPI_RELU : act == DP_GELU ? DPC_EPI_GELU : DPC_EPI_GELU_TANH;
}

/* ---------------------------------------------------------------- deferred launches */

/* A Linear small enough for our own GEMM kernel is not launched when it is
 * called. If the next op on the GPU is a ReLU or a GELU of its output, one
 * launch does both: the activation in the product's epilogue, the product
 * itself still written to the Linear's output, which Lua may read later.
 * If it is another such Linear of its output, both wait (two at most: a
 * third launches the first). If it is a cross-entropy of the last one's
 * output and they fit one block, the loss's launch computes them first
 * (gpu_cross_entropy). Each saves a launch, 4.3 us of host time on the
 * H200 host: the seed's F.relu(self.fc1(x)), self.fc2(h) and criterion
 * are one launch.
 *
 * The backward of such a Linear waits the same way when it computes dx
 * and is small enough to start a chain: if the next op is the backward of
 * the layer before, whose gradient is that dx, one launch of one block
 * computes both layers' (dpc_linear_backward's chain): the seed's fc2 and
 * fc1 backwards in one launch instead of two. The chain waits in turn,
 * and so does a lone backward: if the next op is a small SGD step on
 * their device and stream (gpu_sgd_step), the same block takes it after
 * the gradients, so that the seed's whole backward and step are one
 * launch.
 *
 * A first layer's backward (no dx) whose weight gradient cuBLASLt
 * computes leaves the bias gradient out of that call, which is then one
 * kernel instead of two, and the bias gradient waits: the next optimizer
 * step's launch makes it first when db lies in the step's flat gradient
 * buffer (gpu_sgd_step, gpu_adam_step; dpc_bias_grad in dpc_ops.h), else
 * it is launched alone, summed the same way.
 *
 * Any other work launches what waits first: every kernel and copy takes
 * its stream from stream_of, and synchronisations, stream and event calls,
 * capture boundaries and process-group submits (on the caller's thread)
 * call deferred_launch. So the device sees the calls in their order, and
 * work waits only while Lua runs between two ops; larger products are
 * launched at once, so that a long one overlaps the host's work.
 *
 * Measured on an H100 against the same build with nothing waiting: the
 * seed step takes 12.5-14.9 us eagerly against 27.1-29.6, and 9.9 against
 * 14.0 replayed from a CUDA graph. Tests turn the waiting off
 * (dp_cuda_set_deferral) to compare the bits with each op's own launch. */
enum { WAITS_NOTHING, WAITS_LINEAR, WAITS_LINEAR_BACKWARD, WAITS_BIAS_GRAD };
/* out = act(x @ w^T + b) as linear_gemm computes it (epilogue DPC_EPI_BIAS:
 * no act; pre, or NULL, gets the value before it) */
typedef struct {
    dp_tensor *x, *w, *b, *out, *pre;
    int epilogue;
} waiting_layer;
/* a Linear's backward, gpu_linear_backward's arguments */
typedef struct {
    dp_tensor *x, *w, *g, *mask, *dx, *dw, *db;
} waiting_backward;
typedef struct {
    int what;                   /* all tensors retained */
    waiting_layer layer[2];     /* WAITS_LINEAR: layer[1] reads layer[0]'s out */
    waiting_backward back[2];   /* WAITS_LINEAR_BACKWARD: back[1] (a chain) the layer before back[0], its g
                                 * back[0]'s dx; WAITS_BIAS_GRAD: back[0]'s db and g only */
    int layers;                 /* of layer or back */
    void *stream;
} waiting_work;

static pthread_mutex_t deferred_mu = PTHREAD_MUTEX_INITIALIZER;
static waiting_work deferred;   /* under deferred_mu */
static int64_t deferred_fusions;

static bool deferral_off;

int64_t dp_cuda_linear_fusions(void)
{
    return deferred_fusions;
}

void dp_cuda_set_deferral(int on)
{
    deferred_launch();
    deferral_off = !on;
}

#define LAYER_TENSORS 5
#define BACKWARD_TENSORS 7
#define WAITING_TENSORS (2 * BACKWARD_TENSORS)

static void layer_tensors(const waiting_layer *l, dp_tensor *t[LAYER_TENSORS])
{
    dp_tensor *all[LAYER_TENSORS] = { l->x, l->w, l->b, l->out, l->pre };
    memcpy(t, all, sizeof all);
}

static void backward_tensors(const waiting_backward *b, dp_tensor *t[BACKWARD_TENSORS])
{
    dp_tensor *all[BACKWARD_TENSORS] = { b->x, b->w, b->g, b->mask, b->dx, b->dw, b->db };
    memcpy(t, all, sizeof all);
}

/* w's tensors (NULL where it has none): what it retains and releases */
static void waiting_tensors(const waiting_work *w, dp_tensor *t[WAITING_TENSORS])
{
    memset(t, 0, WAITING_TENSORS * sizeof *t);
    for (int i = 0; i < w->layers; i++)
        if (w->what == WAITS_LINEAR)
            layer_tensors(&w->layer[i], t + i * LAYER_TENSORS);
        else
            backward_tensors(&w->back[i], t + i * BACKWARD_TENSORS);
}

static void retain_each(dp_tensor *const *t, int n)
{
    for (int i = 0; i < n; i++)
        if (t[i])
            dp_tensor_retain(t[i]);
}

static void layer_retain(const waiting_layer *l)
{
    dp_tensor *t[LAYER_TENSORS];
    layer_tensors(l, t);
    retain_each(t, LAYER_TENSORS);
}

static void backward_retain(const waiting_backward *b)
{
    dp_tensor *t[BACKWARD_TENSORS];
    backward_tensors(b, t);
    retain_each(t, BACKWARD_TENSORS);
}

static void waiting_retain(const waiting_work *w)
{
    dp_tensor *t[WAITING_TENSORS];
    waiting_tensors(w, t);
    retain_each(t, WAITING_TENSORS);
}

static void waiting_release(const waiting_work *w)
{
    dp_tensor *t[WAITING_TENSORS];
    waiting_tensors(w, t);
    for (int i = 0; i < WAITING_TENSORS; i++)
        dp_tensor_release(t[i]);
}

int gpu_deferred_holds(const dp_tensor *t)
{
    dp_tensor *held[WAITING_TENSORS];
    int n = 0;
    pthread_mutex_lock(&deferred_mu);
    if (deferred.what != WAITS_NOTHING) {
        waiting_tensors(&deferred, held);
        for (int i = 0; i < WAITING_TENSORS; i++)
            n += held[i] == t;
    }
    pthread_mutex_unlock(&deferred_mu);
    return n;
}

/* Makes w, whose references are held, the waiting work (nothing waits:
 * the caller asked stream_of, or took what waited). */
static void deferred_store(waiting_work w)
{
    pthread_mutex_lock(&deferred_mu);
    deferred = w;
    pthread_mutex_unlock(&deferred_mu);
}

/* The same, taking references to w's tensors. */
static void deferred_put(waiting_work w)
{
    waiting_retain(&w);
    deferred_store(w);
}

/* The waiting work, taken when there is some and fits (NULL: any) accepts
 * it; then nothing waits, and the caller launches it and releases it. */
static bool deferred_take(bool (*fits)(const waiting_work *w, const void *ctx), const void *ctx, waiting_work *taken)
{
    pthread_mutex_lock(&deferred_mu);
    bool ok = deferred.what != WAITS_NOTHING && (!fits || fits(&deferred, ctx));
    if (ok) {
        *taken = deferred;
        deferred.what = WAITS_NOTHING;
    }
    pthread_mutex_unlock(&deferred_mu);
    return ok;
}

static dpc_linear_grads linear_grads(dp_tensor *dx, dp_tensor *dw, dp_tensor *db, dp_tensor *g, dp_tensor *x,
                                     dp_tensor *w, dp_tensor *mask)
{
    return (dpc_linear_grads){ g->shape[0], g->shape[1], x->shape[1], first(g), first(x), first(w),
                               dx && mask ? first(mask) : NULL, dx ? first(dx) : NULL, dw ? first(dw) : NULL,
                               db ? first(db) : NULL };
}

static dpc_bias_grad bias_grad_of(dp_tensor *db, dp_tensor *g)
{
    return (dpc_bias_grad){ g->shape[0], g->shape[1], first(g), first(db) };
}

/* db = the column sums of g, alone on stream (as an optimizer's launch
 * sums them). A CUDA status. */
static int bias_grad_alone(dp_tensor *db, dp_tensor *g, void *stream)
{
    dpc_bias_grad b = bias_grad_of(db, g);
    return dpc_bias_grad_sum(g->dtype, &b, stream);
}

/* dx = g @ w (0 where !(mask > 0) when mask is given), dw = g^T @ x, db =
 * the column sums of g, on stream: one launch of ours up to medium sizes,
 * else two cuBLASLt GEMMs with db in dw's epilogue; but without dx, a
 * small db apart (dpc_bias_grad), left waiting for the optimizer's step
 * when bias_may_wait (nothing waits now). A CUDA status. */
static int linear_backward_on(dp_tensor *dx, dp_tensor *dw, dp_tensor *db, dp_tensor *g, dp_tensor *x, dp_tensor *w,
                              dp_tensor *mask, void *stream, bool bias_may_wait)
{
    int64_t M = g->shape[0], N = g->shape[1], K = x->shape[1];
    int st = set_device(g->device);
    if (st)
        return st;
    dpc_linear_grads layer = linear_grads(dx, dw, db, g, x, w, mask);
    int own = dpc_linear_backward(g->dtype, &layer, 1, NULL, stream);
    if (own != DPC_UNSUPPORTED)
        return own;
    if (dx)   /* dx (M, K) = g (M, N) @ w (N, K) */
        st = dpc_gemm(g->dtype, 0, 0, M, K, N, 1.0, first(g), N, 0, first(w), K, 0, 0.0, first(dx), K, 0, 1,
                      DPC_EPI_BIAS, NULL, NULL, allow_tf32, stream);
    if (!st && dx && mask)   /* the ReLU's backward, in place */
        st = dpc_unary_backward(DP_RELU, dx->dtype, shape_of(dx), operand(dx), operand(dx), operand(mask),
                                operand(mask), stream);
    /* (where our kernel takes dw, its epilogue sums db for nothing) */
    const bool bias_apart = !dx && dw && db && !dpc_gemm_own(N, K, M, 1) && dpc_bias_grad_fits(M, N);
    if (!st && dw)   /* dw (N, K) = g^T (N, M) @ x (M, K); db = the row sums of g^T */
        st = dpc_gemm(g->dtype, 1, 0, N, K, M, 1.0, first(g), N, 0, first(x), K, 0, 0.0, first(dw), K, 0, 1,
                      db && !bias_apart ? DPC_EPI_BGRAD : DPC_EPI_BIAS, db && !bias_apart ? first(db) : NULL, NULL,
                      allow_tf32, stream);
    if (!st && bias_apart && bias_may_wait)
        deferred_put((waiting_work){ .what = WAITS_BIAS_GRAD, .back[0] = { .g = g, .db = db }, .layers = 1,
                                     .stream = stream });
    else if (!st && bias_apart)
        st = bias_grad_alone(db, g, stream);
    else if (!st && db && !dw) {
        dpc_shape s = { 1, { N } };
        dpc_operand o = { .data = first(db), .stride = { 1 } }, in = { .data = first(g), .stride = { 1 } }, none = { 0 };
        st = dpc_reduce(DP_SUM, g->dtype, db->dtype, s, o, none, in, M, N, 0, stream);
    }
    return st;
}

static int layer_launch(const waiting_layer *l, void *stream)
{
    return linear_gemm(l->out, l->pre, l->x, l->w, l->b, l->epilogue, stream);
}

static dpc_linear_grads backward_grads(const waiting_backward *b)
{
    return linear_grads(b->dx, b->dw, b->db, b->g, b->x, b->w, b->mask);
}

/* The layers of the waiting backward w, as dpc_linear_backward takes them */
static void waiting_grads(const waiting_work *w, dpc_linear_grads grads[2])
{
    for (int i = 0; i < w->layers; i++)
        grads[i] = backward_grads(&w->back[i]);
}

/* The waiting backward w (one layer, or a chain of two in one launch),
 * then the SGD step sgd in the same launch when it is given (gpu_sgd_step
 * asked dpc_linear_backward_takes_sgd). A CUDA status. */
static int backward_launch(const waiting_work *w, const dpc_sgd_args *sgd)
{
    const waiting_backward *b = &w->back[0];
    if (w->layers == 1 && !sgd)
        return linear_backward_on(b->dx, b->dw, b->db, b->g, b->x, b->w, b->mask, w->stream, false);
    dpc_linear_grads grads[2];
    waiting_grads(w, grads);
    int rc = set_device(b->g->device);
    return rc ? rc : dpc_linear_backward(b->g->dtype, grads, w->layers, sgd, w->stream);
}

/* Launches the waiting work, if any, leaving the current device as it
 * was (the caller may have set another for its own work). A failure is
 * kept for the next op's gpu_status to report, since the caller may not
 * return a status. */
static void deferred_run(waiting_work *w)
{
    int device = -1;
    (void)dpc_get_device(&device);
    bool forward = w->what == WAITS_LINEAR;
    int rc = 0;
    for (int i = 0; forward && !rc && i < w->layers; i++)
        rc = layer_launch(&w->layer[i], w->stream);
    if (w->what == WAITS_LINEAR_BACKWARD)
        rc = backward_launch(w, NULL);
    if (w->what == WAITS_BIAS_GRAD) {
        rc = set_device(w->back[0].g->device);
        rc = rc ? rc : bias_grad_alone(w->back[0].db, w->back[0].g, w->stream);
    }
    if (device >= 0)
        set_device(device);
    const char *what = forward ? "linear"
                       : w->what == WAITS_BIAS_GRAD ? "linear backward (the bias gradient)"
                       : w->layers == 2 ? "linear backward (two layers in one launch)"
                                        : "linear backward";
    if (rc && !deferred_failure[0] && gpu_status(what, rc, (forward ? w->layer[0].x : w->back[0].g)->dtype))
        snprintf(deferred_failure, sizeof deferred_failure, "%s", dp_last_error());
    waiting_release(w);
}

/* Launches the first n of the waiting Linears w (taken), the rest staying in w. */
static void layers_launch(waiting_work *w, int n)
{
    if (n == 0)
        return;
    waiting_work head = { .what = WAITS_LINEAR, .layers = n, .stream = w->stream };
    memcpy(head.layer, w->layer, (size_t)n * sizeof *w->layer);
    deferred_run(&head);
    memmove(w->layer, w->layer + n, (size_t)(w->layers - n) * sizeof *w->layer);
    w->layers -= n;
}

static void deferred_launch(void)
{
    waiting_work w;
    if (deferred_take(NULL, NULL, &w))
        deferred_run(&w);
}

void dp_cuda_launch_deferred(void)
{
    deferred_launch();
}

static bool queued_on(const waiting_work *w, const void *stream)
{
    return w->stream == stream;
}

/* The same, only when the waiting work is queued for stream. */
static void deferred_launch_on(void *stream)
{
    waiting_work w;
    if (deferred_take(queued_on, stream, &w))
        deferred_run(&w);
}

static bool same_matrix(const dp_tensor *a, const dp_tensor *y)
{
    return a->storage == y->storage && a->offset == y->offset && a->dtype == y->dtype && a->ndim == 2 &&
           a->shape[0] == y->shape[0] && a->shape[1] == y->shape[1] && tensor_is_contiguous(a);
}

static const waiting_layer *last_layer(const waiting_work *w)
{
    return &w->layer[w->layers - 1];
}

/* The waiting Linears end in ctx (a matrix) on the current stream. */
static bool ends_in(const waiting_work *w, const void *ctx)
{
    const dp_tensor *t = ctx;
    return w->what == WAITS_LINEAR && w->stream == stream_now(t->device) && same_matrix(t, last_layer(w)->out);
}

/* out = act(x @ w^T + b): waits when our kernel takes it, after the waiting
 * Linears when x is the last one's output, else alone. */
static dp_status linear_enqueue(waiting_layer l)
{
    dp_tensor *out = l.out;
    int64_t M = out->shape[0], N = out->shape[1], K = l.x->shape[1];
    bool waits = !deferral_off && M > 0 && N > 0 && K > 0 && dpc_gemm_own(M, N, K, 1);
    waiting_work w;
    if (waits && !deferred_failure[0] && deferred_take(ends_in, l.x, &w)) {
        layers_launch(&w, w.layers == 2 ? 1 : 0);   /* two wait at most */
        if (deferred_failure[0]) {   /* that one failed: the other goes too, and this one fails */
            deferred_run(&w);
            return gpu_status("linear", 0, out->dtype);
        }
        layer_retain(&l);
        w.layer[w.layers++] = l;
        deferred_store(w);
        return DP_OK;
    }
    void *stream = stream_of(out->device);   /* after the work waiting, if any */
    if (deferred_failure[0])   /* that one failed: say so now, and launch or defer nothing */
        return gpu_status("linear", 0, out->dtype);
    if (!waits)
        return gpu_status("linear", layer_launch(&l, stream), out->dtype);
    deferred_put((waiting_work){ .what = WAITS_LINEAR, .layer[0] = l, .layers = 1, .stream = stream });
    return DP_OK;
}

dp_status gpu_linear(dp_tensor *out, dp_tensor *x, dp_tensor *w, dp_tensor *b)
{
    return linear_enqueue((waiting_layer){ .x = x, .w = w, .b = b, .out = out, .epilogue = DPC_EPI_BIAS });
}

dp_status gpu_linear_act(dp_tensor *out, dp_tensor *pre, dp_tensor *x, dp_tensor *w, dp_tensor *b, int act)
{
    return linear_enqueue((waiting_layer){ .x = x, .w = w, .b = b, .out = out, .pre = pre,
                                           .epilogue = act_epilogue(act) });
}

/* The waiting Linears end in the loss's input (ctx), the last without an
 * activation after it. */
static bool takes_output(const waiting_work *w, const void *ctx)
{
    return ends_in(w, ctx) && last_layer(w)->epilogue == DPC_EPI_BIAS;
}

typedef struct {
    const dp_tensor *out, *a;
} activation_of;

/* out = act(a) fits the last waiting Linear's epilogue: a is its output,
 * it has no activation yet, and out is a itself or a new tensor (not one
 * the product reads). */
static bool fits_epilogue(const waiting_work *w, const void *ctx)
{
    const dp_tensor *out = ((const activation_of *)ctx)->out, *a = ((const activation_of *)ctx)->a;
    if (w->what != WAITS_LINEAR)
        return false;
    const waiting_layer *l = last_layer(w);
    const dp_tensor *y = l->out;
    return l->epilogue == DPC_EPI_BIAS && same_matrix(a, y) && out->dtype == y->dtype && out->ndim == 2 &&
           tensor_is_contiguous(out) && out->shape[0] == y->shape[0] && out->shape[1] == y->shape[1] &&
           (out->storage == y->storage ? out->offset == y->offset
                                       : out->storage != l->x->storage && out->storage != l->w->storage &&
                                             (!l->b || out->storage != l->b->storage));
}

/* out = op(a) as the epilogue of the waiting Linear whose output a is,
 * when op is a ReLU or GELU: then both still wait; false (nothing done)
 * otherwise. */
static bool deferred_fuse(int op, dp_tensor *out, dp_tensor *a, dp_status *st)
{
    waiting_work w;
    if ((op != DP_RELU && op != DP_GELU && op != DP_GELU_TANH) ||
        !deferred_take(fits_epilogue, &(activation_of){ out, a }, &w))
        return false;
    waiting_layer *l = &w.layer[w.layers - 1];
    if (out->storage != l->out->storage) {   /* the product stays in a, the activation goes to out */
        dp_tensor_retain(out);
        l->pre = l->out;
        l->out = out;
    }
    l->epilogue = act_epilogue(op);
    deferred_fusions++;
    deferred_store(w);
    *st = DP_OK;
    return true;
}

typedef struct {
    const dp_tensor *g;            /* this backward's gradient */
    dpc_linear_grads layer;        /* this backward's */
} chain_of;

/* The waiting backward and this one (ctx) make a chain: the waiting one's
 * dx is this one's gradient, on the same stream, and one block takes both. */
static bool chains_after(const waiting_work *w, const void *ctx)
{
    const chain_of *c = ctx;
    const waiting_backward *b = &w->back[0];
    if (w->what != WAITS_LINEAR_BACKWARD || w->layers != 1 || !b->dx || !same_matrix(c->g, b->dx) ||
        w->stream != stream_now(c->g->device))
        return false;
    dpc_linear_grads layer[2] = { backward_grads(b), c->layer };
    return dpc_linear_backward_chains(layer);
}

/* dx = g @ w (0 where !(mask > 0) when mask is given), dw = g^T @ x, db =
 * the column sums of g. When g is the dx of the waiting backward of the
 * layer after this one, the two make a chain, one launch of one block,
 * which waits in turn for an SGD step to take (gpu_sgd_step). Else this
 * one waits for the layer before when it may start a chain; or, a first
 * layer's, launches dw and leaves db waiting for the optimizer
 * (linear_backward_on). */
dp_status gpu_linear_backward(dp_tensor *dx, dp_tensor *dw, dp_tensor *db, dp_tensor *g, dp_tensor *x, dp_tensor *w,
                              dp_tensor *mask)
{
    waiting_backward this = { .x = x, .w = w, .g = g, .mask = mask, .dx = dx, .dw = dw, .db = db };
    chain_of chain = { .g = g, .layer = backward_grads(&this) };
    waiting_work after;
    if (deferred_take(chains_after, &chain, &after)) {
        backward_retain(&this);
        after.back[after.layers++] = this;
        deferred_fusions++;
        deferred_store(after);
        return DP_OK;
    }
    void *stream = stream_of(g->device);   /* after the work waiting, if any */
    if (deferred_failure[0])
        return gpu_status("linear backward", 0, g->dtype);
    if (!deferral_off && dx && dpc_linear_backward_may_chain(&chain.layer)) {
        deferred_put((waiting_work){ .what = WAITS_LINEAR_BACKWARD, .back[0] = this, .layers = 1, .stream = stream });
        return DP_OK;
    }
    return gpu_status("linear backward", linear_backward_on(dx, dw, db, g, x, w, mask, stream, !deferral_off),
                      g->dtype);
}

/* ---------------------------------------------------------------- indexing */

/* a contiguous (outer, size, inner) reading of t around dim */
static void around(const dp_tensor *t, int dim, int64_t *outer, int64_t *size, int64_t *inner)
{
    *outer = *inner = 1;
    for (int i = 0; i < dim; i++) *outer *= t->shape[i];
    for (int i = dim + 1; i < t->ndim; i++) *inner *= t->shape[i];
    *size = t->ndim ? t->shape[dim] : 1;
}

/* int64, contiguous, on the device of `like` */
static dp_status device_index(dp_tensor **res, dp_tensor *index, const dp_tensor *like)
{
    dp_tensor *c;
    dp_status st = dp_to(&c, index, DP_INT64, like->device);
    if (st)
        return st;
    st = dp_contiguous(res, c);
    dp_tensor_release(c);
    return st;
}

dp_status gpu_index_select(dp_tensor *out, dp_tensor *a, int dim, dp_tensor *index)
{
    dp_tensor *ac = NULL, *idx = NULL;
    int64_t outer, size, inner, n = dp_tensor_numel(index);
    dp_status st;
    if (!(st = dp_contiguous(&ac, a)) && !(st = device_index(&idx, index, a))) {
        around(ac, dim, &outer, &size, &inner);
        set_device(a->device);
        st = gpu_status("index_select", dpc_index_select(a->dtype, outer, size, inner, first(ac), first(idx), n,
                                                         first(out), kerr(), stream_of(a->device)), a->dtype);
    }
    dp_tensor_release(ac);
    dp_tensor_release(idx);
    return st;
}

dp_status gpu_index_add(dp_tensor *out, int dim, dp_tensor *index, dp_tensor *src)
{
    dp_tensor *sc = NULL, *idx = NULL;
    int64_t outer, size, inner;
    dp_status st;
    if (!tensor_is_contiguous(out))
        return dp_fail(DP_ERR_ARG, "index_add: internal error: the destination must be contiguous");
    if (!(st = dp_contiguous(&sc, src)) && !(st = device_index(&idx, index, out))) {
        around(out, dim, &outer, &size, &inner);
        set_device(out->device);
        st = gpu_status("index_add", dpc_index_add(out->dtype, outer, size, inner, first(out), first(idx),
                                                   dp_tensor_numel(index), first(sc), stream_of(out->device)),
                        out->dtype);
    }
    dp_tensor_release(sc);
    dp_tensor_release(idx);
    return st;
}

dp_status gpu_gather(dp_tensor *out, dp_tensor *a, int dim, dp_tensor *index)
{
    dp_tensor *idx = NULL;
    dp_status st = dp_to(&idx, index, DP_INT64, a->device);
    if (!st) {
        set_device(a->device);
        st = gpu_status("gather", dpc_gather(a->dtype, shape_of(idx), operand(out), operand(a), operand(idx), dim,
                                             a->ndim ? a->shape[dim] : 1, kerr(), stream_of(a->device)), a->dtype);
    }
    dp_tensor_release(idx);
    return st;
}

/* integer scatter_add (no atomicAdd for it here) runs on host copies */
static dp_status scatter_add_on_host(dp_tensor *out, int dim, dp_tensor *index, dp_tensor *src)
{
    dp_tensor *ho = NULL, *hi = NULL, *hs = NULL;
    dp_status st;
    if (!(st = dp_to(&ho, out, out->dtype, DP_CPU)) && !(st = dp_to(&hi, index, index->dtype, DP_CPU)) &&
        !(st = dp_to(&hs, src, src->dtype, DP_CPU)) && !(st = cpu_scatter_add(ho, dim, hi, hs)))
        st = gpu_copy(out, ho);
    dp_tensor_release(ho);
    dp_tensor_release(hi);
    dp_tensor_release(hs);
    return st;
}

dp_status gpu_scatter_add(dp_tensor *out, int dim, dp_tensor *index, dp_tensor *src)
{
    if (!dp_dtype_is_floating(out->dtype))
        return scatter_add_on_host(out, dim, index, src);
    dp_tensor *idx = NULL;
    dp_status st = dp_to(&idx, index, DP_INT64, out->device);
    if (!st) {
        set_device(out->device);
        st = gpu_status("scatter_add", dpc_scatter_add(out->dtype, shape_of(idx), operand(out), operand(idx),
                                                       operand(src), dim, out->ndim ? out->shape[dim] : 1, kerr(),
                                                       stream_of(out->device)), out->dtype);
    }
    dp_tensor_release(idx);
    return st;
}

/* ---------------------------------------------------------------- cross-entropy */

/* All on the device: a bad target is found by the kernel and reported at
 * the next synchronisation (a host check would cost a round trip per
 * step and could not be captured in a CUDA graph). */
bool gpu_cross_entropy_fuses(const dp_tensor *input)
{
    return dpc_cross_entropy_fuses(input->shape[0], input->shape[1]) != 0;
}

/* The waiting Linears from layer `from` on, as the loss's launch takes them. */
static dpc_ce_linear ce_layers(const waiting_work *w, int from)
{
    dpc_ce_linear c = { .layers = w->layers - from };
    for (int i = from; i < w->layers; i++) {
        const waiting_layer *l = &w->layer[i];
        c.layer[i - from] = (dpc_ce_layer){ first(l->x), first(l->w), l->b ? first(l->b) : NULL, first(l->out),
                                            l->pre ? first(l->pre) : NULL, l->x->shape[1], l->epilogue };
    }
    return c;
}

/* The loss; when its input is the output of the waiting Linears (a
 * classifier's head, or its last two layers) and they fit one block, they
 * run in the loss's launch: a launch less for each, as with a ReLU after
 * one. The ones that do not fit are launched first. */
dp_status gpu_cross_entropy(dp_tensor *out, cpu_ce_args *a)
{
    int64_t N = a->input->shape[0], C = a->input->shape[1];
    dp_tensor *rows = NULL;
    waiting_work lin;
    int done = 0;
    dp_status st = tensor_new(&rows, 1, &N, DP_FLOAT64, a->input->device);
    bool with_linear = !st && deferred_take(takes_output, a->input, &lin);
    dpc_ce_linear linear = { .layers = 0 };
    if (with_linear) {
        int from = 0;
        for (; from < lin.layers; from++) {
            linear = ce_layers(&lin, from);
            if (dpc_cross_entropy_takes_linear(a->input->dtype, N, C, &linear))
                break;
        }
        layers_launch(&lin, from);
        with_linear = lin.layers > 0;
    }
    if (!st) {
        set_device(a->input->device);
        st = gpu_status(with_linear ? "linear and cross_entropy" : "cross_entropy",
                        dpc_cross_entropy(a->input->dtype, N, C, first(a->input), first(a->target),
                                          a->weight ? first(a->weight) : NULL, a->ignore_index, a->label_smoothing,
                                          a->log_probs, a->reduction, first(rows),
                                          a->probs ? first(a->probs) : NULL, first(out), first(a->denom),
                                          a->grad_one ? first(a->grad_one) : NULL, &done,
                                          with_linear ? &linear : NULL, kerr(), stream_of(a->input->device)),
                        a->input->dtype);
    }
    if (with_linear) {
        if (st) {   /* the Linears' outputs are Lua's too: give them their values */
            layers_launch(&lin, lin.layers);
        } else {
            deferred_fusions += lin.layers;
            waiting_release(&lin);
        }
    }
    a->grad_one_done = !st && done;
    dp_tensor_release(rows);
    return st;
}

dp_status gpu_cross_entropy_backward(dp_tensor *dinput, dp_tensor *g, const cpu_ce_args *a)
{
    int64_t N = dinput->shape[0], C = dinput->shape[1];
    set_device(dinput->device);
    return gpu_status("cross_entropy backward",
                      dpc_cross_entropy_backward(dinput->dtype, N, C, first(dinput), a->probs ? first(a->probs) : NULL,
                                                 first(a->target), a->weight ? first(a->weight) : NULL,
                                                 a->ignore_index, a->label_smoothing, a->log_probs, a->reduction,
                                                 first(g), first(a->denom), stream_of(dinput->device)),
                      dinput->dtype);
}

/* ---------------------------------------------------------------- unfold, optimizers */

dp_status gpu_unfold(dp_tensor *cols, dp_tensor *x, const cpu_unfold_args *u)
{
    set_device(x->device);
    return gpu_status("unfold", dpc_unfold(x->dtype, x->shape[0], x->shape[1], x->shape[2], x->shape[3], u->kernel,
                                           u->stride, u->padding, u->dilation, u->out_h, u->out_w, first(x),
                                           first(cols), u->pad_value, stream_of(x->device)), x->dtype);
}

dp_status gpu_fold_add(dp_tensor *x, dp_tensor *cols, const cpu_unfold_args *u)
{
    set_device(x->device);
    return gpu_status("unfold backward", dpc_fold_add(x->dtype, x->shape[0], x->shape[1], x->shape[2], x->shape[3],
                                                      u->kernel, u->stride, u->padding, u->dilation, u->out_h,
                                                      u->out_w, first(x), first(cols), stream_of(x->device)), x->dtype);
}

typedef struct {
    const dp_tensor *p;       /* the parameters */
    const dpc_sgd_args *a;    /* the step */
} sgd_of;

/* The waiting backward can take the SGD step ctx in its launch: on the
 * parameters' device and stream, of their dtype, and it fits one block
 * (dpc_linear_backward_takes_sgd). */
static bool takes_sgd(const waiting_work *w, const void *ctx)
{
    const sgd_of *o = ctx;
    const dp_tensor *g = w->back[0].g;
    if (w->what != WAITS_LINEAR_BACKWARD || g->device != o->p->device || w->stream != stream_now(o->p->device) ||
        g->dtype != o->p->dtype)
        return false;
    dpc_linear_grads grads[2];
    waiting_grads(w, grads);
    return dpc_linear_backward_takes_sgd(o->p->dtype, grads, w->layers, o->a);
}

/* An optimizer's step over flat buffers: parameters p, gradients g and
 * its state (a momentum buffer, Adam's moments; NULL where none). */
typedef struct {
    const dp_tensor *p, *g, *state[3];
} step_of;

/* The waiting bias gradient can be made in the launch of the step ctx:
 * on its device, stream and dtype, db inside the step's gradients, and
 * the layer's gradient none of the step's buffers. */
static bool bias_in_step(const waiting_work *w, const void *ctx)
{
    const step_of *o = ctx;
    const dp_tensor *db = w->back[0].db, *lg = w->back[0].g, *p = o->p, *g = o->g;
    if (w->what != WAITS_BIAS_GRAD || lg->device != p->device || w->stream != stream_now(p->device) ||
        lg->dtype != p->dtype || g->dtype != p->dtype || db->storage != g->storage || !tensor_is_contiguous(db) ||
        !tensor_is_contiguous(g))
        return false;
    const dp_tensor *buffers[5] = { p, g, o->state[0], o->state[1], o->state[2] };
    for (int i = 0; i < 5; i++)
        if (buffers[i] && buffers[i]->storage == lg->storage)
            return false;
    const ptrdiff_t at = (const char *)first(db) - (const char *)first(g);
    const ptrdiff_t size = (ptrdiff_t)dp_dtype_size(g->dtype);
    return at >= 0 && at % size == 0 && at / size + dp_tensor_numel(db) <= dp_tensor_numel(g);
}

/* The waiting bias gradient, taken into *taken and described in *b, when
 * the step o can make it in its launch (bias_in_step); else NULL. */
static const dpc_bias_grad *bias_for_step(step_of o, waiting_work *taken, dpc_bias_grad *b)
{
    if (!deferred_take(bias_in_step, &o, taken))
        return NULL;
    *b = bias_grad_of(taken->back[0].db, taken->back[0].g);
    return b;
}

/* After the step's launch (status rc) that took the bias gradient `taken`. */
static void bias_step_done(waiting_work *taken, int rc)
{
    deferred_fusions += !rc;
    waiting_release(taken);
}

/* The step over the flat buffers p, g (and buf); in the launch of the
 * backward that waits, when it computed the last gradients and can take
 * it (the seed's chain of two Linears and its step: one launch); after
 * the first layer's bias gradient in the step's own launch when that
 * waits. */
dp_status gpu_sgd_step(dp_tensor *p, dp_tensor *g, dp_tensor *buf, double lr, double momentum,
                       double dampening, int nesterov, double weight_decay, int first_step)
{
    const dpc_sgd_args a = { dp_tensor_numel(p), first(p), first(g), buf ? first(buf) : NULL, lr, momentum,
                             dampening, weight_decay, nesterov, first_step };
    waiting_work back;
    if (deferred_take(takes_sgd, &(sgd_of){ p, &a }, &back)) {
        int rc = backward_launch(&back, &a);
        if (!rc)
            deferred_fusions++;
        waiting_release(&back);
        return gpu_status(back.layers == 2 ? "linear backward (two layers) and sgd_step in one launch"
                                           : "linear backward and sgd_step in one launch", rc, p->dtype);
    }
    waiting_work bias;
    dpc_bias_grad b;
    const dpc_bias_grad *first_bias = bias_for_step((step_of){ p, g, { buf } }, &bias, &b);
    set_device(p->device);
    int rc = dpc_sgd_step(p->dtype, &a, first_bias, stream_of(p->device));
    if (first_bias)
        bias_step_done(&bias, rc);
    return gpu_status(first_bias ? "sgd_step with the first layer's bias gradient" : "sgd_step", rc, p->dtype);
}

/* Adam's step; after the first layer's bias gradient in its launch when
 * that waits (as gpu_sgd_step). */
dp_status gpu_adam_step(dp_tensor *p, dp_tensor *g, dp_tensor *m, dp_tensor *v, dp_tensor *vmax, double lr,
                        double beta1, double beta2, double eps, double weight_decay, int decoupled, int64_t step,
                        dp_tensor *step_t)
{
    waiting_work bias;
    dpc_bias_grad b;
    const dpc_bias_grad *first_bias = bias_for_step((step_of){ p, g, { m, v, vmax } }, &bias, &b);
    set_device(p->device);
    int rc = dpc_adam_step(p->dtype, dp_tensor_numel(p), first(p), first(g), first(m), first(v),
                           vmax ? first(vmax) : NULL, lr, beta1, beta2, eps, weight_decay, decoupled, step,
                           step_t ? (double *)first(step_t) : NULL, first_bias, stream_of(p->device));
    if (first_bias)
        bias_step_done(&bias, rc);
    return gpu_status(first_bias ? "adam_step with the first layer's bias gradient" : "adam_step", rc, p->dtype);
}

#else /* no CUDA in this build: no tensor can be on a GPU, but say so clearly */

static dp_status no_cuda(void)
{
    return dp_fail(DP_ERR_DEVICE, "this build of dplua has no CUDA backend (configure --with-cuda)");
}

dp_status gpu_storage_alloc(void **data, void **pool, size_t nbytes, int device)
{
    (void)data; (void)pool; (void)nbytes; (void)device;
    return no_cuda();
}
void gpu_storage_free(void *data, size_t nbytes, void *pool, int device)
{
    (void)data;
    (void)nbytes;
    (void)pool;
    (void)device;
}
int dp_cuda_capturing(void) { return 0; }
int64_t dp_cuda_linear_fusions(void) { return 0; }
void dp_cuda_set_deferral(int on) { (void)on; }
void dp_cuda_launch_deferred(void) {}
dp_status dp_cuda_stream_new(void **stream, int device) { *stream = NULL; (void)device; return no_cuda(); }
dp_status dp_cuda_empty_cache(int device) { (void)device; return DP_OK; }
dp_status dp_cuda_memory_reserved(int device, int64_t *now, int64_t *peak)
{ (void)device; *now = *peak = 0; return no_cuda(); }
dp_status dp_cuda_mem_get_info(int device, int64_t *free_bytes, int64_t *total_bytes)
{ (void)device; *free_bytes = *total_bytes = 0; return no_cuda(); }
dp_status dp_cuda_device_properties(int device, char *name, size_t name_len, int64_t *total_memory, int *major,
                                    int *minor, int *multiprocessors)
{
    (void)device; (void)name_len;
    name[0] = 0;
    *total_memory = 0;
    *major = *minor = *multiprocessors = 0;
    return no_cuda();
}
void dp_cuda_stream_free(void *stream) { (void)stream; }
dp_status dp_cuda_set_stream(int device, void *stream) { (void)device; (void)stream; return no_cuda(); }
void *dp_cuda_current_stream(int device) { (void)device; return NULL; }
dp_status dp_cuda_stream_synchronize(void *stream) { (void)stream; return no_cuda(); }
dp_status dp_cuda_stream_query(void *stream, int *done) { (void)stream; *done = 1; return no_cuda(); }
dp_status dp_cuda_stream_wait_event(void *stream, void *event) { (void)stream; (void)event; return no_cuda(); }
dp_status dp_cuda_event_new(void **event, int device, int timing)
{ *event = NULL; (void)device; (void)timing; return no_cuda(); }
void dp_cuda_event_free(void *event) { (void)event; }
dp_status dp_cuda_event_record(void *event, void *stream) { (void)event; (void)stream; return no_cuda(); }
dp_status dp_cuda_event_synchronize(void *event) { (void)event; return no_cuda(); }
dp_status dp_cuda_event_query(void *event, int *done) { (void)event; *done = 1; return no_cuda(); }
dp_status dp_cuda_event_elapsed(double *ms, void *start, void *end)
{ *ms = 0; (void)start; (void)end; return no_cuda(); }
dp_status dp_cuda_graph_begin(dp_cuda_graph **out, int device) { *out = NULL; (void)device; return no_cuda(); }
dp_status dp_cuda_graph_end(dp_cuda_graph *g, int keep) { (void)g; (void)keep; return no_cuda(); }
dp_status dp_cuda_graph_replay(dp_cuda_graph *g) { (void)g; return no_cuda(); }
void dp_cuda_graph_free(dp_cuda_graph *g) { (void)g; }
dp_status gpu_memcpy(void *dst, const void *src, size_t bytes, int kind, int device)
{ (void)dst; (void)src; (void)bytes; (void)kind; (void)device; return no_cuda(); }
int dp_cuda_device_count(void) { return 0; }
dp_status dp_cuda_synchronize(int device) { (void)device; return no_cuda(); }
void dp_cuda_set_allow_tf32(int allow) { (void)allow; }
dp_status gpu_unary(int op, dp_tensor *out, dp_tensor *a) { (void)op; (void)out; (void)a; return no_cuda(); }
dp_status gpu_binary(int op, dp_tensor *out, dp_tensor *a, dp_tensor *b)
{ (void)op; (void)out; (void)a; (void)b; return no_cuda(); }
dp_status gpu_unary_backward(int op, dp_tensor *dx, dp_tensor *g, dp_tensor *x, dp_tensor *y)
{ (void)op; (void)dx; (void)g; (void)x; (void)y; return no_cuda(); }
dp_status gpu_where(dp_tensor *out, dp_tensor *cond, dp_tensor *a, dp_tensor *b)
{ (void)out; (void)cond; (void)a; (void)b; return no_cuda(); }
dp_status gpu_clamp(dp_tensor *out, dp_tensor *a, double lo, double hi)
{ (void)out; (void)a; (void)lo; (void)hi; return no_cuda(); }
dp_status gpu_copy(dp_tensor *dst, dp_tensor *src) { (void)dst; (void)src; return no_cuda(); }
dp_status gpu_fill(dp_tensor *dst, double value) { (void)dst; (void)value; return no_cuda(); }
bool gpu_any(int what, dp_tensor *t) { (void)what; (void)t; return false; }
int gpu_deferred_holds(const dp_tensor *t) { (void)t; return 0; }
dp_status gpu_random(dp_tensor *t, int kind, uint64_t counter, uint64_t key, int64_t low, uint64_t range)
{ (void)t; (void)kind; (void)counter; (void)key; (void)low; (void)range; return no_cuda(); }
dp_status gpu_reduce(int op, dp_tensor *out, dp_tensor *indices, dp_tensor *a, int dim, int correction)
{ (void)op; (void)out; (void)indices; (void)a; (void)dim; (void)correction; return no_cuda(); }
dp_status gpu_softmax(dp_tensor *out, dp_tensor *a, int dim, int log)
{ (void)out; (void)a; (void)dim; (void)log; return no_cuda(); }
dp_status gpu_bmm(dp_tensor *out, dp_tensor *a, dp_tensor *b) { (void)out; (void)a; (void)b; return no_cuda(); }
dp_status gpu_linear(dp_tensor *out, dp_tensor *x, dp_tensor *w, dp_tensor *b)
{ (void)out; (void)x; (void)w; (void)b; return no_cuda(); }
dp_status gpu_linear_backward(dp_tensor *dx, dp_tensor *dw, dp_tensor *db, dp_tensor *g, dp_tensor *x, dp_tensor *w,
                              dp_tensor *mask)
{ (void)dx; (void)dw; (void)db; (void)g; (void)x; (void)w; (void)mask; return no_cuda(); }
dp_status gpu_linear_act(dp_tensor *out, dp_tensor *pre, dp_tensor *x, dp_tensor *w, dp_tensor *b, int act)
{ (void)out; (void)pre; (void)x; (void)w; (void)b; (void)act; return no_cuda(); }
dp_status gpu_index_select(dp_tensor *out, dp_tensor *a, int dim, dp_tensor *index)
{ (void)out; (void)a; (void)dim; (void)index; return no_cuda(); }
dp_status gpu_index_add(dp_tensor *out, int dim, dp_tensor *index, dp_tensor *src)
{ (void)out; (void)dim; (void)index; (void)src; return no_cuda(); }
dp_status gpu_gather(dp_tensor *out, dp_tensor *a, int dim, dp_tensor *index)
{ (void)out; (void)a; (void)dim; (void)index; return no_cuda(); }
dp_status gpu_scatter_add(dp_tensor *out, int dim, dp_tensor *index, dp_tensor *src)
{ (void)out; (void)dim; (void)index; (void)src; return no_cuda(); }
dp_status gpu_cross_entropy(dp_tensor *out, cpu_ce_args *a) { (void)out; (void)a; return no_cuda(); }
bool gpu_cross_entropy_fuses(const dp_tensor *input) { (void)input; return false; }
dp_status gpu_cross_entropy_backward(dp_tensor *dinput, dp_tensor *g, const cpu_ce_args *a)
{ (void)dinput; (void)g; (void)a; return no_cuda(); }
dp_status gpu_unfold(dp_tensor *cols, dp_tensor *x, const cpu_unfold_args *u)
{ (void)cols; (void)x; (void)u; return no_cuda(); }
dp_status gpu_fold_add(dp_tensor *x, dp_tensor *cols, const cpu_unfold_args *u)
{ (void)x; (void)cols; (void)u; return no_cuda(); }
dp_status gpu_sgd_step(dp_tensor *p, dp_tensor *g, dp_tensor *buf, double lr, double momentum,
                       double dampening, int nesterov, double weight_decay, int first_step)
{
    (void)p; (void)g; (void)buf; (void)lr; (void)momentum; (void)dampening; (void)nesterov; (void)weight_decay;
    (void)first_step;
    return no_cuda();
}
dp_status gpu_adam_step(dp_tensor *p, dp_tensor *g, dp_tensor *m, dp_tensor *v, dp_tensor *vmax, double lr,
                        double beta1, double beta2, double eps, double weight_decay, int decoupled, int64_t step,
                        dp_tensor *step_t)
{
    (void)p; (void)g; (void)m; (void)v; (void)vmax; (void)lr; (void)beta1; (void)beta2; (void)eps;
    (void)weight_decay; (void)decoupled; (void)step; (void)step_t;
    return no_cuda();
}

#endif
