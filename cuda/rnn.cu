/*
 * rnn.cu — the recurrent layers' pointwise step: one timestep's gates of
 * an LSTM or a GRU, forward and backward, one thread per (row, unit) and
 * one launch each. The products around them (x W_ih^T for the whole
 * sequence, h W_hh^T per step) are GEMMs; these kernels are what would
 * otherwise be a dozen elementwise launches per step. float32 computes in
 * float, float64 in double; the formulas are those of src/cpu/rnn.c.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <cuda_runtime.h>

#include "dpc_ops.h"
#include "common/dplua_codes.h"
#include "launch.cuh"

#define RNN_BLOCK 256

__device__ __forceinline__ float sigmoid_of(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ double sigmoid_of(double x) { return 1.0 / (1.0 + exp(-x)); }

/* gi + gh (N, 4H): i, f, g, o before their activations; c (N, H);
 * out (2, N, H): h' then c' */
template <typename T>
__global__ static void lstm_gates_kernel(int64_t N, int64_t H, const T *gi, const T *gh, const T *c, T *out)
{
    begin_after_previous_kernel();
    grid_stride_loop(N * H, [&](int64_t e) {
        int64_t n = e / H, row = n * 4 * H + e % H;
        T i = sigmoid_of(gi[row] + gh[row]), f = sigmoid_of(gi[row + H] + gh[row + H]);
        T g = tanh(gi[row + 2 * H] + gh[row + 2 * H]), o = sigmoid_of(gi[row + 3 * H] + gh[row + 3 * H]);
        T c1 = f * c[e] + i * g;
        out[e] = o * tanh(c1);
        out[N * H + e] = c1;
    });
}

/* dgates: the gradient of gi and of gh alike */
template <typename T>
__global__ static void lstm_gates_backward_kernel(int64_t N, int64_t H, const T *dout, const T *gi, const T *gh,
                                                  const T *c, const T *c1, T *dgates, T *dc)
{
    begin_after_previous_kernel();
    grid_stride_loop(N * H, [&](int64_t e) {
        int64_t n = e / H, row = n * 4 * H + e % H;
        T i = sigmoid_of(gi[row] + gh[row]), f = sigmoid_of(gi[row + H] + gh[row + H]);
        T g = tanh(gi[row + 2 * H] + gh[row + 2 * H]), o = sigmoid_of(gi[row + 3 * H] + gh[row + 3 * H]);
        T tc = tanh(c1[e]), dh = dout[e];
        T dcn = dout[N * H + e] + dh * o * (1 - tc * tc);
        dgates[row] = dcn * g * i * (1 - i);
        dgates[row + H] = dcn * c[e] * f * (1 - f);
        dgates[row + 2 * H] = dcn * i * (1 - g * g);
        dgates[row + 3 * H] = dh * tc * o * (1 - o);
        dc[e] = dcn * f;
    });
}

/* gi, gh (N, 3H) of r, z, n; h (N, H); out (N, H) = (1 - z) n + z h */
template <typename T>
__global__ static void gru_gates_kernel(int64_t N, int64_t H, const T *gi, const T *gh, const T *h, T *out)
{
    begin_after_previous_kernel();
    grid_stride_loop(N * H, [&](int64_t e) {
        int64_t n = e / H, row = n * 3 * H + e % H;
        T r = sigmoid_of(gi[row] + gh[row]);
        T z = sigmoid_of(gi[row + H] + gh[row + H]);
        T nn = tanh(gi[row + 2 * H] + r * gh[row + 2 * H]);
        out[e] = (1 - z) * nn + z * h[e];
    });
}

