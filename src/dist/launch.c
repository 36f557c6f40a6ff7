/*
 * launch.c — the launcher: starts the ranks of one node, watches them, and
 * ends them all when one fails (dp_launch_main in src/dplua_internal.h, and
 * docs/DISTRIBUTED.md).
 *
 * Each rank is this same program (/proc/self/exe) run on the script, with
 * torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
 * GROUP_RANK, MASTER_ADDR, MASTER_PORT) and DPLUA_JOB_TOKEN. Its stdout and
 * stderr come back through pipes and are written out a whole line at a
 * time, so lines of different ranks never mix; the last lines of each
 * rank's stderr are kept for the report when it fails.
 *
 * One process, one thread, one poll() loop: the pipes, and a self-pipe
 * that the signal handlers (SIGCHLD, and SIGINT/SIGTERM/SIGHUP to forward)
 * write to. Each rank runs in its own process group, so a Ctrl-C at the
 * terminal reaches the launcher alone and the ranks get it once, forwarded.
 * A rank gets SIGTERM when the launcher dies (PR_SET_PDEATHSIG), and then
 * kills its process group, what it started included (src/dist/rank.c).
 */
#define _GNU_SOURCE
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include "dplua.h"
#include "dplua_cuda.h"
#include "dplua_internal.h"
#include "dist/process.h"
#include "dist/launch.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define EXIT_USAGE 2
#define GO_ON (-1)              /* parse: no exit status yet */
#define TAIL_LINE_MAX 1000
#define SIGNAL_GRACE 30.0       /* the launcher was signalled: the same, as torchrun */
#define DRAIN_GRACE 1.0         /* output still open after every rank exited */
#define DEFAULT_MULTINODE_PORT 29500

/* ======================================================================== */
/* the command line                                                          */
/* ======================================================================== */

enum { F_NPROC, F_NNODES, F_NODE_RANK, F_ADDR, F_PORT, F_STANDALONE, F_TEE, F_PREFIX,
       F_MAX_RESTARTS, F_RDZV_BACKEND, F_RDZV_ENDPOINT, F_RDZV_ID, F_REPL_PORT };

enum { NO_VALUE, VALUE, OPTIONAL_DIGIT };

static const struct flag {
    const char *name;
    int value;
} flags[] = {
    [F_NPROC] = { "nproc_per_node", VALUE },
    [F_NNODES] = { "nnodes", VALUE },
    [F_NODE_RANK] = { "node_rank", VALUE },
    [F_ADDR] = { "master_addr", VALUE },
    [F_PORT] = { "master_port", VALUE },
    [F_STANDALONE] = { "standalone", NO_VALUE },
    [F_TEE] = { "tee", OPTIONAL_DIGIT },
    [F_PREFIX] = { "prefix_output", NO_VALUE },
    [F_MAX_RESTARTS] = { "max_restarts", VALUE },
    [F_RDZV_BACKEND] = { "rdzv_backend", VALUE },
    [F_RDZV_ENDPOINT] = { "rdzv_endpoint", VALUE },
    [F_RDZV_ID] = { "rdzv_id", VALUE },
    [F_REPL_PORT] = { "repl_port", VALUE },
};
#define NFLAGS ((int)(sizeof flags / sizeof flags[0]))

static const char usage_text[] =
    "usage: " PROG " --nproc_per_node=N [launcher options] script [args...]\n"
    "\n"
    "Starts N ranks of the script on this node, each with torchrun's env://\n"
    "variables (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK,\n"
    "MASTER_ADDR, MASTER_PORT) and DPLUA_JOB_TOKEN, and stops them all when one\n"
    "fails. Flags are spelt with '_' or '-', as --flag=V or --flag V.\n"
    "\n"
    "  --nproc_per_node=N   ranks on this node: a number, gpu (one per GPU),\n"
    "                       cpu (one per core) or auto (gpu if any, else cpu)\n"
    "  --nnodes=M           nodes in the job (default 1)\n"
    "  --node_rank=K        this node, 0..M-1 (needed when M > 1)\n"
    "  --master_addr=HOST   the node of rank 0 (default 127.0.0.1)\n"
    "  --master_port=PORT   the store's port (default: a free port on one node,\n"
    "                       29500 on several)\n"
    "  --rdzv_endpoint=HOST:PORT  the same as --master_addr and --master_port\n"
    "  --standalone         one node, local rendezvous (the default)\n"
    "  --prefix-output, --tee   prefix each line of output with \"[RANK]: \"\n"
    "  --max_restarts=N     when a rank fails, stop every rank and start them all\n"
    "                       again, up to N times (default 0; one node)\n"
    "  --repl_port=PORT     with -i on several nodes: where node 0's launcher\n"
    "                       listens for the others' (default: --master_port + 1)\n"
    "\n"
    "The first argument that is not a launcher flag (or the one after --)\n"
    "starts what each rank runs: a script and its arguments, or dplua options\n"
    "such as -e CODE. With -i among those options (" PROG " --nproc_per_node=N -i\n"
    "[script]) the launcher is a REPL whose lines run on every rank; on several\n"
    "nodes node 0's launcher has the prompt and the others relay their ranks.\n"
    "\n"
    "exit status: 0 when every rank exits 0, else the status of the first rank\n"
    "that failed (128+N for signal N); 128+N when the launcher got signal N;\n"
    "2 for a bad command line.\n";

