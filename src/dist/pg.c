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
 * Diagnosis. Each rank records the sequence number of the last collective
 * it entered under dplua/<group>/progress/<rank>. Not before every op: a
 * store round trip (~10 us on loopback) is a quarter of a small Gloo
 * all_reduce there, and rank 0's store thread would serve every rank's
 * every op. A heartbeat thread per group publishes it instead, at most
 * every 50 ms and only when it changed, which is fresh enough for a
 * diagnosis made after a timeout of seconds. The store server sets
 * dplua/dead/<rank> when a rank's connection drops. When an op fails, the
 * failing rank reads both to say which ranks did not arrive and which are
 * dead. With DPLUA_DIST_DEBUG=1 every rank also publishes a fingerprint of
 * each collective (dplua/<group>/fp/<seq>/<rank>) and compares all of
 * them before running it, so mismatched calls fail at once on every rank
 * naming both sides.
 *
 * Threads. The dp_pg_* calls of one group are meant for one thread (Lua's).
 * Tensors of an async op are retained by the caller and released by the
 * caller's thread (dp_work_wait/dp_work_free, or the next call on the
 * group), never by the worker: tensor refcounts are not atomic.
 */
#include "config.h"

#include "dist/pg.h"
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

#define PG_MSG 1024
#define PG_NAME 96

typedef dp_status (*pg_run_fn)(void *impl, const pg_op *op, char *err, size_t errlen);
typedef void (*pg_free_fn)(void *impl);

struct dp_work {
    dp_pg *pg;
    pg_op op;
    dp_tensor *hold[2];      /* retained by the caller (async ops only) */
    atomic_int done;
    int orphaned;            /* dp_work_free came first: the worker parks it */
    int heap;                /* malloc'd (async) or on the caller's stack (sync) */
    dp_status status;
    char msg[PG_MSG];
    dp_work *next;
};

struct dp_pg {
    int holders;                     /* references besides the creator's (pg_retain: a DDP's); freed at the last */
    int torn_down;                   /* pg_teardown ran: ops fail as broken */
    char name[PG_NAME];
    char prefix[PG_NAME + 16];       /* "dplua/<name>/" */
    const char *backend;
    int rank, size;
    int *ranks;                      /* global rank of each member */
    dp_store *store;
    double timeout_s;
    int debug;
    uint64_t seq;                    /* collectives issued (caller's thread) */

    void *impl;
    pg_run_fn run;
    pg_free_fn free_impl;

    pthread_mutex_t mu;
    pthread_cond_t cv;
    dp_work *head, *tail;            /* the FIFO */
    int busy;                        /* an op is running (worker or caller) */
    int stop, started;
    pthread_t thread;
    atomic_uint_fast64_t entered;    /* the last collective this rank entered */
    int hb_started;
    pthread_t hb_thread;
    pthread_cond_t hb_cv;
    dp_work *parked;                 /* finished orphans, freed by the caller */

    dp_status broken;                /* set once, under mu, by the running op */
    char broken_msg[PG_MSG];
};

static const char *const kind_names[] = {
    "all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter",
    "all_to_all", "send", "recv", "barrier"
};
static const char *const redop_names[] = { "SUM", "AVG", "MAX", "MIN", "PRODUCT" };

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* "rank 3" in the default group, "rank 3 (group rank 1)" in a subgroup. */
static const char *rank_str(const dp_pg *pg, int r, char *buf, size_t len)
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
    const char *k = kind_names[op->kind];
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
    case PG_BROADCAST:
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

/* Starts the heartbeat with the group's first collective; caller's thread. */
static void heartbeat_start(dp_pg *pg)
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

/* ---------------------------------------------------------------- diagnosis */

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
static void diagnose(dp_pg *pg, const pg_op *op, int peer_lost, char *msg)
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
                ns += snprintf(since + ns, sizeof since - ns, "%s%s", ns ? ", " : "", rank_str(pg, r, rs, sizeof rs));
            continue;
        }
        if (dead[r]) {
            n += snprintf(msg + n, PG_MSG - n, "; %s is dead (its connection to the store closed)",
                          rank_str(pg, r, rs, sizeof rs));
            nlate++;
            continue;
        }
        if ((peer_lost && ndead) || arrived)
            continue;
        nlate++;
        if (p2p)
            n += snprintf(msg + n, PG_MSG - n, "; %s did not %s %lld %s elements with tag %d in time",
                          rank_str(pg, r, rs, sizeof rs), op->kind == PG_SEND ? "receive" : "send",
                          (long long)op->count, dp_dtype_name(op->dtype), op->tag);
        else if (p < 0)
            n += snprintf(msg + n, PG_MSG - n, "; %s did not arrive (it has entered no collective on this group)",
                          rank_str(pg, r, rs, sizeof rs));
        else
            n += snprintf(msg + n, PG_MSG - n, "; %s did not arrive (the last collective it entered is #%lld)",
                          rank_str(pg, r, rs, sizeof rs), p);
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
        n += snprintf(msg + n, PG_MSG - n, "; %s reported: %.400s", rank_str(pg, r, rs, sizeof rs), v);
        free(v);
    }
}

