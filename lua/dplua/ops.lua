-- dplua.ops: the Tensor's math: elementwise (unary and binary ops, their
-- in-place forms, isclose, clamp, where, masked_fill, tril/triu),
-- reductions (sum, mean, max, norm, var, softmax, ...), products (matmul,
-- mm, bmm), index_select and gather, and torch.cat and torch.stack;
-- sorting and selecting (sort, argsort, topk, cumsum, multinomial,
-- nonzero, put_).
local B = require("dplua.base")
local ffi, C, torch, methods = B.ffi, B.C, B.torch, B.methods
local raise, check, new, wrap = B.raise, B.check, B.new, B.wrap
local is_tensor, typename, is_options = B.is_tensor, B.typename, B.is_options
local outp, outp2 = B.outp, B.outp2
local check_int, check_dim, check_number, wrap_dim = B.check_int, B.check_dim, B.check_number, B.wrap_dim
local DP_ALL_DIMS = B.DP_ALL_DIMS

---------------------------------------------------------------- elementwise

-- The op codes of src/common/dplua_codes.h, by the names the methods use.
local function codes(names)
  local t = {}
  for _, n in ipairs(names) do t[n] = tonumber(C["DP_" .. n:upper()]) end
  return t
end
local UN = codes({ "neg", "abs", "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "relu", "gelu", "sin", "cos",
                   "sign", "floor", "ceil", "round", "reciprocal", "log1p", "expm1", "logical_not", "square", "erf" })
local GELU_TANH = tonumber(C.DP_GELU_TANH)
local BIN = codes({ "add", "sub", "mul", "div", "pow", "maximum", "minimum", "eq", "ne", "lt", "le", "gt", "ge",
                    "remainder", "atan2", "logical_and", "logical_or" })
local RED = codes({ "sum", "mean", "prod", "max", "min", "argmax", "argmin", "var", "std", "all", "any", "norm" })
torch._ops = { unary = UN, binary = BIN, reduce = RED }

local function as_tensor(x, fn)
  if is_tensor(x) then return x end
  if type(x) == "boolean" then return torch.tensor(x) end
  raise(string.format("%s: expected a tensor or a number, got %s", fn, typename(x)))
end

local function binary(op, a, b, fn)
  if type(b) == "number" and is_tensor(a) then return new(C.dp_binary_scalar(outp, op, a.p, b, 0)) end
  if type(a) == "number" and is_tensor(b) then return new(C.dp_binary_scalar(outp, op, b.p, a, 1)) end
  a, b = as_tensor(a, fn), as_tensor(b, fn)
  return new(C.dp_binary(outp, op, a.p, b.p))
end

local function binary_into(op, dst, a, b, fn)
  if type(b) == "number" then check(C.dp_binary_scalar_into(dst.p, op, a.p, b, 0))
  else b = as_tensor(b, fn); check(C.dp_binary_into(dst.p, op, a.p, b.p)) end
  return dst
end

for name, op in pairs(UN) do
  methods[name] = function(t) return new(C.dp_unary(outp, op, t.p)) end
  methods[name .. "_"] = function(t) check(C.dp_unary_into(t.p, op, t.p)); return t end
end
function methods.gelu(t, approximate)
  local op = approximate == "tanh" and GELU_TANH or UN.gelu
  return new(C.dp_unary(outp, op, t.p))
end
methods.negative = methods.neg
methods.absolute = methods.abs

for name, op in pairs(BIN) do
  methods[name] = function(a, b) return binary(op, a, b, name) end
  methods[name .. "_"] = function(a, b) return binary_into(op, a, a, b, name .. "_") end
end

-- isclose(other [, rtol [, atol [, equal_nan]]]), or with the three in a
-- table {rtol=, atol=, equal_nan=}: PyTorch's test, |a - b| <= atol +
-- rtol |b| elementwise (a bool tensor, broadcast), equal values close
-- (infinities too), NaN close to NaN only with equal_nan. allclose: all of
-- them, a boolean. Neither records a gradient.
function methods.isclose(a, b, rtol, atol, equal_nan)
  if type(rtol) == "table" then rtol, atol, equal_nan = rtol.rtol, rtol.atol, rtol.equal_nan end
  rtol = rtol == nil and 1e-5 or check_number(rtol, "isclose", "rtol")
  atol = atol == nil and 1e-8 or check_number(atol, "isclose", "atol")
  if not is_tensor(b) then raise("isclose: expected other to be a tensor, got " .. typename(b)) end
  a, b = a:detach(), b:detach()
  local ok, close = pcall(function()
    local equal = a:eq(b)
    if a.dtype == torch.bool and b.dtype == torch.bool then return equal end
    local diff = (a - b):abs()   -- only a finite difference is measured: inf is close to inf alone
    local near = diff:le(b:abs() * rtol + atol):logical_and(diff:lt(math.huge)):logical_or(equal)
    if equal_nan then near = near:logical_or(a:ne(a):logical_and(b:ne(b))) end
    return near
  end)
  if not ok then raise("isclose: " .. tostring(close):gsub("^[^\n]-:%d+: ", ""):gsub("^%a+: ", "")) end
  return close