static int usage(const char *fmt, const char *a, const char *b)
{
    fprintf(stderr, PROG ": ");
    fprintf(stderr, fmt, a, b);
    fprintf(stderr, "\nTry '" PROG " --nproc_per_node=1 --help' for the launcher's flags.\n");
    return EXIT_USAGE;
}

/* The flag named by arg ("--node-rank=1" -> F_NODE_RANK), or -1. */
static int find_flag(const char *arg)
{
    const char *name = arg + 2;
    size_t len = strcspn(name, "=");
    if (strncmp(arg, "--", 2) != 0 || len == 0)
        return -1;
    for (int f = 0; f < NFLAGS; f++) {
        const char *fl = flags[f].name;
        size_t k;
        if (strlen(fl) != len)
            continue;
        for (k = 0; k < len; k++)
            if (name[k] != fl[k] && !(name[k] == '-' && fl[k] == '_'))
                break;
        if (k == len)
            return f;
    }
    return -1;
}

int dp_launch_is_flag(const char *arg)
{
    return arg != NULL && find_flag(arg) >= 0;
}

/* A whole decimal number in [lo, hi], or -1 (lo >= 0). */
static long parse_num(const char *s, long lo, long hi)
{
    char *end;
    long v;
    if (s == NULL || *s < '0' || *s > '9')
        return -1;
    errno = 0;
    v = strtol(s, &end, 10);
    if (errno || *end != '\0' || v < lo || v > hi)
        return -1;
    return v;
}

/* HOST:PORT, [V6]:PORT or HOST into L. */
static int set_endpoint(struct launch *L, const char *v)
{
    const char *colon = strrchr(v, ':');
    size_t hl;
    if (v[0] == '[') {
        const char *close = strchr(v, ']');
        if (close == NULL)
            return usage("--rdzv_endpoint: bad address '%s'%s", v, "");
        colon = close[1] == ':' ? close + 1 : NULL;
        hl = (size_t)(close - v - 1);
        v++;
    } else {
        if (colon && strchr(v, ':') != colon)
            colon = NULL;  /* a bare IPv6 address */
        hl = colon ? (size_t)(colon - v) : strlen(v);
    }
    if (hl == 0 || hl >= sizeof L->addr)
        return usage("--rdzv_endpoint: bad address '%s'%s", v, "");
    memcpy(L->addr, v, hl);
    L->addr[hl] = '\0';
    if (colon) {
        long p = parse_num(colon + 1, 1, 65535);
        if (p < 0)
            return usage("--rdzv_endpoint: bad port in '%s'%s", v, "");
        L->port = (int)p;
        L->port_set = 1;
    }
    return GO_ON;
}

static int set_nproc(struct launch *L, const char *v)
{
    long n;
    if (strcmp(v, "gpu") == 0 || strcmp(v, "cpu") == 0 || strcmp(v, "auto") == 0) {
        snprintf(L->nproc_word, sizeof L->nproc_word, "%s", v);
    } else if ((n = parse_num(v, 1, 4096)) > 0) {
        L->nproc = (int)n;
    } else {
        return usage("--nproc_per_node: expected a number from 1 to 4096, gpu, cpu or auto; got '%s'%s",
                     v, "");
    }
    L->nproc_set = 1;
    return GO_ON;
}

static int set_nnodes(struct launch *L, const char *v)
{
    const char *colon = strchr(v, ':');
    long n, m;
    if (colon) {  /* torchrun's elastic MIN:MAX: only MIN == MAX */
        char min[32];
        size_t len = (size_t)(colon - v);
        if (len >= sizeof min)
            len = sizeof min - 1;
        memcpy(min, v, len);
        min[len] = '\0';
        n = parse_num(min, 1, 1 << 20);
        m = parse_num(colon + 1, 1, 1 << 20);
        if (n < 1 || n != m)
            return usage("--nnodes=%s: elastic ranges are not supported; give one number%s", v, "");
    } else if ((n = parse_num(v, 1, 1 << 20)) < 1) {
        return usage("--nnodes: expected a number >= 1; got '%s'%s", v, "");
    }
    L->nnodes = (int)n;
    L->nnodes_set = 1;
    return GO_ON;
}

