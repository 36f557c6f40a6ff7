/*
 * optim.c — fused optimizer updates: one loop over a flat parameter
 * buffer, following PyTorch 1.13's single-tensor formulas step by step so
 * that results agree to float rounding. float32 and float64; src/core
 * runs a bfloat16 step on float32 copies, except Adam's with a float32
 * master copy of the parameters, which runs here in one pass. SGD, Adam,
 * then Adadelta, RMSprop and Adagrad (common/optim_rule.h).
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

/* These loops (Adam's and the rules' below) are compiled for the baseline x86-64 (SSE2: four float
 * lanes) and for AVX (eight), chosen at load time; not for x86-64-v3,
 * whose FMA would fuse a * b + c into one rounding where PyTorch's step
 * and cuda/optim.cu's round twice. Their square roots vectorise because
 * the build passes -fno-math-errno. Adadelta over 1.2M float32 elements
 * takes 1.15 ms in the baseline's loop and 0.63 in AVX's (one thread). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__)
#define RULE_CLONES __attribute__((target_clones("avx", "default")))
#else
#define RULE_CLONES
#endif

/* Element i's Adam update of the parameter value p (a T) from grad; ROOT:
 * sqrtf or sqrt (a float's correctly rounded root is its double root
 * rounded, PyTorch's, and sqrtf vectorises). */
#define ADAM_ELEMENT(T, ROOT, p, grad, i)                                               \
    do {                                                                                \
        if (decoupled) p = p * (T)(1 - lr * weight_decay);                              \
        else if (decays) grad = grad + (T)weight_decay * p;                             \
        M[i] = M[i] * (T)beta1 + (T)(1 - beta1) * grad;                                 \
        V[i] = V[i] * (T)beta2 + (T)(1 - beta2) * grad * grad;                          \
        T second = V[i];                                                                \
        if (VM) { if (VM[i] < V[i]) VM[i] = V[i]; second = VM[i]; }                     \
        T denom = ROOT(second) / (T)bc2_sqrt + (T)eps;                                  \
        p = p - (T)step_size * (M[i] / denom);                                          \
    } while (0)

/* One Adam loop with its options as constants: adam_loop is inlined into
 * each call of adam_step_##T below with literal flags, so that every
 * combination is a loop without branches, which vectorises (AVX where the
 * machine has it, RULE_CLONES). */
#define ADAM_FNS(T, ROOT)                                                               \
    static inline __attribute__((always_inline)) void adam_loop_##T(                     \
        int64_t n, T *restrict P, const T *restrict G, T *restrict M, T *restrict V,    \
        T *restrict VM, double lr, double beta1, double beta2, double eps,              \
        double weight_decay, double step_size, double bc2_sqrt, const int decoupled,    \
        const int decays, const int amsgrad)                                            \
    {                                                                                   \
        if (!amsgrad)                                                                   \
            VM = NULL;                                                                  \
        for (int64_t i = 0; i < n; i++) {                                               \
            T param = P[i], grad = G[i];                                                \
            ADAM_ELEMENT(T, ROOT, param, grad, i);                                      \
            P[i] = param;                                                               \
        }                                                                               \
    }                                                                                   \
    RULE_CLONES static void adam_step_##T(int64_t n, T *restrict P, const T *restrict G, \
        T *restrict M, T *restrict V, T *restrict VM, double lr, double beta1,          \
        double beta2, double eps, double weight_decay, double step_size,                \
        double bc2_sqrt, int decoupled)                                                 \
    {                                                                                   \
        const int decays = !decoupled && weight_decay != 0;                             \
        if (decoupled && VM)                                                            \
            adam_loop_##T(n, P, G, M, V, VM, lr, beta1, beta2, eps, weight_decay,       \
                          step_size, bc2_sqrt, 1, 0, 1);                                \
        else if (decoupled)                                                             \
            adam_loop_##T(n, P, G, M, V, NULL, lr, beta1, beta2, eps, weight_decay,     \
                          step_size, bc2_sqrt, 1, 0, 0);                                \
        else if (decays && VM)                                                          \
            adam_loop_##T(n, P, G, M, V, VM, lr, beta1, beta2, eps, weight_decay,       \
                          step_size, bc2_sqrt, 0, 1, 1);                                \
        else if (decays)                                                                \
            adam_loop_##T(n, P, G, M, V, NULL, lr, beta1, beta2, eps, weight_decay,     \
                          step_size, bc2_sqrt, 0, 1, 0);                                \
        else if (VM)                                                                    \
            adam_loop_##T(n, P, G, M, V, VM, lr, beta1, beta2, eps, weight_decay,       \
                          step_size, bc2_sqrt, 0, 0, 1);                                \
        else                                                                            \
            adam_loop_##T(n, P, G, M, V, NULL, lr, beta1, beta2, eps, weight_decay,     \
                          step_size, bc2_sqrt, 0, 0, 0);                                \
    }
