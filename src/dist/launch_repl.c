/*
 * launch_repl.c — the distributed REPL: `dplua --nproc_per_node=N -i
 * [script.lua]` (docs/DISTRIBUTED.md, "The distributed REPL").
 *
 * The launcher owns the terminal. Each rank runs `dplua -i` as a REPL
 * server (src/lua/host.c, repl_serve) whose stdin is a socket to the
 * launcher. The launcher reads a line with the program's line editor
 * (dp_launch_set_line_reader: libedit, the history, Tab completing from
 * rank 0), sends it to every rank (or to those of `:on 0,2 ...`), keeps
 * each rank's output until every rank has answered, and then prints it
 * folded: ranks whose output is the same share one label ("[0-3] 42"),
 * the others get theirs. Output that comes while no line runs (a script
 * before the prompt, a thread) is printed as it comes, as "[RANK] line".
 *
 * Ctrl-C while a line runs is passed on (SIGINT) to the ranks still
 * running it, which turn it into an "interrupted!" error; at the prompt it
 * drops the line. A rank that ends before the input does ends the REPL:
 * launch.c then stops the others and reports it as for any failure.
 *
 * On several nodes this runs in node 0's launcher over every rank of the
 * job: the other nodes' ranks (r->via set) are reached through their
 * launchers (launch_relay.c), which pass on the requests, the answers, the
 * output lines and the exits.
 */
#define _GNU_SOURCE
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include "dplua_internal.h"
#include "dist/launch.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define REPLY_MAX 65536          /* one answer line, or the completions of a word */
#define COMPLETE_WAIT_MS 2000    /* rank 0 answers completion at once: it is at its prompt */
#define LABEL_MAX 256

static dp_line_reader line_reader;

void dp_launch_set_line_reader(dp_line_reader read_line)
{
    line_reader = read_line;
}

/* ------------------------------------------------------------------------ */
/* the command line                                                          */
/* ------------------------------------------------------------------------ */

/* -i among the dplua options that come before the ranks' script. */
int launch_repl_wanted(const struct launch *L)
{
    for (int i = 0; i < L->child_argc; i++) {
        const char *a = L->child_argv[i];
        if (strcmp(a, "-i") == 0)
            return 1;
        if (strcmp(a, "-e") == 0)
            i++;   /* its code */
        else if (a[0] != '-' || a[1] == '\0' || strcmp(a, "--") == 0)
            return 0;   /* the script: what follows is its own */
    }
    return 0;
}

/* ------------------------------------------------------------------------ */
/* output: kept while a line runs, folded when it is done                    */
/* ------------------------------------------------------------------------ */

static void write_str(struct launch *L, int fd, const char *s)
{
    launch_write(L, fd, s, strlen(s));
}

/* A line of a rank's output (from launch.c's emit): kept while the rank
 * runs a line, else printed now as "[RANK] line". Returns 1: taken. */
int launch_repl_take_line(struct launch *L, struct rank *r, int fd, const char *line, size_t n)
{
    char head[32];
    if (L->node_rank > 0)
        return relay_forward_line(L, r, fd, line, n);   /* node 0 folds it */
    if (r->busy) {
        if (r->nkept == r->capkept) {
            size_t cap = r->capkept ? 2 * r->capkept : 16;
            struct kept_line *k = realloc(r->kept, cap * sizeof *k);
            if (k == NULL)
                return 0;   /* printed as it is instead */
            r->kept = k;
            r->capkept = cap;
        }
        r->kept[r->nkept].fd = fd;
        r->kept[r->nkept].text = strndup(line, n);
        if (r->kept[r->nkept].text == NULL)
            return 0;
        r->nkept++;
        return 1;
    }
    snprintf(head, sizeof head, "[%d] ", r->global);
    write_str(L, fd, head);
    launch_write(L, fd, line, n);
    launch_write(L, fd, "\n", 1);
    return 1;
}

