/*
 * optim.cu — fused optimizer updates on the GPU, behind dpc_ops.h.
 *
 * Each step is one grid-stride pass over flat, contiguous buffers, and
 * repeats src/cpu/optim.c operation by operation: the same constants,
 * rounded to the element type on the host in the same way, and the same
 * order of operations. nvcc would otherwise fuse a * b + c into one fma,
 * which rounds once where the CPU rounds twice; the _rn intrinsics below
 * are never fused, so that a float32 step gives the CPU's bits.
 * bfloat16 computes in float and rounds each stored value, as
 * src/cpu/optim.c does for it.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <math.h>

#include <cuda_runtime.h>

#include "dpc_ops.h"
#include "dplua.h"
#include "core/dtype_conv.h"
#include "launch.cuh"
#include "sgd.cuh"

#define CEIL_DIV(a, b) (((a) + (b) - 1) / (b))

/* Past this many blocks a grid-stride loop does the rest. */
#define DPC_MAX_BLOCKS 65536
#define OPTIM_BLOCK 256

/* ------------------------------------------------------------------------ */
/* unfused arithmetic (mul, add, sub: sgd.cuh)                               */
/* ------------------------------------------------------------------------ */

__device__ static inline float dvd(float a, float b) { return __fdiv_rn(a, b); }
/* The CPU takes (float)sqrt((double)x); the square root of a float rounded
 * to double and then to float is the correctly rounded float square root,
 * which is what __fsqrt_rn gives. */
__device__ static inline float root(float a) { return __fsqrt_rn(a); }
__device__ static inline double dvd(double a, double b) { return __ddiv_rn(a, b); }
__device__ static inline double root(double a) { return __dsqrt_rn(a); }

/* Storage and arithmetic: float32 and float64 compute in their own type;
 * bfloat16 loads into float, computes there and rounds on each store (as
 * PyTorch's bf16 updates, which compute in float). */
namespace {   /* file-local types: no clash with another file's of the same name */
struct bf16s {
    uint16_t bits;
};
template <typename S> struct math_of { typedef S type; };
template <> struct math_of<bf16s> { typedef float type; };
}  // namespace

template <typename T> __device__ static inline T ld(const T *p) { return *p; }
template <typename T> __device__ static inline void st(T *p, T v) { *p = v; }
__device__ static inline float ld(const bf16s *p) { return bf16_to_f32(p->bits); }
__device__ static inline void st(bf16s *p, float v) { p->bits = f32_to_bf16(v); }

/* Elements each thread of an update takes (ILP of them at once). */
static unsigned grid_for(int64_t n, int per_thread = 1)
{
    int64_t grid = CEIL_DIV(n, (int64_t)OPTIM_BLOCK * per_thread);
    return (unsigned)(grid > DPC_MAX_BLOCKS ? DPC_MAX_BLOCKS : grid);
}

/* ------------------------------------------------------------------------ */
/* SGD                                                                       */
/* ------------------------------------------------------------------------ */

/* Elements a thread of sgd_kernel loads before it computes any: their
 * latencies overlap, and a quarter of the blocks (the MLP's 235K
 * parameters took 919 blocks of one element a thread) wait on them. */
#define SGD_ILP 4

/* P, G, B are (n,); B is NULL without momentum. c's constants are already
 * rounded to T, as on the CPU. Each element is computed as before, by one
 * thread: only the order in which the threads load them changes. */
template <typename S, typename T = typename math_of<S>::type>
__global__ static void sgd_kernel(int64_t n, S *P, const S *G, S *B, sgd_consts<T> c)
{
    begin_after_previous_kernel();
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    const bool old_buf = B && !c.first_step;
    for (int64_t i0 = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i0 < n; i0 += SGD_ILP * stride) {
        T p[SGD_ILP], g[SGD_ILP], b[SGD_ILP];
#pragma unroll
        for (int u = 0; u < SGD_ILP; u++) {
            const int64_t i = i0 + u * stride;
            if (i < n) {
                p[u] = ld(&P[i]);
                g[u] = ld(&G[i]);
                b[u] = old_buf ? ld(&B[i]) : (T)0;
            }
        }
#pragma unroll
        for (int u = 0; u < SGD_ILP; u++) {
            const int64_t i = i0 + u * stride;
            if (i >= n)
                break;
            const T np = sgd_element(p[u], g[u], B != NULL, &b[u], c);
            if (B)
                st(&B[i], b[u]);
            st(&P[i], np);
        }
    }
}

template <typename S, typename T = typename math_of<S>::type>
static int sgd_launch(const dpc_sgd_args &a, cudaStream_t stream)
{
    return launch_kernel(sgd_kernel<S>, grid_for(a.n, SGD_ILP), OPTIM_BLOCK, stream, a.n, (S *)a.param,
                         (const S *)a.grad, (S *)a.momentum_buf, sgd_consts_of<T>(a));
}

extern "C" int dpc_sgd_step(int dtype, const dpc_sgd_args *a, void *stream)
{
    if (dtype != DP_FLOAT32 && dtype != DP_FLOAT64 && dtype != DP_BFLOAT16)
        return DPC_UNSUPPORTED;
    if (a->n < 0 || (a->n > 0 && (a->param == NULL || a->grad == NULL)))
        return (int)cudaErrorInvalidValue;
    if (a->n == 0)
        return 0;
    cudaStream_t s = (cudaStream_t)stream;
    return dtype == DP_FLOAT32    ? sgd_launch<float>(*a, s)
           : dtype == DP_BFLOAT16 ? sgd_launch<bf16s>(*a, s)
                                  : sgd_launch<double>(*a, s);
}

