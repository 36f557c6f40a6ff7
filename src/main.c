/*
 * main.c — dplua, the program.
 *
 * Parses the command line, answers --help, --version and `dplua env` itself,
 * and hands everything that runs Lua to src/lua/host.c. Exit statuses:
 * 0 success, 1 a Lua error or a script that cannot be loaded, 2 a bad
 * command line (as for most Unix tools).
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dplua.h"
#include "lua/host.h"
#include "dist/launch.h"
#ifdef DP_HAVE_CUDA
#include "dp_cuda.h"
#endif

#ifndef PACKAGE_VERSION
#define PACKAGE_VERSION "unknown"
#endif

#define PROGNAME "dplua"
#define EXIT_USAGE 2
#define PARSE_RUN (-1)  /* parse_args: go on and run Lua */

/* From OpenBLAS's cblas.h. Declared here rather than included, because
 * Debian's alternatives may point <cblas.h> at a BLAS without them. */
int openblas_get_num_threads(void);
char *openblas_get_config(void);

static const char usage_text[] =
    "usage: " PROGNAME " [options] [script [args...]]\n"
    "       " PROGNAME " env\n"
    "       " PROGNAME " sweep SWEEP.lua [options]\n"
    "       " PROGNAME " plot METRICS.jsonl... -o OUT.svg [options]\n"
    "       " PROGNAME " --nproc_per_node=N [launcher options] script [args...]\n"
    "\n"
    "Runs a Lua script with the dplua library, or starts a REPL.\n"
    "\n"
    "options:\n"
    "  -e CODE         run CODE; may be repeated, runs before the script\n"
    "  -i              enter the REPL after the script or -e code\n"
    "  -               read the script from stdin\n"
    "  --              stop handling options; the next argument is the script\n"
    "  -v, --version   print the dplua and LuaJIT versions\n"
    "  -h, --help      print this help\n"
    "\n"
    "commands:\n"
    "  env             print versions, build options, BLAS, CUDA and the GPUs\n"
    "  sweep           run a hyperparameter sweep (dplua sweep --help)\n"
    "  plot            draw metrics JSONL files as SVG (dplua plot --help)\n"
    "\n"
    "launcher options (all of them: " PROGNAME " --nproc_per_node=1 --help):\n"
    "  --nproc_per_node=N   processes (GPUs) to start on this node\n"
    "  --nnodes=N           number of nodes\n"
    "  --node_rank=R        rank of this node\n"
    "  --master_addr=HOST   address of the rank 0 node\n"
    "  --master_port=PORT   port of the rendezvous store\n"
    "  --standalone         a single node with a local rendezvous\n"
    "  --prefix-output      prefix each line of output with \"[RANK]: \"\n"
    "\n"
    "With no arguments dplua starts the REPL when stdin is a terminal and runs\n"
    "stdin otherwise. Arguments after the script are the script's: it sees them\n"
    "as arg[1..n] and as `...`. In -e code and the REPL the global `torch` is\n"
    "require(\"dplua\"), loaded on first use; scripts call require themselves.\n"
    "\n"
    "environment:\n"
    "  DPLUA_LUA_PATH  a directory holding dplua/init.lua, searched first\n"
    "\n"
    "exit status: 0 success, 1 a Lua error, 2 a bad command line.\n";

/* torchrun's flags, spelt with '_' (torchrun accepts '-' too). */
static const char *const launcher_flags[] = {
    "nproc_per_node", "nnodes", "node_rank", "master_addr", "master_port",
    "standalone", "rdzv_backend", "rdzv_endpoint", "rdzv_id", "max_restarts",
    "tee", "prefix_output",
    NULL
};

/* ------------------------------------------------------------------------ */
/* the command line                                                          */
/* ------------------------------------------------------------------------ */

static int usage_error(const char *what, const char *arg)
{
    fprintf(stderr, PROGNAME ": %s '%s'\n", what, arg);
    fprintf(stderr, "Try '" PROGNAME " --help' for more information.\n");
    return EXIT_USAGE;
}