static int same_output(const struct rank *a, const struct rank *b)
{
    if (a->nkept != b->nkept)
        return 0;
    for (size_t k = 0; k < a->nkept; k++)
        if (a->kept[k].fd != b->kept[k].fd || strcmp(a->kept[k].text, b->kept[k].text) != 0)
            return 0;
    return 1;
}

/* "0-3", "0,2", "1,3-5": the global ranks of the chosen local ones (a
 * run of two is "0-1" too, so that the whole world always reads "[0-N]"). */
static void rank_label(const struct launch *L, const char *chosen, char *buf, size_t size)
{
    size_t k = 0;
    buf[0] = '\0';
    for (int i = 0; i < L->nranks; i++) {
        int j = i;
        if (!chosen[i])
            continue;
        while (j + 1 < L->nranks && chosen[j + 1])
            j++;
        if (k < size)
            k += (size_t)snprintf(buf + k, size - k, "%s%d", k ? "," : "", L->ranks[i].global);
        if (j > i && k < size)
            k += (size_t)snprintf(buf + k, size - k, "-%d", L->ranks[j].global);
        i = j;
    }
}

/* The ranks in `ran` wrote as many lines each, to the same streams: then
 * the output folds line by line (a traceback that differs in one address
 * still shares its other lines). */
static int same_shape(const struct launch *L, const char *ran)
{
    const struct rank *first = NULL;
    for (int i = 0; i < L->nranks; i++) {
        const struct rank *r = &L->ranks[i];
        if (!ran[i])
            continue;
        if (first == NULL)
            first = r;
        else if (r->nkept != first->nkept)
            return 0;
        for (size_t k = 0; k < r->nkept; k++)
            if (r->kept[k].fd != first->kept[k].fd)
                return 0;
    }
    return first != NULL;
}

static void print_line(struct launch *L, const char *label, const struct kept_line *k)
{
    write_str(L, k->fd, "[");
    write_str(L, k->fd, label);
    write_str(L, k->fd, "] ");
    write_str(L, k->fd, k->text);
    write_str(L, k->fd, "\n");
}

/* Line k of the ranks in `ran`: one line per distinct text, labelled with
 * the ranks that wrote it. */
static void fold_line(struct launch *L, const char *ran, size_t k, char *done, char *group)
{
    char label[LABEL_MAX];
    memset(done, 0, (size_t)(unsigned)L->nranks);
    for (int i = 0; i < L->nranks; i++) {
        if (!ran[i] || done[i])
            continue;
        memset(group, 0, (size_t)(unsigned)L->nranks);
        for (int j = i; j < L->nranks; j++)
            if (ran[j] && !done[j] && strcmp(L->ranks[i].kept[k].text, L->ranks[j].kept[k].text) == 0)
                group[j] = done[j] = 1;
        rank_label(L, group, label, sizeof label);
        print_line(L, label, &L->ranks[i].kept[k]);
    }
}

/* Print the kept output of the ranks in `ran`, folded, and forget it:
 * line by line when the ranks wrote as many lines, else whole outputs,
 * one per group of ranks that wrote the same. */
static void print_folded(struct launch *L, const char *ran)
{
    char *done = calloc((size_t)(unsigned)L->nranks, 1), *group = calloc((size_t)(unsigned)L->nranks, 1);
    char label[LABEL_MAX];
    if (done == NULL || group == NULL)
        abort();
    if (same_shape(L, ran)) {
        int first = 0;
        while (!ran[first])
            first++;
        for (size_t k = 0; k < L->ranks[first].nkept; k++)
            fold_line(L, ran, k, done, group);
        memset(done, 1, (size_t)(unsigned)L->nranks);   /* nothing left for the loop below */
    }
    for (int i = 0; i < L->nranks; i++) {
        struct rank *r = &L->ranks[i];
        if (!ran[i] || done[i] || r->nkept == 0)
            continue;
        memset(group, 0, (size_t)(unsigned)L->nranks);
        for (int j = i; j < L->nranks; j++)
            if (ran[j] && !done[j] && same_output(r, &L->ranks[j]))
                group[j] = done[j] = 1;
        rank_label(L, group, label, sizeof label);
        for (size_t k = 0; k < r->nkept; k++)
            print_line(L, label, &r->kept[k]);
    }
    for (int i = 0; i < L->nranks; i++) {
        struct rank *r = &L->ranks[i];
        for (size_t k = 0; k < r->nkept; k++)
            free(r->kept[k].text);
        r->nkept = 0;
    }
    free(done);
    free(group);
}

