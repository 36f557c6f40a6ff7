/*
 * optim.cu — fused optimizer updates on the GPU, behind dpc_ops.h.
 *
 * Each step is one grid-stride pass over flat, contiguous buffers (after
 * the blocks that make a first layer's bias gradient, where that waits
 * for the step: below), and repeats src/cpu/optim.c operation by
 * operation: the same constants, rounded to the element type on the host
 * in the same way, and the same order of operations. nvcc would otherwise
 * fuse a * b + c into one fma, which rounds once where the CPU rounds
 * twice; the _rn intrinsics below are never fused, so that a float32 step
 * gives the CPU's bits.
 * bfloat16 computes in float and rounds each stored value, as
 * src/cpu/optim.c does for it; Adam with a float32 master copy of
 * bfloat16 parameters updates the copy and stores its rounding.
 * SGD and Adam have a kernel each; Adadelta, RMSprop and Adagrad
 * (common/optim_rule.h) one kernel template, rule_kernel, instantiated
 * with each rule's element update.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <math.h>

#include <cuda_runtime.h>

#include "dpc_ops.h"
#include "common/dplua_codes.h"
#include "common/dtype_conv.h"
#include "launch.cuh"
#include "sgd.cuh"

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
    return grid_stride_blocks(n, (int64_t)OPTIM_BLOCK * per_thread);
}

/* ------------------------------------------------------------------------ */
/* a bias gradient made first                                                */
/* ------------------------------------------------------------------------ */

/* The first layer's bias gradient db = the column sums of g (m, n) leaves
 * cuBLASLt's weight gradient, which is then one kernel instead of two,
 * and waits for the optimizer's step (src/core/gpu_linear.c): the step's first
 * `blocks` blocks sum BIAS_COLUMNS columns each, then update those
 * elements, and the other blocks update the rest. A column is summed by
 * one block in a fixed order, so the bits do not depend on which launch
 * makes it: dpc_bias_grad_sum, alone, runs the same blocks. */
/* A block's columns: 8, so that a thread adds few rows (the MLP's 256 in
 * 8 loads, all in flight) and the bias blocks end with the others; 32
 * (32 rows a thread) made the MLP step replayed 0.2 us slower on the
 * H200). */
#define BIAS_COLUMNS 8
#define BIAS_ROW_GROUPS (OPTIM_BLOCK / BIAS_COLUMNS)
/* Past these g is summed in cuBLASLt's epilogue (dpc_bias_grad_fits):
 * each thread of a block adds m / BIAS_ROW_GROUPS rows, one after
 * another, and a large g costs its reading again. */
#define BIAS_MAX_ROWS 4096
#define BIAS_MAX_ELEMENTS (1 << 20)

namespace {   /* file-local types: no clash with another file's of the same name */
/* db at element `at` of the step's flat gradient buffer; blocks 0: none */
template <typename S>
struct bias_first {
    int64_t m, n, at;
    const S *g;
    unsigned blocks;
    /* the step's elements its blocks update */
    __host__ __device__ int64_t elements() const { return blocks ? n : 0; }
};
}  // namespace

/* Block blockIdx.x's columns of db (the first BIAS_COLUMNS threads store
 * one each): BIAS_ROW_GROUPS groups of threads add every
 * BIAS_ROW_GROUPS-th row from their first, then one thread adds the groups
 * in order. Returns the column this thread stored, or -1. */
template <typename S, typename T = typename math_of<S>::type>
__device__ static int64_t bias_block_sums(const bias_first<S> &b, S *db)
{
    __shared__ T part[BIAS_ROW_GROUPS][BIAS_COLUMNS];
    const int c = (int)threadIdx.x % BIAS_COLUMNS, r = (int)threadIdx.x / BIAS_COLUMNS;
    const int64_t j = (int64_t)blockIdx.x * BIAS_COLUMNS + c;
    T sum = 0;
    if (j < b.n) {
#pragma unroll 8
        for (int64_t i = r; i < b.m; i += BIAS_ROW_GROUPS)
            sum = add(sum, ld(&b.g[i * b.n + j]));
    }
    part[r][c] = sum;
    __syncthreads();
    if (r != 0 || j >= b.n)
        return -1;
    T total = part[0][c];
    for (int q = 1; q < BIAS_ROW_GROUPS; q++)
        total = add(total, part[q][c]);
    st(&db[j], total);
    return j;
}

