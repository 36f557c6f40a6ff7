#!/bin/sh
# tests/sh/test_program.sh -- the behaviour of the dplua program itself:
# options, arg, stdin, errors and exit statuses, `dplua env`, the REPL fed
# from a pipe. TAP output; run by `make check` with top_builddir and
# top_srcdir set (both default to ".").
#
#   sh tests/sh/test_program.sh          # from the build directory

. "$(dirname "$0")/tap.sh"

make_tmp test
need_dplua

# dp ARGS..., run ARGS... (tap.sh): the program, with $dp_env (NAME=VALUE,
# when set) in its environment; run keeps stdout, stderr and the exit status
# in $tmp/out, $tmp/err and $status. run_in INPUT ARGS...: run with INPUT
# (printf %b escapes) on stdin.
run_in() {
    input=$1
    shift
    printf '%b' "$input" | dp "$@" >"$tmp/out" 2>"$tmp/err"
    status=$?
}

tab=$(printf '\t')

# ---------------------------------------------------------------- options

run --version
[ $status -eq 0 ] && has out "dplua " && has out "LuaJIT"; ok $? "--version exits 0 and names dplua and LuaJIT"

run --help
[ $status -eq 0 ] && has out "usage:" && has out " env" && has out "--nproc_per_node"
ok $? "--help exits 0 and lists env and the launcher flags"

run -e 'print(1+1)'
[ $status -eq 0 ] && is_out 2; ok $? "-e runs code"

run -e 'x = 20' -e 'print(x + 1)'
[ $status -eq 0 ] && is_out 21; ok $? "several -e run in order"

run --bogus
[ $status -eq 2 ] && has err "--bogus" && has err "--help"; ok $? "an unknown option exits 2 with a usage hint"

run -e
[ $status -eq 2 ] && has err "-e"; ok $? "-e without code exits 2"

run --nproc_per_node=2 "$tmp/missing.lua"
[ $status -eq 1 ] && grep -E -q "rank [01] \(pid" "$tmp/err"; ok $? "a launcher flag starts the launcher, which names the failing rank"

# ---------------------------------------------------------------- scripts