end
function methods.allclose(a, b, rtol, atol, equal_nan)
  return methods.isclose(a, b, rtol, atol, equal_nan):all():item()
end
-- equal(other): the same shape and the same elements (NaN equals
-- nothing), a boolean, as torch.equal.
function methods.equal(a, b)
  if not is_tensor(b) then raise("equal: expected other to be a tensor, got " .. typename(b)) end
  if a:dim() ~= b:dim() then return false end
  for d = 0, a:dim() - 1 do
    if a:size(d) ~= b:size(d) then return false end
  end
  if a.device.type ~= b.device.type or a.device.index ~= b.device.index then
    raise("equal: expected both tensors on one device, got " .. tostring(a.device) .. " and " .. tostring(b.device))
  end
  return a:numel() == 0 or a:detach():eq(b:detach()):all():item()
end

-- add/sub with alpha: a + alpha * b, as in PyTorch
local function scaled(b, alpha, fn)
  if is_options(alpha) then alpha = alpha.alpha end   -- {alpha = 2}, PyTorch's keyword
  if alpha == nil or alpha == 1 then return b end
  check_number(alpha, fn, "alpha")
  return binary(BIN.mul, b, alpha, fn)
end
function methods.add(a, b, alpha) return binary(BIN.add, a, scaled(b, alpha, "add"), "add") end
function methods.sub(a, b, alpha) return binary(BIN.sub, a, scaled(b, alpha, "sub"), "sub") end
function methods.add_(a, b, alpha) return binary_into(BIN.add, a, a, scaled(b, alpha, "add_"), "add_") end
function methods.sub_(a, b, alpha) return binary_into(BIN.sub, a, a, scaled(b, alpha, "sub_"), "sub_") end
-- div(other [, {rounding_mode = "floor" | "trunc"}]) (or the mode as a
-- string): the true quotient, or rounded down or toward zero. Rounded, an
-- integer tensor stays integer (exact below 2^53); the floor is (t - r) /
-- other with r = remainder(t, other), an exact multiple, so that it is not
-- a rounding of t / other.
local true_div = methods.div
function methods.div(t, other, opts)
  if opts == nil then return true_div(t, other) end
  local mode = type(opts) == "table" and opts.rounding_mode or opts
  if mode == nil then return true_div(t, other) end
  if mode ~= "floor" and mode ~= "trunc" then
    raise('div: expected rounding_mode to be nil, "trunc" or "floor", got ' .. tostring(mode))
  end
  if not is_tensor(other) and type(other) ~= "number" then
    raise("div: expected other to be a tensor or a number, got " .. typename(other))
  end
  local integer = not t.dtype.is_floating_point and not (is_tensor(other) and other.dtype.is_floating_point)
                  and not (type(other) == "number" and other % 1 ~= 0)
  if not integer and mode == "trunc" then return true_div(t, other):trunc() end
  local r = t:remainder(other)
  -- (integers divide in float64, exact below 2^53; the default float32
  -- would be exact only below 2^24)
  local q = true_div(integer and (t - r):double() or t - r, other):round()
  if mode == "trunc" then   -- integers: one up where the signs differ and something was left
    q = q + r:ne(0):logical_and(t:lt(0):ne(is_tensor(other) and other:lt(0) or other < 0)):to(q.dtype)
  end
  return integer and q:to(t.dtype) or q
end
methods.multiply, methods.divide, methods.subtract = methods.mul, methods.div, methods.sub
methods.true_divide = true_div

-- Writes r, the result of fn's out-of-place form, into t, as PyTorch's
-- in-place forms do: r must have t's shape (what t1 and t2 broadcast to
-- may not grow t) and a floating r does not go into an integer t. The
-- copy refuses a t that requires grad, as every in-place op does.
local function write_into(t, r, fn)
  local ts, rs = t:size(), r:size()
  if table.concat(ts, ",") ~= table.concat(rs, ",") or #ts ~= #rs then
    raise(string.format("%s: output with shape [%s] doesn't match the broadcast shape [%s]", fn,
                        table.concat(ts, ", "), table.concat(rs, ", ")))
  end
  if r.dtype.is_floating_point and not t.dtype.is_floating_point then
    raise(string.format("%s: result type %s can't be cast to the desired output type %s", fn, r.dtype.name,
                        t.dtype.name))
  end
  if C.dp_copy_into(t.p, r.p) ~= 0 then raise((ffi.string(C.dp_last_error()):gsub("^copy_:", fn .. ":"))) end
  return t
end

-- addcmul's and addcdiv's value: {value=} or a number, 1 by default; an
-- integer for integer operands, as PyTorch documents it (PyTorch 1.13
-- truncates a fraction there silently).
local function value_of(opts, fn, t, t1, t2)
  local v = opts
  if type(opts) == "table" and getmetatable(opts) == nil then
    for k in pairs(opts) do
      if k ~= "value" then raise(string.format("%s: unknown option '%s'", fn, tostring(k))) end
    end
    v = opts.value
  end
  if v == nil then return 1 end
  if is_tensor(v) then v = v:item() end
  if type(v) ~= "number" then
    raise(string.format("%s: expected value to be a number (or {value=}), got %s", fn, typename(v)))
  end
  if v % 1 ~= 0 and not (t.dtype.is_floating_point or t1.dtype.is_floating_point or t2.dtype.is_floating_point) then
    raise(string.format("%s: for integer tensors, value must be an integer, got %s", fn, tostring(v)))
  end
  return v
