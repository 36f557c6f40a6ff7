/*
 * launch.h — the launcher's state, shared by launch.c (the ranks, their
 * output, signals and exits) and launch_repl.c (the distributed REPL).
 * Internal to src/dist; the launcher's entry point is dp_launch_main in
 * src/dplua_internal.h.
 */
#ifndef DP_DIST_LAUNCH_H
#define DP_DIST_LAUNCH_H

#include <sys/types.h>

#define PROG "dplua"
#define LINE_MAX_BYTES 65536
#define TAIL_LINES 20

struct linebuf {
    char *buf;
    size_t n;
    int fd;                     /* the read end, -1 at end of stream */
    int out;                    /* 1 or 2: where its lines go */
};

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
    struct rank *ranks;
    int running;
    int failed;                 /* index of the first rank that failed, or -1 */
    int signo;                  /* the signal the launcher forwarded, or 0 */
    double kill_at;             /* when to SIGKILL what still runs; 0: never */
    double drain_until;         /* stop reading output at this time */
    int out_dead[3];            /* our stdout/stderr was closed (EPIPE) */
    int repl;                   /* the ranks serve a REPL (launch_repl.c) */
    int repl_closing;           /* its input ended: the ranks may exit now */
    int interrupted;            /* SIGINT came while the REPL runs */
    int max_restarts;           /* --max_restarts: how often a failed job starts again */
    int restart;                /* which start this is, from 0 (TORCHELASTIC_RESTART_COUNT) */
};

/* launch.c */
extern int launch_sig_pipe[2];   /* the signal handlers write the signal's number here */
void launch_write(struct launch *L, int fd, const char *p, size_t n);
void launch_pump(struct launch *L, struct rank *r, struct linebuf *b);   /* read what a pipe holds, emit its lines */
void launch_signal_rank(const struct rank *r, int signo);
void launch_stop_others(struct launch *L, double grace);
void launch_handle_signals(struct launch *L);
void launch_watch(struct launch *L);      /* until every rank is gone and its output drained */
void launch_report_failure(const struct launch *L);

/* launch_repl.c */
int launch_repl_wanted(const struct launch *L);   /* the ranks run dplua -i */
int launch_repl_take_line(struct launch *L, struct rank *r, int fd, const char *line, size_t n);
int launch_repl(struct launch *L);        /* the REPL; returns 0 at the end of input, else -1 */

#endif /* DP_DIST_LAUNCH_H */
