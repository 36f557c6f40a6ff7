/*
 * tensor.c — storage and tensor lifetime, inspection, views and the
 * creation functions that need no kernels beyond a fill.
 */
#include "dplua_internal.h"
#include "core/autograd.h"
#include "core/kernels.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- memory */

/* bytes held by tensors, per device: [0] the CPU, [1 + d] cuda:d */
#define MAX_DEVICES 64
static int64_t bytes_in_use[MAX_DEVICES + 1], bytes_peak[MAX_DEVICES + 1];
#define cpu_bytes_in_use (bytes_in_use[0])

static int64_t *in_use_of(int device)
{
    return device >= DP_CPU && device < MAX_DEVICES ? &bytes_in_use[device + 1] : NULL;
}

static void account(int device, int64_t delta)
{
    int64_t *u = in_use_of(device);
    if (!u)
        return;
    *u += delta;
    if (*u > bytes_peak[device + 1])
        bytes_peak[device + 1] = *u;
}

int64_t dp_memory_allocated(int device)
{
    int64_t *u = in_use_of(device);
    return u ? *u : 0;
}

int64_t dp_max_memory_allocated(int device)
{
    return in_use_of(device) ? bytes_peak[device + 1] : 0;
}

void dp_reset_peak_memory_stats(int device)
{
    if (in_use_of(device))
        bytes_peak[device + 1] = *in_use_of(device);
}

/* Tensors die when Lua's GC finalizes their handles, and Lua does not see
 * their size; so the binding asks after each op whether enough has been
 * allocated since the last collection to make one worthwhile: more than
 * the bytes that were in use then, and at least 64 MiB; or a number of
 * storages, however small: GC_EVERY_BLOCKS, or 8 per KB of Lua heap after
 * the last collection when that is more.
 *
 * The count is for small models, whose steps make many small tensors:
 * - On a GPU a block that dies in Lua's hands returns to the small-block
 *   cache (cuda/memory.cu) only when a collection finds it, and until then
 *   every new one costs a cudaMallocAsync (3 us on the H200 host, against
 *   0.1 from the cache). Lua's own cycles come after thousands of seed
 *   steps, at uneven intervals, so the cache kept falling short: about one
 *   cudaMallocAsync a step after 24000 seed steps, none with the count.
 * - On the CPU the dead tensors of thousands of steps make a working set
 *   far larger than the caches: the seed step took 9.8 us with Lua's own
 *   cycles, 6.7 us collecting every 8192 storages (2 cores, this machine;
 *   4096: 6.9, 16384: 7.7, 32768: 9.4).
 * A full collection costs about 0.2 us per KB of Lua heap (100 us for
 * dplua's own 500 KB); 8 storages per KB keeps that under a tenth of what
 * the collections save when a script holds a large heap of its own. */
#define GC_MIN_BYTES (64LL << 20)
#define GC_EVERY_BLOCKS 8192
#define GC_BLOCKS_PER_HEAP_KB 8
static int64_t bytes_since_gc, bytes_at_gc, blocks_since_gc, blocks_per_gc = GC_EVERY_BLOCKS;

/* A new storage of nbytes on device: in use, and towards the next collection. */
static void count_new_storage(int device, size_t nbytes)
{
    account(device, (int64_t)nbytes);
    bytes_since_gc += (int64_t)nbytes;   /* GPU garbage counts too */
    blocks_since_gc++;
}

int dp_gc_wanted(void)
{
    return (bytes_since_gc > GC_MIN_BYTES && bytes_since_gc > bytes_at_gc) || blocks_since_gc > blocks_per_gc;
}

void dp_gc_done(double lua_heap_kb)
{
    bytes_since_gc = 0;
    blocks_since_gc = 0;
    bytes_at_gc = 0;
    for (int i = 0; i <= MAX_DEVICES; i++)
        bytes_at_gc += bytes_in_use[i];
    double by_heap = lua_heap_kb * GC_BLOCKS_PER_HEAP_KB;
    blocks_per_gc = by_heap > GC_EVERY_BLOCKS && by_heap < 1e15 ? (int64_t)by_heap : GC_EVERY_BLOCKS;
}

/* Device storages: the header on the host, the data from the device's
 * pool (src/core/gpu_memory.c). */
static dp_status device_storage_new(dp_storage **out, size_t nbytes, int device)
{
    if (device >= MAX_DEVICES)
        return dp_fail(DP_ERR_DEVICE, "device cuda:%d is not available (dplua supports at most %d CUDA devices)", device, MAX_DEVICES);
    dp_storage *s = calloc(1, sizeof *s);
    if (!s)
        return dp_fail(DP_ERR_MEMORY, "out of memory allocating a storage header");
    dp_status st = gpu_storage_alloc(&s->data, &s->pool, nbytes, device);
    if (st) {
        free(s);
        return st;
    }
    s->refcount = 1;
    s->device = device;
    s->nbytes = nbytes;
    count_new_storage(device, nbytes);
    *out = s;
    return DP_OK;
}

/* Pinned CPU storages: the header on the heap, the data page-locked
 * (counted as CPU memory: it is host memory the tensors hold). */
