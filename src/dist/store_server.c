/*
 * store_server.c — the server of dplua's store protocol (store_proto.h):
 * a TCP key-value store on a background thread of the rank that serves.
 *
 * One thread polls the listening socket and every connection; requests
 * are answered in the order they arrive, and a GET or WAIT whose keys are
 * missing waits in a list that every change of the table wakes. The
 * server's state belongs to its thread alone.
 */
#define _GNU_SOURCE
#include "dist/store_proto.h"
#include "core/tensor.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define HELLO_MAX (8u << 10)           /* the largest frame before HELLO (a token is <= 4 KiB) */
#define HELLO_DEADLINE_S 5             /* seconds a connection has to authenticate */
#define HELLO_DEADLINE ((double)HELLO_DEADLINE_S)
#define STRINGIFY_(x) #x
#define STRINGIFY(x) STRINGIFY_(x)
#define PENDING_MAX 128                /* connections not yet authenticated, at once */
#define CLIENTS_MARGIN 64              /* authenticated clients beyond the world size */
#define CLIENTS_UNKNOWN 4096           /* authenticated clients when the world size is not known */
#define OUT_MAX ((size_t)256 << 20)    /* replies queued for a client that does not read */
#define LOG_MAX 50                     /* rejected connections logged, then silence */

/* ======================================================================== */
/* keys                                                                      */
/* ======================================================================== */

struct entry {
    struct entry *next;
    uint64_t hash;
    unsigned char *val;
    size_t vlen, klen;
    unsigned char key[];
};

struct conn {
    int fd;
    int authed, rank, bye, closing, logged;
    double hello_by;           /* closed when not authenticated by then */
    struct sockaddr_storage addr;
    socklen_t addr_len;
    char peer[80];
    unsigned char hdr[HDR];
    size_t hdr_n;
    int in_body;
    unsigned char *body;
    size_t body_len, body_n;
    unsigned char *out;
    size_t out_off, out_n, out_cap;
};

struct wkey {
    unsigned char *p;
    size_t n;
};

struct waiter {
    struct waiter *next;
    struct conn *c;
    uint32_t id;
    int op;            /* OP_GET or OP_WAIT */
    int nkeys;
    struct wkey keys[];
};

struct store_server {
    int lfd, wake[2];
    pthread_t thread;
    int port;
    char connect_host[64];     /* how this process reaches its own server */
    unsigned char *token;
    size_t token_len;
    char *remote_token;        /* also taken, from peers on other hosts only; NULL: none */
    int64_t generation;
    int max_clients;           /* authenticated connections at once */
    struct conn **conns;
    size_t nconns, capconns;
    int npending;              /* connections not yet authenticated */
    int said_full, said_idle, said_remote;   /* each of these logged once */
    struct entry **buckets;
    size_t nbuckets, nentries;
    struct waiter *waiters;
    int nlogged;
    double accept_paused_until;
};

static uint64_t hash_key(const unsigned char *k, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ k[i]) * 1099511628211ull;
    return h;
}

static struct entry **find_slot(struct store_server *sv, const unsigned char *k, size_t n)
{
    uint64_t h = hash_key(k, n);
    struct entry **pe = &sv->buckets[h & (sv->nbuckets - 1)];
    for (; *pe != NULL; pe = &(*pe)->next)
        if ((*pe)->hash == h && (*pe)->klen == n && memcmp((*pe)->key, k, n) == 0)
            break;
    return pe;
}

static struct entry *find_entry(struct store_server *sv, const unsigned char *k, size_t n)
{
    return *find_slot(sv, k, n);
}

static void grow_table(struct store_server *sv)
{
    size_t i, nb = sv->nbuckets * 2;
    struct entry **b = calloc(nb, sizeof *b);
    if (b == NULL)
        return;  /* a fuller table is slower, not wrong */
    for (i = 0; i < sv->nbuckets; i++) {
        struct entry *e = sv->buckets[i], *next;
        for (; e != NULL; e = next) {
            next = e->next;
            e->next = b[e->hash & (nb - 1)];
            b[e->hash & (nb - 1)] = e;
        }
    }
    free(sv->buckets);
    sv->buckets = b;
    sv->nbuckets = nb;
}

