#!/bin/sh
# tests/sh/test_dist_repl.sh -- the distributed REPL, `dplua
# --nproc_per_node=2 -i`, as a person uses it: in a terminal (tmux, as in
# test_repl.sh), on Gloo. Lines typed at the launcher run on both ranks:
# equal output folds to one "[0-1] ..." line, different output shows per
# rank, a collective typed at the prompt runs on both, `:on 1 ...` runs on
# one (and refuses collectives), errors and Ctrl-C return to the prompt,
# and a rank that exits or is killed ends the session with the launcher's
# message. Also `dplua -i script.lua` continuing from the script's
# top-level locals, in one process and on two ranks (stdin a pipe). Every
# wait is bounded; nothing sleeps blindly. TAP output.
#
#   sh tests/sh/test_dist_repl.sh          # from the build directory

. "$(dirname "$0")/tap.sh"

need_dplua
absolute_dplua
[ -n "$DPLUA_LUA_PATH" ] || DPLUA_LUA_PATH=$(cd "$top_srcdir" && pwd)/lua
export DPLUA_LUA_PATH
make_tmp dist-repl
home="$tmp/home"
mkdir "$home" "$tmp/tmux"

# ---------------------------------------------------------------- dplua -i script.lua (pipes)

cat >"$tmp/script.lua" <<'EOF'
#!/usr/bin/env dplua
local torch = require("dplua")
local weights = torch.ones(3) * 2
local steps = 0
for i = 1, 4 do steps = steps + i end
local function get_steps() return steps end
local rank = tonumber(os.getenv("RANK") or "0")
shared = "global"
EOF
printf '%s\n' 'print("steps=" .. steps, weights:sum():item(), shared)' \
    'steps = 100' 'print("now=" .. steps, "closure=" .. get_steps())' |
    HOME="$home" timeout 20 "$dplua" -i "$tmp/script.lua" >"$tmp/out" 2>"$tmp/err"
status=$?
[ $status -eq 0 ] && has out "steps=10	6	global" && has out "now=100	closure=10"
ok $? "dplua -i script.lua sees the script's top-level locals by their final values"

cat >"$tmp/fails.lua" <<'EOF'
local before = "kept"
error("the script fails")
EOF
printf 'print("before=" .. before)\n' | HOME="$home" timeout 20 "$dplua" -i "$tmp/fails.lua" >"$tmp/out" 2>"$tmp/err"
status=$?
[ $status -eq 1 ] && has out "before=kept" && has err "the script fails"
ok $? "a script that fails under -i shows its locals too, and the status says it failed"

printf '%s\n' 'rank' 'print("sum=" .. weights:sum():item())' |
    HOME="$home" timeout 30 "$dplua" --nproc_per_node=2 -i "$tmp/script.lua" >"$tmp/out" 2>"$tmp/err"
status=$?
[ $status -eq 0 ] && has out "[0] 0" && has out "[1] 1" && has out "[0-1] sum=6"
ok $? "dplua --nproc_per_node=2 -i script.lua: each rank continues from its own locals"

# ---------------------------------------------------------------- the terminal

if ! command -v tmux >/dev/null 2>&1; then
    for d in "the banner and the prompt" "equal values fold" "ranks show their own values" \
             "all_reduce at the prompt" ":on 1 error" "the prompt goes on" ":on refuses collectives" \
             "continuation" "Ctrl-C at >>" ":on 7" "Ctrl-C" "after Ctrl-C" "completion" "Ctrl-D" "os.exit on one rank" \
             "kill -9 of a rank"; do
        skip "$d" "tmux not installed"
    done
    done_testing
    exit 0
fi

. "$tap_dir/tmux.sh"
term_cols=150
term_rows=50

start --nproc_per_node=2 -i
wait_for "distributed REPL on 2 ranks" && wait_until 20 prompt_ready
ok $? "the banner and the prompt appear"

