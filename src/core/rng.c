/*
 * rng.c — the random streams: Philox4x32-10, a counter-based generator.
 *
 * Counter-based means element i of a draw is a pure function of (seed,
 * offset + i), so the CPU and a CUDA kernel can produce the same numbers,
 * and saving (seed, offset) saves the whole stream state.
 *
 * Dropout is one op here for that reason: its mask is the draw of
 * rand_like(x) >= p, made inside the pass that applies it, and its
 * backward makes the same mask again from the two numbers instead of
 * keeping it.
 */
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "core/autograd.h"
#include "core/kernels.h"
#include "common/philox.h"

/* Until torch.manual_seed, the seed is drawn from the system's random
 * bytes on first use, as PyTorch seeds its CPU generator in each process:
 * unseeded processes, and the ranks of a job, draw different numbers. */
static uint64_t rng_seed;
static uint64_t rng_offset;
static int rng_seeded;

static uint64_t seed_now(void)
{
    if (!rng_seeded) {
        uint64_t s;
        if (getrandom(&s, sizeof s, 0) != (ssize_t)sizeof s)
            s = (uint64_t)time(NULL) * 6364136223846793005ULL ^ (uint64_t)getpid();
        rng_seed = s;
        rng_seeded = 1;
    }
    return rng_seed;
}

void dp_manual_seed(uint64_t seed)
{
    rng_seed = seed;
    rng_offset = 0;
    rng_seeded = 1;
}

void dp_rng_get_state(uint64_t *seed, uint64_t *offset)
{
    *seed = seed_now();
    *offset = rng_offset;
}

void dp_rng_set_state(uint64_t seed, uint64_t offset)
{
    rng_seed = seed;
    rng_offset = offset;
    rng_seeded = 1;
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

/* float32 uniforms (dropout's masks), philox_uniform's values stored
 * directly: a loop of independent blocks that GCC vectorises, Philox's
 * 32 x 32 -> 64-bit products as vector multiplies, compiled for AVX-512
 * and AVX2 beside the baseline (140,000 draws: 1.2 ms one block at a
 * time, 0.87 with AVX2, 0.36 with AVX-512). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__)
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#endif
static void draw_uniform_f32(float *p, int64_t n, uint64_t c, uint64_t key)
{
    for (int64_t i = 0; i < n; i++) {
        uint32_t w[4];
        philox(c + (uint64_t)i, key, w);
        p[i] = (float)(w[0] >> 8) * 0x1.0p-24f;   /* 24 bits: exact, as philox_uniform's double */
    }
}

/* Fills host tensor t with one value per Philox block (philox.h). */
static void draw(dp_tensor *t, int kind, int64_t low, uint64_t range)
{
    int64_t n = dp_tensor_numel(t);
    uint64_t key = seed_now(), c = reserve(n);
    if (kind == PHILOX_UNIFORM && t->dtype == DP_FLOAT32) {
        draw_uniform_f32((float *)tensor_ptr(t), n, c, key);
        return;
    }
    char *p = tensor_ptr(t);
    size_t es = dp_dtype_size(t->dtype);
    int is_double = t->dtype == DP_FLOAT64, is_bf16 = t->dtype == DP_BFLOAT16;
    for (int64_t i = 0; i < n; i++) {
        uint32_t w[4];
        philox(c + (uint64_t)i, key, w);
        double v = kind == PHILOX_UNIFORM ? philox_uniform(w, is_double, is_bf16)
                   : kind == PHILOX_NORMAL ? philox_normal(w) : philox_int(w, low, range);
        dtype_store(t->dtype, p + i * (int64_t)es, v);
    }
}

/* A new tensor of random values: drawn by a kernel on a GPU, here on the
 * CPU; the same numbers either way (philox.h). */
static dp_status random_tensor(dp_tensor **out, int ndim, const int64_t *shape, int dtype, int device, int kind,
                               int64_t low, uint64_t range)
{
    dp_status st = tensor_new(out, ndim, shape, dtype, device);
    if (st)
        return st;
    if (device == DP_CPU) {
        draw(*out, kind, low, range);
        return DP_OK;
    }
    int64_t n = dp_tensor_numel(*out);
    uint64_t key = seed_now();
    if ((st = gpu_random(*out, kind, reserve(n), key, low, range)))
        dp_tensor_release(*out);
    return st;
}

dp_status dp_rand(dp_tensor **out, int ndim, const int64_t *shape, dp_dtype dtype, int device)
{
    dp_status st = check_float("rand", dtype);
    return st ? st : random_tensor(out, ndim, shape, dtype, device, PHILOX_UNIFORM, 0, 0);
}

dp_status dp_randn(dp_tensor **out, int ndim, const int64_t *shape, dp_dtype dtype, int device)
{
    dp_status st = check_float("randn", dtype);
    return st ? st : random_tensor(out, ndim, shape, dtype, device, PHILOX_NORMAL, 0, 0);
}

