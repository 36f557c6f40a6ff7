/*
 * pg.h — what src/dist/pg.c asks of a process-group backend.
 *
 * pg.c and pg_store.c own everything that does not depend on the
 * transport: argument and tensor checks, the sequence number, the group's
 * worker thread and its FIFO, progress keys and debug fingerprints, and
 * turning a backend failure into a message that names the op, the group
 * and the ranks that did not arrive. A backend only moves bytes: it gets a
 * pg_op of plain pointers and counts and runs it to completion (or to its
 * timeout) on the calling thread. gloo.cc is C++, so this header stays
 * plain C inside extern "C".
 */
#ifndef DP_DIST_PG_H
#define DP_DIST_PG_H

#include "dplua.h"

#ifdef __cplusplus
extern "C" {
#endif

enum pg_kind {
    PG_ALL_REDUCE, PG_BROADCAST, PG_REDUCE, PG_ALL_GATHER, PG_REDUCE_SCATTER,
    PG_ALL_TO_ALL, PG_SEND, PG_RECV, PG_BARRIER, PG_GATHER, PG_SCATTER, PG_P2P
};

/* One send or receive of a PG_P2P op: count elements of dtype at buf, to
 * or from group rank peer, matched by tag as send/recv are. */
typedef struct pg_p2p {
    int send;
    int peer;
    int tag;
    dp_dtype dtype;
    int64_t count;
    void *buf;
} pg_p2p;

/* One operation as a backend sees it. Counts are elements of `dtype`:
 *   all_reduce, broadcast, reduce, send, recv: in == out, count elements
 *   all_gather:     in count, out size * count
 *   reduce_scatter: in size * count, out count
 *   all_to_all:     in and out size * count (count per peer)
 *   gather:         in count, out size * count (on the root; NULL elsewhere)
 *   scatter:        in size * count (on the root; NULL elsewhere), out count
 * root is a group rank: the broadcast/reduce/gather/scatter root, the send
 * destination or the recv source. DP_MEAN (AVG) on an integer dtype never
 * reaches a backend.
 *
 * PG_P2P (isend, irecv, batch_isend_irecv) is nparts sends and receives
 * that must be able to meet the peers' in any order: run posts all of them
 * and returns without waiting, leaving in *pending a handle that the
 * backend's finish function waits on (on another thread, while the group
 * runs later ops) and frees. */
typedef struct pg_op {
    int kind;
    dp_dtype dtype;
    int device;     /* DP_CPU or the CUDA device of the tensors */
    int64_t count;
    void *in, *out;
    int root;
    dp_redop redop; /* DP_SUM, DP_MEAN, DP_PROD, DP_MAX or DP_MIN */
    int tag;        /* send/recv */
    uint64_t seq;   /* 1-based collective number; 0 for send/recv */
    int nparts;     /* PG_P2P */
    const pg_p2p *parts;
    void **pending;
} pg_op;

/* Backends report failure as a status plus a message in err (which pg.c
 * wraps with the op's name, seq and group). They never call dp_fail: the
 * worker thread's error buffer is not the caller's. */

/* pg.c: another reference to pg (a DistributedDataParallel's), given
 * back by pg_release. dp_pg_free (destroy_process_group) ends the group at
 * once (its threads, transport and store; a holder's later op then fails,
 * "destroyed") and frees its memory after the last holder. */
void pg_retain(dp_pg *pg);
void pg_release(dp_pg *pg);

/* pg_store.c: the store as process groups use it. Groups call it from
 * their worker threads as well as the caller's, and a dp_store is one
 * connection: every call takes one process-wide lock, and the calls that
 * wait poll (lock, check, unlock, sleep) so that no thread holds the lock
 * while it waits for another rank. */
dp_status pg_store_set(dp_store *s, const char *key, const void *value, size_t len);
dp_status pg_store_get(dp_store *s, const char *key, void **value, size_t *len, double timeout_s);
dp_status pg_store_wait(dp_store *s, const char *const *keys, int n, double timeout_s);
dp_status pg_store_check(dp_store *s, const char *const *keys, int n, int *all_present);
dp_status pg_store_delete(dp_store *s, const char *key);

/* ---- gloo.cc (DP_HAVE_GLOO): CPU pointers over Gloo's TCP transport ---- */
typedef struct pg_gloo pg_gloo;
/* prefix: the group's store prefix ("dplua/<name>/"); host: the address
 * this rank listens on; iface: a network interface name instead (or NULL). */
dp_status pg_gloo_new(pg_gloo **out, dp_store *store, const char *prefix, int rank, int size,
                      double timeout_s, const char *host, const char *iface, char *err, size_t errlen);
dp_status pg_gloo_run(pg_gloo *g, const pg_op *op, char *err, size_t errlen);
/* Waits until the PG_P2P op behind pending is done (or the timeout), and frees pending. */
dp_status pg_gloo_finish(pg_gloo *g, void *pending, char *err, size_t errlen);
void pg_gloo_free(pg_gloo *g);
/* Ends this rank's op running on another thread at once (it fails as if
 * its peers had closed their connections), and every later one: for a
 * group that found its ranks called mismatched collectives. */
void pg_gloo_abort(pg_gloo *g);

/* ---- nccl.c (DP_HAVE_NCCL and DP_HAVE_CUDA): device pointers ---- */
typedef struct pg_nccl pg_nccl;
/* Rank 0 makes the ncclUniqueId and sets it under prefix; the others get
 * it. The communicator itself is made by the first op, on the device of
 * its tensors (as PyTorch does: ranks pick their device after init). */
dp_status pg_nccl_new(pg_nccl **out, dp_store *store, const char *prefix, int rank, int size,
                      double timeout_s, char *err, size_t errlen);
dp_status pg_nccl_run(pg_nccl *n, const pg_op *op, char *err, size_t errlen);
dp_status pg_nccl_finish(pg_nccl *n, void *pending, char *err, size_t errlen);
void pg_nccl_free(pg_nccl *n);
/* Makes the op running on another thread abort the communicator at its
 * next poll, as a timeout would. */
void pg_nccl_abort(pg_nccl *n);

#ifdef __cplusplus
}
#endif
#endif /* DP_DIST_PG_H */