/* One flag with its value (NULL when it has none). */
static int apply(struct launch *L, int f, const char *v)
{
    long n;
    switch (f) {
    case F_NPROC:
        return set_nproc(L, v);
    case F_NNODES:
        return set_nnodes(L, v);
    case F_NODE_RANK:
        if ((n = parse_num(v, 0, 1 << 20)) < 0)
            return usage("--node_rank: expected a number >= 0; got '%s'%s", v, "");
        L->node_rank = (int)n;
        L->node_rank_set = 1;
        return GO_ON;
    case F_ADDR:
        if (*v == '\0' || strlen(v) >= sizeof L->addr)
            return usage("--master_addr: bad address '%s'%s", v, "");
        snprintf(L->addr, sizeof L->addr, "%s", v);
        return GO_ON;
    case F_PORT:
        if ((n = parse_num(v, 1, 65535)) < 0)
            return usage("--master_port: expected a port from 1 to 65535; got '%s'%s", v, "");
        L->port = (int)n;
        L->port_set = 1;
        return GO_ON;
    case F_STANDALONE:
        L->standalone = 1;
        return GO_ON;
    case F_TEE:
        L->prefix = v == NULL || strcmp(v, "0") != 0;
        return GO_ON;
    case F_PREFIX:
        L->prefix = 1;
        return GO_ON;
    case F_MAX_RESTARTS:
        if ((n = parse_num(v, 0, 1000)) < 0)
            return usage("--max_restarts: expected a number from 0 to 1000; got '%s'%s", v, "");
        L->max_restarts = (int)n;
        return GO_ON;
    case F_RDZV_BACKEND:
        if (strcmp(v, "static") != 0 && strcmp(v, "c10d") != 0)
            return usage("--rdzv_backend=%s: dplua's rendezvous is static (static or c10d)%s", v, "");
        return GO_ON;
    case F_RDZV_ENDPOINT:
        return set_endpoint(L, v);
    case F_REPL_PORT:
        if ((n = parse_num(v, 1, 65535)) < 0)
            return usage("--repl_port: expected a port from 1 to 65535; got '%s'%s", v, "");
        L->repl_port = (int)n;
        L->repl_port_set = 1;
        return GO_ON;
    default: /* F_RDZV_ID */
        snprintf(L->rdzv_id, sizeof L->rdzv_id, "%s", v);
        return GO_ON;
    }
}

/* The value of flag f at argv[*i]; advances *i past a separate value. */
static int flag_value(int argc, char **argv, int *i, int f, const char **v)
{
    const char *a = argv[*i], *eq = strchr(a, '=');
    *v = NULL;
    if (flags[f].value == NO_VALUE) {
        if (eq)
            return usage("%s takes no value%s", a, "");
    } else if (eq) {
        *v = eq + 1;
    } else if (flags[f].value == VALUE) {
        if (*i + 1 >= argc)
            return usage("missing value after %s%s", a, "");
        *v = argv[++*i];
    } else if (*i + 1 < argc && argv[*i + 1][0] >= '0' && argv[*i + 1][0] <= '3' &&
               argv[*i + 1][1] == '\0') {
        *v = argv[++*i];   /* torchrun's --tee 3 */
    }
    return GO_ON;
}

static int parse_args(struct launch *L, int argc, char **argv)
{
    int i, st;
    for (i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        int f;
        if (strcmp(a, "--") == 0) {
            i++;
            break;
        }
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            fputs(usage_text, stdout);
            return 0;
        }
        f = find_flag(a);
        if (f < 0 && strncmp(a, "--", 2) == 0)
            return usage("unrecognized launcher option '%s'%s", a, "");
        if (f < 0)
            break;
        if ((st = flag_value(argc, argv, &i, f, &v)) != GO_ON || (st = apply(L, f, v)) != GO_ON)
            return st;
    }
    L->child_argc = argc - i;
    L->child_argv = argv + i;
    if (L->child_argc == 0)
        return usage("missing script: the launcher needs a script (or -e CODE) to run%s%s", "", "");
    return GO_ON;
}

/* ======================================================================== */
/* the job: ranks, port, token                                               */
/* ======================================================================== */

/* gpu/cpu/auto into a number. */
static int resolve_nproc(struct launch *L)
{
    int gpus = 0;
    if (L->nproc_word[0] == '\0')
        return GO_ON;
    if (strcmp(L->nproc_word, "cpu") == 0) {
        L->nproc = dp_cpu_count();
        return GO_ON;
    }
    if (dp_cuda_devices(&gpus) == DP_OK)
        L->nproc = gpus;
    else if (strcmp(L->nproc_word, "auto") == 0)
        L->nproc = dp_cpu_count();
    else
        return usage("--nproc_per_node=gpu: %s%s", dp_last_error(), "");
    return GO_ON;
}

/* A port that nothing listens on now (the rank 0 store binds it soon). */
static int free_port(void)
{
    struct sockaddr_in a;
    socklen_t len = sizeof a;
    int port = -1, fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    close(fd);
    return port;
}

