/*
 * pg.c — process groups: the backend-independent half of dp_pg_* and
 * dp_work_* (src/dplua.h). gloo.cc and nccl.c move the bytes (pg.h).
 *
 * Ordering. A group runs its ops one at a time, in issue order, which is
 * what makes the collectives of every rank line up. An async op (work !=
 * NULL) goes to the group's FIFO, served by one worker thread started on
 * first use. A sync op runs on the caller's thread when nothing is queued
 * or running (no thread hand-off on the common path) and otherwise joins
 * the FIFO and waits, so mixing sync and async ops keeps their order.
 *
 * Errors. dp_fail's buffer is per thread: an op records its message in its
 * work, and dp_work_wait (or the sync call) copies it into the waiting
 * thread's dp_last_error(). A failed op (timeout, dead peer, mismatch)
 * breaks the group: queued and later ops fail at once with the same
 * message, so nothing waits on a transport in an unknown state.
 *
 * Diagnosis. A failed op's message says which ranks did not arrive, which
 * are dead or frozen and what they reported, or which calls did not
 * match, from what the ranks keep in the store (pg_store.c: their states,
 * errors, and the fingerprints of debug mode). A collective that stalls
 * is ended early by the group's heartbeat when those states show
 * mismatched calls (pg_store.c, "Stalls"). An op only copies itself into
 * the group for the heartbeat to publish: no store call on its path.
 *
 * Threads. The dp_pg_* calls of one group are meant for one thread (Lua's).
 * Tensors of an async op are retained by the caller and released by the
 * caller's thread (dp_work_wait/dp_work_free, or the next call on the
 * group), never by the worker: tensor refcounts are not atomic.
 */
#include "config.h"

#include "dplua_internal.h"
#include "dist/pg_group.h"
#include "dist/process.h"
#include "dist/store.h"
#include "core/tensor.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

const char *const pg_kind_names[] = {
    "all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter",
    "all_to_all", "send", "recv", "barrier", "gather", "scatter", "isend/irecv"
};

/* ---------------------------------------------------------------- SIGPIPE */

/* Gloo writes to its sockets without MSG_NOSIGNAL, so a write to a peer
 * that died raises SIGPIPE, whose default action ends the process before
 * any error can be reported. Gloo's threads (its device loop inherits the
 * mask of the thread that makes the group) and the group's worker block it
 * for good; the caller's thread blocks it only while it runs an op
 * (proc_sigpipe_block in process.h). */

/* ---------------------------------------------------------------- running an op */

/* "all_reduce #5 on group default (rank 0 of 2)" */
static int op_title(const dp_pg *pg, const pg_op *op, char *buf, size_t len)
{
    char rs[64];
    if (op->seq)
        return snprintf(buf, len, "%s #%llu on group %s (%s of %d)", pg_kind_names[op->kind],
                        (unsigned long long)op->seq, pg->name, pg_rank_str(pg, pg->rank, rs, sizeof rs), pg->size);
    return snprintf(buf, len, "%s on group %s (%s of %d)", pg_kind_names[op->kind], pg->name,
                    pg_rank_str(pg, pg->rank, rs, sizeof rs), pg->size);
}

/* Breaks the group with msg, and leaves msg in the store for the other
 * ranks' diagnosis (this rank may be gone by the time they look). */
void pg_break(dp_pg *pg, dp_status st, const char *msg)
{
    pg_publish_error(pg, msg);
    pthread_mutex_lock(&pg->mu);
    if (!pg->broken) {
        pg->broken = st;
        snprintf(pg->broken_msg, sizeof pg->broken_msg, "%s", msg);
    }
    pthread_mutex_unlock(&pg->mu);
}

/* A Gloo failure that means a peer went away rather than a timeout. */
static int peer_lost(const char *err)
{
    return strstr(err, "closed") || strstr(err, "reset") || strstr(err, "Broken pipe") ||
           strstr(err, "refused") || strstr(err, "EOF");
}

/* w's op failed with the backend's message err: w's message names the op
 * and says what the store knows of the other ranks, and the group breaks.
 * (Point-to-point batches name their peers in err themselves.) */
static void fail_op(dp_pg *pg, dp_work *w, const char *err)
{
    const pg_op *op = &w->op;
    if (!op->seq || !pg_mismatch_after_failure(pg, op, w->msg)) {
        int n = op_title(pg, op, w->msg, sizeof w->msg);
        snprintf(w->msg + n, sizeof w->msg - n, " failed: %s", err);
        if (op->kind != PG_P2P)
            pg_diagnose(pg, op, peer_lost(err), w->msg);
    }
    pg_break(pg, w->status, w->msg);
}

/* Runs w's op to completion on the calling thread; only one thread runs
 * a group's ops at a time (pg->busy). Leaves the result in w. */
