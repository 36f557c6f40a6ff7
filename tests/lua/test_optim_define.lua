-- test_optim_define.lua: RMSprop, Adagrad and Adadelta (torch.optim.define,
-- tensor ops on the flat buckets) against PyTorch's parameters after three
-- steps with fixed gradients (tests/ref/optim_define.lua, written by
-- scripts/gen_optim_define_ref.py), on the fused path (every gradient
-- present) and the per-parameter one (one missing); a Lion optimizer
-- defined in this file against its published rule; state dicts; errors.
local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
package.path = here .. "/?.lua;" .. package.path
local T = require("tap")
local torch = require("dplua")
local nn, optim = torch.nn, torch.optim
local ref = dofile(here .. "/../ref/optim_define.lua")

local Lion = optim.define("Lion", {
  defaults = { lr = 1e-4, betas = { 0.9, 0.99 }, weight_decay = 0 },
  state = { "exp_avg" },
  update = function(g, p, grad, s)
    local b1, b2 = g.betas[1], g.betas[2]
    p:mul_(1 - g.lr * g.weight_decay)
    p:add_((s.exp_avg * b1 + grad * (1 - b1)):sign(), -g.lr)
    s.exp_avg:mul_(b2):add_(grad, 1 - b2)
  end,
})

local cases = {
  rmsprop = function(ps) return optim.RMSprop(ps, { lr = 0.01 }) end,
  rmsprop_momentum_wd = function(ps)
    return optim.RMSprop(ps, { lr = 0.02, alpha = 0.9, eps = 1e-6, weight_decay = 0.1, momentum = 0.8 })
  end,
  rmsprop_centered = function(ps) return optim.RMSprop(ps, { lr = 0.01, centered = true }) end,
  rmsprop_centered_momentum = function(ps) return optim.RMSprop(ps, { lr = 0.01, momentum = 0.5, centered = true }) end,
  adagrad = function(ps) return optim.Adagrad(ps, { lr = 0.1 }) end,
  adagrad_all = function(ps)
    return optim.Adagrad(ps, { lr = 0.1, lr_decay = 0.05, weight_decay = 0.2, initial_accumulator_value = 0.5, eps = 1e-6 })
  end,
  adadelta = function(ps) return optim.Adadelta(ps) end,
  adadelta_all = function(ps) return optim.Adadelta(ps, { lr = 0.5, rho = 0.8, eps = 1e-4, weight_decay = 0.1 }) end,
  lion = function(ps) return Lion(ps, { lr = 0.01, betas = { 0.9, 0.99 }, weight_decay = 0.1 }) end,
  rmsprop_missing = { function(ps) return optim.RMSprop(ps, { lr = 0.01, momentum = 0.9 }) end, { 2, 1 } },
  adagrad_missing = { function(ps)
    return optim.Adagrad(ps, { lr = 0.1, lr_decay = 0.1, initial_accumulator_value = 0.1 })
  end, { 1, 2 } },
}

-- three steps with the reference's gradients (none for `missing` = {step,
-- param}); the parameters after each
local function run(make, missing)
  local ps = {}
  for i, p in ipairs(ref.p0) do ps[i] = nn.Parameter(torch.tensor(p, { dtype = torch.float64 })) end
  local opt = make(ps)
  local out = {}
  for k, gs in ipairs(ref.grads) do
    for i, p in ipairs(ps) do
      if missing and missing[1] == k and missing[2] == i then p.grad = nil
      else p.grad = torch.tensor(gs[i], { dtype = torch.float64 }) end
    end
    opt:step()
    local now = {}
    for i, p in ipairs(ps) do now[i] = p:tolist() end
    out[k] = now
  end
  return out, opt, ps
end

for _, name in ipairs(T.sorted_keys(cases)) do
  T.run(name .. " against PyTorch", function()
    local c = cases[name]
    local make, missing = c, nil
    if type(c) == "table" then make, missing = c[1], c[2] end
    local got = run(make, missing)
    local ok, why = T.compare_values(got, ref[name], 1e-12, 1e-14)
    T.ok(ok, name .. ": the parameters after each of three steps", why)
  end)
end

T.run("state dicts resume exactly", function()
  for _, name in ipairs({ "rmsprop_centered_momentum", "adagrad_all", "adadelta_all", "lion" }) do
    -- two steps, save, a fresh optimizer loads it and takes the third
    local ps = {}
    for i, p in ipairs(ref.p0) do ps[i] = nn.Parameter(torch.tensor(p, { dtype = torch.float64 })) end
    local opt = cases[name](ps)
    for k = 1, 2 do
      for i, p in ipairs(ps) do p.grad = torch.tensor(ref.grads[k][i], { dtype = torch.float64 }) end
      opt:step()
    end
    local sd = opt:state_dict()
    T.is(sd.state[0].step, 2, name .. ": the state dict holds the step")
    local opt2 = cases[name](ps)
    opt2:load_state_dict(sd)
    for i, p in ipairs(ps) do p.grad = torch.tensor(ref.grads[3][i], { dtype = torch.float64 }) end
    opt2:step()
    local now = {}
    for i, p in ipairs(ps) do now[i] = p:tolist() end
    local ok, why = T.compare_values(now, ref[name][3], 1e-12, 1e-14)
    T.ok(ok, name .. ": the third step from a loaded state", why)
  end
end)

T.run("float32 parameters on the fused path", function()
  local ps = {}
  for i, p in ipairs(ref.p0) do ps[i] = nn.Parameter(torch.tensor(p)) end
  local opt = optim.RMSprop(ps, { lr = 0.01, centered = true })
  for k, gs in ipairs(ref.grads) do
    for i, p in ipairs(ps) do p.grad = torch.tensor(gs[i]) end
    opt:step()
  end
  local now = {}
  for i, p in ipairs(ps) do now[i] = p:tolist() end
  local ok, why = T.compare_values(now, ref.rmsprop_centered[3], 1e-5, 1e-6)
  T.ok(ok, "float32 within float32 rounding", why)
end)

T.run("argument errors", function()
  local p = { nn.Parameter(torch.zeros(2)) }
  T.raises(function() optim.RMSprop(p, { lr = -1 }) end, "RMSprop: Invalid learning rate: %-1", "a negative lr")
  T.raises(function() optim.RMSprop(p, { alpha = -0.5 }) end, "Invalid alpha value", "a negative alpha")
  T.raises(function() optim.RMSprop(p, { centered = 1 }) end, "centered to be a boolean", "centered not a boolean")
  T.raises(function() optim.Adagrad(p, { lr_decay = -1 }) end, "Invalid lr_decay value", "a negative lr_decay")
  T.raises(function() optim.Adadelta(p, { rho = 1.5 }) end, "Invalid rho value: 1.5", "rho above 1")
  T.raises(function() optim.Adadelta(p, { betas = 1 }) end, "unknown option 'betas'", "an option it does not have")
  T.raises(function() optim.define("X", {}) end, "expected {defaults = ", "define without update")
end)

T.done_testing()