/* Sets key to a copy of val. Returns 0, or -1 when out of memory. */
static int put_entry(struct store_server *sv, const unsigned char *k, size_t kn,
                     const void *val, size_t vn)
{
    struct entry **pe = find_slot(sv, k, kn), *e = *pe;
    unsigned char *v = malloc(vn + 1);
    if (v == NULL)
        return -1;
    if (vn)
        memcpy(v, val, vn);
    if (e == NULL) {
        e = malloc(sizeof *e + kn + 1);
        if (e == NULL) {
            free(v);
            return -1;
        }
        e->hash = hash_key(k, kn);
        e->klen = kn;
        memcpy(e->key, k, kn);
        e->key[kn] = '\0';
        e->next = NULL;
        e->val = NULL;
        *pe = e;
        if (++sv->nentries > sv->nbuckets)
            grow_table(sv);
    }
    free(e->val);
    e->val = v;
    e->vlen = vn;
    return 0;
}

static int delete_entry(struct store_server *sv, const unsigned char *k, size_t n)
{
    struct entry **pe = find_slot(sv, k, n), *e = *pe;
    if (e == NULL)
        return 0;
    *pe = e->next;
    free(e->val);
    free(e);
    sv->nentries--;
    return 1;
}

/* ======================================================================== */
/* connections                                                               */
/* ======================================================================== */

static void server_log(struct store_server *sv, struct conn *c, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* One line per rejected connection, and at most LOG_MAX of them. */
static void server_log(struct store_server *sv, struct conn *c, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    if (c->logged)
        return;
    c->logged = 1;
    if (sv->nlogged >= LOG_MAX) {
        if (sv->nlogged++ == LOG_MAX)
            fprintf(stderr, "dplua store (port %d): more connections were rejected; "
                    "no longer logging them\n", sv->port);
        return;
    }
    sv->nlogged++;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "dplua store (port %d): closed the connection from %s: %s\n",
            sv->port, c->peer, msg);
}

static void reject(struct store_server *sv, struct conn *c, const char *what)
{
    server_log(sv, c, "%s", what);
    c->closing = 1;
}

static void conn_flush(struct conn *c)
{
    while (c->out_off < c->out_n && !c->closing) {
        ssize_t w = send(c->fd, c->out + c->out_off, c->out_n - c->out_off,
                         MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w > 0)
            c->out_off += (size_t)w;
        else if (w < 0 && errno == EINTR)
            continue;
        else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        else
            c->closing = 1;
    }
    if (c->out_off == c->out_n)
        c->out_off = c->out_n = 0;
}

/* Queues one reply frame with at most one field (data NULL: none). */
static void reply(struct store_server *sv, struct conn *c, int op, uint32_t id,
                  const void *data, size_t n)
{
    size_t need = HDR + (data ? 4 + n : 0);
    unsigned char *p;
    if (c->closing)
        return;
    if (c->out_n + need > c->out_cap) {
        size_t cap = c->out_cap ? c->out_cap : 1024;
        while (cap < c->out_n + need)
            cap *= 2;
        if (c->out_n + need > OUT_MAX || (p = realloc(c->out, cap)) == NULL) {
            reject(sv, c, "too many replies queued (the client does not read them)");
            return;
        }
        c->out = p;
        c->out_cap = cap;
    }
    p = c->out + c->out_n;
    frame_header(p, op, id, (uint32_t)(data ? 4 + n : 0));
    if (data) {
        store_put_u32(p + HDR, (uint32_t)n);
        if (n)
            memcpy(p + HDR + 4, data, n);
    }
    c->out_n += need;
    conn_flush(c);
}

static void reply_int(struct store_server *sv, struct conn *c, uint32_t id, int64_t v)
{
    unsigned char b[8];
    store_put_u64(b, (uint64_t)v);
    reply(sv, c, OP_INT, id, b, 8);
}

static void reply_error(struct store_server *sv, struct conn *c, uint32_t id, const char *msg)
{
    reply(sv, c, OP_ERROR, id, msg, strlen(msg));
}

/* ======================================================================== */
/* waiting                                                                   */
/* ======================================================================== */

static int waiter_ready(struct store_server *sv, const struct waiter *w)
{
    for (int i = 0; i < w->nkeys; i++)
        if (find_entry(sv, w->keys[i].p, w->keys[i].n) == NULL)
            return 0;
    return 1;
}

static void waiter_free(struct waiter *w)
{
    for (int i = 0; i < w->nkeys; i++)
        free(w->keys[i].p);
    free(w);
}

