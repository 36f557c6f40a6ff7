-- dplua.print: tostring() of tensors, following PyTorch's formatting rules
-- (torch/_tensor_str.py): precision 4, summarise above 1000 elements with 3
-- edge items, lines of at most 80 characters, scientific notation when the
-- magnitudes span more than 1000x or leave [1e-4, 1e8], and integer-valued
-- floats printed as "1.".
local M = {}

local PRECISION, THRESHOLD, EDGEITEMS, LINEWIDTH = 4, 1000, 3, 80
M.options = { precision = PRECISION, threshold = THRESHOLD, edgeitems = EDGEITEMS, linewidth = LINEWIDTH }

-- set_printoptions({precision =, threshold =, edgeitems =, linewidth =,
-- sci_mode =, profile =}): PyTorch's; profile "default", "short" or
-- "full" first sets all four numbers, the other options then apply;
-- sci_mode true or false forces scientific or fixed notation, nil lets
-- the values choose.
local profiles = {
  default = { precision = PRECISION, threshold = THRESHOLD, edgeitems = EDGEITEMS, linewidth = LINEWIDTH },
  short = { precision = 2, threshold = THRESHOLD, edgeitems = 2, linewidth = LINEWIDTH },
  full = { precision = PRECISION, threshold = math.huge, edgeitems = EDGEITEMS, linewidth = LINEWIDTH },
}
function M.set_printoptions(opts)
  local raise = require("dplua")._raise
  if type(opts) ~= "table" then raise("set_printoptions: expected an options table, got " .. type(opts)) end
  for k, v in pairs(opts) do
    if k == "profile" then
      if not profiles[v] then raise('set_printoptions: expected profile "default", "short" or "full", got ' .. tostring(v)) end
    elseif k == "sci_mode" then
      if type(v) ~= "boolean" then raise("set_printoptions: expected sci_mode to be a boolean, got " .. type(v)) end
    elseif profiles.default[k] ~= nil then
      if type(v) ~= "number" or v < 0 or (v % 1 ~= 0 and v ~= math.huge) then
        raise(string.format("set_printoptions: expected %s to be a non-negative integer, got %s", k, tostring(v)))
      end
    else
      raise("set_printoptions: unknown option '" .. tostring(k) .. "'")
    end
  end
  if opts.profile then
    for k, v in pairs(profiles[opts.profile]) do M.options[k] = v end
    M.options.sci_mode = nil
  end
  for k, v in pairs(opts) do
    if k ~= "profile" then M.options[k] = v end
  end
end

local function is_finite(v) return v == v and v ~= math.huge and v ~= -math.huge end

local function nonfinite_str(v)
  if v ~= v then return "nan" end
  return v > 0 and "inf" or "-inf"
end

