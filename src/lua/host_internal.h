/*
 * host_internal.h — what the Lua host's files share (host.c runs scripts,
 * repl.c is the REPL, call.c makes protected calls); not part of any API.
 */
#ifndef DPLUA_HOST_INTERNAL_H
#define DPLUA_HOST_INTERNAL_H

#include <signal.h>

#include <lua.h>

#define PROGNAME "dplua"

/* Ctrl-C (call.c): at the REPL prompt, with no Lua running, a Ctrl-C only
 * sets host_sigint_at_prompt; host_sigint_in_repl keeps the handler
 * installed between calls and asks for three Ctrl-Cs to quit;
 * host_sigint_newline ends the terminal's "^C" line first. */
extern volatile sig_atomic_t host_sigint_at_prompt;
extern volatile sig_atomic_t host_sigint_in_repl;
extern volatile sig_atomic_t host_sigint_newline;
void host_on_sigint(int sig);
void host_set_sigint(void (*handler)(int));

/* The message handler of host_docall: the error as a string, with a traceback. */
int host_msghandler(lua_State *L);
/* lua_pcall of the function under its nargs arguments, with a traceback
 * (or `handler`) and Ctrl-C handling. */
int host_docall(lua_State *L, int nargs, int nresults);
int host_docall_with(lua_State *L, int nargs, int nresults, lua_CFunction handler);
/* When status is an error: prints "dplua: message" and pops it. Returns status. */
int host_report(lua_State *L, int status);

/* host.c: the REPL's environment after `-i script.lua`: a registry
 * reference of a table of the script's top-level locals over _G, or
 * LUA_NOREF when there are none. */
int host_locals_env(lua_State *L);

/* repl.c: under the launcher's distributed REPL, take its socket from
 * stdin (before anything reads stdin); then host_repl serves it, or runs
 * the terminal's REPL. */
void host_take_repl_socket(void);
void host_repl(lua_State *L);

#endif /* DPLUA_HOST_INTERNAL_H */
