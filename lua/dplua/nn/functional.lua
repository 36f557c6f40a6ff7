-- dplua.nn.functional: PyTorch's torch.nn.functional over dplua tensors.
--
-- Fused C ops (linear, cross_entropy / nll_loss, unfold) carry their own
-- backward; everything else is a composite of differentiable tensor ops.
-- Options that PyTorch takes as keyword arguments come in a trailing table:
--   F.cross_entropy(logits, target, {weight=w, label_smoothing=0.1})
local torch = require("dplua")
local raise = torch._raise
local is_tensor = torch.is_tensor

local F = {}

-- Autocast (dplua/autocast.lua) tells us when a region is active: while
-- autocast_on is false, the ops below pay one test of this boolean.
local autocast_on, AC = false, nil
require("dplua.autocast").watch(function(on, m) autocast_on, AC = on, m end)

---------------------------------------------------------------- helpers

local function typename(x) return is_tensor(x) and "Tensor" or type(x) end

local function want_tensor(x, fn, what)
  if not is_tensor(x) then raise(string.format("%s: expected %s to be a tensor, got %s", fn, what, typename(x))) end
  return x
end

local function shape_str(t) return "[" .. table.concat(t:size(), ", ") .. "]" end
F._shape_str = shape_str

local function want_float(x, fn, what)
  want_tensor(x, fn, what)
  if not x:is_floating_point() then
    raise(string.format("%s: expected %s to be a floating point tensor, got %s", fn, what, tostring(x.dtype)))
  end
  return x
end

F._want_float = want_float

local REDUCTION = { none = 0, mean = 1, sum = 2 }

-- Losses take ({reduction=...}) or a reduction string as their options;
-- with `allowed`, a key it does not hold is an error (a misspelt option
-- would otherwise be ignored).
local function loss_opts(opts, fn, allowed)
  if opts == nil then return {} end
  if type(opts) == "string" then return { reduction = opts } end
  if type(opts) ~= "table" then raise(fn .. ": expected an options table, got " .. typename(opts)) end
  if allowed then
    for k in pairs(opts) do
      if not allowed[k] then raise(string.format("%s: unknown option '%s'", fn, tostring(k))) end
    end
  end
  return opts
end

local function reduction_of(opts, fn)
  local r = opts.reduction or "mean"
  if REDUCTION[r] == nil then
    raise(string.format('%s: reduction must be "none", "mean" or "sum", got %s', fn, tostring(r)))
  end
  return r
end

local function reduce(loss, reduction)
  if reduction == "mean" then return loss:mean() end
  if reduction == "sum" then return loss:sum() end
  return loss
end

-- An int or a pair ({a, b}) as a two-element table.
local function pair(v, fn, what)
  if type(v) == "number" then
    if v % 1 ~= 0 then raise(string.format("%s: expected %s to be an integer, got %s", fn, what, tostring(v))) end
    return { v, v }
  end
  if type(v) == "table" and #v == 2 and type(v[1]) == "number" and type(v[2]) == "number" then return { v[1], v[2] } end
  if type(v) == "table" and #v == 1 and type(v[1]) == "number" then return { v[1], v[1] } end
  raise(string.format("%s: expected %s to be an integer or a pair of integers, got %s", fn, what, typename(v)))
end
F._pair = pair

---------------------------------------------------------------- activations

function F.relu(x) return want_tensor(x, "relu", "input"):relu() end
function F.gelu(x, approximate)
  if type(approximate) == "table" then approximate = approximate.approximate end
  approximate = approximate or "none"
  if approximate ~= "none" and approximate ~= "tanh" then
    raise('gelu: approximate must be "none" or "tanh", got ' .. tostring(approximate))
  end
  return want_tensor(x, "gelu", "input"):gelu(approximate)
end
function F.tanh(x) return want_tensor(x, "tanh", "input"):tanh() end
function F.sigmoid(x) return want_tensor(x, "sigmoid", "input"):sigmoid() end
function F.silu(x) return want_tensor(x, "silu", "input") * x:sigmoid() end

-- The activations below are compositions of tensor ops, written so that
-- no branch torch.where discards overflows (its gradient would be 0 * inf).
local function want_number(v, fn, what, default)
  if v == nil then return default end
  if type(v) ~= "number" then raise(string.format("%s: expected %s to be a number, got %s", fn, what, typename(v))) end
  return v
end

-- leaky_relu(x, negative_slope=0.01)
function F.leaky_relu(x, negative_slope)
  want_tensor(x, "leaky_relu", "input")
  if type(negative_slope) == "table" then negative_slope = negative_slope.negative_slope end
  local slope = want_number(negative_slope, "leaky_relu", "negative_slope", 0.01)
  return torch.where(x:gt(0), x, x * slope)
end
-- elu(x, alpha=1): x for x > 0, alpha (exp(x) - 1) otherwise
function F.elu(x, alpha)
  want_tensor(x, "elu", "input")
  if type(alpha) == "table" then alpha = alpha.alpha end
  alpha = want_number(alpha, "elu", "alpha", 1)
  return torch.where(x:gt(0), x, (x:clamp(nil, 0):exp() - 1) * alpha)
end
-- softplus(x, beta=1, threshold=20): log(1 + exp(beta x)) / beta, and x
-- where beta x > threshold
function F.softplus(x, beta, threshold)
  want_tensor(x, "softplus", "input")
  if type(beta) == "table" then beta, threshold = beta.beta, beta.threshold end
  beta = want_number(beta, "softplus", "beta", 1)
  threshold = want_number(threshold, "softplus", "threshold", 20)
  local bx = x * beta
  -- log(1 + e^z) = max(z, 0) + log1p(t), t = e^-|z| in (0, 1]: never
  -- overflows; -|z| is written z - 2 max(z, 0), whose gradient at 0 keeps
  -- softplus's 1/2 (abs and relu have 0 there). log1p(t) as log(u) t /
  -- (u - 1), u = 1 + t rounded (exact to the dtype's precision, Goldberg's
  -- trick), and below t = 1e-3, where u may be 1, as its series to t^5
  -- (relative error below 2e-16)
  local r = bx:relu()
  local t = (bx - r * 2):exp()
  local small = t:lt(1e-3)
  local u = t + 1
  local series = t * (1 - t * (0.5 - t * (1 / 3 - t * (0.25 - t * 0.2))))
  local rounded = u:log() * t / torch.where(small, torch.ones_like(u), u - 1)
  local soft = (r + torch.where(small, series, rounded)) / beta
  return torch.where(bx:gt(threshold), x, soft)
end
-- hardtanh(x, min_val=-1, max_val=1), relu6(x) = hardtanh(x, 0, 6)
function F.hardtanh(x, min_val, max_val)
  want_tensor(x, "hardtanh", "input")
  if type(min_val) == "table" then min_val, max_val = min_val.min_val, min_val.max_val end
  min_val = want_number(min_val, "hardtanh", "min_val", -1)
  max_val = want_number(max_val, "hardtanh", "max_val", 1)
  if max_val < min_val then raise("hardtanh: max_val cannot be less than min_val") end
  return x:clamp(min_val, max_val)
