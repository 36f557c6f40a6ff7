/*
 * elementwise.cu — unary, binary, unary backward, where, clamp, cast and
 * fill on the GPU, behind dpc_ops.h.
 *
 * The semantics are those of src/cpu/elementwise.c, expression for
 * expression: the same compute type per dtype (float for float32 and
 * bfloat16, double for float64, the integer type itself with wrapping
 * arithmetic done unsigned, 0/1 ints for bool), the same NaN rules and the
 * same table of which op exists for which dtype (DPC_UNSUPPORTED where the
 * CPU has no row).
 *
 * One strided iterator serves every op: the host merges dims that are
 * contiguous for all operands (as cpu_foreach does) and, when one dim is
 * left, the kernel addresses element i as data + i * stride with no index
 * arithmetic; otherwise it splits i over the shape with div/mod. Where
 * the innermost dim is contiguous for every operand (or one broadcast
 * value), and aligned, each thread instead takes 16 bytes of the widest
 * operand's elements at a time (8 of bfloat16; a cast from float32 takes
 * 4 of each), every operand read and the output written one vector load
 * or store each (ew_vec_kernel): a contiguous op, and as well a strided
 * one such as a transpose of heads or a bias broadcast over rows, whose
 * index arithmetic is then done once per vector. The op and dtypes are
 * template parameters of a small functor, which also states each
 * operand's element size, so each kernel holds one op's code only.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <type_traits>

#include <cuda_runtime.h>

#include "common/dplua_codes.h"
#include "dpc_ops.h"
#include "common/dtype_conv.h"
#include "common/elementwise.h"   /* ipow */
#include "activation.cuh"
#include "iter.cuh"
#include "launch.cuh"

#define EW_THREADS 256

/* ------------------------------------------------------------------------ */
/* dtypes: storage, compute type and the conversions of src/core/dtype.c     */
/* ------------------------------------------------------------------------ */

enum { K_FLOAT, K_INT, K_BOOL };

/* One struct per dtype: storage S, compute C, load and store. */
#define PLAIN_DTYPE(name, ID, T, KIND)                                               \
    struct name {                                                                    \
        typedef T S;                                                                 \
        typedef T C;                                                                 \
        static constexpr int id = ID, kind = KIND;                                   \
        __device__ static C load(const char *p) { return *(const T *)p; }           \
        __device__ static void store(char *p, C v) { *(T *)p = v; }                 \
    };
namespace {   /* file-local types: no clash with another file's of the same name */
PLAIN_DTYPE(t_f32, DP_FLOAT32, float, K_FLOAT)
PLAIN_DTYPE(t_f64, DP_FLOAT64, double, K_FLOAT)
PLAIN_DTYPE(t_i64, DP_INT64, int64_t, K_INT)
PLAIN_DTYPE(t_i32, DP_INT32, int32_t, K_INT)
PLAIN_DTYPE(t_u8, DP_UINT8, uint8_t, K_INT)

struct t_bf16 {
    typedef uint16_t S;
    typedef float C;
    static constexpr int id = DP_BFLOAT16, kind = K_FLOAT;
    __device__ static C load(const char *p) { return bf16_to_f32(*(const uint16_t *)p); }
    __device__ static void store(char *p, C v) { *(uint16_t *)p = f32_to_bf16(v); }
};

struct t_b8 {
    typedef uint8_t S;
    typedef int C;
    static constexpr int id = DP_BOOL, kind = K_BOOL;
    __device__ static C load(const char *p) { return *(const uint8_t *)p != 0; }
    __device__ static void store(char *p, C v) { *(uint8_t *)p = (uint8_t)(v != 0); }
};
}  // namespace

/* Calls fn(T()) with T the struct of `dtype`. */
template <class Fn> static int with_dtype(int dtype, Fn fn)
{
    switch (dtype) {
    case DP_FLOAT32: return fn(t_f32());
    case DP_FLOAT64: return fn(t_f64());
    case DP_INT64: return fn(t_i64());
    case DP_INT32: return fn(t_i32());
    case DP_UINT8: return fn(t_u8());
    case DP_BOOL: return fn(t_b8());
    case DP_BFLOAT16: return fn(t_bf16());
    }
    return DPC_UNSUPPORTED;
}

