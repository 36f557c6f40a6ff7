/*
 * rank.c — what a rank started by the launcher (launch.c) does for it, from
 * the first line of main: its stdout, when a pipe, is line-buffered, so
 * that the launcher gets its output a line at a time and nothing printed
 * is left in a buffer when the rank ends; and SIGTERM, which comes from
 * the launcher (stopping the job) or from the kernel when the launcher
 * dies (PR_SET_PDEATHSIG), is taken by a thread that flushes what the
 * rank printed and then ends the rank's process group, so that nothing the
 * rank started (os.execute, io.popen) outlives it: with SIGTERM as before
 * when the launcher asked, with SIGKILL when the launcher is gone.
 *
 * The launcher names itself in DPLUA_LAUNCHER_PID; the rank removes the
 * variable, so that a dplua the script starts is not taken for a rank.
 */
#define _GNU_SOURCE
#include "dplua.h"
#include "dplua_internal.h"
#include "dist/process.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define FLUSH_WAIT_S 2   /* a thread that holds stdout that long (a full pipe) is not waited for */

static int term_pipe[2] = { -1, -1 };
static pid_t launcher;

static void on_term(int signo)
{
    proc_pipe_signal(term_pipe[1], signo);
}

/* Flushes f unless another thread holds it past the wait. */
static void flush_soon(FILE *f)
{
    for (int i = 0; i < FLUSH_WAIT_S * 100; i++) {
        if (ftrylockfile(f) == 0) {
            fflush_unlocked(f);
            funlockfile(f);
            return;
        }
        nanosleep(&(struct timespec){ 0, 10000000 }, NULL);
    }
}

/* Signals this rank's process group, when it has one of its own (the
 * launcher makes it so; a group shared with the launcher is not ours). */
static void signal_group(int signo)
{
    kill(getpgrp() == getpid() ? 0 : getpid(), signo);
}

static void *watch_term(void *arg)
{
    unsigned char c;
    (void)arg;
    while (read(term_pipe[0], &c, 1) < 0 && errno == EINTR)
        ;
    if (getppid() != launcher) {   /* the launcher died: nobody reads our output */
        signal_group(SIGKILL);
        _exit(137);
    }
    flush_soon(stdout);
    flush_soon(stderr);
    signal(SIGTERM, SIG_DFL);
    signal_group(SIGTERM);   /* this rank and what it started */
    return NULL;
}

void dp_launch_rank_setup(void)
{
    const char *v = getenv("DPLUA_LAUNCHER_PID");
    struct sigaction sa;
    struct stat st;
    sigset_t all, old;
    pthread_t t;
    if (v == NULL || *v == '\0')
        return;
    launcher = (pid_t)atoi(v);
    unsetenv("DPLUA_LAUNCHER_PID");
    if (fstat(1, &st) == 0 && S_ISFIFO(st.st_mode))
        setvbuf(stdout, NULL, _IOLBF, 0);
    if (getppid() != launcher)   /* it died before we could watch it */
        signal_group(SIGKILL);
    if (pipe2(term_pipe, O_CLOEXEC) < 0)
        return;
    /* the thread takes no signals: the handler writes, the thread acts */
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    if (pthread_create(&t, NULL, watch_term, NULL) == 0) {
        pthread_detach(t);
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_term;
        sa.sa_flags = SA_RESTART;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGTERM, &sa, NULL);
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
}
