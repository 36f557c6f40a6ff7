/*
 * host.c — the Lua side of the dplua program.
 *
 * Builds the Lua state, puts the dplua library on package.path, sets `arg`,
 * and runs -e chunks, a script, stdin or the REPL. It follows LuaJIT's own
 * luajit.c wherever a script could tell the difference (`arg`, `...`, chunk
 * names, error messages), so that a script behaves the same under `luajit`
 * and `dplua`. Every Lua call that can fail runs inside lua_cpcall or
 * lua_pcall: nothing a script does can take the host down with it.
 *
 * The REPL is repl.c, Ctrl-C and the protected calls call.c.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <locale.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/select.h>
#include <unistd.h>
#include <wchar.h>

#include <lua.h>
#include <lauxlib.h>
#include <lualib.h>
#include <luajit.h>

#include "host.h"
#include "host_internal.h"
#include "dplua_internal.h"

#ifndef PACKAGE_VERSION
#define PACKAGE_VERSION "unknown"
#endif

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
            status = host_docall(L, 0, 0);
        if (host_report(L, status) != 0)
            return 1;
    }
    return 0;
}

/* ------------------------------------------------------------------------ */
/* dplua -i script.lua: the script's top-level locals                        */
/* ------------------------------------------------------------------------ */

/* Under -i the REPL continues from the script's top-level locals, by their
 * values when the main chunk ended (returned, or raised an error). A
 * return or call hook would see that moment, but any such hook keeps
 * LuaJIT from running compiled code, so the script would run slowly.
 * Instead the script's source gets two additions that keep its line
 * numbers: line 1 starts with `local __dplua_end__ = <a C function>;`
 * (taken from the registry before any script code runs, so no name of the
 * script can shadow it), and a last line calls it. That call reads the
 * locals of its caller. A script that cannot take the last line (it ends
 * in a top-level `return`, or is bytecode) loads as it is, and its locals
 * are seen only when it fails: the error handler reads them from the
 * main chunk's frame, which is still on the stack. */
#define SCRIPT_END "__dplua_end__"
#define LOCALS_KEY "dplua.script_locals"   /* registry: name -> value */
#define CHUNK_KEY "dplua.script_chunk"     /* registry: the main chunk */

/* Copy the active locals of the frame ar into the table LOCALS_KEY; a
 * later local of the same name shadows an earlier one, as in the source. */
static void keep_locals(lua_State *L, lua_Debug *ar)
{
    const char *name;
    lua_getfield(L, LUA_REGISTRYINDEX, LOCALS_KEY);
    for (int i = 1; (name = lua_getlocal(L, ar, i)) != NULL; i++) {
        if (name[0] == '(' || strcmp(name, SCRIPT_END) == 0 || !lua_istable(L, -2)) {
            lua_pop(L, 1);   /* a temporary ("(for index)"), or ours */
            continue;
        }
        lua_setfield(L, -2, name);
    }
    lua_pop(L, 1);
}

/* The call on the script's last line: its caller is the main chunk. */
static int script_end(lua_State *L)
{
    lua_Debug ar;
    if (lua_getstack(L, 1, &ar))
        keep_locals(L, &ar);
    return 0;
}

/* The message handler of a script run under -i: the locals of the main
 * chunk's frame (the one running the function CHUNK_KEY), then the usual
 * message and traceback. */
static int script_msghandler(lua_State *L)
{
    lua_Debug ar;
    lua_getfield(L, LUA_REGISTRYINDEX, CHUNK_KEY);
    for (int level = 1; lua_getstack(L, level, &ar); level++) {
        int found;
        lua_getinfo(L, "f", &ar);
        found = lua_rawequal(L, -1, -2);
        lua_pop(L, 1);
        if (found) {
            keep_locals(L, &ar);
            break;
        }
    }
    lua_pop(L, 1);
    return host_msghandler(L);
}

/* Load the file with the two additions, or leave the stack as it was and
 * return -1 (the caller then loads it as it is). */