dp_status dp_randint(dp_tensor **out, int64_t low, int64_t high, int ndim, const int64_t *shape,
                     dp_dtype dtype, int device)
{
    if (high <= low)
        return dp_fail(DP_ERR_ARG, "randint: expected low < high, got low=%lld, high=%lld",
                       (long long)low, (long long)high);
    if (dtype == DP_BOOL)
        return dp_fail(DP_ERR_DTYPE, "randint: dtype bool is not supported");
    return random_tensor(out, ndim, shape, dtype, device, PHILOX_INT, low, (uint64_t)high - (uint64_t)low);
}

/* ---------------------------------------------------------------- dropout */

/* out (new, contiguous) = in with the mask of blocks counter.. under key
 * applied: in * 1 / (1 - p) where philox_keeps, else in * 0 (float
 * arithmetic for float32 and bfloat16, as the GPU's). float32 and
 * bfloat16 draw their uniforms a chunk at a time through the vectorised
 * draw_uniform_f32 (one block at a time, a 140,000-element dropout took
 * twice the time of the five ops it replaces). */
#define DROPOUT_CHUNK 1024
static void dropout_cpu(dp_tensor *out, const dp_tensor *in, uint64_t counter, uint64_t key, double p)
{
    const int64_t n = dp_tensor_numel(in);
    const int dtype = in->dtype;
    const double scale = 1 / (1 - p);
    if (dtype == DP_FLOAT64) {
        const double *x = (const double *)tensor_ptr(in);
        double *y = (double *)tensor_ptr(out);
        for (int64_t i = 0; i < n; i++)
            y[i] = x[i] * (philox_keeps(counter + (uint64_t)i, key, dtype, p) ? scale : 0.0);
        return;
    }
    const float s = (float)scale;
    float u[DROPOUT_CHUNK];
    for (int64_t i0 = 0; i0 < n; i0 += DROPOUT_CHUNK) {
        const int64_t m = n - i0 < DROPOUT_CHUNK ? n - i0 : DROPOUT_CHUNK;
        draw_uniform_f32(u, m, counter + (uint64_t)i0, key);
        if (dtype == DP_FLOAT32) {
            const float *x = (const float *)tensor_ptr(in) + i0;
            float *y = (float *)tensor_ptr(out) + i0;
            for (int64_t j = 0; j < m; j++)
                y[j] = x[j] * (uniform_keeps(u[j], DP_FLOAT32, p) ? s : 0.f);
        } else {
            const uint16_t *x = (const uint16_t *)tensor_ptr(in) + i0;
            uint16_t *y = (uint16_t *)tensor_ptr(out) + i0;
            for (int64_t j = 0; j < m; j++)
                y[j] = f32_to_bf16(bf16_to_f32(x[j]) * (uniform_keeps(bf16_draw(u[j]), dtype, p) ? s : 0.f));
        }
    }
}

static dp_status dropout_apply(dp_tensor **out, dp_tensor *in, uint64_t counter, uint64_t key, double p)
{
    dp_tensor *c = NULL;
    dp_status st = dp_contiguous(&c, in);
    if (!st && !(st = tensor_new(out, c->ndim, c->shape, c->dtype, c->device))) {
        if (ON_CPU(c))
            dropout_cpu(*out, c, counter, key, p);
        else if ((st = gpu_dropout(*out, c, counter, key, p))) {
            dp_tensor_release(*out);
            *out = NULL;
        }
    }
    dp_tensor_release(c);
    return st;
}

/* iarg: the first counter and the key of the mask; darg[0]: p */
static dp_status bw_dropout(ag_node *n, dp_tensor *g, dp_tensor **gi)
{
    dp_tensor *g2 = NULL;
    dp_status st = dp_to(&g2, g, n->in[0].dtype, n->in[0].device);
    if (!st)
        st = dropout_apply(&gi[0], g2, (uint64_t)n->iarg[0], (uint64_t)n->iarg[1], n->darg[0]);
    dp_tensor_release(g2);
    return st;
}

dp_status dp_dropout(dp_tensor **out, dp_tensor *x, double p)
{
    if (x->dtype != DP_FLOAT32 && x->dtype != DP_FLOAT64 && x->dtype != DP_BFLOAT16)
        return dp_fail(DP_ERR_DTYPE, "dropout: expected a float32, float64 or bfloat16 input, got %s",
                       dp_dtype_name(x->dtype));
    if (!(p >= 0 && p < 1))
        return dp_fail(DP_ERR_ARG, "dropout: expected a probability p in [0, 1), got %g", p);
    /* rand_like(x)'s draw: the same key and counters */
    const uint64_t key = seed_now(), counter = reserve(dp_tensor_numel(x));
    dp_status st = dropout_apply(out, x, counter, key, p);
    ag_node *n = NULL;
    if (!st && !(st = ag_record_or_drop(out, "NativeDropoutBackward0", bw_dropout, 1, &x, &n)) && n) {
        n->iarg[0] = (int64_t)counter;
        n->iarg[1] = (int64_t)key;
        n->darg[0] = p;
    }
    return st;
}
