/*
 * kernel_error.cuh — how a kernel leaves an error for the host (see
 * dpc_kernel_error in dpc_ops.h). The block is mapped host memory, so
 * plain stores reach the host; two threads failing at once may both
 * write, and then the host sees one of their bad values, each a real one.
 */
#ifndef DPC_KERNEL_ERROR_CUH
#define DPC_KERNEL_ERROR_CUH

#include "dpc_ops.h"

__device__ static inline void kernel_error(dpc_kernel_error *e, int code, long long value, long long limit)
{
    if (e == NULL || e->code != DPC_KERR_NONE)
        return;
    e->value = value;
    e->limit = limit;
    __threadfence_system();   /* the values before the code that announces them */
    e->code = code;
}

#endif /* DPC_KERNEL_ERROR_CUH */
