/*
 * repl.c — the REPL of the dplua program (docs/PROGRAM.md describes it):
 * lines edited with libedit's readline API, completion, ?help and the echo
 * of values from lua/dplua/repl.lua, Ctrl-C through call.c's hook with the
 * REPL's own code kept out of compiled traces; and under the launcher's
 * distributed REPL, the rank's side: a server reading lines from the
 * launcher's socket (src/dist/launch_repl.c has the other end).
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

#ifdef HAVE_LIBEDIT
#include <editline/readline.h>
#endif

#include "host.h"
#include "host_internal.h"
#include "dplua_internal.h"

#ifndef PACKAGE_VERSION
#define PACKAGE_VERSION "unknown"
#endif

#define PROMPT "> "
#define CONT_PROMPT ">> "
#define HISTORY_FILE ".dplua_history"
#define HISTORY_LINES 1000

/* ------------------------------------------------------------------------ */
/* the REPL: its helpers, written in Lua                                     */
/* ------------------------------------------------------------------------ */

/* Completion, ?help and the echo of values walk tables and read Lua
 * sources, which is Lua's work: lua/dplua/repl.lua returns { complete =
 * f(text) -> sorted words, help = f(text), show = f(...) }. It reaches the
 * library only through package.loaded, so starting the REPL does not load
 * the library itself. */
/* ------------------------------------------------------------------------ */
/* the REPL: reading lines                                                   */
/* ------------------------------------------------------------------------ */

struct repl {
    int tty;                  /* stdin is a terminal: banner, prompts, history */
    int helpers;              /* registry reference of dplua.repl's table, or LUA_NOREF */
    int env;                  /* registry reference of the chunks' environment (host_locals_env), or LUA_NOREF */
    char history[PATH_MAX];   /* ~/.dplua_history, or "" for none */
    char *last;               /* the line last added to the history */
};

enum { LINE_OK, LINE_EOF, LINE_INTERRUPTED };

#ifdef HAVE_LIBEDIT
/* The launcher's prompt (host_read_line): wait() returns 0 once stdin has
 * input and non-zero to give up the line (Ctrl-C, a rank that died);
 * complete() gives rank 0's completions. NULL in the one-process REPL. */
static int (*edit_wait)(void *arg);
static char **(*edit_complete)(void *arg, const char *text);
static void *edit_arg;

static lua_State *complete_L;        /* the REPL's state, for completion */
static int complete_ref = LUA_NOREF; /* its helpers */

/* rl_getc_function: the next character, decoded from the locale's encoding
 * as libedit's own reader does. Ctrl-C at the prompt makes it end the line
 * (the REPL then drops it): libedit's readline() has no other way to give
 * up on a line. pselect() with SIGINT unblocked only while it waits closes
 * the gap between looking at the flag and blocking in read(). */
static int edit_getc(FILE *f)
{
    mbstate_t st;
    sigset_t block, old;
    (void)f;
    memset(&st, 0, sizeof st);
    sigemptyset(&block);
    sigaddset(&block, SIGINT);
    for (;;) {
        char c;
        wchar_t wc;
        size_t r;
        ssize_t n;
        fd_set in;
        int ready;
        if (edit_wait != NULL) {   /* the launcher's prompt: it watches its ranks meanwhile */
            if (edit_wait(edit_arg) != 0) {
                host_sigint_at_prompt = 1;
                return '\n';
            }
        } else {
            FD_ZERO(&in);
            FD_SET(STDIN_FILENO, &in);
            sigprocmask(SIG_BLOCK, &block, &old);
            ready = host_sigint_at_prompt ? -1 : pselect(STDIN_FILENO + 1, &in, NULL, NULL, NULL, &old);
            sigprocmask(SIG_SETMASK, &old, NULL);
            if (host_sigint_at_prompt)
                return '\n';
            if (ready < 0 && errno == EINTR)
                continue;
        }
        n = read(STDIN_FILENO, &c, 1);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return EOF;
        r = mbrtowc(&wc, &c, 1, &st);
        if (r == (size_t)-2)
            continue;                    /* the middle of a character */
        if (r == (size_t)-1) {
            memset(&st, 0, sizeof st);
            return (unsigned char)c;     /* not in the encoding: the byte as it is */
        }
        return (int)wc;
    }
}

