-- test_distributions.lua: torch.distributions (Normal, Categorical,
-- Bernoulli, Uniform, Independent, the others of the generator's MORE
-- table, Multinomial and the relaxed distributions) against PyTorch's log_prob, entropy, mean, variance, cdf,
-- kl_divergence and parameter gradients
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

-- the generator's MORE cases: constructor, positional parameters, keyword
-- parameters, the value, the second distribution's parameters for the kl
local more = {
  exponential = { "Exponential", { { "rate", { 0.5, 2.0, 7.0 } } }, nil, { 0.3, 1.5, 0.01 }, { { 1.5, 0.25, 2.0 } } },
  laplace = { "Laplace", { { "loc", { 0.5, -1.0, 2.0 } }, { "scale", { 1.5, 0.25, 3.0 } } }, nil, { 0.0, -0.75, 4.5 },
              { { 0.0, -0.5, 2.5 }, { 1.0, 0.5, 2.0 } } },
  cauchy = { "Cauchy", { { "loc", { 0.5, -1.0 } }, { "scale", { 1.5, 0.25 } } }, nil, { 0.0, 3.0 } },
  log_normal = { "LogNormal", { { "loc", { 0.5, -1.0 } }, { "scale", { 1.5, 0.25 } } }, nil, { 0.7, 0.4 },
                 { { 0.0, -0.5 }, { 1.0, 0.5 } } },
  half_normal = { "HalfNormal", { { "scale", { 1.5, 0.25 } } }, nil, { 0.7, 0.4 }, { { 1.0, 0.5 } } },
  gamma = { "Gamma", { { "concentration", { 0.5, 2.0, 9.0 } }, { "rate", { 1.5, 0.25, 3.0 } } }, nil, { 0.3, 5.0, 2.5 },
            { { 1.0, 2.5, 4.0 }, { 1.0, 0.5, 2.0 } } },
  chi2 = { "Chi2", { { "df", { 1.0, 3.5, 10.0 } } }, nil, { 0.3, 5.0, 12.0 } },
  beta = { "Beta", { { "concentration1", { 0.5, 2.0, 9.0 } }, { "concentration0", { 1.5, 0.25, 3.0 } } }, nil,
           { 0.3, 0.9, 0.5 }, { { 1.0, 2.5, 4.0 }, { 1.0, 0.5, 2.0 } } },
  dirichlet = { "Dirichlet", { { "concentration", { { 0.5, 2.0, 3.0 }, { 1.0, 1.0, 7.5 } } } }, nil,
                { { 0.2, 0.3, 0.5 }, { 0.1, 0.1, 0.8 } }, { { { 1.0, 1.5, 2.0 }, { 0.5, 3.0, 3.0 } } } },
  poisson = { "Poisson", { { "rate", { 0.5, 4.0, 30.0 } } }, nil, { 0.0, 3.0, 27.0 }, { { 1.0, 2.0, 33.0 } } },
  geometric = { "Geometric", {}, { probs = { 0.2, 0.5, 0.9 } }, { 0.0, 3.0, 1.0 } },
  binomial = { "Binomial", { { "total_count", { 10.0, 4.0, 25.0 } } }, { probs = { 0.2, 0.5, 0.9 } }, { 3.0, 0.0, 25.0 } },
  binomial_logits = { "Binomial", { { "total_count", { 10.0, 4.0 } } }, { logits = { -1.5, 2.0 } }, { 3.0, 4.0 } },
  gumbel = { "Gumbel", { { "loc", { 0.5, -1.0, 2.0 } }, { "scale", { 1.5, 0.25, 3.0 } } }, nil, { 0.0, -0.75, 4.5 } },
  weibull = { "Weibull", { { "scale", { 0.5, 2.0, 1.0 } }, { "concentration", { 1.5, 0.25, 3.0 } } }, nil, { 0.3, 5.0, 1.2 } },
  pareto = { "Pareto", { { "scale", { 0.5, 2.0 } }, { "alpha", { 1.5, 3.5 } } }, nil, { 0.7, 4.0 } },
  student_t = { "StudentT", { { "df", { 0.8, 3.0, 12.0 } }, { "loc", { 0.5, -1.0, 2.0 } }, { "scale", { 1.5, 0.25, 3.0 } } },
                nil, { 0.0, -0.75, 4.5 } },
  one_hot_categorical = { "OneHotCategorical", {}, { probs = { { 0.2, 0.3, 0.5 }, { 0.6, 0.3, 0.1 } } },
                          { { 0.0, 1.0, 0.0 }, { 0.0, 0.0, 1.0 } } },
  multivariate_normal = { "MultivariateNormal", { { "loc", { { 1.0, -1.0, 0.5 }, { 0.0, 2.0, 0.0 } } } },
                          { covariance_matrix = { { 2.0, 0.5, 0.1 }, { 0.5, 1.0, -0.3 }, { 0.1, -0.3, 1.5 } } },
                          { { 0.5, 0.2, 0.0 }, { 1.0, 1.0, -1.0 } } },
  multivariate_normal_scale_tril = { "MultivariateNormal", { { "loc", { 1.0, -1.0 } } },
                                     { scale_tril = { { 1.5, 0.0 }, { 0.5, 0.75 } } }, { 0.5, 0.2 } },
  multivariate_normal_precision = { "MultivariateNormal", { { "loc", { 1.0, -1.0 } } },
                                    { precision_matrix = { { 2.0, 0.5 }, { 0.5, 1.0 } } }, { 0.5, 0.2 } },
  half_cauchy = { "HalfCauchy", { { "scale", { 1.5, 0.25 } } }, nil, { 0.7, 0.4 } },
  negative_binomial = { "NegativeBinomial", { { "total_count", { 3.0, 5.0, 0.5 } } }, { probs = { 0.3, 0.6, 0.1 } },
                        { 2.0, 7.0, 0.0 } },
  negative_binomial_logits = { "NegativeBinomial", { { "total_count", { 3.0, 5.0 } } }, { logits = { -1.0, 0.5 } },
                               { 4.0, 1.0 } },
  kumaraswamy = { "Kumaraswamy", { { "concentration1", { 0.5, 2.0, 5.0 } }, { "concentration0", { 1.5, 3.0, 0.7 } } },
                  nil, { 0.3, 0.9, 0.5 } },
  fisher_snedecor = { "FisherSnedecor", { { "df1", { 1.5, 3.0, 10.0 } }, { "df2", { 5.0, 7.0, 20.0 } } }, nil,
                      { 0.3, 1.2, 2.5 } },
  continuous_bernoulli = { "ContinuousBernoulli", {}, { probs = { 0.2, 0.5, 0.7, 0.4995, 0.999 } }, { 0.3, 0.6, 0.9, 0.1, 0.5 } },
  continuous_bernoulli_logits = { "ContinuousBernoulli", {}, { logits = { -1.5, 0.0, 3.0 } }, { 0.3, 0.6, 1.0 } },
  low_rank_multivariate_normal = { "LowRankMultivariateNormal", { { "loc", { { 1.0, -1.0, 0.5 }, { 0.0, 2.0, 0.0 } } },
                                   { "cov_factor", { { 1.0, 0.5 }, { 0.2, -0.3 }, { 0.4, 0.8 } } },
                                   { "cov_diag", { 0.5, 1.0, 2.0 } } }, nil, { { 0.5, 0.2, 0.0 }, { 1.0, 1.0, -1.0 } } },
}

