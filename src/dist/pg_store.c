/*
 * pg_store.c — what process groups keep in the store, and what they read
 * back from it when an op fails.
 *
 * Access. The store is one connection shared by every group's worker
 * thread and the caller's: pg_store_* take one process-wide lock per call,
 * and the calls that wait poll (lock, check, unlock, sleep) so that no
 * thread holds the lock while it waits for another rank.
 *
 * Progress. Each rank records the sequence number of the last collective
 * it entered under dplua/<group>/progress/<rank>. Not before every op: a
 * store round trip (~10 us on loopback) is a quarter of a small Gloo
 * all_reduce there, and rank 0's store thread would serve every rank's
 * every op. A heartbeat thread per group publishes it instead, at most
 * every 50 ms and only when it changed, which is fresh enough for a
 * diagnosis made after a timeout of seconds.
 *
 * Diagnosis. The store server sets dplua/dead/<rank> when a rank's
 * connection drops, and a rank whose op failed leaves its message under
 * dplua/<group>/error/<rank>. When an op fails, the failing rank reads
 * them to say which ranks did not arrive, which are dead and what they
 * reported.
 *
 * Debug mode. With DPLUA_DIST_DEBUG=1 every rank also publishes a
 * fingerprint of each collective (dplua/<group>/fp/<seq>/<rank>) and
 * compares all of them before running it, so mismatched calls fail at
 * once on every rank naming both sides.
 */
