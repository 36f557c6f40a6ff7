#!/bin/sh
# tests/sh/test_checkpoint_kill.sh -- torch.save is atomic: a process killed
# with SIGKILL at a random point while it saves a large checkpoint (64 MB)
# leaves the previous checkpoint intact, whole and loadable, never a part
# of the new one. TAP output; run by `make check` with top_builddir and
# top_srcdir set (both default to ".").
#
#   sh tests/sh/test_checkpoint_kill.sh [ROUNDS]      # from the build directory
#
# Each round starts a writer that saves generation g, g+1, ... in a loop
# (every element of the tensor equal to g, so a torn file would show), kills
# it with -9 after a random delay, and then loads the target: it must load,
# be uniform, and be the last generation the writer finished or the one it
# was writing (killed after the rename but before it said so). Temporary
# files of killed writers (path.tmp.PID) may stay behind; they are never
# the target. At least one kill must have landed inside a write (a
# temporary file left behind), or the test did not test anything.
#
#   DPLUA_KILL_ROUNDS   rounds (default 12; the argument wins)
#   DPLUA_KILL_SEED     seed of the delays (default: the time; printed)

. "$(dirname "$0")/tap.sh"

rounds=${1:-${DPLUA_KILL_ROUNDS:-12}}
seed=${DPLUA_KILL_SEED:-$(( $(date +%s) % 100000 ))}
numel=16777216

make_tmp kill
writer_pid=
at_exit() {
    if [ -n "$writer_pid" ]; then kill -9 "$writer_pid" 2>/dev/null; fi
}
need_dplua

ckpt="$tmp/ckpt.safetensors"

# The writer: saves generations FIRST, FIRST+1, ... (COUNT of them, 0: for
# ever), saying "begin G" before and "done G" after each save.
cat >"$tmp/writer.lua" <<'EOF'
local torch = require("dplua")
local path, numel, g, count = arg[1], tonumber(arg[2]), tonumber(arg[3]), tonumber(arg[4])
local saved = 0
local w, v = torch.empty(numel), torch.empty(1000, { dtype = torch.int64 })
while count == 0 or saved < count do
  w:fill_(g)
  v:fill_(-g)
  io.write("begin ", g, "\n"); io.stdout:flush()
  torch.save({ w = w, v = v, g = g, note = "generation " .. g }, path)
  io.write("done ", g, "\n"); io.stdout:flush()
  g, saved = g + 1, saved + 1
end
EOF

# The checker: loads the target and prints its generation, or fails.
cat >"$tmp/check.lua" <<'EOF'
local torch = require("dplua")
local path, numel = arg[1], tonumber(arg[2])
local ck = torch.load(path)
local g = ck.g
assert(type(g) == "number", "no generation in the checkpoint")
assert(ck.note == "generation " .. g, "metadata of another generation: " .. tostring(ck.note))
assert(ck.w:numel() == numel, "w has " .. ck.w:numel() .. " elements")
assert(ck.w:min():item() == g and ck.w:max():item() == g, "w is not uniformly " .. g .. ": a torn checkpoint")
assert(ck.v:min():item() == -g and ck.v:max():item() == -g, "v is not uniformly " .. -g)
io.write(g, "\n")
EOF

echo "# seed $seed, $rounds rounds, a checkpoint of $((numel * 4 / 1048576)) MB"

# generation 0, saved to completion; its duration scales the delays
t0=$(date +%s%N)
"$dplua" "$tmp/writer.lua" "$ckpt" "$numel" 0 1 >"$tmp/log" 2>&1
st=$?
t1=$(date +%s%N)
ok $st "a first checkpoint is saved" "$tmp/log"
"$dplua" "$tmp/check.lua" "$ckpt" "$numel" >"$tmp/check" 2>&1
st=$?
[ $st -eq 0 ] && [ "$(cat "$tmp/check")" = 0 ]
ok $? "it loads whole (generation 0)" "$tmp/check"
save_ms=$(( (t1 - t0) / 1000000 ))
echo "# one save (with start-up) took ${save_ms} ms"

# the delays: from 0.2 to 2.5 times one save, so that kills land before,
# inside and between the writes and renames
delays=$(awk -v s="$seed" -v n="$rounds" -v ms="$save_ms" \
    'BEGIN { srand(s); for (i = 0; i < n; i++) printf "%.3f ", (0.2 + rand() * 2.3) * ms / 1000 }')
known=0        # the newest generation known to be complete
next=1
mid_write=0    # kills that left a temporary file: inside a write
r=1
while [ $r -le "$rounds" ]; do
    delay=$(echo "$delays" | cut -d' ' -f"$r")
    "$dplua" "$tmp/writer.lua" "$ckpt" "$numel" "$next" 0 >"$tmp/log" 2>&1 &
    writer_pid=$!
    sleep "$delay"
    kill -9 "$writer_pid" 2>/dev/null
    wait "$writer_pid" 2>/dev/null
    writer_pid=
    last_done=$(awk '$1 == "done" { g = $2 } END { print g }' "$tmp/log")
    last_begin=$(awk '$1 == "begin" { g = $2 } END { print g }' "$tmp/log")
    [ -n "$last_done" ] && known=$last_done
    leftovers=$(ls "$tmp" | grep -c '^ckpt\.safetensors\.tmp\.')
    if [ "$leftovers" -gt 0 ]; then mid_write=$((mid_write + 1)); fi

    "$dplua" "$tmp/check.lua" "$ckpt" "$numel" >"$tmp/check" 2>&1
    st=$?
    got=$(tail -n 1 "$tmp/check")
    good=1
    if [ $st -eq 0 ] && { [ "$got" = "$known" ] || [ "$got" = "$last_begin" ]; }; then good=0; fi
    {
        echo "killed after ${delay}s; the writer began ${last_begin:-nothing}, finished ${last_done:-nothing};"
        echo "the file holds generation $got (expected $known, or ${last_begin:-none} if the rename was done)"
        echo "checker:"; cat "$tmp/check"
    } >"$tmp/diag"
    ok $good "round $r: killed after ${delay}s, the checkpoint loads whole (generation ${got:-none})" "$tmp/diag"
    if [ $st -eq 0 ]; then known=$got; fi
    if [ -n "$last_begin" ]; then next=$((last_begin + 1)); fi
    rm -f "$tmp"/ckpt.safetensors.tmp.*
    r=$((r + 1))
done

echo "# $mid_write of $rounds kills landed inside a write"
[ "$mid_write" -gt 0 ]
ok $? "at least one kill landed inside a write (a temporary file was left)"

# a later save over the same path works and leaves no temporary file
"$dplua" "$tmp/writer.lua" "$ckpt" "$numel" 1000 1 >"$tmp/log" 2>&1 &&
    "$dplua" "$tmp/check.lua" "$ckpt" "$numel" >"$tmp/check" 2>&1 &&
    [ "$(cat "$tmp/check")" = 1000 ] &&
    [ "$(ls "$tmp" | grep -c '\.tmp\.')" -eq 0 ]
ok $? "a later save completes and leaves no temporary file" "$tmp/check"

done_testing
[ "$failed" -eq 0 ]