end

local function want_tensors(fn, t1, t2)
  if not is_tensor(t1) then raise(fn .. ": expected tensor1 to be a tensor, got " .. typename(t1)) end
  if not is_tensor(t2) then raise(fn .. ": expected tensor2 to be a tensor, got " .. typename(t2)) end
end

-- Runs f(...), an op made of other ops, so that an error of one of them
-- (a failed broadcast) names fn, the op the user called.
local function as_op(fn, f, ...)
  local ok, r = pcall(f, ...)
  if not ok then raise(fn .. ": " .. tostring(r):gsub("^[^\n]-:%d+: ", ""):gsub("^[%a_]+: ", "")) end
  return r
end

-- addcmul(tensor1, tensor2, {value=1}): t + value * tensor1 * tensor2, the
-- three broadcast together; addcdiv: t + value * tensor1 / tensor2, which
-- PyTorch refuses for integer tensor1 and tensor2. The products are in
-- PyTorch's order, (value * tensor1) * tensor2.
local function addcmul_of(t, t1, t2, v) return t + (v == 1 and t1 or t1 * v) * t2 end
local function addcdiv_of(t, t1, t2, v) return t + (v == 1 and t1 or t1 * v) / t2 end
local function addcmul(t, t1, t2, opts, fn)
  want_tensors(fn, t1, t2)
  return as_op(fn, addcmul_of, t, t1, t2, value_of(opts, fn, t, t1, t2))
end
local function addcdiv(t, t1, t2, opts, fn)
  want_tensors(fn, t1, t2)
  if not t1.dtype.is_floating_point and not t2.dtype.is_floating_point then
    raise(string.format("%s: integer division is not supported (tensor1 %s, tensor2 %s); "
                        .. "convert one to a floating dtype", fn, t1.dtype.name, t2.dtype.name))
  end
  return as_op(fn, addcdiv_of, t, t1, t2, value_of(opts, fn, t, t1, t2))
end
function methods.addcmul(t, t1, t2, opts) return addcmul(t, t1, t2, opts, "addcmul") end
function methods.addcdiv(t, t1, t2, opts) return addcdiv(t, t1, t2, opts, "addcdiv") end
function methods.addcmul_(t, t1, t2, opts) return write_into(t, addcmul(t, t1, t2, opts, "addcmul_"), "addcmul_") end
function methods.addcdiv_(t, t1, t2, opts) return write_into(t, addcdiv(t, t1, t2, opts, "addcdiv_"), "addcdiv_") end

-- lerp(end, weight): t + weight * (end - t), weight a number or a tensor,
-- broadcast together; floating tensors of one dtype, as PyTorch. Where
-- |weight| >= 0.5 it is end - (end - t) * (1 - weight), PyTorch's form,
-- which gives end itself at weight 1.
local function lerp_number(t, e, w)
  if math.abs(w) < 0.5 then return t + (e - t) * w end
  return e - (e - t) * (1 - w)
end
local function lerp_tensor(t, e, w)
  local d = e - t
  return torch.where(w:abs():lt(0.5), t + d * w, e - d * (1 - w))
end
local function lerp(t, e, w, fn)
  if not is_tensor(e) then raise(fn .. ": expected end to be a tensor, got " .. typename(e)) end
  if not t.dtype.is_floating_point then raise(fn .. ": expected floating point tensors, got " .. t.dtype.name) end
  if e.dtype ~= t.dtype then
    raise(string.format("%s: expected end of the input's dtype %s, got %s", fn, t.dtype.name, e.dtype.name))
  end
  if type(w) == "number" then return as_op(fn, lerp_number, t, e, w) end
  if not is_tensor(w) then raise(fn .. ": expected weight to be a number or a tensor, got " .. typename(w)) end
  if w.dtype ~= t.dtype then
    raise(string.format("%s: expected weight of the input's dtype %s, got %s", fn, t.dtype.name, w.dtype.name))
  end
  return as_op(fn, lerp_tensor, t, e, w)
end
function methods.lerp(t, e, w) return lerp(t, e, w, "lerp") end
function methods.lerp_(t, e, w) return write_into(t, lerp(t, e, w, "lerp_"), "lerp_") end

function methods.zero_(t) check(C.dp_fill_into(t.p, 0)); return t end
function methods.fill_(t, v)
  if type(v) == "boolean" then v = v and 1 or 0 end
  if is_tensor(v) then v = v:item(); if type(v) == "boolean" then v = v and 1 or 0 end end
  check(C.dp_fill_into(t.p, check_number(v, "fill_", "value")))
  return t
end
function methods.copy_(t, src)
  if not is_tensor(src) then raise("copy_: expected a tensor source, got " .. typename(src)) end
  check(C.dp_copy_into(t.p, src.p))
  return t
end

local NAN = 0 / 0
local function bound(v, fn, what)
  if v == nil then return NAN end
  if is_tensor(v) then v = v:item() end
  return check_number(v, fn, what)
