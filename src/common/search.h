/*
 * search.h — the search of a multinomial draw, shared by the CPU
 * (src/cpu/sort.c) and the GPU (cuda/sort.cu) so that both take the same
 * category for the same uniform number.
 */
#ifndef DP_COMMON_SEARCH_H
#define DP_COMMON_SEARCH_H

#include <stdint.h>

#include "common/host_device.h"

/* The first i of row[0..n) (running sums, non-decreasing, row[n - 1] > 0)
 * with row[i] > x; when none is (x has reached the total by rounding),
 * the last i whose row[i] exceeds the sum before it. */
DP_HD int64_t cdf_search(const double *row, int64_t n, double x)
{
    int64_t lo = 0, hi = n;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (row[mid] > x)
            hi = mid;
        else
            lo = mid + 1;
    }
    if (lo < n)
        return lo;
    lo = n - 1;
    while (lo > 0 && row[lo] <= row[lo - 1])
        lo--;
    return lo;
}

#endif /* DP_COMMON_SEARCH_H */
