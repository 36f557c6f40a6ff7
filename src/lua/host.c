/*
 * host.c — the Lua side of the dplua program.
 *
 * Builds the Lua state, puts the dplua library on package.path, sets `arg`,
 * and runs -e chunks, a script, stdin or the REPL. It follows LuaJIT's own
 * luajit.c wherever a script could tell the difference (`arg`, `...`, chunk
 * names, error messages), so that a script behaves the same under `luajit`
 * and `dplua`. Every Lua call that can fail runs inside lua_cpcall or
 * lua_pcall: nothing a script does can take the host down with it.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <lua.h>
#include <lauxlib.h>
#include <lualib.h>
#include <luajit.h>

#ifdef HAVE_LIBEDIT
#include <editline/readline.h>
#endif

#include "host.h"

#ifndef PACKAGE_VERSION
#define PACKAGE_VERSION "unknown"
#endif

#define PROGNAME "dplua"
#define PROMPT "> "
#define CONT_PROMPT ">> "
#define HISTORY_FILE ".dplua_history"
#define HISTORY_LINES 1000

/* ------------------------------------------------------------------------ */
/* errors and protected calls                                                */
/* ------------------------------------------------------------------------ */

/* The state that Ctrl-C interrupts; set before each protected call. */
static lua_State *sigint_state;

/* Runs on the next call, return or instruction after SIGINT: an error raised
 * here unwinds through lua_pcall like any other, so Ctrl-C stops a runaway
 * loop in the REPL without ending the session. */
static void stop_hook(lua_State *L, lua_Debug *ar)
{
    (void)ar;
    lua_sethook(L, NULL, 0, 0);
    luaL_error(L, "interrupted!");
}

/* A signal handler may not call into Lua; it only arms the hook. The next
 * Ctrl-C gets the default action, in case Lua never reaches the hook
 * (a long C call, or a compiled loop without exits). */
static void on_sigint(int sig)
{
    (void)signal(sig, SIG_DFL);
    lua_sethook(sigint_state, stop_hook, LUA_MASKCALL | LUA_MASKRET | LUA_MASKCOUNT, 1);
}

/* The pcall message handler: turns any error value into a string and adds a
 * traceback. luaL_traceback is the C function behind debug.traceback; calling
 * it directly keeps error reports working when a script replaces `debug`. */
static int msghandler(lua_State *L)
{
    const char *msg = lua_tostring(L, 1);
    if (msg == NULL) {
        if (luaL_callmeta(L, 1, "__tostring") && lua_isstring(L, -1))
            msg = lua_tostring(L, -1);
        else
            msg = lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
    }
    luaL_traceback(L, L, msg, 1);
    return 1;
}

/* lua_pcall with the message handler and Ctrl-C handling. The function and
 * its nargs arguments are on the stack, as for lua_pcall. */
static int docall(lua_State *L, int nargs, int nresults)
{
    int status;
    int base = lua_gettop(L) - nargs;
    lua_pushcfunction(L, msghandler);
    lua_insert(L, base);
    sigint_state = L;
    /* signal() fails only for an invalid signal number; SIGINT is valid. */
    (void)signal(SIGINT, on_sigint);
    status = lua_pcall(L, nargs, nresults, base);
    (void)signal(SIGINT, SIG_DFL);
    lua_remove(L, base);
    return status;
}

/* When status is an error, print the message on top of the stack as
 * "dplua: message" and pop it. Returns status. */
static int report(lua_State *L, int status)
{
    if (status != 0) {
        const char *msg = lua_tostring(L, -1);
        if (msg == NULL)
            msg = "(error object is not a string)";
        fflush(stdout);  /* keep the order the script printed things in */
        fprintf(stderr, PROGNAME ": %s\n", msg);
        fflush(stderr);
        lua_pop(L, 1);
    }
    return status;
}

/* ------------------------------------------------------------------------ */
/* the library search path                                                   */
/* ------------------------------------------------------------------------ */

/* A directory is the Lua library when it holds dplua/init.lua. */
static int is_luadir(const char *dir)
{
    char path[PATH_MAX];
    int n = snprintf(path, sizeof path, "%s/dplua/init.lua", dir);
    return n > 0 && (size_t)n < sizeof path && access(path, R_OK) == 0;
}

/* The directory of the running program, from /proc/self/exe so that it does
 * not depend on argv[0], PATH or symlinks to the program. */
static int exe_dir(char *buf, size_t size)
{
    char *slash;
    ssize_t n = readlink("/proc/self/exe", buf, size - 1);
    if (n <= 0 || (size_t)n >= size - 1)  /* failed, or maybe truncated */
        return -1;
    buf[n] = '\0';
    slash = strrchr(buf, '/');
    if (slash == NULL)
        return -1;
    slash[slash == buf] = '\0';  /* keep "/" for a program in the root */
    return 0;
}