#include "dist/pg_group.h"
#include "core/tensor.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* PyTorch's names of the reductions that collectives take */
static const char *const redop_names[DP_NUM_REDOPS] = {
    [DP_SUM] = "SUM", [DP_MEAN] = "AVG", [DP_PROD] = "PRODUCT", [DP_MAX] = "MAX", [DP_MIN] = "MIN",
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

const char *pg_rank_str(const dp_pg *pg, int r, char *buf, size_t len)
{
    if (pg->ranks[r] == r)
        snprintf(buf, len, "rank %d", r);
    else
        snprintf(buf, len, "rank %d (group rank %d)", pg->ranks[r], r);
    return buf;
}


/* ---------------------------------------------------------------- fingerprints */

/* What a collective looks like from one rank: "all_reduce(float32, 10
 * elements, SUM)", "broadcast(float32, 10 elements, root 0)". Counts are
 * those of the per-rank tensor (all_gather: the input). */
static void fingerprint(const pg_op *op, char *buf, size_t len)
{
    const char *k = pg_kind_names[op->kind];
    const char *dt = dp_dtype_name(op->dtype);
    long long n = (long long)op->count;
    switch (op->kind) {
    case PG_BARRIER:
        snprintf(buf, len, "barrier()");
        break;
    case PG_ALL_REDUCE: case PG_REDUCE_SCATTER:
        snprintf(buf, len, "%s(%s, %lld elements, %s)", k, dt, n, redop_names[op->redop]);
        break;
    case PG_REDUCE:
        snprintf(buf, len, "%s(%s, %lld elements, %s, root %d)", k, dt, n, redop_names[op->redop], op->root);
        break;
    case PG_BROADCAST: case PG_GATHER: case PG_SCATTER:
        snprintf(buf, len, "%s(%s, %lld elements, root %d)", k, dt, n, op->root);
        break;
    default:
        snprintf(buf, len, "%s(%s, %lld elements)", k, dt, n);
        break;
    }
}

/* ---------------------------------------------------------------- store access */

static pthread_mutex_t store_mu = PTHREAD_MUTEX_INITIALIZER;

dp_status pg_store_set(dp_store *s, const char *key, const void *value, size_t len)
{
    pthread_mutex_lock(&store_mu);
    dp_status st = dp_store_set(s, key, value, len);
    pthread_mutex_unlock(&store_mu);
    return st;
}

dp_status pg_store_check(dp_store *s, const char *const *keys, int n, int *all_present)
{
    pthread_mutex_lock(&store_mu);
    dp_status st = dp_store_check(s, keys, n, all_present);
    pthread_mutex_unlock(&store_mu);
    return st;
}

dp_status pg_store_delete(dp_store *s, const char *key)
{
    int deleted;
    pthread_mutex_lock(&store_mu);
    dp_status st = dp_store_delete(s, key, &deleted);
    pthread_mutex_unlock(&store_mu);
    return st;
}

/* Polls until every key is there: 20 us at first, backing off to 5 ms. */
dp_status pg_store_wait(dp_store *s, const char *const *keys, int n, double timeout_s)
{
    double deadline = now_s() + timeout_s;
    useconds_t nap = 20;
    for (;;) {
        int present = 0;
        dp_status st = pg_store_check(s, keys, n, &present);
        if (st || present)
            return st;
        if (now_s() >= deadline) {
            char list[256];
            size_t k = 0;
            list[0] = 0;
            for (int i = 0; i < n && k < sizeof list; i++)
                k += snprintf(list + k, sizeof list - k, i ? ", '%s'" : "'%s'", keys[i]);
            return dp_fail(DP_ERR_IO, "store: %s did not appear within %g s", list, timeout_s);
        }
        usleep(nap);
        nap = nap < 5000 ? nap * 2 : 5000;
    }
}

dp_status pg_store_get(dp_store *s, const char *key, void **value, size_t *len, double timeout_s)
{
    const char *keys[1] = { key };
    dp_status st = pg_store_wait(s, keys, 1, timeout_s);
    if (st)
        return st;
    pthread_mutex_lock(&store_mu);
    st = dp_store_get(s, key, value, len, 1.0);
    pthread_mutex_unlock(&store_mu);
    return st;
}

/* ---------------------------------------------------------------- store keys */

static void key_progress(const dp_pg *pg, int r, char *buf, size_t len)
{
    snprintf(buf, len, "%sprogress/%d", pg->prefix, r);
}

static void key_fp(const dp_pg *pg, uint64_t seq, int r, char *buf, size_t len)
{
    snprintf(buf, len, "%sfp/%llu/%d", pg->prefix, (unsigned long long)seq, r);
}

static void key_error(const dp_pg *pg, int r, char *buf, size_t len)
{
    snprintf(buf, len, "%serror/%d", pg->prefix, r);
}

static void key_dead(const dp_pg *pg, int r, char *buf, size_t len)
{
    snprintf(buf, len, "dplua/dead/%d", pg->ranks[r]);
}

/* The value of a key that is there now (check, then a short get), or
 * NULL. *store_ok is cleared when the store itself did not answer. */
static char *peek(dp_pg *pg, const char *key, int *store_ok)
{
    const char *keys[1] = { key };
    int present = 0;
    void *v = NULL;
    size_t n = 0;
    if (pg_store_check(pg->store, keys, 1, &present)) {
        *store_ok = 0;
        return NULL;
    }
    if (!present || pg_store_get(pg->store, key, &v, &n, 1.0))
        return NULL;
    char *s = malloc(n + 1);
    if (s) {
        memcpy(s, v, n);
        s[n] = 0;
    }
    dp_free(v);
    return s;
}

static int is_dead(dp_pg *pg, int r, int *store_ok)
{
    char key[PG_NAME + 64];
    key_dead(pg, r, key, sizeof key);
    char *v = peek(pg, key, store_ok);
    free(v);
    return v != NULL;
}

/* The seq rank r last entered, or -1 if it never entered one. */
static long long progress_of(dp_pg *pg, int r, int *store_ok)
{
    char key[PG_NAME + 64];
    key_progress(pg, r, key, sizeof key);
    char *v = peek(pg, key, store_ok);
    long long s = v ? atoll(v) : -1;
    free(v);
    return s;
}

static void publish_progress(dp_pg *pg, uint64_t seq)
{
    char key[PG_NAME + 64], val[32];
    key_progress(pg, pg->rank, key, sizeof key);
    int n = snprintf(val, sizeof val, "%llu", (unsigned long long)seq);
    (void)pg_store_set(pg->store, key, val, (size_t)n);   /* best effort: only diagnosis reads it */
}

#define PG_HEARTBEAT_S 0.05

/* Publishes pg->entered every PG_HEARTBEAT_S when it changed (and at
 * once the first time), until dp_pg_free. */
static void *heartbeat_main(void *arg)
{
    dp_pg *pg = arg;
    uint64_t published = 0;
    pthread_mutex_lock(&pg->mu);
    while (!pg->stop) {
        uint64_t seq = atomic_load(&pg->entered);
        if (seq != published) {
            pthread_mutex_unlock(&pg->mu);
            publish_progress(pg, seq);
            published = seq;
            pthread_mutex_lock(&pg->mu);
            continue;
        }
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        long ns = until.tv_nsec + (long)(PG_HEARTBEAT_S * 1e9);
        until.tv_sec += ns / 1000000000L;
        until.tv_nsec = ns % 1000000000L;
        pthread_cond_timedwait(&pg->hb_cv, &pg->mu, &until);
    }
    pthread_mutex_unlock(&pg->mu);
    return NULL;
}

void pg_heartbeat_start(dp_pg *pg)
{
    if (pg->hb_started)
        return;
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&pg->hb_cv, &attr);
    pthread_condattr_destroy(&attr);
    if (pthread_create(&pg->hb_thread, NULL, heartbeat_main, pg) == 0)
        pg->hb_started = 1;
    else
        pthread_cond_destroy(&pg->hb_cv);   /* no diagnosis by progress, nothing worse */
}

