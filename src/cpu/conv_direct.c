/*
 * conv_direct.c — float32 2-D convolution on x86-64 CPUs with AVX-512,
 * computed directly instead of as GEMMs on im2col columns: the forward
 * and both gradients.
 *
 * A layer of a small CNN (16-64 channels, 3x3) is too small a GEMM for
 * OpenBLAS to run near its peak, and OpenBLAS stops at AVX2 on CPUs it
 * does not know. Here each image is copied into a blocked layout: blocks
 * of 16 channels (one AVX-512 register), channels innermost (or planes of
 * one channel, for inputs of fewer than 16), the padding written out as
 * zeros so that no loop checks bounds. The forward keeps
 * in registers the outputs of up to 28 pixels of one row by 16-64 output
 * channels, and for every input channel and tap adds the input value
 * (broadcast from memory by the FMA itself) times a vector of 16
 * weights. The input's gradient is the same loop over the output's
 * gradient with the weights flipped; a stride of 2 splits it into the
 * four phases of the input's rows and columns, each a stride-1
 * convolution of a subset of the taps. The weight's gradient keeps in
 * registers the sums of up to 16 input channels by 16-32 output channels
 * of one tap over every pixel of an image.
 *
 * The kernels are compiled for AVX-512 (a target attribute), and again
 * for AVX2 with FMA (AMD's CPUs before Zen 4, Intel's client cores): the
 * same layout and loops, each block of 16 floats in two 8-float
 * registers, so that those kernels keep fewer pixels in registers (6 by
 * 16 outputs, where AVX-512's keep up to 28 by 16 or 7 by 64) and copy
 * the layout with plain loops. The CPU is asked once; without either,
 * conv.c keeps its GEMM path.
 */
#include "cpu/conv_direct.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#define AVX512 __attribute__((target("avx512f,fma")))
#define UNROLL _Pragma("GCC unroll 32")
#define V 16   /* floats in a register, and channels in a block */

/* the floats the kernels may read past a buffer's last pixel (the
 * pixels of a row's last chunk beyond its end), in blocks of V */
#define SLACK(kw) ((2 * 28 + (kw) + 2) * V)

/* ---------------------------------------------------------------- layout */

/* r[0..15] = the transpose of the 16x16 matrix of rows r[0..15] */
AVX512 static inline void transpose16(__m512 r[V])
{
    __m512 t[V], u[V];
    for (int i = 0; i < V; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < V; i += 4) {   /* u[i + k]: rows i..i+3 at column 4 lane + k */
        u[i] = _mm512_shuffle_ps(t[i], t[i + 2], 0x44);
        u[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], 0xEE);
        u[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        u[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
    }
    for (int k = 0; k < 4; k++) {
        __m512 a = _mm512_shuffle_f32x4(u[k], u[4 + k], 0x88), b = _mm512_shuffle_f32x4(u[k], u[4 + k], 0xDD);
        __m512 c = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0x88), d = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0xDD);
        r[k] = _mm512_shuffle_f32x4(a, c, 0x88);
        r[4 + k] = _mm512_shuffle_f32x4(b, d, 0x88);
        r[8 + k] = _mm512_shuffle_f32x4(a, c, 0xDD);
        r[12 + k] = _mm512_shuffle_f32x4(b, d, 0xDD);
    }
}

/* how far ahead (in floats) the copies below fetch each channel's row */
#define PREFETCH 64

/* the even floats of a (0, 2, .., 14) then of b (16, .., 30) */
AVX512 static inline __m512 evens(__m512 a, __m512 b)
{
    return _mm512_permutex2var_ps(a, _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0), b);
}

/* a's floats 0-7 (half 0) or 8-15 (half 1), each followed by a zero */
AVX512 static inline __m512 spread(__m512 a, int half)
{
    __m512i lo = _mm512_set_epi32(16, 7, 16, 6, 16, 5, 16, 4, 16, 3, 16, 2, 16, 1, 16, 0);
    return _mm512_permutex2var_ps(a, half ? _mm512_add_epi32(lo, _mm512_set_epi32(0, 8, 0, 8, 0, 8, 0, 8, 0, 8, 0,
                                                                                8, 0, 8, 0, 8))
                                          : lo, _mm512_setzero_ps());
}

static inline __mmask16 first(int64_t n) { return (__mmask16)(n >= V ? 0xFFFF : n <= 0 ? 0 : (1u << n) - 1); }

/* dst[p*16 + c] = src[c*cs + p*step] for p < np and c < nc, zero for
 * c >= nc: up to 16 channel rows (every pixel, or every other one for
 * step 2) into a row of blocked pixels */
AVX512 static void pack16(const float *src, int64_t cs, int64_t nc, int64_t np, int step, float *dst)
{
    for (int64_t p0 = 0; p0 < np; p0 += V) {
        int64_t m = np - p0 < V ? np - p0 : V, f0 = p0 * step, nf = (m - 1) * step + 1;
        __m512 r[V];
        for (int64_t c = 0; c < nc; c++)   /* 16 streams: more than the hardware follows */
            _mm_prefetch((const char *)(src + c * cs + f0 + PREFETCH * step), _MM_HINT_T0);
        for (int64_t c = 0; c < V; c++) {
            const float *s = src + c * cs + f0;
            if (c >= nc)
                r[c] = _mm512_setzero_ps();
            else if (step == 1)
                r[c] = _mm512_maskz_loadu_ps(first(nf), s);
            else
                r[c] = evens(_mm512_maskz_loadu_ps(first(nf), s), _mm512_maskz_loadu_ps(first(nf - V), s + V));
        }
        transpose16(r);
        for (int64_t p = 0; p < m; p++)
            _mm512_storeu_ps(dst + (p0 + p) * V, r[p]);
    }
}

/* dst[c*cs + p*step] = src[p*16 + c] (+ bias[c]) for c < nc and p < np, and
 * zero at the pixels between (step 2) up to nd floats: a row of blocked
 * pixels back into up to 16 channel rows */
AVX512 static void unpack16(const float *src, int64_t nc, int64_t np, int step, int64_t nd, float *dst, int64_t cs,
                            const float *bias)
{
    for (int64_t p0 = 0; p0 < np; p0 += V) {
        int64_t m = np - p0 < V ? np - p0 : V, f0 = p0 * step;
        __m512 r[V];
        for (int64_t c = 0; c < nc; c++)
            _mm_prefetch((const char *)(dst + c * cs + f0 + PREFETCH * step), _MM_HINT_ET0);
        for (int64_t p = 0; p < V; p++)
            r[p] = p < m ? _mm512_loadu_ps(src + (p0 + p) * V) : _mm512_setzero_ps();
        transpose16(r);
        for (int64_t c = 0; c < nc; c++) {
            float *d = dst + c * cs + f0;
            if (bias)
                r[c] += bias[c];
            if (step == 1) {
                _mm512_mask_storeu_ps(d, first(m), r[c]);
                continue;
            }
            _mm512_mask_storeu_ps(d, first(nd - f0), spread(r[c], 0));
            _mm512_mask_storeu_ps(d + V, first(nd - f0 - V), spread(r[c], 1));
        }
    }
}

