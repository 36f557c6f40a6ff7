-- dplua.utils.checkpoint (torch.utils.checkpoint): activation checkpointing.
--
--   local y = torch.utils.checkpoint.checkpoint(block, x)          -- saves x, not block's activations
--   local out = torch.utils.checkpoint.checkpoint_sequential(model, 4, x)
--
-- checkpoint(fn, ...) runs fn(...) under no_grad, keeps its arguments and
-- records one node (CheckpointFunctionBackward) from the tensor arguments
-- to the result. Its backward runs fn again with grad enabled, on detached
-- copies of the arguments, with the random state fn started from (so that
-- dropout draws the same mask) and the autocast state it ran under, and
-- backpropagates the node's gradient through that recomputation: the
-- parameters fn uses get their gradients there, the arguments' go on along
-- the graph. The engine calls Lua for such nodes (src/core/autograd.c,
-- "Lua inside backward", and dplua/autograd.lua, which keeps the entries):
-- a graph without one runs no Lua in its backward.
local ffi = require("ffi")
local torch = require("dplua")
local raise = torch._raise
local is_tensor = torch.is_tensor
local C = torch.C
local A = require("dplua.autograd")

local M = {}

local function typename(x) return is_tensor(x) and "Tensor" or type(x) end
local function call(fn, ...) return fn(...) end   -- (fn may be a module: no_grad takes functions)

local rng_box = ffi.new("uint64_t[2]")
local function rng_state()
  C.dp_rng_get_state(rng_box, rng_box + 1)
  return rng_box[0], rng_box[1]   -- (copies: boxed 64-bit numbers)
end

local function autocast_state()
  local s = {}
  for _, dev in ipairs({ "cpu", "cuda" }) do
    s[dev] = { enabled = torch.is_autocast_enabled(dev), dtype = torch.get_autocast_dtype(dev) }
  end
  return s
end

