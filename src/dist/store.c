/*
 * store.c — the rendezvous store: a TCP key-value server on a background
 * thread, and the client that every rank (the serving one included) uses.
 *
 * The wire protocol (docs/DISTRIBUTED.md, "Store", says the same):
 *
 *   frame   = header body
 *   header  = 16 bytes, integers little-endian:
 *             magic u32 0x54535044 ("DPST" on the wire), version u8 (1),
 *             op u8, flags u16 (0), id u32, body length u32 (<= 64 MiB)
 *   body    = field*, field = length u32, bytes
 *
 * A request's id comes back in its reply, so a client can drop a late
 * reply to a request it gave up on. The first frame of a connection is
 * HELLO [token] [rank as 8-byte int] [generation as 8-byte int]; the
 * server answers OK, or ERROR and closes when the token differs from its
 * own, or the generation when both are set (not 0). The generation tells
 * one init_process_group of a job from the next on the same port: a rank
 * that re-initialises before rank 0 has closed the old store is refused
 * by it, and retries until the new one serves. (A store opened by hand,
 * dist.TCPStore, is of generation 0 and joins any.) Anything malformed (bad
 * magic, version or flags, a length over the limit, an unknown op, fields
 * that do not fill the body exactly, a connection that ends mid-frame)
 * closes that connection and is logged once to stderr. Nothing a peer
 * sends is trusted: lengths are checked before anything is read or
 * allocated, and a frame before HELLO may be at most 64 KiB.
 *
 * GET and WAIT wait on the server: the reply comes when the keys exist.
 * The client bounds its wait with poll() and, on a timeout, sends CANCEL
 * so the server forgets the request. When a connection that announced a
 * rank r closes, the server sets "dplua/dead/<r>" to "exited" (the client
 * said BYE first, from dp_store_close) or "lost" (it did not).
 *
 * Threads: the server's state belongs to its thread alone; a client
 * handle may be used by one thread at a time.
 */
#define _GNU_SOURCE
#include "dist/store.h"
#include "core/tensor.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
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
#include <time.h>
#include <unistd.h>

#define FRAME_MAGIC 0x54535044u
#define FRAME_VERSION 1
#define HDR 16
#define HELLO_MAX (64u << 10)          /* the largest frame before HELLO */
/* how a refusal for another generation begins (the client then retries) */
#define GENERATION_REFUSED "another generation:"
#define OUT_MAX ((size_t)256 << 20)    /* replies queued for a client that does not read */
#define LOG_MAX 50                     /* rejected connections logged, then silence */

enum {
    OP_HELLO = 1, OP_SET, OP_GET, OP_ADD, OP_CAS, OP_WAIT, OP_CHECK, OP_DELETE,
    OP_CANCEL, OP_BYE,
    OP_LAST_REQUEST = OP_BYE,
    OP_OK = 0x80, OP_VALUE, OP_INT, OP_ERROR
};

/* ======================================================================== */
/* small helpers                                                             */
/* ======================================================================== */

double store_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

double store_deadline(const dp_store *s, double timeout_s)
{
    return store_now() + (timeout_s > 0 ? timeout_s : s->timeout_s);
}

void store_put_u32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

void store_put_u64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

uint32_t store_get_u32(const unsigned char *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

uint64_t store_get_u64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

void store_buf_add(struct store_buf *b, const void *data, size_t n)
{
    if (b->oom)
        return;
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        unsigned char *p;
        while (cap < b->n + n)
            cap *= 2;
        p = realloc(b->p, cap);
        if (p == NULL) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    if (n)
        memcpy(b->p + b->n, data, n);
    b->n += n;
}

void store_buf_free(struct store_buf *b)
{
    free(b->p);
    memset(b, 0, sizeof *b);
}

/* A key for a message: printable bytes as they are, at most 80 of them. */
static void key_str(char *buf, size_t size, const unsigned char *key, size_t n)
{
    size_t i, o = 0;
    for (i = 0; i < n && o + 5 < size && i < 80; i++) {
        unsigned char ch = key[i];
        if (ch >= 32 && ch < 127)
            buf[o++] = (char)ch;
        else
            o += (size_t)snprintf(buf + o, size - o, "\\x%02x", ch);
    }
    if (i < n && o + 4 < size)
        o += (size_t)snprintf(buf + o, size - o, "...");
    buf[o < size ? o : size - 1] = '\0';
}

void store_key_list(char *buf, size_t size, const char *const *keys, int n)
{
    size_t o = 0;
    int i, shown = n < 8 ? n : 6;
    buf[0] = '\0';
    for (i = 0; i < shown && o + 1 < size; i++) {
        char k[128];
        key_str(k, sizeof k, (const unsigned char *)keys[i], strlen(keys[i]));
        o += (size_t)snprintf(buf + o, size - o, "%s'%s'", i == 0 ? "" : ", ", k);
    }
    if (shown < n && o + 1 < size)
        snprintf(buf + o, size - o, " and %d more", n - shown);
}

/* ======================================================================== */
/* sockets                                                                   */
/* ======================================================================== */

static int poll_ms(double deadline)
{
    double left = deadline - store_now();
    if (left <= 0)
        return 0;
    if (left > INT_MAX / 1000.0)
        return INT_MAX;
    return (int)(left * 1000.0) + 1;
}

/* Waits for `events` on fd; 0 when ready, ETIMEDOUT, or an errno. */
static int wait_fd(int fd, short events, double deadline)
{
    for (;;) {
        struct pollfd p = { fd, events, 0 };
        int ms = poll_ms(deadline);
        int r = poll(&p, 1, ms);
        if (r > 0)
            return 0;
        if (r == 0 && ms == 0)
            return ETIMEDOUT;
        if (r < 0 && errno != EINTR)
            return errno;
    }
}

int store_send_all(int fd, const void *buf, size_t n, double deadline)
{
    const char *p = buf;
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w > 0) {
            p += w;
            n -= (size_t)w;
        } else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            int e = wait_fd(fd, POLLOUT, deadline);
            if (e)
                return e;
        } else if (w < 0 && errno != EINTR) {
            return errno;
        }
    }
    return 0;
}

