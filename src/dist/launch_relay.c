/*
 * launch_relay.c — the distributed REPL on several nodes (docs/
 * DISTRIBUTED.md, "The distributed REPL"): `dplua --nnodes=M
 * --node_rank=K ... -i` on every node.
 *
 * Node 0's launcher owns the terminal and runs launch_repl.c over every
 * rank of the job; L->ranks holds its own ranks, then the other nodes'
 * (r->via: the link to their launcher). It listens on the REPL's port
 * (--repl_port, by default --master_port + 1) until every other node's
 * launcher has connected. Each of those connects once, before it starts
 * its ranks, and then relays them (relay_serve): the requests that node 0
 * sends to a rank go to its REPL socket; what the rank answers there, the
 * lines of its stdout and stderr, its pid and its exit go to node 0. A
 * rank's lines go before the answer that ends its line, so that node 0
 * folds them with it.
 *
 * The link is one TCP connection per node. It opens with one text line
 * each way: "dplua-repl 1 NODE NPROC TOKEN" from the other node, "ok" or
 * "error WHY" from node 0. TOKEN is the job token: DPLUA_JOB_TOKEN when
 * set, else a random one that node 0's launcher makes and leaves in the
 * token file of token.c, keyed by --master_addr and the REPL's port (a home
 * shared by the nodes serves every node); every launcher then passes it
 * to its ranks, whose store uses it too. So only the job's own launchers
 * can send code to its ranks. After that, frames: a type byte, the rank on
 * the sending node (u32) and the length (u32) of what follows.
 *
 * The end: end of input on node 0 sends E, each node closes its ranks'
 * sockets, and tells their exits. A rank that ends earlier, anywhere, ends
 * the REPL: node 0 reports it as for its own ranks and sends S to the other
 * nodes, whose launchers stop their ranks. A link that breaks does the
 * same, with a message that names the node.
 */
#define _GNU_SOURCE
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include "dplua_internal.h"
#include "dist/launch.h"
#include "dist/store.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define PROTOCOL "dplua-repl 1"
#define FRAME_HEAD 9              /* type, rank, length */
#define FRAME_MAX (1 << 20)       /* a longer stream goes in pieces */
#define HELLO_MAX (TOKEN_MAX + 64)
#define HELLO_WAIT 5.0            /* s: a connection's first line */
#define SEND_WAIT 30.0            /* s: a peer that takes nothing for this long is gone */
#define DEFAULT_TIMEOUT 300.0     /* s: as the rendezvous (DPLUA_DIST_TIMEOUT) */
#define RETRY_PAUSE_MS 200
#define KEEPALIVE_IDLE 10         /* s of silence before the kernel probes a link; */
#define KEEPALIVE_PROBES 3        /* unanswered probes, 5 s apart, break it */

/* node 0 -> another node */
#define F_REQUEST 'Q'             /* bytes for the rank's REPL socket */
#define F_INTERRUPT 'I'           /* SIGINT to the rank */
#define F_END 'E'                 /* the input ended: close every rank's socket */
#define F_STOP 'S'                /* the REPL ended otherwise: stop the ranks */
/* another node -> node 0 */
#define F_PID 'P'                 /* the rank's pid, in decimal */
#define F_ANSWER 'A'              /* bytes from the rank's REPL socket */
#define F_STDOUT '1'              /* a line of its stdout, without the newline */
#define F_STDERR '2'
#define F_EXIT 'X'                /* its wait status, in decimal */

struct link {
    int fd;                       /* -1: closed */
    unsigned char *in;            /* what came and is not a whole frame yet */
    size_t n;
};

struct node_link {                /* node 0: one other node */
    struct link c;
    int told;                     /* its ranks whose exit came */
    int ended;                    /* E or S went */
};

struct relay {
    double timeout;
    /* node 0 */
    int listen_fd;                /* until every node has connected */
    double connect_until;
    struct node_link *nodes;      /* [nnodes]; [0] is ours, unused */
    int wrote_token;              /* the token file is ours to remove */
    int stop;                     /* a frame ended the REPL: drop every link */
    /* another node */
    struct link head;
};

/* ------------------------------------------------------------------------ */
/* frames                                                                    */
/* ------------------------------------------------------------------------ */