static dp_status storage_new_pinned(dp_storage **out, size_t nbytes)
{
    dp_storage *s = calloc(1, sizeof *s);
    if (!s)
        return dp_fail(DP_ERR_MEMORY, "out of memory allocating a storage header");
    dp_status st = gpu_host_alloc(&s->data, nbytes);
    if (st) {
        free(s);
        return st;
    }
    s->refcount = 1;
    s->device = DP_CPU;
    s->nbytes = nbytes;
    s->pinned = true;
    count_new_storage(DP_CPU, nbytes);
    *out = s;
    return DP_OK;
}

/* DPLUA_MAX_ALLOC_BYTES: a ceiling on any one allocation, so that a test
 * (the API fuzzer) can refuse absurd sizes without capping the whole
 * process's address space, which LuaJIT's own allocator must not hit. */
static int64_t alloc_ceiling(void)
{
    static int64_t ceiling = -1;
    if (ceiling < 0) {
        const char *v = getenv("DPLUA_MAX_ALLOC_BYTES");
        ceiling = v && *v ? strtoll(v, NULL, 10) : 0;
        if (ceiling < 0)
            ceiling = 0;
    }
    return ceiling;
}

static dp_status storage_new(dp_storage **out, size_t nbytes, int device)
{
    int64_t ceiling = alloc_ceiling();
    if (ceiling > 0 && nbytes > (size_t)ceiling)
        return dp_fail(DP_ERR_MEMORY, "out of memory: %zu bytes requested, more than DPLUA_MAX_ALLOC_BYTES=%lld",
                       nbytes, (long long)ceiling);
    if (device != DP_CPU)
        return device_storage_new(out, nbytes, device);
    /* One block: the struct in its first 64 bytes, then the data, 64-byte
     * aligned for vector loads and cache lines. */
    size_t capacity;
    if (nbytes > ((size_t)1 << 62))
        return dp_fail(DP_ERR_MEMORY, "out of memory allocating %zu bytes on the CPU", nbytes);
    dp_storage *s = cpu_alloc(64 + nbytes, &capacity);
    if (!s)
        return dp_fail(DP_ERR_MEMORY, "out of memory allocating %zu bytes on the CPU "
                       "(%lld bytes held by tensors)", nbytes, (long long)cpu_bytes_in_use);
    s->refcount = 1;
    s->version = 0;
    s->device = device;
    s->nbytes = nbytes;
    s->capacity = capacity;
    s->data = (char *)s + 64;
    s->pool = NULL;
    s->pinned = false;
    s->copy_event = NULL;
    count_new_storage(DP_CPU, nbytes);
    *out = s;
    return DP_OK;
}

void storage_release(dp_storage *s)
{
    if (s && --s->refcount == 0) {
        account(s->device, -(int64_t)s->nbytes);
        if (s->device != DP_CPU) {
            gpu_storage_free(s->data, s->nbytes, s->pool, s->device);
            free(s);
            return;
        }
        if (s->pinned) {
            gpu_host_free(s->data, s->copy_event);
            free(s);
            return;
        }
        cpu_free(s, s->capacity);
    }
}

/* ---------------------------------------------------------------- lifetime */

void dp_tensor_retain(dp_tensor *t)
{
    if (t) t->refcount++;
}

_Static_assert(sizeof(dp_storage) <= 64, "a storage header must fit before its 64-byte aligned data");

/* Handles come from the caching allocator too: a step makes dozens. */
static dp_tensor *handle_new(void)
{
    size_t cap;
    dp_tensor *t = cpu_alloc(sizeof *t, &cap);
    if (t)
        memset(t, 0, sizeof *t);
    return t;
}

static void handle_free(dp_tensor *t)
{
    size_t cap;
    cpu_alloc_size(sizeof *t, &cap);
    cpu_free(t, cap);
}

void dp_tensor_release(dp_tensor *t)
{
    if (t && --t->refcount == 0) {
        ag_node_release(t->grad_fn);
        dp_tensor_release(t->grad);
        dp_tensor_release(t->grad_slot);
        dp_clear_grad_hooks(t);
        dp_tensor_release(t->ag_buffer);
        if (t->lua_hook)
            ag_lua_hook_done(t->lua_hook);
        storage_release(t->storage);
        handle_free(t);
    }
}

int64_t shape_numel(int ndim, const int64_t *shape)
{
    int64_t n = 1;
    for (int i = 0; i < ndim; i++)
        n *= shape[i];
    return n;
}

static dp_status check_shape(const char *fn, int ndim, const int64_t *shape)
{
    char buf[160];
    if (ndim < 0 || ndim > DP_MAX_DIMS)
        return dp_fail(DP_ERR_SHAPE, "%s: %d dimensions requested, at most %d are supported",
                       fn, ndim, DP_MAX_DIMS);
    /* the span counts empty dims as 1: strides of a tensor with a 0 dim
     * still multiply the other sizes and must not overflow */
    double span = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return dp_fail(DP_ERR_SHAPE, "%s: negative size %lld in shape %s", fn,
                           (long long)shape[i], dp_shape_str(buf, sizeof buf, ndim, shape));
        span *= shape[i] > 1 ? (double)shape[i] : 1.0;
    }
    if (span > 9e15)
        return dp_fail(DP_ERR_SHAPE, "%s: shape %s is too large: its sizes other than 0 multiply past 9e15 (its "
                       "strides would overflow, even where a 0 leaves it empty)", fn,
                       dp_shape_str(buf, sizeof buf, ndim, shape));
    return DP_OK;
}