-- Python's "{:.Ne}" matches C's "%.Ne"; nan and inf print as Python does.
local function fmt_e(v, width)
  local s = is_finite(v) and string.format("%." .. M.options.precision .. "e", v) or nonfinite_str(v)
  return width and string.rep(" ", width - #s) .. s or s
end
local function fmt_f(v, prec)
  return is_finite(v) and string.format("%." .. prec .. "f", v) or nonfinite_str(v)
end

-- A formatter sees the values that will be printed and picks one style.
local function formatter(values, floating, is_bool)
  local f = { floating = floating, int_mode = true, sci_mode = false, max_width = 1 }
  if not floating then
    for _, v in ipairs(values) do
      local s = is_bool and (v and "True" or "False") or string.format("%d", v)
      if #s > f.max_width then f.max_width = #s end
    end
    return f
  end
  local finite = {}
  for _, v in ipairs(values) do
    if is_finite(v) and v ~= 0 then finite[#finite + 1] = v end
  end
  if #finite == 0 then return f end
  local amin, amax = math.huge, 0
  for _, v in ipairs(finite) do
    local a = math.abs(v)
    if a < amin then amin = a end
    if a > amax then amax = a end
    if v ~= math.ceil(v) then f.int_mode = false end
  end
  local function widen(s) if #s > f.max_width then f.max_width = #s end end
  if f.int_mode then
    f.sci_mode = amax / amin > 1000 or amax > 1e8
  else
    f.sci_mode = amax / amin > 1000 or amax > 1e8 or amin < 1e-4
  end
  for _, v in ipairs(finite) do
    if f.sci_mode then widen(fmt_e(v))
    elseif f.int_mode then widen(fmt_f(v, 0) .. ".")
    else widen(fmt_f(v, M.options.precision)) end
  end
  -- a forced notation keeps the width the values chose, as PyTorch's
  if M.options.sci_mode ~= nil then f.sci_mode = M.options.sci_mode end
  return f
end

local function format_value(f, v, is_bool)
  local s
  if f.floating then
    if f.sci_mode then s = fmt_e(v, f.max_width)
    elseif f.int_mode then
      s = fmt_f(v, 0)
      if is_finite(v) then s = s .. "." end
    else s = fmt_f(v, M.options.precision) end
  elseif is_bool then s = v and "True" or "False"
  else s = string.format("%d", v) end
  return string.rep(" ", f.max_width - #s) .. s
end

-- Values as a nested Lua structure over the (possibly summarised) tensor:
-- node = { leaf values } or { children }, with "..." markers.
local function summarized_values(t, summarize, out)
  local n = t:dim()
  local elements = require("dplua")._elements
  if n == 0 then
    local v = elements(t)
    out[#out + 1] = v[1]
    return
  end
  local size = t:size(0)
  local e = M.options.edgeitems
  local idx = {}
  if summarize and size > 2 * e then
    for i = 0, e - 1 do idx[#idx + 1] = i end
    for i = size - e, size - 1 do idx[#idx + 1] = i end
  else
    for i = 0, size - 1 do idx[#idx + 1] = i end
  end
  if n == 1 then
    local vals = elements(t)
    for _, i in ipairs(idx) do out[#out + 1] = vals[i + 1] end
    return
  end
  for _, i in ipairs(idx) do summarized_values(t[i], summarize, out) end
end

local function vector_str(t, indent, summarize, f, is_bool)
  local element_length = f.max_width + 2
  local per_line = math.max(1, math.floor((M.options.linewidth - indent) / element_length))
  local vals = require("dplua")._elements(t)
  local e = M.options.edgeitems
  local data = {}
  if summarize and #vals > 2 * e then
    for i = 1, e do data[#data + 1] = format_value(f, vals[i], is_bool) end
    data[#data + 1] = " ..."
    for i = #vals - e + 1, #vals do data[#data + 1] = format_value(f, vals[i], is_bool) end
  else
    for i = 1, #vals do data[#data + 1] = format_value(f, vals[i], is_bool) end
  end
  local lines = {}
  for i = 1, #data, per_line do
    lines[#lines + 1] = table.concat(data, ", ", i, math.min(i + per_line - 1, #data))
  end
  return "[" .. table.concat(lines, ",\n" .. string.rep(" ", indent + 1)) .. "]"
end

local function tensor_body(t, indent, summarize, f, is_bool)
  local n = t:dim()
  if n == 0 then return format_value(f, require("dplua")._elements(t)[1], is_bool) end
  if n == 1 then return vector_str(t, indent, summarize, f, is_bool) end
  local size = t:size(0)
  local e = M.options.edgeitems
  local slices = {}
  if summarize and size > 2 * e then
    for i = 0, e - 1 do slices[#slices + 1] = tensor_body(t[i], indent + 1, summarize, f, is_bool) end
    slices[#slices + 1] = "..."
    for i = size - e, size - 1 do slices[#slices + 1] = tensor_body(t[i], indent + 1, summarize, f, is_bool) end
  else
    for i = 0, size - 1 do slices[#slices + 1] = tensor_body(t[i], indent + 1, summarize, f, is_bool) end
  end
  return "[" .. table.concat(slices, "," .. string.rep("\n", n - 1) .. string.rep(" ", indent + 1)) .. "]"
end

local function add_suffixes(str, suffixes, indent)
  local parts = { str }
  -- PyTorch: len(s) - s.rfind("\n") + 1, with rfind 0-based (-1 if none)
  local last_nl = str:match(".*()\n")
  local last_line_len = #str - (last_nl and last_nl - 1 or -1) + 1
  for _, s in ipairs(suffixes) do
    if last_line_len + #s + 2 > M.options.linewidth then
      parts[#parts + 1] = ",\n" .. string.rep(" ", indent) .. s
      last_line_len = indent + #s
    else
      parts[#parts + 1] = ", " .. s
      last_line_len = last_line_len + #s + 2
    end
  end
  parts[#parts + 1] = ")"
  return table.concat(parts)
end

-- The dtypes whose name PyTorch leaves out: the default float, int64, bool.
local function has_default_dtype(t)
  local torch = require("dplua")
  local d = t.dtype
  return d == torch.get_default_dtype() or d == torch.int64 or d == torch.bool
end

function M.tensor_str(t)
  local torch = require("dplua")
  local prefix = "tensor("
  local indent = #prefix
  local suffixes = {}
  local dev = t.device
  if dev.type ~= "cpu" then suffixes[#suffixes + 1] = "device='" .. tostring(dev) .. "'" end
  local body
  if t:numel() == 0 then
    if t:dim() ~= 1 then
      local shape = t:size()
      local inner = table.concat(shape, ", ")
      if #shape == 1 then inner = inner .. "," end
      suffixes[#suffixes + 1] = "size=(" .. inner .. ")"
    end
    if t.dtype ~= torch.get_default_dtype() then suffixes[#suffixes + 1] = "dtype=" .. tostring(t.dtype) end
    body = "[]"
  else
    if not has_default_dtype(t) then suffixes[#suffixes + 1] = "dtype=" .. tostring(t.dtype) end
    local summarize = t:numel() > M.options.threshold
    local is_bool = t.dtype == torch.bool
    local vals = {}
    summarized_values(t, summarize, vals)
    local f = formatter(vals, t.dtype.is_floating_point, is_bool)
    body = tensor_body(t, indent, summarize, f, is_bool)
  end
  local gf = torch._grad_fn_name and torch._grad_fn_name(t)
  if gf then suffixes[#suffixes + 1] = "grad_fn=<" .. gf .. ">"
  elseif torch._requires_grad and torch._requires_grad(t) then suffixes[#suffixes + 1] = "requires_grad=True" end
  return add_suffixes(prefix .. body, suffixes, indent)
end

return M
