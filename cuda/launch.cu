/*
 * launch.cu — how a launch of ours reaches the GPU (dpc_launch, behind
 * launch.cuh's launch_kernel): through the driver's cuLaunchKernelEx where
 * the runtime hands it over, else the runtime's cudaLaunchKernelExC. The
 * only file besides launch.cuh that launches (tests/sh/test_cuda_sources.sh).
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <atomic>

#include <cuda.h>   /* the driver's types, for cuLaunchKernelEx (looked up, not linked) */
#include <cuda_runtime.h>

#include "launch.cuh"

/* The driver's cuLaunchKernelEx, from the runtime (no link to libcuda), or
 * NULL: then launches are the runtime's. Measured on the H200: an empty
 * kernel with PDL, 2.53-3.44 us of host a launch against
 * cudaLaunchKernelEx's 3.05-3.51 (session 17); the eager MLP step at its
 * GPU time, 53.8-54.0 us, in four rounds of four, against 53.9-59.0 with
 * the runtime's call (session 18). */
typedef CUresult (*driver_launch_fn)(const CUlaunchConfig *, CUfunction, void **, void **);
static driver_launch_fn driver_launch;
static pthread_once_t driver_launch_once = PTHREAD_ONCE_INIT;

static void driver_launch_load(void)
{
    const char *env = getenv("DPLUA_DRIVER_LAUNCH");
    void *fn = NULL;
    cudaDriverEntryPointQueryResult found;
    if (env && strcmp(env, "0") == 0)
        return;
    if (cudaGetDriverEntryPointByVersion("cuLaunchKernelEx", &fn, 12000, cudaEnableDefault, &found) == cudaSuccess &&
        found == cudaDriverEntryPointSuccess)
        driver_launch = (driver_launch_fn)fn;
    (void)cudaGetLastError();   /* a refusal is an answer, not an error for the next call to find */
}

/* Each kernel's context-free handle (CUkernel: the driver launches it in
 * the stream's context), asked of the runtime once: an open-addressed
 * table by the kernel's address, each slot written once under the mutex
 * (the handle before the key that publishes it) and read without it. A
 * handle the runtime would not give is kept as NULL: that kernel is the
 * runtime's to launch, as are all past a full table. */
#define KERNEL_SLOTS 1024
static std::atomic<const void *> kernel_keys[KERNEL_SLOTS];
static std::atomic<CUkernel> kernel_handles[KERNEL_SLOTS];
static pthread_mutex_t kernel_insert = PTHREAD_MUTEX_INITIALIZER;

static CUkernel kernel_handle(const void *kernel)
{
    unsigned slot = (unsigned)(((uintptr_t)kernel >> 4) * 2654435761u) % KERNEL_SLOTS;
    for (int probe = 0; probe < KERNEL_SLOTS; probe++, slot = (slot + 1) % KERNEL_SLOTS) {
        const void *key = kernel_keys[slot].load(std::memory_order_acquire);
        if (key == NULL) {
            pthread_mutex_lock(&kernel_insert);
            key = kernel_keys[slot].load(std::memory_order_relaxed);
            if (key == NULL) {
                cudaKernel_t handle = NULL;
                if (cudaGetKernel(&handle, kernel) != cudaSuccess) {
                    (void)cudaGetLastError();
                    handle = NULL;
                }
                kernel_handles[slot].store((CUkernel)handle, std::memory_order_relaxed);
                kernel_keys[slot].store(kernel, std::memory_order_release);
                pthread_mutex_unlock(&kernel_insert);
                return (CUkernel)handle;
            }
            pthread_mutex_unlock(&kernel_insert);
        }
        if (key == kernel)
            return kernel_handles[slot].load(std::memory_order_relaxed);
    }
    return NULL;
}

static int runtime_launch(const cudaLaunchConfig_t *config, const void *kernel, void **params)
{
    const int rc = (int)cudaLaunchKernelExC(config, kernel, params);
    if (rc)
        (void)cudaGetLastError();   /* returned here, not left for the next call that asks */
    return rc;
}

int dpc_launch(const cudaLaunchConfig_t *config, const void *kernel, void **params)
{
    pthread_once(&driver_launch_once, driver_launch_load);
    const CUkernel handle = driver_launch ? kernel_handle(kernel) : NULL;
    if (handle == NULL)
        return runtime_launch(config, kernel, params);
    static_assert(sizeof(CUlaunchAttribute) == sizeof(cudaLaunchAttribute) &&
                      sizeof(CUlaunchAttributeValue) == sizeof(cudaLaunchAttributeValue),
                  "the runtime's launch attributes are the driver's");
    CUlaunchAttribute attrs[8];
    const unsigned n = config->numAttrs < 8 ? config->numAttrs : 8;
    for (unsigned i = 0; i < n; i++) {
        attrs[i].id = (CUlaunchAttributeID)config->attrs[i].id;   /* the same numbers */
        memcpy(&attrs[i].value, &config->attrs[i].val, sizeof attrs[i].value);
    }
    CUlaunchConfig c;
    memset(&c, 0, sizeof c);
    c.gridDimX = config->gridDim.x;
    c.gridDimY = config->gridDim.y;
    c.gridDimZ = config->gridDim.z;
    c.blockDimX = config->blockDim.x;
    c.blockDimY = config->blockDim.y;
    c.blockDimZ = config->blockDim.z;
    c.sharedMemBytes = (unsigned)config->dynamicSmemBytes;
    c.hStream = (CUstream)config->stream;
    c.attrs = attrs;
    c.numAttrs = n;
    /* CUresult's numbers are cudaError_t's (CUDA_ERROR_ILLEGAL_ADDRESS is
     * cudaErrorIllegalAddress, 700). On a thread without a current context
     * (no runtime call yet: the runtime would make the device's primary
     * context current) the runtime's call launches instead. */
    const CUresult rc = driver_launch(&c, (CUfunction)handle, params, NULL);
    return rc == CUDA_ERROR_INVALID_CONTEXT ? runtime_launch(config, kernel, params) : (int)rc;
}