/* ---------------------------------------------------------------- kernels */

/* Where a forward kernel reads and writes (in floats). */
typedef struct {
    int64_t nin;        /* input channel blocks */
    int64_t in_plane;   /* between input channel blocks */
    int64_t kh, kw;     /* taps */
    int64_t in_row;     /* between input rows */
    int64_t w_block;    /* between the weights of output channel blocks */
    int64_t out_plane;  /* between output channel blocks */
    int64_t out_px;     /* between output pixels */
} fwd_geom;

/* out = the RW pixels from src (pixel r's window starts at src + r*S*CB)
 * by OB blocks of 16 output channels, the first n pixels stored. The
 * weights wt run (input block, tap row, tap column, channel of the
 * block, 16 outputs), OB blocks w_block apart. */
#define FWD_KERNEL(OB, RW, CB, S)                                                                       \
    AVX512 static void fwd_##OB##_##RW##_##CB##_##S(const float *src, const float *wt, float *out,      \
                                                     int64_t n, const fwd_geom *g)                      \
    {                                                                                                   \
        __m512 acc[RW][OB];                                                                             \
        UNROLL for (int r = 0; r < RW; r++)                                                             \
            UNROLL for (int b = 0; b < OB; b++)                                                         \
                acc[r][b] = _mm512_setzero_ps();                                                        \
        for (int64_t cb = 0; cb < g->nin; cb++)                                                         \
            for (int64_t i = 0; i < g->kh; i++)                                                         \
                for (int64_t j = 0; j < g->kw; j++) {                                                   \
                    const float *s = src + cb * g->in_plane + i * g->in_row + j * CB;                   \
                    for (int c = 0; c < CB; c++, wt += V) {                                             \
                        __m512 w[OB];                                                                   \
                        UNROLL for (int b = 0; b < OB; b++)                                             \
                            w[b] = _mm512_loadu_ps(wt + b * g->w_block);                                \
                        UNROLL for (int r = 0; r < RW; r++)                                             \
                            UNROLL for (int b = 0; b < OB; b++)                                         \
                                acc[r][b] += s[r * S * CB + c] * w[b];                                  \
                    }                                                                                   \
                }                                                                                       \
        UNROLL for (int r = 0; r < RW; r++)                                                             \
            if (r < n)                                                                                  \
                UNROLL for (int b = 0; b < OB; b++)                                                     \
                    _mm512_storeu_ps(out + r * g->out_px + b * g->out_plane, acc[r][b]);                \
    }

/* each OB with its pixel counts: 28 accumulators, or 14 and 7 for short rows */
#define FWD_KERNELS(CB, S)                                                                              \
    FWD_KERNEL(1, 28, CB, S) FWD_KERNEL(1, 14, CB, S) FWD_KERNEL(1, 7, CB, S)                           \
    FWD_KERNEL(2, 14, CB, S) FWD_KERNEL(2, 7, CB, S) FWD_KERNEL(4, 7, CB, S)
FWD_KERNELS(1, 1)
FWD_KERNELS(1, 2)
FWD_KERNELS(16, 1)
FWD_KERNELS(16, 2)