/* DPLUA_JOB_TOKEN: the caller's, else random on one node. On several
 * nodes the launchers cannot share a secret of their own making: the
 * ranks then find the token themselves (a file rank 0 writes, docs/
 * DISTRIBUTED.md "The job token"), and the token stays empty here. */
static int make_token(struct launch *L)
{
    const char *env = getenv("DPLUA_JOB_TOKEN");
    unsigned char r[16];
    if (env && *env) {
        snprintf(L->token, sizeof L->token, "%s", env);
        if (strlen(env) >= sizeof L->token)
            return usage("DPLUA_JOB_TOKEN is too long (at most %s bytes)%s", "79", "");
        return GO_ON;
    }
    if (L->nnodes > 1)
        return GO_ON;
    if (getrandom(r, sizeof r, 0) != (ssize_t)sizeof r) {
        fprintf(stderr, PROG ": cannot read random bytes for the job token: %s\n", strerror(errno));
        return 1;
    }
    for (int i = 0; i < 16; i++)
        snprintf(L->token + 2 * i, 3, "%02x", r[i]);
    return GO_ON;
}

/* Checks the flags together and fills in the defaults. */
static int settle(struct launch *L)
{
    int st;
    if (!L->nproc_set)
        return usage("the launcher needs --nproc_per_node%s%s", "", "");
    if (L->standalone && L->nnodes > 1)
        return usage("--standalone is for one node, but --nnodes is %s%s", "more than 1", "");
    if (L->node_rank >= L->nnodes) {
        char nr[32], nn[32];
        snprintf(nr, sizeof nr, "%d", L->node_rank);
        snprintf(nn, sizeof nn, "%d", L->nnodes);
        return usage("--node_rank=%s must be less than --nnodes=%s", nr, nn);
    }
    if (L->nnodes > 1 && !L->node_rank_set)
        return usage("--nnodes is more than 1: give each node its --node_rank%s%s", "", "");
    if (L->nnodes > 1 && L->max_restarts > 0)   /* the launchers of other nodes would not know */
        return usage("--max_restarts: restarts are for one node (--nnodes is %s)%s", "more than 1", "");
    if ((st = resolve_nproc(L)) != GO_ON)
        return st;
    if (L->nproc > 1 && strcmp(L->child_argv[0], "-") == 0)   /* each rank would read a part of one stdin */
        return usage("the script '-' (standard input) cannot be read by %s ranks on a node: give a file%s",
                     "several", "");
    if (L->addr[0] == '\0')
        snprintf(L->addr, sizeof L->addr, "127.0.0.1");
    if (L->nnodes == 1) {   /* rank 0 is on this node: its address must resolve now (on several nodes, DNS may lag) */
        struct addrinfo hints = { .ai_socktype = SOCK_STREAM }, *res = NULL;
        int e = getaddrinfo(L->addr, NULL, &hints, &res);
        if (e != 0)
            return usage("--master_addr=%s: cannot resolve it (%s)", L->addr, gai_strerror(e));
        freeaddrinfo(res);
    }
    if (!L->port_set && L->nnodes > 1)
        L->port = DEFAULT_MULTINODE_PORT;
    else if (!L->port_set && (L->port = free_port()) < 0) {
        fprintf(stderr, PROG ": cannot find a free port: %s\n", strerror(errno));
        return 1;
    }
    return make_token(L);
}

/* -i on several nodes: the port where node 0's launcher meets the others'
 * (launch_relay.c). */
static int settle_repl_port(struct launch *L)
{
    if (!L->repl || L->nnodes == 1) {
        if (L->repl_port_set)
            return usage("--repl_port is for -i on several nodes (--nnodes above 1)%s%s", "", "");
        return GO_ON;
    }
    if (!L->repl_port_set) {
        if (L->port == 65535)
            return usage("--master_port=65535 leaves no port above it for the REPL: give --repl_port%s%s", "", "");
        L->repl_port = L->port + 1;
    }
    if (L->repl_port == L->port)
        return usage("--repl_port must differ from --master_port (the store's)%s%s", "", "");
    return GO_ON;
}

/* ======================================================================== */
/* starting the ranks                                                        */
/* ======================================================================== */

/* The variables a rank gets, over the launcher's environment (at most
 * RANK_VARS of them); a bare name is removed. */
#define RANK_VARS 18