static void execute(dp_pg *pg, dp_work *w)
{
    pg_op *op = &w->op;
    pthread_mutex_lock(&pg->mu);
    dp_status broken = pg->broken;
    if (broken)
        snprintf(w->msg, sizeof w->msg, "%s", pg->broken_msg);
    else if (op->seq) {
        /* for the heartbeat, which publishes it (no store call here) */
        pg->current = *op;
        atomic_store(&pg->entered, op->seq);
    }
    pthread_mutex_unlock(&pg->mu);
    if ((w->status = broken))
        return;
    if (op->seq && pg->debug && (w->status = pg_check_fingerprints(pg, op, w->msg))) {
        atomic_store(&pg->finished, op->seq);
        pg_break(pg, w->status, w->msg);
        return;
    }
    char err[PG_MSG / 2];
    err[0] = 0;
    if (op->kind == PG_P2P)
        op->pending = &w->pending;
    w->status = pg->run(pg->impl, op, err, sizeof err);
    if (op->seq)
        atomic_store(&pg->finished, op->seq);
    if (w->status)
        fail_op(pg, w, err);
}

static void release_holds(dp_work *w)
{
    for (int i = 0; i < 2; i++) {
        dp_tensor_release(w->hold[i]);
        w->hold[i] = NULL;
    }
    for (int i = 0; w->part_holds && i < w->op.nparts; i++)
        dp_tensor_release(w->part_holds[i]);
    free(w->part_holds);
    free(w->parts);
    w->part_holds = NULL;
    w->parts = NULL;
}

/* Frees the orphans the worker parked; on the caller's thread. */
static void free_parked(dp_pg *pg)
{
    if (!pg->parked)
        return;
    pthread_mutex_lock(&pg->mu);
    dp_work *w = pg->parked;
    pg->parked = NULL;
    pthread_mutex_unlock(&pg->mu);
    while (w) {
        dp_work *next = w->next;
        release_holds(w);
        free(w);
        w = next;
    }
}

/* Marks w done (mu held); a work its caller freed first is parked. */
static void complete_locked(dp_pg *pg, dp_work *w)
{
    /* read orphaned before done: once done is set, a caller that
     * still holds w may free it without the lock */
    int orphaned = w->orphaned;
    atomic_store(&w->done, 1);
    if (orphaned) {
        w->next = pg->parked;
        pg->parked = w;
    }
    pthread_cond_broadcast(&pg->cv);
}

static void *worker_main(void *arg)
{
    dp_pg *pg = arg;
    proc_sigpipe_guard guard;
    proc_sigpipe_block(&guard);   /* for the thread's life */
    pthread_mutex_lock(&pg->mu);
    for (;;) {
        while (!(pg->head && !pg->busy) && !(pg->stop && !pg->head && !pg->busy))
            pthread_cond_wait(&pg->cv, &pg->mu);
        if (!pg->head)
            break;
        dp_work *w = pg->head;
        pg->head = w->next;
        if (!pg->head)
            pg->tail = NULL;
        w->next = NULL;
        pg->busy = 1;
        pthread_mutex_unlock(&pg->mu);
        execute(pg, w);
        pthread_mutex_lock(&pg->mu);
        pg->busy = 0;
        if (w->pending) {
            /* posted: the finisher waits for it while later ops run */
            if (pg->posted_tail)
                pg->posted_tail->next = w;
            else
                pg->posted_head = w;
            pg->posted_tail = w;
            pthread_cond_broadcast(&pg->cv);
            continue;
        }
        complete_locked(pg, w);
    }
    pthread_mutex_unlock(&pg->mu);
    return NULL;
}

/* The finisher: waits for the point-to-point batches the worker posted,
 * in the order they were posted, so that neither the worker nor the
 * caller blocks on a send whose receiver posts later. It ends after the
 * worker, once nothing posted is left. */
static void *finisher_main(void *arg)
{
    dp_pg *pg = arg;
    proc_sigpipe_guard guard;
    proc_sigpipe_block(&guard);   /* for the thread's life */
    pthread_mutex_lock(&pg->mu);
    for (;;) {
        while (!pg->posted_head && !(pg->stop && !pg->head && !pg->busy))
            pthread_cond_wait(&pg->cv, &pg->mu);
        dp_work *w = pg->posted_head;
        if (!w)
            break;
        pg->posted_head = w->next;
        if (!pg->posted_head)
            pg->posted_tail = NULL;
        w->next = NULL;
        void *pending = w->pending;
        w->pending = NULL;
        pthread_mutex_unlock(&pg->mu);
        char err[PG_MSG / 2];
        err[0] = 0;
        if ((w->status = pg->finish(pg->impl, pending, err, sizeof err)))
            fail_op(pg, w, err);
        pthread_mutex_lock(&pg->mu);
        complete_locked(pg, w);
    }
    pthread_mutex_unlock(&pg->mu);
    return NULL;
}

/* Queues w behind everything issued before it; mu held. */
static dp_status enqueue_locked(dp_pg *pg, dp_work *w)
{
    if (!pg->started) {
        int e = pthread_create(&pg->thread, NULL, worker_main, pg);
        if (e)
            return dp_fail(DP_ERR_STATE, "process group %s: cannot start its worker thread: %s",
                           pg->name, strerror(e));
        pg->started = 1;
    }
    w->next = NULL;
    if (pg->tail)
        pg->tail->next = w;
    else
        pg->head = w;
    pg->tail = w;
    pthread_cond_broadcast(&pg->cv);
    return DP_OK;
}

/* Runs w now or after what is queued, then reports its result in this
 * thread's dp_last_error. */
