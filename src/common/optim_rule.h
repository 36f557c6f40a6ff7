/*
 * optim_rule.h — the fused step of Adadelta, RMSprop or Adagrad as
 * src/core/optim.c hands it to the CPU loops (src/cpu/optim.c) and to the
 * CUDA kernels (cuda/optim.cu): which update rule, and its options for
 * this step. The three differ only in the element's update; the buffers
 * (parameters, gradients and up to three state buffers, one dtype, flat),
 * the bfloat16 handling and the launch are the same, so they share one
 * path below their C entries (dp_adadelta_step, ...).
 *
 * The state buffers, state[0..2] (NULL where the options need none):
 *   Adadelta  square_avg, acc_delta
 *   RMSprop   square_avg, grad_avg (centered), momentum_buffer (momentum > 0)
 *   Adagrad   sum
 */
#ifndef DP_COMMON_OPTIM_RULE_H
#define DP_COMMON_OPTIM_RULE_H

typedef enum { OPTIM_ADADELTA, OPTIM_RMSPROP, OPTIM_ADAGRAD } optim_rule_kind;

typedef struct {
    optim_rule_kind kind;
    const char *fn;       /* the C entry's name, for messages ("adadelta_step") */
    double lr;            /* Adagrad: this step's, lr / (1 + (step - 1) lr_decay) */
    double eps, weight_decay;
    double decay;         /* Adadelta's rho, RMSprop's alpha */
    double momentum;      /* RMSprop: > 0 with a momentum buffer */
    int centered;         /* RMSprop: with a grad_avg buffer */
} optim_rule;

#endif /* DP_COMMON_OPTIM_RULE_H */
