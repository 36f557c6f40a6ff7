#!/bin/sh
# tests/sh/test_dist_repl_nodes.sh -- the distributed REPL on two nodes:
# two launchers on this machine (--nnodes=2, --node_rank=0 and 1, the same
# --master_addr and --master_port), two ranks each, on Gloo. Node 0's
# launcher owns the terminal (tmux, as in test_dist_repl.sh); node 1's runs
# in the background and relays its ranks: output folds across the nodes, a
# collective typed at the prompt runs on all four ranks, `:on` reaches a
# rank of node 1, its error shows with its rank, Ctrl-C interrupts every
# rank, Ctrl-D ends both launchers, and a rank killed on node 1, or node
# 1's launcher killed, ends the REPL with the launcher's message. Also,
# with stdin a pipe: the default REPL port, and the clear errors of a
# launcher whose node 0 never answers or refuses it. Every wait is
# bounded; nothing sleeps blindly. TAP output.
#
#   sh tests/sh/test_dist_repl_nodes.sh    # from the build directory

. "$(dirname "$0")/tap.sh"

need_dplua
absolute_dplua
[ -n "$DPLUA_LUA_PATH" ] || DPLUA_LUA_PATH=$(cd "$top_srcdir" && pwd)/lua
export DPLUA_LUA_PATH
make_tmp dist-repl-nodes
home="$tmp/home"
mkdir "$home" "$tmp/tmux"

# free_port: a port nothing listens on (a store on port 0 tells which).
free_port() {
    "$dplua" -e "local ffi = require('ffi'); local C = require('dplua').C
local out = ffi.new('dp_store *[1]'); assert(C.dp_store_open(out, '127.0.0.1', 0, 1, -1, 0, 'x', 0, 5) == 0)
io.write(C.dp_store_port(out[0])); C.dp_store_close(out[0])"
}

# node1 ARGS...: node 1's launcher in the background (its home is node
# 0's, as on a cluster with a shared home); its pid in $node1, its output
# in $tmp/node1.out and $tmp/node1.err.
node1() {
    env HOME="$home" "$dplua" --nnodes=2 --node_rank=1 --master_addr=127.0.0.1 "$@" \
        </dev/null >"$tmp/node1.out" 2>"$tmp/node1.err" &
    node1=$!
}

# node1_done: node 1's launcher has exited (15 s); its status in $status1.
node1_gone() { ! kill -0 "$node1" 2>/dev/null; }
node1_done() {
    status1=none
    wait_until 15 node1_gone || return 1
    wait "$node1"
    status1=$?
}

# ---------------------------------------------------------------- stdin a pipe

port=$(free_port)
node1 --master_port="$port" --nproc_per_node=2 -i
printf '%s\n' '6 * 7' 'os.getenv("GROUP_RANK")' |
    HOME="$home" timeout 60 "$dplua" --nnodes=2 --node_rank=0 --master_addr=127.0.0.1 --master_port="$port" \
        --nproc_per_node=2 -i >"$tmp/out" 2>"$tmp/err"
status=$?
node1_done
[ $status -eq 0 ] && [ "$status1" = 0 ] && has out "[0-3] 42" && has out "[0-1] 0" && has out "[2-3] 1" &&
    [ ! -s "$tmp/node1.out" ]
ok $? "two nodes, stdin a pipe: lines run on the 4 ranks, output folds across the nodes, both launchers exit 0"

port=$(free_port)
DPLUA_JOB_TOKEN=secret DPLUA_DIST_TIMEOUT=1 HOME="$home" timeout 20 "$dplua" --nnodes=2 --node_rank=1 \
    --master_port="$port" --nproc_per_node=1 -i </dev/null >"$tmp/out" 2>"$tmp/err"
status=$?
[ $status -eq 1 ] && has err "node 0's launcher did not answer at 127.0.0.1, port $((port + 1)), within 1 s"
ok $? "node 1 without node 0: a clear error after DPLUA_DIST_TIMEOUT"

DPLUA_DIST_TIMEOUT=1 HOME="$home" timeout 20 "$dplua" --nnodes=2 --node_rank=1 \
    --master_port="$port" --nproc_per_node=1 -i </dev/null >"$tmp/out" 2>"$tmp/err"
status=$?
[ $status -eq 1 ] && has err "no job token from node 0's launcher within 1 s"
ok $? "node 1 without node 0 and without DPLUA_JOB_TOKEN: no token file, a clear error"

rport=$(free_port)
DPLUA_JOB_TOKEN=one DPLUA_DIST_TIMEOUT=3 HOME="$home" timeout 20 "$dplua" --nnodes=2 --node_rank=0 \
    --master_port="$port" --repl_port="$rport" --nproc_per_node=1 -i </dev/null >"$tmp/out0" 2>"$tmp/err0" &
node0=$!
DPLUA_JOB_TOKEN=two DPLUA_DIST_TIMEOUT=3 HOME="$home" timeout 20 "$dplua" --nnodes=2 --node_rank=1 \
    --master_port="$port" --repl_port="$rport" --nproc_per_node=1 -i </dev/null >"$tmp/out" 2>"$tmp/err"
