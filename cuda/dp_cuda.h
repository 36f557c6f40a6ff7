/*
 * dp_cuda.h — the plain C face of cuda/device.cu.
 *
 * Nothing here needs a CUDA header: streams are `void *` (a cudaStream_t,
 * NULL for the default stream) and statuses are ints, 0 for success or a
 * cudaError_t value that dpc_error_string() turns into words. Callers above
 * cuda/ (src/core, src/main.c) include this header only when the build has
 * CUDA (DP_HAVE_CUDA).
 *
 *     int n, st = dpc_device_count(&n);
 *     if (st != 0)
 *         printf("no GPU: %s\n", dpc_error_string(st));
 *
 * The prefix is dpc_ ("dplua cuda") so that it never collides with the
 * public dp_ API of src/dplua.h and src/dplua_cuda.h.
 */
#ifndef DP_CUDA_H
#define DP_CUDA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What `dplua env` prints about one GPU. */
struct dpc_device_info {
    char name[256];
    size_t total_memory;     /* bytes of global memory */
    int major, minor;        /* compute capability, e.g. 9.0 for an H200 */
    int multiprocessors;
};

/* ---- versions and devices (status: 0 or a cudaError_t) ---- */

/* The CUDA runtime linked in, e.g. 13000 for 13.0; needs no driver. */
int dpc_runtime_version(int *version);
/* The newest CUDA the installed driver supports; 0 when there is no driver. */
int dpc_driver_version(int *version);
/* The number of GPUs; *count is 0 when the call fails (no driver, no device),
 * and the returned status says why. Never crashes on a machine without GPU. */
int dpc_device_count(int *count);
int dpc_device_info(int device, struct dpc_device_info *info);
/* Words for a status returned by any dpc_ function. */
const char *dpc_error_string(int status);

/* ---- cuBLASLt, loaded on first use ----
 *
 * libcublasLt is not linked into the program: loading it costs ~60 ms of
 * relocations (it is a 540 MB library), which `dplua -e ''` must not pay.
 * It is dlopen()ed the first time a symbol is asked for; a .cu file casts
 * the result, e.g. `auto mm = (decltype(&cublasLtMatmul))
 * dpc_cublaslt_symbol("cublasLtMatmul", &why);`. Returns NULL when built
 * without cuBLASLt or when the library or symbol cannot be found, with the
 * reason in *why (why may be NULL). Thread-safe. */
void *dpc_cublaslt_symbol(const char *name, const char **why);
/* cublasLtGetVersion(), e.g. 130100 (major*10000 + minor*100 + patch);
 * 0 when built without cuBLASLt or when it cannot be loaded, with the
 * reason in *why (why may be NULL). */
size_t dpc_cublaslt_version(const char **why);
/* ncclGetVersion(), e.g. 22803 for 2.28.3; 0 when built without NCCL or
 * when the library cannot say. */
int dpc_nccl_version(void);

/* ---- kernels ---- */

/* dst[0..n) = value on `stream`. Asynchronous: a status of 0 means the
 * launch was accepted, not that the kernel has run. */
int dpc_fill_f32(float *dst, float value, int64_t n, void *stream);

#ifdef __cplusplus
}
#endif
#endif /* DP_CUDA_H */