static dp_status submit_sync(dp_pg *pg, dp_work *w)
{
    pthread_mutex_lock(&pg->mu);
    if (!pg->head && !pg->busy) {
        pg->busy = 1;
        pthread_mutex_unlock(&pg->mu);
        proc_sigpipe_guard guard;
        proc_sigpipe_block(&guard);
        execute(pg, w);
        proc_sigpipe_restore(&guard);
        pthread_mutex_lock(&pg->mu);
        pg->busy = 0;
        pthread_cond_broadcast(&pg->cv);
    } else {
        dp_status st = enqueue_locked(pg, w);
        if (st) {
            pthread_mutex_unlock(&pg->mu);
            return st;
        }
        while (!atomic_load(&w->done))
            pthread_cond_wait(&pg->cv, &pg->mu);
    }
    pthread_mutex_unlock(&pg->mu);
    return w->status ? dp_fail(w->status, "%s", w->msg) : DP_OK;
}

/* Issues op: sync when work is NULL, else queued with *work to wait on.
 * The tensors of an async op are held until the work is waited or freed. */
static dp_status submit(dp_pg *pg, const pg_op *op, dp_tensor *a, dp_tensor *b, dp_work **work)
{
    free_parked(pg);
    /* a GPU Linear waiting for its next op (src/core/gpu_linear.c) is launched
     * here, on the caller's thread, before the worker orders the
     * collective after the current stream's work */
    dp_cuda_launch_deferred();
    pthread_mutex_lock(&pg->mu);
    dp_status broken = pg->broken;
    pthread_mutex_unlock(&pg->mu);
    if (broken)
        return dp_fail(broken, "%s", pg->broken_msg);
    if (op->seq)
        pg_heartbeat_start(pg);
    if (!work) {
        dp_work w;
        memset(&w, 0, sizeof w);
        w.pg = pg;
        w.op = *op;
        if (op->seq)
            w.op.seq = ++pg->seq;
        return submit_sync(pg, &w);
    }
    *work = NULL;
    dp_work *w = calloc(1, sizeof *w);
    if (!w)
        return dp_fail(DP_ERR_MEMORY, "%s: out of memory", pg_kind_names[op->kind]);
    w->pg = pg;
    w->op = *op;
    w->heap = 1;
    w->hold[0] = a;
    w->hold[1] = b != a ? b : NULL;
    for (int i = 0; i < 2; i++)
        if (w->hold[i])
            dp_tensor_retain(w->hold[i]);
    pthread_mutex_lock(&pg->mu);
    if (op->seq)
        w->op.seq = pg->seq + 1;
    dp_status st = enqueue_locked(pg, w);
    pthread_mutex_unlock(&pg->mu);
    if (st) {
        release_holds(w);
        free(w);
        return st;
    }
    if (op->seq)
        pg->seq++;
    *work = w;
    return DP_OK;
}

/* ---------------------------------------------------------------- works */

dp_status dp_work_wait(dp_work *w)
{
    if (!w)
        return dp_fail(DP_ERR_ARG, "work.wait: no work handle");
    if (!atomic_load(&w->done)) {
        dp_pg *pg = w->pg;
        pthread_mutex_lock(&pg->mu);
        while (!atomic_load(&w->done))
            pthread_cond_wait(&pg->cv, &pg->mu);
        pthread_mutex_unlock(&pg->mu);
    }
    release_holds(w);
    return w->status ? dp_fail(w->status, "%s", w->msg) : DP_OK;
}

int dp_work_is_completed(dp_work *w)
{
    return w ? atomic_load(&w->done) : 1;
}

/* A work freed before it ran is parked by the worker when it finishes and
 * freed by the next call on the group (or dp_pg_free). */
void dp_work_free(dp_work *w)
{
    if (!w)
        return;
    if (!atomic_load(&w->done)) {
        dp_pg *pg = w->pg;
        pthread_mutex_lock(&pg->mu);
        int done = atomic_load(&w->done);
        if (!done)
            w->orphaned = 1;
        pthread_mutex_unlock(&pg->mu);
        if (!done)
            return;
    }
    release_holds(w);
    free(w);
}

/* ---------------------------------------------------------------- tensor checks */

static dp_status check_tensor(const dp_pg *pg, const char *fn, const dp_tensor *t, const char *what)
{
    if (!t)
        return dp_fail(DP_ERR_ARG, "%s: expected a tensor for %s, got NULL", fn, what);
    if (!tensor_is_contiguous(t))
        return dp_fail(DP_ERR_ARG, "%s: the %s tensor must be contiguous (call :contiguous() first)", fn, what);
    if (t->dtype < 0 || t->dtype >= DP_NUM_DTYPES)
        return dp_fail(DP_ERR_DTYPE, "%s: the %s tensor has an invalid dtype", fn, what);
    int nccl = strcmp(pg->backend, "nccl") == 0;
    if (nccl && t->device == DP_CPU)
        return dp_fail(DP_ERR_DEVICE, "%s: nccl process groups take CUDA tensors; use backend gloo for CPU tensors "
                       "(the %s tensor is on the CPU)", fn, what);
    if (!nccl && t->device != DP_CPU)
        return dp_fail(DP_ERR_DEVICE, "%s: gloo process groups take CPU tensors; use backend nccl for CUDA tensors "
                       "(the %s tensor is on cuda:%d)", fn, what, t->device);
    return DP_OK;
}