/* Byte moves (where, copy, fill) need only the element size. */
template <class Fn> static int with_size(size_t es, Fn fn)
{
    switch (es) {
    case 1: return fn(uint8_t());
    case 2: return fn(uint16_t());
    case 4: return fn(uint32_t());
    case 8: return fn(uint64_t());
    }
    return DPC_UNSUPPORTED;
}

/* ------------------------------------------------------------------------ */
/* the strided iterator and the one kernel                                   */
/* ------------------------------------------------------------------------ */

/* FLAT: at most one dim is left, element i is at data + i * stride. */
template <int N, bool FLAT, class F>
__global__ static void ew_kernel(dpc_iter<N> it, int64_t n, F f)
{
    begin_after_previous_kernel();
    grid_stride_loop(n, [&](int64_t i) {
        char *p[N];
        if (FLAT) {
#pragma unroll
            for (int k = 0; k < N; k++)
                p[k] = it.data[k] + i * it.stride[k][0];
        } else {
            iter_ptrs<N>(it, i, p);
        }
        f(p);
    });
}

/* Moves `bytes` (16, 8, 4 or 2; the address aligned to as many) between
 * memory and a register buffer. */
__device__ __forceinline__ void vec_load(uint4 &dst, const char *p, int bytes)
{
    switch (bytes) {
    case 16: dst = *(const uint4 *)p; break;
    case 8: *(uint2 *)&dst = *(const uint2 *)p; break;
    case 4: *(uint32_t *)&dst = *(const uint32_t *)p; break;
    default: *(uint16_t *)&dst = *(const uint16_t *)p; break;
    }
}

__device__ __forceinline__ void vec_store(char *p, const uint4 &src, int bytes)
{
    switch (bytes) {
    case 16: *(uint4 *)p = src; break;
    case 8: *(uint2 *)p = *(const uint2 *)&src; break;
    case 4: *(uint32_t *)p = *(const uint32_t *)&src; break;
    default: *(uint16_t *)p = *(const uint16_t *)&src; break;
    }
}

/* The largest element size of f's N operands (F::size(k): operand k's). */
template <int N, class F> __host__ __device__ constexpr int largest_size()
{
    int m = 1;
    for (int k = 0; k < N; k++)
        m = F::size(k) > m ? F::size(k) : m;
    return m;
}

/* V = 16 / the largest element size elements a thread at a time along
 * the innermost dim, which is contiguous (or of stride 0) for every
 * operand: each operand's V elements are one load of V x its element size
 * (16 bytes for the largest), an operand of stride 0 one value repeated;
 * f on each element in registers; the output one store. FLAT: one dim
 * (element i at data + i * stride), the last n % V elements one a thread;
 * else `it` counts vectors (its innermost shape divided by V, strides of
 * V elements), found by div/mod once per V elements. f reads its operands
 * before it writes its output, so an output that is also an input is
 * right. */
template <int N, bool FLAT, class F>
__global__ static void ew_vec_kernel(dpc_iter<N> it, int64_t vectors, int64_t n, F f)
{
    begin_after_previous_kernel();
    constexpr int V = 16 / largest_size<N, F>();
    const int last = FLAT ? 0 : it.ndim - 1;
    const int64_t step = (int64_t)gridDim.x * blockDim.x, first = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (int64_t c = first; c < vectors; c += step) {
        char *p[N];
        if (FLAT) {
#pragma unroll
            for (int k = 0; k < N; k++)
                p[k] = it.data[k] + c * V * it.stride[k][0];
        } else {
            iter_ptrs<N>(it, c, p);
        }
        uint4 buf[N];
#pragma unroll
        for (int k = 1; k < N; k++) {
            if (it.stride[k][last] == 0) {
#pragma unroll
                for (int j = 0; j < V; j++)
                    memcpy((char *)&buf[k] + j * F::size(k), p[k], F::size(k));
            } else {
                vec_load(buf[k], p[k], V * F::size(k));
            }
        }
#pragma unroll
        for (int j = 0; j < V; j++) {
            char *q[N];
#pragma unroll
            for (int k = 0; k < N; k++)
                q[k] = (char *)&buf[k] + j * F::size(k);
            f(q);
        }
        vec_store(p[0], buf[0], V * F::size(0));
    }
    if (FLAT) {
        const int64_t i = vectors * V + first;
        if (i < n) {
            char *p[N];
#pragma unroll
            for (int k = 0; k < N; k++)
                p[k] = it.data[k] + i * it.stride[k][0];
            f(p);
        }
    }
}

