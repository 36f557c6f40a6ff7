# tests/sh/tap.sh -- what the TAP tests in tests/sh share. Each one starts
# with
#
#   . "$(dirname "$0")/tap.sh"
#
# and then, as it needs them:
#
#   need_dplua            Bail out when there is no program at $dplua
#   absolute_dplua        make $dplua an absolute path (for tests that cd)
#   make_tmp NAME         $tmp: a new directory, removed at exit (after the
#                         test's own at_exit); without one, a SKIP of the test
#   ok STATUS DESC [FILE] one TAP line; on failure, FILE as comments, or what
#                         the last `run` wrote (tap_diag: a test may redefine it)
#   skip DESC WHY         a skipped TAP line
#   plan N, done_testing  the plan: N, or as many as there were
#   diag [LABEL]          stdin as TAP comments
#   copy_data FILE...     tests/data/FILE... into $tmp; bail out on failure
#   has FILE TEXT         $tmp/FILE holds the fixed string TEXT
#   has_re FILE RE        $tmp/FILE has a line matching the regular expression RE
#   is_out TEXT           $tmp/out is exactly TEXT
#   dp ARGS, run ARGS     the program; run keeps $tmp/out, $tmp/err, $status
#   run_in DIR ARGS       run, in the folder DIR
#   wait_until S CMD...   poll CMD until it succeeds, at most S seconds
#   wait_file FILE [S]    until FILE is there and not empty
#
# Variables: top_builddir and top_srcdir (default "."), dplua (the program),
# tap_dir (this folder, absolute), n and failed (counts of TAP lines). All
# are safe under `set -u`.

top_builddir=${top_builddir:-.}
top_srcdir=${top_srcdir:-.}
dplua="$top_builddir/dplua"
tap_dir=$(cd "$(dirname "$0")" && pwd)
tmp=
status=
n=0
failed=0

need_dplua() {
    if [ ! -x "$dplua" ]; then
        echo "Bail out! no program at $dplua (build it first)"
        exit 1
    fi
}

absolute_dplua() {
    case $dplua in /*) ;; *) dplua="$(pwd)/$dplua" ;; esac
}

# at_exit: a test's own clean-up (kill its servers); runs before $tmp goes.
at_exit() { :; }
tap_cleanup() {
    at_exit
    [ -n "$tmp" ] && rm -rf "$tmp"
}

make_tmp() {
    tmp=$(mktemp -d "${TMPDIR:-/tmp}/dplua-$1.XXXXXX") || {
        echo "1..0 # SKIP cannot make a temporary directory"
        exit 0
    }
    trap tap_cleanup EXIT
    trap 'exit 1' INT TERM
}

copy_data() {
    for _tap_file in "$@"; do
        cp "$top_srcdir/tests/data/$_tap_file" "$tmp/" || {
            echo "Bail out! cannot copy tests/data/$_tap_file"
            exit 1
        }
    done
}

# ---------------------------------------------------------------- TAP lines

# diag [LABEL]: stdin as TAP comments, "# LABEL: line" (or "# line").
diag() { sed "s/^/# ${1:+$1: }/"; }

# show FILE LABEL: FILE, when there is one, as "# LABEL: " comments cut by
# $diag_cut (a test with long outputs sets "head -40", "tail -20", ...).
diag_cut=cat
show() { [ -f "$1" ] && diag "$2" <"$1" | $diag_cut; }

# tap_diag [FILE]: what a failed check shows: FILE, or stdout, stderr and
# the exit status of the last `run`.
tap_diag() {
    if [ -n "${1:-}" ]; then
        [ -f "$1" ] && diag <"$1"
    else
        show "$tmp/out" stdout
        show "$tmp/err" stderr
        echo "# exit status: $status"
    fi
}

# ok STATUS DESC [FILE]: "ok" when STATUS is 0, else "not ok" and tap_diag.
ok() {
    n=$((n + 1))
    if [ "$1" -eq 0 ]; then
        echo "ok $n - $2"
    else
        failed=$((failed + 1))
        echo "not ok $n - $2"
        shift 2
        tap_diag "$@"
    fi
}

skip() {
    n=$((n + 1))
    echo "ok $n - $1 # SKIP $2"
}

plan() { echo "1..$1"; }
done_testing() { plan "$n"; }

# ---------------------------------------------------------------- checks

has() { grep -F -q -e "$2" "$tmp/$1"; }
has_re() { grep -q -e "$2" "$tmp/$1"; }
is_out() { [ "$(cat "$tmp/out")" = "$1" ]; }

# ---------------------------------------------------------------- running

# dp ARGS...: the program, under timeout(1) for $dp_timeout seconds when
# set, with $dp_env (NAME=VALUE) in its environment when set (env(1): an
# assignment before a shell function is not portable), and with the folder
# $dp_path first on package.path when set.
dp_timeout=
dp_env=
dp_path=
dp() {
    if [ -n "$dp_path" ]; then
        set -- -e "package.path = '$dp_path/?.lua;' .. package.path" "$@"
    fi
    set -- "$dplua" "$@"
    if [ -n "$dp_env" ]; then set -- env "$dp_env" "$@"; fi
    if [ -n "$dp_timeout" ]; then set -- timeout "$dp_timeout" "$@"; fi
    "$@"
}

# run ARGS...: dp with stdin from /dev/null; stdout, stderr and the exit
# status in $tmp/out, $tmp/err and $status.
run() {
    dp "$@" </dev/null >"$tmp/out" 2>"$tmp/err"
    status=$?
}

# run_in DIR ARGS...: run, in the folder DIR (for commands that write where
# they run).
run_in() {
    _tap_dir=$1
    shift
    (cd "$_tap_dir" && dp "$@") </dev/null >"$tmp/out" 2>"$tmp/err"
    status=$?
}

# ---------------------------------------------------------------- waiting

# wait_until SECONDS CMD...: CMD every 0.1 s until it succeeds; 1 when it
# still fails after SECONDS.
wait_until() {
    _tap_tries=$(($1 * 10))
    shift
    until "$@"; do
        [ "$_tap_tries" -gt 0 ] || return 1
        sleep 0.1
        _tap_tries=$((_tap_tries - 1))
    done
}

# wait_file FILE [SECONDS]: until FILE is there and not empty (10 s), e.g. a
# port file that a server writes and renames into place.
wait_file() { wait_until "${2:-10}" test -s "$1"; }
