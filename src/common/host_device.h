/*
 * host_device.h — DP_HD, the mark of a function that the CPU code (C) and
 * the CUDA kernels (nvcc) both compile from one definition: a host and
 * device function under nvcc, a static inline one in C.
 */
#ifndef DP_COMMON_HOST_DEVICE_H
#define DP_COMMON_HOST_DEVICE_H

#ifdef __CUDACC__
#define DP_HD __host__ __device__ static inline
#else
#define DP_HD static inline
#endif

#endif /* DP_COMMON_HOST_DEVICE_H */