static void contiguous_strides(int ndim, const int64_t *shape, int64_t *stride)
{
    int64_t s = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        stride[i] = s;
        s *= shape[i] > 1 ? shape[i] : 1;
    }
}

static dp_status check_dtype(const char *fn, int dtype)
{
    if (dtype < 0 || dtype >= DP_NUM_DTYPES)
        return dp_fail(DP_ERR_DTYPE, "%s: invalid dtype %d", fn, dtype);
    return DP_OK;
}

static dp_status tensor_new_in(dp_tensor **out, int ndim, const int64_t *shape, int dtype, int device, bool pinned)
{
    dp_status st;
    if ((st = check_shape("empty", ndim, shape)) || (st = check_dtype("empty", dtype)))
        return st;
    dp_tensor *t = handle_new();
    if (!t)
        return dp_fail(DP_ERR_MEMORY, "out of memory allocating a tensor handle");
    size_t nbytes = (size_t)shape_numel(ndim, shape) * dp_dtype_size(dtype);
    if ((st = pinned ? storage_new_pinned(&t->storage, nbytes) : storage_new(&t->storage, nbytes, device))) {
        handle_free(t);
        return st;
    }
    t->refcount = 1;
    t->dtype = dtype;
    t->device = device;
    t->ndim = ndim;
    if (ndim > 0)  /* a 0-d shape may be NULL */
        memcpy(t->shape, shape, sizeof(int64_t) * (size_t)ndim);
    contiguous_strides(ndim, shape, t->stride);
    *out = t;
    return DP_OK;
}

dp_status tensor_new(dp_tensor **out, int ndim, const int64_t *shape, int dtype, int device)
{
    return tensor_new_in(out, ndim, shape, dtype, device, false);
}

dp_status tensor_new_pinned(dp_tensor **out, int ndim, const int64_t *shape, int dtype)
{
    return tensor_new_in(out, ndim, shape, dtype, DP_CPU, true);
}

dp_status tensor_view_of(dp_tensor **out, dp_tensor *base, int ndim, const int64_t *shape,
                         const int64_t *stride, int64_t offset)
{
    dp_tensor *t = handle_new();
    if (!t)
        return dp_fail(DP_ERR_MEMORY, "out of memory allocating a tensor handle");
    t->refcount = 1;
    t->dtype = base->dtype;
    t->device = base->device;
    t->ndim = ndim;
    if (ndim > 0) {  /* a 0-d view may come with NULL arrays */
        memcpy(t->shape, shape, sizeof(int64_t) * (size_t)ndim);
        memcpy(t->stride, stride, sizeof(int64_t) * (size_t)ndim);
    }
    t->offset = offset;
    t->storage = base->storage;
    t->storage->refcount++;
    *out = t;
    return DP_OK;
}

/* ---------------------------------------------------------------- inspection */

int dp_tensor_dtype(const dp_tensor *t) { return t->dtype; }
int dp_tensor_device(const dp_tensor *t) { return t->device; }
int dp_tensor_ndim(const dp_tensor *t) { return t->ndim; }
int64_t dp_tensor_numel(const dp_tensor *t) { return shape_numel(t->ndim, t->shape); }
int64_t dp_tensor_offset(const dp_tensor *t) { return t->offset; }

int64_t dp_tensor_size(const dp_tensor *t, int dim)
{
    return dim >= 0 && dim < t->ndim ? t->shape[dim] : -1;
}

int64_t dp_tensor_stride(const dp_tensor *t, int dim)
{
    return dim >= 0 && dim < t->ndim ? t->stride[dim] : -1;
}

void *dp_tensor_data(const dp_tensor *t)
{
    return t->device == DP_CPU ? tensor_ptr(t) : NULL;
}

bool tensor_is_contiguous(const dp_tensor *t)
{
    int64_t s = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] != 1 && t->stride[i] != s)
            return false;
        s *= t->shape[i];
    }
    return true;
}

int dp_tensor_is_contiguous(const dp_tensor *t)
{
    return tensor_is_contiguous(t);
}

dp_status dim_check(const char *fn, int *dim, int ndim)
{
    /* A 0-d tensor accepts dims 0 and -1, as in PyTorch. */
    int n = ndim > 0 ? ndim : 1;
    if (*dim < -n || *dim >= n)
        return dp_fail(DP_ERR_INDEX, "%s: dim %d is out of range for a tensor of %d dimensions "
                       "(expected a dim in [%d, %d])", fn, *dim, ndim, -n, n - 1);
    if (*dim < 0)
        *dim += n;
    return DP_OK;
}

/* ---------------------------------------------------------------- views */

