/*
 * rnn.c — CPU kernels of the recurrent layers' pointwise step: one
 * timestep's gates of an LSTM or a GRU, forward and backward, each in one
 * pass over the (N, H) elements. Operands are contiguous float32 or
 * float64 of one dtype (src/core/rnn.c makes them so). float32 runs in
 * float with vmath.h's sigmoid and tanh, whose loops vectorise; float64
 * in double with libm's.
 */
#include "cpu/cpu.h"
#include "cpu/vmath.h"

#include <math.h>

static inline double sigmoid(double x) { return 1 / (1 + exp(-x)); }

/* ---------------------------------------------------------------- LSTM */

/* gi, gh (N, 4H): the gates i, f, g, o before their activations are
 * gi + gh; c (N, H); o (2, N, H): h' = o tanh(c') then c' = f c + i g. */
#define LSTM_FWD(name, T, SIG, TANH)                                                                 \
    VM_CLONES static void name(T *restrict o, const T *restrict xi, const T *restrict hh,             \
                               const T *restrict cp, int64_t N, int64_t H)                            \
    {                                                                                                \
        for (int64_t n = 0; n < N; n++) {                                                            \
            const T *a = xi + n * 4 * H, *b = hh + n * 4 * H;                                         \
            for (int64_t j = 0; j < H; j++) {                                                        \
                T i = SIG(a[j] + b[j]), f = SIG(a[j + H] + b[j + H]);                                \
                T g = TANH(a[j + 2 * H] + b[j + 2 * H]), og = SIG(a[j + 3 * H] + b[j + 3 * H]);      \
                T c1 = f * cp[n * H + j] + i * g;                                                    \
                o[n * H + j] = og * TANH(c1);                                                        \
                o[N * H + n * H + j] = c1;                                                           \
            }                                                                                        \
        }                                                                                            \
    }
LSTM_FWD(lstm_f32, float, vm_sigmoidf, vm_tanhf)
LSTM_FWD(lstm_f64, double, sigmoid, tanh)

dp_status cpu_lstm_gates(dp_tensor *out, dp_tensor *gi, dp_tensor *gh, dp_tensor *c)
{
    int64_t N = c->shape[0], H = c->shape[1];
    if (out->dtype == DP_FLOAT64)
        lstm_f64((double *)tensor_ptr(out), (const double *)tensor_ptr(gi), (const double *)tensor_ptr(gh),
                 (const double *)tensor_ptr(c), N, H);
    else
        lstm_f32((float *)tensor_ptr(out), (const float *)tensor_ptr(gi), (const float *)tensor_ptr(gh),
                 (const float *)tensor_ptr(c), N, H);
    return DP_OK;
}

/* d (2, N, H): the gradients of h' and c'; c1 (N, H) the c' the forward
 * wrote. Writes da (N, 4H), the gradient of gi and of gh, and dc (N, H),
 * the gradient of c. The gates are computed again from gi + gh. */
#define LSTM_BWD(name, T, SIG, TANH)                                                                 \
    VM_CLONES static void name(T *restrict da, T *restrict dc, const T *restrict d, const T *restrict xi, \
                               const T *restrict hh, const T *restrict cp, const T *restrict cn,      \
                               int64_t N, int64_t H)                                                  \
    {                                                                                                \
        for (int64_t n = 0; n < N; n++) {                                                            \
            const T *a = xi + n * 4 * H, *b = hh + n * 4 * H;                                         \
            T *dg = da + n * 4 * H;                                                                  \
            for (int64_t j = 0; j < H; j++) {                                                        \
                int64_t e = n * H + j;                                                               \
                T i = SIG(a[j] + b[j]), f = SIG(a[j + H] + b[j + H]);                                \
                T g = TANH(a[j + 2 * H] + b[j + 2 * H]), og = SIG(a[j + 3 * H] + b[j + 3 * H]);      \
                T tc = TANH(cn[e]), dh = d[e];                                                       \
                T dcn = d[N * H + e] + dh * og * (1 - tc * tc);                                      \
                dg[j] = dcn * g * i * (1 - i);                                                       \
                dg[j + H] = dcn * cp[e] * f * (1 - f);                                               \
                dg[j + 2 * H] = dcn * i * (1 - g * g);                                               \
                dg[j + 3 * H] = dh * tc * og * (1 - og);                                             \
                dc[e] = dcn * f;                                                                     \
            }                                                                                        \
        }                                                                                            \
    }
LSTM_BWD(lstm_bwd_f32, float, vm_sigmoidf, vm_tanhf)
LSTM_BWD(lstm_bwd_f64, double, sigmoid, tanh)

dp_status cpu_lstm_gates_backward(dp_tensor *dgates, dp_tensor *dc, dp_tensor *dout, dp_tensor *gi, dp_tensor *gh,
                                  dp_tensor *c, dp_tensor *c1)
{
    int64_t N = c->shape[0], H = c->shape[1];
#define LSTM_BWD_ARGS(T)                                                                                \
    (T *)tensor_ptr(dgates), (T *)tensor_ptr(dc), (const T *)tensor_ptr(dout), (const T *)tensor_ptr(gi), \
        (const T *)tensor_ptr(gh), (const T *)tensor_ptr(c), (const T *)tensor_ptr(c1), N, H
    if (dc->dtype == DP_FLOAT64)
        lstm_bwd_f64(LSTM_BWD_ARGS(double));
    else
        lstm_bwd_f32(LSTM_BWD_ARGS(float));
#undef LSTM_BWD_ARGS
    return DP_OK;
}

