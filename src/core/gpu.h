/*
 * gpu.h — what the CUDA side of the op table shares across its files:
 * gpu.c (statuses, elementwise ops, reductions, indexing, unfold),
 * gpu_memory.c (device memory, copies, streams, events, CUDA graphs,
 * kernels' scratch memory), gpu_linear.c (matrix products, the deferred
 * Linear, the fused loss and optimizer steps), gpu_attention.c and
 * gpu_norm.c. Internal to src/core; only with DP_HAVE_CUDA.
 */
#ifndef DP_CORE_GPU_H
#define DP_CORE_GPU_H

#include <stdbool.h>
#include <string.h>

#include "core/kernels.h"
#include "dp_cuda.h"
#include "dpc_ops.h"

/* gpu.c: a kernel's CUDA status st as a dp_status naming fn (and the
 * dtype for DPC_UNSUPPORTED); the block where kernels leave the errors
 * they find, and those errors as a dp_status after a synchronisation */
dp_status gpu_status(const char *fn, int st, int dtype);
dpc_kernel_error *gpu_kernel_error_block(void);
dp_status gpu_kernel_errors(void);
/* The stream for work about to be enqueued on device, after the deferred
 * work if some waits: every kernel and copy asks for it. */
void *gpu_stream_of(int device);

/* gpu_memory.c: the device's current stream (NULL: its legacy default
 * stream), the error for what cannot run inside a CUDA graph's capture,
 * and copies */
void *gpu_stream_now(int device);
dp_status gpu_not_capturable(const char *what);
/* contiguous bytes between host and device (kind as dpc_memcpy) */
dp_status gpu_memcpy(void *dst, const void *src, size_t bytes, int kind, int device);
/* A kernel's scratch memory: a uint8 tensor of `bytes`, so that it comes
 * from the device's pool on the current stream like any other; *ws stays
 * NULL when bytes is 0. */
dp_status gpu_workspace(dp_tensor **ws, int64_t bytes, int device);

/* gpu_linear.c: the deferred Linear's work launched now (all of it, or
 * what waits on one stream); an elementwise op joined to the waiting
 * Linear when it can (true: *st is its status); and a waiting launch's
 * error, which the next op's gpu_status reports */
void gpu_deferred_launch(void);
void gpu_deferred_launch_on(void *stream);
bool gpu_deferred_fuse(int op, dp_tensor *out, dp_tensor *a, dp_status *st);
extern char gpu_deferred_failure[400];

/* a tensor as the kernels of cuda/dpc_ops.h take it */
static inline dpc_shape gpu_shape(const dp_tensor *t)
{
    dpc_shape s = { .ndim = t->ndim };
    memcpy(s.shape, t->shape, sizeof(int64_t) * (size_t)t->ndim);
    return s;
}

static inline void *gpu_first(const dp_tensor *t)
{
    return (char *)t->storage->data + t->offset * (int64_t)dp_dtype_size(t->dtype);
}

static inline dpc_operand gpu_operand(const dp_tensor *t)
{
    dpc_operand o = { .data = gpu_first(t) };
    memcpy(o.stride, t->stride, sizeof(int64_t) * (size_t)t->ndim);
    return o;
}

#endif /* DP_CORE_GPU_H */