struct completion {
    const char *text;
    int index;     /* 0: compute the matches; i > 0: fetch match i */
    char *match;   /* malloc'd, for readline to free */
};

/* Under lua_cpcall, so that no Lua error can unwind through libedit. */
static int complete_step(lua_State *L)
{
    struct completion *c = lua_touserdata(L, 1);
    lua_rawgeti(L, LUA_REGISTRYINDEX, complete_ref);
    if (c->index == 0) {
        lua_getfield(L, -1, "complete");
        lua_pushstring(L, c->text);
        lua_call(L, 1, 1);
        lua_setfield(L, -2, "matches");
        return 0;
    }
    lua_getfield(L, -1, "matches");
    lua_rawgeti(L, -1, c->index);
    if (lua_type(L, -1) == LUA_TSTRING)
        c->match = strdup(lua_tostring(L, -1));
    return 0;
}

/* rl_completion_matches' generator: match `state` of text, NULL after the
 * last. A failure in Lua means no matches, never an error. */
static char *complete_next(const char *text, int state)
{
    static int next;
    static char **remote;   /* the launcher's list, NULL-terminated */
    struct completion c;
    if (edit_complete != NULL) {
        if (state == 0) {
            for (next = 0; remote != NULL && remote[next] != NULL; next++)
                free(remote[next]);
            free(remote);
            remote = edit_complete(edit_arg, text);
            next = 0;
        }
        return remote != NULL && remote[next] != NULL ? strdup(remote[next++]) : NULL;
    }
    c.text = text;
    c.match = NULL;
    if (state == 0) {
        c.index = 0;
        next = 1;
        if (lua_cpcall(complete_L, complete_step, &c) != 0) {
            lua_pop(complete_L, 1);
            return NULL;
        }
    }
    c.index = next++;
    if (lua_cpcall(complete_L, complete_step, &c) != 0)
        lua_pop(complete_L, 1);
    return c.match;
}

/* The word before the cursor is text ("torch.nn.Li": '.' and ':' do not
 * break words); its matches replace it whole. */
static char **complete(const char *text, int start, int end)
{
    (void)start;
    (void)end;
    rl_attempted_completion_over = 1;  /* no file names when nothing matches */
    return rl_completion_matches(text, complete_next);
}

/* Everything readline() reads at its first call (libedit's rl_initialize,
 * which using_history() also runs) is set before it. */
