/*
 * store.h — internals shared by the rendezvous store's files: the client
 * handle and its table of operations, and socket.c's helpers.
 *
 *   store_client.c   the public dp_store_* functions and the client of
 *                    dplua's own protocol (store_proto.h)
 *   store_server.c   the server of that protocol, on a background thread
 *   torchstore.c     the client of PyTorch's TCPStore protocol
 *   socket.c         sockets with deadlines, wire integers, byte buffers
 *
 * A dp_store is a client handle with a table of operations; the public
 * dp_store_* functions of dplua.h check their arguments and dispatch
 * through it. Sockets are non-blocking and every wait is a poll() bounded
 * by a deadline on the monotonic clock, so no call can hang past its
 * timeout.
 */
#ifndef DP_DIST_STORE_H
#define DP_DIST_STORE_H

#include <pthread.h>
#include "dplua.h"

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#define STORE_DEFAULT_TIMEOUT 300.0   /* seconds, PyTorch's TCPStore default */
#define STORE_MAX_FRAME (64u << 20)   /* the largest body of one frame */

struct store_server;

struct store_ops {
    dp_status (*set)(dp_store *s, const char *key, const void *value, size_t len);
    dp_status (*get)(dp_store *s, const char *key, void **value, size_t *len, double timeout_s);
    dp_status (*add)(dp_store *s, const char *key, int64_t delta, int64_t *result);
    dp_status (*compare_set)(dp_store *s, const char *key, const void *expected, size_t expected_len,
                             const void *desired, size_t desired_len, void **current,
                             size_t *current_len);
    dp_status (*wait)(dp_store *s, const char *const *keys, int n, double timeout_s);
    dp_status (*check)(dp_store *s, const char *const *keys, int n, int *all_present);
    dp_status (*del)(dp_store *s, const char *key, int *deleted);
    void (*close)(dp_store *s);
};

struct dp_store {
    const struct store_ops *ops;
    pthread_mutex_t lock;    /* one request at a time on the connection (public calls take it) */
    int fd;                  /* the client's connection, -1 when none */
    char host[256];          /* where the client connects (for messages) */
    int port;
    double timeout_s;        /* for connecting and for calls that take none */
    int rank;                /* announced to a dplua server; -1: none */
    uint32_t next_id;        /* request ids (dplua protocol) */
    char *failed;            /* set when the connection is lost: later calls fail with it */
    struct store_server *server;  /* non-NULL on the rank that serves (store_proto.h) */
    int torch_proto;         /* torchstore.c: 1 (PyTorch 1.x) or 2 (PyTorch 2.x) */
    int holders;             /* references besides the opener's (store_retain); dp_store_close frees at the last */
    int token_file;          /* the server wrote its token to the file (token.c), removed at close */
    char token[64];          /* that token */
};

/* Another reference to s (a process group's), given back by dp_store_close:
 * the store is closed and freed when the opener and every holder have. */
void store_retain(dp_store *s);

/* Deadline `timeout_s` from now; timeout_s <= 0 picks the store's own. */
double store_deadline(const dp_store *s, double timeout_s);

/* The calls of this thread that take no timeout of their own (set, check,
 * delete, add, compare_set) wait at most `seconds` for the store's reply
 * instead of the store's timeout; 0 lifts the bound. For process groups,
 * which must not wait a whole timeout on a store that stopped answering
 * (rank 0 frozen: its connection open, its server silent). A reply that
 * comes later is dropped by the next call, so the connection stays in
 * step. dplua's protocol only (a PyTorch store keeps its timeout). */
void store_bound_replies(double seconds);

/* Whether s lost its connection (the store's process exited or died), as
 * opposed to a call that only timed out. */
int store_lost(dp_store *s);

/* ---------------------------------------------------------------- socket.c */

/* The monotonic clock, in seconds. */
double store_now(void);

/* Waits for `events` (POLLIN, POLLOUT) on fd before the deadline: 0 when
 * ready, ETIMEDOUT, or an errno value. */
int store_wait_fd(int fd, short events, double deadline);

/* Connects to host:port, retrying until timeout_s has passed (the server
 * may start later). The socket is non-blocking, close-on-exec, TCP_NODELAY.
 * On failure: "FN: could not connect to the store at H:P within T s: why". */
dp_status store_connect(int *fd, const char *fn, const char *host, int port, double timeout_s);

/* Send or receive exactly n bytes before the deadline. Return 0, or
 * ETIMEDOUT, or an errno value (EPIPE/ECONNRESET...); 0 bytes read at
 * end of stream is reported as ECONNRESET with *eof set when eof != NULL. */
int store_send_all(int fd, const void *buf, size_t n, double deadline);
int store_recv_all(int fd, void *buf, size_t n, double deadline, int *eof);

/* A non-blocking, close-on-exec socket listening on addr (an IPv6 one
 * takes IPv4 too), in *fd; the port it got (addr's may be 0) in *port.
 * Returns 0 or an errno value. */
int store_listen(const struct sockaddr *addr, socklen_t len, int *fd, int *port);
/* Whether addr is a loopback address (127.0.0.0/8 or ::1). */
int store_is_loopback(const struct sockaddr *addr);

/* Whether addr is one of this machine's addresses (loopback included;
 * when it cannot tell, yes). Whether host resolves to one of them. */
int store_is_local_addr(const struct sockaddr *addr);
int store_is_local_host(const char *host);

/* ---------------------------------------------------------------- token.c */

/* The job token when the caller gave none (docs/DISTRIBUTED.md, "The job
 * token"): a file only this user can read, keyed by the store's host and
 * port, in $XDG_CACHE_HOME/dplua or ~/.cache/dplua. The server makes a
 * random token and writes it there (token_file_write); a client reads it
 * (token_file_read: 0, ENOENT while it is not there yet, or another errno
 * with a message in why). token_derived: the token anyone can compute
 * from host and port, for clients on another host that cannot see the
 * file. Tokens are at most TOKEN_MAX bytes. */
#define TOKEN_MAX 4096
int token_random(char *out, size_t size);
int token_file_write(const char *host, int port, const char *token, char *why, size_t why_size);
int token_file_read(const char *host, int port, char *out, size_t size, char *why, size_t why_size);
void token_file_remove(const char *host, int port, const char *token);
void token_derived(const char *host, int port, char *out, size_t size);

/* Little-endian integers on the wire. */
void store_put_u32(unsigned char *p, uint32_t v);
void store_put_u64(unsigned char *p, uint64_t v);
uint32_t store_get_u32(const unsigned char *p);
uint64_t store_get_u64(const unsigned char *p);

/* A growable byte buffer for building requests. `oom` is set (and later
 * appends do nothing) when an allocation fails. */
struct store_buf {
    unsigned char *p;
    size_t n, cap;
    int oom;
};
void store_buf_add(struct store_buf *b, const void *data, size_t n);
void store_buf_free(struct store_buf *b);

/* A key for a message: printable bytes as they are, others as \xNN, at
 * most 80 of them. */
void store_key_str(char *buf, size_t size, const unsigned char *key, size_t n);
/* "'a', 'b' and 3 more": a short list of keys for error messages. */
void store_key_list(char *buf, size_t size, const char *const *keys, int n);

/* torchstore.c: the handle for dp_store_open_torch. */
dp_status torchstore_open(dp_store **out, const char *host, int port, double timeout_s);

#endif /* DP_DIST_STORE_H */