/* Whether ew_vec_kernel takes `it`: operands of f's element sizes, a dim
 * left, the innermost contiguous for the output and contiguous or of
 * stride 0 for every input, of a length V divides (or the only dim), and
 * every vector of V elements aligned to its size. On success `it` becomes
 * the vectors' iterator. */
template <int N, class F>
static bool ew_vectors(dpc_iter<N> &it, const size_t *es)
{
    constexpr int V = 16 / largest_size<N, F>();
    const int last = it.ndim - 1;
    if (it.ndim == 0 || (it.ndim > 1 && it.shape[last] % V != 0))
        return false;
    for (int k = 0; k < N; k++) {
        const int64_t inner = it.stride[k][last], bytes = V * (int64_t)es[k];
        if (es[k] != (size_t)F::size(k) || (inner != (int64_t)es[k] && (k == 0 || inner != 0)))
            return false;
        if (inner == 0)
            continue;
        if ((uintptr_t)it.data[k] % bytes != 0)
            return false;
        for (int d = 0; d < last; d++)
            if (it.stride[k][d] % bytes != 0)
                return false;
    }
    if (it.ndim > 1) {
        it.shape[last] /= V;
        for (int k = 0; k < N; k++)
            it.stride[k][last] *= V;
    }
    return true;
}

/* Runs f over the shape for N operands of element sizes es (F::size's). */
template <int N, class F>
static int ew_launch(const dpc_shape &s, const dpc_operand *ops, const size_t *es, F f, void *stream)
{
    if (s.ndim < 0 || s.ndim > DPC_MAX_DIMS)
        return (int)cudaErrorInvalidValue;
    dpc_iter<N> it;
    int64_t n = iter_build<N>(&it, s, ops, es);
    if (n <= 0)
        return 0;
    cudaStream_t st = (cudaStream_t)stream;
    if (ew_vectors<N, F>(it, es)) {
        const int64_t vectors = n / (16 / largest_size<N, F>()), threads = vectors > 0 ? vectors : 1;
        unsigned grid = grid_stride_blocks(threads, EW_THREADS);
        if (it.ndim <= 1)
            return launch_kernel(ew_vec_kernel<N, true, F>, grid, EW_THREADS, st, it, vectors, n, f);
        return launch_kernel(ew_vec_kernel<N, false, F>, grid, EW_THREADS, st, it, vectors, n, f);
    }
    unsigned grid = grid_stride_blocks(n, EW_THREADS);
    if (it.ndim <= 1)
        return launch_kernel(ew_kernel<N, true, F>, grid, EW_THREADS, st, it, n, f);
    return launch_kernel(ew_kernel<N, false, F>, grid, EW_THREADS, st, it, n, f);
}

namespace {   /* file-local types: no clash with another file's of the same name */
/* A list of op codes: with(op, fn) is fn(integral_constant<int, op>())
 * for an op of the list, else DPC_UNSUPPORTED. */
template <int... OPS> struct op_list {
    template <class Fn> static int with(int op, Fn fn)
    {
        int rc = DPC_UNSUPPORTED;
        (void)(... || (op == OPS && ((rc = fn(std::integral_constant<int, OPS>())), true)));
        return rc;
    }
};
}  // namespace

/* The kernel functor F<T, OP> for the op `op` of the op_list Ops on the
 * dtype struct T of `dtype`, run over the shape for N operands; a pair
 * that F<T, OP>::ok refuses, or an op not in the list, is
 * DPC_UNSUPPORTED. */
template <template <class, int> class F, class Ops, int N>
static int ew_launch_op(int dtype, int op, const dpc_shape &s, const dpc_operand *ops, const size_t *es, void *stream)
{
    return with_dtype(dtype, [&](auto t) {
        typedef std::decay_t<decltype(t)> T;   /* nvcc's host pass sees a reference type here */
        return Ops::with(op, [&](auto o) {
            typedef F<T, std::decay_t<decltype(o)>::value> Fn;
            if constexpr (!Fn::ok)
                return DPC_UNSUPPORTED;
            else
                return ew_launch<N>(s, ops, es, Fn(), stream);
        });
    });
}

