#!/bin/sh
# tests/sh/test_store_siege.sh -- rank 0's store under siege while a 2-rank
# Gloo job trains (tests/dist/store_siege.lua): thousands of idle
# connections and half-sent HELLO frames from a stranger
# (tests/sh/siege.lua), a HELLO for a live rank and one with a wrong
# token. The job must finish as it does unbesieged (the same parameters),
# its torch.save must load, rank 0 must not grow, and the store must log
# each kind of stranger once. Then a job started without the launcher
# (two plain processes): the token comes from rank 0's private file.
#
#   sh tests/sh/test_store_siege.sh          # from the build directory

. "$(dirname "$0")/tap.sh"

dist="$top_srcdir/tests/dist"
make_tmp siege
need_dplua
absolute_dplua
diag_cut="tail -20"
dp_path=$tap_dir

# job DIR [siege]: the training job in DIR, with the siege or without;
# the launcher's output in DIR/out and DIR/err, the siege's in DIR/siege.
job() {
    mkdir -p "$1"
    timeout 240 "$dplua" --nproc_per_node=2 "$dist/store_siege.lua" "$1" </dev/null >"$1/out" 2>"$1/err" &
    launcher=$!
    wait_file "$1/port" 60
    if [ "${2:-}" = siege ]; then
        : >"$1/go"
        dp_timeout=180 dp "$tap_dir/siege.lua" "$(cat "$1/port")" "$(cat "$1/token")" 2000 \
            </dev/null >"$1/siege" 2>&1
    else
        : >"$1/go"
    fi
    : >"$1/done"
    wait $launcher
    job_status=$?
}

job "$tmp/calm"
[ $job_status -eq 0 ] && grep -q '^sum ' "$tmp/calm/out"
ok $? "the job alone trains and saves" "$tmp/calm/err"

job "$tmp/besieged" siege
[ $job_status -eq 0 ] && grep -q "^made 4000 connections" "$tmp/besieged/siege" && grep -q '^all_reduce 2' "$tmp/besieged/out"
ok $? "the job finishes while a stranger makes 4000 connections to its store (2000 idle, 2000 half a HELLO)" "$tmp/besieged/err"

[ "$(grep '^sum ' "$tmp/besieged/out")" = "$(grep '^sum ' "$tmp/calm/out")" ]
ok $? "and ends with the parameters of the job left alone ($(grep '^sum ' "$tmp/calm/out"))" "$tmp/besieged/out"

run -e "local torch = require('dplua'); local sd = torch.load('$tmp/besieged/model.safetensors')
local s = 0; for _, k in ipairs(sd:keys()) do s = s + sd[k]:sum():item() end; print(string.format('sum %.9g', s))"
[ $status -eq 0 ] && [ "$(cat "$tmp/out")" = "$(grep '^sum ' "$tmp/besieged/out")" ]
ok $? "its torch.save loads back with those parameters"

grew=$(sed -n 's/^grew \(-*[0-9]*\) MiB$/\1/p' "$tmp/besieged/out")
[ -n "$grew" ] && [ "$grew" -lt 32 ]
ok $? "rank 0 grew by less than 32 MiB under the siege (${grew:-?} MiB)" "$tmp/besieged/out"

has besieged/siege "duplicate rank 1: rank 1 is already connected" && has besieged/siege "refused"
ok $? "a HELLO for a live rank is refused, and the job goes on" "$tmp/besieged/siege"

has besieged/siege "wrong token: wrong job token"
ok $? "a wrong token is refused" "$tmp/besieged/siege"

[ "$(grep -c 'had not said HELLO' "$tmp/besieged/err")" -le 1 ] && [ "$(grep -c 'did not say HELLO within' "$tmp/besieged/err")" -le 1 ] \
    && grep -q 'had not said HELLO\|did not say HELLO within' "$tmp/besieged/err" \
    && has besieged/err "rank 1 is already connected"
ok $? "the store logs each kind of stranger once, and the duplicate" "$tmp/besieged/err"

# ---------------------------------------------------------------- no launcher

# Two plain processes (a shell loop, as under Slurm or mpirun): no
# DPLUA_JOB_TOKEN, so rank 0 writes a private token file and rank 1 reads it.
cache="$tmp/cache"
port=$("$dplua" -e "local ffi = require('ffi'); local C = require('dplua').C
local out = ffi.new('dp_store *[1]'); assert(C.dp_store_open(out, '127.0.0.1', 0, 1, -1, 0, 'x', 0, 5) == 0)
io.write(C.dp_store_port(out[0])); C.dp_store_close(out[0])")
cat >"$tmp/plain.lua" <<'EOF2'
local torch = require("dplua")
local dist = torch.distributed
dist.init_process_group("gloo", { timeout = 30 })
local t = torch.ones(3) * (dist.get_rank() + 1)
dist.all_reduce(t)
print(string.format("rank %d: %g", dist.get_rank(), t:sum():item()))
io.stdout:flush()
for _ = 1, 200 do   -- (until the test has looked at the token file)
  local f = io.open(arg[1] .. "/seen")
  if f then f:close() break end
  os.execute("sleep 0.1")
end
dist.destroy_process_group()
EOF2
for r in 0 1; do
    env -u DPLUA_JOB_TOKEN XDG_CACHE_HOME="$cache" RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT="$port" \
        timeout 60 "$dplua" "$tmp/plain.lua" "$tmp" </dev/null >"$tmp/plain.$r" 2>&1 &
    eval "plain$r=\$!"
done
# while the job runs: the token file is there, private, and a stranger without it is refused
wait_until 20 sh -c "ls '$cache'/dplua/store-*-$port.token >/dev/null 2>&1"
file=$(ls "$cache"/dplua/store-*-"$port".token 2>/dev/null)
mode=$(stat -c %a "$file" 2>/dev/null)
: >"$tmp/seen"
wait $plain0; s0=$?
wait $plain1; s1=$?
[ $s0 -eq 0 ] && [ $s1 -eq 0 ] && [ "$(cat "$tmp/plain.0")" = "rank 0: 9" ] && [ "$(cat "$tmp/plain.1")" = "rank 1: 9" ]
ok $? "two processes started without the launcher meet through rank 0's token file" "$tmp/plain.1"

[ -n "$file" ] && [ "$mode" = 600 ] && [ "$(stat -c %a "$cache/dplua")" = 700 ] && [ ! -e "$file" ]
ok $? "the file (mode ${mode:-?}) lived in a folder only its user can open (\$XDG_CACHE_HOME/dplua), and is gone when the store closes"

run -e "local ffi = require('ffi'); local C = require('dplua').C
local out = ffi.new('dp_store *[1]')
assert(C.dp_store_open(out, '127.0.0.1', 0, 1, 0, 2, '', 1, 5) == 0, ffi.string(C.dp_last_error()))
local port = C.dp_store_port(out[0])
local s = io.popen('env -u DPLUA_JOB_TOKEN XDG_CACHE_HOME=$tmp/elsewhere timeout 20 $dplua -e \"local ffi = require([[ffi]]); local C = require([[dplua]]).C; ' ..
  'local o = ffi.new([[dp_store *[1] ]]); print(C.dp_store_open(o, [[127.0.0.1]], ' .. port .. ', 0, 1, 2, nil, 1, 2), ffi.string(C.dp_last_error()))\" 2>&1')
print(s:read('*a')); s:close(); C.dp_store_close(out[0])"
[ $status -eq 0 ] && has out "no job token in $tmp/elsewhere/dplua/store-" && has out "set DPLUA_JOB_TOKEN"
ok $? "a process of another cache folder (not this job's) finds no token and says what to do"

done_testing