cat >"$tmp/args.lua" <<'EOF'
print(arg[0], arg[1], arg[2], #arg, select("#", ...), ...)
EOF
run "$tmp/args.lua" a b
[ $status -eq 0 ] && is_out "$tmp/args.lua${tab}a${tab}b${tab}2${tab}2${tab}a${tab}b"
ok $? "a script sees arg[0], arg[1..n] and ... as luajit sets them"

run -e 'y = 1' "$tmp/args.lua" c
[ $status -eq 0 ] && is_out "$tmp/args.lua${tab}c${tab}nil${tab}1${tab}1${tab}c"
ok $? "-e before a script: the script still gets its own args"

run "$tmp/args.lua" -e --version
[ $status -eq 0 ] && is_out "$tmp/args.lua${tab}-e${tab}--version${tab}2${tab}2${tab}-e${tab}--version"
ok $? "options after the script belong to the script"

echo 'print(arg[-1]:match("dplua$") ~= nil, arg[-2])' >"$tmp/neg.lua"
run "$tmp/neg.lua"
[ $status -eq 0 ] && is_out "true${tab}nil"; ok $? "arg[-1] holds the program"

run_in 'print("from stdin", arg[0], ...)\n' - p q
[ $status -eq 0 ] && is_out "from stdin${tab}-${tab}p${tab}q"; ok $? "dplua - runs stdin with arguments"

run_in 'print("piped")\n'
[ $status -eq 0 ] && is_out "piped"; ok $? "no arguments and piped stdin: runs stdin"

printf '#!/usr/bin/env dplua\nprint("shebang")\n' >"$tmp/shebang.lua"
run "$tmp/shebang.lua"
[ $status -eq 0 ] && is_out "shebang"; ok $? "a #! first line is skipped"

run -e 'os.exit(3)'
[ $status -eq 3 ]; ok $? "os.exit(3) exits 3"

# ---------------------------------------------------------------- errors

cat >"$tmp/err.lua" <<'EOF'
local function inner()
    error("boom")
end
inner()
EOF
run "$tmp/err.lua"
[ $status -eq 1 ] && has err "dplua: $tmp/err.lua:2: boom" && has err "stack traceback" \
    && has err "err.lua:4"
ok $? "a runtime error exits 1 with file:line and a traceback"

run -e 'error({})'
[ $status -eq 1 ] && has err "error object is a table value"; ok $? "error({}) exits 1 cleanly"

run -e 'error(setmetatable({}, {__tostring = function() return "custom!" end}))'
[ $status -eq 1 ] && has err "custom!"; ok $? "an error object with __tostring is printed with it"

run -e 'error()'
[ $status -eq 1 ] && has err "nil value"; ok $? "error() with nil exits 1 cleanly"

run -e 'debug = nil; error("still reported")'
[ $status -eq 1 ] && has err "still reported" && has err "stack traceback"
ok $? "a traceback does not depend on the global debug"

run "$tmp/does-not-exist.lua"
[ $status -eq 1 ] && has err "does-not-exist.lua"; ok $? "a missing script exits 1 naming it"

run "$tmp"
[ $status -eq 1 ] && has err "$tmp"; ok $? "a directory as script exits 1 naming it"

printf 'x = = 1\n' >"$tmp/syntax.lua"
run "$tmp/syntax.lua"
[ $status -eq 1 ] && has err "syntax.lua:1:"; ok $? "a syntax error exits 1 with file:line"

run -e 'error("first")' -e 'print("second")'
[ $status -eq 1 ] && ! has out "second"; ok $? "an error in -e stops what follows"

# ---------------------------------------------------------------- library

run -e 'print(package.loaded.dplua == nil)'
[ $status -eq 0 ] && is_out "true"; ok $? "-e does not load the library until torch is used"

mkdir -p "$tmp/lib/dplua"
echo 'return { fake = "yes" }' >"$tmp/lib/dplua/init.lua"
dp_env="DPLUA_LUA_PATH=$tmp/lib"
run -e 'print(torch.fake, package.loaded.dplua == torch)'
[ $status -eq 0 ] && is_out "yes${tab}true"; ok $? "DPLUA_LUA_PATH comes first; torch loads dplua on first use"
dp_env=

dp_env="DPLUA_LUA_PATH=$tmp/nowhere"
run -e 'print(1)'
[ $status -eq 0 ] && is_out 1 && has err "DPLUA_LUA_PATH"; ok $? "a DPLUA_LUA_PATH without dplua/init.lua is ignored with a warning"
dp_env=

run -e 'require("dplua")'
[ $status -eq 0 ]; ok $? "require(\"dplua\") finds the library"

# cuBLASLt is dlopen()ed on first use: mapping it at start-up costs ~60 ms.
run -e 'for l in io.lines("/proc/self/maps") do if l:find("cublasLt", 1, true) then print(l) end end'
[ $status -eq 0 ] && is_out ""; ok $? "start-up does not load libcublasLt"

# ---------------------------------------------------------------- env

run env
[ $status -eq 0 ] && has out "CUDA" && has out "LuaJIT" && has out "OpenBLAS"
ok $? "dplua env exits 0 and reports CUDA, LuaJIT and OpenBLAS"

run env extra
[ $status -eq 2 ]; ok $? "dplua env with an argument exits 2"

# ---------------------------------------------------------------- REPL
# A pipe is not a terminal: no banner, no prompts, so stdout is just what
# the code prints. Terminal (pty) tests come later.

run_in 'x = 1 +\n 2\nprint(x)\n' -i /dev/null
[ $status -eq 0 ] && is_out 3; ok $? "REPL: an unfinished chunk continues on the next line"

run_in '1 + 1\n"a", nil, 3\n=4\n' -i
[ $status -eq 0 ] && is_out "2
a${tab}nil${tab}3
4"
ok $? "REPL: expressions print their values"

run_in 'error("oops")\nprint("after")\n' -i
[ $status -eq 0 ] && is_out "after" && has err "stdin:1: oops"; ok $? "REPL: an error is reported and the session goes on"

run_in 'for i = 1, 2 do\n' -i
[ $status -eq 0 ] && has err "<eof>"; ok $? "REPL: end of input inside a chunk reports it and exits 0"

run_in 'print(x)\n' -i -e 'x = 7'
[ $status -eq 0 ] && is_out 7; ok $? "REPL after -e sees its globals"

run_in 'print(y)\n' -i -e 'y = 8; error("late")'
[ $status -eq 1 ] && is_out 8; ok $? "-i opens the REPL after an error; the exit status keeps it"

dp_env="DPLUA_LUA_PATH=$tmp/lib"
run_in 'torch.fake\n' -i
[ $status -eq 0 ] && is_out "yes"; ok $? "REPL: torch is the library"
dp_env=

done_testing