static dp_status check_pair(const dp_pg *pg, const char *fn, const dp_tensor *out, const dp_tensor *in)
{
    dp_status st = check_tensor(pg, fn, out, "output");
    if (!st)
        st = check_tensor(pg, fn, in, "input");
    if (st)
        return st;
    if (out->dtype != in->dtype)
        return dp_fail(DP_ERR_DTYPE, "%s: the output is %s but the input is %s; they must have one dtype", fn,
                       dp_dtype_name(out->dtype), dp_dtype_name(in->dtype));
    if (out->device != in->device)
        return dp_fail(DP_ERR_DEVICE, "%s: the output and the input are on different devices", fn);
    return DP_OK;
}

/* The reductions of collectives are PyTorch's ReduceOp: SUM, AVG
 * (DP_MEAN), PRODUCT, MAX and MIN; dp_reduce's others (argmax, var...)
 * have no meaning across ranks. */
static dp_status check_redop(const char *fn, dp_redop op, int dtype)
{
    if (op != DP_SUM && op != DP_MEAN && op != DP_PROD && op != DP_MAX && op != DP_MIN)
        return dp_fail(DP_ERR_ARG, "%s: reduce op %d is not a reduction of collectives (expected DP_SUM, DP_MEAN, "
                       "DP_PROD, DP_MAX or DP_MIN: SUM, AVG, PRODUCT, MAX or MIN)", fn, (int)op);
    if (op == DP_MEAN && !dp_dtype_is_floating(dtype))
        return dp_fail(DP_ERR_DTYPE, "%s: AVG needs a floating-point tensor, got %s (use SUM and divide)", fn,
                       dp_dtype_name(dtype));
    return DP_OK;
}

static dp_status check_rank(const dp_pg *pg, const char *fn, const char *what, int r)
{
    if (r < 0 || r >= pg->size)
        return dp_fail(DP_ERR_INDEX, "%s: %s %d is out of range for a group of %d ranks", fn, what, r, pg->size);
    return DP_OK;
}

static pg_op op_of(int kind, const dp_tensor *t)
{
    pg_op op;
    memset(&op, 0, sizeof op);
    op.kind = kind;
    op.device = DP_CPU;
    op.seq = 1;   /* a collective: submit numbers it */
    if (t) {
        op.dtype = t->dtype;
        op.device = t->device;
        op.count = dp_tensor_numel(t);
        op.in = op.out = tensor_ptr(t);
    }
    return op;
}

/* ---------------------------------------------------------------- collectives */

/* all_reduce, broadcast and reduce: in place on one tensor. The root is
 * checked where the op has one, the reduction where it reduces; the
 * caller passes 0 for what its op lacks. */
static dp_status in_place(dp_pg *pg, int kind, dp_tensor *t, int root, dp_redop redop, dp_work **work)
{
    const char *fn = pg_kind_names[kind];
    dp_status st = check_tensor(pg, fn, t, "");
    if (!st && kind != PG_ALL_REDUCE)
        st = check_rank(pg, fn, "root", root);
    if (!st && kind != PG_BROADCAST)
        st = check_redop(fn, redop, t->dtype);
    if (st)
        return st;
    pg_op o = op_of(kind, t);
    o.root = root;
    o.redop = redop;
    return submit(pg, &o, t, NULL, work);
}

dp_status dp_pg_all_reduce(dp_pg *pg, dp_tensor *t, dp_redop op, dp_work **work)
{
    return in_place(pg, PG_ALL_REDUCE, t, 0, op, work);
}

dp_status dp_pg_broadcast(dp_pg *pg, dp_tensor *t, int root, dp_work **work)
{
    return in_place(pg, PG_BROADCAST, t, root, DP_SUM, work);
}

dp_status dp_pg_reduce(dp_pg *pg, dp_tensor *t, int root, dp_redop op, dp_work **work)
{
    return in_place(pg, PG_REDUCE, t, root, op, work);
}

/* all_gather and reduce_scatter: one tensor holds a part per rank (the
 * whole: all_gather's output, reduce_scatter's input), the other one part. */
static dp_status by_parts(dp_pg *pg, int kind, dp_tensor *out, dp_tensor *in, dp_redop redop, dp_work **work)
{
    const char *fn = pg_kind_names[kind];
    int gather = kind == PG_ALL_GATHER;
    const dp_tensor *whole = gather ? out : in, *part = gather ? in : out;
    dp_status st = check_pair(pg, fn, out, in);
    if (!st && !gather)
        st = check_redop(fn, redop, in->dtype);
    if (st)
        return st;
    int64_t n = dp_tensor_numel(part);
    if (dp_tensor_numel(whole) != n * pg->size)
        return dp_fail(DP_ERR_SHAPE, "%s: the %s has %lld elements but needs %d x %lld = %lld (group size x %s "
                       "elements)", fn, gather ? "output" : "input", (long long)dp_tensor_numel(whole), pg->size,
                       (long long)n, (long long)(n * pg->size), gather ? "input" : "output");
    pg_op o = op_of(kind, part);
    o.in = tensor_ptr(in);
    o.out = tensor_ptr(out);
    o.redop = redop;
    return submit(pg, &o, out, in, work);
}

