/*
 * env.c — the libraries and devices of this build as facts (`dplua env`
 * prints them), the count of GPUs with the reason when there are none
 * (the launcher's --nproc_per_node=gpu), and the CPU's number of threads.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include "dplua_cuda.h"
#include "dplua_internal.h"
#include "core/tensor.h"
#include "cpu/cpu.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#ifdef DP_HAVE_CUDA
#include "dp_cuda.h"
#endif

/* One fact, its value formatted. */
static void fact(dp_fact_fn fn, void *ctx, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void fact(dp_fact_fn fn, void *ctx, const char *key, const char *fmt, ...)
{
    char value[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(value, sizeof value, fmt, ap);
    va_end(ap);
    fn(key, value, ctx);
}

#ifdef DP_HAVE_CUDA
/* 13000 -> "13.0" (CUDA's major*1000 + minor*10). */
static void cuda_version_fact(dp_fact_fn fn, void *ctx, const char *key, int status, int v)
{
    if (status != 0)
        fact(fn, ctx, key, "unknown (%s)", dpc_error_string(status));
    else if (v == 0)
        fact(fn, ctx, key, "none (no NVIDIA driver found)");
    else
        fact(fn, ctx, key, "%d.%d", v / 1000, v % 1000 / 10);
}

/* 22809 -> "2.28.9" (major*10000 + minor*100 + patch), as NCCL and
 * cuBLASLt both count. */
static void triple_version_fact(dp_fact_fn fn, void *ctx, const char *key, long v, const char *why)
{
    if (v <= 0)
        fact(fn, ctx, key, "%s", why ? why : "unknown");
    else
        fact(fn, ctx, key, "%ld.%ld.%ld", v / 10000, v / 100 % 100, v % 100);
}

static void gpu_facts(dp_fact_fn fn, void *ctx)
{
    int n, status = dpc_device_count(&n);
    const char *visible = getenv("CUDA_VISIBLE_DEVICES");
    fact(fn, ctx, "CUDA_VISIBLE_DEVICES", "%s", visible ? visible : "(not set)");
    if (status != 0) {
        fact(fn, ctx, "GPUs", "0 (%s)", dpc_error_string(status));
        return;
    }
    fact(fn, ctx, "GPUs", "%d", n);
    for (int i = 0; i < n; i++) {
        struct dpc_device_info d;
        char key[32];
        snprintf(key, sizeof key, "GPU %d", i);
        status = dpc_device_info(i, &d);
        if (status != 0)
            fact(fn, ctx, key, "unknown (%s)", dpc_error_string(status));
        else
            fact(fn, ctx, key, "%s, %.1f GiB, compute capability %d.%d, %d multiprocessors",
                 d.name, d.total_memory / 1073741824.0, d.major, d.minor, d.multiprocessors);
    }
}

static void cuda_facts(dp_fact_fn fn, void *ctx)
{
    int v, status;
    const char *why = NULL;
    fact(fn, ctx, "CUDA", "built");
    status = dpc_runtime_version(&v);
    cuda_version_fact(fn, ctx, "CUDA runtime", status, v);
    status = dpc_driver_version(&v);
    cuda_version_fact(fn, ctx, "CUDA driver", status, v);
    triple_version_fact(fn, ctx, "cuBLASLt", (long)dpc_cublaslt_version(&why), why);
#ifdef DP_HAVE_NCCL
    triple_version_fact(fn, ctx, "NCCL", dpc_nccl_version(), "unknown (ncclGetVersion failed)");
#else
    triple_version_fact(fn, ctx, "NCCL", 0, "not built (configure found no NCCL)");
#endif
    gpu_facts(fn, ctx);
}

dp_status dp_cuda_devices(int *count)
{
    if (count == NULL)
        return dp_fail(DP_ERR_ARG, "cuda_devices: expected a pointer for the count");
    int st = dpc_device_count(count);
    if (st != 0) {
        *count = 0;
        return dp_fail(DP_ERR_CUDA, "no GPU is visible (%s)", dpc_error_string(st));
    }
    if (*count == 0)
        return dp_fail(DP_ERR_DEVICE, "no GPU is visible (the CUDA driver reports 0 devices)");
    return DP_OK;
}
#else
static void cuda_facts(dp_fact_fn fn, void *ctx)
{
    fact(fn, ctx, "CUDA", "not built (configure --with-cuda)");
}

dp_status dp_cuda_devices(int *count)
{
    if (count == NULL)
        return dp_fail(DP_ERR_ARG, "cuda_devices: expected a pointer for the count");
    *count = 0;
    return dp_fail(DP_ERR_DEVICE, "no GPU is visible (this dplua was built without CUDA)");
}
#endif

/* The CPU's threads are OpenBLAS's, whose default follows PyTorch's:
 * OPENBLAS_NUM_THREADS, else OMP_NUM_THREADS, else one per online CPU. */
dp_status dp_set_num_threads(int n)
{
    if (n < 1)
        return dp_fail(DP_ERR_ARG, "set_num_threads: expected a positive number of threads, got %d", n);
    cpu_blas_set_threads(n);
    return DP_OK;
}

int dp_get_num_threads(void)
{
    return cpu_blas_threads();
}

static int deterministic;
void dp_set_deterministic(int on) { deterministic = on != 0; }
int dp_deterministic(void) { return deterministic; }

void dp_env_facts(dp_fact_fn fn, void *ctx)
{
    if (fn == NULL)
        return;
    const char *blas = cpu_blas_config();
    fact(fn, ctx, "OpenBLAS", "%s", blas ? blas : "(unknown)");
    fact(fn, ctx, "OpenBLAS threads", "%d", cpu_blas_threads());
#ifdef DP_HAVE_GLOO
    fact(fn, ctx, "Gloo", "yes");
#else
    fact(fn, ctx, "Gloo", "no (CPU collectives unavailable)");
#endif
    cuda_facts(fn, ctx);
}
