-- test_distributions.lua: torch.distributions' Normal, Categorical,
-- Bernoulli, Uniform and Independent against PyTorch's log_prob, entropy,
-- mean, variance, kl_divergence and parameter gradients
-- (tests/ref/distributions.lua, written by
-- scripts/gen_distributions_ref.py); sampling statistics, rsample's
-- gradient, bad input.
local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
package.path = here .. "/?.lua;" .. package.path
local T = require("tap")
local torch = require("dplua")
torch.manual_seed(0)
local D = torch.distributions
local ref = dofile(here .. "/../ref/distributions.lua")

local function f64(v) return torch.tensor(v, { dtype = torch.float64 }) end
local cases = {   -- as the generator's
  normal = { "Normal", { loc = { 0.5, -1.0, 2.0 }, scale = { 1.5, 0.25, 3.0 } }, { 0.0, -0.75, 4.5 } },
  normal_broadcast = { "Normal", { loc = { { 0.5 }, { -1.0 } }, scale = { 1.0, 2.0, 0.5 } },
                       { { 0.0, 1.0, 2.0 }, { -1.0, 0.5, 3.0 } } },
  categorical_logits = { "Categorical", { logits = { { 0.5, -1.0, 2.0, 0.0 }, { 1.0, 1.0, -3.0, 0.25 } } }, { 2, 3 } },
  categorical_probs = { "Categorical", { probs = { { 0.2, 0.0, 0.5, 0.3 }, { 1.0, 1.0, 2.0, 4.0 } } }, { 3, 0 } },
  bernoulli_probs = { "Bernoulli", { probs = { 0.1, 0.5, 0.9, 0.3 } }, { 1.0, 0.0, 1.0, 0.0 } },
  bernoulli_logits = { "Bernoulli", { logits = { -2.0, 0.0, 3.5 } }, { 0.0, 1.0, 1.0 } },
  uniform = { "Uniform", { low = { 0.0, -2.0, 1.0 }, high = { 1.0, 3.0, 1.5 } }, { 0.25, 2.5, 1.25 } },
}

local function make(kind, params)
  if kind == "Normal" then return D.Normal(params.loc, params.scale) end
  if kind == "Uniform" then return D.Uniform(params.low, params.high) end
  return D[kind](params)
end