template <typename T>
__global__ static void gru_gates_backward_kernel(int64_t N, int64_t H, const T *dout, const T *gi, const T *gh,
                                                 const T *h, T *dgi, T *dgh, T *dh)
{
    begin_after_previous_kernel();
    grid_stride_loop(N * H, [&](int64_t e) {
        int64_t n = e / H, row = n * 3 * H + e % H;
        T r = sigmoid_of(gi[row] + gh[row]);
        T z = sigmoid_of(gi[row + H] + gh[row + H]);
        T hn = gh[row + 2 * H];
        T nn = tanh(gi[row + 2 * H] + r * hn);
        T dy = dout[e];
        T dan = dy * (1 - z) * (1 - nn * nn);   /* before n's tanh */
        T daz = dy * (h[e] - nn) * z * (1 - z);  /* before z's sigmoid */
        T dar = dan * hn * r * (1 - r);          /* before r's sigmoid */
        dgi[row] = dar;
        dgh[row] = dar;
        dgi[row + H] = daz;
        dgh[row + H] = daz;
        dgi[row + 2 * H] = dan;
        dgh[row + 2 * H] = dan * r;
        dh[e] = dy * z;
    });
}

/* fn(T()) for float32 and float64, DPC_UNSUPPORTED otherwise; 0 when
 * there is nothing to do */
template <class Fn> static int with_gate_type(int dtype, int64_t N, int64_t H, Fn fn)
{
    if (N < 0 || H < 0)
        return (int)cudaErrorInvalidValue;
    if (dtype != DP_FLOAT32 && dtype != DP_FLOAT64)
        return DPC_UNSUPPORTED;
    if (N * H == 0)
        return 0;
    return dtype == DP_FLOAT32 ? fn(float()) : fn(double());
}

static unsigned grid_for(int64_t n) { return grid_stride_blocks(n, RNN_BLOCK); }

extern "C" int dpc_lstm_gates(int dtype, int64_t N, int64_t H, const void *gi, const void *gh, const void *c,
                              void *out, void *stream)
{
    return with_gate_type(dtype, N, H, [&](auto zero) {
        using T = decltype(zero);
        return launch_kernel(lstm_gates_kernel<T>, grid_for(N * H), RNN_BLOCK, (cudaStream_t)stream, N, H,
                             (const T *)gi, (const T *)gh, (const T *)c, (T *)out);
    });
}

extern "C" int dpc_lstm_gates_backward(int dtype, int64_t N, int64_t H, const void *dout, const void *gi,
                                       const void *gh, const void *c, const void *c1, void *dgates, void *dc,
                                       void *stream)
{
    return with_gate_type(dtype, N, H, [&](auto zero) {
        using T = decltype(zero);
        return launch_kernel(lstm_gates_backward_kernel<T>, grid_for(N * H), RNN_BLOCK, (cudaStream_t)stream, N, H,
                             (const T *)dout, (const T *)gi, (const T *)gh, (const T *)c, (const T *)c1,
                             (T *)dgates, (T *)dc);
    });
}

extern "C" int dpc_gru_gates(int dtype, int64_t N, int64_t H, const void *gi, const void *gh, const void *h, void *out,
                             void *stream)
{
    return with_gate_type(dtype, N, H, [&](auto zero) {
        using T = decltype(zero);
        return launch_kernel(gru_gates_kernel<T>, grid_for(N * H), RNN_BLOCK, (cudaStream_t)stream, N, H,
                             (const T *)gi, (const T *)gh, (const T *)h, (T *)out);
    });
}

extern "C" int dpc_gru_gates_backward(int dtype, int64_t N, int64_t H, const void *dout, const void *gi,
                                      const void *gh, const void *h, void *dgi, void *dgh, void *dh, void *stream)
{
    return with_gate_type(dtype, N, H, [&](auto zero) {
        using T = decltype(zero);
        return launch_kernel(gru_gates_backward_kernel<T>, grid_for(N * H), RNN_BLOCK, (cudaStream_t)stream, N, H,
                             (const T *)dout, (const T *)gi, (const T *)gh, (const T *)h, (T *)dgi, (T *)dgh,
                             (T *)dh);
    });
}