end
function methods.clamp(t, lo, hi)
  if is_options(lo) then lo, hi = lo.min, lo.max end
  return new(C.dp_clamp(outp, t.p, bound(lo, "clamp", "min"), bound(hi, "clamp", "max")))
end
function methods.clamp_(t, lo, hi)
  if is_options(lo) then lo, hi = lo.min, lo.max end
  check(C.dp_clamp_into(t.p, t.p, bound(lo, "clamp_", "min"), bound(hi, "clamp_", "max")))
  return t
end
function methods.clamp_min(t, lo) return methods.clamp(t, lo, nil) end
function methods.clamp_max(t, hi) return methods.clamp(t, nil, hi) end
methods.clip = methods.clamp

function torch.where(cond, a, b)
  if not is_tensor(cond) then raise("where: expected condition to be a tensor, got " .. typename(cond)) end
  if type(a) ~= "number" then a = as_tensor(a, "where") end
  if type(b) ~= "number" then b = as_tensor(b, "where") end
  -- a number branch is a 0-d tensor on the condition's device
  if type(a) == "number" then a = torch.full({}, a, { dtype = is_tensor(b) and b.dtype or nil, device = cond.device }) end
  if type(b) == "number" then b = torch.full({}, b, { dtype = a.dtype, device = a.device }) end
  a, b = as_tensor(a, "where"), as_tensor(b, "where")
  return new(C.dp_where(outp, cond.p, a.p, b.p))
end
function methods.where(t, cond, other) return torch.where(cond, t, other) end

-- isnan, isinf, isfinite: bool tensors, as PyTorch's (an integer is never
-- NaN or infinite)
function methods.isnan(t) return t:ne(t) end
function methods.isinf(t) return t:abs():eq(math.huge) end
function methods.isfinite(t) return t:isnan():logical_or(t:isinf()):logical_not() end

-- masked_fill(mask, value): value where the bool mask is true, t elsewhere,
-- in t's dtype (value a number, a boolean or a 0-d tensor), broadcast as
-- where() does; masked_fill_ writes it into t. Autograd sees where().
local function masked(t, mask, value, fn)
  if not is_tensor(mask) or mask.dtype ~= torch.bool then
    raise(string.format("%s: expected mask to be a bool tensor, got %s", fn,
                        is_tensor(mask) and "a " .. mask.dtype.name .. " tensor" or typename(mask)))
  end
  local fill
  if is_tensor(value) then
    if value:dim() ~= 0 then
      raise(string.format("%s: expected value to be a number or a 0-d tensor, got a tensor of %d dims", fn,
                          value:dim()))
    end
    fill = value:detach():to(t.device):to(t.dtype)
  elseif type(value) == "number" or type(value) == "boolean" then
    if type(value) == "boolean" then value = value and 1 or 0 end
    fill = torch.full({}, value, { dtype = t.dtype, device = t.device })
  else
    raise(string.format("%s: expected value to be a number or a 0-d tensor, got %s", fn, typename(value)))
  end
  return torch.where(mask, fill, t)
end
function methods.masked_fill(t, mask, value) return masked(t, mask, value, "masked_fill") end
function methods.masked_fill_(t, mask, value)
  if C.dp_copy_into(t.p, masked(t, mask, value, "masked_fill_").p) ~= 0 then
    raise((ffi.string(C.dp_last_error()):gsub("^copy_:", "masked_fill_:")))
  end
  return t
end

-- tril(diagonal=0) and triu: zeros above (below) the diagonal of the last
-- two dims; diagonal > 0 moves it up, < 0 down
local function triangle(t, k, fn, keep)
  k = check_int(k or 0, fn, "diagonal")
  if t:dim() < 2 then raise(string.format("%s: expected a tensor of at least 2 dims, got %d", fn, t:dim())) end
  local rows, cols = t:size(-2), t:size(-1)
  local i = torch.arange(rows, { dtype = torch.int64, device = t.device }):unsqueeze(1)
  local j = torch.arange(cols, { dtype = torch.int64, device = t.device }):unsqueeze(0)
  return masked(t, keep(j - i, k):logical_not(), 0, fn)
end
function methods.tril(t, k) return triangle(t, k, "tril", function(d, k) return d:le(k) end) end
function methods.triu(t, k) return triangle(t, k, "triu", function(d, k) return d:ge(k) end) end

---------------------------------------------------------------- reductions

-- Accepts (dim, keepdim), ({dim=, keepdim=}), or a table of dims.
local function reduce_args(fn, dim, keepdim)
  if is_options(dim) then dim, keepdim = dim.dim, dim.keepdim end
  if keepdim ~= nil and type(keepdim) ~= "boolean" then
    raise(string.format("%s: expected keepdim to be a boolean, got %s", fn, typename(keepdim)))
  end
  return dim, keepdim and 1 or 0
end

