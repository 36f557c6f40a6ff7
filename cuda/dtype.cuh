/*
 * dtype.cuh — element types on the device: the conversions of
 * src/core/dtype.c (bfloat16 round-to-nearest-even with the CPU's NaN bits,
 * float to integer truncating with NaN -> 0 and clamping), shared by the
 * kernels of cuda/ so that every one converts exactly as the CPU does.
 */
#ifndef DP_CUDA_DTYPE_CUH
#define DP_CUDA_DTYPE_CUH

#include "dplua.h"

#include <stdint.h>
#include <string.h>

__host__ __device__ static inline uint32_t f32_bits(float f)
{
#ifdef __CUDA_ARCH__
    return __float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
#endif
}

__host__ __device__ static inline float bits_f32(uint32_t u)
{
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, 4);
    return f;
#endif
}

__host__ __device__ static inline float bf16_to_f32(uint16_t v)
{
    return bits_f32((uint32_t)v << 16);
}

/* Round to nearest even; NaN stays a quiet NaN with the CPU's bits (not
 * __float2bfloat16_rn, whose NaN is canonical). */
__host__ __device__ static inline uint16_t f32_to_bf16(float f)
{
    uint32_t bits = f32_bits(f);
    if (f != f)
        return (uint16_t)((bits >> 16) | 0x40);
    bits += 0x7fff + ((bits >> 16) & 1);
    return (uint16_t)(bits >> 16);
}

/* Float to integer truncates toward zero; NaN gives 0, out of range clamps. */
__host__ __device__ static inline int64_t to_int64(double v)
{
    if (v != v) return 0;
    if (v >= 9.2233720368547758e18) return INT64_MAX;
    if (v <= -9.2233720368547758e18) return INT64_MIN;
    return (int64_t)v;
}

__host__ __device__ static inline double dt_load(int dtype, const void *p)
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

__host__ __device__ static inline void dt_store(int dtype, void *p, double v)
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

static inline size_t dt_size(int dtype)
{
    static const size_t sizes[DP_NUM_DTYPES] = { 4, 8, 8, 4, 1, 1, 2 };
    return dtype >= 0 && dtype < DP_NUM_DTYPES ? sizes[dtype] : 0;
}

/* Integer load for exact sums and products (reduce.c's ILD_*). */
__host__ __device__ static inline int64_t dt_iload(int dtype, const void *p)
{
    switch (dtype) {
    case DP_INT64: return *(const int64_t *)p;
    case DP_INT32: return *(const int32_t *)p;
    case DP_UINT8: return *(const uint8_t *)p;
    case DP_BOOL: return *(const uint8_t *)p != 0;
    }
    return 0;
}

#endif
