-- dplua.base: what every part of the torch namespace shares. The C
-- library (its declarations, dplua.cdef, and where its symbols are), the
-- torch table and the Tensor's method, getter and setter tables that the
-- parts fill, errors, tensor handles, dtypes and devices, and the checks of
-- arguments. dplua/init.lua assembles the parts; the Lua code of the
-- library reaches what it needs through `torch`, not through this module.
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
local setters = {}          -- Tensor fields that can be set: t.requires_grad, t.grad

local DP_CPU, DP_ALL_DIMS = -1, -100

---------------------------------------------------------------- errors

-- Errors point at the first stack frame outside the library, so that the
-- user sees their own file and line.
local libdir = debug.getinfo(1, "S").source:match("^@(.*/)") or "\0"
-- the level of that frame, counted from the caller of user_level's caller
local function user_level()
  local level = 3
  while true do
    local info = debug.getinfo(level, "S")
    if not info then return 1 end
    local src = info.source
    local inside = info.what == "C" or src:sub(2, #libdir + 1) == libdir
    if not inside then return level - 1 end
    level = level + 1
  end
end
local function raise(msg)
  error(msg, user_level())
end
torch._raise = raise

-- Anomaly detection (autograd.lua's set_detect_anomaly) keeps where each
-- node of the graph was made, the user's traceback by the node's creation
-- order (dp_grad_fn_seq), to say it beside the node whose backward made
-- NaN. Bounded: past max_traces the oldest are dropped.
local anomaly_traces, traced = nil, 0
local max_traces = 65536
local function set_anomaly_traces(on)
  anomaly_traces, traced = on and {} or nil, 0
end
local function remember_forward(t)
  local seq = tonumber(C.dp_grad_fn_seq(t.p))
  if seq == 0 or anomaly_traces[seq] then return end
  if traced >= max_traces then anomaly_traces, traced = {}, 0 end
  anomaly_traces[seq], traced = debug.traceback("", user_level()):gsub("^\n", ""), traced + 1
end
local function forward_trace(msg)
  local tb = anomaly_traces and msg:find("returned nan values", 1, true) and anomaly_traces[tonumber(C.dp_anomaly_node())]
  return tb and msg .. "\nTraceback of forward call that caused the error:\n" .. tb or msg
end

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
  raise(forward_trace(msg))
end

local function check(st)
  if st ~= 0 then fail() end
end
torch._check = check
torch._set_anomaly_traces = set_anomaly_traces

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
  if anomaly_traces then remember_forward(t) end
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

-- finfo([dtype]) and iinfo(dtype): the limits of a floating and of an
-- integer dtype, with PyTorch's fields (finfo() is the default dtype's).
-- int64's limits are int64_t cdata: a double cannot hold 2^63 - 1.
local float_limits = {
  float32 = { bits = 32, eps = 2 ^ -23, max = (2 - 2 ^ -23) * 2 ^ 127, tiny = 2 ^ -126, resolution = 1e-6 },
  float64 = { bits = 64, eps = 2 ^ -52, max = (2 - 2 ^ -52) * 2 ^ 1023, tiny = 2 ^ -1022, resolution = 1e-15 },
  bfloat16 = { bits = 16, eps = 2 ^ -7, max = (2 - 2 ^ -7) * 2 ^ 127, tiny = 2 ^ -126, resolution = 0.01 },
}
local int_limits = {
  int64 = { bits = 64, min = -9223372036854775807LL - 1, max = 9223372036854775807LL },
  int32 = { bits = 32, min = -2 ^ 31, max = 2 ^ 31 - 1 },
  uint8 = { bits = 8, min = 0, max = 255 },
}
local finfo_mt = { __tostring = function(f)
  return string.format("finfo(resolution=%g, min=%g, max=%g, eps=%g, smallest_normal=%g, tiny=%g, dtype=%s)",
                       f.resolution, f.min, f.max, f.eps, f.smallest_normal, f.tiny, f.dtype)
end }
local iinfo_mt = { __tostring = function(i)
  return string.format("iinfo(min=%s, max=%s, dtype=%s)", tostring(i.min):gsub("LL$", ""),
                       tostring(i.max):gsub("LL$", ""), i.dtype)
end }
function torch.finfo(d)
  if d == nil then d = torch.get_default_dtype() end
  local l = getmetatable(d) == dtype_mt and float_limits[d.name]
  if not l then raise("finfo: expected a floating dtype (torch.float32, torch.float64, torch.bfloat16), got " .. tostring(d)) end
  return setmetatable({ bits = l.bits, eps = l.eps, max = l.max, min = -l.max, tiny = l.tiny, smallest_normal = l.tiny,
                        resolution = l.resolution, dtype = d.name }, finfo_mt)
end
function torch.iinfo(d)
  local l = getmetatable(d) == dtype_mt and int_limits[d.name]
  if not l then raise("iinfo: expected an integer dtype (torch.int64, torch.int32, torch.uint8), got " .. tostring(d)) end
  return setmetatable({ bits = l.bits, min = l.min, max = l.max, dtype = d.name }, iinfo_mt)
end

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

-- torch.set_default_device(device): where the factory functions (zeros,
-- tensor, arange, randn, ...) put a tensor whose options name no device,
-- as PyTorch 2's; nil or "cpu" for the CPU. get_default_device() tells.
local default_device = DP_CPU
function torch.set_default_device(dev)
  local id = dev == nil and DP_CPU or parse_device(dev, "set_default_device")
  if id ~= DP_CPU and id >= torch.cuda.device_count() then
    raise(string.format("set_default_device: no CUDA device %d (this machine has %d)", id, torch.cuda.device_count()))
  end
  default_device = id
end
function torch.get_default_device() return device_obj(default_device) end

local function creation_opts(opts, fn, default)
  if opts ~= nil and type(opts) ~= "table" then
    raise(string.format("%s: expected options as a table ({dtype=, device=, requires_grad=}), got %s", fn,
                        typename(opts)))
  end
  opts = opts or {}
  local dt = to_dtype(opts.dtype, fn) or default or default_dtype
  local dev = parse_device(opts.device, fn) or default_device
  return dt.id, dev, opts.requires_grad
end

local function check_number(v, fn, what)
  if type(v) ~= "number" then
    raise(string.format("%s: expected %s to be a number, got %s %s", fn, what, typename(v), tostring(v)))
  end
  return v
end

-- An options table, or nil as an empty one; anything else is an error.
local function options(opts, fn)
  if opts ~= nil and (type(opts) ~= "table" or is_tensor(opts)) then
    raise(fn .. ": expected the options as a table, got " .. typename(opts))
  end
  return opts or {}
end
torch._options = options

-- The shape of a tensor as a Lua list (torch.Size).
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

-- The tail of a context manager: finally(undo, arg, pcall(fn, ...)) calls
-- undo(arg) whatever fn did, then raises fn's error again or returns its
-- results (through varargs: no table per call).
local function finally(undo, arg, ok, ...)
  undo(arg)
  if not ok then error((...), 0) end
  return ...
end
torch._finally = finally

-- This machine's name and this process's id, for the names of files a run
-- writes (event files, traces). Read from /proc: lua/dplua declares no C.
local function read_first_line(path)
  local f = io.open(path, "r")
  if not f then return nil end
  local line = f:read("*l")
  f:close()
  return line
end
torch._host_name = (read_first_line("/proc/sys/kernel/hostname") or os.getenv("HOSTNAME") or "localhost")
  :gsub("[^%w%.%-_]", "_")
torch._pid = tonumber((read_first_line("/proc/self/stat") or "0"):match("^%d+"))

-- lazy(t, loaders): t's fields named in loaders made on first read, by
-- loaders[name]() (a submodule loaded on first use), and kept.
function torch._lazy(t, loaders)
  return setmetatable(t, { __index = function(_, k)
    local load = loaders[k]
    if load == nil then return nil end
    local v = load()
    rawset(t, k, v)
    return v
  end })
end

return {
  ffi = ffi, C = C, torch = torch, methods = methods, getters = getters, setters = setters,
  DP_CPU = DP_CPU, DP_ALL_DIMS = DP_ALL_DIMS,
  raise = raise, fail = fail, check = check, finally = finally,
  Tensor_ct = Tensor_ct, outp = outp, outp2 = outp2, wrap = wrap, new = new, with_grad = with_grad,
  is_tensor = is_tensor, typename = typename,
  dtype_mt = dtype_mt, dtypes_by_id = dtypes_by_id, dtypes_by_name = dtypes_by_name, to_dtype = to_dtype,
  device_mt = device_mt, device_obj = device_obj, parse_device = parse_device,
  shape_buf = shape_buf, dims_buf = dims_buf, check_int = check_int, check_dim = check_dim,
  check_number = check_number, options = options, parse_shape = parse_shape, is_options = is_options,
  split_options = split_options, creation_opts = creation_opts, shape_of = shape_of, wrap_dim = wrap_dim,
}
