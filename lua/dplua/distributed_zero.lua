-- dplua.distributed_zero: sharded data parallelism over the flat buffers
-- (ZeRO) and Join for uneven inputs, as torch.distributed's
--
--   dist.optim.ZeroRedundancyOptimizer(params, {optimizer_class = torch.optim.AdamW, lr = 1e-3})
--   nn.parallel.DistributedDataParallel(model, {sharding_strategy = "SHARD_GRAD_OP"})
--   dist.algorithms.Join({ddp, opt}, function() ... training loop ... end)
--
-- The parameters of the optimizer lie in one flat buffer F of T elements
-- (DistributedDataParallel's, or one made here). Rank r of N owns the
-- contiguous shard [r*S, (r+1)*S) of it, S = ceil(T/N): the wrapped
-- optimizer (optimizer_class) is built over one 1-D tensor per parameter
-- group holding the group's elements of that shard, so its state is 1/N
-- of the whole. step() copies the shard's gradients in (from the flat
-- gradient buffer, or from DistributedDataParallel's gradient shard when
-- it shards them), steps, and all_gather of the shards restores F on
-- every rank. The sharding is by element, not by parameter: a parameter
-- may be split between two ranks, and the state stays balanced whatever
-- the parameters' sizes.
local ffi = require("ffi")
local torch = require("dplua")
local dist = require("dplua.distributed")
local raise = torch._raise
local C = torch.C

local M = {}

local function check(st)
  if st ~= 0 then raise(ffi.string(C.dp_last_error())) end
end

local function typename(x) return torch.is_tensor(x) and "Tensor" or type(x) end

-- A tensor's first byte, to place it in a flat buffer.
local function address(t) return tonumber(ffi.cast("intptr_t", C.dp_tensor_data(t.p))) end

local copy_value = require("dplua.optim.optimizer")._copy_value

-- This rank's shard [lo, hi) of T elements over N ranks (ddp.c's rule).
local function shard_of(total, size, rank)
  local s = math.ceil(total / size)
  return math.min(rank * s, total), math.min((rank + 1) * s, total), s
end

local function global_rank(g, r) return g.ranks and g.ranks[r + 1] or r end

---------------------------------------------------------------- DistributedDataParallel's side

M.ShardingStrategy = { NO_SHARD = "NO_SHARD", SHARD_GRAD_OP = "SHARD_GRAD_OP", FULL_SHARD = "FULL_SHARD" }

-- DistributedDataParallels by the address of their flat parameter buffer:
-- ZeroRedundancyOptimizer finds the one its parameters belong to.
local ddps = setmetatable({}, { __mode = "v" })

-- Called by DistributedDataParallel's constructor.
function M.attach_ddp(ddp, strategy)
  strategy = strategy or "NO_SHARD"
  if strategy == "FULL_SHARD" then
    raise("DistributedDataParallel: sharding_strategy \"FULL_SHARD\" shards the parameters too: use " ..
          "dist.fsdp.FullyShardedDataParallel(model, {auto_wrap_policy =})")
  end
  if M.ShardingStrategy[strategy] == nil then
    raise("DistributedDataParallel: expected sharding_strategy \"NO_SHARD\" (all-reduced gradients) or " ..
          "\"SHARD_GRAD_OP\" (each rank keeps its gradient shard, ZeRO-2), got " .. tostring(strategy))
  end
  local flat = torch._wrap(C.dp_ddp_flat_param(ddp._reducer))
  rawset(ddp, "_flat_param", flat)
  rawset(ddp, "_sharding", strategy)
  if strategy == "SHARD_GRAD_OP" then
    local box, lo, hi = ffi.new("dp_tensor*[1]"), ffi.new("int64_t[1]"), ffi.new("int64_t[1]")
    check(C.dp_ddp_shard_grads(ddp._reducer, box, lo, hi))
    rawset(ddp, "_grad_shard", torch._wrap(box[0]))
    rawset(ddp, "_shard", { tonumber(lo[0]), tonumber(hi[0]) })
  end
  ddps[address(flat)] = ddp
end

-- ddp:clip_grad_norm_(max_norm [, norm_type=2]): torch.nn.utils.clip_grad_norm_
-- over ddp:parameters(), the total norm returned as a 0-d tensor. With
-- SHARD_GRAD_OP the gradients are the ranks' shards: each rank's partial
-- norm is all-reduced and every shard scaled by the same coefficient,
-- min(max_norm / (total + 1e-6), 1), as FSDP's clip_grad_norm_.
function M.ddp_clip_grad_norm_(ddp, max_norm, norm_type)
  if ddp._sharding ~= "SHARD_GRAD_OP" then return torch.nn.utils.clip_grad_norm_(ddp:parameters(), max_norm, norm_type) end
  local fn = "DistributedDataParallel.clip_grad_norm_"
  if type(max_norm) ~= "number" then raise(fn .. ": expected max_norm to be a number, got " .. typename(max_norm)) end
  norm_type = norm_type or 2
  if norm_type == "inf" then norm_type = math.huge end
  if type(norm_type) ~= "number" then
    raise(fn .. ": expected norm_type to be a number (or math.huge), got " .. typename(norm_type))
  end
  return torch.no_grad(function()
    local g, inf = ddp._grad_shard, norm_type == math.huge
    local part
    if inf then part = g:abs():amax()
    elseif norm_type == 2 then part = g:norm():square()
    else part = (g:abs() ^ norm_type):sum() end
    part = part:reshape({ 1 })
    dist.all_reduce(part, inf and dist.ReduceOp.MAX or dist.ReduceOp.SUM, ddp._group)
    local total = inf and part or norm_type == 2 and part:sqrt() or part ^ (1 / norm_type)
    total = total:reshape({})
    g:mul_((max_norm / (total + 1e-6)):clamp(nil, 1.0))
    return total
  end)
