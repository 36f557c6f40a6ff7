/*
 * nccl.c — the NCCL backend of process groups: collectives on device
 * pointers, on a stream of the group's own. Built only with NCCL and CUDA
 * (DP_HAVE_NCCL, DP_HAVE_CUDA); otherwise this file is empty.
 *
 * Rank 0 makes the ncclUniqueId and sets it in the store when the group is
 * made; the others get it there. The communicator is made by the group's
 * first op, on the device of that op's tensors (as PyTorch does: a script
 * picks cuda:<rank> after init_process_group), and every later op must
 * use that device.
 *
 * Nothing may hang: the communicator is non-blocking (config.blocking = 0),
 * so its creation and every call return at once; the group then polls the
 * stream and ncclCommGetAsyncError until the op is done, an error shows up
 * or the timeout passes, in which case the communicator is aborted.
 *
 * An op is ordered after the work queued so far on the device's current
 * stream (torch.cuda.set_stream; by default the legacy default stream)
 * through an event, and returns when its own stream is done.
 */
#include "config.h"

#if defined(DP_HAVE_NCCL) && defined(DP_HAVE_CUDA)

#include "dplua_cuda.h"
#include "dist/pg.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct pg_nccl {
    dp_store *store;
    int rank, size;
    double timeout_s;
    ncclUniqueId id;
    int device;              /* -1 until the first op makes the communicator */
    ncclComm_t comm;
    cudaStream_t stream;
    cudaEvent_t ready;       /* prior work on the current stream */
    float *scratch;          /* one float for barrier */
    atomic_int aborting;     /* pg_nccl_abort: the running wait gives up */
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Spins briefly, then sleeps: small collectives finish in microseconds. */
static void backoff(int *round)
{
    if ((*round)++ < 200)
        sched_yield();
    else
        usleep(50);
}

static dp_status nccl_err(ncclComm_t comm, ncclResult_t r, const char *what, char *err, size_t errlen)
{
    const char *last = comm ? ncclGetLastError(comm) : NULL;
    snprintf(err, errlen, "%s: %s%s%s%s", what, ncclGetErrorString(r), last && *last ? " (" : "",
             last && *last ? last : "", last && *last ? ")" : "");
    return DP_ERR_CUDA;
}

static dp_status cuda_err(cudaError_t e, const char *what, char *err, size_t errlen)
{
    snprintf(err, errlen, "%s: %s", what, cudaGetErrorString(e));
    return DP_ERR_CUDA;
}

/* The end of a wait that timed out or was told to stop (pg_nccl_abort):
 * the communicator is aborted (a rank that is missing would keep it
 * waiting forever) and cannot be used again. */
static dp_status abort_timed_out(pg_nccl *n, const char *what, const char *why, char *err, size_t errlen)
{
    if (atomic_load(&n->aborting))
        snprintf(err, errlen, "%s: stopped (the ranks called different collectives); the communicator was aborted",
                 what);
    else
        snprintf(err, errlen, "%s: timed out after %g s %s; the communicator was aborted", what, n->timeout_s, why);
    ncclCommAbort(n->comm);
    n->comm = NULL;
    return DP_ERR_IO;
}

/* Waits until the communicator has no call in progress (a non-blocking
 * call returns before it is done). */
static dp_status wait_comm(pg_nccl *n, double deadline, const char *what, char *err, size_t errlen)
{
    ncclResult_t state;
    int round = 0;
    for (;;) {
        ncclResult_t r = ncclCommGetAsyncError(n->comm, &state);
        if (r != ncclSuccess)
            return nccl_err(n->comm, r, what, err, errlen);
        if (state == ncclSuccess)
            return DP_OK;
        if (state != ncclInProgress)
            return nccl_err(n->comm, state, what, err, errlen);
        if (now_s() > deadline || atomic_load(&n->aborting))
            return abort_timed_out(n, what, "(a rank did not take part)", err, errlen);
        backoff(&round);
    }
}

/* Waits for the group's stream, watching for NCCL errors and the timeout. */
static dp_status wait_stream(pg_nccl *n, double deadline, const char *what, char *err, size_t errlen)
{
    int round = 0;
    for (;;) {
        cudaError_t e = cudaStreamQuery(n->stream);
        if (e == cudaSuccess)
            return DP_OK;
        if (e != cudaErrorNotReady)
            return cuda_err(e, what, err, errlen);
        ncclResult_t state;
        if (ncclCommGetAsyncError(n->comm, &state) == ncclSuccess && state != ncclSuccess && state != ncclInProgress)
            return nccl_err(n->comm, state, what, err, errlen);
        if (now_s() > deadline || atomic_load(&n->aborting))
            return abort_timed_out(n, what, "waiting for the other ranks", err, errlen);
        backoff(&round);
    }
}

