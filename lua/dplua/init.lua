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
--
-- This file assembles the torch namespace from its parts:
--
--   dplua.base        the C library, errors, handles, dtypes, devices,
--                     argument checks; torch.device, torch.float32, ...
--   dplua.creation    torch.zeros, torch.tensor, torch.arange, ...
--   dplua.tensor      inspection, views, indexing, conversion, autograd
--   dplua.ops         elementwise math, reductions, products, cat/stack
--   dplua.composite   the operations written as compositions of those
--   dplua.primitives  the fused operations under nn and optim (torch._*)
--   dplua.cuda        torch.cuda and torch.backends
--
-- and makes the Tensor type: its metatable (methods, properties, indexing,
-- operators) and, for every method, a torch.NAME function.

-- The compiler's budget of inner-loop iterations a trace may unroll: 15 by
-- default, which a call of F.conv2d or an nn.Linear spends on its argument
-- checks (a few short loops each), so that its trace was abandoned and the
-- call ran in the interpreter, 10-18 us on the development machine where a
-- compiled call takes 3. A whole training step of small tensors, whose
-- host time is what an eager GPU step waits on, took 141 us and takes 104.
jit.opt.start("loopunroll=60")
local B = require("dplua.base")
require("dplua.creation")
local tensor = require("dplua.tensor")
local ops = require("dplua.ops")
require("dplua.primitives")
require("dplua.cuda")

local ffi, C, torch = B.ffi, B.C, B.torch
local methods, getters, setters = B.methods, B.getters, B.setters
local raise, new, wrap, outp, check = B.raise, B.new, B.wrap, B.outp, B.check
local is_tensor, typename, parse_device, Tensor_ct = B.is_tensor, B.typename, B.parse_device, B.Tensor_ct
local index_view, assign = tensor.index_view, tensor.assign
local binary, UN, BIN = ops.binary, ops.UN, ops.BIN

---------------------------------------------------------------- the Tensor type

local mt = {}

local function index(t, k)
  local m = methods[k]
  if m then return m end
  local g = getters[k]
  if g then return g(t) end
  if type(k) == "number" or type(k) == "table" or is_tensor(k) then return index_view(t, k) end
  if torch._load_ops() then return index(t, k) end
  raise(string.format("Tensor has no method or field '%s'", tostring(k)))
end
mt.__index = index

mt.__newindex = function(t, k, v)
  if type(k) == "number" or type(k) == "table" or is_tensor(k) then return assign(t, k, v) end
  local set = setters[k]
  if set then return set(t, v) end
  raise(string.format("cannot set field '%s' of a Tensor", tostring(k)))
end

-- The arithmetic operators call through a table that torch.profiler may
-- wrap (a metatype's metatable cannot change once set).
local operators = {
  add = function(a, b) return binary(BIN.add, a, b, "add") end,
  sub = function(a, b) return binary(BIN.sub, a, b, "sub") end,
  mul = function(a, b) return binary(BIN.mul, a, b, "mul") end,
  div = function(a, b) return binary(BIN.div, a, b, "div") end,
  pow = function(a, b) return binary(BIN.pow, a, b, "pow") end,
  remainder = function(a, b) return binary(BIN.remainder, a, b, "remainder") end,
  neg = function(a) return new(C.dp_unary(outp, UN.neg, a.p)) end,
}
torch._operators = operators
torch._methods = methods
mt.__add = function(a, b) return operators.add(a, b) end
mt.__sub = function(a, b) return operators.sub(a, b) end
mt.__mul = function(a, b) return operators.mul(a, b) end
mt.__div = function(a, b) return operators.div(a, b) end
mt.__pow = function(a, b) return operators.pow(a, b) end
mt.__mod = function(a, b) return operators.remainder(a, b) end
mt.__unm = function(a) return operators.neg(a) end
mt.__len = function(t)
  if C.dp_tensor_ndim(t.p) == 0 then raise("len() of a 0-d tensor") end
  return tonumber(C.dp_tensor_size(t.p, 0))
end
mt.__tostring = function(t) return require("dplua.print").tensor_str(t) end

ffi.metatype(Tensor_ct, mt)

---------------------------------------------------------------- the torch namespace

-- Submodules load on first use, so `require("dplua")` stays fast.
local submodules = { nn = "dplua.nn", optim = "dplua.optim", autograd = "dplua.autograd",
                     distributed = "dplua.distributed", utils = "dplua.utils",
                     distributions = "dplua.distributions", linalg = "dplua.linalg",
                     amp = "dplua.amp", func = "dplua.func", testing = "dplua.testing",
                     profiler = "dplua.profiler" }
-- functions that live in modules of their own
local lazy_functions = {
  save = "dplua.serialization", load = "dplua.serialization",
  get_rng_state = "dplua.serialization", set_rng_state = "dplua.serialization",
  hparams = "dplua.report", report = "dplua.report",
  autocast = "dplua.autocast", is_autocast_enabled = "dplua.autocast",
  get_autocast_dtype = "dplua.autocast",
  einsum = "dplua.einsum", set_printoptions = "dplua.print",
  is_anomaly_enabled = "dplua.autograd", is_anomaly_check_nan_enabled = "dplua.autograd",
  vmap = "dplua.func",
}
-- torch.NAME forms of nn.functional's functions whose arguments PyTorch's
-- torch.NAME shares (torch.conv2d, torch.dropout, torch.layer_norm, ...)
for _, k in ipairs({ "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
                     "dropout", "alpha_dropout", "feature_alpha_dropout", "layer_norm", "group_norm", "pixel_shuffle",
                     "pixel_unshuffle", "channel_shuffle", "native_channel_shuffle", "pdist", "prelu", "selu", "celu",
                     "rrelu", "threshold", "hardshrink", "bilinear", "cosine_similarity", "pairwise_distance",
                     "max_pool1d", "max_pool2d", "max_pool3d", "avg_pool1d", "adaptive_avg_pool1d", "selu_", "celu_",
                     "rrelu_", "threshold_", "conv_tbc" }) do
  lazy_functions[k] = { "dplua.nn", "functional" }
end
-- torch.NAME forms of linalg's functions (linalg.lua's M.torch)
for _, k in ipairs({ "svd", "pinverse", "cholesky_solve", "matrix_exp", "matrix_power", "det", "logdet", "slogdet",
                     "inverse", "cholesky", "qr", "triangular_solve", "cholesky_inverse", "lu", "lu_solve",
                     "lu_unpack", "orgqr", "geqrf", "ormqr", "svd_lowrank", "pca_lowrank" }) do
  lazy_functions[k] = { "dplua.linalg", "torch" }
