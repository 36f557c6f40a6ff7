/*
 * process.c — child processes: started by one function for the launcher's
 * ranks (launch.c) and for dp_process_spawn, waited for, signalled, and
 * signals named.
 *
 * A child is started with fork() and exec, not posix_spawn: a rank needs
 * PR_SET_PDEATHSIG, which posix_spawn cannot set. The exec's failure comes
 * back to the parent through a close-on-exec pipe, so that a missing
 * program is an error of the call that started it.
 */
#define _GNU_SOURCE
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include "dist/process.h"
#include "core/tensor.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <pthread.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

/* ======================================================================== */
/* starting                                                                  */
/* ======================================================================== */

/* Signals that the parent may catch or ignore (a launcher, a REPL) and
 * that the child must meet with their default action. */
static const int reset_signals[] = { SIGHUP, SIGINT, SIGQUIT, SIGPIPE, SIGTERM, SIGCHLD };

/* In the child, between fork() and exec: never returns. Only
 * async-signal-safe calls: the parent may have threads. */
static void exec_child(const struct proc_spec *s, pid_t parent, int err_w)
{
    sigset_t none;
    if (s->parent_death_signal) {
        prctl(PR_SET_PDEATHSIG, s->parent_death_signal);
        if (getppid() != parent)   /* the parent died before prctl */
            _exit(127);
    }
    if (s->own_group)
        setpgid(0, 0);
    for (size_t i = 0; i < sizeof reset_signals / sizeof reset_signals[0]; i++)
        signal(reset_signals[i], SIG_DFL);
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    for (int fd = 0; fd < 3; fd++)
        if (s->fd[fd] >= 0 && s->fd[fd] != fd && dup2(s->fd[fd], fd) < 0)
            goto fail;
    execvpe(s->program ? s->program : "/proc/self/exe", s->argv, s->envp);
fail:;
    int e = errno;
    ssize_t w = write(err_w, &e, sizeof e);   /* read by proc_start */
    (void)w;
    _exit(127);
}

int proc_start(const struct proc_spec *s, pid_t *pid)
{
    int report[2], e = 0;
    sigset_t all, old;
    pid_t parent = getpid();
    if (pipe2(report, O_CLOEXEC) < 0)
        return errno;
    /* Signals wait until the child has put back the default handlers:
     * ours, run in the child, would act for the parent (the launcher's
     * write to its signal pipe), and a signal sent to a child just started
     * would read as one sent to the parent. */
    sigfillset(&all);
    sigprocmask(SIG_BLOCK, &all, &old);
    pid_t child = fork();
    if (child == 0)
        exec_child(s, parent, report[1]);
    if (child < 0)
        e = errno;
    sigprocmask(SIG_SETMASK, &old, NULL);
    close(report[1]);
    if (child > 0 && s->own_group)
        setpgid(child, child);   /* also in the child: whichever runs first */
    if (child > 0) {
        /* the exec's errno, or nothing when the exec closed the pipe */
        ssize_t n;
        while ((n = read(report[0], &e, sizeof e)) < 0 && errno == EINTR)
            ;
        if (n != (ssize_t)sizeof e)
            e = 0;
        else
            while (waitpid(child, NULL, 0) < 0 && errno == EINTR)
                ;
    }
    close(report[0]);
    if (e == 0)
        *pid = child;
    return e;
}

/* Whether entry ("NAME=VALUE" or "NAME") names the variable of kv. */
static bool same_name(const char *entry, const char *kv)
{
    size_t n = strcspn(entry, "=");
    return strncmp(entry, kv, n) == 0 && kv[n] == '=';
}

static bool is_set_by(const char *const *set, const char *kv)
{
    for (; set && *set; set++)
        if (same_name(*set, kv))
            return true;
    return false;
}

char **proc_environment(const char *const *set)
{
    size_t n = 0, k = 0;
    for (char **e = environ; *e; e++)
        n++;
    for (const char *const *e = set; e && *e; e++)
        n++;
    char **env = calloc(n + 1, sizeof *env);
    if (env == NULL)
        return NULL;
    for (char **e = environ; *e; e++)
        if (!is_set_by(set, *e) && (env[k++] = strdup(*e)) == NULL)
            goto oom;
    for (const char *const *e = set; e && *e; e++)
        if (strchr(*e, '=') && (env[k++] = strdup(*e)) == NULL)
            goto oom;
    return env;
oom:
    proc_free_environment(env);
    return NULL;
}

void proc_free_environment(char **env)
{
    if (env == NULL)
        return;
    for (char **e = env; *e; e++)
        free(*e);
    free(env);
}

void proc_pipe_signal(int fd, int signo)
{
    int saved = errno;
    unsigned char c = (unsigned char)signo;
    ssize_t w = write(fd, &c, 1);
    (void)w;
    errno = saved;
}

/* ======================================================================== */
/* the public API (src/dplua.h)                                              */
/* ======================================================================== */