static int rank_vars(const struct launch *L, const struct rank *r, char **set)
{
    int k = 0, nthreads = dp_cpu_count() / L->nproc;
#define SETV(...) do { if (asprintf(&set[k], __VA_ARGS__) < 0) return -1; k++; } while (0)
    SETV("RANK=%d", r->global);
    SETV("LOCAL_RANK=%d", r->local);
    SETV("WORLD_SIZE=%d", L->nproc * L->nnodes);
    SETV("LOCAL_WORLD_SIZE=%d", L->nproc);
    SETV("GROUP_RANK=%d", L->node_rank);
    SETV("GROUP_WORLD_SIZE=%d", L->nnodes);
    SETV("ROLE_RANK=%d", r->global);
    SETV("ROLE_WORLD_SIZE=%d", L->nproc * L->nnodes);
    SETV("MASTER_ADDR=%s", L->addr);
    SETV("MASTER_PORT=%d", L->port);
    if (L->token[0])
        SETV("DPLUA_JOB_TOKEN=%s", L->token);
    else
        SETV("DPLUA_JOB_TOKEN");   /* the ranks find it themselves (token.c) */
    SETV("DPLUA_LAUNCHER_PID=%d", (int)getpid());   /* the rank's watch on us (rank.c) */
    SETV("TORCHELASTIC_RESTART_COUNT=%d", L->restart);   /* torchrun's name: 0, then 1, 2, ... */
    SETV("TORCHELASTIC_USE_AGENT_STORE");   /* torchrun's agent store is not ours */
    if (L->repl)
        SETV("DPLUA_REPL_SERVER=1");   /* stdin is the REPL's socket: host.c */
    if (getenv("NCCL_NVLS_ENABLE") == NULL)
        SETV("NCCL_NVLS_ENABLE=0");
    if (getenv("OMP_NUM_THREADS") == NULL && L->nproc > 1)
        SETV("OMP_NUM_THREADS=%d", nthreads > 1 ? nthreads : 1);
#undef SETV
    return 0;
}

/* The environment of one rank, built before fork(): the launcher's with
 * rank_vars over it. Freed with proc_free_environment. */
static char **rank_env(const struct launch *L, const struct rank *r)
{
    char *set[RANK_VARS + 1] = { NULL };
    char **env = rank_vars(L, r, set) == 0 ? proc_environment((const char *const *)set) : NULL;
    for (int i = 0; set[i]; i++)
        free(set[i]);
    return env;
}

static int start_rank(struct launch *L, struct rank *r, char **argv)
{
    int po[2], pe[2], devnull = -1, e;
    char **env = rank_env(L, r);
    pid_t pid;
    if (env == NULL || pipe2(po, O_CLOEXEC) < 0) {
        proc_free_environment(env);
        return -1;
    }
    if (pipe2(pe, O_CLOEXEC) < 0) {
        close(po[0]);
        close(po[1]);
        proc_free_environment(env);
        return -1;
    }
    r->cmd = -1;
    if (L->repl) {   /* stdin: a socket to the rank's REPL server */
        int sv[2];
        if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0) {
            close(po[0]);
            close(po[1]);
            close(pe[0]);
            close(pe[1]);
            proc_free_environment(env);
            return -1;
        }
        r->cmd = sv[0];
        devnull = sv[1];
    } else if (isatty(0)) {   /* a background group must not read the terminal */
        devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
    }
    struct proc_spec spec = { .program = NULL, .argv = argv, .envp = env, .fd = { devnull, po[1], pe[1] },
                              .own_group = true, .parent_death_signal = SIGTERM };
    e = proc_start(&spec, &pid);
    close(po[1]);
    close(pe[1]);
    if (devnull >= 0)
        close(devnull);
    proc_free_environment(env);
    if (e != 0) {
        close(po[0]);
        close(pe[0]);
        if (r->cmd >= 0)
            close(r->cmd);
        r->cmd = -1;
        errno = e;
        return -1;
    }
    r->pid = pid;
    r->running = 1;
    r->out = (struct linebuf){ malloc(LINE_MAX_BYTES), 0, po[0], 1 };
    r->err = (struct linebuf){ malloc(LINE_MAX_BYTES), 0, pe[0], 2 };
    fcntl(po[0], F_SETFL, O_NONBLOCK);
    fcntl(pe[0], F_SETFL, O_NONBLOCK);
    L->running++;
    return 0;
}

/* ======================================================================== */
/* output                                                                    */
/* ======================================================================== */

void launch_write(struct launch *L, int fd, const char *p, size_t n)
{
    while (n > 0 && !L->out_dead[fd]) {
        ssize_t w = write(fd, p, n);
        if (w > 0) {
            p += w;
            n -= (size_t)w;
        } else if (w < 0 && errno != EINTR && errno != EAGAIN) {
            L->out_dead[fd] = 1;   /* EPIPE: nobody reads it any more */
        }
    }
}

static void keep_tail(struct rank *r, const char *line, size_t n)
{
    char *copy;
    if (n > TAIL_LINE_MAX)
        n = TAIL_LINE_MAX;
    copy = malloc(n + 1);
    if (copy == NULL)
        return;
    memcpy(copy, line, n);
    copy[n] = '\0';
    free(r->tail[r->tail_next]);
    r->tail[r->tail_next] = copy;
    r->tail_next = (r->tail_next + 1) % TAIL_LINES;
    if (r->tail_count < TAIL_LINES)
        r->tail_count++;
}

