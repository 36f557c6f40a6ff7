-- torch.testing: assert_close and make_tensor, as PyTorch's.
--
-- assert_close(actual, expected [, opts]) compares tensors, numbers,
-- booleans, strings and (nested) tables of them. Tensors must agree in
-- shape, and by default in device and dtype; their elements are close when
-- |actual - expected| <= atol + rtol |expected| (isclose). The tolerances
-- default by dtype to PyTorch's (float64 1e-7 and 1e-7, float32 1.3e-6 and
-- 1e-5, bfloat16 1.6e-2 and 1e-5, integers and bool exact). The failure
-- says what PyTorch's does: the mismatched elements, the greatest absolute
-- and relative differences and where they are, and for an element of a
-- table its path ([2]["w"], Lua's indices).
local B = require("dplua.base")
local torch = B.torch
local raise, is_tensor, typename = B.raise, B.is_tensor, B.typename

local M = {}

-- dtype name: rtol, atol
local tolerances = {
  float16 = { 1e-3, 1e-5 }, bfloat16 = { 1.6e-2, 1e-5 },
  float32 = { 1.3e-6, 1e-5 }, float64 = { 1e-7, 1e-7 },
}
local function default_tolerances(...)
  local rtol, atol = 0, 0
  for i = 1, select("#", ...) do
    local tol = tolerances[select(i, ...).name]
    if tol then rtol, atol = math.max(rtol, tol[1]), math.max(atol, tol[2]) end
  end
  return rtol, atol
end

-- A number as Python's repr writes a float: the shortest digits that read
-- back as the same double, fixed notation for exponents -4 to 15,
-- otherwise d.ddde+XX. Integral tolerances (atol = 0) print as integers,
-- as PyTorch prints an int.
local function py_float(x)
  if x ~= x then return "nan" end
  if x == math.huge then return "inf" elseif x == -math.huge then return "-inf" end
  local s
  for p = 0, 16 do
    s = string.format("%." .. p .. "e", x)
    if tonumber(s) == x then break end
  end
  local sign, lead, rest, exp = s:match("^(-?)(%d)%.?(%d*)e([-+]%d+)$")
  local digits = (lead .. rest):gsub("0+$", "")
  if digits == "" then digits = "0" end
  local e = tonumber(exp)
  if e < -4 or e >= 16 then
    local mant = #digits > 1 and digits:sub(1, 1) .. "." .. digits:sub(2) or digits
    return string.format("%s%se%s%02d", sign, mant, e < 0 and "-" or "+", math.abs(e))
  end
  if e < 0 then return sign .. "0." .. string.rep("0", -e - 1) .. digits end
  digits = digits .. string.rep("0", math.max(0, e + 1 - #digits))
  local frac = digits:sub(e + 2)
  return sign .. digits:sub(1, e + 1) .. "." .. (frac == "" and "0" or frac)
end
local function py_number(x, integral)
  if integral and x == math.floor(x) and math.abs(x) < 2 ^ 63 then return string.format("%.0f", x) end
  return py_float(x)
end
M._py_float = py_float

local function allowed(tol, exact) return exact and "" or " (up to " .. py_number(tol, true) .. " allowed)" end

-- The message of two numbers (and of two 0-d tensors) that differ.
local function scalar_message(a, e, rtol, atol, integral)
  local exact = rtol == 0 and atol == 0
  local abs = math.abs(a - e)
  return string.format("Scalars are not %s!\n\nAbsolute difference: %s%s\nRelative difference: %s%s",
    exact and "equal" or "close", py_number(abs, integral), allowed(atol, exact),
    py_float(abs / math.abs(e)), allowed(rtol, exact))
end

local function shape_str(t) return tostring(t.shape) end

-- flat element i's index as Python prints a tuple: (1,) or (1, 2)
local function index_str(flat, shape)
  return "(" .. table.concat(require("dplua.autograd")._unravel(flat, shape), ", ") .. (#shape == 1 and ",)" or ")")
end

-- The greatest of diff (a float64 tensor, 0 where the elements matched)
-- and its index in the tensor's shape; NaN is the greatest.
local function greatest(diff, shape)
  local nan = diff:ne(diff)
  local flat
  if nan:any():item() then
    flat = nan:reshape(-1):long():argmax():item()
  else
    flat = diff:reshape(-1):argmax():item()
  end
  return diff:reshape(-1)[flat]:item(), index_str(flat, shape)
end

local function compare_tensors(a, e, o)
  if #a.shape ~= #e.shape or a:numel() ~= e:numel() or shape_str(a) ~= shape_str(e) then
    return string.format("The values for attribute 'shape' do not match: %s != %s.", shape_str(a), shape_str(e))
  end
  if o.check_device ~= false and tostring(a.device) ~= tostring(e.device) then
    return string.format("The values for attribute 'device' do not match: %s != %s.", tostring(a.device), tostring(e.device))
  end
  if o.check_dtype ~= false and a.dtype ~= e.dtype then
    return string.format("The values for attribute 'dtype' do not match: %s != %s.", tostring(a.dtype), tostring(e.dtype))
  end
  local rtol, atol = o.rtol, o.atol
  if rtol == nil then rtol, atol = default_tolerances(a.dtype, e.dtype) end
  a, e = a:detach():cpu(), e:detach():cpu()
  local common = torch.promote_types(a.dtype, e.dtype)
  a, e = a:to(common), e:to(common)
  local close = a:isclose(e, rtol, atol, o.equal_nan)
  if close:all():item() then return nil end
  local floating = common.is_floating_point
  local ad, ed = a:double(), e:double()
  if #a.shape == 0 then
    return scalar_message(ad:item(), ed:item(), rtol, atol, not floating)
  end
  -- the differences of the elements that did not match (PyTorch measures
  -- integers' relative difference in float32)
  local missed = close:logical_not()
  local abs = (ad - ed):abs():masked_fill(close, 0)
  local rel = floating and abs / ed:abs() or ((a:long() - e:long()):abs():float() / e:long():abs():float()):double()
  rel = rel:masked_fill(close, 0)
  local shape = {}
  for d = 1, #a.shape do shape[d] = a.shape[d] end
  local n, total = missed:sum():item(), a:numel()
  local max_abs, at_abs = greatest(abs, shape)
  local max_rel, at_rel = greatest(rel, shape)
  local exact = rtol == 0 and atol == 0
  return string.format("Tensor-likes are not %s!\n\nMismatched elements: %d / %d (%.1f%%)\n"
    .. "Greatest absolute difference: %s at index %s%s\nGreatest relative difference: %s at index %s%s",
    exact and "equal" or "close", n, total, 100 * n / total,
    py_number(max_abs, not floating), at_abs, allowed(atol, exact), py_float(max_rel), at_rel, allowed(rtol, exact))
end

local function is_sequence(t)
  local n = 0
  for _ in pairs(t) do n = n + 1 end
  return n == #t
end

local function key_str(k) return type(k) == "string" and string.format("%q", k) or tostring(k) end

local function sorted_keys(keys)
  local list = {}
  for k in pairs(keys) do list[#list + 1] = k end
  table.sort(list, function(x, y)
    if type(x) == type(y) and (type(x) == "number" or type(x) == "string") then return x < y end
    return type(x) < type(y)
  end)
  for i, k in ipairs(list) do list[i] = key_str(k) end
  return "[" .. table.concat(list, ", ") .. "]"
end

local function kind(v)
  if is_tensor(v) then return "tensor" end
  if type(v) == "table" then return is_sequence(v) and "sequence" or "mapping" end
  return type(v)
end

-- The failure's message and the path to it, or nil when they are close.
local compare
local function compare_tables(a, e, o)
  if is_sequence(a) and is_sequence(e) then
    if #a ~= #e then return string.format("The length of the sequences mismatch: %d != %d", #a, #e) end
    for i = 1, #a do
      local msg, path = compare(a[i], e[i], o)
      if msg then return msg, "[" .. i .. "]" .. (path or "") end
    end
    return nil
  end
  local missing, extra, any_missing, any_extra = {}, {}, false, false
  for k in pairs(e) do if a[k] == nil then missing[k], any_missing = true, true end end
  for k in pairs(a) do if e[k] == nil then extra[k], any_extra = true, true end end
  if any_missing or any_extra then
    return "The keys of the mappings do not match:"
      .. (any_missing and "\nMissing keys in the actual mapping: " .. sorted_keys(missing) or "")
      .. (any_extra and "\nAdditional keys in the actual mapping: " .. sorted_keys(extra) or "")
  end
  local keys = {}
  for k in pairs(a) do keys[#keys + 1] = k end
  table.sort(keys, function(x, y) return tostring(x) < tostring(y) end)
  for _, k in ipairs(keys) do
    local msg, path = compare(a[k], e[k], o)
    if msg then return msg, "[" .. key_str(k) .. "]" .. (path or "") end
  end
  return nil
end

compare = function(a, e, o)
  local ka, ke = kind(a), kind(e)
  if ka == "tensor" and ke == "tensor" then return compare_tensors(a, e, o) end
  if (ka == "sequence" or ka == "mapping") and (ke == "sequence" or ke == "mapping") then
    return compare_tables(a, e, o)
  end
  if ka ~= ke then
    raise(string.format("assert_close: cannot compare %s with %s (a tensor with a tensor, a number with a number, "
      .. "a table with a table)", typename(a), typename(e)))
  end
  if ka == "number" then
    local integral = a % 1 == 0 and e % 1 == 0
    local rtol, atol = o.rtol, o.atol
    if rtol == nil then
      if integral then rtol, atol = 0, 0 else rtol, atol = default_tolerances(torch.float64) end
    end
    local close = a == e or (o.equal_nan and a ~= a and e ~= e)
      or (math.abs(a - e) < math.huge and math.abs(a - e) <= atol + rtol * math.abs(e))
    if not close then return scalar_message(a, e, rtol, atol, integral) end
    return nil
  end
  if ka == "boolean" and a ~= e then return string.format("Booleans mismatch: %s is not %s", tostring(a), tostring(e)) end
  if ka == "string" and a ~= e then return string.format("Strings mismatch: %q is not %q", a, e) end
  if ka ~= "boolean" and ka ~= "string" and ka ~= "nil" then
    raise("assert_close: cannot compare values of type " .. ka)
  end
  return nil
end

-- assert_close(actual, expected [, {rtol=, atol=, equal_nan=false,
-- check_device=true, check_dtype=true, msg=}]): raises the failure's
-- message (or msg: a string, or a function of the message returning one)
function M.assert_close(actual, expected, opts)
  local o = opts or {}
  if type(o) ~= "table" then raise("assert_close: expected the options as a table, got " .. typename(o)) end
  if (o.rtol == nil) ~= (o.atol == nil) then
    raise(string.format("assert_close: both 'rtol' and 'atol' must be either specified or omitted, but got no %s",
      o.rtol == nil and "rtol" or "atol"))
  end
  for _, k in ipairs({ "rtol", "atol" }) do
    if o[k] ~= nil and (type(o[k]) ~= "number" or o[k] < 0) then
      raise(string.format("assert_close: %s must be a number >= 0, got %s", k, tostring(o[k])))
    end
  end
  local msg, path = compare(actual, expected, o)
  if not msg then return end
  if path then msg = msg .. "\n\nThe failure occurred for item " .. path end
  if type(o.msg) == "function" then msg = o.msg(msg) elseif o.msg ~= nil then msg = tostring(o.msg) end
  raise(msg)
end

-- make_tensor(shape, {dtype=, device=, low=, high=, requires_grad=}): PyTorch's
-- test input, uniform in [low, high): floats in [-9, 9) by default,
-- integers in [-9, 10) (uint8 from 0), bool true or false
function M.make_tensor(shape, opts)
  opts = opts or {}
  if type(opts) ~= "table" or is_tensor(opts) then
    raise("make_tensor: expected the options as a table {dtype=, device=, low=, high=}, got " .. typename(opts))
  end
  local dtype = opts.dtype or torch.get_default_dtype()
  local device = opts.device or "cpu"
  if dtype == torch.bool then return torch.randint(0, 2, shape, { device = device }):to(torch.bool) end
  local floating = dtype.is_floating_point
  local low = opts.low or (dtype == torch.uint8 and 0 or -9)
  local high = opts.high or (floating and 9 or 10)
  if low >= high then raise(string.format("make_tensor: low (%s) must be less than high (%s)", low, high)) end
  local t
  if floating then
    t = (torch.rand(shape, { dtype = torch.float64 }) * (high - low) + low):to(dtype)
  else
    t = torch.randint(math.ceil(low), math.ceil(high), shape, { dtype = dtype })
  end
  t = t:to(device)
  if opts.requires_grad then t:requires_grad_() end
  return t
end

return M