/* ------------------------------------------------------------------------ */
/* math by compute type (the CPU's M_* through _Generic)                     */
/* ------------------------------------------------------------------------ */

#define MATH1(name, ff, fd) \
    __device__ static inline float name(float x) { return ff(x); } \
    __device__ static inline double name(double x) { return fd(x); }
MATH1(m_exp, expf, exp)
MATH1(m_log, logf, log)
MATH1(m_sqrt, sqrtf, sqrt)
MATH1(m_tanh, tanhf, tanh)
MATH1(m_erf, erff, erf)
MATH1(m_sin, sinf, sin)
MATH1(m_cos, cosf, cos)
MATH1(m_floor, floorf, floor)
MATH1(m_ceil, ceilf, ceil)
MATH1(m_rint, rintf, rint)     /* nearbyint in the default rounding mode */
MATH1(m_log1p, log1pf, log1p)
MATH1(m_expm1, expm1f, expm1)
#define MATH2(name, ff, fd) \
    __device__ static inline float name(float x, float y) { return ff(x, y); } \
    __device__ static inline double name(double x, double y) { return fd(x, y); }
MATH2(m_pow, powf, pow)
MATH2(m_fmod, fmodf, fmod)
MATH2(m_atan2, atan2f, atan2)

#define SQRT1_2 0.70710678118654752440
#define INV_SQRT_2PI 0.3989422804014327

/* Integer arithmetic wraps, computed unsigned. */
template <class C> __device__ static inline C w_add(C a, C b) { return (C)((uint64_t)a + (uint64_t)b); }
template <class C> __device__ static inline C w_sub(C a, C b) { return (C)((uint64_t)a - (uint64_t)b); }
template <class C> __device__ static inline C w_mul(C a, C b) { return (C)((uint64_t)a * (uint64_t)b); }
template <class C> __device__ static inline C w_neg(C x) { return (C)(0 - (uint64_t)x); }
/* x < 0, without the compiler's warning for unsigned types */
template <class C> __device__ static inline bool is_neg(C x)
{
    if constexpr (std::is_unsigned<C>::value)
        return false;
    else
        return x < 0;
}
template <class C> __device__ static inline C sign_of(C x) { return (C)((x > 0) - is_neg(x)); }

/* Python's modulo: the result takes the divisor's sign. */
template <class C> __device__ static inline C f_rem(C a, C b)
{
    C r = m_fmod(a, b);
    return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}

/* Integers never trap: x % 0 (and x % -1) gives 0. */
template <class C> __device__ static inline C i_rem(C a, C b)
{
    C r = (b == 0 || (int64_t)b == -1) ? (C)0 : (C)(a % b);
    return (r != 0 && (is_neg(r) != is_neg(b))) ? (C)(r + b) : r;
}

/* ------------------------------------------------------------------------ */
/* unary                                                                     */
/* ------------------------------------------------------------------------ */

/* The CPU's unary_rows table: which op exists for which kind of dtype. */
__host__ __device__ constexpr bool unary_ok(int op, int kind)
{
    switch (op) {
    case DP_NEG: case DP_RELU: case DP_FLOOR: case DP_CEIL: case DP_ROUND: case DP_SQUARE:
        return kind != K_BOOL;
    case DP_ABS: case DP_SIGN: case DP_LOGICAL_NOT:
        return true;
    case DP_EXP: case DP_LOG: case DP_SQRT: case DP_RSQRT: case DP_TANH: case DP_SIGMOID:
    case DP_GELU: case DP_GELU_TANH: case DP_SIN: case DP_COS: case DP_RECIPROCAL:
    case DP_LOG1P: case DP_EXPM1: case DP_ERF:
        return kind == K_FLOAT;
    }
    return false;
}

