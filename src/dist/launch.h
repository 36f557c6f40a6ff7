/*
 * launch.h — the launcher's state, shared by launch.c (the ranks, their
 * output, signals and exits), launch_repl.c (the distributed REPL) and
 * launch_relay.c (the REPL's link between the launchers of several nodes).
 * Internal to src/dist; the launcher's entry point is dp_launch_main in
 * src/dplua_internal.h.
 */
#ifndef DP_DIST_LAUNCH_H
#define DP_DIST_LAUNCH_H

#include <poll.h>
#include <sys/types.h>

#define PROG "dplua"
#define LINE_MAX_BYTES 65536
#define TAIL_LINES 20
#define TERM_GRACE 3.0          /* a rank failed: SIGTERM, then SIGKILL after this */

struct linebuf {
    char *buf;
    size_t n;
    int fd;                     /* the read end, -1 at end of stream */
    int out;                    /* 1 or 2: where its lines go */
};

struct node_link;
struct relay;

struct rank {
    int local, global;
    pid_t pid;
    int running;
    int status;                 /* from waitpid */
    struct linebuf out, err;
    char *tail[TAIL_LINES];     /* the last lines of stderr, a ring */
    int tail_next, tail_count;
    /* the distributed REPL (launch_repl.c) */
    int cmd;                    /* the socket to the rank's REPL server, or -1 */
    char *reply;                /* what came on it and is not a whole line yet */
    size_t reply_n;
    int busy;                   /* a line runs there: its output is kept for the fold */
    char answer;                /* its last answer: 'R' ready, 'D' done, 'M' more */
    struct kept_line *kept;     /* the output of the running line */
    size_t nkept, capkept;
    /* the REPL on several nodes (launch_relay.c) */
    struct node_link *via;      /* node 0: the link to the launcher that runs this rank; NULL: ours */
    int exit_told;              /* another node: its exit went to node 0 */
};

struct kept_line {
    int fd;                     /* 1 or 2 */
    char *text;
};

struct launch {
    int nproc, nnodes, node_rank, port;
    int nproc_set, nnodes_set, node_rank_set, port_set, standalone, prefix;
    char nproc_word[16];        /* "gpu", "cpu", "auto", or "" for a number */
    char addr[256];
    char rdzv_id[128];
    char token[80];
    int child_argc;
    char **child_argv;          /* what the ranks run: script and args */
    char *argv0;
    struct rank *ranks;         /* this node's nproc ranks, then (node 0 of a
                                   multi-node REPL) those of the other nodes */
    int nranks;                 /* how many: nproc, or nnodes * nproc there */
    int running;
    int failed;                 /* index of the first rank that failed, or -1; -2 a rank did not
                                   start; -3 the link between the nodes' launchers failed */
    int signo;                  /* the signal the launcher forwarded, or 0 */
    double kill_at;             /* when to SIGKILL what still runs; 0: never */
    double drain_until;         /* stop reading output at this time */
    int out_dead[3];            /* our stdout/stderr was closed (EPIPE) */
    int repl;                   /* the ranks serve a REPL (launch_repl.c) */
    int repl_closing;           /* its input ended: the ranks may exit now */
    int interrupted;            /* SIGINT came while the REPL runs */
    int repl_port, repl_port_set;   /* node 0's REPL listens here for the other nodes */
    struct relay *relay;        /* the link between the nodes' launchers (launch_relay.c), or NULL */
    int max_restarts;           /* --max_restarts: how often a failed job starts again */
    int restart;                /* which start this is, from 0 (TORCHELASTIC_RESTART_COUNT) */
};

/* launch.c */
extern int launch_sig_pipe[2];   /* the signal handlers write the signal's number here */
void launch_write(struct launch *L, int fd, const char *p, size_t n);
void launch_pump(struct launch *L, struct rank *r, struct linebuf *b);   /* read what a pipe holds, emit its lines */
void launch_emit(struct launch *L, struct rank *r, int fd, const char *line, size_t n);   /* one line to fd 1 or 2 */
void launch_signal_rank(const struct rank *r, int signo);
void launch_stop_others(struct launch *L, double grace);
void launch_handle_signals(struct launch *L);
void launch_watch(struct launch *L);      /* until every rank is gone and its output drained */
void launch_report_failure(const struct launch *L);

/* launch_repl.c */
int launch_repl_wanted(const struct launch *L);   /* the ranks run dplua -i */
int launch_repl_take_line(struct launch *L, struct rank *r, int fd, const char *line, size_t n);
int launch_repl(struct launch *L);        /* the REPL; returns 0 at the end of input, else -1 */
void launch_repl_take_reply(struct rank *r, const char *p, size_t n);   /* bytes from the rank's socket */

/* launch_relay.c: the REPL on several nodes. Node 0's launcher runs
 * launch_repl over every rank of the job; each other node's launcher
 * relays its ranks to it (relay_serve). */
int relay_open(struct launch *L);          /* node 0: listen; others: connect. 0, or -1 said why */
void relay_serve(struct launch *L);       /* another node: until node 0 ends the REPL or a rank ends */
void relay_close(struct launch *L);
int relay_add_pollfds(struct launch *L, struct pollfd *pf);   /* node 0: its links and the listener */
int relay_max_pollfds(const struct launch *L);
int relay_poll_timeout(const struct launch *L);   /* ms until nodes that did not connect are given up, or -1 */
void relay_pump(struct launch *L);         /* node 0: what the other nodes sent */
int relay_forward_line(struct launch *L, struct rank *r, int fd, const char *line, size_t n);
void relay_request(struct launch *L, struct rank *r, const char *p, size_t n);   /* to a remote rank's socket */
void relay_interrupt(struct launch *L, struct rank *r);   /* SIGINT to a remote rank */
int relay_reachable(const struct rank *r);
void relay_end(struct launch *L, int input_ended);   /* end of input to every node, or drop the links */
int relay_pending(const struct launch *L); /* node 0: links still open */

#endif /* DP_DIST_LAUNCH_H */
