/*
 * element.cuh — one stored element as the type its arithmetic runs in,
 * and back: float32 and float64 as they are, bfloat16 (uint16_t bits)
 * through float with dplua's rounding (common/dtype_conv.h). For the
 * kernels that take a pointer of the element's own type.
 */
#ifndef DP_CUDA_ELEMENT_CUH
#define DP_CUDA_ELEMENT_CUH

#include <stdint.h>

#include "common/dtype_conv.h"

__device__ __forceinline__ float ld_elem(const float *p) { return *p; }
__device__ __forceinline__ double ld_elem(const double *p) { return *p; }
__device__ __forceinline__ float ld_elem(const uint16_t *p) { return bf16_to_f32(*p); }
__device__ __forceinline__ void st_elem(float *p, float v) { *p = v; }
__device__ __forceinline__ void st_elem(double *p, double v) { *p = v; }
__device__ __forceinline__ void st_elem(uint16_t *p, float v) { *p = f32_to_bf16(v); }

#endif
