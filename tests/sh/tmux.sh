# tests/sh/tmux.sh -- dplua in a terminal, for the tests of the REPL
# (test_repl.sh, test_dist_repl.sh). dplua runs inside a detached tmux
# session (a pseudo-terminal), keys go in with send-keys and the screen
# comes back with capture-pane. Every wait polls the screen with a time
# limit. Sourced after tap.sh, once $dplua is absolute, $tmp/tmux exists
# (tmux's private socket directory) and $home is dplua's private HOME:
#
#   . "$tap_dir/tmux.sh"
#
#   start ARGS            a new session running dplua ARGS in a
#                         $term_cols x $term_rows terminal (120x40)
#   screen                the terminal (scrollback too) into $tmp/screen
#   count TEXT            screen lines holding TEXT (fixed, or with
#                         match=-E an extended regular expression)
#   wait_for TEXT [N [S]] until N (1) screen lines hold TEXT, at most S (10) s
#   prompt_ready          the last screen line is an empty "> " prompt
#   type_line TEXT        TEXT, literally, then Enter
#   type_at_prompt TEXT   type_line once the "> " prompt is drawn
#   exited                dplua has ended (10 s); its exit status in $status
#   tx ARGS               tmux on the test's own server
#
# Also: has_libedit (yes or no: whether dplua edits lines with libedit),
# and at_exit and tap_diag as tap.sh's, for the server and the screen.

# tx ARGS...: tmux on this test's own server: its socket lives in $tmp, and
# no tmux.conf is read.
tx() { TMUX_TMPDIR="$tmp/tmux" tmux -L dplua-test -f /dev/null "$@"; }

at_exit() { tx kill-server >/dev/null 2>&1; }

has_libedit=no
"$dplua" env 2>/dev/null | grep '^build options:' | grep -qw libedit && has_libedit=yes

# tap_diag: what a failed check (tap.sh's ok) shows: the screen.
tap_diag() {
    screen
    diag screen <"$tmp/screen"
    [ -n "$status" ] && echo "# exit status: $status"
}

# start ARGS...: a new session running dplua ARGS. Sessions stay (the
# server is killed at the end), so that the server never runs out of
# sessions and exits between two tests. dplua runs under a shell that
# writes its exit status to a file: tmux's own record of it can lag. The
# shell traps SIGINT, so that Ctrl-C reaches dplua alone.
term_cols=120
term_rows=40
sessions=0
start() {
    sessions=$((sessions + 1))
    repl=repl$sessions
    status_file="$tmp/status$sessions"
    tx new-session -d -s $repl -x $term_cols -y $term_rows \
        env HOME="$home" DPLUA_LUA_PATH="$DPLUA_LUA_PATH" TERM=screen LC_ALL=C.UTF-8 \
        sh -c 'trap : INT; "$0" "$@"; echo $? >"'"$status_file"'"; exec sleep 600' "$dplua" "$@"
}

# screen: everything the terminal showed (scrollback too) into $tmp/screen,
# wrapped lines joined.
screen() { tx capture-pane -p -J -S - -t $repl >"$tmp/screen" 2>/dev/null; }

# count TEXT: how many screen lines hold the fixed string TEXT (the
# extended regular expression TEXT when match=-E).
match=-F
count() { screen; grep -c $match -e "$1" "$tmp/screen"; }

# wait_for TEXT [N [SECONDS]]: poll until at least N (1) screen lines hold
# TEXT, for at most SECONDS (10).
on_screen() { [ "$(count "$1")" -ge "$2" ]; }
wait_for() { wait_until "${3:-10}" on_screen "$1" "${2:-1}"; }

# prompt_ready: the last line on the screen is an empty "> " prompt.
prompt_ready() { screen; [ "$(grep -v '^ *$' "$tmp/screen" | tail -n 1 | sed 's/ *$//')" = ">" ]; }

# type_line TEXT: the text, literally, then Enter.
type_line() {
    tx send-keys -t $repl -l "$1"
    tx send-keys -t $repl Enter
}

# type_at_prompt TEXT: type_line once the prompt is drawn: keys typed
# before it land in the middle of it.
type_at_prompt() {
    wait_until 10 prompt_ready
    type_line "$1"
}

# exited: dplua has ended (wait up to 10 s); its exit status is then in
# $status.
exited() {
    if wait_file "$status_file" 10; then
        status=$(cat "$status_file")
    else
        status=none
        return 1
    fi
}
