-- dplua: tensors for Lua with PyTorch's names.
--
--   local torch = require("dplua")
--   local x = torch.ones(2, 3) * 2
--   print(x:sum():item())          --> 12
--
-- Tensors are C objects reached through LuaJIT's FFI: a Tensor is a small
-- cdata box around a refcounted `dp_tensor *`; its finalizer drops the
-- reference. Every C call returns a status, and a failure becomes a Lua
-- error raised at the caller's line with the C layer's message.
local ffi = require("ffi")

ffi.cdef(require("dplua.cdef"))

-- Inside the dplua program the symbols are in the executable; from plain
-- luajit they come from the installed shared library.
local C
do
  local ok = pcall(function() return ffi.C.dp_version end)
  C = ok and ffi.C or ffi.load("dplua")
end

local torch = {}
local methods = {}          -- Tensor methods, also reachable as torch.NAME
local getters = {}          -- Tensor properties: t.shape, t.dtype, ...

local DP_CPU, DP_ALL_DIMS = -1, -100

---------------------------------------------------------------- errors

-- Errors point at the first stack frame outside the library, so that the
-- user sees their own file and line.
local libdir = debug.getinfo(1, "S").source:match("^@(.*/)") or "\0"
local function raise(msg)
  local level = 2
  while true do
    local info = debug.getinfo(level, "S")
    if not info then level = 1; break end
    local src = info.source
    local inside = info.what == "C" or src:sub(2, #libdir + 1) == libdir
    if not inside then break end
    level = level + 1
  end
  error(msg, level)
end
torch._raise = raise

-- A CUDA out-of-memory also collects the tensors Lua no longer
-- references (the C side has already waited for pending frees and given
-- the pool's cache back), so that running the step again may fit.
local function fail()
  local msg = ffi.string(C.dp_last_error())
  if msg:find("CUDA out of memory", 1, true) then
    collectgarbage()
    collectgarbage()
    msg = msg .. "; the tensors no longer referenced from Lua have now been collected"
  end
  raise(msg)
end

local function check(st)
  if st ~= 0 then fail() end
end

---------------------------------------------------------------- handles

local Tensor_ct = ffi.typeof("dp_tensor_box")
local outp = ffi.new("dp_tensor*[1]")
local outp2 = ffi.new("dp_tensor*[1]")

-- The finalizer is a C function: collecting a tensor runs no Lua code.
local release = C.dp_tensor_box_release
local function wrap(p) return ffi.gc(Tensor_ct(p), release) end

-- Wraps the tensor a C call left in outp, or raises its error.
local collectgarbage = collectgarbage
local function new(st)
  if st ~= 0 then fail() end
  local t = wrap(outp[0])
  -- tensor memory is invisible to Lua's GC: collect when C says it is due
  if C.dp_gc_wanted() ~= 0 then collectgarbage(); C.dp_gc_done(collectgarbage("count")) end
  return t
end

-- Creation functions honour {requires_grad=true}.
local function with_grad(t, opts)
  if opts and opts.requires_grad then check(C.dp_set_requires_grad(t.p, 1)) end
  return t
end

local function is_tensor(x) return ffi.istype(Tensor_ct, x) end
torch.is_tensor = is_tensor

local function typename(x)
  if is_tensor(x) then return "Tensor" end
  return type(x)
end

---------------------------------------------------------------- dtypes and devices

local dtype_mt = { __tostring = function(d) return "torch." .. d.name end }
local dtypes_by_id, dtypes_by_name = {}, {}
local function def_dtype(id, name, ...)
  local d = setmetatable({ id = id, name = name,
                           is_floating_point = C.dp_dtype_is_floating(id) ~= 0,
                           itemsize = tonumber(C.dp_dtype_size(id)) }, dtype_mt)
  dtypes_by_id[id] = d
  dtypes_by_name[name] = d
  torch[name] = d
  for _, alias in ipairs({ ... }) do torch[alias] = d; dtypes_by_name[alias] = d end
end
def_dtype(0, "float32", "float")
def_dtype(1, "float64", "double")
def_dtype(2, "int64", "long")
def_dtype(3, "int32", "int")
def_dtype(4, "uint8")
def_dtype(5, "bool")
def_dtype(6, "bfloat16")
torch.dtype_mt = dtype_mt

local default_dtype = torch.float32
function torch.get_default_dtype() return default_dtype end
function torch.set_default_dtype(d)
  local dt = dtypes_by_name[tostring(d):gsub("^torch%.", "")]
  if not dt or not dt.is_floating_point then raise("set_default_dtype: expected a floating dtype, got " .. tostring(d)) end
  default_dtype = dt
end

local function to_dtype(d, fn)
  if d == nil then return nil end
  if getmetatable(d) == dtype_mt then return d end
  if type(d) == "string" then
    local dt = dtypes_by_name[d:gsub("^torch%.", "")]
    if dt then return dt end
  end
  raise(string.format("%s: expected a dtype (torch.float32, \"int64\", ...), got %s %s",
                      fn, typename(d), tostring(d)))
end

-- Devices are interned objects: torch.device("cuda:0") == t.device works.
local device_mt = {}
device_mt.__index = device_mt
device_mt.__tostring = function(d) return d.str end
local devices = {}
local function device_obj(index)
  local d = devices[index]
  if not d then
    local str = index == DP_CPU and "cpu" or ("cuda:" .. index)
    d = setmetatable({ index = index ~= DP_CPU and index or nil, type = index == DP_CPU and "cpu" or "cuda",
                       str = str, id = index }, device_mt)
    devices[index] = d
  end
  return d
end

local function parse_device(dev, fn)
  if dev == nil then return nil end
  if getmetatable(dev) == device_mt then return dev.id end
  if type(dev) == "number" and dev >= 0 and dev % 1 == 0 then return dev end
  if type(dev) == "string" then
    if dev == "cpu" then return DP_CPU end
    if dev == "cuda" then return torch._current_cuda_device and torch._current_cuda_device() or 0 end
    local i = dev:match("^cuda:(%d+)$")
    if i then return tonumber(i) end
  end
  raise(string.format("%s: expected a device (\"cpu\", \"cuda\", \"cuda:N\"), got %s %s",
                      fn, typename(dev), tostring(dev)))
end

function torch.device(spec, index)
  if spec == nil then raise("device: expected a device (\"cpu\", \"cuda\", \"cuda:N\")") end
  if index ~= nil then
    if type(index) ~= "number" or index < 0 or index % 1 ~= 0 then
      raise(string.format("device: expected the index to be a non-negative integer, got %s %s", typename(index),
                          tostring(index)))
    end
    if type(spec) == "string" then spec = string.format("%s:%d", spec, index) end
  end
  return device_obj(parse_device(spec, "device"))
end

---------------------------------------------------------------- argument parsing

local shape_buf = ffi.new("int64_t[8]")
local dims_buf = ffi.new("int[8]")

-- An integer argument, within int64 (a larger double would reach C as
-- some other number).
local function check_int(v, fn, what)
  if type(v) ~= "number" or v % 1 ~= 0 then
    raise(string.format("%s: expected %s to be an integer, got %s %s", fn, what, typename(v), tostring(v)))
  end
  if v >= 2 ^ 63 or v < -2 ^ 63 then
    raise(string.format("%s: %s %s is out of range (a 64-bit integer)", fn, what, tostring(v)))
  end
  return v
end

-- A dim (a C int; past it any value names no dim).
local function check_dim(v, fn, what)
  check_int(v, fn, what)
  if v >= 2 ^ 31 or v < -2 ^ 31 then
    raise(string.format("%s: %s %s is out of range (a tensor has at most 8 dims)", fn, what, tostring(v)))
  end
  return v
end

-- Reads a shape given as varargs (2, 3) or as one table {2, 3}; returns
-- ndim, with the sizes in shape_buf.
local function parse_shape(fn, first, ...)
  local list = first
  if type(first) ~= "table" then list = { first, ... } end
  local n = #list
  if n > 8 then raise(string.format("%s: at most 8 dimensions are supported, got %d", fn, n)) end
  for i = 1, n do shape_buf[i - 1] = check_int(list[i], fn, "size " .. i) end
  return n
end

-- Splits a trailing options table ({dtype=..., device=...}) off varargs.
local function is_options(t)
  return type(t) == "table" and t[1] == nil and next(t) ~= nil and getmetatable(t) == nil
end
local function split_options(...)
  local n = select("#", ...)
  if n == 0 then return nil, 0 end
  local last = select(n, ...)
  if n > 0 and is_options(last) then return last, n - 1 end
  return nil, n
end

local function creation_opts(opts, fn, default)
  if opts ~= nil and type(opts) ~= "table" then
    raise(string.format("%s: expected options as a table ({dtype=, device=, requires_grad=}), got %s", fn,
                        typename(opts)))
  end
  opts = opts or {}
  local dt = to_dtype(opts.dtype, fn) or default or default_dtype
  local dev = parse_device(opts.device, fn) or DP_CPU
  return dt.id, dev, opts.requires_grad
end

---------------------------------------------------------------- creation

local function sized(fn, maker)
  torch[fn] = function(...)
    local opts, n = split_options(...)
    if n == 0 then raise(fn .. ": expected a shape (sizes or a table of sizes)") end
    if n > 1 and type((...)) == "table" then raise(fn .. ": expected sizes as numbers or one table, not both") end
    local sizes = (...)
    if type(sizes) ~= "table" then sizes = { ... }; sizes[n + 1] = nil end
    local ndim = parse_shape(fn, sizes)
    local dt, dev = creation_opts(opts, fn)
    return with_grad(maker(ndim, dt, dev, opts), opts)
  end
end

sized("zeros", function(nd, dt, dev) return new(C.dp_full(outp, nd, shape_buf, 0, dt, dev)) end)
sized("ones", function(nd, dt, dev) return new(C.dp_full(outp, nd, shape_buf, 1, dt, dev)) end)
sized("empty", function(nd, dt, dev) return new(C.dp_empty(outp, nd, shape_buf, dt, dev)) end)
sized("rand", function(nd, dt, dev) return new(C.dp_rand(outp, nd, shape_buf, dt, dev)) end)
sized("randn", function(nd, dt, dev) return new(C.dp_randn(outp, nd, shape_buf, dt, dev)) end)

local function check_number(v, fn, what)
  if type(v) ~= "number" then
    raise(string.format("%s: expected %s to be a number, got %s %s", fn, what, typename(v), tostring(v)))
  end
  return v
end

function torch.full(shape, value, opts)
  if type(shape) ~= "table" then raise("full: expected the shape as a table, got " .. typename(shape)) end
  local nd = parse_shape("full", shape)
  if type(value) == "boolean" then
    local dt, dev = creation_opts(opts, "full", torch.bool)
    return new(C.dp_full(outp, nd, shape_buf, value and 1 or 0, dt, dev))
  end
  check_number(value, "full", "the fill value")
  local default = value % 1 == 0 and torch.int64 or nil
  local dt, dev = creation_opts(opts, "full", default)
  return with_grad(new(C.dp_full(outp, nd, shape_buf, value, dt, dev)), opts)
end

function torch.arange(a, b, c, d)
  local opts
  if is_options(b) then opts, b = b, nil elseif is_options(c) then opts, c = c, nil elseif is_options(d) then opts = d end
  local start, stop, step = 0, a, 1
  if b ~= nil then start, stop = a, b end
  if c ~= nil then step = c end
  check_number(start, "arange", "start"); check_number(stop, "arange", "end"); check_number(step, "arange", "step")
  local integral = start % 1 == 0 and stop % 1 == 0 and step % 1 == 0
  local dt, dev = creation_opts(opts, "arange", integral and torch.int64 or nil)
  return new(C.dp_arange(outp, start, stop, step, dt, dev))
end

function torch.linspace(start, stop, steps, opts)
  check_number(start, "linspace", "start"); check_number(stop, "linspace", "end")
  check_int(steps, "linspace", "steps")
  local dt, dev = creation_opts(opts, "linspace")
  return new(C.dp_linspace(outp, start, stop, steps, dt, dev))
end

function torch.eye(n, m, opts)
  if is_options(m) then opts, m = m, nil end
  check_int(n, "eye", "n")
  if m ~= nil then check_int(m, "eye", "m") end
  if n < 0 or (m or 0) < 0 then raise("eye: sizes must be non-negative, got " .. n .. (m and (", " .. m) or "")) end
  local dt, dev = creation_opts(opts, "eye")
  return new(C.dp_eye(outp, n, m or -1, dt, dev))
end

function torch.randint(low, high, shape, opts)
  if type(high) == "table" then low, high, shape, opts = 0, low, high, shape end
  check_int(low, "randint", "low"); check_int(high, "randint", "high")
  if type(shape) ~= "table" then raise("randint: expected the shape as a table, got " .. typename(shape)) end
  local nd = parse_shape("randint", shape)
  local dt, dev = creation_opts(opts, "randint", torch.int64)
  return new(C.dp_randint(outp, low, high, nd, shape_buf, dt, dev))
end

function torch.manual_seed(seed)
  if type(seed) ~= "number" or seed % 1 ~= 0 or seed < -2 ^ 63 or seed >= 2 ^ 64 then
    raise("manual_seed: expected an integer seed in [-2^63, 2^64), got " .. typename(seed) .. " " .. tostring(seed))
  end
  -- (as PyTorch: a negative seed is its 64-bit two's complement)
  C.dp_manual_seed(seed < 0 and ffi.cast("uint64_t", ffi.cast("int64_t", seed)) or ffi.cast("uint64_t", seed))
end

-- tensor(data): nested tables are flattened row-major after checking that
-- they are rectangular; numbers give the default dtype (int64 if all are
-- integers), booleans give bool.
local function scan(data, depth, shape, flat, fn)
  if type(data) == "table" and not is_tensor(data) then
    local n = #data
    if shape[depth] == nil then
      if #shape >= 8 then raise(fn .. ": more than 8 nested levels") end
      shape[depth] = n
    elseif shape[depth] ~= n then
      raise(string.format("%s: expected a sequence of length %d at dim %d (got %d): nested tables must be rectangular",
                          fn, shape[depth], depth - 1, n))
    end
    for i = 1, n do scan(data[i], depth + 1, shape, flat, fn) end
    if n == 0 and depth == 1 then shape.empty = true end
  else
    if shape.leaf_depth == nil then shape.leaf_depth = depth
    elseif shape.leaf_depth ~= depth then
      raise(fn .. ": nested tables must be rectangular (a number appears where a table was expected)")
    end
    local tv = type(data)
    if tv == "boolean" then shape.has_bool = true
    elseif tv == "number" then if data % 1 ~= 0 then shape.has_float = true end
    elseif is_tensor(data) and data:numel() == 1 then data = data:item(); tv = type(data)
      if tv == "boolean" then shape.has_bool = true elseif data % 1 ~= 0 then shape.has_float = true end
    else
      raise(string.format("%s: expected numbers, booleans or nested tables of them, got %s", fn, typename(data)))
    end
    flat[#flat + 1] = data
  end
end

-- The dtypes whose range torch.tensor checks (dp_dtype_holds, full's rule):
-- the integers; a float past its range becomes an infinity, as in PyTorch.
local checked_range = { int64 = true, int32 = true, uint8 = true }

function torch.tensor(data, opts)
  if opts ~= nil and type(opts) ~= "table" then
    raise("tensor: expected an options table ({dtype=, device=, requires_grad=}), got " .. typename(opts))
  end
  if is_tensor(data) then
    local t = data:clone()
    if opts and (opts.dtype or opts.device) then t = t:to(opts.device or t.device, opts.dtype or t.dtype) end
    return t
  end
  local shape, flat = {}, {}
  scan(data, 1, shape, flat, "tensor")
  -- Lua has one number type, so numbers give the default float dtype
  -- (PyTorch's ints become int64 only when asked: {dtype=torch.int64}).
  local default = shape.has_bool and torch.bool or default_dtype
  local dt, dev = creation_opts(opts, "tensor", default)
  local nd = #shape
  for i = 1, nd do shape_buf[i - 1] = shape[i] end
  local t = new(C.dp_empty(outp, nd, shape_buf, dt, DP_CPU))
  -- fill through a float64 staging tensor so every dtype's rounding is the C layer's
  local n = #flat
  if n > 0 then
    shape_buf[0] = n
    local stage = new(C.dp_empty(outp, 1, shape_buf, 1, DP_CPU))
    local p = ffi.cast("double *", C.dp_tensor_data(stage.p))
    local checked = checked_range[dtypes_by_id[dt].name]
    for i = 1, n do
      local v = flat[i]
      if v == true then v = 1 elseif v == false then v = 0 end
      if checked and C.dp_dtype_holds(dt, v) == 0 then
        raise(string.format("tensor: value %s cannot be converted to %s without overflow", tostring(v),
                            dtypes_by_id[dt].name))
      end
      p[i - 1] = v
    end
    for i = 1, nd do shape_buf[i - 1] = shape[i] end
    local view = new(C.dp_view(outp, stage.p, nd, shape_buf))
    check(C.dp_copy_(t.p, view.p))
  end
  if dev ~= DP_CPU then t = t:to(device_obj(dev)) end
  return with_grad(t, opts)
end

local function like(fn, maker)
  torch[fn] = function(t, ...)
    if not is_tensor(t) then raise(fn .. ": expected a tensor, got " .. typename(t)) end
    local n = select("#", ...)
    local opts = n > 0 and select(n, ...) or nil
    opts = is_options(opts) and opts or {}
    local full = { dtype = opts.dtype or t.dtype, device = opts.device or t.device }
    return maker(t, full, ...)
  end
end
like("zeros_like", function(t, o) return torch.zeros(t:size(), o) end)
like("ones_like", function(t, o) return torch.ones(t:size(), o) end)
like("empty_like", function(t, o) return torch.empty(t:size(), o) end)
like("rand_like", function(t, o) return torch.rand(t:size(), o) end)
like("randn_like", function(t, o) return torch.randn(t:size(), o) end)
like("full_like", function(t, o, v) return torch.full(t:size(), v, o) end)
like("randint_like", function(t, o, low, high)
  if high == nil or is_options(high) then low, high = 0, low end
  return torch.randint(low, high, t:size(), o)
end)

---------------------------------------------------------------- inspection

function methods.dim(t) return C.dp_tensor_ndim(t.p) end
methods.ndimension = methods.dim
function methods.numel(t) return tonumber(C.dp_tensor_numel(t.p)) end
methods.nelement = methods.numel

local size_mt = { __tostring = function(s) return "torch.Size([" .. table.concat(s, ", ") .. "])" end }
local function shape_of(t)
  if not is_tensor(t) then raise("expected a tensor, got " .. typename(t)) end
  local n = C.dp_tensor_ndim(t.p)
  local s = {}
  for i = 0, n - 1 do s[i + 1] = tonumber(C.dp_tensor_size(t.p, i)) end
  return setmetatable(s, size_mt)
end

local function wrap_dim(t, d, fn)
  check_dim(d, fn, "dim")
  local n = C.dp_tensor_ndim(t.p)
  local lim = n > 0 and n or 1
  if d < -lim or d >= lim then
    raise(string.format("%s: dim %d is out of range for a tensor of %d dimensions (expected a dim in [%d, %d])",
                        fn, d, n, -lim, lim - 1))
  end
  return d < 0 and d + lim or d
end

function methods.size(t, d)
  if d == nil then return shape_of(t) end
  if C.dp_tensor_ndim(t.p) == 0 then raise("size: a 0-d tensor has no dimensions") end
  return tonumber(C.dp_tensor_size(t.p, wrap_dim(t, d, "size")))
end

function methods.stride(t, d)
  if d ~= nil then return tonumber(C.dp_tensor_stride(t.p, wrap_dim(t, d, "stride"))) end
  local s = {}
  for i = 0, C.dp_tensor_ndim(t.p) - 1 do s[i + 1] = tonumber(C.dp_tensor_stride(t.p, i)) end
  return s
end

function methods.is_contiguous(t) return C.dp_tensor_is_contiguous(t.p) ~= 0 end
function methods.element_size(t) return tonumber(C.dp_dtype_size(C.dp_tensor_dtype(t.p))) end
function methods.is_floating_point(t) return C.dp_dtype_is_floating(C.dp_tensor_dtype(t.p)) ~= 0 end
-- The pointer and the current stream leave dplua: the work waiting to be
-- launched (src/core/gpu.c) is launched first, so that what another
-- library enqueues with them comes after it.
function methods.data_ptr(t)
  C.dp_cuda_launch_deferred()
  return C.dp_tensor_data(t.p)
end

getters.shape = shape_of
getters.dtype = function(t) return dtypes_by_id[C.dp_tensor_dtype(t.p)] end
getters.device = function(t) return device_obj(C.dp_tensor_device(t.p)) end
getters.ndim = methods.dim
getters.is_cuda = function(t) return C.dp_tensor_device(t.p) ~= DP_CPU end
getters.T = function(t)
  local n = C.dp_tensor_ndim(t.p)
  local dims = {}
  for i = 1, n do dims[i] = n - i end
  return methods.permute(t, dims)
end

local type_names = { float32 = "torch.FloatTensor", float64 = "torch.DoubleTensor", int64 = "torch.LongTensor",
                     int32 = "torch.IntTensor", uint8 = "torch.ByteTensor", bool = "torch.BoolTensor",
                     bfloat16 = "torch.BFloat16Tensor" }
local dtypes_by_type_name = {}
for dt_name, type_name in pairs(type_names) do dtypes_by_type_name[type_name] = dt_name end
-- t:type() is its type's name; t:type(dtype) or t:type("torch.DoubleTensor")
-- (a "torch.cuda." name: on the current GPU) converts.
function methods.type(t, dt)
  if type(dt) == "string" then
    local cpu_name, on_gpu = dt:gsub("^torch%.cuda%.", "torch.")
    if dtypes_by_type_name[cpu_name] then
      return methods.to(t, { dtype = dtypes_by_type_name[cpu_name], device = on_gpu > 0 and "cuda" or "cpu" })
    end
  end
  if type(dt) == "string" and not dtypes_by_name[dt:gsub("^torch%.", "")] then
    raise("type: unknown type " .. dt .. " (expected a dtype, or a name such as torch.FloatTensor)")
  end
  if dt ~= nil then return methods.to(t, dt) end
  local name = type_names[getters.dtype(t).name]
  return C.dp_tensor_device(t.p) == DP_CPU and name or name:gsub("^torch%.", "torch.cuda.")
end

---------------------------------------------------------------- views

local function shape_method(cfn, fn)
  return function(t, ...)
    local nd = parse_shape(fn, ...)
    return new(cfn(outp, t.p, nd, shape_buf))
  end
end
methods.view = shape_method(C.dp_view, "view")
methods.reshape = shape_method(C.dp_reshape, "reshape")
methods.expand = shape_method(C.dp_expand, "expand")
function methods.view_as(t, o) return methods.view(t, shape_of(o)) end
function methods.reshape_as(t, o) return methods.reshape(t, shape_of(o)) end
function methods.expand_as(t, o) return methods.expand(t, shape_of(o)) end

function methods.permute(t, first, ...)
  local list = type(first) == "table" and first or { first, ... }
  local n = #list
  if n > 8 then raise("permute: too many dims") end
  for i = 1, n do dims_buf[i - 1] = check_dim(list[i], "permute", "dim") end
  return new(C.dp_permute(outp, t.p, n, dims_buf))
end

function methods.transpose(t, d0, d1)
  return new(C.dp_transpose(outp, t.p, check_dim(d0, "transpose", "dim0"), check_dim(d1, "transpose", "dim1")))
end

function methods.t(t)
  local n = C.dp_tensor_ndim(t.p)
  if n > 2 then raise(string.format("t: expects a tensor with <= 2 dimensions, but self is %dD", n)) end
  if n < 2 then return new(C.dp_alias(outp, t.p)) end
  return methods.transpose(t, 0, 1)
end

function methods.contiguous(t) return new(C.dp_contiguous(outp, t.p)) end

function methods.squeeze(t, d)
  if d == nil then return new(C.dp_squeeze(outp, t.p, DP_ALL_DIMS)) end
  return new(C.dp_squeeze(outp, t.p, check_dim(d, "squeeze", "dim")))
end

function methods.unsqueeze(t, d) return new(C.dp_unsqueeze(outp, t.p, check_dim(d, "unsqueeze", "dim"))) end

function methods.narrow(t, d, start, len)
  return new(C.dp_narrow(outp, t.p, check_dim(d, "narrow", "dim"), check_int(start, "narrow", "start"),
                         check_int(len, "narrow", "length")))
end

-- split(split_size or {sizes}, dim=0): a Lua list of views along dim, each
-- split_size long (the last one shorter), or of the given sizes, which
-- must add up to the dim's size. chunk(n, dim=0): at most n views, each
-- ceil(size / n) long. As PyTorch's, an empty dim gives empty views.
local function at_least_1d(t, fn)
  if t:dim() == 0 then raise(fn .. ": expected a tensor of at least 1 dim, got a 0-d tensor") end
end

function methods.split(t, sizes, d)
  at_least_1d(t, "split")
  d = wrap_dim(t, d or 0, "split")
  local total, out, start = shape_of(t)[d + 1], {}, 0
  if type(sizes) == "table" then
    local sum = 0   -- (in doubles: sizes near 2^62 cannot wrap around to the dim's size)
    for i = 1, #sizes do
      local n = check_int(sizes[i], "split", "a split size")
      if n < 0 then raise(string.format("split: split sizes must not be negative, got %d", n)) end
      sum = sum + n
    end
    if sum ~= total then
      raise(string.format("split: the split sizes add up to %.0f, but dim %d has size %d", sum, d, total))
    end
    for i = 1, #sizes do
      out[i] = methods.narrow(t, d, start, sizes[i])
      start = start + sizes[i]
    end
    return out
  end
  local step = check_int(sizes, "split", "split_size")
  if step < 0 or (step == 0 and total > 0) then
    raise(string.format("split: split_size must be positive for a dim of size %d, got %d", total, step))
  end
  repeat
    local len = math.min(step, total - start)
    out[#out + 1] = methods.narrow(t, d, start, len)
    start = start + len
  until start >= total
  return out
end

function methods.chunk(t, chunks, d)
  chunks = check_int(chunks, "chunk", "chunks")
  if chunks <= 0 then raise(string.format("chunk: expected a positive number of chunks, got %d", chunks)) end
  at_least_1d(t, "chunk")
  d = wrap_dim(t, d or 0, "chunk")
  local total = shape_of(t)[d + 1]
  if total == 0 then
    local out = {}
    for i = 1, chunks do out[i] = methods.narrow(t, d, 0, 0) end
    return out
  end
  return methods.split(t, math.ceil(total / chunks), d)
end

function methods.select(t, d, i)
  return new(C.dp_select(outp, t.p, check_dim(d, "select", "dim"), check_int(i, "select", "index")))
end

function methods.flatten(t, s, e)
  local n = C.dp_tensor_ndim(t.p)
  if n == 0 then return methods.reshape(t, 1) end
  s = wrap_dim(t, s or 0, "flatten"); e = wrap_dim(t, e or -1, "flatten")
  if s > e then raise("flatten: start_dim cannot come after end_dim") end
  local shape, sizes = {}, shape_of(t)
  for i = 1, s do shape[#shape + 1] = sizes[i] end
  local prod = 1
  for i = s + 1, e + 1 do prod = prod * sizes[i] end
  shape[#shape + 1] = prod
  for i = e + 2, n do shape[#shape + 1] = sizes[i] end
  return methods.reshape(t, shape)
end

function methods.detach(t) return new(C.dp_alias(outp, t.p)) end
function methods.clone(t) return new(C.dp_clone(outp, t.p)) end

-- t[i] and t[{...}] -----------------------------------------------------

local function index_view(t, key)
  if type(key) == "number" then
    if C.dp_tensor_ndim(t.p) == 0 then raise("index: invalid index of a 0-d tensor") end
    return new(C.dp_select(outp, t.p, 0, check_int(key, "index", "index")))
  end
  if type(key) ~= "table" then raise("index: expected a number or a table of indices, got " .. typename(key)) end
  local v, d = t, 0
  for k = 1, #key do
    local e = key[k]
    if type(e) == "number" then
      if d >= C.dp_tensor_ndim(v.p) then
        raise(string.format("index: too many indices for a tensor of dimension %d", C.dp_tensor_ndim(t.p)))
      end
      v = new(C.dp_select(outp, v.p, d, check_int(e, "index", "index")))
    elseif type(e) == "table" then
      if d >= C.dp_tensor_ndim(v.p) then
        raise(string.format("index: too many indices for a tensor of dimension %d", C.dp_tensor_ndim(t.p)))
      end
      local size = tonumber(C.dp_tensor_size(v.p, d))
      local start, stop, step = e[1] or 0, e[2] or size, e[3] or 1
      check_int(start, "index", "slice start"); check_int(stop, "index", "slice stop"); check_int(step, "index", "slice step")
      v = new(C.dp_slice(outp, v.p, d, start, stop, step))
      d = d + 1
    else
      raise("index: each index must be a number or a {start, stop[, step]} table, got " .. typename(e))
    end
  end
  return v
end

local function assign(t, key, value)
  local view = index_view(t, key)
  if is_tensor(value) then check(C.dp_copy_(view.p, value.p))
  elseif type(value) == "number" then check(C.dp_fill_(view.p, value))
  elseif type(value) == "boolean" then check(C.dp_fill_(view.p, value and 1 or 0))
  else raise("index assignment: expected a tensor or a number, got " .. typename(value)) end
end

---------------------------------------------------------------- math

local UN = { neg = 0, abs = 1, exp = 2, log = 3, sqrt = 4, rsqrt = 5, tanh = 6, sigmoid = 7, relu = 8,
             gelu = 9, sin = 10, cos = 11, sign = 12, floor = 13, ceil = 14, round = 15, reciprocal = 16,
             log1p = 17, expm1 = 18, logical_not = 19, square = 20 }
local GELU_TANH = 21
local BIN = { add = 0, sub = 1, mul = 2, div = 3, pow = 4, maximum = 5, minimum = 6, eq = 7, ne = 8,
              lt = 9, le = 10, gt = 11, ge = 12, remainder = 13, atan2 = 14, logical_and = 15, logical_or = 16 }
local RED = { sum = 0, mean = 1, prod = 2, max = 3, min = 4, argmax = 5, argmin = 6, var = 7, std = 8,
              all = 9, any = 10 }
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

-- add/sub with alpha: a + alpha * b, as in PyTorch
local function scaled(b, alpha, fn)
  if alpha == nil or alpha == 1 then return b end
  check_number(alpha, fn, "alpha")
  return binary(BIN.mul, b, alpha, fn)
end
function methods.add(a, b, alpha) return binary(BIN.add, a, scaled(b, alpha, "add"), "add") end
function methods.sub(a, b, alpha) return binary(BIN.sub, a, scaled(b, alpha, "sub"), "sub") end
function methods.add_(a, b, alpha) return binary_into(BIN.add, a, a, scaled(b, alpha, "add_"), "add_") end
function methods.sub_(a, b, alpha) return binary_into(BIN.sub, a, a, scaled(b, alpha, "sub_"), "sub_") end
methods.multiply, methods.divide, methods.subtract = methods.mul, methods.div, methods.sub
methods.true_divide = methods.div

function methods.zero_(t) check(C.dp_fill_(t.p, 0)); return t end
function methods.fill_(t, v)
  if type(v) == "boolean" then v = v and 1 or 0 end
  if is_tensor(v) then v = v:item(); if type(v) == "boolean" then v = v and 1 or 0 end end
  check(C.dp_fill_(t.p, check_number(v, "fill_", "value")))
  return t
end
function methods.copy_(t, src)
  if not is_tensor(src) then raise("copy_: expected a tensor source, got " .. typename(src)) end
  check(C.dp_copy_(t.p, src.p))
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
  if type(a) == "number" then a = torch.full({}, a, { dtype = is_tensor(b) and b.dtype or nil }) end
  if type(b) == "number" then b = torch.full({}, b, { dtype = a.dtype }) end
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
  if C.dp_copy_(t.p, masked(t, mask, value, "masked_fill_").p) ~= 0 then
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

-- Reductions -------------------------------------------------------------

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
  local a = t:abs()
  if p == math.huge then return a:amax(dim, keepdim) end
  if p == -math.huge then return a:amin(dim, keepdim) end
  if p == 0 then return a:ne(0):to(t.dtype):sum(dim, keepdim) end
  if p == 1 then return a:sum(dim, keepdim) end
  if p == 2 then return (a * a):sum(dim, keepdim):sqrt() end
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

function methods.index_select(t, dim, index)
  if not is_tensor(index) then raise("index_select: expected index to be a tensor, got " .. typename(index)) end
  return new(C.dp_index_select(outp, t.p, check_dim(dim, "index_select", "dim"), index.p))
end

function methods.gather(t, dim, index)
  if not is_tensor(index) then raise("gather: expected index to be a tensor, got " .. typename(index)) end
  return new(C.dp_gather(outp, t.p, check_dim(dim, "gather", "dim"), index.p))
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

---------------------------------------------------------------- conversion

-- to(dtype), to(device), to(device, dtype), to(other_tensor), to{dtype=, device=}
function methods.to(t, a, b)
  local dt, dev = C.dp_tensor_dtype(t.p), C.dp_tensor_device(t.p)
  local function take(x)
    if x == nil then return end
    if is_tensor(x) then dt, dev = C.dp_tensor_dtype(x.p), C.dp_tensor_device(x.p)
    elseif getmetatable(x) == dtype_mt or (type(x) == "string" and dtypes_by_name[x:gsub("^torch%.", "")]) then
      dt = to_dtype(x, "to").id
    elseif is_options(x) then
      if x.dtype then dt = to_dtype(x.dtype, "to").id end
      if x.device then dev = parse_device(x.device, "to") end
    else dev = parse_device(x, "to") end
  end
  take(a); take(b)
  return new(C.dp_to(outp, t.p, dt, dev))
end

for name, dt in pairs({ float = 0, double = 1, long = 2, int = 3, byte = 4, bool = 5, bfloat16 = 6 }) do
  methods[name] = function(t) return new(C.dp_to(outp, t.p, dt, C.dp_tensor_device(t.p))) end
end
function methods.cpu(t) return new(C.dp_to(outp, t.p, C.dp_tensor_dtype(t.p), DP_CPU)) end
function methods.cuda(t, index)
  return new(C.dp_to(outp, t.p, C.dp_tensor_dtype(t.p), parse_device(index or "cuda", "cuda")))
end

local item_d, item_i = ffi.new("double[1]"), ffi.new("int64_t[1]")

-- Element i of a double array as a Lua number. LuaJIT keeps its other
-- values in the NaN space of doubles: a NaN whose high word is 0xfff80000
-- or more (uninitialised memory from torch.empty can hold one, and
-- arithmetic keeps its bits) would reach Lua as a tagged value, a nil or a
-- bogus pointer, and crash the process. Such NaNs are read as Lua's own.
-- words: the same memory as uint32_t; a little-endian double's high word
-- is its second half.
local function read_double(p, words, i)
  if words[2 * i + 1] >= 0xfff80000 then return 0 / 0 end
  return p[i]
end
local item_words = ffi.cast("uint32_t *", item_d)
function methods.item(t)
  local dt = C.dp_tensor_dtype(t.p)
  if dt == 2 then
    check(C.dp_item_int64(t.p, item_i))
    local v = item_i[0]
    if v >= -9007199254740992LL and v <= 9007199254740992LL then return tonumber(v) end
    return v  -- beyond 2^53: keep the exact int64 cdata
  end
  check(C.dp_item(t.p, item_d))
  local v = read_double(item_d, item_words, 0)
  if dt == 5 then return v ~= 0 end
  return v
end

-- Reads every element as a Lua value, through a contiguous float64 (or
-- int64) copy so that one loop serves every dtype.
local function elements(t)
  local dt = C.dp_tensor_dtype(t.p)
  local n = tonumber(C.dp_tensor_numel(t.p))
  local stage_dt = dt == 2 and 2 or 1
  local c = new(C.dp_to(outp, t.p, stage_dt, C.dp_tensor_device(t.p)))
  c = new(C.dp_contiguous(outp, c.p))
  if C.dp_tensor_device(c.p) ~= DP_CPU then c = methods.cpu(c) end
  local p = ffi.cast(stage_dt == 2 and "int64_t *" or "double *", C.dp_tensor_data(c.p))
  local words = ffi.cast("uint32_t *", p)
  local out = {}
  for i = 0, n - 1 do
    local v = stage_dt == 2 and tonumber(p[i]) or read_double(p, words, i)
    if dt == 5 then v = v ~= 0 end
    out[i + 1] = v
  end
  return out, n
end
torch._elements = elements

function methods.tolist(t)
  local flat = elements(t)
  local shape = shape_of(t)
  if #shape == 0 then return flat[1] end
  local pos = 0
  local function build(d)
    local r = {}
    for i = 1, shape[d] do
      if d == #shape then pos = pos + 1; r[i] = flat[pos] else r[i] = build(d + 1) end
    end
    return r
  end
  return build(1)
end

---------------------------------------------------------------- autograd

getters.requires_grad = function(t) return C.dp_requires_grad(t.p) ~= 0 end
getters.is_leaf = function(t) return C.dp_is_leaf(t.p) ~= 0 end
getters.grad = function(t)
  local g = C.dp_get_grad(t.p)
  if g == nil then return nil end
  return wrap(g)
end
local grad_fn_mt = { __tostring = function(f) return "<" .. f.name .. ">" end }
getters.grad_fn = function(t)
  local name = C.dp_grad_fn_name(t.p)
  if name == nil then return nil end
  return setmetatable({ name = ffi.string(name) }, grad_fn_mt)
end
getters.data = function(t) return new(C.dp_alias(outp, t.p)) end

local setters = {}
setters.requires_grad = function(t, v) check(C.dp_set_requires_grad(t.p, v and 1 or 0)) end
setters.grad = function(t, g)
  if g ~= nil and not is_tensor(g) then raise("grad: expected a tensor or nil, got " .. typename(g)) end
  check(C.dp_set_grad(t.p, g and g.p or nil))
end

function methods.requires_grad_(t, flag)
  check(C.dp_set_requires_grad(t.p, (flag == nil or flag) and 1 or 0))
  return t
end

-- backward([gradient] [, {retain_graph=true}]) or backward(gradient, retain_graph)
function methods.backward(t, gradient, retain)
  if is_options(gradient) then gradient, retain = nil, gradient end
  if type(retain) == "table" then retain = retain.retain_graph end
  if gradient ~= nil and not is_tensor(gradient) then
    raise("backward: expected the gradient to be a tensor, got " .. typename(gradient))
  end
  check(C.dp_backward(t.p, gradient and gradient.p or nil, retain and 1 or 0))
end

-- The tail of a context manager: finally(undo, arg, pcall(fn, ...)) calls
-- undo(arg) whatever fn did, then raises fn's error again or returns its
-- results (through varargs: no table per call).
local function finally(undo, arg, ok, ...)
  undo(arg)
  if not ok then error((...), 0) end
  return ...
end
torch._finally = finally

-- Runs fn with grad mode set, restoring the previous mode even on error.
local function with_grad_mode(enabled, fn, ...)
  return finally(C.dp_set_grad_enabled, C.dp_set_grad_enabled(enabled), pcall(fn, ...))
end

function torch.no_grad(fn, ...)
  if type(fn) ~= "function" then raise("no_grad: expected a function to run without recording, got " .. typename(fn)) end
  return with_grad_mode(0, fn, ...)
end
function torch.enable_grad(fn, ...) return with_grad_mode(1, fn, ...) end
function torch.set_grad_enabled(flag) C.dp_set_grad_enabled(flag and 1 or 0) end
function torch.is_grad_enabled() return C.dp_is_grad_enabled() ~= 0 end

torch._grad_fn_name = function(t)
  local name = C.dp_grad_fn_name(t.p)
  return name ~= nil and ffi.string(name) or nil
end
torch._requires_grad = function(t) return C.dp_requires_grad(t.p) ~= 0 end

---------------------------------------------------------------- fused nn and optim primitives
-- Thin wrappers with the C argument order; dplua.nn and dplua.optim build
-- the PyTorch-shaped API on them.

local function opt_p(t)
  if t == nil then return nil end
  if not is_tensor(t) then raise("expected a tensor or nil, got " .. typename(t)) end
  return t.p
end
local i64x2 = { ffi.new("int64_t[2]"), ffi.new("int64_t[2]"), ffi.new("int64_t[2]"), ffi.new("int64_t[2]") }
local function pair(buf, v, fn, what)
  if type(v) == "number" then v = { v, v } end
  if type(v) ~= "table" or #v ~= 2 then raise(string.format("%s: expected %s as a number or a pair, got %s", fn, what, typename(v))) end
  buf[0] = check_int(v[1], fn, what); buf[1] = check_int(v[2], fn, what)
  return buf
end

function torch._linear(x, w, b)
  if not is_tensor(x) or not is_tensor(w) then raise("linear: expected input and weight tensors") end
  return new(C.dp_linear(outp, x.p, w.p, opt_p(b)))
end
-- act(linear(x, w, b)) as one node, the activation in the product's
-- epilogue (nn.Sequential's Linear then ReLU or GELU): act "relu", "gelu"
-- or "gelu_tanh" (GELU with approximate="tanh")
local linear_acts = { relu = C.DP_RELU, gelu = C.DP_GELU, gelu_tanh = C.DP_GELU_TANH }
function torch._linear_act(x, w, b, act)
  if not is_tensor(x) or not is_tensor(w) then raise("linear: expected input and weight tensors") end
  local op = linear_acts[act]
  if op == nil then
    raise(string.format('linear: the activation must be "relu", "gelu" or "gelu_tanh", got %s', tostring(act)))
  end
  return new(C.dp_linear_act(outp, x.p, w.p, opt_p(b), op))
end

function torch._cross_entropy(input, target, weight, ignore_index, label_smoothing, reduction, log_probs)
  if not is_tensor(input) or not is_tensor(target) then
    raise(string.format("cross_entropy: expected input and target tensors, got %s and %s", typename(input), typename(target)))
  end
  return new(C.dp_cross_entropy(outp, input.p, target.p, opt_p(weight), ignore_index or -100,
                                label_smoothing or 0, reduction or 1, log_probs and 1 or 0))
end

function torch._unfold(x, kernel, stride, padding, dilation, pad_value)
  if not is_tensor(x) then raise("unfold: expected a tensor, got " .. typename(x)) end
  return new(C.dp_unfold(outp, x.p, pair(i64x2[1], kernel, "unfold", "kernel_size"),
                         pair(i64x2[2], stride or kernel, "unfold", "stride"),
                         pair(i64x2[3], padding or 0, "unfold", "padding"),
                         pair(i64x2[4], dilation or 1, "unfold", "dilation"), pad_value or 0))
end

function torch._sgd_step(p, g, buf, lr, momentum, dampening, nesterov, weight_decay, first_step)
  check(C.dp_sgd_step(p.p, g.p, opt_p(buf), lr, momentum or 0, dampening or 0, nesterov and 1 or 0,
                      weight_decay or 0, first_step and 1 or 0))
end

function torch._adam_step(p, g, m, v, vmax, lr, beta1, beta2, eps, weight_decay, decoupled, step)
  check(C.dp_adam_step(p.p, g.p, m.p, v.p, opt_p(vmax), lr, beta1, beta2, eps, weight_decay or 0,
                       decoupled and 1 or 0, step))
end
-- capturable: the step count is a 0-d float64 tensor beside p, incremented here
function torch._adam_step_t(p, g, m, v, vmax, lr, beta1, beta2, eps, weight_decay, decoupled, step_t)
  check(C.dp_adam_step_t(p.p, g.p, m.p, v.p, opt_p(vmax), lr, beta1, beta2, eps, weight_decay or 0,
                         decoupled and 1 or 0, step_t.p))
end

local params_buf = ffi.new("dp_tensor*[?]", 4096)
function torch._flatten_params(list)
  local n = #list
  if n == 0 then raise("flatten_params: expected at least one parameter") end
  if n > 4096 then raise("flatten_params: at most 4096 parameters in one group") end
  for i = 1, n do
    if not is_tensor(list[i]) then raise("flatten_params: expected tensors, got " .. typename(list[i]) .. " at " .. i) end
    params_buf[i - 1] = list[i].p
  end
  check(C.dp_flatten_params(outp, outp2, n, params_buf))
  return wrap(outp[0]), wrap(outp2[0])
end

---------------------------------------------------------------- the metatable

local mt = {}

mt.__index = function(t, k)
  local m = methods[k]
  if m then return m end
  local g = getters[k]
  if g then return g(t) end
  if type(k) == "number" or type(k) == "table" then return index_view(t, k) end
  raise(string.format("Tensor has no method or field '%s'", tostring(k)))
end

mt.__newindex = function(t, k, v)
  if type(k) == "number" or type(k) == "table" then return assign(t, k, v) end
  local set = setters[k]
  if set then return set(t, v) end
  raise(string.format("cannot set field '%s' of a Tensor", tostring(k)))
end

mt.__add = function(a, b) return binary(BIN.add, a, b, "add") end
mt.__sub = function(a, b) return binary(BIN.sub, a, b, "sub") end
mt.__mul = function(a, b) return binary(BIN.mul, a, b, "mul") end
mt.__div = function(a, b) return binary(BIN.div, a, b, "div") end
mt.__pow = function(a, b) return binary(BIN.pow, a, b, "pow") end
mt.__mod = function(a, b) return binary(BIN.remainder, a, b, "remainder") end
mt.__unm = function(a) return new(C.dp_unary(outp, UN.neg, a.p)) end
mt.__len = function(t)
  if C.dp_tensor_ndim(t.p) == 0 then raise("len() of a 0-d tensor") end
  return tonumber(C.dp_tensor_size(t.p, 0))
end
mt.__tostring = function(t) return require("dplua.print").tensor_str(t) end

ffi.metatype(Tensor_ct, mt)

-- Submodules load on first use, so `require("dplua")` stays fast.
local submodules = { nn = "dplua.nn", optim = "dplua.optim", autograd = "dplua.autograd",
                     distributed = "dplua.distributed", utils = "dplua.utils" }
-- functions that live in modules of their own
local lazy_functions = {
  save = "dplua.serialization", load = "dplua.serialization",
  get_rng_state = "dplua.serialization", set_rng_state = "dplua.serialization",
  hparams = "dplua.report", report = "dplua.report",
  autocast = "dplua.autocast", is_autocast_enabled = "dplua.autocast",
  get_autocast_dtype = "dplua.autocast",
}
setmetatable(torch, { __index = function(t, k)
  local name = submodules[k]
  if name then
    local m = require(name)
    rawset(t, k, m)
    return m
  end
  name = lazy_functions[k]
  if name then
    local v = require(name)[k]
    rawset(t, k, v)
    return v
  end
end })

-- Every method is also a torch.NAME function taking the tensor first.
-- Called as t:NAME(...) the receiver is a tensor by construction; called
-- as torch.NAME(x, ...) or torch.Tensor.NAME(x, ...) it is whatever the
-- caller passed, and a non-tensor must be an error, not a NULL in C.
local checked = {}
for name, fn in pairs(methods) do
  checked[name] = function(t, ...)
    if not is_tensor(t) then
      raise(string.format("%s: expected a tensor as the first argument, got %s", name, typename(t)))
    end
    return fn(t, ...)
  end
  if torch[name] == nil then torch[name] = checked[name] end
end
torch.Tensor = checked

---------------------------------------------------------------- misc

torch.__version__ = ffi.string(C.dp_version())
function torch.build_options() return ffi.string(C.dp_build_options()) end
torch.C = C
-- Wraps an owned `dp_tensor *` (from a C call made outside this file) as a
-- Tensor whose finalizer releases it.
function torch._wrap(p)
  if p == nil then raise("internal: wrapping a NULL tensor") end
  return wrap(p)
end

-- torch.cuda: devices, synchronisation and memory statistics. "cuda"
-- without an index means the current device (set_device).
local current_device = 0
-- The index of a CUDA device d (nil: the current one), which must exist
-- unless any_index: the allocation counters answer 0 for any device that
-- has none, as PyTorch's do.
local function device_index(d, fn, any_index)
  if d == nil then return current_device end
  local i = parse_device(d, fn)
  if i == DP_CPU then raise(fn .. ": expected a CUDA device, got cpu") end
  local n = C.dp_cuda_device_count()
  if i >= n and not any_index then
    raise(string.format("%s: device cuda:%d is not available (%d CUDA devices)", fn, i, n))
  end
  return i
end
torch.cuda = {
  is_available = function() return C.dp_cuda_device_count() > 0 end,
  device_count = function() return C.dp_cuda_device_count() end,
  current_device = function() return current_device end,
  set_device = function(d)
    current_device = device_index(d, "cuda.set_device")
  end,
  synchronize = function(d) check(C.dp_cuda_synchronize(device_index(d, "cuda.synchronize"))) end,
  memory_allocated = function(d) return tonumber(C.dp_memory_allocated(device_index(d, "cuda.memory_allocated", true))) end,
  max_memory_allocated = function(d) return tonumber(C.dp_max_memory_allocated(device_index(d, "cuda.max_memory_allocated", true))) end,
  reset_peak_memory_stats = function(d) C.dp_reset_peak_memory_stats(device_index(d, "cuda.reset_peak_memory_stats", true)) end,
}
torch._current_cuda_device = function() return current_device end
-- how many launches the waiting of small Linears saved: forwards run in
-- one launch with the ReLU, GELU or cross-entropy after them, and
-- backwards chained with the layer before's (src/core/gpu.c, "deferred
-- launches"): for tests and benchmarks
torch.cuda._linear_fusions = function() return tonumber(C.dp_cuda_linear_fusions()) end
-- for tests: with false, every op launches on its own
torch.cuda._set_deferral = function(on) C.dp_cuda_set_deferral(on and 1 or 0) end

-- What PyTorch scripts also call on torch.cuda: seeds (one stream serves
-- every device, see docs/API.md), memory and device queries.
local i64_box, i64_box2 = ffi.new("int64_t[1]"), ffi.new("int64_t[1]")
torch.cuda.manual_seed = function(seed) torch.manual_seed(seed) end
torch.cuda.manual_seed_all = torch.cuda.manual_seed
torch.cuda.empty_cache = function() check(C.dp_cuda_empty_cache(current_device)) end
local function reserved(d, fn)
  check(C.dp_cuda_memory_reserved(device_index(d, fn), i64_box, i64_box2))
  return tonumber(i64_box[0]), tonumber(i64_box2[0])
end
torch.cuda.memory_reserved = function(d) return (reserved(d, "cuda.memory_reserved")) end
torch.cuda.max_memory_reserved = function(d) return select(2, reserved(d, "cuda.max_memory_reserved")) end
-- free and total bytes of the device, as cudaMemGetInfo says
torch.cuda.mem_get_info = function(d)
  check(C.dp_cuda_mem_get_info(device_index(d, "cuda.mem_get_info"), i64_box, i64_box2))
  return tonumber(i64_box[0]), tonumber(i64_box2[0])
end
local name_buf, int_boxes = ffi.new("char[256]"), ffi.new("int[3]")
local function device_properties(d, fn)
  check(C.dp_cuda_device_properties(device_index(d, fn), name_buf, 256, i64_box, int_boxes, int_boxes + 1,
                                    int_boxes + 2))
  return { name = ffi.string(name_buf), total_memory = tonumber(i64_box[0]), major = int_boxes[0],
           minor = int_boxes[1], multi_processor_count = int_boxes[2] }
end
torch.cuda.get_device_properties = function(d) return device_properties(d, "cuda.get_device_properties") end
torch.cuda.get_device_name = function(d) return device_properties(d, "cuda.get_device_name").name end
torch.cuda.get_device_capability = function(d)
  local p = device_properties(d, "cuda.get_device_capability")
  return p.major, p.minor
end
torch.cuda.is_bf16_supported = function()
  return torch.cuda.is_available() and torch.cuda.get_device_properties().major >= 8
end

-- Streams and events: tables around a cudaStream_t / cudaEvent_t (NULL is
-- a device's default stream). Kernels for a device go to its current
-- stream; torch.cuda.stream(s, fn) makes s current while fn runs.
local Stream, Event = {}, {}
Stream.__index, Event.__index = Stream, Event
local stream_ptr_ct, done_box, ms_box = ffi.typeof("void*[1]"), ffi.new("int[1]"), ffi.new("double[1]")
Stream.__eq = function(a, b) return a.p == b.p and a.device == b.device end
Stream.__tostring = function(s)
  return string.format("<torch.cuda.Stream device=cuda:%d cuda_stream=%s>", s.device,
                       s.p == nil and "0x0 (default)" or tostring(s.p):match("0x%x+"))
end
local function stream_of(p, device) return setmetatable({ p = p, device = device }, Stream) end

function torch.cuda.Stream(device)
  if type(device) == "table" and getmetatable(device) == nil then device = device.device end
  local d = device_index(device, "cuda.Stream")
  local box = stream_ptr_ct()
  check(C.dp_cuda_stream_new(box, d))
  return stream_of(ffi.gc(box[0], C.dp_cuda_stream_free), d)
end
function torch.cuda.current_stream(device)
  local d = device_index(device, "cuda.current_stream")
  C.dp_cuda_launch_deferred()   -- (see data_ptr)
  return stream_of(C.dp_cuda_current_stream(d), d)
end
function torch.cuda.default_stream(device) return stream_of(nil, device_index(device, "cuda.default_stream")) end
local function as_stream(s, fn)
  if getmetatable(s) ~= Stream then raise(fn .. ": expected a torch.cuda.Stream, got " .. typename(s)) end
  return s
end
-- The stream stays referenced while current, so its finalizer cannot run.
local current_streams = {}
function torch.cuda.set_stream(s)
  as_stream(s, "cuda.set_stream")
  check(C.dp_cuda_set_stream(s.device, s.p))
  current_streams[s.device] = s
end
function torch.cuda.stream(s, fn, ...)
  as_stream(s, "cuda.stream")
  if type(fn) ~= "function" then raise("cuda.stream: expected (stream, function), got a " .. typename(fn)) end
  local prev = torch.cuda.current_stream(s.device)
  torch.cuda.set_stream(s)
  return finally(torch.cuda.set_stream, prev, pcall(fn, ...))
end
function Stream:synchronize() check(C.dp_cuda_stream_synchronize(self.p)) end
function Stream:query() check(C.dp_cuda_stream_query(self.p, done_box)); return done_box[0] ~= 0 end
function Stream:wait_event(e) check(C.dp_cuda_stream_wait_event(self.p, e.p)) end
function Stream:record_event(e)
  e = e or torch.cuda.Event()
  e:record(self)
  return e
end
function Stream:wait_stream(other) self:wait_event(as_stream(other, "Stream:wait_stream"):record_event()) end

function torch.cuda.Event(opts)
  opts = opts or {}
  local box = stream_ptr_ct()
  local d = device_index(opts.device, "cuda.Event")
  check(C.dp_cuda_event_new(box, d, opts.enable_timing and 1 or 0))
  return setmetatable({ p = ffi.gc(box[0], C.dp_cuda_event_free), device = d,
                        enable_timing = opts.enable_timing and true or false }, Event)
end
function Event:record(s)
  s = s and as_stream(s, "Event:record") or torch.cuda.current_stream(self.device)
  check(C.dp_cuda_event_record(self.p, s.p))
end
function Event:wait(s)
  s = s and as_stream(s, "Event:wait") or torch.cuda.current_stream(self.device)
  s:wait_event(self)
end
function Event:query() check(C.dp_cuda_event_query(self.p, done_box)); return done_box[0] ~= 0 end
function Event:synchronize() check(C.dp_cuda_event_synchronize(self.p)) end
-- milliseconds from this event to `later`, both recorded with enable_timing
function Event:elapsed_time(later)
  if getmetatable(later) ~= Event then raise("Event:elapsed_time: expected a torch.cuda.Event, got " .. typename(later)) end
  if not (self.enable_timing and later.enable_timing) then
    raise("Event:elapsed_time: both events need torch.cuda.Event{enable_timing = true}")
  end
  check(C.dp_cuda_event_elapsed(ms_box, self.p, later.p))
  return ms_box[0]
end

-- CUDA graphs: torch.cuda.graph(fn) runs fn once under stream capture and
-- returns a graph whose :replay() runs the same kernels again on the same
-- memory. fn (and so the tensors it reaches) stays referenced by the
-- graph. See docs/API.md for what cannot be captured.
local CUDAGraph = {}
CUDAGraph.__index = CUDAGraph
local graph_box = ffi.new("dp_cuda_graph*[1]")
function torch.cuda.graph(fn)
  if type(fn) ~= "function" then raise("cuda.graph: expected a function to capture, got a " .. typename(fn)) end
  check(C.dp_cuda_graph_begin(graph_box, current_device))
  local g = ffi.gc(graph_box[0], C.dp_cuda_graph_free)
  local ok, err = pcall(fn)
  local st = C.dp_cuda_graph_end(g, ok and 1 or 0)
  if not ok then error(err, 0) end
  check(st)
  return setmetatable({ g = g, fn = fn, device = current_device }, CUDAGraph)
end
function CUDAGraph:replay() check(C.dp_cuda_graph_replay(self.g)) end
function torch.cuda.is_current_stream_capturing() return C.dp_cuda_capturing() ~= 0 end

-- torch.backends.cuda.matmul.allow_tf32, as in PyTorch (off by default)
local matmul_flags = { allow_tf32 = false }
torch.backends = { cuda = { matmul = setmetatable({}, {
  __index = matmul_flags,
  __newindex = function(_, k, v)
    if k ~= "allow_tf32" then raise("backends.cuda.matmul: unknown setting '" .. tostring(k) .. "'") end
    if type(v) ~= "boolean" then
      raise("backends.cuda.matmul.allow_tf32: expected a boolean, got " .. type(v))
    end
    matmul_flags.allow_tf32 = v
    C.dp_cuda_set_allow_tf32(v and 1 or 0)
  end,
}) } }

function torch.memory_allocated(device)
  return tonumber(C.dp_memory_allocated(parse_device(device or "cpu", "memory_allocated")))
end

return torch