/* One line (without its newline) of the rank's stdout (fd 1) or stderr
 * (fd 2) out, with one write(). */
void launch_emit(struct launch *L, struct rank *r, int fd, const char *line, size_t n)
{
    static char out[LINE_MAX_BYTES + 64];
    size_t k = 0;
    if (n > LINE_MAX_BYTES)
        n = LINE_MAX_BYTES;
    if (fd == 2)
        keep_tail(r, line, n);
    if (L->repl && launch_repl_take_line(L, r, fd, line, n))
        return;
    if (L->prefix)
        k = (size_t)snprintf(out, 64, "[%d]: ", r->global);
    memcpy(out + k, line, n);
    out[k + n] = '\n';
    launch_write(L, fd, out, k + n + 1);
}

/* Reads what the pipe holds and writes out the complete lines. */
void launch_pump(struct launch *L, struct rank *r, struct linebuf *b)
{
    for (;;) {
        ssize_t got = read(b->fd, b->buf + b->n, LINE_MAX_BYTES - b->n);
        size_t start = 0;
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0) {
            if (got == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) {
                if (b->n > 0)
                    launch_emit(L, r, b->out, b->buf, b->n);   /* the last line had no newline */
                b->n = 0;
                close(b->fd);
                b->fd = -1;
            }
            return;
        }
        b->n += (size_t)got;
        for (size_t i = 0; i < b->n; i++)
            if (b->buf[i] == '\n') {
                launch_emit(L, r, b->out, b->buf + start, i - start);
                start = i + 1;
            }
        if (start == 0 && b->n == LINE_MAX_BYTES) {
            launch_emit(L, r, b->out, b->buf, b->n);   /* a line too long to keep whole */
            start = b->n;
        }
        memmove(b->buf, b->buf + start, b->n - start);
        b->n -= start;
    }
}

/* ======================================================================== */
/* signals and exits                                                         */
/* ======================================================================== */

int launch_sig_pipe[2] = { -1, -1 };

static void on_signal(int signo)
{
    proc_pipe_signal(launch_sig_pipe[1], signo);
}

static int install_signals(void)
{
    struct sigaction sa;
    static const int sigs[] = { SIGCHLD, SIGINT, SIGTERM, SIGHUP };
    if (pipe2(launch_sig_pipe, O_CLOEXEC | O_NONBLOCK) < 0)
        return -1;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
        sigaction(sigs[i], &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    return 0;
}

/* A rank and what it started (its process group, as a terminal would). */
void launch_signal_rank(const struct rank *r, int signo)
{
    if (kill(-r->pid, signo) < 0)
        kill(r->pid, signo);
}

static void signal_running(struct launch *L, int signo)
{
    for (int i = 0; i < L->nproc; i++)
        if (L->ranks[i].running)
            launch_signal_rank(&L->ranks[i], signo);
}

/* A rank failed: ask the others to stop, then make them. */
void launch_stop_others(struct launch *L, double grace)
{
    signal_running(L, SIGTERM);
    if (L->kill_at == 0)
        L->kill_at = dp_clock_monotonic() + grace;
}

static void reap(struct launch *L)
{
    int status;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
        for (int i = 0; i < L->nproc; i++) {
            struct rank *r = &L->ranks[i];
            if (r->pid != pid || !r->running)
                continue;
            r->running = 0;
            r->status = status;
            L->running--;
            /* In the REPL every rank stays until its input ends: one that
             * exits earlier, even with 0, ends the session. */
            if ((WIFEXITED(status) && WEXITSTATUS(status) != 0) || WIFSIGNALED(status) ||
                (L->repl && !L->repl_closing)) {
                kill(-pid, SIGTERM);   /* what the failed rank started and left behind (its process group) */
                if (L->failed == -1 && L->signo == 0) {
                    L->failed = i;
                    launch_stop_others(L, TERM_GRACE);
                }
            }
        }
    }
    if (L->running == 0 && L->drain_until == 0)
        L->drain_until = dp_clock_monotonic() + DRAIN_GRACE;
}

void launch_handle_signals(struct launch *L)
{
    unsigned char c;
    while (read(launch_sig_pipe[0], &c, 1) == 1) {
        if (c == SIGCHLD) {
            reap(L);
        } else if (c == SIGINT && L->repl && L->node_rank == 0 && !L->repl_closing) {
            L->interrupted = 1;   /* the REPL passes it on to the ranks running a line */
        } else if (L->signo == 0) {
            L->signo = c;
            fprintf(stderr, PROG ": got %s; passing it on to the ranks\n", dp_signal_name(c));
            signal_running(L, c);
            L->kill_at = dp_clock_monotonic() + SIGNAL_GRACE;
        } else {
            fprintf(stderr, PROG ": got %s again; killing the ranks\n", dp_signal_name(c));
            signal_running(L, SIGKILL);
        }
    }
}