dp_status dp_pg_all_gather(dp_pg *pg, dp_tensor *out, dp_tensor *in, dp_work **work)
{
    return by_parts(pg, PG_ALL_GATHER, out, in, DP_SUM, work);
}

dp_status dp_pg_reduce_scatter(dp_pg *pg, dp_tensor *out, dp_tensor *in, dp_redop op, dp_work **work)
{
    return by_parts(pg, PG_REDUCE_SCATTER, out, in, op, work);
}

dp_status dp_pg_all_to_all(dp_pg *pg, dp_tensor *out, dp_tensor *in, dp_work **work)
{
    dp_status st = check_pair(pg, "all_to_all", out, in);
    if (st)
        return st;
    int64_t n = dp_tensor_numel(in);
    if (dp_tensor_numel(out) != n)
        return dp_fail(DP_ERR_SHAPE, "all_to_all: the output has %lld elements but the input has %lld; "
                       "they must be equal", (long long)dp_tensor_numel(out), (long long)n);
    int64_t d0 = in->ndim ? in->shape[0] : 1;
    if (d0 % pg->size)
        return dp_fail(DP_ERR_SHAPE, "all_to_all: the input's dim 0 (%lld) does not split evenly among %d ranks",
                       (long long)d0, pg->size);
    pg_op o = op_of(PG_ALL_TO_ALL, in);
    o.count = n / pg->size;
    o.out = tensor_ptr(out);
    return submit(pg, &o, out, in, work);
}

static dp_status p2p(dp_pg *pg, int kind, dp_tensor *t, int peer, int tag)
{
    const char *fn = pg_kind_names[kind];
    dp_status st = check_tensor(pg, fn, t, "");
    if (!st)
        st = check_rank(pg, fn, kind == PG_SEND ? "destination" : "source", peer);
    if (st)
        return st;
    if (peer == pg->rank)
        return dp_fail(DP_ERR_ARG, "%s: rank %d cannot %s itself", fn, peer, kind == PG_SEND ? "send to" : "receive from");
    if (tag < 0 || tag > 0xffffff)
        return dp_fail(DP_ERR_ARG, "%s: the tag must be in [0, 16777215], got %d", fn, tag);
    pg_op o = op_of(kind, t);
    o.seq = 0;   /* point-to-point: not numbered among the collectives */
    o.root = peer;
    o.tag = tag;
    return submit(pg, &o, t, NULL, NULL);
}

dp_status dp_pg_send(dp_pg *pg, dp_tensor *t, int dst, int tag)
{
    return p2p(pg, PG_SEND, t, dst, tag);
}

dp_status dp_pg_recv(dp_pg *pg, dp_tensor *t, int src, int tag)
{
    return p2p(pg, PG_RECV, t, src, tag);
}

dp_status dp_pg_barrier(dp_pg *pg)
{
    pg_op o = op_of(PG_BARRIER, NULL);
    return submit(pg, &o, NULL, NULL, NULL);
}

/* gather and scatter: the root's whole tensor (gather's output, scatter's
 * input) holds a part per rank; the other ranks pass NULL for it, and
 * whatever they pass is not touched. */
static dp_status rooted(dp_pg *pg, int kind, dp_tensor *out, dp_tensor *in, int root, dp_work **work)
{
    const char *fn = pg_kind_names[kind];
    int gather = kind == PG_GATHER;
    dp_tensor *part = gather ? in : out, *whole = gather ? out : in;
    dp_status st = check_rank(pg, fn, "root", root);
    if (!st)
        st = check_tensor(pg, fn, part, gather ? "input" : "output");
    if (st)
        return st;
    if (pg->rank != root) {
        whole = NULL;
    } else {
        if (!whole)
            return dp_fail(DP_ERR_ARG, "%s: the root (group rank %d) needs the %s tensor", fn, root,
                           gather ? "output" : "input");
        if ((st = check_pair(pg, fn, out, in)))
            return st;
        int64_t n = dp_tensor_numel(part);
        if (dp_tensor_numel(whole) != n * pg->size)
            return dp_fail(DP_ERR_SHAPE, "%s: the root's %s has %lld elements but needs %d x %lld = %lld (group "
                           "size x %s elements)", fn, gather ? "output" : "input", (long long)dp_tensor_numel(whole),
                           pg->size, (long long)n, (long long)(n * pg->size), gather ? "input" : "output");
    }
    pg_op o = op_of(kind, part);
    o.in = gather ? tensor_ptr(in) : whole ? tensor_ptr(whole) : NULL;
    o.out = gather ? (whole ? tensor_ptr(whole) : NULL) : tensor_ptr(out);
    o.root = root;
    return submit(pg, &o, part, whole, work);
}

dp_status dp_pg_gather(dp_pg *pg, dp_tensor *out, dp_tensor *in, int root, dp_work **work)
{
    return rooted(pg, PG_GATHER, out, in, root, work);
}