template <typename S>
__global__ static void bias_grad_kernel(bias_first<S> b, S *db)
{
    begin_after_previous_kernel();
    (void)bias_block_sums(b, db);
}

/* b's blocks, none when first is NULL; db must lie in grad (n elements of
 * S). False when it does not. (src/core/gpu_linear.c checks that g is none of the
 * step's buffers.) */
template <typename S>
static bool bias_first_of(const dpc_bias_grad *first, const void *grad, int64_t n, bias_first<S> *b)
{
    *b = {};
    if (!first)
        return true;
    const ptrdiff_t bytes = (const char *)first->db - (const char *)grad;
    if (!first->g || !dpc_bias_grad_fits(first->m, first->n) || bytes < 0 ||
        bytes % (ptrdiff_t)sizeof(S) != 0 || bytes / (ptrdiff_t)sizeof(S) + first->n > n)
        return false;
    *b = { first->m, first->n, bytes / (ptrdiff_t)sizeof(S), (const S *)first->g,
           (unsigned)CEIL_DIV(first->n, BIAS_COLUMNS) };
    return true;
}

extern "C" int dpc_bias_grad_fits(int64_t m, int64_t n)
{
    return m > 0 && n > 0 && m <= BIAS_MAX_ROWS && n <= BIAS_MAX_ELEMENTS / m;
}

template <typename S>
static int bias_grad_launch(const dpc_bias_grad *first, cudaStream_t stream)
{
    bias_first<S> b;
    if (!bias_first_of(first, first->db, first->n, &b))
        return (int)cudaErrorInvalidValue;
    return launch_kernel(bias_grad_kernel<S>, b.blocks, OPTIM_BLOCK, stream, b, (S *)first->db);
}

extern "C" int dpc_bias_grad_sum(int dtype, const dpc_bias_grad *b, void *stream)
{
    if (dtype != DP_FLOAT32 && dtype != DP_FLOAT64 && dtype != DP_BFLOAT16)
        return DPC_UNSUPPORTED;
    if (!b || !b->db)
        return (int)cudaErrorInvalidValue;
    cudaStream_t s = (cudaStream_t)stream;
    return dtype == DP_FLOAT32    ? bias_grad_launch<float>(b, s)
           : dtype == DP_BFLOAT16 ? bias_grad_launch<bf16s>(b, s)
                                  : bias_grad_launch<double>(b, s);
}

/* The step's elements besides the bias gradient's (which its own blocks
 * make and update): `count` of them, the e-th at index(e), a grid-stride
 * loop over them from `first` by `stride` in the blocks after the bias
 * gradient's. */
namespace {   /* file-local types: no clash with another file's of the same name */
struct rest_of {
    int64_t first, stride, count, skip_at, skip;
    __device__ int64_t index(int64_t e) const { return e < skip_at ? e : e + skip; }
};
}  // namespace

template <typename S>
__device__ static inline rest_of rest_after(const bias_first<S> &b, int64_t n)
{
    const int64_t blk = (int64_t)blockIdx.x - b.blocks, blocks = (int64_t)gridDim.x - b.blocks;
    return { blk * blockDim.x + threadIdx.x, blocks * blockDim.x, n - b.elements(), b.blocks ? b.at : n,
             b.elements() };
}

/* The grid of a step over n elements, ILP a thread, after b's blocks */
template <typename S>
static unsigned grid_after(int64_t n, const bias_first<S> &b, int per_thread)
{
    return b.blocks + grid_for(n - b.elements(), per_thread);
}

/* ------------------------------------------------------------------------ */
/* SGD                                                                       */
/* ------------------------------------------------------------------------ */