/* ---------------------------------------------------------------- the communicator */

static dp_status make_comm(pg_nccl *n, int device, char *err, size_t errlen)
{
    cudaError_t e = cudaSetDevice(device);
    if (e)
        return cuda_err(e, "cudaSetDevice", err, errlen);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclResult_t r = ncclCommInitRankConfig(&n->comm, n->size, n->id, n->rank, &cfg);
    if (r != ncclSuccess && r != ncclInProgress) {
        n->comm = NULL;
        return nccl_err(NULL, r, "ncclCommInitRankConfig", err, errlen);
    }
    dp_status st = wait_comm(n, now_s() + n->timeout_s, "creating the NCCL communicator", err, errlen);
    if (st)
        return st;
    if ((e = cudaStreamCreateWithFlags(&n->stream, cudaStreamNonBlocking)) ||
        (e = cudaEventCreateWithFlags(&n->ready, cudaEventDisableTiming)) ||
        (e = cudaMalloc((void **)&n->scratch, sizeof(float))))
        return cuda_err(e, "setting up the NCCL stream", err, errlen);
    n->device = device;
    return DP_OK;
}

dp_status pg_nccl_new(pg_nccl **out, dp_store *store, const char *prefix, int rank, int size,
                      double timeout_s, char *err, size_t errlen)
{
    *out = NULL;
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e || count == 0) {
        snprintf(err, errlen, "nccl needs a CUDA device, found none (%s); use backend gloo for CPU tensors",
                 e ? cudaGetErrorString(e) : "no device");
        return DP_ERR_DEVICE;
    }
    pg_nccl *n = calloc(1, sizeof *n);
    if (!n) {
        snprintf(err, errlen, "out of memory");
        return DP_ERR_MEMORY;
    }
    n->store = store;
    n->rank = rank;
    n->size = size;
    n->timeout_s = timeout_s;
    n->device = -1;
    char key[256];
    snprintf(key, sizeof key, "%sunique_id", prefix);
    dp_status st = DP_OK;
    if (rank == 0) {
        ncclResult_t r = ncclGetUniqueId(&n->id);
        if (r != ncclSuccess)
            st = nccl_err(NULL, r, "ncclGetUniqueId", err, errlen);
        else if ((st = pg_store_set(store, key, &n->id, sizeof n->id)))
            snprintf(err, errlen, "%s", dp_last_error());
    } else {
        void *v = NULL;
        size_t len = 0;
        if ((st = pg_store_get(store, key, &v, &len, timeout_s))) {
            snprintf(err, errlen, "rank 0 did not publish the NCCL unique id within %g s: %s", timeout_s,
                     dp_last_error());
        } else if (len != sizeof n->id) {
            snprintf(err, errlen, "the NCCL unique id in the store has %zu bytes, expected %zu", len, sizeof n->id);
            st = DP_ERR_IO;
        } else {
            memcpy(&n->id, v, sizeof n->id);
        }
        dp_free(v);
    }
    if (st) {
        free(n);
        return st;
    }
    *out = n;
    return DP_OK;
}

void pg_nccl_abort(pg_nccl *n)
{
    atomic_store(&n->aborting, 1);
}

void pg_nccl_free(pg_nccl *n)
{
    if (!n)
        return;
    if (n->device >= 0)
        cudaSetDevice(n->device);
    if (n->comm) {
        /* finalize flushes pending work; abort if that fails or does not end */
        ncclResult_t r = ncclCommFinalize(n->comm), state = ncclInProgress;
        double deadline = now_s() + n->timeout_s;
        int round = 0;
        while ((r == ncclSuccess || r == ncclInProgress) && state == ncclInProgress && now_s() < deadline) {
            if (ncclCommGetAsyncError(n->comm, &state) != ncclSuccess)
                break;
            if (state == ncclInProgress)
                backoff(&round);
        }
        if (state == ncclSuccess)
            ncclCommDestroy(n->comm);
        else
            ncclCommAbort(n->comm);
    }
    if (n->scratch)
        cudaFree(n->scratch);
    if (n->ready)
        cudaEventDestroy(n->ready);
    if (n->stream)
        cudaStreamDestroy(n->stream);
    free(n);
}

/* ---------------------------------------------------------------- ops */