/* ------------------------------------------------------------------------ */
/* the ranks' sockets                                                        */
/* ------------------------------------------------------------------------ */

static void send_request(struct launch *L, struct rank *r, char kind, const char *label, const char *text)
{
    char head[LABEL_MAX + 64];
    size_t len = strlen(text);
    int n = snprintf(head, sizeof head, "%c %zu %s\n", kind, len, label[0] ? label : "-");
    const char *parts[2] = { head, text };
    size_t sizes[2] = { (size_t)n, len };
    if (r->via) {   /* another node's: its launcher writes it to the socket */
        relay_request(L, r, head, (size_t)n);
        relay_request(L, r, text, len);
        return;
    }
    for (int p = 0; p < 2 && r->cmd >= 0; p++) {
        const char *s = parts[p];
        size_t left = sizes[p];
        while (left > 0) {
            ssize_t w = send(r->cmd, s, left, MSG_NOSIGNAL);
            if (w < 0 && errno == EINTR)
                continue;
            if (w <= 0)
                return;   /* the rank is gone: its exit ends the REPL */
            s += w;
            left -= (size_t)w;
        }
    }
}

/* Bytes that came from the rank's socket (here, or relayed from its node). */
void launch_repl_take_reply(struct rank *r, const char *p, size_t n)
{
    if (r->reply == NULL && (r->reply = malloc(REPLY_MAX)) == NULL)
        return;
    while (n > 0) {
        size_t k;
        if (r->reply_n == REPLY_MAX)
            r->reply_n = 0;   /* as read_replies: not the protocol; dropped */
        k = n < REPLY_MAX - r->reply_n ? n : REPLY_MAX - r->reply_n;
        memcpy(r->reply + r->reply_n, p, k);
        r->reply_n += k;
        p += k;
        n -= k;
    }
}

/* Read what the rank's socket holds. -1 at its end. */
static int read_replies(struct rank *r)
{
    if (r->reply == NULL && (r->reply = malloc(REPLY_MAX)) == NULL)
        return -1;
    for (;;) {
        ssize_t got;
        if (r->reply_n == REPLY_MAX)
            r->reply_n = 0;   /* a line longer than any answer: not the protocol; dropped */
        got = recv(r->cmd, r->reply + r->reply_n, REPLY_MAX - r->reply_n, MSG_DONTWAIT);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return 0;
        if (got <= 0) {
            close(r->cmd);
            r->cmd = -1;
            return -1;
        }
        r->reply_n += (size_t)got;
    }
}

/* Take the first whole line of the rank's answers into buf. 1 if there was one. */
static int next_reply(struct rank *r, char *buf, size_t size)
{
    char *nl = r->reply ? memchr(r->reply, '\n', r->reply_n) : NULL;
    size_t n;
    if (nl == NULL)
        return 0;
    n = (size_t)(nl - r->reply);
    snprintf(buf, size, "%.*s", (int)n, r->reply);
    memmove(r->reply, nl + 1, r->reply_n - n - 1);
    r->reply_n -= n + 1;
    return 1;
}

/* The answers 'R', 'D' and 'M' end the rank's running line (or start). */
static void take_answers(struct rank *r)
{
    char line[64];
    while (r->busy && next_reply(r, line, sizeof line))
        if (line[0] == 'R' || line[0] == 'D' || line[0] == 'M') {
            r->answer = line[0];
            r->busy = 0;
        }
}

/* ------------------------------------------------------------------------ */
/* waiting                                                                   */
/* ------------------------------------------------------------------------ */