static void link_close(struct link *c)
{
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    free(c->in);
    c->in = NULL;
    c->n = 0;
}

/* One frame, or a stream in frames of at most FRAME_MAX. A peer that
 * takes nothing for SEND_WAIT is cut off: the next read sees the end. */
static void link_send(struct link *c, char type, int rank, const void *data, size_t n)
{
    const char *p = data;
    do {
        unsigned char head[FRAME_HEAD];
        size_t k = n < FRAME_MAX ? n : FRAME_MAX;
        double until = dp_clock_monotonic() + SEND_WAIT;
        if (c->fd < 0)
            return;
        head[0] = (unsigned char)type;
        store_put_u32(head + 1, (uint32_t)rank);
        store_put_u32(head + 5, (uint32_t)k);
        if (store_send_all(c->fd, head, sizeof head, until) != 0 ||
            (k > 0 && store_send_all(c->fd, p, k, until) != 0)) {
            shutdown(c->fd, SHUT_RDWR);
            return;
        }
        p += k;
        n -= k;
    } while (n > 0);
}

static void link_send_num(struct link *c, char type, int rank, long v)
{
    char num[32];
    int n = snprintf(num, sizeof num, "%ld", v);
    link_send(c, type, rank, num, (size_t)n);
}

typedef int (*frame_fn)(struct launch *L, void *arg, char type, uint32_t rank, const char *p, size_t n);

/* Reads what the link holds and hands each whole frame to fn (which
 * returns -1 for one that breaks the protocol). Returns -1 when the link
 * ended (its peer closed it, an error, a bad frame), else 0. */
static int link_pump(struct launch *L, struct link *c, frame_fn fn, void *arg)
{
    if (c->in == NULL && (c->in = malloc(FRAME_HEAD + FRAME_MAX)) == NULL)
        return -1;
    for (;;) {
        ssize_t got = recv(c->fd, c->in + c->n, FRAME_HEAD + FRAME_MAX - c->n, MSG_DONTWAIT);
        size_t at = 0;
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return 0;
        if (got <= 0)
            return -1;
        c->n += (size_t)got;
        while (c->n - at >= FRAME_HEAD) {
            uint32_t len = store_get_u32(c->in + at + 5);
            if (len > FRAME_MAX)
                return -1;
            if (c->n - at < FRAME_HEAD + len)
                break;
            if (fn(L, arg, (char)c->in[at], store_get_u32(c->in + at + 1), (char *)c->in + at + FRAME_HEAD,
                   len) != 0)
                return -1;
            at += FRAME_HEAD + len;
        }
        memmove(c->in, c->in + at, c->n - at);
        c->n -= at;
    }
}

/* A node that vanishes without closing its link (a machine that stops)
 * breaks it within about KEEPALIVE_IDLE + 3 * 5 s, even while nothing is
 * sent. */
static void keep_alive(int fd)
{
    int on = 1, idle = KEEPALIVE_IDLE, interval = 5, probes = KEEPALIVE_PROBES;
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof on);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof interval);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &probes, sizeof probes);
}

static double timeout_s(void)
{
    const char *e = getenv("DPLUA_DIST_TIMEOUT");
    double t = e ? strtod(e, NULL) : 0;
    return t > 0 ? t : DEFAULT_TIMEOUT;
}

/* ======================================================================== */
/* node 0                                                                    */
/* ======================================================================== */

static int same_token(const char *a, const char *b)
{
    size_t na = strlen(a), nb = strlen(b);
    unsigned char d = na != nb;
    for (size_t i = 0; i < na && i < nb; i++)   /* every byte: the time says nothing */
        d |= (unsigned char)(a[i] ^ b[i]);
    return d == 0;
}

static void first_last(const struct launch *L, int node, int *first, int *last)
{
    *first = node * L->nproc;
    *last = *first + L->nproc - 1;
}

/* The REPL ends otherwise than by its input: the ranks here stop, and the
 * other nodes are told to stop theirs. */
static void end_with_failure(struct launch *L, int failed)
{
    if (L->failed != -1 || L->signo != 0)
        return;
    L->failed = failed;
    launch_stop_others(L, TERM_GRACE);
    L->relay->stop = 1;
}

