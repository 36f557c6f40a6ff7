/*
 * socket.c — what the store's server and both of its clients use to talk
 * over TCP: sockets whose every wait is a poll() bounded by a deadline on
 * the monotonic clock (connect with retries, send and receive exactly n
 * bytes, listen), integers in wire order (little-endian), a growable byte
 * buffer for building frames, and keys printed for error messages.
 */
#define _GNU_SOURCE
#include "dist/store.h"
#include "core/tensor.h"

#include <errno.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* ======================================================================== */
/* bytes on the wire                                                         */
/* ======================================================================== */

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
void store_key_str(char *buf, size_t size, const unsigned char *key, size_t n)
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
        store_key_str(k, sizeof k, (const unsigned char *)keys[i], strlen(keys[i]));
        o += (size_t)snprintf(buf + o, size - o, "%s'%s'", i == 0 ? "" : ", ", k);
    }
    if (shown < n && o + 1 < size)
        snprintf(buf + o, size - o, " and %d more", n - shown);
}

/* ======================================================================== */
/* sockets                                                                   */
/* ======================================================================== */

double store_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

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
int store_wait_fd(int fd, short events, double deadline)
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
            int e = store_wait_fd(fd, POLLOUT, deadline);
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
            int e = store_wait_fd(fd, POLLIN, deadline);
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
        e = store_wait_fd(fd, POLLOUT, deadline);
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

int store_is_loopback(const struct sockaddr *a)
{
    if (a->sa_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)a)->sin_addr.s_addr) >> 24) == 127;
    if (a->sa_family == AF_INET6)
        return IN6_IS_ADDR_LOOPBACK(&((const struct sockaddr_in6 *)a)->sin6_addr);
    return 0;
}

int store_listen(const struct sockaddr *addr, socklen_t len, int *fdp, int *port)
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
    *fdp = fd;
    *port = ntohs(got.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&got)->sin6_port
                                            : ((struct sockaddr_in *)&got)->sin_port);
    return 0;
}

int store_is_local_addr(const struct sockaddr *a)
{
    struct sockaddr_storage copy;
    socklen_t len;
    int fd, ok;
    memset(&copy, 0, sizeof copy);
    if (a->sa_family == AF_INET6 && IN6_IS_ADDR_V4MAPPED(&((const struct sockaddr_in6 *)a)->sin6_addr)) {
        struct sockaddr_in *v4 = (struct sockaddr_in *)&copy;   /* a peer of the dual-stack socket */
        v4->sin_family = AF_INET;
        memcpy(&v4->sin_addr, &((const struct sockaddr_in6 *)a)->sin6_addr.s6_addr[12], 4);
        len = sizeof *v4;
    } else if (a->sa_family == AF_INET) {
        memcpy(&copy, a, sizeof(struct sockaddr_in));
        ((struct sockaddr_in *)&copy)->sin_port = 0;
        len = sizeof(struct sockaddr_in);
    } else if (a->sa_family == AF_INET6) {
        memcpy(&copy, a, sizeof(struct sockaddr_in6));
        ((struct sockaddr_in6 *)&copy)->sin6_port = 0;
        len = sizeof(struct sockaddr_in6);
    } else {
        return a->sa_family == AF_UNIX;
    }
    if (store_is_loopback((struct sockaddr *)&copy))
        return 1;
    /* an address this machine can bind is one of its own */
    fd = socket(copy.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return 1;   /* cannot tell: the safe answer */
    ok = bind(fd, (struct sockaddr *)&copy, len) == 0 || errno == EADDRINUSE;
    close(fd);
    return ok;
}

int store_is_local_host(const char *host)
{
    struct addrinfo hints, *res = NULL, *ai;
    int local = 0;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(host, NULL, &hints, &res) != 0)
        return 0;
    for (ai = res; ai != NULL && !local; ai = ai->ai_next)
        local = store_is_local_addr(ai->ai_addr);
    freeaddrinfo(res);
    return local;
}
