#!/bin/sh
# tests/sh/test_dist_failures.sh -- failures of Gloo process groups under
# the launcher that must end the job with a message naming the cause, well
# before the group's timeout where the cause is known earlier:
# mismatched collectives named by the stall check (DPLUA_DIST_STALL, 3 s
# by default) with a 120 s timeout (tests/dist/collective_mismatch.lua),
# and a rank stopped with SIGSTOP (rank 1, then rank 0, which serves the
# store) named as not responding within a 5 s timeout
# (tests/dist/frozen_rank.lua). The time bounds guard against hangs
# (they are several times what the job needs), they do not measure speed.
#
#   sh tests/sh/test_dist_failures.sh          # from the build directory

. "$(dirname "$0")/tap.sh"

dist="$top_srcdir/tests/dist"
make_tmp dist-failures
need_dplua
diag_cut="tail -20"     # of each output, on a failure
dp_timeout=300

plan 8

# run_timed ARGS...: run, with the seconds it took in $elapsed
run_timed() {
    _start=$(date +%s)
    run "$@"
    elapsed=$(( $(date +%s) - _start ))
}

want="collective mismatch at #2 on group default: rank 0 called all_reduce(float32, 10 elements, SUM) but rank 1 called all_reduce(float32, 20 elements, SUM)"
run_timed --nproc_per_node=2 --prefix-output "$dist/collective_mismatch.lua" 120
line=$(grep -n 'dist.all_reduce(x)' "$dist/collective_mismatch.lua" | cut -d: -f1)
# (the rank that raises first ends the job: the launcher may stop the
# other before it prints; tests/lua/test_pg_collectives.lua sees both)
[ $status -ne 0 ] && grep -q "^\[[01]\]: dplua: .*collective_mismatch.lua:$line: $want" "$tmp/err" &&
    ! grep -q "returned (a bug)" "$tmp/out"
ok $? "mismatched collectives: the error names both calls at the script's line"
[ $elapsed -le 30 ]
ok $? "the stall check named them long before the 120 s timeout (took ${elapsed} s)"

dp_env=DPLUA_DIST_STALL=soon
run --nproc_per_node=1 "$dist/collective_mismatch.lua"
dp_env=
[ $status -ne 0 ] && has err "DPLUA_DIST_STALL must be a number of seconds >= 0" && has err "got 'soon'"
ok $? "a DPLUA_DIST_STALL that is not a number is an error naming it"

dp_env=DPLUA_DIST_STALL=0
run_timed --nproc_per_node=2 "$dist/collective_mismatch.lua" 4
dp_env=
[ $status -ne 0 ] && has err "$want" && [ $elapsed -le 30 ]
ok $? "with DPLUA_DIST_STALL=0 the timeout (4 s) names the mismatch the same way (took ${elapsed} s)"

run_timed --nproc_per_node=2 "$dist/frozen_rank.lua" 1 5
[ $status -ne 0 ] && has err "all_reduce #2 on group default (rank 0 of 2) failed" &&
    has err "rank 1 is not responding: no heartbeat for" && has err "frozen"
ok $? "a stopped rank 1 is named as not responding (frozen), not dead"
[ $elapsed -le 30 ]
ok $? "the job ended within the 5 s timeout and the launcher's grace (took ${elapsed} s)"

run_timed --nproc_per_node=2 "$dist/frozen_rank.lua" 0 5
[ $status -ne 0 ] && has err "all_reduce #2 on group default (rank 1 of 2) failed" &&
    has err "rank 0, which serves it, is not responding: no reply for" && has err "frozen"
ok $? "a stopped rank 0 (the store) is named as not responding (frozen), not dead"
[ $elapsed -le 30 ]
ok $? "the job ended within the 5 s timeout and the launcher's grace (took ${elapsed} s)"
