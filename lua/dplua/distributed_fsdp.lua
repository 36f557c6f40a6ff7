-- dplua.distributed_fsdp: dist.fsdp.FullyShardedDataParallel, full
-- sharding (ZeRO-3): each rank keeps 1/N of the parameters of the modules
-- the policy wraps (a model's blocks), and gathers a block's whole
-- parameters only while that block runs.
--
--   local fsdp = torch.distributed.fsdp
--   local model = fsdp.FullyShardedDataParallel(net, { auto_wrap_policy = fsdp.ModuleWrapPolicy({ Block }) })
--   local opt = torch.optim.AdamW(model:parameters(), { lr = 3e-4 })
--   loss_fn(model(x), y):backward(); opt:step()
--
-- Each wrapped module (a unit) holds its parameters as one flat buffer of
-- T elements padded to N S, of which rank r keeps elements [r S, (r+1) S)
-- as a Parameter: the optimizer steps the shards. A unit's forward
-- all-gathers the buffer, runs the module on views of it under no_grad and
-- frees it; its backward all-gathers again, runs the module again with
-- gradients (from the random state its forward began with, so dropout
-- draws the same masks) and reduce-scatters the parameters' gradients
-- (averaged) into the shard's. So between uses a unit's parameters take
-- 1/N of their memory on each rank, and its activations are not kept: the
-- forward of a unit runs twice a step, as under activation checkpointing.
-- With sharding_strategy "SHARD_GRAD_OP" a unit's forward records its
-- graph on the gathered parameters instead, which stay until its backward
-- has used them: one gather and one forward a step, for the memory of the
-- whole parameters and the activations between forward and backward.
-- The parameters outside every unit (embeddings, a head, weights a unit
-- shares with them) stay whole on every rank, their gradients averaged
-- by an all-reduce as DistributedDataParallel's are.
local torch = require("dplua")
local raise, is_tensor = torch._raise, torch.is_tensor

local M = {}

local function typename(x) return is_tensor(x) and "Tensor" or type(x) end

-- ModuleWrapPolicy(classes): wrap the modules of these classes (or of
-- classes extended from them)
function M.ModuleWrapPolicy(classes)
  if type(classes) ~= "table" or #classes == 0 then
    raise("ModuleWrapPolicy: expected a non-empty list of module classes")
  end
  for i, c in ipairs(classes) do
    if type(c) ~= "table" or rawget(c, "__instance_mt") == nil then
      raise(string.format("ModuleWrapPolicy: expected classes[%d] to be a module class", i))
    end
  end
  return function(module)
    for _, c in ipairs(classes) do if module:isinstance(c) then return true end end
    return false
  end
end

-- The collectives of a unit's flat buffer
local function all_gather(out, t, group) torch.distributed.all_gather_into_tensor(out, t, group) end
local function reduce_scatter(out, t, group)
  torch.distributed.reduce_scatter_tensor(out, t, torch.distributed.ReduceOp.SUM, group)
end

---------------------------------------------------------------- units

local recompute = require("dplua.utils.checkpoint")

-- The units: the outermost modules the policy takes (the root never).
local function find_units(root, policy)
  local units = {}
  local function walk(m, name)
    for _, e in ipairs(m:named_children()) do
      local child, full = e[2], name == "" and e[1] or (name .. "." .. e[1])
      if policy(child, full) then units[#units + 1] = { module = child, name = full } else walk(child, full) end
    end
  end
  walk(root, "")
  return units
end

-- Every (owner, key, parameter) of a module, its own and its descendants'.
local function param_slots(module)
  local slots = {}
  for _, e in ipairs(module:named_modules()) do
    local m = e[2]
    for _, k in ipairs(m._parameters.keys) do
      local p = m._parameters.map[k]
      if p ~= nil then slots[#slots + 1] = { owner = m, key = k, param = p } end
    end
  end
  return slots
end

local placeholder = torch.empty(0)

-- Puts views of full (T elements) in the owners' places; as leaves that
-- require grad when leaves. Returns the views, one per distinct parameter.
local function install(unit, full, leaves)
  local views = {}
  for i, s in ipairs(unit.params) do
    local v = full:narrow(0, s.offset, s.numel):view(s.shape)
    if leaves then v = v:detach():requires_grad_(true) end
    views[i] = v
  end
  for _, s in ipairs(unit.slots) do s.owner._parameters.map[s.key] = views[s.index] end
  return views
end
local function uninstall(unit)
  for _, s in ipairs(unit.slots) do s.owner._parameters.map[s.key] = placeholder end
end

-- The unit's whole flat buffer (N S elements) from every rank's shard, in
-- the shards' dtype or (for compute under mixed precision) another: the
-- shard is cast before the all-gather, which then moves fewer bytes.
local function gather(unit, dtype)
  dtype = dtype or unit.shard.dtype
  local shard = unit.shard:detach()
  if shard.dtype ~= dtype then shard = shard:to(dtype) end
  local full = torch.empty({ unit.padded }, { dtype = dtype, device = unit.shard.device })
  if unit.size == 1 then full:copy_(shard) else all_gather(full, shard, unit.group) end
  return full
end

---------------------------------------------------------------- prefetching

-- A unit's gather for its next use, started while another unit computes
-- (an asynchronous all-gather; PyTorch's backward_prefetch and
-- forward_prefetch). The order comes from the previous step: the units in
-- the order their forwards ran. Every rank runs the same order, so the
-- collectives match. A prefetch not taken by the end of a step (a unit the
-- step did not call) is waited for and dropped when the next forward
-- begins, before the optimizer's new shards could be used stale.
local function prefetch(unit, dtype)
  if not unit or unit.prefetched ~= nil then return end
  local shard = unit.shard:detach()
  if shard.dtype ~= dtype then shard = shard:to(dtype) end
  local full = torch.empty({ unit.padded }, { dtype = dtype, device = unit.shard.device })
  local p = { full = full, shard = shard, dtype = dtype }
  if unit.size == 1 then full:copy_(shard) else
    p.work = torch.distributed.all_gather_into_tensor(full, shard, unit.group, true)
  end
  unit.prefetched = p
end

-- The unit's whole buffer: its prefetch when there is one (of that dtype), else a gather now
local function gathered(unit, dtype)
  dtype = dtype or unit.shard.dtype
  local p = unit.prefetched
  if p ~= nil then
    unit.prefetched = nil
    if p.work then p.work:wait() end
    if p.dtype == dtype then
      unit.prefetches_used = (unit.prefetches_used or 0) + 1
      return p.full
    end
  end
  return gather(unit, dtype)
end

-- When a unit's forward runs: record the order, and prefetch the next
-- unit's forward gather (forward_prefetch)
local function forward_order(unit)
  local owner = unit.owner
  owner.seen[#owner.seen + 1] = unit
  if owner.forward_prefetch then prefetch(owner.next_of[unit], unit.param_dtype or unit.shard.dtype) end
end

-- The unit's module called; under mixed precision its floating arguments
-- cast to param_dtype and its result back to the first one's dtype
-- (recorded, where autograd records, so gradients come back in the
-- arguments' dtypes).
local function run_unit(unit, ...)
  local low = unit.param_dtype
  if low == nil then return unit.run(unit.module, ...) end
  local n = select("#", ...)
  local args, back = { ... }, nil
  for i = 1, n do
    local a = args[i]
    if is_tensor(a) and a:is_floating_point() then
      back = back or a.dtype
      if a.dtype ~= low then args[i] = a:to(low) end
    end
  end
  local out = unit.run(unit.module, unpack(args, 1, n))
  if back ~= nil and is_tensor(out) and out:is_floating_point() and out.dtype ~= back then out = out:to(back) end
  return out
end

-- The autograd Function of a unit's call: (shard, unit, args...) -> output.
local UnitFn = require("dplua.autograd").Function:extend("FullyShardedDataParallelUnit")

local function check_output(unit, out)
  if not is_tensor(out[2]) or out[3] ~= nil then
    raise(string.format("FullyShardedDataParallel: the unit %s must return one tensor, got %s", unit.name,
                        typename(out[2])))
  end
end

function UnitFn.forward(ctx, shard, unit, ...)
  local nargs = select("#", ...)
  local full = gathered(unit, unit.param_dtype)
  forward_order(unit)
  local backward_comes = false
  for _, needs in ipairs(ctx.needs_input_grad) do backward_comes = backward_comes or needs end
  ctx.unit, ctx.nargs = unit, nargs
  if unit.keep_activations and backward_comes then
    -- SHARD_GRAD_OP: the forward records its graph on the gathered
    -- parameters, which stay until the backward has used them
    local views = install(unit, full, true)
    local args, copies, positions = recompute._leaf_args({ ... }, nargs)
    local out = { pcall(torch.enable_grad, run_unit, unit, unpack(args, 1, nargs)) }
    uninstall(unit)
    if not out[1] then error(out[2], 0) end
    check_output(unit, out)
    ctx.kept = { out = out[2], views = views, copies = copies, positions = positions }
    ctx.keeps = true
    return out[2]:detach()
  end
  local state = recompute._run_state()
  install(unit, full, false)
  local out = { pcall(run_unit, unit, ...) }
  uninstall(unit)
  if not out[1] then error(out[2], 0) end
  check_output(unit, out)
  ctx.args, ctx.state = { ... }, state
  return out[2]
end

-- The backward of a unit's graph: the kept one (SHARD_GRAD_OP), or the
-- forward run again on the gathered parameters (FULL_SHARD); the
-- parameters' views and the arguments' copies, whose gradients it left.
local function unit_backward(ctx, grad)
  local unit, kept = ctx.unit, ctx.kept
  if ctx.keeps and kept == nil then
    raise("FullyShardedDataParallel: under sharding_strategy \"SHARD_GRAD_OP\" a unit's kept graph serves one " ..
          "backward; a second backward through it (retain_graph) needs \"FULL_SHARD\", which recomputes it")
  end
  if kept ~= nil then
    ctx.kept = nil
    local ok, err = true, nil
    if kept.out.requires_grad then ok, err = pcall(kept.out.backward, kept.out, grad) end
    if not ok then error(err, 0) end
    return kept.views, kept.copies, kept.positions
  end
  local full = gathered(unit, unit.param_dtype)
  -- the unit whose backward comes next: its gather, while this one computes
  if unit.owner.backward_prefetch then prefetch(unit.owner.prev_of[unit], unit.param_dtype or unit.shard.dtype) end
  local views = install(unit, full, true)
  -- (the random state and autocast state the forward ran with, so that
  -- dropout draws the same masks and the same casts happen)
  local function run(...) return run_unit(unit, ...) end
  local ok, out, copies, positions = recompute._replay(ctx.state, run, ctx.args, ctx.nargs)
  if ok and out.requires_grad then ok, out = pcall(out.backward, out, grad) end
  uninstall(unit)
  if not ok then error(out, 0) end
  return views, copies, positions
end

function UnitFn.backward(ctx, grad)
  local unit = ctx.unit
  local views, copies, positions = unit_backward(ctx, grad)
  -- the parameters' gradients, flat and padded, averaged (in reduce_dtype
  -- under mixed precision) into the shard's
  local flat = torch.zeros({ unit.padded }, { dtype = unit.reduce_dtype or unit.shard.dtype, device = unit.shard.device })
  for i, s in ipairs(unit.params) do
    local g = views[i].grad
    if g ~= nil then flat:narrow(0, s.offset, s.numel):copy_(g:reshape(-1)) end
  end
  local sg = torch.empty({ unit.shard_size }, { dtype = flat.dtype, device = flat.device })
  if unit.size == 1 then sg:copy_(flat) else
    reduce_scatter(sg, flat, unit.group)
    sg:div_(unit.size)
  end
  if sg.dtype ~= unit.shard.dtype then sg = sg:to(unit.shard.dtype) end
  local grads = { sg, nil }
  for k, d in ipairs(copies) do grads[positions[k] + 2] = d.grad end
  return unpack(grads, 1, ctx.nargs + 2)
end

-- MixedPrecision({param_dtype =, reduce_dtype =}): the units compute in
-- param_dtype (their parameters gathered in it, their floating inputs
-- cast to it and their results cast back) and reduce their gradients in
-- reduce_dtype (param_dtype when not given); the shards, which the
-- optimizer steps, keep their dtype. PyTorch's FSDP MixedPrecision for
-- the units, with one difference: a unit's result is cast back to its
-- input's dtype (PyTorch leaves it in param_dtype), since the parameters
-- kept whole between the units stay in theirs.
local mp_mt = { __name = "MixedPrecision" }
function M.MixedPrecision(opts)
  local fn = "MixedPrecision"
  opts = torch._options(opts, fn)
  for k, v in pairs(opts) do
    if k ~= "param_dtype" and k ~= "reduce_dtype" then
      raise(string.format("%s: option '%s' is not supported here (param_dtype and reduce_dtype are)", fn, tostring(k)))
    end
    if not (type(v) == "table" and v.is_floating_point) then
      raise(string.format("%s: expected %s to be a floating dtype, got %s", fn, k, tostring(v)))
    end
  end
  return setmetatable({ param_dtype = opts.param_dtype, reduce_dtype = opts.reduce_dtype or opts.param_dtype }, mp_mt)
end

---------------------------------------------------------------- the wrapper

local FSDP = torch.nn.Module:extend("FullyShardedDataParallel")
M.FullyShardedDataParallel = FSDP

local own_options = { auto_wrap_policy = true, process_group = true, sharding_strategy = true, device_id = true,
                      sync_module_states = true, mixed_precision = true, forward_prefetch = true,
                      backward_prefetch = true }

-- FullyShardedDataParallel(module [, {auto_wrap_policy =, process_group =,
-- sharding_strategy = "FULL_SHARD"}]): auto_wrap_policy is a function
-- (module, name) -> boolean, or ModuleWrapPolicy(classes); a module it
-- takes is a unit (its own descendants are not looked at). Every rank
-- starts from rank 0's parameters.
function FSDP:__init(module, opts)
  local fn = "FullyShardedDataParallel"
  if not torch.nn.is_module(module) then raise(fn .. ": expected a module, got " .. typename(module)) end
  opts = torch._options(opts, fn)
  for k in pairs(opts) do
    if not own_options[k] then raise(fn .. ": unknown option '" .. tostring(k) .. "'") end
  end
  local strategy = opts.sharding_strategy or "FULL_SHARD"
  if strategy ~= "FULL_SHARD" and strategy ~= "SHARD_GRAD_OP" then
    raise(fn .. ': sharding_strategy "FULL_SHARD" and "SHARD_GRAD_OP" are implemented here, got ' .. tostring(strategy)
          .. " (for NO_SHARD, DistributedDataParallel)")
  end
  if opts.forward_prefetch ~= nil and type(opts.forward_prefetch) ~= "boolean" then
    raise(fn .. ": expected forward_prefetch to be a boolean, got " .. typename(opts.forward_prefetch))
  end
  local bp = opts.backward_prefetch
  if bp ~= nil and bp ~= false and bp ~= "BACKWARD_PRE" and bp ~= "BACKWARD_POST" then
    raise(fn .. ': expected backward_prefetch to be "BACKWARD_PRE" (the default), "BACKWARD_POST" or false, got '
          .. tostring(bp))
  end
  -- the prefetching state every unit shares: the order of the last step
  local owner = { seen = {}, next_of = {}, prev_of = {}, forward_prefetch = opts.forward_prefetch == true,
                  backward_prefetch = bp ~= false }
  local mp = opts.mixed_precision
  if mp ~= nil and getmetatable(mp) ~= mp_mt then
    raise(fn .. ": expected mixed_precision to be a fsdp.MixedPrecision({param_dtype =, reduce_dtype =}), got "
          .. typename(mp))
  end
  local policy = opts.auto_wrap_policy
  if type(policy) ~= "function" then
    raise(fn .. ": expected auto_wrap_policy to be a function (module, name) -> boolean or fsdp.ModuleWrapPolicy, got "
          .. typename(policy))
  end
  local group = opts.process_group or torch.distributed.GroupMember.WORLD
  if group == nil then raise(fn .. ": Default process group has not been initialized") end
  local rank, size = torch.distributed.get_rank(group), torch.distributed.get_world_size(group)
  self.module = module
  local units = find_units(module, policy)
  if #units == 0 then raise(fn .. ": the auto_wrap_policy took no module: there is nothing to shard") end
  -- a parameter is sharded with its unit when every place it has in the
  -- model is in that unit; one shared with other units or the rest (tied
  -- weights) stays whole
  local count = {}
  for _, s in ipairs(param_slots(module)) do count[s.param] = (count[s.param] or 0) + 1 end
  local in_unit = {}
  for ui, u in ipairs(units) do
    local here = {}
    for _, s in ipairs(param_slots(u.module)) do here[s.param] = (here[s.param] or 0) + 1 end
    for p, n in pairs(here) do
      if n == count[p] then in_unit[p] = ui end
    end
  end
  torch.no_grad(function()
    for ui, u in ipairs(units) do
      u.group, u.rank, u.size = group, rank, size
      u.keep_activations = strategy == "SHARD_GRAD_OP"
      u.owner = owner
      u.param_dtype, u.reduce_dtype = mp and mp.param_dtype, mp and mp.reduce_dtype
      u.run = getmetatable(u.module).__class.forward
      u.slots, u.params = {}, {}
      local index_of, total, dtype, device = {}, 0, nil, nil
      for _, s in ipairs(param_slots(u.module)) do
        if in_unit[s.param] == ui then
          local p = s.param
          dtype, device = dtype or p.dtype, device or p.device
          if p.dtype ~= dtype or p.device ~= device then
            raise(string.format("%s: the parameters of %s must share one dtype and device (%s on %s, then %s on %s)",
                                fn, u.name, tostring(dtype), tostring(device), tostring(p.dtype), tostring(p.device)))
          end
          if not index_of[p] then
            u.params[#u.params + 1] = { shape = p:size(), numel = p:numel(), offset = total }
            index_of[p] = #u.params
            total = total + p:numel()
          end
          u.slots[#u.slots + 1] = { owner = s.owner, key = s.key, index = index_of[p] }
        end
      end
      if total == 0 then raise(fn .. ": the unit " .. u.name .. " has no parameters of its own to shard") end
      u.shard_size = math.ceil(total / size)
      u.padded = u.shard_size * size
      local full = torch.zeros({ u.padded }, { dtype = dtype, device = device })
      for _, s in ipairs(param_slots(u.module)) do
        local i = in_unit[s.param] == ui and index_of[s.param]
        if i then full:narrow(0, u.params[i].offset, u.params[i].numel):copy_(s.param:reshape(-1)) end
      end
      if size > 1 then torch.distributed.broadcast(full, torch.distributed.get_global_rank(group, 0), group) end
      u.shard = torch.nn.Parameter(full:narrow(0, rank * u.shard_size, u.shard_size):clone())
      uninstall(u)
      u.module.forward = function(m, ...) return UnitFn.apply(u.shard, u, ...) end
    end
  end)
  self._units = units
  self._prefetching = owner
  -- the parameters kept whole: from rank 0, gradients averaged
  self._replicated = {}
  for _, p in ipairs(module:parameters()) do
    if p ~= placeholder then self._replicated[#self._replicated + 1] = p end
  end
  for _, p in ipairs(self._replicated) do
    if size > 1 then
      torch.no_grad(function() torch.distributed.broadcast(p, torch.distributed.get_global_rank(group, 0), group) end)
    end
    if p.requires_grad and size > 1 then
      p:register_hook(function(g)
        local avg = g:clone()
        torch.distributed.all_reduce(avg, torch.distributed.ReduceOp.SUM, group)
        return avg:div_(size)
      end)
    end
  end
  self._group, self._size = group, size
end

-- A step begins: the last step's order of units is the one to prefetch
-- in; what it prefetched and did not use is waited for and dropped.
function FSDP:forward(...)
  local owner = self._prefetching
  for _, u in ipairs(self._units) do
    local p = u.prefetched
    if p ~= nil then
      u.prefetched = nil
      if p.work then p.work:wait() end
    end
  end
  if #owner.seen > 0 then
    owner.next_of, owner.prev_of = {}, {}
    for i, u in ipairs(owner.seen) do
      if owner.next_of[u] == nil then owner.next_of[u] = owner.seen[i + 1] or false end
      if owner.prev_of[u] == nil then owner.prev_of[u] = owner.seen[i - 1] or false end
    end
    owner.seen = {}
  end
  return self.module(...)
end

-- no_sync(fn, ...): fn(...), for loops written for PyTorch's FSDP that
-- accumulate micro-batches; here every backward reduces its gradients
-- (each unit's into its shard, the rest by all-reduce), so the
-- accumulated gradients are the same, with more communication.
function FSDP:no_sync(fn, ...)
  if type(fn) ~= "function" then raise("FullyShardedDataParallel.no_sync: expected a function, got " .. typename(fn)) end
  return fn(...)
end

-- The shards are made where the parameters were: move the model first.
function FSDP:to(...)
  raise("FullyShardedDataParallel: move the model to its device and dtype before wrapping it (the shards are made " ..
        "where the parameters are)")
end
FSDP.cuda, FSDP.cpu, FSDP.float, FSDP.double, FSDP.bfloat16 = FSDP.to, FSDP.to, FSDP.to, FSDP.to, FSDP.to

-- parameters(): what the optimizer steps, the units' shards then the
-- parameters kept whole
function FSDP:parameters()
  local out = {}
  for _, u in ipairs(self._units) do out[#out + 1] = u.shard end
  for _, p in ipairs(self._replicated) do out[#out + 1] = p end
  return out
end
function FSDP:named_parameters()
  local out = {}
  for _, u in ipairs(self._units) do out[#out + 1] = { u.name .. "._flat_shard", u.shard } end
  local names = {}
  for _, e in ipairs(self.module:named_parameters()) do names[e[2]] = names[e[2]] or e[1] end
  for _, p in ipairs(self._replicated) do out[#out + 1] = { names[p], p } end
  return out
end

-- Runs fn with every unit's whole parameters in place (gathered), then
-- puts the placeholders back.
local function with_whole(self, fn)
  local fulls = {}
  for i, u in ipairs(self._units) do
    fulls[i] = gather(u)
    install(u, fulls[i], false)
  end
  local res = { pcall(fn, fulls) }
  for _, u in ipairs(self._units) do uninstall(u) end
  if not res[1] then error(res[2], 0) end
  return unpack(res, 2)
end

-- summon_full_params(fn [, {writeback = true}]): fn() with every unit's
-- whole parameters in their modules' places (gathered on every rank; a
-- collective), to read or change them; with writeback what fn left in
-- them goes back into each rank's shards. Returns fn's results.
function FSDP:summon_full_params(fn, opts)
  local name = "FullyShardedDataParallel.summon_full_params"
  if type(fn) ~= "function" then raise(name .. ": expected a function, got " .. typename(fn)) end
  opts = torch._options(opts, name)
  local writeback = opts.writeback ~= false
  return with_whole(self, function(fulls)
    local res = { torch.no_grad(fn) }
    if writeback then
      torch.no_grad(function()
        for i, u in ipairs(self._units) do u.shard:copy_(fulls[i]:narrow(0, u.rank * u.shard_size, u.shard_size)) end
      end)
    end
    return unpack(res)
  end)
end

-- state_dict(): the whole model's, with its own keys (gathered on every
-- rank: PyTorch's FULL_STATE_DICT), values detached copies
function FSDP:state_dict()
  return with_whole(self, function()
    local sd = self.module:state_dict()
    for _, k in ipairs(sd:keys()) do
      local v = sd[k]
      if is_tensor(v) then sd[k] = v:detach():clone() end
    end
    return sd
  end)
end

-- load_state_dict(sd [, opts]): a whole state dict (as state_dict gives,
-- or the unwrapped model's); each rank keeps its shards of it.
function FSDP:load_state_dict(sd, opts)
  return with_whole(self, function(fulls)
    local r = self.module:load_state_dict(sd, opts)
    torch.no_grad(function()
      for i, u in ipairs(self._units) do u.shard:copy_(fulls[i]:narrow(0, u.rank * u.shard_size, u.shard_size)) end
    end)
    return r
  end)
end

---------------------------------------------------------------- optimizer state

-- The name of each unit parameter (its first place in the model), per unit
local function unit_param_names(self)
  local names = self._unit_names
  if names then return names end
  local path = {}
  for _, e in ipairs(self.module:named_modules()) do if path[e[2]] == nil then path[e[2]] = e[1] end end
  names = {}
  for ui, u in ipairs(self._units) do
    names[ui] = {}
    for _, slot in ipairs(u.slots) do
      if names[ui][slot.index] == nil then
        local prefix = path[slot.owner]
        names[ui][slot.index] = prefix == "" and slot.key or (prefix .. "." .. slot.key)
      end
    end
  end
  self._unit_names = names
  return names
end

-- What the optimizer's parameters are: shard -> unit index, whole
-- parameter -> name
local function parameter_roles(self)
  local unit_of, name_of = {}, {}
  for ui, u in ipairs(self._units) do unit_of[u.shard] = ui end
  for _, e in ipairs(self:named_parameters()) do name_of[e[2]] = e[1] end
  return unit_of, name_of
end

local function sorted_keys(t)
  local keys = {}
  for k in pairs(t) do keys[#keys + 1] = k end
  table.sort(keys, function(a, b) return tostring(a) < tostring(b) end)
  return keys
end

local function copy_state(st)
  local c = {}
  for k, v in pairs(st) do c[k] = is_tensor(v) and v:detach():clone() or v end
  return c
end

local function check_optimizer(opt, fn)
  if type(opt) ~= "table" or type(opt.state_dict) ~= "function" or type(opt.param_groups) ~= "table" then
    raise(fn .. ": expected an optimizer over the wrapper's parameters(), got " .. typename(opt))
  end
end

-- optim_state_dict(opt): the optimizer's whole state with the unwrapped
-- model's parameter names as keys (state[name] = {step =, exp_avg = a
-- tensor of the parameter's shape, ...}; each group's params a list of
-- names), gathered on every rank (PyTorch's FSDP.optim_state_dict); a
-- collective: every rank calls it. It loads into a run on any number of
-- ranks through optim_state_dict_to_load.
function FSDP:optim_state_dict(opt)
  local fn = "FullyShardedDataParallel.optim_state_dict"
  check_optimizer(opt, fn)
  local names = unit_param_names(self)
  local unit_of, name_of = parameter_roles(self)
  local sd = opt:state_dict()
  local state, groups, id = {}, {}, 0
  for gi, g in ipairs(opt.param_groups) do
    local c, pnames = {}, {}
    for k, v in pairs(sd.param_groups[gi]) do if k ~= "params" then c[k] = v end end
    for _, p in ipairs(g.params) do
      local st, ui = sd.state[id], unit_of[p]
      if ui then
        local u = self._units[ui]
        for i = 1, #u.params do pnames[#pnames + 1] = names[ui][i] end
        if st then
          local per = {}
          for i = 1, #u.params do per[i] = {} end
          for _, k in ipairs(sorted_keys(st)) do   -- (the same order of collectives on every rank)
            local v = st[k]
            if is_tensor(v) and k ~= "step" and v:numel() == u.shard_size then
              local full = torch.empty({ u.padded }, { dtype = v.dtype, device = v.device })
              if u.size == 1 then full:copy_(v:reshape(-1)) else
                all_gather(full, v:detach():reshape(-1):contiguous(), u.group)
              end
              for i, prm in ipairs(u.params) do per[i][k] = full:narrow(0, prm.offset, prm.numel):view(prm.shape):clone() end
            else
              for i = 1, #u.params do per[i][k] = is_tensor(v) and v:detach():clone() or v end
            end
          end
          for i = 1, #u.params do state[names[ui][i]] = per[i] end
        end
      else
        local name = name_of[p]
        if name == nil then raise(fn .. ": the optimizer steps a tensor that is not one of the wrapper's parameters()") end
        pnames[#pnames + 1] = name
        if st then state[name] = copy_state(st) end
      end
      id = id + 1
    end
    c.params = pnames
    groups[gi] = c
  end
  return { state = state, param_groups = groups }
end

-- optim_state_dict_to_load(opt, osd): what opt:load_state_dict takes on
-- this rank from an optim_state_dict() (of a run on any number of ranks):
-- each unit's per-parameter state flattened and this rank's shard of it
-- kept. No collective.
function FSDP:optim_state_dict_to_load(opt, osd)
  local fn = "FullyShardedDataParallel.optim_state_dict_to_load"
  check_optimizer(opt, fn)
  if type(osd) ~= "table" or type(osd.state) ~= "table" or type(osd.param_groups) ~= "table" then
    raise(fn .. ": expected a state dict from optim_state_dict() {state =, param_groups =}")
  end
  if #osd.param_groups ~= #opt.param_groups then
    raise(string.format("%s: the state dict has %d parameter groups, the optimizer %d", fn, #osd.param_groups,
                        #opt.param_groups))
  end
  local names = unit_param_names(self)
  local unit_of, name_of = parameter_roles(self)
  local current = opt:state_dict()
  local state, groups, id = {}, {}, 0
  for gi, g in ipairs(opt.param_groups) do
    local c = {}
    for k, v in pairs(osd.param_groups[gi]) do if k ~= "params" then c[k] = v end end
    c.params = current.param_groups[gi].params
    groups[gi] = c
    for _, p in ipairs(g.params) do
      local ui = unit_of[p]
      if ui then
        local u = self._units[ui]
        local first = osd.state[names[ui][1]]
        if first then
          local st = {}
          for k, v in pairs(first) do
            if is_tensor(v) and k ~= "step" and table.concat(v:size(), ",") == table.concat(u.params[1].shape, ",") then
              local full = torch.zeros({ u.padded }, { dtype = v.dtype, device = u.shard.device })
              for i, prm in ipairs(u.params) do
                local entry = osd.state[names[ui][i]]
                local pv = entry and entry[k]
                if not is_tensor(pv) or pv:numel() ~= prm.numel then
                  raise(string.format("%s: the state of %s has no %s of %d elements", fn, names[ui][i], tostring(k),
                                      prm.numel))
                end
                full:narrow(0, prm.offset, prm.numel):copy_(pv:reshape(-1))
              end
              st[k] = full:narrow(0, u.rank * u.shard_size, u.shard_size):clone()
            else
              st[k] = is_tensor(v) and v:detach():clone() or v
            end
          end
          state[id] = st
        end
      else
        local entry = osd.state[name_of[p]]
        if entry then state[id] = copy_state(entry) end
      end
      id = id + 1
    end
  end
  return { state = state, param_groups = groups }
end

---------------------------------------------------------------- sharded checkpoints

-- The state dict keys of every unit parameter's places
local function unit_slot_names(self)
  local path = {}
  for _, e in ipairs(self.module:named_modules()) do path[e[2]] = path[e[2]] or {} ; table.insert(path[e[2]], e[1]) end
  local slots = {}   -- per unit: { name =, index = } for every place of every parameter
  for ui, u in ipairs(self._units) do
    slots[ui] = {}
    for _, slot in ipairs(u.slots) do
      for _, prefix in ipairs(path[slot.owner]) do
        slots[ui][#slots[ui] + 1] = { name = prefix == "" and slot.key or (prefix .. "." .. slot.key), index = slot.index }
      end
    end
  end
  return slots
end

-- sharded_state_dict([opt]): this rank's part of a checkpoint, gathering
-- nothing: its shard of every unit, the rest of the model's state dict
-- (whole parameters and buffers), and with opt its optimizer's state (of
-- the shards) with what each of its parameters is. Every rank saves its
-- own; load_sharded_state_dict takes the list of them on any number of ranks.
function FSDP:sharded_state_dict(opt)
  if opt ~= nil then check_optimizer(opt, "FullyShardedDataParallel.sharded_state_dict") end
  local in_unit = {}
  for _, list in ipairs(unit_slot_names(self)) do for _, e in ipairs(list) do in_unit[e.name] = true end end
  local whole = {}
  local sd = self.module:state_dict()
  for _, k in ipairs(sd:keys()) do
    local v = sd[k]
    if not in_unit[k] then whole[k] = is_tensor(v) and v:detach():clone() or v end
  end
  local units, numels = {}, {}
  for _, u in ipairs(self._units) do
    units[u.name] = u.shard:detach():clone()
    numels[u.name] = u.params[#u.params].offset + u.params[#u.params].numel
  end
  local out = { rank = self._units[1].rank, world_size = self._size, whole = whole, units = units, numels = numels }
  if opt ~= nil then
    local unit_of, name_of = parameter_roles(self)
    local roles = {}
    for _, g in ipairs(opt.param_groups) do
      for _, p in ipairs(g.params) do
        roles[#roles + 1] = unit_of[p] and ("unit:" .. self._units[unit_of[p]].name) or ("param:" .. tostring(name_of[p]))
      end
    end
    local osd = opt:state_dict()
    local state = {}
    for id, st in pairs(osd.state) do state[id] = copy_state(st) end
    out.optimizer = { state = state, param_groups = osd.param_groups, roles = roles }
  end
  return out
end

-- Every rank's sharded_state_dict(), in rank order, checked
local function check_shards(self, list, fn)
  if type(list) ~= "table" or #list == 0 then
    raise(fn .. ": expected the list of every rank's sharded_state_dict(), in rank order")
  end
  for r, sd in ipairs(list) do
    if type(sd) ~= "table" or type(sd.units) ~= "table" or type(sd.whole) ~= "table" then
      raise(string.format("%s: entry %d is not a sharded_state_dict()", fn, r))
    end
    if sd.rank ~= r - 1 or sd.world_size ~= #list then
      raise(string.format("%s: expected the %d ranks' shards in rank order; entry %d is rank %s of %s", fn, #list, r,
                          tostring(sd.rank), tostring(sd.world_size)))
    end
  end
end

-- A unit's T elements, from every rank's shard of it (key: its name)
local function unit_flat(list, unit, fn, pick)
  local parts = {}
  for r, sd in ipairs(list) do
    local t = pick(sd)
    if not is_tensor(t) then raise(string.format("%s: rank %d's checkpoint has no shard of unit %s", fn, r - 1, unit.name)) end
    parts[r] = t:reshape(-1)
  end
  local flat = torch.cat(parts)
  local total = unit.params[#unit.params].offset + unit.params[#unit.params].numel
  local saved = type(list[1].numels) == "table" and list[1].numels[unit.name]
  if saved and saved ~= total then
    raise(string.format("%s: the checkpoint's unit %s has %d parameter elements, this model's %d", fn, unit.name, saved,
                        total))
  end
  if flat:numel() < total then
    raise(string.format("%s: the shards of unit %s hold %d elements, its parameters %d", fn, unit.name, flat:numel(), total))
  end
  return flat:narrow(0, 0, total)
end

-- load_sharded_state_dict(list [, opt]): the model (and with opt the
-- optimizer) from every rank's sharded_state_dict() of a run on any number
-- of ranks, given in rank order (each rank reads them all and keeps its
-- shards).
function FSDP:load_sharded_state_dict(list, opt)
  local fn = "FullyShardedDataParallel.load_sharded_state_dict"
  check_shards(self, list, fn)
  if opt ~= nil then check_optimizer(opt, fn) end
  local sd = {}
  for k, v in pairs(list[1].whole) do sd[k] = v end
  local slots = unit_slot_names(self)
  local flats = {}
  for ui, u in ipairs(self._units) do
    flats[u.name] = unit_flat(list, u, fn, function(r) return r.units[u.name] end)
    for _, e in ipairs(slots[ui]) do
      local prm = u.params[e.index]
      sd[e.name] = flats[u.name]:narrow(0, prm.offset, prm.numel):view(prm.shape)
    end
  end
  self:load_state_dict(sd)
  if opt == nil then return end
  local o = list[1].optimizer
  if type(o) ~= "table" or type(o.roles) ~= "table" then
    raise(fn .. ": the checkpoint has no optimizer state (sharded_state_dict was called without the optimizer)")
  end
  local names = unit_param_names(self)
  local unit_named = {}
  for ui, u in ipairs(self._units) do unit_named[u.name] = ui end
  local osd = { state = {}, param_groups = {} }
  local names_of = {}   -- optimizer index -> the parameter names it stands for
  for i, role in ipairs(o.roles) do
    local id = i - 1
    local kind, what = role:match("^(%a+):(.*)$")
    if kind == "unit" then
      local ui = unit_named[what]
      if ui == nil then raise(string.format("%s: the checkpoint's unit %s is not a unit of this model", fn, what)) end
      local u = self._units[ui]
      names_of[id] = names[ui]
      local st = o.state[id]
      if st then
        local per = {}
        for j = 1, #u.params do per[j] = {} end
        for k, v in pairs(st) do
          if is_tensor(v) and k ~= "step" then
            local flat = unit_flat(list, u, fn, function(r) return r.optimizer.state[id] and r.optimizer.state[id][k] end)
            for j, prm in ipairs(u.params) do per[j][k] = flat:narrow(0, prm.offset, prm.numel):view(prm.shape) end
          else
            for j = 1, #u.params do per[j][k] = v end
          end
        end
        for j = 1, #u.params do osd.state[names[ui][j]] = per[j] end
      end
    else
      names_of[id] = { what }
      if o.state[id] then osd.state[what] = o.state[id] end
    end
  end
  for gi, g in ipairs(o.param_groups) do
    local c, pnames = {}, {}
    for k, v in pairs(g) do if k ~= "params" then c[k] = v end end
    for _, id in ipairs(g.params) do
      for _, name in ipairs(names_of[id] or {}) do pnames[#pnames + 1] = name end
    end
    c.params = pnames
    osd.param_groups[gi] = c
  end
  opt:load_state_dict(self:optim_state_dict_to_load(opt, osd))
end

-- clip_grad_norm_(max_norm [, norm_type = 2]): the norm of all the
-- gradients (the shards' summed over ranks, the whole ones once), every
-- gradient scaled by the same coefficient; returns the norm.
function FSDP:clip_grad_norm_(max_norm, norm_type)
  norm_type = norm_type or 2
  if norm_type == "inf" then norm_type = math.huge end
  if type(max_norm) ~= "number" or type(norm_type) ~= "number" or norm_type <= 0 then
    raise("FullyShardedDataParallel.clip_grad_norm_: expected max_norm and a positive norm_type (math.huge for the max)")
  end
  local inf = norm_type == math.huge
  -- the shards' part, combined over ranks; the whole gradients' part, the
  -- same on every rank (a NaN anywhere makes the norm NaN, as PyTorch's:
  -- math.max would drop it)
  local function part(g) return inf and g:double():abs():max():item() or g:double():abs():pow(norm_type):sum():item() end
  local function combine(a, b)
    if not inf then return a + b end
    if a ~= a or b ~= b then return 0 / 0 end
    return math.max(a, b)
  end
  local sharded, whole = 0, 0
  for _, u in ipairs(self._units) do
    local g = u.shard.grad
    if g ~= nil and g:numel() > 0 then sharded = combine(sharded, part(g)) end
  end
  for _, p in ipairs(self._replicated) do
    local g = p.grad
    if g ~= nil and g:numel() > 0 then whole = combine(whole, part(g)) end
  end
  -- (with the max, whether some rank's part is NaN travels beside it)
  local t = torch.tensor({ sharded ~= sharded and 0 or sharded, sharded ~= sharded and 1 or 0 }, { dtype = torch.float64 })
  if self._size > 1 then
    torch.distributed.all_reduce(t, inf and torch.distributed.ReduceOp.MAX or torch.distributed.ReduceOp.SUM, self._group)
  end
  local across = t[1]:item() > 0 and 0 / 0 or t[0]:item()
  local total = combine(across, whole)
  if not inf then total = total ^ (1 / norm_type) end
  local coef = max_norm / (total + 1e-6)
  if coef < 1 then
    torch.no_grad(function()
      for _, p in ipairs(self:parameters()) do if p.grad ~= nil then p.grad:mul_(coef) end end
    end)
  end
  return torch.tensor(total)
end

return M
