/*
 * torchstore.c — a client of PyTorch's TCPStore, behind the dp_store_*
 * interface: under torchrun the agent already serves MASTER_PORT with a
 * TCPStore (TORCHELASTIC_USE_AGENT_STORE=True), and the ranks are its
 * clients.
 *
 * The wire protocol (from PyTorch's TCPStore.cpp and TCPStoreBackend.hpp;
 * docs/DISTRIBUTED.md says the same): a request is one query-type byte
 * followed by its arguments; strings and values are a u64 length and the
 * bytes; integers are in the host's (little-endian) order; the client adds
 * the prefix "/" to every key, as TCPStore does, so keys agree with
 * Python's store.set("k", ...). Two numberings exist:
 *
 *   query         protocol 2   protocol 1   arguments -> reply
 *   VALIDATE          0            -        u32 0x3C85F7CE -> none (first message)
 *   SET               1            0        key, value -> none
 *   COMPARE_SET       2            1        key, expected, desired -> value
 *   GET               3            2        key -> value (sent after WAIT, as TCPStore does)
 *   ADD               4            3        key, i64 -> i64
 *   CHECK             5            4        u64 n, n keys -> u8 READY 0 / NOT_READY 1
 *   WAIT              6            5        u64 n, n keys -> u8 STOP_WAITING 0 (when all exist)
 *   GETNUMKEYS        7            6        -> i64 (only in the protocol probe)
 *   DELETE_KEY        8            8        key -> i64 (keys deleted)
 *   CANCEL_WAIT      12            -        -> u8 WAIT_CANCELED 1 (after a timed-out WAIT)
 *
 * Protocol 2 is PyTorch 2.x's since the VALIDATE handshake (the classic
 * and the libuv server alike, so torchrun's agent store); protocol 1 is
 * PyTorch 1.x's (Debian's 1.13) and early 2.x's. A server of protocol 2
 * closes a connection whose first message is not VALIDATE.
 *
 * Which one a server speaks is found by a probe unless
 * DPLUA_TORCH_STORE_PROTOCOL is 1 or 2: the client sends VALIDATE and four
 * GETNUMKEYS in protocol 2. A protocol-2 server answers four integers (and
 * the connection is kept); a protocol-1 server reads the same bytes as a
 * SET whose key length is about 5e17, fails to allocate it and closes the
 * connection, which is the answer. Under protocol 1 a WAIT that timed out
 * cannot be cancelled, so the client reconnects.
 */
#define _GNU_SOURCE
#include "dist/store.h"
#include "core/tensor.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define VALIDATION_MAGIC 0x3C85F7CEu
#define VALUE_MAX ((uint64_t)1 << 31)   /* larger replies are taken as garbage */

enum { Q_VALIDATE, Q_SET, Q_COMPARE_SET, Q_GET, Q_ADD, Q_CHECK, Q_WAIT, Q_GETNUMKEYS,
       Q_DELETE_KEY, Q_CANCEL_WAIT, Q_COUNT };

static const int qcode[3][Q_COUNT] = {
    [1] = { -1, 0, 1, 2, 3, 4, 5, 6, 8, -1 },
    [2] = { 0, 1, 2, 3, 4, 5, 6, 7, 8, 12 },
};

enum { READY = 0, NOT_READY = 1 };
enum { STOP_WAITING = 0, WAIT_CANCELED = 1 };

/* ------------------------------------------------------------------------ */
/* requests and replies                                                      */
/* ------------------------------------------------------------------------ */

static void q_begin(dp_store *s, struct store_buf *b, int q)
{
    unsigned char c = (unsigned char)qcode[s->torch_proto][q];
    store_buf_add(b, &c, 1);
}

static void q_u64(struct store_buf *b, uint64_t v)
{
    unsigned char x[8];
    store_put_u64(x, v);
    store_buf_add(b, x, 8);
}

static void q_bytes(struct store_buf *b, const void *p, size_t n)
{
    q_u64(b, n);
    store_buf_add(b, p, n);
}

/* A key, with TCPStore's prefix "/". */
static void q_key(struct store_buf *b, const char *key)
{
    q_u64(b, strlen(key) + 1);
    store_buf_add(b, "/", 1);
    store_buf_add(b, key, strlen(key));
}

static dp_status ts_lost(dp_store *s, const char *fn, int err, int eof)
{
    if (s->failed == NULL) {
        char msg[512];
        snprintf(msg, sizeof msg, "lost the connection to PyTorch's TCPStore at %s:%d (%s)",
                 s->host, s->port, eof ? "closed by the store" : strerror(err));
        s->failed = strdup(msg);
    }
    if (s->fd >= 0)
        close(s->fd);
    s->fd = -1;
    return dp_fail(DP_ERR_IO, "%s: %s", fn, s->failed ? s->failed : "lost the connection to the store");
}