static int ended(const struct launch *L)
{
    return L->failed != -1 || L->signo != 0;
}

/* Ctrl-C, passed on to a rank: "interrupted!" there. */
static void interrupt(struct launch *L, struct rank *r)
{
    if (r->via)
        relay_interrupt(L, r);
    else
        kill(r->pid, SIGINT);
}

/* One poll over the signal pipe, the ranks' output and their sockets, the
 * links to the other nodes, and stdin when with_stdin; handles what came.
 * Returns 1 when stdin is ready. */
static int wait_once(struct launch *L, int with_stdin)
{
    int cap = 3 * L->nranks + 2 + relay_max_pollfds(L), n = 0, ready = 0;
    struct pollfd *pf = calloc((size_t)cap, sizeof *pf);
    if (pf == NULL)
        abort();
    pf[n++] = (struct pollfd){ launch_sig_pipe[0], POLLIN, 0 };
    if (with_stdin)
        pf[n++] = (struct pollfd){ STDIN_FILENO, POLLIN, 0 };
    for (int i = 0; i < L->nranks; i++) {
        struct rank *r = &L->ranks[i];
        int fds[3] = { r->out.fd, r->err.fd, r->cmd };
        for (int k = 0; k < 3; k++)
            if (fds[k] >= 0)
                pf[n++] = (struct pollfd){ fds[k], POLLIN, 0 };
    }
    n += relay_add_pollfds(L, pf + n);
    if (poll(pf, (nfds_t)n, relay_poll_timeout(L)) >= 0) {
        relay_pump(L);   /* the other nodes' output, answers and exits (or that they did not come) */
        for (int i = 0; i < L->nranks; i++) {
            struct rank *r = &L->ranks[i];
            if (r->via == NULL) {
                launch_pump(L, r, &r->out);   /* non-blocking: takes what is there */
                launch_pump(L, r, &r->err);
            }
            if (r->cmd >= 0)
                read_replies(r);
            take_answers(r);
        }
        if (pf[0].revents)
            launch_handle_signals(L);
        ready = with_stdin && pf[1].revents != 0;
    }
    free(pf);
    return ready;
}

/* The line editor's wait: 0 when stdin has input; 1 to give up the line
 * (Ctrl-C, or a rank that ended). */
static int prompt_wait(void *arg)
{
    struct launch *L = arg;
    for (;;) {
        if (ended(L))
            return 1;
        if (L->interrupted) {
            L->interrupted = 0;
            return 1;
        }
        if (wait_once(L, 1))
            return 0;
    }
}

/* Until every rank in `ran` has answered, passing Ctrl-C on to those that
 * still run. */
static void wait_answers(struct launch *L, const char *ran)
{
    for (;;) {
        int busy = 0;
        for (int i = 0; i < L->nranks; i++)
            busy |= ran[i] && L->ranks[i].busy;
        if (!busy || ended(L))
            break;
        if (L->interrupted) {
            L->interrupted = 0;
            for (int i = 0; i < L->nranks; i++)
                if (ran[i] && L->ranks[i].busy)
                    interrupt(L, &L->ranks[i]);
        }
        wait_once(L, 0);
    }
    for (int i = 0; i < L->nranks; i++)   /* what the rank wrote before it answered */
        if (ran[i] && L->ranks[i].via == NULL) {
            launch_pump(L, &L->ranks[i], &L->ranks[i].out);
            launch_pump(L, &L->ranks[i], &L->ranks[i].err);
        }
}

/* ------------------------------------------------------------------------ */
/* completion, from rank 0                                                   */
/* ------------------------------------------------------------------------ */