/* ======================================================================== */
/* the loop                                                                  */
/* ======================================================================== */

static int any_open(const struct launch *L)
{
    for (int i = 0; i < L->nproc; i++)
        if (L->ranks[i].out.fd >= 0 || L->ranks[i].err.fd >= 0)
            return 1;
    return 0;
}

static int poll_timeout(const struct launch *L)
{
    double t = -1, n = dp_clock_monotonic();
    if (L->kill_at > 0 && L->running > 0)
        t = L->kill_at - n;
    if (L->drain_until > 0 && (t < 0 || L->drain_until - n < t))
        t = L->drain_until - n;
    if (t < 0 && (L->kill_at > 0 || L->drain_until > 0))
        return 0;
    return t < 0 ? -1 : (int)(t * 1000) + 1;
}

static void kill_stragglers(struct launch *L)
{
    for (int i = 0; i < L->nproc; i++) {
        struct rank *r = &L->ranks[i];
        if (!r->running)
            continue;
        fprintf(stderr, PROG ": rank %d (pid %d) did not stop within %g s; sending SIGKILL\n",
                r->global, (int)r->pid, L->signo ? SIGNAL_GRACE : TERM_GRACE);
        launch_signal_rank(r, SIGKILL);
    }
    L->kill_at = -1;   /* done: never again */
}

void launch_watch(struct launch *L)
{
    struct pollfd *pf = calloc((size_t)L->nproc * 2 + 1, sizeof *pf);
    struct linebuf **bufs = calloc((size_t)L->nproc * 2 + 1, sizeof *bufs);
    struct rank **owners = calloc((size_t)L->nproc * 2 + 1, sizeof *owners);
    if (pf == NULL || bufs == NULL || owners == NULL)
        abort();
    while (L->running > 0 || (any_open(L) && dp_clock_monotonic() < L->drain_until)) {
        int n = 1, r;
        pf[0] = (struct pollfd){ launch_sig_pipe[0], POLLIN, 0 };
        for (int i = 0; i < L->nproc; i++) {
            struct linebuf *two[2] = { &L->ranks[i].out, &L->ranks[i].err };
            for (int k = 0; k < 2; k++)
                if (two[k]->fd >= 0) {
                    pf[n] = (struct pollfd){ two[k]->fd, POLLIN, 0 };
                    bufs[n] = two[k];
                    owners[n++] = &L->ranks[i];
                }
        }
        r = poll(pf, (nfds_t)n, poll_timeout(L));
        if (r > 0) {
            for (int i = 1; i < n; i++)
                if (pf[i].revents)
                    launch_pump(L, owners[i], bufs[i]);
            if (pf[0].revents)
                launch_handle_signals(L);
        }
        if (L->kill_at > 0 && dp_clock_monotonic() >= L->kill_at && L->running > 0)
            kill_stragglers(L);
    }
    free(pf);
    free(bufs);
    free(owners);
}

/* ======================================================================== */
/* the report                                                                */
/* ======================================================================== */