/* "--nproc-per-node=4" is the launcher flag nproc_per_node. */
static int is_launcher_flag(const char *arg)
{
    int i;
    const char *name = arg + 2;
    size_t len = strcspn(name, "=");
    if (strncmp(arg, "--", 2) != 0)
        return 0;
    for (i = 0; launcher_flags[i] != NULL; i++) {
        const char *flag = launcher_flags[i];
        size_t k;
        if (strlen(flag) != len)
            continue;
        for (k = 0; k < len; k++)
            if (name[k] != flag[k] && !(name[k] == '-' && flag[k] == '_'))
                break;
        if (k == len)
            return 1;
    }
    return 0;
}

static void print_version(void)
{
    printf(PROGNAME " %s (%s)\n", PACKAGE_VERSION, host_luajit_version());
}

/* One option at argv[*i]; advances *i past an option argument. Returns
 * PARSE_RUN to go on, or the exit status to stop with. */
static int parse_option(int argc, char **argv, int *i, struct host_args *a)
{
    const char *s = argv[*i];
    if (strcmp(s, "-e") == 0) {
        if (*i + 1 >= argc)
            return usage_error("missing code after", s);
        a->exprs[a->nexprs++] = argv[++*i];
    } else if (strncmp(s, "-e", 2) == 0) {  /* -e'code', as luajit takes it */
        a->exprs[a->nexprs++] = s + 2;
    } else if (strcmp(s, "-i") == 0) {
        a->interactive = 1;
    } else if (strcmp(s, "-v") == 0 || strcmp(s, "--version") == 0) {
        print_version();
        return 0;
    } else if (strcmp(s, "-h") == 0 || strcmp(s, "--help") == 0) {
        fputs(usage_text, stdout);
        return 0;
    } else if (is_launcher_flag(s)) {
        return dp_launch_main(argc, argv);   /* src/dist/launch.c */
    } else {
        return usage_error("unrecognized option", s);
    }
    return PARSE_RUN;
}

/* Options come first; the first argument that is not one is the script and
 * everything after it belongs to the script, as with luajit. */
static int parse_args(int argc, char **argv, struct host_args *a)
{
    int i, dashdash = 0;
    for (i = 1; i < argc; i++) {
        const char *s = argv[i];
        int status;
        if (s[0] != '-' || s[1] == '\0')  /* a name, or "-" for stdin */
            break;
        if (strcmp(s, "--") == 0) {
            dashdash = 1;
            i++;
            break;
        }
        status = parse_option(argc, argv, &i, a);
        if (status != PARSE_RUN)
            return status;
    }
    a->script = i < argc ? i : argc;
    a->script_stdin = i < argc && !dashdash && strcmp(argv[i], "-") == 0;
    return PARSE_RUN;
}

/* ------------------------------------------------------------------------ */
/* dplua env                                                                 */
/* ------------------------------------------------------------------------ */

