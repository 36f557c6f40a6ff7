-- dplua.tpe: the tree-structured Parzen estimator (Bergstra et al. 2011),
-- the model-based search of `dplua sweep` with method = "tpe". The trials
-- so far are split into the good ones (the best `gamma` fraction) and the
-- rest; each parameter gets two densities, l(x) from the good values and
-- g(x) from the others (a Gaussian at every value, its width the gap to
-- its neighbours, plus a wide one for the prior; for a list of values,
-- counts plus one); candidates are drawn from l, and the one with the
-- largest l(x) / g(x) (summed in logs over the parameters, taken as
-- independent) is the next configuration.
local M = {}

local SQRT2 = math.sqrt(2)

-- The normal CDF through erfc by the Chebyshev fit of Numerical Recipes'
-- erfcc (fractional error below 1.2e-7): what the truncation of the
-- Gaussians needs.
function M._normal_cdf(z)
  local x = math.abs(z) / SQRT2
  local t = 1 / (1 + 0.5 * x)
  local erfc = t * math.exp(-x * x - 1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 +
               t * (-0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 +
               t * (-0.82215223 + t * 0.17087277)))))))))
  return z >= 0 and 1 - erfc / 2 or erfc / 2
end

-- A normal draw from two uniforms (Box-Muller)
local function normal(u)
  local a = math.max(u(), 1e-300)
  return math.sqrt(-2 * math.log(a)) * math.cos(2 * math.pi * u())
end

---------------------------------------------------------------- parameters

-- What a space entry is: {kind = "list", values =}, {kind = "real", lo =,
-- hi =, log =, int =}, or {kind = "constant", value =}
local function param_of(v)
  if type(v) == "table" and #v > 0 then return { kind = "list", values = v } end
  if type(v) == "table" then
    local name, r = next(v)
    if name == "uniform" then return { kind = "real", lo = r[1], hi = r[2] } end
    if name == "log_uniform" then return { kind = "real", lo = math.log(r[1]), hi = math.log(r[2]), log = true } end
    if name == "int" then return { kind = "real", lo = r[1] - 0.5, hi = r[2] + 0.5, int = true } end
  end
  return { kind = "constant", value = v }
end

-- A value as the estimator's coordinate (log for log_uniform), and back
local function coordinate(p, x) return p.log and math.log(x) or x end
local function value_of(p, c)
  if p.int then return math.floor(math.min(math.max(c, p.lo + 0.5), p.hi - 0.5) + 0.5) end
  if p.log then return math.exp(c) end
  return c
end

---------------------------------------------------------------- Parzen estimators

