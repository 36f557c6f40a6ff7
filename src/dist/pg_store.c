/*
 * pg_store.c — what process groups keep in the store, and what they read
 * back from it when an op fails.
 *
 * Access. The store is one connection shared by every group's worker
 * thread and the caller's: pg_store_* take one process-wide lock per call,
 * and the calls that wait poll (lock, check, unlock, sleep) so that no
 * thread holds the lock while it waits for another rank.
 *
 * Progress. Each rank keeps its state under dplua/<group>/progress/<rank>:
 * "<seq> <beat> in|done <fingerprint>", the last collective it entered,
 * whether it is still in it, what that collective is ("all_reduce(float32,
 * 10 elements, SUM)") and a count that grows with every publication. Not
 * written by the op itself: a store round trip (~10 us on loopback) is a
 * quarter of a small Gloo all_reduce there, and rank 0's store thread
 * would serve every rank's every op. The op only copies itself into the
 * group under the lock it takes anyway; a heartbeat thread per group
 * publishes the state within 50 ms of a change, and every 0.5 s when
 * nothing changed, so that a rank whose count stops is known to be frozen.
 *
 * Stalls. While this rank's collective has not completed for 0.5 s, its
 * heartbeat reads the other ranks' states every second (nothing is read
 * on a healthy step). Two ranks at the same seq with different
 * fingerprints called different collectives: that is certain whatever the
 * age of the reading, so once the collective has stalled for
 * DPLUA_DIST_STALL seconds (3 by default) the heartbeat breaks the group
 * with the message debug mode gives and aborts the transport, and every
 * rank's op fails within a second or two instead of at the timeout. So
 * does a rank stuck in another collective than this one (a different seq)
 * for that long. The readings also say which ranks are frozen (a beat
 * that stopped for 3 s while the rank's store connection stays open) for
 * the diagnosis of a timeout, and the heartbeat's and the diagnosis's own
 * store calls wait at most 2 s for a reply, so that a frozen rank 0 (whose
 * store then answers nothing) is named as such within the timeout.
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
#include "dist/store.h"
#include "core/tensor.h"

#include <inttypes.h>
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

#define PG_REPLY_S 2.0     /* the heartbeat's and the diagnosis's store calls wait this long for a reply */

/* Records whether the store answered a call made at `asked`: the time it
 * first stopped answering, 0 once it answers again. A store whose
 * connection was lost is dead, not silent. */
static void note_store(dp_pg *pg, int answered, double asked)
{
    int lost = !answered && store_lost(pg->store);
    pthread_mutex_lock(&pg->mu);
    if (answered || lost)
        pg->store_silent_at = 0;
    else if (!pg->store_silent_at)
        pg->store_silent_at = asked;
    pthread_mutex_unlock(&pg->mu);
}

/* How long the store has not answered (0: it answers, or is gone). */
static double store_silent_for(dp_pg *pg)
{
    pthread_mutex_lock(&pg->mu);
    double since = pg->store_silent_at;
    pthread_mutex_unlock(&pg->mu);
    return since > 0 ? now_s() - since : 0;
}

/* pg_store_set, waiting at most PG_REPLY_S for the reply. */
static dp_status quick_set(dp_pg *pg, const char *key, const void *value, size_t len)
{
    double asked = now_s();
    store_bound_replies(PG_REPLY_S);
    dp_status st = pg_store_set(pg->store, key, value, len);
    store_bound_replies(0);
    note_store(pg, !st, asked);
    return st;
}

/* The value of a key that is there now (check, then a short get), or
 * NULL. *store_ok is cleared when the store itself did not answer (within
 * PG_REPLY_S). */