local function flat(t) return t:detach():reshape(-1):tolist() end
-- the entropies of the gamma family differentiate digamma: PyTorch's
-- trigamma is good to about 1e-9 (pi^2/6 at 1 reads 1.6449340676)
local grad_rtol = { gamma = 1e-8, chi2 = 1e-8, beta = 1e-8, dirichlet = 1e-8, student_t = 1e-8, weibull = 1e-8,
                    kumaraswamy = 1e-8, negative_binomial = 1e-8, negative_binomial_logits = 1e-8,
                    fisher_snedecor = 1e-8 }

for _, name in ipairs(T.sorted_keys(more)) do
  T.run(name .. " against PyTorch", function()
    local kind, pos, kw, value, kl_params = unpack(more[name])
    local r = ref[name]
    local params, args, grads = {}, {}, {}
    for i, pv in ipairs(pos) do
      local t = f64(pv[2])
      if pv[1] ~= "total_count" then t:requires_grad_(); grads[pv[1]] = t end
      args[i] = t
    end
    if kw then
      for k, v in pairs(kw) do params[k] = f64(v):requires_grad_(); grads[k] = params[k] end
      args[#args + 1] = params
    end
    local d = D[kind](unpack(args, 1, #pos + (kw and 1 or 0)))
    local lp = d:log_prob(f64(value))
    T.values_close(flat(lp), r.log_prob, 1e-12, 1e-12, name .. ": log_prob")
    local w = torch.arange(0, lp:numel(), { dtype = torch.float64 }):cos():reshape(lp:size())
    local loss = (lp * w):sum()
    if r.entropy then
      local ent = d:entropy()
      T.values_close(flat(ent), r.entropy, 1e-12, 1e-12, name .. ": entropy")
      loss = loss + ent:sum()
    end
    T.values_close(flat(d.mean), r.mean, 1e-12, 1e-12, name .. ": mean")
    T.values_close(flat(d.variance), r.variance, 1e-12, 1e-12, name .. ": variance")
    loss:backward()
    for k, g in pairs(grads) do
      if r["d_" .. k] then
        T.values_close(flat(g.grad), r["d_" .. k], grad_rtol[name] or 1e-10, grad_rtol[name] or 1e-12,
                       name .. ": the gradient of " .. k)
      end
    end
    if r.cdf then T.values_close(flat(d:cdf(f64(value))), r.cdf, 1e-12, 1e-12, name .. ": cdf") end
    if kl_params then
      local p_args, q_args = {}, {}
      for i, a in ipairs(args) do p_args[i] = a:detach() end
      for i, v in ipairs(kl_params) do q_args[i] = f64(v) end
      local kl = D.kl_divergence(D[kind](unpack(p_args)), D[kind](unpack(q_args)))
      T.values_close(flat(kl), r.kl, 1e-12, 1e-12, name .. ": kl_divergence")
    end
  end)
end

local function weighted(lp) return (lp * torch.arange(0, lp:numel(), { dtype = torch.float64 }):cos():reshape(lp:size())):sum() end

T.run("Multinomial and the relaxed distributions against PyTorch", function()
  local r = ref.multinomial
  local probs = f64({ { 0.2, 0.3, 0.5 }, { 0.6, 0.3, 0.1 } }):requires_grad_()
  local mn = D.Multinomial(6, probs)
  local lp = mn:log_prob(f64({ { 1, 2, 3 }, { 6, 0, 0 } }))
  T.values_close(flat(lp), r.log_prob, 1e-12, 1e-12, "Multinomial: log_prob")
  T.values_close(flat(mn.mean), r.mean, 1e-12, 1e-12, "Multinomial: mean")
  T.values_close(flat(mn.variance), r.variance, 1e-12, 1e-12, "Multinomial: variance")
  weighted(lp):backward()
  T.values_close(flat(probs.grad), r.d_probs, 1e-10, 1e-12, "Multinomial: the gradient of probs")
  r = ref.relaxed_bernoulli
  local logits = f64({ -1.0, 0.5, 2.0 }):requires_grad_()
  lp = D.RelaxedBernoulli(f64(0.7), { logits = logits }):log_prob(f64({ 0.2, 0.5, 0.95 }))
  T.values_close(flat(lp), r.log_prob, 1e-12, 1e-12, "RelaxedBernoulli: log_prob")
  weighted(lp):backward()
  T.values_close(flat(logits.grad), r.d_logits, 1e-10, 1e-12, "RelaxedBernoulli: the gradient of logits")
  r = ref.relaxed_one_hot_categorical
  logits = f64({ { 0.2, -0.5, 1.0 }, { 0.0, 0.3, -1.2 } }):requires_grad_()
  local temperature = f64(0.6):requires_grad_()
  lp = D.RelaxedOneHotCategorical(temperature, { logits = logits }):log_prob(f64({ { 0.2, 0.3, 0.5 }, { 0.7, 0.2, 0.1 } }))
  T.values_close(flat(lp), r.log_prob, 1e-12, 1e-12, "RelaxedOneHotCategorical: log_prob")
  weighted(lp):backward()
  T.values_close(flat(logits.grad), r.d_logits, 1e-10, 1e-12, "RelaxedOneHotCategorical: the gradient of logits")
  T.values_close({ temperature.grad:item() }, r.d_temperature, 1e-10, 1e-12,
                 "RelaxedOneHotCategorical: the gradient of the temperature")
end)

T.run("the new families' draws: moments, supports, shapes", function()
  torch.manual_seed(11)
  local n = 20000
  local function moments(x)
    return x:mean(0), x:var(0)
  end
  local nb = D.NegativeBinomial(f64({ 3.0, 8.0 }), f64({ 0.3, 0.6 }))
  local m, v = moments(nb:sample({ n }))
  T.tensor_close(m, nb.mean, 0.05, 0, "NegativeBinomial: the draws' mean")
  T.tensor_close(v, nb.variance, 0.1, 0, "NegativeBinomial: the draws' variance")
  local mn = D.Multinomial(10, f64({ 0.2, 0.3, 0.5 }))
  local x = mn:sample({ n })
  T.is(T.shape(x), { n, 3 }, "Multinomial: sample shape")
  T.ok(x:sum(-1):eq(10):all():item(), "Multinomial: every draw's counts sum to total_count")
  T.tensor_close(x:mean(0), mn.mean, 0.03, 0, "Multinomial: the draws' mean")
  local ku = D.Kumaraswamy(f64({ 2.0 }), f64({ 3.0 }))
  m, v = moments(ku:sample({ n }))
  T.tensor_close(m, ku.mean, 0.03, 0, "Kumaraswamy: the draws' mean")
  T.tensor_close(v, ku.variance, 0.08, 0, "Kumaraswamy: the draws' variance")
  local fs = D.FisherSnedecor(f64({ 6.0 }), f64({ 12.0 }))
  m = fs:sample({ n }):mean(0)
  T.tensor_close(m, fs.mean, 0.05, 0, "FisherSnedecor: the draws' mean")
  local lr = D.LowRankMultivariateNormal(f64({ 1.0, -1.0 }), f64({ { 1.0 }, { 0.5 } }), f64({ 0.5, 2.0 }))
  x = lr:sample({ n })
  local c = x - x:mean(0)
  T.tensor_close(c:t():matmul(c) / (n - 1), lr.covariance_matrix, 0.08, 0.03, "LowRankMultivariateNormal: the draws' covariance")
  local bin = torch.binomial(f64({ 10, 40 }):expand(n, 2):contiguous(), f64({ 0.3, 0.8 }):expand(n, 2):contiguous())
  T.tensor_close(bin:mean(0), f64({ 3, 32 }), 0.03, 0, "torch.binomial: the draws' mean")
  local hc = D.HalfCauchy(f64({ 2.0 }))
  T.tensor_close(hc:sample({ n }):median(0), f64({ 2.0 }), 0.05, 0, "HalfCauchy: the draws' median is the scale")
  local rb = D.RelaxedBernoulli(f64(0.5), f64({ 0.3 })):rsample({ 100 })
  T.ok(rb:gt(0):all():item() and rb:lt(1):all():item(), "RelaxedBernoulli: draws in (0, 1)")
  local logits = f64({ 0.1, 0.4, -0.3 }):requires_grad_()
  local ro = D.RelaxedOneHotCategorical(f64(0.5), { logits = logits }):rsample({ 5 })
  T.tensor_close(ro:sum(-1), torch.ones(5, { dtype = torch.float64 }), 1e-12, 1e-12, "RelaxedOneHotCategorical: on the simplex")
  ro:select(-1, 0):sum():backward()
  T.ok(logits.grad ~= nil and logits.grad:abs():sum():item() > 0, "RelaxedOneHotCategorical: rsample carries a gradient")
end)

T.run("Wishart against PyTorch: log_prob, entropy, moments, gradients, each matrix argument; draws", function()
  local r = ref.wishart
  local df = f64({ 5.0, 3.5 }):requires_grad_()
  local cov = f64({ { 2.0, 0.5, 0.1 }, { 0.5, 1.0, -0.3 }, { 0.1, -0.3, 1.5 } }):requires_grad_()
  local v = f64({ { { 3.0, 1.0, 0.2 }, { 1.0, 2.0, 0.1 }, { 0.2, 0.1, 1.0 } }, { { 1.0, 0.2, 0.0 }, { 0.2, 2.0, 0.5 }, { 0.0, 0.5, 3.0 } } })
  local w = D.Wishart(df, { covariance_matrix = cov })
  local lp, ent = w:log_prob(v), w:entropy()
  T.values_close(flat(lp), r.log_prob, 1e-12, 1e-12, "log_prob")
  T.values_close(flat(ent), r.entropy, 1e-12, 1e-12, "entropy")
  T.values_close(flat(w.mean), r.mean, 1e-12, 1e-12, "mean")
  T.values_close(flat(w.variance), r.variance, 1e-12, 1e-12, "variance")
  ;(weighted(lp) + ent:sum()):backward()
  T.values_close(flat(df.grad), r.d_df, 1e-8, 1e-10, "the gradient of df")
  T.values_close(flat(cov.grad), r.d_cov, 1e-10, 1e-12, "the gradient of the covariance")
  local x = f64({ { 2.0, 0.5 }, { 0.5, 3.0 } })
  T.values_close({ D.Wishart(f64(4.0), { scale_tril = f64({ { 1.0, 0.0 }, { 0.3, 2.0 } }) }):log_prob(x):item() },
                 ref.wishart_scale_tril.log_prob, 1e-12, 1e-12, "from scale_tril")
  T.values_close({ D.Wishart(f64(4.0), { precision_matrix = f64({ { 2.0, 0.5 }, { 0.5, 1.0 } }) }):log_prob(x):item() },
                 ref.wishart_precision.log_prob, 1e-12, 1e-12, "from precision_matrix")
  torch.manual_seed(21)
  local w2 = D.Wishart(f64(5.0), f64({ { 2.0, 0.5 }, { 0.5, 1.0 } }))
  local s = w2:sample({ 20000 })
  T.tensor_close(s:mean(0), w2.mean, 0.03, 0.05, "the draws' mean")
  T.tensor_close(s:var(0), w2.variance, 0.08, 0.3, "the draws' variance")
  T.ok(D.constraints.positive_definite:check(s:narrow(0, 0, 50)):all():item(), "draws are positive-definite")
  T.raises(function() D.Wishart(f64(1.0), f64({ { 2.0, 0.5 }, { 0.5, 1.0 } })) end, "df to be greater than p %- 1 = 1",
           "df too small")
end)

T.run("LKJCholesky against PyTorch; its draws' correlations", function()
  local r = ref.lkj_cholesky
  local c = f64({ 0.5, 3.0 }):requires_grad_()
  local v = f64({ { 1, 0, 0, 0 }, { 0.6, 0.8, 0, 0 }, { 0, 0.6, 0.8, 0 }, { 0.36, 0.48, 0, 0.8 } })
  local lp = D.LKJCholesky(4, c):log_prob(v)
  T.values_close(flat(lp), r.log_prob, 1e-12, 1e-12, "log_prob")
  weighted(lp):backward()
  T.values_close(flat(c.grad), r.d_concentration, 1e-8, 1e-10, "the gradient of the concentration")
  local d = D.LKJCholesky(3, f64(2.0))
  T.values_close({ d:log_prob(f64({ { 1, 0, 0 }, { 0.6, 0.8, 0 }, { 0.0, 0.6, 0.8 } })):item() }, r.log_prob_3, 1e-12, 1e-12,
                 "log_prob, 3 x 3")
  torch.manual_seed(31)
  local L = d:sample({ 20000 })
  T.ok(D.constraints.corr_cholesky:check(L):all():item(), "draws: Cholesky factors of correlation matrices")
  local corr = L:matmul(L:transpose(-1, -2))
  local r10 = corr:select(-1, 0):select(-1, 1)
  T.close(r10:mean():item(), 0, 0, 0.01, "a correlation's mean is 0")
  T.close(r10:var():item(), 1 / 6, 0.05, 0, "its variance is 1 / (2 concentration + dim - 1)")
  T.raises(function() D.LKJCholesky(1) end, "dim to be an integer of at least 2", "dim 1")
  T.raises(function() d:log_prob(f64({ { 1, 0, 0 }, { 0.5, 0.5, 0 }, { 0, 0, 1 } })) end, "Cholesky factor of a correlation",
           "a factor whose rows are not unit")
end)

T.run("VonMises against 40-digit values and PyTorch; OneHotCategoricalStraightThrough's gradient", function()
  local r = ref.von_mises
  local vm = D.VonMises(f64({ 0.3, -1.0, 2.0, 0.0, 1.5 }), f64({ 0.5, 2.0, 10.0, 50.0, 700.0 }))
  local lp = vm:log_prob(f64({ 0.1, 0.5, 2.2, -0.1, 1.45 }))
  T.values_close(flat(lp), r.log_prob_exact, 1e-12, 1e-12, "VonMises: log_prob, exact")
  T.values_close(flat(lp), r.log_prob_torch, 1e-6, 1e-6, "VonMises: log_prob, PyTorch's (good to about 1e-7)")
  T.values_close(flat(vm.variance), r.variance_exact, 1e-12, 1e-12, "VonMises: variance (circular), exact")
  torch.manual_seed(8)
  local draws = D.VonMises(f64({ 3.0 }), f64({ 4.0 })):sample({ 20000 })
  T.ok(draws:ge(-math.pi):all():item() and draws:lt(math.pi):all():item(), "VonMises: draws in [-pi, pi)")
  local resultant = torch.stack({ draws:cos():mean(0), draws:sin():mean(0) })
  T.close(math.atan2(resultant[1]:item(), resultant[0]:item()), 3.0, 0.01, 0.01, "VonMises: the draws' circular mean")
  T.close(1 - resultant:norm():item(), D.VonMises(f64({ 3.0 }), f64({ 4.0 })).variance:item(), 0.03, 0,
          "VonMises: the draws' circular variance")
  local logits = f64({ 0.2, -0.5, 1.0 }):requires_grad_()
  local st = D.OneHotCategoricalStraightThrough({ logits = logits }):rsample({ 4 })
  T.ok(st:sum(-1):eq(1):all():item(), "OneHotCategoricalStraightThrough: one-hot draws")
  ;(st * torch.arange(0, 12, { dtype = torch.float64 }):cos():reshape(4, 3)):sum():backward()
  T.values_close(flat(logits.grad), ref.one_hot_straight_through.d_logits, 1e-12, 1e-12,
                 "OneHotCategoricalStraightThrough: the probabilities' gradient")
end)

T.run("constraints, biject_to, transform_to and supports against PyTorch", function()
  local K = D.constraints
  local vals = f64({ -1.5, 0.0, 0.5, 1.0, 2.0, 3.0 })
  local checks = { real = K.real, positive = K.positive, nonnegative = K.nonnegative, unit_interval = K.unit_interval,
                   interval = K.interval(-1.0, 2.0), half_open_interval = K.half_open_interval(0.0, 1.0),
                   greater_than = K.greater_than(0.5), greater_than_eq = K.greater_than_eq(0.5), less_than = K.less_than(1.0),
                   nonnegative_integer = K.nonnegative_integer, positive_integer = K.positive_integer,
                   integer_interval = K.integer_interval(0, 2), boolean = K.boolean }
  local r = ref.constraint_checks
  for _, name in ipairs(T.sorted_keys(checks)) do
    T.is(checks[name]:check(vals):tolist(), r[name], "check: " .. name)
  end
  T.is(K.simplex:check(f64({ { 0.5, 0.5 }, { 0.2, 0.9 }, { 1.0, 0.0 } })):tolist(), r.simplex, "check: simplex")
  T.is(K.lower_cholesky:check(f64({ { { 1.0, 0.0 }, { 0.5, 2.0 } }, { { 1.0, 0.3 }, { 0.5, 2.0 } },
                                    { { -1.0, 0.0 }, { 0.5, 2.0 } } })):tolist(), r.lower_cholesky, "check: lower_cholesky")
  local x = f64({ -2.0, -0.3, 0.0, 0.7, 3.0 })
  local b = ref.bijections
  for name, c in pairs({ positive = K.positive, greater_than = K.greater_than(1.5), less_than = K.less_than(-1.0),
                         interval = K.interval(-1.0, 2.0), unit_interval = K.unit_interval, real = K.real }) do
    local t = D.biject_to(c)
    local y = t(x)
    T.values_close(flat(y), b[name].y, 1e-12, 1e-12, "biject_to(" .. name .. "): values")
    T.values_close(flat(t:log_abs_det_jacobian(x, y)), b[name].ladj, 1e-12, 1e-12, "biject_to(" .. name .. "): log-Jacobian")
    T.values_close(flat(t:inv(y)), b[name].inv, 1e-9, 1e-9, "biject_to(" .. name .. "): inverse")
  end
  local xs = f64({ { 0.3, -0.5, 1.2 }, { 0.0, 2.0, -1.0 } })
  local sb = D.biject_to(K.simplex)
  T.values_close(flat(sb(xs)), b.simplex_biject.y, 1e-12, 1e-12, "biject_to(simplex): stick breaking")
  T.values_close(flat(sb:log_abs_det_jacobian(xs, sb(xs))), b.simplex_biject.ladj, 1e-12, 1e-12,
                 "biject_to(simplex): its log-Jacobian")
  T.values_close(flat(D.transform_to(K.simplex)(xs)), b.simplex_transform.y, 1e-12, 1e-12, "transform_to(simplex): softmax")
  local xc = f64({ { 0.5, 1.0 }, { -1.0, 0.3 }, { 2.0, 0.1 } })
  local cat = D.CatTransform({ D.ExpTransform(), D.AffineTransform(1.0, 2.0) }, 0, { 2, 1 })
  T.values_close(flat(cat(xc)), b.cat.y, 1e-12, 1e-12, "CatTransform: each slice its transform")
  T.values_close(flat(cat:log_abs_det_jacobian(xc, cat(xc))), b.cat.ladj, 1e-12, 1e-12, "CatTransform: log-Jacobian")
  T.values_close(flat(cat:inv(cat(xc))), b.cat.inv, 1e-12, 1e-12, "CatTransform: inverse")
  local last = D.CatTransform({ D.ExpTransform(), D.ExpTransform() }, -1, { 1, 1 })
  T.values_close(flat(last:log_abs_det_jacobian(xc, last(xc))), b.cat_last.ladj, 1e-12, 1e-12,
                 "CatTransform along the last dim")
  local st = D.StackTransform({ D.ExpTransform(), D.SigmoidTransform() }, 1)
  local x2 = xc:narrow(0, 0, 2)
  T.values_close(flat(st(x2)), b.stack.y, 1e-12, 1e-12, "StackTransform: each entry its transform")
  T.values_close(flat(st:log_abs_det_jacobian(x2, st(x2))), b.stack.ladj, 1e-12, 1e-12, "StackTransform: log-Jacobian")
  local cc = D.biject_to(K.corr_cholesky)
  local xcc = f64({ { { 0.3, -0.5, 1.2 }, { 0.0, 2.0, -1.0 } }, { { 0.1, 0.2, -0.3 }, { 1.5, -0.7, 0.4 } } })
  T.values_close(flat(cc(xcc)), b.corr_cholesky.y, 1e-12, 1e-12, "CorrCholeskyTransform: a batch of 3 x 3 factors")
  T.values_close(flat(cc:log_abs_det_jacobian(xcc, cc(xcc))), b.corr_cholesky.ladj, 1e-12, 1e-12,
                 "CorrCholeskyTransform: log-Jacobian")
  T.tensor_close(cc:inv(cc(xcc)), xcc, 1e-10, 1e-10, "CorrCholeskyTransform: inverse")
  local x6 = f64({ 0.3, -0.5, 1.2, 0.0, 2.0, -1.0 })
  T.values_close(flat(cc(x6)), b.corr_cholesky_4.y, 1e-12, 1e-12, "CorrCholeskyTransform: one 4 x 4 factor")
  T.values_close({ cc:log_abs_det_jacobian(x6, cc(x6)):item() }, b.corr_cholesky_4.ladj, 1e-12, 1e-12,
                 "CorrCholeskyTransform: its log-Jacobian")
  T.raises(function() cc(f64({ 1, 2 })) end, "2 is not D%(D%-1%)/2", "a vector of no triangle's size")
  T.raises(function() cat(f64({ 1, 2 })) end, "expected dim 0 of size 3", "CatTransform: lengths that do not fit")
  T.raises(function() D.StackTransform({ 3 }) end, "expected transforms%[1%] to be a transform", "StackTransform: not a transform")
  local dists = { D.Normal(0, 1), D.Exponential(1), D.Gamma(1, 1), D.Pareto(1, 2), D.Uniform(0, 2),
                  D.Binomial(3, f64(0.5)), D.Categorical(torch.ones(3)), D.Beta(1, 1), D.Dirichlet(torch.ones(3)),
                  D.Poisson(1), D.Bernoulli(f64(0.5)), D.LogNormal(0, 1), D.Independent(D.Normal(torch.zeros(2), torch.ones(2)), 1),
                  D.MultivariateNormal(torch.zeros(2), torch.eye(2)), D.Geometric(f64(0.5)), D.HalfNormal(1), D.Weibull(1, 1) }
  local names = {}
  for i, d in ipairs(dists) do names[i] = tostring(d.support) end
  T.is(names, ref.supports.names, "each family's support prints as PyTorch's")
  T.raises(function() D.biject_to(K.positive_definite) end, "Cannot transform PositiveDefinite", "no bijection for it")
  T.raises(function() D.biject_to(3) end, "expected a constraint", "biject_to of a number")
  T.raises(function() K.real:check(3) end, "expected a tensor", "check of a number")
end)

T.run("Distribution: the base class, classes of one's own, register_kl", function()
  local My = D.Distribution:extend("Scaled")
  function My:__init(c, opts)
    self.c = c
    D.Distribution.__init(self, c:size(), {}, opts)
  end
  function My:rsample(shape) return torch.rand(shape or {}, { dtype = torch.float64 }) * self.c end
  local m = My(f64({ 2.0 }))
  T.is(T.shape(m:sample({ 4, 1 })), { 4, 1 }, "sample from rsample")
  T.ok(not m:sample({ 3 }).requires_grad, "sample draws without a gradient")
  T.raises(function() m:log_prob(f64(1)) end, "Scaled.log_prob is not implemented", "what a class leaves out raises")
  T.raises(function() D.Categorical(f64({ 0.5, 0.5 })):rsample() end, "Categorical.rsample is not implemented",
           "the built-in classes too")
  T.values_close({ D.Categorical(f64({ 0.5, 0.5 })):perplexity():item() }, { 2 }, 1e-12, 1e-12, "perplexity")
  D.register_kl(My, My, function(p, q) return (p.c / q.c):log() end)
  T.values_close(flat(D.kl_divergence(m, My(f64({ 1.0 })))), { math.log(2) }, 1e-12, 1e-12, "a registered KL")
  local Sub = My:extend("SubScaled")
  T.values_close(flat(D.kl_divergence(Sub(f64({ 4.0 })), m)), { math.log(2) }, 1e-12, 1e-12,
                 "a registered KL serves classes extending it")
  -- (Exponential's KL is not used after this point of the file)
  D.register_kl(D.Exponential, D.Exponential)(function() return f64(42) end)
  T.is(D.kl_divergence(D.Exponential(1), D.Exponential(2)):item(), 42, "a registered KL comes before the built-in one")
  T.raises(function() D.register_kl({}, D.Normal) end, "expected two distribution classes", "register_kl: not a class")
  T.raises(function() D.Distribution.__init(My(f64({ 1.0 })), 3) end, "expected batch_shape to be a list of sizes",
           "a bad batch_shape")
  T.raises(function() D.Multinomial(2.5, f64({ 0.5, 0.5 })) end, "total_count to be a non%-negative integer",
           "Multinomial: a fractional total_count")
  T.raises(function() D.NegativeBinomial(3, f64({ 1.0 })) end, "probs to be in %[0, 1%)", "NegativeBinomial: probs 1")
  T.raises(function() D.LowRankMultivariateNormal(f64({ 0, 0 }), f64({ { 1 } }), f64({ 1, 1 })) end,
           "expected cov_factor %(..., 2, r%)", "LowRankMultivariateNormal: shapes")
  T.raises(function() D.RelaxedBernoulli(f64(-1), f64({ 0.5 })) end, "temperature to be positive",
           "RelaxedBernoulli: temperature")
end)

T.run("MultivariateNormal's kl_divergence against PyTorch", function()
  local p = D.MultivariateNormal(f64({ 1.0, -1.0 }), f64({ { 2.0, 0.5 }, { 0.5, 1.0 } }))
  local q = D.MultivariateNormal(f64({ 0.0, 0.5 }), f64({ { 1.0, -0.2 }, { -0.2, 0.5 } }))
  T.values_close({ D.kl_divergence(p, q):item() }, ref.multivariate_normal_kl.kl, 1e-12, 1e-12, "kl")
end)

T.run("sampling the other distributions: statistics", function()
  torch.manual_seed(5)
  local n = 20000
  local function stats(name, d, mean, var, tol)
    local s = d:sample({ n })
    T.ok(not s.requires_grad, name .. ": no gradient")
    T.close(s:mean(0):double():mean():item(), mean, tol, 0, name .. ": sample mean")
    if var then T.close(s:var(0):double():mean():item(), var, 3 * tol, 0, name .. ": sample variance") end
    return s
  end
  stats("Exponential", D.Exponential(f64({ 3.0 })), 1 / 3, 1 / 9, 0.03)
  stats("Laplace", D.Laplace(f64({ 1.0 }), f64({ 2.0 })), 1, 8, 0.05)
  stats("LogNormal", D.LogNormal(f64({ 0.0 }), f64({ 0.5 })), math.exp(0.125), (math.exp(0.25) - 1) * math.exp(0.25), 0.03)
  stats("HalfNormal", D.HalfNormal(f64({ 2.0 })), 2 * math.sqrt(2 / math.pi), 4 * (1 - 2 / math.pi), 0.03)
  for _, a in ipairs({ 0.3, 1.0, 2.5, 40.0 }) do
    stats("Gamma(" .. a .. ", 2)", D.Gamma(f64({ a }), f64({ 2.0 })), a / 2, a / 4, 0.03)
  end
  stats("Chi2(3)", D.Chi2(f64({ 3.0 })), 3, 6, 0.03)
  stats("Gumbel(1, 2)", D.Gumbel(f64({ 1.0 }), f64({ 2.0 })), 1 + 2 * 0.5772156649, 4 * math.pi ^ 2 / 6, 0.03)
  stats("Weibull(2, 1.5)", D.Weibull(f64({ 2.0 }), f64({ 1.5 })), 2 * math.exp(select(1, torch.tensor({ 1 + 1 / 1.5 },
        { dtype = torch.float64 }):lgamma():item())), nil, 0.03)
  stats("Pareto(1, 3)", D.Pareto(f64({ 1.0 }), f64({ 3.0 })), 1.5, nil, 0.03)
  stats("StudentT(5, 1)", D.StudentT(f64({ 5.0 }), f64({ 1.0 })), 1, 5 / 3, 0.05)
  stats("Beta(2, 5)", D.Beta(f64({ 2.0 }), f64({ 5.0 })), 2 / 7, 10 / (49 * 8), 0.03)
  local dir = D.Dirichlet(f64({ 1.0, 2.0, 3.0 })):sample({ n })
  T.values_close(dir:mean(0):tolist(), { 1 / 6, 2 / 6, 3 / 6 }, 0.03, 0, "Dirichlet: sample means")
  T.tensor_close(dir:sum(-1), torch.ones(n, { dtype = torch.float64 }), 1e-12, 1e-12, "Dirichlet: on the simplex")
  for _, lam in ipairs({ 0.3, 4.0, 9.9, 10.0, 37.0, 500.0 }) do
    local s = stats("Poisson(" .. lam .. ")", D.Poisson(f64({ lam })), lam, lam, 0.03)
    T.ok(s:eq(s:floor()):all():item() and s:min():item() >= 0, "Poisson(" .. lam .. "): counts")
  end
  stats("Geometric(0.25)", D.Geometric(f64({ 0.25 })), 3, 12, 0.04)
  local b = stats("Binomial(10, 0.3)", D.Binomial(10, f64({ 0.3 })), 3, 2.1, 0.03)
  T.ok(b:max():item() <= 10, "Binomial: at most total_count")
  local oh = D.OneHotCategorical(f64({ 0.2, 0.8 })):sample({ n })
  T.tensor_close(oh:sum(-1), torch.ones(n, { dtype = torch.float64 }), 0, 0, "OneHotCategorical: one-hot")
  T.close(oh:mean(0)[1]:item(), 0.8, 0, 0.02, "OneHotCategorical: frequency")
  local mvn = D.MultivariateNormal(f64({ 1.0, -1.0 }), f64({ { 2.0, 0.5 }, { 0.5, 1.0 } }))
  local s = mvn:sample({ n })
  T.values_close(s:mean(0):tolist(), { 1, -1 }, 0, 0.05, "MultivariateNormal: mean")
  local c = s - s:mean(0)
  T.values_close((c:t():mm(c) / n):tolist(), { { 2.0, 0.5 }, { 0.5, 1.0 } }, 0, 0.08, "MultivariateNormal: covariance")
  local loc = f64({ 0.0, 0.0 }):requires_grad_()
  D.MultivariateNormal(loc, f64({ { 1.0, 0.0 }, { 0.0, 1.0 } })):rsample({ 3 }):sum():backward()
  T.is(loc.grad:tolist(), { 3, 3 }, "MultivariateNormal: rsample's gradient reaches loc")
  local c1 = D.Cauchy(f64({ 0.0 }), f64({ 1.0 })):sample({ n })
  T.close(c1:abs():median():item(), 1, 0, 0.05, "Cauchy: the median of |x| is the scale")
  T.raises(function() torch.poisson(f64({ -1.0 })) end, "poisson: expected the rates to be non%-negative", "a negative rate")
  T.raises(function() torch.poisson(f64({ math.huge })) end, "non%-negative and finite", "an infinite rate")
  T.raises(function() torch.poisson(f64({ 0 / 0 })) end, "non%-negative and finite", "a NaN rate")
end)

T.run("MixtureSameFamily against PyTorch", function()
  local r = ref.mixture_normal
  local logits = f64({ { 0.2, -0.5, 1.0 }, { 0.0, 0.3, -1.2 } }):requires_grad_()
  local loc = f64({ { -1.0, 0.5, 2.0 }, { 0.0, 1.0, -2.0 } }):requires_grad_()
  local scale = f64({ { 0.5, 1.0, 1.5 }, { 2.0, 0.3, 0.7 } }):requires_grad_()
  local mix = D.MixtureSameFamily(D.Categorical({ logits = logits }), D.Normal(loc, scale))
  local x = f64({ { 0.1, 1.2 }, { -1.5, 2.5 }, { 0.7, -0.3 } })
  local lp = mix:log_prob(x)
  T.values_close(lp:detach():reshape(-1):tolist(), r.log_prob, 1e-12, 1e-12, "log_prob")
  T.values_close(mix.mean:detach():tolist(), r.mean, 1e-12, 1e-12, "mean")
  T.values_close(mix.variance:detach():tolist(), r.variance, 1e-12, 1e-12, "variance")
  T.values_close(mix:cdf(x):detach():reshape(-1):tolist(), r.cdf, 1e-12, 1e-12, "cdf")
  ;(lp * torch.arange(0, lp:numel(), { dtype = torch.float64 }):cos():reshape(lp:size())):sum():backward()
  T.values_close(logits.grad:reshape(-1):tolist(), r.d_logits, 1e-10, 1e-12, "the gradient of the logits")
  T.values_close(loc.grad:reshape(-1):tolist(), r.d_loc, 1e-10, 1e-12, "the gradient of the locations")
  T.values_close(scale.grad:reshape(-1):tolist(), r.d_scale, 1e-10, 1e-12, "the gradient of the scales")
  local r2 = ref.mixture_independent
  local mix2 = D.MixtureSameFamily(D.Categorical(f64({ 0.4, 0.6 })),
                                   D.Independent(D.Normal(f64({ { 0.0, 1.0 }, { 2.0, -1.0 } }), f64({ { 1.0, 0.5 }, { 0.7, 2.0 } })), 1))
  T.values_close(mix2:log_prob(f64({ { 0.5, 0.5 }, { 2.0, -2.0 } })):tolist(), r2.log_prob, 1e-12, 1e-12,
                 "a mixture of 2-D normals: log_prob")
  T.values_close(mix2.mean:tolist(), r2.mean, 1e-12, 1e-12, "its mean")
  T.values_close(mix2.variance:tolist(), r2.variance, 1e-12, 1e-12, "its variance")
  torch.manual_seed(4)
  local draws = D.MixtureSameFamily(D.Categorical(f64({ 0.3, 0.7 })), D.Normal(f64({ -1.0, 2.0 }), f64({ 0.5, 1.0 }))):sample({ 20000 })
  T.close(draws:mean():item(), 1.1, 0.03, 0, "draws: the mixture's mean")
  T.is(T.shape(mix2:sample({ 5 })), { 5, 2 }, "draws of 2-D components")
  T.raises(function() D.MixtureSameFamily(D.Categorical(f64({ 0.5, 0.5 })), D.Normal(f64({ 0, 1, 2 }), 1.0)) end,
           "the mixture distribution has 2 components", "component counts that differ")
end)

T.run("TransformedDistribution against PyTorch", function()
  local TR = D.transforms
  local cases_t = {  -- as the generator's TRANSFORMED
    transformed_tanh = { function(p) return D.Normal(p[1], p[2]) end, { { 0.5, -1.0, 0.2 }, { 1.0, 0.3, 2.0 } },
                         function() return { TR.TanhTransform() } end, { -0.9, 0.2, 0.95 } },
    transformed_affine_exp = { function(p) return D.Normal(p[1], p[2]) end, { { 0.5, -1.0, 0.2 }, { 1.0, 0.3, 2.0 } },
                               function() return { TR.AffineTransform(1.0, 2.0), TR.ExpTransform() } end, { 2.0, 3.0, 0.5 } },
    transformed_sigmoid = { function(p) return D.Normal(p[1], p[2]) end, { { 0.5, -1.0 }, { 1.0, 0.3 } },
                            function() return { D.SigmoidTransform() } end, { 0.3, 0.8 } },
    transformed_power = { function(p) return D.Exponential(p[1]) end, { { 0.5, 2.0 } },
                          function() return { TR.PowerTransform(0.5) } end, { 0.7, 1.3 } },
    transformed_independent_tanh = { function(p) return D.Independent(D.Normal(p[1], p[2]), 1) end,
                                     { { { 0.5, -1.0 }, { 0.1, 0.2 } }, { { 1.0, 0.3 }, { 0.5, 0.7 } } },
                                     function() return { TR.TanhTransform() } end, { { -0.5, 0.25 }, { 0.9, -0.1 } } },
    transformed_softplus = { function(p) return D.Normal(p[1], p[2]) end, { { 0.5, -1.0, 0.2 }, { 1.0, 0.3, 2.0 } },
                             function() return { TR.SoftplusTransform() } end, { 0.5, 2.0, 0.1 } },
    transformed_stick_breaking = { function(p) return D.Independent(D.Normal(p[1], p[2]), 1) end,
                                   { { 0.3, -0.5 }, { 1.0, 0.5 } }, function() return { TR.StickBreakingTransform() } end,
                                   { 0.2, 0.3, 0.5 } },
    transformed_independent_exp = { function(p) return D.Independent(D.Normal(p[1], p[2]), 1) end,
                                    { { { 0.5, -1.0 }, { 0.1, 0.2 } }, { { 1.0, 0.3 }, { 0.5, 0.7 } } },
                                    function() return { TR.IndependentTransform(TR.ExpTransform(), 1) } end,
                                    { { 0.5, 2.0 }, { 1.5, 0.3 } } },
    transformed_reshape = { function(p) return D.Independent(D.Normal(p[1], p[2]), 1) end,
                            { { 0.5, -1.0, 0.1, 0.2 }, { 1.0, 0.3, 0.5, 0.7 } },
                            function() return { TR.ReshapeTransform({ 4 }, { 2, 2 }) } end, { { 0.5, 2.0 }, { 1.5, 0.3 } } },
    transformed_cdf = { function(p) return D.Normal(p[1], p[2]) end, { { 0.5, -1.0 }, { 1.0, 0.3 } },
                        function() return { TR.CumulativeDistributionTransform(D.Normal(f64(0.0), f64(1.0))) } end,
                        { 0.3, 0.8 } },
  }
  for _, name in ipairs(T.sorted_keys(cases_t)) do
    local make, params, transforms, value = unpack(cases_t[name])
    local r = ref[name]
    local ps = {}
    for i, v in ipairs(params) do ps[i] = f64(v):requires_grad_() end
    local d = D.TransformedDistribution(make(ps), transforms())
    local lp = d:log_prob(f64(value))
    T.values_close(lp:detach():reshape(-1):tolist(), r.log_prob, 1e-12, 1e-12, name .. ": log_prob")
    ;(lp * torch.arange(0, lp:numel(), { dtype = torch.float64 }):cos():reshape(lp:size())):sum():backward()
    for i, p in ipairs(ps) do
      T.values_close(p.grad:reshape(-1):tolist(), r["d" .. (i - 1)], 1e-10, 1e-12, name .. ": the gradient of parameter " .. i)
    end
  end
  local r = ref.logistic_normal
  local loc, scale = f64({ 0.3, -0.5, 1.0 }):requires_grad_(), f64({ 1.0, 0.5, 2.0 }):requires_grad_()
  local ln = D.LogisticNormal(loc, scale)
  local lp = ln:log_prob(f64({ { 0.2, 0.3, 0.1, 0.4 }, { 0.05, 0.05, 0.6, 0.3 } }))
  T.values_close(flat(lp), r.log_prob, 1e-12, 1e-12, "LogisticNormal: log_prob")
  ;(lp * torch.arange(0, lp:numel(), { dtype = torch.float64 }):cos()):sum():backward()
  T.values_close(flat(loc.grad), r.d_loc, 1e-10, 1e-12, "LogisticNormal: the gradient of loc")
  T.values_close(flat(scale.grad), r.d_scale, 1e-10, 1e-12, "LogisticNormal: the gradient of scale")
  T.is(ln.event_shape, { 4 }, "LogisticNormal: an event of one more category")
  local draws = ln:sample({ 6 })
  T.tensor_close(draws:sum(-1), torch.ones(6, { dtype = torch.float64 }), 1e-12, 1e-12, "LogisticNormal: draws on the simplex")
  T.values_close(flat(D.Normal(f64({ 0.5, -1.0, 2.0 }), f64({ 1.5, 0.25, 3.0 })):icdf(f64({ 0.1, 0.5, 0.975 }))),
                 ref.normal_icdf.icdf, 1e-12, 1e-12, "Normal: icdf")
  local sb = TR.StickBreakingTransform()
  local x = f64({ { 0.3, -0.5, 1.2 } })
  T.tensor_close(sb:inv(sb(x)), x, 1e-12, 1e-12, "StickBreakingTransform: inv(forward(x)) = x")
  T.raises(function() TR.AbsTransform():log_abs_det_jacobian(x, x) end, "not a bijection", "AbsTransform: no log-Jacobian")
  T.raises(function() TR.ReshapeTransform({ 2, 3 }, { 5 }) end, "same number of elements", "ReshapeTransform: sizes")
  T.raises(function() TR.IndependentTransform(3, 1) end, "expected a transform", "IndependentTransform: not a transform")
  -- a cached tanh inverts its own saturated draws exactly
  local base = D.Normal(f64({ 30.0 }), f64({ 0.1 }))
  local squashed = D.TransformedDistribution(base, { TR.TanhTransform({ cache_size = 1 }) })
  local y = squashed:rsample({ 4 })
  T.ok(y:eq(1):all():item(), "tanh saturates at 1 in float64")
  T.ok(squashed:log_prob(y):isfinite():all():item(), "cache_size = 1: log_prob of its own draws is finite")
  local loc = f64({ 0.0 }):requires_grad_()
  D.TransformedDistribution(D.Normal(loc, 1.0), { TR.ExpTransform() }):rsample({ 5 }):sum():backward()
  T.ok(loc.grad:item() > 0, "rsample's gradient flows through the transforms")
  T.raises(function() D.TransformedDistribution(D.Normal(0, 1), { 3 }) end, "expected transforms%[1%] to be a transform",
           "not a transform")
  T.raises(function() TR.TanhTransform({ cache_size = 2 }) end, "cache_size must be 0 or 1", "a bad cache size")
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
  T.raises(function() D.Gamma(-1.0, 1.0) end, "Gamma: expected concentration to be positive", "a negative concentration")
  T.raises(function() D.Exponential(0) end, "Exponential: expected rate to be positive", "a zero rate")
  T.raises(function() D.Exponential(1.0):log_prob(f64({ -1 })) end, "the value to be non%-negative", "outside the support")
  T.raises(function() D.Poisson(f64({ 2 })):log_prob(f64({ 1.5 })) end, "the value to be a non%-negative integer", "a fraction")
  T.raises(function() D.Binomial(2.5, f64({ 0.5 })) end, "expected total_count to be a non%-negative integer", "a fractional count")
  T.raises(function() D.Dirichlet(f64({ 1.0, 1.0 })):log_prob(f64({ 0.3, 0.3 })) end, "on the simplex", "off the simplex")
  T.raises(function() D.MultivariateNormal(f64({ 0, 0 }), f64({ { 1, 0, 0 }, { 0, 1, 0 }, { 0, 0, 1 } })) end,
           "expected covariance_matrix of shape %(%.%.%., 2, 2%) for loc of size 2, got %[3, 3%]", "a covariance of the wrong size")
  T.raises(function() D.MultivariateNormal(f64({ 0, 0 }), { scale_tril = torch.eye(2), covariance_matrix = torch.eye(2) }) end,
           "exactly one of covariance_matrix, scale_tril or precision_matrix", "two matrices")
  T.raises(function() D.MultivariateNormal(f64({ 0, 0 }), f64({ { 1, 2 }, { 2, 1 } })) end, "cholesky",
           "a covariance that is not positive definite")
end)

T.run("rsample of the gamma family: implicit reparameterisation", function()
  -- d x / d alpha at a fixed quantile u: x(alpha) solves P(alpha, x) = u
  -- (Newton's method on gammainc), differenced against _standard_gamma_grad
  local function quantile(alpha, u)
    local a = f64({ alpha })
    local x = f64({ alpha })
    for _ = 1, 100 do
      local density = ((a - 1) * x:log() - x - a:lgamma()):exp()
      x = (x - (torch.special.gammainc(a, x) - u) / density):clamp(1e-12, nil)
    end
    return x
  end
  for _, alpha in ipairs({ 0.5, 2.0, 10.0 }) do
    for _, u in ipairs({ 0.1, 0.5, 0.9 }) do
      local h = 1e-5 * alpha
      local fd = (quantile(alpha + h, u) - quantile(alpha - h, u)):item() / (2 * h)
      local got = torch._standard_gamma_grad(f64({ alpha }), quantile(alpha, u)):item()
      T.close(got, fd, 1e-6, 1e-9, string.format("_standard_gamma_grad(%g) at the %g quantile", alpha, u))
    end
  end
  -- the draws' gradients average to the gradient of the mean
  torch.manual_seed(5)
  local n = 20000
  local function mean_grad(make, params, sample_shape)
    for _, p in ipairs(params) do p.grad = nil end
    local x = make():rsample(sample_shape or { n })
    x:sum():backward()
    local out = {}
    for i, p in ipairs(params) do out[i] = (p.grad / n):tolist() end
    return out, x
  end
  local alpha, rate = f64({ 0.7, 3.0 }):requires_grad_(), f64({ 2.0, 2.0 }):requires_grad_()
  local g, x = mean_grad(function() return D.Gamma(alpha, rate) end, { alpha, rate })
  T.ok(x.requires_grad and x:min():item() > 0, "Gamma: positive draws that carry a gradient")
  T.values_close(g[1], { 0.5, 0.5 }, 0.03, 0, "Gamma: d E / d concentration = 1 / rate")
  T.values_close(g[2], { -0.175, -0.75 }, 0.03, 0, "Gamma: d E / d rate = -concentration / rate^2")
  local df = f64({ 3.0 }):requires_grad_()
  g = mean_grad(function() return D.Chi2(df) end, { df })
  T.values_close(g[1], { 1 }, 0.03, 0, "Chi2: d E / d df = 1")
  local c1, c0 = f64({ 2.0 }):requires_grad_(), f64({ 3.0 }):requires_grad_()
  g = mean_grad(function() return D.Beta(c1, c0) end, { c1, c0 })
  T.values_close(g[1], { 3 / 25 }, 0.05, 0, "Beta: d E / d c1 = c0 / (c1 + c0)^2")
  T.values_close(g[2], { -2 / 25 }, 0.05, 0, "Beta: d E / d c0 = -c1 / (c1 + c0)^2")
  local conc = f64({ 1.0, 2.0, 3.0 }):requires_grad_()
  local d = D.Dirichlet(conc):rsample({ n })
  d:select(-1, 0):sum():backward()
  T.values_close((conc.grad / n):tolist(), { 5 / 36, -1 / 36, -1 / 36 }, 0.06, 0,
                 "Dirichlet: d E[x_0] / d c = (a0 - c0, -c0, -c0) / a0^2")
  local d1, d2 = f64({ 4.0 }):requires_grad_(), f64({ 10.0 }):requires_grad_()
  g = mean_grad(function() return D.FisherSnedecor(d1, d2) end, { d1, d2 })
  T.values_close(g[2], { -2 / 64 }, 0.1, 0, "FisherSnedecor: d E / d df2 = -2 / (df2 - 2)^2")
  T.close(g[1][1], 0, 0, 0.01, "FisherSnedecor: d E / d df1 = 0")
  local sdf, scale = f64({ 6.0 }):requires_grad_(), f64({ 2.0 }):requires_grad_()
  local t = D.StudentT(sdf, 0.0, scale):rsample({ n })
  t:abs():sum():backward()
  T.ok(sdf.grad ~= nil and scale.grad:item() > 0, "StudentT: rsample's gradient reaches df and scale")
  local wdf = f64(5.0):requires_grad_()
  local W = D.Wishart(wdf, f64({ { 2.0, 0.5 }, { 0.5, 1.0 } })):rsample({ n })
  W:sum():backward()
  T.close(wdf.grad:item() / n, 4, 0.05, 0, "Wishart: d E / d df = the covariance's sum")
  T.raises(function() D.VonMises(f64(0.0), f64(1.0)):rsample() end, "VonMises.rsample is not implemented %(nor is it in PyTorch%)",
           "VonMises has no rsample")
end)

T.done_testing()