template <class T, int OP> __device__ static inline typename T::C unary_float(typename T::C x)
{
    typedef typename T::C C;
    const C one = (C)1;
    switch (OP) {
    case DP_NEG: return -x;
    case DP_ABS: return x < 0 ? -x : x;
    case DP_EXP: return m_exp(x);
    case DP_LOG: return m_log(x);
    case DP_SQRT: return m_sqrt(x);
    case DP_RSQRT: return one / m_sqrt(x);
    case DP_TANH: return m_tanh(x);
    case DP_SIGMOID: return one / (one + m_exp(-x));
    case DP_RELU: return x > 0 ? x : (C)0;
    case DP_GELU: return gelu_erf(x);
    case DP_GELU_TANH: return gelu_tanh(x);
    case DP_SIN: return m_sin(x);
    case DP_COS: return m_cos(x);
    case DP_SIGN: return sign_of(x);
    case DP_FLOOR: return m_floor(x);
    case DP_CEIL: return m_ceil(x);
    case DP_ROUND: return m_rint(x);
    case DP_RECIPROCAL: return one / x;
    case DP_LOG1P: return m_log1p(x);
    case DP_EXPM1: return m_expm1(x);
    case DP_ERF: return m_erf(x);
    case DP_SQUARE: return x * x;
    }
    return x;
}

template <class T, int OP> __device__ static inline typename T::C unary_int(typename T::C x)
{
    typedef typename T::C C;
    switch (OP) {
    case DP_NEG: return w_neg(x);
    case DP_ABS: return is_neg(x) ? w_neg(x) : x;
    case DP_RELU: return x > 0 ? x : (C)0;
    case DP_SIGN: return sign_of(x);
    case DP_SQUARE: return w_mul(x, x);
    }
    return x;  /* floor, ceil, round: identity; bool abs and sign too */
}

namespace {   /* file-local types: no clash with another file's of the same name */
template <class T, int OP> struct unary_f {
    static constexpr bool ok = unary_ok(OP, T::kind);
    /* operand k's element size: out (bool for logical_not), x */
    __host__ __device__ static constexpr int size(int k)
    {
        return k == 0 && OP == DP_LOGICAL_NOT ? 1 : (int)sizeof(typename T::S);
    }
    __device__ void operator()(char *const *p) const
    {
        typename T::C x = T::load(p[1]);
        if constexpr (OP == DP_LOGICAL_NOT)
            *(uint8_t *)p[0] = (uint8_t)!x;
        else if constexpr (T::kind == K_FLOAT)
            T::store(p[0], unary_float<T, OP>(x));
        else
            T::store(p[0], unary_int<T, OP>(x));
    }
};

/* the unary ops, for ew_launch_op */
typedef op_list<DP_NEG, DP_ABS, DP_EXP, DP_LOG, DP_SQRT, DP_RSQRT, DP_TANH, DP_SIGMOID, DP_RELU, DP_GELU, DP_SIN,
                DP_COS, DP_SIGN, DP_FLOOR, DP_CEIL, DP_ROUND, DP_RECIPROCAL, DP_LOG1P, DP_EXPM1, DP_LOGICAL_NOT,
                DP_SQUARE, DP_GELU_TANH, DP_ERF>
    unops;
}  // namespace

extern "C" int dpc_unary(int op, int in_dtype, int out_dtype, dpc_shape s, dpc_operand out, dpc_operand a,
                         void *stream)
{
    if (out_dtype != (op == DP_LOGICAL_NOT ? DP_BOOL : in_dtype))
        return DPC_UNSUPPORTED;
    dpc_operand ops[2] = { out, a };
    size_t es[2] = { dt_size(out_dtype), dt_size(in_dtype) };
    return ew_launch_op<unary_f, unops, 2>(in_dtype, op, s, ops, es, stream);
}

/* ------------------------------------------------------------------------ */
/* unary backward                                                            */
/* ------------------------------------------------------------------------ */

/* The CPU's unary_bwd_rows: float dtypes only; the others fill 0. */
__host__ __device__ constexpr bool unary_bwd_ok(int op)
{
    switch (op) {
    case DP_NEG: case DP_ABS: case DP_EXP: case DP_LOG: case DP_SQRT: case DP_RSQRT: case DP_TANH:
    case DP_SIGMOID: case DP_RELU: case DP_GELU: case DP_GELU_TANH: case DP_SIN: case DP_COS:
    case DP_RECIPROCAL: case DP_LOG1P: case DP_EXPM1: case DP_SQUARE: case DP_ERF:
        return true;
    }
    return false;
}

