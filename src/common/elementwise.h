/*
 * elementwise.h — element functions that the CPU kernels
 * (src/cpu/elementwise.c) and the GPU kernels (cuda/elementwise.cu) share,
 * so that both compute them alike.
 */
#ifndef DP_COMMON_ELEMENTWISE_H
#define DP_COMMON_ELEMENTWISE_H

#include <stdint.h>

#include "common/host_device.h"

/* a ** b for integers, wrapping like PyTorch (computed unsigned, so that
 * the overflow is defined in C); a negative exponent gives 1 / a ** -b
 * truncated: 0 unless a is 1 or -1. */
DP_HD int64_t ipow(int64_t a, int64_t b)
{
    if (b < 0)
        return a == 1 ? 1 : a == -1 ? (b & 1 ? -1 : 1) : 0;
    uint64_t r = 1, x = (uint64_t)a;
    while (b) {
        if (b & 1) r *= x;
        x *= x;
        b >>= 1;
    }
    return (int64_t)r;
}

#endif /* DP_COMMON_ELEMENTWISE_H */