/* ------------------------------------------------------------------------ */
/* Adam and AdamW                                                            */
/* ------------------------------------------------------------------------ */

/* The constants of one step, each rounded to T on the host exactly where
 * src/cpu/optim.c casts. */
namespace {   /* file-local types: no clash with another file's of the same name */
template <typename T>
struct adam_consts {
    T decay;       /* (T)(1 - lr * weight_decay), decoupled (AdamW) */
    T wd;          /* (T)weight_decay, coupled (Adam) */
    T beta1, one_minus_beta1, beta2, one_minus_beta2;
    T bc2_sqrt, eps, step_size;
    int decoupled, coupled;   /* coupled: weight_decay != 0 and not decoupled */
};
}  // namespace

/* P, G, M, V, VM are (n,); VM is NULL without amsgrad. With step_dev
 * (capturable Adam: the step count lives on the device, so that a CUDA
 * graph replays every step with its own count) the two step-dependent
 * constants come from it, computed as adam_launch does on the host. */
template <typename S, typename T = typename math_of<S>::type>
__global__ static void adam_kernel(int64_t n, S *P, const S *G, S *M, S *V, S *VM, adam_consts<T> c,
                                   const double *step_dev, double lr, double beta1, double beta2)
{
    begin_after_previous_kernel();
    if (step_dev) {
        double step = *step_dev;
        c.step_size = (T)(lr / (1 - pow(beta1, step)));
        c.bc2_sqrt = (T)sqrt(1 - pow(beta2, step));
    }
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        T p = ld(&P[i]), grad = ld(&G[i]);
        if (c.decoupled)
            p = mul(p, c.decay);
        else if (c.coupled)
            grad = add(grad, mul(c.wd, p));
        T m = add(mul(ld(&M[i]), c.beta1), mul(c.one_minus_beta1, grad));
        T v = add(mul(ld(&V[i]), c.beta2), mul(mul(c.one_minus_beta2, grad), grad));
        st(&M[i], m);
        st(&V[i], v);
        T second = v;
        if (VM) {
            T vm = ld(&VM[i]);
            if (vm < v) {     /* as the CPU: a NaN in v leaves the max alone */
                vm = v;
                st(&VM[i], vm);
            }
            second = vm;
        }
        T denom = add(dvd(root(second), c.bc2_sqrt), c.eps);
        st(&P[i], sub(p, mul(c.step_size, dvd(m, denom))));
    }
}

__global__ static void step_increment_kernel(double *step)
{
    begin_after_previous_kernel();
    *step += 1;
}

template <typename S, typename T = typename math_of<S>::type>
static int adam_launch(int64_t n, void *param, const void *grad, void *exp_avg, void *exp_avg_sq,
                       void *max_exp_avg_sq, double lr, double beta1, double beta2, double eps,
                       double weight_decay, int decoupled, int64_t step, double *step_dev, cudaStream_t stream)
{
    if (step_dev) {
        int rc = launch_kernel(step_increment_kernel, 1, 1, stream, step_dev);
        if (rc)
            return rc;
        step = 1;   /* (the kernel reads the count from step_dev) */
    }
    double bc1 = 1 - pow(beta1, (double)step), bc2 = 1 - pow(beta2, (double)step);
    double step_size = lr / bc1, bc2_sqrt = sqrt(bc2);
    adam_consts<T> c;
    c.decay = (T)(1 - lr * weight_decay);
    c.wd = (T)weight_decay;
    c.beta1 = (T)beta1;
    c.one_minus_beta1 = (T)(1 - beta1);
    c.beta2 = (T)beta2;
    c.one_minus_beta2 = (T)(1 - beta2);
    c.bc2_sqrt = (T)bc2_sqrt;
    c.eps = (T)eps;
    c.step_size = (T)step_size;
    c.decoupled = decoupled != 0;
    c.coupled = !decoupled && weight_decay != 0;
    return launch_kernel(adam_kernel<S>, grid_for(n), OPTIM_BLOCK, stream, n, (S *)param, (const S *)grad, (S *)exp_avg,
                         (S *)exp_avg_sq, (S *)max_exp_avg_sq, c, step_dev, lr, beta1, beta2);
}

extern "C" int dpc_adam_step(int dtype, int64_t n, void *param, const void *grad, void *exp_avg, void *exp_avg_sq,
                             void *max_exp_avg_sq, double lr, double beta1, double beta2, double eps,
                             double weight_decay, int decoupled, int64_t step, double *step_dev, void *stream)
{
    if (dtype != DP_FLOAT32 && dtype != DP_FLOAT64 && dtype != DP_BFLOAT16)
        return DPC_UNSUPPORTED;
    if (n < 0 || (n > 0 && (param == NULL || grad == NULL || exp_avg == NULL || exp_avg_sq == NULL)))
        return (int)cudaErrorInvalidValue;
    if (n == 0)
        return 0;
    if (dtype == DP_FLOAT32)
        return adam_launch<float>(n, param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, lr, beta1, beta2, eps,
                                  weight_decay, decoupled, step, step_dev, (cudaStream_t)stream);
    if (dtype == DP_BFLOAT16)
        return adam_launch<bf16s>(n, param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, lr, beta1, beta2, eps,
                                  weight_decay, decoupled, step, step_dev, (cudaStream_t)stream);
    return adam_launch<double>(n, param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, lr, beta1, beta2, eps,
                               weight_decay, decoupled, step, step_dev, (cudaStream_t)stream);
}