/* A file for a child's output, appended to; -1 with the error set. */
static int open_output(const char *path)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0)
        dp_fail(DP_ERR_IO, "process_spawn: cannot open %s for the child's output: %s", path, strerror(errno));
    return fd;
}

static dp_status check_env(const char *const *env)
{
    for (int i = 0; env && env[i]; i++)
        if (env[i][0] == '\0' || env[i][0] == '=')
            return dp_fail(DP_ERR_ARG, "process_spawn: env[%d] is \"%s\"; expected NAME=VALUE, or NAME to "
                           "remove it", i, env[i]);
    return DP_OK;
}

dp_status dp_process_spawn(int *pid, const char *program, const char *const *argv, const char *const *env,
                           const char *stdout_path, const char *stderr_path)
{
    if (pid == NULL || argv == NULL || argv[0] == NULL)
        return dp_fail(DP_ERR_ARG, "process_spawn: expected a pid pointer and argv with at least the "
                       "program's name (argv[0]), NULL-terminated");
    if (program != NULL && program[0] == '\0')
        return dp_fail(DP_ERR_ARG, "process_spawn: the program is an empty string (NULL runs this program)");
    dp_status st = check_env(env);
    if (st)
        return st;
    struct proc_spec s = { .program = program, .argv = (char *const *)argv, .fd = { -1, -1, -1 } };
    char **envp = proc_environment(env);
    if (envp == NULL)
        return dp_fail(DP_ERR_MEMORY, "process_spawn: out of memory for the environment");
    s.envp = envp;
    st = DP_ERR_IO;
    if ((s.fd[0] = open("/dev/null", O_RDONLY | O_CLOEXEC)) < 0) {
        dp_fail(DP_ERR_IO, "process_spawn: cannot open /dev/null: %s", strerror(errno));
        goto done;
    }
    if (stdout_path && (s.fd[1] = open_output(stdout_path)) < 0)
        goto done;
    if (stderr_path && stdout_path && strcmp(stderr_path, stdout_path) == 0)
        s.fd[2] = s.fd[1];   /* one file, its lines in the order written */
    else if (stderr_path && (s.fd[2] = open_output(stderr_path)) < 0)
        goto done;
    pid_t child;
    int e = proc_start(&s, &child);
    if (e != 0) {
        dp_fail(DP_ERR_IO, "process_spawn: cannot run %s: %s", program ? program : "this program", strerror(e));
        goto done;
    }
    *pid = (int)child;
    st = DP_OK;
done:
    for (int fd = 0; fd < 3; fd++)
        if (s.fd[fd] >= 0 && (fd < 2 || s.fd[2] != s.fd[1]))
            close(s.fd[fd]);
    proc_free_environment(envp);
    return st;
}

dp_status dp_process_wait(int pid, double timeout_s, int *exited, int *exit_code, int *signo)
{
    if (pid <= 0 || exited == NULL || exit_code == NULL || signo == NULL)
        return dp_fail(DP_ERR_ARG, "process_wait: expected a child's pid (> 0, got %d) and three int pointers", pid);
    double deadline = dp_clock_monotonic() + timeout_s;
    int status;
    *exited = 0;
    *exit_code = *signo = 0;
    for (;;) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid)
            break;
        if (r < 0 && errno == ECHILD)
            return dp_fail(DP_ERR_STATE, "process_wait: process %d is not a child of this process "
                           "(or it was waited for already)", pid);
        if (r < 0 && errno != EINTR)
            return dp_fail(DP_ERR_STATE, "process_wait: process %d: %s", pid, strerror(errno));
        double left = timeout_s < 0 ? 0.01 : deadline - dp_clock_monotonic();
        if (left <= 0 || dp_sleep(left < 0.01 ? left : 0.01) != 0)
            return DP_OK;   /* still running, or a signal came: the caller looks again */
    }
    *exited = 1;
    if (WIFSIGNALED(status)) {
        *exit_code = -1;
        *signo = WTERMSIG(status);
    } else {
        *exit_code = WEXITSTATUS(status);
    }
    return DP_OK;
}

dp_status dp_process_kill(int pid, int signo)
{
    if (pid <= 0)   /* kill() reads 0 and negative pids as process groups, -1 as every process */
        return dp_fail(DP_ERR_ARG, "process_kill: expected a process id > 0, got %d", pid);
    if (signo < 0 || signo >= NSIG)
        return dp_fail(DP_ERR_ARG, "process_kill: %d is not a signal number (0 to %d)", signo, NSIG - 1);
    if (kill(pid, signo) < 0)
        return dp_fail(errno == ESRCH ? DP_ERR_STATE : DP_ERR_ARG, "process_kill: cannot signal process %d: %s",
                       pid, strerror(errno));
    return DP_OK;
}

/* ---------------------------------------------------------------- workers */

int dp_worker_fork(void)
{
    pid_t parent = getpid();
    fflush(NULL);   /* (the child must not write out the parent's buffered output again) */
    pid_t child = fork();
    if (child < 0) {
        dp_fail(DP_ERR_STATE, "worker_fork: fork failed: %s", strerror(errno));
        return -1;
    }
    if (child == 0) {
        /* dies with its parent; and if the parent is already gone, now */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(1);
    }
    return (int)child;
}

