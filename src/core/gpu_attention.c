/*
 * gpu_attention.c — the attention op's GPU side: the (B, H, n, d) views of
 * src/core/attention.c and their outputs described for the flash kernels of
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

/* t's strides for b, h and the sequence */
static void strides3(int64_t st[3], const dp_tensor *t)
{
    for (int d = 0; d < 3; d++)
        st[d] = t->stride[d];
}

/* The call's description; the outputs and dout (NULL where the call has
 * none) by their strides too. */
static dpc_attention describe(const cpu_attention_args *a, const dp_tensor *out, const dp_tensor *dout,
                              dp_tensor *const grads[3])
{
    const dp_tensor *q = a->q, *k = a->k, *v = a->v;
    dpc_attention d = {
        .B = q->shape[0], .H = q->shape[1], .L = q->shape[2], .S = k->shape[2], .E = q->shape[3], .Ev = v->shape[3],
        .q = tensor_ptr(q), .k = tensor_ptr(k), .v = tensor_ptr(v),
        .scale = a->scale, .causal = a->causal,
    };
    strides3(d.q_stride, q);
    strides3(d.k_stride, k);
    strides3(d.v_stride, v);
    strides3(d.o_stride, out);
    if (dout) {
        strides3(d.do_stride, dout);
        strides3(d.dq_stride, grads[0]);
        strides3(d.dk_stride, grads[1]);
        strides3(d.dv_stride, grads[2]);
    }
    return d;
}

dp_status gpu_attention_forward(const cpu_attention_args *a, dp_tensor *out, dp_tensor *lse)
{
    dpc_attention d = describe(a, out, NULL, NULL);
    dpc_set_device(out->device);
    return gpu_status("scaled_dot_product_attention",
                      dpc_attention_forward(out->dtype, &d, tensor_ptr(out), (float *)tensor_ptr(lse),
                                            gpu_stream_of(out->device)), out->dtype);
}

dp_status gpu_attention_backward(const cpu_attention_args *a, dp_tensor *out, dp_tensor *dout, dp_tensor *lse,
                                 dp_tensor *dq, dp_tensor *dk, dp_tensor *dv)
{
    dpc_attention d = describe(a, out, dout, (dp_tensor *[3]){ dq, dk, dv });
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
