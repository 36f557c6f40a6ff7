#!/bin/sh
# tests/sh/test_sweep.sh -- `dplua sweep` on a fake trial script
# (tests/data/sweep_quadratic.lua, whose loss is (x-1)^2 + (y+2)^2): two
# trials at once, deliberate crashes recorded without stopping the sweep,
# a rerun that skips finished trials, the sorted table and the best
# configuration, a timeout, random spaces, tpe (model-based choices that
# beat its random start, resumed with more samples), argument templates,
# bad input.
# TAP output; run by `make check` with top_builddir and top_srcdir set
# (both default to "."). Each sweep runs under timeout(1) when there is one.
#
#   sh tests/sh/test_sweep.sh          # from the build directory

. "$(dirname "$0")/tap.sh"

absolute_dplua
need_dplua
make_tmp sweep
copy_data sweep_quadratic.lua sweep_quadratic_sweep.lua

if command -v timeout >/dev/null 2>&1; then dp_timeout=120; fi

# sweep ARGS...: dplua sweep in $tmp; output in $tmp/out and $tmp/err.
sweep() { run_in "$tmp" sweep "$@"; }

# lua CODE: run the Lua CODE in $tmp with `json`, `results` (the records of
# sweep_quadratic_sweep.results.jsonl in file order) and `by_trial` defined;
# an error or a `return false` fails. (-e code gets no varargs, so CODE
# travels in the environment.)
lua() {
    (cd "$tmp" && CHECK="$1" "$dplua" -e '
        json = require("dplua.json")
        results = assert(json.read_lines("sweep_quadratic_sweep.results.jsonl"))
        by_trial = {}
        for _, r in ipairs(results) do by_trial[r.trial] = r end
        local f = assert(loadstring(os.getenv("CHECK")))
        local ok, res = pcall(f)
        if not ok then io.stderr:write(tostring(res), "\n") os.exit(1) end
        if res == false then io.stderr:write("check returned false\n") os.exit(1) end
    ') >>"$tmp/out" 2>>"$tmp/err"
}

# ---------------------------------------------------------------- first run

sweep sweep_quadratic_sweep.lua
[ $status -eq 0 ]; ok $? "the sweep exits 0 although two trials fail"
cp "$tmp/out" "$tmp/first.out"
has_re out "8 configurations (grid over x, y)" && has_re out "0 finished earlier, 8 to run, 2 at a time"
ok $? "the header names the space, the work and the parallelism"

lua 'return #results == 8'; ok $? "the results file has one line per trial"
lua 'for i = 1, 8 do assert(by_trial[i], "no record for trial " .. i) end'
ok $? "every trial has a record"

lua 'local r = by_trial[7]
     assert(r.status == "crashed" and r.exit_code == 1, json.encode(r))
     assert(r.error:find("deliberate crash for x = 3"), r.error)'
ok $? "a Lua error is recorded as crashed, with the exit status and the error line"

lua 'local r = by_trial[8]
     assert(r.status == "crashed" and r.signal == "SIGKILL", json.encode(r))'
ok $? "a trial killed by a signal is recorded as crashed with the signal's name"

lua 'for i = 1, 6 do local r = by_trial[i]
       assert(r.status == "ok" and r.exit_code == 0, json.encode(r))
       local x, y = r.hparams.x, r.hparams.y
       assert(r.metrics.loss == (x - 1) ^ 2 + (y + 2) ^ 2, json.encode(r))
       assert(r.metrics.x_seen == x, "the trial did not see its hparams")
       assert(r.metrics.step == 1, "the last value of step")
     end'
ok $? "successful trials record their last reported metrics, computed from their hparams"

lua 'local overlap = false
     for i = 1, 8 do for j = i + 1, 8 do
       local a, b = by_trial[i], by_trial[j]
       if a.started < b.started + b.time and b.started < a.started + a.time then overlap = true end
     end end
     return overlap'
ok $? "two trials run at the same time"

lua 'local busy = 0
     for i = 1, 8 do busy = busy + by_trial[i].time end
     local first, last = math.huge, 0
     for i = 1, 8 do local r = by_trial[i]
       first = math.min(first, r.started); last = math.max(last, r.started + r.time) end
     return last - first < busy * 0.8'
ok $? "the sweep takes less wall time than its trials one after another"

grep -q "^trial 3: x = 1, y = -2$" "$tmp/sweep_quadratic_sweep.logs/trial-003.log" \
    && head -1 "$tmp/sweep_quadratic_sweep.logs/trial-003.log" | grep -q "^# dplua sweep: trial 3: x=1 y=-2"
ok $? "each trial writes its own log, headed by its configuration, with DPLUA_TRIAL_ID set"

# the table: ranked rows first, sorted by loss; failed trials last
sed -n '/^rank/,/^$/p' "$tmp/out" | awk 'NR > 2 && NF > 0 { print $2 }' | tr '\n' ' ' >"$tmp/order"
[ "$(cat "$tmp/order")" = "3 1 5 4 2 6 7 8 " ]
ok $? "the table lists trials sorted by loss, ties by trial, failures last (got: $(cat "$tmp/order"))"
sed -n '/^rank/,/^$/p' "$tmp/out" | awk 'NR > 2 && $1 != "-" && NF > 0 { print $5 }' >"$tmp/losses"
sort -g -c "$tmp/losses"; ok $? "the metric column is sorted"
has_re out "crashed (exit 1)" && has_re out "crashed (SIGKILL)"; ok $? "the table shows how failed trials ended"
has_re out "^best: trial 3, loss = 0$" && has_re out "^  x=1 y=-2$" && has_re out "DPLUA_HPARAMS='{\"x\":1,\"y\":-2}'"
ok $? "the best configuration is x=1 y=-2"

# ---------------------------------------------------------------- reruns

sweep sweep_quadratic_sweep.lua
[ $status -eq 0 ] && has_re out "8 finished earlier, 0 to run" && ! has_re out "started"
ok $? "a rerun skips every finished trial"
lua 'return #results == 8'; ok $? "a rerun adds no records"
has_re out "^best: trial 3, loss = 0$"; ok $? "a rerun prints the table from the recorded results"

head -n 4 "$tmp/sweep_quadratic_sweep.results.jsonl" >"$tmp/part" && mv "$tmp/part" "$tmp/sweep_quadratic_sweep.results.jsonl"
printf '{"trial":5,"status":"ok","hpar\n' >>"$tmp/sweep_quadratic_sweep.results.jsonl"
sweep sweep_quadratic_sweep.lua
[ $status -eq 0 ] && has_re out "4 finished earlier, 4 to run" && has_re err "skipping a damaged line"
ok $? "a partial results file (with a line cut short) runs only the missing trials"
lua 'return #results == 8'; ok $? "the missing trials are appended"

sweep sweep_quadratic_sweep.lua --retry-failed --parallel 1
[ $status -eq 0 ] && has_re out "6 finished earlier, 2 to run, 1 at a time" && has_re out "trial 7 started" \
    && has_re out "trial 8 started"
ok $? "--retry-failed runs the crashed trials again, --parallel overrides the sweep"

sweep sweep_quadratic_sweep.lua --results other.jsonl --dry-run
[ $status -eq 0 ] && has_re out "0 finished earlier, 8 to run" && has_re out "trial 8: x=3 y=0" \
    && [ ! -e "$tmp/other.jsonl" ]
ok $? "--dry-run lists the configurations and runs nothing; --results picks the file"

# ---------------------------------------------------------------- timeout, args, random

cat >"$tmp/slow.lua" <<'EOF'
return { script = "sweep_quadratic.lua", space = { x = 1, y = -2, sleep = 30 },
         metric = "loss", timeout = 0.5 }
EOF
start=$(date +%s)
sweep slow.lua
took=$(( $(date +%s) - start ))
[ $status -eq 1 ] && [ $took -lt 15 ] && grep -q '"status":"timeout"' "$tmp/slow.results.jsonl" \
    && has_re out "timeout (SIGTERM)" && has_re out "best: none"
ok $? "a trial past its timeout is stopped and recorded; with no success the sweep exits 1 (took ${took}s)"

cat >"$tmp/args.lua" <<'EOF'
return { script = "sweep_quadratic.lua", space = { x = {1, 2}, y = -2, sleep = 0 },
         args = { "--x={x}" }, metric = "loss", results = "sub/args.jsonl", logs = "sub/logs" }
EOF
sweep args.lua -- extra
[ $status -eq 0 ] && grep -q '"arg1":"--x=1"' "$tmp/sub/args.jsonl" && grep -q '"arg1":"--x=2"' "$tmp/sub/args.jsonl" \
    && grep -q "sweep_quadratic.lua --x=1 extra" "$tmp/sub/logs/trial-001.log"
ok $? "args templates get each trial's values, args after -- are appended, results and logs paths are made"

cat >"$tmp/random.lua" <<'EOF'
return { script = "sweep_quadratic.lua", method = "random", samples = 6, seed = 7,
         space = { x = { uniform = {-1, 3} }, y = { log_uniform = {1e-3, 1e-1} }, sleep = {0, 0.01} },
         metric = "loss" }
EOF
sweep random.lua --dry-run
cp "$tmp/out" "$tmp/random1"
sweep random.lua --dry-run
cmp -s "$tmp/out" "$tmp/random1" && [ "$(grep -c '^  trial [0-9]*: ' "$tmp/out")" -eq 6 ]
ok $? "a random space gives the same configurations for the same seed"
(cd "$tmp" && "$dplua" -e '
  local s = require("dplua.sweep")
  local sw = s.load("random.lua")
  for _, t in ipairs(s.configurations(sw)) do
    local h = t.hparams
    assert(h.x >= -1 and h.x < 3 and h.y >= 1e-3 and h.y <= 1e-1 and (h.sleep == 0 or h.sleep == 0.01))
  end
  sw.seed = 8
  assert(s.configurations(sw)[1].key ~= s.configurations(s.load("random.lua"))[1].key)') >"$tmp/out" 2>"$tmp/err"
status=$?
[ $status -eq 0 ]; ok $? "random draws stay in their ranges and depend on the seed"

# ---------------------------------------------------------------- tpe

cat >"$tmp/tpe.lua" <<'EOF2'
return { script = "sweep_quadratic.lua", method = "tpe", samples = 14, seed = 3, tpe = { startup = 5 },
         space = { x = { uniform = {-4, 0} }, y = { uniform = {-6, 2} }, sleep = 0 },
         metric = "loss", results = "tpe.jsonl", logs = "tpe.logs" }
EOF2
sweep tpe.lua --parallel 1
[ $status -eq 0 ] && has_re out "14 configurations (tpe over" && [ "$(grep -c . "$tmp/tpe.jsonl")" -eq 14 ]
ok $? "method = \"tpe\" runs samples trials, each chosen when the one before has reported"
(cd "$tmp" && "$dplua" -e '
  local json = require("dplua.json")
  local rs = assert(json.read_lines("tpe.jsonl"))
  local best_startup, best_tpe = math.huge, math.huge
  for _, r in ipairs(rs) do
    local l = r.metrics.loss
    if r.trial <= 5 then best_startup = math.min(best_startup, l) else best_tpe = math.min(best_tpe, l) end
  end
  -- (x - 1)^2 + (y + 2)^2 over x in [-4, 0]: the best is 1 at x = 0, y = -2
  assert(best_tpe < best_startup and best_tpe < 1.5, ("startup best %g, tpe best %g"):format(best_startup, best_tpe))') \
  >"$tmp/out" 2>"$tmp/err"
ok $? "the trials tpe chose beat the 5 random ones it started from, near the optimum" "$tmp/err"
cp "$tmp/tpe.jsonl" "$tmp/tpe1.jsonl"
sed -i 's/samples = 14/samples = 16/' "$tmp/tpe.lua"
sweep tpe.lua --parallel 1
[ $status -eq 0 ] && has_re out "14 finished earlier, 2 to run" && [ "$(grep -c . "$tmp/tpe.jsonl")" -eq 16 ] &&
    [ "$(head -14 "$tmp/tpe.jsonl" | md5sum)" = "$(md5sum < "$tmp/tpe1.jsonl")" ]
ok $? "a tpe sweep run again with more samples keeps its trials and chooses only the new ones"
(cd "$tmp" && "$dplua" -e '
  local tpe = require("dplua.tpe")
  local space = { x = { uniform = {0, 1} }, opt = { "a", "b" } }
  local function u_of(seed) local s = seed return function() s = (s * 1103515245 + 12345) % 2147483648 return s / 2147483648 end end
  local history = {}
  for i = 1, 30 do
    local x, opt = (i % 10) / 10, i % 2 == 0 and "a" or "b"
    history[i] = { hparams = { x = x, opt = opt }, value = (x - 0.7) ^ 2 + (opt == "a" and 0 or 1) }
  end
  local a = tpe.suggest(space, { "opt", "x" }, history, u_of(1))
  local b = tpe.suggest(space, { "opt", "x" }, history, u_of(1))
  assert(a.x == b.x and a.opt == b.opt, "the same stream gives the same suggestion")
  local near = 0
  for seed = 1, 20 do
    local c = tpe.suggest(space, { "opt", "x" }, history, u_of(seed))
    assert(c.x >= 0 and c.x <= 1)
    if c.opt == "a" and math.abs(c.x - 0.7) < 0.2 then near = near + 1 end
  end
  assert(near >= 15, near .. " of 20 suggestions near the good region")') >"$tmp/out" 2>"$tmp/err"
ok $? "tpe.suggest is deterministic for a stream and proposes the good region" "$tmp/err"

for f in sweep_fashion_mnist.lua sweep_fashion_mnist_asha.lua sweep_fashion_mnist_tpe.lua; do
    run sweep "$top_srcdir/examples/$f" --dry-run
    [ $status -eq 0 ] && has_re out "configurations" || break
done
ok $? "the example sweeps (grid, ASHA, tpe) load and plan"

# ---------------------------------------------------------------- TensorBoard

# The event files are read by the independent reader of test_tensorboard.lua
# (Debian's python3-protobuf and protoc; scripts/setup-debian installs them).
reader="$(cd "$top_srcdir" && pwd)/tests/tensorboard/read_events.py"
sweep sweep_quadratic_sweep.lua --results tb.jsonl --tensorboard tb
[ $status -eq 0 ] && has_re out "tensorboard: tb/" && [ -d "$tmp/tb/x=1,y=-2" ]
ok $? "--tensorboard DIR writes a run per trial, named by its hyperparameters"
(cd "$tmp" && /usr/bin/python3 "$reader" tb >tb.json 2>tb.err)
ok $? "the reader decodes every event file and every CRC matches" "$tmp/tb.err"
lua 'local files = assert(json.decode(io.open("tb.json"):read("*a")))
     local runs = {}
     for _, f in ipairs(files) do
       assert(not runs[f.run], "two files in run " .. f.run)
       runs[f.run] = {}
       for _, e in ipairs(f.events) do
         for _, v in ipairs(e.summary and e.summary.value or {}) do table.insert(runs[f.run], { step = e.step, v = v }) end
       end
     end
     local names = {}
     for name in pairs(runs) do names[#names + 1] = name end
     table.sort(names)
     assert(table.concat(names, " ") == "x=0,y=-2 x=0,y=0 x=1,y=-2 x=1,y=0 x=2,y=-2 x=2,y=0 x=3,y=-2 x=3,y=0", table.concat(names, " "))
     local function scalars(run, tag)
       local out = {}
       for _, s in ipairs(runs[run]) do
         if s.v.tag == tag and s.v.simple_value then out[#out + 1] = s.step .. ":" .. s.v.simple_value end
       end
       return table.concat(out, " ")
     end
     -- reported at steps 0 and 1, then the last value again with the hparams
     assert(scalars("x=2,y=0", "loss") == "0:100 1:5 1:5", scalars("x=2,y=0", "loss"))
     assert(scalars("x=2,y=0", "x_seen") == "1:2 1:2", scalars("x=2,y=0", "x_seen"))
     assert(scalars("x=3,y=-2", "loss") == "0:100 0:100", "a crashed trial keeps what it reported")
     local hp = {}
     for _, s in ipairs(runs["x=1,y=0"]) do
       if s.v.hparams then for k, v in pairs(s.v.hparams) do hp[k] = v end end
     end
     assert(hp.session_start_info.hparams.x == 1 and hp.session_start_info.hparams.y == 0, json.encode(hp))
     local m = hp.experiment.metric_infos
     assert(#m == 2 and m[1].name.tag == "loss" and m[2].name.tag == "x_seen", json.encode(m))
     assert(hp.session_end_info.status == "STATUS_SUCCESS")'
ok $? "each run holds the trial's reported metrics at their steps, and its hyperparameters"

printf 'return { script = "sweep_quadratic.lua", space = { x = {1} }, metric = "loss", tensorboard = "sub/tb" }\n' >"$tmp/tbfield.lua"
sweep tbfield.lua --dry-run
[ $status -eq 0 ] && has_re out "tensorboard: sub/tb/"
ok $? "the sweep's tensorboard field, relative to the sweep file"
printf 'return { script = "sweep_quadratic.lua", space = { x = {1} }, metric = "loss", tensorboard = 5 }\n' >"$tmp/tbbad.lua"
sweep tbbad.lua
[ $status -eq 1 ] && has_re err "'tensorboard' must name a folder"; ok $? "a tensorboard field that is not a folder name"

# ---------------------------------------------------------------- mistakes

printf 'return { script = "sweep_quadratic.lua", space = { x = {1} }, metric = "loss", paralell = 2 }\n' >"$tmp/typo.lua"
sweep typo.lua
[ $status -eq 1 ] && has_re err "unknown field 'paralell'"; ok $? "a misspelt field in the sweep table is an error that names it"
printf 'return { script = "sweep_quadratic.lua", space = { x = {uniform = {0, 1}} }, metric = "loss" }\n' >"$tmp/dist.lua"
sweep dist.lua
[ $status -eq 1 ] && has_re err 'needs method = "random"'; ok $? "a distribution in a grid is an error"
sweep sweep_quadratic_sweep.lua --bogus
[ $status -eq 2 ] && has_re err "unknown option --bogus"; ok $? "an unknown option exits 2"
sweep
[ $status -eq 2 ] && has_re err "usage: dplua sweep"; ok $? "no sweep file prints the usage and exits 2"
sweep --help
[ $status -eq 0 ] && has_re out "usage: dplua sweep"; ok $? "--help exits 0"
sweep missing.lua
[ $status -eq 1 ] && has_re err "missing.lua"; ok $? "a missing sweep file is named"

printf 'return { script = "sweep_quadratic.lua", space = { x = {1}, z = {2} }, metric = "loss" }\n' >"$tmp/unknown.lua"
sweep unknown.lua
grep -q "the sweep sets z, which the script's defaults do not name" "$tmp/unknown.logs/trial-001.log"
ok $? "torch.hparams(defaults) rejects a sweep key the script does not know"

done_testing