int store_recv_all(int fd, void *buf, size_t n, double deadline, int *eof)
{
    char *p = buf;
    if (eof)
        *eof = 0;
    while (n > 0) {
        ssize_t r = recv(fd, p, n, MSG_DONTWAIT);
        if (r > 0) {
            p += r;
            n -= (size_t)r;
        } else if (r == 0) {
            if (eof)
                *eof = 1;
            return ECONNRESET;
        } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
            int e = wait_fd(fd, POLLIN, deadline);
            if (e)
                return e;
        } else if (errno != EINTR) {
            return errno;
        }
    }
    return 0;
}

/* One non-blocking connect to one address, bounded by the deadline. */
static int connect_one(const struct addrinfo *ai, double deadline, int *fdp)
{
    int e, fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
    socklen_t len = sizeof e;
    if (fd < 0)
        return errno;
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
        *fdp = fd;
        return 0;
    }
    e = errno;
    if (e == EINPROGRESS) {
        e = wait_fd(fd, POLLOUT, deadline);
        if (e == 0 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &len) < 0)
            e = errno;
    }
    if (e == 0) {
        *fdp = fd;
        return 0;
    }
    close(fd);
    return e;
}

dp_status store_connect(int *fdp, const char *fn, const char *host, int port, double timeout_s)
{
    double start = store_now(), deadline = start + timeout_s, pause = 0.02;
    char service[16], why[256] = "no attempt was made";
    int one = 1;
    snprintf(service, sizeof service, "%d", port);
    for (;;) {
        struct addrinfo hints, *res = NULL, *ai;
        int e;
        memset(&hints, 0, sizeof hints);
        hints.ai_family = AF_UNSPEC;
        hints.ai_socktype = SOCK_STREAM;
        e = getaddrinfo(host, service, &hints, &res);
        if (e != 0) {
            snprintf(why, sizeof why, "cannot resolve the host: %s",
                     e == EAI_SYSTEM ? strerror(errno) : gai_strerror(e));
        } else {
            for (ai = res; ai != NULL; ai = ai->ai_next) {
                int fd = -1;
                e = connect_one(ai, deadline, &fd);
                if (e == 0) {
                    freeaddrinfo(res);
                    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                    *fdp = fd;
                    return DP_OK;
                }
                snprintf(why, sizeof why, "%s", strerror(e == ETIMEDOUT ? ETIMEDOUT : e));
            }
            freeaddrinfo(res);
        }
        if (store_now() + pause >= deadline)
            break;
        usleep((useconds_t)(pause * 1e6));
        pause = pause * 2 > 1.0 ? 1.0 : pause * 2;
    }
    return dp_fail(DP_ERR_IO, "%s: could not connect to the store at %s:%d within %g s: %s",
                   fn, host, port, timeout_s, why);
}

/* ======================================================================== */
/* the server: keys                                                          */
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
    int64_t generation;
    struct conn **conns;
    size_t nconns, capconns;
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
/* the server: connections                                                   */
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
    store_put_u32(p, FRAME_MAGIC);
    p[4] = FRAME_VERSION;
    p[5] = (unsigned char)op;
    p[6] = p[7] = 0;
    store_put_u32(p + 8, id);
    store_put_u32(p + 12, (uint32_t)(data ? 4 + n : 0));
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
/* the server: waiting                                                       */
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
/* the server: requests                                                      */
/* ======================================================================== */

struct cursor {
    const unsigned char *p;
    size_t n;
    int bad;
};

static const unsigned char *take_field(struct cursor *cu, size_t *len)
{
    uint32_t n;
    const unsigned char *f;
    if (cu->bad || cu->n < 4) {
        cu->bad = 1;
        return NULL;
    }
    n = store_get_u32(cu->p);
    if (n > cu->n - 4) {
        cu->bad = 1;
        return NULL;
    }
    f = cu->p + 4;
    cu->p += 4 + n;
    cu->n -= 4 + n;
    *len = n;
    return f;
}

static int64_t take_i64(struct cursor *cu)
{
    size_t n;
    const unsigned char *f = take_field(cu, &n);
    if (f == NULL || n != 8) {
        cu->bad = 1;
        return 0;
    }
    return (int64_t)store_get_u64(f);
}

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

