/*
 * dtype_conv.h — element conversions shared by the CPU (src/core/dtype.c)
 * and the GPU kernels (cuda/), so that both convert exactly alike:
 * bfloat16 round-to-nearest-even with PyTorch's NaN bits, float to integer
 * truncating toward zero with NaN -> 0 and out-of-range values clamped,
 * and the load/store of any dtype through a double. C and CUDA alike
 * (host and device functions under nvcc).
 */
#ifndef DP_COMMON_DTYPE_CONV_H
#define DP_COMMON_DTYPE_CONV_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "common/dplua_codes.h"
#include "common/host_device.h"

/* A bfloat16 is the high half of a float32's bits. memcpy moves the bits
 * on both sides (nvcc makes it a register move, as __uint_as_float). */
DP_HD float bf16_to_f32(uint16_t v)
{
    uint32_t bits = (uint32_t)v << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* Round to nearest even; NaN stays a quiet NaN with the CPU's bits (not
 * __float2bfloat16_rn, whose NaN is canonical). */
DP_HD uint16_t f32_to_bf16(float f)
{
    uint32_t bits;
    memcpy(&bits, &f, 4);
    if (f != f)
        return (uint16_t)((bits >> 16) | 0x40);
    bits += 0x7fff + ((bits >> 16) & 1);
    return (uint16_t)(bits >> 16);
}

/* Float to integer truncates toward zero; NaN gives 0, out of range clamps. */
DP_HD int64_t to_int64(double v)
{
    if (v != v) return 0;
    if (v >= 9.2233720368547758e18) return INT64_MAX;
    if (v <= -9.2233720368547758e18) return INT64_MIN;
    return (int64_t)v;
}

DP_HD double dt_load(int dtype, const void *p)
{
    switch (dtype) {
    case DP_FLOAT32: return *(const float *)p;
    case DP_FLOAT64: return *(const double *)p;
    case DP_INT64: return (double)*(const int64_t *)p;
    case DP_INT32: return *(const int32_t *)p;
    case DP_UINT8: return *(const uint8_t *)p;
    case DP_BOOL: return *(const uint8_t *)p != 0;
    case DP_BFLOAT16: return bf16_to_f32(*(const uint16_t *)p);
    }
    return 0;
}

DP_HD void dt_store(int dtype, void *p, double v)
{
    switch (dtype) {
    case DP_FLOAT32: *(float *)p = (float)v; break;
    case DP_FLOAT64: *(double *)p = v; break;
    case DP_INT64: *(int64_t *)p = to_int64(v); break;
    case DP_INT32: *(int32_t *)p = (int32_t)to_int64(v); break;
    case DP_UINT8: *(uint8_t *)p = (uint8_t)to_int64(v); break;
    case DP_BOOL: *(uint8_t *)p = v != 0; break;
    case DP_BFLOAT16: *(uint16_t *)p = f32_to_bf16((float)v); break;
    }
}

DP_HD size_t dt_size(int dtype)
{
    switch (dtype) {
    case DP_FLOAT32: case DP_INT32: return 4;
    case DP_FLOAT64: case DP_INT64: return 8;
    case DP_UINT8: case DP_BOOL: return 1;
    case DP_BFLOAT16: return 2;
    }
    return 0;
}

/* Integer load for exact sums and products (reduce.c's ILD_*). */
DP_HD int64_t dt_iload(int dtype, const void *p)
{
    switch (dtype) {
    case DP_INT64: return *(const int64_t *)p;
    case DP_INT32: return *(const int32_t *)p;
    case DP_UINT8: return *(const uint8_t *)p;
    case DP_BOOL: return *(const uint8_t *)p != 0;
    }
    return 0;
}

#endif /* DP_COMMON_DTYPE_CONV_H */