/* Records a view's node; iarg holds what its backward needs. */
static dp_status view_record(dp_tensor **out, dp_tensor *t, const char *name, ag_backward_fn fn,
                             int nargs, const int64_t *args)
{
    ag_node *n;
    dp_status st = ag_record_or_drop(out, name, fn, 1, &t, &n);
    if (n)
        for (int i = 0; i < nargs; i++)
            n->iarg[i] = args[i];
    return st;
}

static dp_status view_done(dp_status st, dp_tensor **out, dp_tensor *t, const char *name, ag_backward_fn fn,
                           int nargs, const int64_t *args)
{
    return st ? st : view_record(out, t, name, fn, nargs, args);
}

/* Resolves one -1 in a requested shape against numel. */
static dp_status infer_shape(const char *fn, const dp_tensor *t, int ndim, const int64_t *req,
                             int64_t *shape)
{
    char a[160], b[160];
    int infer = -1;
    int64_t known = 1;
    double span = 1;
    if (ndim < 0 || ndim > DP_MAX_DIMS)
        return dp_fail(DP_ERR_SHAPE, "%s: %d dimensions requested, at most %d are supported",
                       fn, ndim, DP_MAX_DIMS);
    for (int i = 0; i < ndim; i++) {
        shape[i] = req[i];
        if (req[i] == -1) {
            if (infer >= 0)
                return dp_fail(DP_ERR_SHAPE, "%s: only one dimension can be inferred (-1), got %s",
                               fn, dp_shape_str(a, sizeof a, ndim, req));
            infer = i;
        } else if (req[i] < 0) {
            return dp_fail(DP_ERR_SHAPE, "%s: invalid size %lld in shape %s", fn,
                           (long long)req[i], dp_shape_str(a, sizeof a, ndim, req));
        } else {
            span *= req[i] > 1 ? (double)req[i] : 1.0;
            if (span > 9e15)   /* checked before any product of sizes can overflow */
                return dp_fail(DP_ERR_SHAPE, "%s: shape %s is invalid for input of size %lld (too many elements)",
                               fn, dp_shape_str(a, sizeof a, ndim, req), (long long)dp_tensor_numel(t));
            known *= req[i];
        }
    }
    int64_t numel = dp_tensor_numel(t);
    if (infer >= 0 && known != 0 && numel % known == 0)
        shape[infer] = numel / known;
    if ((infer >= 0 && (known == 0 || numel % known != 0)) || shape_numel(ndim, shape) != numel)
        return dp_fail(DP_ERR_SHAPE, "%s: shape %s is invalid for input of size %lld (shape %s)", fn,
                       dp_shape_str(a, sizeof a, ndim, req), (long long)numel,
                       dp_shape_str(b, sizeof b, t->ndim, t->shape));
    return DP_OK;
}

/* Computes strides for viewing t as `shape` without a copy. The old dims
 * are split into chunks that are each contiguous in memory; every chunk must
 * be covered exactly by a run of new dims. Returns false when no view exists. */
static bool view_strides(const dp_tensor *t, int ndim, const int64_t *shape, int64_t *stride)
{
    if (dp_tensor_numel(t) == 0 || tensor_is_contiguous(t)) {
        contiguous_strides(ndim, shape, stride);
        return true;
    }
    int view_d = ndim - 1;
    int64_t chunk_stride = t->stride[t->ndim - 1];
    int64_t tensor_numel = 1, view_numel = 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
        tensor_numel *= t->shape[d];
        bool chunk_ends = d == 0 ||
            (t->shape[d - 1] != 1 && t->stride[d - 1] != tensor_numel * chunk_stride);
        if (!chunk_ends)
            continue;
        while (view_d >= 0 && (view_numel < tensor_numel || shape[view_d] == 1)) {
            stride[view_d] = view_numel * chunk_stride;
            view_numel *= shape[view_d];
            view_d--;
        }
        if (view_numel != tensor_numel)
            return false;
        if (d > 0) {
            chunk_stride = t->stride[d - 1];
            tensor_numel = view_numel = 1;
        }
    }
    return view_d == -1;
}

dp_status dp_view(dp_tensor **out, dp_tensor *t, int ndim, const int64_t *req)
{
    int64_t shape[DP_MAX_DIMS], stride[DP_MAX_DIMS];
    dp_status st = infer_shape("view", t, ndim, req, shape);
    if (st)
        return st;
    if (!view_strides(t, ndim, shape, stride)) {
        char a[160], b[160];
        return dp_fail(DP_ERR_SHAPE, "view: size %s is not compatible with the input's size %s and "
                       "strides (at least one dimension spans across two contiguous subspaces); "
                       "use reshape() instead", dp_shape_str(a, sizeof a, ndim, shape),
                       dp_shape_str(b, sizeof b, t->ndim, t->shape));
    }
    return view_done(tensor_view_of(out, t, ndim, shape, stride, t->offset), out, t, "ViewBackward0",
                     bw_reshape, 0, NULL);
}

dp_status dp_reshape(dp_tensor **out, dp_tensor *t, int ndim, const int64_t *req)
{
    int64_t shape[DP_MAX_DIMS], stride[DP_MAX_DIMS];
    dp_status st = infer_shape("reshape", t, ndim, req, shape);
    if (st)
        return st;
    if (view_strides(t, ndim, shape, stride))
        return view_done(tensor_view_of(out, t, ndim, shape, stride, t->offset), out, t, "ViewBackward0",
                         bw_reshape, 0, NULL);
    dp_tensor *c;
    if ((st = dp_clone(&c, t)))
        return st;
    st = dp_view(out, c, ndim, shape);
    dp_tensor_release(c);
    return st;
}