status=$?
wait $node0
status0=$?
[ $status -eq 1 ] && has err "refused this node: wrong job token" &&
    [ $status0 -eq 1 ] && has err0 "the launcher of node 1 did not connect to the REPL's port $rport within 3 s"
ok $? "another job token: node 0 refuses node 1, and says that node 1 did not come"

# ---------------------------------------------------------------- the terminal

if ! command -v tmux >/dev/null 2>&1; then
    for d in "the banner" "42 folds" "get_rank" "GROUP_RANK folds" "all_reduce" ":on 3" ":on 2 error" \
             "the prompt goes on" "Ctrl-C" "after Ctrl-C" "Ctrl-D" "kill -9 of a rank of node 1" \
             "kill -9 of node 1's launcher"; do
        skip "$d" "tmux not installed"
    done
    done_testing
    exit 0
fi

. "$tap_dir/tmux.sh"
term_cols=150
term_rows=50

# node0 PORT RPORT: node 0's launcher in a new terminal, node 1's in the
# background, two ranks each.
node0() {
    start --nnodes=2 --node_rank=0 --master_addr=127.0.0.1 --master_port="$1" --repl_port="$2" \
        --nproc_per_node=2 -i
    node1 --master_port="$1" --repl_port="$2" --nproc_per_node=2 -i
}

node0 "$(free_port)" "$(free_port)"
wait_for "distributed REPL on 4 ranks" 1 30 && wait_until 20 prompt_ready
ok $? "node 0 shows the banner for the 4 ranks of both nodes, and the prompt"

type_at_prompt '6 * 7'
wait_for "[0-3] 42"
ok $? "a value equal on every rank of both nodes prints once, as [0-3] 42"

type_at_prompt 'dist = torch.distributed; dist.init_process_group("gloo")'
type_at_prompt 'dist.get_rank()'
wait_for "[0] 0" && wait_for "[1] 1" && wait_for "[2] 2" && wait_for "[3] 3"
ok $? "dist.get_rank() prints per rank, node 1's ranks 2 and 3 included"

type_at_prompt 'print("node" .. os.getenv("GROUP_RANK"))'
wait_for "[0-1] node0" && wait_for "[2-3] node1"
ok $? "output folds by node: [0-1] node0 and [2-3] node1"

type_at_prompt 't = torch.ones(2) * (dist.get_rank() + 1); dist.all_reduce(t); print("sum=" .. t[0]:item())'
wait_for "[0-3] sum=10"
ok $? "dist.all_reduce typed at the prompt runs on the 4 ranks of both nodes (1 + 2 + 3 + 4 = 10)"

type_at_prompt ':on 3 print("on" .. dist.get_rank() .. "of node" .. os.getenv("GROUP_RANK"))'
wait_for "[3] on3of node1"
ok $? ":on 3 runs a line on rank 3 alone, on node 1"

type_at_prompt ':on 2 error("bo" .. "om")'
wait_for "[2] dplua: stdin:1: boom"
ok $? ":on 2 error(...) shows the error of node 1's rank with its rank"
type_at_prompt 'print("still" .. "here")'
wait_for "[0-3] stillhere"
ok $? "the prompt goes on for every rank after the error"

type_at_prompt 'f = io.open("'"$tmp"'/loop" .. dist.get_rank(), "w"); f:write("in"); f:close(); while true do end'
wait_file "$tmp/loop0" && wait_file "$tmp/loop1" && wait_file "$tmp/loop2" && wait_file "$tmp/loop3"
tx send-keys -t $repl C-c
wait_for "[0-3] dplua: interrupted!" 1 15
ok $? "Ctrl-C interrupts while true do end on the 4 ranks of both nodes"
type_at_prompt 'print("back" .. 1)'
wait_for "[0-3] back1"
ok $? "the prompt returns after Ctrl-C"

wait_until 10 prompt_ready
tx send-keys -t $repl C-d
exited && [ "$status" -eq 0 ] && node1_done && [ "$status1" -eq 0 ] && [ ! -s "$tmp/node1.out" ] &&
    ! grep -q "distributed REPL" "$tmp/node1.err"
ok $? "Ctrl-D on node 0 ends both launchers with status 0; node 1's printed nothing"

node0 "$(free_port)" "$(free_port)"
wait_until 30 prompt_ready
type_at_prompt ':on 3 ffi = require("ffi"); ffi.cdef("int getpid(void);"); print("pid=" .. ffi.C.getpid())'
wait_for "[3] pid="
pid=$(grep -o '\[3\] pid=[0-9]*' "$tmp/screen" | head -n 1 | sed 's/.*=//')
[ -n "$pid" ] && kill -9 "$pid"
wait_for "rank 3 (pid $pid) was killed by signal SIGKILL"
exited && [ "$status" -eq 137 ] && node1_done && [ "$status1" -eq 137 ]
ok $? "kill -9 of rank 3 on node 1 ends both launchers, node 0 with the launcher's message and status 137"

node0 "$(free_port)" "$(free_port)"
wait_until 30 prompt_ready
type_at_prompt '6 * 7'
wait_for "[0-3] 42"
kill -9 "$node1"
wait_for "lost the launcher of node 1 (ranks 2-3)"
exited && [ "$status" -eq 1 ]
ok $? "kill -9 of node 1's launcher ends the REPL on node 0 with a message that names the node"

done_testing