static dp_status ts_send(dp_store *s, const char *fn, struct store_buf *b)
{
    int e;
    if (s->failed)
        return dp_fail(DP_ERR_IO, "%s: %s", fn, s->failed);
    if (b->oom) {
        store_buf_free(b);
        return dp_fail(DP_ERR_MEMORY, "%s: out of memory", fn);
    }
    e = store_send_all(s->fd, b->p, b->n, store_deadline(s, 0));
    store_buf_free(b);
    return e ? ts_lost(s, fn, e, 0) : DP_OK;
}

/* Exactly n bytes of a reply, within the store's timeout. */
static dp_status ts_recv(dp_store *s, const char *fn, void *p, size_t n)
{
    int eof = 0, e = store_recv_all(s->fd, p, n, store_deadline(s, 0), &eof);
    if (e == ETIMEDOUT) {
        ts_lost(s, fn, e, 0);   /* the reply may still come: out of step */
        return dp_fail(DP_ERR_IO, "%s: no reply from PyTorch's TCPStore at %s:%d within %g s",
                       fn, s->host, s->port, s->timeout_s);
    }
    return e ? ts_lost(s, fn, e, eof) : DP_OK;
}

static dp_status ts_recv_i64(dp_store *s, const char *fn, int64_t *v)
{
    unsigned char x[8];
    dp_status st = ts_recv(s, fn, x, 8);
    if (st == DP_OK)
        *v = (int64_t)store_get_u64(x);
    return st;
}

/* A u64 length and the bytes, into a malloc'd, NUL-terminated buffer. */
static dp_status ts_recv_value(dp_store *s, const char *fn, void **value, size_t *len)
{
    unsigned char x[8];
    uint64_t n;
    char *p;
    dp_status st = ts_recv(s, fn, x, 8);
    if (st != DP_OK)
        return st;
    n = store_get_u64(x);
    if (n > VALUE_MAX) {
        ts_lost(s, fn, EPROTO, 0);
        return dp_fail(DP_ERR_IO, "%s: PyTorch's TCPStore at %s:%d sent a value of %llu bytes",
                       fn, s->host, s->port, (unsigned long long)n);
    }
    p = malloc(n + 1);
    if (p == NULL) {
        ts_lost(s, fn, ENOMEM, 0);
        return dp_fail(DP_ERR_MEMORY, "%s: out of memory for a value of %llu bytes", fn,
                       (unsigned long long)n);
    }
    if ((st = ts_recv(s, fn, p, n)) != DP_OK) {
        free(p);
        return st;
    }
    p[n] = '\0';
    if (value) {
        *value = p;
        *len = n;
    } else {
        free(p);
    }
    return DP_OK;
}

/* ------------------------------------------------------------------------ */
/* connecting                                                                */
/* ------------------------------------------------------------------------ */

static dp_status validate(dp_store *s, const char *fn)
{
    struct store_buf b = { 0 };
    unsigned char m[4];
    q_begin(s, &b, Q_VALIDATE);
    store_put_u32(m, VALIDATION_MAGIC);
    store_buf_add(&b, m, 4);
    return ts_send(s, fn, &b);
}

/* The probe of the header comment. Sets s->torch_proto; under protocol 2
 * the probe's connection stays open and validated. */
static dp_status probe(dp_store *s, const char *fn)
{
    unsigned char q[9] = { 0 }, r[32];
    int eof = 0, e;
    q[0] = 0;
    store_put_u32(q + 1, VALIDATION_MAGIC);
    q[5] = q[6] = q[7] = q[8] = 7;   /* GETNUMKEYS, four times */
    e = store_send_all(s->fd, q, sizeof q, store_deadline(s, 0));
    if (e == 0)
        e = store_recv_all(s->fd, r, sizeof r, store_deadline(s, 0), &eof);
    if (e == 0) {
        s->torch_proto = 2;
        return DP_OK;
    }
    close(s->fd);
    s->fd = -1;
    if (e == ETIMEDOUT)
        return dp_fail(DP_ERR_IO, "%s: the server at %s:%d did not answer in PyTorch's TCPStore protocol "
                       "within %g s", fn, s->host, s->port, s->timeout_s);
    if (e != ECONNRESET && e != EPIPE)
        return dp_fail(DP_ERR_IO, "%s: probing the TCPStore at %s:%d: %s", fn, s->host, s->port, strerror(e));
    s->torch_proto = 1;
    return store_connect(&s->fd, fn, s->host, s->port, s->timeout_s);
}

