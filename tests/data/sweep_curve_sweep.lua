-- sweep_curve_sweep.lua: the sweep of tests/sh/test_sweep_prune.sh, with
-- ASHA (rungs at epochs 1, 2 and 4: the better half goes on). Trials run
-- one at a time, in the order of a, so the rule's verdicts are known:
-- epoch 1: a = 0.5 first (on), 0.9 > 0.5 (on), 0.3 < median{.5,.9} = .7
-- (pruned), 0.6 > median{.3,.5,.9} = .5 (on); epoch 2: 0.5 and 0.9 on,
-- 0.6 < median{.5,.9} = .7 (pruned); epoch 4: 0.5 and 0.9 on.
return {
  script = "sweep_curve.lua",
  args = {},
  space = { a = {0.5, 0.9, 0.3, 0.6} },
  metric = "acc", mode = "max",
  parallel = 1,
  timeout = 60,
  scheduler = { "asha", grace_period = 1, reduction_factor = 2 },
}