/* Answers every waiter whose keys now all exist. */
static void wake_waiters(struct store_server *sv)
{
    struct waiter **pw = &sv->waiters;
    while (*pw != NULL) {
        struct waiter *w = *pw;
        if (!w->c->closing && !waiter_ready(sv, w)) {
            pw = &w->next;
            continue;
        }
        *pw = w->next;
        if (w->c->closing) {
            waiter_free(w);
            continue;
        }
        if (w->op == OP_GET) {
            struct entry *e = find_entry(sv, w->keys[0].p, w->keys[0].n);
            reply(sv, w->c, OP_VALUE, w->id, e->val, e->vlen);
        } else {
            reply(sv, w->c, OP_OK, w->id, NULL, 0);
        }
        waiter_free(w);
    }
}

/* Drops the waiters of connection c (id 0: all of them, else that one). */
static void drop_waiters(struct store_server *sv, struct conn *c, uint32_t id)
{
    struct waiter **pw = &sv->waiters;
    while (*pw != NULL) {
        struct waiter *w = *pw;
        if (w->c == c && (id == 0 || w->id == id)) {
            *pw = w->next;
            waiter_free(w);
        } else {
            pw = &w->next;
        }
    }
}

/* ======================================================================== */
/* requests                                                                  */
/* ======================================================================== */

/* Parses a whole value as a decimal int64 (PyTorch's add stores text). */
static int parse_i64(const unsigned char *v, size_t n, int64_t *out)
{
    char buf[32], *end;
    long long x;
    if (n == 0 || n >= sizeof buf)
        return -1;
    memcpy(buf, v, n);
    buf[n] = '\0';
    errno = 0;
    x = strtoll(buf, &end, 10);
    if (errno != 0 || *end != '\0' || end == buf)
        return -1;
    *out = x;
    return 0;
}

/* Whether tok is the token t, in time that does not depend on where they differ. */
static int same_token(const unsigned char *tok, size_t tn, const unsigned char *t, size_t n)
{
    unsigned char diff = (unsigned char)(tn != n);
    for (size_t i = 0; i < tn && i < n; i++)
        diff |= tok[i] ^ t[i];
    return diff == 0;
}

/* One line about the store as a whole, the first time `said` is 0. */
static void say_once(struct store_server *sv, int *said, const char *msg)
{
    if (*said)
        return;
    *said = 1;
    fprintf(stderr, "dplua store (port %d): %s (logged once)\n", sv->port, msg);
}

/* The authenticated connection of a rank, other than c, or NULL. */
static struct conn *rank_conn(struct store_server *sv, const struct conn *c, int64_t rank)
{
    for (size_t i = 0; i < sv->nconns; i++) {
        struct conn *o = sv->conns[i];
        if (o != c && o->authed && !o->closing && o->rank == rank)
            return o;
    }
    return NULL;
}

static int authed_clients(const struct store_server *sv)
{
    int n = 0;
    for (size_t i = 0; i < sv->nconns; i++)
        n += sv->conns[i]->authed && !sv->conns[i]->closing;
    return n;
}

/* Refuses the HELLO with an answer the client shows, and closes. */
static void refuse(struct store_server *sv, struct conn *c, uint32_t id, const char *msg)
{
    reply_error(sv, c, id, msg);
    server_log(sv, c, "%s", msg);
    c->closing = 1;
}

static void do_hello(struct store_server *sv, struct conn *c, uint32_t id, struct cursor *cu)
{
    size_t tn;
    const unsigned char *tok = take_field(cu, &tn);
    int64_t rank = take_i64(cu), generation = take_i64(cu);
    struct conn *live;
    char msg[256];
    if (cu->bad || cu->n != 0 || rank < -1 || rank > (1 << 24)) {
        reject(sv, c, "malformed HELLO frame");
        return;
    }
    if (!same_token(tok, tn, sv->token, sv->token_len)) {
        const char *rt = sv->remote_token;
        if (rt == NULL || !same_token(tok, tn, (const unsigned char *)rt, strlen(rt)) ||
            store_is_local_addr((const struct sockaddr *)&c->addr)) {
            refuse(sv, c, id, TOKEN_REFUSED " (the client's DPLUA_JOB_TOKEN is not this job's)");
            return;
        }
        say_once(sv, &sv->said_remote, "WARNING: a rank on another host joined with the token derived from the "
                 "store's address and port, which anyone who can reach it can compute; set DPLUA_JOB_TOKEN to "
                 "the same secret on every rank");
    }
    if (generation != sv->generation && generation != 0 && sv->generation != 0) {
        snprintf(msg, sizeof msg, GENERATION_REFUSED " this store serves initialisation %lld of its job, the "
                 "client's is %lld", (long long)sv->generation, (long long)generation);
        reply_error(sv, c, id, msg);
        c->closing = 1;
        return;
    }
    if (rank >= 0 && (live = rank_conn(sv, c, rank)) != NULL) {
        snprintf(msg, sizeof msg, "rank %lld is already connected (from %s); a second connection for it is "
                 "refused", (long long)rank, live->peer);
        refuse(sv, c, id, msg);
        return;
    }
    if (authed_clients(sv) >= sv->max_clients) {
        snprintf(msg, sizeof msg, "the store already serves %d clients, its limit", sv->max_clients);
        refuse(sv, c, id, msg);
        return;
    }
    c->authed = 1;
    c->rank = (int)rank;
    sv->npending--;
    reply(sv, c, OP_OK, id, NULL, 0);
}

