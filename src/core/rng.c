/*
 * rng.c — the random streams: Philox4x32-10, a counter-based generator.
 *
 * Counter-based means element i of a draw is a pure function of (seed,
 * offset + i), so the CPU and a CUDA kernel can produce the same numbers,
 * and saving (seed, offset) saves the whole stream state.
 */
#include "core/tensor.h"

#include <math.h>

/* PyTorch's default seed, so that an unseeded run is still deterministic. */
static uint64_t rng_seed = 67280421310721ULL;
static uint64_t rng_offset;

void dp_manual_seed(uint64_t seed)
{
    rng_seed = seed;
    rng_offset = 0;
}

void dp_rng_get_state(uint64_t *seed, uint64_t *offset)
{
    *seed = rng_seed;
    *offset = rng_offset;
}

void dp_rng_set_state(uint64_t seed, uint64_t offset)
{
    rng_seed = seed;
    rng_offset = offset;
}

static inline uint32_t mulhilo(uint32_t a, uint32_t b, uint32_t *hi)
{
    uint64_t p = (uint64_t)a * b;
    *hi = (uint32_t)(p >> 32);
    return (uint32_t)p;
}

/* One Philox4x32 block: 10 rounds over a 128-bit counter, 64-bit key. */
static void philox(uint64_t counter, uint64_t key, uint32_t out[4])
{
    uint32_t c0 = (uint32_t)counter, c1 = (uint32_t)(counter >> 32), c2 = 0, c3 = 0;
    uint32_t k0 = (uint32_t)key, k1 = (uint32_t)(key >> 32);
    for (int r = 0; r < 10; r++) {
        uint32_t hi0, hi1;
        uint32_t lo0 = mulhilo(0xD2511F53u, c0, &hi0);
        uint32_t lo1 = mulhilo(0xCD9E8D57u, c2, &hi1);
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    out[0] = c0; out[1] = c1; out[2] = c2; out[3] = c3;
}

/* Reserves n blocks of the stream and returns the first counter. */
static uint64_t reserve(int64_t blocks)
{
    uint64_t first = rng_offset;
    rng_offset += (uint64_t)blocks;
    return first;
}

static dp_status check_float(const char *fn, int dtype)
{
    if (!dp_dtype_is_floating(dtype))
        return dp_fail(DP_ERR_DTYPE, "%s: expected a floating dtype, got %s", fn, dp_dtype_name(dtype));
    return DP_OK;
}

/* Uniform in [0, 1) from 24 bits (float32/bfloat16) or 53 bits (float64),
 * so that 1.0 can never come out after rounding. */
static double uniform(const uint32_t *w, int dtype)
{
    if (dtype == DP_FLOAT64)
        return (double)((((uint64_t)w[0] << 32) | w[1]) >> 11) * 0x1.0p-53;
    double u = (double)(w[0] >> 8) * 0x1.0p-24;
    if (dtype == DP_BFLOAT16 && (float)u >= 1.0f)
        u = 0;
    return u;
}

/* Fills t with value(block) of one Philox block per element. */
static void draw(dp_tensor *t, double (*value)(const uint32_t *w, int dtype))
{
    int64_t n = dp_tensor_numel(t);
    uint64_t c = reserve(n), key = rng_seed;
    char *p = tensor_ptr(t);
    size_t es = dp_dtype_size(t->dtype);
    for (int64_t i = 0; i < n; i++) {
        uint32_t w[4];
        philox(c + (uint64_t)i, key, w);
        dtype_store(t->dtype, p + i * es, value(w, t->dtype));
    }
}

static double uniform_value(const uint32_t *w, int dtype)
{
    double u = uniform(w, dtype);
    if (dtype == DP_BFLOAT16 && float_to_bf16((float)u) == 0x3f80)
        u = 0.99609375; /* the largest bfloat16 below 1 */
    return u;
}

/* Box-Muller over the four words of one block. */
static double normal_value(const uint32_t *w, int dtype)
{
    (void)dtype;
    double u1 = ((double)(((uint64_t)w[0] << 21) ^ w[1]) + 1.0) * 0x1.0p-53;
    double u2 = (double)(((uint64_t)w[2] << 21) ^ w[3]) * 0x1.0p-53;
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

/* Random values are drawn on the host (so that the stream is the same
 * on every device) and moved. */
static dp_status moved(dp_tensor **out, dp_tensor *host, int device)
{
    dp_status st = dp_to(out, host, host->dtype, device);
    dp_tensor_release(host);
    return st;
}

dp_status dp_rand(dp_tensor **out, int ndim, const int64_t *shape, int dtype, int device)
{
    if (device != DP_CPU) {
        dp_tensor *h;
        dp_status st = dp_rand(&h, ndim, shape, dtype, DP_CPU);
        return st ? st : moved(out, h, device);
    }
    dp_status st = check_float("rand", dtype);
    if (st || (st = tensor_new(out, ndim, shape, dtype, device)))
        return st;
    draw(*out, uniform_value);
    return DP_OK;
}

dp_status dp_randn(dp_tensor **out, int ndim, const int64_t *shape, int dtype, int device)
{
    if (device != DP_CPU) {
        dp_tensor *h;
        dp_status st = dp_randn(&h, ndim, shape, dtype, DP_CPU);
        return st ? st : moved(out, h, device);
    }
    dp_status st = check_float("randn", dtype);
    if (st || (st = tensor_new(out, ndim, shape, dtype, device)))
        return st;
    draw(*out, normal_value);
    return DP_OK;
}

dp_status dp_randint(dp_tensor **out, int64_t low, int64_t high, int ndim, const int64_t *shape,
                     int dtype, int device)
{
    if (high <= low)
        return dp_fail(DP_ERR_ARG, "randint: expected low < high, got low=%lld, high=%lld",
                       (long long)low, (long long)high);
    if (dtype == DP_BOOL)
        return dp_fail(DP_ERR_DTYPE, "randint: dtype bool is not supported");
    if (device != DP_CPU) {
        dp_tensor *h;
        dp_status st = dp_randint(&h, low, high, ndim, shape, dtype, DP_CPU);
        return st ? st : moved(out, h, device);
    }
    dp_status st = tensor_new(out, ndim, shape, dtype, device);
    if (st)
        return st;
    int64_t n = dp_tensor_numel(*out);
    uint64_t c = reserve(n), key = rng_seed, range = (uint64_t)high - (uint64_t)low;
    char *p = tensor_ptr(*out);
    size_t es = dp_dtype_size(dtype);
    for (int64_t i = 0; i < n; i++) {
        uint32_t w[4];
        philox(c + (uint64_t)i, key, w);
        uint64_t r = ((uint64_t)w[0] << 32) | w[1];
        dtype_store(dtype, p + i * es, (double)(int64_t)((uint64_t)low + r % range));
    }
    return DP_OK;
}