dp_status dp_permute(dp_tensor **out, dp_tensor *t, int ndim, const int *dims)
{
    int64_t shape[DP_MAX_DIMS], stride[DP_MAX_DIMS], args[DP_MAX_DIMS];
    bool seen[DP_MAX_DIMS] = { false };
    if (ndim != t->ndim)
        return dp_fail(DP_ERR_SHAPE, "permute: got %d dims for a tensor of %d dimensions", ndim, t->ndim);
    for (int i = 0; i < ndim; i++) {
        int d = dims[i];
        dp_status st = dim_check("permute", &d, t->ndim);
        if (st)
            return st;
        if (seen[d])
            return dp_fail(DP_ERR_ARG, "permute: dim %d appears more than once", d);
        seen[d] = true;
        shape[i] = t->shape[d];
        stride[i] = t->stride[d];
        args[i] = d;
    }
    return view_done(tensor_view_of(out, t, ndim, shape, stride, t->offset), out, t, "PermuteBackward0",
                     bw_permute, ndim, args);
}

dp_status dp_transpose(dp_tensor **out, dp_tensor *t, int d0, int d1)
{
    dp_status st;
    if ((st = dim_check("transpose", &d0, t->ndim)) || (st = dim_check("transpose", &d1, t->ndim)))
        return st;
    int64_t shape[DP_MAX_DIMS], stride[DP_MAX_DIMS];
    memcpy(shape, t->shape, sizeof shape);
    memcpy(stride, t->stride, sizeof stride);
    if (t->ndim > 0) {
        shape[d0] = t->shape[d1]; shape[d1] = t->shape[d0];
        stride[d0] = t->stride[d1]; stride[d1] = t->stride[d0];
    }
    int64_t perm[DP_MAX_DIMS];
    for (int i = 0; i < t->ndim; i++)
        perm[i] = i == d0 ? d1 : i == d1 ? d0 : i;
    return view_done(tensor_view_of(out, t, t->ndim, shape, stride, t->offset), out, t, "TransposeBackward0",
                     bw_permute, t->ndim, perm);
}

/* Broadcast view: new leading dims and size-1 dims get stride 0. */
dp_status dp_expand(dp_tensor **out, dp_tensor *t, int ndim, const int64_t *req)
{
    char a[160], b[160];
    int64_t shape[DP_MAX_DIMS], stride[DP_MAX_DIMS];
    if (ndim < t->ndim || ndim > DP_MAX_DIMS)
        return dp_fail(DP_ERR_SHAPE, "expand: the number of sizes (%d) must be at least the "
                       "tensor's number of dimensions (%d) and at most %d", ndim, t->ndim, DP_MAX_DIMS);
    int lead = ndim - t->ndim;
    for (int i = 0; i < ndim; i++) {
        int j = i - lead;
        int64_t have = j >= 0 ? t->shape[j] : 1;
        int64_t want = req[i] == -1 && j >= 0 ? have : req[i];
        if (want < 0 || (have != want && have != 1))
            return dp_fail(DP_ERR_SHAPE, "expand: the expanded size %s must match the existing "
                           "size %s at non-singleton dimension %d",
                           dp_shape_str(a, sizeof a, ndim, req), dp_shape_str(b, sizeof b, t->ndim, t->shape), i);
        shape[i] = want;
        stride[i] = j >= 0 && have == want ? t->stride[j] : 0;
    }
    dp_status st = check_shape("expand", ndim, shape);   /* numel must not overflow */
    if (st)
        return st;
    return view_done(tensor_view_of(out, t, ndim, shape, stride, t->offset), out, t, "ExpandBackward0",
                     bw_expand, 0, NULL);
}

/* Python-style slice: negative ends count from the back, ends clamp. */
dp_status dp_slice(dp_tensor **out, dp_tensor *t, int dim, int64_t start, int64_t stop, int64_t step)
{
    dp_status st;
    if (t->ndim == 0)
        return dp_fail(DP_ERR_INDEX, "slice: cannot slice a 0-d tensor");
    if ((st = dim_check("slice", &dim, t->ndim)))
        return st;
    if (step <= 0)
        return dp_fail(DP_ERR_ARG, "slice: step must be positive, got %lld", (long long)step);
    int64_t n = t->shape[dim];
    if (start < 0) start += n;
    if (stop < 0) stop += n;
    start = start < 0 ? 0 : start > n ? n : start;
    stop = stop < start ? start : stop > n ? n : stop;
    if (step > n)   /* at most one element either way; keeps step * stride from overflowing */
        step = n > 0 ? n : 1;
    int64_t shape[DP_MAX_DIMS], stride[DP_MAX_DIMS];
    memcpy(shape, t->shape, sizeof shape);
    memcpy(stride, t->stride, sizeof stride);
    shape[dim] = (stop - start + step - 1) / step;
    stride[dim] = t->stride[dim] * step;
    int64_t args[5] = { dim, start, stop, step, 0 };
    return view_done(tensor_view_of(out, t, t->ndim, shape, stride, t->offset + start * t->stride[dim]),
                     out, t, "SliceBackward0", bw_window, 5, args);
}