static void do_add(struct store_server *sv, struct conn *c, uint32_t id,
                   const unsigned char *k, size_t kn, int64_t delta)
{
    struct entry *e = find_entry(sv, k, kn);
    int64_t v = 0;
    char text[32];
    if (e != NULL && parse_i64(e->val, e->vlen, &v) != 0) {
        char ks[128], msg[200];
        store_key_str(ks, sizeof ks, k, kn);
        snprintf(msg, sizeof msg, "the value of key '%s' is not an integer", ks);
        reply_error(sv, c, id, msg);
        return;
    }
    if (__builtin_add_overflow(v, delta, &v)) {
        reply_error(sv, c, id, "the result overflows int64");
        return;
    }
    snprintf(text, sizeof text, "%lld", (long long)v);
    if (put_entry(sv, k, kn, text, strlen(text)) != 0) {
        reply_error(sv, c, id, "the store is out of memory");
        return;
    }
    reply_int(sv, c, id, v);
    wake_waiters(sv);
}

static void do_cas(struct store_server *sv, struct conn *c, uint32_t id, struct cursor *cu)
{
    size_t kn, en, dn;
    const unsigned char *k = take_field(cu, &kn);
    const unsigned char *exp = take_field(cu, &en);
    const unsigned char *des = take_field(cu, &dn);
    struct entry *e;
    if (cu->bad || cu->n != 0) {
        reject(sv, c, "malformed COMPARE_SET frame");
        return;
    }
    e = find_entry(sv, k, kn);
    if ((e == NULL && en == 0) || (e != NULL && e->vlen == en && memcmp(e->val, exp, en) == 0)) {
        if (put_entry(sv, k, kn, des, dn) != 0) {
            reply_error(sv, c, id, "the store is out of memory");
            return;
        }
        e = find_entry(sv, k, kn);
        reply(sv, c, OP_VALUE, id, e->val, e->vlen);
        wake_waiters(sv);
        return;
    }
    reply(sv, c, OP_VALUE, id, e ? e->val : (const unsigned char *)"", e ? e->vlen : 0);
}

/* GET (one key) and WAIT (one or more): answer now or register a waiter. */
static void do_wait(struct store_server *sv, struct conn *c, uint32_t id, int op, struct cursor *cu)
{
    struct cursor probe = *cu;
    size_t n;
    int i, nkeys = 0;
    struct waiter *w;
    while (probe.n > 0 && take_field(&probe, &n) != NULL)
        nkeys++;
    if (probe.bad || nkeys == 0 || (op == OP_GET && nkeys != 1)) {
        reject(sv, c, op == OP_GET ? "malformed GET frame" : "malformed WAIT frame");
        return;
    }
    w = calloc(1, sizeof *w + (size_t)nkeys * sizeof w->keys[0]);
    if (w == NULL) {
        reply_error(sv, c, id, "the store is out of memory");
        return;
    }
    w->c = c;
    w->id = id;
    w->op = op;
    for (i = 0; i < nkeys; i++) {
        const unsigned char *k = take_field(cu, &n);
        w->keys[i].p = malloc(n + 1);
        w->nkeys = i + 1;
        if (w->keys[i].p == NULL) {
            waiter_free(w);
            reply_error(sv, c, id, "the store is out of memory");
            return;
        }
        memcpy(w->keys[i].p, k, n);
        w->keys[i].n = n;
    }
    w->next = sv->waiters;
    sv->waiters = w;
    wake_waiters(sv);
}

static void do_check(struct store_server *sv, struct conn *c, uint32_t id, struct cursor *cu)
{
    int all = 1, nkeys = 0;
    while (cu->n > 0) {
        size_t n;
        const unsigned char *k = take_field(cu, &n);
        if (k == NULL)
            break;
        nkeys++;
        if (find_entry(sv, k, n) == NULL)
            all = 0;
    }
    if (cu->bad || nkeys == 0) {
        reject(sv, c, "malformed CHECK frame");
        return;
    }
    reply_int(sv, c, id, all);
}