/* A fresh connection, after a WAIT that protocol 1 cannot cancel. */
static dp_status reconnect(dp_store *s, const char *fn)
{
    dp_status st;
    if (s->fd >= 0)
        close(s->fd);
    s->fd = -1;
    st = store_connect(&s->fd, fn, s->host, s->port, s->timeout_s);
    if (st == DP_OK && s->torch_proto == 2)
        st = validate(s, fn);
    if (st != DP_OK && s->failed == NULL)
        s->failed = strdup(dp_last_error());
    return st;
}

/* ------------------------------------------------------------------------ */
/* the operations                                                            */
/* ------------------------------------------------------------------------ */

static dp_status ts_set(dp_store *s, const char *key, const void *value, size_t len)
{
    struct store_buf b = { 0 };
    q_begin(s, &b, Q_SET);
    q_key(&b, key);
    q_bytes(&b, value, len);
    return ts_send(s, "dp_store_set", &b);
}

static void q_keys(struct store_buf *b, const char *const *keys, int n)
{
    q_u64(b, (uint64_t)n);
    for (int i = 0; i < n; i++)
        q_key(b, keys[i]);
}

static dp_status ts_check(dp_store *s, const char *const *keys, int n, int *all_present)
{
    static const char fn[] = "dp_store_check";
    struct store_buf b = { 0 };
    unsigned char r;
    dp_status st;
    q_begin(s, &b, Q_CHECK);
    q_keys(&b, keys, n);
    if ((st = ts_send(s, fn, &b)) != DP_OK || (st = ts_recv(s, fn, &r, 1)) != DP_OK)
        return st;
    if (r != READY && r != NOT_READY)
        return ts_lost(s, fn, EPROTO, 0);
    *all_present = r == READY;
    return DP_OK;
}

/* After a WAIT timed out (protocol 2): cancel it. Returns 1 when the keys
 * came after all (STOP_WAITING crossed our CANCEL_WAIT), 0 when cancelled,
 * or -1 when the connection is lost. */
static int cancel_wait(dp_store *s, const char *fn)
{
    struct store_buf b = { 0 };
    unsigned char r;
    int came = 0;
    q_begin(s, &b, Q_CANCEL_WAIT);
    if (ts_send(s, fn, &b) != DP_OK || ts_recv(s, fn, &r, 1) != DP_OK)
        return -1;
    if (r == STOP_WAITING) {
        came = 1;
        if (ts_recv(s, fn, &r, 1) != DP_OK)
            return -1;
    }
    if (r != WAIT_CANCELED) {
        ts_lost(s, fn, EPROTO, 0);
        return -1;
    }
    return came;
}

/* The message of a timed-out wait, naming the keys still missing. */
static dp_status wait_timeout(dp_store *s, const char *fn, const char *const *keys, int n, double t)
{
    char list[600];
    const char **miss = n <= 64 ? malloc((size_t)n * sizeof *miss) : NULL;
    int i, m = 0, present = 0;
    for (i = 0; miss != NULL && i < n; i++) {
        if (ts_check(s, &keys[i], 1, &present) != DP_OK) {
            m = 0;
            break;
        }
        if (!present)
            miss[m++] = keys[i];
    }
    if (m > 0)
        store_key_list(list, sizeof list, miss, m);
    else
        store_key_list(list, sizeof list, keys, m = n);
    free(miss);
    return dp_fail(DP_ERR_IO, "%s: timed out after %g s waiting for key%s %s in PyTorch's TCPStore at %s:%d",
                   fn, t, m == 1 ? "" : "s", list, s->host, s->port);
}

static dp_status do_wait(dp_store *s, const char *fn, const char *const *keys, int n, double timeout_s)
{
    struct store_buf b = { 0 };
    unsigned char r;
    double t = timeout_s > 0 ? timeout_s : s->timeout_s;
    int eof = 0, e, came;
    dp_status st;
    q_begin(s, &b, Q_WAIT);
    q_keys(&b, keys, n);
    if ((st = ts_send(s, fn, &b)) != DP_OK)
        return st;
    e = store_recv_all(s->fd, &r, 1, store_now() + t, &eof);
    if (e == 0)
        return r == STOP_WAITING ? DP_OK : ts_lost(s, fn, EPROTO, 0);
    if (e != ETIMEDOUT)
        return ts_lost(s, fn, e, eof);
    if (s->torch_proto == 2) {
        came = cancel_wait(s, fn);
        if (came < 0)
            return DP_ERR_IO;
        if (came)
            return DP_OK;
    } else {
        reconnect(s, fn);   /* if it fails, the message below lists every key */
    }
    return wait_timeout(s, fn, keys, n, t);
}