/* Write dir + suffix to buf; 1 when that is the library. */
static int try_luadir(char *buf, size_t size, const char *dir, const char *suffix)
{
    int n;
    if (dir == NULL || dir[0] == '\0')
        return 0;
    n = snprintf(buf, size, "%s%s", dir, suffix);
    return n > 0 && (size_t)n < size && is_luadir(buf);
}

/* Tidy "/usr/bin/../share/lua/5.1" for package.path and `dplua env`. */
static void canonical(char *buf, size_t size)
{
    char real[PATH_MAX];
    if (realpath(buf, real) != NULL && strlen(real) < size)
        strcpy(buf, real);
}

int host_find_luadir(char *buf, size_t size)
{
    char exe[PATH_MAX];
    int have_exe = exe_dir(exe, sizeof exe) == 0;
    if (try_luadir(buf, size, getenv("DPLUA_LUA_PATH"), "") ||
        (have_exe && try_luadir(buf, size, exe, "/lua")) ||            /* build tree */
        (have_exe && try_luadir(buf, size, exe, "/../share/lua/5.1"))  /* installed */
#ifdef DPLUA_LUADIR
        || try_luadir(buf, size, DPLUA_LUADIR, "")
#endif
#ifdef DPLUA_SRC_LUADIR
        || try_luadir(buf, size, DPLUA_SRC_LUADIR, "")
#endif
    ) {
        canonical(buf, size);
        return 0;
    }
    if (size > 0)
        buf[0] = '\0';
    return -1;
}

/* Prepend the library to package.path. Without one, package.path stays as
 * LuaJIT set it, and require("dplua") lists every place it looked. */
static void set_path(lua_State *L)
{
    char dir[PATH_MAX];
    const char *env = getenv("DPLUA_LUA_PATH");
    const char *old;
    if (env != NULL && env[0] != '\0' && !is_luadir(env))
        fprintf(stderr, PROGNAME ": warning: DPLUA_LUA_PATH=%s holds no dplua/init.lua; ignored\n", env);
    if (host_find_luadir(dir, sizeof dir) != 0)
        return;
    lua_getglobal(L, "package");
    lua_getfield(L, -1, "path");
    old = lua_tostring(L, -1);
    lua_pushfstring(L, "%s/?.lua;%s/?/init.lua;%s", dir, dir, old ? old : "");
    lua_setfield(L, -3, "path");
    lua_pop(L, 2);
}

/* ------------------------------------------------------------------------ */
/* globals: arg and the lazy torch                                           */
/* ------------------------------------------------------------------------ */

/* `arg` as luajit builds it: the script at 0, its arguments at 1..n, the
 * program and its options at negative indices. Without a script everything
 * is negative. */
static void create_arg_table(lua_State *L, const struct host_args *a)
{
    int i;
    lua_createtable(L, a->argc - a->script, a->script);
    for (i = 0; i < a->argc; i++) {
        lua_pushstring(L, a->argv[i]);
        lua_rawseti(L, -2, i - a->script);
    }
    lua_setglobal(L, "arg");
}

/* __index of _G: the first read of the global `torch` requires dplua and
 * stores it as a plain global, so later reads do not come here. */
static int lazy_index(lua_State *L)
{
    const char *key = lua_type(L, 2) == LUA_TSTRING ? lua_tostring(L, 2) : NULL;
    if (key == NULL || strcmp(key, "torch") != 0)
        return 0;
    lua_getglobal(L, "require");
    lua_pushliteral(L, "dplua");
    lua_call(L, 1, 1);
    lua_pushliteral(L, "torch");
    lua_pushvalue(L, -2);
    lua_rawset(L, 1);
    return 1;
}

/* -e code and the REPL get a global `torch` without paying for the library
 * at startup (`dplua -e ''` must stay a millisecond). A _G that already has
 * a metatable (a strict-mode script) is left as it is. */
static void install_lazy_torch(lua_State *L)
{
    lua_pushvalue(L, LUA_GLOBALSINDEX);
    if (lua_getmetatable(L, -1)) {
        lua_pop(L, 2);
        return;
    }
    lua_createtable(L, 0, 1);
    lua_pushcfunction(L, lazy_index);
    lua_setfield(L, -2, "__index");
    lua_setmetatable(L, -2);
    lua_pop(L, 1);
}

/* ------------------------------------------------------------------------ */
/* running code                                                              */
/* ------------------------------------------------------------------------ */

static int run_exprs(lua_State *L, const struct host_args *a)
{
    int i, status;
    for (i = 0; i < a->nexprs; i++) {
        const char *code = a->exprs[i];
        status = luaL_loadbuffer(L, code, strlen(code), "=(command line)");
        if (status == 0)
            status = docall(L, 0, 0);
        if (report(L, status) != 0)
            return 1;
    }
    return 0;
}