/* The key operations of an authenticated connection. */
static void do_request(struct store_server *sv, struct conn *c, int op, uint32_t id, struct cursor *cu)
{
    size_t kn = 0, vn = 0;
    const unsigned char *k = NULL, *v = NULL;
    int64_t delta = 0;
    switch (op) {
    case OP_GET: case OP_WAIT:
        do_wait(sv, c, id, op, cu);
        return;
    case OP_CHECK:
        do_check(sv, c, id, cu);
        return;
    case OP_CAS:
        do_cas(sv, c, id, cu);
        return;
    case OP_SET:
        k = take_field(cu, &kn);
        v = take_field(cu, &vn);
        break;
    case OP_ADD:
        k = take_field(cu, &kn);
        delta = take_i64(cu);
        break;
    case OP_DELETE:
        k = take_field(cu, &kn);
        break;
    default:  /* CANCEL, BYE: no fields */
        break;
    }
    if (cu->bad || cu->n != 0) {
        reject(sv, c, "malformed frame (its fields do not fill the body)");
        return;
    }
    if (op == OP_SET) {
        if (put_entry(sv, k, kn, v, vn) != 0) {
            reply_error(sv, c, id, "the store is out of memory");
            return;
        }
        reply(sv, c, OP_OK, id, NULL, 0);
        wake_waiters(sv);
    } else if (op == OP_ADD) {
        do_add(sv, c, id, k, kn, delta);
    } else if (op == OP_DELETE) {
        reply_int(sv, c, id, delete_entry(sv, k, kn));
    } else if (op == OP_CANCEL) {
        drop_waiters(sv, c, id);
    } else if (op == OP_BYE) {
        c->bye = 1;
    }
}

/* Checks a complete header before its body is read or allocated. */
static int header_ok(struct store_server *sv, struct conn *c)
{
    const unsigned char *h = c->hdr;
    uint32_t len = store_get_u32(h + 12);
    int op = h[5];
    char why[160];
    if (store_get_u32(h) != FRAME_MAGIC)
        snprintf(why, sizeof why, "bad magic 0x%08x (not a dplua store client?)", store_get_u32(h));
    else if (h[4] != FRAME_VERSION)
        snprintf(why, sizeof why, "protocol version %d, this store speaks %d", h[4], FRAME_VERSION);
    else if (h[6] != 0 || h[7] != 0)
        snprintf(why, sizeof why, "unknown flags 0x%02x%02x", h[7], h[6]);
    else if (len > STORE_MAX_FRAME)
        snprintf(why, sizeof why, "frame length %u exceeds the limit of %u", len, STORE_MAX_FRAME);
    else if (op < OP_HELLO || op > OP_LAST_REQUEST)
        snprintf(why, sizeof why, "unknown op %d", op);
    else if (!c->authed && op != OP_HELLO)
        snprintf(why, sizeof why, "op %d before HELLO", op);
    else if (!c->authed && len > HELLO_MAX)
        snprintf(why, sizeof why, "a HELLO frame of %u bytes", len);
    else if (c->authed && op == OP_HELLO)
        snprintf(why, sizeof why, "a second HELLO");
    else
        return 1;
    reject(sv, c, why);
    return 0;
}

static void handle_frame(struct store_server *sv, struct conn *c)
{
    struct cursor cu = { c->body, c->body_len, 0 };
    int op = c->hdr[5];
    uint32_t id = store_get_u32(c->hdr + 8);
    if (op == OP_HELLO)
        do_hello(sv, c, id, &cu);
    else
        do_request(sv, c, op, id, &cu);
}

