/*
 * activation.cuh — GELU's two forms for device code, shared by the
 * elementwise op (elementwise.cu) and the GEMM epilogues (gemm.cu), so
 * that a Linear with GELU fused in computes what the two ops compute.
 * C is the arithmetic type: float (also for bfloat16) or double.
 */
#ifndef DPLUA_ACTIVATION_CUH
#define DPLUA_ACTIVATION_CUH

__device__ static inline float act_erf(float x) { return erff(x); }
__device__ static inline double act_erf(double x) { return erf(x); }
__device__ static inline float act_tanh(float x) { return tanhf(x); }
__device__ static inline double act_tanh(double x) { return tanh(x); }

/* nn.GELU(): x Phi(x), Phi the normal distribution function */
template <typename C> __device__ static inline C gelu_erf(C x)
{
    return x * (C)0.5 * ((C)1 + act_erf(x * (C)0.70710678118654752440));
}

/* nn.GELU("tanh"): the approximation 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) */
template <typename C> __device__ static inline C gelu_tanh(C x)
{
    return (C)0.5 * x * ((C)1 + act_tanh((C)0.7978845608028654 * (x + (C)0.044715 * x * x * x)));
}

/* g times the derivative of gelu_tanh at x: GELU("tanh")'s backward */
template <typename C> __device__ static inline C gelu_tanh_backward(C g, C x)
{
    const C k = (C)0.7978845608028654, c = (C)0.044715;
    C th = act_tanh(k * (x + c * x * x * x));
    return g * ((C)0.5 * ((C)1 + th) + (C)0.5 * x * ((C)1 - th * th) * k * ((C)1 + (C)3 * c * x * x));
}

#endif