static char **complete_remote(void *arg, const char *text)
{
    struct launch *L = arg;
    struct rank *r = &L->ranks[0];
    char line[REPLY_MAX];
    char **words = NULL;
    int count = -1, got = 0;
    double until = dp_clock_monotonic() + COMPLETE_WAIT_MS / 1000.0;
    if (r->cmd < 0 || ended(L))
        return NULL;
    send_request(L, r, 'C', "", text);
    while (dp_clock_monotonic() < until && r->cmd >= 0) {
        struct pollfd pf = { r->cmd, POLLIN, 0 };
        while (next_reply(r, line, sizeof line)) {
            if (count < 0) {
                if (sscanf(line, "C %d", &count) != 1 || count < 0)
                    return NULL;
                words = calloc((size_t)count + 1, sizeof *words);
                if (words == NULL)
                    return NULL;
            } else if (got < count) {
                words[got++] = strdup(line);
            }
            if (count >= 0 && got == count)
                return words;
        }
        if (poll(&pf, 1, 100) > 0)
            read_replies(r);
    }
    if (words != NULL)
        for (int k = 0; k < got; k++)
            free(words[k]);
    free(words);
    return NULL;
}

/* ------------------------------------------------------------------------ */
/* the prompt                                                                */
/* ------------------------------------------------------------------------ */

int dp_launch_read_plain_line(const char *prompt, char **out, int (*wait)(void *),
                              char **(*complete)(void *, const char *), void *arg)
{
    size_t n = 0, cap = 256;
    char *line = malloc(cap);
    (void)complete;
    if (isatty(STDIN_FILENO)) {
        fputs(prompt, stdout);
        fflush(stdout);
    }
    for (;;) {
        char c;
        ssize_t got;
        if (line == NULL)
            return -1;
        if (wait(arg) != 0) {
            free(line);
            return 1;
        }
        got = read(STDIN_FILENO, &c, 1);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0 && n == 0) {
            free(line);
            return -1;
        }
        if (got <= 0 || c == '\n')
            break;
        if (n + 1 >= cap) {
            char *more = realloc(line, cap *= 2);
            if (more == NULL)
                free(line);
            line = more;
            if (line == NULL)
                return -1;
        }
        line[n++] = c;
    }
    line[n] = '\0';
    *out = line;
    return 0;
}

/* ":on 0,2-3 code": the ranks (global, as L->ranks holds every rank the
 * REPL serves) into `on`, the code's offset into *code. Returns 0, or -1
 * (with a message) for a bad list. */
static int parse_on(const struct launch *L, const char *line, char *on, const char **code)
{
    const char *p = line + 3;
    memset(on, 0, (size_t)(unsigned)L->nranks);
    p += strspn(p, " \t");
    for (;;) {
        char *end;
        long a = strtol(p, &end, 10), b = a;
        if (end == p)
            break;
        p = end;
        if (*p == '-') {
            b = strtol(p + 1, &end, 10);
            if (end == p + 1)
                goto bad;
            p = end;
        }
        if (a < 0 || b >= L->nranks || a > b) {
            if (a == b)
                fprintf(stderr, PROG ": :on %ld: the ranks are 0 to %d\n", a, L->nranks - 1);
            else
                fprintf(stderr, PROG ": :on %ld-%ld: the ranks are 0 to %d\n", a, b, L->nranks - 1);
            return -1;
        }
        for (long k = a; k <= b; k++)
            on[k] = 1;
        if (*p != ',')
            break;
        p++;
    }
    if (*p != ' ' && *p != '\t')
        goto bad;
    for (int i = 0; i < L->nranks; i++)
        if (on[i]) {
            *code = p + strspn(p, " \t");
            return 0;
        }
bad:
    fprintf(stderr, PROG ": usage: :on RANKS CODE, with RANKS such as 1 or 0,2 or 1-3\n");
    return -1;
}

static void print_banner(const struct launch *L)
{
    printf(PROG " distributed REPL on %d ranks: each line runs on every rank, and their output\n"
           "prints once for ranks that agree ([0-%d] ...); `:on 0,2 CODE` runs CODE on some\n"
           "ranks (no collectives there); Tab completes on rank 0, Ctrl-C interrupts, Ctrl-D exits\n",
           L->nranks, L->nranks - 1);
    fflush(stdout);
}