/* Elements a thread of sgd_kernel loads before it computes any: their
 * latencies overlap, and a quarter of the blocks (the MLP's 235K
 * parameters took 919 blocks of one element a thread) wait on them. */
#define SGD_ILP 4

/* Element i's step from its parameter p, gradient g and old momentum b */
template <typename S, typename T>
__device__ static inline void sgd_store(int64_t i, S *P, S *B, T p, T g, T b, const sgd_consts<T> &c)
{
    const T np = sgd_element(p, g, B != NULL, &b, c);
    if (B)
        st(&B[i], b);
    st(&P[i], np);
}

/* P, G, B are (n,); B is NULL without momentum. c's constants are already
 * rounded to T, as on the CPU. Each element is computed as before, by one
 * thread: only the order in which the threads load them changes. The
 * first bias.blocks blocks make the bias gradient in G first. */
template <typename S, typename T = typename math_of<S>::type>
__global__ static void sgd_kernel(int64_t n, S *P, S *G, S *B, sgd_consts<T> c, bias_first<S> bias)
{
    begin_after_previous_kernel();
    const bool old_buf = B && !c.first_step;
    if (blockIdx.x < bias.blocks) {
        const int64_t j = bias_block_sums(bias, G + bias.at);
        if (j >= 0) {
            const int64_t i = bias.at + j;
            sgd_store(i, P, B, ld(&P[i]), ld(&G[i]), old_buf ? ld(&B[i]) : (T)0, c);
        }
        return;
    }
    const rest_of rest = rest_after(bias, n);
    for (int64_t e0 = rest.first; e0 < rest.count; e0 += SGD_ILP * rest.stride) {
        T p[SGD_ILP], g[SGD_ILP], b[SGD_ILP];
#pragma unroll
        for (int u = 0; u < SGD_ILP; u++) {
            const int64_t e = e0 + u * rest.stride, i = rest.index(e);
            if (e < rest.count) {
                p[u] = ld(&P[i]);
                g[u] = ld(&G[i]);
                b[u] = old_buf ? ld(&B[i]) : (T)0;
            }
        }
#pragma unroll
        for (int u = 0; u < SGD_ILP; u++) {
            const int64_t e = e0 + u * rest.stride;
            if (e < rest.count)
                sgd_store(rest.index(e), P, B, p[u], g[u], b[u], c);
        }
    }
}

template <typename S, typename T = typename math_of<S>::type>
static int sgd_launch(const dpc_sgd_args &a, const dpc_bias_grad *first, cudaStream_t stream)
{
    bias_first<S> bias;
    if (!bias_first_of(first, a.grad, a.n, &bias))
        return (int)cudaErrorInvalidValue;
    return launch_kernel(sgd_kernel<S>, grid_after(a.n, bias, SGD_ILP), OPTIM_BLOCK, stream, a.n, (S *)a.param,
                         (S *)a.grad, (S *)a.momentum_buf, sgd_consts_of<T>(a), bias);
}