namespace {   /* file-local types: no clash with another file's of the same name */
template <class T, int OP> struct unary_bwd_f {
    static constexpr bool ok = T::kind == K_FLOAT && unary_bwd_ok(OP);
    __host__ __device__ static constexpr int size(int) { return (int)sizeof(typename T::S); }
    __device__ void operator()(char *const *p) const
    {
        typedef typename T::C C;
        const C one = (C)1;
        C g = T::load(p[1]), x = T::load(p[2]), y = T::load(p[3]), d = 0;
        switch (OP) {
        case DP_NEG: d = -g; break;
        case DP_ABS: d = g * sign_of(x); break;
        case DP_EXP: d = g * y; break;
        case DP_LOG: d = g / x; break;
        case DP_SQRT: d = g / (y + y); break;
        case DP_RSQRT: d = (C)-0.5 * g * y * y * y; break;
        case DP_TANH: d = g * (one - y * y); break;
        case DP_SIGMOID: d = g * y * (one - y); break;
        case DP_RELU: d = y > 0 ? g : (C)0; break;
        case DP_GELU:
            d = g * ((C)0.5 * (one + m_erf(x * (C)SQRT1_2)) + x * (C)INV_SQRT_2PI * m_exp((C)-0.5 * x * x));
            break;
        case DP_GELU_TANH: d = gelu_tanh_backward(g, x); break;
        case DP_SIN: d = g * m_cos(x); break;
        case DP_COS: d = -g * m_sin(x); break;
        case DP_RECIPROCAL: d = -g * y * y; break;
        case DP_LOG1P: d = g / (one + x); break;
        case DP_EXPM1: d = g * (y + one); break;
        case DP_ERF: d = g * (C)1.1283791670955126 * m_exp(-x * x); break;   /* 2 / sqrt(pi) */
        case DP_SQUARE: d = (C)2 * x * g; break;
        }
        T::store(p[0], d);
    }
};
}  // namespace

extern "C" int dpc_unary_backward(int op, int dtype, dpc_shape s, dpc_operand dx, dpc_operand g, dpc_operand x,
                                  dpc_operand y, void *stream)
{
    if (dt_size(dtype) == 0)
        return DPC_UNSUPPORTED;
    if (!unary_bwd_ok(op) || !(dtype == DP_FLOAT32 || dtype == DP_FLOAT64 || dtype == DP_BFLOAT16))
        return dpc_fill(dtype, s, dx, 0.0, stream);  /* piecewise-constant ops: zero gradient */
    dpc_operand ops[4] = { dx, g, x, y };
    size_t e = dt_size(dtype), es[4] = { e, e, e, e };
    return ew_launch_op<unary_bwd_f, unops, 4>(dtype, op, s, ops, es, stream);
}

/* ------------------------------------------------------------------------ */
/* binary                                                                    */
/* ------------------------------------------------------------------------ */

__host__ __device__ constexpr bool binary_is_bool(int op)
{
    return op == DP_EQ || op == DP_NE || op == DP_LT || op == DP_LE || op == DP_GT || op == DP_GE ||
           op == DP_LOGICAL_AND || op == DP_LOGICAL_OR;
}

/* The CPU's binary_rows table. */
__host__ __device__ constexpr bool binary_ok(int op, int kind)
{
    switch (op) {
    case DP_ADD: case DP_MUL: case DP_MAXIMUM: case DP_MINIMUM:
        return true;
    case DP_SUB: case DP_POW: case DP_REMAINDER:
        return kind != K_BOOL;
    case DP_DIV: case DP_ATAN2:
        return kind == K_FLOAT;
    }
    return binary_is_bool(op);
}

template <class T, int OP> __device__ static inline typename T::C binary_float(typename T::C a, typename T::C b)
{
    switch (OP) {
    case DP_ADD: return a + b;
    case DP_SUB: return a - b;
    case DP_MUL: return a * b;
    case DP_DIV: return a / b;
    case DP_POW: return m_pow(a, b);
    case DP_MAXIMUM: return (a > b || a != a) ? a : b;
    case DP_MINIMUM: return (a < b || a != a) ? a : b;
    case DP_REMAINDER: return f_rem(a, b);
    case DP_ATAN2: return m_atan2(a, b);
    }
    return a;
}

