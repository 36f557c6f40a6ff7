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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dplua.h"
#include "dplua_internal.h"
#include "lua/host.h"

#ifndef PACKAGE_VERSION
#define PACKAGE_VERSION "unknown"
#endif

#define PROGNAME "dplua"
#define EXIT_USAGE 2
#define PARSE_RUN (-1)  /* parse_args: go on and run Lua */

static const char usage_text[] =
    "usage: " PROGNAME " [options] [script [args...]]\n"
    "       " PROGNAME " env\n"
    "       " PROGNAME " sweep SWEEP.lua [options]\n"
    "       " PROGNAME " plot METRICS.jsonl... -o OUT.svg [options]\n"
    "       " PROGNAME " tokenize [--vocab DIR] -o OUT.bin FILE...\n"
    "       " PROGNAME " --nproc_per_node=N [launcher options] script [args...]\n"
    "\n"
    "Runs a Lua script with the dplua library, or starts a REPL.\n"
    "\n"
    "options:\n"
    "  -e CODE         run CODE; may be repeated, runs before the script\n"
    "  -i              enter the REPL after the script or -e code (after launcher\n"
    "                  options: the distributed REPL, with a line on every rank)\n"
    "  -               read the script from stdin\n"
    "  --              stop handling options; the next argument is the script\n"
    "  -v, --version   print the dplua and LuaJIT versions\n"
    "  -h, --help      print this help\n"
    "\n"
    "commands:\n"
    "  env             print versions, build options, BLAS, CUDA and the GPUs\n"
    "  sweep           run a hyperparameter sweep (dplua sweep --help)\n"
    "  plot            draw metrics JSONL files as SVG (dplua plot --help)\n"
    "  tokenize        text files to a GPT-2 token shard (dplua tokenize --help)\n"
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

/* ------------------------------------------------------------------------ */
/* the command line                                                          */
/* ------------------------------------------------------------------------ */

static int usage_error(const char *what, const char *arg)
{
    fprintf(stderr, PROGNAME ": %s '%s'\n", what, arg);
    fprintf(stderr, "Try '" PROGNAME " --help' for more information.\n");
    return EXIT_USAGE;
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
    } else if (dp_launch_is_flag(s)) {
        dp_launch_set_line_reader(host_read_line);   /* for the distributed REPL */
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

/* One "key: value" line, values aligned in one column. */
static void print_fact(const char *key, const char *value, void *ctx)
{
    int pad = 20 - (int)strlen(key);
    (void)ctx;
    printf("%s:%*s %s\n", key, pad > 0 ? pad : 0, "", value);
}

/* `dplua env`: what a bug report needs, one fact per line. It never fails
 * for a missing GPU or driver: it says what is missing and exits 0. */
static int env_command(int argc, char **argv)
{
    char dir[PATH_MAX];
    const char *opts = dp_build_options();
    if (argc > 2)
        return usage_error("env takes no arguments; got", argv[2]);
    print_fact("dplua", PACKAGE_VERSION, NULL);
    print_fact("build options", opts ? opts : "(unknown)", NULL);
    print_fact("LuaJIT", host_luajit_version(), NULL);
    print_fact("Lua library", host_find_luadir(dir, sizeof dir) == 0 ? dir : "not found (set DPLUA_LUA_PATH)",
               NULL);
    dp_env_facts(print_fact, NULL);   /* BLAS, Gloo, CUDA, the GPUs */
    return 0;
}

/* ------------------------------------------------------------------------ */
/* dplua sweep, dplua plot, dplua tokenize                                  */
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
    if (strcmp(name, "tokenize") == 0)
        return "os.exit(require(\"dplua.tokenize\").main(arg))";
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
    dp_launch_rank_setup();   /* (a rank of the launcher's; src/dist/rank.c) */
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
