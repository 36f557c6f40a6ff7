/*
 * store_proto.h — dplua's own store protocol, shared by its server
 * (store_server.c) and its client (store_client.c).
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
 * allocated, and a frame before HELLO may be at most 8 KiB.
 *
 * Strangers are kept from wearing the server down: a connection has 5 s
 * to authenticate; at most 128 wait to (the oldest is closed for a new
 * one), so they hold at most 128 descriptors and 1 MiB; authenticated
 * connections are at most the world size + 64; and a rank may have one
 * connection at a time (a second HELLO for a live rank is refused, and
 * the rank stays alive).
 *
 * GET and WAIT wait on the server: the reply comes when the keys exist.
 * The client bounds its wait with poll() and, on a timeout, sends CANCEL
 * so the server forgets the request. When a connection that announced a
 * rank r closes, the server sets "dplua/dead/<r>" to "exited" (the client
 * said BYE first, from dp_store_close) or "lost" (it did not).
 */
#ifndef DP_DIST_STORE_PROTO_H
#define DP_DIST_STORE_PROTO_H

#include "dist/store.h"

#define FRAME_MAGIC 0x54535044u
#define FRAME_VERSION 1
#define HDR 16                         /* bytes of a frame's header */
/* how a refusal for another generation begins (the client then retries) */
#define GENERATION_REFUSED "another generation:"
/* how a refusal for the token begins (a client that read it from a file
 * reads it again: the file may have been a past job's) */
#define TOKEN_REFUSED "wrong job token"

enum {
    OP_HELLO = 1, OP_SET, OP_GET, OP_ADD, OP_CAS, OP_WAIT, OP_CHECK, OP_DELETE,
    OP_CANCEL, OP_BYE,
    OP_LAST_REQUEST = OP_BYE,
    OP_OK = 0x80, OP_VALUE, OP_INT, OP_ERROR
};

/* Fills in the HDR bytes of a frame's header at p. */
static inline void frame_header(unsigned char *p, int op, uint32_t id, uint32_t body_len)
{
    store_put_u32(p, FRAME_MAGIC);
    p[4] = FRAME_VERSION;
    p[5] = (unsigned char)op;
    p[6] = p[7] = 0;
    store_put_u32(p + 8, id);
    store_put_u32(p + 12, body_len);
}

/* Reads a body's fields in order. A field that does not fit sets `bad`,
 * and every later take returns NULL (0). */
struct cursor {
    const unsigned char *p;
    size_t n;
    int bad;
};

static inline const unsigned char *take_field(struct cursor *cu, size_t *len)
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

/* A field of exactly 8 bytes, as an int64. */
static inline int64_t take_i64(struct cursor *cu)
{
    size_t n;
    const unsigned char *f = take_field(cu, &n);
    if (f == NULL || n != 8) {
        cu->bad = 1;
        return 0;
    }
    return (int64_t)store_get_u64(f);
}

/* ---------------------------------------------------------------- store_server.c */

/* Serves the store on host:port (port 0: any free one) on a background
 * thread; clients must present `token` (or remote_token, when not NULL,
 * from another host) and, when both are set, the same `generation`. At
 * most world_size + a margin clients at once (world_size <= 0: unknown).
 * Errors name dp_store_open. */
dp_status store_server_start(struct store_server **out, const char *host, int port, int world_size,
                             const char *token, const char *remote_token, int64_t generation);
/* Stops the thread, closes every connection and frees everything; NULL is fine. */
void store_server_stop(struct store_server *sv);
/* The port it serves, and the host by which this process reaches it. */
int store_server_port(const struct store_server *sv);
const char *store_server_connect_host(const struct store_server *sv);

#endif /* DP_DIST_STORE_PROTO_H */