/* For an op that takes part of one dim (narrow, select): dim checked and
 * made non-negative, its size in *n; a 0-d tensor has none, which
 * `zero_d` says. */
static dp_status part_dim(const char *fn, const char *zero_d, const dp_tensor *t, int *dim, int64_t *n)
{
    dp_status st;
    if (t->ndim == 0)
        return dp_fail(DP_ERR_INDEX, "%s: %s", fn, zero_d);
    if ((st = dim_check(fn, dim, t->ndim)))
        return st;
    *n = t->shape[*dim];
    return DP_OK;
}

dp_status dp_narrow(dp_tensor **out, dp_tensor *t, int dim, int64_t start, int64_t length)
{
    int64_t n = 0;
    dp_status st = part_dim("narrow", "cannot narrow a 0-d tensor", t, &dim, &n);
    if (st)
        return st;
    if (start < 0) start += n;
    if (start < 0 || length < 0 || start + length > n)
        return dp_fail(DP_ERR_INDEX, "narrow: start %lld and length %lld are out of range for "
                       "dim %d of size %lld", (long long)start, (long long)length, dim, (long long)n);
    return dp_slice(out, t, dim, start, start + length, 1);
}

dp_status dp_select(dp_tensor **out, dp_tensor *t, int dim, int64_t index)
{
    int64_t n = 0;
    dp_status st = part_dim("select", "invalid index of a 0-d tensor", t, &dim, &n);
    if (st)
        return st;
    if (index < -n || index >= n)
        return dp_fail(DP_ERR_INDEX, "select: index %lld is out of bounds for dimension %d with size %lld",
                       (long long)index, dim, (long long)n);
    if (index < 0)
        index += n;
    int64_t shape[DP_MAX_DIMS], stride[DP_MAX_DIMS];
    for (int i = 0, j = 0; i < t->ndim; i++) {
        if (i == dim) continue;
        shape[j] = t->shape[i];
        stride[j++] = t->stride[i];
    }
    int64_t args[5] = { dim, index, 0, 0, 1 };
    return view_done(tensor_view_of(out, t, t->ndim - 1, shape, stride, t->offset + index * t->stride[dim]),
                     out, t, "SelectBackward0", bw_window, 5, args);
}

dp_status dp_squeeze(dp_tensor **out, dp_tensor *t, int dim)
{
    int64_t shape[DP_MAX_DIMS], stride[DP_MAX_DIMS];
    int n = 0;
    if (dim != DP_ALL_DIMS) {
        dp_status st = dim_check("squeeze", &dim, t->ndim);
        if (st)
            return st;
    }
    for (int i = 0; i < t->ndim; i++) {
        bool drop = t->shape[i] == 1 && (dim == DP_ALL_DIMS || dim == i);
        if (drop) continue;
        shape[n] = t->shape[i];
        stride[n++] = t->stride[i];
    }
    return view_done(tensor_view_of(out, t, n, shape, stride, t->offset), out, t, "SqueezeBackward0",
                     bw_reshape, 0, NULL);
}

dp_status dp_unsqueeze(dp_tensor **out, dp_tensor *t, int dim)
{
    dp_status st = dim_check("unsqueeze", &dim, t->ndim + 1);
    if (st)
        return st;
    if (t->ndim == DP_MAX_DIMS)
        return dp_fail(DP_ERR_SHAPE, "unsqueeze: tensors have at most %d dimensions", DP_MAX_DIMS);
    int64_t shape[DP_MAX_DIMS], stride[DP_MAX_DIMS];
    for (int i = 0, j = 0; i <= t->ndim; i++) {
        if (i == dim) {
            shape[i] = 1;
            stride[i] = dim < t->ndim ? t->shape[dim] * t->stride[dim] : 1;
        } else {
            shape[i] = t->shape[j];
            stride[i] = t->stride[j++];
        }
    }
    return view_done(tensor_view_of(out, t, t->ndim + 1, shape, stride, t->offset), out, t,
                     "UnsqueezeBackward0", bw_reshape, 0, NULL);
}

dp_status dp_alias(dp_tensor **out, dp_tensor *t)
{
    return tensor_view_of(out, t, t->ndim, t->shape, t->stride, t->offset);
}

dp_status dp_set_view(dp_tensor *t, dp_tensor *view)
{
    if (view->storage != t->storage)
        return dp_fail(DP_ERR_ARG, "set_view: the view does not share the tensor's storage");
    if (t->requires_grad)
        return dp_fail(DP_ERR_ARG, "an in-place view change (unsqueeze_, squeeze_, t_, transpose_) of a tensor "
                       "that requires grad is not supported: use the out-of-place form");
    t->ndim = view->ndim;
    for (int i = 0; i < view->ndim; i++) {
        t->shape[i] = view->shape[i];
        t->stride[i] = view->stride[i];
    }
    t->offset = view->offset;
    return DP_OK;
}