static char *peek(dp_pg *pg, const char *key, int *store_ok)
{
    const char *keys[1] = { key };
    int present = 0;
    void *v = NULL;
    size_t n = 0;
    double asked = now_s();
    store_bound_replies(PG_REPLY_S);
    dp_status st = pg_store_check(pg->store, keys, 1, &present);
    store_bound_replies(0);
    note_store(pg, !st, asked);
    if (st) {
        *store_ok = 0;
        return NULL;
    }
    if (!present)
        return NULL;
    /* keys are not removed once set: get it at once (no second check) */
    pthread_mutex_lock(&store_mu);
    st = dp_store_get(pg->store, key, &v, &n, 1.0);
    pthread_mutex_unlock(&store_mu);
    if (st)
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

/* ---------------------------------------------------------------- states */

/* Keeps what a reading of rank r's state (v, or NULL: none) shows: when
 * its beat and its state last changed, on this rank's clock. */
static void observe(dp_pg *pg, int r, const char *v, double t)
{
    uint64_t seq, beat;
    int used = 0;
    if (!v || sscanf(v, "%" SCNu64 " %" SCNu64 " %n", &seq, &beat, &used) < 2 || !used)
        return;   /* nothing published (yet): nothing learned */
    char state[sizeof pg->peers[0].state];
    snprintf(state, sizeof state, "%" PRIu64 " %s", seq, v + used);
    pthread_mutex_lock(&pg->mu);
    pg_peer *p = &pg->peers[r];
    if (!p->beat_at || beat != p->beat) {
        p->beat = beat;
        p->beat_at = t;
    }
    if (strcmp(state, p->state) != 0) {
        snprintf(p->state, sizeof p->state, "%s", state);
        p->state_at = t;
    }
    pthread_mutex_unlock(&pg->mu);
}

/* The seq rank r last entered, 0 if none yet, or -1 if it published
 * nothing; the reading is kept (observe). */
static long long progress_of(dp_pg *pg, int r, int *store_ok)
{
    char key[PG_NAME + 64];
    key_progress(pg, r, key, sizeof key);
    char *v = peek(pg, key, store_ok);
    long long s = v ? atoll(v) : -1;
    observe(pg, r, v, now_s());
    free(v);
    return s;
}

/* Reads every other rank's state; 0 when the store did not answer. */
static int read_states(dp_pg *pg)
{
    int store_ok = 1;
    for (int r = 0; r < pg->size && store_ok; r++)
        if (r != pg->rank)
            (void)progress_of(pg, r, &store_ok);
    return store_ok;
}

/* How long rank r's beat has not changed, as far as this rank read it
 * (0 when it never read one). */
static double quiet_for(dp_pg *pg, int r)
{
    pthread_mutex_lock(&pg->mu);
    double at = pg->peers[r].beat_at;
    pthread_mutex_unlock(&pg->mu);
    return at > 0 ? now_s() - at : 0;
}

#define PG_PUBLISH_S 0.05  /* a changed state is published within this */
#define PG_BEAT_S 0.5      /* an unchanged one again this often */
#define PG_FROZEN_S 3.0    /* a rank whose beat did not change this long is frozen */
#define PG_WATCH_S 0.5     /* a collective not done after this has the others' states read... */
#define PG_READ_S 1.0      /* ...this often */

static void publish_state(dp_pg *pg, uint64_t seq, uint64_t beat, int in, const pg_op *op)
{
    char key[PG_NAME + 64], fp[160], val[200];
    key_progress(pg, pg->rank, key, sizeof key);
    fp[0] = 0;
    if (seq)
        fingerprint(op, fp, sizeof fp);
    int n = snprintf(val, sizeof val, "%" PRIu64 " %" PRIu64 " %s %s", seq, beat, in ? "in" : "done", fp);
    (void)quick_set(pg, key, val, (size_t)n);   /* best effort: only other ranks' checks read it */
}

/* Whether the states read show that the ranks called different
 * collectives, `op` being this rank's (in progress or just failed); the
 * message then in msg. Ranks at op's seq must all have one fingerprint
 * (those are certain: a seq's fingerprint never changes). With stuck_s >
 * 0, a rank still in a collective of another seq whose state has not
 * changed for stuck_s seconds is one too. */
static int find_mismatch(dp_pg *pg, const pg_op *op, double stuck_s, char *msg)
{
    char fps[pg->size][sizeof pg->peers[0].state];
    int at_seq[pg->size], stuck = -1;
    uint64_t stuck_seq = 0;
    double t = now_s();
    fingerprint(op, fps[pg->rank], sizeof fps[0]);
    pthread_mutex_lock(&pg->mu);
    for (int r = 0; r < pg->size; r++) {
        at_seq[r] = r == pg->rank;
        if (r == pg->rank)
            continue;
        const pg_peer *p = &pg->peers[r];
        uint64_t seq;
        int used = 0;
        char in[8];
        if (sscanf(p->state, "%" SCNu64 " %7s %n", &seq, in, &used) < 2 || !used)
            continue;
        snprintf(fps[r], sizeof fps[r], "%s", p->state + used);
        if (seq == op->seq)
            at_seq[r] = 1;
        else if (stuck_s > 0 && stuck < 0 && strcmp(in, "in") == 0 && t - p->state_at >= stuck_s) {
            stuck = r;
            stuck_seq = seq;
        }
    }
    pthread_mutex_unlock(&pg->mu);
    char rs[64], rs0[64];
    int a = -1;
    for (int r = 0; r < pg->size; r++) {
        if (!at_seq[r])
            continue;
        if (a < 0)
            a = r;
        else if (strcmp(fps[r], fps[a]) != 0) {
            snprintf(msg, PG_MSG, "collective mismatch at #%" PRIu64 " on group %s: %s called %s but %s called %s",
                     op->seq, pg->name, pg_rank_str(pg, a, rs0, sizeof rs0), fps[a], pg_rank_str(pg, r, rs, sizeof rs),
                     fps[r]);
            return 1;
        }
    }
    if (stuck < 0)
        return 0;
    snprintf(msg, PG_MSG, "collective mismatch on group %s: %s is in #%" PRIu64 ", %s, but %s is in #%" PRIu64
             ", %s, and neither has moved for %g s", pg->name, pg_rank_str(pg, pg->rank, rs0, sizeof rs0), op->seq,
             fps[pg->rank], pg_rank_str(pg, stuck, rs, sizeof rs), stuck_seq, fps[stuck], stuck_s);
    return 1;
}

/* This rank's collective `op` has not completed for `stalled` seconds:
 * read the others' states and, past the stall limit, end the op when
 * they show mismatched calls. */
static void watch(dp_pg *pg, const pg_op *op, double stalled)
{
    char msg[PG_MSG];
    if (!read_states(pg) || !(pg->stall_s > 0 && stalled >= pg->stall_s))
        return;
    if (find_mismatch(pg, op, pg->stall_s, msg)) {
        pg_break(pg, DP_ERR_STATE, msg);
        if (pg->abort)
            pg->abort(pg->impl);
    }
}

/* Publishes this rank's state when it changed (at most every
 * PG_PUBLISH_S) and every PG_BEAT_S regardless, and watches a collective
 * that does not complete, until dp_pg_free. */
static void *heartbeat_main(void *arg)
{
    dp_pg *pg = arg;
    uint64_t beat = 0, shown = 0, watching = 0;
    int shown_in = 0;
    double shown_at = 0, entered_at = 0, read_at = 0;
    pthread_mutex_lock(&pg->mu);
    while (!pg->stop) {
        uint64_t seq = atomic_load(&pg->entered);
        int in = seq > atomic_load(&pg->finished);
        int broken = pg->broken != 0;
        pg_op op = pg->current;
        pthread_mutex_unlock(&pg->mu);
        double t = now_s();
        int changed = seq != shown || in != shown_in;
        if (t - shown_at >= (changed ? PG_PUBLISH_S : PG_BEAT_S)) {
            publish_state(pg, seq, ++beat, in, &op);
            shown = seq;
            shown_in = in;
            shown_at = t;
        }
        if (!in || broken) {
            watching = 0;
        } else if (seq != watching) {
            watching = seq;
            entered_at = t;
        } else if (t - entered_at >= PG_WATCH_S && t - read_at >= PG_READ_S) {
            watch(pg, &op, t - entered_at);
            read_at = now_s();
        }
        pthread_mutex_lock(&pg->mu);
        if (pg->stop)
            break;
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        long ns = until.tv_nsec + (long)(PG_PUBLISH_S * 1e9);
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

int pg_mismatch_after_failure(dp_pg *pg, const pg_op *op, char *msg)
{
    pthread_mutex_lock(&pg->mu);
    int found = pg->broken != 0;
    if (found)
        snprintf(msg, PG_MSG, "%s", pg->broken_msg);   /* the heartbeat's finding */
    pthread_mutex_unlock(&pg->mu);
    if (found)
        return 1;
    /* what was read before stands when the store is gone (a peer that
     * found the mismatch first and exited served it): a seq's
     * fingerprint does not change */
    if (!store_silent_for(pg))
        (void)read_states(pg);
    return find_mismatch(pg, op, 0, msg);
}

/* ---------------------------------------------------------------- diagnosis */

void pg_publish_error(dp_pg *pg, const char *msg)
{
    char key[PG_NAME + 64];
    key_error(pg, pg->rank, key, sizeof key);
    if (!store_silent_for(pg))
        (void)quick_set(pg, key, msg, strlen(msg));
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
    double silent = store_silent_for(pg);
    int ndead = silent > 0 ? -1 : find_dead(pg, lo, hi, peer_lost ? (pg->timeout_s < 2.0 ? pg->timeout_s : 2.0) : 0,
                                            dead, &failed_peer);
    if (ndead < 0) {
        if (store_lost(pg->store))
            snprintf(msg + n, PG_MSG - n, "; the store did not answer either (rank 0, which serves it, has exited "
                     "or died: its connection closed)");
        else
            snprintf(msg + n, PG_MSG - n, "; the store did not answer either: rank 0, which serves it, is not "
                     "responding: no reply for %.0f s while its connection stays open (the process is frozen: "
                     "stopped or stuck)", silent > PG_REPLY_S ? silent : PG_REPLY_S);
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
        double quiet = p2p ? 0 : quiet_for(pg, r);
        if (quiet >= PG_FROZEN_S) {
            n += snprintf(msg + n, PG_MSG - n, "; %s is not responding: no heartbeat for %.0f s while its "
                          "connection to the store stays open (the process is frozen: stopped or stuck)",
                          pg_rank_str(pg, r, rs, sizeof rs), quiet);
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
        else if (p <= 0)
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