static void do_hello(struct store_server *sv, struct conn *c, uint32_t id, struct cursor *cu)
{
    size_t tn;
    const unsigned char *tok = take_field(cu, &tn);
    int64_t rank = take_i64(cu), generation = take_i64(cu);
    unsigned char diff = 0;
    if (cu->bad || cu->n != 0 || rank < -1 || rank > (1 << 24)) {
        reject(sv, c, "malformed HELLO frame");
        return;
    }
    diff = (unsigned char)(tn != sv->token_len);
    for (size_t i = 0; i < tn && i < sv->token_len; i++)
        diff |= tok[i] ^ sv->token[i];
    if (diff) {
        reply_error(sv, c, id, "wrong job token (the client's DPLUA_JOB_TOKEN is not this job's)");
        server_log(sv, c, "wrong job token");
        c->closing = 1;
        return;
    }
    if (generation != sv->generation && generation != 0 && sv->generation != 0) {
        char msg[160];
        snprintf(msg, sizeof msg, GENERATION_REFUSED " this store serves initialisation %lld of its job, the "
                 "client's is %lld", (long long)sv->generation, (long long)generation);
        reply_error(sv, c, id, msg);
        c->closing = 1;
        return;
    }
    c->authed = 1;
    c->rank = (int)rank;
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
        key_str(ks, sizeof ks, k, kn);
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
/* the server: the thread                                                    */
/* ======================================================================== */

static void accept_clients(struct store_server *sv)
{
    for (;;) {
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
        sv->conns[sv->nconns++] = c;
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
    if (changed)
        wake_waiters(sv);
}

static void *server_main(void *arg)
{
    struct store_server *sv = arg;
    struct pollfd *pf = NULL;
    size_t cap = 0;
    for (;;) {
        size_t i, n = sv->nconns, np = 2;
        int listening = store_now() >= sv->accept_paused_until, r;
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
        r = poll(pf, np, listening ? -1 : 100);
        if (r < 0 && errno != EINTR)
            break;
        if (r <= 0)
            continue;
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
    free(sv);
}

static int is_loopback(const struct sockaddr *a)
{
    if (a->sa_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)a)->sin_addr.s_addr) >> 24) == 127;
    if (a->sa_family == AF_INET6)
        return IN6_IS_ADDR_LOOPBACK(&((const struct sockaddr_in6 *)a)->sin6_addr);
    return 0;
}

