/*
 * device.cu — CUDA runtime queries and the first kernel, behind dp_cuda.h.
 *
 * Everything here returns a status instead of throwing or exiting: a machine
 * without a GPU (CI) must be able to ask "how many devices?" and print the
 * answer. cuBLASLt and NCCL are optional parts of the build, so their calls
 * sit behind DP_HAVE_CUBLASLT and DP_HAVE_NCCL from config.h. cuBLASLt is
 * dlopen()ed on first use rather than linked: see dp_cuda.h.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <dlfcn.h>
#include <stdlib.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include <atomic>

#include <cuda_runtime.h>
#ifdef DP_HAVE_CUBLASLT
#include <cublasLt.h>
#endif
#ifdef DP_HAVE_NCCL
#include <nccl.h>
#endif

#include "dp_cuda.h"
#include "launch.cuh"


/* ------------------------------------------------------------------------ */
/* versions and devices                                                      */
/* ------------------------------------------------------------------------ */

extern "C" int dpc_runtime_version(int *version)
{
    *version = 0;
    return (int)cudaRuntimeGetVersion(version);
}

extern "C" int dpc_driver_version(int *version)
{
    *version = 0;
    return (int)cudaDriverGetVersion(version);
}

extern "C" int dpc_device_count(int *count)
{
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
        /* Clear the error so that it is not reported again by the next,
         * unrelated cudaGetLastError(). */
        (void)cudaGetLastError();
        n = 0;
    }
    *count = n;
    return (int)err;
}

extern "C" int dpc_device_info(int device, struct dpc_device_info *info)
{
    cudaDeviceProp prop;
    memset(info, 0, sizeof *info);
    cudaError_t err = cudaGetDeviceProperties(&prop, device);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        return (int)err;
    }
    snprintf(info->name, sizeof info->name, "%s", prop.name);
    info->total_memory = prop.totalGlobalMem;
    info->major = prop.major;
    info->minor = prop.minor;
    info->multiprocessors = prop.multiProcessorCount;
    return 0;
}

extern "C" const char *dpc_error_string(int status)
{
    return cudaGetErrorString((cudaError_t)status);
}

/* ------------------------------------------------------------------------ */
/* cuBLASLt, loaded on first use (see dp_cuda.h for why)                     */
/* ------------------------------------------------------------------------ */

#ifdef DP_HAVE_CUBLASLT
#define DPC_STR_(x) #x
#define DPC_STR(x) DPC_STR_(x)
/* The major version the headers describe, e.g. libcublasLt.so.13. */
#define DPC_CUBLASLT_SONAME "libcublasLt.so." DPC_STR(CUBLAS_VER_MAJOR)

static pthread_once_t cublaslt_once = PTHREAD_ONCE_INIT;
static void *cublaslt_lib;
static char cublaslt_why[512];

static void cublaslt_open(void)
{
    cublaslt_lib = dlopen(DPC_CUBLASLT_SONAME, RTLD_NOW | RTLD_LOCAL);
    if (cublaslt_lib == NULL) {
        const char *err = dlerror();
        snprintf(cublaslt_why, sizeof cublaslt_why, "%s", err ? err : "cannot load " DPC_CUBLASLT_SONAME);
    }
}
#endif

extern "C" void *dpc_cublaslt_symbol(const char *name, const char **why)
{
#ifdef DP_HAVE_CUBLASLT
    void *sym;
    if (pthread_once(&cublaslt_once, cublaslt_open) != 0) {
        if (why) *why = "cannot load cuBLASLt: pthread_once failed";
        return NULL;
    }
    if (cublaslt_lib == NULL) {
        if (why) *why = cublaslt_why;
        return NULL;
    }
    sym = dlsym(cublaslt_lib, name);
    if (sym == NULL && why)
        *why = "a symbol is missing from " DPC_CUBLASLT_SONAME;
    return sym;
#else
    (void)name;
    if (why) *why = "not built (configure found no cuBLASLt)";
    return NULL;
#endif
}

extern "C" size_t dpc_cublaslt_version(const char **why)
{
#ifdef DP_HAVE_CUBLASLT
    typedef decltype(&cublasLtGetVersion) version_fn;
    version_fn fn = (version_fn)dpc_cublaslt_symbol("cublasLtGetVersion", why);
    return fn ? fn() : 0;
#else
    (void)dpc_cublaslt_symbol("cublasLtGetVersion", why);  /* says why not */
    return 0;
#endif
}

extern "C" int dpc_nccl_version(void)
{
#ifdef DP_HAVE_NCCL
    int v = 0;
    if (ncclGetVersion(&v) != ncclSuccess)
        return 0;
    return v;
#else
    return 0;
#endif
}

/* ------------------------------------------------------------------------ */
/* kernels                                                                   */
/* ------------------------------------------------------------------------ */

/* dst is (n,) */
__global__ static void fill_f32_kernel(float *dst, float value, int64_t n)
{
    begin_after_previous_kernel();
    grid_stride_loop(n, [&](int64_t i) { dst[i] = value; });
}

/* cudaGetDevice's numbers this file remembers facts for */
#define DPC_MAX_DEVICES 64

int dpc_device_can(void)
{
    static std::atomic<int> known[DPC_MAX_DEVICES];   /* 0: not asked yet, else the answer | 1 << 8 */
    int device;
    if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= DPC_MAX_DEVICES)
        return 0;
    int v = known[device].load(std::memory_order_relaxed);
    if (v == 0) {
        int clusters = 0, major = 0;
        cudaFuncAttributes attr;
        /* Every file of cuda/ is built with the same targets: one kernel
         * speaks for all. The code the device runs must have been compiled
         * for sm_90 from source that saw __CUDA_ARCH__ >= 900 (ptxVersion):
         * older PTX compiled for this device at load time has a binary of
         * its arch but no griddepcontrol in it. */
        bool sm90 = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
                    major >= 9 && cudaFuncGetAttributes(&attr, fill_f32_kernel) == cudaSuccess &&
                    attr.binaryVersion >= 90 && attr.ptxVersion >= 90;
        if (sm90 && cudaDeviceGetAttribute(&clusters, cudaDevAttrClusterLaunch, device) == cudaSuccess && clusters)
            v |= DPC_CAN_CLUSTER;
        if (sm90)
            v |= DPC_CAN_PDL;
        cudaGetLastError();   /* a refusal above is an answer, not an error for the next call to find */
        known[device].store(v | 1 << 8, std::memory_order_relaxed);
    }
    return v & 0xff;
}

extern "C" int dpc_fill_f32(float *dst, float value, int64_t n, void *stream)
{
    const int block = 256;
    if (n < 0 || (n > 0 && dst == NULL))
        return (int)cudaErrorInvalidValue;
    if (n == 0)
        return 0;
    return launch_kernel(fill_f32_kernel, grid_stride_blocks(n, block), block, (cudaStream_t)stream, dst, value, n);
}