end
function F.relu6(x) return F.hardtanh(want_tensor(x, "relu6", "input"), 0, 6) end
-- mish(x) = x tanh(softplus(x))
function F.mish(x) return want_tensor(x, "mish", "input") * F.softplus(x):tanh() end
-- hardsigmoid(x) = relu6(x + 3) / 6, hardswish(x) = x hardsigmoid(x)
-- (MobileNetV3's), selu(x) = scale elu(x, alpha) with the self-normalizing
-- constants, softsign(x) = x / (1 + |x|)
function F.hardsigmoid(x) return F.relu6(want_tensor(x, "hardsigmoid", "input") + 3) / 6 end
function F.hardswish(x) return want_tensor(x, "hardswish", "input") * F.relu6(x + 3) / 6 end
local SELU_ALPHA, SELU_SCALE = 1.6732632423543772848170429916717, 1.0507009873554804934193349852946
function F.selu(x) return F.elu(want_tensor(x, "selu", "input"), SELU_ALPHA) * SELU_SCALE end
function F.softsign(x) return want_tensor(x, "softsign", "input") / (x:abs() + 1) end

-- celu(x, alpha=1): x where x > 0, alpha (exp(x / alpha) - 1) elsewhere
function F.celu(x, alpha)
  want_tensor(x, "celu", "input")
  if type(alpha) == "table" then alpha = alpha.alpha end
  alpha = want_number(alpha, "celu", "alpha", 1)
  if alpha == 0 then raise("celu: alpha must not be 0") end
  return torch.where(x:gt(0), x, ((x:clamp(nil, 0) / alpha):exp() - 1) * alpha)
end
-- logsigmoid(x) = -softplus(-x), without overflow
function F.logsigmoid(x) return -F.softplus(-want_tensor(x, "logsigmoid", "input")) end
function F.softmin(x, dim) return F.softmax(-want_tensor(x, "softmin", "input"), dim) end
function F.tanhshrink(x) return want_tensor(x, "tanhshrink", "input") - x:tanh() end
-- softshrink(x, lambd=0.5): x - lambd above lambd, x + lambd below
-- -lambd, 0 between; hardshrink(x, lambd=0.5): x outside [-lambd, lambd]
local function lambd_of(v, fn)
  if type(v) == "table" then v = v.lambd end
  v = want_number(v, fn, "lambd", 0.5)
  if v < 0 then raise(string.format("%s: lambd must be non-negative, got %s", fn, tostring(v))) end
  return v
end
function F.softshrink(x, lambd)
  want_tensor(x, "softshrink", "input")
  local l = lambd_of(lambd, "softshrink")
  return torch.where(x:gt(l), x - l, torch.where(x:lt(-l), x + l, 0))
end
function F.hardshrink(x, lambd)
  want_tensor(x, "hardshrink", "input")
  local l = lambd_of(lambd, "hardshrink")
  return torch.where(x:abs():gt(l), x, 0)
end
-- threshold(x, threshold, value): x where x > threshold, value elsewhere
function F.threshold(x, threshold, value)
  want_tensor(x, "threshold", "input")
  if type(threshold) == "table" then threshold, value = threshold.threshold, threshold.value end
  threshold, value = want_number(threshold, "threshold", "threshold"), want_number(value, "threshold", "value")
  if threshold == nil or value == nil then raise("threshold: expected the threshold and the value") end
  return torch.where(x:gt(threshold), x, value)
end
-- glu(x, dim=-1): the first half of dim times the sigmoid of the second
function F.glu(x, dim)
  want_tensor(x, "glu", "input")
  if type(dim) == "table" then dim = dim.dim end
  dim = dim or -1
  local n = x:size(dim)
  if n % 2 ~= 0 then raise(string.format("glu: halving dimension must be even, but dimension %d is size %d", dim, n)) end
  local a, b = x:narrow(dim, 0, n / 2), x:narrow(dim, n / 2, n / 2)
  return a * b:sigmoid()
end
-- prelu(x, weight): x where x >= 0, weight x elsewhere; weight one
-- number or one per channel (dim 1, or dim 0 of a 1-D input)
function F.prelu(x, weight)
  want_tensor(x, "prelu", "input")
  want_tensor(weight, "prelu", "weight")
  local w = weight
  if weight:numel() ~= 1 then
    local C = x:dim() >= 2 and x:size(1) or x:size(0)
    if weight:dim() ~= 1 or weight:size(0) ~= C then
      raise(string.format("prelu: expected weight of one element or one per channel (%d), got %s", C, shape_str(weight)))
    end
    local shape = {}
    for d = 1, x:dim() do shape[d] = 1 end
    shape[x:dim() >= 2 and 2 or 1] = C
    w = weight:view(shape)
  else
    w = weight:reshape({})
  end
  return torch.where(x:ge(0), x, x * w)
end
-- rrelu(x, lower=1/8, upper=1/3, training=false): training, each negative
-- element times a slope drawn uniformly from [lower, upper]; otherwise
-- their mean
function F.rrelu(x, lower, upper, training)
  want_tensor(x, "rrelu", "input")
  if type(lower) == "table" then lower, upper, training = lower.lower, lower.upper, lower.training end
  lower, upper = want_number(lower, "rrelu", "lower", 1 / 8), want_number(upper, "rrelu", "upper", 1 / 3)
  if lower > upper then raise("rrelu: lower bound should be less than or equal to the upper bound") end
  local slope = (lower + upper) / 2
  if training then slope = torch.rand_like(x) * (upper - lower) + lower end
  return torch.where(x:ge(0), x, x * slope)
end
-- gumbel_softmax(logits [, tau=1, hard=false, dim=-1]) (or {tau=, hard=,
-- dim=}): softmax((logits + Gumbel noise) / tau); hard gives the one-hot
-- of its argmax with the soft sample's gradient (straight through)
function F.gumbel_softmax(logits, tau, hard, dim)
  want_tensor(logits, "gumbel_softmax", "logits")
  if type(tau) == "table" then tau, hard, dim = tau.tau, tau.hard, tau.dim end
  tau, dim = want_number(tau, "gumbel_softmax", "tau", 1), dim or -1
  local gumbels = -torch.rand_like(logits):clamp(1e-20, 1):log():neg():log()
  local y = F.softmax((logits + gumbels) / tau, dim)
  if not hard then return y end
  local index = y:argmax(dim, true)
  local one_hot = torch.zeros_like(y):scatter(dim, index, 1)
  return one_hot - y:detach() + y
end

local function dim_arg(dim, fn)
  if type(dim) == "table" then dim = dim.dim end
  if dim == nil then raise(fn .. ": the dim argument is required") end
  return dim
end
function F.softmax(x, dim)
  want_tensor(x, "softmax", "input")
  if autocast_on then x = AC.cast_fp32(x) end
  return x:softmax(dim_arg(dim, "softmax"))
end
function F.log_softmax(x, dim)
  want_tensor(x, "log_softmax", "input")
  if autocast_on then x = AC.cast_fp32(x) end
  return x:log_softmax(dim_arg(dim, "log_softmax"))
end

-- dropout(x, p=0.5, training=true): zeroes each element with probability p
-- and scales the rest by 1/(1-p); the mask is torch.rand_like(x) >= p, the
-- same draw, made and applied in one pass (and again in the backward,
-- which keeps no mask).
function F.dropout(x, p, training)
  if type(p) == "table" then p, training = p.p, p.training end
  want_tensor(x, "dropout", "input")
  if p == nil then p = 0.5 end
  if type(p) ~= "number" or p < 0 or p > 1 then
    raise("dropout: dropout probability has to be between 0 and 1, but got " .. tostring(p))
  end
  if training == false or p == 0 then return x end
  if p == 1 then return x * 0 end
  return torch._native_dropout(x, p)
end

-- dropout1d / dropout2d / dropout3d(x, p=0.5, training=true): whole
-- channels zeroed (one draw per sample and channel), the kept ones scaled
-- by 1 / (1 - p); input (N, C, *) or unbatched (C, *) with 1, 2 or 3
-- trailing dims.
-- The shape of one draw per sample and channel.
local function channel_shape(x, fn, spatial)
  local batched = x:dim() == spatial + 2
  if not batched and x:dim() ~= spatial + 1 then
    raise(string.format("%s: expected a %d-D or %d-D input, got %s", fn, spatial + 1, spatial + 2, shape_str(x)))
  end
  local shape = {}
  local lead = batched and 2 or 1
  for d = 1, x:dim() do shape[d] = d <= lead and x:size(d - 1) or 1 end
  return shape
end
local function channel_dropout(fn, spatial)
  return function(x, p, training)
    if type(p) == "table" then p, training = p.p, p.training end
    want_tensor(x, fn, "input")
    if p == nil then p = 0.5 end
    if type(p) ~= "number" or p < 0 or p > 1 then
      raise(fn .. ": dropout probability has to be between 0 and 1, but got " .. tostring(p))
    end
    local shape = channel_shape(x, fn, spatial)
    if training == false or p == 0 then return x end
    if p == 1 then return x * 0 end
    local keep = torch.rand(shape, { dtype = x.dtype, device = x.device }):ge(p)
    return x * keep:to(x.dtype) * (1 / (1 - p))
  end
end
F.dropout1d = channel_dropout("dropout1d", 1)
F.dropout2d = channel_dropout("dropout2d", 2)
F.dropout3d = channel_dropout("dropout3d", 3)

-- alpha_dropout / feature_alpha_dropout(x, p=0.5, training=false): SELU's
-- dropout: dropped elements (channels) set to SELU's negative saturation,
-- then an affine map that keeps the mean and variance.
local function alpha_dropout(fn, mask_of)
  return function(x, p, training)
    if type(p) == "table" then p, training = p.p, p.training end
    want_tensor(x, fn, "input")
    if p == nil then p = 0.5 end
    if type(p) ~= "number" or p < 0 or p > 1 then
      raise(fn .. ": dropout probability has to be between 0 and 1, but got " .. tostring(p))
    end
    if not training or p == 0 then return x end
    if p == 1 then return x * 0 end
    local alpha = -1.7580993408473766   -- -SELU's scale times alpha
    local a = 1 / math.sqrt((1 - p) * (1 + p * alpha * alpha))
    local keep = mask_of(x, p):to(x.dtype)
    return (x * keep + (1 - keep) * alpha) * a - a * alpha * p
  end
end
F.alpha_dropout = alpha_dropout("alpha_dropout", function(x, p) return torch.rand_like(x):ge(p) end)
F.feature_alpha_dropout = alpha_dropout("feature_alpha_dropout", function(x, p)
  local shape = { x:size(0), x:dim() > 1 and x:size(1) or nil }
  for d = #shape + 1, x:dim() do shape[d] = 1 end
  return torch.rand(shape, { dtype = x.dtype, device = x.device }):ge(p)
end)

---------------------------------------------------------------- linear

-- linear(x, weight [, bias]): x @ weight^T + bias, one fused C op.
-- The argument checks of linear (also nn.Sequential's fused Linear+ReLU).
function F._check_linear(x, weight, bias)
  want_tensor(x, "linear", "input")
  want_tensor(weight, "linear", "weight")
  if bias ~= nil then want_tensor(bias, "linear", "bias") end
  if weight:dim() ~= 2 then
    raise("linear: expected weight to be 2-D (out_features, in_features), got shape " .. shape_str(weight))
  end
  if x:dim() == 0 or x:size(-1) ~= weight:size(1) then
    raise(string.format("linear: input shape %s and weight shape %s do not fit (expected input of shape [*, %d])",
                        shape_str(x), shape_str(weight), weight:size(1)))
  end
end

function F.linear(x, weight, bias)
  F._check_linear(x, weight, bias)
  if autocast_on then x, weight, bias = AC.cast_inputs(x, weight, bias) end
  return torch._linear(x, weight, bias)
end

---------------------------------------------------------------- losses

-- Probability targets (same shape as input, float): a composite over
-- log_softmax, as PyTorch.
local function cross_entropy_probs(input, target, weight, reduction, ls)
  local cdim = input:dim() == 1 and 0 or 1
  local C = input:size(cdim)
  if ls > 0 then target = target * (1 - ls) + ls / C end
  local prod = input:log_softmax(cdim) * target
  if weight ~= nil then
    local wshape = {}
    for i = 1, input:dim() do wshape[i] = 1 end
    wshape[cdim + 1] = C
    prod = prod * weight:view(wshape)
  end
  local loss = -prod:sum(cdim)
  return reduce(loss, reduction)
end

-- Moves the class dim of (N, C, d1, ...) last and flattens, so that the C
-- op sees (M, C) and (M).
local function flatten_classes(input, target)
  local n = input:dim()
  local perm = { 0 }
  for d = 2, n - 1 do perm[#perm + 1] = d end
  perm[#perm + 1] = 1
  local C = input:size(1)
  return input:permute(perm):reshape(-1, C), target:reshape(-1)
end

local function class_loss(fn, input, target, opts, log_probs)
  want_float(input, fn, "input")
  want_tensor(target, fn, "target")
  local reduction = reduction_of(opts, fn)
  local weight = opts.weight
  -- under autocast the loss is float32's; for (N, C) logits and class
  -- indices the C op makes the cast itself (fp32), or needs none
  local fp32 = false
  if autocast_on then
    weight = AC.cast_fp32(weight)
    if input:dim() == 2 and target.dtype == torch.int64 and AC.casts_fp32(input) then
      fp32 = true
    else
      input = AC.cast_fp32(input)
    end
  end
  local ignore_index = opts.ignore_index or -100
  local ls = opts.label_smoothing or 0
  if type(ignore_index) ~= "number" or ignore_index % 1 ~= 0 then
    raise(fn .. ": expected ignore_index to be an integer, got " .. tostring(ignore_index))
  end
  if type(ls) ~= "number" or ls < 0 or ls > 1 then
    raise(fn .. ": label_smoothing must be between 0.0 and 1.0, got " .. tostring(ls))
  end
  -- the common case, (N, C) logits and int64 class indices: the C op
  -- checks the shapes and the weight itself and names the problem
  if input:dim() == 2 and target.dtype == torch.int64 and (weight == nil or is_tensor(weight)) then
    return torch._cross_entropy(input, target, weight, ignore_index, ls, REDUCTION[reduction], log_probs, fp32)
  end
  if input:dim() == 0 then raise(fn .. ": input tensor should be 1D or more, got a 0-d tensor") end
  local cdim = input:dim() == 1 and 0 or 1
  local C = input:size(cdim)
  if weight ~= nil then
    want_float(weight, fn, "weight")
    if weight:dim() ~= 1 or weight:size(0) ~= C then
      raise(string.format("%s: expected weight to be a 1-D tensor of size %d (one per class), got shape %s",
                          fn, C, shape_str(weight)))
    end
  end
  if target:is_floating_point() then
    if log_probs then
      raise(fn .. ": expected target to be an int64 tensor of class indices, got " .. tostring(target.dtype))
    end
    if shape_str(target) ~= shape_str(input) then
      raise(string.format("%s: expected target to be an int64 tensor of class indices, or class probabilities "
                          .. "of the input's shape %s; got %s of shape %s", fn, shape_str(input),
                          tostring(target.dtype), shape_str(target)))
    end
    return cross_entropy_probs(input, target, weight, reduction, ls)
  end
  if target.dtype ~= torch.int64 then
    raise(string.format("%s: expected target to be an int64 tensor of class indices, got %s (use target:long())",
                        fn, tostring(target.dtype)))
  end
  -- expected target shape: input's without the class dim
  local want = {}
  for i, s in ipairs(input:size()) do if i ~= cdim + 1 then want[#want + 1] = s end end
  local got = target:size()
  local ok = #got == #want
  for i = 1, #want do ok = ok and got[i] == want[i] end
  if not ok then
    raise(string.format("%s: expected target of shape [%s] for input of shape %s (class indices, one per sample), got %s",
                        fn, table.concat(want, ", "), shape_str(input), shape_str(target)))
  end
  local red = REDUCTION[reduction]
  if input:dim() == 1 then
    local out = torch._cross_entropy(input:unsqueeze(0), target:unsqueeze(0), weight, ignore_index, ls, red, log_probs)
    return red == 0 and out:squeeze(0) or out
  end
  if input:dim() > 2 then
    local x2, t2 = flatten_classes(input, target)
    local out = torch._cross_entropy(x2, t2, weight, ignore_index, ls, red, log_probs)
    return red == 0 and out:view(want) or out
  end
  return torch._cross_entropy(input, target, weight, ignore_index, ls, red, log_probs)
end

-- cross_entropy(input, target, {weight=, ignore_index=-100, reduction="mean",
-- label_smoothing=0}): input (N, C), (C) or (N, C, d1, ...) logits; target
-- int64 class indices (N) / () / (N, d1, ...), or class probabilities of
-- the input's shape.
function F.cross_entropy(input, target, opts)
  return class_loss("cross_entropy", input, target, loss_opts(opts, "cross_entropy"), false)
end

-- nll_loss(input, target, {weight=, ignore_index=-100, reduction="mean"}):
-- input holds log-probabilities.
function F.nll_loss(input, target, opts)
  opts = loss_opts(opts, "nll_loss")
  if opts.label_smoothing ~= nil then raise("nll_loss: takes no label_smoothing (use cross_entropy)") end
  return class_loss("nll_loss", input, target, opts, true)
end

local function same_shape(fn, input, target)
  want_tensor(input, fn, "input")
  want_tensor(target, fn, "target")
  if shape_str(input) ~= shape_str(target) then return false end
  return true
end

local warned = {}
local function warn_once(key, msg)
  if warned[key] then return end
  warned[key] = true
  io.stderr:write("warning: ", msg, "\n")
end

-- The elementwise regression losses broadcast a target of another shape
-- with PyTorch's warning, once per pair of shapes; shapes that do not
-- broadcast are an error that names the loss.
local function warn_broadcast(fn, input, target)
  if same_shape(fn, input, target) then return end
  local a, b = input:size(), target:size()
  for i = 1, math.min(#a, #b) do
    local x, y = a[#a + 1 - i], b[#b + 1 - i]
    if x ~= y and x ~= 1 and y ~= 1 then
      raise(string.format("%s: target of shape %s does not broadcast with input of shape %s", fn, shape_str(target),
                          shape_str(input)))
    end
  end
  warn_once(fn .. shape_str(input) .. shape_str(target),
            string.format("%s: using a target size (%s) that is different to the input size (%s); "
                          .. "this will likely lead to incorrect results due to broadcasting",
                          fn, shape_str(target), shape_str(input)))
end

-- Whether tensor t broadcasts to shape (a size table) without growing it.
local function broadcasts_to(t, shape)
  local n = t:dim()
  if n > #shape then return false end
  for i = 1, n do
    local s = t:size(i - 1)
    if s ~= 1 and s ~= shape[#shape - n + i] then return false end
  end
  return true
end

-- The bound of PyTorch's losses, 1e-12 rounded to float32 as PyTorch does.
local EPSILON = 9.9999999600419720e-13

-- log(1 + e^z) without overflow: max(z, 0) + log1p(e^-|z|), with -|z|
-- written z - 2 relu(z), whose gradient at z = 0 keeps softplus's 1/2
-- (abs and relu both have 0 there).
local function softplus(z)
  local r = z:relu()
  return r + (z - r * 2):exp():log1p()
end

-- mse_loss(input, target [, {reduction=}]): a target of another shape is
-- broadcast with a warning, as PyTorch does.
function F.mse_loss(input, target, opts)
  opts = loss_opts(opts, "mse_loss")
  warn_broadcast("mse_loss", input, target)
  if autocast_on then input, target = AC.cast_fp32(input, target) end
  local d = input - target
  return reduce(d * d, reduction_of(opts, "mse_loss"))
end

function F.l1_loss(input, target, opts)
  opts = loss_opts(opts, "l1_loss")
  warn_broadcast("l1_loss", input, target)
  if autocast_on then input, target = AC.cast_fp32(input, target) end
  return reduce((input - target):abs(), reduction_of(opts, "l1_loss"))
end

-- smooth_l1_loss(input, target, {reduction=, beta=1}): 0.5 d^2 / beta
-- where |d| < beta, |d| - 0.5 beta elsewhere (d = input - target); beta = 0
-- is l1_loss.
function F.smooth_l1_loss(input, target, opts)
  local fn = "smooth_l1_loss"
  opts = loss_opts(opts, fn, { reduction = true, beta = true })
  want_float(input, fn, "input")
  want_float(target, fn, "target")
  warn_broadcast(fn, input, target)
  local reduction = reduction_of(opts, fn)
  local beta = want_number(opts.beta, fn, "beta", 1.0)
  if not (beta >= 0) then raise(fn .. ": beta must be non-negative, got " .. tostring(beta)) end
  if autocast_on then input, target = AC.cast_fp32(input, target) end
  local d = input - target
  -- |d| as -d at 0, whose gradient -1 there is PyTorch's for beta = 0
  if beta == 0 then return reduce(torch.where(d:gt(0), d, -d), reduction) end
  local ad = d:abs()
  return reduce(torch.where(ad:lt(beta), d * d * (0.5 / beta), ad - 0.5 * beta), reduction)
end

-- huber_loss(input, target, {reduction=, delta=1}): 0.5 d^2 where |d| <
-- delta, delta (|d| - 0.5 delta) elsewhere: smooth_l1_loss times delta.
function F.huber_loss(input, target, opts)
  local fn = "huber_loss"
  opts = loss_opts(opts, fn, { reduction = true, delta = true })
  want_float(input, fn, "input")
  want_float(target, fn, "target")
  warn_broadcast(fn, input, target)
  local reduction = reduction_of(opts, fn)
  local delta = want_number(opts.delta, fn, "delta", 1.0)
  if not (delta > 0) then raise(fn .. ": delta must be positive, got " .. tostring(delta)) end
  if autocast_on then input, target = AC.cast_fp32(input, target) end
  local d = input - target
  local ad = d:abs()
  return reduce(torch.where(ad:lt(delta), d * d * 0.5, (ad - 0.5 * delta) * delta), reduction)
end

-- binary_cross_entropy(input, target, {weight=, reduction=}): input holds
-- probabilities, -weight (t log(x) + (1 - t) log(1 - x)) with each log
-- clamped at -100, as PyTorch. Input and target outside [0, 1] are
-- refused: the check reads the data (on a GPU, a synchronisation).
function F.binary_cross_entropy(input, target, opts)
  local fn = "binary_cross_entropy"
  opts = loss_opts(opts, fn, { weight = true, reduction = true })
  want_float(input, fn, "input")
  want_float(target, fn, "target")
  if not same_shape(fn, input, target) then
    raise(string.format("%s: target size (%s) must be the same as input size (%s)", fn, shape_str(target),
                        shape_str(input)))
  end
  if target.dtype ~= input.dtype then
    raise(string.format("%s: expected target of the input's dtype %s, got %s", fn, tostring(input.dtype),
                        tostring(target.dtype)))
  end
  local reduction = reduction_of(opts, fn)
  local weight = opts.weight
  if weight ~= nil then
    want_float(weight, fn, "weight")
    if not broadcasts_to(weight, input:size()) then
      raise(string.format("%s: weight of shape %s does not broadcast to the input's shape %s", fn,
                          shape_str(weight), shape_str(input)))
    end
  end
  if autocast_on then
    input, target = AC.cast_fp32(input, target)
    weight = AC.cast_fp32(weight)
  end
  local x, t = input:detach(), target:detach()
  -- one read back for both ranges (on a GPU, one synchronisation a call)
  local x_ok, t_ok = x:ge(0):logical_and(x:le(1)):all(), t:ge(0):logical_and(t:le(1)):all()
  if not x_ok:logical_and(t_ok):item() then
    if not x_ok:item() then
      raise(fn .. ": all elements of input should be between 0 and 1 (probabilities; "
            .. "binary_cross_entropy_with_logits takes logits)")
    end
    raise(fn .. ": all elements of target should be between 0 and 1")
  end
  -- the logs of the detached input, and the input's gradient PyTorch's
  -- w (x - t) / max(x (1 - x), EPSILON) through the term (input - x) g,
  -- which is 0: finite at 0 and 1, where the clamped logs' gradient
  -- would be 0 * inf
  local loss = -(target * x:log():clamp(-100) + (1 - target) * (1 - x):log():clamp(-100))
  local g = (x - t) / (x * (1 - x)):clamp(EPSILON)
  if weight ~= nil then
    loss = loss * weight
    g = g * weight:detach()
  end
  return reduce(loss + (input - x) * g, reduction)
end

-- binary_cross_entropy_with_logits(input, target, {weight=, pos_weight=,
-- reduction=}): the numerically stable form
--   (1 - t) x + (1 + (pw - 1) t) softplus(-x)
function F.binary_cross_entropy_with_logits(input, target, opts)
  opts = loss_opts(opts, "binary_cross_entropy_with_logits")
  local fn = "binary_cross_entropy_with_logits"
  want_float(input, fn, "input")
  want_float(target, fn, "target")
  if not same_shape(fn, input, target) then
    raise(string.format("%s: Target size (%s) must be the same as input size (%s)", fn, shape_str(target), shape_str(input)))
  end
  local reduction = reduction_of(opts, fn)
  local pos_weight, weight = opts.pos_weight, opts.weight
  if autocast_on then
    input, target = AC.cast_fp32(input, target)
    pos_weight, weight = AC.cast_fp32(pos_weight, weight)
  end
  local softplus_neg = softplus(-input)   -- log(1 + exp(-x))
  local loss
  if pos_weight ~= nil then
    want_tensor(pos_weight, fn, "pos_weight")
    local log_weight = (pos_weight - 1) * target + 1
    loss = (1 - target) * input + log_weight * softplus_neg
  else
    loss = (1 - target) * input + softplus_neg
  end
  if weight ~= nil then loss = loss * want_tensor(weight, fn, "weight") end
  return reduce(loss, reduction)
end

-- kl_div(input, target, {reduction="mean", log_target=false}): input holds
-- log-probabilities; target t log(t) - t input (0 where t = 0), or with
-- log_target exp(t) (t - input). "batchmean" divides the sum by the
-- batch size (input's first dim), the divergence's definition; "mean"
-- divides by every element (PyTorch warns about it, dplua does not).
local KL_REDUCTION = { none = true, mean = true, sum = true, batchmean = true }
function F.kl_div(input, target, opts)
  local fn = "kl_div"
  opts = loss_opts(opts, fn, { reduction = true, log_target = true })
  want_float(input, fn, "input")
  want_float(target, fn, "target")
  local reduction = opts.reduction or "mean"
  if not KL_REDUCTION[reduction] then
    raise(string.format('%s: reduction must be "none", "mean", "sum" or "batchmean", got %s', fn, tostring(reduction)))
  end
  local log_target = opts.log_target or false
  if type(log_target) ~= "boolean" then
    raise(fn .. ": expected log_target to be a boolean, got " .. typename(log_target))
  end
  if autocast_on then input, target = AC.cast_fp32(input, target) end
  local loss
  if log_target then
    loss = target:exp() * (target - input)
  else
    loss = target * torch.where(target:eq(0), 1, target):log() - target * input
  end
  if reduction ~= "batchmean" then return reduce(loss, reduction) end
  loss = loss:sum()
  return input:dim() > 0 and loss / input:size(0) or loss
end

-- soft_margin_loss(input, target, {reduction=}): log(1 + exp(-target
-- input)), target holding 1 or -1, without overflow.
function F.soft_margin_loss(input, target, opts)
  local fn = "soft_margin_loss"
  opts = loss_opts(opts, fn, { reduction = true })
  want_float(input, fn, "input")
  want_tensor(target, fn, "target")
  if not broadcasts_to(target, input:size()) then
    raise(string.format("%s: target of shape %s does not broadcast to the input's shape %s", fn,
                        shape_str(target), shape_str(input)))
  end
  local reduction = reduction_of(opts, fn)
  if autocast_on then input, target = AC.cast_fp32(input, target) end
  return reduce(softplus(-input * target), reduction)
end

-- cosine_embedding_loss(input1, input2, target, {margin=0, reduction=}):
-- 1 - cos(x1, x2) where target is 1, max(0, cos - margin) where it is -1,
-- 0 elsewhere; rows (N, D) with target (N), or one pair (D) with a 0-d
-- target. cos = x1.x2 / sqrt((|x1|^2 + eps) (|x2|^2 + eps)), eps = 1e-12,
-- as PyTorch.
function F.cosine_embedding_loss(input1, input2, target, opts)
  local fn = "cosine_embedding_loss"
  opts = loss_opts(opts, fn, { margin = true, reduction = true })
  want_float(input1, fn, "input1")
  want_float(input2, fn, "input2")
  want_tensor(target, fn, "target")
  local margin = want_number(opts.margin, fn, "margin", 0)
  local reduction = reduction_of(opts, fn)
  local d = target:dim()
  if d > 1 then raise(string.format("%s: expected a 0-d or 1-D target, got shape %s", fn, shape_str(target))) end
  if input1:dim() ~= d + 1 or input2:dim() ~= d + 1 then
    raise(string.format("%s: a %s target expects %s inputs, got input1 %s and input2 %s", fn,
                        d == 1 and "1-D" or "0-d", d == 1 and "2-D (N, D)" or "1-D (D)",
                        shape_str(input1), shape_str(input2)))
  end
  if autocast_on then input1, input2 = AC.cast_fp32(input1, input2) end
  local prod = (input1 * input2):sum(d)
  local cos = prod / (((input1 * input1):sum(d) + EPSILON) * ((input2 * input2):sum(d) + EPSILON)):sqrt()
  if d == 1 and target:size(0) ~= cos:size(0) and target:size(0) ~= 1 and cos:size(0) ~= 1 then
    raise(string.format("%s: target of shape %s for %d pairs of rows (input1 %s, input2 %s)", fn,
                        shape_str(target), cos:size(0), shape_str(input1), shape_str(input2)))
  end
  local loss = torch.where(target:eq(1), 1 - cos, 0) + torch.where(target:eq(-1), (cos - margin):clamp(0), 0)
  return reduce(loss, reduction)
end

-- margin_ranking_loss(input1, input2, target, {margin=0, reduction=}):
-- max(0, -target (input1 - input2) + margin); the three of one number of
-- dims, broadcast together.
function F.margin_ranking_loss(input1, input2, target, opts)
  local fn = "margin_ranking_loss"
  opts = loss_opts(opts, fn, { margin = true, reduction = true })
  want_float(input1, fn, "input1")
  want_float(input2, fn, "input2")
  want_tensor(target, fn, "target")
  if input1:dim() ~= input2:dim() or input1:dim() ~= target:dim() then
    raise(string.format("%s: expected input1, input2 and target of one number of dims, got %s, %s and %s", fn,
                        shape_str(input1), shape_str(input2), shape_str(target)))
  end
  local margin = want_number(opts.margin, fn, "margin", 0)
  local reduction = reduction_of(opts, fn)
  if autocast_on then input1, input2, target = AC.cast_fp32(input1, input2, target) end
  return reduce((-target * (input1 - input2) + margin):clamp(0), reduction)
end

-- hinge_embedding_loss(input, target, {margin=1, reduction=}): input
-- where target is not -1, plus max(0, margin - input) where it is not 1
-- (target holding 1 or -1), broadcast together.
function F.hinge_embedding_loss(input, target, opts)
  local fn = "hinge_embedding_loss"
  opts = loss_opts(opts, fn, { margin = true, reduction = true })
  want_float(input, fn, "input")
  want_tensor(target, fn, "target")
  local margin = want_number(opts.margin, fn, "margin", 1)
  local reduction = reduction_of(opts, fn)
  if autocast_on then input = AC.cast_fp32(input) end
  local loss = torch.where(target:ne(1), (margin - input):clamp(0), 0) + torch.where(target:ne(-1), input, 0)
  return reduce(loss, reduction)
end

-- poisson_nll_loss(input, target, {log_input=true, full=false, eps=1e-8,
-- reduction=}): exp(input) - target input (log_input), else input -
-- target log(input + eps); full adds Stirling's approximation of
-- log(target!) where target > 1.
function F.poisson_nll_loss(input, target, opts)
  local fn = "poisson_nll_loss"
  opts = loss_opts(opts, fn, { log_input = true, full = true, eps = true, reduction = true })
  want_float(input, fn, "input")
  want_tensor(target, fn, "target")
  local eps = want_number(opts.eps, fn, "eps", 1e-8)
  local reduction = reduction_of(opts, fn)
  if autocast_on then input, target = AC.cast_fp32(input, target) end
  local loss
  if opts.log_input ~= false then loss = input:exp() - target * input
  else loss = input - target * (input + eps):log() end
  if opts.full then
    local stirling = target * target:log() - target + (target * (2 * math.pi)):log() * 0.5
    loss = loss + stirling:masked_fill(target:le(1), 0)
  end
  return reduce(loss, reduction)
end

-- gaussian_nll_loss(input, target, var, {full=false, eps=1e-6,
-- reduction=}): (log(var) + (input - target)^2 / var) / 2 (+ log(2 pi) / 2
-- with full). var has the input's shape, or it without the last dim, or
-- with a last dim of 1; negative entries are refused; it is clamped to eps
-- in value only, its gradient passing through as PyTorch's.
function F.gaussian_nll_loss(input, target, var, opts)
  local fn = "gaussian_nll_loss"
  opts = loss_opts(opts, fn, { full = true, eps = true, reduction = true })
  want_float(input, fn, "input")
  want_tensor(target, fn, "target")
  want_float(var, fn, "var")
  local eps = want_number(opts.eps, fn, "eps", 1e-6)
  local reduction = reduction_of(opts, fn)
  local function str(t, n) return "[" .. table.concat(t, ", ", 1, n or #t) .. "]" end
  local is, vs = input:size(), var:size()
  if str(vs) ~= str(is) then
    if str(vs) == str(is, #is - 1) then
      var = var:unsqueeze(-1)
    elseif not (#vs == #is and vs[#vs] == 1 and str(vs, #vs - 1) == str(is, #is - 1)) then
      raise(string.format("%s: var of shape %s does not fit the input's %s (expected the input's shape, it without "
                          .. "the last dim, or it with a last dim of 1)", fn, str(vs), str(is)))
    end
  end
  if var:lt(0):any():item() then raise(fn .. ": var has negative entries") end
  if autocast_on then input, target, var = AC.cast_fp32(input, target, var) end
  var = var + (var:clamp(eps) - var):detach()
  local d = input - target
  local loss = (var:log() + d * d / var) * 0.5
  if opts.full then loss = loss + 0.5 * math.log(2 * math.pi) end
  return reduce(loss, reduction)
end

-- The triplet losses' inputs: three tensors of one number of dims.
local function want_triplet(fn, anchor, positive, negative)
  want_float(anchor, fn, "anchor")
  want_float(positive, fn, "positive")
  want_float(negative, fn, "negative")
  if anchor:dim() ~= positive:dim() or positive:dim() ~= negative:dim() then
    raise(string.format("%s: expected anchor, positive and negative of one number of dims, got %s, %s and %s", fn,
                        shape_str(anchor), shape_str(positive), shape_str(negative)))
  end
end

-- max(0, margin + d(anchor, positive) - d(anchor, negative)), with swap the
-- smaller of d(anchor, negative) and d(positive, negative).
local function triplet(distance, anchor, positive, negative, margin, swap, reduction)
  local dneg = distance(anchor, negative)
  if swap then dneg = torch.minimum(dneg, distance(positive, negative)) end
  return reduce((distance(anchor, positive) - dneg + margin):clamp(0), reduction)
end

-- triplet_margin_loss(anchor, positive, negative, {margin=1, p=2,
-- eps=1e-6, swap=false, reduction=}): d is pairwise_distance's p-norm.
function F.triplet_margin_loss(anchor, positive, negative, opts)
  local fn = "triplet_margin_loss"
  opts = loss_opts(opts, fn, { margin = true, p = true, eps = true, swap = true, reduction = true })
  want_triplet(fn, anchor, positive, negative)
  local p, eps = want_number(opts.p, fn, "p", 2), want_number(opts.eps, fn, "eps", 1e-6)
  local function distance(a, b) return F.pairwise_distance(a, b, p, eps) end
  return triplet(distance, anchor, positive, negative, want_number(opts.margin, fn, "margin", 1), opts.swap == true,
                 reduction_of(opts, fn))
end

-- triplet_margin_with_distance_loss(anchor, positive, negative,
-- {distance_function=pairwise_distance, margin=1, swap=false,
-- reduction=}): d any function of two tensors; margin must be positive.
function F.triplet_margin_with_distance_loss(anchor, positive, negative, opts)
  local fn = "triplet_margin_with_distance_loss"
  opts = loss_opts(opts, fn, { distance_function = true, margin = true, swap = true, reduction = true })
  want_triplet(fn, anchor, positive, negative)
  local distance = opts.distance_function or F.pairwise_distance
  if type(distance) ~= "function" and not (type(distance) == "table" and getmetatable(distance)) then
    raise(string.format("%s: expected distance_function to be a function, got %s", fn, typename(distance)))
  end
  local margin = want_number(opts.margin, fn, "margin", 1)
  if margin <= 0 then raise(string.format("%s: expected margin to be greater than 0, got %s", fn, tostring(margin))) end
  return triplet(distance, anchor, positive, negative, margin, opts.swap == true, reduction_of(opts, fn))
end

-- Rows (N, C) with targets (N), or one row (C) with a 0-d target, as rows.
local function class_rows(fn, input, target)
  want_float(input, fn, "input")
  want_tensor(target, fn, "target")
  if target.dtype ~= torch.int64 then raise(string.format("%s: expected an int64 target, got %s", fn, target.dtype.name)) end
  local d = input:dim()
  if (d ~= 1 and d ~= 2) or target:dim() ~= d - 1 or (d == 2 and target:size(0) ~= input:size(0)) then
    raise(string.format("%s: expected input (N, C) with target (N), or input (C) with a 0-d target, got input %s and "
                        .. "target %s", fn, shape_str(input), shape_str(target)))
  end
  if d == 1 then return input:unsqueeze(0), target:view(1) end
  return input, target
end

-- multi_margin_loss(input, target, {p=1, margin=1, weight=, reduction=}):
-- per row, the sum over classes j other than the target y of
-- max(0, margin - x[y] + x[j])^p (times weight[y]), over C.
function F.multi_margin_loss(input, target, opts)
  local fn = "multi_margin_loss"
  opts = loss_opts(opts, fn, { p = true, margin = true, weight = true, reduction = true })
  local x, y = class_rows(fn, input, target)
  local p = want_number(opts.p, fn, "p", 1)
  if p ~= 1 and p ~= 2 then raise(string.format("%s: only p = 1 and p = 2 are supported, got %s", fn, tostring(p))) end
  local margin = want_number(opts.margin, fn, "margin", 1)
  local reduction = reduction_of(opts, fn)
  local N, C = x:size(0), x:size(1)
  local w = opts.weight
  if w ~= nil and (not is_tensor(w) or w:dim() ~= 1 or w:size(0) ~= C) then
    raise(string.format("%s: expected weight to be a tensor of %d entries (one a class), got %s", fn, C,
                        is_tensor(w) and shape_str(w) or typename(w)))
  end
  if autocast_on then x = AC.cast_fp32(x) end
  local y1 = y:view(N, 1)
  local z = (x - x:gather(1, y1) + margin):relu()
  if p == 2 then z = z * z end
  if w ~= nil then z = z * w:index_select(0, y):view(N, 1) end
  local loss = z:masked_fill(F.one_hot(y, C):bool(), 0):sum(1) / C
  if input:dim() == 1 then loss = loss:view() end
  return reduce(loss, reduction)
end

-- multilabel_margin_loss(input, target, {reduction=}): target holds, per
-- row, class indices up to the first -1; the sum over those classes y and
-- the classes k not among them of max(0, 1 - (x[y] - x[k])), over C.
function F.multilabel_margin_loss(input, target, opts)
  local fn = "multilabel_margin_loss"
  opts = loss_opts(opts, fn, { reduction = true })
  want_float(input, fn, "input")
  want_tensor(target, fn, "target")
  if target.dtype ~= torch.int64 then raise(string.format("%s: expected an int64 target, got %s", fn, target.dtype.name)) end
  if (input:dim() ~= 1 and input:dim() ~= 2) or shape_str(target) ~= shape_str(input) then
    raise(string.format("%s: expected input (C) or (N, C) and a target of its shape, got input %s and target %s", fn,
                        shape_str(input), shape_str(target)))
  end
  local reduction = reduction_of(opts, fn)
  local x, t = input, target
  if x:dim() == 1 then x, t = x:unsqueeze(0), t:unsqueeze(0) end
  local C = x:size(1)
  if C > 0 and (t:min():item() < -1 or t:max():item() >= C) then
    raise(string.format("%s: target values must be -1 or class indices in [0, %d)", fn, C))
  end
  if autocast_on then x = AC.cast_fp32(x) end
  local listed = t:eq(-1):cumsum(1):eq(0)                                   -- (N, P): before the first -1
  local y = t:clamp(0)
  local is_target = F.one_hot(y, C):masked_fill(listed:logical_not():unsqueeze(2), 0):sum(1):gt(0)   -- (N, C)
  local z = (x:unsqueeze(1) - x:gather(1, y):unsqueeze(2) + 1):relu()      -- (N, P, C)
  local skip = listed:logical_not():unsqueeze(2):logical_or(is_target:unsqueeze(1))
  local loss = z:masked_fill(skip, 0):sum({ 1, 2 }) / C
  if input:dim() == 1 then loss = loss:view() end
  return reduce(loss, reduction)
end

-- multilabel_soft_margin_loss(input, target, {weight=, reduction=}): the
-- mean over classes of -(t log sigmoid(x) + (1 - t) log sigmoid(-x)) (each
-- class times weight).
function F.multilabel_soft_margin_loss(input, target, opts)
  local fn = "multilabel_soft_margin_loss"
  opts = loss_opts(opts, fn, { weight = true, reduction = true })
  want_float(input, fn, "input")
  want_tensor(target, fn, "target")
  local reduction = reduction_of(opts, fn)
  if autocast_on then input, target = AC.cast_fp32(input, target) end
  local loss = target * softplus(-input) + (1 - target) * softplus(input)
  if opts.weight ~= nil then loss = loss * want_tensor(opts.weight, fn, "weight") end
  local cd = input:dim() - 1
  return reduce(loss:sum(cd) / input:size(cd), reduction)
end

-- ctc_loss(log_probs, targets, input_lengths, target_lengths [, {blank=0,
-- reduction="mean", zero_infinity=false}]): the connectionist temporal
-- classification loss, -log of the probability of the targets summed over
-- their alignments, as a log-space forward (alpha) recursion over time,
-- one step of tensor ops a frame (its gradient by autograd). log_probs
-- (T, N, C) or unbatched (T, C); targets padded (N, S) or concatenated (the
-- sum of target_lengths); the lengths tensors or lists. "mean" divides each
-- loss by its target length, then averages. An impossible alignment (too
-- short an input) is a loss of inf, or 0 with zero_infinity (a gradient of
-- 0 either way). The gradient is the loss's with respect to log_probs
-- itself; PyTorch's assumes they are a log_softmax and is the gradient of
-- the logits, so the two agree through F.log_softmax.
local CTC_NEG = -1e30   -- log(0) that stays finite, so that no gradient is 0 * inf
function F.ctc_loss(log_probs, targets, input_lengths, target_lengths, opts)
  local fn = "ctc_loss"
  opts = loss_opts(opts, fn, { blank = true, reduction = true, zero_infinity = true })
  want_float(log_probs, fn, "log_probs")
  want_tensor(targets, fn, "targets")
  local reduction = reduction_of(opts, fn)
  local blank = want_number(opts.blank, fn, "blank", 0)
  local batched = log_probs:dim() == 3
  if not batched and log_probs:dim() ~= 2 then
    raise(fn .. ": expected log_probs of shape (T, N, C) or (T, C), got " .. shape_str(log_probs))
  end
  local lp = batched and log_probs or log_probs:unsqueeze(1)
  local T_, N, C = lp:size(0), lp:size(1), lp:size(2)
  if blank < 0 or blank >= C or blank % 1 ~= 0 then
    raise(string.format("%s: blank %s is not a class index in [0, %d)", fn, tostring(blank), C))
  end
  local function lengths(v, what)
    local list = is_tensor(v) and v:reshape(-1):tolist() or (type(v) == "number" and { v } or v)
    if type(list) ~= "table" or #list ~= N then
      raise(string.format("%s: expected %s to hold %d lengths (one a sequence), got %s", fn, what, N,
                          is_tensor(v) and shape_str(v) or typename(v)))
    end
    return list
  end
  local il, tl = lengths(input_lengths, "input_lengths"), lengths(target_lengths, "target_lengths")
  -- the targets of each sequence, on the host
  if targets.dtype ~= torch.int64 and targets.dtype ~= torch.int32 then
    raise(fn .. ": expected integer targets, got " .. targets.dtype.name)
  end
  local tv = targets:cpu():tolist()
  local seqs, S = {}, 0
  local flat = not batched or targets:dim() == 1
  local at = 0
  for n = 1, N do
    local len = tl[n]
    if type(len) ~= "number" or len < 0 or len % 1 ~= 0 then raise(fn .. ": expected non-negative target lengths") end
    if type(il[n]) ~= "number" or il[n] < 0 or il[n] > T_ then
      raise(string.format("%s: input length %s of sequence %d is not within [0, %d]", fn, tostring(il[n]), n - 1, T_))
    end
    local seq = {}
    for k = 1, len do
      local c
      if flat then c = (targets:dim() == 1 and tv[at + k]) or nil
      else c = tv[n] and tv[n][k] end
      if c == nil then
        raise(string.format("%s: targets hold fewer labels than target_lengths asks for (sequence %d)", fn, n - 1))
      end
      if c < 0 or c >= C or c == blank then
        raise(string.format("%s: target label %d of sequence %d is not a class in [0, %d) other than blank %d", fn, c,
                            n - 1, C, blank))
      end
      seq[k] = c
    end
    if flat then at = at + len end
    seqs[n] = seq
    S = math.max(S, len)
  end
  -- extended labels: blank, l1, blank, l2, ..., blank; the skip over a
  -- blank is allowed into a label that differs from the one two back
  local Lx = 2 * S + 1
  local ext, skip = {}, {}
  for n = 1, N do
    local e, k = {}, {}
    for s = 1, Lx do
      local lab = s % 2 == 0 and seqs[n][s / 2] or nil     -- (nil at the blanks)
      e[s] = lab or blank
      k[s] = s >= 3 and lab ~= nil and lab ~= seqs[n][s / 2 - 1]
    end
    ext[n], skip[n] = e, k
  end
  local dev = lp.device
  local ext_t = torch.tensor(ext, { dtype = torch.int64, device = dev })                  -- (N, Lx)
  local skip_t = torch.tensor(skip, { dtype = torch.bool, device = dev })
  local emit = lp:gather(2, ext_t:unsqueeze(0):expand(T_, N, Lx))                           -- (T, N, Lx)
  local neg = torch.full({ N, Lx }, CTC_NEG, { dtype = lp.dtype, device = dev })
  local start = torch.zeros(N, Lx, { dtype = torch.bool, device = dev })
  start[{ {}, { 0, math.min(2, Lx) } }] = true
  local alpha = torch.where(start, emit[0], neg)
  local neg1 = torch.full({ N, 1 }, CTC_NEG, { dtype = lp.dtype, device = dev })
  local neg2 = torch.full({ N, 2 }, CTC_NEG, { dtype = lp.dtype, device = dev })
  local il_t = torch.tensor(il, { dtype = torch.int64, device = dev }):view(N, 1)
  for t = 1, T_ - 1 do
    local a1 = torch.cat({ neg1, alpha:narrow(1, 0, Lx - 1) }, 1)
    local a2 = Lx > 2 and torch.where(skip_t, torch.cat({ neg2, alpha:narrow(1, 0, Lx - 2) }, 1), neg) or neg
    local nxt = torch.stack({ alpha, a1, a2 }, 0):logsumexp(0) + emit[t]
    alpha = torch.where(il_t:gt(t), nxt, alpha)
  end
  -- the end: the last label or the blank after it, at each input's last frame
  local ends = {}
  for n = 1, N do ends[n] = { 2 * #seqs[n], math.max(2 * #seqs[n] - 1, 0) } end
  local last = alpha:gather(1, torch.tensor(ends, { dtype = torch.int64, device = dev }))   -- (N, 2)
  local same = {}
  for n = 1, N do same[n] = { false, #seqs[n] == 0 } end
  last = last:masked_fill(torch.tensor(same, { dtype = torch.bool, device = dev }), CTC_NEG)
  local loss = -last:logsumexp(1)
  -- an input of no frames gives the empty target probability 1 and any
  -- other 0; an alignment that does not fit the frames, probability 0
  local no_frames, nonempty = {}, {}
  for n = 1, N do no_frames[n], nonempty[n] = il[n] == 0, #seqs[n] > 0 end
  no_frames = torch.tensor(no_frames, { dtype = torch.bool, device = dev })
  nonempty = torch.tensor(nonempty, { dtype = torch.bool, device = dev })
  loss = loss:masked_fill(no_frames, 0)
  local impossible = loss:gt(-CTC_NEG / 2):logical_or(no_frames:logical_and(nonempty))
  loss = loss:masked_fill(impossible, opts.zero_infinity and 0 or math.huge)
  if reduction == "mean" then
    local tl_t = torch.tensor(tl, { dtype = lp.dtype, device = dev }):clamp(1)
    return (loss / tl_t):mean()
  end
  if reduction == "sum" then return loss:sum() end
  return batched and loss or loss:squeeze(0)
end

---------------------------------------------------------------- convolution and pooling

-- Output size of a sliding window, PyTorch's formula.
local function out_size(n, k, s, p, d) return math.floor((n + 2 * p - d * (k - 1) - 1) / s) + 1 end

-- The trailing arguments of a convolution or a pool, given positionally
-- or as one options table in the first one's place: the values in the
-- order of names.
local function trailing_args(names, first, ...)
  if type(first) == "table" and first[1] == nil then
    local out = {}
    for i, k in ipairs(names) do out[i] = first[k] end
    return unpack(out, 1, #names)
  end
  return first, ...
end

local conv_names = { "stride", "padding", "dilation", "groups" }
local conv_transpose_names = { "stride", "padding", "output_padding", "groups", "dilation" }

-- conv_opts: positional (stride, padding, dilation, groups) or one table.
local function conv_args(stride, padding, dilation, groups)
  return trailing_args(conv_names, stride, padding, dilation, groups)
end

-- Whether conv2d runs as the fused CPU op (src/cpu/conv.c): CPU tensors of
-- one dtype, float32 or float64.
local function fused_conv(x, w, b)
  local dt = x.dtype
  return not x.is_cuda and not w.is_cuda and (dt == torch.float32 or dt == torch.float64) and w.dtype == dt
    and (b == nil or (b.dtype == dt and not b.is_cuda))
end

-- conv2d(input, weight [, bias] [, stride=1, padding=0, dilation=1, groups=1])
-- or conv2d(input, weight, bias, {stride=, padding=, dilation=, groups=}):
-- on the CPU the fused op; elsewhere im2col through torch._unfold, then
-- one matmul: weight (O, C*kh*kw) @ cols.
function F.conv2d(input, weight, bias, stride, padding, dilation, groups)
  local fn = "conv2d"
  stride, padding, dilation, groups = conv_args(stride, padding, dilation, groups)
  want_float(input, fn, "input")
  want_float(weight, fn, "weight")
  if bias ~= nil then want_tensor(bias, fn, "bias") end
  if weight:dim() ~= 4 then
    raise(fn .. ": expected weight of shape (out_channels, in_channels/groups, kH, kW), got " .. shape_str(weight))
  end
  local batched = input:dim() == 4
  if not batched and input:dim() ~= 3 then
    raise(fn .. ": expected 3-D (C, H, W) or 4-D (N, C, H, W) input, got input of shape " .. shape_str(input))
  end
  local x = batched and input or input:unsqueeze(0)
  groups = groups or 1
  local s, d = pair(stride or 1, fn, "stride"), pair(dilation or 1, fn, "dilation")
  local O, Cg, kh, kw = weight:size(0), weight:size(1), weight:size(2), weight:size(3)
  local p
  padding = padding or 0
  if padding == "valid" then p = { 0, 0 }
  elseif padding == "same" then
    if s[1] ~= 1 or s[2] ~= 1 then raise(fn .. ": padding='same' is not supported for strided convolutions") end
    local th, tw = d[1] * (kh - 1), d[2] * (kw - 1)
    if th % 2 ~= 0 or tw % 2 ~= 0 then
      raise(fn .. ": padding='same' needs an odd effective kernel size here (asymmetric padding is not supported)")
    end
    p = { th / 2, tw / 2 }
  else p = pair(padding, fn, "padding") end
  local N, C, H, W = x:size(0), x:size(1), x:size(2), x:size(3)
  if type(groups) ~= "number" or groups < 1 or groups % 1 ~= 0 then raise(fn .. ": groups must be a positive integer") end
  if C ~= Cg * groups then
    raise(string.format("%s: Given groups=%d, weight of size %s, expected input%s to have %d channels, but got %d channels instead",
                        fn, groups, shape_str(weight), shape_str(x), Cg * groups, C))
  end
  if O % groups ~= 0 then raise(fn .. ": out_channels must be divisible by groups") end
  if bias ~= nil and (bias:dim() ~= 1 or bias:size(0) ~= O) then
    raise(string.format("%s: expected bias of shape [%d], got %s", fn, O, shape_str(bias)))
  end
  local Ho, Wo = out_size(H, kh, s[1], p[1], d[1]), out_size(W, kw, s[2], p[2], d[2])
  if Ho < 1 or Wo < 1 then
    raise(string.format("%s: input of size %s is too small for kernel (%d, %d) with dilation (%d, %d) and padding (%d, %d) (output would be %.0f x %.0f)",
                        fn, shape_str(x), kh, kw, d[1], d[2], p[1], p[2], Ho, Wo))
  end
  if autocast_on then x, weight, bias = AC.cast_inputs(x, weight, bias) end
  if fused_conv(x, weight, bias) then
    local out = torch._conv2d(x, weight, bias, s, p, d, groups)
    return batched and out or out:squeeze(0)
  end
  local cols = torch._unfold(x, { kh, kw }, s, p, d, 0)          -- (N, C*kh*kw, L)
  local out
  if groups == 1 then
    out = weight:reshape(O, -1):matmul(cols)                        -- (N, O, L)
  else
    local K, Og, parts = Cg * kh * kw, O / groups, {}
    for g = 0, groups - 1 do
      local wg = weight:narrow(0, g * Og, Og):reshape(Og, -1)
      parts[#parts + 1] = wg:matmul(cols:narrow(1, g * K, K))
    end
    out = torch.cat(parts, 1)
  end
  if bias ~= nil then out = out + bias:view(1, O, 1) end
  out = out:reshape(N, O, Ho, Wo)
  return batched and out or out:squeeze(0)
end

-- A 1-D op's size argument: a number or a one-element table, default
-- when nil.
local function one(v, fn, what, default)
  if v == nil then return default end
  if type(v) == "table" then
    if #v ~= 1 or type(v[1]) ~= "number" then
      raise(string.format("%s: expected %s to be an integer or a one-element table", fn, what))
    end
    v = v[1]
  end
  if type(v) ~= "number" or v % 1 ~= 0 then
    raise(string.format("%s: expected %s to be an integer, got %s", fn, what, tostring(v)))
  end
  return v
end

-- The (N, C, L) or (C, L) input of a 1-D op as (N, C, 1, L) or (C, 1, L).
local function as_2d(input, fn)
  want_float(input, fn, "input")
  if input:dim() ~= 2 and input:dim() ~= 3 then
    raise(fn .. ": expected 2-D (C, L) or 3-D (N, C, L) input, got input of shape " .. shape_str(input))
  end
  return input:unsqueeze(-2)
end

-- conv1d(input, weight [, bias] [, stride=1, padding=0, dilation=1,
-- groups=1]) or with an options table: input (N, C, L) or (C, L), weight
-- (out_channels, in_channels/groups, k); conv2d over a height of one.
function F.conv1d(input, weight, bias, stride, padding, dilation, groups)
  local fn = "conv1d"
  stride, padding, dilation, groups = conv_args(stride, padding, dilation, groups)
  want_float(input, fn, "input")
  want_float(weight, fn, "weight")
  if weight:dim() ~= 3 then
    raise(fn .. ": expected weight of shape (out_channels, in_channels/groups, kW), got " .. shape_str(weight))
  end
  local x = as_2d(input, fn)
  local p = type(padding) == "string" and padding or { 0, one(padding, fn, "padding", 0) }
  local out = F.conv2d(x, weight:unsqueeze(2), bias, { 1, one(stride, fn, "stride", 1) }, p,
                       { 1, one(dilation, fn, "dilation", 1) }, groups)
  return out:squeeze(-2)
end

-- conv_transpose2d(input, weight [, bias, stride=1, padding=0,
-- output_padding=0, groups=1, dilation=1]) or with an options table after
-- bias: the gradient of conv2d with respect to its input, as PyTorch's.
-- input (N, C_in, H, W) or unbatched, weight (C_in, C_out/groups, kH, kW).
-- As conv2d over the input spread out by the stride (zeros between its
-- pixels) with the kernel flipped and its channels swapped per group.
function F.conv_transpose2d(input, weight, bias, stride, padding, output_padding, groups, dilation)
  local fn = "conv_transpose2d"
  stride, padding, output_padding, groups, dilation =
    trailing_args(conv_transpose_names, stride, padding, output_padding, groups, dilation)
  want_float(input, fn, "input")
  want_float(weight, fn, "weight")
  if weight:dim() ~= 4 then
    raise(fn .. ": expected weight of shape (in_channels, out_channels/groups, kH, kW), got " .. shape_str(weight))
  end
  local batched = input:dim() == 4
  if not batched and input:dim() ~= 3 then
    raise(fn .. ": expected 3-D (C, H, W) or 4-D (N, C, H, W) input, got input of shape " .. shape_str(input))
  end
  local x = batched and input or input:unsqueeze(0)
  groups = groups or 1
  if type(groups) ~= "number" or groups < 1 or groups % 1 ~= 0 then raise(fn .. ": groups must be a positive integer") end
  local s, p = pair(stride or 1, fn, "stride"), pair(padding or 0, fn, "padding")
  local op, d = pair(output_padding or 0, fn, "output_padding"), pair(dilation or 1, fn, "dilation")
  for a = 1, 2 do
    if op[a] >= s[a] and op[a] >= d[a] then
      raise(string.format("%s: output padding must be smaller than either stride or dilation, got output_padding=(%d, %d)",
                          fn, op[1], op[2]))
    end
  end
  local Cin, Cog, kh, kw = weight:size(0), weight:size(1), weight:size(2), weight:size(3)
  local N, C, H, W = x:size(0), x:size(1), x:size(2), x:size(3)
  if C ~= Cin then
    raise(string.format("%s: Given transposed weight of size %s, expected input%s to have %d channels, but got %d channels instead",
                        fn, shape_str(weight), shape_str(x), Cin, C))
  end
  if Cin % groups ~= 0 then raise(fn .. ": in_channels must be divisible by groups") end
  local Cout = Cog * groups
  if bias ~= nil and (not is_tensor(bias) or bias:dim() ~= 1 or bias:size(0) ~= Cout) then
    raise(string.format("%s: expected bias of shape [%d], got %s", fn, Cout, is_tensor(bias) and shape_str(bias) or typename(bias)))
  end
  -- the kernel for conv2d: (C_out, C_in/groups, kH, kW), flipped in space
  local Cig, parts = Cin / groups, {}
  for g = 0, groups - 1 do parts[#parts + 1] = weight:narrow(0, g * Cig, Cig):transpose(0, 1) end
  local w = #parts == 1 and parts[1] or torch.cat(parts, 0)
  local function reversed(n)
    local idx = {}
    for i = 1, n do idx[i] = n - i end
    return torch.tensor(idx, { dtype = torch.int64, device = weight.device })
  end
  w = w:index_select(2, reversed(kh)):index_select(3, reversed(kw))
  -- spread: s - 1 zeros after each pixel but the last, along H then W
  local function spread(t, dim, step)
    if step == 1 then return t end
    local n = t:size(dim)
    local zshape = t:size()
    zshape[dim + 1] = n
    local moved = t:unsqueeze(dim + 1)
    local zs = moved:size()
    zs[dim + 2] = step - 1
    local both = torch.cat({ moved, torch.zeros(zs, { dtype = t.dtype, device = t.device }) }, dim + 1)
    local flat = both:size()
    table.remove(flat, dim + 2)
    flat[dim + 1] = n * step
    return both:reshape(flat):narrow(dim, 0, (n - 1) * step + 1)
  end
  x = spread(spread(x, 2, s[1]), 3, s[2])
  -- pad d (k - 1) - p on each side, output_padding more at the end;
  -- a negative pad crops
  local function pad(t, dim, before, after)
    if before < 0 then t = t:narrow(dim, -before, t:size(dim) + before); before = 0 end
    if after < 0 then t = t:narrow(dim, 0, t:size(dim) + after); after = 0 end
    local pieces = {}
    local function zeros(n)
      local zs = t:size()
      zs[dim + 1] = n
      return torch.zeros(zs, { dtype = t.dtype, device = t.device })
    end
    if before > 0 then pieces[#pieces + 1] = zeros(before) end
    pieces[#pieces + 1] = t
    if after > 0 then pieces[#pieces + 1] = zeros(after) end
    return #pieces == 1 and t or torch.cat(pieces, dim)
  end
  local ph, pw = d[1] * (kh - 1) - p[1], d[2] * (kw - 1) - p[2]
  x = pad(pad(x, 2, ph, ph + op[1]), 3, pw, pw + op[2])
  if x:size(2) < d[1] * (kh - 1) + 1 or x:size(3) < d[2] * (kw - 1) + 1 then
    raise(string.format("%s: input of size %s with padding (%d, %d) gives an empty output", fn, shape_str(input), p[1], p[2]))
  end
  local out = F.conv2d(x, w, bias, 1, 0, d, groups)
  return batched and out or out:squeeze(0)
end

-- conv_transpose1d(input, weight [, bias, stride=1, padding=0,
-- output_padding=0, groups=1, dilation=1]) or with an options table after
-- bias: input (N, C_in, L) or (C_in, L), weight (C_in, C_out/groups, k);
-- conv_transpose2d over a height of one.
function F.conv_transpose1d(input, weight, bias, stride, padding, output_padding, groups, dilation)
  local fn = "conv_transpose1d"
  stride, padding, output_padding, groups, dilation =
    trailing_args(conv_transpose_names, stride, padding, output_padding, groups, dilation)
  want_float(weight, fn, "weight")
  if weight:dim() ~= 3 then
    raise(fn .. ": expected weight of shape (in_channels, out_channels/groups, kW), got " .. shape_str(weight))
  end
  local out = F.conv_transpose2d(as_2d(input, fn), weight:unsqueeze(2), bias, { 1, one(stride, fn, "stride", 1) },
                                 { 0, one(padding, fn, "padding", 0) }, { 0, one(output_padding, fn, "output_padding", 0) },
                                 groups, { 1, one(dilation, fn, "dilation", 1) })
  return out:squeeze(-2)
end

-- A pooling's input as a batch of images: x (N, C, H, W), and whether the
-- input was one.
local function pool_input(input, fn)
  want_float(input, fn, "input")
  local batched = input:dim() == 4
  if not batched and input:dim() ~= 3 then
    raise(fn .. ": expected 3-D (C, H, W) or 4-D (N, C, H, W) input, got input of shape " .. shape_str(input))
  end
  return batched and input or input:unsqueeze(0), batched
end

-- What the 2-D window poolings share: the input as a batch (pool_input),
-- the window (k, s, p, d pairs) checked against it, and the output size
-- Ho, Wo.
local function pool_window(input, fn, kernel_size, stride, padding, dilation)
  local x, batched = pool_input(input, fn)
  local k = pair(kernel_size, fn, "kernel_size")
  local s = pair(stride or kernel_size, fn, "stride")
  local p = pair(padding or 0, fn, "padding")
  local d = pair(dilation or 1, fn, "dilation")
  if p[1] > k[1] / 2 or p[2] > k[2] / 2 then
    raise(string.format("%s: pad should be at most half of effective kernel size, but got pad=(%d, %d), kernel_size=(%d, %d)",
                        fn, p[1], p[2], k[1], k[2]))
  end
  local Ho, Wo = out_size(x:size(2), k[1], s[1], p[1], d[1]), out_size(x:size(3), k[2], s[2], p[2], d[2])
  if Ho < 1 or Wo < 1 then
    raise(string.format("%s: input of size %s is too small for kernel (%d, %d) (output would be %d x %d)",
                        fn, shape_str(x), k[1], k[2], Ho, Wo))
  end
  return x, batched, k, s, p, d, Ho, Wo
end

-- With ceil_mode, PyTorch's output size along a dim of n (windows that
-- start inside the input or its leading padding, the last one allowed past
-- the end), and how far the last window reaches past the trailing padding.
local function ceil_window(n, k, s, p, d)
  local out = math.floor((n + 2 * p - d * (k - 1) - 1 + s - 1) / s) + 1
  if (out - 1) * s >= n + p then out = out - 1 end
  return out, math.max(0, (out - 1) * s + d * (k - 1) + 1 - (n + 2 * p))
end

-- pool_window's sizes with ceil_mode: x padded at the bottom and right by
-- what the last windows reach past its padding, with `fill`, so that the
-- windows of the padded x are PyTorch's; returns x, Ho, Wo and the two
-- reaches.
local function ceil_pool(x, k, s, p, d, fill)
  local Ho, eh = ceil_window(x:size(2), k[1], s[1], p[1], d[1])
  local Wo, ew = ceil_window(x:size(3), k[2], s[2], p[2], d[2])
  if eh > 0 or ew > 0 then x = F.pad(x, { 0, ew, 0, eh }, "constant", fill) end
  return x, Ho, Wo, eh, ew
end

-- The pools' trailing arguments, positionally or as one options table
-- after kernel_size.
local max_pool_names = { "stride", "padding", "dilation", "ceil_mode", "return_indices" }
local function max_pool_args(stride, padding, dilation, ceil_mode, return_indices)
  return trailing_args(max_pool_names, stride, padding, dilation, ceil_mode, return_indices)
end
local avg_pool_names = { "stride", "padding", "ceil_mode", "count_include_pad", "divisor_override" }
local function avg_pool_args(fn, stride, padding, ceil_mode, count_include_pad, divisor_override)
  stride, padding, ceil_mode, count_include_pad, divisor_override =
    trailing_args(avg_pool_names, stride, padding, ceil_mode, count_include_pad, divisor_override)
  if divisor_override ~= nil and (type(divisor_override) ~= "number" or divisor_override == 0) then
    raise(fn .. ": divisor must be not zero")
  end
  return stride, padding, ceil_mode, count_include_pad, divisor_override
end

-- The flat position (row * W + column, in an input W wide) of each
-- window's element at `at` (int64 (N, C, L), offsets within the windows
-- in unfold's order): the offsets' distances from the window's corner,
-- plus each window's corner.
local function window_positions(at, k, s, p, d, Ho, Wo, W)
  local within, corners = {}, {}
  for r = 0, k[1] - 1 do
    for c = 0, k[2] - 1 do within[#within + 1] = r * d[1] * W + c * d[2] end
  end
  for oh = 0, Ho - 1 do
    for ow = 0, Wo - 1 do corners[#corners + 1] = (oh * s[1] - p[1]) * W + ow * s[2] - p[2] end
  end
  local opts = { dtype = torch.int64, device = at.device }
  return torch.tensor(within, opts):index_select(0, at:reshape(-1)):view(at:size()) + torch.tensor(corners, opts)
end

-- max_pool2d(input, kernel_size [, stride=kernel_size, padding=0,
-- dilation=1, ceil_mode=false, return_indices=false]) or
-- max_pool2d(input, kernel_size, {stride=, padding=, dilation=,
-- ceil_mode=, return_indices=}): on the CPU the fused op; elsewhere, and
-- for the indices, unfold with -inf padding, then the max over each
-- window. ceil_mode pads the bottom and right with -inf first (ceil_pool).
-- return_indices also returns, as PyTorch, each maximum's flat position in
-- its (H, W) plane (int64, the output's shape).
function F.max_pool2d(input, kernel_size, stride, padding, dilation, ceil_mode, return_indices)
  local fn = "max_pool2d"
  stride, padding, dilation, ceil_mode, return_indices =
    max_pool_args(stride, padding, dilation, ceil_mode, return_indices)
  local x, batched, k, s, p, d, Ho, Wo = pool_window(input, fn, kernel_size, stride, padding, dilation)
  local W = x:size(3)
  if ceil_mode then x, Ho, Wo = ceil_pool(x, k, s, p, d, -math.huge) end
  if not return_indices and not x.is_cuda and (x.dtype == torch.float32 or x.dtype == torch.float64) then
    local out = torch._max_pool2d(x, k, s, p, d)
    return batched and out or out:squeeze(0)
  end
  local N, C = x:size(0), x:size(1)
  local cols = torch._unfold(x, k, s, p, d, -math.huge)            -- (N, C*kh*kw, L)
  local out, at = cols:reshape(N, C, k[1] * k[2], Ho * Wo):max(2)
  out = out:reshape(N, C, Ho, Wo)
  if not return_indices then return batched and out or out:squeeze(0) end
  local indices = window_positions(at, k, s, p, d, Ho, Wo, W):reshape(N, C, Ho, Wo)
  if batched then return out, indices end
  return out:squeeze(0), indices:squeeze(0)
end

-- avg_pool2d(input, kernel_size [, stride=kernel_size, padding=0,
-- ceil_mode=false, count_include_pad=true, divisor_override=nil]) or with
-- one options table after kernel_size: unfold with zero padding, then the
-- mean of each window (over the window's size, or only its elements inside
-- the input when count_include_pad is false).
function F.avg_pool2d(input, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)
  local fn = "avg_pool2d"
  stride, padding, ceil_mode, count_include_pad, divisor_override =
    avg_pool_args(fn, stride, padding, ceil_mode, count_include_pad, divisor_override)
  local x, batched, k, s, p, _, Ho, Wo = pool_window(input, fn, kernel_size, stride, padding, 1)
  local N, C, H, W = x:size(0), x:size(1), x:size(2), x:size(3)
  local eh, ew = 0, 0
  if ceil_mode then x, Ho, Wo, eh, ew = ceil_pool(x, k, s, p, { 1, 1 }, 0) end
  local sums = torch._unfold(x, k, s, p, { 1, 1 }, 0):reshape(N, C, k[1] * k[2], Ho * Wo):sum(2)
  local out
  if divisor_override ~= nil then
    out = sums / divisor_override
  elseif (count_include_pad == false and (p[1] > 0 or p[2] > 0)) or eh > 0 or ew > 0 then
    -- each window's count of what it averages, from the same unfold of
    -- ones: the input's elements, or those and the padding's (not what a
    -- ceil_mode window reaches past the padding), as PyTorch counts them
    local counts
    if count_include_pad == false then
      local ones = F.pad(torch.ones(1, 1, H, W, { dtype = x.dtype, device = x.device }), { 0, ew, 0, eh })
      counts = torch._unfold(ones, k, s, p, { 1, 1 }, 0):sum(1)                      -- (1, Ho*Wo)
    else   -- ones over the input and its padding, zeros past them, unfolded unpadded
      local ones = F.pad(torch.ones(1, 1, H + 2 * p[1], W + 2 * p[2], { dtype = x.dtype, device = x.device }),
                         { 0, ew, 0, eh })
      counts = torch._unfold(ones, k, s, { 0, 0 }, { 1, 1 }, 0):sum(1)
    end
    out = sums / counts
  else
    out = sums / (k[1] * k[2])
  end
  out = out:reshape(N, C, Ho, Wo)
  return batched and out or out:squeeze(0)
end

-- adaptive_avg_pool2d(input, output_size): output cell (i, j) is the mean
-- of rows floor(i H / Ho) .. ceil((i + 1) H / Ho) - 1 and the columns
-- alike, as PyTorch; an output size that divides the input is one
-- avg_pool2d, others a mean per cell. nil in output_size keeps that size.
-- An adaptive pool's output size (Ho, Wo) for an input H x W: an int, a
-- pair, or a pair with nil keeping that size.
local MAX_ADAPTIVE_CELLS = 65536
local function adaptive_size(output_size, H, W, fn)
  local o
  if type(output_size) == "table" and #output_size <= 2 and (output_size[1] ~= nil or output_size[2] ~= nil) then
    o = { output_size[1] or H, output_size[2] or W }
  else
    o = pair(output_size, fn, "output_size")
  end
  if o[1] < 1 or o[2] < 1 or o[1] % 1 ~= 0 or o[2] % 1 ~= 0 then
    raise(string.format("%s: output_size must be positive integers, got (%s, %s)", fn, tostring(o[1]), tostring(o[2])))
  end
  -- an output size that does not divide the input takes a step per cell
  if o[1] * o[2] > MAX_ADAPTIVE_CELLS and (H % o[1] ~= 0 or W % o[2] ~= 0) then
    raise(string.format("%s: output_size (%d, %d) does not divide the input (%d, %d) and has more than %d cells, "
                        .. "which this pool computes one at a time", fn, o[1], o[2], H, W, MAX_ADAPTIVE_CELLS))
  end
  return o
end

-- Adaptive cell i of n over a size of `size`: its first index and length.
local function adaptive_cell(i, n, size)
  local a = math.floor(i * size / n)
  return a, math.ceil((i + 1) * size / n) - a
end

function F.adaptive_avg_pool2d(input, output_size)
  local fn = "adaptive_avg_pool2d"
  local x, batched = pool_input(input, fn)
  local H, W = x:size(2), x:size(3)
  local o = adaptive_size(output_size, H, W, fn)
  local out
  if H % o[1] == 0 and W % o[2] == 0 then
    out = F.avg_pool2d(x, { H / o[1], W / o[2] })
  else
    local rows = {}
    for i = 0, o[1] - 1 do
      local h0, hn = adaptive_cell(i, o[1], H)
      local cells = {}
      for j = 0, o[2] - 1 do
        local w0, wn = adaptive_cell(j, o[2], W)
        cells[#cells + 1] = x:narrow(2, h0, hn):narrow(3, w0, wn):mean({ 2, 3 })
      end
      rows[#rows + 1] = torch.stack(cells, 2)        -- (N, C, Wo)
    end
    out = torch.stack(rows, 2)                        -- (N, C, Ho, Wo)
  end
  return batched and out or out:squeeze(0)
end

-- adaptive_max_pool2d(input, output_size [, return_indices=false]): the
-- maximum of each adaptive_avg_pool2d cell; with return_indices also its
-- flat position in the (H, W) plane, as max_pool2d's. A size that divides
-- the input is one max_pool2d, others a max per cell.
function F.adaptive_max_pool2d(input, output_size, return_indices)
  local fn = "adaptive_max_pool2d"
  if type(return_indices) == "table" then return_indices = return_indices.return_indices end
  local x, batched = pool_input(input, fn)
  local N, C, H, W = x:size(0), x:size(1), x:size(2), x:size(3)
  local o = adaptive_size(output_size, H, W, fn)
  if H % o[1] == 0 and W % o[2] == 0 then
    return F.max_pool2d(input, { H / o[1], W / o[2] }, { return_indices = return_indices })
  end
  local values, positions = {}, {}
  for i = 0, o[1] - 1 do
    local h0, hn = adaptive_cell(i, o[1], H)
    for j = 0, o[2] - 1 do
      local w0, wn = adaptive_cell(j, o[2], W)
      local v, at = x:narrow(2, h0, hn):narrow(3, w0, wn):reshape(N, C, hn * wn):max(2)
      values[#values + 1] = v
      if return_indices then
        positions[#positions + 1] = window_positions(at:unsqueeze(2), { hn, wn }, { 1, 1 }, { -h0, -w0 }, { 1, 1 },
                                                     1, 1, W):view(N, C)
      end
    end
  end
  local out = torch.stack(values, 2):view(N, C, o[1], o[2])
  if not return_indices then return batched and out or out:squeeze(0) end
  local indices = torch.stack(positions, 2):view(N, C, o[1], o[2])
  if batched then return out, indices end
  return out:squeeze(0), indices:squeeze(0)
end

-- The unpools' trailing arguments, positionally or as one options table.
local function unpool_args(stride, padding, output_size)
  if type(stride) == "table" and stride[1] == nil then return stride.stride, stride.padding, stride.output_size end
  return stride, padding, output_size
end

-- The unpool of x (N, C, spatial...) with its pool's indices (flat
-- positions in each output plane or volume): zeros of (in - 1) stride -
-- 2 padding + kernel per spatial dim (or output_size: its last nd numbers,
-- within a stride of that) with each value written at its index.
local function unpool(fn, x, batched, input, indices, k, s, p, output_size)
  local nd = #k
  if indices.dtype ~= torch.int64 or shape_str(indices) ~= shape_str(input) then
    raise(string.format("%s: expected int64 indices of the input's shape %s, got %s %s", fn, shape_str(input),
                        indices.dtype.name, shape_str(indices)))
  end
  local N, C = x:size(0), x:size(1)
  local size = {}
  for a = 1, nd do size[a] = (x:size(a + 1) - 1) * s[a] - 2 * p[a] + k[a] end
  if output_size ~= nil then
    local want = output_size
    if type(want) ~= "table" or (#want ~= nd and #want ~= nd + 2) then
      raise(string.format("%s: expected output_size to be a list of %d or %d numbers, got %s", fn, nd, nd + 2, typename(want)))
    end
    local picked = {}
    for a = 1, nd do picked[a] = want[#want - nd + a] end
    for a = 1, nd do
      if not (picked[a] > size[a] - s[a] and picked[a] < size[a] + s[a]) then
        raise(string.format("%s: invalid output_size (%s): dim %d must be between %d and %d", fn, table.concat(picked, ", "),
                            a - 1, size[a] - s[a] + 1, size[a] + s[a] - 1))
      end
    end
    size = picked
  end
  local total = 1
  for a = 1, nd do total = total * size[a] end
  -- (on a GPU the scatter's kernel reports a bad index at the next synchronisation)
  if not x.is_cuda and indices:numel() > 0 then
    local lo, hi = indices:min():item(), indices:max():item()
    if lo < 0 or hi >= total then
      raise(string.format("%s: index %d is out of bounds for an output of %s (a pool of an input of another "
                          .. "size needs output_size)", fn, lo < 0 and lo or hi, table.concat(size, " x ")))
    end
  end
  local flat = torch.zeros(N, C, total, { dtype = x.dtype, device = x.device })
  local out = flat:scatter(2, (batched and indices or indices:unsqueeze(0)):reshape(N, C, -1), x:reshape(N, C, -1))
  out = out:view(N, C, unpack(size))
  return batched and out or out:squeeze(0)
end

-- max_unpool2d(input, indices, kernel_size [, stride=kernel_size,
-- padding=0, output_size]) or with {stride=, padding=, output_size=}:
-- max_pool2d's inverse as PyTorch's (output_size: 2 or 4 numbers).
function F.max_unpool2d(input, indices, kernel_size, stride, padding, output_size)
  local fn = "max_unpool2d"
  stride, padding, output_size = unpool_args(stride, padding, output_size)
  local x, batched = pool_input(input, fn)
  want_tensor(indices, fn, "indices")
  return unpool(fn, x, batched, input, indices, pair(kernel_size, fn, "kernel_size"), pair(stride or kernel_size, fn, "stride"),
                pair(padding or 0, fn, "padding"), output_size)
end

---------------------------------------------------------------- 3-D convolution and pooling

-- The 3-D ops work a depth at a time: the 2-D op over (height, width) of
-- the depth slices folded into the batch, and along the depth a sum (or a
-- max) over the kernel's depth taps, each a strided set of slices.

-- An int or a triple as a three-element table.
local function triple(v, fn, what)
  if type(v) == "number" then
    if v % 1 ~= 0 then raise(string.format("%s: expected %s to be an integer, got %s", fn, what, tostring(v))) end
    return { v, v, v }
  end
  if type(v) == "table" and #v == 3 and type(v[1]) == "number" and type(v[2]) == "number" and type(v[3]) == "number" then
    return { v[1], v[2], v[3] }
  end
  if type(v) == "table" and #v == 1 and type(v[1]) == "number" then return { v[1], v[1], v[1] } end
  raise(string.format("%s: expected %s to be an integer or a triple of integers, got %s", fn, what, typename(v)))
end
F._triple = triple

-- The (N, C, D, H, W) or unbatched (C, D, H, W) input as a batch.
local function volume_input(input, fn)
  want_float(input, fn, "input")
  local batched = input:dim() == 5
  if not batched and input:dim() ~= 4 then
    raise(fn .. ": expected 4-D (C, D, H, W) or 5-D (N, C, D, H, W) input, got input of shape " .. shape_str(input))
  end
  return batched and input or input:unsqueeze(0), batched
end

-- The depth slices i * dilation + o * stride (o < count) of x (N, D, ...).
local function depth_taps(x, i, dilation, stride, count)
  local at = {}
  for o = 0, count - 1 do at[o + 1] = i * dilation + o * stride end
  return x:index_select(1, torch.tensor(at, { dtype = torch.int64, device = x.device }))
end

-- conv3d(input, weight [, bias, stride=1, padding=0, dilation=1,
-- groups=1]) or with an options table after bias: input (N, C, D, H, W),
-- weight (out, C/groups, kD, kH, kW); padding a number, a triple or
-- "valid". One conv2d a kernel depth, over every output depth at once.
function F.conv3d(input, weight, bias, stride, padding, dilation, groups)
  local fn = "conv3d"
  stride, padding, dilation, groups = conv_args(stride, padding, dilation, groups)
  local x, batched = volume_input(input, fn)
  want_float(weight, fn, "weight")
  if weight:dim() ~= 5 then
    raise(fn .. ": expected weight of shape (out_channels, in_channels/groups, kD, kH, kW), got " .. shape_str(weight))
  end
  local s, d = triple(stride or 1, fn, "stride"), triple(dilation or 1, fn, "dilation")
  local p = padding == "valid" and { 0, 0, 0 } or triple(padding or 0, fn, "padding")
  local N, C, D = x:size(0), x:size(1), x:size(2)
  local O, kd = weight:size(0), weight:size(2)
  groups = groups or 1
  if C ~= weight:size(1) * groups then
    raise(string.format("%s: expected input%s to have %d channels, but got %d channels instead", fn, shape_str(x),
                        weight:size(1) * groups, C))
  end
  local Do = out_size(D, kd, s[1], p[1], d[1])
  if Do < 1 then raise(string.format("%s: input of size %s is too small for a kernel depth of %d", fn, shape_str(x), kd)) end
  local xs = F.pad(x, { 0, 0, 0, 0, p[1], p[1] }):permute(0, 2, 1, 3, 4)   -- (N, D', C, H, W)
  local out
  for i = 0, kd - 1 do
    local xi = depth_taps(xs, i, d[1], s[1], Do)
    xi = xi:reshape(N * Do, C, xi:size(3), xi:size(4))
    local yi = F.conv2d(xi, weight:select(2, i):contiguous(), nil, { s[2], s[3] }, { p[2], p[3] }, { d[2], d[3] }, groups)
    out = out and out + yi or yi
  end
  out = out:view(N, Do, O, out:size(2), out:size(3)):permute(0, 2, 1, 3, 4)
  if bias ~= nil then out = out + bias:view(1, O, 1, 1, 1) end
  return batched and out or out:squeeze(0)
end

-- conv_transpose3d(input, weight [, bias, stride=1, padding=0,
-- output_padding=0, groups=1, dilation=1]) or with an options table after
-- bias: weight (in, out/groups, kD, kH, kW); one conv_transpose2d a kernel
-- depth, its output added at the depths it reaches, then the padding cropped.
function F.conv_transpose3d(input, weight, bias, stride, padding, output_padding, groups, dilation)
  local fn = "conv_transpose3d"
  stride, padding, output_padding, groups, dilation =
    trailing_args(conv_transpose_names, stride, padding, output_padding, groups, dilation)
  local x, batched = volume_input(input, fn)
  want_float(weight, fn, "weight")
  if weight:dim() ~= 5 then
    raise(fn .. ": expected weight of shape (in_channels, out_channels/groups, kD, kH, kW), got " .. shape_str(weight))
  end
  local s, p = triple(stride or 1, fn, "stride"), triple(padding or 0, fn, "padding")
  local op, d = triple(output_padding or 0, fn, "output_padding"), triple(dilation or 1, fn, "dilation")
  if op[1] >= s[1] and op[1] >= d[1] then
    raise(string.format("%s: output padding must be smaller than either stride or dilation, got output_padding=(%d, %d, %d)",
                        fn, op[1], op[2], op[3]))
  end
  local N, C, D = x:size(0), x:size(1), x:size(2)
  if C ~= weight:size(0) then
    raise(string.format("%s: expected input%s to have %d channels, but got %d channels instead", fn, shape_str(x),
                        weight:size(0), C))
  end
  local kd = weight:size(2)
  local full = (D - 1) * s[1] + d[1] * (kd - 1) + 1 + op[1]
  local Do = full - 2 * p[1]
  if Do < 1 then raise(string.format("%s: the padding leaves no output depth (%d)", fn, Do)) end
  local xs = x:permute(0, 2, 1, 3, 4):reshape(N * D, C, x:size(3), x:size(4))
  local out
  for i = 0, kd - 1 do
    local yi = F.conv_transpose2d(xs, weight:select(2, i):contiguous(), nil, { s[2], s[3] }, { p[2], p[3] },
                                  { op[2], op[3] }, groups, { d[2], d[3] })
    if out == nil then
      out = torch.zeros(N, full, yi:size(1), yi:size(2), yi:size(3), { dtype = yi.dtype, device = yi.device })
    end
    local at = {}
    for z = 0, D - 1 do at[z + 1] = z * s[1] + i * d[1] end
    out = out:index_add(1, torch.tensor(at, { dtype = torch.int64, device = yi.device }),
                        yi:view(N, D, yi:size(1), yi:size(2), yi:size(3)))
  end
  out = out:narrow(1, p[1], Do):permute(0, 2, 1, 3, 4)
  if bias ~= nil then out = out + bias:view(1, -1, 1, 1, 1) end
  return batched and out or out:squeeze(0)
end

-- A 3-D pool's window checked, and the input padded by the padding (with
-- fill) and, with ceil_mode, by how far the last windows reach past it
-- (with beyond); returns the padded input and the output sizes.
local function pool3d_window(x, fn, k, s, p, d, ceil_mode, fill, beyond)
  for a = 1, 3 do
    if p[a] > k[a] / 2 then
      raise(string.format("%s: pad should be at most half of effective kernel size, but got pad=(%d, %d, %d), "
                          .. "kernel_size=(%d, %d, %d)", fn, p[1], p[2], p[3], k[1], k[2], k[3]))
    end
  end
  local sizes, extra = {}, {}
  for a = 1, 3 do
    local n = x:size(a + 1)
    if ceil_mode then sizes[a], extra[a] = ceil_window(n, k[a], s[a], p[a], d[a])
    else sizes[a], extra[a] = out_size(n, k[a], s[a], p[a], d[a]), 0 end
    if sizes[a] < 1 then
      raise(string.format("%s: input of size %s is too small for kernel (%d, %d, %d)", fn, shape_str(x), k[1], k[2], k[3]))
    end
  end
  x = F.pad(x, { p[3], p[3], p[2], p[2], p[1], p[1] }, "constant", fill)
  if extra[1] > 0 or extra[2] > 0 or extra[3] > 0 then
    x = F.pad(x, { 0, extra[3], 0, extra[2], 0, extra[1] }, "constant", beyond)
  end
  return x, sizes
end

-- Over the padded x (N, C, D, H, W): the 2-D pool of each depth slice,
-- then the kernel's depth taps combined.
local function pool3d(x, k, s, d, sizes, pool2d, combine)
  local N, C = x:size(0), x:size(1)
  local y = pool2d(x:reshape(N, C * x:size(2), x:size(3), x:size(4)))
  y = y:view(N, C, x:size(2), sizes[2], sizes[3]):transpose(1, 2)          -- (N, D', C, Ho, Wo)
  local out
  for i = 0, k[1] - 1 do
    local yi = depth_taps(y, i, d[1], s[1], sizes[1])
    out = out and combine(out, yi) or yi
  end
  return out:transpose(1, 2)                                                 -- (N, C, Do, Ho, Wo)
end

-- max_pool3d(input, kernel_size [, stride=kernel_size, padding=0,
-- dilation=1, ceil_mode=false]) or with an options table: the maximum of
-- the max_pool2d of each depth slice over the kernel's depth.
function F.max_pool3d(input, kernel_size, stride, padding, dilation, ceil_mode, return_indices)
  local fn = "max_pool3d"
  stride, padding, dilation, ceil_mode, return_indices =
    max_pool_args(stride, padding, dilation, ceil_mode, return_indices)
  local x, batched = volume_input(input, fn)
  local k = triple(kernel_size, fn, "kernel_size")
  local s, p = triple(stride or kernel_size, fn, "stride"), triple(padding or 0, fn, "padding")
  local d = triple(dilation or 1, fn, "dilation")
  local H, W = x:size(3), x:size(4)
  local sizes
  x, sizes = pool3d_window(x, fn, k, s, p, d, ceil_mode, -math.huge, -math.huge)
  if return_indices then
    -- each depth slice's max_pool2d with its positions in the padded
    -- slice, the first largest over the kernel's depth taps, and the
    -- winner's (depth, row, column) turned into a flat index of the input
    local N, C, Dp, Hp, Wp = x:size(0), x:size(1), x:size(2), x:size(3), x:size(4)
    local y, yi = F.max_pool2d(x:reshape(N, C * Dp, Hp, Wp), { k[2], k[3] }, { s[2], s[3] }, 0, { d[2], d[3] }, false, true)
    y = y:view(N, C, Dp, sizes[2], sizes[3]):transpose(1, 2)
    yi = yi:view(N, C, Dp, sizes[2], sizes[3]):transpose(1, 2)
    local best, best_i, best_z
    for tap = 0, k[1] - 1 do
      local v, vi = depth_taps(y, tap, d[1], s[1], sizes[1]), depth_taps(yi, tap, d[1], s[1], sizes[1])
      local z = (torch.arange(0, sizes[1], { dtype = torch.int64, device = x.device }) * s[1] + tap * d[1]):view(1, -1, 1, 1, 1)
      if best == nil then
        best, best_i, best_z = v, vi, z:expand(v:size())
      else
        local take = v:gt(best):logical_or(v:ne(v):logical_and(best:eq(best)))   -- (NaN wins, as PyTorch's)
        best, best_i, best_z = torch.where(take, v, best), torch.where(take, vi, best_i), torch.where(take, z, best_z)
      end
    end
    local row, col = best_i:div(Wp, "floor"), best_i:remainder(Wp)
    local index = ((best_z - p[1]) * H + (row - p[2])) * W + (col - p[3])
    local out, at = best:transpose(1, 2), index:transpose(1, 2)
    if batched then return out, at end
    return out:squeeze(0), at:squeeze(0)
  end
  local out = pool3d(x, k, s, d, sizes, function(t)
    return F.max_pool2d(t, { k[2], k[3] }, { s[2], s[3] }, 0, { d[2], d[3] })
  end, torch.maximum)
  return batched and out or out:squeeze(0)
end

-- max_unpool3d(input, indices, kernel_size [, stride=kernel_size,
-- padding=0, output_size]) or with {stride=, padding=, output_size=}:
-- max_pool3d's inverse (output_size: 3 or 5 numbers).
function F.max_unpool3d(input, indices, kernel_size, stride, padding, output_size)
  local fn = "max_unpool3d"
  stride, padding, output_size = unpool_args(stride, padding, output_size)
  local x, batched = volume_input(input, fn)
  want_tensor(indices, fn, "indices")
  return unpool(fn, x, batched, input, indices, triple(kernel_size, fn, "kernel_size"),
                triple(stride or kernel_size, fn, "stride"), triple(padding or 0, fn, "padding"), output_size)
end

-- avg_pool3d(input, kernel_size [, stride=kernel_size, padding=0,
-- ceil_mode=false, count_include_pad=true, divisor_override]) or with an
-- options table: each window's sum over the elements it counts, as
-- PyTorch (the padding counts with count_include_pad, what the ceil_mode
-- windows reach past it never).
function F.avg_pool3d(input, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)
  local fn = "avg_pool3d"
  stride, padding, ceil_mode, count_include_pad, divisor_override =
    avg_pool_args(fn, stride, padding, ceil_mode, count_include_pad, divisor_override)
  local x, batched = volume_input(input, fn)
  local k = triple(kernel_size, fn, "kernel_size")
  local s, p = triple(stride or kernel_size, fn, "stride"), triple(padding or 0, fn, "padding")
  local one = { 1, 1, 1 }
  local function window_sums(t, sizes)
    return pool3d(t, k, s, one, sizes, function(u)
      return F.avg_pool2d(u, { k[2], k[3] }, { s[2], s[3] }, 0, false, true, 1)
    end, function(a, b) return a + b end)
  end
  local xp, sizes = pool3d_window(x, fn, k, s, p, one, ceil_mode, 0, 0)
  local sums = window_sums(xp, sizes)
  local out
  if divisor_override ~= nil then
    out = sums / divisor_override
  else
    local ones = torch.ones(1, 1, x:size(2), x:size(3), x:size(4), { dtype = x.dtype, device = x.device })
    local counted = pool3d_window(ones, fn, k, s, p, one, ceil_mode, count_include_pad == false and 0 or 1, 0)
    out = sums / window_sums(counted, sizes)
  end
  return batched and out or out:squeeze(0)
end

-- adaptive_avg_pool3d / adaptive_max_pool3d(input, output_size): an int,
-- a triple, or nil entries keeping a size; each depth cell's mean (or
-- maximum) over depth, then the 2-D adaptive pool.
local function adaptive3d(fn, input, output_size, reduce_depth, pool2d)
  local x, batched = volume_input(input, fn)
  local D, H, W = x:size(2), x:size(3), x:size(4)
  local o
  if type(output_size) == "table" and #output_size <= 3 then
    o = { output_size[1] or D, output_size[2] or H, output_size[3] or W }
  else
    o = triple(output_size, fn, "output_size")
  end
  for a = 1, 3 do
    if o[a] < 1 or o[a] % 1 ~= 0 then raise(fn .. ": output_size must be positive integers") end
  end
  if o[1] > MAX_ADAPTIVE_CELLS then
    raise(string.format("%s: output depth %d is above %d, which this pool computes one at a time", fn, o[1],
                        MAX_ADAPTIVE_CELLS))
  end
  local cells = {}
  for i = 0, o[1] - 1 do
    local d0, dn = adaptive_cell(i, o[1], D)
    cells[i + 1] = pool2d(reduce_depth(x:narrow(2, d0, dn)), { o[2], o[3] })
  end
  local out = torch.stack(cells, 2)
  return batched and out or out:squeeze(0)
end
function F.adaptive_avg_pool3d(input, output_size)
  return adaptive3d("adaptive_avg_pool3d", input, output_size, function(t) return t:mean(2) end, F.adaptive_avg_pool2d)
end
function F.adaptive_max_pool3d(input, output_size, return_indices)
  if return_indices == true or (type(return_indices) == "table" and return_indices.return_indices) then
    raise("adaptive_max_pool3d: return_indices is not supported for 3-D pooling (adaptive_max_pool2d has it)")
  end
  return adaptive3d("adaptive_max_pool3d", input, output_size, function(t) return t:amax(2) end,
                    function(t, size) return F.adaptive_max_pool2d(t, size) end)
end

-- lp_pool2d(input, norm_type, kernel_size [, stride=kernel_size,
-- ceil_mode=false]) and lp_pool1d: (the sum of x^p over each window)^(1/p),
-- as PyTorch's (through avg_pool, a negative sum taken as 0).
local function lp_pool(fn, avg, window)
  return function(input, norm_type, kernel_size, stride, ceil_mode)
    if type(stride) == "table" and stride[1] == nil then stride, ceil_mode = stride.stride, stride.ceil_mode end
    want_float(input, fn, "input")
    local p = want_number(norm_type, fn, "norm_type")
    if p == nil or p == 0 then raise(fn .. ": expected a non-zero norm_type") end
    local out = avg(input:pow(p), kernel_size, stride, 0, ceil_mode)
    return (out:sign() * out:abs():relu() * window(kernel_size)):pow(1 / p)
  end
end
F.lp_pool2d = lp_pool("lp_pool2d", function(x, k, s, p, c) return F.avg_pool2d(x, k, s, p, c) end, function(k)
  local kk = pair(k, "lp_pool2d", "kernel_size")
  return kk[1] * kk[2]
end)
F.lp_pool1d = lp_pool("lp_pool1d", function(x, k, s, p, c) return F.avg_pool1d(x, k, s, p, c) end, function(k)
  return one(k, "lp_pool1d", "kernel_size")
end)

-- channel_shuffle(input, groups): (N, g * c, *) -> the channels of each
-- group interleaved, (N, c * g, *).
function F.channel_shuffle(input, groups)
  local fn = "channel_shuffle"
  want_tensor(input, fn, "input")
  if input:dim() < 3 then raise(fn .. ": expected an input of at least 3 dims (N, C, ...), got " .. shape_str(input)) end
  local C = input:size(1)
  if type(groups) ~= "number" or groups < 1 or C % groups ~= 0 then
    raise(string.format("%s: expected groups to divide the %d channels, got %s", fn, C, tostring(groups)))
  end
  local shape = input:size()
  local split = { shape[1], groups, C / groups }
  for d = 3, #shape do split[#split + 1] = shape[d] end
  return input:reshape(split):transpose(1, 2):reshape(shape)
end

-- pdist(input [, p=2]): the p-norm distances between each pair of rows
-- i < j of input (N, M), in that order, (N (N - 1) / 2).
function F.pdist(input, p)
  local fn = "pdist"
  want_float(input, fn, "input")
  if input:dim() ~= 2 then raise(fn .. ": expected a 2-D input (N, M), got " .. shape_str(input)) end
  local N = input:size(0)
  if N < 2 then return torch.zeros(0, { dtype = input.dtype, device = input.device }) end
  local pairs_ = torch.triu_indices(N, N, 1, { device = input.device })
  local a, b = input:index_select(0, pairs_[0]), input:index_select(0, pairs_[1])
  return (a - b):norm(p or 2, 1)
end

-- bilinear(input1, input2, weight [, bias]): y_k = input1 W_k input2 +
-- b_k, weight (out, in1, in2).
function F.bilinear(input1, input2, weight, bias)
  local fn = "bilinear"
  want_float(input1, fn, "input1")
  want_float(input2, fn, "input2")
  want_float(weight, fn, "weight")
  if weight:dim() ~= 3 or input1:size(-1) ~= weight:size(1) or input2:size(-1) ~= weight:size(2) then
    raise(string.format("%s: expected weight (out, %d, %d) for inputs %s and %s, got %s", fn, input1:size(-1),
                        input2:size(-1), shape_str(input1), shape_str(input2), shape_str(weight)))
  end
  local y = torch.einsum("...i,kij,...j->...k", input1, weight, input2)
  if bias ~= nil then y = y + bias end
  return y
end

---------------------------------------------------------------- affine_grid, grid_sample

-- affine_grid(theta, size [, align_corners=false]): the sampling grid
-- (N, H, W, 2) of the affine maps theta (N, 2, 3) over an output of size
-- {N, C, H, W}: normalized coordinates in [-1, 1] (pixel centres unless
-- align_corners, which puts -1 and 1 at the corner pixels), as PyTorch's.
local function normalized_steps(n, align_corners, opts)
  local t = torch.linspace(-1, 1, n, opts)
  if not align_corners then t = t * ((n - 1) / n) end
  return t
end

function F.affine_grid(theta, size, align_corners)
  local fn = "affine_grid"
  if type(align_corners) == "table" then align_corners = align_corners.align_corners end
  want_float(theta, fn, "theta")
  if type(size) ~= "table" or #size ~= 4 then raise(fn .. ": expected size to be {N, C, H, W}") end
  local N, H, W = size[1], size[3], size[4]
  if theta:dim() ~= 3 or theta:size(0) ~= N or theta:size(1) ~= 2 or theta:size(2) ~= 3 then
    raise(string.format("%s: expected theta of shape [%d, 2, 3] for size {%s}, got %s", fn, N,
                        table.concat(size, ", "), shape_str(theta)))
  end
  local o = { dtype = theta.dtype, device = theta.device }
  local xs = normalized_steps(W, align_corners, o):view(1, W):expand(H, W)
  local ys = normalized_steps(H, align_corners, o):view(H, 1):expand(H, W)
  local base = torch.stack({ xs, ys, torch.ones(H, W, o) }, 2):reshape(1, H * W, 3)
  return base:expand(N, H * W, 3):bmm(theta:transpose(1, 2)):view(N, H, W, 2)
end

-- A source coordinate of a normalized one (n the size along it), moved
-- into the input by padding_mode: "border" clamps, "reflection" reflects
-- at the edges (then clamps), "zeros" leaves it (out of range reads 0).
local function reflect(c, twice_low, twice_high)
  if twice_low == twice_high then return c * 0 end
  local low, span = twice_low / 2, (twice_high - twice_low) / 2
  local d = (c - low):abs()
  local flips = (d / span):floor():detach()
  local extra = d - flips * span
  return torch.where(flips:remainder(2):eq(0), extra + low, (extra * -1) + span + low)
end
local function source_coordinate(g, n, align_corners, padding_mode)
  local c
  if align_corners then c = (g + 1) * ((n - 1) / 2) else c = ((g + 1) * n - 1) / 2 end
  if padding_mode == "reflection" then
    if align_corners then c = reflect(c, 0, 2 * (n - 1)) else c = reflect(c, -1, 2 * n - 1) end
  end
  if padding_mode ~= "zeros" then c = c:clamp(0, n - 1) end
  return c
end

-- grid_sample(input, grid [, {mode="bilinear", padding_mode="zeros",
-- align_corners=false}]): input (N, C, H, W) read at grid (N, Ho, Wo, 2)'s
-- normalized (x, y) points: "bilinear" weighs the four pixels around each,
-- "nearest" takes the nearest (ties to even); padding_mode "zeros",
-- "border" or "reflection". Gradients reach the input and the grid.
function F.grid_sample(input, grid, mode, padding_mode, align_corners)
  local fn = "grid_sample"
  if type(mode) == "table" then mode, padding_mode, align_corners = mode.mode, mode.padding_mode, mode.align_corners end
  mode, padding_mode = mode or "bilinear", padding_mode or "zeros"
  if mode ~= "bilinear" and mode ~= "nearest" then raise(fn .. ': mode must be "bilinear" or "nearest", got ' .. tostring(mode)) end
  if padding_mode ~= "zeros" and padding_mode ~= "border" and padding_mode ~= "reflection" then
    raise(fn .. ': padding_mode must be "zeros", "border" or "reflection", got ' .. tostring(padding_mode))
  end
  want_float(input, fn, "input")
  want_float(grid, fn, "grid")
  if input:dim() ~= 4 or grid:dim() ~= 4 or grid:size(3) ~= 2 or grid:size(0) ~= input:size(0) then
    raise(string.format("%s: expected input (N, C, H, W) and grid (N, Ho, Wo, 2), got %s and %s", fn, shape_str(input),
                        shape_str(grid)))
  end
  local N, C, H, W = input:size(0), input:size(1), input:size(2), input:size(3)
  local Ho, Wo = grid:size(1), grid:size(2)
  local x = source_coordinate(grid:select(3, 0), W, align_corners, padding_mode)      -- (N, Ho, Wo)
  local y = source_coordinate(grid:select(3, 1), H, align_corners, padding_mode)
  local flat = input:reshape(N, C, H * W)
  -- input's values at integer points (xi, yi), 0 outside, times weight w
  local function corner(xi, yi, w)
    local inside = xi:ge(0):logical_and(xi:le(W - 1)):logical_and(yi:ge(0)):logical_and(yi:le(H - 1))
    local at = (yi:clamp(0, H - 1) * W + xi:clamp(0, W - 1)):to(torch.int64):reshape(N, 1, Ho * Wo)
    local v = flat:gather(2, at:expand(N, C, Ho * Wo))
    return v * (w * inside:to(w.dtype)):reshape(N, 1, Ho * Wo)
  end
  local out
  if mode == "nearest" then
    local one = x * 0 + 1   -- (the grid's gradient is zeros, as PyTorch's, not missing)
    out = corner(x:round():detach(), y:round():detach(), one)
  else
    local x0, y0 = x:floor():detach(), y:floor():detach()
    local x1, y1 = x0 + 1, y0 + 1
    local wx1, wy1 = x - x0, y - y0
    local wx0, wy0 = (wx1 * -1) + 1, (wy1 * -1) + 1
    out = corner(x0, y0, wx0 * wy0) + corner(x1, y0, wx1 * wy0) + corner(x0, y1, wx0 * wy1) + corner(x1, y1, wx1 * wy1)
  end
  return out:view(N, C, Ho, Wo)
end

---------------------------------------------------------------- unfold, fold, pixel shuffle

-- unfold(input, kernel_size [, dilation=1, padding=0, stride=1]) or with
-- {dilation=, padding=, stride=}: PyTorch's argument order; each block of
-- (N, C, H, W) as a column, (N, C kh kw, L) (unbatched (C, H, W) too).
local function unfold_args(fn, dilation, padding, stride)
  if type(dilation) == "table" and dilation[1] == nil then
    local o = dilation
    dilation, padding, stride = o.dilation, o.padding, o.stride
  end
  return pair(dilation or 1, fn, "dilation"), pair(padding or 0, fn, "padding"), pair(stride or 1, fn, "stride")
end

function F.unfold(input, kernel_size, dilation, padding, stride)
  local fn = "unfold"
  local x, batched = pool_input(input, fn)
  local k = pair(kernel_size, fn, "kernel_size")
  local d, p, s = unfold_args(fn, dilation, padding, stride)
  if out_size(x:size(2), k[1], s[1], p[1], d[1]) < 1 or out_size(x:size(3), k[2], s[2], p[2], d[2]) < 1 then
    raise(string.format("%s: input of size %s is too small for kernel (%d, %d)", fn, shape_str(x), k[1], k[2]))
  end
  local cols = torch._unfold(x, k, s, p, d, 0)
  return batched and cols or cols:squeeze(0)
end

-- fold(input, output_size, kernel_size [, dilation=1, padding=0,
-- stride=1]) or with an options table: unfold's adjoint, the columns
-- (N, C kh kw, L) summed back into (N, C, H, W) -- a scatter_add to the
-- positions an unfold of the positions gives (its padding to a slot past
-- the end, dropped).
function F.fold(input, output_size, kernel_size, dilation, padding, stride)
  local fn = "fold"
  want_float(input, fn, "input")
  local batched = input:dim() == 3
  if not batched and input:dim() ~= 2 then
    raise(fn .. ": expected 2-D (C kh kw, L) or 3-D (N, C kh kw, L) input, got input of shape " .. shape_str(input))
  end
  local cols = batched and input or input:unsqueeze(0)
  local o, k = pair(output_size, fn, "output_size"), pair(kernel_size, fn, "kernel_size")
  local d, p, s = unfold_args(fn, dilation, padding, stride)
  local K = k[1] * k[2]
  local L = out_size(o[1], k[1], s[1], p[1], d[1]) * out_size(o[2], k[2], s[2], p[2], d[2])
  local N, CK = cols:size(0), cols:size(1)
  if CK % K ~= 0 or cols:size(2) ~= L then
    raise(string.format("%s: expected input of shape (N, C * %d, %d) for kernel (%d, %d) over (%d, %d), got %s", fn, K,
                        L, k[1], k[2], o[1], o[2], shape_str(input)))
  end
  local C, HW = CK / K, o[1] * o[2]
  local plane = torch.arange(0, HW, { dtype = torch.float64 }):view(1, 1, o[1], o[2])
  local at = torch._unfold(plane, k, s, p, d, HW):to(torch.int64):to(cols.device):view(1, 1, K * L):expand(N, C, K * L)
  local out = torch.zeros(N, C, HW + 1, { dtype = cols.dtype, device = cols.device })
                   :scatter_add(2, at, cols:reshape(N, C, K * L))
  out = out:narrow(2, 0, HW):view(N, C, o[1], o[2])
  return batched and out or out:squeeze(0)
end

-- pixel_shuffle(input, r): (*, C r^2, H, W) -> (*, C, H r, W r);
-- pixel_unshuffle(input, r) the inverse.
local function want_factor(fn, r)
  if type(r) ~= "number" or r < 1 or r % 1 ~= 0 then
    raise(string.format("%s: expected the factor to be a positive integer, got %s", fn, tostring(r)))
  end
  return r
end

function F.pixel_shuffle(input, upscale_factor)
  local fn = "pixel_shuffle"
  want_tensor(input, fn, "input")
  local r = want_factor(fn, upscale_factor)
  local nd = input:dim()
  if nd < 3 or input:size(-3) % (r * r) ~= 0 then
    raise(string.format("%s: expected an input of at least 3 dims whose channels (dim -3) divide by %d, got %s", fn,
                        r * r, shape_str(input)))
  end
  local lead = { unpack(input:size(), 1, nd - 3) }
  local C, H, W = input:size(-3) / (r * r), input:size(-2), input:size(-1)
  local m = #lead
  local split = { unpack(lead) }
  for _, v in ipairs({ C, r, r, H, W }) do split[#split + 1] = v end
  local perm = {}
  for i = 0, m - 1 do perm[#perm + 1] = i end
  for _, v in ipairs({ m, m + 3, m + 1, m + 4, m + 2 }) do perm[#perm + 1] = v end
  local out = { unpack(lead) }
  for _, v in ipairs({ C, H * r, W * r }) do out[#out + 1] = v end
  return input:reshape(split):permute(perm):reshape(out)
end

function F.pixel_unshuffle(input, downscale_factor)
  local fn = "pixel_unshuffle"
  want_tensor(input, fn, "input")
  local r = want_factor(fn, downscale_factor)
  local nd = input:dim()
  if nd < 3 or input:size(-2) % r ~= 0 or input:size(-1) % r ~= 0 then
    raise(string.format("%s: expected an input of at least 3 dims whose height and width divide by %d, got %s", fn, r,
                        shape_str(input)))
  end
  local lead = { unpack(input:size(), 1, nd - 3) }
  local C, H, W = input:size(-3), input:size(-2) / r, input:size(-1) / r
  local m = #lead
  local split = { unpack(lead) }
  for _, v in ipairs({ C, H, r, W, r }) do split[#split + 1] = v end
  local perm = {}
  for i = 0, m - 1 do perm[#perm + 1] = i end
  for _, v in ipairs({ m, m + 2, m + 4, m + 1, m + 3 }) do perm[#perm + 1] = v end
  local out = { unpack(lead) }
  for _, v in ipairs({ C * r * r, H, W }) do out[#out + 1] = v end
  return input:reshape(split):permute(perm):reshape(out)
end

---------------------------------------------------------------- 1-D pooling

-- The 1-D poolings are the 2-D ones over a height of one; an index's row
-- is then 0, so max_pool1d's indices are the 2-D ones.
local function squeezed(out, indices)
  if indices ~= nil then return out:squeeze(-2), indices:squeeze(-2) end
  return out:squeeze(-2)
end

-- max_pool1d(input, kernel_size [, stride=kernel_size, padding=0,
-- dilation=1, ceil_mode=false, return_indices=false]) or with an options
-- table after kernel_size: input (N, C, L) or (C, L).
function F.max_pool1d(input, kernel_size, stride, padding, dilation, ceil_mode, return_indices)
  local fn = "max_pool1d"
  stride, padding, dilation, ceil_mode, return_indices =
    max_pool_args(stride, padding, dilation, ceil_mode, return_indices)
  local k = one(kernel_size, fn, "kernel_size")
  return squeezed(F.max_pool2d(as_2d(input, fn), { 1, k }, { 1, one(stride, fn, "stride", k) },
                               { 0, one(padding, fn, "padding", 0) }, { 1, one(dilation, fn, "dilation", 1) }, ceil_mode,
                               return_indices))
end

-- avg_pool1d(input, kernel_size [, stride=kernel_size, padding=0,
-- ceil_mode=false, count_include_pad=true]) or with an options table.
function F.avg_pool1d(input, kernel_size, stride, padding, ceil_mode, count_include_pad)
  local fn = "avg_pool1d"
  stride, padding, ceil_mode, count_include_pad = avg_pool_args(fn, stride, padding, ceil_mode, count_include_pad)
  local k = one(kernel_size, fn, "kernel_size")
  return squeezed(F.avg_pool2d(as_2d(input, fn), { 1, k }, { 1, one(stride, fn, "stride", k) },
                               { 0, one(padding, fn, "padding", 0) }, ceil_mode, count_include_pad))
end

-- adaptive_avg_pool1d(input, output_size), adaptive_max_pool1d(input,
-- output_size [, return_indices=false]).
function F.adaptive_avg_pool1d(input, output_size)
  local fn = "adaptive_avg_pool1d"
  return squeezed(F.adaptive_avg_pool2d(as_2d(input, fn), { 1, one(output_size, fn, "output_size") }))
end
function F.adaptive_max_pool1d(input, output_size, return_indices)
  local fn = "adaptive_max_pool1d"
  if type(return_indices) == "table" then return_indices = return_indices.return_indices end
  return squeezed(F.adaptive_max_pool2d(as_2d(input, fn), { 1, one(output_size, fn, "output_size") }, return_indices))
end

-- max_unpool1d(input, indices, kernel_size [, stride, padding, output_size])
-- or with an options table: output_size one number (or the last of 1 or 3).
function F.max_unpool1d(input, indices, kernel_size, stride, padding, output_size)
  local fn = "max_unpool1d"
  stride, padding, output_size = unpool_args(stride, padding, output_size)
  local k = one(kernel_size, fn, "kernel_size")
  want_tensor(indices, fn, "indices")
  if output_size ~= nil then
    if type(output_size) == "number" then output_size = { output_size } end
    if type(output_size) ~= "table" or (#output_size ~= 1 and #output_size ~= 3) then
      raise(fn .. ": expected output_size to be a number or a list of 1 or 3 numbers")
    end
    output_size = { 1, output_size[#output_size] }
  end
  return squeezed(F.max_unpool2d(as_2d(input, fn), indices:unsqueeze(-2), { 1, k }, { 1, one(stride, fn, "stride", k) },
                                 { 0, one(padding, fn, "padding", 0) }, output_size))
end

---------------------------------------------------------------- attention

-- scaled_dot_product_attention(query, key, value [, {attn_mask=, dropout_p=0,
-- is_causal=false, scale=1/sqrt(E)}]): softmax(q @ k^T * scale + mask) @ v
-- over query (..., L, E), key (..., S, E) and value (..., S, Ev), as
-- PyTorch's. is_causal masks key j out of query i's row when j > i
-- (tril(ones(L, S))); attn_mask is a bool mask (true: takes part) or a float
-- mask added to the scores, broadcastable to (..., L, S). Without a mask or
-- dropout it is one fused op that never holds the (L, S) weights (flash
-- attention on a GPU); with them, the same math as tensor ops. enable_gqa
-- (grouped-query attention, PyTorch 2.5's): key and value have fewer heads
-- (dim -3) than query, a divisor of its count; each is repeated for its
-- group of query heads (repeat_interleave).
local sdpa_opts = { attn_mask = true, dropout_p = true, is_causal = true, scale = true, enable_gqa = true }
function F.scaled_dot_product_attention(q, k, v, opts)
  local fn = "scaled_dot_product_attention"
  want_float(q, fn, "query")
  want_float(k, fn, "key")
  want_float(v, fn, "value")
  opts = torch._options(opts, fn)
  if type(opts) ~= "table" then raise(fn .. ": expected an options table, got " .. typename(opts)) end
  for key in pairs(opts) do
    if not sdpa_opts[key] then
      raise(string.format("%s: unknown option '%s' (attn_mask, dropout_p, is_causal, scale, enable_gqa)", fn, tostring(key)))
    end
  end
  local mask, p, causal = opts.attn_mask, opts.dropout_p or 0, opts.is_causal or false
  if type(p) ~= "number" or p < 0 or p > 1 then raise(fn .. ": expected dropout_p in [0, 1], got " .. tostring(p)) end
  if type(causal) ~= "boolean" then raise(fn .. ": expected is_causal to be a boolean, got " .. typename(causal)) end
  if mask ~= nil then
    want_tensor(mask, fn, "attn_mask")
    if causal then raise(fn .. ": is_causal and attn_mask cannot both be given (put the causal mask into attn_mask)") end
  end
  if q:dim() < 2 or k:dim() ~= q:dim() or v:dim() ~= q:dim() then
    raise(string.format("%s: expected query, key and value of the same number of dims (at least 2), got %s, %s and %s",
                        fn, shape_str(q), shape_str(k), shape_str(v)))
  end
  if opts.enable_gqa and q:dim() >= 3 and k:size(-3) ~= q:size(-3) then
    local hq, hk, hv = q:size(-3), k:size(-3), v:size(-3)
    if hk ~= hv or hk == 0 or hq % hk ~= 0 then
      raise(string.format("%s: enable_gqa: the query's %d heads must be a multiple of the key's and value's (%d, %d)",
                          fn, hq, hk, hv))
    end
    k, v = k:repeat_interleave(hq / hk, -3), v:repeat_interleave(hq / hk, -3)
  end
  local E = q:size(-1)
  local scale = opts.scale or 1 / math.sqrt(E)
  if type(scale) ~= "number" then raise(fn .. ": expected scale to be a number, got " .. typename(scale)) end
  if autocast_on then q, k, v = AC.cast_inputs(q, k, v) end
  -- (the flash backward on a GPU adds dq atomically: deterministic mode
  -- takes the math path there)
  local deterministic = q.is_cuda and torch.are_deterministic_algorithms_enabled()
  if mask == nil and p == 0 and torch.backends.cuda.flash_sdp_enabled() and not deterministic
     and torch._attention_fused(q, k, v) then
    return torch._scaled_dot_product_attention(q, k, v, causal, scale)
  end
  -- the composite: PyTorch's reference math
  local L, S = q:size(-2), k:size(-2)
  if k:size(-1) ~= E or v:size(-2) ~= S then
    raise(string.format("%s: expected query (..., L, E), key (..., S, E) and value (..., S, Ev), got %s, %s and %s",
                        fn, shape_str(q), shape_str(k), shape_str(v)))
  end
  local scores = q:matmul(k:transpose(-2, -1)) * scale
  if causal then
    scores = scores:masked_fill(torch.ones(L, S, { dtype = torch.bool, device = q.device }):tril():logical_not(), -math.huge)
  end
  if mask ~= nil then
    if mask.dtype == torch.bool then
      scores = scores:masked_fill(mask:logical_not(), -math.huge)
    else
      scores = scores + mask
    end
  end
  local weights = scores:softmax(-1)
  if p > 0 then weights = F.dropout(weights, p, true) end
  return weights:matmul(v)
end

---------------------------------------------------------------- normalization and embedding

-- The floating dtype of a result over dtypes a and b, as PyTorch promotes
-- them (a number-free pair: float64 over float32 over bfloat16).
local function wider(a, b)
  if a == torch.float64 or b == torch.float64 then return torch.float64 end
  if a == torch.float32 or b == torch.float32 then return torch.float32 end
  return a
end

local function want_norm_param(p, what, normalized_shape, fn)
  if p == nil then return end
  want_tensor(p, fn, what)
  local s = p:size()
  local ok = #s == #normalized_shape
  for i = 1, #s do ok = ok and s[i] == normalized_shape[i] end
  if not ok then
    raise(string.format("%s: expected %s of shape [%s] (normalized_shape), got %s", fn, what,
                        table.concat(normalized_shape, ", "), shape_str(p)))
  end
end

-- The dtypes the fused LayerNorm runs in: input, weight and bias cast
-- where they must be, and the output's dtype. Under autocast it runs in
-- float32 (PyTorch's list), reading a bfloat16 input as it is; weight and
-- bias promote as in the composite, and take the output's dtype.
local function norm_dtypes(input, weight, bias)
  local out_dtype = input.dtype
  if autocast_on then
    weight, bias = AC.cast_fp32(weight, bias)
    if AC.casts_fp32(input) then out_dtype = torch.float32 end
  end
  if weight ~= nil then out_dtype = wider(out_dtype, weight.dtype) end
  if bias ~= nil then out_dtype = wider(out_dtype, bias.dtype) end
  if input.dtype ~= out_dtype and not (input.dtype == torch.bfloat16 and out_dtype == torch.float32) then
    input = input:to(out_dtype)
  end
  if weight ~= nil and weight.dtype ~= out_dtype then weight = weight:to(out_dtype) end
  if bias ~= nil and bias.dtype ~= out_dtype then bias = bias:to(out_dtype) end
  return input, weight, bias, out_dtype
end

local function want_eps(eps, fn)
  if eps == nil then return 1e-5 end
  if type(eps) ~= "number" then raise(fn .. ": expected eps to be a number, got " .. typename(eps)) end
  return eps
end

-- layer_norm(input, normalized_shape [, weight, bias, eps=1e-5]): over the
-- last dims, with the biased variance; one fused op with its own backward
-- (NativeLayerNormBackward0). Without weight and bias it is not affine.
function F.layer_norm(input, normalized_shape, weight, bias, eps)
  local fn = "layer_norm"
  if type(weight) == "table" and not is_tensor(weight) then
    local o = weight
    weight, bias, eps = o.weight, o.bias, o.eps
  end
  want_float(input, fn, "input")
  if type(normalized_shape) == "number" then normalized_shape = { normalized_shape } end
  if type(normalized_shape) ~= "table" or #normalized_shape == 0 then
    raise(fn .. ": expected normalized_shape to be an integer or a non-empty table of integers")
  end
  local shape, k = input:size(), #normalized_shape
  local ok = #shape >= k
  for i = 1, k do ok = ok and shape[#shape - k + i] == normalized_shape[i] end
  if not ok then
    raise(string.format("%s: Given normalized_shape=[%s], expected input with shape [*, %s], but got input of size%s",
                        fn, table.concat(normalized_shape, ", "), table.concat(normalized_shape, ", "), shape_str(input)))
  end
  local n = 1
  for i = 1, k do n = n * normalized_shape[i] end
  if n == 0 then raise(string.format("%s: expected normalized_shape of at least one element, got [%s]", fn,
                                     table.concat(normalized_shape, ", "))) end
  eps = want_eps(eps, fn)
  want_norm_param(weight, "weight", normalized_shape, fn)
  want_norm_param(bias, "bias", normalized_shape, fn)
  local out_dtype
  input, weight, bias, out_dtype = norm_dtypes(input, weight, bias)
  return torch._native_layer_norm(input, weight, bias, n, eps, out_dtype)
end

-- torch._add_layer_norm(x, residual, weight, bias [, eps=1e-5]): h = x +
-- residual and layer_norm(h) over h's last dim (weight and bias of its
-- size, either may be nil), returned as h, layer_norm(h): a GPT block's
-- residual add and the next LayerNorm in one pass (one kernel on a GPU).
-- A residual that only broadcasts to x takes the two ops. The sum has the
-- wider dtype, a bfloat16 operand read as it is beside a float32 one.
-- Under bfloat16 autocast the normalized output is bfloat16: it feeds
-- products, which would cast it there, and their gradient comes back in
-- bfloat16; the values are those of a float32 output cast (the same
-- rounding), without the two casts.
function torch._add_layer_norm(x, residual, weight, bias, eps)
  local fn = "add_layer_norm"
  want_float(x, fn, "input")
  want_float(residual, fn, "residual")
  if x:dim() == 0 then raise(fn .. ": expected an input of at least 1 dim, got a 0-d tensor") end
  local normalized_shape = { x:size(-1) }
  eps = want_eps(eps, fn)
  local same = x:dim() == residual:dim()
  for i = 0, x:dim() - 1 do same = same and x:size(i) == residual:size(i) end
  if not same then
    local h = x + residual
    return h, F.layer_norm(h, { h:size(-1) }, weight, bias, eps)
  end
  want_norm_param(weight, "weight", normalized_shape, fn)
  want_norm_param(bias, "bias", normalized_shape, fn)
  if x.dtype == torch.bfloat16 and residual.dtype == torch.float32 then x, residual = residual, x end
  local dt = wider(x.dtype, residual.dtype)
  if x.dtype ~= dt then x = x:to(dt) end
  if residual.dtype ~= dt and not (dt == torch.float32 and residual.dtype == torch.bfloat16) then
    residual = residual:to(dt)
  end
  local sum_input, out_dtype = x, nil
  x, weight, bias, out_dtype = norm_dtypes(x, weight, bias)
  if not rawequal(x, sum_input) then
    -- a weight wider than the sum: the sum keeps its dtype, as with two ops
    local h = sum_input + residual
    return h, F.layer_norm(h, normalized_shape, weight, bias, eps)
  end
  if autocast_on and out_dtype == torch.float32 and AC.lowers_to(x) == torch.bfloat16 then
    out_dtype = torch.bfloat16
  end
  return torch._native_add_layer_norm(x, residual, weight, bias, normalized_shape[1], eps, out_dtype)
end

-- group_norm(input, num_groups [, weight, bias, eps = 1e-5]): PyTorch's
-- F.group_norm over input (N, C, ...): each sample's channels in
-- num_groups groups, each group normalized by its mean and biased
-- variance, then the per-channel weight and bias. The statistics are
-- LayerNorm's over the group's elements (one fused op and its backward).
function F.group_norm(input, num_groups, weight, bias, eps)
  local fn = "group_norm"
  want_tensor(input, fn, "input")
  if input:dim() < 2 then
    raise(fn .. ": expected an input of at least 2 dims (N, C, ...), got shape " .. shape_str(input))
  end
  if type(num_groups) ~= "number" or num_groups < 1 or num_groups % 1 ~= 0 then
    raise(fn .. ": expected num_groups to be a positive integer, got " .. tostring(num_groups))
  end
  local shape = input:size()
  local N, C = shape[1], shape[2]
  if C % num_groups ~= 0 then
    raise(string.format("%s: Expected number of channels in input to be divisible by num_groups, but got input of shape %s and num_groups=%d",
                        fn, shape_str(input), num_groups))
  end
  for _, p in ipairs({ { weight, "weight" }, { bias, "bias" } }) do
    if p[1] ~= nil then
      want_tensor(p[1], fn, p[2])
      if p[1]:dim() ~= 1 or p[1]:size(0) ~= C then
        raise(string.format("%s: expected %s of shape [%d] (one per channel), got %s", fn, p[2], C, shape_str(p[1])))
      end
    end
  end
  local per_group = C / num_groups
  for i = 3, #shape do per_group = per_group * shape[i] end
  if N * per_group == 0 then return input * 1 end
  local y = F.layer_norm(input:reshape(N, num_groups, per_group), per_group, nil, nil, eps):reshape(shape)
  local cshape = { 1, C }
  for i = 3, #shape do cshape[i] = 1 end
  if weight ~= nil then y = y * weight:view(cshape) end
  if bias ~= nil then y = y + bias:view(cshape) end
  return y
end

-- rms_norm(input, normalized_shape [, weight, eps]) (or {weight=, eps=}):
-- input divided by the root mean square of its last dims (those of
-- normalized_shape), plus eps (the dtype's machine epsilon by default, as
-- PyTorch's), times weight.
function F.rms_norm(input, normalized_shape, weight, eps)
  local fn = "rms_norm"
  if type(weight) == "table" and not is_tensor(weight) then weight, eps = weight.weight, weight.eps end
  want_float(input, fn, "input")
  if type(normalized_shape) == "number" then normalized_shape = { normalized_shape } end
  if type(normalized_shape) ~= "table" or is_tensor(normalized_shape) then
    raise(fn .. ": expected normalized_shape to be an integer or a list of them, got " .. typename(normalized_shape))
  end
  local n, dims = #normalized_shape, {}
  if n > input:dim() then
    raise(string.format("%s: normalized_shape has %d dims, the input only %d", fn, n, input:dim()))
  end
  for i = 1, n do
    local v = normalized_shape[i]
    if type(v) ~= "number" or v % 1 ~= 0 or v < 0 then
      raise(string.format("%s: expected normalized_shape's sizes to be integers, got %s", fn, tostring(v)))
    end
    if input:size(-n - 1 + i) ~= v then
      raise(string.format("%s: expected input with shape [*, %s], got %s", fn, table.concat(normalized_shape, ", "),
                          shape_str(input)))
    end
    dims[i] = input:dim() - n + i - 1
  end
  if eps == nil then eps = input.dtype == torch.float64 and 2.220446049250313e-16 or 1.1920928955078125e-07 end
  local y = input * ((input * input):mean(dims, true) + eps):rsqrt()
  if weight ~= nil then y = y * weight end
  return y
end

-- instance_norm(input [, {running_mean=, running_var=, weight=, bias=,
-- use_input_stats=true, momentum=0.1, eps=1e-5}]): each sample's channel
-- normalized over its own elements (group_norm with a group a channel);
-- running statistics, when given, take the mean over the batch of the
-- instances' (unbiased) ones, and stand in for them without
-- use_input_stats.
function F.instance_norm(input, opts)
  local fn = "instance_norm"
  want_float(input, fn, "input")
  opts = torch._options(opts, fn)
  if input:dim() < 3 then raise(fn .. ": expected an input of at least 3 dims (N, C, ...), got " .. shape_str(input)) end
  local N, C = input:size(0), input:size(1)
  local eps, rm, rv = opts.eps or 1e-5, opts.running_mean, opts.running_var
  local cshape = { 1, C }
  for d = 3, input:dim() do cshape[d] = 1 end
  local y
  if opts.use_input_stats == false then
    if rm == nil or rv == nil then raise(fn .. ": expected running_mean and running_var when use_input_stats is false") end
    y = (input - rm:view(cshape)) * (rv:view(cshape) + eps):rsqrt()
  else
    y = F.group_norm(input, C, nil, nil, eps)
    if rm ~= nil and rv ~= nil then
      torch.no_grad(function()
        local m = opts.momentum or 0.1
        local flat = input:detach():reshape(N, C, -1)
        local count = flat:size(2)
        rm:mul_(1 - m):add_(flat:mean(2):mean(0) * m)
        rv:mul_(1 - m):add_(flat:var(2, { correction = count > 1 and 1 or 0 }):mean(0) * m)
      end)
    end
  end
  if opts.weight ~= nil then y = y * opts.weight:view(cshape) end
  if opts.bias ~= nil then y = y + opts.bias:view(cshape) end
  return y
end

-- local_response_norm(input, size [, alpha=1e-4, beta=0.75, k=1]) (or
-- {alpha=, beta=, k=}): each value divided by (k + alpha * the mean of the
-- squares of the size channels around it)^beta, as PyTorch.
function F.local_response_norm(input, size, alpha, beta, k)
  local fn = "local_response_norm"
  if type(alpha) == "table" then alpha, beta, k = alpha.alpha, alpha.beta, alpha.k end
  want_float(input, fn, "input")
  if input:dim() < 3 then raise(fn .. ": expected an input of at least 3 dims (N, C, ...), got " .. shape_str(input)) end
  alpha, beta, k = alpha or 1e-4, beta or 0.75, k or 1
  if type(size) ~= "number" or size % 1 ~= 0 or size < 1 then
    raise(fn .. ": expected size to be a positive integer, got " .. tostring(size))
  end
  local front, back = math.floor(size / 2), math.floor((size - 1) / 2)
  local N, C = input:size(0), input:size(1)
  local sq = (input * input):reshape(N, 1, C, -1, 1)
  local div = F.pad(sq, { 0, 0, 0, 0, front, back })
  div = F.avg_pool3d(div, { size, 1, 1 }, 1):reshape(input:size())
  return input / (div * alpha + k):pow(beta)
end

-- normalize(input [, p = 2, dim = 1, eps = 1e-12]) or normalize(input,
-- {p =, dim =, eps =}): input divided by its p-norm along dim, at least eps.
function F.normalize(input, p, dim, eps)
  if type(p) == "table" then p, dim, eps = p.p, p.dim, p.eps end
  want_tensor(input, "normalize", "input")
  return input / input:norm(p or 2, dim or 1, true):clamp(eps or 1e-12)
end

-- cosine_similarity(x1, x2 [, dim = 1, eps = 1e-8]) or with {dim =, eps =}:
-- sum(x1 * x2) / max(|x1| |x2|, eps) along dim (x1 and x2 broadcast), as
-- PyTorch's documentation gives it.
function F.cosine_similarity(x1, x2, dim, eps)
  if type(dim) == "table" then dim, eps = dim.dim, dim.eps end
  want_tensor(x1, "cosine_similarity", "x1")
  want_tensor(x2, "cosine_similarity", "x2")
  dim = dim or 1
  local n = (x1:norm(2, dim) * x2:norm(2, dim)):clamp(eps or 1e-8)
  return (x1 * x2):sum(dim) / n
end

-- pairwise_distance(x1, x2 [, p = 2, eps = 1e-6, keepdim = false]) or with
-- {p =, eps =, keepdim =}: the p-norm of x1 - x2 + eps over the last dim.
function F.pairwise_distance(x1, x2, p, eps, keepdim)
  if type(p) == "table" then p, eps, keepdim = p.p, p.eps, p.keepdim end
  want_tensor(x1, "pairwise_distance", "x1")
  want_tensor(x2, "pairwise_distance", "x2")
  return (x1 - x2 + (eps or 1e-6)):norm(p or 2, -1, keepdim == true)
end

-- interpolate(input, {size =, scale_factor =, mode = "nearest",
-- align_corners =}) or interpolate(input, size, scale_factor, mode,
-- align_corners): PyTorch's F.interpolate of an (N, C, H, W) input, modes
-- "nearest" and "bilinear" (align_corners false by default, as
-- PyTorch's). With scale_factor the source positions use 1/scale_factor,
-- as PyTorch does, not the ratio of the sizes. Bilinear interpolates rows,
-- then columns (index_select and products: every device, and their
-- backwards give the gradient).

-- Along one dim of n going to m: the source indices (int64, on device) and,
-- for "bilinear", the next ones and the weights of those.
local function interp_taps(n, m, scale_factor, mode, align_corners, device, dtype)
  local scale = scale_factor and 1 / scale_factor or n / m
  local i0, i1, lam = {}, {}, {}
  for j = 0, m - 1 do
    if mode == "nearest" then
      i0[j + 1] = math.min(math.floor(j * scale), n - 1)
    else
      local src
      if align_corners then src = m > 1 and j * (n - 1) / (m - 1) or 0
      else src = math.max((j + 0.5) * scale - 0.5, 0) end
      local lo = math.min(math.floor(src), n - 1)
      i0[j + 1], i1[j + 1], lam[j + 1] = lo, math.min(lo + 1, n - 1), src - lo
    end
  end
  local opts = { dtype = torch.int64, device = device }
  if mode == "nearest" then return torch.tensor(i0, opts) end
  return torch.tensor(i0, opts), torch.tensor(i1, opts), torch.tensor(lam, { dtype = dtype, device = device })
end

function F.interpolate(input, size, scale_factor, mode, align_corners)
  local fn = "interpolate"
  if type(size) == "table" and size[1] == nil then
    local o = size
    size, scale_factor, mode, align_corners = o.size, o.scale_factor, o.mode, o.align_corners
  end
  want_tensor(input, fn, "input")
  mode = mode or "nearest"
  if mode ~= "nearest" and mode ~= "bilinear" then
    raise(string.format("%s: mode %s is not supported (nearest and bilinear are)", fn, tostring(mode)))
  end
  if input:dim() ~= 4 then
    raise(fn .. ": expected a 4-D input (N, C, H, W), got shape " .. shape_str(input))
  end
  if mode == "nearest" and align_corners ~= nil then
    raise(fn .. ": align_corners option can only be set with the interpolating modes: linear | bilinear | bicubic | trilinear")
  end
  if (size == nil) == (scale_factor == nil) then raise(fn .. ": only one of size or scale_factor should be defined") end
  local H, W = input:size(2), input:size(3)
  local out, sf = {}, {}
  for d = 1, 2 do
    local n = d == 1 and H or W
    if size ~= nil then
      out[d] = type(size) == "table" and size[d] or size
    else
      sf[d] = type(scale_factor) == "table" and scale_factor[d] or scale_factor
      if type(sf[d]) ~= "number" or sf[d] <= 0 then raise(fn .. ": expected positive scale factors") end
      out[d] = math.floor(n * sf[d])
    end
    if type(out[d]) ~= "number" or out[d] < 1 or out[d] % 1 ~= 0 then
      raise(string.format("%s: expected output sizes that are positive integers, got %s", fn, tostring(out[d])))
    end
  end
  local x = input
  for d = 1, 2 do
    local dim, n = d + 1, d == 1 and H or W
    if mode == "nearest" then
      x = x:index_select(dim, interp_taps(n, out[d], sf[d], mode, nil, x.device))
    else
      local i0, i1, lam = interp_taps(n, out[d], sf[d], mode, align_corners, x.device, x.dtype)
      local shape = { 1, 1, 1, 1 }
      shape[dim + 1] = out[d]
      lam = lam:view(shape)
      x = x:index_select(dim, i0) * (1 - lam) + x:index_select(dim, i1) * lam
    end
  end
  return x
end

local function want_tensor_or_nil(t, fn, what)
  if t ~= nil and not is_tensor(t) then
    raise(string.format("%s: expected %s to be a tensor or nil, got %s", fn, what, typename(t)))
  end
end

-- batch_norm(input, running_mean, running_var [, weight, bias, training=false,
-- momentum=0.1, eps=1e-5]) or with an options table after running_var:
-- over every dim but dim 1 (the channels). Training (or without running
-- statistics) normalizes by the batch's mean and biased variance, and
-- moves the running mean and the running unbiased variance by momentum;
-- otherwise by the running ones. One fused op with its own backward
-- (NativeBatchNormBackward0). Parameters and running statistics share a
-- dtype: the input's, or float32 for a bfloat16 input (the output is then
-- bfloat16, as PyTorch's under autocast).
function F.batch_norm(input, running_mean, running_var, weight, bias, training, momentum, eps)
  local fn = "batch_norm"
  if type(weight) == "table" and not is_tensor(weight) then
    local o = weight
    weight, bias, training, momentum, eps = o.weight, o.bias, o.training, o.momentum, o.eps
  end
  want_float(input, fn, "input")
  want_tensor_or_nil(running_mean, fn, "running_mean")
  want_tensor_or_nil(running_var, fn, "running_var")
  want_tensor_or_nil(weight, fn, "weight")
  want_tensor_or_nil(bias, fn, "bias")
  eps = want_eps(eps, fn)
  if momentum == nil then momentum = 0.1 end
  if type(momentum) ~= "number" then raise(fn .. ": expected momentum to be a number, got " .. typename(momentum)) end
  return torch._native_batch_norm(input, running_mean, running_var, weight, bias, training, momentum, eps)
end

-- embedding(input, weight [, padding_idx]): rows of weight picked by the
-- int64 indices in input; the padding row gets no gradient.
-- pad(input, pad [, mode = "constant", value = 0]) or pad(input, pad,
-- {mode =, value =}): PyTorch's F.pad. pad lists (before, after) pairs from
-- the last dim backwards: {left, right} pads the last dim, {left, right,
-- top, bottom} the last two. "constant" fills with value (a negative pad
-- crops); "reflect" mirrors without the edge (each pad smaller than the
-- dim), "replicate" repeats the edge, "circular" wraps around (each pad at
-- most the dim). Built from narrow, cat and index_select, so that the
-- backward is theirs, on every device.
local pad_modes = { constant = true, reflect = true, replicate = true, circular = true }

-- The source index of each position -before .. n - 1 + after of a dim of
-- n padded by mode, as an int64 tensor on device.
local function pad_indices(n, before, after, mode, device)
  local idx = {}
  for j = -before, n - 1 + after do
    local i
    if mode == "reflect" then i = j < 0 and -j or (j >= n and 2 * (n - 1) - j or j)
    elseif mode == "replicate" then i = math.min(math.max(j, 0), n - 1)
    else i = j % n end   -- circular
    idx[#idx + 1] = i
  end
  return torch.tensor(idx, { dtype = torch.int64, device = device })
end

-- x's shape with m elements along dim, filled with value
local function pad_block(x, dim, m, value)
  local shape = x:size()
  shape[dim + 1] = m
  return torch.full(shape, value, { dtype = x.dtype, device = x.device })
end

function F.pad(input, pad, mode, value)
  local fn = "pad"
  if type(mode) == "table" then mode, value = mode.mode, mode.value end
  want_tensor(input, fn, "input")
  mode = mode or "constant"
  if not pad_modes[mode] then
    raise(string.format("%s: expected mode to be \"constant\", \"reflect\", \"replicate\" or \"circular\", got %s",
                        fn, tostring(mode)))
  end
  if type(pad) ~= "table" or #pad % 2 ~= 0 then raise(fn .. ": Padding length must be divisible by 2") end
  local nd = input:dim()
  if #pad / 2 > nd then
    raise(string.format("%s: Padding length should be less than or equal to two times the input dimension but got padding length %d and input of dimension %d",
                        fn, #pad, nd))
  end
  for i = 1, #pad do
    if type(pad[i]) ~= "number" or pad[i] % 1 ~= 0 then raise(fn .. ": expected the pads to be integers") end
  end
  if mode ~= "constant" and value ~= nil and value ~= 0 then
    raise(string.format("%s: Padding mode \"%s\" doesn't take in value argument", fn, mode))
  end
  local x = input
  for i = 1, #pad / 2 do
    local dim, before, after = nd - i, pad[2 * i - 1], pad[2 * i]
    local n = x:size(dim)
    if mode == "constant" then
      if before < 0 or after < 0 then   -- negative pads crop
        local from, keep = math.max(-before, 0), n - math.max(-before, 0) - math.max(-after, 0)
        if keep < 0 then raise(string.format("%s: the pads (%d, %d) crop more than dim %d's %d elements", fn, before, after, dim, n)) end
        x = x:narrow(dim, from, keep)
      end
      local parts = {}
      if before > 0 then parts[#parts + 1] = pad_block(x, dim, before, value or 0) end
      parts[#parts + 1] = x
      if after > 0 then parts[#parts + 1] = pad_block(x, dim, after, value or 0) end
      if #parts > 1 then x = torch.cat(parts, dim) end
    elseif before ~= 0 or after ~= 0 then
      if before < 0 or after < 0 then raise(string.format("%s: negative pads are taken in constant mode only, got (%d, %d) in %s mode", fn, before, after, mode)) end
      if mode == "reflect" and (before >= n or after >= n) then
        raise(string.format("%s: Argument #4: Padding size should be less than the corresponding input dimension, but got: padding (%d, %d) at dimension %d of input %s",
                            fn, before, after, dim, shape_str(input)))
      end
      if mode == "circular" and (before > n or after > n) then
        raise(string.format("%s: Padding value causes wrapping around more than once: padding (%d, %d) at dimension %d of size %d", fn, before, after, dim, n))
      end
      if n == 0 then raise(string.format("%s: %s padding of an empty dim %d", fn, mode, dim)) end
      x = x:index_select(dim, pad_indices(n, before, after, mode, x.device))
    end
  end
  return x
end

-- one_hot(tensor, num_classes=-1): int64 (..., num_classes) with a 1 at
-- each class index of the int64 tensor; -1 takes the largest index + 1.
function F.one_hot(t, num_classes)
  want_tensor(t, "one_hot", "tensor")
  if t.dtype ~= torch.int64 then
    raise("one_hot: expected an int64 tensor of class indices, got a " .. t.dtype.name .. " tensor")
  end
  num_classes = num_classes == nil and -1 or num_classes
  if type(num_classes) ~= "number" or num_classes % 1 ~= 0 or num_classes < -1 then
    raise("one_hot: expected num_classes to be -1 or a non-negative integer, got " .. tostring(num_classes))
  end
  if t:numel() == 0 and num_classes == -1 then
    raise("one_hot: cannot infer the number of classes from an empty tensor (pass num_classes)")
  end
  if t:numel() > 0 then
    local lo, hi = t:min():item(), t:max():item()
    if lo < 0 then raise("one_hot: class indices must be non-negative, got " .. lo) end
    if num_classes == -1 then num_classes = hi + 1
    elseif hi >= num_classes then
      raise(string.format("one_hot: class index %d is out of range for num_classes=%d", hi, num_classes))
    end
  end
  local classes = torch.arange(num_classes, { dtype = torch.int64, device = t.device })
  return t:unsqueeze(-1):eq(classes):long()
end

function F.embedding(input, weight, padding_idx)
  local fn = "embedding"
  if type(padding_idx) == "table" then padding_idx = padding_idx.padding_idx end
  want_tensor(input, fn, "input")
  want_tensor(weight, fn, "weight")
  if input.dtype ~= torch.int64 and input.dtype ~= torch.int32 then
    raise(fn .. ": expected input to be an int64 tensor of indices, got " .. tostring(input.dtype) .. " (use input:long())")
  end
  if weight:dim() ~= 2 then raise(fn .. ": expected weight to be 2-D (num_embeddings, embedding_dim), got " .. shape_str(weight)) end
  local out_shape = input:size()
  out_shape[#out_shape + 1] = weight:size(1)
  local out = weight:index_select(0, input:reshape(-1)):reshape(out_shape)
  if padding_idx ~= nil then
    if padding_idx < 0 then padding_idx = padding_idx + weight:size(0) end
    local mask = input:eq(padding_idx):unsqueeze(-1)
    out = torch.where(mask, out:detach(), out)
  end
  return out
end

-- embedding_bag(input, weight [, offsets] [, {offsets=, mode="mean",
-- per_sample_weights=, include_last_offset=false, padding_idx=}]): the
-- sum, mean or max of each bag's embeddings: bags are the rows of a 2-D
-- input, or the runs of a 1-D input that offsets start. An empty bag gives
-- zeros; padding_idx's entries take no part.
function F.embedding_bag(input, weight, offsets, opts)
  local fn = "embedding_bag"
  if type(offsets) == "table" and not is_tensor(offsets) then offsets, opts = offsets.offsets, offsets end
  opts = torch._options(opts, fn)
  local mode = opts.mode or "mean"
  if mode ~= "sum" and mode ~= "mean" and mode ~= "max" then
    raise(fn .. ': mode must be "sum", "mean" or "max", got ' .. tostring(mode))
  end
  want_tensor(input, fn, "input")
  want_tensor(weight, fn, "weight")
  if input.dtype ~= torch.int64 and input.dtype ~= torch.int32 then raise(fn .. ": expected integer indices") end
  if weight:dim() ~= 2 then raise(fn .. ": expected weight (num_embeddings, embedding_dim), got " .. shape_str(weight)) end
  local psw = opts.per_sample_weights
  if psw ~= nil and mode ~= "sum" then raise(fn .. ': per_sample_weights are only supported for mode "sum"') end
  -- each index's bag
  local flat, bag_of, B
  if input:dim() == 2 then
    if offsets ~= nil then raise(fn .. ": offsets go with a 1-D input, not a 2-D one") end
    B = input:size(0)
    flat = input:reshape(-1)
    bag_of = torch.arange(B, { dtype = torch.int64 }):repeat_interleave(input:size(1))
    if psw ~= nil then psw = psw:reshape(-1) end
  elseif input:dim() == 1 then
    if offsets == nil then raise(fn .. ": a 1-D input needs offsets (each bag's start)") end
    local starts = is_tensor(offsets) and offsets:tolist() or { unpack(offsets) }
    local n = input:size(0)
    if opts.include_last_offset then starts[#starts] = nil end
    B = #starts
    local bag = {}
    for b = 1, B do
      local stop = starts[b + 1] or n
      if starts[b] < 0 or stop > n or starts[b] > stop then raise(fn .. ": offsets must rise from 0 within the input") end
      for _ = starts[b], stop - 1 do bag[#bag + 1] = b - 1 end
    end
    flat = input
    bag_of = torch.tensor(bag, { dtype = torch.int64 })
  else
    raise(fn .. ": expected a 1-D or 2-D input, got " .. shape_str(input))
  end
  local dev, D = weight.device, weight:size(1)
  bag_of = bag_of:to(dev)
  local rows = weight:index_select(0, flat:to(torch.int64))
  local used = torch.ones(flat:size(0), { dtype = weight.dtype, device = dev })
  if opts.padding_idx ~= nil then used = flat:ne(opts.padding_idx):to(weight.dtype) end
  if psw ~= nil then rows = rows * psw:unsqueeze(1) end
  if mode == "max" then
    local out = {}
    local bags = bag_of:cpu():tolist()
    local first = 1
    for b = 0, B - 1 do
      local last = first
      while bags[last] == b do last = last + 1 end
      local part = rows:narrow(0, first - 1, last - first)
      out[b + 1] = last > first and part:amax(0) or torch.zeros(D, { dtype = weight.dtype, device = dev })
      first = last
    end
    return torch.stack(out, 0)
  end
  local sums = torch.zeros(B, D, { dtype = weight.dtype, device = dev }):index_add(0, bag_of, rows * used:unsqueeze(1))
  if mode == "sum" then return sums end
  local counts = torch.zeros(B, { dtype = weight.dtype, device = dev }):index_add(0, bag_of, used)
  return sums / counts:clamp(1):unsqueeze(1)
end

---------------------------------------------------------------- fractional max pooling

-- The window starts along one spatial dim for every (n, c), PyTorch's
-- sequence from the samples u (N, C): floor((i + u) alpha) - floor(u alpha)
-- for i < out - 1 and in - k for the last, alpha = (in - k) / (out - 1).
local function fractional_starts(u, n_in, k, n_out)
  local N, C = u:size(0), u:size(1)
  local last = torch.full({ N, C, 1 }, n_in - k, { dtype = torch.int64, device = u.device })
  if n_out == 1 then return last end
  local alpha = (n_in - k) / (n_out - 1)
  local i = torch.arange(0, n_out - 1, { dtype = u.dtype, device = u.device }):view(1, 1, -1)
  local uu = u:unsqueeze(2)
  local starts = ((i + uu) * alpha):floor() - (uu * alpha):floor()
  return torch.cat({ starts:to(torch.int64), last }, 2)
end

-- fractional_max_pool2d/3d(input, kernel_size [, {output_size =,
-- output_ratio =, return_indices = false, _random_samples =}]): the maximum
-- of windows whose starts step pseudo-randomly so that output_size windows
-- (or floor(input size x output_ratio)) cover the input, as PyTorch's
-- (Graham's fractional max pooling); the samples (N, C, nd) in [0, 1) are
-- drawn from torch's stream unless given (for 2-D, PyTorch's order: the
-- width's sample first). With return_indices also each maximum's flat
-- position in its plane (volume).
local function fractional_max_pool(fn, nd, input, kernel_size, opts, rest)
  if type(opts) ~= "table" or opts[1] ~= nil then
    -- PyTorch's positional order: output_size, output_ratio, return_indices, _random_samples
    opts = { output_size = opts, output_ratio = rest[1], return_indices = rest[2], _random_samples = rest[3] }
  end
  local x, batched
  if nd == 2 then x, batched = pool_input(input, fn) else x, batched = volume_input(input, fn) end
  local tuple = nd == 2 and pair or triple
  local k = tuple(kernel_size, fn, "kernel_size")
  local N, C = x:size(0), x:size(1)
  local sizes, out = {}, {}
  for a = 1, nd do sizes[a] = x:size(a + 1) end
  if opts.output_size ~= nil then
    out = tuple(opts.output_size, fn, "output_size")
  elseif opts.output_ratio ~= nil then
    local r = type(opts.output_ratio) == "table" and opts.output_ratio or {}
    for a = 1, nd do
      local ra = type(opts.output_ratio) == "number" and opts.output_ratio or r[a]
      if type(ra) ~= "number" or ra <= 0 or ra >= 1 then
        raise(string.format("%s: output_ratio must be between 0 and 1 (exclusive), got %s", fn, tostring(ra)))
      end
      out[a] = math.floor(sizes[a] * ra)
    end
  else
    raise(fn .. ": fractional_max_pool requires specifying either an output_size or an output_ratio")
  end
  for a = 1, nd do
    if out[a] < 1 or out[a] + k[a] - 1 > sizes[a] then
      raise(string.format("%s: output size %d with pool size %d is too large for an input of size %d at dim %d",
                          fn, out[a], k[a], sizes[a], a + 1))
    end
  end
  local samples = opts._random_samples
  if samples == nil then
    samples = torch.rand({ N, C, nd }, { dtype = x.dtype, device = x.device })
  elseif not torch.is_tensor(samples) or samples:dim() ~= 3 or samples:size(0) ~= N or samples:size(1) ~= C
         or samples:size(2) ~= nd then
    raise(string.format("%s: expected _random_samples of shape (%d, %d, %d)", fn, N, C, nd))
  end
  -- the flat index of each window element, dims (N, C, out..., k...)
  local flat
  for a = 1, nd do
    local sample = samples:select(2, nd == 2 and (2 - a) or (a - 1))
    local starts = fractional_starts(sample, sizes[a], k[a], out[a])
    local sshape, oshape = { N, C }, { 1, 1 }
    for b = 1, nd do sshape[#sshape + 1] = b == a and out[a] or 1 end
    for b = 1, nd do oshape[#oshape + 1] = 1 end
    for b = 1, nd do sshape[#sshape + 1] = 1; oshape[#oshape + 1] = b == a and k[a] or 1 end
    local pos = starts:view(sshape) + torch.arange(0, k[a], { dtype = torch.int64, device = x.device }):view(oshape)
    flat = flat == nil and pos or flat * sizes[a] + pos
  end
  local window = 1
  for a = 1, nd do window = window * k[a] end
  local full = { N, C }
  for a = 1, nd do full[#full + 1] = out[a] end
  for a = 1, nd do full[#full + 1] = k[a] end
  local idx = flat:expand(full):reshape(N, C, -1)
  local shape = { N, C }
  for a = 1, nd do shape[#shape + 1] = out[a] end
  shape[#shape + 1] = window
  local values = x:reshape(N, C, -1):gather(2, idx):view(shape)
  local y, at = values:max(-1)
  if not opts.return_indices then return batched and y or y:squeeze(0) end
  local indices = idx:view(shape):gather(-1, at:unsqueeze(-1)):squeeze(-1)
  if batched then return y, indices end
  return y:squeeze(0), indices:squeeze(0)
end
function F.fractional_max_pool2d(input, kernel_size, opts, ...)
  return fractional_max_pool("fractional_max_pool2d", 2, input, kernel_size, opts, { ... })
end
function F.fractional_max_pool3d(input, kernel_size, opts, ...)
  return fractional_max_pool("fractional_max_pool3d", 3, input, kernel_size, opts, { ... })
end
-- the _with_indices forms: always the values and their indices
for nd = 2, 3 do
  local name = "fractional_max_pool" .. nd .. "d"
  F[name .. "_with_indices"] = function(input, kernel_size, opts, ...)
    local rest = { ... }
    local o = {}
    if type(opts) == "table" and opts[1] == nil then
      for k, v in pairs(opts) do o[k] = v end
    else
      o = { output_size = opts, output_ratio = rest[1], _random_samples = rest[3] }
    end
    o.return_indices = true
    return fractional_max_pool(name, nd, input, kernel_size, o, {})
  end
end
function F.adaptive_max_pool3d_with_indices(input, output_size)
  return F.adaptive_max_pool3d(input, output_size, true)
end

---------------------------------------------------------------- in-place forms and old names

-- max_pool1d/2d/3d_with_indices and adaptive_max_pool1d/2d_with_indices:
-- the pools with return_indices set
for nd = 1, 3 do
  local pool = F["max_pool" .. nd .. "d"]
  F["max_pool" .. nd .. "d_with_indices"] = function(input, kernel_size, stride, ...)
    if type(stride) == "table" and stride[1] == nil then
      local o = {}
      for k, v in pairs(stride) do o[k] = v end
      o.return_indices = true
      return pool(input, kernel_size, o)
    end
    local padding, dilation, ceil_mode = ...
    return pool(input, kernel_size, stride, padding, dilation, ceil_mode, true)
  end
end
for nd = 1, 2 do
  local pool = F["adaptive_max_pool" .. nd .. "d"]
  F["adaptive_max_pool" .. nd .. "d_with_indices"] = function(input, output_size) return pool(input, output_size, true) end
end

-- relu_, elu_, leaky_relu_, hardtanh_, threshold_, rrelu_: the activation
-- written into x, which is returned
for _, name in ipairs({ "relu", "elu", "leaky_relu", "hardtanh", "threshold", "rrelu", "celu", "selu" }) do
  local f = F[name]
  if f then
    F[name .. "_"] = function(x, ...) return want_tensor(x, name .. "_", "input"):copy_(f(x, ...)) end
  end
end

F.native_channel_shuffle = F.channel_shuffle

-- conv_tbc(input, weight, bias [, pad = 0]): conv1d of a (time, batch,
-- channels) input with a (kernel, in, out) weight, padded by pad at both
-- ends of time, as PyTorch's torch.conv_tbc; output (time', batch, out)
function F.conv_tbc(input, weight, bias, pad)
  local fn = "conv_tbc"
  want_float(input, fn, "input")
  want_float(weight, fn, "weight")
  if input:dim() ~= 3 then raise(fn .. ": Input must have 3 dims: time, batch, in_channel") end
  if weight:dim() ~= 3 then raise(fn .. ": Weight tensor must have 3 dims: kernel_width, in_channels, out_channels.") end
  if not torch.is_tensor(bias) or bias:dim() ~= 1 then raise(fn .. ": Bias must be 1-D") end
  if weight:size(1) ~= input:size(2) then raise(fn .. ": Input dim 2 (input channels) is not == dim 1 in the weight tensor") end
  if weight:size(2) ~= bias:size(0) then raise(fn .. ": Bias size must equal dim 2 in the weight tensor (output channels).") end
  local y = F.conv1d(input:permute(1, 2, 0), weight:permute(2, 1, 0), bias, 1, pad or 0)
  return y:permute(2, 0, 1)
end

-- upsample (interpolate), upsample_nearest and upsample_bilinear
-- (align_corners true), PyTorch's deprecated names
F.upsample = F.interpolate
function F.upsample_nearest(input, size, scale_factor)
  return F.interpolate(input, { size = size, scale_factor = scale_factor, mode = "nearest" })
end
function F.upsample_bilinear(input, size, scale_factor)
  return F.interpolate(input, { size = size, scale_factor = scale_factor, mode = "bilinear", align_corners = true })
end

return F
