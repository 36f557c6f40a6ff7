-- test_lr_scheduler.lua: MultiStepLR, ExponentialLR, MultiplicativeLR,
-- ConstantLR, PolynomialLR, CosineAnnealingWarmRestarts, OneCycleLR, CyclicLR,
-- ChainedScheduler and ReduceLROnPlateau against the sequences PyTorch
-- gives (tests/ref/lr_scheduler.lua, written by
-- scripts/gen_lr_scheduler_ref.py): every lr after construction and after
-- each step (step(), step(epoch), step(metric)), and OneCycleLR's momenta;
-- state_dict round trips; argument errors. (StepLR, CosineAnnealingLR,
-- LinearLR, LambdaLR and SequentialLR are in test_optim.lua.)
local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
package.path = here .. "/?.lua;" .. package.path
local T = require("tap")
local torch = require("dplua")
local nn, optim = torch.nn, torch.optim
local S = optim.lr_scheduler
local ref = dofile(here .. "/../ref/lr_scheduler.lua")

-- an optimizer of one-parameter groups with these lrs, as the generator's
local function opt_of(groups, kind)
  local gs = {}
  for i, lr in ipairs(groups) do gs[i] = { params = { nn.Parameter(torch.zeros(1)) }, lr = lr } end
  if kind == "adam" then return optim.Adam(gs, { lr = groups[1], betas = { 0.9, 0.99 } }) end
  return optim.SGD(gs, { lr = groups[1], momentum = 0.9 })
end

local function odd_even(e) return e % 2 == 1 and 0.9 or 1.1 end