/* "all_reduce #5 on group default (rank 0 of 2)" */
static int op_title(const dp_pg *pg, const pg_op *op, char *buf, size_t len)
{
    char rs[64];
    if (op->seq)
        return snprintf(buf, len, "%s #%llu on group %s (%s of %d)", kind_names[op->kind],
                        (unsigned long long)op->seq, pg->name, rank_str(pg, pg->rank, rs, sizeof rs), pg->size);
    return snprintf(buf, len, "%s on group %s (%s of %d)", kind_names[op->kind], pg->name,
                    rank_str(pg, pg->rank, rs, sizeof rs), pg->size);
}

/* ---------------------------------------------------------------- debug mode */

/* Publishes this rank's fingerprint of op and compares every rank's with
 * group rank 0's; the first difference fails on every rank with the same
 * words. A rank that does not publish within the timeout did not arrive. */
static dp_status check_fingerprints(dp_pg *pg, const pg_op *op, char *msg)
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
                     "#%llu within %g s", (unsigned long long)op->seq, pg->name, rank_str(pg, pg->rank, rs0, sizeof rs0),
                     mine, rank_str(pg, r, rs, sizeof rs), (unsigned long long)op->seq, pg->timeout_s);
            diagnose(pg, op, 0, msg);
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
                     (unsigned long long)op->seq, pg->name, rank_str(pg, 0, rs0, sizeof rs0), fps[0],
                     rank_str(pg, r, rs, sizeof rs), fps[r]);
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

/* ---------------------------------------------------------------- SIGPIPE */

/* Gloo writes to its sockets without MSG_NOSIGNAL, so a write to a peer
 * that died raises SIGPIPE, whose default action ends the process before
 * any error can be reported. SIGPIPE from a write is sent to the writing
 * thread: Gloo's threads (its device loop inherits the mask of the thread
 * that makes the group) and the group's worker block it for good; the
 * caller's thread blocks it only while it runs an op, then takes back a
 * SIGPIPE that became pending meanwhile, so the process's own handling of
 * SIGPIPE (e.g. `dplua script | head`) is unchanged. */
typedef struct {
    sigset_t old;
    int blocked;
} sigpipe_guard;

static void sigpipe_block(sigpipe_guard *g)
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &set, &g->old);
    g->blocked = !sigismember(&g->old, SIGPIPE);
}

static void sigpipe_restore(sigpipe_guard *g)
{
    if (!g->blocked)
        return;   /* it was blocked before: leave whatever is pending alone */
    sigset_t set, pending;
    sigemptyset(&set);
    sigaddset(&set, SIGPIPE);
    if (sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE)) {
        struct timespec zero = { 0, 0 };
        while (sigtimedwait(&set, NULL, &zero) < 0 && errno == EINTR) {
        }
    }
    pthread_sigmask(SIG_SETMASK, &g->old, NULL);
}

/* ---------------------------------------------------------------- running an op */

/* Breaks the group with msg, and leaves msg in the store for the other
 * ranks' diagnosis (this rank may be gone by the time they look). */
