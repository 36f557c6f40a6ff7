/*
 * conv_direct.h — conv.c's direct path: float32 convolutions computed
 * without columns on x86-64 CPUs with AVX-512, or AVX2 and FMA
 * (conv_direct.c says how).
 */
#ifndef DP_CPU_CONV_DIRECT_H
#define DP_CPU_CONV_DIRECT_H

#include "cpu/cpu.h"

/* True when the direct path computes this convolution: float32, one
 * group, no dilation, strides of 1 or 2, on a CPU with AVX-512, or with
 * AVX2 and FMA for an input of at least 16 channels. */
bool conv_direct_takes(const dp_tensor *x, const dp_tensor *w, const cpu_conv_args *a);
/* And its input's gradient too: at least 8 channels (it computes them in
 * blocks of 16, so that fewer would be mostly zeros). */
bool conv_direct_takes_input_grad(const dp_tensor *x);
/* cpu_conv2d and cpu_conv2d_backward's contracts, bias gradient aside */
dp_status conv_direct_forward(dp_tensor *out, dp_tensor *x, dp_tensor *w, dp_tensor *b, const cpu_conv_args *a);
dp_status conv_direct_backward(dp_tensor *dx, dp_tensor *dw, dp_tensor *g, dp_tensor *x, dp_tensor *w,
                               const cpu_conv_args *a);

#endif