-- name = { make(opt), steps, groups, {kind=, epochs=, metrics=, momenta=} }
local P = ref.plateau_metrics
local P2 = {}
for i = 1, 2 * #P do P2[i] = P[(i - 1) % #P + 1] end
local cases = {
  multistep = { function(o) return S.MultiStepLR(o, { milestones = { 2, 5, 5, 9 }, gamma = 0.5 }) end, 12, { 0.1, 0.3 } },
  multistep_default = { function(o) return S.MultiStepLR(o, { 3 }) end, 5, { 0.1 } },
  multistep_epochs = { function(o) return S.MultiStepLR(o, { 2, 5, 5 }, 0.5) end, 5, { 0.1 }, { epochs = { 6, 1, 2, 5, 0 } } },
  exponential = { function(o) return S.ExponentialLR(o, { gamma = 0.9 }) end, 8, { 0.1, 1.0 } },
  exponential_epochs = { function(o) return S.ExponentialLR(o, 0.5) end, 3, { 0.1 }, { epochs = { 4, 2, 0 } } },
  multiplicative = { function(o) return S.MultiplicativeLR(o, odd_even) end, 8, { 0.1, 0.2 } },
  constant = { function(o) return S.ConstantLR(o, { factor = 0.5, total_iters = 3 }) end, 6, { 0.1 } },
  constant_default = { function(o) return S.ConstantLR(o) end, 7, { 0.3 } },
  constant_epochs = { function(o) return S.ConstantLR(o, 0.25, 2) end, 3, { 0.1 }, { epochs = { 5, 1, 2 } } },
  polynomial = { function(o) return S.PolynomialLR(o, { total_iters = 4, power = 2.0 }) end, 7, { 0.1, 0.5 } },
  polynomial_default = { function(o) return S.PolynomialLR(o) end, 7, { 0.1 } },
  polynomial_epochs = { function(o) return S.PolynomialLR(o, 4) end, 3, { 0.1 }, { epochs = { 2, 6, 1 } } },
  restarts = { function(o) return S.CosineAnnealingWarmRestarts(o, { T_0 = 3, eta_min = 0.01 }) end, 10, { 0.1, 0.05 } },
  restarts_mult = { function(o) return S.CosineAnnealingWarmRestarts(o, 2, 2) end, 15, { 0.1 } },
  restarts_epochs = { function(o) return S.CosineAnnealingWarmRestarts(o, { T_0 = 2, T_mult = 2, eta_min = 0.001 }) end,
                      8, { 0.1 }, { epochs = { 0.5, 1.25, 2.0, 3.5, 6.0, 6.75, 13.5, 1.0 } } },
  cyclic = { function(o) return S.CyclicLR(o, { base_lr = 0.01, max_lr = 0.1, step_size_up = 3 }) end, 14, { 0.1 },
             { momenta = true } },
  cyclic_triangular2_down = { function(o)
    return S.CyclicLR(o, { base_lr = { 0.01, 0.02 }, max_lr = { 0.1, 0.3 }, step_size_up = 2, step_size_down = 4,
                           mode = "triangular2" })
  end, 16, { 0.1, 0.2 }, { momenta = true } },
  cyclic_exp_range = { function(o)
    return S.CyclicLR(o, { base_lr = 0.001, max_lr = 0.01, step_size_up = 2, mode = "exp_range", gamma = 0.9,
                           base_momentum = 0.85, max_momentum = 0.95 })
  end, 9, { 0.1 }, { momenta = true } },
  cyclic_no_momentum = { function(o)
    return S.CyclicLR(o, { base_lr = 0.05, max_lr = 0.2, step_size_up = 2, cycle_momentum = false })
  end, 6, { 0.1 } },
  onecycle = { function(o) return S.OneCycleLR(o, { max_lr = 1.0, total_steps = 10 }) end, 10, { 0.1 }, { momenta = true } },
  onecycle_groups = { function(o)
    return S.OneCycleLR(o, { max_lr = { 1.0, 0.5 }, epochs = 3, steps_per_epoch = 4, pct_start = 0.25,
                             anneal_strategy = "linear", div_factor = 10.0, final_div_factor = 100.0 })
  end, 12, { 0.1, 0.2 }, { momenta = true } },
  onecycle_three_phase = { function(o)
    return S.OneCycleLR(o, { max_lr = 0.5, total_steps = 12, three_phase = true, base_momentum = 0.8, max_momentum = 0.9 })
  end, 12, { 0.1 }, { momenta = true } },
  onecycle_adam = { function(o) return S.OneCycleLR(o, { max_lr = 0.01, total_steps = 6 }) end, 6, { 0.1 },
                    { kind = "adam", momenta = true } },
  onecycle_no_momentum = { function(o) return S.OneCycleLR(o, { max_lr = 0.01, total_steps = 5, cycle_momentum = false }) end,
                           5, { 0.1 }, { momenta = true } },
  plateau = { function(o)
    return S.ReduceLROnPlateau(o, { factor = 0.5, patience = 2, threshold = 0.1, cooldown = 1, min_lr = 0.01 })
  end, #P, { 0.1, 0.04 }, { metrics = P } },
  plateau_default = { function(o) return S.ReduceLROnPlateau(o) end, #P2, { 0.1 }, { metrics = P2 } },
  plateau_max_abs = { function(o)
    return S.ReduceLROnPlateau(o, { mode = "max", factor = 0.1, patience = 1, threshold = 0.05, threshold_mode = "abs",
                                    min_lr = { 0.001, 0.05 } })
  end, #P, { 0.1, 0.2 }, { metrics = P } },
  chained = { function(o)
    return S.ChainedScheduler({ S.ConstantLR(o, { factor = 0.1, total_iters = 2 }), S.ExponentialLR(o, 0.9) })
  end, 6, { 0.1 } },
}

-- The sequence a case gives: lrs (and momenta) after construction and each step.
local function run(c)
  local how = c[4] or {}
  local o = opt_of(c[3], how.kind)
  local s = c[1](o)
  local function now()
    local lrs, ms = {}, {}
    for i, g in ipairs(o.param_groups) do
      lrs[i] = g.lr
      ms[i] = how.kind == "adam" and g.betas[1] or g.momentum
    end
    if how.momenta then return { lrs, ms } end
    return lrs
  end
  local seq = { now() }
  for i = 1, c[2] do
    o:step()
    if how.metrics then s:step(how.metrics[i])
    elseif how.epochs then s:step(how.epochs[i])
    else s:step() end
    seq[#seq + 1] = now()
  end
  return seq, s, o
end

for _, name in ipairs(T.sorted_keys(cases)) do
  T.run(name .. " against PyTorch", function()
    local seq, s = run(cases[name])
    local ok, why = T.compare_values(seq, ref[name], 1e-14, 1e-17)
    T.ok(ok, name .. ": the lr sequence", why)
    local last = seq[#seq]
    if cases[name][4] and cases[name][4].momenta then last = last[1] end
    T.is(s:get_last_lr(), last, name .. ": get_last_lr is the optimizer's lrs")
  end)
end

T.run("state_dict round trips continue the same sequence", function()
  for _, name in ipairs({ "multistep", "restarts_mult", "onecycle", "plateau", "polynomial" }) do
    local c = cases[name]
    local how = c[4] or {}
    local o1 = opt_of(c[3], how.kind)
    local s1 = c[1](o1)
    for i = 1, 4 do o1:step(); if how.metrics then s1:step(how.metrics[i]) else s1:step() end end
    local o2 = opt_of(c[3], how.kind)
    local s2 = c[1](o2)
    s2:load_state_dict(s1:state_dict())
    o2:load_state_dict(o1:state_dict())
    for i = 5, 7 do
      o1:step(); o2:step()
      if how.metrics then s1:step(how.metrics[i]); s2:step(how.metrics[i]) else s1:step(); s2:step() end
    end
    T.is(s2:get_last_lr(), s1:get_last_lr(), name .. ": a loaded scheduler continues where the saved one was")
  end
end)

T.run("argument errors", function()
  local o = opt_of({ 0.1 })
  T.raises(function() S.OneCycleLR(o, { max_lr = 1 }) end, "either total_steps OR %(epochs AND steps_per_epoch%)",
           "OneCycleLR without a length")
  T.raises(function() S.OneCycleLR(o, { max_lr = 1, total_steps = 10, anneal_strategy = "exp" }) end,
           'anneal_strategy must by one of "cos" or "linear"', "an unknown annealing")
  T.raises(function() S.OneCycleLR(o, { max_lr = { 1, 2 }, total_steps = 10 }) end, "expected 1 values for max_lr",
           "a max_lr per group of the wrong length")
  T.raises(function()
    local s = S.OneCycleLR(opt_of({ 0.1 }), { max_lr = 1, total_steps = 2 })
    for _ = 1, 3 do s:step() end
  end, "Tried to step 3 times. The specified number of total steps is 2", "stepping past total_steps")
  local plain = optim.SGD({ nn.Parameter(torch.zeros(1)) }, { lr = 0.1 })
  plain.defaults.momentum = nil
  T.raises(function() S.OneCycleLR(plain, { max_lr = 1, total_steps = 4 }) end, "must support momentum or beta1",
           "cycle_momentum with an optimizer without momentum")
  T.raises(function() S.ReduceLROnPlateau(o, { factor = 1 }) end, "Factor should be < 1.0", "a factor of 1")
  T.raises(function() S.ReduceLROnPlateau(o, { mode = "up" }) end, "mode up is unknown", "an unknown mode")
  T.raises(function() S.ReduceLROnPlateau(o, { threshold_mode = "x" }) end, "threshold mode x is unknown",
           "an unknown threshold mode")
  T.raises(function() S.ReduceLROnPlateau(o):step("loss") end, "expected the metric to be a number",
           "a metric that is not a number")
  T.raises(function() S.CosineAnnealingWarmRestarts(o, 0) end, "T_0 must be a positive integer", "T_0 = 0")
  T.raises(function() S.CosineAnnealingWarmRestarts(o, 2, 1.5) end, "Expected integer T_mult >= 1", "T_mult = 1.5")
  T.raises(function() S.CosineAnnealingWarmRestarts(o, 2):step(-1) end, "Expected non%-negative epoch", "a negative epoch")
  T.raises(function() S.MultiStepLR(o, 3) end, "expected milestones to be a list", "milestones not a list")
  T.raises(function() S.ConstantLR(o, 2) end, "factor expected to be between 0 and 1", "a factor above 1")
  T.raises(function() S.MultiplicativeLR(o, { odd_even, odd_even }) end, "Expected 1 lr_lambdas, but got 2",
           "lambdas for groups that are not there")
  T.raises(function() S.ChainedScheduler({}) end, "non%-empty list of schedulers", "an empty chain")
end)

T.run("ReduceLROnPlateau takes a one-element tensor", function()
  local o = opt_of({ 0.1 })
  local s = S.ReduceLROnPlateau(o, { patience = 0 })
  s:step(torch.tensor(1.0))
  s:step(torch.tensor(2.0))
  T.close(o.param_groups[1].lr, 0.01, 1e-15, 0, "no improvement past patience 0 cuts the lr by 10")
end)

T.run("CyclicLR: beta1 of Adam, errors", function()
  local w = torch.zeros(1):requires_grad_()
  local opt = torch.optim.Adam({ w }, { lr = 0.1 })
  local s = S.CyclicLR(opt, { base_lr = 0.001, max_lr = 0.01, step_size_up = 2, base_momentum = 0.8, max_momentum = 0.9 })
  T.close(opt.param_groups[1].betas[1], 0.9, 1e-12, 0, "beta1 starts at max_momentum")
  s:step(); s:step()
  T.close(opt.param_groups[1].lr, 0.01, 1e-12, 0, "the lr at the top of the cycle")
  T.close(opt.param_groups[1].betas[1], 0.8, 1e-12, 0, "beta1 at base_momentum there")
  T.is(opt.param_groups[1].betas[2], 0.999, "beta2 untouched")
  T.raises(function() S.CyclicLR(opt, { base_lr = 0.1, max_lr = 1, mode = "cosine" }) end,
           'mode must be "triangular", "triangular2" or "exp_range"', "an unknown mode")
  T.raises(function() S.CyclicLR(opt, { max_lr = 1 }) end, "expected base_lr and max_lr", "no base_lr")
  local rms = torch.optim.Adagrad({ torch.zeros(1):requires_grad_() })
  T.raises(function() S.CyclicLR(rms, { base_lr = 0.1, max_lr = 1 }) end, "must support momentum or beta1",
           "cycle_momentum without momentum")
end)

T.done_testing()
