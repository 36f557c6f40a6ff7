/*
 * cuda_calls.c: an LD_PRELOAD probe that counts the CUDA runtime calls a
 * program makes, printed to stderr at exit. scripts/bench/gpu_calls runs a
 * training step under it to see which calls an eager step's host time
 * goes to. Built by scripts/device-build (gcc -shared -fPIC, CUDA's
 * headers); not part of dplua.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#include <cuda_runtime_api.h>

#define CALLS(X)                                                                                       \
    X(cudaLaunchKernel, (const void *f, dim3 g, dim3 b, void **a, size_t s, cudaStream_t st), (f, g, b, a, s, st)) \
    X(cudaLaunchKernelExC, (const cudaLaunchConfig_t *c, const void *f, void **a), (c, f, a))          \
    X(cudaMallocAsync, (void **p, size_t n, cudaStream_t s), (p, n, s))                               \
    X(cudaFreeAsync, (void *p, cudaStream_t s), (p, s))                                               \
    X(cudaMemcpyAsync, (void *d, const void *s, size_t n, enum cudaMemcpyKind k, cudaStream_t st), (d, s, n, k, st)) \
    X(cudaMemsetAsync, (void *d, int v, size_t n, cudaStream_t s), (d, v, n, s))                      \
    X(cudaEventRecord, (cudaEvent_t e, cudaStream_t s), (e, s))                                       \
    X(cudaEventQuery, (cudaEvent_t e), (e))                                                           \
    X(cudaStreamWaitEvent, (cudaStream_t s, cudaEvent_t e, unsigned f), (s, e, f))                    \
    X(cudaStreamQuery, (cudaStream_t s), (s))                                                         \
    X(cudaStreamIsCapturing, (cudaStream_t s, enum cudaStreamCaptureStatus *c), (s, c))               \
    X(cudaGetDevice, (int *d), (d))                                                                   \
    X(cudaSetDevice, (int d), (d))                                                                    \
    X(cudaGetLastError, (void), ())                                                                   \
    X(cudaPeekAtLastError, (void), ())                                                                \
    X(cudaPointerGetAttributes, (struct cudaPointerAttributes *a, const void *p), (a, p))             \
    X(cudaFuncGetAttributes, (struct cudaFuncAttributes *a, const void *f), (a, f))                   \
    X(cudaDeviceGetAttribute, (int *v, enum cudaDeviceAttr a, int d), (v, a, d))                      \
    X(cudaStreamSynchronize, (cudaStream_t s), (s))                                                   \
    X(cudaDeviceSynchronize, (void), ())

enum {
#define ID(name, params, args) ID_##name,
    CALLS(ID)
#undef ID
    N_CALLS
};
static const char *names[N_CALLS] = {
#define NAME(name, params, args) #name,
    CALLS(NAME)
#undef NAME
};
static unsigned long counts[N_CALLS];

#define WRAP(name, params, args)                                              \
    cudaError_t name params                                                   \
    {                                                                         \
        static cudaError_t(*real) params;                                     \
        if (!real)                                                            \
            *(void **)&real = dlsym(RTLD_NEXT, #name);                        \
        __atomic_fetch_add(&counts[ID_##name], 1, __ATOMIC_RELAXED);          \
        return real args;                                                     \
    }
CALLS(WRAP)
#undef WRAP

__attribute__((destructor)) static void report(void)
{
    for (int i = 0; i < N_CALLS; i++)
        if (counts[i])
            fprintf(stderr, "cuda_calls %s %lu\n", names[i], counts[i]);
}