void pg_heartbeat_stop(dp_pg *pg)
{
    if (!pg->hb_started)
        return;
    pthread_mutex_lock(&pg->mu);
    pthread_cond_broadcast(&pg->hb_cv);
    pthread_mutex_unlock(&pg->mu);
    pthread_join(pg->hb_thread, NULL);
    pthread_cond_destroy(&pg->hb_cv);
    pg->hb_started = 0;
}

/* ---------------------------------------------------------------- diagnosis */

void pg_publish_error(dp_pg *pg, const char *msg)
{
    char key[PG_NAME + 64];
    key_error(pg, pg->rank, key, sizeof key);
    (void)pg_store_set(pg->store, key, msg, strlen(msg));
}

/* The first rank in [lo, hi) other than this one (and, given `only`,
 * with only[r] set) that left an error message in the store, or -1; the
 * message goes to *text (malloc'ed) when text is not NULL. */
static int first_reporter(dp_pg *pg, int lo, int hi, const int *only, char **text)
{
    int store_ok = 1;
    for (int r = lo; r < hi && store_ok; r++) {
        if (r == pg->rank || (only && !only[r]))
            continue;
        char key[PG_NAME + 64];
        key_error(pg, r, key, sizeof key);
        char *v = peek(pg, key, &store_ok);
        if (v) {
            if (text)
                *text = v;
            else
                free(v);
            return r;
        }
    }
    return -1;
}

/* Waits up to `wait` seconds for a rank in [lo, hi) other than this one
 * to show up dead (the store server sees a lost connection a moment after
 * the peers do) or to leave an error message (a rank that failed first
 * closes its connections; its message may land a moment after); fills
 * dead[] and *failed (the rank with a message, or -1). Returns the number
 * of dead ranks, or -1 when the store itself did not answer. */
static int find_dead(dp_pg *pg, int lo, int hi, double wait, int *dead, int *failed)
{
    double until = now_s() + wait;
    int store_ok = 1;
    for (;;) {
        int ndead = 0;
        for (int r = lo; r < hi; r++) {
            dead[r] = r != pg->rank && is_dead(pg, r, &store_ok);
            if (!store_ok)
                return -1;
            ndead += dead[r];
        }
        *failed = wait > 0 ? first_reporter(pg, lo, hi, NULL, NULL) : -1;
        if (ndead || *failed >= 0 || now_s() >= until)
            return ndead;
        usleep(50000);
    }
}

/* Appends to msg (of capacity PG_MSG) what the store says about the other
 * ranks when `op` failed. After a lost connection: the dead ranks (the
 * others may simply not be there yet). After a timeout: the ranks that did
 * not arrive, dead or not; if every rank arrived, that the ranks called
 * different collectives (a rank that arrived and then exited, e.g. on that
 * same error, is not the cause). For send/recv only the peer is looked at. */