static void set_broken(dp_pg *pg, dp_status st, const char *msg)
{
    char key[PG_NAME + 64];
    key_error(pg, pg->rank, key, sizeof key);
    (void)pg_store_set(pg->store, key, msg, strlen(msg));
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

/* Runs w's op to completion on the calling thread; only one thread runs
 * a group's ops at a time (pg->busy). Leaves the result in w. */
static void execute(dp_pg *pg, dp_work *w)
{
    pg_op *op = &w->op;
    pthread_mutex_lock(&pg->mu);
    dp_status broken = pg->broken;
    if (broken)
        snprintf(w->msg, sizeof w->msg, "%s", pg->broken_msg);
    pthread_mutex_unlock(&pg->mu);
    if ((w->status = broken))
        return;
    if (op->seq) {
        atomic_store(&pg->entered, op->seq);
        if (pg->debug && (w->status = check_fingerprints(pg, op, w->msg))) {
            set_broken(pg, w->status, w->msg);
            return;
        }
    }
    char err[PG_MSG / 2];
    err[0] = 0;
    w->status = pg->run(pg->impl, op, err, sizeof err);
    if (!w->status)
        return;
    int n = op_title(pg, op, w->msg, sizeof w->msg);
    snprintf(w->msg + n, sizeof w->msg - n, " failed: %s", err);
    diagnose(pg, op, peer_lost(err), w->msg);
    set_broken(pg, w->status, w->msg);
}

static void release_holds(dp_work *w)
{
    for (int i = 0; i < 2; i++) {
        dp_tensor_release(w->hold[i]);
        w->hold[i] = NULL;
    }
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

static void *worker_main(void *arg)
{
    dp_pg *pg = arg;
    sigpipe_guard guard;
    sigpipe_block(&guard);   /* for the thread's life */
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
        sigpipe_guard guard;
        sigpipe_block(&guard);
        execute(pg, w);
        sigpipe_restore(&guard);
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
    /* a GPU Linear waiting for its next op (src/core/gpu.c) is launched
     * here, on the caller's thread, before the worker orders the
     * collective after the current stream's work */
    dp_cuda_launch_deferred();
    pthread_mutex_lock(&pg->mu);
    dp_status broken = pg->broken;
    pthread_mutex_unlock(&pg->mu);
    if (broken)
        return dp_fail(broken, "%s", pg->broken_msg);
    if (op->seq)
        heartbeat_start(pg);
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
        return dp_fail(DP_ERR_MEMORY, "%s: out of memory", kind_names[op->kind]);
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

static dp_status check_redop(const char *fn, int op, int dtype)
{
    if (op < DP_RED_SUM || op > DP_RED_PRODUCT)
        return dp_fail(DP_ERR_ARG, "%s: unknown reduce op %d (expected SUM, AVG, MAX, MIN or PRODUCT)", fn, op);
    if (op == DP_RED_AVG && !dp_dtype_is_floating(dtype))
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
static dp_status in_place(dp_pg *pg, int kind, dp_tensor *t, int root, int redop, dp_work **work)
{
    const char *fn = kind_names[kind];
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

dp_status dp_pg_all_reduce(dp_pg *pg, dp_tensor *t, int op, dp_work **work)
{
    return in_place(pg, PG_ALL_REDUCE, t, 0, op, work);
}

dp_status dp_pg_broadcast(dp_pg *pg, dp_tensor *t, int root, dp_work **work)
{
    return in_place(pg, PG_BROADCAST, t, root, 0, work);
}

dp_status dp_pg_reduce(dp_pg *pg, dp_tensor *t, int root, int op, dp_work **work)
{
    return in_place(pg, PG_REDUCE, t, root, op, work);
}

/* all_gather and reduce_scatter: one tensor holds a part per rank (the
 * whole: all_gather's output, reduce_scatter's input), the other one part. */
static dp_status by_parts(dp_pg *pg, int kind, dp_tensor *out, dp_tensor *in, int redop, dp_work **work)
{
    const char *fn = kind_names[kind];
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
    return by_parts(pg, PG_ALL_GATHER, out, in, 0, work);
}

dp_status dp_pg_reduce_scatter(dp_pg *pg, dp_tensor *out, dp_tensor *in, int op, dp_work **work)
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
    const char *fn = kind_names[kind];
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
    pthread_mutex_init(&pg->mu, NULL);
    pthread_cond_init(&pg->cv, NULL);
    sigpipe_guard guard;
    sigpipe_block(&guard);   /* Gloo's device thread starts here and keeps this mask */
    st = make_backend(pg, backend);
    sigpipe_restore(&guard);
    if (st) {
        pthread_mutex_destroy(&pg->mu);
        pthread_cond_destroy(&pg->cv);
        free(pg->ranks);
        free(pg);
        return st;
    }
    store_retain(store);   /* the heartbeat and the keys use it until dp_pg_free */
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
    pthread_mutex_lock(&pg->mu);
    pg->stop = 1;
    pthread_cond_broadcast(&pg->cv);
    pthread_mutex_unlock(&pg->mu);
    if (pg->started)
        pthread_join(pg->thread, NULL);
    if (pg->hb_started) {
        pthread_mutex_lock(&pg->mu);
        pthread_cond_broadcast(&pg->hb_cv);
        pthread_mutex_unlock(&pg->mu);
        pthread_join(pg->hb_thread, NULL);
        pthread_cond_destroy(&pg->hb_cv);
    }
    free_parked(pg);
    sigpipe_guard guard;
    sigpipe_block(&guard);
    if (pg->impl)
        pg->free_impl(pg->impl);
    pg->impl = NULL;
    sigpipe_restore(&guard);
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
