-- test_adafactor.lua: torch.optim.Adafactor against PyTorch's (2.5 or
-- later): the parameters after each of four steps with fixed gradients
-- (tests/ref/adafactor.lua, written by scripts/gen_adafactor_ref.py) for
-- a vector, a matrix and a 3-d tensor, every option, a missing gradient,
-- float64 and float32; the state dict's shapes and values; a step from a
-- loaded state; bad options and states.
local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
package.path = here .. "/?.lua;" .. package.path
local T = require("tap")
local torch = require("dplua")
local nn, optim = torch.nn, torch.optim
local ref = dofile(here .. "/../ref/adafactor.lua")

local function params(dtype)
  local ps = {}
  for i, v in ipairs(ref.p0) do
    ps[i] = nn.Parameter(torch.tensor(v, { dtype = torch.float64 }):view(ref.shapes[i]):to(dtype))
  end
  return ps
end

local function set_grads(ps, c, k, dtype)
  for i, p in ipairs(ps) do
    if c.missing and c.missing[1] == k and c.missing[2] == i then p.grad = nil
    else p.grad = (torch.tensor(ref.grads[k][i], { dtype = torch.float64 }) * c.scale):view(ref.shapes[i]):to(dtype) end
  end
end

local function flat(ps)
  local out = {}
  for i, p in ipairs(ps) do out[i] = p:detach():double():reshape(-1):tolist() end
  return out
end

for _, name in ipairs(T.sorted_keys(ref.cases)) do
  local c = ref.cases[name]
  for _, dt in ipairs({ { torch.float64, 1e-12, 1e-14 }, { torch.float32, 2e-5, 1e-6 } }) do
    T.run(string.format("%s in %s against PyTorch", name, tostring(dt[1])), function()
      local ps = params(dt[1])
      local opt = optim.Adafactor(ps, c.opts)
      for k = 1, #ref.grads do
        set_grads(ps, c, k, dt[1])
        opt:step()
        local ok, why = T.compare_values(flat(ps), c[tostring(dt[1]):match("float%d+")][k], dt[2], dt[3])
        T.ok(ok, string.format("%s, %s: the parameters after step %d", name, tostring(dt[1]), k), why)
      end
    end)
  end
end

T.run("the state dict: PyTorch's entries and shapes, and a step from it equals the step without it", function()
  local c = ref.cases.all
  local ps = params(torch.float64)
  local opt = optim.Adafactor(ps, c.opts)
  for k = 1, #ref.grads do set_grads(ps, c, k, torch.float64); opt:step() end
  local sd = opt:state_dict()
  for i, want in ipairs(c.state) do
    local st = sd.state[i - 1]
    T.is(T.sorted_keys(st), T.sorted_keys(want), "parameter " .. i .. ": the state's entries")
    T.is(st.step, want.step, "parameter " .. i .. ": step")
    for k, v in pairs(want) do
      if k ~= "step" then
        T.is(st[k]:size(), v.shape, string.format("parameter %d: %s's shape", i, k))
        local ok, why = T.compare_values(st[k]:reshape(-1):tolist(), v.values, 1e-12, 1e-300)
        T.ok(ok, string.format("parameter %d: %s", i, k), why)
      end
    end
  end
  T.is(sd.param_groups[1].eps[2], 1e-2, "the group's eps")
  -- one step more from the state dict, loaded into a fresh optimizer
  local qs = params(torch.float64)
  torch.no_grad(function() for i, q in ipairs(qs) do q:copy_(ps[i]) end end)
  local fresh = optim.Adafactor(qs, c.opts)
  fresh:load_state_dict(sd)
  set_grads(ps, c, 1, torch.float64); opt:step()
  set_grads(qs, c, 1, torch.float64); fresh:step()
  local ok, why = T.compare_values(flat(qs), flat(ps), 0, 0)
  T.ok(ok, "a step from the loaded state is the same step", why)
  T.is(opt.state[ps[2]].row_var:size(), { 3, 1 }, "opt.state[p] holds the matrix's row factor")
end)

T.run("bad options and states are clear errors", function()
  local p = nn.Parameter(torch.zeros(2, 3))
  T.raises(function() optim.Adafactor({ p }, { lr = -1 }) end, "Learning rate should be >= 0 but is: %-1", "lr")
  T.raises(function() optim.Adafactor({ p }, { beta2_decay = 0.5 }) end, "beta2_decay should be <= 0", "beta2_decay")
  T.raises(function() optim.Adafactor({ p }, { eps = { -1, 1e-3 } }) end, "epsilon1 should be >= 0", "eps1")
  T.raises(function() optim.Adafactor({ p }, { eps = { nil, -1 } }) end, "epsilon2 should be >= 0", "eps2")
  T.raises(function() optim.Adafactor({ p }, { eps = 1e-3 }) end, "expected eps to be a pair", "eps a number")
  T.raises(function() optim.Adafactor({ p }, { d = 0.5 }) end, "Clipping threshold d should be >= 1", "d")
  T.raises(function() optim.Adafactor({ p }, { weight_decay = -0.1 }) end, "weight_decay should be >= 0", "wd")
  T.raises(function() optim.Adafactor({ p }, { betas = { 0.9, 0.99 } }) end, "unknown option 'betas'", "betas")
  T.raises(function() optim.Adafactor({ p }, { capturable = true }) end, "unknown option 'capturable'",
           "capturable (PyTorch's Adafactor has none)")
  T.lives(function() optim.Adafactor({ p }, { foreach = false }) end, "foreach, which PyTorch's has, is accepted")
  local opt = optim.Adafactor({ p })
  p.grad = torch.ones(2, 3)
  opt:step()
  local sd = opt:state_dict()
  sd.state[0].row_var = torch.zeros(3, 1)
  T.raises(function() optim.Adafactor({ p }):load_state_dict(sd) end,
           "state%[0%]%.row_var has shape torch.Size%(%[3, 1%]%), expected torch.Size%(%[2, 1%]%)", "a wrong row_var")
  sd.state[0].row_var = nil
  T.raises(function() optim.Adafactor({ p }):load_state_dict(sd) end, "state%[0%] has a step but no row_var",
           "no row_var")
  T.raises(function()
    torch.distributed.optim.ZeroRedundancyOptimizer({ p }, { optimizer_class = optim.Adafactor })
  end, "Adafactor's update is not elementwise", "under ZeroRedundancyOptimizer")
end)

T.done_testing()