static ncclDataType_t nccl_dtype(int dtype)
{
    switch (dtype) {
    case DP_FLOAT32: return ncclFloat32;
    case DP_FLOAT64: return ncclFloat64;
    case DP_INT64: return ncclInt64;
    case DP_INT32: return ncclInt32;
    case DP_BFLOAT16: return ncclBfloat16;
    default: return ncclUint8;   /* uint8, bool */
    }
}

/* bool holds 0 or 1: SUM and MAX are OR (max), PRODUCT and MIN are AND (min). */
static ncclRedOp_t nccl_redop(dp_redop op, int dtype)
{
    if (dtype == DP_BOOL)
        return op == DP_SUM || op == DP_MAX ? ncclMax : ncclMin;
    switch (op) {
    case DP_MEAN: return ncclAvg;
    case DP_MAX: return ncclMax;
    case DP_MIN: return ncclMin;
    case DP_PROD: return ncclProd;
    default: return ncclSum;   /* DP_SUM: pg.c lets no other op through */
    }
}

static ncclResult_t all_to_all(pg_nccl *n, const pg_op *op, ncclDataType_t dt)
{
    size_t chunk = (size_t)op->count * dp_dtype_size(op->dtype);
    ncclResult_t r = ncclGroupStart();
    for (int p = 0; p < n->size && r == ncclSuccess; p++) {
        r = ncclSend((const char *)op->in + p * chunk, (size_t)op->count, dt, p, n->comm, n->stream);
        if (r == ncclSuccess)
            r = ncclRecv((char *)op->out + p * chunk, (size_t)op->count, dt, p, n->comm, n->stream);
    }
    ncclResult_t g = ncclGroupEnd();
    return r != ncclSuccess ? r : g;
}

/* gather and scatter: point-to-point calls between the root and each other
 * rank in one group call, and a copy for the root's own part. */
static ncclResult_t rooted(pg_nccl *n, const pg_op *op, ncclDataType_t dt)
{
    size_t c = (size_t)op->count, chunk = c * dp_dtype_size(op->dtype);
    int gather = op->kind == PG_GATHER;
    if (n->rank != op->root)
        return gather ? ncclSend(op->in, c, dt, op->root, n->comm, n->stream)
                      : ncclRecv(op->out, c, dt, op->root, n->comm, n->stream);
    char *whole = gather ? (char *)op->out : (char *)op->in;
    if (cudaMemcpyAsync(gather ? whole + n->rank * chunk : op->out, gather ? op->in : whole + n->rank * chunk, chunk,
                        cudaMemcpyDeviceToDevice, n->stream))
        return ncclUnhandledCudaError;
    ncclResult_t r = ncclGroupStart();
    for (int p = 0; p < n->size && r == ncclSuccess; p++) {
        if (p == n->rank)
            continue;
        r = gather ? ncclRecv(whole + p * chunk, c, dt, p, n->comm, n->stream)
                   : ncclSend(whole + p * chunk, c, dt, p, n->comm, n->stream);
    }
    ncclResult_t g = ncclGroupEnd();
    return r != ncclSuccess ? r : g;
}

/* A PG_P2P batch in one group call, so that its sends and receives can
 * meet the peers' in any order. */
static ncclResult_t p2p_batch(pg_nccl *n, const pg_op *op)
{
    ncclResult_t r = ncclGroupStart();
    for (int i = 0; i < op->nparts && r == ncclSuccess; i++) {
        const pg_p2p *p = &op->parts[i];
        if (p->count == 0)
            continue;
        r = p->send ? ncclSend(p->buf, (size_t)p->count, nccl_dtype(p->dtype), p->peer, n->comm, n->stream)
                    : ncclRecv(p->buf, (size_t)p->count, nccl_dtype(p->dtype), p->peer, n->comm, n->stream);
    }
    ncclResult_t g = ncclGroupEnd();
    return r != ncclSuccess ? r : g;
}

/* Issues op on the group's stream (the call may still be in progress). */
static ncclResult_t issue(pg_nccl *n, const pg_op *op)
{
    ncclDataType_t dt = nccl_dtype(op->dtype);
    ncclRedOp_t ro = nccl_redop(op->redop, op->dtype);
    size_t c = (size_t)op->count;
    switch (op->kind) {
    case PG_ALL_REDUCE: return ncclAllReduce(op->in, op->out, c, dt, ro, n->comm, n->stream);
    case PG_BROADCAST: return ncclBroadcast(op->in, op->out, c, dt, op->root, n->comm, n->stream);
    case PG_REDUCE: return ncclReduce(op->in, op->out, c, dt, ro, op->root, n->comm, n->stream);
    case PG_ALL_GATHER: return ncclAllGather(op->in, op->out, c, dt, n->comm, n->stream);
    case PG_REDUCE_SCATTER: return ncclReduceScatter(op->in, op->out, c, dt, ro, n->comm, n->stream);
    case PG_ALL_TO_ALL: return all_to_all(n, op, dt);
    case PG_SEND: return ncclSend(op->in, c, dt, op->root, n->comm, n->stream);
    case PG_RECV: return ncclRecv(op->out, c, dt, op->root, n->comm, n->stream);
    case PG_GATHER: case PG_SCATTER: return rooted(n, op, dt);
    case PG_P2P: return p2p_batch(n, op);
    default: return ncclAllReduce(n->scratch, n->scratch, 1, ncclFloat32, ncclSum, n->comm, n->stream);
    }
}

