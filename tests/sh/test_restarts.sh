#!/bin/sh
# tests/sh/test_restarts.sh -- `dplua --nproc_per_node=2 --max_restarts=N`:
# a rank that fails mid-training (tests/dist/restart_train.lua) makes the
# launcher stop and start every rank again, and the job, resumed from its
# checkpoint, ends with the weights of an uninterrupted run, bit for bit;
# a job that always fails is started N + 1 times and then ends with its
# rank's status; without --max_restarts a failure ends the job; bad
# values. Gloo on loopback.
#
#   sh tests/sh/test_restarts.sh          # from the build directory

. "$(dirname "$0")/tap.sh"

make_tmp restarts
need_dplua
diag_cut="head -40"
dp_timeout=120
script="$top_srcdir/tests/dist/restart_train.lua"
final() { grep '^final ' "$tmp/$1"; }

mkdir "$tmp/whole" "$tmp/restarted" "$tmp/once"
run --nproc_per_node=2 "$script" "$tmp/whole"
cp "$tmp/out" "$tmp/whole.out"
[ $status -eq 0 ] && final whole.out >/dev/null
ok $? "an uninterrupted run of 10 steps"

run --nproc_per_node=2 --max_restarts=1 "$script" "$tmp/restarted" 5
cp "$tmp/out" "$tmp/restarted.out"
[ $status -eq 0 ]; ok $? "rank 1 fails after step 5, and the restarted job exits 0"
has err "rank 1 (pid" && has err "exited with status 3" && has err "restarting every rank (restart 1 of 1)"
ok $? "the launcher reports the failure, then the restart"
has restarted.out "rank 0: start 1 from step 6" && has restarted.out "rank 1: start 1 from step 6"
ok $? "every rank starts again, with TORCHELASTIC_RESTART_COUNT=1, and resumes from the checkpoint"
[ -n "$(final whole.out)" ] && [ "$(final whole.out)" = "$(final restarted.out)" ]
ok $? "the final weights equal the uninterrupted run's, bit for bit"

run --nproc_per_node=2 "$script" "$tmp/once" 5
[ $status -eq 3 ] && ! has err "restarting"
ok $? "without --max_restarts the failure ends the job with the rank's status"

run --nproc_per_node=2 --max_restarts=2 -e 'os.exit(4)'
[ $status -eq 4 ] && [ "$(grep -c 'restarting every rank' "$tmp/err")" -eq 2 ] && has err "(restart 2 of 2)"
ok $? "a job that always fails starts 3 times, then ends with its status"

run --nproc_per_node=2 --max_restarts=x "$script" "$tmp"
[ $status -eq 2 ] && has err "--max_restarts: expected a number from 0 to 1000"
ok $? "a bad --max_restarts exits 2"
run --nproc_per_node=1 --nnodes=2 --node_rank=0 --max_restarts=1 "$script" "$tmp"
[ $status -eq 2 ] && has err "restarts are for one node"
ok $? "restarts on several nodes are refused"

done_testing
