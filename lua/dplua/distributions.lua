-- dplua.distributions: torch.distributions' Normal, Categorical,
-- Bernoulli, Uniform and Independent, and kl_divergence between them, as
-- compositions of tensor ops (gradients flow to the parameters through
-- log_prob, entropy, kl_divergence and rsample).
--
--   local D = torch.distributions
--   local pi = D.Categorical({ logits = policy(obs) })
--   local a = pi:sample()                          -- no gradient, as PyTorch
--   local loss = -(pi:log_prob(a) * advantage):mean() - 0.01 * pi:entropy():mean()
--   local z = D.Normal(mu, sigma):rsample()        -- reparameterised
--
-- As PyTorch's validate_args (on by default; a last {validate_args =
-- false} turns it off), parameters are checked at construction and
-- log_prob's values against the support: an error names what is wrong.
local torch = require("dplua")
local raise, is_tensor = torch._raise, torch.is_tensor

local M = {}
local LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)

-- A class with PyTorch's name, printing its parameters.
local function class(name, params)
  local cls = {}
  cls.__index = cls
  cls.__name = name
  cls.__tostring = function(self)
    local parts = {}
    for _, p in ipairs(params) do
      local v = rawget(self, p)
      if v ~= nil then parts[#parts + 1] = p .. ": " .. (is_tensor(v) and (v:numel() == 1 and tostring(v:item())
                                                              or "torch.Size([" .. table.concat(v:size(), ", ") .. "])") or tostring(v)) end
    end
    return name .. "(" .. table.concat(parts, ", ") .. ")"
  end
  M[name] = setmetatable(cls, { __call = function(c, ...)
    local self = setmetatable({}, c)
    self:__init(...)
    return self
  end })
  return cls
end