/* Run the script (stdin for "-" or when there is none) with its arguments
 * as `...`. A missing file is a load error: "cannot open x.lua". */
static int run_script(lua_State *L, const struct host_args *a)
{
    int i, nargs = 0, status;
    const char *fname = NULL;
    if (a->script < a->argc && !a->script_stdin)
        fname = a->argv[a->script];
    status = luaL_loadfile(L, fname);
    if (status == 0) {
        if (a->script < a->argc)
            nargs = a->argc - a->script - 1;
        luaL_checkstack(L, nargs + LUA_MINSTACK, "too many arguments to script");
        for (i = 0; i < nargs; i++)
            lua_pushstring(L, a->argv[a->script + 1 + i]);
        status = docall(L, nargs, 0);
    }
    return report(L, status) != 0;
}

/* ------------------------------------------------------------------------ */
/* the REPL                                                                  */
/* ------------------------------------------------------------------------ */

struct repl {
    int tty;                  /* stdin is a terminal: banner, prompts, history */
    char history[PATH_MAX];   /* ~/.dplua_history, or "" for none */
};

/* One line without its newline, to be freed; NULL at the end of input.
 * Prompts only go to a terminal, so that piped input gives clean output. */
static char *read_line(const struct repl *r, const char *prompt)
{
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
#ifdef HAVE_LIBEDIT
    if (r->tty) {
        line = readline(prompt);
        if (line != NULL && line[0] != '\0')
            add_history(line);
        return line;
    }
#endif
    if (r->tty) {
        fputs(prompt, stdout);
        fflush(stdout);
    }
    n = getline(&line, &cap, stdin);
    if (n < 0) {
        free(line);
        return NULL;
    }
    if (n > 0 && line[n - 1] == '\n')
        line[n - 1] = '\0';
    return line;
}

/* Push the next line as a Lua string; 0 (nothing pushed) at end of input. */
static int push_line(lua_State *L, const struct repl *r, const char *prompt)
{
    char *line = read_line(r, prompt);
    if (line == NULL)
        return 0;
    lua_pushstring(L, line);
    free(line);
    return 1;
}

/* Replace the line on top with a function that returns its value, so that
 * `1+1` prints 2. Returns 1 on success; else leaves the line as it was.
 * Not plain "return <line>": that makes `error("x")` a tail call, and the
 * error would lose its "stdin:1:" position. Passing the values through an
 * identity function evaluates the line in the chunk's own frame; the
 * newline lets the line end in a comment. */
static int load_expression(lua_State *L)
{
    size_t len;
    const char *code;
    lua_pushliteral(L, "return (function(...) return ... end)(");
    lua_pushvalue(L, -2);
    lua_pushliteral(L, "\n)");
    lua_concat(L, 3);
    code = lua_tolstring(L, -1, &len);
    if (luaL_loadbuffer(L, code, len, "=stdin") != 0) {
        lua_pop(L, 2);  /* the error and "return <line>" */
        return 0;
    }
    lua_replace(L, -3);  /* the function takes the line's place */
    lua_pop(L, 1);
    return 1;
}

/* A syntax error "near '<eof>'" means that the chunk is unfinished: read
 * more instead of reporting it, as lua.c does. */
static int incomplete(lua_State *L, int status)
{
    static const char mark[] = "'<eof>'";
    const size_t mlen = sizeof mark - 1;
    size_t len;
    const char *msg;
    if (status != LUA_ERRSYNTAX)
        return 0;
    msg = lua_tolstring(L, -1, &len);
    return msg != NULL && len >= mlen && memcmp(msg + len - mlen, mark, mlen) == 0;
}

/* Compile the code on top as statements, reading continuation lines while
 * it is unfinished. Replaces the code with the function or the error
 * message and returns the load status. */
static int load_statements(lua_State *L, const struct repl *r)
{
    for (;;) {
        size_t len;
        const char *code = lua_tolstring(L, -1, &len);
        int status = luaL_loadbuffer(L, code, len, "=stdin");
        if (!incomplete(L, status) || !push_line(L, r, CONT_PROMPT)) {
            lua_remove(L, -2);  /* the code */
            return status;
        }
        lua_remove(L, -2);      /* the "<eof>" error; code and new line remain */
        lua_pushliteral(L, "\n");
        lua_insert(L, -2);
        lua_concat(L, 3);
    }
}

/* Read and compile the next chunk: -1 at the end of input, else the load
 * status with the function or the error message on top. */
static int repl_load(lua_State *L, const struct repl *r)
{
    const char *line;
    if (!push_line(L, r, PROMPT))
        return -1;
    line = lua_tostring(L, -1);
    if (line[0] == '=') {  /* Lua 5.1's "=expr" */
        lua_pushstring(L, line + 1);
        lua_remove(L, -2);
    }
    if (load_expression(L))
        return 0;
    return load_statements(L, r);
}