static void fact(const char *key, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* One "key: value" line, values aligned in one column. */
static void fact(const char *key, const char *fmt, ...)
{
    va_list ap;
    printf("%-*s ", 21, key);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    putchar('\n');
}

#ifdef DP_HAVE_CUDA
/* 13000 -> "13.0" (CUDA's major*1000 + minor*10). */
static void cuda_version_fact(const char *key, int status, int v)
{
    if (status != 0)
        fact(key, "unknown (%s)", dpc_error_string(status));
    else if (v == 0)
        fact(key, "none (no NVIDIA driver found)");
    else
        fact(key, "%d.%d", v / 1000, v % 1000 / 10);
}

/* 22809 -> "2.28.9" (major*10000 + minor*100 + patch), as NCCL and
 * cuBLASLt both count. */
static void triple_version_fact(const char *key, long v, const char *why)
{
    if (v <= 0)
        fact(key, "%s", why ? why : "unknown");
    else
        fact(key, "%ld.%ld.%ld", v / 10000, v / 100 % 100, v % 100);
}

static void gpu_facts(void)
{
    int i, n, status = dpc_device_count(&n);
    const char *visible = getenv("CUDA_VISIBLE_DEVICES");
    fact("CUDA_VISIBLE_DEVICES:", "%s", visible ? visible : "(not set)");
    if (status != 0) {
        fact("GPUs:", "0 (%s)", dpc_error_string(status));
        return;
    }
    fact("GPUs:", "%d", n);
    for (i = 0; i < n; i++) {
        struct dpc_device_info d;
        char key[32];
        snprintf(key, sizeof key, "GPU %d:", i);
        status = dpc_device_info(i, &d);
        if (status != 0)
            fact(key, "unknown (%s)", dpc_error_string(status));
        else
            fact(key, "%s, %.1f GiB, compute capability %d.%d, %d multiprocessors",
                 d.name, d.total_memory / 1073741824.0, d.major, d.minor, d.multiprocessors);
    }
}

static void cuda_facts(void)
{
    int v, status;
    const char *why = NULL;
    size_t lt;
    fact("CUDA:", "built");
    status = dpc_runtime_version(&v);
    cuda_version_fact("CUDA runtime:", status, v);
    status = dpc_driver_version(&v);
    cuda_version_fact("CUDA driver:", status, v);
    lt = dpc_cublaslt_version(&why);
    triple_version_fact("cuBLASLt:", (long)lt, why);
#ifdef DP_HAVE_NCCL
    triple_version_fact("NCCL:", dpc_nccl_version(), "unknown (ncclGetVersion failed)");
#else
    triple_version_fact("NCCL:", 0, "not built (configure found no NCCL)");
#endif
    gpu_facts();
}
#else
static void cuda_facts(void)
{
    fact("CUDA:", "not built (configure --with-cuda)");
}
#endif

/* `dplua env`: what a bug report needs, one fact per line. It never fails
 * for a missing GPU or driver: it says what is missing and exits 0. */
static int env_command(int argc, char **argv)
{
    char dir[PATH_MAX];
    const char *opts = dp_build_options();
    const char *blas = openblas_get_config();
    if (argc > 2)
        return usage_error("env takes no arguments; got", argv[2]);
    fact("dplua:", "%s", PACKAGE_VERSION);
    fact("build options:", "%s", opts ? opts : "(unknown)");
    fact("LuaJIT:", "%s", host_luajit_version());
    if (host_find_luadir(dir, sizeof dir) == 0)
        fact("Lua library:", "%s", dir);
    else
        fact("Lua library:", "not found (set DPLUA_LUA_PATH)");
    fact("OpenBLAS:", "%s", blas ? blas : "(unknown)");
    fact("OpenBLAS threads:", "%d", openblas_get_num_threads());
#ifdef DP_HAVE_GLOO
    fact("Gloo:", "yes");
#else
    fact("Gloo:", "no (CPU collectives unavailable)");
#endif
    cuda_facts();
    return 0;
}

/* ------------------------------------------------------------------------ */
/* dplua sweep, dplua plot                                                   */
/* ------------------------------------------------------------------------ */

/* Commands written in Lua: `dplua sweep ARGS` runs
 * os.exit(require("dplua.sweep").main(arg)) with arg[0] = "sweep" and the
 * command's arguments at arg[1..n], arg[-1] the program. The chunk exits
 * itself, so the host never goes on to treat "sweep" as a script. */
static const char *lua_command(const char *name)
{
    if (strcmp(name, "sweep") == 0)
        return "os.exit(require(\"dplua.sweep\").main(arg))";
    if (strcmp(name, "plot") == 0)
        return "os.exit(require(\"dplua.plot\").main(arg))";
    return NULL;
}

/* ------------------------------------------------------------------------ */
/* main                                                                      */
/* ------------------------------------------------------------------------ */

int main(int argc, char **argv)
{
    static char *no_args[] = { PROGNAME, NULL };
    struct host_args a;
    int status;
    if (argc < 1 || argv[0] == NULL) {  /* execve() with an empty argv */
        argc = 1;
        argv = no_args;
    }
    if (argc > 1 && strcmp(argv[1], "env") == 0)
        return env_command(argc, argv);
    memset(&a, 0, sizeof a);
    a.argc = argc;
    a.argv = argv;
    a.exprs = malloc((size_t)argc * sizeof *a.exprs);
    if (a.exprs == NULL) {
        fprintf(stderr, PROGNAME ": out of memory\n");
        return 1;
    }
    if (argc > 1 && lua_command(argv[1]) != NULL) {
        a.exprs[a.nexprs++] = lua_command(argv[1]);
        a.script = 1;
        status = host_main(&a);
        free(a.exprs);
        return status;
    }
    status = parse_args(argc, argv, &a);
    if (status == PARSE_RUN)
        status = host_main(&a);
    free(a.exprs);
    return status;
}