/* A listening socket on addr; 0 or an errno. */
static int listen_on(struct store_server *sv, const struct sockaddr *addr, socklen_t len)
{
    int one = 1, zero = 0, e;
    int fd = socket(addr->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    struct sockaddr_storage got;
    socklen_t glen = sizeof got;
    if (fd < 0)
        return errno;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (addr->sa_family == AF_INET6)
        setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
    if (bind(fd, addr, len) < 0 || listen(fd, SOMAXCONN) < 0 ||
        getsockname(fd, (struct sockaddr *)&got, &glen) < 0) {
        e = errno;
        close(fd);
        return e;
    }
    sv->lfd = fd;
    sv->port = ntohs(got.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&got)->sin6_port
                                               : ((struct sockaddr_in *)&got)->sin_port);
    /* the wildcard is dual-stack: this process reaches it over IPv4 loopback */
    if (is_loopback(addr))
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
            if (is_loopback(ai->ai_addr) && (e = listen_on(sv, ai->ai_addr, ai->ai_addrlen)) == 0)
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

static dp_status server_start(struct store_server **out, const char *host, int port, const char *token,
                              int64_t generation)
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
    sv->generation = generation;
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

static void server_stop(struct store_server *sv)
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

/* ======================================================================== */
/* the client                                                                */
/* ======================================================================== */

struct reply {
    int op;
    unsigned char *body;
    size_t len;
};

static void req_begin(struct store_buf *b)
{
    unsigned char h[HDR] = { 0 };
    store_buf_add(b, h, HDR);
}

static void req_field(struct store_buf *b, const void *p, size_t n)
{
    unsigned char len[4];
    store_put_u32(len, (uint32_t)n);
    store_buf_add(b, len, 4);
    store_buf_add(b, p, n);
}

static void req_i64(struct store_buf *b, int64_t v)
{
    unsigned char x[8];
    store_put_u64(x, (uint64_t)v);
    req_field(b, x, 8);
}

static void req_key(struct store_buf *b, const char *key)
{
    req_field(b, key, strlen(key));
}

/* Marks the connection lost: this call and every later one fail. */
static dp_status conn_lost(dp_store *s, const char *fn, int err, int eof)
{
    char msg[512];
    if (s->failed == NULL) {
        snprintf(msg, sizeof msg, "lost the connection to the store at %s:%d (%s%s)", s->host, s->port,
                 eof ? "closed by the store" : strerror(err),
                 s->server ? "" : "; the process that serves it, rank 0, may have exited");
        s->failed = strdup(msg);
        if (s->fd >= 0)
            close(s->fd);
        s->fd = -1;
    }
    return dp_fail(DP_ERR_IO, "%s: %s", fn, s->failed ? s->failed : "lost the connection to the store");
}

/* Reads replies until the one for `id`; older ones (to requests that timed
 * out) are dropped. 0, ETIMEDOUT (nothing of a reply had come: the
 * connection is still in step), or -DP_ERR_IO after conn_lost. */
static int read_reply(dp_store *s, const char *fn, uint32_t id, double deadline, struct reply *rep)
{
    for (;;) {
        unsigned char h[HDR];
        int eof = 0, e = wait_fd(s->fd, POLLIN, deadline);
        uint32_t len;
        if (e == ETIMEDOUT)
            return ETIMEDOUT;
        /* a reply has begun: the rest follows at once from a live server */
        if (e == 0)
            e = store_recv_all(s->fd, h, HDR, store_now() + 60, &eof);
        if (e != 0) {
            return -(int)conn_lost(s, fn, e, eof);
        }
        len = store_get_u32(h + 12);
        if (store_get_u32(h) != FRAME_MAGIC || h[4] != FRAME_VERSION || len > STORE_MAX_FRAME + 8) {
            dp_fail(DP_ERR_IO, "%s: the store at %s:%d sent a malformed reply", fn, s->host, s->port);
            conn_lost(s, fn, EPROTO, 0);
            return -DP_ERR_IO;
        }
        rep->op = h[5];
        rep->len = len;
        rep->body = malloc(len + 1);
        if (rep->body == NULL)
            return -(int)conn_lost(s, fn, ENOMEM, 0);
        e = store_recv_all(s->fd, rep->body, len, store_now() + 60, &eof);
        if (e != 0) {
            free(rep->body);
            return -(int)conn_lost(s, fn, e, eof);
        }
        if (store_get_u32(h + 8) == id)
            return 0;
        free(rep->body);
    }
}

/* Sends the request in b (its header filled in here) and reads the reply.
 * Returns 0, ETIMEDOUT, or minus the dp_status of the error it set. */
static int rpc(dp_store *s, const char *fn, int op, struct store_buf *b, double deadline, struct reply *rep)
{
    uint32_t id;
    int e;
    memset(rep, 0, sizeof *rep);
    if (s->failed)
        return -(int)dp_fail(DP_ERR_IO, "%s: %s", fn, s->failed);
    if (b->oom)
        return -(int)dp_fail(DP_ERR_MEMORY, "%s: out of memory", fn);
    if (b->n - HDR > STORE_MAX_FRAME)
        return -(int)dp_fail(DP_ERR_ARG, "%s: the request is %zu bytes; the store takes at most %u (64 MiB)",
                             fn, b->n - HDR, STORE_MAX_FRAME);
    if (++s->next_id == 0)
        s->next_id = 1;
    id = s->next_id;
    store_put_u32(b->p, FRAME_MAGIC);
    b->p[4] = FRAME_VERSION;
    b->p[5] = (unsigned char)op;
    b->p[6] = b->p[7] = 0;
    store_put_u32(b->p + 8, id);
    store_put_u32(b->p + 12, (uint32_t)(b->n - HDR));
    e = store_send_all(s->fd, b->p, b->n, deadline > store_now() + 60 ? deadline : store_now() + 60);
    if (e != 0)
        return -(int)conn_lost(s, fn, e, 0);
    if (op == OP_CANCEL || op == OP_BYE)
        return 0;
    return read_reply(s, fn, id, deadline, rep);
}

/* The common ending: an ERROR reply or an unexpected op become errors. */
static dp_status reply_status(dp_store *s, const char *fn, const struct reply *rep, int want)
{
    if (rep->op == want)
        return DP_OK;
    if (rep->op == OP_ERROR) {
        struct cursor cu = { rep->body, rep->len, 0 };
        size_t n;
        const unsigned char *m = take_field(&cu, &n);
        return dp_fail(DP_ERR_STATE, "%s: %.*s", fn, m ? (int)n : 7, m ? (const char *)m : "unknown");
    }
    return dp_fail(DP_ERR_IO, "%s: the store at %s:%d answered with op %d", fn, s->host, s->port, rep->op);
}

/* The one field of a VALUE or INT reply. */
static const unsigned char *reply_field(const struct reply *rep, size_t *n)
{
    struct cursor cu = { rep->body, rep->len, 0 };
    const unsigned char *f = take_field(&cu, n);
    return cu.bad || cu.n != 0 ? NULL : f;
}

static dp_status no_reply(dp_store *s, const char *fn, double timeout_s)
{
    return dp_fail(DP_ERR_IO, "%s: no reply from the store at %s:%d within %g s", fn, s->host, s->port,
                   timeout_s);
}

/* One request that expects an immediate reply of op `want`. */
static dp_status simple_call(dp_store *s, const char *fn, int op, struct store_buf *b, int want,
                             struct reply *rep)
{
    int r = rpc(s, fn, op, b, store_deadline(s, 0), rep);
    dp_status st;
    store_buf_free(b);
    if (r == ETIMEDOUT)
        return no_reply(s, fn, s->timeout_s);
    if (r != 0)
        return (dp_status)-r;
    if ((st = reply_status(s, fn, rep, want)) != DP_OK) {
        free(rep->body);
        rep->body = NULL;
    }
    return st;
}

static dp_status dl_set(dp_store *s, const char *key, const void *value, size_t len)
{
    struct store_buf b = { 0 };
    struct reply rep;
    dp_status st;
    req_begin(&b);
    req_key(&b, key);
    req_field(&b, value, len);
    st = simple_call(s, "dp_store_set", OP_SET, &b, OP_OK, &rep);
    free(rep.body);
    return st;
}

static dp_status copy_value(const char *fn, const unsigned char *f, size_t n, void **value, size_t *len)
{
    void *p = malloc(n + 1);
    if (p == NULL)
        return dp_fail(DP_ERR_MEMORY, "%s: out of memory for a value of %zu bytes", fn, n);
    if (n)
        memcpy(p, f, n);
    ((char *)p)[n] = '\0';   /* a convenience for text values; len excludes it */
    *value = p;
    *len = n;
    return DP_OK;
}

/* After a GET or WAIT timed out: tell the server to forget it. */
static void cancel_wait(dp_store *s)
{
    struct store_buf b = { 0 };
    struct reply rep;
    req_begin(&b);
    s->next_id--;      /* CANCEL carries the id of the request it cancels */
    rpc(s, "dp_store_cancel", OP_CANCEL, &b, store_now() + 5, &rep);
    store_buf_free(&b);
}

static dp_status dl_get(dp_store *s, const char *key, void **value, size_t *len, double timeout_s)
{
    static const char fn[] = "dp_store_get";
    struct store_buf b = { 0 };
    struct reply rep;
    const unsigned char *f;
    size_t n;
    double t = timeout_s > 0 ? timeout_s : s->timeout_s;
    int r;
    dp_status st;
    req_begin(&b);
    req_key(&b, key);
    r = rpc(s, fn, OP_GET, &b, store_now() + t, &rep);
    store_buf_free(&b);
    if (r == ETIMEDOUT) {
        char k[128];
        cancel_wait(s);
        key_str(k, sizeof k, (const unsigned char *)key, strlen(key));
        return dp_fail(DP_ERR_IO, "%s: timed out after %g s waiting for key '%s' in the store at %s:%d",
                       fn, t, k, s->host, s->port);
    }
    if (r != 0)
        return (dp_status)-r;
    if ((st = reply_status(s, fn, &rep, OP_VALUE)) == DP_OK) {
        f = reply_field(&rep, &n);
        st = f ? copy_value(fn, f, n, value, len)
               : dp_fail(DP_ERR_IO, "%s: the store at %s:%d sent a malformed value", fn, s->host, s->port);
    }
    free(rep.body);
    return st;
}

static dp_status int_reply(dp_store *s, const char *fn, struct reply *rep, int64_t *v)
{
    size_t n;
    const unsigned char *f = reply_field(rep, &n);
    if (f == NULL || n != 8)
        return dp_fail(DP_ERR_IO, "%s: the store at %s:%d sent a malformed integer", fn, s->host, s->port);
    *v = (int64_t)store_get_u64(f);
    return DP_OK;
}

static dp_status dl_add(dp_store *s, const char *key, int64_t delta, int64_t *result)
{
    struct store_buf b = { 0 };
    struct reply rep;
    dp_status st;
    int64_t v = 0;
    req_begin(&b);
    req_key(&b, key);
    req_i64(&b, delta);
    st = simple_call(s, "dp_store_add", OP_ADD, &b, OP_INT, &rep);
    if (st == DP_OK)
        st = int_reply(s, "dp_store_add", &rep, &v);
    if (st == DP_OK && result)
        *result = v;
    free(rep.body);
    return st;
}

static dp_status dl_compare_set(dp_store *s, const char *key, const void *expected, size_t expected_len,
                                const void *desired, size_t desired_len, void **current,
                                size_t *current_len)
{
    static const char fn[] = "dp_store_compare_set";
    struct store_buf b = { 0 };
    struct reply rep;
    const unsigned char *f;
    size_t n;
    dp_status st;
    req_begin(&b);
    req_key(&b, key);
    req_field(&b, expected, expected_len);
    req_field(&b, desired, desired_len);
    st = simple_call(s, fn, OP_CAS, &b, OP_VALUE, &rep);
    if (st == DP_OK) {
        f = reply_field(&rep, &n);
        if (f == NULL)
            st = dp_fail(DP_ERR_IO, "%s: the store at %s:%d sent a malformed value", fn, s->host, s->port);
        else if (current)
            st = copy_value(fn, f, n, current, current_len);
    }
    free(rep.body);
    return st;
}

static void add_keys(struct store_buf *b, const char *const *keys, int n)
{
    for (int i = 0; i < n; i++)
        req_key(b, keys[i]);
}

static dp_status dl_check(dp_store *s, const char *const *keys, int n, int *all_present)
{
    struct store_buf b = { 0 };
    struct reply rep;
    dp_status st;
    int64_t v = 0;
    req_begin(&b);
    add_keys(&b, keys, n);
    st = simple_call(s, "dp_store_check", OP_CHECK, &b, OP_INT, &rep);
    if (st == DP_OK)
        st = int_reply(s, "dp_store_check", &rep, &v);
    if (st == DP_OK)
        *all_present = v != 0;
    free(rep.body);
    return st;
}

/* The keys of a timed-out wait that are still missing, for the message;
 * returns how many it names. */
static int missing_keys(dp_store *s, const char *const *keys, int n, char *buf, size_t size)
{
    const char **miss = malloc((size_t)n * sizeof *miss);
    int i, m = 0, present;
    if (miss == NULL || n > 64) {
        store_key_list(buf, size, keys, n);
        free(miss);
        return n;
    }
    for (i = 0; i < n; i++) {
        if (dl_check(s, &keys[i], 1, &present) != DP_OK) {
            m = -1;
            break;
        }
        if (!present)
            miss[m++] = keys[i];
    }
    if (m > 0)
        store_key_list(buf, size, miss, m);
    else
        store_key_list(buf, size, keys, m = n);
    free(miss);
    return m;
}

static dp_status dl_wait(dp_store *s, const char *const *keys, int n, double timeout_s)
{
    static const char fn[] = "dp_store_wait";
    struct store_buf b = { 0 };
    struct reply rep;
    double t = timeout_s > 0 ? timeout_s : s->timeout_s;
    int r;
    dp_status st;
    req_begin(&b);
    add_keys(&b, keys, n);
    r = rpc(s, fn, OP_WAIT, &b, store_now() + t, &rep);
    store_buf_free(&b);
    if (r == ETIMEDOUT) {
        char list[600];
        int m;
        cancel_wait(s);
        m = missing_keys(s, keys, n, list, sizeof list);
        return dp_fail(DP_ERR_IO, "%s: timed out after %g s waiting for key%s %s in the store at %s:%d",
                       fn, t, m == 1 ? "" : "s", list, s->host, s->port);
    }
    if (r != 0)
        return (dp_status)-r;
    st = reply_status(s, fn, &rep, OP_OK);
    free(rep.body);
    return st;
}

static dp_status dl_del(dp_store *s, const char *key, int *deleted)
{
    struct store_buf b = { 0 };
    struct reply rep;
    dp_status st;
    int64_t v = 0;
    req_begin(&b);
    req_key(&b, key);
    st = simple_call(s, "dp_store_delete", OP_DELETE, &b, OP_INT, &rep);
    if (st == DP_OK)
        st = int_reply(s, "dp_store_delete", &rep, &v);
    if (st == DP_OK && deleted)
        *deleted = v != 0;
    free(rep.body);
    return st;
}

static void dl_close(dp_store *s)
{
    if (s->fd >= 0 && s->failed == NULL) {
        struct store_buf b = { 0 };
        struct reply rep;
        req_begin(&b);
        rpc(s, "dp_store_close", OP_BYE, &b, store_now() + 1, &rep);
        store_buf_free(&b);
    }
    if (s->fd >= 0)
        close(s->fd);
    s->fd = -1;
    server_stop(s->server);
    s->server = NULL;
}

static const struct store_ops dplua_ops = {
    dl_set, dl_get, dl_add, dl_compare_set, dl_wait, dl_check, dl_del, dl_close
};

/* HELLO: the token, rank and generation; the server answers OK or why
 * not. On a failure *again says whether connecting again may succeed:
 * HELLO_OTHER_GENERATION when the server refused the generation alone,
 * HELLO_LOST when the connection ended before the answer (a store going
 * away, whose successor may be coming; or not a dplua store), else 0. */
enum { HELLO_OTHER_GENERATION = 1, HELLO_LOST };
#define HELLO_LOST_TRIES 3   /* handshakes lost in a row, tried again (generation set) */
static dp_status hello(dp_store *s, const char *token, int64_t generation, double deadline, int *again)
{
    static const char fn[] = "dp_store_open";
    struct store_buf b = { 0 };
    struct reply rep;
    dp_status st;
    int r;
    req_begin(&b);
    req_key(&b, token);
    req_i64(&b, s->rank);
    req_i64(&b, generation);
    *again = 0;
    r = rpc(s, fn, OP_HELLO, &b, deadline, &rep);
    store_buf_free(&b);
    if (r == ETIMEDOUT)
        return dp_fail(DP_ERR_IO, "%s: the server at %s:%d did not answer the handshake (is it a dplua "
                       "store? under torchrun, MASTER_PORT is the agent's PyTorch TCPStore)",
                       fn, s->host, s->port);
    if (r != 0) {
        if (s->failed)   /* set by conn_lost, and only there */
            *again = HELLO_LOST;
        if (s->failed && strstr(s->failed, "closed by the store"))
            return dp_fail(DP_ERR_IO, "%s: the server at %s:%d closed the connection during the "
                           "handshake (is it a dplua store of this job? under torchrun, MASTER_PORT is "
                           "the agent's PyTorch TCPStore)", fn, s->host, s->port);
        return (dp_status)-r;
    }
    if (rep.op == OP_ERROR) {
        struct cursor cu = { rep.body, rep.len, 0 };
        size_t n = 0;
        const unsigned char *m = take_field(&cu, &n);
        if (m && n >= strlen(GENERATION_REFUSED) && memcmp(m, GENERATION_REFUSED, strlen(GENERATION_REFUSED)) == 0)
            *again = HELLO_OTHER_GENERATION;
        st = dp_fail(DP_ERR_STATE, "%s: the store at %s:%d refused this client: %.*s%s", fn, s->host,
                     s->port, m ? (int)n : 0, m ? (const char *)m : "",
                     *again ? " (did the ranks call init_process_group a different number of times?)" : "");
    } else {
        st = reply_status(s, fn, &rep, OP_OK);
    }
    free(rep.body);
    return st;
}

/* ======================================================================== */
/* the public API                                                            */
/* ======================================================================== */

dp_status dp_store_open(dp_store **out, const char *host, int port, int is_server, int rank,
                        const char *token, int64_t generation, double timeout_s)
{
    dp_store *s;
    dp_status st;
    double deadline;
    if (out == NULL)
        return dp_fail(DP_ERR_ARG, "dp_store_open: out is NULL");
    *out = NULL;
    if (port < (is_server ? 0 : 1) || port > 65535)
        return dp_fail(DP_ERR_ARG, "dp_store_open: port %d is out of range (%d..65535)", port,
                       is_server ? 0 : 1);
    if (rank < -1)
        return dp_fail(DP_ERR_ARG, "dp_store_open: rank %d (expected -1 or a rank >= 0)", rank);
    if (token == NULL)
        token = getenv("DPLUA_JOB_TOKEN");
    if (token == NULL)
        token = "";
    if (strlen(token) > 4096)
        return dp_fail(DP_ERR_ARG, "dp_store_open: the job token is %zu bytes (at most 4096)", strlen(token));
    s = calloc(1, sizeof *s);
    if (s == NULL)
        return dp_fail(DP_ERR_MEMORY, "dp_store_open: out of memory");
    pthread_mutex_init(&s->lock, NULL);
    s->ops = &dplua_ops;
    s->fd = -1;
    s->rank = rank;
    s->timeout_s = timeout_s > 0 ? timeout_s : STORE_DEFAULT_TIMEOUT;
    deadline = store_now() + s->timeout_s;
    snprintf(s->host, sizeof s->host, "%s", host && *host ? host : "127.0.0.1");
    if (is_server) {
        st = server_start(&s->server, host, port, token, generation);
        if (st != DP_OK) {
            free(s);
            return st;
        }
        port = s->server->port;
    }
    s->port = port;
    /* A store of another generation (the last init_process_group's, not
     * yet closed by its rank 0) refuses the handshake: connect again until
     * this one's serves or the time is up. One that goes away during the
     * handshake (closing just then) is tried again a few times in a row;
     * a peer that is no dplua store does the same at every try, and is
     * then reported as before. */
    for (int again = 1, tries = 0, lost_in_a_row = 0; again; tries++) {
        const double left = deadline - store_now();
        st = store_connect(&s->fd, "dp_store_open", s->server ? s->server->connect_host : s->host, port,
                           tries == 0 ? s->timeout_s : left > 0.001 ? left : 0.001);
        if (st == DP_OK)
            st = hello(s, token, generation, deadline, &again);
        else
            again = 0;
        lost_in_a_row = again == HELLO_LOST ? lost_in_a_row + 1 : 0;
        if (again == HELLO_LOST && (generation == 0 || lost_in_a_row > HELLO_LOST_TRIES))
            again = 0;
        if (st != DP_OK && again && store_now() + 0.1 < deadline) {
            if (s->fd >= 0)
                close(s->fd);
            s->fd = -1;
            free(s->failed);
            s->failed = NULL;
            usleep(20000);
        } else {
            again = 0;
        }
    }
    if (st != DP_OK) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", dp_last_error());
        dl_close(s);
        free(s->failed);
        free(s);
        return dp_fail(st, "%s", msg);
    }
    *out = s;
    return DP_OK;
}

