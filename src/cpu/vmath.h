/*
 * vmath.h — float32 exp, log, sigmoid, tanh and erf written so that GCC
 * vectorises the loops that call them: no table, no branch, no libm call,
 * every special case a select. libm's expf is a call per element; a
 * softmax over a language model's 10,000 classes spent most of its time
 * there, and an exact GELU in erff.
 *
 * vm_expf is within 1.1 ulp of the exact exp over the whole float range
 * (subnormal results included) and returns what expf returns at the
 * edges: NaN for NaN, +inf above 88.7228..., 0 below -103.97..., 0 for
 * -inf. vm_logf is within 1 ulp, vm_tanhf 1.5, vm_erff 2, vm_sigmoidf
 * 2.5. tests/c/vmath_test.c checks these bounds against libm over a sweep
 * of the float range; scripts/gen_vmath_coeffs.py derives the
 * polynomials.
 *
 * float64 stays with libm (its exp is correctly rounded nearly always,
 * and no float64 path is hot enough to trade that away).
 */
#ifndef DP_CPU_VMATH_H
#define DP_CPU_VMATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

/* The functions whose loops call these are compiled three times, for the
 * baseline x86-64 (SSE2: four lanes), x86-64-v3 (AVX2 and FMA: eight
 * lanes, each polynomial step one fma) and x86-64-v4 (AVX-512: sixteen),
 * chosen at load time. 7 million float32 exps take 10.6 ms in the
 * baseline's loop, 3.4 in AVX2's and 2.4 in AVX-512's (libm's expf 21). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__)
#define VM_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define VM_CLONES
#endif

/* The largest of x[0..n-1] (-inf for none), kept in 8 running lanes so
 * that the loop has no serial dependency and vectorises in the caller's
 * clones; a NaN is kept or passed over as `x > m` decides. */
static inline float vm_max_f32(const float *restrict x, int64_t n)
{
    float m = -INFINITY, lane[8];
    for (int k = 0; k < 8; k++)
        lane[k] = -INFINITY;
    int64_t j = 0;
    for (; j + 8 <= n; j += 8)
        for (int k = 0; k < 8; k++)
            lane[k] = x[j + k] > lane[k] ? x[j + k] : lane[k];
    for (; j < n; j++)
        m = x[j] > m ? x[j] : m;
    for (int k = 0; k < 8; k++)
        m = lane[k] > m ? lane[k] : m;
    return m;
}

static inline float vm_bits_to_float(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint32_t vm_float_to_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* exp(x) = 2^n e^r with n = round(x / ln2) and |r| <= ln2 / 2. x is
 * first clamped to [-104, 89], where every result below the smallest
 * subnormal has rounded to 0 and every one above FLT_MAX to inf, so the
 * clamped values give expf's 0 and inf (a NaN passes the clamps and
 * poisons the polynomial). ln2 is split (Cody and Waite) so that
 * n * LN2_HI is exact. e^r = 1 + r + r^2 q(r), q a near-minimax
 * polynomial of degree 4 on [-ln2/2, ln2/2] (Chebyshev interpolation of
 * (e^r - 1 - r) / r^2, error below 1e-7 relative, so that e^r's error
 * is below 1e-8).
 * 2^n is applied as two powers of two, 2^(n/2) and 2^(n - n/2), each a
 * normal float for every n the clamp allows: a result that overflows or
 * is subnormal is rounded once, by the last multiply, as expf's is. */
static inline float vm_expf(float x)
{
    const float LOG2E = 1.44269504088896341f;
    const float LN2_HI = 0.693359375f, LN2_LO = -2.12194440e-4f;
    const float ROUND = 12582912.0f;   /* 1.5 * 2^23: adding it rounds to an integer */
    x = x > 89.0f ? 89.0f : x;
    x = x < -104.0f ? -104.0f : x;
    float k = x * LOG2E + ROUND;          /* n in the low mantissa bits */
    int32_t n = (int32_t)(vm_float_to_bits(k) - vm_float_to_bits(ROUND));
    float fn = k - ROUND;
    float r = (x - fn * LN2_HI) - fn * LN2_LO;
    float q = 1.39261759e-3f;
    q = q * r + 8.36317334e-3f;
    q = q * r + 4.16665561e-2f;
    q = q * r + 1.66665778e-1f;
    q = q * r + 0.5f;
    float p = 1.0f + (r + r * r * q);
    int32_t n1 = n / 2, n2 = n - n1;
    float s1 = vm_bits_to_float((uint32_t)(n1 + 127) << 23);
    float s2 = vm_bits_to_float((uint32_t)(n2 + 127) << 23);
    return p * s1 * s2;
}

/* 1 / (1 + e^-x) for x >= 0, e^x / (1 + e^x) below: e^-|x| never
 * overflows, so a very negative x keeps its tiny (subnormal) result
 * where 1 / (1 + e^-x) would give 0 */