template <class T, int OP> __device__ static inline typename T::C binary_int(typename T::C a, typename T::C b)
{
    typedef typename T::C C;
    switch (OP) {
    case DP_ADD: return w_add(a, b);
    case DP_SUB: return w_sub(a, b);
    case DP_MUL: return w_mul(a, b);
    case DP_POW: return (C)ipow((int64_t)a, (int64_t)b);
    case DP_MAXIMUM: return a > b ? a : b;
    case DP_MINIMUM: return a < b ? a : b;
    case DP_REMAINDER: return i_rem(a, b);
    }
    return a;
}

/* bool (0/1 ints): add and maximum are or, mul and minimum are and. */
template <int OP> __device__ static inline int binary_b8(int a, int b)
{
    return (OP == DP_ADD || OP == DP_MAXIMUM) ? (a || b) : (a && b);
}

template <class T, int OP> __device__ static inline bool binary_test(typename T::C a, typename T::C b)
{
    switch (OP) {
    case DP_EQ: return a == b;
    case DP_NE: return a != b;
    case DP_LT: return a < b;
    case DP_LE: return a <= b;
    case DP_GT: return a > b;
    case DP_GE: return a >= b;
    case DP_LOGICAL_AND: return a && b;
    case DP_LOGICAL_OR: return a || b;
    }
    return false;
}

namespace {   /* file-local types: no clash with another file's of the same name */
template <class T, int OP> struct binary_f {
    static constexpr bool ok = binary_ok(OP, T::kind);
    /* operand k's element size: out (bool for a comparison), a, b */
    __host__ __device__ static constexpr int size(int k)
    {
        return k == 0 && binary_is_bool(OP) ? 1 : (int)sizeof(typename T::S);
    }
    __device__ void operator()(char *const *p) const
    {
        typename T::C a = T::load(p[1]), b = T::load(p[2]);
        if constexpr (binary_is_bool(OP))
            *(uint8_t *)p[0] = (uint8_t)binary_test<T, OP>(a, b);
        else if constexpr (T::kind == K_FLOAT)
            T::store(p[0], binary_float<T, OP>(a, b));
        else if constexpr (T::kind == K_INT)
            T::store(p[0], binary_int<T, OP>(a, b));
        else
            T::store(p[0], binary_b8<OP>(a, b));
    }
};

/* the binary ops, for ew_launch_op */
typedef op_list<DP_ADD, DP_SUB, DP_MUL, DP_DIV, DP_POW, DP_MAXIMUM, DP_MINIMUM, DP_EQ, DP_NE, DP_LT, DP_LE, DP_GT,
                DP_GE, DP_REMAINDER, DP_ATAN2, DP_LOGICAL_AND, DP_LOGICAL_OR>
    binops;
}  // namespace

extern "C" int dpc_binary(int op, int dtype, int out_dtype, dpc_shape s, dpc_operand out, dpc_operand a,
                          dpc_operand b, void *stream)
{
    if (op < 0 || op >= DP_NUM_BINOPS || out_dtype != (binary_is_bool(op) ? DP_BOOL : dtype))
        return DPC_UNSUPPORTED;
    dpc_operand ops[3] = { out, a, b };
    size_t es[3] = { dt_size(out_dtype), dt_size(dtype), dt_size(dtype) };
    return ew_launch_op<binary_f, binops, 3>(dtype, op, s, ops, es, stream);
}

/* ------------------------------------------------------------------------ */
/* where, clamp, cast, fill                                                  */
/* ------------------------------------------------------------------------ */

namespace {   /* file-local types: no clash with another file's of the same name */
template <class U> struct where_f {
    __host__ __device__ static constexpr int size(int k) { return k == 1 ? 1 : (int)sizeof(U); }   /* out, cond (bool), a, b */
    __device__ void operator()(char *const *p) const
    {
        *(U *)p[0] = *(const uint8_t *)p[1] ? *(const U *)p[2] : *(const U *)p[3];
    }
};
}  // namespace

extern "C" int dpc_where(int dtype, dpc_shape s, dpc_operand out, dpc_operand cond, dpc_operand a,
                         dpc_operand b, void *stream)
{
    size_t e = dt_size(dtype);
    dpc_operand ops[4] = { out, cond, a, b };
    size_t es[4] = { e, 1, e, e };
    return with_size(e, [&](auto u) {
        typedef decltype(u) U;
        return ew_launch<4>(s, ops, es, where_f<U>(), stream);
    });
}