/* Reads what the socket holds, a frame at a time. */
static void conn_input(struct store_server *sv, struct conn *c)
{
    while (!c->closing) {
        unsigned char *dst = c->in_body ? c->body + c->body_n : c->hdr + c->hdr_n;
        size_t want = c->in_body ? c->body_len - c->body_n : HDR - c->hdr_n;
        ssize_t r = want ? recv(c->fd, dst, want, MSG_DONTWAIT) : 0;
        if (want && r < 0) {
            if (errno == EINTR)
                continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                c->closing = 1;  /* reset by the peer: it went away */
            return;
        }
        if (want && r == 0) {
            if (c->hdr_n > 0) {
                char why[128];
                snprintf(why, sizeof why, "truncated frame (the connection ended after %zu of %zu bytes)",
                         c->in_body ? HDR + c->body_n : c->hdr_n,
                         c->in_body ? HDR + c->body_len : (size_t)HDR);
                reject(sv, c, why);
            }
            c->closing = 1;
            return;
        }
        if (!c->in_body) {
            c->hdr_n += (size_t)r;
            if (c->hdr_n < HDR)
                continue;
            if (!header_ok(sv, c))
                return;
            c->body_len = store_get_u32(c->hdr + 12);
            c->body_n = 0;
            c->body = malloc(c->body_len + 1);
            if (c->body == NULL) {
                reject(sv, c, "out of memory for a frame");
                return;
            }
            c->in_body = 1;
        } else {
            c->body_n += (size_t)r;
        }
        if (c->body_n == c->body_len) {
            handle_frame(sv, c);
            free(c->body);
            c->body = NULL;
            c->in_body = 0;
            c->hdr_n = 0;
        }
    }
}

/* ======================================================================== */
/* the thread                                                                */
/* ======================================================================== */

static void sweep(struct store_server *sv);

/* Too many connections wait for their HELLO: the oldest goes, so that
 * strangers cannot run this process out of descriptors or memory, while
 * a rank, whose HELLO follows its connect at once, still gets in. */
static void drop_oldest_pending(struct store_server *sv)
{
    struct conn *old = NULL;
    for (size_t i = 0; i < sv->nconns; i++) {
        struct conn *c = sv->conns[i];
        if (!c->authed && !c->closing && (old == NULL || c->hello_by < old->hello_by))
            old = c;
    }
    if (old == NULL)
        return;
    old->closing = 1;
    say_once(sv, &sv->said_full, STRINGIFY(PENDING_MAX) " connections had not said HELLO; closing the oldest "
             "of them for each new one");
    sweep(sv);
}

/* Takes at most half of PENDING_MAX new connections a round, so that one
 * accepted lives through a round of reads (its HELLO, sent right after
 * its connect, is read then) before a flood can push it out. */
static void accept_clients(struct store_server *sv)
{
    for (int k = 0; k < PENDING_MAX / 2; k++) {
        struct sockaddr_storage addr;
        socklen_t alen = sizeof addr;
        char host[64] = "?", serv[16] = "?";
        struct conn *c;
        int one = 1, fd = accept4(sv->lfd, (struct sockaddr *)&addr, &alen,
                                  SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
                sv->accept_paused_until = store_now() + 0.1;
            return;  /* EAGAIN, or try again on the next round */
        }
        if (sv->npending >= PENDING_MAX)
            drop_oldest_pending(sv);
        if (sv->nconns == sv->capconns) {
            size_t cap = sv->capconns ? sv->capconns * 2 : 16;
            struct conn **cs = realloc(sv->conns, cap * sizeof *cs);
            if (cs == NULL) {
                close(fd);
                return;
            }
            sv->conns = cs;
            sv->capconns = cap;
        }
        c = calloc(1, sizeof *c);
        if (c == NULL) {
            close(fd);
            return;
        }
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        getnameinfo((struct sockaddr *)&addr, alen, host, sizeof host, serv, sizeof serv,
                    NI_NUMERICHOST | NI_NUMERICSERV);
        snprintf(c->peer, sizeof c->peer, "%s port %s", host, serv);
        c->fd = fd;
        c->rank = -1;
        c->hello_by = store_now() + HELLO_DEADLINE;
        memcpy(&c->addr, &addr, sizeof addr);
        c->addr_len = alen;
        sv->conns[sv->nconns++] = c;
        sv->npending++;
    }
}

/* Closes the connections marked closing; a rank that went away gets its
 * dplua/dead/<rank> key, which wakes whoever waits on it. */
static void sweep(struct store_server *sv)
{
    size_t i, j = 0;
    int changed = 0;
    for (i = 0; i < sv->nconns; i++)
        if (sv->conns[i]->closing)
            drop_waiters(sv, sv->conns[i], 0);
    for (i = 0; i < sv->nconns; i++) {
        struct conn *c = sv->conns[i];
        if (!c->closing) {
            sv->conns[j++] = c;
            continue;
        }
        if (c->authed && c->rank >= 0) {
            char key[48];
            const char *v = c->bye ? "exited" : "lost";
            snprintf(key, sizeof key, "dplua/dead/%d", c->rank);
            put_entry(sv, (const unsigned char *)key, strlen(key), v, strlen(v));
            changed = 1;
        }
        close(c->fd);
        free(c->body);
        free(c->out);
        free(c);
    }
    sv->nconns = j;
    sv->npending = 0;
    for (i = 0; i < j; i++)
        sv->npending += !sv->conns[i]->authed;
    if (changed)
        wake_waiters(sv);
}

