#!/bin/sh
# tests/sh/test_ddp.sh -- DistributedDataParallel on Gloo under the launcher:
# N ranks equal one process on the whole batch (2 and 4 ranks), the DDP
# features (broadcast, no_sync, gradient accumulation, unused parameters,
# state_dict keys), groups
# and the store after destroy_process_group (tests/dist/group_lifetime.lua), the seed
# example printing one loss per rank, and kill -9 of a rank mid-training
# ending the whole job within 10 s with the launcher naming it.
#
#   sh tests/sh/test_ddp.sh          # from the build directory

. "$(dirname "$0")/tap.sh"

dist="$top_srcdir/tests/dist"
make_tmp ddp
need_dplua
diag_cut="tail -20"     # of each output, on a failure
dp_timeout=300

plan 10

run --nproc_per_node=2 "$dist/ddp_equivalence.lua" 50
[ $status -eq 0 ] && [ "$(grep -c 'worst relative difference' "$tmp/out")" -eq 2 ]
ok $? "DDP on 2 ranks equals one process on the whole batch (50 steps, 1e-6)"

run --nproc_per_node=4 "$dist/ddp_equivalence.lua" 50
[ $status -eq 0 ] && [ "$(grep -c 'worst relative difference' "$tmp/out")" -eq 4 ]
ok $? "DDP on 4 ranks equals one process on the whole batch (50 steps, 1e-6)"

run --nproc_per_node=2 "$dist/ddp_features.lua"
[ $status -eq 0 ] && ! grep -q '^not ok' "$tmp/out" && grep -q '^1\.\.11' "$tmp/out"
ok $? "DDP features: broadcast from rank 0, state_dict keys, no_sync, gradient accumulation (plain and checkpointed) against PyTorch, unused parameters, bf16_compress_hook"

run --nproc_per_node=2 "$dist/group_lifetime.lua"
[ $status -eq 0 ] && ! grep -q '^not ok' "$tmp/out" && grep -q '^1\.\.23' "$tmp/out"
ok $? "groups and the store after destroy_process_group, values that are not groups (Lua errors, not crashes), and three new default groups on the port"

run --nproc_per_node=1 "$dist/group_lifetime.lua"
[ $status -eq 0 ] && ! grep -q '^not ok' "$tmp/out" && grep -q '^1\.\.23' "$tmp/out"
ok $? "the same on one rank"

run --nproc_per_node=2 "$dist/group_lifetime.lua" store-first
[ $status -eq 0 ] && ! grep -q '^not ok' "$tmp/out" && grep -q '^1\.\.2' "$tmp/out"
ok $? "a store closed before its group stays open for it, and the group is freed at once"

run --nproc_per_node=2 "$top_srcdir/examples/seed.lua"
[ $status -eq 0 ] && grep -q '^\[0\] Loss: ' "$tmp/out" && grep -q '^\[1\] Loss: ' "$tmp/out" &&
    [ "$(grep -c 'Loss: ' "$tmp/out")" -eq 2 ]
ok $? "examples/seed.lua prints one loss per rank"

# kill -9 one rank mid-training: every rank must be gone within 10 s
timeout 120 "$dplua" --nproc_per_node=2 "$dist/ddp_train_forever.lua" "$tmp" </dev/null >"$tmp/out" 2>"$tmp/err" &
launcher=$!
wait_file "$tmp/rank0.pid" 60 && wait_file "$tmp/rank1.pid" 60
pid0=$(cat "$tmp/rank0.pid" 2>/dev/null); pid1=$(cat "$tmp/rank1.pid" 2>/dev/null)
[ -n "$pid0" ] && [ -n "$pid1" ]
ok $? "both ranks are training"
start=$(date +%s)
kill -9 "$pid1" 2>/dev/null
wait $launcher
status=$?
elapsed=$(( $(date +%s) - start ))
gone=0
kill -0 "$pid0" 2>/dev/null && gone=1
[ $gone -eq 0 ] && [ $elapsed -le 10 ]
ok $? "after kill -9 of rank 1 every rank is gone within 10 s (took ${elapsed} s)"
[ $status -ne 0 ] && grep -q 'rank 1' "$tmp/err" && grep -qi 'SIGKILL\|signal 9' "$tmp/err"
ok $? "the launcher exits non-zero naming rank 1 and its signal"