/* Through double, as the CPU: NaN passes, a NaN bound is no bound. */
namespace {   /* file-local types: no clash with another file's of the same name */
template <class T> struct clamp_f {
    double lo, hi;
    __host__ __device__ static constexpr int size(int) { return (int)sizeof(typename T::S); }
    __device__ void operator()(char *const *p) const
    {
        typedef typename T::C C;
        double v = (double)T::load(p[1]);
        if (v == v) {
            if (v < lo) v = lo;
            if (v > hi) v = hi;
        }
        T::store(p[0], (C)v);
    }
};
}  // namespace

extern "C" int dpc_clamp(int dtype, dpc_shape s, dpc_operand out, dpc_operand a, double lo, double hi,
                         void *stream)
{
    dpc_operand ops[2] = { out, a };
    size_t es[2] = { dt_size(dtype), dt_size(dtype) };
    return with_dtype(dtype, [&](auto t) {
        typedef decltype(t) T;
        if constexpr (T::kind == K_BOOL)
            return DPC_UNSUPPORTED;
        else
            return ew_launch<2>(s, ops, es, clamp_f<T>{ lo, hi }, stream);
    });
}

namespace {   /* file-local types: no clash with another file's of the same name */
template <class U> struct copy_f {
    __host__ __device__ static constexpr int size(int) { return (int)sizeof(U); }
    __device__ void operator()(char *const *p) const { *(U *)p[0] = *(const U *)p[1]; }
};

/* From the dtype struct TI to TO. Every other pair goes through double
 * (dtype_load, dtype_store); int64 to int32 and uint8 stay exact, as on
 * the CPU. */
template <class TI, class TO> struct cast_f {
    static constexpr int FROM = TI::id, TO_ID = TO::id;
    __host__ __device__ static constexpr int size(int k) { return k == 0 ? (int)sizeof(typename TO::S) : (int)sizeof(typename TI::S); }
    __device__ void operator()(char *const *p) const
    {
        if (FROM == DP_INT64 && TO_ID == DP_INT32)
            *(int32_t *)p[0] = (int32_t) * (const int64_t *)p[1];
        else if (FROM == DP_INT64 && TO_ID == DP_UINT8)
            *(uint8_t *)p[0] = (uint8_t) * (const int64_t *)p[1];
        else
            dt_store(TO_ID, p[0], dt_load(FROM, p[1]));
    }
};
}  // namespace

extern "C" int dpc_cast(int out_dtype, int in_dtype, dpc_shape s, dpc_operand out, dpc_operand a, void *stream)
{
    dpc_operand ops[2] = { out, a };
    size_t es[2] = { dt_size(out_dtype), dt_size(in_dtype) };
    if (es[0] == 0 || es[1] == 0)
        return DPC_UNSUPPORTED;
    if (out_dtype == in_dtype)
        return with_size(es[0], [&](auto u) {
            typedef decltype(u) U;
            return ew_launch<2>(s, ops, es, copy_f<U>(), stream);
        });
    return with_dtype(in_dtype, [&](auto tin) {
        return with_dtype(out_dtype, [&](auto tout) {
            typedef decltype(tin) TI;
            typedef decltype(tout) TO;
            return ew_launch<2>(s, ops, es, cast_f<TI, TO>(), stream);
        });
    });
}

namespace {   /* file-local types: no clash with another file's of the same name */
template <class U> struct fill_f {
    U v;
    __host__ __device__ static constexpr int size(int) { return (int)sizeof(U); }
    __device__ void operator()(char *const *p) const { *(U *)p[0] = v; }
};
}  // namespace

extern "C" int dpc_fill(int dtype, dpc_shape s, dpc_operand out, double value, void *stream)
{
    size_t e = dt_size(dtype);
    if (e == 0)
        return DPC_UNSUPPORTED;
    uint64_t bits = 0;
    dt_store(dtype, &bits, value);  /* the value's bytes in dtype, as cpu_fill */
    return with_size(e, [&](auto u) {
        typedef decltype(u) U;
        U v;
        memcpy(&v, &bits, sizeof v);
        return ew_launch<1>(s, &out, &e, fill_f<U>{ v }, stream);
    });
}