-- The mixture of a real parameter over the coordinates xs: a Gaussian at
-- each (width: the larger gap to its neighbours among the points and the
-- bounds, clipped to [range / min(100, n + 1), range]) and the prior (at
-- the middle, width the range), each truncated to [lo, hi], equal weights.
local function real_mixture(p, xs)
  local range = p.hi - p.lo
  local sorted = {}
  for i, x in ipairs(xs) do sorted[i] = x end
  table.sort(sorted)
  local comps = { { mu = (p.lo + p.hi) / 2, sigma = range } }
  local floor = range / math.min(100, #xs + 1)
  for i, x in ipairs(sorted) do
    local left = x - (sorted[i - 1] or p.lo)
    local right = (sorted[i + 1] or p.hi) - x
    comps[#comps + 1] = { mu = x, sigma = math.min(math.max(left, right, floor), range) }
  end
  for _, c in ipairs(comps) do
    c.mass = M._normal_cdf((p.hi - c.mu) / c.sigma) - M._normal_cdf((p.lo - c.mu) / c.sigma)
  end
  return comps
end

local function real_log_density(p, comps, x)
  local sum = 0
  for _, c in ipairs(comps) do
    local z = (x - c.mu) / c.sigma
    sum = sum + math.exp(-0.5 * z * z) / (c.sigma * math.sqrt(2 * math.pi) * math.max(c.mass, 1e-300))
  end
  return math.log(math.max(sum / #comps, 1e-300))
end

local function real_draw(p, comps, u)
  local c = comps[math.min(math.floor(u() * #comps) + 1, #comps)]
  for _ = 1, 100 do
    local x = c.mu + c.sigma * normal(u)
    if x >= p.lo and x <= p.hi then return x end
  end
  return math.min(math.max(c.mu, p.lo), p.hi)
end

-- A list parameter: each value's count among xs (indices) plus one
local function list_weights(p, xs)
  local w, total = {}, 0
  for i = 1, #p.values do w[i] = 1 end
  for _, i in ipairs(xs) do w[i] = w[i] + 1 end
  for i = 1, #w do total = total + w[i] end
  for i = 1, #w do w[i] = w[i] / total end
  return w
end

local function list_draw(w, u)
  local r, acc = u(), 0
  for i, x in ipairs(w) do
    acc = acc + x
    if r < acc then return i end
  end
  return #w
end

local function index_of(p, v)
  for i, x in ipairs(p.values) do if x == v then return i end end
  return nil
end

---------------------------------------------------------------- suggest

-- A random configuration of the space
function M.random(space, names, u)
  local c = {}
  for _, k in ipairs(names) do
    local p = param_of(space[k])
    if p.kind == "list" then c[k] = p.values[math.floor(#p.values * u()) + 1]
    elseif p.kind == "real" then c[k] = value_of(p, p.lo + (p.hi - p.lo) * u())
    else c[k] = p.value end
  end
  return c
end

-- suggest(space, names, history, u [, {gamma = 0.25, candidates = 24}]):
-- the next configuration from history, a list of {hparams =, value =}
-- where value is the metric to minimise (nil for trials that failed or
-- were pruned: counted with the bad ones). `names` are the space's names
-- in a fixed order, u a uniform [0, 1) stream.
function M.suggest(space, names, history, u, opts)
  opts = opts or {}
  local gamma, ncand = opts.gamma or 0.25, opts.candidates or 24
  local valued = {}
  for _, h in ipairs(history) do if type(h.value) == "number" and h.value == h.value then valued[#valued + 1] = h end end
  table.sort(valued, function(a, b) return a.value < b.value end)
  local ngood = math.min(math.max(1, math.ceil(gamma * #valued)), 25)
  if #valued == 0 then return M.random(space, names, u) end
  local is_good = {}
  for i = 1, math.min(ngood, #valued) do is_good[valued[i]] = true end
  local good, bad = {}, {}
  for _, h in ipairs(history) do
    if is_good[h] then good[#good + 1] = h.hparams else bad[#bad + 1] = h.hparams end
  end
  -- per parameter: l from the good, g from the bad
  local models = {}
  for _, k in ipairs(names) do
    local p = param_of(space[k])
    local m = { p = p }
    if p.kind == "real" then
      local gx, bx = {}, {}
      for _, c in ipairs(good) do if type(c[k]) == "number" then gx[#gx + 1] = coordinate(p, c[k]) end end
      for _, c in ipairs(bad) do if type(c[k]) == "number" then bx[#bx + 1] = coordinate(p, c[k]) end end
      m.l, m.g = real_mixture(p, gx), real_mixture(p, bx)
    elseif p.kind == "list" then
      local gi, bi = {}, {}
      for _, c in ipairs(good) do gi[#gi + 1] = index_of(p, c[k]) end
      for _, c in ipairs(bad) do bi[#bi + 1] = index_of(p, c[k]) end
      m.l, m.g = list_weights(p, gi), list_weights(p, bi)
    end
    models[k] = m
  end
  local best, best_score
  for _ = 1, ncand do
    local c, score = {}, 0
    for _, k in ipairs(names) do
      local m = models[k]
      local p = m.p
      if p.kind == "real" then
        local x = real_draw(p, m.l, u)
        score = score + real_log_density(p, m.l, x) - real_log_density(p, m.g, x)
        c[k] = value_of(p, x)
      elseif p.kind == "list" then
        local i = list_draw(m.l, u)
        score = score + math.log(m.l[i]) - math.log(m.g[i])
        c[k] = p.values[i]
      else
        c[k] = p.value
      end
    end
    if best_score == nil or score > best_score then best, best_score = c, score end
  end
  return best
end

return M