local function reduce(op, fn, t, dim, keepdim, correction)
  dim, keepdim = reduce_args(fn, dim, keepdim)
  if dim == nil then return new(C.dp_reduce(outp, op, t.p, DP_ALL_DIMS, 0, correction or 0)) end
  if type(dim) == "table" then
    -- several dims: reduce the highest first so the others keep their place
    local n = C.dp_tensor_ndim(t.p)
    local ds = {}
    for i, d in ipairs(dim) do ds[i] = wrap_dim(t, d, fn) end
    table.sort(ds, function(x, y) return x > y end)
    local r = t
    for i, d in ipairs(ds) do
      if i > 1 and d == ds[i - 1] then raise(fn .. ": dim " .. d .. " appears more than once") end
      r = new(C.dp_reduce(outp, op, r.p, d, keepdim, correction or 0))
    end
    return n == 0 and new(C.dp_reduce(outp, op, t.p, DP_ALL_DIMS, 0, correction or 0)) or r
  end
  return new(C.dp_reduce(outp, op, t.p, check_dim(dim, fn, "dim"), keepdim, correction or 0))
end

for _, name in ipairs({ "sum", "mean", "prod", "all", "any", "argmax", "argmin" }) do
  local op = RED[name]
  methods[name] = function(t, dim, keepdim) return reduce(op, name, t, dim, keepdim) end
end

local function minmax(op, fn, pair_op)
  return function(t, dim, keepdim)
    if is_tensor(dim) then return binary(pair_op, t, dim, fn) end
    if dim == nil then return new(C.dp_reduce(outp, op, t.p, DP_ALL_DIMS, 0, 0)) end
    local d, kd = reduce_args(fn, dim, keepdim)
    check(C.dp_reduce_with_index(outp, outp2, op, t.p, check_dim(d, fn, "dim"), kd))
    local values, indices = wrap(outp[0]), wrap(outp2[0])
    return values, indices
  end
end
methods.max = minmax(RED.max, "max", BIN.maximum)
methods.min = minmax(RED.min, "min", BIN.minimum)
function methods.amax(t, dim, keepdim) return reduce(RED.max, "amax", t, dim, keepdim) end
function methods.amin(t, dim, keepdim) return reduce(RED.min, "amin", t, dim, keepdim) end

-- norm([p [, dim [, keepdim]]]): the vector p-norm of a floating tensor,
-- over every element or over dim: p a number (2 by default; 0 counts the
-- non-zeros), math.huge or -math.huge (the largest or smallest
-- magnitude), or "fro" (2)
function methods.norm(t, p, dim, keepdim)
  if not t.dtype.is_floating_point then
    raise("norm: expected a floating point tensor, got " .. t.dtype.name)
  end
  if p == nil or p == "fro" then p = 2 end
  if type(p) ~= "number" then
    raise(string.format('norm: expected p to be a number, math.huge or "fro", got %s %s', typename(p), tostring(p)))
  end
  if p == 2 then return reduce(RED.norm, "norm", t, dim, keepdim) end   -- (before abs: no pass of its own)
  local a = t:abs()
  if p == math.huge then return a:amax(dim, keepdim) end
  if p == -math.huge then return a:amin(dim, keepdim) end
  if p == 0 then return a:ne(0):to(t.dtype):sum(dim, keepdim) end
  if p == 1 then return a:sum(dim, keepdim) end
  return a:pow(p):sum(dim, keepdim):pow(1 / p)
end

-- var/std: (dim, keepdim), (dim, {correction=, unbiased=, keepdim=}) or ({dim=, ...})
local function moments(op, fn)
  return function(t, dim, opts)
    local keepdim, correction = false, 1
    if is_options(dim) then opts, dim = dim, dim.dim end
    if type(opts) == "boolean" then keepdim = opts
    elseif type(opts) == "table" then
      keepdim = opts.keepdim or false
      if opts.correction ~= nil then correction = check_int(opts.correction, fn, "correction") end
      if opts.unbiased == false then correction = 0 end
    end
    if dim == nil then return new(C.dp_reduce(outp, op, t.p, DP_ALL_DIMS, 0, correction)) end
    return new(C.dp_reduce(outp, op, t.p, check_dim(dim, fn, "dim"), keepdim and 1 or 0, correction))
  end
end
methods.var = moments(RED.var, "var")
methods.std = moments(RED.std, "std")

function methods.softmax(t, dim)
  if dim == nil then raise("softmax: the dim argument is required") end
  return new(C.dp_softmax(outp, t.p, check_dim(dim, "softmax", "dim"), 0))
end
function methods.log_softmax(t, dim)
  if dim == nil then raise("log_softmax: the dim argument is required") end
  return new(C.dp_softmax(outp, t.p, check_dim(dim, "log_softmax", "dim"), 1))
end

---------------------------------------------------------------- products

-- Autocast (dplua/autocast.lua) sets these while a region is active; with
-- autocast off the GEMM wrappers pay one test of a local boolean.
local autocast_on, autocast = false, nil
function torch._autocast_watch(on, m) autocast_on, autocast = on, m end

local function matmul_fn(cfn, fn)
  return function(a, b)
    if not is_tensor(a) or not is_tensor(b) then
      raise(string.format("%s: expected two tensors, got %s and %s", fn, typename(a), typename(b)))
    end
    if autocast_on then a, b = autocast.cast_inputs(a, b) end
    return new(cfn(outp, a.p, b.p))
  end
end
methods.matmul = matmul_fn(C.dp_matmul, "matmul")
methods.mm = matmul_fn(C.dp_mm, "mm")
methods.bmm = matmul_fn(C.dp_bmm, "bmm")
methods.mv = methods.matmul
methods.dot = methods.matmul