dp_status dp_as_strided(dp_tensor **out, dp_tensor *t, int ndim, const int64_t *shape, const int64_t *stride,
                        int64_t offset)
{
    if (ndim < 0 || ndim > DP_MAX_DIMS)
        return dp_fail(DP_ERR_ARG, "as_strided: %d dims, expected at most %d", ndim, DP_MAX_DIMS);
    if (t->requires_grad && dp_is_grad_enabled())
        return dp_fail(DP_ERR_ARG, "as_strided of a tensor that requires grad is not supported (its views may overlap, "
                       "and autograd does not record it): call it under torch.no_grad or on t:detach()");
    if (offset < 0)
        return dp_fail(DP_ERR_ARG, "as_strided: the storage offset %lld is negative", (long long)offset);
    int64_t last = offset;    /* the last element the view reaches */
    bool empty = false;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0 || stride[i] < 0)
            return dp_fail(DP_ERR_ARG, "as_strided: size %lld and stride %lld of dim %d: expected non-negative ones",
                           (long long)shape[i], (long long)stride[i], i);
        empty = empty || shape[i] == 0;
    }
    for (int i = 0; i < ndim && !empty; i++) {
        int64_t step;
        if (__builtin_mul_overflow(shape[i] - 1, stride[i], &step) || __builtin_add_overflow(last, step, &last))
            return dp_fail(DP_ERR_ARG, "as_strided: the view's extent overflows int64 at dim %d", i);
    }
    int64_t held = (int64_t)(t->storage->nbytes / dp_dtype_size(t->dtype));
    if (!empty && last >= held)
        return dp_fail(DP_ERR_ARG, "as_strided: the view reaches element %lld of the storage, which holds %lld "
                       "elements", (long long)last, (long long)held);
    return tensor_view_of(out, t, ndim, shape, stride, offset);
}

dp_status dp_resize_(dp_tensor *t, int ndim, const int64_t *shape)
{
    dp_status st = check_shape("resize_", ndim, shape);
    if (st)
        return st;
    if (t->requires_grad)
        return dp_fail(DP_ERR_ARG, "resize_: cannot resize a tensor that requires grad (use reshape, or resize a detach())");
    const int64_t want = shape_numel(ndim, shape);
    const size_t es = dp_dtype_size(t->dtype);
    const int64_t held = (int64_t)(t->storage->nbytes / es) - t->offset;
    if (want > held) {
        dp_tensor *fresh;
        if ((st = tensor_new(&fresh, ndim, shape, t->dtype, t->device)))
            return st;
        const int64_t keep = held > 0 ? held : 0;
        if (keep > 0) {   /* the old elements, read C-contiguous, into the front of the new storage */
            dp_tensor *from = NULL, *to = NULL;
            const int64_t one = 1;
            if (!(st = tensor_view_of(&from, t, 1, &keep, &one, t->offset)) &&
                !(st = tensor_view_of(&to, fresh, 1, &keep, &one, 0)))
                st = dp_copy_into(to, from);
            dp_tensor_release(from);
            dp_tensor_release(to);
        }
        if (st) {
            dp_tensor_release(fresh);
            return st;
        }
        fresh->storage->refcount++;
        storage_release(t->storage);
        t->storage = fresh->storage;
        t->offset = 0;
        dp_tensor_release(fresh);
    }
    t->ndim = ndim;
    if (ndim > 0)
        memcpy(t->shape, shape, sizeof(int64_t) * (size_t)ndim);
    contiguous_strides(ndim, shape, t->stride);
    return DP_OK;
}

dp_status dp_contiguous(dp_tensor **out, dp_tensor *t)
{
    if (tensor_is_contiguous(t)) {
        dp_tensor_retain(t);
        *out = t;
        return DP_OK;
    }
    return dp_clone(out, t);
}

dp_status dp_clone(dp_tensor **out, dp_tensor *a)
{
    dp_status st = tensor_new(out, a->ndim, a->shape, a->dtype, a->device);
    if (st)
        return st;
    if ((st = dp_copy_into(*out, a))) {
        dp_tensor_release(*out);
        return st;
    }
    return view_record(out, a, "CloneBackward0", bw_identity, 0, NULL);
}

/* ---------------------------------------------------------------- creation */

/* The creation functions below write their values on the host; for a GPU
 * they fill a host tensor and move it. */
#define FILL_ON_HOST(out, device, dtype, call)             \
    do {                                                  \
        if ((device) != DP_CPU) {                         \
            dp_tensor *host_;                             \
            dp_status st_ = (call);                       \
            if (st_)                                      \
                return st_;                               \
            st_ = dp_to(out, host_, dtype, device);       \
            dp_tensor_release(host_);                     \
            return st_;                                   \
        }                                                 \
    } while (0)

dp_status dp_empty(dp_tensor **out, int ndim, const int64_t *shape, dp_dtype dtype, int device)
{
    return tensor_new(out, ndim, shape, dtype, device);
}

dp_status tensor_filled(dp_tensor **out, int ndim, const int64_t *shape, double value, int dtype, int device)
{
    dp_status st = tensor_new(out, ndim, shape, dtype, device);
    if (!st && (st = k_fill(*out, value))) {
        dp_tensor_release(*out);
        *out = NULL;
    }
    return st;
}