/* Print the values above base through the global print, so that anything
 * with a __tostring (tensors) prints as it would from a script. */
static void print_results(lua_State *L, int base)
{
    int n = lua_gettop(L) - base;
    if (n <= 0)
        return;
    luaL_checkstack(L, LUA_MINSTACK, "too many results to print");
    lua_getglobal(L, "print");
    lua_insert(L, base + 1);
    if (lua_pcall(L, n, 0, 0) != 0) {
        const char *msg = lua_tostring(L, -1);
        fprintf(stderr, PROGNAME ": error calling 'print' (%s)\n", msg ? msg : "?");
        lua_pop(L, 1);
    }
}

static void repl_open(struct repl *r)
{
    r->tty = isatty(STDIN_FILENO);
    r->history[0] = '\0';
    if (!r->tty)
        return;
    printf(PROGNAME " %s (%s); the global torch loads the library on first use; Ctrl-D exits\n",
           PACKAGE_VERSION, LUAJIT_VERSION);
#ifdef HAVE_LIBEDIT
    {
        const char *home = getenv("HOME");
        int n = -1;
        if (home != NULL && home[0] != '\0')
            n = snprintf(r->history, sizeof r->history, "%s/%s", home, HISTORY_FILE);
        if (n < 0 || (size_t)n >= sizeof r->history)
            r->history[0] = '\0';
        using_history();
        stifle_history(HISTORY_LINES);
        /* A first session has no history file yet: nothing to report. */
        if (r->history[0] != '\0')
            (void)read_history(r->history);
    }
#endif
}

static void repl_close(struct repl *r)
{
    if (!r->tty)
        return;
    putchar('\n');  /* end the line that Ctrl-D left after the prompt */
    fflush(stdout);
#ifdef HAVE_LIBEDIT
    if (r->history[0] != '\0' && write_history(r->history) != 0)
        fprintf(stderr, PROGNAME ": warning: cannot write history to %s\n", r->history);
#endif
}

static void repl(lua_State *L)
{
    struct repl r;
    int status, base = lua_gettop(L);
    repl_open(&r);
    while ((status = repl_load(L, &r)) != -1) {
        if (status == 0)
            status = docall(L, 0, LUA_MULTRET);
        if (status == 0)
            print_results(L, base);
        else
            report(L, status);
        lua_settop(L, base);
    }
    repl_close(&r);
}

/* ------------------------------------------------------------------------ */
/* the entry point                                                           */
/* ------------------------------------------------------------------------ */

/* What the command line asks for, in luajit's order: -e chunks, then the
 * script, then the REPL. With -i an error does not end the run: as with
 * `python -i`, the REPL opens to inspect what the script left behind; the
 * exit status still says that the script failed. */
static int run(lua_State *L, const struct host_args *a)
{
    int have_script = a->script < a->argc;
    int status = 0;
    if (a->nexprs > 0) {
        install_lazy_torch(L);
        status = run_exprs(L, a);
    }
    if (status == 0 && have_script)
        status = run_script(L, a);
    if (!a->interactive && (have_script || a->nexprs > 0))
        return status;
    if (!a->interactive && !isatty(STDIN_FILENO))
        return run_script(L, a);  /* plain `dplua < file` reads stdin */
    install_lazy_torch(L);
    repl(L);
    return status;
}

struct pmain_ctx {
    const struct host_args *args;
    int status;
};

/* Everything after creating the state runs protected, so that even an
 * out-of-memory while setting up is reported, not a crash. */
static int pmain(lua_State *L)
{
    struct pmain_ctx *c = lua_touserdata(L, 1);
    lua_settop(L, 0);
    /* Collecting while the libraries load is wasted work (luajit.c does so). */
    lua_gc(L, LUA_GCSTOP, 0);
    luaL_openlibs(L);
    lua_gc(L, LUA_GCRESTART, 0);
    set_path(L);
    create_arg_table(L, c->args);
    c->status = run(L, c->args);
    return 0;
}

int host_main(const struct host_args *a)
{
    struct pmain_ctx c;
    int status;
    lua_State *L = luaL_newstate();
    if (L == NULL) {
        fprintf(stderr, PROGNAME ": cannot create the Lua state: not enough memory\n");
        return 1;
    }
    c.args = a;
    c.status = 1;
    status = lua_cpcall(L, pmain, &c);
    if (status != 0) {
        report(L, status);
        c.status = 1;
    }
    /* Closing runs every __gc, so tensors give their memory back in order. */
    lua_close(L);
    return c.status;
}

const char *host_luajit_version(void)
{
    return LUAJIT_VERSION;
}
