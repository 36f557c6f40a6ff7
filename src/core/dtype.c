/*
 * dtype.c — element types: names, sizes, bfloat16 rounding, generic
 * load/store through double, and PyTorch's type promotion.
 */
#include "core/tensor.h"
#include "common/dtype_conv.h"

#include <math.h>

static const char *const dtype_names[DP_NUM_DTYPES] = {
    "float32", "float64", "int64", "int32", "uint8", "bool", "bfloat16",
};
static const size_t dtype_sizes[DP_NUM_DTYPES] = { 4, 8, 8, 4, 1, 1, 2 };

const char *dp_dtype_name(dp_dtype dtype)
{
    return (unsigned)dtype < DP_NUM_DTYPES ? dtype_names[dtype] : "invalid";
}

size_t dp_dtype_size(dp_dtype dtype)
{
    return (unsigned)dtype < DP_NUM_DTYPES ? dtype_sizes[dtype] : 0;
}

int dp_dtype_is_floating(dp_dtype dtype)
{
    return dtype == DP_FLOAT32 || dtype == DP_FLOAT64 || dtype == DP_BFLOAT16;
}

/* Whether value converts to dtype without overflow (PyTorch's rule for a
 * fill: a float past the dtype's range, or NaN or an infinity into an
 * integer type, is an error; a bool takes anything). */
int dp_dtype_holds(dp_dtype dtype, double value)
{
    switch (dtype) {
    case DP_INT64: return value >= -0x1p63 && value < 0x1p63;
    case DP_INT32: return value > -0x1p31 - 1 && value < 0x1p31;
    case DP_UINT8: return value > -1 && value < 256;
    case DP_FLOAT32: return !isfinite(value) || fabs(value) <= 3.4028234663852886e38;
    case DP_BFLOAT16: return !isfinite(value) || fabs(value) <= 3.3895313892515355e38;
    default: return true;
    }
}

/* The conversions themselves are in common/dtype_conv.h, shared with the
 * CUDA kernels. */
float bf16_to_float(uint16_t v)
{
    return bf16_to_f32(v);
}

uint16_t float_to_bf16(float f)
{
    return f32_to_bf16(f);
}

double dtype_load(int dtype, const char *p)
{
    return dt_load(dtype, p);
}

void dtype_store(int dtype, char *p, double v)
{
    dt_store(dtype, p, v);
}

/* PyTorch's promotion between two tensors of the same category rank:
 * bool < integers < floating; within integers the wider wins (uint8 with a
 * signed type goes to the signed one, or int16 which we lack: int32);
 * within floats, float64 > float32 > bfloat16. */
static int category(int d)
{
    return d == DP_BOOL ? 0 : dp_dtype_is_floating(d) ? 2 : 1;
}

static int float_rank(int d)
{
    return d == DP_BFLOAT16 ? 0 : d == DP_FLOAT32 ? 1 : 2;
}

static int int_rank(int d)
{
    return d == DP_UINT8 ? 0 : d == DP_INT32 ? 2 : 3;
}

int dtype_promote(int a, int b)
{
    if (a == b) return a;
    int ca = category(a), cb = category(b);
    if (ca != cb) return ca > cb ? a : b;
    if (ca == 2) return float_rank(a) > float_rank(b) ? a : b;
    return int_rank(a) > int_rank(b) ? a : b;
}

/* Joins two results of different priority: the lower-priority one counts
 * only when it is of a higher category (bool < integer < floating). */
static int combine_categories(int higher, int lower)
{
    if (higher < 0) return lower;
    if (lower < 0) return higher;
    if (dp_dtype_is_floating(higher)) return higher;
    if (higher == DP_BOOL || dp_dtype_is_floating(lower)) return dtype_promote(higher, lower);
    return higher;
}

/* PyTorch's result_type for two operands, each ranked DTYPE_DIM (a tensor
 * with dims), DTYPE_ZERO_DIM (a 0-d tensor) or DTYPE_WRAPPED (a Lua number,
 * which counts as int64 or float32). */
int dtype_result(int da, int ka, int db, int kb)
{
    int r[3] = { -1, -1, -1 };
    r[ka] = da;
    r[kb] = r[kb] < 0 ? db : dtype_promote(r[kb], db);
    return combine_categories(r[0], combine_categories(r[1], r[2]));
}
