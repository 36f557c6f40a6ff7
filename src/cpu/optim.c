/*
 * optim.c — fused optimizer updates: one loop over a flat parameter
 * buffer, following PyTorch 1.13's single-tensor formulas step by step so
 * that results agree to float rounding. float32 and float64; src/core
 * runs a bfloat16 step on float32 copies, except Adam's with a float32
 * master copy of the parameters, which runs here in one pass.
 */
#include "cpu/cpu.h"
#include "common/dtype_conv.h"

#include <math.h>

/* One loop per case, so that each is a plain vectorisable pass. */
#define SGD_LOOP(T)                                                                     \
    do {                                                                                \
        T *restrict P = (T *)tensor_ptr(p);                                             \
        const T *restrict G = (const T *)tensor_ptr(g);                                 \
        T *restrict B = buf ? (T *)tensor_ptr(buf) : NULL;                              \
        const T wd = (T)weight_decay, mom = (T)momentum, damp = (T)(1 - dampening);     \
        const T step = (T)lr;                                                           \
        if (!B) {                                                                       \
            for (int64_t i = 0; i < n; i++)                                             \
                P[i] = P[i] - step * (G[i] + wd * P[i]);                                \
        } else if (first_step) {                                                        \
            for (int64_t i = 0; i < n; i++) {                                           \
                T d = G[i] + wd * P[i];                                                 \
                B[i] = d;                                                               \
                P[i] = P[i] - step * (nesterov ? d + mom * d : d);                      \
            }                                                                           \
        } else {                                                                        \
            for (int64_t i = 0; i < n; i++) {                                           \
                T d = G[i] + wd * P[i];                                                 \
                T b = B[i] * mom + damp * d;                                            \
                B[i] = b;                                                               \
                P[i] = P[i] - step * (nesterov ? d + mom * b : b);                      \
            }                                                                           \
        }                                                                               \
    } while (0)

dp_status cpu_sgd_step(dp_tensor *p, dp_tensor *g, dp_tensor *buf, double lr, double momentum,
                       double dampening, int nesterov, double weight_decay, int first_step)
{
    int64_t n = dp_tensor_numel(p);
    if (p->dtype == DP_FLOAT32)
        SGD_LOOP(float);
    else
        SGD_LOOP(double);
    return DP_OK;
}

/* Element i's Adam update of the parameter value p (a T) from grad. */
#define ADAM_ELEMENT(T, p, grad, i)                                                     \
    do {                                                                                \
        if (decoupled) p = p * (T)(1 - lr * weight_decay);                              \
        else if (weight_decay != 0) grad = grad + (T)weight_decay * p;                  \
        M[i] = M[i] * (T)beta1 + (T)(1 - beta1) * grad;                                 \
        V[i] = V[i] * (T)beta2 + (T)(1 - beta2) * grad * grad;                          \
        T second = V[i];                                                                \
        if (VM) { if (VM[i] < V[i]) VM[i] = V[i]; second = VM[i]; }                     \
        T denom = (T)sqrt((double)second) / (T)bc2_sqrt + (T)eps;                       \
        p = p - (T)step_size * (M[i] / denom);                                          \
    } while (0)

#define ADAM_LOOP(T)                                                                    \
    do {                                                                                \
        T *P = (T *)tensor_ptr(p), *G = (T *)tensor_ptr(g);                             \
        T *M = (T *)tensor_ptr(m), *V = (T *)tensor_ptr(v);                             \
        T *VM = vmax ? (T *)tensor_ptr(vmax) : NULL;                                    \
        for (int64_t i = 0; i < n; i++) {                                               \
            T param = P[i], grad = G[i];                                                \
            ADAM_ELEMENT(T, param, grad, i);                                            \
            P[i] = param;                                                               \
        }                                                                               \
    } while (0)

dp_status cpu_adam_step(dp_tensor *p, dp_tensor *g, dp_tensor *m, dp_tensor *v, dp_tensor *vmax, double lr,
                        double beta1, double beta2, double eps, double weight_decay, int decoupled, int64_t step)
{
    int64_t n = dp_tensor_numel(p);
    double bc1 = 1 - pow(beta1, (double)step), bc2 = 1 - pow(beta2, (double)step);
    double step_size = lr / bc1, bc2_sqrt = sqrt(bc2);
    if (p->dtype == DP_FLOAT32)
        ADAM_LOOP(float);
    else
        ADAM_LOOP(double);
    return DP_OK;
}

/* The float32 step of the master copy w, read from and written back to
 * w, with float32 moments; p gets each new value rounded to bfloat16. The
 * gradient is bfloat16 (the parameters') or float32. */
#define ADAM_MASTER_LOOP(LOAD_GRAD)                                                     \
    for (int64_t i = 0; i < n; i++) {                                                   \
        float param = W[i], grad = LOAD_GRAD;                                           \
        ADAM_ELEMENT(float, param, grad, i);                                            \
        W[i] = param;                                                                   \
        P[i] = f32_to_bf16(param);                                                      \
    }

dp_status cpu_adam_step_master(dp_tensor *p, dp_tensor *w, dp_tensor *g, dp_tensor *m, dp_tensor *v,
                               dp_tensor *vmax, double lr, double beta1, double beta2, double eps,
                               double weight_decay, int decoupled, int64_t step)
{
    int64_t n = dp_tensor_numel(p);
    double bc1 = 1 - pow(beta1, (double)step), bc2 = 1 - pow(beta2, (double)step);
    double step_size = lr / bc1, bc2_sqrt = sqrt(bc2);
    uint16_t *P = (uint16_t *)tensor_ptr(p);
    float *W = (float *)tensor_ptr(w), *M = (float *)tensor_ptr(m), *V = (float *)tensor_ptr(v);
    float *VM = vmax ? (float *)tensor_ptr(vmax) : NULL;
    if (g->dtype == DP_FLOAT32) {
        const float *G = (const float *)tensor_ptr(g);
        ADAM_MASTER_LOOP(G[i]);
    } else {
        const uint16_t *G = (const uint16_t *)tensor_ptr(g);
        ADAM_MASTER_LOOP(bf16_to_f32(G[i]));
    }
    return DP_OK;
}