end
setmetatable(torch, { __index = function(t, k)
  local name = submodules[k]
  if name then
    local m = require(name)
    rawset(t, k, m)
    return m
  end
  name = lazy_functions[k]
  if name then
    local v = type(name) == "table" and require(name[1])[name[2]][k] or require(name)[k]
    rawset(t, k, v)
    return v
  end
  if torch._load_ops() then return rawget(t, k) end
end })

-- Every method is also a torch.NAME function taking the tensor first.
-- Called as t:NAME(...) the receiver is a tensor by construction; called
-- as torch.NAME(x, ...) or torch.Tensor.NAME(x, ...) it is whatever the
-- caller passed, and a non-tensor must be an error, not a NULL in C.
local checked = {}
local function expose_methods()
  for name, fn in pairs(methods) do
    if checked[name] == nil then
      checked[name] = function(t, ...)
        if not is_tensor(t) then
          raise(string.format("%s: expected a tensor as the first argument, got %s", name, typename(t)))
        end
        return fn(t, ...)
      end
      if rawget(torch, name) == nil and not lazy_functions[name] then rawset(torch, name, checked[name]) end
    end
  end
end
expose_methods()
torch.Tensor = checked

-- The operations written as compositions of others (composite.lua and
-- special.lua, some 200 names) load on the first use of one of them, or
-- of any name not found: require("dplua") spends no time parsing them.
-- _load_ops() loads them (once; true the first time), for code that lists
-- the names (the REPL's completion, the fuzzer).
local ops_loaded = false
function torch._load_ops()
  if ops_loaded then return false end
  ops_loaded = true
  require("dplua.composite")
  require("dplua.special")
  expose_methods()
  return true
end
setmetatable(checked, { __index = function(t, k)
  if torch._load_ops() then return rawget(t, k) end
end })

---------------------------------------------------------------- misc

-- torch.cpu: PyTorch's namespace (amp.autocast, is_available, device_count,
-- synchronize, current_device), still callable as torch.cpu(t), t:cpu().
local to_cpu = rawget(torch, "cpu")
torch.cpu = setmetatable({
  amp = { autocast = function(...) return torch.autocast("cpu", ...) end },
  is_available = function() return true end,
  device_count = function() return 1 end,
  synchronize = function() end,
  current_device = function() return "cpu" end,
}, { __call = function(_, ...) return to_cpu(...) end })

-- compile(model_or_fn [, opts]): returns its argument. dplua has no graph
-- compiler: its steps run eagerly, and torch.cuda.graph captures a step
-- to replay it with one launch. Accepting the call keeps programs that
-- compile their model running unchanged.
function torch.compile(model)
  if model == nil then raise("compile: expected a module or a function to compile, got nil") end
  return model
