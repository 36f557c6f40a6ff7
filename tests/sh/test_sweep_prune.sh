#!/bin/sh
# tests/sh/test_sweep_prune.sh -- early stopping in `dplua sweep`: ASHA on
# a fake trial with a known learning curve (tests/data/sweep_curve.lua;
# tests/data/sweep_curve_sweep.lua works out which trials the rule
# prunes), the records and table of pruned trials, a rerun that keeps
# them, the median rule, and `dplua plot`'s legend. The schedulers' rules
# themselves are tested in tests/lua/test_early_stopping.lua.
#
#   sh tests/sh/test_sweep_prune.sh          # from the build directory

. "$(dirname "$0")/tap.sh"

absolute_dplua
need_dplua
make_tmp sweep_prune
copy_data sweep_curve.lua sweep_curve_sweep.lua
if command -v timeout >/dev/null 2>&1; then dp_timeout=120; fi
sweep() { run_in "$tmp" sweep "$@"; }
# lua RESULTS CODE: CODE with `by_trial` (the records of RESULTS by trial)
lua() {
    (cd "$tmp" && RESULTS="$1" CHECK="$2" "$dplua" -e '
        local json = require("dplua.json")
        by_trial = {}
        for _, r in ipairs(assert(json.read_lines(os.getenv("RESULTS")))) do by_trial[r.trial] = r end
        local ok, res = pcall(assert(loadstring(os.getenv("CHECK"))))
        if not ok then io.stderr:write(tostring(res), "\n") os.exit(1) end
        if res == false then io.stderr:write("check returned false\n") os.exit(1) end
    ') >>"$tmp/out" 2>>"$tmp/err"
}

sweep sweep_curve_sweep.lua
[ $status -eq 0 ]; ok $? "the sweep exits 0"
has_re out "early stopping: asha (grace_period=1, reduction_factor=2, time_attr=epoch)"
ok $? "the header names the scheduler and its options"
lua sweep_curve_sweep.results.jsonl '
    return by_trial[1].status == "ok" and by_trial[2].status == "ok"
       and by_trial[3].status == "pruned" and by_trial[3].pruned_at == 1
       and by_trial[4].status == "pruned" and by_trial[4].pruned_at == 2'
ok $? "ASHA prunes exactly trials 3 (at epoch 1) and 4 (at epoch 2)"
lua sweep_curve_sweep.results.jsonl '
    return math.abs(by_trial[3].metrics.acc - 0.3 / 4) < 1e-12 and math.abs(by_trial[4].metrics.acc - 0.6 / 2) < 1e-12
       and by_trial[2].metrics.acc == 0.9'
ok $? "a pruned trial is recorded with its last metric"
! grep -q "epoch 2 reported" "$tmp/sweep_curve_sweep.logs/trial-003.log" \
    && ! grep -q "epoch 3 reported" "$tmp/sweep_curve_sweep.logs/trial-004.log" \
    && grep -q "epoch 4 reported" "$tmp/sweep_curve_sweep.logs/trial-002.log"
ok $? "pruned trials are stopped before their next epoch; the others run to the end"
has_re out "trial 3 pruned at epoch = 1 by asha" && has_re out "2 pruned" && has_re out "pruned at 2" \
    && has_re out "best: trial 2, acc = 0.9"
ok $? "the driver says what it pruned, and the table and the best trial show it"
tail -1 "$tmp/sweep_curve_sweep.logs/trial-004.log" | grep -q "^# dplua sweep: pruned at epoch = 2$"
ok $? "the trial's log ends saying where it was pruned"

sweep sweep_curve_sweep.lua
[ $status -eq 0 ] && has_re out "4 finished earlier, 0 to run" && has_re out "4 of 4 trials finished (2 pruned)"
ok $? "a rerun keeps the pruned trials as finished"
sweep sweep_curve_sweep.lua --retry-failed
[ $status -eq 0 ] && has_re out "0 to run"
ok $? "--retry-failed does not run pruned trials again"

(cd "$tmp" && "$dplua" plot sweep_curve_sweep.logs/trial-002.report.jsonl sweep_curve_sweep.logs/trial-004.report.jsonl \
    -o plot.svg) >"$tmp/out" 2>"$tmp/err"
has_re plot.svg "a=0.6 (pruned at epoch = 2)" && has_re plot.svg "a=0.9<"
ok $? "dplua plot's legend marks the pruned trial"

# The median rule (min_samples_required = 1), trials in the order 0.5, 0.9,
# 0.3, 0.6: 0.3 is below median{.5,.9} at epoch 1; 0.6 beats median{.5,.9,.3}
# at 1 but not median{.5,.9} = .7 at 2.
sed -e 's/scheduler = .*/scheduler = { "median", min_samples_required = 1 },/' \
    "$tmp/sweep_curve_sweep.lua" >"$tmp/median_sweep.lua"
sweep median_sweep.lua
lua median_sweep.results.jsonl '
    return by_trial[1].status == "ok" and by_trial[2].status == "ok"
       and by_trial[3].status == "pruned" and by_trial[3].pruned_at == 1
       and by_trial[4].status == "pruned" and by_trial[4].pruned_at == 2'
ok $? "the median rule prunes trials 3 (at epoch 1) and 4 (at epoch 2)"

printf 'return { script = "sweep_curve.lua", space = { a = {1} }, metric = "acc", scheduler = "hyperband" }\n' >"$tmp/bad.lua"
sweep bad.lua
[ $status -eq 1 ] && has_re err "'scheduler' must be \"asha\" or \"median\""
ok $? "an unknown scheduler is an error that says which exist"
printf 'return { script = "sweep_curve.lua", space = { a = {1} }, metric = "acc", nproc_per_node = 0 }\n' >"$tmp/bad.lua"
sweep bad.lua
[ $status -eq 1 ] && has_re err "'nproc_per_node' must be an integer >= 1"
ok $? "a bad nproc_per_node is an error"

done_testing