static dp_status post_p2p(pg_nccl *n, const pg_op *op, char *err, size_t errlen);

dp_status pg_nccl_run(pg_nccl *n, const pg_op *op, char *err, size_t errlen)
{
    int device = op->device;
    if (op->kind == PG_BARRIER && device < 0) {
        device = n->device;
        if (device < 0 && cudaGetDevice(&device))
            device = 0;
    }
    if (n->device >= 0 && device != n->device) {
        snprintf(err, errlen, "this nccl group's communicator is on cuda:%d, got a tensor on cuda:%d "
                 "(one device per rank and group)", n->device, device);
        return DP_ERR_DEVICE;
    }
    dp_status st;
    if (n->device < 0 && (st = make_comm(n, device, err, errlen)))
        return st;
    if (!n->comm) {
        snprintf(err, errlen, "the NCCL communicator was aborted by an earlier failure");
        return DP_ERR_STATE;
    }
    if (op->kind != PG_BARRIER && op->kind != PG_P2P && op->count == 0)
        return DP_OK;
    cudaError_t e;
    if ((e = cudaSetDevice(n->device)) ||
        (e = cudaEventRecord(n->ready, (cudaStream_t)dp_cuda_current_stream(n->device))) ||
        (e = cudaStreamWaitEvent(n->stream, n->ready, 0)))
        return cuda_err(e, "ordering after the current stream", err, errlen);
    double deadline = now_s() + n->timeout_s;
    ncclResult_t r = issue(n, op);
    if (r != ncclSuccess && r != ncclInProgress)
        return nccl_err(n->comm, r, "issuing the NCCL call", err, errlen);
    if ((st = wait_comm(n, deadline, "issuing the NCCL call", err, errlen)))
        return st;
    if (op->kind == PG_P2P)
        return post_p2p(n, op, err, errlen);
    return wait_stream(n, deadline, "waiting for NCCL", err, errlen);
}

/* pg_nccl_finish waits for this event, recorded after the batch. */
typedef struct {
    cudaEvent_t done;
    double deadline;
} p2p_pending;

static dp_status post_p2p(pg_nccl *n, const pg_op *op, char *err, size_t errlen)
{
    p2p_pending *p = calloc(1, sizeof *p);
    if (!p) {
        snprintf(err, errlen, "out of memory");
        return DP_ERR_MEMORY;
    }
    cudaError_t e = cudaEventCreateWithFlags(&p->done, cudaEventDisableTiming);
    if (!e && (e = cudaEventRecord(p->done, n->stream)))
        cudaEventDestroy(p->done);
    if (e) {
        free(p);
        return cuda_err(e, "recording the end of the sends and receives", err, errlen);
    }
    p->deadline = now_s() + n->timeout_s;
    *op->pending = p;
    return DP_OK;
}

/* On the group's finisher thread, while the worker may run later ops on
 * the communicator: only the event is polled here. A batch that does not
 * end in time fails and breaks the group; the communicator is aborted
 * when the group is freed. */
dp_status pg_nccl_finish(pg_nccl *n, void *pending, char *err, size_t errlen)
{
    p2p_pending *p = pending;
    dp_status st = DP_OK;
    int round = 0;
    for (;;) {
        cudaError_t e = cudaEventQuery(p->done);
        if (e == cudaSuccess)
            break;
        if (e != cudaErrorNotReady) {
            st = cuda_err(e, "waiting for the sends and receives", err, errlen);
            break;
        }
        if (now_s() > p->deadline) {
            snprintf(err, errlen, "the sends and receives did not complete within %g s (a peer did not post the "
                     "matching receive or send)", n->timeout_s);
            st = DP_ERR_IO;
            break;
        }
        backoff(&round);
    }
    cudaEventDestroy(p->done);
    free(p);
    return st;
}

#else
/* Built without NCCL or CUDA: no NCCL backend (pg.c says so). */
typedef int pg_nccl_unused;
#endif