dp_status dp_store_open_torch(dp_store **out, const char *host, int port, double timeout_s)
{
    if (out == NULL)
        return dp_fail(DP_ERR_ARG, "dp_store_open_torch: out is NULL");
    *out = NULL;
    if (port < 1 || port > 65535)
        return dp_fail(DP_ERR_ARG, "dp_store_open_torch: port %d is out of range (1..65535)", port);
    return torchstore_open(out, host && *host ? host : "127.0.0.1", port,
                           timeout_s > 0 ? timeout_s : STORE_DEFAULT_TIMEOUT);
}

int dp_store_port(const dp_store *s)
{
    return s ? s->port : -1;
}

static dp_status check_store(const char *fn, const dp_store *s)
{
    if (s == NULL)
        return dp_fail(DP_ERR_ARG, "%s: the store is NULL", fn);
    return DP_OK;
}

static dp_status check_key(const char *fn, const char *key)
{
    if (key == NULL)
        return dp_fail(DP_ERR_ARG, "%s: the key is NULL", fn);
    return DP_OK;
}

static dp_status check_keys(const char *fn, const char *const *keys, int n)
{
    if (n < 1 || keys == NULL)
        return dp_fail(DP_ERR_ARG, "%s: expected at least one key, got %d", fn, keys ? n : 0);
    for (int i = 0; i < n; i++)
        if (keys[i] == NULL)
            return dp_fail(DP_ERR_ARG, "%s: key %d is NULL", fn, i + 1);
    return DP_OK;
}