void pg_diagnose(dp_pg *pg, const pg_op *op, int peer_lost, char *msg)
{
    size_t n = strlen(msg);
    char rs[64], since[PG_MSG / 4];
    int p2p = op->kind == PG_SEND || op->kind == PG_RECV;
    int lo = p2p ? op->root : 0, hi = p2p ? op->root + 1 : pg->size;
    int dead[pg->size];
    /* After a lost connection, a peer that failed first (e.g. timed out on
     * this same op) and closed its connections explains it as well as a
     * dead one: its message is quoted even though it is alive. */
    int failed_peer;
    int ndead = find_dead(pg, lo, hi, peer_lost ? (pg->timeout_s < 2.0 ? pg->timeout_s : 2.0) : 0, dead, &failed_peer);
    if (ndead < 0) {
        snprintf(msg + n, PG_MSG - n, "; the store did not answer either (rank 0, which serves it, has exited or died)");
        return;
    }
    int nlate = 0, store_ok = 1;
    size_t ns = 0;
    since[0] = 0;
    for (int r = lo; r < hi && n < PG_MSG; r++) {
        if (r == pg->rank)
            continue;
        long long p = p2p ? -1 : progress_of(pg, r, &store_ok);
        int arrived = !p2p && p >= 0 && (uint64_t)p >= op->seq;
        if (dead[r] && arrived) {
            if (ns < sizeof since)
                ns += snprintf(since + ns, sizeof since - ns, "%s%s", ns ? ", " : "", pg_rank_str(pg, r, rs, sizeof rs));
            continue;
        }
        if (dead[r]) {
            n += snprintf(msg + n, PG_MSG - n, "; %s is dead (its connection to the store closed)",
                          pg_rank_str(pg, r, rs, sizeof rs));
            nlate++;
            continue;
        }
        if ((peer_lost && ndead) || arrived)
            continue;
        nlate++;
        if (p2p)
            n += snprintf(msg + n, PG_MSG - n, "; %s did not %s %lld %s elements with tag %d in time",
                          pg_rank_str(pg, r, rs, sizeof rs), op->kind == PG_SEND ? "receive" : "send",
                          (long long)op->count, dp_dtype_name(op->dtype), op->tag);
        else if (p < 0)
            n += snprintf(msg + n, PG_MSG - n, "; %s did not arrive (it has entered no collective on this group)",
                          pg_rank_str(pg, r, rs, sizeof rs));
        else
            n += snprintf(msg + n, PG_MSG - n, "; %s did not arrive (the last collective it entered is #%lld)",
                          pg_rank_str(pg, r, rs, sizeof rs), p);
    }
    if (!p2p && !nlate && !peer_lost && n < PG_MSG)
        n += snprintf(msg + n, PG_MSG - n, "; every rank entered #%llu, so the ranks called different collectives "
                      "or sizes here (run with DPLUA_DIST_DEBUG=1 to name them)", (unsigned long long)op->seq);
    if (ns && n < PG_MSG)
        n += snprintf(msg + n, PG_MSG - n, "; %s entered #%llu and exited since", since,
                      (unsigned long long)op->seq);
    /* a rank that failed before it exited, or before it closed its
     * connection to this one, left its message */
    char *v = NULL;
    int r = store_ok && n < PG_MSG ? first_reporter(pg, lo, hi, failed_peer >= 0 ? NULL : dead, &v) : -1;
    if (r >= 0) {
        n += snprintf(msg + n, PG_MSG - n, "; %s reported: %.400s", pg_rank_str(pg, r, rs, sizeof rs), v);
        free(v);
    }
}

/* ---------------------------------------------------------------- debug mode */

/* Publishes this rank's fingerprint of op and compares every rank's with
 * group rank 0's; the first difference fails on every rank with the same
 * words. A rank that does not publish within the timeout did not arrive. */
dp_status pg_check_fingerprints(dp_pg *pg, const pg_op *op, char *msg)
{
    char key[PG_NAME + 64], mine[160], rs[64], rs0[64];
    fingerprint(op, mine, sizeof mine);
    key_fp(pg, op->seq, pg->rank, key, sizeof key);
    if (pg_store_set(pg->store, key, mine, strlen(mine))) {
        snprintf(msg, PG_MSG, "collective check at #%llu on group %s: %s", (unsigned long long)op->seq,
                 pg->name, dp_last_error());
        return DP_ERR_IO;
    }
    char *fps[pg->size];
    memset(fps, 0, sizeof fps);
    dp_status st = DP_OK;
    double deadline = now_s() + pg->timeout_s;
    for (int r = 0; r < pg->size && !st; r++) {
        void *v = NULL;
        size_t n = 0;
        double left = deadline - now_s();
        key_fp(pg, op->seq, r, key, sizeof key);
        if (pg_store_get(pg->store, key, &v, &n, left > 0.001 ? left : 0.001)) {
            snprintf(msg, PG_MSG, "collective check at #%llu on group %s: %s called %s but %s did not reach "
                     "#%llu within %g s", (unsigned long long)op->seq, pg->name, pg_rank_str(pg, pg->rank, rs0, sizeof rs0),
                     mine, pg_rank_str(pg, r, rs, sizeof rs), (unsigned long long)op->seq, pg->timeout_s);
            pg_diagnose(pg, op, 0, msg);
            st = DP_ERR_IO;
            break;
        }
        fps[r] = malloc(n + 1);
        if (fps[r]) {
            memcpy(fps[r], v, n);
            fps[r][n] = 0;
        }
        dp_free(v);
        if (!fps[r])
            st = dp_fail(DP_ERR_MEMORY, "out of memory");
    }
    for (int r = 1; r < pg->size && !st; r++)
        if (strcmp(fps[r], fps[0]) != 0) {
            snprintf(msg, PG_MSG, "collective mismatch at #%llu on group %s: %s called %s but %s called %s",
                     (unsigned long long)op->seq, pg->name, pg_rank_str(pg, 0, rs0, sizeof rs0), fps[0],
                     pg_rank_str(pg, r, rs, sizeof rs), fps[r]);
            st = DP_ERR_STATE;
        }
    for (int r = 0; r < pg->size; r++)
        free(fps[r]);
    /* every rank has now published #seq, so all have read #seq-1: drop ours */
    if (!st && op->seq > 1) {
        key_fp(pg, op->seq - 1, pg->rank, key, sizeof key);
        (void)pg_store_delete(pg->store, key);
    }
    return st;
}
