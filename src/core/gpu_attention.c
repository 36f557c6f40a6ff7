/*
 * gpu_attention.c — the attention op's GPU side: the (B, H, n, d) views of
 * src/core/attention.c described for the flash kernels of
 * cuda/attention.cu, and the backward's scratch memory.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#ifdef DP_HAVE_CUDA
#include "core/gpu.h"

int gpu_attention_takes(int dtype, int64_t E, int64_t Ev)
{
    return dpc_attention_takes(dtype, E, Ev);
}

static dpc_attention describe(const cpu_attention_args *a)
{
    const dp_tensor *q = a->q, *k = a->k, *v = a->v;
    dpc_attention d = {
        .B = q->shape[0], .H = q->shape[1], .L = q->shape[2], .S = k->shape[2], .E = q->shape[3], .Ev = v->shape[3],
        .q = tensor_ptr(q), .k = tensor_ptr(k), .v = tensor_ptr(v),
        .q_stride = { q->stride[0], q->stride[1], q->stride[2] },
        .k_stride = { k->stride[0], k->stride[1], k->stride[2] },
        .v_stride = { v->stride[0], v->stride[1], v->stride[2] },
        .scale = a->scale, .causal = a->causal,
    };
    return d;
}

dp_status gpu_attention_forward(const cpu_attention_args *a, dp_tensor *out, dp_tensor *lse)
{
    dpc_attention d = describe(a);
    dpc_set_device(out->device);
    return gpu_status("scaled_dot_product_attention",
                      dpc_attention_forward(out->dtype, &d, tensor_ptr(out), (float *)tensor_ptr(lse),
                                            gpu_stream_of(out->device)), out->dtype);
}

dp_status gpu_attention_backward(const cpu_attention_args *a, dp_tensor *out, dp_tensor *dout, dp_tensor *lse,
                                 dp_tensor *dq, dp_tensor *dk, dp_tensor *dv)
{
    dpc_attention d = describe(a);
    int64_t bytes = (int64_t)dpc_attention_workspace(out->dtype, &d);
    dp_tensor *workspace = NULL;
    dp_status st = gpu_workspace(&workspace, bytes, out->device);
    if (st)
        return st;
    dpc_set_device(out->device);
    st = gpu_status("scaled_dot_product_attention backward",
                    dpc_attention_backward(out->dtype, &d, tensor_ptr(out), tensor_ptr(dout),
                                           (const float *)tensor_ptr(lse), tensor_ptr(dq), tensor_ptr(dk),
                                           tensor_ptr(dv), workspace ? tensor_ptr(workspace) : NULL,
                                           gpu_stream_of(out->device)), out->dtype);
    dp_tensor_release(workspace);
    return st;
}
#endif