static dp_status check_bytes(const char *fn, const char *what, const void *p, size_t len)
{
    if (p == NULL && len > 0)
        return dp_fail(DP_ERR_ARG, "%s: %s is NULL with length %zu", fn, what, len);
    return DP_OK;
}

dp_status dp_store_set(dp_store *s, const char *key, const void *value, size_t len)
{
    static const char fn[] = "dp_store_set";
    dp_status st;
    if ((st = check_store(fn, s)) || (st = check_key(fn, key)) || (st = check_bytes(fn, "value", value, len)))
        return st;
    pthread_mutex_lock(&s->lock);
    st = s->ops->set(s, key, value ? value : "", len);
    pthread_mutex_unlock(&s->lock);
    return st;
}

dp_status dp_store_get(dp_store *s, const char *key, void **value, size_t *len, double timeout_s)
{
    static const char fn[] = "dp_store_get";
    dp_status st;
    if ((st = check_store(fn, s)) || (st = check_key(fn, key)))
        return st;
    if (value == NULL || len == NULL)
        return dp_fail(DP_ERR_ARG, "dp_store_get: value and len must not be NULL");
    *value = NULL;
    *len = 0;
    pthread_mutex_lock(&s->lock);
    st = s->ops->get(s, key, value, len, timeout_s);
    pthread_mutex_unlock(&s->lock);
    return st;
}

