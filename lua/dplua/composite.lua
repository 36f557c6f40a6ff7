-- dplua.composite: tensor operations written as compositions of others
-- (views, index_select, cat, the elementwise and reduction ops), so that
-- every device and autograd come with them: flip, roll, repeat and tile,
-- diagonal, logsumexp, the inverse trigonometric functions, meshgrid,
-- stacking helpers, products with a scaled sum (addmm, baddbmm), cumprod,
-- median and quantile, and the in-place random fills. PyTorch's names,
-- arguments and defaults; dplua/init.lua makes each method a torch.NAME
-- function too.
local B = require("dplua.base")
local torch, methods = B.torch, B.methods
local raise, is_tensor, typename = B.raise, B.is_tensor, B.typename

local LN2, LN10 = math.log(2), math.log(10)

-- A dim of t (negative from the end) as a non-negative number.
local function dim_of(t, d, fn)
  local nd = math.max(t:dim(), 1)
  if type(d) ~= "number" or d % 1 ~= 0 or d < -nd or d >= nd then
    raise(string.format("%s: dim %s is out of range for a tensor of %d dims", fn, tostring(d), t:dim()))
  end
  return d < 0 and d + nd or d
end

-- A dim argument that may be one number or a list (or nil: every dim).
local function dims_of(t, dims, fn)
  if dims == nil then
    local all = {}
    for d = 0, t:dim() - 1 do all[#all + 1] = d end
    return all
  end
  if type(dims) == "number" then return { dim_of(t, dims, fn) } end
  if type(dims) ~= "table" then raise(fn .. ": expected dims to be a number or a list, got " .. typename(dims)) end
  local out, seen = {}, {}
  for i, d in ipairs(dims) do
    out[i] = dim_of(t, d, fn)
    if seen[out[i]] then raise(string.format("%s: dim %d appears twice", fn, out[i])) end
    seen[out[i]] = true
  end
  return out
end

local function int64(values, device) return torch.tensor(values, { dtype = torch.int64, device = device }) end

-- Argument checks: a tensor, a number, an integer (default when nil).
local function want_tensor(v, fn, what)
  if not is_tensor(v) then raise(string.format("%s: expected %s to be a tensor, got %s", fn, what, typename(v))) end
  return v
end
local function want_number(v, fn, what, default)
  if v == nil then v = default end
  if type(v) ~= "number" then raise(string.format("%s: expected %s to be a number, got %s", fn, what, typename(v))) end
  return v
end
local function want_int(v, fn, what, default, min)
  v = want_number(v, fn, what, default)
  if v % 1 ~= 0 or (min and v < min) or v ~= v or math.abs(v) == math.huge then
    raise(string.format("%s: expected %s to be an integer%s, got %s", fn, what, min and (" >= " .. min) or "",
                        tostring(v)))
  end
  return v
end
-- a tensor or a number operand
local function want_operand(v, fn, what)
  if not is_tensor(v) and type(v) ~= "number" then
    raise(string.format("%s: expected %s to be a tensor or a number, got %s", fn, what, typename(v)))
  end
  return v
end

local function want_float(fn, t)
  if not t.dtype.is_floating_point then
    raise(string.format("%s: expected a floating point tensor, got %s", fn, t.dtype.name))
  end
  return t
end

---------------------------------------------------------------- log-sum-exp

-- The maximum over dims (kept), detached, with infinities replaced by 0 so
-- that x - m stays finite where every entry is infinite.
local function safe_max(t, dims)
  local m = t:detach()
  for _, d in ipairs(dims) do m = m:max(d, true) end
  return m:masked_fill(m:abs():eq(math.huge), 0)
end

-- logsumexp(dim [, keepdim=false]): log(sum(exp(t))) over dim (a number or
-- a list) without overflow; integers as float32.
function methods.logsumexp(t, dim, keepdim)
  local fn = "logsumexp"
  if dim == nil then raise(fn .. ": expected dim (a number or a list of dims)") end
  if not t.dtype.is_floating_point then t = t:float() end
  local dims = dims_of(t, dim, fn)
  local m = safe_max(t, dims)
  local out = (t - m):exp()
  for _, d in ipairs(dims) do out = out:sum(d, true) end
  out = out:log() + m
  if keepdim then return out end
  table.sort(dims, function(a, b) return a > b end)
  for _, d in ipairs(dims) do out = out:squeeze(d) end
  return out
end

-- logaddexp(other): log(exp(t) + exp(other)), broadcast, without overflow.
function methods.logaddexp(t, other)
  local m = torch.maximum(t, other):detach()
  m = m:masked_fill(m:abs():eq(math.huge), 0)
  return ((t - m):exp() + (other - m):exp()):log() + m
end

---------------------------------------------------------------- elementwise

function methods.log2(t) return want_float("log2", t):log() / LN2 end
function methods.log10(t) return want_float("log10", t):log() / LN10 end
function methods.exp2(t) return (want_float("exp2", t) * LN2):exp() end
function methods.tan(t) return want_float("tan", t):sin() / t:cos() end
function methods.sinh(t)
  want_float("sinh", t)
  return (t:exp() - (-t):exp()) * 0.5
end
function methods.cosh(t)
  want_float("cosh", t)
  return (t:exp() + (-t):exp()) * 0.5
end
function methods.atan(t) return torch.atan2(want_float("atan", t), torch.ones_like(t)) end
function methods.asin(t) return torch.atan2(want_float("asin", t), (1 - t * t):sqrt()) end
function methods.acos(t) return torch.atan2((1 - want_float("acos", t) * t):sqrt(), t) end
-- asinh through |t| so that large negative values do not cancel
function methods.asinh(t)
  want_float("asinh", t)
  local a = t:abs()
  return t:sign() * (a + (a * a + 1):sqrt()):log()
end
function methods.acosh(t) return (want_float("acosh", t) + (t * t - 1):sqrt()):log() end
function methods.atanh(t) return (want_float("atanh", t):log1p() - (-t):log1p()) * 0.5 end
function methods.trunc(t) return t.dtype.is_floating_point and t:sign() * t:abs():floor() or t:clone() end
methods.fix = methods.trunc
function methods.frac(t) return t - methods.trunc(want_float("frac", t)) end
function methods.hypot(t, other)
  want_operand(other, "hypot", "other")
  return (t * t + other * other):sqrt()
end
-- xlogy(other): t log(other), 0 where t is 0 (even where other is 0 or NaN)
function methods.xlogy(t, other)
  want_operand(other, "xlogy", "other")
  if not is_tensor(other) then other = torch.full_like(t, other) end
  local zero = t:eq(0)
  return torch.where(zero, 0, t * torch.where(zero, 1, other):log())
end
-- logit([eps]): log(p / (1 - p)), p clamped to [eps, 1 - eps] when given
function methods.logit(t, eps)
  want_float("logit", t)
  if type(eps) == "table" then eps = eps.eps end
  if eps ~= nil then t = t:clamp(want_number(eps, "logit", "eps"), 1 - eps) end
  return t:log() - (1 - t):log()
end
-- nan_to_num([nan=0, posinf, neginf]) or {nan=, posinf=, neginf=}: the
-- infinities become the dtype's largest and smallest finite values.
function methods.nan_to_num(t, nan, posinf, neginf)
  if type(nan) == "table" then nan, posinf, neginf = nan.nan, nan.posinf, nan.neginf end
  if not t.dtype.is_floating_point then return t:clone() end
  local big = ({ float32 = 3.4028234663852886e38, bfloat16 = 3.3895313892515355e38 })[t.dtype.name] or 1.7976931348623157e308
  local out = t:masked_fill(t:ne(t), nan or 0)
  out = out:masked_fill(out:eq(math.huge), posinf or big)
  return out:masked_fill(out:eq(-math.huge), neginf or -big)
end

---------------------------------------------------------------- rearranging

-- flip(dims): the order of elements along each of dims reversed.
function methods.flip(t, dims, ...)
  if type(dims) == "number" and select("#", ...) > 0 then dims = { dims, ... } end
  local out = t
  for _, d in ipairs(dims_of(t, dims == nil and {} or dims, "flip")) do
    local n = t:size(d)
    if n > 1 then out = out:index_select(d, torch.arange(n - 1, -1, -1, { dtype = torch.int64, device = t.device })) end
  end
  if out == t then out = t:clone() end
  return out
end
function methods.fliplr(t) return methods.flip(t, { 1 }) end
function methods.flipud(t) return methods.flip(t, { 0 }) end

-- roll(shifts [, dims]): elements shifted along dims (a number or a list
-- paired with shifts), those past the end coming round to the start;
-- without dims over the flattened tensor, its shape kept.
function methods.roll(t, shifts, dims)
  local fn = "roll"
  if dims == nil then
    if type(shifts) ~= "number" then raise(fn .. ": without dims, expected shifts to be one number") end
    return methods.roll(t:reshape(-1), shifts, 0):view(t:size())
  end
  if type(shifts) == "number" then shifts = { shifts } end
  local ds = dims_of(t, dims, fn)
  if type(shifts) ~= "table" or #shifts ~= #ds then
    raise(string.format("%s: expected as many shifts as dims, got %d and %d", fn, type(shifts) == "table" and #shifts or 0, #ds))
  end
  local out = t
  for i, d in ipairs(ds) do
    local n = t:size(d)
    local s = n > 0 and shifts[i] % n or 0
    if s ~= 0 then out = torch.cat({ out:narrow(d, n - s, s), out:narrow(d, 0, n - s) }, d) end
  end
  if out == t then out = t:clone() end
  return out
end

-- rot90([k=1, dims={0, 1}]): rotated k quarter turns from dims[1] towards dims[2].
function methods.rot90(t, k, dims)
  local fn = "rot90"
  k, dims = want_int(k, fn, "k", 1) % 4, dims or { 0, 1 }
  if type(dims) ~= "table" or #dims ~= 2 then raise(fn .. ": expected dims to be a list of two dims") end
  local a, b = dim_of(t, dims[1], fn), dim_of(t, dims[2], fn)
  if a == b then raise(fn .. ": expected two different dims, got " .. a .. " twice") end
  if k == 1 then return methods.flip(t, { b }):transpose(a, b) end
  if k == 2 then return methods.flip(t, { a, b }) end
  if k == 3 then return methods.flip(t, { a }):transpose(a, b) end
  return t:clone()
end

-- unbind([dim=0]): the slices along dim, as a Lua list of views.
function methods.unbind(t, dim)
  local d = dim_of(t, dim or 0, "unbind")
  local out = {}
  for i = 0, t:size(d) - 1 do out[i + 1] = t:select(d, i) end
  return out
end

-- movedim(source, destination): the dims of source (a number or a list)
-- moved to the places of destination, the others keeping their order.
function methods.movedim(t, source, destination)
  local fn = "movedim"
  local src, dst = dims_of(t, source, fn), dims_of(t, destination, fn)
  if #src ~= #dst then
    raise(string.format("%s: expected as many source as destination dims, got %d and %d", fn, #src, #dst))
  end
  local nd, perm, taken, rest = t:dim(), {}, {}, {}
  for i = 1, #src do perm[dst[i] + 1] = src[i]; taken[src[i]] = true end
  for d = 0, nd - 1 do if not taken[d] then rest[#rest + 1] = d end end
  local r = 1
  for i = 1, nd do
    if perm[i] == nil then perm[i] = rest[r]; r = r + 1 end
  end
  return t:permute(perm)
end
methods.moveaxis = methods.movedim
function methods.swapaxes(t, a, b) return t:transpose(a, b) end
methods.swapdims = methods.swapaxes

-- repeat(sizes...) (t["repeat"](t, ...): repeat is a Lua keyword; tile is
-- the same for as many sizes as dims): t copied sizes[i] times along dim
-- i, leading sizes adding dims.
local function repeat_sizes(fn, sizes, ...)
  if type(sizes) == "number" then sizes = { sizes, ... } end
  if type(sizes) ~= "table" then raise(fn .. ": expected sizes, got " .. typename(sizes)) end
  for _, s in ipairs(sizes) do
    if type(s) ~= "number" or s < 0 or s % 1 ~= 0 then
      raise(string.format("%s: expected non-negative integer sizes, got %s", fn, tostring(s)))
    end
  end
  return sizes
end
local function repeat_of(t, sizes)
  local lead = #sizes - t:dim()
  local shape = t:size()
  for _ = 1, lead do table.insert(shape, 1, 1) end
  local view, expanded, out = {}, {}, {}
  for i, s in ipairs(sizes) do
    view[#view + 1], view[#view + 2] = 1, shape[i]
    expanded[#expanded + 1], expanded[#expanded + 2] = s, shape[i]
    out[i] = s * shape[i]
  end
  return t:reshape(view):expand(expanded):reshape(out)
end
methods["repeat"] = function(t, sizes, ...)
  sizes = repeat_sizes("repeat", sizes, ...)
  if #sizes < t:dim() then
    raise(string.format("repeat: expected at least as many sizes as dims (%d), got %d", t:dim(), #sizes))
  end
  return repeat_of(t, sizes)
end
function methods.tile(t, sizes, ...)
  sizes = repeat_sizes("tile", sizes, ...)
  local full = {}
  for _ = 1, t:dim() - #sizes do full[#full + 1] = 1 end
  for _, s in ipairs(sizes) do full[#full + 1] = s end
  return repeat_of(t, full)
end

-- repeat_interleave(repeats [, dim, {output_size=}]): each element (or
-- slice along dim) repeated repeats times (a number, or one count each);
-- without dim over the flattened tensor. torch.repeat_interleave(counts)
-- alone gives 0, 1, ... each repeated its count.
function methods.repeat_interleave(t, repeats, dim, opts)
  local fn = "repeat_interleave"
  if repeats == nil then
    if t.dtype ~= torch.int64 or t:dim() > 1 then raise(fn .. ": expected repeats to be an int64 tensor of counts") end
    return methods.repeat_interleave(torch.arange(t:numel(), { dtype = torch.int64, device = t.device }), t, 0)
  end
  if type(dim) == "table" then dim, opts = nil, dim end
  if dim == nil then t, dim = t:reshape(-1), 0 end
  local d = dim_of(t, dim, fn)
  local n = t:dim() > 0 and t:size(d) or 1
  local counts
  if is_tensor(repeats) then
    if repeats:dim() > 1 or (repeats:numel() ~= n and repeats:numel() ~= 1) then
      raise(string.format("%s: expected one count or %d counts, got repeats of shape [%s]", fn, n,
                          table.concat(repeats:size(), ", ")))
    end
    counts = repeats:reshape(-1):tolist()
    if #counts == 1 then repeats = counts[1]; counts = nil end
  end
  local o = { dtype = torch.int64, device = t.device }
  local index
  if counts == nil then
    local r = want_int(repeats, fn, "repeats", nil, 0)
    index = torch.arange(n, o):view(n, 1):expand(n, r):reshape(-1)
  else
    local pieces = {}
    for i = 0, n - 1 do pieces[i + 1] = torch.full({ want_int(counts[i + 1], fn, "a count", nil, 0) }, i, o) end
    index = torch.cat(pieces, 0)
  end
  return t:index_select(d, index)
end

---------------------------------------------------------------- diagonals

-- diagonal([offset=0, dim1=0, dim2=1]) (or {offset=, dim1=, dim2=}): the
-- entries (i, i + offset) of dims dim1 and dim2, as a last dim: a view, as
-- PyTorch's, where autograd records nothing; a copy where it records.
-- The diagonal's elements: t with dims a and b moved last and flattened
-- into one (moved's other dims, then n1 * n2), and their positions there
local function diagonal_layout(t, offset, dim1, dim2, fn)
  if type(offset) == "table" then offset, dim1, dim2 = offset.offset, offset.dim1, offset.dim2 end
  offset = want_int(offset, fn, "offset", 0)
  if t:dim() < 2 then raise(fn .. ": expected a tensor of at least 2 dims, got " .. t:dim()) end
  local a, b = dim_of(t, dim1 or 0, fn), dim_of(t, dim2 or 1, fn)
  if a == b then raise(fn .. ": expected two different dims, got " .. a .. " twice") end
  local moved = methods.movedim(t, { a, b }, { -2, -1 })
  local n1, n2 = moved:size(-2), moved:size(-1)
  local r0, c0 = math.max(0, -offset), math.max(0, offset)
  local index = {}
  for i = 0, math.min(n1 - r0, n2 - c0) - 1 do index[#index + 1] = (r0 + i) * n2 + c0 + i end
  local shape = moved:size()
  shape[#shape] = nil
  shape[#shape] = n1 * n2
  return moved:reshape(shape), int64(index, t.device), moved, a, b
end

function methods.diagonal(t, offset, dim1, dim2)
  local flat, index = diagonal_layout(t, offset, dim1, dim2, "diagonal")
  if t.requires_grad and torch.is_grad_enabled() then return flat:index_select(-1, index) end
  -- nothing recorded: a view of t's storage, as PyTorch's, so that
  -- t:diagonal():fill_(v) and copy_ write into t
  if type(offset) == "table" then offset, dim1, dim2 = offset.offset, offset.dim1, offset.dim2 end
  offset = offset or 0
  local a, b = dim_of(t, dim1 or 0, "diagonal"), dim_of(t, dim2 or 1, "diagonal")
  local size, stride = t:size(), t:stride()
  local start = t:storage_offset() + math.max(0, -offset) * stride[a + 1] + math.max(0, offset) * stride[b + 1]
  local vsize, vstride = {}, {}
  for d = 1, #size do
    if d ~= a + 1 and d ~= b + 1 then vsize[#vsize + 1], vstride[#vstride + 1] = size[d], stride[d] end
  end
  vsize[#vsize + 1], vstride[#vstride + 1] = index:numel(), stride[a + 1] + stride[b + 1]
  return t:as_strided(vsize, vstride, start)
end

-- diagonal_scatter(src [, offset = 0, dim1 = 0, dim2 = 1]): t with that
-- diagonal replaced by src (of the diagonal's shape), a new tensor
function methods.diagonal_scatter(t, src, offset, dim1, dim2)
  local fn = "diagonal_scatter"
  local flat, index, moved, a, b = diagonal_layout(t, offset, dim1, dim2, fn)
  src = want_tensor(src, fn, "src")
  local want = flat:size()
  want[#want] = index:numel()
  if table.concat(src:size(), ",") ~= table.concat(want, ",") then
    raise(string.format("%s: expected src of the diagonal's shape [%s], got [%s]", fn, table.concat(want, ", "),
                        table.concat(src:size(), ", ")))
  end
  local out = flat:index_copy(flat:dim() - 1, index, src:to(t.dtype))
  return methods.movedim(out:reshape(moved:size()), { -2, -1 }, { a, b })
end

-- narrow_copy(dim, start, length): narrow's elements in a tensor of their own
function methods.narrow_copy(t, dim, start, length) return t:narrow(dim, start, length):clone() end

-- frexp(): the mantissa (t's dtype, |m| in [0.5, 1)) and the exponent
-- (int32) with t = m * 2^e; 0, inf and NaN give themselves and 0
function methods.frexp(t)
  local x = want_float("frexp", t):detach()
  local finite = x:isfinite():logical_and(x:ne(0))
  local safe = torch.where(finite, x, 1):to(torch.float64)
  local e = safe:abs():log2():floor() + 1
  -- x * 2^-e, in two exact halves (2^-e alone overflows for subnormal x)
  local function scaled(k)
    local half = (-k / 2):floor()
    return safe * torch.full_like(k, 2):pow(half) * torch.full_like(k, 2):pow(-k - half)
  end
  -- log2 may land one off at the edges: put the mantissa into [0.5, 1)
  local m = scaled(e)
  e = e + m:abs():ge(1):to(e.dtype) - m:abs():lt(0.5):to(e.dtype)
  m = scaled(e)
  return torch.where(finite, m, x:to(torch.float64)):to(t.dtype), torch.where(finite, e, 0):to(torch.int32)
end

-- bitwise_left_shift(other), bitwise_right_shift(other): integer tensors
-- shifted by other bits (a tensor or a number); the right shift is
-- arithmetic (rounds toward -inf), as PyTorch's on signed integers
local function shift(t, other, fn, left)
  t = want_tensor(t, fn, "input")
  if t.dtype.is_floating_point or t.dtype == torch.bool then
    raise(fn .. ": expected an integer tensor, got " .. tostring(t.dtype))
  end
  local bits = torch.is_tensor(other) and other or torch.tensor(want_int(other, fn, "other"), { dtype = torch.int64, device = t.device })
  if bits.dtype.is_floating_point then raise(fn .. ": expected integer shifts, got " .. tostring(bits.dtype)) end
  local width = torch.iinfo(t.dtype).bits
  local n = bits:to(torch.int64)
  local out_of_range = n:lt(0):logical_or(n:ge(width))
  n = torch.where(out_of_range, 0, n)
  -- by 2^h, then by 2^(n - h): 2^63 itself is no int64
  local h = n:div(2, { rounding_mode = "floor" })
  local p1, p2 = torch.full_like(n, 2):pow(h), torch.full_like(n, 2):pow(n - h)
  local r
  if left then
    r = t * p1 * p2
  else
    r = t:div(p1, { rounding_mode = "floor" }):div(p2, { rounding_mode = "floor" })
  end
  -- shifted out entirely: 0, or -1 for a negative number shifted right
  local gone = left and torch.zeros_like(r) or torch.where(t:lt(0), -1, 0):to(r.dtype)
  return torch.where(out_of_range, gone, r):to(t.dtype)
end
function methods.bitwise_left_shift(t, other) return shift(t, other, "bitwise_left_shift", true) end
function methods.bitwise_right_shift(t, other) return shift(t, other, "bitwise_right_shift", false) end
function methods.bitwise_left_shift_(t, other) return t:copy_(shift(t, other, "bitwise_left_shift_", true)) end
function methods.bitwise_right_shift_(t, other) return t:copy_(shift(t, other, "bitwise_right_shift_", false)) end

-- diag([diagonal=0]): of a vector, the square matrix holding it on that
-- diagonal; of a matrix, that diagonal.
function methods.diag(t, k)
  local fn = "diag"
  k = want_int(k, fn, "diagonal", 0)
  if t:dim() == 2 then return methods.diagonal(t, k):clone() end   -- (a copy, as PyTorch's, where diagonal is a view)
  if t:dim() ~= 1 then raise(fn .. ": expected a 1-D or 2-D tensor, got " .. t:dim() .. " dims") end
  local n = t:size(0)
  local m = n + math.abs(k)
  local index = {}
  for i = 0, n - 1 do index[i + 1] = (i + math.max(0, -k)) * m + i + math.max(0, k) end
  return torch.zeros(m * m, { dtype = t.dtype, device = t.device }):index_copy(0, int64(index, t.device), t):view(m, m)
end

function methods.trace(t)
  if t:dim() ~= 2 then raise("trace: expected a matrix, got " .. t:dim() .. " dims") end
  return methods.diagonal(t):sum()
end

-- outer(v): the products of t's and v's entries, (n, m); ger is its old name.
function methods.outer(t, v)
  if not is_tensor(t) or not is_tensor(v) or t:dim() ~= 1 or v:dim() ~= 1 then raise("outer: expected two 1-D tensors") end
  return t:view(-1, 1) * v:view(1, -1)
end
methods.ger = methods.outer

---------------------------------------------------------------- products with a sum

-- The scaled sum beta * input + alpha * product of addmm, addbmm's
-- cousins: beta = 0 ignores input (NaN included), as PyTorch.
local function scaled_sum(input, product, opts, fn)
  local beta, alpha = 1, 1
  if opts ~= nil then
    if type(opts) ~= "table" then raise(fn .. ": expected options {beta=, alpha=}, got " .. typename(opts)) end
    beta, alpha = opts.beta or 1, opts.alpha or 1
  end
  if alpha ~= 1 then product = product * alpha end
  if beta == 0 then return product + torch.zeros_like(input) end
  return (beta == 1 and input or input * beta) + product
end
function methods.addmm(t, m1, m2, opts) return scaled_sum(t, torch.mm(m1, m2), opts, "addmm") end
function methods.addmv(t, m, v, opts) return scaled_sum(t, torch.mv(m, v), opts, "addmv") end
function methods.addbmm(t, b1, b2, opts) return scaled_sum(t, torch.bmm(b1, b2):sum(0), opts, "addbmm") end
function methods.baddbmm(t, b1, b2, opts) return scaled_sum(t, torch.bmm(b1, b2), opts, "baddbmm") end
function methods.addr(t, v1, v2, opts) return scaled_sum(t, methods.outer(v1, v2), opts, "addr") end

-- tensordot(other [, dims=2]): the sum over t's last dims and other's
-- first (dims a number), or over the dims of {dims_t, dims_other}.
function methods.tensordot(t, other, dims)
  local fn = "tensordot"
  want_tensor(other, fn, "other")
  dims = dims or 2
  local da, db
  if type(dims) == "number" then
    want_int(dims, fn, "dims", nil, 0)
    if dims > t:dim() or dims > other:dim() then
      raise(string.format("%s: cannot contract %d dims of tensors of %d and %d dims", fn, dims, t:dim(), other:dim()))
    end
    da, db = {}, {}
    for i = 1, dims do da[i] = t:dim() - dims + i - 1; db[i] = i - 1 end
  elseif type(dims) == "table" and #dims == 2 then
    da, db = dims_of(t, dims[1], fn), dims_of(other, dims[2], fn)
  else
    raise(fn .. ": expected dims to be a number or a pair of lists")
  end
  if #da ~= #db then raise(string.format("%s: expected as many dims of each, got %d and %d", fn, #da, #db)) end
  local ca, cb, K = {}, {}, 1
  for i = 1, #da do
    if t:size(da[i]) ~= other:size(db[i]) then
      raise(string.format("%s: contracted dims differ in size: %d (dim %d) and %d (dim %d)", fn, t:size(da[i]), da[i],
                          other:size(db[i]), db[i]))
    end
    ca[da[i]], cb[db[i]], K = true, true, K * t:size(da[i])
  end
  local pa, pb, out, M, N = {}, {}, {}, 1, 1
  for d = 0, t:dim() - 1 do if not ca[d] then pa[#pa + 1] = d; out[#out + 1] = t:size(d); M = M * t:size(d) end end
  for _, d in ipairs(da) do pa[#pa + 1] = d end
  for _, d in ipairs(db) do pb[#pb + 1] = d end
  for d = 0, other:dim() - 1 do if not cb[d] then pb[#pb + 1] = d; out[#out + 1] = other:size(d); N = N * other:size(d) end end
  local r = t:permute(pa):reshape(M, K):mm(other:permute(pb):reshape(K, N))
  return r:reshape(out)
end

---------------------------------------------------------------- scans and order statistics

-- cumprod(dim): running products along dim, one product a step (exact
-- where a zero or a sign makes exp(cumsum(log)) fail), with gradients.
function methods.cumprod(t, dim)
  local d = dim_of(t, dim, "cumprod")
  if t:dim() == 0 then return t:clone() end
  local n = t:size(d)
  if n == 0 then return t:clone() end
  local parts, run = {}, t:narrow(d, 0, 1)
  parts[1] = run
  for i = 1, n - 1 do
    run = run * t:narrow(d, i, 1)
    parts[i + 1] = run
  end
  return torch.cat(parts, d)
end

-- median([dim [, keepdim=false]]): the lower median ((n - 1) // 2 of the
-- sorted values); over a dim, with its index as PyTorch's.
function methods.median(t, dim, keepdim)
  if dim == nil then
    local flat = t:reshape(-1)
    return flat:sort(0):narrow(0, math.floor((flat:numel() - 1) / 2), 1):reshape({})
  end
  local d = dim_of(t, dim, "median")
  local v, i = t:sort(d)
  local k = math.floor(((t:dim() > 0 and t:size(d) or 1) - 1) / 2)
  v, i = v:narrow(d, k, 1), i:narrow(d, k, 1)
  if not keepdim and t:dim() > 0 then v, i = v:squeeze(d), i:squeeze(d) end
  return v, i
end

-- quantile(q [, dim, keepdim=false]) (or {dim=, keepdim=}): PyTorch's
-- linear interpolation between the sorted values; q a number, a list or
-- a 1-D tensor (its dim first in the result). nanquantile the same over
-- the values that are not NaN (NaN where none is).
local function quantiles(fn, t, q, dim, keepdim, ignore_nan)
  if type(dim) == "table" then dim, keepdim = dim.dim, dim.keepdim end
  want_float(fn, t)
  local scalar = type(q) == "number"
  local qs = scalar and { q } or (is_tensor(q) and q:reshape(-1):tolist() or q)
  if type(qs) ~= "table" or #qs == 0 then raise(fn .. ": expected q to be a number, a list or a 1-D tensor") end
  local x, d = t, nil
  if dim == nil then x, d = t:reshape(-1), 0 else d = dim_of(t, dim, fn) end
  local sorted = x:sort(d)
  -- the last position among the values counted, per slice (NaN sort last)
  local last
  if ignore_nan then
    last = (x:eq(x):to(torch.int64):sum(d, true) - 1):clamp(0, nil):to(x.dtype)
  else
    local shape = sorted:size()
    shape[d + 1] = 1
    last = torch.full(shape, math.max(x:size(d) - 1, 0), { dtype = x.dtype, device = x.device })
  end
  local parts = {}
  for i, p in ipairs(qs) do
    if type(p) ~= "number" or p < 0 or p > 1 then raise(fn .. ": expected q in [0, 1], got " .. tostring(p)) end
    local pos = last * p
    local lo = pos:floor()
    local hi = torch.minimum(lo + 1, last)
    local a, b = sorted:gather(d, lo:to(torch.int64)), sorted:gather(d, hi:to(torch.int64))
    parts[i] = a + (b - a) * (pos - lo)
    if ignore_nan then parts[i] = torch.where(x:eq(x):any(d, true), parts[i], 0 / 0) end
  end
  local out = torch.stack(parts, 0)          -- (Q, ..., 1, ...)
  if dim == nil then
    out = out:reshape(#qs)
    if keepdim then
      local shape = { #qs }
      for _ = 1, t:dim() do shape[#shape + 1] = 1 end
      out = out:reshape(shape)
    end
  elseif not keepdim then
    out = out:squeeze(d + 1)
  end
  return scalar and out:select(0, 0) or out
end
function methods.quantile(t, q, dim, keepdim) return quantiles("quantile", t, q, dim, keepdim, false) end
function methods.nanquantile(t, q, dim, keepdim) return quantiles("nanquantile", t, q, dim, keepdim, true) end

-- nansum / nanmean([dim [, keepdim]]): the NaNs left out.
function methods.nansum(t, dim, keepdim)
  local z = t:masked_fill(t:ne(t), 0)
  if dim == nil then return z:sum() end
  return z:sum(dim, keepdim)
end
function methods.nanmean(t, dim, keepdim)
  local count = t:eq(t):to(t.dtype)
  if dim == nil then return methods.nansum(t) / count:sum() end
  return methods.nansum(t, dim, keepdim) / count:sum(dim, keepdim)
end

-- var_mean / std_mean(...): var's (std's) arguments; the pair (var, mean).
local function with_mean(moment)
  return function(t, dim, opts)
    local o, d = opts, dim
    if B.is_options(dim) then o, d = dim, dim.dim end
    local keepdim = o == true or (type(o) == "table" and o.keepdim == true)
    return moment(t, dim, opts), d == nil and t:mean() or t:mean(d, keepdim)
  end
end
methods.var_mean = with_mean(methods.var)
methods.std_mean = with_mean(methods.std)

---------------------------------------------------------------- selection

-- masked_select(mask): the elements where mask (broadcast with t) is
-- true, 1-D.
function methods.masked_select(t, mask)
  if not is_tensor(mask) or mask.dtype ~= torch.bool then raise("masked_select: expected a bool mask tensor") end
  local a, m = torch.broadcast_tensors(t, mask)
  return a[m]
end

-- take(index): t's elements at the row-major positions index holds, of
-- index's shape.
function methods.take(t, index)
  if not is_tensor(index) then raise("take: expected index to be a tensor, got " .. typename(index)) end
  return t:reshape(-1):index_select(0, index:reshape(-1)):view(index:size())
end

-- take_along_dim(indices [, dim]): gather along dim after broadcasting t
-- and indices in the other dims; without dim, take over the flattened t.
function methods.take_along_dim(t, indices, dim)
  want_tensor(indices, "take_along_dim", "indices")
  if dim == nil then return t:reshape(-1):index_select(0, indices:reshape(-1)) end
  local d = dim_of(t, dim, "take_along_dim")
  local ts, is = t:size(), indices:size()
  if #ts ~= #is then raise("take_along_dim: expected input and indices of one number of dims") end
  local a, b = {}, {}
  for i = 1, #ts do
    local s = math.max(ts[i], is[i])
    a[i], b[i] = i == d + 1 and ts[i] or s, i == d + 1 and is[i] or s
  end
  return t:expand(a):gather(d, indices:expand(b))
end

---------------------------------------------------------------- random fills

-- uniform_([from=0, to=1]), normal_([mean=0, std=1]), bernoulli_([p=0.5]):
-- t refilled in place from torch's stream; bernoulli([p]) draws 1 with
-- probability t (or p), a new tensor.
function methods.uniform_(t, a, b)
  a, b = want_number(a, "uniform_", "from", 0), want_number(b, "uniform_", "to", 1)
  return t:copy_(torch.rand_like(want_float("uniform_", t)) * (b - a) + a)
end
function methods.normal_(t, mean, std)
  mean, std = want_number(mean, "normal_", "mean", 0), want_number(std, "normal_", "std", 1)
  return t:copy_(torch.randn_like(want_float("normal_", t)) * std + mean)
end
function methods.bernoulli(t, p)
  want_float("bernoulli", t)
  if p ~= nil then want_operand(p, "bernoulli", "p") end
  local probs = p == nil and t or (is_tensor(p) and p or torch.full_like(t, p))
  return torch.rand_like(t):lt(probs):to(t.dtype)
end
function methods.bernoulli_(t, p)
  local probs = p == nil and 0.5 or want_operand(p, "bernoulli_", "p")
  return t:copy_(torch.rand_like(want_float("bernoulli_", t)):lt(probs):to(t.dtype))
end


-- poisson(rates): a Poisson count for each rate (floating, as the rates),
-- without a gradient. Rates below 10 by Knuth's product of uniforms (as
-- many steps as the largest count); from 10 up by Hoermann's transformed
-- rejection (PTRS), each element drawing until one candidate is accepted.
local function poisson_small(rate)
  local limit = (-rate):exp()
  local product, count = torch.ones_like(rate), torch.zeros_like(rate)
  while true do
    product = product * torch.rand_like(rate)
    local more = product:gt(limit)
    if not more:any():item() then return count end
    count = count + more:to(rate.dtype)
  end
end
local function poisson_large(rate, waiting)
  local slam, loglam = rate:sqrt(), rate:log()
  local b = slam * 2.53 + 0.931
  local a = b * 0.02483 - 0.059
  local inv_alpha = (b - 3.4):reciprocal() * 1.1328 + 1.1239
  local vr = 0.9277 - (b - 2):reciprocal() * 3.6224
  local out = torch.zeros_like(rate)
  while waiting:any():item() do
    local u, v = torch.rand_like(rate) - 0.5, torch.rand_like(rate)
    local us = 0.5 - u:abs()
    local k = ((a * 2 / us + b) * u + rate + 0.43):floor()
    local quick = us:ge(0.07):logical_and(v:le(vr))
    local reject = k:lt(0):logical_or(us:lt(0.013):logical_and(v:gt(us)))
    local ks = k:clamp(0, nil)
    local accept = (v * inv_alpha / (a / us:square() + b)):log():le(-rate + ks * loglam - (ks + 1):lgamma())
    local take = waiting:logical_and(quick:logical_or(reject:logical_not():logical_and(accept)))
    out = torch.where(take, k, out)
    waiting = waiting:logical_and(take:logical_not())
  end
  return out
end
function torch.poisson(rates, generator)
  if generator ~= nil then return torch._drawn("poisson", generator, torch.poisson, rates) end
  want_float("poisson", want_tensor(rates, "poisson", "rates"))
  if not rates:ge(0):logical_and(rates:lt(math.huge)):all():item() then
    raise("poisson: expected the rates to be non-negative and finite")
  end
  return torch.no_grad(function()
    local large = rates:ge(10)
    local small = poisson_small(torch.where(large, 0, rates))
    if not large:any():item() then return small end
    return torch.where(large, poisson_large(torch.where(large, rates, 10), large), small)
  end)
end

---------------------------------------------------------------- running maxima, log-sum-exp, k-th values

-- cummax / cummin(dim): the running maximum (minimum) along dim and the
-- index where it was reached (the last of equal values, as PyTorch).
local function running(fn, better)
  return function(t, dim)
    local d = dim_of(t, dim, fn)
    if t:dim() == 0 then return t:clone(), torch.zeros({}, { dtype = torch.int64, device = t.device }) end
    local n = t:size(d)
    local vals, idx = {}, {}
    local best = t:narrow(d, 0, 1)
    local at = torch.zeros_like(best, { dtype = torch.int64 })
    vals[1], idx[1] = best, at
    for i = 1, n - 1 do
      local x = t:narrow(d, i, 1)
      local take = better(x, best):logical_or(x:ne(x))       -- NaN propagates
      best = torch.where(take, x, best)
      at = torch.where(take, i, at)
      vals[i + 1], idx[i + 1] = best, at
    end
    return torch.cat(vals, d), torch.cat(idx, d)
  end
end
methods.cummax = running("cummax", function(x, best) return x:ge(best) end)
methods.cummin = running("cummin", function(x, best) return x:le(best) end)

-- logcumsumexp(dim): log of the running sums of exp along dim.
function methods.logcumsumexp(t, dim)
  local d = dim_of(t, dim, "logcumsumexp")
  if t:dim() == 0 then return t:clone() end
  local parts, run = {}, t:narrow(d, 0, 1)
  parts[1] = run
  for i = 1, t:size(d) - 1 do
    run = methods.logaddexp(run, t:narrow(d, i, 1))
    parts[i + 1] = run
  end
  return torch.cat(parts, d)
end

-- kthvalue(k [, dim=-1, keepdim=false]): the k-th smallest (1-based) and its index.
function methods.kthvalue(t, k, dim, keepdim)
  local d = dim_of(t, dim or -1, "kthvalue")
  local n = t:dim() > 0 and t:size(d) or 1
  if type(k) ~= "number" or k < 1 or k > n or k % 1 ~= 0 then
    raise(string.format("kthvalue: expected k in [1, %d], got %s", n, tostring(k)))
  end
  local v, i = t:sort(d)
  v, i = v:narrow(d, k - 1, 1), i:narrow(d, k - 1, 1)
  if not keepdim and t:dim() > 0 then v, i = v:squeeze(d), i:squeeze(d) end
  return v, i
end

---------------------------------------------------------------- products and distances

-- cross(other [, dim]): the cross product of 3-vectors along dim (the
-- first dim of size 3 when not given, as torch.cross).
function methods.cross(t, other, dim)
  want_tensor(other, "cross", "other")
  if dim == nil then
    for d = 0, t:dim() - 1 do if t:size(d) == 3 then dim = d; break end end
    if dim == nil then raise("cross: no dim of size 3") end
  end
  local d = dim_of(t, dim, "cross")
  if t:size(d) ~= 3 or other:size(d) ~= 3 then raise("cross: expected dim " .. d .. " of size 3 in both tensors") end
  local function c(x, i) return x:narrow(d, i, 1) end
  return torch.cat({ c(t, 1) * c(other, 2) - c(t, 2) * c(other, 1), c(t, 2) * c(other, 0) - c(t, 0) * c(other, 2),
                     c(t, 0) * c(other, 1) - c(t, 1) * c(other, 0) }, d)
end

-- kron(other): the Kronecker product, of as many dims as the larger.
function methods.kron(t, other)
  want_tensor(other, "kron", "other")
  local n = math.max(t:dim(), other:dim())
  local a, b = t, other
  while a:dim() < n do a = a:unsqueeze(0) end
  while b:dim() < n do b = b:unsqueeze(0) end
  local va, vb, out = {}, {}, {}
  for i = 0, n - 1 do
    va[#va + 1], va[#va + 2] = a:size(i), 1
    vb[#vb + 1], vb[#vb + 2] = 1, b:size(i)
    out[i + 1] = a:size(i) * b:size(i)
  end
  return (a:reshape(va) * b:reshape(vb)):reshape(out)
end

-- dist(other [, p=2]): the p-norm of t - other.
function methods.dist(t, other, p) return (t - want_operand(other, "dist", "other")):norm(p or 2) end

function methods.type_as(t, other) return t:to(want_tensor(other, "type_as", "other").dtype) end

---------------------------------------------------------------- splitting

-- tensor_split(sections or indices [, dim=0]): sections pieces, the
-- first size % sections one longer (numpy's array_split), or the pieces
-- between the given indices; a Lua list of views.
function methods.tensor_split(t, at, dim)
  local d = dim_of(t, dim or 0, "tensor_split")
  local n = t:size(d)
  local bounds = { 0 }
  if type(at) == "number" then
    want_int(at, "tensor_split", "sections", nil, 1)
    if at > n + 2 ^ 16 then
      raise(string.format("tensor_split: %d sections of %d entries are too many (at most the entries plus 65536)", at, n))
    end
    local base, extra = math.floor(n / at), n % at
    for i = 1, at do bounds[i + 1] = bounds[i] + base + (i <= extra and 1 or 0) end
  else
    local list = is_tensor(at) and at:reshape(-1):tolist() or at
    if type(list) ~= "table" then raise("tensor_split: expected a number of sections or a list of indices") end
    for _, i in ipairs(list) do want_int(i, "tensor_split", "an index") end
    for _, i in ipairs(list) do bounds[#bounds + 1] = math.max(bounds[#bounds], math.min(i < 0 and i + n or i, n)) end
    bounds[#bounds + 1] = n
  end
  local out = {}
  for i = 1, #bounds - 1 do out[i] = t:narrow(d, bounds[i], math.max(0, bounds[i + 1] - bounds[i])) end
  return out
end
function methods.hsplit(t, at) return methods.tensor_split(t, at, t:dim() == 1 and 0 or 1) end
function methods.vsplit(t, at) return methods.tensor_split(t, at, 0) end
function methods.dsplit(t, at) return methods.tensor_split(t, at, 2) end

---------------------------------------------------------------- logical and bitwise

function methods.logical_xor(t, other)
  if type(other) == "boolean" then other = other and 1 or 0 end
  want_operand(other, "logical_xor", "other")
  return t:ne(0):ne(is_tensor(other) and other:ne(0) or other ~= 0)
end

-- bitwise_and / or / xor / not of bool tensors (the logical ops) and of
-- integers (computed on the host: a GPU tensor makes a round trip).
local bit = require("bit")
local function bitwise(name, logical, op)
  return function(t, other)
    local unary = name == "bitwise_not"
    if not unary and not is_tensor(other) and type(other) ~= "number" and type(other) ~= "boolean" then
      raise(string.format("%s: expected other to be a tensor, a number or a boolean, got %s", name, typename(other)))
    end
    if unary then other = nil end
    if t.dtype == torch.bool and (other == nil or type(other) == "boolean" or (is_tensor(other) and other.dtype == torch.bool)) then
      return logical(t, other)
    end
    if type(other) == "boolean" then other = other and 1 or 0 end
    if type(other) == "number" and (other % 1 ~= 0 or math.abs(other) >= 2 ^ 53) then
      raise(string.format("%s: expected an integer other, got %s", name, tostring(other)))
    end
    if t.dtype.is_floating_point or (is_tensor(other) and other.dtype.is_floating_point) then
      raise(name .. ": expected integer or bool tensors, got " .. t.dtype.name)
    end
    local a = t
    local b = is_tensor(other) and other or nil
    if b then a, b = torch.broadcast_tensors(a, b) end
    local av, bv = a:reshape(-1):tolist(), b and b:reshape(-1):tolist()
    local out = {}
    local function int(v) return type(v) == "boolean" and (v and 1 or 0) or v end
    for i, v in ipairs(av) do
      local o = bv and bv[i]
      if o == nil then o = other end
      out[i] = op(int(v), int(o))
    end
    return torch.tensor(out, { dtype = t.dtype, device = t.device }):reshape(a:size())
  end
end
methods.bitwise_and = bitwise("bitwise_and", function(t, o) return t:logical_and(o) end, bit.band)
methods.bitwise_or = bitwise("bitwise_or", function(t, o) return t:logical_or(o) end, bit.bor)
methods.bitwise_xor = bitwise("bitwise_xor", function(t, o) return methods.logical_xor(t, o) end, bit.bxor)
methods.bitwise_not = bitwise("bitwise_not", function(t) return t:logical_not() end, function(v) return bit.bnot(v) end)

---------------------------------------------------------------- counting, on the host

-- These read the values back (a GPU tensor's with a copy), as they
-- produce shapes that depend on them.

local function host_values(t) return t:reshape(-1):cpu():tolist() end

-- The order of Lua values: numbers, booleans false < true, NaN last.
local function less(a, b)
  if type(a) == "boolean" then return (not a) and b end
  if a ~= a then return false end
  if b ~= b then return true end
  return a < b
end

-- unique([{sorted=true, return_inverse=false, return_counts=false, dim=}])
-- (or those as arguments in PyTorch's order): the distinct values, sorted,
-- then the inverse (each element's position among them) and the counts
-- when asked for; with dim, the distinct slices along dim.
function methods.unique(t, sorted, return_inverse, return_counts, dim)
  if type(sorted) == "table" then
    local o = sorted
    sorted, return_inverse, return_counts, dim = o.sorted, o.return_inverse, o.return_counts, o.dim
  end
  local keys, shape_out
  local d = dim ~= nil and dim_of(t, dim, "unique") or nil
  if d ~= nil then
    local moved = methods.movedim(t, d, 0)
    local n = moved:size(0)
    local rows = moved:reshape(n, -1):cpu():tolist()
    keys = rows
    shape_out = moved:size()
  else
    keys = host_values(t)
  end
  local function key_less(a, b)
    if type(a) ~= "table" then return less(a, b) end
    for i = 1, #a do
      if a[i] ~= b[i] then return less(a[i], b[i]) end
    end
    return false
  end
  local function same(a, b)
    if type(a) ~= "table" then return a == b end
    for i = 1, #a do if a[i] ~= b[i] then return false end end
    return true
  end
  local order = {}
  for i = 1, #keys do order[i] = i end
  table.sort(order, function(i, j)
    if key_less(keys[i], keys[j]) then return true end
    if key_less(keys[j], keys[i]) then return false end
    return i < j
  end)
  local uniq, inverse, counts = {}, {}, {}
  for _, i in ipairs(order) do
    local k = keys[i]
    if #uniq == 0 or not same(uniq[#uniq], k) then
      uniq[#uniq + 1] = k
      counts[#uniq] = 0
    end
    inverse[i] = #uniq - 1
    counts[#uniq] = counts[#uniq] + 1
  end
  local values
  if d ~= nil then
    shape_out[1] = #uniq
    values = methods.movedim(torch.tensor(uniq, { dtype = t.dtype }):reshape(shape_out), 0, d):to(t.device)
  else
    values = torch.tensor(uniq, { dtype = t.dtype, device = t.device })
  end
  local out = { values }
  if return_inverse then
    local inv = torch.tensor(inverse, { dtype = torch.int64, device = t.device })
    out[#out + 1] = d ~= nil and inv or inv:reshape(t:size())
  end
  if return_counts then out[#out + 1] = torch.tensor(counts, { dtype = torch.int64, device = t.device }) end
  return unpack(out)
end

-- bincount([weights, minlength=0]): how often each value of a 1-D
-- non-negative integer tensor occurs (or the sum of its weights).
function methods.bincount(t, weights, minlength)
  if type(weights) == "table" and not is_tensor(weights) then weights, minlength = weights.weights, weights.minlength end
  if t:dim() ~= 1 or t.dtype.is_floating_point or t.dtype == torch.bool then
    raise("bincount: expected a 1-D tensor of non-negative integers")
  end
  if weights ~= nil then want_tensor(weights, "bincount", "weights") end
  local vals, w = host_values(t), weights and host_values(weights)
  if w and #w ~= #vals then raise("bincount: expected weights of the input's length " .. #vals) end
  local n = want_int(minlength, "bincount", "minlength", 0, 0)
  for _, v in ipairs(vals) do
    if v < 0 then raise("bincount: expected non-negative values, got " .. v) end
    n = math.max(n, v + 1)
  end
  local dtype = weights and (weights.dtype == torch.float32 and torch.float32 or torch.float64) or torch.int64
  local out = torch.zeros(n, { dtype = dtype })
  if #vals > 0 then
    local add = w and torch.tensor(w, { dtype = dtype }) or torch.ones(#vals, { dtype = dtype })
    out = out:index_add(0, int64(vals), add)
  end
  return out:to(t.device)
end

-- histc([bins=100, min=0, max=0]) (or {bins=, min=, max=}): the counts
-- in bins equal bins from min to max (the data's own range when both are
-- 0); values outside are left out, max falls in the last bin.
function methods.histc(t, bins, lo, hi)
  if type(bins) == "table" then bins, lo, hi = bins.bins, bins.min, bins.max end
  bins = want_int(bins, "histc", "bins", 100, 1)
  lo, hi = want_number(lo, "histc", "min", 0), want_number(hi, "histc", "max", 0)
  want_float("histc", t)
  local vals = host_values(t)
  if lo == hi then
    lo, hi = math.huge, -math.huge
    for _, v in ipairs(vals) do lo, hi = math.min(lo, v), math.max(hi, v) end
    if #vals == 0 then lo, hi = 0, 0 end
    if lo == hi then lo, hi = lo - 1, hi + 1 end
  end
  if lo > hi then raise("histc: max must be larger than min") end
  local at = {}
  for _, v in ipairs(vals) do
    if v >= lo and v <= hi then at[#at + 1] = math.min(math.floor((v - lo) * bins / (hi - lo)), bins - 1) end
  end
  local out = torch.zeros(bins, { dtype = t.dtype })
  if #at > 0 then out = out:index_add(0, int64(at), torch.ones(#at, { dtype = t.dtype })) end
  return out:to(t.device)
end

-- searchsorted(sorted_sequence, values [, {right=false, side=}]): for each
-- value, the index at which it would be inserted to keep the sequence (or
-- each row of it, the values' matching row) sorted: the first such index,
-- or the last with right. bucketize(input, boundaries [, right]) is the same
-- with the arguments swapped.
function torch.searchsorted(seq, values, opts)
  want_tensor(seq, "searchsorted", "sorted_sequence")
  if type(values) ~= "number" then want_tensor(values, "searchsorted", "values") end
  local right = false
  if type(opts) == "table" then right = opts.right == true or opts.side == "right" elseif opts then right = true end
  if seq.dtype == torch.bool or seq:dim() == 0 then
    raise("searchsorted: expected a sorted sequence of numbers of at least one dim")
  end
  local scalar = type(values) == "number"
  if scalar then values = torch.tensor({ values }, { dtype = seq.dtype }) end
  if seq:dim() > 1 then
    local a, b = seq:size(), values:size()
    local same = #a == #b
    for i = 1, #a - 1 do same = same and a[i] == b[i] end
    if not same then
      raise(string.format("searchsorted: a sequence of several rows [%s] needs values with the same leading dims, got [%s]",
                          table.concat(a, ", "), table.concat(b, ", ")))
    end
  end
  if values.dtype == torch.bool then values = values:to(seq.dtype) end
  local rows = seq:dim() <= 1 and { host_values(seq) } or seq:reshape(-1, seq:size(-1)):cpu():tolist()
  local vals = values:reshape(-1):cpu():tolist()
  local per_row = seq:dim() <= 1 and #vals or values:size(-1)
  local out = {}
  for i, v in ipairs(vals) do
    local row = rows[seq:dim() <= 1 and 1 or math.floor((i - 1) / per_row) + 1]
    local a, b = 1, #row + 1
    while a < b do
      local m = math.floor((a + b) / 2)
      if (right and row[m] <= v) or (not right and row[m] < v) then a = m + 1 else b = m end
    end
    out[i] = a - 1
  end
  local r = torch.tensor(out, { dtype = torch.int64, device = seq.device })
  if scalar then return r:reshape({}) end
  return r:reshape(values:size())
end
function methods.bucketize(t, boundaries, right)
  if type(right) == "table" then right = right.right end
  return torch.searchsorted(boundaries, t, { right = right == true })
end

-- tril_indices / triu_indices(row, col [, offset=0]): the (2, K) int64
-- coordinates of the lower (upper) triangle, row by row.
local function triangle(fn, keep)
  return function(row, col, offset, opts)
    if type(offset) == "table" then offset, opts = nil, offset end
    row, col = want_int(row, fn, "row", nil, 0), want_int(col, fn, "col", nil, 0)
    offset = want_int(offset, fn, "offset", 0)
    local o = { dtype = torch.int64, device = B.options(opts, fn).device }
    local r = torch.arange(row, o):view(-1, 1):expand(row, col)
    local c = torch.arange(col, o):view(1, -1):expand(row, col)
    local mask = keep(c - r, offset)
    return torch.stack({ r:masked_select(mask), c:masked_select(mask) }, 0)
  end
end
torch.tril_indices = triangle("tril_indices", function(d, k) return d:le(k) end)
torch.triu_indices = triangle("triu_indices", function(d, k) return d:ge(k) end)

-- diag_embed([offset=0]): each vector of the last dim as the diagonal of
-- a matrix (the last two dims of the result).
function methods.diag_embed(t, offset)
  offset = want_int(offset, "diag_embed", "offset", 0)
  if t:dim() == 0 then raise("diag_embed: expected a tensor of at least one dim") end
  local n = t:size(-1)
  local m = n + math.abs(offset)
  local lead = t:size()
  lead[#lead] = nil
  local index = {}
  for i = 0, n - 1 do index[i + 1] = (i + math.max(0, -offset)) * m + i + math.max(0, offset) end
  local shape = { unpack(lead) }
  shape[#shape + 1] = m * m
  local out = torch.zeros(shape, { dtype = t.dtype, device = t.device })
  out = out:index_copy(#shape - 1, int64(index, t.device), t)
  shape[#shape] = m
  shape[#shape + 1] = m
  return out:view(shape)
end

---------------------------------------------------------------- functions of several tensors

-- A list given as the arguments or as one table.
local function tensor_list(fn, first, ...)
  local list = (type(first) == "table" and not is_tensor(first)) and first or { first, ... }
  if #list == 0 or list[1] == nil then raise(fn .. ": expected at least one tensor") end
  for i, t in ipairs(list) do
    if not is_tensor(t) then raise(string.format("%s: expected a tensor at position %d, got %s", fn, i, typename(t))) end
  end
  return list
end

-- broadcast_shapes(shape, ...): the shape all broadcast to.
function torch.broadcast_shapes(...)
  local shapes, out = { ... }, {}
  for i, sh in ipairs(shapes) do
    if type(sh) == "number" then sh = { sh }; shapes[i] = sh end
    if type(sh) ~= "table" then raise("broadcast_shapes: expected shapes (lists of sizes), got " .. typename(sh)) end
    for _, v in ipairs(sh) do want_int(v, "broadcast_shapes", "a size", nil, 0) end
  end
  local n = 0
  for _, s in ipairs(shapes) do n = math.max(n, #s) end
  for i = 1, n do
    local size = 1
    for _, s in ipairs(shapes) do
      local v = s[#s - n + i] or 1
      if v ~= 1 then
        if size ~= 1 and size ~= v then
          local strs = {}
          for j, sj in ipairs(shapes) do strs[j] = "[" .. table.concat(sj, ", ") .. "]" end
          raise("broadcast_shapes: shapes " .. table.concat(strs, ", ") .. " do not broadcast")
        end
        size = v
      end
    end
    out[i] = size
  end
  return out
end

-- broadcast_tensors(t, ...): views of each expanded to the common shape.
function torch.broadcast_tensors(...)
  local list = tensor_list("broadcast_tensors", ...)
  local shapes = {}
  for i, t in ipairs(list) do shapes[i] = t:size() end
  local shape = torch.broadcast_shapes(unpack(shapes))
  local out = {}
  for i, t in ipairs(list) do out[i] = t:expand(shape) end
  return unpack(out)
end

-- meshgrid(t, ... [, {indexing="ij"}]): the grids of 1-D tensors, a Lua
-- list; "xy" swaps the first two dims, as numpy's.
function torch.meshgrid(...)
  local args = { ... }
  local opts = {}
  if type(args[#args]) == "table" and not is_tensor(args[#args]) and args[#args].indexing then
    opts = table.remove(args)
  end
  local list = tensor_list("meshgrid", unpack(args))
  local indexing = opts.indexing or "ij"
  if indexing ~= "ij" and indexing ~= "xy" then raise('meshgrid: indexing must be "ij" or "xy", got ' .. tostring(indexing)) end
  local n = #list
  local shape = {}
  for i, t in ipairs(list) do
    if t:dim() > 1 then raise("meshgrid: expected 0-D or 1-D tensors, got " .. t:dim() .. " dims at position " .. i) end
    shape[i] = t:numel()
  end
  local xy = indexing == "xy" and n >= 2
  if xy then shape[1], shape[2] = shape[2], shape[1] end
  local out = {}
  for i, t in ipairs(list) do
    local view = {}
    for j = 1, n do view[j] = 1 end
    local at = i
    if xy and i <= 2 then at = 3 - i end
    view[at] = t:numel()
    out[i] = t:reshape(view):expand(shape)
  end
  return out
end

-- cartesian_prod(t, ...): every combination of the 1-D tensors' elements, (N, k).
function torch.cartesian_prod(...)
  local list = tensor_list("cartesian_prod", ...)
  if #list == 1 then return list[1]:clone() end
  local grids = torch.meshgrid(unpack(list))
  for i, g in ipairs(grids) do grids[i] = g:reshape(-1) end
  return torch.stack(grids, 1)
end

-- atleast_1d/2d/3d(t): t viewed with leading (trailing, for 3-D) dims of
-- one, as PyTorch places them.
function torch.atleast_1d(t)
  want_tensor(t, "atleast_1d", "input")
  return t:dim() >= 1 and t or t:reshape(1)
end
function torch.atleast_2d(t)
  want_tensor(t, "atleast_2d", "input")
  if t:dim() >= 2 then return t end
  return t:reshape(1, t:numel())
end
function torch.atleast_3d(t)
  local nd = want_tensor(t, "atleast_3d", "input"):dim()
  if nd >= 3 then return t end
  if nd == 2 then return t:unsqueeze(-1) end
  return t:reshape(1, t:numel(), 1)
end

-- hstack / vstack / dstack / column_stack(tensors): cat along columns
-- (dim 0 for 1-D tensors), rows, depth, or of columns.
function torch.hstack(...)
  local list = tensor_list("hstack", ...)
  local all = {}
  for i, t in ipairs(list) do all[i] = torch.atleast_1d(t) end
  return torch.cat(all, all[1]:dim() == 1 and 0 or 1)
end
function torch.vstack(...)
  local all = {}
  for i, t in ipairs(tensor_list("vstack", ...)) do all[i] = torch.atleast_2d(t) end
  return torch.cat(all, 0)
end
torch.row_stack = torch.vstack
function torch.dstack(...)
  local all = {}
  for i, t in ipairs(tensor_list("dstack", ...)) do all[i] = torch.atleast_3d(t) end
  return torch.cat(all, 2)
end
function torch.column_stack(...)
  local all = {}
  for i, t in ipairs(tensor_list("column_stack", ...)) do
    all[i] = t:dim() <= 1 and t:reshape(t:numel(), 1) or t
  end
  return torch.cat(all, 1)
end

-- block_diag(t, ...): the matrices (or vectors, as rows, or numbers) on
-- the diagonal of a zero matrix.
function torch.block_diag(...)
  local list = tensor_list("block_diag", ...)
  local cols, dtype, device = 0, list[1].dtype, list[1].device
  local blocks = {}
  for i, t in ipairs(list) do
    local m = t:dim() == 2 and t or t:reshape(1, t:numel())
    if t:dim() > 2 then raise("block_diag: expected tensors of at most 2 dims, got " .. t:dim() .. " at position " .. i) end
    blocks[i] = m
    cols = cols + m:size(1)
  end
  -- each block's rows: zeros, the block, zeros (cat, so that gradients flow)
  local band, c = {}, 0
  for i, m in ipairs(blocks) do
    local h, w = m:size(0), m:size(1)
    local row = { torch.zeros(h, c, { dtype = dtype, device = device }), m:to(dtype),
                  torch.zeros(h, cols - c - w, { dtype = dtype, device = device }) }
    band[i] = torch.cat(row, 1)
    c = c + w
  end
  return torch.cat(band, 0)
end

-- cdist(x1, x2 [, p=2]): the p-norm distances between the rows of x1
-- (..., P, M) and x2 (..., R, M), (..., P, R).
---------------------------------------------------------------- more of PyTorch's small operations

function methods.broadcast_to(t, shape) return t:expand(shape) end

-- diff([n = 1, dim = -1, prepend, append]) or diff({n =, dim =, prepend
-- =, append =}): the n-th forward difference along dim (for bool tensors
-- the elements that differ, as PyTorch), after prepend and append are
-- joined to t along dim.
function methods.diff(t, n, dim, prepend, append)
  local fn = "diff"
  if type(n) == "table" then n, dim, prepend, append = n.n, n.dim, n.prepend, n.append end
  n = want_int(n, fn, "n", 1, 0)
  if t:dim() == 0 then raise("diff: expected at least a 1-dimensional tensor") end
  local d = dim_of(t, dim == nil and -1 or dim, fn)
  local parts = {}
  if prepend ~= nil then parts[#parts + 1] = want_tensor(prepend, fn, "prepend") end
  parts[#parts + 1] = t
  if append ~= nil then parts[#parts + 1] = want_tensor(append, fn, "append") end
  local x = #parts > 1 and torch.cat(parts, d) or t
  for _ = 1, n do
    local len = x:size(d)
    if len == 0 then break end
    local hi, lo = x:narrow(d, 1, len - 1), x:narrow(d, 0, len - 1)
    x = x.dtype == torch.bool and hi:ne(lo) or hi - lo
  end
  return x
end

-- isin(elements, test_elements [, {assume_unique, invert}]): whether each
-- element is among test_elements (a tensor or a number).
function torch.isin(elements, test, opts)
  local fn = "isin"
  if type(opts) == "boolean" then opts = { assume_unique = opts } end
  local invert = type(opts) == "table" and opts.invert or false
  if not is_tensor(elements) then elements = torch.tensor(want_operand(elements, fn, "elements")) end
  if not is_tensor(test) then test = torch.tensor({ want_operand(test, fn, "test_elements") }, { device = elements.device }) end
  local flat = test:reshape(-1)
  local found
  if elements:numel() * flat:numel() <= 2 ^ 24 then
    found = elements:unsqueeze(-1):eq(flat):any(-1)
  else   -- by binary search in the sorted test elements
    local sorted = flat:sort()
    local at = torch.searchsorted(sorted, elements:reshape(-1)):clamp(0, math.max(flat:numel() - 1, 0))
    found = sorted:index_select(0, at):eq(elements:reshape(-1)):reshape(elements:size())
  end
  return invert and found:logical_not() or found
end
function methods.isin(t, test, opts) return torch.isin(t, test, opts) end

-- aminmax([{dim =, keepdim =}]): min and max (two tensors) over all
-- elements or along dim.
function methods.aminmax(t, opts)
  local dim, keepdim
  if type(opts) == "table" then dim, keepdim = opts.dim, opts.keepdim
  elseif opts ~= nil then dim = opts end
  if dim == nil then return t:amin(), t:amax() end
  return t:amin(dim, keepdim or false), t:amax(dim, keepdim or false)
end

-- fmod(other): the remainder with the dividend's sign (C's fmod), from
-- remainder (which has the divisor's) where the two signs differ.
function methods.fmod(t, other)
  want_operand(other, "fmod", "other")
  local r = t:remainder(other)
  local wrong = r:ne(0):logical_and(r:lt(0):ne(t:lt(0)))
  return torch.where(wrong, r - other, r)
end

-- heaviside(values): 0 below zero, values at zero, 1 above.
function methods.heaviside(t, values)
  want_operand(values, "heaviside", "values")
  local one, zero = torch.ones_like(t), torch.zeros_like(t)
  return torch.where(t:gt(0), one, torch.where(t:lt(0), zero, is_tensor(values) and values:to(t.dtype) or values + zero))
end

-- float_power(exponent): the power in float64.
function methods.float_power(t, exponent)
  want_operand(exponent, "float_power", "exponent")
  return t:double() ^ (is_tensor(exponent) and exponent:double() or exponent)
end

-- torch.normal(mean, std [, size] [, opts]): mean + std * N(0, 1), mean
-- and std tensors or numbers (two numbers need the size); gradients reach
-- tensor means and stds, as PyTorch's.
function torch.normal(mean, std, size, opts)
  local fn = "normal"
  if type(size) == "table" and size[1] == nil and next(size) ~= nil then size, opts = nil, size end
  if opts ~= nil then B.options(opts, fn) end
  if opts and opts.generator ~= nil then
    local gen = opts.generator
    local rest = {}
    for k, v in pairs(opts) do if k ~= "generator" then rest[k] = v end end
    return torch._drawn(fn, gen, torch.normal, mean, std, size, next(rest) and rest or nil)
  end
  if std == nil then std = 1 end
  want_operand(mean, fn, "mean")
  want_operand(std, fn, "std")
  local like = is_tensor(mean) and mean or (is_tensor(std) and std or nil)
  local noise
  if like then
    local shape = is_tensor(mean) and is_tensor(std) and torch.broadcast_shapes(mean:size(), std:size()) or like:size()
    noise = torch.randn(shape, { dtype = like.dtype, device = like.device })
  else
    if type(size) ~= "table" then raise(fn .. ": with a number mean and std, expected a size") end
    noise = opts and torch.randn(size, opts) or torch.randn(size)
  end
  if type(std) == "number" and std < 0 then raise(fn .. ": expected std >= 0, got " .. std) end
  return noise * std + mean
end

-- torch.logspace(start, end, steps [, base = 10] [, opts]).
function torch.logspace(start, stop, steps, base, opts)
  if type(base) == "table" then base, opts = nil, base end
  base = want_number(base, "logspace", "base", 10)
  local exps = torch.linspace(start, stop, steps, { dtype = torch.float64 })
  local out = torch.full_like(exps, base) ^ exps
  opts = B.options(opts, "logspace")
  return out:to(opts.device or "cpu", opts.dtype or torch.get_default_dtype())
end

-- torch.as_tensor(data [, opts]): a tensor as it is (or converted to the
-- asked dtype and device: a copy then), anything else through torch.tensor.
function torch.as_tensor(data, opts)
  if getmetatable(opts) == torch.dtype_mt then opts = { dtype = opts } end
  if opts ~= nil and type(opts) ~= "table" then
    raise("as_tensor: expected a dtype or an options table {dtype =, device =}, got " .. typename(opts))
  end
  if not is_tensor(data) then return torch.tensor(data, opts) end
  opts = B.options(opts, "as_tensor")
  if opts.dtype == nil and opts.device == nil then return data end
  return data:to(opts.device or data.device, opts.dtype or data.dtype)
end

-- mode([dim = -1, keepdim = false]): the most frequent value along dim
-- (the smallest of equally frequent ones) and the index of its last
-- occurrence, as PyTorch's CPU; counted on the host.
function methods.mode(t, dim, keepdim)
  if type(dim) == "table" then dim, keepdim = dim.dim, dim.keepdim end
  local d = dim_of(t, dim == nil and -1 or dim, "mode")
  if t:dim() == 0 then return t:clone(), torch.zeros({}, { dtype = torch.int64, device = t.device }) end
  local moved = t:movedim(d, -1):contiguous()
  local len = moved:size(-1)
  if len == 0 then raise("mode: expected a non-empty dim") end
  local rows = moved:reshape(-1, len)
  local vals = host_values(rows)
  local out_v, out_i = {}, {}
  local NAN = {}   -- NaN's key (a NaN cannot index a table); it sorts last, as in `less`
  for r = 0, rows:size(0) - 1 do
    local count, last = {}, {}
    for k = 1, len do
      local v = vals[r * len + k]
      if v ~= v then v = NAN end
      count[v] = (count[v] or 0) + 1
      last[v] = k - 1
    end
    local best, best_n
    for key, c in pairs(count) do
      local v = key == NAN and 0 / 0 or key
      if best_n == nil or c > best_n or (c == best_n and less(v, best)) then best, best_n = v, c end
    end
    out_v[r + 1], out_i[r + 1] = best, last[best ~= best and NAN or best]
  end
  local shape = moved:size()
  table.remove(shape)
  local values = torch.tensor(out_v, { dtype = t.dtype }):reshape(shape):to(t.device)
  local indices = int64(out_i, t.device):reshape(shape)
  if keepdim then values, indices = values:unsqueeze(d), indices:unsqueeze(d) end
  return values, indices
end

-- combinations([r = 2, with_replacement = false]) of a 1-D tensor: the
-- r-element combinations, in lexicographic order of positions, as rows.
function torch.combinations(t, r, with_replacement)
  if type(r) == "table" then r, with_replacement = r.r, r.with_replacement end
  want_tensor(t, "combinations", "input")
  if t:dim() ~= 1 then raise("combinations: expected a 1-D tensor, got " .. t:dim() .. " dims") end
  r = want_int(r, "combinations", "r", 2, 0)
  local n = t:size(0)
  -- the count first (C(n, r), or C(n + r - 1, r) with replacement), so that
  -- a request too large is refused before any work
  local count, top = 1, with_replacement and n + r - 1 or n
  if r > n and not with_replacement then count = 0 end
  for k = 1, r do
    if count == 0 or count * r > 2 ^ 26 then break end
    count = count * (top - k + 1) / k
  end
  if count * r > 2 ^ 26 then
    raise(string.format("combinations: more than %d elements (combinations of %s of %d elements)", 2 ^ 26, tostring(r), n))
  end
  local rows, cur = {}, {}
  local function walk(from, depth)
    if depth > r then
      for i = 1, r do rows[#rows + 1] = cur[i] end
      return
    end
    for i = from, n - 1 do
      cur[depth] = i
      walk(with_replacement and i or i + 1, depth + 1)
    end
  end
  if r > 0 then walk(0, 1) end
  if #rows == 0 then return t:new_zeros({ 0, r == 0 and 0 or r }) end
  return t:index_select(0, int64(rows, t.device)):reshape(-1, r)
end
methods.combinations = torch.combinations

-- trapezoid(y [, x] [, {dx = 1, dim = -1}]) (trapz): the integral of y
-- along dim by the trapezoid rule, at spacing dx or at the points x;
-- cumulative_trapezoid the running integrals. total(t, d) sums the
-- trapezoids (sum or cumsum).
local function trapezoids(fn, total, y, x, opts)
  if type(x) == "table" and not is_tensor(x) then x, opts = nil, x end
  if type(x) == "number" then x, opts = nil, { dx = x } end
  opts = B.options(opts, fn)
  want_tensor(y, fn, "y")
  if x ~= nil then want_tensor(x, fn, "x") end
  if type(opts) ~= "table" then raise(fn .. ": expected an options table {dx =, dim =}, got " .. typename(opts)) end
  local d = dim_of(y, opts.dim == nil and -1 or opts.dim, fn)
  local len = y:size(d)
  if len == 0 then return total(y, d) end
  local mid = (y:narrow(d, 1, len - 1) + y:narrow(d, 0, len - 1)) / 2
  if x == nil then return total(mid, d) * want_number(opts.dx, fn, "dx", 1) end
  local dx = x:dim() == 1 and methods.diff(x) or methods.diff(x, 1, d)
  if x:dim() == 1 then
    local shape = {}
    for i = 1, y:dim() do shape[i] = 1 end
    shape[d + 1] = len - 1
    dx = dx:reshape(shape)
  end
  return total(mid * dx, d)
end
function torch.trapezoid(y, x, opts) return trapezoids("trapezoid", function(t, d) return t:sum(d) end, y, x, opts) end
function torch.cumulative_trapezoid(y, x, opts)
  return trapezoids("cumulative_trapezoid", function(t, d) return t:cumsum(d) end, y, x, opts)
end
torch.trapz = torch.trapezoid

-- gradient(t [, {spacing = 1, dim, edge_order = 1}]): the derivative of t
-- along each dim (every dim by default), as NumPy's and PyTorch's: central
-- differences inside, one-sided ones of first or second order at the
-- edges; spacing is a number, a list of numbers (one a dim) or a list of
-- 1-D tensors (each dim's coordinates, not evenly spaced). A list, one
-- tensor a dim.
local function along(v, d, nd)   -- a 1-D tensor shaped to broadcast along dim d of nd
  local shape = {}
  for i = 1, nd do shape[i] = 1 end
  shape[d + 1] = v:numel()
  return v:reshape(shape)
end
local function gradient_along(t, d, h, edge)
  local n = t:size(d)
  local function f(start, len) return t:narrow(d, start, len) end
  local first, inner, last
  if type(h) == "number" then
    inner = (f(2, n - 2) - f(0, n - 2)) / (2 * h)
    if edge == 1 then
      first, last = (f(1, 1) - f(0, 1)) / h, (f(n - 1, 1) - f(n - 2, 1)) / h
    else
      first = (f(0, 1) * -1.5 + f(1, 1) * 2 - f(2, 1) * 0.5) / h
      last = (f(n - 3, 1) * 0.5 - f(n - 2, 1) * 2 + f(n - 1, 1) * 1.5) / h
    end
  else
    local x = h:to(t.dtype.is_floating_point and t.dtype or torch.get_default_dtype())
    local dx = x:narrow(0, 1, n - 1) - x:narrow(0, 0, n - 1)
    local nd = t:dim()
    local hs, hd = along(dx:narrow(0, 0, n - 2), d, nd), along(dx:narrow(0, 1, n - 2), d, nd)
    inner = (hs:square() * f(2, n - 2) + (hd:square() - hs:square()) * f(1, n - 2) - hd:square() * f(0, n - 2))
            / (hs * hd * (hd + hs))
    local d0, d1 = dx[0]:item(), dx[n - 2]:item()
    if edge == 1 then
      first, last = (f(1, 1) - f(0, 1)) / d0, (f(n - 1, 1) - f(n - 2, 1)) / d1
    else
      local a1, a2 = d0, dx[1]:item()
      first = f(0, 1) * (-(2 * a1 + a2) / (a1 * (a1 + a2))) + f(1, 1) * ((a1 + a2) / (a1 * a2))
              + f(2, 1) * (-a1 / (a2 * (a1 + a2)))
      local b1, b2 = dx[n - 3]:item(), d1
      last = f(n - 3, 1) * (b2 / (b1 * (b1 + b2))) + f(n - 2, 1) * (-(b1 + b2) / (b1 * b2))
             + f(n - 1, 1) * ((2 * b2 + b1) / (b2 * (b1 + b2)))
    end
  end
  return torch.cat({ first, inner, last }, d)
end
function torch.gradient(t, opts)
  local fn = "gradient"
  want_tensor(t, fn, "input")
  opts = B.options(opts, fn)
  if t:dim() == 0 then raise(fn .. ": expected a tensor of at least one dim") end
  local dims = dims_of(t, opts.dim, fn)
  local edge = want_int(opts.edge_order, fn, "edge_order", 1)
  if edge ~= 1 and edge ~= 2 then raise(fn .. ": expected edge_order to be 1 or 2, got " .. edge) end
  local spacing = opts.spacing == nil and 1 or opts.spacing
  local per = {}
  if type(spacing) == "number" then
    for i = 1, #dims do per[i] = spacing end
  elseif type(spacing) == "table" and not is_tensor(spacing) then
    if #spacing ~= #dims then
      raise(string.format("%s: expected spacing to be unspecified, a scalar or a list of length %d (one per dim), got "
                          .. "a list of length %d", fn, #dims, #spacing))
    end
    per = spacing
  else
    raise(fn .. ": expected spacing to be a number or a list of numbers or 1-D tensors, got " .. typename(spacing))
  end
  local out = {}
  for i, d in ipairs(dims) do
    local n, h = t:size(d), per[i]
    if n < edge + 1 then
      raise(string.format("%s: expected each dimension size to be at least edge_order+1 (%d), got %d along dim %d",
                          fn, edge + 1, n, d))
    end
    if is_tensor(h) and h:dim() == 0 then h = h:item() end
    if is_tensor(h) then
      if h:dim() ~= 1 or h:numel() ~= n then
        raise(string.format("%s: expected the coordinates of dim %d to be a 1-D tensor of %d values", fn, d, n))
      end
    elseif type(h) ~= "number" then
      raise(string.format("%s: expected spacing[%d] to be a number or a 1-D tensor, got %s", fn, i, typename(h)))
    end
    out[i] = gradient_along(t, d, h, edge)
  end
  return out
end

-- nextafter(other): the next floating point value after each element
-- toward other's, in the tensor's dtype: a step of one unit in the last
-- place (half of one toward zero from a power of two), down to the
-- subnormals; equal values give other's, NaN gives NaN. Computed in float64.
local float_layout = { float64 = { digits = 53, min_exp = -1021, max = 1.7976931348623157e308 },
                       float32 = { digits = 24, min_exp = -125, max = 3.4028234663852886e38 } }
function methods.nextafter(t, other)
  local fn = "nextafter"
  want_tensor(t, fn, "input")
  local layout = float_layout[t.dtype.name]
  if not layout then raise(fn .. ": expected a float32 or float64 tensor, got " .. t.dtype.name) end
  if type(other) == "number" then other = torch.tensor(other, { dtype = t.dtype, device = t.device }) end
  want_tensor(other, fn, "other")
  if other.dtype ~= t.dtype then
    raise(string.format("%s: expected other of the input's dtype %s, got %s", fn, t.dtype.name, other.dtype.name))
  end
  local x, y = torch.broadcast_tensors(t:double(), other:double())
  local m, e = x:frexp()
  e = e:clamp(layout.min_exp, nil)
  local ulp = torch.ldexp(torch.ones_like(x), e - layout.digits)
  local toward = (y - x):sign()
  local to_zero = toward:ne(0):logical_and(toward:ne(x:sign()))
  local step = torch.where(m:abs():eq(0.5):logical_and(to_zero):logical_and(e:gt(layout.min_exp)), ulp / 2, ulp)
  local r = x + toward * step
  local tiny = math.ldexp(1, layout.min_exp - layout.digits)
  r = torch.where(x:eq(0), y:sign() * tiny, r)
  r = torch.where(x:abs():eq(math.huge):logical_and(y:abs():lt(math.huge)), x:sign() * layout.max, r)
  r = torch.where(x:eq(y), y, r)
  r = torch.where(x:ne(x):logical_or(y:ne(y)), 0 / 0, r)
  return r:to(t.dtype)
end
function torch.nextafter(t, other) return methods.nextafter(t, other) end

-- vander(x [, N = #x, increasing = false]): the columns x^(N-1) ... x^0
-- (x^0 ... x^(N-1) when increasing).
function torch.vander(x, N, increasing)
  if type(N) == "table" then N, increasing = N.N, N.increasing end
  want_tensor(x, "vander", "x")
  if x:dim() ~= 1 then raise("vander: expected a 1-D tensor, got " .. x:dim() .. " dims") end
  N = want_int(N, "vander", "N", x:size(0), 0)
  if N == 0 then return x:new_zeros({ x:size(0), 0 }) end
  -- powers as running products (exact, and with finite gradients at 0)
  local powers = torch.cat({ torch.ones_like(x):unsqueeze(1), x:unsqueeze(1):expand(x:size(0), N - 1) }, 1):cumprod(1)
  return increasing and powers or powers:flip(1)
end

-- n + 1 edges evenly over [lo, hi], or without them over x's values (a
-- single value widened by 1/2 each way), in x's dtype
local function even_edges(fn, x, n, lo, hi)
  if lo == nil or hi == nil then
    if x:numel() > 0 then lo, hi = x:min():item(), x:max():item() else lo, hi = 0, 0 end
  end
  if lo == hi then lo, hi = lo - 0.5, hi + 0.5 end
  if lo > hi then raise(fn .. ": expected range with min <= max") end
  return torch.linspace(lo, hi, n + 1, { dtype = x.dtype })
end

-- histogram(input, bins [, {range = {min, max}, weight =, density =}]):
-- hist and bin_edges, bins a count (edges evenly over range, or over the
-- values) or a 1-D tensor of increasing edges; the last bin holds its
-- right edge.
function torch.histogram(t, bins, opts)
  local fn = "histogram"
  want_float(fn, want_tensor(t, fn, "input"))
  if type(bins) == "table" and not is_tensor(bins) then opts, bins = bins, bins.bins end
  opts = B.options(opts, "histogram")
  local edges
  if is_tensor(bins) then
    edges = bins:to(t.dtype)
    if edges:dim() ~= 1 or edges:numel() < 2 then raise(fn .. ": expected bins to be a 1-D tensor of at least 2 edges") end
  else
    local range = opts.range or {}
    edges = even_edges(fn, t, want_int(bins, fn, "bins", 100, 1), range[1], range[2])
  end
  local nb = edges:numel() - 1
  local x = t:reshape(-1):cpu()
  local e = edges:cpu()
  local first, last = e[0]:item(), e[nb]:item()
  local inside = x:ge(first):logical_and(x:le(last))
  local at = (torch.searchsorted(e, x, { right = true }) - 1):clamp(0, nb - 1)
  local w = opts.weight and opts.weight:reshape(-1):cpu():to(t.dtype) or torch.ones_like(x)
  w = torch.where(inside, w, 0)
  local hist = torch.zeros(nb, { dtype = t.dtype }):index_add(0, at, w)
  if opts.density then hist = hist / (hist:sum() * (e:narrow(0, 1, nb) - e:narrow(0, 0, nb))) end
  return hist:to(t.device), edges:to(t.device)
end

methods.histogram = torch.histogram

-- histogramdd(input, bins [, {range = {min0, max0, min1, max1, ...}, weight =,
-- density =}]): input (..., D) read as points of D coordinates; bins a
-- count, a list of D counts or a list of D 1-D tensors of edges; hist of
-- D dims and the list of each dim's edges, as PyTorch's.
function torch.histogramdd(t, bins, opts)
  local fn = "histogramdd"
  want_float(fn, want_tensor(t, fn, "input"))
  if type(bins) == "table" and not is_tensor(bins) and bins[1] == nil then opts, bins = bins, bins.bins end
  opts = B.options(opts, fn)
  if t:dim() < 1 then raise(fn .. ": expected input of at least one dim (the points' coordinates last)") end
  local D = t:size(-1)
  local points = t:reshape(-1, D):cpu()
  local per = {}
  if type(bins) == "number" then
    for d = 1, D do per[d] = bins end
  elseif type(bins) == "table" and not is_tensor(bins) then
    if #bins ~= D then raise(string.format("%s: expected %d bins (one per coordinate), got %d", fn, D, #bins)) end
    per = bins
  else
    raise(fn .. ": expected bins to be a number or a list of numbers or 1-D tensors, got " .. typename(bins))
  end
  if opts.range ~= nil and (type(opts.range) ~= "table" or #opts.range ~= 2 * D) then
    raise(string.format("%s: expected range to be a list of %d numbers (a min and a max per coordinate)", fn, 2 * D))
  end
  local edges, at, sizes = {}, nil, {}
  local inside = torch.ones(points:size(0), { dtype = torch.bool })
  for d = 1, D do
    local x = points:select(1, d - 1)
    local e
    if is_tensor(per[d]) then
      e = per[d]:to(t.dtype):cpu()
      if e:dim() ~= 1 or e:numel() < 2 then raise(string.format("%s: expected bins[%d] to be a 1-D tensor of at least 2 edges", fn, d)) end
    else
      local range = opts.range or {}
      e = even_edges(fn, x, want_int(per[d], fn, "bins", nil, 1), range[2 * d - 1], range[2 * d])
    end
    local nb = e:numel() - 1
    inside = inside:logical_and(x:ge(e[0]:item())):logical_and(x:le(e[nb]:item()))
    local idx = (torch.searchsorted(e, x:contiguous(), { right = true }) - 1):clamp(0, nb - 1)
    at = at and at * nb + idx or idx
    edges[d], sizes[d] = e, nb
  end
  local total = 1
  for _, n in ipairs(sizes) do total = total * n end
  local w = opts.weight and want_tensor(opts.weight, fn, "weight"):reshape(-1):cpu():to(t.dtype)
            or torch.ones(points:size(0), { dtype = t.dtype })
  local hist = torch.zeros(total, { dtype = t.dtype }):index_add(0, at, torch.where(inside, w, 0)):reshape(sizes)
  if opts.density then
    local volume = torch.ones(sizes, { dtype = t.dtype })
    for d = 1, D do
      local e = edges[d]
      local width = e:narrow(0, 1, sizes[d]) - e:narrow(0, 0, sizes[d])
      local shape = {}
      for k = 1, D do shape[k] = k == d and sizes[d] or 1 end
      volume = volume * width:reshape(shape)
    end
    hist = hist / (hist:sum() * volume)
  end
  for d = 1, D do edges[d] = edges[d]:to(t.device) end
  return hist:to(t.device), edges
end

-- the older names: torch.range(start, end [, step = 1]) includes end and is
-- of the default dtype; frobenius_norm and nuclear_norm are linalg's
function torch.range(start, stop, step, opts)
  if type(step) == "table" then step, opts = nil, step end
  start, stop = want_number(start, "range", "start"), want_number(stop, "range", "end")
  step = want_number(step, "range", "step", 1)
  if step == 0 or (stop - start) * step < 0 then
    raise(string.format("range: upper bound and larger bound inconsistent with step sign (start %s, end %s, step %s)",
                        tostring(start), tostring(stop), tostring(step)))
  end
  local n = math.floor((stop - start) / step) + 1
  opts = B.options(opts, "range")
  local dt = opts.dtype or torch.get_default_dtype()
  return torch.arange(0, n, { dtype = torch.float64, device = opts.device }):mul(step):add(start)
    :to(dt):requires_grad_(opts.requires_grad == true)
end
function torch.frobenius_norm(t, dim, keepdim)
  if type(dim) == "table" and not dim[1] then dim, keepdim = dim.dim, dim.keepdim end
  return torch.linalg.vector_norm(want_float("frobenius_norm", want_tensor(t, "frobenius_norm", "input")), 2,
                                  dim or { -2, -1 }, keepdim)
end
function torch.nuclear_norm(t, dim, keepdim)
  if type(dim) == "boolean" then dim, keepdim = nil, dim end
  if type(dim) == "table" and not dim[1] then dim, keepdim = dim.dim, dim.keepdim end
  return torch.linalg.matrix_norm(want_tensor(t, "nuclear_norm", "input"), "nuc", dim, keepdim)
end
-- binomial(count, prob): one draw of Binomial(count, prob) per element
function torch.binomial(count, prob)
  want_tensor(count, "binomial", "count")
  want_tensor(prob, "binomial", "prob")
  return torch.distributions.Binomial(count, prob, { validate_args = false }):sample():to(count.dtype)
end

---------------------------------------------------------------- tensor methods programs call

function methods.floor_divide(t, other) return methods.div(t, other, "floor") end

function methods.ravel(t) return t:reshape(-1) end
-- unflatten(dim, sizes): dim split into sizes (one may be -1)
function methods.unflatten(t, dim, sizes)
  local d = dim_of(t, dim, "unflatten")
  if type(sizes) ~= "table" then raise("unflatten: expected sizes as a list, got " .. typename(sizes)) end
  local shape = t:size()
  local out = {}
  for i = 1, d do out[#out + 1] = shape[i] end
  for _, s in ipairs(sizes) do out[#out + 1] = s end
  for i = d + 2, #shape do out[#out + 1] = shape[i] end
  return t:reshape(out)
end
-- unfold(dimension, size, step): the windows of size along dimension,
-- every step, as a new last dim (the dimension holds the windows' count)
function methods.unfold(t, dimension, size, step)
  local d = dim_of(t, dimension, "unfold")
  size, step = want_int(size, "unfold", "size", nil, 0), want_int(step, "unfold", "step", nil, 1)
  local len = t:dim() == 0 and 1 or t:size(d)
  if size > len then raise(string.format("unfold: maximum size for tensor at dimension %d is %d but size is %d", d, len, size)) end
  local n = math.floor((len - size) / step) + 1
  local starts = torch.arange(0, n, { dtype = torch.int64, device = t.device }) * step
  local idx = (starts:unsqueeze(1) + torch.arange(0, size, { dtype = torch.int64, device = t.device })):reshape(-1)
  local picked = t:dim() == 0 and t:reshape(1) or t:index_select(d, idx)
  local shape = picked:size()
  shape[d + 1] = n
  table.insert(shape, d + 2, size)
  return picked:reshape(shape):movedim(d + 1, -1)
end
-- sum_to_size(size): summed over the dims that size broadcasts
function methods.sum_to_size(t, size, ...)
  if type(size) ~= "table" or is_tensor(size) then size = { size, ... } end
  for i, s in ipairs(size) do want_int(s, "sum_to_size", "size[" .. i .. "]", nil, 0) end
  local lead = t:dim() - #size
  if lead < 0 then raise("sum_to_size: size {" .. table.concat(size, ", ") .. "} is not expandable to the tensor's size") end
  local out = t
  for _ = 1, lead do out = out:sum(0) end
  for i, s in ipairs(size) do
    if s == 1 and out:size(i - 1) ~= 1 then out = out:sum(i - 1, true)
    elseif s ~= out:size(i - 1) then
      raise("sum_to_size: size {" .. table.concat(size, ", ") .. "} is not expandable to the tensor's size")
    end
  end
  return out
end

function methods.sgn(t) return t:sign() end
-- signbit(): true where the sign bit is set (negative zero too)
function methods.signbit(t)
  if not t.dtype.is_floating_point then return t:lt(0) end
  return t:lt(0):logical_or(t:eq(0):logical_and(t:reciprocal():lt(0)))
end
-- copysign(other): |t| with other's sign (negative zero's too), floating
function methods.copysign(t, other)
  want_operand(other, "copysign", "other")
  local a = t.dtype.is_floating_point and t:abs() or t:abs():to(torch.get_default_dtype())
  local negative = is_tensor(other) and methods.signbit(other)
                   or torch.full_like(a, 0):to(torch.bool):logical_or(other < 0 or 1 / other < 0)
  return torch.where(negative, -a, a)
end
function methods.ldexp(t, other)
  if not is_tensor(other) and type(other) ~= "number" then
    raise("ldexp: expected other to be a tensor or a number, got " .. typename(other))
  end
  local e = is_tensor(other) and other:double() or other
  return t * (is_tensor(e) and torch.full_like(e, 2) ^ e or 2 ^ e)
end
function methods.deg2rad(t) return want_float("deg2rad", t) * (math.pi / 180) end
function methods.rad2deg(t) return want_float("rad2deg", t) * (180 / math.pi) end
-- angle(): 0 for x >= 0, pi below (real tensors), NaN kept
function methods.angle(t)
  local x = t.dtype.is_floating_point and t or t:to(torch.get_default_dtype())
  return torch.where(x:lt(0), math.pi, x * 0)
end
-- gcd(other), lcm(other): of integer tensors, by Euclid's steps on all
-- elements at once
function methods.gcd(t, other)
  if t.dtype.is_floating_point or not is_tensor(other) or other.dtype.is_floating_point then
    raise("gcd: expected two integer tensors")
  end
  local a, b = torch.broadcast_tensors(t:abs(), other:abs())
  while b:ne(0):any():item() do
    local nonzero = b:ne(0)
    local safe = torch.where(nonzero, b, 1)
    a, b = torch.where(nonzero, b, a), torch.where(nonzero, a:remainder(safe), 0)
  end
  return a
end
function methods.lcm(t, other)
  local g = methods.gcd(t, other)
  return torch.where(g:eq(0), 0, (t * other):abs():div(torch.where(g:eq(0), 1, g), "floor"))
end

function methods.msort(t) return (t:sort(0)) end
function methods.nan_to_num_(t, ...) return t:copy_(t:nan_to_num(...)) end
function methods.clip_(t, lo, hi) return t:clamp_(lo, hi) end
function methods.tril_(t, k) return t:copy_(t:tril(k)) end
function methods.triu_(t, k) return t:copy_(t:triu(k)) end
function methods.addmm_(t, ...) return t:copy_(t:addmm(...)) end
function methods.addmv_(t, ...) return t:copy_(t:addmv(...)) end
function methods.xlogy_(t, other) return t:copy_(t:xlogy(other)) end
function methods.hypot_(t, other) return t:copy_(t:hypot(other)) end

-- renorm(p, dim, maxnorm): each slice along dim whose p-norm is above
-- maxnorm scaled down to it
function methods.renorm(t, p, dim, maxnorm)
  p, maxnorm = want_number(p, "renorm", "p"), want_number(maxnorm, "renorm", "maxnorm")
  local d = dim_of(t, dim, "renorm")
  local others = {}
  for i = 0, t:dim() - 1 do if i ~= d then others[#others + 1] = i end end
  local norms = #others > 0 and t:abs():pow(p):sum(others, true):pow(1 / p) or t:abs()
  local scale = torch.where(norms:gt(maxnorm), maxnorm / (norms + 1e-7), 1)
  return t * scale
end
function methods.renorm_(t, ...) return t:copy_(t:renorm(...)) end

-- fill_diagonal_(value [, wrap = false]) of a matrix (or a tensor whose
-- dims are all equal): in place; a tall matrix with wrap starts again
-- every columns + 1 rows, as PyTorch's
function methods.fill_diagonal_(t, value, wrap)
  want_number(value, "fill_diagonal_", "fill_value")
  if t:dim() < 2 then raise("fill_diagonal_: dimensions must larger than 1") end
  local n = t:size(0)
  for d = 1, t:dim() - 1 do
    if t:dim() > 2 and t:size(d) ~= n then raise("fill_diagonal_: all dimensions of input must be of equal length") end
  end
  if not t:is_contiguous() then raise("fill_diagonal_: expected a contiguous tensor") end
  local step, count = 0, t:dim() == 2 and math.min(t:size(0), t:size(1)) or n
  local stride = 1
  for d = t:dim() - 1, 0, -1 do step = step + stride; stride = stride * t:size(d) end
  local positions = {}
  for k = 0, count - 1 do positions[#positions + 1] = k * step end
  if wrap and t:dim() == 2 and t:size(0) > t:size(1) + 1 then
    local cols = t:size(1)
    local row = cols + 1
    while row < t:size(0) do
      for k = 0, math.min(cols, t:size(0) - row) - 1 do positions[#positions + 1] = (row + k) * cols + k end
      row = row + cols + 1
    end
  end
  if #positions > 0 then t:view(-1):index_fill_(0, int64(positions, t.device), value) end
  return t
end

-- masked_scatter(mask, source): the elements where mask (broadcast) holds
-- taken from source in order
function methods.masked_scatter(t, mask, source)
  want_tensor(mask, "masked_scatter", "mask")
  want_tensor(source, "masked_scatter", "source")
  if mask.dtype ~= torch.bool then raise("masked_scatter: expected a bool mask, got " .. mask.dtype.name) end
  local positions = mask:expand(t:size()):reshape(-1):nonzero():reshape(-1)
  local count = positions:numel()
  if count > source:numel() then
    raise(string.format("masked_scatter: the mask selects %d elements but source has %d", count, source:numel()))
  end
  local flat = t:reshape(-1):index_copy(0, positions, source:reshape(-1):narrow(0, 0, count):to(t.dtype))
  return flat:reshape(t:size())
end
function methods.masked_scatter_(t, mask, source) return t:copy_(t:masked_scatter(mask, source)) end

-- select_scatter(src, dim, index), slice_scatter(src [, dim = 0, start,
-- end, step = 1]): t with that slice replaced by src
function methods.select_scatter(t, src, dim, index)
  local d = dim_of(t, dim, "select_scatter")
  local i = want_int(index, "select_scatter", "index")
  if i < 0 then i = i + t:size(d) end
  return t:index_copy(d, int64({ i }, t.device), want_tensor(src, "select_scatter", "src"):unsqueeze(d))
end
function methods.slice_scatter(t, src, dim, start, stop, step)
  if type(dim) == "table" then dim, start, stop, step = dim.dim, dim.start, dim["end"], dim.step end
  local d = dim_of(t, dim or 0, "slice_scatter")
  local len = t:size(d)
  start, stop = want_int(start, "slice_scatter", "start", 0), want_int(stop, "slice_scatter", "end", len)
  step = want_int(step, "slice_scatter", "step", 1, 1)
  if start < 0 then start = start + len end
  if stop < 0 then stop = stop + len end
  stop = math.min(stop, len)
  local idx = torch.arange(start, math.max(stop, start), step, { dtype = torch.int64, device = t.device })
  return t:index_copy(d, idx, want_tensor(src, "slice_scatter", "src"))
end

-- The elements of src (narrowed to index's shape) grouped by the flat
-- position in t that index sends them to: positions ascending, and within
-- one position the values ascending, in a stable order (so on any device
-- the result is the same). Returns the sorted positions, the values in
-- that order, and the run boundaries: first[i] (last[i]) true where
-- element i opens (closes) its position's run.
local function scatter_runs(t, dim, index, src)
  local shape, n = index:size(), index:dim()
  local strides, acc = {}, 1
  for d = n, 1, -1 do strides[d] = acc; acc = acc * t:size(d - 1) end
  local pos = index:to(torch.int64) * strides[dim + 1]
  for d = 1, n do
    if d ~= dim + 1 then
      local view = {}
      for k = 1, n do view[k] = k == d and shape[d] or 1 end
      pos = pos + torch.arange(0, shape[d], { dtype = torch.int64, device = t.device }):reshape(view) * strides[d]
    end
  end
  local vals = src
  for d = 0, n - 1 do vals = vals:narrow(d, 0, shape[d + 1]) end
  vals, pos = vals:reshape(-1), pos:reshape(-1)
  local by_value = vals:detach():argsort()
  local by_pos = pos:index_select(0, by_value):argsort()
  local order = by_value:index_select(0, by_pos)
  pos, vals = pos:index_select(0, order), vals:index_select(0, order)
  local m = pos:numel()
  local differs = pos:narrow(0, 1, m - 1):ne(pos:narrow(0, 0, m - 1))
  local yes = torch.ones(1, { dtype = torch.bool, device = t.device })
  return pos, vals, torch.cat({ yes, differs }), torch.cat({ differs, yes })
end

-- The product of each run: a segmented inclusive scan by doubling (log2 n
-- rounds of elementwise products), read at each run's end
local function run_products(vals, first)
  local m = vals:numel()
  local run = first:to(torch.int64):cumsum(0)
  local step = 1
  while step < m do
    local same = run:narrow(0, step, m - step):eq(run:narrow(0, 0, m - step))
    local earlier = torch.where(same, vals:narrow(0, 0, m - step), 1)
    vals = torch.cat({ vals:narrow(0, 0, step), vals:narrow(0, step, m - step) * earlier })
    step = step * 2
  end
  return vals
end

-- "prod", "amax" and "amin": each position's values (t's own with
-- include_self) reduced; t where index sends nothing
local function scatter_runs_reduce(t, dim, index, src, reduce, include_self)
  if index:numel() == 0 then return t:clone() end
  -- (amin is amax of the negated values: NaN sorts last either way, and so
  -- propagates as PyTorch's)
  local sign = reduce == "amin" and -1 or 1
  local pos, vals, first, last = scatter_runs(t, dim, index, src:to(t.dtype) * sign)
  if reduce == "prod" then vals = run_products(vals, first) end
  local at, reduced = pos:masked_select(last), vals:masked_select(last) * sign
  local flat = t:reshape(-1)
  if include_self then
    local own = flat:index_select(0, at)
    reduced = reduce == "amax" and own:maximum(reduced) or reduce == "amin" and own:minimum(reduced) or own * reduced
  end
  return flat:index_copy(0, at, reduced):reshape(t:size())
end

-- index_reduce(dim, index, source, reduce [, {include_self = true}]):
-- source's slices along dim reduced into t's slices index[i] ("prod",
-- "mean", "amax", "amin"), through scatter_reduce
function methods.index_reduce(t, dim, index, source, reduce, opts)
  local fn = "index_reduce"
  local d = dim_of(t, dim, fn)
  index, source = want_tensor(index, fn, "index"), want_tensor(source, fn, "source")
  if reduce ~= "prod" and reduce ~= "mean" and reduce ~= "amax" and reduce ~= "amin" then
    raise(fn .. ': expected reduce to be "prod", "mean", "amax" or "amin", got ' .. tostring(reduce))
  end
  if index:dim() ~= 1 or source:dim() ~= t:dim() or source:size(d) ~= index:numel() then
    raise(string.format("%s: expected a 1-D index with one entry per slice of source along dim %d", fn, d))
  end
  local view = {}
  for k = 0, t:dim() - 1 do view[k + 1] = k == d and index:numel() or 1 end
  return t:scatter_reduce(d, index:reshape(view):expand(source:size()), source, reduce, opts)
end
function methods.index_reduce_(t, dim, index, source, reduce, opts)
  return t:copy_(methods.index_reduce(t, dim, index, source, reduce, opts))
end

-- scatter_reduce(dim, index, src, reduce [, {include_self = true}]):
-- "sum", "mean" (the mean of the values gathered, t's own included unless
-- include_self is false), "prod", "amax", "amin"
function methods.scatter_reduce(t, dim, index, src, reduce, opts)
  local include_self = not (type(opts) == "table" and opts.include_self == false)
  if reduce == "prod" or reduce == "amax" or reduce == "amin" then
    local fn = "scatter_reduce"
    local d = dim_of(t, dim, fn)
    index, src = want_tensor(index, fn, "index"), want_tensor(src, fn, "src")
    if index.dtype ~= torch.int64 then raise(fn .. ": expected index to be an int64 tensor, got " .. tostring(index.dtype)) end
    if index:dim() ~= t:dim() or src:dim() ~= t:dim() then
      raise(string.format("%s: expected index and src to have the input's %d dims, got %d and %d", fn, t:dim(),
                          index:dim(), src:dim()))
    end
    for k = 0, t:dim() - 1 do
      if index:size(k) > src:size(k) or (k ~= d and index:size(k) > t:size(k)) then
        raise(string.format("%s: index's size %d in dim %d is larger than src's (%d) or the input's (%d)", fn,
                            index:size(k), k, src:size(k), t:size(k)))
      end
    end
    if index:numel() > 0 and (index:min():item() < 0 or index:max():item() >= t:size(d)) then
      raise(string.format("%s: index out of range for dim %d of size %d", fn, d, t:size(d)))
    end
    return scatter_runs_reduce(t, d, index, src, reduce, include_self)
  end
  if reduce == "sum" then
    local base = include_self and t or t:scatter(dim, index, torch.zeros(index:size(), { dtype = t.dtype, device = t.device }))
    return base:scatter_add(dim, index, src)
  elseif reduce == "mean" then
    local ones = torch.ones_like(src)
    local counted = include_self and torch.ones_like(t) or torch.zeros_like(t)
    local base = include_self and t or torch.zeros_like(t)
    local sums, counts = base:scatter_add(dim, index, src), counted:scatter_add(dim, index, ones)
    local hit = counts:gt(0)
    local mean = sums / torch.where(hit, counts, 1)
    if not t.dtype.is_floating_point then mean = mean:floor():to(t.dtype) end
    return torch.where(hit, mean, t)
  end
  raise('scatter_reduce: expected reduce to be "sum", "prod", "mean", "amax" or "amin", got ' .. tostring(reduce))
end

-- apply_(fn) and map_(other, fn): each element (of a CPU tensor) replaced
-- by fn(x) (fn(x, y)), in place, on the host
local function want_callable(f, fn)
  if type(f) ~= "function" and not (type(f) == "table" and getmetatable(f) and getmetatable(f).__call) then
    raise(fn .. ": expected a function, got " .. typename(f))
  end
end
function methods.apply_(t, fn)
  want_callable(fn, "apply_")
  if t.device.type ~= "cpu" then raise("apply_: only CPU tensors are supported") end
  local vals = host_values(t)
  for i, v in ipairs(vals) do vals[i] = fn(v) end
  return t:copy_(torch.tensor(vals, { dtype = t.dtype }):reshape(t:size()))
end
function methods.map_(t, other, fn)
  want_callable(fn, "map_")
  if t.device.type ~= "cpu" then raise("map_: only CPU tensors are supported") end
  local a, b = host_values(t), host_values(want_tensor(other, "map_", "other"):expand(t:size()))
  for i, v in ipairs(a) do a[i] = fn(v, b[i]) end
  return t:copy_(torch.tensor(a, { dtype = t.dtype }):reshape(t:size()))
end

-- The in-place random fills of the other distributions
function methods.exponential_(t, lambd)
  lambd = want_number(lambd, "exponential_", "lambd", 1)
  local u = torch.rand_like(want_float("exponential_", t)):clamp(1e-300, nil)
  return t:copy_(-u:log() / lambd)
end
function methods.geometric_(t, p)
  p = want_number(p, "geometric_", "p")
  if p <= 0 or p > 1 then raise("geometric_: expected p in (0, 1], got " .. p) end
  local u = torch.rand_like(t:to(torch.float64)):clamp(1e-300, nil)
  return t:copy_((u:log() / math.log(1 - p + 0)):ceil():clamp(1, nil))
end
function methods.cauchy_(t, median, sigma)
  median, sigma = want_number(median, "cauchy_", "median", 0), want_number(sigma, "cauchy_", "sigma", 1)
  return t:copy_(((torch.rand_like(want_float("cauchy_", t)) - 0.5) * math.pi):tan() * sigma + median)
end
function methods.log_normal_(t, mean, std)
  mean, std = want_number(mean, "log_normal_", "mean", 1), want_number(std, "log_normal_", "std", 2)
  return t:copy_((torch.randn_like(want_float("log_normal_", t)) * std + mean):exp())
end
-- random_([from,] to): integers uniform in [from, to) (to alone: [0, to))
function methods.random_(t, from, to)
  if to == nil then from, to = 0, from end
  if to == nil then raise("random_: expected the upper bound (random_(to) or random_(from, to))") end
  return t:copy_(torch.randint(want_int(from, "random_", "from"), want_int(to, "random_", "to"), t:size(),
                               { dtype = torch.float64, device = t.device }))
end

---------------------------------------------------------------- other names and small functions

-- NumPy's names and PyTorch's aliases (split_with_sizes and the unsafe_
-- forms, which only skip a check of views in PyTorch, are split and chunk)
local aliases = { arccos = "acos", arcsin = "asin", arctan = "atan", arccosh = "acosh", arcsinh = "asinh",
                  arctanh = "atanh", arctan2 = "atan2", greater = "gt", greater_equal = "ge", less = "lt",
                  less_equal = "le", not_equal = "ne", fix = "trunc", split_with_sizes = "split",
                  unsafe_split = "split", unsafe_split_with_sizes = "split", unsafe_chunk = "chunk" }
for name, target in pairs(aliases) do methods[name] = function(t, ...) return methods[target](t, ...) end end
-- real tensors: their conjugate, real part and positive are themselves;
-- adjoint (and the properties mT, mH, H) the transpose of the last two dims
local function same(t) return t end
methods.conj, methods.resolve_conj, methods.resolve_neg, methods.conj_physical = same, same, same, same
methods.real, methods.positive = same, same
function methods.adjoint(t) return t:transpose(-2, -1) end
B.getters.mT = methods.adjoint
B.getters.mH = methods.adjoint
B.getters.H = function(t) return t:dim() == 2 and t:t() or t end
function methods.is_conj() return false end
function methods.is_neg() return false end
function methods.isreal(t) return torch.ones_like(t):to(torch.bool) end
function methods.is_nonzero(t)
  if t:numel() ~= 1 then
    raise(t:numel() == 0 and "is_nonzero: Boolean value of Tensor with no values is ambiguous"
          or "is_nonzero: Boolean value of Tensor with more than one value is ambiguous")
  end
  return t:reshape(-1)[0]:item() ~= 0
end
function methods.is_same_size(t, other) return table.concat(t:size(), ",") == table.concat(want_tensor(other, "is_same_size", "other"):size(), ",") end
function methods.isposinf(t) return t:eq(math.huge) end
function methods.isneginf(t) return t:eq(-math.huge) end

-- the in-place forms the compositions lacked: t:copy_(t:op(...))
for _, name in ipairs({ "acos", "asin", "atan", "acosh", "asinh", "atanh", "arccos", "arcsin", "arctan", "arccosh",
                        "arcsinh", "arctanh", "cosh", "sinh", "tan", "deg2rad", "rad2deg", "exp2", "log2", "log10",
                        "frac", "trunc", "fix", "logit", "erfc", "erfinv", "sinc", "lgamma", "digamma", "gcd", "lcm",
                        "ldexp", "fmod", "copysign", "float_power", "heaviside", "lerp", "logaddexp", "hypot",
                        "negative", "clamp_min", "clamp_max", "nan_to_num", "atan2", "arctan2", "xlogy", "i0",
                        "absolute", "addbmm", "addr", "baddbmm", "bitwise_and", "bitwise_not", "bitwise_or",
                        "bitwise_xor", "bitwise_left_shift", "bitwise_right_shift", "cumprod", "cumsum", "divide",
                        "floor_divide", "true_divide", "multiply", "subtract", "greater", "greater_equal", "less",
                        "less_equal", "not_equal", "logical_and", "logical_or", "logical_xor", "logical_not", "sgn",
                        "scatter_reduce", "polygamma", "mvlgamma", "nextafter" }) do
  if methods[name .. "_"] == nil then
    methods[name .. "_"] = function(t, ...) return t:copy_(methods[name](t, ...)) end
  end
end

-- the activations PyTorch also has as methods, from nn.functional
function methods.hardshrink(t, lambd) return torch.nn.functional.hardshrink(t, lambd) end
function methods.prelu(t, weight) return torch.nn.functional.prelu(t, weight) end

-- rsub(other [, alpha]): other - alpha t
function methods.rsub(t, other, alpha) return want_operand(other, "rsub", "other") - t * (alpha or 1) end
-- inner(other): the sum of products over the last dims (dot for vectors)
function methods.inner(t, other)
  want_tensor(other, "inner", "other")
  if t:dim() == 0 or other:dim() == 0 then return t * other end
  return methods.tensordot(t, other, { { -1 }, { -1 } })
end
-- vdot(other): the dot product of two 1-D tensors (real: no conjugate)
function methods.vdot(t, other)
  if t:dim() ~= 1 or not is_tensor(other) or other:dim() ~= 1 then raise("vdot: expected two 1-D tensors") end
  return t:dot(other)
end
function torch.chain_matmul(...)
  local list = select("#", ...) == 1 and type((...)) == "table" and not is_tensor((...)) and (...) or { ... }
  for i = 1, select("#", unpack(list)) do want_tensor(list[i], "chain_matmul", "matrix " .. i) end
  return torch.linalg.multi_dot(list)
end
-- diagflat([offset]): the flattened input on a diagonal
function methods.diagflat(t, offset) return t:reshape(-1):diag(offset or 0) end
-- logaddexp2(other): log2(2^t + 2^other), without overflow
function methods.logaddexp2(t, other)
  local m = torch.maximum(t, other):detach()
  m = torch.where(m:abs():eq(math.huge), 0, m)
  return ((t - m):exp2() + (other - m):exp2()):log2() + m
end
-- fmax / fmin(other): the larger (smaller), a NaN on one side ignored
function methods.fmax(t, other)
  other = want_tensor(other, "fmax", "other")
  return torch.where(t:ne(t), other, torch.where(other:ne(other), t, torch.maximum(t, other)))
end
function methods.fmin(t, other)
  other = want_tensor(other, "fmin", "other")
  return torch.where(t:ne(t), other, torch.where(other:ne(other), t, torch.minimum(t, other)))
end

-- The NaN-ignoring median and quantiles: per slice, the count c of
-- non-NaN values, then positions in the sorted slice (NaN sort last).
local function non_nan(t, d)
  local sorted, order = t:sort(d)
  local count = t:eq(t):to(torch.int64):sum(d, true)
  return sorted, order, count
end
-- nanmedian([dim, keepdim]): the lower median of the non-NaN values (NaN
-- where all are); with a dim also its index
function methods.nanmedian(t, dim, keepdim)
  want_float("nanmedian", t)
  if dim == nil then
    local flat = t:reshape(-1)
    local sorted, _, count = non_nan(flat, 0)
    local k = math.max(math.floor((count:item() - 1) / 2), 0)
    if flat:numel() == 0 then return torch.full({}, 0 / 0, { dtype = t.dtype, device = t.device }) end
    return sorted:narrow(0, k, 1):reshape({})
  end
  local d = dim_of(t, dim, "nanmedian")
  local sorted, order, count = non_nan(t, d)
  local k = ((count - 1):clamp(0, nil)):div(2, "floor")
  local v, i = sorted:gather(d, k), order:gather(d, k)
  if not keepdim then v, i = v:squeeze(d), i:squeeze(d) end
  return v, i
end
-- cov([{correction = 1, fweights, aweights}]): the covariance of the rows
-- (variables) over the columns (observations), weighted as PyTorch's;
-- corrcoef(): the correlation matrix.
function methods.cov(t, opts)
  local fn = "cov"
  opts = B.options(opts, "cov")
  want_float(fn, t)
  if t:dim() > 2 then raise(fn .. ": expected input to have two or fewer dimensions but got an input with " .. t:dim() .. " dimensions") end
  local x = t:dim() < 2 and t:reshape(1, -1) or t
  local n = x:size(1)
  local correction = opts.correction == nil and 1 or opts.correction
  local w
  if opts.fweights ~= nil then w = want_tensor(opts.fweights, fn, "fweights"):to(x.dtype) end
  if opts.aweights ~= nil then
    local a = want_tensor(opts.aweights, fn, "aweights"):to(x.dtype)
    w = w and w * a or a
  end
  local w_sum = w and w:sum() or n
  local mean = w and (x * w):sum(1, true) / w_sum or x:mean(1, true)
  local norm
  if w == nil then norm = n - correction
  elseif correction == 0 or opts.aweights == nil then norm = w_sum - correction
  else norm = w_sum - correction * (w * opts.aweights:to(x.dtype)):sum() / w_sum end
  local c = x - mean
  local cw = w and c * w or c
  local out = cw:matmul(c:t()) / norm
  if t:dim() < 2 then return out:reshape({}) end
  return out
end
function methods.corrcoef(t)
  local c = methods.cov(t)
  if c:dim() == 0 then return c / c end
  local d = c:diagonal():sqrt()
  return (c / d:unsqueeze(1) / d:unsqueeze(0)):clamp(-1, 1)
end

-- unique_consecutive([{return_inverse, return_counts, dim}]): the values
-- with consecutive repeats collapsed (flattened unless dim), and the
-- inverse and counts when asked for; on the host.
function methods.unique_consecutive(t, opts)
  if type(opts) == "boolean" then opts = { return_inverse = opts } end
  opts = B.options(opts, "unique_consecutive")
  local x = t
  local d = opts.dim
  if d == nil then x = t:reshape(-1) end
  d = d == nil and 0 or dim_of(t, d, "unique_consecutive")
  local n = x:dim() == 0 and 1 or x:size(d)
  local keep, inverse, counts = {}, {}, {}
  local prev
  for i = 0, n - 1 do
    local slice = x:select(d, i)
    local same = prev ~= nil and torch.equal(slice, prev)
    if not same then keep[#keep + 1] = i; counts[#counts + 1] = 0 end
    counts[#counts] = counts[#counts] + 1
    inverse[i + 1] = #keep - 1
    prev = slice
  end
  local values = #keep > 0 and x:index_select(d, int64(keep, t.device)) or x:narrow(d, 0, 0)
  local out = { values }
  if opts.return_inverse then
    local inv = #inverse > 0 and int64(inverse, t.device) or torch.zeros(0, { dtype = torch.int64, device = t.device })
    out[#out + 1] = opts.dim == nil and inv:reshape(t:size()) or inv
  end
  if opts.return_counts then
    out[#out + 1] = #counts > 0 and int64(counts, t.device) or torch.zeros(0, { dtype = torch.int64, device = t.device })
  end
  return unpack(out)
end

-- The window functions of signal processing: hann, hamming, blackman,
-- bartlett and kaiser_window(n [, periodic = true, ...] [, opts]), as
-- PyTorch's (periodic: the window of n + 1 points without its last).
local function window(fn, n, periodic, opts, f)
  n = want_int(n, fn, "window_length", nil, 0)
  if type(periodic) == "table" then opts, periodic = periodic, nil end
  if periodic == nil then periodic = true end
  opts = B.options(opts, fn)
  local dt = opts.dtype or torch.get_default_dtype()
  if n == 0 then return torch.zeros(0, { dtype = dt, device = opts.device }) end
  if n == 1 then return torch.ones(1, { dtype = dt, device = opts.device }) end
  local m = periodic and n + 1 or n
  local k = torch.arange(0, n, { dtype = torch.float64 })
  return f(k, m):to(dt):to(opts.device or "cpu")
end
function torch.hann_window(n, periodic, opts)
  return window("hann_window", n, periodic, opts, function(k, m) return 0.5 - 0.5 * (k * (2 * math.pi / (m - 1))):cos() end)
end
function torch.hamming_window(n, periodic, alpha, beta, opts)
  if type(alpha) == "table" then opts, alpha = alpha, nil end
  alpha, beta = alpha or 0.54, beta or 0.46
  return window("hamming_window", n, periodic, opts,
                function(k, m) return alpha - beta * (k * (2 * math.pi / (m - 1))):cos() end)
end
function torch.blackman_window(n, periodic, opts)
  return window("blackman_window", n, periodic, opts, function(k, m)
    local a = k * (2 * math.pi / (m - 1))
    return 0.42 - 0.5 * a:cos() + 0.08 * (a * 2):cos()
  end)
end
function torch.bartlett_window(n, periodic, opts)
  return window("bartlett_window", n, periodic, opts, function(k, m)
    return 1 - (k * (2 / (m - 1)) - 1):abs()
  end)
end
function torch.kaiser_window(n, periodic, beta, opts)
  if type(beta) == "table" then opts, beta = beta, nil end
  beta = beta or 12.0
  return window("kaiser_window", n, periodic, opts, function(k, m)
    local r = k * (2 / (m - 1)) - 1
    return ((1 - r:square()):clamp(0, nil):sqrt() * beta):i0() / torch.tensor(beta, { dtype = torch.float64 }):i0()
  end)
end


function torch.scalar_tensor(v, opts)
  if type(v) ~= "number" and type(v) ~= "boolean" then raise("scalar_tensor: expected a number, got " .. typename(v)) end
  opts = B.options(opts, "scalar_tensor")
  return torch.tensor(v, { dtype = opts.dtype or torch.get_default_dtype(), device = opts.device,
                           requires_grad = opts.requires_grad })
end
torch.asarray = function(obj, opts) return torch.as_tensor(obj, opts) end
function torch.concatenate(list, dim) return torch.cat(list, dim or 0) end

-- result_type(a, b), promote_types(dt1, dt2), can_cast(from, to): PyTorch's
-- type promotion, read from what an addition of the two gives
local function operand(v)
  if is_tensor(v) then return v:detach():reshape(-1):narrow(0, 0, math.min(v:numel(), 1)) end
  if getmetatable(v) == torch.dtype_mt then return torch.zeros(1, { dtype = v }) end
  if type(v) ~= "number" then raise("result_type: expected tensors, dtypes or numbers, got " .. typename(v)) end
  return v
end
function torch.result_type(a, b)
  local x, y = operand(a), operand(b)
  if not is_tensor(x) and not is_tensor(y) then
    return (math.type and math.type(x) == "float" or (x % 1 ~= 0 or y % 1 ~= 0)) and torch.get_default_dtype() or torch.int64
  end
  if not is_tensor(x) then x, y = y, x end
  if x.dtype == torch.bool and is_tensor(y) and y.dtype == torch.bool then return torch.bool end
  return (x + y).dtype
end
function torch.promote_types(a, b)
  if getmetatable(a) ~= torch.dtype_mt or getmetatable(b) ~= torch.dtype_mt then
    raise("promote_types: expected two dtypes")
  end
  return torch.result_type(a, b)
end
local kind = { bool = 0, uint8 = 1, int32 = 1, int64 = 1, bfloat16 = 2, float32 = 2, float64 = 2 }
function torch.can_cast(from, to)
  if getmetatable(from) ~= torch.dtype_mt or getmetatable(to) ~= torch.dtype_mt then raise("can_cast: expected two dtypes") end
  return kind[from.name] <= kind[to.name]
end

-- The in-place view changes: t takes the view's shape and strides (a
-- tensor that requires grad refuses, see dp_set_view)
local C = B.C
for _, name in ipairs({ "unsqueeze", "squeeze", "t", "transpose", "swapdims", "swapaxes" }) do
  methods[name .. "_"] = function(t, ...)
    local v = t[name](t, ...)
    B.check(C.dp_set_view(t.p, v.p))
    return t
  end
end

-- The matrix functions as methods
for _, name in ipairs({ "det", "logdet", "slogdet", "inverse", "pinverse", "matrix_power", "matrix_exp", "cholesky",
                        "qr", "svd", "cholesky_solve", "cholesky_inverse", "lu", "lu_solve", "orgqr",
                        "geqrf", "ormqr", "triangular_solve" }) do
  methods[name] = function(t, ...) return require("dplua.linalg").torch[name](t, ...) end
end

-- What dplua has no dtype for: an error that says so, not a missing method
for name, dt in pairs({ half = "float16", char = "int8", short = "int16" }) do
  methods[name] = function()
    raise(string.format("%s: %s is not a dplua dtype (float32, float64, bfloat16, int64, int32, uint8, bool)", name, dt))
  end
end
function methods.numpy()
  raise("numpy: dplua has no NumPy; t:tolist() gives Lua tables, and torch.save/np.load share .npy files")
end
function methods.is_complex() return false end
function methods.is_signed(t) return t.dtype ~= torch.uint8 and t.dtype ~= torch.bool end
function methods.get_device(t) return t.device.type == "cpu" and -1 or t.device.index end

function methods.cdist(x1, x2, p)
  if type(p) == "table" then p = p.p end
  if not is_tensor(x2) or x1:dim() < 2 or x2:dim() ~= x1:dim() or x1:size(-1) ~= x2:size(-1) then
    raise("cdist: expected x1 (..., P, M) and x2 (..., R, M) of one number of dims and the same M")
  end
  return (x1:unsqueeze(-2) - x2:unsqueeze(-3)):norm(p or 2, -1)
end

return {}