/* Closes the connections that did not authenticate in time; returns the
 * milliseconds until the next one is due (-1: none is pending). */
static int expire_pending(struct store_server *sv)
{
    double now = store_now(), next = -1;
    for (size_t i = 0; i < sv->nconns; i++) {
        struct conn *c = sv->conns[i];
        if (c->authed || c->closing)
            continue;
        if (now >= c->hello_by) {
            c->closing = 1;
            say_once(sv, &sv->said_idle, "closed a connection that did not say HELLO within "
                     STRINGIFY(HELLO_DEADLINE_S) " s");
        } else if (next < 0 || c->hello_by < next) {
            next = c->hello_by;
        }
    }
    return next < 0 ? -1 : (int)((next - now) * 1000) + 1;
}

static void *server_main(void *arg)
{
    struct store_server *sv = arg;
    struct pollfd *pf = NULL;
    size_t cap = 0;
    for (;;) {
        size_t i, n = sv->nconns, np = 2;
        int listening = store_now() >= sv->accept_paused_until, r, ms;
        if (cap < n + 2) {
            struct pollfd *p = realloc(pf, (n + 2) * 2 * sizeof *p);
            if (p == NULL) {
                usleep(10000);
                continue;
            }
            pf = p;
            cap = (n + 2) * 2;
        }
        pf[0] = (struct pollfd){ sv->wake[0], POLLIN, 0 };
        pf[1] = (struct pollfd){ listening ? sv->lfd : -1, POLLIN, 0 };
        for (i = 0; i < n; i++) {
            struct conn *c = sv->conns[i];
            pf[np++] = (struct pollfd){ c->fd, (short)(POLLIN | (c->out_n > c->out_off ? POLLOUT : 0)), 0 };
        }
        ms = expire_pending(sv);
        if (!listening && (ms < 0 || ms > 100))
            ms = 100;
        r = poll(pf, np, ms);
        if (r < 0 && errno != EINTR)
            break;
        if (r <= 0) {
            expire_pending(sv);
            sweep(sv);
            continue;
        }
        if (pf[0].revents)
            break;
        for (i = 0; i < n; i++) {
            struct conn *c = sv->conns[i];
            short ev = pf[i + 2].revents;
            if (ev & POLLOUT)
                conn_flush(c);
            if (ev & (POLLIN | POLLHUP | POLLERR))
                conn_input(sv, c);
        }
        if (pf[1].revents)
            accept_clients(sv);
        sweep(sv);
    }
    free(pf);
    return NULL;
}

static void server_free(struct store_server *sv)
{
    size_t i;
    if (sv == NULL)
        return;
    for (i = 0; i < sv->nconns; i++) {
        close(sv->conns[i]->fd);
        free(sv->conns[i]->body);
        free(sv->conns[i]->out);
        free(sv->conns[i]);
    }
    while (sv->waiters != NULL) {
        struct waiter *w = sv->waiters;
        sv->waiters = w->next;
        waiter_free(w);
    }
    for (i = 0; i < sv->nbuckets; i++) {
        struct entry *e = sv->buckets[i], *next;
        for (; e != NULL; e = next) {
            next = e->next;
            free(e->val);
            free(e);
        }
    }
    if (sv->lfd >= 0)
        close(sv->lfd);
    if (sv->wake[0] >= 0)
        close(sv->wake[0]);
    if (sv->wake[1] >= 0)
        close(sv->wake[1]);
    free(sv->buckets);
    free(sv->conns);
    free(sv->token);
    free(sv->remote_token);
    free(sv);
}
/* A listening socket on addr for sv; 0 or an errno. */
static int listen_on(struct store_server *sv, const struct sockaddr *addr, socklen_t len)
{
    int e = store_listen(addr, len, &sv->lfd, &sv->port);
    if (e != 0)
        return e;
    /* the wildcard is dual-stack: this process reaches it over IPv4 loopback */
    if (store_is_loopback(addr))
        getnameinfo(addr, len, sv->connect_host, sizeof sv->connect_host, NULL, 0, NI_NUMERICHOST);
    else
        snprintf(sv->connect_host, sizeof sv->connect_host, "127.0.0.1");
    return 0;
}

