/*
 * host.h — the Lua host: runs -e code, a script, stdin, or the REPL.
 *
 * src/main.c parses the command line into a host_args and hands it here;
 * this is the only place the program touches LuaJIT, so main.c needs no
 * Lua header.
 *
 *     struct host_args a = { argc, argv, exprs, nexprs, script, 0, 0 };
 *     return host_main(&a);   // the process exit status
 */
#ifndef DPLUA_HOST_H
#define DPLUA_HOST_H

#include <stddef.h>

struct host_args {
    int argc;
    char **argv;          /* the whole command line, for the global `arg` */
    const char **exprs;   /* -e chunks, run in order before the script */
    int nexprs;
    int script;           /* argv index of the script; argc when there is none */
    int script_stdin;     /* the script is "-": read it from stdin */
    int interactive;      /* -i: enter the REPL after the script */
};

/* Run what `a` asks for in a fresh Lua state. Returns the exit status:
 * 0, or 1 after an error (reported on stderr as "dplua: message"). */
int host_main(const struct host_args *a);

/* The directory that holds dplua/init.lua, searched in the order that
 * docs/PROGRAM.md gives. Writes it to buf and returns 0, or returns -1
 * when none is found (buf is then ""). */
int host_find_luadir(char *buf, size_t size);

/* The line editor for the launcher's distributed REPL (dp_line_reader in
 * src/dplua_internal.h): libedit with the REPL's history file when stdin
 * is a terminal, else the launcher's plain lines (dp_launch_read_plain_line). */
int host_read_line(const char *prompt, char **line, int (*wait)(void *arg),
                   char **(*complete)(void *arg, const char *text), void *arg);

/* LUAJIT_VERSION, e.g. "LuaJIT 2.1.0-beta3". */
const char *host_luajit_version(void);

#endif /* DPLUA_HOST_H */