dp_status dp_store_add(dp_store *s, const char *key, int64_t delta, int64_t *result)
{
    static const char fn[] = "dp_store_add";
    dp_status st;
    if ((st = check_store(fn, s)) || (st = check_key(fn, key)))
        return st;
    pthread_mutex_lock(&s->lock);
    st = s->ops->add(s, key, delta, result);
    pthread_mutex_unlock(&s->lock);
    return st;
}

dp_status dp_store_compare_set(dp_store *s, const char *key, const void *expected, size_t expected_len,
                               const void *desired, size_t desired_len, void **current, size_t *current_len)
{
    static const char fn[] = "dp_store_compare_set";
    dp_status st;
    if ((st = check_store(fn, s)) || (st = check_key(fn, key)) ||
        (st = check_bytes(fn, "expected", expected, expected_len)) ||
        (st = check_bytes(fn, "desired", desired, desired_len)))
        return st;
    if ((current == NULL) != (current_len == NULL))
        return dp_fail(DP_ERR_ARG, "%s: current and current_len must both be NULL or both be set", fn);
    if (current) {
        *current = NULL;
        *current_len = 0;
    }
    pthread_mutex_lock(&s->lock);
    st = s->ops->compare_set(s, key, expected ? expected : "", expected_len, desired ? desired : "",
                             desired_len, current, current_len);
    pthread_mutex_unlock(&s->lock);
    return st;
}