ADAM_FNS(float, sqrtf)
ADAM_FNS(double, sqrt)

dp_status cpu_adam_step(dp_tensor *p, dp_tensor *g, dp_tensor *m, dp_tensor *v, dp_tensor *vmax, double lr,
                        double beta1, double beta2, double eps, double weight_decay, int decoupled, int64_t step)
{
    int64_t n = dp_tensor_numel(p);
    double bc1 = 1 - pow(beta1, (double)step), bc2 = 1 - pow(beta2, (double)step);
    double step_size = lr / bc1, bc2_sqrt = sqrt(bc2);
    if (p->dtype == DP_FLOAT32)
        adam_step_float(n, (float *)tensor_ptr(p), (const float *)tensor_ptr(g), (float *)tensor_ptr(m),
                        (float *)tensor_ptr(v), vmax ? (float *)tensor_ptr(vmax) : NULL, lr, beta1, beta2, eps,
                        weight_decay, step_size, bc2_sqrt, decoupled);
    else
        adam_step_double(n, (double *)tensor_ptr(p), (const double *)tensor_ptr(g), (double *)tensor_ptr(m),
                         (double *)tensor_ptr(v), vmax ? (double *)tensor_ptr(vmax) : NULL, lr, beta1, beta2, eps,
                         weight_decay, step_size, bc2_sqrt, decoupled);
    return DP_OK;
}

/* The float32 step of the master copy w, read from and written back to
 * w, with float32 moments; p gets each new value rounded to bfloat16. The
 * gradient is bfloat16 (the parameters') or float32. */