end

---------------------------------------------------------------- Join

-- The Join running on this rank: its joinables (index by object) and group.
local active = nil

-- A joinable's per-iteration collective: an all_reduce of {1, which
-- joinable, whether it syncs gradients}, matched on a joined rank by
-- its all_reduce of zeros (see M.Join).
local function notify(joinable, sync)
  if not active or not active.index[joinable] then return end
  local flag = torch.tensor({ 1, active.index[joinable], sync and 1 or 0 }, { dtype = torch.int64 })
  dist.all_reduce(flag, dist.ReduceOp.SUM, active.group)
end

-- DistributedDataParallel's forward: the join notification, and its
-- sharded gradients need the sharded optimizer.
function M.ddp_forward(ddp)
  if ddp._sharding == "SHARD_GRAD_OP" and not rawget(ddp, "_zero") then
    raise("DistributedDataParallel: with sharding_strategy \"SHARD_GRAD_OP\" each rank keeps only its shard of " ..
          "the gradients (parameters' .grad stay nil), so the optimizer must be a " ..
          "torch.distributed.optim.ZeroRedundancyOptimizer over ddp:parameters(); build it before the first forward")
  end
  notify(ddp, not rawget(ddp, "_no_sync"))
end

-- A joined rank's share of one iteration of DDP's: the buffers'
-- broadcast, and the backward's bucket collectives with zero gradients.
local function ddp_join_hook(ddp, sync)
  ddp:_sync_buffers()
  if sync then check(C.dp_ddp_join_backward(ddp._reducer)) end
end

-- After the join, every rank takes the parameters of the last rank to
-- join, which stepped every iteration (as PyTorch's DDP).
local function ddp_join_post(ddp, last)
  dist.broadcast(ddp._flat_param, last, ddp._group)
end

local function join_hooks(j)
  if type(j) ~= "table" then return nil end
  if rawget(j, "_reducer") then return ddp_join_hook, ddp_join_post, j._group end
  if getmetatable(j) == M.ZeroRedundancyOptimizer then return function(z) z:_step_shard() end, nil, j._group end
end

-- Join(joinables, fn): runs fn(), the training loop over this rank's
-- inputs. A rank whose loop ends first then shadows the collectives of
-- the ranks still running (zero gradients, its optimizer shard's step and
-- all_gather) until every rank has ended, so uneven inputs do not hang.
-- Gradients stay divided by the whole group's size (PyTorch's
-- divide_by_initial_world_size). joinables: the DistributedDataParallel
-- and the ZeroRedundancyOptimizer in use (the optimizer only when it is a
-- ZeroRedundancyOptimizer), on one process group.
function M.Join(joinables, fn, opts)
  if type(joinables) ~= "table" or joinables[1] == nil then
    raise("Join: expected a list of joinables {ddp[, zero_optimizer]}, got " .. typename(joinables))
  end
  if type(fn) ~= "function" then raise("Join: expected the training loop as a function, got " .. typename(fn)) end
  if opts ~= nil and (type(opts) ~= "table" or opts.enable == nil and next(opts) ~= nil) then
    raise("Join: expected options {enable = true|false}")
  end
  if opts and opts.enable == false then return fn() end
  if active then raise("Join: already inside a Join on this rank") end
  local index, group = {}, nil
  for i, j in ipairs(joinables) do
    local hook, _, g = join_hooks(j)
    if not hook then
      raise(string.format("Join: joinable %d is a %s; expected a DistributedDataParallel or a " ..
                          "ZeroRedundancyOptimizer", i, typename(j)))
    end
    if group and g ~= group then raise("Join: the joinables must use the same process group") end
    index[j], group = i, g
  end
  active = { index = index, group = group }
  local ok, err = pcall(fn)
  if not ok then
    active = nil
    error(err, 0)
  end
  ok, err = pcall(function()
    local shadowed = 0
    while true do
      local flag = torch.zeros({ 3 }, { dtype = torch.int64 })
      dist.all_reduce(flag, dist.ReduceOp.SUM, group)
      local v = flag:tolist()
      if v[1] == 0 then break end
      local j = joinables[v[2] / v[1]]
      local hook = join_hooks(j)
      hook(j, v[3] ~= 0)
      shadowed = shadowed + 1
    end
    -- the last to join: of the ranks that shadowed nothing, the highest
    local last = torch.tensor({ shadowed == 0 and global_rank(group, group.rank) or -1 }, { dtype = torch.int64 })
    dist.all_reduce(last, dist.ReduceOp.MAX, group)
    for _, j in ipairs(joinables) do
      local _, post = join_hooks(j)
      if post then torch.no_grad(post, j, last:item()) end
    end
  end)
  active = nil
  if not ok then error(err, 0) end
