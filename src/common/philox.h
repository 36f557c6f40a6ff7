/*
 * philox.h — the random stream's arithmetic, shared by the CPU
 * (src/core/rng.c) and the GPU (cuda/random.cu) so that both draw the same
 * numbers: Philox4x32-10, and the turning of one 128-bit block into one
 * value. Element i of a draw is block (offset + i) under the key (the
 * seed). Normal values go through libm's (or CUDA's) log and cos, which
 * may differ in the last bit; every other value is bit-identical.
 */
#ifndef DP_COMMON_PHILOX_H
#define DP_COMMON_PHILOX_H

#include <math.h>
#include <stdint.h>

#include "common/dtype_conv.h"
#include "common/host_device.h"

/* What a block becomes (dp_rand, dp_randn, dp_randint). */
enum { PHILOX_UNIFORM, PHILOX_NORMAL, PHILOX_INT };

DP_HD uint32_t philox_mulhilo(uint32_t a, uint32_t b, uint32_t *hi)
{
    uint64_t p = (uint64_t)a * b;
    *hi = (uint32_t)(p >> 32);
    return (uint32_t)p;
}

/* One Philox4x32 block: 10 rounds over a 128-bit counter, 64-bit key. */
DP_HD void philox(uint64_t counter, uint64_t key, uint32_t out[4])
{
    uint32_t c0 = (uint32_t)counter, c1 = (uint32_t)(counter >> 32), c2 = 0, c3 = 0;
    uint32_t k0 = (uint32_t)key, k1 = (uint32_t)(key >> 32);
    for (int r = 0; r < 10; r++) {
        uint32_t hi0, hi1;
        uint32_t lo0 = philox_mulhilo(0xD2511F53u, c0, &hi0);
        uint32_t lo1 = philox_mulhilo(0xCD9E8D57u, c2, &hi1);
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    out[0] = c0; out[1] = c1; out[2] = c2; out[3] = c3;
}

/* A float32 uniform as bfloat16's: what would round up to 1.0 (from
 * 0.998046875, the midpoint, on) becomes its largest value below 1. */
DP_HD double bf16_draw(double u)
{
    return (float)u >= 0.998046875f ? 0.99609375 : u;
}

/* Uniform in [0, 1) from 53 bits (float64) or 24 bits (float32 and
 * bfloat16), so that rounding to the dtype can never give 1.0: for
 * bfloat16 what would round up to 1.0 (from 0.998046875, the midpoint, on)
 * becomes its largest value below 1. */
DP_HD double philox_uniform(const uint32_t *w, int is_double, int is_bf16)
{
    if (is_double)
        return (double)((((uint64_t)w[0] << 32) | w[1]) >> 11) * 0x1.0p-53;
    double u = (double)(w[0] >> 8) * 0x1.0p-24;
    return is_bf16 ? bf16_draw(u) : u;
}

/* Dropout's rule: whether the uniform u of a dtype's draw (philox_uniform)
 * keeps its element, as rand_like(x) >= p decides: u and p rounded to the
 * dtype (as the stored draw and a comparison with a scalar are), u >= p. */
DP_HD int uniform_keeps(double u, int dtype, double p)
{
    if (dtype == DP_BFLOAT16)
        return bf16_to_f32(f32_to_bf16((float)u)) >= bf16_to_f32(f32_to_bf16((float)p));
    if (dtype == DP_FLOAT32)
        return (float)u >= (float)p;
    return u >= p;
}

/* Whether block `counter` under `key` keeps its element: the draw of
 * rand_like for the dtype, under uniform_keeps. */
DP_HD int philox_keeps(uint64_t counter, uint64_t key, int dtype, double p)
{
    uint32_t w[4];
    philox(counter, key, w);
    return uniform_keeps(philox_uniform(w, dtype == DP_FLOAT64, dtype == DP_BFLOAT16), dtype, p);
}

/* Box-Muller over the four words of one block. */
DP_HD double philox_normal(const uint32_t *w)
{
    double u1 = ((double)(((uint64_t)w[0] << 21) ^ w[1]) + 1.0) * 0x1.0p-53;
    double u2 = (double)(((uint64_t)w[2] << 21) ^ w[3]) * 0x1.0p-53;
    return sqrt(-2.0 * log(u1)) * cos(2.0 * 3.14159265358979323846 * u2);
}

/* low + (a 64-bit draw) mod range, as a double for the dtype's store. */
DP_HD double philox_int(const uint32_t *w, int64_t low, uint64_t range)
{
    uint64_t r = ((uint64_t)w[0] << 32) | w[1];
    return (double)(int64_t)((uint64_t)low + r % range);
}

#endif /* DP_COMMON_PHILOX_H */
