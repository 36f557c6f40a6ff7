-- dplua.autocast: torch.autocast, as in PyTorch, for bfloat16.
--
--   torch.autocast("cuda", {dtype = torch.bfloat16}, function()
--     loss = criterion(model(x), y)          -- GEMMs in bf16, the loss in fp32
--   end)
--   loss:backward()                          -- fp32 grads on the fp32 weights
--
-- The state (enabled and dtype per device type) lives here. The op wrappers
-- (matmul/mm/bmm in dplua/ops.lua; linear, conv2d, the losses, softmax,
-- log_softmax and layer_norm in dplua/nn/functional.lua) keep a local
-- boolean that this module sets through watch(); while it is false they
-- pay one test, and only when it is true do they call cast_inputs (the
-- lower-precision ops) or cast_fp32 (the ops that run in float32). Casts
-- are plain `t:to(dtype)` calls, recorded by autograd, so gradients reach
-- the float32 leaves as float32. One list of ops serves both device types:
-- PyTorch's CUDA lists (its CPU lists of 1.13 leave softmax, log_softmax
-- and layer_norm in bfloat16).
local torch = require("dplua")
local C = torch.C
local raise = torch._raise
local is_tensor = torch.is_tensor

local M = {}

local DP_CPU = -1
local F32, F64 = torch.float32.id, torch.float64.id

-- per device type: enabled, and the dtype of the lower-precision ops
local state = {
  cpu = { enabled = false, dtype = torch.bfloat16 },
  cuda = { enabled = false, dtype = torch.bfloat16 },
}
local cpu, cuda = state.cpu, state.cuda

-- Functions told (on) whenever the state changes; ops.lua's comes first.
local watchers = { torch._autocast_watch }

local function publish()
  local on = cpu.enabled or cuda.enabled
  for i = 1, #watchers do watchers[i](on, M) end
end

-- watch(fn): fn(on, M) now and after every change of the state.
function M.watch(fn)
  watchers[#watchers + 1] = fn
  fn(cpu.enabled or cuda.enabled, M)
end

-- The target dtype id for t, or nil when t stays as it is: not a tensor,
-- not floating, float64 (PyTorch leaves doubles alone), or on a device
-- type whose autocast is off.
local function target(t, lower)
  if not is_tensor(t) then return nil end
  local s = C.dp_tensor_device(t.p) == DP_CPU and cpu or cuda
  if not s.enabled then return nil end
  local dt = C.dp_tensor_dtype(t.p)
  if dt == F64 or C.dp_dtype_is_floating(dt) == 0 then return nil end
  local want = lower and s.dtype.id or F32
  if dt == want then return nil end
  return lower and s.dtype or torch.float32
end

local function lower(t)
  local d = target(t, true)
  if d == nil then return t end
  return t:to(d)
end

local function fp32(t)
  local d = target(t, false)
  if d == nil then return t end
  return t:to(d)
end

-- cast_inputs(a [, b [, c]]): the floating tensors among a, b, c cast to the
-- autocast dtype (linear, matmul, conv2d); other values pass through.
function M.cast_inputs(a, b, c) return lower(a), lower(b), lower(c) end

-- cast_fp32(a [, b [, c]]): the same, to float32 (losses, softmax, layer_norm).
function M.cast_fp32(a, b, c) return fp32(a), fp32(b), fp32(c) end

-- casts_fp32(t): whether cast_fp32 would cast t (a bfloat16 tensor where
-- autocast is on). cross_entropy then leaves the cast to its C op, which on
-- a GPU reads bfloat16 logits as they are; layer_norm reads such an input
-- as it is and gives a float32 output.
function M.casts_fp32(t) return target(t, false) ~= nil end

-- lowers_to(t): the dtype cast_inputs would cast t to, or nil.
function M.lowers_to(t) return target(t, true) end

local function typename(x) return is_tensor(x) and "Tensor" or type(x) end

local function show(v)
  if type(v) == "string" then return string.format("%q", v) end
  if v == nil then return "nil" end
  return typename(v) .. " " .. tostring(v)
end

local function device_state(device_type, fn)
  if device_type == "cpu" or device_type == "cuda" then return state[device_type] end
  raise(string.format('%s: expected device_type "cuda" or "cpu", got %s', fn, show(device_type)))
end

local accepted = { bfloat16 = torch.bfloat16, float32 = torch.float32, float = torch.float32 }

local function autocast_dtype(d)
  if d == nil then return torch.bfloat16 end
  local name = tostring(d):gsub("^torch%.", "")
  local dt = accepted[name]
  if dt and (getmetatable(d) == torch.dtype_mt or type(d) == "string") then return dt end
  raise(string.format("autocast: dtype must be torch.bfloat16 or torch.float32, got %s%s",
                      getmetatable(d) == torch.dtype_mt and tostring(d) or show(d),
                      (name == "float16" or name == "half") and " (float16 is not supported)" or ""))
end

-- autocast(device_type, [opts,] fn, ...): runs fn(...) with autocast set for
-- device_type ("cuda" or "cpu"); opts = {dtype = torch.bfloat16 (default) or
-- torch.float32, enabled = true; PyTorch's cache_enabled is accepted and
-- ignored}. Returns what fn returns; the previous state comes back
-- afterwards, also when fn raises (the error goes on).
-- puts back the state that autocast() saved
local function restore(saved)
  saved.state.enabled, saved.state.dtype = saved.enabled, saved.dtype
  publish()
end

function M.autocast(device_type, opts, fn, ...)
  local s = device_state(device_type, "autocast")
  if type(opts) == "function" then return M.autocast(device_type, nil, opts, fn, ...) end
  if opts == nil then opts = {} end
  if type(opts) ~= "table" or is_tensor(opts) then
    raise("autocast: expected an options table ({dtype=, enabled=}), got " .. typename(opts))
  end
  for k in pairs(opts) do
    if k ~= "dtype" and k ~= "enabled" and k ~= "cache_enabled" then
      raise("autocast: unknown option '" .. tostring(k) .. "' (accepted: dtype, enabled)")
    end
  end
  if type(fn) ~= "function" then
    raise("autocast: expected a function to run under autocast, got " .. typename(fn))
  end
  local dtype = autocast_dtype(opts.dtype)
  local enabled = opts.enabled
  if enabled == nil then enabled = true end
  local saved = { state = s, enabled = s.enabled, dtype = s.dtype }
  s.enabled = enabled and true or false
  if enabled then s.dtype = dtype end
  publish()
  return torch._finally(restore, saved, pcall(fn, ...))
end

-- is_autocast_enabled([device_type]): without an argument, CUDA's state, as
-- in PyTorch.
function M.is_autocast_enabled(device_type)
  return device_state(device_type or "cuda", "is_autocast_enabled").enabled
end

-- get_autocast_dtype(device_type): the dtype autocast uses there.
function M.get_autocast_dtype(device_type)
  return device_state(device_type, "get_autocast_dtype").dtype
end

return M
