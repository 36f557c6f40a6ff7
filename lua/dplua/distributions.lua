-- dplua.distributions: torch.distributions' Normal, Categorical,
-- Bernoulli, Uniform, Independent, Exponential, Laplace, Cauchy,
-- LogNormal, HalfNormal, HalfCauchy, Gumbel, Weibull, Pareto, StudentT,
-- Gamma, Chi2, Beta, Dirichlet, Kumaraswamy, FisherSnedecor, Poisson,
-- Geometric, Binomial, NegativeBinomial, Multinomial, OneHotCategorical
-- (and its StraightThrough form), RelaxedBernoulli, RelaxedOneHotCategorical,
-- ContinuousBernoulli, VonMises, Wishart, LKJCholesky, MultivariateNormal,
-- LowRankMultivariateNormal, MixtureSameFamily and TransformedDistribution,
-- the Distribution base class, and kl_divergence between two of one kind
-- (register_kl adds more), as compositions of tensor ops (gradients flow
-- to the parameters through
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

-- torch.distributions.Distribution: the base of every class here, and of a
-- distribution of one's own (Distribution:extend, or extending any class):
--
--   local Tri = D.Distribution:extend("Triangular")
--   function Tri:__init(c, opts)
--     self.c = c
--     D.Distribution.__init(self, c:size(), {}, opts)   -- batch_shape, event_shape, {validate_args}
--   end
--   function Tri:log_prob(x) ... end
--   function Tri:rsample(shape) ... end              -- then sample() is rsample's draw without a gradient
local Distribution = { __name = "Distribution" }
Distribution.__index = Distribution
M.Distribution = Distribution

-- A class named `name` whose instances print `params`, under parent.
local function new_class(name, params, parent)
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
  return setmetatable(cls, { __index = parent, __call = function(c, ...)
    local self = setmetatable({}, c)
    self:__init(...)
    return self
  end })
end
-- A class of torch.distributions with PyTorch's name.
local function class(name, params)
  M[name] = new_class(name, params, Distribution)
  return M[name]
end

function Distribution:extend(name)
  if type(name) ~= "string" then raise("Distribution:extend: expected the new class's name, got " .. type(name)) end
  return new_class(name, {}, self)
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

-- What every distribution has. __init(batch_shape, event_shape [, {validate_args}])
-- for classes of one's own; what a class does not define raises, naming it.
function Distribution:__init(batch_shape, event_shape, opts)
  for _, a in ipairs({ { "batch_shape", batch_shape }, { "event_shape", event_shape } }) do
    if a[2] ~= nil and type(a[2]) ~= "table" then
      raise(string.format("%s: expected %s to be a list of sizes, got %s", self.__name, a[1], type(a[2])))
    end
  end
  self.batch_shape, self.event_shape = batch_shape or {}, event_shape or {}
  validating(self, opts)
end
for _, what in ipairs({ "rsample", "log_prob", "entropy", "cdf", "icdf", "enumerate_support" }) do
  Distribution[what] = function(self) raise(string.format("%s.%s is not implemented", self.__name, what)) end
end
function Distribution:sample(shape) return no_grad(function() return self:rsample(shape) end) end
function Distribution:sample_n(n) return self:sample({ n }) end
function Distribution:perplexity() return self:entropy():exp() end

---------------------------------------------------------------- constraints, biject_to, transform_to

-- torch.distributions.constraints: what values a distribution's support
-- or parameter may take. Each constraint has check(value) (a bool tensor,
-- reduced over its event_dim rightmost dims), event_dim and is_discrete,
-- and prints as PyTorch's ("GreaterThan(lower_bound=0.0)").
local Constraint = {}
Constraint.__index = Constraint
Constraint.__tostring = function(c) return c._repr end
local function py_number(v)   -- as Python prints a float bound
  if is_tensor(v) then v = v:numel() == 1 and v:item() or v end
  if type(v) ~= "number" then return tostring(v) end
  if v % 1 == 0 and math.abs(v) < 1e16 then return string.format("%.1f", v) end
  return string.format("%.17g", v)
end
local function constraint(kind, repr, check, opts)
  opts = opts or {}
  return setmetatable({ kind = kind, _repr = repr, _check = check, event_dim = opts.event_dim or 0,
                        is_discrete = opts.is_discrete or false, lower_bound = opts.lower_bound,
                        upper_bound = opts.upper_bound, base_constraint = opts.base,
                        reinterpreted_batch_ndims = opts.ndims }, Constraint)
end
function Constraint:check(value)
  if not is_tensor(value) then raise(tostring(self) .. ".check: expected a tensor, got " .. type(value)) end
  return self._check(value)
end
local function integral(v) return v:eq(v:floor()) end
local function all_last(t, n)
  for _ = 1, n do t = t:all(-1) end
  return t
end
local K = {}
M.constraints = K
K.real = constraint("real", "Real()", function(v) return v:eq(v) end)
K.boolean = constraint("boolean", "Boolean()", function(v) return v:eq(0):logical_or(v:eq(1)) end, { is_discrete = true })
K.nonnegative_integer = constraint("integer_greater_than", "IntegerGreaterThan(lower_bound=0)",
  function(v) return integral(v):logical_and(v:ge(0)) end, { is_discrete = true, lower_bound = 0 })
K.positive_integer = constraint("integer_greater_than", "IntegerGreaterThan(lower_bound=1)",
  function(v) return integral(v):logical_and(v:ge(1)) end, { is_discrete = true, lower_bound = 1 })
function K.integer_interval(lo, hi)
  return constraint("integer_interval", string.format("IntegerInterval(lower_bound=%s, upper_bound=%s)", tostring(lo),
                                                      is_tensor(hi) and py_number(hi) or tostring(hi)),
                    function(v) return integral(v):logical_and(v:ge(lo)):logical_and(v:le(hi)) end,
                    { is_discrete = true, lower_bound = lo, upper_bound = hi })
end
function K.greater_than(lo)
  return constraint("greater_than", "GreaterThan(lower_bound=" .. py_number(lo) .. ")", function(v) return v:gt(lo) end,
                    { lower_bound = lo })
end
function K.greater_than_eq(lo)
  return constraint("greater_than_eq", "GreaterThanEq(lower_bound=" .. py_number(lo) .. ")",
                    function(v) return v:ge(lo) end, { lower_bound = lo })
end
function K.less_than(hi)
  return constraint("less_than", "LessThan(upper_bound=" .. py_number(hi) .. ")", function(v) return v:lt(hi) end,
                    { upper_bound = hi })
end
function K.interval(lo, hi)
  return constraint("interval", string.format("Interval(lower_bound=%s, upper_bound=%s)", py_number(lo), py_number(hi)),
                    function(v) return v:ge(lo):logical_and(v:le(hi)) end, { lower_bound = lo, upper_bound = hi })
end
function K.half_open_interval(lo, hi)
  return constraint("half_open_interval", string.format("HalfOpenInterval(lower_bound=%s, upper_bound=%s)",
                                                        py_number(lo), py_number(hi)),
                    function(v) return v:ge(lo):logical_and(v:lt(hi)) end, { lower_bound = lo, upper_bound = hi })
end
K.positive = K.greater_than(0)
K.nonnegative = K.greater_than_eq(0)
K.unit_interval = K.interval(0, 1)
K.simplex = constraint("simplex", "Simplex()", function(v)
  return v:ge(0):all(-1):logical_and((v:sum(-1) - 1):abs():lt(1e-6))
end, { event_dim = 1 })
K.one_hot = constraint("one_hot", "OneHot()", function(v)
  return v:eq(0):logical_or(v:eq(1)):all(-1):logical_and(v:sum(-1):eq(1))
end, { event_dim = 1, is_discrete = true })
K.lower_triangular = constraint("lower_triangular", "LowerTriangular()",
  function(v) return v:tril():eq(v):all(-1):all(-1) end, { event_dim = 2 })
K.lower_cholesky = constraint("lower_cholesky", "LowerCholesky()", function(v)
  return v:tril():eq(v):all(-1):all(-1):logical_and(v:diagonal(0, -2, -1):gt(0):all(-1))
end, { event_dim = 2 })
K.corr_cholesky = constraint("corr_cholesky", "CorrCholesky()", function(v)
  local tol = torch.finfo(v.dtype).eps * v:size(-1) * 10
  local unit_rows = (v:norm(2, -1) - 1):abs():le(tol):all(-1)
  return K.lower_cholesky:check(v):logical_and(unit_rows)
end, { event_dim = 2 })
K.positive_definite = constraint("positive_definite", "PositiveDefinite()", function(v)
  local sym = (v - v:transpose(-2, -1)):abs():le(1e-6):all(-1):all(-1)
  return sym:logical_and(select(2, torch.linalg.cholesky_ex(v)):eq(0))
end, { event_dim = 2 })
function K.independent(base, n)
  if getmetatable(base) ~= Constraint then raise("constraints.independent: expected a constraint") end
  if type(n) ~= "number" or n % 1 ~= 0 or n < 0 then raise("constraints.independent: expected a non-negative count of dims") end
  return constraint("independent", string.format("IndependentConstraint(%s, %d)", tostring(base), n),
                    function(v) return all_last(base:check(v), n) end,
                    { event_dim = base.event_dim + n, is_discrete = base.is_discrete, base = base, ndims = n })
end
K.real_vector = K.independent(K.real, 1)

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
function Normal:icdf(value) return self.loc + self.scale * (value * 2 - 1):erfinv() * math.sqrt(2) end

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
  self.support = K.integer_interval(0, self.num_categories - 1)
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
-- The probability of a success (Bernoulli, Geometric) from probs or
-- logits, whichever was given: self.probs and self.logits, and the shapes;
-- probs checked in [0, 1], or (0, 1] without zero_allowed.
local function success_probs(self, fn, a, opts, zero_allowed)
  local probs, logits = probs_or_logits(fn, a)
  if type(a) == "table" and not is_tensor(a) and opts == nil then opts = a end
  local validate = validating(self, opts)
  if probs ~= nil then
    probs = param(probs, fn, "probs")
    if validate then
      local low = zero_allowed and probs:ge(0) or probs:gt(0)
      check(low:logical_and(probs:le(1)), fn, "probs", zero_allowed and "in [0, 1]" or "in (0, 1]")
    end
    self.probs = probs
    local p = clamp_probs(probs)
    self.logits = p:log() - (1 - p):log()
  else
    self.logits = param(logits, fn, "logits")
    self.probs = self.logits:sigmoid()
  end
  self.batch_shape, self.event_shape = self.probs:size(), {}
end

function Bernoulli:__init(a, opts)
  success_probs(self, "Bernoulli", a, opts, true)
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
  self.support = K.interval(self.low, self.high)
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
  local shape, event = {}, {}
  for i = 1, #base.batch_shape - n do shape[i] = base.batch_shape[i] end
  for i = #base.batch_shape - n + 1, #base.batch_shape do event[#event + 1] = base.batch_shape[i] end
  for _, e in ipairs(base.event_shape or {}) do event[#event + 1] = e end
  self.batch_shape, self.event_shape = shape, event
  self.mean, self.variance, self.stddev = base.mean, base.variance, base.stddev
  if base.support then self.support = K.independent(base.support, n) end
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

---------------------------------------------------------------- continuous, of one variable

-- Two parameters broadcast together (numbers become tensors of the other's
-- dtype and device), each checked positive where named so.
local function two_params(self, fn, names, a, b, positive, opts)
  a = param(a, fn, names[1], is_tensor(b) and b or nil)
  b = param(b, fn, names[2], a)
  if validating(self, opts) then
    for i, v in ipairs({ a, b }) do
      if positive[i] then check(v:gt(0), fn, names[i], "positive") end
    end
  end
  a, b = torch.broadcast_tensors(a, b)
  self[names[1]], self[names[2]] = a, b
  self.batch_shape, self.event_shape = a:size(), {}
  return a, b
end

-- one parameter, checked positive
local function one_param(self, fn, name, v, opts)
  v = param(v, fn, name)
  if validating(self, opts) then check(v:gt(0), fn, name, "positive") end
  self[name] = v
  self.batch_shape, self.event_shape = v:size(), {}
  return v
end

-- uniform draws in (0, 1), never 0, of the batch's shape after shape
local function open_uniform(shape, like)
  local u = torch.rand(shape, { dtype = like.dtype, device = like.device })
  local tiny = like.dtype == torch.float64 and 2.2250738585072014e-308 or 1.1754943508222875e-38
  return u:clamp(tiny, nil)
end

-- Exponential(rate)
local Exponential = class("Exponential", { "rate" })
function Exponential:__init(rate, opts)
  rate = one_param(self, "Exponential", "rate", rate, opts)
  self.mean, self.variance, self.stddev = rate:reciprocal(), rate:square():reciprocal(), rate:reciprocal()
end
function Exponential:rsample(shape)
  return -open_uniform(sample_shape(shape, self.batch_shape), self.rate):log() / self.rate
end
function Exponential:log_prob(value)
  in_support(self, value:ge(0), "non-negative")
  return self.rate:log() - self.rate * value
end
function Exponential:entropy() return 1 - self.rate:log() end
function Exponential:cdf(value) return 1 - (-self.rate * value):exp() end
function Exponential:icdf(p) return -(-p):log1p() / self.rate end

-- Laplace(loc, scale)
local Laplace = class("Laplace", { "loc", "scale" })
function Laplace:__init(loc, scale, opts)
  two_params(self, "Laplace", { "loc", "scale" }, loc, scale, { false, true }, opts)
  self.mean, self.variance, self.stddev = self.loc, self.scale:square() * 2, self.scale * math.sqrt(2)
end
function Laplace:rsample(shape)
  local tiny = self.loc.dtype == torch.float64 and 2.220446049250313e-16 or 1.1920928955078125e-07
  local u = torch.rand(sample_shape(shape, self.batch_shape), { dtype = self.loc.dtype, device = self.loc.device })
  u = u * 2 - 1
  u = u:clamp(-1 + tiny, nil)
  return self.loc - self.scale * u:sign() * (-u:abs()):log1p()
end
function Laplace:log_prob(value) return -(self.scale * 2):log() - (value - self.loc):abs() / self.scale end
function Laplace:entropy() return (self.scale * 2):log() + 1 end
function Laplace:cdf(value)
  local d = value - self.loc
  return 0.5 - 0.5 * d:sign() * (-d:abs() / self.scale):expm1()
end

-- Cauchy(loc, scale)
local Cauchy = class("Cauchy", { "loc", "scale" })
function Cauchy:__init(loc, scale, opts)
  two_params(self, "Cauchy", { "loc", "scale" }, loc, scale, { false, true }, opts)
  self.mean = torch.full_like(self.loc, 0 / 0)
  self.variance = torch.full_like(self.loc, math.huge)
end
function Cauchy:rsample(shape)
  local u = torch.rand(sample_shape(shape, self.batch_shape), { dtype = self.loc.dtype, device = self.loc.device })
  return self.loc + self.scale * ((u - 0.5) * math.pi):tan()
end
function Cauchy:log_prob(value)
  return -math.log(math.pi) - self.scale:log() - ((value - self.loc) / self.scale):square():log1p()
end
function Cauchy:entropy() return (self.scale * (4 * math.pi)):log() end
function Cauchy:cdf(value) return ((value - self.loc) / self.scale):atan() / math.pi + 0.5 end

-- LogNormal(loc, scale): exp of Normal(loc, scale).
local LogNormal = class("LogNormal", { "loc", "scale" })
function LogNormal:__init(loc, scale, opts)
  two_params(self, "LogNormal", { "loc", "scale" }, loc, scale, { false, true }, opts)
  self.base_dist = M.Normal(self.loc, self.scale, { validate_args = false })
  local s2 = self.scale:square()
  self.mean = (self.loc + s2 / 2):exp()
  self.variance = s2:expm1() * (self.loc * 2 + s2):exp()
  self.stddev = self.variance:sqrt()
end
function LogNormal:rsample(shape) return self.base_dist:rsample(shape):exp() end
function LogNormal:log_prob(value)
  in_support(self, value:gt(0), "positive")
  local y = value:log()
  return self.base_dist:log_prob(y) - y
end
function LogNormal:entropy() return self.base_dist:entropy() + self.loc end

-- HalfNormal(scale): |Normal(0, scale)|.
local HalfNormal = class("HalfNormal", { "scale" })
function HalfNormal:__init(scale, opts)
  scale = one_param(self, "HalfNormal", "scale", scale, opts)
  self.base_dist = M.Normal(torch.zeros_like(scale), scale, { validate_args = false })
  self.mean = scale * math.sqrt(2 / math.pi)
  self.variance = scale:square() * (1 - 2 / math.pi)
  self.stddev = self.variance:sqrt()
end
function HalfNormal:rsample(shape) return self.base_dist:rsample(shape):abs() end
function HalfNormal:log_prob(value)
  in_support(self, value:ge(0), "non-negative")
  return self.base_dist:log_prob(value) + math.log(2)
end
function HalfNormal:entropy() return self.base_dist:entropy() - math.log(2) end
function HalfNormal:cdf(value) return self.base_dist:cdf(value) * 2 - 1 end

local EULER = 0.57721566490153286

-- Gumbel(loc, scale)
local Gumbel = class("Gumbel", { "loc", "scale" })
function Gumbel:__init(loc, scale, opts)
  two_params(self, "Gumbel", { "loc", "scale" }, loc, scale, { false, true }, opts)
  self.mean = self.loc + self.scale * EULER
  self.variance = self.scale:square() * (math.pi ^ 2 / 6)
  self.stddev = self.variance:sqrt()
end
function Gumbel:rsample(shape)
  local u = open_uniform(sample_shape(shape, self.batch_shape), self.loc)
  return self.loc - self.scale * (-u:log()):log()
end
function Gumbel:log_prob(value)
  local z = (value - self.loc) / self.scale
  return -(self.scale:log() + z + (-z):exp())
end
function Gumbel:entropy() return self.scale:log() + (1 + EULER) end

-- Weibull(scale, concentration)
local Weibull = class("Weibull", { "scale", "concentration" })
function Weibull:__init(scale, concentration, opts)
  two_params(self, "Weibull", { "scale", "concentration" }, scale, concentration, { true, true }, opts)
  local k_inv = self.concentration:reciprocal()
  self.mean = self.scale * (k_inv + 1):lgamma():exp()
  self.variance = self.scale:square() * ((k_inv * 2 + 1):lgamma():exp() - (k_inv + 1):lgamma():exp():square())
  self.stddev = self.variance:sqrt()
end
function Weibull:rsample(shape)
  local u = open_uniform(sample_shape(shape, self.batch_shape), self.scale)
  return self.scale * (-(-u):log1p()) ^ self.concentration:reciprocal()
end
function Weibull:log_prob(value)
  in_support(self, value:ge(0), "non-negative")
  local k, lam = self.concentration, self.scale
  local z = value / lam
  return (k / lam):log() + (k - 1) * z:log() - z ^ k
end
function Weibull:entropy()
  local k = self.concentration
  return EULER * (1 - k:reciprocal()) + (self.scale / k):log() + 1
end

-- Pareto(scale, alpha): scale exp(E), E ~ Exponential(alpha)
local Pareto = class("Pareto", { "scale", "alpha" })
function Pareto:__init(scale, alpha, opts)
  two_params(self, "Pareto", { "scale", "alpha" }, scale, alpha, { true, true }, opts)
  local a, s = self.alpha, self.scale
  self.mean = torch.where(a:gt(1), a * s / torch.where(a:gt(1), a - 1, 1), math.huge)
  local a2 = torch.where(a:gt(2), a, 3)
  self.variance = torch.where(a:gt(2), s:square() * a2 / ((a2 - 1):square() * (a2 - 2)), math.huge)
  self.support = K.greater_than_eq(self.scale)
end
function Pareto:rsample(shape)
  local u = open_uniform(sample_shape(shape, self.batch_shape), self.scale)
  return self.scale * (-u:log() / self.alpha):exp()
end
function Pareto:log_prob(value)
  in_support(self, value:ge(self.scale), "at least scale")
  return self.alpha:log() + self.alpha * self.scale:log() - (self.alpha + 1) * value:log()
end
function Pareto:entropy() return (self.scale / self.alpha):log() + self.alpha:reciprocal() + 1 end

-- sample(): rsample's draw without a gradient
for _, cls in ipairs({ Exponential, Laplace, Cauchy, LogNormal, HalfNormal, Gumbel, Weibull, Pareto }) do
  function cls:sample(shape) return no_grad(function() return self:rsample(shape) end) end
end

---------------------------------------------------------------- the gamma family

-- Gamma(1) ... Gamma(concentration) draws by Marsaglia and Tsang's
-- method, for every element at once: candidates are drawn for the
-- elements still waiting until each has one accepted; concentrations
-- below 1 draw at concentration + 1 and scale by u^(1/concentration).
local function standard_gamma_draw(alpha)
  return no_grad(function()
    local boost = alpha:lt(1)
    local a = torch.where(boost, alpha + 1, alpha)
    local d = a - 1 / 3
    local c = (d * 9):sqrt():reciprocal()
    local out = torch.zeros_like(a)
    local waiting = torch.ones_like(a):to(torch.bool)
    for _ = 1, 1000 do
      local x = torch.randn_like(a)
      local v = (x * c + 1) ^ 3
      local u = open_uniform(a:size(), a)
      local ok = v:gt(0):logical_and(u:log():lt(x:square() * 0.5 + d - d * v + d * torch.where(v:gt(0), v, 1):log()))
      local take = ok:logical_and(waiting)
      out = torch.where(take, d * v, out)
      waiting = waiting:logical_and(take:logical_not())
      if not waiting:any():item() then break end
    end
    local u = open_uniform(a:size(), a)
    return torch.where(boost, out * u:pow(torch.where(boost, alpha, 1):reciprocal()), out)
  end)
end

-- standard_gamma(alpha): Gamma(alpha, 1) draws (at least the dtype's
-- tiny, as PyTorch's), differentiable in alpha by implicit
-- reparameterisation: d x / d alpha = -(d P(alpha, x) / d alpha) / density
-- at the draw (torch._standard_gamma_grad), as PyTorch's rsample.
local StandardGamma
local function standard_gamma(alpha)
  if not (alpha.requires_grad and torch.is_grad_enabled()) then
    return standard_gamma_draw(alpha):clamp(torch.finfo(alpha.dtype).tiny, nil)
  end
  if StandardGamma == nil then
    StandardGamma = require("dplua.autograd").Function:extend("StandardGammaBackward0")
    function StandardGamma.forward(ctx, a)
      local x = standard_gamma_draw(a):clamp(torch.finfo(a.dtype).tiny, nil)
      ctx:save_for_backward(a, x)
      return x
    end
    function StandardGamma.backward(ctx, g)
      local a, x = unpack(ctx.saved_tensors)
      return g * torch._standard_gamma_grad(a, x)
    end
  end
  return StandardGamma.apply(alpha)
end

local function no_rsample(self)
  raise(self.__name .. ".rsample is not implemented (nor is it in PyTorch); sample() draws without a gradient")
end

-- Gamma(concentration, rate)
local Gamma = class("Gamma", { "concentration", "rate" })
function Gamma:__init(concentration, rate, opts)
  two_params(self, "Gamma", { "concentration", "rate" }, concentration, rate, { true, true }, opts)
  self.mean = self.concentration / self.rate
  self.variance = self.concentration / self.rate:square()
  self.stddev = self.variance:sqrt()
end
function Gamma:rsample(shape)
  local a = self.concentration:expand(sample_shape(shape, self.batch_shape))
  return standard_gamma(a:contiguous()) / self.rate
end
function Gamma:log_prob(value)
  in_support(self, value:gt(0), "positive")
  local a, b = self.concentration, self.rate
  return a * b:log() + (a - 1) * value:log() - b * value - a:lgamma()
end
function Gamma:cdf(value) return torch.special.gammainc(self.concentration, self.rate * value) end
function Gamma:entropy()
  local a = self.concentration
  return a - self.rate:log() + a:lgamma() + (1 - a) * a:digamma()
end

-- Chi2(df): Gamma(df / 2, 1 / 2).
local Chi2 = class("Chi2", { "df" })
function Chi2:__init(df, opts)
  df = one_param(self, "Chi2", "df", df, opts)
  self._gamma = M.Gamma(df / 2, torch.full_like(df, 0.5), { validate_args = false })
  self.mean, self.variance = self._gamma.mean, self._gamma.variance
end
function Chi2:rsample(shape) return self._gamma:rsample(shape) end
function Chi2:log_prob(value)
  in_support(self, value:gt(0), "positive")
  return self._gamma:log_prob(value)
end
function Chi2:entropy() return self._gamma:entropy() end
function Chi2:cdf(value) return self._gamma:cdf(value) end

-- Dirichlet(concentration): over the last dim.
local Dirichlet = class("Dirichlet", { "concentration" })
function Dirichlet:__init(concentration, opts)
  local fn = "Dirichlet"
  local c = param(concentration, fn, "concentration")
  if c:dim() < 1 then raise(fn .. ": expected concentration of at least one dim (the categories)") end
  if validating(self, opts) then check(c:gt(0), fn, "concentration", "positive") end
  self.concentration = c
  local shape = c:size()
  self.event_shape = { table.remove(shape) }
  self.batch_shape = shape
  local a0 = c:sum(-1, true)
  self.mean = c / a0
  self.variance = c * (a0 - c) / (a0:square() * (a0 + 1))
end
-- (rsample's gradient: through the normalised gamma draws, each
-- reparameterised; PyTorch differentiates the Dirichlet draw as a whole,
-- which gives other per-draw gradients with the same expectation)
function Dirichlet:rsample(shape)
  local full = sample_shape(shape, self.batch_shape)
  full[#full + 1] = self.event_shape[1]
  local g = standard_gamma(self.concentration:expand(full):contiguous())
  return g / g:sum(-1, true)
end
function Dirichlet:log_prob(value)
  in_support(self, value:ge(0), "on the simplex (non-negative, summing to 1)")
  in_support(self, (value:sum(-1) - 1):abs():lt(1e-6), "on the simplex (non-negative, summing to 1)")
  local c = self.concentration
  return (value:log() * (c - 1)):sum(-1) + c:sum(-1):lgamma() - c:lgamma():sum(-1)
end
function Dirichlet:entropy()
  local c = self.concentration
  local k = c:size(-1)
  local a0 = c:sum(-1)
  return c:lgamma():sum(-1) - a0:lgamma() + (a0 - k) * a0:digamma() - ((c - 1) * c:digamma()):sum(-1)
end

-- Beta(concentration1, concentration0): the Dirichlet of the pair.
local Beta = class("Beta", { "concentration1", "concentration0" })
function Beta:__init(c1, c0, opts)
  two_params(self, "Beta", { "concentration1", "concentration0" }, c1, c0, { true, true }, opts)
  self._dirichlet = M.Dirichlet(torch.stack({ self.concentration1, self.concentration0 }, -1), { validate_args = false })
  local total = self.concentration1 + self.concentration0
  self.mean = self.concentration1 / total
  self.variance = self.concentration1 * self.concentration0 / (total:square() * (total + 1))
end
function Beta:rsample(shape) return self._dirichlet:rsample(shape):select(-1, 0) end
function Beta:log_prob(value)
  in_support(self, value:ge(0):logical_and(value:le(1)), "in [0, 1]")
  return self._dirichlet:log_prob(torch.stack({ value, 1 - value }, -1))
end
function Beta:entropy() return self._dirichlet:entropy() end

-- StudentT(df [, loc = 0, scale = 1]): draws as Normal / sqrt(Chi2(df) / df)
local StudentT = class("StudentT", { "df", "loc", "scale" })
function StudentT:__init(df, loc, scale, opts)
  local fn = "StudentT"
  if type(loc) == "table" and not is_tensor(loc) then opts, loc, scale = loc, nil, nil end
  df = param(df, fn, "df")
  loc = param(loc or 0, fn, "loc", df)
  scale = param(scale or 1, fn, "scale", df)
  if validating(self, opts) then
    check(df:gt(0), fn, "df", "positive")
    check(scale:gt(0), fn, "scale", "positive")
  end
  self.df, self.loc, self.scale = torch.broadcast_tensors(df, loc, scale)
  self.batch_shape, self.event_shape = self.df:size(), {}
  local d = self.df
  self.mean = torch.where(d:gt(1), self.loc, 0 / 0)
  local d2 = torch.where(d:gt(2), d, 3)
  self.variance = torch.where(d:gt(2), self.scale:square() * d2 / (d2 - 2), torch.where(d:gt(1), math.huge, 0 / 0))
end
function StudentT:rsample(shape)
  local full = sample_shape(shape, self.batch_shape)
  local z = torch.randn(full, { dtype = self.df.dtype, device = self.df.device })
  local chi2 = standard_gamma((self.df / 2):expand(full):contiguous()) * 2
  return self.loc + self.scale * z * (chi2 / self.df):rsqrt()
end
function StudentT:log_prob(value)
  local y = (value - self.loc) / self.scale
  local d = self.df
  local Z = self.scale:log() + d:log() * 0.5 + 0.5 * math.log(math.pi) + (d * 0.5):lgamma() - ((d + 1) * 0.5):lgamma()
  return (y:square() / d):log1p() * ((d + 1) * -0.5) - Z
end
function StudentT:entropy()
  local d = self.df
  local lbeta = (d * 0.5):lgamma() + 0.5 * math.log(math.pi) - ((d + 1) * 0.5):lgamma()
  return self.scale:log() + ((d + 1) * 0.5) * (((d + 1) * 0.5):digamma() - (d * 0.5):digamma()) + d:log() * 0.5 + lbeta
end

---------------------------------------------------------------- discrete counts

-- Poisson(rate)
local Poisson = class("Poisson", { "rate" })
function Poisson:__init(rate, opts)
  rate = param(rate, "Poisson", "rate")
  if validating(self, opts) then check(rate:ge(0), "Poisson", "rate", "non-negative") end
  self.rate = rate
  self.batch_shape, self.event_shape = rate:size(), {}
  self.mean, self.variance = rate, rate
end
function Poisson:sample(shape)
  return no_grad(function() return torch.poisson(self.rate:expand(sample_shape(shape, self.batch_shape)):contiguous()) end)
end
local function is_count(v) return v:ge(0):logical_and(v:eq(v:floor())) end
function Poisson:log_prob(value)
  in_support(self, is_count(value), "a non-negative integer")
  return value:xlogy(self.rate) - self.rate - (value + 1):lgamma()
end

-- Geometric(probs) or Geometric({probs =} | {logits =}): the failures
-- before the first success.
local Geometric = class("Geometric", { "probs", "logits" })
function Geometric:__init(a, opts)
  success_probs(self, "Geometric", a, opts, false)
  self.mean = self.probs:reciprocal() - 1
  self.variance = self.mean / self.probs
end
function Geometric:sample(shape)
  return no_grad(function()
    local u = open_uniform(sample_shape(shape, self.batch_shape), self.probs)
    return (u:log() / (-clamp_probs(self.probs)):log1p()):floor()
  end)
end
function Geometric:log_prob(value)
  in_support(self, is_count(value), "a non-negative integer")
  local p = clamp_probs(self.probs)
  return value * (-p):log1p() + p:log()
end
function Geometric:entropy()
  local p, l = self.probs, self.logits
  return (softplus(l) - p * l) / p
end

-- Binomial(total_count, probs) or Binomial(total_count, {probs =} |
-- {logits =}): total_count a number or a tensor of counts.
local Binomial = class("Binomial", { "total_count", "probs", "logits" })
function Binomial:__init(total_count, a, opts)
  local fn = "Binomial"
  local probs, logits = probs_or_logits(fn, a)
  if type(a) == "table" and not is_tensor(a) and opts == nil then opts = a end
  local validate = validating(self, opts)
  local like = probs or logits
  like = is_tensor(like) and like or nil
  local n = param(total_count or 1, fn, "total_count", like)
  if validate then check(is_count(n), fn, "total_count", "a non-negative integer") end
  if probs ~= nil then
    probs = param(probs, fn, "probs", n)
    if validate then check(probs:ge(0):logical_and(probs:le(1)), fn, "probs", "in [0, 1]") end
    local p = clamp_probs(probs)
    self.total_count, self.probs = torch.broadcast_tensors(n, probs)
    self.logits = (p:log() - (1 - p):log()):expand(self.probs:size())
  else
    logits = param(logits, fn, "logits", n)
    self.total_count, self.logits = torch.broadcast_tensors(n, logits)
    self.probs = self.logits:sigmoid()
  end
  self.batch_shape, self.event_shape = self.probs:size(), {}
  self.mean = self.total_count * self.probs
  self.variance = self.mean * (1 - self.probs)
  self.support = K.integer_interval(0, self.total_count)
end
-- one Bernoulli draw per trial: memory of the largest count times the batch
function Binomial:sample(shape)
  return no_grad(function()
    local full = sample_shape(shape, self.batch_shape)
    local most = self.total_count:max():item()
    local n, p = self.total_count:expand(full), self.probs:expand(full)
    local o = { dtype = p.dtype, device = p.device }
    local trial_shape = { most }
    for i = 1, #full do trial_shape[i + 1] = 1 end
    local trial = torch.arange(0, most, o):reshape(trial_shape)
    local u = torch.rand({ most, unpack(full) }, o)
    return u:lt(p):logical_and(trial:lt(n)):to(p.dtype):sum(0)
  end)
end
function Binomial:log_prob(value)
  local n = self.total_count
  in_support(self, is_count(value):logical_and(value:le(n)), "an integer in [0, total_count]")
  local l = self.logits
  local log_norm = n * softplus(l) - (n + 1):lgamma()
  return value * l - log_norm - (value + 1):lgamma() - (n - value + 1):lgamma()
end

---------------------------------------------------------------- vectors

-- OneHotCategorical: Categorical's draws as one-hot vectors.
local OneHotCategorical = class("OneHotCategorical", { "probs", "logits" })
function OneHotCategorical:__init(a, opts)
  self._categorical = M.Categorical(a, opts)
  self._validate = self._categorical._validate
  self.probs, self.logits = self._categorical.probs, self._categorical.logits
  self.batch_shape = self._categorical.batch_shape
  self.event_shape = { self._categorical.num_categories }
  self.mean, self.variance = self.probs, self.probs * (1 - self.probs)
end
function OneHotCategorical:sample(shape)
  local idx = self._categorical:sample(shape)
  return torch.nn.functional.one_hot(idx, self.event_shape[1]):to(self.probs.dtype)
end
function OneHotCategorical:log_prob(value)
  in_support(self, value:eq(0):logical_or(value:eq(1)), "one-hot vectors")
  in_support(self, value:sum(-1):eq(1), "one-hot vectors")
  local _, idx = value:max(-1)
  return self._categorical:log_prob(idx)
end
function OneHotCategorical:entropy() return self._categorical:entropy() end

-- MultivariateNormal(loc, covariance_matrix) or MultivariateNormal(loc,
-- {covariance_matrix =} | {scale_tril =} | {precision_matrix =}): loc
-- (..., k), the matrix (..., k, k), batch dims broadcast; computed through
-- the Cholesky factor L of the covariance.
local MultivariateNormal = class("MultivariateNormal", { "loc" })
-- The matrix argument of MultivariateNormal and Wishart: a covariance
-- matrix, or one of {covariance_matrix =} | {scale_tril =} |
-- {precision_matrix =} (with validate_args beside it); returns the matrix,
-- which one it is and the options table (the last argument, or a).
local function matrix_argument(fn, a, opts, like)
  local given = is_tensor(a) and { covariance_matrix = a } or a
  if type(given) ~= "table" then raise(fn .. ": expected a covariance matrix or {covariance_matrix =} | {scale_tril =} | {precision_matrix =}") end
  local n, which = 0, nil
  for _, k in ipairs({ "covariance_matrix", "scale_tril", "precision_matrix" }) do
    if given[k] ~= nil then n, which = n + 1, k end
  end
  for k in pairs(given) do
    if k ~= "covariance_matrix" and k ~= "scale_tril" and k ~= "precision_matrix" and k ~= "validate_args" then
      raise(fn .. ": unknown option '" .. tostring(k) .. "'")
    end
  end
  if n ~= 1 then raise(fn .. ": expected exactly one of covariance_matrix, scale_tril or precision_matrix") end
  if not is_tensor(a) and opts == nil then opts = a end
  return param(given[which], fn, which, like), which, opts
end
-- Its lower Cholesky factor. Only the lower triangle of scale_tril is read,
-- and the matrices are read as symmetric, so gradients are PyTorch's
-- (symmetric ones).
local function scale_tril_of(m, which)
  local function sym(a) return (a + a:transpose(-1, -2)) * 0.5 end
  if which == "scale_tril" then return m:tril() end
  if which == "covariance_matrix" then return torch.linalg.cholesky(sym(m)) end
  return torch.linalg.cholesky(sym(torch.linalg.inv(sym(m))))
end

function MultivariateNormal:__init(loc, a, opts)
  local fn = "MultivariateNormal"
  loc = param(loc, fn, "loc")
  local m, which
  m, which, opts = matrix_argument(fn, a, opts, loc)
  validating(self, opts)
  if loc:dim() < 1 then raise(fn .. ": expected loc of at least one dim") end
  local k = loc:size(-1)
  if m:dim() < 2 or m:size(-1) ~= k or m:size(-2) ~= k then
    raise(string.format("%s: expected %s of shape (..., %d, %d) for loc of size %d, got [%s]", fn, which, k, k, k,
                        table.concat(m:size(), ", ")))
  end
  local L = scale_tril_of(m, which)
  local lb, mb = loc:size(), L:size()
  table.remove(lb); table.remove(mb); table.remove(mb)
  local batch = torch.broadcast_shapes(lb, mb)
  local vs, ms = { unpack(batch) }, { unpack(batch) }
  vs[#vs + 1] = k
  ms[#ms + 1], ms[#ms + 2] = k, k
  self.loc, self.scale_tril = loc:expand(vs), L:expand(ms)
  self.batch_shape, self.event_shape = batch, { k }
  self.covariance_matrix = self.scale_tril:matmul(self.scale_tril:transpose(-1, -2))
  self.mean = self.loc
  self.variance = self.scale_tril:square():sum(-1)
  self.stddev = self.variance:sqrt()
end
local function half_log_det(L) return L:diagonal(0, -2, -1):log():sum(-1) end
function MultivariateNormal:rsample(shape)
  local full = sample_shape(shape, self.batch_shape)
  full[#full + 1] = self.event_shape[1]
  local eps = torch.randn(full, { dtype = self.loc.dtype, device = self.loc.device })
  return self.loc + self.scale_tril:matmul(eps:unsqueeze(-1)):squeeze(-1)
end
MultivariateNormal.sample = Normal.sample
-- |L^-1 (x - mu)|^2, the Mahalanobis distance squared
local function mahalanobis(L, diff)
  local shape = torch.broadcast_shapes(diff:size(), (function()
    local s = L:size()
    table.remove(s)
    return s
  end)())
  local ms = { unpack(shape) }
  ms[#ms + 1] = shape[#shape]
  local z = torch.linalg.solve(L:expand(ms), diff:expand(shape))
  return z:square():sum(-1)
end
function MultivariateNormal:log_prob(value)
  local k = self.event_shape[1]
  local m = mahalanobis(self.scale_tril, value - self.loc)
  return -0.5 * (m + k * math.log(2 * math.pi)) - half_log_det(self.scale_tril)
end
function MultivariateNormal:entropy()
  local k = self.event_shape[1]
  return 0.5 * k * (1 + math.log(2 * math.pi)) + half_log_det(self.scale_tril)
end

---------------------------------------------------------------- mixtures

-- MixtureSameFamily(mixture_distribution, component_distribution): a
-- Categorical over K components (batch shape B) and a distribution of
-- batch shape (B..., K); log_prob is the log-sum-exp over the components of
-- their log_prob plus the mixing log-probabilities, a draw the component
-- that the Categorical picks.
local MixtureSameFamily = class("MixtureSameFamily", {})
function MixtureSameFamily:__init(mixture, component, opts)
  local fn = "MixtureSameFamily"
  if getmetatable(mixture) ~= M.Categorical then raise(fn .. ": expected the mixture distribution to be a Categorical") end
  if type(component) ~= "table" or not component.log_prob then raise(fn .. ": expected a component distribution") end
  validating(self, opts)
  local cb = component.batch_shape
  local k = cb[#cb]
  if k ~= mixture.num_categories then
    raise(string.format("%s: the mixture distribution has %d components but the component distribution's last batch "
                        .. "dim is %s", fn, mixture.num_categories, tostring(k)))
  end
  local batch = {}
  for i = 1, #cb - 1 do batch[i] = cb[i] end
  if table.concat(batch, ",") ~= table.concat(mixture.batch_shape, ",") then
    raise(string.format("%s: the mixture's batch shape [%s] is not the components' [%s]", fn,
                        table.concat(mixture.batch_shape, ", "), table.concat(batch, ", ")))
  end
  self.mixture_distribution, self.component_distribution = mixture, component
  self.batch_shape, self.event_shape = batch, component.event_shape or {}
  local ne = #self.event_shape
  -- the mixing weights shaped to broadcast against the components' statistics
  local w = mixture.probs
  for _ = 1, ne do w = w:unsqueeze(-1) end
  local dim = -1 - ne
  if component.mean ~= nil then
    self.mean = (w * component.mean):sum(dim)
    if component.variance ~= nil then
      local mean_cond = component.mean
      self.variance = (w * component.variance):sum(dim) + (w * (mean_cond - self.mean:unsqueeze(dim)):square()):sum(dim)
    end
  end
end
function MixtureSameFamily:log_prob(value)
  local ne = #self.event_shape
  local x = value:unsqueeze(-1 - ne)
  local lp = self.component_distribution:log_prob(x)
  return (lp + self.mixture_distribution.logits):logsumexp(-1)
end
function MixtureSameFamily:sample(shape)
  return no_grad(function()
    local idx = self.mixture_distribution:sample(shape)              -- (shape..., B...)
    local draws = self.component_distribution:sample(shape)          -- (shape..., B..., K, event...)
    local ne = #self.event_shape
    local gather_at = idx
    for _ = 0, ne do gather_at = gather_at:unsqueeze(-1) end         -- (..., 1, 1...)
    local target = draws:size()
    target[#target - ne] = 1
    return draws:gather(-1 - ne, gather_at:expand(target)):squeeze(-1 - ne)
  end)
end
function MixtureSameFamily:cdf(value)
  local x = value:unsqueeze(-1)
  return (self.component_distribution:cdf(x) * self.mixture_distribution.probs):sum(-1)
end

---------------------------------------------------------------- transforms

-- The bijections of torch.distributions.transforms: each has forward(x)
-- (also t(x)), inv(y), log_abs_det_jacobian(x, y) (elementwise, summed over
-- the transform's own event dims) and event_dim. With {cache_size = 1} a
-- transform remembers its last (x, y) pair, so that the inverse of a value
-- it gave is the x it came from (a tanh that saturated to 1 stays
-- invertible), as PyTorch's.
local Transform = {}
Transform.__index = Transform
local function transform_class(name, init)
  local cls = setmetatable({}, { __index = Transform, __call = function(c, ...)
    local self = setmetatable({ event_dim = 0 }, c)
    local opts = init(self, ...)
    local cache = type(opts) == "table" and opts.cache_size or 0
    if cache ~= 0 and cache ~= 1 then raise(name .. ": cache_size must be 0 or 1, got " .. tostring(cache)) end
    self._cached = cache == 1
    return self
  end })
  cls.__index = cls
  cls.__name = name
  cls.__call = function(self, x) return self:forward(x) end
  cls.__tostring = function() return name .. "()" end
  return cls
end
function Transform:forward(x)
  local y = self:_call(x)
  if self._cached then self._x, self._y = x, y end
  return y
end
function Transform:inv(y)
  if self._cached and rawequal(y, self._y) then return self._x end
  local x = self:_inverse(y)
  if self._cached then self._x, self._y = x, y end
  return x
end
local function sum_rightmost(t, n)
  for _ = 1, n do t = t:sum(-1) end
  return t
end
function Transform:log_abs_det_jacobian(x, y) return sum_rightmost(self:_ladj(x, y), self.event_dim) end

local T = {}
M.transforms = T

T.ExpTransform = transform_class("ExpTransform", function(_, opts) return opts end)
function T.ExpTransform:_call(x) return x:exp() end
function T.ExpTransform:_inverse(y) return y:log() end
function T.ExpTransform:_ladj(x) return x end

-- AffineTransform(loc, scale [, {event_dim = 0, cache_size}]): loc + scale x
T.AffineTransform = transform_class("AffineTransform", function(self, loc, scale, opts)
  if type(loc) ~= "number" and not is_tensor(loc) then raise("AffineTransform: expected loc to be a number or a tensor") end
  if type(scale) ~= "number" and not is_tensor(scale) then raise("AffineTransform: expected scale to be a number or a tensor") end
  self.loc, self.scale = loc, scale
  self.event_dim = type(opts) == "table" and opts.event_dim or 0
  return opts
end)
function T.AffineTransform:_call(x) return x * self.scale + self.loc end
function T.AffineTransform:_inverse(y) return (y - self.loc) / self.scale end
function T.AffineTransform:_ladj(x)
  local s = is_tensor(self.scale) and self.scale:abs():log() or math.log(math.abs(self.scale))
  return torch.zeros_like(x) + s
end

-- SigmoidTransform: its values kept within (tiny, 1 - eps) of the dtype
local function float_eps(t)
  local f = torch.finfo(t.dtype)
  return f.tiny, f.eps
end
T.SigmoidTransform = transform_class("SigmoidTransform", function(_, opts) return opts end)
function T.SigmoidTransform:_call(x)
  local tiny, eps = float_eps(x)
  return x:sigmoid():clamp(tiny, 1 - eps)
end
function T.SigmoidTransform:_inverse(y)
  local tiny, eps = float_eps(y)
  local c = y:clamp(tiny, 1 - eps)
  return c:log() - (-c):log1p()
end
function T.SigmoidTransform:_ladj(x) return -softplus(-x) - softplus(x) end

-- TanhTransform: log|d tanh| = 2 (log 2 - x - softplus(-2x)), stable for
-- large |x|
T.TanhTransform = transform_class("TanhTransform", function(_, opts) return opts end)
function T.TanhTransform:_call(x) return x:tanh() end
function T.TanhTransform:_inverse(y) return y:atanh() end
function T.TanhTransform:_ladj(x) return (math.log(2) - x - softplus(x * -2)) * 2 end

-- PowerTransform(exponent): x^exponent (for positive x)
T.PowerTransform = transform_class("PowerTransform", function(self, exponent, opts)
  if type(exponent) ~= "number" and not is_tensor(exponent) then raise("PowerTransform: expected an exponent") end
  self.exponent = exponent
  return opts
end)
function T.PowerTransform:_call(x) return x ^ self.exponent end
function T.PowerTransform:_inverse(y) return y ^ (1 / self.exponent) end
function T.PowerTransform:_ladj(x, y) return (y * self.exponent / x):abs():log() end

-- ComposeTransform(parts): the parts in order
T.ComposeTransform = transform_class("ComposeTransform", function(self, parts, opts)
  if type(parts) ~= "table" then raise("ComposeTransform: expected a list of transforms") end
  self.parts = parts
  for _, t in ipairs(parts) do self.event_dim = math.max(self.event_dim, t.event_dim) end
  return opts
end)
function T.ComposeTransform:_call(x)
  for _, t in ipairs(self.parts) do x = t:forward(x) end
  return x
end
function T.ComposeTransform:_inverse(y)
  for i = #self.parts, 1, -1 do y = self.parts[i]:inv(y) end
  return y
end
function T.ComposeTransform:log_abs_det_jacobian(x, y)
  local total = nil
  for _, t in ipairs(self.parts) do
    local nx = t:forward(x)
    local l = sum_rightmost(t:log_abs_det_jacobian(x, nx), self.event_dim - t.event_dim)
    total = total and total + l or l
    x = nx
  end
  return total or torch.zeros_like(x)
end
-- AbsTransform: |x| (not a bijection: inv gives y itself, and there is no
-- log-Jacobian, as in PyTorch)
T.AbsTransform = transform_class("AbsTransform", function(_, opts) return opts end)
function T.AbsTransform:_call(x) return x:abs() end
function T.AbsTransform:_inverse(y) return y end
function T.AbsTransform:_ladj() raise("AbsTransform: it is not a bijection, so it has no log_abs_det_jacobian") end

-- SoftplusTransform: log(1 + e^x), inverse y + log(-expm1(-y))
T.SoftplusTransform = transform_class("SoftplusTransform", function(_, opts) return opts end)
function T.SoftplusTransform:_call(x) return softplus(x) end
function T.SoftplusTransform:_inverse(y) return y + (-(-y):expm1()):log() end
function T.SoftplusTransform:_ladj(x) return -softplus(-x) end

-- SoftmaxTransform: the softmax of the last dim (onto the simplex; inv
-- gives log y, one of the preimages; no log-Jacobian, as in PyTorch)
T.SoftmaxTransform = transform_class("SoftmaxTransform", function(self, opts)
  self.event_dim = 1
  return opts
end)
function T.SoftmaxTransform:_call(x) return x:softmax(-1) end
function T.SoftmaxTransform:_inverse(y) return y:log() end
function T.SoftmaxTransform:_ladj() raise("SoftmaxTransform: it is not a bijection, so it has no log_abs_det_jacobian") end

-- StickBreakingTransform: R^(K-1) onto the K-simplex, breaking a stick
-- piece by piece (each piece the sigmoid of x_i less log of the pieces
-- left, so that x = 0 is the simplex's centre), as PyTorch's
T.StickBreakingTransform = transform_class("StickBreakingTransform", function(self, opts)
  self.event_dim = 1
  return opts
end)
local function stick_offsets(k, like)   -- k, k-1, ..., 1
  return torch.arange(k, 0, -1, { dtype = like.dtype, device = like.device })
end
function T.StickBreakingTransform:_call(x)
  local k = x:size(-1)
  local z = (x - stick_offsets(k, x):log()):sigmoid()
  local left = (1 - z):cumprod(-1)
  local shape = z:size()
  shape[#shape] = 1
  local one = torch.ones(shape, { dtype = x.dtype, device = x.device })
  return torch.cat({ z, one }, -1) * torch.cat({ one, left }, -1)
end
function T.StickBreakingTransform:_inverse(y)
  local k = y:size(-1) - 1
  local crop = y:narrow(-1, 0, k)
  local rest = (1 - crop:cumsum(-1)):clamp(torch.finfo(y.dtype).tiny, nil)
  return crop:log() - rest:log() + stick_offsets(k, y):log()
end
function T.StickBreakingTransform:log_abs_det_jacobian(x, y)
  local shifted = x - stick_offsets(x:size(-1), x):log()
  return (-shifted - softplus(-shifted) + y:narrow(-1, 0, x:size(-1)):log()):sum(-1)
end

-- LowerCholeskyTransform: a square matrix to a lower triangular one with
-- a positive diagonal (the strict lower part kept, the diagonal exp'd;
-- no log-Jacobian, as in PyTorch)
T.LowerCholeskyTransform = transform_class("LowerCholeskyTransform", function(self, opts)
  self.event_dim = 2
  return opts
end)
function T.LowerCholeskyTransform:_call(x) return x:tril(-1) + torch.diag_embed(x:diagonal(0, -2, -1):exp()) end
function T.LowerCholeskyTransform:_inverse(y) return y:tril(-1) + torch.diag_embed(y:diagonal(0, -2, -1):log()) end
function T.LowerCholeskyTransform:_ladj()
  raise("LowerCholeskyTransform: log_abs_det_jacobian is not implemented (nor is it in PyTorch)")
end

-- ReshapeTransform(in_shape, out_shape): the event reshaped (same number
-- of elements); its log-Jacobian is 0
local function shape_numel(shape, fn, what)
  if type(shape) ~= "table" then raise(string.format("%s: expected %s to be a list of sizes", fn, what)) end
  local n = 1
  for _, s in ipairs(shape) do
    if type(s) ~= "number" or s % 1 ~= 0 or s < 0 then raise(string.format("%s: expected %s to be a list of sizes", fn, what)) end
    n = n * s
  end
  return n
end
T.ReshapeTransform = transform_class("ReshapeTransform", function(self, in_shape, out_shape, opts)
  local fn = "ReshapeTransform"
  if shape_numel(in_shape, fn, "in_shape") ~= shape_numel(out_shape, fn, "out_shape") then
    raise(fn .. ": in_shape and out_shape must have the same number of elements")
  end
  self.in_shape, self.out_shape, self.event_dim = in_shape, out_shape, #in_shape
  return opts
end)
local function reshape_event(t, from, to)
  local shape = t:size()
  local batch = {}
  for i = 1, #shape - #from do batch[i] = shape[i] end
  for _, s in ipairs(to) do batch[#batch + 1] = s end
  return t:reshape(batch)
end
function T.ReshapeTransform:_call(x) return reshape_event(x, self.in_shape, self.out_shape) end
function T.ReshapeTransform:_inverse(y) return reshape_event(y, self.out_shape, self.in_shape) end
function T.ReshapeTransform:log_abs_det_jacobian(x)
  local shape = x:size()
  local batch = {}
  for i = 1, #shape - #self.in_shape do batch[i] = shape[i] end
  return torch.zeros(batch, { dtype = x.dtype, device = x.device })
end

-- IndependentTransform(base, reinterpreted_batch_ndims): base with that
-- many more rightmost dims read as its event
T.IndependentTransform = transform_class("IndependentTransform", function(self, base, n, opts)
  if type(base) ~= "table" or not base._call then raise("IndependentTransform: expected a transform") end
  if type(n) ~= "number" or n % 1 ~= 0 or n < 0 then
    raise("IndependentTransform: expected reinterpreted_batch_ndims to be a non-negative integer")
  end
  self.base_transform, self.reinterpreted_batch_ndims = base, n
  self.event_dim = base.event_dim + n
  return opts
end)
function T.IndependentTransform:_call(x) return self.base_transform:forward(x) end
function T.IndependentTransform:_inverse(y) return self.base_transform:inv(y) end
function T.IndependentTransform:log_abs_det_jacobian(x, y)
  return sum_rightmost(self.base_transform:log_abs_det_jacobian(x, y), self.reinterpreted_batch_ndims)
end

-- CumulativeDistributionTransform(distribution): x to its cdf, inverse
-- its icdf; the log-Jacobian is its log_prob
T.CumulativeDistributionTransform = transform_class("CumulativeDistributionTransform", function(self, d, opts)
  if type(d) ~= "table" or not d.cdf then raise("CumulativeDistributionTransform: expected a distribution") end
  self.distribution = d
  return opts
end)
function T.CumulativeDistributionTransform:_call(x) return self.distribution:cdf(x) end
function T.CumulativeDistributionTransform:_inverse(y) return self.distribution:icdf(y) end
function T.CumulativeDistributionTransform:_ladj(x) return self.distribution:log_prob(x) end

-- CorrCholeskyTransform: a vector of D(D-1)/2 reals onto the Cholesky
-- factor of a D x D correlation matrix (tanh, the strict lower triangle
-- filled row by row, each row's squares broken off a unit stick), as
-- PyTorch's, with its inverse and log-Jacobian.
T.CorrCholeskyTransform = transform_class("CorrCholeskyTransform", function(self, opts)
  self.event_dim = 1
  return opts
end)
-- The positions of the strict lower triangle (below diagonal diag) of n x n, row by row.
local function tril_index(n, diag, device)
  local rows, cols = {}, {}
  for i = 0, n - 1 do
    for j = 0, i + diag do rows[#rows + 1], cols[#cols + 1] = i, j end
  end
  return torch.tensor(rows, { dtype = torch.int64, device = device }), torch.tensor(cols, { dtype = torch.int64, device = device })
end
local function tril_to_vec(m, diag)
  local rows, cols = tril_index(m:size(-1), diag, m.device)
  return m:flatten(-2):index_select(-1, rows * m:size(-1) + cols)
end
local function vec_to_tril(v, n)
  local rows, cols = tril_index(n, -1, v.device)
  local shape = v:size()
  shape[#shape] = n * n
  local out = { unpack(shape, 1, #shape - 1) }
  out[#out + 1], out[#out + 2] = n, n
  return torch.zeros(shape, { dtype = v.dtype, device = v.device }):index_add(-1, rows * n + cols, v):view(out)
end
local function corr_dim(k)
  local n = (1 + math.sqrt(1 + 8 * k)) / 2
  if n % 1 ~= 0 then raise(string.format("CorrCholeskyTransform: %d is not D(D-1)/2 for any D", k)) end
  return n
end
function T.CorrCholeskyTransform:_call(x)
  local eps = torch.finfo(x.dtype).eps
  local n = corr_dim(x:size(-1))
  local r = vec_to_tril(x:tanh():clamp(-1 + eps, 1 - eps), n)
  local kept = (1 - r:square()):sqrt():cumprod(-1)
  local shape = kept:size()
  shape[#shape] = 1
  local ones = torch.ones(shape, { dtype = x.dtype, device = x.device })
  local eye = torch.eye(n, { dtype = x.dtype, device = x.device })
  return (r + eye) * torch.cat({ ones, kept:narrow(-1, 0, n - 1) }, -1)
end
function T.CorrCholeskyTransform:_inverse(y)
  local n = y:size(-1)
  local left = 1 - (y * y):cumsum(-1)
  local shape = left:size()
  shape[#shape] = 1
  local shifted = torch.cat({ torch.ones(shape, { dtype = y.dtype, device = y.device }), left:narrow(-1, 0, n - 1) }, -1)
  return (tril_to_vec(y, -1) / tril_to_vec(shifted, -1):sqrt()):atanh()
end
function T.CorrCholeskyTransform:log_abs_det_jacobian(x, y)
  local stick = tril_to_vec(1 - (y * y):cumsum(-1), -2):log():sum(-1) * 0.5
  return stick - ((x + softplus(x * -2) - math.log(2)) * 2):sum(-1)
end

-- CatTransform(transforms, dim = 0 [, lengths]): transform i applied to
-- the next lengths[i] (1 by default) entries of x along dim; its
-- log-Jacobian is theirs concatenated along dim (summed where dim falls in
-- the event)
local function transform_list(fn, list)
  if type(list) ~= "table" or #list == 0 then raise(fn .. ": expected a non-empty list of transforms") end
  for i, t in ipairs(list) do
    if type(t) ~= "table" or not t._call then raise(string.format("%s: expected transforms[%d] to be a transform", fn, i)) end
  end
  return list
end
T.CatTransform = transform_class("CatTransform", function(self, list, dim, lengths, opts)
  local fn = "CatTransform"
  self.transforms, self.dim = transform_list(fn, list), dim or 0
  if type(self.dim) ~= "number" or self.dim % 1 ~= 0 then raise(fn .. ": expected dim to be an integer") end
  lengths = lengths or {}
  self.lengths = {}
  for i = 1, #list do
    local n = lengths[i] or 1
    if type(n) ~= "number" or n % 1 ~= 0 or n < 0 then raise(string.format("%s: expected lengths[%d] to be a count", fn, i)) end
    self.lengths[i] = n
  end
  for _, t in ipairs(list) do self.event_dim = math.max(self.event_dim, t.event_dim) end
  return opts
end)
local function each_slice(self, x, f)
  local d = self.dim < 0 and self.dim + x:dim() or self.dim
  local total = 0
  for _, n in ipairs(self.lengths) do total = total + n end
  if d < 0 or d >= x:dim() or x:size(d) ~= total then
    raise(string.format("CatTransform: expected dim %d of size %d (the lengths' sum), got a tensor of shape [%s]",
                        self.dim, total, table.concat(x:size(), ", ")))
  end
  local out, start = {}, 0
  for i, t in ipairs(self.transforms) do
    out[i] = f(t, x:narrow(d, start, self.lengths[i]), start, self.lengths[i], d)
    start = start + self.lengths[i]
  end
  return out, d
end
function T.CatTransform:_call(x)
  local parts, d = each_slice(self, x, function(t, xs) return t:forward(xs) end)
  return torch.cat(parts, d)
end
function T.CatTransform:_inverse(y)
  local parts, d = each_slice(self, y, function(t, ys) return t:inv(ys) end)
  return torch.cat(parts, d)
end
function T.CatTransform:log_abs_det_jacobian(x, y)
  local parts, d = each_slice(self, x, function(t, xs, start, n, dd)
    return sum_rightmost(t:log_abs_det_jacobian(xs, y:narrow(dd, start, n)), self.event_dim - t.event_dim)
  end)
  local at = d - x:dim() + self.event_dim   -- the dim counted in the log-Jacobian's shape
  if at < 0 then return torch.cat(parts, at) end
  local total = parts[1]
  for i = 2, #parts do total = total + parts[i] end
  return total
end

-- StackTransform(transforms, dim = 0): transform i applied to x:select(dim, i - 1)
T.StackTransform = transform_class("StackTransform", function(self, list, dim, opts)
  self.transforms, self.dim = transform_list("StackTransform", list), dim or 0
  if type(self.dim) ~= "number" or self.dim % 1 ~= 0 then raise("StackTransform: expected dim to be an integer") end
  return opts
end)
local function each_entry(self, x, f)
  local d = self.dim < 0 and self.dim + x:dim() or self.dim
  if d < 0 or d >= x:dim() or x:size(d) ~= #self.transforms then
    raise(string.format("StackTransform: expected dim %d of size %d (one entry a transform), got a tensor of shape [%s]",
                        self.dim, #self.transforms, table.concat(x:size(), ", ")))
  end
  local out = {}
  for i, t in ipairs(self.transforms) do out[i] = f(t, x:select(d, i - 1), i - 1, d) end
  return torch.stack(out, d)
end
function T.StackTransform:_call(x) return each_entry(self, x, function(t, xs) return t:forward(xs) end) end
function T.StackTransform:_inverse(y) return each_entry(self, y, function(t, ys) return t:inv(ys) end) end
function T.StackTransform:log_abs_det_jacobian(x, y)
  return each_entry(self, x, function(t, xs, i, d) return t:log_abs_det_jacobian(xs, y:select(d, i)) end)
end
for name, cls in pairs(T) do M[name] = cls end

-- biject_to(constraint) and transform_to(constraint): a transform from the
-- reals onto the constraint's set, bijective for biject_to (the simplex by
-- stick breaking) and perhaps not for transform_to (the simplex by
-- softmax), as PyTorch's registries.
local function onto(c, bijective, fn)
  if getmetatable(c) ~= Constraint then raise(fn .. ": expected a constraint, got " .. type(c)) end
  local kind = c.kind
  if kind == "real" then return T.ComposeTransform({}) end
  if kind == "greater_than" or kind == "greater_than_eq" then
    if c.lower_bound == 0 then return T.ExpTransform() end
    return T.ComposeTransform({ T.ExpTransform(), T.AffineTransform(c.lower_bound, 1) })
  end
  if kind == "less_than" then return T.ComposeTransform({ T.ExpTransform(), T.AffineTransform(c.upper_bound, -1) }) end
  if kind == "interval" or kind == "half_open_interval" then
    local lo, hi = c.lower_bound, c.upper_bound
    if lo == 0 and hi == 1 then return T.SigmoidTransform() end
    return T.ComposeTransform({ T.SigmoidTransform(), T.AffineTransform(lo, hi - lo) })
  end
  if kind == "simplex" then return bijective and T.StickBreakingTransform() or T.SoftmaxTransform() end
  if kind == "lower_cholesky" then return T.LowerCholeskyTransform() end
  if kind == "corr_cholesky" then return T.CorrCholeskyTransform() end
  if kind == "independent" then
    return T.IndependentTransform(onto(c.base_constraint, bijective, fn), c.reinterpreted_batch_ndims)
  end
  raise(string.format("%s: Cannot transform %s constraints", fn, tostring(c)))
end
function M.biject_to(c) return onto(c, true, "biject_to") end
function M.transform_to(c) return onto(c, false, "transform_to") end


-- TransformedDistribution(base, transforms [, opts]): the distribution of
-- the transforms (one or a list, applied in order) of base's draws;
-- log_prob(y) is base's log_prob of the inverse less the log-Jacobians.
local TransformedDistribution = class("TransformedDistribution", {})
function TransformedDistribution:__init(base, transforms, opts)
  if type(base) ~= "table" or not base.log_prob then raise("TransformedDistribution: expected a base distribution") end
  if getmetatable(transforms) ~= nil and transforms._call then transforms = { transforms } end
  if type(transforms) ~= "table" then raise("TransformedDistribution: expected a transform or a list of transforms") end
  for i, t in ipairs(transforms) do
    if type(t) ~= "table" or not t._call then
      raise(string.format("TransformedDistribution: expected transforms[%d] to be a transform", i))
    end
  end
  validating(self, opts)
  self.base_dist, self.transforms = base, transforms
  self.batch_shape, self.event_shape = base.batch_shape, base.event_shape or {}
end
function TransformedDistribution:rsample(shape)
  local x = self.base_dist:rsample(shape)
  for _, t in ipairs(self.transforms) do x = t:forward(x) end
  return x
end
function TransformedDistribution:sample(shape)
  local x = self.base_dist:sample(shape)
  return no_grad(function()
    for _, t in ipairs(self.transforms) do x = t:forward(x) end
    return x
  end)
end
function TransformedDistribution:log_prob(value)
  local event_dim = #self.event_shape
  local lp, y = nil, value
  for i = #self.transforms, 1, -1 do
    local t = self.transforms[i]
    local x = t:inv(y)
    local l = sum_rightmost(t:log_abs_det_jacobian(x, y), event_dim - t.event_dim)
    lp = lp and lp - l or -l
    y = x
  end
  local base = sum_rightmost(self.base_dist:log_prob(y), event_dim - #(self.base_dist.event_shape or {}))
  return lp and base + lp or base
end
TransformedDistribution.__tostring = function(self)
  return "TransformedDistribution(" .. tostring(self.base_dist) .. ")"
end

-- LogisticNormal(loc, scale): the stick-breaking transform of
-- Independent(Normal(loc, scale), 1), on the simplex of one more category
-- than loc has.
local LogisticNormal = new_class("LogisticNormal", { "loc", "scale" }, TransformedDistribution)
M.LogisticNormal = LogisticNormal
function LogisticNormal:__init(loc, scale, opts)
  local fn = "LogisticNormal"
  loc = param(loc, fn, "loc", is_tensor(scale) and scale or nil)
  scale = param(scale, fn, "scale", loc)
  if loc:dim() < 1 then raise(fn .. ": expected loc of at least one dim (the categories less one)") end
  local base = M.Independent(M.Normal(loc, scale, opts), 1)
  TransformedDistribution.__init(self, base, { T.StickBreakingTransform() }, opts)
  self.loc, self.scale = base.base_dist.loc, base.base_dist.scale
  local event = { unpack(base.event_shape) }
  event[#event] = event[#event] + 1
  self.event_shape = event
end

---------------------------------------------------------------- more families

-- HalfCauchy(scale): |Cauchy(0, scale)|.
local HalfCauchy = class("HalfCauchy", { "scale" })
function HalfCauchy:__init(scale, opts)
  scale = one_param(self, "HalfCauchy", "scale", scale, opts)
  self.base_dist = M.Cauchy(torch.zeros_like(scale), scale, { validate_args = false })
  self.mean, self.variance = torch.full_like(scale, math.huge), torch.full_like(scale, math.huge)
end
function HalfCauchy:rsample(shape) return self.base_dist:rsample(shape):abs() end
function HalfCauchy:log_prob(value)
  in_support(self, value:ge(0), "non-negative")
  return self.base_dist:log_prob(value) + math.log(2)
end
function HalfCauchy:entropy() return self.base_dist:entropy() - math.log(2) end
function HalfCauchy:cdf(value) return self.base_dist:cdf(value) * 2 - 1 end

-- A count and the probability of a success (NegativeBinomial): self.probs
-- and self.logits broadcast with total_count, from whichever was given.
local function count_and_probs(self, fn, total_count, a, opts, probs_rule, probs_ok)
  local probs, logits = probs_or_logits(fn, a)
  if type(a) == "table" and not is_tensor(a) and opts == nil then opts = a end
  local validate = validating(self, opts)
  local like = probs or logits
  local n = param(total_count, fn, "total_count", is_tensor(like) and like or nil)
  if validate then check(n:ge(0), fn, "total_count", "non-negative") end
  if probs ~= nil then
    probs = param(probs, fn, "probs", n)
    if validate then check(probs_ok(probs), fn, "probs", probs_rule) end
    self.total_count, self.probs = torch.broadcast_tensors(n, probs)
    local p = clamp_probs(self.probs)
    self.logits = p:log() - (-p):log1p()
  else
    self.total_count, self.logits = torch.broadcast_tensors(n, param(logits, fn, "logits", n))
    self.probs = self.logits:sigmoid()
  end
  self.batch_shape, self.event_shape = self.probs:size(), {}
end

-- NegativeBinomial(total_count, probs) or (total_count, {probs =} | {logits =}):
-- the successes before total_count failures, each trial a success with probs.
local NegativeBinomial = class("NegativeBinomial", { "total_count", "probs", "logits" })
function NegativeBinomial:__init(total_count, a, opts)
  count_and_probs(self, "NegativeBinomial", total_count, a, opts, "in [0, 1)",
                  function(p) return p:ge(0):logical_and(p:lt(1)) end)
  self.mean = self.total_count * self.logits:exp()
  self.variance = self.mean / (-self.logits):sigmoid()
end
function NegativeBinomial:sample(shape)
  return no_grad(function()
    local full = sample_shape(shape, self.batch_shape)
    local rate = standard_gamma(self.total_count:expand(full):contiguous()) * self.logits:exp()
    return torch.poisson(rate)
  end)
end
function NegativeBinomial:log_prob(value)
  in_support(self, is_count(value), "a non-negative integer")
  local n, l = self.total_count, self.logits
  local unnormalized = -n * softplus(l) - value * softplus(-l)
  local normalization = (value + 1):lgamma() + n:lgamma() - (n + value):lgamma()
  return unnormalized - torch.where((n + value):eq(0), 0, normalization)
end

-- Multinomial(total_count, probs) or (total_count, {probs =} | {logits =}):
-- the counts of each category in total_count (a number) draws.
local Multinomial = class("Multinomial", { "total_count", "probs", "logits" })
function Multinomial:__init(total_count, a, opts)
  local fn = "Multinomial"
  total_count = total_count == nil and 1 or total_count
  if type(total_count) ~= "number" or total_count % 1 ~= 0 or total_count < 0 then
    raise(fn .. ": expected total_count to be a non-negative integer (one for the whole batch), got " .. tostring(total_count))
  end
  self._categorical = M.Categorical(a, opts)
  self._validate = self._categorical._validate
  self.total_count = total_count
  self.probs, self.logits = self._categorical.probs, self._categorical.logits
  self.batch_shape, self.event_shape = self._categorical.batch_shape, { self._categorical.num_categories }
  self.mean = self.probs * total_count
  self.variance = self.mean * (1 - self.probs)
  self.support = K.independent(K.integer_interval(0, total_count), 1)
end
function Multinomial:sample(shape)
  local k = self.event_shape[1]
  local draws = self._categorical:sample({ self.total_count, unpack(shape or {}) })   -- (n, shape..., batch...)
  return no_grad(function() return torch.nn.functional.one_hot(draws, k):to(self.probs.dtype):sum(0) end)
end
function Multinomial:log_prob(value)
  in_support(self, is_count(value):all(-1):logical_and(value:sum(-1):le(self.total_count)),
             "counts that sum to at most total_count")
  local logits = torch.where(value:eq(0):logical_and(self.logits:eq(-math.huge)), 0, self.logits)
  return (value:sum(-1) + 1):lgamma() - (value + 1):lgamma():sum(-1) + (logits * value):sum(-1)
end

-- LowRankMultivariateNormal(loc, cov_factor, cov_diag): a normal of
-- covariance cov_factor cov_factor^T + diag(cov_diag); cov_factor (..., n,
-- r), cov_diag (..., n) positive.
local LowRankMultivariateNormal = class("LowRankMultivariateNormal", { "loc" })
function LowRankMultivariateNormal:__init(loc, cov_factor, cov_diag, opts)
  local fn = "LowRankMultivariateNormal"
  loc = param(loc, fn, "loc")
  cov_factor = param(cov_factor, fn, "cov_factor", loc)
  cov_diag = param(cov_diag, fn, "cov_diag", loc)
  if loc:dim() < 1 or cov_factor:dim() < 2 or cov_diag:dim() < 1 then
    raise(fn .. ": expected loc (..., n), cov_factor (..., n, r) and cov_diag (..., n)")
  end
  local n = loc:size(-1)
  if cov_factor:size(-2) ~= n or cov_diag:size(-1) ~= n then
    raise(string.format("%s: expected cov_factor (..., %d, r) and cov_diag (..., %d) for loc (..., %d), got [%s] and [%s]",
                        fn, n, n, n, table.concat(cov_factor:size(), ", "), table.concat(cov_diag:size(), ", ")))
  end
  if validating(self, opts) then check(cov_diag:gt(0), fn, "cov_diag", "positive") end
  self.loc, self.cov_factor, self.cov_diag = loc, cov_factor, cov_diag
  self.covariance_matrix = cov_factor:matmul(cov_factor:transpose(-2, -1)) + torch.diag_embed(cov_diag)
  self._mvn = M.MultivariateNormal(loc, { covariance_matrix = self.covariance_matrix, validate_args = false })
  self.batch_shape, self.event_shape = self._mvn.batch_shape, self._mvn.event_shape
  self.scale_tril = self._mvn.scale_tril
  self.mean = self._mvn.mean
  self.variance = (cov_factor:square():sum(-1) + cov_diag):expand(self.mean:size())
end
-- loc + W eps_r + sqrt(D) eps_n, as PyTorch draws it
function LowRankMultivariateNormal:rsample(shape)
  local full = sample_shape(shape, self.batch_shape)
  local o = { dtype = self.loc.dtype, device = self.loc.device }
  local w_shape, d_shape = { unpack(full) }, { unpack(full) }
  w_shape[#w_shape + 1] = self.cov_factor:size(-1)
  d_shape[#d_shape + 1] = self.loc:size(-1)
  local eps_w, eps_d = torch.randn(w_shape, o), torch.randn(d_shape, o)
  return self.loc + self.cov_factor:matmul(eps_w:unsqueeze(-1)):squeeze(-1) + self.cov_diag:sqrt() * eps_d
end
function LowRankMultivariateNormal:log_prob(value) return self._mvn:log_prob(value) end
function LowRankMultivariateNormal:entropy() return self._mvn:entropy() end

-- Wishart(df, covariance_matrix) or (df, {covariance_matrix =} |
-- {scale_tril =} | {precision_matrix =}): positive-definite p x p matrices,
-- the sum of df outer products of N(0, covariance) vectors; df > p - 1.
-- Draws by Bartlett's decomposition (rsample differentiates through its
-- chi-squared and normal draws).
local Wishart = class("Wishart", { "df" })
local LOG2 = math.log(2)
local function mvdigamma(x, p)   -- sum over i < p of digamma(x - i/2)
  local offsets = torch.arange(0, p, { dtype = x.dtype, device = x.device }) / 2
  return (x:unsqueeze(-1) - offsets):digamma():sum(-1)
end
function Wishart:__init(df, a, opts)
  local fn = "Wishart"
  local m, which
  m, which, opts = matrix_argument(fn, a, opts, is_tensor(df) and df or nil)
  if m:dim() < 2 or m:size(-1) ~= m:size(-2) then
    raise(string.format("%s: expected %s of shape (..., p, p), got [%s]", fn, which, table.concat(m:size(), ", ")))
  end
  local p = m:size(-1)
  df = param(df, fn, "df", m)
  if validating(self, opts) then check(df:gt(p - 1), fn, "df", "greater than p - 1 = " .. (p - 1)) end
  local L = scale_tril_of(m, which)
  local mb = L:size()
  table.remove(mb); table.remove(mb)
  local batch = torch.broadcast_shapes(df:size(), mb)
  local ms = { unpack(batch) }
  ms[#ms + 1], ms[#ms + 2] = p, p
  self.df, self.scale_tril = df:expand(batch), L:expand(ms)
  self.batch_shape, self.event_shape = batch, { p, p }
  self.covariance_matrix = self.scale_tril:matmul(self.scale_tril:transpose(-1, -2))
  self.mean = self.covariance_matrix * self.df:unsqueeze(-1):unsqueeze(-1)
  local d = self.covariance_matrix:diagonal(0, -2, -1)
  self.variance = (self.covariance_matrix:square() + d:unsqueeze(-1) * d:unsqueeze(-2)) * self.df:unsqueeze(-1):unsqueeze(-1)
  self.support = K.positive_definite
end
local function half_log_det_of(L) return L:diagonal(0, -2, -1):log():sum(-1) end
function Wishart:log_prob(value)
  local p, nu = self.event_shape[1], self.df
  local L = self.scale_tril
  local _, logdet = torch.linalg.slogdet(value)
  local trace = torch.cholesky_solve(value, L):diagonal(0, -2, -1):sum(-1)
  return -nu * (half_log_det_of(L) + p * LOG2 / 2) - (nu / 2):mvlgamma(p) + (nu - p - 1) / 2 * logdet - trace / 2
end
function Wishart:entropy()
  local p, nu = self.event_shape[1], self.df
  return (half_log_det_of(self.scale_tril) + p * LOG2 / 2) * (p + 1) + (nu / 2):mvlgamma(p)
         - (nu - p - 1) / 2 * mvdigamma(nu / 2, p) + nu * p / 2
end
-- L A A^T L^T, A lower triangular with sqrt(chi2(df - i)) on its diagonal
-- and standard normals below it
function Wishart:rsample(shape)
  local p = self.event_shape[1]
  local full = sample_shape(shape, self.batch_shape)
  local o = { dtype = self.scale_tril.dtype, device = self.scale_tril.device }
  local with_p = { unpack(full) }
  with_p[#with_p + 1] = p
  local dfs = (self.df:unsqueeze(-1) - torch.arange(0, p, o)):expand(with_p)
  local diag = (standard_gamma((dfs / 2):contiguous()) * 2):sqrt()
  local ms = { unpack(full) }
  ms[#ms + 1], ms[#ms + 2] = p, p
  local A = torch.randn(ms, o):tril(-1) + torch.diag_embed(diag)
  local LA = self.scale_tril:matmul(A)
  return LA:matmul(LA:transpose(-1, -2))
end

-- LKJCholesky(dim, concentration = 1): the lower Cholesky factors of
-- dim x dim correlation matrices, with density proportional to
-- det(L L^T)^(concentration - 1); draws by the onion method, as PyTorch's.
local LKJCholesky = class("LKJCholesky", { "concentration" })
function LKJCholesky:__init(dim, concentration, opts)
  local fn = "LKJCholesky"
  if type(dim) ~= "number" or dim % 1 ~= 0 or dim < 2 then
    raise(fn .. ": expected dim to be an integer of at least 2, got " .. tostring(dim))
  end
  local c = one_param(self, fn, "concentration", concentration == nil and 1.0 or concentration, opts)
  self.dim = dim
  self.event_shape = { dim, dim }
  -- the onion method's Beta draws: (0.5, c + (dim - 2)/2) for the first
  -- row, then (k + 1/2, c + (dim - 2)/2 - k/2)
  local o = { dtype = c.dtype, device = c.device }
  local offset = torch.cat({ torch.zeros(1, o), torch.arange(0, dim - 1, o) })
  local marginal = c + 0.5 * (dim - 2)
  self._beta = M.Beta(offset + 0.5, marginal:unsqueeze(-1) - offset * 0.5, { validate_args = false })
  self.support = K.corr_cholesky
end
function LKJCholesky:sample(shape)
  return no_grad(function()
    local y = self._beta:sample(shape):unsqueeze(-1)
    local full = sample_shape(shape, self.batch_shape)
    full[#full + 1], full[#full + 2] = self.dim, self.dim
    local u = torch.randn(full, { dtype = y.dtype, device = y.device }):tril(-1)
    local norm = u:norm(2, -1, true)
    local sphere = torch.where(norm:eq(0), 0, u / torch.where(norm:eq(0), 1, norm))
    local w = y:sqrt() * sphere
    local diag = (1 - w:square():sum(-1)):clamp(torch.finfo(w.dtype).tiny, nil):sqrt()
    return w + torch.diag_embed(diag)
  end)
end
LKJCholesky.rsample = no_rsample
function LKJCholesky:log_prob(value)
  in_support(self, K.corr_cholesky:check(value), "the Cholesky factor of a correlation matrix")
  local dim, c = self.dim, self.concentration
  local diag = value:diagonal(0, -2, -1):narrow(-1, 1, dim - 1)
  local order = (c - 1):unsqueeze(-1) * 2 + dim - torch.arange(2, dim + 1, { dtype = c.dtype, device = c.device })
  local unnormalized = (order * diag:log()):sum(-1)
  local dm1 = dim - 1
  local alpha = c + 0.5 * dm1
  local normalizer = 0.5 * dm1 * math.log(math.pi) + (alpha - 0.5):mvlgamma(dm1) - alpha:lgamma() * dm1
  return unnormalized - normalizer
end

-- Kumaraswamy(concentration1, concentration0): on (0, 1), density a b
-- x^(a-1) (1 - x^a)^(b-1); (1 - u^(1/b))^(1/a) for u uniform.
local Kumaraswamy = class("Kumaraswamy", { "concentration1", "concentration0" })
local function log_beta(a, b) return a:lgamma() + b:lgamma() - (a + b):lgamma() end
local function kumaraswamy_moment(a, b, k) return (b:log() + log_beta(k / a + 1, b)):exp() end
function Kumaraswamy:__init(c1, c0, opts)
  two_params(self, "Kumaraswamy", { "concentration1", "concentration0" }, c1, c0, { true, true }, opts)
  local a, b = self.concentration1, self.concentration0
  self.mean = kumaraswamy_moment(a, b, 1)
  self.variance = kumaraswamy_moment(a, b, 2) - self.mean:square()
end
function Kumaraswamy:rsample(shape)
  local u = open_uniform(sample_shape(shape, self.batch_shape), self.concentration1)
  local tiny, eps = float_eps(u)
  return (-(u:log() / self.concentration0):expm1()):pow(self.concentration1:reciprocal()):clamp(tiny, 1 - eps)
end
function Kumaraswamy:log_prob(value)
  in_support(self, value:gt(0):logical_and(value:lt(1)), "in (0, 1)")
  local a, b = self.concentration1, self.concentration0
  return a:log() + b:log() + (a - 1) * value:log() + (b - 1) * (-value:pow(a)):log1p()
end
function Kumaraswamy:entropy()
  local a, b = self.concentration1, self.concentration0
  return (1 - b:reciprocal()) + (1 - a:reciprocal()) * ((b + 1):digamma() + EULER) - a:log() - b:log()
end

-- FisherSnedecor(df1, df2): the ratio of two chi-squared draws, each over its df.
local FisherSnedecor = class("FisherSnedecor", { "df1", "df2" })
function FisherSnedecor:__init(df1, df2, opts)
  two_params(self, "FisherSnedecor", { "df1", "df2" }, df1, df2, { true, true }, opts)
  local d1, d2 = self.df1, self.df2
  self.mean = torch.where(d2:gt(2), d2 / (d2 - 2), 0 / 0)
  self.variance = torch.where(d2:gt(4), d2:square() * 2 * (d1 + d2 - 2) / (d1 * (d2 - 2):square() * (d2 - 4)), 0 / 0)
end
function FisherSnedecor:rsample(shape)
  local full = sample_shape(shape, self.batch_shape)
  local x1 = standard_gamma((self.df1 / 2):expand(full):contiguous()) / self.df1
  local x2 = standard_gamma((self.df2 / 2):expand(full):contiguous()) / self.df2
  return x1 / x2
end
function FisherSnedecor:log_prob(value)
  in_support(self, value:gt(0), "positive")
  local h1, h2 = self.df1 / 2, self.df2 / 2
  local ratio = self.df1 / self.df2
  return log_beta(h1, h2):neg() + h1 * ratio:log() + (h1 - 1) * value:log() - (h1 + h2) * (ratio * value):log1p()
end

-- The temperature of the relaxed distributions: positive.
local function temperature_of(fn, t, like)
  t = param(t, fn, "temperature", like)
  check(t:gt(0), fn, "temperature", "positive")
  return t
end

-- RelaxedBernoulli(temperature, probs) or (temperature, {probs =} |
-- {logits =}): a continuous relaxation on (0, 1), the sigmoid of
-- (logits + logistic noise) / temperature; rsample is differentiable.
local RelaxedBernoulli = class("RelaxedBernoulli", { "temperature", "probs", "logits" })
function RelaxedBernoulli:__init(temperature, a, opts)
  success_probs(self, "RelaxedBernoulli", a, opts, true)
  self.temperature = temperature_of("RelaxedBernoulli", temperature, self.probs)
  self.batch_shape = torch.broadcast_shapes(self.probs:size(), self.temperature:size())
end
function RelaxedBernoulli:rsample(shape)
  local u = open_uniform(sample_shape(shape, self.batch_shape), self.logits)
  local tiny, eps = float_eps(u)
  u = u:clamp(tiny, 1 - eps)
  return ((self.logits + u:log() - (-u):log1p()) / self.temperature):sigmoid():clamp(tiny, 1 - eps)
end
-- the logistic's density at logit(value), less the sigmoid's log-Jacobian
function RelaxedBernoulli:log_prob(value)
  in_support(self, value:gt(0):logical_and(value:lt(1)), "in (0, 1)")
  local tiny, eps = float_eps(value)
  local y = value:clamp(tiny, 1 - eps)
  local x = y:log() - (-y):log1p()
  local diff = self.logits - x * self.temperature
  local logistic = self.temperature:log() + diff - softplus(diff) * 2
  return logistic + softplus(-x) + softplus(x)
end

-- RelaxedOneHotCategorical(temperature, probs) or (temperature, {probs =} |
-- {logits =}): the Gumbel-softmax relaxation of one-hot vectors on the simplex.
local RelaxedOneHotCategorical = class("RelaxedOneHotCategorical", { "temperature", "probs", "logits" })
function RelaxedOneHotCategorical:__init(temperature, a, opts)
  self._categorical = M.Categorical(a, opts)
  self._validate = self._categorical._validate
  self.probs, self.logits = self._categorical.probs, self._categorical.logits
  self.temperature = temperature_of("RelaxedOneHotCategorical", temperature, self.probs)
  self.batch_shape, self.event_shape = self._categorical.batch_shape, { self._categorical.num_categories }
end
function RelaxedOneHotCategorical:rsample(shape)
  local full = sample_shape(shape, self.batch_shape)
  full[#full + 1] = self.event_shape[1]
  local u = open_uniform(full, self.logits)
  local tiny, eps = float_eps(u)
  local gumbels = -(-u:clamp(tiny, 1 - eps):log()):log()
  local scores = (self.logits + gumbels) / self.temperature:unsqueeze(-1)
  return (scores - scores:logsumexp(-1, true)):exp()
end
-- ExpRelaxedCategorical's density of log(value), less exp's log-Jacobian
function RelaxedOneHotCategorical:log_prob(value)
  in_support(self, value:gt(0):all(-1):logical_and((value:sum(-1) - 1):abs():lt(1e-6)), "a point of the simplex")
  local k = self.event_shape[1]
  local x = value:log()
  local log_scale = torch.full_like(self.temperature, k):lgamma() + self.temperature:log() * (k - 1)
  local score = self.logits - x * self.temperature:unsqueeze(-1)
  score = (score - score:logsumexp(-1, true)):sum(-1)
  return score + log_scale - x:sum(-1)
end

-- VonMises(loc, concentration): on the circle, density e^(k cos(x - loc))
-- / (2 pi I0(k)); log I0 through i0e (no overflow for large k). Draws by
-- Best and Fisher's rejection, every element at once; in [-pi, pi).
local VonMises = class("VonMises", { "loc", "concentration" })
function VonMises:__init(loc, concentration, opts)
  two_params(self, "VonMises", { "loc", "concentration" }, loc, concentration, { false, true }, opts)
  local k = self.concentration
  self.mean = self.loc
  self.variance = 1 - torch.special.i1e(k) / torch.special.i0e(k)
end
function VonMises:log_prob(value)
  local k = self.concentration
  return k * (value - self.loc):cos() - math.log(2 * math.pi) - torch.special.i0e(k):log() - k
end
function VonMises:sample(shape)
  return no_grad(function()
    local full = sample_shape(shape, self.batch_shape)
    local k = self.concentration:to(torch.float64):expand(full):contiguous()
    local tau = 1 + (1 + k:square() * 4):sqrt()
    local rho = (tau - (tau * 2):sqrt()) / (k * 2)
    local r = (1 + rho:square()) / (rho * 2)
    local out = torch.zeros_like(k)
    local waiting = torch.ones_like(k):to(torch.bool)
    for _ = 1, 1000 do
      local u1, u2, u3 = torch.rand_like(k), open_uniform(k:size(), k), torch.rand_like(k)
      local z = (u1 * math.pi):cos()
      local f = (r * z + 1) / (r + z)
      local c = k * (r - f)
      local accept = (c * (2 - c) - u2):gt(0):logical_or(((c / u2):log() + 1 - c):ge(0))
      local take = accept:logical_and(waiting)
      out = torch.where(take, (u3 - 0.5):sign() * f:clamp(-1, 1):acos(), out)
      waiting = waiting:logical_and(take:logical_not())
      if not waiting:any():item() then break end
    end
    return ((out + math.pi + self.loc:to(torch.float64)):remainder(2 * math.pi) - math.pi):to(self.loc.dtype)
  end)
end
VonMises.rsample = no_rsample

-- OneHotCategoricalStraightThrough: OneHotCategorical whose rsample is the
-- one-hot draw with the probabilities' gradient (straight through).
local OneHotCategoricalStraightThrough = new_class("OneHotCategoricalStraightThrough", { "probs", "logits" },
                                                   OneHotCategorical)
M.OneHotCategoricalStraightThrough = OneHotCategoricalStraightThrough
function OneHotCategoricalStraightThrough:rsample(shape)
  local draws = self:sample(shape)
  return draws + (self.probs - self.probs:detach())
end

-- ContinuousBernoulli(probs) or ({probs =} | {logits =} [, lims = {0.499, 0.501}]):
-- on [0, 1], density C(p) p^x (1 - p)^(1 - x); within lims of 1/2, where
-- C's formula loses its digits, Taylor series (PyTorch's).
local ContinuousBernoulli = class("ContinuousBernoulli", { "probs", "logits" })
function ContinuousBernoulli:__init(a, opts)
  local lims = type(a) == "table" and not is_tensor(a) and a.lims or (type(opts) == "table" and opts.lims) or nil
  if type(a) == "table" and not is_tensor(a) then
    a = { probs = a.probs, logits = a.logits, validate_args = a.validate_args }
  end
  if type(opts) == "table" then opts = { validate_args = opts.validate_args } end
  success_probs(self, "ContinuousBernoulli", a, opts, true)
  self.probs = clamp_probs(self.probs)
  lims = lims or { 0.499, 0.501 }
  if type(lims) ~= "table" or type(lims[1]) ~= "number" or type(lims[2]) ~= "number" or lims[1] >= lims[2] then
    raise("ContinuousBernoulli: expected lims to be two increasing numbers {low, high}")
  end
  self._lims = lims
  local p, outside = self:_cut_probs()
  local mus = p / (p * 2 - 1) + ((-p):log1p() - p:log()):reciprocal()
  local x = self.probs - 0.5
  self.mean = torch.where(outside, mus, (x:square() * (16 / 45) + 1 / 3) * x + 0.5)
  local vars = p * (p - 1) / (1 - p * 2):square() + ((-p):log1p() - p:log()):square():reciprocal()
  local x2 = x:square()
  self.variance = torch.where(outside, vars, 1 / 12 - (1 / 15 - x2 * (128 / 945)) * x2)
  self.stddev = self.variance:sqrt()
end
-- the probabilities with those within lims replaced by lims[1], and where they are not
function ContinuousBernoulli:_cut_probs()
  local outside = self.probs:le(self._lims[1]):logical_or(self.probs:gt(self._lims[2]))
  return torch.where(outside, self.probs, self._lims[1]), outside
end
function ContinuousBernoulli:_log_normalizer()
  local p, outside = self:_cut_probs()
  local below = torch.where(p:le(0.5), p, 0)
  local above = torch.where(p:ge(0.5), p, 1)
  local log_norm = ((-p):log1p() - p:log()):abs():log()
                   - torch.where(p:le(0.5), (below * -2):log1p(), (above * 2 - 1):log())
  local x = (self.probs - 0.5):square()
  return torch.where(outside, log_norm, (x * (104 / 45) + 4 / 3) * x + math.log(2))
end
function ContinuousBernoulli:log_prob(value)
  in_support(self, value:ge(0):logical_and(value:le(1)), "in [0, 1]")
  return value * self.logits - softplus(self.logits) + self:_log_normalizer()
end
function ContinuousBernoulli:entropy()
  local l0, l1 = (-self.probs):log1p(), self.probs:log()
  return self.mean * (l0 - l1) - self:_log_normalizer() - l0
end
function ContinuousBernoulli:cdf(value)
  local p, outside = self:_cut_probs()
  local cdfs = (p:pow(value) * (1 - p):pow(1 - value) + p - 1) / (p * 2 - 1)
  local unbounded = torch.where(outside, cdfs, value)
  return torch.where(value:le(0), 0, torch.where(value:ge(1), 1, unbounded))
end
function ContinuousBernoulli:icdf(value)
  local p, outside = self:_cut_probs()
  return torch.where(outside, ((-p + value * (p * 2 - 1)):log1p() - (-p):log1p()) / (p:log() - (-p):log1p()), value)
end
function ContinuousBernoulli:rsample(shape)
  return self:icdf(open_uniform(sample_shape(shape, self.batch_shape), self.probs))
end

-- Each family's support, as PyTorch's (an instance's, where it depends on
-- the parameters)
local supports = {
  Normal = K.real, Laplace = K.real, Cauchy = K.real, Gumbel = K.real, StudentT = K.real, VonMises = K.real,
  LogNormal = K.positive, Weibull = K.positive, FisherSnedecor = K.positive,
  Exponential = K.nonnegative, HalfNormal = K.nonnegative, HalfCauchy = K.nonnegative, Gamma = K.nonnegative,
  Chi2 = K.nonnegative, Beta = K.unit_interval, Kumaraswamy = K.unit_interval, ContinuousBernoulli = K.unit_interval,
  RelaxedBernoulli = K.unit_interval, Dirichlet = K.simplex, RelaxedOneHotCategorical = K.simplex,
  LogisticNormal = K.simplex, Poisson = K.nonnegative_integer, Geometric = K.nonnegative_integer,
  NegativeBinomial = K.nonnegative_integer, Bernoulli = K.boolean, OneHotCategorical = K.one_hot,
  OneHotCategoricalStraightThrough = K.one_hot, MultivariateNormal = K.real_vector,
  LowRankMultivariateNormal = K.real_vector,
}
for name, c in pairs(supports) do M[name].support = c end

---------------------------------------------------------------- kl_divergence

local function kind(d) return getmetatable(d) and getmetatable(d).__name end

-- register_kl(P, Q, fn) (or register_kl(P, Q)(fn), PyTorch's decorator):
-- fn(p, q) is kl_divergence for p of class P (or one extending it) and q
-- of class Q, before the formulas below.
local kl_registry = {}
local function is_class(c)
  return type(c) == "table" and (c == Distribution or (type(c.__name) == "string" and getmetatable(c) ~= nil))
end
function M.register_kl(P, Q, fn)
  if not is_class(P) or not is_class(Q) then
    raise("register_kl: expected two distribution classes (torch.distributions.Normal, or one of one's own)")
  end
  local function register(f)
    if type(f) ~= "function" then raise("register_kl: expected a function (p, q) giving KL(p || q)") end
    kl_registry[P] = kl_registry[P] or {}
    kl_registry[P][Q] = f
    return f
  end
  if fn == nil then return register end
  return register(fn)
end
-- The registered function for the classes of p and q, the most derived first.
local function registered_kl(p, q)
  local cp = getmetatable(p)
  while type(cp) == "table" do
    local row = kl_registry[cp]
    if row then
      local cq = getmetatable(q)
      while type(cq) == "table" do
        if row[cq] then return row[cq] end
        cq = cq ~= Distribution and getmetatable(cq) and getmetatable(cq).__index or nil
      end
    end
    cp = cp ~= Distribution and getmetatable(cp) and getmetatable(cp).__index or nil
  end
end

-- kl_divergence(p, q): KL(p || q) for two of one kind (Normal, Categorical,
-- Bernoulli, Uniform, Independent of those).
function M.kl_divergence(p, q)
  local registered = registered_kl(p, q)
  if registered then return registered(p, q) end
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
  elseif kp == "Exponential" then
    local r = q.rate / p.rate
    return r - r:log() - 1
  elseif kp == "Laplace" then
    local ratio, d = p.scale / q.scale, (p.loc - q.loc):abs()
    return -ratio:log() + d / q.scale + ratio * (-d / p.scale):exp() - 1
  elseif kp == "LogNormal" or kp == "HalfNormal" then
    return M.kl_divergence(p.base_dist, q.base_dist)
  elseif kp == "Gamma" then
    local pa, pb, qa, qb = p.concentration, p.rate, q.concentration, q.rate
    return qa * (pb / qb):log() + qa:lgamma() - pa:lgamma() + (pa - qa) * pa:digamma() + (qb - pb) * (pa / pb)
  elseif kp == "Dirichlet" or kp == "Beta" then
    local a, b = p.concentration, q.concentration
    if kp == "Beta" then a, b = p._dirichlet.concentration, q._dirichlet.concentration end
    local a0, b0 = a:sum(-1), b:sum(-1)
    return a0:lgamma() - b0:lgamma() - (a:lgamma() - b:lgamma()):sum(-1)
           + ((a - b) * (a:digamma() - a0:digamma():unsqueeze(-1))):sum(-1)
  elseif kp == "Poisson" then
    return p.rate * (p.rate:log() - q.rate:log()) - (p.rate - q.rate)
  elseif kp == "OneHotCategorical" then
    return M.kl_divergence(p._categorical, q._categorical)
  elseif kp == "MultivariateNormal" then
    local k = p.event_shape[1]
    -- tr(Sq^-1 Sp) = |Lq^-1 Lp|_F^2
    local m = torch.linalg.solve(q.scale_tril, p.scale_tril)
    return 0.5 * (m:square():sum({ -2, -1 }) + mahalanobis(q.scale_tril, p.loc - q.loc) - k)
           + half_log_det(q.scale_tril) - half_log_det(p.scale_tril)
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
