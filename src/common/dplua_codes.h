/*
 * dplua_codes.h — the dtype and op codes of dplua's C API, in their one
 * place. dplua.h includes this header (it is installed beside it); the
 * CUDA kernels (cuda/), which must not include the public header, take
 * dtypes and ops as these numbers and include it alone.
 *
 * Plain C without macros between the DP_CDEF markers: scripts/gen-cdef
 * copies that part into LuaJIT's ffi.cdef. Enums are only ever appended to.
 */
#ifndef DPLUA_CODES_H
#define DPLUA_CODES_H

/* DP_CDEF_BEGIN */
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
    DP_SQUARE, DP_GELU_TANH, DP_ERF,
    DP_NUM_UNOPS
} dp_unop;

typedef enum {
    DP_ADD = 0, DP_SUB, DP_MUL, DP_DIV, DP_POW, DP_MAXIMUM, DP_MINIMUM,
    DP_EQ, DP_NE, DP_LT, DP_LE, DP_GT, DP_GE, DP_REMAINDER, DP_ATAN2,
    DP_LOGICAL_AND, DP_LOGICAL_OR,
    DP_NUM_BINOPS
} dp_binop;

/* Reductions of dp_reduce, and of the process groups' collectives, which
 * take DP_SUM, DP_MEAN (PyTorch's AVG), DP_PROD, DP_MAX and DP_MIN. */
typedef enum {
    DP_SUM = 0, DP_MEAN, DP_PROD, DP_MAX, DP_MIN, DP_ARGMAX, DP_ARGMIN,
    DP_VAR, DP_STD, DP_ALL, DP_ANY,
    DP_NORM,   /* the 2-norm: the square root of the sum of squares */
    DP_NUM_REDOPS
} dp_redop;
/* DP_CDEF_END */

#endif /* DPLUA_CODES_H */
