/*
 * sgd.cuh — one element of an SGD step, in src/cpu/optim.c's order of
 * operations, each rounded as written: optim.cu's sgd_kernel runs it over
 * a flat buffer, and gemm.cu's one-block backward runs it after the
 * gradients it computed (the step in the backward's launch, src/core/
 * gpu_linear.c). One definition, so that both give the CPU's bits.
 *
 * nvcc would otherwise fuse a * b + c into one fma, which rounds once
 * where the CPU rounds twice; the _rn intrinsics are never fused.
 */
#ifndef DPC_SGD_CUH
#define DPC_SGD_CUH

#include <cuda_runtime.h>

#include "dpc_ops.h"

__device__ static inline float mul(float a, float b) { return __fmul_rn(a, b); }
__device__ static inline float add(float a, float b) { return __fadd_rn(a, b); }
__device__ static inline float sub(float a, float b) { return __fsub_rn(a, b); }
__device__ static inline double mul(double a, double b) { return __dmul_rn(a, b); }
__device__ static inline double add(double a, double b) { return __dadd_rn(a, b); }
__device__ static inline double sub(double a, double b) { return __dsub_rn(a, b); }

/* A step's constants in the math type M (float for bfloat16 and float32,
 * double for float64), each rounded to M as the CPU rounds them (the same
 * on the host, for sgd_kernel, or in gemm.cu's kernel): step = lr, damp =
 * 1 - dampening. */
template <typename M>
struct sgd_consts {
    M step, mom, damp, wd;
    int nesterov, first_step;
};

template <typename M>
__host__ __device__ static inline sgd_consts<M> sgd_consts_of(const dpc_sgd_args &a)
{
    return { (M)a.lr, (M)a.momentum, (M)(1 - a.dampening), (M)a.weight_decay, a.nesterov, a.first_step };
}

/* The new value of parameter p whose gradient is g. With a momentum
 * buffer (has_buf) *buf is its old value (unread on the first step) and
 * becomes its new one. */
template <typename M>
__device__ static inline M sgd_element(M p, M g, bool has_buf, M *buf, const sgd_consts<M> &c)
{
    M d = add(g, mul(c.wd, p));
    M upd = d;
    if (has_buf) {
        *buf = c.first_step ? d : add(mul(*buf, c.mom), mul(c.damp, d));
        upd = c.nesterov ? add(d, mul(c.mom, *buf)) : *buf;
    }
    return sub(p, mul(c.step, upd));
}

#endif