end

---------------------------------------------------------------- ZeroRedundancyOptimizer

local ZeRO = {}
ZeRO.__index = ZeRO
ZeRO.__name = "ZeroRedundancyOptimizer"
M.ZeroRedundancyOptimizer = ZeRO

local own_options = { optimizer_class = true, process_group = true, parameters_as_bucket_view = true,
                      overlap_with_ddp = true }

local function groups_of(params)
  local fn = "ZeroRedundancyOptimizer"
  if torch.is_tensor(params) then
    raise(fn .. ": params should be a list of tensors or of param-group tables, but got a single Tensor (write {t})")
  end
  if type(params) ~= "table" or params[1] == nil then
    raise(fn .. ": expected a non-empty list of parameters or of param-group tables, got " .. typename(params))
  end
  local first = params[1]
  if torch.is_tensor(first) or (type(first) == "table" and type(first[1]) == "string") then
    params = { { params = params } }
  end
  local groups = {}
  for gi, g in ipairs(params) do
    if type(g) ~= "table" or torch.is_tensor(g) then
      raise(string.format("%s: param group %d should be a table {params=..., ...}, got %s", fn, gi, typename(g)))
    end
    local list, ps = {}, g.params
    if torch.is_tensor(ps) then ps = { ps } end
    if type(ps) ~= "table" or ps[1] == nil then raise(string.format("%s: param group %d has no 'params'", fn, gi)) end
    for i, p in ipairs(ps) do
      if type(p) == "table" and torch.is_tensor(p[2]) then p = p[2] end
      if not torch.is_tensor(p) then
        raise(string.format("%s: can only optimize Tensors, but parameter %d of group %d is %s", fn, i, gi, typename(p)))
      end
      list[i] = p
    end
    local copy = copy_value(g)
    copy.params = list
    groups[gi] = copy
  end
  return groups
end

