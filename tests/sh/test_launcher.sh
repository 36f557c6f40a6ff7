#!/bin/sh
# tests/sh/test_launcher.sh -- the launcher (src/dist/launch.c):
# `dplua --nproc_per_node=N script.lua`. The env:// variables of each rank,
# output passed through whole lines at a time, --prefix-output, a failing
# rank (its status, its stderr tail, the others stopped), kill -9 of a
# rank, SIGTERM forwarded, kill -9 of the launcher (nothing the job
# started survives), the output of a rank stopped because another failed,
# two launchers forming one 2x2 job through the store, and bad flags.
# Loopback only; ports picked free at run time.
#
#   sh tests/sh/test_launcher.sh          # from the build directory

. "$(dirname "$0")/tap.sh"

make_tmp launch
need_dplua
diag_cut="head -40"     # of each output, on a failure

# dp, run (tap.sh): the launcher, bounded in time.
dp_timeout=60
# sorted_out: stdout, sorted (ranks print in any order).
sorted_out() { sort "$tmp/out"; }
# alive FILE...: whether any pid listed in the files still runs.
alive() {
    for f in "$@"; do
        pid=$(cut -d' ' -f1 "$f")
        kill -0 "$pid" 2>/dev/null && return 0
    done
    return 1
}
# wait_files N GLOB: until N files match (at most 20 s).
nfiles() { [ "$(ls $2 2>/dev/null | wc -l)" -ge "$1" ]; }
wait_files() { wait_until 20 nfiles "$1" "$2"; }

# ---------------------------------------------------------------- scripts

cat >"$tmp/env.lua" <<'EOF'
local e = os.getenv
print(string.format("rank=%s world=%s local=%s/%s group=%s master=%s:%s nvls=%s args=%s",
    e("RANK"), e("WORLD_SIZE"), e("LOCAL_RANK"), e("LOCAL_WORLD_SIZE"), e("GROUP_RANK"),
    e("MASTER_ADDR"), e("MASTER_PORT"), e("NCCL_NVLS_ENABLE"), table.concat({...}, ",")))
print("token=" .. tostring(e("DPLUA_JOB_TOKEN")))
io.stderr:write("stderr of ", e("RANK"), "\n")
EOF

# sleepy.lua DIR: writes "pid ppid" to DIR/pid.RANK, then sleeps (no
# child processes: FFI usleep).
cat >"$tmp/sleepy.lua" <<'EOF'
local ffi = require("ffi")
ffi.cdef("int usleep(unsigned); int getpid(void); int getppid(void);")
local dir = arg[1]
local f = io.open(dir .. "/pid." .. os.getenv("RANK") .. ".tmp", "w")
f:write(ffi.C.getpid(), " ", ffi.C.getppid())
f:close()
os.rename(dir .. "/pid." .. os.getenv("RANK") .. ".tmp", dir .. "/pid." .. os.getenv("RANK"))
if os.getenv("RANK") == arg[2] then
    io.stderr:write("rank ", arg[2], " is about to fail\n")
    io.stderr:write("with status 3\n")
    os.exit(3)
end
for i = 1, 600 do ffi.C.usleep(100000) end
EOF

# lines.lua N LEN: N lines of LEN bytes, written fully buffered so that the
# pipe sees them cut anywhere.
cat >"$tmp/lines.lua" <<'EOF'
io.stdout:setvbuf("full")
local r, n, len = os.getenv("RANK"), tonumber(arg[1]), tonumber(arg[2])
local body = string.rep("x", len)
for i = 1, n do io.stdout:write(r, ":", i, ":", body, "\n") end
io.stdout:write(r, ":last line without a newline")
EOF

# rdzv.lua: every rank joins through the store that rank 0 serves.
cat >"$tmp/rdzv.lua" <<'EOF'
local ffi = require("ffi")
local C = require("dplua").C
local function check(st) if st ~= 0 then error(ffi.string(C.dp_last_error()), 0) end end
local rank, world = tonumber(os.getenv("RANK")), tonumber(os.getenv("WORLD_SIZE"))
local out = ffi.new("dp_store *[1]")
check(C.dp_store_open(out, os.getenv("MASTER_ADDR"), tonumber(os.getenv("MASTER_PORT")),
                      rank == 0 and 1 or 0, rank, world, os.getenv("DPLUA_JOB_TOKEN"), 0, 20))
