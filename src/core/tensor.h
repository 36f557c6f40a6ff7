/*
 * tensor.h — the tensor and storage structs, shared by src/core and src/cpu.
 *
 * A storage is a refcounted block of memory on one device. A tensor is a
 * refcounted view of a storage: dtype, shape, strides (in elements) and an
 * element offset. Views share the storage and hold a reference to it.
 */
#ifndef DP_CORE_TENSOR_H
#define DP_CORE_TENSOR_H

#include "dplua.h"
#include "common/dtype_conv.h"
#include <stdbool.h>

typedef struct dp_storage {
    int refcount;
    uint32_t version;    /* bumped by every in-place write (autograd checks it) */
    int device;          /* DP_CPU or a CUDA ordinal */
    size_t nbytes;
    size_t capacity;     /* of the allocator block holding this struct and the data */
    void *data;
    void *pool;          /* GPU memory of a CUDA graph (src/core/gpu_memory.c), else NULL */
    /* pinned CPU storages: data is page-locked host memory (its own
     * allocation), and copy_event that of the last queued copy reading it */
    bool pinned;
    void *copy_event;
} dp_storage;

struct dp_tensor {
    int refcount;
    int dtype;
    int device;
    int ndim;
    int64_t shape[DP_MAX_DIMS];
    int64_t stride[DP_MAX_DIMS];
    int64_t offset;      /* in elements */
    dp_storage *storage;
    /* autograd (src/core/autograd.c) */
    bool requires_grad;
    struct ag_node *grad_fn;   /* NULL for leaves */
    dp_tensor *grad;           /* accumulated gradient of a leaf, or NULL */
    dp_tensor *grad_slot;      /* where .grad lives when it is set: a view into a flat buffer */
    struct ag_hook *hooks;     /* grad-ready hooks of a leaf */
    int ag_pending;            /* gradients still to come in the running backward */
    int64_t lua_hook;          /* id of the Lua hooks of a leaf (Tensor:register_hook), or 0 */
    dp_tensor *ag_buffer;      /* a hooked leaf's gradient so far, in the running backward */
};

/* error.c */
dp_status dp_fail(dp_status status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Writes "[2, 3]" into buf. */
const char *dp_shape_str(char *buf, size_t len, int ndim, const int64_t *shape);
/* Writes "cpu" or "cuda:0" into buf. */
const char *dp_device_str(char *buf, size_t len, int device);

/* alloc.c: 64-byte aligned blocks from per-size-class caches */
void *cpu_alloc(size_t n, size_t *capacity);
void cpu_free(void *p, size_t capacity);
void cpu_alloc_size(size_t n, size_t *capacity);   /* the capacity cpu_alloc(n) gives */

/* gpu_memory.c: device memory of storages (fails clearly without CUDA) */
/* *pool: the CUDA graph pool the memory came from (during a capture), or
 * NULL; given back to gpu_storage_free with the data. */
dp_status gpu_storage_alloc(void **data, void **pool, size_t nbytes, int device);
void gpu_storage_free(void *data, size_t nbytes, void *pool, int device);
/* gpu_memory.c: page-locked host memory for pinned storages; free waits
 * for the copies still reading it. A queued upload copies a contiguous
 * pinned tensor of dst's dtype and shape into contiguous dst without
 * waiting, and records the storage's copy_event after it; pinned_wait
 * waits for that event. */
dp_status gpu_host_alloc(void **data, size_t nbytes);
void gpu_host_free(void *data, void *copy_event);
dp_status gpu_upload_queued(dp_tensor *dst, dp_tensor *src);
dp_status gpu_pinned_wait(dp_storage *s);

/* tensor.c */
void storage_release(dp_storage *s);
dp_status tensor_new(dp_tensor **out, int ndim, const int64_t *shape, int dtype, int device);
dp_status tensor_new_pinned(dp_tensor **out, int ndim, const int64_t *shape, int dtype);   /* CPU, page-locked */
dp_status tensor_view_of(dp_tensor **out, dp_tensor *base, int ndim, const int64_t *shape,
                         const int64_t *stride, int64_t offset);
int64_t shape_numel(int ndim, const int64_t *shape);
bool tensor_is_contiguous(const dp_tensor *t);
/* dp_full without its range check: value converted as the fill kernel
 * converts it (a number beside a tensor in an op, ops.c) */
dp_status tensor_filled(dp_tensor **out, int ndim, const int64_t *shape, double value, int dtype, int device);
static inline char *tensor_ptr(const dp_tensor *t)
{
    return (char *)t->storage->data + t->offset * (int64_t)dt_size(t->dtype);   /* inline: hot */
}
/* Checks a dim against ndim, wrapping negatives; fn names the caller. */
dp_status dim_check(const char *fn, int *dim, int ndim);

/* dtype.c */
float bf16_to_float(uint16_t v);
uint16_t float_to_bf16(float f);
double dtype_load(int dtype, const char *p);
void dtype_store(int dtype, char *p, double v);
int dtype_promote(int a, int b);
enum { DTYPE_DIM, DTYPE_ZERO_DIM, DTYPE_WRAPPED };
int dtype_result(int da, int ka, int db, int kb);

#endif
