/*
 * gpu_norm.c — LayerNorm's GPU side: the contiguous rows of
 * src/core/norm.c described for the kernels of cuda/norm.cu, and the
 * backward's scratch memory for the partial sums of dweight and dbias.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#ifdef DP_HAVE_CUDA
#include "core/gpu.h"

static const void *ptr_or_null(const dp_tensor *t)
{
    return t ? tensor_ptr(t) : NULL;
}

static dpc_norm describe(const cpu_norm_args *a)
{
    dpc_norm d = {
        .rows = a->rows, .n = a->n, .x = tensor_ptr(a->x), .residual = ptr_or_null(a->residual),
        .weight = ptr_or_null(a->weight), .bias = ptr_or_null(a->bias), .eps = a->eps,
    };
    return d;
}

dp_status gpu_layer_norm(const cpu_norm_args *a, dp_tensor *out, dp_tensor *sum, dp_tensor *mean, dp_tensor *rstd)
{
    dpc_norm d = describe(a);
    dpc_set_device(out->device);
    return gpu_status(a->residual ? "add_layer_norm" : "layer_norm",
                      dpc_layer_norm(a->x->dtype, out->dtype, &d, tensor_ptr(out), sum ? tensor_ptr(sum) : NULL,
                                     tensor_ptr(mean), tensor_ptr(rstd), gpu_stream_of(out->device)),
                      a->x->dtype);
}

dp_status gpu_layer_norm_backward(const cpu_norm_args *a, dp_tensor *dy, dp_tensor *mean, dp_tensor *rstd,
                                  dp_tensor *dx, dp_tensor *dw, dp_tensor *db)
{
    dpc_norm d = describe(a);
    int64_t bytes = (dw || db) ? (int64_t)dpc_layer_norm_workspace(a->x->dtype, a->rows, a->n) : 0;
    dp_tensor *workspace = NULL;
    dp_status st = gpu_workspace(&workspace, bytes, dy->device);
    if (st)
        return st;
    dpc_set_device(dy->device);
    st = gpu_status("layer_norm backward",
                    dpc_layer_norm_backward(a->x->dtype, dy->dtype, &d, tensor_ptr(dy), tensor_ptr(mean),
                                            tensor_ptr(rstd), dx ? tensor_ptr(dx) : NULL,
                                            dw ? tensor_ptr(dw) : NULL, db ? tensor_ptr(db) : NULL,
                                            workspace ? tensor_ptr(workspace) : NULL, gpu_stream_of(dy->device)),
                    a->x->dtype);
    dp_tensor_release(workspace);
    return st;
}
#endif