static inline float vm_sigmoidf(float x)
{
    float e = vm_expf(x < 0 ? x : -x);
    return (x < 0 ? e : 1.0f) / (1.0f + e);
}

/* tanh(x) = x + x^3 t(x^2) for |x| < 0.55 (t a near-minimax polynomial of
 * degree 4, relative error below 1.5e-8), else sign(x) (1 - 2 / (e^2|x| +
 * 1)), which no longer cancels there: both are computed and one kept. 1
 * where e^2|x| overflows; NaN stays NaN. */
static inline float vm_tanhf(float x)
{
    float a = x < 0 ? -x : x;
    float s = x * x;
    float t = -6.61022775e-3f;
    t = t * s + 2.13093888e-2f;
    t = t * s - 5.39094284e-2f;
    t = t * s + 1.33331135e-1f;
    t = t * s - 3.33333313e-1f;
    float small = x == 0 ? x : x + x * s * t;   /* keeps -0's sign */
    float big = 1.0f - 2.0f / (vm_expf(a + a) + 1.0f);
    big = x < 0 ? -big : big;
    return a < 0.55f ? small : big;
}

/* log(x) = e ln2 + log(m) with x = 2^e m, m in [sqrt(1/2), sqrt(2)) (a
 * subnormal x scaled by 2^23 first); with f = m - 1 and s = f / (2 + f),
 * log(m) = 2s (1 + s^2 R(s^2)) = f - (f s - 2s s^2 R(s^2)), R a
 * near-minimax polynomial of degree 2 of (atanh(s) / s - 1) / s^2 (error
 * below 1e-7, so 3e-9 in log(m)). ln2 is split so that e LN2_HI is
 * exact. NaN for NaN and below 0, -inf at 0, inf at inf, as logf. */
static inline float vm_logf(float x)
{
    const float LN2_HI = 0.693145751953125f, LN2_LO = 1.42860677e-06f;
    const uint32_t SQRT_HALF = 0x3f3504f3u;   /* sqrt(1/2)'s bits */
    int sub = x < 1.17549435e-38f;          /* (and x <= 0, replaced below) */
    float y = sub ? x * 8388608.0f : x;
    uint32_t ix = vm_float_to_bits(y) - SQRT_HALF;
    int32_t e = (int32_t)ix >> 23;
    float m = vm_bits_to_float((ix & 0x7fffffu) + SQRT_HALF);
    e -= sub ? 23 : 0;
    float f = m - 1.0f, s = f / (2.0f + f), z = s * s;
    float r = 1.47899747e-01f;
    r = r * z + 1.99943900e-01f;
    r = r * z + 3.33333433e-01f;
    float l = f - (f * s - (s + s) * (z * r));
    float fe = (float)e;
    float out = fe * LN2_HI + (l + fe * LN2_LO);
    out = x < 0 ? __builtin_nanf("") : out;
    out = x == 0 ? -__builtin_inff() : out;
    out = x == __builtin_inff() ? x : out;
    return x != x ? x : out;
}

/* erf(x) = x p(x^2) for |x| < 0.921875 (p of degree 5, its constant
 * term's 1 added last as x + x (p - 1), one rounding), else sign(x) (1 -
 * e^(-x^2) g(1/|x|)) with g(t) = erfc(1/t) e^(1/t^2) of degree 9 on t in
 * [1/4, 1/0.921875]; |x| is clamped to 4, past which erf rounds to +-1.
 * x^2 is split into its float and the rest (exact in double), so that
 * e^(-x^2) = e^(-hi) (1 - lo) keeps the bits a float x^2 would round
 * away. Both forms are computed and one kept; NaN stays NaN. */
static inline float vm_erff(float x)
{
    float a = x < 0 ? -x : x, s = x * x;
    float p = -6.004081224e-04f;
    p = p * s + 4.996020347e-03f;
    p = p * s - 2.676875703e-02f;
    p = p * s + 1.128188223e-01f;
    p = p * s - 3.761250079e-01f;
    p = p * s + 1.28379107e-01f;    /* (p's constant 1.128379107 less 1, added last) */
    float small = x + x * p;
    float b = a > 4.0f ? 4.0f : a;
    b = b < 0.921875f ? 0.921875f : b;   /* (the lanes that keep small) */
    float t = 1.0f / b;
    float g = 1.525494643e-02f;
    g = g * t - 9.272471070e-02f;
    g = g * t + 2.256644219e-01f;
    g = g * t - 2.413224578e-01f;
    g = g * t - 1.908520237e-02f;
    g = g * t + 3.757135570e-01f;
    g = g * t - 4.289710224e-01f;
    g = g * t + 3.263739869e-02f;
    g = g * t + 5.602091551e-01f;
    g = g * t + 2.075219236e-04f;
    float hi = b * b, lo = (float)((double)b * b - hi);
    float big = 1.0f - vm_expf(-hi) * (1.0f - lo) * g;
    big = x < 0 ? -big : big;
    return a < 0.921875f ? small : big;
}

#endif
