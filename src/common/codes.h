/*
 * codes.h — the dtype and op codes of src/dplua.h, for the code that must
 * not include the public header: the CUDA kernels (cuda/), which take
 * dtypes and ops as these numbers.
 *
 * src/dplua.h is the source of truth: the enums below are copies of its
 * enums, line for line, and tests/sh/test_layers.sh fails when they differ.
 * A file that includes both includes dplua.h first (src/core/tensor.h
 * does) and gets the codes from there: the guard below keeps them defined
 * once.
 */
#ifndef DP_COMMON_CODES_H
#define DP_COMMON_CODES_H

#ifndef DPLUA_H

typedef enum {
    DP_FLOAT32 = 0,
    DP_FLOAT64,
    DP_INT64,
    DP_INT32,
    DP_UINT8,
    DP_BOOL,
    DP_BFLOAT16,
    DP_NUM_DTYPES
} dp_dtype;

typedef enum {
    DP_NEG = 0, DP_ABS, DP_EXP, DP_LOG, DP_SQRT, DP_RSQRT, DP_TANH,
    DP_SIGMOID, DP_RELU, DP_GELU, DP_SIN, DP_COS, DP_SIGN, DP_FLOOR,
    DP_CEIL, DP_ROUND, DP_RECIPROCAL, DP_LOG1P, DP_EXPM1, DP_LOGICAL_NOT,
    DP_SQUARE, DP_GELU_TANH,
    DP_NUM_UNOPS
} dp_unop;

typedef enum {
    DP_ADD = 0, DP_SUB, DP_MUL, DP_DIV, DP_POW, DP_MAXIMUM, DP_MINIMUM,
    DP_EQ, DP_NE, DP_LT, DP_LE, DP_GT, DP_GE, DP_REMAINDER, DP_ATAN2,
    DP_LOGICAL_AND, DP_LOGICAL_OR,
    DP_NUM_BINOPS
} dp_binop;

typedef enum {
    DP_SUM = 0, DP_MEAN, DP_PROD, DP_MAX, DP_MIN, DP_ARGMAX, DP_ARGMIN,
    DP_VAR, DP_STD, DP_ALL, DP_ANY,
    DP_NUM_REDOPS
} dp_redop;

#endif /* DPLUA_H */
#endif /* DP_COMMON_CODES_H */