---------------------------------------------------------------- indexing and joining

function methods.index_select(t, dim, index)
  if not is_tensor(index) then raise("index_select: expected index to be a tensor, got " .. typename(index)) end
  return new(C.dp_index_select(outp, t.p, check_dim(dim, "index_select", "dim"), index.p))
end

function methods.gather(t, dim, index)
  if not is_tensor(index) then raise("gather: expected index to be a tensor, got " .. typename(index)) end
  return new(C.dp_gather(outp, t.p, check_dim(dim, "gather", "dim"), index.p))
end

-- scatter(dim, index, src | value [, {reduce = "add"}]): a copy of t with
-- src[p] (or value) written at p with dim replaced by index[p], p over
-- index's shape; of positions that share a target one write wins, as in
-- PyTorch. scatter_add adds instead.
local function scatter(fn, t, dim, index, src, add)
  if not is_tensor(index) then raise(fn .. ": expected index to be a tensor, got " .. typename(index)) end
  if type(src) == "number" or type(src) == "boolean" then
    src = torch.full(index:size(), src, { dtype = t.dtype, device = t.device })
  elseif not is_tensor(src) then
    raise(fn .. ": expected src to be a tensor or a number, got " .. typename(src))
  end
  return new(C.dp_scatter(outp, t.p, check_dim(dim, fn, "dim"), index.p, src.p, add and 1 or 0))
end
local function scatter_reduce_opt(fn, opts)
  if opts == nil then return false end
  local reduce = type(opts) == "table" and opts.reduce or opts
  if reduce == "add" then return true end
  raise(string.format('%s: reduce must be "add" (for "multiply" use a product of your own), got %s', fn, tostring(reduce)))
end
function methods.scatter(t, dim, index, src, opts)
  return scatter("scatter", t, dim, index, src, scatter_reduce_opt("scatter", opts))
end
function methods.scatter_(t, dim, index, src, opts)
  return write_into(t, scatter("scatter_", t, dim, index, src, scatter_reduce_opt("scatter_", opts)), "scatter_")
end
function methods.scatter_add(t, dim, index, src) return scatter("scatter_add", t, dim, index, src, true) end
function methods.scatter_add_(t, dim, index, src)
  return write_into(t, scatter("scatter_add_", t, dim, index, src, true), "scatter_add_")
end

-- index_add / index_copy / index_fill over a 1-D index along dim, as a
-- scatter with the index spread over src's positions: source has t's shape
-- but in dim, where it has one entry per index.
local function index_spread(fn, t, dim, index, source_shape)
  if not is_tensor(index) then raise(fn .. ": expected index to be a tensor, got " .. typename(index)) end
  if index:dim() > 1 then raise(string.format("%s: index must be 0-D or 1-D, got %dD", fn, index:dim())) end
  dim = check_dim(dim, fn, "dim")
  local nd = t:dim()
  local d = dim < 0 and dim + nd or dim
  if d < 0 or d >= math.max(nd, 1) then
    raise(string.format("%s: dim %d is out of range for a tensor of %d dims", fn, dim, nd))
  end
  local want = t:size()
  if nd > 0 then want[d + 1] = index:numel() end
  if source_shape and table.concat(source_shape, ",") ~= table.concat(want, ",") then
    raise(string.format("%s: expected source of shape [%s] (the input's, with %d entries in dim %d, one an index), "
                        .. "got [%s]", fn, table.concat(want, ", "), index:numel(), d, table.concat(source_shape, ", ")))
  end
  if nd == 0 then return 0, index:reshape({}) end
  local view = {}
  for i = 1, nd do view[i] = 1 end
  view[d + 1] = index:numel()
  return d, index:reshape(view):expand(want), want
end
local function alpha_of(fn, opts)
  local a = type(opts) == "table" and opts.alpha or opts
  if a == nil then return 1 end
  if type(a) ~= "number" then raise(fn .. ": expected alpha to be a number, got " .. typename(a)) end
  return a
end
local function index_add(fn, t, dim, index, source, opts)
  if not is_tensor(source) then raise(fn .. ": expected source to be a tensor, got " .. typename(source)) end
  local d, spread = index_spread(fn, t, dim, index, source:size())
  local alpha = alpha_of(fn, opts)
  return scatter(fn, t, d, spread, alpha == 1 and source or source * alpha, true)
end
local function index_copy(fn, t, dim, index, source)
  if not is_tensor(source) then raise(fn .. ": expected source to be a tensor, got " .. typename(source)) end
  local d, spread = index_spread(fn, t, dim, index, source:size())
  return scatter(fn, t, d, spread, source, false)
end
local function index_fill(fn, t, dim, index, value)
  if is_tensor(value) then
    if value:dim() ~= 0 then raise(fn .. ": expected value to be a number or a 0-d tensor, got a " .. value:dim() .. "-d tensor") end
    value = value:item()
  elseif type(value) ~= "number" and type(value) ~= "boolean" then
    raise(fn .. ": expected value to be a number, got " .. typename(value))
  end
  local d, spread, shape = index_spread(fn, t, dim, index)
  return scatter(fn, t, d, spread, torch.full(shape or {}, value, { dtype = t.dtype, device = t.device }), false)