/* Send a line to the ranks in `on` (a chunk's first line chooses them) and
 * print what they wrote. Returns 1 when the chunk is unfinished. */
static int run_line(struct launch *L, const char *on, int some, const char *label, const char *code)
{
    int more = 1, any = 0;
    for (int i = 0; i < L->nranks; i++)
        if (on[i] && (L->ranks[i].cmd >= 0 || relay_reachable(&L->ranks[i]))) {
            L->ranks[i].busy = 1;
            L->ranks[i].answer = 0;
            send_request(L, &L->ranks[i], some ? 'P' : 'L', label, code);
        }
    wait_answers(L, on);
    print_folded(L, on);
    for (int i = 0; i < L->nranks; i++)
        if (on[i]) {
            any = 1;
            more &= L->ranks[i].answer == 'M';
        }
    return any && more;
}

int launch_repl(struct launch *L)
{
    char *all = malloc((size_t)(unsigned)L->nranks), *on = malloc((size_t)(unsigned)L->nranks);
    char label[LABEL_MAX];
    int pending = 0, some = 0, status = -1;
    dp_line_reader read_line = line_reader ? line_reader : dp_launch_read_plain_line;
    if (all == NULL || on == NULL)
        abort();
    memset(all, 1, (size_t)(unsigned)L->nranks);
    for (;;) {   /* until each rank has run -e code and the script: their output prints as it comes */
        int ready = 1;
        for (int i = 0; i < L->nranks; i++) {
            struct rank *r = &L->ranks[i];
            char line[64];
            while (r->answer != 'R' && next_reply(r, line, sizeof line))
                if (line[0] == 'R')
                    r->answer = 'R';
            ready &= r->answer == 'R';
        }
        if (ready || ended(L))
            break;
        if (L->interrupted) {   /* Ctrl-C stops the scripts; the prompt then opens, as with -i */
            L->interrupted = 0;
            for (int i = 0; i < L->nranks; i++)
                if (L->ranks[i].answer != 'R')
                    interrupt(L, &L->ranks[i]);
        }
        wait_once(L, 0);
    }
    if (!ended(L) && isatty(STDIN_FILENO))
        print_banner(L);
    while (!ended(L)) {
        char *line = NULL;
        const char *code;
        int got = read_line(pending ? ">> " : "> ", &line, prompt_wait, complete_remote, L);
        if (got < 0) {
            status = 0;
            break;
        }
        if (got > 0) {   /* Ctrl-C at the prompt: drop the line and the chunk */
            if (pending)
                for (int i = 0; i < L->nranks; i++)
                    if (on[i])
                        send_request(L, &L->ranks[i], 'X', "", "");
            pending = 0;
            continue;
        }
        code = line;
        if (!pending) {
            memcpy(on, all, (size_t)(unsigned)L->nranks);
            some = 0;
            label[0] = '\0';
            if (strncmp(line, ":on", 3) == 0 && (line[3] == ' ' || line[3] == '\t')) {
                if (parse_on(L, line, on, &code) != 0) {
                    free(line);
                    continue;
                }
                some = memcmp(on, all, (size_t)(unsigned)L->nranks) != 0;   /* every rank: collectives are fine */
                rank_label(L, on, label, sizeof label);
            }
        }
        pending = run_line(L, on, some, label, code);
        free(line);
    }
    L->repl_closing = 1;   /* from here a rank's exit is the end it was asked for */
    for (int i = 0; i < L->nranks; i++)
        if (L->ranks[i].cmd >= 0) {
            close(L->ranks[i].cmd);   /* the end of its input: the rank exits */
            L->ranks[i].cmd = -1;
        }
    relay_end(L, status == 0);   /* the same for the other nodes' ranks, or they stop */
    while (relay_pending(L) && L->signo == 0)   /* until they have told how their ranks ended */
        wait_once(L, 0);
    relay_end(L, 0);
    if (status == 0 && isatty(STDIN_FILENO))
        write_str(L, 1, "\n");
    free(all);
    free(on);
    return status;
}