/* ---------------------------------------------------------------- GRU */

/* gi = x W_ih^T + b_ih and gh = h W_hh^T + b_hh (N, 3H) of r, z, n; h (N, H):
 * o (N, H) = (1 - z) n + z h, r = sigmoid(gi_r + gh_r),
 * z = sigmoid(gi_z + gh_z), n = tanh(gi_n + r gh_n). */
#define GRU_FWD(name, T, SIG, TANH)                                                                  \
    VM_CLONES static void name(T *restrict o, const T *restrict xi, const T *restrict hh,             \
                               const T *restrict hp, int64_t N, int64_t H)                            \
    {                                                                                                \
        for (int64_t n = 0; n < N; n++) {                                                            \
            const T *a = xi + n * 3 * H, *b = hh + n * 3 * H;                                         \
            for (int64_t j = 0; j < H; j++) {                                                        \
                T r = SIG(a[j] + b[j]), z = SIG(a[j + H] + b[j + H]);                                \
                T nn = TANH(a[j + 2 * H] + r * b[j + 2 * H]);                                        \
                o[n * H + j] = (1 - z) * nn + z * hp[n * H + j];                                     \
            }                                                                                        \
        }                                                                                            \
    }
GRU_FWD(gru_f32, float, vm_sigmoidf, vm_tanhf)
GRU_FWD(gru_f64, double, sigmoid, tanh)

dp_status cpu_gru_gates(dp_tensor *out, dp_tensor *gi, dp_tensor *gh, dp_tensor *h)
{
    int64_t N = h->shape[0], H = h->shape[1];
    if (out->dtype == DP_FLOAT64)
        gru_f64((double *)tensor_ptr(out), (const double *)tensor_ptr(gi), (const double *)tensor_ptr(gh),
                (const double *)tensor_ptr(h), N, H);
    else
        gru_f32((float *)tensor_ptr(out), (const float *)tensor_ptr(gi), (const float *)tensor_ptr(gh),
                (const float *)tensor_ptr(h), N, H);
    return DP_OK;
}

/* d (N, H): the gradient of h'. Writes dxi, dhh (N, 3H), the gradients
 * of gi and gh, and dh (N, H), that of h. */
#define GRU_BWD(name, T, SIG, TANH)                                                                  \
    VM_CLONES static void name(T *restrict dxi, T *restrict dhh, T *restrict dh, const T *restrict d, \
                               const T *restrict xi, const T *restrict hh, const T *restrict hp,      \
                               int64_t N, int64_t H)                                                  \
    {                                                                                                \
        for (int64_t n = 0; n < N; n++) {                                                            \
            const T *a = xi + n * 3 * H, *b = hh + n * 3 * H;                                         \
            T *da = dxi + n * 3 * H, *db = dhh + n * 3 * H;                                           \
            for (int64_t j = 0; j < H; j++) {                                                        \
                int64_t e = n * H + j;                                                               \
                T r = SIG(a[j] + b[j]), z = SIG(a[j + H] + b[j + H]);                                \
                T hn = b[j + 2 * H], nn = TANH(a[j + 2 * H] + r * hn), dy = d[e];                    \
                T dan = dy * (1 - z) * (1 - nn * nn);        /* before n's tanh */                   \
                T daz = dy * (hp[e] - nn) * z * (1 - z);     /* before z's sigmoid */                \
                T dar = dan * hn * r * (1 - r);              /* before r's sigmoid */                \
                da[j] = db[j] = dar;                                                                 \
                da[j + H] = db[j + H] = daz;                                                         \
                da[j + 2 * H] = dan;                                                                 \
                db[j + 2 * H] = dan * r;                                                             \
                dh[e] = dy * z;                                                                      \
            }                                                                                        \
        }                                                                                            \
    }
GRU_BWD(gru_bwd_f32, float, vm_sigmoidf, vm_tanhf)
GRU_BWD(gru_bwd_f64, double, sigmoid, tanh)

dp_status cpu_gru_gates_backward(dp_tensor *dgi, dp_tensor *dgh, dp_tensor *dh, dp_tensor *dout, dp_tensor *gi,
                                 dp_tensor *gh, dp_tensor *h)
{
    int64_t N = h->shape[0], H = h->shape[1];
#define GRU_BWD_ARGS(T)                                                                                \
    (T *)tensor_ptr(dgi), (T *)tensor_ptr(dgh), (T *)tensor_ptr(dh), (const T *)tensor_ptr(dout),        \
        (const T *)tensor_ptr(gi), (const T *)tensor_ptr(gh), (const T *)tensor_ptr(h), N, H
    if (dh->dtype == DP_FLOAT64)
        gru_bwd_f64(GRU_BWD_ARGS(double));
    else
        gru_bwd_f32(GRU_BWD_ARGS(float));
#undef GRU_BWD_ARGS
    return DP_OK;
}