-- What a recomputation needs to run as the first run did: the random
-- state the run began from (seed, offset) and the autocast state it ran
-- under. (torch.distributed.fsdp's units recompute too.)
function M._run_state()
  local seed, offset = rng_state()
  return { seed = seed, offset = offset, autocast = autocast_state() }
end

-- The arguments given[1..nargs] with each tensor replaced by a detached
-- copy, a leaf that requires grad where the argument did; the copies, and
-- each one's argument position.
function M._leaf_args(given, nargs)
  local args, copies, positions = {}, {}, {}
  for i = 1, nargs do
    local a = given[i]
    if is_tensor(a) then
      local d = a:detach()
      if a.requires_grad then d:requires_grad_(true) end
      args[i] = d
      copies[#copies + 1], positions[#copies + 1] = d, i
    else
      args[i] = a
    end
  end
  return args, copies, positions
end

-- fn(args[1..nargs]) again, grad enabled, under s's autocast state and
-- from s's random state (when s has one), which is put back after, on
-- detached copies of the tensor arguments (leaves that require grad where
-- the arguments did). Returns pcall's first two results, then the copies
-- in the order of the tensor arguments and each one's argument position.
function M._replay(s, fn, given, nargs)
  local args, copies, positions = M._leaf_args(given, nargs)
  local function on_cuda() return fn(unpack(args, 1, nargs)) end
  local function on_cpu()
    local a = s.autocast.cuda
    return torch.autocast("cuda", { enabled = a.enabled, dtype = a.dtype }, on_cuda)
  end
  local seed, offset
  if s.seed ~= nil then
    seed, offset = rng_state()
    C.dp_rng_set_state(s.seed, s.offset)
  end
  local a = s.autocast.cpu
  local ok, out = pcall(torch.enable_grad, torch.autocast, "cpu", { enabled = a.enabled, dtype = a.dtype }, on_cpu)
  if seed ~= nil then C.dp_rng_set_state(seed, offset) end
  return ok, out, copies, positions
end

-- The node's backward: grads_in[i] for its i-th tensor argument. e is the
-- node's entry: { fn =, args =, nargs =, seed =, offset =, autocast = }.
local function recompute(e, grad, _, grads_in)
  if C.dp_grad_capturing() ~= 0 then
    raise("checkpoint: torch.autograd.grad cannot go through a checkpointed call (its recomputation "
          .. "accumulates into .grad); use backward()")
  end
  local ok, out, leaves = M._replay(e, e.fn, e.args, e.nargs)
  if not ok then error(out, 0) end
  if not is_tensor(out) then raise("checkpoint: fn returned " .. typename(out) .. " when recomputed, not a tensor") end
  if out.requires_grad then
    C.dp_tensor_retain(grad)
    out:backward(torch._wrap(grad))
  end
  for i, d in ipairs(leaves) do
    local g = d.grad
    if g ~= nil then
      C.dp_tensor_retain(g.p)
      grads_in[i - 1] = g.p
    end
  end
end

-- A leaf that stands in for the parameters fn uses when no argument
-- requires grad, so that the node is recorded and they get gradients.
local anchor = torch.zeros({}, { requires_grad = true })

local options = { use_reentrant = true, preserve_rng_state = true, determinism_check = true, debug = true }

-- A trailing table of checkpoint's own options, told apart from fn's arguments.
local function split_options(fn_name, ...)
  local n = select("#", ...)
  local last = n > 0 and select(n, ...) or nil
  if type(last) ~= "table" or is_tensor(last) or getmetatable(last) ~= nil or last[1] ~= nil or next(last) == nil then
    return {}, n
  end
  for k in pairs(last) do if not options[k] then return {}, n end end
  if last.preserve_rng_state ~= nil and type(last.preserve_rng_state) ~= "boolean" then
    raise(fn_name .. ": expected preserve_rng_state to be a boolean, got " .. typename(last.preserve_rng_state))
  end
  if last.use_reentrant ~= nil and type(last.use_reentrant) ~= "boolean" then
    raise(fn_name .. ": expected use_reentrant to be a boolean, got " .. typename(last.use_reentrant))
  end
  return last, n - 1
end

local args_buf = ffi.new("dp_tensor*[?]", 64)
local outp = ffi.new("dp_tensor*[1]")

-- checkpoint(fn, ... [, {use_reentrant=, preserve_rng_state=true}]): fn's
-- result (one tensor), its activations recomputed in the backward instead
-- of kept. use_reentrant is accepted, either way the recomputation runs in
-- the backward as described at the top. Under no_grad it is fn(...).
function M.checkpoint(fn, ...)
  if type(fn) ~= "function" and not (type(fn) == "table" and getmetatable(fn) and getmetatable(fn).__call) then
    raise("checkpoint: expected a function or a module to run, got " .. typename(fn))
  end
  local opts, nargs = split_options("checkpoint", ...)
  local args = { ... }
  if not torch.is_grad_enabled() then return fn(unpack(args, 1, nargs)) end
  local e = { run = recompute, fn = fn, args = args, nargs = nargs, autocast = autocast_state() }
  if opts.preserve_rng_state ~= false then e.seed, e.offset = rng_state() end
  local out = torch.no_grad(call, fn, unpack(args, 1, nargs))
  if not is_tensor(out) then
    raise("checkpoint: fn must return one tensor, got " .. typename(out))
  end
  local n, any = 0, false
  for i = 1, nargs do
    local a = args[i]
    if is_tensor(a) then
      if n == 63 then raise("checkpoint: at most 63 tensor arguments") end
      args_buf[n], n = a.p, n + 1
      any = any or a.requires_grad
    end
  end
  if not any then args_buf[n], n = anchor.p, n + 1 end
  local id = A._new_entry(e)
  if C.dp_lua_node(outp, out.p, n, args_buf, id, "CheckpointFunctionBackward") ~= 0 then
    A._drop_entry(id)
    raise(ffi.string(C.dp_last_error()))
  end
  local y = torch._wrap(outp[0])
  if not y.requires_grad then A._drop_entry(id) end
  return y
end

-- The children of a Sequential, or a list of functions or modules.
local function function_list(functions)
  if type(functions) == "table" and functions._modules ~= nil and functions.len then
    local list = {}
    for i = 0, functions:len() - 1 do list[i + 1] = functions[i] end
    return list
  end
  if type(functions) ~= "table" or is_tensor(functions) then
    raise("checkpoint_sequential: expected an nn.Sequential or a list of functions, got " .. typename(functions))
  end
  return functions
end

-- checkpoint_sequential(functions, segments, input [, {use_reentrant=,
-- preserve_rng_state=}]): PyTorch's: the functions split into `segments`
-- runs of #functions // segments, each but the last run checkpointed, the
-- last (with the rest) run as it is.
function M.checkpoint_sequential(functions, segments, input, opts)
  local list = function_list(functions)
  if type(segments) ~= "number" or segments < 1 or segments % 1 ~= 0 then
    raise("checkpoint_sequential: expected segments to be a positive integer, got " .. tostring(segments))
  end
  if opts ~= nil and (type(opts) ~= "table" or is_tensor(opts)) then
    raise("checkpoint_sequential: expected an options table, got " .. typename(opts))
  end
  local extra = opts and next(opts) ~= nil and opts or nil
  local function run(first, last)
    return function(x)
      for i = first, last do x = list[i](x) end
      return x
    end
  end
  if segments > #list then
    raise(string.format("checkpoint_sequential: %d segments for %d functions (expected at most one a function)",
                        segments, #list))
  end
  local size = math.floor(#list / segments)
  local stop = 0
  for start = 1, size * (segments - 1), size do
    stop = start + size - 1
    if extra then input = M.checkpoint(run(start, stop), input, extra)
    else input = M.checkpoint(run(start, stop), input) end
  end
  return run(stop + 1, #list)(input)
end

return M