typedef void (*fwd_fn)(const float *, const float *, float *, int64_t, const fwd_geom *);
typedef struct {
    int ob, rw, cb, s;
    fwd_fn fn;
} fwd_kernel;
#define FWD_ROW(CB, S)                                                                                  \
    { 1, 28, CB, S, fwd_1_28_##CB##_##S }, { 1, 14, CB, S, fwd_1_14_##CB##_##S },                       \
    { 1, 7, CB, S, fwd_1_7_##CB##_##S }, { 2, 14, CB, S, fwd_2_14_##CB##_##S },                         \
    { 2, 7, CB, S, fwd_2_7_##CB##_##S }, { 4, 7, CB, S, fwd_4_7_##CB##_##S }
static const fwd_kernel fwd_avx512[] = { FWD_ROW(1, 1), FWD_ROW(1, 2), FWD_ROW(16, 1), FWD_ROW(16, 2), { 0 } };

/* Where a weight-gradient kernel reads and writes (in floats). */
typedef struct {
    int64_t rows, cols;   /* output pixels */
    int64_t x_row;        /* between the windows of output rows in x */
    int64_t g_row;        /* between output rows in g */
    int64_t g_plane;      /* between g's channel blocks */
    int64_t dw_block;     /* between the gradients of output channel blocks */
} dw_geom;

/* dw[q*16 + b*dw_block] += the sum over every output pixel of x (the
 * window's value q floats after pixel's start: a channel, or a tap when
 * CB is 1) times g (OB blocks of 16 output channels); P pixels at a time
 * into separate sums, so that enough of them are in flight. */
#define DW_KERNEL(OB, NQ, CB, S, P)                                                                     \
    AVX512 static void dw_##OB##_##NQ##_##CB##_##S(const float *x, const float *gp, float *dw,          \
                                                    const dw_geom *g)                                   \
    {                                                                                                   \
        __m512 acc[P][NQ][OB];                                                                          \
        UNROLL for (int p = 0; p < P; p++)                                                              \
            UNROLL for (int q = 0; q < NQ; q++)                                                         \
                UNROLL for (int b = 0; b < OB; b++)                                                     \
                    acc[p][q][b] = _mm512_setzero_ps();                                                 \
        for (int64_t oh = 0; oh < g->rows; oh++) {                                                      \
            const float *xr = x + oh * g->x_row, *gr = gp + oh * g->g_row;                              \
            int64_t ow = 0;                                                                             \
            for (; ow + P <= g->cols; ow += P)                                                          \
                UNROLL for (int p = 0; p < P; p++) {                                                    \
                    __m512 gv[OB];                                                                      \
                    UNROLL for (int b = 0; b < OB; b++)                                                 \
                        gv[b] = _mm512_loadu_ps(gr + (ow + p) * V + b * g->g_plane);                    \
                    UNROLL for (int q = 0; q < NQ; q++)                                                 \
                        UNROLL for (int b = 0; b < OB; b++)                                             \
                            acc[p][q][b] += xr[(ow + p) * S * CB + q] * gv[b];                          \
                }                                                                                       \
            for (; ow < g->cols; ow++) {                                                                \
                __m512 gv[OB];                                                                          \
                UNROLL for (int b = 0; b < OB; b++)                                                     \
                    gv[b] = _mm512_loadu_ps(gr + ow * V + b * g->g_plane);                              \
                UNROLL for (int q = 0; q < NQ; q++)                                                     \
                    UNROLL for (int b = 0; b < OB; b++)                                                 \
                        acc[0][q][b] += xr[ow * S * CB + q] * gv[b];                                    \
            }                                                                                           \
        }                                                                                               \
        UNROLL for (int q = 0; q < NQ; q++)                                                             \
            UNROLL for (int b = 0; b < OB; b++) {                                                       \
                __m512 s = acc[0][q][b];                                                                \
                UNROLL for (int p = 1; p < P; p++)                                                      \
                    s += acc[p][q][b];                                                                  \
                float *d = dw + q * V + b * g->dw_block;                                                \
                _mm512_storeu_ps(d, _mm512_loadu_ps(d) + s);                                            \
            }                                                                                           \
    }
DW_KERNEL(1, 16, 16, 1, 1)
DW_KERNEL(1, 16, 16, 2, 1)
DW_KERNEL(2, 8, 16, 1, 1)
DW_KERNEL(2, 8, 16, 2, 1)
DW_KERNEL(1, 3, 1, 1, 4)
DW_KERNEL(1, 3, 1, 2, 4)
DW_KERNEL(1, 1, 1, 1, 8)
DW_KERNEL(1, 1, 1, 2, 8)

typedef void (*dw_fn)(const float *, const float *, float *, const dw_geom *);
typedef struct {
    int ob, nq, cb, s;
    dw_fn fn;
} dw_kernel;
#define DW_ROW(OB, NQ, CB, S) { OB, NQ, CB, S, dw_##OB##_##NQ##_##CB##_##S }
static const dw_kernel dw_avx512[] = { DW_ROW(1, 16, 16, 1), DW_ROW(1, 16, 16, 2), DW_ROW(2, 8, 16, 1),
                                       DW_ROW(2, 8, 16, 2),  DW_ROW(1, 3, 1, 1),   DW_ROW(1, 3, 1, 2),
                                       DW_ROW(1, 1, 1, 1),   DW_ROW(1, 1, 1, 2),   { 0 } };

/* ---------------------------------------------------------------- AVX2 kernels */

/* The same kernels for AVX2 with FMA: a block of 16 floats is two 8-float
 * registers (lo, hi). Of the 16 registers, a forward kernel keeps RW
 * pixels by 16 outputs (2 RW), their 16 weights (2) and the broadcast
 * input (1); a weight-gradient kernel NQ channels by 16 outputs, P
 * pixels apart, and the output's gradient. */
#define AVX2 __attribute__((target("avx2,fma")))

#define FWD2_KERNEL(RW, CB, S)                                                                          \
    AVX2 static void fwd2_##RW##_##CB##_##S(const float *src, const float *wt, float *out, int64_t n,   \
                                             const fwd_geom *g)                                         \
    {                                                                                                   \
        __m256 lo[RW], hi[RW];                                                                          \
        UNROLL for (int r = 0; r < RW; r++)                                                             \
            lo[r] = hi[r] = _mm256_setzero_ps();                                                        \
        for (int64_t cb = 0; cb < g->nin; cb++)                                                         \
            for (int64_t i = 0; i < g->kh; i++)                                                         \
                for (int64_t j = 0; j < g->kw; j++) {                                                   \
                    const float *s = src + cb * g->in_plane + i * g->in_row + j * CB;                   \
                    for (int c = 0; c < CB; c++, wt += V) {                                             \
                        const __m256 w0 = _mm256_loadu_ps(wt), w1 = _mm256_loadu_ps(wt + V / 2);        \
                        UNROLL for (int r = 0; r < RW; r++) {                                           \
                            const __m256 x = _mm256_broadcast_ss(s + r * S * CB + c);                   \
                            lo[r] = _mm256_fmadd_ps(x, w0, lo[r]);                                      \
                            hi[r] = _mm256_fmadd_ps(x, w1, hi[r]);                                      \
                        }                                                                               \
                    }                                                                                   \
                }                                                                                       \
        UNROLL for (int r = 0; r < RW; r++)                                                             \
            if (r < n) {                                                                                \
                _mm256_storeu_ps(out + r * g->out_px, lo[r]);                                           \
                _mm256_storeu_ps(out + r * g->out_px + V / 2, hi[r]);                                   \
            }                                                                                           \
    }
#define FWD2_KERNELS(CB, S) FWD2_KERNEL(6, CB, S) FWD2_KERNEL(4, CB, S)
FWD2_KERNELS(1, 1)
FWD2_KERNELS(1, 2)
FWD2_KERNELS(16, 1)
FWD2_KERNELS(16, 2)
#define FWD2_ROW(CB, S) { 1, 6, CB, S, fwd2_6_##CB##_##S }, { 1, 4, CB, S, fwd2_4_##CB##_##S }
static const fwd_kernel fwd_avx2[] = { FWD2_ROW(1, 1), FWD2_ROW(1, 2), FWD2_ROW(16, 1), FWD2_ROW(16, 2), { 0 } };

#define DW2_KERNEL(NQ, CB, S, P)                                                                        \
    AVX2 static void dw2_##NQ##_##CB##_##S(const float *x, const float *gp, float *dw, const dw_geom *g) \
    {                                                                                                   \
        __m256 lo[P][NQ], hi[P][NQ];                                                                    \
        UNROLL for (int p = 0; p < P; p++)                                                              \
            UNROLL for (int q = 0; q < NQ; q++)                                                         \
                lo[p][q] = hi[p][q] = _mm256_setzero_ps();                                              \
        for (int64_t oh = 0; oh < g->rows; oh++) {                                                      \
            const float *xr = x + oh * g->x_row, *gr = gp + oh * g->g_row;                              \
            int64_t ow = 0;                                                                             \
            for (; ow + P <= g->cols; ow += P)                                                          \
                UNROLL for (int p = 0; p < P; p++) {                                                    \
                    const __m256 g0 = _mm256_loadu_ps(gr + (ow + p) * V);                               \
                    const __m256 g1 = _mm256_loadu_ps(gr + (ow + p) * V + V / 2);                       \
                    UNROLL for (int q = 0; q < NQ; q++) {                                               \
                        const __m256 xv = _mm256_broadcast_ss(xr + (ow + p) * S * CB + q);              \
                        lo[p][q] = _mm256_fmadd_ps(xv, g0, lo[p][q]);                                   \
                        hi[p][q] = _mm256_fmadd_ps(xv, g1, hi[p][q]);                                   \
                    }                                                                                   \
                }                                                                                       \
            for (; ow < g->cols; ow++) {                                                                \
                const __m256 g0 = _mm256_loadu_ps(gr + ow * V), g1 = _mm256_loadu_ps(gr + ow * V + V / 2); \
                UNROLL for (int q = 0; q < NQ; q++) {                                                   \
                    const __m256 xv = _mm256_broadcast_ss(xr + ow * S * CB + q);                        \
                    lo[0][q] = _mm256_fmadd_ps(xv, g0, lo[0][q]);                                       \
                    hi[0][q] = _mm256_fmadd_ps(xv, g1, hi[0][q]);                                       \
                }                                                                                       \
            }                                                                                           \
        }                                                                                               \
        UNROLL for (int q = 0; q < NQ; q++) {                                                           \
            __m256 a = lo[0][q], b = hi[0][q];                                                          \
            UNROLL for (int p = 1; p < P; p++) {                                                        \
                a = _mm256_add_ps(a, lo[p][q]);                                                         \
                b = _mm256_add_ps(b, hi[p][q]);                                                         \
            }                                                                                           \
            float *d = dw + q * V;                                                                      \
            _mm256_storeu_ps(d, _mm256_add_ps(_mm256_loadu_ps(d), a));                                  \
            _mm256_storeu_ps(d + V / 2, _mm256_add_ps(_mm256_loadu_ps(d + V / 2), b));                  \
        }                                                                                               \
    }
DW2_KERNEL(4, 16, 1, 1)
DW2_KERNEL(4, 16, 2, 1)
DW2_KERNEL(3, 1, 1, 2)
DW2_KERNEL(3, 1, 2, 2)
DW2_KERNEL(1, 1, 1, 4)
DW2_KERNEL(1, 1, 2, 4)
#define DW2_ROW(NQ, CB, S) { 1, NQ, CB, S, dw2_##NQ##_##CB##_##S }
static const dw_kernel dw_avx2[] = { DW2_ROW(4, 16, 1), DW2_ROW(4, 16, 2), DW2_ROW(3, 1, 1), DW2_ROW(3, 1, 2),
                                     DW2_ROW(1, 1, 1),  DW2_ROW(1, 1, 2),  { 0 } };

/* r[0..7] = the transpose of the 8x8 matrix of rows r[0..7] */
AVX2 static inline void transpose8(__m256 r[8])
{
    __m256 t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {   /* u[i + k]: rows i..i+3 at column 4 lane + k, in each half */
        u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
        u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
        u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
    }
    for (int k = 0; k < 4; k++) {
        r[k] = _mm256_permute2f128_ps(u[k], u[4 + k], 0x20);
        r[4 + k] = _mm256_permute2f128_ps(u[k], u[4 + k], 0x31);
    }
}

/* the lanes below n (0..8) of an AVX2 masked load */
AVX2 static inline __m256i lanes_below(int64_t n)
{
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n < 8 ? n : 8)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* pack16's contract with AVX2: 8x8 transposes, each half of a block of 16
 * channels apart; every other pixel (step 2) in plain loops */
AVX2 static void pack16_avx2(const float *src, int64_t cs, int64_t nc, int64_t np, int step, float *dst)
{
    if (step != 1) {
        for (int64_t p = 0; p < np; p++)
            for (int64_t c = 0; c < V; c++)
                dst[p * V + c] = c < nc ? src[c * cs + p * step] : 0.0f;
        return;
    }
    for (int64_t p0 = 0; p0 < np; p0 += 8) {
        int64_t m = np - p0 < 8 ? np - p0 : 8;
        __m256i in = lanes_below(m);
        for (int half = 0; half < 2; half++) {
            __m256 r[8];
            for (int c = 0; c < 8; c++) {
                int64_t ch = half * 8 + c;
                r[c] = ch >= nc ? _mm256_setzero_ps()
                       : m == 8 ? _mm256_loadu_ps(src + ch * cs + p0) : _mm256_maskload_ps(src + ch * cs + p0, in);
            }
            transpose8(r);
            for (int64_t p = 0; p < m; p++)
                _mm256_storeu_ps(dst + (p0 + p) * V + half * 8, r[p]);
        }
    }
}

/* unpack16's contract with AVX2, as pack16_avx2 */
AVX2 static void unpack16_avx2(const float *src, int64_t nc, int64_t np, int step, int64_t nd, float *dst,
                               int64_t cs, const float *bias)
{
    if (step != 1) {
        for (int64_t c = 0; c < nc; c++)
            for (int64_t f = 0; f < nd; f++)
                dst[c * cs + f] = f % step == 0 && f / step < np ? src[f / step * V + c] + (bias ? bias[c] : 0.0f)
                                                                 : 0.0f;
        return;
    }
    for (int64_t p0 = 0; p0 < np; p0 += 8) {
        int64_t m = np - p0 < 8 ? np - p0 : 8;
        for (int half = 0; half < 2 && half * 8 < nc; half++) {
            __m256 r[8];
            for (int64_t p = 0; p < 8; p++)
                r[p] = p < m ? _mm256_loadu_ps(src + (p0 + p) * V + half * 8) : _mm256_setzero_ps();
            transpose8(r);
            for (int c = 0; c < 8 && half * 8 + c < nc; c++) {
                int64_t ch = half * 8 + c;
                __m256 v = bias ? _mm256_add_ps(r[c], _mm256_set1_ps(bias[ch])) : r[c];
                if (m == 8) {
                    _mm256_storeu_ps(dst + ch * cs + p0, v);
                } else {   /* (a masked store is microcoded and slow on AMD's CPUs) */
                    float tail[8];
                    _mm256_storeu_ps(tail, v);
                    memcpy(dst + ch * cs + p0, tail, sizeof(float) * (size_t)m);
                }
            }
        }
    }
}

/* ---------------------------------------------------------------- the instruction set */

/* The kernels of one instruction set and how the loops below use them:
 * the most output blocks a forward or weight-gradient kernel takes, the
 * channels of a 16-block a weight-gradient kernel of one output block
 * takes at once (of two blocks, half as many), and the fewest input
 * channels it takes a convolution with (AVX2's kernels over planes of one
 * channel keep too few pixels in registers to beat the GEMM path). */
typedef struct {
    const fwd_kernel *fwd;
    const dw_kernel *dw;
    int fwd_most, dw_most, dw_channels, min_channels;
    void (*pack)(const float *src, int64_t cs, int64_t nc, int64_t np, int step, float *dst);
    void (*unpack)(const float *src, int64_t nc, int64_t np, int step, int64_t nd, float *dst, int64_t cs,
                   const float *bias);
} isa_kernels;

static const isa_kernels isa_avx512 = { fwd_avx512, dw_avx512, 4, 2, V, 1, pack16, unpack16 };
static const isa_kernels isa_avx2 = { fwd_avx2, dw_avx2, 1, 1, 4, V, pack16_avx2, unpack16_avx2 };

/* the CPU's kernels, or NULL (read at load time) */
static const isa_kernels *isa_of_cpu(void)
{
    if (!__builtin_cpu_supports("fma"))
        return NULL;
    if (__builtin_cpu_supports("avx512f"))
        return &isa_avx512;
    return __builtin_cpu_supports("avx2") ? &isa_avx2 : NULL;
}

/* A forward kernel for OB output blocks over rows of `width` pixels: the
 * pixel count of the fewest pixels computed in all (the larger on a tie). */
static fwd_fn fwd_pick(const isa_kernels *k, int ob, int64_t cb, int64_t s, int64_t width, int64_t *rw)
{
    fwd_fn best = NULL;
    int64_t cost = 0;
    *rw = 1;
    for (const fwd_kernel *f = k->fwd; f->fn; f++) {
        if (f->ob != ob || f->cb != cb || f->s != s)
            continue;
        int64_t r = f->rw, c = (width + r - 1) / r * r;
        if (!best || c < cost) {
            best = f->fn, cost = c, *rw = r;
        }
    }
    return best;
}

static dw_fn dw_pick(const isa_kernels *k, int ob, int64_t nq, int64_t cb, int64_t s)
{
    for (const dw_kernel *d = k->dw; d->fn; d++)
        if (d->ob == ob && d->nq == nq && d->cb == cb && d->s == s)
            return d->fn;
    return NULL;
}

/* ---------------------------------------------------------------- plans */

/* A 1x1 convolution with strides and no padding is one of stride 1 on
 * every sh-th row and sw-th column of the input: the blocked copy keeps
 * only those (step_h, step_w), and the input's gradient is zero between. */
typedef struct {
    int64_t N, C, H, W, O, kh, kw, Ho, Wo, sh, sw, ph, pw;
    int64_t step_h, step_w;   /* the input's rows and columns taken: every step-th */
    int64_t Hs, Ws;           /* their numbers */
    int64_t cb;          /* the input's block: 16 channels, or 1 (planes, when C < 16: no zero channels) */
    int64_t nin, nout;   /* input blocks; output blocks of 16 */
    int64_t Hp, Wp;      /* the padded input */
    int64_t in_plane;    /* floats of an input block */
    const isa_kernels *k;
} dplan;

static void plan_of(dplan *p, const dp_tensor *x, const dp_tensor *w, const cpu_conv_args *a)
{
    p->N = x->shape[0], p->C = x->shape[1], p->H = x->shape[2], p->W = x->shape[3];
    p->O = w->shape[0], p->kh = w->shape[2], p->kw = w->shape[3];
    p->Ho = a->u.out_h, p->Wo = a->u.out_w;
    p->sh = a->u.stride[0], p->sw = a->u.stride[1], p->ph = a->u.padding[0], p->pw = a->u.padding[1];
    p->step_h = p->step_w = 1, p->Hs = p->H, p->Ws = p->W;
    if (p->kh == 1 && p->kw == 1 && p->ph == 0 && p->pw == 0) {
        p->step_h = p->sh, p->step_w = p->sw, p->Hs = p->Ho, p->Ws = p->Wo;
        p->sh = p->sw = 1;
    }
    p->cb = p->C < V ? 1 : V;
    p->nin = (p->C + p->cb - 1) / p->cb, p->nout = (p->O + V - 1) / V;
    p->Hp = p->Hs + 2 * p->ph, p->Wp = p->Ws + 2 * p->pw;
    p->in_plane = p->Hp * p->Wp * p->cb;
    p->k = isa_of_cpu();
}

/* the output blocks a kernel takes at once from block ob0 */
static int blocks_at(int64_t n, int64_t ob0, int most)
{
    int64_t left = n - ob0;
    return left >= 4 && most >= 4 ? 4 : left >= 2 && most >= 2 ? 2 : 1;
}

bool conv_direct_takes(const dp_tensor *x, const dp_tensor *w, const cpu_conv_args *a)
{
    const cpu_unfold_args *u = &a->u;
    const isa_kernels *k = isa_of_cpu();
    return k && x->shape[1] >= k->min_channels && x->dtype == DP_FLOAT32 && a->groups == 1 && u->dilation[0] == 1 && u->dilation[1] == 1 &&
           (u->stride[0] == 1 || u->stride[0] == 2) && (u->stride[1] == 1 || u->stride[1] == 2) &&
           dp_tensor_numel(x) > 0 && dp_tensor_numel(w) > 0 && u->out_h > 0 && u->out_w > 0;
}

bool conv_direct_takes_input_grad(const dp_tensor *x) { return x->shape[1] >= V / 2; }

/* buf (nin, Hp, Wp, cb) = image xn (C, H, W)'s rows and columns taken,
 * inside the padding (zeroed once with the buffer: each image writes the
 * same interior) */
static void pack_input(const dplan *p, const float *xn, float *buf)
{
    for (int64_t cb = 0; cb < p->nin; cb++)
        for (int64_t h = 0; h < p->Hs; h++) {
            float *d = buf + cb * p->in_plane + ((h + p->ph) * p->Wp + p->pw) * p->cb;
            const float *s = xn + (cb * p->cb * p->H + h * p->step_h) * p->W;
            if (p->cb > 1)
                p->k->pack(s, p->H * p->W, p->C - cb * V < V ? p->C - cb * V : V, p->Ws, (int)p->step_w, d);
            else if (p->step_w == 1)
                memcpy(d, s, sizeof(float) * (size_t)p->Ws);
            else
                for (int64_t w = 0; w < p->Ws; w++)
                    d[w] = s[w * p->step_w];
        }
}

/* wt (nout, nin, kh, kw, cb, 16) = w (O, C, kh, kw) by output and input
 * blocks, zero past O and C */
static void forward_weights(const dplan *p, const float *w, float *wt)
{
    for (int64_t ob = 0; ob < p->nout; ob++)
        for (int64_t cb = 0; cb < p->nin; cb++)
            for (int64_t i = 0; i < p->kh; i++)
                for (int64_t j = 0; j < p->kw; j++)
                    for (int64_t c = cb * p->cb; c < (cb + 1) * p->cb; c++)
                        for (int64_t o = ob * V; o < (ob + 1) * V; o++)
                            *wt++ = o < p->O && c < p->C ? w[((o * p->C + c) * p->kh + i) * p->kw + j] : 0.0f;
}

/* ---------------------------------------------------------------- workers */

/* One thread's share of a convolution: images [n0, n1), with its own
 * blocked copies (scratch) and, for the weight's gradient, its own sums. */
typedef struct {
    const dplan *p;
    const void *d;                  /* the backward's dx_plan */
    const float *x, *g, *w, *bias;  /* g: the output's gradient; w: the weights, blocked */
    float *out, *dx;                /* the forward's output; the input's gradient */
    float *scratch, *dwt;
    int64_t n0, n1;
} conv_work;

#define MAX_WORKERS 64
/* multiply-adds a worker should have at least: starting a thread costs
 * about as much as a few million (tens of microseconds) */
#define WORKER_MACS (4LL << 20)

/* How many threads share a convolution of N images and `macs`
 * multiply-adds: the CPU kernels' threads (torch.set_num_threads), at
 * most one per image and per WORKER_MACS. */
static int workers_for(int64_t N, int64_t macs)
{
    int64_t n = cpu_blas_threads();
    if (n > N)
        n = N;
    if (n > macs / WORKER_MACS)
        n = macs / WORKER_MACS;
    return n < 1 ? 1 : n > MAX_WORKERS ? MAX_WORKERS : (int)n;
}

/* Runs fn on each of the n shares: share 0 here, the others on threads
 * of their own (here too where a thread cannot start). */
static void run_workers(conv_work *w, int n, void *(*fn)(void *))
{
    pthread_t t[MAX_WORKERS];
    bool started[MAX_WORKERS] = { false };
    for (int i = 1; i < n; i++)
        started[i] = pthread_create(&t[i], NULL, fn, &w[i]) == 0;
    fn(&w[0]);
    for (int i = 1; i < n; i++)
        if (started[i])
            pthread_join(t[i], NULL);
        else
            fn(&w[i]);
}

/* n floats from the CPU allocator's caches (fresh pages from the system
 * would cost more than the copies they hold), zeroed; NULL when out of
 * memory. Released by scratch_free with *cap. */
static float *scratch_alloc(size_t n, size_t *cap)
{
    float *p = cpu_alloc(n * sizeof(float), cap);
    if (p)
        memset(p, 0, n * sizeof(float));
    return p;
}

static void scratch_free(float *p, size_t cap)
{
    if (p)
        cpu_free(p, cap);
}

/* w[0..n) over the images, each with `each` floats of a zeroed block (one
 * per call: its padding stays zero for every image), or NULL */
static float *split_work(conv_work *w, int n, const conv_work *base, size_t each, size_t *cap)
{
    float *block = scratch_alloc(each * (size_t)n, cap);
    for (int i = 0; i < n && block; i++) {
        w[i] = *base;
        w[i].n0 = base->p->N * i / n, w[i].n1 = base->p->N * (i + 1) / n;
        w[i].scratch = block + each * (size_t)i;
    }
    return block;
}

/* ---------------------------------------------------------------- forward */

/* the forward's blocked copies of an image: input, then output */
static size_t forward_scratch(const dplan *p, size_t *nx)
{
    *nx = (size_t)(p->nin * p->in_plane + SLACK(p->kw));
    return *nx + (size_t)(p->nout * p->Ho * p->Wo * V);
}

static void *forward_images(void *arg)
{
    const conv_work *k = arg;
    const dplan *p = k->p;
    int64_t L = p->Ho * p->Wo, w_block = p->nin * p->kh * p->kw * p->cb * V;
    size_t nx;
    forward_scratch(p, &nx);
    float *xbuf = k->scratch, *obuf = xbuf + nx;
    fwd_geom g = { p->nin, p->in_plane, p->kh, p->kw, p->Wp * p->cb, w_block, L * V, V };
    for (int64_t n = k->n0; n < k->n1; n++) {
        pack_input(p, k->x + n * p->C * p->H * p->W, xbuf);
        for (int64_t ob0 = 0; ob0 < p->nout;) {
            int ob = blocks_at(p->nout, ob0, p->k->fwd_most);
            int64_t rw;
            fwd_fn fn = fwd_pick(p->k, ob, p->cb, p->sw, p->Wo, &rw);
            for (int64_t oh = 0; oh < p->Ho; oh++)
                for (int64_t ow0 = 0; ow0 < p->Wo; ow0 += rw)
                    fn(xbuf + (oh * p->sh * p->Wp + ow0 * p->sw) * p->cb, k->w + ob0 * w_block,
                       obuf + ob0 * L * V + (oh * p->Wo + ow0) * V, p->Wo - ow0 < rw ? p->Wo - ow0 : rw, &g);
            ob0 += ob;
        }
        float *on = k->out + n * p->O * L;
        for (int64_t ob = 0; ob < p->nout; ob++)
            p->k->unpack(obuf + ob * L * V, p->O - ob * V < V ? p->O - ob * V : V, L, 1, L, on + ob * V * L, L,
                         k->bias ? k->bias + ob * V : NULL);
    }
    return NULL;
}

static int64_t macs_of(const dplan *p) { return p->N * p->O * p->C * p->kh * p->kw * p->Ho * p->Wo; }

dp_status conv_direct_forward(dp_tensor *out, dp_tensor *x, dp_tensor *w, dp_tensor *b, const cpu_conv_args *a)
{
    dplan p;
    plan_of(&p, x, w, a);
    size_t nx, nwt = (size_t)(p.nout * p.nin * p.kh * p.kw * p.cb * V), wcap, bcap;
    float *wt = scratch_alloc(nwt, &wcap);
    conv_work base = { .p = &p, .x = (const float *)tensor_ptr(x), .w = wt, .out = (float *)tensor_ptr(out),
                       .bias = b ? (const float *)tensor_ptr(b) : NULL }, work[MAX_WORKERS];
    int nw = workers_for(p.N, macs_of(&p));
    float *block = wt ? split_work(work, nw, &base, forward_scratch(&p, &nx), &bcap) : NULL;
    if (!block) {
        scratch_free(wt, wcap);
        return dp_fail(DP_ERR_MEMORY, "conv2d: out of memory for the blocked copies of %d images (%zu floats each)",
                       nw, forward_scratch(&p, &nx));
    }
    forward_weights(&p, (const float *)tensor_ptr(w), wt);
    run_workers(work, nw, forward_images);
    scratch_free(block, bcap);
    scratch_free(wt, wcap);
    return DP_OK;
}

/* ---------------------------------------------------------------- backward */

/* The input's gradient as sh x sw stride-1 convolutions of g, one per
 * phase (a, b) of dx's padded rows and columns: dx's padded row
 * sh*u + a sums g's rows u - t over the taps i = a + sh*t (so Ta of
 * them), flipped to read g's rows upwards from u - (Ta - 1). g sits in
 * its buffer from row top and column left (the most taps of a phase,
 * less one), zeros around it. */
typedef struct {
    int64_t top, left;     /* g's first row and column in its buffer */
    int64_t Hg, Wg;        /* the buffer's rows and columns */
    int64_t g_plane;       /* floats of a block of 16 channels of it */
    int64_t nx;            /* dx's blocks of 16 channels */
    int64_t w_off[2][2];   /* each phase's weights in wx */
} dx_plan;

/* the taps of phase a of a kernel of k taps at stride s */
static int64_t phase_taps(int64_t k, int64_t s, int64_t a) { return a < k ? (k - a + s - 1) / s : 0; }

/* [lo, hi]: the u (or v) of phase a whose dx row sh*u + a - pad lies in [0, n) */
static void phase_range(int64_t n, int64_t s, int64_t pad, int64_t a, int64_t *lo, int64_t *hi)
{
    *lo = pad > a ? (pad - a + s - 1) / s : 0;
    *hi = (n - 1 + pad - a) / s;
}

static size_t dx_plan_of(dx_plan *d, const dplan *p)
{
    d->top = (p->kh + p->sh - 1) / p->sh - 1, d->left = (p->kw + p->sw - 1) / p->sw - 1;
    int64_t lo, uhi, vhi;
    phase_range(p->Hs, p->sh, p->ph, 0, &lo, &uhi);
    phase_range(p->Ws, p->sw, p->pw, 0, &lo, &vhi);
    d->Hg = d->top + (p->Ho > uhi + 1 ? p->Ho : uhi + 1);
    d->Wg = d->left + (p->Wo > vhi + 1 ? p->Wo : vhi + 1);
    d->g_plane = d->Hg * d->Wg * V;
    d->nx = (p->C + V - 1) / V;
    size_t off = 0;
    for (int a = 0; a < p->sh; a++)
        for (int b = 0; b < p->sw; b++) {
            d->w_off[a][b] = (int64_t)off;
            off += (size_t)(d->nx * p->nout * phase_taps(p->kh, p->sh, a) * phase_taps(p->kw, p->sw, b) * V * V);
        }
    return off;
}

/* wx, phase by phase: (nx, nout, Ta, Tb, 16 of O, 16 of C) = w's taps of
 * the phase, flipped, zero past O and C */
static void dx_weights(const dplan *p, const dx_plan *d, const float *w, float *wx)
{
    for (int64_t a = 0; a < p->sh; a++)
        for (int64_t b = 0; b < p->sw; b++) {
            int64_t Ta = phase_taps(p->kh, p->sh, a), Tb = phase_taps(p->kw, p->sw, b);
            float *o_ = wx + d->w_off[a][b];
            for (int64_t cb = 0; cb < d->nx; cb++)
                for (int64_t ob = 0; ob < p->nout; ob++)
                    for (int64_t t = 0; t < Ta; t++)
                        for (int64_t t2 = 0; t2 < Tb; t2++) {
                            int64_t i = a + p->sh * (Ta - 1 - t), j = b + p->sw * (Tb - 1 - t2);
                            for (int64_t o = ob * V; o < (ob + 1) * V; o++)
                                for (int64_t c = cb * V; c < (cb + 1) * V; c++)
                                    *o_++ = o < p->O && c < p->C ? w[((o * p->C + c) * p->kh + i) * p->kw + j] : 0.0f;
                        }
        }
}

/* dxbuf (nx, Hs, Ws, 16) = the input's gradient of one image at the rows
 * and columns taken, from gbuf */
static void dx_image(const dplan *p, const dx_plan *d, const float *gbuf, const float *wx, float *dxbuf)
{
    for (int64_t a = 0; a < p->sh; a++)
        for (int64_t b = 0; b < p->sw; b++) {
            int64_t Ta = phase_taps(p->kh, p->sh, a), Tb = phase_taps(p->kw, p->sw, b), ulo, uhi, vlo, vhi;
            phase_range(p->Hs, p->sh, p->ph, a, &ulo, &uhi);
            phase_range(p->Ws, p->sw, p->pw, b, &vlo, &vhi);
            fwd_geom g = { p->nout, d->g_plane, Ta, Tb, d->Wg * V, p->nout * Ta * Tb * V * V, p->Hs * p->Ws * V,
                           p->sw * V };
            for (int64_t cb0 = 0; cb0 < d->nx;) {
                int ob = blocks_at(d->nx, cb0, p->k->fwd_most);
                int64_t rw;
                fwd_fn fn = fwd_pick(p->k, ob, V, 1, vhi - vlo + 1, &rw);
                for (int64_t u = ulo; u <= uhi; u++)
                    for (int64_t v0 = vlo; v0 <= vhi; v0 += rw) {
                        int64_t row = u - (Ta - 1) + d->top, col = v0 - (Tb - 1) + d->left;   /* g's, first tap */
                        int64_t h = p->sh * u + a - p->ph, w = p->sw * v0 + b - p->pw;           /* dx's */
                        fn(Ta && Tb ? gbuf + (row * d->Wg + col) * V : gbuf, wx + d->w_off[a][b] + cb0 * g.w_block,
                           dxbuf + cb0 * g.out_plane + (h * p->Ws + w) * V, vhi - v0 + 1 < rw ? vhi - v0 + 1 : rw, &g);
                    }
                cb0 += ob;
            }
        }
}

/* dwt (nout, nin, kh, kw, cb, 16) += the weight's gradient of one image
 * from xbuf (pack_input's) and g at gp in its buffer */
static void dw_image(const dplan *p, const dx_plan *d, const float *xbuf, const float *gp, float *dwt)
{
    int64_t dw_block = p->nin * p->kh * p->kw * p->cb * V;
    dw_geom g = { p->Ho, p->Wo, p->sh * p->Wp * p->cb, d->Wg * V, d->g_plane, dw_block };
    for (int64_t ob0 = 0; ob0 < p->nout;) {
        int ob = p->cb == 1 ? 1 : blocks_at(p->nout, ob0, p->k->dw_most);
        for (int64_t cb = 0; cb < p->nin; cb++) {
            int64_t nc = p->C - cb * p->cb < p->cb ? p->C - cb * p->cb : p->cb;
            for (int64_t i = 0; i < p->kh; i++)
                for (int64_t j = 0; j < p->kw;) {
                    /* the kernel's NQ floats of the window: channels at tap j (16 or 8 with AVX-512, 4
                     * with AVX2), or (blocks of one channel) the taps from j, 3 or 1 of them */
                    int64_t nq = p->cb > 1 ? p->k->dw_channels / ob : p->kw - j >= 3 ? 3 : 1;
                    dw_fn fn = dw_pick(p->k, ob, nq, p->cb, p->sw);
                    for (int64_t c0 = 0; c0 < nc; c0 += nq)
                        fn(xbuf + cb * p->in_plane + (i * p->Wp + j) * p->cb + c0, gp + ob0 * d->g_plane,
                           dwt + ob0 * dw_block + (((cb * p->kh + i) * p->kw + j) * p->cb + c0) * V, &g);
                    j += p->cb > 1 ? 1 : nq;
                }
        }
        ob0 += ob;
    }
}

/* dw (O, C, kh, kw) = dwt (dw_image's layout) */
static void dw_unblock(const dplan *p, const float *dwt, float *dw)
{
    for (int64_t o = 0; o < p->O; o++)
        for (int64_t c = 0; c < p->C; c++)
            for (int64_t i = 0; i < p->kh; i++)
                for (int64_t j = 0; j < p->kw; j++)
                    dw[((o * p->C + c) * p->kh + i) * p->kw + j] =
                        dwt[((((o / V * p->nin + c / p->cb) * p->kh + i) * p->kw + j) * p->cb + c % p->cb) * V + o % V];
}

/* dxn (C, H, W) = dxbuf (dx_image's) at the rows and columns taken, zero
 * between */
static void dx_unpack(const dplan *p, const dx_plan *d, const float *dxbuf, float *dxn)
{
    int64_t HW = p->H * p->W, plane = p->Hs * p->Ws * V;
    for (int64_t cb = 0; cb < d->nx; cb++) {
        int64_t nc = p->C - cb * V < V ? p->C - cb * V : V;
        float *dc = dxn + cb * V * HW;
        if (p->step_h == 1 && p->step_w == 1) {
            p->k->unpack(dxbuf + cb * plane, nc, HW, 1, HW, dc, HW, NULL);
            continue;
        }
        for (int64_t h = 0; h < p->H; h++) {
            if (h % p->step_h)
                for (int64_t c = 0; c < nc; c++)
                    memset(dc + c * HW + h * p->W, 0, sizeof(float) * (size_t)p->W);
            else
                p->k->unpack(dxbuf + cb * plane + h / p->step_h * p->Ws * V, nc, p->Ws, (int)p->step_w, p->W,
                             dc + h * p->W, HW, NULL);
        }
    }
}

/* the backward's blocked copies of an image (g, x for the weight's
 * gradient, dx for the input's) and the weight's gradient's sums */
static size_t backward_scratch(const dplan *p, const dx_plan *d, bool dx, bool dw, size_t part[3])
{
    part[0] = (size_t)(p->nout * d->g_plane + SLACK(d->left + 1));
    part[1] = dw ? (size_t)(p->nin * p->in_plane + SLACK(p->kw)) : 0;
    part[2] = dx ? (size_t)(d->nx * p->Hs * p->Ws * V) : 0;
    return part[0] + part[1] + part[2] + (dw ? (size_t)(p->nout * p->nin * p->kh * p->kw * p->cb * V) : 0);
}

static void *backward_images(void *arg)
{
    const conv_work *k = arg;
    const dplan *p = k->p;
    const dx_plan *d = k->d;
    size_t part[3];
    backward_scratch(p, d, k->dx, k->dwt, part);
    float *gbuf = k->scratch, *xbuf = gbuf + part[0], *dxbuf = xbuf + part[1];
    int64_t L = p->Ho * p->Wo;
    for (int64_t n = k->n0; n < k->n1; n++) {
        const float *gn = k->g + n * p->O * L;
        for (int64_t ob = 0; ob < p->nout; ob++)
            for (int64_t oh = 0; oh < p->Ho; oh++)
                p->k->pack(gn + (ob * V * p->Ho + oh) * p->Wo, L, p->O - ob * V < V ? p->O - ob * V : V, p->Wo, 1,
                           gbuf + ob * d->g_plane + ((oh + d->top) * d->Wg + d->left) * V);
        if (k->dwt) {
            pack_input(p, k->x + n * p->C * p->H * p->W, xbuf);
            dw_image(p, d, xbuf, gbuf + (d->top * d->Wg + d->left) * V, k->dwt);
        }
        if (k->dx) {
            dx_image(p, d, gbuf, k->w, dxbuf);
            dx_unpack(p, d, dxbuf, k->dx + n * p->C * p->H * p->W);
        }
    }
    return NULL;
}

dp_status conv_direct_backward(dp_tensor *dx, dp_tensor *dw, dp_tensor *g, dp_tensor *x, dp_tensor *w,
                               const cpu_conv_args *a)
{
    dplan p;
    dx_plan d;
    if (!dx && !dw)
        return DP_OK;
    plan_of(&p, x, w, a);
    size_t nwx = dx_plan_of(&d, &p), part[3], each = backward_scratch(&p, &d, dx, dw, part), wcap = 0, bcap;
    float *wx = dx ? scratch_alloc(nwx, &wcap) : NULL;
    conv_work base = { .p = &p, .d = &d, .x = (const float *)tensor_ptr(x), .g = (const float *)tensor_ptr(g),
                       .w = wx, .dx = dx ? (float *)tensor_ptr(dx) : NULL }, work[MAX_WORKERS];
    int nw = workers_for(p.N, 2 * macs_of(&p));
    float *block = !dx || wx ? split_work(work, nw, &base, each, &bcap) : NULL;
    if (!block) {
        scratch_free(wx, wcap);
        return dp_fail(DP_ERR_MEMORY, "conv2d backward: out of memory for the blocked copies of %d images (%zu "
                       "floats each)", nw, each);
    }
    size_t ndw = each - part[0] - part[1] - part[2];
    for (int i = 0; i < nw && dw; i++)
        work[i].dwt = work[i].scratch + each - ndw;
    if (dx)
        dx_weights(&p, &d, (const float *)tensor_ptr(w), wx);
    run_workers(work, nw, backward_images);
    for (int i = 1; i < nw && dw; i++)   /* the workers' sums, in a fixed order */
        for (size_t k = 0; k < ndw; k++)
            work[0].dwt[k] += work[i].dwt[k];
    if (dw)
        dw_unblock(&p, work[0].dwt, (float *)tensor_ptr(dw));
    scratch_free(block, bcap);
    scratch_free(wx, wcap);
    return DP_OK;
}

#else /* not x86-64 with GCC or clang: conv.c's GEMMs do it all */

bool conv_direct_takes(const dp_tensor *x, const dp_tensor *w, const cpu_conv_args *a)
{
    (void)x, (void)w, (void)a;
    return false;
}

bool conv_direct_takes_input_grad(const dp_tensor *x)
{
    (void)x;
    return false;
}

dp_status conv_direct_forward(dp_tensor *out, dp_tensor *x, dp_tensor *w, dp_tensor *b, const cpu_conv_args *a)
{
    (void)out, (void)x, (void)w, (void)b, (void)a;
    return dp_fail(DP_ERR_STATE, "conv2d: no direct convolution on this CPU");
}

dp_status conv_direct_backward(dp_tensor *dx, dp_tensor *dw, dp_tensor *g, dp_tensor *x, dp_tensor *w,
                               const cpu_conv_args *a)
{
    (void)dx, (void)dw, (void)g, (void)x, (void)w, (void)a;
    return dp_fail(DP_ERR_STATE, "conv2d backward: no direct convolution on this CPU");
}

#endif
