/*
 * dtype.c — element types: names, sizes, bfloat16 rounding, generic
 * load/store through double, and PyTorch's type promotion.
 */
#include "core/tensor.h"

#include <math.h>
#include <string.h>

static const char *const dtype_names[DP_NUM_DTYPES] = {
    "float32", "float64", "int64", "int32", "uint8", "bool", "bfloat16",
};
static const size_t dtype_sizes[DP_NUM_DTYPES] = { 4, 8, 8, 4, 1, 1, 2 };

const char *dp_dtype_name(int dtype)
{
    return dtype >= 0 && dtype < DP_NUM_DTYPES ? dtype_names[dtype] : "invalid";
}

size_t dp_dtype_size(int dtype)
{
    return dtype >= 0 && dtype < DP_NUM_DTYPES ? dtype_sizes[dtype] : 0;
}

int dp_dtype_is_floating(int dtype)
{
    return dtype == DP_FLOAT32 || dtype == DP_FLOAT64 || dtype == DP_BFLOAT16;
}

float bf16_to_float(uint16_t v)
{
    uint32_t bits = (uint32_t)v << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* Round to nearest even, as PyTorch does; NaN stays a quiet NaN. */
uint16_t float_to_bf16(float f)
{
    uint32_t bits;
    memcpy(&bits, &f, 4);
    if (isnan(f))
        return (uint16_t)((bits >> 16) | 0x40);
    bits += 0x7fff + ((bits >> 16) & 1);
    return (uint16_t)(bits >> 16);
}

double dtype_load(int dtype, const char *p)
{
    switch (dtype) {
    case DP_FLOAT32: return *(const float *)p;
    case DP_FLOAT64: return *(const double *)p;
    case DP_INT64: return (double)*(const int64_t *)p;
    case DP_INT32: return *(const int32_t *)p;
    case DP_UINT8: return *(const uint8_t *)p;
    case DP_BOOL: return *(const uint8_t *)p != 0;
    case DP_BFLOAT16: return bf16_to_float(*(const uint16_t *)p);
    }
    return 0;
}

/* Float to integer conversion truncates toward zero, as in C and PyTorch;
 * out-of-range values are clamped rather than left undefined. */
static int64_t to_int64(double v)
{
    if (isnan(v)) return 0;
    if (v >= 9.2233720368547758e18) return INT64_MAX;
    if (v <= -9.2233720368547758e18) return INT64_MIN;
    return (int64_t)v;
}

void dtype_store(int dtype, char *p, double v)
{
    switch (dtype) {
    case DP_FLOAT32: *(float *)p = (float)v; break;
    case DP_FLOAT64: *(double *)p = v; break;
    case DP_INT64: *(int64_t *)p = to_int64(v); break;
    case DP_INT32: *(int32_t *)p = (int32_t)to_int64(v); break;
    case DP_UINT8: *(uint8_t *)p = (uint8_t)to_int64(v); break;
    case DP_BOOL: *(uint8_t *)p = v != 0; break;
    case DP_BFLOAT16: *(uint16_t *)p = float_to_bf16((float)v); break;
    }
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