#define ADAM_MASTER_LOOP(LOAD_GRAD)                                                     \
    for (int64_t i = 0; i < n; i++) {                                                   \
        float param = W[i], grad = LOAD_GRAD;                                           \
        ADAM_ELEMENT(float, sqrtf, param, grad, i);                                     \
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
    const int decays = weight_decay != 0;
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

/* ---------------------------------------------------------------- Adadelta, RMSprop, Adagrad */


/* A rule's loop over n elements of type T, state S0..S2 as in
 * common/optim_rule.h */
#define RULE_FN(name, T)                                                                \
    RULE_CLONES static void name(const optim_rule *r, int64_t n, T *restrict P, const T *restrict G, \
                                 T *restrict S0, T *restrict S1, T *restrict S2)

/* Each element in the order of operations of PyTorch's single-tensor
 * step (torch/optim/adadelta.py, rmsprop.py, adagrad.py), each constant
 * rounded to T as PyTorch rounds a Python float: add_(t, alpha=a) adds
 * a * t, addcmul_(t1, t2, value=v) adds (v * t1) * t2 and addcdiv_(t1,
 * t2, value=v) adds (v * t1) / t2. */
#define ADADELTA_LOOP(T, ROOT)                                                          \
    const T lr = (T)r->lr, rho = (T)r->decay, rest = (T)(1 - r->decay), eps = (T)r->eps; \
    const T wd = (T)r->weight_decay;                                                    \
    const int decays = r->weight_decay != 0;                                            \
    (void)S2;                                                                           \
    for (int64_t i = 0; i < n; i++) {                                                   \
        T g = G[i];                                                                     \
        if (decays) g = g + wd * P[i];                                                  \
        T square_avg = S0[i] * rho + rest * g * g;                                      \
        T delta = ROOT(S1[i] + eps) / ROOT(square_avg + eps) * g;                       \
        S0[i] = square_avg;                                                             \
        S1[i] = S1[i] * rho + rest * delta * delta;                                     \
        P[i] = P[i] - lr * delta;                                                       \
    }

#define RMSPROP_LOOP(T, ROOT)                                                           \
    const T lr = (T)r->lr, neg_lr = (T)-r->lr, alpha = (T)r->decay, rest = (T)(1 - r->decay); \
    const T eps = (T)r->eps, wd = (T)r->weight_decay, mom = (T)r->momentum;             \
    const int decays = r->weight_decay != 0, centered = r->centered, moves = r->momentum > 0; \
    for (int64_t i = 0; i < n; i++) {                                                   \
        T g = G[i];                                                                     \
        if (decays) g = g + wd * P[i];                                                  \
        T square_avg = S0[i] * alpha + rest * g * g, avg;                               \
        S0[i] = square_avg;                                                             \
        if (centered) {                                                                 \
            T grad_avg = S1[i] * alpha + rest * g;                                      \
            S1[i] = grad_avg;                                                           \
            avg = ROOT(square_avg - grad_avg * grad_avg);                               \
        } else {                                                                        \
            avg = ROOT(square_avg);                                                     \
        }                                                                               \
        avg = avg + eps;                                                                \
        if (moves) {                                                                    \
            T buf = S2[i] * mom + g / avg;                                              \
            S2[i] = buf;                                                                \
            P[i] = P[i] - lr * buf;                                                     \
        } else {                                                                        \
            P[i] = P[i] + neg_lr * g / avg;                                             \
        }                                                                               \
    }

#define ADAGRAD_LOOP(T, ROOT)                                                           \
    const T neg_lr = (T)-r->lr, eps = (T)r->eps, wd = (T)r->weight_decay;               \
    const int decays = r->weight_decay != 0;                                            \
    (void)S1, (void)S2;                                                                 \
    for (int64_t i = 0; i < n; i++) {                                                   \
        T g = G[i];                                                                     \
        if (decays) g = g + wd * P[i];                                                  \
        T sum = S0[i] + g * g;                                                          \
        S0[i] = sum;                                                                    \
        P[i] = P[i] + neg_lr * g / (ROOT(sum) + eps);                                   \
    }

RULE_FN(adadelta_f32, float) { ADADELTA_LOOP(float, sqrtf) }
RULE_FN(adadelta_f64, double) { ADADELTA_LOOP(double, sqrt) }
RULE_FN(rmsprop_f32, float) { RMSPROP_LOOP(float, sqrtf) }
RULE_FN(rmsprop_f64, double) { RMSPROP_LOOP(double, sqrt) }
RULE_FN(adagrad_f32, float) { ADAGRAD_LOOP(float, sqrtf) }
RULE_FN(adagrad_f64, double) { ADAGRAD_LOOP(double, sqrt) }

dp_status cpu_rule_step(const optim_rule *r, dp_tensor *p, dp_tensor *g, dp_tensor *const state[3])
{
    int64_t n = dp_tensor_numel(p);
    void *P = tensor_ptr(p), *G = tensor_ptr(g), *S[3];
    for (int k = 0; k < 3; k++)
        S[k] = state[k] ? tensor_ptr(state[k]) : NULL;
#define RULE_CALL(name)                                                                 \
    do {                                                                                \
        if (p->dtype == DP_FLOAT32)                                                     \
            name##_f32(r, n, P, G, S[0], S[1], S[2]);                                   \
        else                                                                            \
            name##_f64(r, n, P, G, S[0], S[1], S[2]);                                   \
    } while (0)
    switch (r->kind) {
    case OPTIM_ADADELTA: RULE_CALL(adadelta); break;
    case OPTIM_RMSPROP: RULE_CALL(rmsprop); break;
    case OPTIM_ADAGRAD: RULE_CALL(adagrad); break;
    }
#undef RULE_CALL
    return DP_OK;
}