-- The flat buffer F the parameters lie in: a DistributedDataParallel's
-- (all of its parameters, none else), or one made by flattening them.
-- Fills self._flat, self._flat_grad (nil with sharded gradients),
-- self._ddp and each parameter's offset in self._offset.
function ZeRO:_find_flat(all)
  local fn = "ZeroRedundancyOptimizer"
  local p1 = all[1]
  for i, p in ipairs(all) do
    if p.dtype ~= p1.dtype or p.device ~= p1.device then
      raise(string.format("%s: all parameters must share one dtype and device (they are sharded as one flat " ..
                          "buffer): parameter %d is %s on %s, parameter 1 %s on %s", fn, i, tostring(p.dtype),
                          tostring(p.device), tostring(p1.dtype), tostring(p1.device)))
    end
    if not p.is_leaf then raise(string.format("%s: can't optimize a non-leaf Tensor (parameter %d)", fn, i)) end
  end
  local size = p1.dtype.itemsize
  local total = 0
  for _, p in ipairs(all) do total = total + p:numel() end
  -- a DistributedDataParallel holding any of them must hold exactly them
  for base, ddp in pairs(ddps) do
    local n = ddp._flat_param:numel()
    local inside = 0
    for _, p in ipairs(all) do
      local a = address(p)
      if a >= base and a < base + n * size then inside = inside + 1 end
    end
    if inside > 0 then
      if inside ~= #all or total ~= n then
        raise(string.format("%s: the parameters are part of a DistributedDataParallel's flat buffer (%d elements) " ..
                            "but not all of it (%d of the %d given, %d elements): pass ddp:parameters() whole, " ..
                            "split into param groups if needed", fn, n, inside, #all, total))
      end
      self._ddp, self._flat = ddp, ddp._flat_param
      for _, p in ipairs(all) do self._offset[p] = (address(p) - base) / size end
      if ddp._sharding ~= "SHARD_GRAD_OP" then
        -- in DDP's order, so that flattening finds them flat (views, no copy)
        local sorted = {}
        for i, p in ipairs(all) do sorted[i] = p end
        table.sort(sorted, function(a, b) return self._offset[a] < self._offset[b] end)
        local _
        _, self._flat_grad = torch._flatten_params(sorted)
      end
      return
    end
  end
  self._flat, self._flat_grad = torch._flatten_params(all)
  local at = 0
  for _, p in ipairs(all) do
    self._offset[p] = at
    at = at + p:numel()
  end
end

-- ZeroRedundancyOptimizer(params, {optimizer_class=, process_group=, <optimizer_class's options>})
function ZeRO.new(params, opts)
  local fn = "ZeroRedundancyOptimizer"
  if type(opts) ~= "table" then
    raise(fn .. ": expected an options table with optimizer_class (e.g. {optimizer_class = torch.optim.AdamW, " ..
          "lr = 1e-3}), got " .. typename(opts))
  end
  local cls = opts.optimizer_class
  if type(cls) ~= "table" or type(rawget(cls, "new")) ~= "function" or type(cls._step_bucket) ~= "function" then
    raise(fn .. ": expected optimizer_class to be an optimizer class such as torch.optim.AdamW (the class, not an " ..
          "instance), got " .. (type(cls) == "table" and tostring(cls.__name or "a table") or typename(cls)))
  end
  if cls._not_elementwise then
    raise(string.format("%s: %s's update is not elementwise (it reads whole rows, columns or parameters), and the " ..
                        "shards here split parameters by element; step it on every rank without sharding", fn,
                        cls.__name))
  end
  if opts.overlap_with_ddp then
    raise(fn .. ": overlap_with_ddp is not supported; use DistributedDataParallel's sharding_strategy " ..
          "\"SHARD_GRAD_OP\" to reduce gradients into shards during backward")
  end
  local self = setmetatable({ _offset = {} }, ZeRO)
  local groups = groups_of(params)
  local all, seen = {}, {}
  for _, g in ipairs(groups) do
    for _, p in ipairs(g.params) do
      if seen[p] then raise(fn .. ": some parameters appear in more than one parameter group, or twice in one") end
      seen[p] = true
      all[#all + 1] = p
    end
  end
  self:_find_flat(all)
  local group = self._ddp and self._ddp._group or nil
  if opts.process_group ~= nil then
    if opts.process_group == dist.GroupMember.NON_GROUP_MEMBER then
      raise(fn .. ": this rank is not a member of process_group (new_group gave it GroupMember.NON_GROUP_MEMBER)")
    end
    dist.get_world_size(opts.process_group)   -- (raises for what is not a live group)
    group = opts.process_group
    if self._ddp and opts.process_group ~= self._ddp._group then
      raise(fn .. ": process_group differs from the DistributedDataParallel's the parameters belong to")
    end
  end
  group = group or dist.GroupMember.WORLD
  if group == nil then
    raise(fn .. ": Default process group has not been initialized, please make sure to call init_process_group.")
  end
  self._group = group
  local total = self._flat:numel()
  if total < group.size then
    raise(string.format("%s: the parameters have %d elements, fewer than the %d ranks to shard them over",
                        fn, total, group.size))
  end
  self._lo, self._hi, self._shard_size = shard_of(total, group.size, group.rank)
  if self._ddp and self._ddp._sharding == "SHARD_GRAD_OP" then
    local s = self._ddp._shard
    if s[1] ~= self._lo or s[2] ~= self._hi then
      raise(fn .. ": the DistributedDataParallel's gradient shard does not match this optimizer's")
    end
    if rawget(self._ddp, "_zero") then
      raise(fn .. ": this DistributedDataParallel already has a ZeroRedundancyOptimizer over its gradient shard")
    end
    rawset(self._ddp, "_zero", self)
  end
  -- each group's part of the shard: pieces {param, offset in F, first, last (F), offset in the group's tensor}
  local inner_groups, inner_opts = {}, {}
  for k, v in pairs(opts) do if not own_options[k] then inner_opts[k] = v end end
  self._pieces, self._x, self._inner_of = {}, {}, {}
  torch.no_grad(function()
    for gi, g in ipairs(groups) do
      local pieces, at = {}, 0
      local sorted = {}
      for i, p in ipairs(g.params) do sorted[i] = p end
      table.sort(sorted, function(a, b) return self._offset[a] < self._offset[b] end)
      for _, p in ipairs(sorted) do
        local off = self._offset[p]
        local a, b = math.max(off, self._lo), math.min(off + p:numel(), self._hi)
        if a < b then
          pieces[#pieces + 1] = { p = p, off = off, a = a, b = b, x = at }
          at = at + b - a
        end
      end
      self._pieces[gi] = pieces
      if at > 0 then
        local x = torch.empty({ at }, { dtype = self._flat.dtype, device = self._flat.device })
        for _, pc in ipairs(pieces) do x:narrow(0, pc.x, pc.b - pc.a):copy_(self._flat:narrow(0, pc.a, pc.b - pc.a)) end
        self._x[gi] = x
        local ig = {}
        for k, v in pairs(g) do if k ~= "params" then ig[k] = copy_value(v) end end
        ig.params = { x }
        inner_groups[#inner_groups + 1] = ig
        self._inner_of[gi] = #inner_groups
      end
    end
  end)
  self.optim = cls.new(inner_groups, inner_opts)
  -- One group on this shard: the wrapped optimizer's gradient buffer
  -- becomes the shard's own slice of the gradients (DDP's flat buffer, or
  -- its gradient shard), so no copy is made, nor kept.
  if #inner_groups == 1 then
    local gi = next(self._inner_of)
    local shard = self._ddp and self._ddp._sharding == "SHARD_GRAD_OP" and self._ddp._grad_shard or
                  self._flat_grad:narrow(0, self._lo, self._hi - self._lo)
    check(C.dp_set_grad_slot(self._x[gi].p, shard.p))
    self.optim._buckets[1][1].flat_grad = shard
    self._x[gi].grad = nil
    self._direct = true
  end
  -- the groups as the user gave them, with every option (lr schedulers use them)
  self.defaults = self.optim.defaults
  self.param_groups = groups
  for _, g in ipairs(groups) do
    for k, v in pairs(self.defaults) do if g[k] == nil then g[k] = copy_value(v) end end
  end
  for gi, j in pairs(self._inner_of) do
    for k, v in pairs(self.optim.param_groups[j]) do if k ~= "params" then groups[gi][k] = copy_value(v) end end
  end
  self._send = torch.zeros({ self._shard_size }, { dtype = self._flat.dtype, device = self._flat.device })
  self._step_count = 0
  return self
end
setmetatable(ZeRO, { __call = function(_, ...) return ZeRO.new(...) end })

function ZeRO:__tostring()
  return "ZeroRedundancyOptimizer (" .. tostring(self.optim):gsub("\n", "\n  ") .. "\n)"
end

-- The gradient bucket of group gi's shard tensor in the wrapped optimizer.
function ZeRO:_grad_buffer(gi)
  return self.optim._buckets[self._inner_of[gi]][1].flat_grad
end

-- Copies group gi's gradients into its shard tensor's gradient; false
-- when none of the group's parameters has one (the group does not step).
function ZeRO:_gather_grads(gi)
  local x, pieces = self._x[gi], self._pieces[gi]
  local gbuf = self:_grad_buffer(gi)
  local ddp = self._ddp
  if ddp and ddp._sharding == "SHARD_GRAD_OP" then
    local shard = ddp._grad_shard
    if not self._direct then
      for _, pc in ipairs(pieces) do gbuf:narrow(0, pc.x, pc.b - pc.a):copy_(shard:narrow(0, pc.a - self._lo, pc.b - pc.a)) end
    end
  else
    local any = false
    local size = self._flat.dtype.itemsize
    local base = address(self._flat_grad)
    for _, pc in ipairs(self._pieces[gi]) do
      local g = pc.p.grad
      local slice = gbuf:narrow(0, pc.x, pc.b - pc.a)
      if g == nil then
        -- (a parameter without a gradient steps with zeros while others of its
        -- group step; with _direct this is its stale flat slot, which the next
        -- backward overwrites)
        slice:zero_()
      else
        any = true
        if address(g) == base + pc.off * size then
          if not self._direct then slice:copy_(self._flat_grad:narrow(0, pc.a, pc.b - pc.a)) end
        else   -- a gradient assigned by hand, not in its flat slot
          slice:copy_(g:contiguous():reshape(-1):narrow(0, pc.a - pc.off, pc.b - pc.a))
        end
      end
    end
    -- a group whose parameters have no gradient on this rank's shard does not step
    if not any then
      x.grad = nil
      return false
    end
  end
  x.grad = gbuf
  return true
end

-- The shard's step and the all_gather that restores the flat buffer on
-- every rank (a joined rank runs it too, see Join).
function ZeRO:_step_shard()
  torch.no_grad(function()
    local flat = self._flat
    for gi, j in pairs(self._inner_of) do
      local ig = self.optim.param_groups[j]
      for k, v in pairs(self.param_groups[gi]) do if k ~= "params" then ig[k] = copy_value(v) end end
      local x = self._x[gi]
      for _, pc in ipairs(self._pieces[gi]) do x:narrow(0, pc.x, pc.b - pc.a):copy_(flat:narrow(0, pc.a, pc.b - pc.a)) end
      self:_gather_grads(gi)
    end
    self.optim:step()
    local send, lo = self._send, self._lo
    for gi, x in pairs(self._x) do
      for _, pc in ipairs(self._pieces[gi]) do
        send:narrow(0, pc.a - lo, pc.b - pc.a):copy_(x:narrow(0, pc.x, pc.b - pc.a))
      end
    end
    local g, total = self._group, flat:numel()
    local whole = g.size * self._shard_size
    if g.size == 1 then
      flat:copy_(send:narrow(0, 0, total))
    elseif whole == total then
      dist.all_gather_into_tensor(flat, send, g)
    else
      -- (the last shard is short: gather into a padded buffer)
      local out = torch.empty({ whole }, { dtype = flat.dtype, device = flat.device })
      dist.all_gather_into_tensor(out, send, g)
      flat:copy_(out:narrow(0, 0, total))
    end
  end)
end

-- step([closure]): steps this rank's shard with the wrapped optimizer,
-- then all_gather restores every parameter on every rank.
function ZeRO:step(closure)
  local loss
  if closure ~= nil then
    if type(closure) ~= "function" then
      raise("ZeroRedundancyOptimizer.step: expected a closure function, got " .. typename(closure))
    end
    loss = torch.enable_grad(closure)
  end
  notify(self, true)
  self:_step_shard()
  self._step_count = self._step_count + 1
  return loss
end

function ZeRO:zero_grad(opts)
  local set_to_none = true
  if type(opts) == "table" and opts.set_to_none ~= nil then set_to_none = opts.set_to_none
  elseif type(opts) == "boolean" then set_to_none = opts end
  for _, g in ipairs(self.param_groups) do
    for _, p in ipairs(g.params) do
      if set_to_none then p.grad = nil
      else
        local pg = p.grad
        if pg ~= nil then pg:zero_() end
      end
    end
  end
  if self._ddp and self._ddp._sharding == "SHARD_GRAD_OP" then self._ddp._grad_shard:zero_() end
end

function ZeRO:add_param_group()
  raise("ZeroRedundancyOptimizer: add_param_group is not supported (the shards are laid out at construction)")
end

---------------------------------------------------------------- state dicts

-- Per-rank checkpoints: this rank's shard of the state, loaded back by
-- the same rank of a group of the same size over the same parameters; or,
-- given the list of every rank's, by a group of any size (each rank reads
-- them all and keeps its own slice).
function ZeRO:sharded_state_dict()
  local groups = {}
  for gi, g in ipairs(self.param_groups) do
    local c = {}
    for k, v in pairs(g) do if k ~= "params" then c[k] = copy_value(v) end end
    groups[gi] = c
  end
  -- where each piece of the shard lies, by parameter (its place in its
  -- group) rather than by flat position, so that any layout can read it
  local pieces, index_of = {}, {}
  for gi, g in ipairs(self.param_groups) do
    for i, p in ipairs(g.params) do index_of[p] = i end
    pieces[gi] = {}
    for k, pc in ipairs(self._pieces[gi]) do
      pieces[gi][k] = { param = index_of[pc.p], first = pc.a - pc.off, count = pc.b - pc.a, at = pc.x }
    end
  end
  local inner_of = {}
  for gi in ipairs(self.param_groups) do inner_of[gi] = self._inner_of[gi] or 0 end
  return { shard = { rank = self._group.rank, world_size = self._group.size, start = self._lo, stop = self._hi,
                     numel = self._flat:numel() },
           param_groups = groups, optim = self.optim:state_dict(), pieces = pieces, inner_of = inner_of }
end

-- The whole optimizer's state dict in PyTorch's layout (ids 0, 1, ... over
-- the groups' parameters), from each parameter's state and each group's options.
local function whole_state_dict(self, state, options_of)
  local sd, groups, id = {}, {}, 0
  for gi, group in ipairs(self.param_groups) do
    local c, ids = {}, {}
    for k, v in pairs(options_of(gi)) do if k ~= "params" then c[k] = copy_value(v) end end
    for i, p in ipairs(group.params) do
      ids[i] = id
      if state[p] then sd[id] = state[p] end
      id = id + 1
    end
    c.params = ids
    groups[gi] = c
  end
  return { state = sd, param_groups = groups }
end

-- Every rank's sharded_state_dict() of a group of any size, put back into
-- one whole state dict in the wrapped optimizer's layout (what
-- consolidate_state_dict gives), for load_state_dict to take its slice.
local function merge_shards(self, shards, fn)
  local state = {}   -- per group, per parameter index: { step =, name = tensor }
  for gi in ipairs(self.param_groups) do state[gi] = {} end
  local world = shards[1].shard and shards[1].shard.world_size
  for r, sd in ipairs(shards) do
    if type(sd) ~= "table" or type(sd.shard) ~= "table" or type(sd.pieces) ~= "table" or type(sd.optim) ~= "table" then
      raise(string.format("%s: entry %d is not a sharded_state_dict() (with its pieces)", fn, r))
    end
    if sd.shard.world_size ~= world or sd.shard.rank ~= r - 1 then
      raise(string.format("%s: expected the shards of ranks 0 to %d in order; entry %d is rank %s of %s", fn,
                          world - 1, r, tostring(sd.shard.rank), tostring(sd.shard.world_size)))
    end
    if sd.shard.numel ~= self._flat:numel() then
      raise(string.format("%s: the checkpoint's parameters have %d elements, this optimizer's %d", fn, sd.shard.numel,
                          self._flat:numel()))
    end
    if #sd.pieces ~= #self.param_groups then raise(fn .. ": the checkpoint has a different number of parameter groups") end
    for gi, group in ipairs(self.param_groups) do
      local j = sd.inner_of[gi]
      local inner = j and j > 0 and sd.optim.state[j - 1]
      for _, pc in ipairs(sd.pieces[gi]) do
        local p = group.params[pc.param]
        if p == nil or pc.first + pc.count > p:numel() then
          raise(string.format("%s: the checkpoint's group %d does not match this optimizer's parameters", fn, gi - 1))
        end
        if inner then
          local st = state[gi][pc.param] or {}
          state[gi][pc.param] = st
          local step = torch.is_tensor(inner.step) and inner.step:item() or inner.step
          if type(step) == "number" and (st.step == nil or step > st.step) then st.step = step end
          for k, v in pairs(inner) do
            if torch.is_tensor(v) and k ~= "step" then
              st[k] = st[k] or torch.zeros({ p:numel() }, { dtype = v.dtype, device = self._flat.device })
              st[k]:narrow(0, pc.first, pc.count):copy_(v:reshape(-1):narrow(0, pc.at, pc.count))
            end
          end
        end
      end
    end
  end
  local by_param = {}
  for gi, group in ipairs(self.param_groups) do
    for i, p in ipairs(group.params) do
      local st = state[gi][i]
      if st then
        for k, v in pairs(st) do if torch.is_tensor(v) then st[k] = v:view(p:size()) end end
        by_param[p] = st
      end
    end
  end
  return whole_state_dict(self, by_param, function(gi) return shards[1].param_groups[gi] or {} end)
end

function ZeRO:load_sharded_state_dict(sd)
  local fn = "ZeroRedundancyOptimizer.load_sharded_state_dict"
  if type(sd) == "table" and sd[1] ~= nil then   -- every rank's shards: any group size
    return self:load_state_dict(merge_shards(self, sd, fn))
  end
  if type(sd) ~= "table" or type(sd.shard) ~= "table" or type(sd.optim) ~= "table" then
    raise(fn .. ": expected a table from sharded_state_dict() {shard=, param_groups=, optim=}")
  end
  local s = sd.shard
  if s.world_size ~= self._group.size or s.rank ~= self._group.rank or s.start ~= self._lo or s.stop ~= self._hi or
     s.numel ~= self._flat:numel() then
    raise(string.format("%s: the checkpoint is rank %s's shard [%s, %s) of %s elements over %s ranks; this is rank " ..
                        "%d's shard [%d, %d) of %d over %d (load a consolidated state_dict to change the layout)",
                        fn, tostring(s.rank), tostring(s.start), tostring(s.stop), tostring(s.numel),
                        tostring(s.world_size), self._group.rank, self._lo, self._hi, self._flat:numel(),
                        self._group.size))
  end
  if type(sd.param_groups) ~= "table" or #sd.param_groups ~= #self.param_groups then
    raise(fn .. ": the checkpoint has a different number of parameter groups")
  end
  self.optim:load_state_dict(sd.optim)
  for gi, g in ipairs(self.param_groups) do
    for k, v in pairs(sd.param_groups[gi]) do g[k] = copy_value(v) end
  end
end

-- Fixed-size text through a collective: every rank's text (at most 4096 bytes).
local function all_texts(text, g)
  local n = 4096
  if #text > n then raise("ZeroRedundancyOptimizer: state description too long") end
  local bytes = {}
  for i = 1, n do bytes[i] = i <= #text and text:byte(i) or 0 end
  -- an nccl group takes CUDA tensors
  local device = g.backend == "nccl" and ("cuda:" .. torch.cuda.current_device()) or "cpu"
  local mine = torch.tensor(bytes, { dtype = torch.uint8 }):to(device)
  local all = torch.empty({ n * g.size }, { dtype = torch.uint8, device = device })
  dist.all_gather_into_tensor(all, mine, g)
  local out
  out, bytes = {}, all:cpu():tolist()
  for r = 0, g.size - 1 do
    local cs = {}
    for i = r * n + 1, (r + 1) * n do
      if bytes[i] == 0 then break end
      cs[#cs + 1] = string.char(bytes[i])
    end
    out[r + 1] = table.concat(cs)
  end
  return out
end

-- consolidate_state_dict(to=0): every rank sends its shard of the state;
-- rank `to` then holds the whole optimizer's state_dict() in the wrapped
-- optimizer's (PyTorch's) layout, one entry per parameter. Every rank of
-- the group must call it.
function ZeRO:consolidate_state_dict(to)
  if type(to) == "table" then to = to.to end
  to = to or 0
  local g = self._group
  local fn = "ZeroRedundancyOptimizer.consolidate_state_dict"
  if type(to) ~= "number" or to % 1 ~= 0 then raise(fn .. ": expected the rank to consolidate on, got " .. tostring(to)) end
  local inner = self.optim:state_dict()
  -- each group's state names (name:dtype) and step as this rank holds them
  local words, steps = {}, torch.zeros({ #self.param_groups }, { dtype = torch.float64 })
  for gi in ipairs(self.param_groups) do
    local j = self._inner_of[gi]
    local st = j and inner.state[j - 1]
    local names = {}
    if st then
      for k, v in pairs(st) do if torch.is_tensor(v) then names[#names + 1] = k .. ":" .. v.dtype.name end end
      steps[gi - 1] = st.step or 0
    end
    table.sort(names)
    words[gi] = table.concat(names, ",")
  end
  dist.all_reduce(steps, dist.ReduceOp.MAX, g)
  local texts = all_texts(table.concat(words, ";") .. ";", g)
  local names = {}   -- per group: list of {name, dtype}
  for gi in ipairs(self.param_groups) do names[gi] = {} end
  for _, text in ipairs(texts) do
    local gi = 0
    for part in text:gmatch("([^;]*);") do
      gi = gi + 1
      if #names[gi] == 0 and part ~= "" then
        for k, d in part:gmatch("([^,:]+):([^,]+)") do names[gi][#names[gi] + 1] = { k, torch[d] } end
      end
    end
  end
  -- every state name's flat buffer, gathered whole (group by group)
  local state, total = {}, self._flat:numel()
  local whole = g.size * self._shard_size
  local me = global_rank(g, g.rank) == to
  for gi, group in ipairs(self.param_groups) do
    local step = steps[gi - 1]:item()
    for _, nd in ipairs(names[gi]) do
      local k, dtype = nd[1], nd[2]
      local send = torch.zeros({ self._shard_size }, { dtype = dtype, device = self._flat.device })
      local j = self._inner_of[gi]
      if j and inner.state[j - 1] and inner.state[j - 1][k] then
        local buf = inner.state[j - 1][k]:reshape(-1)
        for _, pc in ipairs(self._pieces[gi]) do
          send:narrow(0, pc.a - self._lo, pc.b - pc.a):copy_(buf:narrow(0, pc.x, pc.b - pc.a))
        end
      end
      local out = torch.empty({ whole }, { dtype = dtype, device = self._flat.device })
      if g.size == 1 then out:copy_(send) else dist.all_gather_into_tensor(out, send, g) end
      if me then
        for _, p in ipairs(group.params) do
          local st = state[p] or { step = step }
          st[k] = out:narrow(0, self._offset[p], p:numel()):view(p:size()):clone()
          state[p] = st
        end
      end
    end
  end
  if not me then
    self._consolidated = nil
    return
  end
  self._consolidated = whole_state_dict(self, state, function(gi) return self.param_groups[gi] end)
end

-- state_dict(): the consolidated state, on the rank it was consolidated
-- on (as PyTorch, where other ranks raise).
function ZeRO:state_dict()
  if not self._consolidated then
    raise("ZeroRedundancyOptimizer.state_dict: Optimizer state has not been consolidated on this rank. Please call " ..
          "`consolidate_state_dict(to)` on all ranks beforehand if you meant to save the global state.")
  end
  return self._consolidated
end

-- load_state_dict(sd): a whole optimizer's state dict (consolidated, or
-- the wrapped optimizer's own), on every rank; each keeps its shard.
function ZeRO:load_state_dict(sd)
  local fn = "ZeroRedundancyOptimizer.load_state_dict"
  if type(sd) ~= "table" or type(sd.param_groups) ~= "table" then
    raise(fn .. ": expected a state dict with 'state' and 'param_groups'")
  end
  if #sd.param_groups ~= #self.param_groups then
    raise(string.format("%s: loaded state dict has a different number of parameter groups (%d, the optimizer has %d)",
                        fn, #sd.param_groups, #self.param_groups))
  end
  local state = sd.state or {}
  local inner = { state = {}, param_groups = {} }
  for gi, group in ipairs(self.param_groups) do
    local saved = sd.param_groups[gi]
    local ids = saved.params or {}
    if #ids ~= #group.params then
      raise(string.format("%s: group %d has %d parameters, the optimizer's %d", fn, gi - 1, #ids, #group.params))
    end
    local id_of = {}
    for i, p in ipairs(group.params) do id_of[p] = ids[i] end
    for k, v in pairs(saved) do if k ~= "params" then group[k] = copy_value(v) end end
    local j = self._inner_of[gi]
    if j then
      local ig = {}
      for k, v in pairs(group) do if k ~= "params" then ig[k] = copy_value(v) end end
      ig.params = { j - 1 }
      inner.param_groups[j] = ig
      local x, st = self._x[gi], nil
      for _, pc in ipairs(self._pieces[gi]) do
        local ps = state[id_of[pc.p]]
        if ps ~= nil then
          st = st or { step = 0 }
          local step = torch.is_tensor(ps.step) and ps.step:item() or ps.step
          if type(step) == "number" and step > st.step then st.step = step end
          for k, v in pairs(ps) do
            if torch.is_tensor(v) and k ~= "step" then
              if v:numel() ~= pc.p:numel() then
                raise(string.format("%s: state[%d].%s has %d elements, the parameter %d", fn, id_of[pc.p], k,
                                    v:numel(), pc.p:numel()))
              end
              st[k] = st[k] or torch.zeros({ x:numel() }, { dtype = v.dtype, device = x.device })
              st[k]:narrow(0, pc.x, pc.b - pc.a):copy_(v:reshape(-1):narrow(0, pc.a - pc.off, pc.b - pc.a))
            end
          end
        end
      end
      inner.state[j - 1] = st
    end
  end
  self.optim:load_state_dict(inner)
end

-- dist.algorithms.ddp_comm_hooks.default_hooks: the communication hooks
-- of PyTorch that DistributedDataParallel:register_comm_hook takes. Its
-- reducer runs in C, so these name what it does rather than being called:
-- allreduce_hook averages in the gradients' dtype (the default),
-- bf16_compress_hook in bfloat16.
local default_hooks = {}
for _, name in ipairs({ "allreduce_hook", "bf16_compress_hook", "fp16_compress_hook" }) do
  default_hooks[name] = setmetatable({ name = name }, {
    __call = function() raise("ddp_comm_hooks." .. name .. ": give it to DistributedDataParallel:register_comm_hook") end,
    __tostring = function() return "ddp_comm_hooks.default_hooks." .. name end,
  })
end
M.default_hooks = default_hooks

M.exports = {
  optim = { ZeroRedundancyOptimizer = ZeRO },
  algorithms = { Join = M.Join, join = { Join = M.Join }, ddp_comm_hooks = { default_hooks = default_hooks } },
  fsdp = setmetatable({ ShardingStrategy = M.ShardingStrategy }, { __index = function(t, k)
    local v = require("dplua.distributed_fsdp")[k]
    if v ~= nil then rawset(t, k, v) end
    return v
  end }),
}

return M