local s = out[0]
local mine = "rank/" .. rank
check(C.dp_store_set(s, mine, os.getenv("GROUP_RANK"), 1))
local keys = ffi.new("const char *[?]", world)
local names = {}
for r = 0, world - 1 do names[r] = "rank/" .. r; keys[r] = names[r] end
check(C.dp_store_wait(s, keys, world, 20))
local n = ffi.new("int64_t[1]")
check(C.dp_store_add(s, "done", 1, n))
print(string.format("rank %d of %d on node %s: met all", rank, world, os.getenv("GROUP_RANK")))
ffi.cdef("int usleep(unsigned);")
while rank == 0 and tonumber(n[0]) < world do   -- serve until every rank is done
    ffi.C.usleep(20000)
    check(C.dp_store_add(s, "done", 0, n))
end
C.dp_store_close(s)
EOF

# ---------------------------------------------------------------- ranks and env

run --nproc_per_node=2 "$tmp/env.lua" a b
[ $status -eq 0 ] && [ "$(grep '^rank=' "$tmp/out" | sort | cut -d' ' -f1-4)" = "rank=0 world=2 local=0/2 group=0
rank=1 world=2 local=1/2 group=0" ]
ok $? "--nproc_per_node=2: ranks 0 and 1, once each, WORLD_SIZE=2"

grep '^rank=' "$tmp/out" | grep -q -v ' master=127\.0\.0\.1:[0-9][0-9]* nvls=0 args=a,b$'
[ $? -ne 0 ]; ok $? "MASTER_ADDR 127.0.0.1, a port, NCCL_NVLS_ENABLE=0 and the script's args"

[ "$(grep '^token=' "$tmp/out" | sort -u | wc -l)" -eq 1 ] && grep -q '^token=[0-9a-f]\{32\}$' "$tmp/out"
ok $? "every rank gets the same random DPLUA_JOB_TOKEN"

has err "stderr of 0" && has err "stderr of 1" && ! has out "stderr of"
ok $? "stdout and stderr of the ranks go to stdout and stderr"

run --nproc-per-node 4 "$tmp/env.lua"
[ $status -eq 0 ] && [ "$(grep '^rank=' "$tmp/out" | sort | cut -d' ' -f1-3)" = "rank=0 world=4 local=0/4
rank=1 world=4 local=1/4
rank=2 world=4 local=2/4
rank=3 world=4 local=3/4" ]
ok $? "--nproc-per-node 4 (the other spellings): ranks 0..3 once each"

run --nproc_per_node=1 "$tmp/env.lua"
tok1=$(grep '^token=' "$tmp/out")
run --nproc_per_node=1 "$tmp/env.lua"
[ "$tok1" != "$(grep '^token=' "$tmp/out")" ]; ok $? "each job gets a new token"

NCCL_NVLS_ENABLE=1 DPLUA_JOB_TOKEN=mine timeout 60 "$dplua" --nproc_per_node=1 "$tmp/env.lua" >"$tmp/out" 2>"$tmp/err"
status=$?
has out "nvls=1" && has out "token=mine"; ok $? "NCCL_NVLS_ENABLE and DPLUA_JOB_TOKEN already set are kept"

run --nproc_per_node=2 -e 'print("from -e", os.getenv("RANK"))'
[ $status -eq 0 ] && [ "$(sorted_out)" = "from -e	0
from -e	1" ]; ok $? "dplua options after the flags go to the ranks (-e)"

# ---------------------------------------------------------------- output

run --nproc_per_node=2 --prefix-output "$tmp/env.lua"
[ $status -eq 0 ] && has out "[0]: rank=0 " && has out "[1]: rank=1 " && has err "[1]: stderr of 1" \
    && [ "$(grep -c -v '^\[[01]\]: ' "$tmp/out")" -eq 0 ]
ok $? "--prefix-output prefixes every line of stdout and stderr with [RANK]: "

run --nproc_per_node=2 --tee 3 "$tmp/env.lua"
[ $status -eq 0 ] && has out "[0]: rank=0 " && has out "[1]: token="
ok $? "--tee 3 (torchrun's spelling) prefixes too and keeps the script"

run --nproc_per_node=3 "$tmp/lines.lua" 200 3000
[ $status -eq 0 ] && [ "$(awk -F: 'NF == 3 && length($3) == 3000 && $3 ~ /^x+$/ { n++ } END { print n + 0 }' "$tmp/out")" -eq 600 ] \
    && [ "$(grep -c 'last line without a newline$' "$tmp/out")" -eq 3 ] && [ "$(wc -l <"$tmp/out")" -eq 603 ]
ok $? "600 lines of 3000 bytes from 3 ranks come out whole, never mixed mid-line"

# ---------------------------------------------------------------- failures

mkdir "$tmp/f"
start=$(date +%s)
run --nproc_per_node=3 "$tmp/sleepy.lua" "$tmp/f" 1
elapsed=$(( $(date +%s) - start ))
[ $status -eq 3 ]; ok $? "a rank that exits 3: the launcher exits 3"
pid1=$(cut -d' ' -f1 "$tmp/f/pid.1")
has err "dplua: rank 1 (pid $pid1) exited with status 3" && has err "[1]: rank 1 is about to fail" \
    && has err "[1]: with status 3"
ok $? "it names the rank and its pid, and shows the tail of its stderr"
! alive "$tmp/f"/pid.* && [ "$elapsed" -lt 10 ]; ok $? "the other ranks are stopped at once ($elapsed s)"

# signal_job NPROC DIR SIGNAL RANK FIELD: a job of NPROC sleepy ranks in
# DIR; once they all run, SIGNAL to field FIELD of the pid file of RANK
# (1: the rank, 2: its parent, the launcher). The job's status, the pid
# signalled and the seconds from the signal to the job's end go to $status,
# $target and $elapsed.
signal_job() {
    mkdir "$2"
    dp --nproc_per_node="$1" "$tmp/sleepy.lua" "$2" >"$tmp/out" 2>"$tmp/err" &
    job=$!
    wait_files "$1" "$2/pid.[0-9]"
    target=$(cut -d' ' -f"$5" "$2/pid.$4")
    start=$(date +%s)
    kill -"$3" "$target"
    wait $job
    status=$?
    elapsed=$(( $(date +%s) - start ))
}

signal_job 3 "$tmp/k" KILL 1 1
[ $status -eq 137 ] && has err "dplua: rank 1 (pid $target) was killed by signal SIGKILL"
ok $? "kill -9 of a rank: the launcher names it and exits 137"
! alive "$tmp/k"/pid.* && [ "$elapsed" -lt 10 ]; ok $? "every rank is gone within 10 s ($elapsed s)"

signal_job 2 "$tmp/t" TERM 0 2     # the launcher
[ $status -eq 143 ] && has err "got SIGTERM; passing it on to the ranks" && ! alive "$tmp/t"/pid.* \
    && [ "$elapsed" -lt 10 ]
ok $? "SIGTERM to the launcher reaches every rank; it exits 143 ($elapsed s)"

# spawner.lua DIR: each rank writes "pid ppid" to DIR/pid.RANK, then starts
# a child shell that writes its pid to DIR/child.RANK and becomes
# `sleep 1000` (os.execute: the rank waits for it).
cat >"$tmp/spawner.lua" <<'EOF2'
local dir, r = arg[1], os.getenv("RANK")
local ffi = require("ffi")
ffi.cdef("int getpid(void); int getppid(void);")
local f = io.open(dir .. "/pid." .. r, "w")
f:write(ffi.C.getpid(), " ", ffi.C.getppid())
f:close()
os.execute("sh -c 'echo $$ >" .. dir .. "/child." .. r .. ".tmp; mv " .. dir .. "/child." .. r .. ".tmp " ..
           dir .. "/child." .. r .. "; exec sleep 1000'")
EOF2
mkdir "$tmp/orphans"
timeout 60 "$dplua" --nproc_per_node=2 "$tmp/spawner.lua" "$tmp/orphans" </dev/null >/dev/null 2>&1 &
job=$!
wait_files 2 "$tmp/orphans/child.[0-9]"
launcher=$(cut -d' ' -f2 "$tmp/orphans/pid.0")
kill -9 "$launcher"
wait $job
none_alive() {
    for p; do kill -0 "$p" 2>/dev/null && return 1; done
    return 0
}
wait_until 20 none_alive $(cat "$tmp"/orphans/pid.* "$tmp"/orphans/child.* | cut -d' ' -f1)
ok $? "kill -9 of the launcher: its ranks and the sleep 1000 each started are gone within 20 s"
for p in $(cat "$tmp"/orphans/child.* "$tmp"/orphans/pid.* 2>/dev/null | cut -d' ' -f1); do
    kill -9 "$p" 2>/dev/null   # (only when the check above failed)
done

# printer.lua DIR: rank 0 prints three lines and a last one without a
# newline, then waits; rank 1 fails once rank 0 has printed.
cat >"$tmp/printer.lua" <<'EOF2'
local ffi = require("ffi")
ffi.cdef("int usleep(unsigned);")
local dir = arg[1]
if os.getenv("RANK") == "0" then
    for i = 1, 3 do print("line " .. i .. " of rank 0") end
    io.write("and no newline")
    io.open(dir .. "/printed", "w"):close()
    for _ = 1, 600 do ffi.C.usleep(100000) end
else
    while not io.open(dir .. "/printed") do ffi.C.usleep(20000) end
    os.exit(3)
end
EOF2
mkdir "$tmp/p"
run --nproc_per_node=2 "$tmp/printer.lua" "$tmp/p"
[ $status -eq 3 ] && [ "$(cat "$tmp/out")" = "line 1 of rank 0
line 2 of rank 0
line 3 of rank 0
and no newline" ]
ok $? "a rank stopped because another failed: what it printed (a pipe, line-buffered; flushed at SIGTERM) reaches the launcher's output"

run --nproc_per_node=2 "$tmp/no-such-script.lua"
[ $status -eq 1 ] && has err "exited with status 1" && has err "no-such-script.lua"
ok $? "a missing script: the ranks fail and the launcher says why"

# ---------------------------------------------------------------- two nodes

port=$("$dplua" -e "local ffi = require('ffi'); local C = require('dplua').C
local out = ffi.new('dp_store *[1]'); assert(C.dp_store_open(out, '127.0.0.1', 0, 1, -1, 0, 'x', 0, 5) == 0)
io.write(C.dp_store_port(out[0])); C.dp_store_close(out[0])")
dp --nnodes=2 --node_rank=1 --master_addr=127.0.0.1 --master_port="$port" \
    --nproc_per_node=2 "$tmp/rdzv.lua" >"$tmp/node1" 2>&1 &
node1=$!
run --nnodes=2 --node-rank 0 --master-addr 127.0.0.1 --master-port "$port" --nproc_per_node=2 "$tmp/rdzv.lua"
wait $node1
status1=$?
cat "$tmp/node1" >>"$tmp/out"
[ $status -eq 0 ] && [ $status1 -eq 0 ] && [ "$(sorted_out)" = "rank 0 of 4 on node 0: met all
rank 1 of 4 on node 0: met all
rank 2 of 4 on node 1: met all
rank 3 of 4 on node 1: met all" ]
ok $? "two launchers (--nnodes=2, node_rank 0 and 1) form one job of 4 ranks through the store"

run --nnodes=2 --node_rank=1 --master_port="$port" --nproc_per_node=1 "$tmp/env.lua"
tokA=$(grep '^token=' "$tmp/out")
DPLUA_JOB_TOKEN=abc run --nnodes=2 --node_rank=0 --master_port="$port" --nproc_per_node=1 "$tmp/env.lua"
[ "$tokA" = "token=nil" ] && has out "token=abc" && has out "rank=0 world=2" && has out "group=0"
ok $? "on several nodes the launcher sets no token of its own (the ranks read rank 0's file), only the caller's"

# ---------------------------------------------------------------- bad flags

run --nproc_per_node=abc "$tmp/env.lua"
[ $status -eq 2 ] && has err "--nproc_per_node: expected a number" && has err "'abc'"
ok $? "a non-numeric --nproc_per_node: exit 2 with a clear error"

run --nproc_per_node=0 "$tmp/env.lua"
[ $status -eq 2 ] && has err "got '0'"; ok $? "--nproc_per_node=0: exit 2"

run --nproc_per_node=2 --nnodes=2 --node_rank=2 "$tmp/env.lua"
[ $status -eq 2 ] && has err "--node_rank=2 must be less than --nnodes=2"; ok $? "node_rank >= nnodes: exit 2"

run --nproc_per_node=2 --nnodes=2 "$tmp/env.lua"
[ $status -eq 2 ] && has err "give each node its --node_rank"; ok $? "several nodes without --node_rank: exit 2"

run --nproc_per_node=2
[ $status -eq 2 ] && has err "missing script"; ok $? "no script: exit 2"

run --nnodes=1 "$tmp/env.lua"
[ $status -eq 2 ] && has err "needs --nproc_per_node"; ok $? "no --nproc_per_node: exit 2"

run --nproc_per_node=2 --bogus "$tmp/env.lua"
[ $status -eq 2 ] && has err "unrecognized launcher option '--bogus'"; ok $? "an unknown --flag: exit 2"

run --nproc_per_node=2 --max_restarts=-1 "$tmp/env.lua"
[ $status -eq 2 ] && has err "expected a number from 0 to 1000"; ok $? "--max_restarts=-1: exit 2 (restarts: test_restarts.sh)"

run --nproc_per_node=2 --master_port=99999 "$tmp/env.lua"
[ $status -eq 2 ] && has err "--master_port"; ok $? "a port out of range: exit 2"

# standard input is one stream: two ranks would each read a part of it
echo 'print(1)' | dp --nproc_per_node=2 - >"$tmp/out" 2>"$tmp/err"
status=$?
[ $status -eq 2 ] && has err "the script '-' (standard input) cannot be read by several ranks"
ok $? "the script - with two ranks: exit 2"
echo 'print("from stdin " .. os.getenv("RANK"))' | dp --nproc_per_node=1 - >"$tmp/out" 2>"$tmp/err"
status=$?
[ $status -eq 0 ] && has out "from stdin 0"
ok $? "the script - with one rank runs it"

# a failed rank's own children (its process group) are stopped too
cat >"$tmp/orphan.lua" <<'LUA'
os.execute("sleep 171 &")
if os.getenv("RANK") == "1" then error("rank 1 fails") end
os.execute("sleep 3")
LUA
run --nproc_per_node=2 "$tmp/orphan.lua"
sleep 0.3
[ $status -ne 0 ] && ! grep -qsa "sleep.171" /proc/[0-9]*/cmdline   # (/proc: procps may be absent)
ok $? "after a rank fails, no process it or another rank started is left"

# on one node an address that does not resolve is an error at once, not a
# wait for the store's timeout (300 s)
run --nproc_per_node=2 --master_addr=nonexistent.invalid "$tmp/env.lua"
[ $status -eq 2 ] && has err "--master_addr=nonexistent.invalid: cannot resolve it"
ok $? "an address that does not resolve, on one node: exit 2 at once"

run --nproc_per_node=gpu "$tmp/env.lua"
{ [ $status -eq 2 ] && has err "--nproc_per_node=gpu: no GPU is visible"; } || \
    { [ $status -eq 0 ] && has out "rank=0"; }
ok $? "--nproc_per_node=gpu: one rank per GPU, or a clear error without one"

run --nproc_per_node=1 --help
[ $status -eq 0 ] && has out "--nproc_per_node=N" && has out "--prefix-output"; ok $? "the launcher's --help"

done_testing