static dp_status ts_wait(dp_store *s, const char *const *keys, int n, double timeout_s)
{
    return do_wait(s, "dp_store_wait", keys, n, timeout_s);
}

static dp_status ts_get(dp_store *s, const char *key, void **value, size_t *len, double timeout_s)
{
    static const char fn[] = "dp_store_get";
    struct store_buf b = { 0 };
    dp_status st = do_wait(s, fn, &key, 1, timeout_s);
    if (st != DP_OK)
        return st;
    q_begin(s, &b, Q_GET);
    q_key(&b, key);
    if ((st = ts_send(s, fn, &b)) != DP_OK)
        return st;
    return ts_recv_value(s, fn, value, len);
}

/* A query about one key whose reply is an i64 (ADD with its delta,
 * DELETE_KEY without); the reply in *v. */
static dp_status ts_key_i64(dp_store *s, const char *fn, int q, const char *key, const int64_t *delta, int64_t *v)
{
    struct store_buf b = { 0 };
    dp_status st;
    q_begin(s, &b, q);
    q_key(&b, key);
    if (delta)
        q_u64(&b, (uint64_t)*delta);
    if ((st = ts_send(s, fn, &b)) != DP_OK)
        return st;
    return ts_recv_i64(s, fn, v);
}

static dp_status ts_add(dp_store *s, const char *key, int64_t delta, int64_t *result)
{
    int64_t v = 0;
    dp_status st = ts_key_i64(s, "dp_store_add", Q_ADD, key, &delta, &v);
    if (st == DP_OK && result)
        *result = v;
    return st;
}

static dp_status ts_compare_set(dp_store *s, const char *key, const void *expected, size_t expected_len,
                                const void *desired, size_t desired_len, void **current, size_t *current_len)
{
    static const char fn[] = "dp_store_compare_set";
    struct store_buf b = { 0 };
    dp_status st;
    q_begin(s, &b, Q_COMPARE_SET);
    q_key(&b, key);
    q_bytes(&b, expected, expected_len);
    q_bytes(&b, desired, desired_len);
    if ((st = ts_send(s, fn, &b)) != DP_OK)
        return st;
    return ts_recv_value(s, fn, current, current_len);
}

static dp_status ts_del(dp_store *s, const char *key, int *deleted)
{
    int64_t v = 0;
    dp_status st = ts_key_i64(s, "dp_store_delete", Q_DELETE_KEY, key, NULL, &v);
    if (st == DP_OK && deleted)
        *deleted = v > 0;
    return st;
}

static void ts_close(dp_store *s)
{
    if (s->fd >= 0)
        close(s->fd);
    s->fd = -1;
}

static const struct store_ops torch_ops = {
    ts_set, ts_get, ts_add, ts_compare_set, ts_wait, ts_check, ts_del, ts_close
};

dp_status torchstore_open(dp_store **out, const char *host, int port, double timeout_s)
{
    static const char fn[] = "dp_store_open_torch";
    const char *want = getenv("DPLUA_TORCH_STORE_PROTOCOL");
    dp_store *s = calloc(1, sizeof *s);
    dp_status st;
    if (s == NULL)
        return dp_fail(DP_ERR_MEMORY, "%s: out of memory", fn);
    pthread_mutex_init(&s->lock, NULL);
    s->ops = &torch_ops;
    s->fd = -1;
    s->rank = -1;
    s->timeout_s = timeout_s;
    s->port = port;
    snprintf(s->host, sizeof s->host, "%s", host);
    if (want && *want && strcmp(want, "auto") != 0 && strcmp(want, "1") != 0 && strcmp(want, "2") != 0) {
        free(s);
        return dp_fail(DP_ERR_ARG, "%s: DPLUA_TORCH_STORE_PROTOCOL is '%s' (expected 1, 2 or auto)", fn, want);
    }
    st = store_connect(&s->fd, fn, host, port, timeout_s);
    if (st == DP_OK) {
        if (want && (strcmp(want, "1") == 0 || strcmp(want, "2") == 0)) {
            s->torch_proto = want[0] - '0';
            if (s->torch_proto == 2)
                st = validate(s, fn);
        } else {
            st = probe(s, fn);
        }
    }
    if (st != DP_OK) {
        if (s->fd >= 0)
            close(s->fd);
        free(s->failed);
        free(s);
        return st;
    }
    *out = s;
    return DP_OK;
}
