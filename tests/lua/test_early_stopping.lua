-- test_early_stopping.lua: the sweep's schedulers (dplua/early_stopping.lua)
-- on known learning curves, trials one after another as `parallel = 1`
-- runs them. Trial i's accuracy at epoch e is A[i] * e / 9, so that at
-- every epoch the trials compare as their A values do; the pruned trials
-- below are worked out by hand from the rules in the module's header.
local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
package.path = here .. "/?.lua;" .. package.path
local T = require("tap")
local ES = require("dplua.early_stopping")

local A = { 0.5, 0.9, 0.3, 0.72, 0.95, 0.1 }

-- Runs the trials in order through a scheduler of `spec`, each reporting
-- epochs 1..9 until it is told to stop. Returns {trial = epoch it was
-- stopped at} for the pruned trials. metric: "acc" (mode max) or "loss"
-- (1 - acc, mode min): the same trials must stop either way.
local function run(spec, metric)
  local mode = metric == "acc" and "max" or "min"
  local s = ES.new(ES.check(spec, error), metric, mode)
  local pruned = {}
  for i, a in ipairs(A) do
    for e = 1, 9 do
      local acc = a * e / 9
      local verdict, at = s:report(i, { epoch = e, [metric] = metric == "acc" and acc or 1 - acc, other = 1 })
      if verdict == "stop" then
        pruned[i] = at
        break
      end
    end
  end
  return pruned
end

T.run("quantile interpolates as numpy.percentile", function()
  T.close(ES.quantile({ 0.5, 0.9 }, 2 / 3), 0.5 + 0.4 * 2 / 3, 1e-12, 0, "two values")
  T.close(ES.quantile({ 0.9, 0.3, 0.5 }, 2 / 3), 0.5 + 0.4 / 3, 1e-12, 0, "three, unsorted")
  T.is(ES.quantile({ 4 }, 0.3), 4, "one value")
  T.is(ES.quantile({ 1, 2, 3, 4, 5 }, 0.5), 3, "the median of five")
end)

-- ASHA, rungs at epochs 1, 3, 9 (reduction factor 3: the top third goes on).
-- Epoch 1: T1 first (on); T2 0.9 > cutoff 0.5 (on); T3 0.3 < q{.5,.9} = .767
-- (stopped); T4 0.72 > q{.3,.5,.9} = .633 (on); T5 0.95 > q{.3,.5,.72,.9} =
-- .72 (on); T6 0.1 (stopped). Epoch 3: T1, T2 on; T4 0.72 < q{.5,.9} = .767
-- (stopped); T5 0.95 > q{.5,.72,.9} = .78 (on). Epoch 9: T1, T2, T5 on.
T.run("ASHA prunes the trials its rule names", function()
  for _, metric in ipairs({ "acc", "loss" }) do
    T.is(run("asha", metric), { [3] = 1, [4] = 3, [6] = 1 }, "rungs 1, 3, 9, metric " .. metric)
  end
  -- grace period 3, reduction factor 2 (the better half goes on): rungs at
  -- 3 and 6 only (max_t = 8 leaves out 12). Epoch 3: T1 on; T2 on; T3
  -- 0.3 < median{.5,.9} = .7 stopped; T4 0.72 > median{.3,.5,.9} = .5 on;
  -- T5 0.95 > median{.3,.5,.72,.9} = .61 on; T6 stopped. Epoch 6: T1 on,
  -- T2 on, T4 0.72 > median{.5,.9} = .7 on, T5 0.95 > .72 on.
  T.is(run({ "asha", grace_period = 3, reduction_factor = 2, max_t = 8 }, "acc"), { [3] = 3, [6] = 3 },
       "grace period 3, reduction factor 2")
end)

-- The median rule with min_samples_required = 2: T1, T2 have too few
-- others; T3 0.3 < median{.5,.9} at epoch 1 (stopped); T4 0.72 > median
-- {.5,.9,.3} = .5 at epoch 1, and at epochs 2..9 the others that got
-- there are T1 and T2 (median .7): on; T5 on; T6 0.1 < .72 at epoch 1
-- (stopped).
T.run("the median rule prunes the trials its rule names", function()
  for _, metric in ipairs({ "acc", "loss" }) do
    T.is(run({ "median", min_samples_required = 2 }, metric), { [3] = 1, [6] = 1 }, "metric " .. metric)
  end
  -- grace period 4: nobody is judged before epoch 4, where T3 (0.3 <
  -- median{.5,.9}) and T6 stop; T4 at 4: others there T1, T2 (T3 stopped
  -- at 4, so it reached 4 too): median{.5,.9,.3} = .5, on.
  T.is(run({ "median", min_samples_required = 2, grace_period = 4 }, "acc"), { [3] = 4, [6] = 4 }, "grace period 4")
  -- with the default 3 samples T3 has only two others: on; T4 beats the
  -- median .5 of T1..T3; T6 stops (0.1 < median{.5,.9,.3,.72,.95} = .72)
  T.is(run("median", "acc"), { [6] = 1 }, "min_samples_required 3 (the default)")
end)

T.run("lines without the time or the metric are not judged", function()
  local s = ES.new(ES.check("asha", error), "acc", "max")
  T.is(s:report(1, { epoch = 1, acc = 0.9 }), "continue", "the first trial")
  T.is(s:report(2, { epoch = 1 }), "continue", "no metric")
  T.is(s:report(2, { acc = 0.1 }), "continue", "no epoch")
  T.is(s:report(2, { epoch = 1, acc = 0 / 0 }), "continue", "a NaN metric")
  T.is(s:report(2, { epoch = 0.5, acc = 0.1 }), "continue", "before the grace period")
  T.is(s:report(2, { epoch = 1, acc = 0.1 }), "stop", "then judged")
end)

T.run("bad scheduler specs are clear errors", function()
  local function check(spec) return function() ES.check(spec, function(m) error(m, 0) end) end end
  T.raises(check("hyperband"), [['scheduler' must be "asha" or "median"]], "an unknown name")
  T.raises(check({ "asha", grace = 2 }), "scheduler asha: unknown option 'grace' %(known: grace_period", "a misspelt option")
  T.raises(check({ "asha", reduction_factor = 1 }), "reduction_factor must be a number > 1", "reduction factor 1")
  T.raises(check({ "median", min_samples_required = 0 }), "min_samples_required must be an integer >= 1", "no samples")
  T.raises(check({ "asha", grace_period = 0 }), "grace_period must be a number > 0", "grace period 0")
  T.raises(check({ "asha", max_t = 0.5 }), "max_t must be a number >= grace_period", "max_t below the grace period")
  T.raises(check({ "median", time_attr = 3 }), "time_attr must name a reported field", "time_attr not a name")
  T.is(ES.check({ "asha", time_attr = "step" }, error).reduction_factor, 3, "defaults fill the rest")
end)

T.done_testing()