static void edit_open(lua_State *L, struct repl *r)
{
    static char word_breaks[] = " \t\n\"\\'`@$><=;|&{()}[],+-*/%^#~";
    const char *home = getenv("HOME");
    int n = -1;
    (void)setlocale(LC_CTYPE, "");  /* for multibyte characters in lines */
    rl_readline_name = PROGNAME;    /* for ~/.editrc */
    rl_getc_function = edit_getc;
    rl_completer_word_break_characters = word_breaks;
    rl_basic_word_break_characters = word_breaks;
    rl_completion_append_character = '\0';
    if (r->helpers != LUA_NOREF) {
        complete_L = L;
        complete_ref = r->helpers;
    }
    if (r->helpers != LUA_NOREF || edit_complete != NULL)
        rl_attempted_completion_function = complete;
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

/* Save the history now, so that os.exit() or a kill loses nothing. A file
 * that cannot be written is reported once and then left alone. */
static void save_history(struct repl *r)
{
    if (r->history[0] == '\0' || write_history(r->history) == 0)
        return;
    fprintf(stderr, PROGNAME ": warning: cannot write history to %s; history is not saved\n",
            r->history);
    r->history[0] = '\0';
}

/* Add a line to the history unless it is blank or repeats the last one. */
static void remember(struct repl *r, const char *line)
{
    if (line[strspn(line, " \t")] == '\0' || (r->last != NULL && strcmp(r->last, line) == 0))
        return;
    free(r->last);
    r->last = strdup(line);
    add_history(line);
    save_history(r);
}
#endif

/* The next line, without its newline, in *out (to be freed). Prompts only
 * go to a terminal, so that piped input gives clean output. */
static int read_line(struct repl *r, const char *prompt, char **out)
{
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    host_sigint_at_prompt = 0;
#ifdef HAVE_LIBEDIT
    if (r->tty) {
        line = readline(prompt);
        if (host_sigint_at_prompt) {
            free(line);
            return LINE_INTERRUPTED;
        }
        if (line == NULL)
            return LINE_EOF;
        remember(r, line);
        *out = line;
        return LINE_OK;
    }
#endif
    if (r->tty) {
        fputs(prompt, stdout);
        fflush(stdout);
    }
    n = getline(&line, &cap, stdin);
    if (n < 0 || host_sigint_at_prompt) {
        free(line);
        if (!host_sigint_at_prompt)
            return LINE_EOF;
        clearerr(stdin);  /* getline stopped at EINTR */
        if (r->tty)
            putchar('\n');
        return LINE_INTERRUPTED;
    }
    if (n > 0 && line[n - 1] == '\n')
        line[n - 1] = '\0';
    *out = line;
    return LINE_OK;
}

/* Push the next line as a Lua string (only for LINE_OK). */
static int push_line(lua_State *L, struct repl *r, const char *prompt)
{
    char *line = NULL;
    int got = read_line(r, prompt, &line);
    if (got != LINE_OK)
        return got;
    lua_pushstring(L, line);
    free(line);
    return LINE_OK;
}

/* ------------------------------------------------------------------------ */
/* the REPL: compiling chunks                                                */
/* ------------------------------------------------------------------------ */

#define REPL_EOF (-1)      /* end of input */
#define REPL_NOTHING (-2)  /* Ctrl-C at a prompt dropped the chunk */
#define REPL_HELP (-3)     /* "?name": the name is on top */

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
 * message and returns the load status, or REPL_NOTHING (nothing left on
 * the stack) when Ctrl-C drops the chunk. */
static int load_statements(lua_State *L, struct repl *r)
{
    for (;;) {
        size_t len;
        const char *code = lua_tolstring(L, -1, &len);
        int status = luaL_loadbuffer(L, code, len, "=stdin");
        int got = LINE_EOF;
        if (incomplete(L, status))
            got = push_line(L, r, CONT_PROMPT);
        if (got == LINE_INTERRUPTED) {
            lua_pop(L, 2);  /* the "<eof>" error and the code */
            return REPL_NOTHING;
        }
        if (got != LINE_OK) {
            lua_remove(L, -2);  /* the code */
            return status;
        }
        lua_remove(L, -2);      /* the "<eof>" error; code and new line remain */
        lua_pushliteral(L, "\n");
        lua_insert(L, -2);
        lua_concat(L, 3);
    }
}

/* Read and compile the next chunk. Returns REPL_EOF, REPL_NOTHING,
 * REPL_HELP, or the load status with the function or the error message on
 * top. */
static int repl_load(lua_State *L, struct repl *r)
{
    const char *line;
    int got = push_line(L, r, PROMPT);
    if (got != LINE_OK)
        return got == LINE_EOF ? REPL_EOF : REPL_NOTHING;
    line = lua_tostring(L, -1);
    if (line[strspn(line, " \t")] == '?') {  /* ?name */
        lua_pushstring(L, strchr(line, '?') + 1);
        lua_remove(L, -2);
        return REPL_HELP;
    }
    if (line[0] == '=') {  /* Lua 5.1's "=expr" */
        lua_pushstring(L, line + 1);
        lua_remove(L, -2);
    }
    if (load_expression(L))
        return 0;
    return load_statements(L, r);
}

/* ------------------------------------------------------------------------ */
/* the REPL: running chunks                                                  */
/* ------------------------------------------------------------------------ */

/* Push the helper `name` (a function), or the global `fallback`. */
static void push_helper(lua_State *L, const struct repl *r, const char *name, const char *fallback)
{
    if (r->helpers != LUA_NOREF) {
        lua_rawgeti(L, LUA_REGISTRYINDEX, r->helpers);
        lua_getfield(L, -1, name);
        lua_remove(L, -2);
    } else {
        lua_getglobal(L, fallback);
    }
}

/* Print the values above base (dplua.repl's show: through the global print,
 * so that __tostring applies, and with a shape/dtype/device line under a
 * tensor). Under host_docall, so that Ctrl-C stops printing a huge value. */
static void print_results(lua_State *L, const struct repl *r, int base)
{
    int n = lua_gettop(L) - base;
    if (n <= 0)
        return;
    luaL_checkstack(L, LUA_MINSTACK, "too many results to print");
    push_helper(L, r, "show", "print");
    lua_insert(L, base + 1);
    host_report(L, host_docall(L, n, 0));
}

/* ?name: the name is on top. */
static void print_help(lua_State *L, const struct repl *r)
{
    if (r->helpers == LUA_NOREF) {
        fprintf(stderr, PROGNAME ": help is not available (the REPL's helpers failed to load)\n");
        lua_pop(L, 1);
        return;
    }
    push_helper(L, r, "help", "print");
    lua_insert(L, -2);
    host_report(L, host_docall(L, 1, 0));
}

/* Code typed at the REPL runs in LuaJIT's interpreter, functions it defines
 * included: the interpreter looks at the Ctrl-C hook, compiled traces do
 * not, and a trace that would enter or return to such code stops there.
 * The library and scripts (dplua -i script.lua) stay compiled. */
static void interpret_only(lua_State *L)
{
    (void)luaJIT_setmode(L, -1, LUAJIT_MODE_ALLFUNC | LUAJIT_MODE_OFF);
}

/* The helpers' table as a registry reference, or LUA_NOREF (reported) if
 * it does not load: the REPL then works without them. */
static int load_helpers(lua_State *L)
{
    lua_getglobal(L, "require");
    lua_pushliteral(L, "dplua.repl");
    int status = lua_pcall(L, 1, 1, 0);
    if (status == 0 && lua_istable(L, -1))
        return luaL_ref(L, LUA_REGISTRYINDEX);
    fprintf(stderr, PROGNAME ": warning: the REPL's helpers did not load: %s\n",
            status != 0 ? lua_tostring(L, -1) : "not a table");
    lua_pop(L, 1);
    return LUA_NOREF;
}

/* Set field `name` of the helpers' table to the value on top (popped). */
static void set_helper_field(lua_State *L, const struct repl *r, const char *name)
{
    if (r->helpers == LUA_NOREF) {
        lua_pop(L, 1);
        return;
    }
    lua_rawgeti(L, LUA_REGISTRYINDEX, r->helpers);
    lua_insert(L, -2);
    lua_setfield(L, -2, name);
    lua_pop(L, 1);
}

/* tty: the REPL owns the terminal (banner, prompts, line editing); a REPL
 * server (repl_serve) has none. */
static void repl_open(lua_State *L, struct repl *r, int tty)
{
    r->tty = tty;
    r->history[0] = '\0';
    r->last = NULL;
    r->helpers = load_helpers(L);
    r->env = host_locals_env(L);
    if (r->env != LUA_NOREF) {   /* completion and ?help see the script's locals */
        lua_rawgeti(L, LUA_REGISTRYINDEX, r->env);
        set_helper_field(L, r, "scope");
    }
    host_sigint_in_repl = 1;
    host_sigint_newline = tty && isatty(STDERR_FILENO);
    host_set_sigint(host_on_sigint);
    if (!r->tty)
        return;
    printf(PROGNAME " %s (%s); the global torch loads the library on first use;\n"
           "?name prints help, Tab completes, Ctrl-C interrupts, Ctrl-D exits\n",
           PACKAGE_VERSION, LUAJIT_VERSION);
#ifdef HAVE_LIBEDIT
    edit_open(L, r);
#endif
}

static void repl_close(lua_State *L, struct repl *r)
{
    host_set_sigint(SIG_DFL);
    host_sigint_in_repl = 0;
    host_sigint_newline = 0;
    if (r->helpers != LUA_NOREF)
        luaL_unref(L, LUA_REGISTRYINDEX, r->helpers);
    if (r->env != LUA_NOREF)
        luaL_unref(L, LUA_REGISTRYINDEX, r->env);
#ifdef HAVE_LIBEDIT
    complete_L = NULL;
    complete_ref = LUA_NOREF;
    free(r->last);
#endif
    if (!r->tty)
        return;
    putchar('\n');  /* end the line that Ctrl-D left after the prompt */
    fflush(stdout);
}

/* Run what repl_load or serve_load gave: help, a chunk (its values
 * printed), or an error to report. Leaves the stack at base. */
static void run_loaded(lua_State *L, const struct repl *r, int status, int base)
{
    if (status == REPL_HELP) {
        print_help(L, r);
    } else if (status == 0) {
        if (r->env != LUA_NOREF) {
            lua_rawgeti(L, LUA_REGISTRYINDEX, r->env);
            lua_setfenv(L, -2);
        }
        interpret_only(L);
        status = host_docall(L, 0, LUA_MULTRET);
        if (status == 0)
            print_results(L, r, base);
        else
            host_report(L, status);
    } else if (status != REPL_NOTHING) {
        host_report(L, status);
    }
    lua_settop(L, base);
}

static void repl_loop(lua_State *L)
{
    struct repl r;
    int status, base = lua_gettop(L);
    repl_open(L, &r, isatty(STDIN_FILENO));
    while ((status = repl_load(L, &r)) != REPL_EOF)
        run_loaded(L, &r, status, base);
    repl_close(L, &r);
}

/* ------------------------------------------------------------------------ */
/* the REPL server: one rank of the distributed REPL                         */
/* ------------------------------------------------------------------------ */

/* Under `dplua --nproc_per_node=N -i`, the launcher owns the terminal and
 * each rank serves its lines over a socket that the launcher passes as
 * stdin and names with DPLUA_REPL_SERVER=1 (docs/DISTRIBUTED.md, "The
 * distributed REPL"). The socket moves to another descriptor and stdin
 * becomes /dev/null, so that a script that reads stdin cannot eat the
 * launcher's requests. Requests are "KIND LENGTH LABEL\n" and LENGTH bytes:
 *   L  a line for every rank          P  a line for the ranks in LABEL (:on)
 *   X  drop the unfinished chunk      C  the completions of the text
 * The rank answers "R\n" when it is ready (after -e and the script), "D\n"
 * when a line is done (its output flushed before), "M\n" when the chunk is
 * unfinished, and "C N\n" and N words for completion. */
#define REPL_MORE (-4)     /* the chunk is unfinished: its code is on top */
#define REQUEST_MAX (64 << 20)

static int serve_fd = -1;

/* Take the launcher's socket from stdin when this rank is a REPL server. */
void host_take_repl_socket(void)
{
    const char *v = getenv("DPLUA_REPL_SERVER");
    int null;
    if (v == NULL || strcmp(v, "1") != 0)
        return;
    unsetenv("DPLUA_REPL_SERVER");   /* not for processes this rank starts */
    serve_fd = fcntl(STDIN_FILENO, F_DUPFD_CLOEXEC, 3);
    null = open("/dev/null", O_RDONLY);
    if (null >= 0 && null != STDIN_FILENO) {
        dup2(null, STDIN_FILENO);
        close(null);
    }
}

static int read_full(int fd, char *buf, size_t n)
{
    while (n > 0) {
        ssize_t got = read(fd, buf, n);
        if (got < 0 && errno == EINTR)
            continue;   /* a Ctrl-C that came between two lines */
        if (got <= 0)
            return -1;
        buf += got;
        n -= (size_t)got;
    }
    return 0;
}

static void write_full(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return;
        p += w;
        n -= (size_t)w;
    }
}

