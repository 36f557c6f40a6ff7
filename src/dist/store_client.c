/*
 * store_client.c — the rendezvous store as every rank sees it: the public
 * dp_store_* functions of dplua.h, and the client of dplua's own protocol
 * (store_proto.h). dp_store_open with is_server also starts the server
 * (store_server.c) in this process, and its rank is then a client of it
 * like every other; dp_store_open_torch gives a handle that speaks
 * PyTorch's protocol instead (torchstore.c).
 *
 * The public functions check their arguments, take the handle's lock and
 * dispatch through its table of operations, so one handle may be shared
 * by threads; the client below then owns the connection for the call.
 */
#define _GNU_SOURCE
#include "dist/store_proto.h"
#include "core/tensor.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

double store_deadline(const dp_store *s, double timeout_s)
{
    return store_now() + (timeout_s > 0 ? timeout_s : s->timeout_s);
}

/* store_bound_replies: per thread, so that a process group's threads
 * bound their own calls without touching a caller's on the same handle. */
static __thread double reply_bound;

void store_bound_replies(double seconds)
{
    reply_bound = seconds > 0 ? seconds : 0;
}

/* How long a call that takes no timeout waits for its reply. */
static double reply_timeout(const dp_store *s)
{
    return reply_bound > 0 && reply_bound < s->timeout_s ? reply_bound : s->timeout_s;
}

int store_lost(dp_store *s)
{
    pthread_mutex_lock(&s->lock);
    int lost = s->failed != NULL;
    pthread_mutex_unlock(&s->lock);
    return lost;
}

/* ======================================================================== */
/* requests and replies                                                      */
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
        int eof = 0, e = store_wait_fd(s->fd, POLLIN, deadline);
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
    frame_header(b->p, op, id, (uint32_t)(b->n - HDR));
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
    int r = rpc(s, fn, op, b, store_deadline(s, reply_timeout(s)), rep);
    dp_status st;
    store_buf_free(b);
    if (r == ETIMEDOUT)
        return no_reply(s, fn, reply_timeout(s));
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
        store_key_str(k, sizeof k, (const unsigned char *)key, strlen(key));
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

/* One request whose reply is an integer (ADD, CHECK, DELETE). */
static dp_status int_call(dp_store *s, const char *fn, int op, struct store_buf *b, int64_t *v)
{
    struct reply rep;
    size_t n;
    const unsigned char *f;
    dp_status st = simple_call(s, fn, op, b, OP_INT, &rep);
    if (st == DP_OK) {
        f = reply_field(&rep, &n);
        if (f == NULL || n != 8)
            st = dp_fail(DP_ERR_IO, "%s: the store at %s:%d sent a malformed integer", fn, s->host, s->port);
        else
            *v = (int64_t)store_get_u64(f);
    }
    free(rep.body);
    return st;
}

static dp_status dl_add(dp_store *s, const char *key, int64_t delta, int64_t *result)
{
    struct store_buf b = { 0 };
    int64_t v = 0;
    dp_status st;
    req_begin(&b);
    req_key(&b, key);
    req_i64(&b, delta);
    st = int_call(s, "dp_store_add", OP_ADD, &b, &v);
    if (st == DP_OK && result)
        *result = v;
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
    int64_t v = 0;
    dp_status st;
    req_begin(&b);
    add_keys(&b, keys, n);
    st = int_call(s, "dp_store_check", OP_CHECK, &b, &v);
    if (st == DP_OK)
        *all_present = v != 0;
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
    int64_t v = 0;
    dp_status st;
    req_begin(&b);
    req_key(&b, key);
    st = int_call(s, "dp_store_delete", OP_DELETE, &b, &v);
    if (st == DP_OK && deleted)
        *deleted = v != 0;
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
    store_server_stop(s->server);
    if (s->server && s->token_file)
        token_file_remove(s->host, s->port, s->token);
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
enum { HELLO_OTHER_GENERATION = 1, HELLO_LOST, HELLO_WRONG_TOKEN };
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
        else if (m && n >= strlen(TOKEN_REFUSED) && memcmp(m, TOKEN_REFUSED, strlen(TOKEN_REFUSED)) == 0)
            *again = HELLO_WRONG_TOKEN;
        st = dp_fail(DP_ERR_STATE, "%s: the store at %s:%d refused this client: %.*s%s", fn, s->host,
                     s->port, m ? (int)n : 0, m ? (const char *)m : "",
                     *again == HELLO_OTHER_GENERATION
                         ? " (did the ranks call init_process_group a different number of times?)" : "");
    } else {
        st = reply_status(s, fn, &rep, OP_OK);
    }
    free(rep.body);
    return st;
}

/* ======================================================================== */
/* the public API                                                            */
/* ======================================================================== */

/* The token of a store opened without one (token.c), for the client's
 * next try: 0, or EAGAIN while rank 0 has not written it yet, or an
 * error with the message set. A client whose store is on another host
 * and finds no file (no home shared with rank 0's node) takes the token
 * derived from host and port, after REMOTE_FILE_WAIT s, and says so
 * once. *remote: -1 not known yet, 0 the store is on this host, 1 on
 * another, 2 on another and said. */