-- A parameter as a floating tensor (numbers become float32 tensors, as PyTorch's).
local function param(v, fn, what, like)
  if type(v) == "number" then
    return torch.tensor(v, { dtype = like and like.dtype or torch.float32, device = like and like.device })
  end
  if not is_tensor(v) then raise(string.format("%s: expected %s to be a number or a tensor, got %s", fn, what, type(v))) end
  if not v.dtype.is_floating_point then
    raise(string.format("%s: expected %s to be a floating point tensor, got %s", fn, what, v.dtype.name))
  end
  return v
end

local function check(ok, fn, what, rule)
  if not ok:all():item() then raise(string.format("%s: expected %s to be %s", fn, what, rule)) end
end

-- validate_args of a constructor's last options table (true by default)
local function validating(self, opts)
  if opts ~= nil and (type(opts) ~= "table" or is_tensor(opts)) then
    raise(self.__name .. ": expected the last argument to be an options table {validate_args =}")
  end
  self._validate = not (opts and opts.validate_args == false)
  return self._validate
end

-- log_prob's value checked against the support
local function in_support(self, ok, rule)
  if self._validate then check(ok, self.__name .. ".log_prob", "the value", rule) end
end

-- The shape a sample takes: sample_shape (a list, or a torch.Size) then the batch's.
local function sample_shape(shape, batch)
  local out = {}
  for _, s in ipairs(shape or {}) do out[#out + 1] = s end
  for _, s in ipairs(batch) do out[#out + 1] = s end
  return out
end

local function no_grad(f)
  local r
  torch.no_grad(function() r = f() end)
  return r
end

---------------------------------------------------------------- Normal

-- Normal(loc, scale): scale > 0; broadcast together.
local Normal = class("Normal", { "loc", "scale" })
function Normal:__init(loc, scale, opts)
  local fn = "Normal"
  loc = param(loc, fn, "loc", is_tensor(scale) and scale or nil)
  scale = param(scale, fn, "scale", loc)
  if validating(self, opts) then check(scale:gt(0), fn, "scale", "positive") end
  self.loc, self.scale = torch.broadcast_tensors(loc, scale)
  self.batch_shape, self.event_shape = self.loc:size(), {}
  self.mean, self.stddev, self.variance = self.loc, self.scale, self.scale * self.scale
end
function Normal:rsample(shape)
  local eps = torch.randn(sample_shape(shape, self.batch_shape), { dtype = self.loc.dtype, device = self.loc.device })
  return self.loc + eps * self.scale
end
function Normal:sample(shape) return no_grad(function() return self:rsample(shape) end) end
function Normal:log_prob(value)
  local d = value - self.loc
  return -(d * d) / (2 * self.variance) - self.scale:log() - LOG_SQRT_2PI
end
function Normal:entropy() return self.scale:log() + 0.5 + LOG_SQRT_2PI end
function Normal:cdf(value) return ((value - self.loc) / (self.scale * math.sqrt(2))):erf() * 0.5 + 0.5 end

---------------------------------------------------------------- Categorical

-- Probabilities clamped to [eps, 1 - eps] (eps the dtype's), as PyTorch's
-- clamp_probs before it takes their log.
local function clamp_probs(p)
  local eps = p.dtype == torch.float64 and 2.220446049250313e-16 or 1.1920928955078125e-07
  return p:clamp(eps, 1 - eps)
end

-- Categorical(probs) or Categorical({probs = } | {logits = }): over the
-- last dim; probs are normalised, logits made log-probabilities.
local function probs_or_logits(fn, a)
  local probs, logits
  if is_tensor(a) then probs = a
  elseif type(a) == "table" then
    for k in pairs(a) do
      if k ~= "probs" and k ~= "logits" and k ~= "validate_args" then raise(fn .. ": unknown option '" .. tostring(k) .. "'") end
    end
    probs, logits = a.probs, a.logits
  end
  if (probs == nil) == (logits == nil) then raise(fn .. ": expected either probs or logits (one of them)") end
  return probs, logits
end

local Categorical = class("Categorical", { "probs", "logits" })
function Categorical:__init(a, opts)
  local fn = "Categorical"
  local probs, logits = probs_or_logits(fn, a)
  if type(a) == "table" and not is_tensor(a) and opts == nil then opts = a end
  local validate = validating(self, opts)
  if probs ~= nil then
    probs = param(probs, fn, "probs")
    if validate then check(probs:ge(0), fn, "probs", "non-negative") end
    if probs:dim() < 1 then raise(fn .. ": expected probs of at least one dim (the categories)") end
    self.probs = probs / probs:sum(-1, true)
    self.logits = clamp_probs(self.probs):log()   -- (as PyTorch: finite, and so are their gradients)
  else
    logits = param(logits, fn, "logits")
    if logits:dim() < 1 then raise(fn .. ": expected logits of at least one dim (the categories)") end
    self.logits = logits - logits:logsumexp(-1, true)
    self.probs = self.logits:exp()
  end
  local shape = self.probs:size()
  self.num_categories = table.remove(shape)
  self.batch_shape, self.event_shape = shape, {}
end
function Categorical:sample(shape)
  return no_grad(function()
    local n = 1
    for _, s in ipairs(shape or {}) do n = n * s end
    local flat = self.probs:reshape(-1, self.num_categories)
    local draws = torch.multinomial(flat, n, true)                     -- (batch, n)
    local out = sample_shape(shape, self.batch_shape)
    return draws:t():reshape(out)
  end)
end
-- the logits with -inf replaced by the smallest float, so that p log p is 0 where p is
local function finite_logits(logits)
  return logits:clamp(logits.dtype == torch.float64 and -1.7976931348623157e308 or -3.4028234663852886e38)
end
function Categorical:log_prob(value)
  if not is_tensor(value) or value.dtype ~= torch.int64 then raise("Categorical.log_prob: expected int64 category indices") end
  in_support(self, value:ge(0):logical_and(value:lt(self.num_categories)),
             "a category index in [0, " .. self.num_categories .. ")")
  local shape = torch.broadcast_shapes(value:size(), self.batch_shape)
  local lshape = { unpack(shape) }
  lshape[#lshape + 1] = self.num_categories
  return self.logits:expand(lshape):gather(-1, value:expand(shape):unsqueeze(-1)):squeeze(-1)
end
function Categorical:entropy() return -(self.probs * finite_logits(self.logits)):sum(-1) end

---------------------------------------------------------------- Bernoulli

-- Bernoulli(probs) or Bernoulli({probs = } | {logits = }).
local Bernoulli = class("Bernoulli", { "probs", "logits" })
local function softplus(z)
  local r = z:relu()
  return r + (z - r * 2):exp():log1p()
end
function Bernoulli:__init(a, opts)
  local fn = "Bernoulli"
  local probs, logits = probs_or_logits(fn, a)
  if type(a) == "table" and not is_tensor(a) and opts == nil then opts = a end
  local validate = validating(self, opts)
  if probs ~= nil then
    probs = param(probs, fn, "probs")
    if validate then check(probs:ge(0):logical_and(probs:le(1)), fn, "probs", "in [0, 1]") end
    self.probs = probs
    local p = clamp_probs(probs)
    self.logits = p:log() - (1 - p):log()
  else
    self.logits = param(logits, fn, "logits")
    self.probs = self.logits:sigmoid()
  end
  self.batch_shape, self.event_shape = self.probs:size(), {}
  self.mean, self.variance = self.probs, self.probs * (1 - self.probs)
end
function Bernoulli:sample(shape)
  return no_grad(function()
    local probs = self.probs:expand(sample_shape(shape, self.batch_shape))
    return torch.rand_like(probs):lt(probs):to(probs.dtype)
  end)
end
-- value log p + (1 - value) log(1 - p) from the logits, without overflow
function Bernoulli:log_prob(value)
  in_support(self, value:eq(0):logical_or(value:eq(1)), "0 or 1")
  return value * self.logits - softplus(self.logits)
end
function Bernoulli:entropy() return softplus(self.logits) - self.probs * self.logits end

---------------------------------------------------------------- Uniform

-- Uniform(low, high): low < high.
local Uniform = class("Uniform", { "low", "high" })
function Uniform:__init(low, high, opts)
  local fn = "Uniform"
  low = param(low, fn, "low", is_tensor(high) and high or nil)
  high = param(high, fn, "high", low)
  if validating(self, opts) then check(low:lt(high), fn, "low", "less than high") end
  self.low, self.high = torch.broadcast_tensors(low, high)
  self.batch_shape, self.event_shape = self.low:size(), {}
  local w = self.high - self.low
  self.mean, self.variance, self.stddev = (self.low + self.high) / 2, w * w / 12, w / math.sqrt(12)
end
function Uniform:rsample(shape)
  local u = torch.rand(sample_shape(shape, self.batch_shape), { dtype = self.low.dtype, device = self.low.device })
  return self.low + u * (self.high - self.low)
end
function Uniform:sample(shape) return no_grad(function() return self:rsample(shape) end) end
function Uniform:log_prob(value)
  local inside = value:ge(self.low):logical_and(value:lt(self.high))
  in_support(self, inside, "within [low, high)")
  return torch.where(inside, -(self.high - self.low):log(), -math.huge)
end
function Uniform:entropy() return (self.high - self.low):log() end

---------------------------------------------------------------- Independent

-- Independent(base, reinterpreted_batch_ndims): the base's last batch
-- dims taken as one event: log_prob and entropy summed over them.
local Independent = class("Independent", {})
function Independent:__init(base, n)
  if type(base) ~= "table" or not base.log_prob then raise("Independent: expected a distribution") end
  if type(n) ~= "number" or n < 0 or n > #base.batch_shape then
    raise(string.format("Independent: expected reinterpreted_batch_ndims in [0, %d], got %s", #base.batch_shape,
                        tostring(n)))
  end
  self.base_dist, self.reinterpreted_batch_ndims = base, n
  local shape = {}
  for i = 1, #base.batch_shape - n do shape[i] = base.batch_shape[i] end
  self.batch_shape = shape
  self.mean, self.variance, self.stddev = base.mean, base.variance, base.stddev
end
local function sum_last(t, n)
  for _ = 1, n do t = t:sum(-1) end
  return t
end
function Independent:sample(shape) return self.base_dist:sample(shape) end
function Independent:rsample(shape) return self.base_dist:rsample(shape) end
function Independent:log_prob(value) return sum_last(self.base_dist:log_prob(value), self.reinterpreted_batch_ndims) end
function Independent:entropy() return sum_last(self.base_dist:entropy(), self.reinterpreted_batch_ndims) end
Independent.__tostring = function(self)
  return "Independent(" .. tostring(self.base_dist) .. ", " .. self.reinterpreted_batch_ndims .. ")"
end

---------------------------------------------------------------- kl_divergence

local function kind(d) return getmetatable(d) and getmetatable(d).__name end

-- kl_divergence(p, q): KL(p || q) for two of one kind (Normal, Categorical,
-- Bernoulli, Uniform, Independent of those).
function M.kl_divergence(p, q)
  local kp, kq = kind(p), kind(q)
  if kp ~= kq or kp == nil then
    raise(string.format("kl_divergence: no formula for %s and %s (both must be of one kind)", tostring(kp), tostring(kq)))
  end
  if kp == "Normal" then
    local r = p.scale / q.scale
    local d = (p.loc - q.loc) / q.scale
    return (r * r + d * d - 1) * 0.5 - r:log()
  elseif kp == "Categorical" then
    local t = p.probs * (p.logits - q.logits)
    return torch.where(p.probs:eq(0), 0, t):sum(-1)
  elseif kp == "Bernoulli" then
    return p.probs * (softplus(-q.logits) - softplus(-p.logits)) + (1 - p.probs) * (softplus(q.logits) - softplus(p.logits))
  elseif kp == "Uniform" then
    local inside = q.low:le(p.low):logical_and(q.high:ge(p.high))
    return torch.where(inside, ((q.high - q.low) / (p.high - p.low)):log(), math.huge)
  elseif kp == "Independent" then
    if p.reinterpreted_batch_ndims ~= q.reinterpreted_batch_ndims then
      raise("kl_divergence: Independent distributions of different event dims")
    end
    return sum_last(M.kl_divergence(p.base_dist, q.base_dist), p.reinterpreted_batch_ndims)
  end
  raise("kl_divergence: no formula for " .. kp)
end
M.kl = { kl_divergence = M.kl_divergence }

return M