-- the generator's second distribution: each parameter times 0.8 plus 0.1
-- (Uniform's bounds widened by 0.5)
local function shifted(kind, raw)
  local p = {}
  for k, v in pairs(raw) do
    local t = f64(v)
    if k == "low" then p[k] = t - 0.5 elseif k == "high" then p[k] = t + 0.5 else p[k] = t * 0.8 + 0.1 end
  end
  return make(kind, p)
end

for _, name in ipairs(T.sorted_keys(cases)) do
  T.run(name .. " against PyTorch", function()
    local kind, raw, value = unpack(cases[name])
    local r = ref[name]
    local params = {}
    for k, v in pairs(raw) do params[k] = f64(v):requires_grad_() end
    local d = make(kind, params)
    local v = torch.tensor(value, { dtype = kind == "Categorical" and torch.int64 or torch.float64 })
    local lp, ent = d:log_prob(v), d:entropy()
    T.values_close(lp:detach():reshape(-1):tolist(), r.log_prob, 1e-12, 1e-12, name .. ": log_prob")
    T.values_close(ent:detach():reshape(-1):tolist(), r.entropy, 1e-12, 1e-12, name .. ": entropy")
    if r.mean then
      T.values_close(d.mean:detach():reshape(-1):tolist(), r.mean, 1e-12, 1e-12, name .. ": mean")
      T.values_close(d.variance:detach():reshape(-1):tolist(), r.variance, 1e-12, 1e-12, name .. ": variance")
    end
    local w = torch.arange(0, lp:numel(), { dtype = torch.float64 }):cos():reshape(lp:size())
    ;((lp * w):sum() + ent:sum()):backward()
    for k, p in pairs(params) do
      T.values_close(p.grad:reshape(-1):tolist(), r["d_" .. k], 1e-10, 1e-12, name .. ": the gradient of " .. k)
    end
    local kl = D.kl_divergence(make(kind, (function()
      local q = {}
      for k, t in pairs(params) do q[k] = t:detach() end
      return q
    end)()), shifted(kind, raw))
    T.values_close(kl:reshape(-1):tolist(), r.kl, 1e-12, 1e-12, name .. ": kl_divergence")
  end)
end

T.run("Normal.cdf against PyTorch", function()
  local n = D.Normal(f64({ 0.5, -1.0, 2.0 }), f64({ 1.5, 0.25, 3.0 }))
  T.values_close(n:cdf(f64({ 0.0, -0.75, 4.5 })):tolist(), ref.normal_cdf.cdf, 1e-14, 1e-15, "cdf")
end)

T.run("Independent against PyTorch", function()
  local base = D.Normal(f64({ { 0.5, 1.0 }, { -1.0, 2.0 } }), f64({ { 1.0, 2.0 }, { 0.5, 1.5 } }))
  local d = D.Independent(base, 1)
  local r = ref.independent_normal
  T.values_close(d:log_prob(f64({ { 0.0, 1.0 }, { 1.0, 1.0 } })):tolist(), r.log_prob, 1e-12, 1e-12, "log_prob")
  T.values_close(d:entropy():tolist(), r.entropy, 1e-12, 1e-12, "entropy")
  local q = D.Independent(D.Normal(torch.zeros(2, 2, { dtype = torch.float64 }), torch.ones(2, 2, { dtype = torch.float64 })), 1)
  T.values_close(D.kl_divergence(d, q):tolist(), r.kl, 1e-12, 1e-12, "kl_divergence")
  T.is(d.batch_shape, { 2 }, "batch_shape drops the reinterpreted dim")
  T.is(tostring(d), "Independent(Normal(loc: torch.Size([2, 2]), scale: torch.Size([2, 2])), 1)", "printing")
end)

T.run("sampling: shapes, statistics, gradients", function()
  local n = D.Normal(f64({ 1.0, -2.0 }), f64({ 0.5, 2.0 }))
  local s = n:sample({ 4000 })
  T.is(T.shape(s), { 4000, 2 }, "sample_shape then the batch's")
  T.ok(not s.requires_grad, "sample takes no gradient")
  T.close(s:mean(0)[0]:item(), 1.0, 0, 0.05, "Normal's mean")
  T.close(s:std(0)[1]:item(), 2.0, 0, 0.1, "Normal's std")
  local loc = f64({ 0.0 }):requires_grad_()
  D.Normal(loc, 1.0):rsample({ 3 }):sum():backward()
  T.is(loc.grad:item(), 3, "rsample's gradient reaches loc")
  local c = D.Categorical(f64({ 0.1, 0.0, 0.6, 0.3 }))
  local draws = c:sample({ 5000 })
  T.is(draws.dtype, torch.int64, "Categorical samples int64 indices")
  T.close(draws:eq(2):double():mean():item(), 0.6, 0, 0.04, "Categorical's frequency")
  T.is(draws:eq(1):sum():item(), 0, "a category of probability 0 is never drawn")
  T.is(T.shape(D.Categorical({ logits = torch.zeros(3, 5) }):sample({ 7 })), { 7, 3 }, "batched categorical samples")
  local b = D.Bernoulli(f64({ 0.25 })):sample({ 4000 })
  T.close(b:mean():item(), 0.25, 0, 0.03, "Bernoulli's frequency")
  local u = D.Uniform(-1, 3):sample({ 1000 })
  T.ok(u:min():item() >= -1 and u:max():item() < 3, "Uniform stays in [low, high)")
  T.is(u.dtype, torch.float32, "numbers as parameters give float32, as PyTorch")
end)

T.run("bad input names the problem", function()
  T.raises(function() D.Normal(0, -1) end, "Normal: expected scale to be positive", "a negative scale")
  T.lives(function() D.Normal(0, -1, { validate_args = false }) end, "validate_args = false lets it pass")
  T.raises(function() D.Categorical({ probs = torch.ones(3), logits = torch.ones(3) }) end,
           "expected either probs or logits", "both")
  T.raises(function() D.Categorical({ prob = torch.ones(3) }) end, "unknown option 'prob'", "a misspelt option")
  T.raises(function() D.Bernoulli(f64({ 1.5 })) end, "expected probs to be in %[0, 1%]", "a probability above 1")
  T.raises(function() D.Uniform(2, 1) end, "expected low to be less than high", "an empty interval")
  T.raises(function() D.Categorical(torch.ones(3)):log_prob(torch.tensor({ 3 }, { dtype = torch.int64 })) end,
           "Categorical.log_prob: expected the value to be a category index in %[0, 3%)", "a category out of range")
  T.raises(function() D.Bernoulli(f64({ 0.5 })):log_prob(f64({ 0.5 })) end, "the value to be 0 or 1", "a non-binary value")
  T.raises(function() D.kl_divergence(D.Normal(0, 1), D.Uniform(0, 1)) end, "no formula for Normal and Uniform",
           "kl of two kinds")
end)

T.done_testing()