dp_status dp_pg_scatter(dp_pg *pg, dp_tensor *out, dp_tensor *in, int root, dp_work **work)
{
    return rooted(pg, PG_SCATTER, out, in, root, work);
}

static dp_status start_finisher(dp_pg *pg)
{
    pthread_mutex_lock(&pg->mu);
    int e = pg->finisher_started ? 0 : pthread_create(&pg->finisher, NULL, finisher_main, pg);
    if (!e)
        pg->finisher_started = 1;
    pthread_mutex_unlock(&pg->mu);
    if (e)
        return dp_fail(DP_ERR_STATE, "process group %s: cannot start the thread that finishes isend/irecv: %s",
                       pg->name, strerror(e));
    return DP_OK;
}

/* isend, irecv and batch_isend_irecv: n sends (is_send[i]) and receives,
 * posted together in issue order with the group's other ops, and done
 * when all are; always asynchronous. */
dp_status dp_pg_p2p(dp_pg *pg, int n, dp_tensor *const *tensors, const int *is_send, const int *peers,
                    const int *tags, dp_work **work)
{
    const char *fn = pg_kind_names[PG_P2P];
    if (!work)
        return dp_fail(DP_ERR_ARG, "%s: expected a work handle to return (these ops are asynchronous)", fn);
    *work = NULL;
    if (n < 1)
        return dp_fail(DP_ERR_ARG, "%s: expected at least one send or receive, got %d", fn, n);
    for (int i = 0; i < n; i++) {
        const char *what = is_send[i] ? "sent" : "received";
        dp_status st = check_tensor(pg, fn, tensors[i], what);
        if (!st)
            st = check_rank(pg, fn, is_send[i] ? "destination" : "source", peers[i]);
        if (st)
            return st;
        if (peers[i] == pg->rank)
            return dp_fail(DP_ERR_ARG, "%s: rank %d cannot %s itself", fn, peers[i],
                           is_send[i] ? "send to" : "receive from");
        if (tags[i] < 0 || tags[i] > 0xffffff)
            return dp_fail(DP_ERR_ARG, "%s: the tag must be in [0, 16777215], got %d", fn, tags[i]);
        if (tensors[i]->device != tensors[0]->device)
            return dp_fail(DP_ERR_DEVICE, "%s: the tensors of one batch must be on one device", fn);
    }
    dp_status st = start_finisher(pg);
    if (st)
        return st;
    pg_p2p *parts = calloc((size_t)n, sizeof *parts);
    dp_tensor **holds = calloc((size_t)n, sizeof *holds);
    if (!parts || !holds) {
        free(parts);
        free(holds);
        return dp_fail(DP_ERR_MEMORY, "%s: out of memory", fn);
    }
    for (int i = 0; i < n; i++) {
        parts[i] = (pg_p2p){ .send = is_send[i] != 0, .peer = peers[i], .tag = tags[i], .dtype = tensors[i]->dtype,
                             .count = dp_tensor_numel(tensors[i]), .buf = tensor_ptr(tensors[i]) };
        holds[i] = tensors[i];
        dp_tensor_retain(holds[i]);
    }
    pg_op o = op_of(PG_P2P, tensors[0]);
    o.seq = 0;   /* point-to-point: not numbered among the collectives */
    o.nparts = n;
    o.parts = parts;
    st = submit(pg, &o, NULL, NULL, work);
    if (st) {
        for (int i = 0; i < n; i++)
            dp_tensor_release(holds[i]);
        free(parts);
        free(holds);
        return st;
    }
    /* (freed with the work, on this thread: dp_work_wait or dp_work_free) */
    (*work)->parts = parts;
    (*work)->part_holds = holds;
    return DP_OK;
}

/* ---------------------------------------------------------------- groups */

int dp_pg_rank(const dp_pg *pg) { return pg->rank; }
int dp_pg_size(const dp_pg *pg) { return pg->size; }
const char *dp_pg_backend(const dp_pg *pg) { return pg->backend; }
uint64_t dp_pg_seq(const dp_pg *pg) { return pg->seq; }

static int is_loopback(const char *host)
{
    return !host || !*host || strcmp(host, "localhost") == 0 || strncmp(host, "127.", 4) == 0 ||
           strcmp(host, "::1") == 0;
}

/* The address Gloo listens on: loopback when MASTER_ADDR is (or is
 * unset), else this host's address on the route to MASTER_ADDR (the
 * source address a UDP socket connected there would use). */
static void gloo_host(char *buf, size_t len)
{
    const char *master = getenv("MASTER_ADDR");
    snprintf(buf, len, "127.0.0.1");
    if (is_loopback(master))
        return;
    struct addrinfo hints, *ai = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_socktype = SOCK_DGRAM;
    if (getaddrinfo(master, "29500", &hints, &ai) || !ai)
        return;
    int fd = socket(ai->ai_family, SOCK_DGRAM, 0);
    struct sockaddr_storage me;
    socklen_t melen = sizeof me;
    if (fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
        getsockname(fd, (struct sockaddr *)&me, &melen) == 0) {
        void *a = me.ss_family == AF_INET6 ? (void *)&((struct sockaddr_in6 *)&me)->sin6_addr
                                           : (void *)&((struct sockaddr_in *)&me)->sin_addr;
        if (!inet_ntop(me.ss_family, a, buf, (socklen_t)len))
            snprintf(buf, len, "127.0.0.1");
    }
    if (fd >= 0)
        close(fd);
    freeaddrinfo(ai);
}

