/*
 * gpu_norm.c — LayerNorm's and BatchNorm's GPU side: the contiguous
 * tensors of src/core/norm.c described for the kernels of cuda/norm.cu,
 * and their scratch memory for partial sums.
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
        .weight = ptr_or_null(a->weight), .bias = ptr_or_null(a->bias), .eps = a->eps, .dx_adds = a->dx_adds,
        .residual_dtype = a->residual ? a->residual->dtype : a->x->dtype,
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

static dpc_bn describe_bn(const cpu_bn_args *a)
{
    dpc_bn d = {
        .N = a->N, .C = a->C, .S = a->S, .x = tensor_ptr(a->x), .weight = ptr_or_null(a->weight),
        .bias = ptr_or_null(a->bias), .running_mean = a->running_mean ? tensor_ptr(a->running_mean) : NULL,
        .running_var = a->running_var ? tensor_ptr(a->running_var) : NULL, .training = a->training,
        .momentum = a->momentum, .eps = a->eps,
    };
    return d;
}

/* the parameters' dtype: float32 beside a bfloat16 input, else the input's */
static int bn_param_dtype_of(const cpu_bn_args *a)
{
    const dp_tensor *p = a->running_mean ? a->running_mean : a->weight ? a->weight : a->bias;
    return p ? p->dtype : a->x->dtype;
}

dp_status gpu_batch_norm(const cpu_bn_args *a, dp_tensor *out, dp_tensor *mean, dp_tensor *invstd)
{
    dpc_bn d = describe_bn(a);
    dp_tensor *workspace = NULL;
    dp_status st = gpu_workspace(&workspace, (int64_t)dpc_batch_norm_workspace(a->x->dtype, &d, 0), out->device);
    if (st)
        return st;
    dpc_set_device(out->device);
    st = gpu_status("batch_norm",
                    dpc_batch_norm(a->x->dtype, bn_param_dtype_of(a), &d, tensor_ptr(out), tensor_ptr(mean),
                                   tensor_ptr(invstd), workspace ? tensor_ptr(workspace) : NULL,
                                   gpu_stream_of(out->device)),
                    a->x->dtype);
    dp_tensor_release(workspace);
    return st;
}

dp_status gpu_batch_norm_backward(const cpu_bn_args *a, dp_tensor *dy, dp_tensor *mean, dp_tensor *invstd,
                                  dp_tensor *dx, dp_tensor *dw, dp_tensor *db)
{
    dpc_bn d = describe_bn(a);
    dp_tensor *workspace = NULL;
    dp_status st = gpu_workspace(&workspace, (int64_t)dpc_batch_norm_workspace(a->x->dtype, &d, 1), dy->device);
    if (st)
        return st;
    int pdtype = dw ? dw->dtype : db ? db->dtype : bn_param_dtype_of(a);
    dpc_set_device(dy->device);
    st = gpu_status("batch_norm backward",
                    dpc_batch_norm_backward(a->x->dtype, pdtype, &d, tensor_ptr(dy), tensor_ptr(mean),
                                            tensor_ptr(invstd), dx ? tensor_ptr(dx) : NULL,
                                            dw ? tensor_ptr(dw) : NULL, db ? tensor_ptr(db) : NULL,
                                            workspace ? tensor_ptr(workspace) : NULL, gpu_stream_of(dy->device)),
                    a->x->dtype);
    dp_tensor_release(workspace);
    return st;
}
#endif