/* A loopback host binds that address (the job stays on this machine);
 * any other host binds every address, as PyTorch's TCPStore does, so
 * that MASTER_ADDR may name this machine by any of its names. */
static dp_status server_bind(struct store_server *sv, const char *host, int port)
{
    struct addrinfo hints, *res = NULL, *ai;
    struct sockaddr_in6 any6;
    struct sockaddr_in any4;
    char service[16];
    const char *shown = host && *host ? host : "*";
    int e = EADDRNOTAVAIL;
    snprintf(service, sizeof service, "%d", port);
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    if (host && *host && getaddrinfo(host, service, &hints, &res) == 0) {
        for (ai = res; ai != NULL; ai = ai->ai_next)
            if (store_is_loopback(ai->ai_addr) && (e = listen_on(sv, ai->ai_addr, ai->ai_addrlen)) == 0)
                break;
        freeaddrinfo(res);
        if (sv->lfd >= 0)
            return DP_OK;
        if (e == EADDRINUSE)
            goto in_use;
    }
    memset(&any6, 0, sizeof any6);
    any6.sin6_family = AF_INET6;
    any6.sin6_port = htons((uint16_t)port);
    any6.sin6_addr = in6addr_any;
    e = listen_on(sv, (struct sockaddr *)&any6, sizeof any6);
    if (e != 0 && e != EADDRINUSE) {
        memset(&any4, 0, sizeof any4);
        any4.sin_family = AF_INET;
        any4.sin_port = htons((uint16_t)port);
        any4.sin_addr.s_addr = htonl(INADDR_ANY);
        e = listen_on(sv, (struct sockaddr *)&any4, sizeof any4);
    }
    if (e == 0)
        return DP_OK;
    if (e == EADDRINUSE)
        goto in_use;
    return dp_fail(DP_ERR_IO, "dp_store_open: cannot serve the store on %s:%d: %s", shown, port, strerror(e));
in_use:
    return dp_fail(DP_ERR_IO, "dp_store_open: port %d is already in use on %s; pick another MASTER_PORT",
                   port, shown);
}

dp_status store_server_start(struct store_server **out, const char *host, int port, int world_size,
                             const char *token, const char *remote_token, int64_t generation)
{
    struct store_server *sv = calloc(1, sizeof *sv);
    sigset_t all, old;
    dp_status st;
    if (sv == NULL)
        return dp_fail(DP_ERR_MEMORY, "dp_store_open: out of memory");
    sv->lfd = sv->wake[0] = sv->wake[1] = -1;
    sv->nbuckets = 64;
    sv->buckets = calloc(sv->nbuckets, sizeof *sv->buckets);
    sv->token_len = strlen(token);
    sv->token = malloc(sv->token_len + 1);
    if (sv->buckets == NULL || sv->token == NULL) {
        server_free(sv);
        return dp_fail(DP_ERR_MEMORY, "dp_store_open: out of memory");
    }
    memcpy(sv->token, token, sv->token_len + 1);
    if (remote_token && (sv->remote_token = strdup(remote_token)) == NULL) {
        server_free(sv);
        return dp_fail(DP_ERR_MEMORY, "dp_store_open: out of memory");
    }
    sv->generation = generation;
    sv->max_clients = world_size > 0 ? world_size + CLIENTS_MARGIN : CLIENTS_UNKNOWN;
    if ((st = server_bind(sv, host, port)) != DP_OK) {
        server_free(sv);
        return st;
    }
    if (pipe2(sv->wake, O_CLOEXEC) < 0) {
        server_free(sv);
        return dp_fail(DP_ERR_IO, "dp_store_open: pipe: %s", strerror(errno));
    }
    /* The thread takes no signals: they stay with the program's threads. */
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    st = pthread_create(&sv->thread, NULL, server_main, sv);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (st != 0) {
        server_free(sv);
        return dp_fail(DP_ERR_IO, "dp_store_open: cannot start the store thread: %s", strerror(st));
    }
    *out = sv;
    return DP_OK;
}

void store_server_stop(struct store_server *sv)
{
    ssize_t w;
    if (sv == NULL)
        return;
    do
        w = write(sv->wake[1], "x", 1);
    while (w < 0 && errno == EINTR);
    pthread_join(sv->thread, NULL);
    server_free(sv);
}

int store_server_port(const struct store_server *sv)
{
    return sv->port;
}

const char *store_server_connect_host(const struct store_server *sv)
{
    return sv->connect_host;
}