static dp_status make_backend(dp_pg *pg, const char *backend)
{
    char err[PG_MSG / 2], prefix[PG_NAME + 32];
    err[0] = 0;
    dp_status st;
    snprintf(prefix, sizeof prefix, "%s%s/", pg->prefix, backend);
    if (strcmp(backend, "gloo") == 0) {
#ifdef DP_HAVE_GLOO
        char host[INET6_ADDRSTRLEN + 1];
        gloo_host(host, sizeof host);
        pg->backend = "gloo";
        pg->run = (pg_run_fn)pg_gloo_run;
        pg->free_impl = (pg_free_fn)pg_gloo_free;
        pg->finish = (pg_finish_fn)pg_gloo_finish;
        pg->abort = (pg_abort_fn)pg_gloo_abort;
        st = pg_gloo_new((pg_gloo **)&pg->impl, pg->store, prefix, pg->rank, pg->size, pg->timeout_s, host,
                         getenv("GLOO_SOCKET_IFNAME"), err, sizeof err);
#else
        return dp_fail(DP_ERR_STATE, "new_group: this dplua was built without Gloo (configure --with-gloo)");
#endif
    } else if (strcmp(backend, "nccl") == 0) {
#if defined(DP_HAVE_NCCL) && defined(DP_HAVE_CUDA)
        pg->backend = "nccl";
        pg->run = (pg_run_fn)pg_nccl_run;
        pg->free_impl = (pg_free_fn)pg_nccl_free;
        pg->finish = (pg_finish_fn)pg_nccl_finish;
        pg->abort = (pg_abort_fn)pg_nccl_abort;
        st = pg_nccl_new((pg_nccl **)&pg->impl, pg->store, prefix, pg->rank, pg->size, pg->timeout_s, err, sizeof err);
#else
        return dp_fail(DP_ERR_STATE, "new_group: backend nccl needs NCCL and CUDA, and this dplua was built "
                       "without them (configure --with-nccl); use backend gloo for CPU tensors");
#endif
    } else {
        return dp_fail(DP_ERR_ARG, "new_group: unknown backend '%s' (expected \"gloo\" or \"nccl\")", backend);
    }
    if (st)
        return dp_fail(st, "process group %s (%s, rank %d of %d): %s", pg->name, backend, pg->rank, pg->size, err);
    return DP_OK;
}

static dp_status check_new_args(dp_store *store, const char *backend, int rank, int size, double timeout_s,
                                const char *name, const int *ranks)
{
    if (!store)
        return dp_fail(DP_ERR_ARG, "new_group: no store");
    if (!backend)
        return dp_fail(DP_ERR_ARG, "new_group: no backend (expected \"gloo\" or \"nccl\")");
    if (size < 1)
        return dp_fail(DP_ERR_ARG, "new_group: size must be >= 1, got %d", size);
    if (rank < 0 || rank >= size)
        return dp_fail(DP_ERR_INDEX, "new_group: rank %d is out of range for a group of %d ranks", rank, size);
    if (!(timeout_s > 0))
        return dp_fail(DP_ERR_ARG, "new_group: the timeout must be > 0 seconds, got %g", timeout_s);
    if (!name || !*name || strlen(name) >= PG_NAME || strchr(name, '/'))
        return dp_fail(DP_ERR_ARG, "new_group: the name must be 1 to %d characters without '/'", PG_NAME - 1);
    for (int i = 0; ranks && i < size; i++) {
        if (ranks[i] < 0)
            return dp_fail(DP_ERR_INDEX, "new_group: member %d has a negative rank %d", i, ranks[i]);
        for (int j = 0; j < i; j++)
            if (ranks[j] == ranks[i])
                return dp_fail(DP_ERR_ARG, "new_group: rank %d is listed twice", ranks[i]);
    }
    return DP_OK;
}

/* The live groups, for pg_find. */
static pthread_mutex_t live_mu = PTHREAD_MUTEX_INITIALIZER;
static dp_pg *live;
static uint64_t last_id;

static void live_add(dp_pg *pg)
{
    pthread_mutex_lock(&live_mu);
    pg->id = ++last_id;
    pg->next_live = live;
    live = pg;
    pthread_mutex_unlock(&live_mu);
}

static void live_remove(dp_pg *pg)
{
    pthread_mutex_lock(&live_mu);
    for (dp_pg **p = &live; *p; p = &(*p)->next_live)
        if (*p == pg) {
            *p = pg->next_live;
            break;
        }
    pg->id = 0;
    pthread_mutex_unlock(&live_mu);
}

uint64_t pg_id(const dp_pg *pg)
{
    return pg->id;
}

dp_pg *pg_find(uint64_t id)
{
    pthread_mutex_lock(&live_mu);
    dp_pg *pg = live;
    while (pg && pg->id != id)
        pg = pg->next_live;
    if (pg)
        pg_retain(pg);
    pthread_mutex_unlock(&live_mu);
    return pg;
}