end
-- index_add(dim, index, source [, alpha | {alpha=}]): t with alpha *
-- source's entries along dim added at the positions index names.
function methods.index_add(t, dim, index, source, opts) return index_add("index_add", t, dim, index, source, opts) end
function methods.index_add_(t, dim, index, source, opts)
  return write_into(t, index_add("index_add_", t, dim, index, source, opts), "index_add_")
end
-- index_copy(dim, index, source): source's entries along dim written at
-- the positions index names.
function methods.index_copy(t, dim, index, source) return index_copy("index_copy", t, dim, index, source) end
function methods.index_copy_(t, dim, index, source)
  return write_into(t, index_copy("index_copy_", t, dim, index, source), "index_copy_")
end
-- index_fill(dim, index, value): the entries along dim that index names
-- set to value.
function methods.index_fill(t, dim, index, value) return index_fill("index_fill", t, dim, index, value) end
function methods.index_fill_(t, dim, index, value)
  return write_into(t, index_fill("index_fill_", t, dim, index, value), "index_fill_")
end

-- the tensors of a list, for the C call after tensor_list (grown to the longest list yet)
local list_buf, list_cap = ffi.new("dp_tensor*[256]"), 256
local function tensor_list(fn, list)
  if type(list) ~= "table" or is_tensor(list) then raise(fn .. ": expected a table of tensors, got " .. typename(list)) end
  local n = #list
  if n == 0 then raise(fn .. ": expected a non-empty table of tensors") end
  if n > 2 ^ 31 - 1 then raise(fn .. ": at most 2^31 - 1 tensors at once, got " .. n) end
  if n > list_cap then list_buf, list_cap = ffi.new("dp_tensor*[?]", n), n end
  for i = 1, n do
    if not is_tensor(list[i]) then raise(string.format("%s: expected a tensor at position %d, got %s", fn, i, typename(list[i]))) end
    list_buf[i - 1] = list[i].p
  end
  return n
end

function torch.cat(list, dim)
  local n = tensor_list("cat", list)
  return new(C.dp_cat(outp, n, list_buf, check_dim(dim or 0, "cat", "dim")))
end
torch.concat = torch.cat
function torch.stack(list, dim)
  local n = tensor_list("stack", list)
  return new(C.dp_stack(outp, n, list_buf, check_dim(dim or 0, "stack", "dim")))
end

---------------------------------------------------------------- sorting and selecting

-- Positional arguments as PyTorch orders them, or all of them (and the
-- keyword-only ones) in one options table, last: t:sort(0, true),
-- t:sort{dim=0, stable=true}, t:sort(0, true, {stable=true}). Returns
-- the values of `names` in order, defaults filled in.
local function args_of(fn, names, defaults, ...)
  local n, vals = select("#", ...), { ... }
  local opts = n > 0 and is_options(vals[n]) and vals[n] or nil
  if opts then n = n - 1 end
  if n > #names then raise(string.format("%s: expected at most %d arguments, got %d", fn, #names, n)) end
  local known = {}
  for i, name in ipairs(names) do known[name] = i end
  for k in pairs(opts or {}) do
    if not known[k] and defaults[k] == nil then raise(string.format("%s: unknown option '%s'", fn, tostring(k))) end
  end
  local out = {}
  for i, name in ipairs(names) do
    local v = vals[i]
    if i > n then v = nil end
    if v == nil and opts then v = opts[name] end
    if v == nil then v = defaults[name] end
    out[i] = v
  end
  return out, opts or {}
end

local function check_bool(v, fn, what)
  if type(v) ~= "boolean" then raise(string.format("%s: expected %s to be a boolean, got %s", fn, what, typename(v))) end
  return v
end

-- sort(dim=-1, descending=false, {stable=false}): values and int64
-- indices; NaN sorts above every number. dplua's sort is always stable
-- (equal values keep their order), so stable=true asks for nothing more.
function methods.sort(t, ...)
  local a = args_of("sort", { "dim", "descending" }, { dim = -1, descending = false, stable = false }, ...)
  check_bool(a[2], "sort", "descending")
  check(C.dp_sort(outp, outp2, t.p, check_dim(a[1], "sort", "dim"), a[2] and 1 or 0))
  local values, indices = wrap(outp[0]), wrap(outp2[0])
  return values, indices
end

function methods.argsort(t, ...)
  local a = args_of("argsort", { "dim", "descending" }, { dim = -1, descending = false, stable = false }, ...)
  local _, indices = methods.sort(t, a[1], a[2])
  return indices
end

-- topk(k, dim=-1, largest=true, sorted=true): the k largest (smallest)
-- along dim and their int64 indices, always in sorted order.
function methods.topk(t, ...)
  local a = args_of("topk", { "k", "dim", "largest", "sorted" }, { dim = -1, largest = true, sorted = true }, ...)
  if a[1] == nil then raise("topk: the k argument is required") end
  check_bool(a[3], "topk", "largest"); check_bool(a[4], "topk", "sorted")
  check(C.dp_topk(outp, outp2, t.p, check_int(a[1], "topk", "k"), check_dim(a[2], "topk", "dim"), a[3] and 1 or 0))
  local values, indices = wrap(outp[0]), wrap(outp2[0])
  return values, indices