extern "C" int dpc_sgd_step(int dtype, const dpc_sgd_args *a, const dpc_bias_grad *first, void *stream)
{
    if (dtype != DP_FLOAT32 && dtype != DP_FLOAT64 && dtype != DP_BFLOAT16)
        return DPC_UNSUPPORTED;
    if (a->n < 0 || (a->n > 0 && (a->param == NULL || a->grad == NULL)))
        return (int)cudaErrorInvalidValue;
    if (a->n == 0)
        return 0;
    cudaStream_t s = (cudaStream_t)stream;
    return dtype == DP_FLOAT32    ? sgd_launch<float>(*a, first, s)
           : dtype == DP_BFLOAT16 ? sgd_launch<bf16s>(*a, first, s)
                                  : sgd_launch<double>(*a, first, s);
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

/* Element i's step: P, G, M, V, VM as adam_kernel's. With a master copy
 * W the step reads and writes W (float) and stores its rounding in P. */
template <typename S, typename GS, typename Z, typename T>
__device__ static inline void adam_update(int64_t i, S *P, T *W, const GS *G, Z *M, Z *V, Z *VM,
                                          const adam_consts<T> &c)
{
    T p = W ? W[i] : ld(&P[i]), grad = ld(&G[i]);
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
    const T np = sub(p, mul(c.step_size, dvd(m, denom)));
    if (W)
        W[i] = np;
    st(&P[i], np);
}

/* P, G, M, V, VM are (n,); VM is NULL without amsgrad. P of storage S, G
 * of GS, the state of Z; W NULL, or the float master copy of bfloat16 P
 * (then Z is float). With step_dev (capturable Adam: the step count lives
 * on the device, so that a CUDA graph replays every step with its own
 * count) the two step-dependent constants come from it, computed as
 * adam_launch does on the host. The first bias.blocks blocks make the
 * bias gradient in G first. */
template <typename S, typename GS, typename Z, typename T = typename math_of<Z>::type>
__global__ static void adam_kernel(int64_t n, S *P, T *W, GS *G, Z *M, Z *V, Z *VM, adam_consts<T> c,
                                   const double *step_dev, double lr, double beta1, double beta2,
                                   bias_first<GS> bias)
{
    begin_after_previous_kernel();
    if (step_dev) {
        double step = *step_dev;
        c.step_size = (T)(lr / (1 - pow(beta1, step)));
        c.bc2_sqrt = (T)sqrt(1 - pow(beta2, step));
    }
    if (blockIdx.x < bias.blocks) {
        const int64_t j = bias_block_sums(bias, G + bias.at);
        if (j >= 0)
            adam_update(bias.at + j, P, W, G, M, V, VM, c);
        return;
    }
    const rest_of rest = rest_after(bias, n);
    for (int64_t e = rest.first; e < rest.count; e += rest.stride)
        adam_update(rest.index(e), P, W, G, M, V, VM, c);
}

__global__ static void step_increment_kernel(double *step)
{
    begin_after_previous_kernel();
    *step += 1;
}

template <typename S, typename GS, typename Z, typename T = typename math_of<Z>::type>
static int adam_launch(int64_t n, const dpc_adam_buffers &b, double lr, double beta1, double beta2, double eps,
                       double weight_decay, int decoupled, int64_t step, double *step_dev,
                       const dpc_bias_grad *first, cudaStream_t stream)
{
    bias_first<GS> bias;
    if (!bias_first_of(first, b.grad, n, &bias))
        return (int)cudaErrorInvalidValue;
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
    return launch_kernel(adam_kernel<S, GS, Z>, grid_after(n, bias, 1), OPTIM_BLOCK, stream, n, (S *)b.param,
                         (T *)b.master, (GS *)b.grad, (Z *)b.exp_avg, (Z *)b.exp_avg_sq, (Z *)b.max_exp_avg_sq, c,
                         step_dev, lr, beta1, beta2, bias);
}

extern "C" int dpc_adam_step(int dtype, int64_t n, const dpc_adam_buffers *b, double lr, double beta1, double beta2,
                             double eps, double weight_decay, int decoupled, int64_t step, double *step_dev,
                             const dpc_bias_grad *first, void *stream)
{
    if (dtype != DP_FLOAT32 && dtype != DP_FLOAT64 && dtype != DP_BFLOAT16)
        return DPC_UNSUPPORTED;
    if (b->master && (dtype != DP_BFLOAT16 || (b->grad_dtype != DP_BFLOAT16 && b->grad_dtype != DP_FLOAT32)))
        return DPC_UNSUPPORTED;
    if (!b->master && b->grad_dtype != dtype)
        return DPC_UNSUPPORTED;
    if (n < 0 || (n > 0 && (b->param == NULL || b->grad == NULL || b->exp_avg == NULL || b->exp_avg_sq == NULL)))
        return (int)cudaErrorInvalidValue;
    if (n == 0)
        return 0;
    cudaStream_t s = (cudaStream_t)stream;
#define ADAM_LAUNCH(S, GS, Z) \
    adam_launch<S, GS, Z>(n, *b, lr, beta1, beta2, eps, weight_decay, decoupled, step, step_dev, first, s)
    if (b->master)
        return b->grad_dtype == DP_FLOAT32 ? ADAM_LAUNCH(bf16s, float, float) : ADAM_LAUNCH(bf16s, bf16s, float);
    if (dtype == DP_FLOAT32)
        return ADAM_LAUNCH(float, float, float);
    if (dtype == DP_BFLOAT16)
        return ADAM_LAUNCH(bf16s, bf16s, bf16s);
    return ADAM_LAUNCH(double, double, double);
#undef ADAM_LAUNCH
}

/* ------------------------------------------------------------------------ */
/* Adadelta, RMSprop and Adagrad                                             */
/* ------------------------------------------------------------------------ */

namespace {   /* file-local types: no clash with another file's of the same name */
/* A step's constants, each rounded to T on the host exactly where
 * src/cpu/optim.c casts (neg_lr = (T)-lr, rest = (T)(1 - decay)). */
template <typename T>
struct rule_consts {
    T lr, neg_lr, eps, wd, decay, rest, momentum;
    bool decays, centered, moves;   /* weight_decay != 0, centered, momentum > 0 */
};

/* The flat buffers; state as common/optim_rule.h lists it */
template <typename S>
struct rule_buffers {
    S *param, *grad, *state[3];
};

/* Element i's gradient, with weight_decay * the parameter added where
 * the group decays (every rule's first step). */
template <typename S, typename T>
__device__ static T decayed_grad(int64_t i, const rule_buffers<S> &b, const rule_consts<T> &c)
{
    const T g = ld(&b.grad[i]);
    return c.decays ? add(g, mul(c.wd, ld(&b.param[i]))) : g;
}

/* Element i's update by each rule, in src/cpu/optim.c's order of
 * operations (PyTorch's single-tensor step). */
struct adadelta {
    template <typename S, typename T>
    __device__ static void update(int64_t i, const rule_buffers<S> &b, const rule_consts<T> &c)
    {
        const T g = decayed_grad(i, b, c), acc = ld(&b.state[1][i]);
        const T square_avg = add(mul(ld(&b.state[0][i]), c.decay), mul(mul(c.rest, g), g));
        const T delta = mul(dvd(root(add(acc, c.eps)), root(add(square_avg, c.eps))), g);
        st(&b.state[0][i], square_avg);
        st(&b.state[1][i], add(mul(acc, c.decay), mul(mul(c.rest, delta), delta)));
        st(&b.param[i], sub(ld(&b.param[i]), mul(c.lr, delta)));
    }
};

struct rmsprop {
    template <typename S, typename T>
    __device__ static void update(int64_t i, const rule_buffers<S> &b, const rule_consts<T> &c)
    {
        const T p = ld(&b.param[i]), g = decayed_grad(i, b, c);
        const T square_avg = add(mul(ld(&b.state[0][i]), c.decay), mul(mul(c.rest, g), g));
        st(&b.state[0][i], square_avg);
        T avg;
        if (c.centered) {
            const T grad_avg = add(mul(ld(&b.state[1][i]), c.decay), mul(c.rest, g));
            st(&b.state[1][i], grad_avg);
            avg = root(sub(square_avg, mul(grad_avg, grad_avg)));
        } else {
            avg = root(square_avg);
        }
        avg = add(avg, c.eps);
        if (c.moves) {
            const T buf = add(mul(ld(&b.state[2][i]), c.momentum), dvd(g, avg));
            st(&b.state[2][i], buf);
            st(&b.param[i], sub(p, mul(c.lr, buf)));
        } else {
            st(&b.param[i], add(p, dvd(mul(c.neg_lr, g), avg)));
        }
    }
};

struct adagrad {
    template <typename S, typename T>
    __device__ static void update(int64_t i, const rule_buffers<S> &b, const rule_consts<T> &c)
    {
        const T p = ld(&b.param[i]), g = decayed_grad(i, b, c);
        const T sum = add(ld(&b.state[0][i]), mul(g, g));
        st(&b.state[0][i], sum);
        st(&b.param[i], add(p, dvd(mul(c.neg_lr, g), add(root(sum), c.eps))));
    }
};
}  // namespace

/* Rule's step over n elements, one thread an element. The first
 * bias.blocks blocks make the bias gradient in b.grad first. */
template <typename Rule, typename S, typename T = typename math_of<S>::type>
__global__ static void rule_kernel(int64_t n, rule_buffers<S> b, rule_consts<T> c, bias_first<S> bias)
{
    begin_after_previous_kernel();
    if (blockIdx.x < bias.blocks) {
        const int64_t j = bias_block_sums(bias, b.grad + bias.at);
        if (j >= 0)
            Rule::update(bias.at + j, b, c);
        return;
    }
    const rest_of rest = rest_after(bias, n);
    for (int64_t e = rest.first; e < rest.count; e += rest.stride)
        Rule::update(rest.index(e), b, c);
}

template <typename Rule, typename S, typename T = typename math_of<S>::type>
static int rule_launch(int64_t n, const optim_rule &r, const rule_buffers<S> &b, const dpc_bias_grad *first,
                       cudaStream_t stream)
{
    bias_first<S> bias;
    if (!bias_first_of(first, b.grad, n, &bias))
        return (int)cudaErrorInvalidValue;
    rule_consts<T> c;
    c.lr = (T)r.lr;
    c.neg_lr = (T)-r.lr;
    c.eps = (T)r.eps;
    c.wd = (T)r.weight_decay;
    c.decay = (T)r.decay;
    c.rest = (T)(1 - r.decay);
    c.momentum = (T)r.momentum;
    c.decays = r.weight_decay != 0;
    c.centered = r.centered != 0;
    c.moves = r.momentum > 0;
    return launch_kernel(rule_kernel<Rule, S>, grid_after(n, bias, 1), OPTIM_BLOCK, stream, n, b, c, bias);
}

template <typename S>
static int rule_dispatch(int64_t n, const optim_rule &r, void *param, void *grad, void *const state[3],
                         const dpc_bias_grad *first, cudaStream_t stream)
{
    const rule_buffers<S> b = { (S *)param, (S *)grad, { (S *)state[0], (S *)state[1], (S *)state[2] } };
    switch (r.kind) {
    case OPTIM_ADADELTA: return rule_launch<adadelta>(n, r, b, first, stream);
    case OPTIM_RMSPROP: return rule_launch<rmsprop>(n, r, b, first, stream);
    case OPTIM_ADAGRAD: return rule_launch<adagrad>(n, r, b, first, stream);
    }
    return DPC_UNSUPPORTED;
}

/* Whether the state buffers that r reads are there. */
static bool rule_has_state(const optim_rule &r, void *const state[3])
{
    switch (r.kind) {
    case OPTIM_ADADELTA: return state[0] && state[1];
    case OPTIM_RMSPROP: return state[0] && (!r.centered || state[1]) && (r.momentum <= 0 || state[2]);
    case OPTIM_ADAGRAD: return state[0] != NULL;
    }
    return false;
}

extern "C" int dpc_rule_step(int dtype, int64_t n, const optim_rule *r, void *param, void *grad,
                             void *const state[3], const dpc_bias_grad *first, void *stream)
{
    if (dtype != DP_FLOAT32 && dtype != DP_FLOAT64 && dtype != DP_BFLOAT16)
        return DPC_UNSUPPORTED;
    if (n < 0 || (n > 0 && (param == NULL || grad == NULL || !rule_has_state(*r, state))))
        return (int)cudaErrorInvalidValue;
    if (n == 0)
        return 0;
    cudaStream_t s = (cudaStream_t)stream;
    return dtype == DP_FLOAT32    ? rule_dispatch<float>(n, *r, param, grad, state, first, s)
           : dtype == DP_BFLOAT16 ? rule_dispatch<bf16s>(n, *r, param, grad, state, first, s)
                                  : rule_dispatch<double>(n, *r, param, grad, state, first, s);
}