end
-- torch.jit likewise: script and trace return what they are given (its
-- code runs as written), the decorators their function; a TorchScript
-- archive is not something dplua reads or writes.
local function as_is(what)
  return function(x)
    if x == nil then raise("jit." .. what .. ": expected a module or a function, got nil") end
    return x
  end
end
torch.jit = {
  script = as_is("script"), trace = as_is("trace"), trace_module = as_is("trace_module"), ignore = as_is("ignore"),
  unused = as_is("unused"), export = as_is("export"), optimize_for_inference = as_is("optimize_for_inference"),
  freeze = as_is("freeze"),
  is_scripting = function() return false end, is_tracing = function() return false end,
  save = function() raise("jit.save: TorchScript archives are not supported; save the state_dict with torch.save") end,
  load = function() raise("jit.load: TorchScript archives are not supported; load a state_dict with torch.load") end,
}

-- LuaJIT's ipairs, like Lua 5.1's, ignores a __ipairs metamethod, so that
-- `for _, block in ipairs(self.blocks)` over an nn.ModuleList would run no
-- iteration at all. ipairs honours it here (nn's containers iterate their
-- modules; other modules raise); a plain table gets the built-in iterator.
-- pairs honours __pairs the same way (an optimizer's state, indexed by
-- parameter, is computed from its flat buffers).
local function honouring(metamethod, builtin)
  return function(t)
    local mt = getmetatable(t)
    local custom = type(mt) == "table" and rawget(mt, metamethod)
    if custom then return custom(t) end
    return builtin(t)
  end
end
_G.ipairs = honouring("__ipairs", ipairs)
-- A plain table's pairs steps with a function of its own rather than the
-- built-in next: Debian 12's LuaJIT (2.1.0-beta3, git 2022-03-20) has the
-- bug of LuaJIT issue 827, where a compiled `for k, v in pairs(t)` whose
-- trace is blacklisted can stop early (in that issue's nested loops, 57% of
-- the passes miss keys here). With another iterator the loop is never
-- specialised to the ITERN bytecode the bug lives in; each step is one more
-- call.
local raw_next = next
local function step(t, k) return raw_next(t, k) end
_G.pairs = honouring("__pairs", function(t)
  if type(t) ~= "table" then return pairs(t) end   -- (the built-in's error for anything else)
  return step, t, nil
end)

torch.__version__ = ffi.string(C.dp_version())
function torch.build_options() return ffi.string(C.dp_build_options()) end
-- The CPU kernels' threads, OpenBLAS's (the products and convolutions run
-- on them): by default OPENBLAS_NUM_THREADS, else OMP_NUM_THREADS, else
-- one per online CPU.
function torch.set_num_threads(n)
  if type(n) ~= "number" or n < 1 or n % 1 ~= 0 or n > 2 ^ 31 - 1 then
    raise("set_num_threads: expected a positive integer number of threads, got " .. tostring(n))
  end
  check(C.dp_set_num_threads(n))
end
function torch.get_num_threads() return tonumber(C.dp_get_num_threads()) end

-- use_deterministic_algorithms(mode [, {warn_only =}]): PyTorch's switch.
-- dplua's CPU ops are deterministic already; on a GPU, while it is on,
-- scatter_add and the fold of overlapping windows (F.fold, an unfold's
-- backward) add on host copies in a fixed order instead of with atomic
-- adds, and scaled_dot_product_attention takes its math path (the flash
-- backward adds dq atomically). Every op then has a deterministic path,
-- so warn_only changes nothing but what is_..._warn_only_enabled says.
local warn_only = false
function torch.use_deterministic_algorithms(mode, opts)
  if type(mode) ~= "boolean" then
    raise("use_deterministic_algorithms: expected mode to be a boolean, got " .. typename(mode))
  end
  if opts ~= nil and type(opts) ~= "table" then
    raise("use_deterministic_algorithms: expected the options as a table {warn_only =}, got " .. typename(opts))
  end
  C.dp_set_deterministic(mode and 1 or 0)
  warn_only = mode and opts ~= nil and opts.warn_only == true
end
function torch.are_deterministic_algorithms_enabled() return C.dp_deterministic() ~= 0 end
function torch.is_deterministic_algorithms_warn_only_enabled() return warn_only end
torch.C = C
-- Wraps an owned `dp_tensor *` (from a C call made outside this file) as a
-- Tensor whose finalizer releases it.
function torch._wrap(p)
  if p == nil then raise("internal: wrapping a NULL tensor") end
  return wrap(p)
end
-- Bytes held by tensors on a device ("cpu" by default).
function torch.memory_allocated(device)
  return tonumber(C.dp_memory_allocated(parse_device(device or "cpu", "memory_allocated")))
end

return torch