end

-- cumsum(dim, {dtype=}): running sums along dim; integers and bools sum
-- to int64, as in PyTorch, unless dtype says otherwise (the input is
-- converted to it first).
function methods.cumsum(t, ...)
  local a = args_of("cumsum", { "dim", "dtype" }, {}, ...)
  if a[1] == nil then raise("cumsum: the dim argument is required") end
  if a[2] ~= nil then t = t:to(a[2]) end
  return new(C.dp_cumsum(outp, t.p, check_dim(a[1], "cumsum", "dim")))
end

-- multinomial(num_samples, replacement=false, {generator=}): int64
-- category indices drawn from the rows of a 1-D or 2-D tensor of
-- non-negative weights, from torch's random stream (manual_seed makes
-- them repeat); generator= a torch.Generator draws from its stream, and a
-- seed from a stream of its own; both leave torch's where it was.
function methods.multinomial(t, ...)
  local a, opts = args_of("multinomial", { "num_samples", "replacement" }, { replacement = false, generator = false },
                          ...)
  if a[1] == nil then raise("multinomial: the num_samples argument is required") end
  local n = check_int(a[1], "multinomial", "num_samples")
  check_bool(a[2], "multinomial", "replacement")
  local gen = opts.generator
  if gen == nil then return new(C.dp_multinomial(outp, t.p, n, a[2] and 1 or 0)) end
  if torch.is_generator(gen) then
    return torch._drawn("multinomial", gen, function() return new(C.dp_multinomial(outp, t.p, n, a[2] and 1 or 0)) end)
  end
  if type(gen) ~= "number" or gen % 1 ~= 0 or gen < 0 then
    raise("multinomial: expected generator to be a torch.Generator or a non-negative integer seed, got " .. typename(gen))
  end
  local state = ffi.new("uint64_t[2]")
  C.dp_rng_get_state(state, state + 1)
  C.dp_manual_seed(gen)
  local ok, r = pcall(function() return new(C.dp_multinomial(outp, t.p, n, a[2] and 1 or 0)) end)
  C.dp_rng_set_state(state[0], state[1])
  if not ok then error(r, 0) end
  return r
end

-- nonzero({as_tuple=false}): the coordinates of the non-zero elements,
-- (count, ndim) int64 in row-major order; as_tuple: a Lua list of ndim
-- 1-D tensors, one per dim (one for a 0-d tensor), which index as the
-- mask would: t[mask:nonzero{as_tuple=true}].
function methods.nonzero(t, opts)
  if opts ~= nil and not is_options(opts) then
    raise("nonzero: expected an options table {as_tuple=}, got " .. typename(opts))
  end
  local r = new(C.dp_nonzero(outp, t.p))
  if not (opts and opts.as_tuple) then return r end
  if t:dim() == 0 then return { torch.zeros({ r:size(0) }, { dtype = torch.int64, device = t.device }) } end
  local out = {}
  for d = 0, t:dim() - 1 do out[d + 1] = r:select(1, d) end
  return out
end
function methods.argwhere(t) return methods.nonzero(t) end

-- nonzero_static({size= [, fill_value=-1]}): nonzero's (size, ndim)
-- coordinates of a fixed count: the first size of them, the rows past the
-- count filled with fill_value (PyTorch 2's, for shapes known in advance;
-- here the count is read from the device as nonzero reads it).
function methods.nonzero_static(t, opts)
  local fn = "nonzero_static"
  if not is_options(opts) then raise(fn .. ": expected an options table {size= [, fill_value=-1]}, got " .. typename(opts)) end
  local size, fill = opts.size, opts.fill_value == nil and -1 or opts.fill_value
  if type(size) ~= "number" or size < 0 or size % 1 ~= 0 then
    raise(fn .. ": expected size to be a non-negative integer, got " .. tostring(size))
  end
  if type(fill) ~= "number" or fill % 1 ~= 0 then raise(fn .. ": expected fill_value to be an integer, got " .. tostring(fill)) end
  local r = methods.nonzero(t)
  local n = r:size(0)
  if n >= size then return r:narrow(0, 0, size):contiguous() end
  local out = torch.full({ size, t:dim() }, fill, { dtype = torch.int64, device = t.device })
  if n > 0 then out:narrow(0, 0, n):copy_(r) end
  return out
end
function methods.count_nonzero(t, dim) return t:ne(0):sum(dim) end

-- put_(index, source, accumulate=false): the element at row-major
-- position index[j] (negative from the end) becomes source[j]; with a
-- repeated index one of the writes wins.
function methods.put_(t, index, source, accumulate)
  if not is_tensor(index) then raise("put_: expected index to be a tensor, got " .. typename(index)) end
  if not is_tensor(source) then raise("put_: expected source to be a tensor, got " .. typename(source)) end
  if accumulate then raise("put_: accumulate=true is not supported (use index_add_ or scatter_add_)") end
  check(C.dp_put_into(t.p, index.p, source.p))
  return t
end
function methods.put(t, index, source, accumulate) return methods.put_(t:clone(), index, source, accumulate) end

return { binary = binary, UN = UN, BIN = BIN }