static int from_node(struct launch *L, void *arg, char type, uint32_t local, const char *p, size_t n)
{
    struct node_link *nl = arg;
    int node = (int)(nl - L->relay->nodes), g;
    struct rank *r;
    char num[32];
    if (local >= (uint32_t)L->nproc)
        return -1;
    g = node * L->nproc + (int)local;
    r = &L->ranks[g];
    switch (type) {
    case F_ANSWER:
        launch_repl_take_reply(r, p, n);
        return 0;
    case F_STDOUT:
    case F_STDERR:
        launch_emit(L, r, type - '0', p, n);
        return 0;
    case F_PID:
    case F_EXIT:
        snprintf(num, sizeof num, "%.*s", (int)(n < sizeof num ? n : sizeof num - 1), p);
        if (type == F_PID) {
            r->pid = (pid_t)atol(num);
            r->running = 1;
            return 0;
        }
        r->status = atoi(num);
        r->running = 0;
        nl->told++;
        /* as launch.c's reap: until the input ends, any exit ends the REPL */
        if (!(WIFEXITED(r->status) && WEXITSTATUS(r->status) == 0) || !L->repl_closing)
            end_with_failure(L, g);
        return 0;
    default:
        return -1;
    }
}

/* The first line of a connection to the REPL's port, within HELLO_WAIT. */
static int read_hello(int fd, char *line, size_t size)
{
    double until = dp_clock_monotonic() + HELLO_WAIT;
    size_t n = 0;
    while (n + 1 < size) {
        ssize_t got;
        if (store_wait_fd(fd, POLLIN, until) != 0)
            return -1;
        got = recv(fd, line + n, 1, MSG_DONTWAIT);
        if (got < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (got <= 0)
            return -1;
        if (line[n] == '\n') {
            line[n] = '\0';
            return 0;
        }
        n++;
    }
    return -1;
}

static void refuse(int fd, const char *why)
{
    char line[512];
    int n = snprintf(line, sizeof line, "error %s\n", why);
    store_send_all(fd, line, (size_t)n, dp_clock_monotonic() + HELLO_WAIT);
    fprintf(stderr, PROG ": refused a launcher on the REPL's port: %s\n", why);
    close(fd);
}

/* A launcher of another node, or a stranger: it must know the token. */
static void take_hello(struct launch *L, int fd)
{
    struct relay *R = L->relay;
    char *line = malloc(HELLO_MAX), why[256];
    int node, nproc, at = 0;
    if (line == NULL || read_hello(fd, line, HELLO_MAX) != 0 ||
        sscanf(line, PROTOCOL " %d %d %n", &node, &nproc, &at) != 2 || at == 0) {
        close(fd);   /* not a launcher of this protocol */
        free(line);
        return;
    }
    why[0] = '\0';
    if (!same_token(line + at, L->token))   /* first: a stranger learns nothing else */
        snprintf(why, sizeof why, "wrong job token (DPLUA_JOB_TOKEN, or the token file, is not node 0's)");
    else if (node < 1 || node >= L->nnodes)
        snprintf(why, sizeof why, "--node_rank=%d, but node 0 runs --nnodes=%d", node, L->nnodes);
    else if (R->nodes[node].c.fd >= 0 || R->nodes[node].ended)
        snprintf(why, sizeof why, "node %d is already connected", node);
    else if (nproc != L->nproc)
        snprintf(why, sizeof why, "node %d runs --nproc_per_node=%d, but node 0 runs %d: every node must run as many",
                 node, nproc, L->nproc);
    free(line);
    if (why[0])
        refuse(fd, why);
    else if (store_send_all(fd, "ok\n", 3, dp_clock_monotonic() + HELLO_WAIT) != 0)
        close(fd);
    else {
        keep_alive(fd);
        R->nodes[node].c.fd = fd;
    }
}

static int missing_nodes(const struct launch *L, char *list, size_t size)
{
    int missing = 0;
    size_t k = 0;
    list[0] = '\0';
    for (int node = 1; node < L->nnodes; node++)
        if (L->relay->nodes[node].c.fd < 0 && !L->relay->nodes[node].ended) {
            if (k < size)
                k += (size_t)snprintf(list + k, size - k, "%s%d", missing ? ", " : "", node);
            missing++;
        }
    return missing;
}

/* New connections, and the end of waiting for them. */
static void accept_nodes(struct launch *L)
{
    struct relay *R = L->relay;
    char list[256];
    int fd;
    while ((fd = accept4(R->listen_fd, NULL, NULL, SOCK_CLOEXEC)) >= 0)
        take_hello(L, fd);
    if (missing_nodes(L, list, sizeof list) == 0) {   /* all in: nobody else may come */
        close(R->listen_fd);
        R->listen_fd = -1;
        if (R->wrote_token)
            token_file_remove(L->addr, L->repl_port, L->token);
        R->wrote_token = 0;
    } else if (dp_clock_monotonic() >= R->connect_until && L->failed == -1 && L->signo == 0) {
        fprintf(stderr,
                PROG ": the launcher of node %s did not connect to the REPL's port %d within %g s: start "
                     "every node's launcher with -i, the same --nnodes, --master_addr and --master_port\n",
                list, L->repl_port, R->timeout);
        end_with_failure(L, -3);
    }
}

void relay_pump(struct launch *L)
{
    struct relay *R = L->relay;
    if (R == NULL || L->node_rank > 0)
        return;
    if (R->listen_fd >= 0)
        accept_nodes(L);
    for (int node = 1; node < L->nnodes; node++) {
        struct node_link *nl = &R->nodes[node];
        int first, last;
        if (nl->c.fd < 0 || link_pump(L, &nl->c, from_node, nl) == 0)
            continue;
        link_close(&nl->c);
        nl->ended = 1;
        if (nl->told < L->nproc && L->failed == -1 && L->signo == 0) {
            first_last(L, node, &first, &last);
            fprintf(stderr, PROG ": lost the launcher of node %d (ranks %d-%d): its link to node 0 broke\n", node,
                    first, last);
            end_with_failure(L, -3);
        }
    }
    if (R->stop)
        relay_end(L, 0);
}

int relay_add_pollfds(struct launch *L, struct pollfd *pf)
{
    struct relay *R = L->relay;
    int n = 0;
    if (R == NULL || L->node_rank > 0)
        return 0;
    if (R->listen_fd >= 0)
        pf[n++] = (struct pollfd){ R->listen_fd, POLLIN, 0 };
    for (int node = 1; node < L->nnodes; node++)
        if (R->nodes[node].c.fd >= 0)
            pf[n++] = (struct pollfd){ R->nodes[node].c.fd, POLLIN, 0 };
    return n;
}

int relay_max_pollfds(const struct launch *L)
{
    return L->relay ? L->nnodes : 0;
}

int relay_poll_timeout(const struct launch *L)
{
    double left;
    if (L->relay == NULL || L->relay->listen_fd < 0)
        return -1;
    left = L->relay->connect_until - dp_clock_monotonic();
    return left <= 0 ? 0 : (int)(left * 1000) + 1;
}

void relay_request(struct launch *L, struct rank *r, const char *p, size_t n)
{
    (void)L;
    link_send(&r->via->c, F_REQUEST, r->local, p, n);
}

void relay_interrupt(struct launch *L, struct rank *r)
{
    (void)L;
    link_send(&r->via->c, F_INTERRUPT, r->local, "", 0);
}

int relay_reachable(const struct rank *r)
{
    return r->via != NULL && r->via->c.fd >= 0;
}

void relay_end(struct launch *L, int input_ended)
{
    struct relay *R = L->relay;
    if (R == NULL || L->node_rank > 0)
        return;
    for (int node = 1; node < L->nnodes; node++) {
        struct node_link *nl = &R->nodes[node];
        if (input_ended && !nl->ended) {
            link_send(&nl->c, F_END, 0, "", 0);   /* its ranks end; their exits come, then its link closes */
        } else if (nl->c.fd >= 0) {
            if (!nl->ended)
                link_send(&nl->c, F_STOP, 0, "", 0);
            link_close(&nl->c);
        }
        nl->ended = 1;
    }
    if (R->listen_fd >= 0)
        close(R->listen_fd);
    R->listen_fd = -1;
}

int relay_pending(const struct launch *L)
{
    if (L->relay == NULL || L->node_rank > 0)
        return 0;
    for (int node = 1; node < L->nnodes; node++)
        if (L->relay->nodes[node].c.fd >= 0)
            return 1;
    return 0;
}

/* Listen on the REPL's port, with the job's token (made here when the
 * environment has none, and left in the token file for the other nodes). */
static int open_node0(struct launch *L)
{
    struct relay *R = L->relay;
    struct sockaddr_in6 a6 = { .sin6_family = AF_INET6, .sin6_port = htons((uint16_t)L->repl_port),
                               .sin6_addr = IN6ADDR_ANY_INIT };
    struct sockaddr_in a4 = { .sin_family = AF_INET, .sin_port = htons((uint16_t)L->repl_port),
                              .sin_addr = { htonl(INADDR_ANY) } };
    char why[4800];
    int port, e;
    R->nodes = calloc((size_t)L->nnodes, sizeof *R->nodes);
    if (R->nodes == NULL)
        return -1;
    for (int node = 0; node < L->nnodes; node++)
        R->nodes[node].c.fd = -1;
    for (int g = L->nproc; g < L->nranks; g++)
        L->ranks[g].via = &R->nodes[g / L->nproc];
    e = store_listen((struct sockaddr *)&a6, sizeof a6, &R->listen_fd, &port);
    if (e == EAFNOSUPPORT)
        e = store_listen((struct sockaddr *)&a4, sizeof a4, &R->listen_fd, &port);
    if (e != 0) {
        R->listen_fd = -1;
        fprintf(stderr, PROG ": cannot listen on the REPL's port %d for the other nodes' launchers: %s (--repl_port "
                        "chooses another; the default is --master_port + 1)\n",
                L->repl_port, strerror(e));
        return -1;
    }
    if (L->token[0] == '\0') {
        if ((e = token_random(L->token, sizeof L->token)) != 0) {
            fprintf(stderr, PROG ": cannot make the job token: %s\n", strerror(e));
            return -1;
        }
        if (token_file_write(L->addr, L->repl_port, L->token, why, sizeof why) != 0) {
            fprintf(stderr, PROG ": %s; set DPLUA_JOB_TOKEN to the same secret for every node's launcher\n", why);
            return -1;
        }
        R->wrote_token = 1;
    }
    R->connect_until = dp_clock_monotonic() + R->timeout;
    return 0;
}

/* ======================================================================== */
/* the other nodes                                                           */
/* ======================================================================== */

static int from_node0(struct launch *L, void *arg, char type, uint32_t local, const char *p, size_t n)
{
    struct rank *r;
    (void)arg;
    if (local >= (uint32_t)L->nproc)
        return -1;
    r = &L->ranks[local];
    switch (type) {
    case F_REQUEST:
        while (n > 0 && r->cmd >= 0) {
            ssize_t w = send(r->cmd, p, n, MSG_NOSIGNAL);
            if (w < 0 && errno == EINTR)
                continue;
            if (w <= 0)
                break;   /* the rank is gone: its exit is told */
            p += w;
            n -= (size_t)w;
        }
        return 0;
    case F_INTERRUPT:
        if (r->running)
            kill(r->pid, SIGINT);
        return 0;
    case F_END:
        L->repl_closing = 1;   /* from here a rank's exit is the end it was asked for */
        for (int i = 0; i < L->nproc; i++)
            if (L->ranks[i].cmd >= 0) {
                close(L->ranks[i].cmd);
                L->ranks[i].cmd = -1;
            }
        return 0;
    case F_STOP:
        if (L->failed == -1 && L->signo == 0) {
            fprintf(stderr, PROG ": node 0's launcher ended the REPL; stopping the ranks of this node\n");
            L->failed = -3;
            launch_stop_others(L, TERM_GRACE);
        }
        return 0;
    default:
        return -1;
    }
}

int relay_forward_line(struct launch *L, struct rank *r, int fd, const char *line, size_t n)
{
    struct link *c = L->relay ? &L->relay->head : NULL;
    if (c == NULL || c->fd < 0)
        return 0;   /* printed here */
    link_send(c, fd == 1 ? F_STDOUT : F_STDERR, r->local, line, n);
    return 1;
}

/* What a rank said: first its socket, then its pipes, and then what came
 * on the socket goes on: the lines a rank wrote before its answer are in
 * the pipes by the time the answer is read, and reach node 0 before it. */
static void forward_rank(struct launch *L, struct rank *r)
{
    static char buf[65536];
    ssize_t got = 0;
    if (r->cmd >= 0) {
        do
            got = recv(r->cmd, buf, sizeof buf, MSG_DONTWAIT);
        while (got < 0 && errno == EINTR);
        if (got == 0 || (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) {
            close(r->cmd);
            r->cmd = -1;
        }
    }
    if (r->out.fd >= 0)
        launch_pump(L, r, &r->out);
    if (r->err.fd >= 0)
        launch_pump(L, r, &r->err);
    if (got > 0)
        link_send(&L->relay->head, F_ANSWER, r->local, buf, (size_t)got);
}

void relay_serve(struct launch *L)
{
    struct relay *R = L->relay;
    struct pollfd *pf = calloc((size_t)L->nproc * 3 + 2, sizeof *pf);
    if (pf == NULL)
        abort();
    for (int i = 0; i < L->nproc; i++)
        link_send_num(&R->head, F_PID, i, (long)L->ranks[i].pid);
    while (R->head.fd >= 0) {
        int n = 0, told = 0;
        pf[n++] = (struct pollfd){ launch_sig_pipe[0], POLLIN, 0 };
        pf[n++] = (struct pollfd){ R->head.fd, POLLIN, 0 };
        for (int i = 0; i < L->nproc; i++) {
            struct rank *r = &L->ranks[i];
            int fds[3] = { r->out.fd, r->err.fd, r->cmd };
            for (int k = 0; k < 3; k++)
                if (fds[k] >= 0)
                    pf[n++] = (struct pollfd){ fds[k], POLLIN, 0 };
        }
        if (poll(pf, (nfds_t)n, L->kill_at > 0 ? 100 : -1) < 0 && errno != EINTR)
            break;
        for (int i = 0; i < L->nproc; i++)
            forward_rank(L, &L->ranks[i]);
        if (link_pump(L, &R->head, from_node0, NULL) != 0) {
            if (!L->repl_closing && L->failed == -1 && L->signo == 0) {
                fprintf(stderr, PROG ": lost node 0's launcher (%s, port %d); stopping the ranks of this node\n",
                        L->addr, L->repl_port);
                L->failed = -3;
                launch_stop_others(L, TERM_GRACE);
            }
            break;
        }
        if (pf[0].revents)
            launch_handle_signals(L);
        for (int k = 0; k < L->nproc; k++) {   /* the rank that failed first: node 0 reports it */
            int i = L->failed >= 0 ? (L->failed + k) % L->nproc : k;
            struct rank *r = &L->ranks[i];
            if (!r->running && !r->exit_told) {
                if (r->out.fd >= 0)   /* its last lines, before its exit */
                    launch_pump(L, r, &r->out);
                if (r->err.fd >= 0)
                    launch_pump(L, r, &r->err);
                link_send_num(&R->head, F_EXIT, i, (long)r->status);
                r->exit_told = 1;
            }
        }
        for (int i = 0; i < L->nproc; i++)
            told += L->ranks[i].exit_told;
        if (told == L->nproc || (L->kill_at > 0 && dp_clock_monotonic() >= L->kill_at))
            break;   /* launch_watch stops what is left */
    }
    link_close(&R->head);
    free(pf);
}

/* The token: DPLUA_JOB_TOKEN, else node 0's file. 1 with it in out, 0 not
 * yet there, -1 (said why) never. */
static int find_token(struct launch *L, char *out, size_t size, char *why, size_t why_size)
{
    int e;
    if (L->token[0]) {
        snprintf(out, size, "%s", L->token);
        return 1;
    }
    e = token_file_read(L->addr, L->repl_port, out, size, why, why_size);
    if (e == ENOENT)
        return 0;
    if (e != 0) {
        fprintf(stderr, PROG ": %s\n", why);
        return -1;
    }
    if (strlen(out) >= sizeof L->token || strchr(out, '\n') != NULL) {
        fprintf(stderr, PROG ": the job token of the REPL's token file is not one node 0's launcher wrote\n");
        return -1;
    }
    return 1;
}

/* Connects, says who we are, and reads node 0's answer into reply.
 * 0: accepted; 1: refused (reply says why); -1: no answer. */
static int hello(struct launch *L, const char *token, double left, char *reply, size_t size)
{
    struct relay *R = L->relay;
    char *line = malloc(HELLO_MAX);
    int fd = -1, n, st = -1;
    if (line == NULL)
        return -1;
    n = snprintf(line, HELLO_MAX, PROTOCOL " %d %d %s\n", L->node_rank, L->nproc, token);
    if (store_connect(&fd, "dplua", L->addr, L->repl_port, left < 1.0 ? left : 1.0) == DP_OK &&
        store_send_all(fd, line, (size_t)n, dp_clock_monotonic() + HELLO_WAIT) == 0 &&
        read_hello(fd, reply, size) == 0) {
        st = strcmp(reply, "ok") == 0 ? 0 : 1;
        if (st == 0) {
            keep_alive(fd);
            R->head.fd = fd;
        }
    }
    if (st != 0 && fd >= 0)
        close(fd);
    free(line);
    return st;
}

/* A signal while the launcher waits for node 0: it ends the wait. */
static int signalled(struct launch *L, int ms)
{
    struct pollfd p = { launch_sig_pipe[0], POLLIN, 0 };
    unsigned char c;
    if (poll(&p, 1, ms) > 0)
        while (read(launch_sig_pipe[0], &c, 1) == 1)
            if (c != SIGCHLD)
                L->signo = c;
    return L->signo != 0;
}

/* Until node 0's launcher takes us, within the timeout. */
static int open_other(struct launch *L)
{
    struct relay *R = L->relay;
    double until = dp_clock_monotonic() + R->timeout;
    char token[TOKEN_MAX + 1], why[4800], reply[512] = "";
    int from_file = L->token[0] == '\0', have = 0;
    for (;;) {
        double left = until - dp_clock_monotonic();
        int st = -1;
        if ((have = find_token(L, token, sizeof token, why, sizeof why)) < 0)
            return -1;
        if (have && (st = hello(L, token, left, reply, sizeof reply)) == 0) {
            snprintf(L->token, sizeof L->token, "%s", token);   /* our ranks' too */
            return 0;
        }
        if (have && st > 0 && !(from_file && strstr(reply, "wrong job token"))) {
            fprintf(stderr, PROG ": node 0's launcher (%s, port %d) refused this node: %s\n", L->addr, L->repl_port,
                    strncmp(reply, "error ", 6) == 0 ? reply + 6 : reply);
            return -1;   /* a file of a past job is read again: node 0 may not have written its own yet */
        }
        if (dp_clock_monotonic() >= until)
            break;
        if (signalled(L, RETRY_PAUSE_MS))
            return -1;
    }
    if (!have)
        fprintf(stderr, PROG ": no job token from node 0's launcher within %g s: it leaves one in this user's "
                        "$XDG_CACHE_HOME/dplua or ~/.cache/dplua when it starts; is it started (with -i, the same "
                        "--nnodes, --master_addr and --master_port), and is the home folder shared by the nodes? "
                        "If not, set DPLUA_JOB_TOKEN to the same secret for every node's launcher\n",
                R->timeout);
    else
        fprintf(stderr, PROG ": node 0's launcher did not answer at %s, port %d, within %g s%s%s: start it with -i, "
                        "the same --nnodes, --master_addr and --master_port (the REPL's port is --master_port + 1, "
                        "or --repl_port)\n",
                L->addr, L->repl_port, R->timeout, reply[0] ? "; its last answer: " : "", reply);
    return -1;
}

/* ======================================================================== */
/* both                                                                      */
/* ======================================================================== */

int relay_open(struct launch *L)
{
    struct relay *R = calloc(1, sizeof *R);
    if (R == NULL)
        return -1;
    R->timeout = timeout_s();
    R->listen_fd = -1;
    R->head.fd = -1;
    L->relay = R;
    return L->node_rank == 0 ? open_node0(L) : open_other(L);
}

void relay_close(struct launch *L)
{
    struct relay *R = L->relay;
    if (R == NULL)
        return;
    if (R->nodes != NULL)
        for (int node = 0; node < L->nnodes; node++)
            link_close(&R->nodes[node].c);
    if (R->listen_fd >= 0)
        close(R->listen_fd);
    if (R->wrote_token)
        token_file_remove(L->addr, L->repl_port, L->token);
    link_close(&R->head);
    free(R->nodes);
    free(R);
    L->relay = NULL;
}
