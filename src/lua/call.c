/*
 * call.c — protected calls for the Lua host (host.c, repl.c): Ctrl-C as a
 * debug hook armed from the SIGINT handler, lua_pcall with a traceback,
 * and "dplua: message" error reports.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <lua.h>
#include <lauxlib.h>

#include "host_internal.h"

/* ------------------------------------------------------------------------ */
/* errors and protected calls                                                */
/* ------------------------------------------------------------------------ */

/* Ctrl-C. While Lua runs under host_docall, sigint_state is the running state,
 * and each Ctrl-C arms a hook that raises "interrupted!" at the next
 * instruction that the interpreter runs. Code that LuaJIT has compiled into
 * a trace never looks at hooks, and neither does a long C call: in the REPL
 * the second Ctrl-C says so and the third ends the program; elsewhere the
 * second ends it. At the REPL prompt (no Lua running) Ctrl-C only sets
 * host_sigint_at_prompt, and the line being read is dropped. */
static lua_State *volatile sigint_state;
static volatile sig_atomic_t sigint_count;      /* Ctrl-Cs during this call */
volatile sig_atomic_t host_sigint_at_prompt;
volatile sig_atomic_t host_sigint_in_repl;   /* be patient: state is precious */
volatile sig_atomic_t host_sigint_newline;   /* end the terminal's "^C" line */

/* Runs on the next call, return or instruction after SIGINT: an error raised
 * here unwinds through lua_pcall like any other, so Ctrl-C stops a runaway
 * loop without ending the session. */
static void stop_hook(lua_State *L, lua_Debug *ar)
{
    (void)ar;
    lua_sethook(L, NULL, 0, 0);
    luaL_error(L, "interrupted!");
}

/* A signal handler may not call into Lua; it only arms the hook, as lua.c's
 * laction does (lua_sethook only stores a few fields). */
void host_on_sigint(int sig)
{
    static const char hint[] = "\n" PROGNAME ": the running code does not see Ctrl-C "
        "(a loop compiled by LuaJIT, or a long C call); press Ctrl-C again to quit\n";
    lua_State *L = sigint_state;
    if (L == NULL) {
        host_sigint_at_prompt = 1;
        return;
    }
    sigint_count++;
    if (sigint_count >= (host_sigint_in_repl ? 3 : 2)) {
        (void)signal(sig, SIG_DFL);
        (void)raise(sig);
        return;
    }
    if (sigint_count == 2 || (sigint_count == 1 && host_sigint_newline)) {
        ssize_t n = sigint_count == 2 ? write(STDERR_FILENO, hint, sizeof hint - 1)
                                      : write(STDERR_FILENO, "\n", 1);
        (void)n;
    }
    lua_sethook(L, stop_hook, LUA_MASKCALL | LUA_MASKRET | LUA_MASKCOUNT, 1);
}

/* Without SA_RESTART, so that a read at the prompt returns EINTR. */
void host_set_sigint(void (*handler)(int))
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = handler;
    sigemptyset(&sa.sa_mask);
    (void)sigaction(SIGINT, &sa, NULL);  /* fails only for a bad signal number */
}

/* The pcall message handler: turns any error value into a string and adds a
 * traceback. luaL_traceback is the C function behind debug.traceback; calling
 * it directly keeps error reports working when a script replaces `debug`. */
int host_msghandler(lua_State *L)
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
int host_docall_with(lua_State *L, int nargs, int nresults, lua_CFunction handler)
{
    int status;
    int base = lua_gettop(L) - nargs;
    lua_pushcfunction(L, handler);
    lua_insert(L, base);
    if (!host_sigint_in_repl)  /* the REPL keeps its handler all along */
        host_set_sigint(host_on_sigint);
    sigint_count = 0;
    sigint_state = L;
    status = lua_pcall(L, nargs, nresults, base);
    sigint_state = NULL;
    if (lua_gethook(L) == stop_hook)  /* a Ctrl-C that came after the last instruction */
        lua_sethook(L, NULL, 0, 0);
    if (!host_sigint_in_repl)
        host_set_sigint(SIG_DFL);
    lua_remove(L, base);
    return status;
}

int host_docall(lua_State *L, int nargs, int nresults)
{
    return host_docall_with(L, nargs, nresults, host_msghandler);
}

/* When status is an error, print the message on top of the stack as
 * "dplua: message" and pop it. Returns status. */
int host_report(lua_State *L, int status)
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

