/*
 * vmath_test.c — TAP tests of src/cpu/vmath.h's float32 exp, log, tanh,
 * sigmoid and erf against libm in double precision (the exact value rounded
 * once): the error in ulps of the float result over a sweep of every
 * 199th float bit pattern (21 million values, both signs, subnormals,
 * infinities and NaNs included), and exact results at the edges that
 * expf defines: NaN, +-inf, +-0, the overflow threshold, the last normal
 * and the last subnormal result. Each function is checked as the
 * baseline x86-64 build computes it and, where the CPU has them, as the
 * x86-64-v3 (AVX2, FMA) and x86-64-v4 (AVX-512) clones of VM_CLONES
 * compute it, whose fmas round differently.
 */
#include "cpu/vmath.h"

#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>

static int ntests, nfailed;

static void ok(int cond, const char *fmt, ...)
{
    va_list ap;
    ntests++;
    if (!cond)
        nfailed++;
    printf("%s %d - ", cond ? "ok" : "not ok", ntests);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
}

/* ---------------------------------------------------------------- references */

static double ref_exp(float x) { return exp((double)x); }
static double ref_tanh(float x) { return tanh((double)x); }
static double ref_sigmoid(float x) { return 1 / (1 + exp(-(double)x)); }
static double ref_erf(float x) { return erf((double)x); }
static double ref_log(float x) { return log((double)x); }

/* |got - want| in units of the last place of want rounded to float (a
 * subnormal's ulp is the smallest subnormal); 0 when both are the same
 * NaN, infinity or zero, and a huge value for a NaN or an infinity where
 * the other is not */
static double ulps(float got, double want)
{
    float w = (float)want;
    if (isnan(w) || isnan(got))
        return isnan(w) && isnan(got) ? 0 : 1e30;
    if (isinf(w) || isinf(got))
        return w == got ? 0 : 1e30;
    double a = fabs((double)w), u = nextafterf((float)a, INFINITY) - (float)a;
    return fabs((double)got - want) / u;
}

/* ---------------------------------------------------------------- the functions, twice */

typedef float (*fn32)(float);

#define VARIANTS(attr, sfx)                                            \
    attr static float exp_##sfx(float x) { return vm_expf(x); }        \
    attr static float tanh_##sfx(float x) { return vm_tanhf(x); }      \
    attr static float sigmoid_##sfx(float x) { return vm_sigmoidf(x); } \
    attr static float erf_##sfx(float x) { return vm_erff(x); }         \
    attr static float log_##sfx(float x) { return vm_logf(x); }
VARIANTS(__attribute__((noinline)), base)
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define HAVE_CLONES 1
VARIANTS(__attribute__((noinline, target("arch=x86-64-v3"))), v3)
VARIANTS(__attribute__((noinline, target("arch=x86-64-v4"))), v4)
#endif

/* the largest error over every 199th bit pattern, and where */
static double sweep(fn32 f, double (*ref)(float), float *at)
{
    double worst = 0;
    for (uint64_t b = 0; b < (1ull << 32); b += 199) {
        float x = vm_bits_to_float((uint32_t)b);
        double e = ulps(f(x), ref(x));
        if (e > worst) {
            worst = e;
            *at = x;
        }
    }
    return worst;
}

static void check_sweep(const char *name, const char *variant, fn32 f, double (*ref)(float), double bound)
{
    float at = 0;
    double worst = sweep(f, ref, &at);
    ok(worst <= bound, "%s (%s): within %.1f ulp over the sweep (worst %.3f at %a)", name, variant, bound, worst,
       (double)at);
}

/* f(x) is exactly the float nearest the exact value (a NaN for a NaN) */
static void check_exact(const char *name, const char *variant, fn32 f, double (*ref)(float), float x)
{
    float got = f(x), want = (float)ref(x);
    bool same = (isnan(got) && isnan(want)) || (got == want && signbit(got) == signbit(want));
    ok(same, "%s (%s) of %a is %a (got %a)", name, variant, (double)x, (double)want, (double)got);
}