dp_status dp_pipe_open(int *read_fd, int *write_fd)
{
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) < 0)
        return dp_fail(DP_ERR_STATE, "pipe: %s", strerror(errno));
    *read_fd = fds[0];
    *write_fd = fds[1];
    return DP_OK;
}

/* (a worker that died leaves a pipe without a reader: EPIPE, not SIGPIPE) */
dp_status dp_fd_write_all(int fd, const void *buf, int64_t n)
{
    const char *p = buf;
    proc_sigpipe_guard guard;
    proc_sigpipe_block(&guard);
    while (n > 0) {
        ssize_t w = write(fd, p, (size_t)(n > (1 << 30) ? (1 << 30) : n));
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            const int e = errno;
            proc_sigpipe_restore(&guard);
            return dp_fail(DP_ERR_STATE, "write to fd %d: %s", fd, w < 0 ? strerror(e) : "nothing written");
        }
        p += w;
        n -= w;
    }
    proc_sigpipe_restore(&guard);
    return DP_OK;
}

int64_t dp_fd_read_all(int fd, void *buf, int64_t n)
{
    char *p = buf;
    int64_t total = 0;
    while (total < n) {
        ssize_t r = read(fd, p + total, (size_t)(n - total > (1 << 30) ? (1 << 30) : n - total));
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            dp_fail(DP_ERR_STATE, "read from fd %d: %s", fd, strerror(errno));
            return -1;
        }
        if (r == 0)
            break;   /* the end: the writer closed its end */
        total += r;
    }
    return total;
}

int dp_fd_wait_readable(int fd, double timeout_s)
{
    struct pollfd q = { .fd = fd, .events = POLLIN };
    int ms = timeout_s < 0 ? -1 : (int)(timeout_s * 1000);
    int r = poll(&q, 1, ms);
    if (r < 0)
        return errno == EINTR ? 0 : -1;
    return r > 0 ? 1 : 0;
}

void dp_fd_close(int fd)
{
    if (fd >= 0)
        close(fd);
}

void dp_exit_now(int status)
{
    fflush(NULL);
    _exit(status);
}

/* Every signal of Linux by name; the real-time ones as SIGRTMIN+n. */
const char *dp_signal_name(int signo)
{
    static const char *const names[] = {
        [SIGHUP] = "SIGHUP", [SIGINT] = "SIGINT", [SIGQUIT] = "SIGQUIT", [SIGILL] = "SIGILL",
        [SIGTRAP] = "SIGTRAP", [SIGABRT] = "SIGABRT", [SIGBUS] = "SIGBUS", [SIGFPE] = "SIGFPE",
        [SIGKILL] = "SIGKILL", [SIGUSR1] = "SIGUSR1", [SIGSEGV] = "SIGSEGV", [SIGUSR2] = "SIGUSR2",
        [SIGPIPE] = "SIGPIPE", [SIGALRM] = "SIGALRM", [SIGTERM] = "SIGTERM", [SIGSTKFLT] = "SIGSTKFLT",
        [SIGCHLD] = "SIGCHLD", [SIGCONT] = "SIGCONT", [SIGSTOP] = "SIGSTOP", [SIGTSTP] = "SIGTSTP",
        [SIGTTIN] = "SIGTTIN", [SIGTTOU] = "SIGTTOU", [SIGURG] = "SIGURG", [SIGXCPU] = "SIGXCPU",
        [SIGXFSZ] = "SIGXFSZ", [SIGVTALRM] = "SIGVTALRM", [SIGPROF] = "SIGPROF", [SIGWINCH] = "SIGWINCH",
        [SIGIO] = "SIGIO", [SIGPWR] = "SIGPWR", [SIGSYS] = "SIGSYS",
    };
    static _Thread_local char other[32];
    if (signo > 0 && signo < (int)(sizeof names / sizeof names[0]) && names[signo])
        return names[signo];
    if (signo >= SIGRTMIN && signo <= SIGRTMAX)
        snprintf(other, sizeof other, "SIGRTMIN+%d", signo - SIGRTMIN);
    else
        snprintf(other, sizeof other, "signal %d", signo);
    return other;
}

void proc_sigpipe_block(proc_sigpipe_guard *g)
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &set, &g->old);
    g->blocked = !sigismember(&g->old, SIGPIPE);
}

void proc_sigpipe_restore(proc_sigpipe_guard *g)
{
    if (!g->blocked)
        return;   /* it was blocked before: leave whatever is pending alone */
    sigset_t set, pending;
    sigemptyset(&set);
    sigaddset(&set, SIGPIPE);
    if (sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE)) {
        struct timespec zero = { 0, 0 };
        while (sigtimedwait(&set, NULL, &zero) < 0 && errno == EINTR) {
        }
    }
    pthread_sigmask(SIG_SETMASK, &g->old, NULL);
}