dp_status dp_full(dp_tensor **out, int ndim, const int64_t *shape, double value, dp_dtype dtype, int device)
{
    if (!dp_dtype_holds(dtype, value))
        return dp_fail(DP_ERR_ARG, "full: value %g cannot be converted to %s without overflow", value,
                       dp_dtype_name(dtype));
    return tensor_filled(out, ndim, shape, value, dtype, device);
}

dp_status dp_arange(dp_tensor **out, double start, double end, double step, dp_dtype dtype, int device)
{
    FILL_ON_HOST(out, device, dtype, dp_arange(&host_, start, end, step, dtype, DP_CPU));
    if (step == 0 || !isfinite(start) || !isfinite(end) || !isfinite(step))
        return dp_fail(DP_ERR_ARG, "arange: step must be nonzero and bounds finite "
                       "(got start=%g, end=%g, step=%g)", start, end, step);
    if ((end - start) / step < 0)
        return dp_fail(DP_ERR_ARG, "arange: upper bound and larger bound inconsistent with step sign "
                       "(start=%g, end=%g, step=%g)", start, end, step);
    const double count = ceil((end - start) / step);
    if (!(count < 0x1p62))   /* (a larger double reaches int64 as some other number) */
        return dp_fail(DP_ERR_ARG, "arange: %.6g elements (start=%g, end=%g, step=%g) are too many", count, start, end,
                       step);
    int64_t n = (int64_t)count;
    dp_status st = tensor_new(out, 1, &n, dtype, device);
    if (st)
        return st;
    char *p = tensor_ptr(*out);
    size_t es = dp_dtype_size(dtype);
    for (int64_t i = 0; i < n; i++)
        dtype_store(dtype, p + i * es, start + (double)i * step);
    return DP_OK;
}

dp_status dp_linspace(dp_tensor **out, double start, double end, int64_t steps, dp_dtype dtype, int device)
{
    FILL_ON_HOST(out, device, dtype, dp_linspace(&host_, start, end, steps, dtype, DP_CPU));
    if (steps < 0)
        return dp_fail(DP_ERR_ARG, "linspace: number of steps must be non-negative, got %lld", (long long)steps);
    dp_status st = tensor_new(out, 1, &steps, dtype, device);
    if (st)
        return st;
    char *p = tensor_ptr(*out);
    size_t es = dp_dtype_size(dtype);
    double delta = steps > 1 ? (end - start) / (double)(steps - 1) : 0;
    /* Fill symmetrically from both ends, as PyTorch does, so that the last
     * element is exactly `end`. */
    int64_t half = steps / 2;
    for (int64_t i = 0; i < steps; i++) {
        double v = steps == 1 ? start : i < half ? start + delta * (double)i : end - delta * (double)(steps - 1 - i);
        dtype_store(dtype, p + i * es, v);
    }
    return DP_OK;
}

dp_status dp_eye(dp_tensor **out, int64_t n, int64_t m, dp_dtype dtype, int device)
{
    FILL_ON_HOST(out, device, dtype, dp_eye(&host_, n, m, dtype, DP_CPU));
    int64_t shape[2] = { n, m < 0 ? n : m };
    dp_status st = dp_full(out, 2, shape, 0, dtype, device);
    if (st)
        return st;
    char *p = tensor_ptr(*out);
    size_t es = dp_dtype_size(dtype);
    for (int64_t i = 0; i < shape[0] && i < shape[1]; i++)
        dtype_store(dtype, p + (i * shape[1] + i) * es, 1);
    return DP_OK;
}

/* ---------------------------------------------------------------- scalars */

dp_status dp_item(dp_tensor *t, double *value)
{
    if (dp_tensor_numel(t) != 1)
        return dp_fail(DP_ERR_SHAPE, "item: a tensor with %lld elements cannot be converted to a "
                       "number (expected exactly one element)", (long long)dp_tensor_numel(t));
    if (t->device != DP_CPU) {
        dp_tensor *host;
        dp_status st = dp_to(&host, t, t->dtype, DP_CPU);
        if (st)
            return st;
        st = dp_item(host, value);
        dp_tensor_release(host);
        return st;
    }
    *value = dtype_load(t->dtype, tensor_ptr(t));
    return DP_OK;
}

dp_status dp_item_int64(dp_tensor *t, int64_t *value)
{
    double d;
    dp_status st = dp_item(t, &d);
    if (st)
        return st;
    if (t->dtype != DP_INT64 || t->device != DP_CPU) {
        *value = (int64_t)d;
        if (t->dtype == DP_INT64) {   /* exact, through a host copy */
            dp_tensor *host;
            if (!(st = dp_to(&host, t, t->dtype, DP_CPU))) {
                *value = *(int64_t *)tensor_ptr(host);
                dp_tensor_release(host);
            }
        }
        return st;
    }
    *value = *(int64_t *)tensor_ptr(t);
    return DP_OK;
}

void dp_tensor_box_release(dp_tensor_box *box)
{
    dp_tensor_release(box->p);
    box->p = NULL;
}