/* The next request: its kind, and its label and text pushed (2 strings).
 * 0, or -1 at the end of the launcher's socket. */
static int read_request(lua_State *L, int fd, char *kind)
{
    char head[512], *text;
    size_t n = 0;
    long len;
    char label[sizeof head];
    for (;;) {
        if (n + 1 >= sizeof head || read_full(fd, head + n, 1) != 0)
            return -1;
        if (head[n] == '\n')
            break;
        n++;
    }
    head[n] = '\0';
    label[0] = '\0';
    if (sscanf(head, "%c %ld %511s", kind, &len, label) < 2 || len < 0 || len > REQUEST_MAX)
        return -1;
    text = malloc((size_t)len + 1);
    if (text == NULL || read_full(fd, text, (size_t)len) != 0) {
        free(text);
        return -1;
    }
    lua_pushstring(L, label);
    lua_pushlstring(L, text, (size_t)len);
    free(text);
    return 0;
}

/* Like repl_load, for a chunk on top of the stack that came whole: "?name",
 * "=expr" and expressions only as its first line (first). */
static int serve_load(lua_State *L, int first)
{
    const char *code = lua_tostring(L, -1);
    size_t len;
    int status;
    if (first && code[strspn(code, " \t")] == '?') {
        lua_pushstring(L, strchr(code, '?') + 1);
        lua_remove(L, -2);
        return REPL_HELP;
    }
    if (first && code[0] == '=') {
        lua_pushstring(L, code + 1);
        lua_remove(L, -2);
    }
    if (first && load_expression(L))
        return 0;
    code = lua_tolstring(L, -1, &len);
    status = luaL_loadbuffer(L, code, len, "=stdin");
    if (incomplete(L, status)) {
        lua_pop(L, 1);
        return REPL_MORE;
    }
    lua_remove(L, -2);
    return status;
}