static int exit_code(int status)
{
    if (WIFSIGNALED(status))
        return 128 + WTERMSIG(status);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

void launch_report_failure(const struct launch *L)
{
    const struct rank *r = &L->ranks[L->failed];
    if (WIFSIGNALED(r->status))
        fprintf(stderr, PROG ": rank %d (pid %d) was killed by signal %s\n", r->global, (int)r->pid,
                dp_signal_name(WTERMSIG(r->status)));
    else
        fprintf(stderr, PROG ": rank %d (pid %d) exited with status %d\n", r->global, (int)r->pid,
                WEXITSTATUS(r->status));
    if (r->tail_count == 0) {
        fprintf(stderr, PROG ": rank %d wrote nothing to stderr\n", r->global);
        return;
    }
    fprintf(stderr, PROG ": the last %d line%s of rank %d's stderr:\n", r->tail_count,
            r->tail_count == 1 ? "" : "s", r->global);
    for (int k = 0; k < r->tail_count; k++) {
        int idx = (r->tail_next - r->tail_count + k + TAIL_LINES) % TAIL_LINES;
        fprintf(stderr, "  [%d]: %s\n", r->global, r->tail[idx]);
    }
}

/* What the ranks of one start hold: their pipes, buffers and kept lines. */
static void close_ranks(struct launch *L)
{
    for (int i = 0; i < L->nranks; i++) {
        struct rank *r = &L->ranks[i];
        if (r->out.fd >= 0)
            close(r->out.fd);
        if (r->err.fd >= 0)
            close(r->err.fd);
        free(r->out.buf);
        free(r->err.buf);
        for (int k = 0; k < TAIL_LINES; k++)
            free(r->tail[k]);
        for (size_t k = 0; k < r->nkept; k++)
            free(r->kept[k].text);
        free(r->kept);
        free(r->reply);
        if (r->cmd >= 0)
            close(r->cmd);
    }
}

/* --max_restarts: after a failure, the next start of every rank, on a new
 * port with a new token (the old store may linger in TIME_WAIT, and a
 * rank of the old start must not join the new one). Returns 0 when the
 * job starts again. */
static int next_start(struct launch *L)
{
    if (L->signo || L->failed < 0 || L->repl || L->restart >= L->max_restarts)
        return -1;
    launch_report_failure(L);
    close_ranks(L);
    memset(L->ranks, 0, (size_t)L->nranks * sizeof *L->ranks);
    L->restart++;
    L->failed = -1;
    L->running = 0;
    L->kill_at = L->drain_until = 0;
    if (!L->port_set && (L->port = free_port()) < 0) {
        fprintf(stderr, PROG ": cannot find a free port: %s\n", strerror(errno));
        return -1;
    }
    if (make_token(L) != GO_ON)
        return -1;
    fprintf(stderr, PROG ": restarting every rank (restart %d of %d)\n", L->restart, L->max_restarts);
    return 0;
}

/* ======================================================================== */
/* main                                                                      */
/* ======================================================================== */

/* argv of each rank: the program's name, then what follows the flags. */
static char **child_argv(const struct launch *L)
{
    char **argv = calloc((size_t)L->child_argc + 2, sizeof *argv);
    if (argv == NULL)
        return NULL;
    argv[0] = L->argv0;
    for (int i = 0; i < L->child_argc; i++)
        argv[i + 1] = L->child_argv[i];
    return argv;
}

static int start_all(struct launch *L, char **argv)
{
    for (int i = 0; i < L->nranks; i++) {   /* past nproc: the other nodes' ranks, on node 0 */
        struct rank *r = &L->ranks[i];
        r->local = i % L->nproc;
        r->global = L->node_rank * L->nproc + i;
        r->out.fd = r->err.fd = r->cmd = -1;
    }
    for (int i = 0; i < L->nproc; i++) {
        struct rank *r = &L->ranks[i];
        if (start_rank(L, r, argv) != 0) {
            fprintf(stderr, PROG ": cannot start rank %d: %s\n", r->global, strerror(errno));
            return -1;
        }
    }
    return 0;
}

int dp_launch_main(int argc, char **argv)
{
    struct launch L;
    char **cargv;
    int st;
    memset(&L, 0, sizeof L);
    L.nnodes = 1;
    L.failed = -1;
    L.argv0 = argv[0];
    if (argc < 2 || find_flag(argv[1]) < 0)
        return usage("launcher flags come first: '%s' is before %s", argc > 1 ? argv[1] : "",
                     "the launcher flag");
    if ((st = parse_args(&L, argc, argv)) != GO_ON || (st = settle(&L)) != GO_ON)
        return st;
    L.repl = launch_repl_wanted(&L);
    if ((st = settle_repl_port(&L)) != GO_ON)
        return st;
    L.nranks = L.repl && L.nnodes > 1 && L.node_rank == 0 ? L.nproc * L.nnodes : L.nproc;
    L.ranks = calloc((size_t)L.nranks, sizeof *L.ranks);
    cargv = child_argv(&L);
    if (L.ranks == NULL || cargv == NULL || install_signals() != 0) {
        fprintf(stderr, PROG ": cannot start the launcher: %s\n", strerror(errno));
        free(L.ranks);
        free(cargv);
        return 1;
    }
    if (L.repl && L.nnodes > 1 && relay_open(&L) != 0) {   /* before the ranks: they get the token */
        relay_close(&L);
        free(L.ranks);
        free(cargv);
        return L.signo ? 128 + L.signo : 1;
    }
    do {
        if (start_all(&L, cargv) != 0) {
            L.failed = -2;
            launch_stop_others(&L, TERM_GRACE);
        } else if (L.repl && L.node_rank > 0) {
            relay_serve(&L);   /* node 0's REPL drives our ranks */
        } else if (L.repl) {
            launch_repl(&L);   /* until its input ends or a rank ends it */
        }
        launch_watch(&L);
    } while (next_start(&L) == 0);
    relay_close(&L);
    if (L.signo)
        st = 128 + L.signo;
    else if (L.failed == -2 || L.failed == -3)   /* said when it happened */
        st = 1;
    else if (L.failed >= 0) {
        launch_report_failure(&L);
        st = exit_code(L.ranks[L.failed].status);
        if (st == 0)   /* a rank that left the REPL early */
            st = 1;
    } else
        st = 0;
    close_ranks(&L);
    free(L.ranks);
    free(cargv);
    return st;
}
