/*
 * rnn.c — CPU kernels of the recurrent layers' pointwise step: one
 * timestep's gates of an LSTM or a GRU, forward and backward, each in one
 * pass over the (N, H) elements. Operands are contiguous float32 or
 * float64 of one dtype (src/core/rnn.c makes them so); the arithmetic is
 * double, rounded once at the store.
 */
#include "cpu/cpu.h"

#include <math.h>

static inline double ld(const void *p, int64_t i, bool f64)
{
    return f64 ? ((const double *)p)[i] : (double)((const float *)p)[i];
}

static inline void st(void *p, int64_t i, double v, bool f64)
{
    if (f64)
        ((double *)p)[i] = v;
    else
        ((float *)p)[i] = (float)v;
}

static inline double sigmoid(double x) { return 1 / (1 + exp(-x)); }

/* ---------------------------------------------------------------- LSTM */

/* gi + gh, the gates' pre-activations, at k */
static inline double gate(const void *gi, const void *gh, int64_t k, bool f64)
{
    return ld(gi, k, f64) + ld(gh, k, f64);
}

/* gi, gh (N, 4H): the gates i, f, g, o before their activations are
 * gi + gh; c (N, H); out (2, N, H): h' = o tanh(c') then c' = f c + i g. */
dp_status cpu_lstm_gates(dp_tensor *out, dp_tensor *gi, dp_tensor *gh, dp_tensor *c)
{
    bool f64 = out->dtype == DP_FLOAT64;
    int64_t N = c->shape[0], H = c->shape[1], NH = N * H;
    const char *xi = tensor_ptr(gi), *hh = tensor_ptr(gh), *cp = tensor_ptr(c);
    char *o = tensor_ptr(out);
    for (int64_t n = 0; n < N; n++)
        for (int64_t j = 0; j < H; j++) {
            int64_t row = n * 4 * H + j, e = n * H + j;
            double i = sigmoid(gate(xi, hh, row, f64)), f = sigmoid(gate(xi, hh, row + H, f64));
            double g = tanh(gate(xi, hh, row + 2 * H, f64)), og = sigmoid(gate(xi, hh, row + 3 * H, f64));
            double c1 = f * ld(cp, e, f64) + i * g;
            st(o, e, og * tanh(c1), f64);
            st(o, NH + e, c1, f64);
        }
    return DP_OK;
}

/* dout (2, N, H): the gradients of h' and c'; c1 (N, H) the c' the forward
 * wrote. Writes dgates (N, 4H), the gradient of gi and of gh, and dc
 * (N, H), the gradient of c. */
dp_status cpu_lstm_gates_backward(dp_tensor *dgates, dp_tensor *dc, dp_tensor *dout, dp_tensor *gi, dp_tensor *gh,
                                  dp_tensor *c, dp_tensor *c1)
{
    bool f64 = dc->dtype == DP_FLOAT64;
    int64_t N = c->shape[0], H = c->shape[1], NH = N * H;
    const char *xi = tensor_ptr(gi), *hh = tensor_ptr(gh), *cp = tensor_ptr(c), *cn = tensor_ptr(c1);
    const char *d = tensor_ptr(dout);
    char *da = tensor_ptr(dgates), *dcp = tensor_ptr(dc);
    for (int64_t n = 0; n < N; n++)
        for (int64_t j = 0; j < H; j++) {
            int64_t row = n * 4 * H + j, e = n * H + j;
            double i = sigmoid(gate(xi, hh, row, f64)), f = sigmoid(gate(xi, hh, row + H, f64));
            double g = tanh(gate(xi, hh, row + 2 * H, f64)), og = sigmoid(gate(xi, hh, row + 3 * H, f64));
            double tc = tanh(ld(cn, e, f64)), dh = ld(d, e, f64);
            double dcn = ld(d, NH + e, f64) + dh * og * (1 - tc * tc);
            st(da, row, dcn * g * i * (1 - i), f64);
            st(da, row + H, dcn * ld(cp, e, f64) * f * (1 - f), f64);
            st(da, row + 2 * H, dcn * i * (1 - g * g), f64);
            st(da, row + 3 * H, dh * tc * og * (1 - og), f64);
            st(dcp, e, dcn * f, f64);
        }
    return DP_OK;
}

/* ---------------------------------------------------------------- GRU */

/* gi = x W_ih^T + b_ih and gh = h W_hh^T + b_hh (N, 3H) of r, z, n; h (N, H):
 * out (N, H) = (1 - z) n + z h, r = sigmoid(gi_r + gh_r),
 * z = sigmoid(gi_z + gh_z), n = tanh(gi_n + r gh_n). */
dp_status cpu_gru_gates(dp_tensor *out, dp_tensor *gi, dp_tensor *gh, dp_tensor *h)
{
    bool f64 = out->dtype == DP_FLOAT64;
    int64_t N = h->shape[0], H = h->shape[1];
    const char *xi = tensor_ptr(gi), *hh = tensor_ptr(gh), *hp = tensor_ptr(h);
    char *o = tensor_ptr(out);
    for (int64_t n = 0; n < N; n++)
        for (int64_t j = 0; j < H; j++) {
            int64_t row = n * 3 * H + j, e = n * H + j;
            double r = sigmoid(ld(xi, row, f64) + ld(hh, row, f64));
            double z = sigmoid(ld(xi, row + H, f64) + ld(hh, row + H, f64));
            double nn = tanh(ld(xi, row + 2 * H, f64) + r * ld(hh, row + 2 * H, f64));
            st(o, e, (1 - z) * nn + z * ld(hp, e, f64), f64);
        }
    return DP_OK;
}

/* dout (N, H): the gradient of h'. Writes dgi, dgh (N, 3H) and dh (N, H). */
dp_status cpu_gru_gates_backward(dp_tensor *dgi, dp_tensor *dgh, dp_tensor *dh, dp_tensor *dout, dp_tensor *gi,
                                 dp_tensor *gh, dp_tensor *h)
{
    bool f64 = dh->dtype == DP_FLOAT64;
    int64_t N = h->shape[0], H = h->shape[1];
    const char *xi = tensor_ptr(gi), *hh = tensor_ptr(gh), *hp = tensor_ptr(h), *d = tensor_ptr(dout);
    char *dxi = tensor_ptr(dgi), *dhh = tensor_ptr(dgh), *dhp = tensor_ptr(dh);
    for (int64_t n = 0; n < N; n++)
        for (int64_t j = 0; j < H; j++) {
            int64_t row = n * 3 * H + j, e = n * H + j;
            double r = sigmoid(ld(xi, row, f64) + ld(hh, row, f64));
            double z = sigmoid(ld(xi, row + H, f64) + ld(hh, row + H, f64));
            double hn = ld(hh, row + 2 * H, f64);
            double nn = tanh(ld(xi, row + 2 * H, f64) + r * hn);
            double dy = ld(d, e, f64);
            double dan = dy * (1 - z) * (1 - nn * nn);                    /* before n's tanh */
            double daz = dy * (ld(hp, e, f64) - nn) * z * (1 - z);        /* before z's sigmoid */
            double dar = dan * hn * r * (1 - r);                          /* before r's sigmoid */
            st(dxi, row, dar, f64);
            st(dhh, row, dar, f64);
            st(dxi, row + H, daz, f64);
            st(dhh, row + H, daz, f64);
            st(dxi, row + 2 * H, dan, f64);
            st(dhh, row + 2 * H, dan * r, f64);
            st(dhp, e, dy * z, f64);
        }
    return DP_OK;
}