type_at_prompt '6 * 7'
wait_for "[0-1] 42"
ok $? "a value equal on both ranks prints once, as [0-1] 42"

type_at_prompt 'dist = torch.distributed; dist.init_process_group("gloo")'
type_at_prompt 'dist.get_rank()'
wait_for "[0] 0" && wait_for "[1] 1"
ok $? "dist.get_rank() prints per rank"

type_at_prompt 't = torch.ones(2) * (dist.get_rank() + 1); dist.all_reduce(t); print("sum=" .. t[0]:item())'
wait_for "[0-1] sum=3"
ok $? "dist.all_reduce typed at the prompt runs on both ranks (1 + 2 = 3)"

type_at_prompt ':on 1 error("bo" .. "om")'
wait_for "[1] dplua: stdin:1: boom"
ok $? ":on 1 error(...) shows the error with rank 1"
type_at_prompt 'print("still" .. "here")'
wait_for "[0-1] stillhere"
ok $? "the prompt goes on for both ranks after the error"

type_at_prompt ':on 0 dist.all_reduce(t)'
wait_for "[0] dplua: stdin:1: all_reduce: this line was typed with ':on 0'"
ok $? ":on 0 refuses a collective with a clear error"

type_at_prompt 'for i = 1, 2 do'
wait_for ">> "
type_line 'print("it" .. i * 10) end'
wait_for "[0-1] it10" && wait_for "[0-1] it20"
ok $? "an unfinished chunk continues with >> and runs on both ranks"

type_at_prompt 'for j = 1, 2 do'
wait_for ">> " 2
tx send-keys -t $repl C-c
type_at_prompt 'print("after" .. "drop" .. tostring(j))'
wait_for "[0-1] afterdropnil"
ok $? "Ctrl-C at the >> prompt drops the unfinished chunk on both ranks"

type_at_prompt ':on 7 print(1)'
wait_for ":on 7: the ranks are 0 to 1"
ok $? ":on with a rank that does not exist says which ranks there are"

type_at_prompt 'while true do end'
wait_for 'while true do end'
sleep 0.5
tx send-keys -t $repl C-c
wait_for "[0-1] dplua: interrupted!" 1 10
ok $? "Ctrl-C interrupts while true do end on both ranks"
type_at_prompt 'print("back" .. 1)'
wait_for "[0-1] back1"
ok $? "the prompt returns after Ctrl-C"

if [ $has_libedit = yes ]; then
    type_at_prompt 'completion_target = 1'
    wait_until 10 prompt_ready
    tx send-keys -t $repl -l 'completion_tar'
    tx send-keys -t $repl Tab
    wait_for "> completion_target"
    ok $? "Tab completes from rank 0's globals"
    tx send-keys -t $repl C-u
else
    skip "Tab completes from rank 0's globals" "built without libedit"
fi

wait_until 10 prompt_ready
tx send-keys -t $repl C-d
exited && [ "$status" -eq 0 ]
ok $? "Ctrl-D ends the session with status 0"

start --nproc_per_node=2 -i
wait_until 20 prompt_ready
type_at_prompt ':on 1 os.exit(3)'
wait_for "rank 1 (pid " && wait_for "exited with status 3"
exited && [ "$status" -eq 3 ]
ok $? "os.exit(3) on rank 1 ends the REPL with the launcher's message and status 3"

start --nproc_per_node=2 -i
wait_until 20 prompt_ready
type_at_prompt ':on 1 ffi = require("ffi"); ffi.cdef("int getpid(void);"); print("pid=" .. ffi.C.getpid())'
wait_for "[1] pid="
pid=$(grep -o '\[1\] pid=[0-9]*' "$tmp/screen" | head -n 1 | sed 's/.*=//')
[ -n "$pid" ] && kill -9 "$pid"
wait_for "was killed by signal SIGKILL"
exited && [ "$status" -eq 137 ]
ok $? "kill -9 of rank 1 at the prompt ends the REPL with the launcher's message"

done_testing