dp_status dp_store_wait(dp_store *s, const char *const *keys, int n, double timeout_s)
{
    static const char fn[] = "dp_store_wait";
    dp_status st;
    if ((st = check_store(fn, s)) || (st = check_keys(fn, keys, n)))
        return st;
    pthread_mutex_lock(&s->lock);
    st = s->ops->wait(s, keys, n, timeout_s);
    pthread_mutex_unlock(&s->lock);
    return st;
}

dp_status dp_store_check(dp_store *s, const char *const *keys, int n, int *all_present)
{
    static const char fn[] = "dp_store_check";
    dp_status st;
    if ((st = check_store(fn, s)) || (st = check_keys(fn, keys, n)))
        return st;
    if (all_present == NULL)
        return dp_fail(DP_ERR_ARG, "%s: all_present is NULL", fn);
    pthread_mutex_lock(&s->lock);
    st = s->ops->check(s, keys, n, all_present);
    pthread_mutex_unlock(&s->lock);
    return st;
}

dp_status dp_store_delete(dp_store *s, const char *key, int *deleted)
{
    static const char fn[] = "dp_store_delete";
    dp_status st;
    if ((st = check_store(fn, s)) || (st = check_key(fn, key)))
        return st;
    pthread_mutex_lock(&s->lock);
    st = s->ops->del(s, key, deleted);
    pthread_mutex_unlock(&s->lock);
    return st;
}

void store_retain(dp_store *s)
{
    __atomic_add_fetch(&s->holders, 1, __ATOMIC_RELAXED);
}

void dp_store_close(dp_store *s)
{
    if (s == NULL || __atomic_fetch_sub(&s->holders, 1, __ATOMIC_ACQ_REL) > 0)
        return;   /* (another holder still uses it) */
    s->ops->close(s);
    pthread_mutex_destroy(&s->lock);
    free(s->failed);
    free(s);
}

void dp_free(void *p)
{
    free(p);
}