/* "C": the helpers' completions of the text on top, as the reply. */
static int serve_complete(lua_State *L)
{
    int fd = (int)lua_tointeger(L, 1);
    luaL_Buffer b;
    int n, list;
    char head[32];
    lua_getfield(L, 2, "complete");
    lua_pushvalue(L, 3);
    lua_call(L, 1, 1);
    list = lua_gettop(L);
    n = (int)lua_objlen(L, list);
    luaL_buffinit(L, &b);
    for (int i = 1; i <= n; i++) {
        lua_rawgeti(L, list, i);
        luaL_addvalue(&b);
        luaL_addchar(&b, '\n');
    }
    luaL_pushresult(&b);
    snprintf(head, sizeof head, "C %d\n", n);
    write_full(fd, head, strlen(head));
    write_full(fd, lua_tostring(L, -1), lua_objlen(L, -1));
    return 0;
}

static void reply(const char *what)
{
    fflush(stdout);   /* the line's output reaches the launcher before its end */
    fflush(stderr);
    write_full(serve_fd, what, strlen(what));
}

static void repl_serve(lua_State *L)
{
    struct repl r;
    int base = lua_gettop(L), pending = 0;
    char kind;
    repl_open(L, &r, 0);
    reply("R\n");
    while (lua_settop(L, base + pending), read_request(L, serve_fd, &kind) == 0) {
        int status;
        if (kind == 'X') {
            lua_settop(L, base);
            pending = 0;
            continue;
        }
        if (kind == 'C') {
            lua_pushcfunction(L, serve_complete);
            lua_pushinteger(L, serve_fd);
            if (r.helpers == LUA_NOREF)
                lua_newtable(L);
            else
                lua_rawgeti(L, LUA_REGISTRYINDEX, r.helpers);
            lua_pushvalue(L, -4);   /* the text */
            if (lua_pcall(L, 3, 0, 0) != 0)
                write_full(serve_fd, "C 0\n", 4);
            continue;
        }
        if (kind == 'P')   /* :on: the collectives refuse to run (dplua.distributed) */
            lua_pushvalue(L, -2);
        else
            lua_pushnil(L);
        set_helper_field(L, &r, "only");
        lua_remove(L, -2);   /* the label */
        if (pending) {       /* the chunk so far, a newline, the line */
            lua_pushliteral(L, "\n");
            lua_insert(L, -2);
            lua_concat(L, 3);
        }
        status = serve_load(L, !pending);
        if (status == REPL_MORE) {
            pending = 1;
            reply("M\n");
            continue;
        }
        pending = 0;
        run_loaded(L, &r, status, base);
        reply("D\n");
    }
    lua_pushnil(L);
    set_helper_field(L, &r, "only");
    repl_close(L, &r);
}

/* ------------------------------------------------------------------------ */
/* the entry point                                                           */
int host_read_line(const char *prompt, char **line, int (*wait)(void *arg),
                   char **(*complete)(void *arg, const char *text), void *arg)
{
#ifdef HAVE_LIBEDIT
    static struct repl r;
    static int opened;
    if (isatty(STDIN_FILENO)) {
        int got;
        edit_wait = wait;
        edit_complete = complete;
        edit_arg = arg;
        if (!opened) {
            opened = 1;
            r.tty = 1;
            r.helpers = r.env = LUA_NOREF;
            r.history[0] = '\0';
            r.last = NULL;
            edit_open(NULL, &r);
        }
        got = read_line(&r, prompt, line);
        return got == LINE_OK ? 0 : got == LINE_EOF ? -1 : 1;
    }
#endif
    return dp_launch_read_plain_line(prompt, line, wait, complete, arg);
}


void host_repl(lua_State *L)
{
    if (serve_fd >= 0)
        repl_serve(L);
    else
        repl_loop(L);
}