static int load_script_with_end(lua_State *L, const char *fname)
{
    static const char head[] = "local " SCRIPT_END " = debug.getregistry()[\"" SCRIPT_END "\"]; ";
    static const char tail[] = "\n" SCRIPT_END "()\n";
    luaL_Buffer b;
    char chunkname[PATH_MAX + 1];
    size_t n;
    int c, status;
    FILE *f = fopen(fname, "rb");
    if (f == NULL)
        return -1;
    c = getc(f);
    if (c == 0x1b) {   /* bytecode */
        fclose(f);
        return -1;
    }
    luaL_buffinit(L, &b);
    luaL_addstring(&b, head);
    if (c == '#') {    /* a #! line: dropped, its newline kept, as luaL_loadfile does */
        while ((c = getc(f)) != EOF && c != '\n')
            ;
    }
    if (c != EOF)
        luaL_addchar(&b, (char)c);
    while ((n = fread(luaL_prepbuffer(&b), 1, LUAL_BUFFERSIZE, f)) > 0)
        luaL_addsize(&b, n);
    if (ferror(f)) {
        fclose(f);
        luaL_pushresult(&b);
        lua_pop(L, 1);
        return -1;
    }
    fclose(f);
    luaL_addstring(&b, tail);
    luaL_pushresult(&b);
    snprintf(chunkname, sizeof chunkname, "@%s", fname);
    {
        size_t len;
        const char *code = lua_tolstring(L, -1, &len);
        status = luaL_loadbuffer(L, code, len, chunkname);
    }
    lua_remove(L, -2);   /* the source */
    if (status != 0) {
        lua_pop(L, 1);
        return -1;
    }
    lua_pushcfunction(L, script_end);
    lua_setfield(L, LUA_REGISTRYINDEX, SCRIPT_END);
    return 0;
}

/* Run the script (stdin for "-" or when there is none) with its arguments
 * as `...`. A missing file is a load error: "cannot open x.lua". */
static int run_script(lua_State *L, const struct host_args *a)
{
    int i, nargs = 0, status = 0;
    const char *fname = NULL;
    int keep = a->interactive && a->script < a->argc;
    if (a->script < a->argc && !a->script_stdin)
        fname = a->argv[a->script];
    if (keep) {
        lua_newtable(L);
        lua_setfield(L, LUA_REGISTRYINDEX, LOCALS_KEY);
    }
    if (!(keep && fname != NULL && load_script_with_end(L, fname) == 0))
        status = luaL_loadfile(L, fname);
    if (status == 0) {
        if (keep) {
            lua_pushvalue(L, -1);
            lua_setfield(L, LUA_REGISTRYINDEX, CHUNK_KEY);
        }
        if (a->script < a->argc)
            nargs = a->argc - a->script - 1;
        luaL_checkstack(L, nargs + LUA_MINSTACK, "too many arguments to script");
        for (i = 0; i < nargs; i++)
            lua_pushstring(L, a->argv[a->script + 1 + i]);
        status = host_docall_with(L, nargs, 0, keep ? script_msghandler : host_msghandler);
    }
    if (keep) {
        lua_pushnil(L);
        lua_setfield(L, LUA_REGISTRYINDEX, CHUNK_KEY);
        lua_pushnil(L);
        lua_setfield(L, LUA_REGISTRYINDEX, SCRIPT_END);
    }
    return host_report(L, status) != 0;
}

/* The REPL's environment after a script run under -i: a table of the
 * script's locals whose misses read _G and whose new names go to _G; or
 * LUA_NOREF (plain globals) when there are none. */
int host_locals_env(lua_State *L)
{
    lua_getfield(L, LUA_REGISTRYINDEX, LOCALS_KEY);
    if (!lua_istable(L, -1)) {
        lua_pop(L, 1);
        return LUA_NOREF;
    }
    lua_pushnil(L);
    if (lua_next(L, -2) == 0) {
        lua_pop(L, 1);
        return LUA_NOREF;
    }
    lua_pop(L, 2);   /* the key and value that lua_next pushed */
    lua_createtable(L, 0, 2);
    lua_pushvalue(L, LUA_GLOBALSINDEX);
    lua_setfield(L, -2, "__index");
    lua_pushvalue(L, LUA_GLOBALSINDEX);
    lua_setfield(L, -2, "__newindex");
    lua_setmetatable(L, -2);
    return luaL_ref(L, LUA_REGISTRYINDEX);
}

/* ------------------------------------------------------------------------ */

/* What the command line asks for, in luajit's order: -e chunks, then the
 * script, then the REPL. With -i an error does not end the run: as with
 * `python -i`, the REPL opens to inspect what the script left behind; the
 * exit status still says that the script failed. */
static int run(lua_State *L, const struct host_args *a)
{
    int have_script = a->script < a->argc;
    int status = 0;
    if (a->interactive)
        host_take_repl_socket();
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
    host_repl(L);
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
        host_report(L, status);
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