#define REMOTE_FILE_WAIT 10.0
static int file_token(dp_store *s, char *tok, size_t size, double start, double deadline, int *remote)
{
    char why[700];
    int e = token_file_read(s->host, s->port, tok, size, why, sizeof why);
    if (e == 0)
        return 0;
    if (e != ENOENT) {
        dp_fail(DP_ERR_IO, "dp_store_open: %s", why);
        return e;
    }
    if (*remote < 0)
        *remote = !store_is_local_host(s->host);
    if (*remote && store_now() - start >= REMOTE_FILE_WAIT) {
        token_derived(s->host, s->port, tok, size);
        if (*remote == 2)
            return 0;   /* (said already) */
        *remote = 2;
        fprintf(stderr, "dplua: WARNING: no DPLUA_JOB_TOKEN and no job token file from rank 0 (is the home folder "
                "shared?); joining the store at %s:%d with the token derived from its address and port, which "
                "anyone who can reach it can compute. Set DPLUA_JOB_TOKEN to the same secret on every rank.\n",
                s->host, s->port);
        return 0;
    }
    if (store_now() + 0.05 >= deadline) {
        dp_fail(DP_ERR_IO, "dp_store_open: %s; set DPLUA_JOB_TOKEN to the same secret on every rank when they "
                "do not share this folder", why);
        return e;
    }
    return EAGAIN;
}

/* A server opened without a token: a random one, and the file the
 * clients read it from; clients on other hosts may use the derived one. */
static dp_status serve_with_file_token(dp_store *s, const char *host, int port, int world_size,
                                       int64_t generation, char *tok, size_t size)
{
    char remote[64], why[700];
    dp_status st;
    int e = token_random(tok, size);
    if (e != 0)
        return dp_fail(DP_ERR_IO, "dp_store_open: cannot make a job token: %s", strerror(e));
    token_derived(s->host, port, remote, sizeof remote);
    st = store_server_start(&s->server, host, port, world_size, tok, port > 0 ? remote : NULL, generation);
    if (st != DP_OK)
        return st;
    if (token_file_write(s->host, store_server_port(s->server), tok, why, sizeof why) != 0) {
        store_server_stop(s->server);
        s->server = NULL;
        return dp_fail(DP_ERR_IO, "dp_store_open: %s (or set DPLUA_JOB_TOKEN)", why);
    }
    s->token_file = 1;
    snprintf(s->token, sizeof s->token, "%.63s", tok);   /* (32 hex digits) */
    return DP_OK;
}

dp_status dp_store_open(dp_store **out, const char *host, int port, int is_server, int rank, int world_size,
                        const char *token, int64_t generation, double timeout_s)
{
    dp_store *s;
    dp_status st = DP_ERR_IO;
    double start, deadline;
    char tok[TOKEN_MAX + 1];
    int from_file, remote = -1;
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
    from_file = token == NULL || *token == '\0';
    if (!from_file && strlen(token) > TOKEN_MAX)
        return dp_fail(DP_ERR_ARG, "dp_store_open: the job token is %zu bytes (at most %d)", strlen(token),
                       TOKEN_MAX);
    s = calloc(1, sizeof *s);
    if (s == NULL)
        return dp_fail(DP_ERR_MEMORY, "dp_store_open: out of memory");
    pthread_mutex_init(&s->lock, NULL);
    s->ops = &dplua_ops;
    s->fd = -1;
    s->rank = rank;
    s->timeout_s = timeout_s > 0 ? timeout_s : STORE_DEFAULT_TIMEOUT;
    start = store_now();
    deadline = start + s->timeout_s;
    snprintf(s->host, sizeof s->host, "%s", host && *host ? host : "127.0.0.1");
    if (is_server) {
        st = from_file ? serve_with_file_token(s, host, port, world_size, generation, tok, sizeof tok)
                       : store_server_start(&s->server, host, port, world_size, token, NULL, generation);
        if (st != DP_OK) {
            free(s);
            return st;
        }
        port = store_server_port(s->server);
        if (from_file)
            token = tok;
    }
    s->port = port;
    /* A store of another generation (the last init_process_group's, not
     * yet closed by its rank 0) refuses the handshake: connect again until
     * this one's serves or the time is up. One that goes away during the
     * handshake (closing just then) is tried again a few times in a row;
     * a peer that is no dplua store does the same at every try, and is
     * then reported as before. A token read from the file may be a past
     * job's (rank 0 has not replaced it yet): read it again. */
    for (int again = 1, tries = 0, lost_in_a_row = 0; again; tries++) {
        const double left = deadline - store_now();
        const char *host_now = s->server ? store_server_connect_host(s->server) : s->host;
        if (from_file && !is_server) {
            int e = file_token(s, tok, sizeof tok, start, deadline, &remote);
            if (e == EAGAIN) {
                usleep(50000);
                continue;
            }
            if (e != 0) {
                st = DP_ERR_IO;
                break;
            }
            token = tok;
        }
        st = store_connect(&s->fd, "dp_store_open", host_now, port,
                           tries == 0 ? s->timeout_s : left > 0.001 ? left : 0.001);
        if (st == DP_OK)
            st = hello(s, token, generation, deadline, &again);
        else
            again = 0;
        lost_in_a_row = again == HELLO_LOST ? lost_in_a_row + 1 : 0;
        if (again == HELLO_LOST && (generation == 0 || lost_in_a_row > HELLO_LOST_TRIES))
            again = 0;
        if (again == HELLO_WRONG_TOKEN && !(from_file && !is_server && strncmp(tok, "derived-", 8) != 0))
            again = 0;
        if (st != DP_OK && again && store_now() + 0.1 < deadline) {
            if (s->fd >= 0)
                close(s->fd);
            s->fd = -1;
            free(s->failed);
            s->failed = NULL;
            usleep(again == HELLO_WRONG_TOKEN ? 100000 : 20000);
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