static void check_variant(const char *variant, fn32 fexp, fn32 ftanh, fn32 fsig, fn32 ferf, fn32 flog)
{
    check_sweep("exp", variant, fexp, ref_exp, 1.1);
    check_sweep("tanh", variant, ftanh, ref_tanh, 1.5);
    check_sweep("sigmoid", variant, fsig, ref_sigmoid, 2.5);
    check_sweep("erf", variant, ferf, ref_erf, 2.0);
    check_sweep("log", variant, flog, ref_log, 1.0);
    const float edges[] = {
        NAN, -NAN, INFINITY, -INFINITY, 0.0f, -0.0f, 1e-45f, -1e-45f,
        0x1.62e42ep+6f,     /* 88.7228391: exp's largest finite result */
        0x1.62e430p+6f,     /* the next float: exp overflows to inf */
        89.0f, 1e30f, FLT_MAX,
        -0x1.5d589ep+6f,    /* -87.3365: exp near the smallest normal */
        -0x1.9fe368p+6f,    /* -103.972: exp's smallest subnormal */
        -0x1.9fe36ap+6f,    /* the next float down: exp rounds to 0 */
        -104.0f, -1e30f, -FLT_MAX,
    };
    int n = (int)(sizeof edges / sizeof edges[0]);
    for (int i = 0; i < n; i++)
        check_exact("exp", variant, fexp, ref_exp, edges[i]);
    const float tanh_edges[] = { NAN, INFINITY, -INFINITY, 0.0f, -0.0f, 1e-45f, -1e-45f, 1e-30f, 20.0f, -20.0f };
    for (int i = 0; i < (int)(sizeof tanh_edges / sizeof tanh_edges[0]); i++)
        check_exact("tanh", variant, ftanh, ref_tanh, tanh_edges[i]);
    const float sig_edges[] = { NAN, INFINITY, -INFINITY, 0.0f, -0.0f, 100.0f, -200.0f, -90.0f, -100.0f };
    for (int i = 0; i < (int)(sizeof sig_edges / sizeof sig_edges[0]); i++)
        check_exact("sigmoid", variant, fsig, ref_sigmoid, sig_edges[i]);
    /* the switch between erf's forms, the clamp at 4, where erf rounds to 1 */
    const float erf_edges[] = { NAN, INFINITY, -INFINITY, 0.0f, -0.0f, 1e-45f, -1e-45f, 1e-30f, 4.0f, -4.0f,
                                100.0f, 3.9f, 0.921875f, -0.921875f };
    for (int i = 0; i < (int)(sizeof erf_edges / sizeof erf_edges[0]); i++)
        check_exact("erf", variant, ferf, ref_erf, erf_edges[i]);
    /* logf's NaN below 0 and -inf at +-0; powers of two; subnormals */
    const float log_edges[] = { NAN, INFINITY, -INFINITY, 0.0f, -0.0f, -1.0f, -1e-45f, 1.0f, 2.0f, 0.5f, 1e-45f,
                                1.17549435e-38f, 1.1754942e-38f, FLT_MAX };
    for (int i = 0; i < (int)(sizeof log_edges / sizeof log_edges[0]); i++)
        check_exact("log", variant, flog, ref_log, log_edges[i]);
}

int main(void)
{
    check_variant("x86-64", exp_base, tanh_base, sigmoid_base, erf_base, log_base);
#ifdef HAVE_CLONES
    __builtin_cpu_init();
    if (__builtin_cpu_supports("x86-64-v3"))
        check_variant("x86-64-v3", exp_v3, tanh_v3, sigmoid_v3, erf_v3, log_v3);
    else
        printf("# the CPU is not x86-64-v3 (AVX2, FMA): that clone is not checked\n");
    if (__builtin_cpu_supports("x86-64-v4"))
        check_variant("x86-64-v4", exp_v4, tanh_v4, sigmoid_v4, erf_v4, log_v4);
    else
        printf("# the CPU is not x86-64-v4 (AVX-512): that clone is not checked\n");
#endif
    printf("1..%d\n", ntests);
    return nfailed != 0;
}