/* DPLUA_DIST_STALL: seconds a collective may wait before the ranks' calls
 * are compared (pg_store.c), 0 for never; 3 when unset. */
static dp_status stall_from_env(double *stall_s)
{
    const char *v = getenv("DPLUA_DIST_STALL");
    *stall_s = 3.0;
    if (!v || !*v)
        return DP_OK;
    char *end;
    double s = strtod(v, &end);
    if (*end || !(s >= 0) || s > 1e9)
        return dp_fail(DP_ERR_ARG, "new_group: DPLUA_DIST_STALL must be a number of seconds >= 0 (0: never compare "
                       "the ranks' calls), got '%s'", v);
    *stall_s = s;
    return DP_OK;
}

/* rank is the caller's rank in the group (its index in ranks). Members
 * meet through the store under "dplua/<name>/"; non-members do not call. */
dp_status dp_pg_new(dp_pg **out, dp_store *store, const char *backend, int rank, int size,
                    double timeout_s, const char *name, const int *ranks)
{
    *out = NULL;
    dp_status st = check_new_args(store, backend, rank, size, timeout_s, name, ranks);
    if (st)
        return st;
    dp_pg *pg = calloc(1, sizeof *pg);
    if (!pg || !(pg->ranks = malloc(sizeof(int) * size))) {
        free(pg);
        return dp_fail(DP_ERR_MEMORY, "new_group: out of memory");
    }
    for (int i = 0; i < size; i++)
        pg->ranks[i] = ranks ? ranks[i] : i;
    snprintf(pg->name, sizeof pg->name, "%s", name);
    snprintf(pg->prefix, sizeof pg->prefix, "dplua/%s/", name);
    pg->rank = rank;
    pg->size = size;
    pg->store = store;
    pg->timeout_s = timeout_s;
    const char *dbg = getenv("DPLUA_DIST_DEBUG");
    pg->debug = dbg && *dbg && strcmp(dbg, "0") != 0;
    if ((st = stall_from_env(&pg->stall_s)) || !(pg->peers = calloc(size, sizeof *pg->peers))) {
        free(pg->ranks);
        free(pg);
        return st ? st : dp_fail(DP_ERR_MEMORY, "new_group: out of memory");
    }
    pthread_mutex_init(&pg->mu, NULL);
    pthread_cond_init(&pg->cv, NULL);
    proc_sigpipe_guard guard;
    proc_sigpipe_block(&guard);   /* Gloo's device thread starts here and keeps this mask */
    st = make_backend(pg, backend);
    proc_sigpipe_restore(&guard);
    if (st) {
        pthread_mutex_destroy(&pg->mu);
        pthread_cond_destroy(&pg->cv);
        free(pg->peers);
        free(pg->ranks);
        free(pg);
        return st;
    }
    store_retain(store);   /* the heartbeat and the keys use it until dp_pg_free */
    live_add(pg);
    *out = pg;
    return DP_OK;
}

void pg_retain(dp_pg *pg)
{
    __atomic_add_fetch(&pg->holders, 1, __ATOMIC_RELAXED);
}

/* What destroy_process_group ends, once: queued ops are waited for (each
 * ends within the timeout, or at once on a broken group), the worker and
 * the heartbeat stop, the transport is freed and the store given back (so
 * that a new group may serve its port); a holder's later op finds the
 * group broken. */
static void pg_teardown(dp_pg *pg)
{
    if (pg->torn_down)
        return;
    pg->torn_down = 1;
    live_remove(pg);
    pthread_mutex_lock(&pg->mu);
    pg->stop = 1;
    pthread_cond_broadcast(&pg->cv);
    pthread_mutex_unlock(&pg->mu);
    if (pg->started)
        pthread_join(pg->thread, NULL);
    if (pg->finisher_started)
        pthread_join(pg->finisher, NULL);
    pg_heartbeat_stop(pg);
    free_parked(pg);
    proc_sigpipe_guard guard;
    proc_sigpipe_block(&guard);
    if (pg->impl)
        pg->free_impl(pg->impl);
    pg->impl = NULL;
    proc_sigpipe_restore(&guard);
    dp_store_close(pg->store);   /* this group's reference: the last one closes it */
    pg->store = NULL;
    pthread_mutex_lock(&pg->mu);
    if (!pg->broken) {
        pg->broken = DP_ERR_STATE;
        snprintf(pg->broken_msg, sizeof pg->broken_msg, "process group %s was destroyed (destroy_process_group)",
                 pg->name);
    }
    pthread_mutex_unlock(&pg->mu);
}

void pg_release(dp_pg *pg)
{
    if (!pg || __atomic_fetch_sub(&pg->holders, 1, __ATOMIC_ACQ_REL) > 0)
        return;   /* (another holder still has it) */
    pg_teardown(pg);
    pthread_mutex_destroy(&pg->mu);
    pthread_cond_destroy(&pg->cv);
    free(pg->peers);
    free(pg->ranks);
    free(pg);
}

void dp_pg_free(dp_pg *pg)
{
    if (!pg)
        return;
    pg_teardown(pg);
    pg_release(pg);
}
