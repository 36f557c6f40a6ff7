/*
 * process.h — starting child processes, for the launcher (launch.c) and
 * for dp_process_spawn (process.c, the sweep driver's way in from Lua), and
 * the self-pipe write that the signal handlers of launch.c and rank.c share,
 * and the SIGPIPE guard of writes to peers that may have died.
 *
 *     struct proc_spec s = { .program = NULL, .argv = argv, .envp = env,
 *                            .fd = { devnull, out_w, err_w } };
 *     int e = proc_start(&s, &pid);   // 0, or why it could not start
 */
#ifndef DP_DIST_PROCESS_H
#define DP_DIST_PROCESS_H

#include <signal.h>
#include <stdbool.h>
#include <sys/types.h>

struct proc_spec {
    const char *program;     /* a path, or a name looked up in $PATH; NULL: this program */
    char *const *argv;       /* argv[0] first, NULL-terminated */
    char *const *envp;       /* the child's whole environment (proc_environment) */
    int fd[3];               /* what the child's stdin, stdout and stderr become; -1: this process's */
    bool own_group;          /* a process group of its own (a Ctrl-C at the terminal misses it) */
    int parent_death_signal; /* sent to the child when this process dies; 0: none */
};

/* Starts the child with its signals at their defaults and none blocked.
 * Returns 0 with *pid set, or an errno value: fork()'s, or that of the
 * exec in the child, so that a program that cannot run fails here rather
 * than as a child that exits 127. */
int proc_start(const struct proc_spec *s, pid_t *pid);

/* This process's environment with the entries of set put over it:
 * "NAME=VALUE" sets NAME, a bare "NAME" removes it (set is
 * NULL-terminated; NULL: no changes). NULL when out of memory. Freed with
 * proc_free_environment. */
char **proc_environment(const char *const *set);
void proc_free_environment(char **env);

/* For a signal handler: the signal's number as one byte on fd (the write
 * end of a self-pipe that a poll loop reads), errno left as it was. */
void proc_pipe_signal(int fd, int signo);

/* A write to a pipe or socket whose reader is gone raises SIGPIPE in the
 * writing thread, whose default action ends the process before the write's
 * EPIPE can be reported. proc_sigpipe_block blocks it in this thread;
 * proc_sigpipe_restore takes back a SIGPIPE that became pending meanwhile
 * and restores the mask, so the process's own handling of SIGPIPE (e.g.
 * `dplua script | head`) is unchanged outside. */
typedef struct {
    sigset_t old;
    int blocked;   /* whether this guard blocked it (it was not blocked before) */
} proc_sigpipe_guard;
void proc_sigpipe_block(proc_sigpipe_guard *g);
void proc_sigpipe_restore(proc_sigpipe_guard *g);

#endif /* DP_DIST_PROCESS_H */
